/* opts.h — the one option parser of every dsv4 command.
 *
 * A command describes its options as tables (cli_opt arrays ending in
 * CLI_END), each a group over one struct: an option's destination is an
 * offset into the group's struct. Groups that several commands share (the
 * model directory, --backend / --gpu, --threads, sampling) are tables here,
 * so an option added to one of them reaches every command that includes it.
 * cli_parse reads argv against the groups; --help / -h prints a usage page
 * generated from them.
 *
 * Syntax: `-m DIR`, `--name VALUE` or `--name=VALUE` (the value is the next
 * argument whatever it looks like, so `-n -1` is a bad value, not a missing
 * one); flags take no value. Errors are one line on standard error,
 * "dsv4 <cmd>: <option>: <why>", followed by the synopsis:
 *   unknown option, missing value, not a number / not an integer / not a
 *   list, out of range [lo, hi], not one of the choices, given twice (every
 *   kind but the repeatable ones), a value given to a flag. */
#ifndef DS_CLI_OPTS_H
#define DS_CLI_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CLI_FLAG,     /* int: set to 1 */
    CLI_INT,      /* int in [lo, hi] */
    CLI_LONG,     /* long long in [lo, hi] */
    CLI_U64,      /* uint64_t in [lo, hi] (lo >= 0) */
    CLI_DOUBLE,   /* double (any finite or infinite strtod value; NaN refused) */
    CLI_STRING,   /* const char *: the argument itself */
    CLI_CHOICE,   /* int: the index of the value in choices (NULL-terminated) */
    CLI_IDS,      /* cli_ids: integers in [lo, hi] separated by commas or blanks */
    CLI_STRINGS,  /* cli_strs, repeatable: every value in order */
    CLI_IDS_LIST, /* cli_ids_list, repeatable: one cli_ids per occurrence */
} cli_kind;

typedef struct {
    int32_t *v; /* malloc'd (cli_free) */
    int n;
} cli_ids;

typedef struct {
    const char **v; /* malloc'd array of pointers into argv (cli_free) */
    int n;
} cli_strs;

typedef struct {
    cli_ids *v; /* malloc'd (cli_free) */
    int n;
} cli_ids_list;

typedef struct cli_opt {
    const char *name;  /* "--prompt", or a short-only option's "-n"; NULL ends a table */
    const char *alias; /* another spelling ("-p"), or NULL */
    cli_kind kind;
    size_t off;       /* the destination's offset in the group's struct */
    long long lo, hi; /* CLI_INT / CLI_LONG / CLI_U64 / CLI_IDS(_LIST) bounds */
    const char *metavar;
    const char *help; /* wrapped at 100 columns; '\n' breaks a line */
    const char *const *choices;
} cli_opt;

#define CLI_END                                                                                                        \
    { .name = NULL }
#define CLI_FLAG_OPT(nm, al, T, f, h)                                                                                  \
    { .name = nm, .alias = al, .kind = CLI_FLAG, .off = offsetof(T, f), .help = h }
#define CLI_INT_OPT(nm, al, T, f, l, u, mv, h)                                                                         \
    { .name = nm, .alias = al, .kind = CLI_INT, .off = offsetof(T, f), .lo = l, .hi = u, .metavar = mv, .help = h }
#define CLI_LONG_OPT(nm, al, T, f, l, u, mv, h)                                                                        \
    { .name = nm, .alias = al, .kind = CLI_LONG, .off = offsetof(T, f), .lo = l, .hi = u, .metavar = mv, .help = h }
#define CLI_U64_OPT(nm, al, T, f, l, u, mv, h)                                                                         \
    { .name = nm, .alias = al, .kind = CLI_U64, .off = offsetof(T, f), .lo = l, .hi = u, .metavar = mv, .help = h }
#define CLI_DOUBLE_OPT(nm, al, T, f, mv, h)                                                                            \
    { .name = nm, .alias = al, .kind = CLI_DOUBLE, .off = offsetof(T, f), .metavar = mv, .help = h }
#define CLI_STRING_OPT(nm, al, T, f, mv, h)                                                                            \
    { .name = nm, .alias = al, .kind = CLI_STRING, .off = offsetof(T, f), .metavar = mv, .help = h }
#define CLI_CHOICE_OPT(nm, al, T, f, ch, h)                                                                            \
    { .name = nm, .alias = al, .kind = CLI_CHOICE, .off = offsetof(T, f), .choices = ch, .help = h }
#define CLI_IDS_OPT(nm, al, T, f, l, u, mv, h)                                                                         \
    { .name = nm, .alias = al, .kind = CLI_IDS, .off = offsetof(T, f), .lo = l, .hi = u, .metavar = mv, .help = h }
#define CLI_IDS_LIST_OPT(nm, al, T, f, l, u, mv, h)                                                                    \
    { .name = nm, .alias = al, .kind = CLI_IDS_LIST, .off = offsetof(T, f), .lo = l, .hi = u, .metavar = mv, .help = h }
#define CLI_STRINGS_OPT(nm, al, T, f, mv, h)                                                                           \
    { .name = nm, .alias = al, .kind = CLI_STRINGS, .off = offsetof(T, f), .metavar = mv, .help = h }

/* One table over one struct: dst is that struct. title heads the group in
 * --help (NULL: "options"). */
typedef struct {
    const char *title;
    const cli_opt *opts;
    void *dst;
} cli_group;

typedef struct {
    const char *name;     /* "run", "bench --kernels" */
    const char *synopsis; /* after "usage: dsv4 <name> " */
    const char *about;    /* printed by --help before the options, or NULL */
    const char *notes;    /* printed by --help after them, or NULL */
    const cli_group *groups;
    int n_groups;
} cli_cmd;

/* The shared groups. */
typedef struct {
    const char *dir;   /* -m DIR, or NULL; after cli_parse also "synth:" + --synth's value */
    const char *synth; /* --synth NAME[:LAYERS], or NULL */
    char synth_dir[64];
} cli_model_arg;
/* -m DIR (or --synth NAME[:LAYERS], the same as -m synth:NAME[:LAYERS]) into
 * cli_model_arg: the model directory, default from cli_model_dir. */
extern const cli_opt cli_model_opts[];
/* The same, required by the command (it checks). */
extern const cli_opt cli_model_req_opts[];
/* --backend NAME, --gpu N into ds_backend_opts. */
extern const cli_opt cli_backend_opts[];
/* --placement, --expert-load, --redundant-experts into ds_ep_opts (the
 * process's MPI session: ds_ep_session_opts()), under the title CLI_EP_TITLE. */
extern const cli_opt cli_ep_opts[];
#define CLI_EP_TITLE "expert parallelism (under mpirun, docs/ep.md)"
/* --threads N into ds_backend_opts. */
extern const cli_opt cli_threads_opts[];
/* --load auto|copy|mmap into ds_backend_opts (commands that load a model). */
extern const cli_opt cli_load_opts[];
enum { CLI_LOAD_AUTO = 0, CLI_LOAD_COPY = 1, CLI_LOAD_MMAP = 2 }; /* ds_backend_opts.load */
/* --gpu-mem, --expert-slots, --tier-path into ds_backend_opts (the routed
 * experts in tiers: model/store.h), under the title CLI_TIER_TITLE. */
extern const cli_opt cli_tier_opts[];
#define CLI_TIER_TITLE "expert tiers (docs/tiers.md)"
/* --temperature ... --seed into ds_sampling. */
extern const cli_opt cli_sampling_opts[];

/* Parses argv[1..argc) (argv[0] is the command's name). Returns 0 when the
 * command goes on; otherwise the command returns *rc at once: 0 after --help
 * (usage on standard output), 2 after an error (message and synopsis on
 * standard error). On a nonzero return what was allocated is freed. */
int cli_parse(const cli_cmd *c, int argc, char **argv, int *rc);
/* Frees every CLI_IDS / CLI_STRINGS / CLI_IDS_LIST destination (zeroed). */
void cli_free(const cli_cmd *c);
/* The --help page. */
void cli_help(const cli_cmd *c, FILE *f);
/* "dsv4 <cmd>: <message>" and the synopsis on standard error; returns 2
 * (the usage exit status). For checks after cli_parse (required options,
 * options that exclude each other). */
int cli_usage_error(const cli_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
