/* cmd_generate.c — `dsv4 generate`: continue token ids, greedy or sampled
 * with a seeded counter-based RNG; prints the generated ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/forward.h"
#include "runtime/sampler.h"

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 generate -m DIR --tokens 5,17,42 -n N [--temperature T] [--top-k K] [--top-p P]\n"
               "                     [--min-p P] [--seed S] [--threads N] [--stop ID,...] [--backend cpu|cuda] [--gpu N]\n"
               "  prints the N generated token ids (greedy unless --temperature > 0)\n");
}

int cmd_generate(int argc, char **argv) {
    const char *dir = NULL;
    int32_t *prompt = NULL, *stop = NULL, *hist = NULL;
    int n_prompt = 0, n_stop = 0, rc = 1;
    long long n_gen = 16, threads = 0, topk = 0, seed = 0;
    double temp = 0, top_p = 1, min_p = 0;
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_seq *seq = NULL;
    float *logits = NULL;
    ds_sample_scratch *scr = NULL;
    ds_err err = {{0}};
    ds_backend_opts bo = {0};
    for (int i = 1, bk; i < argc; i += 2) { /* every option but --help takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v) {
            dir = v;
        } else if (!strcmp(a, "--tokens") && v) {
            free(prompt);
            bad = cli_parse_tokens(a, v, &prompt, &n_prompt);
        } else if (!strcmp(a, "--stop") && v) {
            free(stop);
            bad = cli_parse_tokens(a, v, &stop, &n_stop);
        } else if (!strcmp(a, "-n") && v) {
            bad = cli_parse_int(a, v, 0, 1 << 24, &n_gen);
        } else if (!strcmp(a, "--threads") && v) {
            bad = cli_parse_int(a, v, 1, 1024, &threads);
        } else if (!strcmp(a, "--top-k") && v) {
            bad = cli_parse_int(a, v, 0, 1 << 30, &topk);
        } else if (!strcmp(a, "--seed") && v) {
            bad = cli_parse_int(a, v, 0, INT64_MAX, &seed);
        } else if (!strcmp(a, "--temperature") && v) {
            bad = cli_parse_double(a, v, &temp);
        } else if (!strcmp(a, "--top-p") && v) {
            bad = cli_parse_double(a, v, &top_p);
        } else if (!strcmp(a, "--min-p") && v) {
            bad = cli_parse_double(a, v, &min_p);
        } else if ((bk = cli_backend_opt("generate", a, v, &bo)) != 0) {
            bad = bk < 0;
        } else {
            fprintf(stderr, "dsv4 generate: unknown or incomplete option '%s'\n", a);
            bad = 1;
        }
        if (bad) goto usage_err;
    }
    if (!dir || !prompt) {
        fprintf(stderr, "dsv4 generate: -m and --tokens are required\n");
        goto usage_err;
    }
    ds_sampling sp;
    ds_sampling_init(&sp);
    sp.temperature = temp;
    sp.top_k = (int32_t)topk;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = (uint64_t)seed;
    if (ds_sampling_validate(&sp, &err) || ds_model_load(dir, &m, &err)) goto fail;
    bo.threads = (int)threads;
    if (cli_bind("generate", m, &bo, &be)) goto out;
    int V = m->cfg.vocab_size;
    if (n_prompt > m->cfg.max_pos) {
        fprintf(stderr, "dsv4 generate: a prompt of %d tokens is beyond the model's max_position_embeddings (%lld)\n",
                (int)n_prompt, (long long)m->cfg.max_pos);
        goto out;
    }
    if (ds_seq_new(m, n_prompt + n_gen + 1, &seq, &err)) goto fail;
    logits = malloc((size_t)V * sizeof *logits);
    hist = malloc((size_t)(n_prompt + n_gen + 1) * sizeof *hist);
    scr = ds_sample_scratch_create(V, &err);
    if (!logits || !hist || !scr) {
        if (!scr) goto fail;
        fprintf(stderr, "dsv4 generate: out of memory\n");
        goto out;
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    ds_batch_item it = {seq, prompt, n_prompt, logits, 0};
    int n_hist = n_prompt;
    for (long long g = 0; g < n_gen; g++) {
        if (seq->pos + it.n_tokens >= m->cfg.max_pos) { /* the next token's position is beyond the model's */
            fprintf(stderr, "dsv4 generate: stopped at the model's max_position_embeddings (%lld tokens)\n",
                    (long long)m->cfg.max_pos);
            break;
        }
        if (ds_forward(m, &be, &it, 1, &err)) goto fail;
        int32_t tok;
        if (ds_sample(&sp, logits, V, hist, n_hist, seq->pos, scr, &tok, &err)) goto fail;
        printf("%s%d", g ? " " : "", tok);
        fflush(stdout);
        hist[n_hist++] = tok;
        if (ds_stop_check(stop, n_stop, tok)) break;
        it.tokens = &hist[n_hist - 1];
        it.n_tokens = 1;
    }
    printf("\n");
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dsv4 generate: %s\n", err.msg);
    goto out;
usage_err:
    usage(stderr);
    rc = 2;
out:
    free(prompt);
    free(stop);
    free(hist);
    free(logits);
    ds_sample_scratch_free(scr);
    ds_seq_free(seq);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
