/* tiers.h — the routed experts of one GPU with a large host memory, in tiers
 * (docs/tiers.md): the most loaded experts in GPU slots, the rest in host
 * memory; a step's routed expert that holds no slot is either copied over
 * PCIe into one or computed on the CPU for the tokens that chose it. The
 * exact expert numerics give the same bits on either path, so the choice is
 * one of time alone. Here: the placement from measured load, the choice per
 * layer and step from a cost model, and the cost of a decode step predicted
 * from the load. No state; no device. */
#ifndef DS_EP_TIERS_H
#define DS_EP_TIERS_H

#include <stdint.h>

#include "common/err.h"

enum { DS_TIER_COPY = 0, DS_TIER_CPU = 1 };

/* The rates the choice weighs, all > 0. */
typedef struct ds_tier_rates {
    double pcie;      /* host to device copy, bytes/s */
    double cpu_read;  /* the CPU reading an expert's weights, bytes/s */
    double cpu_flops; /* the CPU on an expert's products, flop/s */
} ds_tier_rates;

/* The rates a command assumes unless told: PCIe 5 x16, a server's DRAM, a
 * server CPU's vector units. */
#define DS_TIER_PCIE 50e9
#define DS_TIER_CPU_READ 100e9
#define DS_TIER_CPU_FLOPS 1000e9

typedef struct ds_tier_plan {
    int layers, experts;
    long long slots;         /* experts resident in GPU slots */
    unsigned char *resident; /* [layers][experts]: 1 in a slot */
    double hit;              /* the share of the routed picks (by load) a slot serves */
} ds_tier_plan;

/* The `slots` experts of the highest load (load [layers][experts], tokens
 * routed to each; NULL: every expert the same) take the slots; equal loads
 * go to the lower layer, then the lower expert. slots over layers x experts
 * is every expert. 0, or -1 with a message. */
int ds_tier_plan_build(ds_tier_plan *p, int layers, int experts, const double *load, long long slots, ds_err *err);
void ds_tier_plan_free(ds_tier_plan *p);

/* One layer's step: n experts without a slot, tokens[i] > 0 tokens each.
 * The copy stream and the CPU work side by side, each one expert after
 * another: an expert copied costs bytes / pcie, one computed on the CPU
 * max(bytes / cpu_read, tokens x flops_per_token / cpu_flops). Taken in
 * order of tokens, most first (equal: lower i), each goes to the path that
 * would finish it sooner (equal: the copy). Sets way[i] and returns the
 * seconds until both paths are done. */
double ds_tier_split(const ds_tier_rates *r, double expert_bytes, double flops_per_token, int n, const int *tokens,
                     int *way);

/* What the CPU takes for one expert and `tokens` tokens under r:
 * max(bytes / cpu_read, tokens x flops_per_token / cpu_flops). */
double ds_tier_cpu_seconds(const ds_tier_rates *r, double expert_bytes, double flops_per_token, int tokens);

/* Moves r toward what a step measured, a quarter of the way in ratio
 * (geometric; a ratio beyond 1000x is taken as 1000x): the copies' bytes a
 * second (copy_bytes over copy_seconds), and the CPU's rates both by the
 * ratio of the seconds r predicted for the CPU's experts (cpu_predicted,
 * from ds_tier_cpu_seconds) to those they took. A part whose seconds are
 * not positive is left as it is. */
void ds_tier_rates_learn(ds_tier_rates *r, double copy_bytes, double copy_seconds, double cpu_predicted,
                         double cpu_seconds);

/* A decode step's expected cost over the routed layers, per step. */
typedef struct ds_tier_step {
    double misses;     /* experts chosen that hold no slot */
    double copied;     /* of them, copied */
    double cpu_tokens; /* tokens computed on the CPU */
    double bytes;      /* bytes copied */
    double seconds;    /* the split's time, summed over the layers */
} ds_tier_step;

/* The mean over `trials` random steps of B tokens (seeded, the same for a
 * seed), each token choosing `active` distinct experts per layer with
 * probabilities in proportion to load (NULL, or a layer without load: every
 * expert the same). 0, or -1 with a message. */
int ds_tier_simulate(const ds_tier_plan *p, const double *load, int active, int B, const ds_tier_rates *r,
                     double expert_bytes, double flops_per_token, int trials, uint64_t seed, ds_tier_step *out,
                     ds_err *err);

#endif
