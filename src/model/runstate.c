/* runstate.c — see runstate.h. */
#include "model/runstate.h"

#include <stdlib.h>
#include <string.h>

/* Lays out the step's buffers from base (NULL: only counts); returns bytes. */
static size_t carve(ds_runstate *rs, const ds_config *c, char *base, const ds_step_size *z) {
    size_t off = 0, t = (size_t)z->T, tg = (size_t)z->Tg, k = (size_t)c->n_active_experts;
    int n = c->hc_mult, D = c->dim, cd = 2 * (c->head_dim > c->index_head_dim ? c->head_dim : c->index_head_dim);
#define TAKE(field, type, count)                                              \
    do {                                                                      \
        rs->field = base ? (type *)(base + off) : NULL;                       \
        off += ((size_t)(count) * sizeof(type) + 63) / 64 * 64;               \
    } while (0)
    TAKE(X, float, t * n * D);
    TAKE(X2, float, t * n * D);
    TAKE(x_in, float, t * D);
    TAKE(xn, float, t * D);
    TAKE(y, float, t * D);
    TAKE(post, float, t * n);
    TAKE(comb, float, t * n * n);
    TAKE(qr, float, t * c->q_lora_rank);
    TAKE(q, float, t * c->n_heads * c->head_dim);
    TAKE(kv, float, t * c->head_dim);
    TAKE(o, float, t * c->n_heads * c->head_dim);
    TAKE(oa, float, t * c->o_groups * c->o_lora_rank);
    TAKE(ckv, float, t * cd);
    TAKE(cgate, float, t * cd);
    TAKE(iq, float, t * c->index_n_heads * c->index_head_dim);
    TAKE(iw, float, t * c->index_n_heads);
    TAKE(sel, int, t * c->index_topk);
    TAKE(n_sel, int, t);
    TAKE(logits, float, t * c->n_routed_experts);
    TAKE(wts, float, t * c->n_active_experts);
    TAKE(idx, int32_t, (size_t)c->n_layers * t * k);
    TAKE(hlog, float, (size_t)z->Rh * c->vocab_size);
    if (rs->ep) {
        TAKE(slot_out, float, tg * k * D);
        TAKE(shared_out, float, t * D);
        TAKE(g_xn, float, tg * D);
        TAKE(g_wts, float, tg * k);
        TAKE(g_idx, int32_t, tg * k);
        TAKE(g_head, float, (size_t)z->Rg * D);
    }
#undef TAKE
    return off;
}

static int host_table(ds_runstate *rs, const ds_config *c, const ds_step_size *z, ds_err *err) {
    size_t t = (size_t)z->T, s = (size_t)z->n_seqs, tg = (size_t)z->Tg, rg = (size_t)z->Rg;
    size_t need = t * (sizeof(int32_t) + sizeof(int64_t) + sizeof(int)) +
                  (size_t)c->n_layers * tg * c->n_active_experts * sizeof(int32_t) +
                  s * (sizeof(int64_t) + 3 * sizeof(int) + sizeof(void *)) + (size_t)z->R * sizeof(int) +
                  (3 * tg + rg + tg * c->n_active_experts) * sizeof(int) + 64;
    if (need > rs->host_cap) {
        free(rs->host);
        rs->host = malloc(need);
        rs->host_cap = rs->host ? need : 0;
        if (!rs->host) return ds_fail(err, "out of memory for the token table of a step of %d tokens", z->Tg);
    }
    char *p = rs->host; /* 8-byte members first */
    rs->tok_pos = (int64_t *)p, p += t * sizeof(int64_t);
    rs->seq_pos0 = (int64_t *)p, p += s * sizeof(int64_t);
    rs->seq_mem = (const struct ds_layer_mem **)p, p += s * sizeof(void *);
    rs->tok_id = (int32_t *)p, p += t * sizeof(int32_t);
    rs->idx_host = (int32_t *)p, p += (size_t)c->n_layers * tg * c->n_active_experts * sizeof(int32_t);
    rs->tok_seq = (int *)p, p += t * sizeof(int);
    rs->seq_row0 = (int *)p, p += s * sizeof(int);
    rs->seq_n = (int *)p, p += s * sizeof(int);
    rs->loc = (int *)p, p += s * sizeof(int);
    rs->g_owner = (int *)p, p += (tg + rg) * sizeof(int);
    rs->g_item = (int *)p, p += tg * sizeof(int);
    rs->g_tok = (int *)p, p += tg * sizeof(int);
    rs->g_dest = (int *)p, p += tg * c->n_active_experts * sizeof(int);
    rs->hrow = (int *)p;
    return 0;
}

static int t_rows_host(ds_runstate *rs, const ds_config *c, const ds_step_size *z, ds_err *err) {
    size_t rows = (size_t)z->Tg * (c->n_active_experts > 1 ? c->n_active_experts : 1);
    if ((size_t)z->Rg > rows) rows = (size_t)z->Rg;
    size_t need = rows * c->dim;
    if (need <= rs->ep_rows_cap) return 0;
    free(rs->ep_rows);
    rs->ep_rows = malloc(need * sizeof(float));
    rs->ep_rows_cap = rs->ep_rows ? need : 0;
    return rs->ep_rows ? 0 : ds_fail(err, "out of memory for the expert exchange of a step of %d tokens", z->Tg);
}

int ds_runstate_reserve(ds_runstate *rs, const ds_config *c, const ds_step_size *z, ds_err *err) {
    if (host_table(rs, c, z, err)) return -1;
    size_t need = carve(rs, c, NULL, z);
    if (need > rs->cap) {
        if (rs->arena) rs->be->free(rs->be, rs->arena);
        rs->cap = 0;
        rs->arena = rs->be->alloc(rs->be, need, err);
        if (!rs->arena)
            return ds_fail_prefix(err, "activations of a step of %d tokens (%.1f MiB)", z->Tg,
                                  (double)need / (1 << 20));
        rs->cap = need;
    }
    carve(rs, c, rs->arena, z);
    if (rs->ep && t_rows_host(rs, c, z, err)) return -1;
    rs->T = z->T;
    rs->R = z->R;
    rs->Tg = z->Tg;
    rs->Rg = z->Rg;
    return 0;
}

uint64_t ds_runstate_bytes(const ds_config *c, int T) {
    ds_runstate rs = {0};
    ds_step_size z = {T, T, 1, T, 0, T};
    return carve(&rs, c, NULL, &z);
}

void ds_runstate_free(ds_runstate *rs) {
    if (rs->arena) rs->be->free(rs->be, rs->arena);
    free(rs->host);
    free(rs->ep_rows);
    memset(rs, 0, sizeof *rs);
}
