/* chat.c — DeepSeek-V4 prompt encoding / completion parsing (see chat.h).
 * Written from a reading of the official encoding_dsv4.py; the comments name
 * the Python function each part follows. JSON (tool schemas, arguments) is
 * re-printed as Python's json.dumps prints json.loads' result: pyjson.c. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/chat.h"

#include "text/pyjson.h"
#include "text/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text that comes from a message (content, reasoning, tool names, arguments,
 * schemas): marked plain, so it never becomes control tokens. */
static void sb_user(ds_sb *b, const char *s, size_t n) {
    int was = b->user;
    b->user = 1;
    ds_sb_add(b, s, n);
    b->user = was;
}

static void sb_users(ds_sb *b, const char *s) { sb_user(b, s, strlen(s)); }

int ds_chat_json_normalize(const char *json, size_t n, char **out, size_t *out_n, ds_err *err) {
    ds_jnode j;
    const char *why;
    if (ds_json_parse(json, n, &j, &why)) return ds_fail(err, "chat: bad JSON: %s", why);
    ds_sb b = {0};
    ds_py_dump(&b, &j);
    ds_json_free(&j);
    if (b.oom || !b.p) {
        free(b.p);
        return ds_fail(err, "chat: out of memory");
    }
    *out = b.p;
    *out_n = b.n;
    return 0;
}

/* ---------------------------------------------------------------- encoding */

static const char TOOLS_TEMPLATE_A[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<" DS_CHAT_DSML "tool_calls>\" block like the following:\n\n"
    "<" DS_CHAT_DSML "tool_calls>\n"
    "<" DS_CHAT_DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DS_CHAT_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DS_CHAT_DSML
    "parameter>\n"
    "...\n"
    "</" DS_CHAT_DSML "invoke>\n"
    "<" DS_CHAT_DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DS_CHAT_DSML "invoke>\n"
    "</" DS_CHAT_DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " DS_CHAT_THINK_START "), you MUST output your complete reasoning "
    "inside " DS_CHAT_THINK_START "..." DS_CHAT_THINK_END " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " DS_CHAT_THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_TEMPLATE_B[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char REASONING_EFFORT_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char RESPONSE_FORMAT_PREFIX[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

static const struct {
    const char *name, *token;
} TASKS[] = {
    {"action", "<\xef\xbd\x9c" "action\xef\xbd\x9c>"},
    {"query", "<\xef\xbd\x9cquery\xef\xbd\x9c>"},
    {"authority", "<\xef\xbd\x9c" "authority\xef\xbd\x9c>"},
    {"domain", "<\xef\xbd\x9c" "domain\xef\xbd\x9c>"},
    {"title", "<\xef\xbd\x9ctitle\xef\xbd\x9c>"},
    {"read_url", "<\xef\xbd\x9cread_url\xef\xbd\x9c>"},
};

typedef struct {
    int tool_result; /* 0: text block, 1: tool_result block */
    const char *text;
    const char *tool_use_id;
} blk;

/* a message after merge_tool_messages */
typedef struct {
    ds_chat_role role;
    const ds_chat_msg *m; /* source (system / developer / assistant / latest_reminder) */
    blk *blocks;          /* user */
    size_t n_blocks, cap_blocks;
    const char *task;
    int drop_reasoning; /* reasoning_content popped by _drop_thinking_messages */
} imsg;

typedef struct {
    imsg *v;
    size_t n, cap;
} imsg_list;

static imsg *imsg_push(imsg_list *l) {
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 8;
        imsg *nv = realloc(l->v, c * sizeof *nv);
        if (!nv) return NULL;
        l->v = nv;
        l->cap = c;
    }
    imsg *m = &l->v[l->n++];
    memset(m, 0, sizeof *m);
    return m;
}

static int blk_push(imsg *m, blk b) {
    if (m->n_blocks == m->cap_blocks) {
        size_t c = m->cap_blocks ? m->cap_blocks * 2 : 4;
        blk *nb = realloc(m->blocks, c * sizeof *nb);
        if (!nb) return -1;
        m->blocks = nb;
        m->cap_blocks = c;
    }
    m->blocks[m->n_blocks++] = b;
    return 0;
}

static void imsg_list_free(imsg_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].blocks);
    free(l->v);
}

/* merge_tool_messages */
static int merge_tool_messages(const ds_chat_msg *msgs, size_t n, imsg_list *out, ds_err *err) {
    for (size_t i = 0; i < n; i++) {
        const ds_chat_msg *m = &msgs[i];
        imsg *last = out->n ? &out->v[out->n - 1] : NULL;
        if (m->role == DS_CHAT_ROLE_TOOL) {
            /* msg.get("content", ""): absent content is "" */
            blk b = {1, m->content ? m->content : "", m->tool_call_id ? m->tool_call_id : ""};
            if (last && last->role == DS_CHAT_ROLE_USER && last->blocks) {
                if (blk_push(last, b)) return ds_fail(err, "chat: out of memory");
            } else {
                imsg *u = imsg_push(out);
                if (!u) return ds_fail(err, "chat: out of memory");
                u->role = DS_CHAT_ROLE_USER;
                u->m = m;
                if (blk_push(u, b)) return ds_fail(err, "chat: out of memory");
            }
        } else if (m->role == DS_CHAT_ROLE_USER) {
            blk b = {0, m->content ? m->content : "", NULL};
            if (last && last->role == DS_CHAT_ROLE_USER && last->blocks && !last->task) {
                if (blk_push(last, b)) return ds_fail(err, "chat: out of memory");
            } else {
                imsg *u = imsg_push(out);
                if (!u) return ds_fail(err, "chat: out of memory");
                u->role = DS_CHAT_ROLE_USER;
                u->m = m;
                u->task = m->task;
                if (blk_push(u, b)) return ds_fail(err, "chat: out of memory");
            }
        } else if (m->role <= DS_CHAT_ROLE_LATEST_REMINDER) {
            imsg *o = imsg_push(out);
            if (!o) return ds_fail(err, "chat: out of memory");
            o->role = m->role;
            o->m = m;
            o->task = m->task;
        } else {
            return ds_fail(err, "chat: message %zu: unknown role %d", i, (int)m->role);
        }
    }
    return 0;
}

/* sort_tool_results_by_call_order */
static void sort_tool_results(imsg **list, size_t n) {
    const ds_chat_tool_call *order = NULL; /* the last assistant's calls */
    size_t n_order = 0;
    for (size_t i = 0; i < n; i++) {
        imsg *m = list[i];
        if (m->role == DS_CHAT_ROLE_ASSISTANT && m->m->n_tool_calls) {
            order = m->m->tool_calls;
            n_order = m->m->n_tool_calls;
        } else if (m->role == DS_CHAT_ROLE_USER && m->n_blocks) {
            size_t n_tool = 0, n_ids = 0;
            for (size_t k = 0; k < m->n_blocks; k++) n_tool += m->blocks[k].tool_result;
            for (size_t k = 0; k < n_order; k++) n_ids += order[k].id && order[k].id[0];
            if (n_tool <= 1 || n_ids == 0) continue;
            /* key: index of the call with that id (the last one if repeated), else 0 */
            blk *tb = malloc(n_tool * sizeof *tb);
            size_t *key = malloc(n_tool * sizeof *key);
            if (!tb || !key) {
                free(tb);
                free(key);
                continue; /* out of memory: leave the order (not reachable in practice) */
            }
            size_t t = 0;
            for (size_t k = 0; k < m->n_blocks; k++) {
                if (!m->blocks[k].tool_result) continue;
                size_t kv = 0;
                for (size_t c = 0; c < n_order; c++)
                    if (order[c].id && order[c].id[0] && !strcmp(order[c].id, m->blocks[k].tool_use_id)) kv = c;
                /* stable insertion */
                size_t p = t;
                while (p > 0 && key[p - 1] > kv) {
                    key[p] = key[p - 1];
                    tb[p] = tb[p - 1];
                    p--;
                }
                key[p] = kv;
                tb[p] = m->blocks[k];
                t++;
            }
            t = 0;
            for (size_t k = 0; k < m->n_blocks; k++)
                if (m->blocks[k].tool_result) m->blocks[k] = tb[t++];
            free(tb);
            free(key);
        }
    }
}

static int is_user_like(const imsg *m) { return m->role == DS_CHAT_ROLE_USER || m->role == DS_CHAT_ROLE_DEVELOPER; }

/* find_last_user_index */
static long last_user_index(imsg **list, size_t n) {
    for (size_t i = n; i-- > 0;)
        if (is_user_like(list[i])) return (long)i;
    return -1;
}

/* _drop_thinking_messages: keeps user/system/latest_reminder and everything
 * from the last user on; earlier assistants lose their reasoning, earlier
 * developer messages are dropped. Returns the new length; with apply, list is
 * compacted and flags set. */
static size_t drop_thinking(imsg **list, size_t n, int apply) {
    long lu = last_user_index(list, n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        imsg *m = list[i];
        int keep_role = m->role == DS_CHAT_ROLE_USER || m->role == DS_CHAT_ROLE_SYSTEM ||
                        m->role == DS_CHAT_ROLE_TOOL || m->role == DS_CHAT_ROLE_LATEST_REMINDER;
        if (keep_role || (long)i >= lu) {
            if (apply) list[k] = m;
            k++;
        } else if (m->role == DS_CHAT_ROLE_ASSISTANT) {
            if (apply) {
                m->drop_reasoning = 1;
                list[k] = m;
            }
            k++;
        }
    }
    return k;
}

static int task_token(const char *task, const char **tok) {
    for (size_t i = 0; i < sizeof TASKS / sizeof TASKS[0]; i++)
        if (!strcmp(task, TASKS[i].name)) {
            *tok = TASKS[i].token;
            return 0;
        }
    return -1;
}

/* parses a message's tools (OpenAI format) into j; *has = Python truthiness */
static int parse_tools(const imsg *m, size_t index, ds_jnode *j, int *has, ds_err *err) {
    *has = 0;
    memset(j, 0, sizeof *j);
    if (m->role == DS_CHAT_ROLE_USER || !m->m->tools) return 0;
    const char *why;
    if (ds_json_parse(m->m->tools, strlen(m->m->tools), j, &why))
        return ds_fail(err, "chat: message %zu: tools: bad JSON: %s", index, why);
    if (!ds_py_truthy(j)) return 0;
    if (j->t != DS_J_ARR) {
        ds_json_free(j);
        return ds_fail(err, "chat: message %zu: tools must be a JSON array", index);
    }
    for (size_t i = 0; i < j->n; i++)
        if (!ds_json_get(&j->kids[i], "function")) {
            ds_json_free(j);
            return ds_fail(err, "chat: message %zu: tools[%zu] has no \"function\"", index, i);
        }
    *has = 1;
    return 0;
}

/* render_tools */
static void render_tools(ds_sb *b, const ds_jnode *tools) {
    ds_sb_adds(b, TOOLS_TEMPLATE_A);
    for (size_t i = 0; i < tools->n; i++) {
        if (i) ds_sb_add(b, "\n", 1);
        b->user = 1;
        ds_py_dump(b, ds_json_get(&tools->kids[i], "function"));
        b->user = 0;
    }
    ds_sb_adds(b, TOOLS_TEMPLATE_B);
}

/* the tools / response_format suffix of system and developer messages */
static int render_extras(ds_sb *b, const imsg *m, size_t index, ds_err *err) {
    ds_jnode tools;
    int has;
    if (parse_tools(m, index, &tools, &has, err)) return -1;
    if (has) {
        ds_sb_add(b, "\n\n", 2);
        render_tools(b, &tools);
    }
    ds_json_free(&tools);
    if (m->m->response_format) {
        ds_jnode rf;
        const char *why;
        if (ds_json_parse(m->m->response_format, strlen(m->m->response_format), &rf, &why))
            return ds_fail(err, "chat: message %zu: response_format: bad JSON: %s", index, why);
        if (ds_py_truthy(&rf)) {
            ds_sb_add(b, "\n\n", 2);
            ds_sb_adds(b, RESPONSE_FORMAT_PREFIX);
            b->user = 1;
            ds_py_dump(b, &rf);
            b->user = 0;
        }
        ds_json_free(&rf);
    }
    return 0;
}

/* encode_arguments_to_dsml */
static int render_arguments(ds_sb *b, const ds_chat_tool_call *tc, size_t index, ds_err *err) {
    static const char P_OPEN[] = "<" DS_CHAT_DSML "parameter name=\"";
    static const char P_CLOSE[] = "</" DS_CHAT_DSML "parameter>";
    ds_jnode j;
    const char *why;
    if (!tc->arguments) { /* json.loads(None) fails: {"arguments": None} */
        ds_sb_adds(b, P_OPEN);
        ds_sb_adds(b, "arguments\" string=\"false\">null");
        ds_sb_adds(b, P_CLOSE);
        return 0;
    }
    if (ds_json_parse(tc->arguments, strlen(tc->arguments), &j, &why)) {
        /* not JSON: one string parameter holding the text */
        ds_sb_adds(b, P_OPEN);
        ds_sb_adds(b, "arguments\" string=\"true\">");
        sb_users(b, tc->arguments);
        ds_sb_adds(b, P_CLOSE);
        return 0;
    }
    if (j.t != DS_J_OBJ) {
        ds_json_free(&j);
        return ds_fail(err, "chat: message %zu: tool call \"%s\": arguments must be a JSON object", index,
                       tc->name ? tc->name : "None");
    }
    int first = 1;
    for (size_t i = 0; i < j.n; i++) {
        if (ds_json_first_dup(&j, i)) continue;
        const ds_jnode *v = &j.kids[ds_json_last_dup(&j, i)];
        if (!first) ds_sb_add(b, "\n", 1);
        first = 0;
        ds_sb_adds(b, P_OPEN);
        sb_user(b, j.key[i], j.klen[i]);
        ds_sb_adds(b, v->t == DS_J_STR ? "\" string=\"true\">" : "\" string=\"false\">");
        b->user = 1;
        if (v->t == DS_J_STR) ds_sb_add(b, v->s, v->len);
        else ds_py_dump(b, v);
        b->user = 0;
        ds_sb_adds(b, P_CLOSE);
    }
    ds_json_free(&j);
    return 0;
}

/* render_message */
static int render_message(ds_sb *b, size_t index, imsg **list, size_t n, int thinking, int drop, const char *effort,
                          ds_err *err) {
    const imsg *m = list[index];
    long lu = last_user_index(list, n);
    if (effort && strcmp(effort, "max") && strcmp(effort, "high"))
        return ds_fail(err, "chat: invalid reasoning effort \"%s\" (high, max or none)", effort);
    if (index == 0 && thinking && effort && !strcmp(effort, "max")) ds_sb_adds(b, REASONING_EFFORT_MAX);

    switch (m->role) {
    case DS_CHAT_ROLE_SYSTEM:
        if (m->m->content) sb_users(b, m->m->content);
        if (render_extras(b, m, index, err)) return -1;
        break;
    case DS_CHAT_ROLE_DEVELOPER:
        if (!m->m->content || !m->m->content[0])
            return ds_fail(err, "chat: message %zu: a developer message needs content", index);
        ds_sb_adds(b, DS_CHAT_USER);
        sb_users(b, m->m->content);
        if (render_extras(b, m, index, err)) return -1;
        break;
    case DS_CHAT_ROLE_USER:
        ds_sb_adds(b, DS_CHAT_USER);
        for (size_t k = 0; k < m->n_blocks; k++) {
            if (k) ds_sb_add(b, "\n\n", 2);
            if (m->blocks[k].tool_result) {
                ds_sb_adds(b, "<tool_result>");
                sb_users(b, m->blocks[k].text);
                ds_sb_adds(b, "</tool_result>");
            } else {
                sb_users(b, m->blocks[k].text);
            }
        }
        break;
    case DS_CHAT_ROLE_LATEST_REMINDER:
        ds_sb_adds(b, DS_CHAT_LATEST_REMINDER);
        sb_users(b, m->m->content ? m->m->content : "None");
        break;
    case DS_CHAT_ROLE_ASSISTANT: {
        int prev_has_task = index > 0 && list[index - 1]->task;
        if (thinking && !prev_has_task && (!drop || (long)index > lu)) {
            if (m->m->reasoning_content && !m->drop_reasoning) sb_users(b, m->m->reasoning_content);
            ds_sb_adds(b, DS_CHAT_THINK_END);
        }
        if (m->m->content) sb_users(b, m->m->content);
        if (m->m->n_tool_calls) {
            ds_sb_adds(b, "\n\n<" DS_CHAT_DSML "tool_calls>\n");
            for (size_t k = 0; k < m->m->n_tool_calls; k++) {
                const ds_chat_tool_call *tc = &m->m->tool_calls[k];
                if (k) ds_sb_add(b, "\n", 1);
                ds_sb_adds(b, "<" DS_CHAT_DSML "invoke name=\"");
                sb_users(b, tc->name ? tc->name : "None");
                ds_sb_adds(b, "\">\n");
                if (render_arguments(b, tc, index, err)) return -1;
                ds_sb_adds(b, "\n</" DS_CHAT_DSML "invoke>");
            }
            ds_sb_adds(b, "\n</" DS_CHAT_DSML "tool_calls>");
        }
        if (!m->m->wo_eos) ds_sb_adds(b, DS_CHAT_EOS);
        break;
    }
    default: return ds_fail(err, "chat: message %zu: unknown role %d", index, (int)m->role);
    }

    if (index + 1 < n && list[index + 1]->role != DS_CHAT_ROLE_ASSISTANT &&
        list[index + 1]->role != DS_CHAT_ROLE_LATEST_REMINDER)
        return 0;
    if (m->task) {
        const char *tt;
        if (task_token(m->task, &tt))
            return ds_fail(err, "chat: message %zu: invalid task \"%s\" (action, query, authority, domain, title, "
                                "read_url)", index, m->task);
        if (strcmp(m->task, "action")) {
            ds_sb_adds(b, tt);
        } else {
            ds_sb_adds(b, DS_CHAT_ASSISTANT);
            ds_sb_adds(b, thinking ? DS_CHAT_THINK_START : DS_CHAT_THINK_END);
            ds_sb_adds(b, tt);
        }
    } else if (is_user_like(m)) {
        ds_sb_adds(b, DS_CHAT_ASSISTANT);
        if ((!drop && thinking) || (drop && thinking && (long)index >= lu)) ds_sb_adds(b, DS_CHAT_THINK_START);
        else ds_sb_adds(b, DS_CHAT_THINK_END);
    }
    return 0;
}

/* encode_messages */
int ds_chat_encode(const ds_chat_msg *msgs, size_t n, const ds_chat_opts *opts, char **out, size_t *out_n,
                   ds_err *err) {
    return ds_chat_encode_marked(msgs, n, opts, out, out_n, NULL, err);
}

int ds_chat_encode_marked(const ds_chat_msg *msgs, size_t n, const ds_chat_opts *opts, char **out, size_t *out_n,
                          unsigned char **plain, ds_err *err) {
    *out = NULL;
    *out_n = 0;
    if (plain) *plain = NULL;
    static const ds_chat_opts zero_opts;
    if (!opts) opts = &zero_opts;
    if (opts->n_context > n) return ds_fail(err, "chat: n_context %zu > %zu messages", opts->n_context, n);
    imsg_list ctx = {0}, rest = {0};
    imsg **full = NULL;
    ds_sb b = {0};
    b.track = plain != NULL;
    int rc = -1;
    if (merge_tool_messages(msgs, opts->n_context, &ctx, err) ||
        merge_tool_messages(msgs + opts->n_context, n - opts->n_context, &rest, err))
        goto done;
    size_t nf = ctx.n + rest.n;
    full = malloc((nf ? nf : 1) * sizeof *full);
    if (!full) {
        ds_fail(err, "chat: out of memory");
        goto done;
    }
    for (size_t i = 0; i < ctx.n; i++) full[i] = &ctx.v[i];
    for (size_t i = 0; i < rest.n; i++) full[ctx.n + i] = &rest.v[i];
    sort_tool_results(full, nf);

    if (!opts->no_bos && opts->n_context == 0) ds_sb_adds(&b, DS_CHAT_BOS);
    int drop = !opts->keep_reasoning;
    for (size_t i = 0; i < nf; i++) {
        ds_jnode t;
        int has;
        if (parse_tools(full[i], i, &t, &has, err)) goto done;
        ds_json_free(&t);
        if (has) drop = 0;
    }
    size_t num_to_render, context_len;
    if (opts->thinking && drop) {
        imsg **cl = malloc((ctx.n ? ctx.n : 1) * sizeof *cl);
        if (!cl) {
            ds_fail(err, "chat: out of memory");
            goto done;
        }
        for (size_t i = 0; i < ctx.n; i++) cl[i] = &ctx.v[i];
        size_t n_ctx_dropped = drop_thinking(cl, ctx.n, 0);
        free(cl);
        nf = drop_thinking(full, nf, 1);
        num_to_render = nf - n_ctx_dropped;
        context_len = nf - num_to_render;
    } else {
        num_to_render = rest.n;
        context_len = ctx.n;
    }
    for (size_t i = 0; i < num_to_render; i++)
        if (render_message(&b, i + context_len, full, nf, opts->thinking, drop, opts->reasoning_effort, err)) goto done;
    if (b.oom) {
        ds_fail(err, "chat: out of memory");
        goto done;
    }
    if (!b.p) {
        b.p = calloc(1, 1);
        if (!b.p) {
            ds_fail(err, "chat: out of memory");
            goto done;
        }
    }
    if (plain && !b.mk && !(b.mk = calloc(1, 1))) {
        ds_fail(err, "chat: out of memory");
        goto done;
    }
    *out = b.p;
    *out_n = b.n;
    if (plain) *plain = b.mk;
    b.p = NULL;
    b.mk = NULL;
    rc = 0;
done:
    free(b.p);
    free(b.mk);
    free(full);
    imsg_list_free(&ctx);
    imsg_list_free(&rest);
    return rc;
}

int ds_chat_tokenize(ds_tokenizer *tok, const ds_chat_msg *msgs, size_t n, const ds_chat_opts *opts,
                     int parse_special_in_messages, int32_t **ids, size_t *n_ids, ds_err *err) {
    *ids = NULL;
    *n_ids = 0;
    char *text = NULL;
    unsigned char *plain = NULL;
    size_t len = 0;
    int rc = ds_chat_encode_marked(msgs, n, opts, &text, &len, parse_special_in_messages ? NULL : &plain, err);
    if (!rc) rc = ds_tokenizer_encode_masked(tok, text, len, DS_TOK_PARSE_ALL, plain, ids, n_ids, err);
    free(text);
    free(plain);
    return rc;
}

/* ----------------------------------------------------------------- parsing */

typedef struct {
    const char *text;
    size_t n;
} span;

/* _read_until_stop: earliest stop at or after *idx (the first listed wins a
 * tie); returns its index in stops or -1; *content = text between. */
static int read_until(const char *t, size_t n, size_t *idx, const char *const *stops, int n_stops, span *content) {
    size_t best = n;
    int which = -1;
    for (int k = 0; k < n_stops; k++) {
        size_t sl = strlen(stops[k]);
        const char *p = *idx <= n ? memmem(t + *idx, n - *idx, stops[k], sl) : NULL;
        if (p && (size_t)(p - t) < best) {
            best = (size_t)(p - t);
            which = k;
        }
    }
    content->text = t + *idx;
    if (which < 0) {
        content->n = n - *idx;
        *idx = n;
    } else {
        content->n = best - *idx;
        *idx = best + strlen(stops[which]);
    }
    return which;
}

static int span_is(span s, const char *lit) { return s.n == strlen(lit) && !memcmp(s.text, lit, s.n); }

static char *dup_span(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ds_chat_reply_free(ds_chat_reply *r) {
    if (!r) return;
    free(r->content);
    free(r->reasoning);
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    memset(r, 0, sizeof *r);
}

typedef struct {
    pcre2_code *name_re, *param_re;
    pcre2_match_data *md;
} parse_res;

static pcre2_code *re_compile(const char *pat) {
    int ec;
    PCRE2_SIZE eo;
    return pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_DOTALL | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
}

/* a parameter of the call being parsed */
typedef struct {
    span name, value;
    int is_str;
} param;

/* parse_tool_calls + decode_dsml_to_arguments */
static int parse_tool_calls(const char *t, size_t n, size_t *idx, int *stop_which, ds_chat_reply *r, parse_res *re,
                            ds_err *err) {
    static const char *const S_INVOKE[] = {"<" DS_CHAT_DSML "invoke", "</" DS_CHAT_DSML "tool_calls>"};
    static const char *const S_PARAM[] = {"<" DS_CHAT_DSML "parameter", "</" DS_CHAT_DSML "invoke"};
    static const char *const S_PEND[] = {"/" DS_CHAT_DSML "parameter"};
    *stop_which = -1; /* -1: none, 0: invoke-like, 1: the tool_calls end */
    param *ps = NULL;
    size_t np = 0, cap = 0;
    int rc = -1;
    while (*idx < n) {
        span c;
        int w = read_until(t, n, idx, S_INVOKE, 2, &c);
        *stop_which = w == 1 ? 1 : (w < 0 ? -1 : 0);
        if (!span_is(c, ">\n")) {
            ds_fail(err, "chat: tool call format error: expected '>\\n' but got '%.*s'", (int)(c.n > 60 ? 60 : c.n),
                    c.text);
            goto done;
        }
        if (w == 1) break;
        if (w < 0) {
            ds_fail(err, "chat: missing special token in tool calls");
            goto done;
        }
        span name_part;
        w = read_until(t, n, idx, S_PARAM, 2, &name_part);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
        if (pcre2_match(re->name_re, (PCRE2_SPTR)name_part.text, name_part.n, 0, 0, re->md, NULL) < 2) {
            ds_fail(err, "chat: tool name format error: '%.*s'", (int)(name_part.n > 60 ? 60 : name_part.n),
                    name_part.text);
            goto done;
        }
        span tool_name = {name_part.text + ov[2], ov[3] - ov[2]};
        np = 0;
        while (w == 0) { /* "<｜DSML｜parameter" */
            span pc;
            read_until(t, n, idx, S_PEND, 1, &pc);
            if (pcre2_match(re->param_re, (PCRE2_SPTR)pc.text, pc.n, 0, 0, re->md, NULL) < 4) {
                ds_fail(err, "chat: parameter format error: '%.*s'", (int)(pc.n > 60 ? 60 : pc.n), pc.text);
                goto done;
            }
            param p = {{pc.text + ov[2], ov[3] - ov[2]}, {pc.text + ov[6], ov[7] - ov[6]},
                       ov[5] - ov[4] == 4 /* "true" */};
            for (size_t k = 0; k < np; k++)
                if (ps[k].name.n == p.name.n && !memcmp(ps[k].name.text, p.name.text, p.name.n)) {
                    ds_fail(err, "chat: duplicate parameter name: '%.*s'", (int)p.name.n, p.name.text);
                    goto done;
                }
            if (np == cap) {
                cap = cap ? cap * 2 : 8;
                param *nps = realloc(ps, cap * sizeof *nps);
                if (!nps) {
                    ds_fail(err, "chat: out of memory");
                    goto done;
                }
                ps = nps;
            }
            ps[np++] = p;
            span after;
            w = read_until(t, n, idx, S_PARAM, 2, &after);
            if (!span_is(after, ">\n")) {
                ds_fail(err, "chat: parameter format error: expected '>\\n' but got '%.*s'",
                        (int)(after.n > 60 ? 60 : after.n), after.text);
                goto done;
            }
        }
        *stop_which = 0;
        /* decode_dsml_to_arguments */
        ds_sb a = {0};
        ds_sb_add(&a, "{", 1);
        for (size_t k = 0; k < np; k++) {
            if (k) ds_sb_add(&a, ", ", 2);
            ds_py_str(&a, ps[k].name.text, ps[k].name.n);
            ds_sb_add(&a, ": ", 2);
            if (ps[k].is_str) ds_py_str(&a, ps[k].value.text, ps[k].value.n);
            else ds_sb_add(&a, ps[k].value.text, ps[k].value.n);
        }
        ds_sb_add(&a, "}", 1);
        ds_chat_call *nc = realloc(r->calls, (r->n_calls + 1) * sizeof *nc);
        char *nm = dup_span(tool_name.text, tool_name.n);
        if (!nc || !nm || a.oom) {
            if (nc) r->calls = nc;
            free(nm);
            free(a.p);
            ds_fail(err, "chat: out of memory");
            goto done;
        }
        r->calls = nc;
        r->calls[r->n_calls].name = nm;
        r->calls[r->n_calls].arguments = a.p;
        r->n_calls++;
    }
    rc = 0;
done:
    free(ps);
    return rc;
}

/* parse_message_from_completion_text */
int ds_chat_parse(const char *t, size_t n, int thinking, ds_chat_reply *out, ds_err *err) {
    static const char TC_START[] = "\n\n<" DS_CHAT_DSML "tool_calls";
    memset(out, 0, sizeof *out);
    parse_res re = {0};
    re.name_re = re_compile("^[\\s\\x{1c}-\\x{1f}\\x{85}]*name=\"(.*?)\">\\n$");
    re.param_re = re_compile("^ name=\"(.*?)\" string=\"(true|false)\">(.*?)<$");
    re.md = pcre2_match_data_create(8, NULL);
    int rc = -1;
    if (!re.name_re || !re.param_re || !re.md) {
        ds_fail(err, "chat: out of memory");
        goto done;
    }
    size_t idx = 0;
    span reasoning = {t, 0}, summary;
    int stop_is_eos = 0, stop_none = 0;
    if (thinking) {
        const char *stops[] = {DS_CHAT_THINK_END, TC_START};
        if (read_until(t, n, &idx, stops, 2, &reasoning) != 0) {
            ds_fail(err, "chat: invalid thinking format: missing %s", DS_CHAT_THINK_END);
            goto done;
        }
    }
    const char *stops2[] = {DS_CHAT_EOS, TC_START};
    int w = read_until(t, n, &idx, stops2, 2, &summary);
    if (w == 1) {
        int sw;
        if (parse_tool_calls(t, n, &idx, &sw, out, &re, err)) goto done;
        const char *stops3[] = {DS_CHAT_EOS};
        span rest;
        int w3 = read_until(t, n, &idx, stops3, 1, &rest);
        if (rest.n) {
            ds_fail(err, "chat: unexpected content after tool calls");
            goto done;
        }
        stop_is_eos = w3 == 0;
        stop_none = w3 < 0;
    } else if (w == 0) {
        stop_is_eos = 1;
    } else {
        ds_fail(err, "chat: invalid format: missing %s", DS_CHAT_EOS);
        goto done;
    }
    if (idx != n || !(stop_is_eos || stop_none)) {
        ds_fail(err, "chat: unexpected content at end");
        goto done;
    }
    static const char *const SP[] = {DS_CHAT_BOS, DS_CHAT_EOS, DS_CHAT_THINK_START, DS_CHAT_THINK_END, DS_CHAT_DSML};
    for (size_t k = 0; k < sizeof SP / sizeof SP[0]; k++) {
        size_t sl = strlen(SP[k]);
        if (memmem(summary.text, summary.n, SP[k], sl) || memmem(reasoning.text, reasoning.n, SP[k], sl)) {
            ds_fail(err, "chat: unexpected special token '%s' in content", SP[k]);
            goto done;
        }
    }
    out->content = dup_span(summary.text, summary.n);
    out->reasoning = dup_span(reasoning.text, reasoning.n);
    if (!out->content || !out->reasoning) {
        ds_fail(err, "chat: out of memory");
        goto done;
    }
    rc = 0;
done:
    if (rc) ds_chat_reply_free(out);
    pcre2_code_free(re.name_re);
    pcre2_code_free(re.param_re);
    pcre2_match_data_free(re.md);
    return rc;
}
