/* store.c — see store.h. */
#include "model/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "common/clock.h"
#include "model/step.h"

#define SLOT_ALIGN 256 /* each matrix and scale grid of a slot */

typedef struct {
    uintptr_t a, b; /* host pages [a, b) */
} span;

typedef struct {
    int layer, expert; /* its expert, or layer -1: empty */
    long long used;    /* the pass that last read it (staging: least recent goes first) */
    long long round;   /* the last round that reads it (not to be refilled in that round) */
} slot_info;

struct ds_store {
    struct ds_model *m;
    ds_store_opts o;
    int L, E;
    long long n_slots, n_resident; /* slots [0, n_resident): the plan's; the rest stage copies */
    uint64_t expert_bytes, off[6]; /* a slot: w1, w1 scale, w3, w3 scale, w2, w2 scale at off[] */
    uint64_t host_bytes;           /* the routed experts in host memory */
    uint64_t parts[6];             /* their bytes */
    double flops_per_token;        /* one token through one expert (the auto path's cost model) */
    ds_tier_rates rates;           /* the cost model's: o.rates, then learned from each step's copies and CPU */
    ds_tier_plan plan;
    double *ew;      /* [L][E] the learned load (re-placement) */
    long long steps; /* steps begun (layer 0 passes) */
    /* bound */
    const ds_backend *be, *host;
    ds_backend host_own;    /* the CPU backend when be is another */
    uint8_t *slots_mem;     /* be memory: n_slots slots */
    slot_info *slot;        /* [n_slots] */
    int *slot_of;           /* [L][E]: the slot holding the expert, or -1 */
    ds_weight *view;        /* [L][3][E]: w1, w3, w2 as the backend reads them (a slot, or the host's) */
    int *packed;            /* [L][E]: host weights packed by the host backend (to release) */
    long long pass, rounds; /* layer steps and their rounds so far */
    /* a pass's scratch (host) */
    unsigned char *sel_dev, *sel_cpu;
    int *cnt, *way, *tok, *pend, *split; /* [E] each */
    size_t pair_cap;
    float *hx; /* the CPU path on another backend: x [T][D] (its rows land in the step's ep_rows) */
    size_t hx_cap;
    ds_store_counts *counts; /* [L + 1]: per layer, then the total */
    span *pins;              /* the host pages the backend locked (pin_host) */
    int n_pins;
    char pin_note[200]; /* why the rest stayed pageable, or "" */
    double fill_rate;   /* bytes / s of the resident slots' fill at bind, to its end (0: not measured) */
};

static uint64_t round_up(uint64_t n) { return (n + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN; }

static uint64_t data_bytes(const ds_weight *w) { return ds_weight_bytes(w) - ds_weight_scale_bytes(w); }

uint64_t ds_store_expert_bytes(const ds_store *st) { return st->expert_bytes; }
uint64_t ds_store_host_bytes(const ds_store *st) { return st->host_bytes; }
long long ds_store_slots(const ds_store *st) { return st->n_slots; }
long long ds_store_resident(const ds_store *st) { return st->n_resident; }

uint64_t ds_store_pinned_bytes(const ds_store *st, const char **why_not) {
    if (why_not) *why_not = st->pin_note;
    uint64_t b = 0;
    for (int i = 0; i < st->n_pins; i++) b += st->pins[i].b - st->pins[i].a;
    return b;
}

double ds_store_fill_rate(const ds_store *st) { return st->fill_rate; }
/* every host expert locked: a copy is queued, the host does not wait for it */
int ds_store_copies_queued(const ds_store *st) { return st->n_pins > 0 && !st->pin_note[0]; }

/* The routed experts' bytes in host memory: an expert whose data is an
 * earlier layer's (synth:NAME:LAYERS:R) counts once. */
static uint64_t host_bytes(const ds_model *m) {
    const ds_config *c = &m->cfg;
    uint64_t b = 0;
    for (int li = 0; li < c->n_layers; li++)
        for (int e = 0; e < c->n_routed_experts; e++) {
            const ds_layer *ly = &m->layers[li];
            int seen = 0;
            for (int lj = 0; lj < li && !seen; lj++) seen = m->layers[lj].w1[e].data == ly->w1[e].data;
            if (!seen) b += ds_weight_bytes(&ly->w1[e]) + ds_weight_bytes(&ly->w2[e]) + ds_weight_bytes(&ly->w3[e]);
        }
    return b;
}

int ds_store_new(ds_model *m, const ds_store_opts *o, ds_err *err) {
    const ds_config *c = &m->cfg;
    if (m->ep) return ds_fail(err, "%s: expert tiers (--gpu-mem) do not combine with expert parallelism", m->path);
    if (m->be) return ds_fail(err, "%s: expert tiers are set before the model is bound", m->path);
    if (m->store) return ds_fail(err, "%s: the model already has an expert store", m->path);
    if (!o->device_bytes && o->slots < 0)
        return ds_fail(err, "%s: expert tiers need --gpu-mem or --expert-slots", m->path);
    const ds_layer *l0 = &m->layers[0];
    const ds_weight *w[3] = {&l0->w1[0], &l0->w3[0], &l0->w2[0]};
    uint64_t parts[6], off[6], eb = 0;
    for (int q = 0; q < 3; q++) {
        parts[2 * q] = data_bytes(w[q]);
        parts[2 * q + 1] = ds_weight_scale_bytes(w[q]);
    }
    for (int i = 0; i < 6; i++) {
        off[i] = eb;
        eb += round_up(parts[i] + 4); /* + 4: map_weights' whole words */
    }
    uint64_t ex, dense;
    ds_model_expert_bytes(m, 0, &ex, &dense);
    ex = host_bytes(m);
    long long all = (long long)c->n_layers * c->n_routed_experts, fit = all;
    uint64_t host = ds_mem_total();
#ifdef DSV4_TEST_HOOKS
    const char *hk = getenv("DSV4_TEST_MEM_TOTAL_MB"); /* tests: a host of this size */
    if (hk && *hk) host = (uint64_t)strtoull(hk, NULL, 10) << 20;
#endif
    if (host && ex > host)
        return ds_fail(err,
                       "%s: the routed experts (%.3f GB) do not fit this host's memory (%.3f GB): the store keeps "
                       "them all in host memory, and every miss would read them from disk",
                       m->path, ex / 1e9, host / 1e9);
    if (o->device_bytes) {
        if (dense > o->device_bytes)
            return ds_fail(err,
                           "%s: --gpu-mem %.3f GB does not hold the dense weights (%.3f GB, %llu bytes: every "
                           "weight but the routed experts, as the backend holds them)",
                           m->path, o->device_bytes / 1e9, dense / 1e9, (unsigned long long)dense);
        fit = (long long)((o->device_bytes - dense) / eb);
        if (fit > all) fit = all;
    }
    long long slots = o->slots >= 0 ? o->slots : fit;
    if (slots > all) slots = all;
    if (slots > fit)
        return ds_fail(err,
                       "%s: --expert-slots %lld: --gpu-mem %.3f GB holds %lld slots of %.3f MB after the dense "
                       "weights (%.3f GB)",
                       m->path, o->slots, o->device_bytes / 1e9, fit, eb / 1e6, dense / 1e9);
    if (slots == 0 && (o->path == DS_STORE_COPY || o->path == DS_STORE_MIXED))
        return ds_fail(err,
                       "%s: --tier-path %s copies experts into slots, and --gpu-mem %.3f GB holds none (the dense "
                       "weights %.3f GB, a slot %.3f MB)",
                       m->path, o->path == DS_STORE_COPY ? "copy" : "mixed", o->device_bytes / 1e9, dense / 1e9,
                       eb / 1e6);
    /* staging: a layer's top-k (a decode token's misses) twice over, or a
     * quarter of the slots where that is more; none when the slots hold
     * every expert (nothing is ever copied) */
    long long stage = 2LL * c->n_active_experts;
    if (slots / 4 > stage) stage = slots / 4;
    if (stage > slots) stage = slots;
    if (slots == all) stage = 0;
    ds_store *st = calloc(1, sizeof *st);
    if (!st) return ds_fail(err, "out of memory");
    st->m = m, st->o = *o, st->o.load = NULL, st->L = c->n_layers, st->E = c->n_routed_experts;
    memcpy(st->parts, parts, sizeof parts);
    memcpy(st->off, off, sizeof off);
    st->expert_bytes = eb;
    st->host_bytes = ex;
    st->flops_per_token = 2.0 * 3.0 * (double)w[0]->rows * (double)w[0]->cols;
    st->rates = o->rates;
    st->n_slots = slots, st->n_resident = slots - stage;
    st->ew = calloc((size_t)st->L * st->E, sizeof *st->ew);
    if (!st->ew) {
        free(st);
        return ds_fail(err, "out of memory");
    }
    for (int li = 0; o->load && li < st->L; li++) { /* the file's load as one half-life of picks */
        double sum = 0;
        for (int e = 0; e < st->E; e++) sum += o->load[li * st->E + e];
        for (int e = 0; e < st->E && sum > 0; e++)
            st->ew[li * st->E + e] = o->load[li * st->E + e] / sum * DS_STORE_HALFLIFE;
    }
    if (ds_tier_plan_build(&st->plan, st->L, st->E, o->load, st->n_resident, err)) {
        free(st->ew);
        free(st);
        return -1;
    }
    m->store = st;
    return 0;
}

static void host_release(ds_store *st) {
    if (!st->packed) return;
    for (int li = 0; li < st->L; li++)
        for (int e = 0; e < st->E; e++) {
            if (!st->packed[li * st->E + e]) continue;
            ds_layer *ly = &st->m->layers[li];
            ds_weight *w[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
            for (int q = 0; q < 3; q++)
                if (w[q]->packed && st->host->release_weight) st->host->release_weight(st->host, w[q]);
        }
    free(st->packed);
    st->packed = NULL;
}

static int span_cmp(const void *x, const void *y) {
    uintptr_t a = ((const span *)x)->a, b = ((const span *)y)->a;
    return (a > b) - (a < b);
}

/* The host experts' pages locked for the device's copies (a backend with
 * pin_host; the CPU path reads them as they are): each matrix's and scale
 * grid's bytes widened to whole pages, the spans merged where they meet
 * (layers sharing an expert's bytes lock them once), each locked once. The
 * first span the backend refuses ends it: the rest stay pageable (copied
 * through the driver's staging, several times slower), and pin_note says
 * why. Only memory failures are errors. */
static int pin_experts(ds_store *st, ds_err *err) {
    st->pin_note[0] = 0;
    if (!st->be->pin_host || st->host == st->be || st->n_slots == 0) return 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = 0;
    span *sp = malloc(sizeof *sp * (size_t)st->L * st->E * 6);
    if (!sp) return ds_fail(err, "expert store: out of memory for the host experts' spans");
    for (int li = 0; li < st->L; li++)
        for (int e = 0; e < st->E; e++) {
            const ds_layer *ly = &st->m->layers[li];
            const ds_weight *h[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
            for (int q = 0; q < 6; q++) {
                uintptr_t p = (uintptr_t)(q % 2 ? (const void *)h[q / 2]->scale : h[q / 2]->data);
                if (!p || !st->parts[q]) continue;
                sp[n].a = p / pg * pg;
                sp[n++].b = (p + st->parts[q] + pg - 1) / pg * pg;
            }
        }
    qsort(sp, n, sizeof *sp, span_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && sp[i].a <= sp[m - 1].b) {
            if (sp[i].b > sp[m - 1].b) sp[m - 1].b = sp[i].b;
        } else {
            sp[m++] = sp[i];
        }
    }
    st->pins = sp, st->n_pins = 0;
    for (size_t i = 0; i < m; i++) {
        ds_err pe;
        if (st->be->pin_host(st->be, (const void *)sp[i].a, sp[i].b - sp[i].a, &pe)) {
            snprintf(st->pin_note, sizeof st->pin_note, "%.190s", pe.msg);
            break;
        }
        sp[st->n_pins++] = sp[i];
    }
    return 0;
}

static void unpin_experts(ds_store *st) {
    for (int i = 0; i < st->n_pins; i++) st->be->unpin_host(st->be, (const void *)st->pins[i].a);
    free(st->pins);
    st->pins = NULL, st->n_pins = 0;
}

void ds_store_unbind(ds_store *st) {
    if (!st || !st->be) return;
    unpin_experts(st);
    host_release(st);
    if (st->slots_mem) st->be->free(st->be, st->slots_mem);
    if (st->host_own.close) st->host_own.close(&st->host_own);
    memset(&st->host_own, 0, sizeof st->host_own);
    free(st->slot);
    free(st->slot_of);
    free(st->view);
    free(st->sel_dev);
    free(st->cnt);
    free(st->hx);
    free(st->counts);
    st->slots_mem = NULL, st->slot = NULL, st->slot_of = NULL, st->view = NULL, st->sel_dev = NULL, st->cnt = NULL;
    st->hx = NULL, st->counts = NULL, st->hx_cap = st->pair_cap = 0;
    st->be = st->host = NULL;
}

void ds_store_free(ds_store *st) {
    if (!st) return;
    ds_store_unbind(st);
    ds_tier_plan_free(&st->plan);
    free(st->ew);
    free(st);
}

/* Slot s's weights as the backend reads them: expert e of layer li's host
 * weights with their data and scales in the slot. */
static void slot_views(ds_store *st, long long s, int li, int e) {
    const ds_layer *ly = &st->m->layers[li];
    const ds_weight *h[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
    uint8_t *base = st->slots_mem + (size_t)s * st->expert_bytes;
    for (int q = 0; q < 3; q++) {
        ds_weight *v = &st->view[((size_t)li * 3 + q) * st->E + e];
        *v = *h[q];
        v->data = base + st->off[2 * q];
        v->scale = st->parts[2 * q + 1] ? base + st->off[2 * q + 1] : NULL;
        v->packed = NULL, v->packed_bytes = 0; /* the backend's own copies are of the host weight */
    }
}

static void host_views(ds_store *st, int li, int e) {
    const ds_layer *ly = &st->m->layers[li];
    const ds_weight *h[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
    for (int q = 0; q < 3; q++) st->view[((size_t)li * 3 + q) * st->E + e] = *h[q];
}

/* Writes expert e of layer li into slot s (its former expert loses it). */
static int fill(ds_store *st, long long s, int li, int e, ds_err *err) {
    slot_info *si = &st->slot[s];
    if (si->layer >= 0) {
        st->slot_of[si->layer * st->E + si->expert] = -1;
        host_views(st, si->layer, si->expert);
    }
    const ds_layer *ly = &st->m->layers[li];
    const ds_weight *h[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
    uint8_t *base = st->slots_mem + (size_t)s * st->expert_bytes;
    for (int q = 0; q < 3; q++) {
        if (st->be->fill_weights(st->be, base + st->off[2 * q], h[q]->data, st->parts[2 * q],
                                 h[q]->kind == DS_W_FP4 ? DS_MAP_FP4_CODES : DS_MAP_BYTES, err) ||
            (st->parts[2 * q + 1] && st->be->fill_weights(st->be, base + st->off[2 * q + 1], h[q]->scale,
                                                          st->parts[2 * q + 1], DS_MAP_BYTES, err)))
            return ds_fail_prefix(err, "expert store: writing '%s' into slot %lld", h[q]->name ? h[q]->name : "?", s);
    }
    si->layer = li, si->expert = e;
    st->slot_of[li * st->E + e] = (int)s;
    slot_views(st, s, li, e);
    return 0;
}

int ds_store_bind(ds_store *st, ds_err *err) {
    ds_model *m = st->m;
    const ds_backend *be = m->be;
    if (!be->fill_weights || !be->moe_experts || !be->moe_combine) {
        return ds_fail(err, "%s: the %s backend holds no expert store (fill_weights, moe_experts, moe_combine)",
                       m->path, be->name);
    }
    st->be = be;
    int own = be->threads(be) <= 0; /* a device's backend: the CPU's experts go to a CPU backend of the store's */
#ifdef DSV4_TEST_HOOKS
    if (getenv("DSV4_TEST_STORE_OWN_CPU")) own = 1; /* tests: the CPU's experts through a backend of their own */
#endif
    if (!own) {
        st->host = be;
    } else {
        if (ds_backend_cpu_init(&st->host_own, 0)) {
            st->be = NULL;
            return ds_fail(err, "expert store: the CPU backend: out of memory");
        }
        st->host = &st->host_own;
    }
    size_t LE = (size_t)st->L * st->E;
    st->slot = calloc((size_t)(st->n_slots ? st->n_slots : 1), sizeof *st->slot);
    st->slot_of = malloc(LE * sizeof *st->slot_of);
    st->view = malloc(LE * 3 * sizeof *st->view);
    st->packed = calloc(LE, sizeof *st->packed);
    st->counts = calloc((size_t)st->L + 1, sizeof *st->counts);
    if (!st->slot || !st->slot_of || !st->view || !st->packed || !st->counts) {
        ds_store_unbind(st);
        return ds_fail(err, "out of memory");
    }
    for (size_t i = 0; i < LE; i++) st->slot_of[i] = -1;
    for (long long s = 0; s < st->n_slots; s++) st->slot[s].layer = -1, st->slot[s].round = -1;
    /* the host's weights: the CPU's kernels may keep flags or copies of them */
    for (int li = 0; li < st->L; li++)
        for (int e = 0; e < st->E; e++) {
            ds_layer *ly = &m->layers[li];
            ds_weight *w[3] = {&ly->w1[e], &ly->w3[e], &ly->w2[e]};
            st->packed[(size_t)li * st->E + e] = 1; /* (unbind releases what a failed pack left) */
            for (int q = 0; q < 3; q++)
                if (st->host->pack_weight && st->host->pack_weight(st->host, w[q], err)) {
                    ds_store_unbind(st);
                    return -1;
                }
            host_views(st, li, e);
        }
    if (pin_experts(st, err)) {
        ds_store_unbind(st);
        return -1;
    }
    if (st->n_slots) {
        st->slots_mem = be->alloc(be, (size_t)st->n_slots * st->expert_bytes, err);
        if (!st->slots_mem) {
            ds_fail_prefix(err, "expert store: %lld slots of %.3f MB (%.3f GB) on the %s backend", st->n_slots,
                           st->expert_bytes / 1e6, (double)st->n_slots * st->expert_bytes / 1e9, be->name);
            ds_store_unbind(st);
            return -1;
        }
    }
    long long s = 0;
    uint64_t total = (uint64_t)st->n_resident * st->expert_bytes, shown = 0;
    double t0 = ds_now();
    for (int li = 0; li < st->L; li++)
        for (int e = 0; e < st->E; e++) {
            if (!st->plan.resident[(size_t)li * st->E + e]) continue;
            if (fill(st, s++, li, e, err)) {
                ds_store_unbind(st);
                return -1;
            }
            uint64_t done = (uint64_t)s * st->expert_bytes;
            if (st->o.fill.fn && (done == total || done - shown >= 1000000000)) {
                st->o.fill.fn(st->o.fill.ctx, done, total);
                shown = done;
            }
        }
    /* the link's rate, from the fill to its end (a download waits for the
     * queue): with every expert locked the copies are queued, so a step's
     * wall time does not measure them, and the cost model starts here */
    if (total && st->host != be) {
        uint32_t probe;
        if (be->download(be, &probe, st->slots_mem, sizeof probe, err)) {
            ds_store_unbind(st);
            return -1;
        }
        double sec = ds_now() - t0;
        st->fill_rate = sec > 0 ? (double)total / sec : 0;
        if (ds_store_copies_queued(st) && st->fill_rate > 0) st->rates.pcie = st->fill_rate;
    }
    ds_store_counts_reset(st);
    return 0;
}

ds_tier_rates ds_store_rates(const ds_store *st) { return st->rates; }

ds_store_counts ds_store_counts_of(const ds_store *st, int li) {
    ds_store_counts z = {0};
    if (!st->counts) return z;
    return st->counts[li < 0 || li >= st->L ? st->L : li];
}

void ds_store_counts_reset(ds_store *st) {
    if (st->counts) memset(st->counts, 0, ((size_t)st->L + 1) * sizeof *st->counts);
}

static void count_add(ds_store *st, int li, const ds_store_counts *d) {
    for (int i = 0; i < 2; i++) {
        ds_store_counts *c = &st->counts[i ? st->L : li];
        c->pairs += d->pairs, c->hit_pairs += d->hit_pairs, c->copied_pairs += d->copied_pairs;
        c->cpu_pairs += d->cpu_pairs, c->copies += d->copies, c->copy_bytes += d->copy_bytes;
        c->replaced += d->replaced;
        c->cpu_seconds += d->cpu_seconds, c->copy_seconds += d->copy_seconds;
    }
}

static int scratch(ds_store *st, size_t pairs, ds_err *err) {
    if (pairs <= st->pair_cap) return 0;
    free(st->sel_dev);
    free(st->cnt);
    st->sel_dev = malloc(2 * pairs);
    st->cnt = malloc(5 * (size_t)st->E * sizeof(int));
    st->pair_cap = st->sel_dev && st->cnt ? pairs : 0;
    if (!st->pair_cap) return ds_fail(err, "expert store: out of memory for a step of %zu pairs", pairs);
    st->sel_cpu = st->sel_dev + pairs;
    st->way = st->cnt + st->E, st->tok = st->way + st->E, st->pend = st->tok + st->E, st->split = st->pend + st->E;
    return 0;
}

static int grow_x(ds_store *st, size_t n, ds_err *err) {
    if (n <= st->hx_cap) return 0;
    free(st->hx);
    st->hx = malloc(n * sizeof *st->hx);
    st->hx_cap = st->hx ? n : 0;
    return st->hx ? 0 : ds_fail(err, "expert store: out of memory for %zu floats", n);
}

/* The least recently read staging slot not read in this round, or -1. */
static long long free_stage(const ds_store *st, long long round) {
    long long best = -1;
    for (long long s = st->n_resident; s < st->n_slots; s++) {
        const slot_info *si = &st->slot[s];
        if (si->round == round) continue;
        if (best < 0 || si->used < st->slot[best].used) best = s;
    }
    return best;
}

enum { WAY_NONE = 0, WAY_HIT, WAY_COPY, WAY_CPU, WAY_DONE };

/* The CPU's pairs (sel_cpu) into the step's slot_out rows (on another
 * backend: x downloaded into st->hx before the backend's experts were
 * queued, so the CPU computes while the device runs them). */
static int cpu_pairs(ds_store *st, const ds_step *S, int li, const float *xn, const int32_t *idx, ds_err *err) {
    const ds_model *m = S->m;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    int T = S->T, k = m->cfg.n_active_experts, D = m->cfg.dim, E = st->E;
    size_t P = (size_t)T * k;
    if (st->host == be) { /* one backend: its own memory */
        ds_moe_experts_params xp = {xn,
                                    T,
                                    D,
                                    E,
                                    k,
                                    idx,
                                    st->sel_cpu,
                                    ly->w1,
                                    ly->w2,
                                    ly->w3,
                                    NULL,
                                    NULL,
                                    NULL,
                                    m->cfg.swiglu_limit,
                                    S->rs->slot_out,
                                    NULL};
        return be->moe_experts(be, &xp, err);
    }
    float *rows = S->rs->ep_rows; /* host [T][k][D]: the runstate's, reserved for the MoE in two halves */
    ds_moe_experts_params xp = {st->hx, T,      D,    E,    k,    S->rs->idx_host,     st->sel_cpu, ly->w1,
                                ly->w2, ly->w3, NULL, NULL, NULL, m->cfg.swiglu_limit, rows,        NULL};
    if (st->host->moe_experts(st->host, &xp, err)) return ds_fail_prefix(err, "expert store: the CPU's experts");
    /* the rows up, a run of consecutive CPU pairs at a time */
    for (size_t i = 0; i < P;) {
        if (!st->sel_cpu[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < P && st->sel_cpu[j]) j++;
        if (be->upload(be, S->rs->slot_out + i * D, rows + i * D, (j - i) * D * sizeof(float), err)) return -1;
        i = j;
    }
    return 0;
}

/* The resident slots to the experts of the highest learned load: those of
 * the new plan that hold no resident slot take the slots of those that
 * left it, at most a sixteenth of the resident slots (at least one) a
 * time, the most loaded first (the plan's order). */
static int replace(ds_store *st, ds_store_counts *d, ds_err *err) {
    if (st->n_resident == 0 || st->n_resident == (long long)st->L * st->E) return 0;
    ds_tier_plan np;
    if (ds_tier_plan_build(&np, st->L, st->E, st->ew, st->n_resident, err)) return -1;
    long long budget = st->n_resident / 16 > 0 ? st->n_resident / 16 : 1, s = 0;
    for (int i = 0; i < st->L * st->E && budget > 0; i++) {
        int li = i / st->E, e = i % st->E, cur = st->slot_of[i];
        if (!np.resident[i] || (cur >= 0 && cur < st->n_resident)) continue;
        while (s < st->n_resident) { /* the next resident slot whose expert left the plan */
            const slot_info *si = &st->slot[s];
            if (si->layer < 0 || !np.resident[si->layer * st->E + si->expert]) break;
            s++;
        }
        if (s == st->n_resident) break;
        if (cur >= 0) { /* staged: that slot is free now */
            st->slot[cur].layer = -1;
            st->slot_of[i] = -1;
        }
        if (fill(st, s, li, e, err)) {
            ds_tier_plan_free(&np);
            return -1;
        }
        st->slot[s].used = st->pass;
        d->copies++, d->replaced++, d->copy_bytes += (double)st->expert_bytes;
        budget--, s++;
    }
    ds_tier_plan_free(&np);
    return 0;
}

int ds_store_moe(const ds_step *S, int li, const float *xn, const int32_t *idx, float *out, ds_err *err) {
    const ds_model *m = S->m;
    ds_store *st = m->store;
    const ds_config *c = &m->cfg;
    const ds_layer *ly = &m->layers[li];
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, E = st->E, k = c->n_active_experts, D = c->dim, sh = c->n_shared_experts > 0;
    size_t P = (size_t)T * k;
    if (T == 0) return 0;
    if (scratch(st, P, err) || be->download(be, rs->idx_host, idx, P * sizeof(int32_t), err)) return -1;
    const int32_t *ih = rs->idx_host;
    ds_store_counts d = {0};
    d.pairs = (long long)P;
    st->pass++;
    if (li == 0 && ++st->steps % DS_STORE_REPLACE_STEPS == 0) { /* between steps: the layers before ran */
        double t0 = ds_now();
        if (replace(st, &d, err)) return -1;
        d.copy_seconds += ds_now() - t0;
    }
    long long round0 = st->rounds + 1;
    /* the experts this step chose, and the way each is served */
    memset(st->cnt, 0, (size_t)E * sizeof(int));
    for (size_t i = 0; i < P; i++)
        if (ih[i] >= 0 && ih[i] < E) st->cnt[ih[i]]++;
    double age = exp2(-(double)P / DS_STORE_HALFLIFE);
    for (int e = 0; e < E; e++) st->ew[li * E + e] = st->ew[li * E + e] * age + st->cnt[e];
    int n_pend = 0;
    for (int e = 0; e < E; e++) {
        st->way[e] = WAY_NONE;
        if (!st->cnt[e]) continue;
        int s = st->slot_of[li * E + e];
        if (s >= 0) {
            st->way[e] = WAY_HIT;
            st->slot[s].used = st->pass, st->slot[s].round = round0;
            d.hit_pairs += st->cnt[e];
        } else {
            st->pend[n_pend] = e;
            st->tok[n_pend++] = st->cnt[e];
        }
    }
    if (n_pend) {
        if (st->o.path == DS_STORE_AUTO && st->n_slots > st->n_resident) {
            ds_tier_split(&st->rates, (double)st->expert_bytes, st->flops_per_token, n_pend, st->tok, st->split);
            for (int i = 0; i < n_pend; i++) st->way[st->pend[i]] = st->split[i] == DS_TIER_COPY ? WAY_COPY : WAY_CPU;
        } else {
            for (int i = 0; i < n_pend; i++) {
                int e = st->pend[i], p = st->o.path;
                int copy = p == DS_STORE_COPY || (p == DS_STORE_MIXED && e % 2 == 0);
                st->way[e] = copy && st->n_slots > st->n_resident ? WAY_COPY : WAY_CPU;
            }
        }
    }
    /* the CPU's pairs; on another backend x comes down now, before the
     * backend's experts are queued (a download waits for the queue), so the
     * CPU's experts run while the device's do */
    memset(st->sel_cpu, 0, P);
    int any_cpu = 0;
    for (size_t i = 0; i < P; i++)
        if (ih[i] >= 0 && ih[i] < E && st->way[ih[i]] == WAY_CPU) st->sel_cpu[i] = 1, any_cpu = 1, d.cpu_pairs++;
    if (any_cpu && st->host != be) {
        double t0 = ds_now();
        if (grow_x(st, (size_t)T * D, err) || be->download(be, st->hx, xn, (size_t)T * D * sizeof(float), err))
            return -1;
        d.cpu_seconds += ds_now() - t0;
    }
    /* rounds on the backend: the hits and as many copies as free staging
     * slots take, then the rest of the copies round after round (a slot read
     * in a round is refilled only after it: the backend's ops run in order) */
    const ds_weight *vw = st->view + (size_t)li * 3 * E;
    int *at = st->tok; /* (the split is done) the round an expert runs in on the backend, or -1 */
    for (int e = 0; e < E; e++) at[e] = st->way[e] == WAY_HIT ? 0 : -1;
    for (int round = 0;; round++) {
        long long stamp = ++st->rounds;
        int any = round == 0, copies_left = 0;
        double t0 = ds_now();
        for (int e = 0; e < E; e++) {
            if (st->way[e] != WAY_COPY) continue;
            long long s = free_stage(st, stamp);
            if (s < 0) {
                copies_left = 1;
                break;
            }
            if (fill(st, s, li, e, err)) return -1;
            st->slot[s].used = st->pass, st->slot[s].round = stamp;
            d.copies++, d.copy_bytes += (double)st->expert_bytes, d.copied_pairs += st->cnt[e];
            st->way[e] = WAY_DONE;
            at[e] = round;
            any = 1;
        }
        for (size_t i = 0; i < P; i++) st->sel_dev[i] = ih[i] >= 0 && ih[i] < E && at[ih[i]] == round;
        d.copy_seconds += ds_now() - t0;
        if (any) {
            int s0 = round == 0 && sh; /* the shared expert once, in the first round */
            ds_moe_experts_params xp = {xn,
                                        T,
                                        D,
                                        E,
                                        k,
                                        idx,
                                        st->sel_dev,
                                        vw,
                                        vw + 2 * (size_t)E,
                                        vw + (size_t)E,
                                        s0 ? &ly->sw1 : NULL,
                                        s0 ? &ly->sw2 : NULL,
                                        s0 ? &ly->sw3 : NULL,
                                        c->swiglu_limit,
                                        rs->slot_out,
                                        round == 0 ? rs->shared_out : NULL};
            if (be->moe_experts(be, &xp, err)) return -1;
        }
        if (!copies_left) break;
        if (st->n_slots == st->n_resident) return ds_fail(err, "expert store: copies without a staging slot");
    }
    if (any_cpu) {
        double t0 = ds_now();
        if (cpu_pairs(st, S, li, xn, idx, err)) return -1;
        d.cpu_seconds += ds_now() - t0;
    }
    /* the rates move toward what this step's copies and CPU experts took */
    double cpu_pred = 0;
    for (int e = 0; e < E && any_cpu; e++)
        if (st->way[e] == WAY_CPU)
            cpu_pred += ds_tier_cpu_seconds(&st->rates, (double)st->expert_bytes, st->flops_per_token, st->cnt[e]);
    /* queued copies (every expert locked): their wall time here is the queueing, not the copy */
    ds_tier_rates_learn(&st->rates, ds_store_copies_queued(st) ? 0 : d.copy_bytes, d.copy_seconds, cpu_pred,
                        d.cpu_seconds);
    count_add(st, li, &d);
    ds_moe_combine_params cp = {T, D, k, idx, rs->wts, rs->slot_out, rs->shared_out, out};
    return be->moe_combine(be, &cp, err);
}
