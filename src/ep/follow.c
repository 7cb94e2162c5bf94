/* follow.c — see follow.h. */
#include "ep/follow.h"

#include <stdio.h>
#include <stdlib.h>

#include "ep/ep.h"
#include "model/forward.h"
#include "model/state.h"

typedef struct {
    ds_seq **seq; /* by the leader's id */
    size_t n;
    ds_batch_item *items;
    unsigned char *want;
    size_t cap_items;
} table;

static void fatal(const char *what, const ds_err *err) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", what, err->msg);
    ds_ep_session_fatal(msg);
}

static ds_seq *seq_of(const table *t, int64_t id) {
    if (id < 0 || (size_t)id >= t->n || !t->seq[id]) {
        char msg[120];
        snprintf(msg, sizeof msg, "rank 0 named sequence %lld, which this rank does not hold", (long long)id);
        ds_ep_session_fatal(msg);
    }
    return t->seq[id];
}

int ds_ep_follow(const ds_model *m, const ds_backend *be) {
    table t = {NULL, 0, NULL, NULL, 0};
    ds_err err = {{0}};
#ifdef DSV4_TEST_HOOKS
    /* tests: DSV4_EP_FAIL_STEP=R:N — step N (from 1) fails on follower R */
    const char *fs = getenv("DSV4_EP_FAIL_STEP");
    long fail_rank = -1, fail_step = -1, steps = 0;
    if (fs && sscanf(fs, "%ld:%ld", &fail_rank, &fail_step) != 2) fail_rank = -1;
#endif
    for (;;) {
        ds_ep_msg msg;
        if (ds_ep_recv(m->ep, &msg, &err)) fatal("receiving from rank 0", &err);
        if (msg.type == DS_EP_MSG_QUIT) break;
        if (msg.type == DS_EP_MSG_SEQ_NEW) {
            if (msg.id < 0) ds_ep_session_fatal("rank 0 sent a negative sequence id");
            if ((size_t)msg.id >= t.n) {
                size_t n = (size_t)msg.id * 2 + 16;
                ds_seq **s = realloc(t.seq, n * sizeof *s);
                if (!s) ds_ep_session_fatal("out of memory for the sequence table");
                for (size_t i = t.n; i < n; i++) s[i] = NULL;
                t.seq = s, t.n = n;
            }
            if (t.seq[msg.id]) ds_ep_session_fatal("rank 0 reused a sequence id");
            if (ds_seq_new_follower(m, msg.max_len, msg.id, msg.home, &t.seq[msg.id], &err))
                fatal("a new sequence", &err);
        } else if (msg.type == DS_EP_MSG_SEQ_FREE) {
            ds_seq_free(seq_of(&t, msg.id));
            t.seq[msg.id] = NULL;
        } else if (msg.type == DS_EP_MSG_STEP) {
            if ((size_t)msg.n_items > t.cap_items) {
                free(t.items), free(t.want);
                t.items = malloc((size_t)msg.n_items * sizeof *t.items);
                t.want = malloc((size_t)msg.n_items);
                t.cap_items = t.items && t.want ? (size_t)msg.n_items : 0;
                if (!t.cap_items) ds_ep_session_fatal("out of memory for a step's items");
            }
            const int32_t *tok = msg.tokens;
            for (int i = 0; i < msg.n_items; i++) {
                const int64_t *f = msg.items + (size_t)DS_EP_ITEM_FIELDS * i;
                ds_seq *s = seq_of(&t, f[0]);
                s->pos = f[1]; /* the leader's resets and rewinds */
                t.items[i] = (ds_batch_item){s, tok, (int)f[2], NULL, 0, NULL, NULL};
                t.want[i] = (unsigned char)f[3];
                tok += f[2];
            }
#ifdef DSV4_TEST_HOOKS
            if (++steps == fail_step && fail_rank == ds_ep_rank(m->ep)) {
                ds_fail(&err, "DSV4_EP_FAIL_STEP=%s: this step fails (a test)", fs);
                fatal("a step", &err);
            }
#endif
            if (ds_forward_follow(m, be, t.items, msg.n_items, t.want, &err)) fatal("a step", &err);
        }
    }
    for (size_t i = 0; i < t.n; i++) ds_seq_free(t.seq[i]);
    free(t.seq);
    free(t.items), free(t.want);
    return 0;
}
