#include "model/norm.h"

#include <math.h>

#include "backend/backend.h"

void ds_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ms = ds_dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) out[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}
