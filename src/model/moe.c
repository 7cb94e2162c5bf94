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

/* y [n][D] = w2 @ swiglu(w1 @ x, w3 @ x) for n rows of x [n][D]. */
static int expert(const ds_backend *be, const ds_weight *w1, const ds_weight *w2, const ds_weight *w3, float limit,
                  const float *x, int n, float *y) {
    int I = w1->rows;
    float *h1 = malloc((size_t)n * I * sizeof *h1), *h3 = malloc((size_t)n * I * sizeof *h3);
    if (!h1 || !h3) {
        free(h1);
        free(h3);
        return -1;
    }
    be->matmul(be, w1, x, n, h1);
    be->matmul(be, w3, x, n, h3);
    swiglu(h1, h3, (size_t)n * I, limit);
    be->matmul(be, w2, h1, n, y);
    free(h1);
    free(h3);
    return 0;
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
    float *xg = malloc((size_t)T * D * sizeof *xg), *yg = malloc((size_t)T * D * sizeof *yg);
    float *shared = malloc((size_t)T * D * sizeof *shared);
    int *idx = malloc((size_t)T * k * sizeof *idx), *count = calloc((size_t)E + 1, sizeof *count);
    int *members = malloc((size_t)T * k * sizeof *members);
    if (!logits || !score || !wts || !slot_out || !xg || !yg || !shared || !idx || !count || !members) goto oom;

    be->matmul(be, &ly->gate, xn, T, logits);
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
    for (int e = 0; e < E; e++) {
        int n = count[e + 1] - count[e];
        if (!n) continue;
        for (int j = 0; j < n; j++)
            memcpy(xg + (size_t)j * D, xn + (size_t)(members[count[e] + j] / k) * D, (size_t)D * sizeof(float));
        if (expert(be, &ly->w1[e], &ly->w2[e], &ly->w3[e], L, xg, n, yg)) goto oom;
        for (int j = 0; j < n; j++)
            memcpy(slot_out + (size_t)members[count[e] + j] * D, yg + (size_t)j * D, (size_t)D * sizeof(float));
    }
    if (c->n_shared_experts > 0) {
        if (expert(be, &ly->sw1, &ly->sw2, &ly->sw3, L, xn, T, shared)) goto oom;
    } else {
        memset(shared, 0, (size_t)T * D * sizeof *shared);
    }

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
    free(xg);
    free(yg);
    free(shared);
    free(idx);
    free(count);
    free(members);
    return rc;
}
