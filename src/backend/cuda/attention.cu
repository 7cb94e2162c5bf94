/* attention.cu — sparse attention with sinks (paper §2.3, doc §3.2) and the
 * window ring store.
 *
 * One warp per (row t, head h). Keys in the fixed order of backend.h: the
 * window positions max(0, p-W+1) .. p ascending (this step's kv rows for
 * positions >= seq_pos0, else the ring), then the compressed entries (CSA:
 * sel[t][0..n_sel), HCA: 0 .. (p+1)/ratio - 1). K = V.
 * ORDER (design.md §1 rule 3): keys in blocks of DSC_ATT_KB (a fixed size),
 * merged in ascending block order by an online softmax:
 *   s_j = xor-tree(lane fmaf chains over the lane's float4 chunks) * scale
 *   per block: m' = max(m, max_j s_j); l, o *= expf(m - m'); then for each
 *   key ascending: p = expf(s_j - m'), l += p, o = fmaf(p, k_j, o)
 *   end: M = max(m, sink); out = o * (expf(m - M) / (l expf(m - M) + expf(sink - M))).
 * A key's contribution is the same whether it came from the ring or from
 * this step's rows: both are addressed by position. */
#include "backend/cuda/internal.h"

struct att_args {
    int layer, n_layers, T, H, d, W, ratio, topk;
    const float *q, *kv, *sink;
    const int *sel, *n_sel;
    float scale;
    float *out;
    const int *tok_seq, *seq_row0;
    const int64_t *tok_pos, *seq_pos0;
    const ds_layer_mem *mem;
};

template <int NC>
__global__ void __launch_bounds__(DSC_ATT_WARPS * 32) attn_kernel(att_args a) {
    __shared__ float sbuf[DSC_ATT_WARPS][DSC_ATT_KB];
    __shared__ const float *kptr[DSC_ATT_WARPS][DSC_ATT_KB];
    int lane = threadIdx.x & 31, wl = threadIdx.x >> 5;
    size_t wid = (size_t)blockIdx.x * DSC_ATT_WARPS + wl;
    if (wid >= (size_t)a.T * a.H) return;
    int t = (int)(wid / a.H), h = (int)(wid % a.H), d = a.d, d4 = d / 4;
    int s = a.tok_seq[t];
    int64_t p = a.tok_pos[t], pos0 = a.seq_pos0[s];
    int row0 = a.seq_row0[s];
    const ds_layer_mem *lm = &a.mem[(size_t)s * a.n_layers + a.layer];
    const float *ring = lm->ring, *ent = lm->comp.entries;
    int64_t lo = p - a.W + 1 < 0 ? 0 : p - a.W + 1;
    int nwin = (int)(p - lo + 1);
    int ncmp = a.sel ? a.n_sel[t] : a.ratio ? (int)((p + 1) / a.ratio) : 0;
    int n = nwin + ncmp;
    const int *sel = a.sel ? a.sel + (size_t)t * a.topk : NULL;

    const float4 *q4 = (const float4 *)(a.q + wid * (size_t)d);
    float4 q[NC], o[NC];
#pragma unroll
    for (int i = 0; i < NC; i++) {
        int c = lane + 32 * i;
        q[i] = c < d4 ? q4[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        o[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = -INFINITY, l = 0.0f;
    for (int b0 = 0; b0 < n; b0 += DSC_ATT_KB) {
        int nb = n - b0 < DSC_ATT_KB ? n - b0 : DSC_ATT_KB;
        /* the block's key addresses, one lane per key, so the loops below are
         * branch-free and can keep several keys' loads in flight */
        for (int jj = lane; jj < nb; jj += 32) {
            int j = b0 + jj;
            const float *k;
            if (j < nwin) {
                int64_t pp = lo + j;
                k = pp >= pos0 ? a.kv + (size_t)(row0 + (pp - pos0)) * d : ring + (size_t)(pp % a.W) * d;
            } else {
                int e = sel ? sel[j - nwin] : j - nwin;
                k = ent + (size_t)e * d;
            }
            kptr[wl][jj] = k;
        }
        __syncwarp();
        float bm = -INFINITY;
#pragma unroll 4
        for (int jj = 0; jj < nb; jj++) {
            const float *k = kptr[wl][jj];
            const float4 *k4 = (const float4 *)k;
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < NC; i++) {
                int c = lane + 32 * i;
                if (c < d4) {
                    float4 kk = k4[c];
                    dot = fmaf(q[i].x, kk.x, dot);
                    dot = fmaf(q[i].y, kk.y, dot);
                    dot = fmaf(q[i].z, kk.z, dot);
                    dot = fmaf(q[i].w, kk.w, dot);
                }
            }
            float sj = dsc_warp_sum(dot) * a.scale;
            if (lane == 0) sbuf[wl][jj] = sj;
            bm = fmaxf(bm, sj);
        }
        __syncwarp();
        float mn = fmaxf(m, bm);
        float al = expf(m - mn);
        l *= al;
#pragma unroll
        for (int i = 0; i < NC; i++) {
            o[i].x *= al;
            o[i].y *= al;
            o[i].z *= al;
            o[i].w *= al;
        }
#pragma unroll 4
        for (int jj = 0; jj < nb; jj++) {
            const float *k = kptr[wl][jj];
            float pj = expf(sbuf[wl][jj] - mn);
            l += pj;
            const float4 *k4 = (const float4 *)k;
#pragma unroll
            for (int i = 0; i < NC; i++) {
                int c = lane + 32 * i;
                if (c < d4) {
                    float4 kk = k4[c];
                    o[i].x = fmaf(pj, kk.x, o[i].x);
                    o[i].y = fmaf(pj, kk.y, o[i].y);
                    o[i].z = fmaf(pj, kk.z, o[i].z);
                    o[i].w = fmaf(pj, kk.w, o[i].w);
                }
            }
        }
        __syncwarp();
        m = mn;
    }
    float sink = a.sink[h];
    float M = fmaxf(m, sink);
    float al = expf(m - M);
    float inv = al / (l * al + expf(sink - M));
    float4 *o4 = (float4 *)(a.out + wid * (size_t)d);
#pragma unroll
    for (int i = 0; i < NC; i++) {
        int c = lane + 32 * i;
        if (c < d4) o4[c] = make_float4(o[i].x * inv, o[i].y * inv, o[i].z * inv, o[i].w * inv);
    }
}

extern "C" int dsc_attention(const ds_backend *be, const ds_attention_params *p, ds_err *err) {
    const char *op = "attention";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    const dsc_step *st = &I->step;
    if (p->T <= 0 || p->H <= 0) return 0;
    if (p->T != st->T) return dsc_failmsg(err, op, "%d rows but the step has %d", p->T, st->T);
    if (p->d % 4 || p->d > DSC_ATT_MAXD) return dsc_failmsg(err, op, "head dim %d: need d %% 4 == 0, d <= %d", p->d, DSC_ATT_MAXD);
    if (p->layer < 0 || p->layer >= st->n_layers) return dsc_failmsg(err, op, "layer %d of %d", p->layer, st->n_layers);
    if (((uintptr_t)p->q | (uintptr_t)p->kv | (uintptr_t)p->out) & 15)
        return dsc_failmsg(err, op, "q, kv and out must be 16-byte aligned");
    double t0 = 0;
    if (be->profile) {
        cudaStreamSynchronize(I->stream);
        t0 = dsc_now();
    }
    att_args a = {p->layer, st->n_layers, p->T, p->H, p->d, p->window, p->ratio, p->topk, p->q, p->kv, p->sink,
                  p->sel, p->n_sel, p->scale, p->out, st->tok_seq, st->seq_row0, st->tok_pos, st->seq_pos0, st->mem};
    size_t warps = (size_t)p->T * p->H;
    unsigned blocks = (unsigned)((warps + DSC_ATT_WARPS - 1) / DSC_ATT_WARPS);
    int nc = (p->d / 4 + 31) / 32;
    if (nc <= 1) attn_kernel<1><<<blocks, DSC_ATT_WARPS * 32, 0, I->stream>>>(a);
    else if (nc <= 2) attn_kernel<2><<<blocks, DSC_ATT_WARPS * 32, 0, I->stream>>>(a);
    else if (nc <= 4) attn_kernel<4><<<blocks, DSC_ATT_WARPS * 32, 0, I->stream>>>(a);
    else attn_kernel<8><<<blocks, DSC_ATT_WARPS * 32, 0, I->stream>>>(a);
    if (dsc_check_launch(err, op)) return -1;
    if (be->profile) {
        cudaStreamSynchronize(I->stream);
        be->profile->attend_seconds += dsc_now() - t0;
    }
    return 0;
}

/* ring[(pos0 + i) % W] = kv[row0 + i] for the last min(n, W) rows i of each sequence */
__global__ void window_store_kernel(int layer, int n_layers, int W, int d, int T, const float *__restrict__ kv,
                                    const int *__restrict__ tok_seq, const int *__restrict__ seq_row0,
                                    const int *__restrict__ seq_n, const int64_t *__restrict__ seq_pos0,
                                    const ds_layer_mem *__restrict__ mem) {
    int t = blockIdx.y;
    int s = tok_seq[t], i = t - seq_row0[s], n = seq_n[s];
    if (i < n - W) return;
    float *ring = mem[(size_t)s * n_layers + layer].ring + (size_t)((seq_pos0[s] + i) % W) * d;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < d; c += gridDim.x * blockDim.x)
        ring[c] = kv[(size_t)t * d + c];
}

extern "C" int dsc_window_store(const ds_backend *be, const ds_window_store_params *p, ds_err *err) {
    const char *op = "window_store";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    const dsc_step *st = &I->step;
    if (st->T <= 0) return 0;
    if (st->T > 65535) return dsc_failmsg(err, op, "%d rows exceed the grid", st->T);
    if (p->layer < 0 || p->layer >= st->n_layers) return dsc_failmsg(err, op, "layer %d of %d", p->layer, st->n_layers);
    dim3 grid((unsigned)((p->d + 255) / 256), (unsigned)st->T);
    window_store_kernel<<<grid, 256, 0, I->stream>>>(p->layer, st->n_layers, p->window, p->d, st->T, p->kv,
                                                     st->tok_seq, st->seq_row0, st->seq_n, st->seq_pos0, st->mem);
    return dsc_check_launch(err, op);
}
