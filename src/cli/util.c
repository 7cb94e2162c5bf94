#include "cli/util.h"

#include "text/grammar.h"
#include "text/json_schema.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/opts.h"
#include "common/io.h"
#include "ep/ep.h"
#include "ep/launch.h"
#include "text/tokenizer.h"
#include "model/model.h"
#include "model/store.h"
#include "runtime/model_load.h"

static int has_config(const char *dir) {
    char p[4096];
    struct stat st;
    int k = snprintf(p, sizeof p, "%s/config.json", dir);
    return k > 0 && (size_t)k < sizeof p && !stat(p, &st) && S_ISREG(st.st_mode);
}

const char *cli_bytes(double b, char *buf, size_t cap) {
    snprintf(buf, cap, "%.2f %s", b >= 1e9 ? b / 1e9 : b >= 1e6 ? b / 1e6 : b / 1e3, b >= 1e9 ? "GB" : b >= 1e6 ? "MB" : "kB");
    return buf;
}

int cli_model_dir(const char *cmd, const char *given, char *out, size_t cap) {
    if (given && !strncmp(given, "synth:", 6)) { /* ds_load_model builds it */
        if ((size_t)snprintf(out, cap, "%s", given) >= cap) return -1;
        return 0;
    }
    if (given) {
        if ((size_t)snprintf(out, cap, "%s", given) >= cap) {
            fprintf(stderr, "dsv4 %s: -m: path too long\n", cmd);
            return -1;
        }
        return 0;
    }
    const char *env = getenv("DSV4_MODEL");
    if (env && *env) {
        if (!has_config(env)) {
            fprintf(stderr, "dsv4 %s: DSV4_MODEL=%s: no config.json in that directory\n", cmd, env);
            return -1;
        }
        snprintf(out, cap, "%s", env);
        return 0;
    }
    if (has_config("models/kjv")) {
        snprintf(out, cap, "models/kjv");
        return 0;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            char cand[4096 + 32];
            snprintf(cand, sizeof cand, "%s/../models/kjv", exe);
            if (has_config(cand) && strlen(cand) < cap) {
                snprintf(out, cap, "%s", cand);
                return 0;
            }
        }
    }
    fprintf(stderr,
            "dsv4 %s: no model given and no bundled model found (looked at $DSV4_MODEL, ./models/kjv and "
            "<dir of dsv4>/../models/kjv): pass -m DIR\n",
            cmd);
    return -1;
}

/* "loading  4.2 / 16.4 GB" rewritten in place, every 0.5 GB */
typedef struct {
    const char *cmd;
    uint64_t shown;
} load_progress;

static void show_progress(void *ctx, uint64_t done, uint64_t total) {
    load_progress *p = ctx;
    if (done < total && done - p->shown < ((uint64_t)1 << 29)) return;
    p->shown = done;
    fprintf(stderr, "\rdsv4 %s: copying the weights into memory: %.1f / %.1f GB%s", p->cmd, done / 1e9, total / 1e9,
            done >= total ? "\n" : "");
}

static int load_with(const char *cmd, const char *dir, const ds_backend_opts *o, ds_model **m, ds_err *err) {
    int mode = DS_LOAD_MMAP;
    if (o && o->load == CLI_LOAD_COPY) mode = DS_LOAD_COPY;
    /* auto: a GPU backend copies the weights itself; ranks of one host would each hold a copy */
    if (o && o->load == CLI_LOAD_AUTO && (!o->name || !strcmp(o->name, "cpu")) && ds_ep_session_size() <= 1)
        mode = DS_LOAD_AUTO;
    load_progress lp = {cmd, 0};
    ds_load_opts lo = {mode, {isatty(2) ? show_progress : NULL, &lp}};
    return ds_load_model(dir, &lo, m, err);
}

int cli_load_model(const char *cmd, const char *dir, const ds_backend_opts *o, ds_model **m) {
    ds_err err = {{0}};
    *m = NULL;
    if (load_with(cmd, dir, o, m, &err)) {
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
        return -1;
    }
    return 0;
}

int cli_load_model_tok(const char *cmd, const char *dir, const ds_backend_opts *o, ds_model **m, ds_tokenizer **tok) {
    ds_err err = {{0}};
    *m = NULL;
    *tok = NULL;
    /* the tokenizer first: it is cheap, and a missing tokenizer.json should
     * not wait for the weights */
    if (ds_tokenizer_load(dir, tok, &err) || load_with(cmd, dir, o, m, &err)) {
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
        ds_tokenizer_free(*tok);
        *tok = NULL;
        return -1;
    }
    return 0;
}

int32_t cli_bos_id(const ds_model *m, const ds_tokenizer *tok) {
    int32_t b = ds_tokenizer_bos_id(tok);
    return b >= 0 ? b : m->cfg.bos_id;
}

char *cli_read_file(const char *cmd, const char *path, size_t *n) {
    char *buf;
    ds_err err;
    if (ds_read_file(path, 0, &buf, n, &err)) {
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
        return NULL;
    }
    return buf;
}

/* "filling the expert slots: 4.2 / 110.0 GB" rewritten in place (ctx: the
 * command's name) */
static void show_fill(void *ctx, uint64_t done, uint64_t total) {
    fprintf(stderr, "\rdsv4 %s: filling the expert slots: %.1f / %.1f GB%s", (const char *)ctx, done / 1e9,
            total / 1e9, done >= total ? "\n" : "");
}

/* The routed experts in tiers (model/store.h) when --gpu-mem or
 * --expert-slots asks for them; placed by --expert-load's file. */
static int tiers(const char *cmd, ds_model *m, const ds_backend_opts *o, ds_err *err) {
    if (!o || (o->gpu_mem == 0 && o->expert_slots == 0)) return 0;
    if (!(isfinite(o->gpu_mem) && o->gpu_mem >= 0))
        return ds_fail(err, "--gpu-mem %g: must be a finite number >= 0", o->gpu_mem);
    const ds_config *c = &m->cfg;
    const char *lf = ds_ep_session_opts()->load;
    double *load = NULL;
    if (lf) {
        load = malloc((size_t)c->n_layers * c->n_routed_experts * sizeof *load);
        if (!load) return ds_fail(err, "out of memory");
        if (ds_load_read(lf, c->n_layers, c->n_routed_experts, load, err)) {
            free(load);
            return -1;
        }
    }
    ds_store_opts so = {(uint64_t)(o->gpu_mem * 1e9),
                        o->expert_slots > 0 ? o->expert_slots : -1,
                        o->tier_path,
                        load,
                        {DS_TIER_PCIE, DS_TIER_CPU_READ, DS_TIER_CPU_FLOPS},
                        {isatty(2) ? show_fill : NULL, (void *)cmd}};
    int rc = ds_store_new(m, &so, err);
    free(load);
    return rc;
}

int cli_bind(const char *cmd, ds_model *m, const ds_backend_opts *o, ds_backend *be) {
    ds_err err;
    if (ds_ep_session_size() > 1) {
        if (o && (o->gpu_mem != 0 || o->expert_slots != 0)) {
            if (ds_ep_session_rank() == 0)
                fprintf(stderr, "dsv4 %s: --gpu-mem / --expert-slots: not under expert parallelism (mpirun)\n", cmd);
            return -1;
        }
        int rc = ds_ep_launch(m, o, be, &err);
        if (rc < 0) {
            if (ds_ep_session_rank() == 0) fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
            return -1;
        }
        if (rc == DS_EP_FOLLOWED) return 1;
        fprintf(stderr, "dsv4 %s: ", cmd);
        ds_ep_launch_report(m, stderr);
        return 0;
    }
    if (tiers(cmd, m, o, &err) || ds_backend_open(o, be, &err) || ds_model_bind(m, be, &err)) {
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
        ds_model_unbind(m);
        ds_backend_close(be);
        return -1;
    }
    if (m->store) {
        char a[32], b[32], c[32], pin[300];
        const ds_store *st = m->store;
        const char *why;
        uint64_t pinned = ds_store_pinned_bytes(st, &why);
        if (*why)
            snprintf(pin, sizeof pin, "; %s of it page-locked, the rest pageable: %s",
                     cli_bytes((double)pinned, c, sizeof c), why);
        else if (pinned)
            snprintf(pin, sizeof pin, ", page-locked for the copies");
        else
            pin[0] = 0;
        if (ds_store_fill_rate(st) > 0) {
            size_t n = strlen(pin);
            snprintf(pin + n, sizeof pin - n, "; slots filled at %.1f GB/s", ds_store_fill_rate(st) / 1e9);
        }
        fprintf(stderr, "dsv4 %s: expert tiers: %lld slots of %s (%lld resident, %lld staging) for %d x %d experts "
                        "(%s in host memory%s)\n",
                cmd, ds_store_slots(st), cli_bytes((double)ds_store_expert_bytes(st), a, sizeof a),
                ds_store_resident(st), ds_store_slots(st) - ds_store_resident(st), m->cfg.n_layers,
                m->cfg.n_routed_experts, cli_bytes((double)ds_store_host_bytes(st), b, sizeof b), pin);
    }
    return 0;
}

void cli_tiers_report(FILE *f, const char *label, const ds_model *m, double steps) {
    if (!m->store) return;
    ds_store_counts t = ds_store_counts_of(m->store, -1);
    if (!f) {
        ds_store_counts_reset(m->store);
        return;
    }
    char b[32];
    double P = t.pairs > 0 ? (double)t.pairs : 1, s = steps > 0 ? steps : 1;
    const char *per = steps > 0 ? " ms/step" : " ms";
    ds_tier_rates r = ds_store_rates(m->store);
    int q = ds_store_copies_queued(m->store);
    fprintf(f,
            "%s%lld expert picks: %.1f%% in slots, %.1f%% copied (%lld experts, %lld of them re-placed, %s, %s%.2f%s), "
            "%.1f%% on the CPU (%.2f%s); cost model (%s): copies %.1f GB/s, CPU %.1f GB/s and %.0f GFLOP/s; "
            "in slots by layer:",
            label, t.pairs, 100.0 * t.hit_pairs / P, 100.0 * t.copied_pairs / P, t.copies, t.replaced,
            cli_bytes(t.copy_bytes, b, sizeof b), q ? "queued in " : "", t.copy_seconds / s * 1e3, per,
            100.0 * t.cpu_pairs / P, t.cpu_seconds / s * 1e3, per,
            q ? "copies from the bind's fill, the CPU learned" : "learned", r.pcie / 1e9, r.cpu_read / 1e9,
            r.cpu_flops / 1e9);
    for (int li = 0; li < m->cfg.n_layers; li++) {
        ds_store_counts c = ds_store_counts_of(m->store, li);
        fprintf(f, " %.0f%%", c.pairs ? 100.0 * c.hit_pairs / c.pairs : 0.0);
    }
    fprintf(f, "\n");
    ds_store_counts_reset(m->store);
}

int cli_load_schema(const char *cmd, const char *file, const ds_tokenizer *tok, ds_grammar **g, ds_vocab_trie **trie) {
    ds_err err;
    size_t n;
    *g = NULL, *trie = NULL;
    char *text = cli_read_file(cmd, file, &n);
    if (!text) return -1;
    int rc = ds_json_schema_compile(text, n, g, &err) || ds_vocab_trie_build(tok, trie, &err);
    free(text);
    if (rc) {
        fprintf(stderr, "dsv4 %s: %s: %s\n", cmd, file, err.msg);
        ds_grammar_free(*g);
        *g = NULL;
        return -1;
    }
    return 0;
}
