/* test_grammar.c — the grammar automaton (json_schema.c, grammar.c): byte
 * strings accepted and rejected per schema, unsupported keywords named, the
 * token mask against a token-by-token reference on the bundled tokenizer, and
 * the mask's cost per token on the bundled vocabulary and on a synthetic
 * 129,280-token one (printed as "grammar-mask ... us/token"). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"
#include "testutil.h"

static ds_grammar *compile(const char *schema) {
    ds_grammar *g = NULL;
    ds_err err = {{0}};
    int rc = ds_json_schema_compile(schema, strlen(schema), &g, &err);
    CHECK(rc == 0, "compile %s: %s", schema, err.msg);
    return rc ? NULL : g;
}

/* 1 if the whole text is accepted and complete */
static int accepts(const ds_grammar *g, const char *text) {
    ds_gstate *s = ds_gstate_new(g);
    int ok = ds_gstate_feed(s, text, strlen(text)) == 0 && ds_gstate_can_end(s);
    ds_gstate_free(s);
    return ok;
}

static void expect(const char *schema, const char *const *good, const char *const *bad) {
    ds_grammar *g = compile(schema);
    if (!g) return;
    for (int i = 0; good[i]; i++) CHECK(accepts(g, good[i]), "%s should accept %s", schema, good[i]);
    for (int i = 0; bad[i]; i++) CHECK(!accepts(g, bad[i]), "%s should reject %s", schema, bad[i]);
    ds_grammar_free(g);
}

static void expect_error(const char *schema, const char *needle) {
    ds_grammar *g = NULL;
    ds_err err = {{0}};
    int rc = ds_json_schema_compile(schema, strlen(schema), &g, &err);
    CHECK(rc == -1 && strstr(err.msg, needle), "%s: rc %d, '%s' lacks '%s'", schema, rc, err.msg, needle);
    ds_grammar_free(g);
}

static void test_bytes(void) {
    expect("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
           "\"required\":[\"a\"],\"additionalProperties\":false}",
           (const char *const[]){"{\"a\":1}", "{\"a\": -12,\"b\":\"x\\n\\u00e9\"}", "{\"b\":\"\",\"a\":0}",
                                 "{\"a\":1, \"b\":\"h\xc3\xa9\"}", NULL},
           (const char *const[]){"{}", "{\"b\":\"x\"}", "{\"a\":1.5}", "{\"a\":01}", "{\"a\":1,\"a\":2}",
                                 "{\"a\":1,\"c\":2}", "{\"a\":1} ", " {\"a\":1}", "{\"a\":1,}", "{\"a\":  1}",
                                 "{\"a\":1,\"b\":\"\x01\"}", "{\"a\":1,\"b\":\"\xc3\"}", "{\"a\":1,\"b\":\"\\x\"}",
                                 "{\"a\":1,\"b\":\"\xed\xa0\x80\"}", "{\"a\":1}x", NULL});
    expect("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":3}",
           (const char *const[]){"[1]", "[1.5e3, -0.25,2]", "[0E+1]", NULL},
           (const char *const[]){"[]", "[1,2,3,4]", "[1.]", "[.5]", "[1e]", "[\"a\"]", NULL});
    expect("{\"enum\":[\"red\",\"green\",3,null]}", (const char *const[]){"\"red\"", "3", "null", NULL},
           (const char *const[]){"\"blue\"", "\"re\"", "33", NULL});
    expect("{\"const\":{\"k\":[1,true]}}", (const char *const[]){"{\"k\":[1,true]}", NULL},
           (const char *const[]){"{\"k\":[1,false]}", NULL});
    expect("{\"type\":[\"string\",\"null\"]}", (const char *const[]){"\"x\"", "null", NULL},
           (const char *const[]){"1", "nul", NULL});
    expect("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"],"
           "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"y\":{\"type\":\"boolean\"}},"
           "\"required\":[\"y\"],\"additionalProperties\":false}]}",
           (const char *const[]){"{\"x\":1}", "{\"y\":false}", NULL},
           (const char *const[]){"{\"x\":true}", "{\"y\":1}", "{}", NULL});
    expect("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":"
           "[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\""
           ":false}},\"$ref\":\"#/$defs/node\"}",
           (const char *const[]){"{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", NULL},
           (const char *const[]){"{\"v\":1,\"next\":{\"v\":2}}", NULL});
    expect("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
           (const char *const[]){"{}", "{\"q\":1,\"r\":2}", NULL}, (const char *const[]){"{\"q\":\"s\"}", NULL});
    expect("true", (const char *const[]){"{\"a\":[1,{\"b\":null}]}", "\"s\"", "12", NULL},
           (const char *const[]){"{a:1}", "[1,]", NULL});
    expect("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
           (const char *const[]){"\"ab\"", "\"a\\u00e9\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\"", NULL},
           (const char *const[]){"\"a\"", "\"abcd\"", "\"\"", NULL});
    expect_error("{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'");
    expect_error("{\"type\":\"string\",\"format\":\"date\"}", "'format'");
    expect_error("{\"allOf\":[{}]}", "'allOf'");
    expect_error("{\"type\":\"integer\",\"minimum\":3}", "'minimum'");
    expect_error("{\"$ref\":\"http://x/y\"}", "$ref");
    expect_error("{\"type\":\"blob\"}", "blob");
    expect_error("{\"$ref\":\"#\"}", "no value");
    expect_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
                 "no value");
    expect_error("{\"type\":\"object\",\"required\":[\"z\"],\"additionalProperties\":false}", "'z'");
    /* anyOf nested 6 deep, 8 branches each: the work per byte stays bounded (the first branches) */
    {
        char big[8192] = "{\"type\":\"integer\"}";
        for (int lvl = 0; lvl < 6; lvl++) {
            char nx[8192 * 2];
            int n = snprintf(nx, sizeof nx, "{\"anyOf\":[");
            for (int b = 0; b < 8 && n < 8000; b++)
                n += snprintf(nx + n, sizeof nx - (size_t)n, "%s%s", b ? "," : "", big);
            snprintf(nx + n, sizeof nx - (size_t)n, "]}");
            if (strlen(nx) >= sizeof big) break;
            memcpy(big, nx, strlen(nx) + 1);
        }
        ds_grammar *gb = compile(big);
        double t0 = ds_now();
        CHECK(gb && accepts(gb, "12"), "deeply nested anyOf accepts an integer");
        CHECK(ds_now() - t0 < 1.0, "deeply nested anyOf: %.2f s", ds_now() - t0);
        ds_grammar_free(gb);
    }
    /* json_object */
    ds_grammar *g = NULL;
    ds_err err = {{0}};
    CHECK(ds_grammar_json_object(&g, &err) == 0, "json_object: %s", err.msg);
    CHECK(accepts(g, "{\"a\":[1,\"x\",{\"b\":null}], \"c\":true}"), "json_object accepts an object");
    CHECK(!accepts(g, "[1]") && !accepts(g, "\"s\""), "json_object rejects a non-object");
    ds_gstate *s = ds_gstate_new(g);
    CHECK(ds_gstate_feed(s, "{}", 2) == 0 && ds_gstate_finished(s), "a closed object is finished");
    CHECK(ds_gstate_feed(s, " ", 1) == -1 && ds_gstate_finished(s), "nothing may follow (state unchanged)");
    ds_gstate_free(s);
    ds_grammar_free(g);
    /* a DSML tool call */
    cJSON *tools =
        cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
                    "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}]");
    CHECK(ds_json_schema_tool_call(tools, NULL, 0, &g, &err) == 0, "tool call grammar: %s", err.msg);
#define D                                                                                                              \
    "\xef\xbd\x9c"                                                                                                     \
    "DSML\xef\xbd\x9c"
    CHECK(accepts(g,
                  "\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n<" D "parameter name=\"city\" string=\""
                  "true\">Paris</" D "parameter>\n<" D "parameter name=\"days\" string=\"false\">3</" D
                  "parameter>\n</" D "invoke>\n</" D "tool_calls>"),
          "a get_weather call");
    CHECK(accepts(g, "\n\n<" D "tool_calls>\n<" D "invoke name=\"noop\">\n\n</" D "invoke>\n</" D "tool_calls>"),
          "a noop call");
    CHECK(
        !accepts(g, "\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n\n</" D "invoke>\n</" D "tool_calls>"),
        "get_weather without its required city");
    CHECK(!accepts(g, "\n\n<" D "tool_calls>\n<" D "invoke name=\"other\">\n\n</" D "invoke>\n</" D "tool_calls>"),
          "an unknown tool");
#define NOOP "<" D "invoke name=\"noop\">\n\n</" D "invoke>"
#define CITY                                                                                                           \
    "<" D "invoke name=\"get_weather\">\n<" D "parameter name=\"city\" string=\"true\">Rome</" D "parameter>\n</" D    \
    "invoke>"
#define BLOCK(calls) "\n\n<" D "tool_calls>\n" calls "\n</" D "tool_calls>"
    CHECK(!accepts(g, BLOCK(NOOP "\n" CITY)), "two calls without parallel");
    ds_grammar_free(g);
    /* parallel: one call or several, each valid for its tool */
    CHECK(ds_json_schema_tool_call(tools, NULL, 1, &g, &err) == 0, "parallel tool call grammar: %s", err.msg);
    CHECK(accepts(g, BLOCK(NOOP)), "parallel: one call");
    CHECK(accepts(g, BLOCK(NOOP "\n" CITY)), "parallel: two calls");
    CHECK(accepts(g, BLOCK(CITY "\n" NOOP "\n" CITY "\n" CITY "\n" NOOP "\n" CITY "\n" NOOP "\n" CITY "\n" NOOP
                                "\n" CITY "\n" NOOP "\n" CITY "\n" CITY "\n" NOOP "\n" CITY "\n" NOOP "\n" CITY)),
          "parallel: 17 calls (the depth does not grow per call)");
    CHECK(!accepts(g, BLOCK("")), "parallel: no call");
    CHECK(!accepts(g, BLOCK(NOOP "\n")), "parallel: a call cut after its separator");
    CHECK(!accepts(g, BLOCK(NOOP "\n<" D "invoke name=\"get_weather\">\n\n</" D "invoke>")),
          "parallel: the second call without its required city");
    CHECK(!accepts(g, BLOCK(NOOP NOOP)), "parallel: two calls without the line between");
    ds_grammar_free(g);
    /* the named tool only, several times */
    CHECK(ds_json_schema_tool_call(tools, "noop", 1, &g, &err) == 0, "named: %s", err.msg);
    CHECK(accepts(g, BLOCK(NOOP "\n" NOOP)) && !accepts(g, BLOCK(NOOP "\n" CITY)), "named: that tool only");
    ds_grammar_free(g);
    cJSON_Delete(tools);
    /* many tools whose names share a long prefix: each one callable (one thread matches the names) */
    cJSON *many = cJSON_CreateArray();
    for (int i = 0; i < 300; i++) {
        char t[256];
        snprintf(t, sizeof t,
                 "{\"type\":\"function\",\"function\":{\"name\":\"lookup_record_%d\",\"parameters\":{\"type\":"
                 "\"object\",\"properties\":{\"id%d\":{\"type\":\"integer\"}},\"required\":[\"id%d\"]}}}",
                 i, i, i);
        cJSON_AddItemToArray(many, cJSON_Parse(t));
    }
    CHECK(ds_json_schema_tool_call(many, NULL, 1, &g, &err) == 0, "300 tools: %s", err.msg);
    for (int i = 0; g && i < 300; i += 7) {
        char t[512];
        snprintf(t, sizeof t,
                 BLOCK("<" D "invoke name=\"lookup_record_%d\">\n<" D "parameter name=\"id%d\" string=\"false\">%d</" D
                       "parameter>\n</" D "invoke>"),
                 i, i, i);
        CHECK(accepts(g, t), "300 tools: tool %d", i);
        snprintf(t, sizeof t,
                 BLOCK("<" D "invoke name=\"lookup_record_%d\">\n<" D "parameter name=\"id%d\" string=\"false\">%d</" D
                       "parameter>\n</" D "invoke>"),
                 i, (i + 1) % 300, i);
        CHECK(!accepts(g, t), "300 tools: tool %d with another's parameter", i);
    }
    CHECK(!accepts(g, BLOCK("<" D "invoke name=\"lookup_record_300\">\n\n</" D "invoke>")), "300 tools: no 301st");
    ds_grammar_free(g);
    /* two tools of one name */
    cJSON_AddItemToArray(many, cJSON_Parse("{\"type\":\"function\",\"function\":{\"name\":\"lookup_record_5\"}}"));
    g = NULL;
    CHECK(ds_json_schema_tool_call(many, NULL, 1, &g, &err) == -1 && strstr(err.msg, "tools[300]") &&
              strstr(err.msg, "tools[5]"),
          "a name twice: %s", err.msg);
    ds_grammar_free(g);
    cJSON_Delete(many);
}

/* the mask against feeding each token alone, on a few states */
/* No reachable state without a way on: random walks over bytes (each step
 * one of the bytes the state takes, a finished value starting the next) on
 * schemas with free keys (their 256-byte limit), bounded strings, escapes,
 * UTF-8 and numbers; at every step some byte, or the end, must be possible
 * (WALK_BYTES steps a schema). */
#if defined(__SANITIZE_ADDRESS__)
#define WALK_BYTES 8000 /* ~30x slower under the sanitizers */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WALK_BYTES 8000
#endif
#endif
#ifndef WALK_BYTES
#define WALK_BYTES 60000
#endif
static void test_no_dead_end(void) {
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\"}}}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\",\"maxLength\":3}}",
        ("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"string\",\"minLength\":2}]},"
         "\"maxItems\":4}"),
    };
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        ds_grammar *g = compile(schemas[k]);
        if (!g) continue;
        ds_gstate *s = ds_gstate_new(g), *c = ds_gstate_new(g);
        uint32_t x = 2463534242u + (uint32_t)k;
        int dead = 0, ends = 0, longest = 0, len = 0;
        for (int step = 0; step < WALK_BYTES && !dead; step++) {
            unsigned char ok[256];
            int n = 0;
            for (int b = 0; b < 256; b++) {
                ds_gstate_copy(c, s);
                unsigned char byte = (unsigned char)b;
                if (ds_gstate_feed(c, &byte, 1) == 0) ok[n++] = byte;
            }
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            if (ds_gstate_can_end(s) && (!n || x % 8 == 0)) { /* the value ends: the next one */
                ends++, len = 0;
                ds_gstate_reset(s);
                continue;
            }
            if (!n) {
                dead = 1;
                break;
            }
            /* '"' (ends a key or string) drawn rarely: long keys reach their limit */
            int i = (int)(x % (uint32_t)n);
            if (ok[i] == '"' && x % 97) i = (i + 1) % n;
            ds_gstate_feed(s, &ok[i], 1);
            longest = ++len > longest ? len : longest;
        }
        CHECK(!dead && ends > 0, "schema %zu: %s after a valid text (%d values ended)", k,
              dead ? "no byte can continue" : "no value ended", ends);
        printf("byte walk: schema %zu, %d bytes, %d values, the longest %d bytes\n", k, WALK_BYTES, ends, longest);
        ds_gstate_free(c);
        ds_gstate_free(s);
        ds_grammar_free(g);
    }
    /* the key limit inside a character: a UTF-8 sequence or an escape begun at byte 256 completes */
    ds_grammar *g = compile("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}");
    if (g) {
        char t[300];
        const char *tails[] = {"\xd0\x90\":1}", "\\n\":1}", "\xe2\x82\xac\":1}"};
        for (int i = 0; i < 3; i++) {
            snprintf(t, sizeof t, "{\"%s%s", "", tails[i]);
            memset(t + 2, 'a', 255);
            snprintf(t + 257, sizeof t - 257, "%s", tails[i]);
            CHECK(accepts(g, t), "a key of 255 bytes and a character of more than one byte: tail %d refused", i);
            memset(t + 2, 'a', 256);
            snprintf(t + 258, sizeof t - 258, "%s", tails[i]);
            CHECK(!accepts(g, t), "a key of 256 bytes and more: tail %d accepted", i);
        }
        ds_grammar_free(g);
    }
}

/* Each mask against feeding every token alone, after each prefix */
static void mask_agrees(ds_tokenizer *tok, ds_vocab_trie *t, ds_mask_scratch *ms, uint64_t *m, const char *schema,
                        const char *const *prefixes, size_t np) {
    int V = ds_vocab_trie_vocab(t);
    ds_grammar *g = compile(schema);
    int32_t eos = ds_tokenizer_eos_id(tok);
    for (size_t p = 0; g && p < np; p++) {
        ds_gstate *s = ds_gstate_new(g), *c = ds_gstate_new(g);
        CHECK(ds_gstate_feed(s, prefixes[p], strlen(prefixes[p])) == 0, "prefix %s", prefixes[p]);
        int n = ds_grammar_mask(t, s, ms, m), bad = 0, cnt = 0;
        for (int id = 0; id < V; id++) {
            ds_gstate_copy(c, s);
            int ok = ds_grammar_accept(t, c, id) == 0;
            size_t len = 0;
            if (id != eos && !ds_tokenizer_token_bytes(tok, id, &len)) ok = 0;
            int bit = (int)(m[id >> 6] >> (id & 63) & 1);
            cnt += bit;
            if (ok != bit && bad++ < 3)
                fprintf(stderr, "prefix %.40s token %d: mask %d, feed %d\n", prefixes[p], id, bit, ok);
        }
        CHECK(!bad && cnt == n && n > 0, "prefix '%.60s': %d tokens disagree (%d allowed)", prefixes[p], bad, n);
        ds_gstate_free(s);
        ds_gstate_free(c);
    }
    ds_grammar_free(g);
}

static void test_mask(ds_tokenizer *tok) {
    ds_vocab_trie *t = NULL;
    ds_err err = {{0}};
    CHECK(ds_vocab_trie_build(tok, &t, &err) == 0, "trie: %s", err.msg);
    if (!t) return;
    int V = ds_vocab_trie_vocab(t);
    uint64_t *m = calloc(((size_t)V + 63) / 64, 8);
    ds_mask_scratch *ms = ds_mask_scratch_new(t);
    const char *prefixes[] = {"",
                              "{",
                              "{\"",
                              "{\"name\":\"Jo",
                              "{\"name\":\"\\",
                              "{\"n\":[1",
                              "{\"n\":[1,2], ",
                              "{\"ok\":true,\"name\":\"x\",\"n\":[]}",
                              "{\"name\":\"\xc3"};
    mask_agrees(tok, t, ms, m,
                "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"
                "\"array\",\"items\":{\"type\":\"integer\"}},\"ok\":{\"type\":\"boolean\"}},\"required\":["
                "\"name\",\"ok\"],\"additionalProperties\":false}",
                prefixes, sizeof prefixes / sizeof *prefixes);
    /* free keys (the plain-token shortcut once no declared name can match),
     * near their 256-byte limit too */
    static char k200[300], k250[300];
    snprintf(k200, sizeof k200, "{\"%0200d", 0);
    snprintf(k250, sizeof k250, "{\"%0250d", 0);
    const char *free_prefixes[] = {"{\"",          "{\"na",  "{\"zz", "{\"name", "{\"zz\":\"v",
                                   "{\"n\":1,\"q", "{\"q\\", k200,    k250};
    mask_agrees(tok, t, ms, m,
                "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"
                "\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}",
                free_prefixes, sizeof free_prefixes / sizeof *free_prefixes);
    ds_mask_scratch_free(ms);
    free(m);
    ds_vocab_trie_free(t);
}

/* cost per token: a schema's text generated token by token, the tokens
 * chosen greedily as the longest allowed one matching a reference output */
static void bench(ds_tokenizer *tok, const char *what) {
    ds_vocab_trie *t = NULL;
    ds_err err = {{0}};
    double t0 = ds_now();
    if (ds_vocab_trie_build(tok, &t, &err)) {
        CHECK(0, "trie: %s", err.msg);
        return;
    }
    double t_build = ds_now() - t0;
    int V = ds_vocab_trie_vocab(t);
    uint64_t *m = calloc(((size_t)V + 63) / 64, 8);
    ds_mask_scratch *ms = ds_mask_scratch_new(t);
    ds_grammar *g = compile("{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"year\":{\"type\":"
                            "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"rating\":{"
                            "\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"title\",\"year\","
                            "\"tags\"],\"additionalProperties\":false}");
    const char *out = "{\"title\": \"And God said, Let there be light: and there was light.\", \"year\": 1611, "
                      "\"tags\": [\"genesis\", \"light\", \"the beginning\"], \"rating\": 4.75, \"ok\": true}";
    ds_gstate *s = ds_gstate_new(g);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ds_tokenizer_encode(tok, out, strlen(out), 0, &ids, &n_ids, &err);
    double t_mask = 0;
    int steps = 0, reps = 20;
    for (size_t i = 0; i <= n_ids; i++) {
        double a = ds_now();
        int n = 0;
        for (int r = 0; r < reps; r++) n = ds_grammar_mask(t, s, ms, m);
        t_mask += ds_now() - a;
        steps++;
        int32_t id = i < n_ids ? ids[i] : ds_tokenizer_eos_id(tok);
        CHECK(n > 0 && (m[id >> 6] >> (id & 63) & 1), "%s: token %zu (id %d) of the reference is allowed", what, i, id);
        if (i < n_ids) CHECK(ds_grammar_accept(t, s, id) == 0, "%s: token %zu accepted", what, i);
    }
    CHECK(ds_gstate_finished(s), "%s: the reference completes the value", what);
    printf("grammar-mask vocab %d (%s): trie %.1f ms, %d tokens, %.1f us/token (mean over %d masks)\n", V, what,
           t_build * 1e3, steps, t_mask / (steps * reps) * 1e6, steps * reps);
    free(ids);
    ds_gstate_free(s);
    ds_grammar_free(g);
    ds_mask_scratch_free(ms);
    free(m);
    ds_vocab_trie_free(t);
}

/* the bundled tokenizer's vocabulary grown to 129,280 tokens by joining pairs
 * of its tokens (distinct strings) */
static ds_tokenizer *synthetic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = malloc((size_t)n + 1);
    if (fread(txt, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    txt[n] = 0;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab");
    int nv = cJSON_GetArraySize(vocab), next = 0;
    char **keys = malloc((size_t)nv * sizeof *keys);
    cJSON *v;
    int k = 0;
    cJSON_ArrayForEach(v, vocab) {
        keys[k++] = v->string;
        if ((int)v->valuedouble >= next) next = (int)v->valuedouble + 1;
    }
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        int id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
        if (id >= next) next = id + 1;
    }
    /* a hash set of the strings */
    size_t cap = 1 << 19;
    char **set = calloc(cap, sizeof *set);
    char **owned = malloc(129280 * sizeof *owned);
    int n_owned = 0;
    for (int i = 0; i < nv; i++) {
        uint64_t h = 1469598103934665603ull;
        for (const char *p = keys[i]; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
        size_t j = h & (cap - 1);
        while (set[j]) j = (j + 1) & (cap - 1);
        set[j] = keys[i];
    }
    uint64_t x = 88172645463325252ull;
    while (next < 129280) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *p = keys[x % (uint64_t)nv], *q = keys[(x >> 32) % (uint64_t)nv];
        size_t lp = strlen(p), lq = strlen(q);
        if (lp + lq > 40) continue;
        char *s = malloc(lp + lq + 1);
        memcpy(s, p, lp);
        memcpy(s + lp, q, lq + 1);
        uint64_t h = 1469598103934665603ull;
        for (const char *c = s; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        size_t j = h & (cap - 1);
        int dup = 0;
        while (set[j]) {
            if (!strcmp(set[j], s)) dup = 1;
            j = (j + 1) & (cap - 1);
        }
        if (dup) {
            free(s);
            continue;
        }
        set[j] = s;
        owned[n_owned++] = s;
        cJSON_AddNumberToObject(vocab, s, next++);
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    free(set);
    free(keys);
    ds_tokenizer *tok = NULL;
    ds_err err = {{0}};
    if (ds_tokenizer_load_json(js, strlen(js), "synthetic", &tok, &err)) fprintf(stderr, "synthetic: %s\n", err.msg);
    free(js);
    return tok;
}

int main(void) {
    test_bytes();
    test_no_dead_end();
    char path[1024];
    test_path(path, sizeof path, "models/kjv/tokenizer.json");
    ds_tokenizer *tok = NULL;
    ds_err err = {{0}};
    CHECK(ds_tokenizer_load(path, &tok, &err) == 0, "tokenizer: %s", err.msg);
    if (tok) {
        test_mask(tok);
        bench(tok, "models/kjv");
        ds_tokenizer_free(tok);
    }
    ds_tokenizer *big = synthetic(path);
    CHECK(big && ds_tokenizer_vocab_size(big) >= 129280, "synthetic tokenizer");
    if (big) {
        bench(big, "synthetic");
        ds_tokenizer_free(big);
    }
    return test_summary("test_grammar");
}
