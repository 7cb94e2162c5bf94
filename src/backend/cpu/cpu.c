/* cpu.c — the CPU backend: memory (host heap; weights used in place), the
 * step, threads (OpenMP, static schedules over independent outputs) and the
 * grow-only scratch every op takes its temporaries from. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

/* 1 when a test's injected allocation failure is due now */
static int alloc_fails(const ds_backend *be) {
    ds_cpu *c = ds_cpu_of(be);
    return c->fail_alloc > 0 && --c->fail_alloc == 0;
}

static void *cpu_alloc(const ds_backend *be, size_t bytes, ds_err *err) {
    void *p = alloc_fails(be) ? NULL : aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
    if (!p) ds_fail(err, "cpu backend: out of memory for a buffer of %zu bytes", bytes);
    return p;
}

static void cpu_free(const ds_backend *be, void *p) {
    (void)be;
    free(p);
}

static int cpu_copy(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err) {
    (void)be, (void)err;
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

static int cpu_memset0(const ds_backend *be, void *dst, size_t bytes, ds_err *err) {
    (void)be, (void)err;
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

/* Weights stay where they are (the mmap'd checkpoint, the loader's arrays). */
static int cpu_map_weights(const ds_backend *be, const void *host, size_t bytes, const void **out, ds_err *err) {
    (void)be, (void)bytes, (void)err;
    *out = host;
    return 0;
}

static void cpu_unmap_weights(const ds_backend *be, const void *p) { (void)be, (void)p; }

static int cpu_begin_step(const ds_backend *be, const ds_step_desc *s, ds_err *err) {
    (void)err;
    ds_cpu_of(be)->step = *s;
    return 0;
}

void *ds_cpu_scratch(const ds_backend *be, int which, size_t bytes) {
    ds_cpu *c = ds_cpu_of(be);
    if (alloc_fails(be)) return NULL;
    if (bytes <= c->scr[which].cap && c->scr[which].p) return c->scr[which].p;
    free(c->scr[which].p);
    size_t cap = bytes ? (bytes + 63) / 64 * 64 : 64;
    c->scr[which].p = aligned_alloc(64, cap);
    c->scr[which].cap = c->scr[which].p ? cap : 0;
    return c->scr[which].p;
}

void ds_cpu_parallel_for(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx) {
    int threads = ds_cpu_of(be)->n_threads;
    if (threads <= 1 || n <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int i = 0; i < n; i++) fn(ctx, i);
}

static void cpu_close(ds_backend *be) {
    ds_cpu *c = ds_cpu_of(be);
    if (!c) return;
    for (int i = 0; i < DS_SCR_N; i++) free(c->scr[i].p);
    free(c);
    be->impl = NULL;
}

int ds_backend_cpu_threads(const ds_backend *be) { return ds_cpu_of(be)->n_threads; }

void ds_backend_cpu_set_threads(ds_backend *be, int n) { ds_cpu_of(be)->n_threads = n > 0 ? n : omp_get_num_procs(); }

void ds_backend_cpu_fail_alloc(ds_backend *be, long n) { ds_cpu_of(be)->fail_alloc = n; }

int ds_backend_cpu_init(ds_backend *be, int n_threads) {
    memset(be, 0, sizeof *be);
    ds_cpu *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->path = ds_cpu_best_path();
    be->name = "cpu";
    be->impl = c;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->memset0 = cpu_memset0;
    be->copy = cpu_copy;
    be->map_weights = cpu_map_weights;
    be->unmap_weights = cpu_unmap_weights;
    be->begin_step = cpu_begin_step;
    be->embed = ds_cpu_embed;
    be->matmul_many = ds_cpu_matmul_many;
    be->matmul_grouped = ds_cpu_matmul_grouped;
    be->rmsnorm = ds_cpu_rmsnorm_op;
    be->rope = ds_cpu_rope_op;
    be->hc_pre = ds_cpu_hc_pre;
    be->hc_post = ds_cpu_hc_post;
    be->hc_head = ds_cpu_hc_head;
    be->gather = ds_cpu_gather;
    be->compress = ds_cpu_compress;
    be->indexer = ds_cpu_indexer;
    be->attention = ds_cpu_attention;
    be->window_store = ds_cpu_window_store;
    be->route = ds_cpu_route;
    be->moe = ds_cpu_moe;
    be->moe_experts = ds_cpu_moe_experts;
    be->moe_combine = ds_cpu_moe_combine;
    be->close = cpu_close;
    return 0;
}
