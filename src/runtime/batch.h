/* batch.h — running several sequences together: each step advances every
 * unfinished sequence by up to `chunk` tokens in one forward pass. */
#ifndef DS_BATCH_H
#define DS_BATCH_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/forward.h"

/* The most tokens one step of ds_run_tokens carries, all sequences together:
 * it bounds a step's activation memory and keeps tokens x experts per token
 * inside the CUDA grids (65,535). Where a step ends changes no bits (docs/design.md
 * §1: chunking and batching never do). */
#define DS_RUN_STEP_TOKENS DS_STEP_TOKENS

/* Feeds tokens[i][0..n[i]) to seqs[i] for every i, `chunk` tokens per
 * sequence per step (chunk <= 0: as many as fit) and at most
 * DS_RUN_STEP_TOKENS per step, sequences in order. If logits[i] is non-NULL
 * it receives one row of vocab floats per token. */
int ds_run_tokens(const ds_model *m, const ds_backend *be, ds_seq **seqs, const int32_t *const *tokens, const int *n,
                  int n_seqs, int chunk, float **logits, ds_err *err);
/* The same, reporting each step to obs (may be NULL). */
int ds_run_tokens_observed(const ds_model *m, const ds_backend *be, ds_seq **seqs, const int32_t *const *tokens,
                           const int *n, int n_seqs, int chunk, float **logits, const ds_observer *obs, ds_err *err);

#endif
