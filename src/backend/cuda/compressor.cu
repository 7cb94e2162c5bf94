/* compressor.cu — the KV compressor (paper §2.3, doc §3.3) on the device,
 * with no host sync: every window closed by a row of this step is computed
 * directly from where its rows are (this step's kv / gate rows for positions
 * >= seq_pos0, else the state's pending rows; the previous window's series A
 * from the step, the pending rows or the state's prev rows), then the state
 * is advanced. Three launches, in stream order:
 *   1 entries: one block per row closing a window (pos % R == R-1);
 *     per channel (ORDER, as ds_comp_push): max over the slots (previous
 *     window's series A first when overlapping and entry > 0, then this
 *     window's slots), sum of expf(g - max) ascending, acc = acc + v * (e/sum)
 *     ascending; then RMSNorm(norm) (block sum, fixed tree) and RoPE at the
 *     window's first position.
 *   2 prev (overlap only): series A of the last window closed in the step.
 *   3 pend: each slot's last row of the step (gate + ape).
 * Capacity is not checked on the device: the model sizes entries for
 * max_len / R + 1. */
#include "backend/cuda/internal.h"

struct comp_args {
    int layer, n_layers, which, R, d, cd, overlap, half;
    const float *ape, *norm, *kv, *gate, *inv_freq;
    float eps;
    const int *tok_seq, *seq_row0, *seq_n;
    const int64_t *tok_pos, *seq_pos0;
    const ds_layer_mem *mem;
};

__device__ __forceinline__ const ds_comp_mem *comp_of(const comp_args &a, int s) {
    const ds_layer_mem *lm = &a.mem[(size_t)s * a.n_layers + a.layer];
    return a.which ? &lm->icomp : &lm->comp;
}

/* Slot j of the softmax of entry E, channel c: gate (+ ape) and kv. */
__device__ __forceinline__ void comp_slot(const comp_args &a, const ds_comp_mem *cm, int64_t E, int np, int j, int c,
                                          int64_t pos0, int row0, float *g, float *v) {
    if (j < np) { /* previous window, series A (columns [0, d)) */
        int64_t q = (E - 1) * a.R + j;
        if (q >= pos0) {
            size_t r = (size_t)(row0 + (q - pos0)) * a.cd;
            *g = a.gate[r + c] + a.ape[(size_t)j * a.cd + c];
            *v = a.kv[r + c];
        } else if (q / a.R == pos0 / a.R) {
            *g = cm->pend_gate[(size_t)j * a.cd + c];
            *v = cm->pend_kv[(size_t)j * a.cd + c];
        } else {
            *g = cm->prev_gate[(size_t)j * a.d + c];
            *v = cm->prev_kv[(size_t)j * a.d + c];
        }
        return;
    }
    j -= np;
    int off = a.overlap ? a.d : 0;
    int64_t q = E * a.R + j;
    if (q >= pos0) {
        size_t r = (size_t)(row0 + (q - pos0)) * a.cd;
        *g = a.gate[r + off + c] + a.ape[(size_t)j * a.cd + off + c];
        *v = a.kv[r + off + c];
    } else {
        *g = cm->pend_gate[(size_t)j * a.cd + off + c];
        *v = cm->pend_kv[(size_t)j * a.cd + off + c];
    }
}

__global__ void __launch_bounds__(DSC_COMP_THREADS) comp_entry_kernel(comp_args a) {
    DSC_PDL_WAIT();
    extern __shared__ float e[]; /* [d] */
    __shared__ float sh[32];
    int t = blockIdx.x;
    int64_t pos = a.tok_pos[t];
    if (pos % a.R != a.R - 1) return;
    int s = a.tok_seq[t], row0 = a.seq_row0[s];
    int64_t pos0 = a.seq_pos0[s], E = pos / a.R;
    const ds_comp_mem *cm = comp_of(a, s);
    int np = a.overlap && E > 0 ? a.R : 0, ns = np + a.R;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
        float g, v, mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (int j = 0; j < ns; j++) {
            comp_slot(a, cm, E, np, j, c, pos0, row0, &g, &v);
            mx = fmaxf(mx, g);
        }
        for (int j = 0; j < ns; j++) {
            comp_slot(a, cm, E, np, j, c, pos0, row0, &g, &v);
            sum += expf(g - mx);
        }
        for (int j = 0; j < ns; j++) {
            comp_slot(a, cm, E, np, j, c, pos0, row0, &g, &v);
            acc = acc + v * (expf(g - mx) / sum);
        }
        e[c] = acc;
    }
    float ss = 0.0f;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) ss = fmaf(e[c], e[c], ss);
    float r = 1.0f / sqrtf(dsc_block_sum(ss, sh) / (float)a.d + a.eps);
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) e[c] = a.norm[c] * (e[c] * r);
    __syncthreads();
    float fp = (float)(pos - (a.R - 1));
    float *p = e + a.d - 2 * a.half;
    for (int i = threadIdx.x; i < a.half; i += blockDim.x) {
        float ang = a.inv_freq[i] * fp;
        float cs = cosf(ang), sn = sinf(ang);
        float x0 = p[2 * i], x1 = p[2 * i + 1];
        p[2 * i] = x0 * cs - x1 * sn;
        p[2 * i + 1] = x1 * cs + x0 * sn;
    }
    __syncthreads();
    float *out = cm->entries + (size_t)E * a.d;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) out[c] = e[c];
}

/* prev <- series A of the last window closed in the step (reads the old pend). */
__global__ void comp_prev_kernel(comp_args a) {
    DSC_PDL_WAIT();
    int t = blockIdx.x;
    int64_t pos = a.tok_pos[t];
    if (pos % a.R != a.R - 1) return;
    int s = a.tok_seq[t], row0 = a.seq_row0[s];
    int64_t pos0 = a.seq_pos0[s], pend = pos0 + a.seq_n[s] - 1;
    if (pos + a.R <= pend) return; /* a later window closes too */
    const ds_comp_mem *cm = comp_of(a, s);
    int64_t E = pos / a.R;
    for (int i = threadIdx.x; i < a.R * a.d; i += blockDim.x) {
        int j = i / a.d, c = i % a.d;
        int64_t q = E * a.R + j;
        float g, v;
        if (q >= pos0) {
            size_t r = (size_t)(row0 + (q - pos0)) * a.cd;
            g = a.gate[r + c] + a.ape[(size_t)j * a.cd + c];
            v = a.kv[r + c];
        } else {
            g = cm->pend_gate[(size_t)j * a.cd + c];
            v = cm->pend_kv[(size_t)j * a.cd + c];
        }
        cm->prev_gate[(size_t)j * a.d + c] = g;
        cm->prev_kv[(size_t)j * a.d + c] = v;
    }
}

/* pend[pos % R] <- the step's last row of each slot. */
__global__ void comp_pend_kernel(comp_args a) {
    DSC_PDL_WAIT();
    int t = blockIdx.x;
    int s = a.tok_seq[t];
    if (t - a.seq_row0[s] + a.R < a.seq_n[s]) return; /* a later row has the slot */
    const ds_comp_mem *cm = comp_of(a, s);
    int slot = (int)(a.tok_pos[t] % a.R);
    for (int c = threadIdx.x; c < a.cd; c += blockDim.x) {
        cm->pend_kv[(size_t)slot * a.cd + c] = a.kv[(size_t)t * a.cd + c];
        cm->pend_gate[(size_t)slot * a.cd + c] = a.gate[(size_t)t * a.cd + c] + a.ape[(size_t)slot * a.cd + c];
    }
}

extern "C" int dsc_compress(const ds_backend *be, const ds_compress_params *p, ds_err *err) {
    const char *op = "compress";
    if (dsc_use_lane(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    const dsc_step *st = &I->step;
    if (st->T <= 0) return 0;
    if (p->ratio <= 0 || p->d <= 0 || 2 * p->half > p->d)
        return dsc_failmsg(err, op, "ratio %d, d %d, rope half %d", p->ratio, p->d, p->half);
    if (p->layer < 0 || p->layer >= st->n_layers) return dsc_failmsg(err, op, "layer %d of %d", p->layer, st->n_layers);
    size_t smem = sizeof(float) * (size_t)p->d;
    if (smem > 48 * 1024) return dsc_failmsg(err, op, "d %d too large for one block", p->d);
    comp_args a = {p->layer, st->n_layers, p->which, p->ratio, p->d, (p->overlap ? 2 : 1) * p->d, p->overlap, p->half,
                   p->ape, p->norm, p->kv, p->gate, p->inv_freq, p->eps, st->tok_seq, st->seq_row0, st->seq_n,
                   st->tok_pos, st->seq_pos0, st->mem};
    dsc_launch(comp_entry_kernel, (unsigned)st->T, DSC_COMP_THREADS, smem, dsc_st(I), a);
    if (dsc_check_launch(err, op)) return -1;
    if (p->overlap) {
        dsc_launch(comp_prev_kernel, (unsigned)st->T, DSC_COMP_THREADS, 0, dsc_st(I), a);
        if (dsc_check_launch(err, op)) return -1;
    }
    dsc_launch(comp_pend_kernel, (unsigned)st->T, DSC_COMP_THREADS, 0, dsc_st(I), a);
    return dsc_check_launch(err, op);
}
