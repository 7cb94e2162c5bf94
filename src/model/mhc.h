/* mhc.h — manifold-constrained hyper-connections (paper §2.2, doc §3.1):
 * n residual streams, mixed into a sublayer input (pre), expanded back
 * (post) and mixed among themselves by a Sinkhorn-projected doubly
 * stochastic matrix (comb); and the final collapse before the head. */
#ifndef DS_MHC_H
#define DS_MHC_H

#include "backend/backend.h"
#include "model/model.h"

/* X: [T][n][D]. Writes x_in [T][D], post [T][n], comb [T][n][n].
 * scratch: T * (n*D + (2+n)*n) floats. -1 if the backend ran out of memory. */
int ds_mhc_pre(const ds_backend *be, const ds_config *c, const ds_hc_w *w, const float *X, int T, float *x_in,
               float *post, float *comb, float *scratch);
/* Xout[t][j] = post_j * y[t] + sum_i comb[i][j] * X[t][i]. */
void ds_mhc_post(const ds_backend *be, const ds_config *c, const float *X, const float *y, const float *post,
                 const float *comb, int T, float *Xout);
/* x[t] = sum_i (sigmoid(m_i * scale + base_i) + eps) X[t][i]. scratch and
 * the result as for pre. */
int ds_mhc_head(const ds_backend *be, const ds_config *c, const ds_hc_w *w, const float *X, int T, float *x,
                float *scratch);

#endif
