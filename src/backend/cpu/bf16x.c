/* bf16x.c — BF16 matrices in 12 bits a weight, exactly (the CPU's packed
 * copy, ds_weight.packed; its row kernels are in matmul/rows_avx512.c and
 * matmul/rows_avx2.c).
 *
 * Decode at batch 1 reads every weight once a token, and the BF16 head alone
 * (vocab x dim, 1.06 GB in V4-Flash) is half of those bytes: the kernels run
 * at the speed of memory, so fewer bytes are a faster token. A bf16 value is
 * S | E (8 bits) | M (7 bits). Inside one row the exponents crowd below the
 * row's largest one, so the packed copy keeps, per weight:
 *   A     a byte: (E & 1) << 7 | M
 *   code  4 bits: S << 3 | ((E >> 1) - (P - 7)), P = the row's largest E >> 1
 * and a row's 16-entry table turns a code back into the float's top byte,
 * S << 7 | (E >> 1). Every weight whose exponent pair lies in [P - 7, P] (16
 * binades below the row's largest, zeros and subnormals included when the
 * row is that small) comes back bit for bit. The others ("escapes": an exact
 * zero or a tiny value in a row of large ones) keep code 0 and are listed
 * per row as (column, bf16 bits); a unit holding one is decoded, then
 * patched. The kernel then multiplies exactly the values the BF16 kernel
 * does, in the same order: the same bits (matmul/dispatch.c's dense order). A
 * matrix with more than one escape in ESC_MAX_DIV weights stays unpacked
 * (its products read data: the same bits, at BF16's speed).
 *
 * Layout: each row is cols / 64 units of 96 bytes — 64 bytes A, then 32
 * bytes of codes (byte i: position 2i low nibble, 2i + 1 high). Position b
 * of a unit holds column 16 ((b >> 2) & 3) + 4 (b >> 4) + (b & 3): the
 * order in which the AVX-512 decoder (byte unpacks in 128-bit lanes) emits
 * columns 0..63; the AVX2 decoder, two 256-bit halves of the same unpacks,
 * emits them in the same order. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu.h"

#define UNIT 64
#define UNIT_BYTES 96
#define ESC_MAX_DIV 64
#define HUGE_PAGE ((size_t)2 << 20) /* at most cols / 64 escapes a row, or no packing */

int ds_cpu_bf16x_column(int b) { return 16 * ((b >> 2) & 3) + 4 * (b >> 4) + (b & 3); }

static inline int top_pair(uint16_t h) { return (h >> 8) & 0x7F; } /* E >> 1 */

typedef struct {
    const ds_weight *w;
    ds_cpu_bf16x *x;
    uint64_t *count; /* [rows] escapes */
} pack_job;

/* Pass 1: row r's P and escape count. */
static void pack_scan(void *ctx, int r) {
    pack_job *j = ctx;
    int K = j->w->cols, P = 0, n = 0;
    const uint16_t *row = (const uint16_t *)(const void *)j->w->data + (size_t)r * (size_t)K;
    for (int c = 0; c < K; c++) {
        int p = top_pair(row[c]);
        P = p > P ? p : P;
    }
    for (int c = 0; c < K; c++) n += top_pair(row[c]) < P - 7;
    j->x->top[r] = (uint8_t)P;
    j->count[r] = (uint64_t)n;
}

/* Pass 2: row r's units, escape bits and escape list, columns in order. */
static void pack_fill(void *ctx, int r) {
    pack_job *j = ctx;
    ds_cpu_bf16x *x = j->x;
    int K = j->w->cols, U = K / UNIT, base = x->top[r] - 7;
    const uint16_t *row = (const uint16_t *)(const void *)j->w->data + (size_t)r * (size_t)K;
    uint8_t *units = x->units + (size_t)r * (size_t)U * UNIT_BYTES;
    uint64_t *esc = x->esc + (size_t)r * (size_t)x->nw;
    ds_cpu_bf16x_esc *e = x->ents + x->eoff[r];
    uint8_t pos[UNIT]; /* the position of each column in a unit */
    for (int b = 0; b < UNIT; b++) pos[ds_cpu_bf16x_column(b)] = (uint8_t)b;
    memset(esc, 0, sizeof *esc * (size_t)x->nw);
    for (int u = 0; u < U; u++) {
        uint8_t *q = units + (size_t)u * UNIT_BYTES;
        const uint16_t *h = row + (size_t)u * UNIT;
        memset(q + UNIT, 0, UNIT_BYTES - UNIT);
        for (int c = 0; c < UNIT; c++) {
            int b = pos[c], pr = top_pair(h[c]) - base;
            if (pr < 0) {
                q[b] = 0;
                esc[u / 64] |= 1ull << (u % 64);
                *e++ = (ds_cpu_bf16x_esc){(uint32_t)(UNIT * u + c), h[c], 0};
                continue;
            }
            q[b] = (uint8_t)(((h[c] >> 7) & 1) << 7 | (h[c] & 0x7F));
            q[UNIT + b / 2] |= (uint8_t)(((h[c] >> 15) << 3 | pr) << (4 * (b & 1)));
        }
    }
}

static void bf16x_free(ds_cpu_bf16x *x) {
    if (!x) return;
    free(x->units);
    free(x->top);
    free(x->esc);
    free(x->eoff);
    free(x->ents);
    free(x);
}

int ds_cpu_bf16x_pack(const ds_backend *be, ds_weight *w, ds_err *err) {
    if (w->kind != DS_W_BF16 || w->cols % UNIT || w->rows <= 0 || w->packed) return 0;
    size_t R = (size_t)w->rows, U = (size_t)w->cols / UNIT;
    ds_cpu_bf16x *x = calloc(1, sizeof *x);
    uint64_t *count = malloc(sizeof *count * R);
    if (x) {
        x->nw = (int)((U + 63) / 64);
        size_t ub = (R * U * UNIT_BYTES + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        /* on huge pages where the kernel has them (advisory): 4 KiB pages
         * cost this stream a quarter of its speed in TLB misses */
        if ((x->units = aligned_alloc(HUGE_PAGE, ub))) madvise(x->units, ub, MADV_HUGEPAGE);
        x->top = malloc(R);
        x->esc = malloc(sizeof *x->esc * R * (size_t)x->nw);
        x->eoff = malloc(sizeof *x->eoff * (R + 1));
    }
    if (!x || !count || !x->units || !x->top || !x->esc || !x->eoff) {
        free(count);
        bf16x_free(x);
        return ds_fail(err, "%s: out of memory for its packed copy (%.2f GB; DSV4_CPU_PACK=0 runs without it)",
                       w->name ? w->name : "a BF16 weight", (double)(R * U * UNIT_BYTES) / 1e9);
    }
    pack_job j = {w, x, count};
    ds_cpu_parallel_for(be, (int)R, pack_scan, &j);
    x->eoff[0] = 0;
    for (size_t r = 0; r < R; r++) x->eoff[r + 1] = x->eoff[r] + count[r];
    free(count);
    if (x->eoff[R] > R * (size_t)w->cols / ESC_MAX_DIV) { /* escapes would cost more than they save */
        bf16x_free(x);
        return 0;
    }
    x->ents = malloc(sizeof *x->ents * (size_t)(x->eoff[R] ? x->eoff[R] : 1));
    if (!x->ents) {
        bf16x_free(x);
        return ds_fail(err, "%s: out of memory for its packed copy's escapes", w->name ? w->name : "a BF16 weight");
    }
    ds_cpu_parallel_for(be, (int)R, pack_fill, &j);
    w->packed = x;
    w->packed_bytes = R * U * UNIT_BYTES + R + sizeof *x->esc * R * (size_t)x->nw + sizeof *x->eoff * (R + 1) +
                      sizeof *x->ents * x->eoff[R];
    return 0;
}

void ds_cpu_bf16x_release(const ds_backend *be, ds_weight *w) {
    (void)be;
    bf16x_free((ds_cpu_bf16x *)(uintptr_t)w->packed);
    w->packed = NULL;
    w->packed_bytes = 0;
}
