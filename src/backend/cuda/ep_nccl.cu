/* ep_nccl.cu — expert parallelism between GPUs (docs/ep.md): the exchanges
 * of moe_ep and of the head's rows over NCCL, device memory to device memory.
 *
 * An exchange moves rows that one rank filled (owner[j]) to the ranks that
 * need them: every rank (an all-gather) or the rank dest[j] (an all-to-all).
 * Three ways, by the tables alone:
 * - rows already grouped by owner, rank after rank, going everywhere or all
 *   to one rank (data-parallel attention's MoE inputs, routes and weights;
 *   the head's rows to rank 0): in place, one ncclBroadcast per rank (or an
 *   ncclSend / ncclRecv pair) per buffer, every buffer in one NCCL group —
 *   no copies, no upload;
 * - any owners, every rank (replicated attention's pair rows): each rank
 *   packs its rows in ascending row order, each block is broadcast from its
 *   rank, the received blocks are scattered back to their rows;
 * - any owners, to dest (data-parallel attention's pair rows, each to its
 *   token's home rank): to each peer the rows it needs in ascending order
 *   (ncclSend), from each peer likewise (ncclRecv), in one group, then
 *   scattered to their rows.
 * Rows are copied, never summed: the bits are the owner's.
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
    int *counts, *displs;   /* host [size]: rows per rank and their offsets (all-gathers; all-to-all: sent) */
    int *rcounts, *rdispls; /* host [size]: rows received per rank and their offsets (all-to-all) */
    int *map;               /* host [2 n]: rows to pack, then received row -> row */
    size_t cap_pairs;
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
    free(n->counts), free(n->displs), free(n->rcounts), free(n->rdispls), free(n->map);
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
        !(n->displs = (int *)calloc((size_t)size, sizeof(int))) ||
        !(n->rcounts = (int *)calloc((size_t)size, sizeof(int))) ||
        !(n->rdispls = (int *)calloc((size_t)size, sizeof(int))))
        return dsc_failmsg(err, op, "out of host memory");
    return 0;
}

/* dst[j] = src[idx[j]] (pack), rows of D floats; rows beyond the grid's y
 * by stride */
__global__ void ep_gather_kernel(float *__restrict__ dst, const float *__restrict__ src, const int *__restrict__ idx,
                                 int rows, int D) {
    for (int j = blockIdx.y; j < rows; j += gridDim.y) {
        const float *s = src + (size_t)idx[j] * D;
        float *d = dst + (size_t)j * D;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < D; c += gridDim.x * blockDim.x) d[c] = s[c];
    }
}

/* dst[idx[j]] = src[j] (unpack) */
__global__ void ep_scatter_kernel(float *__restrict__ dst, const float *__restrict__ src, const int *__restrict__ idx,
                                  int rows, int D) {
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

static int grow_map(dsc_nccl *n, int rows, ds_err *err, const char *op) {
    if ((size_t)rows <= n->cap_pairs) return 0;
    int *m = (int *)realloc(n->map, 2 * (size_t)rows * sizeof(int));
    if (!m) return dsc_failmsg(err, op, "out of host memory");
    n->map = m, n->cap_pairs = (size_t)rows;
    return 0;
}

/* The in-place case: rows grouped by owner, going everywhere (dest < 0) or
 * all to rank dest. */
static int exchange_in_place(dsc_impl *I, dsc_nccl *n, int nb, float *const *bufs, const int *widths, int dest,
                             ds_err *err, const char *op) {
    ncclResult_t r = n->group_start();
    for (int b = 0; b < nb && r == ncclSuccess; b++)
        for (int q = 0; q < n->size && r == ncclSuccess; q++) {
            size_t cnt = (size_t)n->counts[q] * widths[b];
            float *p = bufs[b] + (size_t)n->displs[q] * widths[b];
            if (!cnt) continue;
            if (dest < 0)
                r = n->broadcast(p, p, cnt, ncclFloat32, q, n->comm, I->stream);
            else if (q != dest && n->rank == q)
                r = n->send(p, cnt, ncclFloat32, dest, n->comm, I->stream);
            else if (q != dest && n->rank == dest)
                r = n->recv(p, cnt, ncclFloat32, q, n->comm, I->stream);
        }
    ncclResult_t r2 = n->group_end();
    return nccl_check(n, r, r2, err, op, dest < 0 ? "ncclBroadcast" : "ncclSend / ncclRecv");
}

/* Any owners, every rank: pack this rank's rows, broadcast each rank's block,
 * scatter the received rows. */
static int exchange_gather(dsc_impl *I, dsc_nccl *n, int nb, float *const *bufs, const int *widths, int rows,
                           const int *owner, int wmax, ds_err *err, const char *op) {
    /* map[0..rows): received row -> row (rank after rank, ascending);
     * map[rows..rows + mine): this rank's rows to pack */
    int *map = n->map, *mine = map + rows, n_mine = 0;
    for (int i = 0; i < rows; i++) {
        map[n->displs[owner[i]]++] = i;
        if (owner[i] == n->rank) mine[n_mine++] = i;
    }
    for (int q = 0, o = 0; q < n->size; q++) n->displs[q] = o, o += n->counts[q];
    size_t rowb = (size_t)wmax * sizeof(float);
    float *send = (float *)dsc_scratch(I, DSC_S_EP0, (size_t)(n_mine ? n_mine : 1) * rowb, err, op);
    float *recv = send ? (float *)dsc_scratch(I, DSC_S_EP1, (size_t)rows * rowb, err, op) : NULL;
    int *dmap = recv ? (int *)dsc_scratch(I, DSC_S_EP2, 2 * (size_t)rows * sizeof(int), err, op) : NULL;
    if (!dmap) return -1;
    cudaError_t ce =
        cudaMemcpyAsync(dmap, map, ((size_t)rows + n_mine) * sizeof(int), cudaMemcpyHostToDevice, I->stream);
    if (ce != cudaSuccess) return dsc_fail(err, op, "the row map upload", ce);
    for (int b = 0; b < nb; b++) {
        int w = widths[b];
        if (n_mine)
            ep_gather_kernel<<<rows_grid(n_mine, w), 256, 0, I->stream>>>(send, bufs[b], dmap + rows, n_mine, w);
        if (dsc_check_launch(err, op)) return -1;
        ncclResult_t r = n->group_start();
        for (int q = 0; q < n->size && r == ncclSuccess; q++)
            if (n->counts[q])
                r = n->broadcast(send, recv + (size_t)n->displs[q] * w, (size_t)n->counts[q] * w, ncclFloat32, q,
                                 n->comm, I->stream);
        ncclResult_t r2 = n->group_end();
        if (nccl_check(n, r, r2, err, op, "ncclBroadcast")) return -1;
        ep_scatter_kernel<<<rows_grid(rows, w), 256, 0, I->stream>>>(bufs[b], recv, dmap, rows, w);
        if (dsc_check_launch(err, op)) return -1;
    }
    return 0;
}

/* Any owners, to dest: to each peer the rows this rank filled that it needs,
 * from each peer the rows it filled that this rank needs, both ascending. */
static int exchange_to(dsc_impl *I, dsc_nccl *n, int nb, float *const *bufs, const int *widths, int rows,
                       const int *owner, const int *dest, int wmax, ds_err *err, const char *op) {
    int me = n->rank;
    memset(n->counts, 0, (size_t)n->size * sizeof(int));
    memset(n->rcounts, 0, (size_t)n->size * sizeof(int));
    for (int i = 0; i < rows; i++) {
        if (owner[i] == me && dest[i] != me) n->counts[dest[i]]++;
        if (dest[i] == me && owner[i] != me) n->rcounts[owner[i]]++;
    }
    int n_send = 0, n_recv = 0;
    for (int q = 0; q < n->size; q++)
        n->displs[q] = n_send, n_send += n->counts[q], n->rdispls[q] = n_recv, n_recv += n->rcounts[q];
    if (!n_send && !n_recv) return 0;
    /* map[0..n_send): rows to pack, peer after peer; map[n_send..): received row -> row */
    int *map = n->map, *rmap = map + n_send;
    for (int i = 0; i < rows; i++) {
        if (owner[i] == me && dest[i] != me) map[n->displs[dest[i]]++] = i;
        if (dest[i] == me && owner[i] != me) rmap[n->rdispls[owner[i]]++] = i;
    }
    for (int q = 0, so = 0, ro = 0; q < n->size; q++)
        n->displs[q] = so, so += n->counts[q], n->rdispls[q] = ro, ro += n->rcounts[q];
    size_t rowb = (size_t)wmax * sizeof(float);
    float *send = (float *)dsc_scratch(I, DSC_S_EP0, (size_t)(n_send ? n_send : 1) * rowb, err, op);
    float *recv = send ? (float *)dsc_scratch(I, DSC_S_EP1, (size_t)(n_recv ? n_recv : 1) * rowb, err, op) : NULL;
    int *dmap = recv ? (int *)dsc_scratch(I, DSC_S_EP2, ((size_t)n_send + n_recv) * sizeof(int), err, op) : NULL;
    if (!dmap) return -1;
    cudaError_t ce =
        cudaMemcpyAsync(dmap, map, ((size_t)n_send + n_recv) * sizeof(int), cudaMemcpyHostToDevice, I->stream);
    if (ce != cudaSuccess) return dsc_fail(err, op, "the row map upload", ce);
    for (int b = 0; b < nb; b++) {
        int w = widths[b];
        if (n_send) ep_gather_kernel<<<rows_grid(n_send, w), 256, 0, I->stream>>>(send, bufs[b], dmap, n_send, w);
        if (dsc_check_launch(err, op)) return -1;
        ncclResult_t r = n->group_start();
        for (int q = 0; q < n->size && r == ncclSuccess; q++) {
            if (n->counts[q])
                r = n->send(send + (size_t)n->displs[q] * w, (size_t)n->counts[q] * w, ncclFloat32, q, n->comm,
                            I->stream);
            if (r == ncclSuccess && n->rcounts[q])
                r = n->recv(recv + (size_t)n->rdispls[q] * w, (size_t)n->rcounts[q] * w, ncclFloat32, q, n->comm,
                            I->stream);
        }
        ncclResult_t r2 = n->group_end();
        if (nccl_check(n, r, r2, err, op, "ncclSend / ncclRecv")) return -1;
        if (n_recv)
            ep_scatter_kernel<<<rows_grid(n_recv, w), 256, 0, I->stream>>>(bufs[b], recv, dmap + n_send, n_recv, w);
        if (dsc_check_launch(err, op)) return -1;
    }
    return 0;
}

extern "C" int dsc_ep_exchange(const ds_backend *be, int nb, float *const *bufs, const int *widths, int rows,
                               const int *owner, const int *dest, ds_err *err) {
    const char *op = "ep_exchange";
    if (dsc_use(be, err, op)) return -1;
    dsc_impl *I = dsc_of(be);
    dsc_nccl *n = I->nccl;
    if (!n || !n->comm) return dsc_failmsg(err, op, "no communicator (ep_comm_init first)");
    if (rows <= 0 || nb <= 0) return 0;
    if (grow_map(n, rows, err, op)) return -1;
    int wmax = 0;
    for (int b = 0; b < nb; b++) {
        if (widths[b] <= 0) return dsc_failmsg(err, op, "buffer %d: rows of %d words", b, widths[b]);
        wmax = widths[b] > wmax ? widths[b] : wmax;
    }
    /* rows per owner; grouped: owners non-decreasing; one_dest: every row to one rank */
    int grouped = 1, one_dest = dest ? dest[0] : -1;
    memset(n->counts, 0, (size_t)n->size * sizeof(int));
    for (int i = 0; i < rows; i++) {
        if (owner[i] < 0 || owner[i] >= n->size)
            return dsc_failmsg(err, op, "row %d filled by rank %d of %d", i, owner[i], n->size);
        if (dest && (dest[i] < 0 || dest[i] >= n->size))
            return dsc_failmsg(err, op, "row %d sent to rank %d of %d", i, dest[i], n->size);
        if (i && owner[i] < owner[i - 1]) grouped = 0;
        if (dest && dest[i] != one_dest) one_dest = -2;
        n->counts[owner[i]]++;
    }
    for (int q = 0, o = 0; q < n->size; q++) n->displs[q] = o, o += n->counts[q];
    if (grouped && one_dest > -2) return exchange_in_place(I, n, nb, bufs, widths, one_dest, err, op);
    if (!dest) return exchange_gather(I, n, nb, bufs, widths, rows, owner, wmax, err, op);
    return exchange_to(I, n, nb, bufs, widths, rows, owner, dest, wmax, err, op);
}
