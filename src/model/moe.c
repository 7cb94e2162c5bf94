/* moe.c — the mixture of experts (paper §2.1, doc §3.5): gate logits,
 * routing (sqrt-softplus scores, top-k with the correction bias, or the
 * token-id hash table on the first layers), then the clamped SwiGLU experts
 * and the shared expert — a token's k outputs summed in ascending expert id,
 * the shared expert last (backend.h: ds_route_params, ds_moe_params). */
#include "common/clock.h"
#include "dist/ep.h"
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

/* Expert parallelism (docs/ep.md): this rank's pairs, the exchange, then the
 * backend's combine over every pair in the single-process order. */
static int moe_ep(const ds_step *S, int li, const float *xn, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, E = c->n_routed_experts, k = c->n_active_experts, D = c->dim, sh = c->n_shared_experts > 0;
    size_t n_pairs = (size_t)T * k, bytes = n_pairs * D * sizeof(float);
    const unsigned char *sel = NULL;
    if (be->download(be, rs->idx_host, rs->idx, n_pairs * sizeof(int32_t), err) ||
        ds_ep_route(m->ep, li, rs->idx_host, (int)n_pairs, &sel, err))
        return -1;
    ds_moe_experts_params xp = {xn,          T,      D,      E,      k, rs->idx, sel, ly->w1, ly->w2, ly->w3,
                                sh ? &ly->sw1 : NULL, sh ? &ly->sw2 : NULL, sh ? &ly->sw3 : NULL, c->swiglu_limit,
                                rs->slot_out, rs->shared_out};
    ds_moe_combine_params cp = {T, D, k, rs->idx, rs->wts, rs->slot_out, rs->shared_out, out};
    if (ds_ep_transport(m->ep)) /* device to device (the backend's communicator) */
        return be->moe_experts(be, &xp, err) ||
                       be->ep_exchange(be, rs->slot_out, (int)n_pairs, D, ds_ep_owner(m->ep), err) ||
                       be->moe_combine(be, &cp, err)
                   ? -1
                   : 0;
    if (be->moe_experts(be, &xp, err)) return -1;
    double t0 = be->profile ? ds_now() : 0; /* download, MPI and upload return when done */
    if (be->download(be, rs->ep_rows, rs->slot_out, bytes, err) ||
        ds_ep_exchange(m->ep, rs->ep_rows, (int)n_pairs, D, err) ||
        be->upload(be, rs->slot_out, rs->ep_rows, bytes, err))
        return -1;
    if (be->profile) be->profile->exchange_seconds += ds_now() - t0;
    return be->moe_combine(be, &cp, err);
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
    if (m->ep) return moe_ep(S, li, xn, out, err);
    ds_moe_params mp = {xn,     T,      c->dim, E,           k,           rs->idx,     rs->wts,      ly->w1,
                        ly->w2, ly->w3, sh ? &ly->sw1 : NULL, sh ? &ly->sw2 : NULL, sh ? &ly->sw3 : NULL,
                        c->swiglu_limit, out};
    return be->moe(be, &mp, err);
}
