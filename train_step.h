/*
 * train_step.h — one optimizer step, written once for both backends (Model/Store: model/api.h):
 *   zero the gradients
 *   for each of grad_accum micro-batches: next batch -> forward -> backward (gradients accumulate;
 *     under ZeRO-3/HSDP each unit's weights are gathered before it runs and its gradients
 *     reduce-scattered after it: the store's unit hooks, parallel/zero.h)
 *   reduce the gradients across replicas (/ W), the metrics across ranks, the FP8 amaxes
 *   global gradient norm -> the spike guard decides -> AdamW on this rank's shard, or skip
 * Under --profile (model/profile.h) the step's phases are ranges: zero grad, data (the host's), forward,
 * backward, gradient reduction, optimizer (on the model's track: the host's clock, or the CUDA model's
 * stream), and the step itself (the host's, exactly the time the log prints); profile_* at the end
 * name and write the trace files.
 * Included by train_dbrx.cu only.
 */
#pragma once
#include <string>
#include <vector>
#include "model/debug_hooks.h"
#include "train_observers.h"

typedef struct {
    double metrics[6];      // ce, lbl, z-loss, imbalance (means over micro-batches and ranks), a stop requested (any rank),
                            // the share of the causal attention pairs computed (--doc-mask; 1 without it)
    double gnorm;           // the global gradient norm, before clipping
    float lr;
    std::string skip_why;   // why the spike guard skipped the update ("": updated)
    double ep_recv;         // expert parallelism: the most rows this rank's experts took in one layer
    double dt, busy;        // seconds: the step, and the part not blocked in collectives
    uint64_t bytes0;        // bytes the store had sent when the step began
} StepResult;

// step: 0-based (the schedule's); observers: the loop's watchers (train_observers.h)
template <typename Model, typename Store>
static StepResult train_step(const TrainArgs& args, Model* model, Store* store, DataLoader* data, const AdamWConfig* opt,
                             SpikeGuard* guard, std::vector<Fp8MetaRef>& fp8_metas, int step, Comm& comm,
                             StepObservers* obs, RunLog* log) {
    StepResult r = {};
    observers_begin_step(obs, step, log);
    dbrx_sync(model);
    double t0 = now_seconds(), wait0 = g_comm_wait_s;
    ProfTrack pt = dbrx_prof_track(model);
    prof_begin(pt, "phase", "zero grad");
    r.bytes0 = zero_bytes_sent(store);
    zero_zero_grad(store);
    prof_end(pt);
    float dloss = 1.0f / args.run.grad_accum;   // each micro-batch's share of the step's mean loss
    for (int micro = 0; micro < args.run.grad_accum; micro++) {
        comm_phase("data, micro-batch %d", micro);
        prof_begin(PROF_HOST, "phase", "data");
        dataloader_next(data);
        comm_heartbeat();
        prof_end(PROF_HOST);
        comm_phase("forward, micro-batch %d", micro);
        prof_begin(pt, "phase", "forward");
        dbrx_forward(model, data->inputs.data(), data->targets.data(), dloss);
        observers_after_forward(obs, model);
        debug_after_forward(comm.rank, step + 1);   // (the tests' killed, stopped or slow rank: model/debug_hooks.h)
        comm_phase("backward, micro-batch %d", micro);
        prof_next(pt, "phase", "backward");
        zero_last_micro(store, micro == args.run.grad_accum - 1);   // (HSDP on the GPU: the replicas' sums during its backward)
        dbrx_backward(model, data->inputs.data(), data->targets.data(), dloss);
        prof_end(pt);
        r.metrics[0] += model->ce_loss / args.run.grad_accum;
        r.metrics[1] += model->lbl_loss / args.run.grad_accum;
        r.metrics[2] += model->z_loss / args.run.grad_accum;
        r.metrics[3] += model->imbalance / args.run.grad_accum;
        r.metrics[5] += model->attn_share / args.run.grad_accum;   // (--doc-mask: the share of the causal pairs its forward computed)
        r.ep_recv = std::max(r.ep_recv, (double)dbrx_ep_recv_rows(model));
    }
    // gradients: reduce-scattered per unit during backward (S > 1); now summed across replicas, / W
    comm_phase("gradient reduction");
    prof_begin(pt, "phase", "gradient reduction");
    zero_reduce_grads(store);
    r.metrics[4] = g_comm_stop_signal ? 1 : 0;
    if (comm.world > 1) {   // metrics averaged over the ranks; a stop request anywhere stops all
        comm_all_reduce(&comm.world_group, r.metrics, 6, COMM_F64);
        for (int i : {0, 1, 2, 3, 5}) r.metrics[i] /= comm.world;
    }
    // the amax of an FP8 tensor is the max over every rank that holds a piece of it (the store reduces
    // them: on the host over MPI, or on the device over NCCL)
    if (!fp8_metas.empty()) zero_fp8_amax_reduce(store, fp8_metas, obs->fp8.on ? &obs->fp8.amax_rank0 : NULL);
    observers_before_update(obs, model, fp8_metas, step, comm, log);
    float spike;
    if (debug_spike(step + 1, &spike)) zero_scale_grads(store, spike);   // (the tests' injected spike or NaN)
    // the spike guard, before the update: a non-finite or spiking step is skipped (no update; the data
    // moves on), its FP8 amaxes dropped
    r.lr = lr_schedule(step, args.run.steps, args.optim.lr, args.optim.warmup, args.optim.lr_floor);
    comm_phase("gradient norm and optimizer");
    prof_next(pt, "phase", "optimizer");
    r.gnorm = zero_grad_norm(store);
    r.skip_why = spike_guard_check(guard, r.metrics[0], r.metrics[1] + r.metrics[2], r.gnorm);
    if (r.skip_why.empty()) zero_update(store, opt, r.lr, step + 1, r.gnorm);
    else zero_skip_update(store);
    prof_end(pt);
    dbrx_sync(model);
    r.dt = now_seconds() - t0;
    r.busy = r.dt - (g_comm_wait_s - wait0);
    prof_host_range("step", t0, t0 + r.dt, "step %d", step + 1);
    return r;
}

// ---------------------------------------------------------------------------------------------
// --profile FILE: this rank's trace file. One rank: FILE; several: one file per rank, ".rank<r>"
// inserted before FILE's extension (trace.json -> trace.rank0.json, trace.rank1.json; no extension:
// trace -> trace.rank0). Written atomically (checkpoint/files.h) after the last profiled step, or at the
// end of the loop when the run stopped before it.

static std::string profile_path(const std::string& file, int rank, int world) {
    if (world == 1) return file;
    size_t slash = file.find_last_of('/'), dot = file.find_last_of('.');
    bool ext = dot != std::string::npos && dot > (slash == std::string::npos ? 0 : slash + 1);
    std::string tag = ".rank" + std::to_string(rank);
    return ext ? file.substr(0, dot) + tag + file.substr(dot) : file + tag;
}

static bool g_profile_written = false;

// f() under --profile: a host range of category cat named `name` (NULL: f alone)
template <typename F>
static void profile_host(const char* cat, const char* name, F f) {
    if (name) prof_begin(PROF_HOST, cat, "%s", name);
    f();
    if (name) prof_end(PROF_HOST);
}

// writes this rank's trace (after the closing synchronisation of the last profiled step)
static void profile_write(const TrainArgs& args, const Comm& comm) {
    g_prof.step = 0;
    g_profile_written = true;
    std::string path = profile_path(args.run.profile, comm.rank, comm.world);
    size_t n = g_prof.ranges.size();
    std::string err = write_file_atomic(path, prof_trace_json(comm.rank, comm.world));
    if (!err.empty()) fail(EXIT_RUNTIME, "--profile %s: %s", path.c_str(), err.c_str());
    if (comm.rank == 0) {
        printf("profile: steps %d:%d, %zu ranges on rank 0, written to %s%s\n", args.run.profile_first, args.run.profile_last, n,
               path.c_str(), comm.world > 1 ? " (and one file per rank)" : "");
        fflush(stdout);
    }
}

// after the last profiled step (step, 1-based: the iteration that ended), or after the loop (step 0: a run
// that stopped before it writes what it recorded)
static void profile_finish(const TrainArgs& args, const Comm& comm, int step = 0) {
    g_prof.step = 0;
    if (step > 0 && step < args.run.profile_last) return;
    if (args.run.profile.empty() || g_profile_written) return;
    if (comm.rank == 0 && g_prof.ranges.empty())
        fprintf(stderr, "warning: --profile: no step of --profile-steps %d:%d ran in this invocation: the trace has no ranges\n",
                args.run.profile_first, args.run.profile_last);
    profile_write(args, comm);
}
