/* readbw.c — see readbw.h. */
#include "bench/readbw.h"

#include <immintrin.h>

double readbw_sum(const float *buf, size_t nf, int threads) {
    double s = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : s) schedule(static)
    for (size_t blk = 0; blk < nf / 4096; blk++) {
        const float *p = buf + blk * 4096;
#ifdef __AVX2__
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < 4096; i += 32) { /* prefetching 8 KiB ahead, as the kernels do: a few % more here */
            _mm_prefetch((const char *)(p + i) + 8192, _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i) + 8192 + 64, _MM_HINT_T0);
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
        }
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (int i = 0; i < 8; i++) s += (double)t[i];
#else
        for (int i = 0; i < 4096; i++) s += (double)p[i];
#endif
    }
    return s;
}
