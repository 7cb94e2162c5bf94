/* norm.h — RMSNorm in fp32 (doc §3.1): out = w * x / sqrt(mean(x^2) + eps);
 * w = NULL is the unweighted form. The sum of squares uses the fixed-order
 * dot product, so the result never depends on the batch. */
#ifndef DS_NORM_H
#define DS_NORM_H

void ds_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

struct ds_backend;
/* The same for T rows of n (rows in parallel on the backend's threads). */
void ds_rmsnorm_rows(const struct ds_backend *be, float *out, const float *x, const float *w, int T, int n, float eps);

#endif
