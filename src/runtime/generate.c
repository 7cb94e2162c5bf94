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

int ds_generate(const ds_model *m, const ds_backend *be, const ds_tokenizer *tok, ds_seq *seq, const int32_t *prompt,
                int n_prompt, int n_cached, const ds_gen_params *p, ds_gen_token_fn cb, void *cb_ctx,
                ds_gen_result *res, ds_err *err) {
    ds_gen_result r = {0, 0, 0, 0, -1, 0};
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

    /* prefill: bounded steps; only the last one asks for logits (its last row) */
    double t0 = now_s();
    for (int done_n = n_cached; done_n < n_prompt;) {
        int take = n_prompt - done_n < chunk ? n_prompt - done_n : chunk;
        int last = done_n + take == n_prompt;
        ds_batch_item it = {seq, prompt + done_n, take, last && p->max_new > 0 ? logits : NULL, 0};
        if (ds_forward(m, be, &it, 1, err)) goto done;
        done_n += take;
    }
    double t1 = now_s();
    r.n_prompt = n_prompt - n_cached;
    r.prompt_s = t1 - t0;

    int n_hist = n_prompt, stopped = 0;
    for (int g = 0; g < p->max_new && !stopped; g++) {
        int32_t t;
        if (seq->pos >= m->cfg.max_pos) { /* the next token's position is beyond the model's */
            r.at_max_pos = 1;
            break;
        }
        ds_gen_mask_logits(logits, masked, n_masked);
        const float *from = logits;
        if (gs && g_on) { /* the grammar's mask, on a copy */
            if (!ds_grammar_mask(p->trie, gs, ms, bits)) {
                ds_fail(err, "generate: the grammar allows no token here");
                goto done;
            }
            const int TV = ds_vocab_trie_vocab(p->trie);
            for (int v = 0; v < V; v++) glg[v] = v < TV && (bits[v >> 6] >> (v & 63) & 1) ? logits[v] : -INFINITY;
            from = glg;
        }
        if (ds_sample(&p->sampling, from, V, hist, n_hist, seq->pos, scr, &t, err)) goto done;
        if (gs && g_on && ds_grammar_accept(p->trie, gs, t)) {
            ds_fail(err, "generate: the grammar rejected the sampled token %d", (int)t);
            goto done;
        }
        if (gs && !g_on && t == p->grammar_after) g_on = 1;
        hist[n_hist++] = t;
        r.n_gen++;
        const char *text = "";
        size_t n = 0;
        int is_stop = ds_stop_check(stop, n_stop, t);
        if (is_stop) {
            r.stop_token = t;
            stopped = 1;
        } else if (push_text(ds, tok, t, &text, &n, err)) {
            goto done;
        }
        if (cb && cb(cb_ctx, t, is_stop, text, n)) stopped = 1;
        if (stopped || g + 1 == p->max_new || seq->pos + 1 > seq->max_len) break;
        ds_batch_item it = {seq, &hist[n_hist - 1], 1, logits, 0};
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
