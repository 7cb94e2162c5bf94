/* placement.c — which ranks serve each routed expert (ep/ep.h): round
 * robin, a placement file, or by measured load with redundant replicas
 * (EPLB). Plain data: no MPI here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"

void ds_placement_free(ds_placement *p) {
    free(p->n_rep);
    free(p->rep);
    memset(p, 0, sizeof *p);
}

int ds_placement_holds(const ds_placement *p, int rank, int l, int e) {
    size_t le = (size_t)l * p->experts + e;
    for (int r = 0; r < p->n_rep[le]; r++)
        if (p->rep[le * p->max_rep + r] == rank) return 1;
    return 0;
}

void ds_placement_assign(const ds_placement *p, int l, const int32_t *idx, int n_pairs, int *owner) {
    /* owner doubles as the per-expert counter: experts are < E, pairs use
     * the running count of their expert, kept in a small table */
    int E = p->experts;
    int stack_seen[512], *seen = E <= 512 ? stack_seen : calloc((size_t)E, sizeof *seen);
    if (!seen) { /* out of memory: the first replica (still a valid, deterministic choice) */
        for (int i = 0; i < n_pairs; i++) owner[i] = p->rep[((size_t)l * E + idx[i]) * p->max_rep];
        return;
    }
    if (seen == stack_seen) memset(seen, 0, (size_t)E * sizeof *seen);
    for (int i = 0; i < n_pairs; i++) {
        size_t le = (size_t)l * E + idx[i];
        owner[i] = p->rep[le * p->max_rep + seen[idx[i]]++ % p->n_rep[le]];
    }
    if (seen != stack_seen) free(seen);
}

static int alloc_placement(ds_placement *p, int ranks, int layers, int experts, int max_rep, ds_err *err) {
    memset(p, 0, sizeof *p);
    p->ranks = ranks, p->layers = layers, p->experts = experts, p->max_rep = max_rep;
    size_t n = (size_t)layers * experts;
    p->n_rep = calloc(n + 1, sizeof *p->n_rep);
    p->rep = calloc(n * (size_t)max_rep + 1, sizeof *p->rep);
    if (!p->n_rep || !p->rep) {
        ds_placement_free(p);
        return ds_fail(err, "out of memory for the expert placement");
    }
    return 0;
}

int ds_load_read(const char *path, int layers, int experts, double *load, ds_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ds_fail(err, "expert load file %s: %s", path, strerror(errno));
    memset(load, 0, (size_t)layers * experts * sizeof *load);
    char line[512];
    int ln = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *h = strchr(line, '#');
        if (h) *h = 0;
        long L, e;
        double c;
        char extra[2];
        int k = sscanf(line, "%ld %ld %lf %1s", &L, &e, &c, extra);
        if (k <= 0) continue;
        if (k != 3 || L < 0 || L >= layers || e < 0 || e >= experts || !(c >= 0)) {
            fclose(f);
            return ds_fail(err,
                           "expert load file %s line %d: expected 'LAYER EXPERT COUNT' with LAYER in [0, %d), "
                           "EXPERT in [0, %d), COUNT >= 0",
                           path, ln, layers, experts);
        }
        load[(size_t)L * experts + e] += c;
        n++;
    }
    fclose(f);
    if (!n) return ds_fail(err, "expert load file %s: no 'LAYER EXPERT COUNT' line", path);
    return 0;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Placement file: lines "LAYER EXPERT RANK [RANK ...]", LAYER a number or
 * '*' (every layer; a numbered line for the same expert overrides it). */
static int read_file(ds_placement *p, const char *path, ds_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ds_fail(err, "placement file %s: %s", path, strerror(errno));
    int L = p->layers, E = p->experts, R = p->ranks;
    unsigned char *set = calloc((size_t)L * E + 1, 1); /* 1: from '*', 2: from a numbered line */
    if (!set) {
        fclose(f);
        return ds_fail(err, "out of memory");
    }
    char line[4096];
    int ln = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        char *h = strchr(line, '#');
        if (h) *h = 0;
        char *save = NULL, *tk = strtok_r(line, " \t\r\n", &save);
        if (!tk) continue;
        int all = !strcmp(tk, "*");
        char *end;
        long layer = all ? 0 : strtol(tk, &end, 10);
        if (!all && (*end || layer < 0 || layer >= L)) {
            rc =
                ds_fail(err, "placement file %s line %d: layer '%s' is not '*' or a layer in [0, %d)", path, ln, tk, L);
            break;
        }
        tk = strtok_r(NULL, " \t\r\n", &save);
        long e = tk ? strtol(tk, &end, 10) : -1;
        if (!tk || *end || e < 0 || e >= E) {
            rc = ds_fail(err, "placement file %s line %d: expert '%s' is not in [0, %d)", path, ln, tk ? tk : "", E);
            break;
        }
        int ranks[64], n = 0;
        while ((tk = strtok_r(NULL, " \t\r\n", &save))) {
            long r = strtol(tk, &end, 10);
            if (*end || r < 0 || r >= R) {
                rc = ds_fail(err, "placement file %s line %d: rank '%s' is not in [0, %d) (the job has %d ranks)", path,
                             ln, tk, R, R);
                break;
            }
            for (int i = 0; i < n; i++)
                if (ranks[i] == r) rc = ds_fail(err, "placement file %s line %d: rank %ld twice", path, ln, r);
            if (rc) break;
            if (n == p->max_rep || n == 64) {
                rc = ds_fail(err, "placement file %s line %d: more replicas than ranks", path, ln);
                break;
            }
            ranks[n++] = (int)r;
        }
        if (rc) break;
        if (!n) {
            rc = ds_fail(err, "placement file %s line %d: expert %ld has no rank", path, ln, e);
            break;
        }
        qsort(ranks, (size_t)n, sizeof *ranks, cmp_int);
        for (int l = all ? 0 : (int)layer; l < (all ? L : (int)layer + 1); l++) {
            size_t le = (size_t)l * E + e;
            if (set[le] == (all ? 1 : 2)) {
                rc = ds_fail(err, "placement file %s line %d: layer %d expert %ld placed twice", path, ln, l, e);
                break;
            }
            if (all && set[le] == 2) continue;
            set[le] = all ? 1 : 2;
            p->n_rep[le] = n;
            memcpy(p->rep + le * p->max_rep, ranks, (size_t)n * sizeof *ranks);
        }
    }
    fclose(f);
    for (int l = 0; !rc && l < L; l++)
        for (int e = 0; e < E; e++)
            if (!set[(size_t)l * E + e]) {
                rc = ds_fail(err, "placement file %s: layer %d expert %d has no rank", path, l, e);
                break;
            }
    free(set);
    return rc;
}

/* EPLB on one layer: replicate the experts with the highest load per
 * replica, then place replicas heaviest first on the least loaded rank that
 * has room and does not hold that expert yet (ties: lower expert, lower
 * rank). */
typedef struct {
    double w;
    int e;
} item;

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->e - y->e;
}

static int balance_layer(ds_placement *p, int l, const double *load, int extra, ds_err *err) {
    int E = p->experts, R = p->ranks, n = E + extra;
    int *nrep = p->n_rep + (size_t)l * E, *rep = p->rep + (size_t)l * E * p->max_rep;
    item *it = malloc((size_t)n * sizeof *it);
    double *rw = calloc((size_t)R, sizeof *rw);
    int *cnt = calloc((size_t)R, sizeof *cnt);
    if (!it || !rw || !cnt) {
        free(it), free(rw), free(cnt);
        return ds_fail(err, "out of memory");
    }
    for (int e = 0; e < E; e++) nrep[e] = 1;
    for (int x = 0; x < extra; x++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (nrep[e] < R && (best < 0 || load[e] / nrep[e] > load[best] / nrep[best])) best = e;
        if (best < 0) break;
        nrep[best]++;
    }
    n = 0;
    for (int e = 0; e < E; e++)
        for (int r = 0; r < nrep[e]; r++) it[n++] = (item){load[e] / nrep[e], e};
    qsort(it, (size_t)n, sizeof *it, cmp_item);
    int cap = (n + R - 1) / R;
    for (int e = 0; e < E; e++) nrep[e] = 0;
    for (int i = 0; i < n; i++) {
        int e = it[i].e, best = -1;
        for (int pass = 0; pass < 2 && best < 0; pass++) /* pass 1: ignore the room */
            for (int r = 0; r < R; r++) {
                int held = 0;
                for (int j = 0; j < nrep[e]; j++) held |= rep[(size_t)e * p->max_rep + j] == r;
                if (held || (!pass && cnt[r] >= cap)) continue;
                if (best < 0 || rw[r] < rw[best]) best = r;
            }
        rep[(size_t)e * p->max_rep + nrep[e]++] = best;
        rw[best] += it[i].w;
        cnt[best]++;
    }
    for (int e = 0; e < E; e++) qsort(rep + (size_t)e * p->max_rep, (size_t)nrep[e], sizeof *rep, cmp_int);
    free(it), free(rw), free(cnt);
    return 0;
}

int ds_placement_build(ds_placement *p, int ranks, int layers, int experts, const ds_ep_opts *o, ds_err *err) {
    ds_ep_opts none = {NULL, 0, NULL, DS_EP_ATT_DP};
    if (!o) o = &none;
    if (ranks < 1) return ds_fail(err, "expert placement: %d ranks", ranks);
    if (o->redundant < 0 || o->redundant > experts * (ranks - 1))
        return ds_fail(err, "--redundant-experts %d: must be in [0, %d] (%d experts, %d ranks)", o->redundant,
                       experts * (ranks - 1), experts, ranks);
    if (o->placement && (o->load || o->redundant))
        return ds_fail(err, "a placement file and --expert-load / --redundant-experts exclude each other");
    if (o->redundant && !o->load)
        return ds_fail(err, "--redundant-experts needs --expert-load FILE (written by dsv4 stats --load-out)");
    if (alloc_placement(p, ranks, layers, experts, ranks, err)) return -1;
    int rc = 0;
    if (o->placement) {
        rc = read_file(p, o->placement, err);
    } else if (o->load) {
        double *load = malloc((size_t)layers * experts * sizeof *load + 1);
        rc = load ? ds_load_read(o->load, layers, experts, load, err) : ds_fail(err, "out of memory");
        for (int l = 0; !rc && l < layers; l++) rc = balance_layer(p, l, load + (size_t)l * experts, o->redundant, err);
        free(load);
    } else {
        for (int l = 0; l < layers; l++)
            for (int e = 0; e < experts; e++) {
                p->n_rep[(size_t)l * experts + e] = 1;
                p->rep[((size_t)l * experts + e) * p->max_rep] = e % ranks;
            }
    }
    if (rc) ds_placement_free(p);
    return rc;
}
