/* test_long.c — a long context on the backend under test (DSV4_TEST_BACKEND):
 * 1. the long fixture (tests/fixtures/long: transformers' logits of one
 *    16,640-token prompt on a small quantized V4, 130 HCA blocks and 4,160
 *    CSA entries of which the indexer keeps 32): every logit within 1e-4, the
 *    experts and indexer picks the reference's where its margin exceeds 1e-4,
 *    and steps of 1,000 tokens the bits of the default steps (4,096);
 * 2. at a context of N tokens on a synth tiny-shaped model (N = 100,000; the
 *    sanitizer build sets DSV4_TEST_LONG_TOKENS lower), the last 16 tokens
 *    decoded one at a time after steps of 1,500 tokens give the bits of one
 *    16-token prefill after steps of the default budget (4,096). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "runtime/backend_select.h"
#include "model/synth.h"
#include "picks.h"
#include "testutil.h"

#define TOL 1e-4

/* the whole prompt through ds_forward (split into steps of m->step_tokens),
 * every row's logits; NULL on failure */
static float *prefill_all(ds_model *m, ds_backend *be, const int32_t *toks, int T, const ds_observer *obs) {
    ds_err err;
    ds_seq *s;
    int rc = ds_seq_new(m, T, &s, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return NULL;
    float *out = malloc(sizeof(float) * (size_t)T * m->cfg.vocab_size);
    ds_batch_item it = {s, toks, T, out, 1, NULL, NULL};
    rc = obs ? ds_forward_observed(m, be, &it, 1, obs, &err) : ds_forward(m, be, &it, 1, &err);
    CHECK(rc == 0, "prefill of %d tokens: %s", T, err.msg);
    ds_seq_free(s);
    if (rc) free(out), out = NULL;
    return out;
}

static void long_fixture(void) {
    ds_model *m;
    ds_backend be;
    ds_err err;
    int rc = test_load_fixture("long", 0, &m, &be, &err);
    CHECK(rc == 0, "long: %s", err.msg);
    if (rc) return;
    char path[1100];
    test_path(path, sizeof path, "tests/fixtures/long/reference.safetensors");
    ds_checkpoint *ck;
    rc = ds_checkpoint_open(path, &ck, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) {
        test_unload(m, &be);
        return;
    }
    const ds_tensor *tt = ds_checkpoint_find(ck, "tokens.0"), *lt = ds_checkpoint_find(ck, "logits.0");
    int V = m->cfg.vocab_size;
    CHECK(tt && lt && lt->shape[0] == tt->shape[0] && lt->shape[1] == V,
          "%s: tokens.0 / logits.0 missing or mis-shaped", path);
    if (tt && lt && lt->shape[0] == tt->shape[0] && lt->shape[1] == V) {
        int T = (int)tt->shape[0];
        const int32_t *toks = (const int32_t *)(const void *)tt->data;
        const float *ref = (const float *)(const void *)lt->data;
        CHECK(T > 4 * DS_STEP_TOKENS, "long: %d tokens, not more than 4 steps", T);
        picks pk;
        ds_observer obs = picks_init(&pk, m, 1, &T);
        float *a = prefill_all(m, &be, toks, T, &obs);
        if (a) {
            int lowm = 0, ncmp = 0, bad = picks_check("long", ck, &pk, 0, T, &lowm, &ncmp);
            printf("long: %d expert / indexer choices: %d differ where the margin exceeds %g, %d where it does not\n",
                   ncmp, bad, PICKS_MARGIN, lowm);
            CHECK(ncmp >= T * m->cfg.n_layers, "long: only %d choices compared", ncmp);
            CHECK(bad == 0, "long: %d expert / indexer choices differ from the reference above the margin", bad);
            double maxd = 0;
            int worst = 0, argmax_bad = 0;
            for (int t = 0; t < T; t++) {
                int ia = 0, ib = 0;
                for (int v = 0; v < V; v++) {
                    double d = fabs((double)a[(size_t)t * V + v] - (double)ref[(size_t)t * V + v]);
                    if (d > maxd || isnan(d)) maxd = isnan(d) ? HUGE_VAL : d, worst = t;
                    if (a[(size_t)t * V + v] > a[(size_t)t * V + ia]) ia = v;
                    if (ref[(size_t)t * V + v] > ref[(size_t)t * V + ib]) ib = v;
                }
                argmax_bad += ia != ib;
            }
            printf("long (%d tokens, steps of %d): max |logit - reference| = %.3g (token %d)\n", T, DS_STEP_TOKENS,
                   maxd, worst);
            CHECK(maxd <= TOL, "long: max |diff| %g > %g at token %d", maxd, TOL, worst);
            CHECK(argmax_bad == 0, "long: the argmax differs from the reference at %d tokens", argmax_bad);
            m->step_tokens = 1000;
            float *b = prefill_all(m, &be, toks, T, NULL);
            m->step_tokens = 0;
            CHECK(b && !memcmp(a, b, sizeof(float) * (size_t)T * V), "long: steps of 1,000 tokens != steps of %d",
                  DS_STEP_TOKENS);
            free(b);
        }
        free(a);
        picks_free(&pk, 1);
    }
    ds_checkpoint_close(ck);
    test_unload(m, &be);
}

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
    long_fixture();
    if (n >= 1000) long_decode(n);
    return test_summary("long");
}
