/* kernels.c — `dsv4 bench --kernels`: each decode kernel against
 * the plain read of the same memory.
 *
 * One buffer (1 GiB by default) is read by the bandwidth test, then read as
 * the weights of one product per storage kind and row length (one token, as
 * in decode), so every ratio compares the same physical pages at nearly the
 * same moment (this VM's bandwidth changes over seconds). No model needed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "bench/bench.h"
#include "bench/readbw.h"
#include "cli/opts.h"
#include "cli/util.h"

typedef struct {
    const char *name;
    ds_wkind kind;
    int cols;
} kernel_case;

typedef struct {
    long long reps, mib, tokens;
    int kernels;
} kernels_args;

/* prefill's products: a shape of the flash model at T tokens */
typedef struct {
    const char *name;
    ds_wkind kind;
    int rows, cols, T; /* T 0: the --tokens count */
} prefill_case;

static const cli_opt kernels_opts[] = {
    CLI_FLAG_OPT("--kernels", NULL, kernels_args, kernels, "this benchmark (instead of the model's)"),
    CLI_LONG_OPT("--reps", NULL, kernels_args, reps, 1, 1000, "R",
                 "repetitions (default 3; --backend cuda: calls per product, default 20, a quarter at 512 tokens)"),
    CLI_LONG_OPT("--mib", NULL, kernels_args, mib, 64, 1 << 20, "M", "the buffer's size in MiB (default 1024)"),
    CLI_LONG_OPT("--tokens", NULL, kernels_args, tokens, 1, 1024, "T",
                 "tokens of the prefill products (default 128; the experts' also at 3, prefill's mean)"),
    CLI_END,
};

/* The experts as a prefill meets them: T = 1..4 tokens each (a 128-token
 * prefill gives an expert 3 on average) through 64 2048 x 4096 MXFP4
 * matrices in one batch, read from DRAM (distinct spans of the buffer, fresh
 * ones each try) and from the last-level cache (one 4 MiB matrix 64 times).
 * Prints the weights' GB/s of each, best of three: what the products' compute
 * allows (cache) and what the DRAM case keeps of it. */
static int bench_experts(ds_backend *be, const uint8_t *buf, size_t n, const uint8_t *scales, const float *x,
                         int rep, ds_err *err) {
    enum { R = 2048, K = 4096, MAXT = 4, NE = 64 };
    const size_t mb = (size_t)R * K / 2;
    if (n < 2 * mb) return 0;
    ds_weight ws[NE];
    ds_matmul_job js[NE];
    float *ys = malloc(sizeof(float) * R * MAXT * NE);
    if (!ys) return ds_fail(err, "out of memory for the experts' case");
    printf("experts %-3d %d x %dx%d MXFP4 in one batch, weights' GB/s from DRAM / from the last-level cache:", rep,
           NE, R, K);
    for (int T = 1; T <= MAXT; T++) {
        double best[2] = {1e30, 1e30};
        for (int cached = 0; cached < 2; cached++)
            for (int k = 0; k < 3; k++) {
                for (int e = 0; e < NE; e++) {
                    size_t o = cached ? 0 : ((size_t)(k * NE + e) * mb) % (n - mb + 1) / 64 * 64;
                    ws[e] = (ds_weight){.kind = DS_W_FP4, .rows = R, .cols = K, .data = buf + o, .scale = scales + o / 16};
                    ws[e].scale_cols = K / 32;
                    js[e] = (ds_matmul_job){&ws[e], x, T, ys + (size_t)e * R * MAXT};
                }
                double t0 = ds_now();
                if (be->matmul_many(be, js, NE, err)) {
                    free(ys);
                    return 1;
                }
                double dt = ds_now() - t0;
                if (dt < best[cached]) best[cached] = dt;
            }
        printf(" | T=%d %.1f / %.1f", T, (double)mb * NE / best[0] / 1e9, (double)mb * NE / best[1] / 1e9);
    }
    printf("\n");
    free(ys);
    return 0;
}

/* Prefill's products (the flash model's shapes) at T tokens, and the experts'
 * at 3 tokens (128 tokens x 6 experts over 256: a prefill's mean per
 * expert), from the start of the buffer: GFLOP/s, best of three, against the
 * FMA peak measured in the same round. */
static int bench_prefill(ds_backend *be, uint8_t *buf, size_t n, uint8_t *scales, const float *x, float *y, int T,
                         int reps, ds_err *err) {
    static const prefill_case cases[] = {
        {"FP8 4096x4096", DS_W_FP8, 4096, 4096, 0},   {"FP8 32768x1024", DS_W_FP8, 32768, 1024, 0},
        {"FP8 4096x8192", DS_W_FP8, 4096, 8192, 0},   {"MXFP4 2048x4096", DS_W_FP4, 2048, 4096, 0},
        {"MXFP4 2048x4096", DS_W_FP4, 2048, 4096, 3}, {"MXFP4 4096x2048", DS_W_FP4, 4096, 2048, 3},
        {"BF16 4096x4096", DS_W_BF16, 4096, 4096, 0}};
    enum { NCASES = sizeof cases / sizeof cases[0] };
    printf("prefill    products of %d tokens (the experts' also of 3): GFLOP/s (ratio to the fp32 FMA peak)\n", T);
    for (int rep = 0; rep < reps; rep++) {
        double peak = ds_cpu_fma_gflops(be);
        printf("peak %-5d  %.1f GFLOP/s", rep + 1, peak);
        for (int c = 0; c < NCASES; c++) {
            const prefill_case *pc = &cases[c];
            int t = pc->T ? pc->T : T;
            ds_weight w = {.kind = pc->kind, .rows = pc->rows, .cols = pc->cols, .data = buf, .scale = scales};
            w.scale_cols = pc->kind == DS_W_FP8 ? (pc->cols + 127) / 128 : pc->cols / 32;
            double t_best = 1e30;
            for (int k = 0; k < 3; k++) {
                double t0 = ds_now();
                if (ds_matmul(be, &w, x, t, y, err)) return 1;
                double dt = ds_now() - t0;
                if (dt < t_best) t_best = dt;
            }
            double g = 2.0 * pc->rows * (double)pc->cols * t / t_best / 1e9;
            printf(" | %s T=%d %.1f (%.2f)", pc->name, t, g, g / peak);
        }
        printf("\n");
        if (bench_experts(be, buf, n, scales, x, rep + 1, err)) return 1;
        fflush(stdout);
    }
    return 0;
}

int cmd_bench_kernels(int argc, char **argv) {
    kernels_args ka = {.reps = 3, .mib = 1024, .tokens = 128};
    ds_backend_opts bo = {.name = "cpu", .threads = 2};
    const cli_group groups[] = {
        {NULL, kernels_opts, &ka}, {NULL, cli_threads_opts, &bo}, {"backend", cli_backend_opts, &bo}};
    const cli_cmd cmd = {
        "bench --kernels",
        "[--threads N] [--reps R] [--mib M] [--tokens T] [--backend cuda [--gpu N]]",
        "Reads an M MiB buffer R times: the plain read, then as BF16 (and through its packed "
        "12-bit copy),\nFP8 and MXFP4 weights of decode's row lengths; prints GB/s and the ratio "
        "of each kernel to the\nread of the same memory (packed: of its own bytes, then the BF16 "
        "bytes per second it makes).\nThen prefill's products at T tokens: GFLOP/s against this CPU's fp32 FMA peak "
        "(measured).\nWith --backend cuda: each CUDA product at V4-Flash's shapes, 1 and 512 tokens, "
        "against the device\ncopy bandwidth (one token: from HBM, and warm from the L2), next to cuBLAS BF16 "
        "GemmEx of the\nsame shape; then what one link of a chain of dependent kernels costs, and a chain of FP8 "
        "products\nthrough dsv4's kernels against a persistent sketch that streams their weights ahead of the "
        "chain.\n",
        "--threads defaults to 2 here.\n",
        groups,
        3};
    int crc;
    ka.reps = 0;
    if (cli_parse(&cmd, argc, argv, &crc)) return crc;
    if (bo.name && strcmp(bo.name, "cpu")) return cmd_bench_kernels_cuda(bo.name, bo.gpu, ka.reps ? (int)ka.reps : 20);
    if (!ka.reps) ka.reps = 3;
    long long reps = ka.reps, mib = ka.mib;
    size_t n = (size_t)mib << 20;
    uint8_t *buf = aligned_alloc(64, n), *scales = malloc(n / 16);
    /* x: T tokens of the longest row (8192), and at least the experts' 4 x 4096 */
    size_t T = (size_t)ka.tokens, ny = n / 1024 > 32768 * T ? n / 1024 : 32768 * T, nx = 8192 * (T > 2 ? T : 2);
    float *x = aligned_alloc(64, sizeof(float) * nx), *y = malloc(sizeof(float) * ny);
    if (!buf || !scales || !x || !y) {
        fprintf(stderr, "dsv4 bench --kernels: out of memory for a %lld MiB buffer\n", mib);
        free(buf), free(scales), free(x), free(y);
        return 1;
    }
    /* finite values of every kind: even bytes random but for e4m3 NaN and
     * subnormal codes, odd bytes 0x3c/0x3d (BF16 values near 0.01, valid FP8
     * and MXFP4 codes). No subnormals: the AVX-512 FP8 path reads e4m3 fields
     * as fp32 bit patterns (value * 2^-120), where a subnormal code is a
     * denormal float, and an FMA with a denormal input runs ~80x slower on
     * Intel cores (one in 16 random codes: the FP8 rows read at ~0.07 of the
     * plain read). Checkpoints' FP8 weights have few such codes. */
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        uint8_t b = (uint8_t)r;
        b = (b & 0x78) ? b : (uint8_t)(b | 0x08);                    /* exponent field >= 1 */
        buf[i] = i & 1 ? (uint8_t)(0x3c + (b & 1)) : (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b; /* not NaN */
    }
    for (size_t i = 0; i < n / 16; i++) scales[i] = (uint8_t)(120 + i % 8);
    for (size_t i = 0; i < nx; i++) x[i] = (float)(i % 13) * 0.1f - 0.5f;
    ds_backend be;
    ds_err err;
    if (ds_backend_open(&bo, &be, &err)) {
        fprintf(stderr, "dsv4 bench --kernels: %s\n", err.msg);
        free(buf), free(scales), free(x), free(y);
        return 1;
    }
    int n_threads = ds_backend_cpu_threads(&be);

    static const kernel_case cases[] = {{"BF16 K=4096", DS_W_BF16, 4096}, {"packed", DS_W_BF16, 4096},
                                        {"FP8 K=1024", DS_W_FP8, 1024},   {"FP8 K=4096", DS_W_FP8, 4096},
                                        {"FP8 K=8192", DS_W_FP8, 8192},   {"MXFP4 K=2048", DS_W_FP4, 2048},
                                        {"MXFP4 K=4096", DS_W_FP4, 4096}};
    enum { NCASES = sizeof cases / sizeof cases[0] };
    printf("kernels    %d threads, one %lld MiB buffer, one token (decode), weights prefetched into %s\n", n_threads,
           mib, ds_backend_cpu_prefetch_l2(&be) ? "L2" : "L1");
    int rc = 0;
    double sink = 0;
    for (long long rep = 0; rep < reps && !rc; rep++) {
        double best = 0;
        for (int k = 0; k < 3; k++) {
            double t0 = ds_now();
            sink += readbw_sum((const float *)(const void *)buf, n / sizeof(float), n_threads);
            double g = (double)n / (ds_now() - t0) / 1e9;
            if (g > best) best = g;
        }
        printf("read %-5lld  %.1f GB/s", rep + 1, best);
        for (int c = 0; c < NCASES && !rc; c++) {
            const kernel_case *kc = &cases[c];
            ds_weight w = {.kind = kc->kind, .cols = kc->cols, .data = buf, .scale = scales};
            size_t row = kc->kind == DS_W_BF16  ? 2 * (size_t)kc->cols
                         : kc->kind == DS_W_FP8 ? (size_t)kc->cols
                                                : (size_t)kc->cols / 2;
            w.rows = (int)(n / row);
            w.scale_cols = kc->kind == DS_W_FP8 ? (kc->cols + 127) / 128 : kc->cols / 32;
            if (!strcmp(kc->name, "packed")) { /* the same BF16 weights through their packed copy (bf16x.c) */
                if (!be.pack_weight || (!(rc = be.pack_weight(&be, &w, &err)) && !w.packed))
                    continue; /* this CPU's path reads no packed copy */
                if (rc) break;
            }
            double t_best = 1e30;
            for (int k = 0; k < 3 && !rc; k++) {
                double t0 = ds_now();
                rc = ds_matmul(&be, &w, x, 1, y, &err);
                double t = ds_now() - t0;
                if (t < t_best) t_best = t;
            }
            double g = (double)ds_weight_read_bytes(&w) / t_best / 1e9;
            printf(" | %s %.1f (%.2f)", kc->name, g, g / best);
            if (w.packed) { /* its weights per second, as BF16 bytes: the speed-up over BF16 */
                printf(" = BF16 %.1f", (double)ds_weight_bytes(&w) / t_best / 1e9);
                be.release_weight(&be, &w);
            }
        }
        printf("\n");
        fflush(stdout);
    }
    if (!rc) rc = bench_prefill(&be, buf, n, scales, x, y, (int)T, (int)reps, &err);
    if (rc) fprintf(stderr, "dsv4 bench --kernels: %s\n", err.msg);
    ds_backend_close(&be);
    if (sink == -1) printf("\n"); /* keeps the reads */
    free(buf);
    free(scales);
    free(x);
    free(y);
    return rc ? 1 : 0;
}
