/* launch.c — see launch.h. */
#include "ep/launch.h"

#include <stdio.h>
#include <stdlib.h>

#include "ep/ep.h"
#include "ep/follow.h"

/* Undoes what launch set up on this rank. */
static void release(ds_model *m, ds_ep *ep, ds_backend *be) {
    ds_model_unbind(m);
    ds_model_set_ep(m, NULL);
    ds_ep_free(ep);
    ds_backend_close(be);
}

/* The communicator of the device exchange: rank 0 makes its id and sends it
 * to every rank; each joins. A failure ends the job (MPI_Abort). */
static void device_exchange(ds_ep *ep, ds_backend *be) {
    ds_err err = {{0}};
    struct {
        int ok;
        unsigned n;
        char id[512];
        char msg[sizeof err.msg];
    } b = {1, 0, {0}, {0}};
    size_t n = 0;
    if (ds_ep_session_rank() == 0 && be->ep_comm_id(be, b.id, sizeof b.id, &n, &err))
        b.ok = 0, snprintf(b.msg, sizeof b.msg, "%s", err.msg);
    b.n = (unsigned)n;
    ds_ep_session_bcast(&b, sizeof b);
    if (!b.ok) {
        if (ds_ep_session_rank() == 0) ds_ep_session_fatal(b.msg);
        ds_ep_session_end(1); /* rank 0 aborts the job */
        exit(1);
    }
    if (be->ep_comm_init(be, b.id, b.n, ds_ep_session_rank(), ds_ep_session_size(), &err)) ds_ep_session_fatal(err.msg);
    ds_ep_set_transport(ep, "NCCL");
}

int ds_ep_launch(ds_model *m, const ds_backend_opts *o, ds_backend *be, ds_err *err) {
    ds_err herr = {{0}};
    ds_ep *ep = NULL;
    int ok = 1;
    err->msg[0] = 0;
#ifdef DSV4_TEST_HOOKS
    const char *fail_env = getenv("DSV4_EP_FAIL_RANK"); /* tests: this rank fails to load */
    if (fail_env && atoi(fail_env) == ds_ep_session_rank())
        ok = 0, ds_fail(err, "DSV4_EP_FAIL_RANK=%s: this rank fails to load (a test)", fail_env);
#endif
    if (ok &&
        ds_ep_new(&ep, m->cfg.n_layers, m->cfg.n_routed_experts, m->cfg.n_active_experts, ds_ep_session_opts(), err))
        ok = 0;
    if (ok) ds_model_set_ep(m, ep);
    ds_backend_opts ro = *o; /* one GPU per rank of a host: --gpu N is the first */
    ro.rank = ds_ep_session_local_rank();
    if (ok && (ds_backend_open(&ro, be, err) || ds_model_bind(m, be, err))) ok = 0;
    if (ds_ep_session_ready(ok, err->msg, &herr) || !ok) {
        if (ok) *err = herr;
        release(m, ep, be);
        return -1;
    }
    /* NCCL takes one rank per GPU */
    if (ds_ep_session_all(be->ep_comm_init && ds_ep_session_local_size() <= ds_backend_gpu_count()))
        device_exchange(ep, be);
    if (ds_ep_session_rank() == 0) return DS_EP_LED;
    ds_ep_follow(m, be); /* a failure ends the job */
    release(m, ep, be);
    return DS_EP_FOLLOWED;
}

void ds_ep_launch_report(const ds_model *m, FILE *f) {
    uint64_t ex, rest;
    ds_model_expert_bytes(m, 0, &ex, &rest);
    fprintf(f,
            "expert parallel over %d ranks: %.1f MiB replicated on each (dense, shared experts, head); routed "
            "experts per rank (MiB):",
            ds_ep_session_size(), (double)rest / (1 << 20));
    for (int r = 0; r < ds_ep_session_size(); r++) {
        ds_model_expert_bytes(m, r, &ex, &rest);
        fprintf(f, " %.1f", (double)ex / (1 << 20));
    }
    fprintf(f, "; exchange: %s; attention: %s\n",
            ds_ep_transport(m->ep) ? "NCCL, device to device" : "MPI through host memory",
            ds_ep_dp(m->ep) ? "data parallel (each sequence on one rank)" : "replicated on every rank");
}
