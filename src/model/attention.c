/* attention.c — shared-KV multi-query attention with per-head sinks (paper
 * §2.3, doc §3.2): low-rank q, one K=V head, partial interleaved RoPE, the
 * sliding window plus the compressed entries the layer allows (all complete
 * HCA windows; the indexer's top-k on CSA layers), the inverse RoPE on the
 * output and the grouped output projection. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/norm.h"
#include "model/rope.h"
#include "model/step.h"

static float *fbuf(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

/* Per-head work on rows of [T][H][d]: optional unweighted RMSNorm, then RoPE
 * (inverse for the attention output) at each row's position. */
typedef struct {
    float *x;
    int H, d, half, norm, inverse;
    const float *inv;
    const int64_t *pos;
    float eps;
} head_job;

static void head_row(void *ctx, int i) {
    const head_job *J = ctx;
    float *xh = J->x + (size_t)i * J->d;
    if (J->norm) ds_rmsnorm(xh, xh, NULL, J->d, J->eps);
    ds_rope_apply(xh, J->d, J->inv, J->half, J->pos[i / J->H], J->inverse);
}

void ds_heads_rope(const ds_backend *be, float *x, int T, int H, int d, int norm, const float *inv, int half,
                   const int64_t *pos, int inverse, float eps) {
    head_job J = {x, H, d, half, norm, inverse, inv, pos, eps};
    be->parallel_for(be, T * H, head_row, &J);
}

/* Feeds the step's tokens of every sequence, in position order, to the
 * layer's compressor; entries completed by a token become visible to it. */
static int compress_tokens(const ds_step *S, int li, const ds_compressor_w *w, int which, const float *kv,
                           const float *gate, ds_err *err) {
    const ds_model *m = S->m;
    int cd = (w->overlap ? 2 : 1) * w->d;
    for (int s = 0; s < S->n_seqs; s++) {
        ds_layer_state *st = &S->seqs[s]->layers[li];
        ds_comp_state *cs = which ? &st->icomp : &st->comp;
        for (int r = S->seq_row0[s]; r < S->seq_row0[s] + S->seq_n[s]; r++)
            if (ds_comp_push(w, cs, kv + (size_t)r * cd, gate + (size_t)r * cd, S->tok_pos[r], m->inv_freq_compress,
                             m->cfg.rope_dim / 2, m->cfg.rms_eps))
                return ds_fail(err, "layer %d: compressed-entry capacity of the sequence exceeded at position %lld", li,
                               (long long)S->tok_pos[r]);
    }
    return 0;
}

int ds_compress_tokens(const ds_step *S, int li, const ds_compressor_w *w, int which, const float *xn, ds_err *err) {
    int T = S->T, cd = (w->overlap ? 2 : 1) * w->d;
    float *kv = fbuf((size_t)T * cd), *gate = fbuf((size_t)T * cd);
    int rc = -1;
    if (!kv || !gate) {
        ds_fail(err, "out of memory");
    } else {
        ds_matmul_job j[2] = {{&w->wkv, xn, T, kv}, {&w->wgate, xn, T, gate}};
        rc = S->be->matmul_many(S->be, j, 2) ? ds_fail(err, "layer %d compressor: out of memory", li)
                                              : compress_tokens(S, li, w, which, kv, gate, err);
    }
    free(kv);
    free(gate);
    return rc;
}

int ds_attention(const ds_step *S, int li, const float *xn, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    int T = S->T, H = c->n_heads, d = c->head_dim, QL = c->q_lora_rank, W = c->window, half = c->rope_dim / 2;
    int G = c->o_groups, OL = c->o_lora_rank, gs = H * d / G, topk = c->index_topk;
    const float *inv = ly->ratio ? m->inv_freq_compress : m->inv_freq_main;
    int rc = -1;

    float *qr = fbuf((size_t)T * QL), *q = fbuf((size_t)T * H * d), *kv = fbuf((size_t)T * d);
    float *o = fbuf((size_t)T * H * d), *oa = fbuf((size_t)T * G * OL);
    float *gin = fbuf((size_t)T * G * gs), *gout = fbuf((size_t)T * G * OL);
    ds_weight *wg = malloc((size_t)G * sizeof *wg);
    ds_matmul_job *jg = malloc((size_t)G * sizeof *jg);
    int *sel = NULL, *n_sel = NULL;
    const float **keys = NULL;
    size_t *key0 = NULL;
    ds_attn_query *qs = NULL;
    if (!qr || !q || !kv || !o || !oa || !gin || !gout || !wg || !jg) goto oom;

    /* queries q = norm_h(wq_b @ RMSNorm(wq_a @ x)) and the single K=V head
     * kv = RMSNorm(wkv @ x), both with RoPE on the last r channels */
    ds_matmul_job jqkv[2] = {{&ly->wq_a, xn, T, qr}, {&ly->wkv, xn, T, kv}};
    if (be->matmul_many(be, jqkv, 2)) goto oom;
    ds_rmsnorm_rows(be, qr, qr, ly->q_norm, T, QL, c->rms_eps);
    if (be->matmul(be, &ly->wq_b, qr, T, q)) goto oom;
    ds_heads_rope(be, q, T, H, d, 1, inv, half, S->tok_pos, 0, c->rms_eps);
    ds_rmsnorm_rows(be, kv, kv, ly->kv_norm, T, d, c->rms_eps);
    ds_heads_rope(be, kv, T, 1, d, 0, inv, half, S->tok_pos, 0, c->rms_eps);
    /* compressed entries, then the indexer's choice among them */
    if (ly->ratio && ds_compress_tokens(S, li, &ly->comp, 0, xn, err)) goto done;
    if (ly->is_csa) {
        sel = malloc((size_t)T * (size_t)topk * sizeof *sel);
        n_sel = malloc((size_t)T * sizeof *n_sel);
        if (!sel || !n_sel) goto oom;
        if (ds_indexer_select(S, li, xn, qr, sel, n_sel, err)) goto done;
    }

    /* key lists: the window (ascending positions), then compressed entries */
    key0 = malloc((size_t)(T + 1) * sizeof *key0);
    if (!key0) goto oom;
    size_t total = 0;
    for (int t = 0; t < T; t++) {
        int64_t p = S->tok_pos[t], lo = p - W + 1 < 0 ? 0 : p - W + 1;
        key0[t] = total;
        total += (size_t)(p - lo + 1);
        if (ly->is_csa)
            total += (size_t)n_sel[t];
        else if (ly->ratio)
            total += (size_t)((p + 1) / ly->ratio);
    }
    key0[T] = total;
    keys = malloc((total ? total : 1) * sizeof *keys);
    qs = malloc((size_t)T * (size_t)H * sizeof *qs);
    if (!keys || !qs) goto oom;
    for (int t = 0; t < T; t++) {
        int s = S->tok_seq[t];
        const ds_seq *sq = S->seqs[s];
        const ds_layer_state *st = &sq->layers[li];
        int64_t p = S->tok_pos[t], lo = p - W + 1 < 0 ? 0 : p - W + 1;
        const float **k = keys + key0[t];
        for (int64_t pp = lo; pp <= p; pp++)
            *k++ = pp >= sq->pos ? kv + (size_t)(S->seq_row0[s] + (pp - sq->pos)) * d
                                 : st->ring + (size_t)(pp % W) * d;
        if (ly->is_csa) {
            for (int j = 0; j < n_sel[t]; j++) *k++ = st->comp.entries + (size_t)sel[(size_t)t * topk + j] * d;
        } else if (ly->ratio) {
            int nv = (int)((p + 1) / ly->ratio);
            for (int j = 0; j < nv; j++) *k++ = st->comp.entries + (size_t)j * d;
        }
        for (int h = 0; h < H; h++) {
            ds_attn_query *Q = &qs[(size_t)t * H + h];
            Q->q = q + ((size_t)t * H + h) * d;
            Q->keys = keys + key0[t];
            Q->n_keys = (int)(key0[t + 1] - key0[t]);
            Q->sink = ly->attn_sink[h];
            Q->out = o + ((size_t)t * H + h) * d;
        }
    }
    if (be->attend(be, qs, T * H, d, 1.0f / sqrtf((float)d))) goto oom;

    /* values carried their keys' rotation: undo it at the query position */
    ds_heads_rope(be, o, T, H, d, 0, inv, half, S->tok_pos, 1, c->rms_eps);

    /* grouped output projection: group g of heads through its block of wo_a */
    for (int g = 0; g < G; g++) {
        for (int t = 0; t < T; t++)
            memcpy(gin + ((size_t)g * T + t) * gs, o + (size_t)t * H * d + (size_t)g * gs, (size_t)gs * sizeof(float));
        wg[g] = ds_weight_rows(&ly->wo_a, g * OL, OL);
        jg[g] = (ds_matmul_job){&wg[g], gin + (size_t)g * T * gs, T, gout + (size_t)g * T * OL};
    }
    if (be->matmul_many(be, jg, G)) goto oom;
    for (int g = 0; g < G; g++)
        for (int t = 0; t < T; t++)
            memcpy(oa + (size_t)t * G * OL + (size_t)g * OL, gout + ((size_t)g * T + t) * OL, (size_t)OL * sizeof(float));
    if (be->matmul(be, &ly->wo_b, oa, T, out)) goto oom;

    /* the window ring keeps the last W entries of every sequence */
    for (int s = 0; s < S->n_seqs; s++) {
        ds_seq *sq = S->seqs[s];
        int n = S->seq_n[s], first = n > W ? n - W : 0;
        for (int i = first; i < n; i++)
            memcpy(sq->layers[li].ring + (size_t)((sq->pos + i) % W) * d, kv + (size_t)(S->seq_row0[s] + i) * d,
                   (size_t)d * sizeof(float));
    }
    rc = 0;
    goto done;
oom:
    ds_fail(err, "layer %d attention: out of memory for %d tokens", li, T);
done:
    free(qr);
    free(q);
    free(kv);
    free(o);
    free(oa);
    free(gin);
    free(gout);
    free(wg);
    free(jg);
    free(sel);
    free(n_sel);
    free(keys);
    free(key0);
    free(qs);
    return rc;
}
