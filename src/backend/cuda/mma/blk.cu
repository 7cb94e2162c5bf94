/* mma/blk.cu — the block kernel: one block per 16-row tile, its warps on
 * different groups, the partials in shared memory added in group order
 * (common.cuh: the numerics and ORDER). */
#include "backend/cuda/mma/common.cuh"

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

/* mma_blk_kernel over grid: NB token tiles; hx: the activations loaded ahead
 * (NB = 1 only). */
template <int KIND, int MODE>
void launch_blk(cudaStream_t st, const mma_args &a, dim3 grid, size_t smem, int NB, bool hx) {
    if (NB == 1 && hx)
        dsc_launch(mma_blk_kernel<KIND, MODE, 1, true>, grid, DSC_MMA_DW * 32, smem, st, a);
    else if (NB == 1)
        dsc_launch(mma_blk_kernel<KIND, MODE, 1, false>, grid, DSC_MMA_DW * 32, smem, st, a);
    else if (NB == 2)
        dsc_launch(mma_blk_kernel<KIND, MODE, 2, false>, grid, DSC_MMA_DW * 32, smem, st, a);
    else
        dsc_launch(mma_blk_kernel<KIND, MODE, 4, false>, grid, DSC_MMA_DW * 32, smem, st, a);
}

#define X(K, M) template void launch_blk<K, M>(cudaStream_t, const mma_args &, dim3, size_t, int, bool);
MMA_KINDS_MODES(X)
#undef X
