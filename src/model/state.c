/* state.c — see state.h. */
#include "model/state.h"

#include <stdlib.h>

int ds_seq_new(const ds_model *m, int64_t max_len, ds_seq **out, ds_err *err) {
    *out = NULL;
    if (max_len < 1) return ds_fail(err, "sequence capacity must be positive (got %lld)", (long long)max_len);
    ds_seq *s = calloc(1, sizeof *s);
    if (!s) return ds_fail(err, "out of memory for a sequence");
    s->max_len = max_len;
    s->n_layers = m->cfg.n_layers;
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    if (!s->layers) {
        free(s);
        return ds_fail(err, "out of memory for a sequence");
    }
    for (int li = 0; li < s->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        ds_layer_state *st = &s->layers[li];
        st->ring = malloc((size_t)m->cfg.window * (size_t)m->cfg.head_dim * sizeof(float));
        int bad = !st->ring;
        if (!bad && ly->ratio) bad = ds_comp_state_init(&st->comp, &ly->comp, max_len) != 0;
        if (!bad && ly->is_csa) bad = ds_comp_state_init(&st->icomp, &ly->idx.comp, max_len) != 0;
        if (bad) {
            ds_seq_free(s);
            return ds_fail(err, "out of memory for the state of a sequence of %lld tokens (%.1f MiB)",
                           (long long)max_len, (double)ds_seq_bytes(m, max_len) / (1 << 20));
        }
    }
    *out = s;
    return 0;
}

void ds_seq_free(ds_seq *s) {
    if (!s) return;
    for (int li = 0; li < s->n_layers; li++) {
        free(s->layers[li].ring);
        ds_comp_state_free(&s->layers[li].comp);
        ds_comp_state_free(&s->layers[li].icomp);
    }
    free(s->layers);
    free(s);
}

void ds_seq_reset(ds_seq *s) {
    s->pos = 0;
    for (int li = 0; li < s->n_layers; li++) {
        ds_comp_state_reset(&s->layers[li].comp);
        ds_comp_state_reset(&s->layers[li].icomp);
    }
}

uint64_t ds_seq_bytes(const ds_model *m, int64_t max_len) {
    const ds_config *c = &m->cfg;
    uint64_t b = 0;
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        b += (uint64_t)c->window * (uint64_t)c->head_dim * 4;
        if (ly->ratio) b += (uint64_t)(max_len / ly->ratio + 1) * (uint64_t)c->head_dim * 4;
        if (ly->is_csa) b += (uint64_t)(max_len / ly->ratio + 1) * (uint64_t)c->index_head_dim * 4;
    }
    return b;
}
