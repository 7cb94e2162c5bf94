/* model.h — a DeepSeek-V4 model: config + the checkpoint's tensors, checked
 * for presence, dtype and shape at load, kept in their storage formats. */
#ifndef DS_MODEL_H
#define DS_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "model/runstate.h"
#include "model/weights.h"

/* A token compressor (paper §2.3): projections to c*d (c = 2 with the CSA
 * overlap, 1 for HCA), the per-slot position bias `ape` and the RMSNorm. */
typedef struct ds_compressor_w {
    int ratio, d, overlap;
    ds_weight wkv, wgate; /* [c*d, D] */
    float *ape;           /* [ratio, c*d] */
    float *norm;          /* [d] */
} ds_compressor_w;

/* Lightning indexer (paper §2.3.1), CSA layers only. */
typedef struct ds_indexer_w {
    ds_weight wq_b;         /* [index_heads * index_head_dim, q_lora] */
    ds_weight weights_proj; /* [index_heads, D] */
    ds_compressor_w comp;   /* at index_head_dim, with overlap */
} ds_indexer_w;

typedef struct ds_hc_w {
    ds_weight fn;  /* [(2+n)n, nD] */
    float *base;   /* [(2+n)n] */
    float *scale;  /* [3] */
} ds_hc_w;

typedef struct ds_layer {
    int ratio;   /* 0 sliding only, CSA ratio (indexer), or HCA ratio */
    int is_csa;  /* has an indexer and overlapping windows */
    int is_hash; /* routes by tid2eid */
    float *attn_norm, *ffn_norm;
    ds_hc_w hc_attn, hc_ffn;
    ds_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;
    ds_compressor_w comp;
    ds_indexer_w idx;
    ds_weight gate;      /* [E, D] */
    float *gate_bias;    /* [E] (routed layers) */
    int32_t *tid2eid;    /* [vocab, k] (hash layers) */
    ds_weight *w1, *w2, *w3; /* E routed experts each */
    ds_weight sw1, sw2, sw3; /* shared expert */
} ds_layer;

/* The multi-token-prediction block (doc §3.7): the next token's embedding
 * and the main model's last streams, each RMS-normed (enorm, hnorm) and
 * projected (e_proj, h_proj: [D, D]), summed into n streams, one V4 layer
 * (its own mHC sites), then its own hc head and final norm before the
 * model's head. */
typedef struct ds_mtp {
    float *enorm, *hnorm, *norm; /* [D] */
    ds_weight e_proj, h_proj;    /* [D, D] */
    ds_hc_w hc_head;             /* fn [n, nD], base [n], scale [1] */
    ds_layer layer;              /* tensors mtp.0.*, config entry n_layers */
} ds_mtp;

typedef struct ds_model {
    ds_config cfg;
    ds_checkpoint *ck;
    char path[1024];
    ds_weight embed, head; /* [vocab, D] */
    float *norm;           /* [D] */
    ds_hc_w hc_head;       /* fn [n, nD], base [n], scale [1] */
    ds_layer *layers;
    ds_mtp *mtp;              /* NULL: the checkpoint has no (complete) MTP block */
    int bind_mtp;             /* set before ds_model_bind: 1 binds the block too (mtp_model), 0 (the
                                 default) leaves its weights out of the backend's memory */
    char mtp_off[700];        /* why mtp is NULL */
    float *inv_freq_main;     /* [rope_dim/2], rope_theta */
    float *inv_freq_compress; /* [rope_dim/2], compress_rope_theta (+ YaRN) */
    uint64_t weight_bytes;    /* every tensor the model reads */
    int n_tensors_used;
    /* after ds_model_bind: every weight and constant above points into this
     * backend's memory, and the model owns its step arena */
    const ds_backend *be;
    ds_runstate *rs;
    /* the MTP block as a model of one layer (bound with m when bind_mtp, none
     * under expert parallelism): its layer, hc head and final norm, m's embedding, head
     * and arena; NULL without a block. A ds_forward of it takes each item's
     * h_in (the main model's last streams) with the next tokens (doc §3.7). */
    struct ds_model *mtp_model;
    const struct ds_model *mtp_of; /* in mtp_model: the model it drafts for */
    const void **host_ptrs;   /* the loader's pointers, restored before freeing */
    int n_host_ptrs;
    /* expert parallelism (ep/ep.h), set before ds_model_bind; NULL: one
     * process. Not owned. Only the routed experts this rank serves are bound
     * (and ever read). */
    struct ds_ep *ep;
    /* the routed experts in tiers (model/store.h: ds_store_new, before
     * ds_model_bind), owned; NULL: every expert bound to the backend */
    struct ds_store *store;
    /* the most tokens one step runs: a ds_forward call with more is run as
     * several steps of at most this many (chunking is bitwise invariant, so
     * the results are the one-step results); 0: DS_STEP_TOKENS */
    int step_tokens;
} ds_model;
#define DS_STEP_TOKENS 4096 /* tokens x experts per token inside the CUDA grids (65,535) */

/* Opens DIR (config.json + safetensors), validates every tensor the model
 * needs (missing, dtype, shape, scale grid) with the tensor's name in the
 * error. The MTP block (mtp.0.*) is loaded when all its tensors are there
 * (m->mtp), else left out (m->mtp_off says why; other mtp.* tensors are
 * ignored); any other tensor the model does not read is an error naming it
 * (a config that does not match the checkpoint). */
int ds_model_load(const char *dir, ds_model **out, ds_err *err);
void ds_model_free(ds_model *m);
/* How the weights reach memory. MMAP: used in place in the mapped files
 * (ds_model_load). COPY: copied into anonymous huge-page memory first
 * (ds_checkpoint_copy_in: an error naming the file when they and
 * DS_LOAD_RESERVE do not fit MemAvailable). AUTO: COPY when they fit, else
 * MMAP. The bits of every result are the same in every mode. */
enum { DS_LOAD_MMAP = 0, DS_LOAD_COPY = 1, DS_LOAD_AUTO = 2 };
#define DS_LOAD_RESERVE ((uint64_t)1 << 30) /* bytes a copy-in leaves free for activations and state */
typedef struct ds_load_opts {
    int mode;                  /* DS_LOAD_* */
    ds_copy_progress progress; /* of a copy (fn may be NULL) */
} ds_load_opts;
/* ds_model_load with a load mode (lo NULL: MMAP). */
int ds_model_load_with(const char *dir, const ds_load_opts *lo, ds_model **out, ds_err *err);

/* Uploads every weight and constant of m to be (the CPU backend uses them
 * in place) and gives the model its step arena. A model is bound once; it
 * then runs on be only, one step at a time. */
int ds_model_bind(ds_model *m, const ds_backend *be, ds_err *err);
/* Releases the backend's copies and the step arena; the model is unbound
 * (ds_model_free does this first). */
void ds_model_unbind(ds_model *m);

/* Runs m over the ranks of ep (ep/ep.h): call before ds_model_bind. The
 * backend must have the moe_experts / moe_combine ops. */
void ds_model_set_ep(ds_model *m, struct ds_ep *ep);
/* Bytes of the routed experts `rank` serves (all of them without EP), and
 * of everything else (replicated on every rank). */
void ds_model_expert_bytes(const ds_model *m, int rank, uint64_t *experts, uint64_t *rest);
/* Bytes of the backend's packed copies of the bound weights (ds_weight.packed). */
uint64_t ds_model_packed_bytes(const ds_model *m);

/* Bytes of weights read to decode one token (attention, shared expert, k
 * routed experts per layer, head, one embedding row) — the decode floor. */
uint64_t ds_model_decode_bytes(const ds_model *m);

#endif
