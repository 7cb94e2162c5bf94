/* cmd_run.c — `dsv4 run` (text prompt -> streamed text continuation) and
 * `dsv4 chat` (interactive multi-turn chat on stdin / stdout), both over
 * ds_generate; plus the default-model lookup shared with `dsv4 perplexity`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "ep/ep.h"
#include "cli/util.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "model/forward.h"
#include "runtime/generate.h"
#include "text/json_schema.h"

/* ------------------------------------------------------------ shared helpers */

/* Options of run and chat beyond the model, the sampling and --threads. */
typedef struct {
    long long chunk, mtp;
} gen_opts;

static const cli_opt gen_chunk_opts[] = {
    CLI_LONG_OPT("--prefill-chunk", NULL, gen_opts, chunk, 1, 1 << 20, "N",
                 "prompt tokens per forward step (default 512; same results)"),
    CLI_END,
};

static const cli_opt gen_mtp_opts[] = {
    CLI_LONG_OPT("--mtp", NULL, gen_opts, mtp, 0, DS_GEN_MTP_MAX, "K",
                 "speculative decoding: tokens the model's MTP block drafts a step (default 0: off; a model "
                 "without the block runs without it)"),
    CLI_END,
};

static const char SPEED[] = "speed (the same text for any value)";

/* The sampling defaults of run and chat: greedy. */
static void sampling_init(ds_sampling *sp) {
    ds_sampling_init(sp);
    sp->temperature = 0;
}

static double rate(double n, double s) { return s > 0 ? n / s : 0; }

/* ------------------------------------------------------------------ dsv4 run */

typedef struct {
    const char *prompt, *file, *json_schema;
    long long n;
    int raw, chat, think, special, parse_special;
} run_args;

static const cli_opt run_opts[] = {
    CLI_STRING_OPT("--prompt", "-p", run_args, prompt, "TEXT",
                   "the prompt (its exact bytes; added tokens such as <｜User｜> in it become their ids)"),
    CLI_STRING_OPT("--file", "-f", run_args, file, "FILE", "read the prompt from FILE ('-': standard input)"),
    CLI_STRING_OPT("--json-schema", NULL, run_args, json_schema, "FILE",
                   "constrain the output to JSON valid for the JSON schema in FILE (docs/server.md)"),
    CLI_LONG_OPT("-n", NULL, run_args, n, 0, 1 << 24, "N",
                 "tokens to generate at most (default 64); generation stops earlier at the end-of-sentence token"),
    CLI_FLAG_OPT("--raw", NULL, run_args, raw, "no BOS before the prompt (default: BOS + prompt)"),
    CLI_FLAG_OPT("--chat", NULL, run_args, chat,
                 "wrap the prompt as one user message of the DeepSeek-V4 chat template (non-thinking mode; --think: "
                 "thinking mode); the prompt is plain text: special-token strings in it stay text"),
    CLI_FLAG_OPT("--think", NULL, run_args, think, "with --chat: thinking mode"),
    CLI_FLAG_OPT("--parse-special", NULL, run_args, parse_special,
                 "with --chat: special-token strings in the prompt become control tokens"),
    CLI_FLAG_OPT("--special", NULL, run_args, special, "also print special tokens (BOS, EOS, ...) met in the output"),
    CLI_END,
};

typedef struct {
    int failed; /* a write to stdout failed */
    int ends_nl;
} run_out;

static int run_cb(void *ctx, int32_t token, int is_stop, const char *text, size_t n) {
    run_out *o = ctx;
    (void)token;
    (void)is_stop;
    if (!n) return 0;
    if (fwrite(text, 1, n, stdout) != n || fflush(stdout)) {
        o->failed = 1;
        return 1;
    }
    o->ends_nl = text[n - 1] == '\n';
    return 0;
}


static const char RUN_ABOUT[] =
    "Continues a text prompt and streams the new text to standard output as it is generated; then\n"
    "prints prompt and generation speed to standard error.\n";

int cmd_run(int argc, char **argv) {
    run_args ra = {.n = 64};
    cli_model_arg ma = {0};
    gen_opts o = {0};
    ds_sampling sp;
    sampling_init(&sp);
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_opts, &ma},
                                {NULL, run_opts, &ra},
                                {"sampling", cli_sampling_opts, &sp},
                                {SPEED, gen_chunk_opts, &o},
                                {SPEED, gen_mtp_opts, &o},
                                {SPEED, cli_threads_opts, &bo},
                                {SPEED, cli_load_opts, &bo},
                                {CLI_TIER_TITLE, cli_tier_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"run", "[-m DIR] (-p TEXT | -f FILE) [-n N] [--chat [--think] [--parse-special]] [--raw] "
                                "[--special] [--mtp K] [--json-schema FILE] [sampling options]",
                         RUN_ABOUT, NULL, groups, (int)(sizeof groups / sizeof groups[0])};
    int rc = 1;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    const char *prompt = ra.prompt, *file = ra.file;
    int raw = ra.raw, chat = ra.chat, think = ra.think, special = ra.special, parse_special = ra.parse_special;
    if (!prompt == !file) return cli_usage_error(&cmd, "exactly one of -p TEXT or -f FILE is required");
    if (think && !chat) return cli_usage_error(&cmd, "--think needs --chat");
    if (parse_special && !chat)
        return cli_usage_error(&cmd, "--parse-special needs --chat (without --chat the prompt is parsed anyway)");
    if (chat && raw)
        return cli_usage_error(&cmd, "--chat and --raw do not go together (the chat template starts with BOS)");
    ds_err err = {{0}};
    if (ds_sampling_validate(&sp, &err)) return cli_usage_error(&cmd, "%s", err.msg);

    char dir[4096];
    if (cli_model_dir("run", ma.dir, dir, sizeof dir)) return 1;
    char *owned = NULL;
    size_t text_n;
    if (file) {
        if (!(owned = cli_read_file("run", file, &text_n))) return 1;
        prompt = owned;
    } else {
        text_n = strlen(prompt);
    }
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_tokenizer *tok = NULL;
    int32_t *ids = NULL, *full = NULL;
    size_t n_ids = 0;
    ds_grammar *grammar = NULL;
    ds_vocab_trie *trie = NULL;
    if (cli_load_model_tok("run", dir, &bo, &m, &tok)) goto out;
    if (chat) {
        ds_chat_msg msg = {0};
        msg.role = DS_CHAT_ROLE_USER;
        msg.content = prompt;
        ds_chat_opts co = {0};
        co.thinking = think;
        if (strlen(prompt) != text_n) {
            fprintf(stderr, "dsv4 run: --chat: the prompt holds a NUL byte\n");
            goto out;
        }
        if (ds_chat_tokenize(tok, &msg, 1, &co, parse_special, &ids, &n_ids, &err)) goto fail;
    } else {
        if (ds_tokenizer_encode(tok, prompt, text_n, DS_TOK_PARSE_ALL, &ids, &n_ids, &err)) goto fail;
    }
    int bos = !chat && !raw;
    full = malloc((n_ids + 1) * sizeof *full);
    if (!full) {
        fprintf(stderr, "dsv4 run: out of memory\n");
        goto out;
    }
    if (bos) full[0] = cli_bos_id(m, tok);
    if (n_ids) memcpy(full + bos, ids, n_ids * sizeof *ids);
    int n_full = (int)n_ids + bos;
    if (n_full < 1) {
        fprintf(stderr, "dsv4 run: the prompt is empty and --raw leaves no BOS: nothing to continue\n");
        goto out;
    }
    m->bind_mtp = o.mtp > 0;
    int brc = cli_bind("run", m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    ds_gen_params gp;
    ds_gen_params_init(&gp);
    if (ra.json_schema) {
        if (cli_load_schema("run", ra.json_schema, tok, &grammar, &trie)) goto out;
        gp.grammar = grammar;
        gp.trie = trie;
        if (chat && think) gp.grammar_after = ds_tokenizer_token_id(tok, DS_CHAT_THINK_END);
    }
    gp.sampling = sp;
    gp.max_new = (int)ra.n;
    gp.prefill_chunk = (int)o.chunk;
    gp.detok_flags = special ? 0 : DS_DECODE_SKIP_SPECIAL;
    gp.mtp = (int)o.mtp;
    if (gp.mtp && !m->mtp_model)
        fprintf(stderr, "dsv4 run: --mtp %d: no MTP block (%s); running without speculation\n", gp.mtp,
                m->mtp ? "not under expert parallelism" : m->mtp_off);
    run_out ro = {0, 1};
    ds_gen_result res;
    if (ds_generate(m, &be, tok, NULL, full, n_full, 0, &gp, run_cb, &ro, &res, &err)) goto fail;
    if (ro.failed) {
        fprintf(stderr, "dsv4 run: cannot write to standard output\n");
        goto out;
    }
    if (!ro.ends_nl && isatty(STDOUT_FILENO)) fputc('\n', stdout);
    fflush(stdout);
    if (res.at_max_pos)
        fprintf(stderr, "dsv4 run: stopped at the model's max_position_embeddings (%lld tokens)\n",
                (long long)m->cfg.max_pos);
    fprintf(stderr, "prompt: %d tokens, %.3f s, %.1f tokens/s\n", res.n_prompt, res.prompt_s,
            rate(res.n_prompt, res.prompt_s));
    fprintf(stderr, "generated: %d tokens%s, %.3f s, %.1f tokens/s\n", res.n_gen,
            res.stop_token >= 0 ? " (end of sentence)" : "", res.gen_s, rate(res.n_gen, res.gen_s));
    if (res.mtp_steps)
        fprintf(stderr, "mtp: %d steps, %d of %d drafts accepted, %.2f tokens a step\n", res.mtp_steps,
                res.mtp_accepted, res.mtp_drafted, (double)(res.mtp_steps + res.mtp_accepted) / res.mtp_steps);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dsv4 run: %s\n", err.msg);
out:
    ds_grammar_free(grammar);
    ds_vocab_trie_free(trie);
    free(full);
    free(ids);
    free(owned);
    ds_tokenizer_free(tok);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}

/* ----------------------------------------------------------------- dsv4 chat */

typedef struct {
    const char *system;
    long long n, ctx; /* n: -1 until given */
    int think, verbose, no_cache, parse_special;
} chat_args;

static const cli_opt chat_opts[] = {
    CLI_FLAG_OPT("--think", NULL, chat_args, think, "thinking mode: the reply starts with its reasoning, then </think>"),
    CLI_STRING_OPT("--system", NULL, chat_args, system, "TEXT", "a system message at the start of the conversation"),
    CLI_LONG_OPT("-n", NULL, chat_args, n, 0, 1 << 24, "N", "tokens per reply at most (default: until the context is full)"),
    CLI_LONG_OPT("--ctx", NULL, chat_args, ctx, 2, 1 << 24, "N",
                 "context capacity in tokens for the whole conversation (default 4096)"),
    CLI_FLAG_OPT("--verbose", NULL, chat_args, verbose, "per turn: tokens, cached prefix and speed on standard error"),
    CLI_FLAG_OPT("--no-cache", NULL, chat_args, no_cache, "prefill the whole conversation every turn (same replies, slower)"),
    CLI_FLAG_OPT("--parse-special", NULL, chat_args, parse_special,
                 "special-token strings typed in a message become control tokens (default: what is typed is plain "
                 "text and cannot forge a turn)"),
    CLI_END,
};

static const char CHAT_ABOUT[] =
    "Interactive chat on standard input / output with the DeepSeek-V4 chat template: each input line\n"
    "is a user message; the reply is streamed until the end-of-sentence token. Ends at end of input or\n"
    "on the line /exit; /reset starts a new conversation. A message beyond the context (--ctx) is\n"
    "refused and the conversation goes on (the exit status is then 1).\n";
static const char CHAT_NOTES[] =
    "The sequence state is kept between turns: when the new turn's encoding extends the tokens already\n"
    "in it, only the new tokens are prefilled; otherwise (earlier reasoning dropped in thinking mode, a\n"
    "reply that re-tokenizes differently) the conversation is prefilled again. Either way the reply is\n"
    "the same. With --mtp K a turn speculates when its conversation is prefilled whole (the first turn,\n"
    "or --no-cache): a kept sequence has no MTP block state for its prefix. The reply is the same.\n";

typedef struct {
    ds_chat_role role;
    char *content, *reasoning;
} chat_turn;

typedef struct {
    int32_t *ids;
    int n, cap;
    int failed;
} chat_reply;

static int chat_cb(void *ctx, int32_t token, int is_stop, const char *text, size_t n) {
    chat_reply *r = ctx;
    (void)is_stop;
    if (token >= 0) {
        if (r->n == r->cap) {
            int nc = r->cap ? r->cap * 2 : 256;
            int32_t *ni = realloc(r->ids, (size_t)nc * sizeof *ni);
            if (!ni) {
                r->failed = 2;
                return 1;
            }
            r->ids = ni;
            r->cap = nc;
        }
        r->ids[r->n++] = token;
    }
    if (n && (fwrite(text, 1, n, stdout) != n || fflush(stdout))) {
        r->failed = 1;
        return 1;
    }
    return 0;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void free_turns(chat_turn *t, int n) {
    for (int i = 0; i < n; i++) {
        free(t[i].content);
        free(t[i].reasoning);
    }
}

int cmd_chat(int argc, char **argv) {
    chat_args ca = {.n = -1, .ctx = 4096};
    cli_model_arg ma = {0};
    gen_opts o = {0};
    ds_sampling sp;
    sampling_init(&sp);
    ds_backend_opts bo = {0};
    const cli_group groups[] = {{NULL, cli_model_opts, &ma},
                                {NULL, chat_opts, &ca},
                                {"sampling", cli_sampling_opts, &sp},
                                {SPEED, gen_chunk_opts, &o},
                                {SPEED, gen_mtp_opts, &o},
                                {SPEED, cli_threads_opts, &bo},
                                {SPEED, cli_load_opts, &bo},
                                {CLI_TIER_TITLE, cli_tier_opts, &bo},
                                {CLI_EP_TITLE, cli_ep_opts, ds_ep_session_opts()}};
    const cli_cmd cmd = {"chat", "[-m DIR] [--think] [--system TEXT] [-n N] [--ctx N] [--verbose] [--no-cache] "
                                 "[--parse-special] [--mtp K] [sampling options]",
                         CHAT_ABOUT, CHAT_NOTES, groups, (int)(sizeof groups / sizeof groups[0])};
    int rc = 1;
    if (cli_parse(&cmd, argc, argv, &rc)) return rc;
    const char *system = ca.system;
    int think = ca.think, verbose = ca.verbose, no_cache = ca.no_cache, parse_special = ca.parse_special, dropped = 0;
    long long ctx = ca.ctx;
    ds_err err = {{0}};
    if (ds_sampling_validate(&sp, &err)) return cli_usage_error(&cmd, "%s", err.msg);
    char dir[4096];
    if (cli_model_dir("chat", ma.dir, dir, sizeof dir)) return 1;

    ds_model *m = NULL;
    ds_backend be = {0};
    ds_tokenizer *tok = NULL;
    ds_seq *seq = NULL;
    chat_turn *turns = NULL;
    ds_chat_msg *msgs = NULL;
    int n_turns = 0, cap_turns = 0;
    int32_t *ctx_ids = NULL, *ids = NULL; /* ctx_ids: the tokens in seq */
    size_t n_ids = 0;
    int n_ctx = 0;
    char *line = NULL, *reply_text = NULL;
    size_t line_cap = 0;
    chat_reply reply = {0};
    if (cli_load_model_tok("chat", dir, &bo, &m, &tok)) goto out;
    m->bind_mtp = o.mtp > 0;
    int brc = cli_bind("chat", m, &bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    if (ds_seq_new(m, ctx, &seq, &err)) goto fail;
    if (!(ctx_ids = malloc((size_t)ctx * sizeof *ctx_ids))) goto oom;
    int tty = isatty(STDIN_FILENO);
    if (system) {
        if (!(turns = malloc(4 * sizeof *turns))) goto oom;
        cap_turns = 4;
        turns[0] = (chat_turn){DS_CHAT_ROLE_SYSTEM, dup_str(system), NULL};
        if (!turns[0].content) goto oom;
        n_turns = 1;
    }
    int n_keep = n_turns; /* /reset keeps the system message */
    for (;;) {
        if (tty) fprintf(stderr, "> ");
        ssize_t ln = getline(&line, &line_cap, stdin);
        if (ln < 0) break;
        while (ln > 0 && (line[ln - 1] == '\n' || line[ln - 1] == '\r')) line[--ln] = 0;
        if ((size_t)ln != strlen(line)) {
            fprintf(stderr, "dsv4 chat: input line holds a NUL byte; ignored\n");
            continue;
        }
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            free_turns(turns + n_keep, n_turns - n_keep);
            n_turns = n_keep;
            ds_seq_reset(seq);
            n_ctx = 0;
            continue;
        }
        if (!ln) continue;
        if (n_turns + 2 > cap_turns) {
            int nc = cap_turns ? cap_turns * 2 : 8;
            chat_turn *nt = realloc(turns, (size_t)nc * sizeof *nt);
            if (!nt) goto oom;
            turns = nt;
            cap_turns = nc;
        }
        turns[n_turns] = (chat_turn){DS_CHAT_ROLE_USER, dup_str(line), NULL};
        if (!turns[n_turns].content) goto oom;
        n_turns++;

        /* encode the whole conversation */
        free(msgs);
        if (!(msgs = calloc((size_t)n_turns, sizeof *msgs))) goto oom;
        for (int i = 0; i < n_turns; i++) {
            msgs[i].role = turns[i].role;
            msgs[i].content = turns[i].content;
            msgs[i].reasoning_content = turns[i].reasoning;
        }
        ds_chat_opts co = {0};
        co.thinking = think;
        free(ids);
        ids = NULL;
        if (ds_chat_tokenize(tok, msgs, (size_t)n_turns, &co, parse_special, &ids, &n_ids, &err)) goto fail;
        if (n_ids + 1 > (size_t)ctx) {
            fprintf(stderr,
                    "dsv4 chat: the conversation is %zu tokens, beyond the context of %lld (--ctx); "
                    "/reset or raise --ctx\n",
                    n_ids, ctx);
            /* the message is dropped; the conversation so far stays, so /reset (or a
             * shorter message) can go on */
            n_turns--;
            free(turns[n_turns].content);
            dropped = 1;
            continue;
        }
        /* reuse the sequence if it holds a prefix of the new encoding */
        int cached = 0;
        if (!no_cache && n_ctx > 0 && (size_t)n_ctx < n_ids && !memcmp(ctx_ids, ids, (size_t)n_ctx * sizeof *ids))
            cached = n_ctx;
        if (!cached && seq->pos) ds_seq_reset(seq);

        ds_gen_params gp;
        ds_gen_params_init(&gp);
        gp.sampling = sp;
        long long room = ctx - (long long)n_ids + 1;
        gp.max_new = (int)(ca.n >= 0 && ca.n < room ? ca.n : room);
        gp.prefill_chunk = (int)o.chunk;
        gp.detok_flags = DS_DECODE_SKIP_SPECIAL;
        gp.mtp = (int)o.mtp;
        reply.n = 0;
        ds_gen_result res;
        if (ds_generate(m, &be, tok, seq, ids, (int)n_ids, cached, &gp, chat_cb, &reply, &res, &err)) {
            ds_seq_reset(seq);
            n_ctx = 0;
            goto fail;
        }
        if (reply.failed) {
            fprintf(stderr, reply.failed == 2 ? "dsv4 chat: out of memory\n"
                                              : "dsv4 chat: cannot write to standard output\n");
            goto out;
        }
        fputc('\n', stdout);
        fflush(stdout);
        if (res.at_max_pos)
            fprintf(stderr, "dsv4 chat: the reply stopped at the model's max_position_embeddings (%lld tokens); "
                            "/reset to go on\n", (long long)m->cfg.max_pos);
        /* the tokens now in the sequence: the prompt + every reply token but the last */
        memcpy(ctx_ids, ids, n_ids * sizeof *ids);
        n_ctx = (int)n_ids;
        if (reply.n > 1) memcpy(ctx_ids + n_ctx, reply.ids, (size_t)(reply.n - 1) * sizeof *ids);
        n_ctx += reply.n > 0 ? reply.n - 1 : 0;
        if (seq->pos != n_ctx) { /* cannot happen; be safe rather than wrong */
            ds_seq_reset(seq);
            n_ctx = 0;
        }
        if (verbose)
            fprintf(stderr, "[prompt %zu tokens (%d cached): %.1f tokens/s; reply %d tokens%s: %.1f tokens/s]\n",
                    n_ids, cached, rate(res.n_prompt, res.prompt_s), res.n_gen,
                    res.stop_token >= 0 ? "" : " (no end of sentence)", rate(res.n_gen, res.gen_s));
        if (verbose && res.mtp_steps)
            fprintf(stderr, "[mtp: %d steps, %d of %d drafts accepted]\n", res.mtp_steps, res.mtp_accepted,
                    res.mtp_drafted);

        /* store the reply: parsed when it is a complete message */
        size_t rn;
        free(reply_text);
        reply_text = NULL;
        if (ds_tokenizer_decode(tok, reply.ids, (size_t)reply.n, DS_DECODE_LOSSY, &reply_text, &rn, &err))
            goto fail;
        ds_chat_reply pr;
        chat_turn t = {DS_CHAT_ROLE_ASSISTANT, NULL, NULL};
        if (!ds_chat_parse(reply_text, rn, think, &pr, &err)) {
            t.content = pr.content;
            t.reasoning = think ? pr.reasoning : NULL;
            if (!think) free(pr.reasoning);
            pr.content = pr.reasoning = NULL;
            ds_chat_reply_free(&pr);
        } else {
            /* cut by -n / --ctx: expected; with its end-of-sentence: malformed */
            if (res.stop_token >= 0)
                fprintf(stderr, "dsv4 chat: the reply is not a well-formed message (%s); kept as plain text\n",
                        err.msg);
            free(reply_text);
            reply_text = NULL;
            int nr = reply.n - (res.stop_token >= 0);
            if (ds_tokenizer_decode(tok, reply.ids, (size_t)nr, DS_DECODE_LOSSY | DS_DECODE_SKIP_SPECIAL,
                                    &reply_text, &rn, &err))
                goto fail;
            t.content = reply_text;
            reply_text = NULL;
        }
        if (!t.content) goto oom;
        turns[n_turns++] = t;
    }
    rc = dropped; /* 1 if a message was refused for the context */
    goto out;
oom:
    fprintf(stderr, "dsv4 chat: out of memory\n");
    goto out;
fail:
    fprintf(stderr, "dsv4 chat: %s\n", err.msg);
out:
    free_turns(turns, n_turns);
    free(turns);
    free(msgs);
    free(ctx_ids);
    free(ids);
    free(line);
    free(reply_text);
    free(reply.ids);
    ds_seq_free(seq);
    ds_tokenizer_free(tok);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
