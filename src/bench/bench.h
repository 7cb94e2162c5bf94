/* bench.h — `dsv4 bench --kernels`: the backends' kernels timed alone, no
 * model needed (kernels.c: the CPU; kernels_cuda.c: CUDA, with
 * kbench_cuda.cu in builds with the CUDA backend). A library of its own
 * (dsv4bench) that the dsv4 command links; the engine's libraries hold no
 * bench code. */
#ifndef DS_BENCH_H
#define DS_BENCH_H

/* `dsv4 bench --kernels [options]` (kernels.c); a process exit status. */
int cmd_bench_kernels(int argc, char **argv);
/* `dsv4 bench --kernels --backend cuda` (kernels_cuda.c); a process exit status. */
int cmd_bench_kernels_cuda(const char *backend, int gpu, int reps);

#endif
