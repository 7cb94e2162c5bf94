/* cmd_check.c — `dsv4 check`: the determinism checker. The same requests
 * run many times inside batches of random size and composition, at random
 * batch positions, with random prefill chunking, random join times and random
 * thread counts; per request it reports the number of unique outputs (logit
 * bit patterns and sampled tokens) and the max |diff| against a run alone.
 * Exit status 0 only if every request has exactly one unique output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "ep/ep.h"
#include "cli/util.h"
#include "model/forward.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "runtime/model_load.h"

enum { MODE_SINGLE, MODE_MIXED, MODE_PREFIX };

typedef struct {
    uint64_t s;
} rng;

static uint64_t rnext(rng *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}
static int rint_(rng *r, int lo, int hi) { return lo + (int)(rnext(r) % (uint64_t)(hi - lo + 1)); }

typedef struct {
    int32_t *toks; /* prompt then generated, capacity P + G */
    int P, G;
    uint64_t seed;
} request;

typedef struct {
    const request *req;
    ds_seq *seq;
    int fed, gen, join, target; /* target: index of the checked request, or -1 */
    float *rows;                /* [P + G][V] logits of a target (this trial) */
    int32_t *toks;              /* this run's prompt + generated tokens */
} live;

typedef struct {
    const ds_model *m;
    ds_backend *be; /* the model's; the CPU's thread count varies per trial */
    ds_sampling sp;
    ds_sample_scratch *scr;
    int perturb; /* --self-test: make logits depend on the batch size */
} ctx;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Runs one trial: targets (and noise) under the given schedule randomness.
 * out_rows[i] / out_toks[i] receive target i's logits and tokens. */
static int run_trial(ctx *C, const request *reqs, int n_req, const request *noise, int n_noise, rng *r, int chunk_max,
                     int threads, int shuffle, float **out_rows, int32_t **out_toks, ds_err *err) {
    const ds_model *m = C->m;
    int V = m->cfg.vocab_size, n = n_req + n_noise, rc = -1;
    ds_backend *be = C->be;
    be->set_threads(be, threads);
    live *L = calloc((size_t)n, sizeof *L);
    ds_batch_item *items = calloc((size_t)n, sizeof *items);
    int *order = calloc((size_t)n, sizeof *order);
    float **buf = calloc((size_t)n, sizeof *buf);
    if (!L || !items || !order || !buf) {
        ds_fail(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        L[i].req = i < n_req ? &reqs[i] : &noise[i - n_req];
        L[i].target = i < n_req ? i : -1;
        L[i].join = chunk_max > 0 && i >= n_req ? rint_(r, 0, 6) : 0;
        L[i].toks = i < n_req ? out_toks[i] : malloc(sizeof(int32_t) * (size_t)(L[i].req->P + L[i].req->G + 1));
        L[i].rows = i < n_req ? out_rows[i] : NULL;
        buf[i] = malloc(sizeof(float) * (size_t)V * (size_t)(L[i].req->P + 1));
        if (!L[i].toks || !buf[i] || ds_seq_new(m, L[i].req->P + L[i].req->G + 1, &L[i].seq, err)) goto out;
        memcpy(L[i].toks, L[i].req->toks, sizeof(int32_t) * (size_t)L[i].req->P);
    }
    for (int step = 0;; step++) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            live *s = &L[i];
            const request *q = s->req;
            if (step < s->join) continue;
            int take;
            if (s->fed < q->P) /* prefill, in random chunks */
                take = chunk_max > 0 ? rint_(r, 1, q->P - s->fed < chunk_max ? q->P - s->fed : chunk_max) : q->P - s->fed;
            else if (s->fed < q->P + s->gen && s->gen < q->G) /* decode: feed the last sampled token */
                take = 1;
            else
                continue;
            items[k].seq = s->seq;
            items[k].tokens = s->toks + s->fed;
            items[k].n_tokens = take;
            items[k].logits = buf[i];
            items[k].all_logits = 1;
            items[k].hidden = NULL;
            items[k].h_in = NULL;
            order[k++] = i;
        }
        if (!k) break;
        if (shuffle)
            for (int a = k - 1; a > 0; a--) { /* random batch positions */
                int b = (int)(rnext(r) % (uint64_t)(a + 1));
                ds_batch_item ti = items[a];
                items[a] = items[b];
                items[b] = ti;
                int to = order[a];
                order[a] = order[b];
                order[b] = to;
            }
        if (ds_forward(m, be, items, k, err)) goto out;
        if (C->perturb && k > 1) buf[order[0]][0] += 1e-3f * (float)k;
        for (int j = 0; j < k; j++) {
            live *s = &L[order[j]];
            const request *q = s->req;
            int nt = items[j].n_tokens;
            if (s->rows) memcpy(s->rows + (size_t)s->fed * V, buf[order[j]], sizeof(float) * (size_t)nt * V);
            s->fed += nt;
            if (s->fed == q->P + s->gen && s->gen < q->G) { /* sample from the last row */
                ds_sampling sp = C->sp;
                sp.seed = q->seed;
                int32_t tok;
                if (ds_sample(&sp, buf[order[j]] + (size_t)(nt - 1) * V, V, s->toks, s->fed, s->seq->pos, C->scr, &tok,
                              err))
                    goto out;
                s->toks[q->P + s->gen++] = tok;
            }
        }
    }
    rc = 0;
out:
    for (int i = 0; i < n && L; i++) {
        ds_seq_free(L[i].seq);
        if (L[i].target < 0) free(L[i].toks);
        if (buf) free(buf[i]);
    }
    free(L);
    free(items);
    free(order);
    free(buf);
    return rc;
}

/* Speculative decoding against the reference: ds_generate with the MTP
 * block, its sampled tokens and the logits of each compared bit for bit. */
typedef struct {
    const float *rows;    /* the reference's logits: row x after token x */
    const int32_t *toks;  /* its prompt + sampled tokens */
    int P, G, V, n, bad;
    int wrong, count;     /* oracle drafts (the reference's tokens), every wrong-th broken; 0: the block's */
} spec_cmp;

static void spec_logits(void *arg, int64_t pos, const float *logits, int vocab) {
    spec_cmp *c = arg;
    if (pos < 1 || pos - 1 >= c->P + c->G || memcmp(logits, c->rows + (size_t)(pos - 1) * vocab, sizeof(float) * vocab))
        c->bad = 1;
}

static void spec_draft_hook(void *arg, int64_t pos, int k, int32_t *d) {
    spec_cmp *c = arg;
    if (!c->wrong) return;
    for (int i = 0; i < k && pos + i < c->P + c->G; i++) {
        d[i] = c->toks[pos + i];
        if (++c->count % c->wrong == 0) d[i] = (d[i] + 1) % c->V;
    }
}

static int spec_tok(void *arg, int32_t token, int is_stop, const char *text, size_t n) {
    spec_cmp *c = arg;
    (void)is_stop, (void)text, (void)n;
    if (token >= 0 && c->toks[c->P + c->n++] != token) c->bad = 1;
    return 0;
}

/* Request q generated with --mtp K (block drafts, then oracle drafts) in
 * prefill chunks of 1..160: 0 when the tokens and logits equal the
 * reference's; *acc gets the accepted drafts of the oracle run. */
static int spec_check(ctx *C, const request *q, const float *rows, const int32_t *toks, int K, rng *r, int *acc,
                      ds_err *err) {
    int bad = 0;
    *acc = 0;
    for (int w = 0; w < 2; w++) {
        spec_cmp c = {rows, toks, q->P, q->G, C->m->cfg.vocab_size, 0, 0, w ? 3 : 0, 0};
        const int32_t never = -1; /* the reference does not stop at EOS */
        ds_gen_params gp;
        ds_gen_params_init(&gp);
        gp.sampling = C->sp;
        gp.sampling.seed = q->seed;
        gp.max_new = q->G;
        gp.stop_ids = &never;
        gp.n_stop = 1;
        gp.prefill_chunk = rint_(r, 1, 160);
        gp.mtp = K;
        gp.on_logits = spec_logits;
        gp.draft = spec_draft_hook;
        gp.hook_ctx = &c;
        ds_gen_result res;
        C->be->set_threads(C->be, rint_(r, 1, 4));
        if (ds_generate(C->m, C->be, NULL, NULL, q->toks, q->P, 0, &gp, spec_tok, &c, &res, err)) return -1;
        if (c.bad || c.n != q->G) bad = 1;
        if (w) *acc = res.mtp_accepted;
    }
    return bad;
}

typedef struct {
    long long trials, n_req, gen, seed, maxp, mtp;
    int mode, perturb;
} check_args;

static const char *const MODES[] = {"single", "mixed", "prefix", NULL};

static const cli_opt check_opts[] = {
    CLI_LONG_OPT("--trials", NULL, check_args, trials, 1, 100000, "N", "trials (default 8)"),
    CLI_CHOICE_OPT("--mode", NULL, check_args, mode, MODES,
                   "single: the request alone, only chunking/threads vary; mixed (default): random other requests; "
                   "prefix: the other requests share a prefix of the request's prompt"),
    CLI_LONG_OPT("--requests", NULL, check_args, n_req, 1, 64, "R", "requests checked (default 3)"),
    CLI_LONG_OPT("--gen", NULL, check_args, gen, 0, 4096, "G", "sampled tokens per request (default 8)"),
    CLI_LONG_OPT("--max-prompt", NULL, check_args, maxp, 1, 1 << 20, "P", "random prompts of 1..P tokens (default 200)"),
    CLI_LONG_OPT("--seed", NULL, check_args, seed, 0, INT64_MAX, "S", "seed of the random trials (default 1)"),
    CLI_LONG_OPT("--mtp", NULL, check_args, mtp, 0, DS_GEN_MTP_MAX, "K",
                 "also generate each request with speculative decoding (the MTP block's drafts, then drafts forced "
                 "from the reference with every 3rd wrong) and compare it bit for bit (default 0: not)"),
    CLI_FLAG_OPT("--self-test", NULL, check_args, perturb,
                 "perturb logits by batch size: the check must then fail (tests the checker)"),
    CLI_END,
};

static const char CHECK_ABOUT[] =
    "Runs R requests (random prompts, G sampled tokens each, temperature 0.8) N times in batches of\n"
    "random size and composition, random positions in the batch, random prefill chunking, random join\n"
    "steps and 1-4 threads, and compares every logit bit and sampled token with a run of each request\n"
    "alone. With --mtp K each request is also generated with speculative decoding (K drafts a step),\n"
    "which must give the same logits and tokens. Exit status 0 iff every request has exactly 1 unique\n"
    "output.\n";

int cmd_check(int argc, char **argv) {
    check_args ca = {.trials = 8, .n_req = 3, .gen = 8, .seed = 1, .maxp = 200, .mode = MODE_MIXED};
    cli_model_arg ma = {0};
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_req_opts, &ma},
                                {NULL, check_opts, &ca},
                                {"backend (threads vary on the CPU only)", cli_backend_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"check",
                         "-m DIR [--trials N] [--mode single|mixed|prefix] [--requests R] [--gen G] [--seed S] [--mtp K]",
                         CHECK_ABOUT, NULL, groups, 4};
    int crc;
    if (cli_parse(&cmd, argc, argv, &crc)) return crc;
    if (!ma.dir) return cli_usage_error(&cmd, "-m DIR is required");
    const char *dir = ma.dir, *mode_s = MODES[ca.mode];
    long long trials = ca.trials, n_req = ca.n_req, gen = ca.gen, seed = ca.seed, maxp = ca.maxp;
    int perturb = ca.perturb, mode = ca.mode;
    ds_model *m;
    ds_err err;
    ds_backend be = {0};
    if (ds_load_model(dir, NULL, &m, &err)) {
        fprintf(stderr, "dsv4 check: %s\n", err.msg);
        return 1;
    }
    m->bind_mtp = ca.mtp > 0;
    int brc = cli_bind("check", m, &bo, &be);
    if (brc) {
        ds_model_free(m);
        ds_backend_close(&be);
        return cli_bind_done(brc);
    }
    if (ca.mtp && !m->mtp_model) {
        fprintf(stderr, "dsv4 check: --mtp %lld: %s has no MTP block to speculate with (%s)\n", ca.mtp, dir,
                m->mtp ? "not under expert parallelism" : m->mtp_off);
        ds_model_free(m);
        ds_backend_close(&be);
        return 1;
    }
    int V = m->cfg.vocab_size, R = (int)n_req, G = (int)gen, rc = 1, NN = 24;
    rng r = {0x9E3779B97F4A7C15ull ^ (uint64_t)seed * 0x100000001b3ull};
    ctx C;
    memset(&C, 0, sizeof C);
    C.m = m;
    C.be = &be;
    C.perturb = perturb;
    ds_sampling_init(&C.sp);
    C.sp.temperature = 0.8;
    C.sp.top_p = 0.95;
    request *reqs = calloc((size_t)R, sizeof *reqs), *noise = calloc((size_t)NN, sizeof *noise);
    float **ref_rows = calloc((size_t)R, sizeof *ref_rows), **rows = calloc((size_t)R, sizeof *rows);
    int32_t **ref_toks = calloc((size_t)R, sizeof *ref_toks), **toks = calloc((size_t)R, sizeof *toks);
    int *unique = calloc((size_t)R, sizeof *unique);
    uint64_t *hashes = calloc((size_t)R * (size_t)(trials + 1), sizeof *hashes);
    double *maxdiff = calloc((size_t)R, sizeof *maxdiff);
    C.scr = ds_sample_scratch_create(V, &err);
    if (!reqs || !noise || !ref_rows || !rows || !ref_toks || !toks || !unique || !hashes || !maxdiff || !C.scr) {
        fprintf(stderr, "dsv4 check: out of memory\n");
        goto out;
    }
    for (int i = 0; i < R; i++) {
        request *q = &reqs[i];
        q->P = rint_(&r, 1, (int)maxp);
        q->G = G;
        q->seed = rnext(&r);
        q->toks = malloc(sizeof(int32_t) * (size_t)q->P);
        size_t nrow = (size_t)(q->P + G) * (size_t)V;
        ref_rows[i] = malloc(sizeof(float) * nrow);
        rows[i] = malloc(sizeof(float) * nrow);
        ref_toks[i] = malloc(sizeof(int32_t) * (size_t)(q->P + G + 1));
        toks[i] = malloc(sizeof(int32_t) * (size_t)(q->P + G + 1));
        if (!q->toks || !ref_rows[i] || !rows[i] || !ref_toks[i] || !toks[i]) {
            fprintf(stderr, "dsv4 check: out of memory for request %d (%d tokens x vocab %d)\n", i, q->P + G, V);
            goto out;
        }
        for (int j = 0; j < q->P; j++) q->toks[j] = (int32_t)(rnext(&r) % (uint64_t)V);
        unique[i] = 1;
    }
    printf("check      %s: %d requests, %d sampled tokens each, %lld trials, mode %s\n", dir, R, G, trials, mode_s);
    /* the reference: each request alone, whole prefill, all threads */
    for (int i = 0; i < R; i++)
        if (run_trial(&C, &reqs[i], 1, NULL, 0, &r, 0, 0, 0, &ref_rows[i], &ref_toks[i], &err)) goto fail;
    for (long long t = 0; t < trials; t++) {
        int threads = rint_(&r, 1, 4), chunk_max = rint_(&r, 1, 160), nn = 0;
        if (mode != MODE_SINGLE) {
            nn = rint_(&r, 1, NN);
            for (int j = 0; j < nn; j++) {
                request *q = &noise[j];
                free(q->toks);
                q->P = rint_(&r, 1, (int)maxp);
                q->G = rint_(&r, 0, 12);
                q->seed = rnext(&r);
                q->toks = malloc(sizeof(int32_t) * (size_t)q->P);
                if (!q->toks) goto fail;
                const request *src = &reqs[rint_(&r, 0, R - 1)];
                int shared = mode == MODE_PREFIX ? rint_(&r, 0, q->P < src->P ? q->P : src->P) : 0;
                for (int x = 0; x < q->P; x++) q->toks[x] = x < shared ? src->toks[x] : (int32_t)(rnext(&r) % (uint64_t)V);
            }
        }
        if (mode == MODE_SINGLE) {
            for (int i = 0; i < R; i++)
                if (run_trial(&C, &reqs[i], 1, NULL, 0, &r, chunk_max, threads, 0, &rows[i], &toks[i], &err)) goto fail;
        } else if (run_trial(&C, reqs, R, noise, nn, &r, chunk_max, threads, 1, rows, toks, &err)) {
            goto fail;
        }
        int nr = R;
        for (int i = 0; i < nr; i++) {
            const request *q = &reqs[i];
            size_t nrow = (size_t)(q->P + (G > 0 ? G - 1 : 0)) * (size_t)V;
            uint64_t h = fnv(fnv(0xcbf29ce484222325ull, rows[i], sizeof(float) * nrow), toks[i],
                             sizeof(int32_t) * (size_t)(q->P + G));
            uint64_t *hs = hashes + (size_t)i * (size_t)(trials + 1);
            if (t == 0)
                hs[unique[i] = 1, 0] = fnv(fnv(0xcbf29ce484222325ull, ref_rows[i], sizeof(float) * nrow), ref_toks[i],
                                           sizeof(int32_t) * (size_t)(q->P + G));
            int seen = 0;
            for (int u = 0; u < unique[i]; u++) seen |= hs[u] == h;
            if (!seen) hs[unique[i]++] = h;
            for (size_t x = 0; x < nrow; x++) {
                double d = fabs((double)rows[i][x] - (double)ref_rows[i][x]);
                if (d > maxdiff[i] || d != d) maxdiff[i] = d != d ? HUGE_VAL : d;
            }
        }
        printf("trial %3lld  threads %d, max chunk %3d, %2d co-batched requests\n", t, threads, chunk_max, nn);
        fflush(stdout);
    }
    rc = 0;
    for (int i = 0; i < R && ca.mtp; i++) { /* speculative decoding: the reference's bits */
        int acc, sb = spec_check(&C, &reqs[i], ref_rows[i], ref_toks[i], (int)ca.mtp, &r, &acc, &err);
        if (sb < 0) goto fail;
        printf("mtp %lld     request %d: %s (forced drafts: %d accepted)\n", ca.mtp, i,
               sb ? "DIFFERS from the run without speculation" : "the same tokens and logits bits", acc);
        if (sb) unique[i]++;
    }
    for (int i = 0; i < R; i++) {
        printf("request %d  %3d prompt + %d sampled tokens: %d unique output%s in %lld trials + the run alone%s, "
               "max |diff| %g\n",
               i, reqs[i].P, G, unique[i], unique[i] == 1 ? "" : "s", trials, ca.mtp ? " + speculation" : "",
               maxdiff[i]);
        if (unique[i] != 1) rc = 1;
    }
    printf("%s\n", rc ? "check: FAILED (outputs depend on the batch)" : "check: OK (bitwise identical in every trial)");
    goto out;
fail:
    fprintf(stderr, "dsv4 check: %s\n", err.msg);
    rc = 1;
out:
    for (int i = 0; i < R && reqs; i++) {
        free(reqs[i].toks);
        if (ref_rows) free(ref_rows[i]);
        if (rows) free(rows[i]);
        if (ref_toks) free(ref_toks[i]);
        if (toks) free(toks[i]);
    }
    for (int j = 0; j < NN && noise; j++) free(noise[j].toks);
    free(reqs);
    free(noise);
    free(ref_rows);
    free(rows);
    free(ref_toks);
    free(toks);
    free(unique);
    free(hashes);
    free(maxdiff);
    ds_sample_scratch_free(C.scr);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
