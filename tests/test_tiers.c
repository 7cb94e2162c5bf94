/* test_tiers.c — the expert tiers' plan and cost model (ep/tiers.h): the
 * slots go to the experts of the most load (ties to the lower layer, then
 * expert) and serve their share of it; a layer's misses are split between the
 * copy stream and the CPU as the rule says (worked by hand below); the
 * simulated steps' misses match their expectation from the load, are the same
 * for a seed, and every expert is chosen at most once per token. */
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
    test_simulate();
    return test_summary("tiers");
}
