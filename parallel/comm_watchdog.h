/*
 * comm_watchdog.h — how the communicator notices that a rank is gone or hangs, and what it says then:
 *   liveness    the pid and start time of every rank on this node, node-shared failure flags, and the
 *               SIGTERM/SIGINT handler (a lost rank is named, any other signal asks the loop to stop)
 *   heartbeat   where each rank is (comm_phase), in node-shared memory, read when it stops answering
 *   hang agreement  the first rank whose wait times out probes every rank; all survivors print the same
 *               verdict naming the rank that does not answer (comm_hang_verdict)
 *   step watchdog   a thread that ends a GPU step blocked behind a NCCL collective that cannot finish
 *   the NCCL twin's watchdog, called from inside the twin's waits (emulated builds)
 * The MPI waits (comm_mpi.h) and the NCCL stream wait (comm_nccl.h) call into it. Part of the
 * communicator: parallel/comm.h includes it after CommGroup; include parallel/comm.h, not this file.
 */
#pragma once
#include <mpi.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

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
    if (platform_nccl_abort_from_any_thread())   // (not the NCCL twin's: they belong to the thread blocked in them)
        for (CommGroup* g : g_comm_watched) ncclCommAbort(g->nc);
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

// ---------------------------------------------------------------------------------------------
// the NCCL twin's watchdog (comm_split registers it with the platform; NCCL has no such hook, so in
// the nvcc build it is never called)

#ifdef COMM_HAVE_NCCL
// The NCCL twin's watchdog: called about once a second while one of its waits makes no progress. What
// comm_wait does for MPI: a rank of this node gone -> "lost rank R"; no progress for --comm-timeout
// seconds -> abort the communicator and exit naming the rank waited for. (On a GPU, comm_sync does it.)
static inline void comm_nccl_twin_watchdog(int peer_world_rank, const char* op, double waited_s) {
    ncclComm_t nc = platform_nccl_waiting_comm();
    char name[64];
    snprintf(name, sizeof name, "%s", platform_nccl_comm_name(nc));   // copied: the abort below frees nc
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
