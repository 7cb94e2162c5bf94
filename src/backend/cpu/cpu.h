/* cpu.h — the CPU backend's kernels (C11 + AVX2/FMA/F16C + OpenMP). */
#ifndef DS_CPU_H
#define DS_CPU_H

#include "backend/backend.h"

enum { DS_CPU_GENERIC = 0, DS_CPU_AVX2 = 1, DS_CPU_AVX512 = 2 };

int ds_cpu_matmul(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y);
int ds_cpu_matmul_many(const ds_backend *be, const ds_matmul_job *jobs, int n);
/* The same through a chosen kernel path (every path gives the same bits). */
int ds_cpu_matmul_path(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y, int path);
/* The fastest path this CPU runs. */
int ds_cpu_best_path(void);
/* ds_dot_f32 through a chosen kernel path (the same bits on every path). */
float ds_cpu_dot(const float *a, const float *b, int n, int path);
/* One output of ds_cpu_matmul through the portable path (tests compare). */
float ds_cpu_row_dot(const ds_weight *w, int r, const float *x);

#endif
