/* heuristics.h — the one place that decides the CPU backend's kernel path and
 * tile constants (like DeepGEMM's heuristics files). None of these changes a
 * bit of any result: every path and tile gives the same bits (matmul/dispatch.c's
 * order comment); they only decide speed. */
#ifndef DS_CPU_HEURISTICS_H
#define DS_CPU_HEURISTICS_H

enum { DS_CPU_GENERIC = 0, DS_CPU_AVX2 = 1, DS_CPU_AVX512 = 2 };

/* The fastest path this CPU runs (CPUID): AVX-512 (F, BW, VL, DQ), else AVX2
 * (the build requires AVX2 + FMA + F16C on x86-64), else the portable C. */
int ds_cpu_best_path(void);
/* 1 when the CPU has AVX-512 VNNI (vpdpbusd): the AVX-512 path's MXFP4
 * kernel; without it MXFP4 runs the AVX2 kernel (the same bits). */
int ds_cpu_has_vnni(void);
/* This core's L1 data cache in bytes (sysconf; 0: unknown). */
int ds_cpu_l1d(void);

/* matmul: rows go to threads in groups of DS_CPU_ROW_GROUP (one memory
 * stream per thread) ... */
#define DS_CPU_ROW_GROUP 4
/* ... for blocks of DS_CPU_TOKEN_BLOCK tokens, whose x stays in cache while
 * all rows stream past; */
#define DS_CPU_TOKEN_BLOCK 32
/* an AVX-512 row kernel takes up to DS_CPU_NT tokens per call (each weight
 * chunk decoded once), in groups whose x fits DS_CPU_L1_X_BYTES. */
#define DS_CPU_NT 4
#define DS_CPU_L1_X_BYTES 32768
/* The AVX2 row kernels (sixteen ymm registers: a token's accumulators take
 * 8) run a call's tokens DS_CPU_AVX2_NT at a time. */
#define DS_CPU_AVX2_NT 2
/* From 3 tokens on, FP8 (K % 256 == 0) rows go in pairs sharing each x
 * load, up to DS_CPU_NT tokens per call whatever K (x may then come from
 * L2): more FMAs per load and per weight decode. MXFP4 (x quantized, 2.25
 * bytes per column) always takes up to DS_CPU_NT tokens per call. */
/* Prefill tiles (FP8 with K % 256 == 0; on AVX-512 also BF16 with K % 64
 * == 0): a product of at least DS_CPU_TILE_MIN_T tokens goes to threads in
 * groups of DS_CPU_TILE_ROWS rows, decoded DS_CPU_FP8_PANEL columns at a
 * time, then run in register tiles of 2 rows x 3 tokens (AVX-512; BF16 4
 * rows x 3 tokens) or 2 rows x 2 tokens (AVX2) over x laid out panel-major
 * (matmul/tiles.c). */
#define DS_CPU_TILE_MIN_T 8
/* 4 rows (was 8): a group's decoded panel is 8 KiB, not 16, beside its 6 KiB
 * token tile and the parked sums. Zen 4 VM (32 KiB L1), `bench --kernels
 * --threads 2`, four alternating rounds: FP8 4096x4096 / 32768x1024 /
 * 4096x8192 at 128 tokens 0.60-0.64 / 0.52-0.59 / 0.56-0.61 -> 0.64-0.67 /
 * 0.58-0.60 / 0.58-0.62 of the FMA peak; one thread streaming a 16 MB matrix
 * (32 tokens) 70-76 -> 75-81 GFLOP/s; 2 rows were as fast as 4, 6 and a 256-
 * or 1024-column panel no faster than 8 rows and 512 columns. */
#define DS_CPU_TILE_ROWS 4
#define DS_CPU_FP8_PANEL 512
/* Software prefetch distance ahead of the row being read: quantized rows,
 * and 2-byte dense rows (the hardware prefetcher left bandwidth unused). */
#define DS_CPU_PREFETCH 16384
#define DS_CPU_PREFETCH_DENSE 8192
/* Where that prefetch goes: into L1 on cores with at least this much L1
 * data cache (ds_cpu_l1d), else into L2. With a 32 KiB L1 (Zen 4) the
 * lines fetched 8-16 KiB ahead and a 16-32 KiB x vector evict each other:
 * `dsv4 bench --kernels`, 2 threads, L1 -> L2: BF16 K=4096 0.69-0.78 ->
 * 0.93-1.00 of the plain read, FP8 K=4096 0.72-0.86 -> 0.99-1.03, MXFP4
 * 0.81-0.92 -> 0.94-1.05; flash-4 decode 79-102 -> 63-69 ms per token. With
 * a 48 KiB L1 (Zen 5) L1 was measured faster for the MXFP4 kernel. */
#define DS_CPU_PREFETCH_L2_BELOW_L1D (48 * 1024)
/* A product whose x (one token's copy) is larger than NUM / DEN of L1 runs
 * its rows in pairs (the two-row kernel, where the kind has one) even for one
 * token: each x load then serves two rows. On the Zen 4 VM (32 KiB L1) FP8
 * K = 8192 (x 32 KiB, re-read from L2 for every row) went from 0.56-0.58 to
 * 0.89-0.94 of the plain read (`bench --kernels`); on the Zen 5 dev machine
 * (48 KiB L1, x 32 KiB beside 16 KiB of prefetched lines) the same product
 * in the model (V4's wo_b) went from 1.00 to 0.86-0.89 ms a call at 2
 * threads (two runs, 3-4 interleaved rounds each), so the line is half of
 * L1. The other shapes keep one row per call (two weight streams per thread
 * were slower on slow memory). */
#define DS_CPU_PAIR_X_NUM 1
#define DS_CPU_PAIR_X_DEN 2

/* MoE: experts run in batches of up to this many gathered rows (or one
 * expert's rows when more): a batch's w1 and w3 products run together, then
 * its SwiGLUs, then its w2 products — at batch 1 a layer's experts cost two
 * parallel regions, not three per expert. */
#define DS_CPU_MOE_BATCH_ROWS 256

/* Copies and elementwise work between the products (a batch's x copies and
 * quantization, the MoE gathers, SwiGLUs and scatters, the grouped product's
 * copies: ds_cpu_parallel_for_sized) run as parallel regions from this many
 * floats on, below on the calling thread (a region's wake-up costs more
 * than a decode step's few vectors). Serial, they left the
 * calling thread with ~25% more perf samples than the pool's over a 512-token
 * prefill (2 threads); now level. */
#define DS_CPU_PAR_FLOATS 65536

#endif
