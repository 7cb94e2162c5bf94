/* cmd_synth.c — `dsv4 synth`: write a random-weight checkpoint of any V4
 * shape in the official layout. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/synth.h"

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 synth --like flash|pro|tiny [--layers N] [--experts E] [--active K] [--vocab V]\n"
               "                  [--bf16] [--seed S] [--shard-gb G] -o DIR\n"
               "  writes config.json + sharded safetensors (FP8 e4m3 dense weights with E8M0 128x128 block\n"
               "  scales, MXFP4 routed experts, BF16 embeddings/head; --bf16: BF16 weights) of that shape.\n"
               "  --layers N keeps the first N layers of the shape (their compress ratios and hash layers).\n");
}

int cmd_synth(int argc, char **argv) {
    const char *like = NULL, *out = NULL;
    long long layers = -1, experts = -1, active = -1, vocab = -1, seed = 1, shard_gb = 4;
    int bf16 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--bf16")) {
            bf16 = 1;
            continue;
        } else if (!strcmp(a, "--like") && v) {
            like = v;
        } else if (!strcmp(a, "-o") && v) {
            out = v;
        } else if (!strcmp(a, "--layers") && v) {
            bad = cli_parse_int(a, v, 1, DS_MAX_LAYERS, &layers);
        } else if (!strcmp(a, "--experts") && v) {
            bad = cli_parse_int(a, v, 1, 4096, &experts);
        } else if (!strcmp(a, "--active") && v) {
            bad = cli_parse_int(a, v, 1, 64, &active);
        } else if (!strcmp(a, "--vocab") && v) {
            bad = cli_parse_int(a, v, 2, 1 << 24, &vocab);
        } else if (!strcmp(a, "--seed") && v) {
            bad = cli_parse_int(a, v, 0, INT64_MAX, &seed);
        } else if (!strcmp(a, "--shard-gb") && v) {
            bad = cli_parse_int(a, v, 1, 1024, &shard_gb);
        } else {
            fprintf(stderr, "dsv4 synth: unknown or incomplete option '%s'\n", a);
            bad = 1;
        }
        if (bad) {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!like || !out) {
        fprintf(stderr, "dsv4 synth: --like and -o are required\n");
        usage(stderr);
        return 2;
    }
    ds_config cfg;
    ds_err err;
    if (ds_synth_like(like, &cfg, &err)) {
        fprintf(stderr, "dsv4 synth: %s\n", err.msg);
        return 2;
    }
    if (layers > 0) {
        cfg.n_layers = (int)layers;
        if (cfg.n_hash_layers > cfg.n_layers) cfg.n_hash_layers = cfg.n_layers;
    }
    if (experts > 0) cfg.n_routed_experts = (int)experts;
    if (active > 0) cfg.n_active_experts = (int)active;
    if (vocab > 0) cfg.vocab_size = (int)vocab;
    ds_synth_opts o = {!bf16, (uint64_t)seed, (uint64_t)shard_gb << 30, 1};
    if (ds_synth_write(&cfg, &o, out, &err)) {
        fprintf(stderr, "dsv4 synth: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "dsv4 synth: wrote %s\n", out);
    return 0;
}
