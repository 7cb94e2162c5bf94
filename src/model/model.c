/* model.c — loading a DeepSeek-V4 checkpoint into a ds_model: every tensor
 * the forward pass reads is looked up by its official name and checked. */
#include "model/model.h"
#include "model/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/rope.h"

typedef struct loader {
    ds_model *m;
    ds_err *err;
    char name[512];
    unsigned char *used; /* per checkpoint tensor (name order): read by the loader */
    int optional;        /* 1: a missing tensor sets `absent` (and `missing`) instead of failing */
    int absent;
    char missing[600];
} loader;

/* In optional mode, whether `name` is absent (then recorded, and the caller
 * returns -1 with no error message). */
static int gone(loader *L, const char *name) {
    if (!L->optional || ds_checkpoint_find(L->m->ck, name)) return 0;
    L->absent = 1;
    snprintf(L->missing, sizeof L->missing, "%s", name);
    return 1;
}

/* Marks the tensor `name` as used (absent names are ignored). */
static void mark(loader *L, const char *name) {
    const ds_tensor *t = ds_checkpoint_find(L->m->ck, name), *t0 = ds_checkpoint_at(L->m->ck, 0);
    if (t && t0 && L->used) L->used[t - t0] = 1;
}

static void mark_weight(loader *L, const ds_weight *w, const char *prefix) {
    mark(L, w->name);
    if (w->scale) {
        char sn[600];
        snprintf(sn, sizeof sn, "%s.scale", prefix);
        mark(L, sn);
    }
}

/* Every tensor of the checkpoint but the MTP ones (mtp.*) must be read by the
 * model the config describes: a config with fewer layers or experts than the
 * checkpoint would otherwise run a truncated model silently. */
static int check_unused(loader *L) {
    const ds_checkpoint *ck = L->m->ck;
    int n = ds_checkpoint_count(ck), unused = 0;
    char list[400] = "";
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const ds_tensor *t = ds_checkpoint_at(ck, i);
        if (L->used[i] || !strncmp(t->name, "mtp.", 4)) continue;
        if (unused < 3 && off < sizeof list)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s'%s'", unused ? ", " : "", t->name);
        unused++;
    }
    if (!unused) return 0;
    const ds_config *c = &L->m->cfg;
    return ds_fail(L->err,
                   "%d tensor%s not used by the model config.json describes (num_hidden_layers %d, "
                   "n_routed_experts %d, n_shared_experts %d): %s%s (does the config match the checkpoint?)",
                   unused, unused == 1 ? " is" : "s are", c->n_layers, c->n_routed_experts, c->n_shared_experts, list,
                   unused > 3 ? ", ..." : "");
}

static const char *nm(loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *nm(loader *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->name, sizeof L->name, fmt, ap);
    va_end(ap);
    return L->name;
}

static int wt(loader *L, ds_weight *w, int rows, int cols, unsigned allow) {
    char wn[600];
    snprintf(wn, sizeof wn, "%s.weight", L->name);
    if (gone(L, wn)) return -1;
    if (ds_weight_get(L->m->ck, L->name, rows, cols, allow, w, L->err)) return -1;
    mark_weight(L, w, L->name);
    L->m->weight_bytes += ds_weight_bytes(w);
    L->m->n_tensors_used += w->scale ? 2 : 1;
    return 0;
}

static int vec(loader *L, float **out, int ndim, int64_t a, int64_t b) {
    int64_t shape[2] = {a, b};
    if (gone(L, L->name)) return -1;
    if (ds_tensor_to_f32(L->m->ck, L->name, ndim, shape, out, L->err)) return -1;
    mark(L, L->name);
    L->m->weight_bytes += (uint64_t)(ndim == 1 ? a : a * b) * 4;
    L->m->n_tensors_used++;
    return 0;
}

static int hc(loader *L, ds_hc_w *h, const char *prefix, int rows, int nscale) {
    const ds_config *c = &L->m->cfg;
    if (gone(L, nm(L, "%s_fn", prefix))) return -1;
    if (ds_weight_get_named(L->m->ck, nm(L, "%s_fn", prefix), rows, c->hc_mult * c->dim, &h->fn, L->err)) return -1;
    mark(L, L->name);
    L->m->weight_bytes += ds_weight_bytes(&h->fn);
    L->m->n_tensors_used++;
    nm(L, "%s_base", prefix);
    if (vec(L, &h->base, 1, rows, 0)) return -1;
    nm(L, "%s_scale", prefix);
    return vec(L, &h->scale, 1, nscale, 0);
}

static int compressor(loader *L, ds_compressor_w *cw, const char *prefix, int ratio, int d, int overlap) {
    const ds_config *c = &L->m->cfg;
    int cd = (overlap ? 2 : 1) * d;
    cw->ratio = ratio;
    cw->d = d;
    cw->overlap = overlap;
    nm(L, "%s.wkv", prefix);
    if (wt(L, &cw->wkv, cd, c->dim, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.wgate", prefix);
    if (wt(L, &cw->wgate, cd, c->dim, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.ape", prefix);
    if (vec(L, &cw->ape, 2, ratio, cd)) return -1;
    nm(L, "%s.norm.weight", prefix);
    return vec(L, &cw->norm, 1, d, 0);
}

static int load_tid2eid(loader *L, ds_layer *ly, const char *pfx, int li) {
    const ds_config *c = &L->m->cfg;
    const ds_tensor *t = ds_checkpoint_find(L->m->ck, nm(L, "%s.ffn.gate.tid2eid", pfx));
    if (!t && gone(L, L->name)) return -1;
    if (!t) return ds_fail(L->err, "tensor '%s' is missing (layer %d is a hash layer)", L->name, li);
    if (t->dtype != DS_I64 && t->dtype != DS_I32)
        return ds_fail(L->err, "tensor '%s': dtype %s, expected I64 or I32", L->name, ds_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != c->vocab_size || t->shape[1] != c->n_active_experts)
        return ds_fail(L->err, "tensor '%s': shape must be [%d, %d]", L->name, c->vocab_size, c->n_active_experts);
    size_t n = (size_t)c->vocab_size * (size_t)c->n_active_experts;
    ly->tid2eid = malloc(n * sizeof *ly->tid2eid);
    if (!ly->tid2eid) return ds_fail(L->err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (t->dtype == DS_I64) {
            memcpy(&v, t->data + 8 * i, 8);
        } else {
            int32_t v32;
            memcpy(&v32, t->data + 4 * i, 4);
            v = v32;
        }
        if (v < 0 || v >= c->n_routed_experts)
            return ds_fail(L->err, "tensor '%s': entry %zu (token %zu) = %lld is not an expert id in [0, %d)", L->name,
                           i, i / (size_t)c->n_active_experts, (long long)v, c->n_routed_experts);
        ly->tid2eid[i] = (int32_t)v;
    }
    mark(L, L->name);
    L->m->weight_bytes += t->nbytes;
    L->m->n_tensors_used++;
    return 0;
}

/* The layer at ly whose tensors are named "<pfx>.*" with compress ratio
 * `ratio`; li: its index in the model (the hash layers come first; the MTP
 * block's layer is n_layers). */
static int load_layer_at(loader *L, ds_layer *ly, const char *pfx, int li, int ratio) {
    ds_model *m = L->m;
    const ds_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, d = c->head_dim, hcr = (2 + c->hc_mult) * c->hc_mult;
    ly->ratio = ratio;
    ly->is_csa = ly->ratio == 4;
    ly->is_hash = li < c->n_hash_layers;

    nm(L, "%s.attn_norm.weight", pfx);
    if (vec(L, &ly->attn_norm, 1, D, 0)) return -1;
    nm(L, "%s.ffn_norm.weight", pfx);
    if (vec(L, &ly->ffn_norm, 1, D, 0)) return -1;
    char p[128];
    snprintf(p, sizeof p, "%s.hc_attn", pfx);
    if (hc(L, &ly->hc_attn, p, hcr, 3)) return -1;
    snprintf(p, sizeof p, "%s.hc_ffn", pfx);
    if (hc(L, &ly->hc_ffn, p, hcr, 3)) return -1;

    nm(L, "%s.attn.wq_a", pfx);
    if (wt(L, &ly->wq_a, c->q_lora_rank, D, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.attn.q_norm.weight", pfx);
    if (vec(L, &ly->q_norm, 1, c->q_lora_rank, 0)) return -1;
    nm(L, "%s.attn.wq_b", pfx);
    if (wt(L, &ly->wq_b, H * d, c->q_lora_rank, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.attn.wkv", pfx);
    if (wt(L, &ly->wkv, d, D, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.attn.kv_norm.weight", pfx);
    if (vec(L, &ly->kv_norm, 1, d, 0)) return -1;
    nm(L, "%s.attn.wo_a", pfx);
    if (wt(L, &ly->wo_a, c->o_groups * c->o_lora_rank, H * d / c->o_groups, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.attn.wo_b", pfx);
    if (wt(L, &ly->wo_b, D, c->o_groups * c->o_lora_rank, DS_ALLOW_ANY)) return -1;
    nm(L, "%s.attn.attn_sink", pfx);
    if (vec(L, &ly->attn_sink, 1, H, 0)) return -1;
    if (ly->ratio) {
        snprintf(p, sizeof p, "%s.attn.compressor", pfx);
        if (compressor(L, &ly->comp, p, ly->ratio, d, ly->is_csa)) return -1;
    }
    if (ly->is_csa) {
        nm(L, "%s.attn.indexer.wq_b", pfx);
        if (wt(L, &ly->idx.wq_b, c->index_n_heads * c->index_head_dim, c->q_lora_rank, DS_ALLOW_ANY)) return -1;
        nm(L, "%s.attn.indexer.weights_proj", pfx);
        if (wt(L, &ly->idx.weights_proj, c->index_n_heads, D, DS_ALLOW_ANY)) return -1;
        snprintf(p, sizeof p, "%s.attn.indexer.compressor", pfx);
        if (compressor(L, &ly->idx.comp, p, ly->ratio, c->index_head_dim, 1)) return -1;
    }

    int E = c->n_routed_experts, I = c->moe_inter_dim, IS = c->moe_inter_dim * (c->n_shared_experts > 1 ? c->n_shared_experts : 1);
    nm(L, "%s.ffn.gate", pfx);
    if (wt(L, &ly->gate, E, D, DS_ALLOW_ANY)) return -1;
    if (ly->is_hash) {
        if (load_tid2eid(L, ly, pfx, li)) return -1;
    } else {
        nm(L, "%s.ffn.gate.bias", pfx);
        if (vec(L, &ly->gate_bias, 1, E, 0)) return -1;
    }
    ly->w1 = calloc((size_t)E, sizeof *ly->w1);
    ly->w2 = calloc((size_t)E, sizeof *ly->w2);
    ly->w3 = calloc((size_t)E, sizeof *ly->w3);
    if (!ly->w1 || !ly->w2 || !ly->w3) return ds_fail(L->err, "out of memory");
    for (int e = 0; e < E; e++) {
        nm(L, "%s.ffn.experts.%d.w1", pfx, e);
        if (wt(L, &ly->w1[e], I, D, DS_ALLOW_ANY)) return -1;
        nm(L, "%s.ffn.experts.%d.w2", pfx, e);
        if (wt(L, &ly->w2[e], D, I, DS_ALLOW_ANY)) return -1;
        nm(L, "%s.ffn.experts.%d.w3", pfx, e);
        if (wt(L, &ly->w3[e], I, D, DS_ALLOW_ANY)) return -1;
    }
    if (c->n_shared_experts > 0) {
        nm(L, "%s.ffn.shared_experts.w1", pfx);
        if (wt(L, &ly->sw1, IS, D, DS_ALLOW_ANY)) return -1;
        nm(L, "%s.ffn.shared_experts.w2", pfx);
        if (wt(L, &ly->sw2, D, IS, DS_ALLOW_ANY)) return -1;
        nm(L, "%s.ffn.shared_experts.w3", pfx);
        if (wt(L, &ly->sw3, IS, D, DS_ALLOW_ANY)) return -1;
    }
    return 0;
}

static int load_layer(loader *L, int li) {
    char pfx[32];
    snprintf(pfx, sizeof pfx, "layers.%d", li);
    return load_layer_at(L, &L->m->layers[li], pfx, li, L->m->cfg.compress_ratio[li]);
}

static void free_layer(ds_layer *ly) {
    free(ly->attn_norm);
    free(ly->ffn_norm);
    free(ly->hc_attn.base);
    free(ly->hc_attn.scale);
    free(ly->hc_ffn.base);
    free(ly->hc_ffn.scale);
    free(ly->q_norm);
    free(ly->kv_norm);
    free(ly->attn_sink);
    free(ly->comp.ape);
    free(ly->comp.norm);
    free(ly->idx.comp.ape);
    free(ly->idx.comp.norm);
    free(ly->gate_bias);
    free(ly->tid2eid);
    free(ly->w1);
    free(ly->w2);
    free(ly->w3);
}

static void free_mtp(ds_mtp *t) {
    if (!t) return;
    free_layer(&t->layer);
    free(t->enorm);
    free(t->hnorm);
    free(t->norm);
    free(t->hc_head.base);
    free(t->hc_head.scale);
    free(t);
}

/* The MTP block (doc §3.7): mtp.0.{enorm,hnorm,norm}.weight, e_proj, h_proj,
 * hc_head_{fn,base,scale} and one V4 layer named mtp.0.* (sliding window
 * only, routed by its gate). A block with any tensor missing is not loaded
 * (m->mtp stays NULL, m->mtp_off names the first missing tensor); a tensor
 * present with the wrong dtype or shape is an error naming it. */
static int load_mtp(loader *L) {
    ds_model *m = L->m;
    const ds_config *c = &m->cfg;
    if (c->n_mtp < 1) {
        snprintf(m->mtp_off, sizeof m->mtp_off, "num_nextn_predict_layers is 0");
        return 0;
    }
    ds_mtp *t = calloc(1, sizeof *t);
    if (!t) return ds_fail(L->err, "out of memory");
    uint64_t bytes = m->weight_bytes;
    int used = m->n_tensors_used, D = c->dim, rc;
    L->optional = 1;
    L->absent = 0;
    rc = 0;
    nm(L, "mtp.0.enorm.weight");
    rc = rc || vec(L, &t->enorm, 1, D, 0);
    nm(L, "mtp.0.hnorm.weight");
    rc = rc || vec(L, &t->hnorm, 1, D, 0);
    nm(L, "mtp.0.e_proj");
    rc = rc || wt(L, &t->e_proj, D, D, DS_ALLOW_ANY);
    nm(L, "mtp.0.h_proj");
    rc = rc || wt(L, &t->h_proj, D, D, DS_ALLOW_ANY);
    nm(L, "mtp.0.norm.weight");
    rc = rc || vec(L, &t->norm, 1, D, 0);
    rc = rc || hc(L, &t->hc_head, "mtp.0.hc_head", c->hc_mult, 1);
    /* V4's configs list 0 (sliding window only) for the MTP layer after the
     * n_layers entries of compress_ratios; config.c reads the n_layers */
    rc = rc || load_layer_at(L, &t->layer, "mtp.0", c->n_layers, 0);
    L->optional = 0;
    if (rc && L->absent) {
        free_mtp(t);
        m->weight_bytes = bytes, m->n_tensors_used = used;
        snprintf(m->mtp_off, sizeof m->mtp_off, "tensor '%s' is missing", L->missing);
        return 0;
    }
    if (rc) {
        free_mtp(t);
        return ds_fail_prefix(L->err, "MTP block");
    }
    m->mtp = t;
    return 0;
}

int ds_model_load(const char *dir, ds_model **out, ds_err *err) { return ds_model_load_with(dir, NULL, out, err); }

int ds_model_load_with(const char *dir, const ds_load_opts *lo, ds_model **out, ds_err *err) {
    *out = NULL;
    ds_model *m = calloc(1, sizeof *m);
    if (!m) return ds_fail(err, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", dir);
    char cfgpath[1200];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
    if (ds_config_load(cfgpath, &m->cfg, err) || ds_checkpoint_open(dir, &m->ck, err)) {
        ds_model_free(m);
        return -1;
    }
    /* copy-in before the tensors are wired below (they point into the copy) */
    int mode = lo ? lo->mode : DS_LOAD_MMAP;
    if (mode == DS_LOAD_AUTO) {
        uint64_t avail = ds_mem_available();
        mode = avail && ds_checkpoint_bytes(m->ck) + DS_LOAD_RESERVE <= avail ? DS_LOAD_COPY : DS_LOAD_MMAP;
    }
    if (mode == DS_LOAD_COPY && ds_checkpoint_copy_in(m->ck, DS_LOAD_RESERVE, lo ? &lo->progress : NULL, err)) {
        ds_model_free(m);
        return -1;
    }
    const ds_config *c = &m->cfg;
    /* limits of the engine's fixed-size per-token arrays */
    if (c->hc_mult > 64 || c->n_active_experts > 64 || c->n_routed_experts > 4096) {
        ds_fail(err, "%s/config.json: hc_mult %d, num_experts_per_tok %d, n_routed_experts %d exceed what this engine "
                "supports (64, 64, 4096)", dir, c->hc_mult, c->n_active_experts, c->n_routed_experts);
        ds_model_free(m);
        return -1;
    }
    loader L = {m, err, {0}, calloc((size_t)ds_checkpoint_count(m->ck) + 1, 1), 0, 0, {0}};
    if (!L.used) {
        ds_model_free(m);
        return ds_fail(err, "out of memory");
    }
    int n = c->hc_mult;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        free(L.used);
        ds_model_free(m);
        return ds_fail(err, "out of memory");
    }
    int rc = 0;
    nm(&L, "embed");
    rc = rc || wt(&L, &m->embed, c->vocab_size, c->dim, DS_ALLOW_ANY & ~(1u << DS_W_FP4));
    nm(&L, "head");
    rc = rc || wt(&L, &m->head, c->vocab_size, c->dim, DS_ALLOW_ANY);
    nm(&L, "norm.weight");
    rc = rc || vec(&L, &m->norm, 1, c->dim, 0);
    rc = rc || hc(&L, &m->hc_head, "hc_head", n, 1);
    for (int li = 0; !rc && li < c->n_layers; li++) rc = load_layer(&L, li);
    rc = rc || load_mtp(&L);
    rc = rc || check_unused(&L);
    free(L.used);
    L.used = NULL;
    if (!rc) {
        m->inv_freq_main = ds_rope_inv_freq(c, 0);
        m->inv_freq_compress = ds_rope_inv_freq(c, 1);
        if (!m->inv_freq_main || !m->inv_freq_compress) rc = ds_fail(err, "out of memory");
    }
    if (rc) {
        ds_fail_prefix(err, "%s", dir);
        ds_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void ds_model_free(ds_model *m) {
    if (!m) return;
    ds_model_unbind(m);
    ds_store_free(m->store);
    m->store = NULL;
    if (m->layers) {
        for (int li = 0; li < m->cfg.n_layers; li++) free_layer(&m->layers[li]);
        free(m->layers);
    }
    free_mtp(m->mtp);
    free(m->norm);
    free(m->hc_head.base);
    free(m->hc_head.scale);
    free(m->inv_freq_main);
    free(m->inv_freq_compress);
    ds_checkpoint_close(m->ck);
    free(m);
}

uint64_t ds_model_decode_bytes(const ds_model *m) {
    const ds_config *c = &m->cfg;
    uint64_t b = ds_weight_read_bytes(&m->head) + ds_weight_bytes(&m->embed) / (uint64_t)c->vocab_size +
                 ds_weight_read_bytes(&m->hc_head.fn);
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        b += ds_weight_read_bytes(&ly->hc_attn.fn) + ds_weight_read_bytes(&ly->hc_ffn.fn);
        b += ds_weight_read_bytes(&ly->wq_a) + ds_weight_read_bytes(&ly->wq_b) + ds_weight_read_bytes(&ly->wkv) +
             ds_weight_read_bytes(&ly->wo_a) + ds_weight_read_bytes(&ly->wo_b);
        if (ly->ratio) b += ds_weight_read_bytes(&ly->comp.wkv) + ds_weight_read_bytes(&ly->comp.wgate);
        if (ly->is_csa)
            b += ds_weight_read_bytes(&ly->idx.wq_b) + ds_weight_read_bytes(&ly->idx.weights_proj) +
                 ds_weight_read_bytes(&ly->idx.comp.wkv) + ds_weight_read_bytes(&ly->idx.comp.wgate);
        b += ds_weight_read_bytes(&ly->gate);
        if (c->n_shared_experts > 0)
            b += ds_weight_read_bytes(&ly->sw1) + ds_weight_read_bytes(&ly->sw2) + ds_weight_read_bytes(&ly->sw3);
        b += (uint64_t)c->n_active_experts *
             (ds_weight_read_bytes(&ly->w1[0]) + ds_weight_read_bytes(&ly->w2[0]) + ds_weight_read_bytes(&ly->w3[0]));
    }
    return b;
}
