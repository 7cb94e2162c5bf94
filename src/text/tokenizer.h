/* tokenizer.h — DeepSeek-V3/V4 tokenizer read from a Hugging Face
 * `tokenizer.json`: byte-level BPE (vocab + ranked merges, "a b" strings or
 * ["a","b"] pairs, ignore_merges), added / special tokens matched before
 * pre-tokenization (leftmost-longest by Aho-Corasick, with their lstrip / rstrip / single_word
 * / normalized flags), the pre-tokenizer `Sequence` of `Split` regexes
 * (PCRE2, UTF + UCP) followed by `ByteLevel` (use_regex false), and the
 * ByteLevel decoder. Results match the Python `tokenizers` library on valid
 * UTF-8 (tests/fixtures/tokenizer, made by tools/gen_tokenizer_fixtures.py).
 *
 * Bytes that are not valid UTF-8: byte-level BPE encodes any bytes. Invalid
 * bytes are never matched by a pre-tokenizer regex, so they land in the gaps
 * between matches and are encoded as byte-level symbols like any others;
 * decode gives the exact bytes back (decode(encode(x)) == x for every x: a
 * tokenizer.json whose vocabulary lacks one of the 256 byte symbols is
 * refused at load).
 *
 * Not applied: the post_processor (no BOS/EOS is ever added) and truncation /
 * padding. Unsupported parts of a tokenizer.json are refused at load.
 *
 * A ds_tokenizer is an immutable object owned by the caller once loaded,
 * except for its piece cache: ds_tokenizer_encode may be called from one
 * thread at a time per tokenizer (use one tokenizer per thread otherwise);
 * decode and the lookups are read-only and may run concurrently. */
#ifndef DS_TOKENIZER_H
#define DS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct ds_tokenizer ds_tokenizer;

/* Loads `path`: a tokenizer.json file or a directory holding one. Errors name
 * the file and the field at fault (not JSON, missing model.vocab, a merge
 * naming an unknown token, an unsupported model / pre-tokenizer / normalizer
 * / decoder type, a bad regex, ...). */
int ds_tokenizer_load(const char *path, ds_tokenizer **out, ds_err *err);
/* Same from a JSON text in memory; `what` names it in errors. */
int ds_tokenizer_load_json(const char *json, size_t n, const char *what, ds_tokenizer **out, ds_err *err);
void ds_tokenizer_free(ds_tokenizer *tok);

/* Which added tokens ds_tokenizer_encode recognizes in the text. */
enum {
    /* none: the text is only BPE-encoded (safe for untrusted user text). */
    DS_TOK_PARSE_NONE = 0,
    /* every added token, special or not: the `tokenizers` default
     * (Tokenizer.encode(text, add_special_tokens=False)). */
    DS_TOK_PARSE_ALL = 1,
    /* only added tokens whose "special" is false (e.g. DeepSeek's <｜User｜>,
     * <think>): `tokenizers` with encode_special_tokens = True. */
    DS_TOK_PARSE_NONSPECIAL = 2,
};

/* Encodes n bytes (any bytes; no BOS/EOS is added). *ids is malloc'ed (free
 * it), *n_ids its length. parse_special is a DS_TOK_PARSE_* value. */
int ds_tokenizer_encode(ds_tokenizer *tok, const char *text, size_t n, int parse_special, int32_t **ids,
                        size_t *n_ids, ds_err *err);
/* The same where plain (NULL: none) marks bytes of text as plain text: no
 * added token is recognized over a marked byte (a match that would cover one
 * is no match), whatever parse_special says; the unmarked text is split as
 * ds_tokenizer_encode does, and gaps are pre-tokenized across the marks, so
 * when no added token occurs in the marked bytes the ids are those of
 * ds_tokenizer_encode. Used for prompts built from a template (parsed) around
 * user text (plain). Added tokens are matched in time linear in the text
 * (Aho-Corasick), whatever their lengths. */
int ds_tokenizer_encode_masked(ds_tokenizer *tok, const char *text, size_t n, int parse_special,
                               const unsigned char *plain, int32_t **ids, size_t *n_ids, ds_err *err);

enum {
    DS_DECODE_SKIP_SPECIAL = 1, /* leave out added tokens marked special */
    DS_DECODE_LOSSY = 2,        /* replace invalid UTF-8 by U+FFFD as `tokenizers` does */
};
/* Decodes ids to bytes: *out is malloc'ed and NUL-terminated (free it), *out_n
 * its length without the NUL. Without DS_DECODE_LOSSY the bytes are exact
 * (they may not be valid UTF-8). An id out of range or without a token is an
 * error naming it. */
int ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n, int flags, char **out,
                        size_t *out_n, ds_err *err);

/* The bytes of one token (exact, before any UTF-8 repair); NULL for an id
 * without a token. *n gets the length. The pointer lives as long as tok. */
const char *ds_tokenizer_token_bytes(const ds_tokenizer *tok, int32_t id, size_t *n);
/* The token's string as written in tokenizer.json (byte-level form for
 * model tokens, e.g. "Ġthe"); NULL if none. */
const char *ds_tokenizer_token_str(const ds_tokenizer *tok, int32_t id);

/* 1 + the largest id of the model vocabulary and the added tokens. */
int ds_tokenizer_vocab_size(const ds_tokenizer *tok);
/* The id of a token given by its tokenizer.json string (an added token such
 * as "<｜begin▁of▁sentence｜>" or a model token such as "Ġthe"); -1 if none. */
int32_t ds_tokenizer_token_id(const ds_tokenizer *tok, const char *token);
/* 1 if id is an added token marked special. */
int ds_tokenizer_is_special(const ds_tokenizer *tok, int32_t id);
/* 1 if id is an added token (special or not). */
int ds_tokenizer_is_added(const ds_tokenizer *tok, int32_t id);
/* DeepSeek's <｜begin▁of▁sentence｜> / <｜end▁of▁sentence｜> ids, -1 if absent. */
int32_t ds_tokenizer_bos_id(const ds_tokenizer *tok);
int32_t ds_tokenizer_eos_id(const ds_tokenizer *tok);

/* Streaming detokenizer for a generation loop: push ids one at a time and get
 * the text completed so far. Output is always valid UTF-8: a trailing
 * incomplete sequence is held back until the next ids complete it; bytes that
 * can never become valid UTF-8 are replaced by U+FFFD (one per maximal invalid
 * subpart, as `tokenizers`/Rust's from_utf8_lossy). The concatenation of all
 * outputs and the final flush equals ds_tokenizer_decode(..., DS_DECODE_LOSSY)
 * of all the ids pushed (with the same skip flag). */
typedef struct ds_detok_stream ds_detok_stream;

/* flags: 0 or DS_DECODE_SKIP_SPECIAL. The stream keeps a pointer to tok. */
int ds_detok_stream_new(const ds_tokenizer *tok, int flags, ds_detok_stream **out, ds_err *err);
/* Pushes one id; *text / *n get the newly completed bytes (possibly none).
 * The buffer is owned by the stream and valid until the next call. */
int ds_detok_stream_push(ds_detok_stream *s, int32_t id, const char **text, size_t *n, ds_err *err);
/* Ends the stream: gives what is held back (incomplete bytes become U+FFFD). */
void ds_detok_stream_flush(ds_detok_stream *s, const char **text, size_t *n);
/* Forgets held-back bytes, to start a new text. */
void ds_detok_stream_reset(ds_detok_stream *s);
void ds_detok_stream_free(ds_detok_stream *s);

/* UTF-8 helpers shared with the CLI and chat code. */
/* Length of the longest prefix of s that is valid UTF-8. */
size_t ds_utf8_valid_prefix(const char *s, size_t n);
/* Appends s with invalid sequences replaced by U+FFFD (Rust from_utf8_lossy
 * rules) to the malloc'ed buffer *buf of length *len / capacity *cap.
 * Returns -1 on out of memory. */
int ds_utf8_lossy_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif
