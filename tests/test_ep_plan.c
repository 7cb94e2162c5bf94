/* test_ep_plan.c — the expert exchange's plans (ep/plan.h), carried
 * out for every rank in host memory as NCCL would: broadcasts matched by
 * their order on every rank, each send matched with the receive its peer
 * lists. Every rank must end with the rows it needs, bit for bit as their
 * owner filled them, its own rows untouched; the way chosen must be the one
 * the tables call for. 1 to 5 ranks, the tables of data-parallel attention
 * (MoE inputs, head rows, pairs' rows), of replicated attention and random
 * ones; bad tables refused with the row named. */
#include <stdlib.h>
#include <string.h>

#include "ep/plan.h"
#include "testutil.h"

#define W 3      /* words per row */
#define MAXR 5   /* ranks */
#define MAXN 300 /* rows */

static unsigned rng = 12345;
static int rnd(int n) {
    rng = rng * 1103515245u + 12345u;
    return (int)((rng >> 8) % (unsigned)n);
}

static float val(int row, int c) { return (float)(row * 10 + c + 1); }

typedef struct {
    float buf[MAXN][W], send[MAXN][W], recv[MAXN][W];
    ds_xplan pl;
} rank_t;

static rank_t R[MAXR];

/* Runs one exchange over `size` ranks; returns the failures found. */
static int run(const char *what, int size, int rows, const int *owner, const int *dest, int want_way) {
    int bad = 0;
    char why[160];
    for (int r = 0; r < size; r++) {
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < W; c++) R[r].buf[i][c] = owner[i] == r ? val(i, c) : -(float)(r + 1);
        if (ds_xplan_build(&R[r].pl, r, size, rows, owner, dest, why, sizeof why)) {
            CHECK(0, "%s: rank %d: plan refused: %s", what, r, why);
            return 1;
        }
        CHECK(R[r].pl.way == want_way, "%s: rank %d: way %d, want %d", what, r, R[r].pl.way, want_way);
        bad += R[r].pl.way != want_way;
        int inp = R[r].pl.way == DS_XP_IN_PLACE;
        for (int j = 0; j < R[r].pl.n_pack && !inp; j++)
            memcpy(R[r].send[j], R[r].buf[R[r].pl.pack[j]], sizeof R[r].send[j]);
    }
    /* broadcasts: the same list, in the same order, on every rank */
    for (int r = 1; r < size; r++) {
        int a = 0, b = 0;
        for (;;) {
            while (a < R[0].pl.n_ops && R[0].pl.ops[a].kind != DS_XP_BCAST) a++;
            while (b < R[r].pl.n_ops && R[r].pl.ops[b].kind != DS_XP_BCAST) b++;
            if (a == R[0].pl.n_ops || b == R[r].pl.n_ops) {
                int same_end = a == R[0].pl.n_ops && b == R[r].pl.n_ops;
                CHECK(same_end, "%s: ranks 0 and %d list different numbers of broadcasts", what, r);
                bad += !same_end;
                break;
            }
            const ds_xp_op *x = &R[0].pl.ops[a++], *y = &R[r].pl.ops[b++];
            int same = x->peer == y->peer && x->rows == y->rows && x->src == y->src && x->dst == y->dst;
            CHECK(same, "%s: ranks 0 and %d: broadcast %d differs", what, r, a - 1);
            bad += !same;
        }
    }
    for (int i = 0; i < R[0].pl.n_ops; i++) {
        const ds_xp_op *o = &R[0].pl.ops[i];
        if (o->kind != DS_XP_BCAST) continue;
        rank_t *root = &R[o->peer];
        int inp = root->pl.way == DS_XP_IN_PLACE;
        float(*src)[W] = inp ? root->buf : root->send;
        for (int r = 0; r < size; r++) {
            float(*dst)[W] = inp ? R[r].buf : R[r].recv;
            if (!(inp && r == o->peer)) memcpy(dst[o->dst], src[o->src], (size_t)o->rows * sizeof dst[0]);
        }
    }
    /* sends and receives: each send to q matches the one receive q lists from this rank */
    for (int a = 0; a < size; a++)
        for (int i = 0; i < R[a].pl.n_ops; i++) {
            const ds_xp_op *s = &R[a].pl.ops[i];
            if (s->kind != DS_XP_SEND) continue;
            int q = s->peer, found = 0;
            for (int j = 0; j < R[q].pl.n_ops; j++) {
                const ds_xp_op *t = &R[q].pl.ops[j];
                if (t->kind != DS_XP_RECV || t->peer != a) continue;
                found++;
                CHECK(t->rows == s->rows, "%s: rank %d sends %d rows to %d, which receives %d", what, a, s->rows, q,
                      t->rows);
                if (t->rows != s->rows) return bad + 1;
                float(*src)[W] = R[a].pl.way == DS_XP_IN_PLACE ? R[a].buf : R[a].send;
                float(*dst)[W] = R[q].pl.way == DS_XP_IN_PLACE ? R[q].buf : R[q].recv;
                memcpy(dst[t->dst], src[s->src], (size_t)s->rows * sizeof dst[0]);
            }
            CHECK(found == 1, "%s: rank %d sends to %d, which lists %d receives from it", what, a, q, found);
            bad += found != 1;
        }
    for (int q = 0; q < size; q++)
        for (int j = 0; j < R[q].pl.n_ops; j++) {
            const ds_xp_op *t = &R[q].pl.ops[j];
            if (t->kind != DS_XP_RECV) continue;
            int found = 0;
            for (int i = 0; i < R[t->peer].pl.n_ops; i++)
                found += R[t->peer].pl.ops[i].kind == DS_XP_SEND && R[t->peer].pl.ops[i].peer == q;
            CHECK(found == 1, "%s: rank %d receives from %d, which lists %d sends to it", what, q, t->peer, found);
            bad += found != 1;
        }
    for (int r = 0; r < size; r++) {
        if (R[r].pl.way != DS_XP_IN_PLACE)
            for (int j = 0; j < R[r].pl.n_recv; j++)
                memcpy(R[r].buf[R[r].pl.unpack[j]], R[r].recv[j], sizeof R[r].recv[j]);
        int wrong = 0;
        for (int i = 0; i < rows; i++) {
            if (dest && dest[i] != r && owner[i] != r) continue; /* not needed here */
            for (int c = 0; c < W; c++) wrong += R[r].buf[i][c] != val(i, c);
        }
        CHECK(!wrong, "%s: rank %d of %d: %d words wrong", what, r, size, wrong);
        bad += wrong != 0;
    }
    return bad;
}

int main(void) {
    int owner[MAXN], dest[MAXN], home[MAXN];
    for (int size = 1; size <= MAXR; size++)
        for (int trial = 0; trial < 40; trial++) {
            /* a step: T tokens spread over the ranks rank after rank (some
             * with none), k slots each; a pair's expert on any rank */
            int k = 1 + rnd(6), T = rnd(MAXN / k + 1), n = 0;
            for (int r = 0; r < size; r++)
                for (int c = trial % 3 == 0 && r % 2 ? 0 : rnd(T / size + 2); c > 0 && n < T; c--) home[n++] = r;
            while (n < T) home[n++] = size - 1;
            int P = T * k;
            char what[96];
            snprintf(what, sizeof what, "%d ranks, trial %d, %d tokens x %d", size, trial, T, k);
            /* data parallel: MoE inputs / ids / weights to every rank; the head's rows to rank 0 */
            run(what, size, T, home, NULL, DS_XP_IN_PLACE);
            for (int i = 0; i < T; i++) dest[i] = 0;
            run(what, size, T, home, dest, DS_XP_IN_PLACE);
            /* pairs' rows: filled by the expert's rank, to the token's home (dp) or everywhere */
            int grouped = 1;
            for (int i = 0; i < P; i++) {
                owner[i] = rnd(size), dest[i] = home[i / k];
                if (i && owner[i] < owner[i - 1]) grouped = 0;
            }
            int one = 1;
            for (int i = 1; i < P; i++) one &= dest[i] == dest[0];
            run(what, size, P, owner, dest, grouped && one ? DS_XP_IN_PLACE : DS_XP_TO);
            run(what, size, P, owner, NULL, grouped ? DS_XP_IN_PLACE : DS_XP_GATHER);
            /* any destinations */
            for (int i = 0; i < P; i++) dest[i] = rnd(size);
            one = 1;
            for (int i = 1; i < P; i++) one &= dest[i] == dest[0];
            run(what, size, P, owner, dest, grouped && one ? DS_XP_IN_PLACE : DS_XP_TO);
        }
    /* bad tables: refused, the row named */
    ds_xplan pl = {0};
    char why[160] = "";
    int own[4] = {0, 1, 2, 1}, dst[4] = {0, 0, 3, 0};
    CHECK(ds_xplan_build(&pl, 0, 2, 4, own, NULL, why, sizeof why) == -1 && strstr(why, "row 2 filled by rank 2 of 2"),
          "an owner beyond the ranks: '%s'", why);
    own[2] = 0;
    CHECK(ds_xplan_build(&pl, 0, 3, 4, own, dst, why, sizeof why) == -1 && strstr(why, "row 2 sent to rank 3 of 3"),
          "a destination beyond the ranks: '%s'", why);
    ds_xplan_free(&pl);
    for (int r = 0; r < MAXR; r++) ds_xplan_free(&R[r].pl);
    return test_summary("ep_plan");
}
