/* batch.c — see batch.h. */
#include "runtime/batch.h"

#include <stdlib.h>

int ds_run_tokens(const ds_model *m, const ds_backend *be, ds_seq **seqs, const int32_t *const *tokens, const int *n,
                  int n_seqs, int chunk, float **logits, ds_err *err) {
    return ds_run_tokens_observed(m, be, seqs, tokens, n, n_seqs, chunk, logits, NULL, err);
}

int ds_run_tokens_observed(const ds_model *m, const ds_backend *be, ds_seq **seqs, const int32_t *const *tokens,
                           const int *n, int n_seqs, int chunk, float **logits, const ds_observer *obs, ds_err *err) {
    ds_batch_item *items = calloc((size_t)(n_seqs ? n_seqs : 1), sizeof *items);
    int *done = calloc((size_t)(n_seqs ? n_seqs : 1), sizeof *done);
    if (!items || !done) {
        free(items);
        free(done);
        return ds_fail(err, "out of memory");
    }
    int rc = 0;
    for (;;) {
        int k = 0, budget = DS_RUN_STEP_TOKENS;
        for (int i = 0; i < n_seqs && budget > 0; i++) {
            int left = n[i] - done[i];
            if (left <= 0) continue;
            int take = chunk > 0 && chunk < left ? chunk : left;
            if (take > budget) take = budget;
            budget -= take;
            items[k].seq = seqs[i];
            items[k].tokens = tokens[i] + done[i];
            items[k].n_tokens = take;
            items[k].logits = logits && logits[i] ? logits[i] + (size_t)done[i] * (size_t)m->cfg.vocab_size : NULL;
            items[k].all_logits = 1;
            done[i] += take;
            k++;
        }
        if (!k) break;
        if ((rc = ds_forward_observed(m, be, items, k, obs, err))) break;
    }
    free(items);
    free(done);
    return rc;
}
