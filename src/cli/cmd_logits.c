/* cmd_logits.c — `dsv4 logits`: run token sequences (as one batch) and write
 * float32 little-endian logits, one row of vocab_size per input token, to
 * PREFIX.<i>.f32 for sequence i. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/forward.h"
#include "runtime/batch.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 logits -m DIR --tokens 5,17,42 [--tokens ...] -o PREFIX [--prefill-chunk N] [--threads N]\n"
            "  runs every --tokens sequence (together, as one batch) and writes PREFIX.<i>.f32:\n"
            "  float32 little-endian logits, one row of vocab_size per input token, for sequence i.\n"
            "  --prefill-chunk N  feed each sequence N tokens per step (1 = token-by-token decoding;\n"
            "                     default: the whole sequence in one step)\n"
            "  --threads N        CPU threads (default: all cores); results are identical for any N\n"
            "  --backend cpu|cuda (and --gpu N) the backend that runs the model (default: cpu)\n"
            "  --dump PREFIX      also write every named intermediate of every step (forward.h's list) to\n"
            "                     PREFIX.<step>.<layer>.<name>.f32 and one line per file to PREFIX.index:\n"
            "                     file, name, layer, rows, cols (rows: the step's tokens in batch order)\n");
}

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

int cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *prefix = NULL;
    long long chunk = 0, threads = 0;
    int n_seqs = 0, rc = 1;
    int32_t **toks = calloc((size_t)argc, sizeof *toks);
    int *lens = calloc((size_t)argc, sizeof *lens);
    ds_model *m = NULL;
    ds_seq **seqs = NULL;
    float **logits = NULL;
    ds_err err = {{0}};
    ds_backend_opts bo = {0};
    ds_backend be = {0};
    dumper dump = {NULL, NULL, 0, 0};
    if (!toks || !lens) goto out;
    for (int i = 1, bk; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "-m") && v) {
            dir = v, i++;
        } else if (!strcmp(a, "-o") && v) {
            prefix = v, i++;
        } else if (!strcmp(a, "--tokens") && v) {
            if (cli_parse_tokens("--tokens", v, &toks[n_seqs], &lens[n_seqs])) goto usage_err;
            n_seqs++, i++;
        } else if (!strcmp(a, "--prefill-chunk") && v) {
            if (cli_parse_int(a, v, 1, 1 << 30, &chunk)) goto usage_err;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            if (cli_parse_int(a, v, 1, 1024, &threads)) goto usage_err;
            i++;
        } else if (!strcmp(a, "--dump") && v) {
            dump.prefix = v, i++;
        } else if ((bk = cli_backend_opt("logits", a, v, &bo)) != 0) {
            if (bk < 0) goto usage_err;
            i++;
        } else {
            fprintf(stderr, "dsv4 logits: unknown or incomplete option '%s'\n", a);
            goto usage_err;
        }
    }
    if (!dir || !prefix || !n_seqs) {
        fprintf(stderr, "dsv4 logits: -m, -o and at least one --tokens are required\n");
        goto usage_err;
    }
    if (ds_model_load(dir, &m, &err)) {
        fprintf(stderr, "dsv4 logits: %s\n", err.msg);
        goto out;
    }
    bo.threads = (int)threads;
    if (cli_bind("logits", m, &bo, &be)) goto out;
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
    ds_observer obs = {NULL, dump_tensor, &dump};
    if (ds_run_tokens_observed(m, &be, seqs, (const int32_t *const *)toks, lens, n_seqs, (int)chunk, logits,
                               dump.prefix ? &obs : NULL, &err)) {
        fprintf(stderr, "dsv4 logits: %s\n", err.msg);
        goto out;
    }
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
    goto out;
usage_err:
    usage(stderr);
    rc = 2;
out:
    for (int i = 0; i < n_seqs; i++) {
        free(toks[i]);
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
