/* sampler.c — deterministic token sampling; see sampler.h for the pipeline and
 * why every step gives the same bits for the same inputs. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* Bit-exact results need every multiply and add rounded on its own: the build
 * passes -ffp-contract=off; clang also honours the pragma (GCC ignores it and
 * would warn). The golden hashes in tests/test_sampler.c catch a fused build. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---------------------------------------------------------------- exp --- */

/* Below this exp(x) < 2^-1021 would be close to the subnormal range; we return
 * exactly 0 so that "e == 0" and "x < DS_EXP_CUTOFF" are the same test. */
#define DS_EXP_CUTOFF (-708.0)

static double pow2i(int k) { /* 2^k for -1022 <= k <= 1023, exact */
    uint64_t b = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* fdlibm e_exp.c: x = k ln2 + r, |r| <= ln2/2, exp(r) via a degree-5 Remez
 * rational form, scaled by 2^k. Plain IEEE double operations only (the build
 * uses -ffp-contract=off), so the result bits are fixed. fdlibm's separate k == 0
 * formula is dropped: with k == 0 (hi = r, lo = 0) the general one gives the
 * same bits, and one formula keeps the loop below branch-free. */
static const double EXP_LN2_HI = 6.93147180369123816490e-01; /* 0x3fe62e42fee00000 */
static const double EXP_LN2_LO = 1.90821492927058770002e-10; /* 0x3dea39ef35793c76 */
static const double EXP_INV_LN2 = 1.44269504088896338700e+00;
static const double EXP_P1 = 1.66666666666666019037e-01, EXP_P2 = -2.77777777770155933842e-03,
                    EXP_P3 = 6.61375632143793436117e-05, EXP_P4 = -1.65339022054652515390e-06,
                    EXP_P5 = 4.13813679705723846039e-08;

/* exp for DS_EXP_CUTOFF <= x <= 709.78 (k in [-1021, 1024]). */
static inline double exp_core(double x) {
    int k = (int)(EXP_INV_LN2 * x + (x < 0 ? -0.5 : 0.5)); /* round to nearest */
    double hi = x - (double)k * EXP_LN2_HI; /* exact: EXP_LN2_HI has 21 zero low bits */
    double lo = (double)k * EXP_LN2_LO;
    double r = hi - lo;
    double t = r * r;
    double c = r - t * (EXP_P1 + t * (EXP_P2 + t * (EXP_P3 + t * (EXP_P4 + t * EXP_P5))));
    double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    if (k == 1024) return y * 2.0 * pow2i(1023);
    return y * pow2i(k); /* k >= -1021 here, so the product is normal and exact */
}

double ds_sample_exp(double x) {
    if (x != x) return x;
    if (x > 7.09782712893383973096e+02) return HUGE_VAL;
    if (x < DS_EXP_CUTOFF) return 0.0;
    return exp_core(x);
}

#if defined(__AVX2__)
/* exp_core on four lanes, DS_EXP_CUTOFF <= x <= 0 in each: exactly the scalar
 * operations in the scalar order (no FMA: the build uses -ffp-contract=off,
 * and mul/add/sub/div/convert are IEEE-exact in both), so the same bits. */
static inline __m256d exp_core4(__m256d xv) {
    const __m256d v_inv_ln2 = _mm256_set1_pd(EXP_INV_LN2), v_half = _mm256_set1_pd(0.5),
                  v_mhalf = _mm256_set1_pd(-0.5), v_zero = _mm256_setzero_pd(), v_hi = _mm256_set1_pd(EXP_LN2_HI),
                  v_lo = _mm256_set1_pd(EXP_LN2_LO), v_p1 = _mm256_set1_pd(EXP_P1), v_p2 = _mm256_set1_pd(EXP_P2),
                  v_p3 = _mm256_set1_pd(EXP_P3), v_p4 = _mm256_set1_pd(EXP_P4), v_p5 = _mm256_set1_pd(EXP_P5),
                  v_one = _mm256_set1_pd(1.0), v_two = _mm256_set1_pd(2.0);
    const __m256i v_bias = _mm256_set1_epi64x(1023);
    __m256d h = _mm256_blendv_pd(v_half, v_mhalf, _mm256_cmp_pd(xv, v_zero, _CMP_LT_OQ));
    __m128i ki = _mm256_cvttpd_epi32(_mm256_add_pd(_mm256_mul_pd(v_inv_ln2, xv), h));
    __m256d kd = _mm256_cvtepi32_pd(ki);
    __m256d hi = _mm256_sub_pd(xv, _mm256_mul_pd(kd, v_hi));
    __m256d lo = _mm256_mul_pd(kd, v_lo);
    __m256d r = _mm256_sub_pd(hi, lo);
    __m256d t = _mm256_mul_pd(r, r);
    __m256d q = _mm256_add_pd(v_p4, _mm256_mul_pd(t, v_p5));
    q = _mm256_add_pd(v_p3, _mm256_mul_pd(t, q));
    q = _mm256_add_pd(v_p2, _mm256_mul_pd(t, q));
    q = _mm256_add_pd(v_p1, _mm256_mul_pd(t, q));
    __m256d c = _mm256_sub_pd(r, _mm256_mul_pd(t, q));
    __m256d rc = _mm256_div_pd(_mm256_mul_pd(r, c), _mm256_sub_pd(v_two, c));
    __m256d y = _mm256_sub_pd(v_one, _mm256_sub_pd(_mm256_sub_pd(lo, rc), hi));
    __m256i sc = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(ki), v_bias), 52);
    return _mm256_mul_pd(y, _mm256_castsi256_pd(sc));
}
#endif

/* x[i] = ds_sample_exp(x[i] / divisor). With AVX2 four lanes at a time; lanes
 * outside [DS_EXP_CUTOFF, 0] after the division are redone by the scalar code. */
void ds_sample_exp_div_n(double *x, int n, double divisor) {
    int j = 0;
#if defined(__AVX2__)
    const __m256d v_div = _mm256_set1_pd(divisor), v_zero = _mm256_setzero_pd(),
                  v_cut = _mm256_set1_pd(DS_EXP_CUTOFF);
    for (; j + 4 <= n; j += 4) {
        __m256d xv = _mm256_div_pd(_mm256_loadu_pd(x + j), v_div);
        /* in-range lanes: DS_EXP_CUTOFF <= x <= 0 (false for NaN) */
        __m256d ok = _mm256_and_pd(_mm256_cmp_pd(xv, v_cut, _CMP_GE_OQ), _mm256_cmp_pd(xv, v_zero, _CMP_LE_OQ));
        if (_mm256_movemask_pd(ok) != 0xF) {
            for (int l = 0; l < 4; l++) x[j + l] = ds_sample_exp(x[j + l] / divisor);
            continue;
        }
        _mm256_storeu_pd(x + j, exp_core4(xv));
    }
#endif
    for (; j < n; j++) x[j] = ds_sample_exp(x[j] / divisor);
}

/* ---------------------------------------------------------------- RNG --- */

void ds_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

double ds_rng_uniform(uint64_t seed, uint64_t position) {
    const uint32_t ctr[4] = {(uint32_t)position, (uint32_t)(position >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    ds_philox4x32_10(ctr, key, r);
    uint64_t bits = (((uint64_t)r[0] << 32) | r[1]) >> 11;
    return (double)bits * 0x1p-53;
}

/* ------------------------------------------------------------ params --- */

void ds_sampling_init(ds_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0;
    p->top_k = 0;
    p->top_p = 1.0;
    p->min_p = 0.0;
    p->repetition_penalty = 1.0;
    p->presence_penalty = 0.0;
    p->frequency_penalty = 0.0;
    p->seed = 0;
}

int ds_sampling_validate(const ds_sampling *p, ds_err *err) {
    if (!p) return ds_fail(err, "sampling: NULL parameters");
    if (!(p->temperature >= 0) || isinf(p->temperature))
        return ds_fail(err, "sampling: temperature must be finite and >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return ds_fail(err, "sampling: top_k must be >= 0 (got %d)", (int)p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return ds_fail(err, "sampling: top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return ds_fail(err, "sampling: min_p must be in [0, 1] (got %g)", p->min_p);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0))
        return ds_fail(err, "sampling: repetition_penalty must be finite and > 0 (got %g)",
                       p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return ds_fail(err, "sampling: presence_penalty must be finite (got %g)", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return ds_fail(err, "sampling: frequency_penalty must be finite (got %g)", p->frequency_penalty);
    return 0;
}

/* ----------------------------------------------------------- scratch --- */

#define RADIX_BITS 11
#define RADIX_BUCKETS (1 << RADIX_BITS)
#define RADIX_MAX_PASSES 3 /* token ids: up to 31 bits */

/* A token's weight is an integer, q = floor(exp(x) * 2^52) <= 2^52, and
 * the sums of weights are exact 128-bit integers (2^31 tokens at most: below
 * 2^83), so no filter and no draw depends on the order of a summation. */
#if !defined(__SIZEOF_INT128__)
#error "sampler.c needs unsigned __int128 (GCC or Clang on a 64-bit target)"
#endif
typedef unsigned __int128 u128;
#define DS_QBLOCK 2048 /* 2048 weights <= 2^52 sum below 2^63: one uint64 */

/* The passes over the whole vocabulary go in slices of DS_SLICE tokens (a
 * whole number of DS_QBLOCK blocks), one slice a thread at a time: each
 * token's values and each block's sum are computed alone, and the maximum is
 * exact in any order, so the slices' split changes no bit. */
#define DS_SLICE (8 * DS_QBLOCK)

struct ds_sample_scratch {
    int max_vocab;
    float *w;        /* working logits */
    int32_t *count;  /* per-token history counts; all zero between calls */
    int32_t *ids;    /* candidates' token ids, ascending */
    uint64_t *keys;  /* candidates' (logit desc, id asc) keys, in id order */
    uint64_t *tmp;   /* radix sort buffer */
    double *e;       /* candidates' exp weights */
    uint64_t *q;     /* candidates' integer weights */
    int32_t *sel, *sel2; /* selection lists */
    uint64_t *bsum;  /* block sums of the kept weights */
    float *smax;     /* each slice's largest logit */
    int threads;     /* for the passes over the whole vocabulary (ds_sample_scratch_set_threads) */
    uint32_t hist[RADIX_MAX_PASSES * RADIX_BUCKETS];
    u128 bw[4 * RADIX_BUCKETS]; /* selection: weight per digit, four copies */
};

ds_sample_scratch *ds_sample_scratch_create(int max_vocab, ds_err *err) {
    if (max_vocab <= 0) {
        ds_fail(err, "sampler: vocab must be > 0 (got %d)", max_vocab);
        return NULL;
    }
    ds_sample_scratch *s = calloc(1, sizeof *s);
    if (!s) {
        ds_fail(err, "sampler: out of memory for scratch");
        return NULL;
    }
    size_t n = (size_t)max_vocab;
    s->max_vocab = max_vocab;
    s->threads = 1;
    s->w = malloc(n * sizeof *s->w);
    s->count = calloc(n, sizeof *s->count);
    s->ids = malloc(n * sizeof *s->ids);
    s->keys = malloc(n * sizeof *s->keys);
    s->tmp = malloc(n * sizeof *s->tmp);
    s->e = malloc(n * sizeof *s->e);
    s->q = malloc(n * sizeof *s->q);
    s->sel = malloc(n * sizeof *s->sel);
    s->sel2 = malloc(n * sizeof *s->sel2);
    s->bsum = malloc((n / DS_QBLOCK + 1) * sizeof *s->bsum);
    s->smax = malloc((n / DS_SLICE + 1) * sizeof *s->smax);
    if (!s->w || !s->count || !s->ids || !s->keys || !s->tmp || !s->e || !s->q || !s->sel || !s->sel2 ||
        !s->bsum || !s->smax) {
        ds_sample_scratch_free(s);
        ds_fail(err, "sampler: out of memory for scratch (vocab %d)", max_vocab);
        return NULL;
    }
    return s;
}

void ds_sample_scratch_free(ds_sample_scratch *s) {
    if (!s) return;
    free(s->w);
    free(s->count);
    free(s->ids);
    free(s->keys);
    free(s->tmp);
    free(s->e);
    free(s->q);
    free(s->sel);
    free(s->sel2);
    free(s->bsum);
    free(s->smax);
    free(s);
}

void ds_sample_scratch_set_threads(ds_sample_scratch *s, int threads) {
    if (s) s->threads = threads < 1 ? 1 : threads;
}

/* --------------------------------------------------------- penalties --- */

static float clean_logit(float f) {
    if (f != f) return -INFINITY;
    if (f == 0) return 0.0f; /* -0 -> +0: equal logits must give equal sort keys */
    return f;
}

static int check_inputs(const ds_sampling *p, const void *logits, int vocab, const int32_t *history,
                        int n_history, const ds_sample_scratch *scratch, ds_err *err) {
    if (ds_sampling_validate(p, err)) return -1;
    if (!logits) return ds_fail(err, "sampler: logits is NULL");
    if (!scratch) return ds_fail(err, "sampler: scratch is NULL");
    if (vocab <= 0) return ds_fail(err, "sampler: vocab must be > 0 (got %d)", vocab);
    if (vocab > scratch->max_vocab)
        return ds_fail(err, "sampler: vocab %d exceeds the scratch's max_vocab %d", vocab,
                       scratch->max_vocab);
    if (n_history < 0) return ds_fail(err, "sampler: n_history must be >= 0 (got %d)", n_history);
    if (n_history > 0 && !history) return ds_fail(err, "sampler: history is NULL with n_history %d", n_history);
    for (int i = 0; i < n_history; i++)
        if (history[i] < 0 || history[i] >= vocab)
            return ds_fail(err, "sampler: history[%d] = %d outside [0, %d)", i, (int)history[i], vocab);
    return 0;
}

/* Inputs already checked. Each distinct history token is penalised once with
 * its occurrence count; count[] is restored to all-zero on the way. */
static void penalize(const ds_sampling *p, float *w, const int32_t *history, int n_history,
                     int32_t *count) {
    const double rep = p->repetition_penalty, pres = p->presence_penalty, freq = p->frequency_penalty;
    if (rep == 1.0 && pres == 0.0 && freq == 0.0) return; /* exact no-op anyway; skip the work */
    for (int i = 0; i < n_history; i++) count[history[i]]++;
    for (int i = 0; i < n_history; i++) {
        int32_t t = history[i];
        int32_t c = count[t];
        if (c == 0) continue; /* already done */
        count[t] = 0;
        double v = (double)w[t];
        v = v > 0 ? v / rep : v * rep;
        v = v - (pres + freq * (double)c);
        w[t] = clean_logit((float)v); /* inf - inf -> NaN -> -inf; tiny -> -0 -> +0 */
    }
}

/* w = clean(logits); returns max w. The max of canonical values (no NaN, no
 * -0) is exact in any order, so the vector path returns the same bits. */
static float clean_copy_max(const float *logits, int vocab, float *w) {
    float wmax = -INFINITY;
    int i = 0;
#if defined(__AVX2__)
    const __m256 v_ninf = _mm256_set1_ps(-INFINITY), v_zero = _mm256_setzero_ps();
    __m256 vmax = v_ninf;
    for (; i + 8 <= vocab; i += 8) {
        __m256 f = _mm256_loadu_ps(logits + i);
        f = _mm256_blendv_ps(v_ninf, f, _mm256_cmp_ps(f, f, _CMP_ORD_Q)); /* NaN -> -inf */
        f = _mm256_add_ps(f, v_zero);                                      /* -0 -> +0 */
        _mm256_storeu_ps(w + i, f);
        vmax = _mm256_max_ps(vmax, f);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (int l = 0; l < 8; l++) wmax = lanes[l] > wmax ? lanes[l] : wmax;
#endif
    for (; i < vocab; i++) {
        float f = clean_logit(logits[i]);
        w[i] = f;
        wmax = f > wmax ? f : wmax;
    }
    return wmax;
}

int ds_apply_penalties(const ds_sampling *p, float *logits, int vocab, const int32_t *history,
                       int n_history, ds_sample_scratch *scratch, ds_err *err) {
    if (check_inputs(p, logits, vocab, history, n_history, scratch, err)) return -1;
    for (int i = 0; i < vocab; i++) logits[i] = clean_logit(logits[i]);
    penalize(p, logits, history, n_history, scratch->count);
    return 0;
}

/* ----------------------------------------------------------- ordering --- */

/* Order-preserving map of a float onto uint32 (total order, -0 < +0). */
static uint32_t float_ord(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static float ord_float(uint32_t o) {
    uint32_t u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Key whose ascending order is (w descending, id ascending). w is canonical
 * (no NaN, no -0), so equal logits have equal bits. */
static uint64_t make_key(float w, int id, int idbits) {
    return ((uint64_t)(~float_ord(w)) << idbits) | (uint64_t)(uint32_t)id;
}

static float key_logit(uint64_t key, int idbits) { return ord_float(~(uint32_t)(key >> idbits)); }

/* Stable LSD radix sort of a[0..n) by key bits [0, nbits), nbits <= 33. */
static void radix_sort(uint64_t *a, int n, int nbits, uint64_t *tmp, uint32_t *hist) {
    const int passes = (nbits + RADIX_BITS - 1) / RADIX_BITS;
    const uint64_t low = ((uint64_t)1 << nbits) - 1;
    memset(hist, 0, (size_t)passes * RADIX_BUCKETS * sizeof *hist);
    for (int i = 0; i < n; i++) {
        uint64_t k = a[i] & low;
        for (int p = 0; p < passes; p++) hist[p * RADIX_BUCKETS + ((k >> (p * RADIX_BITS)) & (RADIX_BUCKETS - 1))]++;
    }
    uint64_t *src = a, *dst = tmp;
    for (int p = 0; p < passes; p++) {
        uint32_t *h = hist + p * RADIX_BUCKETS;
        const int shift = p * RADIX_BITS;
#define DIGIT(k) ((((k) & low) >> shift) & (RADIX_BUCKETS - 1))
        if (h[DIGIT(src[0])] == (uint32_t)n) continue; /* one bucket */
        uint32_t sum = 0;
        for (int b = 0; b < RADIX_BUCKETS; b++) {
            uint32_t c = h[b];
            h[b] = sum;
            sum += c;
        }
        for (int i = 0; i < n; i++) {
            uint64_t k = src[i];
            dst[h[DIGIT(k)]++] = k;
        }
#undef DIGIT
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

/* Keys a[0..n) (distinct ids) into ascending id order. */
static void sort_by_id(uint64_t *a, int n, int idbits, uint64_t *tmp, uint32_t *hist) {
    const uint64_t idmask = ((uint64_t)1 << idbits) - 1;
    if (n > 64) {
        radix_sort(a, n, idbits, tmp, hist);
        return;
    }
    for (int i = 1; i < n; i++) {
        uint64_t v = a[i];
        int j = i - 1;
        while (j >= 0 && (a[j] & idmask) > (v & idmask)) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

static void heap_sift_down(uint64_t *h, int n, int i) {
    uint64_t v = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] > h[c]) c++;
        if (h[c] <= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

/* The k smallest keys among tokens with w >= wcut, into h[0..return) unsorted:
 * a max-heap of k keys over the tokens in id order. A later token can only
 * displace the root if its logit is strictly larger (equal logit, larger id),
 * so the common case costs one float compare. */
static int heap_select(const float *w, int vocab, float wcut, int k, int idbits, uint64_t *h) {
    int n = 0, i = 0;
    for (; i < vocab && n < k; i++) {
        if (!(w[i] >= wcut)) continue;
        uint64_t key = make_key(w[i], i, idbits);
        int j = n++;
        while (j > 0 && h[(j - 1) / 2] < key) { /* sift up */
            h[j] = h[(j - 1) / 2];
            j = (j - 1) / 2;
        }
        h[j] = key;
    }
    if (n < k) return n;
    float root_w = key_logit(h[0], idbits);
    while (i < vocab) {
#if defined(__AVX2__)
        if (i + 8 <= vocab && /* eight tokens at once that cannot displace the root */
            !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), _mm256_set1_ps(root_w), _CMP_GT_OQ))) {
            i += 8;
            continue;
        }
#endif
        if (w[i] > root_w && w[i] >= wcut) {
            h[0] = make_key(w[i], i, idbits);
            heap_sift_down(h, k, 0);
            root_w = key_logit(h[0], idbits);
        }
        i++;
    }
    return k;
}

/* Among the entries j < n with keys[j] <= limit, the smallest key kb whose
 * running weight (the weights of the entries with keys <= kb) reaches need;
 * wt NULL: every weight 1. frac > 0: need = ceil(frac * total) in double
 * arithmetic instead, total being the weight of those entries. need is
 * clamped to [1, total]; total >= 1. A most-significant-digit radix
 * selection: each level sums the weights per digit of the remaining entries
 * and keeps the one bucket where the running weight crosses need. Keys are
 * distinct, so one entry is left at the latest after the last digit, and its
 * weight is > 0 (its bucket's weight reached need >= 1). The sums are exact
 * integers, so the result does not depend on any order. The first level, over
 * every entry, sums into four copies of the table in turn: neighbouring
 * tokens mostly share a digit, and one counter added to back to back would
 * serialise on store forwarding. */
static uint64_t select_key(const uint64_t *keys, const uint64_t *wt, int n, uint64_t limit, u128 need,
                           double frac, int nbits, int32_t *list, int32_t *list2, u128 *bw) {
    const int32_t *src = NULL; /* the remaining entries; NULL: every j < n (the first level) */
    int len = n, shift = nbits;
    for (;;) {
        if (src && len == 1) return keys[src[0]];
        const int bits = shift >= RADIX_BITS ? RADIX_BITS : shift;
        shift -= bits;
        const uint64_t dm = ((uint64_t)1 << bits) - 1;
        const size_t nbk = (size_t)1 << bits;
        const int copies = src ? 1 : 4;
        memset(bw, 0, copies * nbk * sizeof *bw);
        int i = 0;
        if (!src) /* branch-free: the tests are random in id order */
            for (; i + 4 <= len; i += 4)
                for (int c = 0; c < 4; c++) {
                    const uint64_t k = keys[i + c];
                    bw[c * nbk + ((k >> shift) & dm)] += (wt ? wt[i + c] : 1) & -(uint64_t)(k <= limit);
                }
        for (; i < len; i++) {
            const int j = src ? src[i] : i;
            const uint64_t k = keys[j];
            bw[(k >> shift) & dm] += (wt ? wt[j] : 1) & -(uint64_t)(k <= limit);
        }
        if (!src) {
            u128 total = 0;
            for (size_t d = 0; d < nbk; d++) {
                bw[d] += bw[nbk + d] + bw[2 * nbk + d] + bw[3 * nbk + d];
                total += bw[d];
            }
            if (frac > 0) {
                const double t = ceil(frac * (double)total);
                need = t < 1 ? 1 : (u128)t;
            }
            if (need > total) need = total;
            if (need < 1) need = 1;
        }
        u128 cum = 0;
        uint64_t b = 0;
        while (cum + bw[b] < need) cum += bw[b++];
        need -= cum;
        int len2 = 0;
        for (int i2 = 0; i2 < len; i2++) {
            const int j = src ? src[i2] : i2;
            const uint64_t k = keys[j];
            list2[len2] = j;
            len2 += ((k >> shift) & dm) == b && k <= limit;
        }
        int32_t *t = list;
        list = list2, list2 = t;
        src = list, len = len2;
    }
}

/* ------------------------------------------------------------ sample --- */

/* The tempered, max-shifted logit; all callers must go through here so that
 * the pre-filter and the weights see the same bits. */
static double scaled_logit(float w, float wmax, double temperature) {
    if (wmax == INFINITY) return w == INFINITY ? 0.0 : -HUGE_VAL;
    return ((double)w - (double)wmax) / temperature;
}

/* Smallest float w with scaled_logit(w) >= xlo (xlo < 0). scaled_logit is
 * monotone in w (a subtraction and a division by T > 0, each rounding
 * monotonically), so "w >= cut" is exactly "scaled_logit(w) >= xlo" and the
 * candidate loop needs no arithmetic. Bisection over the float order. */
static float find_cut(float wmax, double temperature, double xlo) {
    uint32_t lo = float_ord(-INFINITY), hi = float_ord(wmax); /* pred(lo) false, pred(hi) true */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (scaled_logit(ord_float(mid), wmax, temperature) >= xlo)
            hi = mid;
        else
            lo = mid;
    }
    return ord_float(hi);
}

/* Below this x every weight is 0: exp(x) < 2^-52 for x < -52 ln 2, and our exp
 * is within an ulp, which the 1e-9 margin covers with room to spare. */
#define DS_ZERO_WEIGHT_X (-52.0 * 0.69314718055994530942 - 1e-9)

static uint64_t quantize(double e) { return (uint64_t)(e * 0x1p52); } /* exact scaling, truncated */

/* The heap path's few candidates: e[j] = exp(scaled_logit(w[ids[j]])),
 * q[j] = quantize(e[j]). */
static void weights_of(const float *w, const int32_t *ids, int m, float wmax, double temperature, double *e,
                       uint64_t *q) {
    if (wmax == INFINITY) {
        for (int j = 0; j < m; j++) e[j] = w[ids[j]] == INFINITY ? 1.0 : 0.0;
    } else {
        for (int j = 0; j < m; j++) e[j] = (double)w[ids[j]] - (double)wmax;
        ds_sample_exp_div_n(e, m, temperature); /* same bits as ds_sample_exp(scaled_logit(...)) */
    }
    for (int j = 0; j < m; j++) q[j] = quantize(e[j]);
}

/* Every token's weight, in id order: e[i] = exp(scaled_logit(w[i])) and
 * q[i] = quantize(e[i]) for the candidates (w >= cut), 0 for the rest. With
 * AVX2 four tokens at a time (a group of non-candidates costs one compare),
 * the same bits as the scalar loop: the candidates' x lie in [xlo, 0], inside
 * exp_core4's range; the quantization floor(v) + 2^52 reads v's integer from
 * the mantissa, exact for 0 <= v <= 2^52. */
static void weights_all(const float *w, int n, float cut, float wmax, double temperature, double *e,
                        uint64_t *q) {
    int i = 0;
    if (wmax == INFINITY) {
        for (; i < n; i++) {
            e[i] = w[i] == INFINITY ? 1.0 : 0.0;
            q[i] = quantize(e[i]);
        }
        return;
    }
#if defined(__AVX2__)
    const __m256d v_cut = _mm256_set1_pd((double)cut), v_max = _mm256_set1_pd((double)wmax),
                  v_t = _mm256_set1_pd(temperature), v_zero = _mm256_setzero_pd(),
                  v_scale = _mm256_set1_pd(0x1p52), v_magic = _mm256_set1_pd(0x1p52);
    for (; i + 4 <= n; i += 4) {
        __m256d wd = _mm256_cvtps_pd(_mm_loadu_ps(w + i)); /* exact */
        __m256d in = _mm256_cmp_pd(wd, v_cut, _CMP_GE_OQ);
        if (!_mm256_movemask_pd(in)) {
            _mm256_storeu_pd(e + i, v_zero);
            _mm256_storeu_si256((__m256i *)(q + i), _mm256_setzero_si256());
            continue;
        }
        __m256d x = _mm256_div_pd(_mm256_sub_pd(wd, v_max), v_t);
        x = _mm256_and_pd(x, in); /* non-candidates: exp(0), masked below */
        __m256d ev = _mm256_and_pd(exp_core4(x), in);
        __m256d v = _mm256_floor_pd(_mm256_mul_pd(ev, v_scale));
        __m256i qi = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(v, v_magic)), _mm256_castpd_si256(v_magic));
        _mm256_storeu_pd(e + i, ev);
        _mm256_storeu_si256((__m256i *)(q + i), qi);
    }
#endif
    for (; i < n; i++) {
        e[i] = w[i] >= cut ? ds_sample_exp(scaled_logit(w[i], wmax, temperature)) : 0.0;
        q[i] = quantize(e[i]);
    }
}

/* Zeroes the weights of the tokens not kept (keys NULL or key <= kb, and
 * e >= min_p: kept), writes the kept weights' sums per block of DS_QBLOCK
 * candidates (each below 2^63) and returns their total. */
static u128 keep_sums(uint64_t *q, int m, const uint64_t *keys, uint64_t kb, const double *e, double min_p,
                      uint64_t *bs) {
    u128 z = 0;
    for (int j0 = 0, b = 0; j0 < m; j0 += DS_QBLOCK, b++) {
        const int j1 = j0 + DS_QBLOCK < m ? j0 + DS_QBLOCK : m;
        uint64_t sb = 0;
        if (!keys && !(min_p > 0)) {
            for (int j = j0; j < j1; j++) sb += q[j];
        } else {
            for (int j = j0; j < j1; j++) {
                uint64_t v = q[j];
                if (keys) v &= -(uint64_t)(keys[j] <= kb);
                if (min_p > 0) v &= -(uint64_t)(e[j] >= min_p);
                q[j] = v;
                sb += v;
            }
        }
        bs[b] = sb;
        z += sb;
    }
    return z;
}

/* floor(u * z) for u = r / 2^53 (r < 2^53 an integer) and z < 2^83, exactly:
 * z = a 2^53 + b gives r a + floor(r b / 2^53), each product below 2^106. */
static u128 scale_draw(uint64_t r, u128 z) {
    const u128 a = z >> 53, b = z & (((u128)1 << 53) - 1);
    return (u128)r * a + (((u128)r * b) >> 53);
}

int ds_sample(const ds_sampling *p, const float *logits, int vocab, const int32_t *history,
              int n_history, int64_t position, ds_sample_scratch *scratch, int32_t *out_token,
              ds_err *err) {
    if (check_inputs(p, logits, vocab, history, n_history, scratch, err)) return -1;
    if (!out_token) return ds_fail(err, "sampler: out_token is NULL");
    if (position < 0) return ds_fail(err, "sampler: position must be >= 0 (got %lld)", (long long)position);

    float *w = scratch->w;
    const int n_slices = (vocab + DS_SLICE - 1) / DS_SLICE,
              nt = scratch->threads < n_slices ? scratch->threads : n_slices;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int sl = 0; sl < n_slices; sl++) {
        const int i0 = sl * DS_SLICE, n = vocab - i0 < DS_SLICE ? vocab - i0 : DS_SLICE;
        scratch->smax[sl] = clean_copy_max(logits + i0, n, w + i0);
    }
    /* not an OpenMP max reduction: its start value is the type's least finite
     * value with some compilers, which would hide an all -inf vocabulary */
    float wmax = -INFINITY;
    for (int sl = 0; sl < n_slices; sl++) wmax = scratch->smax[sl] > wmax ? scratch->smax[sl] : wmax;
    if (n_history > 0 && !(p->repetition_penalty == 1.0 && p->presence_penalty == 0.0 &&
                           p->frequency_penalty == 0.0)) {
        penalize(p, w, history, n_history, scratch->count);
        wmax = -INFINITY;
        for (int i = 0; i < vocab; i++) wmax = w[i] > wmax ? w[i] : wmax;
    }
    if (wmax == -INFINITY) return ds_fail(err, "sampler: every logit is NaN or -inf (vocab %d)", vocab);
    if (p->temperature == 0) {
        int best = 0;
        while (w[best] != wmax) best++; /* first maximum: ties go to the lower id */
        *out_token = best;
        return 0;
    }

    /* Candidates: w >= cut, a prefix of the order. Left out: tokens of weight 0
     * (x below DS_ZERO_WEIGHT_X); and when min-p is the last filter standing
     * (top_p == 1) tokens with x < log(min_p) - 1e-6: they have e < min_p, so
     * min-p drops them anyway, and top-k ahead of min-p sees the same prefix.
     * The margin covers libm's log and our exp; the exact test stays below. */
    const double T = p->temperature;
    double xlo = DS_ZERO_WEIGHT_X;
    if (p->top_p >= 1.0 && p->min_p > 0) {
        double b = log(p->min_p) - 1e-6;
        if (b > xlo) xlo = b;
    }
    const float cut = wmax == INFINITY ? INFINITY : find_cut(wmax, T, xlo);
    int idbits = 1;
    while (idbits < 31 && ((uint32_t)(vocab - 1) >> idbits) != 0) idbits++;
    const uint64_t idmask = ((uint64_t)1 << idbits) - 1;
    uint64_t *keys = scratch->keys, *q = scratch->q;
    int32_t *ids = scratch->ids;
    double *e = scratch->e;
    /* The survivors of top-k and top-p: keys <= kb. A token that is no
     * candidate has the key UINT64_MAX (a real key has bits above 32 + idbits
     * clear), so it is never counted. */
    uint64_t kb = UINT64_MAX - 1;
    int m, limited = 0;
    const int32_t *idv = NULL; /* the candidates' ids; NULL: candidate j is token j */
    if (p->top_k > 0 && p->top_k <= 4096 && p->top_k < vocab / 4) {
        m = heap_select(w, vocab, cut, p->top_k, idbits, keys); /* the top-k set itself */
        sort_by_id(keys, m, idbits, scratch->tmp, scratch->hist);
        for (int j = 0; j < m; j++) ids[j] = (int32_t)(keys[j] & idmask);
        idv = ids;
        weights_of(w, ids, m, wmax, T, e, q);
    } else {
        m = vocab;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
        for (int sl = 0; sl < n_slices; sl++) {
            const int i0 = sl * DS_SLICE, n = vocab - i0 < DS_SLICE ? vocab - i0 : DS_SLICE;
            weights_all(w + i0, n, cut, wmax, T, e + i0, q + i0);
            keep_sums(q + i0, n, NULL, 0, NULL, 0, scratch->bsum + i0 / DS_QBLOCK); /* the unfiltered sums */
        }
        int n_cand = 0;
        if (p->top_k > 0 || p->top_p < 1.0)
            for (int i = 0; i < vocab; i++) {
                keys[i] = w[i] >= cut ? make_key(w[i], i, idbits) : UINT64_MAX;
                n_cand += w[i] >= cut;
            }
        if (p->top_k > 0 && p->top_k < n_cand) {
            kb = select_key(keys, NULL, m, kb, (u128)p->top_k, 0, 32 + idbits, scratch->sel, scratch->sel2,
                            scratch->bw);
            limited = 1;
        }
    }
    uint64_t *bs = scratch->bsum;
    if (p->top_p < 1.0) { /* the shortest prefix whose weight is >= top_p of the whole */
        if (limited) keep_sums(q, m, keys, kb, NULL, 0, bs); /* top-k's survivors only */
        kb = select_key(keys, q, m, kb, 0, p->top_p, 32 + idbits, scratch->sel, scratch->sel2, scratch->bw);
        limited = 1;
    }
    /* min-p: e(top) == 1, so the threshold min_p * e(top) is min_p. The
     * whole vocabulary's unfiltered block sums are already there. */
    u128 z = 0;
    if (idv || limited || p->min_p > 0)
        z = keep_sums(q, m, limited ? keys : NULL, kb, e, p->min_p, bs);
    else
        for (int b = 0; b < (m + DS_QBLOCK - 1) / DS_QBLOCK; b++) z += bs[b];

    /* The draw: u * z over the kept weights (z >= 2^52: the top token survives
     * every filter), walked in id order, a block at a time. */
    const uint64_t r = (uint64_t)(ds_rng_uniform(p->seed, (uint64_t)position) * 0x1p53); /* exact */
    const u128 target = scale_draw(r, z); /* < z */
    u128 cum = 0;
    int b = 0;
    while (cum + bs[b] <= target) cum += bs[b++];
    int j = b * DS_QBLOCK;
    for (;; j++) {
        cum += q[j];
        if (cum > target) break;
    }
    *out_token = idv ? idv[j] : j;
    return 0;
}

/* -------------------------------------------------------------- stop --- */

int ds_stop_check(const int32_t *stop_ids, int n_stop, int32_t token) {
    if (!stop_ids) return 0;
    for (int i = 0; i < n_stop; i++)
        if (stop_ids[i] == token) return 1;
    return 0;
}
