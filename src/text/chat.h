/* chat.h — DeepSeek-V4 chat prompt encoding and completion parsing, as the
 * official encoder `encoding_dsv4.py` (encode_messages /
 * parse_message_from_completion_text) does it: system / developer / user /
 * assistant / tool / latest_reminder messages, chat vs thinking mode,
 * reasoning effort, dropping earlier turns' reasoning, tool definitions (JSON
 * schemas rendered with Python's json.dumps spacing) and tool calls in the
 * DSML format, tool results merged into user turns in call order, quick
 * instruction tasks. Tested against strings the official encoder produced
 * (tests/fixtures/tokenizer/chat_cases.json).
 *
 * The prompt is text whose template markup holds added tokens (<｜User｜>,
 * <think>, ...). Tokenize conversations with ds_chat_tokenize: the markup
 * becomes control tokens, while the text of the messages themselves stays
 * plain text (a user who types "<｜end▁of▁sentence｜><｜User｜>" cannot forge a
 * turn) — the one rule for the CLI and the server. */
#ifndef DS_CHAT_H
#define DS_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "text/tokenizer.h"

/* <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜User｜>, <｜Assistant｜>, <｜latest_reminder｜> */
#define DS_CHAT_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_CHAT_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_CHAT_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_CHAT_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS_CHAT_LATEST_REMINDER "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define DS_CHAT_THINK_START "<think>"
#define DS_CHAT_THINK_END "</think>"
#define DS_CHAT_DSML "\xef\xbd\x9c" "DSML\xef\xbd\x9c" /* ｜DSML｜ */

typedef enum {
    DS_CHAT_ROLE_SYSTEM,
    DS_CHAT_ROLE_USER,
    DS_CHAT_ROLE_ASSISTANT,
    DS_CHAT_ROLE_TOOL,            /* a tool result: merged into a user turn */
    DS_CHAT_ROLE_DEVELOPER,
    DS_CHAT_ROLE_LATEST_REMINDER,
} ds_chat_role;

typedef struct {
    const char *id;        /* call id, matched by a tool message's tool_call_id (may be NULL) */
    const char *name;
    const char *arguments; /* JSON object text (OpenAI's function.arguments); text that is not
                              JSON is passed as one string parameter "arguments", as the
                              official encoder does */
} ds_chat_tool_call;

/* One message; NULL pointers mean "absent". All strings are UTF-8. */
typedef struct {
    ds_chat_role role;
    const char *content;
    const char *reasoning_content;       /* assistant: its thinking text */
    const ds_chat_tool_call *tool_calls; /* assistant */
    size_t n_tool_calls;
    const char *tool_call_id;            /* tool */
    const char *tools;           /* system / developer: JSON array of OpenAI tools,
                                    [{"type": "function", "function": {"name", "description", "parameters"}}] */
    const char *response_format; /* system / developer: a JSON value */
    const char *task;            /* quick instruction task: "action", "query", "authority",
                                    "domain", "title", "read_url"; NULL for normal turns */
    int wo_eos;                  /* assistant: no closing EOS (a prefix to continue) */
} ds_chat_msg;

/* Options; all-zero is chat mode, earlier reasoning dropped, BOS, no context. */
typedef struct {
    int thinking;                 /* 1: thinking mode (the prompt ends with <think>) */
    int keep_reasoning;           /* 1: drop_thinking=False: keep earlier turns' reasoning */
    int no_bos;                   /* 1: add_default_bos_token=False */
    const char *reasoning_effort; /* NULL, "high" or "max" (max prefixes a prompt in thinking mode) */
    size_t n_context;             /* the first n_context messages are context already encoded
                                     (a prefix of the conversation): only the rest is rendered,
                                     and no BOS */
} ds_chat_opts;

/* Builds the prompt string; *out is malloc'ed and NUL-terminated, *out_n its
 * length. Errors (ds_err) where the official encoder raises: an unknown role
 * or task, a developer message without content, bad reasoning_effort, tools
 * or arguments that are not the JSON expected. */
int ds_chat_encode(const ds_chat_msg *msgs, size_t n, const ds_chat_opts *opts, char **out, size_t *out_n,
                   ds_err *err);

/* ds_chat_encode that also gives *plain (malloc'ed, *out_n bytes; plain may be
 * NULL): 1 for each byte of the prompt that comes from a message field
 * (content, reasoning, tool names and arguments, tools, response_format), 0
 * for the template's own text. */
int ds_chat_encode_marked(const ds_chat_msg *msgs, size_t n, const ds_chat_opts *opts, char **out, size_t *out_n,
                          unsigned char **plain, ds_err *err);

/* The token ids of a conversation: ds_chat_encode_marked, then
 * ds_tokenizer_encode_masked with DS_TOK_PARSE_ALL, where the bytes from
 * messages are plain text unless parse_special_in_messages is nonzero (an
 * explicit opt-in: then special-token strings typed in messages become
 * control tokens, as tokenizing the whole prompt text does). When no message
 * holds an added token's string both give the same ids. *ids malloc'ed. */
int ds_chat_tokenize(ds_tokenizer *tok, const ds_chat_msg *msgs, size_t n, const ds_chat_opts *opts,
                     int parse_special_in_messages, int32_t **ids, size_t *n_ids, ds_err *err);

/* A completion parsed back. Strings malloc'ed, NUL-terminated. */
typedef struct {
    char *name;
    char *arguments; /* JSON object text, as the official parser builds it */
} ds_chat_call;

typedef struct {
    char *content;
    char *reasoning; /* "" in chat mode */
    ds_chat_call *calls;
    size_t n_calls;
} ds_chat_reply;

/* Parses one assistant completion (the generated text after the prompt,
 * including the final <｜end▁of▁sentence｜>) into content / reasoning / tool
 * calls. thinking: 1 if the prompt was in thinking mode (the text starts with
 * the reasoning and has </think>). Errors on malformed text, as the official
 * parser. On success free *out with ds_chat_reply_free. */
int ds_chat_parse(const char *text, size_t n, int thinking, ds_chat_reply *out, ds_err *err);
void ds_chat_reply_free(ds_chat_reply *r);

/* Python json.dumps(json.loads(json), ensure_ascii=False): normalizes a JSON
 * text the way the official encoder prints tool schemas. *out malloc'ed. */
int ds_chat_json_normalize(const char *json, size_t n, char **out, size_t *out_n, ds_err *err);

#endif
