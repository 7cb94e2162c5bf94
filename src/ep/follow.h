/* follow.h — a follower rank under expert parallelism (docs/ep.md): it
 * runs no command of its own; it mirrors the leader's sequences and runs
 * every step the leader sends, serving its share of the experts. */
#ifndef DS_EP_FOLLOW_H
#define DS_EP_FOLLOW_H

#include "backend/backend.h"
#include "common/err.h"
#include "model/model.h"

/* Runs m (bound to be, with m->ep set) until the leader says quit: 0. Any
 * failure ends the whole job (ep/ep.h: ds_ep_session_fatal). */
int ds_ep_follow(const ds_model *m, const ds_backend *be);

#endif
