/* commands.h — one function per `dsv4 <command>`, each in cmd_<name>.c.
 * Each returns the process exit status (0 ok, 1 runtime error, 2 usage). */
#ifndef DS_COMMANDS_H
#define DS_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_stats(int argc, char **argv);

/* Helpers of the text commands (run, chat, perplexity, stats), in cmd_run.c. */
#include <stddef.h>
#include <stdint.h>
struct ds_model;
struct ds_tokenizer;
/* The model directory: `given` (-m) if non-NULL, else $DSV4_MODEL, else
 * ./models/kjv, else <dir of the executable>/../models/kjv (the first holding
 * config.json). -1 with a message on stderr naming `cmd` if none. */
int cli_model_dir(const char *cmd, const char *given, char *out, size_t cap);
/* Loads DIR's tokenizer.json, then its weights; -1 with a message on stderr. */
int cli_load_model_tok(const char *cmd, const char *dir, struct ds_model **m, struct ds_tokenizer **tok);
/* The tokenizer's BOS id, else config.json's bos_token_id. */
int32_t cli_bos_id(const struct ds_model *m, const struct ds_tokenizer *tok);
/* The bytes of a file ('-': stdin), NUL-terminated, malloc'ed; NULL with a
 * message on stderr naming the file. */
char *cli_read_file(const char *cmd, const char *path, size_t *n);

#endif
