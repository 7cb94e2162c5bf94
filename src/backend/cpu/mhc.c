/* mhc.c — manifold-constrained hyper-connections on the CPU (paper §2.2,
 * doc §3.1): the mixes of one site (a product on the RMS-normed streams),
 * then per token the pre / post weights and the Sinkhorn-projected comb. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* m = fn @ (X / rms(X)) over all n*D values of each token; m is scratch. */
static float *mixes(const ds_backend *be, const ds_hc_params *hc, const float *X, int T, ds_err *err) {
    int nd = hc->n * hc->D;
    float *f = ds_cpu_scratch(be, DS_SCR_HC, sizeof(float) * (size_t)T * ((size_t)nd + (size_t)hc->fn->rows));
    if (!f) {
        ds_fail(err, "cpu mHC: out of memory for %d tokens", T);
        return NULL;
    }
    float *m = f + (size_t)T * nd;
    ds_rmsnorm_params np = {X, NULL, f, T, nd, hc->rms_eps, NULL, 0};
    ds_cpu_rmsnorm_op(be, &np, 1, err);
    return ds_matmul(be, hc->fn, f, T, m, err) ? NULL : m;
}

typedef struct {
    const ds_hc_pre_params *p;
    const float *m;
} pre_job;

static void pre_token(void *ctx, int t) {
    const pre_job *J = ctx;
    const ds_hc_pre_params *P = J->p;
    const ds_hc_params *hc = &P->hc;
    int n = hc->n, D = hc->D, rows = (2 + n) * n;
    const float *m = J->m + (size_t)t * rows, *base = hc->base, *sc = hc->scale;
    const float *X = P->X + (size_t)t * n * D;
    float pre[64], *post = P->post + (size_t)t * n, *C = P->comb + (size_t)t * n * n;
    float eps = hc->hc_eps;
    for (int i = 0; i < n; i++) {
        pre[i] = sigmoidf(m[i] * sc[0] + base[i]) + eps;
        post[i] = 2.0f * sigmoidf(m[n + i] * sc[1] + base[n + i]);
    }
    for (int i = 0; i < n; i++) { /* row-wise softmax, then + eps */
        float *row = C + i * n, mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < n; j++) {
            row[j] = m[2 * n + i * n + j] * sc[2] + base[2 * n + i * n + j];
            mx = fmaxf(mx, row[j]);
        }
        for (int j = 0; j < n; j++) sum += (row[j] = expf(row[j] - mx));
        for (int j = 0; j < n; j++) row[j] = row[j] / sum + eps;
    }
    for (int it = 0; it < hc->sinkhorn_iters; it++) {
        if (it > 0)
            for (int i = 0; i < n; i++) { /* rows */
                float s = 0.0f;
                for (int j = 0; j < n; j++) s += C[i * n + j];
                for (int j = 0; j < n; j++) C[i * n + j] /= s + eps;
            }
        for (int j = 0; j < n; j++) { /* columns */
            float s = 0.0f;
            for (int i = 0; i < n; i++) s += C[i * n + j];
            for (int i = 0; i < n; i++) C[i * n + j] /= s + eps;
        }
    }
    float *x = P->x_in + (size_t)t * D;
    for (int k = 0; k < D; k++) {
        float s = pre[0] * X[k];
        for (int i = 1; i < n; i++) s += pre[i] * X[(size_t)i * D + k];
        x[k] = s;
    }
}

int ds_cpu_hc_pre(const ds_backend *be, const ds_hc_pre_params *p, ds_err *err) {
    const float *m = mixes(be, &p->hc, p->X, p->T, err);
    if (!m) return -1;
    pre_job J = {p, m};
    ds_cpu_parallel_for(be, p->T, pre_token, &J);
    return 0;
}

static void post_token(void *ctx, int t) {
    const ds_hc_post_params *P = ctx;
    int n = P->n, D = P->D;
    const float *X = P->X + (size_t)t * n * D, *y = P->y + (size_t)t * D;
    const float *post = P->post + (size_t)t * n, *C = P->comb + (size_t)t * n * n;
    float *out = P->Xout + (size_t)t * n * D;
    for (int j = 0; j < n; j++)
        for (int k = 0; k < D; k++) {
            float s = C[j] * X[k];
            for (int i = 1; i < n; i++) s += C[i * n + j] * X[(size_t)i * D + k];
            out[(size_t)j * D + k] = post[j] * y[k] + s;
        }
}

int ds_cpu_hc_post(const ds_backend *be, const ds_hc_post_params *p, ds_err *err) {
    (void)err;
    ds_cpu_parallel_for(be, p->T, post_token, (void *)p);
    return 0;
}

typedef struct {
    const ds_hc_head_params *p;
    const float *m;
} head_job;

static void head_token(void *ctx, int t) {
    const head_job *J = ctx;
    const ds_hc_head_params *P = J->p;
    const ds_hc_params *hc = &P->hc;
    int n = hc->n, D = hc->D;
    float pre[64];
    for (int i = 0; i < n; i++) pre[i] = sigmoidf(J->m[(size_t)t * n + i] * hc->scale[0] + hc->base[i]) + hc->hc_eps;
    const float *Xt = P->X + (size_t)t * n * D;
    for (int k = 0; k < D; k++) {
        float s = pre[0] * Xt[k];
        for (int i = 1; i < n; i++) s += pre[i] * Xt[(size_t)i * D + k];
        P->x[(size_t)t * D + k] = s;
    }
}

int ds_cpu_hc_head(const ds_backend *be, const ds_hc_head_params *p, ds_err *err) {
    const float *m = mixes(be, &p->hc, p->X, p->R, err);
    if (!m) return -1;
    head_job J = {p, m};
    ds_cpu_parallel_for(be, p->R, head_token, &J);
    return 0;
}
