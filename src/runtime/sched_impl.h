/* sched_impl.h — the scheduler's private state (scheduler.c), shared with
 * its speculative decoding (sched_spec.c). Not for other layers. */
#ifndef DS_RUNTIME_SCHED_IMPL_H
#define DS_RUNTIME_SCHED_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "model/forward.h"
#include "model/state.h"
#include "model/store.h"
#include "runtime/scheduler.h"

/* A wake-up shared by the requests of one ds_sched_submit_n: a futex word the
 * scheduler bumps after publishing tokens, so waiting and reading tokens
 * never take the scheduler's lock (a client thread preempted while holding
 * it would stall the whole batch on a loaded machine). refs under s->mu. */
typedef struct ds_waker {
    _Atomic uint32_t seq;
    int refs;
} ds_waker;

struct ds_req {
    /* immutable after submit */
    int32_t *hist; /* prompt + generated tokens: [n_prompt + max_new] */
    int n_prompt;
    ds_req_params p;
    ds_sched *s;
    /* under s->mu */
    int refs;
    int cancel;
    ds_req_info info;
    ds_req_token *out; /* [max_new] */
    ds_waker *wk;
    /* published for lock-free readers (release stores after out[] and info) */
    _Atomic int n_pub;     /* out[0..n_pub) are final */
    _Atomic int pub_state; /* ds_req_state; >= DS_REQ_DONE_STOP: info is final */
    struct ds_req *next;   /* queue link */
    /* scheduler thread only */
    ds_seq *seq;
    int n_fed;       /* tokens of hist already in seq */
    int forced;      /* the forced tokens are in hist */
    int last_forced; /* the last token of hist was forced, not sampled */
    int wide;        /* a prompt or forced id >= s->n_live: drawn over the whole vocabulary */
    ds_gstate *gs;   /* the grammar's state (p.grammar), advanced by each draw */
    int g_on;        /* the grammar constrains the draws (from the start, or after grammar_after) */
    /* speculative decoding (scheduler.h); ms NULL: off for r */
    ds_seq *ms;                       /* the MTP block's sequence: rows (h_q, hist[q+1]) for q < ms->pos */
    float *ph;                        /* [nD] the model's streams at position seq->pos - 1: the block's next row */
    float *mh;                        /* [nD] the block's streams of its last row (chained drafting) */
    ds_seq_snap snap, msnap;          /* r->seq before a verify step; r->ms before a chain */
    int32_t vtok[DS_GEN_MTP_MAX + 1]; /* this step's item: the pending token, then the drafts */
    int nv;                           /* this step: drafts in r's item (0: none) */
    int64_t p0;                       /* this step: seq->pos before it */
    int hrow;                         /* this step: r's first row in s->hid (-1: none) */
    int drawn;                        /* this step: rows of r's item drawn */
};

typedef struct {
    ds_seq *seq;
    int32_t *toks; /* the tokens in seq */
    int n;
    uint64_t used;
    ds_seq *ms; /* the MTP block's sequence at n - 1 rows, and the model's streams at n - 1 (NULL: none) */
    float *ph;
} cache_entry;

struct ds_sched {
    const ds_model *m;
    const ds_backend *be;
    ds_sched_opts o;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t work;
    int stop, joined;
    ds_req *q_head, *q_tail;
    int n_queued;
    ds_req **run; /* [max_seqs], scheduler thread (count read under mu) */
    int n_run;
    cache_entry *cache;
    int n_cache;
    uint64_t clock;
    /* step buffers */
    ds_batch_item *items;
    ds_req **item_req;
    float *logits; /* [max_seqs][vocab] */
    double *lse_tmp;
    ds_sample_scratch **scr; /* [n_scr]: one per sampling thread */
    ds_mask_scratch **msk;   /* [n_scr] with o.trie: the grammar masks' scratch, */
    uint64_t **bits;         /* [n_scr][words]: a mask */
    float **mlg;             /* [n_scr][vocab]: the masked copy of the logits (many tokens allowed) */
    float **mneg;            /* [n_scr][vocab]: all -inf between draws; the allowed logits set for a draw (few) */
    double *mask_t;          /* [max_items]: each draw's mask time (0: none) */
    _Atomic int *scr_busy;   /* [n_scr]: taken by a draw running now */
    int n_scr;
    int draw_threads;  /* this step's threads for one draw's vocabulary passes */
    int *samp;         /* [max_seqs]: the items with logits */
    ds_req_token *tok; /* [max_seqs]: each item's draw */
    int *tok_rc;
    ds_err *tok_err;
    int32_t *mask; /* [n_mask]: ids never sampled, ascending */
    int n_mask;
    /* every id >= n_live is masked (a vocabulary padded past the tokenizer's,
     * as in the released V4): draws read the first n_live logits and mask
     * the n_holes ids below it, the first n_holes of mask (see draw) */
    int n_live, n_holes;
    /* speculative decoding: the block (NULL: off), drafts per step, a row of streams */
    const ds_model *mt;
    int K;
    size_t nD;
    int *tbase, *tn; /* [max_items]: an item's first row in tok, rows drawn */
    int64_t *pos0;   /* [max_items]: the position of an item's first draw */
    float *hid;      /* [step_tokens][nD]: the model's streams of the step's rows of requests with a block */
    float *bin;      /* [step_tokens][nD]: the block's input streams (h_in) */
    float *blog;     /* [max_seqs][vocab]: the block's logits */
    float *bhid;     /* [max_seqs][nD]: its streams */
    ds_batch_item *bitems;
    ds_req **breq;
#ifdef DSV4_TEST_HOOKS
    /* DSV4_TEST_MTP_RECORD: finished requests' tokens, a line each, appended
     * to that file; DSV4_TEST_MTP_ORACLE: drafts taken from such a file's
     * line that extends a request's tokens (the model's own choices: drafts
     * accepted), every DSV4_TEST_MTP_WRONG-th draft broken (partial acceptance) */
    char rec_path[512];
    int32_t **orc;
    int *orc_n, n_orc, orc_wrong, orc_count;
#endif
    /* statistics (under mu) */
    ds_sched_stats st;
    uint64_t *expert_tokens; /* [n_layers][n_experts], written by the route hook on the scheduler thread */
    uint64_t *expert_step;   /* the step's counts, merged under mu */
    double *expert_load;     /* [n_layers][n_experts]: the exponentially weighted load (load_update), under mu */
    ds_store_counts *tiers;  /* [n_layers + 1]: an expert store's counts after the last step (per layer, then all),
                                under mu; NULL without a store */
    double rate_t[64];
    uint64_t rate_n[64];
    int rate_i;
};

/* ---- speculative decoding inside the step (sched_spec.c) ---- */
/* Speculation off for r: its snapshots, the block's sequence and rows freed. */
void sched_spec_off(ds_req *r);
/* Whether r may speculate: a block, no grammar, no forced tokens, more than one token to generate. */
int sched_spec_wanted(const ds_sched *s, const ds_req *r);
/* The block's sequence and rows for r (a fresh sequence, or the cached cms, cph: taken). */
void sched_spec_on(ds_sched *s, ds_req *r, int fresh, ds_seq *cms, float *cph);
/* Before a step: the decoding requests' drafts, and their sequences snapshotted. */
void sched_spec_draft(ds_sched *s);
/* After a step's draws: rejected tails rewound, every block brought up to its sequence. */
void sched_spec_follow(ds_sched *s);
#ifdef DSV4_TEST_HOOKS
/* Test hooks: DSV4_TEST_MTP_RECORD / _ORACLE / _WRONG (docs/env.md). */
void sched_oracle_load(ds_sched *s);
void sched_record_tokens(ds_sched *s, const ds_req *r);
#endif

#endif
