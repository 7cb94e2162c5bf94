/* state.h — the decoding state of one sequence (doc §3.6): per layer the
 * sliding-window ring of K=V entries, the compressor state (entries, pending
 * rows, CSA overlap) and, on CSA layers, the indexer's compressor state.
 * Everything is allocated up front for max_len tokens. */
#ifndef DS_STATE_H
#define DS_STATE_H

#include <stdint.h>

#include "common/err.h"
#include "model/compressor.h"
#include "model/model.h"

typedef struct ds_layer_state {
    float *ring; /* [window][head_dim], position p at p % window */
    ds_comp_state comp, icomp;
} ds_layer_state;

typedef struct ds_seq {
    int64_t pos;     /* tokens consumed so far */
    int64_t max_len; /* capacity */
    int n_layers;
    ds_layer_state *layers;
} ds_seq;

int ds_seq_new(const ds_model *m, int64_t max_len, ds_seq **out, ds_err *err);
void ds_seq_free(ds_seq *s);
void ds_seq_reset(ds_seq *s);
/* Bytes of state one sequence of max_len holds. */
uint64_t ds_seq_bytes(const ds_model *m, int64_t max_len);

#endif
