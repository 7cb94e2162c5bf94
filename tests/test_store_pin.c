/* test_store_pin.c — the expert store's page-locking of the host experts
 * (model/store.c) on a CPU backend whose pin_host / unpin_host record what
 * they are given, the CPU's experts on a backend of the store's own (the
 * test hook DSV4_TEST_STORE_OWN_CPU: the layout a GPU's store has):
 * - every routed expert's data and scale bytes lie in a locked span; the
 *   spans are whole pages, ascending and disjoint (bytes that layers share,
 *   synth:tiny:4:2, locked once); ds_store_pinned_bytes is their sum, with
 *   no reason given; unbinding releases each span once;
 * - a backend that refuses: nothing locked, its message as the reason, the
 *   model still runs (the same logits as with every span locked);
 * - the CPU backend itself (no pin_host): nothing locked, no reason;
 * - copies count as queued (the rates' copies from the bind's fill) only
 *   with every span locked; the fill's rate is measured in each case. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/store.h"
#include "runtime/model_load.h"
#include "testutil.h"

#define MAXS 4096

/* a CPU backend whose pin calls are recorded (the store's calls get &rec.be) */
typedef struct {
    ds_backend be;
    int refuse;
    int n, unpinned;
    uintptr_t p[MAXS];
    size_t bytes[MAXS];
    int released[MAXS];
} rec;

static int rec_pin(const ds_backend *be, const void *p, size_t bytes, ds_err *err) {
    rec *r = (rec *)(uintptr_t)be;
    if (r->refuse) return ds_fail(err, "pin_host: refused by the test");
    if (r->n < MAXS) r->p[r->n] = (uintptr_t)p, r->bytes[r->n] = bytes, r->released[r->n] = 0;
    r->n++;
    return 0;
}

static void rec_unpin(const ds_backend *be, const void *p) {
    rec *r = (rec *)(uintptr_t)be;
    r->unpinned++;
    for (int i = 0; i < r->n && i < MAXS; i++)
        if (r->p[i] == (uintptr_t)p) r->released[i]++;
}

/* bytes [p, p + n) inside one recorded span */
static int covered(const rec *r, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < r->n && i < MAXS; i++)
        if (a >= r->p[i] && a + n <= r->p[i] + r->bytes[i]) return 1;
    return 0;
}

/* synth:tiny:4:2 (vocabulary 1,024) with a store of 12 slots (some resident; mixed: copies
 * and the CPU) bound to r, its pin calls recorded (use_pin; refusing them:
 * refuse); the logits of 5 tokens into lg (NULL: none); 0 or -1 */
static int run(rec *r, int use_pin, int refuse, float *lg, uint64_t *pinned, char *why, size_t why_n) {
    ds_model *m;
    ds_err err;
    int rc = ds_load_model("synth:tiny:4:2", NULL, &m, &err);
    CHECK(rc == 0, "synth:tiny:4:2: %s", err.msg);
    if (rc) return -1;
    memset(r, 0, sizeof *r);
    r->refuse = refuse;
    rc = ds_backend_cpu_init(&r->be, 1);
    CHECK(rc == 0, "cpu backend");
    if (rc) {
        ds_model_free(m);
        return -1;
    }
    if (use_pin) r->be.pin_host = rec_pin, r->be.unpin_host = rec_unpin;
    ds_store_opts o = {0, 12, DS_STORE_MIXED, NULL, {DS_TIER_PCIE, DS_TIER_CPU_READ, DS_TIER_CPU_FLOPS}, {NULL, NULL}};
    rc = ds_store_new(m, &o, &err) || ds_model_bind(m, &r->be, &err);
    CHECK(rc == 0, "store of 12 slots: %s", err.msg);
    if (!rc) {
        const char *w;
        *pinned = ds_store_pinned_bytes(m->store, &w);
        int queued = ds_store_copies_queued(m->store);
        CHECK(queued == (use_pin && !refuse), "copies queued: %d (pin_host %d, refused %d)", queued, use_pin, refuse);
        CHECK(ds_store_fill_rate(m->store) > 0, "no rate measured for the resident slots' fill");
        snprintf(why, why_n, "%s", w);
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        int bad_cover = 0, bad_page = 0, bad_order = 0;
        uint64_t sum = 0;
        for (int i = 0; i < r->n && i < MAXS; i++) {
            sum += r->bytes[i];
            bad_page += r->p[i] % pg != 0 || r->bytes[i] % pg != 0 || r->bytes[i] == 0;
            bad_order += i > 0 && r->p[i] < r->p[i - 1] + r->bytes[i - 1];
        }
        for (int li = 0; li < m->cfg.n_layers && r->n; li++)
            for (int e = 0; e < m->cfg.n_routed_experts; e++) {
                const ds_layer *ly = &m->layers[li];
                const ds_weight *h[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
                for (int q = 0; q < 3; q++) {
                    size_t sb = ds_weight_scale_bytes(h[q]), db = ds_weight_bytes(h[q]) - sb;
                    bad_cover += !covered(r, h[q]->data, db) || (sb && !covered(r, h[q]->scale, sb));
                }
            }
        if (use_pin && !r->refuse) {
            CHECK(r->n > 0 && r->n <= MAXS, "%d spans locked", r->n);
            CHECK(bad_cover == 0, "%d expert matrices or scale grids outside the locked spans", bad_cover);
            CHECK(bad_page == 0 && bad_order == 0, "spans: %d not whole pages, %d not ascending and disjoint", bad_page,
                  bad_order);
            CHECK(*pinned == sum, "ds_store_pinned_bytes %llu, the spans %llu", (unsigned long long)*pinned,
                  (unsigned long long)sum);
            /* layers 2 and 3 share layers 0 and 1's experts: locked once, so less than twice their bytes */
            CHECK(sum < 2 * ds_store_host_bytes(m->store) + (uint64_t)r->n * pg,
                  "%llu bytes locked for %llu bytes of experts", (unsigned long long)sum,
                  (unsigned long long)ds_store_host_bytes(m->store));
        }
        if (lg) {
            int32_t toks[5] = {3, 14, 15, 92, 65};
            ds_seq *s;
            rc = ds_seq_new(m, 8, &s, &err);
            CHECK(rc == 0, "%s", err.msg);
            if (!rc) {
                ds_batch_item it = {s, toks, 5, lg, 1, NULL, NULL};
                rc = ds_forward(m, &r->be, &it, 1, &err);
                CHECK(rc == 0, "forward with the store: %s", err.msg);
                ds_seq_free(s);
            }
        }
        ds_model_unbind(m);
    }
    ds_model_free(m);
    r->be.close(&r->be);
    return rc ? -1 : 0;
}

int main(void) {
#ifndef DSV4_TEST_HOOKS
    printf("test_store_pin: skipped (a build without DSV4_TEST_HOOKS: the store's own CPU backend is a hook)\n");
    return 77;
#else
    setenv("DSV4_TEST_STORE_OWN_CPU", "1", 1);
    enum { N = 1024 * 5 };
    rec *r = malloc(sizeof *r);
    float *a = calloc(N, sizeof(float)), *b = calloc(N, sizeof(float));
    uint64_t pinned = 0;
    char why[300];
    /* every span locked */
    if (run(r, 1, 0, a, &pinned, why, sizeof why) == 0) {
        CHECK(why[0] == 0, "a reason given with every span locked: %s", why);
        int n = r->n, once = 1;
        for (int i = 0; i < n && i < MAXS; i++) once &= r->released[i] == 1;
        CHECK(once && r->unpinned == n, "unbind released %d of %d spans (each once: %d)", r->unpinned, n, once);
        printf("store pin: %d spans, %.2f MB locked\n", n, pinned / 1e6);
    }
    /* refused */
    rec *q = malloc(sizeof *q);
    if (run(q, 1, 1, b, &pinned, why, sizeof why) == 0) {
        CHECK(pinned == 0 && q->unpinned == 0, "refused: %llu bytes locked, %d released", (unsigned long long)pinned,
              q->unpinned);
        CHECK(strstr(why, "refused by the test") != NULL, "refused: the reason given is '%s'", why);
        CHECK(!memcmp(a, b, sizeof(float) * N), "refused: logits differ from those with every span locked");
    }
    /* the plain CPU backend */
    if (run(q, 0, 0, NULL, &pinned, why, sizeof why) == 0)
        CHECK(pinned == 0 && why[0] == 0 && q->n == 0, "no pin_host: %llu bytes locked, reason '%s'",
              (unsigned long long)pinned, why);
    free(r);
    free(q);
    free(a);
    free(b);
    return test_summary("store_pin");
#endif
}
