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
} ds_batch_item;

/* Optional observer of a step's decisions (for statistics; never changes
 * results). route: the k experts chosen for token `tok` of batch item `item`
 * at MoE layer `layer` (ascending ids for routed layers, table order for hash
 * layers). Called on the calling thread, one token at a time, in row order,
 * so a callback needs no locking. */
#define DS_HAVE_ROUTE_HOOK 1
typedef struct ds_observer {
    void (*route)(void *ctx, int layer, int item, int tok, const int *experts, int k);
    void *ctx;
} ds_observer;

/* Advances every item's sequence by its tokens in one step: all tokens of
 * all items go through each layer together (weights are read once per step).
 * A token's logits do not depend on the other items, on how its sequence
 * was split into steps or on the thread count — bit for bit.
 * On error the sequences of the batch are left mid-step: reset them. */
int ds_forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items, ds_err *err);
/* The same, reporting decisions to obs (may be NULL). */
int ds_forward_observed(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                        const ds_observer *obs, ds_err *err);

#endif
