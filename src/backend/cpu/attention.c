/* attention.c — sparse attention with sinks on the CPU (paper §2.3, doc
 * §3.2): each (row, head) attends its keys in a fixed order — the window's
 * positions ascending (this step's rows, else the sequence's ring), then the
 * compressed entries (the indexer's choice, or all complete windows) — with
 * softmax over [q.k * scale ..., sink] and out = sum_j p_j k_j in that order
 * (K = V). The window store keeps the last W rows of every sequence. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/clock.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))
AVX512 static void axpy_512(float *o, float p, const float *v, int d) {
    __m512 pv = _mm512_set1_ps(p);
    int c = 0;
    for (; c + 16 <= d; c += 16) _mm512_storeu_ps(o + c, _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + c), _mm512_loadu_ps(o + c)));
    for (; c < d; c++) o[c] = fmaf(p, v[c], o[c]);
}
static void axpy_avx2(float *o, float p, const float *v, int d) {
    __m256 pv = _mm256_set1_ps(p);
    int c = 0;
    for (; c + 8 <= d; c += 8) _mm256_storeu_ps(o + c, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + c), _mm256_loadu_ps(o + c)));
    for (; c < d; c++) o[c] = fmaf(p, v[c], o[c]);
}
#endif

/* o[c] = fma(p, v[c], o[c]): elementwise, so the vector width cannot change the bits */
static void axpy(float *o, float p, const float *v, int d, int path) {
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
    if (path == DS_CPU_AVX512) return axpy_512(o, p, v, d);
    if (path == DS_CPU_AVX2) return axpy_avx2(o, p, v, d);
#endif
    (void)path;
    for (int c = 0; c < d; c++) o[c] = fmaf(p, v[c], o[c]);
}

typedef struct {
    const ds_attention_params *p;
    const float *const *keys; /* per row: its key pointers, from key0[t] */
    const size_t *key0;       /* [T+1] */
    float *scores;            /* per (row, head): from H * key0[t] + h * n_keys */
    const int64_t *pos;       /* the step's positions (the output's inverse rope) */
    int path;
} attn_job;

/* softmax over [q.k_j * scale ..., sink], then out = sum_j p_j k_j, all in
 * ascending key order. */
static void attend_one(void *ctx, int i) {
    const attn_job *J = ctx;
    const ds_attention_params *P = J->p;
    int t = i / P->H, h = i % P->H, d = P->d;
    int n = (int)(J->key0[t + 1] - J->key0[t]);
    const float *const *keys = J->keys + J->key0[t];
    const float *q = P->q + (size_t)i * d;
    float *s = J->scores + (size_t)P->H * J->key0[t] + (size_t)h * n;
    float sink = P->sink[h], m = sink;
    for (int j = 0; j < n; j++) {
        s[j] = ds_cpu_dot(q, keys[j], d, J->path) * P->scale;
        if (s[j] > m) m = s[j];
    }
    float sum = expf(sink - m);
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    float *o = P->out + (size_t)i * d;
    for (int c = 0; c < d; c++) o[c] = 0.0f;
    for (int j = 0; j < n; j++) axpy(o, s[j] * inv, keys[j], d, J->path);
    if (P->out_inv_freq) ds_cpu_rope(o, d, P->out_inv_freq, P->out_rope_half, J->pos[t], 1);
}

/* Row t's keys: positions lo..p, then its compressed entries. */
static size_t n_keys(const ds_attention_params *P, const ds_step_desc *st, int t) {
    int64_t p = st->tok_pos[t], lo = p - P->window + 1 < 0 ? 0 : p - P->window + 1;
    size_t n = (size_t)(p - lo + 1);
    if (P->sel)
        n += (size_t)P->n_sel[t];
    else if (P->ratio)
        n += (size_t)((p + 1) / P->ratio);
    return n;
}

/* A group's keys and scores take at most this much scratch (at least one
 * row's): the rows of a long context attend in groups, so memory does not
 * grow with T times the context. */
#define ATTN_GROUP_BYTES ((size_t)256 << 20)

int ds_cpu_attention(const ds_backend *be, const ds_attention_params *P, ds_err *err) {
    double t_start = be->profile ? ds_now() : 0;
    const ds_cpu *c = ds_cpu_of(be);
    const ds_step_desc *st = &c->step;
    int T = P->T, d = P->d, W = P->window;
    if (P->out_inv_freq && (P->out_rope_half < 0 || 2 * P->out_rope_half > d))
        return ds_fail(err, "cpu attention (layer %d): out_rope_half %d outside a head of %d", P->layer,
                       P->out_rope_half, d);
    size_t per_key = sizeof(float *) + (size_t)P->H * sizeof(float), most = 0;
    for (int t = 0; t < T; t++)
        if (n_keys(P, st, t) > most) most = n_keys(P, st, t);
    size_t cap = ATTN_GROUP_BYTES / per_key > most ? ATTN_GROUP_BYTES / per_key : most;
    size_t bytes = (size_t)(T + 1) * sizeof(size_t) + cap * per_key;
    char *buf = ds_cpu_scratch(be, DS_SCR_ATTN, bytes);
    if (!buf) return ds_fail(err, "cpu attention (layer %d): out of memory for %zu keys", P->layer, cap);
    size_t *key0 = (size_t *)buf;
    const float **keys = (const float **)(key0 + T + 1);
    float *scores = (float *)(keys + cap);
    for (int t0 = 0, t1; t0 < T; t0 = t1) {
        size_t total = 0;
        for (t1 = t0; t1 < T && total + n_keys(P, st, t1) <= cap; t1++) {
            int s = st->tok_seq[t1];
            const float *ring = st->seq_mem[s][P->layer].ring, *entries = st->seq_mem[s][P->layer].comp.entries;
            int64_t p = st->tok_pos[t1], lo = p - W + 1 < 0 ? 0 : p - W + 1, pos0 = st->seq_pos0[s];
            key0[t1 - t0] = total;
            const float **k = keys + total;
            for (int64_t pp = lo; pp <= p; pp++)
                *k++ = pp >= pos0 ? P->kv + (size_t)(st->seq_row0[s] + (pp - pos0)) * d : ring + (size_t)(pp % W) * d;
            if (P->sel) {
                for (int j = 0; j < P->n_sel[t1]; j++) *k++ = entries + (size_t)P->sel[(size_t)t1 * P->topk + j] * d;
            } else if (P->ratio) {
                int64_t nv = (p + 1) / P->ratio;
                for (int64_t j = 0; j < nv; j++) *k++ = entries + (size_t)j * d;
            }
            total = (size_t)(k - keys);
        }
        key0[t1 - t0] = total;
        ds_attention_params G = *P;
        G.q = P->q + (size_t)t0 * P->H * d, G.out = P->out + (size_t)t0 * P->H * d;
        attn_job J = {&G, keys, key0, scores, st->tok_pos + t0, c->path};
        ds_cpu_parallel_for(be, (t1 - t0) * P->H, attend_one, &J);
    }
    if (be->profile) be->profile->attend_seconds += ds_now() - t_start;
    return 0;
}

int ds_cpu_window_store(const ds_backend *be, const ds_window_store_params *p, ds_err *err) {
    (void)err;
    const ds_step_desc *st = &ds_cpu_of(be)->step;
    int W = p->window, d = p->d;
    for (int s = 0; s < st->n_seqs; s++) {
        float *ring = st->seq_mem[s][p->layer].ring;
        int n = st->seq_n[s], first = n > W ? n - W : 0;
        for (int i = first; i < n; i++)
            memcpy(ring + (size_t)((st->seq_pos0[s] + i) % W) * d, p->kv + (size_t)(st->seq_row0[s] + i) * d,
                   (size_t)d * sizeof(float));
    }
    return 0;
}
