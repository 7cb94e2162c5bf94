/* kbench_cuda.cu — the CUDA backend's product kernels alone, for `dsv4 bench --kernels --backend
 * cuda`: each storage kind at V4-Flash's shapes, one token (decode: a read
 * of the weights) and 512 tokens (prefill: arithmetic), timed with events,
 * next to the same shape through cuBLAS — BF16 x BF16 -> FP32 cublasGemmEx,
 * tensor cores, the reduction order cuBLAS picks per shape — so the ratio is
 * the price of dsv4's fixed order. cuBLAS is loaded at run time (dlopen):
 * the engine itself never links it, and a machine without it still gets
 * dsv4's own numbers with the comparison marked missing. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/internal.h"
#include "bench/kbench_cuda.h"

/* Random codes of a storage kind: no NaN (e4m3 0x7f / 0xff), E8M0 scales
 * 2^-7 .. 2^0, bf16 values of magnitude 2^-7 .. 2^-6. */
__global__ void kb_fill(uint8_t *p, size_t n, uint32_t seed, int what) {
    DSC_PDL_WAIT();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        uint8_t b = (uint8_t)h;
        if (what == 1 && (b & 0x7f) == 0x7f) b ^= 1; /* e4m3 without NaN */
        if (what == 2) b = (uint8_t)(120 + (h & 7)); /* E8M0 */
        if (what == 3) b = (i & 1) ? (uint8_t)(0x3c | (b & 0x80)) : b; /* bf16 high byte */
        /* e4m3 of magnitude 0.125 .. 1.875, either sign: at a 2^-6 scale a
         * product's gain is ~0.7, so a chain of them stays finite */
        if (what == 4) b = (uint8_t)((h & 0x80u) | (0x20u + (h & 0x1fu)));
        p[i] = b;
    }
}

__global__ void kb_fill_x(float *x, size_t n, uint32_t seed) {
    DSC_PDL_WAIT();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 0x45d9f3bu;
        x[i] = (float)(h & 0xffff) / 32768.0f - 1.0f;
    }
}

static const ds_cuda_kb_case kb_cases[] = {
    {"wq_a", DS_W_FP8, 1024, 4096},     {"wkv", DS_W_FP8, 512, 4096},     {"wq_b", DS_W_FP8, 32768, 1024},
    {"wo_b", DS_W_FP8, 4096, 8192},     {"shared w1", DS_W_FP8, 2048, 4096}, {"expert w1", DS_W_FP4, 2048, 4096},
    {"expert w2", DS_W_FP4, 4096, 2048}, {"gate", DS_W_BF16, 256, 4096},   {"head", DS_W_BF16, 129280, 4096},
};

typedef struct {
    void *lib;
    cublasHandle_t h;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
} kb_blas;

static int blas_open(kb_blas *b, cudaStream_t st, char *note, size_t nn) {
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 3 && !b->lib; i++) b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!b->lib) {
        snprintf(note, nn, "cuBLAS not found (dlopen libcublas.so.13/.12: %s): no comparison", dlerror());
        return -1;
    }
    b->create = (decltype(b->create))dlsym(b->lib, "cublasCreate_v2");
    b->destroy = (decltype(b->destroy))dlsym(b->lib, "cublasDestroy_v2");
    b->set_stream = (decltype(b->set_stream))dlsym(b->lib, "cublasSetStream_v2");
    b->gemm = (decltype(b->gemm))dlsym(b->lib, "cublasGemmEx");
    if (!b->create || !b->destroy || !b->set_stream || !b->gemm || b->create(&b->h) != CUBLAS_STATUS_SUCCESS) {
        snprintf(note, nn, "cuBLAS found but not usable (symbols or cublasCreate failed): no comparison");
        dlclose(b->lib);
        b->lib = NULL;
        return -1;
    }
    b->set_stream(b->h, st);
    Dl_info di;
    if (dladdr((void *)b->gemm, &di) && di.dli_fname) snprintf(note, nn, "cuBLAS from %s", di.dli_fname);
    return 0;
}

static size_t kb_wbytes(const ds_cuda_kb_case *c, size_t *scale_bytes) {
    size_t n = (size_t)c->rows * c->cols;
    *scale_bytes = c->kind == DS_W_FP8   ? (size_t)((c->rows + 127) / 128) * ((c->cols + 127) / 128)
                   : c->kind == DS_W_FP4 ? (size_t)c->rows * (c->cols / 32)
                                         : 0;
    return c->kind == DS_W_FP8 ? n : c->kind == DS_W_FP4 ? n / 2 : c->kind == DS_W_F32 ? 4 * n : 2 * n;
}

enum { KB_MAXW = 128 }; /* weight copies at most (the decode rows' ring) */

/* ms per call of fn over reps calls (after one warm-up). */
template <typename F> static float kb_time(cudaStream_t st, int reps, F fn) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    fn();
    cudaEventRecord(a, st);
    for (int i = 0; i < reps; i++) fn();
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / (float)reps;
}

/* ---- the price of a step in kernels ---------------------------------------
 * A decode step is a chain of dependent kernels (29-44 a V4 layer at batch 1),
 * so besides each kernel's own work a layer pays what it costs to end one
 * kernel and start the next with the first one's writes visible. kb_link is
 * the least such a kernel can do: wait for the one before it (DSC_PDL_WAIT),
 * then thread 0 of each block reads a word the previous kernel wrote (another
 * block's) and writes its own: one dependent global round trip. A chain of
 * them captured in a graph, replayed, gives the cost of one link; kb_barrier
 * gives the same link as a grid barrier inside one persistent kernel (blocks
 * all resident: a cooperative launch), the alternative to kernel boundaries. */
__global__ void kb_link(const unsigned *__restrict__ in, unsigned *__restrict__ out) {
    DSC_PDL_WAIT();
    if (threadIdx.x == 0) out[blockIdx.x] = in[(blockIdx.x + 1) % gridDim.x] + 1u;
}

/* n grid barriers: thread 0 of each block publishes its word (fenced), counts
 * itself in, and the last block of a round releases the others by bumping the
 * generation, which they spin on; then each block reads another block's word. */
__global__ void kb_barrier(unsigned *words, unsigned *count, volatile unsigned *gen, int n) {
    unsigned v = 0;
    for (int i = 0; i < n; i++) {
        if (threadIdx.x == 0) {
            unsigned g = *gen;
            words[(size_t)(i & 1) * gridDim.x + blockIdx.x] = v + 1u;
            __threadfence();
            if (atomicAdd(count, 1u) == gridDim.x - 1) {
                *count = 0;
                __threadfence();
                *gen = g + 1u;
            } else {
                while (*gen == g) {
                }
            }
            __threadfence();
            v = ((volatile unsigned *)words)[(size_t)(i & 1) * gridDim.x + (blockIdx.x + 1) % gridDim.x];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) words[2 * (size_t)gridDim.x + blockIdx.x] = v;
}

extern "C" int ds_cuda_chain_bench(int gpu, ds_cuda_chain_row *out, int cap, int *n_out, ds_err *err) {
    const char *op = "kernel chain bench";
    const int N = 256; /* links a graph */
    *n_out = 0;
    if (cudaSetDevice(gpu) != cudaSuccess) return dsc_failmsg(err, op, "GPU %d cannot be selected", gpu);
    int nsm = 0, coop = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, gpu);
    cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, gpu);
    cudaStream_t st;
    if (cudaStreamCreate(&st) != cudaSuccess) return dsc_failmsg(err, op, "no stream");
    unsigned *buf = NULL;
    int rc = 0;
    /* the links' two word sets [0, 4 nsm), [4 nsm, 8 nsm) and the side's from
     * 8 nsm; then (zeroed again) the barrier's words [0, 3 nsm), its count and
     * generation */
    size_t words = 3 * (size_t)4 * nsm + 2;
    if (cudaMalloc(&buf, words * sizeof(unsigned)) != cudaSuccess) {
        cudaStreamDestroy(st);
        return dsc_failmsg(err, op, "out of device memory");
    }
    cudaMemsetAsync(buf, 0, words * sizeof(unsigned), st);
    struct {
        const char *what;
        int blocks, threads, pdl, fork;
    } cs[] = {
        {"kernel, 1 block of 32 threads, programmatic launch", 1, 32, 1, 0},
        {"kernel, 2 blocks a SM of 256 threads, programmatic launch", 2 * nsm, 256, 1, 0},
        {"kernel, 2 blocks a SM of 256 threads, stream order", 2 * nsm, 256, 0, 0},
        {"kernel, 2 blocks a SM, programmatic launch, each forking a 1-block kernel onto a second stream and "
         "joining it (the side stream's pattern)",
         2 * nsm, 256, 1, 1},
    };
    cudaStream_t st2;
    cudaEvent_t ev[2];
    if (cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking) != cudaSuccess) {
        cudaFree(buf);
        cudaStreamDestroy(st);
        return dsc_failmsg(err, op, "no second stream");
    }
    cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming);
    cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0] && *n_out < cap && !rc; c++) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        for (int i = 0; i < N && e == cudaSuccess; i++) {
            unsigned *a = buf + (size_t)(i & 1) * 4 * nsm, *b = buf + (size_t)((i + 1) & 1) * 4 * nsm;
            if (cs[c].pdl) e = dsc_launch(kb_link, cs[c].blocks, cs[c].threads, 0, st, (const unsigned *)a, b);
            else {
                kb_link<<<cs[c].blocks, cs[c].threads, 0, st>>>(a, b);
                e = cudaGetLastError();
            }
            if (cs[c].fork && e == cudaSuccess) { /* the side's kernel reads b, writes its own words */
                e = cudaEventRecord(ev[0], st);
                if (e == cudaSuccess) e = cudaStreamWaitEvent(st2, ev[0], 0);
                if (e == cudaSuccess) e = dsc_launch(kb_link, 1, 32, 0, st2, (const unsigned *)b, buf + 8 * (size_t)nsm);
                if (e == cudaSuccess) e = cudaEventRecord(ev[1], st2);
                if (e == cudaSuccess) e = cudaStreamWaitEvent(st, ev[1], 0);
            }
        }
        cudaError_t e2 = cudaStreamEndCapture(st, &g);
        if (e == cudaSuccess) e = e2;
        if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
        if (e == cudaSuccess) {
            float best = 1e30f;
            for (int r = 0; r < 6 && e == cudaSuccess; r++) { /* the first replay uploads the graph */
                float ms = kb_time(st, 1, [&] { cudaGraphLaunch(ge, st); });
                if (r > 0 && ms < best) best = ms;
                e = cudaGetLastError();
            }
            ds_cuda_chain_row *r = &out[(*n_out)++];
            r->what = cs[c].what;
            r->blocks = cs[c].blocks;
            r->us = 1e3 * best / N;
        }
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        if (e != cudaSuccess) rc = dsc_fail(err, op, cs[c].what, e);
    }
    if (!rc && coop && *n_out < cap) {
        unsigned *words_p = buf, *count = buf + 3 * (size_t)nsm, *gen = count + 1;
        int nb = nsm, nbar = 2000;
        cudaMemsetAsync(buf, 0, words * sizeof(unsigned), st);
        void *args[] = {&words_p, &count, &gen, &nbar};
        float ms = kb_time(st, 1, [&] {
            cudaLaunchCooperativeKernel((const void *)kb_barrier, dim3(nb), dim3(256), args, 0, st);
        });
        cudaError_t e = cudaStreamSynchronize(st);
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) rc = dsc_fail(err, op, "grid barrier", e);
        else {
            ds_cuda_chain_row *r = &out[(*n_out)++];
            r->what = "grid barrier in one persistent kernel, 1 block a SM of 256 threads";
            r->blocks = nb;
            r->us = 1e3 * ms / nbar;
        }
    }
    cudaStreamSynchronize(st);
    cudaFree(buf);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    cudaStreamDestroy(st2);
    cudaStreamDestroy(st);
    return rc;
}

/* ---- products chained: one kernel each, or one persistent kernel ----------
 * A decode step's products depend on each other (x of one is y of the one
 * before), so one kernel a product pays each product's ramp and tail on the
 * chain. kb_pchain is the other shape, reduced to FP8 products of a square
 * K x K (block scales 128 x 128, fp32 x): one cooperative kernel, a block a
 * SM owning rb rows of every product, each warp copying its next rows into a
 * ring in shared memory (cp.async) ahead of their product, across products:
 * while the block waits for every block to be done with product i (a
 * counter) and reads x = y_i, product i + 1's rows are already coming. So the
 * weights stream while the chain waits. Not dsv4's numerics
 * (plain fp32 sums in a lane's order): a measurement of what the shape
 * gains, checked against dsv4's kernels for the same values to ~1e-5. */
__device__ __forceinline__ void kb_cp16(void *smem, const void *g) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g));
}

__device__ __forceinline__ float kb_e4m3_dot16(uint4 w, const float4 *xs) { /* xs[s * 32]: the lane's 4 float4 */
    uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float a = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; s++) {
        uint32_t lo, hi;
        asm("{.reg .b16 l, u;\n mov.b32 {l, u}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, u;}"
            : "=r"(lo), "=r"(hi)
            : "r"(ws[s]));
        float2 f0 = __half22float2(*(__half2 *)&lo), f1 = __half22float2(*(__half2 *)&hi);
        float4 x = xs[s * 32];
        a = fmaf(f0.x, x.x, a);
        a = fmaf(f0.y, x.y, a);
        a = fmaf(f1.x, x.z, a);
        a = fmaf(f1.y, x.w, a);
    }
    return a;
}

/* w: nw matrices of K x K e4m3 (contiguous), sc: their E8M0 block scales;
 * product i uses matrix i % nw; x0: the input, y0 / y1: y of even / odd
 * products; done: zero at the launch; err: set when a wait ran past its cap.
 * Block b owns rows [b rb, b rb + rb) of every product, warp w rows w, w +
 * 16, ... of those (rpw a warp). A warp's rows of all products in order are
 * its items; each lane copies (cp.async) exactly the 16-byte chunks of an
 * item it will multiply (chunks lane, lane + 32, ...), into a ring of KB_NS
 * row slots of the warp, KB_NS - 1 items ahead: its own groups, so no
 * barrier guards the weights, and the copies run on across a product's end
 * while the block waits for the others and reads the next x. */
#define KB_NS 3
template <int NCH> /* K / 512: a lane's chunks of a row */
__global__ void __launch_bounds__(512, 1)
    kb_pchain(const uint8_t *__restrict__ w, const uint8_t *__restrict__ sc, int nw, int K, int rb, int np,
              const float *x0, float *y0, float *y1, unsigned *done, unsigned *err) {
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float scs[NCH * 4]; /* the block's rows' scales of product i (rb <= 128: one 128-row block) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nt = blockDim.x, nwarp = nt / 32;
    const int nch = NCH, rpw = rb / nwarp, r0 = blockIdx.x * rb;
    uint8_t *ring = sm + (size_t)warp * KB_NS * K; /* the warp's KB_NS row slots */
    float4 *xs = (float4 *)(sm + (size_t)nwarp * KB_NS * K); /* x as [chunk / 32][4][32] float4 */
    const size_t mat = (size_t)K * K, ns = (size_t)(K / 128) * (K / 128);
    const int nk = np * rpw; /* the warp's items */
    auto issue = [&](int k) { /* item k: product k / rpw, the warp's row k % rpw; always a group */
        if (k < nk) {
            int i = k / rpw, row = r0 + warp + (k % rpw) * nwarp;
            const uint8_t *src = w + (size_t)(i % nw) * mat + (size_t)min(row, K - 1) * K;
            uint8_t *dst = ring + (size_t)(k % KB_NS) * K;
            for (int c = 0; c < nch; c++) {
                int ch = c * 32 + lane;
                kb_cp16(dst + (size_t)ch * 16, src + (size_t)ch * 16);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int k = 0; k < KB_NS - 1; k++) issue(k);
    int k = 0;
    for (int i = 0; i < np; i++) {
        const float *x = i == 0 ? x0 : (i & 1) ? y0 : y1; /* y of product i - 1 */
        float *y = (i & 1) ? y1 : y0;
        if (i > 0) { /* every block done with product i - 1 */
            if (threadIdx.x == 0) {
                unsigned want = (unsigned)i * gridDim.x, v;
                long spins = 0;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(done));
                } while (v < want && ++spins < (1L << 26));
                if (v < want) atomicExch(err, 1u);
            }
            __syncthreads();
        }
        for (int c = threadIdx.x; c < K / 4; c += nt) { /* c: float4 index; chunk c / 4, part c % 4 */
            int ch = c >> 2, part = c & 3;
            xs[((ch >> 5) * 4 + part) * 32 + (ch & 31)] = __ldcg((const float4 *)x + c);
        }
        if ((int)threadIdx.x < K / 128)
            scs[threadIdx.x] =
                __uint_as_float((uint32_t)sc[(size_t)(i % nw) * ns + (size_t)(r0 / 128) * (K / 128) + threadIdx.x] << 23);
        __syncthreads();
        for (int j = 0; j < rpw; j++, k++) {
            issue(k + KB_NS - 1);
            asm volatile("cp.async.wait_group %0;\n" ::"n"(KB_NS - 1)); /* item k is in its slot */
            int row = r0 + warp + j * nwarp;
            const uint4 *wr = (const uint4 *)(ring + (size_t)(k % KB_NS) * K);
            float acc = 0.0f;
#pragma unroll
            for (int c = 0; c < nch; c++) {
                int ch = c * 32 + lane; /* columns 16 ch .. 16 ch + 15: group ch / 8 */
                float part = kb_e4m3_dot16(wr[ch], xs + (size_t)c * 4 * 32 + lane);
                acc = fmaf(part, scs[ch / 8], acc);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0 && row < K) y[row] = acc;
        }
        __syncthreads(); /* xs free; y written */
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(done, 1u);
        }
    }
    asm volatile("cp.async.wait_all;\n" ::);
}

extern "C" int ds_cuda_pchain_bench(int gpu, ds_cuda_pchain_row *out, int cap, int *n_out, ds_err *err) {
    const char *op = "product chain bench";
    *n_out = 0;
    if (cudaSetDevice(gpu) != cudaSuccess) return dsc_failmsg(err, op, "GPU %d cannot be selected", gpu);
    int nsm = 0, coop = 0, l2 = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, gpu);
    cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, gpu);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, gpu);
    if (!coop) return dsc_failmsg(err, op, "GPU %d has no cooperative launch", gpu);
    cudaStream_t st;
    if (cudaStreamCreate(&st) != cudaSuccess) return dsc_failmsg(err, op, "no stream");
    dsc_buf xhl[3];
    memset(xhl, 0, sizeof xhl);
    int rc = 0;
    const int Ks[2] = {2048, 4096};
    for (int ki = 0; ki < 2 && *n_out < cap && !rc; ki++) {
        int K = Ks[ki], rb = (K + nsm - 1) / nsm;
        rb = (rb + 15) / 16 * 16; /* whole rows for the 16 warps */
        int grid = (K + rb - 1) / rb;
        size_t mat = (size_t)K * K, ns = (size_t)(K / 128) * (K / 128);
        int nw = (int)((3 * (size_t)l2 + mat - 1) / mat), np = 4 * nw;
        size_t smem = (size_t)16 * KB_NS * K + (size_t)K * 4; /* 16 warps' rings, x */
        auto kern_fn = K == 2048 ? kb_pchain<4> : kb_pchain<8>;
        uint8_t *w = NULL, *sc = NULL;
        float *x0 = NULL, *y[3] = {NULL, NULL, NULL}; /* y of even / odd products; the kernels' last y */
        unsigned *ctl = NULL;
        cudaError_t e = cudaMalloc(&w, mat * nw);
        if (e == cudaSuccess) e = cudaMalloc(&sc, ns * nw);
        if (e == cudaSuccess) e = cudaMalloc(&x0, (size_t)K * 4);
        for (int j = 0; j < 3 && e == cudaSuccess; j++) e = cudaMalloc(&y[j], (size_t)K * 4);
        if (e == cudaSuccess) e = cudaMalloc(&ctl, 2 * sizeof(unsigned));
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(kern_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e == cudaSuccess) {
            dsc_launch(kb_fill, 1024, 256, 0, st, w, mat * nw, 0x4321u + (uint32_t)K, 4);
            cudaMemsetAsync(sc, 121, ns * nw, st); /* 2^-6 */
            dsc_launch(kb_fill_x, 16, 256, 0, st, x0, (size_t)K, 0x51u);
            /* one kernel a product: dsv4's product kernel, x of each the y before, in a graph */
            cudaGraph_t g = NULL;
            cudaGraphExec_t ge = NULL;
            e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
            for (int i = 0; i < np && e == cudaSuccess; i++) {
                dsc_w d = {w + (size_t)(i % nw) * mat, sc + (size_t)(i % nw) * ns, K, K, 0, K / 128, 0};
                e = dsc_launch_matmul(st, xhl, DS_W_FP8, d, i == 0 ? x0 : y[(i - 1) & 1], K, 0, 1 << 30, 1,
                                      y[i & 1], K)
                        ? cudaErrorUnknown
                        : cudaSuccess;
            }
            cudaError_t e2 = cudaStreamEndCapture(st, &g);
            if (e == cudaSuccess) e = e2;
            if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
            float kern = 1e30f, pers = 1e30f;
            unsigned herr = 0;
            for (int r = 0; r < 4 && e == cudaSuccess; r++) { /* the first round uploads the graph */
                float ms = kb_time(st, 1, [&] { cudaGraphLaunch(ge, st); });
                if (r > 0 && ms < kern) kern = ms;
                e = cudaStreamSynchronize(st);
            }
            if (e == cudaSuccess) e = cudaMemcpyAsync(y[2], y[(np - 1) & 1], (size_t)K * 4, cudaMemcpyDeviceToDevice, st);
            float *ye = y[0], *yo = y[1];
            unsigned *done = ctl, *errw = ctl + 1;
            if (e == cudaSuccess) e = cudaMemset(ctl, 0, 2 * sizeof(unsigned));
            const uint8_t *wc = w, *scc = sc;
            const float *xc = x0;
            void *args[] = {(void *)&wc, (void *)&scc, &nw, &K, &rb, &np, (void *)&xc, &ye, &yo, &done, &errw};
            for (int r = 0; r < 4 && e == cudaSuccess && !herr; r++) {
                float ms = kb_time(st, 1, [&] { /* the counter zeroed before each launch (~2 us of 48 products) */
                    cudaMemsetAsync(done, 0, sizeof(unsigned), st);
                    cudaLaunchCooperativeKernel((const void *)kern_fn, dim3(grid), dim3(512), args, smem, st);
                });
                if (r > 0 && ms < pers) pers = ms;
                e = cudaStreamSynchronize(st);
                if (e == cudaSuccess) e = cudaGetLastError();
                if (e == cudaSuccess) e = cudaMemcpy(&herr, errw, sizeof herr, cudaMemcpyDeviceToHost);
            }
            float *ha = e == cudaSuccess && !herr ? (float *)malloc((size_t)K * 8) : NULL;
            if (e == cudaSuccess && !herr && !ha) rc = dsc_failmsg(err, op, "K = %d: out of host memory", K);
            if (ha) {
                float *hb = ha + K;
                cudaMemcpy(ha, y[2], (size_t)K * 4, cudaMemcpyDeviceToHost);
                cudaMemcpy(hb, y[(np - 1) & 1], (size_t)K * 4, cudaMemcpyDeviceToHost);
                double md = 0, my = 0;
                for (int j = 0; j < K; j++) {
                    double dd = fabs((double)ha[j] - hb[j]);
                    md = dd > md ? dd : md;
                    my = fabs((double)ha[j]) > my ? fabs((double)ha[j]) : my;
                }
                free(ha);
                ds_cuda_pchain_row *o = &out[(*n_out)++];
                o->K = K;
                o->products = np;
                o->bytes = (double)(mat + ns);
                o->kernels_us = 1e3 * kern / np;
                o->persistent_us = 1e3 * pers / np;
                o->rel_diff = my > 0 ? md / my : md;
            } else if (e == cudaSuccess && herr)
                rc = dsc_failmsg(err, op, "K = %d: a block's wait for the others ran past its cap (not co-resident?)", K);
            if (ge) cudaGraphExecDestroy(ge);
            if (g) cudaGraphDestroy(g);
        }
        if (e != cudaSuccess && !rc) {
            char what[32];
            snprintf(what, sizeof what, "K = %d", K);
            rc = dsc_fail(err, op, what, e);
        }
        cudaFree(w);
        cudaFree(sc);
        cudaFree(x0);
        for (int j = 0; j < 3; j++) cudaFree(y[j]);
        cudaFree(ctl);
    }
    cudaStreamSynchronize(st);
    for (int i = 0; i < 3; i++) cudaFree(xhl[i].p);
    cudaStreamDestroy(st);
    return rc;
}

extern "C" int ds_cuda_kernel_bench(int gpu, int reps, ds_cuda_kb_row *out, int cap, int *n_out, double *copy_gbs,
                                    char *note, size_t nn, ds_err *err) {
    const char *op = "kernel bench";
    *n_out = 0;
    note[0] = 0;
    if (cudaSetDevice(gpu) != cudaSuccess) return dsc_failmsg(err, op, "GPU %d cannot be selected", gpu);
    cudaStream_t st;
    if (cudaStreamCreate(&st) != cudaSuccess) return dsc_failmsg(err, op, "no stream");
    int l2 = 0;
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, gpu);
    dsc_buf xhl[3]; /* the tensor-core path's buffers */
    memset(xhl, 0, sizeof xhl);
    kb_blas blas;
    int have_blas = blas_open(&blas, st, note, nn) == 0;
    int rc = 0;
    /* the floor: a 1 GiB device copy (read + written), best of 5 */
    {
        size_t cb = (size_t)1 << 30;
        void *a = NULL, *b = NULL;
        if (cudaMalloc(&a, cb) != cudaSuccess || cudaMalloc(&b, cb) != cudaSuccess) {
            cudaFree(a);
            rc = dsc_failmsg(err, op, "out of device memory for the 2 GiB copy test");
            goto done;
        }
        float best = 1e30f;
        for (int i = 0; i < 5; i++) {
            float ms = kb_time(st, 1, [&] { cudaMemcpyAsync(b, a, cb, cudaMemcpyDeviceToDevice, st); });
            best = ms < best ? ms : best;
        }
        *copy_gbs = 2.0 * (double)cb / (best * 1e-3) / 1e9;
        cudaFree(a);
        cudaFree(b);
    }
    for (size_t ci = 0; ci < sizeof kb_cases / sizeof kb_cases[0]; ci++) {
        const ds_cuda_kb_case *c = &kb_cases[ci];
        size_t sb, wb = kb_wbytes(c, &sb);
        /* nw copies of the weights, together at least 3x the L2, so a decode
         * call that cycles through them reads HBM (cold); warm: one copy again */
        int nw = (int)((3 * (size_t)l2 + wb + sb - 1) / (wb + sb));
        nw = nw < 1 ? 1 : nw > KB_MAXW ? KB_MAXW : nw;
        uint8_t *w = NULL, *sc = NULL;
        uint16_t *wbf = NULL, *xbf = NULL;
        float *x = NULL, *y = NULL;
        const int Ts[2] = {1, 512};
        size_t xn = (size_t)512 * c->cols, yn = (size_t)512 * c->rows;
        cudaError_t e = cudaMalloc(&w, wb * nw);
        if (e == cudaSuccess && sb) e = cudaMalloc(&sc, sb * nw);
        if (e == cudaSuccess) e = cudaMalloc(&x, xn * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc(&y, yn * sizeof(float));
        if (e == cudaSuccess && have_blas) e = cudaMalloc(&wbf, (size_t)c->rows * c->cols * 2);
        if (e == cudaSuccess && have_blas) e = cudaMalloc(&xbf, xn * 2);
        if (e != cudaSuccess) {
            cudaGetLastError();
            rc = dsc_failmsg(err, op, "%s [%d x %d]: out of device memory", c->name, c->rows, c->cols);
        } else {
            dsc_launch(kb_fill, 1024, 256, 0, st, w, wb * nw, 0x1234u + (uint32_t)ci,
                       c->kind == DS_W_FP8    ? 1
                       : c->kind == DS_W_BF16 ? 3
                                              : 0);
            if (sb) dsc_launch(kb_fill, 256, 256, 0, st, sc, sb * nw, 0x99u, 2);
            dsc_launch(kb_fill_x, 1024, 256, 0, st, x, xn, 0x77u);
            if (have_blas) {
                dsc_launch(kb_fill, 1024, 256, 0, st, (uint8_t *)wbf, (size_t)c->rows * c->cols * 2, 0x55u, 3);
                dsc_launch(kb_fill, 1024, 256, 0, st, (uint8_t *)xbf, xn * 2, 0x66u, 3);
            }
            dsc_w d = {w, sc, c->rows, c->cols, 0, c->kind == DS_W_FP8 ? (c->cols + 127) / 128 : c->cols / 32, 0};
            for (int ti = 0; ti < 2 && *n_out < cap; ti++) {
                int T = Ts[ti];
                ds_cuda_kb_row *r = &out[(*n_out)++];
                memset(r, 0, sizeof *r);
                r->c = *c;
                r->T = T;
                r->weight_bytes = (double)(wb + sb);
                int rp = T == 1 ? reps : (reps + 3) / 4;
                r->warm_ms = kb_time(st, rp, [&] {
                    dsc_launch_matmul(st, xhl, c->kind, d, x, c->cols, 0, 1 << 30, T, y, c->rows);
                });
                int wi = 0;
                r->ms = T == 1 ? kb_time(st, rp,
                                         [&] {
                                             dsc_w di = d;
                                             di.data = w + wb * (size_t)wi;
                                             di.scale = sc ? sc + sb * (size_t)wi : NULL;
                                             wi = (wi + 1) % nw;
                                             dsc_launch_matmul(st, xhl, c->kind, di, x, c->cols, 0, 1 << 30, T, y,
                                                               c->rows);
                                         })
                               : r->warm_ms;
                if (have_blas) {
                    float one = 1.0f, zero = 0.0f;
                    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
                    r->blas_ms = kb_time(st, rp, [&] {
                        cublasStatus_t s2 = blas.gemm(blas.h, CUBLAS_OP_T, CUBLAS_OP_N, c->rows, T, c->cols, &one, wbf,
                                                      CUDA_R_16BF, c->cols, xbf, CUDA_R_16BF, c->cols, &zero, y,
                                                      CUDA_R_32F, c->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                        if (s2 != CUBLAS_STATUS_SUCCESS) bs = s2;
                    });
                    r->blas_ok = bs == CUBLAS_STATUS_SUCCESS;
                }
            }
            e = cudaStreamSynchronize(st);
            if (e != cudaSuccess) rc = dsc_fail(err, op, c->name, e);
        }
        cudaFree(w);
        cudaFree(sc);
        cudaFree(x);
        cudaFree(y);
        cudaFree(wbf);
        cudaFree(xbf);
        if (rc) break;
    }
done:
    if (have_blas) {
        blas.destroy(blas.h);
        dlclose(blas.lib);
    }
    cudaStreamSynchronize(st);
    for (int i = 0; i < 3; i++) cudaFree(xhl[i].p);
    cudaStreamDestroy(st);
    return rc;
}
