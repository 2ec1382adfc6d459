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
 *   -> residual ] -> norm_f -> lm_head -> cross-entropy (classifier.cuh); AdamW (or LionW) in adamw.cuh.
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
#include "parallel/context_parallel.h"
#include "parallel/memory_plan.h"   // the --dry-run GPU plan
#include "checkpoint/ckpt.h"
#include "checkpoint/hf.h"
#include "checkpoint/loader_state.h"
#include "checkpoint/spike_guard.h"
#include "parallel/health.h"
#include "model/sample.h"
#include "model/debug_hooks.h"
#include "data/tokenizer.h"

#include "train_flags.h"        // TrainArgs, the flag table, parse_args
#include "train_log.h"          // the console lines and the JSONL log
#include "train_observers.h"    // stragglers, expert counts, FP8 log, EP statistics
#include "train_step.h"         // one optimizer step
#include "train_eval.h"         // validation, multiple choice, samples, --generate
#include "train_checkpoint.h"   // resume, saves, known-good checkpoints
#include "train_fit.h"          // --dry-run --fit: the cheapest setting that fits

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
           "max_seq %d, rope_theta %g, clip_qkv %s, moe_normalize_expert_weights %s, moe_loss_weight %g, z_loss_weight %g%s\n",
           name.c_str(), c->d_model, c->n_heads, c->kv_heads, c->head_dim, c->n_layers, c->n_experts, c->top_k,
           c->ffn_hidden, c->vocab_size, c->max_seq_len, c->rope_theta, dbrx_setting_str(c->clip_qkv).c_str(),
           dbrx_setting_str(c->moe_norm_p).c_str(), c->moe_loss_weight, c->z_loss_weight, g_init_foundry ? ", init foundry" : "");
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
    recompute_check(&g_recompute, c->n_layers);
    RecomputeSpec spec = g_recompute, cspec = g_compress;   // (they vary by layer: the walk without them, less what they save)
    g_recompute = g_compress = RecomputeSpec();
    long double bytes = per_layers(c, [&](const DbrxConfig* x) { return dbrx_activations(NULL, x, B, T); });
    g_recompute = spec; g_compress = cspec;
    return bytes - dbrx_recompute_saved_bytes(c, B, T);
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
    int S = args.parallel.shard_group_size > 0 && args.parallel.shard_group_size <= comm.world ? args.parallel.shard_group_size : comm.world;
    long double act = activation_bytes(&cfg, args.run.batch, args.run.seq), state = (long double)optimizer_state_bytes() * params_total(&cfg) / S;
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
             "parameters+grads+moments %d B/param / %d = %.2Lf GiB) x %d rank(s) on this node, more than its %.2Lf GiB "
             "(RAM + swap): lower --batch or --seq, shard over more ranks, or use a smaller model", (act + state) / 1073741824.0L,
             act / 1073741824.0L, args.run.batch, args.run.seq, optimizer_state_bytes(), S, state / 1073741824.0L, comm.local_size, have / 1073741824.0L);
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

// Opens the training set (seeded, rank-independent order; mixtures and schedule) and, when there is
// validation or --dump-logits, the validation set (fixed order); returns whether it opened the latter.
static bool open_datasets(const TrainArgs& args, const DbrxConfig& cfg, const Comm& comm, DataLoader* train, DataLoader* val) {
    DataLoaderOptions data_opt = {(uint64_t)(args.data.seed >= 0 ? args.data.seed : args.run.seed), 1, args.run.grad_accum,
                                  args.data.schedule.c_str()};
    dataloader_init(train, args.data.train.c_str(), "--data", args.run.batch, args.run.seq, comm.rank, comm.world, cfg.vocab_size, &data_opt);
    bool have_val = !args.data.val.empty() && (args.eval.val_every > 0 || !args.eval.dump_logits.empty());
    if (have_val) dataloader_init(val, args.data.val.c_str(), "--val-data", args.run.batch, args.run.seq, comm.rank, comm.world, cfg.vocab_size, NULL);
    dataloader_context_parallel(train, args.parallel.context_parallel);   // (CP: each rank its two chunks of its group's sequences)
    if (have_val) dataloader_context_parallel(val, args.parallel.context_parallel);
    if (comm.rank == 0) printf("%s%s", dataloader_describe(train, "--data").c_str(), have_val ? dataloader_describe(val, "--val-data").c_str() : "");
    return have_val;
}

// ---------------------------------------------------------------------------------------------
// THE TRAINING LOOP, written once for both backends. Model is Dbrx (CPU, model/dbrx.h) or DbrxGPU
// (CUDA, model/dbrx_cuda.cuh); Store is the parameter store that owns the weights, gradients and AdamW
// moments: Zero (host memory, MPI: parallel/zero.h) or ZeroGpu (device memory, NCCL:
// parallel/zero_gpu.cuh). model/api.h is the contract both pairs keep. The backend's set-up (train_cpu
// below, train_cuda in train_cuda.cuh) builds them and calls this. Its parts, beside this file:
//   train_step.h        one optimizer step: micro-batches forward/backward, reduction, norm, guard, update
//   train_observers.h   stragglers, expert counts, FP8 log, EP statistics, time left
//   train_eval.h        validation, multiple choice, samples, --generate
//   train_checkpoint.h  resume, saves, known-good checkpoints
//   train_log.h         every console line and JSONL object

typedef struct { double peak; std::string peak_how; std::string memory_line; HealthBackend health; } BackendInfo;

// the FLOPs per token --recompute adds (model/recompute.h), for HFU
static double recompute_fpt(const DbrxConfig* c, int seq, double attn_share = 1.0) { return recompute_flops_per_token(&g_recompute, c->n_layers, c->d_model, qkv_dim(c), c->ffn_hidden, c->top_k, seq, attn_share); }

// rank 0's lines before the first step: the batch, the MFU convention, memory, the communication timeout
static void print_run_banner(const TrainArgs& args, const Comm& comm, const Zero* zl, const BackendInfo& info, int64_t tokens_per_step,
                             double fpt, double fpt_foundry, double fpt_rc) {
    printf("batch: %d x %d tokens x %d accum x %d ranks%s = %lld tokens/step%s; %d steps; lr %g warmup %d %s to %g x; %s\n",
           args.run.batch, args.run.seq, args.run.grad_accum, comm.world, args.parallel.context_parallel > 1 ? (" / " + std::to_string(args.parallel.context_parallel) + " (context parallel)").c_str() : "",
           (long long)tokens_per_step, g_doc_mask_eot >= 0 ? (", attention inside documents (--doc-mask " + std::to_string(g_doc_mask_eot) + ")").c_str() : "", args.run.steps, args.optim.lr, args.optim.warmup, (args.optim.lr_schedule + (g_lr_schedule >= LR_WSD ? " (the last " + std::to_string((int)std::lround(100 * g_lr_decay_frac)) + "% decaying)" : std::string())).c_str(), args.optim.lr_floor, g_optimizer_lion ? "LionW" : "AdamW");
    printf("mfu: %.4g FLOPs/token = " FLOPS_PER_TOKEN_FORMULA "%s, against a peak of %.3f TFLOP/s (%s%s); the log's mfu_foundry: "
           "%.4g FLOPs/token = " FLOPS_PER_TOKEN_FOUNDRY_FORMULA "\n", fpt,
           g_doc_mask_eot < 0 ? "" : " (--doc-mask: each step's attention term x its share of the causal pairs inside documents)",
           info.peak / 1e12, comm.world > 1 ? "all ranks: " : "", info.peak_how.c_str(), fpt_foundry);
    if (!g_recompute.text.empty())
        printf("hfu: %.4g FLOPs/token = the mfu count + %.4g recomputed (--recompute %s: the forward's GEMMs and attention that run "
               "again, counted the same way), against the same peak\n", fpt + fpt_rc, fpt_rc, g_recompute.text.c_str());
    printf("%s (%s, shard group %d, %d replica(s))\n", info.memory_line.c_str(),
           zl->S == 1 ? (comm.world == 1 ? "one process" : "data parallel") : zl->R == 1 ? "ZeRO-3" : "HSDP", zl->S, zl->R);
    if (args.parallel.comm_timeout > 0) printf("comm: --comm-timeout %g s\n", args.parallel.comm_timeout);
    else printf("comm: --comm-timeout auto: %d s until step 1 is done and around checkpoints, %d s otherwise\n", COMM_TIMEOUT_LONG,
                COMM_TIMEOUT_STEADY);
}

// the health check on every rank (parallel/health.h): every rank reaches the same verdict, and on failure
// all of them exit 1 together (failed_line: rank 0 says it first, or NULL)
template <typename Model, typename Store>
static bool health_gate(const TrainArgs& a, const BackendInfo& info, Comm& comm, Model* model, Store* store, const char* failed_line) {
    HealthOptions opt = {a.health.min_tflops, a.health.min_busbw, a.health.gemm_size, a.health.comm_mib, a.run.batch, a.run.seq,
                         a.health.gemm_ratio};
    comm_watch(1);
    bool ok = health_check(opt, info.health, &comm, model, store);
    comm_watch(0);
    if (ok) return true;
    if (comm.rank == 0 && failed_line) { printf("%s\n", failed_line); fflush(stdout); }
    comm_agreed_failure();
    return false;
}

template <typename Model, typename Store>
static int train(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, Model* model, Store* store, const BackendInfo& info) {
    Zero* zl = zero_layout(store);
    if (args.health.check_only)   // the standalone health check: the initialised model, no data, no training
        return health_gate(args, info, comm, model, store, NULL) ? 0 : EXIT_RUNTIME;
    if (args.eval.only) return eval_only_run(args, cfg, comm, model, store);   // (train_eval.h)

    // ---- set-up: data, evaluations, where training starts from, the health check, the banner and the log
    DataLoader train, val;
    bool have_val = open_datasets(args, cfg, comm, &train, &val);
    bool do_val = have_val && args.eval.val_every > 0, do_mc = !args.eval.mc.empty();
    McSet mc;
    if (do_mc) mc_setup(&mc, args, cfg, comm);
    AdamWConfig opt = {args.optim.lr, args.optim.beta1, args.optim.beta2, args.optim.adam_eps, args.optim.weight_decay, args.optim.grad_clip};
    SpikeGuard guard;
    spike_guard_init(&guard, args.guard.loss_sigma, args.guard.gnorm_factor, args.guard.window, args.guard.max_skips, args.guard.loss_rise);
    RunCheckpoints rc;
    TrainProgress prog;
    bool resumed = run_ckpt_begin(&rc, args, cfg, opt, model, store, &train, &guard, &prog, comm);
    if (args.health.check && !health_gate(args, info, comm, model, store, "health: FAILED: not training")) {
        ckpt_free(&rc.ck);
        dataloader_free(&train);
        if (have_val) dataloader_free(&val);
        return EXIT_RUNTIME;
    }
    int64_t tokens_per_step = (int64_t)args.run.batch * args.run.seq * args.run.grad_accum * comm.world / args.parallel.context_parallel;
    double fpt = flops_per_token(&cfg, args.run.seq), fpt_foundry = flops_per_token_foundry(&cfg, args.run.seq), peak = info.peak;
    RunLog log = {NULL, ""};
    FILE* mc_dump = NULL;
    if (comm.rank == 0) {
        print_run_banner(args, comm, zl, info, tokens_per_step, fpt, fpt_foundry, recompute_fpt(&cfg, args.run.seq));
        run_log_open(&log, args.run.log, resumed);
        if (!args.eval.mc_dump.empty()) mc_dump = fopenCheck(args.eval.mc_dump.c_str(), resumed ? "a" : "w");
        fflush(stdout);
    }
    StepObservers obs;
    observers_init(&obs, args, cfg, comm);   // (and --profile's recorder: model/profile.h)
    std::vector<Fp8MetaRef> fp8_metas = dbrx_fp8_metas(model);   // every FP8 operand's state (empty: FP8 off)

    // ---- the loop: evaluations, one step, what the observers saw, samples, checkpoints
    bool stopped = false, guard_stop = false;
    for (int step = prog.step; step < args.run.steps; step++) {
        if (args.run.stop_after >= 0 && obs.steps_done >= args.run.stop_after) {
            if (comm.rank == 0) printf("stop: --stop-after %d reached at step %d of %d\n", args.run.stop_after, step, args.run.steps);
            stopped = true;
            break;
        }
        comm_watch(1);   // the step watchdog (parallel/comm.h) is armed while the step talks to the GPU
        comm_phase_prefix("step %d", step + 1);   // the heartbeat: where this rank is (parallel/comm.h)
        prof_step_begin(step + 1);                 // (traced if one of --profile-steps)
        // (before validation: the evaluation drops its FP8 amaxes, and validation's are kept, as without it)
        if (do_mc && args.eval.every > 0 && step % args.eval.every == 0) run_mc(model, store, &mc, args, &comm, mc_dump, step, &log);
        if (do_val && step % args.eval.val_every == 0) {
            comm_phase("validation");
            double vl;
            profile_host("eval", "validation", [&] { vl = evaluate(model, &val, args.eval.val_steps, &comm); });
            if (comm.rank == 0) report_val(&log, step, vl);
        }
        StepResult r = train_step(args, model, store, &train, &opt, &guard, fp8_metas, step, comm, &obs, &log);
        comm_watch(0);
        observers_after_step(&obs, store, r.bytes0, step + 1, r.dt, r.busy, r.ep_recv, args.run.steps - step - 1, comm, &log);
        double tok_s = tokens_per_step / r.dt, fps = flops_per_token(&cfg, args.run.seq, r.metrics[5]);   // (--doc-mask: as executed)
        StepReport rep = {step + 1, args.run.steps, r.metrics, r.gnorm, r.lr, r.dt, tok_s, peak > 0 ? fps * tok_s / peak : 0.0,
                          peak > 0 ? fpt_foundry * tok_s / peak : 0.0, (long long)obs.step_bytes,
                          comm.world > 1 ? &obs.stragglers.busy_all : NULL, prog.tokens + tokens_per_step, obs.eta, obs.ep_max, obs.ep_mean,
                          g_recompute.text.empty() || !(peak > 0) ? -1.0 : (fps + recompute_fpt(&cfg, args.run.seq, r.metrics[5])) * tok_s / peak};
        if (comm.rank == 0) report_step(&log, rep);
        bool skipped = !r.skip_why.empty();
        guard_stop = spike_guard_record(&guard, step + 1, skipped, r.metrics[0], r.gnorm);
        if (skipped && comm.rank == 0) report_skip(&log, step + 1, r.skip_why, guard.skipped.size(), guard.window);
        prog.step = step + 1;
        prog.tokens += tokens_per_step;
        if (args.sample.every > 0 && prog.step % args.sample.every == 0) {   // (collective; the step's numbers are out)
            comm_watch(1);
            sample_during_training(args, model, &comm, prog.step, &log);
            comm_watch(0);
        }
        run_ckpt_confirm(&rc, prog.step, skipped, comm);
        if (guard_stop) {
            if (comm.rank == 0) fprintf(stderr, "error: the spike guard skipped %zu of the last %d steps (the last, step %d: %s); stopping "
                                        "without saving\n", guard.skipped.size(), guard.window, step + 1, r.skip_why.c_str());
            break;
        }
        bool last = prog.step == args.run.steps || r.metrics[4] > 0 || (args.run.stop_after >= 0 && obs.steps_done >= args.run.stop_after);
        profile_host("io", rc.ck.every > 0 && prog.step % rc.ck.every == 0 && !last ? "checkpoint save" : NULL,
                     [&] { run_ckpt_after_step(&rc, args, store, cfg, &prog, &train, &guard, last, comm, &log); });
        if (r.metrics[4] > 0) {
            stop_report(step + 1, comm, &log);
            stopped = true;
            break;
        }
        profile_finish(args, comm, step + 1);   // (after the last of --profile-steps: the trace)
    }
    profile_finish(args, comm);   // (a run stopped before it: what was traced)

    // ---- the end: the final evaluations, the last checkpoint, export
    // (the final validation before the save: weights whose validation loss is not finite are not saved)
    bool diverged = false, finished = !stopped && !guard_stop && obs.steps_done > 0;
    comm_phase_prefix("after step %d", prog.step);
    if (do_val && finished) {
        comm_phase("validation");
        comm_watch(1);
        double vl = evaluate(model, &val, args.eval.val_steps, &comm);
        comm_watch(0);
        if (comm.rank == 0) report_val(&log, args.run.steps, vl, false);
        diverged = !std::isfinite(vl);
    }
    if (do_mc && finished) {
        comm_watch(1);
        run_mc(model, store, &mc, args, &comm, mc_dump, prog.step, &log);
        comm_watch(0);
    }
    comm_timeout_long(args, true);   // (auto: the rest is checkpoints, export and the like)
    bool saved = run_ckpt_end(&rc, store, cfg, &prog, &train, &guard, guard_stop, diverged, comm, &log);
    if (guard_stop) {
        ckpt_free(&rc.ck);
        run_log_close(&log);
        comm_agreed_failure();   // every rank took the same decision: all exit 1 together
        return EXIT_RUNTIME;
    }
    observers_at_end(&obs, model, zl, comm);
    if (!args.ckpt.export_hf.empty()) {
        zero_to_host(store);
        if (!zero_host_state_finite(zl)) {
            if (comm.rank == 0) fprintf(stderr, "error: --export-hf %s: the weights are not finite: not exported\n", args.ckpt.export_hf.c_str());
            return EXIT_RUNTIME;
        }
        hf_export(args.ckpt.export_hf, zl, &cfg, model->table, args.ckpt.export_dtype, (uint64_t)(args.ckpt.export_max_file_gb * 1e9), &comm);
        if (comm.rank == 0) printf("export: %s (%s, DbrxForCausalLM)\n", args.ckpt.export_hf.c_str(), args.ckpt.export_dtype.c_str());
    }
    if (!args.eval.dump_logits.empty()) {   // (talks to the GPU too: watched)
        comm_watch(1);
        dump_logits(model, &val, args, cfg, comm);
        comm_watch(0);
    }
    run_log_close(&log);
    if (mc_dump) fcloseCheck(mc_dump, args.eval.mc_dump.c_str());
    ckpt_free(&rc.ck);
    dataloader_free(&train);
    if (have_val) dataloader_free(&val);
    if (!saved) { fprintf(stderr, "error: the last checkpoint could not be saved (see the warnings above)\n"); return EXIT_RUNTIME; }
    if (diverged) {
        comm_agreed_failure();   // every rank saw the same validation loss
        if (comm.rank == 0) fprintf(stderr, "error: the final validation loss is not finite: the weights diverged%s\n",
                                    rc.ck.dir.empty() ? "" : " (not saved)");
        return EXIT_RUNTIME;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// the CPU backend's set-up: OpenMP threads per rank, the model, the store over MPI, FP8

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
        print_config(args.run.model.c_str(), &cfg);
    }
    host_memory_check(args, cfg, comm);
    Dbrx model;
    dbrx_build_shape(&model, &cfg, args.run.batch, args.run.seq / args.parallel.context_parallel);   // (CP: this rank's tokens)
    ContextParallel cp;   // --context-parallel: the ring attention's group, RoPE at the global positions
    cp_init(&cp, &comm, args.parallel.context_parallel, &model, args.run.seq);
    Zero zero;   // owns the parameters, gradients and moments: this rank's shard (all of them when S = 1)
    zero_init(&zero, &model, &comm, args.parallel.shard_group_size, (uint64_t)args.run.seed, args.parallel.expert_parallel, args.parallel.ep_layout == "spread");
    printf("zero: rank %d: rank %d of %d in shard group %d, replica %d of %d; master+grads+moments %lld bytes allocated, "
           "%lld bytes measured (resident growth); working buffers %lld bytes\n", comm.rank, zero.shard.rank, zero.S,
           comm.rank / zero.S, zero.replica.rank, zero.R, (long long)zero.state_bytes, zero.state_rss, (long long)zero.work_bytes);
    fflush(stdout);
    Fp8Config fp8 = {fp8_recipe_parse(args.fp8.recipe.c_str()), args.fp8.history, args.fp8.margin, 0};
    dbrx_enable_fp8(&model, &fp8);
    zero.fp8_cfg = &model.fp8;   // the FP8 scaling state that checkpoints carry
    zero.fp8_metas = dbrx_fp8_metas(&model);
    if (args.fp8.gather) {
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
    info.peak_how = args.run.peak_tflops > 0 ? "--peak-tflops" : rank_peak_how;
    info.peak = args.run.peak_tflops > 0 ? args.run.peak_tflops * 1e12 : comm.world * rank_peak;
    // the health check's GEMM: the CPU GEMM the model uses, fp32, on this rank's threads; its floor is 5% of
    // the FP32 peak (OpenBLAS reaches most of it on a quiet core; ranks sharing cores get their share)
    info.health = {"fp32 gemm_cpu (OpenBLAS, " + std::to_string(threads) + " thread(s))", health_gemm_cpu, 512, rank_peak, 0.05,
                   rank_peak_how, 0};
    char line[256];
    snprintf(line, sizeof line, "activations %.1f MiB, parameters+grads+moments %.1f MiB per rank", model.activation_bytes / 1048576.0,
             zero.state_bytes / 1048576.0);
    info.memory_line = line;
    int rc = args.sample.generate ? generate_run(args, cfg, comm, &model, &zero) : train(args, cfg, comm, &model, &zero, info);
    cp_report(&cp, &comm);
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
    if (!a->ckpt.init_hf.empty()) {
        from = a->ckpt.init_hf + "/config.json";
        if (!(err = read_file(from, &text)).empty()) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", a->ckpt.init_hf.c_str(), err.c_str());
        if (!json_parse(text.data(), text.size(), &j, &perr)) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", from.c_str(), perr.c_str());
        if ((err = hf_config_check(&j)).empty()) err = hf_config_read(&j, &saved);
        if (!err.empty()) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", from.c_str(), err.c_str());
        model_json = &j;
    } else {   // the checkpoint named, or (auto) the newest one whose manifest reads (the load verifies it all)
        std::vector<std::string> dirs;
        if (a->ckpt.resume != "auto") {
            if (!path_exists(a->ckpt.resume)) fail(EXIT_BAD_INPUT, "--resume %s: no such checkpoint directory", a->ckpt.resume.c_str());
            dirs.push_back(a->ckpt.resume);
        } else {
            for (auto& d : list_numbered_dirs(a->ckpt.dir, "step_")) dirs.push_back(a->ckpt.dir + "/" + d.second);
            if (dirs.empty()) fail(EXIT_BAD_INPUT, "--generate --resume auto: no checkpoint in --ckpt-dir %s", a->ckpt.dir.c_str());
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
            a->run.model = "from " + from;   // (the banner names where the model came from)
        }
        std::string mism = a->ckpt.init_hf.empty() ? ckpt_config_mismatch(model_json, c) : hf_config_mismatch(model_json, c);
        if (!mism.empty()) fail(EXIT_BAD_INPUT, "%s does not match the model of the flags: %s", from.c_str(), mism.c_str());
    }
    a->run.batch = a->run.seq = 1;
    if (a->fp8.recipe != "off") {
        fprintf(stderr, "note: --generate: the GEMMs run in BF16 (cuda) / FP32 (cpu); --fp8 %s does not apply\n", a->fp8.recipe.c_str());
        a->fp8.recipe = "off";
        a->fp8.gather = false;
    }
}

// The tokenizer and the prompt's ids when something is sampled (--sample-every, --generate): bad input
// (a vocabulary that does not hold the tokenizer's ids, no ranks file, a prompt too long) exits 2 here,
// before anything is built.
static void sampling_setup(TrainArgs* a, const DbrxConfig* c) {
    static Tokenizer tok;
    TokenizerKind kind = a->sample.tokenizer == "bytes" ? TOKENIZER_BYTES : a->sample.tokenizer == "cl100k" ? TOKENIZER_CL100K
                       : c->vocab_size >= CL100K_IDS ? TOKENIZER_CL100K : TOKENIZER_BYTES;
    const char* name = kind == TOKENIZER_BYTES ? "bytes" : "cl100k";
    int need = kind == TOKENIZER_BYTES ? BYTES_VOCAB : CL100K_IDS;
    if (c->vocab_size < need)
        fail(EXIT_BAD_INPUT, "--tokenizer %s%s needs a vocabulary of at least %d ids, the model has %d (--vocab)", name,
             a->sample.tokenizer == "auto" ? " (auto)" : "", need, c->vocab_size);
    if (kind == TOKENIZER_CL100K && !path_exists(a->sample.tokenizer_ranks))
        fail(EXIT_BAD_INPUT, "--tokenizer-ranks %s: no such file (dev/data/setup_tiktoken.sh writes it; --tokenizer bytes for a byte-level model)",
             a->sample.tokenizer_ranks.c_str());
    tokenizer_init(&tok, kind, a->sample.tokenizer_ranks.c_str(), c->vocab_size);
    a->sample.prompt_ids = {tok.eot};   // every document of the shards starts with it (data/README.md)
    for (int id : tokenizer_encode(&tok, a->sample.prompt)) a->sample.prompt_ids.push_back(id);
    long long positions = (long long)a->sample.prompt_ids.size() + a->sample.len;
    if (positions > c->max_seq_len)
        fail(EXIT_BAD_INPUT, "--sample-len %d: the prompt's %zu tokens (with the end-of-text token) and %d new ones need %lld positions, "
             "more than the model's max_seq_len %d (--max-seq)", a->sample.len, a->sample.prompt_ids.size(), a->sample.len, positions,
             c->max_seq_len);
    a->sample.tok = &tok;
}

// --dry-run: the configuration, the FLOPs per token, the CPU run's memory per rank and the GPU plan
// (parallel/memory_plan.h: every term, the total against the device, the verdict). Every number is bounded
// by shape_validate and computed without walking the layers. Bad --plan-* values: one line, exit 2.
static int dry_run_report(const TrainArgs& args, const DbrxConfig& cfg) {
    int n = args.parallel.expert_parallel, sgs = args.parallel.shard_group_size, cp = args.parallel.context_parallel, Tr = args.run.seq / cp;
    int gpus = args.run.plan_gpus > 0 ? args.run.plan_gpus : std::max({sgs, n, 1, cp});
    int S = sgs > 0 ? sgs : gpus;   // (0: ZeRO-3 over all the GPUs)
    if (gpus % S)
        fail(EXIT_BAD_INPUT, "--plan-gpus %d must be a multiple of --shard-group-size %d", gpus, S);
    if (n > 1 && (cfg.n_experts % n || (S > 1 && S % n) || gpus % n))
        fail(EXIT_BAD_INPUT, "--expert-parallel %d must divide the experts (%d), the GPUs (%d) and, under ZeRO-3/HSDP, --shard-group-size %d",
             n, cfg.n_experts, gpus, S);
    long double capacity = 0;
    std::string device;
    if (flag_given(&args, "--plan-device")) {
        if (!plan_device_parse(args.run.plan_device, &capacity, &device))
            fail(EXIT_BAD_INPUT, "--plan-device '%s' must be h100, h200 or the GiB of one GPU (a number > 0)", args.run.plan_device.c_str());
        device += ", --plan-device";
    } else {
        int gpus_here = 0;
        size_t free_b = 0, total_b = 0;
#if HAVE_CUDA_BACKEND
        if (cudaGetDeviceCount(&gpus_here) != cudaSuccess || (gpus_here > 0 && cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)) {
            (void)cudaGetLastError();
            gpus_here = 0;
        }
#endif
        if (gpus_here > 0) {
            capacity = (long double)free_b;
            device = "the free memory of this machine's GPU 0 (" + std::to_string(total_b >> 20) + " MiB in all; --plan-device to plan another)";
        } else {
            plan_device_parse("h100", &capacity, &device);
            device += ", the default without a visible GPU: --plan-device h200 or GiB for another";
        }
    }
    print_config(args.run.model.c_str(), &cfg);
    printf("training FLOPs per token (S = %d): %.4g = " FLOPS_PER_TOKEN_FORMULA ", the MFU count; %.4g = "
           FLOPS_PER_TOKEN_FOUNDRY_FORMULA ", %.0f%% more\n", args.run.seq, flops_per_token(&cfg, args.run.seq),
           flops_per_token_foundry(&cfg, args.run.seq), 100 * (flops_per_token_foundry(&cfg, args.run.seq) / flops_per_token(&cfg, args.run.seq) - 1));
    if (!g_recompute.text.empty())
        printf("recomputed FLOPs per token (--recompute %s): %.4g, %.1f%% more than the MFU count (HFU counts them)\n", g_recompute.text.c_str(),
               recompute_fpt(&cfg, args.run.seq), 100 * recompute_fpt(&cfg, args.run.seq) / flops_per_token(&cfg, args.run.seq));
    double act = (double)activation_bytes(&cfg, args.run.batch, Tr);   // (context parallel: this rank's T/N tokens)
    double p = (double)params_total(&cfg);
    MemoryPlan plan = memory_plan(&cfg, args.run.batch, Tr, S, n, gpus, fp8_recipe_parse(args.fp8.recipe.c_str()),
                                  args.parallel.ep_capacity, args.parallel.zero_chunk_mib, args.parallel.grad_reduce_dtype == "bf16",
                                  args.parallel.ep_chunks, args.fp8.gather);
    memory_plan_cp(&plan, &cfg, cp);   // (the GPU ring's buffers and its communicator; cp must divide the GPUs)
    double shard = (double)plan.shard_params;   // this rank's shard under S ranks and EP n, from the store's own layout
    printf("memory per rank, shard group of %d rank(s)%s%s, micro-batch %d x %d:\n", S,
           sgs > 0 ? "" : " (--shard-group-size S to see S ranks)",
           n > 1 ? (", expert parallel " + std::to_string(n)).c_str() : "", args.run.batch, Tr);
    printf("  cpu  fp32: weights+grads+%s moments %d B/param of this rank's shard (%s of %s params) = %.2f GiB, activations %.2f GiB, total %.2f GiB\n",
           g_optimizer_lion ? "LionW" : "AdamW", optimizer_state_bytes(), with_commas((int64_t)shard).c_str(), with_commas((int64_t)p).c_str(),
           optimizer_state_bytes() * shard / (1 << 30), act / (1 << 30), (optimizer_state_bytes() * shard + act) / (1 << 30));
    memory_plan_print(&plan, &cfg, capacity, device.c_str());
    cp_plan_print(&cfg, args.run.batch, args.run.seq, args.parallel.context_parallel);
    if (args.health.check) printf("  (not in the plan: --health-check's GEMM operands, freed before training)\n");
    if (args.run.fit) fit_report(args, cfg, gpus, capacity);
    return 0;
}

static int run_main(int argc, char** argv) {
    debug_hooks_read();   // the tests' DBRX_DEBUG_* switches, once (model/debug_hooks.h)
    TrainArgs args;
    DbrxConfig cfg;
    parse_args(argc, argv, &args, &cfg);   // (validates the model too)
    if (args.sample.generate) generate_setup(argc, argv, &args, &cfg);
    if (args.sample.generate || args.sample.every > 0) sampling_setup(&args, &cfg);
    if (args.run.seq > cfg.max_seq_len) fail(EXIT_BAD_INPUT, "--seq %d is longer than the model's max_seq_len %d (--max-seq)", args.run.seq, cfg.max_seq_len);
    shape_validate(&cfg, args.run.batch, args.run.seq);

    if (args.run.dry_run) return dry_run_report(args, cfg);
    // --- device: --device auto picks CUDA when the build has it and a GPU is visible, and says so
    int gpus = 0;
#if HAVE_CUDA_BACKEND
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) { (void)cudaGetLastError(); gpus = 0; }
#endif
    if (args.run.device == "cuda" && !HAVE_CUDA_BACKEND)
        fail(EXIT_BAD_INPUT, "--device cuda: this binary was built by g++ without CUDA (build it where nvcc is installed: make); use --device cpu");
    if (args.run.device == "cuda" && gpus == 0) fail(EXIT_BAD_INPUT, "--device cuda: no CUDA device is visible; use --device cpu");
    bool use_cuda = args.run.device == "cuda" || (args.run.device == "auto" && gpus > 0);
    if (!use_cuda && args.parallel.grad_reduce_dtype == "bf16")   // (MPI has no BF16 sum: parallel/README.md)
        fail(EXIT_BAD_INPUT, "--grad-reduce-dtype bf16 is for the CUDA backend; the CPU backend reduce-scatters in fp32 over MPI");
    if (use_cuda && g_compress_format == COMPRESS_BF16)   // (the GPU saves its activations in BF16 already)
        fail(EXIT_BAD_INPUT, "--compress-format bf16 is for the CPU backend; the CUDA backend keeps activations in BF16 already (use e4m3)");

    stop_signals_install(getenv("OMPI_MCA_odls_base_sigkill_timeout"));   // (a signal during MPI_Init: a stop after step 1)
    Comm comm = comm_init(&argc, &argv);
    stop_signals_install(NULL);   // (over comm_init's: the stop signal's time and phase recorded first)
    {   // every output path before step 1 (train_flags.h): rank 0 looks, every rank exits 2 with its verdict
        std::string why = comm.rank == 0 ? output_paths_problem(args) : "";
        int bad = why.empty() ? 0 : 1;
        comm_broadcast(&comm.world_group, &bad, sizeof bad, 0);
        if (bad) {
            comm_agreed_failure();
            if (comm.rank == 0) fail(EXIT_BAD_INPUT, "%s", why.c_str());
            exit(EXIT_BAD_INPUT);
        }
    }
    comm_set_timeout(args.parallel.comm_timeout > 0 ? args.parallel.comm_timeout : COMM_TIMEOUT_LONG);   // (auto: generous until step 1 is done)
    comm_set_ctas_internode(args.parallel.nccl_ctas_internode);   // (before any NCCL communicator is made)
    const char* why = args.run.device == "auto" ? (gpus ? " (auto: a GPU is visible)" : HAVE_CUDA_BACKEND ? " (auto: no GPU)" : " (auto: built without CUDA)") : "";
    std::string cuda_only = cuda_only_flag(args);
    if (!use_cuda && !cuda_only.empty()) fail(EXIT_BAD_INPUT, "%s is the CUDA step's: this run is on the CPU%s", cuda_only.c_str(), why);
    int rc;
#if HAVE_CUDA_BACKEND
    if (use_cuda) rc = train_cuda(args, cfg, comm, why);
    else
#else
    (void)use_cuda;
#endif
    rc = train_cpu(args, cfg, comm, why);
    stop_finalize(rc, comm);   // (comm_finalize; bounded after Ctrl-C under mpirun: train_checkpoint.h)
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
