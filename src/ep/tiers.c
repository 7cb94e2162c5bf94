/* tiers.c — see tiers.h. */
#include "ep/tiers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double w;
    int i;
} ranked;

static int cmp_ranked(const void *a, const void *b) { /* load descending, then index ascending */
    const ranked *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

void ds_tier_plan_free(ds_tier_plan *p) {
    free(p->resident);
    memset(p, 0, sizeof *p);
}

int ds_tier_plan_build(ds_tier_plan *p, int layers, int experts, const double *load, long long slots, ds_err *err) {
    memset(p, 0, sizeof *p);
    if (layers < 1 || experts < 1) return ds_fail(err, "expert tiers: %d layers x %d experts", layers, experts);
    if (slots < 0) return ds_fail(err, "expert tiers: %lld slots", slots);
    int n = layers * experts;
    if (slots > n) slots = n;
    ranked *r = malloc((size_t)n * sizeof *r);
    p->resident = calloc((size_t)n, 1);
    if (!r || !p->resident) {
        free(r);
        ds_tier_plan_free(p);
        return ds_fail(err, "out of memory");
    }
    double total = 0, held = 0;
    for (int i = 0; i < n; i++) {
        double w = load ? load[i] : 1.0;
        if (!(w >= 0)) {
            free(r);
            ds_tier_plan_free(p);
            return ds_fail(err, "expert tiers: layer %d expert %d: load %g", i / experts, i % experts, w);
        }
        r[i] = (ranked){w, i};
        total += w;
    }
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    for (long long s = 0; s < slots; s++) {
        p->resident[r[s].i] = 1;
        held += r[s].w;
    }
    free(r);
    p->layers = layers, p->experts = experts, p->slots = slots;
    p->hit = total > 0 ? held / total : (double)slots / n;
    return 0;
}

double ds_tier_cpu_seconds(const ds_tier_rates *r, double expert_bytes, double flops_per_token, int tokens) {
    double t_cpu = (double)tokens * flops_per_token / r->cpu_flops, t_read = expert_bytes / r->cpu_read;
    return t_cpu > t_read ? t_cpu : t_read;
}

/* r *= (ratio)^(1/4), the ratio bounded to [1/1000, 1000] */
static double nudge(double r, double ratio) {
    if (ratio > 1e3) ratio = 1e3;
    if (ratio < 1e-3) ratio = 1e-3;
    return r * pow(ratio, 0.25);
}

void ds_tier_rates_learn(ds_tier_rates *r, double copy_bytes, double copy_seconds, double cpu_predicted,
                         double cpu_seconds) {
    if (copy_bytes > 0 && copy_seconds > 0) r->pcie = nudge(r->pcie, copy_bytes / copy_seconds / r->pcie);
    if (cpu_predicted > 0 && cpu_seconds > 0) {
        double f = cpu_predicted / cpu_seconds;
        r->cpu_read = nudge(r->cpu_read, f);
        r->cpu_flops = nudge(r->cpu_flops, f);
    }
}

double ds_tier_split(const ds_tier_rates *r, double expert_bytes, double flops_per_token, int n, const int *tokens,
                     int *way) {
    double copy_done = 0, cpu_done = 0, t_copy = expert_bytes / r->pcie;
    for (int i = 0; i < n; i++) way[i] = -1; /* not yet placed */
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int i = 0; i < n; i++) /* the most tokens not yet placed; n is at most a layer's experts */
            if (way[i] < 0 && (best < 0 || tokens[i] > tokens[best])) best = i;
        double t_cpu = ds_tier_cpu_seconds(r, expert_bytes, flops_per_token, tokens[best]);
        if (copy_done + t_copy <= cpu_done + t_cpu) {
            way[best] = DS_TIER_COPY;
            copy_done += t_copy;
        } else {
            way[best] = DS_TIER_CPU;
            cpu_done += t_cpu;
        }
    }
    return copy_done > cpu_done ? copy_done : cpu_done;
}

static uint64_t next_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* An expert drawn with probability in proportion to its weight (cum: the
 * running sums), one this token has not chosen (stamp[e] != mark); after 64
 * draws that all hit chosen ones, the first unchosen of the most weight. */
static int draw(const double *w, const double *cum, int E, const int *stamp, int mark, uint64_t *s) {
    for (int tries = 0; tries < 64; tries++) {
        double u = (double)(next_u64(s) >> 11) * 0x1.0p-53 * cum[E - 1];
        int lo = 0, hi = E - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (cum[mid] > u)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (stamp[lo] != mark && w[lo] > 0) return lo;
    }
    int best = -1;
    for (int e = 0; e < E; e++)
        if (stamp[e] != mark && (best < 0 || w[e] > w[best])) best = e;
    return best;
}

int ds_tier_simulate(const ds_tier_plan *p, const double *load, int active, int B, const ds_tier_rates *r,
                     double expert_bytes, double flops_per_token, int trials, uint64_t seed, ds_tier_step *out,
                     ds_err *err) {
    memset(out, 0, sizeof *out);
    int L = p->layers, E = p->experts;
    if (active < 1 || active > E) return ds_fail(err, "expert tiers: %d active of %d experts", active, E);
    if (B < 1 || trials < 1) return ds_fail(err, "expert tiers: batch %d, %d trials", B, trials);
    if (!(r->pcie > 0 && r->cpu_read > 0 && r->cpu_flops > 0))
        return ds_fail(err, "expert tiers: rates must be > 0 (PCIe %g, CPU read %g, CPU flop/s %g)", r->pcie,
                       r->cpu_read, r->cpu_flops);
    double *w = malloc((size_t)E * sizeof *w), *cum = malloc((size_t)E * sizeof *cum);
    int *stamp = malloc((size_t)E * sizeof *stamp), *count = malloc((size_t)E * sizeof *count);
    int *tok = malloc((size_t)E * sizeof *tok), *way = malloc((size_t)E * sizeof *way);
    if (!w || !cum || !stamp || !count || !tok || !way) {
        free(w), free(cum), free(stamp), free(count), free(tok), free(way);
        return ds_fail(err, "out of memory");
    }
    uint64_t s = seed;
    for (int t = 0; t < trials; t++)
        for (int l = 0; l < L; l++) {
            double sum = 0;
            for (int e = 0; e < E; e++) sum += load ? load[(size_t)l * E + e] : 0;
            for (int e = 0; e < E; e++) {
                w[e] = sum > 0 ? load[(size_t)l * E + e] : 1.0;
                cum[e] = (e ? cum[e - 1] : 0) + w[e];
                count[e] = 0;
                stamp[e] = -1; /* the token that chose it last */
            }
            for (int b = 0; b < B; b++)
                for (int k = 0; k < active; k++) {
                    int e = draw(w, cum, E, stamp, b, &s);
                    stamp[e] = b;
                    count[e]++;
                }
            int n = 0;
            for (int e = 0; e < E; e++)
                if (count[e] && !p->resident[(size_t)l * E + e]) tok[n++] = count[e];
            out->seconds += ds_tier_split(r, expert_bytes, flops_per_token, n, tok, way);
            out->misses += n;
            for (int i = 0; i < n; i++) {
                if (way[i] == DS_TIER_COPY)
                    out->copied += 1, out->bytes += expert_bytes;
                else
                    out->cpu_tokens += tok[i];
            }
        }
    out->misses /= trials, out->copied /= trials, out->cpu_tokens /= trials, out->bytes /= trials;
    out->seconds /= trials;
    free(w), free(cum), free(stamp), free(count), free(tok), free(way);
    return 0;
}
