/* compressor.c — token compression into KV entries (paper §2.3; doc 3.3,
 * 3.4): the projections of the step's rows through wkv / wgate, then the
 * backend's compressor (ds_compress_params: HCA windows, CSA overlap, the
 * softmax pooling, RMSNorm and RoPE at the window's first position). */
#include "model/step.h"

int ds_compress_tokens(const ds_step *S, int li, const ds_compressor_w *w, int which, const float *xn, ds_err *err) {
    const ds_model *m = S->m;
    ds_runstate *rs = S->rs;
    ds_matmul_job j[2] = {{&w->wkv, xn, S->T, rs->ckv}, {&w->wgate, xn, S->T, rs->cgate}};
    ds_compress_params p = {li,     which,   w->ratio,           w->d,           w->overlap,       w->ape,
                            w->norm, rs->ckv, rs->cgate, m->inv_freq_compress, m->cfg.rope_dim / 2, m->cfg.rms_eps};
    return S->be->matmul_many(S->be, j, 2, err) || S->be->compress(S->be, &p, err) ? -1 : 0;
}
