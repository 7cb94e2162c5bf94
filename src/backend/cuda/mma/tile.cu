/* mma/tile.cu — the tile kernel (many tokens): blocks of rows x tokens,
 * each group staged in shared memory by cp.async, a warp walking the groups
 * in order (common.cuh: the numerics and ORDER). */
#include "backend/cuda/mma/common.cuh"

/* ---- many tokens ------------------------------------------------------------ */

__device__ __forceinline__ void cp16(void *smem, const void *g, bool ok) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp8(void *smem, const void *g, bool ok) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(g), "r"(ok ? 8 : 0));
}
__device__ __forceinline__ void cp4(void *smem, const void *g, bool ok) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(g), "r"(ok ? 4 : 0));
}

/* The tile kernel's shared memory: NST stages of A (BM rows of a group's
 * RB bytes), B (BN tokens of 512 bytes: 128 split activations, BF16's hi and
 * mid parts), BF16's lo parts (BN tokens of 256 bytes) or FP8's BN inverse
 * scales, then the tokens' x offsets (FP8: their split segments). No
 * padding: a 16-byte chunk's position p in an odd row (token) is stored at
 * p ^ 4 (AX / BX), so the 8 lanes of a quarter warp (rows gid, gid + 1 x tig
 * 0..3) read both halves of a 128-byte bank line; an 8-byte lo chunk's
 * position p of token j at p ^ 4 (j % 8), so a half warp's 4 tokens read 4
 * different 32-byte quarters of a bank line. */
template <int KIND, int BM, int BN, int NST> struct mt {
    enum {
        ASTR = mk<KIND>::RB,
        AX = 4,
        BSTR = 32 * 16,
        BX = 4,
        LSTR = 32 * 8,
        ABYTES = BM * ASTR,
        BBYTES = BN * BSTR,
        LBYTES = KIND == DS_W_BF16 ? BN * LSTR : 0, /* BF16: the tokens' lo parts of the group */
        SBYTES = KIND == DS_W_FP8 ? BN * 4 : 0,     /* FP8: the tokens' inverse scales of the group */
        STAGE = ABYTES + BBYTES + LBYTES + SBYTES,
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
            if (KIND == DS_W_BF16)
                cp8(Bs + T_::BBYTES + tok * T_::LSTR + (((c % 8) * 4 + c / 8) ^ ((tok % 8) * 4)) * 8,
                    ok ? (const void *)(a.xlo + xoff[tok] + ch) : (const void *)a.xlo, ok);
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
                    int tok = wn * NI * 8 + ni * 8 + gid;
                    uint4 b = *(const uint4 *)(Bs + tok * T_::BSTR + ((kk * 4 + tig) ^ bx) * 16);
                    uint2 bl = make_uint2(0u, 0u);
                    if (KIND == DS_W_BF16)
                        bl = *(const uint2 *)(Bs + T_::BBYTES + tok * T_::LSTR + ((kk * 4 + tig) ^ (gid * 4)) * 8);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        mmak<KIND>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b.x, b.y);
                        mmak<KIND>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b.z, b.w);
                        if (KIND == DS_W_BF16)
                            mmak<KIND>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bl.x, bl.y);
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
template <int KIND, int MODE> void launch_tile(cudaStream_t st, const mma_args &a, int rows, int T, unsigned nz, int ts) {
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

#define X(K, M) template void launch_tile<K, M>(cudaStream_t, const mma_args &, int, int, unsigned, int);
MMA_KINDS_MODES(X)
#undef X
