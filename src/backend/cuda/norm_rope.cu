/* norm_rope.cu — RMSNorm over rows, and the per-head (norm +) interleaved
 * RoPE at each row's position (doc §3.2).
 *
 * rmsnorm ORDER: thread i of DSC_ROW_THREADS sums x[i]^2, x[i+256]^2, ...
 * (fmaf chain), then the fixed block tree; out = w * (x * (1/sqrtf(ms+eps))),
 * then (rope_inv_freq) rope's pairs on the written row (dsc_rope_pair).
 * rope: one warp per (row, head); the head norm's sum of squares is lane
 * strided then the xor tree; angles = inv_freq[i] * (float)pos, cosf/sinf. */
#include "backend/cuda/internal.h"

/* Up to DSC_NORM_JOBS independent rmsnorms in one launch (blockIdx.y: the
 * job, blockIdx.x: its row), each optionally followed by RoPE on the row's
 * last 2 * half channels at the row's position (ds_rmsnorm_params). */
#define DSC_NORM_JOBS 4
struct norm_job {
    const float *x, *w;
    float *out;
    int T, n;
    float eps;
    const float *inv; /* the rope's inv_freq, or NULL */
    int half;
};
struct norm_jobs {
    norm_job j[DSC_NORM_JOBS];
    const int64_t *pos; /* the step's positions (rope) */
};

/* after the row is written: the rope on its last 2 * half channels, a pair a
 * thread (the row's writes are visible to the block after the barrier) */
__device__ __forceinline__ void norm_rope_tail(const norm_job &J, float *o, const int64_t *pos, size_t t) {
    if (!J.inv) return;
    __syncthreads();
    float *p = o + J.n - 2 * J.half, fp = (float)pos[t];
    for (int i = threadIdx.x; i < J.half; i += DSC_ROW_THREADS) dsc_rope_pair(p[2 * i], p[2 * i + 1], J.inv[i], fp, 0);
}

__global__ void __launch_bounds__(DSC_ROW_THREADS) rmsnorm_kernel(norm_jobs a) {
    DSC_PDL_WAIT();
    __shared__ float sh[32];
    const norm_job J = a.j[blockIdx.y];
    size_t t = blockIdx.x;
    if (t >= (size_t)J.T) return;
    const float *xr = J.x + t * (size_t)J.n;
    float *o = J.out + t * (size_t)J.n;
    float s = dsc_sumsq_part(xr, J.n, threadIdx.x);
    float ms = dsc_block_sum(s, sh) / (float)J.n;
    float r = 1.0f / sqrtf(ms + J.eps);
    /* in place is safe: each thread rewrites only what it read */
#pragma unroll 8
    for (int j = threadIdx.x; j < J.n; j += DSC_ROW_THREADS) o[j] = J.w ? J.w[j] * (xr[j] * r) : xr[j] * r;
    norm_rope_tail(J, o, a.pos, t);
}

/* Rows of at most R * DSC_ROW_THREADS: the same chain and the same products,
 * with x and w read once into registers, all loads issued before the sum (the
 * loop above waits for memory once per 16 elements of a thread, and again
 * for x and w after the sum: at T = 1 one block on one SM, latency-bound).
 * A shorter row takes the same chain (the further u skipped): any R that
 * holds the row gives its bits. */
template <int R> __global__ void __launch_bounds__(DSC_ROW_THREADS) rmsnorm_reg_kernel(norm_jobs a) {
    DSC_PDL_WAIT();
    __shared__ float sh[32];
    const norm_job J = a.j[blockIdx.y];
    size_t t = blockIdx.x;
    if (t >= (size_t)J.T) return;
    const int n = J.n;
    const float *xr = J.x + t * (size_t)n;
    float *o = J.out + t * (size_t)n;
    float v[R], wv[R];
#pragma unroll
    for (int u = 0; u < R; u++) {
        int j = threadIdx.x + u * DSC_ROW_THREADS;
        v[u] = j < n ? xr[j] : 0.0f;
        wv[u] = J.w && j < n ? J.w[j] : 1.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < R; u++)
        if (threadIdx.x + u * DSC_ROW_THREADS < n) s = fmaf(v[u], v[u], s);
    float ms = dsc_block_sum(s, sh) / (float)n;
    float r = 1.0f / sqrtf(ms + J.eps);
#pragma unroll
    for (int u = 0; u < R; u++) {
        int j = threadIdx.x + u * DSC_ROW_THREADS;
        if (j < n) o[j] = J.w ? wv[u] * (v[u] * r) : v[u] * r;
    }
    norm_rope_tail(J, o, a.pos, t);
}

/* one launch for a.j[0, nj): the register kernel for the longest row */
static void launch_norms(cudaStream_t st, const norm_jobs &a, int nj) {
    int maxn = 0, maxT = 0;
    for (int i = 0; i < nj; i++) {
        if (a.j[i].n > maxn) maxn = a.j[i].n;
        if (a.j[i].T > maxT) maxT = a.j[i].T;
    }
    dim3 g((unsigned)maxT, (unsigned)nj);
    if (maxn <= 4 * DSC_ROW_THREADS) dsc_launch(rmsnorm_reg_kernel<4>, g, DSC_ROW_THREADS, 0, st, a);
    else if (maxn <= 16 * DSC_ROW_THREADS) dsc_launch(rmsnorm_reg_kernel<16>, g, DSC_ROW_THREADS, 0, st, a);
    else if (maxn <= 64 * DSC_ROW_THREADS) dsc_launch(rmsnorm_reg_kernel<64>, g, DSC_ROW_THREADS, 0, st, a);
    else dsc_launch(rmsnorm_kernel, g, DSC_ROW_THREADS, 0, st, a);
}

int dsc_launch_rmsnorm(cudaStream_t st, const float *x, const float *w, float *out, int T, int n, float eps) {
    if (T <= 0) return 0;
    norm_jobs a = {};
    a.j[0] = {x, w, out, T, n, eps, NULL, 0};
    launch_norms(st, a, 1);
    return 0;
}

extern "C" int dsc_rmsnorm(const ds_backend *be, const ds_rmsnorm_params *jobs, int n, ds_err *err) {
    const char *op = "rmsnorm";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    norm_jobs a = {};
    a.pos = I->step.tok_pos;
    /* every job checked before any is launched: a bad one leaves no output written */
    for (int i = 0; i < n; i++) {
        const ds_rmsnorm_params *p = &jobs[i];
        if (p->rope_inv_freq && (p->T > I->step.T || p->rope_half < 0 || 2 * p->rope_half > p->n))
            return dsc_failmsg(err, op, "job %d: rope_half %d on %d rows of %d in a step of %d rows", i, p->rope_half,
                               p->T, p->n, I->step.T);
    }
    int nj = 0;
    for (int i = 0; i < n; i++) {
        const ds_rmsnorm_params *p = &jobs[i];
        if (p->T <= 0) continue;
        a.j[nj++] = {p->x, p->w, p->out, p->T, p->n, p->eps, p->rope_inv_freq, p->rope_half};
        if (nj == DSC_NORM_JOBS) {
            launch_norms(I->stream, a, nj);
            nj = 0;
        }
    }
    if (nj) launch_norms(I->stream, a, nj);
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
    for (int i = lane; i < half; i += 32) dsc_rope_pair(p[2 * i], p[2 * i + 1], inv_freq[i], fp, inverse);
}

extern "C" int dsc_rope(const ds_backend *be, const ds_rope_params *p, ds_err *err) {
    const char *op = "rope";
    if (dsc_use_lane(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (p->T <= 0 || p->H <= 0) return 0;
    if (p->T > I->step.T) return dsc_failmsg(err, op, "%d rows but the step has %d", p->T, I->step.T);
    if (2 * p->half > p->d) return dsc_failmsg(err, op, "rope width %d > head dim %d", 2 * p->half, p->d);
    size_t warps = (size_t)p->T * p->H;
    unsigned blocks = (unsigned)((warps + 7) / 8);
    dsc_launch(rope_kernel, blocks, 256, 0, dsc_st(I), p->x, p->T, p->H, p->d, p->half, p->inv_freq, p->norm,
               p->inverse, p->eps, I->step.tok_pos);
    return dsc_check_launch(err, op);
}
