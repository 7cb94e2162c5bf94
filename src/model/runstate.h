/* runstate.h — the activations of one step (llama2.c's RunState): one arena
 * in backend memory holding every buffer a step of T tokens needs, carved
 * the same way each step, allocated when a step is larger than any before
 * (never per layer). The host side holds the step's token table. Owned by
 * the model bound to a backend; a model runs one step at a time. */
#ifndef DS_RUNSTATE_H
#define DS_RUNSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "format/config.h"

typedef struct ds_runstate {
    const ds_backend *be;
    void *arena;   /* backend memory */
    size_t cap;
    int T, R;      /* the step the buffers below are carved for */
    /* streams and sublayer buffers, [T][...] unless noted */
    float *X, *X2;          /* [T][n][D] residual streams (X2: the next ones; the head's gathered rows) */
    float *x_in, *xn, *y;   /* [T][D] sublayer input, its norm, sublayer output */
    float *post, *comb;     /* [T][n], [T][n][n] */
    float *qr, *q, *kv, *o; /* [T][q_lora], [T][H][d], [T][d], [T][H][d] */
    float *oa;              /* [T][o_groups * o_lora] */
    float *ckv, *cgate;     /* [T][c * d] compressor projections (attention's or the indexer's) */
    float *iq, *iw;         /* [T][index_heads][index_dim], [T][index_heads] */
    int *sel, *n_sel;       /* [T][index_topk], [T] */
    float *logits, *wts;    /* [T][E], [T][k] */
    int32_t *idx;           /* [L][T][k] every layer's routes (kept for the observer, read once after the step) */
    float *hlog;            /* [Rh][vocab] the rows whose head runs here */
    /* expert parallelism only (ep set before the first reserve); Tg = the
     * step's rows on every rank (= T unless attention is data parallel) */
    int ep, Tg, Rg;
    float *slot_out;        /* [Tg][k][D] every (token, slot) pair's expert output */
    float *shared_out;      /* [T][D] */
    float *g_xn, *g_wts;    /* data parallel: [Tg][D] the MoE's inputs, [Tg][k] */
    int32_t *g_idx;         /* data parallel: [Tg][k] */
    float *g_head;          /* data parallel: [Rg][D] the head's normed rows of every rank */
    float *ep_rows;         /* host [Tg][k][D] (at least [Tg][D], [Rg][D]): rows for the exchange */
    size_t ep_rows_cap;
    int *g_owner, *g_item, *g_tok; /* data parallel, host: [Tg + Rg] each row's rank; [Tg] item, token */
    int *g_dest;                   /* data parallel, host: [Tg][k] the rank each pair's row goes to */
    /* host memory: the step's token table (see ds_step_desc) */
    void *host;
    size_t host_cap;
    int32_t *tok_id, *idx_host; /* idx_host: [L][Tg][k] (expert parallelism uses [Tg][k] a layer) */
    int64_t *tok_pos, *seq_pos0;
    int *tok_seq, *seq_row0, *seq_n, *hrow;
    int *loc;               /* [n_seqs] the batch items this rank runs (all unless data parallel) */
    const struct ds_layer_mem **seq_mem;
} ds_runstate;

/* The sizes of a step on this rank: T tokens, R logit rows, n_seqs
 * sequences; under expert parallelism Tg tokens and Rg logit rows on every
 * rank together (data-parallel attention; else Tg = T, Rg = 0), and Rh rows
 * whose head runs here. */
typedef struct ds_step_size {
    int T, R, n_seqs, Tg, Rg, Rh;
} ds_step_size;

/* Carves the buffers for a step of these sizes, growing the arena (or the
 * host table) only when this step is larger than every earlier one. */
int ds_runstate_reserve(ds_runstate *rs, const ds_config *c, const ds_step_size *z, ds_err *err);
void ds_runstate_free(ds_runstate *rs);
/* The arena's bytes for a step of T tokens with a head row each (no
 * expert parallelism). */
uint64_t ds_runstate_bytes(const ds_config *c, int T);

#endif
