/* norm_rope.cu — RMSNorm over rows, and the per-head (norm +) interleaved
 * RoPE at each row's position (doc §3.2).
 *
 * rmsnorm ORDER: thread i of DSC_ROW_THREADS sums x[i]^2, x[i+256]^2, ...
 * (fmaf chain), then the fixed block tree; out = w * (x * (1/sqrtf(ms+eps))).
 * rope: one warp per (row, head); the head norm's sum of squares is lane
 * strided then the xor tree; angles = inv_freq[i] * (float)pos, cosf/sinf. */
#include "backend/cuda/internal.h"

__global__ void __launch_bounds__(DSC_ROW_THREADS)
    rmsnorm_kernel(const float *x, const float *__restrict__ w, float *out, int n, float eps) {
    DSC_PDL_WAIT();
    __shared__ float sh[32];
    size_t t = blockIdx.x;
    const float *xr = x + t * (size_t)n;
    float *o = out + t * (size_t)n;
    float s = dsc_sumsq_part(xr, n, threadIdx.x);
    float ms = dsc_block_sum(s, sh) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    /* in place is safe: each thread rewrites only what it read */
#pragma unroll 8
    for (int j = threadIdx.x; j < n; j += DSC_ROW_THREADS) o[j] = w ? w[j] * (xr[j] * r) : xr[j] * r;
}

/* Rows of at most R * DSC_ROW_THREADS: the same chain and the same products,
 * with x and w read once into registers, all loads issued before the sum (the
 * loop above waits for memory once per 16 elements of a thread, and again
 * for x and w after the sum: at T = 1 one block on one SM, latency-bound). */
template <int R>
__global__ void __launch_bounds__(DSC_ROW_THREADS)
    rmsnorm_reg_kernel(const float *x, const float *__restrict__ w, float *out, int n, float eps) {
    DSC_PDL_WAIT();
    __shared__ float sh[32];
    size_t t = blockIdx.x;
    const float *xr = x + t * (size_t)n;
    float *o = out + t * (size_t)n;
    float v[R], wv[R];
#pragma unroll
    for (int u = 0; u < R; u++) {
        int j = threadIdx.x + u * DSC_ROW_THREADS;
        v[u] = j < n ? xr[j] : 0.0f;
        wv[u] = w && j < n ? w[j] : 1.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < R; u++)
        if (threadIdx.x + u * DSC_ROW_THREADS < n) s = fmaf(v[u], v[u], s);
    float ms = dsc_block_sum(s, sh) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
#pragma unroll
    for (int u = 0; u < R; u++) {
        int j = threadIdx.x + u * DSC_ROW_THREADS;
        if (j < n) o[j] = w ? wv[u] * (v[u] * r) : v[u] * r;
    }
}

int dsc_launch_rmsnorm(cudaStream_t st, const float *x, const float *w, float *out, int T, int n, float eps) {
    if (T <= 0) return 0;
    if (n <= 4 * DSC_ROW_THREADS)
        dsc_launch(rmsnorm_reg_kernel<4>, (unsigned)T, DSC_ROW_THREADS, 0, st, x, w, out, n, eps);
    else if (n <= 16 * DSC_ROW_THREADS)
        dsc_launch(rmsnorm_reg_kernel<16>, (unsigned)T, DSC_ROW_THREADS, 0, st, x, w, out, n, eps);
    else if (n <= 64 * DSC_ROW_THREADS)
        dsc_launch(rmsnorm_reg_kernel<64>, (unsigned)T, DSC_ROW_THREADS, 0, st, x, w, out, n, eps);
    else
        dsc_launch(rmsnorm_kernel, (unsigned)T, DSC_ROW_THREADS, 0, st, x, w, out, n, eps);
    return 0;
}

extern "C" int dsc_rmsnorm(const ds_backend *be, const ds_rmsnorm_params *p, ds_err *err) {
    const char *op = "rmsnorm";
    if (dsc_use(be, err, op)) return -1;
    dsc_launch_rmsnorm(dsc_of(be)->stream, p->x, p->w, p->out, p->T, p->n, p->eps);
    return dsc_check_launch(err, op);
}

/* x: [T][H][d]; warp w of the grid handles (t, h) = (w / H, w % H). */
__global__ void rope_kernel(float *x, int T, int H, int d, int half, const float *__restrict__ inv_freq, int norm,
                            int inverse, float eps, const int64_t *__restrict__ pos) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31;
    size_t wid = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (wid >= (size_t)T * H) return;
    int t = (int)(wid / H);
    float *xh = x + wid * (size_t)d;
    if (norm) {
        float s = 0.0f;
        for (int i = lane; i < d; i += 32) s = fmaf(xh[i], xh[i], s);
        s = dsc_warp_sum(s);
        float r = 1.0f / sqrtf(s / (float)d + eps);
        for (int i = lane; i < d; i += 32) xh[i] = xh[i] * r;
        __syncwarp();
    }
    float fp = (float)pos[t];
    float *p = xh + d - 2 * half;
    for (int i = lane; i < half; i += 32) {
        float ang = inv_freq[i] * fp;
        float cs = cosf(ang), sn = sinf(ang);
        if (inverse) sn = -sn;
        float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * cs - b * sn;
        p[2 * i + 1] = b * cs + a * sn;
    }
}

extern "C" int dsc_rope(const ds_backend *be, const ds_rope_params *p, ds_err *err) {
    const char *op = "rope";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (p->T <= 0 || p->H <= 0) return 0;
    if (p->T > I->step.T) return dsc_failmsg(err, op, "%d rows but the step has %d", p->T, I->step.T);
    if (2 * p->half > p->d) return dsc_failmsg(err, op, "rope width %d > head dim %d", 2 * p->half, p->d);
    size_t warps = (size_t)p->T * p->H;
    unsigned blocks = (unsigned)((warps + 7) / 8);
    dsc_launch(rope_kernel, blocks, 256, 0, I->stream, p->x, p->T, p->H, p->d, p->half, p->inv_freq, p->norm,
               p->inverse, p->eps, I->step.tok_pos);
    return dsc_check_launch(err, op);
}
