/* cpu.c — the CPU backend: memory (host heap; weights used in place), the
 * step, threads (a pool handing out chunks of independent outputs) and the
 * grow-only scratch every op takes its temporaries from. */
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "format/safetensors.h"

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

static int cpu_copy_list(const ds_backend *be, int n, const ds_copy *c, ds_err *err) {
    for (int i = 0; i < n; i++)
        if (cpu_copy(be, c[i].dst, c[i].src, c[i].bytes, err)) return -1;
    return 0;
}

static int cpu_memset0(const ds_backend *be, void *dst, size_t bytes, ds_err *err) {
    (void)be, (void)err;
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

/* Weights stay where they are (the mmap'd checkpoint, the loader's arrays). */
static int cpu_map_weights(const ds_backend *be, const void *host, size_t bytes, ds_map_what what, const void **out,
                           ds_err *err) {
    (void)be, (void)bytes, (void)what, (void)err; /* the CPU kernels read the checkpoint's order */
    *out = host;
    return 0;
}

static void cpu_unmap_weights(const ds_backend *be, const void *p) { (void)be, (void)p; }

static int cpu_fill_weights(const ds_backend *be, void *dst, const void *host, size_t bytes, ds_map_what what,
                            ds_err *err) {
    (void)be, (void)what, (void)err; /* the checkpoint's order, as map_weights keeps it */
    memcpy(dst, host, bytes);
    return 0;
}

/* Only the SIMD paths' kernels (AVX-512, AVX2) read the packed copy (bf16x.c) and the
 * MXFP4 scale_plain flag (matmul/rows_avx512.c, matmul/rows_avx2.c). */
static int cpu_pack_weight(const ds_backend *be, ds_weight *w, ds_err *err) {
    const ds_cpu *c = ds_cpu_of(be);
    if (!c->pack || c->path == DS_CPU_GENERIC) return 0;
    if (w->kind == DS_W_FP4 && !w->scale_f32) {
        size_t n = (size_t)w->rows * (size_t)w->scale_cols;
        int plain = 1;
        for (size_t i = 0; i < n; i++) plain &= w->scale[i] != 0 && w->scale[i] != 255;
        w->scale_plain = plain;
    }
    return ds_cpu_bf16x_pack(be, w, err);
}

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

/* ---- the thread pool ----
 * A parallel region hands out its items [0, n) in chunks from one atomic
 * word, (generation << 32) | next item, to whichever thread asks first: the
 * caller and the pool's workers. A thread that the OS has descheduled (this
 * machine is shared) then holds no work back, and the caller waits only for
 * chunks actually taken — with OpenMP's static schedule every region waited
 * for both threads, which cost up to 4x at decode when another process ran.
 * Workers spin briefly for the next region, then sleep on a futex. Which
 * thread runs an item never changes its bits (each item writes only its own
 * outputs). A claim is a compare-and-swap against the generation it read the
 * region's fields under: a new region first bumps the generation (closing
 * the old one's claims), then writes its fields, then opens item 0. */
#define POOL_SPIN_NS 50000 /* a worker spins this long for the next region before sleeping */

struct ds_cpu_pool {
    int n; /* workers (the caller is one more thread) */
    pthread_t *th;
    uint64_t state;  /* atomic: (generation << 32) | next item */
    uint32_t wake;   /* atomic futex word: bumped by every region */
    int done;        /* atomic: items finished in this region */
    int sleepers;    /* atomic: workers in futex_wait */
    int quit;        /* atomic */
    void (*fn)(void *ctx, int i); /* the region (atomic loads: see above) */
    void *ctx;
    int total, chunk;
};

#define LD(p) __atomic_load_n(p, __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n(p, v, __ATOMIC_SEQ_CST)

static double pool_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims and runs chunks of the current region until none is left. */
static void pool_work(ds_cpu_pool *p) {
    for (;;) {
        uint64_t s = LD(&p->state);
        uint32_t i = (uint32_t)s;
        void (*fn)(void *, int) = LD(&p->fn);
        void *ctx = LD(&p->ctx);
        int total = LD(&p->total), chunk = LD(&p->chunk);
        if (i >= (uint32_t)total) return;
        if (!__atomic_compare_exchange_n(&p->state, &s, s + (uint64_t)chunk, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            continue;
        int end = (int)i + chunk < total ? (int)i + chunk : total;
        for (int k = (int)i; k < end; k++) fn(ctx, k);
        __atomic_fetch_add(&p->done, end - (int)i, __ATOMIC_SEQ_CST);
    }
}

static void *pool_main(void *arg) {
    ds_cpu_pool *p = arg;
    uint32_t seen = LD(&p->wake);
    for (;;) {
        double t0 = pool_now_ns();
        for (int k = 0; LD(&p->wake) == seen && !LD(&p->quit); k++) {
            cpu_relax();
            if ((k & 255) == 255 && pool_now_ns() - t0 > POOL_SPIN_NS) {
                __atomic_fetch_add(&p->sleepers, 1, __ATOMIC_SEQ_CST);
                syscall(SYS_futex, &p->wake, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
                __atomic_fetch_sub(&p->sleepers, 1, __ATOMIC_SEQ_CST);
                t0 = pool_now_ns();
            }
        }
        if (LD(&p->quit)) return NULL;
        seen = LD(&p->wake);
        pool_work(p);
    }
}

static void pool_free(ds_cpu_pool *p) {
    if (!p) return;
    ST(&p->quit, 1);
    __atomic_fetch_add(&p->wake, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &p->wake, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    for (int i = 0; i < p->n; i++) pthread_join(p->th[i], NULL);
    free(p->th);
    free(p);
}

/* A pool of n - 1 workers; NULL when n <= 1 or out of resources (regions
 * then run on the caller alone: the same bits, slower). */
static ds_cpu_pool *pool_new(int n) {
    if (n <= 1) return NULL;
    ds_cpu_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->th = calloc((size_t)n - 1, sizeof *p->th))) {
        free(p);
        return NULL;
    }
    for (; p->n < n - 1; p->n++)
        if (pthread_create(&p->th[p->n], NULL, pool_main, p)) {
            pool_free(p);
            return NULL;
        }
    return p;
}

void ds_cpu_parallel_for(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx) {
    ds_cpu *c = ds_cpu_of(be);
    ds_cpu_pool *p = c->pool;
    if (!p || n <= 1 || c->in_region) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    c->in_region = 1; /* a region opened from inside one runs serially */
    uint64_t gen = (LD(&p->state) >> 32) + 1;
    ST(&p->state, gen << 32 | 0xFFFFFFFFu); /* the previous region's claims are closed */
    ST(&p->fn, fn);
    ST(&p->ctx, ctx);
    ST(&p->total, n);
    int chunk = n / (8 * (p->n + 1));
    ST(&p->chunk, chunk < 1 ? 1 : chunk);
    ST(&p->done, 0);
    ST(&p->state, gen << 32);
    __atomic_fetch_add(&p->wake, 1, __ATOMIC_SEQ_CST);
    if (LD(&p->sleepers)) syscall(SYS_futex, &p->wake, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    pool_work(p);
    /* the chunks other threads took: spin, then yield (the thread may share our core) */
    for (int k = 0; LD(&p->done) < n; k++) {
        cpu_relax();
        if (k > 2000) sched_yield();
    }
    c->in_region = 0;
}

void ds_cpu_parallel_for_sized(const ds_backend *be, int n, void (*fn)(void *ctx, int i), void *ctx, size_t floats) {
    if (floats >= DS_CPU_PAR_FLOATS) {
        ds_cpu_parallel_for(be, n, fn, ctx);
        return;
    }
    for (int i = 0; i < n; i++) fn(ctx, i);
}

static uint64_t cpu_avail(const ds_backend *be) {
    (void)be;
    return ds_mem_available();
}

static void cpu_close(ds_backend *be) {
    ds_cpu *c = ds_cpu_of(be);
    if (!c) return;
    pool_free(c->pool);
    for (int i = 0; i < DS_SCR_N; i++) free(c->scr[i].p);
    free(c);
    be->impl = NULL;
}

int ds_backend_cpu_threads(const ds_backend *be) { return ds_cpu_of(be)->n_threads; }

int ds_backend_cpu_prefetch_l2(const ds_backend *be) { return ds_cpu_pf_l2(ds_cpu_of(be)); }

void ds_backend_cpu_set_l1d(ds_backend *be, int l1d) { ds_cpu_of(be)->l1d = l1d > 0 ? l1d : 0; }

void ds_backend_cpu_set_threads(ds_backend *be, int n) {
    ds_cpu *c = ds_cpu_of(be);
    n = n > 0 ? n : omp_get_num_procs();
    if (n == c->n_threads) return;
    pool_free(c->pool);
    c->n_threads = n;
    c->pool = pool_new(n);
}

static const char *cpu_note(const ds_backend *be) {
    return ds_cpu_pf_l2(ds_cpu_of(be)) ? "weights prefetched into L2" : "weights prefetched into L1";
}

void ds_backend_cpu_fail_alloc(ds_backend *be, long n) { ds_cpu_of(be)->fail_alloc = n; }

void ds_backend_cpu_set_pack(ds_backend *be, int on) { ds_cpu_of(be)->pack = on != 0; }

int ds_backend_cpu_init(ds_backend *be, int n_threads) {
    memset(be, 0, sizeof *be);
    ds_cpu *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->pool = pool_new(c->n_threads);
    c->path = ds_cpu_best_path();
    c->l1d = ds_cpu_l1d();
    const char *pk = getenv("DSV4_CPU_PACK");
    c->pack = !(pk && !strcmp(pk, "0"));
    be->name = "cpu";
    be->impl = c;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->memset0 = cpu_memset0;
    be->copy = cpu_copy;
    be->copy_list = cpu_copy_list;
    be->map_weights = cpu_map_weights;
    be->unmap_weights = cpu_unmap_weights;
    be->fill_weights = cpu_fill_weights;
    be->pack_weight = cpu_pack_weight;
    be->release_weight = ds_cpu_bf16x_release;
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
    be->host_for = ds_cpu_parallel_for;
    be->host_threads = ds_backend_cpu_threads;
    be->threads = ds_backend_cpu_threads;
    be->set_threads = ds_backend_cpu_set_threads;
    be->note = cpu_note;
    be->avail = cpu_avail;
    be->close = cpu_close;
    return 0;
}
