/* store.h — the routed experts in tiers (docs/tiers.md): a model whose
 * experts do not all fit the compute backend's memory keeps them in host
 * memory (the checkpoint as loaded) and gives the backend a fixed number of
 * expert slots. The most loaded experts (ep/tiers.h's plan) hold resident
 * slots; the rest of the slots stage copies, least recently used first. In
 * a layer's step an expert with a slot runs on the backend; one without is
 * either copied into a staging slot (then run there) or computed by the
 * CPU backend for the tokens that chose it (its rows then uploaded). The
 * routed experts' exact numerics give the same bits on every path and
 * backend, and the combine is the one-process combine: every choice gives
 * the same logits as all experts resident.
 *
 * Created before ds_model_bind (the model owns it from then on: bind maps
 * no routed expert and fills the slots; unbind and free release them). Not
 * with expert parallelism. */
#ifndef DS_MODEL_STORE_H
#define DS_MODEL_STORE_H

#include <stdint.h>

#include "common/err.h"
#include "ep/tiers.h"
#include "format/safetensors.h"

struct ds_model;
struct ds_step;

/* Re-placement: the store learns each expert's load as it runs (the picks
 * of each step added after the table aged by 2^(-picks / HALFLIFE), per
 * layer; a --expert-load file starts it at one half-life's worth), and
 * every DS_STORE_REPLACE_STEPS steps gives the resident slots to the
 * experts of the highest learned load, at most a sixteenth of them (and at
 * least one) a time: between steps, never changing a bit. */
#define DS_STORE_HALFLIFE 4096.0
#define DS_STORE_REPLACE_STEPS 32

/* How an expert without a slot is served: auto (the cost model of
 * ep/tiers.h, per layer and step), or forced: copy, cpu, or mixed (even
 * expert ids copied, odd ones on the CPU). */
enum { DS_STORE_AUTO = 0, DS_STORE_COPY = 1, DS_STORE_CPU = 2, DS_STORE_MIXED = 3 };

typedef struct ds_store_opts {
    uint64_t device_bytes; /* what the dense weights and the slots may take (0: no cap; then slots >= 0) */
    long long slots;       /* >= 0: this many slots (at most what device_bytes holds); < 0: all device_bytes holds */
    int path;              /* DS_STORE_* */
    const double *load;    /* [layers][experts] measured load (the plan), or NULL: every expert the same */
    ds_tier_rates rates;   /* the auto path's cost model at the start (then learned: ds_store_rates) */
    ds_copy_progress fill; /* the resident slots' filling at bind, every GB and at the end (fn may be NULL;
                              ctx lives until ds_model_bind returns) */
} ds_store_opts;

/* What the store did since it was bound; per layer and in all. A pair is
 * one (token, expert) choice; an expert "copied" was written into a slot in
 * that step, one "hit" already held one. */
typedef struct ds_store_counts {
    long long pairs, hit_pairs, copied_pairs, cpu_pairs;
    long long copies;    /* experts written into slots (staging and re-placement) */
    long long replaced;  /* of them, moved into resident slots by the learned load */
    double copy_bytes;   /* their bytes */
    double cpu_seconds;  /* the CPU experts' wall time, their activations' and rows' transfers included */
    double copy_seconds; /* the copies' wall time (queued copies: the time to queue them) */
} ds_store_counts;

typedef struct ds_store ds_store;

/* Sizes the store for m (loaded, not bound) and hands it to m (m->store):
 * the slots are what device_bytes holds after m's dense weights (every
 * weight but the routed experts), or o->slots. Errors name the sizes: dense
 * weights over device_bytes, slots over it, a forced copy without a slot, a
 * model under expert parallelism. */
int ds_store_new(struct ds_model *m, const ds_store_opts *o, ds_err *err);
/* Bytes of one routed expert (w1, w3, w2 with their scales) as a slot
 * holds it, and the slots. */
uint64_t ds_store_expert_bytes(const ds_store *st);
/* The routed experts' bytes in host memory (those a synth:NAME:LAYERS:R
 * model's layers share counted once). */
uint64_t ds_store_host_bytes(const ds_store *st);
long long ds_store_slots(const ds_store *st);
long long ds_store_resident(const ds_store *st); /* of them, the plan's resident ones */
/* Of the host bytes, those page-locked for the device's copies at bind (the
 * experts' pages, a backend with pin_host), and *why_not: "" when every
 * range was locked, else why the rest stayed pageable (NULL: not asked). */
uint64_t ds_store_pinned_bytes(const ds_store *st, const char **why_not);
/* The copies' rate while the resident slots were filled at bind, to the
 * fill's end (bytes / s; 0: nothing filled, or the CPU backend). */
double ds_store_fill_rate(const ds_store *st);
/* 1 when every host expert is page-locked: a copy is queued on the device
 * and the host goes on, so the counts' copy_seconds are the queueing time
 * and the cost model keeps the bind's rate for the copies. */
int ds_store_copies_queued(const ds_store *st);

/* Called by ds_model_bind / ds_model_unbind / ds_model_free. */
int ds_store_bind(ds_store *st, ds_err *err);
void ds_store_unbind(ds_store *st);
void ds_store_free(ds_store *st);

/* The MoE of layer li (model/moe.c) with the routes idx (backend memory)
 * already made: the experts by tier, then the combine into out. */
int ds_store_moe(const struct ds_step *S, int li, const float *xn, const int32_t *idx, float *out, ds_err *err);

/* Counts of layer li (li < 0: all layers). */
ds_store_counts ds_store_counts_of(const ds_store *st, int li);
/* The auto path's rates now: the options' at first, then each layer's step
 * moves them toward what its copies and its CPU experts took
 * (ds_tier_rates_learn); they choose a way, never a bit. */
ds_tier_rates ds_store_rates(const ds_store *st);
void ds_store_counts_reset(ds_store *st);

#endif
