/* commands.h — one function per `dsv4 <command>`, each in cmd_<name>.c.
 * Each returns the process exit status (0 ok, 1 runtime error, 2 usage). */
#ifndef DS_COMMANDS_H
#define DS_COMMANDS_H

#include <stdint.h>

int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* dsv4 bench --grammar: the token mask's cost (cmd_bench_grammar.c). */
int cmd_bench_grammar(int argc, char **argv);
/* `dsv4 bench --backend cuda ...` (cmd_bench_device.c) */
#include "runtime/backend_select.h"
int cmd_bench_device(const char *dir, const ds_backend_opts *bo, long long prompt, long long gen, const int32_t *batches,
                     int n_batches, int batch_profile, int mtp);
/* Shared by the two bench paths (cmd_bench.c): one line of where the time
 * went per weight kind, attention and the rest; and a batched decode of B
 * sequences (each prefilled with prompt/4 tokens of toks), gen steps timed
 * into *seconds, obs and after_step(ctx) applied to every decode step; with
 * prof, be's profile is on during the decode steps (not the prefill). */
struct ds_profile;
struct ds_model;
struct ds_backend;
struct ds_observer;
void bench_print_profile(const char *title, const struct ds_profile *p, double steps, double step_s);
int bench_batch_decode(const struct ds_model *m, struct ds_backend *be, int B, long long prompt, long long gen,
                       const int32_t *toks, const struct ds_observer *obs, void (*after_step)(void *ctx), void *ctx,
                       struct ds_profile *prof, double *seconds, ds_err *err);
/* --mtp K (K > 0; m bound with its MTP block, toks holding prompt + gen
 * tokens, gen > K): greedy tokens/s with and without the block's drafts,
 * the acceptance, the costs of a speculative step; one "mtp" line each. */
int bench_mtp(struct ds_model *m, struct ds_backend *be, const int32_t *toks, long long prompt, long long gen, int K,
              ds_err *err);
/* The same batch run again with be's profile on; prints where a step's time
 * went (--batch-profile). */
int bench_batch_profile(const struct ds_model *m, struct ds_backend *be, int B, long long prompt, long long gen,
                        const int32_t *toks, ds_err *err);
int cmd_synth(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_tiers(int argc, char **argv);
int cmd_serve(int argc, char **argv);


#endif
