/* forward.c — one step of the V4 network (doc §3): embedding into n streams,
 * per layer mHC → attention → mHC → MoE, then the hc head, norm and head.
 * Every buffer is a view into the model's step arena (runstate.h). */
#include "model/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"
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
        if (it->seq->pos + it->n_tokens > m->cfg.max_pos)
            return ds_fail(err, "sequence %d: %lld + %d tokens go beyond the model's max_position_embeddings (%lld)", i,
                           (long long)it->seq->pos, it->n_tokens, (long long)m->cfg.max_pos);
        if (it->seq->pos + it->n_tokens > it->seq->max_len)
            return ds_fail(err, "sequence %d: %lld + %d tokens exceed its capacity of %lld tokens (raise --ctx)", i,
                           (long long)it->seq->pos, it->n_tokens, (long long)it->seq->max_len);
        if (!it->h_in != !m->mtp_of)
            return ds_fail(err, "sequence %d: %s", i,
                           m->mtp_of ? "the MTP block needs the main model's streams (h_in)"
                                     : "h_in is for the MTP block only");
        if ((it->hidden || it->h_in) && m->ep)
            return ds_fail(err, "sequence %d: the streams (hidden, h_in) are not available under expert parallelism", i);
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
    /* data parallel: the MoE's inputs go straight into every rank's table */
    float *fxn = S->dp ? rs->g_xn + (size_t)S->dp->off * D : rs->xn, *tmp;
    ds_rmsnorm_params an = {rs->x_in, ly->attn_norm, rs->xn, T, D, c->rms_eps, NULL, 0};
    ds_rmsnorm_params fn = {rs->x_in, ly->ffn_norm, fxn, T, D, c->rms_eps, NULL, 0};
    if (T == 0) /* data parallel, no rows here: this rank still serves its experts */
        return ds_moe(S, li, NULL, NULL, err) ? ds_fail_prefix(err, "layer %d MoE", li) : 0;
    if (ds_mhc_pre(S, &ly->hc_attn, rs->X, rs->x_in, err) || ds_step_dump(S, "attn_in", li, rs->x_in, T, D, err) ||
        S->be->rmsnorm(S->be, &an, 1, err) || ds_step_dump(S, "attn_norm", li, rs->xn, T, D, err))
        return -1;
    if (ds_attention(S, li, rs->xn, rs->y, err)) return ds_fail_prefix(err, "layer %d attention", li);
    if (ds_step_dump(S, "attn_out", li, rs->y, T, D, err) || ds_mhc_post(S, rs->X, rs->y, rs->X2, err)) return -1;
    tmp = rs->X, rs->X = rs->X2, rs->X2 = tmp;
    if (ds_step_dump(S, "attn_res", li, rs->X, T, nD, err)) return -1;

    if (ds_mhc_pre(S, &ly->hc_ffn, rs->X, rs->x_in, err) || ds_step_dump(S, "ffn_in", li, rs->x_in, T, D, err) ||
        S->be->rmsnorm(S->be, &fn, 1, err) || ds_step_dump(S, "ffn_norm", li, fxn, T, D, err))
        return -1;
    if (ds_moe(S, li, fxn, rs->y, err)) return ds_fail_prefix(err, "layer %d MoE", li);
    if (ds_step_dump(S, "ffn_out", li, rs->y, T, D, err) || ds_mhc_post(S, rs->X, rs->y, rs->X2, err)) return -1;
    tmp = rs->X, rs->X = rs->X2, rs->X2 = tmp;
    return ds_step_dump(S, "ffn_res", li, rs->X, T, nD, err);
}

/* What the leader asked of item i: DS_EP_ITEM_* flags (want: a follower's,
 * from the leader; NULL: the item's own logits buffer). */
static int want_of(const ds_batch_item *items, const unsigned char *want, int i) {
    if (want) return want[i];
    return items[i].logits ? DS_EP_ITEM_LOGITS | (items[i].all_logits ? DS_EP_ITEM_ALL_LOGITS : 0) : 0;
}

static int head_rows(int want, int n_tokens) { return !want ? 0 : want & DS_EP_ITEM_ALL_LOGITS ? n_tokens : 1; }

/* The rows that want logits: streams → hc head → norm (into xn) of this
 * rank's items loc[0..n_loc); R rows. */
static int head_norm(const ds_step *S, const ds_batch_item *items, const unsigned char *want, const int *loc, int n_loc,
                     int R, float *xn, ds_err *err) {
    const ds_model *m = S->m;
    const ds_config *c = &m->cfg;
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int D = c->dim, r = 0;
    for (int s = 0; s < n_loc; s++) {
        int i = loc[s], rows = head_rows(want_of(items, want, i), items[i].n_tokens);
        for (int j = items[i].n_tokens - rows; j < items[i].n_tokens; j++) rs->hrow[r++] = rs->seq_row0[s] + j;
    }
    ds_gather_params g = {rs->X, rs->hrow, R, c->hc_mult * D, rs->X2};
    ds_rmsnorm_params fn = {rs->x_in, m->norm, xn, R, D, c->rms_eps, NULL, 0};
    if (be->gather(be, &g, err) || ds_mhc_head(S, rs->X2, R, rs->x_in, err) ||
        ds_step_dump(S, "head_in", -1, rs->x_in, R, D, err) || be->rmsnorm(be, &fn, 1, err) ||
        ds_step_dump(S, "final_norm", -1, xn, R, D, err))
        return ds_fail_prefix(err, "head");
    return 0;
}

/* The head's product over R normed rows, then each asking item's rows of
 * logits, in the order of `order` (n items). */
static int head_out(const ds_step *S, const ds_batch_item *items, const int *order, int n, const float *xn, int R,
                    ds_err *err) {
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int V = S->m->cfg.vocab_size;
    if (ds_matmul(be, &S->m->head, xn, R, rs->hlog, err) || ds_step_dump(S, "logits", -1, rs->hlog, R, V, err))
        return ds_fail_prefix(err, "head");
    for (int s = 0, r = 0; s < n; s++) {
        const ds_batch_item *it = &items[order[s]];
        int rows = head_rows(want_of(items, NULL, order[s]), it->n_tokens);
        if (rows && be->download(be, it->logits, rs->hlog + (size_t)r * V, (size_t)rows * V * sizeof(float), err))
            return -1;
        r += rows;
    }
    return 0;
}

static int forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                   const unsigned char *want, const ds_observer *obs, ds_err *err);

/* Under expert parallelism the leader sends the step to the followers
 * (ep/follow.h), and every rank runs it; a step that fails on any
 * rank after that ends the job (the others would wait for it forever). */
static int send_step(const ds_model *m, const ds_batch_item *items, int n_items, ds_err *err) {
    int T = 0, F = DS_EP_ITEM_FIELDS;
    for (int i = 0; i < n_items; i++) T += items[i].n_tokens;
    int64_t *it = malloc((size_t)n_items * F * sizeof *it);
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
        it[F * i] = items[i].seq->ep_id;
        it[F * i + 1] = items[i].seq->pos;
        it[F * i + 2] = items[i].n_tokens;
        it[F * i + 3] = want_of(items, NULL, i);
        for (int j = 0; j < items[i].n_tokens; j++) tok[r++] = items[i].tokens[j];
    }
    ds_ep_send_step(m->ep, n_items, it, tok, T);
    free(it), free(tok);
    return 0;
}

/* One step of at most m's step budget (every item's tokens together). */
static int one_step(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                    const ds_observer *obs, ds_err *err) {
    if (!m->ep) return forward(m, be, items, n_items, NULL, obs, err);
    if (obs && obs->tensor && ds_ep_dp(m->ep))
        return ds_fail(err, "intermediates of a step under expert parallelism with data-parallel attention live on "
                            "several ranks: dump them with --ep-attention replicated");
    if (ds_ep_rank(m->ep) == 0) {
        if (send_step(m, items, n_items, err)) return -1;
        for (int i = 0; i < n_items; i++) ds_ep_count_attention(m->ep, items[i].seq->ep_home, items[i].n_tokens);
    }
    if (forward(m, be, items, n_items, NULL, obs, err)) {
        char msg[1100];
        snprintf(msg, sizeof msg, "a step of %d sequences failed: %s", n_items, err->msg);
        ds_ep_session_fatal(msg);
    }
    return 0;
}

/* A call over the step budget, run as several steps: each takes the items'
 * next tokens in item order up to the budget; a piece's logits rows are the
 * item's rows from its first token on (one row: only with the last token).
 * The observer sees the caller's item and token numbers. */
typedef struct {
    const ds_observer *obs;
    const int *item, *tok0; /* per piece: the caller's item, its first token */
} split_obs;

static void split_route(void *ctx, int layer, int item, int tok, const int *experts, int k) {
    const split_obs *o = ctx;
    o->obs->route(o->obs->ctx, layer, o->item[item], o->tok0[item] + tok, experts, k);
}

static void split_index(void *ctx, int layer, int item, int tok, const int *entries, int n) {
    const split_obs *o = ctx;
    o->obs->index(o->obs->ctx, layer, o->item[item], o->tok0[item] + tok, entries, n);
}

static int split_steps(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                       const ds_observer *obs, int budget, ds_err *err) {
    if (obs && obs->tensor)
        return ds_fail(err, "intermediates of a call over %d tokens: dump them in steps of at most %d tokens", budget,
                       budget);
    ds_batch_item *piece = malloc((size_t)n_items * sizeof *piece);
    int *done = calloc((size_t)n_items, sizeof *done), *item = malloc((size_t)n_items * 2 * sizeof *item);
    if (!piece || !done || !item) {
        free(piece), free(done), free(item);
        return ds_fail(err, "out of memory for a call's steps");
    }
    int V = m->cfg.vocab_size, rc = 0, left = 1;
    split_obs so = {obs, item, item + n_items};
    ds_observer wrap = {obs && obs->route ? split_route : NULL, NULL, &so, obs && obs->index ? split_index : NULL};
    while (!rc && left) {
        int n = 0, room = budget;
        left = 0;
        for (int i = 0; i < n_items; i++) {
            const ds_batch_item *it = &items[i];
            int take = it->n_tokens - done[i] < room ? it->n_tokens - done[i] : room;
            if (take <= 0) {
                left |= done[i] < it->n_tokens;
                continue;
            }
            int last = done[i] + take == it->n_tokens;
            float *lg = !it->logits                 ? NULL
                        : it->all_logits            ? it->logits + (size_t)done[i] * (size_t)V
                        : last                      ? it->logits
                                                    : NULL;
            size_t nD = (size_t)m->cfg.hc_mult * (size_t)m->cfg.dim;
            piece[n] = (ds_batch_item){it->seq,
                                       it->tokens + done[i],
                                       take,
                                       lg,
                                       it->all_logits,
                                       it->hidden ? it->hidden + (size_t)done[i] * nD : NULL,
                                       it->h_in ? it->h_in + (size_t)done[i] * nD : NULL};
            item[n] = i, item[n_items + n] = done[i];
            n++, room -= take, done[i] += take;
            left |= !last;
        }
        rc = one_step(m, be, piece, n, obs ? &wrap : NULL, err);
    }
    free(piece), free(done), free(item);
    return rc;
}

int ds_forward_observed(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                        const ds_observer *obs, ds_err *err) {
    if (!m->be) return ds_fail(err, "%s: the model is not bound to a backend", m->path);
    if (n_items < 1) return ds_fail(err, "empty batch");
    if (check_items(m, items, n_items, err)) return -1;
    long long total = 0;
    int budget = m->step_tokens > 0 ? m->step_tokens : DS_STEP_TOKENS;
    for (int i = 0; i < n_items; i++) total += items[i].n_tokens;
    if (total > budget) return split_steps(m, be, items, n_items, obs, budget, err);
    return one_step(m, be, items, n_items, obs, err);
}

int ds_forward_follow(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                      const unsigned char *want, ds_err *err) {
    if (check_items(m, items, n_items, err)) return -1;
    return forward(m, be, items, n_items, want, NULL, err);
}

/* The MTP block's input streams (doc §3.7) into rs->X: every stream of token
 * t is e_proj(enorm(embed[tok])) + h_proj(hnorm(h_in[t][i])), the sum as
 * the hc_post op with post = 1 and comb = I (one rounding, y + X). */
static int mtp_input(const ds_step *S, const ds_batch_item *items, const int *mine, int n_loc, ds_err *err) {
    const ds_model *m = S->m, *o = m->mtp_of;
    const ds_mtp *t = o->mtp;
    const ds_config *c = &m->cfg;
    const ds_backend *be = S->be;
    ds_runstate *rs = S->rs;
    int T = S->T, n = c->hc_mult, D = c->dim;
    size_t nD = (size_t)n * (size_t)D;
    int *rows = malloc((size_t)T * sizeof *rows);
    float *one = malloc((size_t)T * (size_t)n * (1 + (size_t)n) * sizeof *one);
    if (!rows || !one) {
        free(rows), free(one);
        return ds_fail(err, "out of memory for the MTP block's input");
    }
    float *eye = one + (size_t)T * n;
    for (int r = 0; r < T; r++) {
        rows[r] = r * n;
        for (int i = 0; i < n; i++) {
            one[(size_t)r * n + i] = 1.0f;
            for (int j = 0; j < n; j++) eye[((size_t)r * n + i) * n + j] = i == j ? 1.0f : 0.0f;
        }
    }
    ds_embed_params ep = {&m->embed, n, rs->X};
    ds_gather_params g = {rs->X, rows, T, D, rs->x_in};
    ds_rmsnorm_params en = {rs->x_in, t->enorm, rs->xn, T, D, c->rms_eps, NULL, 0};
    ds_rmsnorm_params hn = {rs->X2, t->hnorm, rs->X, T * n, D, c->rms_eps, NULL, 0};
    ds_hc_post_params add = {n, D, T, rs->X2, rs->y, rs->post, rs->comb, rs->X};
    int rc = be->embed(be, &ep, err) || be->gather(be, &g, err) || be->rmsnorm(be, &en, 1, err) ||
             ds_matmul(be, &t->e_proj, rs->xn, T, rs->y, err);
    for (int s = 0, r = 0; !rc && s < n_loc; s++) {
        const ds_batch_item *it = &items[mine[s]];
        rc = be->upload(be, rs->X2 + (size_t)r * nD, it->h_in, (size_t)it->n_tokens * nD * sizeof(float), err);
        r += it->n_tokens;
    }
    rc = rc || be->rmsnorm(be, &hn, 1, err) || ds_matmul(be, &t->h_proj, rs->X, T * n, rs->X2, err) ||
         be->upload(be, rs->post, one, (size_t)T * n * sizeof(float), err) ||
         be->upload(be, rs->comb, eye, (size_t)T * n * n * sizeof(float), err) || be->hc_post(be, &add, err);
    free(rows), free(one);
    return rc ? ds_fail_prefix(err, "MTP block input") : 0;
}

/* The step on this rank: every item, or with data-parallel attention the
 * items whose home is this rank (rows rank after rank, see ds_step_dp). */
static int forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                   const unsigned char *want, const ds_observer *obs, ds_err *err) {
    const ds_config *c = &m->cfg;
    ds_runstate *rs = m->rs;
    int dp = m->ep && ds_ep_dp(m->ep), me = dp ? ds_ep_rank(m->ep) : 0, ranks = dp ? ds_ep_size(m->ep) : 1;
    ds_step_size z = {0, 0, n_items, 0, 0, 0};
    int off = 0, roff = 0;
    if (!dp) want = NULL; /* replicated: the leader alone runs the head */
    for (int i = 0; i < n_items; i++) {
        int home = dp ? items[i].seq->ep_home : me, rows = head_rows(want_of(items, want, i), items[i].n_tokens);
        if (home < 0 || home >= ranks)
            return ds_fail(err, "sequence %d: home rank %d, not one of the %d ranks", i, home, ranks);
        z.Tg += items[i].n_tokens, z.Rg += rows;
        if (home == me) z.T += items[i].n_tokens, z.R += rows;
        if (home < me) off += items[i].n_tokens, roff += rows;
    }
    z.Rh = !dp ? z.R : me == 0 ? z.Rg : 0;
    if (!dp) z.Rg = 0; /* no head rows cross ranks */
    if (ds_runstate_reserve(rs, c, &z, err)) return -1;
    int T = z.T, R = z.R, n_loc = 0, *mine = rs->loc;
    for (int i = 0; i < n_items; i++)
        if (!dp || items[i].seq->ep_home == me) mine[n_loc++] = i;
    for (int s = 0, r = 0; s < n_loc; s++) {
        const ds_batch_item *it = &items[mine[s]];
        rs->seq_row0[s] = r;
        rs->seq_n[s] = it->n_tokens;
        rs->seq_pos0[s] = it->seq->pos;
        rs->seq_mem[s] = it->seq->layers;
        for (int j = 0; j < it->n_tokens; j++, r++) {
            rs->tok_seq[r] = s;
            rs->tok_pos[r] = it->seq->pos + j;
            rs->tok_id[r] = it->tokens[j];
        }
    }
    ds_step_dp D = {z.Tg, off, rs->g_owner, rs->g_item, rs->g_tok};
    if (dp) /* every rank's rows, rank after rank; then the head rows likewise */
        for (int q = 0, t = 0, h = z.Tg; q < ranks; q++)
            for (int i = 0; i < n_items; i++) {
                if (items[i].seq->ep_home != q) continue;
                for (int j = 0; j < items[i].n_tokens; j++, t++)
                    rs->g_owner[t] = q, rs->g_item[t] = i, rs->g_tok[t] = j;
                for (int j = head_rows(want_of(items, want, i), items[i].n_tokens); j > 0; j--) rs->g_owner[h++] = q;
            }
    ds_step_desc desc = {T,           n_loc,        c->n_layers, rs->tok_id,   rs->tok_pos,
                         rs->tok_seq, rs->seq_row0, rs->seq_n,   rs->seq_pos0, rs->seq_mem};
    ds_step S = {m, be, obs, rs, T, n_loc, dp ? &D : NULL};
    ds_embed_params ep = {&m->embed, c->hc_mult, rs->X};
    if (T > 0 && (be->begin_step(be, &desc, err) ||
                  (m->mtp_of ? mtp_input(&S, items, mine, n_loc, err) : be->embed(be, &ep, err)) ||
                  ds_step_dump(&S, "embed", -1, rs->X, T, c->hc_mult * c->dim, err)))
        return -1;
    for (int li = 0; li < c->n_layers; li++)
        if (layer(&S, li, err)) return -1;
    size_t nD = (size_t)c->hc_mult * (size_t)c->dim;
    for (int s = 0; !dp && s < n_loc; s++) { /* the streams before the head */
        const ds_batch_item *it = &items[mine[s]];
        if (it->hidden && be->download(be, it->hidden, rs->X + (size_t)rs->seq_row0[s] * nD,
                                       (size_t)it->n_tokens * nD * sizeof(float), err))
            return -1;
    }
    if (!dp) {
        if (R && (head_norm(&S, items, want, mine, n_loc, R, rs->xn, err) ||
                  head_out(&S, items, mine, n_loc, rs->xn, R, err)))
            return -1;
    } else if (z.Rg) { /* every rank's normed rows to rank 0, which runs the head for all */
        float *hx = rs->g_head + (size_t)roff * c->dim;
        for (int r = 0; r < z.Rg; r++) rs->g_dest[r] = 0; /* Rg <= Tg: the pairs' table has room */
        if ((R && head_norm(&S, items, want, mine, n_loc, R, hx, err)) ||
            ds_step_exchange(&S, 1, &rs->g_head, &c->dim, z.Rg, rs->g_owner + z.Tg, rs->g_dest, err))
            return -1;
        if (me == 0) {
            int *order = rs->loc, n = 0;
            for (int q = 0; q < ranks; q++)
                for (int i = 0; i < n_items; i++)
                    if (items[i].seq->ep_home == q) order[n++] = i;
            if (head_out(&S, items, order, n, rs->g_head, z.Rg, err)) return -1;
        }
    }
    if (!dp && T > 0 && obs && obs->route && ds_moe_observe(&S, err)) return -1;
    for (int i = 0; i < n_items; i++) items[i].seq->pos += items[i].n_tokens;
    return 0;
}
