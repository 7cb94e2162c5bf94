/* ep_nccl.cu — expert parallelism between GPUs (docs/ep.md): the expert
 * exchange of moe_ep over NCCL, device memory to device memory.
 *
 * After moe_experts every rank holds the rows [T][k][D] of the (token, slot)
 * pairs it owns. The exchange makes every rank hold every row: each rank
 * packs its rows in ascending pair order, each rank's block is broadcast
 * from it (one ncclBroadcast per rank, in one group: an all-gather of
 * unequal blocks), and the received blocks are scattered back to their pair
 * rows. Rows are copied, never summed: the bits are the owner's.
 *
 * NCCL is loaded at run time (dlopen "libnccl.so.2"), like cuBLAS in
 * kbench.cu: the engine links only the CUDA runtime, and a machine without
 * NCCL runs everything else. nccl.h gives the types only. */
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/internal.h"

typedef struct dsc_nccl {
    void *lib;
    ncclComm_t comm;
    int rank, size;
    int *counts, *displs, *map; /* host: rows per rank, their offsets, received row -> pair */
    size_t cap_pairs;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
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
    free(n->counts), free(n->displs), free(n->map);
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
    if (!(n->counts = (int *)calloc((size_t)size, sizeof(int))) ||
        !(n->displs = (int *)calloc((size_t)size, sizeof(int))))
        return dsc_failmsg(err, op, "out of host memory");
    return 0;
}

/* dst[j] = src[idx[j]] (pack), rows of D floats */
__global__ void ep_gather_kernel(float *__restrict__ dst, const float *__restrict__ src, const int *__restrict__ idx,
                                 int D) {
    const float *s = src + (size_t)idx[blockIdx.y] * D;
    float *d = dst + (size_t)blockIdx.y * D;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) d[c] = s[c];
}

/* dst[idx[j]] = src[j] (unpack) */
__global__ void ep_scatter_kernel(float *__restrict__ dst, const float *__restrict__ src, const int *__restrict__ idx,
                                  int D) {
    const float *s = src + (size_t)blockIdx.y * D;
    float *d = dst + (size_t)idx[blockIdx.y] * D;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) d[c] = s[c];
}

extern "C" int dsc_ep_exchange(const ds_backend *be, float *rows, int n_pairs, int D, const int *owner, ds_err *err) {
    const char *op = "ep_exchange";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    dsc_nccl *n = I->nccl;
    if (!n || !n->comm) return dsc_failmsg(err, op, "no communicator (ep_comm_init first)");
    if (n_pairs <= 0) return 0;
    if (n_pairs > 65535) return dsc_failmsg(err, op, "%d pairs exceed the grid", n_pairs);
    if ((size_t)n_pairs > n->cap_pairs) {
        int *m = (int *)realloc(n->map, 2 * (size_t)n_pairs * sizeof(int));
        if (!m) return dsc_failmsg(err, op, "out of host memory");
        n->map = m, n->cap_pairs = (size_t)n_pairs;
    }
    /* received rows rank after rank, each rank's in ascending pair order;
     * map[0..P): received row -> pair; map[P..P+mine): own rows to pack */
    int *map = n->map, *mine = map + n_pairs, n_mine = 0;
    memset(n->counts, 0, (size_t)n->size * sizeof(int));
    for (int i = 0; i < n_pairs; i++) {
        if (owner[i] < 0 || owner[i] >= n->size)
            return dsc_failmsg(err, op, "pair %d owned by rank %d of %d", i, owner[i], n->size);
        n->counts[owner[i]]++;
    }
    for (int r = 0, o = 0; r < n->size; r++) n->displs[r] = o, o += n->counts[r];
    for (int i = 0; i < n_pairs; i++) {
        map[n->displs[owner[i]]++] = i;
        if (owner[i] == n->rank) mine[n_mine++] = i;
    }
    for (int r = 0, o = 0; r < n->size; r++) n->displs[r] = o, o += n->counts[r];
    size_t rowb = (size_t)D * sizeof(float);
    float *send = (float *)dsc_scratch(I, DSC_S_EP0, (size_t)(n_mine ? n_mine : 1) * rowb, err, op);
    float *recv = send ? (float *)dsc_scratch(I, DSC_S_EP1, (size_t)n_pairs * rowb, err, op) : NULL;
    int *dmap = recv ? (int *)dsc_scratch(I, DSC_S_EP2, 2 * (size_t)n_pairs * sizeof(int), err, op) : NULL;
    if (!dmap) return -1;
    cudaError_t ce =
        cudaMemcpyAsync(dmap, map, ((size_t)n_pairs + n_mine) * sizeof(int), cudaMemcpyHostToDevice, I->stream);
    if (ce != cudaSuccess) return dsc_fail(err, op, "the row map upload", ce);
    unsigned bx = (unsigned)((D + 255) / 256 < 8 ? (D + 255) / 256 : 8);
    if (n_mine) ep_gather_kernel<<<dim3(bx, (unsigned)n_mine), 256, 0, I->stream>>>(send, rows, dmap + n_pairs, D);
    if (dsc_check_launch(err, op)) return -1;
    ncclResult_t r = n->group_start();
    for (int q = 0; q < n->size && r == ncclSuccess; q++)
        if (n->counts[q])
            r = n->broadcast(send, recv + (size_t)n->displs[q] * D, (size_t)n->counts[q] * D, ncclFloat32, q, n->comm,
                             I->stream);
    ncclResult_t r2 = n->group_end();
    if (r != ncclSuccess || r2 != ncclSuccess)
        return dsc_failmsg(err, op, "ncclBroadcast: %s", n->get_error_string(r != ncclSuccess ? r : r2));
    ep_scatter_kernel<<<dim3(bx, (unsigned)n_pairs), 256, 0, I->stream>>>(rows, recv, dmap, D);
    return dsc_check_launch(err, op);
}
