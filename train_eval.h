/*
 * train_eval.h — the evaluations of a run, on both backends (collective: every rank takes part):
 *   validation         evaluate: the mean cross-entropy of the first --val-steps validation batches
 *   multiple choice    evaluate_mc (--eval-mc, data/mc_eval.h): acc and acc_norm; mc_setup, run_mc
 *   samples            generate_tokens through the KV cache (the model's dbrx_decode_step),
 *                      sample_during_training (--sample-every)
 *   --generate         generate_run: load the weights, write the continuation of --prompt to stdout, exit
 *   --eval-only        eval_only_run: load the weights, validation loss and --eval-mc, print and log, exit
 *   --dump-logits      dump_logits: the first validation batch's inputs and logits, for dev/hf_logits.py
 * Included by train_dbrx.cu only.
 */
#pragma once
#include <string>
#include <vector>
#include "checkpoint/ckpt.h"
#include "checkpoint/hf.h"
#include "data/dataloader.h"
#include "data/mc_eval.h"
#include "data/tokenizer.h"
#include "model/sample.h"
#include "parallel/comm.h"
#include "train_log.h"

// mean cross-entropy over the first `steps` batches of the validation set, averaged over ranks
template <typename Model>
static double evaluate(Model* model, DataLoader* val, int steps, Comm* comm) {
    dataloader_reset(val);
    double acc = 0;
    for (int i = 0; i < steps; i++) {
        dataloader_next(val);
        comm_heartbeat();
        acc += dbrx_forward(model, val->inputs.data(), val->targets.data(), 0.0f);
    }
    acc /= steps;
    comm_all_reduce(&comm->world_group, &acc, 1, COMM_F64);
    return acc / comm->world;
}

// Multiple-choice accuracy on --eval-mc (data/mc_eval.h): every completion is one row of a B x T batch
// (context + completion; mc_row), scored by the sum of the per-token losses over the completion's tokens.
// acc: the completion with the lowest total loss is the right one; acc_norm: the lowest mean loss per
// token (mc_decide). Example i is rank i mod W's; a rank packs its examples' rows into batches, and
// every rank runs as many forward passes as the busiest one (dummy rows of the set's text fill the rest:
// under ZeRO-3 the forward is collective). The rows' sums are all-reduced (each row is one rank's, the
// others add 0: exact), so every rank decides every example the same. The evaluation's FP8 amaxes are
// dropped: it leaves no trace in training. dump (rank 0, or NULL): one JSON line per example.
typedef struct { double acc, acc_norm; int n; } McResult;

template <typename Model, typename Store>
static McResult evaluate_mc(Model* model, Store* store, const McSet* set, int B, int T, Comm* comm, FILE* dump, int step) {
    int W = comm->world, n = (int)set->ex.size();
    std::vector<int64_t> row0(n + 1, 0);   // the first row of each example, over all examples
    for (int i = 0; i < n; i++) row0[i + 1] = row0[i] + (int64_t)set->ex[i].endings.size();
    int64_t calls = 0;                     // forward passes per rank: the busiest rank's
    for (int q = 0; q < W; q++) {
        int64_t rows = 0;
        for (int i = q; i < n; i += W) rows += (int64_t)set->ex[i].endings.size();
        calls = std::max(calls, (rows + B - 1) / B);
    }
    std::vector<std::pair<int, int>> mine;   // this rank's rows: (example, completion)
    for (int i = comm->rank; i < n; i += W)
        for (int c = 0; c < (int)set->ex[i].endings.size(); c++) mine.push_back({i, c});
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T), first(B), count(B);
    std::vector<float> losses;
    std::vector<double> sum(row0[n], 0.0);
    for (int64_t call = 0; call < calls; call++) {
        for (int b = 0; b < B; b++) {
            size_t k = (size_t)(call * B + b);
            int* in = &inputs[(size_t)b * T];
            int* tg = &targets[(size_t)b * T];
            count[b] = 0;
            if (k < mine.size()) mc_row(set, set->ex[mine[k].first], mine[k].second, T, in, tg, &first[b], &count[b]);
            else {   // (a dummy row: text, so that it routes as text does: mc_filler)
                for (int t = 0; t < T; t++) in[t] = mc_filler(set, k, t);
                std::fill(tg, tg + T, 0);
            }
        }
        comm_heartbeat();
        dbrx_forward(model, inputs.data(), targets.data(), 0.0f);
        dbrx_losses_to_host(model, &losses);
        for (int b = 0; b < B; b++) {
            if (count[b] == 0) continue;
            double s = 0;
            for (int t = first[b]; t < first[b] + count[b]; t++) s += losses[(size_t)b * T + t];
            const std::pair<int, int>& r = mine[(size_t)(call * B + b)];
            sum[row0[r.first] + r.second] = s;
        }
    }
    zero_skip_update(store);   // (no gradient was computed: this drops the forward passes' FP8 amaxes)
    if (W > 1) comm_all_reduce(&comm->world_group, sum.data(), sum.size(), COMM_F64);
    int right = 0, right_norm = 0;
    std::vector<int> cnt;
    for (int i = 0; i < n; i++) {
        const McExample& e = set->ex[i];
        int C = (int)e.endings.size(), pred, pred_norm;
        cnt.resize(C);
        for (int c = 0; c < C; c++) cnt[c] = std::min(e.endings[c].len, T);   // (mc_row's count)
        mc_decide(&sum[row0[i]], cnt.data(), C, &pred, &pred_norm);
        right += pred == e.label;
        right_norm += pred_norm == e.label;
        if (dump) {
            fprintf(dump, "{\"step\": %d, \"example\": %d, \"label\": %d, \"pred\": %d, \"pred_norm\": %d, \"sum\": [", step, i, e.label,
                    pred, pred_norm);
            for (int c = 0; c < C; c++) fprintf(dump, "%s%s", c ? ", " : "", json_number_or_null(sum[row0[i] + c], "%.17g").c_str());
            fprintf(dump, "], \"count\": [");
            for (int c = 0; c < C; c++) fprintf(dump, "%s%d", c ? ", " : "", cnt[c]);
            fprintf(dump, "]}\n");
        }
    }
    if (dump) fflush(dump);
    return {(double)right / n, (double)right_norm / n, n};
}

// ---------------------------------------------------------------------------------------------
// generation, on both backends (the model's dbrx_decode_step: model/dbrx.h, model/dbrx_cuda.cuh)

// The continuation of prompt (ids, non-empty): the prompt runs through the KV cache one position at a
// time (prefill), then each new token is drawn from the last position's logits (model/sample.h) and fed
// back, until max_new tokens or the end-of-text token (which ends a document; it is not returned).
// Collective: every rank runs every step (under ZeRO-3/HSDP the weights are gathered unit by unit through
// the model's hooks), rank 0 draws and broadcasts each token, so all ranks feed the same sequence.
template <typename Model>
static std::vector<int> generate_tokens(Model* model, const Tokenizer* tok, const std::vector<int>& prompt, int max_new,
                                        float temperature, int top_k, uint64_t seed, Comm* comm) {
    dbrx_decode_alloc(model, (int)prompt.size() + max_new);
    Rng rng = {seed};
    int V = model->cfg.vocab_size, pos = 0;
    std::vector<int> out;
    const float* logits = nullptr;
    for (int t : prompt) logits = dbrx_decode_step(model, t, pos++);
    for (int i = 0; i < max_new; i++) {
        comm_heartbeat();
        int next = comm->rank == 0 ? sample_token(logits, V, tok->valid.data(), temperature, top_k, &rng) : 0;
        if (comm->world > 1) comm_broadcast(&comm->world_group, &next, sizeof next, 0);
        if (next == tok->eot) break;
        out.push_back(next);
        if (i + 1 < max_new) logits = dbrx_decode_step(model, next, pos++);
    }
    return out;
}

// the sampler's seed of the sample after `step` (--sample-seed, else --seed): a resumed run draws the same
static uint64_t sample_seed(const TrainArgs& a, int step) {
    uint64_t base = (uint64_t)(a.sample.seed >= 0 ? a.sample.seed : a.run.seed);
    return base * 0x9E3779B97F4A7C15ull + 0x73616D706C65ull + (uint64_t)step;
}

// --sample-every: rank 0 prints "sample STEP: TEXT" (control characters escaped) and logs the text
template <typename Model>
static void sample_during_training(const TrainArgs& args, Model* model, Comm* comm, int step, RunLog* log) {
    comm_phase("sample after step %d", step);
    double t0 = now_seconds();
    std::vector<int> ids = generate_tokens(model, args.sample.tok, args.sample.prompt_ids, args.sample.len, args.sample.temperature, args.sample.top_k,
                                           sample_seed(args, step), comm);
    if (comm->rank != 0) return;
    report_sample(log, step, args.sample.prompt, tokenizer_decode(args.sample.tok, ids), ids.size(), now_seconds() - t0);
}

// --eval-mc: loads the set (every rank: each scores its share of the examples) and says what an
// evaluation costs
static void mc_setup(McSet* mc, const TrainArgs& args, const DbrxConfig& cfg, const Comm& comm) {
    mc_load(mc, args.eval.mc.c_str(), "--eval-mc", cfg.vocab_size);
    int64_t cut = 0, busiest = 0;
    for (const McExample& e : mc->ex)
        for (const McSpan& c : e.endings) cut += e.ctx.len + c.len > args.run.seq + 1;
    for (int q = 0; q < comm.world; q++) {
        int64_t rows = 0;
        for (size_t i = q; i < mc->ex.size(); i += comm.world) rows += (int64_t)mc->ex[i].endings.size();
        busiest = std::max(busiest, rows);
    }
    if (comm.rank != 0) return;
    printf("eval-mc: %s: %zu examples, %d", args.eval.mc.c_str(), mc->ex.size(), mc->min_completions);
    if (mc->max_completions != mc->min_completions) printf("-%d", mc->max_completions);
    printf(" completions (version %d, uint%d tokens): %lld rows, %lld forward passes of %d x %d per rank per evaluation, "
           "%s\n", mc->version, mc->version == 1 ? 16 : 32, (long long)mc->rows, (long long)((busiest + args.run.batch - 1) / args.run.batch),
           args.run.batch, args.run.seq, args.eval.only ? "once (--eval-only)" : args.eval.every > 0 ? ("every " + std::to_string(args.eval.every) + " steps and at the end").c_str()
           : "at the end");
    if (cut) printf("eval-mc: %lld of %lld rows are longer than --seq %d + 1 tokens: their context is cut from the left\n",
                    (long long)cut, (long long)mc->rows, args.run.seq);
}

// --eval-mc after `step` steps: one line, and one JSONL object (dump: rank 0's --eval-mc-dump, or NULL)
template <typename Model, typename Store>
static void run_mc(Model* model, Store* store, const McSet* mc, const TrainArgs& args, Comm* comm, FILE* dump, int step, RunLog* log) {
    comm_phase("multiple-choice evaluation");
    double t0 = now_seconds();
    McResult r = evaluate_mc(model, store, mc, args.run.batch, args.run.seq, comm, dump, step);
    if (comm->rank == 0) report_mc(log, step, r.acc, r.acc_norm, r.n, now_seconds() - t0);
}

// --dump-logits: the inputs and logits of the first validation batch (rank 0 writes them), for dev/hf_logits.py
template <typename Model>
static void dump_logits(Model* model, DataLoader* val, const TrainArgs& args, const DbrxConfig& cfg, const Comm& comm) {
    dataloader_reset(val);
    dataloader_next(val);
    dbrx_forward(model, val->inputs.data(), val->targets.data(), 0.0f);
    if (comm.rank != 0) return;
    std::vector<float> logits;
    dbrx_logits_to_host(model, &logits);
    st_write_host(args.eval.dump_logits, {{"inputs", "I32", {args.run.batch, args.run.seq}, val->inputs.data()},
                                     {"targets", "I32", {args.run.batch, args.run.seq}, val->targets.data()},
                                     {"logits", "F32", {args.run.batch, args.run.seq, cfg.vocab_size}, logits.data()}},
                  {{"precision", args.fp8.recipe != "off" ? "fp8-" + args.fp8.recipe : std::is_same<Model, Dbrx>::value ? "fp32" : "bf16"}});
    printf("dump: inputs and logits of the first validation batch -> %s\n", args.eval.dump_logits.c_str());
}

// ---------------------------------------------------------------------------------------------
// --generate: load the weights (a checkpoint, or a Hugging Face export), write the continuation of the
// prompt to stdout, exit. Both backends, any number of ranks (collective: the store gathers the units).

static FILE* g_generate_out = NULL;   // the process's stdout; everything else goes to stderr in --generate

// The weights of --generate and --eval-only: --init-hf DIR (a Hugging Face export) or --resume DIR|auto (a
// checkpoint: the weights only, no optimizer or data state); the step they were saved at (0: an export)
template <typename Model, typename Store>
static int load_weights(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, Model* model, Store* store, const char* mode) {
    Zero* zl = zero_layout(store);
    if (!args.ckpt.init_hf.empty()) {
        hf_import(args.ckpt.init_hf, zl, &cfg, model->table, &comm);
        zero_from_host(store);
        if (comm.rank == 0) printf("init: weights from the Hugging Face export %s\n", args.ckpt.init_hf.c_str());
        return 0;
    }
    Checkpointer ck;
    ckpt_init(&ck, args.ckpt.dir, 0, 1, 0);
    ck.weights_only = true;   // (whatever optimizer saved them)
    TrainProgress prog;
    JsonValue man;
    std::string from;
    if (!ckpt_resume(&ck, args.ckpt.resume, zl, &cfg, &prog, &man, &from, &comm)) {   // (auto, and none there)
        comm_agreed_failure();
        if (comm.rank == 0) fail(EXIT_BAD_INPUT, "%s --resume auto: no checkpoint in --ckpt-dir %s", mode, args.ckpt.dir.c_str());
        exit(EXIT_BAD_INPUT);
    }
    zero_from_host(store);
    ckpt_free(&ck);
    if (comm.rank == 0) printf("resume: weights from %s (step %d)\n", from.c_str(), prog.step);
    return prog.step;
}

template <typename Model, typename Store>
static int generate_run(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, Model* model, Store* store) {
    load_weights(args, cfg, comm, model, store, "--generate");
    if (comm.rank == 0) {
        printf("generate: %zu prompt tokens (the end-of-text token first), at most %d new, temperature %g%s, %s tokenizer\n",
               args.sample.prompt_ids.size(), args.sample.len, args.sample.temperature,
               args.sample.top_k > 0 ? (", top-" + std::to_string(args.sample.top_k)).c_str() : "",
               args.sample.tok->kind == TOKENIZER_BYTES ? "bytes" : "cl100k");
        fflush(stdout);
    }
    comm_watch(1);
    double t0 = now_seconds();
    std::vector<int> ids = generate_tokens(model, args.sample.tok, args.sample.prompt_ids, args.sample.len, args.sample.temperature, args.sample.top_k,
                                           sample_seed(args, 0), &comm);
    double dt = now_seconds() - t0;
    comm_watch(0);
    if (comm.rank == 0) {
        std::string text = args.sample.prompt + tokenizer_decode(args.sample.tok, ids) + "\n";
        fwriteCheck(text.data(), 1, text.size(), g_generate_out, "the generated text");
        if (fflush(g_generate_out) != 0) fail(EXIT_RUNTIME, "writing the generated text to stdout: %s", strerror(errno));
        printf("generate: %zu tokens in %.2f s (%zu positions through the KV cache, %.1f per second)\n", ids.size(), dt,
               args.sample.prompt_ids.size() + ids.size(), (args.sample.prompt_ids.size() + ids.size()) / (dt > 0 ? dt : 1e-9));
        fflush(stdout);
    }
    return 0;
}


// ---------------------------------------------------------------------------------------------
// --eval-only: load the weights (load_weights), then the validation loss of --val-steps batches of
// --val-data (unless it is '') and --eval-mc (when given), each printed and logged (--log) as training
// logs them at the step the weights were saved at (0: an export), exit 0. Both backends, any ranks,
// ZeRO-3/HSDP, EP and context parallelism (each CP rank its two chunks of its group's sequences, the ring
// attention over the group; evaluate's mean over the world is the mean over every token, each rank holding as
// many): the same evaluate and evaluate_mc as training's, so at the same --batch, --seq, number of ranks and CP
// degree the loss is the one the training run logged at that step.
template <typename Model, typename Store>
static int eval_only_run(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, Model* model, Store* store) {
    int step = load_weights(args, cfg, comm, model, store, "--eval-only");
    RunLog log = {NULL, ""};
    FILE* mc_dump = NULL;
    if (comm.rank == 0) {
        run_log_open(&log, args.run.log, true);   // (appends: the training run's log may be the one named)
        if (!args.eval.mc_dump.empty()) mc_dump = fopenCheck(args.eval.mc_dump.c_str(), "w");
    }
    comm_watch(1);
    if (!args.data.val.empty()) {
        DataLoader val;
        dataloader_init(&val, args.data.val.c_str(), "--val-data", args.run.batch, args.run.seq, comm.rank, comm.world, cfg.vocab_size, NULL);
        dataloader_context_parallel(&val, args.parallel.context_parallel);   // (CP: each rank its two chunks, as training's validation)
        if (comm.rank == 0) printf("%s", dataloader_describe(&val, "--val-data").c_str());
        comm_phase("validation");
        double vl = evaluate(model, &val, args.eval.val_steps, &comm);
        if (comm.rank == 0) report_val(&log, step, vl);
        dataloader_free(&val);
    }
    if (!args.eval.mc.empty()) {
        McSet mc;
        mc_setup(&mc, args, cfg, comm);
        run_mc(model, store, &mc, args, &comm, mc_dump, step, &log);
    }
    comm_watch(0);
    run_log_close(&log);
    if (mc_dump) fcloseCheck(mc_dump, args.eval.mc_dump.c_str());
    if (comm.rank == 0) fflush(stdout);
    return 0;
}
