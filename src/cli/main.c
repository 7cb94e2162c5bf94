/* main.c — the dsv4 command-line entry point: dispatches to cmd_<name>. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "ep/ep.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"info", cmd_info, "config summary, tensor counts and bytes per dtype, layer kinds"},
    {"logits", cmd_logits, "run token sequences, write float32 logits per token"},
    {"generate", cmd_generate, "greedy / sampled continuation of token ids"},
    {"bench", cmd_bench, "prefill and decode tokens/s and GB/s against the machine's bandwidth"},
    {"check", cmd_check, "determinism checker: same requests in random batches, chunkings and thread counts"},
    {"synth", cmd_synth, "write a random-weight checkpoint in the official layout"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"run", cmd_run, "continue a text prompt, streaming the text (default model: models/kjv)"},
    {"chat", cmd_chat, "interactive multi-turn chat on stdin / stdout"},
    {"perplexity", cmd_perplexity, "perplexity of a text file over [BOS] + fixed windows"},
    {"stats", cmd_stats, "per-layer expert load of the MoE routing on a text file"},
    {"tiers", cmd_tiers, "plan the routed experts in GPU slots and host memory for a GPU's memory"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 <command> [options]   (dsv4 <command> --help, or dsv4 help <command>: its options)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
}

/* Every command's output goes through stdout: a write that failed (a full
 * disk, /dev/full, a closed pipe) shows in fflush / ferror / fclose here, and
 * turns a successful exit status into 1 with a message. */
static int finish_output(const char *cmd, int rc) {
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) bad = 1, e = errno;
    if (bad) {
        fprintf(stderr, "dsv4 %s: cannot write standard output: %s\n", cmd, e ? strerror(e) : "write error");
        if (rc == 0) rc = 1;
    }
    return rc;
}

static int run(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (argc > 2 && !strcmp(argv[1], "help")) { /* dsv4 help <command>: its --help */
            char help[] = "--help";
            char *args[] = {argv[2], help, NULL};
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (!strcmp(argv[2], commands[i].name)) return finish_output(argv[2], commands[i].fn(2, args));
            fprintf(stderr, "dsv4 help: unknown command '%s'\n", argv[2]);
            usage(stderr);
            return 2;
        }
        usage(stdout);
        return finish_output("help", 0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return finish_output(argv[1], commands[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "dsv4: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/* The server shares its cores with connection threads (one wake-up per
 * streamed token) and, on a small machine, with its clients. libgomp's idle
 * workers spin up to GOMP_SPINCOUNT (300,000 by default) polls after each
 * parallel region before they sleep: enough to hold both cores of a 2-core
 * machine between steps, so every token's HTTP write waited for a scheduler
 * tick (server decode at batch 1 was 0.4 of `bench`). A short spin still
 * covers the gaps between the parallel regions of one step. libgomp reads the
 * variable when it loads, before main: so `serve` sets it and executes itself
 * again, unless the user chose a wait policy (GOMP_SPINCOUNT / OMP_WAIT_POLICY). */
#define DS_SERVE_SPINCOUNT "10000"
static void serve_spin_policy(char **argv) {
    if (getenv("GOMP_SPINCOUNT") || getenv("OMP_WAIT_POLICY")) return;
    if (setenv("GOMP_SPINCOUNT", DS_SERVE_SPINCOUNT, 1)) return;
    execv("/proc/self/exe", argv);
    /* not re-executed (no /proc): serve with the default policy */
}

/* Under mpirun every rank runs the command; rank 0 leads, the others follow
 * from cli_bind on (docs/ep.md). */
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) serve_spin_policy(argv);
    if (ds_ep_session_start(&argc, &argv)) return 1;
    return ds_ep_session_end(run(argc, argv));
}
