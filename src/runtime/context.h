/* context.h — how long a context fits: the memory a backend has left for
 * sequences' state once the weights and a full step's activations are in. */
#ifndef DS_CONTEXT_H
#define DS_CONTEXT_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"

typedef struct ds_ctx_budget {
    uint64_t avail;       /* the backend's free bytes now (backend.h: avail) */
    uint64_t weights;     /* bytes of weights still to be placed (0 once m is bound) */
    uint64_t activations; /* a step of DS_STEP_TOKENS tokens with all logits, + DS_CTX_SLACK */
    uint64_t state;       /* what is left for the sequences' state (0 if nothing) */
} ds_ctx_budget;

/* scratch of the backends' own outside the step arena */
#define DS_CTX_SLACK ((uint64_t)1 << 30)

/* Fills b for m on be (m bound to be, or not yet bound: its weights then
 * count as still to be placed). Returns -1 with err when be cannot tell
 * its free memory. */
int ds_ctx_budget_of(const ds_model *m, const ds_backend *be, ds_ctx_budget *b, ds_err *err);

#endif
