/* attention.cu — sparse attention with sinks (paper §2.3, doc §3.2) and the
 * window ring store.
 *
 * Keys of row t, head h in the fixed order of backend.h: the
 * window positions max(0, p-W+1) .. p ascending (this step's kv rows for
 * positions >= seq_pos0, else the ring), then the compressed entries (CSA:
 * sel[t][0..n_sel), HCA: 0 .. (p+1)/ratio - 1). K = V.
 * ORDER (docs/design.md §1 rule 3): keys in blocks of DSC_ATT_KB (a fixed size),
 * each block reduced on its own, the blocks merged in ascending order:
 *   part (one warp per (row, head, block)):
 *     s_j = xor-tree(lane fmaf chains over the lane's float4 chunks) * scale
 *     m_b = max_j s_j; p_j = expf(s_j - m_b); l_b = sum p_j ascending;
 *     o_b = fmaf(p_j, k_j, o_b) ascending
 *   merge (one warp per (row, head)), blocks ascending from M = -inf, L = O = 0:
 *     M' = max(M, m_b), a = expf(M - M'), c = expf(m_b - M');
 *     L = L a + l_b c; O = fmaf(c, o_b, O a); M = M'
 *   end: S = max(M, sink); out = O * (expf(M - S) / (L expf(M - S) + expf(sink - S))),
 *   then (out_inv_freq) the inverse rope on its pairs, dsc_rope_pair's operations.
 * The split is by block index, never by T: decode and prefill run the same
 * two kernels. Rows are processed in chunks so the partials stay bounded.
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
    int t0, nrows, nblk;        /* the chunk: rows [t0, t0 + nrows), blocks per (row, head) */
    float *part;                /* [nrows*H][nblk][2 + d]: m, l, o */
    const float *oinv;          /* the output's inverse rope (out_inv_freq), or NULL */
    int ohalf;
};

/* The keys of row t, in order. */
struct att_row {
    int64_t lo, pos0;
    int nwin, n, row0;
    const float *ring, *ent;
    const int *sel;
};

__device__ __forceinline__ att_row att_row_of(const att_args &a, int t) {
    att_row r;
    int s = a.tok_seq[t];
    int64_t p = a.tok_pos[t];
    r.pos0 = a.seq_pos0[s];
    r.row0 = a.seq_row0[s];
    const ds_layer_mem *lm = &a.mem[(size_t)s * a.n_layers + a.layer];
    r.ring = lm->ring;
    r.ent = lm->comp.entries;
    r.lo = p - a.W + 1 < 0 ? 0 : p - a.W + 1;
    r.nwin = (int)(p - r.lo + 1);
    int ncmp = a.sel ? a.n_sel[t] : a.ratio ? (int)((p + 1) / a.ratio) : 0;
    if (a.sel && ncmp > a.topk) ncmp = a.topk; /* the partials are sized for topk */
    r.n = r.nwin + ncmp;
    r.sel = a.sel ? a.sel + (size_t)t * a.topk : NULL;
    return r;
}

__device__ __forceinline__ const float *att_key(const att_args &a, const att_row &r, int j) {
    if (j < r.nwin) {
        int64_t pp = r.lo + j;
        return pp >= r.pos0 ? a.kv + (size_t)(r.row0 + (pp - r.pos0)) * a.d : r.ring + (size_t)(pp % a.W) * a.d;
    }
    int e = r.sel ? r.sel[j - r.nwin] : j - r.nwin;
    return r.ent + (size_t)e * a.d;
}

/* The HW heads' xor-tree sums (dsc_warp_sum) in fewer shuffles: at each of
 * the first log2(HW) levels a lane keeps half of its heads' partials and
 * sends the other half, which its xor partner keeps; both add the same pairs
 * as dsc_warp_sum at that level (fp addition commutes), so the sums are its
 * bits. Lane l ends with head att_head_of<HW>(l)'s sum; 4 heads: 6 shuffles
 * instead of 20. */
template <int HW> __device__ __forceinline__ int att_head_of(int lane) {
    return HW == 4 ? ((lane >> 4) & 1) * 2 + ((lane >> 3) & 1) : HW == 2 ? (lane >> 4) & 1 : 0;
}
/* the first lane that ends with head h's sum */
template <int HW> __device__ __forceinline__ int att_lane_of(int h) {
    return HW == 4 ? (h >> 1) * 16 + (h & 1) * 8 : h * 16;
}
template <int HW> __device__ __forceinline__ float att_sums(const float (&v)[HW], int lane) {
    static_assert(HW == 1 || HW == 2 || HW == 4, "1, 2 or 4 heads a warp");
    float u[HW];
#pragma unroll
    for (int h = 0; h < HW; h++) u[h] = v[h];
    int o = 16;
#pragma unroll
    for (int n = HW; n > 1; n /= 2, o /= 2) {
        bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            float keep = up ? u[i + n / 2] : u[i], send = up ? u[i] : u[i + n / 2];
            u[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    float r = u[0];
    for (; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

/* One warp per (row, HW consecutive heads, key block): the heads of a row
 * share its keys, so each key chunk is loaded once for HW heads (the loads
 * through L1, not the FMAs, bounded the one-head warp). Each head's
 * operations are the ORDER above, the same for every HW: the same bits. */
template <int NC, int HW>
__global__ void __launch_bounds__(DSC_ATT_WARPS * 32) attn_part_kernel(att_args a) {
    DSC_PDL_WAIT();
    __shared__ float sbuf[DSC_ATT_WARPS][HW][DSC_ATT_KB];
    __shared__ const float *kptr[DSC_ATT_WARPS][DSC_ATT_KB];
    int lane = threadIdx.x & 31, wl = threadIdx.x >> 5, ng = a.H / HW;
    size_t i = (size_t)blockIdx.x * DSC_ATT_WARPS + wl; /* (row, head group) of the chunk */
    if (i >= (size_t)a.nrows * ng) return;
    int t = a.t0 + (int)(i / ng), h0 = (int)(i % ng) * HW, d = a.d, d4 = d / 4, b = blockIdx.y;
    att_row r = att_row_of(a, t);
    int b0 = b * DSC_ATT_KB;
    if (b0 >= r.n) return;
    int nb = r.n - b0 < DSC_ATT_KB ? r.n - b0 : DSC_ATT_KB;

    float4 q[HW][NC];
#pragma unroll
    for (int h = 0; h < HW; h++) {
        const float4 *q4 = (const float4 *)(a.q + ((size_t)t * a.H + h0 + h) * (size_t)d);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int ch = lane + 32 * c;
            q[h][c] = ch < d4 ? q4[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    /* the block's key addresses, one lane per key: the loops below are
     * branch-free and keep several keys' loads in flight */
    for (int jj = lane; jj < nb; jj += 32) kptr[wl][jj] = att_key(a, r, b0 + jj);
    __syncwarp();
    const int hl = att_head_of<HW>(lane); /* the head whose score this lane ends with */
    float bml = -INFINITY;
#pragma unroll 2
    for (int jj = 0; jj < nb; jj++) {
        const float4 *k4 = (const float4 *)kptr[wl][jj];
        float4 kk[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int ch = lane + 32 * c;
            kk[c] = ch < d4 ? k4[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float dot[HW];
#pragma unroll
        for (int h = 0; h < HW; h++) {
            dot[h] = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (lane + 32 * c < d4) {
                    dot[h] = fmaf(q[h][c].x, kk[c].x, dot[h]);
                    dot[h] = fmaf(q[h][c].y, kk[c].y, dot[h]);
                    dot[h] = fmaf(q[h][c].z, kk[c].z, dot[h]);
                    dot[h] = fmaf(q[h][c].w, kk[c].w, dot[h]);
                }
            }
        }
        float sj = att_sums<HW>(dot, lane) * a.scale;
        if (lane == att_lane_of<HW>(hl)) sbuf[wl][hl][jj] = sj;
        bml = fmaxf(bml, sj);
    }
    float bm[HW]; /* each head's block maximum, to every lane */
#pragma unroll
    for (int h = 0; h < HW; h++) bm[h] = __shfl_sync(0xffffffffu, bml, att_lane_of<HW>(h));
    __syncwarp();
    float l[HW];
    float4 o[HW][NC];
#pragma unroll
    for (int h = 0; h < HW; h++) {
        l[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) o[h][c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll 2
    for (int jj = 0; jj < nb; jj++) {
        const float4 *k4 = (const float4 *)kptr[wl][jj];
        float4 kk[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int ch = lane + 32 * c;
            kk[c] = ch < d4 ? k4[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int h = 0; h < HW; h++) {
            float pj = expf(sbuf[wl][h][jj] - bm[h]);
            l[h] += pj;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                o[h][c].x = fmaf(pj, kk[c].x, o[h][c].x);
                o[h][c].y = fmaf(pj, kk[c].y, o[h][c].y);
                o[h][c].z = fmaf(pj, kk[c].z, o[h][c].z);
                o[h][c].w = fmaf(pj, kk[c].w, o[h][c].w);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < HW; h++) {
        size_t ih = (size_t)(t - a.t0) * a.H + h0 + h; /* (row, head) of the chunk */
        float *pt = a.part + (ih * a.nblk + b) * (size_t)(d + 4);
        if (lane == 0) {
            pt[0] = bm[h];
            pt[1] = l[h];
        }
        float4 *po = (float4 *)(pt + 4);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int ch = lane + 32 * c;
            if (ch < d4) po[ch] = o[h][c];
        }
    }
}

template <int NC>
__global__ void __launch_bounds__(DSC_ATT_WARPS * 32) attn_merge_kernel(att_args a) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, wl = threadIdx.x >> 5;
    size_t i = (size_t)blockIdx.x * DSC_ATT_WARPS + wl;
    if (i >= (size_t)a.nrows * a.H) return;
    int t = a.t0 + (int)(i / a.H), h = (int)(i % a.H), d = a.d, d4 = d / 4;
    att_row r = att_row_of(a, t);
    int nblk = (r.n + DSC_ATT_KB - 1) / DSC_ATT_KB;
    float4 O[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) O[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    float M = -INFINITY, L = 0.0f;
    for (int b = 0; b < nblk; b++) {
        const float *pt = a.part + (i * a.nblk + b) * (size_t)(d + 4);
        float mb = pt[0], lb = pt[1];
        float Mn = fmaxf(M, mb), al = expf(M - Mn), cb = expf(mb - Mn);
        L = L * al + lb * cb;
        const float4 *po = (const float4 *)(pt + 4);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int ch = lane + 32 * c;
            if (ch < d4) {
                float4 ob = po[ch];
                O[c].x = fmaf(cb, ob.x, O[c].x * al);
                O[c].y = fmaf(cb, ob.y, O[c].y * al);
                O[c].z = fmaf(cb, ob.z, O[c].z * al);
                O[c].w = fmaf(cb, ob.w, O[c].w * al);
            }
        }
        M = Mn;
    }
    float sink = a.sink[h];
    float S = fmaxf(M, sink);
    float al = expf(M - S);
    float inv = al / (L * al + expf(sink - S));
    float4 *o4 = (float4 *)(a.out + ((size_t)t * a.H + h) * (size_t)d);
    /* the inverse rope on the last 2 * ohalf channels: pairs (x, y), (z, w)
     * of a chunk (the span starts at an even channel), rope's operations */
    const int rb = d - 2 * a.ohalf;
    const float fp = (float)a.tok_pos[t];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        int ch = lane + 32 * c;
        if (ch < d4) {
            float4 v = make_float4(O[c].x * inv, O[c].y * inv, O[c].z * inv, O[c].w * inv);
            if (a.oinv && 4 * ch + 4 > rb) {
                if (4 * ch >= rb) dsc_rope_pair(v.x, v.y, a.oinv[(4 * ch - rb) / 2], fp, 1);
                dsc_rope_pair(v.z, v.w, a.oinv[(4 * ch + 2 - rb) / 2], fp, 1);
            }
            o4[ch] = v;
        }
    }
}

template <int NC, int HW> static void attn_part(const att_args &a, cudaStream_t st) {
    size_t warps = (size_t)a.nrows * (a.H / HW);
    dim3 g((unsigned)((warps + DSC_ATT_WARPS - 1) / DSC_ATT_WARPS), (unsigned)a.nblk);
    dsc_launch(attn_part_kernel<NC, HW>, g, DSC_ATT_WARPS * 32, 0, st, a);
}

/* the part kernel with the heads per warp of heuristics.h, then the merge */
template <int NC> static void attn_launch(const att_args &a, cudaStream_t st) {
    int hw = dsc_att_heads_per_warp(a.nrows, a.H, NC);
    if constexpr (NC <= 4) {
        if (hw == 4) attn_part<NC, 4>(a, st);
        else if (hw == 2) attn_part<NC, 2>(a, st);
        else attn_part<NC, 1>(a, st);
    } else attn_part<NC, 1>(a, st);
    size_t pairs = (size_t)a.nrows * a.H;
    dsc_launch(attn_merge_kernel<NC>, (unsigned)((pairs + DSC_ATT_WARPS - 1) / DSC_ATT_WARPS), DSC_ATT_WARPS * 32, 0,
               st, a);
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
    if (p->window <= 0) return dsc_failmsg(err, op, "window %d", p->window);
    if (((uintptr_t)p->q | (uintptr_t)p->kv | (uintptr_t)p->out) & 15)
        return dsc_failmsg(err, op, "q, kv and out must be 16-byte aligned");
    if (p->out_inv_freq && (p->out_rope_half < 0 || 2 * p->out_rope_half > p->d))
        return dsc_failmsg(err, op, "out_rope_half %d outside a head of %d", p->out_rope_half, p->d);
    double t0 = 0;
    if (be->profile) {
        cudaStreamSynchronize(I->stream);
        t0 = dsc_now();
    }
    /* the most keys a row of this step can have (host: no sync) */
    int64_t mp = st->max_pos;
    int64_t maxk = (mp + 1 < p->window ? mp + 1 : p->window) +
                   (p->sel ? p->topk : p->ratio ? (mp + 1) / p->ratio : 0);
    int64_t nblk = (maxk + DSC_ATT_KB - 1) / DSC_ATT_KB;
    if (nblk < 1) nblk = 1;
    if (nblk > 65535) return dsc_failmsg(err, op, "%lld key blocks exceed the grid", (long long)nblk);
    size_t per_row = (size_t)p->H * (size_t)nblk * (size_t)(p->d + 4) * sizeof(float);
    size_t rows = ((size_t)256 << 20) / per_row;
    if (rows < 1) rows = 1;
    if (rows > (size_t)p->T) rows = (size_t)p->T;
    float *part = (float *)dsc_scratch(I, DSC_S_ATT, rows * per_row, err, op);
    if (!part) return -1;
    int nc = (p->d / 4 + 31) / 32;
    for (int r0 = 0; r0 < p->T; r0 += (int)rows) {
        int nr = p->T - r0 < (int)rows ? p->T - r0 : (int)rows;
        att_args a = {p->layer, st->n_layers, p->T, p->H, p->d, p->window, p->ratio, p->topk, p->q, p->kv, p->sink,
                      p->sel, p->n_sel, p->scale, p->out, st->tok_seq, st->seq_row0, st->tok_pos, st->seq_pos0, st->mem,
                      r0, nr, (int)nblk, part, p->out_inv_freq, p->out_rope_half};
        if (nc <= 1) attn_launch<1>(a, I->stream);
        else if (nc <= 2) attn_launch<2>(a, I->stream);
        else if (nc <= 4) attn_launch<4>(a, I->stream);
        else attn_launch<8>(a, I->stream);
        if (dsc_check_launch(err, op)) return -1;
    }
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
    DSC_PDL_WAIT();
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
    dsc_launch(window_store_kernel, grid, 256, 0, I->stream, p->layer, st->n_layers, p->window, p->d, st->T, p->kv,
               st->tok_seq, st->seq_row0, st->seq_n, st->seq_pos0, st->mem);
    return dsc_check_launch(err, op);
}
