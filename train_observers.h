/*
 * train_observers.h — what the training loop watches without changing it, each with init / its hook in
 * the step / after-step / at-end:
 *   expert counts  (--log-every-experts) each layer's tokens per expert, summed over micro-batches and ranks
 *   FP8 log        (--fp8-log-every) each FP8 tensor's amax, scale and saturation, before the update
 *   stragglers     each rank's busy time (the step less its time blocked in collectives); a rank above
 *                  1.2 x the median in 8 of the last 10 steps is named (parallel/README.md)
 *   EP statistics  rows received per rank in its busiest layer; at the end, this rank's exchange
 *   comm volume    bytes this rank sent per step and in all (the communication-volume check)
 *   time left      the mean step time of this invocation (the first step, with its set-up, left out once
 *                  there are others) times the steps to go
 * Included by train_dbrx.cu only; the writers are in train_log.h.
 */
#pragma once
#include <algorithm>
#include <deque>
#include <vector>
#include "train_log.h"

typedef struct {
    int every, L, E;
    bool on;                       // this step is logged
    std::vector<double> counts;    // (L, E)
} ExpertCountLog;

typedef struct {
    int every;
    bool on;                       // this step is logged
    std::vector<float> amax_rank0; // this rank's amax of each tensor, before the reduction over ranks
} Fp8Log;

typedef struct {
    std::vector<double> busy_all;            // (world) each rank's busy seconds this step
    std::vector<std::deque<char>> slow_hist; // (world) slower than 1.2 x the median, over the last 10 steps
    int said;                                // the step a straggler was last named
} StragglerWatch;

typedef struct {
    ExpertCountLog experts;
    Fp8Log fp8;
    StragglerWatch stragglers;
    double ep_max, ep_mean;        // rows received per rank, max and mean over the ranks (< 0: no EP)
    uint64_t step_bytes, bytes_total;
    int steps_done;
    double time_steps, first_dt, eta;
} StepObservers;

static void observers_init(StepObservers* o, const TrainArgs& args, const DbrxConfig& cfg, const Comm& comm) {
    o->experts = {args.run.log_every_experts, cfg.n_layers, cfg.n_experts, false, {}};
    o->fp8 = {args.fp8.log_every, false, {}};
    o->stragglers = {std::vector<double>(comm.world), std::vector<std::deque<char>>(comm.world), -100};
    o->ep_max = o->ep_mean = -1;
    o->step_bytes = o->bytes_total = 0;
    o->steps_done = 0;
    o->time_steps = o->first_dt = o->eta = 0;
    if (!args.run.profile.empty()) prof_init(args.run.profile_first, args.run.profile_last, args.run.profile_kernels);   // --profile (model/profile.h)
}

// at the start of step (0-based) `step`: which observers log this one
static void observers_begin_step(StepObservers* o, int step, const RunLog* log) {
    o->experts.on = o->experts.every > 0 && (step + 1) % o->experts.every == 0;
    o->experts.counts.assign(o->experts.on ? (size_t)o->experts.L * o->experts.E : 0, 0.0);
    o->fp8.on = log->f && o->fp8.every > 0 && (step + 1) % o->fp8.every == 0;
}

// after each micro-batch's forward
template <typename Model>
static void observers_after_forward(StepObservers* o, Model* model) {
    if (o->experts.on) dbrx_expert_counts_add(model, &o->experts.counts);
}

// after the gradients and the FP8 amaxes are reduced, before the update (which starts the next FP8 step)
template <typename Model>
static void observers_before_update(StepObservers* o, Model* model, const std::vector<Fp8MetaRef>& fp8_metas, int step, Comm& comm,
                                    RunLog* log) {
    if (o->experts.on) {
        if (comm.world > 1) comm_all_reduce(&comm.world_group, o->experts.counts.data(), o->experts.counts.size(), COMM_F64);
        report_expert_counts(log, step + 1, o->experts.counts, o->experts.L, o->experts.E);
    }
    if (o->fp8.on) {
        std::vector<float> scale(fp8_metas.size());
        for (size_t i = 0; i < fp8_metas.size(); i++) scale[i] = dbrx_fp8_log_scale(model, fp8_metas[i], (int)i);
        report_fp8(log, step + 1, fp8_metas, o->fp8.amax_rank0, scale);
    }
}

// after step (1-based) `step` took dt seconds, busy of them (the rest blocked in collectives); the store
// had sent bytes0 when it began; its busiest layer's experts took ep_recv rows; steps_left to go. Collective.
template <typename Store>
static void observers_after_step(StepObservers* o, Store* store, uint64_t bytes0, int step, double dt, double busy, double ep_recv,
                                 int steps_left, Comm& comm, RunLog* log) {
    StragglerWatch* s = &o->stragglers;
    if (comm.world > 1) {   // every rank's busy time, and the stragglers among them
        comm_all_gather(&comm.world_group, &busy, s->busy_all.data(), 1, COMM_F64);
        std::vector<double> sorted = s->busy_all;
        std::nth_element(sorted.begin(), sorted.begin() + comm.world / 2, sorted.end());
        double med = sorted[comm.world / 2];
        for (int r = 0; r < comm.world; r++) {
            s->slow_hist[r].push_back(s->busy_all[r] > 1.2 * med && s->busy_all[r] - med > 1e-3);
            if (s->slow_hist[r].size() > 10) s->slow_hist[r].pop_front();
            int n_slow = 0;
            for (char x : s->slow_hist[r]) n_slow += x;
            if (comm.rank == 0 && n_slow >= 8 && step - s->said >= 10) {
                report_straggler(log, step, r, s->busy_all[r], med, n_slow);
                s->said = step;
            }
        }
    }
    o->step_bytes = zero_bytes_sent(store) - bytes0;   // (with the busy times' gather)
    o->bytes_total += o->step_bytes;
    o->steps_done++;
    o->time_steps += dt;
    if (o->steps_done == 2) o->time_steps -= o->first_dt;
    if (o->steps_done == 1) o->first_dt = dt;
    o->eta = (o->steps_done > 1 ? o->time_steps / (o->steps_done - 1) : dt) * steps_left;
    if (zero_layout(store)->ep_n > 1) {   // rows received per rank, max and mean over the ranks
        std::vector<double> all(comm.world);
        comm_all_gather(&comm.world_group, &ep_recv, all.data(), 1, COMM_F64);
        o->ep_max = *std::max_element(all.begin(), all.end());
        o->ep_mean = 0;
        for (double x : all) o->ep_mean += x / comm.world;
    }
}

// at the end: what this rank exchanged under EP, and sent in all (parallel/README.md's byte formulas)
template <typename Model>
static void observers_at_end(const StepObservers* o, Model* model, Zero* zl, const Comm& comm) {
    if (zl->ep_n > 1) {
        long long out = 0, in = 0, counts = 0;
        dbrx_ep_totals(model, &out, &in, &counts);
        printf("ep: rank %d sent %llu bytes in its expert-parallel group: %lld count messages, %lld rows out, %lld rows in\n", comm.rank,
               (unsigned long long)comm_bytes_sent(&zl->ep), counts, out, in);
        fflush(stdout);
    }
    if (comm.world > 1) {
        printf("comm: rank %d sent %llu bytes in %d training steps (%.1f bytes/step)\n", comm.rank, (unsigned long long)o->bytes_total,
               o->steps_done, o->steps_done ? (double)o->bytes_total / o->steps_done : 0.0);
        fflush(stdout);
    }
}
