/* cmd_serve.c — `dsv4 serve`: an OpenAI-compatible HTTP server over the
 * continuous-batching scheduler (runtime/scheduler.h); HTTP in serve_http.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "ep/ep.h"
#include "cli/serve_http.h"
#include "cli/util.h"
#include "text/tokenizer.h"
#include "model/model.h"
#include "model/state.h"
#include "runtime/context.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"

typedef struct {
    const char *host, *key, *name, *health_host, *load_out;
    long long port, max_seqs, ctx, max_queue, step, chunk, cache, max_body, timeout, wait, per_peer, header_timeout,
        max_conns, health_port, mtp, mtp_batch;
} serve_args;

static const cli_opt serve_opts[] = {
    CLI_STRING_OPT("--host", NULL, serve_args, host, "ADDR",
                   "IPv4 address to listen on (default 127.0.0.1: this machine only)"),
    CLI_LONG_OPT("--port", NULL, serve_args, port, 0, 65535, "N", "TCP port (default 8080; 0: any free port, printed at start)"),
    CLI_STRING_OPT("--api-key", NULL, serve_args, key, "KEY",
                   "require 'Authorization: Bearer KEY' on /v1/ (default: $DSV4_API_KEY, else none)"),
    CLI_LONG_OPT("--max-seqs", NULL, serve_args, max_seqs, 1, 256, "N", "requests decoded together at most (default 16)"),
    CLI_LONG_OPT("--ctx", NULL, serve_args, ctx, 2, 1LL << 40, "N",
                 "tokens per request, prompt + completion (default: the model's max_position_embeddings, or less so "
                 "that --max-seqs + --cache-seqs sequences of it fit the backend's free memory)"),
    CLI_LONG_OPT("--max-queue", NULL, serve_args, max_queue, 0, 1 << 20, "N",
                 "requests waiting at most; more get 429 (default 64)"),
    CLI_LONG_OPT("--step-tokens", NULL, serve_args, step, 1, 1 << 20, "N",
                 "tokens per forward step at most: decodes + prompt chunks (default 256)"),
    CLI_LONG_OPT("--prefill-chunk", NULL, serve_args, chunk, 1, 1 << 20, "N",
                 "prompt tokens of one request per step at most (default 128)"),
    CLI_LONG_OPT("--batch-wait", NULL, serve_args, wait, 0, 60000, "MS",
                 "an idle server's first request waits at most MS for the requests sent with it (until none "
                 "comes for 2 ms), so that one step prefills them together (default 10; 0: off)"),
    CLI_LONG_OPT("--cache-seqs", NULL, serve_args, cache, 0, 1024, "N",
                 "finished conversations kept for prefix reuse (default 4; 0: off)"),
    CLI_LONG_OPT("--max-body", NULL, serve_args, max_body, 1024, 1LL << 32, "BYTES",
                 "request body limit (default 8388608; larger gets 413)"),
    CLI_LONG_OPT("--timeout", NULL, serve_args, timeout, 1, 86400, "S",
                 "a connection sending its request body is closed after S seconds without a byte (default 60)"),
    CLI_LONG_OPT("--header-timeout", NULL, serve_args, header_timeout, 1, 86400, "S",
                 "a connection whose request header is not complete (a new one, or a kept-alive one between "
                 "requests) is closed after S seconds without a byte (default 10)"),
    CLI_LONG_OPT("--max-conns", NULL, serve_args, max_conns, 1, 1024, "N",
                 "connections at most; more are closed at once (default 1024)"),
    CLI_LONG_OPT("--max-conns-per-peer", NULL, serve_args, per_peer, 1, 1024, "N",
                 "connections of one client address at most (default 512: the rest stay for others)"),
    CLI_LONG_OPT("--health-port", NULL, serve_args, health_port, 0, 65535, "N",
                 "also answer GET /health and /metrics on this port, a listener of its own that slow clients "
                 "of the main port cannot fill (0: any free port, printed at start; default: none)"),
    CLI_STRING_OPT("--health-host", NULL, serve_args, health_host, "ADDR",
                   "IPv4 address of the health listener (default 127.0.0.1)"),
    CLI_LONG_OPT("--mtp", NULL, serve_args, mtp, 0, DS_GEN_MTP_MAX, "K",
                 "speculative decoding with the model's MTP block: K tokens drafted per request and step, the same "
                 "tokens and logprobs (default 0: off)"),
    CLI_LONG_OPT("--mtp-max-batch", NULL, serve_args, mtp_batch, 0, 256, "N",
                 "speculate only in steps with at most N decoding requests (default 4; docs/server.md)"),
    CLI_STRING_OPT("--model-name", NULL, serve_args, name, "NAME", "the model id clients name (default: the directory's name)"),
    CLI_STRING_OPT("--load-out", NULL, serve_args, load_out, "F",
                   "at the stop (SIGINT / SIGTERM), write the experts' exponentially weighted load (/metrics' "
                   "dsv4_expert_load) to F as lines 'LAYER EXPERT TOKENS', for dsv4 tiers --expert-load and "
                   "--expert-load under mpirun (checked writable at start)"),
    CLI_END,
};

/* The context of every request: *ctx as given (0: the longest that n
 * sequences' state fits next to the weights, at most max_position_embeddings);
 * an error naming the numbers when it is over the model's maximum or n
 * sequences of it do not fit. */
static int serve_ctx(const ds_model *m, const ds_backend *be, long long n, long long *ctx) {
    ds_ctx_budget b;
    ds_err err;
    if (*ctx > m->cfg.max_pos) {
        fprintf(stderr, "dsv4 serve: --ctx %lld is over the model's max_position_embeddings (%lld)\n", *ctx,
                (long long)m->cfg.max_pos);
        return -1;
    }
    if (ds_ctx_budget_of(m, be, &b, &err)) {
        if (*ctx) return 0; /* as given: the sequences' allocations will say if they do not fit */
        fprintf(stderr, "dsv4 serve: %s: give --ctx\n", err.msg);
        return -1;
    }
    long long fit = (long long)ds_seq_fit(m, b.state, (int)n);
    if (!*ctx) *ctx = fit;
    if (*ctx < 2 || *ctx > fit) {
        fprintf(stderr,
                "dsv4 serve: %lld sequences (--max-seqs + --cache-seqs) of %lld tokens need %.2f GB of state; the %s "
                "backend has %.2f GB free, %.2f GB of it for a step's activations: %lld tokens fit (--ctx), or fewer "
                "sequences\n",
                n, *ctx < 2 ? 2 : *ctx, (double)ds_seq_bytes(m, *ctx < 2 ? 2 : *ctx) * (double)n / 1e9, be->name,
                b.avail / 1e9, b.activations / 1e9, fit);
        return -1;
    }
    return 0;
}

/* --load-out: the table written whole into the file opened at the start
 * (PATH.tmp), then renamed over PATH, so that PATH is the old file or the
 * whole new one. */
static int write_load(const char *path, const char *tmp, FILE *f, ds_sched *s, int layers, int experts) {
    size_t n = (size_t)layers * (size_t)experts;
    double *ld = malloc(n * sizeof *ld);
    int bad = !ld || ds_sched_get_load(s, ld, (int)n);
    if (!bad) {
        fprintf(f,
                "# dsv4 serve --load-out: LAYER EXPERT TOKENS, exponentially weighted (half-life %.0f routed "
                "tokens of a layer)\n",
                DS_SCHED_LOAD_HALFLIFE);
        for (size_t i = 0; i < n; i++) fprintf(f, "%d %d %.6f\n", (int)(i / experts), (int)(i % experts), ld[i]);
    }
    free(ld);
    bad |= ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        fprintf(stderr, "dsv4 serve: --load-out %s: %s\n", path, bad ? "writing failed" : strerror(errno));
        unlink(tmp);
        return -1;
    }
    fprintf(stderr, "dsv4 serve: the experts' load written to %s\n", path);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    const char *env_key = getenv("DSV4_API_KEY");
    serve_args sa = {.host = "127.0.0.1", .key = env_key, .per_peer = 512, .port = 8080, .max_seqs = 16, .ctx = 0,
                     .max_queue = 64, .step = 256, .chunk = 128, .cache = 4, .wait = 10, .max_body = 8 << 20,
                     .timeout = 60, .header_timeout = 10, .max_conns = 1024, .health_port = -1,
                     .health_host = "127.0.0.1", .mtp_batch = 4};
    cli_model_arg ma = {0};
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_opts, &ma},
                                {NULL, serve_opts, &sa},
                                {"backend", cli_threads_opts, &bo},
                                {"backend", cli_load_opts, &bo},
                                {CLI_TIER_TITLE, cli_tier_opts, &bo},
                                {"backend", cli_backend_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"serve",
                         "[-m DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--max-seqs N] [--ctx N] "
                         "[--backend cpu] [--threads N] [options]",
                         "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions (JSON or\n"
                         "SSE with \"stream\": true), GET /v1/models, /health, /metrics (Prometheus), / (chat page).\n"
                         "A request with a seed gets the same text whatever else the server is doing.\n",
                         NULL, groups, (int)(sizeof groups / sizeof groups[0])};
    int rc = 1;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    const char *given = ma.dir, *host = sa.host, *key = sa.key, *name = sa.name;
    long long port = sa.port, max_seqs = sa.max_seqs, ctx = sa.ctx, max_queue = sa.max_queue, step = sa.step,
              chunk = sa.chunk, cache = sa.cache, max_body = sa.max_body, timeout = sa.timeout, wait = sa.wait;
    if (key && !key[0] && key != env_key)
        return cli_usage_error(&cmd, "--api-key is empty: give a key, or leave the option out to serve without one");
    if (key && !key[0]) key = NULL;
    if (!key && strncmp(host, "127.", 4))
        fprintf(stderr, "dsv4 serve: warning: listening on %s without --api-key: anyone who can reach this address "
                        "can use the server\n",
                host);
    char load_tmp[4200];
    FILE *load_f = NULL;
    if (sa.load_out) { /* unwritable: said now, not after serving */
        if ((size_t)snprintf(load_tmp, sizeof load_tmp, "%s.tmp", sa.load_out) >= sizeof load_tmp)
            return cli_usage_error(&cmd, "--load-out: path too long");
        if (!(load_f = fopen(load_tmp, "w"))) {
            fprintf(stderr, "dsv4 serve: --load-out %s: cannot write %s: %s\n", sa.load_out, load_tmp,
                    strerror(errno));
            return 1;
        }
    }
    if (step < max_seqs) step = max_seqs;

    char dir[4096];
    if (cli_model_dir("serve", given, dir, sizeof dir)) {
        if (load_f) fclose(load_f), unlink(load_tmp);
        return 1;
    }
    if (!name) {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
        const char *sl = strrchr(dir, '/');
        name = sl ? sl + 1 : dir;
    }
    /* SIGINT / SIGTERM are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ds_model *m = NULL;
    ds_tokenizer *tok = NULL;
    ds_sched *sched = NULL;
    ds_vocab_trie *trie = NULL;
    serve *srv = NULL;
    ds_err err = {{0}};
    ds_backend be = {0};
    if (cli_load_model_tok("serve", dir, &bo, &m, &tok)) goto out;
    m->bind_mtp = sa.mtp > 0;
    int brc = cli_bind("serve", m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    if (serve_ctx(m, &be, max_seqs + cache, &ctx)) goto out;
    ds_sched_opts so;
    ds_sched_opts_init(&so);
    so.max_seqs = (int)max_seqs;
    so.max_queue = (int)max_queue;
    so.ctx = ctx;
    so.step_tokens = (int)step;
    so.prefill_chunk = (int)chunk;
    so.cache_seqs = (int)cache;
    so.gather_ms = (int)wait;
    so.gather_gap_ms = wait < 2 ? (int)wait : 2;
    so.threads = bo.threads;
    so.mtp = (int)sa.mtp;
    so.mtp_max_batch = (int)sa.mtp_batch;
    if (sa.mtp && !m->mtp_model)
        fprintf(stderr, "dsv4 serve: --mtp %lld: no MTP block (%s); serving without speculation\n", sa.mtp,
                m->mtp ? "not under expert parallelism" : m->mtp_off);
    int32_t *mask = NULL; /* ids without a token (a model vocabulary larger than the tokenizer's) */
    int n_mask = 0;
    if (ds_gen_unsampled_ids(tok, m->cfg.vocab_size, &mask, &n_mask, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        goto out;
    }
    so.mask_ids = mask;
    so.n_mask = n_mask;
    if (ds_vocab_trie_build(tok, &trie, &err)) { /* structured output's token masks */
        free(mask);
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        goto out;
    }
    so.trie = trie;
    int src = ds_sched_start(m, &be, &so, &sched, &err);
    free(mask);
    if (src) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        goto out;
    }
    serve_cfg cfg = {.host = host,
                     .port = (int)port,
                     .api_key = key,
                     .model_id = name,
                     .ctx = ctx,
                     .max_body = (size_t)max_body,
                     .timeout_s = (int)timeout,
                     .header_timeout_s = (int)sa.header_timeout,
                     .max_conns = (int)sa.max_conns,
                     .max_conns_per_peer = (int)sa.per_peer,
                     .health_host = sa.health_host,
                     .health_port = (int)sa.health_port,
                     .mtp = m->mtp_model && sa.mtp > 0};
    if (serve_start(&cfg, m, tok, sched, &srv)) goto out;
    fprintf(stderr, "dsv4 serve: model '%s' (%s), ctx %lld, max-seqs %lld, backend %s, %d threads%s", name, dir, ctx,
            max_seqs, be.name, be.threads(&be), key ? ", API key required" : "");
    if (sa.mtp && m->mtp_model)
        fprintf(stderr, ", mtp %lld (at most %lld decoding requests)", sa.mtp, sa.mtp_batch);
    fputc('\n', stderr);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "dsv4 serve: signal %d, stopping\n", sig);
    rc = 0;
out:
    if (sched) ds_sched_shutdown(sched); /* ends every request, so connections finish */
    serve_stop(srv);
    if (load_f && sched && !rc) {
        if (write_load(sa.load_out, load_tmp, load_f, sched, m->cfg.n_layers, m->cfg.n_routed_experts)) rc = 1;
    } else if (load_f) {
        fclose(load_f);
        unlink(load_tmp);
    }
    ds_sched_stop(sched);
    ds_vocab_trie_free(trie);
    ds_tokenizer_free(tok);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
