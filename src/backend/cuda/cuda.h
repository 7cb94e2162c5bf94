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

/* Test hook (tests/gpu/test_cuda_ops.c): the values the tensor-core products
 * feed their MMAs for FP8 weight words: out[2i], out[2i+1] = the f16x2 of
 * bytes (0, 1) and (2, 3) of words[i] (e4m3 codes). Low half: the
 * lower-numbered element. Returns 0, or -1 with err. */
int ds_cuda_mma_weight_probe(int gpu, const uint32_t *words, int nw, uint32_t *out, ds_err *err);

#ifdef __cplusplus
}
#endif

#endif
