/* compressor.c — token compression into KV entries on the CPU (paper §2.3,
 * doc §3.3, 3.4). HCA (no overlap): each complete window of `ratio` tokens
 * becomes one entry; CSA (overlap): projections are 2d wide, entry w pools
 * window w-1's series A (first d channels) with window w's series B (last d).
 * Per channel: softmax over the slots of gate + ape, the weighted sum of kv,
 * then RMSNorm and RoPE at the window's first position. The state carries
 * what a window needs across steps, so one prefill, chunks or single tokens
 * build the same entries. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

/* The row at `pos` (kv, gate: c*d floats, gate without ape) into state s;
 * when pos closes a window, entry pos / R is written. slots: 4R floats. */
static void push(const ds_compress_params *P, const ds_comp_mem *s, const float *kv, const float *gate, int64_t pos,
                 float *slots) {
    int d = P->d, R = P->ratio, cd = (P->overlap ? 2 : 1) * d;
    int slot = (int)(pos % R);
    const float *ape = P->ape + (size_t)slot * (size_t)cd;
    float *pk = s->pend_kv + (size_t)slot * (size_t)cd, *pg = s->pend_gate + (size_t)slot * (size_t)cd;
    for (int c = 0; c < cd; c++) {
        pk[c] = kv[c];
        pg[c] = gate[c] + ape[c];
    }
    if (slot != R - 1) return;
    int64_t entry = pos / R; /* entries before it: 0 .. entry-1 */
    float *e = s->entries + (size_t)entry * (size_t)d;
    int off = P->overlap ? d : 0; /* series B (overlap) or the only series */
    /* per channel, softmax over the slots (the previous window's series A
     * first, then this window), then the weighted sum of the kv slots */
    int np = P->overlap && entry > 0 ? R : 0, ns = np + R;
    float *g = slots, *v = slots + ns;
    for (int c = 0; c < d; c++) {
        for (int j = 0; j < np; j++) {
            g[j] = s->prev_gate[(size_t)j * d + c];
            v[j] = s->prev_kv[(size_t)j * d + c];
        }
        for (int j = 0; j < R; j++) {
            g[np + j] = s->pend_gate[(size_t)j * cd + off + c];
            v[np + j] = s->pend_kv[(size_t)j * cd + off + c];
        }
        float m = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (int j = 0; j < ns; j++) m = fmaxf(m, g[j]);
        for (int j = 0; j < ns; j++) sum += (g[j] = expf(g[j] - m));
        for (int j = 0; j < ns; j++) acc += v[j] * (g[j] / sum);
        e[c] = acc;
    }
    ds_cpu_rmsnorm(e, e, P->norm, d, P->eps);
    ds_cpu_rope(e, d, P->inv_freq, P->half, pos - (R - 1), 0);
    if (P->overlap) { /* keep this window's series A for the next entry */
        for (int j = 0; j < R; j++) {
            memcpy(s->prev_kv + (size_t)j * d, s->pend_kv + (size_t)j * cd, (size_t)d * sizeof(float));
            memcpy(s->prev_gate + (size_t)j * d, s->pend_gate + (size_t)j * cd, (size_t)d * sizeof(float));
        }
    }
}

int ds_cpu_compress(const ds_backend *be, const ds_compress_params *p, ds_err *err) {
    const ds_step_desc *st = &ds_cpu_of(be)->step;
    int cd = (p->overlap ? 2 : 1) * p->d;
    float *slots = ds_cpu_scratch(be, DS_SCR_COMP, 4 * (size_t)p->ratio * sizeof(float));
    if (!slots) return ds_fail(err, "cpu compressor (layer %d): out of memory", p->layer);
    for (int s = 0; s < st->n_seqs; s++) {
        const ds_layer_mem *lm = &st->seq_mem[s][p->layer];
        const ds_comp_mem *cm = p->which ? &lm->icomp : &lm->comp;
        for (int r = st->seq_row0[s]; r < st->seq_row0[s] + st->seq_n[s]; r++)
            push(p, cm, p->kv + (size_t)r * cd, p->gate + (size_t)r * cd, st->tok_pos[r], slots);
    }
    return 0;
}
