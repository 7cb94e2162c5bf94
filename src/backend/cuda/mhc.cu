/* mhc.cu — manifold-constrained hyper-connections (paper §2.2): the mixes
 * m = fn @ (X / rms(X)) over the n*D stream values (rmsnorm + matmul, so they
 * have those ops' bits), then per token (one block): pre / post gates, the
 * Sinkhorn-normalized comb (thread 0, in the CPU code's loop order), and the
 * stream sums, which run over i = 0..n-1 ascending per channel. */
#include <limits.h>

#include "backend/cuda/internal.h"

#define HC_MAXN 16

/* The Sinkhorn-normalized comb on warp 0 (n * n <= 32), lane i*n+j holds
 * comb[i][j]: every sum reads the row's or column's values by shuffles in
 * the order of the one-thread loop (hc_pre_kernel's n * n > 32 branch), so
 * the bits are that loop's. N: n known at compile time (the shuffles of a
 * sum issue together; the adds keep their order), 0: any n. */
template <int N>
__device__ __forceinline__ void hc_sinkhorn_warp(const float *__restrict__ mt, const float *__restrict__ base,
                                                 const float *__restrict__ sc, int nr, int iters, float eps,
                                                 float *__restrict__ post, float *__restrict__ comb) {
    const int n = N ? N : nr;
    int lane = threadIdx.x, i = lane / n, j = lane % n, act = lane < n * n;
    if (lane < n) post[lane] = 2.0f * dsc_sigmoid(mt[n + lane] * sc[1] + base[n + lane]);
    float c = act ? mt[2 * n + lane] * sc[2] + base[2 * n + lane] : 0.0f;
    float mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int q = 0; q < (N ? N : HC_MAXN); q++)
        if (N || q < n) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, (i * n + q) & 31));
    c = expf(c - mx);
#pragma unroll
    for (int q = 0; q < (N ? N : HC_MAXN); q++)
        if (N || q < n) sum += __shfl_sync(0xffffffffu, c, (i * n + q) & 31);
    c = c / sum + eps;
    for (int it = 0; it < iters; it++) {
        float s2 = 0.0f;
        if (it > 0) {
#pragma unroll
            for (int q = 0; q < (N ? N : HC_MAXN); q++)
                if (N || q < n) s2 += __shfl_sync(0xffffffffu, c, (i * n + q) & 31);
            c /= s2 + eps;
        }
        s2 = 0.0f;
#pragma unroll
        for (int q = 0; q < (N ? N : HC_MAXN); q++)
            if (N || q < n) s2 += __shfl_sync(0xffffffffu, c, (q * n + j) & 31);
        c /= s2 + eps;
    }
    if (act) comb[lane] = c;
}

/* m: [T][(2+n)n]; X: [T][n][D]. Blocks y < gridDim.y - 1 of token t: the pre
 * gates and the stream sums of their channels; the last block: the post
 * gates and the comb (its Sinkhorn no longer delays the sums: the same
 * values, each computed once). */
__global__ void hc_pre_kernel(const float *__restrict__ m, const float *__restrict__ base,
                              const float *__restrict__ sc, const float *__restrict__ X, int n, int D, int iters,
                              float eps, float *__restrict__ x_in, float *__restrict__ post,
                              float *__restrict__ comb) {
    DSC_PDL_WAIT();
    __shared__ float pre[HC_MAXN];
    size_t t = blockIdx.x;
    int rows = (2 + n) * n;
    const float *mt = m + t * rows;
    if (blockIdx.y == gridDim.y - 1) {
        if (n == 4) {
            if (threadIdx.x < 32) hc_sinkhorn_warp<4>(mt, base, sc, n, iters, eps, post + t * n, comb + t * n * n);
        } else if (n * n <= 32) {
            if (threadIdx.x < 32) hc_sinkhorn_warp<0>(mt, base, sc, n, iters, eps, post + t * n, comb + t * n * n);
        } else if (threadIdx.x == 0) {
            float *po = post + t * n, *C = comb + t * n * n;
            for (int i = 0; i < n; i++) po[i] = 2.0f * dsc_sigmoid(mt[n + i] * sc[1] + base[n + i]);
            float c[HC_MAXN * HC_MAXN];
            for (int i = 0; i < n; i++) { /* row-wise softmax, then + eps */
                float mx = -INFINITY, sum = 0.0f;
                for (int j = 0; j < n; j++) {
                    c[i * n + j] = mt[2 * n + i * n + j] * sc[2] + base[2 * n + i * n + j];
                    mx = fmaxf(mx, c[i * n + j]);
                }
                for (int j = 0; j < n; j++) sum += (c[i * n + j] = expf(c[i * n + j] - mx));
                for (int j = 0; j < n; j++) c[i * n + j] = c[i * n + j] / sum + eps;
            }
            for (int it = 0; it < iters; it++) {
                if (it > 0)
                    for (int i = 0; i < n; i++) {
                        float s = 0.0f;
                        for (int j = 0; j < n; j++) s += c[i * n + j];
                        for (int j = 0; j < n; j++) c[i * n + j] /= s + eps;
                    }
                for (int j = 0; j < n; j++) {
                    float s = 0.0f;
                    for (int i = 0; i < n; i++) s += c[i * n + j];
                    for (int i = 0; i < n; i++) c[i * n + j] /= s + eps;
                }
            }
            for (int i = 0; i < n * n; i++) C[i] = c[i];
        }
        return;
    }
    if (threadIdx.x < n) pre[threadIdx.x] = dsc_sigmoid(mt[threadIdx.x] * sc[0] + base[threadIdx.x]) + eps;
    __syncthreads();
    const float *Xt = X + t * (size_t)n * D;
    int ny = gridDim.y - 1;
    for (int k = blockIdx.y * blockDim.x + threadIdx.x; k < D; k += ny * blockDim.x) {
        float s = pre[0] * Xt[k];
        for (int i = 1; i < n; i++) s += pre[i] * Xt[(size_t)i * D + k];
        x_in[t * D + k] = s;
    }
}

/* m: [R][n] */
__global__ void hc_head_kernel(const float *__restrict__ m, const float *__restrict__ base,
                               const float *__restrict__ sc, const float *__restrict__ X, int n, int D, float eps,
                               float *__restrict__ x) {
    DSC_PDL_WAIT();
    __shared__ float pre[HC_MAXN];
    size_t t = blockIdx.x;
    if (threadIdx.x < n) pre[threadIdx.x] = dsc_sigmoid(m[t * n + threadIdx.x] * sc[0] + base[threadIdx.x]) + eps;
    __syncthreads();
    const float *Xt = X + t * (size_t)n * D;
    for (int k = blockIdx.y * blockDim.x + threadIdx.x; k < D; k += gridDim.y * blockDim.x) {
        float s = pre[0] * Xt[k];
        for (int i = 1; i < n; i++) s += pre[i] * Xt[(size_t)i * D + k];
        x[t * D + k] = s;
    }
}

/* Xout[t][j][k] = post_j * y[t][k] + sum_i comb[i][j] X[t][i][k], i
 * ascending (each product rounded, then added: --fmad=false). Block row
 * blockIdx.y takes (t, j) pairs tj, tj + gridDim.y, ...; a thread V
 * consecutive k (V = 4: float4 loads where D % 4 == 0 and the rows are
 * 16-byte aligned). One index division per pair, none per element (the
 * flat-index version did three 64-bit divisions per element: ncu, prefill
 * 512, 109 us a call). Not ORDER: each element's operations are unchanged. */
template <int V>
__global__ void hc_post_kernel(int n, int D, int Tn, const float *__restrict__ X, const float *__restrict__ y,
                               const float *__restrict__ post, const float *__restrict__ comb,
                               float *__restrict__ Xout) {
    DSC_PDL_WAIT();
    int k = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (k >= D) return;
    for (int tj = blockIdx.y; tj < Tn; tj += gridDim.y) {
        int t = tj / n, j = tj - t * n;
        const float *Xt = X + (size_t)t * n * D + k, *C = comb + (size_t)t * n * n, *yt = y + (size_t)t * D + k;
        float pj = post[tj], *o = Xout + (size_t)tj * D + k;
        if (V == 4) {
            float c = C[j];
            float4 x = *(const float4 *)Xt, s = make_float4(c * x.x, c * x.y, c * x.z, c * x.w);
            for (int i = 1; i < n; i++) {
                c = C[i * n + j];
                x = *(const float4 *)(Xt + (size_t)i * D);
                s = make_float4(s.x + c * x.x, s.y + c * x.y, s.z + c * x.z, s.w + c * x.w);
            }
            float4 yv = *(const float4 *)yt;
            *(float4 *)o = make_float4(pj * yv.x + s.x, pj * yv.y + s.y, pj * yv.z + s.z, pj * yv.w + s.w);
        } else {
            float s = C[j] * Xt[0];
            for (int i = 1; i < n; i++) s += C[i * n + j] * Xt[(size_t)i * D];
            o[0] = pj * yt[0] + s;
        }
    }
}

/* m[t][r] = fn[r] . f[t] for the few mix rows over the long n*D axis (a
 * warp per row would read 64 KB alone): the axis is cut into HC_SEG-element
 * segments; a warp reduces a segment in the row-dot order (dsc_row_dot: lane
 * chunks ascending, xor tree), then thread j adds its token's segment sums in
 * ascending segment order, y = ((0 + s0) + s1) + ... ORDER: fixed by n*D
 * (and HC_SEG), never by T or the tile. Unscaled kinds only (fn is F32).
 * FUSE (one token tile: decode): f = X / rms(X) is not stored: every block computes its tokens' 1 / rms in
 * rmsnorm's order (thread i of 256 chains fmaf over x[i], x[i+256], ...; the
 * warp trees; warp 0's tree over the 8 warp sums; r = 1 / sqrtf(ms + eps))
 * and the dot takes x * r, the value rmsnorm would have written: the bits of
 * rmsnorm then the mix, one kernel instead of two (more tokens: X is f,
 * stored by rmsnorm first; every block would redo its tokens' sums).
 * PRE (below): at decode each warp's weight segment is loaded before the 1 /
 * rms, so its DRAM latency runs under the rms's chain instead of after it
 * (ncu, flash 4 layers, one token: 9.0 -> 7.7 us a call, 9 calls a token;
 * ptxas: 16 bytes of spills at the 128-register cap). */
#define HC_SEG 1024
#define HC_MAXSEG 64
#define HC_MIX_NT 8
#define HC_MIX_THREADS 512 /* 16 warps: a warp per segment of a 16384-value row (not ORDER) */
template <int KIND, bool FUSE>
__global__ void __launch_bounds__(HC_MIX_THREADS) hc_mix_kernel(dsc_w w, const float *__restrict__ X, int T, int tpb,
                                                                float eps, float *__restrict__ m) {
    DSC_PDL_WAIT();
    __shared__ float seg[HC_MIX_NT][HC_MAXSEG];
    __shared__ float wsum[HC_MIX_NT][8], rs[HC_MIX_NT];
    int r = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5, K = w.cols;
    int nseg = (K + HC_SEG - 1) / HC_SEG, xvec = ((uintptr_t)X & 15) == 0 && K % 4 == 0;
    size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    /* PRE (F32 rows of whole 16-byte aligned segments, one segment a warp):
     * the warp's segment of the row in registers before the 1 / rms (its
     * DRAM latency under the rms's chain); the dot then dsc_row_dot's
     * operations on them in the same order */
    constexpr int NPW = KIND == DS_W_F32 && FUSE ? HC_SEG / 4 / 32 : 1; /* a lane's chunks of a segment */
    const bool PRE = KIND == DS_W_F32 && FUSE && xvec && K % HC_SEG == 0 && nseg <= nw &&
                     ((uintptr_t)w.data & 15) == 0 && rowbytes % 16 == 0;
    float4 pw[NPW];
    if (PRE && wid < nseg) {
        const float4 *wr = (const float4 *)(w.data + (size_t)r * rowbytes) + (size_t)wid * (HC_SEG / 4);
#pragma unroll
        for (int u = 0; u < NPW; u++) pw[u] = __ldg(wr + lane + 32 * u);
    }
    for (int t0 = blockIdx.y * tpb; t0 < T; t0 += gridDim.y * tpb) {
        int nt = T - t0 < tpb ? T - t0 : tpb;
        /* 1 / rms: the threads in halves of DSC_ROW_THREADS, half h takes tokens h, h + 2, ... */
        if (FUSE) {
            int ti = threadIdx.x % DSC_ROW_THREADS, h = threadIdx.x / DSC_ROW_THREADS;
            int nh = HC_MIX_THREADS / DSC_ROW_THREADS;
            for (int tj = h; tj < nt; tj += nh) {
                const float *xr = X + (size_t)(t0 + tj) * (size_t)K;
                float s = dsc_warp_sum(dsc_sumsq_part<32>(xr, K, ti)); /* rmsnorm's chain */
                if (lane == 0) wsum[tj][(ti >> 5)] = s;
            }
            __syncthreads();
            if (wid < nt) {
                float q = lane < DSC_ROW_THREADS / 32 ? wsum[wid][lane] : 0.0f;
                q = dsc_warp_sum(q);
                if (lane == 0) rs[wid] = 1.0f / sqrtf(q / (float)K + eps);
            }
            __syncthreads();
        }
        if (PRE) {
            if (wid < nseg) {
                float acc[HC_MIX_NT];
#pragma unroll
                for (int j = 0; j < HC_MIX_NT; j++) acc[j] = 0.0f;
#pragma unroll
                for (int u = 0; u < NPW; u++)
#pragma unroll
                    for (int j = 0; j < HC_MIX_NT; j++) {
                        if (j >= nt) break;
                        const float *xs = X + (size_t)(t0 + j) * (size_t)K + (size_t)wid * HC_SEG;
                        float4 x4 = ((const float4 *)xs)[lane + 32 * u];
                        x4 = make_float4(x4.x * rs[j], x4.y * rs[j], x4.z * rs[j], x4.w * rs[j]);
                        float a = acc[j];
                        a = fmaf(pw[u].x, x4.x, a);
                        a = fmaf(pw[u].y, x4.y, a);
                        a = fmaf(pw[u].z, x4.z, a);
                        a = fmaf(pw[u].w, x4.w, a);
                        acc[j] = a;
                    }
#pragma unroll
                for (int j = 0; j < HC_MIX_NT; j++) {
                    float a = dsc_warp_sum(acc[j]);
                    if (lane == 0 && j < nt) seg[j][wid] = a;
                }
            }
        } else /* any kind and shape: the warps take the segments in turns */
        for (int s = wid; s < nseg; s += nw) {
            int c0 = s * HC_SEG;
            dsc_w v = w;
            v.data = w.data + (size_t)r * rowbytes + (size_t)c0 * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
            v.rows = 1;
            v.cols = K - c0 < HC_SEG ? K - c0 : HC_SEG;
            const float *xj[HC_MIX_NT];
            float acc[HC_MIX_NT];
#pragma unroll
            for (int j = 0; j < HC_MIX_NT; j++) {
                xj[j] = X + (size_t)(t0 + (j < nt ? j : 0)) * (size_t)K + c0;
                acc[j] = 0.0f;
            }
            dsc_row_dot<KIND, HC_MIX_NT, FUSE>(v, 0, lane, xj, nt, xvec, acc, rs);
#pragma unroll
            for (int j = 0; j < HC_MIX_NT; j++) {
                float a = dsc_warp_sum(acc[j]);
                if (lane == 0 && j < nt) seg[j][s] = a;
            }
        }
        __syncthreads();
        if ((int)threadIdx.x < nt) {
            float y = 0.0f;
            for (int s = 0; s < nseg; s++) y = y + seg[threadIdx.x][s];
            m[(size_t)(t0 + threadIdx.x) * gridDim.x + r] = y;
        }
        __syncthreads();
    }
}

/* The same m for many tokens: a block takes HC_MIX_RG rows (F32 rows, 16-byte
 * aligned, K % 4 == 0), so each token's f is read once per row group instead
 * of once per row (prefill: 24 rows x 64 KB per token). A lane walks its
 * chunks l, l+32, ... of the segment ascending and adds each element by one
 * fmaf per (row, token), the xor tree per segment, the segments in order:
 * exactly hc_mix_kernel<DS_W_F32, false>'s (dsc_row_dot's) operations, so the bits
 * are the same (test_cuda_ops: test_mhc at 1 and many tokens). */
#define HC_MIX_RG 8
#define HC_MIX_RG_MIN_T 32 /* tokens from which the row groups pay (not ORDER) */
__global__ void __launch_bounds__(256) hc_mix_rg_kernel(dsc_w w, const float *__restrict__ f, int T,
                                                        float *__restrict__ m) {
    DSC_PDL_WAIT();
    extern __shared__ float seg[]; /* [HC_MIX_RG][HC_MIX_NT][nseg] */
    int r0 = blockIdx.x * HC_MIX_RG, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int K = w.cols, rows = w.rows, nseg = (K + HC_SEG - 1) / HC_SEG;
    for (int t0 = blockIdx.y * HC_MIX_NT; t0 < T; t0 += gridDim.y * HC_MIX_NT) {
        int nt = T - t0 < HC_MIX_NT ? T - t0 : HC_MIX_NT;
        for (int s = wid; s < nseg; s += nw) {
            int c0 = s * HC_SEG, nch = (K - c0 < HC_SEG ? K - c0 : HC_SEG) / 4;
            const float4 *wr[HC_MIX_RG], *xr[HC_MIX_NT];
            float acc[HC_MIX_RG][HC_MIX_NT];
#pragma unroll
            for (int q = 0; q < HC_MIX_RG; q++) {
                int r = r0 + q < rows ? r0 + q : rows - 1;
                wr[q] = (const float4 *)(w.data + (size_t)r * (size_t)K * 4) + c0 / 4;
#pragma unroll
                for (int j = 0; j < HC_MIX_NT; j++) acc[q][j] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < HC_MIX_NT; j++) xr[j] = (const float4 *)(f + (size_t)(t0 + (j < nt ? j : 0)) * (size_t)K + c0);
#pragma unroll 1
            for (int ch = lane; ch < nch; ch += 32) {
                float4 xv[HC_MIX_NT];
#pragma unroll
                for (int j = 0; j < HC_MIX_NT; j++) xv[j] = xr[j][ch];
#pragma unroll
                for (int q = 0; q < HC_MIX_RG; q++) {
                    float4 wv = __ldg(wr[q] + ch);
#pragma unroll
                    for (int j = 0; j < HC_MIX_NT; j++) {
                        float a = acc[q][j];
                        a = fmaf(wv.x, xv[j].x, a);
                        a = fmaf(wv.y, xv[j].y, a);
                        a = fmaf(wv.z, xv[j].z, a);
                        a = fmaf(wv.w, xv[j].w, a);
                        acc[q][j] = a;
                    }
                }
            }
#pragma unroll
            for (int q = 0; q < HC_MIX_RG; q++)
#pragma unroll
                for (int j = 0; j < HC_MIX_NT; j++) {
                    float a = dsc_warp_sum(acc[q][j]);
                    if (lane == 0) seg[((size_t)q * HC_MIX_NT + j) * nseg + s] = a;
                }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < HC_MIX_RG * nt; i += blockDim.x) {
            int q = i / nt, j = i % nt;
            if (r0 + q >= rows) continue;
            float y = 0.0f;
            for (int s = 0; s < nseg; s++) y = y + seg[((size_t)q * HC_MIX_NT + j) * nseg + s];
            m[(size_t)(t0 + j) * rows + r0 + q] = y;
        }
        __syncthreads();
    }
}

/* m = fn @ (X / rms(X)) (scratch B; scaled fn kinds: f = X / rms(X) in scratch A first). */
static float *mixes(const ds_backend *be, const ds_hc_params *hc, const float *X, int T, int mrows, ds_err *err,
                    const char *op) {
    dsc_impl *I = dsc_of(be);
    size_t nd = (size_t)hc->n * hc->D;
    if (hc->n > HC_MAXN || hc->n <= 0) {
        dsc_failmsg(err, op, "hc_mult %d outside 1..%d", hc->n, HC_MAXN);
        return NULL;
    }
    if (hc->fn->cols != (int)nd || hc->fn->rows != mrows) {
        dsc_failmsg(err, op, "fn is [%d, %d], expected [%d, %zu]", hc->fn->rows, hc->fn->cols, mrows, nd);
        return NULL;
    }
    float *m = (float *)dsc_scratch(I, DSC_S_B, sizeof(float) * (size_t)T * mrows, err, op);
    if (!m) return NULL;
    dsc_w w = dsc_wdesc(hc->fn);
    int kind = nd <= (size_t)HC_SEG * HC_MAXSEG ? hc->fn->kind : -1; /* longer rows: the plain product */
    int fuse = T <= HC_MIX_NT && (kind == DS_W_F32 || kind == DS_W_BF16 || kind == DS_W_F16);
    /* tokens per block (not ORDER): one when fused (decode: rows x T blocks;
     * 8 a block left 24 blocks busy at T = 8, 43 us a call), else HC_MIX_NT */
    int tpb = fuse ? 1 : HC_MIX_NT, ty = (T + tpb - 1) / tpb;
    dim3 grid((unsigned)mrows, (unsigned)(ty < 65535 ? ty : 65535));
    const float *f = X;
    if (!fuse) {
        float *fs = (float *)dsc_scratch(I, DSC_S_A, sizeof(float) * (size_t)T * nd, err, op);
        if (!fs) return NULL;
        dsc_launch_rmsnorm(I->stream, X, NULL, fs, T, (int)nd, hc->rms_eps);
        f = fs;
    }
    float eps = hc->rms_eps;
    /* many tokens, F32 rows in 16-byte chunks: a block per row group (the same bits) */
    if (!fuse && kind == DS_W_F32 && T >= HC_MIX_RG_MIN_T && nd % 4 == 0 && ((uintptr_t)w.data & 15) == 0 &&
        ((uintptr_t)f & 15) == 0) {
        dim3 gr((unsigned)((mrows + HC_MIX_RG - 1) / HC_MIX_RG), grid.y);
        size_t sm = sizeof(float) * HC_MIX_RG * HC_MIX_NT * ((nd + HC_SEG - 1) / HC_SEG);
        dsc_launch(hc_mix_rg_kernel, gr, 256, sm, I->stream, w, f, T, m);
    } else {
        switch (kind) { /* one token tile: the rmsnorm fused (the same values) */
        case DS_W_F32:
            if (fuse)
                dsc_launch(hc_mix_kernel<DS_W_F32, true>, grid, HC_MIX_THREADS, 0, I->stream, w, X, T, tpb, eps, m);
            else
                dsc_launch(hc_mix_kernel<DS_W_F32, false>, grid, HC_MIX_THREADS, 0, I->stream, w, f, T, tpb, eps, m);
            break;
        case DS_W_BF16:
            if (fuse)
                dsc_launch(hc_mix_kernel<DS_W_BF16, true>, grid, HC_MIX_THREADS, 0, I->stream, w, X, T, tpb, eps, m);
            else
                dsc_launch(hc_mix_kernel<DS_W_BF16, false>, grid, HC_MIX_THREADS, 0, I->stream, w, f, T, tpb, eps, m);
            break;
        case DS_W_F16:
            if (fuse)
                dsc_launch(hc_mix_kernel<DS_W_F16, true>, grid, HC_MIX_THREADS, 0, I->stream, w, X, T, tpb, eps, m);
            else
                dsc_launch(hc_mix_kernel<DS_W_F16, false>, grid, HC_MIX_THREADS, 0, I->stream, w, f, T, tpb, eps, m);
            break;
        default: /* scaled kinds: the one-warp-per-row product (its own fixed order) */
            if (dsc_launch_matmul(I->stream, &I->scratch[DSC_S_XHL], hc->fn->kind, w, f, (int)nd, 0, 1 << 30, T, m,
                                  mrows)) {
                dsc_failmsg(err, op, "fn: unknown storage kind");
                return NULL;
            }
        }
    }
    if (dsc_check_launch(err, op)) return NULL;
    return m;
}

extern "C" int dsc_hc_pre(const ds_backend *be, const ds_hc_pre_params *p, ds_err *err) {
    const char *op = "hc_pre";
    if (dsc_use(be, err, op)) return -1;
    if (p->T <= 0) return 0;
    const ds_hc_params *hc = &p->hc;
    float *m = mixes(be, hc, p->X, p->T, (2 + hc->n) * hc->n, err, op);
    if (!m) return -1;
    /* the channel blocks, then one block for the comb */
    dim3 grid((unsigned)p->T, (unsigned)((hc->D + 255) / 256 < 64 ? (hc->D + 255) / 256 : 64) + 1);
    dsc_launch(hc_pre_kernel, grid, 256, 0, dsc_of(be)->stream, m, hc->base, hc->scale, p->X, hc->n, hc->D,
               hc->sinkhorn_iters, hc->hc_eps, p->x_in, p->post, p->comb);
    return dsc_check_launch(err, op);
}

extern "C" int dsc_hc_head(const ds_backend *be, const ds_hc_head_params *p, ds_err *err) {
    const char *op = "hc_head";
    if (dsc_use(be, err, op)) return -1;
    if (p->R <= 0) return 0;
    const ds_hc_params *hc = &p->hc;
    float *m = mixes(be, hc, p->X, p->R, hc->n, err, op);
    if (!m) return -1;
    dim3 grid((unsigned)p->R, (unsigned)((hc->D + 255) / 256 < 64 ? (hc->D + 255) / 256 : 64));
    dsc_launch(hc_head_kernel, grid, 256, 0, dsc_of(be)->stream, m, hc->base, hc->scale, p->X, hc->n, hc->D, hc->hc_eps,
               p->x);
    return dsc_check_launch(err, op);
}

extern "C" int dsc_hc_post(const ds_backend *be, const ds_hc_post_params *p, ds_err *err) {
    const char *op = "hc_post";
    if (dsc_use(be, err, op)) return -1;
    if (p->T <= 0 || p->n <= 0 || p->D <= 0) return 0;
    if ((size_t)p->T * p->n > INT_MAX)
        return dsc_failmsg(err, op, "%d tokens x %d streams exceed the grid", p->T, p->n);
    int Tn = p->T * p->n;
    int v4 = p->D % 4 == 0 && (((uintptr_t)p->X | (uintptr_t)p->y | (uintptr_t)p->Xout) & 15) == 0;
    int V = v4 ? 4 : 1;
    dim3 grid((unsigned)((p->D / V + DSC_EW_THREADS - 1) / DSC_EW_THREADS), (unsigned)(Tn < 65535 ? Tn : 65535));
    cudaStream_t st = dsc_of(be)->stream;
    if (v4)
        dsc_launch(hc_post_kernel<4>, grid, DSC_EW_THREADS, 0, st, p->n, p->D, Tn, p->X, p->y, p->post, p->comb,
                   p->Xout);
    else
        dsc_launch(hc_post_kernel<1>, grid, DSC_EW_THREADS, 0, st, p->n, p->D, Tn, p->X, p->y, p->post, p->comb,
                   p->Xout);
    return dsc_check_launch(err, op);
}
