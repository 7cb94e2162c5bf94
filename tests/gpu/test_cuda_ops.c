/* test_cuda_ops.c — the CUDA backend's ops against plain CPU references
 * (double accumulation, tolerances stated per op), and batch invariance,
 * bitwise: a token's outputs alone = inside batches of 2, 7 and 64 at other
 * rows (matmul for every storage kind, K not a multiple of 128 too; attention;
 * MoE; the indexer), and chunked = whole for the compressor.
 * Exits 77 (skipped) without a GPU. Prints "N passed, M failed". */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"

typedef struct {
    ds_backend be;
    ds_err err;
    int pass, fail;
    uint64_t rng;
} ctx;

static void check(ctx *C, int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (ok) {
        C->pass++;
    } else {
        C->fail++;
        printf("FAIL ");
        vprintf(fmt, ap);
        printf("\n");
    }
    va_end(ap);
}

static void die_if(ctx *C, int rc, const char *what) {
    if (rc) {
        printf("FATAL %s: %s\n", what, C->err.msg);
        exit(1);
    }
}

static uint32_t rnd(ctx *C) {
    C->rng ^= C->rng << 13;
    C->rng ^= C->rng >> 7;
    C->rng ^= C->rng << 17;
    return (uint32_t)(C->rng >> 11);
}
static float frand(ctx *C) { return (float)((rnd(C) & 0xffffff) / 8388608.0 - 1.0); }
static float *frandv(ctx *C, size_t n, float s) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand(C) * s;
    return v;
}

/* device helpers */
static void *dput(ctx *C, const void *h, size_t bytes) {
    void *d = C->be.alloc(&C->be, bytes, &C->err);
    if (!d) die_if(C, -1, "alloc");
    if (h) die_if(C, C->be.upload(&C->be, d, h, bytes, &C->err), "upload");
    else die_if(C, C->be.memset0(&C->be, d, bytes, &C->err), "memset0");
    return d;
}
static void dget(ctx *C, void *h, const void *d, size_t bytes) {
    die_if(C, C->be.download(&C->be, h, d, bytes, &C->err), "download");
}
static float *fget(ctx *C, const void *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    dget(C, h, d, n * sizeof *h);
    return h;
}

/* ---- host decoders (the reference) -------------------------------------- */

static float h_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float h_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf(1.0f + m / 1024.0f, e - 15);
    return s ? -v : v;
}
static float h_e8m0(uint8_t e) { return ldexpf(1.0f, (int)e - 127); }
static float h_fp8(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    return s ? -v : v;
}
static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

typedef struct {
    ds_weight h, d;     /* host and device views */
    float *deq;         /* [rows][cols] dequantized */
    uint8_t *hd, *hs;
} tw;

static float h_scale(const ds_weight *w, size_t i) {
    if (w->scale_f32) {
        float f;
        memcpy(&f, w->scale + 4 * i, 4);
        return f;
    }
    return h_e8m0(w->scale[i]);
}

static const char *kname[5] = {"F32", "BF16", "F16", "FP8", "FP4"};

/* A weight's shape with zeroed host codes and room for its scales (*db code
 * bytes, *ns scales); the caller fills them, then map_weight. */
static tw new_weight(ds_wkind kind, int rows, int cols, int scale_f32, size_t *db, size_t *ns) {
    tw t;
    memset(&t, 0, sizeof t);
    ds_weight *w = &t.h;
    w->kind = kind;
    w->rows = rows;
    w->cols = cols;
    w->name = kname[kind];
    w->scale_f32 = scale_f32;
    size_t n = (size_t)rows * cols;
    *db = kind == DS_W_F32 ? 4 * n : kind == DS_W_FP8 ? n : kind == DS_W_FP4 ? n / 2 : 2 * n;
    *ns = 0;
    if (kind == DS_W_FP8) {
        w->scale_cols = (cols + 127) / 128;
        *ns = (size_t)((rows + 127) / 128) * w->scale_cols;
    } else if (kind == DS_W_FP4) {
        w->scale_cols = (cols + 31) / 32;
        *ns = (size_t)rows * w->scale_cols;
    }
    t.hd = calloc(*db + 16, 1);
    if (*ns) t.hs = malloc(*ns * (scale_f32 ? 4 : 1));
    w->data = t.hd;
    w->scale = t.hs;
    return t;
}

/* The host codes dequantized into deq, then codes and scales mapped to the device. */
static void map_weight(ctx *C, tw *t, size_t db, size_t ns) {
    ds_weight *w = &t->h;
    int rows = w->rows, cols = w->cols;
    size_t n = (size_t)rows * cols;
    t->deq = malloc(n * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            float v = 0;
            uint16_t h;
            switch (w->kind) {
            case DS_W_F32: memcpy(&v, t->hd + 4 * i, 4); break;
            case DS_W_BF16: memcpy(&h, t->hd + 2 * i, 2); v = h_bf16(h); break;
            case DS_W_F16: memcpy(&h, t->hd + 2 * i, 2); v = h_f16(h); break;
            case DS_W_FP8: v = h_fp8(t->hd[i]) * h_scale(w, (size_t)(r / 128) * w->scale_cols + c / 128); break;
            case DS_W_FP4: {
                uint8_t b = t->hd[i / 2];
                v = e2m1[(c & 1) ? b >> 4 : b & 15] * h_scale(w, (size_t)r * w->scale_cols + c / 32);
                break;
            }
            }
            t->deq[i] = v;
        }
    t->d = t->h;
    const void *dd = NULL, *ds = NULL;
    die_if(C, C->be.map_weights(&C->be, t->hd, db, w->kind == DS_W_FP4 ? DS_MAP_FP4_CODES : DS_MAP_BYTES, &dd, &C->err),
           "map_weights");
    t->d.data = dd;
    if (ns) {
        die_if(C, C->be.map_weights(&C->be, t->hs, ns * (w->scale_f32 ? 4 : 1), DS_MAP_BYTES, &ds, &C->err),
               "map_weights");
        t->d.scale = ds;
    }
}

static tw make_weight(ctx *C, ds_wkind kind, int rows, int cols, int scale_f32) {
    size_t db, ns, n = (size_t)rows * cols;
    tw t = new_weight(kind, rows, cols, scale_f32, &db, &ns);
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case DS_W_F32: {
            float f = frand(C) * 0.5f;
            memcpy(t.hd + 4 * i, &f, 4);
            break;
        }
        case DS_W_BF16:
        case DS_W_F16: {
            uint16_t h;
            if (kind == DS_W_BF16) {
                float f = frand(C) * 0.5f;
                uint32_t u;
                memcpy(&u, &f, 4);
                h = (uint16_t)(u >> 16);
            } else {
                h = (uint16_t)((rnd(C) & 0x83ff) | ((10 + rnd(C) % 6) << 10)); /* |v| in [2^-5, 1) */
            }
            memcpy(t.hd + 2 * i, &h, 2);
            break;
        }
        case DS_W_FP8: {
            uint8_t b = (uint8_t)rnd(C);
            if ((b & 0x7f) == 0x7f) b ^= 1;
            t.hd[i] = b;
            break;
        }
        case DS_W_FP4:
            if (i % 2 == 0) t.hd[i / 2] = (uint8_t)rnd(C);
            break;
        }
    }
    for (size_t i = 0; i < ns; i++) {
        if (scale_f32) {
            float f = 0.01f + 0.05f * (frand(C) + 1.0f);
            memcpy(t.hs + 4 * i, &f, 4);
        } else {
            t.hs[i] = (uint8_t)(kind == DS_W_FP8 ? 118 + rnd(C) % 6 : 122 + rnd(C) % 5);
        }
    }
    map_weight(C, &t, db, ns);
    return t;
}

static void free_weight(ctx *C, tw *t) {
    C->be.unmap_weights(&C->be, t->d.data);
    if (t->d.scale) C->be.unmap_weights(&C->be, t->d.scale);
    free(t->hd);
    free(t->hs);
    free(t->deq);
}

/* |y - ref| <= rel * sum|w x| + abs */
static int close_dot(double y, double ref, double mag, double rel) { return fabs(y - ref) <= rel * mag + 1e-6; }

/* ---- tensor-core weight decoding ------------------------------------------------ */

/* The f16 bits of a float that f16 holds exactly as a normal or zero (every
 * e4m3 value: 2^-9 .. 448). */
static uint16_t f16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    if ((u & 0x7fffffffu) == 0) return s;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(s | (e << 10) | ((u >> 13) & 0x3ff));
}
static int f16_isnan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

/* The values the MMAs get for every e4m3 byte at every position of a word
 * (f16: NaN words included), bitwise against the host's values (exact: e4m3
 * values are f16 normals). */
static void test_weight_decode(ctx *C) {
    /* FP8: word i = bytes i, i+1, i+2, i+3 (each byte at each position), then i x4 */
    int nw = 512;
    uint32_t *w = malloc(sizeof(uint32_t) * nw), *o = malloc(sizeof(uint32_t) * 2 * nw);
    for (int i = 0; i < 256; i++) {
        w[i] = 0;
        for (int p = 0; p < 4; p++) w[i] |= (uint32_t)((i + p) & 255) << (8 * p);
        w[256 + i] = (uint32_t)i * 0x01010101u;
    }
    die_if(C, ds_cuda_mma_weight_probe(0, w, nw, o, &C->err), "weight probe FP8");
    int bad = 0;
    for (int i = 0; i < nw; i++)
        for (int p = 0; p < 4; p++) {
            uint8_t b = (uint8_t)(w[i] >> (8 * p));
            uint16_t got = (uint16_t)(o[2 * i + p / 2] >> (16 * (p & 1)));
            float want = h_fp8(b);
            int ok = (b & 0x7f) == 0x7f ? f16_isnan(got) : got == f16_bits(want);
            if (!ok && bad++ < 4) printf("  e4m3 byte 0x%02x at %d of 0x%08x: f16 0x%04x, want %g\n", b, p, w[i], got, want);
        }
    check(C, !bad, "tensor cores: every e4m3 byte at every position of a word = its exact value in f16 (%d bad)", bad);
    free(w);
    free(o);
}

/* One-hot tokens through the products of t at T = 128 (the tile kernel;
 * the tokens' columns spread over the 128-column groups) and 1, 8, 20 (the
 * decode kernels): token j's one value v_j (1, or with full a random 24-bit
 * significand of magnitude 2^-40 .. 2^40) at column k_j, so y[j][r] must be
 * w[r][k_j] v_j where that product is exact. Values, not bits: 0 + (-0) = +0. */
static void onehot_products(ctx *C, tw *t, int full, const char *what) {
    int rows = t->h.rows, cols = t->h.cols, Ts[4] = {128, 1, 8, 20};
    for (int ti = 0; ti < 4; ti++) {
        int T = Ts[ti], bad = 0;
        int *k = malloc(sizeof(int) * T);
        float *x = calloc((size_t)T * cols, sizeof(float)), *v = malloc(sizeof(float) * T);
        for (int j = 0; j < T; j++) {
            uint32_t u = ((127 + rnd(C) % 81 - 40) << 23) | (rnd(C) & 0x807fffffu);
            v[j] = 1.0f;
            if (full) memcpy(&v[j], &u, 4);
            k[j] = T == 128 ? j * (cols / 128) + (int)(rnd(C) % (unsigned)(cols / 128)) : (int)(rnd(C) % (unsigned)cols);
            x[(size_t)j * cols + k[j]] = v[j];
        }
        float *dx = dput(C, x, sizeof(float) * T * cols), *dy = dput(C, NULL, sizeof(float) * T * rows);
        die_if(C, ds_matmul(&C->be, &t->d, dx, T, dy, &C->err), "matmul");
        float *y = fget(C, dy, (size_t)T * rows);
        for (int j = 0; j < T; j++)
            for (int r = 0; r < rows; r++) {
                float want = t->deq[(size_t)r * cols + k[j]] * v[j], got = y[(size_t)j * rows + r];
                if (!(want == got) && bad++ < 3) /* == : the sum of a -0 weight's product is +0 */
                    printf("  one-hot %s T %d token %d (x %a at %d) row %d: %a, want %a\n", kname[t->h.kind], T, j,
                           v[j], k[j], r, got, want);
            }
        check(C, !bad, "matmul %s [%d x %d], %d one-hot tokens: %s (%d bad)", kname[t->h.kind], rows, cols, T, what,
              bad);
        free(k);
        free(x);
        free(v);
        free(y);
        C->be.free(&C->be, dx);
        C->be.free(&C->be, dy);
    }
}

/* Through the products: one-hot tokens (x = e_k, split exactly: hi = 1,
 * lo = 0) read single weights, so y[t][r] = w[r][k_t] exactly (the
 * dequantized value: e4m3 / e2m1 code times its power-of-two scale). Every
 * e2m1 code with every E8M0 scale 2^-125 .. 2^125 (all products normal and
 * finite), every e4m3 byte but NaN with FP8 scales 2^-20 .. 2^20. */
static void test_onehot(ctx *C, ds_wkind kind, int rows, int cols) {
    size_t db, ns, n = (size_t)rows * cols;
    tw t = new_weight(kind, rows, cols, 0, &db, &ns);
    for (size_t i = 0; i < n; i++) {
        int r = (int)(i / (size_t)cols), c = (int)(i % (size_t)cols);
        if (kind == DS_W_FP8) {
            uint8_t b = (uint8_t)((r * 7 + c) & 255);
            if ((b & 0x7f) == 0x7f) b ^= 1;
            t.hd[i] = b;
        } else {
            t.hd[i / 2] |= (uint8_t)(((r * 3 + c) & 15) << (4 * (i & 1)));
        }
    }
    for (size_t i = 0; i < ns; i++) t.hs[i] = (uint8_t)(kind == DS_W_FP8 ? 107 + i % 41 : 2 + i % 251);
    map_weight(C, &t, db, ns);
    onehot_products(C, &t, 0, "y = the weight's exact value");
    free_weight(C, &t);
}

/* BF16 products keep every bit of x (hi + mid + lo): one-hot tokens whose one
 * value has a full 24-bit significand against weights of powers of two (and
 * zeros), so w x is exact in fp32 and y = w x exactly; two bf16 parts would
 * drop x's low 8 bits. */
static void test_bf16_exact(ctx *C, int rows, int cols) {
    size_t db, ns, n = (size_t)rows * cols;
    tw t = new_weight(DS_W_BF16, rows, cols, 0, &db, &ns);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd(C), e = 127 + r % 33 - 16; /* 2^-16 .. 2^16, either sign; 1 in 17 zero */
        uint16_t h = r % 17 == 0 ? 0 : (uint16_t)((((r >> 8) & 1) << 15) | (e << 7));
        memcpy(t.hd + 2 * i, &h, 2);
    }
    map_weight(C, &t, db, ns);
    onehot_products(C, &t, 1, "24-bit values, y = w x exactly");
    free_weight(C, &t);
}

/* FP8 NaN codes through the products (0x7f / 0xff: the tensor cores' cvt
 * decodes them to NaN, no check of its own). A copy of a NaN-free matrix with
 * a NaN byte in every 37th row: y is NaN in exactly those rows, and every
 * other row has the bits of the NaN-free matrix, at T = 1, 8 (the decode /
 * streaming kernels by shape), 20 and 70 (the tile kernel). */
static void test_fp8_nan(ctx *C, int rows, int cols) {
    tw a = make_weight(C, DS_W_FP8, rows, cols, 0);
    size_t db, ns;
    tw b = new_weight(DS_W_FP8, rows, cols, 0, &db, &ns);
    memcpy(b.hd, a.hd, db);
    memcpy(b.hs, a.hs, ns);
    for (int r = 3; r < rows; r += 37) b.hd[(size_t)r * cols + (size_t)(r * 13) % (size_t)cols] = r & 1 ? 0xff : 0x7f;
    map_weight(C, &b, db, ns);
    int Ts[4] = {1, 8, 20, 70}, ok = 1;
    for (int ti = 0; ti < 4; ti++) {
        int T = Ts[ti];
        float *x = frandv(C, (size_t)T * cols, 1.0f);
        float *dx = dput(C, x, sizeof(float) * T * cols), *dya = dput(C, NULL, sizeof(float) * T * rows),
              *dyb = dput(C, NULL, sizeof(float) * T * rows);
        die_if(C, ds_matmul(&C->be, &a.d, dx, T, dya, &C->err), "matmul");
        die_if(C, ds_matmul(&C->be, &b.d, dx, T, dyb, &C->err), "matmul");
        float *ya = fget(C, dya, (size_t)T * rows), *yb = fget(C, dyb, (size_t)T * rows);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rows; r++) {
                size_t i = (size_t)t * rows + r;
                int good = r % 37 == 3 ? isnan(yb[i]) : !isnan(ya[i]) && !memcmp(&ya[i], &yb[i], sizeof(float));
                if (!good && ok) printf("  FP8 NaN [%d x %d] T %d token %d row %d: %g (NaN-free copy %g)\n", rows, cols, T, t,
                                        r, yb[i], ya[i]);
                ok &= good;
            }
        free(x);
        free(ya);
        free(yb);
        C->be.free(&C->be, dx);
        C->be.free(&C->be, dya);
        C->be.free(&C->be, dyb);
    }
    check(C, ok, "matmul FP8 [%d x %d] with NaN codes in every 37th row: those rows NaN, the others the bits of the "
                 "NaN-free matrix (T = 1, 8, 20, 70)", rows, cols);
    free_weight(C, &a);
    free_weight(C, &b);
}

/* ---- a step ------------------------------------------------------------- */

typedef struct {
    int T, S, L;
    int32_t tok_id[512];
    int64_t tok_pos[512], seq_pos0[64];
    int tok_seq[512], seq_row0[64], seq_n[64];
    const ds_layer_mem *mem[64];
    ds_layer_mem none;          /* the state of sequences an op does not touch */
} step;

static void step_add(step *s, int n, int64_t pos0, const ds_layer_mem *mem) {
    int q = s->S++;
    s->seq_row0[q] = s->T;
    s->seq_n[q] = n;
    s->seq_pos0[q] = pos0;
    s->mem[q] = mem ? mem : &s->none;
    for (int i = 0; i < n; i++) {
        s->tok_pos[s->T] = pos0 + i;
        s->tok_seq[s->T] = q;
        s->tok_id[s->T] = (int32_t)((pos0 + i) * 7 % 50);
        s->T++;
    }
}

static void begin(ctx *C, step *s) {
    ds_step_desc d = {s->T, s->S, s->L, s->tok_id, s->tok_pos, s->tok_seq, s->seq_row0, s->seq_n, s->seq_pos0, s->mem};
    die_if(C, C->be.begin_step(&C->be, &d, &C->err), "begin_step");
}

/* ---- matmul --------------------------------------------------------------- */

/* xg [Tg][G][cols] through matmul_grouped of w (G row groups): 1 where every
 * group's outputs have the bits of its own matmul through a row view of w
 * with the same x columns. */
static int grouped_own_bits(ctx *C, const tw *w, int G, int Tg, const float *xg) {
    int rows = w->d.rows, cols = w->d.cols, Rg = rows / G, ok = 1, kind = w->d.kind;
    float *dxg = dput(C, xg, sizeof(float) * Tg * G * cols), *dyg = dput(C, NULL, sizeof(float) * Tg * rows);
    ds_matmul_grouped gp = {&w->d, G, Tg, dxg, dyg};
    die_if(C, C->be.matmul_grouped(&C->be, &gp, &C->err), "matmul_grouped");
    float *yg = fget(C, dyg, (size_t)Tg * rows);
    for (int g = 0; g < G && ok; g++) {
        ds_weight v = w->d;
        size_t rb = kind == DS_W_F32 ? 4 * (size_t)cols : kind == DS_W_FP8 ? (size_t)cols : kind == DS_W_FP4 ? (size_t)cols / 2 : 2 * (size_t)cols;
        v.data = w->d.data + (size_t)g * Rg * rb;
        v.rows = Rg;
        if (kind == DS_W_FP8) v.srow0 = g * Rg;
        if (kind == DS_W_FP4) v.scale = w->d.scale + (size_t)g * Rg * w->d.scale_cols * (w->d.scale_f32 ? 4 : 1);
        float *xs = malloc(sizeof(float) * Tg * cols);
        for (int t = 0; t < Tg; t++) memcpy(xs + (size_t)t * cols, xg + ((size_t)t * G + g) * cols, sizeof(float) * cols);
        float *dxs = dput(C, xs, sizeof(float) * Tg * cols), *dys = dput(C, NULL, sizeof(float) * Tg * Rg);
        die_if(C, ds_matmul(&C->be, &v, dxs, Tg, dys, &C->err), "matmul");
        float *ys = fget(C, dys, (size_t)Tg * Rg);
        for (int t = 0; t < Tg; t++)
            if (memcmp(ys + (size_t)t * Rg, yg + (size_t)t * rows + (size_t)g * Rg, sizeof(float) * Rg)) ok = 0;
        free(xs);
        free(ys);
        C->be.free(&C->be, dxs);
        C->be.free(&C->be, dys);
    }
    free(yg);
    C->be.free(&C->be, dxg);
    C->be.free(&C->be, dyg);
    return ok;
}

static void test_matmul(ctx *C, ds_wkind kind, int rows, int cols, int sf32) {
    tw w = make_weight(C, kind, rows, cols, sf32);
    int T = 70; /* BF16 / FP8 / FP4-E8M0: the tensor-core tile kernel (2 token tiles, one partial) */
    float *x = frandv(C, (size_t)T * cols, 1.0f);
    float *dx = dput(C, x, sizeof(float) * T * cols), *dy = dput(C, NULL, sizeof(float) * T * rows);
    die_if(C, ds_matmul(&C->be, &w.d, dx, T, dy, &C->err), "matmul");
    float *y = fget(C, dy, (size_t)T * rows);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < cols; k++) {
                double p = (double)w.deq[(size_t)r * cols + k] * x[(size_t)t * cols + k];
                ref += p;
                mag += fabs(p);
            }
            if (!close_dot(y[(size_t)t * rows + r], ref, mag, 2e-6 * sqrt(cols)) && bad++ < 3)
                printf("  matmul %s [%d,%d] t %d r %d: %g vs %g\n", kname[kind], rows, cols, t, r, y[(size_t)t * rows + r], ref);
        }
    check(C, !bad, "matmul %s%s [%d x %d] vs reference (%d bad)", kname[kind], sf32 ? "/f32 scales" : "", rows, cols, bad);
    /* invariance: token j of the 70-batch at row p of batches of 1 to 20 (on the
     * tensor-core path: T = 1..32 run the decode kernel, 70 the tile kernel; the bits
     * must not change: T = 1 = T = large, bitwise) */
    /* 1, 2, 7, 8: the decode kernels (8: two m16 tiles a warp for BF16 of many
     * rows); 12 and 20 tokens (3 and 5 pairs per expert): the tile kernel's x8
     * and x16 shapes (heuristics.h); T = 160 (40): the 64 x 64 shape */
    int sizes[6] = {1, 2, 7, 8, 12, 20};
    for (int si = 0; si < 6; si++) {
        int n = sizes[si], same = 1;
        for (int trial = 0; trial < 3; trial++) {
            int j = (int)(rnd(C) % T), p = (int)(rnd(C) % n);
            float *xb = frandv(C, (size_t)n * cols, 1.0f);
            memcpy(xb + (size_t)p * cols, x + (size_t)j * cols, sizeof(float) * cols);
            float *dxb = dput(C, xb, sizeof(float) * n * cols), *dyb = dput(C, NULL, sizeof(float) * n * rows);
            die_if(C, ds_matmul(&C->be, &w.d, dxb, n, dyb, &C->err), "matmul");
            float *yb = fget(C, dyb, (size_t)n * rows);
            if (memcmp(yb + (size_t)p * rows, y + (size_t)j * rows, sizeof(float) * rows)) same = 0;
            free(xb);
            free(yb);
            C->be.free(&C->be, dxb);
            C->be.free(&C->be, dyb);
        }
        check(C, same, "matmul %s%s [%d x %d]: a token's bits in the batch of %d = in a batch of %d", kname[kind],
              sf32 ? "/f32 scales" : "", rows, cols, T, n);
    }
    /* grouped: G groups of rows; each output equals the matmul of its row block */
    if (rows % 4 == 0) {
        int G = 4, Tg = 7;
        float *xg = frandv(C, (size_t)Tg * G * cols, 1.0f);
        int ok = grouped_own_bits(C, &w, G, Tg, xg);
        check(C, ok, "matmul_grouped %s [%d x %d]: each group has the bits of its own matmul", kname[kind], rows, cols);
        free(xg);
    }
    free(x);
    free(y);
    C->be.free(&C->be, dx);
    C->be.free(&C->be, dy);
    free_weight(C, &w);
}

/* FP8 products take each token's 128-column group scaled by a power of two
 * (its largest |x| to [2^14, 2^15)) and split in f16 (docs/cuda.md): groups
 * from 1e-25 to 1e25 (f16 alone ends at 65504 and loses what is below
 * 2^-24), tiny elements inside a group, an all-zero group, K not a multiple
 * of 128. Each output within 2e-6 sqrt(K) sum |w x| of the double product
 * (relative only: a token of tiny groups has a tiny bound); every token's
 * bits the same at T = 1, 8, 20 (the decode and streaming kernels) as at T
 * = 70 (the tile kernel); grouped at 40 tokens: each group's bits those of
 * its own matmul (the tile kernel's split segments). */
static void test_fp8_range(ctx *C, int rows, int cols) {
    tw w = make_weight(C, DS_W_FP8, rows, cols, 0);
    int T = 70, ng = (cols + 127) / 128;
    float *x = malloc(sizeof(float) * T * cols);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < cols; k++) {
            int g = k / 128, e = (t * 5 + g * 3) % 51 - 25;
            float v = frand(C) * (float)pow(10.0, e);
            if (k % 16 == 5) v *= 0x1p-30f;
            if (g == (t % ng)) v = 0.0f;
            x[(size_t)t * cols + k] = v;
        }
    float *dx = dput(C, x, sizeof(float) * T * cols), *dy = dput(C, NULL, sizeof(float) * T * rows);
    die_if(C, ds_matmul(&C->be, &w.d, dx, T, dy, &C->err), "matmul");
    float *y = fget(C, dy, (size_t)T * rows);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < cols; k++) {
                double p = (double)w.deq[(size_t)r * cols + k] * x[(size_t)t * cols + k];
                ref += p;
                mag += fabs(p);
            }
            double got = y[(size_t)t * rows + r];
            if (!(fabs(got - ref) <= 2e-6 * sqrt(cols) * mag) && bad++ < 3)
                printf("  FP8 range [%d,%d] t %d r %d: %g vs %g (sum |w x| %g)\n", rows, cols, t, r, got, ref, mag);
        }
    check(C, !bad, "matmul FP8 [%d x %d], groups of 1e-25 .. 1e25: every output within 2e-6 sqrt(K) sum |w x| of "
                   "the double product (%d bad)", rows, cols, bad);
    int Ts[3] = {1, 8, 20}, same = 1;
    for (int ti = 0; ti < 3; ti++) {
        int n = Ts[ti];
        float *dyb = dput(C, NULL, sizeof(float) * n * rows);
        die_if(C, ds_matmul(&C->be, &w.d, dx, n, dyb, &C->err), "matmul");
        float *yb = fget(C, dyb, (size_t)n * rows);
        if (memcmp(yb, y, sizeof(float) * n * rows)) same = 0;
        free(yb);
        C->be.free(&C->be, dyb);
    }
    check(C, same, "matmul FP8 [%d x %d], groups of 1e-25 .. 1e25: the first 1, 8, 20 tokens alone = in the batch of 70",
          rows, cols);
    if (rows % 4 == 0) {
        int G = 4, Tg = 40; /* 40 tokens of [G][cols]: x's rows again and again */
        float *xg = malloc(sizeof(float) * Tg * G * cols);
        for (int i = 0; i < Tg * G; i++) memcpy(xg + (size_t)i * cols, x + (size_t)(i % T) * cols, sizeof(float) * cols);
        int ok = grouped_own_bits(C, &w, G, Tg, xg);
        check(C, ok, "matmul_grouped FP8 [%d x %d], groups of 1e-25 .. 1e25: each group has the bits of its own matmul",
              rows, cols);
        free(xg);
    }
    free(x);
    free(y);
    C->be.free(&C->be, dx);
    C->be.free(&C->be, dy);
    free_weight(C, &w);
}

/* ---- rmsnorm / rope -------------------------------------------------------- */

/* rmsnorm's documented order on the host, in float: thread i of 256 chains
 * fmaf over x[i], x[i+256], ...; each warp's xor tree 16, 8, 4, 2, 1; warp
 * 0 the 8 warp totals (24 zeros) by the same tree; out = w * (x * (1 /
 * sqrtf(sum / n + eps))). The GPU's bits must be these (any row length). */
static float h_xor_tree(float *v) {
    for (int o = 16; o > 0; o >>= 1) {
        float nv[32];
        for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
        memcpy(v, nv, sizeof nv);
    }
    return v[0];
}
static void test_rmsnorm_bits(ctx *C, int n, int weighted) {
    int T = 3;
    float *x = frandv(C, (size_t)T * n, 3.0f), *w = frandv(C, n, 1.5f), *want = malloc(sizeof(float) * T * n);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float wt[32] = {0}, th[256];
        for (int i = 0; i < 256; i++) {
            float a = 0.0f;
            for (int j = i; j < n; j += 256) a = fmaf(xr[j], xr[j], a);
            th[i] = a;
        }
        for (int wi = 0; wi < 8; wi++) wt[wi] = h_xor_tree(th + 32 * wi);
        float ms = h_xor_tree(wt) / (float)n, r = 1.0f / sqrtf(ms + 1e-6f);
        for (int j = 0; j < n; j++) want[(size_t)t * n + j] = weighted ? w[j] * (xr[j] * r) : xr[j] * r;
    }
    float *dx = dput(C, x, sizeof(float) * T * n), *dw = dput(C, w, sizeof(float) * n);
    float *dy = dput(C, NULL, sizeof(float) * T * n);
    ds_rmsnorm_params rp = {dx, weighted ? dw : NULL, dy, T, n, 1e-6f, NULL, 0};
    die_if(C, C->be.rmsnorm(&C->be, &rp, 1, &C->err), "rmsnorm");
    float *y = fget(C, dy, (size_t)T * n);
    check(C, !memcmp(y, want, sizeof(float) * T * n), "rmsnorm n = %d%s: the documented order's bits (host emulation)", n,
          weighted ? ", weighted" : "");
    free(x);
    free(w);
    free(want);
    free(y);
    C->be.free(&C->be, dx);
    C->be.free(&C->be, dw);
    C->be.free(&C->be, dy);
}

static void test_norm_rope(ctx *C) {
    int T = 5, n = 700;
    float *x = frandv(C, (size_t)T * n, 2.0f), *w = frandv(C, n, 1.0f);
    float *dx = dput(C, x, sizeof(float) * T * n), *dw = dput(C, w, sizeof(float) * n);
    ds_rmsnorm_params rp = {dx, dw, dx, T, n, 1e-6f, NULL, 0};
    die_if(C, C->be.rmsnorm(&C->be, &rp, 1, &C->err), "rmsnorm");
    float *y = fget(C, dx, (size_t)T * n);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[t * n + i] * x[t * n + i];
        double r = 1.0 / sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; i++)
            if (fabs(y[t * n + i] - w[i] * x[t * n + i] * r) > 1e-5 * (1 + fabs(w[i] * x[t * n + i] * r))) bad++;
    }
    check(C, !bad, "rmsnorm in place, weighted (rel 1e-5; %d bad)", bad);
    free(y);

    /* rope on [T][H][d], norm on, at the step's positions */
    int H = 3, d = 96, half = 16;
    step s = {0};
    s.L = 1;
    step_add(&s, T, 1000, NULL);
    begin(C, &s);
    float *q = frandv(C, (size_t)T * H * d, 1.0f), *inv = malloc(sizeof(float) * half);
    for (int i = 0; i < half; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (2 * half));
    float *dq = dput(C, q, sizeof(float) * T * H * d), *dinv = dput(C, inv, sizeof(float) * half);
    ds_rope_params ro = {dq, T, H, d, half, dinv, 1, 0, 1e-6f};
    die_if(C, C->be.rope(&C->be, &ro, &C->err), "rope");
    float *o = fget(C, dq, (size_t)T * H * d);
    bad = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *xi = q + ((size_t)t * H + h) * d;
            double ss = 0, ref[1024];
            for (int i = 0; i < d; i++) ss += (double)xi[i] * xi[i];
            double r = 1.0 / sqrt(ss / d + 1e-6);
            for (int i = 0; i < d; i++) ref[i] = xi[i] * r;
            double *p = ref + d - 2 * half;
            for (int i = 0; i < half; i++) {
                float angf = inv[i] * (float)(1000 + t); /* the angle in fp32, as the op forms it */
                double ang = angf, a = p[2 * i], b = p[2 * i + 1];
                p[2 * i] = a * cos(ang) - b * sin(ang);
                p[2 * i + 1] = b * cos(ang) + a * sin(ang);
            }
            for (int i = 0; i < d; i++)
                if (fabs(o[((size_t)t * H + h) * d + i] - ref[i]) > 2e-5) bad++;
        }
    check(C, !bad, "rope with head norm at positions 1000.. (abs 2e-5 given the fp32 angle; %d bad)", bad);
    /* inverse undoes it */
    ds_rope_params ri = {dq, T, H, d, half, dinv, 0, 1, 1e-6f};
    die_if(C, C->be.rope(&C->be, &ri, &C->err), "rope");
    float *o2 = fget(C, dq, (size_t)T * H * d);
    bad = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *xi = q + ((size_t)t * H + h) * d;
            double ss = 0;
            for (int i = 0; i < d; i++) ss += (double)xi[i] * xi[i];
            double r = 1.0 / sqrt(ss / d + 1e-6);
            for (int i = 0; i < d; i++)
                if (fabs(o2[((size_t)t * H + h) * d + i] - xi[i] * r) > 1e-5) bad++;
        }
    check(C, !bad, "inverse rope undoes rope (abs 1e-5; %d bad)", bad);

    /* rmsnorms of several widths in one call, some with the rope (the kv
     * head's norm + rope): each output = its rmsnorm alone (then the rope op
     * on the row as one head), bitwise. Five jobs: two launches of at most
     * four; rows of 700 and 96 (the register kernel) beside one of 16,500
     * (the loop kernel, which then takes the launch's every job) */
    enum { NJ = 5 };
    int jn[NJ] = {700, 96, 16500, 96, 700}, jrope[NJ] = {0, 1, 1, 1, 0}, jT[NJ] = {T, T, 2, T, 3};
    float *jx[NJ], *dj[NJ], *dsep[NJ], *dwj;
    float *wj = frandv(C, 16500, 1.0f);
    dwj = dput(C, wj, sizeof(float) * 16500);
    ds_rmsnorm_params jobs[NJ];
    for (int j = 0; j < NJ; j++) {
        size_t nb = sizeof(float) * jT[j] * jn[j];
        jx[j] = frandv(C, (size_t)jT[j] * jn[j], 2.0f);
        float *dxj = dput(C, jx[j], nb);
        dj[j] = dput(C, NULL, nb);
        dsep[j] = dput(C, jx[j], nb);
        jobs[j] = (ds_rmsnorm_params){dxj, j == 3 ? NULL : dwj, dj[j], jT[j], jn[j], 1e-6f, jrope[j] ? dinv : NULL,
                                      jrope[j] ? half : 0};
        ds_rmsnorm_params one = {dsep[j], j == 3 ? NULL : dwj, dsep[j], jT[j], jn[j], 1e-6f, NULL, 0};
        die_if(C, C->be.rmsnorm(&C->be, &one, 1, &C->err), "rmsnorm");
        ds_rope_params rj = {dsep[j], jT[j], 1, jn[j], half, dinv, 0, 0, 1e-6f};
        if (jrope[j]) die_if(C, C->be.rope(&C->be, &rj, &C->err), "rope");
    }
    die_if(C, C->be.rmsnorm(&C->be, jobs, NJ, &C->err), "rmsnorm jobs");
    for (int j = 0; j < NJ; j++) {
        float *a = fget(C, dj[j], (size_t)jT[j] * jn[j]), *b = fget(C, dsep[j], (size_t)jT[j] * jn[j]);
        check(C, !memcmp(a, b, sizeof(float) * jT[j] * jn[j]),
              "rmsnorm job %d of %d (%d rows of %d%s) = its rmsnorm alone%s, bitwise", j, NJ, jT[j], jn[j],
              j == 3 ? ", unweighted" : "", jrope[j] ? " then rope" : "");
        free(a);
        free(b);
        free(jx[j]);
        C->be.free(&C->be, (void *)jobs[j].x);
        C->be.free(&C->be, dj[j]);
        C->be.free(&C->be, dsep[j]);
    }
    free(wj);
    C->be.free(&C->be, dwj);
    free(x);
    free(w);
    free(q);
    free(inv);
    free(o);
    free(o2);
    C->be.free(&C->be, dx);
    C->be.free(&C->be, dw);
    C->be.free(&C->be, dq);
    C->be.free(&C->be, dinv);
}

/* ---- mHC ------------------------------------------------------------------ */

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static void test_mhc(ctx *C, int n, int D, int T) {
    int rows = (2 + n) * n, iters = 20;
    tw fn = make_weight(C, DS_W_F32, rows, n * D, 0);
    tw fh = make_weight(C, DS_W_F32, n, n * D, 0);
    float *base = frandv(C, rows, 0.5f), sc[3] = {0.7f, 0.3f, 1.1f};
    float *X = frandv(C, (size_t)T * n * D, 1.0f);
    float *dX = dput(C, X, sizeof(float) * T * n * D), *dbase = dput(C, base, sizeof(float) * rows);
    float *dsc = dput(C, sc, sizeof sc);
    float *dxin = dput(C, NULL, sizeof(float) * T * D), *dpost = dput(C, NULL, sizeof(float) * T * n);
    float *dcomb = dput(C, NULL, sizeof(float) * T * n * n);
    ds_hc_params hc = {&fn.d, dbase, dsc, n, D, iters, 1e-6f, 1e-6f};
    ds_hc_pre_params pp = {hc, dX, T, dxin, dpost, dcomb};
    die_if(C, C->be.hc_pre(&C->be, &pp, &C->err), "hc_pre");
    float *xin = fget(C, dxin, (size_t)T * D), *post = fget(C, dpost, (size_t)T * n), *comb = fget(C, dcomb, (size_t)T * n * n);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        const float *Xt = X + (size_t)t * n * D;
        double ss = 0, m[64], pre[16], cm[16][16];
        for (int i = 0; i < n * D; i++) ss += (double)Xt[i] * Xt[i];
        double r = 1.0 / sqrt(ss / (n * D) + 1e-6);
        for (int q = 0; q < rows; q++) {
            m[q] = 0;
            for (int i = 0; i < n * D; i++) m[q] += (double)fn.deq[(size_t)q * n * D + i] * Xt[i] * r;
        }
        for (int i = 0; i < n; i++) {
            pre[i] = sigm(m[i] * sc[0] + base[i]) + 1e-6;
            if (fabs(post[t * n + i] - 2 * sigm(m[n + i] * sc[1] + base[n + i])) > 1e-5) bad++;
        }
        for (int i = 0; i < n; i++) {
            double mx = -1e300, sum = 0;
            for (int j = 0; j < n; j++) mx = fmax(mx, cm[i][j] = m[2 * n + i * n + j] * sc[2] + base[2 * n + i * n + j]);
            for (int j = 0; j < n; j++) sum += (cm[i][j] = exp(cm[i][j] - mx));
            for (int j = 0; j < n; j++) cm[i][j] = cm[i][j] / sum + 1e-6;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0)
                for (int i = 0; i < n; i++) {
                    double s = 0;
                    for (int j = 0; j < n; j++) s += cm[i][j];
                    for (int j = 0; j < n; j++) cm[i][j] /= s + 1e-6;
                }
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int i = 0; i < n; i++) s += cm[i][j];
                for (int i = 0; i < n; i++) cm[i][j] /= s + 1e-6;
            }
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                if (fabs(comb[(t * n + i) * n + j] - cm[i][j]) > 1e-4) bad++;
        for (int k = 0; k < D; k++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += pre[i] * Xt[i * D + k];
            if (fabs(xin[t * D + k] - s) > 1e-4 * (1 + fabs(s))) bad++;
        }
    }
    check(C, !bad, "hc_pre n %d, D %d: pre/post/Sinkhorn comb/x_in (abs 1e-4; %d bad)", n, D, bad);
    /* each token alone gives the bits it has in the batch of T */
    int same = 1;
    float *dx1 = dput(C, NULL, sizeof(float) * D), *dp1 = dput(C, NULL, sizeof(float) * n);
    float *dc1 = dput(C, NULL, sizeof(float) * n * n);
    for (int t = 0; t < T; t++) {
        ds_hc_pre_params p1 = {hc, dX + (size_t)t * n * D, 1, dx1, dp1, dc1};
        die_if(C, C->be.hc_pre(&C->be, &p1, &C->err), "hc_pre alone");
        float *x1 = fget(C, dx1, (size_t)D), *p1h = fget(C, dp1, (size_t)n), *c1 = fget(C, dc1, (size_t)n * n);
        if (memcmp(x1, xin + (size_t)t * D, sizeof(float) * D) || memcmp(p1h, post + (size_t)t * n, sizeof(float) * n) ||
            memcmp(c1, comb + (size_t)t * n * n, sizeof(float) * n * n))
            same = 0;
        free(x1);
        free(p1h);
        free(c1);
    }
    check(C, same, "hc_pre n %d, D %d: a token alone = in a batch of %d, bitwise", n, D, T);
    C->be.free(&C->be, dx1);
    C->be.free(&C->be, dp1);
    C->be.free(&C->be, dc1);

    /* post */
    float *y = frandv(C, (size_t)T * D, 1.0f), *dy = dput(C, y, sizeof(float) * T * D);
    float *dXo = dput(C, NULL, sizeof(float) * T * n * D);
    ds_hc_post_params po = {n, D, T, dX, dy, dpost, dcomb, dXo};
    die_if(C, C->be.hc_post(&C->be, &po, &C->err), "hc_post");
    float *Xo = fget(C, dXo, (size_t)T * n * D);
    bad = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < D; k++) {
                double s = (double)post[t * n + j] * y[t * D + k];
                for (int i = 0; i < n; i++) s += (double)comb[(t * n + i) * n + j] * X[((size_t)t * n + i) * D + k];
                if (fabs(Xo[((size_t)t * n + j) * D + k] - s) > 1e-5 * (1 + fabs(s))) bad++;
            }
    check(C, !bad, "hc_post (rel 1e-5; %d bad)", bad);

    /* head */
    ds_hc_params hh = {&fh.d, dbase, dsc, n, D, 0, 1e-6f, 1e-6f};
    float *dxh = dput(C, NULL, sizeof(float) * T * D);
    ds_hc_head_params hp = {hh, dX, T, dxh};
    die_if(C, C->be.hc_head(&C->be, &hp, &C->err), "hc_head");
    float *xh = fget(C, dxh, (size_t)T * D);
    bad = 0;
    for (int t = 0; t < T; t++) {
        const float *Xt = X + (size_t)t * n * D;
        double ss = 0, pre[16];
        for (int i = 0; i < n * D; i++) ss += (double)Xt[i] * Xt[i];
        double r = 1.0 / sqrt(ss / (n * D) + 1e-6);
        for (int q = 0; q < n; q++) {
            double m = 0;
            for (int i = 0; i < n * D; i++) m += (double)fh.deq[(size_t)q * n * D + i] * Xt[i] * r;
            pre[q] = sigm(m * sc[0] + base[q]) + 1e-6;
        }
        for (int k = 0; k < D; k++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += pre[i] * Xt[i * D + k];
            if (fabs(xh[t * D + k] - s) > 1e-4 * (1 + fabs(s))) bad++;
        }
    }
    check(C, !bad, "hc_head (abs 1e-4; %d bad)", bad);
    free(base);
    free(X);
    free(xin);
    free(post);
    free(comb);
    free(y);
    free(Xo);
    free(xh);
    void *ps[] = {dX, dbase, dsc, dxin, dpost, dcomb, dy, dXo, dxh};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) C->be.free(&C->be, ps[i]);
    free_weight(C, &fn);
    free_weight(C, &fh);
}

/* ---- attention + window store ---------------------------------------------- */

enum { AH = 4, AD = 128, AW = 16, AR = 4, ATOPK = 8, ANENT = 256 };

typedef struct {
    ds_layer_mem mem;           /* device pointers */
    float *ring, *ent;          /* host copies */
    int64_t pos0;
    int n;
    float *q, *kv;              /* host [n][H][d], [n][d] */
} aseq;

static void aseq_init(ctx *C, aseq *a, int64_t pos0, int n) {
    memset(a, 0, sizeof *a);
    a->pos0 = pos0;
    a->n = n;
    a->ring = frandv(C, (size_t)AW * AD, 1.0f);
    a->ent = frandv(C, (size_t)ANENT * AD, 1.0f);
    a->q = frandv(C, (size_t)n * AH * AD, 0.3f);
    a->kv = frandv(C, (size_t)n * AD, 1.0f);
    a->mem.ring = dput(C, a->ring, sizeof(float) * AW * AD);
    a->mem.comp.entries = dput(C, a->ent, sizeof(float) * ANENT * AD);
}

static void aseq_free(ctx *C, aseq *a) {
    C->be.free(&C->be, a->mem.ring);
    C->be.free(&C->be, a->mem.comp.entries);
    free(a->ring);
    free(a->ent);
    free(a->q);
    free(a->kv);
}

static int csa_sel(int64_t p, int *sel) {
    int nv = (int)((p + 1) / AR), ns = nv < ATOPK ? nv : ATOPK;
    for (int j = 0; j < ns; j++) sel[j] = (int)((int64_t)j * nv / ns);
    return ns;
}

/* Runs the sequences in order as one step; returns out rows [T][H][d].
 * orope: 0 none, 1 the op's output rope (out_inv_freq = dinv, half), 2 the
 * op, then the rope op (inverse) on its output. */
static float *attn_run_rope(ctx *C, aseq **ss, int ns, int csa, const float *dsink, int orope, const float *dinv,
                            int half) {
    step s = {0};
    s.L = 1;
    for (int i = 0; i < ns; i++) step_add(&s, ss[i]->n, ss[i]->pos0, &ss[i]->mem);
    begin(C, &s);
    int T = s.T;
    float *q = malloc(sizeof(float) * T * AH * AD), *kv = malloc(sizeof(float) * T * AD);
    int *sel = calloc((size_t)T * ATOPK, sizeof *sel), *nsel = calloc((size_t)T, sizeof *nsel);
    for (int i = 0; i < ns; i++) {
        int r0 = s.seq_row0[i];
        memcpy(q + (size_t)r0 * AH * AD, ss[i]->q, sizeof(float) * ss[i]->n * AH * AD);
        memcpy(kv + (size_t)r0 * AD, ss[i]->kv, sizeof(float) * ss[i]->n * AD);
    }
    for (int t = 0; t < T; t++) nsel[t] = csa_sel(s.tok_pos[t], sel + (size_t)t * ATOPK);
    float *dq = dput(C, q, sizeof(float) * T * AH * AD), *dkv = dput(C, kv, sizeof(float) * T * AD);
    int *dsel = dput(C, sel, sizeof(int) * T * ATOPK), *dnsel = dput(C, nsel, sizeof(int) * T);
    float *dout = dput(C, NULL, sizeof(float) * T * AH * AD);
    ds_attention_params ap = {0,     T,    AH,   AD,  AW, AR, dq, dkv, dsink, csa ? dsel : NULL, csa ? dnsel : NULL,
                              ATOPK, 1.0f / sqrtf((float)AD), dout, orope == 1 ? dinv : NULL, orope == 1 ? half : 0};
    die_if(C, C->be.attention(&C->be, &ap, &C->err), "attention");
    ds_rope_params ri = {dout, T, AH, AD, half, dinv, 0, 1, 1e-6f};
    if (orope == 2) die_if(C, C->be.rope(&C->be, &ri, &C->err), "rope");
    float *out = fget(C, dout, (size_t)T * AH * AD);
    void *ps[] = {dq, dkv, dsel, dnsel, dout};
    for (int i = 0; i < 5; i++) C->be.free(&C->be, ps[i]);
    free(q);
    free(kv);
    free(sel);
    free(nsel);
    return out;
}

static float *attn_run(ctx *C, aseq **ss, int ns, int csa, const float *dsink) {
    return attn_run_rope(C, ss, ns, csa, dsink, 0, NULL, 0);
}

static int attn_ref_check(const aseq *a, const float *out, const float *sink, int csa) {
    int bad = 0;
    for (int i = 0; i < a->n; i++) {
        int64_t p = a->pos0 + i, lo = p - AW + 1 < 0 ? 0 : p - AW + 1;
        const float *keys[256];
        int nk = 0, sel[ATOPK];
        for (int64_t pp = lo; pp <= p; pp++)
            keys[nk++] = pp >= a->pos0 ? a->kv + (size_t)(pp - a->pos0) * AD : a->ring + (size_t)(pp % AW) * AD;
        if (csa) {
            int n = csa_sel(p, sel);
            for (int j = 0; j < n; j++) keys[nk++] = a->ent + (size_t)sel[j] * AD;
        } else {
            for (int j = 0; j < (p + 1) / AR; j++) keys[nk++] = a->ent + (size_t)j * AD;
        }
        for (int h = 0; h < AH; h++) {
            const float *q = a->q + ((size_t)i * AH + h) * AD;
            double s[256], mx = sink[h], sum = 0, o[AD] = {0};
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int c = 0; c < AD; c++) d += (double)q[c] * keys[j][c];
                s[j] = d / sqrt((double)AD);
                mx = fmax(mx, s[j]);
            }
            sum = exp(sink[h] - mx);
            for (int j = 0; j < nk; j++) sum += (s[j] = exp(s[j] - mx));
            for (int j = 0; j < nk; j++)
                for (int c = 0; c < AD; c++) o[c] += s[j] / sum * keys[j][c];
            for (int c = 0; c < AD; c++)
                if (fabs(out[((size_t)i * AH + h) * AD + c] - o[c]) > 2e-5) bad++;
        }
    }
    return bad;
}

static void test_attention(ctx *C) {
    float sink[AH];
    for (int h = 0; h < AH; h++) sink[h] = frand(C);
    float *dsink = dput(C, sink, sizeof sink);
    for (int csa = 0; csa < 2; csa++) {
        const char *kind = csa ? "CSA" : "HCA";
        aseq A, A5, B[3];
        aseq_init(C, &A, 37, 1);   /* decode row */
        aseq_init(C, &A5, 600, 70); /* prefill rows past the window: up to 16 + 167 keys, 3 blocks of 64 */
        aseq_init(C, &B[0], 100, 63);
        aseq_init(C, &B[1], 5, 3);
        aseq_init(C, &B[2], 60, 3);
        aseq *one[1] = {&A};
        float *alone = attn_run(C, one, 1, csa, dsink);
        check(C, !attn_ref_check(&A, alone, sink, csa), "attention %s decode row vs reference (abs 2e-5)", kind);
        aseq *one5[1] = {&A5};
        float *alone5 = attn_run(C, one5, 1, csa, dsink);
        check(C, !attn_ref_check(&A5, alone5, sink, csa), "attention %s 70-row prefill vs reference (abs 2e-5)", kind);
        /* the output's inverse rope in the op = the rope op after it, bitwise
         * (half 16: the rotated span starts at a chunk; 15: inside one) */
        for (int half = 15; half <= 16; half++) {
            float inv[16];
            for (int i = 0; i < half; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (2 * half));
            float *dinv = dput(C, inv, sizeof(float) * half);
            for (int which = 0; which < 2; which++) {
                aseq **sq = which ? one5 : one;
                int nr = which ? 70 : 1;
                float *fz = attn_run_rope(C, sq, 1, csa, dsink, 1, dinv, half);
                float *sp = attn_run_rope(C, sq, 1, csa, dsink, 2, dinv, half);
                check(C, !memcmp(fz, sp, sizeof(float) * nr * AH * AD),
                      "attention %s %s, output rope (half %d) in the op = the rope op after it, bitwise", kind,
                      which ? "70-row prefill" : "decode row", half);
                free(fz);
                free(sp);
            }
            C->be.free(&C->be, dinv);
        }
        size_t rb = sizeof(float) * AH * AD;
        /* batch of 2: B[1] row 0 only is awkward; use B[2] with 1 row */
        B[2].n = 1;
        aseq *b2[2] = {&B[2], &A};
        float *o2 = attn_run(C, b2, 2, csa, dsink);
        check(C, !memcmp(o2 + 1 * AH * AD, alone, rb), "attention %s: row alone = row 1 of a batch of 2", kind);
        B[2].n = 3;
        aseq *b7[3] = {&B[1], &A, &B[2]};
        float *o7 = attn_run(C, b7, 3, csa, dsink);
        check(C, !memcmp(o7 + 3 * AH * AD, alone, rb), "attention %s: row alone = row 3 of a batch of 7", kind);
        aseq *b64[2] = {&B[0], &A};
        float *o64 = attn_run(C, b64, 2, csa, dsink);
        check(C, !memcmp(o64 + 63 * AH * AD, alone, rb), "attention %s: row alone = row 63 of a batch of 64", kind);
        aseq *b75[3] = {&B[1], &A5, &B[2]};
        float *o75 = attn_run(C, b75, 3, csa, dsink);
        check(C, !memcmp(o75 + 3 * AH * AD, alone5, rb * 70), "attention %s: 70-row prefill alone = inside a batch", kind);
        free(alone);
        free(alone5);
        free(o2);
        free(o7);
        free(o64);
        free(o75);
        aseq_free(C, &A);
        aseq_free(C, &A5);
        for (int i = 0; i < 3; i++) aseq_free(C, &B[i]);
    }
    /* window store: the last W rows of a sequence land at pos % W */
    aseq S;
    aseq_init(C, &S, 30, 20);
    step s = {0};
    s.L = 1;
    step_add(&s, S.n, S.pos0, &S.mem);
    begin(C, &s);
    float *dkv = dput(C, S.kv, sizeof(float) * S.n * AD);
    ds_window_store_params wp = {0, AW, AD, dkv};
    die_if(C, C->be.window_store(&C->be, &wp, &C->err), "window_store");
    float *ring = fget(C, S.mem.ring, (size_t)AW * AD);
    int ok = 1;
    for (int i = S.n - AW; i < S.n; i++)
        if (memcmp(ring + (size_t)((S.pos0 + i) % AW) * AD, S.kv + (size_t)i * AD, sizeof(float) * AD)) ok = 0;
    check(C, ok, "window_store keeps the last W rows at pos %% W");
    free(ring);
    C->be.free(&C->be, dkv);
    aseq_free(C, &S);
    C->be.free(&C->be, dsink);
}

/* ---- compressor ------------------------------------------------------------ */

typedef struct {
    int R, d, cd, overlap, half, N;
    float *kv, *gate, *ape, *norm, *inv; /* host: [N][cd], [N][cd], [R][cd], [d], [half] */
    float *dape, *dnorm, *dinv;
} cspec;

/* The CPU compressor (ds_comp_push), in double, for all N positions. */
static void comp_ref(const cspec *s, double *ent) {
    int R = s->R, d = s->d, cd = s->cd, off = s->overlap ? d : 0;
    for (int E = 0; E < s->N / R; E++) {
        int np = s->overlap && E > 0 ? R : 0;
        for (int c = 0; c < d; c++) {
            double g[512], v[512], mx = -1e300, sum = 0, acc = 0;
            for (int j = 0; j < np; j++) {
                int q = (E - 1) * R + j;
                g[j] = (double)(s->gate[(size_t)q * cd + c] + s->ape[(size_t)j * cd + c]);
                v[j] = s->kv[(size_t)q * cd + c];
            }
            for (int j = 0; j < R; j++) {
                int q = E * R + j;
                g[np + j] = (double)(s->gate[(size_t)q * cd + off + c] + s->ape[(size_t)j * cd + off + c]);
                v[np + j] = s->kv[(size_t)q * cd + off + c];
            }
            for (int j = 0; j < np + R; j++) mx = fmax(mx, g[j]);
            for (int j = 0; j < np + R; j++) sum += exp(g[j] - mx);
            for (int j = 0; j < np + R; j++) acc += v[j] * exp(g[j] - mx) / sum;
            ent[(size_t)E * d + c] = acc;
        }
        double *e = ent + (size_t)E * d, ss = 0;
        for (int c = 0; c < d; c++) ss += e[c] * e[c];
        double r = 1.0 / sqrt(ss / d + 1e-6);
        for (int c = 0; c < d; c++) e[c] = s->norm[c] * e[c] * r;
        double *p = e + d - 2 * s->half, pos = (double)(E * R);
        for (int i = 0; i < s->half; i++) {
            double ang = (double)s->inv[i] * pos, a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * cos(ang) - b * sin(ang);
            p[2 * i + 1] = b * cos(ang) + a * sin(ang);
        }
    }
}

static void cmem_init(ctx *C, const cspec *s, ds_comp_mem *m) {
    memset(m, 0, sizeof *m);
    m->entries = dput(C, NULL, sizeof(float) * (s->N / s->R + 1) * s->d);
    m->pend_kv = dput(C, NULL, sizeof(float) * s->R * s->cd);
    m->pend_gate = dput(C, NULL, sizeof(float) * s->R * s->cd);
    if (s->overlap) {
        m->prev_kv = dput(C, NULL, sizeof(float) * s->R * s->d);
        m->prev_gate = dput(C, NULL, sizeof(float) * s->R * s->d);
    }
}

static void cmem_free(ctx *C, ds_comp_mem *m) {
    void *ps[] = {m->entries, m->pend_kv, m->pend_gate, m->prev_kv, m->prev_gate};
    for (int i = 0; i < 5; i++) C->be.free(&C->be, ps[i]);
}

/* Feeds positions 0..N-1 in steps of chunk[i] rows (cycled); when other is
 * set, a second sequence (its own state, the same rows reversed in time is
 * not needed: the same spec) rides along first in every step. Returns the
 * entries of the first sequence. */
static float *comp_run(ctx *C, const cspec *s, const int *chunk, int nchunk, int which, int other) {
    ds_layer_mem lm[2];
    memset(lm, 0, sizeof lm);
    cmem_init(C, s, which ? &lm[0].icomp : &lm[0].comp);
    if (other) cmem_init(C, s, which ? &lm[1].icomp : &lm[1].comp);
    float *kvb = malloc(sizeof(float) * 2 * s->N * s->cd), *gb = malloc(sizeof(float) * 2 * s->N * s->cd);
    for (int p0 = 0, ci = 0; p0 < s->N; ci++) {
        int n = chunk[ci % nchunk];
        if (p0 + n > s->N) n = s->N - p0;
        step st = {0};
        st.L = 1;
        int oth_n = other ? (n + 2 < s->N - p0 ? n + 2 : s->N - p0) : 0; /* the other one runs ahead a bit */
        if (other) step_add(&st, oth_n, p0, &lm[1]);
        step_add(&st, n, p0, &lm[0]);
        /* other: positions p0.. of its own (it started at 0 too, but runs in different chunks) */
        int T = st.T;
        for (int t = 0; t < T; t++) {
            int64_t pos = st.tok_pos[t];
            memcpy(kvb + (size_t)t * s->cd, s->kv + (size_t)pos * s->cd, sizeof(float) * s->cd);
            memcpy(gb + (size_t)t * s->cd, s->gate + (size_t)pos * s->cd, sizeof(float) * s->cd);
        }
        begin(C, &st);
        float *dkv = dput(C, kvb, sizeof(float) * T * s->cd), *dg = dput(C, gb, sizeof(float) * T * s->cd);
        ds_compress_params cp = {0, which, s->R, s->d, s->overlap, s->dape, s->dnorm, dkv, dg, s->dinv, s->half, 1e-6f};
        die_if(C, C->be.compress(&C->be, &cp, &C->err), "compress");
        C->be.free(&C->be, dkv);
        C->be.free(&C->be, dg);
        p0 += n;
        if (other) { /* the other sequence must stay consistent: it restarts each step at p0 with fresh state */
            cmem_free(C, which ? &lm[1].icomp : &lm[1].comp);
            cmem_init(C, s, which ? &lm[1].icomp : &lm[1].comp);
        }
    }
    size_t ne = (size_t)(s->N / s->R) * s->d;
    float *ent = fget(C, (which ? lm[0].icomp : lm[0].comp).entries, ne ? ne : 1);
    cmem_free(C, which ? &lm[0].icomp : &lm[0].comp);
    if (other) cmem_free(C, which ? &lm[1].icomp : &lm[1].comp);
    free(kvb);
    free(gb);
    return ent;
}

static void test_compressor(ctx *C, int R, int d, int overlap, int which) {
    cspec s = {R, d, (overlap ? 2 : 1) * d, overlap, 8, 5 * R + 3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    s.kv = frandv(C, (size_t)s.N * s.cd, 1.0f);
    s.gate = frandv(C, (size_t)s.N * s.cd, 2.0f);
    s.ape = frandv(C, (size_t)R * s.cd, 0.5f);
    s.norm = frandv(C, d, 1.0f);
    s.inv = malloc(sizeof(float) * s.half);
    for (int i = 0; i < s.half; i++) s.inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (2 * s.half));
    s.dape = dput(C, s.ape, sizeof(float) * R * s.cd);
    s.dnorm = dput(C, s.norm, sizeof(float) * d);
    s.dinv = dput(C, s.inv, sizeof(float) * s.half);
    int whole[1] = {1 << 20}, ones[1] = {1}, mixed[4] = {5, 1, R + 1, 3};
    float *a = comp_run(C, &s, whole, 1, which, 0);
    float *b = comp_run(C, &s, ones, 1, which, 0);
    float *c = comp_run(C, &s, mixed, 4, which, 1);
    size_t ne = (size_t)(s.N / R) * d;
    double *ref = malloc(sizeof(double) * (ne ? ne : 1));
    comp_ref(&s, ref);
    int bad = 0;
    for (size_t i = 0; i < ne; i++)
        if (fabs(a[i] - ref[i]) > 1e-4) bad++;
    check(C, !bad, "compress R=%d d=%d overlap=%d: entries vs reference (abs 1e-4; %d bad)", R, d, overlap, bad);
    check(C, !memcmp(a, b, sizeof(float) * ne), "compress R=%d overlap=%d: whole prefill = token by token (bits)", R, overlap);
    check(C, !memcmp(a, c, sizeof(float) * ne), "compress R=%d overlap=%d: whole = chunks 5,1,%d,3 beside another sequence (bits)", R,
          overlap, R + 1);
    free(a);
    free(b);
    free(c);
    free(ref);
    free(s.kv);
    free(s.gate);
    free(s.ape);
    free(s.norm);
    free(s.inv);
    C->be.free(&C->be, s.dape);
    C->be.free(&C->be, s.dnorm);
    C->be.free(&C->be, s.dinv);
}

/* ---- indexer ---------------------------------------------------------------- */

enum { INH = 4, IDH = 64, IR = 4, ITOPK = 16, INENT = 128 };

/* Runs rows at positions pos[0..T) of one sequence each (own entries [INENT][IDH]
 * in ent[t]), returns sel [T][ITOPK] and nsel [T]. */
static void idx_run(ctx *C, int T, const int64_t *pos, float *const *ent_dev, const float *iq, const float *iw, int *sel,
                    int *nsel) {
    ds_layer_mem *lm = calloc((size_t)T, sizeof *lm);
    step s = {0};
    s.L = 1;
    for (int t = 0; t < T; t++) {
        lm[t].icomp.entries = ent_dev[t];
        step_add(&s, 1, pos[t], &lm[t]);
    }
    begin(C, &s);
    float *diq = dput(C, iq, sizeof(float) * T * INH * IDH), *diw = dput(C, iw, sizeof(float) * T * INH);
    int *dsel = dput(C, NULL, sizeof(int) * T * ITOPK), *dn = dput(C, NULL, sizeof(int) * T);
    ds_indexer_params ip = {0, IR, INH, IDH, ITOPK, diq, diw, 0.5f, dsel, dn};
    die_if(C, C->be.indexer(&C->be, &ip, &C->err), "indexer");
    dget(C, sel, dsel, sizeof(int) * T * ITOPK);
    dget(C, nsel, dn, sizeof(int) * T);
    C->be.free(&C->be, diq);
    C->be.free(&C->be, diw);
    C->be.free(&C->be, dsel);
    C->be.free(&C->be, dn);
    free(lm);
}

static void test_indexer(ctx *C) {
    int T = 64;
    float *ent = frandv(C, (size_t)INENT * IDH, 1.0f), *same = malloc(sizeof(float) * INENT * IDH);
    for (int w = 0; w < INENT; w++) memcpy(same + (size_t)w * IDH, ent, sizeof(float) * IDH);
    float *dent = dput(C, ent, sizeof(float) * INENT * IDH), *dsame = dput(C, same, sizeof(float) * INENT * IDH);
    float *iq = frandv(C, (size_t)T * INH * IDH, 1.0f), *iw = frandv(C, (size_t)T * INH, 1.0f);
    int64_t pos[64];
    float *ents[64];
    for (int t = 0; t < T; t++) {
        pos[t] = t < 4 ? 20 + t : 100 + (int64_t)(rnd(C) % 400); /* the first rows keep all (nv <= topk) */
        ents[t] = t % 9 == 8 ? dsame : dent;
    }
    int *sel = malloc(sizeof(int) * T * ITOPK), nsel[64];
    idx_run(C, T, pos, ents, iq, iw, sel, nsel);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        int nv = (int)((pos[t] + 1) / IR), *o = sel + (size_t)t * ITOPK;
        const float *E = t % 9 == 8 ? same : ent;
        if (nv <= ITOPK) {
            if (nsel[t] != nv) bad++;
            for (int j = 0; j < nv && j < nsel[t]; j++)
                if (o[j] != j) bad++;
            continue;
        }
        if (nsel[t] != ITOPK) {
            bad++;
            continue;
        }
        double sc[INENT];
        unsigned char in[INENT] = {0};
        for (int w = 0; w < nv; w++) {
            double s = 0;
            for (int h = 0; h < INH; h++) {
                double d = 0;
                for (int i = 0; i < IDH; i++) d += (double)iq[((size_t)t * INH + h) * IDH + i] * E[(size_t)w * IDH + i];
                s += (d > 0 ? d : 0) / sqrt((double)IDH) * (iw[t * INH + h] * 0.5);
            }
            sc[w] = isnan(s) ? -INFINITY : s;
        }
        for (int j = 0; j < ITOPK; j++) {
            if (o[j] < 0 || o[j] >= nv || (j && o[j] <= o[j - 1])) bad++;
            else in[o[j]] = 1;
        }
        double minin = INFINITY, maxout = -INFINITY;
        for (int w = 0; w < nv; w++) {
            if (in[w]) minin = fmin(minin, sc[w]);
            else maxout = fmax(maxout, sc[w]);
        }
        if (t % 9 == 8) { /* all scores equal: the lowest indices */
            for (int j = 0; j < ITOPK; j++)
                if (o[j] != j) bad++;
        } else if (minin < maxout - 1e-5) {
            bad++;
        }
    }
    check(C, !bad, "indexer: top-%d ascending, ties to the lower index (%d bad)", ITOPK, bad);
    /* invariance: row j alone and at row p of batches of 2 and 7 */
    int ok = 1;
    int sizes[3] = {1, 2, 7};
    for (int si = 0; si < 3; si++)
        for (int trial = 0; trial < 3; trial++) {
            int n = sizes[si], j = 4 + (int)(rnd(C) % (T - 4)), p = (int)(rnd(C) % n);
            int64_t pb[7];
            float *eb[7];
            float *qb = frandv(C, (size_t)n * INH * IDH, 1.0f), *wb = frandv(C, (size_t)n * INH, 1.0f);
            for (int i = 0; i < n; i++) {
                pb[i] = 100 + (int64_t)(rnd(C) % 400);
                eb[i] = dent;
            }
            pb[p] = pos[j];
            eb[p] = ents[j];
            memcpy(qb + (size_t)p * INH * IDH, iq + (size_t)j * INH * IDH, sizeof(float) * INH * IDH);
            memcpy(wb + (size_t)p * INH, iw + (size_t)j * INH, sizeof(float) * INH);
            int sb[7 * ITOPK], nb[7];
            idx_run(C, n, pb, eb, qb, wb, sb, nb);
            if (nb[p] != nsel[j] || memcmp(sb + p * ITOPK, sel + (size_t)j * ITOPK, sizeof(int) * nsel[j])) ok = 0;
            free(qb);
            free(wb);
        }
    check(C, ok, "indexer: a row's selection alone = in a batch of 64 = in batches of 2, 7");
    free(ent);
    free(same);
    free(iq);
    free(iw);
    free(sel);
    C->be.free(&C->be, dent);
    C->be.free(&C->be, dsame);
}

/* ---- route ------------------------------------------------------------------ */

static void test_route(ctx *C) {
    int T = 9, E = 64, k = 6, V = 50;
    float *lg = frandv(C, (size_t)T * E, 3.0f), *bias = frandv(C, E, 0.1f);
    int32_t *tid = malloc(sizeof(int32_t) * V * k);
    for (int i = 0; i < V * k; i++) tid[i] = (int32_t)(rnd(C) % E);
    float *dlg = dput(C, lg, sizeof(float) * T * E), *db = dput(C, bias, sizeof(float) * E);
    int32_t *dtid = dput(C, tid, sizeof(int32_t) * V * k), *didx = dput(C, NULL, sizeof(int32_t) * T * k);
    float *dw = dput(C, NULL, sizeof(float) * T * k);
    step s = {0};
    s.L = 1;
    step_add(&s, T, 3, NULL);
    begin(C, &s);
    const char *names[3] = {"softmax", "sigmoid", "sqrtsoftplus"};
    for (int hash = 0; hash < 2; hash++)
        for (int f = 0; f < 3; f++) {
            ds_route_params rp = {dlg, T, E, k, f, db, hash ? dtid : NULL, 1.5f, didx, dw};
            die_if(C, C->be.route(&C->be, &rp, &C->err), "route");
            int32_t idx[64 * 6];
            float w[64 * 6];
            dget(C, idx, didx, sizeof(int32_t) * T * k);
            dget(C, w, dw, sizeof(float) * T * k);
            int bad = 0;
            for (int t = 0; t < T; t++) {
                double sc[64], mx = -1e300, sum = 0;
                const float *l = lg + (size_t)t * E;
                for (int e = 0; e < E; e++) {
                    if (f == 0) mx = fmax(mx, l[e]);
                    sc[e] = f == 1 ? 1.0 / (1.0 + exp(-l[e])) : f == 2 ? sqrt(l[e] > 20 ? l[e] : log1p(exp(l[e]))) : 0;
                }
                if (f == 0) {
                    for (int e = 0; e < E; e++) sum += (sc[e] = exp(l[e] - mx));
                    for (int e = 0; e < E; e++) sc[e] /= sum;
                }
                int ref[6];
                if (hash) {
                    for (int j = 0; j < k; j++) ref[j] = tid[(size_t)s.tok_id[t] * k + j];
                } else {
                    unsigned char tk[64] = {0};
                    for (int j = 0; j < k; j++) {
                        int b = -1;
                        for (int e = 0; e < E; e++)
                            if (!tk[e] && (b < 0 || sc[e] + bias[e] > sc[b] + bias[b])) b = e;
                        tk[b] = 1;
                    }
                    for (int e = 0, j = 0; e < E; e++)
                        if (tk[e]) ref[j++] = e;
                }
                double ws = 0;
                for (int j = 0; j < k; j++) ws += sc[ref[j]];
                for (int j = 0; j < k; j++) {
                    if (idx[t * k + j] != ref[j]) bad++;
                    else if (fabs(w[t * k + j] - sc[ref[j]] / ws * 1.5) > 1e-5) bad++;
                }
            }
            check(C, !bad, "route %s%s: experts exact, weights abs 1e-5 (%d bad)", names[f], hash ? " (hash)" : "", bad);
        }
    free(lg);
    free(bias);
    free(tid);
    void *ps[] = {dlg, db, dtid, didx, dw};
    for (int i = 0; i < 5; i++) C->be.free(&C->be, ps[i]);
}

/* ---- MoE -------------------------------------------------------------------- */

enum { ME = 8, MK = 2, MDMAX = 2304, MIMAX = 256, MIS = 64 };

typedef struct {
    tw w1[ME], w2[ME], w3[ME], s1, s2, s3;
    ds_weight d1[ME], d2[ME], d3[ME];
} moe_w;

static double swiglu_d(double a, double b, double L) {
    double g = a < L ? a : L, u = b < -L ? -L : b > L ? L : b;
    return g / (1 + exp(-g)) * u;
}

static float *moe_run(ctx *C, moe_w *M, int MD, int T, const float *x, const int32_t *idx, const float *wts) {
    float *dx = dput(C, x, sizeof(float) * T * MD), *dout = dput(C, NULL, sizeof(float) * T * MD);
    int32_t *di = dput(C, idx, sizeof(int32_t) * T * MK);
    float *dw = dput(C, wts, sizeof(float) * T * MK);
    ds_moe_params mp = {dx, T, MD, ME, MK, di, dw, M->d1, M->d2, M->d3, &M->s1.d, &M->s2.d, &M->s3.d, 1.0f, dout};
    die_if(C, C->be.moe(&C->be, &mp, &C->err), "moe");
    float *out = fget(C, dout, (size_t)T * MD);
    C->be.free(&C->be, dx);
    C->be.free(&C->be, dout);
    C->be.free(&C->be, di);
    C->be.free(&C->be, dw);
    return out;
}

static void moe_routing(ctx *C, int T, int32_t *idx, float *wts) {
    for (int t = 0; t < T; t++) {
        int a = (int)(rnd(C) % ME), b = (int)(rnd(C) % (ME - 1));
        if (b >= a) b++;
        idx[t * MK] = a; /* not sorted: combine orders by expert id */
        idx[t * MK + 1] = b;
        wts[t * MK] = 0.2f + 0.5f * (frand(C) + 1.0f);
        wts[t * MK + 1] = 0.2f + 0.5f * (frand(C) + 1.0f);
    }
}

/* Expert parallelism over R simulated ranks (docs/ep.md): each rank runs
 * moe_experts on the pairs it owns (owner = a random rank per pair), the
 * rows are merged from their owners as the exchange does, and moe_combine
 * sums them: the output must be the fused moe's, bit for bit. */
static float *moe_ep_run(ctx *C, moe_w *M, int MD, int T, const float *x, const int32_t *idx, const float *wts,
                         int R, int by_expert) {
    size_t P = (size_t)T * MK, rowb = sizeof(float) * MD;
    float *dx = dput(C, x, sizeof(float) * T * MD), *dout = dput(C, NULL, sizeof(float) * T * MD);
    int32_t *di = dput(C, idx, sizeof(int32_t) * P);
    float *dw = dput(C, wts, sizeof(float) * P);
    float *dslot = dput(C, NULL, rowb * P), *dsh = dput(C, NULL, rowb * T);
    float *slot = malloc(rowb * P), *mine = malloc(rowb * P), *sh = NULL;
    unsigned char *owner = malloc(P), *sel = malloc(P);
    /* by_expert: expert e on rank e % R, as a placement does; the experts a
     * rank does not hold keep a host pointer (odd: no kernel may read it, nor
     * may its alignment choose a path) */
    static unsigned char host_junk[64];
    for (size_t i = 0; i < P; i++) owner[i] = (unsigned char)(by_expert ? idx[i] % R : (int)(rnd(C) % (uint32_t)R));
    for (int r = 0; r < R; r++) {
        for (size_t i = 0; i < P; i++) sel[i] = owner[i] == r;
        ds_weight d1[ME], d2[ME], d3[ME];
        memcpy(d1, M->d1, sizeof d1), memcpy(d2, M->d2, sizeof d2), memcpy(d3, M->d3, sizeof d3);
        for (int e = 0; by_expert && e < ME; e++)
            if (e % R != r) d1[e].data = d2[e].data = d3[e].data = host_junk + 1;
        ds_moe_experts_params xp = {dx, T,  MD, ME, MK, di, sel, d1, d2, d3, &M->s1.d, &M->s2.d, &M->s3.d, 1.0f,
                                    dslot, dsh};
        die_if(C, C->be.moe_experts(&C->be, &xp, &C->err), "moe_experts");
        dget(C, mine, dslot, rowb * P);
        for (size_t i = 0; i < P; i++)
            if (owner[i] == r) memcpy(slot + i * MD, mine + i * MD, rowb);
        if (r == 0) sh = fget(C, dsh, (size_t)T * MD);
    }
    die_if(C, C->be.upload(&C->be, dslot, slot, rowb * P, &C->err), "upload");
    die_if(C, C->be.upload(&C->be, dsh, sh, rowb * T, &C->err), "upload");
    ds_moe_combine_params cp = {T, MD, MK, di, dw, dslot, dsh, dout};
    die_if(C, C->be.moe_combine(&C->be, &cp, &C->err), "moe_combine");
    float *out = fget(C, dout, (size_t)T * MD);
    void *ps[] = {dx, dout, di, dw, dslot, dsh};
    for (int i = 0; i < 6; i++) C->be.free(&C->be, ps[i]);
    free(slot), free(mine), free(sh), free(owner), free(sel);
    return out;
}

/* ---- MXFP4: the GPU's bits = the CPU's (docs/numerics.md) ---------------------- */

/* equal bits, or both NaN (payloads are not part of the definition) */
static int same_bits(const float *a, const float *b, size_t n, size_t *first) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i]))) {
            if (first) *first = i;
            return 0;
        }
    return 1;
}

/* x with every kind of 32-column group: ordinary, huge (near FLT_MAX), tiny,
 * subnormal, zero, on the quantization grid's ties, mixed magnitudes; with
 * bad != 0 one group of the last token holds an infinity or a NaN. */
static void fp4_fill_x(ctx *C, float *x, int T, int K, int bad) {
    for (int t = 0; t < T; t++)
        for (int g = 0; g < K / 32; g++) {
            int kind = (int)(rnd(C) % 8);
            for (int j = 0; j < 32; j++) {
                float v = frand(C);
                switch (kind) {
                case 1: v *= 3.0e38f; break;
                case 2: v *= 1.0e-30f; break;
                case 3: v *= 1.0e-42f; break;
                case 4: v = 0.0f; break;
                case 5: v = (float)((int)(rnd(C) % 511) - 255) * 0.5f; break;
                case 6: v *= (rnd(C) & 1) ? 1.0e6f : 1.0e-6f; break;
                default: break;
                }
                x[(size_t)t * K + 32 * g + j] = v;
            }
        }
    if (bad && T > 1) x[(size_t)(T - 1) * K + (size_t)(rnd(C) % (uint32_t)K)] = bad > 0 ? INFINITY : NAN;
}

static void test_fp4_cpu_bits(ctx *C, ds_backend *cpu) {
    /* shapes: rows ragged (not a multiple of 16), K with a partial last span,
     * whole spans, the experts' 2048 and 4096 */
    int shapes[5][2] = {{16, 32}, {100, 544}, {48, 1024}, {37, 2048}, {64, 4096}};
    int tn[5] = {1, 3, 8, 9, 70};
    for (int s = 0; s < 5; s++)
        for (int ext = 0; ext < 2; ext++) {
            int R = shapes[s][0], K = shapes[s][1];
            tw w = make_weight(C, DS_W_FP4, R, K, 0);
            if (ext) { /* extreme scales: re-map the scales */
                size_t ns = (size_t)R * w.h.scale_cols;
                for (int i = 0; i < 8; i++) w.hs[rnd(C) % ns] = (uint8_t)(i & 1 ? 0 : 254);
                w.hs[rnd(C) % ns] = 255;
                C->be.unmap_weights(&C->be, w.d.scale);
                const void *ds = NULL;
                die_if(C, C->be.map_weights(&C->be, w.hs, ns, DS_MAP_BYTES, &ds, &C->err), "map_weights");
                w.d.scale = ds;
            }
            for (int ti = 0; ti < 5; ti++) {
                int T = tn[ti];
                float *x = malloc(sizeof(float) * (size_t)T * K), *yc = malloc(sizeof(float) * (size_t)T * R);
                fp4_fill_x(C, x, T, K, ti == 4 ? (ext ? 1 : -1) : 0);
                die_if(C, ds_matmul(cpu, &w.h, x, T, yc, &C->err), "cpu matmul");
                float *dx = dput(C, x, sizeof(float) * (size_t)T * K), *dy = dput(C, NULL, sizeof(float) * (size_t)T * R);
                die_if(C, ds_matmul(&C->be, &w.d, dx, T, dy, &C->err), "matmul");
                float *yg = fget(C, dy, (size_t)T * R);
                size_t at = 0;
                int ok = same_bits(yc, yg, (size_t)T * R, &at);
                check(C, ok, "MXFP4 %d x %d, T = %d%s: GPU = CPU bitwise%s", R, K, T, ext ? ", extreme scales" : "",
                      ok ? "" : " (first difference below)");
                if (!ok)
                    printf("    y[%zu]: cpu %a gpu %a\n", at, (double)yc[at], (double)yg[at]);
                C->be.free(&C->be, dx), C->be.free(&C->be, dy);
                free(x), free(yc), free(yg);
            }
            free_weight(C, &w);
        }
}

/* The routed experts (moe_experts without a shared expert, and the whole moe
 * op) on the CPU and the GPU from the same inputs: the same bits. */
static void test_moe_cpu_bits(ctx *C, ds_backend *cpu, int MD, int MI) {
    moe_w *M = calloc(1, sizeof *M);
    ds_weight h1[ME], h2[ME], h3[ME];
    for (int e = 0; e < ME; e++) {
        M->w1[e] = make_weight(C, DS_W_FP4, MI, MD, 0);
        M->w3[e] = make_weight(C, DS_W_FP4, MI, MD, 0);
        M->w2[e] = make_weight(C, DS_W_FP4, MD, MI, 0);
        M->d1[e] = M->w1[e].d, M->d2[e] = M->w2[e].d, M->d3[e] = M->w3[e].d;
        h1[e] = M->w1[e].h, h2[e] = M->w2[e].h, h3[e] = M->w3[e].h;
    }
    int tn[4] = {1, 5, 40, 160};
    for (int ti = 0; ti < (MD > 1024 ? 3 : 4); ti++) {
        int T = tn[ti];
        size_t P = (size_t)T * MK;
        float *x = malloc(sizeof(float) * (size_t)T * MD), *wts = malloc(sizeof(float) * P);
        int32_t *idx = malloc(sizeof(int32_t) * P);
        unsigned char *sel = malloc(P);
        memset(sel, 1, P);
        fp4_fill_x(C, x, T, MD, 0);
        for (size_t i = 0; i < (size_t)T * MD; i++) x[i] = fabsf(x[i]) > 1e6f ? 0.5f : x[i]; /* no inf products */
        moe_routing(C, T, idx, wts);
        float *sc = malloc(sizeof(float) * P * MD), *shc = malloc(sizeof(float) * (size_t)T * MD);
        float *yc = malloc(sizeof(float) * (size_t)T * MD);
        ds_moe_experts_params xc = {x, T, MD, ME, MK, idx, sel, h1, h2, h3, NULL, NULL, NULL, 1.0f, sc, shc};
        die_if(C, cpu->moe_experts(cpu, &xc, &C->err), "cpu moe_experts");
        ds_moe_params mc = {x, T, MD, ME, MK, idx, wts, h1, h2, h3, NULL, NULL, NULL, 1.0f, yc};
        die_if(C, cpu->moe(cpu, &mc, &C->err), "cpu moe");
        float *dx = dput(C, x, sizeof(float) * (size_t)T * MD), *dw = dput(C, wts, sizeof(float) * P);
        int32_t *di = dput(C, idx, sizeof(int32_t) * P);
        unsigned char *dsel = dput(C, sel, P);
        float *dslot = dput(C, NULL, sizeof(float) * P * MD), *dsh = dput(C, NULL, sizeof(float) * (size_t)T * MD);
        float *dy = dput(C, NULL, sizeof(float) * (size_t)T * MD);
        ds_moe_experts_params xg = {dx, T, MD, ME, MK, di, dsel, M->d1, M->d2, M->d3, NULL, NULL, NULL, 1.0f, dslot, dsh};
        die_if(C, C->be.moe_experts(&C->be, &xg, &C->err), "moe_experts");
        ds_moe_params mg = {dx, T, MD, ME, MK, di, dw, M->d1, M->d2, M->d3, NULL, NULL, NULL, 1.0f, dy};
        die_if(C, C->be.moe(&C->be, &mg, &C->err), "moe");
        float *sg = fget(C, dslot, P * MD), *yg = fget(C, dy, (size_t)T * MD);
        size_t at = 0;
        int ok = same_bits(sc, sg, P * MD, &at);
        check(C, ok, "MXFP4 experts D=%d I=%d T=%d: every pair's output, GPU = CPU bitwise", MD, MI, T);
        if (!ok) printf("    slot_out[%zu]: cpu %a gpu %a\n", at, (double)sc[at], (double)sg[at]);
        ok = same_bits(yc, yg, (size_t)T * MD, &at);
        check(C, ok, "MXFP4 moe (no shared expert) D=%d I=%d T=%d: GPU = CPU bitwise", MD, MI, T);
        if (!ok) printf("    out[%zu]: cpu %a gpu %a\n", at, (double)yc[at], (double)yg[at]);
        void *ps[] = {dx, dw, di, dsel, dslot, dsh, dy};
        for (int i = 0; i < 7; i++) C->be.free(&C->be, ps[i]);
        free(x), free(wts), free(idx), free(sel), free(sc), free(shc), free(yc), free(sg), free(yg);
    }
    for (int e = 0; e < ME; e++) free_weight(C, &M->w1[e]), free_weight(C, &M->w2[e]), free_weight(C, &M->w3[e]);
    free(M);
}

static void test_moe(ctx *C, int MD, int MI, ds_wkind kind) {
    moe_w *M = calloc(1, sizeof *M);
    for (int e = 0; e < ME; e++) {
        M->w1[e] = make_weight(C, kind, MI, MD, 0);
        M->w3[e] = make_weight(C, kind, MI, MD, 0);
        M->w2[e] = make_weight(C, kind, MD, MI, 0);
        M->d1[e] = M->w1[e].d;
        M->d2[e] = M->w2[e].d;
        M->d3[e] = M->w3[e].d;
    }
    M->s1 = make_weight(C, DS_W_BF16, MIS, MD, 0);
    M->s3 = make_weight(C, DS_W_BF16, MIS, MD, 0);
    M->s2 = make_weight(C, DS_W_BF16, MD, MIS, 0);
    int T = 160; /* 40 pairs per expert: the tensor-core tile kernel; batches of 1..20 the decode kernel */
    float *x = frandv(C, (size_t)T * MD, 0.5f), wts[160 * MK];
    int32_t idx[160 * MK];
    moe_routing(C, T, idx, wts);
    float *out = moe_run(C, M, MD, T, x, idx, wts);
    /* Tolerance: 1e-4 (1 + |y|), plus, for the routed experts on the quantized paths
     * (D % 32 == 0), a bound of their activations' rounding: FP8's f16 hi + lo keeps ~22
     * bits of x, MXFP4's integer digits x to 2^-23 of its group's largest; 2^-17 sum |w x|
     * per product bounds both (doubled from 2^-18 for the fp32 accumulation), carried
     * through SwiGLU (|d/da| <= 1.1 |u|, |d/db| <= |g s(g)|) into the down products (eb
     * below; 0 on the SIMT path's D = 200, rows not 16-byte chunks). The BF16 shared
     * expert's split (hi + mid + lo) keeps all of x: no term beyond 1e-4 (1 + |y|). */
    const double EPS = MD % 32 == 0 ? 7.62939453125e-06 : 0.0; /* 2^-17 */
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * MD;
        double y[MDMAX] = {0}, eb[MDMAX] = {0}, h[MIMAX], dh[MIMAX];
        int ord[MK] = {0, 1};
        if (idx[t * MK] > idx[t * MK + 1]) ord[0] = 1, ord[1] = 0;
        for (int jj = 0; jj < MK; jj++) {
            int j = ord[jj], e = idx[t * MK + j];
            for (int r = 0; r < MI; r++) {
                double a = 0, b = 0, ma = 0, mb = 0;
                for (int c = 0; c < MD; c++) {
                    a += (double)M->w1[e].deq[r * MD + c] * xt[c];
                    b += (double)M->w3[e].deq[r * MD + c] * xt[c];
                    ma += fabs((double)M->w1[e].deq[r * MD + c] * xt[c]);
                    mb += fabs((double)M->w3[e].deq[r * MD + c] * xt[c]);
                }
                h[r] = swiglu_d(a, b, 1.0);
                double g = a < 1 ? a : 1, u = b < -1 ? -1 : b > 1 ? 1 : b;
                dh[r] = EPS * (1.1 * fabs(u) * ma + fabs(g / (1 + exp(-g))) * mb);
            }
            for (int r = 0; r < MD; r++) {
                double s = 0, es = 0;
                for (int c = 0; c < MI; c++) {
                    s += M->w2[e].deq[r * MI + c] * h[c];
                    es += fabs(M->w2[e].deq[r * MI + c]) * (dh[c] + EPS * fabs(h[c]));
                }
                y[r] += wts[t * MK + j] * s;
                eb[r] += wts[t * MK + j] * es;
            }
        }
        double hs[MIS];
        for (int r = 0; r < MIS; r++) {
            double a = 0, b = 0;
            for (int c = 0; c < MD; c++) {
                a += (double)M->s1.deq[r * MD + c] * xt[c];
                b += (double)M->s3.deq[r * MD + c] * xt[c];
            }
            hs[r] = swiglu_d(a, b, 1.0);
        }
        for (int r = 0; r < MD; r++) {
            double s = 0;
            for (int c = 0; c < MIS; c++) s += M->s2.deq[r * MIS + c] * hs[c];
            y[r] += s;
            double d = fabs(out[(size_t)t * MD + r] - y[r]);
            if (d > 1e-4 * (1 + fabs(y[r])) + eb[r]) bad++;
            if (d / (1e-4 * (1 + fabs(y[r])) + eb[r]) > worst) worst = d / (1e-4 * (1 + fabs(y[r])) + eb[r]);
        }
    }
    printf("  moe D=%d: worst |out - ref| / tolerance = %.3g\n", MD, worst);
    check(C, !bad, "moe %s experts (D=%d, I=%d) + BF16 shared vs reference (rel 1e-4 + the split's bound; %d bad)",
          kname[kind], MD, MI, bad);
    /* 1, 2, 7, 8: the decode kernels; 12 and 20 tokens (3 and 5 pairs per expert):
     * the tile kernel's x8 and x16 shapes (heuristics.h); T = 160 (40): the 64 x 64 shape */
    int sizes[6] = {1, 2, 7, 8, 12, 20};
    for (int si = 0; si < 6; si++) {
        int n = sizes[si], ok = 1;
        for (int trial = 0; trial < 3; trial++) {
            int j = (int)(rnd(C) % T), p = (int)(rnd(C) % n);
            float *xb = frandv(C, (size_t)n * MD, 0.5f), wb[20 * MK];
            int32_t ib[20 * MK];
            moe_routing(C, n, ib, wb);
            memcpy(xb + (size_t)p * MD, x + (size_t)j * MD, sizeof(float) * MD);
            memcpy(ib + p * MK, idx + j * MK, sizeof(int32_t) * MK);
            memcpy(wb + p * MK, wts + j * MK, sizeof(float) * MK);
            float *ob = moe_run(C, M, MD, n, xb, ib, wb);
            if (memcmp(ob + (size_t)p * MD, out + (size_t)j * MD, sizeof(float) * MD)) ok = 0;
            free(xb);
            free(ob);
        }
        check(C, ok, "moe %s D=%d: a token's output in a batch of %d = in a batch of %d (bits)", kname[kind], MD, T, n);
    }
    {
        /* 8 tokens all routed to experts 3 and 5: at D = 2304 the streaming
         * kernel takes an expert's tokens in passes of 4 (heuristics.h
         * DSC_MMA_STRM_XSMEM); each token's output = its output alone */
        int n = 8, ok = 1;
        float *xb = frandv(C, (size_t)n * MD, 0.5f), wb[8 * MK];
        int32_t ib[8 * MK];
        for (int t = 0; t < n; t++) {
            ib[t * MK] = t & 1 ? 3 : 5, ib[t * MK + 1] = t & 1 ? 5 : 3;
            wb[t * MK] = 0.2f + 0.5f * (frand(C) + 1.0f), wb[t * MK + 1] = 0.2f + 0.5f * (frand(C) + 1.0f);
        }
        float *ob = moe_run(C, M, MD, n, xb, ib, wb);
        for (int t = 0; t < n; t++) {
            float *o1 = moe_run(C, M, MD, 1, xb + (size_t)t * MD, ib + t * MK, wb + t * MK);
            if (memcmp(o1, ob + (size_t)t * MD, sizeof(float) * MD)) ok = 0;
            free(o1);
        }
        check(C, ok, "moe %s D=%d: 8 tokens on the same 2 experts, each = alone (bits)", kname[kind], MD);
        free(xb);
        free(ob);
    }
    for (int R = 1; R <= 3; R++)
        for (int by_expert = 0; by_expert < 2; by_expert++) {
            int tn[2] = {1, T};
            for (int q = 0; q < 2; q++) {
                float *oe = moe_ep_run(C, M, MD, tn[q], x, idx, wts, R, by_expert);
                float *of = tn[q] == T ? NULL : moe_run(C, M, MD, tn[q], x, idx, wts);
                check(C, !memcmp(oe, of ? of : out, sizeof(float) * (size_t)tn[q] * MD),
                      "moe %s D=%d over %d simulated EP ranks (pairs owned %s), %d token(s) = the fused moe (bits)",
                      kname[kind], MD, R, by_expert ? "by expert, others' weights host pointers" : "at random", tn[q]);
                free(oe);
                free(of);
            }
        }
    free(x);
    free(out);
    for (int e = 0; e < ME; e++) {
        free_weight(C, &M->w1[e]);
        free_weight(C, &M->w2[e]);
        free_weight(C, &M->w3[e]);
    }
    free_weight(C, &M->s1);
    free_weight(C, &M->s2);
    free_weight(C, &M->s3);
    free(M);
}

/* ---- embed, gather ------------------------------------------------------------ */

static void test_embed_gather(ctx *C) {
    tw w = make_weight(C, DS_W_BF16, 50, 96, 0);
    step s = {0};
    s.L = 1;
    step_add(&s, 5, 10, NULL);
    begin(C, &s);
    float *dX = dput(C, NULL, sizeof(float) * 5 * 2 * 96);
    ds_embed_params ep = {&w.d, 2, dX};
    die_if(C, C->be.embed(&C->be, &ep, &C->err), "embed");
    float *X = fget(C, dX, 5 * 2 * 96);
    int ok = 1;
    for (int t = 0; t < 5; t++)
        for (int i = 0; i < 2; i++)
            if (memcmp(X + (t * 2 + i) * 96, w.deq + (size_t)s.tok_id[t] * 96, sizeof(float) * 96)) ok = 0;
    check(C, ok, "embed: every stream holds the token's row");
    float *src = frandv(C, 10 * 33, 1.0f), *dsrc = dput(C, src, sizeof(float) * 330), *ddst = dput(C, NULL, sizeof(float) * 99);
    int rows[3] = {3, 0, 9};
    ds_gather_params gp = {dsrc, rows, 3, 33, ddst};
    die_if(C, C->be.gather(&C->be, &gp, &C->err), "gather");
    float *dst = fget(C, ddst, 99);
    ok = 1;
    for (int j = 0; j < 3; j++)
        if (memcmp(dst + j * 33, src + rows[j] * 33, sizeof(float) * 33)) ok = 0;
    check(C, ok, "gather rows 3, 0, 9");
    free(X);
    free(src);
    free(dst);
    C->be.free(&C->be, dX);
    C->be.free(&C->be, dsrc);
    C->be.free(&C->be, ddst);
    free_weight(C, &w);
}

/* ---- --bench: decode bandwidth of the products (zero weights: the values do
 * not change the time) --------------------------------------------------------- */

#include <time.h>
static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(ctx *C) {
    struct { ds_wkind kind; int rows, cols; } cases[] = {
        {DS_W_BF16, 16384, 8192}, {DS_W_FP8, 32768, 8192}, {DS_W_FP8, 4096, 4096}, {DS_W_FP4, 32768, 16384}, {DS_W_FP4, 2048, 4096}};
    int Ts[4] = {1, 8, 64, 256};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ds_weight w = {.kind = cases[i].kind, .rows = cases[i].rows, .cols = cases[i].cols, .name = kname[cases[i].kind]};
        size_t n = (size_t)w.rows * w.cols, db = w.kind == DS_W_BF16 ? 2 * n : w.kind == DS_W_FP8 ? n : n / 2, ns = 0;
        if (w.kind == DS_W_FP8) ns = (size_t)(w.scale_cols = (w.cols + 127) / 128) * ((w.rows + 127) / 128);
        if (w.kind == DS_W_FP4) ns = (size_t)(w.scale_cols = (w.cols + 31) / 32) * w.rows;
        w.data = dput(C, NULL, db);
        w.scale = ns ? dput(C, NULL, ns) : NULL;
        float *x = dput(C, NULL, sizeof(float) * 256 * w.cols), *y = dput(C, NULL, sizeof(float) * 256 * w.rows), sink;
        for (int ti = 0; ti < 4; ti++) {
            int T = Ts[ti], reps = T <= 8 ? 50 : 10;
            die_if(C, ds_matmul(&C->be, &w, x, T, y, &C->err), "matmul");
            dget(C, &sink, y, 4);
            double t0 = wall();
            for (int r = 0; r < reps; r++) die_if(C, ds_matmul(&C->be, &w, x, T, y, &C->err), "matmul");
            dget(C, &sink, y, 4);
            double dt = (wall() - t0) / reps, bytes = (double)db + (double)ns;
            printf("bench matmul %-4s [%5d x %5d] T=%-3d %8.1f us  %7.1f GB/s  %8.2f TFLOP/s\n", kname[w.kind], w.rows, w.cols, T,
                   dt * 1e6, bytes / dt / 1e9, 2.0 * n * T / dt / 1e12);
        }
        C->be.free(&C->be, (void *)w.data);
        if (w.scale) C->be.free(&C->be, (void *)w.scale);
        C->be.free(&C->be, x);
        C->be.free(&C->be, y);
    }
}

int main(int argc, char **argv) {
    char desc[256];
    if (!ds_backend_cuda_available(desc, sizeof desc)) {
        printf("test_cuda_ops: skipped: %s\n", desc);
        return 77;
    }
    printf("test_cuda_ops on %s\n", desc);
    ctx *C = calloc(1, sizeof *C);
    C->rng = 0x9e3779b97f4a7c15ull;
    die_if(C, ds_backend_cuda_init(&C->be, 0, &C->err), "init");

    /* an error is a message, not a crash */
    void *huge = C->be.alloc(&C->be, (size_t)1 << 50, &C->err);
    check(C, !huge && strstr(C->err.msg, "alloc") != NULL, "alloc of 1 PiB fails with a message: %s", C->err.msg);

    test_weight_decode(C);
    test_onehot(C, DS_W_FP4, 64, 256);   /* 512 (row, 32-column) scales: every scale twice */
    test_onehot(C, DS_W_FP8, 256, 512);  /* every byte in every row block */
    test_bf16_exact(C, 256, 512);
    test_onehot(C, DS_W_FP4, 4096, 256); /* 256 tiles: the block decode kernel */
    test_fp8_range(C, 300, 1000);  /* the decode kernel, a ragged last group */
    test_fp8_range(C, 2048, 1024); /* 128 tiles: the streaming kernels */
    test_fp8_range(C, 4096, 512);  /* 256 tiles: the block kernel at T = 20 */
    int shapes[3][2] = {{300, 1000}, {256, 1024}, {17, 4096}};
    for (int k = 0; k < 5; k++)
        for (int s = 0; s < 3; s++) test_matmul(C, (ds_wkind)k, shapes[s][0], shapes[s][1], 0);
    test_matmul(C, DS_W_FP8, 300, 1000, 1);
    test_matmul(C, DS_W_FP8, 8200, 256, 0);  /* few tokens: 4 rows per warp, a ragged last warp */
    test_matmul(C, DS_W_BF16, 2050, 512, 0); /* 2 rows per warp */
    test_matmul(C, DS_W_FP4, 8196, 128, 1);
    test_matmul(C, DS_W_FP4, 300, 1000, 1);
    /* tensor cores: K not a multiple of 128 (a ragged last group), rows not a multiple of 16 / 64 */
    test_matmul(C, DS_W_FP8, 300, 1040, 0);
    test_matmul(C, DS_W_FP8, 100, 1040, 1);
    test_matmul(C, DS_W_FP4, 100, 1056, 0);
    test_matmul(C, DS_W_BF16, 77, 264, 0);
    /* FP8 with many tiles: the block decode kernel; BF16 with enough tiles to
     * fill the GPU: the split decode kernel with one unit per tile */
    test_matmul(C, DS_W_FP8, 33000, 256, 0);
    test_matmul(C, DS_W_BF16, 66000, 128, 0);
    /* BF16 of >= DSC_MMA_DEC_MI2_ROWS rows at 8 tokens: two m16 tiles a warp
     * (66000 x 128: one unit a tile; 65608 x 520: ragged rows (the last tile's
     * second m16 tile past them) and last group, 2,051 tiles of 32 rows: two
     * units a tile, partials added by the last) */
    test_matmul(C, DS_W_BF16, 65608, 520, 0);
    /* one token tile (T <= 8) with >= 128 tiles: the streaming kernel (activations
     * split in shared memory, units of groups in flight): FP8 21 groups (the last
     * one ragged), 2052 rows (ragged; grouped: 4 x 513); FP4 33 groups; FP4 9
     * groups, ragged rows: fewer than DSC_MMA_STR_FEW blocks, 16 warps of
     * one-group units */
    test_matmul(C, DS_W_FP8, 2052, 2608, 0);
    test_matmul(C, DS_W_FP4, 2064, 4160, 0);
    test_matmul(C, DS_W_FP4, 4100, 1056, 0);
    test_matmul(C, DS_W_FP8, 4232, 4096, 0); /* 265 tiles: 8 warps, units of 2 groups, two per warp */
    /* mma_strm_kernel (plain products): a block loops over several tiles with the
     * next ones' weights in flight: 1,025 tiles (the last ragged; grouped: 4 x 257),
     * 8 one-group items per tile; FP4 at 3 groups (warps 3..7 without items) */
    test_matmul(C, DS_W_FP8, 16400, 1024, 0);
    test_matmul(C, DS_W_FP4, 16388, 384, 0);
    /* NaN codes in the decode kernel (300 x 1000), the block-per-tile streaming
     * kernel (2052 x 2608) and the one looping over tiles (16400 x 1024) */
    test_fp8_nan(C, 300, 1000);
    test_fp8_nan(C, 2052, 2608);
    test_fp8_nan(C, 16400, 1024);
    test_norm_rope(C);
    {
        int ns[7] = {700, 1024, 4096, 5000, 16384, 16400, 40000};
        for (int i = 0; i < 7; i++) test_rmsnorm_bits(C, ns[i], i % 2 == 0);
    }
    test_mhc(C, 4, 256, 3);  /* one mix segment, the warp Sinkhorn */
    test_mhc(C, 4, 1000, 3); /* four segments, the last one short */
    test_mhc(C, 6, 200, 3);  /* n * n > 32: the one-thread Sinkhorn */
    test_mhc(C, 3, 300, 3);  /* the warp Sinkhorn for any n (n = 4 has its own) */
    /* many tokens: the mixes by row groups (hc_mix_rg_kernel), = each token alone */
    test_mhc(C, 4, 1000, 37);
    test_mhc(C, 6, 200, 40);
    test_embed_gather(C);
    test_attention(C);
    test_compressor(C, 4, 64, 1, 0);
    test_compressor(C, 16, 96, 0, 0);
    test_compressor(C, 4, 32, 1, 1);
    test_indexer(C);
    test_route(C);
    test_moe(C, 200, 96, DS_W_FP4);  /* D not a multiple of 32: the general path */
    test_moe(C, 256, 128, DS_W_FP4); /* regular: the gemv (1, 2 tokens) and tiled (7, 64) paths */
    test_moe(C, 2304, 256, DS_W_FP4); /* experts' up through the streaming kernel: 18 groups */
    test_moe(C, 256, 128, DS_W_FP8);  /* FP8 experts: the f16 split through the decode and tile kernels */
    {
        ds_backend cpu;
        die_if(C, ds_backend_cpu_init(&cpu, 8), "cpu backend");
        test_fp4_cpu_bits(C, &cpu);
        test_moe_cpu_bits(C, &cpu, 256, 128);
        test_moe_cpu_bits(C, &cpu, 4096, 2048); /* the V4-Flash experts' shape */
        cpu.close(&cpu);
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) bench(C);

    C->be.close(&C->be);
    printf("%d passed, %d failed\n", C->pass, C->fail);
    int rc = C->fail ? 1 : 0;
    free(C);
    return rc;
}
