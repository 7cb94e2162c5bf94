/* mma/common.cuh — the tensor-core products (mma.sync m16n8k16 -> fp32:
 * bf16 x bf16 for BF16 weights, f16 x f16 for FP8): matmul / grouped matmul
 * of BF16 and FP8 (E8M0 or F32 scales) weights, and the routed experts' up /
 * down projections (MXFP4 products are fp4.cu's).
 *
 * Weight ROWS are the MMA's M side, TOKENS its N side; a column of an MMA
 * depends only on its own B column, so a token's bits do not depend on the
 * other tokens of the step, its column in the tile, or the kernel (docs/design.md
 * §1). Numerics (docs/cuda.md):
 *   weights: bf16 values are exact in bf16, e4m3 values in f16 (one cvt a
 *     pair); FP8's scale (E8M0 or F32) multiplies the group's fp32 partial
 *     (promotion).
 *   activations, BF16: x = hi + mid + lo, hi = bf16_rn(x), mid = bf16_rn(x
 *     - hi), lo = x - hi - mid (each difference exact in fp32, lo exact in
 *     bf16): all 24 bits of x, as the CPU keeps them (x below 2^-126 in
 *     magnitude may lose bits with the subnormals).
 *   activations, FP8: per token and 128-column group a power of two sc
 *     (hx_scale: the group's largest |x| sc in [2^14, 2^15)), x sc = hi + lo
 *     in f16: ~22 significant bits of x down to ~2^-40 of the group's
 *     largest; the group's partial times 1 / sc (exact) before its scale.
 * ORDER of y[t][r] (a function of the matrix shape only):
 *   K in groups of DSC_MMA_G = 128 columns; group g's partial b_g is a fresh
 *   fp32 accumulator through the group's 8 MMA steps kk = 0..7 ascending, each
 *   step mma(A, x_hi), mma(A, x_mid) (BF16 only), mma(A, x_lo). Step kk of
 *   group g pairs thread (gid, tig)'s fragment slots (k = 2tig, 2tig+1, 2tig+8, 2tig+9) with the
 *   columns g*128 + tig*32 + kk*4 + 0..3 (a fixed permutation of K inside the
 *   step, the same for A and B). Columns past K are zeros (exact).
 *   y = (((0 + p_0) + p_1) + ...) over groups ascending, p_g = (b_g * 1/sc_g)
 *   * s_g for FP8 (s_g the row's scale of columns g*128..), p_g = b_g
 *   otherwise.
 *   Three MMAs per fragment for BF16, two for FP8.
 * Every kernel gives those bits; which one runs never changes a bit. One
 * file per kernel family, each with its launcher: dec.cu (mma_dec_kernel:
 * few tokens, a 16-row tile's groups split over warps), blk.cu
 * (mma_blk_kernel: a block per 16-row tile, partials in shared memory),
 * str.cu (mma_str_kernel / mma_strm_kernel: FP8 at one token tile, the
 * activations split once per block), tile.cu (mma_tile_kernel: many tokens,
 * tiles staged in shared memory by cp.async); launch.cu chooses among them
 * (dsc_mma_matmul, dsc_mma_experts) and holds the activation splits for the
 * tile kernel. This header: the fragment loaders and device helpers they
 * share, and the launchers' declarations. */
#ifndef DS_CUDA_MMA_COMMON_CUH
#define DS_CUDA_MMA_COMMON_CUH

#include <cuda_fp16.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/internal.h"

enum { MMA_PLAIN = 0, MMA_UP = 1, MMA_DOWN = 2 };

template <int KIND> struct mk;
/* CPT: 16-byte chunks per thread per row per group; RB: row bytes per group;
 * GW: groups per warp per round in the experts' decode kernel (not ORDER);
 * L: the activation split's parts (BF16 hi, mid, lo; FP8 hi, lo) */
template <> struct mk<DS_W_BF16> { enum { CPT = 4, RB = 256, GW = DSC_MMA_GW, L = 3 }; };
template <> struct mk<DS_W_FP8> { enum { CPT = 2, RB = 128, GW = DSC_MMA_GW, L = 2 }; };

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

/* The bf16 pair b as floats (lo in bits 0..15) subtracted from u, v (exact:
 * the parts of a split are x's leading bits). */
__device__ __forceinline__ float2 bf2_rest(float u, float v, uint32_t b) {
    return make_float2(__fsub_rn(u, __uint_as_float(b << 16)), __fsub_rn(v, __uint_as_float(b & 0xffff0000u)));
}

/* x = hi + mid + lo for 4 activations: b[0] = hi01, b[1] = hi23, b[2] =
 * mid01, b[3] = mid23, b[4] = lo01, b[5] = lo23. */
__device__ __forceinline__ void split4(float4 v, uint32_t *b) {
    b[0] = bf2(v.x, v.y);
    b[1] = bf2(v.z, v.w);
    float2 r01 = bf2_rest(v.x, v.y, b[0]), r23 = bf2_rest(v.z, v.w, b[1]);
    b[2] = bf2(r01.x, r01.y);
    b[3] = bf2(r23.x, r23.y);
    r01 = bf2_rest(r01.x, r01.y, b[2]);
    r23 = bf2_rest(r23.x, r23.y, b[3]);
    b[4] = bf2(r01.x, r01.y);
    b[5] = bf2(r23.x, r23.y);
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

/* The split a kind's MMAs take (2 mk<KIND>::L words): FP8 f16 of x sc, the
 * others bf16 of x. */
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
    const uint4 *xhl;                /* the same activations split (tile kernel): 16 bytes per 4 (BF16: hi, mid) */
    const uint2 *xlo;                /* BF16 tile kernel: the lo parts, 8 bytes per 4 */
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
 * accumulator through the 8 m16n8k16 steps kk ascending, one MMA per part
 * of the split (hi first), then FP8's activation and group scales (the order of
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
            uint32_t b[2 * mk<KIND>::L];
            split4k<KIND>(xv4, xsc[ni], b);
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int l = 0; l < mk<KIND>::L; l++)
                    mmak<KIND>(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[2 * l], b[2 * l + 1]);
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

/* mma_strm_kernel's shared memory: ntk tokens' split activations, their FP8
 * inverse scales (mma_xiv_n), two buffers of partials [ng][16 rows][ntk]. */
static inline size_t mma_strm_smem(int K, int ntk) {
    size_t ng = (size_t)(K + DSC_MMA_G - 1) / DSC_MMA_G;
    return (size_t)ntk * (ng * 32 + 4) * 16 + mma_xiv_n(ntk, ng) * sizeof(float) +
           2 * ng * 16 * (size_t)ntk * sizeof(float);
}

/* The current GPU's SMs (launch.cu; the grid shapes' measure, not ORDER). */
int dsc_mma_sm_count(void);

/* The launchers, each in its kernel's file (explicitly instantiated there
 * for the kinds and modes below). */
template <int KIND, int MODE> void launch_dec_kernel(cudaStream_t st, const mma_args &a, dim3 grid, int NB, int mi2);
template <int KIND, int MODE>
void launch_blk(cudaStream_t st, const mma_args &a, dim3 grid, size_t smem, int NB, bool hx);
template <int KIND, int MODE, int UG> void launch_str(cudaStream_t st, const mma_args &a, dim3 grid, size_t sm, int nw);
template <int KIND, int MODE> void launch_strm(cudaStream_t st, mma_args a, int rows, unsigned nz, int ntk);
template <int KIND, int MODE> void launch_tile(cudaStream_t st, const mma_args &a, int rows, int T, unsigned nz, int ts);

/* X(KIND, MODE) for every kind and mode the launchers take */
#define MMA_KINDS_MODES(X)                                                                                             \
    X(DS_W_BF16, MMA_PLAIN) X(DS_W_BF16, MMA_UP) X(DS_W_BF16, MMA_DOWN) X(DS_W_FP8, MMA_PLAIN) X(DS_W_FP8, MMA_UP)     \
        X(DS_W_FP8, MMA_DOWN)
/* ... and the FP8 ones (the streaming kernels) */
#define MMA_FP8_MODES(X) X(DS_W_FP8, MMA_PLAIN) X(DS_W_FP8, MMA_UP) X(DS_W_FP8, MMA_DOWN)

#endif
