/* matmul.cu — products y = w x for every storage kind (weights dequantized in
 * registers, fp32 accumulation), and the grouped output projection.
 * MXFP4 matrices (FP4-E8M0) go to fp4.cu, BF16 and FP8 matrices with 16-byte
 * rows to the tensor cores (mma/) for every T; the SIMT kernels below serve
 * the other kinds/shapes.
 *
 * One warp per weight row r; lane l reads the row's 16-byte chunks l, l+32,
 * ... (coalesced 512-byte warp loads, DSC_MM_UNROLL in flight) and FMAs them
 * into one partial per token; the 32 partials meet in a fixed xor tree.
 * Tokens are looped inside the kernel in tiles of DSC_MM_NT that share the
 * dequantized weights: a token's arithmetic is the same whatever T, its row t
 * or the grid (docs/design.md §1 rules 1-2). Order of y[t][r]:
 *   lane partial_l = fma chain over chunks l, l+32, ... (elements ascending)
 *   y = xor-tree(partial_0..31)                                   (fixed) */
#include <stdio.h>

#include "backend/cuda/internal.h"

template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32)
    mm_kernel(dsc_w w, const float *__restrict__ x, int xs, int xg, int rpg, int T, float *__restrict__ y, int ys,
              int xvec) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r = blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5);
    if (r >= w.rows) return;
    const float *xb = x + (size_t)(r / rpg) * (size_t)xg;
    for (int t0 = blockIdx.y * DSC_MM_NT; t0 < T; t0 += gridDim.y * DSC_MM_NT) {
        int nt = T - t0 < DSC_MM_NT ? T - t0 : DSC_MM_NT;
        const float *xj[DSC_MM_NT];
        float acc[DSC_MM_NT];
#pragma unroll
        for (int j = 0; j < DSC_MM_NT; j++) {
            xj[j] = xb + (size_t)(t0 + (j < nt ? j : 0)) * (size_t)xs;
            acc[j] = 0.0f;
        }
        dsc_row_dot<KIND, DSC_MM_NT>(w, r, lane, xj, nt, xvec, acc);
#pragma unroll
        for (int j = 0; j < DSC_MM_NT; j++) {
            if (j >= nt) break;
            float v = dsc_warp_sum(acc[j]);
            if (lane == 0) y[(size_t)(t0 + j) * (size_t)ys + r] = v;
        }
    }
}

/* Several tokens: one warp per DSC_MM_RW consecutive rows (of one group), so
 * that each x load feeds DSC_MM_RW rows. A (row, token)'s arithmetic is
 * mm_kernel's (dsc_rows_dot), so which kernel runs never changes a bit. */
template <int KIND>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32)
    mm_tiled_kernel(dsc_w w, const float *__restrict__ x, int xs, int xg, int rpg, int T, float *__restrict__ y,
                    int ys) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5)) * DSC_MM_RW;
    if (r0 >= w.rows) return;
    const float *xb = x + (size_t)(r0 / rpg) * (size_t)xg;
    for (int t0 = blockIdx.y * DSC_MM_NT; t0 < T; t0 += gridDim.y * DSC_MM_NT) {
        int nt = T - t0 < DSC_MM_NT ? T - t0 : DSC_MM_NT;
        const float *xj[DSC_MM_NT];
        float acc[DSC_MM_RW * DSC_MM_NT];
#pragma unroll
        for (int j = 0; j < DSC_MM_NT; j++) xj[j] = xb + (size_t)(t0 + (j < nt ? j : 0)) * (size_t)xs;
#pragma unroll
        for (int i = 0; i < DSC_MM_RW * DSC_MM_NT; i++) acc[i] = 0.0f;
        dsc_rows_dot<KIND, DSC_MM_NT, DSC_MM_RW>(w, r0, lane, xj, nt, acc);
#pragma unroll
        for (int q = 0; q < DSC_MM_RW; q++) {
#pragma unroll
            for (int j = 0; j < DSC_MM_NT; j++) {
                if (j >= nt) break;
                float v = dsc_warp_sum(acc[q * DSC_MM_NT + j]);
                if (lane == 0 && r0 + q < w.rows) y[(size_t)(t0 + j) * (size_t)ys + r0 + q] = v;
            }
        }
    }
}

/* Few tokens (T < DSC_MM_TILED_MIN_T, regular shapes): one warp per RW rows
 * with DSC_MM_GEMV_U chunks of every row in flight per lane (decode is a
 * read of the weights: bytes in flight are what counts), tokens one after
 * the other (the rows come from L1/L2 again). A (row, token)'s arithmetic
 * is mm_kernel's (dsc_rows_dot_p), so which kernel runs never changes a bit. */
template <int KIND, int RW>
__global__ void __launch_bounds__(DSC_MM_WARPS * 32)
    mm_gemv_kernel(dsc_w w, const float *__restrict__ x, int xs, int xg, int rpg, int T, float *__restrict__ y,
                   int ys) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31, r0 = (blockIdx.x * DSC_MM_WARPS + (threadIdx.x >> 5)) * RW;
    if (r0 >= w.rows) return;
    const float *xb = x + (size_t)(r0 / rpg) * (size_t)xg;
    for (int t = 0; t < T; t++) {
        const float *xj[1] = {xb + (size_t)t * (size_t)xs};
        float acc[RW];
#pragma unroll
        for (int q = 0; q < RW; q++) acc[q] = 0.0f;
        dsc_rows_dot<KIND, 1, RW, DSC_MM_GEMV_U>(w, r0, lane, xj, 1, acc);
#pragma unroll
        for (int q = 0; q < RW; q++) {
            float v = dsc_warp_sum(acc[q]);
            if (lane == 0 && r0 + q < w.rows) y[(size_t)t * (size_t)ys + r0 + q] = v;
        }
    }
}

template <int KIND> static int regular(const dsc_w &w, int rpg, int xvec, int rw = DSC_MM_RW) {
    size_t rowbytes = (size_t)w.cols * dsc_kind<KIND>::NUM / dsc_kind<KIND>::DEN;
    return xvec && ((uintptr_t)w.data & 15) == 0 && rowbytes % 16 == 0 && w.cols % dsc_kind<KIND>::V == 0 &&
           rpg % rw == 0;
}

template <int KIND>
static void launch(cudaStream_t st, dsc_w w, const float *x, int xs, int xg, int rpg, int T, float *y, int ys,
                   int xvec) {
    int ty = (T + DSC_MM_NT - 1) / DSC_MM_NT;
    dim3 block(DSC_MM_WARPS * 32);
    if (T >= DSC_MM_TILED_MIN_T && regular<KIND>(w, rpg, xvec)) {
        int rpb = DSC_MM_WARPS * DSC_MM_RW;
        dim3 grid((unsigned)((w.rows + rpb - 1) / rpb), (unsigned)(ty < 65535 ? ty : 65535));
        dsc_launch(mm_tiled_kernel<KIND>, grid, block, 0, st, w, x, xs, xg, rpg, T, y, ys);
        return;
    }
    int rw = dsc_gemv_rows(w.rows);
    while (rw > 1 && !regular<KIND>(w, rpg, xvec, rw)) rw /= 2;
    if (T < DSC_MM_TILED_MIN_T && regular<KIND>(w, rpg, xvec, rw)) {
        dim3 grid((unsigned)((w.rows + DSC_MM_WARPS * rw - 1) / (DSC_MM_WARPS * rw)));
        if (rw == 4)
            dsc_launch(mm_gemv_kernel<KIND, 4>, grid, block, 0, st, w, x, xs, xg, rpg, T, y, ys);
        else if (rw == 2)
            dsc_launch(mm_gemv_kernel<KIND, 2>, grid, block, 0, st, w, x, xs, xg, rpg, T, y, ys);
        else
            dsc_launch(mm_gemv_kernel<KIND, 1>, grid, block, 0, st, w, x, xs, xg, rpg, T, y, ys);
        return;
    }
    dim3 grid((unsigned)((w.rows + DSC_MM_WARPS - 1) / DSC_MM_WARPS), (unsigned)(ty < 65535 ? ty : 65535));
    dsc_launch(mm_kernel<KIND>, grid, block, 0, st, w, x, xs, xg, rpg, T, y, ys, xvec);
}

int dsc_launch_matmul(cudaStream_t st, dsc_buf *mb, int kind, dsc_w w, const float *x, int xs, int xg, int rpg, int T,
                      float *y, int ys) {
    if (T <= 0 || w.rows <= 0) return 0;
    /* FP4-E8M0: exact integer sums on the integer tensor cores (fp4.cu) */
    if (dsc_fp4_fits(kind, w)) return dsc_fp4_matmul(st, mb, w, x, xs, xg, rpg, T, y, ys);
    /* BF16 / FP8 matrices with 16-byte rows: tensor cores, for every T */
    if (dsc_mma_fits(kind, w, rpg)) return dsc_mma_matmul(st, mb, kind, w, x, xs, xg, rpg, T, y, ys);
    int xvec = ((uintptr_t)x & 15) == 0 && xs % 4 == 0 && xg % 4 == 0;
    switch (kind) {
    case DS_W_F32: launch<DS_W_F32>(st, w, x, xs, xg, rpg, T, y, ys, xvec); break;
    case DS_W_BF16: launch<DS_W_BF16>(st, w, x, xs, xg, rpg, T, y, ys, xvec); break;
    case DS_W_F16: launch<DS_W_F16>(st, w, x, xs, xg, rpg, T, y, ys, xvec); break;
    case DS_W_FP8: launch<DS_W_FP8>(st, w, x, xs, xg, rpg, T, y, ys, xvec); break;
    case DS_W_FP4: launch<DS_W_FP4>(st, w, x, xs, xg, rpg, T, y, ys, xvec); break;
    default: return -1;
    }
    return 0;
}

static uint64_t wbytes(const ds_weight *w) {
    uint64_t n = (uint64_t)w->rows * (uint64_t)w->cols, ss = w->scale_f32 ? 4 : 1;
    switch (w->kind) {
    case DS_W_F32: return n * 4;
    case DS_W_BF16:
    case DS_W_F16: return n * 2;
    case DS_W_FP8: return n + ss * (uint64_t)((w->rows + DS_FP8_BLOCK - 1) / DS_FP8_BLOCK) * (uint64_t)w->scale_cols;
    case DS_W_FP4: return n / 2 + ss * (uint64_t)w->rows * (uint64_t)w->scale_cols;
    }
    return 0;
}

static int check_weight(const ds_weight *w, ds_err *err, const char *op) {
    if (!w || (unsigned)w->kind > DS_W_FP4)
        return dsc_failmsg(err, op, "weight '%s': unknown storage kind", w && w->name ? w->name : "?");
    if (w->rows < 0 || w->cols <= 0 || (w->kind == DS_W_FP4 && w->cols % 2))
        return dsc_failmsg(err, op, "weight '%s': bad shape [%d, %d]", w->name ? w->name : "?", w->rows, w->cols);
    if ((w->kind == DS_W_FP8 || w->kind == DS_W_FP4) && !w->scale)
        return dsc_failmsg(err, op, "weight '%s': no scales", w->name ? w->name : "?");
    return 0;
}

/* The profile: a batch's time and bytes under the kind with most bytes. */
static void account(const ds_backend *be, const ds_weight *const *ws, int n, double t0) {
    dsc_impl *I = dsc_of(be);
    cudaStreamSynchronize(I->stream);
    double dt = dsc_now() - t0, by[5] = {0};
    for (int i = 0; i < n; i++) by[ws[i]->kind] += (double)wbytes(ws[i]);
    int best = 0;
    for (int k = 1; k < 5; k++)
        if (by[k] > by[best]) best = k;
    double tot = by[0] + by[1] + by[2] + by[3] + by[4];
    be->profile->mm_seconds[best] += dt;
    be->profile->mm_bytes[best] += tot;
    be->profile->mm_calls[best]++;
}

extern "C" int dsc_matmul_many(const ds_backend *be, const ds_matmul_job *jobs, int n, ds_err *err) {
    const char *op = "matmul";
    if (dsc_use_lane(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    double t0 = 0;
    if (be->profile) {
        cudaStreamSynchronize(I->stream);
        t0 = dsc_now();
    }
    for (int i = 0; i < n; i++) {
        const ds_matmul_job *j = &jobs[i];
        if (check_weight(j->w, err, op)) return -1;
        if (dsc_launch_matmul(dsc_st(I), dsc_xhl(I), j->w->kind, dsc_wdesc(j->w), j->x, j->w->cols, 0,
                              1 << 30, j->T, j->y, j->w->rows))
            return dsc_failmsg(err, op, "weight '%s': unsupported kind or out of device memory", j->w->name ? j->w->name : "?");
        if (dsc_check_launch(err, op)) return -1;
    }
    if (be->profile && n > 0) {
        const ds_weight *ws[64];
        int m = n < 64 ? n : 64;
        for (int i = 0; i < m; i++) ws[i] = jobs[i].w;
        account(be, ws, m, t0);
    }
    return 0;
}

extern "C" int dsc_matmul_grouped(const ds_backend *be, const ds_matmul_grouped *p, ds_err *err) {
    const char *op = "matmul_grouped";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (check_weight(p->w, err, op)) return -1;
    if (p->G <= 0 || p->w->rows % p->G)
        return dsc_failmsg(err, op, "weight '%s': %d rows do not split into %d groups", p->w->name ? p->w->name : "?",
                           p->w->rows, p->G);
    double t0 = 0;
    if (be->profile) {
        cudaStreamSynchronize(I->stream);
        t0 = dsc_now();
    }
    int K = p->w->cols, Rg = p->w->rows / p->G;
    /* row r reads x columns [(r / Rg) * K, +K) of a [T][G*K] row */
    if (dsc_launch_matmul(I->stream, &I->scratch[DSC_S_XHL], p->w->kind, dsc_wdesc(p->w), p->x, p->G * K, K, Rg, p->T,
                          p->y, p->w->rows))
        return dsc_failmsg(err, op, "unsupported kind or out of device memory");
    if (dsc_check_launch(err, op)) return -1;
    if (be->profile) {
        const ds_weight *ws[1] = {p->w};
        account(be, ws, 1, t0);
    }
    return 0;
}
