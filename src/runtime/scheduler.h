/* scheduler.h — continuous batching for a server: requests join and leave a
 * running batch at step boundaries. Each step advances every decoding request
 * by one token and spends what is left of a per-step token budget on prompt
 * chunks of the requests still prefilling, all in one ds_forward call.
 *
 * Exactness: ds_forward gives every token the same bits whatever the batch
 * and however its prompt was chunked, and ds_sample draws from an RNG keyed by
 * (seed, position), so a request's tokens do not depend on the other
 * requests, on when it joined or on a reused prefix.
 *
 * Prefix reuse: a finished request leaves its sequence (prompt + generated
 * tokens but the last) in a small cache; a new request whose prompt extends
 * one of those token lists continues from that state and prefills only the
 * rest.
 *
 * Speculative decoding (opts.mtp = K > 0 and the model's MTP block bound):
 * a decoding request drafts up to K tokens with the block (greedy, chained
 * on its own streams) before a step and puts its pending token and the
 * drafts into the step as one item of K + 1 tokens (counted in the step
 * budget) with all their logits; its draws take the rows in order, each at
 * its own position with the history before it, until a token differs from
 * the draft, so the tokens, logprobs and RNG positions are those of decoding
 * one token a step. The state the rejected drafts wrote is rewound
 * (ds_seq_rewind) and the kept tokens are fed again in the next step (a
 * plain step for that request). A step speculates only while the decoding
 * requests are at most opts.mtp_max_batch and their items with drafts take
 * at most half of step_tokens; a step over that ends speculation for the
 * requests running then (their blocks stop following them). Requests with
 * a grammar or forced tokens, or whose prompt continues a cached sequence
 * kept without the block's state, decode without it.
 *
 * Threads: one scheduler thread owns the model calls, the sequences and the
 * cache. Any thread may submit, wait for, cancel and release requests. Every
 * call into the model is in scheduler.c. */
#ifndef DS_SCHEDULER_H
#define DS_SCHEDULER_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "model/store.h"
#include "runtime/sampler.h"
#include "text/grammar.h"

#define DS_SCHED_MAX_TOP 20    /* top_logprobs at most */
#define DS_SCHED_MAX_FORCE 128 /* forced tokens at most */
#define DS_SCHED_MAX_GROUP 64  /* requests submitted together at most (ds_sched_submit_n) */

typedef struct ds_sched_opts {
    int max_seqs;      /* requests in the running batch at most (default 16) */
    int max_queue;     /* requests waiting to join at most; more: ds_sched_submit says full (default 64) */
    int64_t ctx;       /* tokens per sequence: prompt + generated (default 4096) */
    int step_tokens;   /* tokens per forward step at most (default 256; >= max_seqs) */
    int prefill_chunk; /* prompt tokens of one request per step at most (default 128) */
    int cache_seqs;    /* finished sequences kept for prefix reuse (default 4; 0 = off) */
    int threads;       /* threads that sample a step's requests in parallel (0: one per core) */
    /* An idle scheduler woken by a request waits for the ones sent with it
     * (clients send several at once) until none came for gather_gap_ms, the
     * batch is full, or gather_ms passed, so that one step prefills them all
     * (defaults 2 and 10; gather_ms 0: off). Without it the first request's
     * prefill runs alone and the others join a step later: from then on the
     * first decodes in steps that carry their prefill, and a closed loop of
     * clients keeps that offset for every later round. */
    int gather_ms, gather_gap_ms;
    const int32_t *mask_ids; /* ids never sampled (ds_gen_unsampled_ids: no token in the tokenizer); copied */
    int n_mask;
    /* The tokenizer's vocabulary trie (grammar.h), needed by requests with a
     * grammar; the caller keeps it alive until ds_sched_stop. */
    const ds_vocab_trie *trie;
    /* Speculative decoding with the model's MTP block (m->mtp_model; ignored
     * without one): tokens drafted per request and step, 0..DS_GEN_MTP_MAX
     * (default 0: off); only in steps with at most mtp_max_batch decoding
     * requests (default 4). */
    int mtp, mtp_max_batch;
} ds_sched_opts;

void ds_sched_opts_init(ds_sched_opts *o);

typedef struct ds_req_params {
    ds_sampling sampling;
    int max_new;         /* tokens to generate at most (>= 1), the stop token included */
    int32_t stop_ids[8]; /* tokens that end generation (reported, with finish STOP) */
    int n_stop;
    int top_logprobs;    /* -1: no log-probabilities; 0..DS_SCHED_MAX_TOP: the chosen token's and this many
                            alternatives' */
    /* Forced tokens (a tool call the client requires): n_force > 0 makes
     * force[0..n_force) part of the reply as if generated -- at its start
     * when force_after is -1, else right after the first sampled token
     * force_after (</think> in thinking mode) -- and generation goes on after
     * them. They count against max_new, are not checked against stop_ids and
     * carry logprob 0 with no alternatives. */
    int n_force;
    int32_t force_after;
    int32_t force[DS_SCHED_MAX_FORCE];
    /* Constrained decoding: with a grammar, each draw samples from a copy of
     * the logits where every token that cannot continue a text of the
     * grammar is -inf (ds_grammar_mask; EOS only once the text is complete),
     * from the first token when grammar_after is -1, else from the token after
     * the first sampled grammar_after (</think> in thinking mode). The logits
     * (and logprobs) are the model's. The caller keeps the grammar alive until
     * the request is released; not with forced tokens. */
    const ds_grammar *grammar;
    int32_t grammar_after;
} ds_req_params;

typedef enum {
    DS_REQ_QUEUED,
    DS_REQ_RUNNING,
    DS_REQ_DONE_STOP,   /* a stop token was sampled */
    DS_REQ_DONE_LENGTH, /* max_new tokens or the context is full */
    DS_REQ_CANCELLED,
    DS_REQ_FAILED,      /* see ds_req_info.error */
} ds_req_state;

/* One generated token. logprob / top_*: log-softmax of the model's logits
 * (before penalties and temperature); set when top_logprobs >= 0. */
typedef struct ds_req_token {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[DS_SCHED_MAX_TOP];
    float top_logprob[DS_SCHED_MAX_TOP];
} ds_req_token;

typedef struct ds_req_info {
    ds_req_state state;
    int n_prompt, n_cached; /* prompt tokens, of which taken from a cached sequence */
    int n_out;              /* tokens generated so far */
    double t_submit, t_first, t_done; /* ds_now() times (0: not yet) */
    int n_drafted, n_accepted;        /* speculative decoding: tokens the MTP block drafted, of which
                                         the model's draws agreed with (accepted) */
    char error[1024];
} ds_req_info;

typedef struct ds_sched ds_sched;
typedef struct ds_req ds_req;

/* Prometheus-style counters and gauges (copied under the lock). */
typedef struct ds_sched_stats {
    uint64_t requests, requests_rejected, requests_cancelled, requests_failed;
    uint64_t prompt_tokens, cached_tokens, gen_tokens, steps;
    double prefill_s, decode_s; /* step time split in proportion to prefill / decode tokens */
    /* the scheduler thread's wall time by phase: the step boundary (dropping
     * and admitting requests), ds_forward, sampling, publishing the tokens
     * and waking their waiters, retiring (statistics, finished requests) */
    double admit_s, forward_s, sample_s, publish_s, retire_s;
    int queued, running, cached_seqs, live_seqs;
    double batch_mean;          /* mean items per step */
    uint64_t batch_hist[8];     /* steps with 1, 2-3, 4-7, ..., >= 128 items */
    int n_moe_layers, n_experts; /* the expert-load table's shape */
    double tokens_per_s;        /* generated tokens per second over the last 10 s */
    uint64_t mask_tokens;       /* draws of constrained requests (a grammar's token mask) */
    double mask_s;              /* their mask time: the trie walk and the masked copy of the logits */
    /* speculative decoding: verify items (a request's step with drafts), the
     * tokens drafted and accepted, and the scheduler thread's time in the
     * MTP block (drafting, following the model) and in rewinds */
    uint64_t mtp_verify, mtp_drafted, mtp_accepted;
    double mtp_s;
} ds_sched_stats;

/* Starts the scheduler thread; *out on success. Errors name the option at
 * fault. */
int ds_sched_start(const ds_model *m, const ds_backend *be, const ds_sched_opts *o, ds_sched **out, ds_err *err);
/* Stops the thread and ends every request (CANCELLED); requests still held
 * by callers stay valid (wait / release them) until ds_sched_stop. */
void ds_sched_shutdown(ds_sched *s);
/* ds_sched_shutdown, then frees everything. Release every request first. */
void ds_sched_stop(ds_sched *s);

/* Queues a request; the prompt is copied. Returns 0 (*out: release it with
 * ds_req_release), 1 when the queue is full (nothing queued), -1 on bad
 * input (err names the field: empty prompt, a token out of the vocabulary, a
 * prompt + max_new over ctx, bad sampling). */
int ds_sched_submit(ds_sched *s, const int32_t *prompt, int n_prompt, const ds_req_params *p, ds_req **out,
                    ds_err *err);

/* Queues n requests (p[0..n), one per choice of a client request) on the
 * same prompt, all or none: 1 when the queue has no room for all n. They
 * share one wake-up, so ds_req_wait_any can wait for any of them. out[i]
 * gets request i; release each. */
int ds_sched_submit_n(ds_sched *s, const int32_t *prompt, int n_prompt, const ds_req_params *p, int n, ds_req **out,
                      ds_err *err);

/* Waits until the request has more than `have` tokens or has ended, or until
 * timeout_s passed (0: just looks). Returns the token count; *info gets the
 * state and n_out, and once the request has ended all its fields. Waiting and
 * reading tokens take no lock the scheduler needs. */
int ds_req_wait(ds_req *r, int have, double timeout_s, ds_req_info *info);
/* Requests of one ds_sched_submit_n: waits until some r[i] has more than
 * have[i] tokens or has ended, or until timeout_s passed; a negative have[i]
 * leaves r[i] out. Returns such an i, or -1 on timeout. */
int ds_req_wait_any(ds_req *const *r, const int *have, int n, double timeout_s);
/* Copies tokens [from, from + n) (they must exist). */
void ds_req_tokens(ds_req *r, int from, int n, ds_req_token *out);
/* Asks the scheduler to drop the request at the next step boundary (its
 * sequence is freed); state becomes CANCELLED unless it had ended. */
void ds_req_cancel(ds_req *r);
/* The caller's reference; a request still running is cancelled. */
void ds_req_release(ds_req *r);

/* The counters; expert_tokens (may be NULL): routed tokens per [layer][expert]
 * when copy_cap >= n_moe_layers * n_experts. */
void ds_sched_get_stats(ds_sched *s, ds_sched_stats *out, uint64_t *expert_tokens, int copy_cap);
/* The half-life, in routed tokens, of the exponentially weighted expert load. */
#define DS_SCHED_LOAD_HALFLIFE 16384.0
/* The exponentially weighted load per [layer][expert] (each step's routed
 * tokens added after the table aged by 2^(-tokens / DS_SCHED_LOAD_HALFLIFE):
 * the recent tokens an expert took); 0, or -1 when copy_cap is below
 * n_moe_layers * n_experts. */
int ds_sched_get_load(ds_sched *s, double *load, int copy_cap);
/* An expert store's counts (model/store.h) after the last step: [n_layers]
 * per layer, then all of them; 0, or -1 without a store or when copy_cap is
 * below n_layers + 1. */
int ds_sched_get_tiers(ds_sched *s, ds_store_counts *out, int copy_cap);
/* Bytes of one sequence's state at ctx. */
uint64_t ds_sched_seq_bytes(const ds_sched *s);

#endif
