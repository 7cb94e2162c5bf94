/* tiles.c — the prefill tiles of the CPU products: FP8 (AVX-512 and AVX2)
 * and BF16 (AVX-512) products of many tokens as register tiles over
 * pre-decoded panels of a row group, each (row, token) through dispatch.c's
 * documented operations. */
#include <string.h>

#include "backend/cpu/matmul/matmul_impl.h"

#ifdef DS_X86
/* ---- AVX-512 prefill tiles: 2 rows x up to 3 tokens, weights decoded once ----
 * For many tokens the row kernels (rows_avx512.c) re-decode each weight chunk for every
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

AVX512 void ds_cpu_fp8_group_tiled(const mm_prep *p, int r0, int r1, int t0, int t1) {
    group_tiled_on(p, r0, r1, t0, t1, 1, 0);
}
AVX512 void ds_cpu_bf16_group_tiled(const mm_prep *p, int r0, int r1, int t0, int t1) {
    group_tiled_on(p, r0, r1, t0, t1, 1, 1);
}
void ds_cpu_fp8_group_tiled_avx2(const mm_prep *p, int r0, int r1, int t0, int t1) {
    group_tiled_on(p, r0, r1, t0, t1, 0, 0);
}
#endif
