/* dispatch.c — CPU matrix products on weights kept in their storage format:
 * the reduction orders every kernel keeps, and the dispatcher (the path's
 * kernels for each product, x copies, row groups over threads).
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
 * values; each (row, token) still goes through exactly the operations above.
 * The kernels, one family a file: reference.c (the portable path),
 * fp4_quant.c (MXFP4's quantized x), rows_avx2.c, rows_avx512.c (with
 * VNNI), tiles.c (the prefill tiles); matmul_impl.h holds what they share;
 * fma_peak.c measures the FMA peak. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/clock.h"
#include "backend/cpu/matmul/matmul_impl.h"

/* The single-token row kernel of the portable path (the SIMD paths have a
 * multi-token kernel for every kind); MXFP4's takes x in the Q4 layout. */
static row_fn row_for(int fp4) { return fp4 ? ds_cpu_row_fp4_generic : ds_cpu_row_dot; }

/* The multi-token row kernel of the AVX-512 path (NULL on the others);
 * l2: the instance that prefetches into L2. */
static rowt_fn rowt_for(int path, const ds_weight *w, int raw, int l2) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512 && w->packed && w->kind == DS_W_BF16)
        return l2 ? ds_cpu_rowt_bf16x_512_l2 : ds_cpu_rowt_bf16x_512;
    if (path == DS_CPU_AVX2 && w->packed && w->kind == DS_W_BF16)
        return l2 ? ds_cpu_rowt_bf16x_avx2_l2 : ds_cpu_rowt_bf16x_avx2;
    if ((path == DS_CPU_AVX2 || path == DS_CPU_AVX512) && w->kind == DS_W_FP4 && !ds_cpu_has_vnni())
        return l2 ? ds_cpu_rowt_fp4q_avx2_l2 : ds_cpu_rowt_fp4q_avx2;
    if (path == DS_CPU_AVX2) switch (w->kind) {
        case DS_W_FP8:
            return raw ? (l2 ? ds_cpu_rowt_fp8raw_avx2_l2 : ds_cpu_rowt_fp8raw_avx2)
                       : l2 ? ds_cpu_rowt_fp8_avx2_l2
                            : ds_cpu_rowt_fp8_avx2;
        case DS_W_FP4: return NULL; /* not reached */
        case DS_W_BF16: return l2 ? ds_cpu_rowt_bf16_avx2_l2 : ds_cpu_rowt_bf16_avx2;
        case DS_W_F16: return l2 ? ds_cpu_rowt_f16_avx2_l2 : ds_cpu_rowt_f16_avx2;
        case DS_W_F32: return l2 ? ds_cpu_rowt_f32_avx2_l2 : ds_cpu_rowt_f32_avx2;
        }
    if (path == DS_CPU_AVX512) switch (w->kind) {
        case DS_W_FP8:
            return raw ? (l2 ? ds_cpu_rowt_fp8raw_512_l2 : ds_cpu_rowt_fp8raw_512)
                       : l2 ? ds_cpu_rowt_fp8_512_l2
                            : ds_cpu_rowt_fp8_512;
        case DS_W_FP4: return l2 ? ds_cpu_rowt_fp4q_512_l2 : ds_cpu_rowt_fp4q_512;
        case DS_W_BF16: return l2 ? ds_cpu_rowt_bf16_512_l2 : ds_cpu_rowt_bf16_512;
        case DS_W_F16: return l2 ? ds_cpu_rowt_f16_512_l2 : ds_cpu_rowt_f16_512;
        case DS_W_F32: return l2 ? ds_cpu_rowt_f32_512_l2 : ds_cpu_rowt_f32_512;
        }
#endif
    (void)path, (void)w, (void)raw, (void)l2;
    return NULL;
}

/* The two-row kernel of the AVX-512 path where one exists for w (NULL otherwise). */
static rowt_fn rowt2_for(int path, const ds_weight *w, int raw, int l2) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512 && w->kind == DS_W_FP8 && w->cols % (2 * DS_FP8_BLOCK) == 0)
        return raw ? (l2 ? ds_cpu_rowt2_fp8raw_512_l2 : ds_cpu_rowt2_fp8raw_512)
                   : l2 ? ds_cpu_rowt2_fp8_512_l2
                        : ds_cpu_rowt2_fp8_512;
    if (path == DS_CPU_AVX512 && w->kind == DS_W_FP4 && ds_cpu_has_vnni())
        return l2 ? ds_cpu_rowt2_fp4q_512_l2 : ds_cpu_rowt2_fp4q_512;
#endif
    (void)path, (void)w, (void)raw, (void)l2;
    return NULL;
}

float ds_cpu_dot(const float *a, const float *b, int n, int path) {
#ifdef DS_X86
    if (path == DS_CPU_AVX512) {
        ds_weight w = {.kind = DS_W_F32, .rows = 1, .cols = n, .data = (const uint8_t *)a};
        float y;
        ds_cpu_rowt_f32_512(&w, 0, b, 0, 1, &y);
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

typedef struct {
    const mm_prep *p;
    int n, t0; /* tokens [t0, t0 + TOKEN_BLOCK) */
} mm_job;

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
            ds_cpu_bf16_group_tiled(p, r0, r1, j->t0, t1);
        else if (p->tile == DS_CPU_AVX512)
            ds_cpu_fp8_group_tiled(p, r0, r1, j->t0, t1);
        else
            ds_cpu_fp8_group_tiled_avx2(p, r0, r1, j->t0, t1);
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
        ds_cpu_fp4_quantize_x(xt, K, (uint8_t *)(void *)dst);
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
