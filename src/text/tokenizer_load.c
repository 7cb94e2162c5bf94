/* tokenizer_load.c — reading a Hugging Face tokenizer.json into a
 * ds_tokenizer (tokenizer.h): the normalizer and decoder it accepts, the
 * pre-tokenizer's Split regexes (rewritten from Oniguruma for PCRE2), the
 * BPE model's vocabulary and merges, and the added tokens. Errors name the
 * file and the field at fault. */
#include "text/tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/io.h"

/* ----------------------------------------------------------------- regex */

/* Rewrites an Oniguruma pattern for PCRE2: \s -> [\s\x{85}] (in a class:
 * \s\x{85}), \S -> [^\s\x{85}] (refused inside a class). Returns a malloc'ed
 * string or NULL (out of memory / unsupported). */
static char *onig_to_pcre2(const char *p, const char **why) {
    size_t n = strlen(p);
    char *o = malloc(n * 8 + 1);
    if (!o) {
        *why = "out of memory";
        return NULL;
    }
    size_t j = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's') {
                const char *r = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
                memcpy(o + j, r, strlen(r));
                j += strlen(r);
            } else if (d == 'S') {
                if (in_class) {
                    free(o);
                    *why = "\\S inside a character class is not supported";
                    return NULL;
                }
                memcpy(o + j, "[^\\s\\x{85}]", 11);
                j += 11;
            } else {
                o[j++] = c;
                o[j++] = d;
            }
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            o[j++] = c;
            /* a ']' (or '^]') right after '[' is a literal */
            if (i + 1 < n && p[i + 1] == '^') o[j++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') o[j++] = p[++i];
            continue;
        }
        if (c == '[' && in_class) {
            free(o);
            *why = "nested character classes are not supported";
            return NULL;
        }
        if (c == ']' && in_class) in_class = 0;
        o[j++] = c;
    }
    o[j] = 0;
    return o;
}

static pcre2_code *compile_re(const char *pattern, const char *what, ds_err *err) {
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        ds_fail(err, "%s: bad regex at offset %zu: %s", what, (size_t)erroff, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return re;
}

/* ------------------------------------------------------------------ load */

void ds_tokenizer_free(ds_tokenizer *tok) {
    if (!tok) return;
    free(tok->str); /* the strings: model ones in arena, added ones in added[] */
    free(tok->str_len);
    free(tok->bytes);
    free(tok->bytes_len);
    free(tok->kind);
    free(tok->arena);
    ds_tok_strmap_free(&tok->vocab);
    ds_tok_strmap_free(&tok->added_map);
    free(tok->merges);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->trie_raw.nodes);
    free(tok->trie_norm.nodes);
    for (int i = 0; i < tok->n_split; i++) pcre2_code_free(tok->split[i]);
    pcre2_code_free(tok->re_ws);
    pcre2_code_free(tok->re_word);
    if (tok->cache) {
        for (size_t i = 0; i < DS_CACHE_SLOTS; i++) free(tok->cache[i].key);
        free(tok->cache);
    }
    free(tok);
}

static int get_bool(const cJSON *obj, const char *key, int dflt, int *out, const char *what, ds_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return ds_fail(err, "%s: \"%s\" must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* An integer-valued JSON number in [0, DS_MAX_VOCAB_ID). */
static int get_id(const cJSON *v, int32_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < DS_MAX_VOCAB_ID) || d != (double)(int32_t)d) return -1;
    *out = (int32_t)d;
    return 0;
}

static int load_normalizer(const cJSON *root, const char *what, ds_err *err) {
    const cJSON *nz = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!nz || cJSON_IsNull(nz)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(nz, "type");
    if (!cJSON_IsString(type)) return ds_fail(err, "%s: normalizer has no \"type\"", what);
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(nz, "normalizers");
        if (!cJSON_IsArray(list)) return ds_fail(err, "%s: normalizer Sequence has no \"normalizers\" array", what);
        if (cJSON_GetArraySize(list) == 0) return 0;
        const cJSON *t0 = cJSON_GetObjectItemCaseSensitive(list->child, "type");
        return ds_fail(err, "%s: unsupported normalizer %s (only an empty Sequence or none)", what,
                       cJSON_IsString(t0) ? t0->valuestring : "?");
    }
    return ds_fail(err, "%s: unsupported normalizer type \"%s\" (only an empty Sequence or none)", what,
                   type->valuestring);
}

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_split(ds_tokenizer *tok, const char *onig_pattern, const char *what, int index, ds_err *err) {
    if (tok->n_split >= DS_MAX_SPLITS)
        return ds_fail(err, "%s: pre_tokenizer: more than %d Split steps", what, DS_MAX_SPLITS);
    const char *why = NULL;
    char *pat = onig_to_pcre2(onig_pattern, &why);
    if (!pat) return ds_fail(err, "%s: pre_tokenizer step %d: regex %s", what, index, why);
    char where[600];
    snprintf(where, sizeof where, "%s: pre_tokenizer step %d (Split)", what, index);
    pcre2_code *re = compile_re(pat, where, err);
    free(pat);
    if (!re) return -1;
    tok->split[tok->n_split++] = re;
    return 0;
}

static int load_pretok_step(ds_tokenizer *tok, const cJSON *pt, int index, int last, const char *what,
                            ds_err *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return ds_fail(err, "%s: pre_tokenizer step %d has no \"type\"", what, index);
    const char *t = type->valuestring;
    if (!strcmp(t, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *rx = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
        const cJSON *str = pat ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        int invert;
        if (get_bool(pt, "invert", 0, &invert, what, err)) return -1;
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
            return ds_fail(err, "%s: pre_tokenizer step %d: Split behavior \"%s\" is not supported (only Isolated)",
                           what, index, cJSON_IsString(beh) ? beh->valuestring : "?");
        if (invert) return ds_fail(err, "%s: pre_tokenizer step %d: Split invert=true is not supported", what, index);
        if (cJSON_IsString(rx)) return add_split(tok, rx->valuestring, what, index, err);
        if (cJSON_IsString(str)) {
            /* a literal string: quote it for the regex engine */
            size_t n = strlen(str->valuestring);
            char *q = malloc(n + 5);
            if (!q) return ds_fail(err, "%s: out of memory", what);
            snprintf(q, n + 5, "\\Q%s\\E", str->valuestring);
            int r = strstr(str->valuestring, "\\E")
                        ? ds_fail(err, "%s: pre_tokenizer step %d: unsupported String pattern", what, index)
                        : add_split(tok, q, what, index, err);
            free(q);
            return r;
        }
        return ds_fail(err, "%s: pre_tokenizer step %d: Split without a \"pattern\" {\"Regex\": ...}", what, index);
    }
    if (!strcmp(t, "ByteLevel")) {
        int aps, use_regex;
        if (get_bool(pt, "add_prefix_space", 0, &aps, what, err)) return -1;
        if (get_bool(pt, "use_regex", 1, &use_regex, what, err)) return -1;
        if (aps) return ds_fail(err, "%s: pre_tokenizer ByteLevel add_prefix_space=true is not supported", what);
        if (!last) return ds_fail(err, "%s: pre_tokenizer ByteLevel must be the last step", what);
        if (use_regex) return add_split(tok, GPT2_PATTERN, what, index, err);
        return 0;
    }
    return ds_fail(err, "%s: unsupported pre_tokenizer type \"%s\"", what, t);
}

static int load_pretok(ds_tokenizer *tok, const cJSON *root, const char *what, ds_err *err) {
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!pt || cJSON_IsNull(pt))
        return ds_fail(err, "%s: no pre_tokenizer (a byte-level BPE needs ByteLevel)", what);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return ds_fail(err, "%s: pre_tokenizer has no \"type\"", what);
    if (strcmp(type->valuestring, "Sequence")) {
        if (strcmp(type->valuestring, "ByteLevel"))
            return ds_fail(err,
                           "%s: unsupported pre_tokenizer type \"%s\" (Sequence of Split + ByteLevel, or ByteLevel)",
                           what, type->valuestring);
        return load_pretok_step(tok, pt, 0, 1, what, err);
    }
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    if (!cJSON_IsArray(list)) return ds_fail(err, "%s: pre_tokenizer Sequence has no \"pretokenizers\" array", what);
    int n = cJSON_GetArraySize(list), i = 0, saw_bytelevel = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        if (load_pretok_step(tok, it, i, i == n - 1, what, err)) return -1;
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (!strcmp(ty->valuestring, "ByteLevel")) saw_bytelevel = 1;
    }
    if (!saw_bytelevel) return ds_fail(err, "%s: pre_tokenizer Sequence does not end with ByteLevel", what);
    return 0;
}

static int load_decoder(const cJSON *root, const char *what, ds_err *err) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!d || cJSON_IsNull(d)) return ds_fail(err, "%s: no decoder (ByteLevel expected)", what);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(d, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "ByteLevel"))
        return ds_fail(err, "%s: unsupported decoder type \"%s\" (only ByteLevel)", what,
                       cJSON_IsString(type) ? type->valuestring : "?");
    return 0;
}

static int merge_put(ds_tokenizer *tok, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = tok->merge_cap - 1, i = hash_u64(key) & mask;
    while (tok->merges[i].key && tok->merges[i].key != key) i = (i + 1) & mask;
    tok->merges[i].key = key; /* a later duplicate overwrites, as a Rust HashMap collect does */
    tok->merges[i].rank = rank;
    tok->merges[i].id = id;
    return 0;
}

/* Byte-level string of a token -> bytes (NULL if a char is not byte-level). */
static int bytelevel_decode(const char *s, size_t n, const int16_t *cp_to_byte, char *out, size_t *out_n) {
    size_t i = 0, o = 0, l;
    unsigned cp;
    while (i < n) {
        if (ds_tok_utf8_step((const unsigned char *)s + i, n - i, &l, &cp) != 1) return -1;
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (char)cp_to_byte[cp];
        i += l;
    }
    *out_n = o;
    return 0;
}

static int load_model(ds_tokenizer *tok, const cJSON *root, const char *what, ds_err *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return ds_fail(err, "%s: no \"model\" object", what);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !cJSON_IsNull(type) && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")))
        return ds_fail(err, "%s: unsupported model.type \"%s\" (only BPE)", what,
                       cJSON_IsString(type) ? type->valuestring : "?");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return ds_fail(err, "%s: no model.vocab object", what);
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsNull(merges) && !cJSON_IsArray(merges))
        return ds_fail(err, "%s: model.merges must be an array", what);
    const cJSON *v;
    v = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return ds_fail(err, "%s: model.dropout is not supported", what);
    const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        v = cJSON_GetObjectItemCaseSensitive(model, affix[k]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return ds_fail(err, "%s: model.%s is not supported", what, affix[k]);
    }
    if (get_bool(model, "fuse_unk", 0, &tok->fuse_unk, what, err)) return -1;
    if (get_bool(model, "byte_fallback", 0, &tok->byte_fallback, what, err)) return -1;
    if (get_bool(model, "ignore_merges", 0, &tok->ignore_merges, what, err)) return -1;

    /* vocab: find the largest id first */
    int32_t max_id = -1;
    size_t n_vocab = 0, total = 0;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int32_t id;
        if (get_id(it, &id))
            return ds_fail(err, "%s: model.vocab[\"%s\"]: id must be an integer in [0, %d)", what, it->string,
                           DS_MAX_VOCAB_ID);
        if (!it->string[0]) return ds_fail(err, "%s: model.vocab has an empty token (id %d)", what, (int)id);
        if (id > max_id) max_id = id;
        n_vocab++;
        total += strlen(it->string) + 1;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return ds_fail(err, "%s: added_tokens must be an array", what);
    int i = 0;
    if (added)
        for (const cJSON *it = added->child; it; it = it->next, i++) {
            int32_t id;
            if (get_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id))
                return ds_fail(err, "%s: added_tokens[%d]: \"id\" must be an integer in [0, %d)", what, i,
                               DS_MAX_VOCAB_ID);
            if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "content")))
                return ds_fail(err, "%s: added_tokens[%d]: no \"content\" string", what, i);
            if (id > max_id) max_id = id;
        }
    if (max_id < 0) return ds_fail(err, "%s: model.vocab is empty", what);
    tok->n_ids = max_id + 1;
    size_t nid = (size_t)tok->n_ids;
    tok->str = calloc(nid, sizeof *tok->str);
    tok->str_len = calloc(nid, sizeof *tok->str_len);
    tok->bytes = calloc(nid, sizeof *tok->bytes);
    tok->bytes_len = calloc(nid, sizeof *tok->bytes_len);
    tok->kind = calloc(nid, 1);
    tok->arena = malloc(total * 2 + 1);
    if (!tok->str || !tok->str_len || !tok->bytes || !tok->bytes_len || !tok->kind || !tok->arena ||
        ds_tok_strmap_init(&tok->vocab, n_vocab))
        return ds_fail(err, "%s: out of memory for %zu tokens", what, n_vocab);

    int16_t cp_to_byte[324];
    for (int c = 0; c < 324; c++) cp_to_byte[c] = -1;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = ds_tok_byte_to_cp(b);
        cp_to_byte[cp] = (int16_t)b;
        tok->byte_sym_len[b] = (unsigned char)ds_tok_put_utf8(tok->byte_sym[b], cp);
    }

    size_t off = 0;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int32_t id = (int32_t)it->valuedouble;
        size_t len = strlen(it->string);
        if (tok->kind[id] & 1)
            return ds_fail(err, "%s: model.vocab: tokens \"%s\" and \"%s\" share id %d", what, tok->str[id], it->string,
                           (int)id);
        char *s = tok->arena + off;
        memcpy(s, it->string, len + 1);
        off += len + 1;
        if (ds_tok_strmap_get(&tok->vocab, s, len) >= 0)
            return ds_fail(err, "%s: model.vocab: token \"%s\" appears twice", what, s);
        ds_tok_strmap_put(&tok->vocab, s, len, id);
        tok->str[id] = s;
        tok->str_len[id] = (uint32_t)len;
        tok->kind[id] |= 1;
        /* decoded bytes: byte-level inverse, or the raw string if not byte-level */
        char *bo = tok->arena + off;
        size_t bn;
        if (bytelevel_decode(s, len, cp_to_byte, bo, &bn) == 0) {
            tok->bytes[id] = bo;
            tok->bytes_len[id] = (uint32_t)bn;
            off += bn;
        } else {
            tok->bytes[id] = s;
            tok->bytes_len[id] = (uint32_t)len;
        }
    }
    for (unsigned b = 0; b < 256; b++)
        tok->byte_id[b] = ds_tok_strmap_get(&tok->vocab, tok->byte_sym[b], tok->byte_sym_len[b]);

    tok->unk_id = -1;
    v = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return ds_fail(err, "%s: model.unk_token must be a string", what);
        tok->unk_id = ds_tok_strmap_get(&tok->vocab, v->valuestring, strlen(v->valuestring));
        if (tok->unk_id < 0)
            return ds_fail(err, "%s: model.unk_token \"%s\" is not in model.vocab", what, v->valuestring);
    }

    /* merges */
    size_t n_merges = merges ? (size_t)cJSON_GetArraySize(merges) : 0;
    tok->merge_cap = 16;
    while (tok->merge_cap < n_merges * 2 + 16) tok->merge_cap <<= 1;
    tok->merges = calloc(tok->merge_cap, sizeof *tok->merges);
    if (!tok->merges) return ds_fail(err, "%s: out of memory for %zu merges", what, n_merges);
    char *tmp = NULL;
    size_t tmp_cap = 0;
    uint32_t rank = 0;
    if (merges)
        for (const cJSON *it = merges->child; it; it = it->next, rank++) {
            const char *a, *b;
            size_t la, lb;
            if (cJSON_IsString(it)) {
                const char *s = it->valuestring, *sp = strchr(s, ' ');
                if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
                    free(tmp);
                    return ds_fail(err, "%s: model.merges[%u] \"%s\" is not of the form \"a b\"", what, rank, s);
                }
                a = s;
                la = (size_t)(sp - s);
                b = sp + 1;
                lb = strlen(b);
            } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                       cJSON_IsString(it->child->next)) {
                a = it->child->valuestring;
                la = strlen(a);
                b = it->child->next->valuestring;
                lb = strlen(b);
            } else {
                free(tmp);
                return ds_fail(err, "%s: model.merges[%u] is neither \"a b\" nor [\"a\", \"b\"]", what, rank);
            }
            int32_t ia = ds_tok_strmap_get(&tok->vocab, a, la), ib = ds_tok_strmap_get(&tok->vocab, b, lb);
            if (ia < 0 || ib < 0) {
                free(tmp);
                return ds_fail(err, "%s: model.merges[%u]: token \"%.*s\" is not in model.vocab", what, rank,
                               (int)(ia < 0 ? la : lb), ia < 0 ? a : b);
            }
            if (la + lb + 1 > tmp_cap) {
                tmp_cap = (la + lb + 1) * 2;
                char *nt = realloc(tmp, tmp_cap);
                if (!nt) {
                    free(tmp);
                    return ds_fail(err, "%s: out of memory", what);
                }
                tmp = nt;
            }
            memcpy(tmp, a, la);
            memcpy(tmp + la, b, lb);
            int32_t im = ds_tok_strmap_get(&tok->vocab, tmp, la + lb);
            if (im < 0) {
                ds_fail(err, "%s: model.merges[%u]: merged token \"%.*s\" is not in model.vocab", what, rank,
                        (int)(la + lb), tmp);
                free(tmp);
                return -1;
            }
            merge_put(tok, ia, ib, rank, im);
        }
    free(tmp);
    /* every byte must have its byte-level symbol, or some texts cannot be encoded */
    for (unsigned b = 0; b < 256; b++)
        if (tok->byte_id[b] < 0)
            return ds_fail(err,
                           "%s: model.vocab lacks the byte-level symbol \"%.*s\" of byte 0x%02X (a byte-level BPE "
                           "needs all 256)",
                           what, (int)tok->byte_sym_len[b], tok->byte_sym[b], b);
    return 0;
}

static int load_added(ds_tokenizer *tok, const cJSON *root, const char *what, ds_err *err) {
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    size_t n = added && cJSON_IsArray(added) ? (size_t)cJSON_GetArraySize(added) : 0;
    if (ds_tok_strmap_init(&tok->added_map, n)) return ds_fail(err, "%s: out of memory", what);
    tok->bos_id = tok->eos_id = -1;
    if (!n) return 0;
    tok->added = calloc(n, sizeof *tok->added);
    if (!tok->added) return ds_fail(err, "%s: out of memory", what);
    int i = 0;
    for (const cJSON *it = added->child; it; it = it->next, i++) {
        added_tok *a = &tok->added[tok->n_added];
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        int special, lstrip, rstrip, single_word, normalized;
        if (get_bool(it, "special", 0, &special, what, err) || get_bool(it, "lstrip", 0, &lstrip, what, err) ||
            get_bool(it, "rstrip", 0, &rstrip, what, err) || get_bool(it, "single_word", 0, &single_word, what, err) ||
            get_bool(it, "normalized", !special, &normalized, what, err))
            return ds_fail_prefix(err, "added_tokens[%d]", i);
        if (!content[0]) continue; /* tokenizers ignores empty added tokens */
        /* an added token may take a model token's id only with the same text:
         * otherwise that model token's bytes would decode as the added token's */
        if ((tok->kind[id] & 1) && strcmp(tok->str[id], content) != 0)
            return ds_fail(err, "%s: added_tokens[%d]: id %ld is the model token \"%s\", not \"%s\"", what, i,
                           (long)id, tok->str[id], content);
        a->len = strlen(content);
        a->content = malloc(a->len + 1);
        if (!a->content) return ds_fail(err, "%s: out of memory", what);
        memcpy(a->content, content, a->len + 1);
        a->id = id;
        a->special = (unsigned char)special;
        a->lstrip = (unsigned char)lstrip;
        a->rstrip = (unsigned char)rstrip;
        a->single_word = (unsigned char)single_word;
        a->normalized = (unsigned char)normalized;
        int32_t idx = (int32_t)tok->n_added++;
        if (ds_tok_trie_add(normalized ? &tok->trie_norm : &tok->trie_raw, a->content, a->len, idx))
            return ds_fail(err, "%s: out of memory", what);
        ds_tok_strmap_put(&tok->added_map, a->content, a->len, id);
        tok->str[id] = a->content;
        tok->str_len[id] = (uint32_t)a->len;
        tok->bytes[id] = a->content;
        tok->bytes_len[id] = (uint32_t)a->len;
        tok->kind[id] = (unsigned char)((tok->kind[id] & ~4) | 2 | (special ? 4 : 0));
        if (!strcmp(content, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>")) tok->bos_id = id;
        if (!strcmp(content, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>")) tok->eos_id = id;
    }
    return 0;
}

int ds_tokenizer_load_json(const char *json, size_t n, const char *what, ds_tokenizer **out, ds_err *err) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, n, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return ds_fail(err, "%s: not valid JSON (error near byte %zu)", what, at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ds_fail(err, "%s: the top level is not a JSON object", what);
    }
    ds_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        cJSON_Delete(root);
        return ds_fail(err, "%s: out of memory", what);
    }
    int rc = -1;
    if (load_normalizer(root, what, err) || load_pretok(tok, root, what, err) || load_decoder(root, what, err) ||
        load_model(tok, root, what, err) || load_added(tok, root, what, err))
        goto done;
    if (ds_tok_ac_build(&tok->trie_raw) || ds_tok_ac_build(&tok->trie_norm)) {
        ds_fail(err, "%s: out of memory", what);
        goto done;
    }
    tok->re_ws = compile_re("[\\s\\x{85}]", "whitespace class", err);
    tok->re_word = compile_re("\\w", "word class", err);
    if (!tok->re_ws || !tok->re_word) goto done;
    tok->cache = calloc(DS_CACHE_SLOTS, sizeof *tok->cache);
    if (!tok->cache) {
        ds_fail(err, "%s: out of memory", what);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) {
        ds_tokenizer_free(tok);
        return -1;
    }
    *out = tok;
    return 0;
}

int ds_tokenizer_load(const char *path, ds_tokenizer **out, ds_err *err) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st)) return ds_fail(err, "%s: %s", path, strerror(errno));
    char file[4096];
    if (S_ISDIR(st.st_mode)) {
        int k = snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (k < 0 || (size_t)k >= sizeof file) return ds_fail(err, "%s: path too long", path);
        if (stat(file, &st)) return ds_fail(err, "%s: no tokenizer.json in this directory", path);
    } else {
        int k = snprintf(file, sizeof file, "%s", path);
        if (k < 0 || (size_t)k >= sizeof file) return ds_fail(err, "%s: path too long", path);
    }
    size_t n;
    char *json;
    if (ds_read_regular_file(file, 0, &json, &n, err)) return -1;
    int rc = ds_tokenizer_load_json(json, n, file, out, err);
    free(json);
    return rc;
}
