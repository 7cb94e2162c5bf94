/* heuristics.c — the CPU kernel path (see heuristics.h). */
#include "backend/cpu/heuristics.h"

#include <unistd.h>

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DS_X86 1
#endif

int ds_cpu_best_path(void) {
#ifdef DS_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return DS_CPU_AVX512;
    return DS_CPU_AVX2;
#else
    return DS_CPU_GENERIC;
#endif
}

int ds_cpu_has_vnni(void) {
#ifdef DS_X86
    return ds_cpu_best_path() == DS_CPU_AVX512 && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

int ds_cpu_l1d(void) {
#ifdef _SC_LEVEL1_DCACHE_SIZE
    long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return l1 > 0 && l1 < (1L << 30) ? (int)l1 : 0;
#else
    return 0;
#endif
}
