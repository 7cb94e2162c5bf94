/* picks.h — dsv4's routed experts and indexer picks of every token and layer,
 * recorded by a forward observer, against a fixture's reference
 * (tools/gen_fixtures.py: route.i.L / index.i.L with their decision margins
 * route_margin.i.L / index_margin.i.L). Shared by the oracle tests. */
#ifndef DS_TEST_PICKS_H
#define DS_TEST_PICKS_H

#include <stdint.h>

#include "format/safetensors.h"
#include "model/forward.h"

/* A pick counts only where the reference's margin (the last chosen over the
 * first not chosen, relative) exceeds this: below it, fp32 rounding may
 * decide either way. */
#define PICKS_MARGIN 1e-4

/* per sequence [L][T][k] (index: [L][T][topk], -1 past the picks) */
typedef struct {
    int L, k, topk, len[8];
    int32_t *route[8], *index[8];
} picks;

/* Allocates the arrays of n sequences of len[i] tokens for model m; returns
 * an observer that records into p (ds_forward item i = sequence i). */
ds_observer picks_init(picks *p, const ds_model *m, int n, const int *len);
void picks_free(picks *p, int n);
/* Sequence i's picks against the reference in ck; returns the differences
 * where the margin exceeds PICKS_MARGIN (the first 5 printed); *lowm counts
 * those below it, *ncmp the choices compared. */
int picks_check(const char *name, const ds_checkpoint *ck, const picks *p, int i, int T, int *lowm, int *ncmp);

#endif
