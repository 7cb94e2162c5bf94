/* moe.cu — routing and the experts (paper §2.1), with no host sync inside a
 * step (the expert tables are built on a layer's first call, then reused).
 *
 * route: one warp per token. Scores: softmax (max, lane sums + xor tree),
 *   sigmoid, or sqrtf(softplus) with softplus(x) = x > 20 ? x : log1pf(expf(x)).
 *   Experts: k rounds of argmax of score + bias over lanes (ties to the lower
 *   id; exact), written ascending; hash layers: tid2eid[token] as stored.
 *   Weights: sum = score[idx[0]] + ... in slot order; w = s / (sum + 1e-20) * scale.
 * moe:
 *   1 sort (one block): counting sort of the T*k (token, slot) pairs by
 *     expert, pairs ascending within an expert (tokens in row order); the
 *     list of experts with rows, ascending.
 *   2 up: per active expert, one warp per row of w1 and w3 (the same row dot
 *     as matmul, so each product has matmul's bits), SwiGLU_limit on the
 *     reduced values: g = min(a, L), u = clamp(b, -L, L), g / (1 + expf(-g)) * u.
 *   3 down: w2 over the expert's rows.
 *   4 shared expert: matmul, SwiGLU, matmul over all T rows.
 *   5 combine: per token, y = 0; y = y + o_slot * w over its slots in
 *     ascending (expert id, slot); then y = y + shared. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.h"
#include "common/dsmath.h"

/* ---- route ---------------------------------------------------------------- */

struct route_args {
    const float *logits, *bias;
    int T, E, k, score_func;
    const int32_t *tid2eid, *tok_id;
    float route_scale;
    int32_t *idx;
    float *wts;
};

__global__ void __launch_bounds__(DSC_ROUTE_WARPS * 32) route_kernel(route_args a) {
    DSC_PDL_WAIT();
    /* [warps][E] scores, [warps][E] score + bias, [warps][E] taken flags,
     * [warps][k] the chosen experts in slot order */
    extern __shared__ float rsm[];
    int lane = threadIdx.x & 31, wl = threadIdx.x >> 5;
    int t = blockIdx.x * DSC_ROUTE_WARPS + wl;
    if (t >= a.T) return;
    int E = a.E, k = a.k;
    float *sc = rsm + (size_t)wl * E, *vb = rsm + (size_t)(DSC_ROUTE_WARPS + wl) * E;
    int *tk = (int *)(rsm + (size_t)2 * DSC_ROUTE_WARPS * E) + (size_t)wl * E;
    int *sel = (int *)(rsm + (size_t)3 * DSC_ROUTE_WARPS * E) + (size_t)wl * k;
    const float *lg = a.logits + (size_t)t * E;
    if (a.score_func == DS_ROUTE_SOFTMAX) {
        float mx = -INFINITY, part = 0.0f;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        for (int e = lane; e < E; e += 32) {
            float v = expf(lg[e] - mx);
            sc[e] = v;
            part += v;
        }
        float sum = dsc_warp_sum(part);
        for (int e = lane; e < E; e += 32) sc[e] = sc[e] / sum;
    } else if (a.score_func == DS_ROUTE_SIGMOID) {
        for (int e = lane; e < E; e += 32) sc[e] = dsc_sigmoid(lg[e]);
    } else {
        for (int e = lane; e < E; e += 32) {
            float x = lg[e];
            sc[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
        }
    }
    for (int e = lane; e < E; e += 32) tk[e] = 0;
    /* the bias read once (its loads in flight together), not in each of the
     * k rounds: the same sums */
    if (!a.tid2eid)
        for (int e = lane; e < E; e += 32) vb[e] = sc[e] + a.bias[e];
    __syncwarp();
    int32_t *idx = a.idx + (size_t)t * k;
    if (a.tid2eid) {
        if (lane == 0)
            for (int j = 0; j < k; j++) idx[j] = sel[j] = a.tid2eid[(size_t)a.tok_id[t] * k + j];
    } else {
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = 0.0f;
            for (int e = lane; e < E; e += 32) {
                float v = vb[e];
                if (!tk[e] && (best < 0 || v > bv)) {
                    best = e;
                    bv = v;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                int ob = __shfl_xor_sync(0xffffffffu, best, o);
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
                    best = ob;
                    bv = ov;
                }
            }
            best = __shfl_sync(0xffffffffu, best, 0);
            if (lane == 0 && best >= 0) tk[best] = 1;
            __syncwarp();
        }
        /* the taken ids ascending: 32 experts a round, each lane's slot by a
         * ballot (was lane 0 alone over all E) */
        for (int e0 = 0, j0 = 0; e0 < E && j0 < k; e0 += 32) {
            int e = e0 + lane, f = e < E && tk[e];
            unsigned m = __ballot_sync(0xffffffffu, f);
            int pos = j0 + __popc(m & ((1u << lane) - 1u));
            if (f && pos < k) idx[pos] = sel[pos] = e;
            j0 += __popc(m);
        }
    }
    __syncwarp();
    if (lane == 0) { /* sel: idx as written (shared memory, not a global round trip a slot) */
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            int e = sel[j];
            sum += (e >= 0 && e < E) ? sc[e] : 0.0f;
        }
        for (int j = 0; j < k; j++) {
            int e = sel[j];
            a.wts[(size_t)t * k + j] = ((e >= 0 && e < E) ? sc[e] : 0.0f) / (sum + 1e-20f) * a.route_scale;
        }
    }
}

extern "C" int dsc_route(const ds_backend *be, const ds_route_params *p, ds_err *err) {
    const char *op = "route";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (p->T <= 0) return 0;
    if (p->k <= 0 || p->k > p->E) return dsc_failmsg(err, op, "top-%d of %d experts", p->k, p->E);
    if (!p->tid2eid && !p->bias) return dsc_failmsg(err, op, "neither a bias nor a hash table");
    if (p->tid2eid && p->T > I->step.T) return dsc_failmsg(err, op, "%d rows but the step has %d", p->T, I->step.T);
    size_t smem = (size_t)DSC_ROUTE_WARPS * ((size_t)p->E * (2 * sizeof(float) + sizeof(int)) + (size_t)p->k * sizeof(int));
    if (smem > 48 * 1024) return dsc_failmsg(err, op, "%d experts exceed the shared-memory tile", p->E);
    route_args a = {p->logits, p->bias, p->T, p->E, p->k, p->score_func, p->tid2eid, I->step.tok_id,
                    p->route_scale, p->idx, p->wts};
    dsc_launch(route_kernel, (unsigned)((p->T + DSC_ROUTE_WARPS - 1) / DSC_ROUTE_WARPS), DSC_ROUTE_WARPS * 32, smem,
               I->stream, a);
    return dsc_check_launch(err, op);
}

/* ---- experts -------------------------------------------------------------- */

/* Sorted pairs: off[E+1], active[E], n_active[1], members[P], slot_pos[P]. */
__global__ void __launch_bounds__(1024) moe_sort_kernel(const int32_t *__restrict__ idx, int P, int E, int *off,
                                                        int *active, int *n_active, int *members, int *slot_pos) {
    DSC_PDL_WAIT();
    extern __shared__ int cnt[]; /* [E+1] */
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        int e = idx[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1); /* integer counts: order-free */
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* exclusive prefix sums and the active list, 32 experts a round */
        int lane = threadIdx.x, s = 0, na = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            int e = e0 + lane, c = e < E ? cnt[e] : 0, inc = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += v;
            }
            unsigned m = __ballot_sync(0xffffffffu, c > 0);
            if (e < E) {
                off[e] = s + inc - c;
                cnt[e] = s + inc - c;
                if (c) active[na + __popc(m & ((1u << lane) - 1u))] = e;
            }
            s += __shfl_sync(0xffffffffu, inc, 31);
            na += __popc(m);
        }
        if (lane == 0) {
            off[E] = s;
            *n_active = na;
        }
    }
    __syncthreads();
    /* warp 0 places the pairs 32 at a time in pair order (tokens in row
     * order within an expert): a pair's slot is its expert's next free one
     * plus the number of earlier lanes of its round with the same expert
     * (was: one thread per expert scanning all P pairs, ~0.2 ms at P = 3072) */
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        for (int i0 = 0; i0 < P; i0 += 32) {
            int i = i0 + lane, e = i < P ? idx[i] : -1, ok = e >= 0 && e < E;
            unsigned peers = __match_any_sync(0xffffffffu, ok ? e : -1);
            int o = ok ? cnt[e] + __popc(peers & ((1u << lane) - 1u)) : 0;
            __syncwarp();
            if (ok) {
                members[o] = i;
                slot_pos[i] = o;
                if (lane == 31 - __clz(peers)) cnt[e] = o + 1; /* the group's last lane */
            }
            __syncwarp();
        }
    }
}

/* the CPU's clamped SwiGLU, bit for bit (common/dsmath.h) */
__device__ __forceinline__ float dsc_swiglu(float a, float b, float L) { return ds_swiglu(a, b, L); }

struct up_args {
    const dsc_expert_ptrs *w1, *w3; /* [E] */
    dsc_w shape;                    /* kind-wide fields of w1 / w3 */
    const float *x;                 /* [T][D] */
    int k, D;
    const int *off, *active, *n_active, *members;
    float limit;
    float *h;                       /* [P][I] */
};

template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32) moe_up_kernel(up_args a) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r = blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5);
    if (blockIdx.y >= (unsigned)*a.n_active || r >= a.shape.rows) return;
    int e = a.active[blockIdx.y];
    dsc_w w1 = a.shape, w3 = a.shape;
    w1.data = a.w1[e].data;
    w1.scale = a.w1[e].scale;
    w1.srow0 = a.w1[e].srow0;
    w3.data = a.w3[e].data;
    w3.scale = a.w3[e].scale;
    w3.srow0 = a.w3[e].srow0;
    int m0 = a.off[e], m1 = a.off[e + 1], I = a.shape.rows;
    int xvec = ((uintptr_t)a.x & 15) == 0 && a.D % 4 == 0;
    for (int mt = m0; mt < m1; mt += DSC_MOE_NT) {
        int nt = m1 - mt < DSC_MOE_NT ? m1 - mt : DSC_MOE_NT;
        const float *xj[DSC_MOE_NT];
        float a1[DSC_MOE_NT], a3[DSC_MOE_NT];
#pragma unroll
        for (int j = 0; j < DSC_MOE_NT; j++) {
            xj[j] = a.x + (size_t)(a.members[mt + (j < nt ? j : 0)] / a.k) * a.D;
            a1[j] = 0.0f;
            a3[j] = 0.0f;
        }
        dsc_row_dot<KIND, DSC_MOE_NT>(w1, r, lane, xj, nt, xvec, a1);
        dsc_row_dot<KIND, DSC_MOE_NT>(w3, r, lane, xj, nt, xvec, a3);
#pragma unroll
        for (int j = 0; j < DSC_MOE_NT; j++) {
            if (j >= nt) break;
            float v1 = dsc_warp_sum(a1[j]), v3 = dsc_warp_sum(a3[j]);
            if (lane == 0) a.h[(size_t)(mt + j) * I + r] = dsc_swiglu(v1, v3, a.limit);
        }
    }
}

struct down_args {
    const dsc_expert_ptrs *w2;
    dsc_w shape;                    /* [D, I] */
    const float *h;                 /* [P][I] */
    const int *off, *active, *n_active;
    float *y;                       /* [P][D] */
};

template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32) moe_down_kernel(down_args a) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r = blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5);
    if (blockIdx.y >= (unsigned)*a.n_active || r >= a.shape.rows) return;
    int e = a.active[blockIdx.y];
    dsc_w w = a.shape;
    w.data = a.w2[e].data;
    w.scale = a.w2[e].scale;
    w.srow0 = a.w2[e].srow0;
    int m0 = a.off[e], m1 = a.off[e + 1], I = a.shape.cols, D = a.shape.rows;
    int xvec = ((uintptr_t)a.h & 15) == 0 && I % 4 == 0;
    for (int mt = m0; mt < m1; mt += DSC_MOE_NT) {
        int nt = m1 - mt < DSC_MOE_NT ? m1 - mt : DSC_MOE_NT;
        const float *xj[DSC_MOE_NT];
        float acc[DSC_MOE_NT];
#pragma unroll
        for (int j = 0; j < DSC_MOE_NT; j++) {
            xj[j] = a.h + (size_t)(mt + (j < nt ? j : 0)) * I;
            acc[j] = 0.0f;
        }
        dsc_row_dot<KIND, DSC_MOE_NT>(w, r, lane, xj, nt, xvec, acc);
#pragma unroll
        for (int j = 0; j < DSC_MOE_NT; j++) {
            if (j >= nt) break;
            float v = dsc_warp_sum(acc[j]);
            if (lane == 0) a.y[(size_t)(mt + j) * D + r] = v;
        }
    }
}

/* Several tokens: as moe_up_kernel / moe_down_kernel but one warp per
 * DSC_MM_RW consecutive rows (regular shapes only), each x load feeding
 * DSC_MM_RW rows; a (row, token)'s arithmetic is unchanged (dsc_rows_dot). */
template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32) moe_up_tiled_kernel(up_args a) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5)) * DSC_MM_RW;
    if (blockIdx.y >= (unsigned)*a.n_active || r0 >= a.shape.rows) return;
    int e = a.active[blockIdx.y];
    dsc_w w1 = a.shape, w3 = a.shape;
    w1.data = a.w1[e].data;
    w1.scale = a.w1[e].scale;
    w1.srow0 = a.w1[e].srow0;
    w3.data = a.w3[e].data;
    w3.scale = a.w3[e].scale;
    w3.srow0 = a.w3[e].srow0;
    int m0 = a.off[e], m1 = a.off[e + 1], I = a.shape.rows;
    for (int mt = m0; mt < m1; mt += DSC_MOE_NT) {
        int nt = m1 - mt < DSC_MOE_NT ? m1 - mt : DSC_MOE_NT;
        const float *xj[DSC_MOE_NT];
        float a1[DSC_MM_RW * DSC_MOE_NT], a3[DSC_MM_RW * DSC_MOE_NT];
#pragma unroll
        for (int j = 0; j < DSC_MOE_NT; j++) xj[j] = a.x + (size_t)(a.members[mt + (j < nt ? j : 0)] / a.k) * a.D;
#pragma unroll
        for (int i = 0; i < DSC_MM_RW * DSC_MOE_NT; i++) a1[i] = a3[i] = 0.0f;
        dsc_rows_dot<KIND, DSC_MOE_NT, DSC_MM_RW>(w1, r0, lane, xj, nt, a1);
        dsc_rows_dot<KIND, DSC_MOE_NT, DSC_MM_RW>(w3, r0, lane, xj, nt, a3);
#pragma unroll
        for (int q = 0; q < DSC_MM_RW; q++) {
#pragma unroll
            for (int j = 0; j < DSC_MOE_NT; j++) {
                if (j >= nt) break;
                float v1 = dsc_warp_sum(a1[q * DSC_MOE_NT + j]), v3 = dsc_warp_sum(a3[q * DSC_MOE_NT + j]);
                if (lane == 0 && r0 + q < I) a.h[(size_t)(mt + j) * I + r0 + q] = dsc_swiglu(v1, v3, a.limit);
            }
        }
    }
}

template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32) moe_down_tiled_kernel(down_args a) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5)) * DSC_MM_RW;
    if (blockIdx.y >= (unsigned)*a.n_active || r0 >= a.shape.rows) return;
    int e = a.active[blockIdx.y];
    dsc_w w = a.shape;
    w.data = a.w2[e].data;
    w.scale = a.w2[e].scale;
    w.srow0 = a.w2[e].srow0;
    int m0 = a.off[e], m1 = a.off[e + 1], I = a.shape.cols, D = a.shape.rows;
    for (int mt = m0; mt < m1; mt += DSC_MOE_NT) {
        int nt = m1 - mt < DSC_MOE_NT ? m1 - mt : DSC_MOE_NT;
        const float *xj[DSC_MOE_NT];
        float acc[DSC_MM_RW * DSC_MOE_NT];
#pragma unroll
        for (int j = 0; j < DSC_MOE_NT; j++) xj[j] = a.h + (size_t)(mt + (j < nt ? j : 0)) * I;
#pragma unroll
        for (int i = 0; i < DSC_MM_RW * DSC_MOE_NT; i++) acc[i] = 0.0f;
        dsc_rows_dot<KIND, DSC_MOE_NT, DSC_MM_RW>(w, r0, lane, xj, nt, acc);
#pragma unroll
        for (int q = 0; q < DSC_MM_RW; q++) {
#pragma unroll
            for (int j = 0; j < DSC_MOE_NT; j++) {
                if (j >= nt) break;
                float v = dsc_warp_sum(acc[q * DSC_MOE_NT + j]);
                if (lane == 0 && r0 + q < D) a.y[(size_t)(mt + j) * D + r0 + q] = v;
            }
        }
    }
}

/* Few tokens (decode): one warp per DSC_MOE_GEMV_RW rows of w1 and the same
 * rows of w3, loaded together (2 RW rows x DSC_MM_GEMV_U chunks in flight
 * per lane); w2 like the matmul's gemv. Regular shapes only; a (row,
 * token)'s arithmetic is dsc_row_dot's, so the path never changes a bit. */
template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32) moe_up_gemv_kernel(up_args a) {
    DSC_PDL_WAIT();
    const int RW = DSC_MOE_GEMV_RW;
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5)) * RW;
    if (blockIdx.y >= (unsigned)*a.n_active || r0 >= a.shape.rows) return;
    int e = a.active[blockIdx.y], I = a.shape.rows;
    dsc_w w1 = a.shape, w3 = a.shape;
    w1.data = a.w1[e].data;
    w1.scale = a.w1[e].scale;
    w1.srow0 = a.w1[e].srow0;
    w3.data = a.w3[e].data;
    w3.scale = a.w3[e].scale;
    w3.srow0 = a.w3[e].srow0;
    const size_t rowbytes = (size_t)a.D * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const uint8_t *rows[2 * RW], *scl[2 * RW];
#pragma unroll
    for (int q = 0; q < RW; q++) {
        int r = r0 + q < I ? r0 + q : r0;
        rows[q] = w1.data + (size_t)r * rowbytes;
        rows[RW + q] = w3.data + (size_t)r * rowbytes;
        scl[q] = dsc_row_scales(w1, KIND, r);
        scl[RW + q] = dsc_row_scales(w3, KIND, r);
    }
    for (int mt = a.off[e]; mt < a.off[e + 1]; mt++) {
        const float *xj[1] = {a.x + (size_t)(a.members[mt] / a.k) * a.D};
        float acc[2 * RW];
#pragma unroll
        for (int q = 0; q < 2 * RW; q++) acc[q] = 0.0f;
        dsc_rows_dot_p<KIND, 1, 2 * RW, DSC_MM_GEMV_U>(rows, scl, a.shape.scale_f32, a.D / dsc_kind<KIND>::V, lane,
                                                        xj, 1, acc);
#pragma unroll
        for (int q = 0; q < RW; q++) {
            float v1 = dsc_warp_sum(acc[q]), v3 = dsc_warp_sum(acc[RW + q]);
            if (lane == 0 && r0 + q < I) a.h[(size_t)mt * I + r0 + q] = dsc_swiglu(v1, v3, a.limit);
        }
    }
}

template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32) moe_down_gemv_kernel(down_args a) {
    DSC_PDL_WAIT();
    const int RW = 4;
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5)) * RW;
    if (blockIdx.y >= (unsigned)*a.n_active || r0 >= a.shape.rows) return;
    int e = a.active[blockIdx.y], I = a.shape.cols, D = a.shape.rows;
    dsc_w w = a.shape;
    w.data = a.w2[e].data;
    w.scale = a.w2[e].scale;
    w.srow0 = a.w2[e].srow0;
    for (int mt = a.off[e]; mt < a.off[e + 1]; mt++) {
        const float *xj[1] = {a.h + (size_t)mt * I};
        float acc[RW];
#pragma unroll
        for (int q = 0; q < RW; q++) acc[q] = 0.0f;
        dsc_rows_dot<KIND, 1, RW, DSC_MM_GEMV_U>(w, r0, lane, xj, 1, acc);
#pragma unroll
        for (int q = 0; q < RW; q++) {
            float v = dsc_warp_sum(acc[q]);
            if (lane == 0 && r0 + q < D) a.y[(size_t)mt * D + r0 + q] = v;
        }
    }
}

/* f(kind as a compile-time constant: decltype(f's argument)::value) for each
 * storage kind the SIMT kernels take (F32, BF16, F16, FP8, FP4); nothing for
 * another value. One switch for every kernel family's launch. */
template <int K> struct moe_kind_c { static constexpr int value = K; };
template <typename F> static void moe_for_kind(int kind, F &&f) {
    switch (kind) {
    case DS_W_F32: f(moe_kind_c<DS_W_F32>()); break;
    case DS_W_BF16: f(moe_kind_c<DS_W_BF16>()); break;
    case DS_W_F16: f(moe_kind_c<DS_W_F16>()); break;
    case DS_W_FP8: f(moe_kind_c<DS_W_FP8>()); break;
    case DS_W_FP4: f(moe_kind_c<DS_W_FP4>()); break;
    }
}

/* Rows of every expert 16-byte aligned, whole chunks, x / h rows aligned. */
static int moe_regular(const ds_moe_params *p, const float *h) {
    const ds_weight *ws[3] = {&p->w1[0], &p->w3[0], &p->w2[0]};
    static const int V[5] = {4, 8, 8, 16, 32}, NUM[5] = {4, 2, 2, 1, 1}, DEN[5] = {1, 1, 1, 1, 2};
    if (((uintptr_t)p->x & 15) || p->D % 4 || ((uintptr_t)h & 15) || ws[2]->cols % 4) return 0;
    for (int q = 0; q < 3; q++) {
        const ds_weight *w = ws[q];
        if (w->cols % V[w->kind] || ((size_t)w->cols * NUM[w->kind] / DEN[w->kind]) % 16) return 0;
    }
    return 1; /* expert pointers: see moe_mma_ok */
}

__global__ void swiglu_kernel(float *a, const float *__restrict__ b, size_t n, float L) {
    DSC_PDL_WAIT();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = dsc_swiglu(a[i], b[i], L);
}

__global__ void moe_combine_kernel(const int32_t *__restrict__ idx, const float *__restrict__ wts,
                                   const int *__restrict__ slot_pos, const float *__restrict__ y2,
                                   const float *__restrict__ shared, int k, int D, int E, float *__restrict__ out) {
    DSC_PDL_WAIT();
    /* the token's slots in (expert id, slot) order, once a block: slot j's
     * place is the number of slots before it (a stable sort; was an insertion
     * sort in every thread through dependent loads); its row of y2 (-1: a bad
     * id, no expert ran it) and its weight */
    __shared__ int s_row[32];
    __shared__ float s_w[32];
    int t = blockIdx.y;
    if ((int)threadIdx.x < k) {
        const int32_t *id = idx + (size_t)t * k;
        int j = threadIdx.x, e = id[j], r = 0;
        for (int i = 0; i < k; i++) {
            int f = id[i];
            r += f < e || (f == e && i < j);
        }
        size_t pr = (size_t)t * k + j;
        s_row[r] = e >= 0 && e < E ? slot_pos[pr] : -1;
        s_w[r] = wts[pr];
    }
    __syncthreads();
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) {
        float y = 0.0f;
        for (int r = 0; r < k; r++) {
            int row = s_row[r];
            if (row < 0) continue;
            y = y + y2[(size_t)row * D + c] * s_w[r];
        }
        if (shared) y = y + shared[(size_t)t * D + c];
        out[(size_t)t * D + c] = y;
    }
}

/* The layer's device table of expert pointers: built once per distinct
 * table and found again by its contents (every expert's data and scale
 * pointers), so weights freed and reallocated at the same addresses can
 * never meet a stale table. */
static const dsc_moe_table *moe_table(dsc_impl *I, const ds_moe_params *p, ds_err *err, const char *op) {
    const ds_weight *a = &p->w1[0], *b = &p->w2[0];
    for (int e = 0; e < p->E; e++) {
        const ds_weight *u[3] = {&p->w1[e], &p->w3[e], &p->w2[e]};
        for (int q = 0; q < 3; q++) {
            const ds_weight *s = q == 2 ? b : a, *w = u[q];
            if (w->kind != s->kind || w->rows != s->rows || w->cols != s->cols || w->scale_f32 != s->scale_f32 ||
                w->scale_cols != s->scale_cols) {
                dsc_failmsg(err, op, "expert %d: '%s' differs in kind or shape from expert 0", e, w->name ? w->name : "?");
                return NULL;
            }
        }
    }
    size_t n = 3 * (size_t)p->E;
    dsc_expert_ptrs *h = (dsc_expert_ptrs *)calloc(n, sizeof *h);
    if (!h) {
        dsc_failmsg(err, op, "out of host memory");
        return NULL;
    }
    for (int e = 0; e < p->E; e++) {
        const ds_weight *u[3] = {&p->w1[e], &p->w3[e], &p->w2[e]};
        for (int q = 0; q < 3; q++) h[(size_t)q * p->E + e] = dsc_expert_ptrs{u[q]->data, u[q]->scale, u[q]->srow0};
    }
    int same_owner = -1;
    for (int i = 0; i < I->n_moe; i++) {
        const dsc_expert_ptrs *k = I->moe[i].host;
        size_t j = 0;
        if (I->moe[i].E == p->E)
            while (j < n && k[j].data == h[j].data && k[j].scale == h[j].scale && k[j].srow0 == h[j].srow0) j++;
        if (j == n) {
            free(h);
            return &I->moe[i];
        }
        if (I->moe[i].E == p->E && I->moe[i].owner == (const void *)p->w1) same_owner = i;
    }
    if (same_owner >= 0) { /* the same layer's experts in other places: its table rewritten after the ops before */
        dsc_moe_table *m = &I->moe[same_owner];
        if (dsc_graph_end(I, err)) {
            free(h);
            return NULL;
        }
        memcpy(m->host, h, n * sizeof *h);
        free(h);
        cudaError_t ce = cudaMemcpyAsync(m->dev, m->host, n * sizeof *h, cudaMemcpyHostToDevice, I->stream);
        if (ce != cudaSuccess) {
            dsc_fail(err, op, "expert table", ce);
            return NULL;
        }
        return m;
    }
    if (I->n_moe == I->cap_moe) {
        int cap = I->cap_moe ? 2 * I->cap_moe : 16;
        dsc_moe_table *m = (dsc_moe_table *)realloc(I->moe, (size_t)cap * sizeof *m);
        if (!m) {
            free(h);
            dsc_failmsg(err, op, "out of host memory");
            return NULL;
        }
        I->moe = m;
        I->cap_moe = cap;
    }
    if (dsc_graph_end(I, err)) { /* a synchronous copy follows */
        free(h);
        return NULL;
    }
    void *d = NULL;
    cudaError_t ce = cudaMalloc(&d, n * sizeof *h);
    if (ce == cudaSuccess) ce = cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        free(h);
        cudaGetLastError();
        cudaFree(d);
        dsc_fail(err, op, "expert table", ce);
        return NULL;
    }
    dsc_moe_table *m = &I->moe[I->n_moe++];
    m->host = h;
    m->E = p->E;
    m->dev = (dsc_expert_ptrs *)d;
    m->owner = p->w1;
    return m;
}

/* The shared expert on stream st with the tensor-core scratch xhl (three
 * slots in a row: the side stream's own when it runs beside the routed experts). */
static int launch_shared(cudaStream_t st, dsc_buf *xhl, const ds_moe_params *p, float *hs1, float *hs3, float *ys) {
    int T = p->T, Is = p->sw1->rows;
    if (dsc_launch_matmul(st, xhl, p->sw1->kind, dsc_wdesc(p->sw1), p->x, p->D, 0, 1 << 30, T, hs1, Is)) return -1;
    if (dsc_launch_matmul(st, xhl, p->sw3->kind, dsc_wdesc(p->sw3), p->x, p->D, 0, 1 << 30, T, hs3, Is)) return -1;
    size_t n = (size_t)T * Is, b = (n + 255) / 256;
    dsc_launch(swiglu_kernel, (unsigned)(b < 65536 ? b : 65536), 256, 0, st, hs1, hs3, n, p->limit);
    return dsc_launch_matmul(st, xhl, p->sw2->kind, dsc_wdesc(p->sw2), hs1, Is, 0, 1 << 30, T, ys, p->D);
}

/* The tensor-core path (mma/): the experts' kinds and shapes fit it, w1 / w3
 * rows split into whole tiles, every expert 16-byte aligned. By shape only. */
static int moe_mma_ok(const ds_moe_params *p) {
    dsc_w a = dsc_wdesc(&p->w1[0]), b = dsc_wdesc(&p->w2[0]);
    a.data = b.data = NULL; /* expert 0 may be another rank's (a host pointer): shapes only */
    if (!dsc_mma_fits(p->w1[0].kind, a, 1 << 30) || !dsc_mma_fits(p->w2[0].kind, b, 1 << 30)) return 0;
    if (p->w1[0].rows % DSC_MMA_BM) return 0;
    /* No test of the experts' pointers: every weight the kernels read was
     * placed by map_weights or alloc (cudaMalloc: 256-byte aligned), and an
     * expert another rank holds (expert parallelism) keeps its host pointer,
     * which no kernel reads. So the path, and the bits, follow the kind and
     * shape only: the same on every rank and in one process. */
    return 1;
}

/* The MXFP4 path (fp4.cu): both products MXFP4 with E8M0 scales, w1 / w3
 * rows in whole 16-row tiles. By kind and shape only. */
static int moe_fp4_ok(const ds_moe_params *p) {
    dsc_w a = dsc_wdesc(&p->w1[0]), b = dsc_wdesc(&p->w2[0]);
    a.data = b.data = NULL; /* expert 0 may be another rank's: shapes only */
    return dsc_fp4_fits(p->w1[0].kind, a) && dsc_fp4_fits(p->w2[0].kind, b) && p->w1[0].rows % 16 == 0;
}

/* h[m][r] = SwiGLU(u[m][r], u[m][I + r]) (u: the up product's w1 then w3 rows). */
__global__ void swiglu_pairs_kernel(const float *__restrict__ u, float *__restrict__ h, size_t n, int I, float L) {
    DSC_PDL_WAIT();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / (size_t)I, r = i % (size_t)I;
        h[i] = dsc_swiglu(u[m * 2 * I + r], u[m * 2 * I + I + r], L);
    }
}

/* What the experts leave for the combine: every routed pair's output in
 * rows grouped by expert (y2, row slot_pos[pair]; pairs whose id is outside
 * [0, E) have none) and the shared expert's (ys, NULL without one). */
typedef struct moe_out {
    const float *y2, *ys;
    const int *slot_pos;
} moe_out;

/* The experts of the pairs p->idx names (p->wts and p->out unused). */
static int moe_compute(dsc_impl *I, const ds_moe_params *p, const char *op, ds_err *err, moe_out *o) {
    int T = p->T, k = p->k, E = p->E, D = p->D;
    if (k <= 0 || k > 32 || E <= 0) return dsc_failmsg(err, op, "top-%d of %d experts (k <= 32)", k, E);
    if (T > 65535) return dsc_failmsg(err, op, "%d rows exceed the grid", T);
    const ds_weight *w1 = &p->w1[0], *w2 = &p->w2[0];
    if (w1->cols != D || w2->rows != D || w2->cols != w1->rows || (unsigned)w1->kind > DS_W_FP4 ||
        (unsigned)w2->kind > DS_W_FP4)
        return dsc_failmsg(err, op, "expert shapes w1 [%d, %d], w2 [%d, %d] for dim %d", w1->rows, w1->cols, w2->rows,
                           w2->cols, D);
    if (p->sw1 && (p->sw1->cols != D || p->sw2->rows != D || p->sw3->rows != p->sw1->rows))
        return dsc_failmsg(err, op, "shared expert shapes");
    const dsc_moe_table *tab = moe_table(I, p, err, op);
    if (!tab) return -1;
    size_t P = (size_t)T * k, Ie = (size_t)w1->rows;
    size_t ints = (size_t)(E + 1) + E + 1 + 2 * P;
    int *ib = (int *)dsc_scratch(I, DSC_S_MOE0, ints * sizeof(int), err, op);
    float *h = ib ? (float *)dsc_scratch(I, DSC_S_MOE1, P * Ie * sizeof(float), err, op) : NULL;
    float *y2 = h ? (float *)dsc_scratch(I, DSC_S_MOE2, P * (size_t)D * sizeof(float), err, op) : NULL;
    if (!y2) return -1;
    float *hs1 = NULL, *hs3 = NULL, *ys = NULL;
    if (p->sw1) {
        size_t Is = (size_t)p->sw1->rows;
        hs1 = (float *)dsc_scratch(I, DSC_S_MOE3, (size_t)T * Is * sizeof(float), err, op);
        hs3 = hs1 ? (float *)dsc_scratch(I, DSC_S_MOE4, (size_t)T * Is * sizeof(float), err, op) : NULL;
        ys = hs3 ? (float *)dsc_scratch(I, DSC_S_MOE5, (size_t)T * D * sizeof(float), err, op) : NULL;
        if (!ys) return -1;
    }
    int *off = ib, *active = off + E + 1, *n_active = active + E, *members = n_active + 1, *slot_pos = members + P;
    size_t smem = sizeof(int) * (size_t)(E + 1);
    if (smem > 48 * 1024) return dsc_failmsg(err, op, "%d experts exceed the sort's shared memory", E);
    /* the routed chain on the main stream: sort, up, SwiGLU, down */
    auto routed = [&]() -> int {
        dsc_launch(moe_sort_kernel, 1, 1024, smem, I->stream, p->idx, (int)P, E, off, active, n_active, members,
                   slot_pos);
        if (dsc_check_launch(err, op)) return -1;

        unsigned ny = (unsigned)(P < (size_t)E ? P : (size_t)E); /* active experts, at most */
        int fp4 = moe_fp4_ok(p);
        if (fp4 || moe_mma_ok(p)) {
            /* tensor cores for every T: up (w1 and w3 rows) into u, SwiGLU, down. MXFP4:
             * exact integer sums with the CPU's bits (fp4.cu); BF16 / FP8: mma/ */
            float *u = (float *)dsc_scratch(I, DSC_S_MOE6, P * 2 * Ie * sizeof(float), err, op);
            if (!u) return -1;
            dsc_buf *xs = &I->scratch[DSC_S_XHL];
            auto product = [&](int up, const ds_weight *w, const dsc_expert_ptrs *t1, const dsc_expert_ptrs *t3,
                               const float *x, int xw, float *y, int yw) {
                return fp4 ? dsc_fp4_experts(I->stream, xs, up, dsc_wdesc(w), t1, t3, x, xw, T, T, off, active,
                                             n_active, members, k, ny, y, yw)
                           : dsc_mma_experts(I->stream, xs, up, w->kind, dsc_wdesc(w), t1, t3, x, xw, T, T, off,
                                             active, n_active, members, k, ny, y, yw);
            };
            if (product(1, w1, tab->dev, tab->dev + E, p->x, D, u, 2 * (int)Ie))
                return dsc_failmsg(err, op, "out of device memory for the experts' activations");
            size_t n = P * Ie, b = (n + 255) / 256;
            dsc_launch(swiglu_pairs_kernel, (unsigned)(b < 65536 ? b : 65536), 256, 0, I->stream, u, h, n, (int)Ie,
                       p->limit);
            if (product(0, w2, tab->dev + 2 * (size_t)E, NULL, h, (int)Ie, y2, D))
                return dsc_failmsg(err, op, "out of device memory for the experts' activations");
            if (dsc_check_launch(err, op)) return -1;
        } else {
            up_args ua = {tab->dev, tab->dev + E, dsc_wdesc(w1), p->x,    k,        D,
                          off,      active,       n_active,      members, p->limit, h};
            int regular = moe_regular(p, h), tiled = T >= DSC_MM_TILED_MIN_T && regular, gemv = !tiled && regular;
            /* rows a block: gemv DSC_MOE_GEMV_RW (up) / 4 (down) a warp, tiled DSC_MM_RW, else one */
            int rpu = DSC_MM_WARPS * (gemv ? DSC_MOE_GEMV_RW : tiled ? DSC_MM_RW : 1);
            dim3 gu((unsigned)((w1->rows + rpu - 1) / rpu), ny);
            moe_for_kind(w1->kind, [&](auto kc) {
                const int K = decltype(kc)::value;
                if (gemv) dsc_launch(moe_up_gemv_kernel<K>, gu, DSC_MM_WARPS * 32, 0, I->stream, ua);
                else if (tiled) dsc_launch(moe_up_tiled_kernel<K>, gu, DSC_MM_WARPS * 32, 0, I->stream, ua);
                else dsc_launch(moe_up_kernel<K>, gu, DSC_MM_WARPS * 32, 0, I->stream, ua);
            });
            if (dsc_check_launch(err, op)) return -1;
            down_args da = {tab->dev + 2 * (size_t)E, dsc_wdesc(w2), h, off, active, n_active, y2};
            int rpd = DSC_MM_WARPS * (gemv ? 4 : tiled ? DSC_MM_RW : 1);
            dim3 gd((unsigned)((D + rpd - 1) / rpd), ny);
            moe_for_kind(w2->kind, [&](auto kc) {
                const int K = decltype(kc)::value;
                if (gemv) dsc_launch(moe_down_gemv_kernel<K>, gd, DSC_MM_WARPS * 32, 0, I->stream, da);
                else if (tiled) dsc_launch(moe_down_tiled_kernel<K>, gd, DSC_MM_WARPS * 32, 0, I->stream, da);
                else dsc_launch(moe_down_kernel<K>, gd, DSC_MM_WARPS * 32, 0, I->stream, da);
            });
            if (dsc_check_launch(err, op)) return -1;
        }
        return 0;
    };
    /* The shared expert needs only x: on the side stream (the default;
     * DSV4_CUDA_SIDE=0: after the routed chain on the main one) its products
     * stream their weights while the routed chain runs on the main one,
     * joined before anything reads ys. Its own scratch (hs1, hs3, ys and the
     * side's three tensor-core slots); the same kernels, inputs and order:
     * the same bits (gpu-test.sh graph_bits: DSV4_CUDA_SIDE=0 vs the default). */
    int fork = p->sw1 && I->side_on, shrc = 0;
    if (fork) {
        cudaError_t e = cudaEventRecord(I->ev_fork, I->stream);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(I->side, I->ev_fork, 0);
        if (e != cudaSuccess) return dsc_fail(err, op, "fork of the side stream", e);
        shrc = launch_shared(I->side, &I->scratch[DSC_S_XHL2], p, hs1, hs3, ys);
        e = cudaEventRecord(I->ev_join, I->side);
        if (e != cudaSuccess) return dsc_fail(err, op, "end of the side stream's work", e);
    }
    int rc = routed();
    if (fork) { /* joined whatever happened: a capture left forked cannot end */
        cudaError_t e = cudaStreamWaitEvent(I->stream, I->ev_join, 0);
        if (shrc) return dsc_failmsg(err, op, "shared expert: unknown storage kind");
        if (e != cudaSuccess) return dsc_fail(err, op, "join of the side stream", e);
    }
    if (rc) return -1;
    if (p->sw1 && !fork && launch_shared(I->stream, &I->scratch[DSC_S_XHL], p, hs1, hs3, ys))
        return dsc_failmsg(err, op, "shared expert: unknown storage kind");
    if (p->sw1 && dsc_check_launch(err, op)) return -1;
    *o = moe_out{y2, ys, slot_pos};
    return 0;
}

extern "C" int dsc_moe(const ds_backend *be, const ds_moe_params *p, ds_err *err) {
    const char *op = "moe";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (p->T <= 0) return 0;
    moe_out o;
    if (moe_compute(I, p, op, err, &o)) return -1;
    dim3 gc((unsigned)((p->D + 255) / 256), (unsigned)p->T);
    dsc_launch(moe_combine_kernel, gc, 256, 0, I->stream, p->idx, p->wts, o.slot_pos, o.y2, o.ys, p->k, p->D, p->E,
               p->out);
    return dsc_check_launch(err, op);
}

/* ---- expert parallelism (docs/ep.md): moe in two halves ------------------ */

/* idx_m[i] = sel[i] ? idx[i] : -1 (no expert: the sort skips it) */
__global__ void moe_mask_kernel(const int32_t *__restrict__ idx, const unsigned char *__restrict__ sel, int P,
                                int32_t *__restrict__ idx_m) {
    DSC_PDL_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < P) idx_m[i] = sel[i] ? idx[i] : -1;
}

/* slot_out[pair] = y2[slot_pos[pair]] for the pairs run here */
__global__ void moe_scatter_kernel(const int32_t *__restrict__ idx_m, const int *__restrict__ slot_pos,
                                   const float *__restrict__ y2, int E, int D, float *__restrict__ slot_out) {
    DSC_PDL_WAIT();
    int pr = blockIdx.y, e = idx_m[pr];
    if (e < 0 || e >= E) return;
    const float *src = y2 + (size_t)slot_pos[pr] * D;
    float *dst = slot_out + (size_t)pr * D;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) dst[c] = src[c];
}

extern "C" int dsc_moe_experts(const ds_backend *be, const ds_moe_experts_params *p, ds_err *err) {
    const char *op = "moe_experts";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    int T = p->T, k = p->k, D = p->D;
    if (T <= 0) return 0;
    if (k <= 0 || k > 32) return dsc_failmsg(err, op, "top-%d experts (k <= 32)", k);
    size_t P = (size_t)T * k;
    if (P > 65535) return dsc_failmsg(err, op, "%zu (token, slot) pairs exceed the grid", P);
    const int32_t *idx = p->idx;
    if (p->sel) { /* the pairs of this rank: the others get no expert */
        int32_t *idx_m = (int32_t *)dsc_scratch(I, DSC_S_MOE8, P * sizeof(int32_t) + P, err, op);
        if (!idx_m) return -1;
        unsigned char *sel = (unsigned char *)(idx_m + P);
        cudaError_t ce = cudaMemcpyAsync(sel, p->sel, P, cudaMemcpyHostToDevice, I->stream);
        if (ce != cudaSuccess) return dsc_fail(err, op, "the pair selection upload", ce);
        dsc_launch(moe_mask_kernel, (unsigned)((P + 255) / 256), 256, 0, I->stream, p->idx, sel, (int)P, idx_m);
        if (dsc_check_launch(err, op)) return -1;
        idx = idx_m;
    }
    ds_moe_params mp = {p->x, T, D, p->E, k, idx, NULL, p->w1, p->w2, p->w3, p->sw1, p->sw2, p->sw3, p->limit, NULL};
    moe_out o;
    if (moe_compute(I, &mp, op, err, &o)) return -1;
    dim3 gs((unsigned)((D + 255) / 256 < 8 ? (D + 255) / 256 : 8), (unsigned)P);
    dsc_launch(moe_scatter_kernel, gs, 256, 0, I->stream, idx, o.slot_pos, o.y2, p->E, D, p->slot_out);
    if (dsc_check_launch(err, op)) return -1;
    if (!p->shared_out) return 0; /* no shared expert asked for */
    cudaError_t ce =
        o.ys ? cudaMemcpyAsync(p->shared_out, o.ys, (size_t)T * D * sizeof(float), cudaMemcpyDeviceToDevice, I->stream)
             : cudaMemsetAsync(p->shared_out, 0, (size_t)T * D * sizeof(float), I->stream);
    return ce == cudaSuccess ? 0 : dsc_fail(err, op, "the shared expert's rows", ce);
}

/* moe's combine over slot_out rows [T][k][D] (the same arithmetic, so EP
 * over any number of ranks gives moe's bits; a zero shared_out adds +0) */
__global__ void moe_identity_kernel(int *pos, int P) {
    DSC_PDL_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < P) pos[i] = i;
}

extern "C" int dsc_moe_combine(const ds_backend *be, const ds_moe_combine_params *p, ds_err *err) {
    const char *op = "moe_combine";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (p->T <= 0) return 0;
    if (p->k <= 0 || p->k > 32) return dsc_failmsg(err, op, "top-%d experts (k <= 32)", p->k);
    if (p->T > 65535) return dsc_failmsg(err, op, "%d rows exceed the grid", p->T);
    size_t P = (size_t)p->T * p->k;
    int *pos = (int *)dsc_scratch(I, DSC_S_MOE7, P * sizeof(int), err, op);
    if (!pos) return -1;
    dsc_launch(moe_identity_kernel, (unsigned)((P + 255) / 256), 256, 0, I->stream, pos, (int)P);
    dim3 gc((unsigned)((p->D + 255) / 256), (unsigned)p->T);
    dsc_launch(moe_combine_kernel, gc, 256, 0, I->stream, p->idx, p->wts, pos, p->slot_out, p->shared_out, p->k, p->D,
               INT_MAX, p->out);
    return dsc_check_launch(err, op);
}
