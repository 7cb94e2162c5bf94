/* test_tokenizer.c — the tokenizer against ids produced by the Python
 * `tokenizers` library (tests/fixtures/tokenizer, from
 * tools/gen_tokenizer_fixtures.py), round trips, streaming, bad input. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "text/tokenizer.h"
#include "testutil.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[len] = 0;
        if (n) *n = (size_t)len;
    }
    return buf;
}

static cJSON *load_json(const char *rel) {
    char path[1024];
    test_path(path, sizeof path, rel);
    char *s = slurp(path, NULL);
    if (!s) return NULL;
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static char *b64dec(const char *s, size_t *n) {
    size_t len = strlen(s), o = 0;
    char *out = malloc(len / 4 * 3 + 4);
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = 0;
    *n = o;
    return out;
}

static int32_t *json_ids(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    size_t i = 0;
    for (const cJSON *it = arr->child; it; it = it->next) v[i++] = (int32_t)it->valuedouble;
    return v;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t *first_diff) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    *first_diff = i;
    return na == nb && i == na;
}

static void show(const char *s, size_t n) {
    fprintf(stderr, "  text: \"");
    for (size_t i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "%s\"\n", n > 120 ? "..." : "");
}

/* Streams ids through ds_detok_stream; returns the concatenated output. */
static char *stream_all(const ds_tokenizer *tok, const int32_t *ids, size_t n, int flags, size_t *out_n, int *valid) {
    ds_err err;
    ds_detok_stream *s;
    if (ds_detok_stream_new(tok, flags, &s, &err)) return NULL;
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    *valid = 1;
    for (size_t i = 0; i <= n; i++) {
        const char *t;
        size_t tn;
        if (i < n) {
            if (ds_detok_stream_push(s, ids[i], &t, &tn, &err)) {
                *valid = 0;
                break;
            }
        } else {
            ds_detok_stream_flush(s, &t, &tn);
        }
        if (ds_utf8_valid_prefix(t, tn) != tn) *valid = 0;
        while (len + tn + 1 > cap) cap *= 2;
        buf = realloc(buf, cap);
        memcpy(buf + len, t, tn);
        len += tn;
    }
    buf[len] = 0;
    ds_detok_stream_free(s);
    *out_n = len;
    return buf;
}

/* Runs one fixture file (cases_*.json) against a tokenizer. */
static void run_cases(ds_tokenizer *tok, const cJSON *fx, const char *name) {
    const cJSON *cases = cJSON_GetObjectItem(fx, "cases");
    int n_cases = 0, n_ok[3] = {0, 0, 0}, n_checked[3] = {0, 0, 0}, n_rt = 0, n_stream = 0;
    size_t total_tokens = 0;
    const char *keys[3] = {"ids", "ids_nospecial", "ids_plain"};
    const int modes[3] = {DS_TOK_PARSE_ALL, DS_TOK_PARSE_NONSPECIAL, DS_TOK_PARSE_NONE};
    for (const cJSON *c = cases->child; c; c = c->next, n_cases++) {
        size_t tn;
        char *text = b64dec(cJSON_GetObjectItem(c, "b64")->valuestring, &tn);
        const cJSON *base = cJSON_GetObjectItem(c, "ids");
        int long_doc = tn > 20000;
        for (int m = 0; m < 3; m++) {
            const cJSON *exp = cJSON_GetObjectItem(c, keys[m]);
            if (!exp) {
                if (m == 1 && !cJSON_IsTrue(cJSON_GetObjectItem(fx, "has_nospecial"))) continue;
                if (long_doc) continue;
                exp = base; /* stored only where it differs */
            }
            size_t ne, ng, d;
            int32_t *want = json_ids(exp, &ne), *got;
            ds_err err;
            int rc = ds_tokenizer_encode(tok, text, tn, modes[m], &got, &ng, &err);
            n_checked[m]++;
            if (rc) {
                CHECK(0, "%s case %d: encode failed: %s", name, n_cases, err.msg);
            } else if (!same_ids(got, ng, want, ne, &d)) {
                CHECK(0, "%s case %d mode %s: %zu ids, want %zu; first difference at %zu: got %d want %d", name,
                      n_cases, keys[m], ng, ne, d, d < ng ? (int)got[d] : -1, d < ne ? (int)want[d] : -1);
                show(text, tn);
            } else {
                n_ok[m]++;
                if (m == 0) total_tokens += ng;
            }
            /* decode(encode(x)) == x (unless lstrip / rstrip swallowed whitespace) */
            if (!rc && m != 1 && !cJSON_GetObjectItem(c, "decode_differs")) {
                char *back;
                size_t bn;
                if (ds_tokenizer_decode(tok, got, ng, 0, &back, &bn, &err) == 0) {
                    if (bn == tn && !memcmp(back, text, tn)) n_rt++;
                    else CHECK(0, "%s case %d mode %s: decode(encode(x)) != x", name, n_cases, keys[m]);
                    free(back);
                } else {
                    CHECK(0, "%s case %d: decode failed: %s", name, n_cases, err.msg);
                }
                if (m == 0) {
                    size_t sn;
                    int valid;
                    char *st = stream_all(tok, got, ng, 0, &sn, &valid);
                    if (st && valid && sn == tn && !memcmp(st, text, tn)) n_stream++;
                    else CHECK(0, "%s case %d: streamed text differs or is not valid UTF-8", name, n_cases);
                    free(st);
                }
            }
            if (!rc) free(got);
            free(want);
        }
        free(text);
    }
    for (int m = 0; m < 3; m++)
        printf("%s: %s: %d/%d cases match `tokenizers`\n", name, keys[m], n_ok[m], n_checked[m]);
    printf("%s: %d round trips, %d streamed, %zu tokens\n", name, n_rt, n_stream, total_tokens);
    CHECK(n_ok[0] == n_cases && n_cases > 0, "%s: %d/%d cases", name, n_ok[0], n_cases);

    /* decode cases: random ids, lossy, with and without skip_special */
    int n_dec = 0, n_dec_ok = 0, n_str_ok = 0;
    for (const cJSON *c = cJSON_GetObjectItem(fx, "decode")->child; c; c = c->next, n_dec++) {
        size_t n, en;
        int32_t *ids = json_ids(cJSON_GetObjectItem(c, "ids"), &n);
        char *want = b64dec(cJSON_GetObjectItem(c, "b64")->valuestring, &en);
        int skip = cJSON_IsTrue(cJSON_GetObjectItem(c, "skip_special"));
        int flags = DS_DECODE_LOSSY | (skip ? DS_DECODE_SKIP_SPECIAL : 0);
        char *got;
        size_t gn;
        ds_err err;
        if (ds_tokenizer_decode(tok, ids, n, flags, &got, &gn, &err) == 0) {
            if (gn == en && !memcmp(got, want, en)) n_dec_ok++;
            else {
                CHECK(0, "%s decode case %d differs (%zu bytes, want %zu)", name, n_dec, gn, en);
                show(got, gn);
                show(want, en);
            }
            free(got);
        } else {
            CHECK(0, "%s decode case %d: %s", name, n_dec, err.msg);
        }
        size_t sn;
        int valid;
        char *st = stream_all(tok, ids, n, flags & DS_DECODE_SKIP_SPECIAL, &sn, &valid);
        if (st && valid && sn == en && !memcmp(st, want, en)) n_str_ok++;
        else CHECK(0, "%s decode case %d: stream differs from lossy decode", name, n_dec);
        free(st);
        free(ids);
        free(want);
    }
    printf("%s: decode: %d/%d match `tokenizers` (lossy), %d/%d streamed alike\n", name, n_dec_ok, n_dec, n_str_ok,
           n_dec);
    CHECK(n_dec_ok == n_dec && n_dec > 0, "%s: decode cases", name);
}

static ds_tokenizer *load_rel(const char *rel) {
    char path[1024];
    test_path(path, sizeof path, rel);
    ds_tokenizer *tok = NULL;
    ds_err err;
    if (ds_tokenizer_load(path, &tok, &err)) {
        CHECK(0, "load %s: %s", rel, err.msg);
        return NULL;
    }
    return tok;
}

static void test_fixture(const char *tok_rel, const char *cases_rel, const char *name) {
    ds_tokenizer *tok = load_rel(tok_rel);
    cJSON *fx = load_json(cases_rel);
    CHECK(fx != NULL, "cannot read %s", cases_rel);
    if (tok && fx) {
        CHECK(ds_tokenizer_vocab_size(tok) == cJSON_GetObjectItem(fx, "tokenizer_vocab_size")->valueint,
              "%s vocab size %d", name, ds_tokenizer_vocab_size(tok));
        run_cases(tok, fx, name);
    }
    cJSON_Delete(fx);
    ds_tokenizer_free(tok);
}

/* The real DeepSeek-V3 tokenizer.json is not in the repository: used when
 * DSV4_DS3_TOKENIZER names it or ref/tokenizer/deepseek_v3/ holds it. */
static void test_ds3(void) {
    char path[1024];
    const char *env = getenv("DSV4_DS3_TOKENIZER");
    if (env) snprintf(path, sizeof path, "%s", env);
    else test_path(path, sizeof path, "ref/tokenizer/deepseek_v3/tokenizer.json");
    struct stat st;
    if (stat(path, &st)) {
        printf("ds3: skipped (no DeepSeek-V3 tokenizer.json at %s; set DSV4_DS3_TOKENIZER)\n", path);
        return;
    }
    ds_tokenizer *tok = NULL;
    ds_err err;
    if (ds_tokenizer_load(path, &tok, &err)) {
        CHECK(0, "load %s: %s", path, err.msg);
        return;
    }
    cJSON *fx = load_json("tests/fixtures/tokenizer/cases_ds3.json");
    CHECK(fx != NULL, "cannot read cases_ds3.json");
    if (fx) {
        run_cases(tok, fx, "ds3");
        CHECK(ds_tokenizer_vocab_size(tok) == 128815, "ds3 vocab size %d", ds_tokenizer_vocab_size(tok));
        CHECK(ds_tokenizer_bos_id(tok) == 0 && ds_tokenizer_eos_id(tok) == 1, "ds3 bos/eos");
        CHECK(ds_tokenizer_token_id(tok, "<\xef\xbd\x9cUser\xef\xbd\x9c>") == 128803, "ds3 <｜User｜>");
        CHECK(ds_tokenizer_is_special(tok, 0) && !ds_tokenizer_is_special(tok, 128803), "ds3 special flags");
    }
    cJSON_Delete(fx);
    ds_tokenizer_free(tok);
}

static void test_lookups(void) {
    /* a model directory holding tokenizer.json */
    char dir[] = "/tmp/dsv4_tokdir_XXXXXX", src[1024], dst[1100];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    test_path(src, sizeof src, "tests/fixtures/tokenizer/tok_small.json");
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    size_t sn;
    char *body = slurp(src, &sn);
    FILE *f = fopen(dst, "wb");
    CHECK(body && f && fwrite(body, 1, sn, f) == sn, "copy tokenizer.json");
    if (f) fclose(f);
    free(body);
    ds_tokenizer *tok = NULL;
    ds_err lerr;
    CHECK(ds_tokenizer_load(dir, &tok, &lerr) == 0, "load a directory: %s", lerr.msg);
    unlink(dst);
    rmdir(dir);
    if (!tok) return;
    CHECK(ds_tokenizer_vocab_size(tok) == 3024, "vocab size %d", ds_tokenizer_vocab_size(tok));
    CHECK(ds_tokenizer_bos_id(tok) == 0, "bos %d", ds_tokenizer_bos_id(tok));
    CHECK(ds_tokenizer_eos_id(tok) == 1, "eos %d", ds_tokenizer_eos_id(tok));
    CHECK(ds_tokenizer_token_id(tok, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") == 0,
          "bos lookup");
    int32_t think = ds_tokenizer_token_id(tok, "<think>");
    CHECK(think > 0 && ds_tokenizer_is_added(tok, think) && !ds_tokenizer_is_special(tok, think), "<think> %d", think);
    CHECK(ds_tokenizer_is_special(tok, 1), "eos special");
    CHECK(ds_tokenizer_token_id(tok, "no such token") == -1, "unknown token");
    CHECK(ds_tokenizer_token_id(tok, "\xc4\xa0") >= 0, "byte-level space symbol");
    size_t n;
    const char *b = ds_tokenizer_token_bytes(tok, ds_tokenizer_token_id(tok, "\xc4\xa0"), &n);
    CHECK(b && n == 1 && b[0] == ' ', "token bytes of Ġ");
    CHECK(ds_tokenizer_token_bytes(tok, -1, &n) == NULL && ds_tokenizer_token_bytes(tok, 1 << 30, &n) == NULL,
          "bytes of bad ids");
    CHECK(!strcmp(ds_tokenizer_token_str(tok, think), "<think>"), "token str");

    /* decode errors */
    int32_t bad[2] = {5, 999999};
    char *out;
    size_t on;
    ds_err err;
    CHECK(ds_tokenizer_decode(tok, bad, 2, 0, &out, &on, &err) == -1 && strstr(err.msg, "999999") &&
              strstr(err.msg, "out of range"),
          "out of range id: %s", err.msg);
    bad[1] = -3;
    CHECK(ds_tokenizer_decode(tok, bad, 2, 0, &out, &on, &err) == -1, "negative id");
    CHECK(ds_tokenizer_decode(tok, bad, 0, 0, &out, &on, &err) == 0 && on == 0 && out && out[0] == 0, "empty decode");
    free(out);
    int32_t *ids;
    CHECK(ds_tokenizer_encode(tok, "", 0, DS_TOK_PARSE_ALL, &ids, &n, &err) == 0 && n == 0, "empty encode");
    free(ids);
    CHECK(ds_tokenizer_encode(tok, "x", 1, 7, &ids, &n, &err) == -1, "bad parse mode");
    ds_tokenizer_free(tok);
}

/* xorshift */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* the id of the byte-level symbol of one byte (a lone byte encodes to it) */
static int32_t byte_token(ds_tokenizer *tok, unsigned char b) {
    int32_t *ids, id = -1;
    size_t n;
    ds_err err;
    char c = (char)b;
    if (ds_tokenizer_encode(tok, &c, 1, DS_TOK_PARSE_NONE, &ids, &n, &err) == 0) {
        if (n == 1) id = ids[0];
        free(ids);
    }
    return id;
}

static void test_invalid_utf8_and_stream(void) {
    ds_tokenizer *tok = load_rel("tests/fixtures/tokenizer/tok_small.json");
    if (!tok) return;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    const char *frag[] = {"\xff", "\xfe", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe4\xb8", "\xe4",
                          "\x80\x80", "a", " ", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "<think>", "\n", "1",
                          "\xcc\x81", "<\xef\xbd\x9cUser\xef\xbd\x9c>", "\xef\xbd", "\xc3\xa9", "  "};
    int n_rt = 0, n_valid = 0, n = 300;
    for (int it = 0; it < n; it++) {
        char buf[512];
        size_t len = 0;
        int parts = (int)(rng_next(&seed) % 24);
        for (int p = 0; p < parts; p++) {
            if (rng_next(&seed) % 4 == 0) {
                buf[len++] = (char)(rng_next(&seed) & 0xff); /* any byte */
            } else {
                const char *f = frag[rng_next(&seed) % (sizeof frag / sizeof frag[0])];
                memcpy(buf + len, f, strlen(f));
                len += strlen(f);
            }
        }
        for (int mode = 0; mode < 3; mode++) {
            int32_t *ids;
            size_t ni;
            ds_err err;
            if (ds_tokenizer_encode(tok, buf, len, mode, &ids, &ni, &err)) {
                CHECK(0, "encode of random bytes failed: %s", err.msg);
                continue;
            }
            char *back;
            size_t bn;
            if (ds_tokenizer_decode(tok, ids, ni, 0, &back, &bn, &err) == 0) {
                if (bn == len && !memcmp(back, buf, len)) n_rt++;
                else {
                    CHECK(0, "bytes round trip (mode %d)", mode);
                    show(buf, len);
                }
                free(back);
            }
            if (mode == 1) {
                size_t sn;
                int valid;
                char *st = stream_all(tok, ids, ni, 0, &sn, &valid);
                char *lossy;
                size_t ln;
                ds_tokenizer_decode(tok, ids, ni, DS_DECODE_LOSSY, &lossy, &ln, &err);
                if (valid && sn == ln && !memcmp(st, lossy, ln) && ds_utf8_valid_prefix(lossy, ln) == ln) n_valid++;
                else CHECK(0, "stream of random bytes: valid %d, %zu vs %zu bytes", valid, sn, ln);
                free(st);
                free(lossy);
            }
            free(ids);
        }
    }
    printf("invalid UTF-8: %d/%d byte round trips, %d/%d streams valid and equal to lossy decode\n", n_rt, 3 * n,
           n_valid, n);
    CHECK(n_rt == 3 * n && n_valid == n, "random bytes");

    /* a character split across byte tokens is held back until complete */
    ds_detok_stream *s;
    ds_err err;
    CHECK(ds_detok_stream_new(tok, 0, &s, &err) == 0, "stream new");
    const char *t;
    size_t tn;
    int32_t e4 = byte_token(tok, 0xe4), b8 = byte_token(tok, 0xb8), ad = byte_token(tok, 0xad),
            a = ds_tokenizer_token_id(tok, "a");
    CHECK(e4 >= 0 && b8 >= 0 && ad >= 0 && a >= 0, "byte tokens");
    ds_detok_stream_push(s, a, &t, &tn, &err);
    CHECK(tn == 1 && t[0] == 'a', "a");
    ds_detok_stream_push(s, e4, &t, &tn, &err);
    CHECK(tn == 0, "E4 held back");
    ds_detok_stream_push(s, b8, &t, &tn, &err);
    CHECK(tn == 0, "E4 B8 held back");
    ds_detok_stream_push(s, ad, &t, &tn, &err);
    CHECK(tn == 3 && !memcmp(t, "\xe4\xb8\xad", 3), "中 complete");
    ds_detok_stream_push(s, e4, &t, &tn, &err);
    ds_detok_stream_push(s, a, &t, &tn, &err);
    CHECK(tn == 4 && !memcmp(t, "\xef\xbf\xbd" "a", 4), "broken sequence replaced: %zu", tn);
    ds_detok_stream_push(s, e4, &t, &tn, &err);
    ds_detok_stream_flush(s, &t, &tn);
    CHECK(tn == 3 && !memcmp(t, "\xef\xbf\xbd", 3), "flush of an incomplete tail");
    ds_detok_stream_flush(s, &t, &tn);
    CHECK(tn == 0, "second flush empty");
    CHECK(ds_detok_stream_push(s, 1 << 30, &t, &tn, &err) == -1, "stream: bad id");
    int32_t eos = ds_tokenizer_eos_id(tok);
    ds_detok_stream_free(s);
    CHECK(ds_detok_stream_new(tok, DS_DECODE_SKIP_SPECIAL, &s, &err) == 0, "stream new skip");
    ds_detok_stream_push(s, eos, &t, &tn, &err);
    CHECK(tn == 0, "skip special in stream");
    ds_detok_stream_free(s);

    /* lossy helper: maximal subparts */
    char *lb = NULL;
    size_t ll = 0, lc = 0;
    ds_utf8_lossy_append(&lb, &ll, &lc, "a\xf0\x9f\x98" "b\xed\xa0\x80" "c", 9);
    CHECK(ll == 1 + 3 + 1 + 9 + 1 && !memcmp(lb, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "c", ll),
          "lossy maximal subparts (%zu bytes)", ll);
    free(lb);
    ds_tokenizer_free(tok);
}

/* GPT-2's bytes_to_unicode: the code point standing for byte b. */
static unsigned gpt2_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256 + n;
}

/* A tokenizer.json: ByteLevel, vocab = the 256 byte symbols (byte b has id b)
 * + "ab" (id 256, merge "a b"), then the added tokens with ids 257, ...
 * (special as given). Caller frees. */
static char *byte_vocab_json(const char *const *added, int n_added, int special) {
    cJSON *root = cJSON_CreateObject(), *pt = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pt, "type", "ByteLevel");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type", "ByteLevel");
    cJSON *model = cJSON_AddObjectToObject(root, "model"), *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = gpt2_cp(b);
        char sym[4] = {0};
        if (cp < 0x80)
            sym[0] = (char)cp;
        else
            sym[0] = (char)(0xc0 | (cp >> 6)), sym[1] = (char)(0x80 | (cp & 0x3f));
        cJSON_AddNumberToObject(vocab, sym, b);
    }
    cJSON_AddNumberToObject(vocab, "ab", 256);
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    cJSON_AddItemToArray(merges, cJSON_CreateString("a b"));
    cJSON *add = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < n_added; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", 257 + i);
        cJSON_AddStringToObject(a, "content", added[i]);
        cJSON_AddBoolToObject(a, "special", special);
        cJSON_AddItemToArray(add, a);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static void expect_load_error(const char *json, const char *needle, const char *what) {
    ds_tokenizer *tok = NULL;
    ds_err err = {{0}};
    int rc = ds_tokenizer_load_json(json, strlen(json), "t.json", &tok, &err);
    CHECK(rc == -1 && tok == NULL && strstr(err.msg, needle) && strstr(err.msg, "t.json"),
          "%s: rc %d, message '%s' lacks '%s'", what, rc, err.msg, needle);
}

#define PRE                                                                                                        \
    "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "         \
    "{\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", " \
    "\"add_prefix_space\": false, \"use_regex\": false}]}, \"decoder\": {\"type\": \"ByteLevel\"}, "

static void test_bad_input(void) {
    expect_load_error("{not json", "not valid JSON", "not JSON");
    expect_load_error("[1, 2]", "not a JSON object", "array");
    expect_load_error("{" PRE "\"x\": 1}", "no \"model\"", "no model");
    expect_load_error("{" PRE "\"model\": {\"type\": \"BPE\", \"merges\": []}}", "model.vocab", "no vocab");
    expect_load_error("{" PRE "\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "WordPiece",
                      "model type");
    expect_load_error("{" PRE "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
                      "merges[0]: token \"c\" is not in model.vocab", "unknown merge token");
    expect_load_error("{" PRE
                      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
                      "merged token \"ab\"", "merged token missing");
    expect_load_error("{" PRE "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}}",
                      "not of the form", "merge without space");
    expect_load_error("{" PRE "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [3]}}",
                      "merges[0]", "merge not a string");
    expect_load_error("{" PRE
                      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", "model.vocab[\"a\"]", "negative id");
    expect_load_error("{" PRE
                      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}}}", "model.vocab[\"a\"]",
                      "fractional id");
    expect_load_error("{" PRE
                      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}", "share id", "shared id");
    expect_load_error("{" PRE "\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "empty", "empty vocab");
    expect_load_error("{" PRE
                      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"z\"}}", "unk_token",
                      "unk not in vocab");
    expect_load_error("{" PRE "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"dropout\": 0.1}}", "dropout",
                      "dropout");
    expect_load_error("{" PRE
                      "\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": \"x\", \"content\": \"<s>\"}]}",
                      "added_tokens[0]", "added token bad id");
    expect_load_error("{" PRE "\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 3}]}", "content",
                      "added token without content");
    expect_load_error("{" PRE
                      "\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": {}}", "added_tokens", "added not array");
    expect_load_error("{" PRE "\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"vocab\": {\"a\": 0}}}", "NFC",
                      "normalizer");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"decoder\": {\"type\": \"ByteLevel\"}, "
                      "\"model\": {\"vocab\": {\"a\": 0}}}",
                      "Whitespace", "pre_tokenizer type");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
                      "\"Isolated\"}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {\"a\": 0}}}",
                      "\"Split\"", "lone split");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                      "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
                      "\"use_regex\": false}]}, \"decoder\": {\"type\": \"ByteLevel\"}, "
                      "\"model\": {\"vocab\": {\"a\": 0}}}",
                      "bad regex", "bad regex");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                      "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\"}]}, "
                      "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {\"a\": 0}}}",
                      "Removed", "split behavior");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}, \"decoder\": "
                      "{\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {\"a\": 0}}}",
                      "add_prefix_space", "prefix space");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"WordPiece\"}, "
                      "\"model\": {\"vocab\": {\"a\": 0}}}",
                      "decoder", "decoder type");
    expect_load_error("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {\"a\": 0}}}", "decoder",
                      "no decoder");
    expect_load_error("{\"model\": {\"vocab\": {\"a\": 0}}}", "pre_tokenizer", "no pre_tokenizer");
    expect_load_error("", "not valid JSON", "empty file");

    /* a vocabulary without all 256 byte symbols is refused (it used to load and
     * drop bytes, reaching memcpy(NULL) for a text of only such bytes) */
    const char *nobytes = "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}, "
                          "\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\xc4\xa0\": 3}, \"merges\": "
                          "[\"a b\"]}, \"added_tokens\": [{\"id\": 4, \"content\": \"<s>\", \"special\": true}]}";
    expect_load_error(nobytes, "lacks the byte-level symbol", "missing byte symbols");
    expect_load_error(nobytes, "byte 0x00", "missing byte symbols: names the byte");

    /* an added token taking a model token's id with another text (found by fuzz_tokenizer_load:
     * the model token "Ċ", byte 0x0A, then decoded as "<｜User｜>", so "\n" did not round trip) */
    {
        const char *added_u[] = {"<\xef\xbd\x9cUser\xef\xbd\x9c>"};
        char *js = byte_vocab_json(added_u, 1, 0);
        cJSON *r = cJSON_Parse(js);
        cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0), "id"),
                             10);
        char *js2 = cJSON_PrintUnformatted(r);
        expect_load_error(js2, "added_tokens[0]: id 10 is the model token", "added token on a model token's id");
        free(js2);
        cJSON_Delete(r);
        free(js);
        char crash[1024];
        test_path(crash, sizeof crash, "tests/fixtures/fuzz/tokenizer_load-crash-7068cb2c.json");
        ds_tokenizer *ct = NULL;
        ds_err ce = {{0}};
        CHECK(ds_tokenizer_load(crash, &ct, &ce) == -1 && strstr(ce.msg, "added_tokens"),
              "fuzz crash 7068cb2c: %s", ce.msg);
        ds_tokenizer_free(ct);
    }

    /* a minimal valid file: ByteLevel with the GPT-2 regex; byte b's symbol has id b */
    ds_tokenizer *tok = NULL;
    ds_err err;
    const char *added_s[] = {"<s>"};
    char *ok = byte_vocab_json(added_s, 1, 1);
    CHECK(ok && ds_tokenizer_load_json(ok, strlen(ok), "ok.json", &tok, &err) == 0, "minimal file: %s", err.msg);
    free(ok);
    if (tok) {
        int32_t *ids;
        size_t n;
        /* "ab" | <s> | " ab" "z": ids from the construction (ab = 256, <s> = 257) */
        CHECK(ds_tokenizer_encode(tok, "ab<s> abz", 9, DS_TOK_PARSE_ALL, &ids, &n, &err) == 0 && n == 5 &&
                  ids[0] == 256 && ids[1] == 257 && ids[2] == ' ' && ids[3] == 256 && ids[4] == 'z',
              "minimal encode (n=%zu)", n);
        free(ids);
        CHECK(ds_tokenizer_vocab_size(tok) == 258, "minimal vocab size");
        ds_tokenizer_free(tok);
    }

    /* missing paths */
    CHECK(ds_tokenizer_load("/nonexistent/dir", &tok, &err) == -1 && strstr(err.msg, "/nonexistent/dir"),
          "missing path: %s", err.msg);
    char dir[1024];
    test_path(dir, sizeof dir, "tests");
    CHECK(ds_tokenizer_load(dir, &tok, &err) == -1 && strstr(err.msg, "no tokenizer.json"), "dir without file: %s",
          err.msg);
    char tmpl[] = "/tmp/dsv4_tok_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) {
        CHECK(write(fd, "{\"model\": ", 10) == 10, "write");
        close(fd);
        CHECK(ds_tokenizer_load(tmpl, &tok, &err) == -1 && strstr(err.msg, tmpl) && strstr(err.msg, "JSON"),
              "truncated file: %s", err.msg);
        unlink(tmpl);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Throughput on ~4 MB built from the fixture texts (reported, not checked). */
static void bench(void) {
    ds_tokenizer *tok = load_rel("tests/fixtures/tokenizer/tok_small.json");
    cJSON *fx = load_json("tests/fixtures/tokenizer/cases_small.json");
    if (!tok || !fx) {
        cJSON_Delete(fx);
        ds_tokenizer_free(tok);
        return;
    }
    size_t cap = 4u << 20, len = 0;
    char *big = malloc(cap + 65536);
    while (len < cap)
        for (const cJSON *c = cJSON_GetObjectItem(fx, "cases")->child; c && len < cap; c = c->next) {
            size_t n;
            char *t = b64dec(cJSON_GetObjectItem(c, "b64")->valuestring, &n);
            if (n < 65536) {
                memcpy(big + len, t, n);
                len += n;
            }
            free(t);
        }
    int32_t *ids;
    size_t n;
    ds_err err;
    double t0 = now_s();
    int rc = ds_tokenizer_encode(tok, big, len, DS_TOK_PARSE_ALL, &ids, &n, &err);
    double dt = now_s() - t0;
    CHECK(rc == 0, "bench encode");
    if (!rc) {
        printf("bench: %zu bytes -> %zu tokens in %.3f s: %.0f tokens/s (3k-vocab fixture tokenizer)\n", len, n, dt,
               (double)n / dt);
        free(ids);
    }
    free(big);
    cJSON_Delete(fx);
    ds_tokenizer_free(tok);
}

static double now_s(void);

/* Added-token matching is linear in the text: 100 kB of 'a' against a 50 kB
 * added token "aaa...ab" that never matches took 9 s with the trie scan
 * (O(text x token length)); and overlapping / nested tokens still give the
 * leftmost-longest match. */
static void test_added_matching(void) {
    size_t tl = 50000, n = 100000;
    char *longtok = malloc(tl + 1), *text = malloc(n + 1);
    memset(longtok, 'a', tl - 1);
    longtok[tl - 1] = 'b', longtok[tl] = 0;
    memset(text, 'a', n);
    text[n] = 0;
    const char *added[] = {longtok, "aab", "xyz", "yz", "xyzw", "zw"};
    char *json = byte_vocab_json(added, 6, 0);
    ds_tokenizer *tok = NULL;
    ds_err err = {{0}};
    CHECK(json && ds_tokenizer_load_json(json, strlen(json), "ac.json", &tok, &err) == 0, "ac load: %s", err.msg);
    free(json);
    if (tok) {
        int32_t *ids = NULL;
        size_t nid = 0;
        double t0 = now_s();
        int rc = ds_tokenizer_encode(tok, text, n, DS_TOK_PARSE_ALL, &ids, &nid, &err);
        double dt = now_s() - t0;
        CHECK(rc == 0 && nid > 0, "long added token: encode");
        CHECK(dt < 2.0, "100 kB text vs a 50 kB added token took %.2f s (must be linear)", dt);
        free(ids);
        /* leftmost-longest among overlapping tokens: "xyzw" at 0 (not "xyz"), then "aab" */
        rc = ds_tokenizer_encode(tok, "xyzwaab", 7, DS_TOK_PARSE_ALL, &ids, &nid, &err);
        CHECK(rc == 0 && nid == 2 && ids[0] == 257 + 4 && ids[1] == 257 + 1, "xyzw aab: n=%zu", nid);
        free(ids);
        /* "qxyz": leftmost start wins over a longer later one ("yz" is not preferred to "xyz") */
        rc = ds_tokenizer_encode(tok, "qxyzq", 5, DS_TOK_PARSE_ALL, &ids, &nid, &err);
        CHECK(rc == 0 && nid == 3 && ids[0] == 'q' && ids[1] == 257 + 2 && ids[2] == 'q', "qxyzq: n=%zu", nid);
        free(ids);
        /* "yzw": "yz" starts at 0, before "zw" */
        rc = ds_tokenizer_encode(tok, "yzw", 3, DS_TOK_PARSE_ALL, &ids, &nid, &err);
        CHECK(rc == 0 && nid == 2 && ids[0] == 257 + 3 && ids[1] == 'w', "yzw: n=%zu", nid);
        free(ids);

        /* plain marks: no added token over a marked byte */
        const char *t = "xyzwaab";
        unsigned char none[7] = {0}, all[7] = {1, 1, 1, 1, 1, 1, 1}, mid[7] = {0, 0, 1, 0, 0, 0, 0};
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK(ds_tokenizer_encode_masked(tok, t, 7, DS_TOK_PARSE_ALL, none, &a, &na, &err) == 0 &&
                  ds_tokenizer_encode(tok, t, 7, DS_TOK_PARSE_ALL, &b, &nb, &err) == 0 && na == nb &&
                  !memcmp(a, b, na * sizeof *a),
              "no marks: same as encode");
        free(a), free(b);
        CHECK(ds_tokenizer_encode_masked(tok, t, 7, DS_TOK_PARSE_ALL, all, &a, &na, &err) == 0 &&
                  ds_tokenizer_encode(tok, t, 7, DS_TOK_PARSE_NONE, &b, &nb, &err) == 0 && na == nb &&
                  !memcmp(a, b, na * sizeof *a),
              "all marked: same as plain encode");
        free(a), free(b);
        /* 'z' (byte 2) marked: xyzw, xyz, yz and zw all cover it; "aab" still matches */
        CHECK(ds_tokenizer_encode_masked(tok, t, 7, DS_TOK_PARSE_ALL, mid, &a, &na, &err) == 0 && na >= 2 &&
                  a[na - 1] == 257 + 1,
              "z marked: aab matched");
        for (size_t i = 0; i + 1 < na; i++) CHECK(a[i] < 257, "z marked: no added token before aab (id %d)", a[i]);
        free(a);
        ds_tokenizer_free(tok);
    }
    free(longtok);
    free(text);
}

int main(void) {
    test_fixture("tests/fixtures/tokenizer/tok_small.json", "tests/fixtures/tokenizer/cases_small.json", "small");
    test_fixture("tests/fixtures/tokenizer/tok_flags.json", "tests/fixtures/tokenizer/cases_flags.json", "flags");
    test_ds3();
    test_lookups();
    test_invalid_utf8_and_stream();
    test_bad_input();
    test_added_matching();
    bench();
    return test_summary("test_tokenizer");
}
