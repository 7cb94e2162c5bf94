/* cmd_tokenize.c — `dsv4 tokenize` (text -> ids) and `dsv4 detokenize`
 * (ids -> text). Only tokenizer.json is read from the model directory: no
 * weights are needed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "text/tokenizer.h"

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 tokenize -m DIR (--text S | --file F) [--special MODE] [--stats]\n"
            "\n"
            "Prints the token ids of the exact bytes given (no BOS/EOS added, nothing\n"
            "trimmed), space-separated on one line. Reads only DIR/tokenizer.json\n"
            "(DIR may also be the tokenizer.json file itself).\n"
            "\n"
            "  -m, --model DIR   model directory (or tokenizer.json path)\n"
            "  --text S          the text to encode (the argument's bytes)\n"
            "  --file F          encode the bytes of file F ('-': standard input)\n"
            "  --special MODE    which added tokens in the text become their ids:\n"
            "                      all        every added token, e.g. <｜User｜>, <think>,\n"
            "                                 <｜begin▁of▁sentence｜> (default; as the\n"
            "                                 `tokenizers` library encodes)\n"
            "                      nonspecial only added tokens not marked special\n"
            "                      none       none: the text is only BPE-encoded\n"
            "  --stats           print bytes, tokens and tokens/s to standard error\n"
            "\n"
            "Any bytes are accepted: byte-level BPE encodes invalid UTF-8 too (each run\n"
            "of invalid bytes becomes byte tokens), and detokenize gives the bytes back.\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 detokenize -m DIR --ids \"1 2 3\" [--skip-special] [--lossy]\n"
            "\n"
            "Writes the bytes of the token ids to standard output, exactly, with no\n"
            "newline added. Reads only DIR/tokenizer.json.\n"
            "\n"
            "  -m, --model DIR   model directory (or tokenizer.json path)\n"
            "  --ids LIST        ids separated by spaces, commas or newlines ('-': read\n"
            "                    the list from standard input)\n"
            "  --skip-special    leave out added tokens marked special (e.g. BOS/EOS)\n"
            "  --lossy           replace invalid UTF-8 by U+FFFD (as `tokenizers` decode)\n"
            "\n"
            "An id sequence may decode to bytes that are not valid UTF-8 (a character cut\n"
            "between tokens): by default those bytes are written as they are; --lossy\n"
            "replaces each invalid sequence by U+FFFD. An id out of range or without a\n"
            "token is an error (exit status 1).\n");
}

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
    const char *model = NULL, *text = NULL, *file = NULL, *special = "all";
    int stats = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage(stdout);
            return 0;
        }
        int has_value = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) model = argv[++i];
        else if (!strcmp(a, "--text") && has_value) text = argv[++i];
        else if (!strcmp(a, "--file") && has_value) file = argv[++i];
        else if (!strcmp(a, "--special") && has_value) special = argv[++i];
        else if (!strcmp(a, "--stats")) stats = 1;
        else {
            fprintf(stderr, "dsv4 tokenize: unknown or incomplete option '%s'\n", a);
            tokenize_usage(stderr);
            return 2;
        }
    }
    if (!model || (!text) == (!file)) {
        fprintf(stderr, "dsv4 tokenize: need -m DIR and exactly one of --text / --file\n");
        tokenize_usage(stderr);
        return 2;
    }
    int mode;
    if (!strcmp(special, "all")) mode = DS_TOK_PARSE_ALL;
    else if (!strcmp(special, "nonspecial")) mode = DS_TOK_PARSE_NONSPECIAL;
    else if (!strcmp(special, "none")) mode = DS_TOK_PARSE_NONE;
    else {
        fprintf(stderr, "dsv4 tokenize: --special must be all, nonspecial or none (got '%s')\n", special);
        return 2;
    }
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
    const char *model = NULL, *ids_arg = NULL;
    int flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            detokenize_usage(stdout);
            return 0;
        }
        int has_value = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) model = argv[++i];
        else if (!strcmp(a, "--ids") && has_value) ids_arg = argv[++i];
        else if (!strcmp(a, "--skip-special")) flags |= DS_DECODE_SKIP_SPECIAL;
        else if (!strcmp(a, "--lossy")) flags |= DS_DECODE_LOSSY;
        else {
            fprintf(stderr, "dsv4 detokenize: unknown or incomplete option '%s'\n", a);
            detokenize_usage(stderr);
            return 2;
        }
    }
    if (!model || !ids_arg) {
        fprintf(stderr, "dsv4 detokenize: need -m DIR and --ids LIST\n");
        detokenize_usage(stderr);
        return 2;
    }
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
