/* fuzz_oai.c — libFuzzer target for the server's request parser: an OpenAI
 * chat.completions / completions request body -> ds_oai_req (ds_oai_parse,
 * what `dsv4 serve` runs on every POST), with the fixture tokenizer.
 *
 * The first byte picks the endpoint (bit 0: chat.completions, else
 * completions) and the context (64 << bits 1..3 tokens); the rest is the body.
 * Beyond "no crash / leak / UB":
 *   - an accepted request: prompt ids in the tokenizer's range, 1 <= max_new,
 *     prompt + max_new within the context, sampling parameters that validate,
 *     at most DS_OAI_MAX_STOP non-empty stop strings, top_logprobs in range,
 *     the EOS id as its stop token; parsing it again gives the same request;
 *   - a refused one: status 400 or 404 with a type and a message;
 *   - the body itself, streamed as generated text in 7-byte pieces through
 *     ds_oai_text with the request's stop strings and mode: the deltas are
 *     the text the final message holds (completions: a prefix of the body,
 *     all of it when no stop string was met) and ds_oai_text_message ends it. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/openai_chat.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ds_tokenizer *fixture(void) {
    static ds_tokenizer *tok;
    if (!tok) {
        ds_err err;
        const char *p = getenv("DSV4_FUZZ_TOKENIZER");
        if (!p) p = DSV4_SOURCE_DIR "/tests/fixtures/tokenizer/tok_small.json";
        if (ds_tokenizer_load(p, &tok, &err)) {
            fprintf(stderr, "fuzz_oai: %s\n", err.msg);
            abort();
        }
    }
    return tok;
}

#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_oai: %s:%d: %s\n", __FILE__, __LINE__, #c);                                          \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

static int bounded(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

/* the body as generated text: deltas against the final message */
static void stream_text(const ds_oai_req *q, const char *text, size_t n) {
    ds_oai_text t;
    ds_oai_text_init(&t, q->chat, q->thinking, (const char *const *)q->stop, q->n_stop);
    char *content = malloc(n + 1), *reasoning = malloc(n + 1);
    CHECK(content && reasoning);
    size_t nc = 0, nr = 0;
    int stopped = 0;
    for (size_t i = 0; i < n && !stopped; i += 7) {
        size_t k = n - i < 7 ? n - i : 7;
        int r = ds_oai_text_push(&t, text + i, k);
        CHECK(r >= 0);
        stopped = r;
        const char *rs, *cs;
        size_t rn, cn;
        ds_oai_text_deltas(&t, &rs, &rn, &cs, &cn);
        CHECK(nr + rn <= n && nc + cn <= n);
        memcpy(reasoning + nr, rs, rn), nr += rn;
        memcpy(content + nc, cs, cn), nc += cn;
    }
    ds_oai_text_end(&t);
    const char *rs, *cs;
    size_t rn, cn;
    ds_oai_text_deltas(&t, &rs, &rn, &cs, &cn);
    CHECK(nr + rn <= n && nc + cn <= n);
    memcpy(reasoning + nr, rs, rn), nr += rn;
    memcpy(content + nc, cs, cn), nc += cn;
    if (!q->chat) {
        CHECK(nr == 0);
        CHECK(nc <= n && !memcmp(content, text, nc));
        if (!t.stop_hit) CHECK(nc == n);
    }
    cJSON *msg = cJSON_CreateObject();
    CHECK(msg);
    int calls = ds_oai_text_message(&t, !stopped, "fuzz", msg);
    CHECK(calls >= 0);
    cJSON_Delete(msg);
    ds_oai_text_free(&t);
    free(content);
    free(reasoning);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ds_tokenizer *tok = fixture();
    int chat = data[0] & 1;
    int64_t ctx = (int64_t)64 << ((data[0] >> 1) & 7);
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    ds_oai_req q;
    ds_oai_error e;
    memset(&e, 0, sizeof e);
    if (ds_oai_parse(tok, "kjv", ctx, 12345, chat, body, n, &q, &e)) {
        CHECK(e.status == 400 || e.status == 404);
        CHECK(bounded(e.type, sizeof e.type) && e.type[0]);
        CHECK(bounded(e.message, sizeof e.message) && e.message[0]);
        CHECK(bounded(e.param, sizeof e.param) && bounded(e.code, sizeof e.code));
        return 0;
    }
    CHECK(q.chat == chat);
    CHECK(q.prompt && q.n_prompt >= 1);
    int32_t vocab = ds_tokenizer_vocab_size(tok);
    for (int i = 0; i < q.n_prompt; i++) CHECK(q.prompt[i] >= 0 && q.prompt[i] < vocab);
    CHECK(q.rp.max_new >= 1 && (int64_t)q.n_prompt + q.rp.max_new <= ctx);
    ds_err err;
    CHECK(ds_sampling_validate(&q.rp.sampling, &err) == 0);
    CHECK(q.n_stop >= 0 && q.n_stop <= DS_OAI_MAX_STOP);
    for (int i = 0; i < q.n_stop; i++) CHECK(q.stop[i] && q.stop[i][0]);
    CHECK(q.rp.top_logprobs >= -1 && q.rp.top_logprobs <= DS_SCHED_MAX_TOP);
    CHECK(q.rp.n_stop == 1 && q.rp.stop_ids[0] == ds_tokenizer_eos_id(tok));
    /* the same body parses to the same request */
    ds_oai_req q2;
    CHECK(ds_oai_parse(tok, "kjv", ctx, 12345, chat, body, n, &q2, &e) == 0);
    CHECK(q2.n_prompt == q.n_prompt && !memcmp(q2.prompt, q.prompt, (size_t)q.n_prompt * sizeof *q.prompt));
    CHECK(q2.rp.max_new == q.rp.max_new && q2.rp.sampling.seed == q.rp.sampling.seed && q2.n_stop == q.n_stop);
    CHECK(q2.stream == q.stream && q2.thinking == q.thinking && q2.has_tools == q.has_tools);
    ds_oai_req_free(&q2);
    stream_text(&q, body, n);
    ds_oai_req_free(&q);
    return 0;
}
