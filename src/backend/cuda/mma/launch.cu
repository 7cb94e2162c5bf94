/* mma/launch.cu — the tensor-core products' entry points (dsc_mma_fits,
 * dsc_mma_matmul, dsc_mma_experts): the activations split for the tile
 * kernel, and the choice of kernel and tile shape by the product's shape
 * (heuristics.h; never a bit of difference). */
#include <string.h>

#include "backend/cuda/mma/common.cuh"

/* x -> BF16's split form: 4 activations -> {hi x4, mid x4} (o, 16 bytes)
 * and {lo x4} (ol, 8 bytes). */
__global__ void mma_split_kernel(const float *__restrict__ x, uint4 *__restrict__ o, uint2 *__restrict__ ol,
                                 size_t n4) {
    DSC_PDL_WAIT();
    int al = ((uintptr_t)x & 15) == 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float *p = x + 4 * i;
        float4 v = al ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
        uint32_t b[6];
        split4(v, b);
        o[i] = make_uint4(b[0], b[1], b[2], b[3]);
        ol[i] = make_uint2(b[4], b[5]);
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

/* BF16's split (mma_split_kernel) of n activations into buf: the hi / mid
 * chunks, then the lo parts (a->xhl, a->xlo). */
static int split(cudaStream_t st, dsc_buf *buf, const float *x, size_t n, mma_args *a) {
    size_t n4 = n / 4, blocks = (n4 + 255) / 256;
    if (grow(buf, n4 * (sizeof(uint4) + sizeof(uint2)), st)) return -1;
    a->xhl = (const uint4 *)buf->p;
    a->xlo = (const uint2 *)(a->xhl + n4);
    dsc_launch(mma_split_kernel, (unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, st, x, (uint4 *)a->xhl,
               (uint2 *)a->xlo, n4);
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
int dsc_mma_sm_count(void) {
    int dev = 0, nsm = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    return nsm;
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
        launch_blk<KIND, MODE>(st, a, grid, smem, NB, NB == 1 && (rows + 15) / 16 < DSC_MMA_HX_TILES);
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
    launch_dec_kernel<KIND, MODE>(st, a, grid, NB, mi2);
    return 0;
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
        if (split(st, &mb[0], x, (size_t)T * (size_t)xs, &a)) return -1;
    }
    int rows = G > 1 ? rpg : w.rows;
    int ts = dec ? DSC_MMA_TS_64 : dsc_mma_plain_tile(rows, T, (unsigned)G, dsc_mma_sm_count());
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
            if (split(st, &mb[0], x, rows * (size_t)xs, &a)) return -1;
        }
        /* the x16 / x8 tiles: at most DSC_MMA_XTOK tokens of an expert per block's pass */
        if (ts != DSC_MMA_TS_64 && maxcnt > DSC_MMA_XTOK) maxcnt = DSC_MMA_XTOK;
    }
    a.T = maxcnt;
    int rows = up ? 2 * shape.rows : shape.rows;
    if (up) return launch_kind<MMA_UP>(st, mb, kind, dec, ts, a, rows, maxcnt, ny);
    return launch_kind<MMA_DOWN>(st, mb, kind, dec, ts, a, rows, maxcnt, ny);
}
