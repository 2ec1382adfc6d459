/*
 * comm_nccl.h — the communicator's NCCL side (device buffers, stream-ordered on the group's stream): the
 * checks of NCCL and CUDA calls, CommType -> ncclDataType_t, the byte count of a NCCL collective (NCCL's
 * ring formula; under the emulator the twin's measurement), comm_nccl_settle (a non-blocking
 * communicator's ncclInProgress, polled to its end under the waits' checks), and comm_sync, the watched
 * wait for a group's stream. Every communicator is non-blocking (comm_split) so that the abort path of
 * comm_watchdog.h never waits behind a NCCL call (parallel/README.md, "A watchdog that cannot hang").
 * The collectives' NCCL calls themselves are in parallel/comm.h, next to their MPI paths. Compiled against
 * NCCL by nvcc, against its twin under the emulator (model/platform.h); empty in the CPU-only build but
 * for comm_sync, which has nothing to wait for there. Part of the communicator: parallel/comm.h
 * includes it after CommGroup; include parallel/comm.h, not this file.
 */
#pragma once

#ifdef COMM_HAVE_NCCL
// A failed NCCL call: one line naming the call's file and line, then the abort path (comm_exit_failed:
// the communicators may hold kernels that will never finish; exit() could wait on them)
[[noreturn]] static inline void comm_nccl_failed(ncclResult_t r, const char* file, int line) {
    fflush(stdout);
    comm_say("error at %s:%d: NCCL error %d: %s", file, line, (int)r, ncclGetErrorString(r));
    comm_exit_failed();
}
// a call that cannot return ncclInProgress (no communicator, or a query)
#define NCCL_CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) comm_nccl_failed(r_, __FILE__, __LINE__); } while (0)
// a call on the non-blocking communicator nc of group `name`: ncclInProgress is polled to its end
// (comm_nccl_settle); none is made once another thread is on the abort path (this one parks)
#define NCCL_CHECK_NB(nc, name, call) do { comm_park_if_aborting(); ncclResult_t r_ = (call); \
    if (r_ == ncclInProgress) r_ = comm_nccl_settle((nc), (name), #call); \
    if (r_ != ncclSuccess) comm_nccl_failed(r_, __FILE__, __LINE__); } while (0)
#define CUDA_CHECK_COMM(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    fail_at(__FILE__, __LINE__, "CUDA error: %s", cudaGetErrorString(e_)); } while (0)

// A call on a non-blocking communicator returned ncclInProgress (NCCL: it is still being set up or
// enqueued in the background; no other call may be made on the communicator until its state is final).
// Polls ncclCommGetAsyncError until it is no longer ncclInProgress, with the waits' checks: a rank of this
// node gone, the hang agreement's probes, and --comm-timeout (a peer that never joins the set-up).
// Returns the final state (ncclSuccess or the error).
static inline ncclResult_t comm_nccl_settle(ncclComm_t nc, const char* group, const char* what) {
    double t0 = now_seconds(), last_check = t0, last_serve = t0;
    for (long polls = 0;; polls++) {
        comm_park_if_aborting();
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(nc, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress) return state;
        if (polls < 64) continue;
        double now = now_seconds();
        if (now - last_serve >= 0.01) {
            last_serve = now;
            comm_waiting("a NCCL call", group, t0, -1);
            comm_serve_probes();
        }
        if (now - last_check >= 1.0) {
            last_check = now;
            int lost = comm_find_lost_rank();
            if (lost >= 0) comm_lost_exit(lost, "(a NCCL call in progress)");
            if (now - t0 > g_comm_timeout) {
                comm_say("error: rank %d: %s in group %s still in progress after %.0f s", g_comm_rank, what, group, now - t0);
                comm_hang_verdict("a NCCL call", group, now - t0, -1);
            }
        }
        sched_yield();
    }
}
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

// NCCL collectives are asynchronous: wait for the group's stream, with the watchdog (a collective that
// cannot finish because a rank is gone or hangs ends in the hang agreement and the abort path, exit 1).
// MPI: nothing to wait for.
static inline void comm_sync(CommGroup* g) {
#ifdef COMM_HAVE_NCCL
    if (!g->nccl) return;
    double t0 = now_seconds(), last_check = t0, last_serve = t0;
    struct WaitTimer { double t; ~WaitTimer() { g_comm_wait_s += now_seconds() - t; } } timer{t0};
    for (;;) {
        comm_park_if_aborting();
        cudaError_t e = cudaStreamQuery(g->stream);
        comm_park_if_aborting();   // (the stream may have ended because another thread aborted its collective)
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) fail_at(__FILE__, __LINE__, "CUDA error on the %s stream: %s", g->name.c_str(), cudaGetErrorString(e));
        ncclResult_t async_err;
        NCCL_CHECK(ncclCommGetAsyncError(g->nc, &async_err));
        if (async_err == ncclInProgress) async_err = ncclSuccess;   // (a call still being enqueued: not an error)
        double now = now_seconds();
        int lost = -1;
        if (now - last_check >= 1.0) { last_check = now; lost = comm_find_lost_rank(); }
        if (now - last_serve >= 0.01) {
            last_serve = now;
            comm_waiting("a NCCL collective", g->name.c_str(), t0, -1);
            comm_serve_probes();
        }
        if (lost >= 0) comm_lost_exit(lost, "(a NCCL collective did not complete)");
        if (async_err != ncclSuccess) {
            comm_mark_exiting();
            fprintf(stderr, "error: rank %d: NCCL collective in group %s did not complete (%s, %.0f s): a rank was lost or failed; "
                    "aborting the communicators\n", g_comm_rank, g->name.c_str(), ncclGetErrorString(async_err), now - t0);
            fflush(stderr);
            comm_exit_failed();
        }
        if (now - t0 > g_comm_timeout) comm_hang_verdict("a NCCL collective", g->name.c_str(), now - t0, -1);
        sched_yield();
    }
#else
    (void)g;
#endif
}
