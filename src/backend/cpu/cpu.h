/* cpu.h — the CPU backend's kernels (C11 + AVX2/FMA/F16C + OpenMP). */
#ifndef DS_CPU_H
#define DS_CPU_H

#include "backend/backend.h"

void ds_cpu_matmul(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y);
/* One output of ds_cpu_matmul through the portable path (tests compare). */
float ds_cpu_row_dot(const ds_weight *w, int r, const float *x);

#endif
