/* backend_select.h — the one place a command picks its backend: by name
 * ("cpu", or "cuda" in builds with the CUDA backend), a GPU index and a
 * thread count. Commands then bind their model to it (ds_model_bind). */
#ifndef DS_BACKEND_SELECT_H
#define DS_BACKEND_SELECT_H

#include "backend/backend.h"
#include "common/err.h"

typedef struct ds_backend_opts {
    const char *name; /* NULL or "cpu": the CPU backend; "cuda" */
    int gpu;          /* CUDA device index */
    int threads;      /* CPU threads (<= 0: all cores) */
    int load;         /* how the weights reach memory: CLI_LOAD_* of cli/opts.h (0: auto) */
    int rank;         /* > 0: an expert-parallel rank of this host; CUDA takes
                       * GPU (gpu + rank) mod the GPUs present (ranks may share one) */
    /* the routed experts in tiers (model/store.h; cli/util.c's cli_bind):
     * on when either of the first two is set */
    double gpu_mem;          /* GB the dense weights and the expert slots may take (0: no cap) */
    long long expert_slots;  /* the slots (0: what gpu_mem holds) */
    int tier_path;           /* DS_STORE_* */
} ds_backend_opts;

/* Opens the backend o names (o may be NULL: the CPU with all cores). Errors
 * name the backend and the cause (unknown name, not in this build, no GPU). */
int ds_backend_open(const ds_backend_opts *o, ds_backend *be, ds_err *err);
/* Releases an opened backend (a zeroed struct: nothing to do). */
void ds_backend_close(ds_backend *be);
/* The CUDA devices this process can use (0 in a build without CUDA). */
int ds_backend_gpu_count(void);
/* The backends this build has, e.g. "cpu" or "cpu cuda". */
const char *ds_backends_built(void);

#endif
