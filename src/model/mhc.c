/* mhc.c — manifold-constrained hyper-connections (paper §2.2, doc §3.1): n
 * residual streams mixed into a sublayer input (pre), expanded back (post)
 * and mixed among themselves by a Sinkhorn-projected doubly stochastic
 * matrix (comb); and the final collapse before the head. The arithmetic is
 * the backend's (ds_hc_*_params in backend.h). */
#include "model/step.h"

static ds_hc_params site(const ds_step *S, const ds_hc_w *w) {
    const ds_config *c = &S->m->cfg;
    return (ds_hc_params){&w->fn, w->base, w->scale, c->hc_mult, c->dim, c->hc_sinkhorn_iters, c->rms_eps, c->hc_eps};
}

int ds_mhc_pre(const ds_step *S, const ds_hc_w *w, const float *X, float *x_in, ds_err *err) {
    ds_hc_pre_params p = {site(S, w), X, S->T, x_in, S->rs->post, S->rs->comb};
    return S->be->hc_pre(S->be, &p, err);
}

int ds_mhc_post(const ds_step *S, const float *X, const float *y, float *Xout, ds_err *err) {
    const ds_config *c = &S->m->cfg;
    ds_hc_post_params p = {c->hc_mult, c->dim, S->T, X, y, S->rs->post, S->rs->comb, Xout};
    return S->be->hc_post(S->be, &p, err);
}

int ds_mhc_head(const ds_step *S, const float *X, int R, float *x, ds_err *err) {
    ds_hc_head_params p = {site(S, &S->m->hc_head), X, R, x};
    return S->be->hc_head(S->be, &p, err);
}
