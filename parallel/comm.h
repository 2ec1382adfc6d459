/*
 * comm.h — the communicator: one interface for the collectives of sharded training, with two
 * implementations behind it.
 *   MPI  (host buffers; the CPU backend, and the bootstrap of everything): ring algorithms written
 *        here on top of nonblocking point-to-point messages, so that (1) the bytes each rank sends
 *        are counted where they are handed to MPI, not estimated, (2) the summation order of a
 *        reduction is fixed and documented (parallel/README.md), and (3) every wait has a watchdog
 *        that names a lost rank instead of hanging.
 *   NCCL (device buffers, stream-ordered on the group's stream): ncclUniqueId broadcast over the group's
 *        MPI communicator, one NCCL communicator per group. Compiled by nvcc against NCCL; under the SIMT
 *        emulator (g++ -DSIMT_EMULATION) against NCCL's twin, test/simt/nccl_twin.h, which runs the same
 *        calls on the CPU over MPI, so that this path is executed in CI. There the bytes sent are measured
 *        by the twin; on NCCL they are NCCL's ring volume (a formula: NCCL does not report them).
 * Collectives: all_gather, reduce_scatter (sum), all_reduce (sum), broadcast, barrier, all_to_all,
 * and comm_split for sub-groups (HSDP's shard and replica groups).
 *
 * Failure handling: a rank killed mid-step must not leave the others hanging. Every rank records the
 * pid and start time of the ranks on its node at start-up; a wait that makes no progress checks them
 * every second, and the SIGTERM that mpirun sends the survivors when a rank dies checks them too. A
 * dead rank is reported as "lost rank R" and the process exits with status 1. A wait with no progress
 * for --comm-timeout seconds (a rank on another node is gone, or hangs) exits the same way, naming
 * the rank it was waiting for. On NCCL the same timeout ends in ncclCommAbort.
 */
#pragma once
#include <mpi.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "../model/common.h"
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <nccl.h>
#define COMM_HAVE_NCCL 1
#elif defined(SIMT_EMULATION)
// the emulator's CUDA runtime and the NCCL twin: the NCCL path below, run on the CPU over MPI
#include "../test/simt/simt.h"
#include "../test/simt/nccl_twin.h"
#define COMM_HAVE_NCCL 1
#endif

#define MPI_CHECK(call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { \
    char msg_[MPI_MAX_ERROR_STRING]; int len_ = 0; MPI_Error_string(rc_, msg_, &len_); \
    fail_at(__FILE__, __LINE__, "MPI error: %s", msg_); } } while (0)
#ifdef COMM_HAVE_NCCL
#define NCCL_CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) \
    fail_at(__FILE__, __LINE__, "NCCL error %d: %s", (int)r_, ncclGetErrorString(r_)); } while (0)
#define CUDA_CHECK_COMM(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) \
    fail_at(__FILE__, __LINE__, "CUDA error: %s", cudaGetErrorString(e_)); } while (0)
#endif

typedef enum { COMM_F32, COMM_F64, COMM_BF16, COMM_I32, COMM_BYTE } CommType;
static inline size_t comm_type_size(CommType t) {
    switch (t) { case COMM_F64: return 8; case COMM_BF16: return 2; case COMM_BYTE: return 1; default: return 4; }
}
static inline const char* comm_type_name(CommType t) {
    switch (t) { case COMM_F32: return "float"; case COMM_F64: return "double"; case COMM_BF16: return "bfloat16";
                 case COMM_I32: return "int32"; default: return "byte"; }
}

// One group of ranks. The world is a group; comm_split makes sub-groups.
typedef struct {
    std::string name;            // "world", "shard", "replica": named in error messages
    int rank, size;              // this process's rank in the group, and the group's size
    std::vector<int> members;    // group rank -> world rank
    MPI_Comm mpi;
    int nccl;                    // 1: collectives run on NCCL over device buffers
#ifdef COMM_HAVE_NCCL
    ncclComm_t nc;
    cudaStream_t stream;         // the group's communication stream; NCCL collectives are ordered on it
    int owns_stream;             // 0: another group's stream, shared (comm_share_stream)
#endif
    uint64_t bytes_sent;         // payload bytes this rank has sent in this group's collectives
    uint64_t nccl_formula_bytes; // NCCL groups: the same count from NCCL's ring formulas (under the emulator
                                 // bytes_sent is the twin's measurement instead: tests compare the two)
    uint64_t calls;              // collectives issued
    std::vector<char> scratch;   // the ring's receive buffer (MPI)
    std::vector<char> staging;   // copy of an out-of-place reduce-scatter's input (MPI)
} CommGroup;

// The process: world rank/size, the rank on the node (its GPU), and the world group.
typedef struct {
    int rank, world, local_rank, local_size;
    CommGroup world_group;
} Comm;

// ---------------------------------------------------------------------------------------------
// liveness of the ranks on this node (the watchdog's evidence). Plain globals: the SIGTERM handler
// reads them, and everything it calls is async-signal-safe (open/read/close/write, no stdio/malloc).

#define COMM_MAX_LOCAL 256
static int g_comm_rank = 0;
static int g_comm_nlocal = 0;
static int g_comm_local_rank[COMM_MAX_LOCAL];     // world rank of each rank on this node
static int g_comm_local_pid[COMM_MAX_LOCAL];
static unsigned long long g_comm_local_start[COMM_MAX_LOCAL];   // /proc/<pid>/stat field 22
// One per rank of this node, in node-shared memory: the failure flag, and the heartbeat — what the rank is
// doing and since when (comm_phase) — so that when a rank stops answering, its node peers can say where.
typedef struct {
    volatile int exiting;     // 1 once the rank exits over a failure it saw
    volatile double since;    // now_seconds() at the last comm_phase
    char phase[160];
} CommLocalSlot;
static CommLocalSlot* g_comm_slots = NULL;        // [local index]
static int g_comm_my_local = 0;
static int g_comm_world_size = 1;
static MPI_Comm g_comm_probe = MPI_COMM_NULL;     // a duplicate of the world: the hang agreement's messages only
static char g_comm_phase_prefix[48] = "";
static MPI_Win g_comm_win = MPI_WIN_NULL;
static MPI_Comm g_comm_node = MPI_COMM_NULL;
static double g_comm_timeout = 600;               // seconds without progress before giving up
static volatile sig_atomic_t g_comm_stop_signal = 0;   // SIGTERM/SIGINT received, no rank lost: stop cleanly

// Reads /proc/<pid>/stat: returns 0 if gone, a zombie, or a different process (pid reused), else 1.
// Sets *start to the start time when start_out is given. Signal-safe.
static inline int comm_proc_alive(int pid, unsigned long long expect_start, unsigned long long* start_out) {
    char path[64] = "/proc/";
    int n = 6;
    char digits[16];
    int nd = 0;
    for (int p = pid; p > 0 && nd < 15; p /= 10) digits[nd++] = (char)('0' + p % 10);
    while (nd > 0) path[n++] = digits[--nd];
    const char* tail = "/stat";
    for (int i = 0; tail[i]; i++) path[n++] = tail[i];
    path[n] = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    char buf[1024];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0) return 0;
    buf[got] = 0;
    // "pid (comm) S ppid ..." — comm may hold spaces and ')', so parse from the last ')'
    int close_paren = -1;
    for (int i = 0; i < got; i++) if (buf[i] == ')') close_paren = i;
    if (close_paren < 0 || close_paren + 2 >= got) return 0;
    char state = buf[close_paren + 2];
    if (state == 'Z' || state == 'X' || state == 'x') return 0;
    // field 3 is the state; the start time is field 22
    int field = 3;
    unsigned long long start = 0;
    for (int i = close_paren + 2; i < got; i++) {
        if (buf[i] == ' ') { field++; continue; }
        if (field == 22 && buf[i] >= '0' && buf[i] <= '9') start = start * 10 + (unsigned long long)(buf[i] - '0');
        if (field > 22) break;
    }
    if (start_out) *start_out = start;
    if (expect_start && start != expect_start) return 0;
    return 1;
}

// local index of a rank on this node that is gone without having said why (a rank that exits over a
// failure it detected marks itself first, so that it is not taken for the lost one), or -1. Signal-safe.
static inline int comm_find_lost_rank() {
    for (int i = 0; i < g_comm_nlocal; i++)
        if (g_comm_local_rank[i] != g_comm_rank && !(g_comm_slots && g_comm_slots[i].exiting) &&
            !comm_proc_alive(g_comm_local_pid[i], g_comm_local_start[i], NULL))
            return i;
    return -1;
}

// this process is about to exit over a failure (signal-safe)
static inline void comm_mark_exiting() {
    if (g_comm_slots) g_comm_slots[g_comm_my_local].exiting = 1;
}

// Every rank has agreed to exit with a failure (the health check's verdict, reached from the same numbers
// on every rank). The launcher answers the first non-zero exit by sending SIGTERM to the others, which may
// still be in comm_finalize, where the node's exiting flags are no longer readable: from now on a rank
// that is gone exited with the rest and was not lost, and the signal changes nothing.
static volatile sig_atomic_t g_comm_agreed_exit = 0;
static inline void comm_agreed_failure() {
    comm_mark_exiting();
    g_comm_agreed_exit = 1;
}

static inline void comm_write_int(char* buf, int* n, long long v) {
    char d[24];
    int nd = 0;
    if (v < 0) { buf[(*n)++] = '-'; v = -v; }
    do { d[nd++] = (char)('0' + v % 10); v /= 10; } while (v > 0);
    while (nd > 0) buf[(*n)++] = d[--nd];
}
static inline void comm_write_str(char* buf, int* n, const char* s) { while (*s && *n < 400) buf[(*n)++] = *s++; }

// "error: rank 0: lost rank 1 (pid 123 on this node is gone) during <what>; exiting" and _exit(1). Signal-safe.
[[noreturn]] static inline void comm_die_lost(int local_index, const char* what) {
    char msg[512];
    int n = 0;
    comm_write_str(msg, &n, "error: rank ");
    comm_write_int(msg, &n, g_comm_rank);
    comm_write_str(msg, &n, ": lost rank ");
    comm_write_int(msg, &n, g_comm_local_rank[local_index]);
    comm_write_str(msg, &n, " (pid ");
    comm_write_int(msg, &n, g_comm_local_pid[local_index]);
    comm_write_str(msg, &n, " on this node is gone) ");
    comm_write_str(msg, &n, what);
    comm_write_str(msg, &n, "; exiting\n");
    comm_mark_exiting();
    ssize_t ignored = write(2, msg, (size_t)n);
    (void)ignored;
    // The other survivors are checking too (the launcher signals them all at once): stay a moment, so
    // that none of them takes this process for the lost one.
    struct timespec ts = {0, 500000000}, rem;
    while (nanosleep(&ts, &rem) != 0 && errno == EINTR) ts = rem;
    _exit(EXIT_RUNTIME);
}

// SIGTERM/SIGINT/SIGUSR1. mpirun sends SIGTERM to the survivors when a rank dies: if a rank on this node is
// gone, say which and exit 1 now. Otherwise it is a request to stop (the training loop checks
// g_comm_stop_signal at the end of each step).
static inline void comm_on_signal(int sig) {
    if (g_comm_agreed_exit) return;   // exiting already, with every other rank (comm_agreed_failure)
    int lost = comm_find_lost_rank();
    if (lost >= 0) comm_die_lost(lost, sig == SIGTERM ? "(SIGTERM from the launcher)" : "(signal)");
    if (g_comm_stop_signal) {   // a second signal: the user insists
        const char* m = "error: second stop signal: exiting without saving\n";
        ssize_t ignored = write(2, m, strlen(m));
        (void)ignored;
        _exit(EXIT_RUNTIME);
    }
    g_comm_stop_signal = sig;
}

// ---------------------------------------------------------------------------------------------
// start-up

static inline void comm_group_init_world(CommGroup* g) {
    g->name = "world";
    g->mpi = MPI_COMM_WORLD;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g->size));
    g->members.resize(g->size);
    for (int i = 0; i < g->size; i++) g->members[i] = i;
    g->nccl = 0;
    g->bytes_sent = 0;
    g->nccl_formula_bytes = 0;
    g->calls = 0;
}

static inline Comm comm_init(int* argc, char*** argv) {
    Comm c;
    MPI_CHECK(MPI_Init(argc, argv));
    // errors come back as return codes, so that every message names our file and line
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c.world));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(node, &c.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &c.local_size));
    // the watchdog's evidence: world rank, pid and start time of every rank on this node
    unsigned long long start = 0;
    comm_proc_alive((int)getpid(), 0, &start);
    long long mine[3] = {c.rank, (long long)getpid(), (long long)start};
    std::vector<long long> all((size_t)3 * c.local_size);
    MPI_CHECK(MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, node));
    // a CommLocalSlot per local rank in node-shared memory: "exiting over a failure I detected", the heartbeat
    CommLocalSlot* base = NULL;
    MPI_CHECK(MPI_Win_allocate_shared(sizeof(CommLocalSlot), sizeof(CommLocalSlot), MPI_INFO_NULL, node, &base, &g_comm_win));
    MPI_Aint wsize;
    int disp;
    MPI_CHECK(MPI_Win_shared_query(g_comm_win, 0, &wsize, &disp, &base));
    if (c.local_size <= COMM_MAX_LOCAL) g_comm_slots = base;
    g_comm_my_local = c.local_rank;
    if (g_comm_slots) { g_comm_slots[c.local_rank].exiting = 0; g_comm_slots[c.local_rank].since = now_seconds();
                        snprintf(g_comm_slots[c.local_rank].phase, sizeof g_comm_slots[0].phase, "start-up"); }
    g_comm_world_size = c.world;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm_probe));
    MPI_CHECK(MPI_Comm_set_errhandler(g_comm_probe, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Barrier(node));
    g_comm_node = node;
    g_comm_rank = c.rank;
    g_comm_nlocal = c.local_size < COMM_MAX_LOCAL ? c.local_size : COMM_MAX_LOCAL;
    for (int i = 0; i < g_comm_nlocal; i++) {
        g_comm_local_rank[i] = (int)all[3 * i];
        g_comm_local_pid[i] = (int)all[3 * i + 1];
        g_comm_local_start[i] = (unsigned long long)all[3 * i + 2];
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = comm_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);   // mpirun forwards SIGUSR1 to the ranks (it answers SIGTERM by killing them)
    comm_group_init_world(&c.world_group);
    return c;
}

static inline void comm_set_timeout(double seconds) { g_comm_timeout = seconds; }
// --comm-timeout 0 (auto): the long one for the first step (start-up, the first collectives, NCCL set-up,
// a checkpoint load) and around checkpoint saves (a writer may be slower than the others, who wait for
// it); the steady one after: tens of seconds, so a hang is found quickly
#define COMM_TIMEOUT_LONG 600
#define COMM_TIMEOUT_STEADY 60

static inline void comm_finalize() {
    g_comm_slots = NULL;
    MPI_CHECK(MPI_Comm_free(&g_comm_probe));
    MPI_CHECK(MPI_Win_free(&g_comm_win));
    MPI_CHECK(MPI_Comm_free(&g_comm_node));
    MPI_CHECK(MPI_Finalize());
}

// ---------------------------------------------------------------------------------------------
// the heartbeat and the hang agreement

// Where this rank is: "<prefix>, <what>" (the prefix, e.g. "step 12", from comm_phase_prefix). A copy into
// node-shared memory, cheap enough for every unit of every pass; read when this rank stops answering.
static inline void comm_phase_prefix(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_comm_phase_prefix, sizeof g_comm_phase_prefix, fmt, ap);
    va_end(ap);
}
static inline void comm_phase(const char* fmt, ...) {
    if (!g_comm_slots) return;
    CommLocalSlot* s = &g_comm_slots[g_comm_my_local];
    char what[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(s->phase, sizeof s->phase, "%s%s%s", g_comm_phase_prefix, g_comm_phase_prefix[0] ? ", " : "", what);
    s->since = now_seconds();
}

// A hang: every survivor must name the same rank. The first rank whose wait times out probes every rank
// (on g_comm_probe); a rank waiting in a collective answers (comm_serve_probes runs in every wait loop);
// a hung or lost rank cannot. The culprit is the lowest rank that does not answer within a few seconds;
// the finder sends its verdict to every rank that answered, and each of them prints it and exits, so the
// survivors agree whoever times out first. The culprit's last phase comes from the node-shared heartbeat
// when it runs on the finder's node.
enum { COMM_TAG_PROBE = 9001, COMM_TAG_REPLY = 9002, COMM_TAG_VERDICT = 9003 };
typedef struct { int culprit, finder; char text[440]; } CommVerdict;
static double g_comm_probe_window = 3.0;   // seconds to wait for the answers

// answers probes; exits with the verdict if one arrived
static inline void comm_serve_probes() {
    if (g_comm_probe == MPI_COMM_NULL) return;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, COMM_TAG_VERDICT, g_comm_probe, &flag, &st) == MPI_SUCCESS && flag) {
        static CommVerdict v;
        if (MPI_Recv(&v, sizeof v, MPI_BYTE, st.MPI_SOURCE, COMM_TAG_VERDICT, g_comm_probe, MPI_STATUS_IGNORE) == MPI_SUCCESS) {
            v.text[sizeof v.text - 1] = 0;
            comm_mark_exiting();
            fprintf(stderr, "error: rank %d: %s (found by rank %d); exiting\n", g_comm_rank, v.text, v.finder);
            fflush(stderr);
            _exit(EXIT_RUNTIME);
        }
    }
    for (;;) {
        flag = 0;
        if (MPI_Iprobe(MPI_ANY_SOURCE, COMM_TAG_PROBE, g_comm_probe, &flag, &st) != MPI_SUCCESS || !flag) return;
        int who = -1;
        if (MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, COMM_TAG_PROBE, g_comm_probe, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        MPI_Request r;
        if (MPI_Isend(&g_comm_rank, 1, MPI_INT, st.MPI_SOURCE, COMM_TAG_REPLY, g_comm_probe, &r) == MPI_SUCCESS) MPI_Request_free(&r);
    }
}

// A wait of `op` in `group` made no progress for `waited` seconds (peer: the rank it waited for). Agrees
// on the culprit with the other survivors (above), says so, and exits 1.
[[noreturn]] static inline void comm_hang_verdict(const char* op, const char* group, double waited, int peer) {
    comm_serve_probes();   // another rank may have decided already
    int W = g_comm_world_size;
    static const int me = g_comm_rank;
    std::vector<char> answered(W, 0);
    answered[g_comm_rank] = 1;
    for (int p = 0; p < W; p++) {
        if (p == g_comm_rank) continue;
        MPI_Request r;
        if (MPI_Isend(&me, 1, MPI_INT, p, COMM_TAG_PROBE, g_comm_probe, &r) == MPI_SUCCESS) MPI_Request_free(&r);
    }
    int n = 1;
    double t0 = now_seconds();
    while (n < W && now_seconds() - t0 < g_comm_probe_window) {
        comm_serve_probes();
        int flag = 0;
        MPI_Status st;
        while (MPI_Iprobe(MPI_ANY_SOURCE, COMM_TAG_REPLY, g_comm_probe, &flag, &st) == MPI_SUCCESS && flag) {
            int who = -1;
            MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, COMM_TAG_REPLY, g_comm_probe, MPI_STATUS_IGNORE);
            if (!answered[st.MPI_SOURCE]) { answered[st.MPI_SOURCE] = 1; n++; }
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    static CommVerdict v;
    v.finder = g_comm_rank;
    v.culprit = -1;
    for (int p = 0; p < W && v.culprit < 0; p++) if (!answered[p]) v.culprit = p;
    char where[200] = "unknown: it runs on another node";
    for (int i = 0; i < g_comm_nlocal; i++)
        if (g_comm_local_rank[i] == v.culprit && g_comm_slots) {
            char phase[sizeof g_comm_slots[0].phase];
            memcpy(phase, g_comm_slots[i].phase, sizeof phase);
            phase[sizeof phase - 1] = 0;
            snprintf(where, sizeof where, "%.0f s ago: %s", now_seconds() - g_comm_slots[i].since, phase);
        }
    char waiting[40] = "";
    if (peer >= 0) snprintf(waiting, sizeof waiting, " waiting for rank %d", peer);
    if (v.culprit >= 0)
        snprintf(v.text, sizeof v.text, "%s in group %s made no progress for %.0f s%s: rank %d does not respond (hung or lost; "
                 "%d of %d ranks answered; --comm-timeout); its last phase, %s", op, group, waited, waiting, v.culprit, n, W, where);
    else
        snprintf(v.text, sizeof v.text, "%s in group %s made no progress for %.0f s%s, yet every rank answers: the ranks are in "
                 "different collectives (a code path taken by some ranks only)", op, group, waited, waiting);
    std::vector<MPI_Request> sends;
    for (int p = 0; p < W; p++) {
        if (p == g_comm_rank || !answered[p]) continue;
        MPI_Request r;
        if (MPI_Isend(&v, sizeof v, MPI_BYTE, p, COMM_TAG_VERDICT, g_comm_probe, &r) == MPI_SUCCESS) sends.push_back(r);
    }
    for (double t1 = now_seconds(); !sends.empty() && now_seconds() - t1 < 2.0;) {   // delivered, or give up
        int done = 0;
        MPI_Testall((int)sends.size(), sends.data(), &done, MPI_STATUSES_IGNORE);
        if (done) break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    comm_mark_exiting();
    fprintf(stderr, "error: rank %d: %s; exiting\n", g_comm_rank, v.text);
    fflush(stderr);
    // stay a moment: the others print the verdict before the launcher tears the job down
    struct timespec ts = {0, 500000000};
    nanosleep(&ts, NULL);
    _exit(EXIT_RUNTIME);
}

// ---------------------------------------------------------------------------------------------
// MPI transport: nonblocking send/receive pairs with a watchdog wait

// Waits for `n` requests. Yields the core while waiting (ranks may share cores); every second checks
// the ranks of this node; after g_comm_timeout seconds without completion, gives up naming `peer`.
static double g_comm_wait_s = 0;   // seconds this rank spent blocked in collectives (the straggler statistic)
static inline void comm_wait(CommGroup* g, MPI_Request* reqs, int n, int peer, const char* op) {
    double t0 = 0, last_check = 0, last_serve = 0, tw = now_seconds();
    struct WaitTimer { double t; ~WaitTimer() { g_comm_wait_s += now_seconds() - t; } } timer{tw};
    for (long spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            int lost = comm_find_lost_rank();
            if (lost >= 0) comm_die_lost(lost, "(MPI error)");
            fail_at(__FILE__, __LINE__, "rank %d: %s in group %s failed talking to rank %d: %s", g_comm_rank, op,
                    g->name.c_str(), g->members[peer], msg);
        }
        if (done) return;
        if (spins < 64) continue;
        if (spins < 4096) { sched_yield(); continue; }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        double now = now_seconds();
        if (t0 == 0) { t0 = now; last_check = now; }
        if (now - last_serve >= 0.01) { last_serve = now; comm_serve_probes(); }
        if (now - last_check >= 1.0) {
            last_check = now;
            int lost = comm_find_lost_rank();
            if (lost >= 0) {
                char what[160];
                snprintf(what, sizeof what, "during %s in group %s", op, g->name.c_str());
                comm_die_lost(lost, what);
            }
            if (now - t0 > g_comm_timeout) comm_hang_verdict(op, g->name.c_str(), now - t0, g->members[peer]);
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
        comm_wait(g, r, 2, src, op);
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
#ifndef SIMT_EMULATION
    g->bytes_sent += formula;
#endif
}
#endif

// Payload bytes this rank has sent in g's collectives: counted where they are handed to MPI (MPI groups),
// NCCL's ring formula (NCCL groups), or under the emulator the NCCL twin's measurement of what has run
// (read it when the group's stream has been waited for: queued operations count once they run).
static inline uint64_t comm_bytes_sent(const CommGroup* g) {
#ifdef SIMT_EMULATION
    if (g->nccl) return g->bytes_sent + nccl_twin_bytes_sent(g->nc);
#endif
    return g->bytes_sent;
}

// ---------------------------------------------------------------------------------------------
// the collectives. MPI: host buffers, complete on return. NCCL: device buffers, enqueued on g->stream
// (comm_sync waits). Counts are in elements of `t`.

// recv (size * count) <- every rank's send (count), in group-rank order
static inline void comm_all_gather(CommGroup* g, const void* send, void* recv, size_t count, CommType t) {
    size_t es = comm_type_size(t), bytes = count * es;
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK(ncclAllGather(send, recv, count * es, ncclInt8, g->nc, g->stream));
        comm_nccl_count(g, (uint64_t)(g->size - 1) * bytes);   // ring: S-1 chunks out
        return;
    }
#endif
    char* own = (char*)recv + (size_t)g->rank * bytes;
    if (own != send) memmove(own, send, bytes);
    if (g->size > 1) ring_all_gather_inplace(g, recv, count * g->size, es, "all_gather");
}

// In place: buf holds size * count; afterwards chunk `rank` of buf (count) holds the sum over ranks of
// every rank's chunk `rank` (the other chunks hold partial sums). No copy; ZeRO reduces its gradient
// buffer this way.
static inline void comm_reduce_scatter_inplace(CommGroup* g, void* buf, size_t count, CommType t) {
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        char* own = (char*)buf + (size_t)g->rank * count * comm_type_size(t);
        NCCL_CHECK(ncclReduceScatter(buf, own, count, nccl_type(t), ncclSum, g->nc, g->stream));
        comm_nccl_count(g, (uint64_t)(g->size - 1) * count * comm_type_size(t));
        return;
    }
#endif
    if (g->size > 1) ring_reduce_scatter_inplace(g, buf, count * g->size, t, "reduce_scatter");
}

// recv (count) <- the sum over ranks of send's chunk `rank` (send holds size * count; left intact)
static inline void comm_reduce_scatter(CommGroup* g, const void* send, void* recv, size_t count, CommType t) {
    size_t bytes = count * comm_type_size(t);
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        g->calls++;
        NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, g->nc, g->stream));
        comm_nccl_count(g, (uint64_t)(g->size - 1) * bytes);
        return;
    }
#endif
    if (g->size == 1) { g->calls++; if (recv != send) memmove(recv, send, bytes); return; }
    if (g->staging.size() < bytes * g->size) g->staging.resize(bytes * g->size);
    memcpy(g->staging.data(), send, bytes * g->size);
    comm_reduce_scatter_inplace(g, g->staging.data(), count, t);
    memcpy(recv, g->staging.data() + (size_t)g->rank * bytes, bytes);
}

// buf (count) <- the sum over ranks, in place: a ring reduce-scatter then a ring all-gather, so every
// rank ends with the same bits
static inline void comm_all_reduce(CommGroup* g, void* buf, size_t count, CommType t) {
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, g->nc, g->stream));
        // reduce-scatter + all-gather: 2 (S-1) / S of the buffer. The twin's measurement equals it when S
        // divides count; otherwise its uneven chunks make a rank's differ by less than two chunks (the sum
        // over the ranks is still exact)
        comm_nccl_count(g, (uint64_t)2 * (g->size - 1) * count * comm_type_size(t) / g->size);
        return;
    }
#endif
    if (g->size == 1) return;
    ring_reduce_scatter_inplace(g, buf, count, t, "all_reduce");   // leaves chunk r complete at rank r
    ring_all_gather_inplace(g, buf, count, comm_type_size(t), "all_reduce");
}

// buf (count floats, host memory: an MPI group) <- the element-wise maximum over ranks (the FP8
// amax): an all-gather, then every rank takes the same maximum, so every rank ends with the same bits
static inline void comm_all_reduce_max_f32(CommGroup* g, float* buf, size_t count) {
    if (g->size == 1) { g->calls++; return; }
    std::vector<float> all((size_t)g->size * count);
    comm_all_gather(g, buf, all.data(), count, COMM_F32);
    for (int r = 0; r < g->size; r++)
        for (size_t i = 0; i < count; i++) buf[i] = std::fmax(buf[i], all[(size_t)r * count + i]);
}

#ifdef COMM_HAVE_NCCL
// buf (count non-negative floats as their bits, device memory: a NCCL group) <- the element-wise
// maximum over ranks, on the device: non-negative floats order as their bit patterns, so an integer
// max is the float max, exact and the same on every rank (the GPU's FP8 amaxes are kept as bits)
static inline void comm_all_reduce_max_bits_dev(CommGroup* g, unsigned int* buf, size_t count) {
    ENSURE(g->nccl, "comm_all_reduce_max_bits_dev: group %s has no NCCL communicator", g->name.c_str());
    g->calls++;
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclUint32, ncclMax, g->nc, g->stream));
    comm_nccl_count(g, (uint64_t)2 * (g->size - 1) * count * 4 / g->size);
}
#endif

// buf (bytes) from group rank `root` to all: a chain root -> root+1 -> ..., pipelined in pieces
static inline void comm_broadcast(CommGroup* g, void* buf, size_t bytes, int root) {
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclInt8, root, g->nc, g->stream));
        comm_nccl_count(g, ring_mod(g->rank + 1 - root, g->size) != 0 ? bytes : 0);   // all but the chain's last
        return;
    }
#endif
    int s = g->size;
    if (s == 1) return;
    int pos = ring_mod(g->rank - root, s);   // place in the chain
    int next = ring_mod(g->rank + 1, s), prev = ring_mod(g->rank - 1, s);
    const size_t piece = (size_t)4 << 20;
    for (size_t off = 0; off < bytes || off == 0; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        MPI_Request r;
        if (pos > 0) {
            MPI_CHECK(MPI_Irecv((char*)buf + off, (int)n, MPI_BYTE, prev, 8, g->mpi, &r));
            comm_wait(g, &r, 1, prev, "broadcast");
        }
        if (pos < s - 1) {
            MPI_CHECK(MPI_Isend((char*)buf + off, (int)n, MPI_BYTE, next, 8, g->mpi, &r));
            comm_wait(g, &r, 1, next, "broadcast");
            g->bytes_sent += n;
        }
        if (bytes == 0) break;
    }
}

// recv chunk j (count) <- rank j's send chunk `rank`; send and recv hold size * count. Pairwise
// exchange: in round k rank r sends to r+k and receives from r-k. (For expert parallelism.)
static inline void comm_all_to_all(CommGroup* g, const void* send, void* recv, size_t count, CommType t) {
    size_t bytes = count * comm_type_size(t);
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK(ncclGroupStart());
        for (int p = 0; p < g->size; p++) {
            NCCL_CHECK(ncclSend((const char*)send + p * bytes, bytes, ncclInt8, p, g->nc, g->stream));
            NCCL_CHECK(ncclRecv((char*)recv + p * bytes, bytes, ncclInt8, p, g->nc, g->stream));
        }
        NCCL_CHECK(ncclGroupEnd());
        comm_nccl_count(g, (uint64_t)(g->size - 1) * bytes);   // the chunk to itself stays on the GPU
        return;
    }
#endif
    int s = g->size, r = g->rank;
    memmove((char*)recv + (size_t)r * bytes, (const char*)send + (size_t)r * bytes, bytes);
    for (int k = 1; k < s; k++) {
        int dst = ring_mod(r + k, s), src = ring_mod(r - k, s);
        comm_sendrecv(g, (const char*)send + (size_t)dst * bytes, bytes, dst, (char*)recv + (size_t)src * bytes, bytes,
                      src, "all_to_all");
    }
}

// All-to-all with variable sizes (expert parallelism's token exchange): to rank p go send_bytes[p]
// bytes, the blocks one after the other in rank order in `send`; from rank q come recv_bytes[q] bytes into
// `recv`, likewise. Both sides must agree on the sizes (exchange the counts first). host: the MPI path
// even for an NCCL group (host buffers, e.g. the counts). Pairwise exchange, as comm_all_to_all.
static inline void comm_all_to_allv(CommGroup* g, const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes,
                                    bool host = false) {
    int s = g->size, r = g->rank;
    std::vector<size_t> so(s + 1, 0), ro(s + 1, 0);
    for (int p = 0; p < s; p++) { so[p + 1] = so[p] + send_bytes[p]; ro[p + 1] = ro[p] + recv_bytes[p]; }
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl && !host) {
        uint64_t sent = 0;
        NCCL_CHECK(ncclGroupStart());
        for (int p = 0; p < s; p++) {
            if (send_bytes[p]) NCCL_CHECK(ncclSend((const char*)send + so[p], send_bytes[p], ncclInt8, p, g->nc, g->stream));
            if (recv_bytes[p]) NCCL_CHECK(ncclRecv((char*)recv + ro[p], recv_bytes[p], ncclInt8, p, g->nc, g->stream));
            if (p != r) sent += send_bytes[p];
        }
        NCCL_CHECK(ncclGroupEnd());
        comm_nccl_count(g, sent);
        return;
    }
#else
    (void)host;
#endif
    if (send_bytes[r] != recv_bytes[r])
        fail_at(__FILE__, __LINE__, "all_to_allv in group %s: rank %d sends itself %zu bytes but expects %zu", g->name.c_str(), r,
                send_bytes[r], recv_bytes[r]);
    memmove((char*)recv + ro[r], (const char*)send + so[r], send_bytes[r]);
    const size_t piece = (size_t)1 << 30;   // MPI counts are int: a block goes in pieces, as many on both sides
    for (int k = 1; k < s; k++) {
        int dst = ring_mod(r + k, s), src = ring_mod(r - k, s);
        std::vector<MPI_Request> reqs;
        for (size_t off = 0; off < recv_bytes[src]; off += piece) {
            MPI_Request q;
            MPI_CHECK(MPI_Irecv((char*)recv + ro[src] + off, (int)std::min(piece, recv_bytes[src] - off), MPI_BYTE, src, 10, g->mpi, &q));
            reqs.push_back(q);
        }
        for (size_t off = 0; off < send_bytes[dst]; off += piece) {
            MPI_Request q;
            size_t n = std::min(piece, send_bytes[dst] - off);
            MPI_CHECK(MPI_Isend((const char*)send + so[dst] + off, (int)n, MPI_BYTE, dst, 10, g->mpi, &q));
            reqs.push_back(q);
            g->bytes_sent += n;
        }
        if (!reqs.empty()) comm_wait(g, reqs.data(), (int)reqs.size(), src, "all_to_allv");
    }
}

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

// ---------------------------------------------------------------------------------------------
// the step watchdog (NCCL groups). With the collectives on the GPU, the host can block in a CUDA call
// (a copy, a synchronisation) behind a collective that cannot finish — a peer hung, or lost on another
// node — and never reach comm_sync's checks. A thread watches instead: while armed (the training loop
// arms it around the work that talks to the GPU: the steps and evaluation) it checks every half second
// the groups' asynchronous NCCL errors, the ranks on this node and the heartbeat (comm_heartbeat, every
// micro-batch); with no heartbeat for --comm-timeout + 10 s (the grace lets comm_sync, which can name
// the rank it waits for, speak first) it aborts the communicators and exits, saying so.
static std::atomic<double> g_comm_heartbeat{0};
static std::atomic<int> g_comm_watch_armed{0};
static std::mutex g_comm_watch_mu;
static std::vector<CommGroup*> g_comm_watched;   // under g_comm_watch_mu
static inline void comm_heartbeat() { g_comm_heartbeat.store(now_seconds()); }
static inline void comm_watch(int on) { comm_heartbeat(); g_comm_watch_armed.store(on); }

static inline void comm_watchdog_check() {
#ifdef COMM_HAVE_NCCL
    std::lock_guard<std::mutex> lock(g_comm_watch_mu);
    if (!g_comm_watch_armed.load() || g_comm_watched.empty()) return;
    ncclResult_t err = ncclSuccess;
    const char* group = "";
    for (CommGroup* g : g_comm_watched) {
        ncclResult_t e = ncclSuccess;
        if (ncclCommGetAsyncError(g->nc, &e) == ncclSuccess && e != ncclSuccess) { err = e; group = g->name.c_str(); }
    }
    int lost = comm_find_lost_rank();
    double idle = now_seconds() - g_comm_heartbeat.load();
    if (err == ncclSuccess && lost < 0 && idle <= g_comm_timeout + 10) return;
    comm_mark_exiting();
#ifndef SIMT_EMULATION   // (the NCCL twin's communicators belong to the thread that is blocked in them)
    for (CommGroup* g : g_comm_watched) ncclCommAbort(g->nc);
#endif
    if (lost >= 0) comm_die_lost(lost, "(step watchdog: NCCL communicators aborted)");
    char msg[512];
    if (err != ncclSuccess)
        snprintf(msg, sizeof msg, "error: rank %d: NCCL reports an asynchronous error in group %s (%s): a rank was lost or "
                 "failed; communicators aborted; exiting\n", g_comm_rank, group, ncclGetErrorString(err));
    else
        snprintf(msg, sizeof msg, "error: rank %d: the GPU step made no progress for %.0f s: a NCCL collective cannot complete, "
                 "a rank was lost or hangs (--comm-timeout %.0f); communicators aborted; exiting\n", g_comm_rank, idle, g_comm_timeout);
    ssize_t ignored = write(2, msg, strlen(msg));
    (void)ignored;
    _exit(EXIT_RUNTIME);
#endif
}

// watch these groups (their NCCL ones) from now on; the thread starts with the first
static inline void comm_watchdog_start(const std::vector<CommGroup*>& groups) {
#ifdef COMM_HAVE_NCCL
    static bool started = false;
    {
        std::lock_guard<std::mutex> lock(g_comm_watch_mu);
        for (CommGroup* g : groups) if (g->nccl) g_comm_watched.push_back(g);
        if (started || g_comm_watched.empty()) return;
        started = true;
    }
    comm_heartbeat();
    std::thread([]() {
        for (;;) {
            struct timespec ts = {0, 500000000};
            nanosleep(&ts, NULL);
            comm_watchdog_check();
        }
    }).detach();
#else
    (void)groups;
#endif
}
// before the watched groups are freed
static inline void comm_watchdog_stop() {
    std::lock_guard<std::mutex> lock(g_comm_watch_mu);
    g_comm_watched.clear();
    g_comm_watch_armed.store(0);
}

// all ranks of the group arrive (NCCL: after the group's stream has drained)
static inline void comm_barrier(CommGroup* g) {
    g->calls++;
    comm_sync(g);
    if (g->size == 1) return;
    MPI_Request r;
    MPI_CHECK(MPI_Ibarrier(g->mpi, &r));
    comm_wait(g, &r, 1, ring_mod(g->rank - 1, g->size), "barrier");
}

// ---------------------------------------------------------------------------------------------
// sub-groups

#ifdef SIMT_EMULATION
// The NCCL twin's watchdog: called about once a second while one of its waits makes no progress. What
// comm_wait does for MPI: a rank of this node gone -> "lost rank R"; no progress for --comm-timeout
// seconds -> abort the communicator and exit naming the rank waited for. (On a GPU, comm_sync does it.)
static inline void comm_nccl_twin_watchdog(int peer_world_rank, const char* op, double waited_s) {
    ncclComm_t nc = nccl_twin_waiting_comm();
    char name[64];
    snprintf(name, sizeof name, "%s", nccl_twin_get_name(nc));   // copied: the abort below frees nc
    int lost = comm_find_lost_rank();
    if (lost >= 0) {
        char what[160];
        snprintf(what, sizeof what, "during NCCL %s in group %s", op, name);
        comm_die_lost(lost, what);
    }
    comm_serve_probes();
    if (waited_s > g_comm_timeout) {
        comm_mark_exiting();
        ncclCommAbort(nc);
        char what[96];
        snprintf(what, sizeof what, "NCCL %s", op);
        comm_hang_verdict(what, name, waited_s, peer_world_rank);
    }
}
#endif

// Splits `parent` into groups of the ranks with equal `color`, ordered by `key` (MPI_Comm_split).
// use_nccl: also create the group's NCCL communicator (rank 0 of the group makes the ncclUniqueId and
// broadcasts it over the group's MPI communicator) and its communication stream.
static inline CommGroup comm_split(CommGroup* parent, int color, int key, const char* name, int use_nccl) {
    CommGroup g;
    g.name = name;
    MPI_CHECK(MPI_Comm_split(parent->mpi, color, key, &g.mpi));
    MPI_CHECK(MPI_Comm_set_errhandler(g.mpi, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(g.mpi, &g.rank));
    MPI_CHECK(MPI_Comm_size(g.mpi, &g.size));
    int me = parent->members[parent->rank];
    g.members.resize(g.size);
    MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, g.members.data(), 1, MPI_INT, g.mpi));
    g.bytes_sent = 0;
    g.nccl_formula_bytes = 0;
    g.calls = 0;
    g.nccl = 0;
    if (use_nccl) {
#ifdef COMM_HAVE_NCCL
        ncclUniqueId id;
        if (g.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g.mpi));
#ifdef SIMT_EMULATION
        // the twin connects the ranks over the group's MPI communicator (NCCL: its own sockets, found from
        // the id); it still checks that every rank holds the same id
        nccl_twin_bootstrap(g.mpi);
#endif
        NCCL_CHECK(ncclCommInitRank(&g.nc, g.size, id, g.rank));
#ifdef SIMT_EMULATION
        nccl_twin_set_name(g.nc, name);
        // DBRX_DEBUG_TWIN_BLOCKS=1 (a test hook): no watchdog inside the twin's waits, so that a stuck
        // collective blocks the host as a GPU's CUDA call would, and only the step watchdog can end it
        if (!getenv("DBRX_DEBUG_TWIN_BLOCKS")) nccl_twin_set_watchdog(comm_nccl_twin_watchdog);
#endif
        CUDA_CHECK_COMM(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
        g.owns_stream = 1;
        g.nccl = 1;
#else
        fail(EXIT_BAD_INPUT, "this build has no NCCL (it was built without nvcc)");
#endif
    }
    return g;
}

// the world group on NCCL: the same ranks, with a NCCL communicator (GPU of a rank = its local rank)
static inline CommGroup comm_world_nccl(Comm* c) {
#ifdef COMM_HAVE_NCCL
    int ndev = 0;
    CUDA_CHECK_COMM(cudaGetDeviceCount(&ndev));
    if (ndev == 0) fail(EXIT_BAD_INPUT, "NCCL backend: no GPU visible");
    CUDA_CHECK_COMM(cudaSetDevice(c->local_rank % ndev));
#endif
    return comm_split(&c->world_group, 0, c->rank, "world", 1);
}

// g's collectives from now on on `other`'s stream (ordered with other's, under the same events); its own
// stream is released. Both groups' collectives must then be issued in the same order on every rank.
static inline void comm_share_stream(CommGroup* g, const CommGroup* other) {
#ifdef COMM_HAVE_NCCL
    if (!g->nccl || !other->nccl) return;
    if (g->owns_stream) CUDA_CHECK_COMM(cudaStreamDestroy(g->stream));
    g->stream = other->stream;
    g->owns_stream = 0;
#else
    (void)g; (void)other;
#endif
}

static inline void comm_group_free(CommGroup* g) {
#ifdef COMM_HAVE_NCCL
    if (g->nccl) { NCCL_CHECK(ncclCommDestroy(g->nc)); if (g->owns_stream) CUDA_CHECK_COMM(cudaStreamDestroy(g->stream)); }
#endif
    if (g->mpi != MPI_COMM_WORLD) MPI_CHECK(MPI_Comm_free(&g->mpi));
}
