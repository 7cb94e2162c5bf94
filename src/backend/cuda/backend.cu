/* backend.cu — the CUDA backend's memory, step upload, embedding, gather and
 * vtable. Everything lives in dsc_impl (be->impl): no global state. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/internal.h"

/* ops of the other files */
extern "C" {
int dsc_matmul_many(const ds_backend *be, const ds_matmul_job *jobs, int n, ds_err *err);
int dsc_matmul_grouped(const ds_backend *be, const ds_matmul_grouped *p, ds_err *err);
int dsc_rmsnorm(const ds_backend *be, const ds_rmsnorm_params *jobs, int n, ds_err *err);
int dsc_rope(const ds_backend *be, const ds_rope_params *p, ds_err *err);
int dsc_hc_pre(const ds_backend *be, const ds_hc_pre_params *p, ds_err *err);
int dsc_hc_post(const ds_backend *be, const ds_hc_post_params *p, ds_err *err);
int dsc_hc_head(const ds_backend *be, const ds_hc_head_params *p, ds_err *err);
int dsc_compress(const ds_backend *be, const ds_compress_params *p, ds_err *err);
int dsc_indexer(const ds_backend *be, const ds_indexer_params *p, ds_err *err);
int dsc_attention(const ds_backend *be, const ds_attention_params *p, ds_err *err);
int dsc_window_store(const ds_backend *be, const ds_window_store_params *p, ds_err *err);
int dsc_route(const ds_backend *be, const ds_route_params *p, ds_err *err);
int dsc_moe(const ds_backend *be, const ds_moe_params *p, ds_err *err);
int dsc_moe_experts(const ds_backend *be, const ds_moe_experts_params *p, ds_err *err);
int dsc_moe_combine(const ds_backend *be, const ds_moe_combine_params *p, ds_err *err);
int dsc_ep_comm_id(const ds_backend *be, void *id, size_t cap, size_t *n, ds_err *err);
int dsc_ep_comm_init(const ds_backend *be, const void *id, size_t n, int rank, int size, ds_err *err);
int dsc_ep_exchange(const ds_backend *be, int nb, float *const *bufs, const int *widths, int n, const int *owner,
                    const int *dest, ds_err *err);
}

/* ---- errors ------------------------------------------------------------ */

int dsc_fail(ds_err *err, const char *op, const char *what, cudaError_t e) {
    if (err) snprintf(err->msg, sizeof err->msg, "cuda %s: %s: %s (%s)", op, what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

int dsc_failmsg(ds_err *err, const char *op, const char *fmt, ...) {
    if (err) {
        char m[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        snprintf(err->msg, sizeof err->msg, "cuda %s: %s", op, m);
    }
    return -1;
}

/* A launch error, or a fault of an earlier kernel that surfaced now. */
int dsc_check_launch(ds_err *err, const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return dsc_fail(err, op, "kernel launch failed", e);
    return 0;
}

static int graph_cut(dsc_impl *I, ds_err *err);

int dsc_use_lane(const ds_backend *be, ds_err *err, const char *op) {
    dsc_impl *I = dsc_of(be);
    if (!I) return dsc_failmsg(err, op, "backend is closed");
    cudaError_t e = cudaSetDevice(I->gpu);
    if (e != cudaSuccess) return dsc_fail(err, op, "cannot select the device", e);
    /* an op's start is a piece boundary of a captured step, except inside a
     * branch of the lanes (a piece's capture ends with every stream joined) */
    if (I->capturing && I->piece_ops > 0 && ++I->piece_n > I->piece_ops && !I->branch) return graph_cut(I, err);
    return 0;
}

int dsc_use(const ds_backend *be, ds_err *err, const char *op) {
    dsc_impl *I = dsc_of(be);
    if (I && I->lane) return dsc_failmsg(err, op, "issued on the side lane, which runs only matmul_many, compress, "
                                         "rope and indexer (the model's lanes: docs/backend.md)");
    return dsc_use_lane(be, err, op);
}

/* ---- lanes (be->lane) ---------------------------------------------------------- */

void dsc_lane_join(dsc_impl *I) {
    I->lane = DS_LANE_MAIN;
    if (!I->branch) return;
    I->branch = 0;
    /* errors surface at the next launch check or synchronization */
    if (cudaEventRecord(I->ev_ljoin, I->side) != cudaSuccess || cudaStreamWaitEvent(I->stream, I->ev_ljoin, 0) != cudaSuccess)
        cudaStreamSynchronize(I->side);
}

int dsc_lane(const ds_backend *be, int to, ds_err *err) {
    const char *op = "lane";
    dsc_impl *I = dsc_of(be);
    if (!I) return dsc_failmsg(err, op, "backend is closed");
    if (to != DS_LANE_MAIN && to != DS_LANE_SIDE && to != DS_LANE_JOIN)
        return dsc_failmsg(err, op, "unknown lane %d (DS_LANE_MAIN, DS_LANE_SIDE or DS_LANE_JOIN)", to);
    /* off, or the op profile (each op timed alone): everything in issue order on the main stream */
    if (!I->lanes_on || be->profile) return 0;
    cudaError_t e = cudaSetDevice(I->gpu);
    if (e != cudaSuccess) return dsc_fail(err, op, "cannot select the device", e);
    if (to == DS_LANE_JOIN) {
        dsc_lane_join(I);
        return dsc_check_launch(err, op);
    }
    if (to == DS_LANE_SIDE && I->lane != DS_LANE_SIDE) {
        /* the side lane starts after everything issued on the main lane so far */
        e = cudaEventRecord(I->ev_lfork, I->stream);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(I->side, I->ev_lfork, 0);
        if (e != cudaSuccess) return dsc_fail(err, op, "fork of the side lane", e);
        I->branch = 1;
    }
    I->lane = to;
    return 0;
}

int dsc_buf_grow(dsc_buf *b, size_t bytes, size_t min_cap, cudaStream_t st) {
    if (b->cap >= bytes) return 0;
    size_t cap = b->cap ? b->cap : min_cap;
    while (cap < bytes) cap *= 2;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) cudaGetLastError();
    if (b->p) {
        if (cs == cudaStreamCaptureStatusActive) {
            /* captured kernels may read it when the graph runs */
            if (b->n_old == (int)(sizeof b->old / sizeof b->old[0])) return -2;
            b->old[b->n_old++] = b->p;
        } else {
            cudaStreamSynchronize(st); /* earlier kernels may still read it */
            cudaFree(b->p);
        }
        b->p = NULL;
        b->cap = 0;
    }
    if (cudaMalloc(&b->p, cap) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: keep it from surfacing as a later launch error */
        b->p = NULL;
        return -1;
    }
    b->cap = cap;
    return 0;
}

void *dsc_scratch(dsc_impl *I, int which, size_t bytes, ds_err *err, const char *op) {
    dsc_buf *b = &I->scratch[which];
    if (bytes == 0) bytes = 16;
    if (b->cap >= bytes) return b->p;
    int rc = dsc_buf_grow(b, bytes, 4096, dsc_st(I));
    if (rc == -2)
        dsc_failmsg(err, op, "scratch slot %d grew more than %d times inside one captured step (DSV4_CUDA_GRAPH=0 "
                    "runs without graphs)", which, (int)(sizeof b->old / sizeof b->old[0]));
    else if (rc)
        dsc_failmsg(err, op, "out of device memory for %zu bytes of scratch", bytes);
    return rc ? NULL : b->p;
}

/* ---- CUDA graphs ---------------------------------------------------------- */

int dsc_graph_end(dsc_impl *I, ds_err *err) {
    const char *op = "graph";
    /* the host is about to wait for the main stream: the side lane's work
     * first (and a capture ends only with every stream joined) */
    dsc_lane_join(I);
    if (!I->capturing) return 0;
    I->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(I->stream, &g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsc_fail(err, op, "end of the step's capture (the step's work is lost)", e);
    }
    size_t nodes = 0;
    if (cudaGraphGetNodes(g, NULL, &nodes) == cudaSuccess && nodes == 0) { /* a piece cut just before a sync */
        cudaGraphDestroy(g);
        return 0;
    }
    int slot = -1;
    for (int i = 0; i < I->n_graphs; i++)
        if (I->graphs[i].T == I->step.T && I->graphs[i].piece == I->piece) slot = i;
    cudaGraphExec_t x = slot >= 0 ? I->graphs[slot].exec : NULL;
    if (x) {
        /* the same kernels with this step's parameters (topology unchanged) */
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(x, g, &info) == cudaSuccess) I->graph_updates++;
        else {
            cudaGetLastError();
            cudaGraphExecDestroy(x);
            x = NULL;
        }
    }
    if (!x) {
        e = cudaGraphInstantiate(&x, g, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cudaGraphDestroy(g);
            if (slot >= 0) I->graphs[slot].exec = NULL;
            return dsc_fail(err, op, "instantiation of the step's graph", e);
        }
        I->graph_builds++;
        if (slot < 0) {
            if (I->n_graphs < DSC_GRAPHS) slot = I->n_graphs++;
            else {
                slot = I->next_graph;
                I->next_graph = (I->next_graph + 1) % DSC_GRAPHS;
                if (I->graphs[slot].exec) cudaGraphExecDestroy(I->graphs[slot].exec);
            }
            I->graphs[slot].T = I->step.T;
            I->graphs[slot].piece = I->piece;
        }
        I->graphs[slot].exec = x;
    }
    cudaGraphDestroy(g);
    e = cudaGraphLaunch(x, I->stream);
    if (e != cudaSuccess) return dsc_fail(err, op, "launch of the step's graph", e);
    /* buffers that grew during the capture: their old allocations are free now */
    int old = 0;
    for (int i = 0; i < DSC_S_N; i++) old += I->scratch[i].n_old;
    if (old) {
        e = cudaStreamSynchronize(I->stream);
        for (int i = 0; i < DSC_S_N; i++) {
            for (int j = 0; j < I->scratch[i].n_old; j++) cudaFree(I->scratch[i].old[j]);
            I->scratch[i].n_old = 0;
        }
        if (e != cudaSuccess) return dsc_fail(err, op, "the step's graph", e);
    }
    return 0;
}

/* Starts capturing the step when it is small and the last step had its size
 * (the first step of a size runs directly: scratch grows, tables are built).
 * The capture is cut into pieces of I->piece_ops ops (graph_cut); a piece's
 * executable graph is cached by (T, its index in the step). */
static void graph_begin(const ds_backend *be, dsc_impl *I, int T) {
    int want = I->graph_on && !be->profile && !I->nccl && T <= DSC_GRAPH_MAX_T && T == I->last_T;
    I->last_T = T;
    I->piece = 0;
    I->piece_n = 0;
    if (!want) return;
    if (cudaStreamBeginCapture(I->stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    I->capturing = 1;
}

/* Launches the piece captured so far and goes on capturing the step's next
 * piece: the GPU runs this one while the host captures the next. */
static int graph_cut(dsc_impl *I, ds_err *err) {
    if (dsc_graph_end(I, err)) return -1;
    I->piece++;
    I->piece_n = 1;
    if (cudaStreamBeginCapture(I->stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError(); /* the rest of the step runs directly */
        return 0;
    }
    I->capturing = 1;
    return 0;
}

/* ---- memory ------------------------------------------------------------- */

static void *c_alloc(const ds_backend *be, size_t bytes, ds_err *err) {
    if (dsc_use(be, err, "alloc")) return NULL;
    if (dsc_graph_end(dsc_of(be), err)) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        char what[96];
        snprintf(what, sizeof what, "%zu bytes of device memory", bytes);
        dsc_fail(err, "alloc", what, e);
        return NULL;
    }
    return p;
}

static void c_free(const ds_backend *be, void *p) {
    if (!p || !be->impl) return;
    cudaSetDevice(dsc_of(be)->gpu);
    dsc_graph_end(dsc_of(be), NULL);
    cudaStreamSynchronize(dsc_of(be)->stream);
    cudaFree(p);
}

static int c_upload(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err) {
    if (dsc_use(be, err, "upload")) return -1;
    if (dsc_graph_end(dsc_of(be), err)) return -1;
    if (!bytes) return 0;
    dsc_impl *I = dsc_of(be);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, I->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(I->stream);
    return e == cudaSuccess ? 0 : dsc_fail(err, "upload", "copy to the device", e);
}

static int c_download(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err) {
    if (dsc_use(be, err, "download")) return -1;
    if (dsc_graph_end(dsc_of(be), err)) return -1;
    if (!bytes) return 0;
    dsc_impl *I = dsc_of(be);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, I->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(I->stream);
    /* a device fault of any earlier op of the step surfaces here */
    return e == cudaSuccess ? 0 : dsc_fail(err, "download", "copy from the device (or an earlier op faulted)", e);
}

static int c_memset0(const ds_backend *be, void *dst, size_t bytes, ds_err *err) {
    if (dsc_use(be, err, "memset0")) return -1;
    cudaError_t e = cudaMemsetAsync(dst, 0, bytes, dsc_of(be)->stream);
    return e == cudaSuccess ? 0 : dsc_fail(err, "memset0", "memset", e);
}

static int c_copy_list(const ds_backend *be, int n, const ds_copy *c, ds_err *err) {
    if (dsc_use(be, err, "copy")) return -1;
    if (dsc_graph_end(dsc_of(be), err)) return -1;
    dsc_impl *I = dsc_of(be);
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < n && e == cudaSuccess; i++)
        if (c[i].bytes) e = cudaMemcpyAsync(c[i].dst, c[i].src, c[i].bytes, cudaMemcpyDeviceToDevice, I->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(I->stream);
    return e == cudaSuccess ? 0 : dsc_fail(err, "copy", "copy on the device", e);
}

static int c_copy(const ds_backend *be, void *dst, const void *src, size_t bytes, ds_err *err) {
    ds_copy c = {dst, src, bytes};
    return c_copy_list(be, 1, &c, err);
}

__global__ void fp4_reorder_kernel(uint32_t *w, size_t n) {
    DSC_PDL_WAIT();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] = dsc_fp4_store_word(w[i]);
}

cudaError_t dsc_fp4_reorder(cudaStream_t st, uint32_t *words, size_t n) {
    if (!n) return cudaSuccess;
    dsc_launch(fp4_reorder_kernel, (unsigned)((n + 255) / 256), 256, 0, st, words, n);
    return cudaGetLastError();
}

/* A copy in device memory, in whole 32-bit words (FP4 codes reordered in
 * each: dsc_fp4_nib; the last word's missing bytes zero). */
static int c_map_weights(const ds_backend *be, const void *host, size_t bytes, ds_map_what what, const void **out,
                         ds_err *err) {
    *out = NULL;
    if (dsc_use(be, err, "map_weights")) return -1;
    if (dsc_graph_end(dsc_of(be), err)) return -1;
    void *p = NULL;
    size_t n4 = (bytes + 3) & ~(size_t)3;
    cudaError_t e = cudaMalloc(&p, n4 ? n4 : 16);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        return dsc_failmsg(err, "map_weights", "the weights need %.2f GiB, the GPU has %.2f GiB free of %.2f GiB: %s",
                           (double)bytes / 1073741824.0, (double)fr / 1073741824.0, (double)tot / 1073741824.0,
                           cudaGetErrorString(e));
    }
    if (n4 > bytes) e = cudaMemset((uint8_t *)p + n4 - 4, 0, 4);
    if (e == cudaSuccess) e = cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(p);
        return dsc_fail(err, "map_weights", "copy of the weights to the device", e);
    }
    if (what == DS_MAP_FP4_CODES) {
        e = dsc_fp4_reorder(0, (uint32_t *)p, n4 / 4);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            cudaFree(p);
            return dsc_fail(err, "map_weights", "reordering the FP4 codes on the device", e);
        }
    }
    *out = p;
    return 0;
}

static void c_unmap_weights(const ds_backend *be, const void *p) { c_free(be, (void *)p); }

/* On the step's stream after the ops issued before it: a pageable source is
 * staged before the call returns; the FP4 codes reordered in place after. */
static int c_fill_weights(const ds_backend *be, void *dst, const void *host, size_t bytes, ds_map_what what,
                          ds_err *err) {
    if (dsc_use(be, err, "fill_weights")) return -1;
    dsc_impl *I = dsc_of(be);
    if (dsc_graph_end(I, err)) return -1;
    size_t n4 = (bytes + 3) & ~(size_t)3;
    cudaError_t e = cudaSuccess;
    if (n4 > bytes) e = cudaMemsetAsync((uint8_t *)dst + n4 - 4, 0, 4, I->stream);
    if (e == cudaSuccess && bytes) e = cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, I->stream);
    if (e == cudaSuccess && what == DS_MAP_FP4_CODES) e = dsc_fp4_reorder(I->stream, (uint32_t *)dst, n4 / 4);
    return e == cudaSuccess ? 0 : dsc_fail(err, "fill_weights", "copy of an expert into its slot", e);
}

/* Pinned host memory: a download into it is one DMA (pageable memory goes
 * through the driver's staging copy). */
static void *c_host_alloc(const ds_backend *be, size_t bytes, ds_err *err) {
    if (dsc_use(be, err, "host_alloc")) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dsc_fail(err, "host_alloc", "pinned host memory for a download buffer", e);
        return NULL;
    }
    return p;
}

/* Host pages page-locked in place (cudaHostRegister; read-only where the
 * device supports it, so that mapped shards qualify). */
static int c_pin_host(const ds_backend *be, const void *p, size_t bytes, ds_err *err) {
    if (dsc_use(be, err, "pin_host")) return -1;
    int ro = 0;
    cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dsc_of(be)->gpu);
    unsigned fl = cudaHostRegisterPortable | (ro ? cudaHostRegisterReadOnly : 0u);
    cudaError_t e = cudaHostRegister((void *)p, bytes, fl);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsc_fail(err, "pin_host", ro ? "page-locking host memory (read-only)" : "page-locking host memory", e);
    }
    return 0;
}

static void c_unpin_host(const ds_backend *be, const void *p) {
    if (!p || !be->impl) return;
    cudaSetDevice(dsc_of(be)->gpu);
    if (cudaHostUnregister((void *)p) != cudaSuccess) cudaGetLastError();
}

static void c_host_free(const ds_backend *be, void *p) {
    if (!p || !be->impl) return;
    cudaSetDevice(dsc_of(be)->gpu);
    cudaFreeHost(p);
}

/* ---- the step ----------------------------------------------------------- */

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

static int c_begin_step(const ds_backend *be, const ds_step_desc *s, ds_err *err) {
    const char *op = "begin_step";
    if (dsc_of(be)) dsc_lane_join(dsc_of(be)); /* a step that failed inside a branch left it open */
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (dsc_graph_end(I, err)) return -1; /* the last step's capture, if it had no synchronization */
    size_t T = (size_t)s->T, S = (size_t)s->n_seqs, L = (size_t)s->n_layers;
    size_t o_id = 0, o_pos = al16(o_id + 4 * T), o_seq = al16(o_pos + 8 * T), o_r0 = al16(o_seq + 4 * T);
    size_t o_n = al16(o_r0 + 4 * S), o_p0 = al16(o_n + 4 * S), o_mem = al16(o_p0 + 8 * S);
    size_t total = al16(o_mem + sizeof(ds_layer_mem) * S * L);
    /* the previous step's copy must be done before the staging is rewritten */
    if (I->stage_pending) {
        cudaError_t e = cudaEventSynchronize(I->stage_done);
        if (e != cudaSuccess) return dsc_fail(err, op, "waiting for the previous step's upload", e);
        I->stage_pending = 0;
    }
    if (I->stage_cap < total) {
        if (I->stage) cudaFreeHost(I->stage);
        I->stage = NULL;
        I->stage_cap = 0;
        size_t cap = total < 65536 ? 65536 : total * 2;
        cudaError_t e = cudaMallocHost(&I->stage, cap);
        if (e != cudaSuccess) cudaGetLastError();
        if (e != cudaSuccess) return dsc_fail(err, op, "pinned host memory for the step", e);
        I->stage_cap = cap;
    }
    uint8_t *dev = (uint8_t *)dsc_scratch(I, DSC_S_STEP, total, err, op);
    if (!dev) return -1;
    uint8_t *h = (uint8_t *)I->stage;
    memcpy(h + o_id, s->tok_id, 4 * T);
    memcpy(h + o_pos, s->tok_pos, 8 * T);
    memcpy(h + o_seq, s->tok_seq, 4 * T);
    memcpy(h + o_r0, s->seq_row0, 4 * S);
    memcpy(h + o_n, s->seq_n, 4 * S);
    memcpy(h + o_p0, s->seq_pos0, 8 * S);
    for (size_t q = 0; q < S; q++)
        memcpy(h + o_mem + sizeof(ds_layer_mem) * q * L, s->seq_mem[q], sizeof(ds_layer_mem) * L);
    cudaError_t e = cudaMemcpyAsync(dev, h, total, cudaMemcpyHostToDevice, I->stream);
    if (e == cudaSuccess) e = cudaEventRecord(I->stage_done, I->stream);
    if (e != cudaSuccess) return dsc_fail(err, op, "upload of the step", e);
    I->stage_pending = 1;
    dsc_step *st = &I->step;
    st->T = s->T;
    st->n_seqs = s->n_seqs;
    st->n_layers = s->n_layers;
    st->max_pos = 0;
    for (size_t t = 0; t < T; t++)
        if (s->tok_pos[t] > st->max_pos) st->max_pos = s->tok_pos[t];
    st->tok_id = (const int32_t *)(dev + o_id);
    st->tok_pos = (const int64_t *)(dev + o_pos);
    st->tok_seq = (const int *)(dev + o_seq);
    st->seq_row0 = (const int *)(dev + o_r0);
    st->seq_n = (const int *)(dev + o_n);
    st->seq_pos0 = (const int64_t *)(dev + o_p0);
    st->mem = (const ds_layer_mem *)(dev + o_mem);
    graph_begin(be, I, s->T);
    return 0;
}

/* ---- embedding and gather ---------------------------------------------- */

template <int KIND>
__global__ void embed_kernel(dsc_w w, const int32_t *__restrict__ tok, int n, float *__restrict__ X) {
    DSC_PDL_WAIT();
    int t = blockIdx.y, D = w.cols;
    int id = tok[t];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) {
        float v = (id >= 0 && id < w.rows) ? dsc_elem<KIND>(w, id, c) : __uint_as_float(0x7fc00000u);
        for (int i = 0; i < n; i++) X[((size_t)t * n + i) * D + c] = v;
    }
}

static int c_embed(const ds_backend *be, const ds_embed_params *p, ds_err *err) {
    const char *op = "embed";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    int T = I->step.T;
    if (T <= 0) return 0;
    if (T > 65535) return dsc_failmsg(err, op, "%d tokens exceed the grid", T);
    dsc_w w = dsc_wdesc(p->w);
    dim3 grid((unsigned)((w.cols + 255) / 256), (unsigned)T);
    switch (p->w->kind) {
    case DS_W_F32: dsc_launch(embed_kernel<DS_W_F32>, grid, 256, 0, I->stream, w, I->step.tok_id, p->n, p->X); break;
    case DS_W_BF16: dsc_launch(embed_kernel<DS_W_BF16>, grid, 256, 0, I->stream, w, I->step.tok_id, p->n, p->X); break;
    case DS_W_F16: dsc_launch(embed_kernel<DS_W_F16>, grid, 256, 0, I->stream, w, I->step.tok_id, p->n, p->X); break;
    case DS_W_FP8: dsc_launch(embed_kernel<DS_W_FP8>, grid, 256, 0, I->stream, w, I->step.tok_id, p->n, p->X); break;
    case DS_W_FP4: dsc_launch(embed_kernel<DS_W_FP4>, grid, 256, 0, I->stream, w, I->step.tok_id, p->n, p->X); break;
    default: return dsc_failmsg(err, op, "unknown storage kind");
    }
    return dsc_check_launch(err, op);
}

/* The row list: by value for a few rows (no upload: a captured step stays
 * whole), else from device memory. */
#define DSC_GATHER_ARG 128
struct gather_rows {
    int r[DSC_GATHER_ARG];
};

__global__ void gather_kernel(const float *__restrict__ src, const int *__restrict__ rows, gather_rows ra, int width,
                              float *__restrict__ dst) {
    DSC_PDL_WAIT();
    int j = blockIdx.y;
    const float *s = src + (size_t)(rows ? rows[j] : ra.r[j]) * width;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x)
        dst[(size_t)j * width + c] = s[c];
}

static int c_gather(const ds_backend *be, const ds_gather_params *p, ds_err *err) {
    const char *op = "gather";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    if (p->n <= 0) return 0;
    if (p->n > 65535) return dsc_failmsg(err, op, "%d rows exceed the grid", p->n);
    gather_rows ra;
    int *rows = NULL;
    if (p->n <= DSC_GATHER_ARG) memcpy(ra.r, p->rows, sizeof(int) * (size_t)p->n);
    else {
        if (dsc_graph_end(I, err)) return -1;
        rows = (int *)dsc_scratch(I, DSC_S_B, sizeof(int) * (size_t)p->n, err, op);
        if (!rows) return -1;
        /* rows is host memory: copied before the call returns */
        cudaError_t e = cudaMemcpyAsync(rows, p->rows, sizeof(int) * (size_t)p->n, cudaMemcpyHostToDevice, I->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(I->stream);
        if (e != cudaSuccess) return dsc_fail(err, op, "upload of the row list", e);
    }
    dim3 grid((unsigned)((p->width + 255) / 256 < 64 ? (p->width + 255) / 256 : 64), (unsigned)p->n);
    dsc_launch(gather_kernel, grid, 256, 0, I->stream, p->src, rows, ra, p->width, p->dst);
    return dsc_check_launch(err, op);
}

/* ---- lifetime ------------------------------------------------------------ */

/* The device computes; no host threads to set. */
static int c_threads(const ds_backend *) { return 0; }
static void c_set_threads(ds_backend *, int) {}
static const char *c_note(const ds_backend *) { return ""; }
static uint64_t c_avail(const ds_backend *be) {
    size_t fr = 0, tot = 0;
    cudaSetDevice(dsc_of(be)->gpu);
    return cudaMemGetInfo(&fr, &tot) == cudaSuccess ? (uint64_t)fr : 0;
}

static void c_close(ds_backend *be) {
    dsc_impl *I = dsc_of(be);
    if (!I) return;
    cudaSetDevice(I->gpu);
    dsc_graph_end(I, NULL);
    cudaStreamSynchronize(I->stream);
    cudaStreamSynchronize(I->side);
    if (getenv("DSV4_CUDA_GRAPH_STATS"))
        fprintf(stderr, "cuda graphs: %ld replays after an update, %ld after an instantiation\n", I->graph_updates,
                I->graph_builds);
    for (int i = 0; i < I->n_graphs; i++)
        if (I->graphs[i].exec) cudaGraphExecDestroy(I->graphs[i].exec);
    dsc_nccl_close(I);
    for (int i = 0; i < DSC_S_N; i++) cudaFree(I->scratch[i].p);
    for (int i = 0; i < I->n_moe; i++) {
        cudaFree(I->moe[i].dev);
        free(I->moe[i].host);
    }
    free(I->moe);
    if (I->stage) cudaFreeHost(I->stage);
    if (I->ballast) cudaFree(I->ballast);
    cudaEventDestroy(I->stage_done);
    cudaEventDestroy(I->ev_fork);
    cudaEventDestroy(I->ev_join);
    cudaEventDestroy(I->ev_lfork);
    cudaEventDestroy(I->ev_ljoin);
    cudaStreamDestroy(I->side);
    cudaStreamDestroy(I->stream);
    free(I);
    be->impl = NULL;
}

extern "C" int ds_backend_cuda_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" int ds_backend_cuda_available(char *desc, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        if (desc && n) snprintf(desc, n, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 0;
    }
    cudaDeviceProp pr;
    e = cudaGetDeviceProperties(&pr, 0);
    if (e != cudaSuccess) {
        if (desc && n) snprintf(desc, n, "CUDA device 0: %s", cudaGetErrorString(e));
        return 0;
    }
    if (desc && n)
        snprintf(desc, n, "%s, %.1f GiB, sm_%d%d (device 0 of %d)", pr.name, (double)pr.totalGlobalMem / 1073741824.0,
                 pr.major, pr.minor, count);
    return 1;
}

/* The profile (dsv4 bench): an op's time, the stream drained on both sides,
 * while be->profile is set; otherwise the op alone. */
static double prof_begin(const ds_backend *be) {
    if (!be->profile) return 0;
    cudaStreamSynchronize(dsc_of(be)->stream);
    return dsc_now();
}
static int prof_end(const ds_backend *be, double t0, double *acc, int rc) {
    if (be->profile) {
        cudaStreamSynchronize(dsc_of(be)->stream);
        *acc += dsc_now() - t0;
    }
    return rc;
}
static int c_moe(const ds_backend *be, const ds_moe_params *p, ds_err *err) {
    double t0 = prof_begin(be);
    return prof_end(be, t0, be->profile ? &be->profile->moe_seconds : NULL, dsc_moe(be, p, err));
}
static int c_moe_experts(const ds_backend *be, const ds_moe_experts_params *p, ds_err *err) {
    double t0 = prof_begin(be);
    return prof_end(be, t0, be->profile ? &be->profile->moe_seconds : NULL, dsc_moe_experts(be, p, err));
}
static int c_moe_combine(const ds_backend *be, const ds_moe_combine_params *p, ds_err *err) {
    double t0 = prof_begin(be);
    return prof_end(be, t0, be->profile ? &be->profile->moe_seconds : NULL, dsc_moe_combine(be, p, err));
}
static int c_ep_exchange(const ds_backend *be, int nb, float *const *bufs, const int *widths, int n, const int *owner,
                         const int *dest, ds_err *err) {
    double t0 = prof_begin(be);
    return prof_end(be, t0, be->profile ? &be->profile->exchange_seconds : NULL,
                    dsc_ep_exchange(be, nb, bufs, widths, n, owner, dest, err));
}

/* A switch from the environment: unset or empty gives dflt, "0" off, "1"
 * on; anything else is an error naming the variable. */
static int env_switch(const char *name, const char *what, int dflt, int *on, ds_err *err) {
    const char *v = getenv(name);
    *on = v && *v ? !strcmp(v, "1") : dflt;
    if (v && *v && strcmp(v, "0") && strcmp(v, "1"))
        return dsc_failmsg(err, "init", "%s='%s': expected 1 (%s) or 0", name, v, what);
    return 0;
}

extern "C" int ds_backend_cuda_init(ds_backend *be, int gpu, ds_err *err) {
    const char *op = "init";
    memset(be, 0, sizeof *be);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return dsc_fail(err, op, "no usable CUDA device", e);
    if (gpu < 0 || gpu >= count) return dsc_failmsg(err, op, "GPU %d requested, %d present", gpu, count);
    cudaDeviceProp pr;
    if ((e = cudaGetDeviceProperties(&pr, gpu)) != cudaSuccess) return dsc_fail(err, op, "device properties", e);
    if (pr.major < 9)
        return dsc_failmsg(err, op, "GPU %d (%s) is sm_%d%d; this build is for sm_90a (Hopper)", gpu, pr.name, pr.major,
                           pr.minor);
    if ((e = cudaSetDevice(gpu)) != cudaSuccess) return dsc_fail(err, op, "cannot select the device", e);
    dsc_impl *I = (dsc_impl *)calloc(1, sizeof *I);
    if (!I) return dsc_failmsg(err, op, "out of host memory");
    I->gpu = gpu;
    I->n_sm = pr.multiProcessorCount;
    I->smem_optin = pr.sharedMemPerBlockOptin;
    const char *gr = getenv("DSV4_CUDA_GRAPH");
    I->graph_on = !(gr && !strcmp(gr, "0"));
    const char *go = getenv("DSV4_CUDA_GRAPH_OPS");
    I->piece_ops = DSC_GRAPH_PIECE_OPS;
    if (go && *go) {
        char *end = NULL;
        long v = strtol(go, &end, 10);
        if (*end || v < 0 || v > 1000000) {
            free(I);
            return dsc_failmsg(err, op, "DSV4_CUDA_GRAPH_OPS='%s': expected ops per graph piece, 0..1000000 "
                               "(0: the whole step in one graph)", go);
        }
        I->piece_ops = (int)v;
    }
    if (env_switch("DSV4_CUDA_SIDE", "the shared expert on a side stream", 1, &I->side_on, err) ||
        env_switch("DSV4_CUDA_LANES", "the model's side lane on the side stream", 1, &I->lanes_on, err)) {
        free(I);
        return -1;
    }
    if ((e = cudaStreamCreateWithFlags(&I->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(I);
        return dsc_fail(err, op, "stream", e);
    }
    if ((e = cudaStreamCreateWithFlags(&I->side, cudaStreamNonBlocking)) != cudaSuccess) {
        cudaStreamDestroy(I->stream);
        free(I);
        return dsc_fail(err, op, "side stream", e);
    }
    if ((e = cudaEventCreateWithFlags(&I->stage_done, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&I->ev_fork, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&I->ev_join, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&I->ev_lfork, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&I->ev_ljoin, cudaEventDisableTiming)) != cudaSuccess) {
        if (I->stage_done) cudaEventDestroy(I->stage_done);
        if (I->ev_fork) cudaEventDestroy(I->ev_fork);
        if (I->ev_join) cudaEventDestroy(I->ev_join);
        if (I->ev_lfork) cudaEventDestroy(I->ev_lfork);
        cudaStreamDestroy(I->side);
        cudaStreamDestroy(I->stream);
        free(I);
        return dsc_fail(err, op, "event", e);
    }
    /* DSV4_CUDA_FREE_MIB=N (tests; builds with DSV4_TEST_HOOKS): hold all
     * but N MiB of the device, so a smaller GPU can be tried on a large one —
     * the same allocation failures, the same messages. */
#ifdef DSV4_TEST_HOOKS
    const char *lim = getenv("DSV4_CUDA_FREE_MIB");
#else
    const char *lim = NULL;
#endif
    if (lim && *lim) {
        size_t fr = 0, tot = 0, keep = (size_t)strtoull(lim, NULL, 10) << 20;
        cudaMemGetInfo(&fr, &tot);
        if (fr > keep && cudaMalloc(&I->ballast, fr - keep) != cudaSuccess) {
            cudaGetLastError();
            I->ballast = NULL;
        }
    }
    be->name = "cuda";
    be->impl = I;
    be->alloc = c_alloc;
    be->free = c_free;
    be->upload = c_upload;
    be->download = c_download;
    be->host_alloc = c_host_alloc;
    be->host_free = c_host_free;
    be->pin_host = c_pin_host;
    be->unpin_host = c_unpin_host;
    be->memset0 = c_memset0;
    be->copy = c_copy;
    be->copy_list = c_copy_list;
    be->map_weights = c_map_weights;
    be->unmap_weights = c_unmap_weights;
    be->fill_weights = c_fill_weights;
    be->begin_step = c_begin_step;
    be->lane = dsc_lane;
    be->embed = c_embed;
    be->matmul_many = dsc_matmul_many;
    be->matmul_grouped = dsc_matmul_grouped;
    be->rmsnorm = dsc_rmsnorm;
    be->rope = dsc_rope;
    be->hc_pre = dsc_hc_pre;
    be->hc_post = dsc_hc_post;
    be->hc_head = dsc_hc_head;
    be->gather = c_gather;
    be->compress = dsc_compress;
    be->indexer = dsc_indexer;
    be->attention = dsc_attention;
    be->window_store = dsc_window_store;
    be->route = dsc_route;
    be->moe = c_moe;
    be->moe_experts = c_moe_experts;
    be->moe_combine = c_moe_combine;
    be->ep_comm_id = dsc_ep_comm_id;
    be->ep_comm_init = dsc_ep_comm_init;
    be->ep_exchange = c_ep_exchange;
    be->threads = c_threads;
    be->set_threads = c_set_threads;
    be->note = c_note;
    be->avail = c_avail;
    be->close = c_close;
    return 0;
}
