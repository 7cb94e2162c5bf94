/* cmd_bench_grammar.c — dsv4 bench --grammar: the cost per token of a JSON
 * schema's token mask (text/grammar.h) on a model's vocabulary, on one core. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/util.h"
#include "common/clock.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

typedef struct {
    const char *dir, *schema;
    long long tokens, seed;
} grammar_args;

static const cli_opt grammar_opts[] = {
    CLI_STRING_OPT("--model", "-m", grammar_args, dir, "DIR", "whose tokenizer (default: the bundled model)"),
    CLI_STRING_OPT("--grammar", NULL, grammar_args, schema, "SCHEMA.json", "the JSON schema; required"),
    CLI_LONG_OPT("--tokens", NULL, grammar_args, tokens, 1, 1 << 24, "N", "masks to time (default 2000)"),
    CLI_LONG_OPT("--seed", NULL, grammar_args, seed, 0, 1LL << 31, "S", "the walk's random choices (default 1)"),
    CLI_END,
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_bench_grammar(int argc, char **argv) {
    grammar_args ga = {.tokens = 2000, .seed = 1};
    const cli_group groups[] = {{NULL, grammar_opts, &ga}};
    const cli_cmd cmd = {"bench --grammar",
                         "--grammar SCHEMA.json [-m DIR] [--tokens N] [--seed S]",
                         "Times the token mask of a JSON schema (what response_format json_schema and tool calls\n"
                         "compute before each draw) over the model's vocabulary, on one core: a random walk\n"
                         "through valid outputs (each step one allowed token drawn at random; a finished value\n"
                         "starts the next), N masks. Prints the vocabulary trie's build time and the mask's\n"
                         "mean, median and worst microseconds per token.\n",
                         NULL,
                         groups,
                         1};
    int crc;
    if (cli_parse(&cmd, argc, argv, &crc)) return crc;
    if (!ga.schema) return cli_usage_error(&cmd, "--grammar SCHEMA.json is required");
    char dir[4096];
    if (cli_model_dir("bench --grammar", ga.dir, dir, sizeof dir)) return 1;
    ds_err err = {{0}};
    ds_tokenizer *tok = NULL;
    if (ds_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "dsv4 bench --grammar: %s\n", err.msg);
        return 1;
    }
    ds_grammar *g = NULL;
    ds_vocab_trie *t = NULL;
    double t0 = ds_now();
    if (cli_load_schema("bench --grammar", ga.schema, tok, &g, &t)) {
        ds_tokenizer_free(tok);
        return 1;
    }
    double t_trie = ds_now() - t0;
    int V = ds_vocab_trie_vocab(t), rc = 1, eos = ds_tokenizer_eos_id(tok), values = 0;
    int N = (int)ga.tokens;
    uint64_t *allowed = calloc(((size_t)V + 63) / 64, sizeof *allowed);
    double *us = malloc(sizeof *us * (size_t)N);
    ds_mask_scratch *ms = ds_mask_scratch_new(t);
    ds_gstate *s = ds_gstate_new(g);
    if (!allowed || !us || !ms || !s) {
        fprintf(stderr, "dsv4 bench --grammar: out of memory\n");
        goto out;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)ga.seed;
    size_t tlen = 0, tcap = 4096; /* the current value's text, for an error */
    char *text = malloc(tcap);
    if (!text) goto out;
    for (int i = 0; i < N; i++) {
        double a = ds_now();
        int n = ds_grammar_mask(t, s, ms, allowed);
        us[i] = (ds_now() - a) * 1e6;
        if (n <= 0) {
            fprintf(stderr,
                    "dsv4 bench --grammar: %s: no token can continue the valid text '%.*s' (step %d; its last "
                    "bytes",
                    ga.schema, (int)tlen, text, i);
            for (size_t j = tlen > 4 ? tlen - 4 : 0; j < tlen; j++) fprintf(stderr, " %02x", (unsigned char)text[j]);
            fprintf(stderr, ")\n");
            free(text);
            goto out;
        }
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % (uint64_t)n), id = -1;
        for (int w = 0; w < (V + 63) / 64 && id < 0; w++) {
            int c = __builtin_popcountll(allowed[w]);
            if (k >= c) {
                k -= c;
                continue;
            }
            uint64_t b = allowed[w];
            for (; k > 0; k--) b &= b - 1;
            id = 64 * w + __builtin_ctzll(b);
        }
        if (id == eos) { /* a value complete: the next one */
            values++, tlen = 0;
            ds_gstate_reset(s);
        } else if (id < 0 || ds_grammar_accept(t, s, id)) {
            fprintf(stderr, "dsv4 bench --grammar: token %d from the mask was not accepted (step %d)\n", id, i);
            free(text);
            goto out;
        } else {
            size_t nb = 0;
            const char *b = ds_tokenizer_token_bytes(tok, id, &nb);
            if (b && tlen + nb >= tcap) tlen = 0; /* keep the tail only */
            if (b && nb < tcap) memcpy(text + tlen, b, nb), tlen += nb;
        }
    }
    free(text);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += us[i];
    qsort(us, (size_t)N, sizeof *us, cmp_d);
    printf("grammar    %s: vocabulary %d tokens (%s), trie built in %.1f ms\n", ga.schema, V, dir, t_trie * 1e3);
    printf("mask       %d tokens (%d values completed): mean %.1f us/token, median %.1f, worst %.1f (one core); "
           "%.0f masks/s\n",
           N, values, sum / N, us[N / 2], us[N - 1], N / (sum * 1e-6));
    rc = 0;
out:
    ds_gstate_free(s);
    ds_mask_scratch_free(ms);
    free(us);
    free(allowed);
    ds_grammar_free(g);
    ds_vocab_trie_free(t);
    ds_tokenizer_free(tok);
    return rc;
}
