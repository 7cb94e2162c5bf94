/* openai_chat.h — OpenAI API requests onto the engine: a chat.completions or
 * completions JSON body becomes prompt tokens and request parameters; the
 * generated text becomes reasoning_content / content / tool_calls.
 *
 * Prompt rule: every string a client sends (message contents, reasoning,
 * tool schemas, tool call names and arguments, tool results, a completions
 * prompt) is tokenized as plain text — a "<｜User｜>" typed by a user stays
 * text. Only the chat encoder's own template text yields control tokens
 * (ds_oai_encode_chat, which is the CLI's ds_chat_tokenize). */
#ifndef DS_OPENAI_CHAT_H
#define DS_OPENAI_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "text/chat.h"
#include "text/tokenizer.h"
#include "runtime/scheduler.h"

#define DS_OAI_MAX_STOP 4

/* An OpenAI-style error: HTTP status, type, param (may be ""), message. */
typedef struct ds_oai_error {
    int status;
    char type[48];
    char param[48];
    char code[48];
    char message[512];
} ds_oai_error;

/* Fills e and returns -1. */
int ds_oai_fail(ds_oai_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                ...) __attribute__((format(printf, 6, 7)));

typedef struct ds_oai_req {
    int chat;          /* 1: chat.completions, 0: completions */
    int stream, include_usage;
    int thinking;      /* chat: thinking mode (the reply starts with reasoning) */
    int has_tools;
    int parallel_calls; /* parallel_tool_calls (default true): several tool calls in one reply */
    int n_choices;     /* n: choices, each its own sequence with seed seed + i */
    int32_t *prompt;   /* malloc'ed */
    int n_prompt;
    ds_req_params rp;  /* max_new, sampling, EOS as the stop token, top_logprobs, the grammar */
    ds_grammar *grammar; /* response_format json_object / json_schema, or the required tool call: owned; rp.grammar */
    char *stop[DS_OAI_MAX_STOP]; /* stop strings (malloc'ed) */
    int n_stop;
} ds_oai_req;

/* Parses a request body. model_id: the served model's name (a different
 * "model" is a 404 model_not_found); ctx: the context in tokens (a prompt
 * that does not fit is a 400 context_length_exceeded); default_seed: used when
 * the request has no seed. tok must not be used by another thread meanwhile.
 * On error fills e (status 400 / 404) and returns -1 with nothing to free. */
int ds_oai_parse(ds_tokenizer *tok, const char *model_id, int64_t ctx, uint64_t default_seed, int chat,
                 const char *body, size_t n, ds_oai_req *out, ds_oai_error *e);
void ds_oai_req_free(ds_oai_req *r);

/* The chat prompt of msgs (ds_chat_encode) as token ids: ds_chat_tokenize
 * with every message field (content, reasoning_content, tools, tool call
 * names and arguments, response_format) plain text and only the template's
 * own added-token strings as control tokens. */
int ds_oai_encode_chat(ds_tokenizer *tok, const ds_chat_msg *msgs, size_t n, const ds_chat_opts *o, int32_t **ids,
                       size_t *n_ids, ds_err *err);

/* The generated text of one request as it streams: stop strings, and in chat
 * mode the split into reasoning (up to </think> in thinking mode) and content
 * (up to a DSML tool-call block, which is parsed at the end). */
typedef struct ds_oai_text {
    int chat, thinking;
    const char *const *stop;
    int n_stop;
    char *raw; /* every generated token's text (stop token excluded) */
    size_t n_raw, cap;
    size_t released;  /* raw[0..released) cannot become part of a stop string */
    int stop_hit;     /* a stop string was found: raw ends before it */
    int ended;
    int one_call; /* at most one tool call in the message (parallel_tool_calls false); set after init */
    size_t sent_reasoning, sent_content;
} ds_oai_text;

void ds_oai_text_init(ds_oai_text *t, int chat, int thinking, const char *const *stop, int n_stop);
void ds_oai_text_free(ds_oai_text *t);
/* Appends text; returns 1 when a stop string ends the text (stop
 * generating), 0 otherwise, -1 out of memory. */
int ds_oai_text_push(ds_oai_text *t, const char *s, size_t n);
/* No more text: releases what was held back. */
void ds_oai_text_end(ds_oai_text *t);
/* What is new since the last call: reasoning and content bytes (pointers
 * into the buffer, valid until the next push). */
void ds_oai_text_deltas(ds_oai_text *t, const char **reasoning, size_t *n_reasoning, const char **content,
                        size_t *n_content);

/* The final message of an ended text: sets "content" (null when empty with
 * tool calls), "reasoning_content" (thinking mode) and "tool_calls" (DSML
 * calls parsed back, ids "call_<id_base>_<i>"; the first only with one_call)
 * on msg, a cJSON object.
 * Returns the number of tool calls. eos: generation ended at the EOS token. */
struct cJSON;
int ds_oai_text_message(ds_oai_text *t, int eos, const char *id_base, struct cJSON *msg);

#endif
