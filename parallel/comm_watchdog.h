/*
 * comm_watchdog.h — how the communicator notices that a rank is gone or hangs, and what it says then:
 *   liveness    the pid and start time of every rank on this node, node-shared failure flags, and the
 *               SIGTERM/SIGINT handler (a lost rank is named, any other signal asks the loop to stop)
 *   heartbeat   where each rank is (comm_phase), in node-shared memory, read when it stops answering
 *   hang agreement  the first rank whose wait times out probes every rank; all survivors print the same
 *               verdict naming the rank that does not answer (comm_hang_verdict)
 *   abort path  comm_exit_failed, the one exit of a rank that failed and has said why: a deadline thread,
 *               then ncclCommAbort on every NCCL communicator, then _exit — so that no failure can leave a
 *               rank waiting on NCCL. Why this design (PyTorch's ProcessGroupNCCL has the same three
 *               parts): the communicators are non-blocking (comm_split), so no NCCL call holds a host
 *               thread and an abort from whichever thread finds the failure ends a collective that another
 *               thread waits for; the abort stops the communicator's kernels and proxy in NCCL's order
 *               before the process goes; and since ncclCommAbort has been seen to hang itself (NVIDIA/nccl
 *               issue 829), a thread started before it _exits the process after COMM_ABORT_DEADLINE_S.
 *               parallel/README.md, "A watchdog that cannot hang".
 *   step watchdog   a thread that ends a GPU step blocked behind a NCCL collective that cannot finish
 *   the NCCL twin's watchdog, called from inside the twin's waits (emulated builds)
 * The MPI waits (comm_mpi.h) and the NCCL waits (comm_nccl.h) call into it. Under the emulator every
 * part runs against the NCCL twin, whose abort and ncclInProgress follow NCCL's (test/simt/nccl_twin.h).
 * Part of the communicator: parallel/comm.h includes it after CommGroup; include parallel/comm.h, not
 * this file.
 */
#pragma once
#include <mpi.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
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

// What this rank is waiting for now: set by the waits (comm_wait, comm_sync, the NCCL twin's watchdog)
// when they serve probes, so that a rank that hears a verdict says its own wait, not the finder's.
typedef struct {
    const char* op;      // NULL: not in a wait
    const char* group;
    double since;        // now_seconds() when the wait began
    int peer;            // world rank of the rank it waits for, -1: none in particular (a barrier, a stream)
} CommWaitNow;
static CommWaitNow g_comm_wait_now = {NULL, "", 0, -1};
static inline void comm_waiting(const char* op, const char* group, double since, int peer) {
    g_comm_wait_now.op = op;
    g_comm_wait_now.group = group;
    g_comm_wait_now.since = since;
    g_comm_wait_now.peer = peer;
}

// the abort path (below): every NCCL communicator, a deadline, then _exit
[[noreturn]] static inline void comm_exit_failed();

// A hang: every survivor must name the same rank. The first rank whose wait times out probes every rank
// (on g_comm_probe); a rank waiting in a collective answers (comm_serve_probes runs in every wait loop);
// a hung or lost rank cannot. The culprit is the lowest rank that does not answer within a few seconds;
// the finder sends its verdict — the culprit, its last phase, and which ranks answered — to every rank
// that answered, and each of them prints it with its own wait and exits, so the survivors agree whoever
// times out first and each line names only ranks that are true for it: the rank it waits for (which,
// when it is not the culprit, answered or did not) and the culprit. The culprit's last phase comes from
// the node-shared heartbeat when it runs on the finder's node.
enum { COMM_TAG_PROBE = 9001, COMM_TAG_REPLY = 9002, COMM_TAG_VERDICT = 9003 };
typedef struct { int culprit, finder, answered_count, world; char where[200]; } CommVerdict;   // + world bytes: answered
static double g_comm_probe_window = 3.0;   // seconds to wait for the answers

// this rank's line for a verdict: its own wait (what, group, for how long, the rank it waits for) and the
// culprit. answered[p]: rank p answered the finder's probe.
static inline void comm_verdict_text(char* out, size_t n, const CommVerdict* v, const char* answered) {
    const CommWaitNow* w = &g_comm_wait_now;
    char waiting[96] = "";
    int p = w->op ? w->peer : -1;
    if (p >= 0 && p != g_comm_rank && p < v->world) {
        if (v->culprit < 0 || p == v->culprit) snprintf(waiting, sizeof waiting, " waiting for rank %d", p);
        else snprintf(waiting, sizeof waiting, " waiting for rank %d (%s)", p,
                      answered[p] ? "which answers: it waits in turn" : "which does not answer either");
    }
    char head[200];
    if (w->op) snprintf(head, sizeof head, "%s in group %s made no progress for %.0f s%s", w->op, w->group, now_seconds() - w->since, waiting);
    else snprintf(head, sizeof head, "no progress");
    if (v->culprit >= 0)
        snprintf(out, n, "%s: rank %d does not respond (hung or lost; %d of %d ranks answered; --comm-timeout); its last phase, %s", head,
                 v->culprit, v->answered_count, v->world, v->where);
    else
        snprintf(out, n, "%s, yet every rank answers: the ranks are in different collectives (a code path taken by some ranks only)", head);
}

// answers probes; exits with the verdict if one arrived
static inline void comm_serve_probes() {
    if (g_comm_probe == MPI_COMM_NULL) return;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, COMM_TAG_VERDICT, g_comm_probe, &flag, &st) == MPI_SUCCESS && flag) {
        int bytes = 0;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        std::vector<char> buf(bytes > (int)sizeof(CommVerdict) ? bytes : sizeof(CommVerdict) + 1, 0);
        if (MPI_Recv(buf.data(), bytes, MPI_BYTE, st.MPI_SOURCE, COMM_TAG_VERDICT, g_comm_probe, MPI_STATUS_IGNORE) == MPI_SUCCESS) {
            CommVerdict v;
            memcpy(&v, buf.data(), sizeof v);
            v.where[sizeof v.where - 1] = 0;
            if (v.world != g_comm_world_size || bytes != (int)sizeof v + v.world) v.world = 0;   // (malformed: name no peer)
            char text[600];
            comm_verdict_text(text, sizeof text, &v, buf.data() + sizeof v);
            comm_mark_exiting();
            fprintf(stderr, "error: rank %d: %s (found by rank %d); exiting\n", g_comm_rank, text, v.finder);
            fflush(stderr);
            comm_exit_failed();
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

// A wait of `op` in `group` made no progress for `waited` seconds (peer: the world rank it waited for, -1:
// none in particular). Agrees on the culprit with the other survivors (above), says so, and exits 1.
[[noreturn]] static inline void comm_hang_verdict(const char* op, const char* group, double waited, int peer) {
    comm_waiting(op, group, now_seconds() - waited, peer);
    comm_serve_probes();   // another rank may have decided already
    int W = g_comm_world_size;
    static const int me = g_comm_rank;
    static std::vector<char> msg;   // the verdict and, after it, W bytes: who answered (static: sent nonblocking)
    msg.assign(sizeof(CommVerdict) + W, 0);
    char* answered = msg.data() + sizeof(CommVerdict);
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
    CommVerdict v;
    memset(&v, 0, sizeof v);
    v.finder = g_comm_rank;
    v.culprit = -1;
    v.answered_count = n;
    v.world = W;
    for (int p = 0; p < W && v.culprit < 0; p++) if (!answered[p]) v.culprit = p;
    snprintf(v.where, sizeof v.where, "unknown: it runs on another node");
    for (int i = 0; i < g_comm_nlocal; i++)
        if (g_comm_local_rank[i] == v.culprit && g_comm_slots) {
            char phase[sizeof g_comm_slots[0].phase];
            memcpy(phase, g_comm_slots[i].phase, sizeof phase);
            phase[sizeof phase - 1] = 0;
            snprintf(v.where, sizeof v.where, "%.0f s ago: %s", now_seconds() - g_comm_slots[i].since, phase);
        }
    memcpy(msg.data(), &v, sizeof v);
    std::vector<MPI_Request> sends;
    for (int p = 0; p < W; p++) {
        if (p == g_comm_rank || !answered[p]) continue;
        MPI_Request r;
        if (MPI_Isend(msg.data(), (int)msg.size(), MPI_BYTE, p, COMM_TAG_VERDICT, g_comm_probe, &r) == MPI_SUCCESS) sends.push_back(r);
    }
    for (double t1 = now_seconds(); !sends.empty() && now_seconds() - t1 < 2.0;) {   // delivered, or give up
        int done = 0;
        MPI_Testall((int)sends.size(), sends.data(), &done, MPI_STATUSES_IGNORE);
        if (done) break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    char text[600];
    comm_verdict_text(text, sizeof text, &v, answered);
    comm_mark_exiting();
    fprintf(stderr, "error: rank %d: %s; exiting\n", g_comm_rank, text);
    fflush(stderr);
    // stay a moment: the others print the verdict before the launcher tears the job down
    struct timespec ts = {0, 500000000};
    nanosleep(&ts, NULL);
    comm_exit_failed();
}

// ---------------------------------------------------------------------------------------------
// the abort path: how a rank that has said why it fails ends, without ever waiting on NCCL for long.
// Every NCCL communicator is non-blocking (comm_split: ncclConfig_t.blocking = 0), so no NCCL call holds
// a host thread and ncclCommAbort, from whichever thread finds the failure, makes the kernels and the
// proxy of a stuck collective give up rather than wait for a call on another thread to return. It is
// called once, on every communicator, with a deadline: a thread started first _exits the process if the
// abort has not returned within COMM_ABORT_DEADLINE_S (ncclCommAbort has been seen to hang itself,
// NVIDIA/nccl issue 829; PyTorch's ProcessGroupNCCL has a heartbeat monitor for the same reason). Any other
// thread that reaches the path meanwhile parks until the process ends. The message comes first (write(2),
// no stdio: another thread may hold its lock), so the diagnosis is out whatever happens after.

#define COMM_ABORT_DEADLINE_S 10
static std::atomic<int> g_comm_aborting{0};       // 1: a thread is on the abort path; the others park
#ifdef COMM_HAVE_NCCL
static std::mutex g_comm_nccl_mu;
static std::vector<ncclComm_t> g_comm_nccl_comms;  // every NCCL communicator alive (comm_split .. comm_group_free)
#endif

static inline void comm_say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void comm_say(const char* fmt, ...) {
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
    va_end(ap);
    n = n < 0 ? 0 : n > (int)sizeof msg - 2 ? (int)sizeof msg - 2 : n;
    msg[n++] = '\n';
    ssize_t ignored = write(2, msg, (size_t)n);
    (void)ignored;
}

// another thread is ending the process (comm_exit_failed): wait for it, touching nothing
[[noreturn]] static inline void comm_park() {
    for (;;) pause();
}
static inline void comm_park_if_aborting() {
    if (g_comm_aborting.load()) comm_park();
}

// This rank fails and has said why: abort every NCCL communicator (deadline above), exit 1.
[[noreturn]] static inline void comm_exit_failed() {
    if (g_comm_aborting.exchange(1)) comm_park();
    comm_mark_exiting();
#ifdef COMM_HAVE_NCCL
    std::vector<ncclComm_t> comms;
    {
        std::lock_guard<std::mutex> lock(g_comm_nccl_mu);
        comms = g_comm_nccl_comms;
    }
    if (!comms.empty()) {
        bool armed = false;
        try {
            std::thread([]() {
                struct timespec ts = {COMM_ABORT_DEADLINE_S, 0}, rem;
                while (nanosleep(&ts, &rem) != 0 && errno == EINTR) ts = rem;
                comm_say("error: rank %d: ncclCommAbort did not return within %d s; exiting without it", g_comm_rank, COMM_ABORT_DEADLINE_S);
                _exit(EXIT_RUNTIME);
            }).detach();
            armed = true;
        } catch (...) {   // (no thread, no deadline: do not wait on NCCL at all)
            comm_say("error: rank %d: cannot start the abort's deadline thread; exiting without ncclCommAbort", g_comm_rank);
        }
        if (armed) {
            double t0 = now_seconds();
            for (ncclComm_t nc : comms) ncclCommAbort(nc);
            comm_say("error: rank %d: %zu NCCL communicator(s) aborted in %.1f s; exiting", g_comm_rank, comms.size(), now_seconds() - t0);
        }
    }
#endif
    _exit(EXIT_RUNTIME);
}

// a rank of this node is gone: say so, then the abort path (comm_die_lost is the signal handler's version)
[[noreturn]] static inline void comm_lost_exit(int local_index, const char* what) {
    comm_mark_exiting();
    comm_say("error: rank %d: lost rank %d (pid %d on this node is gone) %s; exiting", g_comm_rank, g_comm_local_rank[local_index],
             g_comm_local_pid[local_index], what);
    struct timespec ts = {0, 500000000};   // (as comm_die_lost: the other survivors must not take this rank for the lost one)
    nanosleep(&ts, NULL);
    comm_exit_failed();
}

// ---------------------------------------------------------------------------------------------
// the step watchdog (NCCL groups). With the collectives on the GPU, the host can block in a CUDA call
// (a copy, a synchronisation) behind a collective that cannot finish — a peer hung, or lost on another
// node — and never reach comm_sync's checks. A thread watches instead: while armed (the training loop
// arms it around the work that talks to the GPU: the steps and evaluation) it checks every half second
// the groups' asynchronous NCCL errors, the ranks on this node and the heartbeat (comm_heartbeat, every
// micro-batch); with no heartbeat for --comm-timeout + 10 s (the grace lets comm_sync, which can name
// the rank it waits for, speak first) it says so and takes the abort path, whose ncclCommAbort makes the
// blocked call of the main thread return (the main thread then parks).
static std::atomic<double> g_comm_heartbeat{0};
static std::atomic<int> g_comm_watch_armed{0};
static std::mutex g_comm_watch_mu;
static std::vector<CommGroup*> g_comm_watched;   // under g_comm_watch_mu
static inline void comm_heartbeat() { g_comm_heartbeat.store(now_seconds()); }
static inline void comm_watch(int on) { comm_heartbeat(); g_comm_watch_armed.store(on); }

static inline void comm_watchdog_check() {
#ifdef COMM_HAVE_NCCL
    std::lock_guard<std::mutex> lock(g_comm_watch_mu);
    if (!g_comm_watch_armed.load() || g_comm_watched.empty() || g_comm_aborting.load()) return;
    ncclResult_t err = ncclSuccess;
    const char* group = "";
    for (CommGroup* g : g_comm_watched) {
        ncclResult_t e = ncclSuccess;
        // (ncclInProgress: a non-blocking call of the main thread not finished yet, not an error)
        if (ncclCommGetAsyncError(g->nc, &e) == ncclSuccess && e != ncclSuccess && e != ncclInProgress) { err = e; group = g->name.c_str(); }
    }
    int lost = comm_find_lost_rank();
    double idle = now_seconds() - g_comm_heartbeat.load();
    if (err == ncclSuccess && lost < 0 && idle <= g_comm_timeout + 10) return;
    if (lost >= 0) comm_lost_exit(lost, "(step watchdog)");
    if (err != ncclSuccess)
        comm_say("error: rank %d: NCCL reports an asynchronous error in group %s (%s): a rank was lost or failed; aborting the "
                 "communicators", g_comm_rank, group, ncclGetErrorString(err));
    else
        comm_say("error: rank %d: the GPU step made no progress for %.0f s: a NCCL collective cannot complete, a rank was lost or "
                 "hangs (--comm-timeout %.0f); aborting the communicators", g_comm_rank, idle, g_comm_timeout);
    comm_exit_failed();
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
// seconds -> the hang agreement, then the abort path (its ncclCommAbort, from inside the twin's wait,
// makes the wait give up as it unwinds). (On a GPU, comm_sync does it.)
static inline void comm_nccl_twin_watchdog(int peer_world_rank, const char* op, double waited_s) {
    ncclComm_t nc = platform_nccl_waiting_comm();
    static char name[64], what[96];   // (static: the wait record below points at them)
    snprintf(name, sizeof name, "%s", platform_nccl_comm_name(nc));
    snprintf(what, sizeof what, "NCCL %s", op);
    comm_waiting(what, name, now_seconds() - waited_s, peer_world_rank);
    int lost = comm_find_lost_rank();
    if (lost >= 0) {
        char where[160];
        snprintf(where, sizeof where, "during NCCL %s in group %s", op, name);
        comm_lost_exit(lost, where);
    }
    comm_serve_probes();
    if (waited_s > g_comm_timeout) comm_hang_verdict(what, name, waited_s, peer_world_rank);
}
#endif
