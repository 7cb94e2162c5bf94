/* forward.c — one step of the V4 network (doc §3): embedding into n streams,
 * per layer mHC → attention → mHC → MoE, then the hc head, norm and head.
 * Every buffer is a view into the model's step arena (runstate.h). */
#include "model/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ep.h"
#include "model/step.h"

static int check_items(const ds_model *m, const ds_batch_item *items, int n, ds_err *err) {
    for (int i = 0; i < n; i++) {
        const ds_batch_item *it = &items[i];
        if (!it->seq || it->n_tokens < 1 || !it->tokens)
            return ds_fail(err, "batch item %d: needs a sequence and at least one token", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) return ds_fail(err, "batch items %d and %d share one sequence", j, i);
        if (it->seq->be != m->be)
            return ds_fail(err, "sequence %d: its state is not in the memory of the model's backend", i);
        if (it->seq->pos + it->n_tokens > it->seq->max_len)
            return ds_fail(err, "sequence %d: %lld + %d tokens exceed its capacity of %lld tokens (raise --ctx)", i,
                           (long long)it->seq->pos, it->n_tokens, (long long)it->seq->max_len);
        for (int j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= m->cfg.vocab_size)
                return ds_fail(err, "sequence %d: token %d at position %lld is out of range [0, %d)", i,
                               it->tokens[j], (long long)(it->seq->pos + j), m->cfg.vocab_size);
    }
    return 0;
}

int ds_step_dump(const ds_step *S, const char *name, int layer, const float *x, int rows, int cols, ds_err *err) {
    if (!S->obs || !S->obs->tensor) return 0;
    size_t n = (size_t)rows * (size_t)cols;
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) return ds_fail(err, "out of memory for the intermediate '%s'", name);
    int rc = S->be->download(S->be, h, x, n * sizeof *h, err);
    if (!rc) S->obs->tensor(S->obs->ctx, name, layer, h, rows, cols);
    free(h);
    return rc;
}

int ds_forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items, ds_err *err) {
    return ds_forward_observed(m, be, items, n_items, NULL, err);
}

/* One layer: mHC → attention → mHC → MoE; the streams end in rs->X. */
static int layer(const ds_step *S, int li, ds_err *err) {
    const ds_config *c = &S->m->cfg;
    const ds_layer *ly = &S->m->layers[li];
    ds_runstate *rs = S->rs;
    int T = S->T, D = c->dim, nD = c->hc_mult * c->dim;
    ds_rmsnorm_params an = {rs->x_in, ly->attn_norm, rs->xn, T, D, c->rms_eps};
    ds_rmsnorm_params fn = {rs->x_in, ly->ffn_norm, rs->xn, T, D, c->rms_eps};
    float *tmp;
    if (ds_mhc_pre(S, &ly->hc_attn, rs->X, rs->x_in, err) || ds_step_dump(S, "attn_in", li, rs->x_in, T, D, err) ||
        S->be->rmsnorm(S->be, &an, err) || ds_step_dump(S, "attn_norm", li, rs->xn, T, D, err))
        return -1;
    if (ds_attention(S, li, rs->xn, rs->y, err)) return ds_fail_prefix(err, "layer %d attention", li);
    if (ds_step_dump(S, "attn_out", li, rs->y, T, D, err) || ds_mhc_post(S, rs->X, rs->y, rs->X2, err)) return -1;
    tmp = rs->X, rs->X = rs->X2, rs->X2 = tmp;
    if (ds_step_dump(S, "attn_res", li, rs->X, T, nD, err)) return -1;

    if (ds_mhc_pre(S, &ly->hc_ffn, rs->X, rs->x_in, err) || ds_step_dump(S, "ffn_in", li, rs->x_in, T, D, err) ||
        S->be->rmsnorm(S->be, &fn, err) || ds_step_dump(S, "ffn_norm", li, rs->xn, T, D, err))
        return -1;
    if (ds_moe(S, li, rs->xn, rs->y, err)) return ds_fail_prefix(err, "layer %d MoE", li);
    if (ds_step_dump(S, "ffn_out", li, rs->y, T, D, err) || ds_mhc_post(S, rs->X, rs->y, rs->X2, err)) return -1;
    tmp = rs->X, rs->X = rs->X2, rs->X2 = tmp;
    return ds_step_dump(S, "ffn_res", li, rs->X, T, nD, err);
}

/* The rows that want logits: streams → hc head → norm → head → items. */
static int head(const ds_step *S, const ds_batch_item *items, int n_items, int R, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int D = c->dim, V = c->vocab_size, r = 0;
    for (int i = 0; i < n_items; i++) {
        if (!items[i].logits) continue;
        int first = items[i].all_logits ? 0 : items[i].n_tokens - 1;
        for (int j = first; j < items[i].n_tokens; j++) rs->hrow[r++] = rs->seq_row0[i] + j;
    }
    ds_gather_params g = {rs->X, rs->hrow, R, c->hc_mult * D, rs->X2};
    ds_rmsnorm_params fn = {rs->x_in, m->norm, rs->xn, R, D, c->rms_eps};
    if (be->gather(be, &g, err) || ds_mhc_head(S, rs->X2, R, rs->x_in, err) ||
        ds_step_dump(S, "head_in", -1, rs->x_in, R, D, err) || be->rmsnorm(be, &fn, err) ||
        ds_step_dump(S, "final_norm", -1, rs->xn, R, D, err) || ds_matmul(be, &m->head, rs->xn, R, rs->hlog, err) ||
        ds_step_dump(S, "logits", -1, rs->hlog, R, V, err))
        return ds_fail_prefix(err, "head");
    r = 0;
    for (int i = 0; i < n_items; i++) {
        if (!items[i].logits) continue;
        int rows = items[i].all_logits ? items[i].n_tokens : 1;
        if (be->download(be, items[i].logits, rs->hlog + (size_t)r * V, (size_t)rows * V * sizeof(float), err))
            return -1;
        r += rows;
    }
    return 0;
}

static int forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                   const ds_observer *obs, ds_err *err);

/* Under expert parallelism the leader sends the step to the followers
 * (runtime/ep_follow.h), and every rank runs it; a step that fails on any
 * rank after that ends the job (the others would wait for it forever). */
static int send_step(const ds_model *m, const ds_batch_item *items, int n_items, ds_err *err) {
    int T = 0;
    for (int i = 0; i < n_items; i++) T += items[i].n_tokens;
    int64_t *it = malloc((size_t)n_items * 3 * sizeof *it);
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    if (!it || !tok) {
        free(it), free(tok);
        return ds_fail(err, "out of memory for a step's token table");
    }
    for (int i = 0, r = 0; i < n_items; i++) {
        if (items[i].seq->ep != m->ep) {
            free(it), free(tok);
            return ds_fail(err, "sequence %d: not created by this model's ranks", i);
        }
        it[3 * i] = items[i].seq->ep_id;
        it[3 * i + 1] = items[i].seq->pos;
        it[3 * i + 2] = items[i].n_tokens;
        for (int j = 0; j < items[i].n_tokens; j++) tok[r++] = items[i].tokens[j];
    }
    ds_ep_send_step(m->ep, n_items, it, tok, T);
    free(it), free(tok);
    return 0;
}

int ds_forward_observed(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                        const ds_observer *obs, ds_err *err) {
    if (!m->be) return ds_fail(err, "%s: the model is not bound to a backend", m->path);
    if (n_items < 1) return ds_fail(err, "empty batch");
    if (check_items(m, items, n_items, err)) return -1;
    if (!m->ep) return forward(m, be, items, n_items, obs, err);
    if (ds_ep_rank(m->ep) == 0 && send_step(m, items, n_items, err)) return -1;
    if (forward(m, be, items, n_items, obs, err)) {
        char msg[1100];
        snprintf(msg, sizeof msg, "a step of %d sequences failed: %s", n_items, err->msg);
        ds_ep_session_fatal(msg);
    }
    return 0;
}

static int forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                   const ds_observer *obs, ds_err *err) {
    const ds_config *c = &m->cfg;
    int T = 0, R = 0;
    for (int i = 0; i < n_items; i++) {
        T += items[i].n_tokens;
        if (items[i].logits) R += items[i].all_logits ? items[i].n_tokens : 1;
    }
    ds_runstate *rs = m->rs;
    if (ds_runstate_reserve(rs, c, T, R, n_items, err)) return -1;
    for (int i = 0, r = 0; i < n_items; i++) {
        rs->seq_row0[i] = r;
        rs->seq_n[i] = items[i].n_tokens;
        rs->seq_pos0[i] = items[i].seq->pos;
        rs->seq_mem[i] = items[i].seq->layers;
        for (int j = 0; j < items[i].n_tokens; j++, r++) {
            rs->tok_seq[r] = i;
            rs->tok_pos[r] = items[i].seq->pos + j;
            rs->tok_id[r] = items[i].tokens[j];
        }
    }
    ds_step_desc desc = {T,           n_items,      c->n_layers,  rs->tok_id,  rs->tok_pos,
                         rs->tok_seq, rs->seq_row0, rs->seq_n,    rs->seq_pos0, rs->seq_mem};
    ds_step S = {m, be, obs, rs, T, n_items};
    ds_embed_params ep = {&m->embed, c->hc_mult, rs->X};
    if (be->begin_step(be, &desc, err) || be->embed(be, &ep, err) ||
        ds_step_dump(&S, "embed", -1, rs->X, T, c->hc_mult * c->dim, err))
        return -1;
    for (int li = 0; li < c->n_layers; li++)
        if (layer(&S, li, err)) return -1;
    if (R && head(&S, items, n_items, R, err)) return -1;
    for (int i = 0; i < n_items; i++) items[i].seq->pos += items[i].n_tokens;
    return 0;
}
