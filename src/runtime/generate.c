/* generate.c — see generate.h. */
#include "runtime/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/state.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ds_gen_params_init(ds_gen_params *p) {
    memset(p, 0, sizeof *p);
    ds_sampling_init(&p->sampling);
    p->sampling.temperature = 0;
    p->max_new = 64;
    p->prefill_chunk = 512;
    p->grammar_after = -1;
}

/* The text of one sampled (non-stop) token through the stream; ids without a
 * token (model vocabulary larger than the tokenizer's) give no text. */
static int push_text(ds_detok_stream *ds, const ds_tokenizer *tok, int32_t id, const char **text, size_t *n,
                     ds_err *err) {
    *text = "";
    *n = 0;
    if (!ds) return 0;
    size_t len;
    if (id < 0 || id >= ds_tokenizer_vocab_size(tok) || !ds_tokenizer_token_bytes(tok, id, &len)) return 0;
    return ds_detok_stream_push(ds, id, text, n, err);
}

/* What becomes of a sampled token t: it joins the history, counts, and
 * either stops generation (a stop id) or goes out as text; the callback
 * may stop it too. */
typedef struct {
    int32_t *hist;
    int *n_hist;
    ds_gen_result *r;
    const int32_t *stop;
    int n_stop;
    ds_detok_stream *ds;
    const ds_tokenizer *tok;
    ds_gen_token_fn cb;
    void *cb_ctx;
} emitter;

static int emit(const emitter *e, int32_t t, int *stopped, ds_err *err) {
    e->hist[(*e->n_hist)++] = t;
    e->r->n_gen++;
    const char *text = "";
    size_t n = 0;
    int is_stop = ds_stop_check(e->stop, e->n_stop, t);
    if (is_stop) {
        e->r->stop_token = t;
        *stopped = 1;
    } else if (push_text(e->ds, e->tok, t, &text, &n, err)) {
        return -1;
    }
    if (e->cb && e->cb(e->cb_ctx, t, is_stop, text, n)) *stopped = 1;
    return 0;
}

int ds_gen_unsampled_ids(const ds_tokenizer *tok, int vocab, int32_t **ids, int *n, ds_err *err) {
    *ids = NULL;
    *n = 0;
    if (!tok) return 0;
    int count = 0;
    size_t len;
    for (int32_t id = 0; id < vocab; id++) count += !ds_tokenizer_token_bytes(tok, id, &len);
    if (!count) return 0;
    int32_t *v = malloc((size_t)count * sizeof *v);
    if (!v) return ds_fail(err, "generate: out of memory");
    int k = 0;
    for (int32_t id = 0; id < vocab; id++)
        if (!ds_tokenizer_token_bytes(tok, id, &len)) v[k++] = id;
    *ids = v;
    *n = k;
    return 0;
}

void ds_gen_mask_logits(float *logits, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) logits[ids[i]] = -INFINITY;
}

/* The highest logit, ties to the lower id (a draft: the block's greedy pick). */
static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Speculative decoding's buffers and the MTP block's sequence. */
typedef struct spec {
    const ds_model *mt; /* m->mtp_model */
    ds_seq *ms;         /* the block's sequence: position q holds (h_q, x_{q+1}) */
    ds_seq_snap snap, msnap;
    float *vlog;   /* [k+1][V] the verify step's logits */
    float *vhid;   /* [max(k+1, chunk)][nD] the model's streams of a step */
    float *chid;   /* [k+1][nD] rows the block has yet to see */
    int32_t *ctok; /* [k+1] their next tokens */
    int nc;
    float *mlog, *mhid; /* [V], [nD] the block's last row */
    int32_t *vtok;      /* [k+1] */
} spec;

static void spec_free(const ds_backend *be, spec *x) {
    if (x->ms) {
        ds_seq_snap_free(x->ms, &x->msnap);
        ds_seq_free(x->ms);
    }
    ds_host_free(be, x->vlog);
    ds_host_free(be, x->mlog);
    free(x->vhid), free(x->chid), free(x->ctok), free(x->mhid), free(x->vtok);
}

/* The block over the rows it has not seen (catch-up, one step), then chained
 * on its own streams: drafts d[0..k) (k >= 1); its sequence is rewound to
 * the catch-up after the chain. */
static int spec_draft(const ds_backend *be, spec *x, int k, const int32_t *masked, int n_masked, int32_t *d,
                      ds_err *err) {
    const ds_model *mt = x->mt;
    int V = mt->cfg.vocab_size;
    size_t nD = (size_t)mt->cfg.hc_mult * (size_t)mt->cfg.dim;
    ds_batch_item it = {x->ms, x->ctok, x->nc, x->mlog, 0, NULL, x->chid};
    /* the last row's streams: all rows' go to vhid (free between steps) */
    it.hidden = x->vhid;
    if (ds_forward(mt, be, &it, 1, err)) return -1;
    memcpy(x->mhid, x->vhid + (size_t)(x->nc - 1) * nD, nD * sizeof(float));
    x->nc = 0;
    ds_gen_mask_logits(x->mlog, masked, n_masked);
    d[0] = argmax(x->mlog, V);
    if (k > 1 && ds_seq_snapshot(mt, x->ms, &x->msnap, err)) return -1;
    for (int i = 1; i < k; i++) {
        ds_batch_item c = {x->ms, &d[i - 1], 1, x->mlog, 0, x->vhid, x->mhid};
        if (ds_forward(mt, be, &c, 1, err)) return -1;
        memcpy(x->mhid, x->vhid, nD * sizeof(float));
        ds_gen_mask_logits(x->mlog, masked, n_masked);
        d[i] = argmax(x->mlog, V);
    }
    return k > 1 ? ds_seq_rewind(mt, x->ms, &x->msnap, err) : 0;
}

int ds_generate(const ds_model *m, const ds_backend *be, const ds_tokenizer *tok, ds_seq *seq, const int32_t *prompt,
                int n_prompt, int n_cached, const ds_gen_params *p, ds_gen_token_fn cb, void *cb_ctx,
                ds_gen_result *res, ds_err *err) {
    ds_gen_result r = {0, 0, 0, 0, -1, 0, 0, 0, 0};
    if (res) *res = r;
    const int V = m->cfg.vocab_size;
    if (p->max_new < 0) return ds_fail(err, "generate: max_new is %d (must be >= 0)", p->max_new);
    if (n_prompt < 1 || !prompt) return ds_fail(err, "generate: empty prompt (at least one token is needed)");
    if (n_cached < 0 || n_cached > n_prompt || (n_cached == n_prompt && p->max_new > 0))
        return ds_fail(err, "generate: %d cached tokens for a prompt of %d (at least one must be new)", n_cached,
                       n_prompt);
    if (seq && seq->pos != n_cached)
        return ds_fail(err, "generate: the sequence holds %lld tokens, not the %d cached prompt tokens",
                       (long long)seq->pos, n_cached);
    if (n_prompt > m->cfg.max_pos)
        return ds_fail(err, "generate: a prompt of %d tokens is beyond the model's max_position_embeddings (%lld)",
                       n_prompt, (long long)m->cfg.max_pos);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return ds_fail(err, "generate: prompt token %d (id %d) is out of the model's vocabulary [0, %d)", i,
                           (int)prompt[i], V);
    if (ds_sampling_validate(&p->sampling, err)) return ds_fail_prefix(err, "generate");

    int32_t eos = tok ? ds_tokenizer_eos_id(tok) : -1;
    if (eos < 0) eos = m->cfg.eos_id;
    const int32_t *stop = p->stop_ids;
    int n_stop = p->n_stop;
    if (!stop || n_stop <= 0) {
        stop = &eos;
        n_stop = eos >= 0 ? 1 : 0;
    }
    int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 512;
    if (p->mtp < 0 || p->mtp > DS_GEN_MTP_MAX)
        return ds_fail(err, "generate: mtp is %d (must be 0..%d)", p->mtp, DS_GEN_MTP_MAX);
    /* drafts per step (the speculative loop samples without a grammar's mask: off with one) */
    int K = m->mtp_model && n_cached == 0 && p->max_new > 1 && !p->grammar ? p->mtp : 0;
    spec X = {0};
    size_t nD = (size_t)m->cfg.hc_mult * (size_t)m->cfg.dim;

    int rc = -1;
    ds_seq *own = NULL;
    float *logits = NULL;
    int32_t *hist = NULL;
    ds_sample_scratch *scr = NULL;
    ds_detok_stream *ds = NULL;
    int32_t *masked = NULL; /* ids without a token: never sampled */
    int n_masked = 0;
    ds_gstate *gs = NULL; /* the grammar's state, its mask and the masked logits */
    ds_mask_scratch *ms = NULL;
    uint64_t *bits = NULL;
    float *glg = NULL;
    int g_on = 0;
    if (p->grammar) {
        if (!tok || !p->trie) return ds_fail(err, "generate: a grammar needs the tokenizer and its trie");
        gs = ds_gstate_new(p->grammar);
        ms = ds_mask_scratch_new(p->trie);
        bits = calloc(((size_t)ds_vocab_trie_vocab(p->trie) + 63) / 64, sizeof *bits);
        glg = malloc((size_t)V * sizeof *glg);
        g_on = p->grammar_after < 0;
        if (!gs || !ms || !bits || !glg) {
            ds_fail(err, "generate: out of memory (grammar)");
            goto done;
        }
    }
    if (ds_gen_unsampled_ids(tok, V, &masked, &n_masked, err)) goto done;
    if (!seq) {
        int64_t cap = p->max_len > 0 ? p->max_len : (int64_t)n_prompt + p->max_new + 1;
        if (ds_seq_new(m, cap, &own, err)) goto done;
        seq = own;
    }
    if (seq->max_len < n_prompt) {
        ds_fail(err, "generate: a prompt of %d tokens does not fit the sequence capacity of %lld tokens", n_prompt,
                (long long)seq->max_len);
        goto done;
    }
    if (!(logits = ds_host_alloc(be, (size_t)V * sizeof *logits, err))) goto done; /* the backend's download buffer */
    hist = malloc(((size_t)n_prompt + (size_t)p->max_new) * sizeof *hist);
    if (!hist) {
        ds_fail(err, "generate: out of memory (vocabulary %d, %d + %d tokens)", V, n_prompt, p->max_new);
        goto done;
    }
    if (!(scr = ds_sample_scratch_create(V, err))) goto done;
    if (tok && ds_detok_stream_new(tok, p->detok_flags, &ds, err)) goto done;
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    if (K) {
        int rows = chunk > K + 1 ? chunk : K + 1;
        X.mt = m->mtp_model;
        X.vlog = ds_host_alloc(be, (size_t)(K + 1) * (size_t)V * sizeof(float), err);
        X.mlog = X.vlog ? ds_host_alloc(be, (size_t)V * sizeof(float), err) : NULL;
        if (!X.vlog || !X.mlog) goto done;
        X.vhid = malloc((size_t)rows * nD * sizeof(float));
        X.chid = malloc((size_t)(K + 1) * nD * sizeof(float));
        X.mhid = malloc(nD * sizeof(float));
        X.ctok = malloc((size_t)(K + 1) * sizeof(int32_t));
        X.vtok = malloc((size_t)(K + 1) * sizeof(int32_t));
        if (!X.vhid || !X.chid || !X.mhid || !X.ctok || !X.vtok) {
            ds_fail(err, "generate: out of memory for speculative decoding");
            goto done;
        }
        if (ds_seq_new(X.mt, seq->max_len, &X.ms, err)) goto done;
    }

    /* prefill: bounded steps; only the last one asks for logits (its last row) */
    double t0 = now_s();
    for (int done_n = n_cached; done_n < n_prompt;) {
        int take = n_prompt - done_n < chunk ? n_prompt - done_n : chunk;
        int last = done_n + take == n_prompt;
        ds_batch_item it = {seq, prompt + done_n, take, last && p->max_new > 0 ? logits : NULL, 0, X.vhid, NULL};
        if (ds_forward(m, be, &it, 1, err)) goto done;
        if (K) { /* the block sees (h_i, x_{i+1}); the last row waits for the first sampled token */
            int rows = last ? take - 1 : take;
            if (rows > 0) {
                ds_batch_item b = {X.ms, prompt + done_n + 1, rows, NULL, 0, NULL, X.vhid};
                if (ds_forward(X.mt, be, &b, 1, err)) goto done;
            }
            if (last) memcpy(X.chid, X.vhid + (size_t)(take - 1) * nD, nD * sizeof(float));
        }
        done_n += take;
    }
    double t1 = now_s();
    r.n_prompt = n_prompt - n_cached;
    r.prompt_s = t1 - t0;

    int n_hist = n_prompt, stopped = 0;
    emitter E = {hist, &n_hist, &r, stop, n_stop, ds, tok, cb, cb_ctx};
    if (K) {
        /* the first token, as below */
        int32_t t;
        ds_gen_mask_logits(logits, masked, n_masked);
        if (seq->pos >= m->cfg.max_pos) {
            r.at_max_pos = 1;
            stopped = 1;
        } else {
            if (p->on_logits) p->on_logits(p->hook_ctx, seq->pos, logits, V);
            if (ds_sample(&p->sampling, logits, V, hist, n_hist, seq->pos, scr, &t, err)) goto done;
            if (emit(&E, t, &stopped, err)) goto done;
            X.ctok[0] = t;
            X.nc = 1;
        }
        /* each step: pending token x = hist[n_hist-1] (sampled, not fed) at position P = seq->pos */
        while (!stopped && r.n_gen < p->max_new && seq->pos + 1 <= seq->max_len) {
            int64_t P = seq->pos;
            int k = K;
            if (k > p->max_new - r.n_gen - 1) k = p->max_new - r.n_gen - 1;
            if (k > seq->max_len - P - 1) k = (int)(seq->max_len - P - 1);
            if (k > m->cfg.max_pos - P - 2) k = (int)(m->cfg.max_pos - P - 2);
            if (k < 0) k = 0;
            X.vtok[0] = hist[n_hist - 1];
            if (k > 0) {
                if (spec_draft(be, &X, k, masked, n_masked, X.vtok + 1, err)) goto done;
                if (p->draft) p->draft(p->hook_ctx, P + 1, k, X.vtok + 1);
                if (ds_seq_snapshot(m, seq, &X.snap, err)) goto done;
                r.mtp_steps++;
                r.mtp_drafted += k;
            }
            ds_batch_item it = {seq, X.vtok, k + 1, X.vlog, 1, X.vhid, NULL};
            if (ds_forward(m, be, &it, 1, err)) goto done;
            int j = 0; /* drafts kept: the state keeps vtok[0..j] */
            for (int i = 0; i <= k; i++) {
                int64_t pos = P + 1 + i;
                if (pos >= m->cfg.max_pos) { /* only at i = 0 (k is bounded) */
                    r.at_max_pos = 1;
                    stopped = 1;
                    break;
                }
                int32_t tk;
                float *lg = X.vlog + (size_t)i * V;
                ds_gen_mask_logits(lg, masked, n_masked);
                if (p->on_logits) p->on_logits(p->hook_ctx, pos, lg, V);
                if (ds_sample(&p->sampling, lg, V, hist, n_hist, pos, scr, &tk, err)) goto done;
                if (emit(&E, tk, &stopped, err)) goto done;
                j = i;
                if (stopped || i == k || tk != X.vtok[i + 1]) break;
                r.mtp_accepted++;
            }
            if (j < k) { /* forget the rejected drafts: rewind, feed the kept tokens again */
                if (ds_seq_rewind(m, seq, &X.snap, err)) goto done;
                ds_batch_item again = {seq, X.vtok, j + 1, NULL, 0, NULL, NULL};
                if (ds_forward(m, be, &again, 1, err)) goto done;
            }
            /* the block's next rows: (h_{P+i}, x_{P+i+1}) for i <= j */
            memcpy(X.chid, X.vhid, (size_t)(j + 1) * nD * sizeof(float));
            for (int i = 0; i < j; i++) X.ctok[i] = X.vtok[i + 1];
            X.ctok[j] = hist[n_hist - 1];
            X.nc = j + 1;
        }
        stopped = 1; /* the plain loop below has nothing left to do */
    }
    for (int g = 0; g < p->max_new && !stopped; g++) {
        int32_t t;
        if (seq->pos >= m->cfg.max_pos) { /* the next token's position is beyond the model's */
            r.at_max_pos = 1;
            break;
        }
        ds_gen_mask_logits(logits, masked, n_masked);
        if (p->on_logits) p->on_logits(p->hook_ctx, seq->pos, logits, V);
        const float *from = logits;
        if (gs && g_on) { /* the grammar's mask, on a copy */
            if (!ds_grammar_mask_logits(p->trie, gs, ms, bits, logits, V, glg)) {
                ds_fail(err, "generate: the grammar allows no token here");
                goto done;
            }
            from = glg;
        }
        if (ds_sample(&p->sampling, from, V, hist, n_hist, seq->pos, scr, &t, err)) goto done;
        if (gs && g_on && ds_grammar_accept(p->trie, gs, t)) {
            ds_fail(err, "generate: the grammar rejected the sampled token %d", (int)t);
            goto done;
        }
        if (gs && !g_on && t == p->grammar_after) g_on = 1;
        if (emit(&E, t, &stopped, err)) goto done;
        if (stopped || g + 1 == p->max_new || seq->pos + 1 > seq->max_len) break;
        ds_batch_item it = {seq, &hist[n_hist - 1], 1, logits, 0, NULL, NULL};
        if (ds_forward(m, be, &it, 1, err)) goto done;
    }
    if (ds) {
        const char *text;
        size_t n;
        ds_detok_stream_flush(ds, &text, &n);
        if (n && cb) cb(cb_ctx, -1, 0, text, n);
    }
    r.gen_s = now_s() - t1;
    if (res) *res = r;
    rc = 0;
done:
    if (X.ms) ds_seq_snap_free(seq, &X.snap);
    spec_free(be, &X);
    ds_gstate_free(gs);
    ds_mask_scratch_free(ms);
    free(bits);
    free(glg);
    free(masked);
    ds_detok_stream_free(ds);
    ds_sample_scratch_free(scr);
    free(hist);
    ds_host_free(be, logits);
    ds_seq_free(own);
    return rc;
}
