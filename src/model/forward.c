/* forward.c — one step of the V4 network (doc §3): embedding into n streams,
 * per layer mHC → attention → mHC → MoE, then the hc head, norm and head. */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "model/mhc.h"
#include "model/norm.h"
#include "model/step.h"

static int check_items(const ds_model *m, const ds_batch_item *items, int n, ds_err *err) {
    for (int i = 0; i < n; i++) {
        const ds_batch_item *it = &items[i];
        if (!it->seq || it->n_tokens < 1 || !it->tokens)
            return ds_fail(err, "batch item %d: needs a sequence and at least one token", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) return ds_fail(err, "batch items %d and %d share one sequence", j, i);
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

int ds_forward(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items, ds_err *err) {
    return ds_forward_observed(m, be, items, n_items, NULL, err);
}

int ds_forward_observed(const ds_model *m, const ds_backend *be, const ds_batch_item *items, int n_items,
                        const ds_observer *obs, ds_err *err) {
    if (n_items < 1) return ds_fail(err, "empty batch");
    if (check_items(m, items, n_items, err)) return -1;
    const ds_config *c = &m->cfg;
    int n = c->hc_mult, D = c->dim, V = c->vocab_size, T = 0, R = 0;
    for (int i = 0; i < n_items; i++) {
        T += items[i].n_tokens;
        if (items[i].logits) R += items[i].all_logits ? items[i].n_tokens : 1;
    }
    size_t nd = (size_t)n * D;
    ds_step S = {m, be, obs, T, n_items, NULL, NULL, NULL, NULL, NULL, NULL};
    S.seqs = malloc((size_t)n_items * sizeof *S.seqs);
    S.seq_row0 = malloc((size_t)n_items * sizeof *S.seq_row0);
    S.seq_n = malloc((size_t)n_items * sizeof *S.seq_n);
    S.tok_seq = malloc((size_t)T * sizeof *S.tok_seq);
    S.tok_pos = malloc((size_t)T * sizeof *S.tok_pos);
    S.tok_id = malloc((size_t)T * sizeof *S.tok_id);
    float *X = malloc((size_t)T * nd * sizeof *X), *X2 = malloc((size_t)T * nd * sizeof *X2);
    float *x_in = malloc((size_t)T * D * sizeof *x_in), *xn = malloc((size_t)T * D * sizeof *xn);
    float *y = malloc((size_t)T * D * sizeof *y), *post = malloc((size_t)T * n * sizeof *post);
    float *comb = malloc((size_t)T * n * n * sizeof *comb);
    float *scratch = malloc((size_t)T * (nd + (size_t)(2 + n) * n) * sizeof *scratch);
    int *hrow = malloc((size_t)(R ? R : 1) * sizeof *hrow);
    float *hx = malloc((size_t)(R ? R : 1) * nd * sizeof *hx), *hlog = malloc((size_t)(R ? R : 1) * V * sizeof *hlog);
    int rc = -1;
    if (!S.seqs || !S.seq_row0 || !S.seq_n || !S.tok_seq || !S.tok_pos || !S.tok_id || !X || !X2 || !x_in || !xn ||
        !y || !post || !comb || !scratch || !hrow || !hx || !hlog) {
        ds_fail(err, "out of memory for a step of %d tokens", T);
        goto done;
    }
    for (int i = 0, r = 0; i < n_items; i++) {
        S.seqs[i] = items[i].seq;
        S.seq_row0[i] = r;
        S.seq_n[i] = items[i].n_tokens;
        for (int j = 0; j < items[i].n_tokens; j++, r++) {
            S.tok_seq[r] = i;
            S.tok_pos[r] = items[i].seq->pos + j;
            S.tok_id[r] = items[i].tokens[j];
        }
    }
    /* every stream starts as the token's embedding */
    for (int t = 0; t < T; t++) {
        float *Xt = X + (size_t)t * nd;
        ds_weight_row_f32(&m->embed, S.tok_id[t], Xt);
        for (int i = 1; i < n; i++) memcpy(Xt + (size_t)i * D, Xt, (size_t)D * sizeof *Xt);
    }
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        float *tmp;
        if (ds_mhc_pre(be, c, &ly->hc_attn, X, T, x_in, post, comb, scratch)) goto backend_oom;
        ds_rmsnorm_rows(be, xn, x_in, ly->attn_norm, T, D, c->rms_eps);
        if (ds_attention(&S, li, xn, y, err)) goto done;
        ds_mhc_post(be, c, X, y, post, comb, T, X2);
        tmp = X, X = X2, X2 = tmp;

        if (ds_mhc_pre(be, c, &ly->hc_ffn, X, T, x_in, post, comb, scratch)) goto backend_oom;
        ds_rmsnorm_rows(be, xn, x_in, ly->ffn_norm, T, D, c->rms_eps);
        if (ds_moe(&S, li, xn, y, err)) goto done;
        ds_mhc_post(be, c, X, y, post, comb, T, X2);
        tmp = X, X = X2, X2 = tmp;
    }
    if (R) {
        int r = 0;
        for (int i = 0; i < n_items; i++) {
            if (!items[i].logits) continue;
            int first = items[i].all_logits ? 0 : items[i].n_tokens - 1;
            for (int j = first; j < items[i].n_tokens; j++) hrow[r++] = S.seq_row0[i] + j;
        }
        for (int j = 0; j < R; j++) memcpy(hx + (size_t)j * nd, X + (size_t)hrow[j] * nd, nd * sizeof *hx);
        if (ds_mhc_head(be, c, &m->hc_head, hx, R, x_in, scratch)) goto backend_oom;
        ds_rmsnorm_rows(be, xn, x_in, m->norm, R, D, c->rms_eps);
        if (be->matmul(be, &m->head, xn, R, hlog)) goto backend_oom;
        r = 0;
        for (int i = 0; i < n_items; i++) {
            if (!items[i].logits) continue;
            int rows = items[i].all_logits ? items[i].n_tokens : 1;
            memcpy(items[i].logits, hlog + (size_t)r * V, (size_t)rows * V * sizeof *hlog);
            r += rows;
        }
    }
    for (int i = 0; i < n_items; i++) items[i].seq->pos += items[i].n_tokens;
    rc = 0;
    goto done;
backend_oom:
    ds_fail(err, "out of memory in the %s backend for a step of %d tokens", be->name, T);
done:
    free(S.seqs);
    free(S.seq_row0);
    free(S.seq_n);
    free(S.tok_seq);
    free(S.tok_pos);
    free(S.tok_id);
    free(X);
    free(X2);
    free(x_in);
    free(xn);
    free(y);
    free(post);
    free(comb);
    free(scratch);
    free(hrow);
    free(hx);
    free(hlog);
    return rc;
}
