/* fuzz_chat.c — libFuzzer target for the chat layer. The first byte picks:
 *   even: the rest is a JSON request {"messages": [...], "thinking", "effort",
 *         "keep_reasoning", "no_bos", "n_context"} (OpenAI-like messages:
 *         role, content, reasoning_content, tool_calls [{id, name, arguments}],
 *         tool_call_id, tools, response_format, task, wo_eos) -> ds_chat_encode,
 *         ds_chat_encode_marked (same text) and ds_chat_tokenize with the fixture
 *         tokenizer (its ids decode to exactly the prompt text, with message text
 *         plain or parsed);
 *   odd:  the rest is a completion -> ds_chat_parse in chat and thinking mode,
 *         and ds_chat_json_normalize. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 32
#define MAX_CALLS 64

static ds_tokenizer *fixture(void) {
    static ds_tokenizer *tok;
    if (!tok) {
        ds_err err;
        const char *p = getenv("DSV4_FUZZ_TOKENIZER");
        if (!p) p = DSV4_SOURCE_DIR "/tests/fixtures/tokenizer/tok_small.json";
        if (ds_tokenizer_load(p, &tok, &err)) {
            fprintf(stderr, "fuzz_chat: %s\n", err.msg);
            abort();
        }
    }
    return tok;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int role(const char *r) {
    static const char *const names[] = {"system", "user", "assistant", "tool", "developer", "latest_reminder"};
    if (!r) return 99; /* an unknown role: the encoder must refuse it */
    for (int i = 0; i < 6; i++)
        if (!strcmp(r, names[i])) return i;
    return 99;
}

static void encode_case(const char *json, size_t n) {
    cJSON *root = cJSON_ParseWithLength(json, n);
    if (!root) return;
    ds_chat_msg msgs[MAX_MSGS];
    ds_chat_tool_call calls[MAX_CALLS];
    char *printed[2 * MAX_MSGS + MAX_CALLS];
    size_t nm = 0, nc = 0, np = 0;
    memset(msgs, 0, sizeof msgs);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "messages");
    for (const cJSON *m = cJSON_IsArray(arr) ? arr->child : NULL; m && nm < MAX_MSGS; m = m->next, nm++) {
        ds_chat_msg *g = &msgs[nm];
        g->role = (ds_chat_role)role(str(m, "role"));
        g->content = str(m, "content");
        g->reasoning_content = str(m, "reasoning_content");
        g->tool_call_id = str(m, "tool_call_id");
        g->task = str(m, "task");
        g->wo_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "wo_eos"));
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(m, "tools");
        if (tools) g->tools = printed[np++] = cJSON_PrintUnformatted(tools);
        const cJSON *rf = cJSON_GetObjectItemCaseSensitive(m, "response_format");
        if (rf) g->response_format = printed[np++] = cJSON_PrintUnformatted(rf);
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        g->tool_calls = &calls[nc];
        for (const cJSON *c = cJSON_IsArray(tc) ? tc->child : NULL; c && nc < MAX_CALLS; c = c->next) {
            ds_chat_tool_call *k = &calls[nc++];
            k->id = str(c, "id");
            k->name = str(c, "name");
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(c, "arguments");
            k->arguments = cJSON_IsString(a) ? a->valuestring : a ? (printed[np++] = cJSON_PrintUnformatted(a)) : NULL;
            g->n_tool_calls++;
        }
    }
    ds_chat_opts o = {0};
    o.thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "thinking"));
    o.keep_reasoning = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "keep_reasoning"));
    o.no_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "no_bos"));
    o.reasoning_effort = str(root, "effort");
    const cJSON *nctx = cJSON_GetObjectItemCaseSensitive(root, "n_context");
    if (cJSON_IsNumber(nctx) && nctx->valuedouble >= 0 && nctx->valuedouble <= MAX_MSGS + 1)
        o.n_context = (size_t)nctx->valuedouble;

    char *text = NULL, *text2 = NULL;
    unsigned char *plain = NULL;
    size_t tn = 0, tn2 = 0;
    ds_err err = {{0}};
    int rc = ds_chat_encode(msgs, nm, &o, &text, &tn, &err);
    int rc2 = ds_chat_encode_marked(msgs, nm, &o, &text2, &tn2, &plain, &err);
    if (rc != rc2) abort();
    if (rc == 0) {
        if (tn != tn2 || memcmp(text, text2, tn) || strlen(text) > tn) abort();
        ds_tokenizer *tok = fixture();
        for (int parse = 0; parse < 2; parse++) {
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (ds_chat_tokenize(tok, msgs, nm, &o, parse, &ids, &n_ids, &err) != 0) abort();
            char *back = NULL;
            size_t bn = 0;
            if (ds_tokenizer_decode(tok, ids, n_ids, 0, &back, &bn, &err) != 0) abort();
            if (bn != tn || memcmp(back, text, tn)) abort(); /* the ids spell the prompt exactly */
            free(back);
            free(ids);
        }
    } else if (!err.msg[0]) {
        abort();
    }
    free(text);
    free(text2);
    free(plain);
    for (size_t i = 0; i < np; i++) free(printed[i]);
    cJSON_Delete(root);
}

static void parse_case(const char *t, size_t n) {
    for (int thinking = 0; thinking < 2; thinking++) {
        ds_chat_reply r;
        ds_err err = {{0}};
        if (ds_chat_parse(t, n, thinking, &r, &err) == 0) {
            if (!r.content || !r.reasoning) abort();
            for (size_t i = 0; i < r.n_calls; i++)
                if (!r.calls[i].name || !r.calls[i].arguments) abort();
            ds_chat_reply_free(&r);
        } else if (!err.msg[0]) {
            abort();
        }
    }
    char *out = NULL;
    size_t on = 0;
    ds_err err;
    if (ds_chat_json_normalize(t, n, &out, &on, &err) == 0) free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *t = malloc(size);
    memcpy(t, data + 1, size - 1);
    t[size - 1] = 0;
    if (data[0] % 2 == 0)
        encode_case(t, size - 1);
    else
        parse_case(t, size - 1);
    free(t);
    return 0;
}
