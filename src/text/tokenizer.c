/* tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json, matching
 * the `tokenizers` library (see tokenizer.h for the contract).
 *
 * Encoding: added tokens are cut out first (leftmost-longest, Aho-Corasick over a byte trie:
 * the tokens with normalized=false on the text, then those with
 * normalized=true on the gaps, as tokenizers' AddedVocabulary does; the
 * normalizer must be empty). Each gap is cut by the Split regexes in turn
 * (depth first, so pieces stay in order), each piece's bytes become byte-level
 * symbols and are merged by rank: a binary heap of (rank, position) over a
 * linked list of symbols, or a plain scan for short pieces; both merge the
 * lowest rank first, leftmost first among equals, as tokenizers' Word does.
 * Pieces up to DS_CACHE_MAX_PIECE bytes are cached (direct-mapped).
 *
 * Regexes: tokenizers compiles Split patterns with Oniguruma, whose \s is
 * Unicode White_Space; PCRE2's \s with UCP lacks U+0085, so \s / \S are
 * rewritten to include it. PCRE2_MATCH_INVALID_UTF lets invalid bytes through:
 * nothing matches them, so they fall in the gaps between matches.
 *
 * Loading tokenizer.json is in tokenizer_load.c; the object is in
 * tokenizer_impl.h. */
#include "text/tokenizer_impl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/io.h"

/* ------------------------------------------------------------------ hashing */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}


int ds_tok_strmap_init(strmap *m, size_t n_expected) {
    size_t cap = 16;
    while (cap < n_expected * 2 + 16) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    m->cap = cap;
    m->n = 0;
    return m->slots ? 0 : -1;
}

void ds_tok_strmap_free(strmap *m) { free(m->slots); }

/* Returns the slot for (s,len): the existing one or an empty one. */
static strmap_slot *strmap_find(const strmap *m, const char *s, size_t len) {
    size_t mask = m->cap - 1, i = hash_bytes(s, len) & mask;
    for (;;) {
        strmap_slot *sl = &m->slots[i];
        if (!sl->s) return sl;
        if (sl->len == len && memcmp(sl->s, s, len) == 0) return sl;
        i = (i + 1) & mask;
    }
}

int32_t ds_tok_strmap_get(const strmap *m, const char *s, size_t len) {
    if (!m->slots) return -1;
    strmap_slot *sl = strmap_find(m, s, len);
    return sl->s ? sl->id : -1;
}

/* Inserts or overwrites. m must have room (sized at init). */
void ds_tok_strmap_put(strmap *m, const char *s, size_t len, int32_t id) {
    strmap_slot *sl = strmap_find(m, s, len);
    if (!sl->s) {
        sl->s = s;
        sl->len = (uint32_t)len;
        m->n++;
    }
    sl->id = id;
}

/* ------------------------------------------------------------ small utils */

/* GPT-2 bytes_to_unicode: the code point that stands for byte b. */
unsigned ds_tok_byte_to_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff))) n++;
    return 256 + n;
}

int ds_tok_put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* One UTF-8 step at s (n > 0 bytes): 1 = a valid char of *len bytes,
 * 0 = invalid, *len = the maximal invalid subpart (>= 1),
 * -1 = a valid but incomplete prefix of all n bytes. */
int ds_tok_utf8_step(const unsigned char *s, size_t n, size_t *len, unsigned *cp) {
    unsigned b0 = s[0];
    if (b0 < 0x80) {
        *len = 1;
        if (cp) *cp = b0;
        return 1;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xbf, c;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        need = 2;
        c = b0 & 0x1f;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        need = 3;
        c = b0 & 0x0f;
        if (b0 == 0xe0) lo = 0xa0;
        if (b0 == 0xed) hi = 0x9f;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        need = 4;
        c = b0 & 0x07;
        if (b0 == 0xf0) lo = 0x90;
        if (b0 == 0xf4) hi = 0x8f;
    } else {
        *len = 1;
        return 0;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            *len = n;
            return -1;
        }
        unsigned b = s[k];
        if (b < lo || b > hi) {
            *len = k;
            return 0;
        }
        lo = 0x80;
        hi = 0xbf;
        c = (c << 6) | (b & 0x3f);
    }
    *len = need;
    if (cp) *cp = c;
    return 1;
}

size_t ds_utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0, l;
    while (i < n) {
        if (ds_tok_utf8_step((const unsigned char *)s + i, n - i, &l, NULL) != 1) break;
        i += l;
    }
    return i;
}

static int buf_reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

int ds_utf8_lossy_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    /* worst case: every byte becomes 3 bytes of U+FFFD */
    if (buf_reserve(buf, cap, *len + n * 3 + 1)) return -1;
    size_t i = 0, l;
    char *o = *buf + *len;
    while (i < n) {
        int r = ds_tok_utf8_step((const unsigned char *)s + i, n - i, &l, NULL);
        if (r == 1) {
            memcpy(o, s + i, l);
            o += l;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += l;
    }
    *len = (size_t)(o - *buf);
    (*buf)[*len] = 0;
    return 0;
}

/* ----------------------------------------------------------------- trie */

int ds_tok_trie_add(trie *t, const char *s, size_t len, int32_t tok_index) {
    if (!t->nodes) {
        t->cap = 256;
        t->nodes = malloc(t->cap * sizeof *t->nodes);
        if (!t->nodes) return -1;
        t->nodes[0] = (trie_node){-1, -1, -1, 0, -1, 0, 0};
        t->n = 1;
        for (int i = 0; i < 256; i++) t->root_child[i] = -1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = node == 0 ? t->root_child[b] : t->nodes[node].child;
        if (node != 0)
            while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
        if (c < 0) {
            if (t->n == t->cap) {
                trie_node *nn = realloc(t->nodes, t->cap * 2 * sizeof *nn);
                if (!nn) return -1;
                t->nodes = nn;
                t->cap *= 2;
            }
            c = (int32_t)t->n++;
            t->nodes[c] = (trie_node){-1, -1, -1, 0, -1, t->nodes[node].depth + 1, b};
            if (node == 0) {
                t->root_child[b] = c;
            } else {
                t->nodes[c].sibling = t->nodes[node].child;
                t->nodes[node].child = c;
            }
        }
        node = c;
    }
    /* a later duplicate content replaces the earlier one */
    t->nodes[node].tok = tok_index;
    t->any = 1;
    return 0;
}

static int32_t trie_child(const trie *t, int32_t node, unsigned char b) {
    if (node == 0) return t->root_child[b];
    int32_t c = t->nodes[node].child;
    while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
    return c;
}

/* The automaton's transition from `node` on byte b. */
static int32_t ac_step(const trie *t, int32_t node, unsigned char b) {
    for (;;) {
        int32_t c = trie_child(t, node, b);
        if (c >= 0) return c;
        if (node == 0) return 0;
        node = t->nodes[node].fail;
    }
}

/* Failure and output links, breadth first (after the last ds_tok_trie_add). */
int ds_tok_ac_build(trie *t) {
    if (!t->any) return 0;
    int32_t *queue = malloc(t->n * sizeof *queue);
    if (!queue) return -1;
    size_t head = 0, tail = 0;
    for (int b = 0; b < 256; b++) {
        int32_t c = t->root_child[b];
        if (c < 0) continue;
        t->nodes[c].fail = 0;
        t->nodes[c].out = -1;
        queue[tail++] = c;
    }
    while (head < tail) {
        int32_t u = queue[head++];
        for (int32_t v = t->nodes[u].child; v >= 0; v = t->nodes[v].sibling) {
            int32_t f = ac_step(t, t->nodes[u].fail, t->nodes[v].byte);
            t->nodes[v].fail = f;
            t->nodes[v].out = t->nodes[f].tok >= 0 ? f : t->nodes[f].out;
            queue[tail++] = v;
        }
    }
    free(queue);
    return 0;
}

/* For each start position i of s[0..n): best[i] = the added token (index into
 * added[]) of the longest match starting at i, or -1 — in one pass, O(n +
 * matches) whatever the tokens' lengths. A match that covers a byte marked in
 * plain (NULL: none) is not a match: those bytes are plain text. */
static void ac_longest_at(const trie *t, const unsigned char *s, size_t n, const unsigned char *plain,
                          int32_t *best, uint32_t *best_len) {
    for (size_t i = 0; i < n; i++) best[i] = -1;
    int32_t node = 0;
    size_t last_plain = SIZE_MAX; /* last position <= j marked plain; SIZE_MAX: none */
    for (size_t j = 0; j < n; j++) {
        node = ac_step(t, node, s[j]);
        if (plain && plain[j]) last_plain = j;
        for (int32_t v = t->nodes[node].tok >= 0 ? node : t->nodes[node].out; v > 0; v = t->nodes[v].out) {
            uint32_t len = t->nodes[v].depth;
            size_t start = j + 1 - len;
            if (last_plain != SIZE_MAX && last_plain >= start) continue;
            if (best[start] < 0 || len > best_len[start]) {
                best[start] = t->nodes[v].tok;
                best_len[start] = len;
            }
        }
    }
}

/* ---------------------------------------------------------------- lookups */

int ds_tokenizer_vocab_size(const ds_tokenizer *tok) { return tok->n_ids; }

int32_t ds_tokenizer_token_id(const ds_tokenizer *tok, const char *token) {
    size_t len = strlen(token);
    int32_t id = ds_tok_strmap_get(&tok->added_map, token, len);
    return id >= 0 ? id : ds_tok_strmap_get(&tok->vocab, token, len);
}

const char *ds_tokenizer_token_bytes(const ds_tokenizer *tok, int32_t id, size_t *n) {
    if (id < 0 || id >= tok->n_ids || !tok->kind[id]) return NULL;
    *n = tok->bytes_len[id];
    return tok->bytes[id];
}

const char *ds_tokenizer_token_str(const ds_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_ids || !tok->kind[id]) return NULL;
    return tok->str[id];
}

int ds_tokenizer_is_special(const ds_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->kind[id] & 4);
}

int ds_tokenizer_is_added(const ds_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->kind[id] & 2);
}

int32_t ds_tokenizer_bos_id(const ds_tokenizer *tok) { return tok->bos_id; }
int32_t ds_tokenizer_eos_id(const ds_tokenizer *tok) { return tok->eos_id; }

/* ---------------------------------------------------------------- encode */

typedef struct {
    int32_t *ids;
    size_t n, cap;
    /* scratch for merging */
    int32_t *sym, *next, *prev;
    uint64_t *heap; /* (rank << 32 | pos) */
    size_t scratch_cap, heap_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* no match limit: long whitespace runs backtrack O(run) */
    pcre2_jit_stack *jit_stack;
    char *bl; /* byte-level string scratch (ignore_merges) */
    size_t bl_cap;
    int oom;
    const char *text0;          /* the whole text being encoded */
    const unsigned char *plain; /* per byte of text0: 1 = plain text (no added token may cover it); NULL: none */
} enc_state;

static int out_push(enc_state *st, int32_t id) {
    if (st->n == st->cap) {
        size_t c = st->cap ? st->cap * 2 : 1024;
        int32_t *ni = realloc(st->ids, c * sizeof *ni);
        if (!ni) {
            st->oom = 1;
            return -1;
        }
        st->ids = ni;
        st->cap = c;
    }
    st->ids[st->n++] = id;
    return 0;
}

static int scratch_reserve(enc_state *st, size_t m) {
    if (m <= st->scratch_cap) return 0;
    size_t c = st->scratch_cap ? st->scratch_cap : 64;
    while (c < m) c *= 2;
    int32_t *a = realloc(st->sym, c * sizeof *a);
    if (a) st->sym = a;
    int32_t *b = realloc(st->next, c * sizeof *b);
    if (b) st->next = b;
    int32_t *d = realloc(st->prev, c * sizeof *d);
    if (d) st->prev = d;
    if (!a || !b || !d) {
        st->oom = 1;
        return -1;
    }
    st->scratch_cap = c;
    return 0;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t c = (l + 1 < m && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

/* Initial symbols of a piece (one per byte; missing byte symbols handled as
 * tokenizers does: byte_fallback <0xXX>, else unk (fused), else dropped). */
static size_t initial_symbols(const ds_tokenizer *tok, const unsigned char *p, size_t m, int32_t *sym) {
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        int32_t id = tok->byte_id[p[i]];
        if (id >= 0) {
            sym[k++] = id;
            continue;
        }
        if (tok->byte_fallback) {
            /* the byte-level char's UTF-8 bytes as <0xXX> tokens */
            int32_t fb[3];
            int ok = 1;
            for (int j = 0; j < tok->byte_sym_len[p[i]]; j++) {
                char name[8];
                snprintf(name, sizeof name, "<0x%02X>", (unsigned char)tok->byte_sym[p[i]][j]);
                fb[j] = ds_tok_strmap_get(&tok->vocab, name, 6);
                if (fb[j] < 0) ok = 0;
            }
            if (ok) {
                for (int j = 0; j < tok->byte_sym_len[p[i]]; j++) sym[k++] = fb[j];
                continue;
            }
        }
        if (tok->unk_id >= 0) {
            if (tok->fuse_unk && k > 0 && sym[k - 1] == tok->unk_id) continue;
            sym[k++] = tok->unk_id;
        }
    }
    return k;
}

static void bpe_piece(ds_tokenizer *tok, enc_state *st, const unsigned char *p, size_t m) {
    if (m == 0) return;
    cache_slot *cs = NULL;
    uint64_t h = 0;
    if (m <= DS_CACHE_MAX_PIECE) {
        h = hash_bytes(p, m);
        cs = &tok->cache[h & (DS_CACHE_SLOTS - 1)];
        if (cs->key && cs->hash == h && cs->key_len == m && memcmp(cs->key, p, m) == 0) {
            for (uint32_t i = 0; i < cs->n_ids; i++)
                if (out_push(st, cs->ids[i])) return;
            return;
        }
    }
    size_t start = st->n;
    if (tok->ignore_merges) {
        size_t need = m * 2;
        if (need > st->bl_cap) {
            char *nb = realloc(st->bl, need * 2);
            if (!nb) {
                st->oom = 1;
                return;
            }
            st->bl = nb;
            st->bl_cap = need * 2;
        }
        size_t o = 0;
        for (size_t i = 0; i < m; i++) {
            memcpy(st->bl + o, tok->byte_sym[p[i]], tok->byte_sym_len[p[i]]);
            o += tok->byte_sym_len[p[i]];
        }
        int32_t id = ds_tok_strmap_get(&tok->vocab, st->bl, o);
        if (id >= 0) {
            out_push(st, id);
            goto cache_it;
        }
    }
    if (scratch_reserve(st, m * 3 + 1)) return;
    int32_t *sym = st->sym;
    size_t k = initial_symbols(tok, p, m, sym);
    if (k <= DS_SHORT_PIECE) {
        /* plain scan: merge the lowest-ranked adjacent pair, leftmost first */
        for (;;) {
            uint32_t best = UINT32_MAX;
            size_t bi = 0;
            int32_t bid = -1;
            for (size_t i = 0; i + 1 < k; i++) {
                const merge_slot *ms = merge_get(tok, sym[i], sym[i + 1]);
                if (ms && ms->rank < best) {
                    best = ms->rank;
                    bi = i;
                    bid = ms->id;
                }
            }
            if (bid < 0) break;
            sym[bi] = bid;
            memmove(sym + bi + 1, sym + bi + 2, (k - bi - 2) * sizeof *sym);
            k--;
        }
        for (size_t i = 0; i < k; i++)
            if (out_push(st, sym[i])) return;
    } else {
        int32_t *next = st->next, *prev = st->prev;
        if (k > st->heap_cap) {
            uint64_t *nh = realloc(st->heap, k * 2 * sizeof *nh);
            if (!nh) {
                st->oom = 1;
                return;
            }
            st->heap = nh;
            st->heap_cap = k * 2;
        }
        uint64_t *heap = st->heap;
        size_t hn = 0;
        for (size_t i = 0; i < k; i++) {
            next[i] = i + 1 < k ? (int32_t)(i + 1) : -1;
            prev[i] = (int32_t)i - 1;
        }
        for (size_t i = 0; i + 1 < k; i++) {
            const merge_slot *ms = merge_get(tok, sym[i], sym[i + 1]);
            if (ms) heap_push(heap, &hn, ((uint64_t)ms->rank << 32) | i);
        }
        /* each merge removes a symbol and pushes at most 2 pairs: the heap
         * never holds more than (k - 1) + 2 (k - 1) entries at once but is
         * compacted by popping; grow on demand */
        while (hn) {
            uint64_t top = heap_pop(heap, &hn);
            uint32_t rank = (uint32_t)(top >> 32);
            int32_t i = (int32_t)(top & 0xffffffffu);
            if (sym[i] < 0 || next[i] < 0) continue;
            int32_t j = next[i];
            const merge_slot *ms = merge_get(tok, sym[i], sym[j]);
            if (!ms || ms->rank != rank) continue; /* stale */
            sym[i] = ms->id;
            sym[j] = -1;
            next[i] = next[j];
            if (next[j] >= 0) prev[next[j]] = i;
            if (hn + 2 > st->heap_cap) {
                uint64_t *nh = realloc(st->heap, st->heap_cap * 2 * sizeof *nh);
                if (!nh) {
                    st->oom = 1;
                    return;
                }
                st->heap = heap = nh;
                st->heap_cap *= 2;
            }
            if (prev[i] >= 0) {
                const merge_slot *ml = merge_get(tok, sym[prev[i]], sym[i]);
                if (ml) heap_push(heap, &hn, ((uint64_t)ml->rank << 32) | (uint32_t)prev[i]);
            }
            if (next[i] >= 0) {
                const merge_slot *mr = merge_get(tok, sym[i], sym[next[i]]);
                if (mr) heap_push(heap, &hn, ((uint64_t)mr->rank << 32) | (uint32_t)i);
            }
        }
        for (int32_t i = k ? 0 : -1; i >= 0; i = next[i])
            if (out_push(st, sym[i])) return;
    }
cache_it:
    if (cs) {
        size_t nids = st->n - start;
        if (cs->key == NULL || cs->cap_ids < nids) {
            size_t cap_ids = nids < 8 ? 8 : nids;
            char *nk = realloc(cs->key, DS_CACHE_MAX_PIECE + cap_ids * sizeof(int32_t));
            if (!nk) return; /* no cache entry: not an error */
            cs->key = nk;
            cs->cap_ids = (uint32_t)cap_ids;
        }
        cs->ids = (int32_t *)(void *)(cs->key + DS_CACHE_MAX_PIECE);
        memcpy(cs->key, p, m);
        memcpy(cs->ids, st->ids + start, nids * sizeof(int32_t));
        cs->key_len = (uint32_t)m;
        cs->n_ids = (uint32_t)nids;
        cs->hash = h;
    }
}

/* Splits (p, n) by regex `level` and recurses; pieces reach BPE in order. */
static int pretok(ds_tokenizer *tok, enc_state *st, const char *p, size_t n, int level, ds_err *err) {
    if (n == 0) return 0;
    if (level == tok->n_split) {
        bpe_piece(tok, st, (const unsigned char *)p, n);
        return st->oom ? ds_fail(err, "tokenizer: out of memory") : 0;
    }
    pcre2_code *re = tok->split[level];
    size_t last = 0, off = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    while (off < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, off, 0, st->md, st->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ds_fail(err, "tokenizer: pre_tokenizer step %d: regex match failed: %s", level, (const char *)msg);
        }
        size_t s = ov[0], e = ov[1];
        if (e == s) { /* empty match: no split here, move one char on */
            size_t l;
            ds_tok_utf8_step((const unsigned char *)p + s, n - s, &l, NULL);
            off = s + (l ? l : 1);
            continue;
        }
        if (s > last && pretok(tok, st, p + last, s - last, level + 1, err)) return -1;
        if (pretok(tok, st, p + s, e - s, level + 1, err)) return -1;
        last = off = e;
    }
    if (last < n && pretok(tok, st, p + last, n - last, level + 1, err)) return -1;
    return 0;
}

/* 1 if the single char at s (len bytes) matches re */
static int char_is(const ds_tokenizer *tok, pcre2_code *re, const char *s, size_t len, pcre2_match_data *md) {
    (void)tok;
    return pcre2_match(re, (PCRE2_SPTR)s, len, 0, PCRE2_ANCHORED, md, NULL) > 0;
}

/* Start of the last char of s[0..n) (n > 0). */
static size_t last_char_start(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && n - i < 4 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    return i;
}

static size_t char_len_at(const char *s, size_t n) {
    size_t l;
    ds_tok_utf8_step((const unsigned char *)s, n, &l, NULL);
    return l ? l : 1;
}

/* Cuts the added tokens of trie t out of text[0..n); gaps go to `gap`. */
typedef int (*gap_fn)(ds_tokenizer *tok, enc_state *st, const char *p, size_t n, int mode, ds_err *err);
static int split_at_matches(ds_tokenizer *tok, enc_state *st, const int32_t *best, const uint32_t *best_len,
                            const char *text, size_t n, int mode, gap_fn gap, ds_err *err);

static int split_added(ds_tokenizer *tok, enc_state *st, const trie *t, const char *text, size_t n, int mode,
                       gap_fn gap, ds_err *err) {
    if (!t->any || n == 0) return gap(tok, st, text, n, mode, err);
    const unsigned char *u = (const unsigned char *)text;
    int32_t *best = malloc(n * sizeof *best);
    uint32_t *best_len = malloc(n * sizeof *best_len);
    if (!best || !best_len) {
        free(best);
        free(best_len);
        return ds_fail(err, "tokenizer: out of memory");
    }
    ac_longest_at(t, u, n, st->plain ? st->plain + (text - st->text0) : NULL, best, best_len);
    int rc = split_at_matches(tok, st, best, best_len, text, n, mode, gap, err);
    free(best);
    free(best_len);
    return rc;
}

/* The scan of split_added over the longest match at each position: leftmost
 * first, resuming after each match (used or not), as tokenizers does. */
static int split_at_matches(ds_tokenizer *tok, enc_state *st, const int32_t *best, const uint32_t *best_len,
                            const char *text, size_t n, int mode, gap_fn gap, ds_err *err) {
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        int32_t ti = best[pos];
        size_t mlen = best_len[pos];
        if (ti < 0) {
            pos++;
            continue;
        }
        const added_tok *a = &tok->added[ti];
        size_t start = pos, stop = pos + mlen;
        pos = stop; /* the matcher resumes after the match, used or not */
        if (mode == DS_TOK_PARSE_NONSPECIAL && a->special) continue;
        if (a->single_word) {
            int start_space = start == 0, stop_space = stop == n;
            if (!start_space) {
                size_t ls = last_char_start(text, start);
                start_space = !char_is(tok, tok->re_word, text + ls, start - ls, st->md);
            }
            if (!stop_space)
                stop_space = !char_is(tok, tok->re_word, text + stop, char_len_at(text + stop, n - stop), st->md);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t ls = last_char_start(text, ns);
                if (!char_is(tok, tok->re_ws, text + ls, ns - ls, st->md)) break;
                ns = ls;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                size_t l = char_len_at(text + stop, n - stop);
                if (!char_is(tok, tok->re_ws, text + stop, l, st->md)) break;
                stop += l;
            }
        }
        if (start_offset < start && gap(tok, st, text + start_offset, start - start_offset, mode, err)) return -1;
        if (out_push(st, a->id)) return ds_fail(err, "tokenizer: out of memory");
        start_offset = stop;
    }
    if (start_offset < n) return gap(tok, st, text + start_offset, n - start_offset, mode, err);
    return 0;
}

static int gap_pretok(ds_tokenizer *tok, enc_state *st, const char *p, size_t n, int mode, ds_err *err) {
    (void)mode;
    return pretok(tok, st, p, n, 0, err);
}

static int gap_normalized(ds_tokenizer *tok, enc_state *st, const char *p, size_t n, int mode, ds_err *err) {
    return split_added(tok, st, &tok->trie_norm, p, n, mode, gap_pretok, err);
}

int ds_tokenizer_encode(ds_tokenizer *tok, const char *text, size_t n, int parse_special, int32_t **ids,
                        size_t *n_ids, ds_err *err) {
    return ds_tokenizer_encode_masked(tok, text, n, parse_special, NULL, ids, n_ids, err);
}

int ds_tokenizer_encode_masked(ds_tokenizer *tok, const char *text, size_t n, int parse_special,
                               const unsigned char *plain, int32_t **ids, size_t *n_ids, ds_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (parse_special < DS_TOK_PARSE_NONE || parse_special > DS_TOK_PARSE_NONSPECIAL)
        return ds_fail(err, "tokenizer: bad parse_special value %d", parse_special);
    enc_state st = {0};
    st.text0 = text;
    st.plain = plain;
    st.md = pcre2_match_data_create(4, NULL);
    st.mctx = pcre2_match_context_create(NULL);
    st.jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
    if (!st.md || !st.mctx || !st.jit_stack) {
        pcre2_match_data_free(st.md);
        pcre2_match_context_free(st.mctx);
        pcre2_jit_stack_free(st.jit_stack);
        return ds_fail(err, "tokenizer: out of memory");
    }
    pcre2_set_match_limit(st.mctx, UINT32_MAX);
    pcre2_set_depth_limit(st.mctx, UINT32_MAX);
    pcre2_set_heap_limit(st.mctx, UINT32_MAX);
    pcre2_jit_stack_assign(st.mctx, NULL, st.jit_stack);
    int rc;
    if (parse_special == DS_TOK_PARSE_NONE)
        rc = pretok(tok, &st, text, n, 0, err);
    else
        rc = split_added(tok, &st, &tok->trie_raw, text, n, parse_special, gap_normalized, err);
    if (!rc && st.oom) rc = ds_fail(err, "tokenizer: out of memory");
    pcre2_match_data_free(st.md);
    pcre2_match_context_free(st.mctx);
    pcre2_jit_stack_free(st.jit_stack);
    free(st.sym);
    free(st.next);
    free(st.prev);
    free(st.heap);
    free(st.bl);
    if (rc) {
        free(st.ids);
        return -1;
    }
    if (!st.ids) {
        st.ids = malloc(sizeof(int32_t)); /* a valid pointer even for no ids */
        if (!st.ids) return ds_fail(err, "tokenizer: out of memory");
    }
    *ids = st.ids;
    *n_ids = st.n;
    return 0;
}

/* ---------------------------------------------------------------- decode */

static int check_id(const ds_tokenizer *tok, int32_t id, size_t index, ds_err *err) {
    if (id < 0 || id >= tok->n_ids)
        return ds_fail(err, "tokenizer: id %ld (at position %zu) is out of range [0, %d)", (long)id, index, tok->n_ids);
    if (!tok->kind[id]) return ds_fail(err, "tokenizer: id %ld (at position %zu) has no token", (long)id, index);
    return 0;
}

int ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n, int flags, char **out,
                        size_t *out_n, ds_err *err) {
    *out = NULL;
    *out_n = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (check_id(tok, ids[i], i, err)) return -1;
        total += tok->bytes_len[ids[i]];
    }
    char *raw = malloc(total + 1);
    if (!raw) return ds_fail(err, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if ((flags & DS_DECODE_SKIP_SPECIAL) && (tok->kind[id] & 4)) continue;
        memcpy(raw + o, tok->bytes[id], tok->bytes_len[id]);
        o += tok->bytes_len[id];
    }
    raw[o] = 0;
    if (!(flags & DS_DECODE_LOSSY)) {
        *out = raw;
        *out_n = o;
        return 0;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int r = ds_utf8_lossy_append(&buf, &len, &cap, raw, o);
    free(raw);
    if (r || !buf) {
        free(buf);
        if (r) return ds_fail(err, "tokenizer: out of memory");
        buf = calloc(1, 1);
        if (!buf) return ds_fail(err, "tokenizer: out of memory");
    }
    *out = buf;
    *out_n = len;
    return 0;
}

/* -------------------------------------------------------------- streaming */

struct ds_detok_stream {
    const ds_tokenizer *tok;
    int flags;
    char pending[8]; /* an incomplete UTF-8 sequence (at most 3 bytes) */
    size_t n_pending;
    char *out;
    size_t out_len, out_cap;
};

int ds_detok_stream_new(const ds_tokenizer *tok, int flags, ds_detok_stream **out, ds_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return ds_fail(err, "tokenizer: out of memory");
    (*out)->tok = tok;
    (*out)->flags = flags & DS_DECODE_SKIP_SPECIAL;
    return 0;
}

void ds_detok_stream_free(ds_detok_stream *s) {
    if (!s) return;
    free(s->out);
    free(s);
}

void ds_detok_stream_reset(ds_detok_stream *s) { s->n_pending = 0; }

/* Emits the valid part of pending + b, keeping an incomplete tail. */
static int stream_feed(ds_detok_stream *s, const char *b, size_t n) {
    s->out_len = 0;
    if (buf_reserve(&s->out, &s->out_cap, (s->n_pending + n) * 3 + 4)) return -1;
    /* join the held bytes with the first bytes of b to finish a sequence */
    size_t i = 0;
    while (s->n_pending) {
        size_t l;
        int r = ds_tok_utf8_step((const unsigned char *)s->pending, s->n_pending, &l, NULL);
        if (r == -1) {
            if (i == n) break; /* still incomplete */
            s->pending[s->n_pending++] = b[i++];
            continue;
        }
        if (r == 1) {
            memcpy(s->out + s->out_len, s->pending, l);
            s->out_len += l;
        } else {
            memcpy(s->out + s->out_len, "\xef\xbf\xbd", 3);
            s->out_len += 3;
        }
        memmove(s->pending, s->pending + l, s->n_pending - l);
        s->n_pending -= l;
    }
    if (s->n_pending) return 0; /* b was used up completing the sequence */
    while (i < n) {
        size_t l;
        int r = ds_tok_utf8_step((const unsigned char *)b + i, n - i, &l, NULL);
        if (r == -1) {
            memcpy(s->pending, b + i, l);
            s->n_pending = l;
            break;
        }
        if (r == 1) {
            memcpy(s->out + s->out_len, b + i, l);
            s->out_len += l;
        } else {
            memcpy(s->out + s->out_len, "\xef\xbf\xbd", 3);
            s->out_len += 3;
        }
        i += l;
    }
    return 0;
}

int ds_detok_stream_push(ds_detok_stream *s, int32_t id, const char **text, size_t *n, ds_err *err) {
    *text = "";
    *n = 0;
    if (check_id(s->tok, id, 0, err)) return -1;
    if ((s->flags & DS_DECODE_SKIP_SPECIAL) && (s->tok->kind[id] & 4)) return 0;
    if (stream_feed(s, s->tok->bytes[id], s->tok->bytes_len[id])) return ds_fail(err, "tokenizer: out of memory");
    s->out[s->out_len] = 0;
    *text = s->out;
    *n = s->out_len;
    return 0;
}

void ds_detok_stream_flush(ds_detok_stream *s, const char **text, size_t *n) {
    *text = "";
    *n = 0;
    if (!s->n_pending) return;
    /* an incomplete sequence at the end is one invalid subpart */
    s->n_pending = 0;
    *text = "\xef\xbf\xbd";
    *n = 3;
}
