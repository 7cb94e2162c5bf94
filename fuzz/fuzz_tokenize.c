/* fuzz_tokenize.c — libFuzzer target: any bytes through the fixture tokenizer
 * (tests/fixtures/tokenizer/tok_small.json, a DeepSeek-style vocabulary with
 * its added tokens): encode in each mode, decode exactly (plain text must round
 * trip), lossy decode and the streaming detokenizer (equal to the lossy
 * decode), and the masked encoding (all bytes plain = plain encoding). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ds_tokenizer *fixture(void) {
    static ds_tokenizer *tok;
    if (!tok) {
        ds_err err;
        const char *p = getenv("DSV4_FUZZ_TOKENIZER");
        if (!p) p = DSV4_SOURCE_DIR "/tests/fixtures/tokenizer/tok_small.json";
        if (ds_tokenizer_load(p, &tok, &err)) {
            fprintf(stderr, "fuzz_tokenize: %s\n", err.msg);
            abort();
        }
    }
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds_tokenizer *tok = fixture();
    const char *text = (const char *)data;
    ds_err err;
    int32_t *plain_ids = NULL;
    size_t n_plain = 0;
    for (int mode = DS_TOK_PARSE_NONE; mode <= DS_TOK_PARSE_NONSPECIAL; mode++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ds_tokenizer_encode(tok, text, size, mode, &ids, &n, &err) != 0) abort();
        char *out = NULL;
        size_t on = 0;
        if (ds_tokenizer_decode(tok, ids, n, 0, &out, &on, &err) != 0) abort();
        if (mode == DS_TOK_PARSE_NONE && (on != size || (size && memcmp(out, text, size)))) abort();
        free(out);
        /* lossy decode = the streamed text */
        char *lossy = NULL;
        size_t ln = 0;
        if (ds_tokenizer_decode(tok, ids, n, DS_DECODE_LOSSY, &lossy, &ln, &err) != 0) abort();
        ds_detok_stream *s = NULL;
        if (ds_detok_stream_new(tok, 0, &s, &err) != 0) abort();
        char *acc = malloc(ln + 1);
        size_t an = 0;
        for (size_t i = 0; i < n; i++) {
            const char *t;
            size_t tl;
            if (ds_detok_stream_push(s, ids[i], &t, &tl, &err) != 0) abort();
            if (an + tl > ln || memcmp(lossy + an, t, tl)) abort();
            memcpy(acc + an, t, tl);
            an += tl;
        }
        const char *t;
        size_t tl;
        ds_detok_stream_flush(s, &t, &tl);
        if (an + tl != ln || memcmp(lossy + an, t, tl)) abort();
        ds_detok_stream_free(s);
        free(acc);
        free(lossy);
        if (mode == DS_TOK_PARSE_NONE) {
            plain_ids = ids;
            n_plain = n;
        } else {
            free(ids);
        }
    }
    /* every byte marked plain: the plain encoding */
    unsigned char *mask = malloc(size ? size : 1);
    memset(mask, 1, size);
    int32_t *ids = NULL;
    size_t n = 0;
    if (ds_tokenizer_encode_masked(tok, text, size, DS_TOK_PARSE_ALL, mask, &ids, &n, &err) != 0) abort();
    if (n != n_plain || (n && memcmp(ids, plain_ids, n * sizeof *ids))) abort();
    free(ids);
    free(mask);
    free(plain_ids);
    return 0;
}
