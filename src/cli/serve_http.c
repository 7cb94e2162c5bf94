/* serve_http.c — see serve_http.h. */
#include "cli/serve_http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/clock.h"
#include "runtime/openai_chat.h"

extern const unsigned char ds_chat_page[];
extern const unsigned long ds_chat_page_len;

struct serve {
    serve_cfg cfg;
    const ds_model *m;
    ds_tokenizer *tok;
    pthread_mutex_t tok_mu; /* ds_tokenizer_encode: one thread at a time */
    ds_sched *sched;
    struct MHD_Daemon *d;
    struct MHD_Daemon *health; /* the health listener, or NULL */
    pthread_mutex_t mu; /* the fields below */
    uint64_t next_id;
    uint64_t http[6]; /* responses by status class: 2xx, 4xx other, 401, 404, 429, 5xx */
    double ttft_sum;
    uint64_t ttft_n;
};

/* per connection */
typedef struct conn {
    serve *s;
    char *body;
    size_t n, cap;
    int too_big;
    int bad_length; /* two Content-Length headers that differ */
} conn;

/* ---------------------------------------------------------------- helpers */

static void count_status(serve *s, unsigned st) {
    int k = st < 300 ? 0 : st == 401 ? 2 : st == 404 ? 3 : st == 429 ? 4 : st >= 500 ? 5 : 1;
    pthread_mutex_lock(&s->mu);
    s->http[k]++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_buf(serve *s, struct MHD_Connection *c, unsigned status, const char *type, const void *buf,
                                size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)buf, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return rc;
}

static enum MHD_Result send_json(serve *s, struct MHD_Connection *c, unsigned status, cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!t) return MHD_NO;
    enum MHD_Result rc = send_buf(s, c, status, "application/json", t, strlen(t));
    cJSON_free(t);
    return rc;
}

static cJSON *error_json(const ds_oai_error *e) {
    cJSON *j = cJSON_CreateObject(), *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    cJSON_AddItemToObject(j, "error", o);
    return j;
}

static enum MHD_Result send_error(serve *s, struct MHD_Connection *c, const ds_oai_error *e) {
    return send_json(s, c, (unsigned)e->status, error_json(e));
}

/* 1 if the peer has closed (or reset) the connection */
static int peer_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {ci->connect_fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ------------------------------------------------------------ generation */

/* one choice of a request: its own sequence, text and log-probabilities */
typedef struct choice {
    int index;
    ds_req *r;
    ds_oai_text text;
    ds_detok_stream *ds;
    int n_seen, eos, ended, final_sent;
    ds_req_info info;
    cJSON *lp; /* logprobs entries not yet sent (chat: content list; completions: parallel arrays) */
    char hex[40]; /* tool call ids: call_<hex>_<i> */
} choice;

typedef struct gen {
    serve *s;
    struct MHD_Connection *c;
    ds_oai_req q;
    int n_ch;
    choice *ch;
    char id[48], hex[20];
    long long created;
    /* streaming */
    char *pend;
    size_t n_pend, cap_pend, off_pend;
    int phase; /* 0 first chunks, 1 tokens, 2 done */
    double t_peer; /* when peer_gone was last asked */
    char *pfx; /* "data: " and a chunk up to the choice index (the envelope), malloc'ed */
    size_t n_pfx;
} gen;

static void gen_free(gen *g) {
    if (!g) return;
    for (int i = 0; g->ch && i < g->n_ch; i++) {
        choice *ch = &g->ch[i];
        ds_req_release(ch->r);
        ds_detok_stream_free(ch->ds);
        ds_oai_text_free(&ch->text);
        cJSON_Delete(ch->lp);
    }
    free(g->ch);
    ds_oai_req_free(&g->q);
    free(g->pend);
    free(g->pfx);
    free(g);
}

static cJSON *token_str(const ds_tokenizer *tok, int32_t id, cJSON **bytes) {
    size_t n = 0;
    const char *b = ds_tokenizer_token_bytes(tok, id, &n);
    char *lossy = NULL;
    size_t ln = 0, cap = 0;
    if (b) ds_utf8_lossy_append(&lossy, &ln, &cap, b, n);
    cJSON *s = cJSON_CreateString(lossy ? lossy : "");
    free(lossy);
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)b[i]));
    }
    return s;
}

static void add_logprob(gen *g, choice *ch, const ds_req_token *t) {
    const ds_tokenizer *tok = g->s->tok;
    if (g->q.chat) {
        if (!ch->lp) ch->lp = cJSON_CreateArray();
        cJSON *e = cJSON_CreateObject(), *by;
        cJSON_AddItemToObject(e, "token", token_str(tok, t->id, &by));
        cJSON_AddNumberToObject(e, "logprob", (double)t->logprob);
        cJSON_AddItemToObject(e, "bytes", by);
        cJSON *tops = cJSON_CreateArray();
        for (int k = 0; k < t->n_top; k++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "token", token_str(tok, t->top_id[k], &by));
            cJSON_AddNumberToObject(x, "logprob", (double)t->top_logprob[k]);
            cJSON_AddItemToObject(x, "bytes", by);
            cJSON_AddItemToArray(tops, x);
        }
        cJSON_AddItemToObject(e, "top_logprobs", tops);
        cJSON_AddItemToArray(ch->lp, e);
    } else {
        if (!ch->lp) {
            ch->lp = cJSON_CreateObject();
            cJSON_AddItemToObject(ch->lp, "tokens", cJSON_CreateArray());
            cJSON_AddItemToObject(ch->lp, "token_logprobs", cJSON_CreateArray());
            cJSON_AddItemToObject(ch->lp, "top_logprobs", cJSON_CreateArray());
        }
        cJSON_AddItemToArray(cJSON_GetObjectItem(ch->lp, "tokens"), token_str(tok, t->id, NULL));
        cJSON_AddItemToArray(cJSON_GetObjectItem(ch->lp, "token_logprobs"), cJSON_CreateNumber((double)t->logprob));
        cJSON *tops = cJSON_CreateObject();
        for (int k = 0; k < t->n_top; k++) {
            cJSON *ts = token_str(tok, t->top_id[k], NULL);
            if (!cJSON_GetObjectItemCaseSensitive(tops, ts->valuestring))
                cJSON_AddNumberToObject(tops, ts->valuestring, (double)t->top_logprob[k]);
            cJSON_Delete(ts);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItem(ch->lp, "top_logprobs"), tops);
    }
}

/* Feeds the choice's new tokens (without waiting) to its text. Returns 1 when
 * it has ended (ch->ended), 0 otherwise, -1 when it was cancelled or failed. */
static int choice_take(gen *g, choice *ch) {
    if (ch->ended) return 1;
    int n = ds_req_wait(ch->r, ch->n_seen, 0, &ch->info);
    ds_req_token t[16];
    while (ch->n_seen < n && !ch->text.stop_hit) {
        int k = n - ch->n_seen < 16 ? n - ch->n_seen : 16;
        ds_req_tokens(ch->r, ch->n_seen, k, t);
        for (int i = 0; i < k && !ch->text.stop_hit; i++, ch->n_seen++) {
            if (g->q.rp.top_logprobs >= 0) add_logprob(g, ch, &t[i]);
            if (ds_stop_check(g->q.rp.stop_ids, g->q.rp.n_stop, t[i].id)) {
                ch->eos = 1;
                continue;
            }
            const char *txt = "";
            size_t tn = 0, bl;
            ds_err err;
            if (t[i].id < ds_tokenizer_vocab_size(g->s->tok) && ds_tokenizer_token_bytes(g->s->tok, t[i].id, &bl) &&
                ds_detok_stream_push(ch->ds, t[i].id, &txt, &tn, &err))
                tn = 0;
            if (ds_oai_text_push(&ch->text, txt, tn) == 1) ds_req_cancel(ch->r); /* a stop string */
        }
    }
    if (ch->text.stop_hit || ch->info.state >= DS_REQ_DONE_STOP) {
        if (!ch->text.stop_hit) {
            const char *txt;
            size_t tn;
            ds_detok_stream_flush(ch->ds, &txt, &tn);
            ds_oai_text_push(&ch->text, txt, tn);
        }
        if (!ch->text.stop_hit && (ch->info.state == DS_REQ_CANCELLED || ch->info.state == DS_REQ_FAILED)) return -1;
        ds_oai_text_end(&ch->text);
        ch->ended = 1;
        if (ch->info.t_first > 0) {
            pthread_mutex_lock(&g->s->mu);
            g->s->ttft_sum += ch->info.t_first - ch->info.t_submit;
            g->s->ttft_n++;
            pthread_mutex_unlock(&g->s->mu);
        }
        return 1;
    }
    return 0;
}

/* Waits up to timeout_s for news on any choice still going. Returns 0, or -1
 * when nothing came and the client has left (every choice is cancelled). */
static int gen_wait(gen *g, double timeout_s) {
    ds_req *rs[DS_SCHED_MAX_GROUP];
    int have[DS_SCHED_MAX_GROUP];
    for (int i = 0; i < g->n_ch; i++) {
        rs[i] = g->ch[i].r;
        have[i] = g->ch[i].ended ? -1 : g->ch[i].n_seen;
    }
    /* the peer is looked at on a timeout, and at least every 0.25 s while
     * tokens come (a client that closes a non-streamed request is noticed) */
    int news = ds_req_wait_any(rs, have, g->n_ch, timeout_s) >= 0;
    double now = ds_now();
    if (news && now - g->t_peer < 0.25) return 0;
    g->t_peer = now;
    if (!peer_gone(g->c)) return 0;
    for (int i = 0; i < g->n_ch; i++) ds_req_cancel(g->ch[i].r);
    return -1;
}

/* the first choice that failed in the engine, or NULL */
static const choice *failed_choice(const gen *g) {
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].info.state == DS_REQ_FAILED) return &g->ch[i];
    return NULL;
}

static const char *finish_reason(const choice *ch, int n_calls) {
    if (n_calls) return "tool_calls";
    if (ch->text.stop_hit || ch->eos) return "stop";
    return "length";
}

static cJSON *usage_json(const gen *g) {
    int n_out = 0;
    for (int i = 0; i < g->n_ch; i++) n_out += g->ch[i].n_seen;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", g->q.n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_out);
    cJSON_AddNumberToObject(u, "total_tokens", g->q.n_prompt + n_out);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "cached_tokens", g->ch[0].info.n_cached);
    cJSON_AddItemToObject(u, "prompt_tokens_details", d);
    if (g->s->cfg.mtp) { /* speculative decoding: the MTP block's drafts the model agreed with, and the others */
        int acc = 0, drafted = 0;
        for (int i = 0; i < g->n_ch; i++) acc += g->ch[i].info.n_accepted, drafted += g->ch[i].info.n_drafted;
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "accepted_prediction_tokens", acc);
        cJSON_AddNumberToObject(c, "rejected_prediction_tokens", drafted - acc);
        cJSON_AddItemToObject(u, "completion_tokens_details", c);
    }
    return u;
}

static cJSON *envelope(const gen *g, const char *object) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", g->id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)g->created);
    cJSON_AddStringToObject(j, "model", g->s->cfg.model_id);
    cJSON_AddStringToObject(j, "system_fingerprint", "dsv4");
    return j;
}

static cJSON *take_logprobs(const gen *g, choice *ch) {
    cJSON *l = NULL;
    if (g->q.rp.top_logprobs < 0) return cJSON_CreateNull();
    if (g->q.chat) {
        l = cJSON_CreateObject();
        cJSON_AddItemToObject(l, "content", ch->lp ? ch->lp : cJSON_CreateArray());
    } else {
        l = ch->lp ? ch->lp : cJSON_CreateNull();
    }
    ch->lp = NULL;
    return l;
}

/* the whole (non-streaming) response */
static cJSON *final_json(gen *g) {
    cJSON *j = envelope(g, g->q.chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < g->n_ch; i++) {
        choice *ch = &g->ch[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        int n_calls = 0;
        if (g->q.chat) {
            cJSON *msg = cJSON_CreateObject();
            cJSON_AddStringToObject(msg, "role", "assistant");
            n_calls = ds_oai_text_message(&ch->text, ch->eos, ch->hex, msg);
            cJSON_AddItemToObject(c, "message", msg);
        } else {
            cJSON_AddStringToObject(c, "text", ch->text.raw ? ch->text.raw : "");
        }
        cJSON_AddItemToObject(c, "logprobs", take_logprobs(g, ch));
        cJSON_AddStringToObject(c, "finish_reason", finish_reason(ch, n_calls));
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(g));
    return j;
}

/* ----------------------------------------------------------------- SSE */

static int pend_add(gen *g, const char *s, size_t n) {
    if (g->n_pend + n > g->cap_pend) {
        size_t c = (g->n_pend + n) * 2 + 1024;
        char *nb = realloc(g->pend, c);
        if (!nb) return -1;
        g->pend = nb;
        g->cap_pend = c;
    }
    memcpy(g->pend + g->n_pend, s, n);
    g->n_pend += n;
    return 0;
}

static void pend_event(gen *g, cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!t) return;
    pend_add(g, "data: ", 6);
    pend_add(g, t, strlen(t));
    pend_add(g, "\n\n", 2);
    cJSON_free(t);
}

/* a chunk for choice `index`: *delta_or_choice is its delta (chat) or the choice (completions) */
static cJSON *chunk(const gen *g, int index, cJSON **delta_or_choice) {
    cJSON *j = envelope(g, g->q.chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(j, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddItemToArray(choices, c);
    if (g->q.chat) {
        *delta_or_choice = cJSON_CreateObject();
        cJSON_AddItemToObject(c, "delta", *delta_or_choice);
    } else {
        *delta_or_choice = c;
    }
    return j;
}

static cJSON *choice_of(cJSON *j) { return cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0); }

static cJSON *str_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return cJSON_CreateString("");
    memcpy(d, s, n);
    d[n] = 0;
    cJSON *j = cJSON_CreateString(d);
    free(d);
    return j;
}

#define PEND_LIT(g, lit) pend_add(g, lit, sizeof lit - 1)

/* s[0..n) as a JSON string, escaped as cJSON prints strings */
static void pend_jstr(gen *g, const char *s, size_t n) {
    char buf[512];
    size_t k = 0;
    buf[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (k > sizeof buf - 8) {
            pend_add(g, buf, k);
            k = 0;
        }
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f"
                      : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (e) {
            buf[k++] = e[0];
            buf[k++] = e[1];
        } else if (c < 32) {
            k += (size_t)snprintf(buf + k, 8, "\\u%04x", c);
        } else {
            buf[k++] = (char)c;
        }
    }
    buf[k++] = '"';
    pend_add(g, buf, k);
}

/* the chunk for what the choice's text released since the last call */
static void pend_deltas(gen *g, choice *ch) {
    const char *r, *c;
    size_t rn, cn;
    ds_oai_text_deltas(&ch->text, &r, &rn, &c, &cn);
    int has_lp = ch->lp != NULL;
    if (!rn && !cn && !has_lp) return;
    if (!has_lp && g->q.rp.top_logprobs < 0 && g->pfx) {
        /* the common chunk, printed directly (the same bytes as through cJSON, without its allocations) */
        char num[48];
        pend_add(g, g->pfx, g->n_pfx);
        pend_add(g, num, (size_t)snprintf(num, sizeof num, "%d", ch->index));
        if (g->q.chat) {
            PEND_LIT(g, ",\"delta\":{");
            if (rn) {
                PEND_LIT(g, "\"reasoning_content\":");
                pend_jstr(g, r, rn);
            }
            if (cn || !rn) {
                if (rn) PEND_LIT(g, ",");
                PEND_LIT(g, "\"content\":");
                pend_jstr(g, c, cn);
            }
            PEND_LIT(g, "}");
        } else {
            PEND_LIT(g, ",\"text\":");
            pend_jstr(g, c, cn);
        }
        PEND_LIT(g, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        return;
    }
    cJSON *d, *j = chunk(g, ch->index, &d);
    if (g->q.chat) {
        if (rn) cJSON_AddItemToObject(d, "reasoning_content", str_n(r, rn));
        if (cn || !rn) cJSON_AddItemToObject(d, "content", str_n(c, cn));
    } else {
        cJSON_AddItemToObject(d, "text", str_n(c, cn));
    }
    cJSON_AddItemToObject(choice_of(j), "logprobs", take_logprobs(g, ch));
    cJSON_AddNullToObject(choice_of(j), "finish_reason");
    pend_event(g, j);
}

/* the last chunk of an ended choice: tool calls and finish_reason */
static void pend_final(gen *g, choice *ch) {
    pend_deltas(g, ch);
    int n_calls = 0;
    cJSON *d, *j = chunk(g, ch->index, &d);
    if (g->q.chat) {
        cJSON *msg = cJSON_CreateObject();
        n_calls = ds_oai_text_message(&ch->text, ch->eos, ch->hex, msg);
        /* a tool-call block that did not parse is content: send what was held back */
        const cJSON *content = cJSON_GetObjectItem(msg, "content");
        if (!n_calls && cJSON_IsString(content) && strlen(content->valuestring) > ch->text.sent_content)
            cJSON_AddStringToObject(d, "content", content->valuestring + ch->text.sent_content);
        cJSON *calls = cJSON_DetachItemFromObject(msg, "tool_calls");
        if (calls) {
            int i = 0;
            cJSON *x;
            cJSON_ArrayForEach(x, calls) cJSON_AddNumberToObject(x, "index", i++);
            cJSON_AddItemToObject(d, "tool_calls", calls);
        }
        cJSON_Delete(msg);
    } else {
        cJSON_AddStringToObject(d, "text", "");
    }
    cJSON_AddNullToObject(choice_of(j), "logprobs");
    cJSON_AddStringToObject(choice_of(j), "finish_reason", finish_reason(ch, n_calls));
    if (g->q.include_usage) cJSON_AddNullToObject(j, "usage");
    pend_event(g, j);
    ch->final_sent = 1;
}

static void pend_done(gen *g) {
    if (g->q.include_usage) {
        cJSON *u = envelope(g, g->q.chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(u, "choices");
        cJSON_AddItemToObject(u, "usage", usage_json(g));
        pend_event(g, u);
    }
    pend_add(g, "data: [DONE]\n\n", 14);
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *g = cls;
    (void)pos;
    for (;;) {
        if (g->off_pend < g->n_pend) {
            size_t k = g->n_pend - g->off_pend < max ? g->n_pend - g->off_pend : max;
            memcpy(buf, g->pend + g->off_pend, k);
            g->off_pend += k;
            if (g->off_pend == g->n_pend) g->off_pend = g->n_pend = 0;
            return (ssize_t)k;
        }
        if (g->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (g->phase == 0) {
            g->phase = 1;
            if (g->q.chat) {
                for (int i = 0; i < g->n_ch; i++) {
                    cJSON *d, *j = chunk(g, i, &d);
                    cJSON_AddStringToObject(d, "role", "assistant");
                    cJSON_AddStringToObject(d, "content", "");
                    cJSON_AddNullToObject(choice_of(j), "logprobs");
                    cJSON_AddNullToObject(choice_of(j), "finish_reason");
                    pend_event(g, j);
                }
                continue;
            }
        }
        int all = 1, gone = 0;
        for (int i = 0; i < g->n_ch; i++) {
            choice *ch = &g->ch[i];
            if (ch->final_sent) continue;
            int r = choice_take(g, ch);
            if (r < 0) {
                gone = 1;
                break;
            }
            if (r == 1) pend_final(g, ch);
            else pend_deltas(g, ch), all = 0;
        }
        if (gone) {
            const choice *f = failed_choice(g);
            for (int i = 0; i < g->n_ch; i++) ds_req_cancel(g->ch[i].r);
            if (f) { /* tell the client, then end */
                ds_oai_error e;
                ds_oai_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", f->info.error);
                pend_event(g, error_json(&e));
                g->phase = 2;
                continue;
            }
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (all) {
            pend_done(g);
            g->phase = 2;
            continue;
        }
        if (g->n_pend == 0 && gen_wait(g, 0.25) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void sse_free(void *cls) { gen_free(cls); }

/* --------------------------------------------------------------- routes */

static enum MHD_Result handle_generate(serve *s, struct MHD_Connection *c, conn *k, int chat) {
    ds_oai_error e;
    gen *g = calloc(1, sizeof *g);
    if (!g) return MHD_NO;
    g->s = s;
    g->c = c;
    g->created = (long long)time(NULL);
    pthread_mutex_lock(&s->mu);
    uint64_t id = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(g->hex, sizeof g->hex, "%016llx", (unsigned long long)id);
    snprintf(g->id, sizeof g->id, "%s%s", chat ? "chatcmpl-" : "cmpl-", g->hex);
    /* default seed: distinct per request */
    uint64_t seed = id * 0x9E3779B97F4A7C15ull ^ (uint64_t)g->created;
    pthread_mutex_lock(&s->tok_mu);
    int prc = ds_oai_parse(s->tok, s->cfg.model_id, s->cfg.ctx, seed, chat, k->body ? k->body : "", k->n, &g->q, &e);
    pthread_mutex_unlock(&s->tok_mu);
    if (prc) {
        free(g);
        return send_error(s, c, &e);
    }
    /* the request is in: from here the connection may wait for the queue and
     * the generation as long as it takes (a client that leaves is noticed by
     * peer_gone); the idle timeout guards only the reading of requests */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)0);
    ds_err err = {{0}};
    g->n_ch = g->q.n_choices;
    g->ch = calloc((size_t)g->n_ch, sizeof *g->ch);
    ds_req_params rp[DS_SCHED_MAX_GROUP];
    ds_req *rs[DS_SCHED_MAX_GROUP];
    if (!g->ch) {
        gen_free(g);
        return MHD_NO;
    }
    for (int i = 0; i < g->n_ch; i++) {
        choice *ch = &g->ch[i];
        ch->index = i;
        if (g->n_ch == 1) snprintf(ch->hex, sizeof ch->hex, "%s", g->hex);
        else snprintf(ch->hex, sizeof ch->hex, "%s_%d", g->hex, i);
        if (ds_detok_stream_new(s->tok, DS_DECODE_SKIP_SPECIAL, &ch->ds, &err)) {
            gen_free(g);
            ds_oai_fail(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
            return send_error(s, c, &e);
        }
        ds_oai_text_init(&ch->text, chat, g->q.thinking, (const char *const *)g->q.stop, g->q.n_stop);
        ch->text.one_call = !g->q.parallel_calls;
        rp[i] = g->q.rp;
        rp[i].sampling.seed = g->q.rp.sampling.seed + (uint64_t)i; /* choice i: seed + i */
    }
    int rc = ds_sched_submit_n(s->sched, g->q.prompt, g->q.n_prompt, rp, g->n_ch, rs, &err);
    if (rc) {
        gen_free(g);
        if (rc == 1)
            ds_oai_fail(&e, 429, "rate_limit_error", NULL, "queue_full",
                        "The server's request queue is full; retry later");
        else
            ds_oai_fail(&e, 400, "invalid_request_error", NULL, NULL, "%s", err.msg);
        return send_error(s, c, &e);
    }
    for (int i = 0; i < g->n_ch; i++) g->ch[i].r = rs[i];
    if (g->q.stream) {
        /* the envelope of every chunk, printed once: "data: {...,"choices":[{"index": */
        cJSON *d, *j = chunk(g, 0, &d);
        char *t = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        static const char idx[] = "\"choices\":[{\"index\":";
        char *at = t ? strstr(t, idx) : NULL;
        if (at && (g->pfx = malloc(6 + (size_t)(at - t) + sizeof idx))) {
            g->n_pfx = 6 + (size_t)(at - t) + sizeof idx - 1;
            memcpy(g->pfx, "data: ", 6);
            memcpy(g->pfx + 6, t, g->n_pfx - 6);
        }
        cJSON_free(t);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, g, sse_free);
        if (!r) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result qr = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        count_status(s, 200);
        return qr;
    }
    int gone = 0;
    for (;;) {
        int all = 1;
        for (int i = 0; i < g->n_ch && !gone; i++) {
            int a = choice_take(g, &g->ch[i]);
            gone = a < 0;
            all &= a == 1;
        }
        if (gone || all) break;
        if (gen_wait(g, 0.25) < 0) gone = 1;
    }
    if (gone) {
        enum MHD_Result res = MHD_NO; /* the client is gone: close */
        const choice *f = failed_choice(g);
        for (int i = 0; i < g->n_ch; i++) ds_req_cancel(g->ch[i].r);
        if (f) {
            ds_oai_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", f->info.error);
            res = send_error(s, c, &e);
        }
        gen_free(g);
        return res;
    }
    enum MHD_Result res = send_json(s, c, 200, final_json(g));
    gen_free(g);
    return res;
}

static enum MHD_Result handle_models(serve *s, struct MHD_Connection *c) {
    cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON_AddStringToObject(m, "id", s->cfg.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "dsv4");
    cJSON_AddNumberToObject(m, "context_length", (double)s->cfg.ctx);
    cJSON_AddItemToArray(a, m);
    return send_json(s, c, 200, j);
}

typedef struct {
    char *b;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->b ? b->b + b->n : NULL, b->b ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->b && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t c = (b->cap + (size_t)k + 1) * 2;
        char *nb = realloc(b->b, c);
        if (!nb) return;
        b->b = nb;
        b->cap = c;
    }
}

static enum MHD_Result handle_metrics(serve *s, struct MHD_Connection *c) {
    ds_sched_stats st;
    ds_sched_get_stats(s->sched, &st, NULL, 0);
    size_t ne = (size_t)st.n_moe_layers * (size_t)st.n_experts;
    uint64_t *ex = calloc(ne ? ne : 1, sizeof *ex);
    if (ex) ds_sched_get_stats(s->sched, &st, ex, (int)ne);
    pthread_mutex_lock(&s->mu);
    uint64_t http[6];
    memcpy(http, s->http, sizeof http);
    double ttft = s->ttft_n ? s->ttft_sum / (double)s->ttft_n : 0;
    uint64_t ttft_n = s->ttft_n;
    pthread_mutex_unlock(&s->mu);
    sbuf b = {0};
#define COUNTER(name, help, v) \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %llu\n", (unsigned long long)(v))
#define GAUGE(name, help, fmt, v) sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", v)
    COUNTER("dsv4_requests_total", "Generation requests accepted.", st.requests);
    COUNTER("dsv4_requests_rejected_total", "Requests refused because the queue was full (429).",
            st.requests_rejected);
    COUNTER("dsv4_requests_cancelled_total", "Requests cancelled (client gone or stop string).",
            st.requests_cancelled);
    COUNTER("dsv4_requests_failed_total", "Requests that failed in the engine.", st.requests_failed);
    static const char *const cls[6] = {"2xx", "4xx", "401", "404", "429", "5xx"};
    sb_printf(&b, "# HELP dsv4_http_responses_total HTTP responses by status.\n# TYPE dsv4_http_responses_total counter\n");
    for (int i = 0; i < 6; i++)
        sb_printf(&b, "dsv4_http_responses_total{status=\"%s\"} %llu\n", cls[i], (unsigned long long)http[i]);
    GAUGE("dsv4_queue_depth", "Requests waiting to join the batch.", "%d", st.queued);
    GAUGE("dsv4_running_requests", "Requests in the running batch.", "%d", st.running);
    GAUGE("dsv4_live_sequences", "Sequence states in memory (running + cached for prefix reuse).", "%d",
          st.live_seqs);
    GAUGE("dsv4_sequence_bytes", "Bytes of sequence state in memory.", "%llu",
          (unsigned long long)((uint64_t)st.live_seqs * ds_sched_seq_bytes(s->sched)));
    COUNTER("dsv4_prompt_tokens_total", "Prompt tokens prefilled.", st.prompt_tokens);
    COUNTER("dsv4_prompt_cached_tokens_total", "Prompt tokens taken from cached sequences (not prefilled).",
            st.cached_tokens);
    COUNTER("dsv4_generated_tokens_total", "Tokens generated.", st.gen_tokens);
    GAUGE("dsv4_generation_tokens_per_second", "Generated tokens per second over the last 10 s.", "%.3f",
          st.tokens_per_s);
    sb_printf(&b, "# HELP dsv4_prefill_seconds_total Step time spent on prompt tokens (a mixed step is split by "
                  "token count).\n# TYPE dsv4_prefill_seconds_total counter\ndsv4_prefill_seconds_total %.6f\n",
              st.prefill_s);
    sb_printf(&b, "# HELP dsv4_decode_seconds_total Step time spent on decode tokens.\n# TYPE "
                  "dsv4_decode_seconds_total counter\ndsv4_decode_seconds_total %.6f\n",
              st.decode_s);
    COUNTER("dsv4_steps_total", "Forward steps.", st.steps);
    COUNTER("dsv4_mtp_verify_total", "Speculative decoding: a request's steps with drafts (verify items).",
            st.mtp_verify);
    COUNTER("dsv4_mtp_draft_tokens_total", "Speculative decoding: tokens the MTP block drafted.", st.mtp_drafted);
    COUNTER("dsv4_mtp_accepted_tokens_total",
            "Speculative decoding: drafted tokens the model's own draws agreed with (kept).", st.mtp_accepted);
    sb_printf(&b, "# HELP dsv4_mtp_seconds_total Speculative decoding: the scheduler thread's time in the MTP block "
                  "(drafting, following the sequences) and in rewinds.\n# TYPE dsv4_mtp_seconds_total counter\n"
                  "dsv4_mtp_seconds_total %.6f\n",
              st.mtp_s);
    COUNTER("dsv4_grammar_masked_tokens_total",
            "Draws of structured requests (response_format, required tool calls) under a grammar's token mask.",
            st.mask_tokens);
    sb_printf(&b, "# HELP dsv4_grammar_mask_seconds_total Time computing those masks (trie walk and masked copy of "
                  "the logits).\n# TYPE dsv4_grammar_mask_seconds_total counter\ndsv4_grammar_mask_seconds_total "
                  "%.6f\n",
              st.mask_s);
    sb_printf(&b, "# HELP dsv4_step_phase_seconds_total The scheduler thread's time by phase of a step: admit "
                  "(dropping and admitting requests), forward, sample, publish (the tokens to the waiting "
                  "connections), retire (statistics, finished requests).\n"
                  "# TYPE dsv4_step_phase_seconds_total counter\n");
    const char *const ph[5] = {"admit", "forward", "sample", "publish", "retire"};
    const double phv[5] = {st.admit_s, st.forward_s, st.sample_s, st.publish_s, st.retire_s};
    for (int i = 0; i < 5; i++) sb_printf(&b, "dsv4_step_phase_seconds_total{phase=\"%s\"} %.6f\n", ph[i], phv[i]);
    GAUGE("dsv4_batch_size_mean", "Mean requests per step.", "%.3f", st.batch_mean);
    sb_printf(&b, "# HELP dsv4_batch_size Requests per step.\n# TYPE dsv4_batch_size histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < 8; i++) {
        cum += st.batch_hist[i];
        if (i < 7) sb_printf(&b, "dsv4_batch_size_bucket{le=\"%d\"} %llu\n", (2 << i) - 1, (unsigned long long)cum);
    }
    sb_printf(&b, "dsv4_batch_size_bucket{le=\"+Inf\"} %llu\ndsv4_batch_size_count %llu\n", (unsigned long long)cum,
              (unsigned long long)st.steps);
    GAUGE("dsv4_time_to_first_token_seconds_mean", "Mean time from submit to the first token.", "%.6f", ttft);
    COUNTER("dsv4_time_to_first_token_count", "Requests in that mean.", ttft_n);
    sb_printf(&b, "# HELP dsv4_expert_tokens_total Tokens routed to each expert.\n# TYPE dsv4_expert_tokens_total "
                  "counter\n");
    for (int l = 0; ex && l < st.n_moe_layers; l++)
        for (int x = 0; x < st.n_experts; x++)
            sb_printf(&b, "dsv4_expert_tokens_total{layer=\"%d\",expert=\"%d\"} %llu\n", l, x,
                      (unsigned long long)ex[(size_t)l * st.n_experts + x]);
    free(ex);
    double *ld = ne ? calloc(ne, sizeof *ld) : NULL;
    if (ld && !ds_sched_get_load(s->sched, ld, (int)ne)) {
        sb_printf(&b,
                  "# HELP dsv4_expert_load Tokens routed to each expert, exponentially weighted (half-life %.0f "
                  "routed tokens of its layer).\n# TYPE dsv4_expert_load gauge\n",
                  DS_SCHED_LOAD_HALFLIFE);
        for (int l = 0; l < st.n_moe_layers; l++)
            for (int x = 0; x < st.n_experts; x++)
                sb_printf(&b, "dsv4_expert_load{layer=\"%d\",expert=\"%d\"} %.3f\n", l, x,
                          ld[(size_t)l * st.n_experts + x]);
        /* the balance per layer: spread and peak of that load across the experts */
        double *cv = st.n_moe_layers > 0 ? calloc((size_t)st.n_moe_layers * 2, sizeof *cv) : NULL;
        for (int l = 0; cv && l < st.n_moe_layers; l++) {
            const double *w = ld + (size_t)l * st.n_experts;
            double sum = 0, sq = 0, mx = 0;
            for (int x = 0; x < st.n_experts; x++) sum += w[x], mx = w[x] > mx ? w[x] : mx;
            double mean = sum / st.n_experts;
            for (int x = 0; x < st.n_experts; x++) sq += (w[x] - mean) * (w[x] - mean);
            cv[2 * l] = mean > 0 ? sqrt(sq / st.n_experts) / mean : 0;
            cv[2 * l + 1] = mean > 0 ? mx / mean : 0;
        }
        sb_printf(&b, "# HELP dsv4_expert_load_cv The balance of dsv4_expert_load per layer: its standard deviation "
                      "across the layer's experts over its mean (0: even).\n# TYPE dsv4_expert_load_cv gauge\n");
        for (int l = 0; cv && l < st.n_moe_layers; l++)
            sb_printf(&b, "dsv4_expert_load_cv{layer=\"%d\"} %.6f\n", l, cv[2 * l]);
        sb_printf(&b, "# HELP dsv4_expert_load_max_over_mean The busiest expert's dsv4_expert_load over the layer's "
                      "mean.\n# TYPE dsv4_expert_load_max_over_mean gauge\n");
        for (int l = 0; cv && l < st.n_moe_layers; l++)
            sb_printf(&b, "dsv4_expert_load_max_over_mean{layer=\"%d\"} %.6f\n", l, cv[2 * l + 1]);
        free(cv);
    }
    free(ld);
    /* expert tiers (--gpu-mem): where the picks were served, per layer and in all */
    int L = st.n_moe_layers;
    ds_store_counts *tc = calloc((size_t)L + 1, sizeof *tc);
    if (tc && !ds_sched_get_tiers(s->sched, tc, L + 1)) {
        const ds_store_counts *all = &tc[L];
        sb_printf(&b, "# HELP dsv4_expert_tier_picks_total Routed expert picks (token, expert) by where the expert "
                      "ran: in a slot it held, copied into a slot for the step, or on the CPU.\n"
                      "# TYPE dsv4_expert_tier_picks_total counter\n");
        const char *const way[3] = {"slot", "copied", "cpu"};
        for (int l = 0; l <= L; l++) {
            const long long v[3] = {tc[l].hit_pairs, tc[l].copied_pairs, tc[l].cpu_pairs};
            for (int w = 0; w < 3; w++) {
                if (l < L)
                    sb_printf(&b, "dsv4_expert_tier_picks_total{layer=\"%d\",way=\"%s\"} %lld\n", l, way[w], v[w]);
                else
                    sb_printf(&b, "dsv4_expert_tier_picks_total{way=\"%s\"} %lld\n", way[w], v[w]);
            }
        }
        COUNTER("dsv4_expert_tier_copies_total", "Experts written into slots (staged for a step or re-placed).",
                all->copies);
        COUNTER("dsv4_expert_tier_replaced_total",
                "Of them, experts moved into resident slots by the learned load (re-placement).", all->replaced);
        sb_printf(&b, "# HELP dsv4_expert_tier_copy_bytes_total Bytes of those copies.\n# TYPE "
                      "dsv4_expert_tier_copy_bytes_total counter\ndsv4_expert_tier_copy_bytes_total %.0f\n",
                  all->copy_bytes);
        sb_printf(&b, "# HELP dsv4_expert_tier_seconds_total Wall time of the copies and of the CPU's experts (their "
                      "rows' transfers included).\n# TYPE dsv4_expert_tier_seconds_total counter\n"
                      "dsv4_expert_tier_seconds_total{way=\"copy\"} %.6f\ndsv4_expert_tier_seconds_total{way=\"cpu\"} "
                      "%.6f\n",
                  all->copy_seconds, all->cpu_seconds);
    }
    free(tc);
    enum MHD_Result rc = send_buf(s, c, 200, "text/plain; version=0.0.4", b.b ? b.b : "", b.n);
    free(b.b);
    return rc;
#undef COUNTER
#undef GAUGE
}

static int authorized(serve *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->cfg.api_key);
}

/* counts the Content-Length headers that differ from the first (cls) */
typedef struct {
    const char *first;
    int differ;
} len_count;

static enum MHD_Result len_iter(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    len_count *lc = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) && value && strcmp(value, lc->first)) lc->differ = 1;
    return MHD_YES;
}

static int count_lengths(struct MHD_Connection *c, const char *first) {
    len_count lc = {first, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, len_iter, &lc);
    return lc.differ;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_n, void **con_cls) {
    serve *s = cls;
    (void)version;
    conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        k->s = s;
        *con_cls = k;
        /* the header is complete: the body may take the (longer) request timeout */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)s->cfg.timeout_s);
        /* this connection's thread (one per connection) wakes once per generated
         * token: SCHED_BATCH keeps those wake-ups from preempting the scheduler
         * thread in the middle of a step (they run at the next slice instead).
         * A server started under a real-time policy (chrt) keeps it: there
         * SCHED_BATCH would demote these threads below every other process. */
        int pol;
        struct sched_param sp = {0};
        if (!pthread_getschedparam(pthread_self(), &pol, &sp) && pol == SCHED_OTHER) {
            sp.sched_priority = 0;
            pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
        }
        /* two Content-Length headers that differ: refused once the body is read */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        k->bad_length = cl && count_lengths(c, cl);
        return MHD_YES;
    }
    if (*upload_n) { /* body bytes: keep up to max_body, then discard */
        if (!k->too_big && k->n + *upload_n <= s->cfg.max_body) {
            if (k->n + *upload_n + 1 > k->cap) {
                size_t nc = (k->n + *upload_n + 1) * 2;
                if (nc > s->cfg.max_body + 1) nc = s->cfg.max_body + 1;
                char *nb = realloc(k->body, nc);
                if (!nb) return MHD_NO;
                k->body = nb;
                k->cap = nc;
            }
            memcpy(k->body + k->n, upload, *upload_n);
            k->n += *upload_n;
        } else {
            k->too_big = 1;
        }
        *upload_n = 0;
        return MHD_YES;
    }
    ds_oai_error e;
    /* HEAD is answered as GET (libmicrohttpd sends the headers only) */
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (k->bad_length) {
        ds_oai_fail(&e, 400, "invalid_request_error", NULL, NULL, "two Content-Length headers that differ");
        return send_error(s, c, &e);
    }
    if (!strncmp(url, "/v1/", 4) && !authorized(s, c)) {
        ds_oai_fail(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "Incorrect API key provided.");
        return send_error(s, c, &e);
    }
    if (k->too_big) {
        ds_oai_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                    "The request body is over %zu bytes (--max-body)", s->cfg.max_body);
        return send_error(s, c, &e);
    }
    if (get && (!strcmp(url, "/") || !strcmp(url, "/index.html")))
        return send_buf(s, c, 200, "text/html; charset=utf-8", ds_chat_page, ds_chat_page_len);
    if (get && !strcmp(url, "/health")) return send_buf(s, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    if (get && !strcmp(url, "/metrics")) return handle_metrics(s, c);
    if (get && !strcmp(url, "/v1/models")) return handle_models(s, c);
    if (post && !strcmp(url, "/v1/chat/completions")) return handle_generate(s, c, k, 1);
    if (post && !strcmp(url, "/v1/completions")) return handle_generate(s, c, k, 0);
    int known = !strcmp(url, "/") || !strcmp(url, "/health") || !strcmp(url, "/metrics") ||
                !strcmp(url, "/v1/models") || !strcmp(url, "/v1/chat/completions") ||
                !strcmp(url, "/v1/completions");
    if (known) {
        ds_oai_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s is not allowed on %s", method,
                    url);
        return send_error(s, c, &e);
    }
    ds_oai_fail(&e, 404, "invalid_request_error", NULL, "not_found", "No route %s %.200s", method, url);
    return send_error(s, c, &e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    serve *s = cls;
    conn *k = *con_cls;
    /* a kept-alive connection waits for its next request header: the header timeout again
     * (a generation had set none) */
    if (t == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)s->cfg.header_timeout_s);
    if (!k) return;
    free(k->body);
    free(k);
    *con_cls = NULL;
}

/* the health listener: GET / HEAD /health and /metrics, nothing else */
static enum MHD_Result on_health(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_n, void **con_cls) {
    serve *s = cls;
    (void)version;
    (void)upload;
    if (!*con_cls) { /* the header: wait for the end of any body */
        *con_cls = s;
        return MHD_YES;
    }
    if (*upload_n) {
        *upload_n = 0;
        return MHD_YES;
    }
    ds_oai_error e;
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (get && !strcmp(url, "/health")) return send_buf(s, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    if (get && !strcmp(url, "/metrics")) return handle_metrics(s, c);
    if (!strcmp(url, "/health") || !strcmp(url, "/metrics")) {
        ds_oai_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s is not allowed on %s", method,
                    url);
        return send_error(s, c, &e);
    }
    ds_oai_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                "No route %s %.200s on the health listener (/health and /metrics only)", method, url);
    return send_error(s, c, &e);
}

static int ipv4(const char *host, int port, struct sockaddr_in *a) {
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

int serve_start(const serve_cfg *cfg, const ds_model *m, ds_tokenizer *tok, ds_sched *sched, serve **out) {
    *out = NULL;
    serve *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->cfg = *cfg;
    s->m = m;
    s->tok = tok;
    s->sched = sched;
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    struct sockaddr_in a, ha;
    if (ipv4(cfg->host, cfg->port, &a)) {
        fprintf(stderr, "dsv4 serve: --host '%s' is not an IPv4 address\n", cfg->host);
        serve_stop(s);
        return -1;
    }
    if (cfg->health_port >= 0 && ipv4(cfg->health_host, cfg->health_port, &ha)) {
        fprintf(stderr, "dsv4 serve: --health-host '%s' is not an IPv4 address\n", cfg->health_host);
        serve_stop(s);
        return -1;
    }
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                            (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &a,
                            /* a new connection until its request header is complete (on_request sets the
                             * body's timeout, a generation none, on_completed this one again) */
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->header_timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)cfg->max_conns_per_peer, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "dsv4 serve: cannot listen on %s:%d (in use or not permitted)\n", cfg->host, cfg->port);
        serve_stop(s);
        return -1;
    }
    /* the health listener: its own socket, connection slots and one polling thread, so that
     * /health answers while the main listener's slots are all taken */
    if (cfg->health_port >= 0) {
        s->health = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, (uint16_t)cfg->health_port,
                                     NULL, NULL, on_health, s, MHD_OPTION_SOCK_ADDR, &ha,
                                     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->header_timeout_s,
                                     MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_END);
        if (!s->health) {
            fprintf(stderr, "dsv4 serve: cannot listen on %s:%d for /health (in use or not permitted)\n",
                    cfg->health_host, cfg->health_port);
            serve_stop(s);
            return -1;
        }
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    printf("listening on http://%s:%u\n", cfg->host, di ? di->port : (unsigned)cfg->port);
    if (s->health) {
        di = MHD_get_daemon_info(s->health, MHD_DAEMON_INFO_BIND_PORT);
        printf("health on http://%s:%u\n", cfg->health_host, di ? di->port : (unsigned)cfg->health_port);
    }
    fflush(stdout);
    *out = s;
    return 0;
}

void serve_stop(serve *s) {
    if (!s) return;
    if (s->health) MHD_stop_daemon(s->health);
    if (s->d) MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->tok_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
