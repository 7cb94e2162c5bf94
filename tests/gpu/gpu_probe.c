/* gpu_probe.c — exits 0 when this process sees a CUDA device, 77 (ctest's
 * skip) when it sees none: no driver, no device, or no access to one. */
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        printf("gpu_probe: no CUDA device (%s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 77;
    }
    return 0;
}
