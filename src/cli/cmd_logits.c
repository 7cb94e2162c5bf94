/* cmd_logits.c — `dsv4 logits`: run token sequences (as one batch) and write
 * float32 little-endian logits, one row of vocab_size per input token, to
 * PREFIX.<i>.f32 for sequence i. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "ep/ep.h"
#include "cli/util.h"
#include "model/forward.h"
#include "runtime/batch.h"

/* --dump: each intermediate to its own file, listed in PREFIX.index */
typedef struct {
    const char *prefix;
    FILE *index;
    int step, failed;
} dumper;

static void dump_tensor(void *ctx, const char *name, int layer, const float *x, int rows, int cols) {
    dumper *d = ctx;
    if (!strcmp(name, "embed")) d->step++;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d.%d.%s.f32", d->prefix, d->step - 1, layer, name);
    FILE *f = fopen(path, "wb");
    size_t n = (size_t)rows * (size_t)cols;
    if (!f || fwrite(x, sizeof *x, n, f) != n || fclose(f)) {
        d->failed = 1;
        return;
    }
    if (fprintf(d->index, "%s %s %d %d %d\n", path, name, layer, rows, cols) < 0) d->failed = 1;
}

typedef struct {
    const char *prefix, *dump;
    cli_ids_list tokens;
    long long chunk;
} logits_args;

static const cli_opt logits_opts[] = {
    CLI_IDS_LIST_OPT("--tokens", NULL, logits_args, tokens, 0, INT32_MAX, "5,17,42",
                     "one sequence of token ids (at least one; all run together, as one batch)"),
    CLI_STRING_OPT("-o", NULL, logits_args, prefix, "PREFIX",
                   "write PREFIX.<i>.f32: float32 little-endian logits, one row of vocab_size per input token, for "
                   "sequence i; required"),
    CLI_LONG_OPT("--prefill-chunk", NULL, logits_args, chunk, 1, 1 << 30, "N",
                 "feed each sequence N tokens per step (1 = token-by-token decoding; default: the whole sequence in "
                 "one step)"),
    CLI_STRING_OPT("--dump", NULL, logits_args, dump, "DPREFIX",
                   "also write every named intermediate of every step (forward.h's list) to "
                   "DPREFIX.<step>.<layer>.<name>.f32 and one line per file to DPREFIX.index: file, name, layer, rows, "
                   "cols (rows: the step's tokens in batch order)"),
    CLI_END,
};

int cmd_logits(int argc, char **argv) {
    logits_args la = {0};
    cli_model_arg ma = {0};
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_req_opts, &ma},
                                {NULL, logits_opts, &la},
                                {"backend", cli_threads_opts, &bo},
                                {"backend", cli_load_opts, &bo},
                                {CLI_TIER_TITLE, cli_tier_opts, &bo},
                                {"backend", cli_backend_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"logits",
                         "-m DIR --tokens 5,17,42 [--tokens ...] -o PREFIX [--prefill-chunk N] [--threads N] "
                         "[--dump DPREFIX]",
                         NULL, NULL, groups, (int)(sizeof groups / sizeof groups[0])};
    int rc = 1;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    if (!ma.dir || !la.prefix || !la.tokens.n) {
        cli_free(&cmd);
        return cli_usage_error(&cmd, "-m, -o and at least one --tokens are required");
    }
    const char *dir = ma.dir, *prefix = la.prefix;
    long long chunk = la.chunk;
    int n_seqs = la.tokens.n;
    int32_t **toks = calloc((size_t)n_seqs, sizeof *toks);
    int *lens = calloc((size_t)n_seqs, sizeof *lens);
    ds_model *m = NULL;
    ds_seq **seqs = NULL;
    float **logits = NULL;
    ds_err err = {{0}};
    ds_backend be = {0};
    dumper dump = {la.dump, NULL, 0, 0};
    if (!toks || !lens) goto out;
    for (int i = 0; i < n_seqs; i++) toks[i] = la.tokens.v[i].v, lens[i] = la.tokens.v[i].n;
    if (cli_load_model("logits", dir, &bo, &m)) goto out;
    int brc = cli_bind("logits", m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    int V = m->cfg.vocab_size;
    seqs = calloc((size_t)n_seqs, sizeof *seqs);
    logits = calloc((size_t)n_seqs, sizeof *logits);
    if (!seqs || !logits) goto out;
    for (int i = 0; i < n_seqs; i++) {
        if (lens[i] > m->cfg.max_pos) {
            fprintf(stderr, "dsv4 logits: sequence %d: %d tokens are beyond the model's max_position_embeddings (%lld)\n",
                    i, lens[i], (long long)m->cfg.max_pos);
            goto out;
        }
        if (ds_seq_new(m, lens[i], &seqs[i], &err)) {
            fprintf(stderr, "dsv4 logits: %s\n", err.msg);
            goto out;
        }
        logits[i] = malloc((size_t)lens[i] * V * sizeof(float));
        if (!logits[i]) {
            fprintf(stderr, "dsv4 logits: out of memory for the logits of sequence %d\n", i);
            goto out;
        }
    }
    if (dump.prefix) {
        char path[4096];
        snprintf(path, sizeof path, "%s.index", dump.prefix);
        if (!(dump.index = fopen(path, "w"))) {
            fprintf(stderr, "dsv4 logits: cannot write %s\n", path);
            goto out;
        }
    }
    ds_observer obs = {NULL, dump_tensor, &dump, NULL};
    if (ds_run_tokens_observed(m, &be, seqs, (const int32_t *const *)toks, lens, n_seqs, (int)chunk, logits,
                               dump.prefix ? &obs : NULL, &err)) {
        fprintf(stderr, "dsv4 logits: %s\n", err.msg);
        goto out;
    }
    cli_tiers_report(stderr, "dsv4 logits: expert tiers: ", m, 0);
    for (int i = 0; i < n_seqs; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d.f32", prefix, i);
        FILE *f = fopen(path, "wb");
        size_t nw = f ? fwrite(logits[i], sizeof(float), (size_t)lens[i] * V, f) : 0;
        int closed = f ? fclose(f) : EOF;
        if (!f || nw != (size_t)lens[i] * V || closed != 0) {
            fprintf(stderr, "dsv4 logits: cannot write %s\n", path);
            goto out;
        }
    }
    if (dump.index && (dump.failed || fclose(dump.index))) {
        dump.index = NULL;
        fprintf(stderr, "dsv4 logits: cannot write the intermediates to %s.*\n", dump.prefix);
        goto out;
    }
    dump.index = NULL;
    rc = 0;
out:
    cli_free(&cmd); /* the --tokens lists */
    for (int i = 0; i < n_seqs; i++) {
        if (seqs) ds_seq_free(seqs[i]);
        if (logits) free(logits[i]);
    }
    free(toks);
    free(lens);
    free(seqs);
    free(logits);
    if (dump.index) fclose(dump.index);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
