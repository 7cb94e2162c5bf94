/* matmul_impl.h — what the files of the CPU products share (dispatch.c's
 * header comment fixes the reduction orders they keep): the scalar and SIMD
 * weight decoders, the 16-lane vector helpers and hsums, the Q4 layout of
 * MXFP4's quantized x, the prefetch macros, the dispatcher's product table,
 * and the kernels one file calls in another. Internal to
 * src/backend/cpu/matmul/. */
#ifndef DS_CPU_MATMUL_IMPL_H
#define DS_CPU_MATMUL_IMPL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

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

/* Scale of group g of row r, 0 past the last group. */
static inline float fp4_scale(const ds_weight *w, int r, int g) {
    return g < w->cols / DS_FP4_GROUP ? scale_of(w, (size_t)r * (size_t)w->scale_cols + (size_t)g) : 0.0f;
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

/* Packed BF16 rows (bf16x.c): the dense order (dense_t_512), each 64-column unit
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

/* prefetch of a row's 256-byte span (the kernels' distance ahead) */
#define PF_SPAN(p)        \
    do {                  \
        PF(p);            \
        PF((p) + 64);     \
        PF((p) + 128);    \
        PF((p) + 192);    \
    } while (0)

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
#endif

typedef float (*row_fn)(const ds_weight *, int, const float *);
/* nt (<= NT) tokens of row r: out[t] from x + t * xs */
typedef void (*rowt_fn)(const ds_weight *, int, const float *, size_t, int, float *);

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

/* ---- the functions one file calls in another ---- */

/* The quantizer every path uses (fp4_quant.c). */
void ds_cpu_fp4_quantize_x(const float *x, int K, uint8_t *dst);
/* The portable MXFP4 row with x in the Q4 layout (reference.c). */
float ds_cpu_row_fp4_generic(const ds_weight *w, int r, const float *xq);

#ifdef DS_X86
/* The multi-token row kernels (rowt_fn), each prefetching into L1 and
 * into L2 (_l2): AVX-512 (rows_avx512.c; rowt2_*: rows r, r + 1) and
 * AVX2 (rows_avx2.c). */
void ds_cpu_rowt_fp8_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8raw_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8raw_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16x_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16x_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f16_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f16_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f32_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f32_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp4q_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp4q_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt2_fp8_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt2_fp8_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt2_fp8raw_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt2_fp8raw_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt2_fp4q_512(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt2_fp4q_512_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8raw_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp8raw_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16x_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_bf16x_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f16_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f16_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f32_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_f32_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp4q_avx2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
void ds_cpu_rowt_fp4q_avx2_l2(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out);
/* Rows [r0, r1) x tokens [t0, t1) of product p through the prefill tiles
 * (tiles.c): FP8 and BF16 on AVX-512, FP8 on AVX2. */
void ds_cpu_fp8_group_tiled(const mm_prep *p, int r0, int r1, int t0, int t1);
void ds_cpu_bf16_group_tiled(const mm_prep *p, int r0, int r1, int t0, int t1);
void ds_cpu_fp8_group_tiled_avx2(const mm_prep *p, int r0, int r1, int t0, int t1);
#endif

#endif
