/* mma/dec.cu — the decode kernel (few tokens): a 16-row tile's groups split
 * over warps (units), the partials added in group order (common.cuh: the
 * numerics and ORDER). */
#include "backend/cuda/mma/common.cuh"

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

/* mma_dec_kernel over grid (launch.cu sets a's tiles, units and partials):
 * NB token tiles a warp; mi2: two m16 tiles a warp (BF16 plain products). */
template <int KIND, int MODE> void launch_dec_kernel(cudaStream_t st, const mma_args &a, dim3 grid, int NB, int mi2) {
    (void)mi2;
    if constexpr (KIND == DS_W_BF16 && MODE == MMA_PLAIN)
        if (mi2) {
            dsc_launch(mma_dec_kernel<KIND, MODE, 1, 2>, grid, DSC_MMA_DSW * 32, 0, st, a);
            return;
        }
    if (NB == 1)
        dsc_launch(mma_dec_kernel<KIND, MODE, 1>, grid, DSC_MMA_DSW * 32, 0, st, a);
    else if (NB == 2)
        dsc_launch(mma_dec_kernel<KIND, MODE, 2>, grid, DSC_MMA_DSW * 32, 0, st, a);
    else
        dsc_launch(mma_dec_kernel<KIND, MODE, 4>, grid, DSC_MMA_DSW * 32, 0, st, a);
}

#define X(K, M) template void launch_dec_kernel<K, M>(cudaStream_t, const mma_args &, dim3, int, int);
MMA_KINDS_MODES(X)
#undef X
