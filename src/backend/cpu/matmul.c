/* matmul.c — CPU matrix products on weights kept in their storage format.
 *
 * The reduction order of one output y[t][r] (fixed by the weight's shape):
 *  - dense (F32/BF16/F16): chunks of 8 columns, chunk c accumulated into lane
 *    vector p[c % 2] by fused multiply-add; y = hsum(p0 + p1).
 *  - FP8: per 128-column block, the same two-vector chunk sum over the block
 *    with fp16-decoded codes (value / 256, exact), then acc = fma(p0 + p1,
 *    scale * 256, acc) in block order; y = hsum(acc).
 *  - FP4: the same per 32-column group with E2M1 values and the group scale.
 *  - hsum(v) = ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)).
 * A partial last chunk is zero-padded. The AVX2 path and the portable path
 * compute exactly these operations, so they give the same bits, and nothing
 * depends on T, on which rows are computed together or on the thread count. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DS_AVX2 1
#include <immintrin.h>
#endif

/* ---- scalar element decoders (identical values to the SIMD decoders) ---- */

static inline float e8m0(uint8_t e) {
    uint32_t u = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
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

/* fp8 e4m3 byte -> the fp16 with the same bits shifted: value / 256. */
static inline uint16_t fp8_as_f16(uint8_t b) { return (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)); }

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

/* ---- lane vectors ---- */

#ifdef DS_AVX2
typedef __m256 vec;
static inline vec v_zero(void) { return _mm256_setzero_ps(); }
static inline vec v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec v_add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec v_set1(float f) { return _mm256_set1_ps(f); }
static inline float v_hsum(vec v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 h = _mm_add_ps(lo, hi);                      /* v0+v4, v1+v5, v2+v6, v3+v7 */
    __m128 g = _mm_add_ps(h, _mm_movehl_ps(h, h));      /* h0+h2, h1+h3 */
    return _mm_cvtss_f32(_mm_add_ss(g, _mm_shuffle_ps(g, g, 1)));
}
#else
typedef struct {
    float v[8];
} vec;
static inline vec v_zero(void) {
    vec r;
    for (int i = 0; i < 8; i++) r.v[i] = 0.0f;
    return r;
}
static inline vec v_load(const float *p) {
    vec r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
static inline vec v_fma(vec a, vec b, vec c) {
    for (int i = 0; i < 8; i++) c.v[i] = fmaf(a.v[i], b.v[i], c.v[i]);
    return c;
}
static inline vec v_add(vec a, vec b) {
    for (int i = 0; i < 8; i++) a.v[i] += b.v[i];
    return a;
}
static inline vec v_set1(float f) {
    vec r;
    for (int i = 0; i < 8; i++) r.v[i] = f;
    return r;
}
static inline float v_hsum(vec v) {
    float h[4], g[2];
    for (int i = 0; i < 4; i++) h[i] = v.v[i] + v.v[i + 4];
    for (int i = 0; i < 2; i++) g[i] = h[i] + h[i + 2];
    return g[0] + g[1];
}
#endif

/* Eight weights of a row starting at column c (c % 8 == 0, c + 8 <= cols). */
static inline vec w_load8(const ds_weight *w, const uint8_t *row, int c) {
#ifdef DS_AVX2
    switch (w->kind) {
    case DS_W_F32: return _mm256_loadu_ps((const float *)(const void *)(row + 4 * (size_t)c));
    case DS_W_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (size_t)c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case DS_W_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (size_t)c)));
    case DS_W_FP8: {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(row + c));
        __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xBFFF));
        return _mm256_cvtph_ps(h);
    }
    case DS_W_FP4: break;
    }
#endif
    float tmp[8];
    for (int i = 0; i < 8; i++) tmp[i] = elem(w, row, c + i);
    return v_load(tmp);
}

/* Weights [c, c+n) zero-padded to 8 lanes, and the matching x. */
static inline void load_partial(const ds_weight *w, const uint8_t *row, const float *x, int c, int n, vec *wv,
                                vec *xv) {
    float tw[8] = {0}, tx[8] = {0};
    for (int i = 0; i < n; i++) {
        tw[i] = elem(w, row, c + i);
        tx[i] = x[c + i];
    }
    *wv = v_load(tw);
    *xv = v_load(tx);
}

/* Sum over columns [c0, c0+len) of one row into the two-vector chunk form. */
static inline vec chunk_sum(const ds_weight *w, const uint8_t *row, const float *x, int c0, int len) {
    vec p0 = v_zero(), p1 = v_zero();
    int j = 0;
    for (; j + 16 <= len; j += 16) {
        p0 = v_fma(w_load8(w, row, c0 + j), v_load(x + c0 + j), p0);
        p1 = v_fma(w_load8(w, row, c0 + j + 8), v_load(x + c0 + j + 8), p1);
    }
    if (j + 8 <= len) {
        p0 = v_fma(w_load8(w, row, c0 + j), v_load(x + c0 + j), p0);
        j += 8;
        if (j < len) {
            vec wv, xv;
            load_partial(w, row, x, c0 + j, len - j, &wv, &xv);
            p1 = v_fma(wv, xv, p1);
        }
    } else if (j < len) {
        vec wv, xv;
        load_partial(w, row, x, c0 + j, len - j, &wv, &xv);
        p0 = v_fma(wv, xv, p0);
    }
    return v_add(p0, p1);
}

/* ---- one row, one token: the reference semantics ---- */

static float row_dot_generic(const ds_weight *w, int r, const float *x) {
    const uint8_t *row = w->data + (size_t)r * row_bytes(w);
    int K = w->cols;
    if (w->kind == DS_W_FP8) {
        vec acc = v_zero();
        size_t srow = (size_t)((w->srow0 + r) / DS_FP8_BLOCK) * (size_t)w->scale_cols;
        for (int kb = 0; kb * DS_FP8_BLOCK < K; kb++) {
            int c0 = kb * DS_FP8_BLOCK, len = K - c0 < DS_FP8_BLOCK ? K - c0 : DS_FP8_BLOCK;
            acc = v_fma(chunk_sum(w, row, x, c0, len), v_set1(scale_of(w, srow + (size_t)kb) * 256.0f), acc);
        }
        return v_hsum(acc);
    }
    if (w->kind == DS_W_FP4) {
        vec acc = v_zero();
        size_t srow = (size_t)r * (size_t)w->scale_cols;
        for (int g = 0; g * DS_FP4_GROUP < K; g++)
            acc = v_fma(chunk_sum(w, row, x, g * DS_FP4_GROUP, DS_FP4_GROUP), v_set1(scale_of(w, srow + (size_t)g)),
                        acc);
        return v_hsum(acc);
    }
    return v_hsum(chunk_sum(w, row, x, 0, K));
}

#ifdef DS_AVX2
/* ---- fast paths: four rows at once, the same operations per row ---- */

static inline __m256 fp8_8(const uint8_t *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xBFFF)));
}

static void rows4_fp8(const ds_weight *w, const int *rs, const float *x, float *out) {
    int K = w->cols;
    const uint8_t *row[4];
    size_t srow[4];
    __m256 acc[4];
    for (int i = 0; i < 4; i++) {
        row[i] = w->data + (size_t)rs[i] * (size_t)K;
        srow[i] = (size_t)((w->srow0 + rs[i]) / DS_FP8_BLOCK) * (size_t)w->scale_cols;
        acc[i] = _mm256_setzero_ps();
    }
    int kb = 0;
    for (; (kb + 1) * DS_FP8_BLOCK <= K; kb++) {
        int c0 = kb * DS_FP8_BLOCK;
        __m256 p0[4], p1[4];
        for (int i = 0; i < 4; i++) p0[i] = p1[i] = _mm256_setzero_ps();
        for (int j = 0; j < DS_FP8_BLOCK; j += 16) {
            __m256 x0 = _mm256_loadu_ps(x + c0 + j), x1 = _mm256_loadu_ps(x + c0 + j + 8);
            for (int i = 0; i < 4; i++) {
                p0[i] = _mm256_fmadd_ps(fp8_8(row[i] + c0 + j), x0, p0[i]);
                p1[i] = _mm256_fmadd_ps(fp8_8(row[i] + c0 + j + 8), x1, p1[i]);
            }
        }
        for (int i = 0; i < 4; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_add_ps(p0[i], p1[i]),
                                     _mm256_set1_ps(scale_of(w, srow[i] + (size_t)kb) * 256.0f), acc[i]);
    }
    if (kb * DS_FP8_BLOCK < K) { /* partial last block: generic chunk form */
        int c0 = kb * DS_FP8_BLOCK;
        for (int i = 0; i < 4; i++)
            acc[i] = v_fma(chunk_sum(w, row[i], x, c0, K - c0),
                           v_set1(scale_of(w, srow[i] + (size_t)kb) * 256.0f), acc[i]);
    }
    for (int i = 0; i < 4; i++) out[i] = v_hsum(acc[i]);
}

static void rows4_fp4(const ds_weight *w, const int *rs, const float *x, float *out) {
    int K = w->cols, G = K / DS_FP4_GROUP;
    const __m128i tbl = _mm_loadu_si128((const __m128i *)(const void *)e2m1_f16_hi);
    const __m128i m4 = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
    const uint8_t *row[4];
    size_t srow[4];
    __m256 acc[4];
    for (int i = 0; i < 4; i++) {
        row[i] = w->data + (size_t)rs[i] * (size_t)(K / 2);
        srow[i] = (size_t)rs[i] * (size_t)w->scale_cols;
        acc[i] = _mm256_setzero_ps();
    }
    for (int g = 0; g < G; g++) {
        const float *xg = x + g * DS_FP4_GROUP;
        __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8);
        __m256 x2 = _mm256_loadu_ps(xg + 16), x3 = _mm256_loadu_ps(xg + 24);
        for (int i = 0; i < 4; i++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(row[i] + g * 16));
            __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(b, m4));
            __m128i hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
            __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
            __m256 w0 = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, e0));
            __m256 w1 = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, e0));
            __m256 w2 = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, e1));
            __m256 w3 = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, e1));
            __m256 p0 = _mm256_fmadd_ps(w0, x0, _mm256_setzero_ps());
            __m256 p1 = _mm256_fmadd_ps(w1, x1, _mm256_setzero_ps());
            p0 = _mm256_fmadd_ps(w2, x2, p0);
            p1 = _mm256_fmadd_ps(w3, x3, p1);
            acc[i] = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), _mm256_set1_ps(scale_of(w, srow[i] + (size_t)g)), acc[i]);
        }
    }
    for (int i = 0; i < 4; i++) out[i] = v_hsum(acc[i]);
}

static void rows4_dense(const ds_weight *w, const int *rs, const float *x, float *out) {
    int K = w->cols;
    size_t rb = row_bytes(w);
    const uint8_t *row[4];
    __m256 p0[4], p1[4];
    for (int i = 0; i < 4; i++) {
        row[i] = w->data + (size_t)rs[i] * rb;
        p0[i] = p1[i] = _mm256_setzero_ps();
    }
    int j = 0;
    for (; j + 16 <= K; j += 16) {
        __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
        for (int i = 0; i < 4; i++) {
            p0[i] = _mm256_fmadd_ps(w_load8(w, row[i], j), x0, p0[i]);
            p1[i] = _mm256_fmadd_ps(w_load8(w, row[i], j + 8), x1, p1[i]);
        }
    }
    if (j < K) { /* tail: continue the same chunk sequence */
        for (int i = 0; i < 4; i++) {
            __m256 q0 = p0[i], q1 = p1[i];
            int jj = j;
            if (jj + 8 <= K) {
                q0 = _mm256_fmadd_ps(w_load8(w, row[i], jj), _mm256_loadu_ps(x + jj), q0);
                jj += 8;
                if (jj < K) {
                    vec wv, xv;
                    load_partial(w, row[i], x, jj, K - jj, &wv, &xv);
                    q1 = _mm256_fmadd_ps(wv, xv, q1);
                }
            } else {
                vec wv, xv;
                load_partial(w, row[i], x, jj, K - jj, &wv, &xv);
                q0 = _mm256_fmadd_ps(wv, xv, q0);
            }
            p0[i] = q0;
            p1[i] = q1;
        }
    }
    for (int i = 0; i < 4; i++) out[i] = v_hsum(_mm256_add_ps(p0[i], p1[i]));
}
#endif

/* Rows rs[0..3] (may repeat) against one token. */
static void rows4(const ds_weight *w, const int *rs, const float *x, float *out) {
#ifdef DS_AVX2
    if (w->kind == DS_W_FP8) return rows4_fp8(w, rs, x, out);
    if (w->kind == DS_W_FP4) return rows4_fp4(w, rs, x, out);
    return rows4_dense(w, rs, x, out);
#else
    for (int i = 0; i < 4; i++) out[i] = row_dot_generic(w, rs[i], x);
#endif
}

float ds_cpu_row_dot(const ds_weight *w, int r, const float *x) { return row_dot_generic(w, r, x); }

float ds_dot_f32(const float *a, const float *b, int n) {
    ds_weight w = {.kind = DS_W_F32, .rows = 1, .cols = n, .data = (const uint8_t *)a};
    float out[4];
    int rs[4] = {0, 0, 0, 0};
    rows4(&w, rs, b, out);
    return out[0];
}

/* Token blocks keep x of a block in cache while all rows stream past. */
#define TOKEN_BLOCK 16

typedef struct {
    const ds_weight *w;
    const float *x;
    float *y;
    int t0, tn;
} mm_job;

static void mm_group(void *ctx, int g) {
    const mm_job *j = ctx;
    const ds_weight *w = j->w;
    int R = w->rows, K = w->cols;
    int rs[4];
    for (int i = 0; i < 4; i++) rs[i] = g * 4 + i < R ? g * 4 + i : g * 4;
    for (int t = j->t0; t < j->t0 + j->tn; t++) {
        float out[4];
        rows4(w, rs, j->x + (size_t)t * (size_t)K, out);
        for (int i = 0; i < 4 && g * 4 + i < R; i++) j->y[(size_t)t * (size_t)R + (size_t)(g * 4 + i)] = out[i];
    }
}

void ds_cpu_matmul(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y) {
    int groups = (w->rows + 3) / 4;
    for (int t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        mm_job j = {w, x, y, t0, T - t0 < TOKEN_BLOCK ? T - t0 : TOKEN_BLOCK};
        be->parallel_for(be, groups, mm_group, &j);
    }
}
