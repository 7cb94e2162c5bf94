/* cmd_tokenize.c — `dsv4 tokenize` (text -> ids) and `dsv4 detokenize`
 * (ids -> text). Only tokenizer.json is read from the model directory: no
 * weights are needed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/util.h"
#include "text/tokenizer.h"

typedef struct {
    const char *model, *text, *file;
    int special, stats;
} tokenize_args;

static const char *const SPECIAL_MODES[] = {"all", "nonspecial", "none", NULL};

static const cli_opt tokenize_opts[] = {
    CLI_STRING_OPT("--model", "-m", tokenize_args, model, "DIR", "model directory (or tokenizer.json path); required"),
    CLI_STRING_OPT("--text", NULL, tokenize_args, text, "S", "the text to encode (the argument's bytes)"),
    CLI_STRING_OPT("--file", NULL, tokenize_args, file, "F", "encode the bytes of file F ('-': standard input)"),
    CLI_CHOICE_OPT("--special", NULL, tokenize_args, special, SPECIAL_MODES,
                   "which added tokens in the text become their ids:\n"
                   "all        every added token, e.g. <｜User｜>, <think>,\n"
                   "           <｜begin▁of▁sentence｜> (default; as the\n"
                   "           `tokenizers` library encodes)\n"
                   "nonspecial only added tokens not marked special\n"
                   "none       none: the text is only BPE-encoded"),
    CLI_FLAG_OPT("--stats", NULL, tokenize_args, stats, "print bytes, tokens and tokens/s to standard error"),
    CLI_END,
};

typedef struct {
    const char *model, *ids;
    int skip_special, lossy;
} detokenize_args;

static const cli_opt detokenize_opts[] = {
    CLI_STRING_OPT("--model", "-m", detokenize_args, model, "DIR", "model directory (or tokenizer.json path); required"),
    CLI_STRING_OPT("--ids", NULL, detokenize_args, ids, "LIST",
                   "ids separated by spaces, commas or newlines ('-': read the list from standard input); required"),
    CLI_FLAG_OPT("--skip-special", NULL, detokenize_args, skip_special,
                 "leave out added tokens marked special (e.g. BOS/EOS)"),
    CLI_FLAG_OPT("--lossy", NULL, detokenize_args, lossy, "replace invalid UTF-8 by U+FFFD (as `tokenizers` decode)"),
    CLI_END,
};

static int write_ids(const int32_t *ids, size_t n) {
    char buf[1 << 16];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (o > sizeof buf - 16) {
            if (fwrite(buf, 1, o, stdout) != o) return -1;
            o = 0;
        }
        o += (size_t)snprintf(buf + o, sizeof buf - o, i ? " %d" : "%d", (int)ids[i]);
    }
    buf[o++] = '\n';
    if (fwrite(buf, 1, o, stdout) != o) return -1;
    return fflush(stdout);
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_args ta = {0};
    const cli_group groups[] = {{NULL, tokenize_opts, &ta}};
    const cli_cmd cmd = {"tokenize", "-m DIR (--text S | --file F) [--special MODE] [--stats]",
                         "Prints the token ids of the exact bytes given (no BOS/EOS added, nothing\n"
                         "trimmed), space-separated on one line. Reads only DIR/tokenizer.json\n"
                         "(DIR may also be the tokenizer.json file itself).\n",
                         "Any bytes are accepted: byte-level BPE encodes invalid UTF-8 too (each run\n"
                         "of invalid bytes becomes byte tokens), and detokenize gives the bytes back.\n",
                         groups, 1};
    int crc;
    if (cli_parse(&cmd, argc, argv, &crc)) return crc;
    const char *model = ta.model, *text = ta.text, *file = ta.file;
    int stats = ta.stats;
    if (!model || (!text) == (!file)) return cli_usage_error(&cmd, "need -m DIR and exactly one of --text / --file");
    static const int modes[] = {DS_TOK_PARSE_ALL, DS_TOK_PARSE_NONSPECIAL, DS_TOK_PARSE_NONE};
    int mode = modes[ta.special];
    ds_err err = {{0}};
    ds_tokenizer *tok;
    double t0 = ds_now();
    if (ds_tokenizer_load(model, &tok, &err)) {
        fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
        return 1;
    }
    double t1 = ds_now();
    size_t n;
    char *owned = NULL;
    if (file) {
        owned = cli_read_file("tokenize", file, &n);
        if (!owned) {
            ds_tokenizer_free(tok);
            return 1;
        }
        text = owned;
    } else {
        n = strlen(text);
    }
    int32_t *ids;
    size_t n_ids;
    double t2 = ds_now();
    int rc = ds_tokenizer_encode(tok, text, n, mode, &ids, &n_ids, &err);
    double t3 = ds_now();
    if (rc) {
        fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
    } else {
        if (write_ids(ids, n_ids)) {
            fprintf(stderr, "dsv4 tokenize: write error\n");
            rc = -1;
        }
        if (stats) {
            double dt = t3 - t2 > 1e-9 ? t3 - t2 : 1e-9;
            fprintf(stderr, "load %.3f s; %zu bytes -> %zu tokens in %.3f s: %.0f tokens/s, %.1f MB/s\n", t1 - t0, n,
                    n_ids, dt, (double)n_ids / dt, (double)n / dt / 1e6);
        }
        free(ids);
    }
    free(owned);
    ds_tokenizer_free(tok);
    return rc ? 1 : 0;
}

/* Parses "1 2, 3\n4" into ids; returns -1 with a message on a bad entry. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 64, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX ||
            (*end && *end != ' ' && *end != ',' && *end != '\n' && *end != '\t' && *end != '\r')) {
            const char *e = p;
            while (*e && *e != ' ' && *e != ',' && *e != '\n') e++;
            fprintf(stderr, "dsv4 detokenize: bad id '%.*s' (ids are integers separated by spaces or commas)\n",
                    (int)(e - p > 40 ? 40 : e - p), p);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof *nv);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    detokenize_args da = {0};
    const cli_group groups[] = {{NULL, detokenize_opts, &da}};
    const cli_cmd cmd = {"detokenize", "-m DIR --ids \"1 2 3\" [--skip-special] [--lossy]",
                         "Writes the bytes of the token ids to standard output, exactly, with no\n"
                         "newline added. Reads only DIR/tokenizer.json.\n",
                         "An id sequence may decode to bytes that are not valid UTF-8 (a character cut\n"
                         "between tokens): by default those bytes are written as they are; --lossy\n"
                         "replaces each invalid sequence by U+FFFD. An id out of range or without a\n"
                         "token is an error (exit status 1).\n",
                         groups, 1};
    int crc;
    if (cli_parse(&cmd, argc, argv, &crc)) return crc;
    const char *model = da.model, *ids_arg = da.ids;
    int flags = (da.skip_special ? DS_DECODE_SKIP_SPECIAL : 0) | (da.lossy ? DS_DECODE_LOSSY : 0);
    if (!model || !ids_arg) return cli_usage_error(&cmd, "need -m DIR and --ids LIST");
    char *owned = NULL;
    if (!strcmp(ids_arg, "-")) {
        size_t n;
        owned = cli_read_file("detokenize", "-", &n);
        if (!owned) return 1;
        if (strlen(owned) != n) {
            fprintf(stderr, "dsv4 detokenize: standard input holds a NUL byte\n");
            free(owned);
            return 2;
        }
        ids_arg = owned;
    }
    int32_t *ids;
    size_t n_ids;
    int prc = parse_ids(ids_arg, &ids, &n_ids);
    free(owned);
    if (prc) return 2;
    ds_err err = {{0}};
    ds_tokenizer *tok;
    if (ds_tokenizer_load(model, &tok, &err)) {
        fprintf(stderr, "dsv4 detokenize: %s\n", err.msg);
        free(ids);
        return 1;
    }
    char *out;
    size_t out_n;
    int rc = ds_tokenizer_decode(tok, ids, n_ids, flags, &out, &out_n, &err);
    if (rc) {
        fprintf(stderr, "dsv4 detokenize: %s\n", err.msg);
    } else {
        if (fwrite(out, 1, out_n, stdout) != out_n || fflush(stdout)) {
            fprintf(stderr, "dsv4 detokenize: write error\n");
            rc = -1;
        }
        free(out);
    }
    free(ids);
    ds_tokenizer_free(tok);
    return rc ? 1 : 0;
}
