/*
 * bench_step.cpp — tokens/s of one full training step of the CPU reference backend:
 *   dbrx_zero_grad + dbrx_forward + dbrx_backward(dloss 1.0) + dbrx_update (AdamW, clip 1.0)
 * on random token batches (B, T), deterministic from --seed. --warmup-steps untimed steps, then
 * --steps timed ones; prints the median ms/step (and its fwd / bwd / update split) and tokens/s,
 * and one last machine-readable line:
 *   RESULT impl=train_dbrx tok_per_s=<x> ms_per_step=<y>
 * The PyTorch counterpart is dev/bench/torch_step.py; dev/bench/bench_cpu_vs_torch.sh runs both.
 *
 *   g++ -std=c++17 -O3 -march=native -fopenmp -Wall -Wextra -Werror -o dev/bench/bench_step \
 *       dev/bench/bench_step.cpp -lopenblas -lm
 *   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 ./dev/bench/bench_step --model dbrx-tiny --batch 8 --seq 256
 */
#include <omp.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../../model/common.h"
#include "../../model/config.h"
#include "../../model/dbrx.h"

typedef struct {
    std::string model = "dbrx-tiny";
    int batch = 8, seq = 256, steps = 10, warmup_steps = 2, seed = 1337;
    bool torch_flags = false;
} BenchArgs;

static void usage(void) {
    printf("usage: bench_step [--model NAME] [--batch B] [--seq T] [--steps N] [--warmup-steps W] [--seed S]\n"
           "  --model         preset (default dbrx-tiny)\n"
           "  --batch         sequences per step (default 8)\n"
           "  --seq           tokens per sequence (default 256)\n"
           "  --steps         timed steps (default 10)\n"
           "  --warmup-steps  untimed steps before them (default 2)\n"
           "  --seed          model init and token stream seed (default 1337)\n"
           "  --torch-flags   print the preset as torch_step.py flags and exit\n"
           "threads: OMP_NUM_THREADS (and OPENBLAS_NUM_THREADS for the GEMMs)\n");
}

static int parse_int(const char* flag, const char* value, int min) {
    char* end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (!*value || *end || errno || v < min || v > 2147483647L)
        fail(EXIT_BAD_INPUT, "%s expects an integer >= %d, got '%s'", flag, min, value);
    return (int)v;
}

static void parse_args(int argc, char** argv, BenchArgs* a) {
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i], value;
        if (arg == "--help" || arg == "-h") { usage(); exit(0); }
        if (arg == "--torch-flags") { a->torch_flags = true; continue; }
        size_t eq = arg.find('=');
        bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
        if (inline_value) { value = arg.substr(eq + 1); arg = arg.substr(0, eq); }
        bool known = arg == "--model" || arg == "--batch" || arg == "--seq" || arg == "--steps" ||
                     arg == "--warmup-steps" || arg == "--seed";
        if (!known) fail(EXIT_BAD_INPUT, "unknown flag '%s' (see --help)", argv[i]);
        if (!inline_value) {
            if (i + 1 >= argc) fail(EXIT_BAD_INPUT, "%s needs a value", arg.c_str());
            value = argv[++i];
        }
        if (arg == "--model") a->model = value;
        else if (arg == "--batch") a->batch = parse_int("--batch", value.c_str(), 1);
        else if (arg == "--seq") a->seq = parse_int("--seq", value.c_str(), 1);
        else if (arg == "--steps") a->steps = parse_int("--steps", value.c_str(), 1);
        else if (arg == "--warmup-steps") a->warmup_steps = parse_int("--warmup-steps", value.c_str(), 0);
        else a->seed = parse_int("--seed", value.c_str(), 0);
    }
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv) {
    BenchArgs args;
    parse_args(argc, argv, &args);
    DbrxConfig cfg;
    if (!model_preset_lookup(args.model.c_str(), &cfg)) {
        const ModelPreset* p;
        int n = model_presets(&p);
        std::string names;
        for (int j = 0; j < n; j++) names += std::string(j ? ", " : "") + p[j].name;
        fail(EXIT_BAD_INPUT, "unknown --model '%s' (presets: %s)", args.model.c_str(), names.c_str());
    }
    int B = args.batch, T = args.seq, V = cfg.vocab_size;
    if (args.torch_flags) {   // the same model for dev/bench/torch_step.py
        printf("--d-model %d --n-heads %d --kv-heads %d --n-layers %d --ffn-hidden %d --experts %d --top-k %d "
               "--vocab %d --rope-theta %g --clip-qkv %g --ln-eps %g --moe-loss-weight %g --init-std %g\n",
               cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.n_layers, cfg.ffn_hidden, cfg.n_experts, cfg.top_k, V,
               cfg.rope_theta, cfg.clip_qkv, cfg.ln_eps, cfg.moe_loss_weight, cfg.init_std);
        return 0;
    }
    size_t N = (size_t)B * T;
    if (N > 2147483647ull / 64) fail(EXIT_BAD_INPUT, "--batch %d x --seq %d is too many tokens", B, T);

    Dbrx model;
    dbrx_build(&model, &cfg, B, T, (uint64_t)args.seed);
    printf("bench_step: %s (d %d, heads %d, kv %d, layers %d, ffn %d, experts %d top-%d, vocab %d), "
           "%.2fM params; batch %d x seq %d = %zu tokens/step; %d OpenMP thread(s); %d warmup + %d timed steps\n",
           args.model.c_str(), cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.n_layers, cfg.ffn_hidden, cfg.n_experts,
           cfg.top_k, V, model.num_params / 1e6, B, T, N, omp_get_max_threads(), args.warmup_steps, args.steps);

    // train_dbrx's optimizer defaults: lr 2e-3 (constant here), betas 0.9/0.95, eps 1e-8, wd 0.1, clip 1.0
    AdamWConfig opt = {2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    std::vector<int> inputs(N), targets(N), seqbuf(T + 1);   // (B, T) each; one (T+1) stream per row
    Rng rng = {(uint64_t)args.seed ^ 0xB0BA7E57ull};
    std::vector<double> t_step, t_fwd, t_bwd, t_upd;
    int total = args.warmup_steps + args.steps;
    for (int s = 0; s < total; s++) {
        for (int b = 0; b < B; b++) {   // next-token pairs from a random stream (untimed)
            for (int t = 0; t <= T; t++) seqbuf[t] = (int)(rng_u64(&rng) % (uint64_t)V);
            for (int t = 0; t < T; t++) { inputs[(size_t)b * T + t] = seqbuf[t]; targets[(size_t)b * T + t] = seqbuf[t + 1]; }
        }
        double t0 = now_seconds();
        dbrx_zero_grad(&model);
        double loss = dbrx_forward(&model, inputs.data(), targets.data());
        double t1 = now_seconds();
        dbrx_backward(&model, inputs.data(), targets.data(), 1.0f);
        double t2 = now_seconds();
        double gnorm = dbrx_update(&model, &opt, opt.lr, s + 1);
        double t3 = now_seconds();
        if (!std::isfinite(loss) || !std::isfinite(gnorm))
            fail(EXIT_RUNTIME, "step %d: loss %g / grad norm %g is not finite", s + 1, loss, gnorm);
        bool timed = s >= args.warmup_steps;
        printf("%s %3d | loss %.4f | lbl %.5f | gnorm %.3f | %8.2f ms (fwd %.2f, bwd %.2f, update %.2f)\n",
               timed ? "step  " : "warmup", timed ? s - args.warmup_steps + 1 : s + 1, loss, model.lbl_loss, gnorm,
               (t3 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3);
        if (timed) { t_step.push_back(t3 - t0); t_fwd.push_back(t1 - t0); t_bwd.push_back(t2 - t1); t_upd.push_back(t3 - t2); }
    }
    double ms = median(t_step) * 1e3, tok_s = (double)N / median(t_step);
    double fpt = flops_per_token(&cfg, T);
    printf("median of %d steps: %.2f ms/step (zero_grad+fwd %.2f, bwd %.2f, update %.2f), %.1f tok/s, %.2f GFLOP/s "
           "(%.4g FLOPs/token, 6 N_active + 12 L d S)\n",
           args.steps, ms, median(t_fwd) * 1e3, median(t_bwd) * 1e3, median(t_upd) * 1e3, tok_s, fpt * tok_s / 1e9, fpt);
    printf("RESULT impl=train_dbrx tok_per_s=%.1f ms_per_step=%.3f\n", tok_s, ms);
    dbrx_free(&model);
    return 0;
}
