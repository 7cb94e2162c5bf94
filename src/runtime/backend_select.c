/* backend_select.c — see backend_select.h. */
#include "runtime/backend_select.h"

#include <string.h>

#include "backend/cpu/cpu.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

const char *ds_backends_built(void) {
#ifdef DSV4_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

int ds_backend_gpu_count(void) {
#ifdef DSV4_HAVE_CUDA
    return ds_backend_cuda_count();
#else
    return 0;
#endif
}

#ifndef DSV4_HAVE_CUDA
/* The error of a CUDA entry point in a build without the CUDA backend. */
static int no_cuda(ds_err *err) {
    return ds_fail(err, "backend 'cuda': this build has no CUDA backend (built: %s; configure with -DDSV4_CUDA=ON)",
                   ds_backends_built());
}
#endif

int ds_backend_open(const ds_backend_opts *o, ds_backend *be, ds_err *err) {
    memset(be, 0, sizeof *be);
    const char *name = o && o->name ? o->name : "cpu";
    if (!strcmp(name, "cpu")) {
        if (ds_backend_cpu_init(be, o ? o->threads : 0)) return ds_fail(err, "cpu backend: out of memory");
        return 0;
    }
    if (!strcmp(name, "cuda")) {
#ifdef DSV4_HAVE_CUDA
        int gpu = o ? o->gpu : 0, n = ds_backend_cuda_count();
        if (o && o->rank > 0 && n > 0) gpu = (gpu + o->rank) % n;
        return ds_backend_cuda_init(be, gpu, err);
#else
        return no_cuda(err);
#endif
    }
    return ds_fail(err, "unknown backend '%s' (this build has: %s)", name, ds_backends_built());
}

void ds_backend_close(ds_backend *be) {
    if (be->close) be->close(be);
    memset(be, 0, sizeof *be);
}
