/* sched_spec.c — speculative decoding inside the scheduler's steps (the MTP
 * block drafting for each decoding request; docs/server.md): drafts before a
 * step, the verify rows' rewind and the blocks' catch-up after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/state.h"
#include "runtime/generate.h"
#include "runtime/sched_impl.h"

/* Speculation off for r: its snapshots, the block's sequence and rows freed. */
void sched_spec_off(ds_req *r) {
    if (r->seq) ds_seq_snap_free(r->seq, &r->snap);
    if (r->ms) ds_seq_snap_free(r->ms, &r->msnap);
    ds_seq_free(r->ms);
    free(r->ph);
    free(r->mh);
    r->ms = NULL;
    r->ph = r->mh = NULL;
    r->nv = 0;
}

/* Whether r may speculate: a block, no grammar, no forced tokens, more than one token to generate. */
int sched_spec_wanted(const ds_sched *s, const ds_req *r) {
    return s->mt && !r->p.grammar && !r->p.n_force && r->p.max_new > 1;
}

/* The block's sequence and rows for r (a fresh sequence: ms at 0), or the
 * cached ones (cms, cph: taken). Speculation stays off (0) when r does not
 * want it, the batch is over the limit, a cached sequence has no block state,
 * or memory is short (it only makes decoding faster). */
void sched_spec_on(ds_sched *s, ds_req *r, int fresh, ds_seq *cms, float *cph) {
    if (!sched_spec_wanted(s, r) || s->n_run >= s->o.mtp_max_batch || (!fresh && !cms)) {
        ds_seq_free(cms);
        free(cph);
        return;
    }
    ds_err err;
    if (cms) {
        r->ms = cms;
        r->ph = cph;
    } else if (ds_seq_new(s->mt, s->o.ctx, &r->ms, &err)) {
        r->ms = NULL;
        return;
    } else {
        r->ph = malloc(s->nD * sizeof *r->ph);
    }
    r->mh = malloc(s->nD * sizeof *r->mh);
    if (!r->ph || !r->mh) sched_spec_off(r);
}

/* The highest logit, ties to the lower id (a draft: the block's greedy pick). */
static int32_t argmax_id(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Fails r at the step's end (the retire loop) with err's message. */
static void spec_fail(ds_req *r, const ds_err *err) {
    snprintf(r->info.error, sizeof r->info.error, "speculative decoding: %.960s", err->msg);
    r->nv = 0;
}

#ifdef DSV4_TEST_HOOKS
void sched_oracle_load(ds_sched *s) {
    const char *rec = getenv("DSV4_TEST_MTP_RECORD"), *orc = getenv("DSV4_TEST_MTP_ORACLE");
    const char *wrong = getenv("DSV4_TEST_MTP_WRONG");
    if (rec) snprintf(s->rec_path, sizeof s->rec_path, "%s", rec);
    s->orc_wrong = wrong ? atoi(wrong) : 0;
    FILE *f = orc ? fopen(orc, "r") : NULL;
    if (!f) return;
    char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        int32_t **no = realloc(s->orc, (size_t)(s->n_orc + 1) * sizeof *no);
        int *nn = realloc(s->orc_n, (size_t)(s->n_orc + 1) * sizeof *nn);
        if (no) s->orc = no;
        if (nn) s->orc_n = nn;
        int32_t *t = malloc(sizeof line / 2 * sizeof *t);
        if (!no || !nn || !t) {
            free(t);
            break;
        }
        int n = 0;
        for (char *p = line, *e; n < (int)(sizeof line / 2); p = e) {
            long v = strtol(p, &e, 10);
            if (e == p) break;
            t[n++] = (int32_t)v;
        }
        s->orc[s->n_orc] = t;
        s->orc_n[s->n_orc++] = n;
    }
    fclose(f);
}

/* The oracle's drafts for r (hist[0..P] known, drafts for P+1..P+nv). */
static void oracle_draft(ds_sched *s, ds_req *r, int64_t P) {
    for (int o = 0; o < s->n_orc; o++) {
        const int32_t *t = s->orc[o];
        if (s->orc_n[o] <= P + 1 || memcmp(t, r->hist, (size_t)(P + 1) * sizeof *t)) continue;
        for (int i = 0; i < r->nv && P + 1 + i < s->orc_n[o]; i++) {
            r->vtok[1 + i] = t[P + 1 + i];
            if (s->orc_wrong > 0 && ++s->orc_count % s->orc_wrong == 0)
                r->vtok[1 + i] = (r->vtok[1 + i] + 1) % s->m->cfg.vocab_size;
        }
        return;
    }
}

void sched_record_tokens(ds_sched *s, const ds_req *r) {
    FILE *f = s->rec_path[0] ? fopen(s->rec_path, "a") : NULL;
    if (!f) return;
    for (int i = 0; i < r->n_prompt + r->info.n_out; i++) fprintf(f, "%s%d", i ? " " : "", (int)r->hist[i]);
    fputc('\n', f);
    fclose(f);
}
#endif

/* Before a step: each decoding request with a block that follows it (ms a
 * row behind seq) drafts up to K tokens into vtok[1..nv]: the block's row
 * (h_{P-1}, hist[P]) with logits (the first draft; the row is kept), then
 * chained on its own streams with its drafts (rows rewound after). The
 * model's sequence is snapshotted for the verify step's rewind. */
void sched_spec_draft(ds_sched *s) {
    const ds_model *m = s->m, *mt = s->mt;
    const int V = m->cfg.vocab_size;
    int nb = 0;
    ds_err err = {{0}};
    for (int i = 0; i < s->n_run; i++) {
        ds_req *r = s->run[i];
        int64_t P = r->seq->pos;
        if (!r->ms || r->cancel || r->info.error[0] || r->n_fed < r->n_prompt ||
            r->n_fed != r->n_prompt + r->info.n_out - 1 || r->ms->pos != P - 1)
            continue;
        int k = s->K;
        if (k > r->p.max_new - r->info.n_out - 1) k = r->p.max_new - r->info.n_out - 1;
        if (k > r->seq->max_len - P - 1) k = (int)(r->seq->max_len - P - 1);
        if (k > m->cfg.max_pos - P - 2) k = (int)(m->cfg.max_pos - P - 2);
        if (k <= 0) continue;
        r->nv = k;
        r->vtok[0] = r->hist[P];
        s->bitems[nb] =
            (ds_batch_item){r->ms, &r->hist[P], 1, s->blog + (size_t)nb * V, 0, s->bhid + nb * s->nD, r->ph};
        s->breq[nb++] = r;
    }
    if (!nb) return;
    if (ds_forward(mt, s->be, s->bitems, nb, &err)) {
        for (int b = 0; b < nb; b++) {
            spec_fail(s->breq[b], &err);
            sched_spec_off(s->breq[b]); /* its sequence is mid-step */
        }
        return;
    }
    int chain = 0;
    for (int b = 0; b < nb; b++) {
        ds_req *r = s->breq[b];
        float *lg = s->blog + (size_t)b * V;
        ds_gen_mask_logits(lg, s->mask, s->n_mask);
        r->vtok[1] = argmax_id(lg, V);
        memcpy(r->mh, s->bhid + b * s->nD, s->nD * sizeof(float));
        if (r->nv > 1) {
            if (ds_seq_snapshot(mt, r->ms, &r->msnap, &err)) {
                spec_fail(r, &err);
                continue;
            }
            chain = 1;
        }
    }
    /* the chain: draft i from the block's row of draft i - 1 */
    for (int i = 1; chain && i < s->K; i++) {
        int nc = 0;
        for (int b = 0; b < nb; b++) {
            ds_req *r = s->breq[b];
            if (r->nv <= i) continue;
            s->bitems[nc] =
                (ds_batch_item){r->ms, &r->vtok[i], 1, s->blog + (size_t)nc * V, 0, s->bhid + nc * s->nD, r->mh};
            s->item_req[nc++] = r;
        }
        if (!nc) break;
        if (ds_forward(mt, s->be, s->bitems, nc, &err)) {
            for (int b = 0; b < nc; b++) {
                spec_fail(s->item_req[b], &err);
                sched_spec_off(s->item_req[b]);
            }
            break;
        }
        for (int b = 0; b < nc; b++) {
            ds_req *r = s->item_req[b];
            float *lg = s->blog + (size_t)b * V;
            ds_gen_mask_logits(lg, s->mask, s->n_mask);
            r->vtok[i + 1] = argmax_id(lg, V);
            memcpy(r->mh, s->bhid + b * s->nD, s->nD * sizeof(float));
        }
    }
    for (int b = 0; b < nb; b++) {
        ds_req *r = s->breq[b];
        if (!r->nv) continue;
        if ((r->nv > 1 && ds_seq_rewind(mt, r->ms, &r->msnap, &err)) || ds_seq_snapshot(m, r->seq, &r->snap, &err)) {
            spec_fail(r, &err);
            continue;
        }
#ifdef DSV4_TEST_HOOKS
        oracle_draft(s, r, r->seq->pos);
#endif
    }
}

/* After a step's draws: a verify item whose drafts were not all kept is
 * rewound to before the step (its kept tokens are fed again next step).
 * Then every block follows its sequence to a row behind it: rows (h_q,
 * hist[q+1]) for q in [ms->pos, seq->pos - 1), h from ph (q = p0 - 1) or
 * this step's streams, in one step of the block; ph becomes the streams of
 * the sequence's last position. */
void sched_spec_follow(ds_sched *s) {
    const size_t nD = s->nD;
    ds_err err = {{0}};
    for (int i = 0; i < s->n_run; i++) {
        ds_req *r = s->run[i];
        if (!r->nv || r->info.error[0]) continue;
        if (r->drawn - 1 < r->nv) { /* a draft was not kept */
            if (ds_seq_rewind(s->m, r->seq, &r->snap, &err)) {
                spec_fail(r, &err);
                continue;
            }
            r->n_fed = (int)r->p0;
        }
    }
    int nb = 0;
    size_t row = 0;
    for (int i = 0; i < s->n_run; i++) {
        ds_req *r = s->run[i];
        if (!r->ms || r->info.error[0]) continue;
        int64_t a = r->ms->pos, b = r->seq->pos - 1;
        if (b > a && (a < r->p0 - 1 || r->hrow < 0)) { /* cannot follow (not expected): off for r */
            sched_spec_off(r);
            continue;
        }
        if (b > a) {
            for (int64_t q = a; q < b; q++) {
                const float *h = q < r->p0 ? r->ph : s->hid + ((size_t)r->hrow + (size_t)(q - r->p0)) * nD;
                memcpy(s->bin + (row + (size_t)(q - a)) * nD, h, nD * sizeof(float));
            }
            s->bitems[nb] = (ds_batch_item){r->ms, &r->hist[a + 1], (int)(b - a), NULL, 0, NULL, s->bin + row * nD};
            s->breq[nb++] = r;
            row += (size_t)(b - a);
        }
        if (b >= r->p0 && r->hrow >= 0)
            memcpy(r->ph, s->hid + ((size_t)r->hrow + (size_t)(b - r->p0)) * nD, nD * sizeof(float));
    }
    if (nb && ds_forward(s->mt, s->be, s->bitems, nb, &err))
        for (int b = 0; b < nb; b++) spec_fail(s->breq[b], &err);
}
