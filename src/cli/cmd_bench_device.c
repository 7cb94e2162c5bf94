/* cmd_bench_device.c — `dsv4 bench --backend cuda`: prefill and decode speed
 * on a device backend, next to the device's copy bandwidth measured in the
 * same run (the HBM floor of a memory-bound decode).
 *
 * Decode at batch B reads the dense weights once per step and each distinct
 * routed expert once: the expected number of distinct experts of a layer is
 * E * (1 - (1 - k/E)^B) (docs/design.md §3) — used here instead of counting the
 * routed experts, which would need a host sync inside every layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/forward.h"
#include "runtime/model_load.h"

/* Device copy bandwidth (GB/s, bytes read + written), best of 5 copies of 1 GiB. */
static double copy_bandwidth(const ds_backend *be, ds_err *err) {
    size_t n = (size_t)1 << 30;
    char *a = be->alloc(be, 2 * n, err);
    if (!a) return -1;
    double best = 0;
    if (be->memset0(be, a, 2 * n, err) || be->copy(be, a + n, a, n, err)) best = -1;
    for (int rep = 0; rep < 5 && best >= 0; rep++) {
        double t0 = ds_now();
        if (be->copy(be, a + n, a, n, err)) {
            best = -1;
            break;
        }
        double g = 2.0 * (double)n / (ds_now() - t0) / 1e9;
        if (g > best) best = g;
    }
    be->free(be, a);
    return best;
}

/* Weight bytes of one decode step of B sequences (see the top comment). */
static double step_bytes(const ds_model *m, int B) {
    const ds_config *c = &m->cfg;
    double b = (double)ds_model_decode_bytes(m), E = c->n_routed_experts, k = c->n_active_experts;
    double distinct = E * (1.0 - pow(1.0 - k / E, (double)B));
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        double e1 = (double)(ds_weight_bytes(&ly->w1[0]) + ds_weight_bytes(&ly->w2[0]) + ds_weight_bytes(&ly->w3[0]));
        b += e1 * (distinct - k);
    }
    return b;
}

/* Multiply-adds per token: every weight read by one token (k experts). */
static double token_flops(const ds_model *m) {
    const ds_config *c = &m->cfg;
    double f = 0;
    f += 2.0 * m->head.rows * (double)m->head.cols;
    for (int li = 0; li < c->n_layers; li++) {
        const ds_layer *ly = &m->layers[li];
        const ds_weight *ws[] = {&ly->wq_a, &ly->wq_b, &ly->wkv, &ly->wo_a, &ly->wo_b, &ly->gate, &ly->sw1, &ly->sw2,
                                 &ly->sw3, &ly->hc_attn.fn, &ly->hc_ffn.fn};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) f += 2.0 * ws[i]->rows * (double)ws[i]->cols;
        f += 2.0 * c->n_active_experts *
             (3.0 * (double)ly->w1[0].rows * (double)ly->w1[0].cols);
    }
    return f;
}

int cmd_bench_device(const char *dir, const ds_backend_opts *bo, long long prompt, long long gen, const int32_t *batches,
                     int n_batches, int batch_profile, int mtp) {
    ds_model *m = NULL;
    ds_backend be = {0};
    ds_err err = {{0}};
    int rc = 1;
    int32_t *toks = NULL;
    float *logits = NULL;
    ds_seq *seq = NULL;
    if (ds_load_model(dir, NULL, &m, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        return 1;
    }
    double t_up = ds_now();
    m->bind_mtp = mtp > 0;
    int brc = cli_bind("bench", m, bo, &be);
    if (brc) {
        rc = cli_bind_done(brc);
        goto out;
    }
    t_up = ds_now() - t_up;
    const ds_config *c = &m->cfg;
    int V = c->vocab_size;
    toks = malloc((size_t)(prompt + gen) * sizeof *toks);
    logits = toks ? ds_host_alloc(&be, (size_t)V * sizeof *logits, &err) : NULL;
    if (!toks || !logits || ds_seq_new(m, prompt + 2 * gen + 1, &seq, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", toks ? err.msg : "out of memory");
        goto out;
    }
    uint64_t x = 88172645463325252ull;
    for (long long i = 0; i < prompt + gen; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)V);
    }
    printf("model      %s: hidden %d, %d layers, %d experts (%d active), vocab %d\n", dir, c->dim, c->n_layers,
           c->n_routed_experts, c->n_active_experts, V);
    printf("backend    %s (device %d); weights uploaded in %.1f s\n", be.name, bo->gpu, t_up);
    double bw = copy_bandwidth(&be, &err);
    if (bw < 0) goto fail;
    printf("memory     device copy bandwidth %.0f GB/s (1 GiB, read + written, best of 5): the floor\n", bw);
    fflush(stdout);
    /* warm-up: two steps' worth of the prompt (kernels loaded, the arena at its size) */
    long long warm = prompt < 2 * DS_STEP_TOKENS ? prompt : 2 * DS_STEP_TOKENS;
    ds_batch_item it = {seq, toks, (int)warm, logits, 0, NULL, NULL};
    if (ds_forward(m, &be, &it, 1, &err)) goto fail;
    ds_seq_reset(seq);
    uint64_t free0 = be.avail ? be.avail(&be) : 0;
    it.n_tokens = (int)prompt;
    cli_tiers_report(NULL, NULL, m, 0);
    double t0 = ds_now();
    if (ds_forward(m, &be, &it, 1, &err)) goto fail;
    double tp = ds_now() - t0, fl = token_flops(m);
    printf("prefill    %lld tokens in %.2f ms: %.0f tokens/s, %.2f TFLOP/s (%.2f GFLOP per token at a short context; "
           "steps of %d tokens)\n",
           prompt, tp * 1e3, (double)prompt / tp, fl * (double)prompt / tp / 1e12, fl / 1e9, DS_STEP_TOKENS);
    cli_tiers_report(stdout, "tiers      prefill: ", m, 1);
    if (free0)
        printf("memory     %.2f GB of weights; the sequence's state %.3f GB (capacity %lld tokens); %.2f GB free "
               "after the prefill (%.2f GB more scratch than after the warm-up)\n",
               m->weight_bytes / 1e9, ds_seq_bytes(m, prompt + 2 * gen + 1) / 1e9, prompt + 2 * gen + 1,
               be.avail(&be) / 1e9, ((double)free0 - (double)be.avail(&be)) / 1e9);
    t0 = ds_now();
    for (long long g = 0; g < gen; g++) {
        ds_batch_item d = {seq, toks + prompt + g, 1, logits, 0, NULL, NULL};
        if (ds_forward(m, &be, &d, 1, &err)) goto fail;
    }
    double td = (ds_now() - t0) / (double)gen, bytes = (double)ds_model_decode_bytes(m);
    printf("decode     batch 1, %lld tokens: %.3f ms/token (%.4f ms per layer), %.1f tokens/s, weights %.3f GB/token "
           "-> %.0f GB/s, %.2f of the floor (%.4f ms per layer at the floor)\n",
           gen, td * 1e3, td * 1e3 / c->n_layers, 1.0 / td, bytes / 1e9, bytes / td / 1e9, bytes / td / 1e9 / bw,
           bytes / (bw * 1e9) * 1e3 / c->n_layers);
    cli_tiers_report(stdout, "tiers      decode: ", m, (double)gen);
    fflush(stdout);
    {
        /* where the time goes: the same decode again with the backend's
         * profile on (it synchronizes around the accounted ops) */
        ds_profile prof;
        memset(&prof, 0, sizeof prof);
        be.profile = &prof;
        double tw = ds_now();
        for (long long g = 0; g < gen; g++) {
            ds_batch_item d = {seq, toks + prompt + g, 1, logits, 0, NULL, NULL};
            if (ds_forward(m, &be, &d, 1, &err)) {
                be.profile = NULL;
                goto fail;
            }
        }
        tw = (ds_now() - tw) / (double)gen;
        be.profile = NULL;
        bench_print_profile("where      per token (profiled, ops synchronized):", &prof, (double)gen, tw);
        cli_tiers_report(NULL, NULL, m, 0);
        fflush(stdout);
    }
    if (batch_profile) {
        /* the prefill once more, profiled */
        ds_profile prof;
        memset(&prof, 0, sizeof prof);
        ds_seq_reset(seq);
        be.profile = &prof;
        double tw = ds_now();
        int frc = ds_forward(m, &be, &it, 1, &err);
        tw = ds_now() - tw;
        be.profile = NULL;
        if (frc) goto fail;
        bench_print_profile("where      prefill (profiled, ops synchronized):", &prof, 1.0, tw);
        cli_tiers_report(NULL, NULL, m, 0);
        fflush(stdout);
    }
    if (mtp && bench_mtp(m, &be, toks, prompt, gen, mtp, &err)) goto fail;
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        double t_b = 0;
        int ok = bench_batch_decode(m, &be, B, prompt, gen, toks, NULL, NULL, NULL, NULL, &t_b, &err) == 0;
        double bb = step_bytes(m, B);
        if (ok)
            printf("batch %-4d decode %lld steps: %.3f ms/step, %.0f tokens/s, ~%.3f GB/step -> %.0f GB/s (%.2f of the "
                   "floor), %.2f TFLOP/s\n",
                   B, gen, t_b / gen * 1e3, B * gen / t_b, bb / 1e9, bb * gen / t_b / 1e9, bb * gen / t_b / 1e9 / bw,
                   fl * B * gen / t_b / 1e12);
        else
            fprintf(stderr, "dsv4 bench: batch %d: %s\n", B, err.msg);
        if (ok) {
            char label[64];
            snprintf(label, sizeof label, "tiers      batch %d (prefill and decode): ", B);
            cli_tiers_report(stdout, label, m, (double)gen);
        }
        fflush(stdout);
        if (!ok) goto out;
        if (batch_profile && bench_batch_profile(m, &be, B, prompt, gen, toks, &err)) goto fail;
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dsv4 bench: %s\n", err.msg);
out:
    free(toks);
    ds_host_free(&be, logits);
    ds_seq_free(seq);
    ds_model_free(m);
    ds_backend_close(&be);
    return rc;
}
