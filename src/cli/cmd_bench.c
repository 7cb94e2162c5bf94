/* cmd_bench.c — `dsv4 bench -m DIR`: prefill and decode speed on the CPU,
 * next to this machine's read bandwidth measured in the same run.
 *
 * Decode at batch 1 is memory-bound: every token reads the attention and
 * shared-expert weights, k routed experts per layer, the head and one
 * embedding row. The floor is those bytes / the measured read bandwidth. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/readbw.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "ep/ep.h"
#include "cli/util.h"
#include "common/io.h"
#include "runtime/generate.h"
#include "model/forward.h"
#include "model/state.h"
#include "runtime/batch.h"

/* The largest tensors of the checkpoint, largest first (up to 64). */
typedef struct {
    const ds_tensor *t[64];
    int n;
} big_tensors;

static void rank_tensors(const ds_checkpoint *ck, big_tensors *b) {
    b->n = 0;
    for (int i = 0; i < ds_checkpoint_count(ck); i++) {
        const ds_tensor *t = ds_checkpoint_at(ck, i);
        int k;
        if (b->n < 64)
            k = b->n++;
        else if (t->nbytes > b->t[63]->nbytes)
            k = 63;
        else
            continue;
        b->t[k] = t;
        for (; k > 0 && b->t[k - 1]->nbytes < b->t[k]->nbytes; k--) {
            const ds_tensor *x = b->t[k];
            b->t[k] = b->t[k - 1];
            b->t[k - 1] = x;
        }
    }
}

/* Best of `reps` reads (GB/s) of the first `limit` bytes of the largest
 * tensors: the model's own mapped weights, as decode reads them. */
static double mapped_bandwidth(const big_tensors *b, double limit, int reps, int threads, double *sink) {
    double best = 0;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = ds_now(), bytes = 0;
        for (int i = 0; i < b->n && bytes < limit; i++) {
            size_t nf = (size_t)(b->t[i]->nbytes / 4) / 4096 * 4096;
            *sink += readbw_sum((const float *)(const void *)b->t[i]->data, nf, threads);
            bytes += (double)nf * 4;
        }
        double g = bytes / (ds_now() - t0) / 1e9;
        if (bytes > 0 && g > best) best = g;
    }
    return best;
}

/* Best-of-5 read bandwidth (GB/s) with n threads over (a) a fresh 1 GiB
 * buffer (which the kernel may back with huge pages) and (b) the model's own
 * mapped weights (page cache, 4 KiB pages: what decode actually reads). */
static void read_bandwidth(const big_tensors *b, int threads, double *anon, double *mapped, double *sink) {
    size_t n = (size_t)1 << 30;
    float *buf = aligned_alloc(64, n);
    *anon = 0;
    if (buf) {
        memset(buf, 1, n);
        for (int rep = 0; rep < 5; rep++) {
            double t0 = ds_now();
            *sink += readbw_sum(buf, n / sizeof(float), threads);
            double g = (double)n / (ds_now() - t0) / 1e9;
            if (g > *anon) *anon = g;
        }
        free(buf);
    }
    *mapped = mapped_bandwidth(b, (double)n, 5, threads, sink);
}

/* AnonHugePages of this process (/proc/self/smaps_rollup), 0 if unknown. */
static double anon_huge_bytes(void) { return (double)ds_proc_kb_bytes("/proc/self/smaps_rollup", "AnonHugePages"); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The costs of a speculative step after a prompt of n tokens (medians of
 * `reps` runs, each rewound): a decode step (1 token, its logits), a verify
 * step (K + 1 tokens, all logits and the streams the block reads), the
 * block's K drafts (a row with the model's streams, then K - 1 chained rows,
 * each with logits) and the snapshot + rewind of the two sequences. */
typedef struct {
    double dec, ver, draft, snap;
} verify_cost;

static int bench_verify(const ds_model *m, const ds_backend *be, const int32_t *toks, int n, int K, verify_cost *vc,
                        ds_err *err) {
    enum { REPS = 15 };
    const ds_model *mt = m->mtp_model;
    const int V = m->cfg.vocab_size;
    const size_t nD = (size_t)m->cfg.hc_mult * (size_t)m->cfg.dim;
    ds_seq *seq = NULL, *ms = NULL;
    ds_seq_snap snap = {0}, msnap = {0};
    float *lg = ds_host_alloc(be, (size_t)(K + 1) * (size_t)V * sizeof *lg, err);
    float *hid = malloc((size_t)(n > K + 1 ? n : K + 1) * nD * sizeof *hid), *mh = malloc(nD * sizeof *mh);
    double t[4][REPS];
    int rc = -1;
    if (!lg || !hid || !mh) {
        if (lg) ds_fail(err, "out of memory for the verify benchmark");
        goto out;
    }
    if (ds_seq_new(m, n + K + 2, &seq, err) || ds_seq_new(mt, n + K + 2, &ms, err)) goto out;
    ds_batch_item p = {seq, toks, n, NULL, 0, hid, NULL}, b = {ms, toks + 1, n - 1, NULL, 0, NULL, hid};
    if (ds_forward(m, be, &p, 1, err) || (n > 1 && ds_forward(mt, be, &b, 1, err))) goto out;
    memcpy(mh, hid + (size_t)(n - 1) * nD, nD * sizeof *mh);
    for (int r = 0; r < REPS; r++) {
        double t0 = ds_now();
        if (ds_seq_snapshot(m, seq, &snap, err) || ds_seq_snapshot(mt, ms, &msnap, err)) goto out;
        double t1 = ds_now();
        ds_batch_item d = {seq, toks + n, 1, lg, 0, NULL, NULL};
        if (ds_forward(m, be, &d, 1, err)) goto out;
        double t2 = ds_now();
        if (ds_seq_rewind(m, seq, &snap, err)) goto out;
        double t3 = ds_now();
        ds_batch_item v = {seq, toks + n, K + 1, lg, 1, hid, NULL};
        if (ds_forward(m, be, &v, 1, err)) goto out;
        double t4 = ds_now();
        for (int k = 0; k < K; k++) { /* the block: its row of the model's streams, then chained */
            ds_batch_item c = {ms, toks + n + k, 1, lg, 0, hid, k ? hid + nD : mh};
            if (ds_forward(mt, be, &c, 1, err)) goto out;
            memcpy(hid + nD, hid, nD * sizeof *hid);
        }
        double t5 = ds_now();
        if (ds_seq_rewind(m, seq, &snap, err) || ds_seq_rewind(mt, ms, &msnap, err)) goto out;
        double t6 = ds_now();
        t[0][r] = t2 - t1, t[1][r] = t4 - t3, t[2][r] = t5 - t4, t[3][r] = (t1 - t0) + (t6 - t5);
    }
    for (int k = 0; k < 4; k++) qsort(t[k], REPS, sizeof(double), cmp_double);
    vc->dec = t[0][REPS / 2], vc->ver = t[1][REPS / 2], vc->draft = t[2][REPS / 2], vc->snap = t[3][REPS / 2];
    rc = 0;
out:
    if (seq) ds_seq_snap_free(seq, &snap);
    if (ms) ds_seq_snap_free(ms, &msnap);
    ds_seq_free(seq);
    ds_seq_free(ms);
    ds_host_free(be, lg);
    free(hid);
    free(mh);
    return rc;
}

/* --mtp K: greedy generation of gen tokens after the prompt toks with and
 * without the MTP block's drafts (the same tokens), the acceptance, and the
 * costs of a speculative step (bench_verify). */
int bench_mtp(ds_model *m, ds_backend *be, const int32_t *toks, long long prompt, long long gen, int K, ds_err *err) {
    if (gen <= K) return ds_fail(err, "--mtp %d: --gen %lld must exceed it (a verify step reads K + 1 tokens)", K, gen);
    if (!m->mtp_model) {
        printf("mtp        --mtp %d: no MTP block (%s)\n", K, m->mtp ? "not under expert parallelism" : m->mtp_off);
        return 0;
    }
    const int32_t none = -1;
    double tps[2] = {0, 0};
    ds_gen_result res[2];
    for (int w = 0; w < 2; w++) {
        ds_gen_params gp;
        ds_gen_params_init(&gp);
        gp.max_new = (int)gen;
        gp.stop_ids = &none, gp.n_stop = 1;
        gp.mtp = w ? K : 0;
        if (ds_generate(m, be, NULL, NULL, toks, (int)prompt, 0, &gp, NULL, NULL, &res[w], err)) return -1;
        tps[w] = res[w].gen_s > 0 ? res[w].n_gen / res[w].gen_s : 0;
    }
    const ds_gen_result *r = &res[1];
    double acc = r->mtp_steps ? (double)(r->mtp_steps + r->mtp_accepted) / r->mtp_steps : 1;
    printf("mtp        greedy, %d tokens: --mtp 0 %.2f tokens/s; --mtp %d %.2f tokens/s (x%.2f): %d steps, %d of %d "
           "drafts accepted, acceptance length %.2f tokens a step\n",
           res[0].n_gen, tps[0], K, tps[1], tps[0] > 0 ? tps[1] / tps[0] : 0, r->mtp_steps, r->mtp_accepted,
           r->mtp_drafted, r->mtp_steps ? acc : 0);
    verify_cost vc;
    if (bench_verify(m, be, toks, (int)prompt, K, &vc, err)) return -1;
    /* a speculative step makes `acc` tokens for a verify step, the drafts and
     * the snapshots (the re-feed after a rejected draft not counted) */
    double spec = vc.ver + vc.draft + vc.snap;
    printf("mtp        step costs (medians, after %lld prompt tokens): decode step (1 token) %.3f ms; verify step (%d "
           "tokens) %.3f ms (x%.2f); %d drafts by the block %.3f ms; snapshots + rewinds %.3f ms\n",
           prompt, vc.dec * 1e3, K + 1, vc.ver * 1e3, vc.dec > 0 ? vc.ver / vc.dec : 0, K, vc.draft * 1e3,
           vc.snap * 1e3);
    printf("mtp        implied speed-up = acceptance length x decode step / (verify + drafts + snapshots): x%.2f at "
           "the measured %.2f, x%.2f at 2.5\n",
           spec > 0 ? acc * vc.dec / spec : 0, acc, spec > 0 ? 2.5 * vc.dec / spec : 0);
    fflush(stdout);
    return 0;
}

/* One line per weight kind (batches under their main kind), attention and
 * the rest, per decoded token. */
void bench_print_profile(const char *title, const ds_profile *p, double steps, double step_s) {
    static const char *const name[5] = {"F32", "BF16", "F16", "FP8", "MXFP4"};
    double rest = step_s;
    printf("%s", title);
    for (int k = 0; k < 5; k++) {
        if (!p->mm_calls[k]) continue;
        double s = p->mm_seconds[k] / steps;
        rest -= s;
        printf(" %s %.2f ms (%.1f GB/s, %.0f calls)%s", name[k], s * 1e3, p->mm_bytes[k] / p->mm_seconds[k] / 1e9,
               (double)p->mm_calls[k] / steps, ";");
    }
    rest -= (p->attend_seconds + p->moe_seconds + p->exchange_seconds) / steps;
    printf(" attention %.2f ms;", p->attend_seconds / steps * 1e3);
    if (p->moe_seconds > 0) printf(" experts %.2f ms;", p->moe_seconds / steps * 1e3);
    if (p->exchange_seconds > 0) printf(" expert exchange %.2f ms;", p->exchange_seconds / steps * 1e3);
    printf(" other %.2f ms\n", rest * 1e3);
}

/* Touches every page of every tensor so that no timed step waits on the disk
 * or on page faults (the model must fit in memory for a decode benchmark),
 * then tries to pin them: this VM's memory reclaim (DAMON) otherwise evicts
 * mapped experts not routed for a while. The files are pinned whole (per
 * tensor, mlock split the huge-page mappings of --load copy into 4 KiB
 * ones). *pin_err: 0, or the errno of mlock. */
static double prefault(const ds_checkpoint *ck, int *pin_err) {
    volatile uint8_t sink = 0;
    double bytes = 0;
    for (int i = 0; i < ds_checkpoint_count(ck); i++) {
        const ds_tensor *t = ds_checkpoint_at(ck, i);
        for (uint64_t o = 0; o < t->nbytes; o += 4096) sink ^= t->data[o];
        bytes += (double)t->nbytes;
    }
    *pin_err = ds_checkpoint_mlock(ck);
    (void)sink;
    return bytes;
}

int bench_batch_decode(const ds_model *m, ds_backend *be, int B, long long prompt, long long gen, const int32_t *toks,
                       const ds_observer *obs, void (*after_step)(void *ctx), void *ctx, ds_profile *prof,
                       double *seconds, ds_err *err) {
    int P = (int)(prompt / 4 > 0 ? prompt / 4 : 1), V = m->cfg.vocab_size;
    ds_seq **ss = calloc((size_t)B, sizeof *ss);
    ds_batch_item *its = calloc((size_t)B, sizeof *its);
    int ok = ss && its;
    if (!ok) ds_fail(err, "out of memory for a batch of %d", B);
    /* the backend's download buffer (its own message when it cannot give it) */
    float *lg = ok ? ds_host_alloc(be, sizeof(float) * (size_t)B * V, err) : NULL;
    ok = ok && lg;
    const int32_t **pt = calloc((size_t)B, sizeof *pt);
    int *pn = calloc((size_t)B, sizeof *pn);
    if (ok && (!pt || !pn)) ok = 0, ds_fail(err, "out of memory for a batch of %d", B);
    for (int i = 0; ok && i < B; i++) {
        ok = ds_seq_new(m, P + gen + 1, &ss[i], err) == 0;
        pt[i] = toks + (i * 7) % (prompt + gen - P);
        pn[i] = P;
    }
    if (ok) ok = ds_run_tokens(m, be, ss, pt, pn, B, 0, NULL, err) == 0; /* prefill all */
    free(pt);
    free(pn);
    *seconds = 0;
    for (long long g = 0; ok && g < gen; g++) {
        for (int i = 0; i < B; i++)
            its[i] = (ds_batch_item){ss[i], toks + (i * 13 + g) % (prompt + gen), 1, lg + (size_t)i * V, 0, NULL, NULL};
        be->profile = prof; /* the decode steps only, not the prefill */
        double t1 = ds_now();
        ok = ds_forward_observed(m, be, its, B, obs, err) == 0;
        *seconds += ds_now() - t1;
        be->profile = NULL;
        if (ok && after_step) after_step(ctx);
    }
    for (int i = 0; ss && i < B; i++) ds_seq_free(ss[i]);
    free(ss);
    free(its);
    ds_host_free(be, lg);
    return ok ? 0 : -1;
}

int bench_batch_profile(const ds_model *m, ds_backend *be, int B, long long prompt, long long gen,
                        const int32_t *toks, ds_err *err) {
    ds_profile prof;
    memset(&prof, 0, sizeof prof);
    double t = 0;
    if (bench_batch_decode(m, be, B, prompt, gen, toks, NULL, NULL, NULL, &prof, &t, err)) return -1;
    char title[96];
    snprintf(title, sizeof title, "where      per step at batch %d (profiled, ops synchronized):", B);
    bench_print_profile(title, &prof, (double)gen, t / (double)gen);
    fflush(stdout);
    return 0;
}

/* Counts the distinct experts each MoE layer reads in a step. */
typedef struct {
    unsigned char *used; /* [layers][experts] */
    int E;
} expert_use;

static void on_route(void *ctx, int layer, int item, int tok, const int *experts, int k) {
    expert_use *u = ctx;
    (void)item, (void)tok;
    for (int j = 0; j < k; j++) u->used[(size_t)layer * u->E + experts[j]] = 1;
}

/* Weight bytes a step reads: everything but the routed experts once, plus
 * each distinct routed expert touched. */
static double step_bytes(const ds_model *m, const expert_use *u) {
    const ds_config *c = &m->cfg;
    /* ds_model_decode_bytes counts k experts per layer: replace them by the distinct ones */
    double b = (double)ds_model_decode_bytes(m);
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        double e1 = (double)(ds_weight_bytes(&ly->w1[0]) + ds_weight_bytes(&ly->w2[0]) + ds_weight_bytes(&ly->w3[0]));
        int n = 0;
        for (int e = 0; e < c->n_routed_experts; e++) n += u->used[(size_t)li * u->E + e];
        b += e1 * (n - c->n_active_experts);
    }
    return b;
}

/* After each batched step: the weight bytes it read, then a fresh count. */
typedef struct {
    const ds_model *m;
    expert_use u;
    double bytes;
} batch_use;

static void count_step(void *ctx) {
    batch_use *b = ctx;
    b->bytes += step_bytes(b->m, &b->u);
    memset(b->u.used, 0, (size_t)b->m->cfg.n_layers * (size_t)b->u.E);
}

typedef struct {
    long long prompt, gen, mtp;
    cli_ids batch;
    int kernels, batch_profile;
} bench_args;

static const cli_opt bench_opts[] = {
    CLI_LONG_OPT("--prompt", NULL, bench_args, prompt, 1, 1 << 20, "P", "prefill P tokens (default 128)"),
    CLI_LONG_OPT("--gen", NULL, bench_args, gen, 1, 1 << 20, "N", "then decode N tokens at batch 1 (default 16)"),
    CLI_IDS_OPT("--batch", NULL, bench_args, batch, 1, 4096, "B,...",
                "also decode with B sequences per step (each prefilled with P/4 tokens) and report tokens/s and the "
                "weight bytes actually read per step (distinct experts)"),
    CLI_FLAG_OPT("--batch-profile", NULL, bench_args, batch_profile,
                 "run each --batch size (and, on a device, the prefill) once more with the backend's profile on (ops "
                 "synchronized) and print where a step's time goes"),
    CLI_LONG_OPT("--mtp", NULL, bench_args, mtp, 0, DS_GEN_MTP_MAX, "K",
                 "also generate N tokens greedily from the prompt without and with speculative decoding (the MTP "
                 "block drafting K tokens a step): tokens/s of each, the acceptance and the cost of a speculative step"),
    CLI_FLAG_OPT("--kernels", NULL, bench_args, kernels,
                 "each decode kernel against the plain read of the same memory (dsv4 bench --kernels --help)"),
    CLI_END,
};

static const char BENCH_ABOUT[] =
    "Prefills P tokens, then decodes N tokens at batch 1; prints tokens/s, weight GB/s per decoded token,\n"
    "the read bandwidth (measured before and between decode chunks of 8 tokens), the ratios, and where\n"
    "prefill and decode time goes. --backend cuda [--gpu N]: the same on the GPU, against the device's\n"
    "copy bandwidth.\n";

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--kernels")) return cmd_bench_kernels(argc, argv);
        else if (!strcmp(argv[i], "--grammar")) return cmd_bench_grammar(argc, argv);
    bench_args ba = {.prompt = 128, .gen = 16};
    cli_model_arg ma = {0};
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_req_opts, &ma},
                                {NULL, bench_opts, &ba},
                                {"backend", cli_threads_opts, &bo},
                                {"backend", cli_load_opts, &bo},
                                {CLI_TIER_TITLE, cli_tier_opts, &bo},
                                {"backend", cli_backend_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"bench",
                         "-m DIR [--prompt P] [--gen N] [--threads N] [--batch 1,4,16,64] [--mtp K] [--backend cpu|cuda]\n"
                         "       dsv4 bench --kernels [--threads N] [--reps R] [--mib M]\n"
                         "       dsv4 bench --grammar SCHEMA.json [-m DIR] [--tokens N]",
                         BENCH_ABOUT, NULL, groups, (int)(sizeof groups / sizeof groups[0])};
    int crc;
    if (cli_parse(&cmd, argc, argv, &crc)) return crc;
    if (!ma.dir) {
        cli_free(&cmd);
        return cli_usage_error(&cmd, "-m DIR is required");
    }
    const char *dir = ma.dir;
    long long prompt = ba.prompt, gen = ba.gen;
    int32_t *batches = ba.batch.v; /* freed below */
    int n_batches = ba.batch.n;
    if (bo.name && strcmp(bo.name, "cpu")) {
        int drc = cmd_bench_device(dir, &bo, prompt, gen, batches, n_batches, ba.batch_profile, (int)ba.mtp);
        free(batches);
        return drc;
    }
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_err err;
    if (cli_load_model("bench", dir, &bo, &m)) {
        free(batches);
        return 1;
    }
    double t_bind = ds_now();
    m->bind_mtp = ba.mtp > 0;
    int brc = cli_bind("bench", m, &bo, &be);
    if (brc) {
        ds_model_free(m);
        free(batches);
        return cli_bind_done(brc);
    }
    t_bind = ds_now() - t_bind;
    int n_threads = be.threads(&be);
    const ds_config *c = &m->cfg;
    int V = c->vocab_size, rc = 1;
    int32_t *toks = malloc((size_t)(prompt + gen) * sizeof *toks);
    float *logits = toks ? ds_host_alloc(&be, (size_t)V * sizeof *logits, &err) : NULL;
    ds_seq *seq = NULL;
    if (!toks || !logits || ds_seq_new(m, prompt + gen + 1, &seq, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", toks ? err.msg : "out of memory");
        goto out;
    }
    uint64_t x = 88172645463325252ull;
    for (long long i = 0; i < prompt + gen; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)V);
    }
    printf("model      %s: hidden %d, %d layers, %d experts (%d active), vocab %d\n", dir, c->dim, c->n_layers,
           c->n_routed_experts, c->n_active_experts, V);
    const char *note = be.note(&be);
    printf("backend    %s, %d threads, batch 1%s%s\n", be.name, n_threads, *note ? ", " : "", note);
    if (ds_checkpoint_copied(m->ck))
        printf("weights    copied into memory (--load copy): %.2f GB, %.2f GB of this process on huge pages\n",
               ds_checkpoint_bytes(m->ck) / 1e9, anon_huge_bytes() / 1e9);
    else
        printf("weights    mapped in place (--load mmap)\n");
    if (ds_model_packed_bytes(m))
        printf("packed     BF16 products read exact 12-bit copies (bf16x.c): %.2f GB more memory, bound in %.1f s "
               "(DSV4_CPU_PACK=0: without)\n",
               ds_model_packed_bytes(m) / 1e9, t_bind);
    fflush(stdout);
    int pin_err;
    double t_pf = ds_now(), mapped = prefault(m->ck, &pin_err);
    printf("warm-up    %.2f GB of weights paged in, %.1f s; %s%s; %.2f GB of this process on huge pages\n",
           mapped / 1e9, ds_now() - t_pf, pin_err ? "not pinned in memory: mlock: " : "pinned in memory (mlock)",
           pin_err ? strerror(pin_err) : "", anon_huge_bytes() / 1e9);
    fflush(stdout);
    big_tensors big;
    rank_tensors(m->ck, &big);
    double sink = 0, bw_anon, bw_mapped;
    read_bandwidth(&big, n_threads, &bw_anon, &bw_mapped, &sink);
    double bw = bw_anon > bw_mapped ? bw_anon : bw_mapped;
    printf("memory     read bandwidth %.1f GB/s (%d threads, best of 5: fresh 1 GiB buffer %.1f GB/s, the model's "
           "mapped weights %.1f GB/s)\n",
           bw, n_threads, bw_anon, bw_mapped);
    fflush(stdout);
    /* warm-up: two steps' worth of the prompt (the arena and scratch at their sizes) */
    ds_batch_item it = {seq, toks, (int)(prompt < 2 * DS_STEP_TOKENS ? prompt : 2 * DS_STEP_TOKENS), logits, 0,
                        NULL, NULL};
    if (ds_forward(m, &be, &it, 1, &err)) goto fail;
    ds_seq_reset(seq);
    it.n_tokens = (int)prompt;
    ds_profile prof_prefill = {0};
    cli_tiers_report(NULL, NULL, m, 0);
    be.profile = &prof_prefill;
    double t0 = ds_now();
    if (ds_forward(m, &be, &it, 1, &err)) goto fail;
    double tp = ds_now() - t0;
    be.profile = NULL;
    cli_tiers_report(stdout, "tiers      prefill: ", m, 1);
    /* decode in chunks, the read bandwidth measured again before each chunk
     * and after the last (this machine's bandwidth changes over seconds): a
     * chunk is compared with the higher of its two neighbours, the whole run
     * with the highest bandwidth seen anywhere — never flattering */
    enum { CHUNK = 8 };
    int nchunks = (int)((gen + CHUNK - 1) / CHUNK);
    double *bw_at = malloc(sizeof(double) * (size_t)(nchunks + 1)), *ratio = malloc(sizeof(double) * (size_t)nchunks);
    if (!bw_at || !ratio) {
        free(bw_at), free(ratio);
        fprintf(stderr, "dsv4 bench: out of memory\n");
        goto out;
    }
    ds_profile prof = {0};
    double td = 0, bytes = (double)ds_model_decode_bytes(m), bw_min = 1e30, bw_max = 0;
    for (int ch = 0; ch <= nchunks; ch++) {
        bw_at[ch] = mapped_bandwidth(&big, 512.0 * (1 << 20), 2, n_threads, &sink);
        if (bw_at[ch] > bw) bw = bw_at[ch];
        if (bw_at[ch] < bw_min) bw_min = bw_at[ch];
        if (bw_at[ch] > bw_max) bw_max = bw_at[ch];
        if (ch == nchunks) break;
        be.profile = &prof;
        t0 = ds_now();
        long long g0 = (long long)ch * CHUNK, g1 = g0 + CHUNK < gen ? g0 + CHUNK : gen;
        for (long long g = g0; g < g1; g++) {
            ds_batch_item d = {seq, toks + prompt + g, 1, logits, 0, NULL, NULL};
            if (ds_forward(m, &be, &d, 1, &err)) {
                free(bw_at), free(ratio);
                goto fail;
            }
        }
        double t_chunk = ds_now() - t0;
        be.profile = NULL;
        td += t_chunk;
        ratio[ch] = bytes * (double)(g1 - g0) / t_chunk / 1e9;
    }
    for (int ch = 0; ch < nchunks; ch++) ratio[ch] /= bw_at[ch] > bw_at[ch + 1] ? bw_at[ch] : bw_at[ch + 1];
    qsort(ratio, (size_t)nchunks, sizeof *ratio, cmp_double);
    td /= (double)gen;
    printf("prefill    %lld tokens in %.3f s: %.1f tokens/s\n", prompt, tp, (double)prompt / tp);
    printf("decode     %lld tokens: %.2f ms/token, %.2f tokens/s, weights %.3f GB/token -> %.2f GB/s\n", gen,
           td * 1e3, 1.0 / td, bytes / 1e9, bytes / td / 1e9);
    printf("floor      %.2f tokens/s at %.1f GB/s (the highest read bandwidth measured; between decode chunks "
           "%.1f-%.1f GB/s); achieved %.2f of the bandwidth floor\n",
           bw * 1e9 / bytes, bw, bw_min, bw_max, bytes / td / 1e9 / bw);
    printf("chunks     %d of up to %d tokens, each against the bandwidth measured next to it: min %.2f, median %.2f, "
           "max %.2f\n",
           nchunks, CHUNK, ratio[0], ratio[nchunks / 2], ratio[nchunks - 1]);
    cli_tiers_report(stdout, "tiers      decode: ", m, (double)gen);
    bench_print_profile("where      per token:", &prof, (double)gen, td);
    bench_print_profile("prefill    per call: ", &prof_prefill, 1.0, tp);
    free(bw_at);
    free(ratio);
    if (sink == -1) printf("\n"); /* keeps the reads */
    if (ba.mtp && bench_mtp(m, &be, toks, prompt, gen, (int)ba.mtp, &err)) goto fail;
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        batch_use bu = {m, {calloc((size_t)c->n_layers * c->n_routed_experts, 1), c->n_routed_experts}, 0};
        ds_observer obs = {on_route, NULL, &bu.u, NULL};
        double t_b = 0;
        cli_tiers_report(NULL, NULL, m, 0);
        int ok = bu.u.used && bench_batch_decode(m, &be, B, prompt, gen, toks, &obs, count_step, &bu, NULL, &t_b, &err) == 0;
        double bytes_b = bu.bytes;
        if (ok)
            printf("batch %-4d decode %lld steps: %.1f ms/step, %.1f tokens/s, weights %.3f GB/step -> %.2f GB/s "
                   "(%.2f of the bandwidth)\n",
                   B, gen, t_b / gen * 1e3, B * gen / t_b, bytes_b / gen / 1e9, bytes_b / t_b / 1e9,
                   bytes_b / t_b / 1e9 / bw);
        else
            fprintf(stderr, "dsv4 bench: batch %d: %s\n", B, bu.u.used ? err.msg : "out of memory");
        if (ok) {
            char label[64];
            snprintf(label, sizeof label, "tiers      batch %d (prefill and decode): ", B);
            cli_tiers_report(stdout, label, m, (double)gen);
        }
        free(bu.u.used);
        fflush(stdout);
        if (!ok) goto out;
        if (ba.batch_profile && bench_batch_profile(m, &be, B, prompt, gen, toks, &err)) goto fail;
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dsv4 bench: %s\n", err.msg);
out:
    free(batches);
    free(toks);
    ds_host_free(&be, logits);
    ds_seq_free(seq);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
