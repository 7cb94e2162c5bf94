/* kbench_cuda.h — the CUDA product kernels timed alone at V4-Flash's shapes,
 * next to cuBLAS (kbench_cuda.cu). For `dsv4 bench --kernels --backend cuda`. */
#ifndef DS_BENCH_KBENCH_CUDA_H
#define DS_BENCH_KBENCH_CUDA_H

#include <stddef.h>

#include "common/err.h"
#include "tensor/weight.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_cuda_kb_case {
    const char *name; /* the V4-Flash tensor the shape is taken from */
    ds_wkind kind;
    int rows, cols;
} ds_cuda_kb_case;

typedef struct ds_cuda_kb_row {
    ds_cuda_kb_case c;
    int T;               /* tokens: 1 (decode) or 512 (prefill) */
    double weight_bytes; /* codes + scales */
    double ms;           /* dsv4's product, per call (T = 1: cycling through copies of the weights
                            that together fill 3x the L2: read from HBM) */
    double warm_ms;      /* the same, one copy called again (its bytes in the L2 where they fit) */
    double blas_ms;      /* cuBLAS BF16 GemmEx of the same shape, per call */
    int blas_ok;
} ds_cuda_kb_row;

/* Runs every case at T = 1 and 512 on GPU `gpu` (reps calls each at T = 1,
 * a quarter as many at 512) into out (at most cap rows; *n_out set), the
 * device copy bandwidth (GB/s, read + written) into *copy_gbs, and into note
 * where cuBLAS came from or why there is no comparison. 0, or -1 with err. */
int ds_cuda_kernel_bench(int gpu, int reps, ds_cuda_kb_row *out, int cap, int *n_out, double *copy_gbs, char *note,
                         size_t nn, ds_err *err);

/* One link of a chain of dependent steps (kbench.cu kb_link / kb_barrier):
 * what it costs the GPU to finish one kernel and begin the next that reads
 * its writes, measured over a graph of 256 such kernels, or one grid barrier
 * in a persistent kernel. */
typedef struct ds_cuda_chain_row {
    const char *what;
    int blocks;
    double us; /* a link */
} ds_cuda_chain_row;

/* The chain rows on GPU `gpu` (at most cap; *n_out set). 0, or -1 with err. */
int ds_cuda_chain_bench(int gpu, ds_cuda_chain_row *out, int cap, int *n_out, ds_err *err);

/* A chain of FP8 K x K products, x of each the y of the one before
 * (kbench.cu kb_pchain): dsv4's product kernel once a product in a graph,
 * against one persistent kernel that streams each product's weights into
 * shared memory while the chain waits for the product before. */
typedef struct ds_cuda_pchain_row {
    int K, products;                   /* the chain: products through distinct matrices (3x the L2), cycled */
    double bytes;                      /* a product's codes + scales */
    double kernels_us, persistent_us;  /* a product, in the chain */
    double rel_diff;                   /* the chains' last y: max |difference| / max |y| */
} ds_cuda_pchain_row;

int ds_cuda_pchain_bench(int gpu, ds_cuda_pchain_row *out, int cap, int *n_out, ds_err *err);

#ifdef __cplusplus
}
#endif

#endif
