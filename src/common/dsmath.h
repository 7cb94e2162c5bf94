/* dsmath.h — elementwise functions with the same bits on every device.
 *
 * libm's expf (CPU) and CUDA's expf differ in the last bit for some inputs,
 * so an op that uses them cannot give the CPU's bits on the GPU. ds_expf is
 * built from operations IEEE 754 defines exactly — double products, fused
 * multiply-adds and rounding to fp32 — so every compiler and device computes
 * the same value (C: -ffp-contract=off; CUDA: --fmad=false, no fast math). It
 * is within one fp32 ulp of exp(x) (a degree-10 polynomial for 2^r on |r| <=
 * 1/2, relative error < 2^-45 before the one rounding to fp32). Header-only:
 * host C and CUDA device code include it alike. */
#ifndef DS_COMMON_DSMATH_H
#define DS_COMMON_DSMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DS_HD __host__ __device__
#else
#define DS_HD
#endif

/* exp(x) rounded to fp32: x = (k + r) ln 2 with k = rint(x / ln 2) and |r| <= 1/2
 * (in double); 2^r by Horner's rule in fma; times 2^k (exact in double);
 * one rounding to fp32 (which also makes the subnormal results). */
static inline DS_HD float ds_expf(float x) {
    if (x != x) return x + x;              /* NaN */
    if (x > 88.8f) return (float)INFINITY; /* exp(88.8) > FLT_MAX */
    if (x < -104.0f) return 0.0f;          /* below half the smallest subnormal */
    double z = (double)x * 1.4426950408889634, k = rint(z), t = (z - k) * 0.6931471805599453;
    double p = 1.0 / 3628800.0;
    p = fma(p, t, 1.0 / 362880.0);
    p = fma(p, t, 1.0 / 40320.0);
    p = fma(p, t, 1.0 / 5040.0);
    p = fma(p, t, 1.0 / 720.0);
    p = fma(p, t, 1.0 / 120.0);
    p = fma(p, t, 1.0 / 24.0);
    p = fma(p, t, 1.0 / 6.0);
    p = fma(p, t, 0.5);
    p = fma(p, t, 1.0);
    p = fma(p, t, 1.0);
    uint64_t b = (uint64_t)((int64_t)k + 1023) << 52; /* 2^k, k in [-151, 129] */
    double s;
    memcpy(&s, &b, 8);
    return (float)(p * s);
}

/* The experts' clamped SwiGLU (paper §2.1): min(a, L) silu'd, times b clamped
 * to [-L, L]; the same operations on every backend. */
static inline DS_HD float ds_swiglu(float a, float b, float L) {
    float g = a < L ? a : L;
    float u = b < -L ? -L : b > L ? L : b;
    return g / (1.0f + ds_expf(-g)) * u;
}

#endif
