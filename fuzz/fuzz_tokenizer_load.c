/* fuzz_tokenizer_load.c — libFuzzer target: a tokenizer.json text ->
 * ds_tokenizer_load_json; when it loads, a fixed text with added-token and
 * invalid-UTF-8 bytes is encoded in every mode and decoded back (the exact
 * bytes must come back: every accepted tokenizer holds all 256 byte symbols). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds_tokenizer *tok = NULL;
    ds_err err = {{0}};
    if (ds_tokenizer_load_json((const char *)data, size, "fuzz.json", &tok, &err) != 0) {
        if (!err.msg[0]) abort();
        return 0;
    }
    static const char text[] = "Hello <s> world\xff\xfe 123 \xe4\xb8\xad<|x|> \n\n  tabs\t!";
    size_t tn = sizeof text - 1;
    for (int mode = DS_TOK_PARSE_NONE; mode <= DS_TOK_PARSE_NONSPECIAL; mode++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ds_tokenizer_encode(tok, text, tn, mode, &ids, &n, &err) != 0) abort();
        char *out = NULL;
        size_t on = 0;
        if (ds_tokenizer_decode(tok, ids, n, 0, &out, &on, &err) != 0) abort();
        /* plain text must round trip exactly; with added tokens too, unless an
         * added token strips whitespace (lstrip / rstrip drop bytes, as tokenizers does) */
        if (mode == DS_TOK_PARSE_NONE && (on != tn || memcmp(out, text, tn))) abort();
        free(out);
        free(ids);
    }
    ds_tokenizer_free(tok);
    return 0;
}
