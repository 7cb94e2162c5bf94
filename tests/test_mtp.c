/* test_mtp.c — the MTP block and speculative decoding on a tiny synth model
 * with an MTP block (random weights, so its own drafts are mostly rejected;
 * a draft hook forces acceptance and partial acceptance):
 * - loading: the block when complete, MTP off (naming the missing tensor)
 *   when absent or partial (the q128 fixture's dummies);
 * - rewind: a sequence that saw tokens and was rewound gives the bits of one
 *   that never saw them, across window wraps and compressor blocks;
 * - generation: --mtp 0..4, greedy and seeded sampling, give the same tokens
 *   and the same logits bits for every sampled token, and the sequence ends
 *   in the same state;
 * - the block against transformers: its logits of 160 tokens within 1e-4 of
 *   tools/mtp_reference.py's on the same model (tests/fixtures/mtp). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "model/forward.h"
#include "model/state.h"
#include "model/synth.h"
#include "runtime/backend_select.h"
#include "runtime/generate.h"
#include "testutil.h"

static char dir_mtp[64], dir_plain[64];

static int synth(char *dir, int mtp) {
    ds_err err = {0};
    ds_config c;
    strcpy(dir, "/tmp/dsv4_mtp_XXXXXX");
    if (!mkdtemp(dir) || ds_synth_like("tiny", &c, &err)) return -1;
    ds_synth_opts o = {1, 7, (uint64_t)1 << 30, 0, mtp};
    if (ds_synth_write(&c, &o, dir, &err)) {
        fprintf(stderr, "synth: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void rm_dir(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

static void test_load_rules(void) {
    ds_err err = {0};
    ds_model *m = NULL;
    CHECK(ds_model_load(dir_mtp, &m, &err) == 0, "load with MTP: %s", err.msg);
    if (m) {
        CHECK(m->mtp != NULL, "the block is loaded: %s", m->mtp_off);
        CHECK(m->mtp && m->mtp->layer.ratio == 0 && !m->mtp->layer.is_hash, "the MTP layer: sliding, routed");
        ds_model_free(m);
    }
    m = NULL;
    CHECK(ds_model_load(dir_plain, &m, &err) == 0, "load without MTP: %s", err.msg);
    if (m) {
        CHECK(!m->mtp && strstr(m->mtp_off, "mtp.0.enorm.weight"), "no block: %s", m->mtp_off);
        ds_model_free(m);
    }
    char q[1024];
    test_path(q, sizeof q, "tests/fixtures/q128");
    m = NULL;
    CHECK(ds_model_load(q, &m, &err) == 0, "q128 (partial MTP dummies): %s", err.msg);
    if (m) {
        CHECK(!m->mtp && strstr(m->mtp_off, "mtp.0.h_proj.weight"), "partial block is off: %s", m->mtp_off);
        ds_model_free(m);
    }
}

/* A block with a tensor of the wrong shape and dtype is an error naming it:
 * the names of mtp.0.ffn_norm.weight [D] F32 and mtp.0.attn.wkv.weight
 * [d, D] FP8 (the same length) swapped in a copy's safetensors header. */
static void test_bad_block(void) {
    char bad[64], cmd[256], file[128];
    strcpy(bad, "/tmp/dsv4_mtp_XXXXXX");
    if (!mkdtemp(bad)) return;
    snprintf(cmd, sizeof cmd, "cp '%s'/* '%s'/", dir_mtp, bad);
    CHECK(system(cmd) == 0, "copying the model");
    snprintf(file, sizeof file, "%s/model-00001-of-00001.safetensors", bad);
    FILE *f = fopen(file, "r+b");
    CHECK(f != NULL, "open %s", file);
    if (f) {
        static char head[1 << 20];
        size_t n = fread(head, 1, sizeof head - 1, f);
        head[n] = 0;
        const char *a = "\"mtp.0.ffn_norm.weight\"", *b = "\"mtp.0.attn.wkv.weight\"";
        char *pa = memmem(head, n, a, strlen(a)), *pb = memmem(head, n, b, strlen(b));
        CHECK(pa && pb && strlen(a) == strlen(b), "both names in the header");
        if (pa && pb) {
            memcpy(pa, b, strlen(b));
            memcpy(pb, a, strlen(a));
            CHECK(fseek(f, 0, SEEK_SET) == 0 && fwrite(head, 1, n, f) == n, "rewriting the header");
        }
        fclose(f);
        ds_model *m = NULL;
        ds_err err = {0};
        int rc = ds_model_load(bad, &m, &err);
        CHECK(rc != 0 && strstr(err.msg, "mtp.0.ffn_norm.weight"), "a bad block tensor is an error naming it: %s",
              rc ? err.msg : "(loaded)");
        ds_model_free(m);
    }
    rm_dir(bad);
}

static int32_t tokv(int i) { return (int32_t)((i * 37 + 11) % 1000 + 3); }

/* A sequence that saw `junk` extra tokens after n, rewound, then fed the
 * continuation, against one fed straight: the logits of every continuation
 * token, bit for bit. */
static void test_rewind(ds_model *m, const ds_backend *be) {
    ds_err err = {0};
    int V = m->cfg.vocab_size, C = 6, bad = 0, runs = 0;
    float *a = malloc((size_t)C * V * sizeof *a), *b = malloc((size_t)(40 + C) * V * sizeof *b);
    int32_t toks[80], junk[4] = {5, 900, 17, 333};
    for (int i = 0; i < 80; i++) toks[i] = tokv(i);
    for (int n = 26; n <= 40 && !bad; n++) /* window 32, ratios 4 and 128 */
        for (int j = 1; j <= 4 && !bad; j++) {
            ds_seq *s1 = NULL, *s2 = NULL;
            ds_seq_snap snap = {0};
            int rc = ds_seq_new(m, 128, &s1, &err) || ds_seq_new(m, 128, &s2, &err);
            ds_batch_item p1 = {s1, toks, n, NULL, 0, NULL, NULL}, x1 = {s1, junk, j, NULL, 0, NULL, NULL};
            ds_batch_item c1 = {s1, toks + n, C, a, 1, NULL, NULL};
            ds_batch_item p2 = {s2, toks, n + C, b, 1, NULL, NULL};
            rc = rc || ds_forward(m, be, &p1, 1, &err) || ds_seq_snapshot(m, s1, &snap, &err) ||
                 ds_forward(m, be, &x1, 1, &err) || ds_seq_rewind(m, s1, &snap, &err) ||
                 ds_forward(m, be, &c1, 1, &err) || ds_forward(m, be, &p2, 1, &err);
            CHECK(!rc, "rewind run: %s", err.msg);
            if (!rc && memcmp(a, b + (size_t)n * V, (size_t)C * V * sizeof *a)) bad = 1;
            CHECK(!bad, "after %d tokens, %d seen and rewound: the continuation's logits differ", n, j);
            runs++;
            if (s1) ds_seq_snap_free(s1, &snap);
            ds_seq_free(s1);
            ds_seq_free(s2);
        }
    CHECK(runs > 0, "rewind runs");
    free(a), free(b);
}

/* The block's logits (row p: the streams of token p and token p + 1) against
 * tools/mtp_reference.py's rows of the same model and tokens (transformers
 * with the block as one more layer; tests/fixtures/mtp/README.md). */
static void test_block_reference(ds_model *m, const ds_backend *be) {
    enum { N = 160 };
    ds_err err = {0};
    size_t V = (size_t)m->cfg.vocab_size, H = (size_t)m->cfg.hc_mult * (size_t)m->cfg.dim, R = N - 1;
    char path[512];
    test_path(path, sizeof path, "tests/fixtures/mtp/reference.f32");
    float *ref = malloc(R * V * sizeof *ref), *lg = malloc(R * V * sizeof *lg), *hid = malloc(N * H * sizeof *hid);
    FILE *f = fopen(path, "rb");
    size_t got = f && ref ? fread(ref, sizeof *ref, R * V, f) : 0;
    int extra = f ? fgetc(f) != EOF : 0;
    if (f) fclose(f);
    CHECK(got == R * V && !extra, "%s: %zu values, expected %zu", path, got, R * V);
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 7919 + 13) % 1024);
    ds_seq *s = NULL, *b = NULL;
    int rc = !lg || !hid || ds_seq_new(m, N, &s, &err) || ds_seq_new(m->mtp_model, N, &b, &err);
    if (!rc) {
        ds_batch_item main_it = {s, toks, N, NULL, 0, hid, NULL};
        ds_batch_item blk = {b, toks + 1, N - 1, lg, 1, NULL, hid};
        rc = ds_forward(m, be, &main_it, 1, &err) || ds_forward(m->mtp_model, be, &blk, 1, &err);
    }
    CHECK(!rc, "the block's logits: %s", err.msg);
    if (!rc && got == R * V) {
        double d = 0;
        size_t worst = 0;
        for (size_t i = 0; i < R * V; i++) {
            double e = fabs((double)lg[i] - (double)ref[i]);
            if (!(e <= d)) d = e, worst = i; /* a NaN is the worst */
        }
        printf("MTP block vs transformers: max |logit - reference| = %.3g (row %zu of %zu)\n", d, worst / V, R);
        CHECK(d <= 1e-4, "the block's logits within 1e-4 of the reference: %.3g at row %zu", d, worst / V);
    }
    ds_seq_free(s);
    ds_seq_free(b);
    free(ref), free(lg), free(hid);
}

/* What one generation saw: tokens and the logits of each. */
typedef struct {
    int n;
    int32_t tok[64];
    int64_t pos[64];
    float *lg; /* [64][V] */
    int V;
    /* the draft hook: the reference tokens; every `wrong`-th draft is broken */
    const int32_t *ref;
    int64_t ref_pos0;
    int n_ref, wrong, count;
} run_log;

static void on_logits(void *ctx, int64_t pos, const float *logits, int V) {
    run_log *r = ctx;
    if (r->n < 64) {
        r->pos[r->n] = pos;
        memcpy(r->lg + (size_t)r->n * V, logits, (size_t)V * sizeof *logits);
    }
}

static void draft(void *ctx, int64_t pos, int k, int32_t *d) {
    run_log *r = ctx;
    for (int i = 0; i < k; i++) {
        int64_t q = pos + i - r->ref_pos0;
        if (r->ref && q >= 0 && q < r->n_ref) d[i] = r->ref[q];
        if (r->wrong && ++r->count % r->wrong == 0) d[i] = (d[i] + 1) % r->V;
    }
}

static int on_token(void *ctx, int32_t token, int is_stop, const char *text, size_t n) {
    (void)is_stop, (void)text, (void)n;
    run_log *r = ctx;
    if (token >= 0 && r->n < 64) r->tok[r->n++] = token;
    return 0;
}

static int gen_cap(ds_model *m, const ds_backend *be, int mtp, int sample, const run_log *ref, int wrong, run_log *out,
                   ds_gen_result *res, float *next, int64_t cap) {
    ds_err err = {0};
    int32_t prompt[30];
    for (int i = 0; i < 30; i++) prompt[i] = tokv(i);
    ds_gen_params p;
    ds_gen_params_init(&p);
    p.max_new = 40;
    p.stop_ids = (const int32_t[]){-5}, p.n_stop = 1; /* no stop token: all 40 */
    p.prefill_chunk = 7;
    p.max_len = 128;
    p.mtp = mtp;
    if (sample)
        p.sampling.temperature = 0.9, p.sampling.seed = 1234, p.sampling.top_k = 40,
        p.sampling.repetition_penalty = 1.1;
    out->n = 0;
    out->ref = ref ? ref->tok : NULL, out->ref_pos0 = 30, out->n_ref = ref ? ref->n : 0;
    out->wrong = wrong, out->count = 0;
    p.on_logits = on_logits, p.draft = ref ? draft : NULL, p.hook_ctx = out;
    ds_seq *s = NULL;
    int rc = ds_seq_new(m, cap, &s, &err) || ds_generate(m, be, NULL, s, prompt, 30, 0, &p, on_token, out, res, &err);
    CHECK(!rc, "generate --mtp %d: %s", mtp, err.msg);
    /* the state it ends in: one more token's logits */
    if (!rc) {
        CHECK(s->pos == 30 + out->n - 1, "--mtp %d: the sequence holds %lld tokens", mtp, (long long)s->pos);
        if (s->pos < s->max_len) {
            ds_batch_item it = {s, &out->tok[out->n - 1], 1, next, 0, NULL, NULL};
            rc = ds_forward(m, be, &it, 1, &err);
            CHECK(!rc, "next step: %s", err.msg);
        }
    }
    ds_seq_free(s);
    return rc;
}

static int gen(ds_model *m, const ds_backend *be, int mtp, int sample, const run_log *ref, int wrong, run_log *out,
               ds_gen_result *res, float *next) {
    return gen_cap(m, be, mtp, sample, ref, wrong, out, res, next, 128);
}

/* A sequence that fills up mid-step: drafts are cut to the room left, the
 * same tokens come out and the sequence ends as full. */
static void test_capacity(ds_model *m, const ds_backend *be) {
    int V = m->cfg.vocab_size;
    run_log base = {0}, r = {0};
    base.V = r.V = V;
    base.lg = malloc((size_t)64 * V * sizeof(float));
    r.lg = malloc((size_t)64 * V * sizeof(float));
    float *nx = malloc((size_t)V * sizeof *nx);
    ds_gen_result res;
    for (int64_t cap = 31; cap <= 37; cap += 3) {
        if (gen_cap(m, be, 0, 1, NULL, 0, &base, &res, nx, cap)) continue;
        CHECK(base.n == cap - 30 + 1, "capacity %lld: %d tokens", (long long)cap, base.n);
        for (int k = 1; k <= DS_GEN_MTP_MAX; k++)
            for (int w = 0; w < 2; w++) {
                if (gen_cap(m, be, k, 1, &base, w ? 2 : 0, &r, &res, nx, cap)) continue;
                CHECK(r.n == base.n && !memcmp(r.tok, base.tok, (size_t)r.n * sizeof *r.tok) &&
                          !memcmp(r.lg, base.lg, (size_t)r.n * V * sizeof(float)),
                      "capacity %lld, --mtp %d: the tokens or logits differ", (long long)cap, k);
            }
    }
    free(base.lg), free(r.lg), free(nx);
}

static void test_generate(ds_model *m, const ds_backend *be) {
    int V = m->cfg.vocab_size;
    run_log base = {0}, r = {0};
    base.V = r.V = V;
    base.lg = malloc((size_t)64 * V * sizeof(float));
    r.lg = malloc((size_t)64 * V * sizeof(float));
    float *nb = malloc((size_t)V * sizeof *nb), *nr = malloc((size_t)V * sizeof *nr);
    for (int sample = 0; sample < 2; sample++) {
        ds_gen_result res0, res;
        if (gen(m, be, 0, sample, NULL, 0, &base, &res0, nb)) continue;
        CHECK(base.n == 40 && res0.mtp_steps == 0, "baseline: %d tokens", base.n);
        /* the block's own drafts (random weights), then forced drafts: all right,
         * every 3rd wrong, every 2nd wrong */
        const int wrongs[4] = {-1, 0, 3, 2};
        for (int w = 0; w < 4; w++)
            for (int k = 1; k <= DS_GEN_MTP_MAX; k++) {
                if (gen(m, be, k, sample, wrongs[w] < 0 ? NULL : &base, wrongs[w] < 0 ? 0 : wrongs[w], &r, &res, nr))
                    continue;
                int same = r.n == base.n && !memcmp(r.tok, base.tok, (size_t)r.n * sizeof *r.tok) &&
                           !memcmp(r.pos, base.pos, (size_t)r.n * sizeof *r.pos);
                CHECK(same, "%s, --mtp %d, drafts %d: the tokens differ", sample ? "sampled" : "greedy", k, wrongs[w]);
                CHECK(!memcmp(r.lg, base.lg, (size_t)r.n * V * sizeof(float)),
                      "%s, --mtp %d, drafts %d: the logits of the sampled tokens differ", sample ? "sampled" : "greedy",
                      k, wrongs[w]);
                CHECK(!memcmp(nr, nb, (size_t)V * sizeof *nr), "%s, --mtp %d, drafts %d: the final state differs",
                      sample ? "sampled" : "greedy", k, wrongs[w]);
                CHECK(res.mtp_steps > 0 && res.mtp_accepted <= res.mtp_drafted, "--mtp %d: %d steps", k, res.mtp_steps);
                if (wrongs[w] == 0) /* every draft right: k+1 tokens a step */
                    CHECK(res.mtp_accepted == res.mtp_drafted && res.mtp_steps <= (40 + k) / (k + 1),
                          "--mtp %d, right drafts: %d of %d accepted in %d steps", k, res.mtp_accepted, res.mtp_drafted,
                          res.mtp_steps);
                if (wrongs[w] > 0) CHECK(res.mtp_accepted < res.mtp_drafted, "--mtp %d, wrong drafts rejected", k);
                printf("%s --mtp %d drafts %2d: %2d steps, %3d drafted, %3d accepted (%.2f tokens a step)\n",
                       sample ? "sampled" : "greedy ", k, wrongs[w], res.mtp_steps, res.mtp_drafted, res.mtp_accepted,
                       res.mtp_steps ? (double)(res.mtp_steps + res.mtp_accepted) / res.mtp_steps : 0.0);
            }
    }
    free(base.lg), free(r.lg), free(nb), free(nr);
}

int main(void) {
    if (synth(dir_mtp, 1) || synth(dir_plain, 0)) {
        CHECK(0, "writing the synth models");
        return test_summary("test_mtp");
    }
    test_load_rules();
    test_bad_block();
    ds_model *m = NULL;
    ds_backend be;
    ds_err err = {0};
    ds_backend_opts bo = {.name = getenv("DSV4_TEST_BACKEND"), .threads = 2};
    int rc = ds_model_load(dir_mtp, &m, &err);
    if (!rc) {
        m->bind_mtp = 1;
        rc = ds_backend_open(&bo, &be, &err);
        if (rc) ds_model_free(m);
        rc = rc || ds_model_bind(m, &be, &err);
    }
    if (rc) {
        CHECK(0, "load: %s", err.msg);
    } else {
        CHECK(m->mtp_model != NULL, "the bound model has the block");
        if (m->mtp_model) test_block_reference(m, &be);
        test_rewind(m, &be);
        test_generate(m, &be);
        test_capacity(m, &be);
        test_unload(m, &be);
    }
    rm_dir(dir_mtp);
    rm_dir(dir_plain);
    return test_summary("test_mtp");
}
