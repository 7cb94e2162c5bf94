/* test_scheduler.c — the continuous-batching scheduler against ds_generate
 * (one request at a time, no scheduler) on the bundled model: requests of
 * different lengths and seeds, submitted together with a small step budget
 * (so prompts are chunked and mixed with decodes), give exactly the tokens
 * ds_generate gives each alone; a request that extends a finished one
 * reuses its sequence and still gets the same tokens and log-probabilities
 * bit for bit as with reuse off; a full queue refuses; cancel ends a request;
 * with a masked suffix (a vocabulary padded past the tokenizer's) the
 * draws over the live prefix give the tokens of a plain loop that masks
 * every id over the whole vocabulary.
 * Also the OpenAI text layer: plain-text rule, stop strings, thinking split,
 * DSML tool calls parsed back. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "model/forward.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/openai_chat.h"
#include "runtime/scheduler.h"
#include "testutil.h"

#define NREQ 6

typedef struct {
    int32_t ids[256];
    int n;
} gen_out;

static int collect(void *ctx, int32_t token, int is_stop, const char *text, size_t n) {
    gen_out *o = ctx;
    (void)is_stop, (void)text, (void)n;
    if (token >= 0 && o->n < 256) o->ids[o->n++] = token;
    return 0;
}

/* 1 when a request's n tokens are the ids ds_generate gave. */
static int same_tokens(const ds_req_token *out, int n, const gen_out *ref) {
    int same = n == ref->n;
    for (int k = 0; same && k < n; k++) same = out[k].id == ref->ids[k];
    return same;
}

static void run_all(ds_sched *s, int32_t *const *prompts, const int *np, const ds_req_params *rp, int n,
                    ds_req_token (*out)[64], int *n_out, ds_req_info *info) {
    ds_req *r[NREQ];
    for (int i = 0; i < n; i++) {
        ds_err err;
        int rc = ds_sched_submit(s, prompts[i], np[i], &rp[i], &r[i], &err);
        CHECK(rc == 0, "submit %d: %d %s", i, rc, rc < 0 ? err.msg : "");
    }
    for (int i = 0; i < n; i++) {
        for (;;) {
            ds_req_wait(r[i], 1 << 30, 5.0, &info[i]);
            if (info[i].state >= DS_REQ_DONE_STOP) break;
        }
        n_out[i] = info[i].n_out;
        ds_req_tokens(r[i], 0, info[i].n_out, out[i]);
        ds_req_release(r[i]);
    }
}

/* The reference for masked ids: one request alone, its prompt whole then a
 * token a step, every masked id -inf over all V logits, ds_sample over V. */
static int masked_ref(const ds_model *m, const ds_backend *be, const int32_t *prompt, int np, const ds_req_params *rp,
                      const int32_t *mask, int n_mask, gen_out *o, ds_err *err) {
    int V = m->cfg.vocab_size, n_hist = np, rc = -1;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(np + rp->max_new));
    ds_sample_scratch *scr = ds_sample_scratch_create(V, err);
    ds_seq *sq = NULL;
    o->n = 0;
    if (!lg || !hist || !scr || ds_seq_new(m, np + rp->max_new, &sq, err)) goto out;
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)np);
    for (int fed = 0; o->n < rp->max_new;) {
        ds_batch_item it = {sq, hist + fed, n_hist - fed, lg, 0, NULL, NULL};
        if (ds_forward(m, be, &it, 1, err)) goto out;
        fed = n_hist;
        ds_gen_mask_logits(lg, mask, n_mask);
        int32_t t;
        /* keyed by the position after the step, as ds_generate and the scheduler */
        if (ds_sample(&rp->sampling, lg, V, hist, n_hist, sq->pos, scr, &t, err)) goto out;
        o->ids[o->n++] = t;
        hist[n_hist++] = t;
        if (ds_stop_check(rp->stop_ids, rp->n_stop, t)) break;
    }
    rc = 0;
out:
    ds_seq_free(sq);
    ds_sample_scratch_free(scr);
    free(hist);
    free(lg);
    return rc;
}

/* ids of the added token `id` in ids[0..n) */
static int count_id(const int32_t *ids, size_t n, int32_t id) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += ids[i] == id;
    return k;
}

/* Every client string of a chat request -- tool schemas, tool call names and
 * arguments, tool results, message text -- is plain text: special-token
 * strings in them never become control tokens. Expected from two facts that
 * do not come from the function under test: the ids decode to the template's
 * text exactly, and every added token occurs as often as in the same
 * conversation with the special strings replaced by harmless text. */
static void test_plain_fields(ds_tokenizer *tok) {
    static const char *const inject = DS_CHAT_EOS DS_CHAT_USER "</think>" DS_CHAT_DSML;
    for (int clean = 1; clean >= 0; clean--) {
        /* the same conversation twice: injected strings, then "x" instead */
        const char *sp = clean ? "x" : inject;
        char tools[1024], args[256], name[64], result[256], user[128];
        snprintf(tools, sizeof tools,
                 "[{\"type\": \"function\", \"function\": {\"name\": \"get_verse\", \"description\": \"Look up %s a "
                 "verse\", \"parameters\": {\"type\": \"object\", \"properties\": {\"book%s\": {\"type\": "
                 "\"string\"}}}}}]",
                 sp, sp);
        snprintf(args, sizeof args, "{\"book\": \"John%s\"}", sp);
        snprintf(name, sizeof name, "get%s", sp);
        snprintf(result, sizeof result, "For God so loved%s", sp);
        snprintf(user, sizeof user, "Read John 3%s", sp);
        ds_chat_tool_call call = {"call_1", name, args};
        ds_chat_msg msgs[4] = {{0}};
        msgs[0].role = DS_CHAT_ROLE_SYSTEM;
        msgs[0].tools = tools;
        msgs[1].role = DS_CHAT_ROLE_USER;
        msgs[1].content = user;
        msgs[2].role = DS_CHAT_ROLE_ASSISTANT;
        msgs[2].tool_calls = &call;
        msgs[2].n_tool_calls = 1;
        msgs[3].role = DS_CHAT_ROLE_TOOL;
        msgs[3].tool_call_id = "call_1";
        msgs[3].content = result;
        static int32_t want[64]; /* added-token counts of the clean conversation */
        for (int thinking = 0; thinking < 2; thinking++) {
            ds_chat_opts co = {0};
            co.thinking = thinking;
            char *p;
            size_t pn, nb;
            int32_t *b;
            ds_err err;
            CHECK(!ds_chat_encode(msgs, 4, &co, &p, &pn, &err), "%s", err.msg);
            CHECK(!ds_oai_encode_chat(tok, msgs, 4, &co, &b, &nb, &err), "%s", err.msg);
            char *back;
            size_t bn;
            CHECK(!ds_tokenizer_decode(tok, b, nb, 0, &back, &bn, &err), "%s", err.msg);
            CHECK(bn == pn && !memcmp(back, p, pn), "tool fields: ids decode to the prompt text");
            int V = ds_tokenizer_vocab_size(tok), k = 0;
            for (int32_t id = 0; id < V && k < 32; id++) {
                if (!ds_tokenizer_is_added(tok, id)) continue;
                int c = count_id(b, nb, id);
                if (clean) want[thinking * 32 + k] = c;
                else
                    CHECK(c == want[thinking * 32 + k], "thinking %d: added token %d occurs %d times, %d in the template",
                          thinking, id, c, want[thinking * 32 + k]);
                k++;
            }
            free(back), free(p), free(b);
        }
    }
}

static void test_openai_text(ds_tokenizer *tok) {
    /* plain-text rule: normal messages tokenize exactly as the template with
     * every added token parsed; a user's "<｜User｜>" stays text */
    ds_chat_msg msgs[3] = {{0}};
    msgs[0].role = DS_CHAT_ROLE_SYSTEM;
    msgs[0].content = "You are a scribe.";
    msgs[1].role = DS_CHAT_ROLE_USER;
    msgs[1].content = "In the beginning";
    ds_chat_opts co = {0};
    char *p;
    size_t pn, na, nb;
    int32_t *a, *b;
    ds_err err;
    CHECK(!ds_chat_encode(msgs, 2, &co, &p, &pn, &err), "%s", err.msg);
    CHECK(!ds_tokenizer_encode(tok, p, pn, DS_TOK_PARSE_ALL, &a, &na, &err), "%s", err.msg);
    CHECK(!ds_oai_encode_chat(tok, msgs, 2, &co, &b, &nb, &err), "%s", err.msg);
    CHECK(na == nb && !memcmp(a, b, na * sizeof *a), "plain chat: %zu vs %zu tokens", na, nb);
    free(p), free(a), free(b);
    msgs[1].content = "say " DS_CHAT_USER " and " DS_CHAT_EOS;
    int32_t user = ds_tokenizer_token_id(tok, DS_CHAT_USER), eos = ds_tokenizer_eos_id(tok);
    CHECK(!ds_oai_encode_chat(tok, msgs, 2, &co, &b, &nb, &err), "%s", err.msg);
    int n_user = 0, n_eos = 0;
    for (size_t i = 0; i < nb; i++) n_user += b[i] == user, n_eos += b[i] == eos;
    CHECK(n_user == 1 && n_eos == 0, "control tokens from user text: %d User, %d EOS", n_user, n_eos);
    free(b);
    test_plain_fields(tok);

    /* stop strings across pushes; the text before the stop is kept */
    const char *stops[] = {"LORD"};
    ds_oai_text t;
    ds_oai_text_init(&t, 0, 0, stops, 1);
    CHECK(ds_oai_text_push(&t, "and the LO", 10) == 0, "no stop yet");
    const char *r, *c;
    size_t rn, cn;
    ds_oai_text_deltas(&t, &r, &rn, &c, &cn);
    CHECK(cn == 7 && !memcmp(c, "and the", 7), "held back a possible stop prefix: %zu", cn);
    CHECK(ds_oai_text_push(&t, "RD said", 7) == 1, "stop found across pushes");
    ds_oai_text_end(&t);
    ds_oai_text_deltas(&t, &r, &rn, &c, &cn);
    CHECK(cn == 1 && c[0] == ' ' && t.n_raw == 8, "text ends before the stop: %zu", t.n_raw);
    ds_oai_text_free(&t);

    /* thinking split and DSML tool calls (format of the V4 encoder) */
    const char *gen = "let me look</think>Checking.\n\n<" DS_CHAT_DSML "tool_calls>\n<" DS_CHAT_DSML
                      "invoke name=\"get_verse\">\n<" DS_CHAT_DSML "parameter name=\"book\" string=\"true\">John</"
                      DS_CHAT_DSML "parameter>\n</" DS_CHAT_DSML "invoke>\n</" DS_CHAT_DSML "tool_calls>";
    ds_oai_text_init(&t, 1, 1, NULL, 0);
    size_t gl = strlen(gen), half = 14; /* splits "</think>" */
    ds_oai_text_push(&t, gen, half);
    ds_oai_text_deltas(&t, &r, &rn, &c, &cn);
    CHECK(rn == 11 && !memcmp(r, "let me look", 11) && cn == 0, "reasoning before </think>: %zu/%zu", rn, cn);
    ds_oai_text_push(&t, gen + half, gl - half);
    ds_oai_text_end(&t);
    ds_oai_text_deltas(&t, &r, &rn, &c, &cn);
    CHECK(rn == 0 && cn == 9 && !memcmp(c, "Checking.", 9), "content up to the tool calls: %zu", cn);
    cJSON *msg = cJSON_CreateObject();
    int nc = ds_oai_text_message(&t, 1, "abc", msg);
    CHECK(nc == 1, "one tool call, got %d", nc);
    cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    cJSON *fn = cJSON_GetObjectItem(call, "function");
    CHECK(call && !strcmp(cJSON_GetObjectItem(call, "id")->valuestring, "call_abc_0") &&
              !strcmp(cJSON_GetObjectItem(fn, "name")->valuestring, "get_verse") &&
              !strcmp(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"book\": \"John\"}"),
          "tool call fields");
    CHECK(!strcmp(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "let me look") &&
              !strcmp(cJSON_GetObjectItem(msg, "content")->valuestring, "Checking."),
          "message fields");
    cJSON_Delete(msg);
    ds_oai_text_free(&t);

    /* two calls in one block; with one_call (parallel_tool_calls false) the first only */
    const char *two = "\n\n<" DS_CHAT_DSML "tool_calls>\n<" DS_CHAT_DSML "invoke name=\"a\">\n\n</" DS_CHAT_DSML
                      "invoke>\n<" DS_CHAT_DSML "invoke name=\"b\">\n<" DS_CHAT_DSML
                      "parameter name=\"n\" string=\"false\">2</" DS_CHAT_DSML "parameter>\n</" DS_CHAT_DSML
                      "invoke>\n</" DS_CHAT_DSML "tool_calls>";
    for (int one = 0; one < 2; one++) {
        ds_oai_text_init(&t, 1, 0, NULL, 0);
        t.one_call = one;
        ds_oai_text_push(&t, two, strlen(two));
        ds_oai_text_end(&t);
        msg = cJSON_CreateObject();
        nc = ds_oai_text_message(&t, 1, "abc", msg);
        cJSON *calls = cJSON_GetObjectItem(msg, "tool_calls");
        cJSON *c1 = cJSON_GetArrayItem(calls, 1);
        CHECK(nc == (one ? 1 : 2) && cJSON_GetArraySize(calls) == nc &&
                  cJSON_IsNull(cJSON_GetObjectItem(msg, "content")),
              "one_call %d: %d calls", one, nc);
        if (!one)
            CHECK(c1 && !strcmp(cJSON_GetObjectItem(c1, "id")->valuestring, "call_abc_1") &&
                      !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(c1, "function"), "arguments")->valuestring,
                              "{\"n\": 2}"),
                  "the second call");
        cJSON_Delete(msg);
        ds_oai_text_free(&t);
    }
}

int main(void) {
    char dir[4096];
    test_path(dir, sizeof dir, "models/kjv");
    ds_model *m = NULL;
    ds_tokenizer *tok = NULL;
    ds_err err;
    ds_backend be;
    if (test_load(dir, 0, &m, &be, &err) || ds_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    test_openai_text(tok);

    /* requests: prompts of 1..~90 tokens, different seeds / temperatures / lengths */
    static const char *texts[NREQ] = {
        "And God said",
        "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
        "darkness was upon the face of the deep.",
        "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me "
        "beside the still waters. He restoreth my soul: he leadeth me in the paths of righteousness for his "
        "name's sake.",
        "Blessed are",
        "And it came to pass",
        "For God so loved the world, that he gave his only begotten Son",
    };
    int32_t *prompts[NREQ];
    int np[NREQ];
    ds_req_params rp[NREQ];
    for (int i = 0; i < NREQ; i++) {
        int32_t *ids;
        size_t n;
        CHECK(!ds_tokenizer_encode(tok, texts[i], strlen(texts[i]), DS_TOK_PARSE_NONE, &ids, &n, &err), "%s",
              err.msg);
        prompts[i] = malloc((n + 1) * sizeof *ids);
        prompts[i][0] = ds_tokenizer_bos_id(tok);
        memcpy(prompts[i] + 1, ids, n * sizeof *ids);
        np[i] = (int)n + 1;
        free(ids);
        memset(&rp[i], 0, sizeof rp[i]);
        ds_sampling_init(&rp[i].sampling);
        rp[i].sampling.temperature = i % 3 == 0 ? 0 : 0.8;
        rp[i].sampling.top_p = i == 2 ? 0.9 : 1;
        rp[i].sampling.seed = 1000 + (uint64_t)i;
        rp[i].max_new = 8 + 5 * i;
        rp[i].stop_ids[0] = ds_tokenizer_eos_id(tok);
        rp[i].n_stop = 1;
        rp[i].top_logprobs = i == 1 ? 3 : -1;
    }

    /* reference: ds_generate, one request at a time */
    gen_out ref[NREQ];
    for (int i = 0; i < NREQ; i++) {
        ds_gen_params gp;
        ds_gen_params_init(&gp);
        gp.sampling = rp[i].sampling;
        gp.max_new = rp[i].max_new;
        ref[i].n = 0;
        CHECK(!ds_generate(m, &be, NULL, NULL, prompts[i], np[i], 0, &gp, collect, &ref[i], NULL, &err), "%s",
              err.msg);
    }

    /* all together: 4 running at most, 12 tokens per step, chunks of 5 */
    ds_sched_opts o;
    ds_sched_opts_init(&o);
    o.max_seqs = 4;
    o.step_tokens = 12;
    o.prefill_chunk = 5;
    o.ctx = 256;
    o.cache_seqs = 2;
    ds_sched *s;
    CHECK(!ds_sched_start(m, &be, &o, &s, &err), "%s", err.msg);
    static ds_req_token out[NREQ][64];
    int n_out[NREQ];
    ds_req_info info[NREQ];
    run_all(s, prompts, np, rp, NREQ, out, n_out, info);
    for (int i = 0; i < NREQ; i++) {
        CHECK(same_tokens(out[i], n_out[i], &ref[i]), "request %d: scheduler tokens differ from ds_generate (%d vs %d tokens)",
              i, n_out[i], ref[i].n);
        CHECK(info[i].state == (n_out[i] < rp[i].max_new ? DS_REQ_DONE_STOP : DS_REQ_DONE_LENGTH), "request %d state %d",
              i, info[i].state);
    }
    CHECK(out[1][0].n_top == 3 && out[1][0].top_logprob[0] >= out[1][0].top_logprob[1] &&
              out[1][0].logprob <= 0,
          "logprobs filled");

    /* the same through a backend that lends the scheduler no threads (host_for
     * NULL, as on CUDA): the draws run on the scheduler's OpenMP team instead
     * of the backend's pool, with the same tokens */
    {
        ds_backend nb = be;
        nb.host_for = NULL;
        nb.host_threads = NULL;
        ds_sched_opts o2 = o;
        o2.threads = 2;
        ds_sched *s2;
        CHECK(!ds_sched_start(m, &nb, &o2, &s2, &err), "%s", err.msg);
        static ds_req_token out2[NREQ][64];
        int n_out2[NREQ];
        ds_req_info info2[NREQ];
        run_all(s2, prompts, np, rp, NREQ, out2, n_out2, info2);
        for (int i = 0; i < NREQ; i++)
            CHECK(same_tokens(out2[i], n_out2[i], &ref[i]),
                  "request %d without the backend's threads: tokens differ from ds_generate (%d vs %d tokens)", i,
                  n_out2[i], ref[i].n);
        ds_sched_stop(s2);
    }

    /* prefix reuse: request 5's prompt + its output + more text extends the sequence it left */
    int32_t ext[512];
    int ne = 0;
    memcpy(ext, prompts[5], (size_t)np[5] * sizeof *ext);
    ne = np[5];
    for (int k = 0; k < n_out[5]; k++) ext[ne++] = out[5][k].id;
    for (int k = 0; k < np[3] - 1; k++) ext[ne++] = prompts[3][k + 1];
    int32_t *ep[1] = {ext};
    ds_req_params erp = rp[5];
    erp.top_logprobs = 2;
    erp.sampling.temperature = 0.8;
    erp.max_new = 10;
    ds_req_token eout[2][64];
    int en[2];
    ds_req_info einfo[2];
    run_all(s, ep, &ne, &erp, 1, &eout[0], &en[0], &einfo[0]);
    CHECK(einfo[0].n_cached == np[5] + n_out[5] - 1, "cached prefix: %d tokens (expected %d)", einfo[0].n_cached,
          np[5] + n_out[5] - 1);
    ds_sched_stop(s);
    o.cache_seqs = 0;
    CHECK(!ds_sched_start(m, &be, &o, &s, &err), "%s", err.msg);
    run_all(s, ep, &ne, &erp, 1, &eout[1], &en[1], &einfo[1]);
    CHECK(einfo[1].n_cached == 0, "no reuse with cache-seqs 0");
    CHECK(en[0] == en[1] && !memcmp(eout[0], eout[1], (size_t)en[0] * sizeof eout[0][0]),
          "reused prefix: tokens and log-probabilities differ from a fresh prefill");

    /* n choices (ds_sched_submit_n, seeds 1000+i): each equals ds_generate alone with its seed */
    {
        ds_req_params np3[3];
        ds_req *rs[3];
        for (int i = 0; i < 3; i++) {
            np3[i] = rp[1];
            np3[i].top_logprobs = -1;
            np3[i].sampling.seed = 1000 + (uint64_t)i;
        }
        CHECK(!ds_sched_submit_n(s, prompts[1], np[1], np3, 3, rs, &err), "%s", err.msg);
        int have[3] = {0, 0, 0}, ended = 0;
        ds_req_info ri[3];
        while (ended < 3) {
            int i = ds_req_wait_any(rs, have, 3, 5.0);
            CHECK(i >= -1 && i < 3, "wait_any: %d", i);
            if (i < 0) continue;
            have[i] = ds_req_wait(rs[i], have[i], 0, &ri[i]);
            if (ri[i].state >= DS_REQ_DONE_STOP) have[i] = -1, ended++;
        }
        for (int i = 0; i < 3; i++) {
            ds_gen_params gp;
            ds_gen_params_init(&gp);
            gp.sampling = np3[i].sampling;
            gp.max_new = np3[i].max_new;
            gen_out g = {{0}, 0};
            CHECK(!ds_generate(m, &be, NULL, NULL, prompts[1], np[1], 0, &gp, collect, &g, NULL, &err), "%s", err.msg);
            ds_req_token got[64];
            ds_req_tokens(rs[i], 0, ri[i].n_out, got);
            int same = ri[i].n_out == g.n;
            for (int k = 0; same && k < g.n; k++) same = got[k].id == g.ids[k];
            CHECK(same, "choice %d of 3: tokens differ from ds_generate with seed %d", i, 1000 + i);
            ds_req_release(rs[i]);
        }
    }

    /* forced tokens: at the start, the reply is F then what the model
     * generates after prompt + F; after a trigger token, the tokens up to the
     * trigger, then F, then what follows prompt + those + F */
    {
        const int32_t F[3] = {prompts[2][3], prompts[2][4], prompts[2][5]};
        for (int mode = 0; mode < 2; mode++) {
            int32_t pre[512];
            int n_pre = np[0], j = -1;
            memcpy(pre, prompts[0], (size_t)np[0] * sizeof *pre);
            ds_req_params fp = rp[0]; /* greedy */
            fp.max_new = 20;
            fp.n_stop = 0;
            fp.n_force = 3;
            memcpy(fp.force, F, sizeof F);
            fp.force_after = -1;
            if (mode == 1) { /* the trigger: ref[0]'s first token not seen before it */
                for (int k = 1; k < ref[0].n && j < 0; k++) {
                    j = k;
                    for (int q = 0; q < k; q++)
                        if (ref[0].ids[q] == ref[0].ids[k]) j = -1;
                }
                CHECK(j > 0, "no trigger token in the reference output");
                if (j < 0) break;
                fp.force_after = ref[0].ids[j];
                for (int k = 0; k <= j; k++) pre[n_pre++] = ref[0].ids[k];
            }
            for (int k = 0; k < 3; k++) pre[n_pre++] = F[k];
            ds_gen_params gp;
            ds_gen_params_init(&gp);
            gp.sampling = fp.sampling;
            gp.max_new = fp.max_new - (n_pre - np[0]);
            gen_out g = {{0}, 0};
            CHECK(!ds_generate(m, &be, NULL, NULL, pre, n_pre, 0, &gp, collect, &g, NULL, &err), "%s", err.msg);
            ds_req *r;
            ds_req_info fi;
            CHECK(!ds_sched_submit(s, prompts[0], np[0], &fp, &r, &err), "%s", err.msg);
            do ds_req_wait(r, 1 << 30, 5.0, &fi);
            while (fi.state < DS_REQ_DONE_STOP);
            ds_req_token got[64];
            ds_req_tokens(r, 0, fi.n_out, got);
            int same = fi.n_out == n_pre - np[0] + g.n && fi.state == DS_REQ_DONE_LENGTH;
            for (int k = 0; same && k < n_pre - np[0]; k++) same = got[k].id == pre[np[0] + k];
            for (int k = 0; same && k < g.n; k++) same = got[n_pre - np[0] + k].id == g.ids[k];
            CHECK(same, "forced tokens (%s): %d tokens, expected %d", mode ? "after a trigger" : "at the start",
                  fi.n_out, n_pre - np[0] + g.n);
            ds_req_release(r);
        }
    }

    /* cancel: a long request ends CANCELLED; the queue limit refuses */
    ds_req *r;
    ds_req_params lp = rp[0];
    lp.max_new = 200;
    lp.n_stop = 0;
    CHECK(!ds_sched_submit(s, prompts[0], np[0], &lp, &r, &err), "%s", err.msg);
    ds_req_info ci;
    ds_req_wait(r, 2, 5.0, &ci);
    ds_req_cancel(r);
    double t0 = ds_now();
    do ds_req_wait(r, 1 << 30, 1.0, &ci);
    while (ci.state < DS_REQ_DONE_STOP && ds_now() - t0 < 10);
    CHECK(ci.state == DS_REQ_CANCELLED && ci.n_out < 200, "cancelled: state %d after %d tokens", ci.state, ci.n_out);
    ds_req_release(r);
    lp.max_new = 300;
    ds_req *r2;
    CHECK(ds_sched_submit(s, prompts[0], np[0], &lp, &r2, &err) == -1 && strstr(err.msg, "context"),
          "over the context: %s", err.msg);
    ds_sched_stop(s);
    /* masked ids (no token in the tokenizer) are never sampled: mask the
     * greedy request's first token; it must not appear */
    {
        int32_t mk[1] = {ref[0].ids[0]};
        o.mask_ids = mk;
        o.n_mask = 1;
        CHECK(!ds_sched_start(m, &be, &o, &s, &err), "%s", err.msg);
        ds_req_token mo[1][64];
        int mn[1];
        ds_req_info mi[1];
        run_all(s, prompts, np, rp, 1, mo, mn, mi);
        int seen = 0;
        for (int k = 0; k < mn[0]; k++) seen |= mo[0][k].id == mk[0];
        CHECK(mn[0] > 0 && !seen, "a masked id was sampled (%d tokens)", mn[0]);
        ds_sched_stop(s);
        o.mask_ids = NULL;
        o.n_mask = 0;
    }
    /* a masked suffix (the last 40% of the ids, shuffled into the list) and
     * two holes below it: requests draw over the live prefix; one whose
     * prompt holds a suffix id (with a repetition penalty over it) over all V */
    {
        int V = m->cfg.vocab_size, n_suf = V * 2 / 5, nm = 0;
        int32_t *mk = malloc(sizeof(int32_t) * (size_t)(n_suf + 2));
        for (int j = n_suf - 1; j >= 0; j -= 2) mk[nm++] = V - n_suf + j; /* not ascending */
        for (int j = n_suf - 2; j >= 0; j -= 2) mk[nm++] = V - n_suf + j;
        mk[nm++] = 17, mk[nm++] = ref[3].ids[0]; /* holes: one the greedy request took */
        o.mask_ids = mk;
        o.n_mask = nm;
        CHECK(!ds_sched_start(m, &be, &o, &s, &err), "%s", err.msg);
        int32_t *mp[NREQ + 1];
        int mnp[NREQ + 1];
        ds_req_params mrp[NREQ + 1];
        for (int i = 0; i < NREQ; i++) mp[i] = prompts[i], mnp[i] = np[i], mrp[i] = rp[i];
        int32_t wide[4] = {prompts[1][0], V - 3, prompts[1][1], V - 3}; /* raw ids: one of the masked suffix */
        mp[NREQ] = wide, mnp[NREQ] = 4, mrp[NREQ] = rp[1];
        mrp[NREQ].sampling.repetition_penalty = 1.3;
        mrp[NREQ].top_logprobs = -1;
        static ds_req_token mo[NREQ + 1][64];
        int mn[NREQ + 1];
        ds_req_info mi[NREQ + 1];
        ds_req *rq[NREQ + 1];
        for (int i = 0; i <= NREQ; i++) CHECK(!ds_sched_submit(s, mp[i], mnp[i], &mrp[i], &rq[i], &err), "%s", err.msg);
        for (int i = 0; i <= NREQ; i++) {
            do ds_req_wait(rq[i], 1 << 30, 5.0, &mi[i]);
            while (mi[i].state < DS_REQ_DONE_STOP);
            mn[i] = mi[i].n_out;
            ds_req_tokens(rq[i], 0, mn[i], mo[i]);
            ds_req_release(rq[i]);
        }
        for (int i = 0; i <= NREQ; i++) {
            gen_out g;
            CHECK(!masked_ref(m, &be, mp[i], mnp[i], &mrp[i], mk, nm, &g, &err), "%s", err.msg);
            int bad = 0;
            for (int k = 0; k < mn[i]; k++) bad |= mo[i][k].id >= V - n_suf || mo[i][k].id == 17;
            CHECK(mn[i] > 0 && same_tokens(mo[i], mn[i], &g) && !bad,
                  "masked suffix, request %d%s: %d tokens vs the reference's %d%s", i, i == NREQ ? " (raw ids)" : "",
                  mn[i], g.n, bad ? "; a masked id was drawn" : "");
        }
        CHECK(mo[1][0].n_top == 3, "logprobs over the live prefix: %d top", mo[1][0].n_top);
        ds_sched_stop(s);
        free(mk);
        o.mask_ids = NULL;
        o.n_mask = 0;
    }
    o.max_queue = 0;
    CHECK(!ds_sched_start(m, &be, &o, &s, &err), "%s", err.msg);
    lp.max_new = 4;
    CHECK(ds_sched_submit(s, prompts[0], np[0], &lp, &r2, &err) == 1 && !r2, "a full queue refuses");
    ds_sched_stop(s);
    /* an idle scheduler waits for the requests sent with its first: four
     * submitted 0.2 s apart share one step (the wait, bounded here by a 10 s
     * gap, ends as soon as the batch is full) */
    {
        ds_sched_opts og;
        ds_sched_opts_init(&og);
        og.max_seqs = 4;
        og.ctx = 256;
        og.gather_ms = 20000;
        og.gather_gap_ms = 10000;
        CHECK(!ds_sched_start(m, &be, &og, &s, &err), "%s", err.msg);
        ds_req *g[4] = {0};
        ds_req_params one = rp[0];
        one.max_new = 1;
        double tg = ds_now();
        for (int i = 0; i < 4; i++) { /* 0.2 s apart: without the wait the first would run alone */
            if (i) nanosleep(&(struct timespec){0, 200000000L}, NULL);
            CHECK(!ds_sched_submit(s, prompts[i], np[i], &one, &g[i], &err), "%s", err.msg);
        }
        for (int i = 0; i < 4; i++) {
            ds_req_info gi;
            if (!g[i]) continue;
            do ds_req_wait(g[i], 1 << 30, 30.0, &gi);
            while (gi.state < DS_REQ_DONE_STOP);
            ds_req_release(g[i]);
        }
        double el = ds_now() - tg;
        ds_sched_stats st;
        ds_sched_get_stats(s, &st, NULL, 0);
        CHECK(st.steps == 1 && st.batch_hist[2] == 1, "4 requests sent together: %llu steps (want 1 of 4 items)",
              (unsigned long long)st.steps);
        CHECK(el < 9.0, "the wait for more requests ended when the batch was full: %.2f s", el);
        ds_sched_stop(s);
        og.gather_gap_ms = og.gather_ms + 1;
        CHECK(ds_sched_start(m, &be, &og, &s, &err) == -1 && strstr(err.msg, "batch-wait"), "a gap over the wait: %s",
              err.msg);
    }

    /* the exponentially weighted expert load after a prefill and 24 decode
     * steps: never above the tokens an expert took, never below them aged by
     * every token its layer routed, 0 where it took none */
    {
        ds_sched_opts ol;
        ds_sched_opts_init(&ol);
        ol.max_seqs = 2;
        ol.ctx = 256;
        CHECK(!ds_sched_start(m, &be, &ol, &s, &err), "%s", err.msg);
        ds_req_params lp2 = rp[1];
        lp2.max_new = 25;
        ds_req *q = NULL;
        CHECK(!ds_sched_submit(s, prompts[2], np[2], &lp2, &q, &err), "%s", err.msg);
        if (q) {
            ds_req_info qi;
            do ds_req_wait(q, 1 << 30, 30.0, &qi);
            while (qi.state < DS_REQ_DONE_STOP);
            ds_req_release(q);
        }
        ds_sched_stats st;
        ds_sched_get_stats(s, &st, NULL, 0);
        int L = st.n_moe_layers, E = st.n_experts, k = m->cfg.n_active_experts;
        size_t nld = (size_t)L * E;
        uint64_t *tk = calloc(nld, sizeof *tk);
        double *ld = calloc(nld, sizeof *ld);
        ds_sched_get_stats(s, &st, tk, (int)nld);
        CHECK(ds_sched_get_load(s, ld, (int)nld) == 0, "ds_sched_get_load");
        CHECK(ds_sched_get_load(s, ld, (int)nld - 1) == -1, "ds_sched_get_load: a short table is refused");
        int bad = 0, aged = 0;
        for (int l = 0; l < L; l++) {
            uint64_t sum = 0;
            for (int e = 0; e < E; e++) sum += tk[(size_t)l * E + e];
            double floor = exp2(-(double)sum / k / DS_SCHED_LOAD_HALFLIFE);
            for (int e = 0; e < E; e++) {
                double t = (double)tk[(size_t)l * E + e], w = ld[(size_t)l * E + e];
                if (w > t || w < t * floor * (1 - 1e-12) || (t == 0) != (w == 0)) bad++;
                aged += w < t;
            }
        }
        CHECK(st.steps >= 25 && bad == 0, "expert load: %d of %zu entries outside [tokens aged by the layer's %llu steps, "
              "tokens]", bad, nld, (unsigned long long)st.steps);
        CHECK(aged > 0, "expert load: no entry aged over %llu steps", (unsigned long long)st.steps);
        free(tk);
        free(ld);
        ds_sched_stop(s);
    }

    for (int i = 0; i < NREQ; i++) free(prompts[i]);
    ds_tokenizer_free(tok);
    test_unload(m, &be);
    return test_summary("test_scheduler");
}
