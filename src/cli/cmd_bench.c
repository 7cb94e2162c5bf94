/* cmd_bench.c — `dsv4 bench -m DIR`: prefill and decode speed on the CPU,
 * next to this machine's read bandwidth measured in the same run.
 *
 * Decode at batch 1 is memory-bound: every token reads the attention and
 * shared-expert weights, k routed experts per layer, the head and one
 * embedding row. The floor is those bytes / the measured read bandwidth. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/forward.h"

/* Best-of-5 read bandwidth over a 1 GiB buffer with n threads (GB/s). */
static double read_bandwidth(int threads) {
    size_t n = (size_t)1 << 30;
    float *buf = aligned_alloc(64, n);
    if (!buf) return 0;
    memset(buf, 1, n);
    size_t nf = n / sizeof(float);
    double best = 0, sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = cli_now(), s = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : s) schedule(static)
        for (size_t blk = 0; blk < nf / 4096; blk++) {
            const float *p = buf + blk * 4096;
#ifdef __AVX2__
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < 4096; i += 32) {
                a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
                a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
                a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
                a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
            }
            float t[8];
            _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            s += t[0] + t[7];
#else
            for (int i = 0; i < 4096; i++) s += p[i];
#endif
        }
        double dt = cli_now() - t0;
        sink += s;
        if ((double)n / dt / 1e9 > best) best = (double)n / dt / 1e9;
    }
    free(buf);
    return sink == -1 ? 0 : best;
}

/* Touches every page of every tensor so that no timed step waits on the disk
 * or on page faults (the model must fit in memory for a decode benchmark). */
static double prefault(const ds_checkpoint *ck) {
    volatile uint8_t sink = 0;
    double bytes = 0;
    for (int i = 0; i < ds_checkpoint_count(ck); i++) {
        const ds_tensor *t = ds_checkpoint_at(ck, i);
        for (uint64_t o = 0; o < t->nbytes; o += 4096) sink ^= t->data[o];
        bytes += (double)t->nbytes;
    }
    (void)sink;
    return bytes;
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 bench -m DIR [--prompt P] [--gen N] [--threads N]\n"
               "  prefill P tokens (default 128), then decode N tokens (default 16) at batch 1;\n"
               "  prints tokens/s, weight GB/s per decoded token, the measured read bandwidth and the ratio.\n");
}

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL;
    long long prompt = 128, gen = 16, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v) {
            dir = v;
        } else if (!strcmp(a, "--prompt") && v) {
            bad = cli_parse_int(a, v, 1, 1 << 20, &prompt);
        } else if (!strcmp(a, "--gen") && v) {
            bad = cli_parse_int(a, v, 1, 1 << 20, &gen);
        } else if (!strcmp(a, "--threads") && v) {
            bad = cli_parse_int(a, v, 1, 1024, &threads);
        } else {
            fprintf(stderr, "dsv4 bench: unknown or incomplete option '%s'\n", a);
            bad = 1;
        }
        if (bad) {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    ds_model *m;
    ds_err err;
    if (ds_model_load(dir, &m, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        return 1;
    }
    ds_backend be;
    ds_backend_cpu_init(&be, (int)threads);
    const ds_config *c = &m->cfg;
    int V = c->vocab_size, rc = 1;
    int32_t *toks = malloc((size_t)(prompt + gen) * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    ds_seq *seq = NULL;
    if (!toks || !logits || ds_seq_new(m, prompt + gen + 1, &seq, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", toks && logits ? err.msg : "out of memory");
        goto out;
    }
    uint64_t x = 88172645463325252ull;
    for (long long i = 0; i < prompt + gen; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)V);
    }
    printf("model      %s: hidden %d, %d layers, %d experts (%d active), vocab %d\n", dir, c->dim, c->n_layers,
           c->n_routed_experts, c->n_active_experts, V);
    printf("backend    cpu, %d threads, batch 1\n", be.n_threads);
    fflush(stdout);
    double bw = read_bandwidth(be.n_threads);
    printf("memory     read bandwidth %.1f GB/s (%d threads, 1 GiB, best of 5)\n", bw, be.n_threads);
    fflush(stdout);

    double t_pf = cli_now(), mapped = prefault(m->ck);
    printf("warm-up    %.2f GB of weights paged in, %.1f s\n", mapped / 1e9, cli_now() - t_pf);
    fflush(stdout);
    /* warm-up: one pass over the prompt */
    ds_batch_item it = {seq, toks, (int)prompt, logits, 0};
    if (ds_forward(m, &be, &it, 1, &err)) goto fail;
    ds_seq_reset(seq);
    double t0 = cli_now();
    if (ds_forward(m, &be, &it, 1, &err)) goto fail;
    double tp = cli_now() - t0;
    t0 = cli_now();
    for (long long g = 0; g < gen; g++) {
        ds_batch_item d = {seq, toks + prompt + g, 1, logits, 0};
        if (ds_forward(m, &be, &d, 1, &err)) goto fail;
    }
    double td = (cli_now() - t0) / (double)gen;
    double bytes = (double)ds_model_decode_bytes(m);
    printf("prefill    %lld tokens in %.3f s: %.1f tokens/s\n", prompt, tp, (double)prompt / tp);
    printf("decode     %lld tokens: %.2f ms/token, %.2f tokens/s, weights %.3f GB/token -> %.2f GB/s\n", gen,
           td * 1e3, 1.0 / td, bytes / 1e9, bytes / td / 1e9);
    printf("floor      %.2f tokens/s at %.1f GB/s; achieved %.2f of the bandwidth floor\n", bw * 1e9 / bytes, bw,
           bytes / td / 1e9 / bw);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dsv4 bench: %s\n", err.msg);
out:
    free(toks);
    free(logits);
    ds_seq_free(seq);
    ds_model_free(m);
    return rc;
}
