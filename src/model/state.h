/* state.h — the decoding state of one sequence (doc §3.6), in the memory of
 * the backend its model is bound to: per layer the sliding-window ring of
 * K=V entries, the compressor state (entries, the unfinished window, the CSA
 * overlap) and, on CSA layers, the indexer's compressor state
 * (backend/backend.h: ds_layer_mem). One block for max_len tokens, allocated
 * up front. */
#ifndef DS_STATE_H
#define DS_STATE_H

#include <stdint.h>

#include "backend/backend.h"
#include "common/err.h"
#include "model/model.h"

typedef struct ds_seq {
    int64_t pos;            /* tokens consumed so far */
    int64_t max_len;        /* capacity */
    int n_layers;
    ds_layer_mem *layers;   /* host array [n_layers]; pointers into mem */
    const ds_backend *be;
    void *mem;              /* the backend block holding every layer's state */
    struct ds_ep *ep;       /* expert parallelism: the model's, or NULL */
    int ep_id;              /* the leader's name for it on every rank */
    int ep_home;            /* data-parallel attention: the rank holding its state and running its
                               attention (no state on the others); -1: every rank */
} ds_seq;

/* A sequence of capacity max_len for m (which must be bound). */
int ds_seq_new(const ds_model *m, int64_t max_len, ds_seq **out, ds_err *err);
void ds_seq_free(ds_seq *s);
/* A follower's copy of the leader's sequence `id` with home rank `home`
 * (ep/follow.h): its state only when home is this rank or -1. */
int ds_seq_new_follower(const ds_model *m, int64_t max_len, int id, int home, ds_seq **out, ds_err *err);
void ds_seq_reset(ds_seq *s);
/* Bytes of backend state one sequence of max_len holds. */
uint64_t ds_seq_bytes(const ds_model *m, int64_t max_len);
/* The longest capacity, at most max_position_embeddings, for which n
 * sequences' state fits in `bytes`; 0 if not even one token's does. */
int64_t ds_seq_fit(const ds_model *m, uint64_t bytes, int n);

/* What a step overwrites in place of a sequence's state: per layer the
 * window ring and the compressors' unfinished window and overlap rows
 * (O(window + ratio) rows a layer; the compressed entries are appended at
 * indices derived from the position, so they need no copy). Restoring it and
 * the position gives the state as it was at the snapshot, bit for bit,
 * whatever steps ran in between (ds_seq_rewind). */
typedef struct ds_seq_snap {
    void *mem;     /* backend memory */
    size_t bytes;
    int64_t pos;
} ds_seq_snap;
/* m: the model s was created for (a model's mtp_model for the MTP block's
 * sequences). Not under expert parallelism. */
int ds_seq_snapshot(const ds_model *m, const ds_seq *s, ds_seq_snap *snap, ds_err *err);
/* Puts the snapshot back and sets s->pos = snap->pos: the tokens fed since
 * are forgotten (feed the ones to keep again: chunking does not change bits). */
int ds_seq_rewind(const ds_model *m, ds_seq *s, const ds_seq_snap *snap, ds_err *err);
void ds_seq_snap_free(const ds_seq *s, ds_seq_snap *snap);

#endif
