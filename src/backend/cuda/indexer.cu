/* indexer.cu — the lightning indexer's exact top-k (paper §2.3.1).
 *
 * scores: one warp per (row t, entry w): per head, dot = xor-tree(lane fmaf
 *   chains over channels lane, lane+32, ...); ORDER: s = s + relu(dot) *
 *   (1/sqrtf(dh)) * (iw[t][h] * wscale), heads ascending; NaN -> -inf.
 * select: one block per row, an exact radix select over the 32-bit order
 *   keys of the scores (integer histograms: order-free), then the chosen
 *   entries written in ascending index order: all scores above the k-th
 *   value, and of those equal to it the lowest indices (ties to the lower
 *   index). Rows with at most topk visible entries keep them all.
 * Rows are processed in chunks so the score buffer stays bounded; a row's
 * arithmetic does not depend on the chunk. */
#include "backend/cuda/internal.h"

struct idx_args {
    int layer, n_layers, ratio, nh, dh, topk;
    const float *iq, *iw;
    float wscale;
    int *sel, *n_sel;
    int t0;                     /* first row of the chunk */
    size_t stride;              /* floats per row of the score buffer */
    float *scores;              /* [chunk][stride] */
    const int *tok_seq;
    const int64_t *tok_pos;
    const ds_layer_mem *mem;
};

__global__ void __launch_bounds__(DSC_IDX_WARPS * 32) idx_score_kernel(idx_args a) {
    DSC_PDL_WAIT();
    extern __shared__ float qs[]; /* [nh*dh] then [nh] weights */
    int t = a.t0 + blockIdx.y, lane = threadIdx.x & 31;
    int nv = (int)((a.tok_pos[t] + 1) / a.ratio);
    if (nv <= a.topk) return;
    int nhd = a.nh * a.dh;
    float *wq = qs + nhd;
    for (int i = threadIdx.x; i < nhd; i += blockDim.x) qs[i] = a.iq[(size_t)t * nhd + i];
    for (int h = threadIdx.x; h < a.nh; h += blockDim.x) wq[h] = a.iw[(size_t)t * a.nh + h] * a.wscale;
    __syncthreads();
    const float *K0 = a.mem[(size_t)a.tok_seq[t] * a.n_layers + a.layer].icomp.entries;
    float rs = 1.0f / sqrtf((float)a.dh);
    float *out = a.scores + (size_t)blockIdx.y * a.stride;
    for (int w = blockIdx.x * DSC_IDX_WARPS + (threadIdx.x >> 5); w < nv; w += gridDim.x * DSC_IDX_WARPS) {
        const float *K = K0 + (size_t)w * a.dh;
        float s = 0.0f;
        for (int h = 0; h < a.nh; h++) {
            const float *q = qs + h * a.dh;
            float dot = 0.0f;
            for (int i = lane; i < a.dh; i += 32) dot = fmaf(q[i], K[i], dot);
            dot = dsc_warp_sum(dot);
            s = s + (dot > 0.0f ? dot : 0.0f) * rs * wq[h];
        }
        if (lane == 0) out[w] = isnan(s) ? -INFINITY : s;
    }
}

__device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f); /* -0 ties +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(DSC_IDX_SEL_THREADS) idx_select_kernel(idx_args a) {
    DSC_PDL_WAIT();
    __shared__ int hist[256];
    __shared__ uint32_t sh_prefix, sh_mask;
    __shared__ int sh_need, wtot[2][32];
    int t = a.t0 + blockIdx.x, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
    int nv = (int)((a.tok_pos[t] + 1) / a.ratio);
    int *out = a.sel + (size_t)t * a.topk;
    if (nv <= a.topk) {
        for (int w = tid; w < nv; w += blockDim.x) out[w] = w;
        if (tid == 0) a.n_sel[t] = nv;
        return;
    }
    const float *sc = a.scores + (size_t)blockIdx.x * a.stride;
    if (tid == 0) {
        sh_prefix = 0;
        sh_mask = 0;
        sh_need = a.topk;
    }
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        uint32_t prefix = sh_prefix, mask = sh_mask;
        for (int w = tid; w < nv; w += blockDim.x) {
            uint32_t k = order_key(sc[w]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int need = sh_need, cum = 0, b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= need) break;
                cum += hist[b];
            }
            sh_need = need - cum;
            sh_prefix = prefix | ((uint32_t)b << shift);
            sh_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    uint32_t kstar = sh_prefix;
    int need_eq = sh_need; /* entries equal to the k-th key to take, lowest indices first */
    int base_out = 0, base_eq = 0;
    for (int w0 = 0; w0 < nv; w0 += blockDim.x) {
        int w = w0 + tid;
        uint32_t k = w < nv ? order_key(sc[w]) : 0;
        int gt = w < nv && k > kstar, eq = w < nv && k == kstar;
        unsigned lt = (1u << lane) - 1u;
        unsigned beq = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) wtot[0][wid] = __popc(beq);
        __syncthreads();
        int pre_eq = base_eq + __popc(beq & lt);
        for (int i = 0; i < wid; i++) pre_eq += wtot[0][i];
        int take = gt || (eq && pre_eq < need_eq);
        unsigned btk = __ballot_sync(0xffffffffu, take);
        if (lane == 0) wtot[1][wid] = __popc(btk);
        __syncthreads();
        int pos = base_out + __popc(btk & lt);
        for (int i = 0; i < wid; i++) pos += wtot[1][i];
        if (take) out[pos] = w;
        int se = 0, st = 0;
        for (int i = 0; i < nw; i++) {
            se += wtot[0][i];
            st += wtot[1][i];
        }
        base_eq += se;
        base_out += st;
        __syncthreads();
    }
    if (tid == 0) a.n_sel[t] = a.topk;
}

extern "C" int dsc_indexer(const ds_backend *be, const ds_indexer_params *p, ds_err *err) {
    const char *op = "indexer";
    if (dsc_use_lane(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    const dsc_step *st = &I->step;
    int T = st->T;
    if (T <= 0) return 0;
    if (p->ratio <= 0 || p->topk <= 0 || p->nh <= 0 || p->dh <= 0)
        return dsc_failmsg(err, op, "ratio %d, topk %d, heads %d x %d", p->ratio, p->topk, p->nh, p->dh);
    if (p->layer < 0 || p->layer >= st->n_layers) return dsc_failmsg(err, op, "layer %d of %d", p->layer, st->n_layers);
    size_t smem = sizeof(float) * ((size_t)p->nh * p->dh + p->nh);
    if (smem > I->smem_optin) return dsc_failmsg(err, op, "query of %d x %d does not fit shared memory", p->nh, p->dh);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(idx_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return dsc_fail(err, op, "shared memory limit", e);
    }
    int64_t maxnv = (st->max_pos + 1) / p->ratio;
    size_t stride = (size_t)(maxnv > 0 ? maxnv : 1);
    stride = (stride + 3) & ~(size_t)3;
    /* rows per chunk: scores of a chunk within 256 MiB */
    size_t per = ((size_t)256 << 20) / (stride * sizeof(float));
    int chunk = per < 1 ? 1 : per > (size_t)T ? T : (int)per;
    if (chunk > 65535) chunk = 65535;
    float *scores = (float *)dsc_scratch(I, DSC_S_IDX, stride * (size_t)chunk * sizeof(float), err, op);
    if (!scores) return -1;
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        idx_args a = {p->layer, st->n_layers, p->ratio, p->nh, p->dh, p->topk, p->iq, p->iw, p->wscale, p->sel,
                      p->n_sel, t0, stride, scores, st->tok_seq, st->tok_pos, st->mem};
        size_t gx = (stride + DSC_IDX_WARPS - 1) / DSC_IDX_WARPS;
        size_t cap = (size_t)4 * I->n_sm; /* enough warps per row; the grid never changes a score */
        dim3 grid((unsigned)(gx < cap ? gx : cap), (unsigned)n);
        dsc_launch(idx_score_kernel, grid, DSC_IDX_WARPS * 32, smem, dsc_st(I), a);
        if (dsc_check_launch(err, op)) return -1;
        dsc_launch(idx_select_kernel, (unsigned)n, DSC_IDX_SEL_THREADS, 0, dsc_st(I), a);
        if (dsc_check_launch(err, op)) return -1;
    }
    return 0;
}
