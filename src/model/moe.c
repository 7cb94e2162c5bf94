/* moe.c — the mixture of experts (paper §2.1, doc §3.5): sqrt-softplus
 * scores, top-k routing with the correction bias (or the token-id hash table
 * on the first layers), clamped SwiGLU experts and the shared expert.
 * Tokens are grouped by expert so each expert's weights are read once per
 * step; a token's k outputs are summed in ascending expert id, then the
 * shared expert is added — the same bits whatever else is in the batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/step.h"

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static void swiglu(float *a, const float *up, size_t n, float limit) {
    for (size_t i = 0; i < n; i++) {
        float g = a[i] < limit ? a[i] : limit;
        float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        a[i] = g / (1.0f + expf(-g)) * u;
    }
}

/* The experts run in batches of up to MOE_BATCH_ROWS gathered rows (or one
 * expert's rows when more): a batch's w1 and w3 products run together, then
 * its SwiGLUs, then its w2 products together — so at batch 1 a layer's
 * experts cost two parallel regions, not three per expert. */
#define MOE_BATCH_ROWS 256

typedef struct {
    const ds_layer *ly;
    const float *xn;
    const int *count, *members; /* (token, slot) pairs grouped by expert */
    int T, k, D, E, shared;     /* shared: run the shared expert as "expert E" */
    float limit;
    float *slot_out, *shared_out;
} moe_run;

static int expert_rows(const moe_run *M, int e) {
    return e < M->E ? M->count[e + 1] - M->count[e] : M->shared ? M->T : 0;
}

/* Experts [e, ...) that fit one batch; returns the next expert, or -1 when
 * the backend ran out of memory. */
static int run_batch(const ds_backend *be, const moe_run *M, int e, size_t cap, size_t imax, float *xg, float *h1,
                     float *h3, float *yg, ds_matmul_job *j13, ds_matmul_job *j2) {
    const ds_layer *ly = M->ly;
    int D = M->D, k = M->k, nj = 0, e0 = e;
    size_t rows = 0;
    for (; e <= M->E; e++) {
        int n = expert_rows(M, e);
        if (!n) continue;
        if (rows > 0 && rows + (size_t)n > cap) break;
        const float *x = M->xn;
        if (e < M->E) {
            for (int j = 0; j < n; j++)
                memcpy(xg + (rows + (size_t)j) * D, M->xn + (size_t)(M->members[M->count[e] + j] / k) * D,
                       (size_t)D * sizeof(float));
            x = xg + rows * D;
        }
        const ds_weight *w1 = e < M->E ? &ly->w1[e] : &ly->sw1, *w3 = e < M->E ? &ly->w3[e] : &ly->sw3;
        const ds_weight *w2 = e < M->E ? &ly->w2[e] : &ly->sw2;
        j13[2 * nj] = (ds_matmul_job){w1, x, n, h1 + rows * imax};
        j13[2 * nj + 1] = (ds_matmul_job){w3, x, n, h3 + rows * imax};
        j2[nj++] = (ds_matmul_job){w2, h1 + rows * imax, n, e < M->E ? yg + rows * D : M->shared_out};
        rows += (size_t)n;
    }
    if (be->matmul_many(be, j13, 2 * nj)) return -1;
    for (int i = 0; i < nj; i++) swiglu(j13[2 * i].y, j13[2 * i + 1].y, (size_t)j2[i].T * (size_t)j2[i].w->cols, M->limit);
    if (be->matmul_many(be, j2, nj)) return -1;
    /* routed outputs back to their (token, slot) rows */
    rows = 0;
    for (int i = e0; i < e; i++) {
        int n = expert_rows(M, i);
        if (i == M->E || !n) continue;
        for (int j = 0; j < n; j++)
            memcpy(M->slot_out + (size_t)M->members[M->count[i] + j] * D, yg + (rows + (size_t)j) * D,
                   (size_t)D * sizeof(float));
        rows += (size_t)n;
    }
    return e;
}

static int run_experts(const ds_backend *be, const moe_run *M) {
    size_t cap = (size_t)M->T > MOE_BATCH_ROWS ? (size_t)M->T : MOE_BATCH_ROWS;
    size_t imax = (size_t)M->ly->w1[0].rows;
    if (M->shared && (size_t)M->ly->sw1.rows > imax) imax = (size_t)M->ly->sw1.rows;
    float *xg = malloc(cap * M->D * sizeof *xg), *yg = malloc(cap * M->D * sizeof *yg);
    float *h1 = malloc(cap * imax * sizeof *h1), *h3 = malloc(cap * imax * sizeof *h3);
    ds_matmul_job *j13 = malloc(2 * (size_t)(M->E + 1) * sizeof *j13), *j2 = malloc((size_t)(M->E + 1) * sizeof *j2);
    int rc = -1;
    if (xg && yg && h1 && h3 && j13 && j2) {
        rc = 0;
        for (int e = 0; e <= M->E && !rc;) {
            e = run_batch(be, M, e, cap, imax, xg, h1, h3, yg, j13, j2);
            rc = e < 0 ? -1 : 0;
        }
    }
    free(xg);
    free(yg);
    free(h1);
    free(h3);
    free(j13);
    free(j2);
    return rc;
}

/* Routing of one token: expert ids (ascending for routed layers) and weights. */
static void route(const ds_config *c, const ds_layer *ly, const float *logits, int32_t token, int *idx, float *wts,
                  float *score) {
    int E = c->n_routed_experts, k = c->n_active_experts;
    if (c->score_func == DS_SCORE_SOFTMAX) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, logits[e]);
        for (int e = 0; e < E; e++) sum += (score[e] = expf(logits[e] - mx));
        for (int e = 0; e < E; e++) score[e] /= sum;
    } else {
        for (int e = 0; e < E; e++)
            score[e] = c->score_func == DS_SCORE_SIGMOID ? 1.0f / (1.0f + expf(-logits[e])) : sqrtf(softplus(logits[e]));
    }
    if (ly->is_hash) {
        for (int j = 0; j < k; j++) idx[j] = ly->tid2eid[(size_t)token * k + j];
    } else {
        /* k largest of score + bias; ties to the lower id; then ascending */
        unsigned char taken[4096];
        memset(taken, 0, (size_t)E);
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = 0.0f;
            for (int e = 0; e < E; e++) {
                float v = score[e] + ly->gate_bias[e];
                if (!taken[e] && (best < 0 || v > bv)) {
                    best = e;
                    bv = v;
                }
            }
            taken[best] = 1;
        }
        for (int e = 0, j = 0; e < E; e++)
            if (taken[e]) idx[j++] = e;
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += score[idx[j]];
    for (int j = 0; j < k; j++) wts[j] = score[idx[j]] / (sum + 1e-20f) * c->route_scale;
}

typedef struct {
    const int *idx;
    const float *wts, *slot_out, *shared;
    float *out;
    int k, D;
} combine_job;

static void combine_token(void *ctx, int t) {
    const combine_job *J = ctx;
    int k = J->k, D = J->D, order[64];
    const int *idx = J->idx + (size_t)t * k;
    for (int j = 0; j < k; j++) order[j] = j;
    for (int a = 1; a < k; a++) /* insertion sort by (expert id, slot) */
        for (int b = a; b > 0 && idx[order[b - 1]] > idx[order[b]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    float *y = J->out + (size_t)t * D;
    for (int i = 0; i < D; i++) y[i] = 0.0f;
    for (int j = 0; j < k; j++) {
        const float *o = J->slot_out + ((size_t)t * k + order[j]) * D;
        float w = J->wts[(size_t)t * k + order[j]];
        for (int i = 0; i < D; i++) y[i] = y[i] + o[i] * w;
    }
    for (int i = 0; i < D; i++) y[i] = y[i] + J->shared[(size_t)t * D + i];
}

int ds_moe(const ds_step *S, int li, const float *xn, float *out, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    int T = S->T, E = c->n_routed_experts, k = c->n_active_experts, D = c->dim;
    float L = c->swiglu_limit;
    int rc = -1;
    float *logits = malloc((size_t)T * E * sizeof *logits), *score = malloc((size_t)E * sizeof *score);
    float *wts = malloc((size_t)T * k * sizeof *wts), *slot_out = malloc((size_t)T * k * D * sizeof *slot_out);
    float *shared = malloc((size_t)T * D * sizeof *shared);
    int *idx = malloc((size_t)T * k * sizeof *idx), *count = calloc((size_t)E + 1, sizeof *count);
    int *members = malloc((size_t)T * k * sizeof *members);
    if (!logits || !score || !wts || !slot_out || !shared || !idx || !count || !members) goto oom;

    if (be->matmul(be, &ly->gate, xn, T, logits)) goto oom;
    for (int t = 0; t < T; t++) {
        route(c, ly, logits + (size_t)t * E, S->tok_id[t], idx + (size_t)t * k, wts + (size_t)t * k, score);
        if (S->obs && S->obs->route) {
            int s = S->tok_seq[t];
            S->obs->route(S->obs->ctx, li, s, t - S->seq_row0[s], idx + (size_t)t * k, k);
        }
    }

    /* group (token, slot) pairs by expert, tokens in row order */
    for (int i = 0; i < T * k; i++) count[idx[i] + 1]++;
    for (int e = 0; e < E; e++) count[e + 1] += count[e];
    {
        int *fill = malloc((size_t)E * sizeof *fill);
        if (!fill) goto oom;
        memcpy(fill, count, (size_t)E * sizeof *fill);
        for (int i = 0; i < T * k; i++) members[fill[idx[i]]++] = i;
        free(fill);
    }
    if (c->n_shared_experts <= 0) memset(shared, 0, (size_t)T * D * sizeof *shared);
    moe_run M = {ly, xn, count, members, T, k, D, E, c->n_shared_experts > 0, L, slot_out, shared};
    if (run_experts(be, &M)) goto oom;

    /* y = sum over slots in ascending expert id (then slot) of w * E(x), + shared */
    combine_job J = {idx, wts, slot_out, shared, out, k, D};
    be->parallel_for(be, T, combine_token, &J);
    rc = 0;
    goto done;
oom:
    ds_fail(err, "layer %d MoE: out of memory for %d tokens", li, T);
done:
    free(logits);
    free(score);
    free(wts);
    free(slot_out);
    free(shared);
    free(idx);
    free(count);
    free(members);
    return rc;
}
