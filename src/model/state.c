/* state.c — see state.h. */
#include "model/state.h"

#include <stdlib.h>

#include "ep/ep.h"

/* Lays out every layer's state from base (NULL: only counts); returns floats. */
static uint64_t layout(const ds_model *m, int64_t max_len, float *base, ds_layer_mem *L) {
    const ds_config *c = &m->cfg;
    uint64_t off = 0;
#define TAKE(ptr, n)                                                          \
    do {                                                                      \
        if (L) ptr = base ? base + off : NULL;                                \
        off += ((uint64_t)(n) + 15) / 16 * 16;                                \
    } while (0)
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        ds_layer_mem dummy, *lm = L ? &L[li] : &dummy;
        TAKE(lm->ring, (uint64_t)c->window * (uint64_t)c->head_dim);
        for (int which = 0; which < 2; which++) {
            const ds_compressor_w *w = which ? &ly->idx.comp : &ly->comp;
            ds_comp_mem *cm = which ? &lm->icomp : &lm->comp;
            if (which ? !ly->is_csa : !ly->ratio) continue;
            uint64_t R = (uint64_t)w->ratio, d = (uint64_t)w->d, cd = (w->overlap ? 2 : 1) * d;
            TAKE(cm->entries, ((uint64_t)max_len / R + 1) * d);
            TAKE(cm->pend_kv, R * cd);
            TAKE(cm->pend_gate, R * cd);
            if (w->overlap) {
                TAKE(cm->prev_kv, R * d);
                TAKE(cm->prev_gate, R * d);
            }
        }
    }
#undef TAKE
    return off;
}

static int seq_alloc(const ds_model *m, int64_t max_len, int state, ds_seq **out, ds_err *err);

/* Under expert parallelism the leader's sequences exist on every rank; with
 * data-parallel attention their state only on their home rank. */
int ds_seq_new(const ds_model *m, int64_t max_len, ds_seq **out, ds_err *err) {
    ds_ep *ep = m->ep && ds_ep_rank(m->ep) == 0 ? m->ep : NULL;
    int home = ep ? ds_ep_seq_home(ep) : -1;
    if (seq_alloc(m, max_len, home <= 0, out, err)) {
        if (ep) ds_ep_seq_unhome(ep, home);
        return -1;
    }
    (*out)->ep_home = home;
    if (ep) {
        (*out)->ep = ep;
        (*out)->ep_id = ds_ep_next_seq_id(ep);
        ds_ep_send_seq_new(ep, (*out)->ep_id, max_len, home);
    }
    return 0;
}

int ds_seq_new_follower(const ds_model *m, int64_t max_len, int id, int home, ds_seq **out, ds_err *err) {
    if (seq_alloc(m, max_len, home < 0 || home == ds_ep_rank(m->ep), out, err)) return -1;
    (*out)->ep_id = id;
    (*out)->ep_home = home;
    return 0;
}

static int seq_alloc(const ds_model *m, int64_t max_len, int state, ds_seq **out, ds_err *err) {
    *out = NULL;
    if (!m->be) return ds_fail(err, "%s: the model is not bound to a backend", m->path);
    if (max_len < 1) return ds_fail(err, "sequence capacity must be positive (got %lld)", (long long)max_len);
    ds_seq *s = calloc(1, sizeof *s);
    if (!s) return ds_fail(err, "out of memory for a sequence");
    s->max_len = max_len;
    s->n_layers = m->cfg.n_layers;
    s->be = m->be;
    s->ep_home = -1;
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    uint64_t bytes = ds_seq_bytes(m, max_len);
    if (!state) { /* another rank's: no state here */
        if (s->layers) {
            *out = s;
            return 0;
        }
        ds_seq_free(s);
        return ds_fail(err, "out of memory for a sequence");
    }
    if (s->layers) s->mem = m->be->alloc(m->be, (size_t)bytes, err);
    if (!s->layers || !s->mem) {
        ds_seq_free(s);
        return ds_fail(err, "out of memory for the state of a sequence of %lld tokens (%.1f MiB) in the %s backend",
                       (long long)max_len, (double)bytes / (1 << 20), m->be->name);
    }
    layout(m, max_len, s->mem, s->layers);
    *out = s;
    return 0;
}

void ds_seq_free(ds_seq *s) {
    if (!s) return;
    if (s->ep) ds_ep_send_seq_free(s->ep, s->ep_id, s->ep_home);
    if (s->mem) s->be->free(s->be, s->mem);
    free(s->layers);
    free(s);
}

/* Counts follow from the position (backend.h: ds_comp_mem), so a reset is
 * the position alone; stale state is never read. */
void ds_seq_reset(ds_seq *s) { s->pos = 0; }

uint64_t ds_seq_bytes(const ds_model *m, int64_t max_len) { return layout(m, max_len, NULL, NULL) * sizeof(float); }

int64_t ds_seq_fit(const ds_model *m, uint64_t bytes, int n) {
    int64_t lo = 0, hi = m->cfg.max_pos; /* state(lo) fits; find the largest */
    if (n < 1) n = 1;
    if ((double)ds_seq_bytes(m, hi) * n <= (double)bytes) return hi;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if ((double)ds_seq_bytes(m, mid) * n <= (double)bytes) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The in-place parts of s's state, in a fixed order: visit(ptr, floats). */
static void in_place(const ds_model *m, const ds_seq *s, void (*visit)(void *ctx, float *p, size_t n), void *ctx) {
    const ds_config *c = &m->cfg;
    for (int li = 0; li < s->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        ds_layer_mem *lm = &s->layers[li];
        visit(ctx, lm->ring, (size_t)c->window * (size_t)c->head_dim);
        for (int which = 0; which < 2; which++) {
            const ds_compressor_w *w = which ? &ly->idx.comp : &ly->comp;
            ds_comp_mem *cm = which ? &lm->icomp : &lm->comp;
            if (which ? !ly->is_csa : !ly->ratio) continue;
            size_t R = (size_t)w->ratio, d = (size_t)w->d, cd = (w->overlap ? 2 : 1) * d;
            visit(ctx, cm->pend_kv, R * cd);
            visit(ctx, cm->pend_gate, R * cd);
            if (w->overlap) {
                visit(ctx, cm->prev_kv, R * d);
                visit(ctx, cm->prev_gate, R * d);
            }
        }
    }
}

typedef struct {
    float *snap;
    size_t off;
    int dir, n; /* dir 0: count; 1: state -> snap; 2: snap -> state */
    ds_copy *list;
} snap_walk;

static void snap_visit(void *ctx, float *p, size_t n) {
    snap_walk *w = ctx;
    if (w->dir) {
        float *q = w->snap + w->off;
        w->list[w->n] = (ds_copy){w->dir == 1 ? (void *)q : (void *)p, w->dir == 1 ? p : q, n * sizeof(float)};
    }
    w->n++;
    w->off += n;
}

/* The state's parts to or from the snapshot (dir 1 / 2) in one list. */
static int snap_copy(const ds_model *m, const ds_seq *s, float *snap, int dir, ds_err *err) {
    snap_walk w = {NULL, 0, 0, 0, NULL};
    in_place(m, s, snap_visit, &w);
    ds_copy *list = malloc((size_t)(w.n ? w.n : 1) * sizeof *list);
    if (!list) return ds_fail(err, "out of memory for a snapshot's %d copies", w.n);
    w = (snap_walk){snap, 0, dir, 0, list};
    in_place(m, s, snap_visit, &w);
    int rc = s->be->copy_list(s->be, w.n, list, err);
    free(list);
    return rc;
}

int ds_seq_snapshot(const ds_model *m, const ds_seq *s, ds_seq_snap *snap, ds_err *err) {
    if (s->ep || !s->mem) return ds_fail(err, "a snapshot of a sequence under expert parallelism");
    if (s->n_layers != m->cfg.n_layers) return ds_fail(err, "a snapshot with another model's layers");
    snap_walk w = {NULL, 0, 0, 0, NULL};
    in_place(m, s, snap_visit, &w);
    if (!snap->mem || snap->bytes != w.off * sizeof(float)) {
        ds_seq_snap_free(s, snap);
        snap->mem = s->be->alloc(s->be, w.off * sizeof(float), err);
        if (!snap->mem) return ds_fail_prefix(err, "a snapshot of a sequence's state");
        snap->bytes = w.off * sizeof(float);
    }
    if (snap_copy(m, s, snap->mem, 1, err)) return -1;
    snap->pos = s->pos;
    return 0;
}

int ds_seq_rewind(const ds_model *m, ds_seq *s, const ds_seq_snap *snap, ds_err *err) {
    if (!snap->mem) return ds_fail(err, "rewinding a sequence without a snapshot");
    if (snap_copy(m, s, snap->mem, 2, err)) return -1;
    s->pos = snap->pos;
    return 0;
}

void ds_seq_snap_free(const ds_seq *s, ds_seq_snap *snap) {
    if (snap->mem) s->be->free(s->be, snap->mem);
    snap->mem = NULL;
    snap->bytes = 0;
}
