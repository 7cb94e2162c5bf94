/* mhc.c — see mhc.h. */
#include "model/mhc.h"

#include <math.h>
#include <string.h>

#include "model/norm.h"

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* f = X / rms(X) over all n*D values, then mixes = fn @ f for every token. */
static int mixes(const ds_backend *be, const ds_config *c, const ds_hc_w *w, const float *X, int T, float *f,
                 float *m) {
    int nd = c->hc_mult * c->dim;
    ds_rmsnorm_rows(be, f, X, NULL, T, nd, c->rms_eps);
    return be->matmul(be, &w->fn, f, T, m);
}

typedef struct {
    const ds_config *c;
    const ds_hc_w *w;
    const float *X, *m;
    float *x_in, *post, *comb;
} pre_job;

static void pre_token(void *ctx, int t) {
    const pre_job *J = ctx;
    const ds_config *c = J->c;
    int n = c->hc_mult, D = c->dim, rows = (2 + n) * n;
    const float *m = J->m + (size_t)t * rows, *base = J->w->base, *sc = J->w->scale;
    const float *X = J->X + (size_t)t * n * D;
    float pre[64], *post = J->post + (size_t)t * n, *C = J->comb + (size_t)t * n * n;
    float eps = c->hc_eps;
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
    for (int it = 0; it < c->hc_sinkhorn_iters; it++) {
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
    float *x = J->x_in + (size_t)t * D;
    for (int k = 0; k < D; k++) {
        float s = pre[0] * X[k];
        for (int i = 1; i < n; i++) s += pre[i] * X[(size_t)i * D + k];
        x[k] = s;
    }
}

int ds_mhc_pre(const ds_backend *be, const ds_config *c, const ds_hc_w *w, const float *X, int T, float *x_in,
               float *post, float *comb, float *scratch) {
    int nd = c->hc_mult * c->dim;
    float *f = scratch, *m = scratch + (size_t)T * nd;
    if (mixes(be, c, w, X, T, f, m)) return -1;
    pre_job J = {c, w, X, m, x_in, post, comb};
    be->parallel_for(be, T, pre_token, &J);
    return 0;
}

typedef struct {
    const ds_config *c;
    const float *X, *y, *post, *comb;
    float *Xout;
} post_job;

static void post_token(void *ctx, int t) {
    const post_job *J = ctx;
    int n = J->c->hc_mult, D = J->c->dim;
    const float *X = J->X + (size_t)t * n * D, *y = J->y + (size_t)t * D;
    const float *post = J->post + (size_t)t * n, *C = J->comb + (size_t)t * n * n;
    float *out = J->Xout + (size_t)t * n * D;
    for (int j = 0; j < n; j++)
        for (int k = 0; k < D; k++) {
            float s = C[j] * X[k];
            for (int i = 1; i < n; i++) s += C[i * n + j] * X[(size_t)i * D + k];
            out[(size_t)j * D + k] = post[j] * y[k] + s;
        }
}

void ds_mhc_post(const ds_backend *be, const ds_config *c, const float *X, const float *y, const float *post,
                 const float *comb, int T, float *Xout) {
    post_job J = {c, X, y, post, comb, Xout};
    be->parallel_for(be, T, post_token, &J);
}

typedef struct {
    const ds_config *c;
    const ds_hc_w *w;
    const float *X, *m;
    float *x;
} head_job;

static void head_token(void *ctx, int t) {
    const head_job *J = ctx;
    const ds_config *c = J->c;
    int n = c->hc_mult, D = c->dim;
    float pre[64];
    for (int i = 0; i < n; i++) pre[i] = sigmoidf(J->m[(size_t)t * n + i] * J->w->scale[0] + J->w->base[i]) + c->hc_eps;
    const float *Xt = J->X + (size_t)t * n * D;
    for (int k = 0; k < D; k++) {
        float s = pre[0] * Xt[k];
        for (int i = 1; i < n; i++) s += pre[i] * Xt[(size_t)i * D + k];
        J->x[(size_t)t * D + k] = s;
    }
}

int ds_mhc_head(const ds_backend *be, const ds_config *c, const ds_hc_w *w, const float *X, int T, float *x,
                float *scratch) {
    int nd = c->hc_mult * c->dim;
    float *f = scratch, *m = scratch + (size_t)T * nd;
    if (mixes(be, c, w, X, T, f, m)) return -1;
    head_job J = {c, w, X, m, x};
    be->parallel_for(be, T, head_token, &J);
    return 0;
}
