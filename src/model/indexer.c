/* indexer.c — the Lightning Indexer of CSA layers (paper §2.3.1, doc §3.4):
 * index keys are compressed like the KV entries (own compressor at
 * index_head_dim), queries come from the q residual, and each query keeps the
 * index_topk causally visible entries with the highest
 *   score(t, w) = sum_h w_h * ReLU(q_h . K_w) / sqrt(index_head_dim),
 * ties broken toward the lower entry index. */
#include <math.h>
#include <stdlib.h>

#include "model/rope.h"
#include "model/step.h"

typedef struct {
    float score;
    int idx;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->score > y->score) return -1;
    if (x->score < y->score) return 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const ds_step *S;
    int li;
    const float *iq, *iw;
    int *sel, *n_sel;
} sel_job;

static void select_token(void *ctx, int t) {
    sel_job *J = ctx;
    const ds_step *S = J->S;
    const ds_config *c = &S->m->cfg;
    const ds_layer *ly = &S->m->layers[J->li];
    int nh = c->index_n_heads, dh = c->index_head_dim, topk = c->index_topk;
    const ds_comp_state *cs = &S->seqs[S->tok_seq[t]]->layers[J->li].icomp;
    int nv = (int)((S->tok_pos[t] + 1) / ly->ratio);
    int *out = J->sel + (size_t)t * topk;
    if (nv <= topk) { /* everything visible is kept */
        for (int w = 0; w < nv; w++) out[w] = w;
        J->n_sel[t] = nv;
        return;
    }
    cand *cs_ = malloc((size_t)nv * sizeof *cs_);
    if (!cs_) {
        J->n_sel[t] = -1; /* reported by the caller */
        return;
    }
    const float *q = J->iq + (size_t)t * nh * dh, *wt = J->iw + (size_t)t * nh;
    float scale = 1.0f / sqrtf((float)dh);
    for (int w = 0; w < nv; w++) {
        const float *K = cs->entries + (size_t)w * dh;
        float s = 0.0f;
        for (int h = 0; h < nh; h++) {
            float dot = ds_dot_f32(q + (size_t)h * dh, K, dh);
            s += (dot > 0.0f ? dot : 0.0f) * scale * wt[h];
        }
        cs_[w].score = isnan(s) ? -INFINITY : s;
        cs_[w].idx = w;
    }
    qsort(cs_, (size_t)nv, sizeof *cs_, cand_cmp);
    for (int j = 0; j < topk; j++) out[j] = cs_[j].idx;
    qsort(out, (size_t)topk, sizeof *out, int_cmp);
    J->n_sel[t] = topk;
    free(cs_);
}

int ds_indexer_select(const ds_step *S, int li, const float *xn, const float *qr, int *sel, int *n_sel,
                      ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    int T = S->T, nh = c->index_n_heads, dh = c->index_head_dim, half = c->rope_dim / 2;
    if (ds_compress_tokens(S, li, &ly->idx.comp, 1, xn, err)) return -1;
    float *iq = malloc((size_t)T * nh * dh * sizeof *iq), *iw = malloc((size_t)T * nh * sizeof *iw);
    int rc = 0;
    ds_matmul_job j[2] = {{&ly->idx.wq_b, qr, T, iq}, {&ly->idx.weights_proj, xn, T, iw}};
    if (!iq || !iw || S->be->matmul_many(S->be, j, 2)) {
        rc = ds_fail(err, "layer %d indexer: out of memory", li);
    } else {
        ds_heads_rope(S->be, iq, T, nh, dh, 0, m->inv_freq_compress, half, S->tok_pos, 0, c->rms_eps);
        float ws = 1.0f / sqrtf((float)nh);
        for (size_t i = 0; i < (size_t)T * nh; i++) iw[i] *= ws;
        sel_job J = {S, li, iq, iw, sel, n_sel};
        S->be->parallel_for(S->be, T, select_token, &J);
        for (int t = 0; t < T && !rc; t++)
            if (n_sel[t] < 0) rc = ds_fail(err, "layer %d indexer: out of memory", li);
    }
    free(iq);
    free(iw);
    return rc;
}
