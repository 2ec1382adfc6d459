/*
 * comm_nccl.h — the communicator's NCCL side (device buffers, stream-ordered on the group's stream): the
 * checks of NCCL and CUDA calls, CommType -> ncclDataType_t, the byte count of a NCCL collective (NCCL's
 * ring formula; under the emulator the twin's measurement), and comm_sync, the watched wait for a group's
 * stream. The collectives' NCCL calls themselves are in parallel/comm.h, next to their MPI paths. Compiled
 * against NCCL by nvcc, against its twin under the emulator (model/platform.h); empty in the CPU-only
 * build but for comm_sync, which has nothing to wait for there. Part of the communicator: parallel/comm.h
 * includes it after CommGroup; include parallel/comm.h, not this file.
 */
#pragma once

#ifdef COMM_HAVE_NCCL
#define NCCL_CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) \
    fail_at(__FILE__, __LINE__, "NCCL error %d: %s", (int)r_, ncclGetErrorString(r_)); } while (0)
#define CUDA_CHECK_COMM(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    fail_at(__FILE__, __LINE__, "CUDA error: %s", cudaGetErrorString(e_)); } while (0)
#endif

#ifdef COMM_HAVE_NCCL
static inline ncclDataType_t nccl_type(CommType t) {
    switch (t) { case COMM_F32: return ncclFloat32; case COMM_F64: return ncclFloat64; case COMM_BF16: return ncclBfloat16;
                 case COMM_I32: return ncclInt32; default: return ncclInt8; }
}

// Bytes of a NCCL collective. NCCL does not say what it sent: bytes_sent gets `formula`, the per-rank
// volume of NCCL's ring, issued as  nccl...(...); comm_nccl_count(g, formula);
// Under the emulator the twin counts the bytes it hands to MPI when an operation runs (on a deferred
// stream: when the stream is waited for), and comm_bytes_sent reads that measurement instead;
// nccl_formula_bytes keeps the formula's sum in both builds, so that a test compares the two.
static inline void comm_nccl_count(CommGroup* g, uint64_t formula) {
    g->nccl_formula_bytes += formula;
    if (!platform_nccl_counts_bytes()) g->bytes_sent += formula;
}
#endif

// NCCL collectives are asynchronous: wait for the group's stream, with the watchdog (a collective
// that cannot finish because a rank is gone ends in ncclCommAbort and exit 1). MPI: nothing to wait for.
static inline void comm_sync(CommGroup* g) {
#ifdef COMM_HAVE_NCCL
    if (!g->nccl) return;
    double t0 = now_seconds(), last_check = t0, last_serve = t0;
    struct WaitTimer { double t; ~WaitTimer() { g_comm_wait_s += now_seconds() - t; } } timer{t0};
    for (;;) {
        cudaError_t e = cudaStreamQuery(g->stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) fail_at(__FILE__, __LINE__, "CUDA error on the %s stream: %s", g->name.c_str(), cudaGetErrorString(e));
        ncclResult_t async_err;
        NCCL_CHECK(ncclCommGetAsyncError(g->nc, &async_err));
        double now = now_seconds();
        int lost = -1;
        if (now - last_check >= 1.0) { last_check = now; lost = comm_find_lost_rank(); }
        if (now - last_serve >= 0.01) { last_serve = now; comm_serve_probes(); }
        if (async_err != ncclSuccess || lost >= 0 || now - t0 > g_comm_timeout) {
            comm_mark_exiting();
            ncclCommAbort(g->nc);
            if (lost >= 0) comm_die_lost(lost, "(NCCL communicator aborted)");
            if (async_err == ncclSuccess) comm_hang_verdict("a NCCL collective", g->name.c_str(), now - t0, -1);
            fprintf(stderr, "error: rank %d: NCCL collective in group %s did not complete (%s, %.0f s); communicator "
                    "aborted; a rank was lost or hangs; exiting\n", g_comm_rank, g->name.c_str(),
                    async_err != ncclSuccess ? ncclGetErrorString(async_err) : "timeout", now - t0);
            fflush(stderr);
            _exit(EXIT_RUNTIME);
        }
        sched_yield();
    }
#else
    (void)g;
#endif
}
