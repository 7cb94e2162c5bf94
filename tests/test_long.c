/* test_long.c — a long context on the backend under test (DSV4_TEST_BACKEND):
 * at a context of N tokens on a synth tiny-shaped model (N = 100,000; the
 * sanitizer build sets DSV4_TEST_LONG_TOKENS lower), the last 16 tokens
 * decoded one at a time after steps of 1,500 tokens give the bits of one
 * 16-token prefill after steps of the default budget (4,096). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "runtime/backend_select.h"
#include "model/synth.h"
#include "testutil.h"

/* decode = prefill at a context of n tokens, on the synth tiny shape with
 * three layers (none, CSA, HCA) and a smaller indexer (2 heads of 64): the
 * indexer scores every compressed entry of every row, n^2 / 4 in all */
static void long_decode(long long n) {
    ds_model *m;
    ds_backend be;
    ds_err err;
    ds_config c;
    char dir[] = "/tmp/dsv4-long-XXXXXX";
    int rc = ds_synth_like("tiny", &c, &err);
    c.n_layers = 3, c.index_n_heads = 2, c.index_head_dim = 64;
    ds_synth_opts so = {1, 7, 1u << 30, 0, 0};
    CHECK(mkdtemp(dir) != NULL, "mkdtemp %s", dir);
    if (!rc) rc = ds_synth_write(&c, &so, dir, &err);
    CHECK(rc == 0, "synth: %s", err.msg);
    if (!rc) rc = test_load(dir, 0, &m, &be, &err);
    CHECK(rc == 0, "%s: %s", dir, err.msg);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "test_long: could not remove %s\n", dir);
    if (rc) return;
    int V = m->cfg.vocab_size, tail = 16;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (long long i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)V);
    }
    float *a = malloc(sizeof(float) * (size_t)tail * V), *b = malloc(sizeof(float) * (size_t)tail * V);
    ds_seq *s[2] = {NULL, NULL};
    for (int k = 0; k < 2 && !rc; k++) {
        rc = ds_seq_new(m, n, &s[k], &err);
        CHECK(rc == 0, "%s", err.msg);
        if (rc) break;
        m->step_tokens = k ? 1500 : 0;
        ds_batch_item it = {s[k], toks, (int)(n - tail), NULL, 0, NULL, NULL};
        rc = ds_forward(m, &be, &it, 1, &err);
        CHECK(rc == 0, "prefill of %lld tokens: %s", n - tail, err.msg);
        for (int j = 0; j < (k ? tail : 1) && !rc; j++) {
            ds_batch_item d = {s[k], toks + n - tail + j, k ? 1 : tail, (k ? b : a) + (size_t)j * V, 1, NULL, NULL};
            rc = ds_forward(m, &be, &d, 1, &err);
            CHECK(rc == 0, "the last %d tokens: %s", tail, err.msg);
        }
        m->step_tokens = 0;
    }
    if (!rc) {
        CHECK(!memcmp(a, b, sizeof(float) * (size_t)tail * V),
              "context %lld: the last %d tokens decoded one at a time (steps of 1,500 before) != one prefill of them "
              "(steps of the default budget before)",
              n, tail);
        printf("context %lld tokens: decode of the last %d = their prefill (bits)\n", n, tail);
    }
    for (int k = 0; k < 2; k++) ds_seq_free(s[k]);
    free(a), free(b), free(toks);
    test_unload(m, &be);
}

int main(void) {
    const char *e = getenv("DSV4_TEST_LONG_TOKENS");
    long long n = e && *e ? atoll(e) : 100000;
    CHECK(n >= 1000, "DSV4_TEST_LONG_TOKENS=%s: at least 1,000", e ? e : "");
    if (n >= 1000) long_decode(n);
    return test_summary("long");
}
