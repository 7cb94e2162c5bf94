/* moe.c — the mixture of experts on the CPU (paper §2.1, doc §3.5): routing
 * (sqrt-softplus / sigmoid / softmax scores, top-k with the correction bias,
 * or the token-id hash table), then the experts: tokens grouped by expert so
 * each expert's weights are read once per step, clamped SwiGLU, and a
 * token's k outputs summed in ascending expert id, the shared expert last —
 * the same bits whatever else is in the batch. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/dsmath.h"

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Routing of one token: expert ids (ascending for routed layers) and weights. */
static void route_token(const ds_route_params *P, const float *logits, int32_t token, int32_t *idx, float *wts,
                        float *score) {
    int E = P->E, k = P->k;
    if (P->score_func == DS_ROUTE_SOFTMAX) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, logits[e]);
        for (int e = 0; e < E; e++) sum += (score[e] = expf(logits[e] - mx));
        for (int e = 0; e < E; e++) score[e] /= sum;
    } else {
        for (int e = 0; e < E; e++)
            score[e] = P->score_func == DS_ROUTE_SIGMOID ? 1.0f / (1.0f + expf(-logits[e])) : sqrtf(softplus(logits[e]));
    }
    if (P->tid2eid) {
        for (int j = 0; j < k; j++) idx[j] = P->tid2eid[(size_t)token * k + j];
    } else {
        /* k largest of score + bias; ties to the lower id; then ascending */
        unsigned char taken[4096];
        memset(taken, 0, (size_t)E);
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = 0.0f;
            for (int e = 0; e < E; e++) {
                float v = score[e] + P->bias[e];
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
    for (int j = 0; j < k; j++) wts[j] = score[idx[j]] / (sum + 1e-20f) * P->route_scale;
}

int ds_cpu_route(const ds_backend *be, const ds_route_params *p, ds_err *err) {
    const ds_step_desc *st = &ds_cpu_of(be)->step;
    if (p->E > 4096) return ds_fail(err, "cpu routing: %d experts (at most 4096)", p->E);
    float *score = ds_cpu_scratch(be, DS_SCR_MISC, (size_t)p->E * sizeof(float));
    if (!score) return ds_fail(err, "cpu routing: out of memory");
    for (int t = 0; t < p->T; t++)
        route_token(p, p->logits + (size_t)t * p->E, st->tok_id[t], p->idx + (size_t)t * p->k, p->wts + (size_t)t * p->k,
                    score);
    return 0;
}

static void swiglu(float *a, const float *up, size_t n, float limit) {
    for (size_t i = 0; i < n; i++) a[i] = ds_swiglu(a[i], up[i], limit);
}

typedef struct {
    const ds_moe_experts_params *p;
    const int *count, *members; /* selected (token, slot) pairs grouped by expert */
    int shared;                 /* run the shared expert as "expert E" */
    size_t cap, imax;           /* rows per batch, widest intermediate */
    float *xg, *h1, *h3, *yg;
    ds_matmul_job *j13, *j2;
    int *ej, *rj;               /* a batch's job i: expert ej[i] (E: the shared one), first row rj[i] */
} moe_run;

static int expert_rows(const moe_run *M, int e) {
    return e < M->p->E ? M->count[e + 1] - M->count[e] : M->shared ? M->p->T : 0;
}

/* A batch's per-job copies and activations, one job (expert) per
 * parallel item: its tokens' x rows gathered, the clamped SwiGLU of its
 * up products, its outputs back to their (token, slot) rows. Elementwise
 * and copies: the same bits however the jobs are spread. */
static void copy_job(const moe_run *M, int i, int gather) {
    const ds_moe_experts_params *P = M->p;
    int e = M->ej[i], D = P->D;
    if (e == P->E) return;
    for (int j = 0, n = expert_rows(M, e); j < n; j++) {
        int m = M->members[M->count[e] + j];
        size_t r = (size_t)M->rj[i] + (size_t)j;
        if (gather) memcpy(M->xg + r * D, P->x + (size_t)(m / P->k) * D, (size_t)D * sizeof(float));
        else memcpy(P->slot_out + (size_t)m * D, M->yg + r * D, (size_t)D * sizeof(float));
    }
}

static void gather_job(void *ctx, int i) { copy_job(ctx, i, 1); }

static void swiglu_job(void *ctx, int i) {
    const moe_run *M = ctx;
    swiglu(M->j13[2 * i].y, M->j13[2 * i + 1].y, (size_t)M->j2[i].T * (size_t)M->j2[i].w->cols, M->p->limit);
}

static void scatter_job(void *ctx, int i) { copy_job(ctx, i, 0); }

/* Experts [e, ...) that fit one batch; returns the next expert, or -1. */
static int run_batch(const ds_backend *be, const moe_run *M, int e, ds_err *err) {
    const ds_moe_experts_params *P = M->p;
    int D = P->D, E = P->E, nj = 0;
    size_t rows = 0, imax = M->imax;
    for (; e <= E; e++) {
        int n = expert_rows(M, e);
        if (!n) continue;
        if (rows > 0 && rows + (size_t)n > M->cap) break;
        const float *x = e < E ? M->xg + rows * D : P->x;
        const ds_weight *w1 = e < E ? &P->w1[e] : P->sw1, *w3 = e < E ? &P->w3[e] : P->sw3;
        const ds_weight *w2 = e < E ? &P->w2[e] : P->sw2;
        M->ej[nj] = e;
        M->rj[nj] = (int)rows;
        M->j13[2 * nj] = (ds_matmul_job){w1, x, n, M->h1 + rows * imax};
        M->j13[2 * nj + 1] = (ds_matmul_job){w3, x, n, M->h3 + rows * imax};
        M->j2[nj++] = (ds_matmul_job){w2, M->h1 + rows * imax, n, e < E ? M->yg + rows * D : P->shared_out};
        rows += (size_t)n;
    }
    size_t floats = rows * (size_t)D;
    ds_cpu_parallel_for_sized(be, nj, gather_job, (void *)M, floats);
    if (ds_cpu_matmul_many(be, M->j13, 2 * nj, err)) return -1;
    ds_cpu_parallel_for_sized(be, nj, swiglu_job, (void *)M, floats);
    if (ds_cpu_matmul_many(be, M->j2, nj, err)) return -1;
    ds_cpu_parallel_for_sized(be, nj, scatter_job, (void *)M, floats);
    return e;
}

int ds_cpu_moe_experts(const ds_backend *be, const ds_moe_experts_params *p, ds_err *err) {
    int T = p->T, E = p->E, k = p->k, D = p->D;
    if (k > 64) return ds_fail(err, "cpu MoE: %d experts per token (at most 64)", k);
    moe_run M = {p, NULL, NULL, p->sw1 != NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    M.cap = (size_t)T > DS_CPU_MOE_BATCH_ROWS ? (size_t)T : DS_CPU_MOE_BATCH_ROWS;
    M.imax = (size_t)p->w1[0].rows;
    if (M.shared && (size_t)p->sw1->rows > M.imax) M.imax = (size_t)p->sw1->rows;
    /* one scratch block: ints, then jobs, then floats */
    size_t n_int = (size_t)E + 1 + (size_t)E + (size_t)T * k + 2 * ((size_t)E + 1), n_job = 3 * ((size_t)E + 1);
    size_t n_flt = 2 * M.cap * D + 2 * M.cap * M.imax;
    size_t o_job = (n_int * sizeof(int) + 63) / 64 * 64, o_flt = o_job + (n_job * sizeof(ds_matmul_job) + 63) / 64 * 64;
    char *buf = ds_cpu_scratch(be, DS_SCR_MOE, o_flt + n_flt * sizeof(float));
    if (!buf) return ds_fail(err, "cpu MoE: out of memory for %d tokens", T);
    int *count = (int *)buf, *fill = count + E + 1, *members = fill + E;
    M.ej = members + (size_t)T * k;
    M.rj = M.ej + E + 1;
    M.j13 = (ds_matmul_job *)(buf + o_job);
    M.j2 = M.j13 + 2 * ((size_t)E + 1);
    float *f = (float *)(buf + o_flt);
    M.xg = f, f += M.cap * D;
    M.yg = f, f += M.cap * D;
    M.h1 = f, f += M.cap * M.imax;
    M.h3 = f;
    /* group the selected (token, slot) pairs by expert, tokens in row order */
    memset(count, 0, ((size_t)E + 1) * sizeof *count);
    for (int i = 0; i < T * k; i++)
        if (!p->sel || p->sel[i]) count[p->idx[i] + 1]++;
    for (int e = 0; e < E; e++) count[e + 1] += count[e];
    memcpy(fill, count, (size_t)E * sizeof *fill);
    for (int i = 0; i < T * k; i++)
        if (!p->sel || p->sel[i]) members[fill[p->idx[i]]++] = i;
    M.count = count;
    M.members = members;
    if (!M.shared && p->shared_out) memset(p->shared_out, 0, (size_t)T * D * sizeof(float));
    for (int e = 0; e <= E;)
        if ((e = run_batch(be, &M, e, err)) < 0) return ds_fail_prefix(err, "MoE");
    return 0;
}

/* y = sum over slots in ascending (expert id, slot) of w * E(x), + shared */
static void combine_token(void *ctx, int t) {
    const ds_moe_combine_params *P = ctx;
    int k = P->k, D = P->D, order[64];
    const int32_t *idx = P->idx + (size_t)t * k;
    for (int j = 0; j < k; j++) order[j] = j;
    for (int a = 1; a < k; a++) /* insertion sort by (expert id, slot) */
        for (int b = a; b > 0 && idx[order[b - 1]] > idx[order[b]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    float *y = P->out + (size_t)t * D;
    for (int i = 0; i < D; i++) y[i] = 0.0f;
    for (int j = 0; j < k; j++) {
        const float *o = P->slot_out + ((size_t)t * k + order[j]) * D;
        float w = P->wts[(size_t)t * k + order[j]];
        for (int i = 0; i < D; i++) y[i] = y[i] + o[i] * w;
    }
    for (int i = 0; i < D; i++) y[i] = y[i] + P->shared_out[(size_t)t * D + i];
}

int ds_cpu_moe_combine(const ds_backend *be, const ds_moe_combine_params *p, ds_err *err) {
    if (p->k > 64) return ds_fail(err, "cpu MoE combine: %d experts per token (at most 64)", p->k);
    ds_cpu_parallel_for(be, p->T, combine_token, (void *)p);
    return 0;
}

/* The fused op: both halves, the pairs' outputs in scratch. */
int ds_cpu_moe(const ds_backend *be, const ds_moe_params *p, ds_err *err) {
    int T = p->T, k = p->k, D = p->D;
    if (k > 64) return ds_fail(err, "cpu MoE: %d experts per token (at most 64)", k);
    size_t n_slot = (size_t)T * k * D, n_sh = (size_t)T * D;
    float *f = ds_cpu_scratch(be, DS_SCR_MOE_OUT, ((n_slot * sizeof(float) + 63) / 64 * 64) + n_sh * sizeof(float));
    if (!f) return ds_fail(err, "cpu MoE: out of memory for %d tokens", T);
    float *slot_out = f, *shared_out = f + (n_slot + 15) / 16 * 16;
    ds_moe_experts_params xp = {p->x,   T,      D,      p->E,  k,     p->idx,     NULL,      p->w1,
                                p->w2,  p->w3,  p->sw1, p->sw2, p->sw3, p->limit, slot_out, shared_out};
    ds_moe_combine_params cp = {T, D, k, p->idx, p->wts, slot_out, shared_out, p->out};
    if (ds_cpu_moe_experts(be, &xp, err)) return -1;
    return ds_cpu_moe_combine(be, &cp, err);
}
