/* test_backend_errors.c — a backend that runs out of memory: the n-th call of
 * matmul, matmul_many or attend fails, for every n a step makes, and the
 * step must return an error naming the cause (no crash; under ASan no leak),
 * while a step whose calls all succeed still matches a normal backend's
 * logits bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "testutil.h"

/* the CPU backend with a fault injected at call `fail_at` of one op */
typedef struct {
    ds_backend be; /* first: the model code sees only this */
    ds_backend cpu;
    int op, calls, fail_at;
} faulty;

enum { OP_MATMUL, OP_MANY, OP_ATTEND };

static int trip(const ds_backend *be, int op) {
    faulty *f = (faulty *)(void *)be; /* test-only: the counter lives beside the backend */
    return f->op == op && ++f->calls == f->fail_at;
}
static int f_matmul(const ds_backend *be, const ds_weight *w, const float *x, int T, float *y) {
    const faulty *f = (const faulty *)(const void *)be;
    return trip(be, OP_MATMUL) ? -1 : f->cpu.matmul(&f->cpu, w, x, T, y);
}
static int f_many(const ds_backend *be, const ds_matmul_job *jobs, int n) {
    const faulty *f = (const faulty *)(const void *)be;
    return trip(be, OP_MANY) ? -1 : f->cpu.matmul_many(&f->cpu, jobs, n);
}
static int f_attend(const ds_backend *be, const ds_attn_query *qs, int n, int d, float scale) {
    const faulty *f = (const faulty *)(const void *)be;
    return trip(be, OP_ATTEND) ? -1 : f->cpu.attend(&f->cpu, qs, n, d, scale);
}

int main(void) {
    char dir[1024];
    test_path(dir, sizeof dir, "tests/fixtures/q128");
    ds_model *m;
    ds_err err;
    if (ds_model_load(dir, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return test_summary("backend_errors");
    }
    int V = m->cfg.vocab_size, L = 9;
    int32_t toks[9] = {5, 17, 42, 7, 99, 3, 11, 250, 64};
    float *ref = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    faulty f;
    ds_backend_cpu_init(&f.cpu, 2);
    f.be = f.cpu;
    f.be.matmul = f_matmul;
    f.be.matmul_many = f_many;
    f.be.attend = f_attend;

    ds_seq *s;
    CHECK(ds_seq_new(m, L, &s, &err) == 0, "%s", err.msg);
    ds_batch_item it = {s, toks, L, ref, 0};
    CHECK(ds_forward(m, &f.cpu, &it, 1, &err) == 0, "%s", err.msg);
    ds_seq_free(s);

    const char *names[] = {"matmul", "matmul_many", "attend"};
    for (int op = OP_MATMUL; op <= OP_ATTEND; op++) {
        int failures = 0;
        for (int n = 1;; n++) {
            f.op = op, f.calls = 0, f.fail_at = n;
            CHECK(ds_seq_new(m, L, &s, &err) == 0, "%s", err.msg);
            it = (ds_batch_item){s, toks, L, got, 0};
            err.msg[0] = 0;
            int rc = ds_forward(m, &f.be, &it, 1, &err);
            ds_seq_free(s);
            if (f.calls < n) { /* the step made fewer calls: it ran through and must be exact */
                CHECK(rc == 0 && !memcmp(got, ref, sizeof(float) * (size_t)V), "%s: a step without faults differs",
                      names[op]);
                break;
            }
            failures++;
            CHECK(rc != 0, "%s call %d failed but the step succeeded", names[op], n);
            CHECK(strstr(err.msg, "out of memory") != NULL, "%s call %d: message '%s'", names[op], n, err.msg);
        }
        CHECK(failures > 0, "%s: no call to fail", names[op]);
        printf("%s: %d failure points, each an error\n", names[op], failures);
    }
    free(ref);
    free(got);
    ds_model_free(m);
    return test_summary("backend_errors");
}
