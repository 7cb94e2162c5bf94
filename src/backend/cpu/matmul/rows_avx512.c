/* rows_avx512.c — the AVX-512 row kernels of the CPU products (MXFP4:
 * AVX-512 VNNI): up to NT tokens of one row (FP8 and MXFP4 also two rows)
 * per call, each (row, token) through dispatch.c's documented operations,
 * and their instances for the dispatcher (rowt_for, rowt2_for). */
#include <string.h>

#include "backend/cpu/matmul/matmul_impl.h"

#ifdef DS_X86
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

/* nt in [1, NT] tokens of row r: the instance for each count */
#define NT_CASES(call) \
    switch (nt) {      \
    case 1: call(1); break; \
    case 2: call(2); break; \
    case 3: call(3); break; \
    default: call(NT); break; \
    }

#define ROWT_A(attr, name, call)                                                                 \
    attr void name(const ds_weight *w, int r, const float *x, size_t xs, int nt, float *out) { \
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
    ROWT(ds_cpu_rowt_fp8_512##S, FP8_N)                      \
    ROWT(ds_cpu_rowt_fp8raw_512##S, FP8RAW_N)                \
    ROWT(ds_cpu_rowt_bf16_512##S, BF16_N)                    \
    ROWT(ds_cpu_rowt_bf16x_512##S, BF16X_N)                  \
    ROWT(ds_cpu_rowt_f16_512##S, F16_N)                      \
    ROWT(ds_cpu_rowt_f32_512##S, F32_N)                      \
    ROWT_A(AVX512VNNI, ds_cpu_rowt_fp4q_512##S, FP4Q_N)      \
    ROWT(ds_cpu_rowt2_fp8_512##S, FP8_2N)                    \
    ROWT(ds_cpu_rowt2_fp8raw_512##S, FP8RAW_2N)             \
    ROWT_A(AVX512VNNI, ds_cpu_rowt2_fp4q_512##S, FP4Q_2N)
#define L2 0
ROWT_SET()
#undef L2
#define L2 1
ROWT_SET(_l2)
#undef L2
#endif
