/* reference.c — the portable reference path of the CPU products: every
 * output through exactly the operations dispatch.c's header defines, one
 * 16-lane vector an array (l16); the other paths give its bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul/matmul_impl.h"

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
float ds_cpu_row_fp4_generic(const ds_weight *w, int r, const float *xq) {
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
        ds_cpu_fp4_quantize_x(x, K, xq);
        float y = ds_cpu_row_fp4_generic(w, r, (const float *)(const void *)xq);
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
