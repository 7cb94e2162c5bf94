/* ep.h — expert parallelism over processes (docs/ep.md).
 *
 * Ranks are processes started by Open MPI's mpirun; MPI is the transport and
 * the bootstrap. Every rank holds the dense weights; each sequence's
 * attention runs on its home rank (data parallel; or on every rank:
 * --ep-attention replicated); the routed experts are placed on ranks (round
 * robin, a placement file, or by measured load with redundant replicas).
 * Per MoE layer the ranks all-gather their rows' MoE inputs and routes, each
 * computes the (token, slot) pairs whose expert it serves, an all-gather
 * brings every pair's output to every rank, and each combines its own
 * tokens: a token's k outputs in ascending expert id, the shared expert
 * last — the single-process order, so any rank count gives the same bits.
 * Rank 0 leads: it runs the command (scheduling, sampling, output) and sends every sequence creation / release and
 * every step's token table to the followers, which run the same steps (ep/follow.h).
 *
 * Two parts: a placement (plain data, no MPI: tests and `dsv4 stats` use it
 * without ranks), and the process's MPI session (ds_ep_session_*), the one
 * process-wide state — MPI_COMM_WORLD is itself per process. Built without
 * MPI (-DDSV4_MPI=OFF), the session is always one rank. */
#ifndef DS_EP_H
#define DS_EP_H

#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

/* ---- placement -------------------------------------------------------- */

typedef struct ds_ep_opts {
    const char *placement; /* placement file, or NULL: round robin (expert e on rank e % ranks) */
    int redundant;         /* EPLB: extra replicas per layer, placed by load (needs load) */
    const char *load;      /* load file written by `dsv4 stats --load-out` */
    int attention;         /* DS_EP_ATT_DP (default) or DS_EP_ATT_REPLICATED (--ep-attention) */
} ds_ep_opts;

/* Who runs a sequence's attention: its home rank only (data parallel: the
 * sequence's state lives there), or every rank (replicated). */
enum { DS_EP_ATT_DP = 0, DS_EP_ATT_REPLICATED = 1 };

/* Which ranks serve each expert of each layer. */
typedef struct ds_placement {
    int ranks, layers, experts, max_rep;
    int *n_rep; /* [layers][experts] replicas (>= 1) */
    int *rep;   /* [layers][experts][max_rep] their ranks, ascending, distinct */
} ds_placement;

/* Builds the placement o describes for `layers` x `experts` on `ranks`
 * ranks. Errors name the file, line and field at fault. */
int ds_placement_build(ds_placement *p, int ranks, int layers, int experts, const ds_ep_opts *o, ds_err *err);
void ds_placement_free(ds_placement *p);
/* 1 when `rank` holds expert e of layer l. */
int ds_placement_holds(const ds_placement *p, int rank, int l, int e);
/* The rank serving each (token, slot) pair of a step at layer l: the j-th
 * pair (in row order) routed to expert e goes to its replica j % n_rep.
 * Depends only on idx, so every rank computes the same table. */
void ds_placement_assign(const ds_placement *p, int l, const int32_t *idx, int n_pairs, int *owner);

/* Reads a load file: per (layer, expert) the tokens routed there, lines
 * "LAYER EXPERT COUNT" ('#' comments). load is [layers][experts]. */
int ds_load_read(const char *path, int layers, int experts, double *load, ds_err *err);

/* ---- the MPI session -------------------------------------------------- */

/* 1 when this build has MPI (expert parallelism over ranks), else 0. */
int ds_ep_built(void);
/* Starts MPI when the process was started by mpirun (else one rank, no MPI).
 * A build without MPI that a launcher started as one of several ranks
 * fails (-1) with a message naming the launcher's variable.
 * Followers (rank > 0) send standard output to /dev/null and keep their
 * standard error aside until the load handshake, so rank 0 alone prints. */
int ds_ep_session_start(int *argc, char ***argv);
/* The options of the ranks (--placement, --expert-load,
 * --redundant-experts), set while a command parses its options. */
ds_ep_opts *ds_ep_session_opts(void);
int ds_ep_session_rank(void);
int ds_ep_session_size(void);
/* This rank's index among the ranks on its host (0 without MPI): a rank
 * of the CUDA backend drives GPU --gpu + local rank. */
int ds_ep_session_local_rank(void);
/* The number of ranks on this rank's host (1 without MPI). */
int ds_ep_session_local_size(void);
/* Collective: 1 when every rank passes ok != 0, else 0. */
int ds_ep_session_all(int ok);
/* Collective: rank 0's n bytes of buf to every rank (an MPI failure ends the job). */
void ds_ep_session_bcast(void *buf, size_t n);
/* The load handshake, collective, once: every rank says whether it loaded
 * and bound its part of the model (ok) and why not (msg). 0 when every rank
 * did; else -1 with err naming the first rank that failed and its message.
 * Then standard error is the real one again on every rank. */
int ds_ep_session_ready(int ok, const char *msg, ds_err *err);
/* The end of the process: a rank that never reached the handshake takes
 * part in it now (ok = rc == 0, msg = what it printed on standard error);
 * the leader tells the followers to stop; MPI is finalized. Returns rc, or 1
 * when the handshake failed on another rank. */
int ds_ep_session_end(int rc);
/* Ends the whole job now: "dsv4: rank R: <msg>" on standard error, then
 * MPI_Abort (never a hang on a collective). */
void ds_ep_session_fatal(const char *msg) __attribute__((noreturn));

/* ---- one model's expert parallelism ----------------------------------- */

typedef struct ds_ep ds_ep;

/* The session's ranks for a model of `layers` layers, `experts` routed
 * experts and k per token, with the placement o describes. */
int ds_ep_new(ds_ep **out, int layers, int experts, int k, const ds_ep_opts *o, ds_err *err);
void ds_ep_free(ds_ep *ep);
int ds_ep_rank(const ds_ep *ep);
int ds_ep_size(const ds_ep *ep);
const ds_placement *ds_ep_placement(const ds_ep *ep);

/* 1 when attention is data parallel over more than one rank. */
int ds_ep_dp(const ds_ep *ep);

/* The leader's messages to the followers (no-ops on a follower). */
int ds_ep_next_seq_id(ds_ep *ep);
/* The leader: the home rank of a new sequence under data-parallel attention
 * (the rank with the fewest live sequences, the lowest on a tie), or -1
 * (every rank) when attention is replicated. ds_ep_seq_unhome (and
 * ds_ep_send_seq_free) give the home's place back. */
int ds_ep_seq_home(ds_ep *ep);
void ds_ep_seq_unhome(ds_ep *ep, int home);
/* The leader: a step ran `rows` rows of a sequence of home `home` (-1:
 * every rank), for the report. */
void ds_ep_count_attention(ds_ep *ep, int home, int rows);
void ds_ep_send_seq_new(ds_ep *ep, int id, int64_t max_len, int home);
void ds_ep_send_seq_free(ds_ep *ep, int id, int home);
/* A step: per item (sequence id, position, tokens, DS_EP_ITEM_* flags) in
 * items[DS_EP_ITEM_FIELDS*i ..], then the T tokens of all items in order. */
enum { DS_EP_ITEM_FIELDS = 4, DS_EP_ITEM_LOGITS = 1, DS_EP_ITEM_ALL_LOGITS = 2 };
void ds_ep_send_step(ds_ep *ep, int n_items, const int64_t *items, const int32_t *tokens, int T);
void ds_ep_send_quit(ds_ep *ep);

enum { DS_EP_MSG_QUIT = 0, DS_EP_MSG_SEQ_NEW = 1, DS_EP_MSG_SEQ_FREE = 2, DS_EP_MSG_STEP = 3 };
typedef struct ds_ep_msg {
    int type, id, n_items, T;
    int64_t max_len;
    int home;              /* SEQ_NEW: the home rank, -1 for every rank */
    const int64_t *items;  /* STEP: [n_items][DS_EP_ITEM_FIELDS]; valid until the next receive */
    const int32_t *tokens; /* STEP: [T] */
} ds_ep_msg;
/* A follower's next message from the leader. */
int ds_ep_recv(ds_ep *ep, ds_ep_msg *msg, ds_err *err);

/* The MoE exchange of layer l: which pairs this rank computes (sel[i] = 1),
 * after ds_ep_route (owners: ds_ep_owner); then an exchange of the pairs'
 * output rows. Host buffers, grow-only, owned by ep. */
int ds_ep_route(ds_ep *ep, int l, const int32_t *idx, int n_pairs, const unsigned char **sel, ds_err *err);
/* rows: [n][D] host rows, row i filled by rank owner[i]; on return every
 * rank has every row (an all-gather in row order; the bytes are copied,
 * never converted). */
int ds_ep_exchange_rows(ds_ep *ep, float *rows, int n, int D, const int *owner, ds_err *err);
/* An all-to-all: row i, filled by rank owner[i], goes to rank dest[i] only
 * (the other rows of the buffer are left as they are). */
int ds_ep_exchange_to(ds_ep *ep, float *rows, int n, int D, const int *owner, const int *dest, ds_err *err);
/* n zeros: a selection of no pairs (grow-only, owned by ep), or NULL with err. */
const unsigned char *ds_ep_no_pairs(ds_ep *ep, int n, ds_err *err);
/* The owner rank of each pair of the last ds_ep_route. */
const int *ds_ep_owner(const ds_ep *ep);
/* The exchange between devices: name (e.g. "NCCL") when the backend's
 * ep_exchange moves the rows, NULL (the default) for ds_ep_exchange_rows /
 * ds_ep_exchange_to through host memory. */
void ds_ep_set_transport(ds_ep *ep, const char *name);
const char *ds_ep_transport(const ds_ep *ep);
/* Pairs served so far, [layers][ranks] (every rank counts all ranks). */
const uint64_t *ds_ep_served(const ds_ep *ep);
/* One line: pairs served, and per layer the busiest rank's pairs over the
 * mean (1 = balanced), averaged over layers and the worst layer; the rows
 * each rank's attention ran. */
void ds_ep_report(const ds_ep *ep, FILE *f);

#endif
