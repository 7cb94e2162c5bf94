/* context.c — see context.h. */
#include "runtime/context.h"

#include "model/runstate.h"

int ds_ctx_budget_of(const ds_model *m, const ds_backend *be, ds_ctx_budget *b, ds_err *err) {
    b->avail = be->avail ? be->avail(be) : 0;
    if (!b->avail) return ds_fail(err, "the %s backend cannot tell its free memory", be->name);
    b->weights = m->be ? 0 : m->weight_bytes;
    b->activations = ds_runstate_bytes(&m->cfg, DS_STEP_TOKENS) + DS_CTX_SLACK;
    uint64_t used = b->weights + b->activations;
    b->state = b->avail > used ? b->avail - used : 0;
    return 0;
}
