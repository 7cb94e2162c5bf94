/* compressor.c — see compressor.h. */
#include "model/compressor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/norm.h"
#include "model/rope.h"

int ds_comp_state_init(ds_comp_state *s, const ds_compressor_w *w, int64_t max_len) {
    memset(s, 0, sizeof *s);
    int cd = (w->overlap ? 2 : 1) * w->d;
    s->cap = (int)(max_len / w->ratio) + 1;
    s->entries = malloc((size_t)s->cap * (size_t)w->d * sizeof(float));
    s->pend_kv = malloc((size_t)w->ratio * (size_t)cd * sizeof(float));
    s->pend_gate = malloc((size_t)w->ratio * (size_t)cd * sizeof(float));
    s->slots = malloc(4 * (size_t)w->ratio * sizeof(float));
    if (w->overlap) {
        s->prev_kv = malloc((size_t)w->ratio * (size_t)w->d * sizeof(float));
        s->prev_gate = malloc((size_t)w->ratio * (size_t)w->d * sizeof(float));
    }
    if (!s->entries || !s->pend_kv || !s->pend_gate || !s->slots || (w->overlap && (!s->prev_kv || !s->prev_gate))) {
        ds_comp_state_free(s);
        return -1;
    }
    return 0;
}

void ds_comp_state_free(ds_comp_state *s) {
    free(s->entries);
    free(s->pend_kv);
    free(s->pend_gate);
    free(s->prev_kv);
    free(s->prev_gate);
    free(s->slots);
    memset(s, 0, sizeof *s);
}

void ds_comp_state_reset(ds_comp_state *s) {
    s->n_entries = 0;
    s->has_prev = 0;
}

int ds_comp_push(const ds_compressor_w *w, ds_comp_state *s, const float *kv, const float *gate, int64_t pos,
                 const float *inv_freq, int rope_half, float eps) {
    int d = w->d, R = w->ratio, cd = (w->overlap ? 2 : 1) * d;
    int slot = (int)(pos % R);
    const float *ape = w->ape + (size_t)slot * (size_t)cd;
    float *pk = s->pend_kv + (size_t)slot * (size_t)cd, *pg = s->pend_gate + (size_t)slot * (size_t)cd;
    for (int c = 0; c < cd; c++) {
        pk[c] = kv[c];
        pg[c] = gate[c] + ape[c];
    }
    if (slot != R - 1) return 0;
    if (s->n_entries >= s->cap) return -1;

    float *e = s->entries + (size_t)s->n_entries * (size_t)d;
    int off = w->overlap ? d : 0; /* series B (overlap) or the only series */
    /* per channel, softmax over the slots (the previous window's series A
     * first, then this window), then the weighted sum of the kv slots */
    int np = w->overlap && s->has_prev ? R : 0, ns = np + R;
    float *g = s->slots, *v = s->slots + ns;
    for (int c = 0; c < d; c++) {
        for (int j = 0; j < np; j++) {
            g[j] = s->prev_gate[(size_t)j * d + c];
            v[j] = s->prev_kv[(size_t)j * d + c];
        }
        for (int j = 0; j < R; j++) {
            g[np + j] = s->pend_gate[(size_t)j * cd + off + c];
            v[np + j] = s->pend_kv[(size_t)j * cd + off + c];
        }
        float m = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (int j = 0; j < ns; j++) m = fmaxf(m, g[j]);
        for (int j = 0; j < ns; j++) sum += (g[j] = expf(g[j] - m));
        for (int j = 0; j < ns; j++) acc += v[j] * (g[j] / sum);
        e[c] = acc;
    }
    ds_rmsnorm(e, e, w->norm, d, eps);
    ds_rope_apply(e, d, inv_freq, rope_half, pos - (R - 1), 0);
    s->n_entries++;
    if (w->overlap) { /* keep this window's series A for the next entry */
        for (int j = 0; j < R; j++) {
            memcpy(s->prev_kv + (size_t)j * d, s->pend_kv + (size_t)j * cd, (size_t)d * sizeof(float));
            memcpy(s->prev_gate + (size_t)j * d, s->pend_gate + (size_t)j * cd, (size_t)d * sizeof(float));
        }
        s->has_prev = 1;
    }
    return 0;
}
