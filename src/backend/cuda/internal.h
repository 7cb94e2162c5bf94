/* internal.h — shared by the CUDA backend's files: the backend's state, the
 * device view of a weight, the element decoders and the one row-dot every
 * product uses (so matmul, grouped matmul, mHC mixes and the experts give a
 * row the same bits). Compiled by nvcc only. */
#ifndef DS_CUDA_INTERNAL_H
#define DS_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/heuristics.h"

/* ---- kernel launches ------------------------------------------------ */

/* Every kernel starts with DSC_PDL_WAIT() and is launched by dsc_launch, with
 * programmatic dependent launch (Hopper; docs/cuda.md "Launches"): the grid is
 * scheduled while the previous kernel in the stream drains, and the wait holds
 * the whole body until that kernel has completed and its writes are visible.
 * So each kernel still runs after the one before it, on the same inputs, with
 * the same bits; only the launch latency between them is hidden. A kernel
 * launched without the attribute (after a copy, under a profiler) does not
 * wait. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DSC_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define DSC_PDL_WAIT() ((void)0)
#endif

template <typename... P, typename... A>
static inline cudaError_t dsc_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                     A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = st;
    c.attrs = at;
    c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, kernel, static_cast<A &&>(args)...);
}

/* ---- the backend's state (be->impl) ---------------------------------- */

/* A grow-only device buffer. A buffer that grows while a step is being
 * captured into a CUDA graph keeps its old allocations (old) until the
 * captured work has run (dsc_graph_end frees them). */
typedef struct dsc_buf {
    void *p;
    size_t cap;
    void *old[4];
    int n_old;
} dsc_buf;

/* Grows b to at least bytes (contents lost); 0, -1 (out of device memory) or
 * -2 (grown too often inside one captured step). Outside a capture it waits
 * for the stream's earlier work before freeing the old allocation. */
int dsc_buf_grow(dsc_buf *b, size_t bytes, size_t min_cap, cudaStream_t st);

/* CUDA graphs of small steps (backend.cu; docs/cuda.md "CUDA graphs"). */
#define DSC_GRAPH_MAX_T 64      /* steps of at most this many tokens are captured */
#define DSC_GRAPHS 256          /* cached executable graphs (one per step size and piece) */

/* The step in device memory (begin_step), one blob: sections 16-byte aligned. */
typedef struct dsc_step {
    int T, n_seqs, n_layers;
    int64_t max_pos;            /* host: largest position of the step */
    const int32_t *tok_id;      /* device [T] */
    const int64_t *tok_pos;     /* device [T] */
    const int *tok_seq;         /* device [T] */
    const int *seq_row0, *seq_n;/* device [n_seqs] */
    const int64_t *seq_pos0;    /* device [n_seqs] */
    const ds_layer_mem *mem;    /* device [n_seqs][n_layers] */
} dsc_step;

/* The experts of one MoE layer as a device table (built once per layer). */
typedef struct dsc_expert_ptrs {
    const uint8_t *data, *scale;
    int srow0;
} dsc_expert_ptrs;

typedef struct dsc_moe_table {
    dsc_expert_ptrs *host;      /* the key: the same [3][E] table on the host */
    int E;
    dsc_expert_ptrs *dev;       /* device [3][E]: w1, w3, w2 */
    const void *owner;          /* the caller's w1 array: a table whose pointers changed (an expert
                                   store's slots) is rewritten in place, not added */
} dsc_moe_table;

enum {
    DSC_S_STEP = 0,               /* step blob (device) */
    DSC_S_A, DSC_S_B,             /* op scratch */
    DSC_S_ATT,                    /* attention block partials */
    DSC_S_MOE0, DSC_S_MOE1, DSC_S_MOE2, DSC_S_MOE3, DSC_S_MOE4, DSC_S_MOE5, DSC_S_MOE6, DSC_S_MOE7, DSC_S_MOE8,
    DSC_S_XHL,                    /* mma/, three in a row: activations split (BF16 hi, mid / lo; FP8 f16 hi / lo), */
    DSC_S_MMAP, DSC_S_MMAC,       /* the decode kernel's partials and per-tile counters */
    DSC_S_XHL2, DSC_S_MMAP2, DSC_S_MMAC2, /* the same three for products on the side stream (moe.cu, the side lane) */
    DSC_S_IDX,                    /* the indexer's scores (indexer.cu; either lane) */
    DSC_S_EP0, DSC_S_EP1, DSC_S_EP2, /* expert exchange (ep_nccl.cu): own rows, received rows, row map */
    DSC_S_N
};

typedef struct dsc_impl {
    int gpu, n_sm;
    size_t smem_optin;
    cudaStream_t stream;
    /* the side stream (on unless DSV4_CUDA_SIDE=0: docs/cuda.md "The shared
     * expert on a side stream"): the MoE's shared expert runs there beside
     * the routed experts, forked from and joined back into `stream` inside
     * the op (the same kernels on the same inputs: the same bits; a captured
     * step keeps the fork and join as graph edges) */
    int side_on;
    cudaStream_t side;
    cudaEvent_t ev_fork, ev_join;
    /* the model's lanes (be->lane; on unless DSV4_CUDA_LANES=0 or the op
     * profile is on: docs/cuda.md "Lanes"): the side lane is the side stream; lane: where the
     * next op goes (DS_LANE_MAIN / DS_LANE_SIDE), branch: side work not yet
     * joined into `stream` */
    int lanes_on, lane, branch;
    cudaEvent_t ev_lfork, ev_ljoin;
    dsc_buf scratch[DSC_S_N];
    void *stage;                /* pinned host staging of the step blob */
    size_t stage_cap;
    cudaEvent_t stage_done;
    int stage_pending;
    dsc_step step;
    dsc_moe_table *moe;         /* per MoE layer */
    int n_moe, cap_moe;
    void *ballast;              /* DSV4_CUDA_FREE_MIB: device memory held so that only that much stays free */
    struct dsc_nccl *nccl;      /* expert parallelism between GPUs (ep_nccl.cu), or NULL */
    /* CUDA graphs: a small step is captured from begin_step to its first host
     * synchronization, then replayed as one graph (the same kernels, the same
     * parameters: the same bits) */
    int graph_on;               /* DSV4_CUDA_GRAPH unset or not "0" */
    int capturing;              /* the stream is capturing this step */
    int last_T;                 /* the previous step's T: a size is captured from its second step on */
    int piece_ops;              /* ops per piece (DSC_GRAPH_PIECE_OPS, DSV4_CUDA_GRAPH_OPS; 0: the whole step) */
    int piece, piece_n;         /* this step's piece, the ops captured into it so far */
    struct {
        int T, piece;
        cudaGraphExec_t exec;
    } graphs[DSC_GRAPHS];
    int n_graphs, next_graph;
    long graph_updates, graph_builds; /* replays through an update / a fresh instantiation */
} dsc_impl;

/* ep_nccl.cu */
void dsc_nccl_close(dsc_impl *I);

static inline dsc_impl *dsc_of(const ds_backend *be) { return (dsc_impl *)be->impl; }

/* Helpers (backend.cu). All return 0 or -1 with "cuda <op>: <what>: <cause>". */
int dsc_fail(ds_err *err, const char *op, const char *what, cudaError_t e);
int dsc_failmsg(ds_err *err, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int dsc_check_launch(ds_err *err, const char *op);
/* Ends the step's capture, if one is under way, and launches its graph; every
 * op that synchronizes with the host calls it first. 0 or -1. */
int dsc_graph_end(dsc_impl *I, ds_err *err);
/* Device scratch slot `which`, at least `bytes` (grow-only, contents lost on growth). */
void *dsc_scratch(dsc_impl *I, int which, size_t bytes, ds_err *err, const char *op);
/* Every op starts with one of these (the device selected, a graph piece
 * cut when due): dsc_use for ops of the main lane only (issued on the side
 * lane: an error naming the op), dsc_use_lane for the ops that may run on
 * either (their launches go to dsc_st, their products' scratch is dsc_xhl). */
int dsc_use(const ds_backend *be, ds_err *err, const char *op);
int dsc_use_lane(const ds_backend *be, ds_err *err, const char *op);
/* dsc_lane: be->lane (backend.cu). dsc_lane_join: the main lane waits for
 * the side lane's work, if any; the next op goes to the main lane. */
int dsc_lane(const ds_backend *be, int to, ds_err *err);
void dsc_lane_join(dsc_impl *I);
/* The current lane's stream and tensor-core scratch (three slots in a row). */
static inline cudaStream_t dsc_st(const dsc_impl *I) { return I->lane ? I->side : I->stream; }
static inline dsc_buf *dsc_xhl(dsc_impl *I) { return &I->scratch[I->lane ? DSC_S_XHL2 : DSC_S_XHL]; }

static inline double dsc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a weight on the device ------------------------------------------- */

typedef struct dsc_w {
    const uint8_t *data, *scale;
    int rows, cols, scale_f32, scale_cols, srow0;
} dsc_w;

static inline dsc_w dsc_wdesc(const ds_weight *w) {
    dsc_w d = {w->data, w->scale, w->rows, w->cols, w->scale_f32, w->scale_cols, w->srow0};
    return d;
}

/* ---- launchers (device pointers, the backend's stream) ---------------- */

/* y[t*ys + r] = w[r] . x[t*xs + (r / rpg) * xg ...] for r < rows, t < T.
 * mb: three grow-only buffers of the tensor-core path (&scratch[DSC_S_XHL]):
 * split activations, the decode kernel's partials, its counters. */
int dsc_launch_matmul(cudaStream_t st, dsc_buf *mb, int kind, dsc_w w, const float *x, int xs, int xg, int rpg,
                      int T, float *y, int ys);

/* MXFP4 products with E8M0 scales as exact integer sums, the CPU's bits
 * (fp4.cu): whether w takes them, a plain / grouped product (matmul's
 * arguments), and the experts' up (w1 then w3 rows: T tokens' rows of x) or
 * down (w2: the T * k pairs' rows) product over the sorted pairs, as
 * dsc_mma_experts takes them. x is quantized into mb[0]. */
int dsc_fp4_fits(int kind, const dsc_w &w);
int dsc_fp4_matmul(cudaStream_t st, dsc_buf *mb, dsc_w w, const float *x, int xs, int xg, int rpg, int T, float *y,
                   int ys);
int dsc_fp4_experts(cudaStream_t st, dsc_buf *mb, int up, dsc_w shape, const dsc_expert_ptrs *t1,
                    const dsc_expert_ptrs *t3, const float *x, int xs, int T, int maxcnt, const int *off,
                    const int *active, const int *n_active, const int *members, int k, unsigned ny, float *y, int ys);
/* mma/launch.cu: whether a matrix takes the tensor-core path (by kind and shape
 * only, never by T), and the products there. */
int dsc_mma_fits(int kind, const dsc_w &w, int rpg);
int dsc_mma_matmul(cudaStream_t st, dsc_buf *mb, int kind, dsc_w w, const float *x, int xs, int xg, int rpg, int T,
                   float *y, int ys);
/* The experts' up (w1 rows then w3 rows: y[m][0, 2I)) or down product over
 * the sorted pairs; x: up [T][xs] (token members[m] / k), down [m][xs]. */
int dsc_mma_experts(cudaStream_t st, dsc_buf *mb, int up, int kind, dsc_w shape, const dsc_expert_ptrs *t1,
                    const dsc_expert_ptrs *t3, const float *x, int xs, int T, int maxcnt, const int *off,
                    const int *active, const int *n_active, const int *members, int k, unsigned ny, float *y, int ys);
int dsc_launch_rmsnorm(cudaStream_t st, const float *x, const float *w, float *out, int T, int n, float eps);

/* ---- device code ------------------------------------------------------ */
#ifdef __CUDACC__

__device__ __forceinline__ float dsc_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ float dsc_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    int ex = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (ex == 0) {
        float f = (float)mant * 5.9604644775390625e-8f; /* 2^-24, exact */
        return sign ? -f : f;
    }
    uint32_t u = ex == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((uint32_t)(ex - 15 + 127) << 23) | (mant << 13));
    return __uint_as_float(u);
}

__device__ __forceinline__ float dsc_e8m0(uint8_t e) {
    if (e == 255) return __uint_as_float(0x7fc00000u);
    if (e == 0) return __uint_as_float(0x00400000u); /* 2^-127 */
    return __uint_as_float((uint32_t)e << 23);
}

/* e4m3 without branches: the 7 magnitude bits placed at the top of a float's
 * exponent/mantissa give 2^(ex-127)(1+m/8) (or m 2^-149 when ex == 0: a
 * float subnormal); times 2^120 (exact) that is 2^(ex-7)(1+m/8), resp.
 * m 2^-9 — the exact e4m3 value. Then the sign bit; 0x7f is NaN. */
__device__ __forceinline__ float dsc_fp8(uint8_t b) {
    uint32_t mag = (uint32_t)(b & 0x7f);
    float v = __fmul_rn(__uint_as_float(mag << 20), 1.329227995784915872903807060280344576e36f); /* 2^120 */
    v = __uint_as_float(__float_as_uint(v) | ((uint32_t)(b & 0x80) << 24));
    return mag == 0x7f ? __uint_as_float(0x7fc00000u) : v;
}

/* e2m1: twice the magnitude {0,1,2,3,4,6,8,12} packed as nibbles of one
 * register (no local-memory table), halved (exact), then the sign bit
 * (code 8 gives -0.0f, as -a did). */
__device__ __forceinline__ float dsc_e2m1(int code) {
    float a = (float)((0xC8643210u >> (4 * (code & 7))) & 15u) * 0.5f;
    return __uint_as_float(__float_as_uint(a) | ((uint32_t)(code & 8) << 28));
}

/* FP4 codes in device memory (map_weights with DS_MAP_FP4_CODES) are
 * reordered inside each aligned 32-bit word: the word's codes 2j and 2j + 1
 * (the checkpoint's order: two columns side by side) sit at nibbles j and
 * j + 4, 16 bits apart (fp4.cu stores its activation digits in the same
 * order). Code p (0..7) of a word is at nibble
 * dsc_fp4_nib(p). Every FP4 reader here goes through it; the values, and so
 * every bit, are those of the checkpoint's order. */
__host__ __device__ constexpr int dsc_fp4_nib(int p) { return (p >> 1) | ((p & 1) << 2); }
__host__ __device__ inline uint32_t dsc_fp4_store_word(uint32_t w) {
    uint32_t o = 0;
    for (int p = 0; p < 8; p++) o |= ((w >> (4 * p)) & 15u) << (4 * dsc_fp4_nib(p));
    return o;
}
/* Reorders n device words in place (stream order). */
cudaError_t dsc_fp4_reorder(cudaStream_t st, uint32_t *words, size_t n);

__device__ __forceinline__ float dsc_scale(const dsc_w &w, size_t i) {
    if (w.scale_f32) return ((const float *)w.scale)[i];
    return dsc_e8m0(w.scale[i]);
}

/* Elements per 16-byte chunk of a storage kind. */
template <int KIND> struct dsc_kind;
template <> struct dsc_kind<DS_W_F32> { enum { V = 4, NUM = 4, DEN = 1 }; };   /* bytes = cols * NUM / DEN */
template <> struct dsc_kind<DS_W_BF16> { enum { V = 8, NUM = 2, DEN = 1 }; };
template <> struct dsc_kind<DS_W_F16> { enum { V = 8, NUM = 2, DEN = 1 }; };
template <> struct dsc_kind<DS_W_FP8> { enum { V = 16, NUM = 1, DEN = 1 }; };
template <> struct dsc_kind<DS_W_FP4> { enum { V = 32, NUM = 1, DEN = 2 }; };

/* One element c of row r (exact value), for the ragged tail / unaligned rows. */
template <int KIND>
__device__ __forceinline__ float dsc_elem(const dsc_w &w, int r, int c) {
    size_t base = (size_t)r * (size_t)w.cols;
    if (KIND == DS_W_F32) return ((const float *)w.data)[base + c];
    if (KIND == DS_W_BF16) return dsc_bf16(((const uint16_t *)w.data)[base + c]);
    if (KIND == DS_W_F16) return dsc_f16(((const uint16_t *)w.data)[base + c]);
    if (KIND == DS_W_FP8)
        return dsc_fp8(w.data[base + c]) *
               dsc_scale(w, (size_t)((w.srow0 + r) / DS_FP8_BLOCK) * (size_t)w.scale_cols + (size_t)(c / DS_FP8_BLOCK));
    /* FP4: the code's word (aligned: dsc_fp4_nib) */
    uintptr_t b = (uintptr_t)(w.data + base / 2 + c / 2);
    uint32_t u = *(const uint32_t *)(b & ~(uintptr_t)3);
    int code = (int)(u >> (4 * dsc_fp4_nib((int)((b & 3) << 1) | (c & 1)))) & 15;
    return dsc_e2m1(code) * dsc_scale(w, (size_t)r * (size_t)w.scale_cols + (size_t)(c / DS_FP4_GROUP));
}

/* Dequantizes chunk ch (elements [ch*V, ch*V+V)) of row r from its 16 bytes. */
template <int KIND>
__device__ __forceinline__ void dsc_chunk(const dsc_w &w, int r, int ch, uint4 q, float *o) {
    const int V = dsc_kind<KIND>::V;
    uint32_t u[4] = {q.x, q.y, q.z, q.w};
    if (KIND == DS_W_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) o[i] = __uint_as_float(u[i]);
    } else if (KIND == DS_W_BF16) {
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = dsc_bf16((uint16_t)(u[i / 2] >> (16 * (i & 1))));
    } else if (KIND == DS_W_F16) {
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = dsc_f16((uint16_t)(u[i / 2] >> (16 * (i & 1))));
    } else if (KIND == DS_W_FP8) {
        float s = dsc_scale(w, (size_t)((w.srow0 + r) / DS_FP8_BLOCK) * (size_t)w.scale_cols +
                                   (size_t)(ch * V / DS_FP8_BLOCK));
#pragma unroll
        for (int i = 0; i < 16; i++) o[i] = dsc_fp8((uint8_t)(u[i / 4] >> (8 * (i & 3)))) * s;
    } else {
        float s = dsc_scale(w, (size_t)r * (size_t)w.scale_cols + (size_t)ch); /* V == group */
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] = dsc_e2m1((int)(u[i / 8] >> (4 * dsc_fp4_nib(i & 7))) & 15) * s;
    }
}

/* acc[j] (lane-partial) += w[r] . x_j for the lane's chunks, j < nt (SX:
 * x_j's elements each times sx[j] first, one rounded product: the values an
 * rmsnorm without weight would have stored).
 * ORDER (fixed by cols only): chunks lane, lane+32, ... ascending; inside a
 * chunk elements ascending; one fmaf per element. The vector / scalar load
 * paths give the same values in the same order. */
template <int KIND, int NT, bool SX = false>
__device__ __forceinline__ void dsc_row_dot(const dsc_w &w, int r, int lane, const float *const *xj, int nt, int xvec,
                                            float *acc, const float *sx = nullptr) {
    const int V = dsc_kind<KIND>::V;
    const int K = w.cols;
    const size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const uint8_t *row = w.data + (size_t)r * rowbytes;
    const int wvec = (((uintptr_t)row) & 15) == 0;
    const int nfull = K / V; /* chunks entirely inside the row */
    const int nch = (K + V - 1) / V;
#pragma unroll 1
    for (int ch0 = lane; ch0 < nch; ch0 += 32 * DSC_MM_UNROLL) {
        uint4 q[DSC_MM_UNROLL];
#pragma unroll
        for (int u = 0; u < DSC_MM_UNROLL; u++) {
            int ch = ch0 + 32 * u;
            q[u] = make_uint4(0, 0, 0, 0);
            if (wvec && ch < nfull) q[u] = __ldg((const uint4 *)(row + (size_t)ch * 16));
        }
#pragma unroll
        for (int u = 0; u < DSC_MM_UNROLL; u++) {
            int ch = ch0 + 32 * u;
            if (ch >= nch) break;
            float wv[V];
            int nv = V;
            if (wvec && ch < nfull) {
                dsc_chunk<KIND>(w, r, ch, q[u], wv);
            } else {
                nv = K - ch * V < V ? K - ch * V : V;
#pragma unroll
                for (int i = 0; i < V; i++) wv[i] = i < nv ? dsc_elem<KIND>(w, r, ch * V + i) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= nt) break;
                const float *x = xj[j] + (size_t)ch * V;
                float a = acc[j];
                if (xvec && nv == V) {
#pragma unroll
                    for (int i = 0; i < V; i += 4) {
                        float4 x4 = *(const float4 *)(x + i);
                        if (SX) x4 = make_float4(x4.x * sx[j], x4.y * sx[j], x4.z * sx[j], x4.w * sx[j]);
                        a = fmaf(wv[i], x4.x, a);
                        a = fmaf(wv[i + 1], x4.y, a);
                        a = fmaf(wv[i + 2], x4.z, a);
                        a = fmaf(wv[i + 3], x4.w, a);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < V; i++)
                        if (i < nv) a = fmaf(wv[i], SX ? x[i] * sx[j] : x[i], a);
                }
                acc[j] = a;
            }
        }
    }
}

/* Whether one of the four e4m3 bytes of w is NaN (magnitude 0x7f). */
__device__ __forceinline__ int dsc_fp8_nan4(uint32_t w) { return __vcmpeq4(w & 0x7f7f7f7fu, 0x7f7f7f7fu) != 0; }

/* Element e (compile-time after unrolling) of a 16-byte chunk, times the
 * chunk's scale s for FP8/FP4: the same value dsc_chunk gives, in fewer
 * instructions (every shift folds to one constant shift):
 *   e4m3 byte p of a word: its 7 magnitude bits moved to bits 20..26 and its
 *     sign to bit 31 in one mask-merge, times 2^120 (dsc_fp8's identity; a
 *     word with a NaN byte takes dsc_fp8 itself: nan4 set);
 *   e2m1 code e (at nibble p = dsc_fp4_nib(e & 7)): magnitude bits at 22..24 are 2^(e-127)(1 + m/2), or
 *     m 2^-127 when e == 0, so times 2^126 they are the e2m1 value exactly;
 *     the sign to bit 31 (code 8 gives -0.0f, as dsc_e2m1). */
template <int KIND>
__device__ __forceinline__ float dsc_chunk_elem(const uint32_t *u, int e, float s, int nan4 = 0) {
    if (KIND == DS_W_F32) return __uint_as_float(u[e]);
    if (KIND == DS_W_BF16) return dsc_bf16((uint16_t)(u[e / 2] >> (16 * (e & 1))));
    if (KIND == DS_W_F16) return dsc_f16((uint16_t)(u[e / 2] >> (16 * (e & 1))));
    if (KIND == DS_W_FP8) {
        uint32_t w = u[e / 4];
        int p = e & 3;
        if (nan4) return dsc_fp8((uint8_t)(w >> (8 * p))) * s;
        uint32_t mag = p <= 2 ? w << (20 - 8 * p) : w >> (8 * p - 20);
        uint32_t sgn = w << (24 - 8 * p);
        float v = __uint_as_float((mag & 0x07f00000u) | (sgn & 0x80000000u));
        return __fmul_rn(v, 1.329227995784915872903807060280344576e36f) * s; /* 2^120 */
    }
    uint32_t w = u[e / 8];
    int p = dsc_fp4_nib(e & 7);
    uint32_t mag = p <= 5 ? w << (22 - 4 * p) : w >> (4 * p - 22);
    uint32_t sgn = w << (28 - 4 * p);
    float v = __uint_as_float((mag & 0x01c00000u) | (sgn & 0x80000000u));
    return __fmul_rn(v, 8.5070591730234615865843651857942052864e37f) * s; /* 2^126 */
}

/* The scale of chunk ch of a row whose scales start at sp (FP8: one per 128
 * columns, FP4: one per chunk; E8M0 bytes or F32). 1 for unscaled kinds. */
template <int KIND>
__device__ __forceinline__ float dsc_chunk_scale(const uint8_t *sp, int scale_f32, int ch) {
    if (KIND != DS_W_FP8 && KIND != DS_W_FP4) return 1.0f;
    int i = KIND == DS_W_FP8 ? ch * dsc_kind<KIND>::V / DS_FP8_BLOCK : ch;
    return scale_f32 ? ((const float *)sp)[i] : dsc_e8m0(sp[i]);
}

/* Where row r's scales start (element (r, 0) of the scale grid). */
__device__ __forceinline__ const uint8_t *dsc_row_scales(const dsc_w &w, int kind, int r) {
    size_t i = kind == DS_W_FP8   ? (size_t)((w.srow0 + r) / DS_FP8_BLOCK) * (size_t)w.scale_cols
               : kind == DS_W_FP4 ? (size_t)r * (size_t)w.scale_cols
                                  : 0;
    return w.scale ? w.scale + i * (w.scale_f32 ? 4 : 1) : NULL;
}

/* The row dot of RW rows given by their data and scale pointers (rows of a
 * regular shape: 16-byte aligned, nch = K / V whole chunks, x 16-byte
 * aligned), U chunks of every row in flight per lane: acc[q*NT + j] for row
 * q and token j < nt. ORDER: per (row, token) exactly dsc_row_dot's — lane
 * l's chunks l, l+32, ... ascending, elements ascending, one fmaf each — so
 * RW, U and NT (how loads are shared and batched) never change a bit. */
template <int KIND, int NT, int RW, int U>
__device__ __forceinline__ void dsc_rows_dot_p(const uint8_t *const *rowp, const uint8_t *const *sclp, int scale_f32,
                                               int nch, int lane, const float *const *xj, int nt, float *acc) {
    const int V = dsc_kind<KIND>::V;
#pragma unroll 1
    for (int ch0 = lane; ch0 < nch; ch0 += 32 * U) {
        uint4 qv[U][RW];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ch = ch0 + 32 * u;
#pragma unroll
            for (int q = 0; q < RW; q++)
                qv[u][q] = ch < nch ? __ldg((const uint4 *)(rowp[q] + (size_t)ch * 16)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ch = ch0 + 32 * u;
            if (ch >= nch) break;
            float s[RW];
#pragma unroll
            for (int q = 0; q < RW; q++) s[q] = dsc_chunk_scale<KIND>(sclp[q], scale_f32, ch);
#pragma unroll
            for (int i = 0; i < V; i += 4) {
                float wv[RW][4];
#pragma unroll
                for (int q = 0; q < RW; q++) {
                    uint32_t uu[4] = {qv[u][q].x, qv[u][q].y, qv[u][q].z, qv[u][q].w};
                    int nan4 = KIND == DS_W_FP8 ? dsc_fp8_nan4(uu[i / 4]) : 0;
#pragma unroll
                    for (int e = 0; e < 4; e++) wv[q][e] = dsc_chunk_elem<KIND>(uu, i + e, s[q], nan4);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (j >= nt) break;
                    float4 x4 = *(const float4 *)(xj[j] + (size_t)ch * V + i);
#pragma unroll
                    for (int q = 0; q < RW; q++) {
                        float a = acc[q * NT + j];
                        a = fmaf(wv[q][0], x4.x, a);
                        a = fmaf(wv[q][1], x4.y, a);
                        a = fmaf(wv[q][2], x4.z, a);
                        a = fmaf(wv[q][3], x4.w, a);
                        acc[q * NT + j] = a;
                    }
                }
            }
        }
    }
}

/* dsc_rows_dot_p for RW consecutive rows r0.. of w (rows past w.rows repeat
 * r0 and are not stored by the callers). */
template <int KIND, int NT, int RW, int U = 1>
__device__ __forceinline__ void dsc_rows_dot(const dsc_w &w, int r0, int lane, const float *const *xj, int nt,
                                             float *acc) {
    const size_t rowbytes = (size_t)w.cols * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const uint8_t *rows[RW], *scl[RW];
#pragma unroll
    for (int q = 0; q < RW; q++) {
        int r = r0 + q < w.rows ? r0 + q : r0;
        rows[q] = w.data + (size_t)r * rowbytes;
        scl[q] = dsc_row_scales(w, KIND, r);
    }
    dsc_rows_dot_p<KIND, NT, RW, U>(rows, scl, w.scale_f32, w.cols / dsc_kind<KIND>::V, lane, xj, nt, acc);
}

/* The fixed xor tree: every lane ends with the same bits. */
__device__ __forceinline__ float dsc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Thread i's part of rmsnorm's sum of squares over x[0..n): fmaf over x[i],
 * x[i + DSC_ROW_THREADS], ... ascending (ORDER), up to U loads in flight
 * (not ORDER). rmsnorm_kernel and the mixes' fused 1 / rms both take it: the
 * same chain. */
template <int U = 16> __device__ __forceinline__ float dsc_sumsq_part(const float *xr, int n, int i) {
    float s = 0.0f;
    for (; i < n; i += U * DSC_ROW_THREADS) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = i + u * DSC_ROW_THREADS < n ? xr[i + u * DSC_ROW_THREADS] : 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + u * DSC_ROW_THREADS < n) s = fmaf(v[u], v[u], s);
    }
    return s;
}

/* RoPE on one channel pair (a, b) = (x[2i], x[2i+1]) of a rotated span:
 * the angle inv_freq_i * pos in fp32, then (a cos - b sin, b cos + a sin);
 * inverse: -sin. Every kernel that rotates (rope, the norms' rope, the
 * attention output's inverse rope) calls this one: the same bits. */
__device__ __forceinline__ void dsc_rope_pair(float &a, float &b, float inv_freq_i, float pos, int inverse) {
    float ang = inv_freq_i * pos;
    float cs = cosf(ang), sn = sinf(ang);
    if (inverse) sn = -sn;
    float a0 = a, b0 = b;
    a = a0 * cs - b0 * sn;
    b = b0 * cs + a0 * sn;
}

/* Block sum for blockDim.x == DSC_ROW_THREADS: warp trees, then warp 0 sums
 * the 8 warp results by the same tree. sh: 32 floats. All threads get it. */
__device__ __forceinline__ float dsc_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = dsc_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float s = lane < nw ? sh[lane] : 0.0f;
        s = dsc_warp_sum(s);
        if (lane == 0) sh[0] = s;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float dsc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif /* __CUDACC__ */

#endif
