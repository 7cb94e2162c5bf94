/* ep.c — the MPI session and one model's expert parallelism (ep/ep.h).
 * Without MPI in the build (DSV4_HAVE_MPI undefined) the session is one rank
 * and nothing here sends anything. */
#include "ep/ep.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DSV4_HAVE_MPI
#include <mpi.h>
#endif

/* The process's MPI session: MPI_COMM_WORLD is per process, so is this. */
static struct {
    int started, rank, size, local_rank, local_size, ready_done, ready_ok;
    int err_fd;     /* the real standard error (followers, until the handshake) */
    FILE *captured; /* followers: what the process printed on stderr before it */
    ds_ep *ep;      /* the model's EP, for the leader's quit at the end */
    ds_ep_opts opts;
} S = {0, 0, 1, 0, 1, 0, 0, 2, NULL, NULL, {NULL, 0, NULL, DS_EP_ATT_DP}};

ds_ep_opts *ds_ep_session_opts(void) { return &S.opts; }

int ds_ep_session_rank(void) { return S.rank; }
int ds_ep_session_size(void) { return S.size; }
int ds_ep_session_local_rank(void) { return S.local_rank; }
int ds_ep_session_local_size(void) { return S.local_size; }

int ds_ep_session_all(int ok) {
#ifdef DSV4_HAVE_MPI
    if (S.started) {
        int all = 0;
        if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
            ds_ep_session_fatal("MPI_Allreduce failed (ds_ep_session_all)");
        return all;
    }
#endif
    return ok;
}

void ds_ep_session_bcast(void *buf, size_t n) {
#ifdef DSV4_HAVE_MPI
    if (S.started && n <= 0x7fffffff && MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        ds_ep_session_fatal("MPI_Bcast failed (ds_ep_session_bcast)");
#else
    (void)buf, (void)n;
#endif
}

int ds_ep_built(void) {
#ifdef DSV4_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

#ifndef DSV4_HAVE_MPI
/* The variable a launcher names its world size in (Open MPI, MPICH / PMI,
 * MVAPICH) and its value, or NULL when none is set. */
static const char *launcher_size(const char **value) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        *value = getenv(vars[i]);
        if (*value && **value) return vars[i];
    }
    return NULL;
}
#endif

int ds_ep_session_start(int *argc, char ***argv) {
    (void)argc, (void)argv;
#ifdef DSV4_HAVE_MPI
    /* under mpirun only: a plain run never starts MPI */
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") && !getenv("PMI_RANK")) return 0;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dsv4: MPI_Init failed\n");
        return -1;
    }
    S.started = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &S.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &S.size);
    /* errors come back as return codes (turned into messages naming the rank) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* the rank among those of this host: which GPU it drives */
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, S.rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &S.local_rank);
        MPI_Comm_size(node, &S.local_size);
        MPI_Comm_free(&node);
    } else {
        S.local_rank = S.rank;
    }
    if (S.rank > 0) {
        fflush(stdout);
        fflush(stderr);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, 1);
            close(null);
        }
        S.captured = tmpfile();
        S.err_fd = dup(2);
        if (S.captured && S.err_fd >= 0)
            dup2(fileno(S.captured), 2);
        else
            S.err_fd = 2;
    }
#else
    /* started by mpirun as one of several ranks, without MPI to join them:
     * each would run the whole model alone and write the same outputs */
    const char *value = NULL, *var = launcher_size(&value);
    long n = var ? strtol(value, NULL, 10) : 0;
    if (n > 1) {
        fprintf(stderr,
                "dsv4: started as one of %ld MPI ranks (%s=%s), but this build has no MPI: each rank would run the "
                "whole model alone. Rebuild with -DDSV4_MPI=ON (Debian: libopenmpi-dev) for expert parallelism, or "
                "run one process\n",
                n, var, value);
        return -1;
    }
#endif
    return 0;
}

#ifdef DSV4_HAVE_MPI /* the followers' standard error (set aside only under MPI) */
static void restore_stderr(void) {
    if (S.err_fd != 2 && S.err_fd >= 0) {
        fflush(stderr);
        dup2(S.err_fd, 2);
        close(S.err_fd);
        S.err_fd = 2;
    }
}

/* The tail of what a follower printed before the handshake. */
static void captured_text(char *out, size_t cap, const char *fallback) {
    snprintf(out, cap, "%s", fallback && *fallback ? fallback : "failed (no message)");
    if (!S.captured) return;
    fflush(stderr);
    long n = ftell(S.captured);
    if (n <= 0) return;
    long from = n > (long)cap - 1 ? n - (long)cap + 1 : 0;
    if (fseek(S.captured, from, SEEK_SET)) return;
    size_t got = fread(out, 1, cap - 1, S.captured);
    out[got] = 0;
    while (got && (out[got - 1] == '\n' || out[got - 1] == '\r')) out[--got] = 0;
}
#endif

void ds_ep_session_fatal(const char *msg) {
    char line[1200];
    int n = snprintf(line, sizeof line, "dsv4: rank %d: %s\n", S.rank, msg);
    if (n > 0 && write(S.err_fd >= 0 ? S.err_fd : 2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1))
        (void)0;
#ifdef DSV4_HAVE_MPI
    if (S.started) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    _exit(1);
}

int ds_ep_session_ready(int ok, const char *msg, ds_err *err) {
    if (S.ready_done) return S.ready_ok ? 0 : ds_fail(err, "the ranks did not all load the model");
    S.ready_done = 1;
    S.ready_ok = ok;
    if (S.size < 2) return ok ? 0 : ds_fail(err, "%s", msg ? msg : "failed");
#ifdef DSV4_HAVE_MPI
    enum { M = 1000 };
    char mine[M + 8];
    mine[0] = (char)(ok ? 1 : 0);
    if (ok)
        mine[1] = 0;
    else if (S.rank > 0 && !(msg && *msg))
        captured_text(mine + 1, M, msg);
    else
        snprintf(mine + 1, M, "%s", msg ? msg : "failed");
    char *all = S.rank == 0 ? malloc((size_t)S.size * (M + 1)) : NULL;
    int status[2] = {ok, -1}; /* all ok, first failing rank */
    if (MPI_Gather(mine, M + 1, MPI_CHAR, all, M + 1, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        ds_ep_session_fatal("the load handshake (MPI_Gather) failed");
    if (S.rank == 0) {
        status[0] = 1;
        for (int r = 0; all && r < S.size; r++)
            if (!all[(size_t)r * (M + 1)]) {
                if (status[0]) status[1] = r;
                status[0] = 0;
            }
        if (!all) status[0] = 0, status[1] = 0;
    }
    if (MPI_Bcast(status, 2, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        ds_ep_session_fatal("the load handshake (MPI_Bcast) failed");
    restore_stderr();
    S.ready_ok = status[0];
    int rc = 0;
    if (!status[0]) {
        int r = status[1];
        const char *why = S.rank == 0 && all ? all + (size_t)r * (M + 1) + 1 : "";
        rc = ds_fail(err, "rank %d of %d failed to load: %s", r, S.size, why);
    }
    free(all);
    return rc;
#else
    return ok ? 0 : ds_fail(err, "%s", msg ? msg : "failed");
#endif
}

int ds_ep_session_end(int rc) {
    if (S.size < 2) return rc;
#ifdef DSV4_HAVE_MPI
    if (!S.ready_done) {
        ds_err err;
        if (ds_ep_session_ready(rc == 0, "", &err) && S.rank == 0 && rc == 0) {
            fprintf(stderr, "dsv4: %s\n", err.msg);
            rc = 1;
        }
    } else if (S.rank == 0 && S.ep && S.ready_ok) {
        ds_ep_send_quit(S.ep);
        ds_ep_report(S.ep, stderr);
    }
    restore_stderr();
    if (S.captured) fclose(S.captured);
    S.captured = NULL;
    if (S.started) MPI_Finalize();
    S.started = 0;
#endif
    return rc;
}

/* ---- one model --------------------------------------------------------- */

struct ds_ep {
    int rank, size, layers, experts, k, next_id, quit, attention;
    int *live;             /* [size] the leader's live sequences per home rank */
    uint64_t *att_rows;    /* [size] the leader's count of the rows each rank's attention ran */
    const char *transport; /* "NCCL" (the backend's ep_exchange) or NULL: MPI through host memory */
    ds_placement pl;
    int *owner;          /* [pairs] */
    unsigned char *sel;  /* [pairs] */
    unsigned char *none; /* [cap_none] zeros */
    size_t cap_none;
    int *counts, *displs;   /* [size] */
    int *rcounts, *rdispls; /* [size] the receive side of an all-to-all */
    size_t cap_pairs, cap_f;
    float *send, *recv;
    uint64_t *served; /* [layers][size] pairs served */
    int64_t *items;   /* a follower's received step */
    int32_t *tokens;
    size_t cap_items, cap_tok;
};

int ds_ep_rank(const ds_ep *ep) { return ep->rank; }
int ds_ep_size(const ds_ep *ep) { return ep->size; }
const ds_placement *ds_ep_placement(const ds_ep *ep) { return &ep->pl; }
const uint64_t *ds_ep_served(const ds_ep *ep) { return ep->served; }
const int *ds_ep_owner(const ds_ep *ep) { return ep->owner; }
void ds_ep_set_transport(ds_ep *ep, const char *name) { ep->transport = name; }
const char *ds_ep_transport(const ds_ep *ep) { return ep->transport; }

int ds_ep_new(ds_ep **out, int layers, int experts, int k, const ds_ep_opts *o, ds_err *err) {
    *out = NULL;
    ds_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return ds_fail(err, "out of memory");
    ep->rank = S.rank, ep->size = S.size, ep->layers = layers, ep->experts = experts, ep->k = k;
    ep->counts = calloc((size_t)S.size, sizeof *ep->counts);
    ep->displs = calloc((size_t)S.size, sizeof *ep->displs);
    ep->served = calloc((size_t)S.size * (size_t)(layers > 0 ? layers : 1), sizeof *ep->served);
    ep->live = calloc((size_t)S.size, sizeof *ep->live);
    ep->rcounts = calloc((size_t)S.size, sizeof *ep->rcounts);
    ep->rdispls = calloc((size_t)S.size, sizeof *ep->rdispls);
    ep->att_rows = calloc((size_t)S.size, sizeof *ep->att_rows);
    ep->attention = o->attention;
    if (!ep->counts || !ep->displs || !ep->served || !ep->live || !ep->att_rows || !ep->rcounts || !ep->rdispls) {
        ds_ep_free(ep);
        return ds_fail(err, "out of memory");
    }
    if (ds_placement_build(&ep->pl, S.size, layers, experts, o, err)) {
        ds_ep_free(ep);
        return -1;
    }
    S.ep = ep;
    *out = ep;
    return 0;
}

void ds_ep_free(ds_ep *ep) {
    if (!ep) return;
    if (S.ep == ep) S.ep = NULL;
    ds_placement_free(&ep->pl);
    free(ep->owner), free(ep->sel), free(ep->counts), free(ep->displs), free(ep->send), free(ep->recv);
    free(ep->served), free(ep->items), free(ep->tokens), free(ep->live), free(ep->none);
    free(ep->att_rows), free(ep->rcounts), free(ep->rdispls);
    free(ep);
}

int ds_ep_next_seq_id(ds_ep *ep) { return ep->next_id++; }

int ds_ep_dp(const ds_ep *ep) { return ep->size > 1 && ep->attention == DS_EP_ATT_DP; }

void ds_ep_count_attention(ds_ep *ep, int home, int rows) {
    for (int r = 0; r < ep->size; r++)
        if (home < 0 || home == r) ep->att_rows[r] += (uint64_t)rows;
}

int ds_ep_seq_home(ds_ep *ep) {
    if (!ds_ep_dp(ep)) return -1;
    int h = 0;
    for (int r = 1; r < ep->size; r++)
        if (ep->live[r] < ep->live[h]) h = r;
    ep->live[h]++;
    return h;
}

#ifdef DSV4_HAVE_MPI
static void bcast(void *p, int n, MPI_Datatype t, const char *what) {
    if (MPI_Bcast(p, n, t, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        char m[200];
        snprintf(m, sizeof m, "MPI_Bcast of %s failed", what);
        ds_ep_session_fatal(m);
    }
}

static void send_hdr(ds_ep *ep, int64_t type, int64_t a, int64_t b, int64_t c) {
    int64_t h[4] = {type, a, b, c};
    if (ep->rank != 0 || ep->size < 2 || ep->quit) return;
    bcast(h, 4, MPI_INT64_T, "a message to the followers");
}
#endif

void ds_ep_send_seq_new(ds_ep *ep, int id, int64_t max_len, int home) {
#ifdef DSV4_HAVE_MPI
    send_hdr(ep, DS_EP_MSG_SEQ_NEW, id, max_len, home);
#else
    (void)ep, (void)id, (void)max_len, (void)home;
#endif
}

void ds_ep_seq_unhome(ds_ep *ep, int home) {
    if (ep->rank == 0 && home >= 0 && home < ep->size && ep->live[home] > 0) ep->live[home]--;
}

void ds_ep_send_seq_free(ds_ep *ep, int id, int home) {
    ds_ep_seq_unhome(ep, home);
#ifdef DSV4_HAVE_MPI
    send_hdr(ep, DS_EP_MSG_SEQ_FREE, id, 0, 0);
#else
    (void)id;
#endif
}

void ds_ep_send_step(ds_ep *ep, int n_items, const int64_t *items, const int32_t *tokens, int T) {
#ifdef DSV4_HAVE_MPI
    if (ep->rank != 0 || ep->size < 2 || ep->quit) return;
    send_hdr(ep, DS_EP_MSG_STEP, n_items, T, 0);
    bcast((void *)items, DS_EP_ITEM_FIELDS * n_items, MPI_INT64_T, "a step's items");
    bcast((void *)tokens, T, MPI_INT32_T, "a step's tokens");
#else
    (void)ep, (void)n_items, (void)items, (void)tokens, (void)T;
#endif
}

void ds_ep_send_quit(ds_ep *ep) {
#ifdef DSV4_HAVE_MPI
    send_hdr(ep, DS_EP_MSG_QUIT, 0, 0, 0);
#endif
    ep->quit = 1;
}

int ds_ep_recv(ds_ep *ep, ds_ep_msg *msg, ds_err *err) {
    memset(msg, 0, sizeof *msg);
#ifdef DSV4_HAVE_MPI
    int64_t h[4];
    bcast(h, 4, MPI_INT64_T, "a message from rank 0");
    msg->type = (int)h[0];
    if (msg->type == DS_EP_MSG_SEQ_NEW || msg->type == DS_EP_MSG_SEQ_FREE) {
        msg->id = (int)h[1];
        msg->max_len = h[2];
        msg->home = (int)h[3];
    } else if (msg->type == DS_EP_MSG_STEP) {
        msg->n_items = (int)h[1];
        msg->T = (int)h[2];
        size_t ni = DS_EP_ITEM_FIELDS * (size_t)msg->n_items, nt = (size_t)msg->T;
        if (ni > ep->cap_items) {
            free(ep->items);
            ep->items = malloc(ni * sizeof *ep->items);
            ep->cap_items = ep->items ? ni : 0;
        }
        if (nt > ep->cap_tok) {
            free(ep->tokens);
            ep->tokens = malloc(nt * sizeof *ep->tokens);
            ep->cap_tok = ep->tokens ? nt : 0;
        }
        if (!ep->items || !ep->tokens) return ds_fail(err, "out of memory for a step of %d tokens", msg->T);
        bcast(ep->items, (int)ni, MPI_INT64_T, "a step's items");
        bcast(ep->tokens, (int)nt, MPI_INT32_T, "a step's tokens");
        msg->items = ep->items;
        msg->tokens = ep->tokens;
    } else if (msg->type != DS_EP_MSG_QUIT) {
        return ds_fail(err, "unknown message %lld from rank 0", (long long)h[0]);
    }
    return 0;
#else
    (void)ep;
    return ds_fail(err, "expert parallelism: this build has no MPI");
#endif
}

static int grow_pairs(ds_ep *ep, size_t n, ds_err *err) {
    if (n <= ep->cap_pairs) return 0;
    free(ep->owner), free(ep->sel);
    ep->owner = malloc(n * sizeof *ep->owner);
    ep->sel = malloc(n);
    ep->cap_pairs = ep->owner && ep->sel ? n : 0;
    return ep->cap_pairs ? 0 : ds_fail(err, "out of memory for the expert routing of %zu pairs", n);
}

int ds_ep_route(ds_ep *ep, int l, const int32_t *idx, int n_pairs, const unsigned char **sel, ds_err *err) {
    if (grow_pairs(ep, (size_t)n_pairs, err)) return -1;
    for (int i = 0; i < n_pairs; i++)
        if (idx[i] < 0 || idx[i] >= ep->experts)
            return ds_fail(err, "layer %d: expert id %d out of range [0, %d)", l, idx[i], ep->experts);
    ds_placement_assign(&ep->pl, l, idx, n_pairs, ep->owner);
    for (int i = 0; i < n_pairs; i++) {
        ep->sel[i] = ep->owner[i] == ep->rank;
        ep->served[(size_t)l * ep->size + ep->owner[i]]++;
    }
    *sel = ep->sel;
    return 0;
}

const unsigned char *ds_ep_no_pairs(ds_ep *ep, int n, ds_err *err) {
    size_t need = n > 0 ? (size_t)n : 1;
    if (need > ep->cap_none) {
        free(ep->none);
        ep->none = calloc(need, 1);
        ep->cap_none = ep->none ? need : 0;
        if (!ep->none) ds_fail(err, "out of memory for a selection of %d pairs", n);
    }
    return ep->none;
}

#ifdef DSV4_HAVE_MPI
/* The exchange's host buffers for `need` 32-bit words (MPI counts are ints). */
static int grow_f(ds_ep *ep, size_t need, ds_err *err) {
    if (need > (size_t)0x7fffffff) return ds_fail(err, "expert exchange: %zu floats exceed MPI's int counts", need);
    if (need <= ep->cap_f) return 0;
    free(ep->send), free(ep->recv);
    ep->send = malloc(need * sizeof(float));
    ep->recv = malloc(need * sizeof(float));
    ep->cap_f = ep->send && ep->recv ? need : 0;
    return ep->cap_f ? 0 : ds_fail(err, "out of memory for the expert exchange (%zu floats)", need);
}
#endif

int ds_ep_exchange_rows(ds_ep *ep, float *rows, int n_pairs, int D, const int *owner, ds_err *err) {
#ifdef DSV4_HAVE_MPI
    if (grow_f(ep, (size_t)n_pairs * D, err)) return -1;
    /* every rank's rows in ascending row order, rank after rank; as 32-bit
     * words (idx rows are int32: no float conversion may touch them) */
    memset(ep->counts, 0, (size_t)ep->size * sizeof *ep->counts);
    for (int i = 0; i < n_pairs; i++) ep->counts[owner[i]] += D;
    for (int r = 0, off = 0; r < ep->size; r++) ep->displs[r] = off, off += ep->counts[r];
    size_t ns = 0;
    for (int i = 0; i < n_pairs; i++)
        if (owner[i] == ep->rank) memcpy(ep->send + ns, rows + (size_t)i * D, (size_t)D * sizeof(float)), ns += D;
    if (MPI_Allgatherv(ep->send, (int)ns, MPI_UINT32_T, ep->recv, ep->counts, ep->displs, MPI_UINT32_T,
                       MPI_COMM_WORLD) != MPI_SUCCESS)
        return ds_fail(err, "expert exchange: MPI_Allgatherv failed");
    for (int r = 0; r < ep->size; r++) ep->counts[r] = ep->displs[r];
    for (int i = 0; i < n_pairs; i++) {
        int r = owner[i];
        if (r != ep->rank) memcpy(rows + (size_t)i * D, ep->recv + ep->counts[r], (size_t)D * sizeof(float));
        ep->counts[r] += D;
    }
    return 0;
#else
    (void)ep, (void)rows, (void)n_pairs, (void)D, (void)owner;
    return ds_fail(err, "expert parallelism: this build has no MPI");
#endif
}

int ds_ep_exchange_to(ds_ep *ep, float *rows, int n, int D, const int *owner, const int *dest, ds_err *err) {
#ifdef DSV4_HAVE_MPI
    if (grow_f(ep, (size_t)n * D, err)) return -1;
    /* to each rank the rows this rank filled that it needs, ascending; from
     * each rank the rows it filled that this rank needs, ascending (32-bit
     * words, as ds_ep_exchange_rows) */
    memset(ep->counts, 0, (size_t)ep->size * sizeof *ep->counts);
    memset(ep->rcounts, 0, (size_t)ep->size * sizeof *ep->rcounts);
    for (int i = 0; i < n; i++) {
        if (owner[i] == ep->rank && dest[i] != ep->rank) ep->counts[dest[i]] += D;
        if (dest[i] == ep->rank && owner[i] != ep->rank) ep->rcounts[owner[i]] += D;
    }
    for (int r = 0, so = 0, ro = 0; r < ep->size; r++)
        ep->displs[r] = so, so += ep->counts[r], ep->rdispls[r] = ro, ro += ep->rcounts[r];
    for (int i = 0; i < n; i++)
        if (owner[i] == ep->rank && dest[i] != ep->rank) {
            memcpy(ep->send + ep->displs[dest[i]], rows + (size_t)i * D, (size_t)D * sizeof(float));
            ep->displs[dest[i]] += D;
        }
    for (int r = 0, so = 0; r < ep->size; r++) ep->displs[r] = so, so += ep->counts[r];
    if (MPI_Alltoallv(ep->send, ep->counts, ep->displs, MPI_UINT32_T, ep->recv, ep->rcounts, ep->rdispls, MPI_UINT32_T,
                      MPI_COMM_WORLD) != MPI_SUCCESS)
        return ds_fail(err, "expert exchange: MPI_Alltoallv failed");
    for (int i = 0; i < n; i++)
        if (dest[i] == ep->rank && owner[i] != ep->rank) {
            memcpy(rows + (size_t)i * D, ep->recv + ep->rdispls[owner[i]], (size_t)D * sizeof(float));
            ep->rdispls[owner[i]] += D;
        }
    return 0;
#else
    (void)ep, (void)rows, (void)n, (void)D, (void)owner, (void)dest;
    return ds_fail(err, "expert parallelism: this build has no MPI");
#endif
}

void ds_ep_report(const ds_ep *ep, FILE *f) {
    double sum_ratio = 0, worst = 0;
    int n = 0, worst_l = -1;
    uint64_t total = 0;
    for (int l = 0; l < ep->layers; l++) {
        const uint64_t *c = ep->served + (size_t)l * ep->size;
        uint64_t mx = 0, sum = 0;
        for (int r = 0; r < ep->size; r++) sum += c[r], mx = c[r] > mx ? c[r] : mx;
        if (!sum) continue;
        double ratio = (double)mx * ep->size / (double)sum;
        sum_ratio += ratio, n++, total += sum;
        if (ratio > worst) worst = ratio, worst_l = l;
    }
    if (!n) return;
    fprintf(f,
            "dsv4: expert parallel over %d ranks: %llu (token, expert) pairs served; busiest rank / mean per "
            "layer: %.3f on average, %.3f at worst (layer %d); attention rows per rank (%s):",
            ep->size, (unsigned long long)total, sum_ratio / n, worst, worst_l,
            ds_ep_dp(ep) ? "data parallel" : "replicated");
    for (int r = 0; r < ep->size; r++) fprintf(f, " %llu", (unsigned long long)ep->att_rows[r]);
    fputc('\n', f);
}
