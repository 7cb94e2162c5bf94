/* rows_avx2.c — the AVX2 row kernels of the CPU products (the AVX2 path,
 * and MXFP4 on AVX-512 without VNNI), and their instances for the
 * dispatcher (rowt_for). */
#include <string.h>

#include "backend/cpu/matmul/matmul_impl.h"

#ifdef DS_X86
/* ---- AVX2 row kernels (the AVX2 path, and MXFP4 on AVX-512 without VNNI) ----
 * The AVX-512 row kernels' loops with each 16-lane vector held as (lo, hi)
 * (v16, matmul_impl.h): every (row, token) keeps the documented operations in the
 * documented order, so the bits are every other path's. Sixteen ymm
 * registers hold a quarter of 32 zmm's lanes, so these kernels take AVX2_NT
 * tokens per pass (each pass decodes the row again, from L1), and prefetch
 * as the AVX-512 kernels do. */
#define AVX2_NT DS_CPU_AVX2_NT

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
 * integers, in any grouping — for the digits hi and lo (H: hi's pairs times
 * 256 in the widening) and for lo2 (L); then minus CH, CL, S = fma(H, 256,
 * L) and one fp32 fma per group, fp4_span_acc's operations. */
/* A span's codes are decoded once into L1 (dec: per half h and load b the
 * unsigned w2 + 12 of the even and odd columns) and read back for each token
 * of the call: 16 ymm registers hold one token's trees, not two tokens' with
 * their decoded weights. Tokens go FP4Q_NT at a time, their accumulators in
 * memory between spans; each token's operations and their order are the
 * one-token kernel's. */
#define FP4Q_NT 16
__attribute__((always_inline)) static inline void fp4q_t_avx2(const ds_weight *w, int r, const float *xq, size_t xs,
                                                               float *out, const int nt, const int l2) {
    (void)l2;
    int G = w->cols / DS_FP4_GROUP;
    const uint8_t *row = w->data + (size_t)r * (size_t)(w->cols / 2);
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi16(1), i256 = _mm256_set1_epi16(256);
    __m256i dec[2][4][2]; /* [h][b][even, odd columns] */
    v16 acc[FP4Q_NT];
    for (int t0 = 0; t0 < nt; t0 += FP4Q_NT) {
        int n = nt - t0 < FP4Q_NT ? nt - t0 : FP4Q_NT;
        for (int t = 0; t < n; t++) acc[t] = v16_zero();
        for (int m = 0; 16 * m < G; m++) {
            const uint8_t *p = row + 256 * (size_t)m;
            PF_SPAN(p);
            int left = G - 16 * m;
            v16 ws = fp4q_scales_avx2(w, r, m, left);
            UNROLL for (int h = 0; h < 2; h++)
                UNROLL for (int b = 0; b < 4; b++) {
                    int g = 4 * b + 2 * h; /* groups g, g + 1 of the span */
                    __m256i d;
                    if (left >= 16 || g + 2 <= left)
                        d = _mm256_loadu_si256((const __m256i *)(const void *)(p + 16 * g));
                    else if (g < left) /* one group: the other lane's bytes 0 (its x is 0 too) */
                        d = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * g)));
                    else
                        d = _mm256_setzero_si256();
                    dec[h][b][0] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(d, m4));
                    dec[h][b][1] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(d, 4), m4));
                }
            for (int t = 0; t < n; t++) {
                const uint8_t *sp = (const uint8_t *)(xq + (size_t)(t0 + t) * xs) + (size_t)m * Q4_SPAN_BYTES;
                v16 a = acc[t];
                UNROLL for (int h = 0; h < 2; h++) {
                    __m256i u[2], v2[2], S[2]; /* [H, L] */
                    UNROLL for (int b = 0; b < 4; b++) {
                        const __m256i L = dec[h][b][0], H = dec[h][b][1];
                        const uint8_t *x0 = sp + Q4_BLK * b + 32 * h;
#define LDX(o) _mm256_loadu_si256((const __m256i *)(const void *)(x0 + (o)))
#define DIG(o, k) _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(L, LDX(o)), _mm256_maddubs_epi16(H, LDX((o) + 64))), k)
                        /* hi's pair sums times 256 in the widening (exact: < 2^23) */
                        __m256i vv[2] = {_mm256_add_epi32(DIG(0, i256), DIG(128, one)), DIG(256, one)};
#undef DIG
#undef LDX
                        UNROLL for (int k = 0; k < 2; k++) {
                            if (b == 0 || b == 2)
                                v2[k] = vv[k];
                            else if (b == 1)
                                u[k] = _mm256_hadd_epi32(v2[k], vv[k]);
                            else
                                S[k] = _mm256_hadd_epi32(u[k], _mm256_hadd_epi32(v2[k], vv[k]));
                        }
                    }
                    __m256i ch = _mm256_loadu_si256((const __m256i *)(const void *)(sp + Q4_CH + 32 * h));
                    __m256i cl = _mm256_loadu_si256((const __m256i *)(const void *)(sp + Q4_CL + 32 * h));
                    __m256 Sf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(S[0], ch)), _mm256_set1_ps(256.0f),
                                                _mm256_cvtepi32_ps(_mm256_sub_epi32(S[1], cl)));
                    __m256 f = _mm256_mul_ps(h ? ws.hi : ws.lo, _mm256_loadu_ps((const float *)(const void *)(sp + Q4_SX + 32 * h)));
                    if (h)
                        a.hi = _mm256_fmadd_ps(Sf, f, a.hi);
                    else
                        a.lo = _mm256_fmadd_ps(Sf, f, a.lo);
                }
                acc[t] = a;
            }
        }
        for (int t = 0; t < n; t++) out[t0 + t] = v16_hsum(acc[t]);
    }
}

/* the AVX2 instances: tokens AVX2_NT at a time */
#define ROWT_AVX2(name, call)                                                                    \
    void name(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out) { \
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
#define ROWT_AVX2_SET(S)                      \
    ROWT_AVX2(ds_cpu_rowt_fp8_avx2##S, A2_FP8)       \
    ROWT_AVX2(ds_cpu_rowt_fp8raw_avx2##S, A2_FP8RAW) \
    ROWT_AVX2(ds_cpu_rowt_bf16_avx2##S, A2_BF16)     \
    ROWT_AVX2(ds_cpu_rowt_bf16x_avx2##S, A2_BF16X)   \
    ROWT_AVX2(ds_cpu_rowt_f16_avx2##S, A2_F16)       \
    ROWT_AVX2(ds_cpu_rowt_f32_avx2##S, A2_F32)       \
    void ds_cpu_rowt_fp4q_avx2##S(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out) { \
        fp4q_t_avx2(w, r, x, xs, out, nt, L2);                                                              \
    }
#define L2 0
ROWT_AVX2_SET()
#undef L2
#define L2 1
ROWT_AVX2_SET(_l2)
#undef L2
#endif
