/* mma.cu — the tensor-core products (mma.sync m16n8k16 -> fp32: bf16 x bf16
 * for BF16 weights, f16 x f16 for FP8): matmul / grouped matmul of BF16 and
 * FP8 (E8M0 or F32 scales) weights, and the routed experts' up / down
 * projections (MXFP4 products are fp4.cu's).
 *
 * Weight ROWS are the MMA's M side, TOKENS its N side; a column of an MMA
 * depends only on its own B column, so a token's bits do not depend on the
 * other tokens of the step, its column in the tile, or the kernel (docs/design.md
 * §1). Numerics (docs/cuda.md):
 *   weights: bf16 values are exact in bf16, e4m3 values in f16 (one cvt a
 *     pair); FP8's scale (E8M0 or F32) multiplies the group's fp32 partial
 *     (promotion).
 *   activations, BF16: x = hi + lo, hi = bf16_rn(x), lo = bf16_rn(x -
 *     hi) (x - hi is exact in fp32): ~16 significant bits of x.
 *   activations, FP8: per token and 128-column group a power of two sc
 *     (hx_scale: the group's largest |x| sc in [2^14, 2^15)), x sc = hi + lo
 *     in f16: ~22 significant bits of x down to ~2^-40 of the group's
 *     largest; the group's partial times 1 / sc (exact) before its scale.
 *   Two MMAs per fragment.
 * ORDER of y[t][r] (a function of the matrix shape only):
 *   K in groups of DSC_MMA_G = 128 columns; group g's partial b_g is a fresh
 *   fp32 accumulator through the group's 8 MMA steps kk = 0..7 ascending, each
 *   step mma(A, x_hi) then mma(A, x_lo). Step kk of group g pairs thread
 *   (gid, tig)'s fragment slots (k = 2tig, 2tig+1, 2tig+8, 2tig+9) with the
 *   columns g*128 + tig*32 + kk*4 + 0..3 (a fixed permutation of K inside the
 *   step, the same for A and B). Columns past K are zeros (exact).
 *   y = (((0 + p_0) + p_1) + ...) over groups ascending, p_g = (b_g * 1/sc_g)
 *   * s_g for FP8 (s_g the row's scale of columns g*128..), p_g = b_g
 *   otherwise.
 * Two kernels give those bits: mma_dec_kernel (few tokens: the warps of a
 * block take different groups of one 16-row tile, partials meet in shared
 * memory and one thread per output adds them in group order) and
 * mma_tile_kernel (many tokens: 128 x 64, 64 x 64 or 64 x 32 tiles, or 128 x
 * 16 / 128 x 8 for the experts, staged in shared memory by cp.async, a warp
 * walks the groups in order). Which one runs never changes a bit. */
#include <stdio.h>
#include <string.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/internal.h"

enum { MMA_PLAIN = 0, MMA_UP = 1, MMA_DOWN = 2 };

template <int KIND> struct mk;
/* CPT: 16-byte chunks per thread per row per group; RB: row bytes per group;
 * GW: groups per warp per round in the experts' decode kernel (not ORDER) */
template <> struct mk<DS_W_BF16> { enum { CPT = 4, RB = 256, GW = DSC_MMA_GW }; };
template <> struct mk<DS_W_FP8> { enum { CPT = 2, RB = 128, GW = DSC_MMA_GW }; };

__device__ __forceinline__ uint32_t u4w(const uint4 &q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }

__device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* bf16x2 of two floats (round to nearest even): lo in bits 0..15. */
__device__ __forceinline__ uint32_t bf2(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

/* x = hi + lo for 4 activations: b[0] = hi01, b[1] = hi23, b[2] = lo01, b[3] = lo23. */
__device__ __forceinline__ void split4(float4 v, uint32_t *b) {
    b[0] = bf2(v.x, v.y);
    b[1] = bf2(v.z, v.w);
    float h0 = __uint_as_float(b[0] << 16), h1 = __uint_as_float(b[0] & 0xffff0000u);
    float h2 = __uint_as_float(b[1] << 16), h3 = __uint_as_float(b[1] & 0xffff0000u);
    b[2] = bf2(__fsub_rn(v.x, h0), __fsub_rn(v.y, h1));
    b[3] = bf2(__fsub_rn(v.z, h2), __fsub_rn(v.w, h3));
}

/* ---- FP8 in f16 (docs/cuda.md "FP8 products in f16") ----------------------- */

/* m16n8k16 f16 x f16 -> fp32: the FP8 products (e4m3 values are f16 values). */
__device__ __forceinline__ void mma16816h(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The MMA of a kind: FP8 in f16, the others in bf16. */
template <int KIND>
__device__ __forceinline__ void mmak(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
    if (KIND == DS_W_FP8) mma16816h(c, a0, a1, a2, a3, b0, b1);
    else mma16816(c, a0, a1, a2, a3, b0, b1);
}

/* f16x2 of two floats (round to nearest even, subnormals kept): lo in bits 0..15. */
__device__ __forceinline__ uint32_t h2(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

/* Bytes 2h, 2h + 1 of w (e4m3 codes) as an f16x2, exact (one cvt: every e4m3
 * value, subnormals included, is an f16 normal; the NaN codes give NaN). */
__device__ __forceinline__ uint32_t e4m3h2(uint32_t w, int h) {
    uint32_t d;
    if (h) asm("{.reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, u;}" : "=r"(d) : "r"(w));
    else asm("{.reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;}" : "=r"(d) : "r"(w));
    return d;
}

/* The largest |x| of four activations as bits (|x| of floats orders as
 * unsigned integers; NaN above inf). */
__device__ __forceinline__ uint32_t amax4(float4 v) {
    const uint32_t m = 0x7fffffffu;
    return max(max(__float_as_uint(v.x) & m, __float_as_uint(v.y) & m),
               max(__float_as_uint(v.z) & m, __float_as_uint(v.w) & m));
}

/* An FP8 product's activation scale for one token's 128-column group from
 * the group's largest |x| bits m: sc = 2^k, k = 141 - m's exponent field (at
 * most 126), so the largest scaled |x| lies in [2^14, 2^15) (f16 ends at
 * 65504); inv = 2^-k. Both normal floats for every m (inf / NaN: k = -114). */
__device__ __forceinline__ void hx_scale(uint32_t m, float &sc, float &inv) {
    int k = 141 - (int)(m >> 23);
    k = k < 126 ? k : 126;
    sc = __uint_as_float((uint32_t)(127 + k) << 23);
    inv = __uint_as_float((uint32_t)(127 - k) << 23);
}

/* x sc = hi + lo for 4 activations in f16 (x sc exact: a power of two; x sc -
 * hi exact in fp32): b[0] = hi01, b[1] = hi23, b[2] = lo01, b[3] = lo23. */
__device__ __forceinline__ void split4h(float4 v, float sc, uint32_t *b) {
    v = make_float4(__fmul_rn(v.x, sc), __fmul_rn(v.y, sc), __fmul_rn(v.z, sc), __fmul_rn(v.w, sc));
    b[0] = h2(v.x, v.y);
    b[1] = h2(v.z, v.w);
    float2 f0 = __half22float2(*(const __half2 *)&b[0]), f1 = __half22float2(*(const __half2 *)&b[1]);
    b[2] = h2(__fsub_rn(v.x, f0.x), __fsub_rn(v.y, f0.y));
    b[3] = h2(__fsub_rn(v.z, f1.x), __fsub_rn(v.w, f1.y));
}

/* The split a kind's MMAs take: FP8 f16 of x sc, the others bf16 of x. */
template <int KIND> __device__ __forceinline__ void split4k(float4 v, float sc, uint32_t *b) {
    if (KIND == DS_W_FP8) split4h(v, sc, b);
    else split4(v, b);
}

/* The A fragment halves of one row for step s of chunk q (8 / CPT steps per
 * chunk): p01 = elements 0,1 and p23 = elements 2,3 of the step's 4 columns
 * (FP8: f16x2, BF16: bf16x2). */
template <int KIND> __device__ __forceinline__ void afrag(const uint4 &q, int s, uint32_t &p01, uint32_t &p23) {
    if (KIND == DS_W_BF16) {
        p01 = u4w(q, 2 * s);
        p23 = u4w(q, 2 * s + 1);
    } else {
        uint32_t w = u4w(q, s);
        p01 = e4m3h2(w, 0);
        p23 = e4m3h2(w, 1);
    }
}

struct mma_args {
    dsc_w w;                         /* kind-wide fields; rows = rows of one matrix */
    const float *x;                  /* fp32 activations (decode kernel) */
    const uint4 *xhl;                /* the same activations split (tile kernel): 16 bytes per 4 */
    const float *xiv;                /* FP8 tile kernel: the inverse scale of each (segment, group) */
    int xs, xg, rpg, T;              /* plain: token j, row r reads x + j*xs + (r/rpg)*xg */
    float *y;
    int ys;                          /* plain: y[j*ys + r]; experts: y[m*ys + r] */
    const dsc_expert_ptrs *t1, *t3;  /* experts: up w1, w3 (rows [0, half), [half, 2 half)); down w2 */
    const int *off, *active, *n_active, *members;
    int k, half;
    int tiles, U, gpw;               /* decode kernel: 16-row tiles, units per tile, groups per unit */
    int ntk;                         /* streaming kernel over tiles: tokens per pass */
    float *part;                     /* decode kernel, U > 1: partials per (tile, group) */
    int *cnt;                        /* decode kernel, U > 1: units done per tile (zero between launches) */
};

/* This block's matrix (a group's row block for the grouped product: a view,
 * as if it were its own matrix), its first local row rl0, the output row of
 * local row 0 (yb), the x offset of the row block (xq) and the token range;
 * false: nothing to do. */
template <int MODE>
__device__ __forceinline__ bool mma_setup(const mma_args &a, int r0, dsc_w &w, int &rl0, int &yb, size_t &xq, int &cnt,
                                          int &m0) {
    w = a.w;
    rl0 = r0;
    yb = 0;
    xq = 0;
    cnt = a.T;
    m0 = 0;
    if (MODE == MMA_PLAIN) {
        if (a.rpg < w.rows) {
            int q = blockIdx.z;
            yb = q * a.rpg;
            xq = (size_t)q * (size_t)a.xg;
            w.rows = min(a.rpg, w.rows - yb);
        }
        return rl0 < w.rows;
    }
    if (blockIdx.z >= (unsigned)*a.n_active) return false;
    int e = a.active[blockIdx.z];
    const dsc_expert_ptrs *t = a.t1;
    if (MODE == MMA_UP && r0 >= a.half) {
        t = a.t3;
        rl0 = r0 - a.half;
        yb = a.half;
    }
    w.data = t[e].data;
    w.scale = t[e].scale;
    w.srow0 = t[e].srow0;
    m0 = a.off[e];
    cnt = a.off[e + 1] - m0;
    return rl0 < w.rows;
}

/* The row view of a group (PLAIN with rpg < rows): data, scales moved to row yb. */
template <int KIND> __device__ __forceinline__ void mma_view(dsc_w &w, int yb) {
    if (!yb) return;
    w.data += (size_t)yb * ((size_t)w.cols * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN);
    if (KIND == DS_W_FP8) w.srow0 += yb;
}

template <int MODE> __device__ __forceinline__ size_t mma_xoff(const mma_args &a, int m0, int j, size_t xq) {
    if (MODE == MMA_PLAIN) return (size_t)j * (size_t)a.xs + xq;
    if (MODE == MMA_UP) return (size_t)(a.members[m0 + j] / a.k) * (size_t)a.xs;
    return (size_t)(m0 + j) * (size_t)a.xs;
}

/* The FP8 tile kernel's split segment of token j (mma_split_h_kernel):
 * plain: token j's row group blockIdx.z of gridDim.z; up: the token's row;
 * down: the pair's row. */
template <int MODE> __device__ __forceinline__ size_t mma_xseg(const mma_args &a, int m0, int j) {
    if (MODE == MMA_PLAIN) return (size_t)j * gridDim.z + blockIdx.z;
    if (MODE == MMA_UP) return (size_t)(a.members[m0 + j] / a.k);
    return (size_t)(m0 + j);
}

template <int MODE> __device__ __forceinline__ size_t mma_yoff(const mma_args &a, int m0, int j, int r) {
    return (size_t)(MODE == MMA_PLAIN ? j : m0 + j) * (size_t)a.ys + (size_t)r;
}

/* The scales of group g of row sp, as loaded: FP8 the group's scale (F32:
 * its bits; E8M0: the byte); through the read-only path. The streaming kernels load them
 * with the weights into their register ring, mma_group before its MMAs, and
 * both decode FP8's byte (mma_sc_dec) only when the unit is multiplied:
 * decoded at the load (a compare with 255 on the loaded byte), each warp
 * waited there for the scale's round trip, the ring's next unit behind it
 * (ncu, wq_b at one token: 31% of the stall samples on those compares, long
 * scoreboard). */
template <int KIND>
__device__ __forceinline__ uint32_t mma_sc_raw(const dsc_w &w, const uint8_t *sp, int g) {
    if (KIND == DS_W_FP8) return w.scale_f32 ? __ldg((const unsigned int *)sp + g) : (uint32_t)__ldg(sp + g);
    return 0;
}

/* FP8: a loaded scale as fp32 bits (dsc_e8m0 of an E8M0 byte); BF16's
 * nothing unchanged. */
template <int KIND> __device__ __forceinline__ uint32_t mma_sc_dec(const dsc_w &w, uint32_t raw) {
    if (KIND == DS_W_FP8 && !w.scale_f32) return __float_as_uint(dsc_e8m0((uint8_t)raw));
    return raw;
}

/* Both: the scale ready for mma_group_s (the tile kernel, loads without a ring). */
template <int KIND>
__device__ __forceinline__ uint32_t mma_sc_ldg(const dsc_w &w, const uint8_t *sp, int g) {
    return mma_sc_dec<KIND>(w, mma_sc_raw<KIND>(w, sp, g));
}

/* ---- few tokens ------------------------------------------------------------ */

/* Group g's partials p_g of a warp's MI m16 tiles (tile mi: rows gid and gid
 * + 8 of its 16, their scales sp[2 mi], sp[2 mi + 1] and the group's 16-byte
 * chunks q[2 mi], q[2 mi + 1]) for its NB x 8 tokens: per tile a fresh fp32
 * accumulator through the 8 m16n8k16 steps kk ascending, mma(A, x_hi) then
 * mma(A, x_lo), then FP8's activation and group scales (the order of
 * docs/cuda.md). FP8: each token's scale from the largest |x| of its 128
 * columns (the 4 lanes of the token: a max, order-free), the activations
 * loaded twice where they are not held (NB > 1). The MI tiles share each
 * activation fragment (loaded and split once); a tile's own sequence does
 * not depend on MI. Both decode kernels call it, so they give the same bits
 * as each other. */
template <int KIND, int NB, bool HX, int MI = 1>
__device__ __forceinline__ void mma_group(const dsc_w &w, const uint8_t *const *sp, const uint4 *const *q, int g,
                                          int tig, int K, const float *const *xr, const bool *xv, int xal,
                                          float (*acc)[NB][4]) {
    const int SPC = 8 / mk<KIND>::CPT;
    uint32_t s8[2 * MI];
#pragma unroll
    for (int i = 0; i < 2 * MI; i++) s8[i] = KIND == DS_W_FP8 ? mma_sc_raw<KIND>(w, sp[i], g) : 0u;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NB; ni++) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;
    auto xload = [&](int ni, int kk) {
        int col = g * DSC_MMA_G + tig * 32 + kk * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (xv[ni] && col < K) {
            const float *p = xr[ni] + col;
            v = xal ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
        }
        return v;
    };
    /* HX (one token tile): the group's 8 activation loads issued before its
     * MMAs (not ORDER: the same values; 32 more registers) */
    const int XH = HX ? 8 : 1;
    float4 xh[XH];
    if (HX) {
#pragma unroll
        for (int kk = 0; kk < XH; kk++) xh[kk] = xload(0, kk);
    }
    /* FP8: this lane's token's scale (xsc) and the inverses of the
     * accumulator columns 2 tig, 2 tig + 1 (xiv), per token tile */
    float xsc[NB], xiv[NB][2];
#pragma unroll
    for (int ni = 0; ni < NB; ni++) {
        xsc[ni] = 1.0f;
        xiv[ni][0] = xiv[ni][1] = 1.0f;
        if (KIND == DS_W_FP8) {
            uint32_t m = 0;
#pragma unroll
            for (int kk = 0; kk < 8; kk++) m = max(m, amax4(HX ? xh[kk % XH] : xload(ni, kk)));
            m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
            float inv;
            hx_scale(m, xsc[ni], inv);
            xiv[ni][0] = __shfl_sync(0xffffffffu, inv, tig * 8);
            xiv[ni][1] = __shfl_sync(0xffffffffu, inv, tig * 8 + 4);
        }
    }
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        uint32_t a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            afrag<KIND>(q[2 * mi][kk / SPC], kk % SPC, a[mi][0], a[mi][2]);
            afrag<KIND>(q[2 * mi + 1][kk / SPC], kk % SPC, a[mi][1], a[mi][3]);
        }
#pragma unroll
        for (int ni = 0; ni < NB; ni++) {
            float4 xv4 = HX ? xh[kk % XH] : xload(ni, kk);
            uint32_t b[4];
            split4k<KIND>(xv4, xsc[ni], b);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                mmak<KIND>(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[0], b[1]);
                mmak<KIND>(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[2], b[3]);
            }
        }
    }
    if (KIND == DS_W_FP8) {
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            float s0 = __uint_as_float(mma_sc_dec<KIND>(w, s8[2 * mi])),
                  s1 = __uint_as_float(mma_sc_dec<KIND>(w, s8[2 * mi + 1]));
#pragma unroll
            for (int ni = 0; ni < NB; ni++) {
                acc[mi][ni][0] = __fmul_rn(__fmul_rn(acc[mi][ni][0], xiv[ni][0]), s0);
                acc[mi][ni][1] = __fmul_rn(__fmul_rn(acc[mi][ni][1], xiv[ni][1]), s0);
                acc[mi][ni][2] = __fmul_rn(__fmul_rn(acc[mi][ni][2], xiv[ni][0]), s1);
                acc[mi][ni][3] = __fmul_rn(__fmul_rn(acc[mi][ni][3], xiv[ni][1]), s1);
            }
        }
    }
}

/* One warp: a unit of a tile of MI x 16 rows, groups [u*gpw, min(ng,
 * (u+1)*gpw)), for 8*NB tokens; DSC_MMA_DSW warps per block, each its own
 * unit. A thread loads GR groups' chunks of its 2 MI rows (DSC_MMA_DLOADS
 * 16-byte loads in flight, at least one group), then runs their MMAs (MI > 1:
 * the m16 tiles share each activation fragment, half the activation loads per
 * weight). With one unit per tile (U == 1) the warp adds the partials p_g in
 * group order in registers; with U > 1 each unit writes its p_g to global
 * memory and the warp that finishes a tile last (a counter per tile; no
 * atomics touch an output) adds all of them in group order: the same bits
 * either way, for any MI, and the same as mma_tile_kernel. */
template <int KIND, int MODE, int NB, int MI = 1>
__global__ void __launch_bounds__(DSC_MMA_DSW * 32) mma_dec_kernel(mma_args a) {
    DSC_PDL_WAIT();
    const int CPT = mk<KIND>::CPT, NTOK = 8 * NB, GR0 = DSC_MMA_DLOADS / (2 * CPT * MI), GR = GR0 > 0 ? GR0 : 1;
    int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    int wi = blockIdx.x * DSC_MMA_DSW + (threadIdx.x >> 5);
    int tile = wi / a.U, u = wi % a.U;
    if (tile >= a.tiles) return;
    int r0 = tile * 16 * MI;
    dsc_w w;
    int rl0, yb, cnt, m0;
    size_t xq;
    if (!mma_setup<MODE>(a, r0, w, rl0, yb, xq, cnt, m0)) return;
    if (MODE == MMA_PLAIN) mma_view<KIND>(w, yb);
    const int K = w.cols, ng = (K + DSC_MMA_G - 1) / DSC_MMA_G;
    const int gb = u * a.gpw, ge = min(ng, gb + a.gpw);
    const size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const int nchr = (int)(rowbytes / 16);
    /* row i of the thread: rl0 + (i / 2) * 16 + gid + (i % 2) * 8 */
    const uint8_t *pr[2 * MI], *sp[2 * MI];
#pragma unroll
    for (int i = 0; i < 2 * MI; i++) {
        int r = min(rl0 + (i / 2) * 16 + gid + (i % 2) * 8, w.rows - 1);
        pr[i] = w.data + (size_t)r * rowbytes;
        sp[i] = dsc_row_scales(w, KIND, r);
    }
    int xal = ((uintptr_t)a.x & 15) == 0 && a.xs % 4 == 0 && a.xg % 4 == 0;
    for (int j0 = blockIdx.y * NTOK; j0 < cnt; j0 += gridDim.y * NTOK) {
    const float *xr[NB];
    bool xv[NB];
#pragma unroll
    for (int ni = 0; ni < NB; ni++) {
        int j = j0 + ni * 8 + gid;
        xv[ni] = j < cnt;
        xr[ni] = a.x + (xv[ni] ? mma_xoff<MODE>(a, m0, j, xq) : 0);
    }
    /* this tile's partials (U > 1): [ng][32 lanes][MI][NB][4] */
    size_t pidx = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * (size_t)a.tiles + (size_t)tile;
    float4 *part = a.U > 1 ? (float4 *)a.part + pidx * (size_t)ng * 32 * MI * NB : NULL;
    float tot[MI][NB][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NB; ni++) tot[mi][ni][0] = tot[mi][ni][1] = tot[mi][ni][2] = tot[mi][ni][3] = 0.0f;
    for (int g0 = gb; g0 < ge; g0 += GR) {
        uint4 qv[GR][2 * MI][CPT];
#pragma unroll
        for (int v = 0; v < GR; v++) {
            int g = g0 + v;
#pragma unroll
            for (int c = 0; c < CPT; c++) {
                int ch = g * 4 * CPT + tig * CPT + c;
                bool ok = g < ge && ch < nchr;
#pragma unroll
                for (int i = 0; i < 2 * MI; i++)
                    qv[v][i][c] = ok ? __ldg((const uint4 *)(pr[i] + (size_t)ch * 16)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int v = 0; v < GR; v++) {
            int g = g0 + v;
            if (g >= ge) break;
            float acc[MI][NB][4];
            const uint4 *qp[2 * MI];
#pragma unroll
            for (int i = 0; i < 2 * MI; i++) qp[i] = qv[v][i];
            mma_group<KIND, NB, NB == 1, MI>(w, sp, qp, g, tig, K, xr, xv, xal, acc);
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NB; ni++) {
                    if (a.U == 1) {
#pragma unroll
                        for (int q = 0; q < 4; q++) tot[mi][ni][q] = __fadd_rn(tot[mi][ni][q], acc[mi][ni][q]);
                    } else {
                        __stcg(part + (((size_t)g * 32 + lane) * MI + mi) * NB + ni,
                               make_float4(acc[mi][ni][0], acc[mi][ni][1], acc[mi][ni][2], acc[mi][ni][3]));
                    }
                }
        }
    }
    if (a.U > 1) {
        /* the last unit of the tile to finish adds the partials in group order */
        __threadfence();
        __syncwarp();
        int old = 0;
        if (lane == 0) old = atomicAdd(a.cnt + pidx, 1);
        old = __shfl_sync(0xffffffffu, old, 0);
        if (old != a.U - 1) continue;
        __threadfence();
        if (MI == 1 && NB == 1 && cnt - j0 <= 2) {
            /* one or two tokens: 16 rows x 2 tokens, one output a lane (row
             * lane & 15, token lane >> 4), read from the lane that holds it
             * ((row & 7) * 4, component (row >> 3) * 2 + token); up to 32
             * groups' loads in flight, then the same adds in group order */
            const int row = lane & 15, tk = lane >> 4;
            const float *pf = (const float *)part + (size_t)((row & 7) * 4) * 4 + (row >> 3) * 2 + tk;
            float s = 0.0f;
            for (int g0 = 0; g0 < ng; g0 += 32) {
                float p[32];
#pragma unroll
                for (int v = 0; v < 32; v++) p[v] = g0 + v < ng ? __ldcg(pf + (size_t)(g0 + v) * 32 * 4) : 0.0f;
#pragma unroll
                for (int v = 0; v < 32; v++) {
                    if (g0 + v >= ng) break;
                    s = __fadd_rn(s, p[v]);
                }
            }
            if (lane == 0) a.cnt[pidx] = 0; /* ready for the next launch */
            int j = j0 + tk;
            if (j < cnt && rl0 + row < w.rows) a.y[mma_yoff<MODE>(a, m0, j, yb + rl0 + row)] = s;
            continue;
        }
        const int GL = 8 / MI; /* groups' loads in flight, then the adds in order */
        for (int g0 = 0; g0 < ng; g0 += GL) {
            float4 p[GL][MI][NB];
#pragma unroll
            for (int v = 0; v < GL; v++)
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int ni = 0; ni < NB; ni++)
                        p[v][mi][ni] = g0 + v < ng ? __ldcg(part + (((size_t)(g0 + v) * 32 + lane) * MI + mi) * NB + ni)
                                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int v = 0; v < GL; v++) {
                if (g0 + v >= ng) break;
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int ni = 0; ni < NB; ni++) {
                        tot[mi][ni][0] = __fadd_rn(tot[mi][ni][0], p[v][mi][ni].x);
                        tot[mi][ni][1] = __fadd_rn(tot[mi][ni][1], p[v][mi][ni].y);
                        tot[mi][ni][2] = __fadd_rn(tot[mi][ni][2], p[v][mi][ni].z);
                        tot[mi][ni][3] = __fadd_rn(tot[mi][ni][3], p[v][mi][ni].w);
                    }
            }
        }
        if (lane == 0) a.cnt[pidx] = 0; /* ready for the next launch */
    }
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NB; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int row = mi * 16 + gid + (q >> 1) * 8, j = j0 + ni * 8 + tig * 2 + (q & 1);
                if (j < cnt && rl0 + row < w.rows) a.y[mma_yoff<MODE>(a, m0, j, yb + rl0 + row)] = tot[mi][ni][q];
            }
    }
}

/* The experts (one unit per tile: their grid follows the step's experts, so
 * no global partials) and FP8 matrices of many tiles. One block: a 16-row tile and 8*NB tokens; warp w takes groups g0 + w*GW ..
 * (DSC_MMA_DW warps, DSC_MMA_GW groups each per round); partials p_g in
 * shared memory; thread i of the block owns outputs i, i + 256, ... and adds
 * the round's partials in group order. */
template <int KIND, int MODE, int NB, bool HX>
__global__ void __launch_bounds__(DSC_MMA_DW * 32) mma_blk_kernel(mma_args a) {
    DSC_PDL_WAIT();
    const int CPT = mk<KIND>::CPT, NTOK = 8 * NB, GW = mk<KIND>::GW, SLOTS = DSC_MMA_DW * GW;
    const int NOUT = 16 * NTOK, PER = (NOUT + DSC_MMA_DW * 32 - 1) / (DSC_MMA_DW * 32);
    extern __shared__ float part[]; /* [SLOTS][16][NTOK] */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    int r0 = blockIdx.x * 16;
    dsc_w w;
    int rl0, yb, cnt, m0;
    size_t xq;
    if (!mma_setup<MODE>(a, r0, w, rl0, yb, xq, cnt, m0)) return;
    if (MODE == MMA_PLAIN) mma_view<KIND>(w, yb);
    for (int j0 = blockIdx.y * NTOK; j0 < cnt; j0 += gridDim.y * NTOK) {
    const int K = w.cols, ng = (K + DSC_MMA_G - 1) / DSC_MMA_G;
    const size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const int nchr = (int)(rowbytes / 16);
    int ra = min(rl0 + gid, w.rows - 1), rb = min(rl0 + gid + 8, w.rows - 1);
    const uint8_t *pa = w.data + (size_t)ra * rowbytes, *pb = w.data + (size_t)rb * rowbytes;
    const uint8_t *sa = dsc_row_scales(w, KIND, ra), *sb = dsc_row_scales(w, KIND, rb);
    const float *xr[NB];
    bool xv[NB];
    int xal = ((uintptr_t)a.x & 15) == 0 && a.xs % 4 == 0 && a.xg % 4 == 0;
#pragma unroll
    for (int ni = 0; ni < NB; ni++) {
        int j = j0 + ni * 8 + gid;
        xv[ni] = j < cnt;
        xr[ni] = a.x + (xv[ni] ? mma_xoff<MODE>(a, m0, j, xq) : 0);
    }
    float tot[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) tot[i] = 0.0f;
    for (int g0 = 0; g0 < ng; g0 += SLOTS) {
        uint4 qa[GW][CPT], qb[GW][CPT];
#pragma unroll
        for (int u = 0; u < GW; u++) {
            int g = g0 + warp * GW + u;
#pragma unroll
            for (int c = 0; c < CPT; c++) {
                int ch = g * 4 * CPT + tig * CPT + c;
                bool ok = g < ng && ch < nchr;
                qa[u][c] = ok ? __ldg((const uint4 *)(pa + (size_t)ch * 16)) : make_uint4(0, 0, 0, 0);
                qb[u][c] = ok ? __ldg((const uint4 *)(pb + (size_t)ch * 16)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < GW; u++) {
            int slot = warp * GW + u, g = g0 + slot;
            if (g >= ng) break;
            float acc[1][NB][4];
            const uint8_t *sp[2] = {sa, sb};
            const uint4 *qp[2] = {qa[u], qb[u]};
            mma_group<KIND, NB, HX>(w, sp, qp, g, tig, K, xr, xv, xal, acc);
            float *ps = part + (size_t)slot * 16 * NTOK;
#pragma unroll
            for (int ni = 0; ni < NB; ni++) {
                ps[gid * NTOK + ni * 8 + tig * 2] = acc[0][ni][0];
                ps[gid * NTOK + ni * 8 + tig * 2 + 1] = acc[0][ni][1];
                ps[(gid + 8) * NTOK + ni * 8 + tig * 2] = acc[0][ni][2];
                ps[(gid + 8) * NTOK + ni * 8 + tig * 2 + 1] = acc[0][ni][3];
            }
        }
        __syncthreads();
        int nv = ng - g0 < SLOTS ? ng - g0 : SLOTS;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int o = threadIdx.x + i * DSC_MMA_DW * 32;
            if (o < NOUT)
                for (int s = 0; s < nv; s++) tot[i] = __fadd_rn(tot[i], part[(size_t)s * NOUT + o]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int o = threadIdx.x + i * DSC_MMA_DW * 32, row = o / NTOK, j = j0 + o % NTOK;
        if (o < NOUT && j < cnt && rl0 + row < w.rows) a.y[mma_yoff<MODE>(a, m0, j, yb + rl0 + row)] = tot[i];
    }
    }
}

/* Group g's partial of a warp's two rows for one token tile of 8, the
 * activations taken already split from shared memory (xs: this lane's
 * token's split chunks, position (g*8 + kk)*4 + tig; FP8: scaled, xi0 / xi1
 * the inverse scales of tokens 2 tig, 2 tig + 1 in group g): the same B
 * values split4k gives mma_group, the same MMAs in the same order, so the
 * same bits. Lanes past the tile's tokens pass a real token's chunks (no
 * zeroing, no predicate): an MMA's output column depends on its own B column
 * only, and the callers never store those columns' sums. */
template <int KIND>
__device__ __forceinline__ void mma_group_s(const uint4 *qa, const uint4 *qb, uint32_t sca, uint32_t scb, int g,
                                            int tig, const uint4 *xs, float xi0, float xi1, float acc[4]) {
    const int SPC = 8 / mk<KIND>::CPT;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        uint32_t a0, a1, a2, a3;
        afrag<KIND>(qa[kk / SPC], kk % SPC, a0, a2);
        afrag<KIND>(qb[kk / SPC], kk % SPC, a1, a3);
        uint4 b = xs[(g * 8 + kk) * 4 + tig];
        mmak<KIND>(acc, a0, a1, a2, a3, b.x, b.y);
        mmak<KIND>(acc, a0, a1, a2, a3, b.z, b.w);
    }
    if (KIND == DS_W_FP8) {
        float s0 = __uint_as_float(sca), s1 = __uint_as_float(scb);
        acc[0] = __fmul_rn(__fmul_rn(acc[0], xi0), s0);
        acc[1] = __fmul_rn(__fmul_rn(acc[1], xi1), s0);
        acc[2] = __fmul_rn(__fmul_rn(acc[2], xi0), s1);
        acc[3] = __fmul_rn(__fmul_rn(acc[3], xi1), s1);
    }
}

/* The FP8 inverse activation scales a streaming kernel keeps in shared
 * memory after its split chunks: [tokens][ng] floats, rounded up to 16 bytes. */
static inline __host__ __device__ size_t mma_xiv_n(int ntok, size_t ng) { return ((size_t)ntok * ng + 3) & ~(size_t)3; }

/* Shared memory of the streaming kernel: the tile's tokens' activations split
 * ([tokens][ng*32 + 4] 16-byte chunks; the 64-byte pad keeps a quarter warp's
 * two tokens on different banks), their FP8 inverse scales (mma_xiv_n), then
 * the partials [ng][16 rows][8 tokens]. */
static inline size_t mma_str_smem(int K, int ntok) {
    size_t ng = (size_t)(K + DSC_MMA_G - 1) / DSC_MMA_G;
    return (size_t)ntok * (ng * 32 + 4) * 16 + mma_xiv_n(ntok, ng) * sizeof(float) + ng * 16 * 8 * sizeof(float);
}

/* Chunk c4 (columns 4 c4 .. 4 c4 + 3) of a token's split activations at the
 * position mma_group_s reads it: group g = c4 / 32, tig = c4 / 8 % 4, kk = c4 % 8. */
__device__ __forceinline__ int mma_str_pos(int c4) { return (c4 & ~31) | ((c4 & 7) << 2) | ((c4 >> 3) & 3); }

/* The streaming kernels' activation split: tokens j0 .. j0 + nt - 1 into
 * xs ([token][XS] chunks at mma_str_pos), by nth threads (a multiple of 32).
 * FP8: a warp's 32 chunks are one token's group (ng * 32 chunks a token), so
 * the group's scale is one max over the warp (hx_scale), its inverse to
 * xiv[token * ng + g]. */
template <int KIND, int MODE>
__device__ __forceinline__ void mma_str_split(const mma_args &a, int m0, int j0, size_t xq, int nt, int ng, int K,
                                              uint4 *xs, int XS, float *xiv, int nth) {
    int xal = ((uintptr_t)a.x & 15) == 0 && a.xs % 4 == 0 && a.xg % 4 == 0;
#pragma unroll 4 /* loads of several chunks in flight (one L2 round trip each otherwise) */
    for (int i = threadIdx.x; i < nt * ng * 32; i += nth) {
        int tj = i / (ng * 32), c4 = i % (ng * 32), col = c4 * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (col < K) {
            const float *p = a.x + mma_xoff<MODE>(a, m0, j0 + tj, xq) + col;
            v = xal ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
        }
        float sc = 1.0f;
        if (KIND == DS_W_FP8) {
            float inv;
            hx_scale(__reduce_max_sync(0xffffffffu, amax4(v)), sc, inv);
            if ((i & 31) == 0) xiv[tj * ng + c4 / 32] = inv;
        }
        uint32_t b[4];
        split4k<KIND>(v, sc, b);
        xs[(size_t)tj * XS + mma_str_pos(c4)] = make_uint4(b[0], b[1], b[2], b[3]);
    }
}

/* Output o's sum of its ng group partials (part[g * ps + o]) in group order. */
__device__ __forceinline__ float mma_str_sum(const float *part, int o, int ng, int ps) {
    float tot = 0.0f;
    int g = 0;
    for (; g + 8 <= ng; g += 8) {
        float p[8]; /* 8 loads ahead, the adds in group order */
#pragma unroll
        for (int v = 0; v < 8; v++) p[v] = part[(size_t)(g + v) * ps + o];
#pragma unroll
        for (int v = 0; v < 8; v++) tot = __fadd_rn(tot, p[v]);
    }
    for (; g < ng; g++) tot = __fadd_rn(tot, part[(size_t)g * ps + o]);
    return tot;
}

/* One 16-row tile and up to 8 tokens (T <= 8), FP8: the activations
 * split once per block into shared memory; warp w of the block's NW (launch
 * shape: more warps for matrices of few tiles) takes units (UG consecutive
 * groups) w, w + NW, ... and loads the next unit's weights and scales
 * before the MMAs of this one (two register buffers: a unit in flight while
 * the tensor cores run, no load waited for between a group's MMAs); each
 * group's p_g to shared memory, then
 * thread o of the first 128 adds output o's partials in group order: the bits
 * of mma_blk_kernel / mma_dec_kernel. Two blocks per SM whatever the warps
 * (the 16-warp blocks of products under DSC_MMA_STR_FEW blocks at 64
 * registers, FP8 with 16 bytes of spills): at 1 block per SM (90 registers)
 * the 256-tile products ran in two waves. ncu, flash 4 layers, one token, us
 * a call: wo_b 25.9 -> 21.1, the shared w2 11.5 -> 9.3, w1 / w3 (128 blocks,
 * one wave either way) 9.0 -> 9.4. */
template <int KIND, int MODE, int UG>
__global__ void __launch_bounds__((UG == 2 ? DSC_MMA_DW : DSC_MMA_STR_MAXW) * 32, 2)
    mma_str_kernel(mma_args a) {
    DSC_PDL_WAIT();
    const int CPT = mk<KIND>::CPT, DW = blockDim.x >> 5, NTH = blockDim.x;
    extern __shared__ __align__(16) uint8_t smx[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    int r0 = blockIdx.x * 16;
    dsc_w w;
    int rl0, yb, cnt, m0;
    size_t xq;
    if (!mma_setup<MODE>(a, r0, w, rl0, yb, xq, cnt, m0)) return;
    if (MODE == MMA_PLAIN) mma_view<KIND>(w, yb);
    const int K = w.cols, ng = (K + DSC_MMA_G - 1) / DSC_MMA_G, nu = (ng + UG - 1) / UG, XS = ng * 32 + 4;
    const int ntk = a.T < 8 ? a.T : 8;
    uint4 *xs = (uint4 *)smx;
    float *xiv = (float *)(xs + (size_t)ntk * XS), *part = xiv + mma_xiv_n(ntk, ng);
    const size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const int nchr = (int)(rowbytes / 16);
    int ra = min(rl0 + gid, w.rows - 1), rb = min(rl0 + gid + 8, w.rows - 1);
    const uint8_t *pa = w.data + (size_t)ra * rowbytes, *pb = w.data + (size_t)rb * rowbytes;
    const uint8_t *sa = dsc_row_scales(w, KIND, ra), *sb = dsc_row_scales(w, KIND, rb);
    for (int j0 = blockIdx.y * 8; j0 < cnt; j0 += gridDim.y * 8) {
        int nt = cnt - j0 < 8 ? cnt - j0 : 8;
        uint4 qa0[UG][CPT], qb0[UG][CPT], qa1[UG][CPT], qb1[UG][CPT];
        uint32_t ca0[UG], cb0[UG], ca1[UG], cb1[UG]; /* the units' scales as loaded (mma_sc_raw) */
        auto ld = [&](int un, uint4(&qa)[UG][CPT], uint4(&qb)[UG][CPT], uint32_t(&ca)[UG], uint32_t(&cb)[UG]) {
#pragma unroll
            for (int v = 0; v < UG; v++) {
                int g = un * UG + v;
#pragma unroll
                for (int c = 0; c < CPT; c++) {
                    int ch = g * 4 * CPT + tig * CPT + c;
                    bool ok = un < nu && g < ng && ch < nchr;
                    qa[v][c] = ok ? __ldg((const uint4 *)(pa + (size_t)ch * 16)) : make_uint4(0, 0, 0, 0);
                    qb[v][c] = ok ? __ldg((const uint4 *)(pb + (size_t)ch * 16)) : make_uint4(0, 0, 0, 0);
                }
                bool gk = un < nu && g < ng;
                ca[v] = gk ? mma_sc_raw<KIND>(w, sa, g) : 0u;
                cb[v] = gk ? mma_sc_raw<KIND>(w, sb, g) : 0u;
            }
        };
        auto comp = [&](int un, const uint4(&qa)[UG][CPT], const uint4(&qb)[UG][CPT], const uint32_t(&ca)[UG],
                        const uint32_t(&cb)[UG]) {
            const uint4 *xr = xs + (size_t)(gid < nt ? gid : 0) * XS;
            const float *xi0 = xiv + (2 * tig < nt ? 2 * tig : 0) * ng, *xi1 = xiv + (2 * tig + 1 < nt ? 2 * tig + 1 : 0) * ng;
#pragma unroll
            for (int v = 0; v < UG; v++) {
                int g = un * UG + v;
                if (g >= ng) break;
                float acc[4];
                mma_group_s<KIND>(qa[v], qb[v], mma_sc_dec<KIND>(w, ca[v]), mma_sc_dec<KIND>(w, cb[v]), g, tig, xr,
                                  KIND == DS_W_FP8 ? xi0[g] : 1.0f, KIND == DS_W_FP8 ? xi1[g] : 1.0f, acc);
                float *ps = part + (size_t)g * 128;
                *(float2 *)(ps + gid * 8 + tig * 2) = make_float2(acc[0], acc[1]);
                *(float2 *)(ps + (gid + 8) * 8 + tig * 2) = make_float2(acc[2], acc[3]);
            }
        };
        int u = warp;
        ld(u, qa0, qb0, ca0, cb0); /* the first unit's weights in flight while x is split */
        mma_str_split<KIND, MODE>(a, m0, j0, xq, nt, ng, K, xs, XS, xiv, NTH);
        __syncthreads();
        for (; u < nu; u += 2 * DW) {
            ld(u + DW, qa1, qb1, ca1, cb1);
            comp(u, qa0, qb0, ca0, cb0);
            ld(u + 2 * DW, qa0, qb0, ca0, cb0);
            if (u + DW < nu) comp(u + DW, qa1, qb1, ca1, cb1);
        }
        __syncthreads();
        if (threadIdx.x < 128) {
            int o = threadIdx.x, row = o >> 3, tj = o & 7;
            if (tj < nt && rl0 + row < w.rows) a.y[mma_yoff<MODE>(a, m0, j0 + tj, yb + rl0 + row)] = mma_str_sum(part, o, ng, 128);
        }
        __syncthreads();
    }
}

/* The streaming kernel for products of many 16-row tiles at one token tile
 * (T <= 8): plain products (blockIdx.z: the row group) and the experts'
 * up / down (blockIdx.z: the step's expert, its tokens in passes of a.ntk,
 * the most whose activations fit the block's shared memory). A block takes
 * tiles blockIdx.x, blockIdx.x + gridDim.x, ... and splits a pass's
 * activations once; each warp walks its items (pass, tile, group g = warp,
 * warp + DW, ...) with the next D - 1 items' weights and scales in flight (a
 * register ring, filled by a cursor that moves one item at a time: no
 * division per item, a tile's row and scale pointers computed once), across
 * the tiles' boundaries: while a tile's partials are added the next tile's
 * weights are already loading. Partials in two buffers (tile parity) of
 * 16 rows x ntk tokens per group, so a tile's sums and the next tile's MMAs
 * overlap. mma_str_kernel, one tile a block, left the block's weight loads
 * idle through its activation split, its reduction and the next block's
 * start (wq_b, 32 MB of FP8 in 2,048 tiles: 1.10 TB/s there, 1.62 here;
 * heuristics.h DSC_MMA_STRM_*). Each group's MMAs (mma_group_s) and the sum
 * over groups in group order are mma_str_kernel's: the same bits. */
template <int KIND, int MODE, int D, int MINB>
__global__ void __launch_bounds__(DSC_MMA_DW * 32, MINB) mma_strm_kernel(mma_args a) {
    DSC_PDL_WAIT();
    const int CPT = mk<KIND>::CPT, DW = DSC_MMA_DW;
    extern __shared__ __align__(16) uint8_t smx[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    dsc_w w;
    int rl0, yb, cnt, m0;
    size_t xq;
    /* plain: the row group's view; experts: expert blockIdx.z's w1 (up) or w2 */
    if (!mma_setup<MODE>(a, 0, w, rl0, yb, xq, cnt, m0)) return;
    if (MODE == MMA_PLAIN) mma_view<KIND>(w, yb);
    dsc_w w3 = w; /* the up product's rows [half, 2 half) */
    if (MODE == MMA_UP) {
        int e = a.active[blockIdx.z];
        w3.data = a.t3[e].data;
        w3.scale = a.t3[e].scale;
        w3.srow0 = a.t3[e].srow0;
    }
    const int K = w.cols, ng = (K + DSC_MMA_G - 1) / DSC_MMA_G, XS = ng * 32 + 4, NTK = a.ntk, PS = 16 * NTK;
    const int R = MODE == MMA_UP ? 2 * a.half : w.rows, h16 = MODE == MMA_UP ? a.half / 16 : 1 << 30;
    const int tiles = (R + 15) / 16, mytiles = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int np = (cnt + NTK - 1) / NTK; /* passes over the expert's tokens (plain: one) */
    uint4 *xs = (uint4 *)smx;
    float *xiv = (float *)(xs + (size_t)NTK * XS), *part = xiv + mma_xiv_n(NTK, ng); /* [2][ng][16 rows][NTK] */
    const size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const int nchr = (int)(rowbytes / 16);
    const int per = warp < ng ? (ng - 1 - warp) / DW + 1 : 0, nk = per * mytiles * np;
    uint4 qa[D][CPT], qb[D][CPT];
    uint32_t ca[D], cb[D];
    /* the cursor: the next item to load (kl-th of this warp: tile ct of the
     * block's, its group warp + ci * DW) and that tile's rows */
    int kl = 0, ci = 0, ct = 0;
    const uint8_t *pa, *pb, *sa, *sb;
    auto at_tile = [&](int c) {
        int t = (int)blockIdx.x + c * (int)gridDim.x, lr = t * 16;
        dsc_w cv = w;
        if (MODE == MMA_UP && t >= h16) {
            cv.data = w3.data;
            cv.scale = w3.scale;
            cv.srow0 = w3.srow0;
            lr -= a.half;
        }
        int ra = min(lr + gid, cv.rows - 1), rb = min(lr + gid + 8, cv.rows - 1);
        pa = cv.data + (size_t)ra * rowbytes + (size_t)tig * CPT * 16;
        pb = cv.data + (size_t)rb * rowbytes + (size_t)tig * CPT * 16;
        sa = dsc_row_scales(cv, KIND, ra);
        sb = dsc_row_scales(cv, KIND, rb);
    };
    at_tile(0);
    auto ld = [&](int d) {
        bool ok = kl < nk;
        int g = warp + ci * DW;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            bool okc = ok && g * 4 * CPT + tig * CPT + c < nchr;
            qa[d][c] = okc ? __ldg((const uint4 *)(pa + ((size_t)g * 4 * CPT + c) * 16)) : make_uint4(0, 0, 0, 0);
            qb[d][c] = okc ? __ldg((const uint4 *)(pb + ((size_t)g * 4 * CPT + c) * 16)) : make_uint4(0, 0, 0, 0);
        }
        ca[d] = ok ? mma_sc_raw<KIND>(w, sa, g) : 0u; /* w: the kind-wide fields */
        cb[d] = ok ? mma_sc_raw<KIND>(w, sb, g) : 0u;
        kl++;
        if (++ci == per) {
            ci = 0;
            if (++ct == mytiles) ct = 0; /* the next pass */
            if (kl < nk) at_tile(ct);
        }
    };
#pragma unroll
    for (int d = 0; d < D - 1; d++) ld(d); /* in flight while x is split */
    int k = 0, tc = 0;
    for (int p = 0; p < np; p++) {
        const int j0 = p * NTK, nt = cnt - j0 < NTK ? cnt - j0 : NTK;
        /* the previous pass's MMAs are done (its last tile's barrier) */
        mma_str_split<KIND, MODE>(a, m0, j0, xq, nt, ng, K, xs, XS, xiv, DW * 32);
        __syncthreads();
        const uint4 *xr = xs + (size_t)(gid < nt ? gid : 0) * XS;
        const float *xi0 = xiv + (2 * tig < nt ? 2 * tig : 0) * ng, *xi1 = xiv + (2 * tig + 1 < nt ? 2 * tig + 1 : 0) * ng;
        for (int ti = 0; ti < mytiles; ti++, tc++) {
            float *pt = part + (size_t)(tc & 1) * ng * PS;
            for (int i = 0; i < per; i++, k++) {
                int g = warp + i * DW;
#pragma unroll
                for (int d = 0; d < D; d++) /* item k sits in slot k % D (slots indexed statically: */
                    if (k % D == d) {       /* a register copy would wait for its load) */
                        ld((d + D - 1) % D);
                        float acc[4];
                        mma_group_s<KIND>(qa[d], qb[d], mma_sc_dec<KIND>(w, ca[d]), mma_sc_dec<KIND>(w, cb[d]), g,
                                          tig, xr, KIND == DS_W_FP8 ? xi0[g] : 1.0f, KIND == DS_W_FP8 ? xi1[g] : 1.0f,
                                          acc);
                        float *ps = pt + (size_t)g * PS;
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            int tj = tig * 2 + (q & 1);
                            if (tj < NTK) ps[(gid + (q >> 1) * 8) * NTK + tj] = acc[q];
                        }
                    }
            }
            __syncthreads();
            if ((int)threadIdx.x < PS) {
                int o = threadIdx.x, row = o / NTK, tj = o % NTK, r = ((int)blockIdx.x + ti * (int)gridDim.x) * 16 + row;
                if (tj < nt && r < R) a.y[mma_yoff<MODE>(a, m0, j0 + tj, yb + r)] = mma_str_sum(pt, o, ng, PS);
            }
        }
    }
}

/* ---- many tokens ------------------------------------------------------------ */

__device__ __forceinline__ void cp16(void *smem, const void *g, bool ok) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp4(void *smem, const void *g, bool ok) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(g), "r"(ok ? 4 : 0));
}

/* The tile kernel's shared memory: NST stages of A (BM rows of a group's
 * RB bytes), B (BN tokens of 512 bytes: 128 split activations) and FP8's BN
 * inverse scales, then the tokens' x offsets (FP8: their split segments). No padding: a 16-byte chunk's position p in an odd row
 * (token) is stored at p ^ 4 (AX / BX), so the 8 lanes of a quarter warp
 * (rows gid, gid + 1 x tig 0..3) read both halves of a 128-byte bank line. */
template <int KIND, int BM, int BN, int NST> struct mt {
    enum {
        ASTR = mk<KIND>::RB,
        AX = 4,
        BSTR = 32 * 16,
        BX = 4,
        ABYTES = BM * ASTR,
        BBYTES = BN * BSTR,
        SBYTES = KIND == DS_W_FP8 ? BN * 4 : 0, /* FP8: the tokens' inverse scales of the group */
        STAGE = ABYTES + BBYTES + SBYTES,
        SMEM = NST * STAGE + BN * 8
    };
};

/* One block: BM = WM * MI * 16 rows x BN = WN * NI * 8 tokens, warps in a
 * WM x WN grid, each MI m16 tiles x NI n8 tiles; groups staged by cp.async in
 * NST stages (NST - 1 groups in flight while one is multiplied); MINB: the
 * blocks per SM the registers must allow (__launch_bounds__). Shared layout
 * of a stage (mt): A row r, thread-chunk (tig, c) at position c*4 + tig; B
 * token j, chunk (tig, kk) (columns tig*32 + kk*4 ..) at position kk*4 + tig;
 * odd rows / tokens swizzled (p ^ 4). The shape (heuristics.h: 64 x 64 or
 * 128 x 64 for the plain products, 128 x 16 or 128 x 8 for the experts' few
 * tokens each), NST and MINB decide how often a weight fragment is decoded, an
 * activation fragment read and how loads overlap, never an order: a warp
 * walks the groups in order for each of its outputs. */
template <int KIND, int MODE, int WM, int WN, int MI, int NI, int NST, int MINB>
__global__ void __launch_bounds__(WM * WN * 32, MINB) mma_tile_kernel(mma_args a) {
    DSC_PDL_WAIT();
    const int BM = WM * MI * 16, BN = WN * NI * 8, NTH = WM * WN * 32;
    static_assert(BM * 4 * mk<KIND>::CPT % NTH == 0 && BN * 32 % NTH == 0 && NTH % (4 * mk<KIND>::CPT) == 0,
                  "whole loads per thread");
    static_assert(NST >= 2, "at least 2 stages");
    typedef mt<KIND, BM, BN, NST> T_;
    const int CPT = mk<KIND>::CPT, SPC = 8 / CPT;
    extern __shared__ __align__(16) uint8_t sm[];
    size_t *xoff = (size_t *)(sm + NST * T_::STAGE);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    int wm = warp / WN, wn = warp % WN;
    int r0 = blockIdx.x * BM;
    dsc_w w;
    int rl0, yb, cnt, m0;
    size_t xq;
    if (!mma_setup<MODE>(a, r0, w, rl0, yb, xq, cnt, m0)) return;
    if (MODE == MMA_PLAIN) mma_view<KIND>(w, yb);
    for (int j0 = blockIdx.y * BN; j0 < cnt; j0 += gridDim.y * BN) {
    const int K = w.cols, ng = (K + DSC_MMA_G - 1) / DSC_MMA_G;
    const size_t rowbytes = (size_t)K * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    const int nchr = (int)(rowbytes / 16), nchx = K / 4;
    for (int i = tid; i < BN; i += NTH)
        xoff[i] = j0 + i >= cnt ? 0 : KIND == DS_W_FP8 ? mma_xseg<MODE>(a, m0, j0 + i) : mma_xoff<MODE>(a, m0, j0 + i, xq) / 4;
    __syncthreads();
    /* this thread's weight chunks: row byte offsets (32-bit: dsc_mma_fits) and
     * which rows exist, once per block instead of once per group */
    const int NA = BM * 4 * CPT / NTH, ca = tid % (4 * CPT); /* NTH % (4 CPT) == 0: the same chunk c for every u */
    uint32_t aoff[NA];
    unsigned aok = 0;
#pragma unroll
    for (int u = 0; u < NA; u++) {
        int row = (tid + NTH * u) / (4 * CPT);
        aoff[u] = (uint32_t)((size_t)min(rl0 + row, w.rows - 1) * rowbytes) + (uint32_t)ca * 16u;
        aok |= (rl0 + row < w.rows ? 1u : 0u) << u;
    }
    auto load = [&](int g, int st) {
        uint8_t *As = sm + st * T_::STAGE, *Bs = As + T_::ABYTES;
        bool chok = g * 4 * CPT + ca < nchr;
#pragma unroll
        for (int u = 0; u < NA; u++) {
            int row = (tid + NTH * u) / (4 * CPT);
            bool ok = chok && ((aok >> u) & 1u);
            cp16(As + row * T_::ASTR + ((((ca % CPT) * 4 + ca / CPT) ^ ((row & 1) * T_::AX)) * 16),
                 ok ? (const void *)(w.data + aoff[u] + (size_t)g * (64 * CPT)) : (const void *)w.data, ok);
        }
        /* lane c of a token's 32 reads its chunk c (consecutive lanes, consecutive
         * global chunks: measured faster than writing consecutive positions) */
#pragma unroll
        for (int u = 0; u < BN * 32 / NTH; u++) {
            int i = tid + NTH * u, tok = i / 32, c = i % 32, ch = g * 32 + c;
            bool ok = j0 + tok < cnt && (KIND == DS_W_FP8 || ch < nchx);
            /* FP8: the segment's group in mma_split_h_kernel's layout, and its inverse scale */
            const uint4 *src = KIND == DS_W_FP8 ? a.xhl + ((size_t)xoff[tok] * ng + g) * 32 + c : a.xhl + xoff[tok] + ch;
            cp16(Bs + tok * T_::BSTR + (((c % 8) * 4 + c / 8) ^ ((tok & 1) * T_::BX)) * 16,
                 ok ? (const void *)src : (const void *)a.xhl, ok);
            if (KIND == DS_W_FP8 && c == 0)
                cp4(Bs + T_::BBYTES + tok * 4, ok ? (const void *)(a.xiv + (size_t)xoff[tok] * ng + g) : (const void *)a.xiv, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    /* the rows' scales as 32-bit offsets from w.scale (64-bit row pointers
     * were recomputed every group under the register cap: ~45 instructions a
     * scale with dsc_e8m0's branches; mma_sc_ldg gives the same values) */
    uint32_t soff[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = min(rl0 + wm * MI * 16 + mi * 16 + h * 8 + gid, w.rows - 1);
            soff[mi][h] = KIND == DS_W_BF16 ? 0u : (uint32_t)(dsc_row_scales(w, KIND, r) - w.scale);
        }
    float tot[MI][NI][4], acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++) tot[mi][ni][q] = 0.0f;
#pragma unroll
    for (int s0 = 0; s0 < NST - 1; s0++) {
        if (s0 < ng) load(s0, s0);
        else asm volatile("cp.async.commit_group;\n" ::);
    }
    /* a warp's rows are an odd row's swizzle apart in its h = 1 half (gid + 8:
     * the same parity as gid), so one xor serves both */
    const int ax = (gid & 1) * T_::AX, bx = (gid & 1) * T_::BX;
    for (int g = 0; g < ng; g++) {
        if (g + NST - 1 < ng) load(g + NST - 1, (g + NST - 1) % NST);
        else asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(NST - 1));
        __syncthreads();
        const uint8_t *As = sm + (g % NST) * T_::STAGE, *Bs = As + T_::ABYTES;
        /* the group's scales first (their loads overlap the MMAs) */
        float s[MI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) s[mi][h] = 1.0f;
        if (KIND == DS_W_FP8)
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    s[mi][h] = __uint_as_float(mma_sc_ldg<KIND>(w, w.scale + soff[mi][h], g));
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[mi][ni][q] = 0.0f;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            uint4 q[MI][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    q[mi][h] = *(const uint4 *)(As + (wm * MI * 16 + mi * 16 + h * 8 + gid) * T_::ASTR +
                                                ((c * 4 + tig) ^ ax) * 16);
#pragma unroll
            for (int s1 = 0; s1 < SPC; s1++) {
                int kk = c * SPC + s1;
                uint32_t af[MI][4];
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    afrag<KIND>(q[mi][0], s1, af[mi][0], af[mi][2]);
                    afrag<KIND>(q[mi][1], s1, af[mi][1], af[mi][3]);
                }
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    uint4 b = *(const uint4 *)(Bs + (wn * NI * 8 + ni * 8 + gid) * T_::BSTR +
                                               ((kk * 4 + tig) ^ bx) * 16);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        mmak<KIND>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b.x, b.y);
                        mmak<KIND>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b.z, b.w);
                    }
                }
            }
        }
        /* FP8: the tokens' inverse activation scales of the group (the stage's) */
        float xi[NI][2];
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
            float2 v = make_float2(1.0f, 1.0f);
            if (KIND == DS_W_FP8) v = *(const float2 *)(Bs + T_::BBYTES + (wn * NI * 8 + ni * 8 + tig * 2) * 4);
            xi[ni][0] = v.x;
            xi[ni][1] = v.y;
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float p = acc[mi][ni][q];
                    if (KIND == DS_W_FP8) p = __fmul_rn(__fmul_rn(p, xi[ni][q & 1]), s[mi][q >> 1]);
                    tot[mi][ni][q] = __fadd_rn(tot[mi][ni][q], p);
                }
        __syncthreads();
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int rl = wm * MI * 16 + mi * 16 + h * 8 + gid;
            if (rl0 + rl >= w.rows) continue;
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int j = j0 + wn * NI * 8 + ni * 8 + tig * 2 + e;
                    if (j < cnt) a.y[mma_yoff<MODE>(a, m0, j, yb + rl0 + rl)] = tot[mi][ni][h * 2 + e];
                }
        }
    }
}

/* x -> the split form: 4 activations -> {hi x4, lo x4} (16 bytes). */
__global__ void mma_split_kernel(const float *__restrict__ x, uint4 *__restrict__ o, size_t n4) {
    DSC_PDL_WAIT();
    int al = ((uintptr_t)x & 15) == 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float *p = x + 4 * i;
        float4 v = al ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
        uint32_t b[4];
        split4(v, b);
        o[i] = make_uint4(b[0], b[1], b[2], b[3]);
    }
}

/* FP8's split for the tile kernel: segment sg of nseg (row r = sg / nz, part
 * q = sg % nz: K columns at x + r xs + q xg), one warp per (segment, group g):
 * lane c's chunk (columns g*128 + 4c ..; zeros past K) scaled by the group's
 * hx_scale (one max over the warp: the streaming kernels' values) and split
 * in f16 to o[(sg * ng + g) * 32 + c], the inverse to xiv[sg * ng + g]. */
__global__ void mma_split_h_kernel(const float *__restrict__ x, uint4 *__restrict__ o, float *__restrict__ xiv,
                                   size_t nseg, int nz, size_t xs, size_t xg, int K) {
    DSC_PDL_WAIT();
    const int ng = (K + DSC_MMA_G - 1) / DSC_MMA_G, lane = threadIdx.x & 31;
    const int al = ((uintptr_t)x & 15) == 0 && xs % 4 == 0 && xg % 4 == 0;
    size_t nw = (size_t)gridDim.x * (blockDim.x >> 5);
    for (size_t wi = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; wi < nseg * ng; wi += nw) {
        size_t sg = wi / ng;
        int g = (int)(wi % ng), col = g * DSC_MMA_G + lane * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (col < K) {
            const float *p = x + (sg / nz) * xs + (sg % nz) * xg + col;
            v = al ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
        }
        float sc, inv;
        hx_scale(__reduce_max_sync(0xffffffffu, amax4(v)), sc, inv);
        uint32_t b[4];
        split4h(v, sc, b);
        o[wi * 32 + lane] = make_uint4(b[0], b[1], b[2], b[3]);
        if (lane == 0) xiv[wi] = inv;
    }
}

/* ---- launchers ---------------------------------------------------------------- */

static int grow(dsc_buf *b, size_t bytes, cudaStream_t st) { return dsc_buf_grow(b, bytes, 1 << 20, st); }

static int split(cudaStream_t st, dsc_buf *buf, const float *x, size_t n) {
    if (grow(buf, n * 4, st)) return -1;
    size_t n4 = n / 4, blocks = (n4 + 255) / 256;
    dsc_launch(mma_split_kernel, (unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, st, x, (uint4 *)buf->p, n4);
    return 0;
}

/* FP8's split (mma_split_h_kernel) of nseg segments of K columns into buf:
 * the chunks, then the inverse scales (a->xhl, a->xiv). */
static int split_h(cudaStream_t st, dsc_buf *buf, const float *x, size_t nseg, int nz, size_t xs, size_t xg, int K,
                   mma_args *a) {
    size_t ng = (size_t)(K + DSC_MMA_G - 1) / DSC_MMA_G, nch = nseg * ng * 32;
    if (grow(buf, nch * 16 + nseg * ng * sizeof(float), st)) return -1;
    size_t warps = nseg * ng, blocks = (warps + 7) / 8;
    a->xhl = (const uint4 *)buf->p;
    a->xiv = (const float *)((const uint4 *)buf->p + nch);
    dsc_launch(mma_split_h_kernel, (unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, st, x, (uint4 *)buf->p,
               (float *)a->xiv, nseg, nz, xs, xg, K);
    return 0;
}

int dsc_mma_fits(int kind, const dsc_w &w, int rpg) {
    if (kind != DS_W_BF16 && kind != DS_W_FP8) return 0;
    size_t rowbytes = kind == DS_W_BF16 ? (size_t)w.cols * 2 : (size_t)w.cols;
    (void)rpg; /* a group's row block is a view (mma_setup): any rows per group */
    /* the tile kernel addresses a matrix's rows by 32-bit byte offsets */
    return w.rows > 0 && w.cols > 0 && rowbytes % 16 == 0 && ((uintptr_t)w.data & 15) == 0 &&
           (size_t)w.rows * rowbytes <= 0xffffffffu;
}

template <int KIND, int MODE, int UG>
static void launch_str(cudaStream_t st, const mma_args &a, dim3 grid, size_t sm, int nw) {
    static int attr = 0;
    if (!attr) {
        cudaFuncSetAttribute(mma_str_kernel<KIND, MODE, UG>, cudaFuncAttributeMaxDynamicSharedMemorySize, DSC_MMA_STR_SMEM);
        attr = 1;
    }
    dsc_launch(mma_str_kernel<KIND, MODE, UG>, grid, (unsigned)nw * 32, sm, st, a);
}

/* mma_strm_kernel's shared memory: ntk tokens' split activations, their FP8
 * inverse scales (mma_xiv_n), two buffers of partials [ng][16 rows][ntk]. */
static inline size_t mma_strm_smem(int K, int ntk) {
    size_t ng = (size_t)(K + DSC_MMA_G - 1) / DSC_MMA_G;
    return (size_t)ntk * (ng * 32 + 4) * 16 + mma_xiv_n(ntk, ng) * sizeof(float) +
           2 * ng * 16 * (size_t)ntk * sizeof(float);
}

/* Tokens per pass of mma_strm_kernel: plain products all of theirs (T <= 8)
 * within DSC_MMA_STR_SMEM; the experts the most (up to 8, T) within
 * DSC_MMA_STRM_XSMEM; 0: it does not fit. */
static int mma_strm_ntk(int mode, int K, int T) {
    int n = T < 8 ? T : 8;
    if (mode == MMA_PLAIN) return mma_strm_smem(K, n) <= DSC_MMA_STR_SMEM ? n : 0;
    while (n > 0 && mma_strm_smem(K, n) > DSC_MMA_STRM_XSMEM) n--;
    return n;
}

/* The current GPU's SMs (the grid shapes' measure; not ORDER). */
static int sm_count(void) {
    int dev = 0, nsm = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    return nsm;
}

/* mma_strm_kernel over grid.x = min(tiles, DSC_MMA_STRM_MINB blocks per SM / nz) */
template <int KIND, int MODE> static void launch_strm(cudaStream_t st, mma_args a, int rows, unsigned nz, int ntk) {
    const int MINB = DSC_MMA_STRM_MINB;
    const auto kern = mma_strm_kernel<KIND, MODE, DSC_MMA_STRM_D, MINB>;
    static int attr = 0;
    if (!attr) {
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, DSC_MMA_STR_SMEM);
        attr = 1;
    }
    long tiles = (rows + 15) / 16, per = ((long)MINB * sm_count() + nz - 1) / nz;
    dim3 grid((unsigned)(tiles < per ? tiles : per), 1, nz);
    a.ntk = ntk;
    dsc_launch(kern, grid, DSC_MMA_DW * 32, mma_strm_smem(a.w.cols, ntk), st, a);
}

/* split: whether the tiles' groups may be split over units (plain products:
 * nz is the number of row groups, a shape; the experts' nz follows the
 * step's experts, so they keep one unit per tile). */
template <int KIND, int MODE>
static int launch_dec(cudaStream_t st, dsc_buf *mb, mma_args a, int rows, int T, unsigned nz, int split) {
    int NB = T <= 8 ? 1 : T <= 16 ? 2 : 4;
    unsigned ny = (unsigned)((T + 8 * NB - 1) / (8 * NB));
    /* FP8 at one token tile: the streaming kernels (the same bits).
     * The experts, and plain products of at least DSC_MMA_STRM_TILES tiles,
     * take the one that loops over tiles (the experts' tokens in passes where
     * all of them do not fit); else plain products of at least
     * DSC_MMA_STR_TILES tiles (and experts whose single token does not fit)
     * the one-tile-a-block kernel while the tile's activations fit. */
    if constexpr (KIND != DS_W_BF16) {
        int nps = NB == 1 ? mma_strm_ntk(MODE, a.w.cols, a.T) : 0;
        if (nps && (MODE != MMA_PLAIN || (long)((rows + 15) / 16) * nz >= DSC_MMA_STRM_TILES)) {
            launch_strm<KIND, MODE>(st, a, rows, nz, nps);
            return 0;
        }
        int ntk = a.T < 8 ? a.T : 8, ng = (a.w.cols + DSC_MMA_G - 1) / DSC_MMA_G;
        size_t sm = mma_str_smem(a.w.cols, ntk);
        if (NB == 1 && (!split || (long)((rows + 15) / 16) * nz >= DSC_MMA_STR_TILES) && sm <= DSC_MMA_STR_SMEM) {
            dim3 grid((unsigned)((rows + 15) / 16), ny, nz);
            const int UGM = 2; /* groups in the larger units */
            /* fewer blocks than DSC_MMA_STR_FEW: more warps per block (the
             * smaller units: fewer registers); else the larger units where
             * every warp gets one */
            long blocks = (long)grid.x * ny * nz;
            if (blocks < DSC_MMA_STR_FEW && ng >= DSC_MMA_STR_MAXW * UGM / 2)
                launch_str<KIND, MODE, UGM / 2>(st, a, grid, sm, DSC_MMA_STR_MAXW);
            else if (ng >= DSC_MMA_DW * UGM) launch_str<KIND, MODE, UGM>(st, a, grid, sm, DSC_MMA_DW);
            else launch_str<KIND, MODE, UGM / 2>(st, a, grid, sm, DSC_MMA_DW);
            return 0;
        }
    }
    /* FP8 matrices with many tiles: the block kernel (measured faster
     * there; the same bits) */
    if (!split || (KIND != DS_W_BF16 && (long)((rows + 15) / 16) * nz >= DSC_MMA_BLK_TILES)) {
        dim3 grid((unsigned)((rows + 15) / 16), ny, nz);
        size_t smem = (size_t)DSC_MMA_DW * mk<KIND>::GW * 16 * 8 * NB * sizeof(float);
        /* activations loaded ahead (more registers, less occupancy) only for
         * matrices of fewer tiles (heuristics.h) */
        if (NB == 1 && (rows + 15) / 16 < DSC_MMA_HX_TILES)
            dsc_launch(mma_blk_kernel<KIND, MODE, 1, true>, grid, DSC_MMA_DW * 32, smem, st, a);
        else if (NB == 1)
            dsc_launch(mma_blk_kernel<KIND, MODE, 1, false>, grid, DSC_MMA_DW * 32, smem, st, a);
        else if (NB == 2)
            dsc_launch(mma_blk_kernel<KIND, MODE, 2, false>, grid, DSC_MMA_DW * 32, smem, st, a);
        else
            dsc_launch(mma_blk_kernel<KIND, MODE, 4, false>, grid, DSC_MMA_DW * 32, smem, st, a);
        return 0;
    }
    /* two m16 tiles a warp (heuristics.h DSC_MMA_DEC_MI2_*): BF16 plain
     * products of many rows at DSC_MMA_DEC_MI2_T..8 tokens (not ORDER) */
    int mi2 = 0;
    if constexpr (KIND == DS_W_BF16 && MODE == MMA_PLAIN)
        mi2 = NB == 1 && T >= DSC_MMA_DEC_MI2_T && (long)rows * nz >= DSC_MMA_DEC_MI2_ROWS;
    const int MI = 1 + mi2; /* m16 tiles a warp */
    int tiles = (rows + 16 * MI - 1) / (16 * MI), ng = (a.w.cols + DSC_MMA_G - 1) / DSC_MMA_G, U = 1, gpw = ng;
    dsc_mma_dec_split((long)tiles * nz, ng, &U, &gpw);
    a.tiles = tiles;
    a.U = U;
    a.gpw = gpw;
    if (U > 1) {
        size_t nt = (size_t)nz * ny * (size_t)tiles;
        size_t had = mb[2].cap;
        if (grow(&mb[1], nt * (size_t)ng * 32 * MI * NB * sizeof(float4), st) || grow(&mb[2], nt * sizeof(int), st)) return -1;
        if (mb[2].cap != had && cudaMemsetAsync(mb[2].p, 0, mb[2].cap, st) != cudaSuccess) return -1;
        a.part = (float *)mb[1].p;
        a.cnt = (int *)mb[2].p;
    }
    dim3 grid((unsigned)(((size_t)tiles * U + DSC_MMA_DSW - 1) / DSC_MMA_DSW), ny, nz);
    if constexpr (KIND == DS_W_BF16 && MODE == MMA_PLAIN)
        if (mi2) {
            dsc_launch(mma_dec_kernel<KIND, MODE, 1, 2>, grid, DSC_MMA_DSW * 32, 0, st, a);
            return 0;
        }
    if (NB == 1)
        dsc_launch(mma_dec_kernel<KIND, MODE, 1>, grid, DSC_MMA_DSW * 32, 0, st, a);
    else if (NB == 2)
        dsc_launch(mma_dec_kernel<KIND, MODE, 2>, grid, DSC_MMA_DSW * 32, 0, st, a);
    else
        dsc_launch(mma_dec_kernel<KIND, MODE, 4>, grid, DSC_MMA_DSW * 32, 0, st, a);
    return 0;
}

/* TS: the tile shape (heuristics.h): DSC_MMA_TS_64 (64 x 64: 4 x 1 warps of
 * 1 x 8 tiles; BF16 2 x 2 of 2 x 4), DSC_MMA_TS_128 (128 x 64: FP8 plain 8 x 1
 * warps of 1 x 8, the rest 4 x 2 of 2 x 4), DSC_MMA_TS_X16 (128 x 16: 4 x 1
 * warps of 2 x 2), DSC_MMA_TS_X8 (128 x 8: 4 x 1 warps of 2 x 1); NST stages,
 * MINB blocks per SM. Not ORDER. */
template <int KIND, int MODE, int WM, int WN, int MI, int NI, int NST = 2, int MINB = 1>
static void launch_tile_shape(cudaStream_t st, const mma_args &a, int rows, int T, unsigned nz) {
    const int BM = WM * MI * 16, BN = WN * NI * 8, SMEM = mt<KIND, BM, BN, NST>::SMEM;
    static int attr = 0; /* per instantiation: the kernel's shared-memory limit, set once */
    if (!attr) {
        cudaFuncSetAttribute(mma_tile_kernel<KIND, MODE, WM, WN, MI, NI, NST, MINB>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        attr = 1;
    }
    dim3 grid((unsigned)((rows + BM - 1) / BM), (unsigned)((T + BN - 1) / BN), nz);
    dsc_launch(mma_tile_kernel<KIND, MODE, WM, WN, MI, NI, NST, MINB>, grid, WM * WN * 32, SMEM, st, a);
}

/* The warps of a block: each warp its own rows, every token of the block
 * (WN = 1), for the quantized kinds: a weight fragment is decoded by one warp
 * only (with WN = 2 both warps sharing rows decoded it), at the price of
 * every warp reading every token's activations. ncu / `bench --kernels
 * --backend cuda`, 512 tokens, one H200, 2 x 2 / 4 x 2 warps -> 4 x 1 / 8 x 1:
 * FP8 wkv (64 x 64) 175 -> 118 us, wq_a, wq_b, wo_b, shared w1 (128 x 64)
 * 209 / 527 / 545 / 210 -> 174 / 494 / 481 / 180 us; 2 x 4 warps of 4 x 2
 * tiles (spills) 1.5x slower. Not ORDER: an output's MMAs are the same. */
static_assert(DSC_MMA_BM == 64 && DSC_MMA_BN == 64, "the 64 shape is 4 x 1 warps of 1 x 8 tiles (BF16: 2 x 2 of 2 x 4)");
static_assert(DSC_MMA_XBM == 4 * 2 * 16, "the x16 / x8 shapes are 4 warps of 2 m16 tiles");
template <int KIND, int MODE> static void launch_tile(cudaStream_t st, const mma_args &a, int rows, int T, unsigned nz, int ts) {
    if (ts == DSC_MMA_TS_X16) launch_tile_shape<KIND, MODE, 4, 1, 2, 2>(st, a, rows, T, nz);
    else if (ts == DSC_MMA_TS_X8) launch_tile_shape<KIND, MODE, 4, 1, 2, 1>(st, a, rows, T, nz);
    else if (ts == DSC_MMA_TS_128) {
        if constexpr (KIND == DS_W_FP8 && MODE == MMA_PLAIN)
            launch_tile_shape<KIND, MODE, 8, 1, 1, 8, DSC_MMA_T128_NST, DSC_MMA_T128_MINB>(st, a, rows, T, nz);
        else launch_tile_shape<KIND, MODE, 4, 2, 2, 4>(st, a, rows, T, nz);
    } else if (ts == DSC_MMA_TS_32) launch_tile_shape<KIND, MODE, 4, 1, 1, 4>(st, a, rows, T, nz);
    else if constexpr (KIND == DS_W_BF16) launch_tile_shape<KIND, MODE, 2, 2, 2, 4>(st, a, rows, T, nz);
    else launch_tile_shape<KIND, MODE, 4, 1, 1, 8>(st, a, rows, T, nz);
}

/* dec: the decode kernels; else the tile kernel of shape ts */
template <int MODE>
static int launch_kind(cudaStream_t st, dsc_buf *mb, int kind, int dec, int ts, const mma_args &a, int rows, int T,
                       unsigned nz) {
    int split = MODE == MMA_PLAIN;
    switch (kind) {
    case DS_W_BF16:
        if (dec) return launch_dec<DS_W_BF16, MODE>(st, mb, a, rows, T, nz, split);
        launch_tile<DS_W_BF16, MODE>(st, a, rows, T, nz, ts);
        return 0;
    case DS_W_FP8:
        if (dec) return launch_dec<DS_W_FP8, MODE>(st, mb, a, rows, T, nz, split);
        launch_tile<DS_W_FP8, MODE>(st, a, rows, T, nz, ts);
        return 0;
    }
    return -1;
}

int dsc_mma_matmul(cudaStream_t st, dsc_buf *mb, int kind, dsc_w w, const float *x, int xs, int xg, int rpg, int T,
                   float *y, int ys) {
    mma_args a;
    memset(&a, 0, sizeof a);
    a.w = w;
    a.x = x;
    a.xs = xs;
    a.xg = xg;
    a.rpg = rpg;
    a.T = T;
    a.y = y;
    a.ys = ys;
    int dec = T <= DSC_MMA_DEC_MAX_T;
    /* grouped: blockIdx.z = group, its rows as a matrix of their own */
    int G = rpg >= w.rows ? 1 : (w.rows + rpg - 1) / rpg;
    if (!dec && kind == DS_W_FP8) {
        if (split_h(st, &mb[0], x, (size_t)T * G, G, (size_t)xs, G > 1 ? (size_t)xg : 0, w.cols, &a)) return -1;
    } else if (!dec) {
        if (split(st, &mb[0], x, (size_t)T * (size_t)xs)) return -1;
        a.xhl = (const uint4 *)mb[0].p;
    }
    int rows = G > 1 ? rpg : w.rows;
    int ts = dec ? DSC_MMA_TS_64 : dsc_mma_plain_tile(rows, T, (unsigned)G, sm_count());
    return launch_kind<MMA_PLAIN>(st, mb, kind, dec, ts, a, rows, T, (unsigned)G);
}

int dsc_mma_experts(cudaStream_t st, dsc_buf *mb, int up, int kind, dsc_w shape, const dsc_expert_ptrs *t1,
                    const dsc_expert_ptrs *t3, const float *x, int xs, int T, int maxcnt, const int *off,
                    const int *active, const int *n_active, const int *members, int k, unsigned ny, float *y, int ys) {
    mma_args a;
    memset(&a, 0, sizeof a);
    a.w = shape;
    a.x = x;
    a.xs = xs;
    a.y = y;
    a.ys = ys;
    a.t1 = t1;
    a.t3 = t3;
    a.off = off;
    a.active = active;
    a.n_active = n_active;
    a.members = members;
    a.k = k;
    a.half = shape.rows;
    /* By the step's shape only (T, k and the experts' count; never the
     * routing): up to DSC_MMA_XDEC_MAX_T tokens the decode kernels (one token
     * tile a pass: the weights stream once); with more, the tile kernel in the
     * shape of the mean pairs per active expert (heuristics.h). The same bits
     * in every case. */
    size_t P = (size_t)T * (size_t)k;
    int dec = T <= DSC_MMA_XDEC_MAX_T, ts = DSC_MMA_TS_64;
    if (!dec) {
        /* w1 / w3 halves in whole blocks, else the 64 shape */
        if (shape.rows % DSC_MMA_XBM == 0) ts = dsc_mma_expert_tile(P, ny);
        size_t rows = up ? (size_t)T : P;
        if (kind == DS_W_FP8) {
            if (split_h(st, &mb[0], x, rows, 1, (size_t)xs, 0, shape.cols, &a)) return -1;
        } else {
            if (split(st, &mb[0], x, rows * (size_t)xs)) return -1;
            a.xhl = (const uint4 *)mb[0].p;
        }
        /* the x16 / x8 tiles: at most DSC_MMA_XTOK tokens of an expert per block's pass */
        if (ts != DSC_MMA_TS_64 && maxcnt > DSC_MMA_XTOK) maxcnt = DSC_MMA_XTOK;
    }
    a.T = maxcnt;
    int rows = up ? 2 * shape.rows : shape.rows;
    if (up) return launch_kind<MMA_UP>(st, mb, kind, dec, ts, a, rows, maxcnt, ny);
    return launch_kind<MMA_DOWN>(st, mb, kind, dec, ts, a, rows, maxcnt, ny);
}

/* ---- test hook ------------------------------------------------------------------ */

/* The pairs afrag feeds the MMA for FP8 weight words (f16x2; tests/gpu/test_cuda_ops.c
 * checks them bitwise against host-computed values). */
__global__ void mma_wprobe_kernel(const uint32_t *__restrict__ words, int nw, uint32_t *__restrict__ out) {
    DSC_PDL_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nw) return;
    afrag<DS_W_FP8>(make_uint4(words[i], 0, 0, 0), 0, out[2 * i], out[2 * i + 1]);
}

extern "C" int ds_cuda_mma_weight_probe(int gpu, const uint32_t *words, int nw, uint32_t *out, ds_err *err) {
    const char *op = "mma weight probe";
    if (nw <= 0) return dsc_failmsg(err, op, "no words");
    if (cudaSetDevice(gpu) != cudaSuccess) return dsc_failmsg(err, op, "GPU %d cannot be selected", gpu);
    size_t no = (size_t)nw * 2;
    uint32_t *dw = NULL, *dout = NULL;
    int rc = 0;
    if (cudaMalloc(&dw, (size_t)nw * 4) != cudaSuccess || cudaMalloc(&dout, no * 4) != cudaSuccess)
        rc = dsc_failmsg(err, op, "out of device memory");
    else if (cudaMemcpy(dw, words, (size_t)nw * 4, cudaMemcpyHostToDevice) != cudaSuccess)
        rc = dsc_failmsg(err, op, "upload failed");
    else {
        unsigned nb = (unsigned)(((size_t)nw + 255) / 256);
        dsc_launch(mma_wprobe_kernel, nb, 256, 0, 0, dw, nw, dout);
        cudaError_t e = cudaMemcpy(out, dout, no * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) rc = dsc_failmsg(err, op, "kernel or download failed: %s", cudaGetErrorString(e));
    }
    cudaFree(dw);
    cudaFree(dout);
    return rc;
}
