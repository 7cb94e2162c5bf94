/* scheduler.c — see scheduler.h. */
#include "runtime/scheduler.h"

#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "model/forward.h"
#include "model/state.h"
#include "runtime/generate.h"
#include "runtime/sched_impl.h"

static void waker_wake(ds_waker *w) {
    atomic_fetch_add_explicit(&w->seq, 1, memory_order_release);
    syscall(SYS_futex, (uint32_t *)&w->seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* sleeps while w->seq == seen, at most timeout_s (> 0) */
static void waker_sleep(ds_waker *w, uint32_t seen, double timeout_s) {
    struct timespec ts;
    ts.tv_sec = (time_t)timeout_s;
    ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
    syscall(SYS_futex, (uint32_t *)&w->seq, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

void ds_sched_opts_init(ds_sched_opts *o) {
    o->max_seqs = 16;
    o->max_queue = 64;
    o->ctx = 4096;
    o->step_tokens = 256;
    o->prefill_chunk = 128;
    o->cache_seqs = 4;
    o->threads = 0;
    o->gather_ms = 10;
    o->gather_gap_ms = 2;
    o->mask_ids = NULL;
    o->n_mask = 0;
    o->trie = NULL;
    o->mtp = 0;
    o->mtp_max_batch = 4;
}

uint64_t ds_sched_seq_bytes(const ds_sched *s) { return ds_seq_bytes(s->m, s->o.ctx); }

/* ------------------------------------------------------------ request side */

static void req_free(ds_req *r) {
    if (!r) return;
    if (r->wk && --r->wk->refs == 0) free(r->wk);
    free(r->hist);
    free(r->out);
    ds_gstate_free(r->gs);
    ds_grammar_free(r->p.grammar);
    free(r);
}

/* Drops one reference (under s->mu); frees at zero. */
static void req_unref_locked(ds_req *r) {
    if (--r->refs == 0) req_free(r);
}

static int check_params(const ds_sched *s, int n_prompt, const ds_req_params *p, ds_err *err) {
    const int V = s->m->cfg.vocab_size;
    if (p->max_new < 1) return ds_fail(err, "max_tokens is %d (must be >= 1)", p->max_new);
    if ((int64_t)n_prompt + p->max_new > s->o.ctx)
        return ds_fail(err,
                       "this model's context is %lld tokens; the request needs %lld (%d in the prompt, %d to "
                       "generate)",
                       (long long)s->o.ctx, (long long)n_prompt + p->max_new, n_prompt, p->max_new);
    if (p->top_logprobs < -1 || p->top_logprobs > DS_SCHED_MAX_TOP)
        return ds_fail(err, "top_logprobs is %d (must be in [0, %d])", p->top_logprobs, DS_SCHED_MAX_TOP);
    if (p->n_stop < 0 || p->n_stop > 8) return ds_fail(err, "%d stop tokens (at most 8)", p->n_stop);
    if (p->n_force < 0 || p->n_force > DS_SCHED_MAX_FORCE)
        return ds_fail(err, "%d forced tokens (at most %d)", p->n_force, DS_SCHED_MAX_FORCE);
    if (p->n_force) {
        if (p->force_after < -1 || p->force_after >= V)
            return ds_fail(err, "force_after is token %d (outside the vocabulary [0, %d))", (int)p->force_after, V);
        for (int i = 0; i < p->n_force; i++)
            if (p->force[i] < 0 || p->force[i] >= V)
                return ds_fail(err, "forced token %d (id %d) is outside the vocabulary [0, %d)", i, (int)p->force[i],
                               V);
        if (p->force_after == -1 && p->n_force >= p->max_new)
            return ds_fail(err, "max_tokens is %d; the forced start of the reply (a tool call) takes %d", p->max_new,
                           p->n_force);
    }
    if (p->grammar && !s->o.trie) return ds_fail(err, "a grammar needs the server's vocabulary trie");
    if (p->grammar && p->n_force) return ds_fail(err, "a grammar and forced tokens together are not supported");
    return ds_sampling_validate(&p->sampling, err);
}

int ds_sched_submit(ds_sched *s, const int32_t *prompt, int n_prompt, const ds_req_params *p, ds_req **out,
                    ds_err *err) {
    return ds_sched_submit_n(s, prompt, n_prompt, p, 1, out, err);
}

int ds_sched_submit_n(ds_sched *s, const int32_t *prompt, int n_prompt, const ds_req_params *p, int n, ds_req **out,
                      ds_err *err) {
    const int V = s->m->cfg.vocab_size;
    if (n < 1 || n > DS_SCHED_MAX_GROUP) return ds_fail(err, "%d requests at once (must be in [1, %d])", n,
                                                        DS_SCHED_MAX_GROUP);
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (n > 1 && n > s->o.max_queue) /* a group larger than the queue never fits (one request: full) */
        return ds_fail(err, "n is %d: %d choices never fit the server's queue of %d requests (--max-queue)", n, n,
                       s->o.max_queue);
    if (n_prompt < 1) return ds_fail(err, "the prompt is empty (at least one token is needed)");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return ds_fail(err, "prompt token %d (id %d) is outside the vocabulary [0, %d)", i, (int)prompt[i], V);
    for (int i = 0; i < n; i++)
        if (check_params(s, n_prompt, &p[i], err)) return -1;

    ds_waker *wk = calloc(1, sizeof *wk);
    if (!wk) return ds_fail(err, "out of memory");
    atomic_init(&wk->seq, 0);
    ds_req *rs[DS_SCHED_MAX_GROUP];
    double now = ds_now();
    for (int i = 0; i < n; i++) {
        ds_req *r = calloc(1, sizeof *r);
        if (r) {
            r->hist = malloc(((size_t)n_prompt + (size_t)p[i].max_new) * sizeof *r->hist);
            r->out = malloc((size_t)p[i].max_new * sizeof *r->out);
        }
        if (r && p[i].grammar) {
            r->p.grammar = ds_grammar_ref(p[i].grammar);
            r->gs = ds_gstate_new(p[i].grammar);
            r->g_on = p[i].grammar_after == -1;
        }
        if (!r || !r->hist || !r->out || (p[i].grammar && !r->gs)) {
            if (r) free(r->hist), free(r->out), ds_gstate_free(r->gs), ds_grammar_free(r->p.grammar), free(r);
            for (int k = 0; k < i; k++) req_free(rs[k]);
            if (!i) free(wk);
            return ds_fail(err, "out of memory for a request of %d + %d tokens", n_prompt, p[i].max_new);
        }
        r->wk = wk;
        wk->refs++;
        memcpy(r->hist, prompt, (size_t)n_prompt * sizeof *prompt);
        for (int k = 0; k < n_prompt; k++) r->wide |= prompt[k] >= s->n_live;
        for (int k = 0; k < p[i].n_force; k++) r->wide |= p[i].force[k] >= s->n_live;
        r->n_prompt = n_prompt;
        r->p = p[i];
        r->s = s;
        r->refs = 2;
        r->info.state = DS_REQ_QUEUED;
        r->info.n_prompt = n_prompt;
        r->info.t_submit = now;
        if (r->p.n_force && r->p.force_after == -1) { /* the reply starts with the forced tokens */
            for (int k = 0; k < r->p.n_force; k++) {
                r->hist[n_prompt + k] = r->p.force[k];
                memset(&r->out[k], 0, sizeof r->out[k]);
                r->out[k].id = r->p.force[k];
            }
            r->info.n_out = r->p.n_force;
            r->forced = r->last_forced = 1;
        }
        atomic_init(&r->n_pub, r->info.n_out);
        atomic_init(&r->pub_state, DS_REQ_QUEUED);
        rs[i] = r;
    }

    pthread_mutex_lock(&s->mu);
    if (s->n_queued + n > s->o.max_queue || s->stop) {
        s->st.requests_rejected++;
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n; i++) req_free(rs[i]);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        ds_req *r = rs[i];
        if (s->q_tail) s->q_tail->next = r;
        else s->q_head = r;
        s->q_tail = r;
        out[i] = r;
    }
    s->n_queued += n;
    s->st.requests += (uint64_t)n;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int pub_ended(ds_req *r) {
    return atomic_load_explicit(&r->pub_state, memory_order_acquire) >= DS_REQ_DONE_STOP;
}

int ds_req_wait(ds_req *r, int have, double timeout_s, ds_req_info *info) {
    (void)ds_req_wait_any(&r, &have, 1, timeout_s);
    int n = atomic_load_explicit(&r->n_pub, memory_order_acquire);
    if (info) {
        int st = atomic_load_explicit(&r->pub_state, memory_order_acquire);
        if (st >= DS_REQ_DONE_STOP) { /* final: the scheduler writes no more */
            *info = r->info;
        } else {
            memset(info, 0, sizeof *info);
            info->state = (ds_req_state)st;
            info->n_out = n;
        }
        info->n_out = n;
    }
    return n;
}

int ds_req_wait_any(ds_req *const *r, const int *have, int n, double timeout_s) {
    if (n < 1) return -1;
    ds_waker *w = r[0]->wk;
    double t_end = ds_now() + timeout_s;
    for (;;) {
        uint32_t seen = atomic_load_explicit(&w->seq, memory_order_acquire);
        for (int i = 0; i < n; i++)
            if (have[i] >= 0 && (atomic_load_explicit(&r[i]->n_pub, memory_order_acquire) > have[i] || pub_ended(r[i])))
                return i;
        double left = t_end - ds_now();
        if (left <= 0) return -1;
        waker_sleep(w, seen, left);
    }
}

void ds_req_tokens(ds_req *r, int from, int n, ds_req_token *out) {
    /* published tokens do not change: no lock (the caller saw n_pub >= from + n) */
    (void)atomic_load_explicit(&r->n_pub, memory_order_acquire);
    memcpy(out, r->out + from, (size_t)n * sizeof *out);
}

void ds_req_cancel(ds_req *r) {
    pthread_mutex_lock(&r->s->mu);
    r->cancel = 1;
    pthread_cond_signal(&r->s->work);
    pthread_mutex_unlock(&r->s->mu);
}

void ds_req_release(ds_req *r) {
    if (!r) return;
    ds_sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    r->cancel = 1;
    pthread_cond_signal(&s->work);
    req_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}

/* -------------------------------------------------------- scheduler thread */

static void route_hook(void *ctx, int layer, int item, int tok, const int *experts, int k) {
    ds_sched *s = ctx;
    (void)item;
    (void)tok;
    int E = s->m->cfg.n_routed_experts;
    for (int i = 0; i < k; i++)
        if (experts[i] >= 0 && experts[i] < E) s->expert_step[(size_t)layer * E + experts[i]]++;
}

/* Frees r's sequences. */
static void drop_seq(ds_req *r) {
    sched_spec_off(r);
    ds_seq_free(r->seq);
    r->seq = NULL;
}

static void cache_free(cache_entry *c) {
    ds_seq_free(c->seq);
    ds_seq_free(c->ms);
    free(c->ph);
    free(c->toks);
}

/* The step's routes into the exponentially weighted load: per layer, each
 * token routed in the step ages the table by 2^(-1 / DS_SCHED_LOAD_HALFLIFE)
 * (tokens: the step's choices over the experts per token), then the step's
 * counts are added. */
static void load_update(ds_sched *s) {
    int L = s->m->cfg.n_layers, E = s->m->cfg.n_routed_experts, k = s->m->cfg.n_active_experts;
    for (int l = 0; l < L; l++) {
        const uint64_t *c = s->expert_step + (size_t)l * E;
        double *w = s->expert_load + (size_t)l * E;
        uint64_t sum = 0;
        for (int e = 0; e < E; e++) sum += c[e];
        if (!sum) continue;
        double age = exp2(-(double)sum / (double)(k > 0 ? k : 1) / DS_SCHED_LOAD_HALFLIFE);
        for (int e = 0; e < E; e++) w[e] = w[e] * age + (double)c[e];
    }
}

/* A sequence for r: the cached one holding the longest proper prefix of its
 * prompt, else a fresh one. */
static int acquire_seq(ds_sched *s, ds_req *r, ds_err *err) {
    int best = -1, best_n = 0;
    for (int i = 0; i < s->n_cache; i++) {
        cache_entry *c = &s->cache[i];
        if (c->n > best_n && c->n < r->n_prompt && !memcmp(c->toks, r->hist, (size_t)c->n * sizeof *c->toks)) {
            best = i;
            best_n = c->n;
        }
    }
    if (best >= 0) {
        r->seq = s->cache[best].seq;
        r->n_fed = best_n;
        sched_spec_on(s, r, 0, s->cache[best].ms, s->cache[best].ph);
        free(s->cache[best].toks);
        s->cache[best] = s->cache[--s->n_cache];
        return 0;
    }
    r->n_fed = 0;
    if (s->n_cache && s->n_cache + s->n_run >= s->o.max_seqs + s->o.cache_seqs) {
        /* keep the live count bounded: reuse the least recently used cached sequence */
        int lru = 0;
        for (int i = 1; i < s->n_cache; i++)
            if (s->cache[i].used < s->cache[lru].used) lru = i;
        r->seq = s->cache[lru].seq;
        ds_seq_reset(r->seq);
        ds_seq *cms = s->cache[lru].ms;
        if (cms) ds_seq_reset(cms);
        sched_spec_on(s, r, 1, cms, s->cache[lru].ph);
        free(s->cache[lru].toks);
        s->cache[lru] = s->cache[--s->n_cache];
        return 0;
    }
    if (ds_seq_new(s->m, s->o.ctx, &r->seq, err)) return -1;
    sched_spec_on(s, r, 1, NULL, NULL);
    return 0;
}

/* Keeps r's sequence for prefix reuse (or frees it). */
static void park_seq(ds_sched *s, ds_req *r, int keep) {
    ds_seq *q = r->seq;
    if (!q) return;
    int n = r->n_prompt + r->info.n_out - 1;
    if (!keep || s->o.cache_seqs <= 0 || r->info.n_out < 1 || q->pos != n) {
        drop_seq(r);
        return;
    }
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    if (!toks) {
        drop_seq(r);
        return;
    }
    /* the block's state goes with it when it follows the sequence (a row behind) */
    ds_seq *ms = NULL;
    float *ph = NULL;
    if (r->ms && r->ms->pos == n - 1) {
        ds_seq_snap_free(r->ms, &r->msnap);
        ms = r->ms, ph = r->ph;
        r->ms = NULL, r->ph = NULL;
    }
    sched_spec_off(r);
    r->seq = NULL;
    memcpy(toks, r->hist, (size_t)n * sizeof *toks);
    if (s->n_cache == s->o.cache_seqs) {
        int lru = 0;
        for (int i = 1; i < s->n_cache; i++)
            if (s->cache[i].used < s->cache[lru].used) lru = i;
        cache_free(&s->cache[lru]);
        s->cache[lru] = s->cache[--s->n_cache];
    }
    s->cache[s->n_cache++] = (cache_entry){q, toks, n, ++s->clock, ms, ph};
}

/* Ends r (under mu): state, wake its waiter, drop the scheduler's reference. */
static void finish_locked(ds_sched *s, ds_req *r, ds_req_state st, const char *msg) {
    r->info.state = st;
    r->info.t_done = ds_now();
    if (msg) snprintf(r->info.error, sizeof r->info.error, "%s", msg);
    if (st == DS_REQ_CANCELLED) s->st.requests_cancelled++;
    if (st == DS_REQ_FAILED) s->st.requests_failed++;
    atomic_store_explicit(&r->n_pub, r->info.n_out, memory_order_release);
    atomic_store_explicit(&r->pub_state, (int)st, memory_order_release);
    waker_wake(r->wk);
    req_unref_locked(r);
}

/* log-softmax of the logits into the token record (double sums in id order). */
static void fill_logprobs(ds_sched *s, const float *lg, int V, ds_req_token *t, int top) {
    double mx = -HUGE_VAL;
    for (int i = 0; i < V; i++)
        if ((double)lg[i] > mx) mx = (double)lg[i];
    double z = 0;
    for (int i = 0; i < V; i++) z += exp((double)lg[i] - mx);
    double lse = mx + log(z);
    t->logprob = (float)((double)lg[t->id] - lse);
    t->n_top = 0;
    for (int k = 0; k < top; k++) { /* selection of the k-th largest, ties to the lower id */
        int best = -1;
        for (int i = 0; i < V; i++) {
            int taken = 0;
            for (int j = 0; j < t->n_top; j++) taken |= t->top_id[j] == i;
            if (taken) continue;
            if (best < 0 || lg[i] > lg[best]) best = i;
        }
        if (best < 0) break;
        t->top_id[t->n_top] = best;
        t->top_logprob[t->n_top++] = (float)((double)lg[best] - lse);
    }
    (void)s;
}

static void rate_add(ds_sched *s, double t, uint64_t n) {
    s->rate_i = (s->rate_i + 1) % 64;
    s->rate_t[s->rate_i] = t;
    s->rate_n[s->rate_i] = n;
}

/* The logits one member of the sampling team should have to read at least
 * (a draw of the whole distribution reads its logits in ~3-5 ns each). */
#define DRAW_LOGITS_PER_MEMBER 32768

/* A free sampling scratch: at most n_scr draws run at once, so one is free
 * (were there more, a draw would spin until another one ends). */
static int scratch_take(ds_sched *s) {
    for (;;)
        for (int k = 0; k < s->n_scr; k++) {
            int z = 0;
            if (!atomic_load_explicit(&s->scr_busy[k], memory_order_relaxed) &&
                atomic_compare_exchange_strong_explicit(&s->scr_busy[k], &z, 1, memory_order_acquire,
                                                        memory_order_relaxed))
                return k;
        }
}

/* The logits of draw scratch k under its mask (s->bits[k]) over [0, Vs): few
 * allowed tokens are set into mneg (all -inf; the caller clears them after
 * the draw, *few = 1), else lg is copied into mlg with the others at -inf. */
static const float *masked_logits(ds_sched *s, int k, const float *lg, int Vs, int *few) {
    const uint64_t *b = s->bits[k];
    const int TV = ds_vocab_trie_vocab(s->o.trie), lim = Vs < TV ? Vs : TV, words = (lim + 63) / 64;
    *few = 0;
    if (Vs <= 0) return lg;
    int n = 0;
    for (int w = 0; w < words; w++) n += __builtin_popcountll(b[w]);
    if (n <= Vs / 8) {
        float *m = s->mneg[k];
        for (int w = 0; w < words; w++)
            for (uint64_t x = b[w]; x; x &= x - 1) {
                int id = w * 64 + __builtin_ctzll(x);
                if (id < lim) m[id] = lg[id];
            }
        *few = 1;
        return m;
    }
    float *m = s->mlg[k];
    memcpy(m, lg, (size_t)Vs * sizeof *m);
    for (int w = 0; w < words; w++) {
        uint64_t x = ~b[w];
        if (!x) continue;
        for (; x; x &= x - 1) {
            int id = w * 64 + __builtin_ctzll(x);
            if (id < lim) m[id] = -INFINITY;
        }
    }
    for (int id = lim; id < Vs; id++) m[id] = -INFINITY;
    return m;
}

/* One draw of item i into t: the logits lg, the history hist[0..n_hist), the
 * position pos, scratch k. Returns nonzero on error (s->tok_err[i]). */
static int draw_row(ds_sched *s, int i, int k, float *lg, int n_hist, int64_t pos, ds_req_token *t) {
    const int V = s->m->cfg.vocab_size;
    ds_req *r = s->item_req[i];
    /* Over the first n_live logits, the masked suffix left out: the same
     * token as over all V with the suffix at -inf (ds_sample gives a -inf
     * token weight 0, and none of its results depends on the vocabulary's
     * size), and the same logprobs (a -inf adds exp(-inf) = 0 to the
     * log-sum-exp's sum). A request whose history holds an id past n_live (a
     * raw-id prompt) draws over all V. */
    const int Vs = r->wide ? V : s->n_live;
    ds_gen_mask_logits(lg, s->mask, r->wide ? s->n_mask : s->n_holes);
    memset(t, 0, sizeof *t);
    ds_sample_scratch_set_threads(s->scr[k], s->draw_threads);
    const float *from = lg;
    int few = 0;
    s->mask_t[i] = 0;
    if (r->gs && r->g_on) { /* the grammar's mask, on a copy: the logits stay the model's */
        const double a = ds_now();
        if (!ds_grammar_mask(s->o.trie, r->gs, s->msk[k], s->bits[k]))
            return ds_fail(&s->tok_err[i], "the grammar (response_format or tool call) allows no token here");
        from = masked_logits(s, k, lg, Vs, &few);
        s->mask_t[i] = ds_now() - a;
    }
    int rc = ds_sample(&r->p.sampling, from, Vs, r->hist, n_hist, pos, s->scr[k], &t->id, &s->tok_err[i]);
    if (few) { /* mneg back to all -inf */
        const uint64_t *b = s->bits[k];
        const int TV = ds_vocab_trie_vocab(s->o.trie), lim = Vs < TV ? Vs : TV;
        float *m = s->mneg[k];
        for (int w = 0; w < (lim + 63) / 64; w++)
            for (uint64_t x = b[w]; x; x &= x - 1) {
                int id = w * 64 + __builtin_ctzll(x);
                if (id < lim) m[id] = -INFINITY;
            }
    }
    if (!rc && r->gs) {
        if (r->g_on && ds_grammar_accept(s->o.trie, r->gs, t->id))
            rc = ds_fail(&s->tok_err[i], "the grammar rejected the sampled token %d", (int)t->id);
        else if (!r->g_on && t->id == r->p.grammar_after)
            r->g_on = 1;
    }
    if (!rc && r->p.top_logprobs >= 0) fill_logprobs(s, lg, Vs, t, r->p.top_logprobs);
    return rc;
}

/* Samples the step's j-th item with logits (s->samp[j]): one row, or a
 * verify item's rows in order (each at its position, with the tokens drawn
 * before it in the history) until a token differs from the draft after it
 * or is a stop token. s->tn[i]: the rows drawn, into s->tok from
 * s->tbase[i].
 * The draws of a step run in parallel: on the backend's threads where it
 * lends them (the CPU's pool, idle between steps: a second team of threads
 * would compete with it for the cores), else on an OpenMP team. Each draw
 * depends only on its own logits, history, seed and position, and writes only
 * its own slots. The tokens are published after the last draw: a waiter
 * woken mid-draw would compete with the draws for the cores (measured on 2
 * cores at 32 requests: the sampling phase ~1.5x as long). */
static void draw(void *ctx, int j) {
    ds_sched *s = ctx;
    const int V = s->m->cfg.vocab_size;
    int i = s->samp[j];
    ds_req *r = s->item_req[i];
    int n_hist = r->n_prompt + r->info.n_out, nv = r->nv;
    int k = scratch_take(s);
    s->tn[i] = 0;
    s->tok_rc[i] = 0;
    for (int q = 0; q <= nv; q++) {
        ds_req_token *t = &s->tok[s->tbase[i] + q];
        if ((s->tok_rc[i] = draw_row(s, i, k, s->items[i].logits + (size_t)q * V, n_hist + q, s->pos0[i] + q, t)))
            break;
        s->tn[i]++;
        if (q == nv) break;
        r->hist[n_hist + q] = t->id; /* the next row's history */
        if (t->id != r->vtok[q + 1] || ds_stop_check(r->p.stop_ids, r->p.n_stop, t->id)) break;
    }
    atomic_store_explicit(&s->scr_busy[k], 0, memory_order_release);
}

/* Under mu, woken from idle by a request: wait for the requests sent with it
 * (ds_sched_opts.gather_ms). A spurious wakeup only ends the wait early. */
static void gather_locked(ds_sched *s) {
    const double end = ds_now() + s->o.gather_ms * 1e-3;
    for (;;) {
        int n = s->n_queued;
        double now = ds_now(), until = now + s->o.gather_gap_ms * 1e-3;
        if (s->stop || n >= s->o.max_seqs || now >= end) return;
        if (until > end) until = end;
        struct timespec ts; /* the condition variable's clock: CLOCK_REALTIME */
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)((until - now) * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&s->work, &s->mu, &ts);
        if (s->n_queued == n) return; /* none came in the gap */
    }
}

static void *sched_main(void *arg) {
    ds_sched *s = arg;
    const ds_model *m = s->m;
    const int V = m->cfg.vocab_size;
    const size_t n_exp = (size_t)m->cfg.n_layers * (size_t)m->cfg.n_routed_experts;
    ds_observer obs = {route_hook, NULL, s, NULL};
    for (;;) {
        /* ---- step boundary: drop cancelled requests, admit queued ones */
        pthread_mutex_lock(&s->mu);
        while (!s->stop && !s->n_run && !s->q_head) pthread_cond_wait(&s->work, &s->mu);
        if (!s->n_run && s->q_head && s->o.gather_ms > 0) gather_locked(s);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        const double t_admit = ds_now();
        int k = 0;
        for (int i = 0; i < s->n_run; i++) {
            ds_req *r = s->run[i];
            if (r->cancel) {
                drop_seq(r);
                finish_locked(s, r, DS_REQ_CANCELLED, NULL);
            } else {
                s->run[k++] = r;
            }
        }
        s->n_run = k;
        for (ds_req **pp = &s->q_head; *pp;) { /* cancelled while queued */
            ds_req *r = *pp;
            if (r->cancel) {
                *pp = r->next;
                s->n_queued--;
                finish_locked(s, r, DS_REQ_CANCELLED, NULL);
            } else {
                pp = &r->next;
            }
        }
        s->q_tail = NULL;
        for (ds_req *r = s->q_head; r; r = r->next) s->q_tail = r;
        ds_req *admit[256];
        int n_admit = 0;
        while (s->q_head && s->n_run + n_admit < s->o.max_seqs && n_admit < 256) {
            ds_req *r = s->q_head;
            s->q_head = r->next;
            if (!s->q_head) s->q_tail = NULL;
            r->next = NULL;
            s->n_queued--;
            admit[n_admit++] = r;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_admit; i++) {
            ds_req *r = admit[i];
            ds_err err = {{0}};
            int rc = acquire_seq(s, r, &err);
            pthread_mutex_lock(&s->mu);
            if (rc) {
                finish_locked(s, r, DS_REQ_FAILED, err.msg);
            } else {
                r->info.state = DS_REQ_RUNNING;
                atomic_store_explicit(&r->pub_state, DS_REQ_RUNNING, memory_order_release);
                r->info.n_cached = r->n_fed;
                s->st.cached_tokens += (uint64_t)r->n_fed;
                s->run[s->n_run++] = r;
            }
            pthread_mutex_unlock(&s->mu);
        }
        if (!s->n_run) continue;

        /* ---- speculation: the decoding requests' drafts, when the batch is small
         * (scheduler.h); a step over the limit ends it for the requests running */
        const double t_spec = ds_now();
        int n_dec = 0;
        for (int i = 0; i < s->n_run; i++) {
            ds_req *r = s->run[i];
            r->nv = 0, r->drawn = 0, r->hrow = -1, r->p0 = r->seq->pos;
            n_dec += r->n_fed >= r->n_prompt;
        }
        if (s->mt) {
            if (n_dec <= s->o.mtp_max_batch && n_dec * (s->K + 1) <= s->o.step_tokens / 2)
                sched_spec_draft(s);
            else
                for (int i = 0; i < s->n_run; i++) sched_spec_off(s->run[i]);
        }
        double spec_s = ds_now() - t_spec;

        /* ---- one step: every decoding request one token (and its drafts), then prompt chunks under the budget */
        int n_items = 0, n_decode = 0, n_prefill = 0, n_rows = 0, n_hid = 0;
        for (int i = 0; i < s->n_run; i++) {
            ds_req *r = s->run[i];
            if (r->n_prompt + r->info.n_out - r->n_fed != 1 || r->info.error[0]) continue;
            int rows = 1 + r->nv;
            if (r->ms) r->hrow = n_hid, n_hid += rows;
            s->items[n_items] = (ds_batch_item){r->seq, r->nv ? r->vtok : &r->hist[r->n_fed], rows,
                                                s->logits + (size_t)n_rows * V, r->nv > 0,
                                                r->ms ? s->hid + (size_t)r->hrow * s->nD : NULL, NULL};
            s->tbase[n_items] = n_rows;
            s->pos0[n_items] = r->seq->pos + 1;
            s->item_req[n_items++] = r;
            n_rows += rows;
            r->n_fed += rows;
            n_decode += rows;
        }
        /* prompts, forced tokens and the kept tokens of a verify step, in chunks */
        int budget = s->o.step_tokens - n_decode;
        for (int i = 0; i < s->n_run && budget > 0; i++) {
            ds_req *r = s->run[i];
            int left = r->n_prompt + r->info.n_out - r->n_fed;
            if (left <= 0 || r->info.error[0]) continue; /* decoding: in the step already */
            int take = left < s->o.prefill_chunk ? left : s->o.prefill_chunk;
            if (take > budget) take = budget;
            int last = take == left;
            if (r->ms) r->hrow = n_hid, n_hid += take;
            s->items[n_items] = (ds_batch_item){r->seq, r->hist + r->n_fed, take,
                                                last ? s->logits + (size_t)n_rows * V : NULL, 0,
                                                r->ms ? s->hid + (size_t)r->hrow * s->nD : NULL, NULL};
            s->tbase[n_items] = n_rows;
            s->pos0[n_items] = r->seq->pos + take;
            s->item_req[n_items++] = r;
            n_rows += last;
            r->n_fed += take;
            budget -= take;
            n_prefill += take;
        }
        memset(s->expert_step, 0, n_exp * sizeof *s->expert_step);
        const double t0 = ds_now();
        ds_err err = {{0}};
        int frc = n_items ? ds_forward_observed(m, s->be, s->items, n_items, &obs, &err) : 0;
        double t1 = ds_now();

        /* ---- sample (draw), publish, retire */
        int n_samp = 0;
        for (int i = 0; i < n_items && !frc; i++)
            if (s->items[i].logits) s->samp[n_samp++] = i;
        /* A lone draw on a backend that lends no threads (the GPU's; the
         * CPU's pool would compete) spreads its passes over the vocabulary
         * on the idle cores (the same token). */
        s->draw_threads = n_samp == 1 && !s->be->host_for ? s->n_scr : 1;
        if (s->be->host_for && n_samp > 1) {
            s->be->host_for(s->be, n_samp, draw, s);
        } else {
            /* A team no larger than the draws (an idle member only takes a core
             * from the others) nor than their work: waking a member costs tens
             * of microseconds, as much as a draw over a few thousand logits. */
            int team = n_samp < s->n_scr ? n_samp : s->n_scr;
            const long by_work = (long)n_samp * s->n_live / DRAW_LOGITS_PER_MEMBER + 1;
            if (team > by_work) team = (int)by_work;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (team > 1)
            for (int j = 0; j < n_samp; j++) draw(s, j);
        }
        const double t2 = ds_now();
        int n_gen = 0;
        pthread_mutex_lock(&s->mu);
        for (int j = 0; j < n_samp; j++) {
            int i = s->samp[j];
            ds_req *r = s->item_req[i];
            int n_hist = r->n_prompt + r->info.n_out;
            if (s->mask_t[i] > 0) s->st.mask_tokens++, s->st.mask_s += s->mask_t[i];
            if (s->tok_rc[i]) {
                r->cancel = 1; /* removed below */
                snprintf(r->info.error, sizeof r->info.error, "%s", s->tok_err[i].msg);
                continue;
            }
            if (r->nv) { /* a verify item: its drawn rows, the drafts the draws agreed with */
                int d = s->tn[i];
                for (int q = 0; q < d; q++) {
                    r->hist[n_hist + q] = s->tok[s->tbase[i] + q].id;
                    r->out[r->info.n_out++] = s->tok[s->tbase[i] + q];
                }
                r->drawn = d;
                n_gen += d;
                r->info.n_drafted += r->nv;
                r->info.n_accepted += d - 1;
                s->st.mtp_verify++;
                s->st.mtp_drafted += (uint64_t)r->nv;
                s->st.mtp_accepted += (uint64_t)(d - 1);
                r->last_forced = 0;
                if (!r->info.t_first) r->info.t_first = ds_now();
                atomic_store_explicit(&r->n_pub, r->info.n_out, memory_order_release);
                continue;
            }
            ds_req_token t = s->tok[s->tbase[i]];
            r->hist[n_hist] = t.id;
            n_gen++;
            int n_force = 0; /* a forced continuation after this token */
            if (r->p.n_force && !r->forced && t.id == r->p.force_after) {
                r->forced = 1;
                n_force = r->p.n_force;
                if (n_force > r->p.max_new - r->info.n_out - 1) n_force = r->p.max_new - r->info.n_out - 1;
                for (int f = 0; f < n_force; f++) r->hist[n_hist + 1 + f] = r->p.force[f];
            }
            r->last_forced = n_force > 0;
            r->out[r->info.n_out++] = t;
            for (int q = 0; q < n_force; q++) {
                ds_req_token *f = &r->out[r->info.n_out++];
                memset(f, 0, sizeof *f);
                f->id = r->p.force[q];
            }
            if (!r->info.t_first) r->info.t_first = ds_now();
            atomic_store_explicit(&r->n_pub, r->info.n_out, memory_order_release);
        }
        pthread_mutex_unlock(&s->mu);
        /* wake the waiters outside the lock, so they do not wake only to wait
         * for it (the scheduler's reference keeps every request alive here) */
        for (int j = 0; j < n_samp; j++) {
            ds_req *r = s->item_req[s->samp[j]];
            if (j == 0 || r->wk != s->item_req[s->samp[j - 1]]->wk) waker_wake(r->wk);
        }
        const double t3 = ds_now();
        if (s->mt && !frc) sched_spec_follow(s);
        const double t4 = ds_now();
        pthread_mutex_lock(&s->mu);
        for (int l = 0; s->tiers && l <= s->m->cfg.n_layers; l++) /* the store is this thread's */
            s->tiers[l] = ds_store_counts_of(s->m->store, l < s->m->cfg.n_layers ? l : -1);
        s->st.mtp_s += spec_s + (t4 - t3);
        s->st.steps++;
        s->st.admit_s += t0 - t_admit;
        s->st.forward_s += t1 - t0;
        s->st.sample_s += t2 - t1;
        s->st.publish_s += t3 - t2;
        s->st.prompt_tokens += (uint64_t)n_prefill;
        s->st.gen_tokens += (uint64_t)n_gen;
        int tot = n_prefill + n_decode;
        if (tot > 0) {
            s->st.prefill_s += (t1 - t0) * n_prefill / tot;
            s->st.decode_s += (t1 - t0) * n_decode / tot;
        }
        s->st.batch_mean += ((double)n_items - s->st.batch_mean) / (double)s->st.steps;
        int b = 0;
        while (b < 7 && (n_items >> (b + 1)) > 0) b++;
        s->st.batch_hist[b]++;
        for (size_t i = 0; i < n_exp; i++) s->expert_tokens[i] += s->expert_step[i];
        load_update(s);
        rate_add(s, t1, (uint64_t)n_gen);
        k = 0;
        for (int i = 0; i < s->n_run; i++) {
            ds_req *r = s->run[i];
            if (frc) {
                drop_seq(r);
                finish_locked(s, r, DS_REQ_FAILED, err.msg);
                continue;
            }
            if (r->info.error[0]) { /* sampling (or the block, or a rewind) failed */
                drop_seq(r);
                finish_locked(s, r, DS_REQ_FAILED, NULL);
                continue;
            }
            int n_out = r->info.n_out;
            int stop = n_out > 0 && !r->last_forced && ds_stop_check(r->p.stop_ids, r->p.n_stop, r->out[n_out - 1].id);
            int full = n_out >= r->p.max_new || (n_out > 0 && r->seq->pos + 1 > r->seq->max_len);
            if (stop || full) {
#ifdef DSV4_TEST_HOOKS
                sched_record_tokens(s, r);
#endif
                park_seq(s, r, 1);
                finish_locked(s, r, stop ? DS_REQ_DONE_STOP : DS_REQ_DONE_LENGTH, NULL);
            } else {
                s->run[k++] = r;
            }
        }
        s->n_run = k;
        s->st.cached_seqs = s->n_cache;
        s->st.retire_s += ds_now() - t4;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* --------------------------------------------------------------- lifecycle */

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int ds_sched_start(const ds_model *m, const ds_backend *be, const ds_sched_opts *o, ds_sched **out, ds_err *err) {
    *out = NULL;
    if (o->max_seqs < 1 || o->max_seqs > 256) return ds_fail(err, "max-seqs is %d (must be in [1, 256])", o->max_seqs);
    if (o->max_queue < 0) return ds_fail(err, "the queue limit is %d (must be >= 0)", o->max_queue);
    if (o->ctx < 2) return ds_fail(err, "ctx is %lld (must be >= 2)", (long long)o->ctx);
    if (o->step_tokens < o->max_seqs)
        return ds_fail(err, "the step budget of %d tokens is below max-seqs %d (every running request needs one)",
                       o->step_tokens, o->max_seqs);
    if (o->prefill_chunk < 1) return ds_fail(err, "prefill chunk is %d (must be >= 1)", o->prefill_chunk);
    if (o->cache_seqs < 0 || o->cache_seqs > 1024) return ds_fail(err, "cache-seqs is %d", o->cache_seqs);
    if (o->gather_ms < 0 || o->gather_ms > 60000 || (o->gather_ms > 0 && (o->gather_gap_ms < 1 || o->gather_gap_ms > o->gather_ms)))
        return ds_fail(err, "batch-wait is %d ms with a gap of %d ms (must be 0, or 1 <= gap <= wait <= 60000)",
                       o->gather_ms, o->gather_gap_ms);
    if (o->mtp < 0 || o->mtp > DS_GEN_MTP_MAX) return ds_fail(err, "mtp is %d (must be in [0, %d])", o->mtp, DS_GEN_MTP_MAX);
    if (o->mtp_max_batch < 0 || o->mtp_max_batch > 256)
        return ds_fail(err, "mtp-max-batch is %d (must be in [0, 256])", o->mtp_max_batch);
    ds_sched *s = calloc(1, sizeof *s);
    if (!s) return ds_fail(err, "out of memory");
    s->m = m;
    s->be = be;
    s->o = *o;
    const int V = m->cfg.vocab_size;
    const size_t n_exp = (size_t)m->cfg.n_layers * (size_t)m->cfg.n_routed_experts;
    int max_items = o->max_seqs;
    s->mt = o->mtp > 0 ? m->mtp_model : NULL;
    s->K = s->mt ? o->mtp : 0;
    s->nD = (size_t)m->cfg.hc_mult * (size_t)m->cfg.dim;
    const size_t rows = (size_t)max_items * (size_t)(s->K + 1); /* logits rows of a step at most */
    s->run = calloc((size_t)o->max_seqs, sizeof *s->run);
    s->cache = calloc((size_t)(o->cache_seqs ? o->cache_seqs : 1), sizeof *s->cache);
    s->items = calloc((size_t)max_items, sizeof *s->items);
    s->item_req = calloc((size_t)max_items, sizeof *s->item_req);
    s->logits = ds_host_alloc(be, rows * (size_t)V * sizeof *s->logits, err); /* downloads land here */
    s->expert_tokens = calloc(n_exp ? n_exp : 1, sizeof *s->expert_tokens);
    s->expert_step = calloc(n_exp ? n_exp : 1, sizeof *s->expert_step);
    s->expert_load = calloc(n_exp ? n_exp : 1, sizeof *s->expert_load);
    if (m->store) s->tiers = calloc((size_t)m->cfg.n_layers + 1, sizeof *s->tiers);
    if (!s->logits) { /* the backend's message (pinned memory, or the bytes asked) */
        ds_sched_stop(s);
        return ds_fail_prefix(err, "scheduler logits for %d sequences, vocabulary %d", o->max_seqs, V);
    }
    if (!s->run || !s->cache || !s->items || !s->item_req || !s->expert_tokens || !s->expert_step ||
        !s->expert_load || (m->store && !s->tiers)) {
        ds_sched_stop(s);
        return ds_fail(err, "out of memory for the scheduler (%d sequences, vocabulary %d)", o->max_seqs, V);
    }
    if (o->n_mask > 0) {
        if (!(s->mask = malloc((size_t)o->n_mask * sizeof *s->mask))) {
            free(s->run), s->run = NULL;
            ds_sched_stop(s);
            return ds_fail(err, "out of memory");
        }
        for (int i = 0; i < o->n_mask; i++) {
            if (o->mask_ids[i] < 0 || o->mask_ids[i] >= V) {
                free(s->run), s->run = NULL;
                ds_sched_stop(s);
                return ds_fail(err, "masked id %d is outside the vocabulary [0, %d)", (int)o->mask_ids[i], V);
            }
            s->mask[i] = o->mask_ids[i];
        }
        s->n_mask = o->n_mask;
        qsort(s->mask, (size_t)s->n_mask, sizeof *s->mask, cmp_id);
    }
    /* the live prefix: every id from n_live on masked (all masked: the whole
     * vocabulary, where ds_sample reports that nothing can be sampled) */
    s->n_live = V, s->n_holes = s->n_mask;
    for (int j = s->n_mask - 1; j >= 0 && s->mask[j] == s->n_live - 1; j--) s->n_live--, s->n_holes--;
    if (s->n_live == 0) s->n_live = V, s->n_holes = s->n_mask;
    s->n_scr = be->host_for ? be->host_threads(be) : o->threads > 0 ? o->threads : omp_get_num_procs();
    if (s->n_scr > o->max_seqs) s->n_scr = o->max_seqs;
    if (s->n_scr < 1) s->n_scr = 1;
    s->scr = calloc((size_t)s->n_scr, sizeof *s->scr);
    s->scr_busy = calloc((size_t)s->n_scr, sizeof *s->scr_busy);
    s->samp = calloc((size_t)max_items, sizeof *s->samp);
    s->tok = calloc(rows, sizeof *s->tok);
    s->tbase = calloc((size_t)max_items, sizeof *s->tbase);
    s->tn = calloc((size_t)max_items, sizeof *s->tn);
    s->pos0 = calloc((size_t)max_items, sizeof *s->pos0);
    if (s->mt) {
        const size_t hrows = (size_t)o->step_tokens + rows; /* a step's rows at most */
        s->hid = malloc(hrows * s->nD * sizeof *s->hid);
        s->bin = malloc(hrows * s->nD * sizeof *s->bin);
        s->bhid = malloc((size_t)max_items * s->nD * sizeof *s->bhid);
        s->bitems = calloc((size_t)max_items, sizeof *s->bitems);
        s->breq = calloc((size_t)max_items, sizeof *s->breq);
        s->blog = ds_host_alloc(be, (size_t)max_items * (size_t)V * sizeof *s->blog, err);
        if (!s->hid || !s->bin || !s->bhid || !s->bitems || !s->breq || !s->blog) {
            free(s->run), s->run = NULL;
            ds_sched_stop(s);
            return ds_fail(err, "out of memory for speculative decoding (%d sequences, %d drafts)", o->max_seqs,
                           o->mtp);
        }
    }
#ifdef DSV4_TEST_HOOKS
    sched_oracle_load(s);
#endif
    s->tok_rc = calloc((size_t)max_items, sizeof *s->tok_rc);
    s->tok_err = calloc((size_t)max_items, sizeof *s->tok_err);
    s->mask_t = calloc((size_t)max_items, sizeof *s->mask_t);
    if (o->trie) {
        s->msk = calloc((size_t)s->n_scr, sizeof *s->msk);
        s->bits = calloc((size_t)s->n_scr, sizeof *s->bits);
        s->mlg = calloc((size_t)s->n_scr, sizeof *s->mlg);
        s->mneg = calloc((size_t)s->n_scr, sizeof *s->mneg);
        for (int i = 0; s->msk && s->bits && s->mlg && s->mneg && i < s->n_scr; i++) {
            s->msk[i] = ds_mask_scratch_new(o->trie);
            s->bits[i] = calloc(((size_t)ds_vocab_trie_vocab(o->trie) + 63) / 64, sizeof **s->bits);
            s->mlg[i] = malloc((size_t)V * sizeof **s->mlg);
            s->mneg[i] = malloc((size_t)V * sizeof **s->mneg);
            for (int v = 0; s->mneg[i] && v < V; v++) s->mneg[i][v] = -INFINITY;
            if (!s->msk[i] || !s->bits[i] || !s->mlg[i] || !s->mneg[i]) {
                free(s->run), s->run = NULL;
                ds_sched_stop(s);
                return ds_fail(err, "out of memory for the grammar masks");
            }
        }
    }
    if (!s->scr || !s->scr_busy || !s->samp || !s->tok || !s->tbase || !s->tn || !s->pos0 || !s->tok_rc || !s->tok_err || !s->mask_t ||
        (o->trie && (!s->msk || !s->bits || !s->mlg || !s->mneg))) {
        free(s->run), s->run = NULL;
        ds_sched_stop(s);
        return ds_fail(err, "out of memory for the scheduler's sampling buffers");
    }
    for (int i = 0; i < s->n_scr; i++)
        if (!(s->scr[i] = ds_sample_scratch_create(V, err))) {
            free(s->run), s->run = NULL;
            ds_sched_stop(s);
            return -1;
        }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    if (pthread_create(&s->th, NULL, sched_main, s)) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
        free(s->run), s->run = NULL;
        ds_sched_stop(s);
        return ds_fail(err, "cannot start the scheduler thread");
    }
    *out = s;
    return 0;
}

void ds_sched_shutdown(ds_sched *s) {
    if (s->run && !s->joined) { /* started: stop the thread, end every request */
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n_run; i++) {
            drop_seq(s->run[i]);
            finish_locked(s, s->run[i], DS_REQ_CANCELLED, "the server is shutting down");
        }
        while (s->q_head) {
            ds_req *r = s->q_head;
            s->q_head = r->next;
            finish_locked(s, r, DS_REQ_CANCELLED, "the server is shutting down");
        }
        s->q_tail = NULL;
        s->n_queued = 0;
        s->n_run = 0;
        pthread_mutex_unlock(&s->mu);
        s->joined = 1;
    }
}

void ds_sched_stop(ds_sched *s) {
    if (!s) return;
    if (s->run) {
        ds_sched_shutdown(s);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
    }
    for (int i = 0; i < s->n_cache; i++) cache_free(&s->cache[i]);
    for (int i = 0; s->scr && i < s->n_scr; i++) ds_sample_scratch_free(s->scr[i]);
    for (int i = 0; i < s->n_scr; i++) {
        if (s->msk) ds_mask_scratch_free(s->msk[i]);
        if (s->bits) free(s->bits[i]);
        if (s->mlg) free(s->mlg[i]);
        if (s->mneg) free(s->mneg[i]);
    }
    free(s->msk);
    free(s->bits);
    free(s->mlg);
    free(s->mneg);
    free(s->mask_t);
    free(s->scr);
    free(s->scr_busy);
    free(s->samp);
    free(s->tok);
    free(s->tbase);
    free(s->tn);
    free(s->pos0);
    free(s->hid);
    free(s->bin);
    free(s->bhid);
    free(s->bitems);
    free(s->breq);
    ds_host_free(s->be, s->blog);
#ifdef DSV4_TEST_HOOKS
    for (int i = 0; i < s->n_orc; i++) free(s->orc[i]);
    free(s->orc);
    free(s->orc_n);
#endif
    free(s->tok_rc);
    free(s->tok_err);
    free(s->mask);
    free(s->run);
    free(s->cache);
    free(s->items);
    free(s->item_req);
    ds_host_free(s->be, s->logits);
    free(s->expert_tokens);
    free(s->expert_step);
    free(s->expert_load);
    free(s->tiers);
    free(s);
}

int ds_sched_get_load(ds_sched *s, double *load, int copy_cap) {
    size_t n_exp = (size_t)s->m->cfg.n_layers * (size_t)s->m->cfg.n_routed_experts;
    if (!load || (size_t)copy_cap < n_exp) return -1;
    pthread_mutex_lock(&s->mu);
    memcpy(load, s->expert_load, n_exp * sizeof *load);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int ds_sched_get_tiers(ds_sched *s, ds_store_counts *out, int copy_cap) {
    int n = s->m->cfg.n_layers + 1;
    if (!s->tiers || !out || copy_cap < n) return -1;
    pthread_mutex_lock(&s->mu);
    memcpy(out, s->tiers, (size_t)n * sizeof *out);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void ds_sched_get_stats(ds_sched *s, ds_sched_stats *out, uint64_t *expert_tokens_out, int copy_cap) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_queued;
    out->running = s->n_run;
    out->live_seqs = s->n_run + s->st.cached_seqs;
    out->n_moe_layers = s->m->cfg.n_layers;
    out->n_experts = s->m->cfg.n_routed_experts;
    size_t n_exp = (size_t)out->n_moe_layers * (size_t)out->n_experts;
    if (expert_tokens_out && (size_t)copy_cap >= n_exp)
        memcpy(expert_tokens_out, s->expert_tokens, n_exp * sizeof *expert_tokens_out);
    double now = ds_now(), t_old = now;
    uint64_t n = 0;
    for (int i = 0; i < 64; i++)
        if (s->rate_t[i] > now - 10.0) {
            n += s->rate_n[i];
            if (s->rate_t[i] < t_old) t_old = s->rate_t[i];
        }
    out->tokens_per_s = now - t_old > 0.5 ? (double)n / (now - t_old) : 0;
    pthread_mutex_unlock(&s->mu);
}
