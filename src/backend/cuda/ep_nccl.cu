/* ep_nccl.cu — expert parallelism between GPUs (docs/ep.md): the exchanges
 * of moe_ep and of the head's rows over NCCL, device memory to device memory.
 *
 * An exchange moves rows that one rank filled (owner[j]) to the ranks that
 * need them: every rank (an all-gather) or the rank dest[j] (an all-to-all).
 * ep/plan.h plans it from the tables alone; here the plan runs:
 * blocks in place (data-parallel attention's MoE inputs, ids and weights, the
 * head's rows to rank 0: every buffer in one NCCL group, no copy, no upload),
 * or packed on the device, broadcast or sent / received in one group per
 * buffer, and scattered to their rows. Rows are copied, never summed: the
 * bits are the owner's.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2"), like cuBLAS in
 * kbench.cu: the engine links only the CUDA runtime, and a machine without
 * NCCL runs everything else. nccl.h gives the types only. */
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.h"
#include "ep/plan.h"

typedef struct dsc_nccl {
    void *lib;
    ncclComm_t comm;
    int rank, size;
    ds_xplan plan; /* the last exchange's (ep/plan.h) */
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*get_error_string)(ncclResult_t);
} dsc_nccl;

static int nccl_load(dsc_nccl *n, ds_err *err, const char *op) {
    if (n->lib) return 0;
    n->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib)
        return dsc_failmsg(err, op, "NCCL not found (dlopen libnccl.so.2: %s; put its directory on LD_LIBRARY_PATH)",
                           dlerror());
    struct {
        void **fn;
        const char *name;
    } sym[] = {{(void **)&n->get_unique_id, "ncclGetUniqueId"},
               {(void **)&n->comm_init_rank, "ncclCommInitRank"},
               {(void **)&n->comm_abort, "ncclCommAbort"},
               {(void **)&n->group_start, "ncclGroupStart"},
               {(void **)&n->group_end, "ncclGroupEnd"},
               {(void **)&n->broadcast, "ncclBroadcast"},
               {(void **)&n->send, "ncclSend"},
               {(void **)&n->recv, "ncclRecv"},
               {(void **)&n->get_error_string, "ncclGetErrorString"}};
    for (size_t i = 0; i < sizeof sym / sizeof sym[0]; i++)
        if (!(*sym[i].fn = dlsym(n->lib, sym[i].name))) {
            dlclose(n->lib);
            n->lib = NULL;
            return dsc_failmsg(err, op, "libnccl.so.2 lacks %s", sym[i].name);
        }
    return 0;
}

static dsc_nccl *nccl_of(dsc_impl *I, ds_err *err, const char *op) {
    if (!I->nccl && !(I->nccl = (dsc_nccl *)calloc(1, sizeof(dsc_nccl)))) {
        dsc_failmsg(err, op, "out of host memory");
        return NULL;
    }
    return nccl_load(I->nccl, err, op) ? NULL : I->nccl;
}

void dsc_nccl_close(dsc_impl *I) {
    dsc_nccl *n = I->nccl;
    if (!n) return;
    /* ncclCommAbort, not ncclCommDestroy: the stream is idle here (c_close
     * synchronized it), and Destroy waits for every peer to tear down too,
     * which a leader closing its backend before it tells the followers to
     * quit (ds_ep_session_end) would wait for forever. */
    if (n->comm) n->comm_abort(n->comm);
    ds_xplan_free(&n->plan);
    if (n->lib) dlclose(n->lib);
    free(n);
    I->nccl = NULL;
}

extern "C" int dsc_ep_comm_id(const ds_backend *be, void *id, size_t cap, size_t *n_out, ds_err *err) {
    const char *op = "ep_comm_id";
    if (dsc_use(be, err, op)) return -1;
    dsc_nccl *n = nccl_of(dsc_of(be), err, op);
    if (!n) return -1;
    if (cap < sizeof(ncclUniqueId))
        return dsc_failmsg(err, op, "%zu bytes for a %zu-byte id", cap, sizeof(ncclUniqueId));
    ncclUniqueId u;
    ncclResult_t r = n->get_unique_id(&u);
    if (r != ncclSuccess) return dsc_failmsg(err, op, "ncclGetUniqueId: %s", n->get_error_string(r));
    memcpy(id, &u, sizeof u);
    *n_out = sizeof u;
    return 0;
}

extern "C" int dsc_ep_comm_init(const ds_backend *be, const void *id, size_t len, int rank, int size, ds_err *err) {
    const char *op = "ep_comm_init";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    dsc_nccl *n = nccl_of(I, err, op);
    if (!n) return -1;
    if (len != sizeof(ncclUniqueId))
        return dsc_failmsg(err, op, "an id of %zu bytes (NCCL's is %zu)", len, sizeof(ncclUniqueId));
    if (n->comm) return dsc_failmsg(err, op, "the communicator exists already");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = n->comm_init_rank(&n->comm, size, u, rank);
    if (r != ncclSuccess) {
        n->comm = NULL;
        return dsc_failmsg(err, op, "ncclCommInitRank (rank %d of %d, GPU %d): %s", rank, size, I->gpu,
                           n->get_error_string(r));
    }
    n->rank = rank, n->size = size;
    return 0;
}

/* dst[j] = src[idx[j]] (pack), rows of D floats; rows beyond the grid's y
 * by stride */
__global__ void ep_gather_kernel(float *__restrict__ dst, const float *__restrict__ src, const int *__restrict__ idx,
                                 int rows, int D) {
    DSC_PDL_WAIT();
    for (int j = blockIdx.y; j < rows; j += gridDim.y) {
        const float *s = src + (size_t)idx[j] * D;
        float *d = dst + (size_t)j * D;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) d[c] = s[c];
    }
}

/* dst[idx[j]] = src[j] (unpack) */
__global__ void ep_scatter_kernel(float *__restrict__ dst, const float *__restrict__ src, const int *__restrict__ idx,
                                  int rows, int D) {
    DSC_PDL_WAIT();
    for (int j = blockIdx.y; j < rows; j += gridDim.y) {
        const float *s = src + (size_t)j * D;
        float *d = dst + (size_t)idx[j] * D;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) d[c] = s[c];
    }
}

static dim3 rows_grid(int rows, int D) {
    unsigned bx = (unsigned)((D + 255) / 256 < 8 ? (D + 255) / 256 : 8);
    return dim3(bx, (unsigned)(rows < 65535 ? rows : 65535));
}

static int nccl_check(dsc_nccl *n, ncclResult_t r, ncclResult_t r2, ds_err *err, const char *op, const char *what) {
    if (r == ncclSuccess && r2 == ncclSuccess) return 0;
    return dsc_failmsg(err, op, "%s: %s", what, n->get_error_string(r != ncclSuccess ? r : r2));
}

/* One buffer's ops of the plan (its rows of w words at buf; packed rows at
 * send, the receive area at recv). */
static ncclResult_t run_ops(dsc_impl *I, dsc_nccl *n, const ds_xplan *pl, float *buf, int w, float *send, float *recv) {
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < pl->n_ops && r == ncclSuccess; i++) {
        const ds_xp_op *o = &pl->ops[i];
        size_t cnt = (size_t)o->rows * w;
        int in_place = pl->way == DS_XP_IN_PLACE;
        float *src = (in_place ? buf : send) + (size_t)o->src * w, *dst = (in_place ? buf : recv) + (size_t)o->dst * w;
        if (o->kind == DS_XP_BCAST)
            r = n->broadcast(src, dst, cnt, ncclFloat32, o->peer, n->comm, I->stream);
        else if (o->kind == DS_XP_SEND)
            r = n->send(src, cnt, ncclFloat32, o->peer, n->comm, I->stream);
        else
            r = n->recv(dst, cnt, ncclFloat32, o->peer, n->comm, I->stream);
    }
    return r;
}

extern "C" int dsc_ep_exchange(const ds_backend *be, int nb, float *const *bufs, const int *widths, int rows,
                               const int *owner, const int *dest, ds_err *err) {
    const char *op = "ep_exchange";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    dsc_nccl *n = I->nccl;
    if (!n || !n->comm) return dsc_failmsg(err, op, "no communicator (ep_comm_init first)");
    if (rows <= 0 || nb <= 0) return 0;
    int wmax = 0;
    for (int b = 0; b < nb; b++) {
        if (widths[b] <= 0) return dsc_failmsg(err, op, "buffer %d: rows of %d words", b, widths[b]);
        wmax = widths[b] > wmax ? widths[b] : wmax;
    }
    char why[160];
    ds_xplan *pl = &n->plan;
    if (ds_xplan_build(pl, n->rank, n->size, rows, owner, dest, why, sizeof why))
        return dsc_failmsg(err, op, "%s", why);
    if (pl->way == DS_XP_IN_PLACE) { /* every buffer's blocks in one group */
        ncclResult_t r = n->group_start();
        for (int b = 0; b < nb && r == ncclSuccess; b++) r = run_ops(I, n, pl, bufs[b], widths[b], NULL, NULL);
        return nccl_check(n, r, n->group_end(), err, op, "the exchange in place (NCCL group)");
    }
    size_t rowb = (size_t)wmax * sizeof(float);
    float *send = (float *)dsc_scratch(I, DSC_S_EP0, (size_t)(pl->n_pack ? pl->n_pack : 1) * rowb, err, op);
    float *recv =
        send ? (float *)dsc_scratch(I, DSC_S_EP1, (size_t)(pl->n_recv ? pl->n_recv : 1) * rowb, err, op) : NULL;
    int *dmap =
        recv ? (int *)dsc_scratch(I, DSC_S_EP2, ((size_t)pl->n_pack + pl->n_recv + 1) * sizeof(int), err, op) : NULL;
    if (!dmap) return -1;
    /* the host tables to the device: packed rows, then received rows' places */
    cudaError_t ce = cudaSuccess;
    if (pl->n_pack)
        ce = cudaMemcpyAsync(dmap, pl->pack, (size_t)pl->n_pack * sizeof(int), cudaMemcpyHostToDevice, I->stream);
    if (ce == cudaSuccess && pl->n_recv)
        ce = cudaMemcpyAsync(dmap + pl->n_pack, pl->unpack, (size_t)pl->n_recv * sizeof(int), cudaMemcpyHostToDevice,
                             I->stream);
    if (ce != cudaSuccess) return dsc_fail(err, op, "the row map upload", ce);
    for (int b = 0; b < nb; b++) {
        int w = widths[b];
        if (pl->n_pack)
            dsc_launch(ep_gather_kernel, rows_grid(pl->n_pack, w), 256, 0, I->stream, send, bufs[b], dmap, pl->n_pack,
                       w);
        if (dsc_check_launch(err, op)) return -1;
        ncclResult_t r = n->group_start();
        if (r == ncclSuccess) r = run_ops(I, n, pl, bufs[b], w, send, recv);
        if (nccl_check(n, r, n->group_end(), err, op, "the exchange (NCCL group)")) return -1;
        if (pl->n_recv)
            dsc_launch(ep_scatter_kernel, rows_grid(pl->n_recv, w), 256, 0, I->stream, bufs[b], recv, dmap + pl->n_pack,
                       pl->n_recv, w);
        if (dsc_check_launch(err, op)) return -1;
    }
    return 0;
}
