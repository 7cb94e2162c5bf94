/* heuristics.h — every tile and launch-shape constant of the CUDA backend in
 * one place (cf. DeepGEMM's heuristics). None of them may depend on T: they
 * fix how work is spread, never a reduction order that changes with the
 * batch. Those that ARE part of a reduction order are marked ORDER; changing
 * one changes the bits (for every T alike). */
#ifndef DS_CUDA_HEURISTICS_H
#define DS_CUDA_HEURISTICS_H

/* matmul (matmul.cu, moe.cu): one warp per weight row; lane l owns the
 * 16-byte chunks l, l+32, l+64, ... of the row (ORDER: lanes accumulate their
 * chunks in ascending order, then a fixed xor-shuffle tree over 32 lanes). */
#define DSC_MM_WARPS 8          /* warps (weight rows) per block */
#define DSC_MM_NT 8             /* tokens sharing one weight load (not ORDER) */
#define DSC_MM_UNROLL 4         /* chunks in flight per lane */
#define DSC_MM_RW 4             /* rows per warp from DSC_MM_TILED_MIN_T tokens on
                                 * (not ORDER: each x load feeds RW rows) */
#define DSC_MM_TILED_MIN_T 4
/* few tokens (T < DSC_MM_TILED_MIN_T): chunks of every row in flight per
 * lane, and rows per warp (sharing each x load) by the matrix's height (not
 * ORDER). Measured on the H200 (flash, 4 layers, decode at batch 1): U 4 with
 * up to 4 rows per warp needs ~200 registers (one block per SM, 12% occupancy)
 * and decoded in 2.25-2.48 ms/token; U 2 in 2.14. */
#ifndef DSC_MM_GEMV_U
#define DSC_MM_GEMV_U 2
#endif
static inline int dsc_gemv_rows(int rows) { return rows >= 2048 ? 2 : 1; }
#define DSC_MOE_GEMV_RW 2       /* w1 and w3 rows per warp in the experts' decode path */
#define DSC_MOE_NT 8            /* tokens per weight load in the experts (not ORDER:
                                 * a token's fmaf chain is the same for any tile) */

/* tensor-core products (mma/): BF16 and FP8 weights, shapes with 16-byte
 * rows. ORDER: K in groups of DSC_MMA_G columns, each
 * group a fresh fp32 MMA accumulator (8 steps of m16n8k16, x_hi then x_lo),
 * the groups' partials (times the FP8 scale) added in ascending order; inside
 * a step thread tig's 4 fragment slots hold columns tig*32 + kk*4 + 0..3 of
 * the group (mma/common.cuh). */
#define DSC_MMA_G 128           /* ORDER */
#define DSC_MMA_BM 64           /* tile kernel: rows per block (not ORDER; the
                                 * 64 shape's warps (mma/tile.cu launch_tile) assume 64) */
#define DSC_MMA_BN 64           /* tile kernel: tokens per block (not ORDER; idem) */
#define DSC_MMA_DW 8            /* experts' decode kernel: warps per 16-row tile (not ORDER) */
#define DSC_MMA_GW 2            /* experts' decode kernel: groups per warp per round (not ORDER) */
#define DSC_MMA_BLK_TILES 256   /* FP8 plain products with at least this many 16-row
                                 * tiles (all row groups) take the block kernel, the rest
                                 * (and BF16) the split kernel (not ORDER). ncu, b1: wq_b
                                 * (2048 tiles) 33 vs 40 µs, wo_a (512) 29 vs 40, wo_b (256)
                                 * 35 vs 41; wq_a (64) 16 vs 12, wkv (32) 16 vs 10, the BF16
                                 * head (8080) 398 vs 353, shared w1 (128) 17 either way */
#define DSC_MMA_HX_TILES 1024 /* block kernel at one token tile: a matrix of fewer 16-row
                                 * tiles loads a group's activations before its MMAs (32
                                 * more registers: FP8 64 -> 98, 4 -> 2 blocks per SM); more
                                 * tiles keep the loads per step (not ORDER). ncu, flash b1,
                                 * with / without: wq_b (2048 tiles) 47 / 32 µs; the FP8
                                 * products of 256 tiles 19 µs with, 23 before the branch;
                                 * the split decode kernel always loads ahead at NB = 1: the
                                 * BF16 head 350 -> 250 µs */
/* the tile kernel's shapes (not ORDER): 64 x 64 (4 warps of 16 rows x 64
 * tokens; BF16 2 x 2 warps of 32 x 32) for the plain products; for the
 * routed experts, whose pairs spread over many experts (V4-Flash prefill of
 * 512 tokens: 12 pairs per expert on average; batched decode: 1-6), 128
 * rows x 16 or x 8 tokens (4 warps of 32 rows x all the block's tokens): each
 * decoded weight fragment meets every token of the expert's tile, each
 * activation fragment 128 rows. ncu (flash, 4
 * layers, prefill 512, one H200): the experts' up / down products through the
 * decode kernel at 32 tokens a block (before) 5.8 / 2.9 ms a layer. */
#define DSC_MMA_TS_64 0
#define DSC_MMA_TS_X16 1
#define DSC_MMA_TS_X8 2
#define DSC_MMA_TS_128 3       /* 128 x 64: 8 warps (FP8 plain: 16 rows x 64 tokens each;
                                 * the rest 4 x 2 of 32 x 32), half the activation
                                 * tiles' traffic of the 64 shape per row */
/* The tile kernel's pipeline (not ORDER: the same MMAs per output in every
 * variant): cp.async stages and the blocks per SM its registers must allow
 * (__launch_bounds__). FP8 plain products in the 128 x 64 shape: 2 stages, 2
 * blocks per SM (183 -> 128 registers, 64 B of spills; 97 KB of shared memory
 * a block, no padding). ncu, flash 4 layers, prefill 512: those products 10.9
 * -> 8.6 ms (1 block per SM before: 12.5% occupancy); the 2,048-row ones (128
 * blocks, 1 per SM either way) 1.49 -> 1.63. 3 or 4 stages at 1 block per SM:
 * no gain (prefill 15.7k tok/s either way against 16.9k at 2 x 2). One H200:
 * prefill 512 16.2k -> 16.8k tok/s. */
#define DSC_MMA_T128_NST 2
#define DSC_MMA_T128_MINB 2
#define DSC_MMA_TS_32 4        /* 64 x 32: 4 warps of 16 rows x 32 tokens */
/* The plain products' tile shape, by the grid each would fill (nsm: the
 * GPU's SMs): 128 x 64 for at least 1,024 rows while its blocks number at
 * least half the SMs, else 64 x 64 while its blocks fill the SMs, else 64 x
 * 32. ncu, flash 4 layers, prefill 512 (one H200), 128 x 64 / 64 x 32 us a
 * call: wq_a (1,024 rows, 64 blocks) 223 / 155, wkv (512 rows, 64 x 64: 64
 * blocks) 149 / 112, the BF16 products of 256 rows 121 / 81; the 2,048-row
 * ones (128 blocks) 229 / 370 stay 128 x 64, the 4,096-row ones 387 on it
 * against 541 on 64 x 64 (a rule that moved them lost 5%). Prefill 512,
 * one call, rows alone deciding / this rule: 18,905 / 19,188 tok/s; batch
 * 64 decode (its products of 64 tokens: 4,096-row ones now 64 x 32) 2,298 /
 * 2,280 -> 2,572 / 2,563 tok/s with the attention change below. Rows alone,
 * measured before: 1,024 rows 18,091 / 18,174 tok/s against 17,766 / 17,785
 * at 2,048 and 17,671 / 17,751 at 4,096. */
static inline int dsc_mma_plain_tile(int rows, int T, unsigned nz, int nsm) {
    long b128 = (long)((rows + 127) / 128) * ((T + 63) / 64) * nz, b64 = (long)((rows + 63) / 64) * ((T + 63) / 64) * nz;
    if (rows >= 1024 && 2 * b128 >= nsm) return DSC_MMA_TS_128;
    return b64 >= nsm ? DSC_MMA_TS_64 : DSC_MMA_TS_32;
}
#define DSC_MMA_XBM 128         /* rows per block of the x16 / x8 shapes (the up product's
                                 * w1 / w3 halves must be whole blocks: else the 64 shape) */
#define DSC_MMA_XTOK 32         /* x16 / x8: token tiles per expert in the grid (blocks loop
                                 * over an expert's further tokens) */
#define DSC_MMA_XDEC_MAX_T 8    /* experts: up to this many tokens in the step the decode
                                 * kernels, beyond it the tile kernel */
/* The experts' tile shape from the mean pairs per active expert, P / ny
 * (the step's shape: T * k pairs over at most min(P, E) experts). */
static inline int dsc_mma_expert_tile(size_t P, unsigned ny) {
    size_t mean = ny ? (P + ny - 1) / ny : P;
    return mean <= 4 ? DSC_MMA_TS_X8 : mean <= 32 ? DSC_MMA_TS_X16 : DSC_MMA_TS_64;
}
#define DSC_MMA_STR_TILES 128  /* streaming kernel (one token tile, FP8, activations
                                 * split once per block in shared memory): plain products of
                                 * at least this many 16-row tiles, and the experts (not ORDER).
                                 * Flash b1, one H200: 2.081 ms/token; 32 (wq_a, wkv too):
                                 * 2.064, within the noise */
#define DSC_MMA_STR_MAXW 16    /* streaming kernel: warps per block of a product of fewer than
                                 * DSC_MMA_STR_FEW blocks (else DSC_MMA_DW; not ORDER) */
#define DSC_MMA_STRM_TILES 512  /* plain products of at least this many 16-row tiles (one token
                                 * tile): mma_strm_kernel, a block looping over tiles with the
                                 * next units' weights in flight across them (not ORDER).
                                 * `bench --kernels --backend cuda`, one H200: wq_b (32768 x 1024,
                                 * 2,048 tiles) 30.4 -> 20.4-20.7 us; at 128-256 tiles
                                 * (shared w1, wo_b) mma_str_kernel's 16 warps a block were
                                 * faster (8.4 vs 11.8-12.9 us) or equal. The experts' up / down
                                 * at T <= 8 take it whatever their tiles (blockIdx.z: the
                                 * expert): ncu, flash 4 layers, us per step, T = 1: up 297 ->
                                 * 205, down 180 -> 114; T = 8 (up before: mma_blk_kernel, its
                                 * 8 tokens' activations past DSC_MMA_STR_SMEM) 1,774 -> 1,403
                                 * and 937 -> 717. Measured again with the tile cursor and the
                                 * graph pieces (2026-12-02, flash 4 layers, three rounds, batch
                                 * 1 / batch 8): 512 1.547-1.553 ms/token / 2,093-2,099 tok/s,
                                 * 256 1.538-1.579 / 2,077-2,102, 128 1.569-1.574 / 2,090-2,103:
                                 * no difference, the same bits */
#define DSC_MMA_STRM_D 2        /* mma_strm_kernel: units in a warp's register ring (D - 1
                                 * loading while one is multiplied; 3 and 4: more registers,
                                 * fewer warps, slower: wq_b 22.9 / 23.8 us) */
/* mma_strm_kernel (FP8): blocks per SM its registers allow and the grid
 * gives (not ORDER): 3 (at 4: 64 registers and ~70 B of spills). wq_b with
 * the kernel before its load cursor: 2 blocks 22.0 us, 3 20.4, 4 20.5. At 4
 * again (2026-12-05, ncu on an H100, one token): wq_b 15.9 -> 21.6 us, wo_a
 * 19.8 -> 20.9 (then one tile a block instead of 1-2), batch 1 1.386 -> 1.412
 * ms/token: a block's tiles are not what holds these products. */
#define DSC_MMA_STRM_MINB 3
#define DSC_MMA_STRM_XSMEM (56 * 1024) /* mma_strm_kernel for the experts: an expert's tokens in
                                 * passes of the most whose split activations and partials fit
                                 * this much shared memory (4 blocks per SM: flash's up, K =
                                 * 4,096, 2 tokens a pass; down 5). Not ORDER */
#define DSC_MMA_STR_FEW 264     /* two blocks per SM of the H200 */
#define DSC_MMA_STR_SMEM (100 * 1024) /* streaming kernel: at most this much shared memory (the
                                 * tile's split activations and partials); more: the other
                                 * kernels (not ORDER) */
#define DSC_MMA_DSW 4           /* decode kernel: warps per block, each its own unit (not ORDER) */
#define DSC_MMA_DLOADS 8        /* decode kernel: 16-byte weight loads in flight per thread
                                 * (GR = 8 / (2 CPT) groups a round: BF16 1, FP8 2; not
                                 * ORDER) */
#define DSC_MMA_DEC_MI2_T 8      /* decode kernel: BF16 plain products of at least
                                 * DSC_MMA_DEC_MI2_ROWS rows (all row groups) at this many to 8
                                 * tokens give a warp two m16 tiles that share each activation
                                 * fragment (the head at 8 tokens read every token's
                                 * activations through L1 per 16 rows; not ORDER). One H200,
                                 * flash 4 layers (the head: 129,280 rows), two rounds, tok/s
                                 * one tile / two: batch 8 1,789-1,806 / 1,835-1,844, batch 2
                                 * 861-877 / 839-851 (168 registers instead of 122: fewer warps,
                                 * and at 2 tokens the activations are few); 3..7 not measured */
#define DSC_MMA_DEC_MI2_ROWS 65536
#define DSC_MMA_DEC_WARPS 4096  /* decode kernel: a matrix whose 16-row tiles give fewer
                                 * warps than this splits each tile's groups over several
                                 * warps (units; not ORDER: the partials are added in group
                                 * order either way). Measured (flash, 4 layers, b1, one
                                 * H200): 4096 / 8192 / 16384 / 32768 -> 2.34 / 2.39 / 2.40 /
                                 * 2.60 ms/token. A 3-stage cp.async ring per warp instead of
                                 * the register loads (48 KB of shared memory per block, 25%
                                 * occupancy) was slower: 2.73-3.03 */
/* Units per 16-row tile and groups per unit of the decode kernel, from the
 * matrix's shape only (tiles: 16-row tiles of all its row groups; ng: its
 * DSC_MMA_G-column groups); never from T. */
static inline void dsc_mma_dec_split(long tiles, int ng, int *units, int *gpw) {
    long u = (DSC_MMA_DEC_WARPS + tiles - 1) / tiles;
    if (u > ng) u = ng;
    if (u < 1) u = 1;
    *gpw = (int)((ng + u - 1) / u);
    *units = (ng + *gpw - 1) / *gpw;
}
#define DSC_MMA_DEC_MAX_T 32    /* up to this many tokens: the decode kernel (not ORDER:
                                 * both kernels give the same bits). The head (129,280 BF16
                                 * rows) at 8 tokens in the tile kernel's 128 x 8 shape
                                 * instead: ncu 629 -> 723 us, batch 8 decode 5% slower */

/* row reductions (rmsnorm, hc mixes): ORDER: thread i sums elements
 * i, i+256, ... then a fixed tree over the block. */
#define DSC_ROW_THREADS 256

/* attention (attention.cu): one warp per (row, head, key block) then one
 * per (row, head) for the merge; ORDER: keys in blocks of DSC_ATT_KB, each
 * reduced with its own max, merged in ascending order; the dot over d
 * lane-strided float4 chunks then the xor tree. */
#define DSC_ATT_KB 64
#define DSC_ATT_WARPS 4
#define DSC_ATT_MAXD 1024       /* head_dim limit (d % 4 == 0) */
/* Heads per warp of the attention part kernel (not ORDER: each head's
 * operations are the same for every count): 4 from DSC_ATT_HW_ROWS rows of a
 * chunk (a key chunk loaded once for 4 heads), 1 below (decode: fewer warps
 * would leave SMs idle). ncu, flash 4 layers, prefill 512 (one H200): the
 * part kernel 3.95 -> 2.51 ms a prefill (6 calls); prefill 18.1k -> 18.8k
 * tok/s. The 4-head warp of d = 1024 (NC = 8) would spill: it keeps 1. */
#define DSC_ATT_HW_ROWS 16
static inline int dsc_att_heads_per_warp(int nrows, int H, int nc) {
    if (nrows >= DSC_ATT_HW_ROWS && nc <= 4 && H % 4 == 0) return 4;
    if (nrows >= DSC_ATT_HW_ROWS && nc <= 4 && H % 2 == 0) return 2;
    return 1;
}

/* indexer (indexer.cu): one warp per (row, entry) score; top-k by a block
 * radix select. */
#define DSC_IDX_WARPS 8
#define DSC_IDX_SEL_THREADS 1024

/* route (moe.cu): one warp per token. */
#define DSC_ROUTE_WARPS 4

/* compressor (compressor.cu): one block per window closed. */
#define DSC_COMP_THREADS 256

/* CUDA graphs (backend.cu): a captured step is cut into pieces of this many
 * backend ops, each launched as soon as it is captured, so the host captures
 * piece n + 1 while the GPU runs piece n (one graph for the whole step left
 * the GPU idle through the capture). DSV4_CUDA_GRAPH_OPS overrides it (0: the
 * whole step in one graph). Not ORDER: the same kernels in the same order.
 * One H200, flash 4 / 8 layers, batch 1, ms/token, two rounds: 0 (one graph)
 * 1.67-1.78 / 3.37-3.47; 2: 1.65-1.69; 4: 1.59-1.63 / 3.01-3.05; 8: 1.56-1.63
 * / 2.94-2.99; 12: 1.58-1.60; 24: 1.59-1.66; 64: 1.64-1.77. */
#define DSC_GRAPH_PIECE_OPS 8

/* elementwise kernels */
#define DSC_EW_THREADS 256

#endif
