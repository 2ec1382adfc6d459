/*
 * train_log.h — everything a training run says: the console lines (rank 0) and the JSONL log (--log, one
 * object per line, rank 0). One function per kind of event: the step (report_step), validation,
 * multiple-choice evaluation, a sample, a skipped step, a straggler, a checkpoint save, each layer's
 * tokens per expert, each FP8 tensor's scaling state. Losses are logged at full precision (%.17g) so
 * that runs can be compared bit for bit; JSON has no nan or inf, so a non-finite number is null.
 * Included by train_dbrx.cu (and the trainer's parts beside it) only.
 */
#pragma once
#include <stdio.h>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "model/common.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/json.h"
#include "data/tokenizer.h"
#include "model/dbrx.h"

// the JSONL log: open on rank 0 when --log is given (f == NULL otherwise; every writer checks)
typedef struct { FILE* f; std::string path; } RunLog;

static inline void run_log_open(RunLog* log, const std::string& path, bool append) {
    log->f = path.empty() ? NULL : fopenCheck(path.c_str(), append ? "a" : "w");   // (a resumed run appends)
    log->path = path;
}
static inline void run_log_close(RunLog* log) {
    if (log->f) fcloseCheck(log->f, log->path.c_str());
    log->f = NULL;
}

// a number for the JSONL log: JSON has no nan or inf, so a non-finite value is null
static std::string json_number_or_null(double x, const char* fmt) {
    if (!std::isfinite(x)) return "null";
    char b[64];
    snprintf(b, sizeof b, fmt, x);
    return b;
}

// 1234567 -> "1.23M" (tokens on the step line)
static std::string human_count(double n) {
    char b[32];
    if (n >= 1e12) snprintf(b, sizeof b, "%.2fT", n / 1e12);
    else if (n >= 1e9) snprintf(b, sizeof b, "%.2fB", n / 1e9);
    else if (n >= 1e6) snprintf(b, sizeof b, "%.2fM", n / 1e6);
    else if (n >= 1e3) snprintf(b, sizeof b, "%.1fK", n / 1e3);
    else snprintf(b, sizeof b, "%.0f", n);
    return b;
}
// 3725 s -> "1h02m"
static std::string human_time(double s) {
    char b[32];
    long t = (long)(s + 0.5);
    if (t >= 86400) snprintf(b, sizeof b, "%ldd%02ldh", t / 86400, t % 86400 / 3600);
    else if (t >= 3600) snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, t % 3600 / 60);
    else if (t >= 60) snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
    else snprintf(b, sizeof b, "%lds", t);
    return b;
}

// what one optimizer step reports. metrics: ce, lbl, z-loss, imbalance; mfu by the Megatron/PaLM count,
// mfu_foundry by LLM Foundry's (model/config.h); comm_bytes < 0: not logged; busy: each rank's busy time
// (NULL: one rank); tokens: seen after this step; eta: seconds left
typedef struct {
    int step, steps;
    const double* metrics;
    double gnorm, lr, dt, tok_s, mfu, mfu_foundry;
    long long comm_bytes;
    const std::vector<double>* busy;
    int64_t tokens;
    double eta;
    double ep_recv_max, ep_recv_mean;   // expert parallelism: rows received per rank in its busiest layer (< 0: no EP)
    double hfu;                         // --recompute: hardware FLOPs utilisation, the recomputed FLOPs included (< 0: none)
} StepReport;

// One optimizer step's line on the console and its object in the JSONL log.
static void report_step(RunLog* log, const StepReport& r) {
    const double* m = r.metrics;
    char ep[64] = "";
    if (r.ep_recv_max >= 0) snprintf(ep, sizeof ep, " | ep recv %.2fx", r.ep_recv_mean > 0 ? r.ep_recv_max / r.ep_recv_mean : 0.0);
    char hfu[32] = "";
    if (r.hfu >= 0) snprintf(hfu, sizeof hfu, " hfu %.1f%%", 100 * r.hfu);
    printf("step %5d/%d | loss %.6f | lbl %.5f | gnorm %.4f | lr %.3e | %.1f ms | %.0f tok/s | mfu %.1f%%%s | imb %.2f%s | %s tok | eta %s\n",
           r.step, r.steps, m[0], m[1], r.gnorm, r.lr, r.dt * 1000, r.tok_s, 100 * r.mfu, hfu, m[3], ep, human_count((double)r.tokens).c_str(),
           human_time(r.eta).c_str());
    fflush(stdout);
    FILE* f = log->f;
    if (!f) return;
    auto num = json_number_or_null;
    fprintf(f, "{\"step\": %d, \"loss\": %s, \"lbl\": %s, \"z_loss\": %s, \"grad_norm\": %s, \"lr\": %s, "
            "\"ms\": %.3f, \"tok_per_s\": %.1f, \"mfu\": %.5f, \"mfu_foundry\": %.5f, \"imbalance\": %s, \"tokens\": %lld, \"eta_s\": %.1f",
            r.step, num(m[0], "%.17g").c_str(), num(m[1], "%.6f").c_str(), num(m[2], "%.6f").c_str(), num(r.gnorm, "%.6f").c_str(),
            num(r.lr, "%.6e").c_str(), r.dt * 1000, r.tok_s, r.mfu, r.mfu_foundry, num(m[3], "%.4f").c_str(), (long long)r.tokens, r.eta);
    if (r.hfu >= 0) fprintf(f, ", \"hfu\": %.5f", r.hfu);
    if (r.comm_bytes >= 0) fprintf(f, ", \"comm_bytes\": %lld", r.comm_bytes);
    if (r.ep_recv_max >= 0) fprintf(f, ", \"ep_recv_max\": %.0f, \"ep_recv_mean\": %.1f", r.ep_recv_max, r.ep_recv_mean);
    if (r.busy) {   // each rank's busy time (the step less its time blocked in collectives): every rank's up to 64, else the max
        const std::vector<double>& busy = *r.busy;
        if (busy.size() <= 64) {
            fprintf(f, ", \"rank_busy_ms\": [");
            for (size_t k = 0; k < busy.size(); k++) fprintf(f, "%s%.2f", k ? ", " : "", busy[k] * 1000);
            fprintf(f, "]");
        }
        size_t slowest = std::max_element(busy.begin(), busy.end()) - busy.begin();
        fprintf(f, ", \"max_busy_ms\": %.2f, \"slowest_rank\": %zu", busy[slowest] * 1000, slowest);
    }
    fprintf(f, "}\n");
    fflush(f);
}

// the validation loss after `step` steps (flush: false at the end of the run, where the close flushes)
static void report_val(RunLog* log, int step, double vl, bool flush = true) {
    printf("val  %5d | val_loss %.6f\n", step, vl);
    if (!log->f) return;
    fprintf(log->f, "{\"step\": %d, \"val_loss\": %s}\n", step, json_number_or_null(vl, "%.17g").c_str());   // (full precision: comparable bit for bit)
    if (flush) fflush(log->f);
}

// --eval-mc's accuracies after `step` steps, and the seconds the evaluation took
static void report_mc(RunLog* log, int step, double acc, double acc_norm, int n, double seconds) {
    printf("mc   %5d | acc %.4f | acc_norm %.4f | %d examples | %.1f s\n", step, acc, acc_norm, n, seconds);
    if (log->f) { fprintf(log->f, "{\"step\": %d, \"mc_acc\": %.6f, \"mc_acc_norm\": %.6f, \"mc_n\": %d}\n", step, acc, acc_norm, n);
                  fflush(log->f); }
    fflush(stdout);
}

// --sample-every: the text (escaped on the console), and how long it took
static void report_sample(RunLog* log, int step, const std::string& prompt, const std::string& text, size_t tokens, double seconds) {
    printf("sample %d: %s%s\n", step, text_printable(prompt).c_str(), text_printable(text).c_str());
    printf("sample %d: %zu tokens in %.1f ms\n", step, tokens, seconds * 1000);
    fflush(stdout);
    if (!log->f) return;
    fprintf(log->f, "{\"step\": %d, \"sample\": %s}\n", step, json_quote(text_utf8(text)).c_str());
    fflush(log->f);
}

// the spike guard skipped `step` (no update; the data moves on)
static void report_skip(RunLog* log, int step, const std::string& why, size_t skipped, int window) {
    printf("guard: step %d skipped (%s): no update, the data moves on; %zu of the last %d steps skipped\n", step, why.c_str(), skipped,
           window);
    if (log->f) { fprintf(log->f, "{\"step\": %d, \"skipped\": true, \"reason\": %s}\n", step, json_quote(why).c_str()); fflush(log->f); }
    fflush(stdout);
}

// rank `r` was busy `busy` s against a median of `med` s, slower than 1.2 x the median in n_slow of the last 10 steps
static void report_straggler(RunLog* log, int step, int r, double busy, double med, int n_slow) {
    printf("straggler: rank %d was busy %.1f ms against a median of %.1f ms, slower than 1.2 x the median in %d of the "
           "last 10 steps\n", r, busy * 1000, med * 1000, n_slow);
    if (log->f) fprintf(log->f, "{\"step\": %d, \"straggler\": %d, \"busy_ms\": %.3f, \"median_busy_ms\": %.3f}\n", step, r, busy * 1000,
                        med * 1000);
}

// a checkpoint save that finished (r.step < 0: none)
static void report_save(RunLog* log, const SaveReport& r) {
    if (r.step < 0) return;
    if (r.ok) printf("ckpt: step %d -> %s: blocked %.2f ms (shard copied to host memory), written in the background in %.1f ms, "
                     "%.1f MiB, %.1f ms from start to commit\n", r.step, r.path.c_str(), r.blocked_ms, r.write_ms,
                     r.bytes / 1048576.0, r.total_ms);
    if (log->f) { fprintf(log->f, "{\"ckpt_step\": %d, \"ok\": %s, \"blocked_ms\": %.3f, \"write_ms\": %.3f, \"total_ms\": %.3f, "
                          "\"bytes\": %llu}\n", r.step, r.ok ? "true" : "false", r.blocked_ms, r.write_ms, r.total_ms,
                          (unsigned long long)r.bytes); fflush(log->f); }
    fflush(stdout);
}

// --log-every-experts: counts (L, E), each layer's tokens per expert over the step's micro-batches and ranks
static void report_expert_counts(RunLog* log, int step, const std::vector<double>& counts, int L, int E) {
    if (!log->f) return;
    fprintf(log->f, "{\"step\": %d, \"expert_counts\": [", step);
    for (int l = 0; l < L; l++) {
        fprintf(log->f, "%s[", l ? ", " : "");
        for (int e = 0; e < E; e++) fprintf(log->f, "%s%.0f", e ? ", " : "", counts[(size_t)l * E + e]);
        fprintf(log->f, "]");
    }
    fprintf(log->f, "]}\n");
}

// --fp8-log-every: each FP8 tensor's amax (all ranks, and rank 0's), scale and saturation count
static void report_fp8(RunLog* log, int step, const std::vector<Fp8MetaRef>& metas, const std::vector<float>& amax_rank0,
                       const std::vector<float>& scale) {
    if (!log->f) return;
    fprintf(log->f, "{\"step\": %d, \"fp8\": {", step);
    for (size_t i = 0; i < metas.size(); i++)
        fprintf(log->f, "%s\"%s\": {\"amax\": %.6g, \"amax_rank0\": %.6g, \"scale\": %.6g, \"saturated\": %lld}", i ? ", " : "",
                metas[i].name.c_str(), metas[i].meta->amax, amax_rank0[i], scale[i], metas[i].meta->saturated);
    fprintf(log->f, "}}\n");
}
