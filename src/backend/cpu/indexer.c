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

/* x ranks above y: the higher score, then the lower entry index */
static int above(cand x, cand y) { return x.score > y.score || (x.score == y.score && x.idx < y.idx); }

/* h[0..n) is a heap with its lowest-ranked candidate at h[0] */
static void sift_down(cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, lo = i;
        if (l < n && above(h[lo], h[l])) lo = l;
        if (r < n && above(h[lo], h[r])) lo = r;
        if (lo == i) return;
        cand t = h[i];
        h[i] = h[lo], h[lo] = t, i = lo;
    }
}

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const ds_indexer_params *p;
    const ds_step_desc *st;
    const float *w; /* [T][nh] scaled head weights */
    cand *heaps;    /* [T][topk] */
} sel_job;

/* One row: the topk best of its visible entries through a heap of topk
 * (memory topk per row, whatever the context), the same set a full sort
 * keeps: the ranking is total. */
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
    cand *h = J->heaps + (size_t)t * topk;
    const float *q = P->iq + (size_t)t * nh * dh, *wt = J->w + (size_t)t * nh;
    float scale = 1.0f / sqrtf((float)dh);
    for (int w = 0; w < nv; w++) {
        const float *K = entries + (size_t)w * dh;
        float s = 0.0f;
        for (int hd = 0; hd < nh; hd++) {
            float dot = ds_dot_f32(q + (size_t)hd * dh, K, dh);
            s += (dot > 0.0f ? dot : 0.0f) * scale * wt[hd];
        }
        cand c = {isnan(s) ? -INFINITY : s, w};
        if (w < topk) {
            h[w] = c;
            if (w == topk - 1)
                for (int i = topk / 2 - 1; i >= 0; i--) sift_down(h, topk, i);
        } else if (above(c, h[0])) {
            h[0] = c;
            sift_down(h, topk, 0);
        }
    }
    for (int j = 0; j < topk; j++) out[j] = h[j].idx;
    qsort(out, (size_t)topk, sizeof *out, int_cmp);
    P->n_sel[t] = topk;
}

int ds_cpu_indexer(const ds_backend *be, const ds_indexer_params *p, ds_err *err) {
    const ds_step_desc *st = &ds_cpu_of(be)->step;
    int T = st->T;
    size_t head = (size_t)T * p->nh * sizeof(float);
    head = (head + sizeof(cand) - 1) / sizeof(cand) * sizeof(cand);
    char *buf = ds_cpu_scratch(be, DS_SCR_IDX, head + ((size_t)T * p->topk + 1) * sizeof(cand));
    if (!buf)
        return ds_fail(err, "cpu indexer (layer %d): out of memory for %d rows of top-%d candidates", p->layer, T,
                       p->topk);
    float *w = (float *)buf;
    for (size_t i = 0; i < (size_t)T * p->nh; i++) w[i] = p->iw[i] * p->wscale;
    sel_job J = {p, st, w, (cand *)(buf + head)};
    ds_cpu_parallel_for(be, T, select_row, &J);
    return 0;
}
