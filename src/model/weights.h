/* weights.h — a weight matrix as stored in the checkpoint, kept in its storage
 * format (no dequantized copy): the kernels dequantize on the fly.
 *
 *   DS_W_F32 / DS_W_BF16 / DS_W_F16  plain row-major [rows, cols]
 *   DS_W_FP8   F8_E4M3 [rows, cols] with a [ceil(rows/128), ceil(cols/128)]
 *              block scale (F8_E8M0 or F32): value = fp8 * scale[r/128][c/128]
 *   DS_W_FP4   MXFP4: I8 [rows, cols/2], two E2M1 codes per byte (element 2j
 *              in the low nibble), [rows, cols/32] F8_E8M0 (or F32) scales. */
#ifndef DS_WEIGHTS_H
#define DS_WEIGHTS_H

#include <stdint.h>

#include "common/err.h"
#include "format/safetensors.h"

typedef enum { DS_W_F32 = 0, DS_W_BF16, DS_W_F16, DS_W_FP8, DS_W_FP4 } ds_wkind;

#define DS_FP8_BLOCK 128
#define DS_FP4_GROUP 32

typedef struct ds_weight {
    ds_wkind kind;
    int rows, cols;
    const uint8_t *data;
    const uint8_t *scale;  /* FP8 / FP4 only */
    int scale_f32;         /* 1: scales are F32, 0: F8_E8M0 */
    int scale_cols;        /* row stride of the scale grid, in elements */
    int srow0;             /* FP8 views: global row of row 0 (scale lookups) */
    const char *name;      /* checkpoint tensor name (for messages) */
} ds_weight;

/* Allowed storage kinds, as a bit mask of (1 << ds_wkind). */
#define DS_ALLOW_DENSE ((1u << DS_W_F32) | (1u << DS_W_BF16) | (1u << DS_W_F16))
#define DS_ALLOW_ANY (DS_ALLOW_DENSE | (1u << DS_W_FP8) | (1u << DS_W_FP4))

/* Looks up "<prefix>.weight" (and "<prefix>.scale" for FP8/FP4), checks
 * dtype, shape [rows, cols] and the scale grid. Errors name the tensor. */
int ds_weight_get(const ds_checkpoint *ck, const char *prefix, int rows, int cols, unsigned allow, ds_weight *w,
                  ds_err *err);

/* Same for a dense tensor with an exact name (no ".weight" suffix added). */
int ds_weight_get_named(const ds_checkpoint *ck, const char *name, int rows, int cols, ds_weight *w, ds_err *err);

/* Bytes the weight occupies in memory (data + scales). */
uint64_t ds_weight_bytes(const ds_weight *w);

/* Loads a float vector/matrix (F32, BF16 or F16 tensor of exactly `n`
 * elements, with the given shape check) into a new malloc'd fp32 array. */
int ds_tensor_to_f32(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape, float **out,
                     ds_err *err);

/* Element decoders shared by the kernels and the loaders. */
float ds_bf16_to_f32(uint16_t h);
float ds_f16_to_f32(uint16_t h);
float ds_e8m0_to_f32(uint8_t e);
float ds_fp8_e4m3_to_f32(uint8_t b);
extern const float ds_e2m1_values[16];

/* Rows [r0, r0 + n) of w as a weight of its own (FP8 keeps its scales). */
ds_weight ds_weight_rows(const ds_weight *w, int r0, int n);

/* Dequantizes row r of w into out[cols] (exact values). For tests/tools. */
void ds_weight_row_f32(const ds_weight *w, int r, float *out);

#endif
