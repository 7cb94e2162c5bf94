/* cmd_tiers.c — `dsv4 tiers -m DIR --gpu-mem GB`: how a model's routed
 * experts would sit in tiers on one GPU (ep/tiers.h): how many take a GPU
 * slot, the share of the routed picks they serve by measured load, and a
 * decode step's predicted misses, copies, CPU-computed tokens and time. From
 * the config alone: no weights are read, so the real V4-Flash or V4-Pro
 * plans on any machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/util.h"
#include "ep/ep.h"
#include "ep/tiers.h"
#include "model/synth.h"
#include "runtime/model_load.h"

typedef struct {
    double gpu_mem, pcie, cpu_read, cpu_gflops;
    const char *load;
    cli_ids batch;
    long long trials, seed;
} tiers_args;

static const cli_opt tiers_opts[] = {
    CLI_DOUBLE_OPT("--gpu-mem", NULL, tiers_args, gpu_mem, "GB",
                   "GPU memory for the model's weights: the dense ones, and expert slots in the rest (10^9 bytes; "
                   "the sequences' state and a step's activations come on top); required"),
    CLI_STRING_OPT("--expert-load", NULL, tiers_args, load, "F",
                   "measured load, lines 'LAYER EXPERT TOKENS' (dsv4 stats --load-out); default: every expert the "
                   "same"),
    CLI_IDS_OPT("--batch", NULL, tiers_args, batch, 1, 4096, "B,...", "decode batches to predict (default 1,8,64)"),
    CLI_DOUBLE_OPT("--pcie", NULL, tiers_args, pcie, "GB/s", "host to GPU copy rate (default 50, PCIe 5 x16)"),
    CLI_DOUBLE_OPT("--cpu-read", NULL, tiers_args, cpu_read, "GB/s",
                   "the CPU's rate reading expert weights (default 100; dsv4 bench --kernels measures the MXFP4 "
                   "kernels)"),
    CLI_DOUBLE_OPT("--cpu-gflops", NULL, tiers_args, cpu_gflops, "G",
                   "the CPU's rate on expert products, GFLOP/s (default 1000; dsv4 bench --kernels)"),
    CLI_LONG_OPT("--trials", NULL, tiers_args, trials, 1, 100000, "N", "random steps per batch (default 64)"),
    CLI_LONG_OPT("--seed", NULL, tiers_args, seed, 0, 1LL << 62, "S", "their draws (default 1)"),
    CLI_END,
};

static int skip_routed(void *ctx, const char *name) { /* 1: a routed expert's tensor */
    (void)ctx;
    int l, e, n = 0;
    return sscanf(name, "layers.%d.ffn.experts.%d.%n", &l, &e, &n) == 2 && n > 0;
}
static int keep_routed(void *ctx, const char *name) { return !skip_routed(ctx, name); }

static int positive(const cli_cmd *cmd, const char *opt, double v) {
    if (isfinite(v) && v > 0) return 0;
    cli_usage_error(cmd, "%s: %g: must be a finite number > 0", opt, v);
    return -1;
}

int cmd_tiers(int argc, char **argv) {
    cli_model_arg ma = {0};
    tiers_args ta = {.gpu_mem = (double)NAN,
                     .pcie = DS_TIER_PCIE / 1e9,
                     .cpu_read = DS_TIER_CPU_READ / 1e9,
                     .cpu_gflops = DS_TIER_CPU_FLOPS / 1e9,
                     .trials = 64,
                     .seed = 1};
    const cli_group groups[] = {{NULL, cli_model_req_opts, &ma}, {"tiers", tiers_opts, &ta}};
    const cli_cmd cmd = {
        "tiers",
        "-m DIR --gpu-mem GB [--expert-load F] [--batch B,...] [--pcie GB/s] [--cpu-read GB/s] ...",
        "Plans a model's routed experts in tiers on one GPU: the --gpu-mem GB hold the dense weights and\n"
        "the most loaded experts (--expert-load, written by dsv4 stats --load-out or dsv4 serve --load-out);\n"
        "the rest stay in host memory. A decode step's routed expert without a slot is copied into one over\n"
        "PCIe or computed on the CPU for its tokens, whichever finishes sooner (the copy stream and the CPU\n"
        "work side by side); the exact expert numerics give the same bits either way. Prints the slots, the\n"
        "share of the routed picks they serve, and per decode batch the predicted misses, copies,\n"
        "CPU-computed tokens and the time they add, the mean of --trials random steps drawn from the load.\n"
        "Reads the config only: -m takes the real checkpoint's directory or synth:NAME[:LAYERS]; expert sizes\n"
        "are those of the official layout (MXFP4).\n",
        "The plan and its cost model only: the engine does not yet run a model from these tiers.\n",
        groups,
        2};
    int rc;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    ds_err err = {{0}};
    ds_config c;
    rc = 2;
    if (!ma.dir) {
        rc = cli_usage_error(&cmd, "-m DIR is required");
        goto out;
    }
    if (isnan(ta.gpu_mem)) { /* the parser refuses NaN: not given */
        rc = cli_usage_error(&cmd, "--gpu-mem GB is required");
        goto out;
    }
    if (!(isfinite(ta.gpu_mem) && ta.gpu_mem >= 0)) {
        rc = cli_usage_error(&cmd, "--gpu-mem: %g: must be a finite number >= 0", ta.gpu_mem);
        goto out;
    }
    if (positive(&cmd, "--pcie", ta.pcie) || positive(&cmd, "--cpu-read", ta.cpu_read) ||
        positive(&cmd, "--cpu-gflops", ta.cpu_gflops))
        goto out;
    rc = 1;
    if (ds_load_config(ma.dir, &c, &err)) {
        fprintf(stderr, "dsv4 tiers: %s\n", err.msg);
        goto out;
    }
    int L = c.n_layers, E = c.n_routed_experts;
    ds_synth_opts so = {.quantized = 1};
    double routed = (double)ds_synth_bytes(&c, &so, keep_routed, NULL);
    double dense = (double)ds_synth_bytes(&c, &so, skip_routed, NULL);
    double eb = routed / ((double)L * E), flops = 6.0 * c.dim * c.moe_inter_dim;
    double *load = NULL;
    if (ta.load) {
        load = malloc((size_t)L * E * sizeof *load);
        if (!load || ds_load_read(ta.load, L, E, load, &err)) {
            fprintf(stderr, "dsv4 tiers: %s\n", load ? err.msg : "out of memory");
            free(load);
            goto out;
        }
    }
    ds_tier_plan p;
    if (ta.gpu_mem * 1e9 < dense) {
        char d1[32], d2[32];
        fprintf(stderr,
                "dsv4 tiers: --gpu-mem %g GB does not hold the dense weights alone: %s (and %s of routed "
                "experts)\n",
                ta.gpu_mem, cli_bytes(dense, d1, sizeof d1), cli_bytes(routed, d2, sizeof d2));
        free(load);
        goto out;
    }
    long long slots = (long long)floor((ta.gpu_mem * 1e9 - dense) / eb);
    if (ds_tier_plan_build(&p, L, E, load, slots, &err)) {
        fprintf(stderr, "dsv4 tiers: %s\n", err.msg);
        free(load);
        goto out;
    }
    ds_tier_rates r = {ta.pcie * 1e9, ta.cpu_read * 1e9, ta.cpu_gflops * 1e9};
    char b1[32], b2[32], b3[32];
    printf("model      %s: %d layers x %d routed experts (%d active), %s an expert, %s routed + %s dense\n", ma.dir, L,
           E, c.n_active_experts, cli_bytes(eb, b1, sizeof b1), cli_bytes(routed, b2, sizeof b2),
           cli_bytes(dense, b3, sizeof b3));
    printf("slots      %lld of %d experts (%.1f%%) in %s of GPU memory beside the dense weights; %s in host memory\n",
           p.slots, L * E, 100.0 * (double)p.slots / ((double)L * E), cli_bytes((double)p.slots * eb, b1, sizeof b1),
           cli_bytes((double)(L * (long long)E - p.slots) * eb, b2, sizeof b2));
    printf("load       %s; the slots serve %.2f%% of the routed picks\n",
           ta.load ? ta.load : "every expert the same (no --expert-load)", 100.0 * p.hit);
    printf("rates      PCIe %g GB/s; the CPU reads experts at %g GB/s and computes at %g GFLOP/s\n", ta.pcie,
           ta.cpu_read, ta.cpu_gflops);
    printf("%7s %12s %10s %12s %12s %14s\n", "batch", "misses/step", "copied", "MB copied", "CPU tokens",
           "added ms/step");
    static const int32_t dflt[] = {1, 8, 64};
    const int32_t *bs = ta.batch.n ? ta.batch.v : dflt;
    int nb = ta.batch.n ? ta.batch.n : 3;
    rc = 0;
    for (int i = 0; i < nb && !rc; i++) {
        ds_tier_step s;
        if (ds_tier_simulate(&p, load, c.n_active_experts, bs[i], &r, eb, flops, (int)ta.trials, (uint64_t)ta.seed, &s,
                             &err)) {
            fprintf(stderr, "dsv4 tiers: %s\n", err.msg);
            rc = 1;
            break;
        }
        printf("%7d %12.2f %10.2f %12.1f %12.2f %14.3f\n", bs[i], s.misses, s.copied, s.bytes / 1e6, s.cpu_tokens,
               s.seconds * 1e3);
    }
    ds_tier_plan_free(&p);
    free(load);
out:
    cli_free(&cmd);
    return rc;
}
