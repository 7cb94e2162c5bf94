/* test_sampler.c — RNG, exp, greedy, sampling frequencies, filters, penalties,
 * determinism, validation; and the fast paths (pre-filters, selection, radix
 * sort) against a naive reference that sorts everything with qsort.
 *
 * Every statistical check uses fixed seeds, so the outcome is deterministic;
 * tolerances are stated at each check (5 sigma unless said otherwise). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampler.h"
#include "testutil.h"

/* Small deterministic generator for test inputs (not the sampler's RNG). */
static uint64_t sm_state;
static uint64_t splitmix(void) {
    uint64_t z = (sm_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(splitmix() >> 11) * 0x1p-53; }

/* ------------------------------------------------------------ reference --- */

typedef struct {
    float w;
    int id;
} item;

static int item_cmp(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static double ref_scaled(float w, float wmax, double t) {
    if (wmax == INFINITY) return w == INFINITY ? 0.0 : -HUGE_VAL;
    return ((double)w - (double)wmax) / t;
}

/* The pipeline of sampler.h written the obvious way: no pre-filter, a full
 * qsort, a walk over the vocabulary for the draw. */
typedef unsigned __int128 u128;
static int32_t ref_sample(const ds_sampling *p, const float *logits, int vocab, const int32_t *hist,
                          int nh, int64_t pos, ds_sample_scratch *s) {
    ds_err err;
    float *w = malloc((size_t)vocab * sizeof *w);
    memcpy(w, logits, (size_t)vocab * sizeof *w);
    if (ds_apply_penalties(p, w, vocab, hist, nh, s, &err)) {
        free(w);
        return -2;
    }
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (w[i] > w[best]) best = i;
    if (w[best] == -INFINITY) {
        free(w);
        return -1;
    }
    if (p->temperature == 0) {
        free(w);
        return best;
    }
    float wmax = w[best];
    item *it = malloc((size_t)vocab * sizeof *it);
    double *e = calloc((size_t)vocab, sizeof *e);   /* by token id */
    uint64_t *q = calloc((size_t)vocab, sizeof *q); /* by token id; 0 = not kept */
    int n = 0;
    for (int i = 0; i < vocab; i++)
        if (w[i] != -INFINITY) it[n++] = (item){w[i], i};
    qsort(it, (size_t)n, sizeof *it, item_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    u128 z = 0;
    for (int j = 0; j < n; j++) {
        int id = it[j].id;
        e[id] = ds_sample_exp(ref_scaled(it[j].w, wmax, p->temperature));
        q[id] = (uint64_t)ldexp(e[id], 52);
        z += q[id];
    }
    if (p->top_p < 1) {
        double t = ceil(p->top_p * (double)z);
        u128 need = t < 1 ? 1 : (u128)t, cum = 0;
        if (need > z) need = z;
        int j = 0;
        while ((cum += q[it[j].id]) < need) j++;
        for (j++; j < n; j++) q[it[j].id] = 0;
    }
    z = 0;
    for (int i = 0; i < vocab; i++) {
        if (p->min_p > 0 && e[i] < p->min_p) q[i] = 0;
        z += q[i];
    }
    /* z < vocab * 2^52 < 2^74 here, so r * z fits 128 bits */
    uint64_t r = (uint64_t)ldexp(ds_rng_uniform(p->seed, (uint64_t)pos), 53);
    u128 target = ((u128)r * z) >> 53, cum = 0;
    int32_t tok = 0;
    while ((cum += q[tok]) <= target) tok++;
    free(w);
    free(it);
    free(e);
    free(q);
    return tok;
}

/* ------------------------------------------------------------------ RNG --- */

static void test_philox_kat(void) {
    /* Random123 tests/kat_vectors, "philox4x32 10" lines: ctr[4] key[2] -> out[4]. */
    static const uint32_t v[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
         0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
         0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        ds_philox4x32_10(v[t], v[t] + 4, out);
        CHECK(memcmp(out, v[t] + 6, sizeof out) == 0, "philox KAT %d: %08x %08x %08x %08x", t, out[0], out[1],
              out[2], out[3]);
    }
}

static void test_rng(void) {
    /* Same key, same value; stateless: interleaving other draws changes nothing. */
    double a = ds_rng_uniform(42, 7);
    for (int i = 0; i < 100; i++) (void)ds_rng_uniform((uint64_t)i, (uint64_t)i * 3);
    CHECK(ds_rng_uniform(42, 7) == a, "same (seed, position) must repeat");
    CHECK(ds_rng_uniform(42, 8) != a, "neighbouring position must differ");
    CHECK(ds_rng_uniform(43, 7) != a, "neighbouring seed must differ");
    CHECK(ds_rng_uniform(42ull | (1ull << 40), 7) != a, "high seed bits must matter");
    CHECK(ds_rng_uniform(42, 7ull | (1ull << 40)) != a, "high position bits must matter");

    /* 100k draws over consecutive positions of one seed. */
    enum { N = 100000, BINS = 100 };
    static int bins[BINS];
    double sum = 0, sum2 = 0;
    int bad_range = 0, non53 = 0, low_bit = 0, dup = 0;
    double prev = -1;
    for (int i = 0; i < N; i++) {
        double u = ds_rng_uniform(0x1234567890abcdefull, (uint64_t)i);
        if (!(u >= 0 && u < 1)) bad_range++;
        double s = u * 0x1p53;
        if (s != floor(s)) non53++;
        if (((uint64_t)s) & 1) low_bit++;
        if (u == prev) dup++;
        prev = u;
        sum += u;
        sum2 += u * u;
        bins[(int)(u * BINS)]++;
    }
    CHECK(bad_range == 0, "%d draws outside [0,1)", bad_range);
    CHECK(non53 == 0, "%d draws not multiples of 2^-53", non53);
    CHECK(dup == 0, "%d consecutive duplicates", dup);
    /* lowest of the 53 bits is set in about half the draws: sd 158, allow 5 sd */
    CHECK(fabs(low_bit - N / 2.0) < 5 * sqrt(N / 4.0), "low bit set %d of %d", low_bit, N);
    double mean = sum / N, var = sum2 / N - mean * mean;
    /* sd of the mean = sqrt(1/12/N) = 0.00091; of the variance ~ sqrt(1/180/N) = 0.00024 */
    CHECK(fabs(mean - 0.5) < 5 * 0.000913, "mean %f", mean);
    CHECK(fabs(var - 1.0 / 12) < 5 * 0.000236, "variance %f", var);
    double chi2 = 0, expct = (double)N / BINS;
    for (int b = 0; b < BINS; b++) chi2 += (bins[b] - expct) * (bins[b] - expct) / expct;
    /* df = 99: mean 99, sd 14.1; accept within 5 sd on both sides */
    CHECK(chi2 > 99 - 5 * 14.07 && chi2 < 99 + 5 * 14.07, "chi-square %f (df 99)", chi2);

    /* Across seeds at one position, too. */
    double s2 = 0;
    for (int i = 0; i < N; i++) s2 += ds_rng_uniform((uint64_t)i, 5);
    CHECK(fabs(s2 / N - 0.5) < 5 * 0.000913, "mean across seeds %f", s2 / N);
}

static void test_exp(void) {
    CHECK(ds_sample_exp(0.0) == 1.0, "exp(0) = %.17g", ds_sample_exp(0.0));
    CHECK(ds_sample_exp(-0.0) == 1.0, "exp(-0)");
    CHECK(ds_sample_exp(-708.0) > 2.2250738585072014e-308, "exp(-708) must be a normal number");
    CHECK(ds_sample_exp(-708.0000001) == 0.0, "below the cutoff exp is exactly 0");
    CHECK(ds_sample_exp(-HUGE_VAL) == 0.0, "exp(-inf)");
    CHECK(ds_sample_exp(1000.0) == HUGE_VAL, "exp(1000)");
    CHECK(isnan(ds_sample_exp((double)NAN)), "exp(nan)");
    double worst = 0, wx = 0;
    for (int i = 0; i < 200000; i++) {
        double x = i < 100000 ? -708.0 * unif() : (unif() - 0.5) * 40;
        double r = fabs(ds_sample_exp(x) - exp(x)) / exp(x);
        if (r > worst) worst = r, wx = x;
    }
    /* fdlibm is < 1 ulp; libm is within ~0.5 ulp: allow 1.5 * 2^-52 relative */
    CHECK(worst < 1.5 * 0x1p-52, "exp rel error %g at %.17g", worst, wx);
    double xs[] = {1.0, -1.0, 0.5, -0.3466, 0.3466, 1e-10, -1e-20, 700, -700.5, 709.7};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        double r = fabs(ds_sample_exp(xs[i]) - exp(xs[i])) / exp(xs[i]);
        CHECK(r < 1.5 * 0x1p-52, "exp(%g) rel error %g", xs[i], r);
    }
}

/* The batch (AVX2 when built with it) must give the scalar bits, in range and out. */
static void test_exp_batch(void) {
    enum { N = 100003 };
    static double x[N], y[N];
    const double divisors[] = {1.0, 0.7, 3.0, 1e-3};
    for (int d = 0; d < 4; d++) {
        for (int i = 0; i < N; i++) {
            double u = unif();
            x[i] = i % 97 == 0 ? (unif() - 0.5) * 2000 : -u * 708.0 * divisors[d]; /* some lanes out of range */
            if (i % 1013 == 0) x[i] = (double)NAN;
            if (i % 1019 == 0) x[i] = -HUGE_VAL;
            if (i % 1021 == 0) x[i] = -0.0;
            y[i] = x[i];
        }
        ds_sample_exp_div_n(y, N, divisors[d]);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            double want = ds_sample_exp(x[i] / divisors[d]);
            bad += memcmp(&want, &y[i], sizeof want) != 0;
        }
        CHECK(bad == 0, "batch exp differs from scalar in %d of %d (divisor %g)", bad, N, divisors[d]);
    }
}

/* Golden values: the bits must not drift between builds (SIMD on/off, compiler,
 * optimisation level, libm) — a fused multiply-add or a changed algorithm shows
 * up here. Update them only for a deliberate change of the sampling rule. */
static uint64_t fnv(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

static void test_golden(void) {
    uint64_t h = 1469598103934665603ull, h2 = h, h3 = h;
    static double xs[100000];
    for (int i = 0; i < 100000; i++) {
        double y = ds_sample_exp(-708.0 * i / 100000.0);
        uint64_t b;
        memcpy(&b, &y, sizeof b);
        h = fnv(h, b);
        xs[i] = -708.0 * i / 100000.0 * 0.7;
    }
    ds_sample_exp_div_n(xs, 100000, 0.7);
    for (int i = 0; i < 100000; i++) {
        uint64_t b;
        memcpy(&b, &xs[i], sizeof b);
        h2 = fnv(h2, b);
    }
    CHECK(h == 0x620ed103fb140755ull, "exp golden hash %016llx", (unsigned long long)h);
    CHECK(h2 == 0x00ebe6dbffd14fc5ull, "batch exp golden hash %016llx", (unsigned long long)h2);

    /* A fixed token stream over several parameter sets. */
    ds_err err;
    enum { V = 3000 };
    ds_sample_scratch *s = ds_sample_scratch_create(V, &err);
    static float l[V];
    uint64_t st = 77;
    for (int i = 0; i < V; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(st >> 40) * 0x1p-24 * 20.0 - 10.0);
    }
    int32_t hist[] = {5, 17, 5, 2999, 0};
    for (int cfg = 0; cfg < 6; cfg++) {
        ds_sampling p;
        ds_sampling_init(&p);
        p.seed = 0xfeedull + (uint64_t)cfg;
        p.temperature = (double[]){1.0, 0.6, 1.3, 0.9, 1.0, 0.2}[cfg];
        p.top_k = (int[]){0, 40, 0, 0, 200, 0}[cfg];
        p.top_p = (double[]){1.0, 1.0, 0.95, 1.0, 0.8, 0.99}[cfg];
        p.min_p = (double[]){0.0, 0.0, 0.0, 0.02, 0.05, 0.0}[cfg];
        p.repetition_penalty = cfg == 3 ? 1.2 : 1.0;
        p.frequency_penalty = cfg == 3 ? 0.3 : 0.0;
        for (int pos = 0; pos < 200; pos++) {
            int32_t tok = -1;
            ds_sample(&p, l, V, hist, 5, pos, s, &tok, &err);
            h3 = fnv(h3, (uint64_t)(uint32_t)tok);
        }
    }
    CHECK(h3 == 0xaef9d261b08fdbc8ull, "token stream golden hash %016llx", (unsigned long long)h3);
    ds_sample_scratch_free(s);
}

/* --------------------------------------------------------------- greedy --- */

static void test_greedy(ds_sample_scratch *s) {
    ds_sampling p;
    ds_sampling_init(&p);
    p.temperature = 0;
    ds_err err;
    int32_t tok = -1;
    float l1[] = {0.5f, 2.0f, -1.0f, 1.9f};
    CHECK(ds_sample(&p, l1, 4, NULL, 0, 0, s, &tok, &err) == 0 && tok == 1, "argmax: got %d", tok);
    float l2[] = {1.0f, 3.0f, 0.0f, 3.0f, 3.0f};
    CHECK(ds_sample(&p, l2, 5, NULL, 0, 0, s, &tok, &err) == 0 && tok == 1, "tie -> lower id: got %d", tok);
    float l3[] = {NAN, -INFINITY, -5.0f, NAN};
    CHECK(ds_sample(&p, l3, 4, NULL, 0, 0, s, &tok, &err) == 0 && tok == 2, "NaN is -inf: got %d", tok);
    float l4[] = {-0.0f, 0.0f};
    CHECK(ds_sample(&p, l4, 2, NULL, 0, 0, s, &tok, &err) == 0 && tok == 0, "-0 ties +0: got %d", tok);
    float l5[] = {1.0f, INFINITY, 2.0f, INFINITY};
    CHECK(ds_sample(&p, l5, 4, NULL, 0, 0, s, &tok, &err) == 0 && tok == 1, "+inf wins: got %d", tok);
    float l6[] = {NAN, -INFINITY, NAN};
    CHECK(ds_sample(&p, l6, 3, NULL, 0, 0, s, &tok, &err) == -1 && strstr(err.msg, "NaN or -inf"),
          "all -inf must fail: %s", err.msg);
    p.temperature = 1;
    CHECK(ds_sample(&p, l6, 3, NULL, 0, 0, s, &tok, &err) == -1, "all -inf must fail when sampling too");
    /* Repetition penalty applies to greedy as well. */
    p.temperature = 0;
    p.repetition_penalty = 1.5;
    float l7[] = {2.0f, 1.9f};
    int32_t h[] = {0};
    CHECK(ds_sample(&p, l7, 2, h, 1, 0, s, &tok, &err) == 0 && tok == 1, "penalised argmax: got %d", tok);
    /* Greedy ignores seed and position. */
    p.repetition_penalty = 1;
    p.seed = 99;
    CHECK(ds_sample(&p, l1, 4, NULL, 0, 12345, s, &tok, &err) == 0 && tok == 1, "greedy seed-free");
    /* A lone +inf with sampling: always drawn; two +inf: only those two. */
    p.temperature = 1;
    int c1 = 0, c3 = 0, other = 0;
    for (int pos = 0; pos < 2000; pos++) {
        ds_sample(&p, l5, 4, NULL, 0, pos, s, &tok, &err);
        if (tok == 1) c1++;
        else if (tok == 3) c3++;
        else other++;
    }
    CHECK(other == 0 && c1 > 800 && c3 > 800, "+inf tokens share: %d %d %d", c1, c3, other);
}

/* ------------------------------------------------------------ sampling --- */

/* Draws n positions; counts[] gets token frequencies. */
static void draw(const ds_sampling *p, const float *l, int vocab, int n, ds_sample_scratch *s, int *counts) {
    ds_err err;
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int pos = 0; pos < n; pos++) {
        int32_t tok = -1;
        if (ds_sample(p, l, vocab, NULL, 0, pos, s, &tok, &err) != 0 || tok < 0 || tok >= vocab) {
            CHECK(0, "sample failed at %d: %s", pos, err.msg);
            return;
        }
        counts[tok]++;
    }
}

/* |count - n q| within 5 sd of a binomial, for every token; q[] sums to 1. */
static void check_freq(const char *what, const int *counts, const double *q, int vocab, int n) {
    for (int i = 0; i < vocab; i++) {
        double mu = n * q[i], sd = sqrt(n * q[i] * (1 - q[i]));
        if (q[i] == 0)
            CHECK(counts[i] == 0, "%s: token %d has prob 0 but drawn %d times", what, i, counts[i]);
        else
            CHECK(fabs(counts[i] - mu) <= 5 * sd, "%s: token %d drawn %d, expected %.1f +- %.1f", what, i,
                  counts[i], mu, sd);
    }
}

static void test_frequencies(ds_sample_scratch *s) {
    enum { N = 200000 };
    ds_sampling p;
    ds_sampling_init(&p);
    p.seed = 2024;
    float l[4] = {1.0f, 2.0f, 0.5f, -1.0f};
    int counts[4];
    for (int rep = 0; rep < 2; rep++) {
        p.temperature = rep == 0 ? 1.0 : 0.7;
        double q[4], z = 0;
        for (int i = 0; i < 4; i++) z += q[i] = exp((double)l[i] / p.temperature);
        for (int i = 0; i < 4; i++) q[i] /= z;
        draw(&p, l, 4, N, s, counts);
        check_freq(rep == 0 ? "softmax T=1" : "softmax T=0.7", counts, q, 4, N);
        /* chi-square, df 3: P(chi2 > 30) ~ 1.4e-6 */
        double chi2 = 0;
        for (int i = 0; i < 4; i++) chi2 += (counts[i] - N * q[i]) * (counts[i] - N * q[i]) / (N * q[i]);
        CHECK(chi2 < 30, "chi-square %f (df 3)", chi2);
    }
}

/* The inverse CDF walks the vocabulary in id order over integer weights
 * floor(e * 2^52): logits {-0, +0, 1, +0} have weights c, c, 2^52, c
 * (c = floor(exp(-1) 2^52)); the token is the first whose running sum exceeds
 * floor(r * z / 2^53), r the draw's 53 random bits. */
static void test_inverse_cdf_order(ds_sample_scratch *s) {
    ds_sampling p;
    ds_sampling_init(&p);
    p.seed = 31337;
    ds_err err;
    const float l[4] = {-0.0f, 0.0f, 1.0f, 0.0f};
    const uint64_t c = (uint64_t)ldexp(ds_sample_exp(-1.0), 52), w[4] = {c, c, 1ull << 52, c};
    const u128 z = (u128)w[0] + w[1] + w[2] + w[3];
    int bad = 0, seen[4] = {0};
    for (int pos = 0; pos < 2000; pos++) {
        uint64_t r = (uint64_t)ldexp(ds_rng_uniform(p.seed, (uint64_t)pos), 53);
        u128 target = ((u128)r * z) >> 53, cum = 0;
        int want = 0;
        while ((cum += w[want]) <= target) want++;
        int32_t tok = -1;
        ds_sample(&p, l, 4, NULL, 0, pos, s, &tok, &err);
        bad += tok != want;
        seen[want]++;
    }
    CHECK(bad == 0, "%d of 2000 draws not the inverse CDF in id order", bad);
    CHECK(seen[0] && seen[1] && seen[2] && seen[3], "every token drawn");
}

static void test_filters(ds_sample_scratch *s) {
    enum { N = 40000 };
    ds_sampling p;
    ds_sampling_init(&p);
    p.seed = 7;
    int counts[8];
    double q[8];

    /* top-k with a tie at the boundary: order is 1(3.0) 4(3.0) 2(2.9) 6(2.9) ... */
    float lk[8] = {0.1f, 3.0f, 2.9f, 0.5f, 3.0f, 1.0f, 2.9f, -1.0f};
    p.top_k = 3;
    draw(&p, lk, 8, N, s, counts);
    double a = exp(3.0), b = exp((double)2.9f - 3.0 + 3.0);
    memset(q, 0, sizeof q);
    q[1] = q[4] = a / (2 * a + b);
    q[2] = b / (2 * a + b);
    check_freq("top_k=3", counts, q, 8, N);
    p.top_k = 1;
    draw(&p, lk, 8, 2000, s, counts);
    CHECK(counts[1] == 2000, "top_k=1 is argmax (lower id of the tie): %d", counts[1]);
    p.top_k = 100; /* larger than vocab: off */
    draw(&p, lk, 8, N, s, counts);
    CHECK(counts[7] > 0 && counts[0] > 0, "top_k > vocab keeps everything");
    p.top_k = 0;

    /* top-p on p = {0.5, 0.3, 0.15, 0.05}: prefix sums .5 .8 .95 1 */
    float lp[4];
    const double pp[4] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < 4; i++) lp[i] = (float)log(pp[i]);
    p.top_p = 0.75;
    draw(&p, lp, 4, N, s, counts);
    double qp[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    check_freq("top_p=0.75", counts, qp, 4, N);
    p.top_p = 0.9;
    draw(&p, lp, 4, N, s, counts);
    double qp2[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    check_freq("top_p=0.9", counts, qp2, 4, N);
    p.top_p = 0.01;
    draw(&p, lp, 4, 2000, s, counts);
    CHECK(counts[0] == 2000, "tiny top_p keeps only the top token: %d", counts[0]);

    /* min-p: threshold min_p * 0.5. Pre-filter path (top_p = 1) and general path
     * (top_p < 1 but not binding) must agree on the kept set. */
    for (int path = 0; path < 2; path++) {
        p.top_p = path == 0 ? 1.0 : 0.999;
        p.min_p = 0.4; /* 0.2: keeps 0.5, 0.3 */
        draw(&p, lp, 4, N, s, counts);
        check_freq(path == 0 ? "min_p=0.4 (prefilter)" : "min_p=0.4 (general)", counts, qp, 4, N);
        p.min_p = 0.25; /* 0.125: keeps 0.5, 0.3, 0.15 */
        draw(&p, lp, 4, N, s, counts);
        check_freq(path == 0 ? "min_p=0.25 (prefilter)" : "min_p=0.25 (general)", counts, qp2, 4, N);
        p.min_p = 1.0; /* only the top */
        draw(&p, lp, 4, 2000, s, counts);
        CHECK(counts[0] == 2000, "min_p=1 keeps only the top token: %d", counts[0]);
    }
    /* top-p then min-p compose: top_p 0.9 -> {0,1,2}, min_p 0.4 -> {0,1} */
    p.top_p = 0.9;
    p.min_p = 0.4;
    draw(&p, lp, 4, N, s, counts);
    check_freq("top_p=0.9 + min_p=0.4", counts, qp, 4, N);
}

/* ------------------------------------------------------------ penalties --- */

static void test_penalties(ds_sample_scratch *s) {
    ds_sampling p;
    ds_sampling_init(&p);
    ds_err err;
    const float base[6] = {2.0f, -1.5f, 3.0f, 0.5f, 0.0f, NAN};
    const int32_t hist[] = {0, 1, 1, 3, 3, 3, 4};
    float w[6];

    /* repetition only (HF): >0 divides, <=0 multiplies; not-in-history untouched */
    p.repetition_penalty = 2.0;
    memcpy(w, base, sizeof w);
    CHECK(ds_apply_penalties(&p, w, 6, hist, 7, s, &err) == 0, "%s", err.msg);
    CHECK(w[0] == 1.0f && w[1] == -3.0f && w[2] == 3.0f && w[3] == 0.25f && w[4] == 0.0f && w[5] == -INFINITY,
          "repetition: %g %g %g %g %g %g", (double)w[0], (double)w[1], (double)w[2], (double)w[3], (double)w[4], (double)w[5]);

    /* presence / frequency only (OpenAI): w -= presence + frequency * count */
    p.repetition_penalty = 1.0;
    p.presence_penalty = 0.5;
    p.frequency_penalty = 0.25;
    memcpy(w, base, sizeof w);
    CHECK(ds_apply_penalties(&p, w, 6, hist, 7, s, &err) == 0, "%s", err.msg);
    CHECK(w[0] == 1.25f && w[1] == -2.5f && w[2] == 3.0f && w[3] == -0.75f && w[4] == -0.75f,
          "presence/frequency: %g %g %g %g %g", (double)w[0], (double)w[1], (double)w[2], (double)w[3], (double)w[4]);

    /* all three: repetition first, then presence/frequency */
    p.repetition_penalty = 2.0;
    memcpy(w, base, sizeof w);
    CHECK(ds_apply_penalties(&p, w, 6, hist, 7, s, &err) == 0, "%s", err.msg);
    CHECK(w[0] == 0.25f && w[1] == -4.0f && w[2] == 3.0f && w[3] == -1.0f && w[4] == -0.75f,
          "combined: %g %g %g %g %g", (double)w[0], (double)w[1], (double)w[2], (double)w[3], (double)w[4]);
    /* again: the scratch's counts must have been left clean */
    memcpy(w, base, sizeof w);
    ds_apply_penalties(&p, w, 6, hist, 7, s, &err);
    CHECK(w[0] == 0.25f && w[1] == -4.0f && w[3] == -1.0f, "second call differs: counts not reset");
    /* negative penalties (allowed by OpenAI) raise logits; order of history irrelevant */
    p.repetition_penalty = 1.0;
    p.presence_penalty = -1.0;
    p.frequency_penalty = -0.5;
    const int32_t hist2[] = {3, 1, 3, 0, 3, 1, 4};
    memcpy(w, base, sizeof w);
    ds_apply_penalties(&p, w, 6, hist2, 7, s, &err);
    CHECK(w[0] == 3.5f && w[1] == 0.5f && w[3] == 3.0f && w[4] == 1.5f, "negative: %g %g %g %g", (double)w[0], (double)w[1],
          (double)w[3], (double)w[4]);

    /* ds_sample sees the penalised logits: a huge presence penalty bans token 0 */
    p.presence_penalty = 1000;
    p.frequency_penalty = 0;
    p.temperature = 1;
    float l[3] = {5.0f, 1.0f, 1.0f};
    int32_t h0[] = {0};
    int drawn0 = 0;
    for (int pos = 0; pos < 5000; pos++) {
        int32_t tok;
        ds_sample(&p, l, 3, h0, 1, pos, s, &tok, &err);
        drawn0 += tok == 0;
    }
    CHECK(drawn0 == 0, "penalised token drawn %d times", drawn0);
}

/* --------------------------------------------------------- determinism --- */

static void test_determinism(void) {
    ds_err err;
    enum { V = 1000, NPOS = 400 };
    ds_sample_scratch *s1 = ds_sample_scratch_create(V, &err), *s2 = ds_sample_scratch_create(129280, &err);
    float *l = malloc(V * sizeof *l);
    sm_state = 99;
    for (int i = 0; i < V; i++) l[i] = (float)(unif() * 8 - 4);
    ds_sampling pa, pb;
    ds_sampling_init(&pa);
    pa.temperature = 0.8;
    pa.top_p = 0.95;
    pa.seed = 1;
    pb = pa;
    pb.seed = 2;
    pb.top_k = 40;
    int32_t ta[NPOS], tb[NPOS];
    for (int i = 0; i < NPOS; i++) ds_sample(&pa, l, V, NULL, 0, i, s1, &ta[i], &err);
    for (int i = 0; i < NPOS; i++) ds_sample(&pb, l, V, NULL, 0, i, s1, &tb[i], &err);
    int same_ab = 0, bad = 0, bad2 = 0;
    for (int i = 0; i < NPOS; i++) same_ab += ta[i] == tb[i];
    CHECK(same_ab < NPOS / 4, "different seeds gave %d/%d equal tokens", same_ab, NPOS);
    /* interleaved, in reverse position order, alternating scratches */
    for (int i = NPOS - 1; i >= 0; i--) {
        int32_t x, y;
        ds_sample(&pb, l, V, NULL, 0, i, (i & 1) ? s1 : s2, &y, &err);
        ds_sample(&pa, l, V, NULL, 0, i, (i & 1) ? s2 : s1, &x, &err);
        bad += x != ta[i] || y != tb[i];
        int32_t x2;
        ds_sample(&pa, l, V, NULL, 0, i, s1, &x2, &err);
        bad2 += x2 != x;
    }
    CHECK(bad == 0, "%d tokens changed when calls were interleaved", bad);
    CHECK(bad2 == 0, "%d tokens changed on repeating a call", bad2);
    /* the caller's logits are not modified */
    sm_state = 99;
    int changed = 0;
    for (int i = 0; i < V; i++) changed += l[i] != (float)(unif() * 8 - 4);
    CHECK(changed == 0, "logits modified");
    free(l);
    ds_sample_scratch_free(s1);
    ds_sample_scratch_free(s2);
}

/* Fast paths (underflow and min-p pre-filters, quickselect, radix sort) against
 * the qsort reference over many shapes, including ties, NaN, -inf, +inf and
 * temperatures small enough that most weights underflow. */
static void test_against_reference(void) {
    ds_err err;
    const int vocabs[] = {1, 2, 3, 7, 50, 100, 1000, 5000, 129280};
    const int nv = (int)(sizeof vocabs / sizeof vocabs[0]);
    ds_sample_scratch *s = ds_sample_scratch_create(129280, &err), *s3 = ds_sample_scratch_create(129280, &err);
    ds_sample_scratch_set_threads(s3, 3); /* the vocabulary passes in slices on three threads */
    float *l = malloc(129280 * sizeof *l);
    int32_t hist[64];
    int mismatches = 0, total = 0, errors = 0, thread_diff = 0, threaded = 0;
    sm_state = 5;
    for (int trial = 0; trial < 400; trial++) {
        int vocab = vocabs[trial % nv];
        int big = vocab > 10000;
        if (big && trial / nv % 3) continue; /* keep the qsort reference affordable */
        int ties = trial % 4 == 0;
        double spread = (double[]){1, 10, 40, 3000}[trial / nv % 4];
        for (int i = 0; i < vocab; i++) {
            double r = (unif() - 0.5) * spread;
            if (ties) r = floor(r * 4) / 4; /* many equal logits */
            l[i] = (float)r;
            double u = unif();
            if (u < 0.02) l[i] = -INFINITY;
            else if (u < 0.03) l[i] = NAN;
            else if (u < 0.04) l[i] = -0.0f;
        }
        if (trial % 37 == 5) l[vocab / 2] = INFINITY;
        ds_sampling p;
        ds_sampling_init(&p);
        p.seed = splitmix();
        p.temperature = (double[]){1.0, 0.7, 0.05, 2.5, 0.001, 1e-30}[trial % 6];
        p.top_k = (int[]){0, 0, 1, 5, 40, 1000, 200000, 5000}[trial % 8];
        p.top_p = (double[]){1.0, 0.9, 0.5, 0.999999}[trial / 7 % 4];
        p.min_p = (double[]){0.0, 0.05, 0.3}[trial / 3 % 3];
        if (trial % 5 == 0) {
            p.repetition_penalty = 1.3;
            p.presence_penalty = 0.4;
            p.frequency_penalty = 0.1;
        }
        int nh = vocab > 1 ? (int)(splitmix() % 64) : 0;
        for (int i = 0; i < nh; i++) hist[i] = (int32_t)(splitmix() % (uint64_t)vocab);
        int npos = big ? 3 : 25;
        for (int k = 0; k < npos; k++) {
            int64_t pos = (int64_t)(splitmix() % 100000);
            int32_t tok = -7;
            int rc = ds_sample(&p, l, vocab, hist, nh, pos, s, &tok, &err);
            int32_t want = ref_sample(&p, l, vocab, hist, nh, pos, s);
            int32_t tok3 = -7;
            int rc3 = ds_sample(&p, l, vocab, hist, nh, pos, s3, &tok3, &err);
            thread_diff += rc3 != rc || tok3 != tok;
            threaded += vocab > 16384;
            total++;
            if (want == -1) {
                errors += rc != -1;
                continue;
            }
            if (rc != 0 || tok != want) {
                if (mismatches < 5)
                    fprintf(stderr, "trial %d vocab %d T %g k %d p %g min_p %g: got %d want %d (%s)\n", trial,
                            vocab, p.temperature, p.top_k, p.top_p, p.min_p, tok, want, rc ? err.msg : "");
                mismatches++;
            }
        }
    }
    CHECK(mismatches == 0 && errors == 0, "%d of %d samples differ from the reference (%d error mismatches)",
          mismatches, total, errors);
    CHECK(total > 3000, "only %d comparisons", total);
    CHECK(thread_diff == 0, "%d of %d samples differ on three threads", thread_diff, total);
    CHECK(threaded >= 30, "only %d samples over a vocabulary of several slices", threaded);
    free(l);
    ds_sample_scratch_free(s);
    ds_sample_scratch_free(s3);
}

/* The whole distribution over a vocabulary of several slices (the path whose
 * block sums come from the sliced pass), one and three threads, against the
 * reference. */
static void test_plain_large(void) {
    ds_err err;
    const int vocabs[] = {129280, 40000};
    ds_sample_scratch *s1 = ds_sample_scratch_create(129280, &err), *s3 = ds_sample_scratch_create(129280, &err);
    ds_sample_scratch_set_threads(s3, 3);
    float *l = malloc(129280 * sizeof *l);
    int bad = 0, bad3 = 0, n = 0;
    sm_state = 11;
    for (int v = 0; v < 2; v++) {
        int vocab = vocabs[v];
        for (int i = 0; i < vocab; i++) l[i] = (float)((unif() - 0.5) * 12);
        for (int k = 0; k < 16; k++) {
            ds_sampling p;
            ds_sampling_init(&p);
            p.temperature = k % 2 ? 1.3 : 0.8;
            p.seed = splitmix();
            int64_t pos = (int64_t)(splitmix() % 100000);
            int32_t t1 = -1, t3 = -1;
            ds_sample(&p, l, vocab, NULL, 0, pos, s1, &t1, &err);
            ds_sample(&p, l, vocab, NULL, 0, pos, s3, &t3, &err);
            bad += t1 != ref_sample(&p, l, vocab, NULL, 0, pos, s1);
            bad3 += t3 != t1;
            n++;
        }
    }
    CHECK(bad == 0 && bad3 == 0, "%d of %d draws differ from the reference, %d on three threads", bad, n, bad3);
    free(l);
    ds_sample_scratch_free(s1);
    ds_sample_scratch_free(s3);
}

/* ----------------------------------------------------------- validation --- */

static void expect_field(const ds_sampling *p, const char *field, ds_sample_scratch *s) {
    ds_err err;
    memset(&err, 0, sizeof err);
    float l[2] = {0, 1};
    int32_t tok;
    int rc = ds_sample(p, l, 2, NULL, 0, 0, s, &tok, &err);
    CHECK(rc == -1 && strstr(err.msg, field), "expected an error naming %s, got rc %d '%s'", field, rc, err.msg);
    memset(&err, 0, sizeof err);
    rc = ds_sampling_validate(p, &err);
    CHECK(rc == -1 && strstr(err.msg, field), "validate: expected %s, got '%s'", field, err.msg);
}

static void test_validation(ds_sample_scratch *s) {
    ds_sampling ok, p;
    ds_sampling_init(&ok);
    ds_err err;
    CHECK(ds_sampling_validate(&ok, &err) == 0, "defaults must validate");
    p = ok, p.temperature = -0.1, expect_field(&p, "temperature", s);
    p = ok, p.temperature = (double)NAN, expect_field(&p, "temperature", s);
    p = ok, p.temperature = HUGE_VAL, expect_field(&p, "temperature", s);
    p = ok, p.top_k = -1, expect_field(&p, "top_k", s);
    p = ok, p.top_p = 0, expect_field(&p, "top_p", s);
    p = ok, p.top_p = 1.01, expect_field(&p, "top_p", s);
    p = ok, p.top_p = (double)NAN, expect_field(&p, "top_p", s);
    p = ok, p.min_p = -0.01, expect_field(&p, "min_p", s);
    p = ok, p.min_p = 1.5, expect_field(&p, "min_p", s);
    p = ok, p.repetition_penalty = 0, expect_field(&p, "repetition_penalty", s);
    p = ok, p.repetition_penalty = HUGE_VAL, expect_field(&p, "repetition_penalty", s);
    p = ok, p.presence_penalty = (double)NAN, expect_field(&p, "presence_penalty", s);
    p = ok, p.frequency_penalty = -HUGE_VAL, expect_field(&p, "frequency_penalty", s);

    float l[4] = {0, 1, 2, 3};
    int32_t tok, bad_hist[] = {1, 4};
    CHECK(ds_sample(&ok, l, 0, NULL, 0, 0, s, &tok, &err) == -1 && strstr(err.msg, "vocab"), "vocab 0: %s",
          err.msg);
    CHECK(ds_sample(&ok, l, 1 << 20, NULL, 0, 0, s, &tok, &err) == -1 && strstr(err.msg, "vocab"),
          "vocab > scratch: %s", err.msg);
    CHECK(ds_sample(&ok, l, 4, bad_hist, 2, 0, s, &tok, &err) == -1 && strstr(err.msg, "history[1]"),
          "history out of range: %s", err.msg);
    CHECK(ds_sample(&ok, l, 4, NULL, 0, -1, s, &tok, &err) == -1 && strstr(err.msg, "position"), "position: %s",
          err.msg);
    CHECK(ds_sample_scratch_create(0, &err) == NULL && strstr(err.msg, "vocab"), "scratch vocab 0: %s", err.msg);
    /* A rejected history must not leave counts behind (validated before counting). */
    ds_sampling pen = ok;
    pen.presence_penalty = 1;
    float w[4] = {0, 1, 2, 3};
    int32_t h[] = {2};
    ds_apply_penalties(&pen, w, 4, h, 1, s, &err);
    CHECK(w[0] == 0 && w[1] == 1 && w[2] == 1 && w[3] == 3, "penalties after a failed call: %g %g %g %g", (double)w[0],
          (double)w[1], (double)w[2], (double)w[3]);
}

static void test_stop(void) {
    int32_t stop[] = {1, 128001, 7};
    CHECK(ds_stop_check(stop, 3, 128001) == 1, "stop id found");
    CHECK(ds_stop_check(stop, 3, 7) == 1, "last stop id found");
    CHECK(ds_stop_check(stop, 3, 2) == 0, "non-stop id");
    CHECK(ds_stop_check(stop, 2, 7) == 0, "n_stop respected");
    CHECK(ds_stop_check(NULL, 0, 1) == 0, "empty list");
}

int main(void) {
    ds_err err;
    ds_sample_scratch *s = ds_sample_scratch_create(1024, &err);
    CHECK(s != NULL, "scratch: %s", err.msg);
    if (!s) return test_summary("sampler");
    sm_state = 1;
    test_philox_kat();
    test_rng();
    test_exp();
    test_exp_batch();
    test_golden();
    test_greedy(s);
    test_frequencies(s);
    test_inverse_cdf_order(s);
    test_filters(s);
    test_penalties(s);
    test_validation(s);
    test_stop();
    test_determinism();
    test_against_reference();
    test_plain_large();
    ds_sample_scratch_free(s);
    return test_summary("sampler");
}
