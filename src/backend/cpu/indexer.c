/* indexer.c — the Lightning Indexer's selection on the CPU (paper §2.3.1,
 * doc §3.4): each row keeps the topk causally visible entries of its
 * sequence's index keys with the highest
 *   score(w) = sum_h w_h * ReLU(q_h . K_w) / sqrt(dh),  w_h = iw_h * wscale,
 * NaN scores lowest, ties toward the lower entry index; ids ascending. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"

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
    const ds_indexer_params *p;
    const ds_step_desc *st;
    const float *w;   /* [T][nh] scaled head weights */
    const size_t *off;
    cand *cands;
} sel_job;

static void select_row(void *ctx, int t) {
    const sel_job *J = ctx;
    const ds_indexer_params *P = J->p;
    int nh = P->nh, dh = P->dh, topk = P->topk;
    const float *entries = J->st->seq_mem[J->st->tok_seq[t]][P->layer].icomp.entries;
    int nv = (int)((J->st->tok_pos[t] + 1) / P->ratio);
    int *out = P->sel + (size_t)t * topk;
    if (nv <= topk) { /* everything visible is kept */
        for (int w = 0; w < nv; w++) out[w] = w;
        P->n_sel[t] = nv;
        return;
    }
    cand *cs = J->cands + J->off[t];
    const float *q = P->iq + (size_t)t * nh * dh, *wt = J->w + (size_t)t * nh;
    float scale = 1.0f / sqrtf((float)dh);
    for (int w = 0; w < nv; w++) {
        const float *K = entries + (size_t)w * dh;
        float s = 0.0f;
        for (int h = 0; h < nh; h++) {
            float dot = ds_dot_f32(q + (size_t)h * dh, K, dh);
            s += (dot > 0.0f ? dot : 0.0f) * scale * wt[h];
        }
        cs[w].score = isnan(s) ? -INFINITY : s;
        cs[w].idx = w;
    }
    qsort(cs, (size_t)nv, sizeof *cs, cand_cmp);
    for (int j = 0; j < topk; j++) out[j] = cs[j].idx;
    qsort(out, (size_t)topk, sizeof *out, int_cmp);
    P->n_sel[t] = topk;
}

int ds_cpu_indexer(const ds_backend *be, const ds_indexer_params *p, ds_err *err) {
    const ds_step_desc *st = &ds_cpu_of(be)->step;
    int T = st->T;
    size_t total = 0, head = (size_t)(T + 1) * sizeof(size_t) + (size_t)T * p->nh * sizeof(float);
    for (int t = 0; t < T; t++) {
        size_t nv = (size_t)((st->tok_pos[t] + 1) / p->ratio);
        if (nv > (size_t)p->topk) total += nv;
    }
    char *buf = ds_cpu_scratch(be, DS_SCR_IDX, head + (total ? total : 1) * sizeof(cand));
    if (!buf) return ds_fail(err, "cpu indexer (layer %d): out of memory for %zu candidates", p->layer, total);
    size_t *off = (size_t *)buf;
    float *w = (float *)(off + T + 1);
    cand *cands = (cand *)(buf + head); /* head is a multiple of 4 bytes */
    total = 0;
    for (int t = 0; t < T; t++) {
        size_t nv = (size_t)((st->tok_pos[t] + 1) / p->ratio);
        off[t] = total;
        if (nv > (size_t)p->topk) total += nv;
    }
    for (size_t i = 0; i < (size_t)T * p->nh; i++) w[i] = p->iw[i] * p->wscale;
    sel_job J = {p, st, w, off, cands};
    ds_cpu_parallel_for(be, T, select_row, &J);
    return 0;
}
