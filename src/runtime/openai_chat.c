/* openai_chat.c — see openai_chat.h. */
#include "runtime/openai_chat.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_schema.h"

int ds_oai_fail(ds_oai_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(param, ...) ds_oai_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* ------------------------------------------------------- chat prompt tokens */

int ds_oai_encode_chat(ds_tokenizer *tok, const ds_chat_msg *msgs, size_t n, const ds_chat_opts *o, int32_t **ids,
                       size_t *n_ids, ds_err *err) {
    return ds_chat_tokenize(tok, msgs, n, o, 0, ids, n_ids, err);
}

/* ---------------------------------------------------------- request parsing */

static const char *type_name(const cJSON *j) {
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

/* Optional number in [lo, hi]: 0 absent/null, 1 set, -1 error. */
static int get_num(const cJSON *o, const char *k, double lo, double hi, double *v, ds_oai_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j)) return BAD(k, "'%s' must be a number, not %s", k, type_name(j));
    if (!(j->valuedouble >= lo && j->valuedouble <= hi))
        return BAD(k, "'%s' is %g; it must be in [%g, %g]", k, j->valuedouble, lo, hi);
    *v = j->valuedouble;
    return 1;
}

static int get_int(const cJSON *o, const char *k, double lo, double hi, long long *v, ds_oai_error *e) {
    double d;
    int r = get_num(o, k, lo, hi, &d, e);
    if (r <= 0) return r;
    if (d != floor(d)) return BAD(k, "'%s' must be an integer, not %g", k, d);
    *v = (long long)d;
    return 1;
}

static int get_bool(const cJSON *o, const char *k, int *v, ds_oai_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsBool(j)) return BAD(k, "'%s' must be a boolean, not %s", k, type_name(j));
    *v = cJSON_IsTrue(j);
    return 1;
}

/* content: a string, null, or a list of {"type": "text", "text": ...} parts.
 * *out is NULL (absent / null) or malloc'ed. */
static int get_content(const cJSON *m, const char *k, size_t mi, char **out, ds_oai_error *e) {
    *out = NULL;
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(m, k);
    char pname[48];
    snprintf(pname, sizeof pname, "messages[%zu].%s", mi, k);
    if (!j || cJSON_IsNull(j)) return 0;
    if (cJSON_IsString(j)) {
        if (!(*out = strdup(j->valuestring))) return BAD(pname, "out of memory");
        return 0;
    }
    if (!cJSON_IsArray(j)) return BAD(pname, "'%s' must be a string, an array of text parts or null, not %s", pname,
                                      type_name(j));
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, j) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x))
            return BAD(pname, "'%s': only parts {\"type\": \"text\", \"text\": \"...\"} are supported", pname);
        len += strlen(x->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return BAD(pname, "out of memory");
    len = 0;
    cJSON_ArrayForEach(p, j) {
        const char *x = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t xn = strlen(x);
        memcpy(s + len, x, xn);
        len += xn;
    }
    s[len] = 0;
    *out = s;
    return 0;
}

typedef struct {
    ds_chat_msg *msgs;
    char **strs; /* everything malloc'ed for msgs */
    size_t n_strs, cap_strs;
    ds_chat_tool_call **calls;
    size_t n_calls;
} msg_store;

static int keep(msg_store *st, char *s) {
    if (!s) return 0;
    if (st->n_strs == st->cap_strs) {
        size_t c = st->cap_strs ? st->cap_strs * 2 : 32;
        char **nv = realloc(st->strs, c * sizeof *nv);
        if (!nv) {
            free(s);
            return -1;
        }
        st->strs = nv;
        st->cap_strs = c;
    }
    st->strs[st->n_strs++] = s;
    return 0;
}

static void store_free(msg_store *st) {
    for (size_t i = 0; i < st->n_strs; i++) free(st->strs[i]);
    for (size_t i = 0; i < st->n_calls; i++) free(st->calls[i]);
    free(st->strs);
    free(st->calls);
    free(st->msgs);
}

static int parse_messages(const cJSON *body, msg_store *st, size_t *n_out, ds_oai_error *e) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!ms) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(ms)) return BAD("messages", "'messages' must be an array, not %s", type_name(ms));
    size_t n = (size_t)cJSON_GetArraySize(ms);
    if (!n) return BAD("messages", "'messages' is empty");
    /* one more for a system message carrying the tools */
    if (!(st->msgs = calloc(n + 1, sizeof *st->msgs)) || !(st->calls = calloc(n, sizeof *st->calls)))
        return BAD("messages", "out of memory");
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        char pn[64];
        ds_chat_msg *d = &st->msgs[i];
        if (!cJSON_IsObject(m)) {
            snprintf(pn, sizeof pn, "messages[%zu]", i);
            return BAD(pn, "'%s' must be an object, not %s", pn, type_name(m));
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(pn, sizeof pn, "messages[%zu].role", i);
        if (!cJSON_IsString(role)) return BAD(pn, "'%s' must be a string", pn);
        const char *r = role->valuestring;
        if (!strcmp(r, "system")) d->role = DS_CHAT_ROLE_SYSTEM;
        else if (!strcmp(r, "developer")) d->role = DS_CHAT_ROLE_DEVELOPER;
        else if (!strcmp(r, "user")) d->role = DS_CHAT_ROLE_USER;
        else if (!strcmp(r, "assistant")) d->role = DS_CHAT_ROLE_ASSISTANT;
        else if (!strcmp(r, "tool")) d->role = DS_CHAT_ROLE_TOOL;
        else return BAD(pn, "'%s' is '%.40s'; expected system, developer, user, assistant or tool", pn, r);
        char *c;
        if (get_content(m, "content", i, &c, e) || keep(st, c)) return -1;
        d->content = c;
        if (d->role == DS_CHAT_ROLE_DEVELOPER && (!c || !c[0])) {
            snprintf(pn, sizeof pn, "messages[%zu].content", i);
            return BAD(pn, "a developer message needs content");
        }
        if (d->role == DS_CHAT_ROLE_ASSISTANT) {
            if (get_content(m, "reasoning_content", i, &c, e) || keep(st, c)) return -1;
            d->reasoning_content = c;
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            snprintf(pn, sizeof pn, "messages[%zu].tool_calls", i);
            if (tc && !cJSON_IsNull(tc)) {
                if (!cJSON_IsArray(tc)) return BAD(pn, "'%s' must be an array", pn);
                size_t nc = (size_t)cJSON_GetArraySize(tc);
                ds_chat_tool_call *calls = calloc(nc ? nc : 1, sizeof *calls);
                if (!calls) return BAD(pn, "out of memory");
                st->calls[st->n_calls++] = calls;
                size_t k = 0;
                const cJSON *call;
                cJSON_ArrayForEach(call, tc) {
                    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
                    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
                    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
                    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                    if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !cJSON_IsString(args))
                        return BAD(pn, "'%s[%zu]' needs function.name and function.arguments (strings)", pn, k);
                    calls[k].id = cJSON_IsString(id) ? id->valuestring : NULL;
                    calls[k].name = name->valuestring;
                    calls[k].arguments = args->valuestring;
                    k++;
                }
                d->tool_calls = calls;
                d->n_tool_calls = nc;
            }
        }
        if (d->role == DS_CHAT_ROLE_TOOL) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
            snprintf(pn, sizeof pn, "messages[%zu].tool_call_id", i);
            if (!cJSON_IsString(id)) return BAD(pn, "a tool message needs 'tool_call_id' (a string)");
            if (i == 0) return BAD("messages[0].role", "a tool message cannot come first (it answers a tool call)");
            d->tool_call_id = id->valuestring;
        }
        i++;
    }
    *n_out = n;
    return 0;
}

void ds_oai_req_free(ds_oai_req *r) {
    free(r->prompt);
    ds_grammar_free(r->grammar);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

static int parse_sampling(const cJSON *b, ds_oai_req *r, uint64_t default_seed, ds_oai_error *e) {
    ds_sampling *sp = &r->rp.sampling;
    ds_sampling_init(sp);
    sp->temperature = 1.0;
    long long ll;
    double d;
    if (get_num(b, "temperature", 0, 2, &sp->temperature, e) < 0) return -1;
    if (get_num(b, "top_p", 0, 1, &sp->top_p, e) < 0) return -1;
    if (sp->top_p <= 0) return BAD("top_p", "'top_p' must be > 0");
    if (get_int(b, "top_k", -1, 1e9, &ll, e) < 0) return -1;
    else if (cJSON_GetObjectItemCaseSensitive(b, "top_k") && ll > 0) sp->top_k = (int32_t)ll;
    if (get_num(b, "min_p", 0, 1, &sp->min_p, e) < 0) return -1;
    if (get_num(b, "presence_penalty", -2, 2, &sp->presence_penalty, e) < 0) return -1;
    if (get_num(b, "frequency_penalty", -2, 2, &sp->frequency_penalty, e) < 0) return -1;
    if (get_num(b, "repetition_penalty", 1e-6, 1e6, &sp->repetition_penalty, e) < 0) return -1;
    int rs = get_num(b, "seed", -9.3e18, 9.3e18, &d, e);
    if (rs < 0) return -1;
    if (rs) {
        if (d != floor(d)) return BAD("seed", "'seed' must be an integer");
        sp->seed = (uint64_t)(int64_t)d;
    } else {
        sp->seed = default_seed;
    }
    long long n = 1;
    if (get_int(b, "n", 1, DS_SCHED_MAX_GROUP, &n, e) < 0) return -1;
    r->n_choices = (int)n;
    int st = 0;
    if (get_bool(b, "stream", &st, e) < 0) return -1;
    r->stream = st;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(b, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0) return -1;
    }
    /* stop strings */
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(b, "stop");
    if (cJSON_IsString(stop)) {
        if (stop->valuestring[0] && !(r->stop[r->n_stop++] = strdup(stop->valuestring)))
            return BAD("stop", "out of memory");
    } else if (cJSON_IsArray(stop)) {
        if (cJSON_GetArraySize(stop) > DS_OAI_MAX_STOP)
            return BAD("stop", "'stop' holds %d strings; at most %d", cJSON_GetArraySize(stop), DS_OAI_MAX_STOP);
        const cJSON *x;
        cJSON_ArrayForEach(x, stop) {
            if (!cJSON_IsString(x)) return BAD("stop", "'stop' must hold strings, not %s", type_name(x));
            if (x->valuestring[0] && !(r->stop[r->n_stop++] = strdup(x->valuestring)))
                return BAD("stop", "out of memory");
        }
    } else if (stop && !cJSON_IsNull(stop)) {
        return BAD("stop", "'stop' must be a string or an array of strings, not %s", type_name(stop));
    }
    return 0;
}

/* the model named by the request must be ours */
static int check_model(const cJSON *b, const char *model_id, ds_oai_error *e) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "model");
    if (!m || cJSON_IsNull(m)) return 0;
    if (!cJSON_IsString(m)) return BAD("model", "'model' must be a string, not %s", type_name(m));
    if (strcmp(m->valuestring, model_id))
        return ds_oai_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                           "The model '%.100s' does not exist; this server serves '%s'", m->valuestring, model_id);
    return 0;
}

/* response_format: "text", {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ...,
 * "schema": ..., "strict": ...}} -> r->grammar (NULL for text) */
static int parse_response_format(const cJSON *b, ds_oai_req *r, const cJSON **schema, ds_oai_error *e) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(b, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    if (!cJSON_IsObject(rf))
        return BAD("response_format", "'response_format' must be an object such as {\"type\": \"json_object\"}, not %s",
                   type_name(rf));
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(ty))
        return BAD("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    ds_err err = {{0}};
    if (!strcmp(ty->valuestring, "text")) return 0;
    if (!strcmp(ty->valuestring, "json_object")) {
        if (ds_grammar_json_object(&r->grammar, &err)) return BAD("response_format", "%s", err.msg);
        return 0;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return BAD("response_format.type", "'response_format.type' is '%.40s'; expected \"text\", \"json_object\" or "
                   "\"json_schema\"", ty->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return BAD("response_format.json_schema", "'response_format.json_schema' must be an object {\"name\": ..., "
                   "\"schema\": ...}");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (nm && !cJSON_IsString(nm)) return BAD("response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st))
        return BAD("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!sc) return BAD("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
    ds_grammar *g = ds_grammar_new();
    if (!g) return BAD("response_format", "out of memory");
    int root = ds_json_schema_add(g, sc, 0, &err);
    if (root >= 0) ds_grammar_set_root(g, root);
    if (root < 0 || ds_grammar_finish(g, &err)) {
        ds_grammar_free(g);
        return BAD("response_format.json_schema.schema", "'response_format.json_schema.schema': %s", err.msg);
    }
    r->grammar = g;
    *schema = sc;
    return 0;
}

/* tool_choice "required" / a named function: the reply is a DSML tool-call
 * block (json_schema.c, ds_json_schema_tool_call): the block the V4 encoder
 * renders for an assistant's calls, one call (parallel_tool_calls false) or
 * several, each a name among the tools (or the named one) and its parameters
 * following that tool's schema -- right after the prompt in chat mode, after
 * the reasoning's </think> in thinking mode. */
static int tool_grammar(ds_tokenizer *tok, const cJSON *tools, const char *name, ds_oai_req *r, ds_oai_error *e) {
    ds_err err = {{0}};
    if (ds_json_schema_tool_call(tools, name, r->parallel_calls, &r->grammar, &err))
        return BAD("tools", "%s", err.msg);
    r->rp.grammar_after = -1;
    if (r->thinking && (r->rp.grammar_after = ds_tokenizer_token_id(tok, DS_CHAT_THINK_END)) < 0)
        return BAD("tool_choice", "the tokenizer has no %s token to start a tool call after", DS_CHAT_THINK_END);
    return 0;
}

static int parse_chat(ds_tokenizer *tok, const cJSON *b, ds_oai_req *r, ds_oai_error *e) {
    msg_store st = {0};
    size_t n = 0;
    char *tools_json = NULL, *schema_json = NULL;
    const cJSON *schema = NULL;
    int rc = -1;
    if (parse_messages(b, &st, &n, e)) goto done;
    /* thinking: reasoning_effort, thinking (bool or {"type": "enabled"}), chat_template_kwargs.thinking */
    const char *effort = NULL;
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(b, "reasoning_effort");
    if (re && !cJSON_IsNull(re)) {
        if (!cJSON_IsString(re)) {
            BAD("reasoning_effort", "'reasoning_effort' must be a string");
            goto done;
        }
        const char *v = re->valuestring;
        if (!strcmp(v, "none")) r->thinking = 0;
        else if (!strcmp(v, "minimal") || !strcmp(v, "low") || !strcmp(v, "medium")) r->thinking = 1;
        else if (!strcmp(v, "high") || !strcmp(v, "max")) r->thinking = 1, effort = v;
        else {
            BAD("reasoning_effort", "'reasoning_effort' is '%.40s'; expected none, minimal, low, medium, high or max",
                v);
            goto done;
        }
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(b, "thinking");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(b, "chat_template_kwargs");
    if (cJSON_IsObject(kw) && !th) th = cJSON_GetObjectItemCaseSensitive(kw, "thinking");
    if (th && !cJSON_IsNull(th)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(th, "type");
        if (cJSON_IsBool(th)) r->thinking = cJSON_IsTrue(th);
        else if (cJSON_IsObject(th) && cJSON_IsString(ty)) r->thinking = !strcmp(ty->valuestring, "enabled");
        else {
            BAD("thinking", "'thinking' must be a boolean or {\"type\": \"enabled\" | \"disabled\"}");
            goto done;
        }
    }
    /* tools */
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(b, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(b, "tool_choice");
    int use_tools = tools && !cJSON_IsNull(tools);
    if (use_tools && !cJSON_IsArray(tools)) {
        BAD("tools", "'tools' must be an array, not %s", type_name(tools));
        goto done;
    }
    if (use_tools) {
        const cJSON *t;
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsObject(fn) ||
                !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name"))) {
                char pn[32];
                snprintf(pn, sizeof pn, "tools[%d]", k);
                BAD(pn, "'%s' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", pn);
                goto done;
            }
            k++;
        }
    }
    r->parallel_calls = 1;
    if (get_bool(b, "parallel_tool_calls", &r->parallel_calls, e) < 0) goto done;
    const char *force_name = NULL; /* tool_choice names a function */
    int force = 0;                 /* tool_choice "required" or a function */
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) use_tools = 0;
        else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) force = 1;
        else if (cJSON_IsObject(tc) && cJSON_IsObject(fn) && cJSON_IsString(nm)) force = 1, force_name = nm->valuestring;
        else if (!(cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto"))) {
            BAD("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                               "\"function\", \"function\": {\"name\": ...}}");
            goto done;
        }
        if (force && (!use_tools || cJSON_GetArraySize(tools) == 0)) {
            BAD("tool_choice", "'tool_choice' requires a tool call but 'tools' is empty");
            goto done;
        }
        if (force_name) {
            const cJSON *t;
            int found = 0;
            cJSON_ArrayForEach(t, tools) {
                const cJSON *tn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"),
                                                                   "name");
                found |= !strcmp(tn->valuestring, force_name);
            }
            if (!found) {
                BAD("tool_choice", "'tool_choice' names the function '%.100s', which is not in 'tools'", force_name);
                goto done;
            }
        }
    }
    if (use_tools && cJSON_GetArraySize(tools) > 0) {
        if (!(tools_json = cJSON_PrintUnformatted(tools))) {
            BAD("tools", "out of memory");
            goto done;
        }
        r->has_tools = 1;
        /* the tools go with the first system message; one is added when there is none */
        if (st.msgs[0].role == DS_CHAT_ROLE_SYSTEM) {
            st.msgs[0].tools = tools_json;
        } else {
            memmove(st.msgs + 1, st.msgs, n * sizeof *st.msgs);
            memset(st.msgs, 0, sizeof *st.msgs);
            st.msgs[0].role = DS_CHAT_ROLE_SYSTEM;
            st.msgs[0].tools = tools_json;
            n++;
        }
    }
    /* a json_schema's schema goes with the first system message (the V4 encoding's "## Response
     * Format"), so that the model knows what the mask will hold it to */
    if (parse_response_format(b, r, &schema, e)) goto done;
    if (schema && cJSON_IsObject(schema)) {
        if (!(schema_json = cJSON_PrintUnformatted(schema))) {
            BAD("response_format", "out of memory");
            goto done;
        }
        if (st.msgs[0].role != DS_CHAT_ROLE_SYSTEM) {
            memmove(st.msgs + 1, st.msgs, n * sizeof *st.msgs);
            memset(st.msgs, 0, sizeof *st.msgs);
            st.msgs[0].role = DS_CHAT_ROLE_SYSTEM;
            n++;
        }
        st.msgs[0].response_format = schema_json;
    }
    ds_chat_opts co = {0};
    co.thinking = r->thinking;
    co.reasoning_effort = effort;
    ds_err err = {{0}};
    size_t n_ids;
    if (ds_oai_encode_chat(tok, st.msgs, n, &co, &r->prompt, &n_ids, &err)) {
        BAD("messages", "%s", err.msg);
        goto done;
    }
    r->n_prompt = (int)n_ids;
    if (force && r->grammar) {
        BAD("response_format", "'response_format' and a required tool call ('tool_choice') together are not supported");
        goto done;
    }
    if (force && tool_grammar(tok, tools, force_name, r, e)) goto done;
    if (r->grammar && !force) {
        r->rp.grammar_after = -1;
        if (r->thinking && (r->rp.grammar_after = ds_tokenizer_token_id(tok, DS_CHAT_THINK_END)) < 0) {
            BAD("response_format", "the tokenizer has no %s token to start the structured reply after",
                DS_CHAT_THINK_END);
            goto done;
        }
    }
    r->rp.grammar = r->grammar;
    rc = 0;
done:
    if (tools_json) cJSON_free(tools_json);
    if (schema_json) cJSON_free(schema_json);
    store_free(&st);
    return rc;
}

static int parse_completion(ds_tokenizer *tok, const cJSON *b, ds_oai_req *r, ds_oai_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (!p) return BAD("prompt", "'prompt' is required");
    if (!cJSON_IsString(p)) return BAD("prompt", "'prompt' must be a string (or one string in an array), not %s",
                                       type_name(p));
    int echo = 0;
    if (get_bool(b, "echo", &echo, e) < 0) return -1;
    if (echo) return BAD("echo", "'echo' is not supported");
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(b, "suffix");
    if (suffix && !cJSON_IsNull(suffix)) return BAD("suffix", "'suffix' is not supported");
    int32_t *ids = NULL;
    size_t k = 0;
    ds_err err = {{0}};
    if (ds_tokenizer_encode(tok, p->valuestring, strlen(p->valuestring), DS_TOK_PARSE_NONE, &ids, &k, &err))
        return BAD("prompt", "%s", err.msg);
    r->prompt = malloc((k + 1) * sizeof *r->prompt);
    if (!r->prompt) {
        free(ids);
        return BAD("prompt", "out of memory");
    }
    r->prompt[0] = ds_tokenizer_bos_id(tok);
    if (k) memcpy(r->prompt + 1, ids, k * sizeof *ids);
    free(ids);
    r->n_prompt = (int)k + 1;
    return 0;
}

int ds_oai_parse(ds_tokenizer *tok, const char *model_id, int64_t ctx, uint64_t default_seed, int chat,
                 const char *body, size_t n, ds_oai_req *r, ds_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    if (memchr(body, 0, n)) return BAD("", "the request body holds a NUL byte");
    if (ds_utf8_valid_prefix(body, n) != n)
        return BAD("", "the request body is not valid UTF-8 (byte %zu)", ds_utf8_valid_prefix(body, n));
    const char *end = NULL;
    cJSON *b = cJSON_ParseWithLengthOpts(body, n, &end, 0);
    if (!b) return BAD("", "the request body is not valid JSON");
    for (const char *p = end; p && p < body + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(b);
            return BAD("", "bytes after the JSON value of the request body (at byte %zu)", (size_t)(p - body));
        }
    int rc = -1;
    if (!cJSON_IsObject(b)) {
        BAD("", "the request body must be a JSON object, not %s", type_name(b));
        goto done;
    }
    if (check_model(b, model_id, e) || parse_sampling(b, r, default_seed, e)) goto done;
    if (chat ? parse_chat(tok, b, r, e) : parse_completion(tok, b, r, e)) goto done;
    /* max tokens */
    long long mt = -1;
    const char *mt_name = "max_tokens";
    int has_mt = get_int(b, "max_tokens", -1e18, 1e18, &mt, e);
    if (has_mt < 0) goto done;
    if (chat) {
        int h2 = get_int(b, "max_completion_tokens", -1e18, 1e18, &mt, e);
        if (h2 < 0) goto done;
        has_mt |= h2;
    }
    if (chat && cJSON_GetObjectItemCaseSensitive(b, "max_completion_tokens")) mt_name = "max_completion_tokens";
    if (r->n_prompt + 1 > ctx) {
        ds_oai_fail(e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                    "This model's maximum context length is %lld tokens. However, your prompt is %d tokens.",
                    (long long)ctx, r->n_prompt);
        goto done;
    }
    if (!has_mt) mt = chat ? ctx - r->n_prompt : (16 < ctx - r->n_prompt ? 16 : ctx - r->n_prompt);
    if (mt < 1) {
        BAD(mt_name, "'%s' is %lld; it must be at least 1", mt_name, mt);
        goto done;
    }
    if (mt > ctx - r->n_prompt) {
        ds_oai_fail(e, 400, "invalid_request_error", mt_name, "context_length_exceeded",
                    "This model's maximum context length is %lld tokens. However, you requested %lld tokens (%d in "
                    "the prompt, %lld in the completion).",
                    (long long)ctx, r->n_prompt + mt, r->n_prompt, mt);
        goto done;
    }
    r->rp.max_new = (int)mt;
    /* logprobs: chat {logprobs: bool, top_logprobs: 0..20}; completions {logprobs: 0..5} */
    r->rp.top_logprobs = -1;
    if (chat) {
        int lp = 0;
        long long top = 0;
        if (get_bool(b, "logprobs", &lp, e) < 0) goto done;
        int has_top = get_int(b, "top_logprobs", 0, DS_SCHED_MAX_TOP, &top, e);
        if (has_top < 0) goto done;
        if (has_top && !lp) {
            BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto done;
        }
        if (lp) r->rp.top_logprobs = (int)top;
    } else {
        long long lp = -1;
        if (get_int(b, "logprobs", 0, 5, &lp, e) < 0) goto done;
        r->rp.top_logprobs = (int)lp;
    }
    int32_t eos = ds_tokenizer_eos_id(tok);
    if (eos >= 0) r->rp.stop_ids[r->rp.n_stop++] = eos;
    rc = 0;
done:
    cJSON_Delete(b);
    if (rc) ds_oai_req_free(r);
    return rc;
}

/* --------------------------------------------------------------- the text */

void ds_oai_text_init(ds_oai_text *t, int chat, int thinking, const char *const *stop, int n_stop) {
    memset(t, 0, sizeof *t);
    t->chat = chat;
    t->thinking = chat && thinking;
    t->stop = stop;
    t->n_stop = n_stop;
}

void ds_oai_text_free(ds_oai_text *t) {
    free(t->raw);
    t->raw = NULL;
}

/* the largest k <= n with s[0..k) not ending inside a UTF-8 character */
static size_t utf8_floor(const char *s, size_t n) {
    size_t k = n;
    while (k > 0 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) k--;
    if (k == 0) return 0;
    unsigned char c = (unsigned char)s[k - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return n - (k - 1) >= need ? n : k - 1;
}

int ds_oai_text_push(ds_oai_text *t, const char *s, size_t n) {
    if (t->stop_hit || t->ended) return t->stop_hit;
    if (t->n_raw + n + 1 > t->cap) {
        size_t c = (t->n_raw + n + 1) * 2 + 256;
        char *nb = realloc(t->raw, c);
        if (!nb) return -1;
        t->raw = nb;
        t->cap = c;
    }
    memcpy(t->raw + t->n_raw, s, n);
    t->n_raw += n;
    t->raw[t->n_raw] = 0;
    size_t hold = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sl = strlen(t->stop[i]);
        size_t from = t->released > sl ? t->released - sl : 0;
        char *hit = memmem(t->raw + from, t->n_raw - from, t->stop[i], sl);
        if (hit) {
            size_t at = (size_t)(hit - t->raw);
            if (!t->stop_hit || at < t->n_raw) t->n_raw = at;
            t->stop_hit = 1;
        }
        if (sl - 1 > hold) hold = sl - 1;
    }
    if (t->stop_hit) {
        t->raw[t->n_raw] = 0;
        t->released = t->n_raw;
        return 1;
    }
    size_t rel = t->n_raw > hold ? t->n_raw - hold : 0;
    if (rel > t->released) t->released = utf8_floor(t->raw, rel);
    return 0;
}

void ds_oai_text_end(ds_oai_text *t) {
    t->ended = 1;
    t->released = t->n_raw;
}

static const char THINK_END[] = DS_CHAT_THINK_END;
static const char CALLS[] = "\n\n<" DS_CHAT_DSML "tool_calls>";

/* the longest suffix of s[0..n) that is a proper prefix of pat */
static size_t partial_suffix(const char *s, size_t n, const char *pat) {
    size_t pl = strlen(pat);
    for (size_t k = pl - 1 < n ? pl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

/* reasoning = [0, re), content = [cs, ce) of the released text */
static void split(const ds_oai_text *t, size_t *re, size_t *cs, size_t *ce) {
    size_t n = t->released;
    const char *s = t->raw ? t->raw : "";
    *re = 0;
    *cs = 0;
    if (t->thinking) {
        const char *h = memmem(s, n, THINK_END, sizeof THINK_END - 1);
        if (!h) {
            *re = t->ended ? n : n - partial_suffix(s, n, THINK_END);
            *cs = *ce = *re;
            return;
        }
        *re = (size_t)(h - s);
        *cs = *re + sizeof THINK_END - 1;
    }
    const char *c = t->chat ? memmem(s + *cs, n - *cs, CALLS, sizeof CALLS - 1) : NULL;
    if (c) *ce = (size_t)(c - s);
    else *ce = t->ended || !t->chat ? n : n - partial_suffix(s + *cs, n - *cs, CALLS);
}

void ds_oai_text_deltas(ds_oai_text *t, const char **reasoning, size_t *n_reasoning, const char **content,
                        size_t *n_content) {
    size_t re, cs, ce;
    split(t, &re, &cs, &ce);
    const char *s = t->raw ? t->raw : "";
    *reasoning = s + t->sent_reasoning;
    *n_reasoning = re > t->sent_reasoning ? re - t->sent_reasoning : 0;
    t->sent_reasoning += *n_reasoning;
    size_t have = ce > cs ? ce - cs : 0;
    *content = s + cs + t->sent_content;
    *n_content = have > t->sent_content ? have - t->sent_content : 0;
    t->sent_content += *n_content;
}

static cJSON *str_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    cJSON *j = cJSON_CreateString(d);
    free(d);
    return j;
}

int ds_oai_text_message(ds_oai_text *t, int eos, const char *id_base, cJSON *msg) {
    size_t re, cs, ce;
    int was = t->ended;
    t->ended = 1;
    t->released = t->n_raw;
    split(t, &re, &cs, &ce);
    t->ended = was;
    const char *s = t->raw ? t->raw : "";
    int n_calls = 0;
    cJSON *calls = NULL;
    /* tool calls: the official parser on the whole completion */
    if (t->chat && ce < t->n_raw && eos) {
        size_t n = t->n_raw + sizeof DS_CHAT_EOS;
        char *full = malloc(n);
        ds_chat_reply rep;
        ds_err err;
        if (full) {
            memcpy(full, s, t->n_raw);
            memcpy(full + t->n_raw, DS_CHAT_EOS, sizeof DS_CHAT_EOS);
            if (!ds_chat_parse(full, n - 1, t->thinking, &rep, &err)) {
                calls = cJSON_CreateArray();
                size_t keep_n = t->one_call && rep.n_calls > 1 ? 1 : rep.n_calls; /* parallel_tool_calls false */
                for (size_t i = 0; i < keep_n; i++) {
                    cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
                    char id[96];
                    snprintf(id, sizeof id, "call_%s_%zu", id_base, i);
                    cJSON_AddStringToObject(c, "id", id);
                    cJSON_AddStringToObject(c, "type", "function");
                    cJSON_AddStringToObject(f, "name", rep.calls[i].name);
                    cJSON_AddStringToObject(f, "arguments", rep.calls[i].arguments);
                    cJSON_AddItemToObject(c, "function", f);
                    cJSON_AddItemToArray(calls, c);
                }
                n_calls = (int)keep_n;
                ds_chat_reply_free(&rep);
            }
            free(full);
        }
    }
    if (!n_calls) ce = t->n_raw; /* no parsable calls: everything after the reasoning is content */
    if (n_calls && ce == cs) cJSON_AddNullToObject(msg, "content");
    else cJSON_AddItemToObject(msg, "content", str_n(s + cs, ce - cs));
    if (t->thinking) cJSON_AddItemToObject(msg, "reasoning_content", str_n(s, re));
    if (n_calls) cJSON_AddItemToObject(msg, "tool_calls", calls);
    else cJSON_Delete(calls);
    return n_calls;
}
