/* test_intermediates.c — the named intermediates of the observer's tensor
 * hook (forward.h) against the transformers oracle's, layer by layer: the
 * fixtures' reference.safetensors holds, for sequence 0 at 8 positions, each
 * decoder layer's attention output (DeepseekV4Attention), MoE output
 * (DeepseekV4SparseMoeBlock) and residual streams after the layer
 * (DeepseekV4DecoderLayer) — our "attn_out", "ffn_out" and "ffn_res".
 * Tolerance 1e-4 absolute, as for the logits (which agree to ~6e-6; the
 * intermediates are of the same magnitude, fp32 on both sides). Also checks
 * that every name of the list arrives for every layer, in order, and that the
 * "logits" intermediate is bitwise the logits the step returns. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "model/forward.h"
#include "testutil.h"

#define TOL 1e-4

static const char *const per_layer[] = {"attn_in", "attn_norm", "q",       "kv",       "attn_o",  "attn_out",
                                        "attn_res", "ffn_in",   "ffn_norm", "ffn_out", "ffn_res"};
enum { N_PER_LAYER = sizeof per_layer / sizeof per_layer[0] };

typedef struct {
    const ds_checkpoint *ref;
    const int32_t *pos; /* the oracle's debug positions */
    int n_pos, next, order_ok, n_layers, V;
    double maxd[3];     /* attn_out, ffn_out, ffn_res */
    int compared[3];
    float *logits;      /* the "logits" intermediate */
} probe;

static void on_tensor(void *ctx, const char *name, int layer, const float *x, int rows, int cols) {
    probe *P = ctx;
    /* expected order: embed, the per-layer list for each layer, then the head's */
    int idx = P->next++;
    const char *want = idx == 0 ? "embed"
                       : idx <= P->n_layers * N_PER_LAYER ? per_layer[(idx - 1) % N_PER_LAYER]
                       : idx == P->n_layers * N_PER_LAYER + 1 ? "head_in"
                       : idx == P->n_layers * N_PER_LAYER + 2 ? "final_norm"
                                                              : "logits";
    int want_layer = idx == 0 || idx > P->n_layers * N_PER_LAYER ? -1 : (idx - 1) / N_PER_LAYER;
    if (strcmp(name, want) || layer != want_layer) P->order_ok = 0;
    if (!strcmp(name, "logits")) memcpy(P->logits, x, sizeof(float) * (size_t)rows * cols);
    const char *oracle[3] = {"attn_out", "ffn_out", "ffn_res"}, *theirs[3] = {"attn_out", "ffn_out", "hidden"};
    for (int k = 0; k < 3; k++) {
        if (strcmp(name, oracle[k]) || layer < 0) continue;
        char tn[64];
        snprintf(tn, sizeof tn, "debug.%s.%d", theirs[k], layer);
        const ds_tensor *t = ds_checkpoint_find(P->ref, tn);
        if (!t) continue;
        const float *r = (const float *)(const void *)t->data;
        for (int i = 0; i < P->n_pos; i++) {
            if (P->pos[i] >= rows) continue;
            for (int c = 0; c < cols; c++) {
                double d = fabs((double)x[(size_t)P->pos[i] * cols + c] - (double)r[(size_t)i * cols + c]);
                if (d > P->maxd[k] || isnan(d)) P->maxd[k] = isnan(d) ? (double)INFINITY : d;
            }
        }
        P->compared[k]++;
    }
}

static void fixture(const char *name) {
    char dir[1024], path[1200];
    test_path(dir, sizeof dir, "tests/fixtures/");
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    ds_model *m;
    ds_backend be;
    ds_err err;
    if (test_load(dir, 2, &m, &be, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ds_checkpoint *ck;
    if (ds_checkpoint_open(path, &ck, &err)) {
        CHECK(0, "%s", err.msg);
        test_unload(m, &be);
        return;
    }
    const ds_tensor *pt = ds_checkpoint_find(ck, "debug.positions"), *tt = ds_checkpoint_find(ck, "tokens.0");
    CHECK(pt && tt, "%s: reference lacks debug.positions / tokens.0", name);
    if (pt && tt) {
        int L = (int)tt->shape[0], V = m->cfg.vocab_size;
        probe P = {ck, (const int32_t *)(const void *)pt->data, (int)pt->shape[0], 0, 1, m->cfg.n_layers, V, {0}, {0},
                   malloc(sizeof(float) * (size_t)L * V)};
        float *logits = malloc(sizeof(float) * (size_t)L * V);
        ds_seq *s;
        CHECK(ds_seq_new(m, L, &s, &err) == 0, "%s", err.msg);
        ds_observer obs = {NULL, on_tensor, &P, NULL};
        ds_batch_item it = {s, (const int32_t *)(const void *)tt->data, L, logits, 1, NULL, NULL};
        CHECK(ds_forward_observed(m, &be, &it, 1, &obs, &err) == 0, "%s", err.msg);
        CHECK(P.order_ok && P.next == 1 + P.n_layers * N_PER_LAYER + 3, "%s: %d intermediates, names or order differ",
              name, P.next);
        CHECK(!memcmp(P.logits, logits, sizeof(float) * (size_t)L * V), "%s: the 'logits' intermediate differs", name);
        const char *what[3] = {"attn_out", "ffn_out", "ffn_res (hidden)"};
        for (int k = 0; k < 3; k++) {
            printf("%s %-16s %d layers x %d positions, max |ours - oracle| = %.3g\n", name, what[k], P.compared[k],
                   P.n_pos, P.maxd[k]);
            CHECK(P.compared[k] == m->cfg.n_layers, "%s %s: %d layers compared", name, what[k], P.compared[k]);
            CHECK(P.maxd[k] <= TOL, "%s %s: max |diff| %g > %g", name, what[k], P.maxd[k], TOL);
        }
        ds_seq_free(s);
        free(logits);
        free(P.logits);
    }
    ds_checkpoint_close(ck);
    test_unload(m, &be);
}

int main(void) {
    fixture("tiny");
    fixture("q128");
    fixture("q16e");
    fixture("q32e");
    return test_summary("intermediates");
}
