/* bind.c — a loaded model's weights and constants into a backend's memory
 * (see ds_model_bind in model.h). */
#include <stdlib.h>

#include "ep/ep.h"
#include "model/model.h"
#include "model/store.h"

/* Every pointer the forward pass reads, with its size in bytes and what it
 * holds (an MXFP4 matrix's codes, which a backend may reorder, or bytes);
 * w: the weight whose data ptr is, else NULL. */
typedef void (*visit_fn)(void *ctx, const void **ptr, size_t bytes, ds_map_what what, ds_weight *w);

static void weight(const ds_weight *cw, visit_fn fn, void *ctx) {
    ds_weight *w = (ds_weight *)cw;
    size_t sb = (size_t)ds_weight_scale_bytes(w);
    fn(ctx, (const void **)&w->data, (size_t)ds_weight_bytes(w) - sb,
       w->kind == DS_W_FP4 ? DS_MAP_FP4_CODES : DS_MAP_BYTES, w);
    if (sb) fn(ctx, (const void **)&w->scale, sb, DS_MAP_BYTES, NULL);
}

static void floats(float **p, size_t n, visit_fn fn, void *ctx) {
    fn(ctx, (const void **)p, n * sizeof(float), DS_MAP_BYTES, NULL);
}

static void hc(ds_hc_w *h, size_t rows, size_t nscale, visit_fn fn, void *ctx) {
    weight(&h->fn, fn, ctx);
    floats(&h->base, rows, fn, ctx);
    floats(&h->scale, nscale, fn, ctx);
}

static void comp(ds_compressor_w *w, visit_fn fn, void *ctx) {
    weight(&w->wkv, fn, ctx);
    weight(&w->wgate, fn, ctx);
    floats(&w->ape, (size_t)w->ratio * (size_t)(w->overlap ? 2 : 1) * (size_t)w->d, fn, ctx);
    floats(&w->norm, (size_t)w->d, fn, ctx);
}

/* One layer's weights; li: its index (the MTP layer's: n_layers, which no
 * placement holds: it is walked without expert parallelism only). */
static void walk_layer(ds_model *m, ds_layer *ly, int li, visit_fn fn, void *ctx) {
    const ds_config *c = &m->cfg;
    size_t n = (size_t)c->hc_mult, D = (size_t)c->dim, E = (size_t)c->n_routed_experts;
    floats(&ly->attn_norm, D, fn, ctx);
    floats(&ly->ffn_norm, D, fn, ctx);
    hc(&ly->hc_attn, (2 + n) * n, 3, fn, ctx);
    hc(&ly->hc_ffn, (2 + n) * n, 3, fn, ctx);
    weight(&ly->wq_a, fn, ctx);
    weight(&ly->wq_b, fn, ctx);
    weight(&ly->wkv, fn, ctx);
    weight(&ly->wo_a, fn, ctx);
    weight(&ly->wo_b, fn, ctx);
    floats(&ly->q_norm, (size_t)c->q_lora_rank, fn, ctx);
    floats(&ly->kv_norm, (size_t)c->head_dim, fn, ctx);
    floats(&ly->attn_sink, (size_t)c->n_heads, fn, ctx);
    if (ly->ratio) comp(&ly->comp, fn, ctx);
    if (ly->is_csa) {
        weight(&ly->idx.wq_b, fn, ctx);
        weight(&ly->idx.weights_proj, fn, ctx);
        comp(&ly->idx.comp, fn, ctx);
    }
    weight(&ly->gate, fn, ctx);
    if (ly->is_hash)
        fn(ctx, (const void **)&ly->tid2eid, (size_t)c->vocab_size * (size_t)c->n_active_experts * sizeof(int32_t),
           DS_MAP_BYTES, NULL);
    else
        floats(&ly->gate_bias, E, fn, ctx);
    for (size_t e = 0; e < E; e++) {
        if (m->ep && !ds_placement_holds(ds_ep_placement(m->ep), ds_ep_rank(m->ep), li, (int)e)) continue;
        if (m->store && li < c->n_layers) continue; /* the store's (its slots, or host memory) */
        weight(&ly->w1[e], fn, ctx);
        weight(&ly->w2[e], fn, ctx);
        weight(&ly->w3[e], fn, ctx);
    }
    if (c->n_shared_experts > 0) {
        weight(&ly->sw1, fn, ctx);
        weight(&ly->sw2, fn, ctx);
        weight(&ly->sw3, fn, ctx);
    }
}

static void walk(ds_model *m, visit_fn fn, void *ctx) {
    const ds_config *c = &m->cfg;
    size_t n = (size_t)c->hc_mult, D = (size_t)c->dim;
    weight(&m->embed, fn, ctx);
    weight(&m->head, fn, ctx);
    floats(&m->norm, D, fn, ctx);
    hc(&m->hc_head, n, 1, fn, ctx);
    floats(&m->inv_freq_main, (size_t)c->rope_dim / 2, fn, ctx);
    floats(&m->inv_freq_compress, (size_t)c->rope_dim / 2, fn, ctx);
    for (int li = 0; li < c->n_layers; li++) walk_layer(m, &m->layers[li], li, fn, ctx);
    if (m->mtp && m->bind_mtp && !m->ep) { /* the MTP block (asked for; not under expert parallelism) */
        ds_mtp *t = m->mtp;
        floats(&t->enorm, D, fn, ctx);
        floats(&t->hnorm, D, fn, ctx);
        floats(&t->norm, D, fn, ctx);
        weight(&t->e_proj, fn, ctx);
        weight(&t->h_proj, fn, ctx);
        hc(&t->hc_head, n, 1, fn, ctx);
        walk_layer(m, &t->layer, c->n_layers, fn, ctx);
    }
}

typedef struct {
    ds_model *m;
    int n, rc;
    ds_err *err;
} bind_ctx;

static void count(void *ctx, const void **ptr, size_t bytes, ds_map_what what, ds_weight *w) {
    (void)ptr, (void)bytes, (void)what, (void)w;
    ((bind_ctx *)ctx)->n++;
}

/* Maps ptr; a weight the model multiplies (all but the embedding, whose
 * rows are read as they are) then goes to the backend's pack_weight. */
static void map(void *ctx, const void **ptr, size_t bytes, ds_map_what what, ds_weight *w) {
    bind_ctx *B = ctx;
    if (B->rc) return;
    const ds_backend *be = B->m->be;
    const void *dev = NULL;
    if (be->map_weights(be, *ptr, bytes, what, &dev, B->err)) {
        B->rc = -1;
        return;
    }
    B->m->host_ptrs[B->n++] = *ptr;
    *ptr = dev;
    if (w && w != &B->m->embed && be->pack_weight && be->pack_weight(be, w, B->err)) B->rc = -1;
}

static void unmap(void *ctx, const void **ptr, size_t bytes, ds_map_what what, ds_weight *w) {
    bind_ctx *B = ctx;
    (void)bytes, (void)what;
    if (B->n >= B->m->n_host_ptrs) return; /* not mapped (a bind that failed part way) */
    if (w && w->packed && B->m->be->release_weight) B->m->be->release_weight(B->m->be, w);
    B->m->be->unmap_weights(B->m->be, *ptr);
    *ptr = B->m->host_ptrs[B->n++];
}

void ds_model_unbind(ds_model *m) {
    if (!m->be) return;
    ds_store_unbind(m->store);
    free(m->mtp_model);
    m->mtp_model = NULL;
    if (m->rs) {
        ds_runstate_free(m->rs);
        free(m->rs);
    }
    bind_ctx B = {m, 0, 0, NULL};
    if (m->host_ptrs) walk(m, unmap, &B);
    free(m->host_ptrs);
    m->host_ptrs = NULL;
    m->n_host_ptrs = 0;
    m->rs = NULL;
    m->be = NULL;
}

void ds_model_set_ep(ds_model *m, struct ds_ep *ep) { m->ep = ep; }

typedef struct {
    uint64_t bytes;
} sum_ctx;

static void sum_bytes(void *ctx, const void **ptr, size_t bytes, ds_map_what what, ds_weight *w) {
    (void)ptr, (void)what, (void)w;
    ((sum_ctx *)ctx)->bytes += bytes;
}

static void sum_packed(void *ctx, const void **ptr, size_t bytes, ds_map_what what, ds_weight *w) {
    (void)ptr, (void)bytes, (void)what;
    if (w && w->packed) ((sum_ctx *)ctx)->bytes += w->packed_bytes;
}

uint64_t ds_model_packed_bytes(const ds_model *m) {
    sum_ctx all = {0};
    walk((ds_model *)m, sum_packed, &all);
    return all.bytes;
}

static uint64_t experts_of(const ds_model *m, int rank) {
    uint64_t ex = 0;
    const ds_config *c = &m->cfg;
    for (int li = 0; li < c->n_layers; li++)
        for (int e = 0; e < c->n_routed_experts; e++) {
            if (m->ep && !ds_placement_holds(ds_ep_placement(m->ep), rank, li, e)) continue;
            const ds_layer *ly = &m->layers[li];
            ex += ds_weight_bytes(&ly->w1[e]) + ds_weight_bytes(&ly->w2[e]) + ds_weight_bytes(&ly->w3[e]);
        }
    return ex;
}

void ds_model_expert_bytes(const ds_model *m, int rank, uint64_t *experts, uint64_t *rest) {
    sum_ctx all = {0};
    walk((ds_model *)m, sum_bytes, &all); /* this rank's: the dense weights and its experts */
    /* the walk leaves out the experts of other ranks, or all of them when a store holds them */
    *rest = all.bytes - (m->store ? 0 : experts_of(m, m->ep ? ds_ep_rank(m->ep) : 0));
    *experts = experts_of(m, rank);
}

int ds_model_bind(ds_model *m, const ds_backend *be, ds_err *err) {
    if (m->be) return ds_fail(err, "%s: the model is already bound to the %s backend", m->path, m->be->name);
    if (m->ep && (!be->moe_experts || !be->moe_combine))
        return ds_fail(err, "%s: the %s backend has no expert-parallel MoE (moe_experts / moe_combine)", m->path,
                       be->name);
    bind_ctx B = {m, 0, 0, err};
    walk(m, count, &B);
    m->host_ptrs = malloc((size_t)(B.n ? B.n : 1) * sizeof *m->host_ptrs);
    m->rs = calloc(1, sizeof *m->rs);
    if (!m->host_ptrs || !m->rs) {
        free(m->host_ptrs);
        free(m->rs);
        m->host_ptrs = NULL;
        m->rs = NULL;
        return ds_fail(err, "out of memory");
    }
    m->be = be;
    m->rs->be = be;
    m->rs->ep = m->ep != NULL || m->store != NULL; /* the MoE in two halves */
    B.n = 0;
    walk(m, map, &B);
    m->n_host_ptrs = B.n;
    if (B.rc) {
        ds_model_unbind(m);
        return ds_fail_prefix(err, "%s: uploading the weights to the %s backend", m->path, be->name);
    }
    if (m->store && ds_store_bind(m->store, err)) {
        ds_model_unbind(m);
        return -1;
    }
    if (m->mtp && m->bind_mtp && !m->ep) { /* the MTP block as a one-layer model (model.h) */
        ds_model *t = malloc(sizeof *t);
        if (!t) {
            ds_model_unbind(m);
            return ds_fail(err, "out of memory");
        }
        *t = *m;
        t->cfg.n_layers = 1;
        t->cfg.n_hash_layers = 0;
        t->cfg.compress_ratio[0] = 0;
        t->layers = &m->mtp->layer;
        t->norm = m->mtp->norm;
        t->hc_head = m->mtp->hc_head;
        t->mtp = NULL;
        t->mtp_model = NULL;
        t->store = NULL; /* its experts are bound (the store holds the main layers') */
        t->mtp_of = m;
        t->host_ptrs = NULL, t->n_host_ptrs = 0;
        m->mtp_model = t;
    }
    return 0;
}
