/* cpu.h — the CPU backend (C11 + AVX2/FMA/F16C or AVX-512 + OpenMP).
 * Backend memory is host memory: weights are used in place (the mmap'd
 * checkpoint), activations and state are 64-byte aligned heap blocks.
 * Each op lives in the file of its paper section: matmul/ (the products:
 * dispatch.c and one file a kernel family), norm_rope.c
 * (embedding, RMSNorm, RoPE, row gather), mhc.c, compressor.c, indexer.c,
 * attention.c, moe.c; cpu.c holds memory, threads and scratch. */
#ifndef DS_CPU_H
#define DS_CPU_H

#include <stddef.h>

#include "backend/backend.h"
#include "backend/cpu/heuristics.h"

/* Fills be with the CPU backend (n_threads <= 0: all cores). 0, or -1 when
 * out of memory. be->close(be) releases it. */
int ds_backend_cpu_init(ds_backend *be, int n_threads);

/* The threads in use; set them (n <= 0: all cores) — between steps only. */
int ds_backend_cpu_threads(const ds_backend *be);
void ds_backend_cpu_set_threads(ds_backend *be, int n);
/* 1 when its row kernels prefetch the weights into L2 rather than L1
 * (heuristics.h: DS_CPU_PREFETCH_L2_BELOW_L1D). */
int ds_backend_cpu_prefetch_l2(const ds_backend *be);
/* Tests: act as on a core with an L1 data cache of l1d bytes (the prefetch
 * level and the one-token row pairs follow it; the same bits either way). */
void ds_backend_cpu_set_l1d(ds_backend *be, int l1d);

/* Whether bind keeps a packed copy of the BF16 weights the model multiplies
 * (bf16x.c: exact, the same bits, ~25% fewer bytes a product reads; read by
 * the AVX-512 path only). On by default where that path runs; the
 * environment's DSV4_CPU_PACK=0 turns it off at init. */
void ds_backend_cpu_set_pack(ds_backend *be, int on);

/* Tests: the n-th scratch allocation from now on (n >= 1) fails as if the
 * heap were exhausted; 0 disables. */
void ds_backend_cpu_fail_alloc(ds_backend *be, long n);

/* ---- inside the CPU backend ---- */

/* Grow-only scratch buffers, one per user (nested users never share one). */
enum { DS_SCR_MM, DS_SCR_MM_JOBS, DS_SCR_ATTN, DS_SCR_IDX, DS_SCR_MOE, DS_SCR_MOE_OUT, DS_SCR_HC, DS_SCR_COMP, DS_SCR_MISC, DS_SCR_N };

typedef struct ds_cpu_pool ds_cpu_pool; /* cpu.c: the worker threads */

typedef struct ds_cpu {
    int n_threads, path;
    int l1d;                    /* L1 data cache bytes per core (0: unknown; ds_cpu_l1d) */
    ds_cpu_pool *pool;          /* n_threads - 1 workers, or NULL (serial) */
    int in_region;              /* a parallel region is running */
    ds_step_desc step;          /* the current step (its arrays are the model's, valid during the step) */
    struct {
        void *p;
        size_t cap;
    } scr[DS_SCR_N];
    long fail_alloc;            /* tests: countdown to an injected failure */
    int pack;                   /* ds_backend_cpu_set_pack */
} ds_cpu;

/* The row kernels prefetch the weights into L2 rather than L1 (a small L1:
 * heuristics.h DS_CPU_PREFETCH_L2_BELOW_L1D). */
static inline int ds_cpu_pf_l2(const ds_cpu *c) { return c->l1d > 0 && c->l1d < DS_CPU_PREFETCH_L2_BELOW_L1D; }

/* bf16x.c: a BF16 matrix's packed copy (the layout is described there). */
typedef struct {
    uint32_t col;  /* an escape: a weight the 4-bit code cannot hold */
    uint16_t bits; /* its bf16 bits */
    uint16_t pad;
} ds_cpu_bf16x_esc;
typedef struct ds_cpu_bf16x {
    uint8_t *units;          /* [rows][cols / 64] units of 96 bytes */
    uint8_t *top;            /* [rows] P: the row's largest exponent >> 1 */
    uint64_t *esc;           /* [rows][nw] bit u: unit u holds an escape */
    uint64_t *eoff;          /* [rows + 1] the row's first escape in ents */
    ds_cpu_bf16x_esc *ents;  /* by row, then column */
    int nw;
} ds_cpu_bf16x;
/* Packs w (BF16, cols % 64 == 0; anything else, or a matrix whose escapes
 * would be too many, stays unpacked: 0). -1 when out of memory. */
int ds_cpu_bf16x_pack(const ds_backend *be, ds_weight *w, ds_err *err);
void ds_cpu_bf16x_release(const ds_backend *be, ds_weight *w);
/* The column that position b (0..63) of a unit holds. */
int ds_cpu_bf16x_column(int b);

static inline ds_cpu *ds_cpu_of(const ds_backend *be) { return (ds_cpu *)be->impl; }

/* A scratch block of at least `bytes` (64-byte aligned) for user `which`;
 * NULL when out of memory. Valid until the next call for the same user. */
void *ds_cpu_scratch(const ds_backend *be, int which, size_t bytes);

/* Runs fn(ctx, i) for i in [0, n) on the backend's threads (chunks to
 * whichever thread is free); each i must write only its own outputs (so
 * results cannot depend on which thread ran it). */
void ds_cpu_parallel_for(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx);
/* The same for copies and elementwise work of `floats` floats in all: a
 * parallel region from DS_CPU_PAR_FLOATS on, else i in order on the calling
 * thread. */
void ds_cpu_parallel_for_sized(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx, size_t floats);

/* The fixed-order dot product (8 lanes over chunks of 8 ... : matmul/dispatch.c's
 * dense order) used by every small reduction of the CPU ops. */
float ds_dot_f32(const float *a, const float *b, int n);
/* ds_dot_f32 through a chosen kernel path (the same bits on every path). */
float ds_cpu_dot(const float *a, const float *b, int n, int path);
/* RMSNorm of one row (the sum of squares through ds_dot_f32). */
void ds_cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* Interleaved RoPE on the last 2*half channels at position pos. */
void ds_cpu_rope(float *x, int dim, const float *inv_freq, int half, int64_t pos, int inverse);

/* Products (matmul/dispatch.c). */
int ds_cpu_matmul_many(const ds_backend *be, const ds_matmul_job *jobs, int n, ds_err *err);
int ds_cpu_matmul_grouped(const ds_backend *be, const ds_matmul_grouped *p, ds_err *err);
/* One product through a chosen kernel path (every path gives the same bits). */
int ds_cpu_matmul_path(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y, int path);
/* MXFP4 products quantize x per token (matmul/fp4_quant.c): the bytes of one token's
 * quantized x, and the quantizer (simd 0: the scalar definition; 1: the one
 * the kernels use, vectorized in SIMD builds — the same bytes). */
size_t ds_cpu_fp4_quantized_bytes(int K);
void ds_cpu_fp4_quantize(const float *x, int K, uint8_t *dst, int simd);
/* GFLOP/s of fp32 fused multiply-adds on this CPU's kernel path over all of
 * the backend's threads (12 independent chains each): the compute floor that
 * `dsv4 bench --kernels` holds prefill's products against. */
double ds_cpu_fma_gflops(const ds_backend *be);
/* One output through the portable path (tests compare; MXFP4: NaN when its
 * copy of the quantized x cannot be allocated). */
float ds_cpu_row_dot(const ds_weight *w, int r, const float *x);

/* The other ops, by file. */
int ds_cpu_embed(const ds_backend *be, const ds_embed_params *p, ds_err *err);
int ds_cpu_rmsnorm_op(const ds_backend *be, const ds_rmsnorm_params *jobs, int n, ds_err *err);
int ds_cpu_rope_op(const ds_backend *be, const ds_rope_params *p, ds_err *err);
int ds_cpu_gather(const ds_backend *be, const ds_gather_params *p, ds_err *err);
int ds_cpu_hc_pre(const ds_backend *be, const ds_hc_pre_params *p, ds_err *err);
int ds_cpu_hc_post(const ds_backend *be, const ds_hc_post_params *p, ds_err *err);
int ds_cpu_hc_head(const ds_backend *be, const ds_hc_head_params *p, ds_err *err);
int ds_cpu_compress(const ds_backend *be, const ds_compress_params *p, ds_err *err);
int ds_cpu_indexer(const ds_backend *be, const ds_indexer_params *p, ds_err *err);
int ds_cpu_attention(const ds_backend *be, const ds_attention_params *p, ds_err *err);
int ds_cpu_window_store(const ds_backend *be, const ds_window_store_params *p, ds_err *err);
int ds_cpu_route(const ds_backend *be, const ds_route_params *p, ds_err *err);
int ds_cpu_moe(const ds_backend *be, const ds_moe_params *p, ds_err *err);
int ds_cpu_moe_experts(const ds_backend *be, const ds_moe_experts_params *p, ds_err *err);
int ds_cpu_moe_combine(const ds_backend *be, const ds_moe_combine_params *p, ds_err *err);

#endif
