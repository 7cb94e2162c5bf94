/* opts.c — the table-driven option parser of every dsv4 command (opts.h). */
#include "cli/opts.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"
#include "runtime/backend_select.h"
#include "runtime/sampler.h"

/* ------------------------------------------------------------ shared groups */

#define SYNTH_OPT                                                                                                      \
    CLI_STRING_OPT("--synth", NULL, cli_model_arg, synth, "NAME[:LAYERS]",                                             \
                   "instead of -m: the random-weight model `dsv4 synth --like NAME --layers LAYERS` writes, built in " \
                   "memory (flash, pro, tiny; the same as -m synth:NAME[:LAYERS]; under mpirun each rank builds only " \
                   "its share; docs/ep.md)")

const cli_opt cli_model_opts[] = {
    CLI_STRING_OPT("--model", "-m", cli_model_arg, dir, "DIR",
                   "model directory (config.json, the safetensors, tokenizer.json); default: $DSV4_MODEL, else "
                   "./models/kjv, else <dir of dsv4>/../models/kjv"),
    SYNTH_OPT,
    CLI_END,
};

const cli_opt cli_model_req_opts[] = {
    CLI_STRING_OPT("--model", "-m", cli_model_arg, dir, "DIR",
                   "model directory (config.json, model.safetensors[.index.json] and shards): required"),
    SYNTH_OPT,
    CLI_END,
};

const cli_opt cli_backend_opts[] = {
    CLI_STRING_OPT("--backend", NULL, ds_backend_opts, name, "NAME",
                   "compute backend: cpu (default) or cuda (builds with the CUDA backend; dsv4 info lists them)"),
    CLI_INT_OPT("--gpu", NULL, ds_backend_opts, gpu, 0, 1024, "N",
                "CUDA device (default 0; under mpirun a host's rank r drives GPU (N + r) mod the GPUs present)"),
    CLI_END,
};

static const char *const EP_ATTENTION[] = {"dp", "replicated", NULL}; /* DS_EP_ATT_* */

const cli_opt cli_ep_opts[] = {
    CLI_STRING_OPT("--placement", NULL, ds_ep_opts, placement, "FILE",
                   "which rank serves each routed expert (default: expert e on rank e % ranks)"),
    CLI_STRING_OPT("--expert-load", NULL, ds_ep_opts, load, "FILE",
                   "place experts by measured load (written by dsv4 stats --load-out): the ranks' experts under "
                   "mpirun, the resident slots with --gpu-mem / --expert-slots"),
    CLI_INT_OPT("--redundant-experts", NULL, ds_ep_opts, redundant, 0, 1 << 20, "N",
                "extra replicas per layer of the busiest experts (needs --expert-load)"),
    CLI_CHOICE_OPT("--ep-attention", NULL, ds_ep_opts, attention, EP_ATTENTION,
                   "under mpirun, who runs a sequence's attention: dp (default: its home rank only, the sequences "
                   "spread over the ranks) or replicated (every rank, for every sequence); the same bits either way"),
    CLI_END,
};

static const char *const LOAD_MODES[] = {"auto", "copy", "mmap", NULL}; /* CLI_LOAD_* */

const cli_opt cli_threads_opts[] = {
    CLI_INT_OPT("--threads", NULL, ds_backend_opts, threads, 0, 1024, "N",
                "CPU threads (default / 0: all cores); results are the same for any N"),
    CLI_END,
};

const cli_opt cli_load_opts[] = {
    CLI_CHOICE_OPT("--load", NULL, ds_backend_opts, load, LOAD_MODES,
                   "how the CPU gets the weights: copy (into huge-page memory, page cache dropped behind the read: "
                   "streams at DRAM speed where file mappings use 4 KiB pages), mmap (in place), auto (default: copy "
                   "on the CPU backend of one process when the model fits in available memory, else mmap); the "
                   "same bits in every mode"),
    CLI_END,
};

static const char *const TIER_PATHS[] = {"auto", "copy", "cpu", "mixed", NULL}; /* DS_STORE_* */

const cli_opt cli_tier_opts[] = {
    CLI_DOUBLE_OPT("--gpu-mem", NULL, ds_backend_opts, gpu_mem, "GB",
                   "keep the routed experts in tiers: the dense weights and as many expert slots as fit GB on the "
                   "backend, the other experts in host memory (the most loaded experts by --expert-load hold slots); "
                   "the same bits as all experts on the backend (docs/tiers.md)"),
    CLI_LONG_OPT("--expert-slots", NULL, ds_backend_opts, expert_slots, 1, 1LL << 40, "N",
                 "expert tiers with N slots (at most what --gpu-mem holds, when given)"),
    CLI_CHOICE_OPT("--tier-path", NULL, ds_backend_opts, tier_path, TIER_PATHS,
                   "how an expert without a slot is served: auto (default: copied into a staging slot or computed on "
                   "the CPU, whichever the cost model finishes first), copy, cpu, or mixed (even expert ids copied, "
                   "odd ones on the CPU)"),
    CLI_END,
};

const cli_opt cli_sampling_opts[] = {
    CLI_DOUBLE_OPT("--temperature", NULL, ds_sampling, temperature, "T",
                   "0 = greedy (default); > 0 samples with a counter-based RNG"),
    CLI_INT_OPT("--top-k", NULL, ds_sampling, top_k, 0, INT32_MAX, "K", "keep the K most likely tokens (0 = off)"),
    CLI_DOUBLE_OPT("--top-p", NULL, ds_sampling, top_p, "P",
                   "nucleus: the smallest set with probability >= P (1 = off)"),
    CLI_DOUBLE_OPT("--min-p", NULL, ds_sampling, min_p, "P",
                   "drop tokens less likely than P x the most likely (0 = off)"),
    CLI_DOUBLE_OPT("--repeat-penalty", NULL, ds_sampling, repetition_penalty, "R",
                   "HF repetition penalty over prompt + generated tokens (1 = off)"),
    CLI_DOUBLE_OPT("--presence-penalty", NULL, ds_sampling, presence_penalty, "X", "OpenAI presence penalty (0 = off)"),
    CLI_DOUBLE_OPT("--frequency-penalty", NULL, ds_sampling, frequency_penalty, "X",
                   "OpenAI frequency penalty (0 = off)"),
    CLI_U64_OPT("--seed", NULL, ds_sampling, seed, 0, INT64_MAX, "S", "RNG seed: the same seed gives the same text"),
    CLI_END,
};

/* ------------------------------------------------------------------ parsing */

#define CLI_MAX_OPTS 128

static void synopsis(const cli_cmd *c, FILE *f) {
    fprintf(f, "usage: dsv4 %s %s\n       (dsv4 %s --help: every option)\n", c->name,
            c->synopsis ? c->synopsis : "[options]", c->name);
}

static int fail(const cli_cmd *c, const char *opt, size_t opt_n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(const cli_cmd *c, const char *opt, size_t opt_n, const char *fmt, ...) {
    fprintf(stderr, "dsv4 %s: %.*s: ", c->name, (int)opt_n, opt);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    synopsis(c, stderr);
    return -1;
}

int cli_usage_error(const cli_cmd *c, const char *fmt, ...) {
    fprintf(stderr, "dsv4 %s: ", c->name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    synopsis(c, stderr);
    return 2;
}

static int spelled(const char *s, const char *a, size_t n) { return s && strlen(s) == n && !memcmp(s, a, n); }

/* A list of integers in [lo, hi] separated by commas or blanks; 0, or -1 with
 * the message printed. */
static int parse_ids(const cli_cmd *c, const char *opt, size_t on, const char *s, long long lo, long long hi,
                     cli_ids *out) {
    int cap = 16, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return fail(c, opt, on, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            free(v);
            return fail(c, opt, on, "'%s' is not a list of integers separated by commas", s);
        }
        if (errno || x < lo || x > hi) {
            free(v);
            return fail(c, opt, on, "'%.*s' is out of range [%lld, %lld]", (int)(end - p), p, lo, hi);
        }
        if (n == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                return fail(c, opt, on, "out of memory");
            }
            v = nv;
        }
        v[n++] = (int32_t)x;
        p = end;
    }
    if (!n) {
        free(v);
        return fail(c, opt, on, "empty list");
    }
    out->v = v;
    out->n = n;
    return 0;
}

static int parse_int(const cli_cmd *c, const char *opt, size_t on, const char *s, long long lo, long long hi,
                     long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end) return fail(c, opt, on, "'%s' is not an integer", s);
    if (errno || x < lo || x > hi) return fail(c, opt, on, "'%s' is out of range [%lld, %lld]", s, lo, hi);
    *out = x;
    return 0;
}

/* Stores value v of option o (spelled opt[0..on)) in dst. */
static int store(const cli_cmd *c, const cli_opt *o, const char *opt, size_t on, const char *v, char *dst) {
    long long x;
    switch (o->kind) {
    case CLI_FLAG: *(int *)(void *)dst = 1; return 0;
    case CLI_INT:
        if (parse_int(c, opt, on, v, o->lo, o->hi, &x)) return -1;
        *(int *)(void *)dst = (int)x;
        return 0;
    case CLI_LONG:
        if (parse_int(c, opt, on, v, o->lo, o->hi, &x)) return -1;
        *(long long *)(void *)dst = x;
        return 0;
    case CLI_U64:
        if (parse_int(c, opt, on, v, o->lo, o->hi, &x)) return -1;
        *(uint64_t *)(void *)dst = (uint64_t)x;
        return 0;
    case CLI_DOUBLE: {
        char *end;
        errno = 0;
        double d = strtod(v, &end);
        if (end == v || *end || isnan(d)) return fail(c, opt, on, "'%s' is not a number", v);
        if (errno) return fail(c, opt, on, "'%s' is out of the range of a double", v);
        *(double *)(void *)dst = d;
        return 0;
    }
    case CLI_STRING: *(const char **)(void *)dst = v; return 0;
    case CLI_CHOICE:
        for (int k = 0; o->choices[k]; k++)
            if (!strcmp(v, o->choices[k])) {
                *(int *)(void *)dst = k;
                return 0;
            }
        fprintf(stderr, "dsv4 %s: %.*s: '%s' is not one of ", c->name, (int)on, opt, v);
        for (int k = 0; o->choices[k]; k++) fprintf(stderr, "%s%s", k ? ", " : "", o->choices[k]);
        fputc('\n', stderr);
        synopsis(c, stderr);
        return -1;
    case CLI_IDS: return parse_ids(c, opt, on, v, o->lo, o->hi, (cli_ids *)(void *)dst);
    case CLI_STRINGS: {
        cli_strs *s = (cli_strs *)(void *)dst;
        const char **nv = realloc(s->v, (size_t)(s->n + 1) * sizeof *nv);
        if (!nv) return fail(c, opt, on, "out of memory");
        s->v = nv;
        s->v[s->n++] = v;
        return 0;
    }
    case CLI_IDS_LIST: {
        cli_ids_list *l = (cli_ids_list *)(void *)dst;
        cli_ids *nv = realloc(l->v, (size_t)(l->n + 1) * sizeof *nv);
        if (!nv) return fail(c, opt, on, "out of memory");
        l->v = nv;
        if (parse_ids(c, opt, on, v, o->lo, o->hi, &l->v[l->n])) return -1;
        l->n++;
        return 0;
    }
    }
    return fail(c, opt, on, "unknown option kind %d", (int)o->kind);
}

void cli_free(const cli_cmd *c) {
    for (int g = 0; g < c->n_groups; g++)
        for (const cli_opt *o = c->groups[g].opts; o->name; o++) {
            char *dst = (char *)c->groups[g].dst + o->off;
            if (o->kind == CLI_IDS) {
                cli_ids *d = (cli_ids *)(void *)dst;
                free(d->v);
                d->v = NULL;
                d->n = 0;
            } else if (o->kind == CLI_STRINGS) {
                cli_strs *d = (cli_strs *)(void *)dst;
                free(d->v);
                d->v = NULL;
                d->n = 0;
            } else if (o->kind == CLI_IDS_LIST) {
                cli_ids_list *d = (cli_ids_list *)(void *)dst;
                for (int i = 0; i < d->n; i++) free(d->v[i].v);
                free(d->v);
                d->v = NULL;
                d->n = 0;
            }
        }
}

int cli_parse(const cli_cmd *c, int argc, char **argv, int *rc) {
    unsigned char seen[CLI_MAX_OPTS];
    memset(seen, 0, sizeof seen);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_help(c, stdout);
            cli_free(c);
            *rc = 0;
            return 1;
        }
        /* --name=value */
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        size_t an = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = NULL;
        char *dst = NULL;
        int idx = 0; /* the option's index over all groups: its slot in seen[] */
        for (int g = 0; g < c->n_groups && !o; g++)
            for (const cli_opt *p = c->groups[g].opts; p->name; p++, idx++)
                if (spelled(p->name, a, an) || spelled(p->alias, a, an)) {
                    o = p;
                    dst = (char *)c->groups[g].dst + p->off;
                    break;
                }
        if (!o) {
            fail(c, a, an, "unknown option");
            goto err;
        }
        if (idx >= CLI_MAX_OPTS) {
            fail(c, a, an, "the command has more than %d options (CLI_MAX_OPTS)", CLI_MAX_OPTS);
            goto err;
        }
        if (seen[idx] && o->kind != CLI_STRINGS && o->kind != CLI_IDS_LIST) {
            fail(c, a, an, "given twice");
            goto err;
        }
        seen[idx] = 1;
        const char *v = NULL;
        if (o->kind == CLI_FLAG) {
            if (eq) {
                fail(c, a, an, "takes no value");
                goto err;
            }
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            fail(c, a, an, "missing value (%s)", o->metavar ? o->metavar : "a value");
            goto err;
        }
        if (store(c, o, a, an, v, dst)) goto err;
    }
    for (int g = 0; g < c->n_groups; g++) { /* --synth X is -m synth:X */
        cli_model_arg *ma = c->groups[g].dst;
        if ((c->groups[g].opts != cli_model_opts && c->groups[g].opts != cli_model_req_opts) || !ma->synth) continue;
        if (ma->dir) {
            fail(c, "--synth", 7, "give -m DIR or --synth NAME, not both");
            goto err;
        }
        if ((size_t)snprintf(ma->synth_dir, sizeof ma->synth_dir, "synth:%s", ma->synth) >= sizeof ma->synth_dir) {
            fail(c, "--synth", 7, "'%s' is too long for a synth model's name", ma->synth);
            goto err;
        }
        ma->dir = ma->synth_dir;
    }
    return 0;
err:
    cli_free(c);
    *rc = 2;
    return 1;
}

/* ---------------------------------------------------------------- the help */

enum { HELP_WIDTH = 100, HELP_COL = 26 };

/* Columns of s[0..n): UTF-8 continuation bytes take none. */
static int cols(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Writes s wrapped to HELP_WIDTH, continuation lines indented by `col` (the
 * first line starts at column `at`). Spaces are kept as written (alignment
 * after a '\n'), except where a line is wrapped. */
static void wrap(FILE *f, const char *s, int at, int col) {
    int x = at;
    while (*s) {
        if (*s == '\n') {
            fprintf(f, "\n%*s", col, "");
            x = col;
            s++;
            continue;
        }
        size_t sp = strspn(s, " "), w = strcspn(s + sp, " \n");
        if (x > col && x + (int)sp + cols(s + sp, w) > HELP_WIDTH) {
            fprintf(f, "\n%*s", col, "");
            x = col;
            s += sp;
            sp = 0;
        }
        fprintf(f, "%*s", (int)sp, "");
        fwrite(s + sp, 1, w, f);
        x += (int)sp + cols(s + sp, w);
        s += sp + w;
    }
    fputc('\n', f);
}

static void help_opt(FILE *f, const cli_opt *o) {
    char left[160];
    int n;
    if (o->alias && o->alias[1] != '-') /* a short spelling first: "-m, --model" */
        n = snprintf(left, sizeof left, "  %s, %s", o->alias, o->name);
    else if (o->alias)
        n = snprintf(left, sizeof left, "  %s, %s", o->name, o->alias);
    else
        n = snprintf(left, sizeof left, "  %s", o->name);
    if (o->kind != CLI_FLAG && n > 0 && (size_t)n < sizeof left) {
        if (o->metavar) {
            n += snprintf(left + n, sizeof left - (size_t)n, " %s", o->metavar);
        } else if (o->kind == CLI_CHOICE) {
            for (int k = 0; o->choices[k] && (size_t)n < sizeof left; k++)
                n += snprintf(left + n, sizeof left - (size_t)n, "%s%s", k ? "|" : " ", o->choices[k]);
        }
    }
    fputs(left, f);
    int at = (int)strlen(left);
    if (at + 2 > HELP_COL) {
        fprintf(f, "\n%*s", HELP_COL, "");
    } else {
        fprintf(f, "%*s", HELP_COL - at, "");
    }
    char extra[64] = "";
    if (o->kind == CLI_STRINGS || o->kind == CLI_IDS_LIST) snprintf(extra, sizeof extra, " (may be repeated)");
    char buf[2048];
    snprintf(buf, sizeof buf, "%s%s", o->help ? o->help : "", extra);
    wrap(f, buf, HELP_COL, HELP_COL);
}

static int same_title(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

void cli_help(const cli_cmd *c, FILE *f) {
    fprintf(f, "usage: dsv4 %s %s\n", c->name, c->synopsis ? c->synopsis : "[options]");
    if (c->about) fprintf(f, "\n%s", c->about);
    int helped = 0;
    for (int g = 0; g < c->n_groups; g++) {
        const char *t = c->groups[g].title;
        if (g == 0 || !same_title(t, c->groups[g - 1].title)) {
            if (g > 0 && !helped) fprintf(f, "  -h, --help%*sthis help\n", HELP_COL - 12, ""), helped = 1;
            fprintf(f, "\n%s:\n", t ? t : "options");
        }
        for (const cli_opt *o = c->groups[g].opts; o->name; o++) help_opt(f, o);
    }
    if (!helped) fprintf(f, "%s  -h, --help%*sthis help\n", c->n_groups ? "" : "\noptions:\n", HELP_COL - 12, "");
    if (c->notes) fprintf(f, "\n%s", c->notes);
}
