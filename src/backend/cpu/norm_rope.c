/* norm_rope.c — the CPU's row-wise ops: embedding lookup, RMSNorm (doc §3.1),
 * per-head norm + RoPE (doc §3.2) and row gathers. Rows run in parallel;
 * each row's arithmetic is the same whatever else is in the step. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

void ds_cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ms = ds_dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) out[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

/* Angles as in the reference: fp32 inv_freq times fp32 position, then
 * cos/sin in fp32; (a, b) -> (a cos - b sin, b cos + a sin). */
void ds_cpu_rope(float *x, int dim, const float *inv_freq, int half, int64_t pos, int inverse) {
    float *p = x + dim - 2 * half;
    for (int i = 0; i < half; i++) {
        float ang = inv_freq[i] * (float)pos;
        float cs = cosf(ang), sn = sinf(ang);
        if (inverse) sn = -sn;
        float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * cs - b * sn;
        p[2 * i + 1] = b * cs + a * sn;
    }
}

typedef struct {
    const ds_rmsnorm_params *p;
    const int64_t *pos;
} norm_job;

static void norm_row(void *ctx, int t) {
    const norm_job *J = ctx;
    const ds_rmsnorm_params *P = J->p;
    float *o = P->out + (size_t)t * P->n;
    ds_cpu_rmsnorm(o, P->x + (size_t)t * P->n, P->w, P->n, P->eps);
    if (P->rope_inv_freq) ds_cpu_rope(o, P->n, P->rope_inv_freq, P->rope_half, J->pos[t], 0);
}

int ds_cpu_rmsnorm_op(const ds_backend *be, const ds_rmsnorm_params *jobs, int n, ds_err *err) {
    const ds_step_desc *st = &ds_cpu_of(be)->step;
    /* every job checked before any runs: a bad one leaves no output written */
    for (int i = 0; i < n; i++) {
        const ds_rmsnorm_params *p = &jobs[i];
        if (p->rope_inv_freq && (p->T > st->T || p->rope_half < 0 || 2 * p->rope_half > p->n))
            return ds_fail(err, "cpu rmsnorm job %d: rope_half %d on %d rows of %d in a step of %d rows", i,
                           p->rope_half, p->T, p->n, st->T);
    }
    for (int i = 0; i < n; i++) {
        const ds_rmsnorm_params *p = &jobs[i];
        norm_job J = {p, st->tok_pos};
        ds_cpu_parallel_for(be, p->T, norm_row, &J);
    }
    return 0;
}

typedef struct {
    const ds_rope_params *p;
    const int64_t *pos;
} rope_job;

static void rope_head(void *ctx, int i) {
    const rope_job *J = ctx;
    const ds_rope_params *P = J->p;
    float *xh = P->x + (size_t)i * P->d;
    if (P->norm) ds_cpu_rmsnorm(xh, xh, NULL, P->d, P->eps);
    ds_cpu_rope(xh, P->d, P->inv_freq, P->half, J->pos[i / P->H], P->inverse);
}

int ds_cpu_rope_op(const ds_backend *be, const ds_rope_params *p, ds_err *err) {
    (void)err;
    rope_job J = {p, ds_cpu_of(be)->step.tok_pos};
    ds_cpu_parallel_for(be, p->T * p->H, rope_head, &J);
    return 0;
}

int ds_cpu_embed(const ds_backend *be, const ds_embed_params *p, ds_err *err) {
    (void)err;
    const ds_step_desc *s = &ds_cpu_of(be)->step;
    int D = p->w->cols, n = p->n;
    for (int t = 0; t < s->T; t++) {
        float *Xt = p->X + (size_t)t * n * D;
        ds_weight_row_f32(p->w, s->tok_id[t], Xt);
        for (int i = 1; i < n; i++) memcpy(Xt + (size_t)i * D, Xt, (size_t)D * sizeof *Xt);
    }
    return 0;
}

int ds_cpu_gather(const ds_backend *be, const ds_gather_params *p, ds_err *err) {
    (void)be, (void)err;
    for (int j = 0; j < p->n; j++)
        memcpy(p->dst + (size_t)j * p->width, p->src + (size_t)p->rows[j] * p->width, (size_t)p->width * sizeof(float));
    return 0;
}
