/*
 * train_checkpoint.h — the training loop's checkpoints (the format and its writer: checkpoint/ckpt.h):
 *   run_ckpt_begin      where training starts: the directory checked, --init-hf, --resume (weights,
 *                       data loader position, spike guard statistics)
 *   run_ckpt_save       this rank's shard to host memory, then written in the background
 *   run_ckpt_confirm    the newest checkpoint the run has trained --ckpt-confirm steps past without a
 *                       skipped step is known good (only known-good ones count toward --ckpt-keep)
 *   run_ckpt_after_step a finished background save reported; every --ckpt-every steps a new one
 *   run_ckpt_end        on the way out (the end, --stop-after, a signal): a checkpoint of where we are,
 *                       waited for; after the spike guard stopped the run, nothing saved and the
 *                       checkpoints not known good set aside
 *   stop_signals_install / stop_finalize   Ctrl-C under mpirun (below): the stop on a signal, saved and
 *                       exited 0 within mpirun's grace period
 * Included by train_dbrx.cu only.
 */
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>
#include "checkpoint/ckpt.h"
#include "checkpoint/hf.h"
#include "checkpoint/loader_state.h"
#include "checkpoint/spike_guard.h"
#include "train_log.h"

typedef struct {
    Checkpointer ck;
    RunInfo run;                    // what the manifest records of the run (a resume warns on changes)
    std::vector<int> saved_steps;   // candidates for confirmation
    int last_skipped;               // the last step the spike guard skipped
} RunCheckpoints;

// --comm-timeout auto: generous around checkpoint saves (and until the first step is done), steady otherwise
static void comm_timeout_long(const TrainArgs& args, bool on) {
    if (args.parallel.comm_timeout == 0) comm_set_timeout(on ? COMM_TIMEOUT_LONG : COMM_TIMEOUT_STEADY);
}

// Returns whether the run resumed from a checkpoint. prog: the step, tokens and RNG training starts from.
template <typename Model, typename Store>
static bool run_ckpt_begin(RunCheckpoints* rc, const TrainArgs& args, const DbrxConfig& cfg, const AdamWConfig& opt, Model* model,
                           Store* store, DataLoader* train, SpikeGuard* guard, TrainProgress* prog, Comm& comm) {
    Zero* zl = zero_layout(store);
    Checkpointer* ck = &rc->ck;
    ckpt_init(ck, args.ckpt.dir, args.ckpt.every, args.ckpt.keep, args.ckpt.keep_every);
    ckpt_check_dir(ck, zl, args.ckpt.resume == "auto", &comm);   // before anything is trained: a directory that cannot take a save
    rc->run = {args.run.steps, args.optim.warmup, args.run.seed, args.run.batch, args.run.seq, args.run.grad_accum, args.optim.lr, args.optim.lr_floor, opt};
    prog->rng.state = (uint64_t)args.run.seed ^ 0x7261696E5F646278ull;
    if (!args.ckpt.init_hf.empty()) {
        hf_import(args.ckpt.init_hf, zl, &cfg, model->table, &comm);
        zero_from_host(store);
        if (comm.rank == 0) printf("init: weights from the Hugging Face export %s\n", args.ckpt.init_hf.c_str());
    }
    ck->confirm = args.ckpt.confirm > 0 ? args.ckpt.confirm : args.ckpt.every > 0 ? args.ckpt.every : 1;
    bool resumed = false;
    if (!args.ckpt.resume.empty()) {
        JsonValue man;
        std::string from;
        if (ckpt_resume(ck, args.ckpt.resume, zl, &cfg, prog, &man, &from, &comm)) {
            zero_from_host(store);
            std::string err;
            if (!ckpt_loader_state_restore(train, prog->loader, &err))
                fail(EXIT_BAD_INPUT, "%s/manifest.json: the data loader state %s", from.c_str(), err.c_str());
            if (!prog->guard.empty() && !(err = spike_guard_restore(guard, prog->guard)).empty())
                fail(EXIT_BAD_INPUT, "%s/manifest.json: %s", from.c_str(), err.c_str());
            ckpt_warn_changes(&man, &rc->run, comm.world, comm.rank);
            ck->last_saved_step = prog->step;
            ck->confirmed_step = prog->step;   // what a run resumes from counts as good
            resumed = true;
            if (comm.rank == 0) printf("resume: %s (step %d, %lld tokens seen); continuing at step %d of %d\n", from.c_str(),
                                       prog->step, (long long)prog->tokens, prog->step + 1, args.run.steps);
        }
    }
    rc->saved_steps = {prog->step};
    rc->last_skipped = 0;
    return resumed;
}

// this rank's shard to host memory, then written in the background; never a non-finite state (false)
template <typename Store>
static bool run_ckpt_save(RunCheckpoints* rc, Store* store, const DbrxConfig& cfg, TrainProgress* prog, DataLoader* train,
                          SpikeGuard* guard, Comm& comm, SaveReport* prev) {
    Zero* zl = zero_layout(store);
    comm_phase("checkpoint save of step %d", prog->step);
    prog->loader = ckpt_loader_state_save(train);
    prog->guard = spike_guard_json(guard);
    zero_to_host(store);
    if (!zero_host_state_finite(zl)) {
        if (comm.rank == 0) fprintf(stderr, "warning: step %d: the weights or optimizer moments are not finite: not saved\n", prog->step);
        return false;
    }
    ckpt_start_save(&rc->ck, zl, &cfg, prog, &rc->run, &comm, prev);
    rc->saved_steps.push_back(prog->step);
    return true;
}

// after step `step` (skipped: by the spike guard)
static void run_ckpt_confirm(RunCheckpoints* rc, int step, bool skipped, const Comm& comm) {
    Checkpointer* ck = &rc->ck;
    if (skipped) rc->last_skipped = step;
    int confirmed = ck->confirmed_step;
    for (int s : rc->saved_steps) if (s > confirmed && s + ck->confirm <= step && rc->last_skipped <= s) confirmed = s;
    if (confirmed != ck->confirmed_step) {
        ck->confirmed_step = confirmed;
        if (comm.rank == 0 && !ck->dir.empty()) ckpt_retain(ck);
    }
}

// after a step that does not end the run (last: it does; its checkpoint is saved on the way out)
template <typename Store>
static void run_ckpt_after_step(RunCheckpoints* rc, const TrainArgs& args, Store* store, const DbrxConfig& cfg, TrainProgress* prog,
                                DataLoader* train, SpikeGuard* guard, bool last, Comm& comm, RunLog* log) {
    Checkpointer* ck = &rc->ck;
    Zero* zl = zero_layout(store);
    if (ck->pending) { SaveReport r = ckpt_poll(ck, zl, &comm, false); if (comm.rank == 0) report_save(log, r); }
    if (ck->every > 0 && prog->step % ck->every == 0 && !last) {
        SaveReport prev = {false, -1, 0, 0, 0, 0, ""};
        comm_timeout_long(args, true);
        if (run_ckpt_save(rc, store, cfg, prog, train, guard, comm, &prev) && comm.rank == 0) report_save(log, prev);
    }
    comm_timeout_long(args, false);   // (auto: from the end of the first step on, the steady timeout)
}

// on the way out; returns false when the last checkpoint could not be saved
template <typename Store>
static bool run_ckpt_end(RunCheckpoints* rc, Store* store, const DbrxConfig& cfg, TrainProgress* prog, DataLoader* train,
                         SpikeGuard* guard, bool guard_stop, bool diverged, Comm& comm, RunLog* log) {
    Checkpointer* ck = &rc->ck;
    Zero* zl = zero_layout(store);
    if (ck->dir.empty()) return true;
    if (ck->pending) { SaveReport r = ckpt_wait_commit(ck, zl, &comm); if (comm.rank == 0) report_save(log, r); }
    if (guard_stop) {
        if (comm.rank == 0) {
            std::string good = ckpt_set_aside_unconfirmed(ck);
            fprintf(stderr, "error: %s; resume with --resume auto (after lowering --lr, or with other data), or a set-aside "
                    "checkpoint with --resume DIR\n", good.c_str());
        }
    } else if (diverged) {
        if (comm.rank == 0) fprintf(stderr, "warning: step %d: the validation loss is not finite: not saved\n", prog->step);
    } else if (ck->last_saved_step != prog->step) {
        SaveReport prev = {false, -1, 0, 0, 0, 0, ""};
        SaveReport r = prev;
        if (run_ckpt_save(rc, store, cfg, prog, train, guard, comm, &prev)) r = ckpt_wait_commit(ck, zl, &comm);
        if (comm.rank == 0) report_save(log, r);
        return r.ok;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Ctrl-C under mpirun. A terminal's Ctrl-C reaches mpirun alone (each rank runs in a process group of its
// own). OpenMPI 4.1's mpirun answers SIGINT or SIGTERM by aborting the job (orte odls kill_local_procs):
// SIGCONT to every rank, a sleep of odls_base_sigkill_timeout seconds (default 1), SIGTERM, the same
// sleep, SIGKILL, and it exits 1 whatever the ranks did. The ranks treat SIGTERM like SIGINT
// (parallel/comm_watchdog.h, comm_on_signal: the flag every rank's step all-reduces, so that all stop
// after the same step, and save). What outlasts the grace is MPI_Finalize: its PMIx fence waits for mpirun,
// whose event loop sleeps, until mpirun's SIGKILL (seen: rank in PMIx_Finalize). So after a stop by
// SIGINT/SIGTERM the finalize gets until the grace is nearly over, then the rank exits without it, with
// the run's status: the checkpoint is committed and no rank has anything left to send.

static volatile sig_atomic_t g_stop_sig = 0;   // the first SIGINT/SIGTERM/SIGUSR1 this process received
static double g_stop_at = 0;                   // when (now_seconds)
static char g_stop_phase[128] = "";            // this rank's phase then (the node-shared heartbeat)
static double g_stop_grace = 1;                // mpirun's odls_base_sigkill_timeout (OMPI_MCA_ in the ranks' environment)

// records the first stop signal (signal-safe: clock_gettime, a bounded copy), then the trainer's handler
static void stop_on_signal(int sig) {
    if (!g_stop_sig) {
        g_stop_at = now_seconds();
        size_t n = 0;
        if (g_comm_slots)
            for (const char* p = g_comm_slots[g_comm_my_local].phase; n + 1 < sizeof g_stop_phase && n < sizeof g_comm_slots[0].phase && p[n]; n++)
                g_stop_phase[n] = p[n];
        g_stop_phase[n] = 0;
        g_stop_sig = sig;
    }
    comm_on_signal(sig);
}

// before MPI_Init (a signal during the start-up asks for a stop after step 1, it does not kill) and again
// after comm_init (which installs comm_on_signal); grace: the environment's OMPI_MCA_odls_base_sigkill_timeout
static void stop_signals_install(const char* grace) {
    if (grace && atof(grace) > 0) g_stop_grace = atof(grace);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGTERM, SIGINT, SIGUSR1})
        if (sigaction(sig, &sa, NULL) != 0) fail(EXIT_RUNTIME, "sigaction(%d): %s", sig, strerror(errno));
}

static const char* stop_signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1"; }

// the loop's line when the ranks agreed to stop after `step`, and its JSONL object (the console lines
// after a Ctrl-C may never reach the terminal: mpirun stops forwarding them while it ends the job)
static void stop_report(int step, const Comm& comm, RunLog* log) {
    if (comm.rank != 0) return;
    std::string sig = g_stop_sig ? stop_signal_name(g_stop_sig) : "a stop signal on another rank";
    printf("stop: %s received%s%s: every rank stops after step %d and saves\n", sig.c_str(), g_stop_phase[0] ? " during " : "",
           g_stop_phase, step);
    fflush(stdout);
    if (log->f) { fprintf(log->f, "{\"step\": %d, \"stop\": %s, \"during\": %s}\n", step, json_quote(sig).c_str(),
                          json_quote(g_stop_phase).c_str()); fflush(log->f); }
}

// comm_finalize, bounded after a stop by SIGINT/SIGTERM (above). mpirun SIGKILLs the other ranks of a
// node as soon as one of them exits (the exit ends its sleep), within tens of microseconds: so the ranks
// of a node exit together. Each one's exit thread wakes 10 ms before a moment of the node's clock, 0.25 s
// before the SIGKILL would come (the SIGTERM reached them all within microseconds; when that moment is
// past, the next 0.1 s mark from the SIGTERM), spins, marks its arrival in a page the node's ranks share,
// and exits once all of them have arrived: each is on a core then, none left behind by a late wake-up
// (on a node with fewer free cores than ranks one may still lose its core at that moment: test_ctrlc.sh).
// A finalize that returns first (the job is not ending: a scheduler's SIGTERM to the ranks) ends it as
// usual. Collective (every rank decides the same: the flag is all-reduced).
static void stop_finalize(int rc, Comm& comm) {
    float any = g_stop_sig == SIGINT || g_stop_sig == SIGTERM ? 1.0f : 0.0f;
    if (comm.world > 1) comm_all_reduce_max_f32(&comm.world_group, &any, 1);
    if (any == 0) { comm_finalize(); return; }
    // the node's page: a file in /dev/shm named after local rank 0's pid, mapped by all, then removed
    std::atomic<int>* arrived = NULL;
    if (comm.local_size > 1 && comm.local_size <= COMM_MAX_LOCAL) {
        std::string name = "/dev/shm/dbrx-stop-" + std::to_string(g_comm_local_pid[0]);
        void* p = MAP_FAILED;
        for (int turn = 0; turn < 2; turn++) {   // local rank 0 creates it empty, then the others open it
            if ((comm.local_rank == 0) == (turn == 0)) {
                int fd = open(name.c_str(), O_RDWR | O_CREAT | (turn == 0 ? O_TRUNC : 0), 0600);
                if (fd >= 0 && ftruncate(fd, 4096) == 0) p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (fd >= 0) close(fd);
            }
            comm_barrier(&comm.world_group);
        }
        if (comm.local_rank == 0) unlink(name.c_str());
        if (p != MAP_FAILED) arrived = (std::atomic<int>*)p;
        else fprintf(stderr, "warning: %s: %s: the ranks of this node exit without waiting for each other\n", name.c_str(), strerror(errno));
    }
    double at = g_stop_at + g_stop_grace - 0.25, now = now_seconds();
    if (at < now + 0.05) at += 0.1 * std::ceil((now + 0.05 - at) / 0.1);
    static std::atomic<bool> done(false);
    bool say = comm.rank == 0;
    int n = comm.local_size;
    std::thread([at, rc, say, arrived, n]() {
        double wake = at - 0.01;
        struct timespec ts = {(time_t)wake, (long)((wake - (double)(time_t)wake) * 1e9)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
        while (now_seconds() < at && !done.load()) {}
        if (done.load()) return;
        if (arrived) {   // (at most until the SIGKILL's moment: a rank that is gone does not hold the others)
            arrived->fetch_add(1);
            while (arrived->load() < n && now_seconds() < at + 0.2 && !done.load()) {}
            if (done.load()) return;
        }
        static const char m[] = "note: MPI_Finalize waits for mpirun, which is ending the job: exiting without it (the checkpoint is saved)\n";
        if (say) { ssize_t ignored = write(2, m, sizeof m - 1); (void)ignored; }
        _exit(rc);
    }).detach();
    fflush(stdout);
    fflush(stderr);
    comm_finalize();
    done.store(true);
}
