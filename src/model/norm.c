#include "model/norm.h"

#include <math.h>

#include "backend/backend.h"

void ds_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ms = ds_dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) out[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

typedef struct {
    float *out;
    const float *x, *w;
    int n;
    float eps;
} rows_job;

static void norm_row(void *ctx, int t) {
    const rows_job *J = ctx;
    ds_rmsnorm(J->out + (size_t)t * J->n, J->x + (size_t)t * J->n, J->w, J->n, J->eps);
}

void ds_rmsnorm_rows(const ds_backend *be, float *out, const float *x, const float *w, int T, int n, float eps) {
    rows_job J = {out, x, w, n, eps};
    be->parallel_for(be, T, norm_row, &J);
}
