/* step.h — one forward step over a batch: the tokens of several sequences,
 * each continuing from its own position. Internal to src/model. */
#ifndef DS_STEP_H
#define DS_STEP_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "model/forward.h"
#include "model/state.h"

typedef struct ds_step {
    const ds_model *m;
    const ds_backend *be;
    const ds_observer *obs; /* may be NULL */
    int T;            /* tokens in the step (rows of every activation) */
    int n_seqs;
    ds_seq **seqs;    /* [n_seqs] */
    int *seq_row0;    /* [n_seqs] first row of each sequence */
    int *seq_n;       /* [n_seqs] rows of each sequence */
    int *tok_seq;     /* [T] */
    int64_t *tok_pos; /* [T] absolute position */
    int32_t *tok_id;  /* [T] */
} ds_step;

/* The attention sublayer of layer li (doc §3.2-3.4) on normed inputs xn
 * [T][D]; writes out [T][D] and advances the layer's state. */
int ds_attention(const ds_step *S, int li, const float *xn, float *out, ds_err *err);

/* Projects xn through a compressor's wkv / wgate and feeds the step's tokens
 * of every sequence, in position order, into its state (which = 0: the
 * attention compressor, 1: the indexer's). */
int ds_compress_tokens(const ds_step *S, int li, const ds_compressor_w *w, int which, const float *xn, ds_err *err);

/* RoPE on every head of x [T][H][d] at the rows' positions (inverse: the
 * conjugate rotation), after an unweighted RMSNorm per head when norm = 1. */
void ds_heads_rope(const ds_backend *be, float *x, int T, int H, int d, int norm, const float *inv, int half,
                   const int64_t *pos, int inverse, float eps);

/* Lightning indexer (doc §3.4): feeds the indexer compressor with the step's
 * tokens, then for every row picks the top-k visible compressed entries.
 * sel: [T][index_topk] entry ids ascending, n_sel [T]. */
int ds_indexer_select(const ds_step *S, int li, const float *xn, const float *qr, int *sel, int *n_sel,
                      ds_err *err);

/* The MoE sublayer (doc §3.5) on normed inputs xn [T][D]; out [T][D]. */
int ds_moe(const ds_step *S, int li, const float *xn, float *out, ds_err *err);

#endif
