/* sampler.h — token sampling: penalties, temperature, top-k / top-p / min-p,
 * and a counter-based RNG keyed by (request seed, token position).
 *
 * Determinism (docs/design.md §1 rules 5-7): the sampled token is a pure function of
 * (logit bits, parameters, history, position). Nothing here holds state between
 * calls: the random draw for a token comes from Philox4x32-10 keyed by the
 * request seed with the token's position as counter, so a request's samples
 * never depend on other requests, on batch composition, or on how many samples
 * were drawn before. exp() is our own double-precision implementation, so
 * results do not change with the C library either (libm's log only places a
 * conservative pre-filter bound that cannot change a result).
 *
 * Pipeline of ds_sample (every step in a fixed order):
 *   1. w[i] = logits[i] as float; NaN -> -inf; -0 -> +0.
 *   2. Penalties over the history (each distinct token once, count c = number of
 *      occurrences), computed in double and rounded to float:
 *        repetition (HF):         w = w > 0 ? w / rep : w * rep
 *        presence/frequency (OpenAI), after repetition:
 *                                 w = w - (presence + frequency * c)
 *   3. temperature == 0: greedy = argmax w, ties -> lower token id. Done.
 *   4. x[i] = ((double)w[i] - (double)wmax) / temperature  (all x <= 0; if wmax
 *      is +inf: x = 0 for the +inf tokens, -inf for the rest), e[i] = ds_sample_exp(x[i]),
 *      and the token's weight is the integer q[i] = floor(e[i] * 2^52) (the top
 *      token's is 2^52; tokens with e < 2^-52, x < -36.04, weigh 0 and are
 *      never drawn). Every sum below is an exact integer sum, so no result
 *      depends on the order of a summation.
 *   5. top_k keeps the first k tokens in the order (w desc, id asc), a total
 *      order, so the result never depends on sort stability.
 *   6. top_p < 1 keeps the shortest prefix of that order (within top-k's) whose
 *      weight is >= need = ceil(top_p * Z) (double arithmetic; Z the weight of
 *      top-k's survivors; need at least 1).
 *   7. min_p > 0 drops tokens with e < min_p * e(top token) (e(top) = 1 exactly).
 *   8. Z' = the kept weight; r = the 53 bits of ds_rng_uniform(seed, position);
 *      the token is the first kept one, walking the vocabulary in id order,
 *      whose running weight exceeds floor(r * Z' / 2^53) (inverse CDF; never a
 *      token of weight 0).
 * The walk in id order needs no sort: only top-k and top-p order the tokens,
 * and they only choose which tokens are kept.
 *
 * Speed, without changing any result (proofs at the code):
 *   - tokens with x < -52 ln 2 (weight 0) are left out before anything else,
 *     and with top_p == 1, tokens with x < log(min_p) - 1e-6 (surely e < min_p);
 *     the cut is found once by bisection over float bit patterns (x is monotone
 *     in w), so the candidate test is one float compare per token;
 *   - the weights of the whole vocabulary in one vector pass (AVX2: four
 *     tokens at a time, a group below the cut skipped after one compare);
 *   - top_k <= 4096 (and < vocab/4): a k-heap over the tokens (eight at a
 *     time skipped when none beats the heap's root), the draw over those k;
 *     otherwise top-k and top-p are one key each, the last kept, found by a
 *     radix selection over exact integer weights (counts for top-k), without
 *     sorting;
 *   - the draw's walk goes a block of 2048 tokens at a time (64-bit block sums);
 *   - the vocabulary passes (clean/max, weights, block sums) may run in slices on
 *     several threads (ds_sample_scratch_set_threads);
 *   - with AVX2, clean/max, exp and the quantization use vector code with the
 *     scalar operations in the scalar order (the build's -ffp-contract=off
 *     keeps them unfused), so SIMD and portable builds give the same bits
 *     (golden test).
 * Measured at vocab 129280 on a 2-core EPYC VM: greedy ~10 us, top_k=50 ~40-70 us,
 * full distribution (T only, min_p) ~0.4 ms, top_p < 1 ~1.0-1.3 ms per token
 * (until 2026-12-02 a full sort and double sums in sorted order: 1.1 ms for
 * both, which the draws' bits changed from).
 */
#ifndef DS_SAMPLER_H
#define DS_SAMPLER_H

#include <stdint.h>

#include "common/err.h"

typedef struct ds_sampling {
    double temperature;        /* >= 0; 0 = greedy */
    int32_t top_k;             /* >= 0; 0 = off */
    double top_p;              /* (0, 1]; 1 = off */
    double min_p;              /* [0, 1]; 0 = off */
    double repetition_penalty; /* > 0, finite; 1 = off (HF semantics) */
    double presence_penalty;   /* finite; 0 = off (OpenAI semantics) */
    double frequency_penalty;  /* finite; 0 = off (OpenAI semantics) */
    uint64_t seed;             /* request seed for the counter-based RNG */
} ds_sampling;

/* Every filter off, temperature 1, seed 0. */
void ds_sampling_init(ds_sampling *p);

/* 0, or -1 with a message naming the offending field. */
int ds_sampling_validate(const ds_sampling *p, ds_err *err);

/* Caller-owned working memory for one sampling call at a time (one per thread),
 * sized for vocabularies up to max_vocab (about 52 bytes per token). */
typedef struct ds_sample_scratch ds_sample_scratch;

ds_sample_scratch *ds_sample_scratch_create(int max_vocab, ds_err *err);
void ds_sample_scratch_free(ds_sample_scratch *s);

/* The OpenMP threads a draw with this scratch may spread its passes over the
 * whole vocabulary on (default 1), in slices of 16384 tokens: the same token
 * whatever the number (each token and each block of 2048 is computed alone;
 * the sums are exact). For a caller with idle cores and few draws. */
void ds_sample_scratch_set_threads(ds_sample_scratch *s, int threads);

/* Samples one token from logits[0..vocab).
 * history: the tokens penalties look at (may be NULL when n_history == 0); each
 *   must lie in [0, vocab). Pass whatever set the caller's semantics want
 *   (e.g. prompt + generated so far, or generated only).
 * position: absolute position (>= 0) in the sequence of the token being sampled;
 *   it is the RNG counter, so pass the same value however the sequence was
 *   batched or chunked.
 * Returns 0 and *out_token, or -1 with err (bad parameters, vocab larger than
 * the scratch, history out of range, every logit NaN or -inf). */
int ds_sample(const ds_sampling *p, const float *logits, int vocab, const int32_t *history,
              int n_history, int64_t position, ds_sample_scratch *scratch, int32_t *out_token,
              ds_err *err);

/* Step 1-2 of ds_sample on a caller array, in place (NaN -> -inf, -0 -> +0,
 * then penalties). Uses the scratch's count array and leaves it clean. */
int ds_apply_penalties(const ds_sampling *p, float *logits, int vocab, const int32_t *history,
                       int n_history, ds_sample_scratch *scratch, ds_err *err);

/* 1 if token is one of stop_ids[0..n_stop), else 0. */
int ds_stop_check(const int32_t *stop_ids, int n_stop, int32_t token);

/* Philox4x32-10 (Salmon et al., SC'11; Random123 layout): out = bijection of
 * ctr under key. */
void ds_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Uniform double in [0, 1) with 53 random bits: Philox4x32-10 with key = seed
 * (low word first) and counter = (position low, position high, 0, 0). */
double ds_rng_uniform(uint64_t seed, uint64_t position);

/* exp(x) in double, fdlibm's algorithm in plain IEEE arithmetic (< 1 ulp, no
 * libm, identical bits everywhere). Returns exactly 0 for x < -708 (so every
 * nonzero result is a normal number), exactly 1 for x == 0, +inf above 709.78. */
double ds_sample_exp(double x);

/* x[i] = ds_sample_exp(x[i] / divisor) for i < n, bit-identical to the scalar
 * calls; vectorised when built with AVX2. */
void ds_sample_exp_div_n(double *x, int n, double divisor);

#endif
