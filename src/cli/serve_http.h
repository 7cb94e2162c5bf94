/* serve_http.h — the HTTP side of `dsv4 serve` (libmicrohttpd, one thread per
 * connection): routes, API-key check, OpenAI JSON and SSE responses, metrics. */
#ifndef DS_SERVE_HTTP_H
#define DS_SERVE_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "model/model.h"
#include "runtime/scheduler.h"

typedef struct serve_cfg {
    const char *host;    /* numeric IPv4 address to bind */
    int port;            /* 0: any free port (printed) */
    const char *api_key; /* NULL: no key */
    const char *model_id;
    int64_t ctx;
    size_t max_body;     /* bytes of a request body at most */
    int timeout_s;       /* idle connection timeout while a request body is read */
    int header_timeout_s; /* idle timeout of a connection whose request header is not complete (also between
                           * the requests of a kept-alive connection) */
    int max_conns;
    int max_conns_per_peer; /* connections of one IP address at most (the rest stay for others) */
    const char *health_host; /* the health listener's numeric IPv4 address */
    int health_port;         /* -1: none; 0: any free port (printed); else /health and /metrics there too */
    int mtp;                 /* speculative decoding on: usage reports the drafts (completion_tokens_details) */
} serve_cfg;

typedef struct serve serve;

/* Starts listening; prints "listening on http://HOST:PORT" on stdout, and
 * "health on http://HOST:PORT" for the health listener. */
int serve_start(const serve_cfg *cfg, const ds_model *m, ds_tokenizer *tok, ds_sched *sched, serve **out);
void serve_stop(serve *s);

#endif
