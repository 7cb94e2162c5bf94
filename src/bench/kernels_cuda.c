/* kernels_cuda.c — `dsv4 bench --kernels --backend cuda`: every
 * product kernel of the CUDA backend at V4-Flash's shapes, one token and 512,
 * with the weight bandwidth against the device copy floor (decode) or the
 * arithmetic rate (prefill), next to cuBLAS's BF16 GEMM of the same shape:
 * the ratio is what dsv4's fixed reduction order costs. No model needed. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/kbench_cuda.h"
#include "runtime/backend_select.h"

#ifndef DSV4_HAVE_CUDA
/* A build without the CUDA backend: each entry point of kbench_cuda.h fails
 * naming the backends the build has. */
static int no_cuda(ds_err *err) {
    return ds_fail(err, "backend 'cuda': this build has no CUDA backend (built: %s; configure with -DDSV4_CUDA=ON)",
                   ds_backends_built());
}

int ds_cuda_kernel_bench(int gpu, int reps, ds_cuda_kb_row *out, int cap, int *n, double *copy_gbs, char *note,
                         size_t nn, ds_err *err) {
    (void)gpu, (void)reps, (void)out, (void)cap, (void)copy_gbs, (void)note, (void)nn;
    *n = 0;
    return no_cuda(err);
}

int ds_cuda_chain_bench(int gpu, ds_cuda_chain_row *out, int cap, int *n, ds_err *err) {
    (void)gpu, (void)out, (void)cap;
    *n = 0;
    return no_cuda(err);
}

int ds_cuda_pchain_bench(int gpu, ds_cuda_pchain_row *out, int cap, int *n, ds_err *err) {
    (void)gpu, (void)out, (void)cap;
    *n = 0;
    return no_cuda(err);
}
#endif

static const char *kind_name(ds_wkind k) {
    static const char *n[] = {"F32", "BF16", "F16", "FP8", "MXFP4"};
    return (unsigned)k < 5 ? n[k] : "?";
}

int cmd_bench_kernels_cuda(const char *backend, int gpu, int reps) {
    if (strcmp(backend, "cuda")) {
        fprintf(stderr, "dsv4 bench --kernels: --backend %s: unknown backend (cpu or cuda)\n", backend);
        return 2;
    }
    ds_cuda_kb_row rows[32];
    int n = 0;
    double copy = 0;
    char note[512];
    ds_err err = {0};
    if (ds_cuda_kernel_bench(gpu, reps, rows, 32, &n, &copy, note, sizeof note, &err)) {
        fprintf(stderr, "dsv4 bench --kernels: %s\n", err.msg);
        return 1;
    }
    printf("floor      device copy %.0f GB/s (1 GiB read + written, best of 5)\n", copy);
    printf("cuBLAS     %s\n", note);
    printf("%-10s %-6s %-13s %4s %9s %9s %6s %8s | %9s %6s | %9s %9s\n", "kernel", "kind", "shape", "T", "ms", "GB/s",
           "floor", "TFLOP/s", "cuBLAS ms", "ratio", "warm ms", "warm GB/s");
    for (int i = 0; i < n; i++) {
        const ds_cuda_kb_row *r = &rows[i];
        char shape[32];
        snprintf(shape, sizeof shape, "%dx%d", r->c.rows, r->c.cols);
        double gbs = r->weight_bytes / (r->ms * 1e-3) / 1e9;
        double tf = 2.0 * r->c.rows * (double)r->c.cols * r->T / (r->ms * 1e-3) / 1e12;
        printf("%-10s %-6s %-13s %4d %9.4f %9.0f %6.2f %8.2f | ", r->c.name, kind_name(r->c.kind), shape, r->T, r->ms,
               gbs, gbs / copy, tf);
        if (r->blas_ok) printf("%9.4f %6.2f | ", r->blas_ms, r->warm_ms / r->blas_ms);
        else printf("%9s %6s | ", "-", "-");
        if (r->T == 1) printf("%9.4f %9.0f\n", r->warm_ms, r->weight_bytes / (r->warm_ms * 1e-3) / 1e9);
        else printf("%9s %9s\n", "", "");
    }
    printf("T = 1: dsv4's call cycles through copies of the weights (3x the L2 together), so each reads HBM;\n"
           "warm: one copy called again, its bytes in the L2 where they fit (what a step would gain from weights\n"
           "already in the L2). T = 512 and cuBLAS: one copy.\n");
    printf("ratio = dsv4's warm time / cuBLAS's (one copy each; cuBLAS reads BF16: 2 bytes per weight, dsv4 the\n"
           "stored kind)\n");
    ds_cuda_chain_row ch[8];
    ds_cuda_pchain_row pc[4];
    int nc = 0, np = 0;
    if (ds_cuda_chain_bench(gpu, ch, 8, &nc, &err) || ds_cuda_pchain_bench(gpu, pc, 4, &np, &err)) {
        fprintf(stderr, "dsv4 bench --kernels: %s\n", err.msg);
        return 1;
    }
    printf("chain      one link of a chain of dependent steps (a graph of 256 kernels, each reading the one before's\n"
           "           writes; or grid barriers in one kernel), the least a step pays per kernel it runs in order\n");
    for (int i = 0; i < nc; i++)
        printf("  %7.2f us  %s (%d block%s)\n", ch[i].us, ch[i].what, ch[i].blocks, ch[i].blocks == 1 ? "" : "s");
    printf("products   chained FP8 K x K products (x of each the y before; distinct matrices cycled, 3x the L2):\n"
           "           dsv4's product kernel once a product (a graph, programmatic launch) against one persistent\n"
           "           kernel streaming each product's rows into shared memory while the chain waits (a sketch:\n"
           "           plain fp32 sums, not dsv4's bits)\n");
    printf("  %5s %8s %6s | %10s %8s | %10s %8s | %8s | %9s\n", "K", "MB", "chain", "kernels us", "GB/s",
           "persist us", "GB/s", "floor us", "rel diff");
    for (int i = 0; i < np; i++) {
        const ds_cuda_pchain_row *r = &pc[i];
        printf("  %5d %8.2f %6d | %10.2f %8.0f | %10.2f %8.0f | %8.2f | %9.2e\n", r->K, r->bytes / 1e6, r->products,
               r->kernels_us, r->bytes / (r->kernels_us * 1e-6) / 1e9, r->persistent_us,
               r->bytes / (r->persistent_us * 1e-6) / 1e9, r->bytes / (copy * 1e9) * 1e6, r->rel_diff);
    }
    printf("floor us = the product's bytes at the device copy rate above; kernels / persist us: a product's share of\n"
           "the chain's time\n");
    return fflush(stdout) || ferror(stdout) ? 1 : 0;
}
