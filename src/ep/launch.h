/* launch.h — a model's ranks under expert parallelism (ep.h, docs/ep.md):
 * every rank opens its backend and binds its share of the model; then rank
 * 0 leads (it runs the command) and the followers serve its steps. The call
 * returns on every rank: a follower when the leader has quit. */
#ifndef DS_EP_LAUNCH_H
#define DS_EP_LAUNCH_H

#include <stdio.h>

#include "backend/backend.h"
#include "common/err.h"
#include "model/model.h"
#include "runtime/backend_select.h"

/* What ds_ep_launch did on this rank. */
enum { DS_EP_LED = 0, DS_EP_FOLLOWED = 1 };

/* Under mpirun (ds_ep_session_size() > 1): every rank builds the expert
 * placement of the session's options, opens the backend o names (a rank of
 * a host drives GPU gpu + its local rank) and binds the dense weights and
 * its experts of m; all say whether that worked (collective). The exchange
 * between devices is then NCCL where the backend has it and every rank of
 * every host has a GPU of its own, else MPI through host memory.
 * Rank 0: DS_EP_LED, m bound to be with its ranks: the command runs.
 * A follower: runs the leader's steps until it quits, then unbinds m and
 * closes be: DS_EP_FOLLOWED (the command has nothing left to do; the
 * process ends with ds_ep_session_end(0)).
 * -1 on failure on any rank, m unbound and be closed; err names this rank's
 * failure, or the first rank that failed. A failure of the exchange's setup
 * or of a step ends the job (ds_ep_session_fatal). */
int ds_ep_launch(ds_model *m, const ds_backend_opts *o, ds_backend *be, ds_err *err);

/* Rank 0 after DS_EP_LED: one line on f (no newline before it) with the
 * ranks, the bytes replicated on each and each rank's routed experts, the
 * exchange and the attention. */
void ds_ep_launch_report(const ds_model *m, FILE *f);

#endif
