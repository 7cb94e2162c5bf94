/* moe.c — the mixture of experts (paper §2.1, doc §3.5): gate logits,
 * routing (sqrt-softplus scores, top-k with the correction bias, or the
 * token-id hash table on the first layers), then the clamped SwiGLU experts
 * and the shared expert — a token's k outputs summed in ascending expert id,
 * the shared expert last (backend.h: ds_route_params, ds_moe_params). */
#include "common/clock.h"
#include "ep/ep.h"
#include "model/step.h"
#include "model/store.h"

static int score_func(const ds_config *c) {
    return c->score_func == DS_SCORE_SOFTMAX   ? DS_ROUTE_SOFTMAX
           : c->score_func == DS_SCORE_SIGMOID ? DS_ROUTE_SIGMOID
                                               : DS_ROUTE_SQRTSOFTPLUS;
}

/* The observer's route hook after the step: every layer's routes, kept in
 * rs->idx [L][T][k], read in one download (a read per layer would stop a
 * device's step at every MoE layer), then layer by layer, one token at a
 * time in row order. */
int ds_moe_observe(const ds_step *S, ds_err *err) {
    const ds_observer *obs = S->obs;
    ds_runstate *rs = S->rs;
    int k = S->m->cfg.n_active_experts, L = S->m->cfg.n_layers;
    if (S->be->download(S->be, rs->idx_host, rs->idx, (size_t)L * S->T * k * sizeof(int32_t), err)) return -1;
    for (int li = 0; li < L; li++)
        for (int t = 0; t < S->T; t++) {
            int s = rs->tok_seq[t], ids[64];
            for (int j = 0; j < k; j++) ids[j] = rs->idx_host[((size_t)li * S->T + t) * k + j];
            obs->route(obs->ctx, li, s, t - rs->seq_row0[s], ids, k);
        }
    return 0;
}

int ds_step_exchange(const ds_step *S, int nb, float *const *bufs, const int *widths, int n, const int *owner,
                     const int *dest, ds_err *err) {
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    if (n <= 0) return 0;
    if (ds_ep_transport(S->m->ep)) return be->ep_exchange(be, nb, bufs, widths, n, owner, dest, err); /* device to device */
    double t0 = be->profile ? ds_now() : 0; /* download, MPI and upload return when done */
    ds_ep *ep = S->m->ep;
    for (int b = 0; b < nb; b++) {
        size_t bytes = (size_t)n * widths[b] * sizeof(float);
        if (be->download(be, rs->ep_rows, bufs[b], bytes, err) ||
            (dest ? ds_ep_exchange_to(ep, rs->ep_rows, n, widths[b], owner, dest, err)
                  : ds_ep_exchange_rows(ep, rs->ep_rows, n, widths[b], owner, err)) ||
            be->upload(be, bufs[b], rs->ep_rows, bytes, err))
            return -1;
    }
    if (be->profile) be->profile->exchange_seconds += ds_now() - t0;
    return 0;
}

/* Data-parallel attention: the route hook over every rank's rows (the
 * leader's observer sees the whole step). */
static void observe_all(const ds_step *S, int li) {
    int k = S->m->cfg.n_active_experts, ids[64];
    for (int t = 0; t < S->dp->Tg; t++) {
        for (int j = 0; j < k; j++) ids[j] = S->rs->idx_host[(size_t)t * k + j];
        S->obs->route(S->obs->ctx, li, S->dp->item[t], S->dp->tok[t], ids, k);
    }
}

/* Expert parallelism (docs/ep.md): under data-parallel attention first every
 * rank's MoE inputs and routes (rank after rank); then this rank's pairs,
 * the exchange of the pairs' rows, and the backend's combine over this
 * rank's tokens in the single-process order. */
static int moe_ep(const ds_step *S, int li, const float *xn, const int32_t *lidx, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    const ds_step_dp *dp = S->dp;
    int T = S->T, Tg = dp ? dp->Tg : T, off = dp ? dp->off : 0;
    int E = c->n_routed_experts, k = c->n_active_experts, D = c->dim, sh = c->n_shared_experts > 0;
    const float *x = xn;
    const int32_t *idx = lidx; /* this layer's routes (this rank's; every rank's below under data parallel) */
    const float *wts = rs->wts;
    if (dp) {
        /* the ids travel as 32-bit words, never converted */
        float *bufs[3] = {rs->g_xn, (float *)rs->g_idx, rs->g_wts};
        int widths[3] = {D, k, k};
        if (ds_step_exchange(S, 3, bufs, widths, Tg, dp->owner, NULL, err)) return -1;
        x = rs->g_xn, idx = rs->g_idx, wts = rs->g_wts;
    }
    size_t n_pairs = (size_t)Tg * k;
    const unsigned char *sel = NULL;
    if (be->download(be, rs->idx_host, idx, n_pairs * sizeof(int32_t), err)) return -1;
    if (dp && S->obs && S->obs->route) observe_all(S, li);
    if (ds_ep_route(m->ep, li, rs->idx_host, (int)n_pairs, &sel, err)) return -1;
    /* the routed pairs of every rank's rows served here; the shared expert
     * (or zeros) for this rank's rows: with them unless attention is data parallel */
    const ds_weight *sw1 = sh && !dp ? &ly->sw1 : NULL, *sw2 = sh && !dp ? &ly->sw2 : NULL,
                    *sw3 = sh && !dp ? &ly->sw3 : NULL;
    ds_moe_experts_params xp = {x,   Tg,  D,   E,  k, idx, sel, ly->w1, ly->w2, ly->w3, sw1, sw2, sw3, c->swiglu_limit,
                                rs->slot_out, dp ? NULL : rs->shared_out};
    if (be->moe_experts(be, &xp, err)) return -1;
    if (dp && T > 0) {
        const unsigned char *none = ds_ep_no_pairs(m->ep, T * k, err);
        ds_moe_experts_params sp = {xn,
                                    T,
                                    D,
                                    E,
                                    k,
                                    idx + (size_t)off * k,
                                    none,
                                    ly->w1,
                                    ly->w2,
                                    ly->w3,
                                    sh ? &ly->sw1 : NULL,
                                    sh ? &ly->sw2 : NULL,
                                    sh ? &ly->sw3 : NULL,
                                    c->swiglu_limit,
                                    rs->slot_out + (size_t)off * k * D,
                                    rs->shared_out};
        if (!none || be->moe_experts(be, &sp, err)) return -1;
    }
    if (dp) /* each pair's row goes to its token's home rank */
        for (size_t i = 0; i < n_pairs; i++) rs->g_dest[i] = dp->owner[i / k];
    if (ds_step_exchange(S, 1, &rs->slot_out, &D, (int)n_pairs, ds_ep_owner(m->ep), dp ? rs->g_dest : NULL, err))
        return -1;
    if (T == 0) return 0;
    ds_moe_combine_params cp = {
        T, D, k, idx + (size_t)off * k, wts + (size_t)off * k, rs->slot_out + (size_t)off * k * D, rs->shared_out, out};
    return be->moe_combine(be, &cp, err);
}

int ds_moe(const ds_step *S, int li, const float *xn, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, E = c->n_routed_experts, k = c->n_active_experts;
    size_t off = S->dp ? (size_t)S->dp->off * k : 0; /* data parallel: routes into every rank's table */
    int32_t *idx = S->dp ? rs->g_idx + off : rs->idx + (size_t)li * T * k;
    float *wts = S->dp ? rs->g_wts + off : rs->wts;
    ds_route_params rp = {rs->logits,     T,   E,  k, score_func(c), ly->gate_bias, ly->is_hash ? ly->tid2eid : NULL,
                          c->route_scale, idx, wts};
    if (T > 0 && (ds_matmul(be, &ly->gate, xn, T, rs->logits, err) || be->route(be, &rp, err))) return -1;
    int sh = c->n_shared_experts > 0;
    if (m->ep) return moe_ep(S, li, xn, idx, out, err);
    if (m->store) return ds_store_moe(S, li, xn, idx, out, err);
    ds_moe_params mp = {xn,     T,      c->dim, E,           k,           idx,         rs->wts,      ly->w1,
                        ly->w2, ly->w3, sh ? &ly->sw1 : NULL, sh ? &ly->sw2 : NULL, sh ? &ly->sw3 : NULL,
                        c->swiglu_limit, out};
    return be->moe(be, &mp, err);
}
