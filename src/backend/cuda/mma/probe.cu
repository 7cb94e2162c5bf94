/* mma/probe.cu — the test hook of the tensor-core weight decoding (afrag). */
#include "backend/cuda/mma/common.cuh"

/* ---- test hook ------------------------------------------------------------------ */

/* The pairs afrag feeds the MMA for FP8 weight words (f16x2; tests/gpu/test_cuda_ops.c
 * checks them bitwise against host-computed values). */
__global__ void mma_wprobe_kernel(const uint32_t *__restrict__ words, int nw, uint32_t *__restrict__ out) {
    DSC_PDL_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nw) return;
    afrag<DS_W_FP8>(make_uint4(words[i], 0, 0, 0), 0, out[2 * i], out[2 * i + 1]);
}

extern "C" int ds_cuda_mma_weight_probe(int gpu, const uint32_t *words, int nw, uint32_t *out, ds_err *err) {
    const char *op = "mma weight probe";
    if (nw <= 0) return dsc_failmsg(err, op, "no words");
    if (cudaSetDevice(gpu) != cudaSuccess) return dsc_failmsg(err, op, "GPU %d cannot be selected", gpu);
    size_t no = (size_t)nw * 2;
    uint32_t *dw = NULL, *dout = NULL;
    int rc = 0;
    if (cudaMalloc(&dw, (size_t)nw * 4) != cudaSuccess || cudaMalloc(&dout, no * 4) != cudaSuccess)
        rc = dsc_failmsg(err, op, "out of device memory");
    else if (cudaMemcpy(dw, words, (size_t)nw * 4, cudaMemcpyHostToDevice) != cudaSuccess)
        rc = dsc_failmsg(err, op, "upload failed");
    else {
        unsigned nb = (unsigned)(((size_t)nw + 255) / 256);
        dsc_launch(mma_wprobe_kernel, nb, 256, 0, 0, dw, nw, dout);
        cudaError_t e = cudaMemcpy(out, dout, no * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) rc = dsc_failmsg(err, op, "kernel or download failed: %s", cudaGetErrorString(e));
    }
    cudaFree(dw);
    cudaFree(dout);
    return rc;
}
