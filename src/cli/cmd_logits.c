/* cmd_logits.c — `dsv4 logits`: run token sequences (as one batch) and write
 * float32 little-endian logits, one row of vocab_size per input token, to
 * PREFIX.<i>.f32 for sequence i; with --mtp also the MTP block's logits
 * (deepseek-v4.md §3.7) to PREFIX.<i>.mtp.f32, for tools/mtp_reference.py. */
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

/* The MTP block's logits of each sequence (alone, whole): the model's streams
 * of every token (ds_batch_item.hidden), then the block over tokens 1..n-1
 * with the streams of tokens 0..n-2 (h_in). */
static int write_mtp_logits(const ds_model *m, const ds_backend *be, const int32_t *const *toks, const int *lens,
                            int n_seqs, const char *prefix) {
    if (!m->mtp_model) {
        fprintf(stderr, "dsv4 logits: --mtp: the MTP block is not bound (%s)\n",
                m->mtp ? "not under expert parallelism" : m->mtp_off);
        return -1;
    }
    size_t V = (size_t)m->cfg.vocab_size, H = (size_t)m->cfg.hc_mult * (size_t)m->cfg.dim;
    for (int i = 0; i < n_seqs; i++) {
        size_t n = (size_t)lens[i];
        if (n < 2) {
            fprintf(stderr, "dsv4 logits: --mtp: sequence %d has %zu token; the block needs at least 2\n", i, n);
            return -1;
        }
        ds_err err = {{0}};
        ds_seq *s = NULL, *b = NULL;
        float *hid = malloc(n * H * sizeof *hid), *lg = malloc((n - 1) * V * sizeof *lg);
        int rc = !hid || !lg;
        if (rc) snprintf(err.msg, sizeof err.msg, "out of memory for sequence %d's streams and block logits", i);
        rc = rc || ds_seq_new(m, (int64_t)n, &s, &err) || ds_seq_new(m->mtp_model, (int64_t)n, &b, &err);
        if (!rc) {
            ds_batch_item main = {s, toks[i], (int)n, NULL, 0, hid, NULL};
            ds_batch_item blk = {b, toks[i] + 1, (int)n - 1, lg, 1, NULL, hid};
            rc = ds_forward(m, be, &main, 1, &err) || ds_forward(m->mtp_model, be, &blk, 1, &err);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s.%d.mtp.f32", prefix, i);
        FILE *f = rc ? NULL : fopen(path, "wb");
        size_t nw = f ? fwrite(lg, sizeof(float), (n - 1) * V, f) : 0;
        int closed = f ? fclose(f) : EOF;
        ds_seq_free(s);
        ds_seq_free(b);
        free(hid);
        free(lg);
        if (rc) {
            fprintf(stderr, "dsv4 logits: --mtp: sequence %d: %s\n", i, err.msg);
            return -1;
        }
        if (!f || nw != (n - 1) * V || closed != 0) {
            fprintf(stderr, "dsv4 logits: cannot write %s\n", path);
            return -1;
        }
    }
    return 0;
}

typedef struct {
    const char *prefix, *dump;
    cli_ids_list tokens;
    long long chunk;
    int mtp;
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
    CLI_FLAG_OPT("--mtp", NULL, logits_args, mtp,
                 "also write PREFIX.<i>.mtp.f32: the MTP block's logits, n - 1 rows for a sequence of n tokens, row p "
                 "predicting token p + 2 from the model's streams at p and token p + 1 (each sequence alone and "
                 "whole; tools/mtp_reference.py computes the same rows)"),
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
                         "[--dump DPREFIX] [--mtp]",
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
    if (la.mtp && !m->mtp) {
        fprintf(stderr, "dsv4 logits: --mtp: %s has no MTP block (%s)\n", dir, m->mtp_off);
        goto out;
    }
    m->bind_mtp = la.mtp;
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
    if (la.mtp && write_mtp_logits(m, &be, (const int32_t *const *)toks, lens, n_seqs, prefix)) goto out;
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
