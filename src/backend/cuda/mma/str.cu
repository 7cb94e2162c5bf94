/* mma/str.cu — the streaming kernels (FP8 at one token tile, T <= 8): the
 * activations split once per block into shared memory, the weights streamed
 * through a register ring (common.cuh: the numerics and ORDER). */
#include "backend/cuda/mma/common.cuh"

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
    static_assert(mk<KIND>::L == 2, "a split of two parts: one 16-byte chunk per 4 activations");
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

template <int KIND, int MODE, int UG>
void launch_str(cudaStream_t st, const mma_args &a, dim3 grid, size_t sm, int nw) {
    static int attr = 0;
    if (!attr) {
        cudaFuncSetAttribute(mma_str_kernel<KIND, MODE, UG>, cudaFuncAttributeMaxDynamicSharedMemorySize, DSC_MMA_STR_SMEM);
        attr = 1;
    }
    dsc_launch(mma_str_kernel<KIND, MODE, UG>, grid, (unsigned)nw * 32, sm, st, a);
}

/* mma_strm_kernel over grid.x = min(tiles, DSC_MMA_STRM_MINB blocks per SM / nz) */
template <int KIND, int MODE> void launch_strm(cudaStream_t st, mma_args a, int rows, unsigned nz, int ntk) {
    const int MINB = DSC_MMA_STRM_MINB;
    const auto kern = mma_strm_kernel<KIND, MODE, DSC_MMA_STRM_D, MINB>;
    static int attr = 0;
    if (!attr) {
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, DSC_MMA_STR_SMEM);
        attr = 1;
    }
    long tiles = (rows + 15) / 16, per = ((long)MINB * dsc_mma_sm_count() + nz - 1) / nz;
    dim3 grid((unsigned)(tiles < per ? tiles : per), 1, nz);
    a.ntk = ntk;
    dsc_launch(kern, grid, DSC_MMA_DW * 32, mma_strm_smem(a.w.cols, ntk), st, a);
}

#define X(K, M)                                                                                                        \
    template void launch_str<K, M, 1>(cudaStream_t, const mma_args &, dim3, size_t, int);                              \
    template void launch_str<K, M, 2>(cudaStream_t, const mma_args &, dim3, size_t, int);                              \
    template void launch_strm<K, M>(cudaStream_t, mma_args, int, unsigned, int);
MMA_FP8_MODES(X)
#undef X
