/* weights.h — checkpoint tensors as weights of a storage kind (tensor/weight.h):
 * looked up by name and checked for dtype, shape and scale grid. */
#ifndef DS_WEIGHTS_H
#define DS_WEIGHTS_H

#include <stdint.h>

#include "common/err.h"
#include "format/safetensors.h"
#include "tensor/weight.h"

/* Allowed storage kinds, as a bit mask of (1 << ds_wkind). */
#define DS_ALLOW_DENSE ((1u << DS_W_F32) | (1u << DS_W_BF16) | (1u << DS_W_F16))
#define DS_ALLOW_ANY (DS_ALLOW_DENSE | (1u << DS_W_FP8) | (1u << DS_W_FP4))

/* Looks up "<prefix>.weight" (and "<prefix>.scale" for FP8/FP4), checks
 * dtype, shape [rows, cols] and the scale grid. Errors name the tensor. */
int ds_weight_get(const ds_checkpoint *ck, const char *prefix, int rows, int cols, unsigned allow, ds_weight *w,
                  ds_err *err);

/* Same for a dense tensor with an exact name (no ".weight" suffix added). */
int ds_weight_get_named(const ds_checkpoint *ck, const char *name, int rows, int cols, ds_weight *w, ds_err *err);

/* Loads a float vector/matrix (F32, BF16 or F16 tensor of exactly `n`
 * elements, with the given shape check) into a new malloc'd fp32 array. */
int ds_tensor_to_f32(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape, float **out,
                     ds_err *err);

#endif
