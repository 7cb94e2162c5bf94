/* model_load.c — see model_load.h. `-m synth:NAME[:LAYERS[:R]]`: the
 * random-weight checkpoint `dsv4 synth --like NAME [--layers LAYERS]` writes
 * (seed 1, FP8 + MXFP4), written to /dev/shm (else $TMPDIR, /tmp), loaded
 * (mmap) and its files removed at once: the model lives in memory only. Under
 * expert parallelism a rank writes only the routed experts it serves; the
 * others are holes of sparse files, never memory (ep/ep.h). With R, the
 * routed experts of layer l are layer (l mod R)'s bytes: the layers above R
 * leave theirs as holes and read those, so the model's full expert bytes
 * are moved and computed from R layers' worth of memory (a V4-Flash of 43
 * layers with R = 4 holds 13 GB of experts instead of 147). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ep/ep.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/model_load.h"

typedef struct {
    ds_placement pl;
    int rank, ep; /* ep: expert parallel (skip the experts of other ranks) */
    int share;    /* R of synth:NAME:LAYERS:R (0: none): the experts of layers >= R are holes */
} synth_skip;

/* A routed expert this rank does not serve, or of a layer that shares an
 * earlier one's, stays a hole. */
static int skip_expert(void *ctx, const char *name) {
    const synth_skip *k = ctx;
    int l, e, n = 0;
    if (sscanf(name, "layers.%d.ffn.experts.%d.%n", &l, &e, &n) != 2 || !n) return 0;
    if (k->share > 0 && l >= k->share) return 1;
    return k->ep && l >= 0 && l < k->pl.layers && e >= 0 && e < k->pl.experts &&
           !ds_placement_holds(&k->pl, k->rank, l, e);
}

/* The directory is this process's own (its name holds the pid). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[2048];
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    if (d) closedir(d);
    rmdir(dir);
}

/* Where this process writes its model: the first of /dev/shm, $TMPDIR, /tmp
 * with room for it beside the host's other ranks writing theirs (each rank
 * writes its own share, the same size give or take an expert), else an error
 * naming the need. */
static int pick_dir(const char *name, uint64_t bytes, char *dir, size_t cap, ds_err *err) {
    const char *tmp = getenv("TMPDIR");
    const char *cand[3] = {"/dev/shm", tmp && *tmp ? tmp : NULL, "/tmp"};
    int local = ds_ep_session_local_size() > 0 ? ds_ep_session_local_size() : 1;
    double need = ((double)bytes + (64 << 20)) * local, room[3] = {0};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        struct statvfs fs;
        if (!cand[i] || stat(cand[i], &st) || !S_ISDIR(st.st_mode) || access(cand[i], W_OK) || statvfs(cand[i], &fs))
            continue;
        room[i] = (double)fs.f_bavail * (double)fs.f_frsize;
        if (room[i] >= need) {
            snprintf(dir, cap, "%s/dsv4-synth-%s-%ld", cand[i], name, (long)getpid());
            return 0;
        }
    }
    return ds_fail(err,
                   "%.1f GB to write (%d rank%s on this host) do not fit: /dev/shm has %.1f GB free, TMPDIR %.1f, "
                   "/tmp %.1f (fewer layers, more ranks or TMPDIR set to a larger file system)",
                   need / 1e9, local, local > 1 ? "s" : "", room[0] / 1e9, room[1] / 1e9, room[2] / 1e9);
}

/* spec: NAME[:LAYERS[:R]]; *share: R (0 without) */
static int synth_config(const char *spec, char *name, size_t cap, ds_config *cfg, int *share, ds_err *err) {
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    long layers = -1, r = 0;
    *share = 0;
    if (n >= cap) return ds_fail(err, "synth:%s: unknown shape", spec);
    if (colon) {
        char *end;
        layers = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || (*end && *end != ':') || layers < 1 || layers > DS_MAX_LAYERS)
            return ds_fail(err, "synth:%s: layers '%s' is not an integer in [1, %d]", spec, colon + 1, DS_MAX_LAYERS);
        if (*end == ':') {
            const char *rs = end + 1;
            r = strtol(rs, &end, 10);
            if (end == rs || *end || r < 1 || r > layers)
                return ds_fail(err, "synth:%s: expert layers '%s' is not an integer in [1, %ld] (the layers)", spec, rs,
                               layers);
        }
    }
    *share = (int)r;
    memcpy(name, spec, n);
    name[n] = 0;
    if (ds_synth_like(name, cfg, err)) return ds_fail_prefix(err, "synth:%s", spec);
    if (layers > 0) {
        cfg->n_layers = (int)layers;
        if (cfg->n_hash_layers > cfg->n_layers) cfg->n_hash_layers = cfg->n_layers;
    }
    return 0;
}

static int load_synth(const char *spec, ds_model **out, ds_err *err) {
    *out = NULL;
    char name[64];
    ds_config cfg;
    int share;
    if (synth_config(spec, name, sizeof name, &cfg, &share, err)) return -1;
    if (share && ds_ep_session_size() > 1)
        return ds_fail(err, "synth:%s: shared expert layers are for one process (expert tiers), not mpirun", spec);
    synth_skip k = {{0, 0, 0, 0, NULL, NULL}, ds_ep_session_rank(), ds_ep_session_size() > 1, share};
    if (ds_placement_build(&k.pl, ds_ep_session_size(), cfg.n_layers, cfg.n_routed_experts, ds_ep_session_opts(), err))
        return -1;
    /* progress on a terminal, from the first rank only */
    ds_synth_opts so = {1, 1, (uint64_t)4 << 30, ds_ep_session_rank() == 0 && isatty(2), 0};
    int (*skip)(void *, const char *) = k.ep || share ? skip_expert : NULL;
    char dir[1200];
    if (pick_dir(name, ds_synth_bytes(&cfg, &so, skip, &k), dir, sizeof dir, err)) {
        ds_placement_free(&k.pl);
        return ds_fail_prefix(err, "synth:%s", spec);
    }
    int rc = ds_synth_write_only(&cfg, &so, dir, skip, &k, err);
    ds_placement_free(&k.pl);
    if (!rc) rc = ds_model_load(dir, out, err);
    remove_dir(dir); /* the model maps the shards: their pages stay */
    if (rc) return ds_fail_prefix(err, "synth:%s", spec);
    for (int li = share; share && li < cfg.n_layers; li++) { /* the holes read the shared layer's bytes */
        ds_layer *ly = &(*out)->layers[li];
        const ds_layer *src = &(*out)->layers[li % share];
        for (int e = 0; e < cfg.n_routed_experts; e++) {
            ds_weight *w[3] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            const ds_weight *s[3] = {&src->w1[e], &src->w2[e], &src->w3[e]};
            for (int q = 0; q < 3; q++) w[q]->data = s[q]->data, w[q]->scale = s[q]->scale;
        }
    }
    snprintf((*out)->path, sizeof(*out)->path, "synth:%s", spec);
    return 0;
}

int ds_load_model(const char *dir, const ds_load_opts *lo, ds_model **out, ds_err *err) {
    if (!strncmp(dir, "synth:", 6)) return load_synth(dir + 6, out, err);
    return ds_model_load_with(dir, lo, out, err);
}

int ds_load_config(const char *dir, ds_config *cfg, ds_err *err) {
    char name[64], path[4200];
    int share;
    if (!strncmp(dir, "synth:", 6)) return synth_config(dir + 6, name, sizeof name, cfg, &share, err);
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return ds_fail(err, "%s: path too long", dir);
    return ds_config_load(path, cfg, err);
}
