/* matmul.c — CPU matrix products on weights kept in their storage format.
 *
 * The reduction order of one output y[t][r] is fixed by the weight's shape
 * alone. Vectors have 16 lanes; "fma" is a fused multiply-add; accumulators
 * start at 0; a partial last 16-column chunk is zero-padded.
 *  - dense (F32/BF16/F16): chunk c goes to P[c % 4] = fma(W_c, X_c, P[c % 4]);
 *    y = hsum((P0 + P1) + (P2 + P3)).
 *  - FP8 (128-column blocks, fp16-decoded codes = value/256, exact): inside
 *    block b, chunk j goes to B[j % 2]; A[b % 2] = fma(B0 + B1, scale_b*256,
 *    A[b % 2]); y = hsum(A0 + A1). (The AVX-512 path places the e4m3 fields
 *    in fp32 bit patterns, value * 2^-120, against x * 2^112: the same
 *    products, so the same bits, whenever that scaling of x is exact.)
 *  - MXFP4 (32-column groups) is an exact integer product per group, so only
 *    the fp32 sum over groups has an order. x is quantized once per token
 *    (fp4_quantize_x, the same code for every path and for the GPU: docs/
 *    numerics.md): per group a power-of-two step s = 2^e, e the smallest with
 *    max|x| <= 127 s (e >= -109, so s * 2^-17 is a normal float), v =
 *    rint(x * 2^(16 - e)) (|v| <= 127 * 2^16) written as three signed base-
 *    256 digits v = 65536 hi + 256 lo + lo2 (each in [-128, 127]), so x ~
 *    s v / 2^16 to within s / 2^17 (~2^-24 of the group's max). With the
 *    weights' codes doubled (integers w2 in {0, +-1, +-2, +-3, +-4, +-6, +-8,
 *    +-12}), a group's H = sum(w2 * (256 hi + lo)) and L = sum(w2 * lo2) are
 *    exact integers (|H| < 2^24, |L| < 2^16) in any order of summation, and
 *    S = fma((float)H, 256, (float)L) is sum(w2 * v) rounded once to fp32.
 *    Groups go 16 at a time (a 512-column span m); lane l = 4q + p of one
 *    16-lane accumulator A takes group 16m + 4p + q, m ascending: A[l] =
 *    fma(S, f, A[l]) with f = ws * sx (one fp32 product: ws the weight's
 *    group scale, sx = s * 2^-17); y = hsum(A). A group holding a NaN or an
 *    infinity has sx = NaN (y is NaN), an all-zero group sx = 0, groups past
 *    the last (a partial span) add nothing. E8M0 scale 255 reads as NaN, 0
 *    as 2^-127 (ds_e8m0_to_f32's values).
 *  - hsum(v) = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) with a_i = v_i + v_{i+8}.
 * Several independent chains keep one row's reduction from waiting on FMA
 * latency, so a thread can stream one row at a time (one memory stream).
 * The portable path computes exactly these operations; the AVX2 path holds a
 * 16-lane vector in two 8-lane registers and the AVX-512 path in one, so all
 * three give the same bits. Nothing depends on T, on the thread count or on
 * the path the CPU supports. The SIMD kernels may compute several tokens
 * (AVX-512: and two rows) per call, sharing weight decodes and x loads, and
 * FP8 products of many tokens run as register tiles (AVX-512 2 rows x 3
 * tokens, AVX2 2 x 2) over pre-decoded panels (group_tiled_on), BF16 ones
 * too on AVX-512 (4 x 3, the dense order's four chains each); BF16
 * weights with a packed copy (bf16x.c) are read from it, decoded to the same
 * values; each (row, token) still goes through exactly the operations above. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/clock.h"

#define NT DS_CPU_NT

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DS_X86 1
#include <immintrin.h>
#endif

/* ---- scalar decoders (the same values as the SIMD decoders) ---- */

/* E8M0 -> float: 2^(e-127); e = 0 gives 2^-127, e = 255 NaN (the OCP value). */
static inline float e8m0(uint8_t e) {
    uint32_t u = e == 0 ? 0x00400000u : e == 255 ? 0x7FC00000u : (uint32_t)e << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float scale_of(const ds_weight *w, size_t i) {
    if (w->scale_f32) {
        float f;
        memcpy(&f, w->scale + 4 * i, 4);
        return f;
    }
    return e8m0(w->scale[i]);
}

/* fp8 e4m3 byte -> the fp16 with the same fields: value / 256, exact. */
static inline uint16_t fp8_as_f16(uint8_t b) { return (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)); }

/* E2M1 code -> high byte of its fp16 (the low byte is 0). */
static const uint8_t e2m1_f16_hi[16] = {0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46,
                                        0x80, 0xB8, 0xBC, 0xBE, 0xC0, 0xC2, 0xC4, 0xC6};

static inline float elem(const ds_weight *w, const uint8_t *row, int c) {
    uint16_t h;
    switch (w->kind) {
    case DS_W_F32: {
        float f;
        memcpy(&f, row + 4 * (size_t)c, 4);
        return f;
    }
    case DS_W_BF16: memcpy(&h, row + 2 * (size_t)c, 2); return ds_bf16_to_f32(h);
    case DS_W_F16: memcpy(&h, row + 2 * (size_t)c, 2); return ds_f16_to_f32(h);
    case DS_W_FP8: return ds_f16_to_f32(fp8_as_f16(row[c]));
    case DS_W_FP4: {
        uint8_t b = row[c / 2];
        return ds_f16_to_f32((uint16_t)(e2m1_f16_hi[(c & 1) ? (b >> 4) : (b & 15)] << 8));
    }
    }
    return 0.0f;
}

static inline size_t row_bytes(const ds_weight *w) {
    switch (w->kind) {
    case DS_W_F32: return 4 * (size_t)w->cols;
    case DS_W_BF16:
    case DS_W_F16: return 2 * (size_t)w->cols;
    case DS_W_FP8: return (size_t)w->cols;
    case DS_W_FP4: return (size_t)w->cols / 2;
    }
    return 0;
}

static inline size_t fp8_srow(const ds_weight *w, int r) {
    return (size_t)((w->srow0 + r) / DS_FP8_BLOCK) * (size_t)w->scale_cols;
}

/* ---- the portable reference path ---- */

typedef struct {
    float v[16];
} l16;

static inline void l16_fma(l16 *acc, const float *a, const float *b) {
    for (int i = 0; i < 16; i++) acc->v[i] = fmaf(a[i], b[i], acc->v[i]);
}

static inline l16 l16_add(l16 a, const l16 *b) {
    for (int i = 0; i < 16; i++) a.v[i] += b->v[i];
    return a;
}

static inline float hsum16(const float *v) {
    float a[8], h[4], g[2];
    for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) h[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) g[i] = h[i] + h[i + 2];
    return g[0] + g[1];
}

/* chunk c of [c0, c0+len) goes to p[c % nchains] */
static void chunks_generic(const ds_weight *w, const uint8_t *row, const float *x, int c0, int len, l16 *p,
                           int nchains) {
    for (int i = 0; i < nchains; i++) memset(&p[i], 0, sizeof p[i]);
    for (int j = 0, c = 0; j < len; j += 16, c++) {
        float tw[16] = {0}, tx[16] = {0};
        for (int i = 0; i < 16 && j + i < len; i++) {
            tw[i] = elem(w, row, c0 + j + i);
            tx[i] = x[c0 + j + i];
        }
        l16_fma(&p[c % nchains], tw, tx);
    }
}

/* ---- MXFP4: x quantized per group, exact integer products ----
 * The quantized x of one token ("Q4 layout"), per 512-column span m (16
 * groups), Q4_SPAN_BYTES bytes: for each 128-column block p = 0..3 six
 * 64-byte vectors hiL, hiH, loL, loH, l2L, l2H (the digits hi, lo, lo2),
 * byte 16q + k of each L vector holding column 128p + 32q + 2k (the low
 * nibble of weight byte 64p + 16q + k) and of each H vector column 128p +
 * 32q + 2k + 1 (its high nibble); then int32 CH[16], int32 CL[16] and float
 * sx[16] in lane order (lane 4q + p: group 4p + q of the span), CH = 12 *
 * sum(256 hi + lo) and CL = 12 * sum(lo2) over the group (the SIMD kernels
 * multiply unsigned codes w2 + 12 and subtract them). Columns and groups
 * past K are zero. */
#define Q4_SPAN 512
#define Q4_BLK 384                 /* one 128-column block's six vectors */
#define Q4_CH (4 * Q4_BLK)         /* CH[16] */
#define Q4_CL (Q4_CH + 64)         /* CL[16] */
#define Q4_SX (Q4_CL + 64)         /* sx[16] */
#define Q4_SPAN_BYTES (Q4_SX + 64) /* 1728 */
#define Q4_EMIN (-109)             /* smallest group step exponent: s * 2^-17 stays normal */

static inline int q4_spans(int K) { return (K + Q4_SPAN - 1) / Q4_SPAN; }

/* Floats (4-byte units) of one token's Q4 layout. */
static inline size_t q4_floats(int K) { return (size_t)q4_spans(K) * (Q4_SPAN_BYTES / 4); }

/* The step exponent e of a group from the bits of max|x| (finite, > 0):
 * max = mant * 2^k, mant in [0.5, 1); e = k - 7 when mant <= 127/128, else
 * k - 6; at least Q4_EMIN (subnormal maxima land there too). */
static inline int q4_exp(uint32_t abits) {
    int E = (int)(abits >> 23), e = (abits & 0x7FFFFFu) <= 63u << 17 ? E - 133 : E - 132;
    return e < Q4_EMIN ? Q4_EMIN : e;
}

static inline float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Group g's CH, CL and sx into its span's lane tables. */
static inline void q4_put(uint8_t *span, int g, int32_t ch, int32_t cl, float sx) {
    int lane = 4 * (g % 4) + (g % 16) / 4;
    memcpy(span + Q4_CH + 4 * lane, &ch, 4);
    memcpy(span + Q4_CL + 4 * lane, &cl, 4);
    memcpy(span + Q4_SX + 4 * lane, &sx, 4);
}

/* The signed low byte of v (its base-256 digit in [-128, 127]). */
static inline int32_t q4_digit(int32_t v) {
    int32_t d = (int32_t)((uint32_t)v & 255u);
    return d > 127 ? d - 256 : d;
}

/* Quantizes one token's x (K % 32 == 0) into the Q4 layout at dst: the
 * scalar definition. t = x * 2^(16 - e) is one product by a power of two
 * (exact unless it underflows: then rounded, as IEEE defines, and rint
 * gives 0 either way); rint rounds to nearest even (the default mode); the
 * digits are exact integer arithmetic, so the SIMD version (and the GPU's
 * quantizer) computes the same bytes. */
static void fp4_quantize_x_c(const float *x, int K, uint8_t *dst) {
    int G = K / DS_FP4_GROUP;
    memset(dst, 0, (size_t)q4_spans(K) * Q4_SPAN_BYTES);
    for (int g = 0; g < G; g++) {
        const float *xg = x + (size_t)g * DS_FP4_GROUP;
        uint8_t *span = dst + (size_t)(g / 16) * Q4_SPAN_BYTES, *blk = span + Q4_BLK * ((g % 16) / 4);
        int q = g % 4;
        uint32_t amax = 0; /* the largest |x| as bits: above 0x7F800000 - 1 when a NaN or inf is present */
        for (int j = 0; j < DS_FP4_GROUP; j++) {
            uint32_t u;
            memcpy(&u, &xg[j], 4);
            u &= 0x7FFFFFFFu;
            amax = u > amax ? u : amax;
        }
        if (amax >= 0x7F800000u || amax == 0) {
            q4_put(span, g, 0, 0, amax ? NAN : 0.0f);
            continue;
        }
        int e = q4_exp(amax);
        float mul = f32_of((uint32_t)(127 + 16 - e) << 23);
        int32_t ch = 0, cl = 0;
        for (int j = 0; j < DS_FP4_GROUP; j++) {
            int32_t v = (int32_t)lrintf(xg[j] * mul);
            int32_t l2 = q4_digit(v), v1 = (v - l2) / 256, lo = q4_digit(v1), hi = (v1 - lo) / 256;
            int at = 16 * q + j / 2 + (j & 1) * 64; /* L or H vector */
            blk[at] = (uint8_t)(hi & 255);
            blk[at + 128] = (uint8_t)(lo & 255);
            blk[at + 256] = (uint8_t)(l2 & 255);
            ch += 256 * hi + lo;
            cl += l2;
        }
        q4_put(span, g, 12 * ch, 12 * cl, f32_of((uint32_t)(127 + e - 17) << 23));
    }
}

#ifdef DS_X86
/* fp4_quantize_x_c with 8-lane vectors (the same operations, so the same
 * bytes): a group's even and odd columns in 4 registers, cvtps2dq rounding
 * to nearest even, the digits by sign-extending shifts (v - lo2 and v1 - lo
 * are multiples of 256: the arithmetic shift divides them exactly), packs
 * (no saturation: every digit is in [-128, 127]). */
static void fp4_quantize_x_avx2(const float *x, int K, uint8_t *dst) {
    int G = K / DS_FP4_GROUP;
    memset(dst, 0, (size_t)q4_spans(K) * Q4_SPAN_BYTES);
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), pk = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int g = 0; g < G; g++) {
        const float *xg = x + (size_t)g * DS_FP4_GROUP;
        uint8_t *span = dst + (size_t)(g / 16) * Q4_SPAN_BYTES, *blk = span + Q4_BLK * ((g % 16) / 4);
        int q = g % 4;
        __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8), x2 = _mm256_loadu_ps(xg + 16),
               x3 = _mm256_loadu_ps(xg + 24);
        __m256i m = _mm256_max_epi32(_mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(x0), absm),
                                                      _mm256_and_si256(_mm256_castps_si256(x1), absm)),
                                     _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(x2), absm),
                                                      _mm256_and_si256(_mm256_castps_si256(x3), absm)));
        __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4E));
        m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xB1));
        uint32_t amax = (uint32_t)_mm_cvtsi128_si32(m4);
        if (amax >= 0x7F800000u || amax == 0) {
            q4_put(span, g, 0, 0, amax ? NAN : 0.0f);
            continue;
        }
        int e = q4_exp(amax);
        __m256 mul = _mm256_set1_ps(f32_of((uint32_t)(127 + 16 - e) << 23));
        /* even / odd columns: ev0 = 0, 2, .., 14; ev1 = 16, .., 30; od likewise */
        __m256 v[4];
        v[0] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0x88)), 0xD8));
        v[1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x2, x3, 0x88)), 0xD8));
        v[2] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0xDD)), 0xD8));
        v[3] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x2, x3, 0xDD)), 0xD8));
        __m256i d[3][4], ch = _mm256_setzero_si256(), cl = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], mul));
            __m256i l2 = _mm256_srai_epi32(_mm256_slli_epi32(t, 24), 24);
            __m256i v1 = _mm256_srai_epi32(_mm256_sub_epi32(t, l2), 8);
            __m256i lo = _mm256_srai_epi32(_mm256_slli_epi32(v1, 24), 24);
            __m256i hi = _mm256_srai_epi32(_mm256_sub_epi32(v1, lo), 8);
            d[0][i] = hi, d[1][i] = lo, d[2][i] = l2;
            ch = _mm256_add_epi32(ch, _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo));
            cl = _mm256_add_epi32(cl, l2);
        }
        for (int k = 0; k < 3; k++) {
            __m256i b8 = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(d[k][0], d[k][1]), _mm256_packs_epi32(d[k][2], d[k][3])), pk);
            _mm_storeu_si128((__m128i *)(void *)(blk + 128 * k + 16 * q), _mm256_castsi256_si128(b8));
            _mm_storeu_si128((__m128i *)(void *)(blk + 128 * k + 64 + 16 * q), _mm256_extracti128_si256(b8, 1));
        }
        int32_t cs[2];
        for (int k = 0; k < 2; k++) {
            __m256i c = k ? cl : ch;
            __m128i c4 = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
            c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, 0x4E));
            c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, 0xB1));
            cs[k] = _mm_cvtsi128_si32(c4);
        }
        q4_put(span, g, 12 * cs[0], 12 * cs[1], f32_of((uint32_t)(127 + e - 17) << 23));
    }
}
#endif

/* The quantizer every path uses (the SIMD build's vector version gives the
 * scalar definition's bytes: test_kernels compares them). */
static void fp4_quantize_x(const float *x, int K, uint8_t *dst) {
#ifdef DS_X86
    fp4_quantize_x_avx2(x, K, dst);
#else
    fp4_quantize_x_c(x, K, dst);
#endif
}

size_t ds_cpu_fp4_quantized_bytes(int K) { return (size_t)q4_spans(K) * Q4_SPAN_BYTES; }

void ds_cpu_fp4_quantize(const float *x, int K, uint8_t *dst, int simd) {
    if (simd)
        fp4_quantize_x(x, K, dst);
    else
        fp4_quantize_x_c(x, K, dst);
}

/* Scale of group g of row r, 0 past the last group. */
static inline float fp4_scale(const ds_weight *w, int r, int g) {
    return g < w->cols / DS_FP4_GROUP ? scale_of(w, (size_t)r * (size_t)w->scale_cols + (size_t)g) : 0.0f;
}

/* The doubled E2M1 values (exact integers). */
static const int8_t e2m1_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* y's accumulators from the exact sums H[lane], L[lane] of span m (the
 * order every path keeps; lanes past the last group add nothing). */
static inline void fp4_span_acc(const ds_weight *w, int r, int m, const int32_t *H, const int32_t *L,
                                const uint8_t *span, float *acc) {
    int G = w->cols / DS_FP4_GROUP;
    for (int l = 0; l < 16; l++) {
        int g = 16 * m + 4 * (l & 3) + (l >> 2);
        if (g >= G) continue;
        float sx;
        memcpy(&sx, span + Q4_SX + 4 * l, 4);
        float f = fp4_scale(w, r, g) * sx;
        acc[l] = fmaf(fmaf((float)H[l], 256.0f, (float)L[l]), f, acc[l]);
    }
}

/* The portable MXFP4 row with x in the Q4 layout. */
static float row_fp4_generic(const ds_weight *w, int r, const float *xq) {
    const uint8_t *row = w->data + (size_t)r * (size_t)(w->cols / 2), *xb = (const uint8_t *)xq;
    int G = w->cols / DS_FP4_GROUP;
    float acc[16] = {0};
    for (int m = 0; m * 16 < G; m++) {
        const uint8_t *span = xb + (size_t)m * Q4_SPAN_BYTES;
        int32_t H[16] = {0}, L[16] = {0};
        for (int l = 0; l < 16; l++) {
            int p = l & 3, q = l >> 2, g = 16 * m + 4 * p + q;
            if (g >= G) continue;
            const uint8_t *wb = row + 16 * (size_t)g, *blk = span + Q4_BLK * p + 16 * q;
            for (int k = 0; k < 16; k++) {
                int32_t a = e2m1_x2[wb[k] & 15], b = e2m1_x2[wb[k] >> 4];
                H[l] += a * (256 * (int8_t)blk[k] + (int8_t)blk[128 + k]);
                H[l] += b * (256 * (int8_t)blk[64 + k] + (int8_t)blk[192 + k]);
                L[l] += a * (int8_t)blk[256 + k] + b * (int8_t)blk[320 + k];
            }
        }
        fp4_span_acc(w, r, m, H, L, span, acc);
    }
    return hsum16(acc);
}

float ds_cpu_row_dot(const ds_weight *w, int r, const float *x) {
    const uint8_t *row = w->data + (size_t)r * row_bytes(w);
    int K = w->cols;
    l16 p[4];
    if (w->kind == DS_W_FP4) { /* x quantized as every path does */
        uint8_t *xq = malloc((size_t)q4_spans(K) * Q4_SPAN_BYTES);
        if (!xq) return NAN;
        fp4_quantize_x(x, K, xq);
        float y = row_fp4_generic(w, r, (const float *)(const void *)xq);
        free(xq);
        return y;
    }
    if (w->kind == DS_W_FP8) {
        int blk = DS_FP8_BLOCK;
        size_t srow = fp8_srow(w, r);
        float mul = 256.0f;
        l16 acc[2];
        memset(acc, 0, sizeof acc);
        for (int b = 0; b * blk < K; b++) {
            int c0 = b * blk, len = K - c0 < blk ? K - c0 : blk;
            chunks_generic(w, row, x, c0, len, p, 2);
            l16 s = l16_add(p[0], &p[1]);
            float m = scale_of(w, srow + (size_t)b) * mul;
            for (int i = 0; i < 16; i++) acc[b & 1].v[i] = fmaf(s.v[i], m, acc[b & 1].v[i]);
        }
        l16 a = l16_add(acc[0], &acc[1]);
        return hsum16(a.v);
    }
    chunks_generic(w, row, x, 0, K, p, 4);
    l16 a = l16_add(p[0], &p[1]), b = l16_add(p[2], &p[3]);
    a = l16_add(a, &b);
    return hsum16(a.v);
}

#ifdef DS_X86
static inline float hsum8_avx(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 h = _mm_add_ps(lo, hi);
    __m128 g = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(g, _mm_shuffle_ps(g, g, 1)));
}

/* ---- AVX2: a 16-lane vector is (lo, hi) ---- */
typedef struct {
    __m256 lo, hi;
} v16;

static inline v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 v16_add(v16 a, v16 b) { return (v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline v16 v16_fma(__m256 wl, __m256 wh, const float *x, v16 p) {
    return (v16){_mm256_fmadd_ps(wl, _mm256_loadu_ps(x), p.lo), _mm256_fmadd_ps(wh, _mm256_loadu_ps(x + 8), p.hi)};
}
static inline v16 v16_fma_s(v16 p, float m, v16 a) {
    __m256 s = _mm256_set1_ps(m);
    return (v16){_mm256_fmadd_ps(p.lo, s, a.lo), _mm256_fmadd_ps(p.hi, s, a.hi)};
}
static inline float v16_hsum(v16 v) { return hsum8_avx(_mm256_add_ps(v.lo, v.hi)); }

/* ---- AVX-512: a 16-lane vector is one register ---- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* Weights stream from memory one row after another; the hardware prefetcher
 * alone leaves this machine's bandwidth unused (32 -> 48 GB/s on 8 KB FP8
 * rows), so the kernels also prefetch the line a fixed distance ahead (into
 * the next rows; a prefetch never faults, so running past the end is
 * harmless). Measured best on the dev machine (Zen 5, 2 threads): 8 KiB for
 * 2-byte rows, 16 KiB for the quantized kinds; into L1, or into L2 where L1
 * is small (heuristics.h). */
#define PREFETCH DS_CPU_PREFETCH
#define PREFETCH_DENSE DS_CPU_PREFETCH_DENSE

enum { FP8_RAW = 100 }; /* a decoder of dec16k beside the ds_wkind values */
/* into L1 (T0) or, on cores whose L1 is small (heuristics.h), into L2
 * (T1): l2 is a constant at every call site */
#define PFH(p, l2)                                        \
    do {                                                  \
        if (l2)                                           \
            _mm_prefetch((const char *)(p), _MM_HINT_T1); \
        else                                              \
            _mm_prefetch((const char *)(p), _MM_HINT_T0); \
    } while (0)
#define PF(p) PFH((const char *)(p) + PREFETCH, l2)
#define PF_DENSE(p) PFH((const char *)(p) + PREFETCH_DENSE, l2)
/* the loops over tokens, rows of a tile and chunks of a block, fully unrolled
 * for each token count (arrays of vectors stay in registers) */
#define UNROLL _Pragma("GCC unroll 8")

AVX512 static inline float hsum16_512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return hsum8_avx(a);
}

/* 16 decoded weights at column c; kind is a constant at every call site */
AVX512 __attribute__((always_inline)) static inline __m512 dec16k(const uint8_t *row, int c, const int kind) {
    switch (kind) {
    case DS_W_F32: return _mm512_loadu_ps((const float *)(const void *)(row + 4 * (size_t)c));
    case DS_W_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * (size_t)c))), 16));
    case DS_W_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * (size_t)c)));
    case FP8_RAW: /* the e4m3 fields placed in an fp32: value * 2^-120 (x comes scaled by 2^112) */
        return _mm512_castsi512_ps(
            _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + c))), 20),
                             _mm512_set1_epi32((int)0x87F00000u)));
    default: { /* FP8 */
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(row + c));
        return _mm512_cvtph_ps(
            _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xBFFF)));
    }
    }
}

/* One chunk [c, c+16) clipped to end, zero-padded (the rare odd-size tail);
 * wmul scales the decoded weights (exactly: a power of two, FP8_RAW). */
AVX512 static __m512 tail_fma(const ds_weight *w, const uint8_t *row, const float *x, int c, int end, __m512 p,
                              float wmul) {
    float tw[16] = {0}, tx[16] = {0};
    for (int k = 0; c + k < end && k < 16; k++) {
        tw[k] = elem(w, row, c + k) * wmul;
        tx[k] = x[c + k];
    }
    return _mm512_fmadd_ps(_mm512_loadu_ps(tw), _mm512_loadu_ps(tx), p);
}

/* Up to NT tokens of one row at once: each weight chunk is decoded once and
 * meets every token's x, while each token's operations (and so its bits) are
 * exactly those of a single-token call. Prefill and batches gain; decode
 * (nt = 1) is unchanged. */
/* Dense rows: chunk c -> p[c % 4], for nt tokens at x + t * xs. */
AVX512 __attribute__((always_inline)) static inline void dense_t_512(const ds_weight *w, int r, const float *x,
                                                                      size_t xs, float *out, const int nt,
                                                                      const int kind, const int l2) {
    int K = w->cols;
    const uint8_t *row = w->data + (size_t)r * row_bytes(w);
    __m512 p[NT][4];
    UNROLL for (int t = 0; t < nt; t++)
        UNROLL for (int j = 0; j < 4; j++) p[t][j] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 64 <= K; c += 64) {
        const uint8_t *line = row + (size_t)c * (kind == DS_W_F32 ? 4 : 2); /* 128 or 256 bytes per round */
        PF_DENSE(line);
        PF_DENSE(line + 64);
        if (kind == DS_W_F32) {
            PF_DENSE(line + 128);
            PF_DENSE(line + 192);
        }
        UNROLL for (int j = 0; j < 4; j++) {
            __m512 wv = dec16k(row, c + 16 * j, kind);
            UNROLL for (int t = 0; t < nt; t++)
                p[t][j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)t * xs + c + 16 * j), p[t][j]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) {
        const float *xt = x + (size_t)t * xs;
        UNROLL for (int j = 0; j < 4; j++) /* the last partial round */
            if (c + 16 * j < K)
                p[t][j] = c + 16 * j + 16 <= K
                              ? _mm512_fmadd_ps(dec16k(row, c + 16 * j, kind), _mm512_loadu_ps(xt + c + 16 * j), p[t][j])
                              : tail_fma(w, row, xt, c + 16 * j, K, p[t][j], 1.0f);
        out[t] = hsum16_512(_mm512_add_ps(_mm512_add_ps(p[t][0], p[t][1]), _mm512_add_ps(p[t][2], p[t][3])));
    }
}

/* Packed BF16 rows (bf16x.c): the dense order above, each 64-column unit
 * decoded back to the BF16 kernel's very values. The codes (two a byte)
 * become top bytes S << 7 | E >> 1 through the row's table (vpshufb); byte
 * unpacks put [0, 0, A, top] in every dword, i.e. the bf16 bits << 16, with
 * chunk j of the unit in F[j] in column order (the packer placed the bytes
 * so); a unit holding escapes is then patched from the row's list. */
AVX512 __attribute__((always_inline)) static inline __m512i bf16x_tbl_512(const ds_cpu_bf16x *pk, int r) {
    return _mm512_add_epi8(
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121)),
        _mm512_set1_epi8((char)(pk->top[r] - 7)));
}

/* The unit at q (96 bytes) as its four chunks, escapes not yet patched. */
AVX512 __attribute__((always_inline)) static inline void bf16x_unit_512(const uint8_t *q, __m512i tbl, __m512 f[4]) {
    const __m512i zero = _mm512_setzero_si512(), nib = _mm512_set1_epi16(0x0F0F);
    __m512i a = _mm512_loadu_si512((const void *)q);
    __m512i z = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(q + 64)));
    __m512i top = _mm512_shuffle_epi8(tbl, _mm512_ternarylogic_epi32(z, _mm512_slli_epi16(z, 4), nib, 0xA8));
    __m512i at0 = _mm512_unpacklo_epi8(a, top), at1 = _mm512_unpackhi_epi8(a, top);
    f[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, at0));
    f[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, at0));
    f[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, at1));
    f[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, at1));
}

AVX512 __attribute__((always_inline)) static inline void bf16x_t_512(const ds_weight *w, int r, const float *x,
                                                                      size_t xs, float *out, const int nt,
                                                                      const int l2) {
    const ds_cpu_bf16x *pk = w->packed;
    int U = w->cols / 64;
    const uint8_t *row = pk->units + (size_t)r * (size_t)U * 96;
    const uint64_t *esc = pk->esc + (size_t)r * (size_t)pk->nw;
    const ds_cpu_bf16x_esc *e = pk->ents + pk->eoff[r], *e_end = pk->ents + pk->eoff[r + 1];
    const __m512i tbl = bf16x_tbl_512(pk, r);
    __m512 p[NT][4];
    UNROLL for (int t = 0; t < nt; t++)
        UNROLL for (int j = 0; j < 4; j++) p[t][j] = _mm512_setzero_ps();
    for (int u = 0; u < U; u++) {
        const uint8_t *q = row + (size_t)u * 96;
        PF_DENSE(q);
        PF_DENSE(q + 64);
        __m512 f[4];
        bf16x_unit_512(q, tbl, f);
        if (__builtin_expect((esc[u / 64] >> (u % 64)) & 1, 0)) {
            _Alignas(64) uint32_t v[64];
            UNROLL for (int j = 0; j < 4; j++) _mm512_store_ps((float *)(void *)(v + 16 * j), f[j]);
            for (; e < e_end && (int)(e->col / 64) == u; e++) v[e->col % 64] = (uint32_t)e->bits << 16;
            UNROLL for (int j = 0; j < 4; j++) f[j] = _mm512_load_ps((const float *)(const void *)(v + 16 * j));
        }
        UNROLL for (int j = 0; j < 4; j++)
            UNROLL for (int t = 0; t < nt; t++)
                p[t][j] = _mm512_fmadd_ps(f[j], _mm512_loadu_ps(x + (size_t)t * xs + 64 * (size_t)u + 16 * j), p[t][j]);
    }
    UNROLL for (int t = 0; t < nt; t++)
        out[t] = hsum16_512(_mm512_add_ps(_mm512_add_ps(p[t][0], p[t][1]), _mm512_add_ps(p[t][2], p[t][3])));
}

/* FP8 block [c0, c0+len): chunk j -> b[j % 2], returns b0 + b1. dec is
 * DS_W_FP8 (codes as fp16: value / 256) or FP8_RAW (value * 2^-120 with x
 * scaled by 2^112): the products, and so every rounding, are the same. */
AVX512 __attribute__((always_inline)) static inline __m512 block_fp8_512(const ds_weight *w, const uint8_t *row,
                                                                          const float *x, int c0, int len,
                                                                          const int dec) {
    __m512 b0 = _mm512_setzero_ps(), b1 = b0;
    float wmul = dec == FP8_RAW ? 0x1p-112f : 1.0f;
    if (len == DS_FP8_BLOCK) {
        UNROLL for (int j = 0; j < DS_FP8_BLOCK; j += 32) {
            b0 = _mm512_fmadd_ps(dec16k(row, c0 + j, dec), _mm512_loadu_ps(x + c0 + j), b0);
            b1 = _mm512_fmadd_ps(dec16k(row, c0 + j + 16, dec), _mm512_loadu_ps(x + c0 + j + 16), b1);
        }
    } else {
        UNROLL for (int j = 0; j < len; j += 32) {
            b0 = j + 16 <= len ? _mm512_fmadd_ps(dec16k(row, c0 + j, dec), _mm512_loadu_ps(x + c0 + j), b0)
                               : tail_fma(w, row, x, c0 + j, c0 + len, b0, wmul);
            if (j + 16 < len)
                b1 = j + 32 <= len ? _mm512_fmadd_ps(dec16k(row, c0 + j + 16, dec), _mm512_loadu_ps(x + c0 + j + 16), b1)
                                   : tail_fma(w, row, x, c0 + j + 16, c0 + len, b1, wmul);
        }
    }
    return _mm512_add_ps(b0, b1);
}

/* FP8 rows: block kb -> a[kb % 2]; whole blocks in pairs, then the partial
 * last block, if any, through block_fp8_512. (Two weight rows at once,
 * sharing the x loads, was measured: faster when this machine's memory is
 * fast, much slower when it is slow — two weight streams per thread.) */
AVX512 __attribute__((always_inline)) static inline void fp8_t_512(const ds_weight *w, int r, const float *x, size_t xs,
                                                                    float *out, const int nt, const int dec,
                                                                    const int l2) {
    int K = w->cols, nfull = K / DS_FP8_BLOCK;
    const uint8_t *row = w->data + (size_t)r * (size_t)K;
    size_t srow = fp8_srow(w, r);
    __m512 a[NT][2];
    UNROLL for (int t = 0; t < nt; t++) a[t][0] = a[t][1] = _mm512_setzero_ps();
    int kb = 0;
    for (; kb + 2 <= nfull; kb += 2) {
        const uint8_t *p = row + (size_t)kb * DS_FP8_BLOCK;
        PF(p);
        PF(p + 64);
        PF(p + 128);
        PF(p + 192);
        UNROLL for (int h = 0; h < 2; h++) { /* block kb + h into a[h] */
            const uint8_t *pb = p + h * DS_FP8_BLOCK;
            size_t xo = (size_t)(kb + h) * DS_FP8_BLOCK;
            __m512 b0[NT], b1[NT];
            UNROLL for (int j = 0; j < DS_FP8_BLOCK; j += 32) {
                __m512 w0 = dec16k(pb, j, dec), w1 = dec16k(pb, j + 16, dec);
                UNROLL for (int t = 0; t < nt; t++) {
                    const float *xt = x + (size_t)t * xs + xo;
                    b0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt + j), j ? b0[t] : _mm512_setzero_ps());
                    b1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + j + 16), j ? b1[t] : _mm512_setzero_ps());
                }
            }
            __m512 m = _mm512_set1_ps(scale_of(w, srow + (size_t)kb + (size_t)h) * 256.0f);
            UNROLL for (int t = 0; t < nt; t++) a[t][h] = _mm512_fmadd_ps(_mm512_add_ps(b0[t], b1[t]), m, a[t][h]);
        }
    }
    for (; kb * DS_FP8_BLOCK < K; kb++) { /* a last odd whole block, then a partial one */
        int c0 = kb * DS_FP8_BLOCK, len = K - c0 < DS_FP8_BLOCK ? K - c0 : DS_FP8_BLOCK;
        __m512 m = _mm512_set1_ps(scale_of(w, srow + (size_t)kb) * 256.0f);
        UNROLL for (int t = 0; t < nt; t++)
            a[t][kb & 1] = _mm512_fmadd_ps(block_fp8_512(w, row, x + (size_t)t * xs, c0, len, dec), m, a[t][kb & 1]);
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum16_512(_mm512_add_ps(a[t][0], a[t][1]));
}

/* Two FP8 rows (r, r + 1) x nt tokens at once, K % 256 == 0 (whole block
 * pairs only): each x chunk is loaded once for both rows; every (row,
 * token) keeps exactly fp8_t_512's operations (same bits). out[t] is row
 * r's, out[NT + t] row r + 1's. */
AVX512 __attribute__((always_inline)) static inline void fp8_t2_512(const ds_weight *w, int r, const float *x, size_t xs,
                                                                     float *out, const int nt, const int dec,
                                                                     const int l2) {
    int K = w->cols;
    const uint8_t *row = w->data + (size_t)r * (size_t)K;
    size_t srow0 = fp8_srow(w, r), srow1 = fp8_srow(w, r + 1);
    __m512 a[2][NT][2];
    UNROLL for (int t = 0; t < nt; t++) a[0][t][0] = a[0][t][1] = a[1][t][0] = a[1][t][1] = _mm512_setzero_ps();
    for (int kb = 0; kb * DS_FP8_BLOCK < K; kb += 2) {
        const uint8_t *p = row + (size_t)kb * DS_FP8_BLOCK;
        PF(p);
        PF(p + 64);
        PF(p + 128);
        PF(p + 192);
        PF(p + K);
        PF(p + K + 64);
        PF(p + K + 128);
        PF(p + K + 192);
        UNROLL for (int h = 0; h < 2; h++) {
            const uint8_t *pb = p + h * DS_FP8_BLOCK;
            size_t xo = (size_t)(kb + h) * DS_FP8_BLOCK;
            __m512 b0[2][NT], b1[2][NT];
            UNROLL for (int j = 0; j < DS_FP8_BLOCK; j += 32) {
                __m512 w00 = dec16k(pb, j, dec), w01 = dec16k(pb, j + 16, dec);
                __m512 w10 = dec16k(pb + K, j, dec), w11 = dec16k(pb + K, j + 16, dec);
                UNROLL for (int t = 0; t < nt; t++) {
                    const float *xt = x + (size_t)t * xs + xo;
                    __m512 x0 = _mm512_loadu_ps(xt + j), x1 = _mm512_loadu_ps(xt + j + 16);
                    b0[0][t] = _mm512_fmadd_ps(w00, x0, j ? b0[0][t] : _mm512_setzero_ps());
                    b1[0][t] = _mm512_fmadd_ps(w01, x1, j ? b1[0][t] : _mm512_setzero_ps());
                    b0[1][t] = _mm512_fmadd_ps(w10, x0, j ? b0[1][t] : _mm512_setzero_ps());
                    b1[1][t] = _mm512_fmadd_ps(w11, x1, j ? b1[1][t] : _mm512_setzero_ps());
                }
            }
            __m512 m0 = _mm512_set1_ps(scale_of(w, srow0 + (size_t)kb + (size_t)h) * 256.0f);
            __m512 m1 = _mm512_set1_ps(scale_of(w, srow1 + (size_t)kb + (size_t)h) * 256.0f);
            UNROLL for (int t = 0; t < nt; t++) {
                a[0][t][h] = _mm512_fmadd_ps(_mm512_add_ps(b0[0][t], b1[0][t]), m0, a[0][t][h]);
                a[1][t][h] = _mm512_fmadd_ps(_mm512_add_ps(b0[1][t], b1[1][t]), m1, a[1][t][h]);
            }
        }
    }
    UNROLL for (int t = 0; t < nt; t++) {
        out[t] = hsum16_512(_mm512_add_ps(a[0][t][0], a[0][t][1]));
        out[NT + t] = hsum16_512(_mm512_add_ps(a[1][t][0], a[1][t][1]));
    }
}

/* Sixteen group scales starting at index i as floats, with the scalar
 * decoder's values (e8m0: e == 0 -> 2^-127, e == 255 -> NaN, else e << 23);
 * lanes >= n are 0. */
AVX512 static inline __m512 scales16_512(const ds_weight *w, size_t i, int n) {
    __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    if (w->scale_f32) return _mm512_maskz_loadu_ps(m, w->scale + 4 * i);
    __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, w->scale + i));
    __m512i bits = _mm512_slli_epi32(e, 23);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                 _mm512_set1_epi32(0x00400000));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                                 _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(m, bits));
}

/* MXFP4 rows x nt tokens with x in the Q4 layout, AVX-512 VNNI. Per span a
 * 64-byte load is 4 groups, one per 128-bit lane; vpshufb turns its low and
 * high nibbles into unsigned codes w2 + 12 (L: even columns, H: odd), and
 * vpdpbusd sums 4 products u8 x s8 per dword: hi first, << 8, then lo, so
 * dword j of block p holds a quarter of 256 * sum(u hi) + sum(u lo) of group
 * 4p + j / 4. An in-lane 4 x 4 transpose-add gives lane 4q + p = group 4p + q
 * (exact integers: the order of these sums is free), minus C; then the one
 * fp32 fma per group of the documented order. */
#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* Block b (64 bytes: 4 groups) of the MXFP4 span at p as unsigned codes w2
 * + 12, L from the low nibbles (even columns), H from the high (odd); left:
 * the row's groups from this span on (a partial last span loads only the
 * bytes of the groups present). */
AVX512VNNI __attribute__((always_inline)) static inline void fp4q_block_512(const uint8_t *p, int b, int left,
                                                                            __m512i *L, __m512i *H) {
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i d;
    if (left >= 16) {
        d = _mm512_loadu_si512((const void *)(p + 64 * b));
    } else {
        int n = left - 4 * b;
        n = n < 0 ? 0 : n > 4 ? 4 : n;
        __mmask64 k = n == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * n)) - 1);
        d = _mm512_maskz_loadu_epi8(k, p + 64 * b);
    }
    __asm__("" : "+v"(d));
    *L = _mm512_shuffle_epi8(tbl, _mm512_and_si512(d, m4));
    *H = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(d, 4), m4));
}

/* The 16 group scales of a span from scale index i, in lane order (lane 4q
 * + p <- group 4p + q). A whole span of a weight whose scales are all plain
 * (no 0 or 255 byte: w->scale_plain) takes the bytes in lane order and e <<
 * 23 alone (the same floats, a third of the instructions: one-token MXFP4
 * 22.7-23.2 -> 24.8-26.5 GB/s on one Zen 4 core). */
AVX512VNNI __attribute__((always_inline)) static inline __m512 fp4q_scales_512(const ds_weight *w, size_t i, int left) {
    if (w->scale_plain && left >= 16) {
        const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        __m128i e = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(w->scale + i)), order);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(e), 23));
    }
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(perm, scales16_512(w, i, left));
}

/* One step of the in-lane transpose-add (exact integer sums). */
AVX512VNNI __attribute__((always_inline)) static inline __m512i fp4q_fold32(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
AVX512VNNI __attribute__((always_inline)) static inline __m512i fp4q_fold64(__m512i ab, __m512i cd) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

/* prefetch of a row's 256-byte span (the kernels' distance ahead) */
#define PF_SPAN(p)        \
    do {                  \
        PF(p);            \
        PF((p) + 64);     \
        PF((p) + 128);    \
        PF((p) + 192);    \
    } while (0)

AVX512VNNI __attribute__((always_inline)) static inline void fp4q_t_512(const ds_weight *w, int r, const float *xq,
                                                                        size_t xs, float *out, const int nt,
                                                                        const int l2) {
    int G = w->cols / DS_FP4_GROUP;
    const uint8_t *row = w->data + (size_t)r * (size_t)(w->cols / 2);
    size_t sbase = (size_t)r * (size_t)w->scale_cols;
    __m512 acc[NT];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int m = 0; 16 * m < G; m++) {
        const uint8_t *p = row + 256 * (size_t)m;
        PF_SPAN(p);
        int left = G - 16 * m;
        __m512 ws = fp4q_scales_512(w, sbase + 16 * (size_t)m, left);
        __m512i sh[NT][4], sl[NT][4];
        UNROLL for (int b = 0; b < 4; b++) {
            __m512i L, H;
            fp4q_block_512(p, b, left, &L, &H);
            UNROLL for (int t = 0; t < nt; t++) {
                const uint8_t *xb = (const uint8_t *)(xq + (size_t)t * xs) + (size_t)m * Q4_SPAN_BYTES + Q4_BLK * b;
                __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), L, _mm512_loadu_si512((const void *)xb));
                a = _mm512_dpbusd_epi32(a, H, _mm512_loadu_si512((const void *)(xb + 64)));
                a = _mm512_slli_epi32(a, 8);
                a = _mm512_dpbusd_epi32(a, L, _mm512_loadu_si512((const void *)(xb + 128)));
                sh[t][b] = _mm512_dpbusd_epi32(a, H, _mm512_loadu_si512((const void *)(xb + 192)));
                __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), L, _mm512_loadu_si512((const void *)(xb + 256)));
                sl[t][b] = _mm512_dpbusd_epi32(c, H, _mm512_loadu_si512((const void *)(xb + 320)));
            }
        }
        UNROLL for (int t = 0; t < nt; t++) {
            const uint8_t *sp = (const uint8_t *)(xq + (size_t)t * xs) + (size_t)m * Q4_SPAN_BYTES;
            __m512i vh = fp4q_fold64(fp4q_fold32(sh[t][0], sh[t][1]), fp4q_fold32(sh[t][2], sh[t][3]));
            __m512i vl = fp4q_fold64(fp4q_fold32(sl[t][0], sl[t][1]), fp4q_fold32(sl[t][2], sl[t][3]));
            vh = _mm512_sub_epi32(vh, _mm512_loadu_si512((const void *)(sp + Q4_CH)));
            vl = _mm512_sub_epi32(vl, _mm512_loadu_si512((const void *)(sp + Q4_CL)));
            __m512 S = _mm512_fmadd_ps(_mm512_cvtepi32_ps(vh), _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(vl));
            __m512 f = _mm512_mul_ps(ws, _mm512_loadu_ps((const float *)(const void *)(sp + Q4_SX)));
            acc[t] = _mm512_fmadd_ps(S, f, acc[t]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = hsum16_512(acc[t]);
}

/* Two MXFP4 rows (r, r + 1) x nt tokens: fp4q_t_512's operations for each
 * (row, token) — the same exact integer sums (their grouping is free), the
 * same transpose-add, minus C, and fp32 fma per group in the same lane order
 * (same bits) — with each x vector loaded once for both rows (one row a call
 * loaded every x byte once per row: 16 loads per token and span against 16
 * vpdpbusd). A block's sums fold into the transpose-add as they come (ab
 * after blocks 0, 1; cd after 2, 3) so the pairs' accumulators fit the
 * registers. out[t] is row r's, out[NT + t] row r + 1's. */
AVX512VNNI __attribute__((always_inline)) static inline void fp4q_t2_512(const ds_weight *w, int r, const float *xq,
                                                                         size_t xs, float *out, const int nt,
                                                                         const int l2) {
    int G = w->cols / DS_FP4_GROUP;
    size_t rb = (size_t)(w->cols / 2);
    const uint8_t *row0 = w->data + (size_t)r * rb;
    size_t sb0 = (size_t)r * (size_t)w->scale_cols, sb1 = sb0 + (size_t)w->scale_cols;
    __m512 acc[2][NT];
    UNROLL for (int t = 0; t < nt; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int m = 0; 16 * m < G; m++) {
        const uint8_t *p0 = row0 + 256 * (size_t)m, *p1 = p0 + rb;
        PF_SPAN(p0);
        PF_SPAN(p1);
        int left = G - 16 * m;
        __m512 ws0 = fp4q_scales_512(w, sb0 + 16 * (size_t)m, left);
        __m512 ws1 = fp4q_scales_512(w, sb1 + 16 * (size_t)m, left);
        /* per row i and token t, the sums of hi / lo (H) and of lo2 (L): ab of
         * blocks 0, 1 then cd of 2, 3; q: block 0 / 2 until its pair comes */
        __m512i h[2][2][NT], q[2][2][NT];
        UNROLL for (int b = 0; b < 4; b++) {
            __m512i L0, H0, L1, H1;
            fp4q_block_512(p0, b, left, &L0, &H0);
            fp4q_block_512(p1, b, left, &L1, &H1);
            UNROLL for (int t = 0; t < nt; t++) {
                const uint8_t *xb = (const uint8_t *)(xq + (size_t)t * xs) + (size_t)m * Q4_SPAN_BYTES + Q4_BLK * b;
                __m512i xhL = _mm512_loadu_si512((const void *)xb), xhH = _mm512_loadu_si512((const void *)(xb + 64));
                __m512i xlL = _mm512_loadu_si512((const void *)(xb + 128));
                __m512i xlH = _mm512_loadu_si512((const void *)(xb + 192));
                __m512i a0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), L0, xhL);
                __m512i a1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), L1, xhL);
                a0 = _mm512_slli_epi32(_mm512_dpbusd_epi32(a0, H0, xhH), 8);
                a1 = _mm512_slli_epi32(_mm512_dpbusd_epi32(a1, H1, xhH), 8);
                __m512i s[2][2];
                s[0][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a0, L0, xlL), H0, xlH);
                s[1][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a1, L1, xlL), H1, xlH);
                __m512i x2L = _mm512_loadu_si512((const void *)(xb + 256));
                __m512i x2H = _mm512_loadu_si512((const void *)(xb + 320));
                s[0][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), L0, x2L), H0, x2H);
                s[1][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), L1, x2L), H1, x2H);
                UNROLL for (int i = 0; i < 2; i++) UNROLL for (int j = 0; j < 2; j++) {
                    if (b % 2 == 0)
                        q[i][j][t] = s[i][j];
                    else if (b == 1)
                        h[i][j][t] = fp4q_fold32(q[i][j][t], s[i][j]);
                    else
                        q[i][j][t] = fp4q_fold32(q[i][j][t], s[i][j]);
                }
            }
        }
        UNROLL for (int t = 0; t < nt; t++) {
            const uint8_t *sp = (const uint8_t *)(xq + (size_t)t * xs) + (size_t)m * Q4_SPAN_BYTES;
            __m512i ch = _mm512_loadu_si512((const void *)(sp + Q4_CH)), cl = _mm512_loadu_si512((const void *)(sp + Q4_CL));
            __m512 sx = _mm512_loadu_ps((const float *)(const void *)(sp + Q4_SX));
            UNROLL for (int i = 0; i < 2; i++) {
                __m512i vh = _mm512_sub_epi32(fp4q_fold64(h[i][0][t], q[i][0][t]), ch);
                __m512i vl = _mm512_sub_epi32(fp4q_fold64(h[i][1][t], q[i][1][t]), cl);
                __m512 S = _mm512_fmadd_ps(_mm512_cvtepi32_ps(vh), _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(vl));
                acc[i][t] = _mm512_fmadd_ps(S, _mm512_mul_ps(i ? ws1 : ws0, sx), acc[i][t]);
            }
        }
    }
    UNROLL for (int t = 0; t < nt; t++) {
        out[t] = hsum16_512(acc[0][t]);
        out[NT + t] = hsum16_512(acc[1][t]);
    }
}

/* ---- AVX2 row kernels (the AVX2 path, and MXFP4 on AVX-512 without VNNI) ----
 * The AVX-512 row kernels' loops with each 16-lane vector held as (lo, hi)
 * (v16, above): every (row, token) keeps the documented operations in the
 * documented order, so the bits are every other path's. Sixteen ymm
 * registers hold a quarter of 32 zmm's lanes, so these kernels take AVX2_NT
 * tokens per pass (each pass decodes the row again, from L1), and prefetch
 * as the AVX-512 kernels do. */
#define AVX2_NT DS_CPU_AVX2_NT

/* 16 decoded weights at column c (dec16k's values); kind constant at every call site */
__attribute__((always_inline)) static inline v16 dec16_avx2(const uint8_t *row, int c, const int kind) {
    switch (kind) {
    case DS_W_F32: {
        const float *f = (const float *)(const void *)(row + 4 * (size_t)c);
        return (v16){_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
    }
    case DS_W_BF16: {
        const __m128i *h = (const __m128i *)(const void *)(row + 2 * (size_t)c);
        return (v16){_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16)),
                     _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + 1)), 16))};
    }
    case DS_W_F16: {
        const __m128i *h = (const __m128i *)(const void *)(row + 2 * (size_t)c);
        return (v16){_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
    }
    case FP8_RAW: { /* the e4m3 fields placed in an fp32: value * 2^-120 (x comes scaled by 2^112) */
        const __m256i keep = _mm256_set1_epi32((int)0x87F00000u);
        const __m128i *b = (const __m128i *)(const void *)(row + c);
        return (v16){_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(b)), 20), keep)),
                     _mm256_castsi256_ps(_mm256_and_si256(
                         _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(row + c + 8))), 20),
                         keep))};
    }
    default: { /* FP8: codes as fp16, value / 256 */
        __m256i h = _mm256_and_si256(
            _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(row + c))), 7),
            _mm256_set1_epi16((short)0xBFFF));
        return (v16){_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
    }
    }
}

static inline v16 v16_fmaw(v16 w, const float *x, v16 p) { return v16_fma(w.lo, w.hi, x, p); }

/* tail_fma's chunk [c, min(c + 16, end)) zero-padded, weights times wmul (exact) */
static v16 tail_fma_avx2(const ds_weight *w, const uint8_t *row, const float *x, int c, int end, v16 p, float wmul) {
    float tw[16] = {0}, tx[16] = {0};
    for (int k = 0; c + k < end && k < 16; k++) {
        tw[k] = elem(w, row, c + k) * wmul;
        tx[k] = x[c + k];
    }
    return v16_fma(_mm256_loadu_ps(tw), _mm256_loadu_ps(tw + 8), tx, p);
}

/* dense_t_512's loop: chunk c -> p[c % 4] */
__attribute__((always_inline)) static inline void dense_t_avx2(const ds_weight *w, int r, const float *x, size_t xs,
                                                                float *out, const int nt, const int kind, const int l2) {
    int K = w->cols;
    const uint8_t *row = w->data + (size_t)r * row_bytes(w);
    v16 p[AVX2_NT][4];
    UNROLL for (int t = 0; t < nt; t++)
        UNROLL for (int j = 0; j < 4; j++) p[t][j] = v16_zero();
    int c = 0;
    for (; c + 64 <= K; c += 64) {
        const uint8_t *line = row + (size_t)c * (kind == DS_W_F32 ? 4 : 2);
        PF_DENSE(line);
        PF_DENSE(line + 64);
        if (kind == DS_W_F32) {
            PF_DENSE(line + 128);
            PF_DENSE(line + 192);
        }
        UNROLL for (int j = 0; j < 4; j++) {
            v16 wv = dec16_avx2(row, c + 16 * j, kind);
            UNROLL for (int t = 0; t < nt; t++) p[t][j] = v16_fmaw(wv, x + (size_t)t * xs + c + 16 * j, p[t][j]);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) {
        const float *xt = x + (size_t)t * xs;
        UNROLL for (int j = 0; j < 4; j++)
            if (c + 16 * j < K)
                p[t][j] = c + 16 * j + 16 <= K ? v16_fmaw(dec16_avx2(row, c + 16 * j, kind), xt + c + 16 * j, p[t][j])
                                               : tail_fma_avx2(w, row, xt, c + 16 * j, K, p[t][j], 1.0f);
        out[t] = v16_hsum(v16_add(v16_add(p[t][0], p[t][1]), v16_add(p[t][2], p[t][3])));
    }
}

/* bf16x_t_512 in 256-bit halves: byte unpacks act within 128-bit lanes, so
 * lanes 0-1 and 2-3 of each 512-bit step are the two halves' results and
 * F[j] comes out as (lo, hi) in column order, from the same packed bytes. */
__attribute__((always_inline)) static inline void bf16x_t_avx2(const ds_weight *w, int r, const float *x, size_t xs,
                                                                float *out, const int nt, const int l2) {
    const ds_cpu_bf16x *pk = w->packed;
    int U = w->cols / 64;
    const uint8_t *row = pk->units + (size_t)r * (size_t)U * 96;
    const uint64_t *esc = pk->esc + (size_t)r * (size_t)pk->nw;
    const ds_cpu_bf16x_esc *e = pk->ents + pk->eoff[r], *e_end = pk->ents + pk->eoff[r + 1];
    const __m256i tbl = _mm256_add_epi8(
        _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121)),
        _mm256_set1_epi8((char)(pk->top[r] - 7)));
    const __m256i zero = _mm256_setzero_si256(), nib = _mm256_set1_epi16(0x0F0F);
    v16 p[AVX2_NT][4];
    UNROLL for (int t = 0; t < nt; t++)
        UNROLL for (int j = 0; j < 4; j++) p[t][j] = v16_zero();
    for (int u = 0; u < U; u++) {
        const uint8_t *q = row + (size_t)u * 96;
        PF_DENSE(q);
        PF_DENSE(q + 64);
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(const void *)q);
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32));
        __m256i z0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(q + 64)));
        __m256i z1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(q + 80)));
        __m256i t0 = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_or_si256(z0, _mm256_slli_epi16(z0, 4)), nib));
        __m256i t1 = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_or_si256(z1, _mm256_slli_epi16(z1, 4)), nib));
        __m256i l0 = _mm256_unpacklo_epi8(a0, t0), h0 = _mm256_unpackhi_epi8(a0, t0);
        __m256i l1 = _mm256_unpacklo_epi8(a1, t1), h1 = _mm256_unpackhi_epi8(a1, t1);
        v16 f[4] = {{_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, l0)), _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, l1))},
                    {_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, l0)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, l1))},
                    {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h0)), _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h1))},
                    {_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h0)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h1))}};
        if (__builtin_expect((esc[u / 64] >> (u % 64)) & 1, 0)) {
            _Alignas(32) uint32_t v[64];
            UNROLL for (int j = 0; j < 4; j++) {
                _mm256_store_ps((float *)(void *)(v + 16 * j), f[j].lo);
                _mm256_store_ps((float *)(void *)(v + 16 * j + 8), f[j].hi);
            }
            for (; e < e_end && (int)(e->col / 64) == u; e++) v[e->col % 64] = (uint32_t)e->bits << 16;
            UNROLL for (int j = 0; j < 4; j++)
                f[j] = (v16){_mm256_load_ps((const float *)(const void *)(v + 16 * j)),
                             _mm256_load_ps((const float *)(const void *)(v + 16 * j + 8))};
        }
        UNROLL for (int j = 0; j < 4; j++)
            UNROLL for (int t = 0; t < nt; t++)
                p[t][j] = v16_fmaw(f[j], x + (size_t)t * xs + 64 * (size_t)u + 16 * j, p[t][j]);
    }
    UNROLL for (int t = 0; t < nt; t++)
        out[t] = v16_hsum(v16_add(v16_add(p[t][0], p[t][1]), v16_add(p[t][2], p[t][3])));
}

/* FP8 block [c0, c0 + len) of one token: chunk j -> b[j % 2], returns b0 + b1 */
__attribute__((always_inline)) static inline v16 block_fp8_avx2(const ds_weight *w, const uint8_t *row, const float *x,
                                                                 int c0, int len, const int dec) {
    v16 b0 = v16_zero(), b1 = v16_zero();
    float wmul = dec == FP8_RAW ? 0x1p-112f : 1.0f;
    for (int j = 0; j < len; j += 32) {
        b0 = j + 16 <= len ? v16_fmaw(dec16_avx2(row, c0 + j, dec), x + c0 + j, b0)
                           : tail_fma_avx2(w, row, x, c0 + j, c0 + len, b0, wmul);
        if (j + 16 < len)
            b1 = j + 32 <= len ? v16_fmaw(dec16_avx2(row, c0 + j + 16, dec), x + c0 + j + 16, b1)
                               : tail_fma_avx2(w, row, x, c0 + j + 16, c0 + len, b1, wmul);
    }
    return v16_add(b0, b1);
}

/* fp8_t_512's loop: block kb -> a[kb % 2], whole blocks in pairs */
__attribute__((always_inline)) static inline void fp8_t_avx2(const ds_weight *w, int r, const float *x, size_t xs,
                                                              float *out, const int nt, const int dec, const int l2) {
    int K = w->cols, nfull = K / DS_FP8_BLOCK;
    const uint8_t *row = w->data + (size_t)r * (size_t)K;
    size_t srow = fp8_srow(w, r);
    v16 a[AVX2_NT][2];
    UNROLL for (int t = 0; t < nt; t++) a[t][0] = a[t][1] = v16_zero();
    int kb = 0;
    for (; kb + 2 <= nfull; kb += 2) {
        const uint8_t *p = row + (size_t)kb * DS_FP8_BLOCK;
        PF(p);
        PF(p + 64);
        PF(p + 128);
        PF(p + 192);
        UNROLL for (int h = 0; h < 2; h++) {
            const uint8_t *pb = p + h * DS_FP8_BLOCK;
            size_t xo = (size_t)(kb + h) * DS_FP8_BLOCK;
            v16 b0[AVX2_NT], b1[AVX2_NT];
            UNROLL for (int j = 0; j < DS_FP8_BLOCK; j += 32) {
                v16 w0 = dec16_avx2(pb, j, dec), w1 = dec16_avx2(pb, j + 16, dec);
                UNROLL for (int t = 0; t < nt; t++) {
                    const float *xt = x + (size_t)t * xs + xo;
                    b0[t] = v16_fmaw(w0, xt + j, j ? b0[t] : v16_zero());
                    b1[t] = v16_fmaw(w1, xt + j + 16, j ? b1[t] : v16_zero());
                }
            }
            float m = scale_of(w, srow + (size_t)kb + (size_t)h) * 256.0f;
            UNROLL for (int t = 0; t < nt; t++) a[t][h] = v16_fma_s(v16_add(b0[t], b1[t]), m, a[t][h]);
        }
    }
    for (; kb * DS_FP8_BLOCK < K; kb++) {
        int c0 = kb * DS_FP8_BLOCK, len = K - c0 < DS_FP8_BLOCK ? K - c0 : DS_FP8_BLOCK;
        float m = scale_of(w, srow + (size_t)kb) * 256.0f;
        UNROLL for (int t = 0; t < nt; t++)
            a[t][kb & 1] = v16_fma_s(block_fp8_avx2(w, row, x + (size_t)t * xs, c0, len, dec), m, a[t][kb & 1]);
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = v16_hsum(v16_add(a[t][0], a[t][1]));
}

/* The 16 group scales of span m of row r in lane order (lane 4q + p <-
 * group 4p + q), with scale_of's values (0 past the last group). */
static inline v16 fp4q_scales_avx2(const ds_weight *w, int r, int m, int left) {
    if (left >= 16 && !w->scale_f32) {
        const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        __m128i e = _mm_shuffle_epi8(
            _mm_loadu_si128((const __m128i *)(const void *)(w->scale + (size_t)r * (size_t)w->scale_cols + 16 * (size_t)m)),
            order);
        __m256i lo = _mm256_cvtepu8_epi32(e), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(e, 8));
        __m256i blo = _mm256_slli_epi32(lo, 23), bhi = _mm256_slli_epi32(hi, 23);
        if (!w->scale_plain) { /* e8m0(): 0 -> 2^-127, 255 -> NaN */
            const __m256i z = _mm256_setzero_si256(), ff = _mm256_set1_epi32(255);
            const __m256i tiny = _mm256_set1_epi32(0x00400000), nan = _mm256_set1_epi32(0x7FC00000);
            blo = _mm256_blendv_epi8(_mm256_blendv_epi8(blo, tiny, _mm256_cmpeq_epi32(lo, z)), nan, _mm256_cmpeq_epi32(lo, ff));
            bhi = _mm256_blendv_epi8(_mm256_blendv_epi8(bhi, tiny, _mm256_cmpeq_epi32(hi, z)), nan, _mm256_cmpeq_epi32(hi, ff));
        }
        return (v16){_mm256_castsi256_ps(blo), _mm256_castsi256_ps(bhi)};
    }
    float s[16];
    for (int l = 0; l < 16; l++) s[l] = fp4_scale(w, r, 16 * m + 4 * (l & 3) + (l >> 2));
    return (v16){_mm256_loadu_ps(s), _mm256_loadu_ps(s + 8)};
}

/* MXFP4 rows x nt tokens, x in the Q4 layout: each 128-bit lane of a 32-byte
 * load is one group; codes become unsigned w2 + 12 (vpshufb), products u8 x
 * s8 in pairs (vpmaddubsw: at most 2 * 24 * 128 = 6144, no saturation; the
 * even and odd columns' pairs added in 16 bits, at most 12288), then pairs
 * of pairs (vpmaddwd by 1). Per span and half h, the loads of groups 4p +
 * 2h, 4p + 2h + 1 (p = 0..3) give per token 8 dwords of partial sums each,
 * and a hadd tree puts group 4p + q (q = 2h, 2h + 1) in lane 4q + p — exact
 * integers, in any grouping; then minus C and one fp32 fma per group,
 * fp4_span_acc's operations. */
__attribute__((always_inline)) static inline void fp4q_t_avx2(const ds_weight *w, int r, const float *xq, size_t xs,
                                                               float *out, const int nt, const int l2) {
    int G = w->cols / DS_FP4_GROUP;
    const uint8_t *row = w->data + (size_t)r * (size_t)(w->cols / 2);
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi16(1);
    v16 acc[AVX2_NT];
    UNROLL for (int t = 0; t < nt; t++) acc[t] = v16_zero();
    for (int m = 0; 16 * m < G; m++) {
        const uint8_t *p = row + 256 * (size_t)m;
        PF_SPAN(p);
        int left = G - 16 * m;
        v16 ws = fp4q_scales_avx2(w, r, m, left);
        __m256i S[AVX2_NT][2][2]; /* [token][half][H, L] */
        UNROLL for (int h = 0; h < 2; h++) {
            __m256i u[AVX2_NT][2], v2[AVX2_NT][2];
            UNROLL for (int b = 0; b < 4; b++) {
                int g = 4 * b + 2 * h; /* groups g, g + 1 of the span */
                __m256i d;
                if (left >= 16 || g + 2 <= left)
                    d = _mm256_loadu_si256((const __m256i *)(const void *)(p + 16 * g));
                else if (g < left) /* one group: the other lane's bytes 0 (its x is 0 too) */
                    d = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * g)));
                else
                    d = _mm256_setzero_si256();
                __m256i L = _mm256_shuffle_epi8(tbl, _mm256_and_si256(d, m4));
                __m256i H = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(d, 4), m4));
                UNROLL for (int t = 0; t < nt; t++) {
                    const uint8_t *x0 =
                        (const uint8_t *)(xq + (size_t)t * xs) + (size_t)m * Q4_SPAN_BYTES + Q4_BLK * b + 32 * h;
#define LDX(o) _mm256_loadu_si256((const __m256i *)(const void *)(x0 + (o)))
#define DIG(o) _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(L, LDX(o)), _mm256_maddubs_epi16(H, LDX((o) + 64))), one)
                    __m256i vv[2] = {_mm256_add_epi32(_mm256_slli_epi32(DIG(0), 8), DIG(128)), DIG(256)};
#undef DIG
#undef LDX
                    UNROLL for (int k = 0; k < 2; k++) {
                        if (b == 0 || b == 2)
                            v2[t][k] = vv[k];
                        else if (b == 1)
                            u[t][k] = _mm256_hadd_epi32(v2[t][k], vv[k]);
                        else
                            S[t][h][k] = _mm256_hadd_epi32(u[t][k], _mm256_hadd_epi32(v2[t][k], vv[k]));
                    }
                }
            }
        }
        const __m256 k256 = _mm256_set1_ps(256.0f);
        UNROLL for (int t = 0; t < nt; t++) {
            const uint8_t *sp = (const uint8_t *)(xq + (size_t)t * xs) + (size_t)m * Q4_SPAN_BYTES;
            const float *sx = (const float *)(const void *)(sp + Q4_SX);
            __m256 Sf[2];
            UNROLL for (int h = 0; h < 2; h++) {
                __m256i ch = _mm256_loadu_si256((const __m256i *)(const void *)(sp + Q4_CH + 32 * h));
                __m256i cl = _mm256_loadu_si256((const __m256i *)(const void *)(sp + Q4_CL + 32 * h));
                Sf[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(S[t][h][0], ch)), k256,
                                        _mm256_cvtepi32_ps(_mm256_sub_epi32(S[t][h][1], cl)));
            }
            acc[t].lo = _mm256_fmadd_ps(Sf[0], _mm256_mul_ps(ws.lo, _mm256_loadu_ps(sx)), acc[t].lo);
            acc[t].hi = _mm256_fmadd_ps(Sf[1], _mm256_mul_ps(ws.hi, _mm256_loadu_ps(sx + 8)), acc[t].hi);
        }
    }
    UNROLL for (int t = 0; t < nt; t++) out[t] = v16_hsum(acc[t]);
}

/* ---- AVX-512 prefill tiles: 2 rows x up to 3 tokens, weights decoded once ----
 * For many tokens the row kernels above re-decode each weight chunk for every
 * few tokens and re-read every token's x (from L2) for every pair of rows. The
 * tiled path instead decodes a panel of KP = DS_CPU_FP8_PANEL columns of a
 * group's rows once per token block into a small buffer (the same floats
 * dec16k gives), then runs 2-row x 3-token tiles over it with every
 * accumulator in a register (A: 12, the block's two chains: 12), and parks
 * the 12 A vectors between panels. x is laid out panel-major (panel, token,
 * column), so a tile's tokens and rows sit KP floats apart. Each (row, token)
 * still goes through exactly fp8_t_512's operations in the same order (chunk
 * j -> B[j % 2] from 0, A[kb % 2] = fma(B0 + B1, m, A[kb % 2]), y = hsum(A0 +
 * A1)), so the bits are those of every other path; which tokens share a tile
 * changes nothing (each lane of each accumulator is one (row, token)'s). */
#define TILE_T 3 /* tokens per tile */
#define KP DS_CPU_FP8_PANEL

/* w: the pair's decoded rows (the second KP floats after the first); x: the
 * tile's first token (the others KP floats apart); m0, m1: the rows' block
 * multipliers (m1 = m0 + KP / 128); nb (even) blocks. */
AVX512 __attribute__((always_inline)) static inline void fp8_tile_512(const float *w, const float *x, int nb,
                                                                       const float *m0, __m512 A[2][TILE_T][2],
                                                                       const int nt) {
    for (int b = 0; b < nb; b += 2) {
        UNROLL for (int h = 0; h < 2; h++) {
            const float *wa = w + (size_t)(b + h) * DS_FP8_BLOCK, *xb = x + (size_t)(b + h) * DS_FP8_BLOCK;
            __m512 B0[2][TILE_T], B1[2][TILE_T];
            UNROLL for (int j = 0; j < DS_FP8_BLOCK; j += 16) {
                __m512 u0 = _mm512_loadu_ps(wa + j), u1 = _mm512_loadu_ps(wa + KP + j);
                __asm__("" : "+v"(u0), "+v"(u1)); /* each loaded once, into a register (not folded */
                UNROLL for (int t = 0; t < nt; t++) { /* into every FMA that uses it) */
                    __m512 xv = _mm512_loadu_ps(xb + t * KP + j);
                    __asm__("" : "+v"(xv));
                    if (j & 16) {
                        B1[0][t] = _mm512_fmadd_ps(u0, xv, j > 16 ? B1[0][t] : _mm512_setzero_ps());
                        B1[1][t] = _mm512_fmadd_ps(u1, xv, j > 16 ? B1[1][t] : _mm512_setzero_ps());
                    } else {
                        B0[0][t] = _mm512_fmadd_ps(u0, xv, j ? B0[0][t] : _mm512_setzero_ps());
                        B0[1][t] = _mm512_fmadd_ps(u1, xv, j ? B0[1][t] : _mm512_setzero_ps());
                    }
                }
            }
            __m512 s0 = _mm512_set1_ps(m0[b + h]), s1 = _mm512_set1_ps(m0[KP / DS_FP8_BLOCK + b + h]);
            UNROLL for (int t = 0; t < nt; t++) {
                A[0][t][h] = _mm512_fmadd_ps(_mm512_add_ps(B0[0][t], B1[0][t]), s0, A[0][t][h]);
                A[1][t][h] = _mm512_fmadd_ps(_mm512_add_ps(B0[1][t], B1[1][t]), s1, A[1][t][h]);
            }
        }
    }
}

/* One tile: A (parked as [2 rows][TILE_T][2][16] floats) in, nb blocks, A out. */
AVX512 __attribute__((always_inline)) static inline void fp8_tile_run(const float *w, const float *x, int nb,
                                                                       const float *m0, float *park, const int nt) {
    __m512 A[2][TILE_T][2];
    UNROLL for (int r = 0; r < 2; r++) UNROLL for (int t = 0; t < nt; t++) UNROLL for (int h = 0; h < 2; h++)
        A[r][t][h] = _mm512_loadu_ps(park + ((r * TILE_T + t) * 2 + h) * 16);
    fp8_tile_512(w, x, nb, m0, A, nt);
    UNROLL for (int r = 0; r < 2; r++) UNROLL for (int t = 0; t < nt; t++) UNROLL for (int h = 0; h < 2; h++)
        _mm512_storeu_ps(park + ((r * TILE_T + t) * 2 + h) * 16, A[r][t][h]);
}

AVX512 static void fp8_tile_n(const float *w, const float *x, int nb, const float *m0, float *park, int nt) {
    switch (nt) {
    case 1: fp8_tile_run(w, x, nb, m0, park, 1); break;
    case 2: fp8_tile_run(w, x, nb, m0, park, 2); break;
    default: fp8_tile_run(w, x, nb, m0, park, TILE_T); break;
    }
}

/* Columns [c0, c0 + n) of FP8 row `row` decoded as dec16k does (n % 64 ==
 * 0), prefetching the line at pf + c (what the next panel will read). */
AVX512 static void fp8_decode_512(const uint8_t *row, int c0, int n, float *out, int raw, const uint8_t *pf) {
    for (int c = 0; c < n; c += 64) {
        _mm_prefetch((const char *)pf + c, _MM_HINT_T0);
        UNROLL for (int k = 0; k < 64; k += 16)
            _mm512_storeu_ps(out + c + k, raw ? dec16k(row, c0 + c + k, FP8_RAW) : dec16k(row, c0 + c + k, DS_W_FP8));
    }
}

AVX512 static float hsum_park(const float *a) { /* hsum(A0 + A1) of a parked pair */
    return hsum16_512(_mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(a + 16)));
}

/* BF16 prefill tiles (AVX-512): the dense order over the same panels. A
 * tile is 4 rows x up to TILE_T tokens; a (row, token) keeps four chains,
 * chunk c -> P[c % 4] (a panel starts on a chunk that is a multiple of 4),
 * run in two passes over the panel (chains 0, 1, then 2, 3: 24 accumulators,
 * 4 weights and 1 x in registers, each x load feeding 4 FMAs) and parked
 * between passes as [4 rows][TILE_T][4][16] floats; y = hsum((P0 + P1) +
 * (P2 + P3)): dense_t_512's operations, so the bits of every path.
 * w: the 4 rows' decoded panels (KP apart); n: columns, n % 64 == 0. */
AVX512 __attribute__((always_inline)) static inline void bf16_tile_run(const float *w, const float *x, int n,
                                                                        float *park, const int nt) {
    UNROLL for (int h = 0; h < 2; h++) {
        __m512 P[4][TILE_T][2];
        UNROLL for (int r = 0; r < 4; r++) UNROLL for (int t = 0; t < nt; t++) UNROLL for (int k = 0; k < 2; k++)
            P[r][t][k] = _mm512_loadu_ps(park + ((r * TILE_T + t) * 4 + 2 * h + k) * 16);
        for (int c = 0; c < n; c += 64)
            UNROLL for (int k = 0; k < 2; k++) {
                int o = c + 16 * (2 * h + k);
                __m512 u0 = _mm512_loadu_ps(w + o), u1 = _mm512_loadu_ps(w + KP + o);
                __m512 u2 = _mm512_loadu_ps(w + 2 * KP + o), u3 = _mm512_loadu_ps(w + 3 * KP + o);
                __asm__("" : "+v"(u0), "+v"(u1), "+v"(u2), "+v"(u3)); /* each loaded once (see fp8_tile_512) */
                UNROLL for (int t = 0; t < nt; t++) {
                    __m512 xv = _mm512_loadu_ps(x + t * KP + o);
                    __asm__("" : "+v"(xv));
                    P[0][t][k] = _mm512_fmadd_ps(u0, xv, P[0][t][k]);
                    P[1][t][k] = _mm512_fmadd_ps(u1, xv, P[1][t][k]);
                    P[2][t][k] = _mm512_fmadd_ps(u2, xv, P[2][t][k]);
                    P[3][t][k] = _mm512_fmadd_ps(u3, xv, P[3][t][k]);
                }
            }
        UNROLL for (int r = 0; r < 4; r++) UNROLL for (int t = 0; t < nt; t++) UNROLL for (int k = 0; k < 2; k++)
            _mm512_storeu_ps(park + ((r * TILE_T + t) * 4 + 2 * h + k) * 16, P[r][t][k]);
    }
}

AVX512 static void bf16_tile_n(const float *w, const float *x, int n, float *park, int nt) {
    switch (nt) {
    case 1: bf16_tile_run(w, x, n, park, 1); break;
    case 2: bf16_tile_run(w, x, n, park, 2); break;
    default: bf16_tile_run(w, x, n, park, TILE_T); break;
    }
}

/* Columns [c0, c0 + n) of BF16 row r (n % 64 == 0) as the floats the row
 * kernels multiply: from the packed copy when there is one (its escapes
 * patched in), else the bf16 bits; prefetches the row's next panel. */
AVX512 static void bf16_decode_512(const ds_weight *w, int r, int c0, int n, float *out) {
    const ds_cpu_bf16x *pk = w->packed;
    if (!pk) {
        const uint8_t *row = w->data + (size_t)r * row_bytes(w);
        for (int c = 0; c < n; c += 64) {
            _mm_prefetch((const char *)row + 2 * (size_t)(c0 + c + KP), _MM_HINT_T0);
            _mm_prefetch((const char *)row + 2 * (size_t)(c0 + c + KP) + 64, _MM_HINT_T0);
            UNROLL for (int k = 0; k < 64; k += 16) _mm512_storeu_ps(out + c + k, dec16k(row, c0 + c + k, DS_W_BF16));
        }
        return;
    }
    int U = w->cols / 64;
    const uint8_t *row = pk->units + (size_t)r * (size_t)U * 96;
    const __m512i tbl = bf16x_tbl_512(pk, r);
    for (int c = 0; c < n; c += 64) {
        const uint8_t *q = row + (size_t)((c0 + c) / 64) * 96;
        _mm_prefetch((const char *)q + KP / 64 * 96, _MM_HINT_T0);
        _mm_prefetch((const char *)q + KP / 64 * 96 + 64, _MM_HINT_T0);
        __m512 f[4];
        bf16x_unit_512(q, tbl, f);
        UNROLL for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + c + 16 * j, f[j]);
    }
    for (const ds_cpu_bf16x_esc *e = pk->ents + pk->eoff[r], *end = pk->ents + pk->eoff[r + 1]; e < end; e++)
        if ((int)e->col >= c0 && (int)e->col < c0 + n) {
            uint32_t v = (uint32_t)e->bits << 16;
            memcpy(out + (e->col - (uint32_t)c0), &v, 4);
        }
}

AVX512 static float hsum_park4(const float *p) { /* hsum((P0 + P1) + (P2 + P3)) of a parked quad */
    return hsum16_512(_mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)),
                                    _mm512_add_ps(_mm512_loadu_ps(p + 32), _mm512_loadu_ps(p + 48))));
}

/* nt in [1, NT] tokens of row r: the instance for each count */
#define NT_CASES(call) \
    switch (nt) {      \
    case 1: call(1); break; \
    case 2: call(2); break; \
    case 3: call(3); break; \
    default: call(NT); break; \
    }

#define ROWT_A(attr, name, call)                                                                 \
    attr static void name(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out) { \
        NT_CASES(call)                                                                           \
    }
#define ROWT(name, call) ROWT_A(AVX512, name, call)
/* each kernel twice: prefetching into L1 (L2 = 0, no suffix) and into L2
 * (L2 = 1, suffix _l2). rowt_fp8raw*: x scaled by 2^112 (mm_prepare does it
 * when fp8_raw_ok); rowt_fp4q*: x in the Q4 layout; rowt2_*: rows r, r + 1,
 * K % 256 == 0. */
#define FP8_N(n) fp8_t_512(w, r, x, xs, out, n, DS_W_FP8, L2)
#define FP8RAW_N(n) fp8_t_512(w, r, x, xs, out, n, FP8_RAW, L2)
#define BF16_N(n) dense_t_512(w, r, x, xs, out, n, DS_W_BF16, L2)
#define BF16X_N(n) bf16x_t_512(w, r, x, xs, out, n, L2)
#define F16_N(n) dense_t_512(w, r, x, xs, out, n, DS_W_F16, L2)
#define F32_N(n) dense_t_512(w, r, x, xs, out, n, DS_W_F32, L2)
#define FP4Q_N(n) fp4q_t_512(w, r, x, xs, out, n, L2)
#define FP8_2N(n) fp8_t2_512(w, r, x, xs, out, n, DS_W_FP8, L2)
#define FP8RAW_2N(n) fp8_t2_512(w, r, x, xs, out, n, FP8_RAW, L2)
#define FP4Q_2N(n) fp4q_t2_512(w, r, x, xs, out, n, L2)
#define ROWT_SET(S)                                   \
    ROWT(rowt_fp8_512##S, FP8_N)                      \
    ROWT(rowt_fp8raw_512##S, FP8RAW_N)                \
    ROWT(rowt_bf16_512##S, BF16_N)                    \
    ROWT(rowt_bf16x_512##S, BF16X_N)                  \
    ROWT(rowt_f16_512##S, F16_N)                      \
    ROWT(rowt_f32_512##S, F32_N)                      \
    ROWT_A(AVX512VNNI, rowt_fp4q_512##S, FP4Q_N)      \
    ROWT(rowt2_fp8_512##S, FP8_2N)                    \
    ROWT(rowt2_fp8raw_512##S, FP8RAW_2N)             \
    ROWT_A(AVX512VNNI, rowt2_fp4q_512##S, FP4Q_2N)
#define L2 0
ROWT_SET()
#undef L2
#define L2 1
ROWT_SET(_l2)
#undef L2

/* the AVX2 instances: tokens AVX2_NT at a time */
#define ROWT_AVX2(name, call)                                                                    \
    static void name(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out) { \
        for (int t0 = 0; t0 < nt;) {                                                             \
            const float *xt = x + (size_t)t0 * xs;                                               \
            if (nt - t0 >= AVX2_NT) {                                                            \
                call(xt, out + t0, AVX2_NT);                                                     \
                t0 += AVX2_NT;                                                                   \
            } else {                                                                             \
                call(xt, out + t0, 1);                                                           \
                t0++;                                                                            \
            }                                                                                    \
        }                                                                                        \
    }
#define A2_FP8(xt, o, n) fp8_t_avx2(w, r, xt, xs, o, n, DS_W_FP8, L2)
#define A2_FP8RAW(xt, o, n) fp8_t_avx2(w, r, xt, xs, o, n, FP8_RAW, L2)
#define A2_BF16(xt, o, n) dense_t_avx2(w, r, xt, xs, o, n, DS_W_BF16, L2)
#define A2_BF16X(xt, o, n) bf16x_t_avx2(w, r, xt, xs, o, n, L2)
#define A2_F16(xt, o, n) dense_t_avx2(w, r, xt, xs, o, n, DS_W_F16, L2)
#define A2_F32(xt, o, n) dense_t_avx2(w, r, xt, xs, o, n, DS_W_F32, L2)
#define A2_FP4Q(xt, o, n) fp4q_t_avx2(w, r, xt, xs, o, n, L2)
#define ROWT_AVX2_SET(S)                      \
    ROWT_AVX2(rowt_fp8_avx2##S, A2_FP8)       \
    ROWT_AVX2(rowt_fp8raw_avx2##S, A2_FP8RAW) \
    ROWT_AVX2(rowt_bf16_avx2##S, A2_BF16)     \
    ROWT_AVX2(rowt_bf16x_avx2##S, A2_BF16X)   \
    ROWT_AVX2(rowt_f16_avx2##S, A2_F16)       \
    ROWT_AVX2(rowt_f32_avx2##S, A2_F32)       \
    ROWT_AVX2(rowt_fp4q_avx2##S, A2_FP4Q)
#define L2 0
ROWT_AVX2_SET()
#undef L2
#define L2 1
ROWT_AVX2_SET(_l2)
#undef L2
#endif

typedef float (*row_fn)(const ds_weight *, int, const float *);
/* nt (<= NT) tokens of row r: out[t] from x + t * xs */
typedef void (*rowt_fn)(const ds_weight *, int, const float *, size_t, int, float *);

/* The single-token row kernel of the portable path (the SIMD paths have a
 * multi-token kernel for every kind); MXFP4's takes x in the Q4 layout. */
static row_fn row_for(int fp4) { return fp4 ? row_fp4_generic : ds_cpu_row_dot; }

/* The multi-token row kernel of the AVX-512 path (NULL on the others);
 * l2: the instance that prefetches into L2. */
static rowt_fn rowt_for(int path, const ds_weight *w, int raw, int l2) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512 && w->packed && w->kind == DS_W_BF16) return l2 ? rowt_bf16x_512_l2 : rowt_bf16x_512;
    if (path == DS_CPU_AVX2 && w->packed && w->kind == DS_W_BF16) return l2 ? rowt_bf16x_avx2_l2 : rowt_bf16x_avx2;
    if ((path == DS_CPU_AVX2 || path == DS_CPU_AVX512) && w->kind == DS_W_FP4 && !ds_cpu_has_vnni())
        return l2 ? rowt_fp4q_avx2_l2 : rowt_fp4q_avx2;
    if (path == DS_CPU_AVX2) switch (w->kind) {
        case DS_W_FP8: return raw ? (l2 ? rowt_fp8raw_avx2_l2 : rowt_fp8raw_avx2) : l2 ? rowt_fp8_avx2_l2 : rowt_fp8_avx2;
        case DS_W_FP4: return NULL; /* not reached */
        case DS_W_BF16: return l2 ? rowt_bf16_avx2_l2 : rowt_bf16_avx2;
        case DS_W_F16: return l2 ? rowt_f16_avx2_l2 : rowt_f16_avx2;
        case DS_W_F32: return l2 ? rowt_f32_avx2_l2 : rowt_f32_avx2;
        }
    if (path == DS_CPU_AVX512) switch (w->kind) {
        case DS_W_FP8: return raw ? (l2 ? rowt_fp8raw_512_l2 : rowt_fp8raw_512) : l2 ? rowt_fp8_512_l2 : rowt_fp8_512;
        case DS_W_FP4: return l2 ? rowt_fp4q_512_l2 : rowt_fp4q_512;
        case DS_W_BF16: return l2 ? rowt_bf16_512_l2 : rowt_bf16_512;
        case DS_W_F16: return l2 ? rowt_f16_512_l2 : rowt_f16_512;
        case DS_W_F32: return l2 ? rowt_f32_512_l2 : rowt_f32_512;
        }
#endif
    (void)path, (void)w, (void)raw, (void)l2;
    return NULL;
}

/* The two-row kernel of the AVX-512 path where one exists for w (NULL otherwise). */
static rowt_fn rowt2_for(int path, const ds_weight *w, int raw, int l2) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512 && w->kind == DS_W_FP8 && w->cols % (2 * DS_FP8_BLOCK) == 0)
        return raw ? (l2 ? rowt2_fp8raw_512_l2 : rowt2_fp8raw_512) : l2 ? rowt2_fp8_512_l2 : rowt2_fp8_512;
    if (path == DS_CPU_AVX512 && w->kind == DS_W_FP4 && ds_cpu_has_vnni()) return l2 ? rowt2_fp4q_512_l2 : rowt2_fp4q_512;
#endif
    (void)path, (void)w, (void)raw, (void)l2;
    return NULL;
}

float ds_cpu_dot(const float *a, const float *b, int n, int path) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512) {
        ds_weight w = {.kind = DS_W_F32, .rows = 1, .cols = n, .data = (const uint8_t *)a};
        float y;
        rowt_f32_512(&w, 0, b, 0, 1, &y);
        return y;
    }
#endif
    (void)path;
    return ds_dot_f32(a, b, n);
}

float ds_dot_f32(const float *a, const float *b, int n) {
#ifdef DS_X86
    /* the dense order (chunk c -> P[c % 4]) for F32 rows, without dispatch */
    v16 p0 = v16_zero(), p1 = p0, p2 = p0, p3 = p0;
    int c = 0;
    for (; c + 64 <= n; c += 64) {
        p0 = v16_fma(_mm256_loadu_ps(a + c), _mm256_loadu_ps(a + c + 8), b + c, p0);
        p1 = v16_fma(_mm256_loadu_ps(a + c + 16), _mm256_loadu_ps(a + c + 24), b + c + 16, p1);
        p2 = v16_fma(_mm256_loadu_ps(a + c + 32), _mm256_loadu_ps(a + c + 40), b + c + 32, p2);
        p3 = v16_fma(_mm256_loadu_ps(a + c + 48), _mm256_loadu_ps(a + c + 56), b + c + 48, p3);
    }
    if (c < n) { /* the last partial round, through the general path's order */
        v16 *q[4] = {&p0, &p1, &p2, &p3};
        for (int i = 0; i < 4 && c + 16 * i < n; i++) {
            int m = n - c - 16 * i < 16 ? n - c - 16 * i : 16;
            float ta[16] = {0}, tb[16] = {0};
            memcpy(ta, a + c + 16 * i, sizeof(float) * (size_t)m);
            memcpy(tb, b + c + 16 * i, sizeof(float) * (size_t)m);
            *q[i] = v16_fma(_mm256_loadu_ps(ta), _mm256_loadu_ps(ta + 8), tb, *q[i]);
        }
    }
    return v16_hsum(v16_add(v16_add(p0, p1), v16_add(p2, p3)));
#else
    ds_weight w = {.kind = DS_W_F32, .rows = 1, .cols = n, .data = (const uint8_t *)a};
    return ds_cpu_row_dot(&w, 0, b);
#endif
}

#define TOKEN_BLOCK DS_CPU_TOKEN_BLOCK

/* how a product reads its x copy: plain, quantized (the Q4 layout), scaled by 2^112 (FP8_RAW);
 * X_T*: panel-major for the prefill tiles */
enum { X_PLAIN, X_Q4, X_RAW, X_TPLAIN, X_TRAW };

/* A product ready to run: x copied (see mm_prepare), its row kernel, and
 * (set per token block) its first row group in the block's numbering. */
typedef struct {
    const ds_weight *w;
    float *xp;
    size_t xstride; /* floats between tokens of xp */
    int T, g0, groups;
    float *y;
    row_fn row;     /* one token at a time ... */
    rowt_fn rowt;   /* ... or up to NT (when not NULL) */
    rowt_fn rowt2;  /* two rows of up to NT tokens (when not NULL) */
    const float *x; /* the caller's x */
    int fmt;        /* X_* */
    int tile;       /* x panel-major, the products through the prefill tiles (the path: AVX-512 or AVX2), or 0 */
    int rg;         /* rows per group: DS_CPU_ROW_GROUP, or DS_CPU_TILE_ROWS when tiled */
    int pair1;      /* rows in pairs (rowt2) at any token count: x does not stay in L1 */
} mm_prep;

typedef struct {
    const mm_prep *p;
    int n, t0; /* tokens [t0, t0 + TOKEN_BLOCK) */
} mm_job;

#ifdef DS_X86
/* ---- AVX2 prefill tiles: 2 rows x 2 tokens over decoded panels ----
 * fp8_group_tiled's plan with sixteen ymm registers. A tile is a pair of
 * rows and up to 2 tokens; inside each 128-column block it runs the even
 * chunks (the B0 chains of its four (row, token)s: 8 registers), parks them,
 * then the odd chunks (B1), so 4 weight registers and 1 for x are left and
 * every load feeds two FMAs: each x vector meets both rows, each weight
 * vector both tokens. Then A[b % 2] = fma(B0 + B1, m, A[b % 2]) through the
 * park. Each chain takes its chunks in ascending order: the operations, and
 * so the bits, of fp8_t_avx2 (and every path). */
#define TILE_T2 2 /* tokens per AVX2 tile */
/* w: the pair's decoded panels (the second KP floats after the first); x: the
 * tile's first token (the other KP apart); m0: the first row's block
 * multipliers (the second's NBP further); park: A as [2 rows][TILE_T2][2][16]. */
__attribute__((always_inline)) static inline void fp8_tile_avx2(const float *w, const float *x, int nb, const float *m0,
                                                                 float *park, const int nt) {
    enum { NBP = KP / DS_FP8_BLOCK };
    for (int b = 0; b < nb; b++) { /* a panel starts on an even block: A[b % 2] */
        const float *wa = w + (size_t)b * DS_FP8_BLOCK, *xb = x + (size_t)b * DS_FP8_BLOCK;
        v16 B[2][TILE_T2];
        _Alignas(32) float b0[2][TILE_T2][16];
        UNROLL for (int par = 0; par < 2; par++) {
            UNROLL for (int j = 16 * par; j < DS_FP8_BLOCK; j += 32) {
                __m256 u0l = _mm256_loadu_ps(wa + j), u0h = _mm256_loadu_ps(wa + j + 8);
                __m256 u1l = _mm256_loadu_ps(wa + KP + j), u1h = _mm256_loadu_ps(wa + KP + j + 8);
                __asm__("" : "+x"(u0l), "+x"(u0h), "+x"(u1l), "+x"(u1h)); /* each loaded once */
                UNROLL for (int t = 0; t < nt; t++) {
                    const float *xv = xb + (size_t)t * KP + j;
                    int first = j == 16 * par;
                    __m256 xl = _mm256_loadu_ps(xv);
                    __asm__("" : "+x"(xl));
                    B[0][t].lo = _mm256_fmadd_ps(u0l, xl, first ? _mm256_setzero_ps() : B[0][t].lo);
                    B[1][t].lo = _mm256_fmadd_ps(u1l, xl, first ? _mm256_setzero_ps() : B[1][t].lo);
                    __m256 xh = _mm256_loadu_ps(xv + 8);
                    __asm__("" : "+x"(xh));
                    B[0][t].hi = _mm256_fmadd_ps(u0h, xh, first ? _mm256_setzero_ps() : B[0][t].hi);
                    B[1][t].hi = _mm256_fmadd_ps(u1h, xh, first ? _mm256_setzero_ps() : B[1][t].hi);
                }
            }
            if (par == 0)
                UNROLL for (int r = 0; r < 2; r++) UNROLL for (int t = 0; t < nt; t++) {
                        _mm256_store_ps(b0[r][t], B[r][t].lo);
                        _mm256_store_ps(b0[r][t] + 8, B[r][t].hi);
                    }
        }
        UNROLL for (int r = 0; r < 2; r++) UNROLL for (int t = 0; t < nt; t++) {
                float *a = park + (((size_t)r * TILE_T2 + (size_t)t) * 2 + (size_t)(b & 1)) * 16;
                v16 A = {_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8)};
                v16 s = v16_add((v16){_mm256_load_ps(b0[r][t]), _mm256_load_ps(b0[r][t] + 8)}, B[r][t]);
                A = v16_fma_s(s, m0[r * NBP + b], A);
                _mm256_storeu_ps(a, A.lo);
                _mm256_storeu_ps(a + 8, A.hi);
            }
    }
}

static void fp8_tile_n_avx2(const float *w, const float *x, int nb, const float *m0, float *park, int nt) {
    if (nt == 1)
        fp8_tile_avx2(w, x, nb, m0, park, 1);
    else
        fp8_tile_avx2(w, x, nb, m0, park, TILE_T2);
}

/* fp8_decode_512 on the AVX2 path: the same floats. */
static void fp8_decode_avx2(const uint8_t *row, int c0, int n, float *out, int raw, const uint8_t *pf) {
    for (int c = 0; c < n; c += 64) {
        _mm_prefetch((const char *)pf + c, _MM_HINT_T0);
        UNROLL for (int k = 0; k < 64; k += 16) {
            v16 d = raw ? dec16_avx2(row, c0 + c + k, FP8_RAW) : dec16_avx2(row, c0 + c + k, DS_W_FP8);
            _mm256_storeu_ps(out + c + k, d.lo);
            _mm256_storeu_ps(out + c + k + 8, d.hi);
        }
    }
}

static float hsum_park_avx2(const float *a) { /* hsum(A0 + A1) of a parked pair */
    return v16_hsum(v16_add((v16){_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8)},
                            (v16){_mm256_loadu_ps(a + 16), _mm256_loadu_ps(a + 24)}));
}

/* Rows [r0, r1) (at most DS_CPU_TILE_ROWS) x tokens [t0, t1) (at most
 * TOKEN_BLOCK) of an FP8 product (bf: a BF16 one, AVX-512 only) through the
 * prefill tiles: per panel of columns the rows are decoded once, then every
 * token tile (wide, AVX-512: TILE_T tokens; else AVX2: TILE_T2) meets each
 * pair of rows (BF16: each 4) while its x stays in L1. A partial last tile
 * of rows is filled with copies of the last row (their results dropped). */
__attribute__((always_inline)) static inline void group_tiled_on(const mm_prep *p, int r0, int r1, int t0, int t1,
                                                                  const int wide, const int bf) {
    enum { RG = DS_CPU_TILE_ROWS, NBP = KP / DS_FP8_BLOCK, NTILE = (TOKEN_BLOCK + TILE_T2 - 1) / TILE_T2 };
    const int TT = wide ? TILE_T : TILE_T2; /* NTILE: the larger count (TILE_T2 <= TILE_T) */
    const int CH = bf ? 4 : 2;              /* parked chains per (row, token) */
    const int TR = bf ? 4 : 2;              /* rows per tile */
    const ds_weight *w = p->w;
    int K = w->cols, R = w->rows, nr = r1 - r0, ntile = (t1 - t0 + TT - 1) / TT;
    int np = (nr + TR - 1) / TR * TR;       /* rows with the padding copies of the last */
    size_t tsz = (size_t)(TR * TT * CH) * 16; /* floats a parked tile */
    _Alignas(64) float wb[(RG + 3) / 4 * 4][KP];
    float m[(RG + 3) / 4 * 4][NBP];
    _Alignas(64) float park[NTILE * ((RG + 3) / 4) * 4 * TILE_T * 4 * 16];
    memset(park, 0, sizeof(float) * (size_t)(np / TR) * (size_t)ntile * tsz);
    int raw = p->fmt == X_TRAW;
    for (int c0 = 0, pn = 0; c0 < K; c0 += KP, pn++) {
        int ncol = K - c0 < KP ? K - c0 : KP, nb = ncol / DS_FP8_BLOCK;
        for (int i = 0; i < nr; i++) {
            if (bf) {
                bf16_decode_512(w, r0 + i, c0, ncol, wb[i]);
                continue;
            }
            const uint8_t *row = w->data + (size_t)(r0 + i) * (size_t)K;
            /* prefetch this row's next panel, or after the last one the
             * same row of the next group (likely this thread's next) */
            const uint8_t *pf = row + c0 + KP + (c0 + KP >= K ? (size_t)(RG - 1) * (size_t)K : 0);
            if (wide)
                fp8_decode_512(row, c0, nb * DS_FP8_BLOCK, wb[i], raw, pf);
            else
                fp8_decode_avx2(row, c0, nb * DS_FP8_BLOCK, wb[i], raw, pf);
            size_t srow = fp8_srow(w, r0 + i) + (size_t)(c0 / DS_FP8_BLOCK);
            for (int b = 0; b < nb; b++) m[i][b] = scale_of(w, srow + (size_t)b) * 256.0f;
        }
        for (int i = nr; i < np; i++) {
            memcpy(wb[i], wb[nr - 1], sizeof wb[0]);
            if (!bf) memcpy(m[i], m[nr - 1], sizeof m[0]); /* BF16 has no block multipliers */
        }
        const float *xpn = p->xp + ((size_t)pn * (size_t)p->T + (size_t)t0) * KP;
        for (int tt = 0; tt < ntile; tt++) {
            int nt = t1 - t0 - tt * TT < TT ? t1 - t0 - tt * TT : TT;
            for (int i = 0; i < nr; i += TR) {
                float *pk = park + ((size_t)(i / TR) * (size_t)ntile + (size_t)tt) * tsz;
                if (bf)
                    bf16_tile_n(wb[i], xpn + (size_t)tt * TT * KP, ncol, pk, nt);
                else if (wide)
                    fp8_tile_n(wb[i], xpn + (size_t)tt * TT * KP, nb, m[i], pk, nt);
                else
                    fp8_tile_n_avx2(wb[i], xpn + (size_t)tt * TT * KP, nb, m[i], pk, nt);
            }
        }
    }
    for (int tt = 0; tt < ntile; tt++) {
        int t = t0 + tt * TT, nt = t1 - t < TT ? t1 - t : TT;
        for (int i = 0; i < nr; i++)
            for (int k = 0; k < nt; k++) {
                const float *a = park + ((size_t)(i / TR) * (size_t)ntile + (size_t)tt) * tsz +
                                 (size_t)(((i % TR) * TT + k) * CH) * 16;
                p->y[(size_t)(t + k) * (size_t)R + (size_t)(r0 + i)] =
                    bf ? hsum_park4(a) : wide ? hsum_park(a) : hsum_park_avx2(a);
            }
    }
}

AVX512 static void fp8_group_tiled(const mm_prep *p, int r0, int r1, int t0, int t1) {
    group_tiled_on(p, r0, r1, t0, t1, 1, 0);
}
AVX512 static void bf16_group_tiled(const mm_prep *p, int r0, int r1, int t0, int t1) {
    group_tiled_on(p, r0, r1, t0, t1, 1, 1);
}
static void fp8_group_tiled_avx2(const mm_prep *p, int r0, int r1, int t0, int t1) {
    group_tiled_on(p, r0, r1, t0, t1, 0, 0);
}
#endif

/* Rows 4g..4g+3 of the product owning group g, one at a time (a single
 * memory stream per thread); the rows stay in cache while the block's tokens
 * pass. */
static void mm_group(void *ctx, int g) {
    const mm_job *j = ctx;
    int lo = 0, hi = j->n - 1; /* the last product with g0 <= g (a batch may hold hundreds) */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->p[mid].g0 <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    const mm_prep *p = &j->p[lo];
    const ds_weight *w = p->w;
    int R = w->rows, t1 = j->t0 + TOKEN_BLOCK < p->T ? j->t0 + TOKEN_BLOCK : p->T;
    int r0 = (g - p->g0) * p->rg, r1 = r0 + p->rg < R ? r0 + p->rg : R;
#ifdef DS_X86
    if (p->tile) {
        if (w->kind == DS_W_BF16)
            bf16_group_tiled(p, r0, r1, j->t0, t1);
        else if (p->tile == DS_CPU_AVX512)
            fp8_group_tiled(p, r0, r1, j->t0, t1);
        else
            fp8_group_tiled_avx2(p, r0, r1, j->t0, t1);
        return;
    }
#endif
    if (!p->rowt) {
        for (int r = r0; r < r1; r++)
            for (int t = j->t0; t < t1; t++)
                p->y[(size_t)t * (size_t)R + (size_t)r] = p->row(w, r, p->xp + (size_t)t * p->xstride);
        return;
    }
    /* tokens in groups whose x (up to 32 KiB) stays in L1 while the 4 rows pass:
     * re-reading x from L2 for every row halved the speed of prefill */
    int tg = (int)(DS_CPU_L1_X_BYTES / (sizeof(float) * p->xstride));
    tg = tg < 1 ? 1 : tg > NT ? NT : tg;
    /* from 3 tokens on, rows go in pairs that share each x load (x may then
     * come from L2): 2 tokens of 1 row were measured faster than of 2 */
    int pairs = p->rowt2 && (t1 - j->t0 >= 3 || p->pair1);
    if (pairs || p->fmt == X_Q4) tg = NT; /* Q4 x: 2.25 bytes per column */
    for (int t = j->t0; t < t1; t += tg) {
        int nt = t1 - t < tg ? t1 - t : tg, r = r0;
        if (pairs && (nt >= 2 || p->pair1))
            for (; r + 2 <= r1; r += 2) {
                float out[2 * NT];
                p->rowt2(w, r, p->xp + (size_t)t * p->xstride, p->xstride, nt, out);
                for (int i = 0; i < nt; i++) {
                    p->y[(size_t)(t + i) * (size_t)R + (size_t)r] = out[i];
                    p->y[(size_t)(t + i) * (size_t)R + (size_t)r + 1] = out[NT + i];
                }
            }
        for (; r < r1; r++) {
            float out[NT];
            p->rowt(w, r, p->xp + (size_t)t * p->xstride, p->xstride, nt, out);
            for (int i = 0; i < nt; i++) p->y[(size_t)(t + i) * (size_t)R + (size_t)r] = out[i];
        }
    }
}

/* 1 when every x is below 2^16 in magnitude (or not finite), so x * 2^112
 * is exact, and denormal inputs are not read as zero (MXCSR.DAZ clear): the
 * conditions under which the FP8_RAW kernels give the FP8 kernels' bits. */
static int fp8_raw_ok(const float *x, size_t n) {
#ifdef DS_X86
    if (_mm_getcsr() & 0x40) return 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) >= 65536.0f && isfinite(x[i])) return 0;
    return 1;
#else
    (void)x, (void)n;
    return 0;
#endif
}

/* Sets up product jb: its kernels and the layout of its x copy (rows on
 * 64-byte lines: no split vector loads; quantized (Q4 layout) for MXFP4; scaled by
 * 2^112 for FP8_RAW). Returns the floats its copy needs, or 0 when one of
 * the n earlier products of the batch makes the same copy (shared: its
 * index in *share). */
static size_t mm_prepare(const ds_matmul_job *jb, int path, const ds_cpu *c, const mm_prep *prev, int n,
                         mm_prep *p, int *share) {
    const int l2 = ds_cpu_pf_l2(c);
    const ds_weight *w = jb->w;
    int K = w->cols, T = jb->T;
    int simd = path == DS_CPU_AVX512 || path == DS_CPU_AVX2;
    int fmt = w->kind == DS_W_FP4                                                          ? X_Q4
              : simd && w->kind == DS_W_FP8 && fp8_raw_ok(jb->x, (size_t)T * (size_t)K) ? X_RAW
                                                                                         : X_PLAIN;
    int tile = simd && T >= DS_CPU_TILE_MIN_T &&
                       ((w->kind == DS_W_FP8 && K % (2 * DS_FP8_BLOCK) == 0) ||
                        (path == DS_CPU_AVX512 && w->kind == DS_W_BF16 && K % 64 == 0))
                   ? path
                   : 0;
    if (tile) fmt = fmt == X_RAW ? X_TRAW : X_TPLAIN;
    size_t xstride = tile           ? ((size_t)K + DS_CPU_FP8_PANEL - 1) / DS_CPU_FP8_PANEL * DS_CPU_FP8_PANEL
                     : fmt == X_Q4  ? q4_floats(K)
                                    : ((size_t)K + 15) / 16 * 16;
    int raw = fmt == X_RAW || fmt == X_TRAW;
    int rg = tile ? DS_CPU_TILE_ROWS : DS_CPU_ROW_GROUP;
    *p = (mm_prep){w,     NULL,   xstride, T, 0, T > 0 ? (w->rows + rg - 1) / rg : 0, jb->y, row_for(fmt == X_Q4),
                   rowt_for(path, w, raw, l2), rowt2_for(path, w, raw, l2), jb->x, fmt, tile, rg, 0};
    p->pair1 = p->rowt2 && c->l1d > 0 && sizeof(float) * xstride * DS_CPU_PAIR_X_DEN > (size_t)c->l1d * DS_CPU_PAIR_X_NUM;
    *share = -1;
    for (int i = 0; i < n; i++)
        if (prev[i].x == jb->x && prev[i].T == T && prev[i].w->cols == K && prev[i].fmt == fmt) {
            *share = i;
            return 0;
        }
    return (size_t)T * xstride;
}

/* Token t's x copy of product p (see mm_prepare). */
static void mm_fill_token(const mm_prep *p, int t) {
    int K = p->w->cols;
    const float *xt = p->x + (size_t)t * (size_t)K;
    if (p->tile) { /* panel-major: panel pn of token t at (pn * T + t) * KP */
        float mul = p->fmt == X_TRAW ? 0x1p112f : 1.0f;
        for (int c0 = 0, pn = 0; c0 < K; c0 += DS_CPU_FP8_PANEL, pn++) {
            float *dst = p->xp + ((size_t)pn * (size_t)p->T + (size_t)t) * DS_CPU_FP8_PANEL;
            int n = K - c0 < DS_CPU_FP8_PANEL ? K - c0 : DS_CPU_FP8_PANEL;
            for (int c = 0; c < n; c++) dst[c] = xt[c0 + c] * mul;
        }
        return;
    }
    float *dst = p->xp + (size_t)t * p->xstride;
    if (p->fmt == X_Q4)
        fp4_quantize_x(xt, K, (uint8_t *)(void *)dst);
    else if (p->fmt == X_RAW)
        for (int c = 0; c < K; c++) dst[c] = xt[c] * 0x1p112f;
    else
        memcpy(dst, xt, sizeof(float) * (size_t)K);
}

/* The batch's x copies as one parallel region over (product, token): fill
 * i is token i - first[j] of product list[j] (one of the products that
 * own a copy). */
typedef struct {
    const mm_prep *p;
    const int *list, *first; /* first[n]: the total */
    int n;
} mm_fills;

static void mm_fill_one(void *ctx, int i) {
    const mm_fills *f = ctx;
    int lo = 0, hi = f->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (f->first[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    mm_fill_token(&f->p[f->list[lo]], i - f->first[lo]);
}

/* Adds a batch's time and bytes under the kind holding most of its bytes. */
static void mm_account(ds_profile *pr, const ds_matmul_job *jobs, int n, double seconds) {
    double by[5] = {0}, total = 0;
    for (int i = 0; i < n; i++) by[jobs[i].w->kind] += (double)ds_weight_read_bytes(jobs[i].w);
    int k = 0;
    for (int i = 1; i < 5; i++)
        if (by[i] > by[k]) k = i;
    for (int i = 0; i < 5; i++) total += by[i];
    pr->mm_seconds[k] += seconds;
    pr->mm_bytes[k] += total;
    pr->mm_calls[k]++;
}

/* Every product's row groups in one parallel region per token block. The x
 * copies and the product table live in the backend's scratch. */
static int mm_run(const ds_backend *be, const ds_matmul_job *jobs, int n, int path, ds_err *err) {
    double t_start = be->profile ? ds_now() : 0;
    if (n <= 0) return 0;
    mm_prep *p = ds_cpu_scratch(be, DS_SCR_MM_JOBS, (sizeof *p * 2 + 3 * sizeof(int)) * (size_t)n + sizeof(int));
    if (!p) return ds_fail(err, "cpu matmul: out of memory for a batch of %d products", n);
    mm_prep *q = p + n;          /* the products of one token block */
    int *share = (int *)(q + n); /* the earlier product whose x copy a product shares, or -1 */
    int *list = share + n, *first = list + n; /* the products that own a copy, their first fill */
    size_t total = 0, off = 0;
    int T = 0;
    for (int i = 0; i < n; i++) {
        total += mm_prepare(&jobs[i], path, ds_cpu_of(be), p, i, &p[i], &share[i]);
        if (jobs[i].T > T) T = jobs[i].T;
    }
    float *xp = ds_cpu_scratch(be, DS_SCR_MM, sizeof(float) * (total ? total : 1));
    if (!xp) return ds_fail(err, "cpu matmul: out of memory for %zu floats of inputs", total);
    int nl = 0;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        if (share[i] >= 0) {
            p[i].xp = p[share[i]].xp;
            continue;
        }
        p[i].xp = xp + off;
        off += (size_t)p[i].T * p[i].xstride;
        list[nl] = i;
        first[nl + 1] = first[nl] + p[i].T;
        nl++;
    }
    mm_fills f = {p, list, first, nl};
    ds_cpu_parallel_for_sized(be, first[nl], mm_fill_one, &f, off);
    for (int t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        /* the products with tokens in this block, renumbered */
        int m = 0, g = 0;
        for (int i = 0; i < n; i++)
            if (p[i].T > t0) {
                q[m] = p[i];
                q[m].g0 = g;
                g += q[m++].groups;
            }
        mm_job j = {q, m, t0};
        ds_cpu_parallel_for(be, g, mm_group, &j);
    }
    if (be->profile) mm_account(be->profile, jobs, n, ds_now() - t_start);
    return 0;
}

int ds_cpu_matmul_path(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y, int path) {
    ds_matmul_job j = {w, x, T, y};
    return mm_run(be, &j, 1, path, NULL);
}

int ds_cpu_matmul_many(const ds_backend *be, const ds_matmul_job *jobs, int n, ds_err *err) {
    return mm_run(be, jobs, n, ds_cpu_of(be)->path, err);
}

/* Group g's columns are copied to rows of their own, then the G products run
 * as one batch: each output has the bits of a product on those rows. */
typedef struct {
    const ds_matmul_grouped *p;
    float *gin, *gout;
} mm_grouped;

static void grouped_in(void *ctx, int g) {
    const mm_grouped *c = ctx;
    int G = c->p->G, T = c->p->T, K = c->p->w->cols;
    for (int t = 0; t < T; t++)
        memcpy(c->gin + ((size_t)g * T + t) * K, c->p->x + (size_t)t * G * K + (size_t)g * K, (size_t)K * sizeof(float));
}

static void grouped_out(void *ctx, int g) {
    const mm_grouped *c = ctx;
    int G = c->p->G, T = c->p->T, Rg = c->p->w->rows / G;
    for (int t = 0; t < T; t++)
        memcpy(c->p->y + (size_t)t * G * Rg + (size_t)g * Rg, c->gout + ((size_t)g * T + t) * Rg,
               (size_t)Rg * sizeof(float));
}

int ds_cpu_matmul_grouped(const ds_backend *be, const ds_matmul_grouped *p, ds_err *err) {
    int G = p->G, T = p->T, K = p->w->cols, Rg = p->w->rows / G;
    size_t in = (size_t)G * T * K, out = (size_t)G * T * Rg;
    char *buf = ds_cpu_scratch(be, DS_SCR_MISC, sizeof(float) * (in + out) + 2 * sizeof(ds_weight) * (size_t)G);
    if (!buf) return ds_fail(err, "cpu grouped matmul: out of memory for %d groups of %d tokens", G, T);
    ds_weight *wg = (ds_weight *)buf;
    ds_matmul_job *jg = (ds_matmul_job *)(wg + G);
    float *gin = (float *)(buf + 2 * sizeof(ds_weight) * (size_t)G), *gout = gin + in;
    mm_grouped c = {p, gin, gout};
    for (int g = 0; g < G; g++) {
        wg[g] = ds_weight_rows(p->w, g * Rg, Rg);
        jg[g] = (ds_matmul_job){&wg[g], gin + (size_t)g * T * K, T, gout + (size_t)g * T * Rg};
    }
    ds_cpu_parallel_for_sized(be, G, grouped_in, &c, in);
    if (ds_cpu_matmul_many(be, jg, G, err)) return -1;
    ds_cpu_parallel_for_sized(be, G, grouped_out, &c, out);
    return 0;
}

/* ---- the fp32 FMA peak that prefill's products are measured against ----
 * Twelve independent chains of fused multiply-adds per thread on the path's
 * widest vectors (the register tiles above keep about as many accumulators
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
