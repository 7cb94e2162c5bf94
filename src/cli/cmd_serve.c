/* cmd_serve.c — `dsv4 serve`: an OpenAI-compatible HTTP server over the
 * continuous-batching scheduler (runtime/scheduler.h); HTTP in serve_http.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli/commands.h"
#include "cli/serve_http.h"
#include "cli/util.h"
#include "text/tokenizer.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 serve [-m DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--max-seqs N]\n"
            "                  [--ctx N] [--backend cpu] [--threads N] [options]\n"
            "\n"
            "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions (JSON or\n"
            "SSE with \"stream\": true), GET /v1/models, /health, /metrics (Prometheus), / (chat page).\n"
            "A request with a seed gets the same text whatever else the server is doing.\n"
            "\n"
            "  -m DIR             model directory (default as for dsv4 run)\n"
            "  --host ADDR        IPv4 address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N           TCP port (default 8080; 0: any free port, printed at start)\n"
            "  --api-key KEY      require 'Authorization: Bearer KEY' on /v1/ (default: $DSV4_API_KEY, else none)\n"
            "  --max-seqs N       requests decoded together at most (default 16)\n"
            "  --ctx N            tokens per request, prompt + completion (default 4096)\n"
            "  --backend NAME     compute backend: cpu (default) or cuda (builds with the CUDA backend)\n"
            "  --gpu N            CUDA device (default 0)\n"
            "  --threads N        CPU threads (default: all cores)\n"
            "  --max-queue N      requests waiting at most; more get 429 (default 64)\n"
            "  --step-tokens N    tokens per forward step at most: decodes + prompt chunks (default 256)\n"
            "  --prefill-chunk N  prompt tokens of one request per step at most (default 128)\n"
            "  --cache-seqs N     finished conversations kept for prefix reuse (default 4; 0: off)\n"
            "  --max-body BYTES   request body limit (default 8388608; larger gets 413)\n"
            "  --timeout S        idle connection timeout in seconds (default 60)\n"
            "  --model-name NAME  the model id clients name (default: the directory's name)\n");
}

/* one row per option taking a value: name, bounds, destination */
typedef struct {
    const char *name;
    long long lo, hi;
    long long *v;
} int_opt;

int cmd_serve(int argc, char **argv) {
    const char *given = NULL, *host = "127.0.0.1", *key = getenv("DSV4_API_KEY"), *backend = "cpu", *name = NULL;
    long long port = 8080, max_seqs = 16, ctx = 4096, threads = 0, max_queue = 64, step = 256, chunk = 128,
              cache = 4, max_body = 8 << 20, timeout = 60, gpu = 0;
    const int_opt ints[] = {
        {"--port", 0, 65535, &port},           {"--max-seqs", 1, 256, &max_seqs},
        {"--ctx", 2, 1 << 24, &ctx},           {"--threads", 0, 1024, &threads},
        {"--max-queue", 0, 1 << 20, &max_queue}, {"--step-tokens", 1, 1 << 20, &step},
        {"--prefill-chunk", 1, 1 << 20, &chunk}, {"--cache-seqs", 0, 1024, &cache},
        {"--max-body", 1024, 1LL << 32, &max_body}, {"--timeout", 1, 86400, &timeout},
        {"--gpu", 0, 1024, &gpu},
    };
    struct {
        const char *name;
        const char **v;
    } strs[] = {{"-m", &given}, {"--host", &host}, {"--api-key", &key}, {"--backend", &backend},
                {"--model-name", &name}};
    for (int i = 1; i < argc; i += 2) { /* every option but --help takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int done = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        }
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++)
            if (!strcmp(a, ints[k].name) && v) {
                if (cli_parse_int(a, v, ints[k].lo, ints[k].hi, ints[k].v)) goto usage_err;
                done = 1;
            }
        for (size_t k = 0; k < sizeof strs / sizeof strs[0] && !done; k++)
            if (!strcmp(a, strs[k].name) && v) *strs[k].v = v, done = 1;
        if (!done) {
            fprintf(stderr, "dsv4 serve: unknown or incomplete option '%s'\n", a);
            goto usage_err;
        }
    }
    if (key && !key[0]) key = NULL;
    if (step < max_seqs) step = max_seqs;

    char dir[4096];
    if (cli_model_dir("serve", given, dir, sizeof dir)) return 1;
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

    int rc = 1;
    ds_model *m = NULL;
    ds_tokenizer *tok = NULL;
    ds_sched *sched = NULL;
    serve *srv = NULL;
    ds_err err = {{0}};
    ds_backend be = {0};
    ds_backend_opts bo = {backend, (int)gpu, (int)threads};
    if (cli_load_model_tok("serve", dir, &m, &tok) || cli_bind("serve", m, &bo, &be)) goto out;
    ds_sched_opts so;
    ds_sched_opts_init(&so);
    so.max_seqs = (int)max_seqs;
    so.max_queue = (int)max_queue;
    so.ctx = ctx;
    so.step_tokens = (int)step;
    so.prefill_chunk = (int)chunk;
    so.cache_seqs = (int)cache;
    so.threads = (int)threads;
    int32_t *mask = NULL; /* ids without a token (a model vocabulary larger than the tokenizer's) */
    int n_mask = 0;
    if (ds_gen_unsampled_ids(tok, m->cfg.vocab_size, &mask, &n_mask, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        goto out;
    }
    so.mask_ids = mask;
    so.n_mask = n_mask;
    int src = ds_sched_start(m, &be, &so, &sched, &err);
    free(mask);
    if (src) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        goto out;
    }
    serve_cfg cfg = {host, (int)port, key, name, ctx, (size_t)max_body, (int)timeout, 1024};
    if (serve_start(&cfg, m, tok, sched, &srv)) goto out;
    fprintf(stderr, "dsv4 serve: model '%s' (%s), ctx %lld, max-seqs %lld, backend %s, %d threads%s\n", name, dir, ctx,
            max_seqs, be.name, !strcmp(be.name, "cpu") ? ds_backend_cpu_threads(&be) : 0, key ? ", API key required" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "dsv4 serve: signal %d, stopping\n", sig);
    rc = 0;
out:
    if (sched) ds_sched_shutdown(sched); /* ends every request, so connections finish */
    serve_stop(srv);
    ds_sched_stop(sched);
    ds_tokenizer_free(tok);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
usage_err:
    serve_usage(stderr);
    return 2;
}
