/*
 * train_flags.h — train_dbrx's command line: TrainArgs (every flag's value and default), the flag
 * table (name, alias, type, help: --help prints it), parse_args (parsing, and every check of a value
 * or a combination that can be made before the model exists: one line and exit 2), flag_given, and
 * output_paths_problem (every output flag's path, checked before step 1).
 * Included by train_dbrx.cu only.
 */
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <vector>
#include "model/common.h"
#include "model/config.h"
#include "data/tokenizer.h"
#include "model/debug_hooks.h"
#include "model/recompute.h"

// The flags by section (--help prints them so, with their defaults)
typedef struct {
    std::string model = "dbrx-tiny", device = "auto", log = "";
    int steps = 200, batch = 8, seq = 0, grad_accum = 1, seed = 1337, stop_after = -1;
    int log_every_experts = 0;      // each layer's tokens per expert in the log
    std::string profile = "", profile_steps = "";   // --profile FILE, --profile-steps A:B (model/profile.h)
    int profile_first = 0, profile_last = 0;       // the steps traced (1-based, inclusive), from --profile-steps
    bool profile_kernels = false;                  // --profile-kernels: every launch and GEMM a range of its own
    float peak_tflops = 0.0f;
    bool dry_run = false, help = false, help_debug = false;
    bool fit = false;               // --dry-run --fit: the cheapest setting that fits (train_fit.h)
    float fit_headroom = 4.0f;      // ... with this many GiB per GPU to spare (the plan's margins are predicted, not measured)
    std::string plan_device = "";   // --dry-run's GPU plan (parallel/memory_plan.h): h100 | h200 | GiB ("": the visible GPU, else h100)
    int plan_gpus = 0;              // ... and the run's GPUs (0: the shard group, or the EP degree)
    std::string recompute = "";     // --recompute SPEC (model/recompute.h); "": nothing recomputed
    std::string compress_acts = "", compress_format = "e4m3";   // --compress-acts SPEC, --compress-format (model/act_compress.cuh)
    std::string moe_gemm = "cublaslt";   // --moe-gemm: the GPU step's expert GEMMs, per-expert cuBLASLt | grouped (model/moe_experts_step.cuh)
    std::string attention_bwd = "auto";   // --attention-bwd: the GPU attention backward, auto | mma (the pair) | wgmma | wgmma-overlap (model/attention_wgmma_bwd.cuh)
    int moe_streams = 2;                  // --moe-streams: the per-expert GEMMs on 1 or 2 streams (model/moe.cuh)
    int gemm_autotune = 0;                // --gemm-autotune N: cuBLASLt's first N answers timed at a GEMM shape's first call (model/matmul_cublaslt.cuh)
    int doc_mask = -1;                    // --doc-mask EOT: attention inside each packed document (model/attention.cuh; -1: off)
    std::string init = "hf";              // --init: hf | foundry (model/dbrx_params.h's dbrx_init_std)
} RunArgs;
typedef struct { float lr = 2e-3f, lr_floor = 0.1f, weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.95f, adam_eps = 1e-8f, grad_clip = 1.0f;
                 float lr_decay_frac = 0.2f; int warmup = 10;
                 std::string adam_moments = "fp32", optimizer = "adamw", lr_schedule = "cosine"; } OptimArgs;
                 // --adam-moments: fp32 | bf16, --optimizer: adamw | lion, --lr-schedule: cosine | linear | constant | wsd | wsd-sqrt
                 // (model/adamw.cuh)
typedef struct { std::string train = "data/sotu/sotu_train_*.bin", val = "data/sotu/sotu_val_*.bin", schedule = ""; int seed = -1; } DataArgs;
typedef struct {
    int shard_group_size = 0;      // ZeRO-3 / HSDP (parallel/zero.h): 0 = all ranks
    int context_parallel = 1;      // CP degree (parallel/context_parallel.h): each sequence split over groups of this many ranks
    int expert_parallel = 1;       // EP degree (parallel/expert_parallel.h): the experts split over groups of this many ranks
    float ep_capacity = EP_CAPACITY_DEFAULT;   // EP on the GPU: rows planned per layer, x tokens x top-k (ep_plan_rows; 0: dropless)
    std::string ep_layout = "packed";   // EP groups of N consecutive ranks (packed) or strided by S/N (spread): parallel/shard_runs.h
    int ep_chunks = EP_OVERLAP_CHUNKS_DEFAULT;  // EP on the GPU: the exchange in chunks overlapped with the experts (ep_chunk_layout)
    float comm_timeout = 0;        // 0: auto (parallel/comm.h: generous until the first step is done, then 60 s)
    int nccl_ctas_internode = 0;   // the CTAs of each NCCL communicator across nodes (parallel/comm.h; 0: NCCL's choice)
    float zero_chunk_mib = 512;      // the GPU store's experts chunks (parallel/zero_gpu_chunks.cuh): MiB of BF16 weights each; 0: whole
    std::string grad_reduce_dtype = "fp32";   // the GPU store's shard-group gradient reduce-scatter: fp32 | bf16 (zero_gpu_comm.cuh)
    int zero_prefetch = 2;         // the GPU store: items of step t+1 gathered during step t's optimizer (zero_gpu_comm.cuh; 0: none)
    std::string zero_embedding = "rows";   // the GPU store's embedding: its batch's rows exchanged | its table gathered (zero_gpu_embedding.cuh)
} ParallelArgs;
typedef struct {                   // checkpoints and Hugging Face interop (checkpoint/)
    std::string dir = "", resume = "", init_hf = "", export_hf = "", export_dtype = "bf16";
    int every = 0, keep = 3, keep_every = 0, confirm = 0;
    float export_max_file_gb = 5;
} CkptArgs;
typedef struct { float loss_sigma = 6, loss_rise = 1, gnorm_factor = 50; int window = 50, max_skips = 5; } GuardArgs;   // checkpoint/spike_guard.h
typedef struct {                   // the health check (parallel/health.h)
    bool check = false, check_only = false;
    float min_tflops = 0, min_busbw = 0, gemm_ratio = 0.5f;
    int gemm_size = 0, comm_mib = 16;
} HealthArgs;
typedef struct { std::string recipe = "off"; int history = 16, margin = 0, log_every = 0; bool gather = false; } Fp8Args;
typedef struct {                   // generation (model/sample.h, dbrx_decode_step): samples during training, or --generate
    int every = 0, len = 64, top_k = 0, seed = -1;
    float temperature = 1.0f;
    std::string prompt = "", tokenizer = "auto", tokenizer_ranks = "dev/data/.cache/cl100k_base.tiktoken";
    bool generate = false;
    const Tokenizer* tok = nullptr;   // set by run_main when there is something to sample
    std::vector<int> prompt_ids;      // the end-of-text token, then the prompt's tokens
} SampleArgs;
typedef struct {                   // validation, multiple-choice evaluation (data/mc_eval.h), the logits dump
    int val_every = 50, val_steps = 8, every = 0;
    std::string mc = "", mc_dump = "", dump_logits = "";
    bool only = false;             // --eval-only
} EvalArgs;

typedef struct {
    RunArgs run;
    OptimArgs optim;
    DataArgs data;
    ParallelArgs parallel;
    CkptArgs ckpt;
    GuardArgs guard;
    HealthArgs health;
    Fp8Args fp8;
    SampleArgs sample;
    EvalArgs eval;
    std::vector<std::string> given;   // the flags on the command line: a default is never taken for an explicit value
} TrainArgs;

static bool flag_given(const TrainArgs* a, const char* name) {
    for (const std::string& g : a->given) if (g == name) return true;
    return false;
}

enum FlagType { F_INT, F_FLOAT, F_STR, F_BOOL, F_SETTING, F_SECTION };   // F_SETTING: a positive number, or off (DBRX_OFF);
                                                                       // F_SECTION: the heading of the flags that follow
typedef struct { const char* name; const char* alias; FlagType type; void* ptr; const char* help; } Flag;

static std::vector<Flag> make_flags(TrainArgs* a, DbrxConfig* c) {
    return {
        {"", "", F_SECTION, NULL, "the model (the preset, and any of its numbers changed)"},
        {"--model", "", F_STR, &a->run.model, "preset: dbrx-132b dbrx-73b dbrx-35b dbrx-18b dbrx-9b dbrx-1b dbrx-tiny"},
        {"--d-model", "", F_INT, &c->d_model, "model width d (head_dim follows as d / n_heads)"},
        {"--n-heads", "", F_INT, &c->n_heads, "query heads"}, {"--kv-heads", "", F_INT, &c->kv_heads, "key/value heads (GQA)"},
        {"--n-layers", "", F_INT, &c->n_layers, "transformer blocks"}, {"--ffn-hidden", "", F_INT, &c->ffn_hidden, "hidden size F of one expert"},
        {"--experts", "", F_INT, &c->n_experts, "experts per MoE layer"}, {"--top-k", "", F_INT, &c->top_k, "experts per token"},
        {"--vocab", "", F_INT, &c->vocab_size, "vocabulary size (padded)"},
        {"--max-seq", "", F_INT, &c->max_seq_len, "max sequence length of the model"}, {"--rope-theta", "", F_FLOAT, &c->rope_theta, "RoPE base"},
        {"--clip-qkv", "", F_SETTING, &c->clip_qkv, "clamp of the fused qkv output to +-X, or off (HF clip_qkv null)"},
        {"--moe-normalize-expert-weights", "", F_SETTING, &c->moe_norm_p, "divide the top-k router weights by their p-norm, "
                                                                          "p = X >= 1 (DBRX: 1), or off (HF null: not renormalised)"},
        {"--ln-eps", "", F_FLOAT, &c->ln_eps, "LayerNorm epsilon"}, {"--moe-loss-weight", "", F_FLOAT, &c->moe_loss_weight, "load-balancing loss weight"},
        {"--z-loss-weight", "", F_FLOAT, &c->z_loss_weight, "router z-loss weight"},
        {"--init-std", "", F_FLOAT, &c->init_std, "std of the normal init of every matrix (--init hf)"},
        {"--init", "", F_STR, &a->run.init, "the initialisation: hf (Hugging Face's: normal(0, --init-std)) | foundry (LLM Foundry's DBRX yamls': kaiming normal, fan_in, relu gain: sqrt(2 / d), the experts' w2 sqrt(2 / F); out_proj and w2 then / sqrt(2 L))"},
        {"--doc-mask", "", F_INT, &a->run.doc_mask, "attention stays inside each document of a packed sequence, an end-of-text token with this id opening one (LLM Foundry's attn_uses_sequence_id; this project's cl100k shards: 100257, byte shards: 256; -1: off, the default)"},
        {"", "", F_SECTION, NULL, "the run"},
        {"--steps", "-x", F_INT, &a->run.steps, "optimizer steps (the LR schedule spans them)"},
        {"--batch", "-b", F_INT, &a->run.batch, "micro-batch size in sequences, per rank"},
        {"--seq", "-t", F_INT, &a->run.seq, "sequence length (default: min(model max_seq, 2048))"},
        {"--grad-accum", "", F_INT, &a->run.grad_accum, "micro-batches per optimizer step"}, {"--seed", "", F_INT, &a->run.seed, "seed of the initialisation"},
        {"--log", "-o", F_STR, &a->run.log, "JSONL log file (one object per step and per validation)"},
        {"--log-every-experts", "", F_INT, &a->run.log_every_experts, "log each layer's tokens per expert (summed over micro-batches and "
                                                                  "ranks) to the JSONL log every N steps (0: never)"},
        {"--device", "", F_STR, &a->run.device, "auto | cpu | cuda (cuda: one process per GPU under mpirun, the GPU from the node-local rank)"},
        {"--stop-after", "", F_INT, &a->run.stop_after, "run at most N steps of the schedule in this invocation, then save and exit (default: all of them)"},
        {"--peak-tflops", "", F_FLOAT, &a->run.peak_tflops, "peak FLOP/s for MFU, in TFLOP/s (default: the CPU's from its clock and ISA; the GPU's dense BF16 peak when known)"},
        {"--dry-run", "", F_BOOL, &a->run.dry_run, "print config, parameter counts, FLOPs/token, memory per rank (the CPU's, and the "
                                                   "GPU plan: every term, the total, FITS or DOES NOT FIT); exit"},
        {"--plan-device", "", F_STR, &a->run.plan_device, "--dry-run's GPU plan against: h100 | h200 | the GiB of one GPU (default: the "
                                                          "visible GPU's free memory, else h100)"},
        {"--fit", "", F_BOOL, &a->run.fit, "with --dry-run: plan every layout / recompute / compression setting for --plan-gpus GPUs of --plan-device; print the cheapest that fits (train_fit.h)"},
        {"--fit-headroom", "", F_FLOAT, &a->run.fit_headroom, "--fit: the GiB per GPU a setting must leave free beyond its plan [default 4]"},
        {"--plan-gpus", "", F_INT, &a->run.plan_gpus, "--dry-run's GPU plan for a run on N GPUs (default: --shard-group-size, or --expert-parallel if more)"},
        {"--recompute", "", F_STR, &a->run.recompute, "selective activation recomputation: GRAN[:RANGE][,...], GRAN attn | swiglu | "
                                                      "moe | block, RANGE all (default) | firstN | M-K | everyN | L (e.g. attn,block:0-7); "
                                                      "losses and gradients bit-identical to without it (README, Memory)"},
        {"--moe-gemm", "", F_STR, &a->run.moe_gemm, "the GPU step's expert GEMMs: cublaslt (a GEMM per expert) | grouped (forward, data and weight gradients as Hopper grouped GEMMs, SwiGLU fused, device offsets; BF16, no EP or chunked experts)"},
        {"--moe-streams", "", F_INT, &a->run.moe_streams, "--moe-gemm cublaslt's GEMMs of the experts with rows on 2 streams, alternating (default; the same bits) or 1"}, {"--attention-bwd", "", F_STR, &a->run.attention_bwd, "the GPU step's attention backward at head_dim 64 and 128 without context parallelism: auto (wgmma-overlap on Hopper, else mma) | mma (mma.sync dq + dk/dv kernels) | wgmma (the same on Hopper's wgmma) | wgmma-overlap (wgmma, dq's products overlapped); all the same bits; other head_dims mma"},
        {"--gemm-autotune", "", F_INT, &a->run.gemm_autotune, "the GPU step's GEMMs: at a shape's first call, time cuBLASLt's first N algorithms on it and keep the fastest (beta-0 calls; saved with checkpoints, taken again on resume); 0 (default) or 1: the heuristic's first. Two fresh runs may then choose differently, and differ in the last bits (README)"},
        {"--compress-acts", "", F_STR, &a->run.compress_acts, "CLASS[:RANGE][,...], CLASS swiglu (the experts' g, u) | attn (LN1's output), kept compressed until the backward (not bit-identical; README)"},
        {"--compress-format", "", F_STR, &a->run.compress_format, "--compress-acts' format: e4m3 (1x128 scales) | bf16 (CPU only)"},
        {"--help", "-h", F_BOOL, &a->run.help, "this text"},
        {"--help-debug", "", F_BOOL, &a->run.help_debug, "the tests' fault-injection switches (DBRX_DEBUG_* environment variables): "
                                                        "injected spikes and NaNs, killed, stopped or slow ranks, ..."},
        {"", "", F_SECTION, NULL, "the optimizer (AdamW or LionW, the LR schedule)"},
        {"--optimizer", "", F_STR, &a->optim.optimizer, "adamw | lion (LionW: one moment, the update's sign; wants a 3-10x smaller --lr, a larger --weight-decay)"},
        {"--lr", "-l", F_FLOAT, &a->optim.lr, "peak learning rate"}, {"--warmup", "-u", F_INT, &a->optim.warmup, "linear warmup steps"},
        {"--lr-floor", "-q", F_FLOAT, &a->optim.lr_floor, "final LR as a fraction of the peak (the decay's floor)"}, {"--lr-schedule", "", F_STR, &a->optim.lr_schedule, "after the warmup: cosine | linear | constant | wsd | wsd-sqrt (warmup-stable-decay: the peak, then the last --lr-decay-frac of the steps linearly / 1 - sqrt to the floor)"},
        {"--lr-decay-frac", "", F_FLOAT, &a->optim.lr_decay_frac, "wsd, wsd-sqrt: the share of the steps after the warmup that decay (0, 1]"},
        {"--weight-decay", "-c", F_FLOAT, &a->optim.weight_decay, "decoupled weight decay, times the lr (matrices only)"},
        {"--beta1", "", F_FLOAT, &a->optim.beta1, "beta1 (AdamW's m; LionW's interpolation)"}, {"--beta2", "", F_FLOAT, &a->optim.beta2, "beta2 (AdamW's v; LionW's m)"},
        {"--adam-eps", "", F_FLOAT, &a->optim.adam_eps, "AdamW epsilon (LionW has none)"}, {"--grad-clip", "", F_FLOAT, &a->optim.grad_clip, "global gradient-norm clip (<= 0: off)"},
        {"--adam-moments", "", F_STR, &a->optim.adam_moments, "the optimizer's moments (AdamW's m, v; LionW's m) kept in fp32 | bf16 (rounded as stored: 2 bytes a moment a parameter less, a different loss curve)"},
        {"", "", F_SECTION, NULL, "data (data/README.md)"},
        {"--data", "-i", F_STR, &a->data.train, "training shards: a glob, or a mixture NAME=GLOB:WEIGHT,... (data/README.md)"},
        {"--data-schedule", "", F_STR, &a->data.schedule, "mixture weights from a step on: STEP:NAME=W,...[;STEP:...]"},
        {"--data-seed", "", F_INT, &a->data.seed, "seed of the data order (default: --seed)"},
        {"--val-data", "-j", F_STR, &a->data.val, "glob of validation shards ('' to skip validation)"},
        {"", "", F_SECTION, NULL, "evaluation"},
        {"--val-every", "-v", F_INT, &a->eval.val_every, "validate every N steps (0: never)"},
        {"--val-steps", "-m", F_INT, &a->eval.val_steps, "validation batches"},
        {"--eval-mc", "", F_STR, &a->eval.mc, "multiple-choice eval set (HellaSwag-style, llm.c's .bin; data/README.md): accuracy "
                                              "every --eval-every steps and at the end"},
        {"--eval-every", "", F_INT, &a->eval.every, "--eval-mc every N steps and at the end (default: --val-every; 0: only at the end)"},
        {"--eval-mc-dump", "", F_STR, &a->eval.mc_dump, "write every --eval-mc example's per-completion summed losses and token counts to this JSONL file"},
        {"--eval-only", "", F_BOOL, &a->eval.only, "no training: load --resume DIR|auto or --init-hf DIR, then the validation loss "
                                                  "(--val-data, --val-steps) and --eval-mc; print, log (--log), exit"},
        {"--dump-logits", "", F_STR, &a->eval.dump_logits, "at the end, write inputs and logits of the first validation batch (safetensors)"},
        {"", "", F_SECTION, NULL, "parallelism (parallel/README.md)"},
        {"--context-parallel", "", F_INT, &a->parallel.context_parallel, "CP: each sequence split over groups of N consecutive ranks (2N chunks, rank r holds r and 2N-1-r), ring attention (CPU: MPI; GPU: NCCL, two K|V slots) (N divides the ranks, 2N divides --seq)"},
        {"--expert-parallel", "", F_INT, &a->parallel.expert_parallel, "EP: the experts of every layer split over groups of N ranks (N divides the experts, "
                                                              "and the shard group size, or the ranks with --shard-group-size 1), tokens exchanged all-to-all"},
        {"--ep-layout", "", F_STR, &a->parallel.ep_layout, "EP: packed (default: EP groups of N consecutive ranks; the ranks sharding the same experts strided) | spread (those S/N consecutive, in a node; EP groups strided by S/N; S > N)"},
        {"--ep-capacity-factor", "", F_FLOAT, &a->parallel.ep_capacity, "EP on the GPU: each rank's device buffers hold F x tokens per "
                                                              "micro-batch x top-k received rows per MoE layer, planned at start-up (default 2; "
                                                              "0: the dropless bound, EP x tokens x min(top-k, experts/EP)); a routing that needs "
                                                              "more grows them on every EP rank in that step, with one line (no token dropped)"},
        {"--grad-reduce-dtype", "", F_STR, &a->parallel.grad_reduce_dtype, "ZeRO-3/HSDP on the GPU: the gradient reduce-scatter in fp32 | bf16 (half the bytes)"},
        {"--zero-embedding", "", F_STR, &a->parallel.zero_embedding, "ZeRO-3/HSDP on the GPU: the embedding's forward rows and weight-gradient rows exchanged with their owners per batch | gather (the table gathered, its gradient reduce-scattered)"},
        {"--zero-prefetch", "", F_INT, &a->parallel.zero_prefetch, "ZeRO-3/HSDP on the GPU: the next step's first N units gathered during the optimizer (0..2, default 2; 0: none)"},
        {"--zero-chunk-mib", "", F_FLOAT, &a->parallel.zero_chunk_mib, "ZeRO-3/HSDP on the GPU without EP or FP8: a block's experts gathered and reduce-scattered in chunks of "
                                                              "whole experts, the most whose BF16 weights fit M MiB (at least one; default 512: one expert of DBRX-132B); also (S > 1) the embedding and lm_head in one vocabulary slot, their gradients in chunks of vocabulary rows; 0: whole units"},
        {"--ep-overlap-chunks", "", F_INT, &a->parallel.ep_chunks, "EP on the GPU: each MoE layer's exchange in N slices of every local "
                                                              "expert's rows, a chunk each, computed while the next is dispatched and the previous combined (1..64, "
                                                              "default " EP_OVERLAP_CHUNKS_DEFAULT_S "; 1: one exchange; BF16 the same losses; --fp8 delayed|current one piece)"},
        {"--shard-group-size", "", F_INT, &a->parallel.shard_group_size, "S: shard parameters, gradients and AdamW state over groups of S "
                                                                 "consecutive ranks, replicate across ranks/S groups (0 = all ranks: "
                                                                 "ZeRO-3; 1: data parallel; else HSDP)"},
        {"--comm-timeout", "", F_FLOAT, &a->parallel.comm_timeout, "seconds a collective may make no progress before the run stops, naming the rank "
                                                           "that does not respond (0: auto: 600 until step 1 is done and around checkpoints, then 60)"},
        {"--nccl-ctas-internode", "", F_INT, &a->parallel.nccl_ctas_internode, "GPU: each NCCL communicator spanning nodes on N CTAs, so its collectives hold fewer SMs beside the compute (1..32; 0, default: NCCL's choice)"},
        {"", "", F_SECTION, NULL, "checkpoints and Hugging Face interop (checkpoint/README.md)"},
        {"--ckpt-dir", "", F_STR, &a->ckpt.dir, "checkpoint directory: saves every --ckpt-every steps, at the end, and on SIGTERM/SIGINT/SIGUSR1"},
        {"--ckpt-every", "", F_INT, &a->ckpt.every, "save a checkpoint every N steps (0: only on the way out)"},
        {"--ckpt-keep", "", F_INT, &a->ckpt.keep, "keep the last K checkpoints"},
        {"--ckpt-keep-every", "", F_INT, &a->ckpt.keep_every, "also keep every checkpoint whose step is a multiple of M (0: none)"},
        {"--ckpt-confirm", "", F_INT, &a->ckpt.confirm, "a checkpoint counts toward --ckpt-keep once the run trained N steps past it with none skipped (0: --ckpt-every, or 1)"},
        {"--resume", "", F_STR, &a->ckpt.resume, "auto (the newest valid checkpoint in --ckpt-dir; none: start fresh) or a checkpoint directory"},
        {"--init-hf", "", F_STR, &a->ckpt.init_hf, "initialise the weights from a Hugging Face DBRX export (config.json + safetensors)"},
        {"--export-hf", "", F_STR, &a->ckpt.export_hf, "at the end, export the weights as config.json + safetensors (DbrxForCausalLM)"},
        {"--export-dtype", "", F_STR, &a->ckpt.export_dtype, "bf16 | fp32 (fp32: export -> import is bit-exact)"},
        {"--export-max-file-gb", "", F_FLOAT, &a->ckpt.export_max_file_gb, "split the export into files of at most this size"},
        {"", "", F_SECTION, NULL, "the loss-spike guard"},
        {"--spike-loss-sigma", "", F_FLOAT, &a->guard.loss_sigma, "skip a step whose loss exceeds the mean of the last --spike-window steps by K std and by --spike-loss-rise (0: off)"},
        {"--spike-loss-rise", "", F_FLOAT, &a->guard.loss_rise, "... and by R x that mean (1: the loss doubled; ordinary batches reach +51% at batch 1: checkpoint/README.md)"},
        {"--spike-gnorm-factor", "", F_FLOAT, &a->guard.gnorm_factor, "skip a step whose grad norm exceeds M x the median of the last --spike-window steps (0: off; ordinary steps reach 18x: checkpoint/README.md)"},
        {"--spike-window", "", F_INT, &a->guard.window, "steps the spike guard's statistics and skip count span"},
        {"--max-skips", "", F_INT, &a->guard.max_skips, "stop when this many of the last --spike-window steps were skipped (non-finite steps are always skipped)"},
        {"", "", F_SECTION, NULL, "the health check"},
        {"--health-check", "", F_BOOL, &a->health.check, "before training, on every rank: a GEMM of known result and its TFLOP/s, all-reduce "
                                                          "and all-gather results and busbw, a NaN-free forward; a rank out of range is named "
                                                          "and the job stops (exit 1)"},
        {"--health-check-only", "", F_BOOL, &a->health.check_only, "the checks of --health-check, then exit: 0 all passed, 1 not (needs no data)"},
        {"--health-min-tflops", "", F_FLOAT, &a->health.min_tflops, "health check: a rank whose GEMM runs below X TFLOP/s fails (0: a fraction "
                                                                    "of the device's known peak; always: --health-gemm-ratio x the median rank)"},
        {"--health-min-busbw", "", F_FLOAT, &a->health.min_busbw, "health check: all-reduce or all-gather bus bandwidth below X GB/s fails "
                                                                  "(0: results checked, bandwidth reported)"},
        {"--health-gemm-ratio", "", F_FLOAT, &a->health.gemm_ratio, "health check: a rank whose GEMM runs below R x the median rank's fails"},
        {"--health-gemm-size", "", F_INT, &a->health.gemm_size, "health check: the GEMM is N x N x N (0: 512 on the CPU, 8192 on a GPU; a "
                                                                "multiple of 16)"},
        {"--health-comm-mib", "", F_INT, &a->health.comm_mib, "health check: MiB of the all-reduce and all-gather buffers"},
        {"", "", F_SECTION, NULL, "FP8 (model/README.md)"},
        {"--fp8", "", F_STR, &a->fp8.recipe, "FP8 GEMMs in the blocks: off | delayed | current | block (CPU: emulated; CUDA: cuBLASLt FP8)"},
        {"--fp8-amax-history", "", F_INT, &a->fp8.history, "delayed scaling: amax history length"},
        {"--fp8-margin", "", F_INT, &a->fp8.margin, "FP8 scales are backed off by 2^margin"},
        {"--fp8-log-every", "", F_INT, &a->fp8.log_every, "log every FP8 tensor's amax/scale/saturation to the JSONL log every N steps (0: never)"},
        {"--fp8-gather", "", F_BOOL, &a->fp8.gather, "ZeRO-3/HSDP: all-gather the blocks' FP8 weights as E4M3 codes (1 byte/param) with their scales"},
        {"", "", F_SECTION, NULL, "profiling (README.md, \"Profiling\")"},
        {"--profile", "", F_STR, &a->run.profile, "write a trace of the --profile-steps to this file: Chrome trace-event JSON (open it in "
                                                  "ui.perfetto.dev or chrome://tracing): the step's phases, each layer's attention, router and "
                                                  "experts, the collectives; CPU: wall clock; CUDA: events on every stream, and NVTX ranges "
                                                  "for nsys. Several ranks: one file per rank, .rank<r> before the extension"},
        {"--profile-steps", "", F_STR, &a->run.profile_steps, "the steps --profile traces: A:B (1-based, inclusive) or A (default 2:3: step 1 warms up; within --steps)"},
        {"--profile-kernels", "", F_BOOL, &a->run.profile_kernels, "with --profile, CUDA: each launch and GEMM of the traced steps a range (calibrate.py --kernels)"},
        {"", "", F_SECTION, NULL, "sampling and --generate"},
        {"--sample-every", "", F_INT, &a->sample.every, "every N steps rank 0 prints a sample continuing --prompt (and logs it) (0: never)"},
        {"--sample-len", "", F_INT, &a->sample.len, "tokens a sample (or --generate) writes at most (it ends early at the end-of-text token)"},
        {"--temperature", "", F_FLOAT, &a->sample.temperature, "sampling temperature (0: greedy, the most likely token)"},
        {"--sample-top-k", "", F_INT, &a->sample.top_k, "sample among the K most likely tokens only (0: all)"},
        {"--sample-seed", "", F_INT, &a->sample.seed, "seed of the sampler (default: --seed)"},
        {"--prompt", "", F_STR, &a->sample.prompt, "text the samples continue, after the end-of-text token that starts every document ('': that token alone)"},
        {"--tokenizer", "", F_STR, &a->sample.tokenizer, "auto | bytes | cl100k: how samples are encoded and decoded (auto: cl100k when --vocab holds "
                                                   "DBRX's 100280 ids, else bytes)"},
        {"--tokenizer-ranks", "", F_STR, &a->sample.tokenizer_ranks, "the cl100k ranks (.tiktoken; dev/data/setup_tiktoken.sh writes the default)"},
        {"--generate", "", F_BOOL, &a->sample.generate, "no training: load --resume DIR or --init-hf DIR, write the continuation of --prompt to stdout (the model's shape from the checkpoint or config.json), exit"},
    };
}

// a flag's value as --help shows its default ("" for a switch)
static std::string flag_value_str(const Flag& f) {
    char b[64];
    switch (f.type) {
    case F_INT: snprintf(b, sizeof b, "%d", *(const int*)f.ptr); return b;
    case F_FLOAT: snprintf(b, sizeof b, "%g", *(const float*)f.ptr); return b;
    case F_SETTING: return dbrx_setting_str(*(const float*)f.ptr);
    case F_STR: return "'" + *(const std::string*)f.ptr + "'";
    default: return "";
    }
}

// every flag by section, with its default: the run's from a fresh TrainArgs, the model's from the default preset
static void print_help(const std::vector<Flag>& flags) {
    TrainArgs d;
    DbrxConfig dc;
    model_preset_lookup(d.run.model.c_str(), &dc);
    std::vector<Flag> defaults = make_flags(&d, &dc);
    printf("usage: [mpirun -np N] ./train_dbrx [flags]    (flags take --flag value or --flag=value)\n");
    for (size_t i = 0; i < flags.size(); i++) {
        const Flag& f = flags[i];
        if (f.type == F_SECTION) { printf("\n%s:\n", f.help); continue; }
        std::string left = std::string(f.alias[0] ? std::string(f.alias) + ", " : "    ") + f.name;
        if (f.type != F_BOOL) left += f.type == F_STR ? " S" : f.type == F_INT ? " N" : f.type == F_SETTING ? " X|off" : " X";
        std::string def = strstr(f.help, "default") ? "" : flag_value_str(defaults[i]);   // (a help that says its default: a sentinel)
        printf("  %-24s %s%s\n", left.c_str(), f.help, def.empty() || def == "''" ? "" : (" [default " + def + "]").c_str());
    }
}

static void set_flag(const Flag& f, const char* value) {
    char* end = NULL;
    errno = 0;
    switch (f.type) {
    case F_INT: {
        long v = strtol(value, &end, 10);
        if (!*value || *end || errno || v < -2147483647L || v > 2147483647L)
            fail(EXIT_BAD_INPUT, "%s expects an integer, got '%s'", f.name, value);
        *(int*)f.ptr = (int)v;
        break;
    }
    case F_FLOAT: {
        float v = strtof(value, &end);
        if (!*value || *end || errno || !std::isfinite(v)) fail(EXIT_BAD_INPUT, "%s expects a number, got '%s'", f.name, value);
        *(float*)f.ptr = v;
        break;
    }
    case F_SETTING: {   // "off" is the only way to say off: 0 or a negative number is refused, never read as off
        if (!strcmp(value, "off")) { *(float*)f.ptr = DBRX_OFF; break; }
        float v = strtof(value, &end);
        if (!*value || *end || errno || !std::isfinite(v) || !(v > 0))
            fail(EXIT_BAD_INPUT, "%s expects a positive number or 'off' (the only way to turn it off), got '%s'", f.name, value);
        *(float*)f.ptr = v;
        break;
    }
    case F_STR: *(std::string*)f.ptr = value; break;
    case F_BOOL: *(bool*)f.ptr = true; break;
    case F_SECTION: break;
    }
}

// --profile-steps A:B or A against --steps (the default: 2:3, within --steps); --profile only for training
static void profile_steps_parse(TrainArgs* a) {
    RunArgs* r = &a->run;
    if (r->profile.empty()) {
        if (!r->profile_steps.empty()) fail(EXIT_BAD_INPUT, "--profile-steps needs --profile");
        if (r->profile_kernels) fail(EXIT_BAD_INPUT, "--profile-kernels needs --profile");
        return;
    }
    const char* other = a->run.dry_run ? "--dry-run" : a->eval.only ? "--eval-only" : a->sample.generate ? "--generate"
                      : a->health.check_only ? "--health-check-only" : NULL;
    if (other) fail(EXIT_BAD_INPUT, "--profile traces training steps: leave out %s", other);
    if (r->profile_steps.empty()) {
        r->profile_first = std::min(2, r->steps);
        r->profile_last = std::min(3, r->steps);
        return;
    }
    int first = 0, last = 0, used = 0;
    const char* v = r->profile_steps.c_str();
    if (sscanf(v, "%d:%d%n", &first, &last, &used) != 2) {   // A alone
        used = 0;
        if (sscanf(v, "%d%n", &first, &used) == 1) last = first;
    }
    bool ok = used > 0 && v[used] == 0 && strspn(v, "0123456789:") == strlen(v);
    if (!ok || first < 1 || last < first)
        fail(EXIT_BAD_INPUT, "--profile-steps '%s' must be A:B with 1 <= A <= B, or A (the steps traced, 1-based)", v);
    if (last > r->steps) fail(EXIT_BAD_INPUT, "--profile-steps %s goes past --steps %d", v, r->steps);
    r->profile_first = first;
    r->profile_last = last;
}

// --context-parallel N (parallel/context_parallel.h): the degree, --seq, what CP does not run yet
static void context_parallel_check(const TrainArgs* a) {
    int cp = a->parallel.context_parallel;
    if (cp < 1) fail(EXIT_BAD_INPUT, "--context-parallel %d must be >= 1", cp);
    if (cp > 1 && a->run.seq % (2 * cp) != 0)
        fail(EXIT_BAD_INPUT, "--context-parallel %d needs --seq divisible by 2 x %d = %d (2N chunks per sequence); --seq is %d", cp, cp, 2 * cp, a->run.seq);
    const char* cp_no = a->sample.generate ? "--generate" : a->sample.every > 0 ? "--sample-every" : !a->eval.mc.empty() ? "--eval-mc"
                      : !a->eval.dump_logits.empty() ? "--dump-logits"
                      : a->health.check || a->health.check_only ? "--health-check" : NULL;
    if (cp > 1 && cp_no)
        fail(EXIT_BAD_INPUT, "--context-parallel %d does not support %s yet (CP runs training, validation and --eval-only's "
             "validation loss; checkpoints do not depend on the CP degree: run it without --context-parallel)", cp, cp_no);
}

// the optimizer's flags (model/adamw.cuh): one line naming the flag, exit 2; sets --optimizer's g_optimizer_lion,
// --adam-moments' g_adam_moments_bf16 and --lr-schedule's g_lr_schedule, g_lr_decay_frac
static void optim_args_check(const OptimArgs* o, bool decay_frac_given) {
    if (!(o->lr > 0)) fail(EXIT_BAD_INPUT, "--lr %g must be positive", o->lr);
    if (o->warmup < 0) fail(EXIT_BAD_INPUT, "--warmup %d must be >= 0", o->warmup);
    if (!(o->lr_floor >= 0 && o->lr_floor <= 1)) fail(EXIT_BAD_INPUT, "--lr-floor %g must be in [0, 1]", o->lr_floor);
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        fail(EXIT_BAD_INPUT, "--beta1 %g and --beta2 %g must be in [0, 1)", o->beta1, o->beta2);
    if (!(o->adam_eps > 0)) fail(EXIT_BAD_INPUT, "--adam-eps %g must be positive", o->adam_eps);
    if (o->adam_moments != "fp32" && o->adam_moments != "bf16")
        fail(EXIT_BAD_INPUT, "--adam-moments '%s' must be fp32 or bf16", o->adam_moments.c_str());
    g_adam_moments_bf16 = o->adam_moments == "bf16";
    if (o->optimizer != "adamw" && o->optimizer != "lion")
        fail(EXIT_BAD_INPUT, "--optimizer '%s' must be adamw or lion", o->optimizer.c_str());
    g_optimizer_lion = o->optimizer == "lion";
    if (!(o->weight_decay >= 0)) fail(EXIT_BAD_INPUT, "--weight-decay %g must be >= 0", o->weight_decay);
    g_lr_schedule = -1;
    for (int k = 0; k < (int)(sizeof LR_SCHEDULE_NAMES / sizeof *LR_SCHEDULE_NAMES); k++)
        if (o->lr_schedule == LR_SCHEDULE_NAMES[k]) g_lr_schedule = k;
    if (g_lr_schedule < 0) fail(EXIT_BAD_INPUT, "--lr-schedule '%s' must be cosine, linear, constant, wsd or wsd-sqrt", o->lr_schedule.c_str());
    if (!(o->lr_decay_frac > 0 && o->lr_decay_frac <= 1)) fail(EXIT_BAD_INPUT, "--lr-decay-frac %g must be in (0, 1]", o->lr_decay_frac);
    g_lr_decay_frac = o->lr_decay_frac;
    if (decay_frac_given && g_lr_schedule != LR_WSD && g_lr_schedule != LR_WSD_SQRT)
        fail(EXIT_BAD_INPUT, "--lr-decay-frac needs --lr-schedule wsd or wsd-sqrt (the '%s' schedule has no decay phase of its own)",
             o->lr_schedule.c_str());
}

// the parallelism flags' values (parallel/README.md): one line naming the flag, exit 2
static void parallel_args_check(const TrainArgs* a) {
    if (a->parallel.shard_group_size < 0) fail(EXIT_BAD_INPUT, "--shard-group-size %d must be >= 0", a->parallel.shard_group_size);
    if (!(a->parallel.zero_chunk_mib >= 0) || a->parallel.zero_chunk_mib > 1048576)
        fail(EXIT_BAD_INPUT, "--zero-chunk-mib %g must be in [0, 1048576] (MiB of BF16 weights per experts chunk; 0: whole units)",
             a->parallel.zero_chunk_mib);
    if (a->parallel.zero_prefetch < 0 || a->parallel.zero_prefetch > 2)
        fail(EXIT_BAD_INPUT, "--zero-prefetch %d must be in [0, 2] (units gathered during the optimizer, one per working slot; 0: none)",
             a->parallel.zero_prefetch);
    if (a->parallel.expert_parallel < 1) fail(EXIT_BAD_INPUT, "--expert-parallel %d must be >= 1", a->parallel.expert_parallel);
    if (a->parallel.ep_layout != "packed" && a->parallel.ep_layout != "spread")
        fail(EXIT_BAD_INPUT, "--ep-layout '%s' must be packed or spread", a->parallel.ep_layout.c_str());
    if (!(a->parallel.ep_capacity >= 0) || a->parallel.ep_capacity > 1e6)
        fail(EXIT_BAD_INPUT, "--ep-capacity-factor %g must be in [0, 1e6] (0: the dropless bound)", a->parallel.ep_capacity);
    if (a->parallel.ep_chunks < 1 || a->parallel.ep_chunks > 64)
        fail(EXIT_BAD_INPUT, "--ep-overlap-chunks %d must be in [1, 64] (1: the exchange in one piece)", a->parallel.ep_chunks);
    if (a->parallel.nccl_ctas_internode < 0 || a->parallel.nccl_ctas_internode > 32)
        fail(EXIT_BAD_INPUT, "--nccl-ctas-internode %d must be in [0, 32] (0: NCCL's choice)", a->parallel.nccl_ctas_internode);
    if (a->parallel.zero_embedding != "rows" && a->parallel.zero_embedding != "gather")
        fail(EXIT_BAD_INPUT, "--zero-embedding '%s' must be rows or gather", a->parallel.zero_embedding.c_str());
    g_zero_embedding_rows = a->parallel.zero_embedding == "rows";   // (parallel/zero.h: the memory plan reads it too)
    if (a->parallel.grad_reduce_dtype != "fp32" && a->parallel.grad_reduce_dtype != "bf16")
        fail(EXIT_BAD_INPUT, "--grad-reduce-dtype '%s' must be fp32 or bf16", a->parallel.grad_reduce_dtype.c_str());
    if (!(a->parallel.comm_timeout >= 0)) fail(EXIT_BAD_INPUT, "--comm-timeout %g must be >= 0 (0: auto)", a->parallel.comm_timeout);
    context_parallel_check(a);
}

// the GPU step's kernel choices: --moe-gemm, --moe-streams, --attention-bwd
static void gpu_step_args_check(const RunArgs* r) {
    if (r->moe_gemm != "cublaslt" && r->moe_gemm != "grouped") fail(EXIT_BAD_INPUT, "--moe-gemm '%s' must be cublaslt or grouped", r->moe_gemm.c_str());
    if (r->moe_streams != 1 && r->moe_streams != 2) fail(EXIT_BAD_INPUT, "--moe-streams %d must be 1 or 2", r->moe_streams);
    if (r->attention_bwd != "auto" && r->attention_bwd != "mma" && r->attention_bwd != "wgmma" && r->attention_bwd != "wgmma-overlap")
        fail(EXIT_BAD_INPUT, "--attention-bwd '%s' must be auto, mma, wgmma or wgmma-overlap", r->attention_bwd.c_str());
}

// Two passes: the preset first (so it can be named anywhere), then every flag over it.
// base: the model to start from instead of --model's preset (--generate: the checkpoint's), NULL: the preset
static void parse_args(int argc, char** argv, TrainArgs* a, DbrxConfig* c, const DbrxConfig* base = NULL) {
    std::vector<Flag> flags = make_flags(a, c);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 1; i < argc; i++) {
            std::string arg = argv[i], value;
            bool has_inline = false;
            size_t eq = arg.find('=');
            if (arg.rfind("--", 0) == 0 && eq != std::string::npos) { value = arg.substr(eq + 1); arg = arg.substr(0, eq); has_inline = true; }
            const Flag* f = NULL;
            for (const Flag& g : flags) if (g.type != F_SECTION && (arg == g.name || (g.alias[0] && arg == g.alias))) f = &g;
            if (!f) fail(EXIT_BAD_INPUT, "unknown flag '%s' (see --help)", argv[i]);
            if (f->type == F_BOOL) {
                if (has_inline) fail(EXIT_BAD_INPUT, "%s takes no value", f->name);
                if (pass == 1) set_flag(*f, "");
                continue;
            }
            if (!has_inline) {
                if (i + 1 >= argc) fail(EXIT_BAD_INPUT, "%s needs a value", f->name);
                value = argv[++i];
            }
            bool is_model = (f->ptr == &a->run.model);
            if (pass == 0 && is_model) set_flag(*f, value.c_str());
            if (pass == 1 && !is_model) { set_flag(*f, value.c_str()); a->given.push_back(f->name); }
        }
        if (pass == 0) {
            if (a->run.help) break;
            if (base) { *c = *base; continue; }
            if (!model_preset_lookup(a->run.model.c_str(), c)) {
                const ModelPreset* p;
                int n = model_presets(&p);
                std::string names;
                for (int j = 0; j < n; j++) names += std::string(j ? ", " : "") + p[j].name;
                fail(EXIT_BAD_INPUT, "unknown --model '%s' (presets: %s)", a->run.model.c_str(), names.c_str());
            }
        }
    }
    // help is a flag of pass 1; look for it directly so that --help works with any other flags
    for (int i = 1; i < argc; i++) if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) a->run.help = true;
    if (a->run.help) { print_help(flags); exit(0); }
    for (int i = 1; i < argc; i++) if (!strcmp(argv[i], "--help-debug")) { debug_hooks_print(); exit(0); }
    c->head_dim = c->d_model / (c->n_heads > 0 ? c->n_heads : 1);
    config_validate(c);   // the model first: a run flag's default may derive from it (--seq from --max-seq)
    // --seq left out: the model's max_seq, at most 2048. Given, it must be positive (0 is no sentinel)
    if (!flag_given(a, "--seq")) a->run.seq = c->max_seq_len < 2048 ? c->max_seq_len : 2048;
    if (a->run.steps <= 0) fail(EXIT_BAD_INPUT, "--steps %d must be positive", a->run.steps);
    if (a->run.batch <= 0) fail(EXIT_BAD_INPUT, "--batch %d must be positive", a->run.batch);
    if (a->run.seq <= 0) fail(EXIT_BAD_INPUT, "--seq %d must be positive", a->run.seq);
    if (a->run.grad_accum <= 0) fail(EXIT_BAD_INPUT, "--grad-accum %d must be positive", a->run.grad_accum);
    optim_args_check(&a->optim, flag_given(a, "--lr-decay-frac"));
    if (a->eval.val_every < 0) fail(EXIT_BAD_INPUT, "--val-every %d must be >= 0", a->eval.val_every);
    if (a->eval.val_steps <= 0) fail(EXIT_BAD_INPUT, "--val-steps %d must be positive", a->eval.val_steps);
    if (a->run.peak_tflops < 0) fail(EXIT_BAD_INPUT, "--peak-tflops %g must be >= 0", a->run.peak_tflops);
    fp8_recipe_parse(a->fp8.recipe.c_str());
    g_recompute = recompute_parse(a->run.recompute);   // (its layers are checked against the model's when it is sized)
    g_compress = recompute_parse(a->run.compress_acts, "--compress-acts", RC_COMPRESS_GRANS);
    gpu_step_args_check(&a->run);
    if (a->run.doc_mask < -1 || a->run.doc_mask >= c->vocab_size)
        fail(EXIT_BAD_INPUT, "--doc-mask %d must be an end-of-text token id in [0, %d) (--vocab), or -1 (off)", a->run.doc_mask, c->vocab_size);
    g_doc_mask_eot = a->run.doc_mask;
    if (a->run.init != "hf" && a->run.init != "foundry") fail(EXIT_BAD_INPUT, "--init '%s' must be hf or foundry", a->run.init.c_str());
    if (a->run.init == "foundry" && flag_given(a, "--init-std")) fail(EXIT_BAD_INPUT, "--init-std is --init hf's: --init foundry takes sqrt(2 / fan_in)");
    g_init_foundry = a->run.init == "foundry";
    if (a->run.gemm_autotune < 0 || a->run.gemm_autotune > 16)
        fail(EXIT_BAD_INPUT, "--gemm-autotune %d must be 0 (off) to 16 (the heuristic's answers to time)", a->run.gemm_autotune);
    if (a->run.moe_gemm == "grouped" && (fp8_recipe_parse(a->fp8.recipe.c_str()) != FP8_OFF || a->parallel.expert_parallel > 1))
        fail(EXIT_BAD_INPUT, "--moe-gemm grouped: BF16 without expert parallelism for now (--fp8 %s, --expert-parallel %d)",
             a->fp8.recipe.c_str(), a->parallel.expert_parallel);
    g_compress_format = a->run.compress_format == "bf16" ? 1 : a->run.compress_format == "e4m3" ? 0 :
                        (fail(EXIT_BAD_INPUT, "--compress-format '%s' must be e4m3 or bf16", a->run.compress_format.c_str()), 0);
    if (a->fp8.history < 1 || a->fp8.history > FP8_MAX_HISTORY)
        fail(EXIT_BAD_INPUT, "--fp8-amax-history %d must be in [1, %d]", a->fp8.history, FP8_MAX_HISTORY);
    // a scale backed off by more than 2^64 is below any amax's reciprocal that float holds: all zeros
    if (a->fp8.margin < 0 || a->fp8.margin > 64) fail(EXIT_BAD_INPUT, "--fp8-margin %d must be in [0, 64]", a->fp8.margin);
    if (a->fp8.log_every < 0) fail(EXIT_BAD_INPUT, "--fp8-log-every %d must be >= 0", a->fp8.log_every);
    if (a->eval.every < 0) fail(EXIT_BAD_INPUT, "--eval-every %d must be >= 0 (0: only at the end)", a->eval.every);
    if (a->eval.mc.empty() && (flag_given(a, "--eval-every") || !a->eval.mc_dump.empty()))
        fail(EXIT_BAD_INPUT, "%s needs --eval-mc", flag_given(a, "--eval-every") ? "--eval-every" : "--eval-mc-dump");
    if (!flag_given(a, "--eval-every")) a->eval.every = a->eval.val_every;
    if (a->run.log_every_experts < 0) fail(EXIT_BAD_INPUT, "--log-every-experts %d must be >= 0", a->run.log_every_experts);
    if (a->run.log_every_experts > 0 && a->run.log.empty()) fail(EXIT_BAD_INPUT, "--log-every-experts needs --log (the counts go to the JSONL log)");
    if (a->fp8.gather && a->fp8.recipe == "off") fail(EXIT_BAD_INPUT, "--fp8-gather needs --fp8 delayed|current|block");
    parallel_args_check(a);
    if (a->ckpt.every < 0 || a->ckpt.keep < 1 || a->ckpt.keep_every < 0)
        fail(EXIT_BAD_INPUT, "--ckpt-every %d and --ckpt-keep-every %d must be >= 0, --ckpt-keep %d >= 1", a->ckpt.every,
             a->ckpt.keep_every, a->ckpt.keep);
    if (a->ckpt.every > 0 && a->ckpt.dir.empty()) fail(EXIT_BAD_INPUT, "--ckpt-every needs --ckpt-dir");
    if (a->ckpt.resume == "auto" && a->ckpt.dir.empty()) fail(EXIT_BAD_INPUT, "--resume auto needs --ckpt-dir");
    if (flag_given(a, "--stop-after") && a->run.stop_after < 0) fail(EXIT_BAD_INPUT, "--stop-after %d must be >= 0", a->run.stop_after);
    if (flag_given(a, "--data-seed") && a->data.seed < 0)
        fail(EXIT_BAD_INPUT, "--data-seed %d must be >= 0 (leave it out to use --seed)", a->data.seed);
    if (a->ckpt.confirm < 0) fail(EXIT_BAD_INPUT, "--ckpt-confirm %d must be >= 0", a->ckpt.confirm);
    if (!(a->guard.loss_sigma >= 0)) fail(EXIT_BAD_INPUT, "--spike-loss-sigma %g must be >= 0 (0: off)", a->guard.loss_sigma);
    if (!(a->guard.loss_rise >= 0)) fail(EXIT_BAD_INPUT, "--spike-loss-rise %g must be >= 0", a->guard.loss_rise);
    if (!(a->guard.gnorm_factor == 0 || a->guard.gnorm_factor > 1))
        fail(EXIT_BAD_INPUT, "--spike-gnorm-factor %g must be 0 (off) or > 1", a->guard.gnorm_factor);
    if (a->guard.window < 1 || a->guard.max_skips < 1)
        fail(EXIT_BAD_INPUT, "--spike-window %d and --max-skips %d must be >= 1", a->guard.window, a->guard.max_skips);
    if (a->ckpt.export_dtype != "bf16" && a->ckpt.export_dtype != "fp32") fail(EXIT_BAD_INPUT, "--export-dtype '%s' must be bf16 or fp32", a->ckpt.export_dtype.c_str());
    // (at most a petabyte: the byte count is converted to 64 bits)
    if (!(a->ckpt.export_max_file_gb > 0 && a->ckpt.export_max_file_gb <= 1e6))
        fail(EXIT_BAD_INPUT, "--export-max-file-gb %g must be in (0, 1e6]", a->ckpt.export_max_file_gb);
    if (!a->eval.dump_logits.empty() && a->data.val.empty()) fail(EXIT_BAD_INPUT, "--dump-logits needs --val-data");
    if (a->run.device != "auto" && a->run.device != "cpu" && a->run.device != "cuda")
        fail(EXIT_BAD_INPUT, "--device '%s' must be auto, cpu or cuda", a->run.device.c_str());
    if (!(a->health.min_tflops >= 0)) fail(EXIT_BAD_INPUT, "--health-min-tflops %g must be >= 0 (0: the device's default)", a->health.min_tflops);
    if (!(a->health.gemm_ratio > 0 && a->health.gemm_ratio <= 1))
        fail(EXIT_BAD_INPUT, "--health-gemm-ratio %g must be in (0, 1]", a->health.gemm_ratio);
    if (!(a->health.min_busbw >= 0)) fail(EXIT_BAD_INPUT, "--health-min-busbw %g must be >= 0 (0: no bound)", a->health.min_busbw);
    if (a->health.gemm_size != 0 && (a->health.gemm_size < 16 || a->health.gemm_size > 32768 || a->health.gemm_size % 16))
        fail(EXIT_BAD_INPUT, "--health-gemm-size %d must be 0 (the default) or a multiple of 16 in [16, 32768]", a->health.gemm_size);
    if (a->health.comm_mib < 1 || a->health.comm_mib > 65536) fail(EXIT_BAD_INPUT, "--health-comm-mib %d must be in [1, 65536]", a->health.comm_mib);
    if (a->sample.every < 0) fail(EXIT_BAD_INPUT, "--sample-every %d must be >= 0 (0: never)", a->sample.every);
    if (a->sample.len <= 0) fail(EXIT_BAD_INPUT, "--sample-len %d must be positive", a->sample.len);
    if (!(a->sample.temperature >= 0)) fail(EXIT_BAD_INPUT, "--temperature %g must be >= 0 (0: greedy)", a->sample.temperature);
    if (a->sample.top_k < 0) fail(EXIT_BAD_INPUT, "--sample-top-k %d must be >= 0 (0: all tokens)", a->sample.top_k);
    if (flag_given(a, "--sample-seed") && a->sample.seed < 0)
        fail(EXIT_BAD_INPUT, "--sample-seed %d must be >= 0 (leave it out to use --seed)", a->sample.seed);
    if (a->sample.tokenizer != "auto" && a->sample.tokenizer != "bytes" && a->sample.tokenizer != "cl100k")
        fail(EXIT_BAD_INPUT, "--tokenizer '%s' must be auto, bytes or cl100k", a->sample.tokenizer.c_str());
    if (a->sample.generate && a->ckpt.resume.empty() && a->ckpt.init_hf.empty())
        fail(EXIT_BAD_INPUT, "--generate needs the weights: --resume DIR (a checkpoint) or --init-hf DIR (a Hugging Face export)");
    if (a->sample.generate && !a->ckpt.resume.empty() && !a->ckpt.init_hf.empty())
        fail(EXIT_BAD_INPUT, "--generate takes one source of weights: --resume or --init-hf, not both");
    if (a->eval.only) {
        if (a->ckpt.resume.empty() == a->ckpt.init_hf.empty())
            fail(EXIT_BAD_INPUT, "--eval-only needs one source of weights: --resume DIR|auto (a checkpoint) or --init-hf DIR (a Hugging Face export)");
        if (a->data.val.empty() && a->eval.mc.empty()) fail(EXIT_BAD_INPUT, "--eval-only has nothing to evaluate: --val-data is '' and no --eval-mc");
        const char* other = a->sample.generate ? "--generate" : a->health.check || a->health.check_only ? "--health-check"
                          : a->run.dry_run ? "--dry-run" : !a->ckpt.export_hf.empty() ? "--export-hf" : !a->eval.dump_logits.empty() ? "--dump-logits"
                          : flag_given(a, "--stop-after") ? "--stop-after" : NULL;
        if (other) fail(EXIT_BAD_INPUT, "--eval-only runs no training: leave out %s", other);
    }
    if (a->sample.generate && (a->health.check || a->health.check_only || a->run.dry_run))
        fail(EXIT_BAD_INPUT, "--generate runs no training: leave out %s", a->run.dry_run ? "--dry-run" : "--health-check");
    profile_steps_parse(a);
    if (!a->run.dry_run && a->run.fit) fail(EXIT_BAD_INPUT, "--fit plans a run: give it with --dry-run");
    if (flag_given(a, "--fit-headroom") && (!a->run.fit || !(a->run.fit_headroom >= 0.0f && a->run.fit_headroom < 1e6f)))
        fail(EXIT_BAD_INPUT, "--fit-headroom %g: needs --fit and a number of GiB >= 0", a->run.fit_headroom);
    if (!a->run.dry_run && (flag_given(a, "--plan-device") || flag_given(a, "--plan-gpus")))
        fail(EXIT_BAD_INPUT, "%s plans a run: it needs --dry-run", flag_given(a, "--plan-device") ? "--plan-device" : "--plan-gpus");
    if (flag_given(a, "--plan-gpus") && a->run.plan_gpus < 1) fail(EXIT_BAD_INPUT, "--plan-gpus %d must be >= 1", a->run.plan_gpus);
    if (!a->health.check && !a->health.check_only) {   // a bound without the check would be silently ignored
        const char* orphan = a->health.min_tflops != 0 ? "--health-min-tflops" : a->health.min_busbw != 0 ? "--health-min-busbw"
                           : a->health.gemm_size != 0 ? "--health-gemm-size" : a->health.comm_mib != 16 ? "--health-comm-mib" : NULL;
        if (orphan) fail(EXIT_BAD_INPUT, "%s needs --health-check or --health-check-only", orphan);
    }
}

// ---------------------------------------------------------------------------------------------
// Every output path, before step 1 (run_main: rank 0 looks, every rank exits 2 with its verdict): what is
// written only after training (--export-hf, --dump-logits) or at its first line (--log, --eval-mc-dump)
// must not fail after hours of it. Nothing is left behind: a file that does not exist yet is created
// (O_EXCL) and removed, one that exists is opened for appending and not written; a directory to create
// (--export-hf) is probed with a file in the nearest directory that exists.

// "" or why a file cannot be written at path
static std::string output_file_problem(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) return "it is a directory";
        int fd = open(path.c_str(), O_WRONLY | O_APPEND);
        if (fd < 0) return std::string("it cannot be written (") + strerror(errno) + ")";
        close(fd);
        return "";
    }
    if (errno == ENOTDIR) return "a directory of the path is a file";
    if (errno != ENOENT) return std::string("stat: ") + strerror(errno);
    size_t slash = path.find_last_of('/');
    std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (stat(dir.c_str(), &st) != 0) return "the directory " + dir + " does not exist";
    if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return std::string("it cannot be created (") + strerror(errno) + ")";
    close(fd);
    if (unlink(path.c_str()) != 0) return std::string("the test file could not be removed (") + strerror(errno) + ")";
    return "";
}

// "" or why the directory at path cannot be created or written in
static std::string output_dir_problem(const std::string& path) {
    std::string d = path;
    struct stat st;
    while (stat(d.c_str(), &st) != 0) {   // the nearest directory that exists (the export creates the rest)
        if (errno == ENOTDIR) return "a directory of the path is a file";
        if (errno != ENOENT) return std::string("stat ") + d + ": " + strerror(errno);
        while (d.size() > 1 && d.back() == '/') d.pop_back();
        size_t slash = d.find_last_of('/');
        d = slash == std::string::npos ? "." : slash == 0 ? "/" : d.substr(0, slash);
    }
    if (!S_ISDIR(st.st_mode)) return (d == path ? std::string("it") : d) + " exists and is not a directory";
    std::string probe = output_file_problem(d + "/.probe-" + std::to_string((long long)getpid()));
    return probe.empty() ? "" : "no file can be written in " + d + " (" + probe + ")";
}

// the first output flag whose path is unusable: "--flag PATH: why", or ""
static std::string output_paths_problem(const TrainArgs& a) {
    const struct { const char* flag; const std::string& path; bool dir; } outs[] = {
        {"--log", a.run.log, false}, {"--profile", a.run.profile, false}, {"--eval-mc-dump", a.eval.mc_dump, false}, {"--dump-logits", a.eval.dump_logits, false},
        {"--export-hf", a.ckpt.export_hf, true}};
    for (const auto& o : outs) {
        if (o.path.empty()) continue;
        std::string why = o.dir ? output_dir_problem(o.path) : output_file_problem(o.path);
        if (!why.empty()) return std::string(o.flag) + " " + o.path + ": " + why;
    }
    return "";
}

// the first flag given that only the CUDA step takes ("" if none): a CPU run refuses it in one line (train_dbrx.cu)
static inline std::string cuda_only_flag(const TrainArgs& a) {
    return a.run.profile_kernels ? "--profile-kernels" : a.run.moe_gemm != "cublaslt" ? "--moe-gemm " + a.run.moe_gemm
         : a.run.attention_bwd != "auto" && a.run.attention_bwd != "mma" ? "--attention-bwd " + a.run.attention_bwd
         : a.run.moe_streams != 2 ? "--moe-streams " + std::to_string(a.run.moe_streams)
         : a.run.gemm_autotune > 1 ? "--gemm-autotune " + std::to_string(a.run.gemm_autotune)
         : a.parallel.nccl_ctas_internode > 0 ? "--nccl-ctas-internode " + std::to_string(a.parallel.nccl_ctas_internode) : "";
}
