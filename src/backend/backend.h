/* backend.h — the compute interface the model code talks to. The model says
 * what to compute (paper sections in src/model/); a backend decides how.
 * Every op is invariant by construction (shared/docs/design.md §1): each
 * output element is reduced in an order fixed by the model's shapes only,
 * never by the number of tokens, their batch positions or the thread count. */
#ifndef DS_BACKEND_H
#define DS_BACKEND_H

#include "model/weights.h"

typedef struct ds_backend ds_backend;

/* One attention query: q (d floats) against n_keys key=value rows. */
typedef struct ds_attn_query {
    const float *q;            /* [d] */
    const float *const *keys;  /* n_keys pointers to [d] rows (K = V) */
    int n_keys;
    float sink;                /* per-head sink logit: joins the denominator only */
    float *out;                /* [d] */
} ds_attn_query;

/* One product of a batch: y[t][r] = sum_k w[r][k] * x[t][k] for t < T. */
typedef struct ds_matmul_job {
    const ds_weight *w;
    const float *x; /* [T][w->cols] */
    int T;
    float *y;       /* [T][w->rows] */
} ds_matmul_job;

/* Where the time goes (dsv4 bench): while a backend's profile is set, its
 * products and attention add their wall time here. A batch of products
 * (matmul_many) counts, time and bytes, under the storage kind holding most
 * of its weight bytes. Only the calling thread writes it. */
typedef struct ds_profile {
    double mm_seconds[5], mm_bytes[5]; /* by ds_wkind */
    long mm_calls[5];
    double attend_seconds;
} ds_profile;

struct ds_backend {
    const char *name;
    int n_threads;
    int cpu_path; /* CPU backend: kernel path (all paths give the same bits) */
    ds_profile *profile; /* NULL: no accounting */
    /* The compute ops return 0, or -1 when the backend could not allocate its
     * scratch (the outputs are then undefined). */
    /* y[t][r] = sum_k w[r][k] * x[t][k] for t < T (x: [T][w->cols], y: [T][w->rows]). */
    int (*matmul)(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y);
    /* Independent products (their y must not overlap any x) run together —
     * on the CPU in one parallel region; each output has the bits matmul
     * would give it. */
    int (*matmul_many)(const ds_backend *be, const ds_matmul_job *jobs, int n);
    /* Softmax attention with a sink for each query; scale multiplies q.k. */
    int (*attend)(const ds_backend *be, const ds_attn_query *qs, int n, int d, float scale);
    /* Runs fn(ctx, i) for i in [0, n) on the backend's threads; each i must
     * write only its own outputs (so results cannot depend on the schedule). */
    void (*parallel_for)(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx);
};

int ds_backend_cpu_init(ds_backend *be, int n_threads);

/* The fixed-order dot product every backend implements bit-identically on
 * the CPU: 8 lanes over chunks of 8, alternating two accumulators, then a
 * fixed tree. Exposed for the model's small reductions. */
float ds_dot_f32(const float *a, const float *b, int n);

#endif
