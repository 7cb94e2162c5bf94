/* test_backend_errors.c — backend failures surface as errors:
 * 1. a backend whose n-th op call fails (any op: products, norms, mHC,
 *    compressor, indexer, attention, routing, experts, downloads), for every
 *    n a step makes: the step returns an error naming the op and the layer;
 * 2. the CPU backend running out of memory at its n-th scratch allocation,
 *    for every n a step makes: the step says "out of memory";
 * 3. the model's lanes (be->lane): the side lane gets only the ops it may run,
 *    every branch is joined before the step's downloads;
 * and after each failure a step without faults gives the normal logits bit
 * for bit (the arena and scratch stay usable). No crash; under ASan no leak. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "model/forward.h"
#include "testutil.h"

/* the CPU backend with a fault injected at op call `fail_at` */
typedef struct {
    ds_backend be; /* first: the model code sees only this */
    const ds_backend *cpu;
    int calls, fail_at;
    int lane, branch, sides, open_dl; /* be->lane's protocol (backend.h), as the model uses it */
} faulty;

static int trip(const ds_backend *be, const char *op, ds_err *err) {
    faulty *f = (faulty *)(void *)be; /* test-only: the counter lives beside the backend */
    if (!strcmp(op, "begin_step")) f->lane = f->branch = 0; /* a failed step may leave a branch open */
    /* the side lane runs only these ops; a step's download comes after its joins */
    if (f->lane == DS_LANE_SIDE)
        CHECK(!strcmp(op, "matmul_many") || !strcmp(op, "compress") || !strcmp(op, "rope") || !strcmp(op, "indexer") ||
                  !strcmp(op, "lane"),
              "%s issued on the side lane", op);
    if (!strcmp(op, "download") && f->branch) f->open_dl++;
    if (++f->calls != f->fail_at) return 0;
    ds_fail(err, "injected fault in %s", op);
    return 1;
}

#define WRAP(op, ptype)                                                                    \
    static int w_##op(const ds_backend *be, const ptype *p, ds_err *err) {                 \
        const faulty *f = (const faulty *)(const void *)be;                                \
        return trip(be, #op, err) ? -1 : f->cpu->op(f->cpu, p, err);                       \
    }
WRAP(begin_step, ds_step_desc)
WRAP(embed, ds_embed_params)
WRAP(matmul_grouped, ds_matmul_grouped)
WRAP(rope, ds_rope_params)
WRAP(hc_pre, ds_hc_pre_params)
WRAP(hc_post, ds_hc_post_params)
WRAP(hc_head, ds_hc_head_params)
WRAP(gather, ds_gather_params)
WRAP(compress, ds_compress_params)
WRAP(indexer, ds_indexer_params)
WRAP(attention, ds_attention_params)
WRAP(window_store, ds_window_store_params)
WRAP(route, ds_route_params)
WRAP(moe, ds_moe_params)

static int w_matmul_many(const ds_backend *be, const ds_matmul_job *jobs, int n, ds_err *err) {
    const faulty *f = (const faulty *)(const void *)be;
    return trip(be, "matmul_many", err) ? -1 : f->cpu->matmul_many(f->cpu, jobs, n, err);
}
static int w_rmsnorm(const ds_backend *be, const ds_rmsnorm_params *jobs, int n, ds_err *err) {
    const faulty *f = (const faulty *)(const void *)be;
    return trip(be, "rmsnorm", err) ? -1 : f->cpu->rmsnorm(f->cpu, jobs, n, err);
}
static int w_lane(const ds_backend *be, int to, ds_err *err) {
    faulty *f = (faulty *)(void *)be;
    if (trip(be, "lane", err)) return -1;
    CHECK(to == DS_LANE_MAIN || to == DS_LANE_SIDE || to == DS_LANE_JOIN, "lane %d", to);
    if (to == DS_LANE_SIDE) f->branch = 1, f->sides++;
    if (to == DS_LANE_JOIN) f->branch = 0;
    f->lane = to == DS_LANE_SIDE ? DS_LANE_SIDE : DS_LANE_MAIN;
    return 0; /* the CPU runs in issue order */
}
static int w_download(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err) {
    const faulty *f = (const faulty *)(const void *)be;
    return trip(be, "download", err) ? -1 : f->cpu->download(f->cpu, dst, src, bytes, err);
}

/* a route hook, so that the observer's download is a failure point too */
static void on_route(void *ctx, int layer, int item, int tok, const int *experts, int k) {
    (void)layer, (void)item, (void)tok, (void)experts, (void)k;
    ++*(int *)ctx;
}

static int step(ds_model *m, const ds_backend *be, const int32_t *toks, int L, float *out, ds_err *err) {
    ds_seq *s;
    if (ds_seq_new(m, L, &s, err)) return -1;
    int routes = 0;
    ds_observer obs = {on_route, NULL, &routes, NULL};
    ds_batch_item it = {s, toks, L, out, 1, NULL, NULL};
    int rc = ds_forward_observed(m, be, &it, 1, &obs, err);
    ds_seq_free(s);
    return rc;
}

int main(void) {
    char dir[1024];
    test_path(dir, sizeof dir, "tests/fixtures/q128");
    ds_model *m;
    ds_backend cpu;
    ds_err err;
    if (test_load(dir, 2, &m, &cpu, &err)) {
        CHECK(0, "%s", err.msg);
        return test_summary("backend_errors");
    }
    enum { L = 9 };
    int V = m->cfg.vocab_size;
    int32_t toks[L] = {5, 17, 42, 7, 99, 3, 11, 250, 64};
    float *ref = malloc(sizeof(float) * (size_t)V * L), *got = malloc(sizeof(float) * (size_t)V * L);
    CHECK(step(m, &cpu, toks, L, ref, &err) == 0, "%s", err.msg);

    faulty f = {cpu, &cpu, 0, 0, 0, 0, 0, 0};
    f.be.begin_step = w_begin_step;
    f.be.embed = w_embed;
    f.be.matmul_many = w_matmul_many;
    f.be.matmul_grouped = w_matmul_grouped;
    f.be.rmsnorm = w_rmsnorm;
    f.be.rope = w_rope;
    f.be.hc_pre = w_hc_pre;
    f.be.hc_post = w_hc_post;
    f.be.hc_head = w_hc_head;
    f.be.gather = w_gather;
    f.be.compress = w_compress;
    f.be.indexer = w_indexer;
    f.be.attention = w_attention;
    f.be.window_store = w_window_store;
    f.be.route = w_route;
    f.be.moe = w_moe;
    f.be.download = w_download;
    f.be.lane = w_lane;

    /* 1. every op call of a step */
    int failures = 0, named_layer = 0;
    for (int n = 1;; n++) {
        f.calls = 0, f.fail_at = n, f.sides = 0, f.open_dl = 0;
        err.msg[0] = 0;
        int rc = step(m, &f.be, toks, L, got, &err);
        if (f.calls < n) { /* the step made fewer calls: it ran through and must be exact */
            CHECK(rc == 0 && !memcmp(got, ref, sizeof(float) * (size_t)V * L), "a step without faults differs");
            /* the compressed layers' branches, each joined before the step's downloads */
            CHECK(f.sides > 0 && !f.branch && !f.open_dl, "lanes: %d branches, %s open, %d downloads inside one",
                  f.sides, f.branch ? "one" : "none", f.open_dl);
            break;
        }
        failures++;
        CHECK(rc != 0, "op call %d failed but the step succeeded", n);
        CHECK(strstr(err.msg, "injected fault in ") != NULL, "op call %d: message '%s'", n, err.msg);
        named_layer += strstr(err.msg, "layer ") != NULL;
        CHECK(step(m, &cpu, toks, L, got, &err) == 0 && !memcmp(got, ref, sizeof(float) * (size_t)V * L),
              "after the fault at op call %d, a normal step differs", n);
    }
    CHECK(failures > 100, "only %d op calls in a step of 5 layers", failures);
    CHECK(named_layer > failures / 2, "only %d of %d messages name the layer", named_layer, failures);
    printf("op faults: %d failure points, each an error (%d naming the layer)\n", failures, named_layer);

    /* 2. every scratch allocation of the CPU backend in a step */
    failures = 0;
    for (int n = 1;; n++) {
        ds_backend_cpu_fail_alloc(&cpu, n);
        err.msg[0] = 0;
        int rc = step(m, &cpu, toks, L, got, &err);
        int tripped = rc != 0;
        ds_backend_cpu_fail_alloc(&cpu, 0);
        if (!tripped) {
            CHECK(!memcmp(got, ref, sizeof(float) * (size_t)V * L), "a step without allocation faults differs");
            break;
        }
        failures++;
        CHECK(strstr(err.msg, "out of memory") != NULL, "allocation %d: message '%s'", n, err.msg);
        CHECK(step(m, &cpu, toks, L, got, &err) == 0 && !memcmp(got, ref, sizeof(float) * (size_t)V * L),
              "after the allocation fault %d, a normal step differs", n);
    }
    CHECK(failures > 10, "only %d allocations failed", failures);
    printf("allocation faults: %d failure points, each an error\n", failures);
    free(ref);
    free(got);
    test_unload(m, &cpu);
    return test_summary("backend_errors");
}
