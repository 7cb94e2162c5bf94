/* forward.h — the DeepSeek-V4 forward pass over a batch of sequences. */
#ifndef DS_FORWARD_H
#define DS_FORWARD_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "model/state.h"

typedef struct ds_batch_item {
    ds_seq *seq;
    const int32_t *tokens; /* n_tokens ids continuing the sequence */
    int n_tokens;
    float *logits;         /* NULL, or [rows][vocab] */
    int all_logits;        /* 1: one row per token; 0: one row, the last token */
    float *hidden;         /* NULL, or [n_tokens][hc_mult * dim]: every token's streams after the last
                              layer, before the hc head (what the MTP block reads); not under expert
                              parallelism */
    const float *h_in;     /* with m->mtp_model only, required: [n_tokens][hc_mult * dim] the main
                              model's `hidden` of the tokens before these (doc §3.7) */
} ds_batch_item;

/* Optional observer of a step's decisions and intermediates (for statistics
 * and debugging; never changes results). Hooks are called on the calling
 * thread, so a callback needs no locking; either may be NULL.
 * route: the k experts chosen for token `tok` of batch item `item` at MoE
 *   layer `layer` (ascending ids for routed layers, table order for hash
 *   layers), one token at a time, in row order, layer after layer once the
 *   step's layers have run (one read of every layer's routes: a device
 *   step is not stopped at each MoE layer); under expert parallelism with
 *   data-parallel attention at each MoE layer, rank 0's rows first, then
 *   rank 1's, ...
 * tensor: a named intermediate of the step, rows = the step's tokens in
 *   batch order (the head's: one row per logits row), copied to host memory
 *   (valid during the call). layer = -1 outside the layers. Names, in order:
 *   "embed" [T][n*D]; per layer "attn_in", "attn_norm" [T][D], "q" [T][H*d],
 *   "kv" [T][d], "attn_o" [T][H*d] (after the inverse RoPE), "attn_out" [T][D],
 *   "attn_res" [T][n*D], "ffn_in", "ffn_norm", "ffn_out" [T][D], "ffn_res"
 *   [T][n*D]; then "head_in", "final_norm" [R][D], "logits" [R][vocab]. */
#define DS_HAVE_ROUTE_HOOK 1
typedef struct ds_observer {
    void (*route)(void *ctx, int layer, int item, int tok, const int *experts, int k);
    void (*tensor)(void *ctx, const char *name, int layer, const float *x, int rows, int cols);
    void *ctx;
    /* a CSA layer's indexer picks of one token, ascending (a download per layer:
     * for tests and tools, not for serving) */
    void (*index)(void *ctx, int layer, int item, int tok, const int *entries, int n);
} ds_observer;

/* Advances every item's sequence by its tokens in one step (m must be bound
 * to be, or be must be a wrapper of the backend m is bound to): all tokens of
 * all items go through each layer together (weights are read once per step).
 * A token's logits do not depend on the other items, on how its sequence
 * was split into steps or on the thread count — bit for bit.
 * On error the sequences of the batch are left mid-step: reset them. */
int ds_forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items, ds_err *err);
/* The same, reporting decisions to obs (may be NULL). */
int ds_forward_observed(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                        const ds_observer *obs, ds_err *err);
/* A follower's step under expert parallelism (ep/follow.h): the
 * leader's items, without logits buffers; want[i] = the leader's
 * DS_EP_ITEM_* flags of item i (ep/ep.h), whose head rows this rank
 * computes when attention is data parallel. */
int ds_forward_follow(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                      const unsigned char *want, ds_err *err);

#endif
