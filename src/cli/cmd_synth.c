/* cmd_synth.c — `dsv4 synth`: write a random-weight checkpoint of any V4
 * shape in the official layout. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/util.h"
#include "model/synth.h"

typedef struct {
    const char *like, *out;
    long long layers, experts, active, vocab, seed, shard_gb;
    int bf16, mtp;
} synth_args;

static const cli_opt synth_opts[] = {
    CLI_STRING_OPT("--like", NULL, synth_args, like, "flash|pro|tiny", "the shape; required"),
    CLI_STRING_OPT("-o", NULL, synth_args, out, "DIR", "the checkpoint directory to write; required"),
    CLI_LONG_OPT("--layers", NULL, synth_args, layers, 1, DS_MAX_LAYERS, "N",
                 "keep the first N layers of the shape (their compress ratios and hash layers)"),
    CLI_LONG_OPT("--experts", NULL, synth_args, experts, 1, 4096, "E", "routed experts"),
    CLI_LONG_OPT("--active", NULL, synth_args, active, 1, 64, "K", "active experts per token"),
    CLI_LONG_OPT("--vocab", NULL, synth_args, vocab, 2, 1 << 24, "V", "vocabulary size"),
    CLI_FLAG_OPT("--bf16", NULL, synth_args, bf16, "BF16 weights instead of FP8 + MXFP4"),
    CLI_FLAG_OPT("--mtp", NULL, synth_args, mtp, "also the MTP block (mtp.0.*, random like the rest)"),
    CLI_LONG_OPT("--seed", NULL, synth_args, seed, 0, INT64_MAX, "S", "seed of the random weights (default 1)"),
    CLI_LONG_OPT("--shard-gb", NULL, synth_args, shard_gb, 1, 1024, "G", "bytes per shard at most, in GiB (default 4)"),
    CLI_END,
};

int cmd_synth(int argc, char **argv) {
    synth_args sa = {.layers = -1, .experts = -1, .active = -1, .vocab = -1, .seed = 1, .shard_gb = 4};
    const cli_group groups[] = {{NULL, synth_opts, &sa}};
    const cli_cmd cmd = {"synth",
                         "--like flash|pro|tiny [--layers N] [--experts E] [--active K] [--vocab V] [--bf16] [--mtp] "
                         "[--seed S] [--shard-gb G] -o DIR",
                         "Writes config.json + sharded safetensors (FP8 e4m3 dense weights with E8M0 128x128 block\n"
                         "scales, MXFP4 routed experts, BF16 embeddings/head; --bf16: BF16 weights) of that shape.\n",
                         NULL, groups, 1};
    int rc;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    if (!sa.like || !sa.out) return cli_usage_error(&cmd, "--like and -o are required");
    const char *like = sa.like, *out = sa.out;
    long long layers = sa.layers, experts = sa.experts, active = sa.active, vocab = sa.vocab, seed = sa.seed,
              shard_gb = sa.shard_gb;
    int bf16 = sa.bf16;
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
    ds_synth_opts o = {!bf16, (uint64_t)seed, (uint64_t)shard_gb << 30, 1, sa.mtp};
    if (ds_synth_write(&cfg, &o, out, &err)) {
        fprintf(stderr, "dsv4 synth: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "dsv4 synth: wrote %s\n", out);
    return 0;
}
