/* picks.c — expert and indexer picks against a fixture's reference (picks.h) */
#include "picks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static void on_route(void *ctx, int layer, int item, int tok, const int *ex, int k) {
    picks *p = ctx;
    memcpy(p->route[item] + ((size_t)layer * p->len[item] + tok) * p->k, ex, sizeof(int32_t) * (size_t)k);
}

static void on_index(void *ctx, int layer, int item, int tok, const int *e, int n) {
    picks *p = ctx;
    int32_t *row = p->index[item] + ((size_t)layer * p->len[item] + tok) * p->topk;
    for (int j = 0; j < p->topk; j++) row[j] = j < n ? e[j] : -1;
}

ds_observer picks_init(picks *p, const ds_model *m, int n, const int *len) {
    memset(p, 0, sizeof *p);
    p->L = m->cfg.n_layers, p->k = m->cfg.n_active_experts, p->topk = m->cfg.index_topk;
    for (int i = 0; i < n; i++) {
        p->len[i] = len[i];
        p->route[i] = calloc((size_t)p->L * len[i] * p->k, sizeof(int32_t));
        p->index[i] = calloc((size_t)p->L * len[i] * p->topk, sizeof(int32_t));
    }
    return (ds_observer){on_route, NULL, p, on_index};
}

void picks_free(picks *p, int n) {
    for (int i = 0; i < n; i++) free(p->route[i]), free(p->index[i]);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* absent margins: the generator re-drew the tokens until every margin was
 * >= PICKS_MARGIN, and hash layers have no choice */
int picks_check(const char *name, const ds_checkpoint *ck, const picks *p, int i, int T, int *lowm, int *ncmp) {
    int bad = 0;
    for (int L = 0; L < p->L; L++)
        for (int kind = 0; kind < 2; kind++) {
            char a[64], b[64];
            snprintf(a, sizeof a, kind ? "index.%d.%d" : "route.%d.%d", i, L);
            snprintf(b, sizeof b, kind ? "index_margin.%d.%d" : "route_margin.%d.%d", i, L);
            const ds_tensor *r = ds_checkpoint_find(ck, a), *mg = ds_checkpoint_find(ck, b);
            if (!r) continue;
            int w = (int)r->shape[1], stride = kind ? p->topk : p->k;
            if (stride > 256 || w > stride) {
                printf("%s seq %d layer %d: %s of %d picks (the reference's %d): more than this check holds\n", name, i,
                       L, a, stride, w);
                bad++;
                continue;
            }
            const int32_t *ref = (const int32_t *)(const void *)r->data;
            const float *mar = mg ? (const float *)(const void *)mg->data : NULL;
            for (int t = 0; t < T; t++, (*ncmp)++) {
                int32_t got[256];
                memcpy(got, (kind ? p->index[i] : p->route[i]) + ((size_t)L * T + t) * stride,
                       sizeof(int32_t) * (size_t)stride);
                if (!kind) qsort(got, (size_t)stride, sizeof(int32_t), cmp_i32);
                if (!memcmp(got, ref + (size_t)t * w, sizeof(int32_t) * (size_t)w)) continue;
                double m = mar ? (double)mar[t] : HUGE_VAL;
                if (m > PICKS_MARGIN) {
                    if (bad++ < 5)
                        printf("%s seq %d layer %d token %d: %s differ from the reference (margin %.3g)\n", name, i, L,
                               t, kind ? "indexer picks" : "experts", m);
                } else {
                    (*lowm)++;
                }
            }
        }
    return bad;
}
