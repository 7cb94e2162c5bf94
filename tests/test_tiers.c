/* test_tiers.c — the expert tiers' plan and cost model (ep/tiers.h): the
 * slots go to the experts of the most load (ties to the lower layer, then
 * expert) and serve their share of it; a layer's misses are split between the
 * copy stream and the CPU as the rule says (worked by hand below); the
 * simulated steps' misses match their expectation from the load, are the same
 * for a seed, and every expert is chosen at most once per token; the rates
 * learned from measured steps reach the measured ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep/tiers.h"
#include "testutil.h"

static void test_plan(void) {
    ds_err err;
    ds_tier_plan p;
    enum { L = 3, E = 8 };
    double load[L * E];
    for (int i = 0; i < L * E; i++) load[i] = 1;
    load[2 * E + 5] = 50, load[0 * E + 7] = 20, load[1 * E + 1] = 20; /* ties: layer 0 before layer 1 */
    CHECK(!ds_tier_plan_build(&p, L, E, load, 2, &err), "%s", err.msg);
    CHECK(p.resident[2 * E + 5] && p.resident[0 * E + 7] && !p.resident[1 * E + 1], "the two of most load");
    int n = 0;
    for (int i = 0; i < L * E; i++) n += p.resident[i];
    CHECK(n == 2 && p.slots == 2, "%d resident", n);
    double total = 50 + 20 + 20 + (L * E - 3);
    CHECK(fabs(p.hit - 70 / total) < 1e-12, "hit %g, want %g", p.hit, 70 / total);
    ds_tier_plan_free(&p);

    CHECK(!ds_tier_plan_build(&p, L, E, NULL, E + 1, &err), "%s", err.msg); /* every load the same */
    n = 0;
    for (int e = 0; e < E; e++) n += p.resident[e];
    CHECK(n == E && p.resident[E] && !p.resident[E + 1], "ties go to layer 0, then layer 1's expert 0");
    CHECK(fabs(p.hit - (E + 1.0) / (L * E)) < 1e-12, "hit %g", p.hit);
    ds_tier_plan_free(&p);

    CHECK(!ds_tier_plan_build(&p, L, E, load, 1000, &err) && p.slots == L * E && p.hit == 1, "more slots than experts");
    ds_tier_plan_free(&p);
    CHECK(!ds_tier_plan_build(&p, L, E, load, 0, &err) && p.hit == 0, "no slot");
    ds_tier_plan_free(&p);

    load[E + 3] = -1;
    CHECK(ds_tier_plan_build(&p, L, E, load, 2, &err) && strstr(err.msg, "layer 1 expert 3"), "negative load: %s",
          err.msg);
    CHECK(ds_tier_plan_build(&p, L, E, NULL, -1, &err), "negative slots");
}

static void test_split(void) {
    /* a copy costs 1 s; the CPU max(1, tokens) s */
    ds_tier_rates r = {1, 1, 1};
    int way[4];
    /* 3 tokens: copy (1 <= 3); then 1 token: CPU (copy would end at 2, the CPU at 1); then 1 token: copy
     * and CPU would both end at 2, the copy wins the tie */
    int t1[3] = {1, 3, 1};
    double s = ds_tier_split(&r, 1, 1, 3, t1, way);
    CHECK(way[1] == DS_TIER_COPY && way[0] == DS_TIER_CPU && way[2] == DS_TIER_COPY && s == 2, "ways %d %d %d, %g s",
          way[0], way[1], way[2], s);
    /* a cheap CPU takes everything: copies cost 10 s, the CPU 1 s an expert */
    ds_tier_rates slow_pcie = {0.1, 1, 1};
    int t2[4] = {1, 1, 1, 1};
    s = ds_tier_split(&slow_pcie, 1, 1, 4, t2, way);
    CHECK(s == 4 && way[0] == DS_TIER_CPU && way[3] == DS_TIER_CPU, "slow PCIe: %g s", s);
    /* many tokens make the CPU compute-bound: 100 tokens at 10 flop/s is 10 s, a copy 1 s */
    ds_tier_rates slow_cpu = {1, 1, 10};
    int t3[2] = {100, 100};
    s = ds_tier_split(&slow_cpu, 1, 1, 2, t3, way);
    CHECK(s == 2 && way[0] == DS_TIER_COPY && way[1] == DS_TIER_COPY, "compute-bound CPU: %g s", s);
    CHECK(ds_tier_split(&r, 1, 1, 0, t3, way) == 0, "no miss, no time");
}

/* The store's rates, learned from what steps took: a link measured at 5 GB/s
 * against an assumed 50, a CPU 4x slower than assumed (the predicted seconds
 * follow the learned rates, as in the store); a step without copies or CPU
 * work leaves its part alone; one wild measurement moves a rate 1000^(1/4)x
 * at most. */
static void test_learn(void) {
    ds_tier_rates r = {DS_TIER_PCIE, DS_TIER_CPU_READ, DS_TIER_CPU_FLOPS};
    const double bytes = 13.37e6, fpt = 2.0 * 3.0 * 2048 * 4096;
    const ds_tier_rates truth = {5e9, DS_TIER_CPU_READ / 4, DS_TIER_CPU_FLOPS / 4};
    for (int i = 0; i < 80; i++) {
        int tokens = 1 + i % 5; /* read-bound and flop-bound experts */
        double took = ds_tier_cpu_seconds(&truth, bytes, fpt, tokens);
        double pred = ds_tier_cpu_seconds(&r, bytes, fpt, tokens);
        ds_tier_rates_learn(&r, 3 * bytes, 3 * bytes / truth.pcie, pred, took);
    }
    CHECK(fabs(r.pcie / 5e9 - 1) < 1e-3, "copies measured at 5 GB/s: learned %.4g GB/s", r.pcie / 1e9);
    CHECK(fabs(r.cpu_read / truth.cpu_read - 1) < 1e-3 && fabs(r.cpu_flops / truth.cpu_flops - 1) < 1e-3,
          "a CPU 4x slower: learned %.4g GB/s, %.4g GFLOP/s", r.cpu_read / 1e9, r.cpu_flops / 1e9);
    ds_tier_rates before = r;
    ds_tier_rates_learn(&r, 0, 0, 0, 0);
    ds_tier_rates_learn(&r, 1e9, 0, 1.0, -1);
    CHECK(!memcmp(&before, &r, sizeof r), "a step without copies or CPU work changes no rate");
    ds_tier_rates_learn(&r, 1e9, 1e-9, 0, 0); /* 1e18 B/s */
    CHECK(fabs(r.pcie / before.pcie - pow(1e3, 0.25)) < 1e-9, "a wild copy rate moves the link %.4gx (1000^(1/4))",
          r.pcie / before.pcie);
    /* with such rates the split keeps one-token experts on the CPU: 0.53 ms each of reading (25 GB/s)
     * against 2.67 ms a copy at 5 GB/s; at the assumed 50 GB/s (0.27 ms) the first is copied */
    ds_tier_rates slow = {5e9, 25e9, 250e9}, fast = {50e9, 25e9, 250e9};
    int tok[2] = {1, 1}, way[2];
    ds_tier_split(&slow, bytes, fpt, 2, tok, way);
    CHECK(way[0] == DS_TIER_CPU && way[1] == DS_TIER_CPU, "at 5 GB/s two one-token experts on the CPU: ways %d %d",
          way[0], way[1]);
    ds_tier_split(&fast, bytes, fpt, 2, tok, way);
    CHECK(way[0] == DS_TIER_COPY, "at 50 GB/s the first one-token expert copied: way %d", way[0]);
}

static void test_simulate(void) {
    ds_err err;
    ds_tier_plan p;
    enum { L = 4, E = 16 };
    double load[L * E];
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) load[l * E + e] = e < E / 2 ? 3 : 1;
    ds_tier_rates r = {50e9, 100e9, 1e12};
    double eb = 13e6, fl = 5e7;
    CHECK(!ds_tier_plan_build(&p, L, E, load, L * E / 2, &err), "%s", err.msg);
    CHECK(fabs(p.hit - 0.75) < 1e-12, "hit %g", p.hit);
    /* one token, one expert a layer: a layer misses with probability 1/4 */
    ds_tier_step s, s2;
    CHECK(!ds_tier_simulate(&p, load, 1, 1, &r, eb, fl, 4000, 7, &s, &err), "%s", err.msg);
    CHECK(fabs(s.misses - L * 0.25) < 0.06, "misses %g, want %g", s.misses, L * 0.25);
    CHECK(fabs(s.copied * eb - s.bytes) < 1, "bytes %g for %g copies", s.bytes, s.copied);
    CHECK(fabs(s.copied + s.cpu_tokens - s.misses) < 1e-9, "one token a miss: copied + CPU tokens = misses");
    CHECK(!ds_tier_simulate(&p, load, 1, 1, &r, eb, fl, 4000, 7, &s2, &err) && !memcmp(&s, &s2, sizeof s),
          "the same seed, the same steps");
    /* every token takes all E experts of a layer: the non-resident half misses, each with B tokens */
    CHECK(!ds_tier_simulate(&p, load, E, 5, &r, eb, fl, 3, 1, &s, &err), "%s", err.msg);
    CHECK(s.misses == L * E / 2 && s.cpu_tokens == 5 * (L * E / 2 - s.copied), "all chosen: misses %g, CPU tokens %g",
          s.misses, s.cpu_tokens);
    /* an expert without load is never drawn, except when a token needs every expert */
    load[3] = 0;
    CHECK(!ds_tier_simulate(&p, load, E, 2, &r, eb, fl, 2, 1, &s, &err) && s.misses == L * E / 2, "zero load, all");
    ds_tier_plan_free(&p);
    /* every expert resident: nothing to move */
    CHECK(!ds_tier_plan_build(&p, L, E, load, L * E, &err), "%s", err.msg);
    CHECK(!ds_tier_simulate(&p, load, 2, 8, &r, eb, fl, 10, 1, &s, &err) && s.misses == 0 && s.seconds == 0,
          "all resident");
    CHECK(ds_tier_simulate(&p, load, E + 1, 1, &r, eb, fl, 1, 1, &s, &err) && strstr(err.msg, "active"),
          "more active than experts");
    ds_tier_rates zero = {0, 1, 1};
    CHECK(ds_tier_simulate(&p, load, 1, 1, &zero, eb, fl, 1, 1, &s, &err) && strstr(err.msg, "rates"), "zero rate");
    ds_tier_plan_free(&p);
}

int main(void) {
    test_plan();
    test_split();
    test_learn();
    test_simulate();
    return test_summary("tiers");
}
