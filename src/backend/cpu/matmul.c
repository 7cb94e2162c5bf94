/* matmul.c — CPU matrix products on weights kept in their storage format.
 *
 * The reduction order of one output y[t][r] is fixed by the weight's shape
 * alone (16 lanes; "fma" is a fused multiply-add, accumulators start at 0):
 *  - dense (F32/BF16/F16): P = fma(W[c..c+16), X[c..c+16), P) over 16-column
 *    chunks in order (a partial last chunk is zero-padded); y = hsum(P).
 *  - FP8 (128x128 blocks): per 128-column block B = the same chunk sum with
 *    the fp16-decoded codes (value / 256, exact); A = fma(B, scale*256, A)
 *    over blocks in order; y = hsum(A).
 *  - FP4 (MXFP4, groups of 32): G = fma(W[16..32), X, fma(W[0..16), X, 0));
 *    A = fma(G, scale, A) over groups in order; y = hsum(A).
 *  - hsum(v) = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) with a_i = v_i + v_{i+8}.
 * The portable path computes exactly these operations; the AVX2 path holds a
 * 16-lane vector in two 8-lane registers and the AVX-512 path in one, so all
 * three give the same bits. Nothing depends on T, on which rows are computed
 * together, on the thread count or on the path the CPU supports. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DS_X86 1
#include <immintrin.h>
#endif

/* ---- scalar decoders (the same values as the SIMD decoders) ---- */

/* E8M0 -> float: 2^(e-127); e = 0 gives 2^-127, e = 255 gives +inf. */
static inline float e8m0(uint8_t e) {
    uint32_t u = e == 0 ? 0x00400000u : (uint32_t)e << 23;
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

static inline void l16_fma_s(l16 *acc, const l16 *p, float s) {
    for (int i = 0; i < 16; i++) acc->v[i] = fmaf(p->v[i], s, acc->v[i]);
}

static inline float hsum16(const float *v) {
    float a[8], h[4], g[2];
    for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) h[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) g[i] = h[i] + h[i + 2];
    return g[0] + g[1];
}

/* chunk sum over columns [c0, c0+len) of one row, starting from 0 */
static l16 chunks_generic(const ds_weight *w, const uint8_t *row, const float *x, int c0, int len) {
    l16 p = {{0}};
    for (int j = 0; j < len; j += 16) {
        float tw[16] = {0}, tx[16] = {0};
        for (int i = 0; i < 16 && j + i < len; i++) {
            tw[i] = elem(w, row, c0 + j + i);
            tx[i] = x[c0 + j + i];
        }
        l16_fma(&p, tw, tx);
    }
    return p;
}

float ds_cpu_row_dot(const ds_weight *w, int r, const float *x) {
    const uint8_t *row = w->data + (size_t)r * row_bytes(w);
    int K = w->cols;
    if (w->kind == DS_W_FP8 || w->kind == DS_W_FP4) {
        int blk = w->kind == DS_W_FP8 ? DS_FP8_BLOCK : DS_FP4_GROUP;
        size_t srow = w->kind == DS_W_FP8 ? fp8_srow(w, r) : (size_t)r * (size_t)w->scale_cols;
        float mul = w->kind == DS_W_FP8 ? 256.0f : 1.0f;
        l16 acc = {{0}};
        for (int b = 0; b * blk < K; b++) {
            int c0 = b * blk, len = K - c0 < blk ? K - c0 : blk;
            l16 p = chunks_generic(w, row, x, c0, len);
            l16_fma_s(&acc, &p, scale_of(w, srow + (size_t)b) * mul);
        }
        return hsum16(acc.v);
    }
    l16 p = chunks_generic(w, row, x, 0, K);
    return hsum16(p.v);
}

static void rows4_generic(const ds_weight *w, const int *rs, const float *x, float *out) {
    for (int i = 0; i < 4; i++) out[i] = ds_cpu_row_dot(w, rs[i], x);
}

#ifdef DS_X86
/* bytes ahead of each row stream to prefetch */
/* The four rows of a group are contiguous, and so is the next group: while
 * the kernel walks offset `off` of each row, fetch the matching 256 bytes of
 * the next group, so memory runs one group ahead of the arithmetic. */
static inline void prefetch_next(const uint8_t *const *row, size_t off, size_t rb) {
    const char *next = (const char *)row[0] + 4 * rb + 4 * off;
    _mm_prefetch(next, _MM_HINT_T0);
    _mm_prefetch(next + 64, _MM_HINT_T0);
    _mm_prefetch(next + 128, _MM_HINT_T0);
    _mm_prefetch(next + 192, _MM_HINT_T0);
}

/* ---- AVX2: a 16-lane vector is (lo, hi) ---- */

static inline float hsum8_avx(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 h = _mm_add_ps(lo, hi);
    __m128 g = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(g, _mm_shuffle_ps(g, g, 1)));
}

static inline __m256 dec8_avx2(const ds_weight *w, const uint8_t *row, int c) {
    switch (w->kind) {
    case DS_W_F32: return _mm256_loadu_ps((const float *)(const void *)(row + 4 * (size_t)c));
    case DS_W_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (size_t)c))), 16));
    case DS_W_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (size_t)c)));
    case DS_W_FP8: {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(row + c));
        return _mm256_cvtph_ps(
            _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xBFFF)));
    }
    case DS_W_FP4: break;
    }
    return _mm256_setzero_ps();
}

/* four rows x one token; dense and FP8 (chunk sums over [c0, c0+len)) */
__attribute__((always_inline)) static inline void chunks4_avx2(const ds_weight *w, const uint8_t *const *row,
                                                               const float *x, int c0, int len, __m256 *lo,
                                                               __m256 *hi) {
    size_t esz = row_bytes(w) / (size_t)w->cols;
    for (int i = 0; i < 4; i++) lo[i] = hi[i] = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= len; j += 16) {
        if (!(((size_t)(c0 + j) * esz) & 63)) prefetch_next(row, (size_t)(c0 + j) * esz, esz * (size_t)w->cols);
        __m256 x0 = _mm256_loadu_ps(x + c0 + j), x1 = _mm256_loadu_ps(x + c0 + j + 8);
        for (int i = 0; i < 4; i++) {
            lo[i] = _mm256_fmadd_ps(dec8_avx2(w, row[i], c0 + j), x0, lo[i]);
            hi[i] = _mm256_fmadd_ps(dec8_avx2(w, row[i], c0 + j + 8), x1, hi[i]);
        }
    }
    if (j < len)
        for (int i = 0; i < 4; i++) {
            float tw[16] = {0}, tx[16] = {0};
            for (int k = 0; j + k < len && k < 16; k++) {
                tw[k] = elem(w, row[i], c0 + j + k);
                tx[k] = x[c0 + j + k];
            }
            lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(tw), _mm256_loadu_ps(tx), lo[i]);
            hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(tw + 8), _mm256_loadu_ps(tx + 8), hi[i]);
        }
}

__attribute__((unused)) static void rows4_avx2(const ds_weight *w, const int *rs, const float *x, float *out) {
    int K = w->cols;
    size_t rb = row_bytes(w);
    const uint8_t *row[4];
    for (int i = 0; i < 4; i++) row[i] = w->data + (size_t)rs[i] * rb;
    __m256 lo[4], hi[4], alo[4], ahi[4];
    if (w->kind == DS_W_F32 || w->kind == DS_W_BF16 || w->kind == DS_W_F16) {
        chunks4_avx2(w, row, x, 0, K, lo, hi);
        for (int i = 0; i < 4; i++) out[i] = hsum8_avx(_mm256_add_ps(lo[i], hi[i]));
        return;
    }
    for (int i = 0; i < 4; i++) alo[i] = ahi[i] = _mm256_setzero_ps();
    if (w->kind == DS_W_FP8) {
        size_t srow[4];
        for (int i = 0; i < 4; i++) srow[i] = fp8_srow(w, rs[i]);
        for (int kb = 0; kb * DS_FP8_BLOCK < K; kb++) {
            int c0 = kb * DS_FP8_BLOCK, len = K - c0 < DS_FP8_BLOCK ? K - c0 : DS_FP8_BLOCK;
            chunks4_avx2(w, row, x, c0, len, lo, hi);
            for (int i = 0; i < 4; i++) {
                __m256 s = _mm256_set1_ps(scale_of(w, srow[i] + (size_t)kb) * 256.0f);
                alo[i] = _mm256_fmadd_ps(lo[i], s, alo[i]);
                ahi[i] = _mm256_fmadd_ps(hi[i], s, ahi[i]);
            }
        }
    } else { /* FP4 */
        const __m128i tbl = _mm_loadu_si128((const __m128i *)(const void *)e2m1_f16_hi);
        const __m128i m4 = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
        int G = K / DS_FP4_GROUP;
        for (int g = 0; g < G; g++) {
            const float *xg = x + g * DS_FP4_GROUP;
            __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8);
            __m256 x2 = _mm256_loadu_ps(xg + 16), x3 = _mm256_loadu_ps(xg + 24);
            if (!(g & 3)) prefetch_next(row, (size_t)g * 16, (size_t)K / 2);
            for (int i = 0; i < 4; i++) {
                __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(row[i] + g * 16));
                __m128i l = _mm_shuffle_epi8(tbl, _mm_and_si128(b, m4));
                __m128i h = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
                __m128i e0 = _mm_unpacklo_epi8(l, h), e1 = _mm_unpackhi_epi8(l, h);
                __m256 w0 = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, e0));
                __m256 w1 = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, e0));
                __m256 w2 = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, e1));
                __m256 w3 = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, e1));
                __m256 glo = _mm256_fmadd_ps(w2, x2, _mm256_fmadd_ps(w0, x0, _mm256_setzero_ps()));
                __m256 ghi = _mm256_fmadd_ps(w3, x3, _mm256_fmadd_ps(w1, x1, _mm256_setzero_ps()));
                __m256 s = _mm256_set1_ps(scale_of(w, (size_t)rs[i] * (size_t)w->scale_cols + (size_t)g));
                alo[i] = _mm256_fmadd_ps(glo, s, alo[i]);
                ahi[i] = _mm256_fmadd_ps(ghi, s, ahi[i]);
            }
        }
    }
    for (int i = 0; i < 4; i++) out[i] = hsum8_avx(_mm256_add_ps(alo[i], ahi[i]));
}

/* ---- AVX-512: a 16-lane vector is one register ---- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))

AVX512 static inline float hsum16_512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return hsum8_avx(a);
}

AVX512 static inline __m512 dec16_512(const ds_weight *w, const uint8_t *row, int c) {
    switch (w->kind) {
    case DS_W_F32: return _mm512_loadu_ps((const float *)(const void *)(row + 4 * (size_t)c));
    case DS_W_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * (size_t)c))), 16));
    case DS_W_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * (size_t)c)));
    case DS_W_FP8: {
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(row + c));
        return _mm512_cvtph_ps(
            _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xBFFF)));
    }
    case DS_W_FP4: break;
    }
    return _mm512_setzero_ps();
}

/* Sixteen group scales starting at index i (n <= 16 valid) as floats, with the
 * scalar decoder's values (e8m0: e == 0 -> 2^-127, else e << 23). */
AVX512 static inline __m512 scales16_512(const ds_weight *w, size_t i, int n) {
    __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    if (w->scale_f32) return _mm512_maskz_loadu_ps(m, w->scale + 4 * i);
    __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, w->scale + i));
    __m512i bits = _mm512_slli_epi32(e, 23);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                 _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(bits);
}

/* One MXFP4 row, two groups (32 bytes) per step: the low / high nibbles go
 * through the E2M1 table (pshufb), then one byte permute per group places
 * table[code] in the high byte of each element's fp16 (low byte zeroed by
 * the mask); scales are decoded 16 groups at a time. */
AVX512VBMI static float row1_fp4_512(const ds_weight *w, int r, const float *x) {
    int K = w->cols, G = K / DS_FP4_GROUP;
    const uint8_t *row = w->data + (size_t)r * (size_t)(K / 2);
    size_t sbase = (size_t)r * (size_t)w->scale_cols;
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)e2m1_f16_hi));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    /* element k of group 0: odd byte 2k+1 <- L[k/2] (k even) or H[k/2] (k odd); group 1: +16 */
    uint8_t ib[64];
    for (int k = 0; k < 32; k++) ib[2 * k] = 0, ib[2 * k + 1] = (uint8_t)((k & 1 ? 64 : 0) + k / 2);
    const __m512i idx0 = _mm512_loadu_si512(ib), idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi8(16));
    const __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
    __m512 acc = _mm512_setzero_ps(), sv = _mm512_setzero_ps();
    for (int g = 0; g < G; g += 2) {
        if (!(g & 15)) sv = scales16_512(w, sbase + (size_t)g, G - g < 16 ? G - g : 16);
        const float *xg = x + g * DS_FP4_GROUP;
        int two = g + 1 < G; /* g is even: g and g+1 share the scale window */
        __m256i b = two ? _mm256_loadu_si256((const __m256i *)(const void *)(row + g * 16))
                        : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(row + g * 16)));
        __m512i L = _mm512_castsi256_si512(_mm256_shuffle_epi8(tbl, _mm256_and_si256(b, m4)));
        __m512i H = _mm512_castsi256_si512(_mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)));
        __m512i h0 = _mm512_maskz_permutex2var_epi8(odd, L, idx0, H);
        __m512 g0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h0, 1)), _mm512_loadu_ps(xg + 16),
                                    _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h0)), _mm512_loadu_ps(xg),
                                                    _mm512_setzero_ps()));
        acc = _mm512_fmadd_ps(g0, _mm512_permutexvar_ps(_mm512_set1_epi32(g & 15), sv), acc);
        if (two) {
            __m512i h1 = _mm512_maskz_permutex2var_epi8(odd, L, idx1, H);
            __m512 g1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h1, 1)), _mm512_loadu_ps(xg + 48),
                                        _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h1)),
                                                        _mm512_loadu_ps(xg + 32), _mm512_setzero_ps()));
            acc = _mm512_fmadd_ps(g1, _mm512_permutexvar_ps(_mm512_set1_epi32((g + 1) & 15), sv), acc);
        }
    }
    return hsum16_512(acc);
}

/* NR rows x one token; NR is a compile-time constant at every call, so the
 * loops unroll. */
AVX512 __attribute__((always_inline)) static inline void chunks_512(const ds_weight *w, const uint8_t *const *row,
                                                                    const float *x, int c0, int len, __m512 *p,
                                                                    const int NR) {
    for (int i = 0; i < NR; i++) p[i] = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= len; j += 16) {
        __m512 xv = _mm512_loadu_ps(x + c0 + j);
        for (int i = 0; i < NR; i++) p[i] = _mm512_fmadd_ps(dec16_512(w, row[i], c0 + j), xv, p[i]);
    }
    if (j < len)
        for (int i = 0; i < NR; i++) {
            float tw[16] = {0}, tx[16] = {0};
            for (int k = 0; j + k < len && k < 16; k++) {
                tw[k] = elem(w, row[i], c0 + j + k);
                tx[k] = x[c0 + j + k];
            }
            p[i] = _mm512_fmadd_ps(_mm512_loadu_ps(tw), _mm512_loadu_ps(tx), p[i]);
        }
}

AVX512 __attribute__((always_inline)) static inline void rows_512(const ds_weight *w, const int *rs, const float *x,
                                                                  float *out, const int NR) {
    int K = w->cols;
    size_t rb = row_bytes(w);
    const uint8_t *row[4];
    for (int i = 0; i < NR; i++) row[i] = w->data + (size_t)rs[i] * rb;
    __m512 p[4], a[4];
    if (w->kind == DS_W_F32 || w->kind == DS_W_BF16 || w->kind == DS_W_F16) {
        chunks_512(w, row, x, 0, K, p, NR);
        for (int i = 0; i < NR; i++) out[i] = hsum16_512(p[i]);
        return;
    }
    for (int i = 0; i < NR; i++) a[i] = _mm512_setzero_ps();
    if (w->kind == DS_W_FP8) {
        size_t srow[4];
        for (int i = 0; i < NR; i++) srow[i] = fp8_srow(w, rs[i]);
        for (int kb = 0; kb * DS_FP8_BLOCK < K; kb++) {
            int c0 = kb * DS_FP8_BLOCK, len = K - c0 < DS_FP8_BLOCK ? K - c0 : DS_FP8_BLOCK;
            chunks_512(w, row, x, c0, len, p, NR);
            for (int i = 0; i < NR; i++)
                a[i] = _mm512_fmadd_ps(p[i], _mm512_set1_ps(scale_of(w, srow[i] + (size_t)kb) * 256.0f), a[i]);
        }
    } else if (NR == 1) {
        a[0] = _mm512_setzero_ps();
        out[0] = row1_fp4_512(w, rs[0], x);
        return;
    } else { /* FP4: 32 codes -> 32 fp16 in element order -> 2 x 16 floats */
        const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)e2m1_f16_hi));
        const __m256i mlo = _mm256_set1_epi16(0x000f), mhi = _mm256_set1_epi16(0x0f00);
        int G = K / DS_FP4_GROUP;
        for (int g = 0; g < G; g++) {
            const float *xg = x + g * DS_FP4_GROUP;
            __m512 x0 = _mm512_loadu_ps(xg), x1 = _mm512_loadu_ps(xg + 16);
            for (int i = 0; i < NR; i++) {
                __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(row[i] + g * 16)));
                __m256i codes = _mm256_or_si256(_mm256_and_si256(wv, mlo), _mm256_and_si256(_mm256_slli_epi16(wv, 4), mhi));
                __m256i hb = _mm256_shuffle_epi8(tbl, codes);
                __m512 w0 = _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(hb)), 8));
                __m512 w1 = _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(hb, 1)), 8));
                __m512 gs = _mm512_fmadd_ps(w1, x1, _mm512_fmadd_ps(w0, x0, _mm512_setzero_ps()));
                a[i] = _mm512_fmadd_ps(gs, _mm512_set1_ps(scale_of(w, (size_t)rs[i] * (size_t)w->scale_cols + (size_t)g)),
                                       a[i]);
            }
        }
    }
    for (int i = 0; i < NR; i++) out[i] = hsum16_512(a[i]);
}

/* One row at a time: a single memory stream per thread. Measured on the flash
 * shape (2 threads, weights from the page cache): BF16 45 GB/s, FP8 34 GB/s,
 * MXFP4 19 GB/s, against 20 / 11 / 7 GB/s with four interleaved row streams. */
AVX512 static void rows4_512(const ds_weight *w, const int *rs, const float *x, float *out) {
    for (int i = 0; i < 4; i++) rows_512(w, rs + i, x, out + i, 1);
}
#endif

int ds_cpu_best_path(void) {
#ifdef DS_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vbmi"))
        return DS_CPU_AVX512;
    return DS_CPU_AVX2;
#else
    return DS_CPU_GENERIC;
#endif
}

typedef void (*rows4_fn)(const ds_weight *, const int *, const float *, float *);

static rows4_fn rows4_for(int path) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512) return rows4_512;
    if (path == DS_CPU_AVX2) return rows4_avx2;
#endif
    (void)path;
    return rows4_generic;
}

float ds_dot_f32(const float *a, const float *b, int n) {
#ifdef DS_X86
    /* the dense 16-lane order, as (lo, hi) halves */
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 8), _mm256_loadu_ps(b + c + 8), hi);
    }
    if (c < n) {
        float ta[16] = {0}, tb[16] = {0};
        memcpy(ta, a + c, sizeof(float) * (size_t)(n - c));
        memcpy(tb, b + c, sizeof(float) * (size_t)(n - c));
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(ta), _mm256_loadu_ps(tb), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(ta + 8), _mm256_loadu_ps(tb + 8), hi);
    }
    return hsum8_avx(_mm256_add_ps(lo, hi));
#else
    ds_weight w = {.kind = DS_W_F32, .rows = 1, .cols = n, .data = (const uint8_t *)a};
    return ds_cpu_row_dot(&w, 0, b);
#endif
}

/* Token blocks keep x of a block in cache while all rows stream past. */
#define TOKEN_BLOCK 32

typedef struct {
    const ds_weight *w;
    const float *x;
    float *y;
    int t0, tn;
    rows4_fn rows4;
} mm_job;

static void mm_group(void *ctx, int g) {
    const mm_job *j = ctx;
    const ds_weight *w = j->w;
    int R = w->rows, K = w->cols;
    int rs[4];
    for (int i = 0; i < 4; i++) rs[i] = g * 4 + i < R ? g * 4 + i : g * 4;
    /* the group's rows stay in cache while the block's tokens pass */
    for (int t = j->t0; t < j->t0 + j->tn; t++) {
        float out[4];
        j->rows4(w, rs, j->x + (size_t)t * (size_t)K, out);
        for (int i = 0; i < 4 && g * 4 + i < R; i++) j->y[(size_t)t * (size_t)R + (size_t)(g * 4 + i)] = out[i];
    }
}

void ds_cpu_matmul_path(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y, int path) {
    int groups = (w->rows + 3) / 4;
    rows4_fn f = rows4_for(path);
    for (int t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        mm_job j = {w, x, y, t0, T - t0 < TOKEN_BLOCK ? T - t0 : TOKEN_BLOCK, f};
        be->parallel_for(be, groups, mm_group, &j);
    }
}

void ds_cpu_matmul(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y) {
    ds_cpu_matmul_path(be, w, x, T, y, be->cpu_path);
}
