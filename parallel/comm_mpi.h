/*
 * comm_mpi.h — the communicator's MPI transport (host buffers): nonblocking send/receive pairs under a
 * watched wait (comm_wait: yields the core, checks the node's ranks every second, gives up after
 * --comm-timeout through the hang agreement of comm_watchdog.h), the bytes sent counted where they are
 * handed to MPI, and the ring reduce-scatter and all-gather with their fixed summation order
 * (parallel/README.md). Part of the communicator: parallel/comm.h includes it after CommGroup; include
 * parallel/comm.h, not this file.
 */
#pragma once
#include <mpi.h>
#include <sched.h>
#include <vector>

#define MPI_CHECK(call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { \
    char msg_[MPI_MAX_ERROR_STRING]; int len_ = 0; MPI_Error_string(rc_, msg_, &len_); \
    fail_at(__FILE__, __LINE__, "MPI error: %s", msg_); } } while (0)

// ---------------------------------------------------------------------------------------------
// MPI transport: nonblocking send/receive pairs with a watchdog wait

// Waits for `n` requests; peers[i]: the group rank request i talks to (NULL: none in particular, e.g. a
// barrier). Yields the core while waiting (ranks may share cores); every second checks the ranks of this
// node; after g_comm_timeout seconds without progress, gives up naming the peer of the first request
// still open (MPI_Testsome says which are: a send to a stopped rank can be what is left, not the receive).
static double g_comm_wait_s = 0;   // seconds this rank spent blocked in collectives (the straggler statistic)
static inline void comm_wait(CommGroup* g, MPI_Request* reqs, int n, const int* peers, const char* op) {
    double t0 = 0, last_check = 0, last_serve = 0, tw = now_seconds();
    struct WaitTimer { double t; ~WaitTimer() { g_comm_wait_s += now_seconds() - t; } } timer{tw};
    int idx_small[8];
    std::vector<int> idx_big(n > 8 ? n : 0);
    int* idx = n > 8 ? idx_big.data() : idx_small;
    int open = n;
    for (long spins = 0;; spins++) {
        int got = 0;
        int rc = MPI_Testsome(n, reqs, &got, idx, MPI_STATUSES_IGNORE);
        int first = 0;   // the first request still open, and the world rank it talks to
        while (first < n && reqs[first] == MPI_REQUEST_NULL) first++;
        int peer = peers && first < n ? g->members[peers[first]] : -1;
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            int lost = comm_find_lost_rank();
            if (lost >= 0) comm_lost_exit(lost, "(MPI error)");
            fail_at(__FILE__, __LINE__, "rank %d: %s in group %s failed talking to rank %d: %s", g_comm_rank, op,
                    g->name.c_str(), peer, msg);
        }
        if (got == MPI_UNDEFINED || (open -= got) == 0) return;
        if (got > 0) t0 = 0;   // progress: the clock starts again
        if (spins < 64) continue;
        if (spins < 4096) { sched_yield(); continue; }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        double now = now_seconds();
        if (t0 == 0) { t0 = now; last_check = now; }
        if (now - last_serve >= 0.01) {
            last_serve = now;
            comm_waiting(op, g->name.c_str(), t0, peer);
            comm_serve_probes();
        }
        if (now - last_check >= 1.0) {
            last_check = now;
            int lost = comm_find_lost_rank();
            if (lost >= 0) {
                char what[160];
                snprintf(what, sizeof what, "during %s in group %s", op, g->name.c_str());
                comm_lost_exit(lost, what);
            }
            if (now - t0 > g_comm_timeout) comm_hang_verdict(op, g->name.c_str(), now - t0, peer);
        }
    }
}

// sends `sbytes` to group rank `dst` while receiving `rbytes` from `src`; counts what it sends
static inline void comm_sendrecv(CommGroup* g, const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes,
                                 int src, const char* op) {
    const size_t piece = (size_t)1 << 30;   // MPI counts are int
    size_t so = 0, ro = 0;
    while (so < sbytes || ro < rbytes || (so == 0 && ro == 0)) {
        size_t sn = sbytes - so < piece ? sbytes - so : piece, rn = rbytes - ro < piece ? rbytes - ro : piece;
        MPI_Request r[2];
        MPI_CHECK(MPI_Irecv((char*)rbuf + ro, (int)rn, MPI_BYTE, src, 7, g->mpi, &r[0]));
        MPI_CHECK(MPI_Isend((const char*)sbuf + so, (int)sn, MPI_BYTE, dst, 7, g->mpi, &r[1]));
        int peers[2] = {src, dst};
        comm_wait(g, r, 2, peers, op);
        g->bytes_sent += sn;
        so += sn; ro += rn;
        if (sbytes == 0 && rbytes == 0) break;
    }
}

static inline void* comm_scratch(CommGroup* g, size_t bytes) {
    if (g->scratch.size() < bytes) g->scratch.resize(bytes);
    return g->scratch.data();
}

// acc[i] += x[i] for the reducible types
static inline void comm_add(void* acc, const void* x, size_t n, CommType t) {
    switch (t) {
    case COMM_F32: { float* a = (float*)acc; const float* b = (const float*)x;
        #pragma omp parallel for if (n > (1 << 18))
        for (size_t i = 0; i < n; i++) a[i] += b[i];
        break; }
    case COMM_F64: { double* a = (double*)acc; const double* b = (const double*)x;
        for (size_t i = 0; i < n; i++) a[i] += b[i];
        break; }
    case COMM_I32: { int32_t* a = (int32_t*)acc; const int32_t* b = (const int32_t*)x;
        for (size_t i = 0; i < n; i++) a[i] += b[i];
        break; }
    default: fail_at(__FILE__, __LINE__, "comm: no reduction for %s on the MPI backend", comm_type_name(t));
    }
}

// chunk i of a ring over `n` elements split into `s` chunks: [off, off + len)
static inline void ring_chunk(size_t n, int s, int i, size_t* off, size_t* len) {
    size_t c = (n + s - 1) / s;
    size_t lo = (size_t)i * c < n ? (size_t)i * c : n, hi = lo + c < n ? lo + c : n;
    *off = lo; *len = hi - lo;
}
static inline int ring_mod(int a, int s) { return ((a % s) + s) % s; }

// Ring reduce-scatter, in place over buf (n elements, chunked as ring_chunk): afterwards chunk r of
// buf holds the sum over ranks. Summation order for chunk j: ((x_{j+1} + x_{j+2}) + ...) + x_j.
static inline void ring_reduce_scatter_inplace(CommGroup* g, void* buf, size_t n, CommType t, const char* op) {
    int s = g->size, r = g->rank, right = ring_mod(r + 1, s), left = ring_mod(r - 1, s);
    size_t es = comm_type_size(t), maxc = (n + s - 1) / s;
    char* b = (char*)buf;
    char* tmp = (char*)comm_scratch(g, maxc * es);
    for (int k = 0; k < s - 1; k++) {
        size_t so, sl, ro, rl;
        ring_chunk(n, s, ring_mod(r - 1 - k, s), &so, &sl);
        ring_chunk(n, s, ring_mod(r - 2 - k, s), &ro, &rl);
        comm_sendrecv(g, b + so * es, sl * es, right, tmp, rl * es, left, op);
        comm_add(b + ro * es, tmp, rl, t);
    }
}

// Ring all-gather, in place: chunk r of buf is this rank's; afterwards buf holds every chunk.
static inline void ring_all_gather_inplace(CommGroup* g, void* buf, size_t n, size_t es, const char* op) {
    int s = g->size, r = g->rank, right = ring_mod(r + 1, s), left = ring_mod(r - 1, s);
    char* b = (char*)buf;
    for (int k = 0; k < s - 1; k++) {
        size_t so, sl, ro, rl;
        ring_chunk(n, s, ring_mod(r - k, s), &so, &sl);
        ring_chunk(n, s, ring_mod(r - k - 1, s), &ro, &rl);
        comm_sendrecv(g, b + so * es, sl * es, right, b + ro * es, rl * es, left, op);
    }
}
