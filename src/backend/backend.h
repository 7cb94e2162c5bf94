/* backend.h — the compute interface the model talks to (docs/backend.md).
 *
 * The model says *what* to compute, one op per paper section; a backend
 * decides *how*, in its own memory. Every op is invariant by construction
 * (docs/design.md §1): each output element comes from a reduction
 * whose order is fixed by the model's shapes only — never by the number of
 * tokens, their batch positions, the thread count or the device.
 *
 * Memory. Every pointer an op takes or writes (float *, int32_t *, ...) is
 * backend memory: from be->alloc, be->map_weights, or a view into either.
 * The model never reads or writes through these pointers; it moves bytes in
 * and out with be->upload / be->download. Three uses:
 *   weights  uploaded once per model (map_weights: the CPU backend uses the
 *            mmap'd checkpoint in place; a GPU backend copies it once);
 *   state    per sequence: the window ring and the compressor / indexer
 *            state of every layer (ds_layer_mem), allocated with the sequence;
 *   compute  one activation arena per model, sized for the largest step
 *            (model/runstate.h); backends keep their own scratch.
 *
 * Steps. ds_forward starts every step with be->begin_step, which hands the
 * backend the step's tokens (ids, positions, sequences) and each sequence's
 * state; ops then address tokens by row t in [0, T) and state by layer.
 *
 * Errors. Ops return 0, or -1 with a message in err naming the op and the
 * cause (allocation, launch, device fault); outputs are then undefined. */
#ifndef DS_BACKEND_H
#define DS_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/err.h"
#include "tensor/weight.h"

typedef struct ds_backend ds_backend;

/* What map_weights is given (see there). */
typedef enum { DS_MAP_BYTES = 0, DS_MAP_FP4_CODES } ds_map_what;

/* ---- per-sequence state, in backend memory --------------------------- */

/* A compressor's state (paper §2.3): the entries so far and what a window
 * needs across steps. Counts follow from positions: after p tokens a
 * compressor of ratio R holds p / R entries; the unfinished window's rows sit
 * at slot pos % R. c = 2 with the CSA overlap, else 1. */
typedef struct ds_comp_mem {
    float *entries;             /* [max_len / R + 1][d], in window order */
    float *pend_kv, *pend_gate; /* [R][c*d] rows of the unfinished window (gate + ape) */
    float *prev_kv, *prev_gate; /* [R][d] series A of the last finished window (overlap only) */
} ds_comp_mem;

typedef struct ds_layer_mem {
    float *ring;                /* [window][head_dim]: position p at p % window */
    ds_comp_mem comp;           /* layers with a compress ratio */
    ds_comp_mem icomp;          /* CSA layers: the indexer's compressor */
} ds_layer_mem;

/* ---- one step's tokens ------------------------------------------------ */

typedef struct ds_step_desc {
    int T;                      /* tokens (rows of every activation) */
    int n_seqs, n_layers;
    const int32_t *tok_id;      /* [T] */
    const int64_t *tok_pos;     /* [T] absolute positions */
    const int *tok_seq;         /* [T] sequence of each row */
    const int *seq_row0;        /* [n_seqs] first row of each sequence; its rows are consecutive */
    const int *seq_n;           /* [n_seqs] rows of each sequence */
    const int64_t *seq_pos0;    /* [n_seqs] position of its first row (earlier ones are in its state) */
    const ds_layer_mem *const *seq_mem; /* [n_seqs] -> [n_layers] */
} ds_step_desc;

/* ---- op parameters (shapes in comments; all arrays in backend memory
 *      unless marked "host") ------------------------------------------- */

/* y[t][r] = sum_k w[r][k] * x[t][k] for t < T. */
typedef struct ds_matmul_job {
    const ds_weight *w;         /* host struct; its data in backend memory */
    const float *x;             /* [T][w->cols] */
    int T;
    float *y;                   /* [T][w->rows]; must not overlap any x of the batch */
} ds_matmul_job;

/* Grouped output projection (paper §2.3.3): group g of x's columns through
 * rows [g*R/G, (g+1)*R/G) of w: y[t][g*Rg + r] = sum_k w[g*Rg + r][k] * x[t][g*K + k]
 * with Rg = w->rows / G, K = w->cols. Each output has matmul's bits. */
typedef struct ds_matmul_grouped {
    const ds_weight *w;         /* [G*Rg, K] */
    int G, T;
    const float *x;             /* [T][G*K] */
    float *y;                   /* [T][G*Rg] */
} ds_matmul_grouped;

/* out[t] = w * x[t] / sqrt(mean(x[t]^2) + eps); w = NULL: unweighted.
 * rope_inv_freq set: then out[t]'s last 2*rope_half channels get rope's
 * interleaved RoPE at row t's position (T is the step's rows; the row is one
 * head: rope with H = 1, d = n, norm = 0): the bits of rmsnorm then rope. */
typedef struct ds_rmsnorm_params {
    const float *x;             /* [T][n] */
    const float *w;             /* [n] or NULL */
    float *out;                 /* [T][n], may be x */
    int T, n;
    float eps;
    const float *rope_inv_freq; /* [rope_half] or NULL */
    int rope_half;
} ds_rmsnorm_params;

/* Per head of x[t] (in place): optional unweighted RMSNorm, then interleaved
 * RoPE on the last 2*half channels at the row's position (inverse: -sin). */
typedef struct ds_rope_params {
    float *x;                   /* [T][H][d] */
    int T, H, d, half;
    const float *inv_freq;      /* [half] */
    int norm, inverse;
    float eps;
} ds_rope_params;

/* Embedding: X[t][i] = embed[tok_id[t]] for each of the n streams. */
typedef struct ds_embed_params {
    const ds_weight *w;         /* [vocab, D] */
    int n;
    float *X;                   /* [T][n][D] */
} ds_embed_params;

/* mHC weights of one site (paper §2.2). */
typedef struct ds_hc_params {
    const ds_weight *fn;        /* [(2+n)n, nD] (head: [n, nD]) */
    const float *base;          /* [(2+n)n] (head: [n]) */
    const float *scale;         /* [3] (head: [1]) */
    int n, D, sinkhorn_iters;
    float rms_eps, hc_eps;
} ds_hc_params;

/* pre: mixes m = fn @ (X / rms(X)); pre_i = sigmoid(m_i s0 + b_i) + eps,
 * post_i = 2 sigmoid(m_{n+i} s1 + b_{n+i}), comb = Sinkhorn(softmax rows of
 * m_{2n..} s2 + b) ; x_in = sum_i pre_i X_i. */
typedef struct ds_hc_pre_params {
    ds_hc_params hc;
    const float *X;             /* [T][n][D] */
    int T;
    float *x_in;                /* [T][D] */
    float *post;                /* [T][n] */
    float *comb;                /* [T][n][n] */
} ds_hc_pre_params;

/* post: Xout[t][j] = post_j * y[t] + sum_i comb[i][j] * X[t][i]. */
typedef struct ds_hc_post_params {
    int n, D, T;
    const float *X, *y, *post, *comb; /* [T][n][D], [T][D], [T][n], [T][n][n] */
    float *Xout;                /* [T][n][D] */
} ds_hc_post_params;

/* head: x[r] = sum_i (sigmoid(m_i s0 + b_i) + eps) X[r][i], m = fn @ (X / rms(X)). */
typedef struct ds_hc_head_params {
    ds_hc_params hc;
    const float *X;             /* [R][n][D] */
    int R;
    float *x;                   /* [R][D] */
} ds_hc_head_params;

/* Rows of a matrix: dst[j] = src[rows[j]]. */
typedef struct ds_gather_params {
    const float *src;           /* [*][width] */
    const int *rows;            /* host [n] */
    int n, width;
    float *dst;                 /* [n][width] */
} ds_gather_params;

/* Compressor (paper §2.3, doc §3.3): feeds the step's rows of every sequence,
 * in position order, into its state; a row closing a window (pos % R == R-1)
 * appends entry pos / R: per channel a softmax over the window's slots (the
 * previous window's series A first when overlapping) of gate + ape weighting
 * kv, then RMSNorm(norm) and RoPE at the window's first position. */
typedef struct ds_compress_params {
    int layer, which;           /* which: 0 the attention compressor, 1 the indexer's */
    int ratio, d, overlap;
    const float *ape;           /* [ratio][c*d] */
    const float *norm;          /* [d] */
    const float *kv, *gate;     /* [T][c*d] projections of the step's rows */
    const float *inv_freq;      /* [half] */
    int half;
    float eps;
} ds_compress_params;

/* Lightning indexer top-k (paper §2.3.1): for row t, the topk highest
 *   score(w) = sum_h (iw[t][h] * wscale) * ReLU(iq[t][h] . K_w) / sqrt(dh)
 * over the p/ratio + ... visible entries w < (pos+1)/ratio of the row's
 * sequence (NaN scores rank lowest; ties to the lower index), written in
 * ascending order; all visible entries when there are at most topk. */
typedef struct ds_indexer_params {
    int layer, ratio, nh, dh, topk;
    const float *iq;            /* [T][nh][dh], roped */
    const float *iw;            /* [T][nh] */
    float wscale;               /* 1/sqrt(nh) */
    int *sel;                   /* [T][topk] entry ids */
    int *n_sel;                 /* [T] */
} ds_indexer_params;

/* Sparse attention with sinks (paper §2.3, doc §3.2) over indices into the
 * sequence's pools. Row t at position p of sequence s attends, in this order,
 *   window:     positions max(0, p-W+1) .. p — rows of this step's kv for
 *               positions >= seq_pos0[s], else ring[pos % W] of its state;
 *   compressed: entries sel[t][0..n_sel[t]) (CSA), or 0 .. (p+1)/ratio - 1 (HCA).
 * K = V. Per head: softmax over [q.k * scale ..., sink_h] (the sink joins the
 * denominator only), out = sum_j p_j k_j in the order above. */
typedef struct ds_attention_params {
    int layer, T, H, d, window, ratio;
    const float *q;             /* [T][H][d] */
    const float *kv;            /* [T][d] this step's rows */
    const float *sink;          /* [H] */
    const int *sel, *n_sel;     /* CSA: [T][topk], [T]; else NULL */
    int topk;
    float scale;
    float *out;                 /* [T][H][d] */
    /* set: each head of out then rotated back at its row's position (rope
     * with inverse = 1, norm = 0 on the last 2*out_rope_half channels): the
     * bits of attention then that rope */
    const float *out_inv_freq;  /* [out_rope_half] or NULL */
    int out_rope_half;
} ds_attention_params;

/* Stores the step's last (up to W) rows of every sequence in its ring. */
typedef struct ds_window_store_params {
    int layer, window, d;
    const float *kv;            /* [T][d] */
} ds_window_store_params;

enum { DS_ROUTE_SOFTMAX = 0, DS_ROUTE_SIGMOID = 1, DS_ROUTE_SQRTSOFTPLUS = 2 };

/* Routing (paper §2.1): scores from the gate logits; experts = the k
 * largest score + bias (ties to the lower id, then ascending), or the token
 * id's row of tid2eid (hash layers); weights = score / sum * route_scale. */
typedef struct ds_route_params {
    const float *logits;        /* [T][E] */
    int T, E, k, score_func;
    const float *bias;          /* [E] (routed layers) */
    const int32_t *tid2eid;     /* [vocab][k] (hash layers) or NULL */
    float route_scale;
    int32_t *idx;               /* [T][k] */
    float *wts;                 /* [T][k] */
} ds_route_params;

/* The experts (paper §2.1): y[t] = sum over t's k slots in ascending
 * (expert id, slot) of wts * w2_e(SwiGLU_limit(w1_e x, w3_e x)), then + the
 * shared expert's output. Every expert's product has matmul's bits. */
typedef struct ds_moe_params {
    const float *x;             /* [T][D] */
    int T, D, E, k;
    const int32_t *idx;         /* [T][k] */
    const float *wts;           /* [T][k] */
    const ds_weight *w1, *w2, *w3; /* host arrays [E] */
    const ds_weight *sw1, *sw2, *sw3; /* shared expert, or NULL */
    float limit;
    float *out;                 /* [T][D] */
} ds_moe_params;

/* Expert parallelism (docs/ep.md), the moe op in two halves. First the
 * experts: for every (token, slot) pair with sel[t*k + j] set, the routed
 * expert's output w2_e(SwiGLU_limit(w1_e x, w3_e x)) into slot_out[t*k + j]
 * (other rows untouched), and the shared expert of every token into
 * shared_out (zeros without one). Each row has the bits moe computes for it,
 * whatever the selection and the other tokens. */
typedef struct ds_moe_experts_params {
    const float *x;             /* [T][D] */
    int T, D, E, k;
    const int32_t *idx;         /* [T][k] */
    const unsigned char *sel;   /* host [T][k]; NULL: every pair */
    const ds_weight *w1, *w2, *w3; /* host arrays [E] */
    const ds_weight *sw1, *sw2, *sw3; /* shared expert, or NULL */
    float limit;
    float *slot_out;            /* [T][k][D] */
    float *shared_out;          /* [T][D]: the shared expert's rows (zeros without one); may be
                                   NULL when sw1 is, then nothing is written there */
} ds_moe_experts_params;

/* Then the combine, moe's own: out[t] = sum over t's slots in ascending
 * (expert id, slot) of wts * slot_out, then + shared_out[t]. */
typedef struct ds_moe_combine_params {
    int T, D, k;
    const int32_t *idx;         /* [T][k] */
    const float *wts;           /* [T][k] */
    const float *slot_out;      /* [T][k][D] */
    const float *shared_out;    /* [T][D] */
    float *out;                 /* [T][D] */
} ds_moe_combine_params;

/* ---- the backend ----------------------------------------------------- */

/* One copy of copy_list. */
typedef struct ds_copy {
    void *dst;
    const void *src;
    size_t bytes;
} ds_copy;

/* Where the time goes (dsv4 bench): while a backend's profile is set, its
 * products and attention add their wall time here. A batch of products
 * counts, time and bytes, under the storage kind holding most of its weight
 * bytes. Only the calling thread writes it. */
typedef struct ds_profile {
    double mm_seconds[5], mm_bytes[5]; /* by ds_wkind */
    long mm_calls[5];
    double attend_seconds;
    /* backends whose MoE op is not a batch of products (CUDA): the routed and
     * shared experts with their combine (moe, moe_experts, moe_combine) */
    double moe_seconds;
    double exchange_seconds; /* expert parallelism: the rows between ranks */
} ds_profile;

struct ds_backend {
    const char *name;
    ds_profile *profile;        /* NULL: no accounting */
    void *impl;                 /* the backend's own state */

    /* memory */
    void *(*alloc)(const ds_backend *be, size_t bytes, ds_err *err);
    void (*free)(const ds_backend *be, void *p);
    int (*upload)(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err);
    int (*download)(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err);
    /* Host memory that downloads reach fastest, for buffers that take one
     * every step (the logits): CUDA's is pinned (a pageable 517 KB row of
     * logits came down at ~1 GB/s). NULL: plain host memory will do. Free it
     * with host_free before the backend closes. */
    void *(*host_alloc)(const ds_backend *be, size_t bytes, ds_err *err);
    void (*host_free)(const ds_backend *be, void *p);
    int (*memset0)(const ds_backend *be, void *dst, size_t bytes, ds_err *err);
    /* backend memory to backend memory (returns when the copy is done) */
    int (*copy)(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err);
    /* n copies in backend memory, in order, returning when all are done
     * (one wait for all: a sequence's snapshot is dozens of small copies) */
    int (*copy_list)(const ds_backend *be, int n, const ds_copy *c, ds_err *err);
    /* Host bytes valid for the model's lifetime as backend memory (*out);
     * unmap_weights releases them. what: DS_MAP_BYTES (kept as they are) or
     * DS_MAP_FP4_CODES (an MXFP4 matrix's E2M1 codes, two a byte: the backend
     * may keep them in its own order, which only its kernels read; CUDA:
     * docs/cuda.md). */
    int (*map_weights)(const ds_backend *be, const void *host, size_t bytes, ds_map_what what, const void **out,
                       ds_err *err);
    void (*unmap_weights)(const ds_backend *be, const void *p);
    /* Optional (NULL: no expert store, model/store.h). Writes bytes of host
     * into dst (backend memory from alloc, at least bytes rounded up to 4)
     * as map_weights would keep them (what: the same), in the order of the
     * step's ops: ops issued before it read dst's old bytes, ops issued
     * after it the new ones. host must stay valid until the step's end. */
    int (*fill_weights)(const ds_backend *be, void *dst, const void *host, size_t bytes, ds_map_what what,
                        ds_err *err);
    /* Optional (NULL: host memory is read as it is). Page-locks the host
     * pages [p, p + bytes) (page-aligned; they may be mapped read-only, as a
     * shard is) so that fill_weights from them is one DMA at the link's rate;
     * unpin_host(p) releases them. 0, or -1 with err (nothing locked). */
    int (*pin_host)(const ds_backend *be, const void *p, size_t bytes, ds_err *err);
    void (*unpin_host)(const ds_backend *be, const void *p);
    /* Optional. Called once for every mapped weight the model multiplies
     * (every weight but the embedding): the backend may keep a second copy
     * of it in a faster layout of its own (w->packed: the same values, so
     * the same bits; data stays valid and other ops may read it). 0, or -1
     * with err naming the weight. release_weight frees that copy. */
    int (*pack_weight)(const ds_backend *be, ds_weight *w, ds_err *err);
    void (*release_weight)(const ds_backend *be, ds_weight *w);

    /* the step */
    int (*begin_step)(const ds_backend *be, const ds_step_desc *s, ds_err *err);
    /* Optional (NULL: every op runs in the order issued, which is always
     * right). Two lanes of ops inside a step, so that independent chains
     * may run side by side (docs/backend.md, "Lanes"):
     *   DS_LANE_SIDE  the ops issued next go to the side lane, which first
     *                 waits for everything issued so far on the main lane;
     *   DS_LANE_MAIN  the ops issued next go to the main lane again, which
     *                 does not wait for the side lane;
     *   DS_LANE_JOIN  the main lane waits for everything issued on the side
     *                 lane; the ops issued next go to the main lane.
     * Between a DS_LANE_SIDE and its join, neither lane may write what the
     * other reads. Only matmul_many, compress, rope and indexer may be issued
     * on the side lane (another op there is an error naming it), and one
     * indexer at a time. Every output has the bits of issue order. */
    int (*lane)(const ds_backend *be, int to, ds_err *err);

    /* ops, at the level of the paper's sections */
    int (*embed)(const ds_backend *be, const ds_embed_params *p, ds_err *err);
    /* Independent products, run together (on the CPU: one parallel region);
     * each output has the bits a batch of one would give it. */
    int (*matmul_many)(const ds_backend *be, const ds_matmul_job *jobs, int n, ds_err *err);
    int (*matmul_grouped)(const ds_backend *be, const ds_matmul_grouped *p, ds_err *err);
    /* Independent rmsnorms (rows of any widths), run together; each output
     * has the bits it would have alone. */
    int (*rmsnorm)(const ds_backend *be, const ds_rmsnorm_params *jobs, int n, ds_err *err);
    int (*rope)(const ds_backend *be, const ds_rope_params *p, ds_err *err);
    int (*hc_pre)(const ds_backend *be, const ds_hc_pre_params *p, ds_err *err);
    int (*hc_post)(const ds_backend *be, const ds_hc_post_params *p, ds_err *err);
    int (*hc_head)(const ds_backend *be, const ds_hc_head_params *p, ds_err *err);
    int (*gather)(const ds_backend *be, const ds_gather_params *p, ds_err *err);
    int (*compress)(const ds_backend *be, const ds_compress_params *p, ds_err *err);
    int (*indexer)(const ds_backend *be, const ds_indexer_params *p, ds_err *err);
    int (*attention)(const ds_backend *be, const ds_attention_params *p, ds_err *err);
    int (*window_store)(const ds_backend *be, const ds_window_store_params *p, ds_err *err);
    int (*route)(const ds_backend *be, const ds_route_params *p, ds_err *err);
    int (*moe)(const ds_backend *be, const ds_moe_params *p, ds_err *err);
    /* moe in two halves, for expert parallelism (NULL: not supported) */
    int (*moe_experts)(const ds_backend *be, const ds_moe_experts_params *p, ds_err *err);
    int (*moe_combine)(const ds_backend *be, const ds_moe_combine_params *p, ds_err *err);
    /* Expert parallelism between devices (docs/ep.md; NULL: rows go through
     * host memory and the transport of ep/). ep_comm_id: rank 0 makes the
     * id of a communicator (at most cap bytes, its size in *n); every rank
     * then joins with ep_comm_init (the id came over MPI). ep_exchange: nb
     * buffers of n rows in device memory (buffer b's rows of widths[b] 32-bit
     * words), row j of each filled on rank owner[j] (host [n]); afterwards
     * every rank holds every row (dest NULL) or rank r holds the rows j with
     * dest[j] == r (host [n]), bit for bit as their owner filled them. All
     * buffers share the tables, so they move together. */
    int (*ep_comm_id)(const ds_backend *be, void *id, size_t cap, size_t *n, ds_err *err);
    int (*ep_comm_init)(const ds_backend *be, const void *id, size_t n, int rank, int size, ds_err *err);
    int (*ep_exchange)(const ds_backend *be, int nb, float *const *bufs, const int *widths, int n, const int *owner,
                       const int *dest, ds_err *err);

    /* Host work between steps (the server's sampling) on the backend's own
     * threads, which are idle then: fn(ctx, i) for i in [0, n), at most
     * host_threads(be) calls at a time, returning when all are done; each i
     * must write only its own outputs. NULL: the backend lends no threads
     * (the caller brings its own). */
    void (*host_for)(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx);
    int (*host_threads)(const ds_backend *be);

    /* Every backend sets these. threads: the host threads it computes with
     * (the CPU: its workers; a backend that computes on a device: 0).
     * set_threads: n of them from the next step on (n <= 0: all cores;
     * between steps only; a device backend ignores it). note: how it
     * computes, for reports, e.g. "weights prefetched into L2" ("" for
     * nothing to say; a string that lives as long as the backend). */
    int (*threads)(const ds_backend *be);
    void (*set_threads)(ds_backend *be, int n);
    const char *(*note)(const ds_backend *be);
    /* Bytes alloc can still hand out now (the CPU: MemAvailable; a GPU: its
     * free memory); 0 if unknown. For sizing contexts, not a promise. */
    uint64_t (*avail)(const ds_backend *be);

    /* Releases everything the backend owns (not the struct itself). */
    void (*close)(ds_backend *be);
};

enum { DS_LANE_MAIN = 0, DS_LANE_SIDE = 1, DS_LANE_JOIN = 2 };

/* be->lane where the backend has lanes; otherwise nothing to do (issue
 * order is the order the ops run in). */
static inline int ds_lane(const ds_backend *be, int to, ds_err *err) {
    return be->lane ? be->lane(be, to, err) : 0;
}

/* One product: a batch of one. */
static inline int ds_matmul(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y, ds_err *err) {
    ds_matmul_job j = {w, x, T, y};
    return be->matmul_many(be, &j, 1, err);
}

/* be->host_alloc where the backend has one, else malloc; NULL and err set
 * when neither gives the bytes. ds_host_free releases either. */
static inline void *ds_host_alloc(const ds_backend *be, size_t bytes, ds_err *err) {
    if (be && be->host_alloc) return be->host_alloc(be, bytes, err);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ds_fail(err, "out of host memory for %zu bytes", bytes);
    return p;
}
static inline void ds_host_free(const ds_backend *be, void *p) {
    if (!p) return;
    if (be && be->host_free) be->host_free(be, p);
    else free(p);
}

#endif
