/* kbench.cu — the product kernels alone, for `dsv4 bench --kernels --backend
 * cuda`: each storage kind at V4-Flash's shapes, one token (decode: a read
 * of the weights) and 512 tokens (prefill: arithmetic), timed with events,
 * next to the same shape through cuBLAS — BF16 x BF16 -> FP32 cublasGemmEx,
 * tensor cores, the reduction order cuBLAS picks per shape — so the ratio is
 * the price of dsv4's fixed order. cuBLAS is loaded at run time (dlopen):
 * the engine itself never links it, and a machine without it still gets
 * dsv4's own numbers with the comparison marked missing. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/internal.h"
#include "backend/cuda/kbench.h"

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
                r->copies = T == 1 ? nw : 1;
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
