/* cpu.c — the CPU backend: threads (OpenMP, static schedules over
 * independent outputs) and the attention kernel. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/clock.h"

static void cpu_parallel_for(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx) {
    if (be->n_threads <= 1 || n <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(be->n_threads)
    for (int i = 0; i < n; i++) fn(ctx, i);
}

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))
AVX512 static void axpy_512(float *o, float p, const float *v, int d) {
    __m512 pv = _mm512_set1_ps(p);
    int c = 0;
    for (; c + 16 <= d; c += 16) _mm512_storeu_ps(o + c, _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + c), _mm512_loadu_ps(o + c)));
    for (; c < d; c++) o[c] = fmaf(p, v[c], o[c]);
}
static void axpy_avx2(float *o, float p, const float *v, int d) {
    __m256 pv = _mm256_set1_ps(p);
    int c = 0;
    for (; c + 8 <= d; c += 8) _mm256_storeu_ps(o + c, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + c), _mm256_loadu_ps(o + c)));
    for (; c < d; c++) o[c] = fmaf(p, v[c], o[c]);
}
#endif

/* o[c] = fma(p, v[c], o[c]): elementwise, so the vector width cannot change the bits */
static void axpy(float *o, float p, const float *v, int d, int path) {
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
    if (path == DS_CPU_AVX512) return axpy_512(o, p, v, d);
    if (path == DS_CPU_AVX2) return axpy_avx2(o, p, v, d);
#endif
    (void)path;
    for (int c = 0; c < d; c++) o[c] = fmaf(p, v[c], o[c]);
}

typedef struct {
    const ds_attn_query *qs;
    int d, path;
    float scale;
    float *scratch;
    const size_t *offset;
} attn_job;

/* softmax over [q.k_j * scale ..., sink], then out = sum_j p_j k_j, all in
 * ascending key order. */
static void attend_one(void *ctx, int i) {
    const attn_job *J = ctx;
    const ds_attn_query *Q = &J->qs[i];
    int d = J->d, n = Q->n_keys;
    float *s = J->scratch + J->offset[i];
    float m = Q->sink;
    for (int j = 0; j < n; j++) {
        s[j] = ds_cpu_dot(Q->q, Q->keys[j], d, J->path) * J->scale;
        if (s[j] > m) m = s[j];
    }
    float sum = expf(Q->sink - m);
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    float *o = Q->out;
    for (int c = 0; c < d; c++) o[c] = 0.0f;
    for (int j = 0; j < n; j++) axpy(o, s[j] * inv, Q->keys[j], d, J->path);
}

static int cpu_attend(const ds_backend *be, const ds_attn_query *qs, int n, int d, float scale) {
    double t_start = be->profile ? ds_now() : 0;
    size_t *offset = malloc((size_t)(n + 1) * sizeof *offset);
    if (!offset) return -1;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        offset[i] = total;
        total += (size_t)qs[i].n_keys;
    }
    float *scratch = malloc((total ? total : 1) * sizeof *scratch);
    if (!scratch) {
        free(offset);
        return -1;
    }
    attn_job J = {qs, d, be->cpu_path, scale, scratch, offset};
    be->parallel_for(be, n, attend_one, &J);
    free(scratch);
    free(offset);
    if (be->profile) be->profile->attend_seconds += ds_now() - t_start;
    return 0;
}

int ds_backend_cpu_init(ds_backend *be, int n_threads) {
    memset(be, 0, sizeof *be);
    be->name = "cpu";
    be->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    be->cpu_path = ds_cpu_best_path();
    be->matmul = ds_cpu_matmul;
    be->matmul_many = ds_cpu_matmul_many;
    be->attend = cpu_attend;
    be->parallel_for = cpu_parallel_for;
    return 0;
}
