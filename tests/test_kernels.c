/* test_kernels.c — the matmul kernels: the SIMD path equals the portable
 * reference path bit for bit for every storage format and odd shapes, the
 * result of a row never depends on T (tokens in the call) or the thread
 * count, and dequantization matches the format definitions exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "backend/cpu/cpu.h"
#include "testutil.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)(next() % 20001) / 10000.0f - 1.0f; }

static void make(ds_weight *w, ds_wkind kind, int rows, int cols, uint8_t **data, uint8_t **scale) {
    size_t n = (size_t)rows * cols, bytes = kind == DS_W_F32 ? 4 * n : kind == DS_W_FP8 ? n : kind == DS_W_FP4 ? n / 2 : 2 * n;
    *data = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) (*data)[i] = (uint8_t)next();
    if (kind == DS_W_F32)
        for (size_t i = 0; i < n; i++) ((float *)(void *)*data)[i] = frand();
    if (kind == DS_W_FP8)
        for (size_t i = 0; i < n; i++)
            if (((*data)[i] & 0x7f) == 0x7f) (*data)[i] ^= 1; /* no NaN codes */
    if (kind == DS_W_F16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)(void *)*data)[i] &= 0xBBFF; /* finite */
    if (kind == DS_W_BF16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)(void *)*data)[i] = (uint16_t)((((uint16_t *)(void *)*data)[i] & 0x803F) | 0x3F00);
    int sr = kind == DS_W_FP8 ? (rows + 127) / 128 : rows, sc = kind == DS_W_FP8 ? (cols + 127) / 128 : cols / 32;
    *scale = NULL;
    memset(w, 0, sizeof *w);
    if (kind == DS_W_FP8 || kind == DS_W_FP4) {
        *scale = malloc((size_t)sr * sc);
        for (int i = 0; i < sr * sc; i++) (*scale)[i] = (uint8_t)(120 + next() % 10);
        w->scale = *scale;
        w->scale_cols = sc;
    }
    w->kind = kind;
    w->rows = rows;
    w->cols = cols;
    w->data = *data;
}

/* MXFP4 products quantize x per 32-column group to steps s < 2 max|x| / 127
 * (cpu/matmul/fp4_quant.c) as 24-bit integers v = rint(x 2^16 / s): each x is off by at
 * most s / 2^17. The bound on |y - exact| that this allows (fp32 rounding
 * aside). */
static double fp4_bound(const float *w, const float *x, int K) {
    double b = 0;
    for (int g = 0; g < K; g += 32) {
        double amax = 0, wsum = 0;
        for (int j = g; j < g + 32; j++) amax = fmax(amax, fabs((double)x[j])), wsum += fabs((double)w[j]);
        b += 2 * amax / 127 / 131072 * wsum;
    }
    return b;
}

/* y[r] of an MXFP4 weight from the documented definition alone (cpu/matmul/dispatch.c's
 * header, docs/numerics.md), written apart from the kernels: per group the
 * step exponent e (the smallest >= -109 with max|x| <= 127 2^e), v =
 * rint(x 2^(16 - e)) in double, S = sum(2 w v) exactly in 64 bits and
 * rounded once to fp32, A[lane] = fma(S, ws * 2^(e - 17), A[lane]) with
 * lane 4 (g % 4) + (g % 16) / 4, groups ascending; then the fixed hsum. */
static float fp4_definition(const ds_weight *w, int r, const float *x) {
    int K = w->cols, G = K / 32;
    float A[16] = {0};
    for (int g = 0; g < G; g++) {
        const float *xg = x + 32 * g;
        double amax = 0;
        int bad = 0;
        for (int j = 0; j < 32; j++) {
            bad |= !isfinite(xg[j]);
            amax = fmax(amax, fabs((double)xg[j]));
        }
        float ws = ds_e8m0_to_f32(w->scale[(size_t)r * w->scale_cols + g]), sx = 0.0f;
        int64_t S = 0;
        if (bad)
            sx = NAN;
        else if (amax > 0) {
            int e = -109;
            while (amax > 127.0 * ldexp(1.0, e)) e++;
            sx = (float)ldexp(1.0, e - 17);
            for (int j = 0; j < 32; j++) {
                int c = 32 * g + j;
                uint8_t b = w->data[(size_t)r * (K / 2) + c / 2];
                int code = (c & 1) ? b >> 4 : b & 15;
                static const int mag2[8] = {0, 1, 2, 3, 4, 6, 8, 12};
                int w2 = code & 8 ? -mag2[code & 7] : mag2[code & 7];
                S += (int64_t)w2 * (int64_t)rint((double)xg[j] * ldexp(1.0, 16 - e));
            }
        }
        int l = 4 * (g % 4) + (g % 16) / 4;
        A[l] = fmaf((float)S, ws * sx, A[l]);
    }
    float a[8];
    for (int i = 0; i < 8; i++) a[i] = A[i] + A[i + 8];
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* MXFP4 paths on one weight and T tokens: every path and T = 1 against the
 * portable path's bits and against fp4_definition (NaN: any NaN); returns 1
 * when all agree. */
static int fp4_paths_agree(ds_backend *be, const ds_weight *w, const float *x, int T) {
    int R = w->rows, K = w->cols, same = 1;
    float *y = malloc(sizeof(float) * (size_t)T * R), *yp = malloc(sizeof(float) * (size_t)T * R);
    same &= ds_matmul(be, w, x, T, y, NULL) == 0;
    for (int path = DS_CPU_GENERIC; path <= ds_cpu_best_path(); path++) {
        same &= ds_cpu_matmul_path(be, w, x, T, yp, path) == 0;
        for (int i = 0; i < T * R; i++) same &= !memcmp(&yp[i], &y[i], 4) || (isnan(yp[i]) && isnan(y[i]));
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            float g = ds_cpu_row_dot(w, r, x + (size_t)t * K), h = y[(size_t)t * R + r];
            float d = w->scale_f32 ? h : fp4_definition(w, r, x + (size_t)t * K);
            same &= !memcmp(&g, &h, 4) || (isnan(g) && isnan(h));
            same &= !memcmp(&d, &h, 4) || (isnan(d) && isnan(h));
        }
    free(y);
    free(yp);
    return same;
}


/* Row r of a packed BF16 copy decoded by the layout bf16x.c describes (the
 * bf16 bits of each column, escapes from the row's list): an independent
 * reading of that layout. */
static void bf16x_row_bits(const ds_weight *w, int r, uint16_t *out) {
    const ds_cpu_bf16x *x = w->packed;
    int U = w->cols / 64, P = x->top[r];
    const uint8_t *row = x->units + (size_t)r * (size_t)U * 96;
    for (int u = 0; u < U; u++)
        for (int b = 0; b < 64; b++) {
            int a = row[96 * u + b], code = (row[96 * u + 64 + b / 2] >> (4 * (b & 1))) & 15;
            int e = 2 * (P - 7 + (code & 7)) + (a >> 7); /* E */
            out[64 * u + ds_cpu_bf16x_column(b)] = (uint16_t)((code >> 3) << 15 | (e & 255) << 7 | (a & 127));
        }
    for (uint64_t i = x->eoff[r]; i < x->eoff[r + 1]; i++) {
        CHECK(x->esc[(size_t)r * x->nw + x->ents[i].col / 64 / 64] >> (x->ents[i].col / 64 % 64) & 1,
              "row %d: escape at column %u outside a flagged unit", r, x->ents[i].col);
        out[x->ents[i].col] = x->ents[i].bits;
    }
}

/* BF16 rows of bf16 bits, exponents within 16 of the row's largest and, row
 * by row: nothing else; a few over 40 binades below (escapes); a few +-0; a
 * few subnormals, an infinity or NaN (among values near the largest
 * finite exponent); tiny values only (E <= 3: zeros and
 * subnormals in the window); zeros only. Escapes stay under bf16x.c's
 * limit of one in 64 weights. */
static void bf16x_fill(uint16_t *d, int R, int K) {
    for (int r = 0; r < R; r++) {
        int kind = r % 6, emax = kind == 4 ? 3 : kind == 3 ? 254 : 100 + (int)(next() % 60);
        for (int c = 0; c < K; c++) {
            uint16_t s = (uint16_t)(next() & 1) << 15, m = (uint16_t)(next() & 127);
            int spread = kind == 1 && next() % 256 == 0 ? 40 : 15; /* 40: likely an escape, a pair below P - 7 */
            int e = emax - (int)(next() % (unsigned)spread);
            e = e < 0 ? 0 : e;
            uint16_t h = (uint16_t)(s | e << 7 | m);
            if (kind == 2 && next() % 256 == 0) h = s; /* +-0 */
            if (kind == 3 && next() % 256 == 0) h = (uint16_t)(s | (next() % 127)); /* a subnormal */
            if (kind == 3 && c == K / 2) h = next() & 1 ? 0x7F80 : 0x7FC1; /* inf, NaN */
            if (kind == 5) h = 0;
            d[(size_t)r * K + c] = h;
        }
    }
}

int main(void) {
    /* dequantization against the format definitions */
    CHECK(ds_fp8_e4m3_to_f32(0x38) == 1.0f, "e4m3 0x38 = %g", (double)ds_fp8_e4m3_to_f32(0x38));
    CHECK(ds_fp8_e4m3_to_f32(0x7e) == 448.0f, "e4m3 max = %g", (double)ds_fp8_e4m3_to_f32(0x7e));
    CHECK(ds_fp8_e4m3_to_f32(0x01) == ldexpf(1, -9), "e4m3 min subnormal");
    CHECK(ds_fp8_e4m3_to_f32(0xb8) == -1.0f, "e4m3 sign");
    CHECK(isnan(ds_fp8_e4m3_to_f32(0x7f)), "e4m3 NaN");
    CHECK(ds_e8m0_to_f32(127) == 1.0f && ds_e8m0_to_f32(130) == 8.0f && isnan(ds_e8m0_to_f32(255)), "e8m0");
    CHECK(ds_bf16_to_f32(0x3f80) == 1.0f && ds_f16_to_f32(0x3c00) == 1.0f && ds_f16_to_f32(0x0001) == ldexpf(1, -24),
          "bf16/f16");

    ds_backend be1, be3;
    ds_backend_cpu_init(&be1, 1);
    ds_backend_cpu_init(&be3, 3);
    const ds_wkind kinds[] = {DS_W_F32, DS_W_BF16, DS_W_F16, DS_W_FP8, DS_W_FP4};
    const int shapes[][2] = {{1, 8}, {5, 37}, {7, 100}, {130, 256}, {33, 288}, {9, 4096}, {6, 200}, {3, 160}, {4, 96}, {2, 32}, {5, 416}, {11, 512}, {131, 1024}, {5, 8192}};
    printf("kernel paths tested: generic .. %s\n", ds_cpu_best_path() == DS_CPU_AVX512 ? "avx512" : ds_cpu_best_path() == DS_CPU_AVX2 ? "avx2" : "generic");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int R = shapes[s][0], K = shapes[s][1];
            if (kinds[k] == DS_W_FP4 && K % 32) continue;
            ds_weight w;
            uint8_t *data, *scale;
            make(&w, kinds[k], R, K, &data, &scale);
            int T = 19;
            float *x = malloc(sizeof(float) * (size_t)T * K), *y = malloc(sizeof(float) * (size_t)T * R);
            float *y1 = malloc(sizeof(float) * (size_t)R), *row = malloc(sizeof(float) * (size_t)K);
            for (int i = 0; i < T * K; i++) x[i] = frand();
            int ran = ds_matmul(&be3, &w, x, T, y, NULL) == 0;
            int same_generic = 1, same_t1 = 1, same_paths = 1;
            for (int path = DS_CPU_GENERIC; path <= ds_cpu_best_path(); path++)
                for (int pf = 0; pf < 2; pf++) { /* as with a large / small L1 (prefetch level, row pairs) */
                    float *yp = malloc(sizeof(float) * (size_t)T * R);
                    ds_backend_cpu_set_l1d(&be1, pf ? 8192 : 1 << 20);
                    ran &= ds_cpu_matmul_path(&be1, &w, x, T, yp, path) == 0;
                    same_paths &= memcmp(yp, y, sizeof(float) * (size_t)T * R) == 0;
                    free(yp);
                }
            double maxrel = 0;
            for (int t = 0; t < T; t++) {
                ran &= ds_matmul(&be1, &w, x + (size_t)t * K, 1, y1, NULL) == 0;
                for (int r = 0; r < R; r++) {
                    float g = ds_cpu_row_dot(&w, r, x + (size_t)t * K);
                    same_generic &= memcmp(&g, &y[(size_t)t * R + r], 4) == 0;
                    same_t1 &= memcmp(&y1[r], &y[(size_t)t * R + r], 4) == 0;
                    if (t == 0) { /* against a double-precision dot of the dequantized row */
                        ds_weight_row_f32(&w, r, row);
                        double ref = 0, mag = 0;
                        for (int c = 0; c < K; c++) ref += (double)row[c] * (double)x[c], mag += fabs((double)row[c] * (double)x[c]);
                        double rel = fabs(ref - (double)y[r]) / (mag + 1e-30);
                        if (kinds[k] == DS_W_FP4) /* x is quantized per group: error / its bound */
                            rel = fabs(ref - (double)y[r]) / (fp4_bound(row, x, K) + 1e-6 * mag + 1e-30) * 1e-5;
                        if (rel > maxrel) maxrel = rel;
                    }
                }
            }
            CHECK(ran, "kind %d %dx%d: a matmul failed", (int)kinds[k], R, K);
            CHECK(same_generic, "kind %d %dx%d: SIMD != portable path", (int)kinds[k], R, K);
            CHECK(same_paths, "kind %d %dx%d: kernel paths (generic..%d, as with a large / small L1) differ", (int)kinds[k], R, K, ds_cpu_best_path());
            CHECK(same_t1, "kind %d %dx%d: T=19/3 threads != T=1/1 thread", (int)kinds[k], R, K);
            CHECK(maxrel < 1e-5, "kind %d %dx%d: error vs double %g", (int)kinds[k], R, K, maxrel);
            free(x);
            free(y);
            free(y1);
            free(row);
            free(data);
            free(scale);
        }
    /* FP8 through the AVX-512 "raw" kernels (x scaled by 2^112): inputs that
     * would overflow (|x| >= 2^16) and denormals-are-zero mode must fall back
     * to kernels with the portable path's bits. The weights include e4m3
     * subnormals, which DAZ would read as zero in the raw kernels. */
    {
        int R = 37, K = 520;
        ds_weight w;
        uint8_t *data, *scale;
        make(&w, DS_W_FP8, R, K, &data, &scale);
        for (int i = 0; i < R * K; i += 7) data[i] = (uint8_t)(data[i] & 0x87); /* subnormal codes */
        float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * R);
        const float big[] = {1.0f, 65535.99f, 65536.0f, 3.0e6f, INFINITY};
        for (int daz = 0; daz < 2; daz++)
            for (size_t b = 0; b < sizeof big / sizeof big[0]; b++) {
                for (int i = 0; i < K; i++) x[i] = frand();
                x[K / 3] = -big[b];
                unsigned csr = _mm_getcsr();
                if (daz) _mm_setcsr(csr | 0x40);
                int ran = ds_matmul(&be3, &w, x, 1, y, NULL) == 0;
                _mm_setcsr(csr);
                CHECK(ran, "FP8 matmul failed");
                int same = 1;
                for (int r = 0; r < R; r++) {
                    float g = ds_cpu_row_dot(&w, r, x);
                    same &= memcmp(&g, &y[r], 4) == 0;
                }
                CHECK(same, "FP8 with |x| up to %.9g%s: SIMD != portable path", (double)big[b], daz ? " under DAZ" : "");
            }
        free(x);
        free(y);
        free(data);
        free(scale);
    }
    /* the two-row FP8 kernel (K % 256 == 0, 3+ tokens) with an x too large
     * for the raw kernels: the plain-decoder two-row instance */
    {
        int R = 9, K = 512, T = 5;
        ds_weight w;
        uint8_t *data, *scale;
        make(&w, DS_W_FP8, R, K, &data, &scale);
        float *x = malloc(sizeof(float) * (size_t)T * K), *y = malloc(sizeof(float) * (size_t)T * R);
        for (int i = 0; i < T * K; i++) x[i] = frand();
        x[K + 3] = 3.0e6f;
        int ran = ds_matmul(&be3, &w, x, T, y, NULL) == 0, same = 1;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) {
                float g = ds_cpu_row_dot(&w, r, x + (size_t)t * K);
                same &= memcmp(&g, &y[(size_t)t * R + r], 4) == 0;
            }
        CHECK(ran && same, "FP8 two-row kernel with |x| = 3e6: SIMD != portable path");
        free(x);
        free(y);
        free(data);
        free(scale);
    }
    /* the FP8 prefill tiles (AVX-512, K % 256 == 0, DS_CPU_TILE_MIN_T+ tokens):
     * panels (a partial last one), a last group of 1 or 3 rows (21, 23 rows in
     * groups of DS_CPU_TILE_ROWS = 4), two token blocks with a
     * partial last tile, x in range (raw decoder) and too large for it (plain
     * decoder): every (row, token) has the portable path's bits */
    for (int big = 0; big < 2; big++) {
        int R = big ? 23 : 21, K = 1280, T = 37;
        ds_weight w;
        uint8_t *data, *scale;
        make(&w, DS_W_FP8, R, K, &data, &scale);
        for (int i = 0; i < R * K; i += 11) data[i] = (uint8_t)(data[i] & 0x87); /* subnormal codes */
        float *x = malloc(sizeof(float) * (size_t)T * K), *y = malloc(sizeof(float) * (size_t)T * R);
        for (int i = 0; i < T * K; i++) x[i] = frand();
        if (big) x[5 * K + 700] = -3.0e6f;
        int ran = ds_matmul(&be3, &w, x, T, y, NULL) == 0, same = 1;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) {
                float g = ds_cpu_row_dot(&w, r, x + (size_t)t * K);
                same &= memcmp(&g, &y[(size_t)t * R + r], 4) == 0;
            }
        CHECK(ran && same, "FP8 prefill tiles%s: SIMD != portable path", big ? " (|x| = 3e6)" : "");
        free(x);
        free(y);
        free(data);
        free(scale);
    }
    /* the MXFP4 quantizer: the vectorized one writes the scalar definition's
     * bytes, for every magnitude (per group: ordinary, huge, tiny, subnormal,
     * zero, with an infinity or a NaN, ties at .5 steps) */
    {
        int K = 96 * 32; /* 96 groups: 6 spans */
        float *x = malloc(sizeof(float) * K);
        size_t nb = ds_cpu_fp4_quantized_bytes(K);
        uint8_t *qa = malloc(nb), *qb = malloc(nb);
        const float mag[] = {1.0f, 3.0e38f, 1.0e-30f, 1.0e-42f, 0.0f, 1.0f, 1.0f, 127.0f};
        for (int rep = 0; rep < 20; rep++) {
            for (int g = 0; g < K / 32; g++)
                for (int j = 0; j < 32; j++) {
                    int c = (g + rep) % 8;
                    float v = frand() * mag[c];
                    if (c == 7) v = (float)((int)(next() % 511) - 255) * 0.5f; /* x / s at .5 steps: ties */
                    x[g * 32 + j] = v;
                }
            x[(rep * 37) % K] = rep & 1 ? INFINITY : NAN;
            x[(rep * 101 + 7) % K] = -0.0f;
            ds_cpu_fp4_quantize(x, K, qa, 0);
            ds_cpu_fp4_quantize(x, K, qb, 1);
            CHECK(!memcmp(qa, qb, nb), "MXFP4 quantizer, round %d: vector bytes != scalar bytes", rep);
        }
        free(x), free(qa), free(qb);
    }
    /* MXFP4 (exact integer products per group): extreme inputs give the same
     * bits on every path, T and thread count, and the documented values */
    {
        int R = 7, K = 1184, T = 6; /* 37 groups: two whole spans and a partial one */
        ds_weight w;
        uint8_t *data, *scale;
        make(&w, DS_W_FP4, R, K, &data, &scale);
        float *x = malloc(sizeof(float) * (size_t)T * K), *y = malloc(sizeof(float) * (size_t)T * R);
        float *row = malloc(sizeof(float) * (size_t)K);
        const float special[] = {0.0f, 3.0e38f, -1.0e-30f, 1.0e-42f, 1.0e-38f, 65504.0f, 127.0f, 0.5f};
        for (int c = 0; c < 8; c++) { /* whole x of one magnitude, x mixed with it, max codes */
            for (int i = 0; i < T * K; i++) x[i] = special[c] * (c & 1 ? frand() : 1.0f);
            for (int i = 0; i < T * K; i += 5) x[i] = -x[i];
            for (int t = 0; t < T; t++)
                for (int j = 0; j < 32; j++) x[(size_t)t * K + 32 * (t + 3) + j] = frand(); /* one ordinary group */
            if (c == 2) memset(data, 0x77, (size_t)R * K / 2);       /* +6 everywhere */
            if (c == 3) memset(data, 0xFF, (size_t)R * K / 2);       /* -6 everywhere */
            CHECK(fp4_paths_agree(&be3, &w, x, T) && fp4_paths_agree(&be1, &w, x, 1), "MXFP4 x = %g (case %d): paths differ",
                  (double)special[c], c);
        }
        /* scales without 0 or 255 (120..129 here): pack_weight marks them plain
         * on the SIMD paths, whose kernels then decode them the short way
         * (matmul/rows_avx512.c fp4q_scales_512, rows_avx2.c _avx2): the same bits at 1 (one row a call) and
         * 6 tokens (pairs); a 0 or a 255 keeps the flag off */
        {
            ds_err perr;
            const char *pk = getenv("DSV4_CPU_PACK");
            int on = ds_cpu_best_path() != DS_CPU_GENERIC && !(pk && !strcmp(pk, "0"));
            CHECK(be3.pack_weight(&be3, &w, &perr) == 0 && w.scale_plain == on, "MXFP4 pack_weight: scale_plain %d, not %d",
                  w.scale_plain, on);
            for (int bad = 0; bad < 2 && on; bad++) {
                uint8_t keep = scale[3 * (K / 32) + 17];
                scale[3 * (K / 32) + 17] = bad ? 255 : 0;
                CHECK(be3.pack_weight(&be3, &w, &perr) == 0 && !w.scale_plain, "MXFP4 pack_weight: a %d scale is plain",
                      bad ? 255 : 0);
                scale[3 * (K / 32) + 17] = keep;
            }
            w.scale_plain = 1; /* x: the last case above (0.5 x random, one ordinary group a token) */
            CHECK(fp4_paths_agree(&be3, &w, x, T) && fp4_paths_agree(&be3, &w, x, 1) && fp4_paths_agree(&be1, &w, x, 1),
                  "MXFP4 plain scales: paths differ");
            w.scale_plain = 0;
        }
        for (int i = 0; i < T * K; i++) x[i] = 0.0f;
        CHECK(ds_matmul(&be3, &w, x, T, y, NULL) == 0, "MXFP4 zeros");
        int zero = 1;
        for (int i = 0; i < T * R; i++) zero &= y[i] == 0.0f;
        CHECK(zero, "MXFP4: x = 0 gives y = 0");
        /* a NaN or an infinity in x: y is NaN (the group's step is NaN) */
        for (int i = 0; i < T * K; i++) x[i] = frand();
        x[K + 700] = INFINITY, x[3 * K + 5] = NAN, x[5 * K + K - 1] = -INFINITY;
        CHECK(ds_matmul(&be3, &w, x, T, y, NULL) == 0 && fp4_paths_agree(&be3, &w, x, T), "MXFP4 non-finite x: paths");
        int nan_ok = 1;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) nan_ok &= (t == 1 || t == 3 || t == 5) ? isnan(y[t * R + r]) : isfinite(y[t * R + r]);
        CHECK(nan_ok, "MXFP4: a non-finite x makes that token's outputs NaN, and only those");
        /* E8M0 extremes: 0 (2^-127) and 254 are values, 255 is NaN */
        for (int i = 0; i < R * K / 32; i++) scale[i] = (uint8_t)(i % 3 == 0 ? 0 : i % 3 == 1 ? 254 : 127);
        for (int i = 0; i < T * K; i++) x[i] = frand() * 1e-20f;
        CHECK(fp4_paths_agree(&be3, &w, x, T), "MXFP4 E8M0 0 / 254: paths differ");
        scale[5 * (K / 32) + 36] = 255; /* row 5, the last group */
        CHECK(ds_matmul(&be3, &w, x, T, y, NULL) == 0 && fp4_paths_agree(&be3, &w, x, T), "MXFP4 E8M0 255: paths");
        int nan_row = 1;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) nan_row &= r == 5 ? isnan(y[t * R + r]) : !isnan(y[t * R + r]);
        CHECK(nan_row, "MXFP4: E8M0 255 makes its row NaN, and only it");
        /* x on the quantization grid (max|x| = 127 * 2^-3 per group: step 2^-3,
         * lo = 0) loses nothing: y is the exact sum up to fp32 rounding */
        for (int i = 0; i < R * K / 32; i++) scale[i] = (uint8_t)(120 + i % 10);
        for (int i = 0; i < T * K; i++) x[i] = (float)((int)(next() % 255) - 127) * 0.125f;
        for (int i = 0; i < T * K; i += 32) x[i] = 127 * 0.125f;
        CHECK(ds_matmul(&be3, &w, x, T, y, NULL) == 0, "MXFP4 grid");
        double worst = 0;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) {
                ds_weight_row_f32(&w, r, row);
                double ref = 0, mag = 0;
                for (int c = 0; c < K; c++) {
                    ref += (double)row[c] * (double)x[(size_t)t * K + c];
                    mag += fabs((double)row[c] * (double)x[(size_t)t * K + c]);
                }
                double rel = fabs(ref - (double)y[t * R + r]) / mag;
                worst = rel > worst ? rel : worst;
            }
        CHECK(worst < 1e-6, "MXFP4 on-grid x: relative error %g (fp32 rounding of 37 exact group sums)", worst);
        free(x), free(y), free(row), free(data), free(scale);
    }
    /* BF16's packed copy (bf16x.c): its layout gives back every weight's
     * bits, and the AVX-512 kernel reading it gives the BF16 kernels' bits
     * (NaN: a NaN) at every token count, including units with escapes,
     * rows of zeros, of tiny values, with infinities and NaN, and more than
     * 64 units a row. A matrix with too many escapes stays unpacked. */
    {
        const int bshapes[][2] = {{7, 64}, {12, 128}, {6, 4096}, {5, 4160}, {3, 8192}};
        for (size_t s = 0; s < sizeof bshapes / sizeof bshapes[0]; s++) {
            int R = bshapes[s][0], K = bshapes[s][1], T = 40; /* 1..9, then 33 and 40 (AVX-512 tiles from 8) */
            ds_weight w = {.kind = DS_W_BF16, .rows = R, .cols = K, .name = "bf16x test"};
            uint16_t *d = malloc(sizeof *d * (size_t)R * K), *back = malloc(sizeof *back * (size_t)K);
            bf16x_fill(d, R, K);
            w.data = (const uint8_t *)d;
            ds_weight plain = w;
            CHECK(ds_cpu_bf16x_pack(&be3, &w, NULL) == 0 && w.packed, "bf16x %dx%d: not packed", R, K);
            if (!w.packed) continue;
            int same_bits = 1, nesc = 0;
            for (int r = 0; r < R; r++) {
                bf16x_row_bits(&w, r, back);
                same_bits &= memcmp(back, d + (size_t)r * K, sizeof *back * (size_t)K) == 0;
            }
            nesc = (int)((const ds_cpu_bf16x *)w.packed)->eoff[R];
            CHECK(same_bits, "bf16x %dx%d: the packed layout does not give back the weights' bits", R, K);
            CHECK(nesc > 0, "bf16x %dx%d: the test has no escapes", R, K);
            /* 12 bits a weight, per row its P, escape bits and list offset, 8 bytes an escape */
            uint64_t want = ds_weight_bytes(&plain) * 3 / 4 + (uint64_t)R * (1 + 8 * (uint64_t)((K / 64 + 63) / 64)) +
                            8 * (uint64_t)(R + 1) + 8 * (uint64_t)nesc;
            CHECK(w.packed_bytes == want, "bf16x %dx%d: packed %llu bytes, not %llu", R, K,
                  (unsigned long long)w.packed_bytes, (unsigned long long)want);
            float *x = malloc(sizeof(float) * (size_t)T * K), *y0 = malloc(sizeof(float) * (size_t)T * R);
            float *y1 = malloc(sizeof(float) * (size_t)T * R);
            for (int i = 0; i < T * K; i++) x[i] = frand();
            int ok = ds_cpu_matmul_path(&be1, &plain, x, T, y0, DS_CPU_GENERIC) == 0, same = 1;
            for (int t = 1; t <= T; t = t < 9 ? t + 1 : t < 33 ? 33 : t < T ? T : T + 1)
                for (int pf = 0; pf < 2; pf++) {
                    ds_backend_cpu_set_l1d(&be3, pf ? 8192 : 1 << 20);
                    ok &= ds_cpu_matmul_path(&be3, &w, x, t, y1, ds_cpu_best_path()) == 0;
                    for (int i = 0; i < t * R; i++) same &= !memcmp(&y0[i], &y1[i], 4) || (isnan(y0[i]) && isnan(y1[i]));
                }
            CHECK(ok && same, "bf16x %dx%d: packed products (path %d, T = 1..9, 33, %d) differ from BF16's", R, K,
                  ds_cpu_best_path(), T);
            ds_cpu_bf16x_release(&be3, &w);
            CHECK(!w.packed && !w.packed_bytes, "bf16x: release");
            /* every row wide: more escapes than packing saves */
            for (int r = 0; r < R; r++)
                for (int c = 0; c < K; c++) d[(size_t)r * K + c] = (uint16_t)(c % 2 ? 0 : 0x4000 | (c % 64));
            CHECK(ds_cpu_bf16x_pack(&be3, &w, NULL) == 0 && !w.packed, "bf16x %dx%d: half zeros, packed anyway", R, K);
            free(x), free(y0), free(y1), free(d), free(back);
        }
    }

    /* the small fixed-order dot used by norms and attention = the portable path */
    for (int n = 1; n < 300; n += 7) {
        float a[300], b[300];
        for (int i = 0; i < n; i++) a[i] = frand(), b[i] = frand();
        ds_weight w1 = {.kind = DS_W_F32, .rows = 1, .cols = n, .data = (const uint8_t *)a};
        float f = ds_dot_f32(a, b, n), g = ds_cpu_row_dot(&w1, 0, b);
        CHECK(!memcmp(&f, &g, 4), "ds_dot_f32 n=%d: %g != portable %g", n, (double)f, (double)g);
    }
    be1.close(&be1);
    be3.close(&be3);
    return test_summary("kernels");
}
