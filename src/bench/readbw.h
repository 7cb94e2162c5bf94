/* readbw.h — the plain read the bench's bandwidth floor is measured with. */
#ifndef DS_BENCH_READBW_H
#define DS_BENCH_READBW_H

#include <stddef.h>

/* Sum of n floats read in 16 KiB blocks over `threads` threads (AVX2 loads
 * with software prefetch: the fastest plain read measured on the dev
 * machine); the sum only keeps the reads from being optimized away. */
double readbw_sum(const float *buf, size_t n, int threads);

#endif
