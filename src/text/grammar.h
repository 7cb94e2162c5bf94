/* grammar.h — constrained decoding: a pushdown automaton over bytes that
 * accepts exactly the texts of a grammar (a JSON schema compiled by
 * json_schema.c, any JSON object, or a DSML tool call), and the per-step
 * token mask computed from it over a byte trie of the tokenizer's vocabulary.
 *
 * A grammar is a graph of nodes (an object with properties, an array, a
 * string, a number, literals, alternatives, fixed text, sequences); it is
 * immutable once built and may be shared by any number of requests. A
 * ds_gstate is one request's position in it: a few stacks of frames (several
 * while alternatives are open, e.g. anyOf branches that share a prefix).
 *
 * Output form: JSON without whitespace but one optional space after ':' and
 * ',' (bounded, so a value always ends); strings are valid UTF-8 with JSON
 * escapes; numbers at most 20 digits (integers 15). Once the value is
 * complete no byte can follow: only the end (EOS) is allowed.
 *
 * Determinism: the mask is a pure function of the grammar and the bytes the
 * request has produced; the logits are never written (the sampler draws from
 * a masked copy). */
#ifndef DS_GRAMMAR_H
#define DS_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "text/tokenizer.h"

#define DS_GRAMMAR_MAX_PROPS 64 /* properties of one object schema at most */
#define DS_GRAMMAR_MAX_LITS 64  /* enum values at most */
#define DS_GRAMMAR_MAX_DEPTH 32 /* nesting at most */

typedef struct ds_grammar ds_grammar;

/* ---- building (json_schema.c and the tool-call grammar use these) ---- */
enum {
    DS_G_OBJ,  /* object: properties, required, additionalProperties */
    DS_G_ARR,  /* array of items, min/max items */
    DS_G_STR,  /* any JSON string */
    DS_G_NUM,  /* JSON number */
    DS_G_INT,  /* JSON integer */
    DS_G_LIT,  /* one of a few exact texts (const, enum, true/false, null) */
    DS_G_ALT,  /* any of the alternatives */
    DS_G_TEXT, /* exact bytes (markup) */
    DS_G_RAW,  /* raw UTF-8 text without '<' (a DSML string parameter) */
    DS_G_SEQ,  /* the children one after the other */
    DS_G_REF,  /* the node target (set later: recursive $ref) */
    DS_G_PICK, /* one of several texts, each followed by its own node (a tool's name, then its call) */
};

/* A grammar is reference-counted (new: one reference): ds_grammar_ref adds
 * one (any thread), ds_grammar_free drops one and frees at zero. */
ds_grammar *ds_grammar_new(void);
const ds_grammar *ds_grammar_ref(const ds_grammar *g);
void ds_grammar_free(const ds_grammar *g);
/* A new node of the kind; returns its index or -1 (out of memory, too many). */
int ds_grammar_node(ds_grammar *g, int kind);
/* DS_G_OBJ: a property (name as its JSON-escaped bytes, without quotes). */
int ds_grammar_obj_prop(ds_grammar *g, int obj, const char *name, size_t n, int value, int required, ds_err *err);
/* DS_G_OBJ: additional properties: -1 none, else the node their values follow.
 * dsml: the object is written as DSML parameters (tool call arguments). */
void ds_grammar_obj_set(ds_grammar *g, int obj, int additional, int dsml);
/* DS_G_STR: length bounds in characters (code points; an escape is one), -1: none. */
void ds_grammar_str_set(ds_grammar *g, int str, int min_len, int max_len);
void ds_grammar_arr_set(ds_grammar *g, int arr, int items, int min_items, int max_items);
/* DS_G_LIT / DS_G_TEXT: an exact text (LIT: one more alternative). */
int ds_grammar_add_text(ds_grammar *g, int node, const char *s, size_t n, ds_err *err);
/* DS_G_PICK: one more choice, the text s[0..n) then the node `then`. No text
 * may be a prefix of another (an error names the two); any number of choices
 * (matched by binary search over the sorted texts, one thread whatever their
 * shared prefixes). */
int ds_grammar_pick_add(ds_grammar *g, int pick, const char *s, size_t n, int then, ds_err *err);
/* DS_G_ALT / DS_G_SEQ: one more child. */
int ds_grammar_add_child(ds_grammar *g, int node, int child, ds_err *err);
void ds_grammar_ref_set(ds_grammar *g, int ref, int target);
void ds_grammar_set_root(ds_grammar *g, int root);
/* The node the schema `true` / {} stands for: any JSON value. */
int ds_grammar_any(ds_grammar *g);
/* Checks the graph (every ref set, no ref cycle without a byte between). */
int ds_grammar_finish(ds_grammar *g, ds_err *err);

/* Any JSON object ("json_object" mode). */
int ds_grammar_json_object(ds_grammar **out, ds_err *err);

/* ---- matching ---- */
typedef struct ds_gstate ds_gstate;

ds_gstate *ds_gstate_new(const ds_grammar *g);
void ds_gstate_free(ds_gstate *s);
void ds_gstate_reset(ds_gstate *s);
void ds_gstate_copy(ds_gstate *dst, const ds_gstate *src);
/* Feeds bytes: 0, or -1 if they cannot continue a valid text (the state is
 * then unchanged). */
int ds_gstate_feed(ds_gstate *s, const void *bytes, size_t n);
/* 1 if the text so far is complete (the end may come now). */
int ds_gstate_can_end(const ds_gstate *s);
/* 1 if no byte can follow (complete and nothing may be appended). */
int ds_gstate_finished(const ds_gstate *s);

/* ---- the token mask ---- */
/* The tokenizer's vocabulary as a byte trie (tokens without bytes and the
 * EOS token left out; EOS is allowed when the text is complete). Built once
 * per tokenizer, read-only after. */
typedef struct ds_vocab_trie ds_vocab_trie;
int ds_vocab_trie_build(const ds_tokenizer *tok, ds_vocab_trie **out, ds_err *err);
void ds_vocab_trie_free(ds_vocab_trie *t);
int ds_vocab_trie_vocab(const ds_vocab_trie *t);

/* Working memory for masks and token feeds (one per thread at a time). */
typedef struct ds_mask_scratch ds_mask_scratch;
ds_mask_scratch *ds_mask_scratch_new(const ds_vocab_trie *t);
void ds_mask_scratch_free(ds_mask_scratch *m);

/* allowed[(vocab + 63) / 64]: bit id set if token id can come next from
 * state s. Returns the number of allowed tokens. */
int ds_grammar_mask(const ds_vocab_trie *t, const ds_gstate *s, ds_mask_scratch *m, uint64_t *allowed);
/* The mask into allowed, then out[v] = logits[v] for the V ids it allows and
 * -inf for the rest (ids past the trie's vocabulary too). The number of
 * allowed tokens (0: none; out is then not written). */
int ds_grammar_mask_logits(const ds_vocab_trie *t, const ds_gstate *s, ds_mask_scratch *m, uint64_t *allowed,
                           const float *logits, int V, float *out);
/* Advances s by token id's bytes (EOS: needs a complete text). 0, or -1 when
 * the token is not allowed (s unchanged). */
int ds_grammar_accept(const ds_vocab_trie *t, ds_gstate *s, int32_t id);

#endif
