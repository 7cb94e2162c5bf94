/* attention.c — shared-KV multi-query attention with per-head sinks (paper
 * §2.3, doc §3.2): low-rank q, one K=V head, partial interleaved RoPE, the
 * sliding window plus the compressed entries the layer allows (all complete
 * HCA windows; the indexer's top-k on CSA layers), the inverse RoPE on the
 * output and the grouped output projection (§2.3.3). */
#include <math.h>

#include "model/step.h"

/* per-head RoPE (after an unweighted RMSNorm per head when norm = 1) */
static int heads_rope(const ds_step *S, const float *inv, float *x, int H, int d, int norm, int inverse, ds_err *err) {
    const ds_config *c = &S->m->cfg;
    ds_rope_params p = {x, S->T, H, d, c->rope_dim / 2, inv, norm, inverse, c->rms_eps};
    return S->be->rope(S->be, &p, err);
}

int ds_attention(const ds_step *S, int li, const float *xn, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, H = c->n_heads, d = c->head_dim, QL = c->q_lora_rank;
    const float *inv = ly->ratio ? m->inv_freq_compress : m->inv_freq_main;

    /* Two lanes (be->lane; docs/backend.md "Lanes"): the compressors need
     * only xn and the indexer only xn and the normed q residual, so they run
     * on the side lane beside the queries' chain; joined before attention. */
    int side = ly->ratio != 0;
    if (side && (ds_lane(be, DS_LANE_SIDE, err) || ds_compress_tokens(S, li, &ly->comp, 0, xn, err) ||
                 (ly->is_csa && ds_compress_tokens(S, li, &ly->idx.comp, 1, xn, err)) ||
                 ds_lane(be, DS_LANE_MAIN, err)))
        return -1;

    /* queries q = norm_h(wq_b @ RMSNorm(wq_a @ x)) and the single K=V head
     * kv = RMSNorm(wkv @ x), both with RoPE on the last r channels (kv's in
     * its norm's op: one head) */
    ds_matmul_job jqkv[2] = {{&ly->wq_a, xn, T, rs->qr}, {&ly->wkv, xn, T, rs->kv}};
    ds_rmsnorm_params nqkv[2] = {{rs->qr, ly->q_norm, rs->qr, T, QL, c->rms_eps, NULL, 0},
                                 {rs->kv, ly->kv_norm, rs->kv, T, d, c->rms_eps, inv, c->rope_dim / 2}};
    if (be->matmul_many(be, jqkv, 2, err) || be->rmsnorm(be, nqkv, 2, err)) return -1;
    /* the indexer's choice among the compressed entries (after its
     * compressor, on the side lane), then the queries' heads */
    if (ly->is_csa && (ds_lane(be, DS_LANE_SIDE, err) || ds_indexer_select(S, li, xn, rs->qr, err) ||
                       ds_lane(be, DS_LANE_MAIN, err)))
        return -1;
    if (ds_matmul(be, &ly->wq_b, rs->qr, T, rs->q, err) || heads_rope(S, inv, rs->q, H, d, 1, 0, err) ||
        (side && ds_lane(be, DS_LANE_JOIN, err)) || (ly->is_csa && ds_indexer_observe(S, li, err)))
        return -1;
    if (ds_step_dump(S, "q", li, rs->q, T, H * d, err) || ds_step_dump(S, "kv", li, rs->kv, T, d, err)) return -1;

    /* the window (ascending positions), then the compressed entries; values
     * carried their keys' rotation: the op undoes it at the query position */
    ds_attention_params ap = {li,      T,        H, d, c->window, ly->ratio, rs->q, rs->kv, ly->attn_sink,
                              ly->is_csa ? rs->sel : NULL, ly->is_csa ? rs->n_sel : NULL, c->index_topk,
                              1.0f / sqrtf((float)d), rs->o, inv, c->rope_dim / 2};
    if (be->attention(be, &ap, err)) return -1;
    if (ds_step_dump(S, "attn_o", li, rs->o, T, H * d, err)) return -1;

    /* grouped output projection: group g of heads through its block of wo_a */
    ds_matmul_grouped g = {&ly->wo_a, c->o_groups, T, rs->o, rs->oa};
    if (be->matmul_grouped(be, &g, err) || ds_matmul(be, &ly->wo_b, rs->oa, T, out, err)) return -1;

    /* the window ring keeps the last W entries of every sequence */
    ds_window_store_params ws = {li, c->window, d, rs->kv};
    return be->window_store(be, &ws, err);
}
