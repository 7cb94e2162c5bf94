/* indexer.c — the Lightning Indexer of CSA layers (paper §2.3.1, doc §3.4):
 * index keys are compressed like the KV entries (own compressor at
 * index_head_dim), queries come from the q residual, and each query keeps the
 * index_topk causally visible entries with the highest
 *   score(t, w) = sum_h w_h * ReLU(q_h . K_w) / sqrt(index_head_dim),
 * ties broken toward the lower entry index (the backend's ds_indexer_params). */
#include <math.h>

#include "model/step.h"

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
