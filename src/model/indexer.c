/* indexer.c — the Lightning Indexer of CSA layers (paper §2.3.1, doc §3.4):
 * index keys are compressed like the KV entries (own compressor at
 * index_head_dim), queries come from the q residual, and each query keeps the
 * index_topk causally visible entries with the highest
 *   score(t, w) = sum_h w_h * ReLU(q_h . K_w) / sqrt(index_head_dim),
 * ties broken toward the lower entry index (the backend's ds_indexer_params). */
#include <math.h>
#include <stdlib.h>

#include "model/step.h"

/* one token at a time in row order */
int ds_indexer_observe(const ds_step *S, int li, ds_err *err) {
    const ds_observer *obs = S->obs;
    if (!obs || !obs->index || S->dp || S->T == 0) return 0;
    ds_runstate *rs = S->rs;
    int T = S->T, k = S->m->cfg.index_topk;
    int *sel = malloc(sizeof(int) * (size_t)T * (size_t)k), *n = malloc(sizeof(int) * (size_t)T);
    int rc = !sel || !n ? ds_fail(err, "indexer (layer %d): out of memory for the observer", li) : 0;
    if (!rc) rc = S->be->download(S->be, sel, rs->sel, sizeof(int) * (size_t)T * (size_t)k, err) ||
                  S->be->download(S->be, n, rs->n_sel, sizeof(int) * (size_t)T, err);
    for (int t = 0; !rc && t < T; t++) {
        int s = rs->tok_seq[t];
        obs->index(obs->ctx, li, s, t - rs->seq_row0[s], sel + (size_t)t * k, n[t]);
    }
    free(sel);
    free(n);
    return rc ? -1 : 0;
}

int ds_indexer_select(const ds_step *S, int li, const float *xn, const float *qr, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, nh = c->index_n_heads, dh = c->index_head_dim;
    ds_matmul_job j[2] = {{&ly->idx.wq_b, qr, T, rs->iq}, {&ly->idx.weights_proj, xn, T, rs->iw}};
    ds_rope_params rp = {rs->iq, T, nh, dh, c->rope_dim / 2, m->inv_freq_compress, 0, 0, c->rms_eps};
    ds_indexer_params ip = {li, ly->ratio, nh, dh, c->index_topk, rs->iq, rs->iw, 1.0f / sqrtf((float)nh), rs->sel,
                            rs->n_sel};
    return be->matmul_many(be, j, 2, err) || be->rope(be, &rp, err) || be->indexer(be, &ip, err) ? -1 : 0;
}
