/* test_batch.c — batch invariance, bitwise: a target sequence's logits alone
 * equal its logits inside batches of 2, 3, 8 and 17 sequences, at every
 * position in the batch, with co-batched sequences of random lengths and
 * phases (some prefilling in random chunks, some decoding one token per
 * step, joining and leaving), and with random chunking of the target.
 * Also the observer's route hook (reported after the step since 2026-12-02):
 * every (layer, token) once, layers ascending, rows in order; hash layers'
 * experts = the checkpoint's tid2eid row of the token; the same experts for a
 * token whether its sequences ran in one step or token by token. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/model.h"
#include "runtime/batch.h"
#include "testutil.h"

static uint64_t rs = 0x1234567887654321ull;
static int rnd(int lo, int hi) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return lo + (int)(rs % (uint64_t)(hi - lo + 1));
}

typedef struct {
    ds_seq *seq;
    int32_t *toks;
    int len, fed, join, decode_from; /* after decode_from tokens it feeds 1 token per step */
} other;

static void fixture(const char *name, int target_len) {
    ds_model *m;
    ds_backend be;
    ds_err err;
    if (test_load_fixture(name, 2, &m, &be, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    int V = m->cfg.vocab_size;
    int32_t *target = malloc(sizeof(int32_t) * (size_t)target_len);
    for (int i = 0; i < target_len; i++) target[i] = rnd(0, V - 1);
    float *alone = malloc(sizeof(float) * (size_t)target_len * V), *got = malloc(sizeof(float) * (size_t)target_len * V);
    float *scratch = malloc(sizeof(float) * 256 * (size_t)V);
    ds_seq *ts;
    ds_seq_new(m, target_len, &ts, &err);
    ds_batch_item it = {ts, target, target_len, alone, 1, NULL, NULL};
    CHECK(ds_forward(m, &be, &it, 1, &err) == 0, "%s", err.msg);

    const int sizes[] = {2, 3, 8, 17};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int B = sizes[si];
        for (int pos = 0; pos < B; pos++) {
            other o[17];
            for (int j = 0; j < B - 1; j++) {
                o[j].len = rnd(1, 96);
                o[j].toks = malloc(sizeof(int32_t) * (size_t)o[j].len);
                for (int x = 0; x < o[j].len; x++) o[j].toks[x] = rnd(0, V - 1);
                o[j].fed = 0;
                o[j].join = rnd(0, 4);
                o[j].decode_from = rnd(1, o[j].len);
                ds_seq_new(m, o[j].len, &o[j].seq, &err);
            }
            ds_seq_reset(ts);
            int tfed = 0, ok = 1;
            for (int step = 0; tfed < target_len && ok; step++) {
                ds_batch_item items[17];
                int k = 0, tpos = -1;
                for (int slot = 0, j = 0; slot < B; slot++) {
                    if (slot == pos) {
                        int n = rnd(1, 40);
                        if (n > target_len - tfed) n = target_len - tfed;
                        tpos = k;
                        items[k++] = (ds_batch_item){ts, target + tfed, n, got + (size_t)tfed * V, 1, NULL, NULL};
                        continue;
                    }
                    other *q = &o[j++];
                    if (step < q->join || q->fed >= q->len) continue; /* not joined yet / left */
                    int n = q->fed >= q->decode_from ? 1 : rnd(1, q->decode_from - q->fed);
                    if (n > q->len - q->fed) n = q->len - q->fed;
                    items[k++] = (ds_batch_item){q->seq, q->toks + q->fed, n, rnd(0, 1) ? scratch : NULL, 1, NULL, NULL};
                    q->fed += n;
                }
                int rc = ds_forward(m, &be, items, k, &err);
                CHECK(rc == 0, "%s", err.msg);
                ok = rc == 0;
                tfed += items[tpos].n_tokens;
            }
            CHECK(ok && !memcmp(got, alone, sizeof(float) * (size_t)target_len * V),
                  "%s: target at position %d of a batch of %d != alone", name, pos, B);
            for (int j = 0; j < B - 1; j++) {
                ds_seq_free(o[j].seq);
                free(o[j].toks);
            }
        }
    }
    /* ds_run_tokens past its per-step bound (DS_RUN_STEP_TOKENS): a long
     * sequence fills the first step, the next one is split over two steps
     * and the target waits for the second: each still gets its own bits */
    if (!strcmp(name, "tiny")) {
        int nl = DS_RUN_STEP_TOKENS - 100, nb = 200, lens[3] = {nl, nb, target_len};
        int32_t *lt = malloc(sizeof(int32_t) * (size_t)nl), *bt = malloc(sizeof(int32_t) * (size_t)nb);
        float *bl = malloc(sizeof(float) * (size_t)nb * V), *bg = malloc(sizeof(float) * (size_t)nb * V);
        for (int i = 0; i < nl; i++) lt[i] = rnd(0, V - 1);
        for (int i = 0; i < nb; i++) bt[i] = rnd(0, V - 1);
        ds_seq *ss[3] = {NULL, NULL, ts};
        ds_seq_new(m, nl, &ss[0], &err);
        ds_seq_new(m, nb, &ss[1], &err);
        ds_batch_item bi = {ss[1], bt, nb, bl, 1, NULL, NULL};
        CHECK(ds_forward(m, &be, &bi, 1, &err) == 0, "%s", err.msg);
        ds_seq_reset(ss[1]);
        ds_seq_reset(ts);
        const int32_t *toks[3] = {lt, bt, target};
        float *lg[3] = {NULL, bg, got};
        memset(got, 0, sizeof(float) * (size_t)target_len * V);
        CHECK(ds_run_tokens(m, &be, ss, toks, lens, 3, 0, lg, &err) == 0, "%s", err.msg);
        CHECK(!memcmp(got, alone, sizeof(float) * (size_t)target_len * V),
              "%s: the target behind %d + %d tokens (steps of at most %d) != alone", name, nl, nb, DS_RUN_STEP_TOKENS);
        CHECK(!memcmp(bg, bl, sizeof(float) * (size_t)nb * V), "%s: a sequence split by the step bound != alone",
              name);
        ds_seq_free(ss[0]);
        ds_seq_free(ss[1]);
        free(lt);
        free(bt);
        free(bl);
        free(bg);
    }
    ds_seq_free(ts);
    free(target);
    free(alone);
    free(got);
    free(scratch);
    test_unload(m, &be);
}

/* what the route hook saw: calls in order */
typedef struct {
    int n, cap, k, bad_k;
    int *rec; /* [cap][3 + k]: layer, item, tok, experts */
} routes;

static void on_route(void *ctx, int layer, int item, int tok, const int *experts, int k) {
    routes *r = ctx;
    if (k != r->k) r->bad_k = 1;
    if (r->n >= r->cap || k != r->k) return;
    int *o = r->rec + (size_t)r->n++ * (3 + r->k);
    o[0] = layer, o[1] = item, o[2] = tok;
    memcpy(o + 3, experts, sizeof(int) * (size_t)k);
}

static void route_hook(const char *name) {
    ds_model *m;
    ds_backend be;
    ds_err err;
    if (test_load_fixture(name, 2, &m, &be, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const ds_config *c = &m->cfg;
    int L = c->n_layers, k = c->n_active_experts, E = c->n_routed_experts, V = c->vocab_size, n_hash = 0;
    enum { NA = 9, NB = 5 };
    int32_t ta[NA], tb[NB];
    for (int i = 0; i < NA; i++) ta[i] = rnd(0, V - 1);
    for (int i = 0; i < NB; i++) tb[i] = rnd(0, V - 1);
    const int32_t *toks[2] = {ta, tb};
    ds_seq *sa, *sb;
    ds_seq_new(m, NA, &sa, &err);
    ds_seq_new(m, NB, &sb, &err);
    int cap = L * (NA + NB) + 1;
    routes whole = {0, cap, k, 0, malloc(sizeof(int) * (size_t)cap * (3 + k))};
    routes step = {0, cap, k, 0, malloc(sizeof(int) * (size_t)cap * (3 + k))};
    ds_observer obs = {on_route, NULL, &whole, NULL};
    ds_batch_item it[2] = {{sa, ta, NA, NULL, 0, NULL, NULL}, {sb, tb, NB, NULL, 0, NULL, NULL}};
    CHECK(ds_forward_observed(m, &be, it, 2, &obs, &err) == 0, "%s", err.msg);
    CHECK(!whole.bad_k && whole.n == L * (NA + NB), "%s: %d route calls for %d layers x %d tokens", name, whole.n, L,
          NA + NB);
    int order = 1, hash_ok = 1, ids_ok = 1;
    for (int i = 0; i < whole.n; i++) {
        const int *o = whole.rec + (size_t)i * (3 + k);
        int li = i / (NA + NB), row = i % (NA + NB), item = row < NA ? 0 : 1, tok = row < NA ? row : row - NA;
        order &= o[0] == li && o[1] == item && o[2] == tok;
        if (m->layers[li].is_hash) { /* the table lives in backend memory: read the token's row */
            int32_t want[64];
            n_hash += row == 0;
            hash_ok &= k <= 64 &&
                       be.download(&be, want, m->layers[li].tid2eid + (size_t)toks[item][tok] * k,
                                   sizeof(int32_t) * (size_t)k, &err) == 0 &&
                       !memcmp(o + 3, want, sizeof(int) * (size_t)k);
        } else {
            for (int j = 0; j < k; j++) ids_ok &= o[3 + j] >= 0 && o[3 + j] < E && (j == 0 || o[3 + j] > o[2 + j]);
        }
    }
    CHECK(order, "%s: route calls not in (layer, item, token) order", name);
    CHECK(n_hash > 0 && hash_ok, "%s: %d hash layers; their experts %s the checkpoint's tid2eid rows", name, n_hash,
          hash_ok ? "equal" : "differ from");
    CHECK(ids_ok, "%s: routed layers' experts not ascending ids in [0, %d)", name, E);
    /* token by token, both sequences in each step while they last */
    ds_seq_reset(sa);
    ds_seq_reset(sb);
    obs.ctx = &step;
    int same = 1;
    for (int t = 0; t < NA; t++) {
        ds_batch_item one[2] = {{sa, ta + t, 1, NULL, 0, NULL, NULL}, {sb, tb + t, 1, NULL, 0, NULL, NULL}};
        int n = t < NB ? 2 : 1;
        step.n = 0;
        CHECK(ds_forward_observed(m, &be, one, n, &obs, &err) == 0, "%s", err.msg);
        same &= step.n == L * n; /* every layer of every token of the step reported */
        for (int i = 0; i < step.n; i++) {
            const int *o = step.rec + (size_t)i * (3 + k);
            int row = o[1] == 0 ? o[2] + t : NA + o[2] + t;
            same &= !memcmp(o + 3, whole.rec + ((size_t)o[0] * (NA + NB) + row) * (3 + k) + 3, sizeof(int) * (size_t)k);
        }
    }
    CHECK(same, "%s: a token's routes token by token != in one step", name);
    ds_seq_free(sa);
    ds_seq_free(sb);
    free(whole.rec);
    free(step.rec);
    test_unload(m, &be);
}

int main(void) {
    fixture("tiny", 150);
    fixture("q128", 140);
    route_hook("q128");
    return test_summary("batch");
}
