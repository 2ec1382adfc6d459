/*
 * train_cuda.cuh — what is truly CUDA-specific in train_dbrx: the device set-up. One process per GPU
 * (which one: parallel/gpu_select.h, for any visibility: mpirun, srun, one GPU per task; its peak for
 * MFU: model/gpu_peak.h); the FP8 capability checks; the model (model/dbrx_cuda.cuh) and its parameter
 * store (parallel/zero_gpu.cuh: ZeRO-3/HSDP or data parallel over NCCL, the state in device memory);
 * then the one training loop of train_dbrx.cu (train). Included by train_dbrx.cu when the build has
 * CUDA: nvcc, or g++ with -DSIMT_EMULATION (train_dbrx_emu: the same code on the SIMT emulator, the
 * NCCL calls on the NCCL twin, for the tests).
 */
#pragma once
#include "model/dbrx_cuda.cuh"
#include "parallel/zero_gpu.cuh"
#include "parallel/context_parallel_cuda.cuh"
#include "model/gpu_peak.h"

// one GPU's dense BF16 peak (the MFU denominator; 0 if unknown), from its name, SMs and clock (model/gpu_peak.h)
static double gpu_peak_flops(const cudaDeviceProp& prop, int dev, std::string* how) {
    int khz = 0;
    cudaCheck(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
    return gpu_peak_bf16_dense(prop.name, prop.multiProcessorCount, khz, how);
}

// --fp8-gather: the store gathers the blocks' FP8 weights as E4M3 codes (parallel/zero_gpu_fp8.cuh), which the model's
// GEMMs read as they are; the model was built without a weight scratch where the store turns it on (fp8.weights_quantized)
static void fp8_gather_enable(ZeroGpu* store, const Fp8Config& fp8, const Comm& comm) {
    int on = zero_enable_fp8_gather(store);
    ENSURE(on == fp8.weights_quantized, "internal error: --fp8-gather is %s in the store, %s in the model", on ? "on" : "off",
           fp8.weights_quantized ? "on" : "off");
    if (on)
        printf("zero: rank %d: --fp8-gather: block weights gathered as E4M3 codes, the norms and router as BF16\n", comm.rank);
    else if (comm.rank == 0)
        printf("note: --fp8-gather has no effect with --shard-group-size 1: every rank holds its units whole (with --expert-parallel, "
               "its experts), nothing is gathered\n");
}

static int train_cuda(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, const char* why) {
    // one process per GPU, picked by parallel/gpu_select.h's rule (the NCCL world uses the same)
    std::string dev_how;
    int dev = comm_select_gpu(&comm, &dev_how);
    matmul_pins().device_run = true;   // this run's GEMMs go through cuBLASLt: its checkpoints carry their algorithms
    matmul_pins_name_library();        // (which cuBLASLt: a resumed checkpoint's table is checked against it)
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    if (comm.rank == 0) {
        printf("device: cuda:%d %s (%.1f GiB)%s, %d rank(s), one GPU each\n", dev, prop.name, prop.totalGlobalMem / 1073741824.0, why,
               comm.world);
        print_config(args.run.model.c_str(), &cfg);
    }
    printf("gpu: rank %d: %s\n", comm.rank, dev_how.c_str());

    // --fp8: the block GEMMs in FP8 (model/dbrx_fp8_cuda.cuh); refused where the device cannot
    Fp8Config fp8 = {fp8_recipe_parse(args.fp8.recipe.c_str()), args.fp8.history, args.fp8.margin, 0};
    if (fp8.recipe != FP8_OFF) {
        if (prop.major * 10 + prop.minor < 89)
            fail(EXIT_BAD_INPUT, "--fp8 %s: FP8 GEMMs need an sm_89 or newer GPU (Ada, Hopper); this one is sm_%d%d: use --fp8 off",
                 args.fp8.recipe.c_str(), prop.major, prop.minor);
        std::string why_not;
        if (fp8.recipe == FP8_BLOCK && !matmul_fp8_block_supported(&why_not)) fail(EXIT_BAD_INPUT, "--fp8 block: %s", why_not.c_str());
        if (comm.rank == 0)
            printf("fp8: %s scaling on the block GEMMs (Wqkv, out_proj, experts w1/v1/w2; forward, dgrad, wgrad): E4M3 weights "
                   "and activations, E5M2 gradients%s\n", args.fp8.recipe.c_str(),
                   fp8.recipe == FP8_DELAYED ? (", amax history " + std::to_string(fp8.history_len) + ", margin " + std::to_string(fp8.margin)).c_str()
                   : fp8.recipe == FP8_CURRENT ? (", margin " + std::to_string(fp8.margin)).c_str() : ", 1x128 activation / gradient tiles, 128x128 weight blocks");
    }

    // --moe-gemm grouped: the experts' forward and data gradients on model/moe_grouped_tma.cuh's kernels (sm_90a: TMA,
    // wgmma), if the shapes fit them
    g_moe_grouped = args.run.moe_gemm == "grouped";
    g_moe_streams = args.run.moe_streams;   // (model/moe.cuh: the per-expert GEMMs on 2 streams, the same bits)
    if (g_moe_grouped) {
        std::string unfit = moe_grouped_unfit(cfg.n_experts, cfg.d_model, cfg.ffn_hidden);
        if (!unfit.empty()) fail(EXIT_BAD_INPUT, "--moe-gemm grouped %s", unfit.c_str());
        if (prop.major * 10 + prop.minor != 90)   // (the emulator reports sm_90; SIMT_SM=89 another)
            fail(EXIT_BAD_INPUT, "--moe-gemm grouped: its kernels are Hopper's (sm_90a); this GPU is sm_%d%d", prop.major, prop.minor);
        if (comm.rank == 0) printf("experts: forward and data gradients on grouped GEMMs (TMA, SwiGLU fused each way); weight gradients per expert\n");
    }

    // --attention-bwd: the attention backward at head_dim 64 and 128 on model/attention_wgmma_bwd.cuh's kernels (sm_90a:
    // wgmma), the same bits as the mma.sync pair; other head_dims and context parallelism's chunk pairs keep theirs.
    // auto (the default): wgmma-overlap on Hopper, the fastest on an H100 SXM at dbrx-1b (2026-11-28, dev/bench/results_gpu.md:
    // the layer's backward 1.175 -> 0.884 ms, the step 92.6 -> 89.4 ms against mma), mma elsewhere
    const std::string& ab = args.run.attention_bwd;
    bool hopper = prop.major * 10 + prop.minor == 90;   // (the emulator reports sm_90; SIMT_SM=89 another)
    g_attention_bwd = ab == "wgmma" ? 1 : ab == "wgmma-overlap" || (ab == "auto" && hopper) ? 2 : 0;
    if (g_attention_bwd) {
        if (!hopper)
            fail(EXIT_BAD_INPUT, "--attention-bwd %s: its kernels are Hopper's (sm_90a); this GPU is sm_%d%d", ab.c_str(), prop.major, prop.minor);
        bool applies = attention_wgmma_backward_supported(cfg.head_dim) && args.parallel.context_parallel == 1;
        if (comm.rank == 0 && (ab != "auto" || applies))
            printf("attention: backward on wgmma%s%s%s\n", g_attention_bwd == 2 ? " (dq's products overlapped)" : "",
                   applies ? "" : " only at head_dim 64 and 128 without context parallelism: this run keeps the mma.sync kernels",
                   ab == "auto" ? " (--attention-bwd auto)" : "");
    }

    // --gemm-autotune N: each new GEMM plan of the heuristic's timed with its first N answers at its first call
    // (model/matmul_cublaslt.cuh, matmul_plan_autotune); a resumed run takes the checkpoint's choices
    matmul_heuristic_choice().autotune = args.run.gemm_autotune;
    if (comm.rank == 0 && args.run.gemm_autotune > 1)
        printf("gemm: --gemm-autotune %d: each GEMM shape's first call times cuBLASLt's first %d algorithms and keeps the fastest "
               "(a fresh run's choices follow the device's timings)\n", args.run.gemm_autotune, args.run.gemm_autotune);

    DbrxGPU model;
    int Tr = args.run.seq / args.parallel.context_parallel;   // this rank's tokens per sequence (--context-parallel)
    int S = args.parallel.shard_group_size > 0 ? args.parallel.shard_group_size : comm.world;
    // --fp8-gather with a shard group: the block weights arrive as codes, which the GEMMs read as they are (the model keeps
    // no scratch to quantise them into: fp8_gpu_buffers); the store turns it on below (zero_enable_fp8_gather)
    fp8.weights_quantized = args.fp8.gather && fp8.recipe != FP8_OFF && S > 1 && comm.world % S == 0;
    // before anything is built per layer (the parameter table alone grows with --n-layers): a run whose planned
    // allocations (--dry-run's plan, margins not counted: a lower bound) exceed the device's memory is refused in
    // one line, as the free-memory check in dbrx_build_shape refuses one that does not fit what is free
    size_t emb_bytes = 0;   // (--zero-embedding rows: the store allocates them after zero_init)
    {
        int Sp = S > 0 && comm.world % S == 0 ? S : 1, np = args.parallel.expert_parallel > 1 ? args.parallel.expert_parallel : 1;
        MemoryPlan plan = memory_plan(&cfg, args.run.batch, Tr, Sp, np, comm.world, fp8.recipe, args.parallel.ep_capacity,
                                      args.parallel.zero_chunk_mib, args.parallel.grad_reduce_dtype == "bf16", args.parallel.ep_chunks,
                                      args.fp8.gather);
        memory_plan_cp(&plan, &cfg, args.parallel.context_parallel);   // (CP: the GPU ring's buffers)
        emb_bytes = (size_t)plan.emb_exchange;
        if (plan.allocations > (long double)prop.totalGlobalMem)
            dbrx_gpu_out_of_memory(&cfg, args.run.batch, Tr, (size_t)plan.allocations, (size_t)plan_param_state(&plan));
    }
    // (expert parallelism: the experts' buffers planned for --ep-capacity-factor's rows, with the dispatcher's, in the memory check)
    int ep_n = args.parallel.expert_parallel;
    int rs_bf16 = args.parallel.grad_reduce_dtype == "bf16";   // (parallel/zero_gpu_comm.cuh)
    size_t ep_rows = 0, ep_bytes = 0;
    if (ep_n > 1 && cfg.n_experts % ep_n == 0) {
        ep_rows = ep_gpu_planned_rows(&cfg, (size_t)args.run.batch * Tr, ep_n, args.parallel.ep_capacity, fp8.recipe != FP8_OFF);
        ep_bytes = ep_gpu_buffers(NULL, &cfg, ep_n, ep_rows, fp8.recipe)
                   + ep_gpu_chunk_bytes(&cfg, ep_rows, (size_t)args.run.batch * Tr * cfg.top_k, ep_n, args.parallel.ep_chunks, fp8.recipe);
    }
    dbrx_build_shape(&model, &cfg, args.run.batch, Tr, &fp8,
                     zero_gpu_estimate_bytes(&cfg, S > 0 && comm.world % S == 0 ? S : 1, ep_n,
                                             zero_chunk_experts(&cfg, S, ep_n, fp8.recipe != FP8_OFF, args.parallel.zero_chunk_mib),
                                             rs_bf16, zero_vocab_rows(&cfg, S, ep_n, fp8.recipe != FP8_OFF, args.parallel.zero_chunk_mib)) + ep_bytes
                         + emb_bytes,
                     ep_rows, S == 1 || comm.world % S != 0,   // (FP8: with no shard group the weights stay in place: quantised once per step)
                     ep_rows ? ep_n : 1, ep_rows && ep_fp8_hold(ep_n, args.parallel.ep_chunks, fp8.recipe, S == 1 || comm.world % S != 0));
    ZeroGpu store;   // owns the parameters, gradients and moments on the device: this rank's shard
    zero_init(&store, &model, &comm, args.parallel.shard_group_size, (uint64_t)args.run.seed, ep_n, args.parallel.ep_capacity,
              args.parallel.zero_chunk_mib, rs_bf16, args.parallel.ep_layout == "spread");
    if (comm.rank == 0 && rs_bf16)
        printf("zero: --grad-reduce-dtype bf16: the shard group's gradient reduce-scatters in BF16%s\n",
               store.rs_on ? "" : " (none here: every rank holds its units whole)");
    ContextParallelGPU cp;   // --context-parallel: the CP group, RoPE at the global positions, the attention over the group
    cpg_init(&cp, &comm, args.parallel.context_parallel, &model, args.run.seq);
    if (store.ep_dispatch) ep_gpu_set_chunks(store.ep_dispatch, args.parallel.ep_chunks);   // (--ep-overlap-chunks)
    if (comm.rank == 0 && store.ep_dispatch && args.parallel.ep_chunks > 1 && ep_gpu_chunks(args.parallel.ep_chunks, fp8.recipe) == 1)
        printf("note: --ep-overlap-chunks %d has no effect with --fp8 %s: the exchange runs in one piece (per-tensor scaling "
               "quantises a layer's received rows at once; --fp8 block chunks it)\n", args.parallel.ep_chunks, args.fp8.recipe.c_str());
    zero_gpu_set_step_prefetch(&store, args.parallel.zero_prefetch);   // (--zero-prefetch)
    if (store.emb.on && comm.rank == 0)   // (--zero-embedding rows: parallel/zero_gpu_embedding.cuh)
        printf("zero: the embedding's rows exchanged per micro-batch (each rank's distinct tokens' rows from their owners, their "
               "gradients back), not its table gathered (--zero-embedding gather)\n");
    model.activation_bytes += ep_bytes;
    Zero* z = &store.z;
    store.z.fp8_cfg = &model.fp8.cfg;   // the FP8 scaling state that checkpoints carry
    store.z.fp8_metas = dbrx_fp8_metas(&model);
    if (args.fp8.gather) fp8_gather_enable(&store, fp8, comm);   // the blocks' FP8 weights gathered as E4M3 codes
    printf("zero: rank %d (cuda:%d): rank %d of %d in shard group %d, replica %d of %d; master+grads+moments+bf16 shard %lld bytes "
           "allocated, %lld bytes measured (device free memory); gathered slots %lld bytes\n", comm.rank, dev, z->shard.rank, z->S,
           comm.rank / z->S, z->replica.rank, z->R, (long long)(z->shard_total * (2 * sizeof(float) + sizeof(floatX) + optimizer_moments() * (g_adam_moments_bf16 ? sizeof(floatX) : sizeof(float)))),
           store.shard_bytes_measured, (long long)z->work_bytes);
    fflush(stdout);

    BackendInfo info;
    std::string gpu_how;
    double gpu_peak = gpu_peak_flops(prop, dev, &gpu_how);   // one GPU's (0: unknown)
    info.peak_how = args.run.peak_tflops > 0 ? "--peak-tflops" : gpu_how;
    info.peak = args.run.peak_tflops > 0 ? args.run.peak_tflops * 1e12 : comm.world * gpu_peak;
    // the health check's GEMM: BF16 cuBLASLt, 8192^3 (512 MiB of device memory while it runs); its floor is 25%
    // of a known GPU's dense BF16 peak (an H100 runs this GEMM at 60-75% of it). Under the emulator the rate
    // means nothing and the size is small: only the median rank bounds it
    const int health_n = platform_emulated() ? 128 : 8192;
    info.health = {"bf16 cuBLASLt (fp32 accumulate)", health_gemm_gpu, health_n, gpu_peak, 0.25, gpu_how, 1};
    char line[256];
    snprintf(line, sizeof line, "GPU memory per rank: parameter state %.1f MiB, activations and scratch %.1f MiB",
             store.device_bytes / 1048576.0, model.activation_bytes / 1048576.0);
    info.memory_line = line;
    int rc = args.sample.generate ? generate_run(args, cfg, comm, &model, &store) : train(args, cfg, comm, &model, &store, info);
    cpg_free(&cp, &comm);
    zero_free(&store);
    dbrx_free(&model);
    return rc;
}
