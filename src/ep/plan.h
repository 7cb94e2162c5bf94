/* plan.h — the plan of one expert exchange between devices (docs/ep.md):
 * from the tables alone (each row's filling rank, and for an all-to-all its
 * destination), which rows this rank packs, which blocks it broadcasts, sends
 * and receives, and where the received rows go. A device transport
 * (backend/cuda/ep_nccl.cu) carries a plan out; tests/test_ep_plan.c carries
 * the plans of every rank out in host memory and checks that each rank ends
 * with the rows it needs. Header only (C and CUDA C++), no state.
 *
 * Three ways, by the tables:
 * - DS_XP_IN_PLACE: rows grouped by owner, rank after rank, going to every
 *   rank or all to one rank: each owner's block moves where it lies (a
 *   broadcast from the owner, or a send to / receive from the one rank);
 *   nothing packed, nothing scattered.
 * - DS_XP_GATHER: any owners, every rank: this rank's rows packed in
 *   ascending order, each rank's packed block broadcast from it into a
 *   receive area (rank after rank), then every received row scattered to
 *   its row.
 * - DS_XP_TO: any owners, to dest: to each peer the rows this rank filled
 *   that the peer needs (packed, ascending), from each peer the rows it filled
 *   that this rank needs (received, ascending), scattered to their rows.
 * Ops of a broadcast are listed in the same order on every rank (NCCL runs a
 * group's collectives in issue order); a send to q and q's receive from this
 * rank list the same rows in the same order. */
#ifndef DS_EP_PLAN_H
#define DS_EP_PLAN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DS_XP_IN_PLACE = 0, DS_XP_GATHER = 1, DS_XP_TO = 2 };
enum { DS_XP_BCAST = 0, DS_XP_SEND = 1, DS_XP_RECV = 2 };

typedef struct ds_xp_op {
    int kind;     /* DS_XP_BCAST / SEND / RECV */
    int peer;     /* the broadcast's root, or the rank sent to / received from */
    int src, dst; /* first row: IN_PLACE in the buffer (both); GATHER src in the packed rows (the
                     root's), dst in the receive area; TO: SEND src in the packed rows, RECV dst
                     in the receive area */
    int rows;     /* > 0 */
} ds_xp_op;

typedef struct ds_xplan {
    int way;
    int n_ops, cap_ops;
    ds_xp_op *ops;
    int n_pack; /* packed row j = buffer row pack[j] */
    int n_recv; /* receive-area row j goes to buffer row unpack[j] */
    int *pack, *unpack;
    int cap_rows;
} ds_xplan;

static inline void ds_xplan_free(ds_xplan *p) {
    free(p->ops), free(p->pack), free(p->unpack);
    memset(p, 0, sizeof *p);
}

static inline int ds_xplan_op(ds_xplan *p, int kind, int peer, int src, int dst, int rows) {
    if (rows <= 0) return 0;
    if (p->n_ops == p->cap_ops) {
        int cap = p->cap_ops ? 2 * p->cap_ops : 16;
        ds_xp_op *o = (ds_xp_op *)realloc(p->ops, (size_t)cap * sizeof *o);
        if (!o) return -1;
        p->ops = o, p->cap_ops = cap;
    }
    ds_xp_op o = {kind, peer, src, dst, rows};
    p->ops[p->n_ops++] = o;
    return 0;
}

/* The plan of rank `rank` of `size` for `rows` rows filled by owner[] (and
 * sent to dest[], or to every rank when dest is NULL). 0, or -1 with a
 * message in why naming the row at fault (or out of memory). */
static inline int ds_xplan_build(ds_xplan *p, int rank, int size, int rows, const int *owner, const int *dest,
                                 char *why, size_t why_len) {
    p->n_ops = p->n_pack = p->n_recv = 0;
    if (rows > p->cap_rows) {
        free(p->pack), free(p->unpack);
        p->pack = (int *)malloc((size_t)rows * sizeof(int));
        p->unpack = (int *)malloc((size_t)rows * sizeof(int));
        p->cap_rows = p->pack && p->unpack ? rows : 0;
        if (!p->cap_rows) return snprintf(why, why_len, "out of memory for an exchange of %d rows", rows), -1;
    }
    int *cnt = (int *)calloc(4 * (size_t)size, sizeof(int)); /* sent / filled per rank, received, offsets */
    if (!cnt) return snprintf(why, why_len, "out of memory for an exchange over %d ranks", size), -1;
    int *rcnt = cnt + size, *off = cnt + 2 * size, *roff = cnt + 3 * size, rc = 0;
    int grouped = 1, one_dest = dest && rows ? dest[0] : -1;
    for (int i = 0; i < rows; i++) {
        if (owner[i] < 0 || owner[i] >= size) {
            snprintf(why, why_len, "row %d filled by rank %d of %d", i, owner[i], size);
            free(cnt);
            return -1;
        }
        if (dest && (dest[i] < 0 || dest[i] >= size)) {
            snprintf(why, why_len, "row %d sent to rank %d of %d", i, dest[i], size);
            free(cnt);
            return -1;
        }
        if (i && owner[i] < owner[i - 1]) grouped = 0;
        if (dest && dest[i] != one_dest) one_dest = -2;
    }
    if (grouped && one_dest > -2) { /* blocks in place */
        p->way = DS_XP_IN_PLACE;
        for (int i = 0; i < rows; i++) cnt[owner[i]]++;
        for (int q = 0, o = 0; q < size && !rc; o += cnt[q], q++) {
            if (one_dest < 0)
                rc = ds_xplan_op(p, DS_XP_BCAST, q, o, o, cnt[q]);
            else if (q != one_dest && rank == q)
                rc = ds_xplan_op(p, DS_XP_SEND, one_dest, o, o, cnt[q]);
            else if (q != one_dest && rank == one_dest)
                rc = ds_xplan_op(p, DS_XP_RECV, q, o, o, cnt[q]);
        }
    } else if (!dest) { /* pack, broadcast every block, scatter everything */
        p->way = DS_XP_GATHER;
        for (int i = 0; i < rows; i++) cnt[owner[i]]++;
        for (int q = 0, o = 0; q < size; q++) off[q] = o, o += cnt[q];
        for (int i = 0; i < rows; i++) {
            p->unpack[off[owner[i]]++] = i;
            if (owner[i] == rank) p->pack[p->n_pack++] = i;
        }
        p->n_recv = rows;
        for (int q = 0, o = 0; q < size && !rc; o += cnt[q], q++) rc = ds_xplan_op(p, DS_XP_BCAST, q, 0, o, cnt[q]);
    } else { /* pack per peer, send / receive, scatter what came */
        p->way = DS_XP_TO;
        for (int i = 0; i < rows; i++) {
            if (owner[i] == rank && dest[i] != rank) cnt[dest[i]]++;
            if (dest[i] == rank && owner[i] != rank) rcnt[owner[i]]++;
        }
        for (int q = 0, so = 0, ro = 0; q < size; q++) off[q] = so, so += cnt[q], roff[q] = ro, ro += rcnt[q];
        for (int q = 0; q < size && !rc; q++) {
            rc = ds_xplan_op(p, DS_XP_SEND, q, off[q], 0, cnt[q]);
            if (!rc) rc = ds_xplan_op(p, DS_XP_RECV, q, 0, roff[q], rcnt[q]);
        }
        for (int i = 0; i < rows; i++) {
            if (owner[i] == rank && dest[i] != rank) p->pack[off[dest[i]]++] = i, p->n_pack++;
            if (dest[i] == rank && owner[i] != rank) p->unpack[roff[owner[i]]++] = i, p->n_recv++;
        }
    }
    free(cnt);
    if (rc) return snprintf(why, why_len, "out of memory for an exchange's plan"), -1;
    return 0;
}

#endif
