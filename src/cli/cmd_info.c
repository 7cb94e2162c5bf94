/* cmd_info.c — `dsv4 info -m DIR`: config summary, tensor counts and bytes
 * per dtype, and the kind of every layer. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/util.h"
#include "ep/ep.h"
#include "runtime/backend_select.h"
#include "model/model.h"
#include "model/state.h"
#include "runtime/context.h"
#include "runtime/model_load.h"

static void print_bytes(const char *label, double b) {
    char s[32];
    printf("%s%s", label, cli_bytes(b, s, sizeof s));
}

/* the state a sequence holds per token of context, and with a backend the
 * longest context its free memory holds */
static int print_context(const ds_model *m, const ds_backend_opts *bo) {
    const ds_config *c = &m->cfg;
    int64_t big = c->max_pos;
    double fixed = (double)ds_seq_bytes(m, 0), per = ((double)ds_seq_bytes(m, big) - fixed) / (double)big;
    printf("context    at most %lld tokens (max_position_embeddings); a sequence's state: %.0f bytes per token",
           (long long)big, per);
    print_bytes(" + ", fixed);
    print_bytes(" (", (double)ds_seq_bytes(m, 4096));
    print_bytes(" at 4,096 tokens, ", (double)ds_seq_bytes(m, big));
    printf(" at the maximum)\n");
    if (!bo->name) return 0;
    ds_backend be = {0};
    ds_err err;
    ds_ctx_budget b;
    if (ds_backend_open(bo, &be, &err) || ds_ctx_budget_of(m, &be, &b, &err)) {
        fprintf(stderr, "dsv4 info: %s\n", err.msg);
        if (be.close) be.close(&be);
        return 1;
    }
    printf("fits       %s: %.2f GB free - %.2f GB of weights - %.2f GB for a step of %d tokens = %.2f GB for state:",
           be.name, b.avail / 1e9, b.weights / 1e9, b.activations / 1e9, DS_STEP_TOKENS, b.state / 1e9);
    const int ns[] = {1, 4, 16, 64};
    for (int i = 0; i < 4; i++)
        printf("%s %d sequence%s of %lld tokens", i ? "," : "", ns[i], ns[i] > 1 ? "s" : "",
               (long long)ds_seq_fit(m, b.state, ns[i]));
    printf("\n");
    be.close(&be);
    return 0;
}

int cmd_info(int argc, char **argv) {
    cli_model_arg ma = {0};
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_req_opts, &ma}, {"backend", cli_backend_opts, &bo}};
    const cli_cmd cmd = {"info", "-m DIR [--backend cpu|cuda [--gpu N]]",
                         "Prints the config, the tensors and bytes per dtype, the layer kinds, the backends of this "
                         "build, whether it has MPI (expert parallelism over ranks) and the state a sequence holds "
                         "per token of context; with --backend, the longest context that backend's free memory "
                         "holds next to the weights (1, 4, 16 and 64 sequences).\n",
                         NULL, groups, 2};
    int rc;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    if (!ma.dir) return cli_usage_error(&cmd, "-m DIR is required");
    const char *dir = ma.dir;
    ds_model *m;
    ds_err err;
    if (ds_load_model(dir, NULL, &m, &err)) {
        fprintf(stderr, "dsv4 info: %s\n", err.msg);
        return 1;
    }
    const ds_config *c = &m->cfg;
    printf("model      %s\n", dir);
    printf("backends   %s (this build)\n", ds_backends_built());
    printf("ranks      %s\n", ds_ep_built() ? "expert parallelism over MPI ranks (mpirun; this build)"
                                             : "one process (no MPI in this build)");
    printf("shape      vocab %d, hidden %d, layers %d, heads %d x %d (rope %d), q_lora %d, o_groups %d x %d\n",
           c->vocab_size, c->dim, c->n_layers, c->n_heads, c->head_dim, c->rope_dim, c->q_lora_rank, c->o_groups,
           c->o_lora_rank);
    printf("moe        %d routed experts (%d active, %s), %d shared, width %d, %d hash layers, swiglu limit %g\n",
           c->n_routed_experts, c->n_active_experts,
           c->score_func == DS_SCORE_SQRTSOFTPLUS ? "sqrtsoftplus" : c->score_func == DS_SCORE_SIGMOID ? "sigmoid" : "softmax",
           c->n_shared_experts, c->moe_inter_dim, c->n_hash_layers, (double)c->swiglu_limit);
    printf("attention  window %d, indexer %d heads x %d, top-%d, mHC %d streams (%d Sinkhorn iters)\n", c->window,
           c->index_n_heads, c->index_head_dim, c->index_topk, c->hc_mult, c->hc_sinkhorn_iters);
    printf("rope       theta %g (sliding), %g (compressed)%s\n", c->rope_theta, c->compress_rope_theta,
           c->yarn ? ", YaRN" : "");
    uint64_t count[DS_DTYPE_COUNT] = {0}, bytes[DS_DTYPE_COUNT] = {0}, total = 0;
    int n = ds_checkpoint_count(m->ck), mtp = 0;
    for (int i = 0; i < n; i++) {
        const ds_tensor *t = ds_checkpoint_at(m->ck, i);
        count[t->dtype]++;
        bytes[t->dtype] += t->nbytes;
        total += t->nbytes;
        if (!strncmp(t->name, "mtp.", 4)) mtp++;
    }
    printf("tensors    %d in %d file(s), %.3f GB; %d used by the model (the MTP block's included), %d MTP\n", n,
           ds_checkpoint_file_count(m->ck), (double)total / 1e9, m->n_tensors_used, mtp);
    if (m->mtp)
        printf("mtp        block loaded (one layer, sliding window): dsv4 run / generate / bench --mtp K\n");
    else
        printf("mtp        off: %s\n", m->mtp_off);
    for (int d = 0; d < DS_DTYPE_COUNT; d++)
        if (count[d])
            printf("  %-8s %8llu tensors %14.3f MB\n", ds_dtype_name((ds_dtype)d), (unsigned long long)count[d],
                   (double)bytes[d] / 1e6);
    printf("decode     %.3f GB of weights read per token (batch 1)\n", (double)ds_model_decode_bytes(m) / 1e9);
    if (print_context(m, &bo)) {
        ds_model_free(m);
        return 1;
    }
    printf("layers\n");
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        printf("  %3d  %-32s %s\n", li,
               ly->is_csa ? "CSA (indexer) + window" : ly->ratio ? "HCA + window" : "sliding window",
               ly->is_hash ? "hash MoE" : "routed MoE");
    }
    ds_model_free(m);
    return 0;
}
