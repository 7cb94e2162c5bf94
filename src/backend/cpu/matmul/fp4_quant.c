/* fp4_quant.c — MXFP4 products' x, quantized once per token into the Q4
 * layout (matmul_impl.h): the scalar definition (dispatch.c's header, docs/
 * numerics.md) and its AVX2 version, the same bytes. */
#include <math.h>
#include <string.h>

#include "backend/cpu/matmul/matmul_impl.h"

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
void ds_cpu_fp4_quantize_x(const float *x, int K, uint8_t *dst) {
#ifdef DS_X86
    fp4_quantize_x_avx2(x, K, dst);
#else
    fp4_quantize_x_c(x, K, dst);
#endif
}

size_t ds_cpu_fp4_quantized_bytes(int K) { return (size_t)q4_spans(K) * Q4_SPAN_BYTES; }

void ds_cpu_fp4_quantize(const float *x, int K, uint8_t *dst, int simd) {
    if (simd)
        ds_cpu_fp4_quantize_x(x, K, dst);
    else
        fp4_quantize_x_c(x, K, dst);
}
