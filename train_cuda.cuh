/*
 * train_cuda.cuh — the training loop of train_dbrx.cu on the CUDA backend (model/dbrx_cuda.cuh):
 * the same steps, schedule, validation, console lines and JSONL log as the CPU loop, on one GPU.
 * Included by train_dbrx.cu (after its flags and helpers) when the build has CUDA: nvcc, or g++
 * with -DSIMT_EMULATION (train_dbrx_emu: the same loop on the SIMT emulator, for the tests).
 * Multi-GPU (NCCL, ZeRO-3) belongs to the communicator of parallel/ and is not wired here yet:
 * the CUDA path runs one process. --fp8 runs the block GEMMs in FP8 (model/dbrx_fp8_cuda.cuh), with
 * the same amax reduction hook and --fp8-log-every JSONL lines as the CPU loop.
 */
#pragma once
#include "model/dbrx_cuda.cuh"

// dense BF16 peak of the GPUs we know (the MFU denominator); 0 if unknown
static double gpu_peak_flops(const cudaDeviceProp& prop, std::string* how) {
    struct { const char* name; double tflops; } known[] = {{"H100", 989.4}, {"H200", 989.4}, {"H800", 989.4}, {"A100", 312.0}};
    for (auto& k : known)
        if (strstr(prop.name, k.name)) { *how = std::string(k.name) + " dense BF16"; return k.tflops * 1e12; }
    *how = "unknown GPU: pass --peak-tflops";
    return 0.0;
}

// mean cross-entropy over the first `steps` batches of the validation set
static double evaluate_cuda(DbrxGPU* model, DataLoader* val, int steps) {
    dataloader_reset(val);
    double acc = 0;
    for (int i = 0; i < steps; i++) {
        dataloader_next(val);
        acc += dbrx_gpu_forward(model, val->inputs.data(), val->targets.data(), 0.0f);
    }
    return acc / steps;
}

static int train_cuda(const TrainArgs& args, const DbrxConfig& cfg, Comm& comm, const char* why) {
    cudaCheck(cudaSetDevice(0));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: cuda:0 %s (%.1f GiB)%s, 1 rank\n", prop.name, prop.totalGlobalMem / 1073741824.0, why);
    print_config(args.model.c_str(), &cfg);

    // --fp8: the block GEMMs in FP8 (model/dbrx_fp8_cuda.cuh); refused where the device cannot
    Fp8Config fp8 = {fp8_recipe_parse(args.fp8.c_str()), args.fp8_history, args.fp8_margin, 0};
    if (fp8.recipe != FP8_OFF) {
        if (prop.major * 10 + prop.minor < 89)
            fail(EXIT_BAD_INPUT, "--fp8 %s: FP8 GEMMs need an sm_89 or newer GPU (Ada, Hopper); this one is sm_%d%d: use --fp8 off",
                 args.fp8.c_str(), prop.major, prop.minor);
        std::string why;
        if (fp8.recipe == FP8_BLOCK && !matmul_fp8_block_supported(&why)) fail(EXIT_BAD_INPUT, "--fp8 block: %s", why.c_str());
        printf("fp8: %s scaling on the block GEMMs (Wqkv, out_proj, experts w1/v1/w2; forward, dgrad, wgrad): E4M3 weights "
               "and activations, E5M2 gradients%s\n", args.fp8.c_str(),
               fp8.recipe == FP8_DELAYED ? (", amax history " + std::to_string(fp8.history_len) + ", margin " + std::to_string(fp8.margin)).c_str()
               : fp8.recipe == FP8_CURRENT ? (", margin " + std::to_string(fp8.margin)).c_str() : ", 1x128 activation / gradient tiles, 128x128 weight blocks");
    }
    if (args.fp8_gather)   // the GPU side of ZeRO (parallel/zero_gpu.cuh) is not wired into this loop yet
        printf("note: --fp8-gather has no effect here: the CUDA path trains on one GPU, nothing is gathered\n");
    DbrxGPU model;
    dbrx_gpu_build(&model, &cfg, args.batch, args.seq, (uint64_t)args.seed, &fp8);
    DataLoader train, val;
    bool do_val = open_datasets(args, cfg, comm, &train, &val) && args.val_every > 0;

    std::string peak_how = "--peak-tflops";
    double peak = args.peak_tflops > 0 ? args.peak_tflops * 1e12 : gpu_peak_flops(prop, &peak_how);
    int64_t tokens_per_step = (int64_t)args.batch * args.seq * args.grad_accum;
    double fpt = flops_per_token(&cfg, args.seq);
    printf("batch: %d x %d tokens x %d accum x 1 rank = %lld tokens/step; %d steps; lr %g warmup %d cosine to %g x\n", args.batch,
           args.seq, args.grad_accum, (long long)tokens_per_step, args.steps, args.lr, args.warmup, args.lr_floor);
    printf("mfu: %.4g FLOPs/token (6 N_active + 12 L d S) against a peak of %.1f TFLOP/s (%s)\n", fpt, peak / 1e12, peak_how.c_str());
    printf("GPU memory: parameters + fp32 grads + AdamW moments + bf16 copy %.1f MiB, activations and scratch %.1f MiB\n",
           model.param_bytes / 1048576.0, model.activation_bytes / 1048576.0);
    FILE* logf = args.log.empty() ? NULL : fopenCheck(args.log.c_str(), "w");
    fflush(stdout);

    AdamWConfig opt = {args.lr, args.beta1, args.beta2, args.adam_eps, args.weight_decay, args.grad_clip};
    float dloss = 1.0f / args.grad_accum;
    for (int step = 0; step < args.steps; step++) {
        if (do_val && step % args.val_every == 0) {
            double vl = evaluate_cuda(&model, &val, args.val_steps);
            printf("val  %5d | val_loss %.6f\n", step, vl);
            if (logf) { fprintf(logf, "{\"step\": %d, \"val_loss\": %.6f}\n", step, vl); fflush(logf); }
        }
        cudaCheck(cudaDeviceSynchronize());
        double t0 = now_seconds();
        dbrx_gpu_zero_grad(&model);
        double metrics[4] = {0, 0, 0, 0};   // ce, lbl, z, imbalance
        for (int micro = 0; micro < args.grad_accum; micro++) {
            dataloader_next(&train);
            dbrx_gpu_forward(&model, train.inputs.data(), train.targets.data(), dloss);
            dbrx_gpu_backward(&model, dloss);
            metrics[0] += model.ce_loss / args.grad_accum;
            metrics[1] += model.lbl_loss / args.grad_accum;
            metrics[2] += model.z_loss / args.grad_accum;
            metrics[3] += model.imbalance / args.grad_accum;
        }
        if (fp8_on(&model.fp8)) {
            // the amax of a tensor is the max over every rank that holds a piece of it (one rank on
            // the CUDA path today: the hook is where ZeRO-3 / data parallelism reduce)
            Fp8GPU* f = &model.fp8;
            fp8_gpu_collect(f);
            std::vector<float> amax(f->nslots), amax_local;
            for (int i = 0; i < f->nslots; i++) amax[i] = f->metas[i].amax;
            amax_local = amax;
            comm_all_reduce_max_f32(&comm.world_group, amax.data(), amax.size());
            for (int i = 0; i < f->nslots; i++) f->metas[i].amax = amax[i];
            if (logf && args.fp8_log_every > 0 && (step + 1) % args.fp8_log_every == 0) fp8_gpu_log(f, logf, step + 1, amax_local);
        }
        float lr = lr_schedule(step, args.steps, args.lr, args.warmup, args.lr_floor);
        double gnorm = dbrx_gpu_update(&model, &opt, lr, step + 1);
        cudaCheck(cudaDeviceSynchronize());
        double dt = now_seconds() - t0;
        double tok_s = tokens_per_step / dt, mfu = peak > 0 ? fpt * tok_s / peak : 0.0;
        if (!std::isfinite(metrics[0]) || !std::isfinite(gnorm))
            fail(EXIT_RUNTIME, "step %d: loss %g / grad norm %g is not finite; stopping", step + 1, metrics[0], gnorm);
        report_step(logf, step + 1, args.steps, metrics, gnorm, lr, dt, tok_s, mfu, -1);
    }
    if (do_val) {
        double vl = evaluate_cuda(&model, &val, args.val_steps);
        printf("val  %5d | val_loss %.6f\n", args.steps, vl);
        if (logf) fprintf(logf, "{\"step\": %d, \"val_loss\": %.6f}\n", args.steps, vl);
    }
    if (logf) fcloseCheck(logf, args.log.c_str());
    dataloader_free(&train);
    if (do_val) dataloader_free(&val);
    dbrx_gpu_free(&model);
    comm_finalize();
    return 0;
}
