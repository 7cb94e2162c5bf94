/* util.h — small helpers shared by the dsv4 commands. */
#ifndef DS_CLI_UTIL_H
#define DS_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/clock.h"
#include "runtime/backend_select.h"

/* Reads a whole file ('-': stdin) with ds_read_file; NULL with a message on
 * stderr naming `cmd` and the file. */
char *cli_read_file(const char *cmd, const char *path, size_t *n);
/* --json-schema FILE: the schema in FILE compiled to a grammar, and the
 * trie of tok's vocabulary it masks over; errors printed as "dsv4 CMD: FILE: ...".
 * Returns 0, or -1 with nothing to free. */
struct ds_grammar;
struct ds_vocab_trie;
struct ds_tokenizer;
int cli_load_schema(const char *cmd, const char *file, const struct ds_tokenizer *tok, struct ds_grammar **g,
                    struct ds_vocab_trie **trie);
struct ds_model;
struct ds_tokenizer;
/* b bytes as "1.23 GB", "45.60 MB" or "7.80 kB" in buf; returns buf. */
const char *cli_bytes(double b, char *buf, size_t cap);
/* The model directory: `given` (-m) if non-NULL, else $DSV4_MODEL, else
 * ./models/kjv, else <dir of the executable>/../models/kjv (the first holding
 * config.json). -1 with a message on stderr naming `cmd` if none. */
int cli_model_dir(const char *cmd, const char *given, char *out, size_t cap);
/* Loads DIR's weights the way o says (--load; o NULL: mmap): auto copies
 * them into memory for the CPU backend of a single process when they fit;
 * progress on standard error when it is a terminal. -1 with a message on
 * stderr. */
int cli_load_model(const char *cmd, const char *dir, const ds_backend_opts *o, struct ds_model **m);
/* Loads DIR's tokenizer.json, then its weights (as cli_load_model). */
int cli_load_model_tok(const char *cmd, const char *dir, const ds_backend_opts *o, struct ds_model **m,
                       struct ds_tokenizer **tok);
/* The tokenizer's BOS id, else config.json's bos_token_id. */
int32_t cli_bos_id(const struct ds_model *m, const struct ds_tokenizer *tok);

/* Opens the backend o names (NULL: the CPU, all cores) and binds m to it: 0.
 * On error prints "dsv4 <cmd>: <message>" and returns -1 (be left closed).
 * Under mpirun (ep/launch.h): 0 on rank 0, which runs the command; 1 on a
 * follower once the leader quit (be closed, m unbound): the command is done
 * and returns cli_bind_done(1), 0. */
struct ds_model;
int cli_bind(const char *cmd, struct ds_model *m, const ds_backend_opts *o, ds_backend *be);
/* A command's exit status after a cli_bind that did not return 0: 1 after
 * an error, 0 on a follower that served the leader. */
static inline int cli_bind_done(int bind_rc) { return bind_rc > 0 ? 0 : 1; }
/* Where a model with expert tiers (--gpu-mem) served its experts since the
 * store's counts were last reset, one line after label: picks in slots,
 * copied, on the CPU, and each layer's share in slots; then the counts are
 * reset (f NULL: only that). Nothing without a store. steps: the steps they
 * cover (for per-step times). */
void cli_tiers_report(FILE *f, const char *label, const struct ds_model *m, double steps);
#endif
