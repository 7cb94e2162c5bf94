#include "cli/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/opts.h"
#include "common/io.h"
#include "dist/ep.h"
#include "runtime/ep_follow.h"
#include "text/tokenizer.h"
#include "model/model.h"

static int has_config(const char *dir) {
    char p[4096];
    struct stat st;
    int k = snprintf(p, sizeof p, "%s/config.json", dir);
    return k > 0 && (size_t)k < sizeof p && !stat(p, &st) && S_ISREG(st.st_mode);
}

int cli_model_dir(const char *cmd, const char *given, char *out, size_t cap) {
    if (given && !strncmp(given, "synth:", 6)) { /* ds_model_load builds it */
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
    return ds_model_load_with(dir, &lo, m, err);
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

/* Under mpirun (more than one rank): every rank builds the expert placement,
 * binds the dense weights and its experts, and all say whether that worked
 * (a rank that failed is named by rank 0); then the followers serve the
 * leader's steps until it quits, and exit here. */
static int bind_ranks(const char *cmd, ds_model *m, const ds_backend_opts *o, ds_backend *be) {
    ds_err err = {{0}}, herr = {{0}};
    ds_ep *ep = NULL;
    const char *fail_env = getenv("DSV4_EP_FAIL_RANK"); /* tests: this rank fails to load */
    int ok = 1;
    if (fail_env && atoi(fail_env) == ds_ep_session_rank())
        ok = 0, ds_fail(&err, "DSV4_EP_FAIL_RANK=%s: this rank fails to load (a test)", fail_env);
    if (ok && ds_ep_new(&ep, m->cfg.n_layers, m->cfg.n_routed_experts, m->cfg.n_active_experts, ds_ep_session_opts(), &err)) ok = 0;
    if (ok) ds_model_set_ep(m, ep);
    ds_backend_opts ro = *o; /* one GPU per rank of a host: --gpu N is the first */
    ro.rank = ds_ep_session_local_rank();
    if (ok && (ds_backend_open(&ro, be, &err) || ds_model_bind(m, be, &err))) ok = 0;
    int rc = ds_ep_session_ready(ok, err.msg, &herr);
    if (rc || !ok) {
        if (ds_ep_session_rank() == 0) fprintf(stderr, "dsv4 %s: %s\n", cmd, ok ? herr.msg : err.msg);
        ds_model_unbind(m);
        ds_model_set_ep(m, NULL);
        ds_ep_free(ep);
        ds_backend_close(be);
        if (ds_ep_session_rank() != 0) exit(ds_ep_session_end(1));
        return -1;
    }
    /* the exchange between GPUs: NCCL when the backend has one and every rank
     * of every host has a GPU of its own (NCCL takes one rank per GPU); else
     * MPI through host memory. Failures here end the job (MPI_Abort). */
    int nccl = be->ep_comm_init && ds_ep_session_local_size() <= ds_backend_gpu_count();
    if (ds_ep_session_all(nccl)) {
        struct {
            int ok;
            unsigned n;
            char id[512];
            char msg[sizeof err.msg];
        } b = {1, 0, {0}, {0}};
        size_t n = 0;
        if (ds_ep_session_rank() == 0 && be->ep_comm_id(be, b.id, sizeof b.id, &n, &err))
            b.ok = 0, snprintf(b.msg, sizeof b.msg, "%s", err.msg);
        b.n = (unsigned)n;
        ds_ep_session_bcast(&b, sizeof b);
        if (!b.ok) {
            if (ds_ep_session_rank() == 0) ds_ep_session_fatal(b.msg);
            ds_ep_session_end(1); /* rank 0 aborts the job */
            exit(1);
        }
        if (be->ep_comm_init(be, b.id, b.n, ds_ep_session_rank(), ds_ep_session_size(), &err))
            ds_ep_session_fatal(err.msg);
        ds_ep_set_transport(ep, "NCCL");
    }
    if (ds_ep_session_rank() == 0) {
        uint64_t ex, rest;
        ds_model_expert_bytes(m, 0, &ex, &rest);
        fprintf(stderr, "dsv4 %s: expert parallel over %d ranks: %.1f MiB replicated on each (dense, shared "
                "experts, head); routed experts per rank (MiB):", cmd, ds_ep_session_size(), (double)rest / (1 << 20));
        for (int r = 0; r < ds_ep_session_size(); r++) {
            ds_model_expert_bytes(m, r, &ex, &rest);
            fprintf(stderr, " %.1f", (double)ex / (1 << 20));
        }
        fprintf(stderr, "; exchange: %s; attention: %s\n",
                ds_ep_transport(ep) ? "NCCL, device to device" : "MPI through host memory",
                ds_ep_dp(ep) ? "data parallel (each sequence on one rank)" : "replicated on every rank");
        return 0;
    }
    int frc = ds_ep_follow(m, be);
    ds_model_unbind(m);
    ds_model_set_ep(m, NULL);
    ds_ep_free(ep);
    ds_backend_close(be);
    exit(ds_ep_session_end(frc));
}

int cli_bind(const char *cmd, ds_model *m, const ds_backend_opts *o, ds_backend *be) {
    ds_err err;
    if (ds_ep_session_size() > 1) return bind_ranks(cmd, m, o, be);
    if (ds_backend_open(o, be, &err) || ds_model_bind(m, be, &err)) {
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
        ds_model_unbind(m);
        ds_backend_close(be);
        return -1;
    }
    return 0;
}
