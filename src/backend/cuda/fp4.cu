/* fp4.cu — MXFP4 products (the routed experts, paper §2.1; docs/numerics.md)
 * as exact integer sums on the integer tensor cores, with the CPU's bits.
 *
 * The definition is cpu/matmul/dispatch.c's (its header): x quantized once per row
 * and 32-column group to a power-of-two step s = 2^e and v = rint(x 2^(16-e))
 * = 65536 hi + 256 lo + lo2 (three int8 digits); per group H = sum(w2 (256 hi
 * + lo)) and L = sum(w2 lo2) exact (w2 = twice the E2M1 value, an integer),
 * S = fma((float)H, 256, (float)L); lane l = 4q + p of 16 fp32 accumulators
 * takes group 16m + 4p + q, m ascending: A[l] = fma(S, ws * sx, A[l]); y =
 * hsum(A). Every operation after the integer sums is an IEEE fp32 one that
 * both devices do alike (--fmad=false, no flush to zero), so y has the CPU's
 * bits for every T, batch position and tile.
 *
 * fp4_quant_kernel: one warp per (row, group), lane j = column j: the group's
 *   max |x| as bits (a warp max), e, the digits, sx = 2^(e-17) (NaN for a
 *   group with a NaN or an infinity, 0 for an all-zero group). Digits are
 *   stored per row and group as 96 bytes, [digit][word w][8]: byte 8w + n
 *   holds column 8w + p of the group where n = dsc_fp4_nib(p) — the nibble of
 *   the device's reordered code word w that holds column p, so a thread's
 *   word of codes and its 8 bytes of digits line up without a shuffle.
 * fp4_mma_kernel: a block per RT 16-row tiles (and expert, and chunk of rows
 *   of x), 4 warps; warp p takes the 128-column block p of every span (groups
 *   16m + 4p + q, q = 0..3: lanes 4q + p). Per group, thread (gid, tig) holds
 *   code word tig of rows gid and gid + 8 of each row tile, decodes it to w2
 *   as two int8x4 registers (nibbles 0..3 and 4..7), and
 *   mma.m16n8k32.s8.s8.s32 gives H's two parts and L for 16 rows x 8 tokens
 *   from a zero accumulator (exact); then S and the fma into the lane's
 *   accumulator. At the end the 16 lanes of each output meet in shared memory
 *   and one thread adds them in hsum's order. Tokens go 8 * NB a pass (NB
 *   token tiles share each decoded word, RT row tiles each token tile's
 *   digits); neither changes an output's operations. */
#include <string.h>

#include "backend/cuda/internal.h"

#define FP4_DIG 96      /* digit bytes per row and group */
#define FP4_EMIN (-109) /* cpu/matmul/matmul_impl.h's Q4_EMIN */
#define FP4_CHUNK 64    /* rows of x per block of the expert products */

/* ---- quantization -------------------------------------------------------- */

__device__ __forceinline__ int fp4_digit(int v) {
    int d = v & 255;
    return d > 127 ? d - 256 : d;
}

__global__ void __launch_bounds__(256)
    fp4_quant_kernel(const float *__restrict__ x, size_t xs, size_t xg, int nz, int rows, int G,
                     uint8_t *__restrict__ dig, float *__restrict__ sxo) {
    DSC_PDL_WAIT();
    int lane = threadIdx.x & 31;
    size_t nw = (size_t)rows * G;
    for (size_t wi = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); wi < nw;
         wi += (size_t)gridDim.x * (blockDim.x >> 5)) {
        size_t row = wi / (size_t)G;
        int g = (int)(wi % (size_t)G);
        /* row = token j * nz + row group z: x of token j, columns of group z */
        size_t j = row / (size_t)nz, z = row % (size_t)nz;
        float v = x[j * xs + z * xg + (size_t)g * 32 + lane];
        unsigned amax = __reduce_max_sync(0xffffffffu, __float_as_uint(v) & 0x7FFFFFFFu);
        int d[3] = {0, 0, 0};
        float sx;
        if (amax >= 0x7F800000u || amax == 0) {
            sx = amax ? __int_as_float(0x7FC00000) : 0.0f;
        } else {
            int E = (int)(amax >> 23), e = (amax & 0x7FFFFFu) <= 63u << 17 ? E - 133 : E - 132;
            e = e < FP4_EMIN ? FP4_EMIN : e;
            int iv = __float2int_rn(__fmul_rn(v, __uint_as_float((unsigned)(127 + 16 - e) << 23)));
            int l2 = fp4_digit(iv), v1 = (iv - l2) / 256, lo = fp4_digit(v1);
            d[0] = (v1 - lo) / 256, d[1] = lo, d[2] = l2;
            sx = __uint_as_float((unsigned)(127 + e - 17) << 23);
        }
        uint8_t *o = dig + wi * FP4_DIG + 8 * (lane >> 3) + dsc_fp4_nib(lane & 7);
#pragma unroll
        for (int k = 0; k < 3; k++) o[32 * k] = (uint8_t)(d[k] & 255);
        if (lane == 0) sxo[wi] = sx;
    }
}

/* ---- the product ------------------------------------------------------------ */

enum { FP4_PLAIN = 0, FP4_UP = 1, FP4_DOWN = 2 };

struct fp4_args {
    dsc_w w;                        /* PLAIN: the matrix; UP / DOWN: the experts' shape */
    const dsc_expert_ptrs *t1, *t3; /* UP: w1, w3; DOWN: w2 (t1) */
    const uint8_t *dig;             /* quantized x: [xrow][G][FP4_DIG] */
    const float *sx;                /* [xrow][G] */
    float *y;
    int ys, T, rpg, nz, half, k;
    const int *off, *active, *n_active, *members;
};

/* E8M0 byte -> fp32 (0: 2^-127, 255: NaN; ds_e8m0_to_f32's values). */
__device__ __forceinline__ float fp4_e8m0(unsigned e) {
    return __uint_as_float(e == 0 ? 0x00400000u : e == 255 ? 0x7FC00000u : e << 23);
}

/* Codes of nibbles 0..3 of c (its low 16 bits) as four int8 w2 values: the
 * positive and the negative table looked up by the low 3 bits, then each
 * byte taken from one or the other by the code's sign bit. */
__device__ __forceinline__ unsigned fp4_w2x4(unsigned c) {
    const unsigned P0 = 0x03020100u, P1 = 0x0C080604u; /* 0 1 2 3 | 4 6 8 12 */
    const unsigned N0 = 0xFDFEFF00u, N1 = 0xF4F8FAFCu; /* 0 -1 -2 -3 | -4 -6 -8 -12 */
    unsigned s = c & 0x7777u;
    unsigned p = __byte_perm(P0, P1, s), n = __byte_perm(N0, N1, s);
    return __byte_perm(p, n, 0x3210u | ((c >> 1) & 0x4444u));
}

__device__ __forceinline__ void fp4_mma(int (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

/* The block's matrix view (RT 16-row tiles from r0), rows of x and outputs:
 * false when the block has nothing to do. */
template <int MODE, int RT>
__device__ __forceinline__ bool fp4_setup(const fp4_args &a, dsc_w &w, int &r0, int &yc, int &j0, int &cnt, int &m0,
                                          int &z) {
    w = a.w;
    r0 = blockIdx.x * 16 * RT;
    yc = r0;
    z = 0;
    m0 = 0;
    if (MODE == FP4_PLAIN) {
        z = blockIdx.y;
        if (a.rpg < w.rows) { /* row group z: its rows are a view, x its segment */
            int yb = z * a.rpg;
            w.rows = min(a.rpg, w.rows - yb);
            w.data += (size_t)yb * (size_t)(w.cols / 2);
            w.scale += (size_t)yb * (size_t)w.scale_cols;
            yc = yb + r0;
        }
        j0 = blockIdx.z * FP4_CHUNK;
        cnt = min(a.T - j0, FP4_CHUNK);
        return r0 < w.rows && cnt > 0;
    }
    if (blockIdx.y >= (unsigned)*a.n_active) return false;
    int e = a.active[blockIdx.y];
    const dsc_expert_ptrs *t = a.t1;
    if (MODE == FP4_UP && r0 >= a.half) {
        t = a.t3;
        r0 -= a.half;
    }
    w.data = t[e].data;
    w.scale = t[e].scale;
    m0 = a.off[e];
    j0 = blockIdx.z * FP4_CHUNK;
    cnt = a.off[e + 1] - m0 - j0; /* the last chunk takes every row left */
    if (blockIdx.z + 1 < gridDim.z) cnt = min(cnt, FP4_CHUNK);
    return r0 < w.rows && cnt > 0;
}

template <int MODE> __device__ __forceinline__ size_t fp4_xrow(const fp4_args &a, int m0, int j, int z) {
    if (MODE == FP4_PLAIN) return (size_t)j * (size_t)a.nz + (size_t)z;
    if (MODE == FP4_UP) return (size_t)(a.members[m0 + j] / a.k);
    return (size_t)(m0 + j);
}

/* RT 16-row tiles a block (the token tiles' digits loaded once for all of
 * them: RT times fewer L2 reads of x), NB token tiles a pass. */
template <int MODE, int NB, int RT> __global__ void __launch_bounds__(128) fp4_mma_kernel(fp4_args a) {
    DSC_PDL_WAIT();
    __shared__ float red[RT * NB][16][16][8]; /* [row tile, token tile][lane][row][token] */
    dsc_w w;
    int r0, yc, j0, cnt, m0, z;
    if (!fp4_setup<MODE, RT>(a, w, r0, yc, j0, cnt, m0, z)) return;
    const int tid = threadIdx.x, lane = tid & 31, p = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int G = w.cols / 32, rb = w.cols / 2;
    bool ok[RT][2];
    const uint8_t *wr[RT][2], *sr[RT][2];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = r0 + 16 * rt + 8 * h + gid;
            ok[rt][h] = r < w.rows;
            r = ok[rt][h] ? r : 0;
            wr[rt][h] = w.data + (size_t)r * rb + 4 * tig;
            sr[rt][h] = w.scale + (size_t)r * w.scale_cols;
        }
    for (int jt = 0; jt < cnt; jt += 8 * NB) {
        /* this thread's B rows (token jt + 8 nb + gid) and epilogue tokens (jt + 8 nb + 2 tig + i) */
        const uint8_t *xb[NB];
        const float *sxr[NB][2];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            int jb = jt + 8 * nb + gid;
            xb[nb] = jb < cnt ? a.dig + fp4_xrow<MODE>(a, m0, j0 + jb, z) * G * FP4_DIG + 8 * tig : NULL;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int je = jt + 8 * nb + 2 * tig + i;
                sxr[nb][i] = je < cnt ? a.sx + fp4_xrow<MODE>(a, m0, j0 + je, z) * G : NULL;
            }
        }
        float acc[RT][NB][4][4];
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[rt][nb][q][i] = 0.0f;
        for (int m = 0; 16 * m < G; m++) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int g = 16 * m + 4 * p + q;
                if (g >= G) break;
                unsigned af[RT][4];
                float ws[RT][2];
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    unsigned c0 = ok[rt][0] ? __ldg((const unsigned *)(wr[rt][0] + 16 * (size_t)g)) : 0u;
                    unsigned c1 = ok[rt][1] ? __ldg((const unsigned *)(wr[rt][1] + 16 * (size_t)g)) : 0u;
                    ws[rt][0] = ok[rt][0] ? fp4_e8m0(__ldg(sr[rt][0] + g)) : 0.0f;
                    ws[rt][1] = ok[rt][1] ? fp4_e8m0(__ldg(sr[rt][1] + g)) : 0.0f;
                    af[rt][0] = fp4_w2x4(c0), af[rt][1] = fp4_w2x4(c1);
                    af[rt][2] = fp4_w2x4(c0 >> 16), af[rt][3] = fp4_w2x4(c1 >> 16);
                }
#pragma unroll
                for (int nb = 0; nb < NB; nb++) {
                    uint2 bh = make_uint2(0u, 0u), bl = bh, b2 = bh;
                    if (xb[nb]) {
                        const uint8_t *d = xb[nb] + (size_t)g * FP4_DIG;
                        bh = __ldg((const uint2 *)d);
                        bl = __ldg((const uint2 *)(d + 32));
                        b2 = __ldg((const uint2 *)(d + 64));
                    }
                    float sx0 = sxr[nb][0] ? __ldg(sxr[nb][0] + g) : 0.0f;
                    float sx1 = sxr[nb][1] ? __ldg(sxr[nb][1] + g) : 0.0f;
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        int dh[4], dl[4], d2[4];
                        fp4_mma(dh, af[rt][0], af[rt][1], af[rt][2], af[rt][3], bh.x, bh.y);
                        fp4_mma(dl, af[rt][0], af[rt][1], af[rt][2], af[rt][3], bl.x, bl.y);
                        fp4_mma(d2, af[rt][0], af[rt][1], af[rt][2], af[rt][3], b2.x, b2.y);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            /* c_i: row gid + 8 (i >> 1), token 2 tig + (i & 1) */
                            float S = fmaf((float)(dh[i] * 256 + dl[i]), 256.0f, (float)d2[i]);
                            float f = __fmul_rn(ws[rt][i >> 1], i & 1 ? sx1 : sx0);
                            acc[rt][nb][q][i] = fmaf(S, f, acc[rt][nb][q][i]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        red[rt * NB + nb][4 * q + p][gid + 8 * (i >> 1)][2 * tig + (i & 1)] = acc[rt][nb][q][i];
        __syncthreads();
#pragma unroll
        for (int t = 0; t < RT * NB; t++) {
            int rt = t / NB, nb = t % NB, rr = 16 * rt + (tid >> 3), n = tid & 7, j = jt + 8 * nb + n;
            if (r0 + rr < w.rows && j < cnt) {
                float v[8];
#pragma unroll
                for (int l = 0; l < 8; l++) v[l] = __fadd_rn(red[t][l][tid >> 3][n], red[t][l + 8][tid >> 3][n]);
                float s = __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[4]), __fadd_rn(v[2], v[6])),
                                    __fadd_rn(__fadd_rn(v[1], v[5]), __fadd_rn(v[3], v[7])));
                size_t yr = MODE == FP4_PLAIN ? (size_t)(j0 + j) : (size_t)(m0 + j0 + j);
                a.y[yr * (size_t)a.ys + (size_t)(yc + rr)] = s;
            }
        }
        __syncthreads();
    }
}

/* ---- launches ----------------------------------------------------------------- */

int dsc_fp4_fits(int kind, const dsc_w &w) {
    return kind == DS_W_FP4 && !w.scale_f32 && w.rows > 0 && w.cols > 0 && w.cols % 32 == 0 &&
           w.scale_cols == w.cols / 32 && ((uintptr_t)w.data & 3) == 0;
}

/* x's rows (nrows = T * nz segments of K columns) quantized into mb[0]. */
static int fp4_quantize(cudaStream_t st, dsc_buf *mb, const float *x, size_t xs, size_t xg, int nz, size_t nrows, int K,
                        fp4_args *a) {
    size_t G = (size_t)K / 32, dig = nrows * G * FP4_DIG;
    if (dsc_buf_grow(&mb[0], dig + nrows * G * sizeof(float), 1 << 20, st)) return -1;
    a->dig = (const uint8_t *)mb[0].p;
    a->sx = (const float *)((const uint8_t *)mb[0].p + dig);
    size_t warps = nrows * G, blocks = (warps + 7) / 8;
    dsc_launch(fp4_quant_kernel, (unsigned)(blocks < 16384 ? blocks : 16384), 256, 0, st, x, xs, xg, nz, (int)nrows,
               (int)G, (uint8_t *)mb[0].p, (float *)a->sx);
    return 0;
}

/* Row tiles a block and token tiles a pass, by the step's size and the
 * shape only (the bits never depend on them): up to 8 tokens (decode) a
 * block per 16 rows, the most blocks for the weights' stream; more tokens
 * 64 rows a block, 8 tokens a pass, so each token's digits come from L2
 * once per 64 rows instead of per 16 (the w1 / w3 halves of the experts'
 * up in whole blocks, else 16 rows); against 16-row blocks of 2 or 4 token
 * tiles: docs/journal/cuda.md. grid: y, z as the caller's; x from rows. */
template <int MODE> static void fp4_launch(cudaStream_t st, const fp4_args &a, int rows, dim3 grid, int T) {
    int rt4 = T > 8 && (MODE != FP4_UP || a.half % 64 == 0);
    grid.x = (unsigned)((rows + (rt4 ? 63 : 15)) / (rt4 ? 64 : 16));
    if (rt4)
        dsc_launch(fp4_mma_kernel<MODE, 1, 4>, grid, 128, 0, st, a);
    else
        dsc_launch(fp4_mma_kernel<MODE, 1, 1>, grid, 128, 0, st, a);
}

int dsc_fp4_matmul(cudaStream_t st, dsc_buf *mb, dsc_w w, const float *x, int xs, int xg, int rpg, int T, float *y,
                   int ys) {
    fp4_args a;
    memset(&a, 0, sizeof a);
    a.w = w;
    a.y = y;
    a.ys = ys;
    a.T = T;
    a.rpg = rpg < w.rows ? rpg : w.rows;
    a.nz = (w.rows + a.rpg - 1) / a.rpg;
    if (fp4_quantize(st, mb, x, (size_t)xs, (size_t)xg, a.nz, (size_t)T * a.nz, w.cols, &a)) return -1;
    dim3 grid(1u, (unsigned)a.nz, (unsigned)((T + FP4_CHUNK - 1) / FP4_CHUNK));
    fp4_launch<FP4_PLAIN>(st, a, a.rpg, grid, T);
    return 0;
}

int dsc_fp4_experts(cudaStream_t st, dsc_buf *mb, int up, dsc_w shape, const dsc_expert_ptrs *t1,
                    const dsc_expert_ptrs *t3, const float *x, int xs, int T, int maxcnt, const int *off,
                    const int *active, const int *n_active, const int *members, int k, unsigned ny, float *y, int ys) {
    fp4_args a;
    memset(&a, 0, sizeof a);
    a.w = shape;
    a.t1 = t1;
    a.t3 = t3;
    a.y = y;
    a.ys = ys;
    a.nz = 1;
    a.half = shape.rows;
    a.k = k;
    a.off = off;
    a.active = active;
    a.n_active = n_active;
    a.members = members;
    /* x: the step's T tokens (up) or its T * k pairs' rows (down) */
    size_t nrows = up ? (size_t)T : (size_t)T * (size_t)k;
    if (fp4_quantize(st, mb, x, (size_t)xs, 0, 1, nrows, shape.cols, &a)) return -1;
    int rows = up ? 2 * shape.rows : shape.rows;
    dim3 grid(1u, ny, (unsigned)((maxcnt + FP4_CHUNK - 1) / FP4_CHUNK));
    if (up)
        fp4_launch<FP4_UP>(st, a, rows, grid, maxcnt);
    else
        fp4_launch<FP4_DOWN>(st, a, rows, grid, maxcnt);
    return 0;
}
