/* weight.h — a weight matrix as stored in the checkpoint, kept in its storage
 * format (no dequantized copy): the kernels dequantize on the fly.
 *
 *   DS_W_F32 / DS_W_BF16 / DS_W_F16  plain row-major [rows, cols]
 *   DS_W_FP8   F8_E4M3 [rows, cols] with a [ceil(rows/128), ceil(cols/128)]
 *              block scale (F8_E8M0 or F32): value = fp8 * scale[r/128][c/128]
 *   DS_W_FP4   MXFP4: I8 [rows, cols/2], two E2M1 codes per byte (element 2j
 *              in the low nibble), [rows, cols/32] F8_E8M0 (or F32) scales. */
#ifndef DS_TENSOR_WEIGHT_H
#define DS_TENSOR_WEIGHT_H

#include <stdint.h>

typedef enum { DS_W_F32 = 0, DS_W_BF16, DS_W_F16, DS_W_FP8, DS_W_FP4 } ds_wkind;

#define DS_FP8_BLOCK 128
#define DS_FP4_GROUP 32

typedef struct ds_weight {
    ds_wkind kind;
    int rows, cols;
    const uint8_t *data;   /* in the memory of the backend the weight was uploaded to */
    const uint8_t *scale;  /* FP8 / FP4 only */
    int scale_f32;         /* 1: scales are F32, 0: F8_E8M0 */
    int scale_cols;        /* row stride of the scale grid, in elements */
    int srow0;             /* FP8 views: global row of row 0 (scale lookups) */
    const char *name;      /* checkpoint tensor name (for messages) */
    /* A backend's second, exact copy of data in a layout of its own that its
     * kernels read instead (the CPU's 12-bit BF16: backend/cpu/bf16x.c), or
     * NULL; set by be->pack_weight, owned and freed by the backend. The same
     * values, so the same bits. packed_bytes: what that copy occupies (all
     * that a product of the weight then reads). */
    const void *packed;
    uint64_t packed_bytes;
    /* E8M0 scales: 1 when none is 0 or 255 (the two that do not decode as
     * e << 23), found by be->pack_weight; 0: not known. Kernels may then
     * decode scales without those cases (the same values). */
    int scale_plain;
} ds_weight;

/* Element decoders shared by the kernels and the loaders. */
float ds_bf16_to_f32(uint16_t h);
float ds_f16_to_f32(uint16_t h);
float ds_e8m0_to_f32(uint8_t e);
float ds_fp8_e4m3_to_f32(uint8_t b);
extern const float ds_e2m1_values[16];

/* Rows [r0, r0 + n) of w as a weight of its own (FP8 keeps its scales; the
 * view has no packed copy: its products read data). */
ds_weight ds_weight_rows(const ds_weight *w, int r0, int n);

/* Dequantizes row r of w into out[cols] (exact values). For tests/tools. */
void ds_weight_row_f32(const ds_weight *w, int r, float *out);

/* Bytes the weight occupies in memory (data + scales). */
uint64_t ds_weight_bytes(const ds_weight *w);
/* Of them, the scale grid's (FP8 / FP4; 0 for the other kinds). */
uint64_t ds_weight_scale_bytes(const ds_weight *w);
/* Bytes a product reads: the packed copy's where there is one, else
 * ds_weight_bytes (the decode floor and the profile count these). */
uint64_t ds_weight_read_bytes(const ds_weight *w);

#endif
