/* cmd_generate.c — `dsv4 generate`: continue token ids, greedy or sampled
 * with a seeded counter-based RNG; prints the generated ids. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "ep/ep.h"
#include "cli/util.h"
#include "model/forward.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"

typedef struct {
    cli_ids tokens, stop;
    long long n, mtp;
    const char *json_schema;
} generate_args;

static const cli_opt generate_opts[] = {
    CLI_IDS_OPT("--tokens", NULL, generate_args, tokens, 0, INT32_MAX, "5,17,42", "the prompt's token ids; required"),
    CLI_LONG_OPT("-n", NULL, generate_args, n, 0, 1 << 24, "N", "tokens to generate (default 16)"),
    CLI_IDS_OPT("--stop", NULL, generate_args, stop, 0, INT32_MAX, "ID,...", "token ids that end the generation"),
    CLI_LONG_OPT("--mtp", NULL, generate_args, mtp, 0, DS_GEN_MTP_MAX, "K",
                 "speculative decoding: tokens the model's MTP block drafts a step (default 0: off; the same ids for "
                 "any K; acceptance on standard error)"),
    CLI_STRING_OPT("--json-schema", NULL, generate_args, json_schema, "FILE",
                   "only tokens that continue JSON valid for the JSON schema in FILE (docs/server.md); EOS ends it"),
    CLI_END,
};

typedef struct {
    int n;
} gen_print;

static int print_id(void *ctx, int32_t token, int is_stop, const char *text, size_t n) {
    gen_print *g = ctx;
    (void)is_stop, (void)text, (void)n;
    if (token < 0) return 0;
    printf("%s%d", g->n++ ? " " : "", token);
    fflush(stdout);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    generate_args ga = {.n = 16};
    cli_model_arg ma = {0};
    ds_sampling sp;
    ds_sampling_init(&sp);
    sp.temperature = 0;
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_req_opts, &ma},
                                {NULL, generate_opts, &ga},
                                {"sampling", cli_sampling_opts, &sp},
                                {"backend", cli_threads_opts, &bo},
                                {"backend", cli_load_opts, &bo},
                                {CLI_TIER_TITLE, cli_tier_opts, &bo},
                                {"backend", cli_backend_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"generate",
                         "-m DIR --tokens 5,17,42 -n N [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] "
                         "[--threads N] [--stop ID,...] [--mtp K] [--json-schema FILE] [--backend cpu|cuda] [--gpu N]",
                         "Prints the N generated token ids (greedy unless --temperature > 0).\n", NULL, groups,
                         (int)(sizeof groups / sizeof groups[0])};
    int rc = 1;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    const char *dir = ma.dir;
    const int32_t *prompt = ga.tokens.v, *stop = ga.stop.v;
    int n_prompt = ga.tokens.n, n_stop = ga.stop.n;
    long long n_gen = ga.n;
    int32_t *hist = NULL;
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_seq *seq = NULL;
    float *logits = NULL;
    ds_sample_scratch *scr = NULL;
    ds_err err = {{0}};
    ds_tokenizer *tk = NULL; /* --json-schema: the grammar, its trie and state, the mask and masked logits */
    ds_grammar *gram = NULL;
    ds_vocab_trie *trie = NULL;
    ds_gstate *gs = NULL;
    ds_mask_scratch *ms = NULL;
    uint64_t *bits = NULL;
    float *glg = NULL;
    if (!dir || !prompt) {
        cli_free(&cmd);
        return cli_usage_error(&cmd, "-m and --tokens are required");
    }
    if (ds_sampling_validate(&sp, &err)) goto fail;
    if (ga.json_schema ? cli_load_model_tok("generate", dir, &bo, &m, &tk) : cli_load_model("generate", dir, &bo, &m))
        goto out;
    if (ga.json_schema) {
        if (cli_load_schema("generate", ga.json_schema, tk, &gram, &trie)) goto out;
        gs = ds_gstate_new(gram);
        ms = ds_mask_scratch_new(trie);
        bits = calloc(((size_t)ds_vocab_trie_vocab(trie) + 63) / 64, sizeof *bits);
        glg = malloc((size_t)m->cfg.vocab_size * sizeof *glg);
        if (!gs || !ms || !bits || !glg) {
            fprintf(stderr, "dsv4 generate: out of memory\n");
            goto out;
        }
    }
    m->bind_mtp = ga.mtp > 0;
    int brc = cli_bind("generate", m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    int V = m->cfg.vocab_size;
    if (n_prompt > m->cfg.max_pos) {
        fprintf(stderr, "dsv4 generate: a prompt of %d tokens is beyond the model's max_position_embeddings (%lld)\n",
                (int)n_prompt, (long long)m->cfg.max_pos);
        goto out;
    }
    if (ds_seq_new(m, n_prompt + n_gen + 1, &seq, &err)) goto fail;
    logits = malloc((size_t)V * sizeof *logits);
    hist = malloc((size_t)(n_prompt + n_gen + 1) * sizeof *hist);
    scr = ds_sample_scratch_create(V, &err);
    if (!logits || !hist || !scr) {
        if (!scr) goto fail;
        fprintf(stderr, "dsv4 generate: out of memory\n");
        goto out;
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    if (ga.mtp > 0) { /* through ds_generate: the same ids (test_mtp) */
        if (!m->mtp_model)
            fprintf(stderr, "dsv4 generate: --mtp %lld: no MTP block (%s); running without speculation\n", ga.mtp,
                    m->mtp ? "not under expert parallelism" : m->mtp_off);
        const int32_t none = -1;
        ds_gen_params gp;
        ds_gen_params_init(&gp);
        gp.sampling = sp;
        gp.max_new = (int)n_gen;
        gp.stop_ids = n_stop ? stop : &none;
        gp.n_stop = n_stop ? n_stop : 1;
        gp.mtp = (int)ga.mtp;
        gen_print gpr = {0};
        ds_gen_result res;
        if (ds_generate(m, &be, NULL, seq, prompt, n_prompt, 0, &gp, print_id, &gpr, &res, &err)) goto fail;
        printf("\n");
        if (res.at_max_pos)
            fprintf(stderr, "dsv4 generate: stopped at the model's max_position_embeddings (%lld tokens)\n",
                    (long long)m->cfg.max_pos);
        if (res.mtp_steps)
            fprintf(stderr, "mtp: %d steps, %d of %d drafts accepted, %.2f tokens a step\n", res.mtp_steps,
                    res.mtp_accepted, res.mtp_drafted, (double)(res.mtp_steps + res.mtp_accepted) / res.mtp_steps);
        rc = 0;
        goto out;
    }
    ds_batch_item it = {seq, prompt, n_prompt, logits, 0, NULL, NULL};
    int n_hist = n_prompt;
    for (long long g = 0; g < n_gen; g++) {
        if (seq->pos + it.n_tokens >= m->cfg.max_pos) { /* the next token's position is beyond the model's */
            fprintf(stderr, "dsv4 generate: stopped at the model's max_position_embeddings (%lld tokens)\n",
                    (long long)m->cfg.max_pos);
            break;
        }
        if (ds_forward(m, &be, &it, 1, &err)) goto fail;
        int32_t tok;
        const float *from = logits;
        if (gs) { /* only the tokens that continue the schema's JSON (EOS once complete) */
            if (!ds_grammar_mask_logits(trie, gs, ms, bits, logits, V, glg)) {
                fprintf(stderr, "dsv4 generate: the schema allows no token here\n");
                goto out;
            }
            from = glg;
        }
        if (ds_sample(&sp, from, V, hist, n_hist, seq->pos, scr, &tok, &err)) goto fail;
        if (gs && ds_grammar_accept(trie, gs, tok)) {
            fprintf(stderr, "dsv4 generate: the schema rejected token %d\n", (int)tok);
            goto out;
        }
        printf("%s%d", g ? " " : "", tok);
        fflush(stdout);
        hist[n_hist++] = tok;
        if (ds_stop_check(stop, n_stop, tok) || (gs && tok == ds_tokenizer_eos_id(tk))) break;
        it.tokens = &hist[n_hist - 1];
        it.n_tokens = 1;
    }
    printf("\n");
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dsv4 generate: %s\n", err.msg);
out:
    cli_free(&cmd); /* --tokens, --stop */
    free(hist);
    free(logits);
    ds_sample_scratch_free(scr);
    ds_gstate_free(gs);
    ds_mask_scratch_free(ms);
    free(bits);
    free(glg);
    ds_vocab_trie_free(trie);
    ds_grammar_free(gram);
    ds_tokenizer_free(tk);
    ds_seq_free(seq);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
