/* synth.c — see synth.h. Values are a pure function of (seed, tensor index,
 * byte offset), so the same options always write the same bytes. */
#include "model/synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/safetensors.h"

enum { F_FP8, F_FP4, F_SCALE, F_BF16, F_F32, F_TID2EID };

typedef struct {
    ds_tensor_spec spec;
    int fill;
    float a, b; /* F_SCALE: the scale value; BF16/F32: mean a, half-width b */
    int shard;
} stensor;

typedef struct {
    stensor *t;
    int n, cap;
    char **names;
    const ds_config *cfg;
    const ds_synth_opts *o;
    int quant;
    double done_bytes, total_bytes;
    double next_report;
    int (*skip)(void *ctx, const char *name);
    void *skip_ctx;
} synth;

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int add(synth *S, int fill, float a, float b, ds_dtype dt, int ndim, int64_t d0, int64_t d1, const char *fmt,
               ...) __attribute__((format(printf, 9, 10)));
static int add(synth *S, int fill, float a, float b, ds_dtype dt, int ndim, int64_t d0, int64_t d1, const char *fmt,
               ...) {
    if (S->n == S->cap) {
        int cap = S->cap ? 2 * S->cap : 1024;
        stensor *t = realloc(S->t, (size_t)cap * sizeof *t);
        char **nm = realloc(S->names, (size_t)cap * sizeof *nm);
        if (t) S->t = t;
        if (nm) S->names = nm;
        if (!t || !nm) return -1;
        S->cap = cap;
    }
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    S->names[S->n] = strdup(buf);
    if (!S->names[S->n]) return -1;
    stensor *t = &S->t[S->n++];
    memset(t, 0, sizeof *t);
    t->spec.name = S->names[S->n - 1];
    t->spec.dtype = dt;
    t->spec.ndim = ndim;
    t->spec.shape[0] = d0;
    t->spec.shape[1] = d1;
    t->fill = fill;
    t->a = a;
    t->b = b;
    return 0;
}

/* A linear layer: FP8 with block scales (quantized) or BF16, std ~ 1/sqrt(in). */
static int linear(synth *S, int fp8, int rows, int cols, const char *prefix) {
    float std = 1.0f / sqrtf((float)cols);
    if (S->quant && fp8) {
        /* FP8 codes are drawn with exponents 5..8 (|v| in [0.25, 3.75], E[v^2] ~ 2.4) */
        float sc = ldexpf(1.0f, (int)lrintf(log2f(std / sqrtf(2.4f))));
        return add(S, F_FP8, 0, 0, DS_F8_E4M3, 2, rows, cols, "%s.weight", prefix) ||
               add(S, F_SCALE, sc, 0, DS_F8_E8M0, 2, (rows + 127) / 128, (cols + 127) / 128, "%s.scale", prefix);
    }
    return add(S, F_BF16, 0, std * 1.7320508f, DS_BF16, 2, rows, cols, "%s.weight", prefix);
}

static int expert_w(synth *S, int rows, int cols, const char *prefix) {
    if (!S->quant) return linear(S, 0, rows, cols, prefix);
    /* uniform E2M1 codes: E[v^2] = 8.6 */
    float sc = ldexpf(1.0f, (int)lrintf(log2f(1.0f / sqrtf((float)cols * 8.6f))));
    return add(S, F_FP4, 0, 0, DS_I8, 2, rows, cols / 2, "%s.weight", prefix) ||
           add(S, F_SCALE, sc, 0, DS_F8_E8M0, 2, rows, cols / 32, "%s.scale", prefix);
}

static int compressor(synth *S, const char *pfx, const char *sub, int ratio, int d, int c) {
    const ds_config *g = S->cfg;
    char p[128];
    snprintf(p, sizeof p, "%s.attn.%s", pfx, sub);
    char q[160];
    snprintf(q, sizeof q, "%s.wkv", p);
    if (linear(S, 0, c * d, g->dim, q)) return -1;
    snprintf(q, sizeof q, "%s.wgate", p);
    if (linear(S, 0, c * d, g->dim, q)) return -1;
    return add(S, F_F32, 0, 0.5f, DS_F32, 2, ratio, c * d, "%s.ape", p) ||
           add(S, F_F32, 1, 0.1f, DS_F32, 1, d, 0, "%s.norm.weight", p);
}

/* One V4 layer named "<pfx>.*" with compress ratio `ratio`; li: its index
 * (the hash layers come first; the MTP block's layer: n_layers). */
static int layer_tensors(synth *S, const char *pfx, int li, int ratio) {
    const ds_config *c = S->cfg;
    int D = c->dim, n = c->hc_mult, hcr = (2 + n) * n, H = c->n_heads, d = c->head_dim;
    float hstd = 1.0f / sqrtf((float)(n * D));
    char p[160];
    if (add(S, F_F32, 1, 0.1f, DS_F32, 1, D, 0, "%s.attn_norm.weight", pfx) ||
        add(S, F_F32, 1, 0.1f, DS_F32, 1, D, 0, "%s.ffn_norm.weight", pfx))
        return -1;
    const char *site[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; s++)
        if (add(S, F_F32, 0, hstd * 1.7f, DS_F32, 2, hcr, (int64_t)n * D, "%s.hc_%s_fn", pfx, site[s]) ||
            add(S, F_F32, 0, 0.5f, DS_F32, 1, hcr, 0, "%s.hc_%s_base", pfx, site[s]) ||
            add(S, F_F32, 1, 0.5f, DS_F32, 1, 3, 0, "%s.hc_%s_scale", pfx, site[s]))
            return -1;
    snprintf(p, sizeof p, "%s.attn.wq_a", pfx);
    if (linear(S, 1, c->q_lora_rank, D, p)) return -1;
    if (add(S, F_F32, 1, 0.1f, DS_F32, 1, c->q_lora_rank, 0, "%s.attn.q_norm.weight", pfx)) return -1;
    snprintf(p, sizeof p, "%s.attn.wq_b", pfx);
    if (linear(S, 1, H * d, c->q_lora_rank, p)) return -1;
    snprintf(p, sizeof p, "%s.attn.wkv", pfx);
    if (linear(S, 1, d, D, p)) return -1;
    if (add(S, F_F32, 1, 0.1f, DS_F32, 1, d, 0, "%s.attn.kv_norm.weight", pfx)) return -1;
    snprintf(p, sizeof p, "%s.attn.wo_a", pfx);
    if (linear(S, 1, c->o_groups * c->o_lora_rank, H * d / c->o_groups, p)) return -1;
    snprintf(p, sizeof p, "%s.attn.wo_b", pfx);
    if (linear(S, 1, D, c->o_groups * c->o_lora_rank, p)) return -1;
    if (add(S, F_F32, 0, 1.0f, DS_F32, 1, H, 0, "%s.attn.attn_sink", pfx)) return -1;
    if (ratio) {
        int csa = ratio == 4;
        if (compressor(S, pfx, "compressor", ratio, d, csa ? 2 : 1)) return -1;
        if (csa) {
            snprintf(p, sizeof p, "%s.attn.indexer.wq_b", pfx);
            if (linear(S, 1, c->index_n_heads * c->index_head_dim, c->q_lora_rank, p)) return -1;
            snprintf(p, sizeof p, "%s.attn.indexer.weights_proj", pfx);
            if (linear(S, 0, c->index_n_heads, D, p)) return -1;
            if (compressor(S, pfx, "indexer.compressor", ratio, c->index_head_dim, 2)) return -1;
        }
    }
    snprintf(p, sizeof p, "%s.ffn.gate", pfx);
    if (linear(S, 0, c->n_routed_experts, D, p)) return -1;
    if (li < c->n_hash_layers) {
        if (add(S, F_TID2EID, 0, 0, DS_I64, 2, c->vocab_size, c->n_active_experts, "%s.ffn.gate.tid2eid", pfx))
            return -1;
    } else if (add(S, F_F32, 0, 0.1f, DS_F32, 1, c->n_routed_experts, 0, "%s.ffn.gate.bias", pfx)) {
        return -1;
    }
    int I = c->moe_inter_dim;
    for (int e = 0; e < c->n_routed_experts; e++) {
        const int wr[3] = {I, D, I}, wc[3] = {D, I, D};
        for (int w = 0; w < 3; w++) {
            snprintf(p, sizeof p, "%s.ffn.experts.%d.w%d", pfx, e, w + 1);
            if (expert_w(S, wr[w], wc[w], p)) return -1;
        }
    }
    int IS = I * (c->n_shared_experts > 1 ? c->n_shared_experts : 1);
    if (c->n_shared_experts > 0) {
        const int wr[3] = {IS, D, IS}, wc[3] = {D, IS, D};
        for (int w = 0; w < 3; w++) {
            snprintf(p, sizeof p, "%s.ffn.shared_experts.w%d", pfx, w + 1);
            if (linear(S, 1, wr[w], wc[w], p)) return -1;
        }
    }
    return 0;
}

static int enumerate(synth *S) {
    const ds_config *c = S->cfg;
    int D = c->dim, n = c->hc_mult;
    float hstd = 1.0f / sqrtf((float)(n * D));
    if (add(S, F_BF16, 0, 1.7f, DS_BF16, 2, c->vocab_size, D, "embed.weight")) return -1;
    for (int li = 0; li < c->n_layers; li++) {
        char pfx[32];
        snprintf(pfx, sizeof pfx, "layers.%d", li);
        if (layer_tensors(S, pfx, li, c->compress_ratio[li])) return -1;
    }
    if (add(S, F_F32, 1, 0.1f, DS_F32, 1, D, 0, "norm.weight") ||
        add(S, F_F32, 0, hstd * 1.7f, DS_F32, 2, n, (int64_t)n * D, "hc_head_fn") ||
        add(S, F_F32, 0, 0.5f, DS_F32, 1, n, 0, "hc_head_base") ||
        add(S, F_F32, 1, 0.5f, DS_F32, 1, 1, 0, "hc_head_scale"))
        return -1;
    if (add(S, F_BF16, 0, 1.7320508f / sqrtf((float)D), DS_BF16, 2, c->vocab_size, D, "head.weight")) return -1;
    if (S->o->mtp && c->n_mtp > 0) { /* the MTP block as published: its layer sliding only */
        if (add(S, F_F32, 1, 0.1f, DS_F32, 1, D, 0, "mtp.0.enorm.weight") ||
            add(S, F_F32, 1, 0.1f, DS_F32, 1, D, 0, "mtp.0.hnorm.weight") || linear(S, 1, D, D, "mtp.0.e_proj") ||
            linear(S, 1, D, D, "mtp.0.h_proj") || add(S, F_F32, 1, 0.1f, DS_F32, 1, D, 0, "mtp.0.norm.weight") ||
            add(S, F_F32, 0, hstd * 1.7f, DS_F32, 2, n, (int64_t)n * D, "mtp.0.hc_head_fn") ||
            add(S, F_F32, 0, 0.5f, DS_F32, 1, n, 0, "mtp.0.hc_head_base") ||
            add(S, F_F32, 1, 0.5f, DS_F32, 1, 1, 0, "mtp.0.hc_head_scale") || layer_tensors(S, "mtp.0", c->n_layers, 0))
            return -1;
    }
    return 0;
}

static uint64_t spec_bytes(const ds_tensor_spec *s) {
    uint64_t n = ds_dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) n *= (uint64_t)s->shape[i];
    return n;
}

static float unif(uint64_t r) { return (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

/* bytes [offset, offset + len) of tensor t into buf: 8 bytes from one draw
 * (FP8, FP4: offset a multiple of 8, as every chunk and span is) or each
 * element from its own (BF16, F32, tid2eid); scales are one value */
static void fill_span(const synth *S, const stensor *t, uint64_t key, uint64_t offset, uint8_t *buf, uint64_t len) {
    if (t->fill == F_SCALE) {
        memset(buf, 127 + ilogbf(t->a), len);
        return;
    }
    if (t->fill == F_FP4 || t->fill == F_FP8) {
        for (uint64_t i = 0; i < len; i += 8) {
            uint64_t r = mix64(key ^ ((offset + i) >> 3));
            uint8_t b[8];
            memcpy(b, &r, 8);
            uint64_t m = len - i < 8 ? len - i : 8;
            if (t->fill == F_FP8) /* sign, exponent 5..8, mantissa */
                for (uint64_t j = 0; j < 8; j++) b[j] = (uint8_t)((b[j] & 0x80) | ((5 + ((b[j] >> 3) & 3)) << 3) | (b[j] & 7));
            memcpy(buf + i, b, m);
        }
        return;
    }
    uint64_t esz = ds_dtype_size(t->spec.dtype);
    for (uint64_t i = 0; i < len; i++) {
        uint64_t pos = offset + i, el = pos / esz; /* element index: regenerate per element */
        uint64_t re = mix64(key ^ (el | 0x8000000000000000ull));
        uint8_t *o = buf + i;
        if (t->fill == F_TID2EID) {
            int k = S->cfg->n_active_experts, E = S->cfg->n_routed_experts;
            int64_t tok = (int64_t)(el / (uint64_t)k), slot = (int64_t)(el % (uint64_t)k);
            /* k distinct experts per token: a rotation by a token-dependent offset */
            int64_t base = (int64_t)(mix64(key ^ (uint64_t)tok) % (uint64_t)E);
            int64_t step = E > k ? 1 + (int64_t)(mix64(key + (uint64_t)tok) % (uint64_t)(E / k)) : 1;
            int64_t v = (base + slot * step) % E;
            *o = (uint8_t)((uint64_t)v >> (8 * (pos % 8)));
        } else {
            float f = t->a + t->b * unif(re);
            uint32_t u;
            memcpy(&u, &f, 4);
            *o = t->fill == F_BF16 ? (uint8_t)((u >> 16) >> (8 * (pos % 2))) : (uint8_t)(u >> (8 * (pos % 4)));
        }
    }
}

/* The writer's fill: a chunk in spans of FILL_SPAN bytes over the threads
 * (each byte is a function of the seed, the tensor and its offset alone, so
 * the bytes do not depend on the split). */
#define FILL_SPAN ((uint64_t)1 << 20)
static int fill(void *ctx, int index, uint64_t offset, uint8_t *buf, uint64_t len, ds_err *err) {
    synth *S = ctx;
    (void)err;
    const stensor *t = &S->t[index];
    if (offset == 0 && S->skip && S->skip(S->skip_ctx, t->spec.name)) {
        S->done_bytes += (double)spec_bytes(&t->spec);
        return 1;
    }
    uint64_t key = mix64(S->o->seed * 0x100000001b3ull + (uint64_t)index);
    long nspan = (long)((len + FILL_SPAN - 1) / FILL_SPAN);
#pragma omp parallel for schedule(static) if (nspan > 1)
    for (long k = 0; k < nspan; k++) {
        uint64_t o = (uint64_t)k * FILL_SPAN, n = len - o < FILL_SPAN ? len - o : FILL_SPAN;
        fill_span(S, t, key, offset + o, buf + o, n);
    }
    S->done_bytes += (double)len;
    if (S->o->progress && S->total_bytes > 1e9 && S->done_bytes >= S->next_report) {
        fprintf(stderr, "\rdsv4 synth: %.2f / %.2f GB", S->done_bytes / 1e9, S->total_bytes / 1e9);
        S->next_report = S->done_bytes + S->total_bytes / 100;
    }
    return 0;
}

int ds_synth_like(const char *name, ds_config *c, ds_err *err) {
    ds_config_flash(c);
    if (!strcmp(name, "flash")) return 0;
    if (!strcmp(name, "pro")) {
        c->dim = 7168, c->n_layers = 61, c->n_heads = 128, c->q_lora_rank = 1536, c->o_groups = 16;
        c->n_routed_experts = 384, c->moe_inter_dim = 3072, c->index_topk = 1024;
        for (int i = 0; i < c->n_layers; i++) c->compress_ratio[i] = i < 2 ? 128 : (i % 2 ? 128 : 4);
        return 0;
    }
    if (!strcmp(name, "tiny")) {
        c->vocab_size = 1024, c->dim = 256, c->n_layers = 4, c->n_heads = 4, c->head_dim = 128, c->rope_dim = 32;
        c->q_lora_rank = 128, c->o_groups = 2, c->o_lora_rank = 128, c->n_routed_experts = 8;
        c->n_active_experts = 2, c->moe_inter_dim = 128, c->n_hash_layers = 1, c->window = 32;
        c->index_n_heads = 16, c->index_head_dim = 128, c->index_topk = 8;
        const int r[4] = {0, 4, 128, 4};
        for (int i = 0; i < 4; i++) c->compress_ratio[i] = r[i];
        return 0;
    }
    return ds_fail(err, "--like: unknown shape '%s' (flash, pro or tiny)", name);
}

int ds_synth_write(const ds_config *cfg, const ds_synth_opts *o, const char *dir, ds_err *err) {
    return ds_synth_write_only(cfg, o, dir, NULL, NULL, err);
}

uint64_t ds_synth_bytes(const ds_config *cfg, const ds_synth_opts *o, int (*skip)(void *ctx, const char *name),
                        void *ctx) {
    ds_err err;
    if (ds_config_validate(cfg, "synth config", &err)) return 0;
    synth S = {0};
    S.cfg = cfg;
    S.o = o;
    S.quant = o->quantized;
    uint64_t bytes = 0;
    if (!enumerate(&S))
        for (int i = 0; i < S.n; i++)
            if (!skip || !skip(ctx, S.t[i].spec.name)) bytes += spec_bytes(&S.t[i].spec);
    for (int i = 0; i < S.n; i++) free(S.names[i]);
    free(S.names);
    free(S.t);
    return bytes;
}

int ds_synth_write_only(const ds_config *cfg, const ds_synth_opts *o, const char *dir,
                        int (*skip)(void *ctx, const char *name), void *ctx, ds_err *err) {
    if (ds_config_validate(cfg, "synth config", err)) return -1;
    if (mkdir(dir, 0777) && errno != EEXIST) return ds_fail(err, "%s: cannot create directory: %s", dir, strerror(errno));
    synth S = {0};
    S.skip = skip;
    S.skip_ctx = ctx;
    S.cfg = cfg;
    S.o = o;
    S.quant = o->quantized;
    int rc = -1;
    char path[2048];
    const char **files = NULL, **names = NULL;
    if (enumerate(&S)) {
        ds_fail(err, "out of memory");
        goto done;
    }
    /* shard assignment */
    int nshards = 1;
    uint64_t acc = 0;
    for (int i = 0; i < S.n; i++) {
        uint64_t b = spec_bytes(&S.t[i].spec);
        S.total_bytes += (double)b;
        if (acc > 0 && acc + b > o->shard_bytes) nshards++, acc = 0;
        acc += b;
        S.t[i].shard = nshards - 1;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ds_config_write(cfg, path, err)) goto done;
    ds_tensor_spec *specs = malloc((size_t)S.n * sizeof *specs);
    files = malloc((size_t)S.n * sizeof *files);
    names = malloc((size_t)S.n * sizeof *names);
    char(*fname)[64] = malloc((size_t)nshards * sizeof *fname);
    if (!specs || !files || !names || !fname) {
        free(specs);
        free(fname);
        ds_fail(err, "out of memory");
        goto done;
    }
    for (int s = 0; s < nshards; s++) snprintf(fname[s], 64, "model-%05d-of-%05d.safetensors", s + 1, nshards);
    int failed = 0;
    for (int s = 0, i = 0; s < nshards && !failed; s++) {
        int first = i, cnt = 0;
        while (i < S.n && S.t[i].shard == s) specs[cnt++] = S.t[i++].spec;
        /* fill() indexes S.t: shift by the shard's first tensor */
        synth sub = S;
        sub.t = S.t + first;
        snprintf(path, sizeof path, "%s/%s", dir, fname[s]);
        failed = ds_safetensors_write(path, specs, cnt, fill, &sub, err) != 0;
        S.done_bytes = sub.done_bytes;
        S.next_report = sub.next_report;
    }
    for (int i = 0; i < S.n; i++) {
        names[i] = S.t[i].spec.name;
        files[i] = fname[S.t[i].shard];
    }
    if (!failed) failed = ds_index_write(dir, names, files, S.n, err) != 0;
    if (o->progress && S.total_bytes > 1e9) fprintf(stderr, "\n");
    free(specs);
    free(fname);
    rc = failed ? -1 : 0;
done:
    for (int i = 0; i < S.n; i++) free(S.names[i]);
    free(S.names);
    free(S.t);
    free(files);
    free(names);
    return rc;
}
