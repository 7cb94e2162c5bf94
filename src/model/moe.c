/* moe.c — the mixture of experts (paper §2.1, doc §3.5): gate logits,
 * routing (sqrt-softplus scores, top-k with the correction bias, or the
 * token-id hash table on the first layers), then the clamped SwiGLU experts
 * and the shared expert — a token's k outputs summed in ascending expert id,
 * the shared expert last (backend.h: ds_route_params, ds_moe_params). */
#include "model/step.h"

static int score_func(const ds_config *c) {
    return c->score_func == DS_SCORE_SOFTMAX   ? DS_ROUTE_SOFTMAX
           : c->score_func == DS_SCORE_SIGMOID ? DS_ROUTE_SIGMOID
                                               : DS_ROUTE_SQRTSOFTPLUS;
}

/* The observer's route hook, one token at a time in row order. */
static int observe(const ds_step *S, int li, ds_err *err) {
    const ds_observer *obs = S->obs;
    ds_runstate *rs = S->rs;
    int k = S->m->cfg.n_active_experts;
    if (S->be->download(S->be, rs->idx_host, rs->idx, (size_t)S->T * k * sizeof(int32_t), err)) return -1;
    for (int t = 0; t < S->T; t++) {
        int s = rs->tok_seq[t], ids[64];
        for (int j = 0; j < k; j++) ids[j] = rs->idx_host[(size_t)t * k + j];
        obs->route(obs->ctx, li, s, t - rs->seq_row0[s], ids, k);
    }
    return 0;
}

int ds_moe(const ds_step *S, int li, const float *xn, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, E = c->n_routed_experts, k = c->n_active_experts;
    ds_route_params rp = {rs->logits, T,  E, k, score_func(c), ly->gate_bias, ly->is_hash ? ly->tid2eid : NULL,
                          c->route_scale, rs->idx, rs->wts};
    if (ds_matmul(be, &ly->gate, xn, T, rs->logits, err) || be->route(be, &rp, err)) return -1;
    if (S->obs && S->obs->route && observe(S, li, err)) return -1;
    int sh = c->n_shared_experts > 0;
    ds_moe_params mp = {xn,     T,      c->dim, E,           k,           rs->idx,     rs->wts,      ly->w1,
                        ly->w2, ly->w3, sh ? &ly->sw1 : NULL, sh ? &ly->sw2 : NULL, sh ? &ly->sw3 : NULL,
                        c->swiglu_limit, out};
    return be->moe(be, &mp, err);
}
