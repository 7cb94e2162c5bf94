/* generate.h — a streaming generation loop over the engine: prefill a prompt
 * in bounded chunks, then decode token by token, sampling each token with
 * ds_sample at its absolute position and handing its newly completed UTF-8
 * text (ds_detok_stream: never a broken character) to a callback.
 *
 * Results are those of `dsv4 generate`: the token at position p is sampled
 * from the logits after the sequence holds p tokens, with the RNG counter p
 * and the penalty history = the whole prompt + the tokens generated so far.
 * They do not depend on the prefill chunk size, on the thread count or on
 * whether a prompt prefix was already in the sequence (ds_forward's
 * invariance), so a chat that keeps its sequence gives the same replies as
 * one that re-prefills the whole conversation each turn. */
#ifndef DS_GENERATE_H
#define DS_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "text/tokenizer.h"
#include "model/forward.h"
#include "runtime/sampler.h"
#include "text/grammar.h"

typedef struct ds_gen_params {
    ds_sampling sampling;
    int max_new;             /* tokens to sample at most (>= 0), the stop token included */
    const int32_t *stop_ids; /* tokens that end generation; NULL (with n_stop 0): the
                                tokenizer's EOS, else the config's eos_token_id */
    int n_stop;
    int prefill_chunk;       /* tokens per prefill step; <= 0: 512 */
    int64_t max_len;         /* capacity of the sequence ds_generate creates; <= 0:
                                n_prompt + max_new + 1 (unused when a sequence is given) */
    int detok_flags;         /* 0 or DS_DECODE_SKIP_SPECIAL, for the callback's text */
    int mtp;                 /* speculative decoding with the model's MTP block: tokens drafted per
                                step, 0..DS_GEN_MTP_MAX (0: off; without a block, with cached
                                prompt tokens or with a grammar, generation runs without it). The sampled tokens are
                                the same bits with any value. */
    /* observers for tests and tools (NULL: none); they never change results.
     * on_logits: the logits every token is sampled from (masked), with its position.
     * draft: replaces the block's k drafts d[0..k) for positions pos..pos+k-1
     *   (a test forcing acceptance or rejection; the tokens stay the same bits) */
    void (*on_logits)(void *ctx, int64_t pos, const float *logits, int vocab);
    void (*draft)(void *ctx, int64_t pos, int k, int32_t *d);
    void *hook_ctx;
    /* Constrained decoding (grammar.h; NULL: none): each token is sampled from
     * a copy of the logits with every token that cannot continue a text of the
     * grammar at -inf (EOS only once it is complete); after the first sampled
     * grammar_after when that is >= 0 (</think>). Needs tok and trie (built
     * from tok). */
    const ds_grammar *grammar;
    const ds_vocab_trie *trie;
    int32_t grammar_after;
} ds_gen_params;
#define DS_GEN_MTP_MAX 4

/* max_new 64, greedy (temperature 0), EOS stops, chunk 512, no flags. */
void ds_gen_params_init(ds_gen_params *p);

/* Called for every sampled token, in order. text / n: the text this token
 * completes (possibly empty; valid UTF-8; owned by the loop, valid during the
 * call). A stop token is reported with is_stop = 1 and empty text (its text is
 * not decoded). When generation ends with bytes held back (an incomplete
 * character), one last call has token = -1 and the flushed text (U+FFFD).
 * So the concatenated text equals ds_tokenizer_decode(LOSSY | detok_flags) of
 * the sampled tokens other than the stop token. Return nonzero to end
 * generation early (not an error). */
typedef int (*ds_gen_token_fn)(void *ctx, int32_t token, int is_stop, const char *text, size_t n);

typedef struct ds_gen_result {
    int n_prompt;       /* prompt tokens prefilled by this call (the prompt minus the cached prefix) */
    double prompt_s;    /* seconds of prefill (up to the first token's logits) */
    int n_gen;          /* tokens sampled, the stop token included */
    double gen_s;       /* seconds from the end of prefill to the end of generation */
    int32_t stop_token; /* the stop token that ended generation, or -1 */
    int at_max_pos;     /* 1: generation stopped because the sequence reached max_position_embeddings */
    int mtp_steps;      /* speculative decoding: verify steps run */
    int mtp_drafted;    /* tokens the MTP block drafted */
    int mtp_accepted;   /* drafted tokens the model's own sampling agreed with */
} ds_gen_result;

/* The ids in [0, vocab) that have no token in tok (a model vocabulary larger
 * than the tokenizer's, as in the released V4): *ids malloc'ed (NULL when
 * none, or when tok is NULL). */
int ds_gen_unsampled_ids(const ds_tokenizer *tok, int vocab, int32_t **ids, int *n, ds_err *err);
/* Sets logits[ids[i]] = -inf: those ids are never sampled. The other logits
 * are untouched, and ds_sample drops -inf tokens before any sum, so a
 * request's tokens are the same bits whether or not other requests mask. */
void ds_gen_mask_logits(float *logits, const int32_t *ids, int n);

/* Generates a continuation of prompt[0..n_prompt).
 * seq: NULL to use a fresh sequence of capacity p->max_len (created and freed
 *   here); or a caller's sequence whose first n_cached tokens are
 *   prompt[0..n_cached) (seq->pos must equal n_cached): only the rest is
 *   prefilled. n_cached < n_prompt unless p->max_new == 0. On return the
 *   sequence holds the prompt and every sampled token but the last one
 *   (seq->pos == n_prompt + n_gen - 1 when n_gen > 0); on error reset it.
 * tok: for the text (may be NULL: the callback then gets empty text).
 * cb: may be NULL. res: may be NULL.
 * Errors name the prompt token or parameter at fault; a capacity too small
 * for the prompt, or a prompt longer than max_position_embeddings, is an
 * error, while generation simply stops when the sequence is full or reaches
 * max_position_embeddings (res->at_max_pos). With tok, ids without a token
 * are masked (ds_gen_mask_logits) and never sampled.
 *
 * With p->mtp = k > 0 and an MTP block (m->mtp_model), each step drafts up to
 * k tokens with the block (greedy, chained on its own streams), runs the
 * pending token and the drafts through the model in one step with all
 * logits, and samples them in order as without speculation (the same
 * logits bits: chunking invariance; the same RNG position and history) until
 * a sampled token differs from the draft. The state the rejected drafts
 * wrote is rewound (ds_seq_rewind) and the kept tokens fed again, so the
 * sequence ends as it would without speculation. */
int ds_generate(const ds_model *m, const ds_backend *be, const ds_tokenizer *tok, ds_seq *seq, const int32_t *prompt,
                int n_prompt, int n_cached, const ds_gen_params *p, ds_gen_token_fn cb, void *cb_ctx,
                ds_gen_result *res, ds_err *err);

#endif
