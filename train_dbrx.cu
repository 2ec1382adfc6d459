/*
 * train_dbrx.cu — trains a DBRX-style Mixture-of-Experts transformer. main() parses the flags
 * (train_flags.h), builds the model, and runs the training loop: for every step, grad_accum micro-batches of
 * forward + backward (under ZeRO-3/HSDP each unit's parameters are gathered before it runs and its
 * gradients reduce-scattered after: parallel/zero.h), the gradients summed across replicas,
 * global-norm clipping and AdamW on this rank's shard; a validation loss every --val-every steps;
 * one log line per step and a JSONL log; with --health-check, first a health check on every rank
 * (parallel/health.h: GEMM, collectives, forward), which stops the job when a rank fails it.
 * The loop (train, below) is written once for both backends:
 * --device cuda (or auto, when a GPU is visible) runs it on the CUDA model (model/dbrx_cuda.cuh) with
 * the device parameter store (parallel/zero_gpu.cuh, NCCL); train_cuda.cuh has the device set-up.
 *
 * The model itself, with every piece of the DBRX block, is model/dbrx.h:
 *   embedding (model/embedding.cuh) -> L x [ norm_1 (layernorm.cuh) -> Wqkv (matmul.cuh)
 *   -> clip_qkv, RoPE, causal GQA attention (attention.cuh) -> out_proj -> residual
 *   -> norm_2 -> router, top-k, LBL, z-loss (router.cuh) -> dropless SwiGLU experts (moe.cuh)
 *   -> residual ] -> norm_f -> lm_head -> cross-entropy (classifier.cuh); AdamW in adamw.cuh.
 *
 *   make && mpirun -np 1 ./train_dbrx --model dbrx-tiny
 *   mpirun -np 4 ./train_dbrx --model dbrx-tiny --shard-group-size 2     (HSDP: 2 shard groups of 2)
 */
#include <omp.h>
#include <sys/sysinfo.h>
#include <unistd.h>
#include <algorithm>
#include <deque>
#include <new>
#include <string>
#include <vector>
#include "model/common.h"
#include "model/config.h"
#include "model/dbrx.h"
#include "data/dataloader.h"
#include "data/mc_eval.h"
#include "parallel/comm.h"
#include "parallel/zero.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/hf.h"
#include "checkpoint/loader_state.h"
#include "checkpoint/spike_guard.h"
#include "parallel/health.h"
#include "model/sample.h"
#include "model/debug_hooks.h"
#include "dev/data/tokenizer.h"

#include "train_flags.h"   // TrainArgs, the flag table, parse_args

// 131596523520 -> "131,596,523,520"
static std::string with_commas(int64_t n) {
    std::string s = std::to_string(n), out;
    int lead = (int)s.size() % 3;
    for (size_t i = 0; i < s.size(); i++) {
        if (i && (int)(i % 3) == lead % 3 && s[0] != '-') out += ',';
        out += s[i];
    }
    return out;
}

// The banner. A model whose shape flags changed the preset is named "custom (from PRESET: the flags)", so
// that the line never claims a preset the run does not train.
static void print_config(const char* preset, const DbrxConfig* c) {
    DbrxConfig p;
    std::string name = preset, changed;
    if (model_preset_lookup(preset, &p)) {
        auto num = [&](const char* flag, double run, double was) {
            if ((float)run != (float)was) { char b[96]; snprintf(b, sizeof b, "%s%s %g", changed.empty() ? "" : " ", flag, run); changed += b; }
        };
        auto setting = [&](const char* flag, float run, float was) {
            if (dbrx_is_off(run) != dbrx_is_off(was) || (!dbrx_is_off(run) && run != was))
                changed += std::string(changed.empty() ? "" : " ") + flag + " " + dbrx_setting_str(run);
        };
        num("--d-model", c->d_model, p.d_model); num("--n-heads", c->n_heads, p.n_heads); num("--kv-heads", c->kv_heads, p.kv_heads);
        num("--n-layers", c->n_layers, p.n_layers); num("--ffn-hidden", c->ffn_hidden, p.ffn_hidden);
        num("--experts", c->n_experts, p.n_experts); num("--top-k", c->top_k, p.top_k); num("--vocab", c->vocab_size, p.vocab_size);
        num("--max-seq", c->max_seq_len, p.max_seq_len); num("--rope-theta", c->rope_theta, p.rope_theta);
        setting("--clip-qkv", c->clip_qkv, p.clip_qkv); setting("--moe-normalize-expert-weights", c->moe_norm_p, p.moe_norm_p);
        num("--ln-eps", c->ln_eps, p.ln_eps); num("--moe-loss-weight", c->moe_loss_weight, p.moe_loss_weight);
        num("--z-loss-weight", c->z_loss_weight, p.z_loss_weight); num("--init-std", c->init_std, p.init_std);
        if (!changed.empty()) name = "custom (from " + name + ": " + changed + ")";
    }
    printf("model %s: d %d, heads %d (kv %d, head_dim %d), layers %d, experts %d top-%d (ffn %d), vocab %d, "
           "max_seq %d, rope_theta %g, clip_qkv %s, moe_normalize_expert_weights %s, moe_loss_weight %g, z_loss_weight %g\n",
           name.c_str(), c->d_model, c->n_heads, c->kv_heads, c->head_dim, c->n_layers, c->n_experts, c->top_k,
           c->ffn_hidden, c->vocab_size, c->max_seq_len, c->rope_theta, dbrx_setting_str(c->clip_qkv).c_str(),
           dbrx_setting_str(c->moe_norm_p).c_str(), c->moe_loss_weight, c->z_loss_weight);
    printf("parameters: total %s, active %s\n", with_commas(params_total(c)).c_str(), with_commas(params_active(c)).c_str());
}

// ---------------------------------------------------------------------------------------------
// shapes and memory estimates for any flags: never wrapped, never negative, and instant

// f(cfg) for cfg's number of layers, from f at 1, 2 and 3 layers. Every memory walk (dbrx_activations,
// dbrx_gpu_memory_estimate, zero_gpu_estimate_bytes) is affine in the layers (each block the same buffers),
// and walking 2^31 layers one at a time takes minutes; the sum is taken in long double, where it cannot
// wrap. The callers have bounded one layer's walk (shape_validate), so the three walks cannot wrap either.
template <typename F>
static long double per_layers(const DbrxConfig* c, F f) {
    if (c->n_layers <= 3) return (long double)f(c);
    DbrxConfig x = *c;
    size_t e[3];
    for (int l = 1; l <= 3; l++) { x.n_layers = l; e[l - 1] = f(&x); }
    ENSURE(e[2] - e[1] == e[1] - e[0], "memory walk not affine in the layers (%zu, %zu, %zu bytes for 1, 2, 3)", e[0], e[1], e[2]);
    return (long double)e[0] + (long double)(c->n_layers - 1) * (long double)(e[1] - e[0]);
}
// the CPU model's activation bytes for micro-batches of B x T (the walk that allocates them)
static long double activation_bytes(const DbrxConfig* c, int B, int T) {
    return per_layers(c, [&](const DbrxConfig* x) { return dbrx_activations(NULL, x, B, T); });
}

// The micro-batch against the model: token rows are 32-bit ints in the kernels, and no buffer may be
// beyond any memory (2^50 elements, 4 PiB of floats; the whole activations 2^60 bytes): so that every walk
// and size of a run (or of --dry-run) fits in 64 bits. One line naming the flags, exit 2.
static void shape_validate(const DbrxConfig* c, int B, int T) {
    long long rows = (long long)B * T * c->top_k;
    if (rows > INT32_MAX)
        fail(EXIT_BAD_INPUT, "--batch %d x --seq %d x --top-k %d = %lld routed token rows do not fit in 32 bits (at most %d): "
             "lower --batch or --seq", B, T, c->top_k, rows, INT32_MAX);
    long double N = (long double)B * T, widest = c->vocab_size;
    for (long double w : {(long double)c->d_model, (long double)qkv_dim(c), (long double)c->n_experts,
                          (long double)c->top_k * c->d_model, (long double)c->top_k * c->ffn_hidden})
        widest = std::max(widest, w);
    long double biggest = std::max(N * widest, N * c->n_heads * T);   // (N, width) or the attention (B, H, T, T)
    if (biggest > (long double)(1ull << 50))
        fail(EXIT_BAD_INPUT, "--batch %d x --seq %d: one activation buffer would hold %.3Lg elements (more than 2^50) for this "
             "model (--d-model %d, --vocab %d, --n-heads %d): lower --batch or --seq", B, T, biggest, c->d_model,
             c->vocab_size, c->n_heads);
    long double act = activation_bytes(c, B, T);
    if (act > (long double)(1ull << 60))
        fail(EXIT_BAD_INPUT, "--n-layers %d with --batch %d x --seq %d: the activations would need %.3Lg bytes (more than 2^60): "
             "lower --n-layers, --batch or --seq", c->n_layers, B, T, act);
}

// Before the CPU run allocates: a run whose parameter state and activations cannot fit in this node's
// memory (RAM + swap, for all its ranks) is refused with one line (exit 2) instead of dying of an
// allocation failure, or of the kernel's OOM killer, halfway through its set-up. A lower bound (working
// buffers and FP8 scratch not counted), so it refuses only what cannot run. Collective.
static void host_memory_check(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm) {
    int S = args.shard_group_size > 0 && args.shard_group_size <= comm.world ? args.shard_group_size : comm.world;
    long double act = activation_bytes(&cfg, args.batch, args.seq), state = 16.0L * params_total(&cfg) / S;
    long double need = (act + state) * comm.local_size, have = -1;
    struct sysinfo si;
    if (sysinfo(&si) == 0) have = ((long double)si.totalram + (long double)si.totalswap) * si.mem_unit;
    else fprintf(stderr, "warning: sysinfo: %s: the host memory is not checked before allocating\n", strerror(errno));
    int bad = have > 0 && need > have ? 1 : 0, any = bad;
    if (comm.world > 1) comm_all_reduce(&comm.world_group, &any, 1, COMM_I32);
    if (!any) return;
    comm_agreed_failure();   // every rank exits with the same verdict: none of them is a lost rank
    if (bad && comm.local_rank == 0)
        fail(EXIT_BAD_INPUT, "the run needs at least %.2Lf GiB of host memory per rank (activations %.2Lf GiB for --batch %d x --seq %d, "
             "parameters+grads+AdamW moments 16 B/param / %d = %.2Lf GiB) x %d rank(s) on this node, more than its %.2Lf GiB "
             "(RAM + swap): lower --batch or --seq, shard over more ranks, or use a smaller model", (act + state) / 1073741824.0L,
             act / 1073741824.0L, args.batch, args.seq, S, state / 1073741824.0L, comm.local_size, have / 1073741824.0L);
    exit(EXIT_BAD_INPUT);
}

// Out of host memory in any allocation (operator new, in any thread): one line, exit 1, instead of an
// uncaught std::bad_alloc. Only async-signal-safe calls: the heap may be in any state.
[[noreturn]] static void on_out_of_memory() {
    comm_mark_exiting();
    static const char m[] = "error: out of host memory: an allocation failed (the model, --batch or --seq is too large for "
                            "this machine; --dry-run shows the estimate)\n";
    ssize_t ignored = write(2, m, sizeof m - 1);
    (void)ignored;
    _exit(EXIT_RUNTIME);
}

// ---------------------------------------------------------------------------------------------
// MFU peak of the CPU: threads x clock x FP32 FLOPs per cycle per core (2 FMA units: 64 with
// AVX-512, 32 with AVX2+FMA, 8 otherwise). The clock is /proc/cpuinfo's "cpu MHz".

static double cpu_peak_flops(int threads, std::string* how) {
    FILE* f = fopen("/proc/cpuinfo", "r");
    double mhz = 0;
    int per_cycle = 8;
    const char* isa = "SSE";
    if (f) {
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            if (mhz == 0 && !strncmp(line, "cpu MHz", 7)) { const char* p = strchr(line, ':'); if (p) mhz = atof(p + 1); }
            if (!strncmp(line, "flags", 5)) {
                if (strstr(line, " avx512f")) { per_cycle = 64; isa = "AVX-512"; }
                else if (strstr(line, " avx2") && strstr(line, " fma")) { per_cycle = 32; isa = "AVX2+FMA"; }
            }
        }
        fclose(f);
    }
    if (mhz <= 0) mhz = 2000;
    char buf[256];
    snprintf(buf, sizeof buf, "%d threads x %.2f GHz x %d FP32 FLOP/cycle (%s)", threads, mhz / 1000, per_cycle, isa);
    *how = buf;
    return threads * mhz * 1e6 * per_cycle;
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
} StepReport;

// One optimizer step's line on the console and its object in the JSONL log. The loss is logged at full
// precision so that runs can be compared bit for bit.
static void report_step(FILE* logf, const StepReport& r) {
    const double* m = r.metrics;
    char ep[64] = "";
    if (r.ep_recv_max >= 0) snprintf(ep, sizeof ep, " | ep recv %.2fx", r.ep_recv_mean > 0 ? r.ep_recv_max / r.ep_recv_mean : 0.0);
    printf("step %5d/%d | loss %.6f | lbl %.5f | gnorm %.4f | lr %.3e | %.1f ms | %.0f tok/s | mfu %.1f%% | imb %.2f%s | %s tok | eta %s\n",
           r.step, r.steps, m[0], m[1], r.gnorm, r.lr, r.dt * 1000, r.tok_s, 100 * r.mfu, m[3], ep, human_count((double)r.tokens).c_str(),
           human_time(r.eta).c_str());
    fflush(stdout);
    if (!logf) return;
    auto num = json_number_or_null;
    fprintf(logf, "{\"step\": %d, \"loss\": %s, \"lbl\": %s, \"z_loss\": %s, \"grad_norm\": %s, \"lr\": %s, "
            "\"ms\": %.3f, \"tok_per_s\": %.1f, \"mfu\": %.5f, \"mfu_foundry\": %.5f, \"imbalance\": %s, \"tokens\": %lld, \"eta_s\": %.1f",
            r.step, num(m[0], "%.17g").c_str(), num(m[1], "%.6f").c_str(), num(m[2], "%.6f").c_str(), num(r.gnorm, "%.6f").c_str(),
            num(r.lr, "%.6e").c_str(), r.dt * 1000, r.tok_s, r.mfu, r.mfu_foundry, num(m[3], "%.4f").c_str(), (long long)r.tokens, r.eta);
    if (r.comm_bytes >= 0) fprintf(logf, ", \"comm_bytes\": %lld", r.comm_bytes);
    if (r.ep_recv_max >= 0) fprintf(logf, ", \"ep_recv_max\": %.0f, \"ep_recv_mean\": %.1f", r.ep_recv_max, r.ep_recv_mean);
    if (r.busy) {   // each rank's busy time (the step less its time blocked in collectives): every rank's up to 64, else the max
        const std::vector<double>& busy = *r.busy;
        if (busy.size() <= 64) {
            fprintf(logf, ", \"rank_busy_ms\": [");
            for (size_t k = 0; k < busy.size(); k++) fprintf(logf, "%s%.2f", k ? ", " : "", busy[k] * 1000);
            fprintf(logf, "]");
        }
        size_t slowest = std::max_element(busy.begin(), busy.end()) - busy.begin();
        fprintf(logf, ", \"max_busy_ms\": %.2f, \"slowest_rank\": %zu", busy[slowest] * 1000, slowest);
    }
    fprintf(logf, "}\n");
    fflush(logf);
}

// Opens the training set (seeded, rank-independent order; mixtures and schedule) and, when there is
// validation or --dump-logits, the validation set (fixed order); returns whether it opened the latter.
static bool open_datasets(const TrainArgs& args, const DbrxConfig& cfg, const Comm& comm, DataLoader* train, DataLoader* val) {
    DataLoaderOptions data_opt = {(uint64_t)(args.data_seed >= 0 ? args.data_seed : args.seed), 1, args.grad_accum,
                                  args.data_schedule.c_str()};
    dataloader_init(train, args.data.c_str(), "--data", args.batch, args.seq, comm.rank, comm.world, cfg.vocab_size, &data_opt);
    bool have_val = !args.val_data.empty() && (args.val_every > 0 || !args.dump_logits.empty());
    if (have_val) dataloader_init(val, args.val_data.c_str(), "--val-data", args.batch, args.seq, comm.rank, comm.world, cfg.vocab_size, NULL);
    if (comm.rank == 0) printf("%s%s", dataloader_describe(train, "--data").c_str(), have_val ? dataloader_describe(val, "--val-data").c_str() : "");
    return have_val;
}

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
// every rank runs as many forward passes as the busiest one (dummy rows of token 0 fill the rest:
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
            else { std::fill(in, in + T, 0); std::fill(tg, tg + T, 0); }
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
    uint64_t base = (uint64_t)(a.sample_seed >= 0 ? a.sample_seed : a.seed);
    return base * 0x9E3779B97F4A7C15ull + 0x73616D706C65ull + (uint64_t)step;
}

// --sample-every: rank 0 prints "sample STEP: TEXT" (control characters escaped) and logs the text
template <typename Model>
static void sample_during_training(const TrainArgs& args, Model* model, Comm* comm, int step, FILE* logf) {
    comm_phase("sample after step %d", step);
    double t0 = now_seconds();
    std::vector<int> ids = generate_tokens(model, args.tok, args.prompt_ids, args.sample_len, args.temperature, args.sample_top_k,
                                           sample_seed(args, step), comm);
    if (comm->rank != 0) return;
    std::string text = tokenizer_decode(args.tok, ids);
    printf("sample %d: %s%s\n", step, text_printable(args.prompt).c_str(), text_printable(text).c_str());
    printf("sample %d: %zu tokens in %.1f ms\n", step, ids.size(), (now_seconds() - t0) * 1000);
    fflush(stdout);
    if (logf) {
        fprintf(logf, "{\"step\": %d, \"sample\": %s}\n", step, json_quote(text_utf8(text)).c_str());
        fflush(logf);
    }
}

// ---------------------------------------------------------------------------------------------
// THE TRAINING LOOP, written once for both backends. Model is Dbrx (CPU, model/dbrx.h) or DbrxGPU
// (CUDA, model/dbrx_cuda.cuh); Store is the parameter store that owns the weights, gradients and AdamW
// moments: Zero (host memory, MPI: parallel/zero.h) or ZeroGpu (device memory, NCCL:
// parallel/zero_gpu.cuh). Both pairs answer the same calls:
//   model  dbrx_forward, dbrx_backward, dbrx_fp8_metas, dbrx_fp8_log_scale, dbrx_logits_to_host, dbrx_losses_to_host,
//          dbrx_expert_counts_add, dbrx_sync
//   store  zero_zero_grad, zero_reduce_grads, zero_update, zero_fp8_amax_reduce, zero_bytes_sent,
//          zero_to_host, zero_from_host, zero_layout (the layout and host shards that checkpoints and
//          Hugging Face interop read)
// The backend's set-up (train_cpu below, train_cuda in train_cuda.cuh) builds them and calls this.

typedef struct { double peak; std::string peak_how; std::string memory_line; HealthBackend health; } BackendInfo;

static HealthOptions health_options(const TrainArgs& a) {
    return {a.health_min_tflops, a.health_min_busbw, a.health_gemm_size, a.health_comm_mib, a.batch, a.seq, a.health_gemm_ratio};
}

template <typename Model, typename Store>
static int train(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, Model* model, Store* store, const BackendInfo& info) {
    Zero* zl = zero_layout(store);
    if (args.health_check_only) {   // the standalone health check: the initialised model, no data, no training
        comm_watch(1);
        bool ok = health_check(health_options(args), info.health, &comm, model, store);
        comm_watch(0);
        if (!ok) comm_agreed_failure();   // every rank reached the same verdict: all exit 1 together
        return ok ? 0 : EXIT_RUNTIME;
    }
    DataLoader train, val;
    bool have_val = open_datasets(args, cfg, comm, &train, &val);
    bool do_val = have_val && args.val_every > 0;
    McSet mc;   // --eval-mc: the multiple-choice set, on every rank (each scores its share of the examples)
    bool do_mc = !args.eval_mc.empty();
    if (do_mc) {
        mc_load(&mc, args.eval_mc.c_str(), "--eval-mc", cfg.vocab_size);
        int64_t cut = 0, busiest = 0;
        for (const McExample& e : mc.ex)
            for (const McSpan& c : e.endings) cut += e.ctx.len + c.len > args.seq + 1;
        for (int q = 0; q < comm.world; q++) {
            int64_t rows = 0;
            for (size_t i = q; i < mc.ex.size(); i += comm.world) rows += (int64_t)mc.ex[i].endings.size();
            busiest = std::max(busiest, rows);
        }
        if (comm.rank == 0) {
            printf("eval-mc: %s: %zu examples, %d", args.eval_mc.c_str(), mc.ex.size(), mc.min_completions);
            if (mc.max_completions != mc.min_completions) printf("-%d", mc.max_completions);
            printf(" completions (version %d, uint%d tokens): %lld rows, %lld forward passes of %d x %d per rank per evaluation, "
                   "%s\n", mc.version, mc.version == 1 ? 16 : 32, (long long)mc.rows, (long long)((busiest + args.batch - 1) / args.batch),
                   args.batch, args.seq, args.eval_every > 0 ? ("every " + std::to_string(args.eval_every) + " steps and at the end").c_str()
                   : "at the end");
            if (cut) printf("eval-mc: %lld of %lld rows are longer than --seq %d + 1 tokens: their context is cut from the left\n",
                            (long long)cut, (long long)mc.rows, args.seq);
        }
    }

    // ---- checkpoints and Hugging Face import (checkpoint/): where training starts from
    AdamWConfig opt = {args.lr, args.beta1, args.beta2, args.adam_eps, args.weight_decay, args.grad_clip};
    Checkpointer ck;
    ckpt_init(&ck, args.ckpt_dir, args.ckpt_every, args.ckpt_keep, args.ckpt_keep_every);
    ckpt_check_dir(&ck, zl, args.resume == "auto", &comm);   // before anything is trained: a directory that cannot take a save
    RunInfo run = {args.steps, args.warmup, args.seed, args.batch, args.seq, args.grad_accum, args.lr, args.lr_floor, opt};
    TrainProgress prog;
    prog.rng.state = (uint64_t)args.seed ^ 0x7261696E5F646278ull;
    if (!args.init_hf.empty()) {
        hf_import(args.init_hf, zl, &cfg, model->table, &comm);
        zero_from_host(store);
        if (comm.rank == 0) printf("init: weights from the Hugging Face export %s\n", args.init_hf.c_str());
    }
    SpikeGuard guard;
    spike_guard_init(&guard, args.spike_loss_sigma, args.spike_gnorm_factor, args.spike_window, args.max_skips);
    ck.confirm = args.ckpt_confirm > 0 ? args.ckpt_confirm : args.ckpt_every > 0 ? args.ckpt_every : 1;
    bool resumed = false;
    if (!args.resume.empty()) {
        JsonValue man;
        std::string from;
        if (ckpt_resume(&ck, args.resume, zl, &cfg, &prog, &man, &from, &comm)) {
            zero_from_host(store);
            std::string err;
            if (!ckpt_loader_state_restore(&train, prog.loader, &err))
                fail(EXIT_BAD_INPUT, "%s/manifest.json: the data loader state %s", from.c_str(), err.c_str());
            if (!prog.guard.empty() && !(err = spike_guard_restore(&guard, prog.guard)).empty())
                fail(EXIT_BAD_INPUT, "%s/manifest.json: %s", from.c_str(), err.c_str());
            ckpt_warn_changes(&man, &run, comm.world, comm.rank);
            ck.last_saved_step = prog.step;
            ck.confirmed_step = prog.step;   // what a run resumes from counts as good
            resumed = true;
            if (comm.rank == 0) printf("resume: %s (step %d, %lld tokens seen); continuing at step %d of %d\n", from.c_str(),
                                       prog.step, (long long)prog.tokens, prog.step + 1, args.steps);
        }
    }

    // the health check, on the weights training starts from: every rank stops (exit 1) if any rank fails it
    if (args.health_check) {
        comm_watch(1);
        bool ok = health_check(health_options(args), info.health, &comm, model, store);
        comm_watch(0);
        if (!ok) {
            if (comm.rank == 0) { printf("health: FAILED: not training\n"); fflush(stdout); }
            comm_agreed_failure();   // every rank reached the same verdict: all exit 1 together
            ckpt_free(&ck);
            dataloader_free(&train);
            if (have_val) dataloader_free(&val);
            return EXIT_RUNTIME;
        }
    }

    int64_t tokens_per_step = (int64_t)args.batch * args.seq * args.grad_accum * comm.world;
    double fpt = flops_per_token(&cfg, args.seq), fpt_foundry = flops_per_token_foundry(&cfg, args.seq), peak = info.peak;
    FILE *logf = NULL, *mc_dump = NULL;
    if (comm.rank == 0) {
        printf("batch: %d x %d tokens x %d accum x %d ranks = %lld tokens/step; %d steps; lr %g warmup %d cosine to %g x\n",
               args.batch, args.seq, args.grad_accum, comm.world, (long long)tokens_per_step, args.steps, args.lr,
               args.warmup, args.lr_floor);
        printf("mfu: %.4g FLOPs/token = " FLOPS_PER_TOKEN_FORMULA ", against a peak of %.3f TFLOP/s (%s%s); the log's mfu_foundry: "
               "%.4g FLOPs/token = " FLOPS_PER_TOKEN_FOUNDRY_FORMULA "\n", fpt, peak / 1e12, comm.world > 1 ? "all ranks: " : "",
               info.peak_how.c_str(), fpt_foundry);
        printf("%s (%s, shard group %d, %d replica(s))\n", info.memory_line.c_str(),
               zl->S == 1 ? (comm.world == 1 ? "one process" : "data parallel") : zl->R == 1 ? "ZeRO-3" : "HSDP", zl->S, zl->R);
        if (args.comm_timeout > 0) printf("comm: --comm-timeout %g s\n", args.comm_timeout);
        else printf("comm: --comm-timeout auto: %d s until step 1 is done and around checkpoints, %d s otherwise\n", COMM_TIMEOUT_LONG,
                    COMM_TIMEOUT_STEADY);
        if (!args.log.empty()) logf = fopenCheck(args.log.c_str(), resumed ? "a" : "w");   // a resumed run appends
        if (!args.eval_mc_dump.empty()) mc_dump = fopenCheck(args.eval_mc_dump.c_str(), resumed ? "a" : "w");
        fflush(stdout);
    }

    // test hook: DBRX_DEBUG_KILL="R:S" makes rank R SIGKILL itself in the middle of step S ("R:S:stop":
    // SIGSTOP, a rank that hangs)
    int kill_rank = -1, kill_step = -1, kill_sig = SIGKILL;
    if (const char* k = getenv("DBRX_DEBUG_KILL")) {
        if (sscanf(k, "%d:%d", &kill_rank, &kill_step) != 2) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_KILL '%s' is not R:S[:stop]", k);
        if (strstr(k, ":stop")) kill_sig = SIGSTOP;
    }
    // test hook: DBRX_DEBUG_SPIKE="S:F" multiplies the gradients of step S by F (a spike, or nan); "S+:F" of
    // every step from S on
    int spike_step = -1;
    bool spike_on = false;
    float spike_factor = 1;
    if (const char* k = getenv("DBRX_DEBUG_SPIKE")) {
        char* end = NULL;
        spike_step = (int)strtol(k, &end, 10);
        spike_on = *end == '+';
        if (spike_on) end++;
        if (*end != ':' || spike_step < 1) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_SPIKE '%s' is not STEP[+]:FACTOR", k);
        spike_factor = strtof(end + 1, NULL);
    }
    // test hook: DBRX_DEBUG_SLOW_RANK="R:MS" makes rank R sleep MS ms in every step (a straggler)
    int slow_rank = -1, slow_ms = 0;
    if (const char* k = getenv("DBRX_DEBUG_SLOW_RANK"))
        if (sscanf(k, "%d:%d", &slow_rank, &slow_ms) != 2) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_SLOW_RANK '%s' is not R:MS", k);
    // stragglers: each rank's busy time per step (the step less its time blocked in collectives), gathered;
    // a rank above 1.2 x the median in 8 of the last 10 steps is named (parallel/README.md)
    std::vector<double> busy_all(comm.world);
    std::vector<std::deque<char>> slow_hist(comm.world);
    int straggler_said = -100;
    auto long_timeout = [&](bool on) {   // --comm-timeout auto: generous around checkpoint saves
        if (args.comm_timeout == 0) comm_set_timeout(on ? COMM_TIMEOUT_LONG : COMM_TIMEOUT_STEADY);
    };
    std::vector<int> saved_steps = {prog.step};   // candidates for confirmation (checkpoint/ckpt.h)
    double time_steps = 0, first_dt = 0;           // for the time left
    int last_skipped = 0;
    std::vector<Fp8MetaRef> fp8_metas = dbrx_fp8_metas(model);   // every FP8 operand's state (empty: FP8 off)
    uint64_t step_bytes_total = 0;
    int steps_done = 0;
    bool stopped = false;
    auto report_save = [&](const SaveReport& r) {   // rank 0: one line, and one JSONL object
        if (comm.rank != 0 || r.step < 0) return;
        if (r.ok) printf("ckpt: step %d -> %s: blocked %.2f ms (shard copied to host memory), written in the background in %.1f ms, "
                         "%.1f MiB, %.1f ms from start to commit\n", r.step, r.path.c_str(), r.blocked_ms, r.write_ms,
                         r.bytes / 1048576.0, r.total_ms);
        if (logf) { fprintf(logf, "{\"ckpt_step\": %d, \"ok\": %s, \"blocked_ms\": %.3f, \"write_ms\": %.3f, \"total_ms\": %.3f, "
                            "\"bytes\": %llu}\n", r.step, r.ok ? "true" : "false", r.blocked_ms, r.write_ms, r.total_ms,
                            (unsigned long long)r.bytes); fflush(logf); }
        fflush(stdout);
    };
    // this rank's shard to host memory, then written in the background; never a non-finite state (false)
    auto start_save = [&](SaveReport* prev) {
        comm_phase("checkpoint save of step %d", prog.step);
        prog.loader = ckpt_loader_state_save(&train);
        prog.guard = spike_guard_json(&guard);
        zero_to_host(store);
        if (!zero_host_state_finite(zl)) {
            if (comm.rank == 0) fprintf(stderr, "warning: step %d: the weights or AdamW moments are not finite: not saved\n", prog.step);
            return false;
        }
        ckpt_start_save(&ck, zl, &cfg, &prog, &run, &comm, prev);
        saved_steps.push_back(prog.step);
        return true;
    };
    auto run_mc = [&](int at) {   // --eval-mc: one line, and one JSONL object
        comm_phase("multiple-choice evaluation");
        double t_mc = now_seconds();
        McResult r = evaluate_mc(model, store, &mc, args.batch, args.seq, &comm, mc_dump, at);
        if (comm.rank != 0) return;
        printf("mc   %5d | acc %.4f | acc_norm %.4f | %d examples | %.1f s\n", at, r.acc, r.acc_norm, r.n, now_seconds() - t_mc);
        if (logf) { fprintf(logf, "{\"step\": %d, \"mc_acc\": %.6f, \"mc_acc_norm\": %.6f, \"mc_n\": %d}\n", at, r.acc, r.acc_norm, r.n);
                    fflush(logf); }
        fflush(stdout);
    };
    std::vector<double> expert_counts;   // --log-every-experts: (L, E) tokens per expert of the step
    bool guard_stop = false;
    for (int step = prog.step; step < args.steps; step++) {
        if (args.stop_after >= 0 && steps_done >= args.stop_after) {
            if (comm.rank == 0) printf("stop: --stop-after %d reached at step %d of %d\n", args.stop_after, step, args.steps);
            stopped = true;
            break;
        }
        comm_watch(1);   // the step watchdog (parallel/comm.h) is armed while the step talks to the GPU
        comm_phase_prefix("step %d", step + 1);   // the heartbeat: where this rank is (parallel/comm.h)
        // (before validation: the evaluation drops its FP8 amaxes, and validation's are kept, as without it)
        if (do_mc && args.eval_every > 0 && step % args.eval_every == 0) run_mc(step);
        if (do_val && step % args.val_every == 0) {
            comm_phase("validation");
            double vl = evaluate(model, &val, args.val_steps, &comm);
            if (comm.rank == 0) {
                printf("val  %5d | val_loss %.6f\n", step, vl);
                if (logf) { fprintf(logf, "{\"step\": %d, \"val_loss\": %s}\n", step, json_number_or_null(vl, "%.6f").c_str()); fflush(logf); }
            }
        }
        dbrx_sync(model);
        double t0 = now_seconds(), wait0 = g_comm_wait_s;
        uint64_t bytes0 = zero_bytes_sent(store);
        zero_zero_grad(store);
        double metrics[5] = {0, 0, 0, 0, 0};   // ce, lbl, z, imbalance, stop requested (summed over ranks)
        double ep_recv = 0;                    // EP: the most rows this rank's experts took in one layer
        bool log_experts = args.log_every_experts > 0 && (step + 1) % args.log_every_experts == 0;
        expert_counts.assign(log_experts ? (size_t)cfg.n_layers * cfg.n_experts : 0, 0.0);
        float dloss = 1.0f / args.grad_accum;
        for (int micro = 0; micro < args.grad_accum; micro++) {
            comm_phase("data, micro-batch %d", micro);
            dataloader_next(&train);
            comm_heartbeat();
            comm_phase("forward, micro-batch %d", micro);
            dbrx_forward(model, train.inputs.data(), train.targets.data(), dloss);
            if (log_experts) dbrx_expert_counts_add(model, &expert_counts);
            if (comm.rank == kill_rank && step + 1 == kill_step) raise(kill_sig);
            if (comm.rank == slow_rank) usleep(slow_ms * 1000);
            comm_phase("backward, micro-batch %d", micro);
            dbrx_backward(model, train.inputs.data(), train.targets.data(), dloss);
            metrics[0] += model->ce_loss / args.grad_accum;
            metrics[1] += model->lbl_loss / args.grad_accum;
            metrics[2] += model->z_loss / args.grad_accum;
            metrics[3] += model->imbalance / args.grad_accum;
            ep_recv = std::max(ep_recv, (double)dbrx_ep_recv_rows(model));
        }
        // gradients: reduce-scattered per unit during backward (S > 1); now summed across replicas, / W
        comm_phase("gradient reduction");
        zero_reduce_grads(store);
        metrics[4] = g_comm_stop_signal ? 1 : 0;
        if (comm.world > 1) {   // metrics averaged over the ranks; a stop request anywhere stops all
            comm_all_reduce(&comm.world_group, metrics, 5, COMM_F64);
            for (int i = 0; i < 4; i++) metrics[i] /= comm.world;
        }
        if (log_experts) {   // tokens per expert and layer, over the step's micro-batches and all ranks
            if (comm.world > 1) comm_all_reduce(&comm.world_group, expert_counts.data(), expert_counts.size(), COMM_F64);
            if (logf) {
                fprintf(logf, "{\"step\": %d, \"expert_counts\": [", step + 1);
                for (int l = 0; l < cfg.n_layers; l++) {
                    fprintf(logf, "%s[", l ? ", " : "");
                    for (int e = 0; e < cfg.n_experts; e++) fprintf(logf, "%s%.0f", e ? ", " : "", expert_counts[(size_t)l * cfg.n_experts + e]);
                    fprintf(logf, "]");
                }
                fprintf(logf, "]}\n");
            }
        }
        if (!fp8_metas.empty()) {
            // the amax of a tensor is the max over every rank that holds a piece of it (the store reduces
            // them: on the host over MPI, or on the device over NCCL)
            bool log_fp8 = logf && args.fp8_log_every > 0 && (step + 1) % args.fp8_log_every == 0;
            std::vector<float> amax_local;
            zero_fp8_amax_reduce(store, fp8_metas, log_fp8 ? &amax_local : NULL);
            if (log_fp8) {
                fprintf(logf, "{\"step\": %d, \"fp8\": {", step + 1);
                for (size_t i = 0; i < fp8_metas.size(); i++) {
                    const Fp8Meta* mt = fp8_metas[i].meta;
                    fprintf(logf, "%s\"%s\": {\"amax\": %.6g, \"amax_rank0\": %.6g, \"scale\": %.6g, \"saturated\": %lld}",
                            i ? ", " : "", fp8_metas[i].name.c_str(), mt->amax, amax_local[i], dbrx_fp8_log_scale(model, fp8_metas[i], (int)i),
                            mt->saturated);
                }
                fprintf(logf, "}}\n");
            }
        }
        // the spike guard, before the update: a non-finite or spiking step is skipped (no update; the
        // data moves on), its FP8 amaxes dropped
        if (spike_step > 0 && (step + 1 == spike_step || (spike_on && step + 1 > spike_step))) zero_scale_grads(store, spike_factor);
        float lr = lr_schedule(step, args.steps, args.lr, args.warmup, args.lr_floor);
        comm_phase("gradient norm and optimizer");
        double gnorm = zero_grad_norm(store);
        std::string skip_why = spike_guard_check(&guard, metrics[0], metrics[1] + metrics[2], gnorm);
        if (skip_why.empty()) zero_update(store, &opt, lr, step + 1, gnorm);
        else zero_skip_update(store);
        dbrx_sync(model);
        comm_watch(0);
        double dt = now_seconds() - t0, busy = dt - (g_comm_wait_s - wait0);
        if (comm.world > 1) {   // every rank's busy time, and the stragglers among them
            comm_all_gather(&comm.world_group, &busy, busy_all.data(), 1, COMM_F64);
            std::vector<double> sorted = busy_all;
            std::nth_element(sorted.begin(), sorted.begin() + comm.world / 2, sorted.end());
            double med = sorted[comm.world / 2];
            for (int r = 0; r < comm.world; r++) {
                slow_hist[r].push_back(busy_all[r] > 1.2 * med && busy_all[r] - med > 1e-3);
                if (slow_hist[r].size() > 10) slow_hist[r].pop_front();
                int n_slow = 0;
                for (char x : slow_hist[r]) n_slow += x;
                if (comm.rank == 0 && n_slow >= 8 && step + 1 - straggler_said >= 10) {
                    printf("straggler: rank %d was busy %.1f ms against a median of %.1f ms, slower than 1.2 x the median in %d of the "
                           "last 10 steps\n", r, busy_all[r] * 1000, med * 1000, n_slow);
                    if (logf) fprintf(logf, "{\"step\": %d, \"straggler\": %d, \"busy_ms\": %.3f, \"median_busy_ms\": %.3f}\n", step + 1, r,
                                      busy_all[r] * 1000, med * 1000);
                    straggler_said = step + 1;
                }
            }
        }
        uint64_t step_bytes = zero_bytes_sent(store) - bytes0;
        step_bytes_total += step_bytes;
        steps_done++;
        double tok_s = tokens_per_step / dt, mfu = peak > 0 ? fpt * tok_s / peak : 0.0;
        // the time left: the mean step time of this invocation so far (the first step, with its set-up, left out
        // once there are others) times the steps to go
        time_steps += dt;
        if (steps_done == 2) time_steps -= first_dt;
        if (steps_done == 1) first_dt = dt;
        double eta = (steps_done > 1 ? time_steps / (steps_done - 1) : dt) * (args.steps - step - 1);
        double ep_max = -1, ep_mean = -1;
        if (zl->ep_n > 1) {   // rows received per rank, max and mean over the ranks
            std::vector<double> all(comm.world);
            comm_all_gather(&comm.world_group, &ep_recv, all.data(), 1, COMM_F64);
            ep_max = *std::max_element(all.begin(), all.end());
            ep_mean = 0;
            for (double x : all) ep_mean += x / comm.world;
        }
        StepReport rep = {step + 1, args.steps, metrics, gnorm, lr, dt, tok_s, mfu, peak > 0 ? fpt_foundry * tok_s / peak : 0.0,
                          (long long)step_bytes, comm.world > 1 ? &busy_all : NULL, prog.tokens + tokens_per_step, eta, ep_max, ep_mean};
        if (comm.rank == 0) report_step(logf, rep);
        bool skipped = !skip_why.empty();
        guard_stop = spike_guard_record(&guard, step + 1, skipped, metrics[0], gnorm);
        if (skipped) {
            last_skipped = step + 1;
            if (comm.rank == 0) {
                printf("guard: step %d skipped (%s): no update, the data moves on; %zu of the last %d steps skipped\n", step + 1,
                       skip_why.c_str(), guard.skipped.size(), guard.window);
                if (logf) { fprintf(logf, "{\"step\": %d, \"skipped\": true, \"reason\": %s}\n", step + 1, json_quote(skip_why).c_str());
                            fflush(logf); }
                fflush(stdout);
            }
        }
        prog.step = step + 1;
        prog.tokens += tokens_per_step;
        if (args.sample_every > 0 && prog.step % args.sample_every == 0) {   // (collective; the step's numbers are out)
            comm_watch(1);
            sample_during_training(args, model, &comm, prog.step, logf);
            comm_watch(0);
        }
        // the newest checkpoint the run has now trained ck.confirm steps past without a skipped step is known good
        int confirmed = ck.confirmed_step;
        for (int s : saved_steps) if (s > confirmed && s + ck.confirm <= prog.step && last_skipped <= s) confirmed = s;
        if (confirmed != ck.confirmed_step) {
            ck.confirmed_step = confirmed;
            if (comm.rank == 0 && !ck.dir.empty()) ckpt_retain(&ck);
        }
        if (guard_stop) {
            if (comm.rank == 0) fprintf(stderr, "error: the spike guard skipped %zu of the last %d steps (the last, step %d: %s); stopping "
                                        "without saving\n", guard.skipped.size(), guard.window, step + 1, skip_why.c_str());
            break;
        }
        if (ck.pending) report_save(ckpt_poll(&ck, zl, &comm, false));
        bool last = prog.step == args.steps || metrics[4] > 0 || (args.stop_after >= 0 && steps_done >= args.stop_after);
        if (ck.every > 0 && prog.step % ck.every == 0 && !last) {   // (the last step is saved on the way out)
            SaveReport prev = {false, -1, 0, 0, 0, 0, ""};
            long_timeout(true);
            if (start_save(&prev)) report_save(prev);
        }
        long_timeout(false);   // (auto: from the end of the first step on, the steady timeout)
        if (metrics[4] > 0) {
            if (comm.rank == 0) printf("stop requested (signal): stopping after step %d\n", step + 1);
            stopped = true;
            break;
        }
    }
    // the final validation, before the save: weights whose validation loss is not finite are not saved
    bool diverged = false;
    comm_phase_prefix("after step %d", prog.step);
    if (do_val && !stopped && !guard_stop && steps_done > 0) {
        comm_phase("validation");
        comm_watch(1);
        double vl = evaluate(model, &val, args.val_steps, &comm);
        comm_watch(0);
        if (comm.rank == 0) {
            printf("val  %5d | val_loss %.6f\n", args.steps, vl);
            if (logf) fprintf(logf, "{\"step\": %d, \"val_loss\": %s}\n", args.steps, json_number_or_null(vl, "%.6f").c_str());
        }
        diverged = !std::isfinite(vl);
    }
    if (do_mc && !stopped && !guard_stop && steps_done > 0) {
        comm_watch(1);
        run_mc(prog.step);
        comm_watch(0);
    }
    // on the way out (the end, --stop-after, a signal): a checkpoint of where we are, waited for. After the
    // spike guard stopped the run: nothing saved, and the checkpoints not known good set aside
    bool save_failed = false;
    long_timeout(true);   // (auto: the rest is checkpoints, export and the like)
    if (!ck.dir.empty()) {
        if (ck.pending) report_save(ckpt_wait_commit(&ck, zl, &comm));
        if (guard_stop) {
            if (comm.rank == 0) {
                std::string good = ckpt_set_aside_unconfirmed(&ck);
                fprintf(stderr, "error: %s; resume with --resume auto (after lowering --lr, or with other data), or a set-aside "
                        "checkpoint with --resume DIR\n", good.c_str());
            }
        } else if (diverged) {
            if (comm.rank == 0) fprintf(stderr, "warning: step %d: the validation loss is not finite: not saved\n", prog.step);
        } else if (ck.last_saved_step != prog.step) {
            SaveReport prev = {false, -1, 0, 0, 0, 0, ""};
            SaveReport r = prev;
            if (start_save(&prev)) r = ckpt_wait_commit(&ck, zl, &comm);
            report_save(r);
            save_failed = !r.ok;
        }
    }
    if (guard_stop) {
        ckpt_free(&ck);
        if (logf) fcloseCheck(logf, args.log.c_str());
        comm_agreed_failure();   // every rank took the same decision: all exit 1 together
        return EXIT_RUNTIME;
    }
    if (zl->ep_n > 1) {   // the expert-parallel exchange of this rank, for the byte formula (parallel/README.md)
        long long out = 0, in = 0, counts = 0;
        dbrx_ep_totals(model, &out, &in, &counts);
        printf("ep: rank %d sent %llu bytes in its expert-parallel group: %lld count messages, %lld rows out, %lld rows in\n", comm.rank,
               (unsigned long long)comm_bytes_sent(&zl->ep), counts, out, in);
        fflush(stdout);
    }
    if (comm.world > 1) {   // what each rank sent, for the communication-volume check (parallel/README.md)
        printf("comm: rank %d sent %llu bytes in %d training steps (%.1f bytes/step)\n", comm.rank,
               (unsigned long long)step_bytes_total, steps_done, steps_done ? (double)step_bytes_total / steps_done : 0.0);
        fflush(stdout);
    }
    comm_watch(1);   // the logits dump talks to the GPU too
    if (!args.export_hf.empty()) {
        comm_watch(0);
        zero_to_host(store);
        if (!zero_host_state_finite(zl)) {
            if (comm.rank == 0) fprintf(stderr, "error: --export-hf %s: the weights are not finite: not exported\n", args.export_hf.c_str());
            return EXIT_RUNTIME;
        }
        hf_export(args.export_hf, zl, &cfg, model->table, args.export_dtype, (uint64_t)(args.export_max_file_gb * 1e9), &comm);
        if (comm.rank == 0) printf("export: %s (%s, DbrxForCausalLM)\n", args.export_hf.c_str(), args.export_dtype.c_str());
    }
    if (!args.dump_logits.empty()) {   // logits of the first validation batch, for dev/hf_logits.py
        dataloader_reset(&val);
        dataloader_next(&val);
        dbrx_forward(model, val.inputs.data(), val.targets.data(), 0.0f);
        if (comm.rank == 0) {
            std::vector<float> logits;
            dbrx_logits_to_host(model, &logits);
            st_write_host(args.dump_logits, {{"inputs", "I32", {args.batch, args.seq}, val.inputs.data()},
                                             {"targets", "I32", {args.batch, args.seq}, val.targets.data()},
                                             {"logits", "F32", {args.batch, args.seq, cfg.vocab_size}, logits.data()}});
            printf("dump: inputs and logits of the first validation batch -> %s\n", args.dump_logits.c_str());
        }
    }
    comm_watch(0);
    if (logf) fcloseCheck(logf, args.log.c_str());
    if (mc_dump) fcloseCheck(mc_dump, args.eval_mc_dump.c_str());
    ckpt_free(&ck);
    dataloader_free(&train);
    if (have_val) dataloader_free(&val);
    if (save_failed) { fprintf(stderr, "error: the last checkpoint could not be saved (see the warnings above)\n"); return EXIT_RUNTIME; }
    if (diverged) {
        comm_agreed_failure();   // every rank saw the same validation loss
        if (comm.rank == 0) fprintf(stderr, "error: the final validation loss is not finite: the weights diverged%s\n",
                                    ck.dir.empty() ? "" : " (not saved)");
        return EXIT_RUNTIME;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// --generate: load the weights (a checkpoint, or a Hugging Face export), write the continuation of the
// prompt to stdout, exit. Both backends, any number of ranks (collective: the store gathers the units).

static FILE* g_generate_out = NULL;   // the process's stdout; everything else goes to stderr in --generate

template <typename Model, typename Store>
static int generate_run(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, Model* model, Store* store) {
    Zero* zl = zero_layout(store);
    if (!args.init_hf.empty()) {
        hf_import(args.init_hf, zl, &cfg, model->table, &comm);
        zero_from_host(store);
        if (comm.rank == 0) printf("init: weights from the Hugging Face export %s\n", args.init_hf.c_str());
    } else {
        Checkpointer ck;
        ckpt_init(&ck, args.ckpt_dir, 0, 1, 0);
        TrainProgress prog;
        JsonValue man;
        std::string from;
        if (!ckpt_resume(&ck, args.resume, zl, &cfg, &prog, &man, &from, &comm)) {   // (auto, and none there)
            comm_agreed_failure();
            if (comm.rank == 0) fail(EXIT_BAD_INPUT, "--generate --resume auto: no checkpoint in --ckpt-dir %s", args.ckpt_dir.c_str());
            exit(EXIT_BAD_INPUT);
        }
        zero_from_host(store);
        ckpt_free(&ck);
        if (comm.rank == 0) printf("resume: weights from %s (step %d)\n", from.c_str(), prog.step);
    }
    if (comm.rank == 0) {
        printf("generate: %zu prompt tokens (the end-of-text token first), at most %d new, temperature %g%s, %s tokenizer\n",
               args.prompt_ids.size(), args.sample_len, args.temperature,
               args.sample_top_k > 0 ? (", top-" + std::to_string(args.sample_top_k)).c_str() : "",
               args.tok->kind == TOKENIZER_BYTES ? "bytes" : "cl100k");
        fflush(stdout);
    }
    comm_watch(1);
    double t0 = now_seconds();
    std::vector<int> ids = generate_tokens(model, args.tok, args.prompt_ids, args.sample_len, args.temperature, args.sample_top_k,
                                           sample_seed(args, 0), &comm);
    double dt = now_seconds() - t0;
    comm_watch(0);
    if (comm.rank == 0) {
        std::string text = args.prompt + tokenizer_decode(args.tok, ids) + "\n";
        fwriteCheck(text.data(), 1, text.size(), g_generate_out, "the generated text");
        if (fflush(g_generate_out) != 0) fail(EXIT_RUNTIME, "writing the generated text to stdout: %s", strerror(errno));
        printf("generate: %zu tokens in %.2f s (%zu positions through the KV cache, %.1f per second)\n", ids.size(), dt,
               args.prompt_ids.size() + ids.size(), (args.prompt_ids.size() + ids.size()) / (dt > 0 ? dt : 1e-9));
        fflush(stdout);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// the CPU backend's set-up: OpenMP threads per rank, the model, the store over MPI, FP8

// expert parallelism's statistics, the CPU model's (the GPU model has its own: train_cuda.cuh)
static inline int dbrx_ep_recv_rows(const Dbrx* m) { return m->ep_recv_max; }
static inline void dbrx_ep_totals(const Dbrx* m, long long* out, long long* in, long long* counts) {
    *out = m->ep_rows_out; *in = m->ep_rows_in; *counts = m->ep_count_sends;
}

// the CPU model's answers to the loop's calls that only the GPU model needs to do work for
static inline void dbrx_sync(Dbrx* m) { (void)m; }
static inline float dbrx_fp8_log_scale(Dbrx* m, const Fp8MetaRef& r, int i) { (void)m; (void)i; return r.meta->scale; }
static inline void dbrx_logits_to_host(Dbrx* m, std::vector<float>* out) {
    out->assign(m->logits, m->logits + (size_t)m->B * m->T * m->cfg.vocab_size);
}
// the per-token cross-entropy of the last forward (B * T)
static inline void dbrx_losses_to_host(Dbrx* m, std::vector<float>* out) { out->assign(m->losses, m->losses + (size_t)m->B * m->T); }
// acc (L * E) += each layer's tokens per expert in the last forward (top-k assignments: k per token)
static inline void dbrx_expert_counts_add(Dbrx* m, std::vector<double>* acc) {
    int E = m->cfg.n_experts;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < E; e++) (*acc)[(size_t)l * E + e] += m->acts[l].counts[e];
}

static int train_cpu(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, const char* why) {
    // ranks on one node share its cores: unless OMP_NUM_THREADS says otherwise, each rank gets its share
    int threads = omp_get_max_threads();
    if (!getenv("OMP_NUM_THREADS") && comm.local_size > 1) {
        threads = omp_get_num_procs() / comm.local_size;
        if (threads < 1) threads = 1;
        omp_set_num_threads(threads);
    }
    if (comm.rank == 0) {
        printf("device: cpu%s, %d OpenMP thread(s) per rank, %d rank(s)\n", why, threads, comm.world);
        print_config(args.model.c_str(), &cfg);
    }
    host_memory_check(args, cfg, comm);
    Dbrx model;
    dbrx_build_shape(&model, &cfg, args.batch, args.seq);
    Zero zero;   // owns the parameters, gradients and moments: this rank's shard (all of them when S = 1)
    zero_init(&zero, &model, &comm, args.shard_group_size, (uint64_t)args.seed, args.expert_parallel);
    printf("zero: rank %d: rank %d of %d in shard group %d, replica %d of %d; master+grads+moments %lld bytes allocated, "
           "%lld bytes measured (resident growth); working buffers %lld bytes\n", comm.rank, zero.shard.rank, zero.S,
           comm.rank / zero.S, zero.replica.rank, zero.R, (long long)zero.state_bytes, zero.state_rss, (long long)zero.work_bytes);
    fflush(stdout);
    Fp8Config fp8 = {fp8_recipe_parse(args.fp8.c_str()), args.fp8_history, args.fp8_margin, 0};
    dbrx_enable_fp8(&model, &fp8);
    zero.fp8_cfg = &model.fp8;   // the FP8 scaling state that checkpoints carry
    zero.fp8_metas = dbrx_fp8_metas(&model);
    if (args.fp8_gather) {
        if (zero_enable_fp8_gather(&zero))
            printf("zero: rank %d: --fp8-gather: block weights gathered as E4M3 codes, %lld bytes of send/receive buffers\n",
                   comm.rank, (long long)(zero.fp8.send.size() + zero.fp8.recv.size()));
        else if (comm.rank == 0)
            printf("note: --fp8-gather has no effect with --shard-group-size 1: every rank holds its units whole (with --expert-parallel, "
                   "its experts), nothing is gathered\n");
    }
    BackendInfo info;
    std::string rank_peak_how;
    double rank_peak = cpu_peak_flops(threads, &rank_peak_how);   // one rank's
    info.peak_how = args.peak_tflops > 0 ? "--peak-tflops" : rank_peak_how;
    info.peak = args.peak_tflops > 0 ? args.peak_tflops * 1e12 : comm.world * rank_peak;
    // the health check's GEMM: the CPU GEMM the model uses, fp32, on this rank's threads; its floor is 5% of
    // the FP32 peak (OpenBLAS reaches most of it on a quiet core; ranks sharing cores get their share)
    info.health = {"fp32 gemm_cpu (OpenBLAS, " + std::to_string(threads) + " thread(s))", health_gemm_cpu, 512, rank_peak, 0.05,
                   rank_peak_how, 0};
    char line[256];
    snprintf(line, sizeof line, "activations %.1f MiB, parameters+grads+moments %.1f MiB per rank", model.activation_bytes / 1048576.0,
             zero.state_bytes / 1048576.0);
    info.memory_line = line;
    int rc = args.generate ? generate_run(args, cfg, comm, &model, &zero) : train(args, cfg, comm, &model, &zero, info);
    zero_free(&zero);
    dbrx_free(&model);
    return rc;
}

// --- CUDA backend (nvcc, or the emulator for train_dbrx_emu: model/platform.h): its device set-up ---
#if DBRX_HAVE_CUDA
#define HAVE_CUDA_BACKEND 1
#include "train_cuda.cuh"
#else
#define HAVE_CUDA_BACKEND 0
#endif
// ---------------------------------------------------------------------------------------------

// --generate: the model is the checkpoint's (its manifest) or the export's (config.json) unless --model
// names a preset; the shape flags given apply over it (a load that does not match them exits 2). No
// training activations (batch 1 x 1), no FP8 (generation's GEMMs are BF16/FP32). stdout gets the text
// alone: the rest of the output goes to stderr.
static void generate_setup(int argc, char** argv, TrainArgs* a, DbrxConfig* c) {
    fflush(stdout);
    int fd = dup(1);
    if (fd < 0 || dup2(2, 1) < 0 || !(g_generate_out = fdopen(fd, "w")))
        fail(EXIT_RUNTIME, "--generate: cannot set stdout aside for the text: %s", strerror(errno));
    bool model_given = false;
    for (int i = 1; i < argc; i++) model_given |= !strcmp(argv[i], "--model") || !strncmp(argv[i], "--model=", 8);
    // the config the weights come with; what cannot be loaded is said here, in one line, before anything is built
    DbrxConfig saved = *c;
    std::string from, err, text, perr;
    JsonValue j;
    const JsonValue* model_json = NULL;
    if (!a->init_hf.empty()) {
        from = a->init_hf + "/config.json";
        if (!(err = read_file(from, &text)).empty()) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", a->init_hf.c_str(), err.c_str());
        if (!json_parse(text.data(), text.size(), &j, &perr)) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", from.c_str(), perr.c_str());
        if ((err = hf_config_check(&j)).empty()) err = hf_config_read(&j, &saved);
        if (!err.empty()) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", from.c_str(), err.c_str());
        model_json = &j;
    } else {   // the checkpoint named, or (auto) the newest one whose manifest reads (the load verifies it all)
        std::vector<std::string> dirs;
        if (a->resume != "auto") {
            if (!path_exists(a->resume)) fail(EXIT_BAD_INPUT, "--resume %s: no such checkpoint directory", a->resume.c_str());
            dirs.push_back(a->resume);
        } else {
            for (auto& d : list_numbered_dirs(a->ckpt_dir, "step_")) dirs.push_back(a->ckpt_dir + "/" + d.second);
            if (dirs.empty()) fail(EXIT_BAD_INPUT, "--generate --resume auto: no checkpoint in --ckpt-dir %s", a->ckpt_dir.c_str());
        }
        for (const std::string& d : dirs) {
            if (!ckpt_read_manifest(d, &text, &j).empty()) continue;
            model_json = json_get(&j, "model");
            if (!(err = ckpt_config_read(model_json, &saved)).empty())
                fail(EXIT_BAD_INPUT, "--resume %s/manifest.json: %s", d.c_str(), err.c_str());
            from = d;
            break;
        }
    }
    if (model_json) {
        if (!model_given) {
            parse_args(argc, argv, a, c, &saved);
            a->model = "from " + from;   // (the banner names where the model came from)
        }
        std::string mism = a->init_hf.empty() ? ckpt_config_mismatch(model_json, c) : hf_config_mismatch(model_json, c);
        if (!mism.empty()) fail(EXIT_BAD_INPUT, "%s does not match the model of the flags: %s", from.c_str(), mism.c_str());
    }
    a->batch = a->seq = 1;
    if (a->fp8 != "off") {
        fprintf(stderr, "note: --generate: the GEMMs run in BF16 (cuda) / FP32 (cpu); --fp8 %s does not apply\n", a->fp8.c_str());
        a->fp8 = "off";
        a->fp8_gather = false;
    }
}

// The tokenizer and the prompt's ids when something is sampled (--sample-every, --generate): bad input
// (a vocabulary that does not hold the tokenizer's ids, no ranks file, a prompt too long) exits 2 here,
// before anything is built.
static void sampling_setup(TrainArgs* a, const DbrxConfig* c) {
    static Tokenizer tok;
    TokenizerKind kind = a->tokenizer == "bytes" ? TOKENIZER_BYTES : a->tokenizer == "cl100k" ? TOKENIZER_CL100K
                       : c->vocab_size >= CL100K_IDS ? TOKENIZER_CL100K : TOKENIZER_BYTES;
    const char* name = kind == TOKENIZER_BYTES ? "bytes" : "cl100k";
    int need = kind == TOKENIZER_BYTES ? BYTES_VOCAB : CL100K_IDS;
    if (c->vocab_size < need)
        fail(EXIT_BAD_INPUT, "--tokenizer %s%s needs a vocabulary of at least %d ids, the model has %d (--vocab)", name,
             a->tokenizer == "auto" ? " (auto)" : "", need, c->vocab_size);
    if (kind == TOKENIZER_CL100K && !path_exists(a->tokenizer_ranks))
        fail(EXIT_BAD_INPUT, "--tokenizer-ranks %s: no such file (dev/data/setup_tiktoken.sh writes it; --tokenizer bytes for a byte-level model)",
             a->tokenizer_ranks.c_str());
    tokenizer_init(&tok, kind, a->tokenizer_ranks.c_str(), c->vocab_size);
    a->prompt_ids = {tok.eot};   // every document of the shards starts with it (data/README.md)
    for (int id : tokenizer_encode(&tok, a->prompt)) a->prompt_ids.push_back(id);
    long long positions = (long long)a->prompt_ids.size() + a->sample_len;
    if (positions > c->max_seq_len)
        fail(EXIT_BAD_INPUT, "--sample-len %d: the prompt's %zu tokens (with the end-of-text token) and %d new ones need %lld positions, "
             "more than the model's max_seq_len %d (--max-seq)", a->sample_len, a->prompt_ids.size(), a->sample_len, positions,
             c->max_seq_len);
    a->tok = &tok;
}

static int run_main(int argc, char** argv) {
    debug_hooks_read();   // the tests' DBRX_DEBUG_* switches, once (model/debug_hooks.h)
    TrainArgs args;
    DbrxConfig cfg;
    parse_args(argc, argv, &args, &cfg);   // (validates the model too)
    if (args.generate) generate_setup(argc, argv, &args, &cfg);
    if (args.generate || args.sample_every > 0) sampling_setup(&args, &cfg);
    if (args.seq > cfg.max_seq_len) fail(EXIT_BAD_INPUT, "--seq %d is longer than the model's max_seq_len %d (--max-seq)", args.seq, cfg.max_seq_len);
    shape_validate(&cfg, args.batch, args.seq);

    if (args.dry_run) {   // (every number below is bounded by the checks above, and computed without walking the layers)
        int S = args.shard_group_size > 0 ? args.shard_group_size : 1, n = args.expert_parallel;
        if (n > 1 && (cfg.n_experts % n || (S > 1 && S % n)))
            fail(EXIT_BAD_INPUT, "--expert-parallel %d must divide the experts (%d) and, under ZeRO-3/HSDP, --shard-group-size %d",
                 n, cfg.n_experts, S);
        print_config(args.model.c_str(), &cfg);
        printf("training FLOPs per token (S = %d): %.4g = " FLOPS_PER_TOKEN_FORMULA ", the MFU count; %.4g = "
               FLOPS_PER_TOKEN_FOUNDRY_FORMULA ", %.0f%% more\n", args.seq, flops_per_token(&cfg, args.seq),
               flops_per_token_foundry(&cfg, args.seq), 100 * (flops_per_token_foundry(&cfg, args.seq) / flops_per_token(&cfg, args.seq) - 1));
        double act = (double)activation_bytes(&cfg, args.batch, args.seq);
        double p = (double)params_total(&cfg);
        // this rank's shard under S ranks (ZeRO-3/HSDP) and EP degree n, from the store's own layout (with its
        // padding; under data parallelism with EP: the non-expert units whole, 1/n of the experts)
        double shard = (double)per_layers(&cfg, [&](const DbrxConfig* x) {
            Zero lz;
            zero_unit_layout(&lz, x, dbrx_param_table(x), S, n);
            return lz.shard_total; });
        printf("memory per rank, shard group of %d rank(s)%s%s, micro-batch %d x %d:\n", S,
               args.shard_group_size > 0 ? "" : " (--shard-group-size S to see S ranks)",
               n > 1 ? (", expert parallel " + std::to_string(n)).c_str() : "", args.batch, args.seq);
        printf("  cpu  fp32: weights+grads+AdamW moments 16 B/param of this rank's shard (%s of %s params) = %.2f GiB, "
               "activations %.2f GiB, total %.2f GiB\n", with_commas((int64_t)shard).c_str(), with_commas((int64_t)p).c_str(),
               16 * shard / (1 << 30), act / (1 << 30), (16 * shard + act) / (1 << 30));
#if HAVE_CUDA_BACKEND
        Fp8Config fp8 = {fp8_recipe_parse(args.fp8.c_str()), args.fp8_history, args.fp8_margin, 0};
        double acts = (double)per_layers(&cfg, [&](const DbrxConfig* x) {
            return dbrx_gpu_memory_estimate(x, args.batch, args.seq, nullptr, &fp8, false); });
        double store = (double)per_layers(&cfg, [&](const DbrxConfig* x) { return zero_gpu_estimate_bytes(x, S, n); });
        printf("  cuda bf16: fp32 master+grads+moments + bf16 copy 18 B/param of the shard%s = %.2f GiB, activations and scratch%s %.2f GiB, "
               "total %.2f GiB\n", S > 1 ? " + two gathered bf16 units and two fp32 gradient units" : "", store / 1073741824.0,
               fp8.recipe != FP8_OFF ? " (with the FP8 operands)" : "", acts / 1073741824.0, (store + acts) / 1073741824.0);
#else
        printf("  cuda bf16: fp32 master+grads+moments + bf16 copy 18 B/param of the shard = %.2f GiB (+ gathered units when S > 1), activations (bf16) %.2f GiB\n",
               18 * shard / (1 << 30), act / 2 / (1 << 30));
#endif
        return 0;
    }

    // --- device: --device auto picks CUDA when the build has it and a GPU is visible, and says so
    int gpus = 0;
#if HAVE_CUDA_BACKEND
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) { (void)cudaGetLastError(); gpus = 0; }
#endif
    if (args.device == "cuda" && !HAVE_CUDA_BACKEND)
        fail(EXIT_BAD_INPUT, "--device cuda: this binary was built by g++ without CUDA (build it where nvcc is installed: make); use --device cpu");
    if (args.device == "cuda" && gpus == 0) fail(EXIT_BAD_INPUT, "--device cuda: no CUDA device is visible; use --device cpu");
    bool use_cuda = args.device == "cuda" || (args.device == "auto" && gpus > 0);

    Comm comm = comm_init(&argc, &argv);
    comm_set_timeout(args.comm_timeout > 0 ? args.comm_timeout : COMM_TIMEOUT_LONG);   // (auto: generous until step 1 is done)
    const char* why = args.device == "auto" ? (gpus ? " (auto: a GPU is visible)" : HAVE_CUDA_BACKEND ? " (auto: no GPU)" : " (auto: built without CUDA)") : "";
    int rc;
#if HAVE_CUDA_BACKEND
    if (use_cuda) rc = train_cuda(args, cfg, comm, why);
    else
#else
    (void)use_cuda;
#endif
    rc = train_cpu(args, cfg, comm, why);
    comm_finalize();
    return rc;
}

int main(int argc, char** argv) {
    std::set_new_handler(on_out_of_memory);
    // what operator new does not report through the handler: a size beyond what a container can hold
    try {
        return run_main(argc, argv);
    } catch (const std::length_error& e) {
        fail(EXIT_RUNTIME, "out of host memory: an allocation is larger than any machine's (%s)", e.what());
    } catch (const std::bad_alloc&) {
        on_out_of_memory();
    }
}
