/* step.h — one forward step over a batch: the tokens of several sequences,
 * each continuing from its own position. Internal to src/model: the paper's
 * sections as calls of backend ops on the step's buffers (runstate.h). */
#ifndef DS_STEP_H
#define DS_STEP_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/runstate.h"
#include "model/state.h"

/* Data-parallel attention (docs/ep.md): each rank runs the rows of its own
 * sequences; the MoE works on the rows of every rank, rank 0's first. */
typedef struct ds_step_dp {
    int Tg;                /* the step's rows on every rank */
    int off;               /* this rank's first row among them */
    const int *owner;      /* [Tg] each row's rank, then [Rg] each head row's */
    const int *item, *tok; /* [Tg] each row's batch item and token in it (the route hook) */
} ds_step_dp;

typedef struct ds_step {
    const ds_model *m;
    const ds_backend *be;
    const ds_observer *obs; /* may be NULL */
    ds_runstate *rs;        /* the step's buffers */
    int T;                  /* tokens of the step on this rank (rows of every activation; 0 possible under dp) */
    int n_seqs;
    const ds_step_dp *dp;   /* NULL unless attention is data parallel */
} ds_step;

/* Hands a named intermediate [rows][cols] (backend memory) to the
 * observer's tensor hook, if any. */
int ds_step_dump(const ds_step *S, const char *name, int layer, const float *x, int rows, int cols, ds_err *err);

/* mHC (paper §2.2): the sublayer input of site w from the streams X. */
int ds_mhc_pre(const ds_step *S, const ds_hc_w *w, const float *X, float *x_in, ds_err *err);
/* Xout = post * y + comb^T X (the streams after a sublayer). */
int ds_mhc_post(const ds_step *S, const float *X, const float *y, float *Xout, ds_err *err);
/* The final collapse of R rows of streams into x[R][D]. */
int ds_mhc_head(const ds_step *S, const float *X, int R, float *x, ds_err *err);

/* The attention sublayer of layer li (paper §2.3) on the normed inputs xn
 * [T][D]; writes out [T][D] and advances the layer's state. */
int ds_attention(const ds_step *S, int li, const float *xn, float *out, ds_err *err);

/* A compressor (paper §2.3): projects xn through wkv / wgate and feeds the
 * step's rows into each sequence's state (which = 0: the attention
 * compressor, 1: the indexer's). */
int ds_compress_tokens(const ds_step *S, int li, const ds_compressor_w *w, int which, const float *xn, ds_err *err);

/* Lightning indexer (paper §2.3.1): picks for every row the top-k visible
 * compressed entries into rs->sel, rs->n_sel, once the indexer's compressor
 * (ds_compress_tokens, which = 1) has taken the step's rows. qr: the q
 * residual [T][q_lora]. */
int ds_indexer_select(const ds_step *S, int li, const float *xn, const float *qr, ds_err *err);
/* The observer's index hook (S->obs->index, not under data-parallel
 * attention): rs->sel of layer li downloaded, one token at a time in row
 * order; after the lanes' join. */
int ds_indexer_observe(const ds_step *S, int li, ds_err *err);

/* The MoE sublayer (paper §2.1) on the normed inputs xn [T][D]; out [T][D].
 * Under data-parallel attention xn is this rank's rows of rs->g_xn. */
int ds_moe(const ds_step *S, int li, const float *xn, float *out, ds_err *err);
/* After the step's layers: the observer's route hook over every layer's
 * routes (rs->idx), layer by layer, tokens in row order. Not under
 * data-parallel attention (expert parallelism reports each layer's routes
 * as it exchanges them). */
int ds_moe_observe(const ds_step *S, ds_err *err);

/* Expert parallelism: nb buffers of n rows of backend memory (buffer b's
 * rows of widths[b] 32-bit words), row i of each filled by rank owner[i]; on
 * return every rank has every row (the bytes, copied) — or, with dest, the
 * rows i with dest[i] = this rank. The buffers share one exchange over NCCL
 * (one group); through MPI they go one after the other. */
int ds_step_exchange(const ds_step *S, int nb, float *const *bufs, const int *widths, int n, const int *owner,
                     const int *dest, ds_err *err);

#endif
