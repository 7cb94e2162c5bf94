/* cuda.h — the CUDA backend (Hopper, sm_90a): every op of backend.h on one
 * GPU, in fp32 activations with the weights dequantized in registers, each
 * output reduced in an order fixed by the model's shapes only (docs/design.md §1).
 * Built when DSV4_CUDA is on (DSV4_HAVE_CUDA=1). */
#ifndef DS_BACKEND_CUDA_H
#define DS_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "common/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills the vtable of *be for device `gpu`: selects it, creates the stream.
 * Returns 0, or -1 with the cause in err (no device, bad index, driver). */
int ds_backend_cuda_init(ds_backend *be, int gpu, ds_err *err);

/* The number of CUDA devices (0 when none can be used). */
int ds_backend_cuda_count(void);

/* 1 and "NVIDIA H200, 139.8 GiB, sm_90 (device 0 of 1)" when a GPU can be
 * used; 0 and the reason when not. desc may be NULL. */
int ds_backend_cuda_available(char *desc, size_t n);

/* Test hook (tests/gpu/test_cuda_ops.c): the bf16 values the tensor-core
 * products feed their MMAs for weight words. FP8: out[2i], out[2i+1] = the
 * bf16x2 of bytes (0, 1) and (2, 3) of words[i] (scales unused). FP4, E8M0
 * scales: out[4(i ns + j) + h] = the bf16x2 of nibbles (2h, 2h+1) of words[i]
 * (the checkpoint's order: reordered on the device as map_weights does) times
 * the E8M0 scale byte scales[j]. Low half: the lower-numbered element. path:
 * 0 the bf16x2 decoding, 1 the fp32 one, 2 (FP4) the tile kernel's short one
 * (all in use: mma.cu). Returns 0, or -1 with err. */
int ds_cuda_mma_weight_probe(int gpu, int kind, int path, const uint32_t *words, int nw, const uint8_t *scales, int ns,
                             uint32_t *out, ds_err *err);

#ifdef __cplusplus
}
#endif

#endif
