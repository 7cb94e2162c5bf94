/* cmd_perplexity.c — `dsv4 perplexity` (NLL of a text over fixed windows) and
 * `dsv4 stats` (per-layer expert load of the MoE routing on a text).
 *
 * Both cut the text the same way, the procedure of the bundled model's
 * reference number (tools/train_bundled.py): ids = the file's bytes encoded
 * with no added token recognized and no BOS; consecutive non-overlapping
 * windows of W ids (the last may be shorter; a window of fewer than 2 ids is
 * dropped); each window is run on a fresh sequence as [BOS] + window. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/heatmap.h"
#include "cli/opts.h"
#include "cli/util.h"
#include "ep/ep.h"
#include "text/tokenizer.h"
#include "model/forward.h"

typedef struct {
    const char *cmd, *given, *file;
    long long window, batch;
    int threads;
    int fractions;
    const char *load_out, *heatmap;
    int load; /* --load */
} text_opts;

/* The text's windows: window i is ids[start[i] .. start[i] + len[i]). */
typedef struct {
    int32_t *ids;
    size_t n_ids, n_bytes;
    int n_win;
    size_t *start;
    int *len;
} text_windows;

static void windows_free(text_windows *w) {
    free(w->ids);
    free(w->start);
    free(w->len);
}

/* The options both commands share. */
typedef struct {
    const char *file;
    long long window, batch;
    int fractions;
    const char *load_out, *heatmap;
} text_args;

static const cli_opt text_opts_tab[] = {
    CLI_STRING_OPT("--file", "-f", text_args, file, "F", "the text ('-': standard input); required"),
    CLI_LONG_OPT("--window", NULL, text_args, window, 2, 1 << 24, "W", "ids per window (default 512)"),
    CLI_LONG_OPT("--batch", NULL, text_args, batch, 1, 4096, "B",
                 "windows per forward step (default 4; at most ~1 GiB of logits); the result does not depend on it"),
    CLI_END,
};

static const cli_opt stats_opts_tab[] = {
    CLI_FLAG_OPT("--fractions", NULL, text_args, fractions, "also print every expert's share, per layer"),
    CLI_STRING_OPT("--load-out", NULL, text_args, load_out, "F",
                   "write the load as 'LAYER EXPERT COUNT' lines (for --expert-load under mpirun)"),
    CLI_STRING_OPT("--heatmap", NULL, text_args, heatmap, "F.png",
                   "draw the load as a PNG: a row of cells per layer, a column per expert; white at the layer's "
                   "mean, redder up to 8x it, bluer down to 1/8, black for no token"),
    CLI_END,
};

/* Parses argv into o; 0, or the exit status (2 usage, 0 --help) + 1. */
static int parse_text_opts(int argc, char **argv, text_opts *o, int stats, const char *about, const char *notes) {
    text_args ta = {NULL, o->window, o->batch, 0, NULL, NULL};
    cli_model_arg ma = {0};
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_opts, &ma},
                                {NULL, text_opts_tab, &ta},
                                {NULL, cli_threads_opts, &bo},
                                {NULL, cli_load_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()},
                                {NULL, stats_opts_tab, &ta}};
    const cli_cmd cmd = {
        o->cmd,
        stats
            ? "[-m DIR] --file F [--window W] [--batch B] [--threads N] [--fractions] [--load-out F] [--heatmap F.png]"
            : "[-m DIR] --file F [--window W] [--batch B] [--threads N]",
        about,
        notes,
        groups,
        stats ? 6 : 5};
    int rc;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc + 1;
    if (!ta.file) return cli_usage_error(&cmd, "--file F is required (the text to evaluate)") + 1;
    o->given = ma.dir;
    o->file = ta.file;
    o->window = ta.window;
    o->batch = ta.batch;
    o->threads = bo.threads;
    o->load = bo.load;
    o->fractions = ta.fractions;
    o->load_out = ta.load_out;
    o->heatmap = ta.heatmap;
    return 0;
}

/* Reads and tokenizes the file and cuts it into windows. 0 or -1 (message). */
static int load_windows(const text_opts *o, ds_tokenizer *tok, text_windows *w) {
    memset(w, 0, sizeof *w);
    ds_err err = {{0}};
    char *text = cli_read_file(o->cmd, o->file, &w->n_bytes);
    if (!text) return -1;
    int rc = ds_tokenizer_encode(tok, text, w->n_bytes, DS_TOK_PARSE_NONE, &w->ids, &w->n_ids, &err);
    free(text);
    if (rc) {
        fprintf(stderr, "dsv4 %s: %s: %s\n", o->cmd, o->file, err.msg);
        return -1;
    }
    size_t W = (size_t)o->window, nw = (w->n_ids + W - 1) / W;
    w->start = malloc((nw ? nw : 1) * sizeof *w->start);
    w->len = malloc((nw ? nw : 1) * sizeof *w->len);
    if (!w->start || !w->len) {
        fprintf(stderr, "dsv4 %s: out of memory\n", o->cmd);
        return -1;
    }
    for (size_t s = 0; s < w->n_ids; s += W) {
        size_t l = w->n_ids - s < W ? w->n_ids - s : W;
        if (l < 2) continue;
        w->start[w->n_win] = s;
        w->len[w->n_win++] = (int)l;
    }
    if (!w->n_win) {
        fprintf(stderr, "dsv4 %s: %s: %zu tokens: no window of at least 2 tokens to evaluate\n", o->cmd, o->file,
                w->n_ids);
        return -1;
    }
    return 0;
}

/* Runs windows [w0, w0 + nb) as one batch: sequence b gets [BOS] + the
 * window's first len-1 ids (`feed` tokens: the last id is only predicted)
 * or, with full = 1, [BOS] + the whole window. */
static int run_batch(const ds_model *m, const ds_backend *be, const text_windows *w, int32_t bos, int w0, int nb,
                     int full, ds_seq **seqs, int32_t **toks, float **logits, const void *obs, ds_err *err) {
    ds_batch_item items[64];
    for (int b = 0; b < nb; b++) {
        int len = w->len[w0 + b], n = full ? len + 1 : len;
        toks[b][0] = bos;
        memcpy(toks[b] + 1, w->ids + w->start[w0 + b], (size_t)(n - 1) * sizeof **toks);
        ds_seq_reset(seqs[b]);
        items[b] = (ds_batch_item){seqs[b], toks[b], n, logits ? logits[b] : NULL, 1, NULL, NULL};
    }
#ifdef DS_HAVE_ROUTE_HOOK
    if (obs) return ds_forward_observed(m, be, items, nb, obs, err);
#else
    (void)obs;
#endif
    return ds_forward(m, be, items, nb, err);
}

/* Sequences, token buffers and (optionally) logits for `nb` windows of up to
 * W + 1 tokens. */
typedef struct {
    int nb;
    ds_seq **seqs;
    int32_t **toks;
    float **logits;
} batch_bufs;

static void bufs_free(batch_bufs *b) {
    for (int i = 0; i < b->nb; i++) {
        if (b->seqs) ds_seq_free(b->seqs[i]);
        if (b->toks) free(b->toks[i]);
        if (b->logits) free(b->logits[i]);
    }
    free(b->seqs);
    free(b->toks);
    free(b->logits);
}

static int bufs_new(const char *cmd, const ds_model *m, int nb, int W, int with_logits, batch_bufs *b) {
    ds_err err = {{0}};
    memset(b, 0, sizeof *b);
    b->seqs = calloc((size_t)nb, sizeof *b->seqs);
    b->toks = calloc((size_t)nb, sizeof *b->toks);
    b->logits = with_logits ? calloc((size_t)nb, sizeof *b->logits) : NULL;
    if (!b->seqs || !b->toks || (with_logits && !b->logits)) goto oom;
    b->nb = nb;
    for (int i = 0; i < nb; i++) {
        if (ds_seq_new(m, W + 1, &b->seqs[i], &err)) {
            fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
            return -1;
        }
        b->toks[i] = malloc((size_t)(W + 1) * sizeof **b->toks);
        if (!b->toks[i]) goto oom;
        if (with_logits && !(b->logits[i] = malloc((size_t)W * (size_t)m->cfg.vocab_size * sizeof(float)))) goto oom;
    }
    return 0;
oom:
    fprintf(stderr, "dsv4 %s: out of memory for %d windows of %d tokens (lower --batch or --window)\n", cmd, nb, W);
    return -1;
}

/* At most 64 windows per step, and at most ~1 GiB of logits. */
static int clamp_batch(const text_opts *o, const ds_model *m, int n_win, int with_logits) {
    long long nb = o->batch;
    if (with_logits) {
        long long per = o->window * (long long)m->cfg.vocab_size * 4;
        long long lim = per > 0 ? (1LL << 30) / per : nb;
        if (nb > lim) nb = lim;
    }
    if (nb > 64) nb = 64;
    if (nb > n_win) nb = n_win;
    return nb < 1 ? 1 : (int)nb;
}

/* ---------------------------------------------------------- dsv4 perplexity */

static const char PPL_ABOUT[] =
    "Perplexity of the text in F (the procedure of the bundled model's reference number):\n"
    "  ids = the file's bytes tokenized with no added/special token recognized and no BOS;\n"
    "  consecutive non-overlapping windows of W ids (the last may be shorter; one of fewer\n"
    "  than 2 ids is dropped); each window is evaluated on its own as [BOS] + window; the\n"
    "  NLL is summed over the predictions of every window id (id 0 predicted from BOS, id i\n"
    "  from BOS + ids[0..i)) with log-softmax in double precision of the float logits;\n"
    "  perplexity = exp(total NLL / predicted ids).\n";
static const char PPL_NOTES[] = "Standard output gets the (deterministic) results; the speed goes to standard error.\n";

/* NLL of `target` under one row of float logits, in double. */
static double row_nll(const float *x, int V, int32_t target) {
    double mx = -HUGE_VAL;
    for (int i = 0; i < V; i++)
        if ((double)x[i] > mx) mx = (double)x[i];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)x[i] - mx);
    return mx + log(s) - (double)x[target];
}

int cmd_perplexity(int argc, char **argv) {
    text_opts o = {"perplexity", NULL, NULL, 512, 4, 0, 0, NULL, NULL, 0};
    int prc = parse_text_opts(argc, argv, &o, 0, PPL_ABOUT, PPL_NOTES);
    if (prc) return prc - 1;
    char dir[4096];
    if (cli_model_dir(o.cmd, o.given, dir, sizeof dir)) return 1;
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_tokenizer *tok = NULL;
    text_windows w = {0};
    batch_bufs bb = {0};
    int rc = 1;
    ds_err err = {{0}};
    ds_backend_opts bo = {.threads = o.threads, .load = o.load};
    if (cli_load_model_tok(o.cmd, dir, &bo, &m, &tok) || load_windows(&o, tok, &w)) goto out;
    int brc = cli_bind(o.cmd, m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    const int V = m->cfg.vocab_size;
    for (size_t i = 0; i < w.n_ids; i++)
        if (w.ids[i] >= V) {
            fprintf(stderr, "dsv4 perplexity: %s: token %zu (id %d) is beyond the model's vocabulary of %d\n", o.file,
                    i, (int)w.ids[i], V);
            goto out;
        }
    int32_t bos = cli_bos_id(m, tok);
    int nb = clamp_batch(&o, m, w.n_win, 1);
    if (bufs_new(o.cmd, m, nb, (int)o.window, 1, &bb)) goto out;
    double total = 0, t0 = ds_now();
    long long count = 0;
    for (int w0 = 0; w0 < w.n_win; w0 += nb) {
        int k = w.n_win - w0 < nb ? w.n_win - w0 : nb;
        if (run_batch(m, &be, &w, bos, w0, k, 0, bb.seqs, bb.toks, bb.logits, NULL, &err)) {
            fprintf(stderr, "dsv4 perplexity: window %d: %s\n", w0, err.msg);
            goto out;
        }
        for (int b = 0; b < k; b++) {
            const int32_t *tgt = w.ids + w.start[w0 + b];
            for (int j = 0; j < w.len[w0 + b]; j++) total += row_nll(bb.logits[b] + (size_t)j * V, V, tgt[j]);
            count += w.len[w0 + b];
        }
    }
    double dt = ds_now() - t0, nll = total / (double)count;
    printf("file: %s (%zu bytes)\n", o.file, w.n_bytes);
    printf("tokens: %zu (predicted: %lld)\n", w.n_ids, count);
    printf("windows: %d of up to %lld tokens, each after BOS (id %d)\n", w.n_win, o.window, (int)bos);
    printf("nll/token: %.6f\n", nll);
    printf("perplexity: %.6g\n", exp(nll));
    fflush(stdout);
    fprintf(stderr, "speed: %lld tokens in %.3f s, %.1f tokens/s (%d windows per step)\n", count, dt,
            dt > 0 ? (double)count / dt : 0, nb);
    if (!isfinite(nll)) {
        fprintf(stderr, "dsv4 perplexity: the NLL is not finite (the model's logits hold inf or NaN)\n");
        goto out;
    }
    rc = 0;
out:
    bufs_free(&bb);
    windows_free(&w);
    ds_tokenizer_free(tok);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}

/* ---------------------------------------------------------------- dsv4 stats */

static const char STATS_ABOUT[] =
    "Expert load of the MoE routing on the text in F, cut as dsv4 perplexity cuts it\n"
    "([BOS] + windows of W ids; every token routed, BOS included): per layer the share of\n"
    "token-slots routed to each expert, as max/mean and min/mean (1 = perfectly balanced;\n"
    "hash layers route by token id) and a histogram with one column per expert (height:\n"
    "load relative to the layer's busiest expert; blank: no token).\n";

#ifdef DS_HAVE_ROUTE_HOOK
typedef struct {
    int E;
    long long *counts; /* [layers][E] */
} route_counts;

static void count_route(void *ctx, int layer, int item, int tok, const int *experts, int k) {
    route_counts *rc = ctx;
    (void)item;
    (void)tok;
    for (int i = 0; i < k; i++)
        if (experts[i] >= 0 && experts[i] < rc->E) rc->counts[(size_t)layer * rc->E + experts[i]]++;
}

/* One column per expert (or per group of experts beyond 128): U+2581..U+2588
 * by load relative to the max; ' ' for none. */
static void histogram(const long long *c, int E) {
    static const char *bars[8] = {"\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83", "\xe2\x96\x84",
                                  "\xe2\x96\x85", "\xe2\x96\x86", "\xe2\x96\x87", "\xe2\x96\x88"};
    int g = (E + 127) / 128, cols = (E + g - 1) / g;
    long long mx = 0;
    for (int col = 0; col < cols; col++) {
        long long s = 0;
        for (int e = col * g; e < E && e < (col + 1) * g; e++) s += c[e];
        if (s > mx) mx = s;
    }
    for (int col = 0; col < cols; col++) {
        long long s = 0;
        for (int e = col * g; e < E && e < (col + 1) * g; e++) s += c[e];
        if (!s || !mx) {
            fputc(' ', stdout);
            continue;
        }
        long long lvl = (8 * s + mx - 1) / mx; /* ceil, in 1..8 */
        fputs(bars[lvl < 1 ? 0 : lvl > 8 ? 7 : lvl - 1], stdout);
    }
    if (g > 1) printf("  (%d experts per column)", g);
}
#endif

int cmd_stats(int argc, char **argv) {
    text_opts o = {"stats", NULL, NULL, 512, 4, 0, 0, NULL, NULL, 0};
    int prc = parse_text_opts(argc, argv, &o, 1, STATS_ABOUT, NULL);
    if (prc) return prc - 1;
#ifndef DS_HAVE_ROUTE_HOOK
    fprintf(stderr, "dsv4 stats: not available yet: this build's model code has no routing hook "
                    "(DS_HAVE_ROUTE_HOOK in model/forward.h)\n");
    return 1;
#else
    char dir[4096];
    if (cli_model_dir(o.cmd, o.given, dir, sizeof dir)) return 1;
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_tokenizer *tok = NULL;
    text_windows w = {0};
    batch_bufs bb = {0};
    route_counts cnt = {0, NULL};
    int rc = 1;
    ds_err err = {{0}};
    ds_backend_opts bo = {.threads = o.threads, .load = o.load};
    if (cli_load_model_tok(o.cmd, dir, &bo, &m, &tok) || load_windows(&o, tok, &w)) goto out;
    int brc = cli_bind(o.cmd, m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    const ds_config *c = &m->cfg;
    for (size_t i = 0; i < w.n_ids; i++)
        if (w.ids[i] >= c->vocab_size) {
            fprintf(stderr, "dsv4 stats: %s: token %zu (id %d) is beyond the model's vocabulary of %d\n", o.file, i,
                    (int)w.ids[i], c->vocab_size);
            goto out;
        }
    int32_t bos = cli_bos_id(m, tok);
    int nb = clamp_batch(&o, m, w.n_win, 0);
    if (bufs_new(o.cmd, m, nb, (int)o.window, 0, &bb)) goto out;
    cnt.E = c->n_routed_experts;
    cnt.counts = calloc((size_t)c->n_layers * (size_t)cnt.E, sizeof *cnt.counts);
    if (!cnt.counts) {
        fprintf(stderr, "dsv4 stats: out of memory\n");
        goto out;
    }
    ds_observer obs = {count_route, NULL, &cnt, NULL};
    long long n_tok = 0;
    double t0 = ds_now();
    for (int w0 = 0; w0 < w.n_win; w0 += nb) {
        int k = w.n_win - w0 < nb ? w.n_win - w0 : nb;
        if (run_batch(m, &be, &w, bos, w0, k, 1, bb.seqs, bb.toks, NULL, &obs, &err)) {
            fprintf(stderr, "dsv4 stats: window %d: %s\n", w0, err.msg);
            goto out;
        }
        for (int b = 0; b < k; b++) n_tok += w.len[w0 + b] + 1;
    }
    double dt = ds_now() - t0;
    printf("file: %s (%zu bytes, %zu tokens)\n", o.file, w.n_bytes, w.n_ids);
    printf("routed: %lld tokens ([BOS] + %d windows of up to %lld), %d experts, %d per token\n", n_tok, w.n_win,
           o.window, cnt.E, c->n_active_experts);
    printf("layer  kind    max/mean  min/mean  load per expert\n");
    for (int L = 0; L < c->n_layers; L++) {
        const long long *cl = cnt.counts + (size_t)L * cnt.E;
        long long sum = 0, mx = 0, mn = -1;
        for (int e = 0; e < cnt.E; e++) {
            sum += cl[e];
            if (cl[e] > mx) mx = cl[e];
            if (mn < 0 || cl[e] < mn) mn = cl[e];
        }
        double mean = (double)sum / cnt.E;
        printf("%5d  %-6s  %8.3f  %8.3f  ", L, m->layers[L].is_hash ? "hash" : "routed", mean > 0 ? mx / mean : 0,
               mean > 0 ? mn / mean : 0);
        histogram(cl, cnt.E);
        printf("\n");
        if (o.fractions) {
            printf("       fractions:");
            for (int e = 0; e < cnt.E; e++) printf(" %.5f", sum ? (double)cl[e] / (double)sum : 0.0);
            printf("\n");
        }
    }
    fflush(stdout);
    if (o.load_out) {
        FILE *lf = fopen(o.load_out, "w");
        if (!lf) {
            fprintf(stderr, "dsv4 stats: --load-out %s: %s\n", o.load_out, strerror(errno));
            goto out;
        }
        fprintf(lf, "# dsv4 stats --file %s: LAYER EXPERT TOKENS\n", o.file);
        for (int L = 0; L < c->n_layers; L++)
            for (int e = 0; e < cnt.E; e++) fprintf(lf, "%d %d %lld\n", L, e, cnt.counts[(size_t)L * cnt.E + e]);
        if (fclose(lf)) {
            fprintf(stderr, "dsv4 stats: --load-out %s: %s\n", o.load_out, strerror(errno));
            goto out;
        }
    }
    if (o.heatmap) {
        char msg[512];
        int cw = cnt.E <= 64 ? 16 : cnt.E <= 256 ? 4 : 2;
        if (cli_heatmap_png(o.heatmap, cnt.counts, c->n_layers, cnt.E, cw, 16, msg, sizeof msg)) {
            fprintf(stderr, "dsv4 stats: --heatmap %s\n", msg);
            goto out;
        }
        printf("heatmap: %s (%d x %d pixels: %d layers x %d experts)\n", o.heatmap, cnt.E * cw, 16 * c->n_layers,
               c->n_layers, cnt.E);
    }
    fprintf(stderr, "speed: %lld tokens in %.3f s, %.1f tokens/s\n", n_tok, dt, dt > 0 ? (double)n_tok / dt : 0);
    rc = 0;
out:
    free(cnt.counts);
    bufs_free(&bb);
    windows_free(&w);
    ds_tokenizer_free(tok);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
#endif
}
