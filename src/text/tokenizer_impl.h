/* tokenizer_impl.h — inside the tokenizer (tokenizer.h): the object and
 * the helpers its two halves share. tokenizer.c encodes and decodes (with
 * the string map, UTF-8 helpers and the added tokens' trie);
 * tokenizer_load.c reads tokenizer.json (the model, the pre-tokenizer's
 * regexes, the added tokens). Not for use outside src/text/. */
#ifndef DS_TOKENIZER_IMPL_H
#define DS_TOKENIZER_IMPL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define DS_MAX_VOCAB_ID 16777216 /* sanity bound on ids read from the file */
#define DS_MAX_SPLITS 16
#ifndef DS_CACHE_SLOTS
#define DS_CACHE_SLOTS 32768 /* a power of two */
#endif
#ifndef DS_CACHE_MAX_PIECE
#define DS_CACHE_MAX_PIECE 48 /* longer pieces are not cached; 0: no cache */
#endif
#ifndef DS_SHORT_PIECE
#define DS_SHORT_PIECE 12 /* pieces up to this many symbols merge by plain scan */
#endif

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* string -> id, open addressing; strings live elsewhere (not owned). */
typedef struct {
    const char *s;
    uint32_t len;
    int32_t id;
} strmap_slot;

typedef struct {
    strmap_slot *slots;
    size_t cap; /* power of two */
    size_t n;
} strmap;

/* A map with room for n_expected strings: 0, or -1 when out of memory. */
int ds_tok_strmap_init(strmap *m, size_t n_expected);
void ds_tok_strmap_free(strmap *m);
/* The id of s, or -1; put inserts or overwrites (m must have room). */
int32_t ds_tok_strmap_get(const strmap *m, const char *s, size_t len);
void ds_tok_strmap_put(strmap *m, const char *s, size_t len, int32_t id);

/* (left id, right id) -> (rank, merged id) */
typedef struct {
    uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
    uint32_t rank;
    int32_t id;
} merge_slot;

/* ------------------------------------------------------------- the object */

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    unsigned char special, lstrip, rstrip, single_word, normalized;
} added_tok;

/* Aho-Corasick automaton over added-token contents: a byte trie (node 0 is
 * the root) with failure links (the longest proper suffix of a node's string
 * that is also a trie node) and output links (the nearest node on the failure
 * chain where a token ends). */
typedef struct {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next sibling, -1 none */
    int32_t tok;     /* index into added[] ending here, -1 none */
    int32_t fail;    /* failure link (0: the root) */
    int32_t out;     /* output link: nearest token node on the failure chain, -1 none */
    uint32_t depth;  /* length of the node's string */
    unsigned char byte;
} trie_node;

typedef struct {
    trie_node *nodes;
    size_t n, cap;
    int32_t root_child[256]; /* child of the root by first byte */
    int any;
} trie;

typedef struct {
    uint64_t hash;
    char *key; /* malloc'ed: key bytes then ids */
    uint32_t key_len, n_ids, cap_ids;
    int32_t *ids;
} cache_slot;

struct ds_tokenizer {
    int n_ids; /* vocab size: 1 + largest id */
    char **str;          /* per id: string as in tokenizer.json (added token content wins) */
    uint32_t *str_len;
    char **bytes;        /* per id: decoded bytes */
    uint32_t *bytes_len;
    unsigned char *kind; /* per id: bit 1 model token, 2 added, 4 special */
    char *arena;         /* storage of model token strings and bytes */
    strmap vocab;        /* model vocab: string -> id */
    strmap added_map;    /* added tokens: content -> id */
    merge_slot *merges;
    size_t merge_cap;
    int32_t byte_id[256];      /* id of the byte-level symbol of each byte, -1 if none */
    char byte_sym[256][3];     /* the byte-level symbol (UTF-8) of each byte */
    unsigned char byte_sym_len[256];
    added_tok *added;
    size_t n_added;
    trie trie_raw;  /* added tokens with normalized = false */
    trie trie_norm; /* added tokens with normalized = true */
    pcre2_code *split[DS_MAX_SPLITS];
    int n_split;
    pcre2_code *re_ws;   /* one whitespace char (lstrip / rstrip) */
    pcre2_code *re_word; /* one word char (single_word) */
    int32_t unk_id;
    int fuse_unk, byte_fallback, ignore_merges;
    int32_t bos_id, eos_id;
    cache_slot *cache;
};


static inline const merge_slot *merge_get(const ds_tokenizer *tok, int32_t a, int32_t b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = tok->merge_cap - 1, i = hash_u64(key) & mask;
    for (;;) {
        const merge_slot *s = &tok->merges[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
        i = (i + 1) & mask;
    }
}

/* GPT-2 bytes_to_unicode: the code point that stands for byte b. */
unsigned ds_tok_byte_to_cp(unsigned b);
/* cp as UTF-8 into o: the bytes written. */
int ds_tok_put_utf8(char *o, unsigned cp);
/* One UTF-8 step at s (n > 0 bytes): 1 = a valid char of *len bytes (its
 * code point in *cp when cp is not NULL), 0 = invalid, *len = the maximal
 * invalid subpart (>= 1), -1 = a valid but incomplete prefix of all n bytes. */
int ds_tok_utf8_step(const unsigned char *s, size_t n, size_t *len, unsigned *cp);
/* Adds s (token tok_index) to the added tokens' trie: 0, or -1 when out of
 * memory. */
int ds_tok_trie_add(trie *t, const char *s, size_t len, int32_t tok_index);
/* The trie's failure and output links (after the last ds_tok_trie_add): 0,
 * or -1 when out of memory. */
int ds_tok_ac_build(trie *t);

#endif
