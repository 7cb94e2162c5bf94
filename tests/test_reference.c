/* test_reference.c — the engine against the oracle: transformers'
 * DeepseekV4ForCausalLM logits recorded by tools/gen_fixtures.py on small
 * random-weight models written in the official checkpoint layout
 * (tests/fixtures/<model>/). Tolerance: max |logit - reference| <= 1e-4
 * (fp32 math on both sides; the reference itself differs between its own
 * full, chunked and decoding paths by ~1e-5). The routed experts and the
 * indexer's picks of every token and layer must be the reference's wherever
 * its decision margin (the last chosen over the first not chosen, relative)
 * exceeds 1e-4. Every chunking, batch composition and thread count must also
 * give the same bits as one prefill. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "model/forward.h"
#include "runtime/batch.h"
#include "picks.h"
#include "testutil.h"

#define TOL 1e-4

typedef struct {
    int n;
    int32_t *tok[8];
    int len[8];
    const float *ref[8];
} refset;

static int load_ref(const ds_checkpoint *ck, refset *r) {
    r->n = 0;
    for (int i = 0; i < 8; i++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "tokens.%d", i);
        snprintf(b, sizeof b, "logits.%d", i);
        const ds_tensor *t = ds_checkpoint_find(ck, a), *l = ds_checkpoint_find(ck, b);
        if (!t || !l) break;
        r->len[i] = (int)t->shape[0];
        r->tok[i] = malloc(t->nbytes);
        memcpy(r->tok[i], t->data, t->nbytes);
        r->ref[i] = (const float *)(const void *)l->data;
        r->n++;
    }
    return r->n;
}

/* Runs the sequences idx[0..k) together with the given chunk and threads. */
static float **run_obs(const ds_model *m, const refset *r, const int *idx, int k, int chunk, int threads,
                       const ds_observer *obs) {
    ds_backend *be = (ds_backend *)m->be; /* the test's own, bound in fixture() */
    be->set_threads(be, threads);
    ds_seq *seqs[8];
    const int32_t *toks[8];
    int lens[8];
    float **out = calloc((size_t)k, sizeof *out);
    ds_err err;
    for (int i = 0; i < k; i++) {
        ds_seq_new(m, r->len[idx[i]], &seqs[i], &err);
        toks[i] = r->tok[idx[i]];
        lens[i] = r->len[idx[i]];
        out[i] = malloc(sizeof(float) * (size_t)lens[i] * m->cfg.vocab_size);
    }
    int rc = ds_run_tokens_observed(m, be, seqs, toks, lens, k, chunk, out, obs, &err);
    CHECK(rc == 0, "run failed: %s", err.msg);
    for (int i = 0; i < k; i++) ds_seq_free(seqs[i]);
    return out;
}

static float **run(const ds_model *m, const refset *r, const int *idx, int k, int chunk, int threads) {
    return run_obs(m, r, idx, k, chunk, threads, NULL);
}

static void free_out(float **o, int k) {
    for (int i = 0; i < k; i++) free(o[i]);
    free(o);
}

/* The config transformers saved (config.hf.json) describes the same model as
 * the official config.json. */
static void same_config(const char *dir) {
    char a[1100], b[1100];
    snprintf(a, sizeof a, "%s/config.json", dir);
    snprintf(b, sizeof b, "%s/config.hf.json", dir);
    ds_config x, y;
    ds_err err;
    int ra = ds_config_load(a, &x, &err);
    CHECK(ra == 0, "%s", err.msg);
    int rb = ds_config_load(b, &y, &err);
    CHECK(rb == 0, "%s", err.msg);
    if (ra || rb) return;
    int same = x.vocab_size == y.vocab_size && x.dim == y.dim && x.n_layers == y.n_layers && x.n_heads == y.n_heads &&
               x.head_dim == y.head_dim && x.rope_dim == y.rope_dim && x.q_lora_rank == y.q_lora_rank &&
               x.o_groups == y.o_groups && x.o_lora_rank == y.o_lora_rank && x.n_routed_experts == y.n_routed_experts &&
               x.n_active_experts == y.n_active_experts && x.moe_inter_dim == y.moe_inter_dim &&
               x.n_hash_layers == y.n_hash_layers && x.window == y.window && x.index_n_heads == y.index_n_heads &&
               x.index_head_dim == y.index_head_dim && x.index_topk == y.index_topk && x.hc_mult == y.hc_mult &&
               x.hc_sinkhorn_iters == y.hc_sinkhorn_iters && x.rope_theta == y.rope_theta &&
               x.compress_rope_theta == y.compress_rope_theta && x.yarn == y.yarn && x.yarn_factor == y.yarn_factor &&
               x.yarn_orig_max_pos == y.yarn_orig_max_pos && x.swiglu_limit == y.swiglu_limit &&
               x.route_scale == y.route_scale && x.rms_eps == y.rms_eps &&
               !memcmp(x.compress_ratio, y.compress_ratio, sizeof(int) * (size_t)x.n_layers);
    CHECK(same, "%s: config.json and config.hf.json describe different models", dir);
}

static void fixture(const char *name) {
    char dir[1024], path[1100];
    test_path(dir, sizeof dir, "tests/fixtures/");
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    same_config(dir);
    ds_model *m;
    ds_backend be_;
    ds_err err;
    int rc = test_load(dir, 0, &m, &be_, &err);
    CHECK(rc == 0, "%s: %s", name, err.msg);
    if (rc) return;
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ds_checkpoint *ck;
    rc = ds_checkpoint_open(path, &ck, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) {
        test_unload(m, &be_);
        return;
    }
    refset r;
    CHECK(load_ref(ck, &r) >= 2, "%s: reference has < 2 sequences", name);
    int V = m->cfg.vocab_size, all[8] = {0, 1, 2, 3, 4, 5, 6, 7};

    /* 1. full prefill, all sequences in one batch (one step), against the
     * oracle: logits, experts and indexer picks */
    picks pk;
    ds_observer obs = picks_init(&pk, m, r.n, r.len);
    float **full = run_obs(m, &r, all, r.n, 0, 0, &obs);
    for (int i = 0; i < r.n; i++) {
        int lowm = 0, ncmp = 0, bad = picks_check(name, ck, &pk, i, r.len[i], &lowm, &ncmp);
        printf("%s seq %d: %d expert / indexer choices: %d differ where the margin exceeds %g, %d where it does not\n",
               name, i, ncmp, bad, PICKS_MARGIN, lowm);
        CHECK(ncmp >= r.len[i] * pk.L, "%s seq %d: only %d choices compared (route.i.L missing?)", name, i, ncmp);
        CHECK(bad == 0, "%s seq %d: %d expert / indexer choices differ from the reference above the margin", name, i,
              bad);
    }
    picks_free(&pk, r.n);
    for (int i = 0; i < r.n; i++) {
        double maxd = 0, maxref = 0;
        int argmax_ok = 1;
        for (int t = 0; t < r.len[i]; t++) {
            const float *a = full[i] + (size_t)t * V, *b = r.ref[i] + (size_t)t * V;
            int ia = 0, ib = 0;
            for (int v = 0; v < V; v++) {
                double d = fabs((double)a[v] - (double)b[v]);
                if (d > maxd || isnan(d)) maxd = isnan(d) ? HUGE_VAL : d;
                if (fabs((double)b[v]) > maxref) maxref = fabs((double)b[v]);
                if (a[v] > a[ia]) ia = v;
                if (b[v] > b[ib]) ib = v;
            }
            argmax_ok &= ia == ib;
        }
        printf("%s seq %d (%d tokens): max |logit - reference| = %.3g, relative to max |logit| %.3g = %.3g\n", name, i,
               r.len[i], maxd, maxref, maxd / maxref);
        CHECK(maxd <= TOL, "%s seq %d: max |diff| %g > %g", name, i, maxd, TOL);
        CHECK(argmax_ok, "%s seq %d: argmax differs from the reference", name, i);
    }
    /* 2. chunked prefill and token-by-token decoding: identical bits */
    const int chunks[] = {1, 3, 4, 5, 7, 64, 127, 128, 129};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        float **o = run(m, &r, all, r.n, chunks[c], 0);
        for (int i = 0; i < r.n; i++)
            CHECK(!memcmp(o[i], full[i], sizeof(float) * (size_t)r.len[i] * V), "%s seq %d: chunk %d != whole prefill",
                  name, i, chunks[c]);
        free_out(o, r.n);
    }
    /* 3. alone vs batched, in every position; threads 1..4 */
    for (int i = 0; i < r.n; i++) {
        float **o = run(m, &r, &all[i], 1, 0, 1);
        CHECK(!memcmp(o[0], full[i], sizeof(float) * (size_t)r.len[i] * V), "%s seq %d: alone != batched", name, i);
        free_out(o, 1);
    }
    int rev[8];
    for (int i = 0; i < r.n; i++) rev[i] = r.n - 1 - i;
    for (int th = 2; th <= 4; th++) {
        float **o = run(m, &r, rev, r.n, 5 * th, th);
        for (int i = 0; i < r.n; i++)
            CHECK(!memcmp(o[i], full[rev[i]], sizeof(float) * (size_t)r.len[rev[i]] * V),
                  "%s seq %d: reversed batch, %d threads, chunk %d != reference run", name, rev[i], th, 5 * th);
        free_out(o, r.n);
    }
    free_out(full, r.n);

    /* 4. greedy decoding against the oracle's generate loop */
    snprintf(path, sizeof path, "%s/greedy.safetensors", dir);
    ds_checkpoint *gk;
    if (ds_checkpoint_open(path, &gk, &err) == 0) {
        const ds_tensor *p = ds_checkpoint_find(gk, "prompt"), *g = ds_checkpoint_find(gk, "tokens"),
                        *gl = ds_checkpoint_find(gk, "logits");
        CHECK(p && g && gl, "%s: greedy.safetensors lacks prompt/tokens/logits", name);
        if (p && g && gl) {
            int P = (int)p->shape[0], N = (int)g->shape[0];
            ds_backend *be = &be_;
            be->set_threads(be, 0);
            ds_seq *s;
            ds_seq_new(m, P + N, &s, &err);
            float *lg = malloc(sizeof(float) * V);
            int32_t *hist = malloc(sizeof(int32_t) * (size_t)(P + N));
            memcpy(hist, p->data, sizeof(int32_t) * (size_t)P);
            ds_batch_item it = {s, hist, P, lg, 0, NULL, NULL};
            int same = 1;
            double maxd = 0;
            for (int j = 0; j < N && same; j++) {
                if (ds_forward(m, be, &it, 1, &err)) break;
                int best = 0;
                for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
                for (int v = 0; v < V; v++) {
                    double d = fabs((double)lg[v] - (double)((const float *)(const void *)gl->data)[(size_t)j * V + v]);
                    maxd = d > maxd ? d : maxd;
                }
                int32_t want;
                memcpy(&want, g->data + 4 * (size_t)j, 4);
                same = best == want;
                hist[P + j] = best;
                it.tokens = &hist[P + j];
                it.n_tokens = 1;
            }
            printf("%s greedy: %d tokens, max |logit - reference| = %.3g\n", name, N, maxd);
            CHECK(same, "%s: greedy tokens differ from the reference", name);
            CHECK(maxd <= TOL, "%s greedy: max |diff| %g", name, maxd);
            free(lg);
            free(hist);
            ds_seq_free(s);
        }
        ds_checkpoint_close(gk);
    }
    for (int i = 0; i < r.n; i++) free(r.tok[i]);
    ds_checkpoint_close(ck);
    test_unload(m, &be_);
}

int main(void) {
    fixture("tiny");
    fixture("q128");
    fixture("q16e");
    fixture("q32e");
    return test_summary("reference");
}
