/* fma_peak.c — the CPU's fp32 FMA peak on its kernel path (dsv4 bench
 * --kernels holds prefill's products against it). */
#include <math.h>

#include "common/clock.h"
#include "backend/cpu/matmul/matmul_impl.h"

/* ---- the fp32 FMA peak that prefill's products are measured against ----
 * Twelve independent chains of fused multiply-adds per thread on the path's
 * widest vectors (the register tiles, tiles.c, keep about as many accumulators
 * in flight), timed over all of the backend's threads at once. */
enum { PEAK_CHAINS = 12, PEAK_ITEMS_PER_THREAD = 8 };
#define UNROLL_CHAINS _Pragma("GCC unroll 12") /* every chain in a register */

typedef struct {
    int path;
    long iters;
    int never; /* set only if a chain's sum were -1 (it is not): keeps the chains */
} fma_peak;

static float fma_chains_c(long iters) {
    float a[PEAK_CHAINS];
    for (int k = 0; k < PEAK_CHAINS; k++) a[k] = (float)k;
    for (long i = 0; i < iters; i++)
        UNROLL_CHAINS for (int k = 0; k < PEAK_CHAINS; k++) a[k] = fmaf(a[k], 0.999999f, 1e-7f);
    float s = 0;
    for (int k = 0; k < PEAK_CHAINS; k++) s += a[k];
    return s;
}

#ifdef DS_X86
static float fma_chains_avx2(long iters) {
    __m256 a[PEAK_CHAINS], m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    UNROLL_CHAINS for (int k = 0; k < PEAK_CHAINS; k++) a[k] = _mm256_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
        UNROLL_CHAINS for (int k = 0; k < PEAK_CHAINS; k++) a[k] = _mm256_fmadd_ps(a[k], m, b);
    __m256 s = a[0];
    UNROLL_CHAINS for (int k = 1; k < PEAK_CHAINS; k++) s = _mm256_add_ps(s, a[k]);
    return hsum8_avx(s);
}

AVX512 static float fma_chains_512(long iters) {
    __m512 a[PEAK_CHAINS], m = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    UNROLL_CHAINS for (int k = 0; k < PEAK_CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
        UNROLL_CHAINS for (int k = 0; k < PEAK_CHAINS; k++) a[k] = _mm512_fmadd_ps(a[k], m, b);
    __m512 s = a[0];
    UNROLL_CHAINS for (int k = 1; k < PEAK_CHAINS; k++) s = _mm512_add_ps(s, a[k]);
    return hsum16_512(s);
}
#endif

static int peak_lanes(int path) { return path == DS_CPU_AVX512 ? 16 : path == DS_CPU_AVX2 ? 8 : 1; }

static void fma_peak_item(void *ctx, int i) {
    fma_peak *f = ctx;
#ifdef DS_X86
    float s = f->path == DS_CPU_AVX512 ? fma_chains_512(f->iters)
              : f->path == DS_CPU_AVX2 ? fma_chains_avx2(f->iters)
                                       : fma_chains_c(f->iters);
#else
    float s = fma_chains_c(f->iters);
#endif
    (void)i;
    if (s == -1.0f) f->never = 1;
}

double ds_cpu_fma_gflops(const ds_backend *be) {
    const ds_cpu *c = ds_cpu_of(be);
    fma_peak f = {c->path, 0, 0};
    int items = PEAK_ITEMS_PER_THREAD * c->n_threads;
    double best = 0;
    for (long iters = 1 << 16;; iters *= 2) { /* until a round takes 50 ms; the best of three of those */
        f.iters = iters;
        double t0 = ds_now();
        ds_cpu_parallel_for(be, items, fma_peak_item, &f);
        double t = ds_now() - t0;
        double g = 2.0 * PEAK_CHAINS * peak_lanes(c->path) * (double)iters * items / t / 1e9;
        if (t < 0.05) continue;
        for (int k = 0; k < 2; k++) {
            t0 = ds_now();
            ds_cpu_parallel_for(be, items, fma_peak_item, &f);
            double gk = 2.0 * PEAK_CHAINS * peak_lanes(c->path) * (double)iters * items / (ds_now() - t0) / 1e9;
            if (gk > g) g = gk;
        }
        best = g;
        break;
    }
    return f.never ? 0 : best;
}
