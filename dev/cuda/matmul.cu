/*
 * matmul.cu — the cuBLASLt wrapper (model/matmul.cuh) on the GEMMs of one dbrx-1b block and the
 * lm_head (micro-batch 8 x 2048 = 16384 tokens; an expert sees N k / E = 4096 rows on balanced
 * routing): forward (TN), dgrad (NN, fp32 out), wgrad (NT, fp32 accumulate). BF16 operands, FP32
 * accumulation. 2 M N K FLOPs each, against the dense BF16 peak.
 * Under the emulator the shapes shrink 64x and the results are validated against the CPU GEMM.
 *   make dev/cuda/matmul && ./dev/cuda/matmul
 * With -x: the experts at DBRX-132B's shapes (E 16, 2048 rows per expert, d 6144, F 10752) through the
 * model's expert path (experts_forward_gpu / experts_backward_gpu: one cuBLASLt GEMM per expert and
 * projection), against one dense GEMM of the same total size (E*2048 rows); make bench-gpu's target is
 * >= 70% of the dense rate. Under the emulator (E 4, ragged rows, d 64, F 96) validated against the
 * CPU experts (experts_up_forward, ..., model/moe.cuh).
 * With -s FILE: every GEMM of a training step, as `predict.py LOG --gemm-shapes FILE` lists them (cuBLASLt's
 * column-major m n k, batch, types, transposes, beta, FP8 scale modes), timed one by one through the wrapper
 * (matmul_cublaslt, as the model calls it); one output line per shape, the input line with "ms=" appended:
 * `calibrate.py --gemms` turns them into the step-time model's measured GEMM table (dev/predict/README.md).
 * The operands are filled on the device; under the emulator each BF16 shape of beta 0 is validated against the
 * CPU's GEMM of the operands read back (FP8, or beta != 0: run, not validated). -s FILE -w: the same, L2 not flushed
 * between the timed calls (the operands warm, as a GEMM right after the kernel that wrote them finds them in the step).
 * -s FILE -a N: each GEMM with each of cuBLASLt's first N answers for its shape (a plan per candidate, through the
 * wrapper's matmul_heuristic_choice; every candidate validated under the emulator as above): is the heuristic's first
 * the fastest, and how much would an autotuner that times them at the first step save over the step's list (the last line).
 * With -b: dbrx-1b's expert GEMMs (E 16, 4096 rows per expert, d 1024, F 1792), the six of a layer's forward and backward,
 * each as the model runs it (a GEMM per expert on one stream), round-robin over 2 and 4 streams (cuBLASLt's workspace per
 * stream), and as one strided batched call over the experts (equal rows: the bound a grouped GEMM of cuBLASLt's quality
 * would reach); the streams' results are the one-stream results bit for bit, the batched one's within BF16 rounding.
 * With -c: the step-time model's assumption that a collective's CTAs take their SMs from the compute beside them
 * (dev/predict/README.md, "Streams share the SMs and the links"): GEMMs timed alone, then beside a kernel of C CTAs on
 * another stream, each CTA 512 threads and 64 KiB of shared memory (no cuBLASLt Hopper CTA fits beside it, as beside a
 * NCCL CTA) spinning for longer than the GEMMs run, C = 8, 16, 24, 32; the model says SMs / (SMs - C) x the time alone.
 * Also a bytes-bound kernel (out = 2 in over 1 GiB of floats), which the model keeps at its time beside the hold.
 * Under the emulator: the GEMMs and the kernel beside the hold give the bits they give alone.
 */
#include "common.h"
#include "../../model/matmul.cuh"
#include "../../model/moe.cuh"

// the expert layer's GEMMs (forward: w1, v1, w2 per expert, with the SwiGLU between; backward: their
// dgrads and wgrads) against the dense GEMM of the same total size
static int expert_gemms() {
    const int E = EMULATED ? 4 : 16, C = EMULATED ? 64 : 6144, F = EMULATED ? 96 : 10752;
    char shape[96];
    snprintf(shape, sizeof shape, "E %d, %s rows per expert, d %d, F %d", E, EMULATED ? "ragged" : "2048", C, F);
    print_header("expert GEMMs (cuBLASLt)", shape);
    std::vector<int> offsets(E + 1, 0);
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + (EMULATED ? (e == 1 ? 0 : 5 + 7 * e) : 2048);
    const int R = offsets[E];
    std::vector<float> xe = round_bf16(make_random((size_t)R * C, 1)), dye = round_bf16(make_random((size_t)R * C, 2));
    std::vector<float> w1 = round_bf16(make_random((size_t)E * F * C, 3, 0.02)), v1 = round_bf16(make_random((size_t)E * F * C, 4, 0.02));
    std::vector<float> w2 = round_bf16(make_random((size_t)E * F * C, 5, 0.02));
    floatX *d_xe = to_device_bf16v(xe), *d_dye = to_device_bf16v(dye), *d_w1 = to_device_bf16v(w1), *d_v1 = to_device_bf16v(v1);
    floatX *d_w2 = to_device_bf16v(w2), *d_ye = deviceAlloc(floatX, (size_t)R * C);
    floatX *g = deviceAlloc(floatX, (size_t)R * F), *u = deviceAlloc(floatX, (size_t)R * F), *a = deviceAlloc(floatX, (size_t)R * F);
    floatX *da = deviceAlloc(floatX, (size_t)R * F), *dg = deviceAlloc(floatX, (size_t)R * F), *du = deviceAlloc(floatX, (size_t)R * F);
    floatX* dxe = deviceAlloc(floatX, (size_t)R * C);
    float *dw1 = deviceAlloc(float, (size_t)E * F * C), *dv1 = deviceAlloc(float, (size_t)E * F * C);
    float *dw2 = deviceAlloc(float, (size_t)E * F * C);
    for (float* p : {dw1, dv1, dw2}) cudaCheck(cudaMemset(p, 0, (size_t)E * F * C * sizeof(float)));
    auto fwd = [&] { experts_forward_gpu(d_ye, g, u, a, d_xe, d_w1, d_v1, d_w2, offsets.data(), E, C, F); };
    auto bwd = [&] { experts_backward_gpu(dxe, dw1, dv1, dw2, da, dg, du, d_dye, d_xe, g, u, a, d_w1, d_v1, d_w2, offsets.data(), E, C, F); };
    if (EMULATED) {   // the CPU experts on the same BF16 inputs
        std::vector<float> cg((size_t)R * F), cu((size_t)R * F), ca((size_t)R * F), cye((size_t)R * C), cda((size_t)R * F);
        std::vector<float> cdg((size_t)R * F), cdu((size_t)R * F), cdxe((size_t)R * C), cdw1((size_t)E * F * C, 0.0f);
        std::vector<float> cdv1((size_t)E * F * C, 0.0f), cdw2((size_t)E * F * C, 0.0f);
        experts_up_forward(cg.data(), cu.data(), ca.data(), xe.data(), w1.data(), v1.data(), offsets.data(), E, C, F);
        experts_down_forward(cye.data(), ca.data(), w2.data(), offsets.data(), E, C, F);
        fwd(); bwd();
        // the backward from the GPU's own (BF16) activations, so that only the GEMMs are compared
        std::vector<float> ga = from_device_bf16v(a, ca.size()), gg = from_device_bf16v(g, cg.size()), gu = from_device_bf16v(u, cu.size());
        experts_down_backward(cda.data(), cdw2.data(), dye.data(), w2.data(), ga.data(), dye.data(), offsets.data(), E, C, F);
        swiglu_backward(cdg.data(), cdu.data(), round_bf16(cda).data(), gg.data(), gu.data(), cda.size());
        std::vector<float> bdg = round_bf16(cdg), bdu = round_bf16(cdu);
        experts_up_backward(cdxe.data(), cdw1.data(), cdv1.data(), bdg.data(), bdu.data(), w1.data(), v1.data(), bdg.data(), bdu.data(),
                            xe.data(), offsets.data(), E, C, F);
        validate("experts forward (ye)", from_device_bf16v(d_ye, cye.size()), cye, 2e-2, 2e-2);
        validate("experts backward (dxe, BF16)", from_device_bf16v(dxe, cdxe.size()), cdxe, 1e-2, 1e-2);
        validate("experts backward (dw1)", from_device_f32(dw1, cdw1.size()), cdw1, 1e-4, 1e-5);
        validate("experts backward (dv1)", from_device_f32(dv1, cdv1.size()), cdv1, 1e-4, 1e-5);
        validate("experts backward (dw2)", from_device_f32(dw2, cdw2.size()), cdw2, 1e-4, 1e-5);
    }
    // one dense GEMM of the same total size: (R, C) @ (C, F), and its dgrad + wgrad
    floatX* dense_out = deviceAlloc(floatX, (size_t)R * F);
    float* dense_dw = deviceAlloc(float, (size_t)F * C);
    auto dense_fwd = [&] { matmul_forward_gpu(dense_out, d_xe, d_w1, R, C, F); };
    auto dense_bwd = [&] { matmul_backward_gpu(dxe, dense_dw, g, d_xe, d_w1, R, C, F, 0.0f); };
    double gemm = 2.0 * R * C * F;
    float t_ef = time_ms(5, fwd), t_eb = time_ms(5, bwd), t_df = time_ms(5, dense_fwd), t_db = time_ms(5, dense_bwd);
    report_flops("experts forward (3 GEMMs / expert)", 3 * gemm, t_ef);
    report_flops("experts backward (6 GEMMs / expert)", 6 * gemm, t_eb);
    report_flops("dense forward (1 GEMM)", gemm, t_df);
    report_flops("dense backward (dgrad + wgrad)", 2 * gemm, t_db);
    if (!EMULATED) {
        double fwd_ratio = (3 * gemm / t_ef) / (gemm / t_df), bwd_ratio = (6 * gemm / t_eb) / (2 * gemm / t_db);
        printf("  experts forward at %.1f%% of the dense GEMM rate, backward at %.1f%%; together %.1f%% of the dense GEMM rate\n",
               100 * fwd_ratio, 100 * bwd_ratio, 100 * (9 * gemm / (t_ef + t_eb)) / (3 * gemm / (t_df + t_db)));
    }
    for (void* p : {(void*)d_xe, (void*)d_dye, (void*)d_w1, (void*)d_v1, (void*)d_w2, (void*)d_ye, (void*)g, (void*)u, (void*)a, (void*)da,
                    (void*)dg, (void*)du, (void*)dxe, (void*)dw1, (void*)dv1, (void*)dw2, (void*)dense_out, (void*)dense_dw})
        cudaCheck(cudaFree(p));
    return finish();
}

// -b: the experts' six GEMMs of one dbrx-1b layer (balanced routing: every expert n rows), per expert on 1, 2 and 4
// streams, and as one batched call. Row-major shapes as gemm_gpu takes them; the weights (E, F, C) as model/moe.cuh's.
static int expert_streams() {
    const int E = EMULATED ? 4 : 16, n = EMULATED ? 48 : 4096, C = EMULATED ? 64 : 1024, F = EMULATED ? 96 : 1792;
    char shape[96];
    snprintf(shape, sizeof shape, "E %d, %d rows per expert, d %d, F %d", E, n, C, F);
    print_header("expert GEMMs per expert on 1 / 2 / 4 streams, and batched (cuBLASLt)", shape);
    const size_t R = (size_t)E * n, W = (size_t)E * F * C;
    floatX *x = to_device_bf16v(round_bf16(make_random(R * C, 1))), *dy = to_device_bf16v(round_bf16(make_random(R * C, 2)));
    floatX *a = to_device_bf16v(round_bf16(make_random(R * F, 3))), *w = to_device_bf16v(round_bf16(make_random(W, 4, 0.02)));
    floatX *out_f = deviceAlloc(floatX, R * F), *out_c = deviceAlloc(floatX, R * C);
    float* dw = deviceAlloc(float, W);
    cudaStream_t side[4];
    cudaEvent_t fork, join[4];
    cudaCheck(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int i = 0; i < 4; i++) {
        cudaCheck(cudaStreamCreateWithFlags(&side[i], cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming));
        cublaslt_stream_workspace_add(side[i]);
    }
    // kind k for expert e on stream s; the wgrads overwrite (beta 0), so that every variant writes the same values
    auto one = [&](int k, int e, cudaStream_t s) {
        const size_t xo = (size_t)e * n, wo = (size_t)e * F * C;
        if (k == 0) gemm_gpu(false, true, n, F, C, 1.0f, x + xo * C, C, w + wo, C, 0.0f, out_f + xo * F, F, s);         // up: g = x w1^T
        else if (k == 1) gemm_gpu(false, false, n, C, F, 1.0f, a + xo * F, F, w + wo, C, 0.0f, out_c + xo * C, C, s);   // down: y = a w2
        else if (k == 2) gemm_gpu(false, true, n, F, C, 1.0f, dy + xo * C, C, w + wo, C, 0.0f, out_f + xo * F, F, s);   // da = dy w2^T
        else if (k == 3) gemm_gpu(true, false, F, C, n, 1.0f, a + xo * F, F, dy + xo * C, C, 0.0f, dw + wo, C, s);      // dw2 = a^T dy
        else if (k == 4) gemm_gpu(false, false, n, C, F, 1.0f, a + xo * F, F, w + wo, C, 0.0f, out_c + xo * C, C, s);   // dx = dg w1
        else gemm_gpu(true, false, F, C, n, 1.0f, a + xo * F, F, x + xo * C, C, 0.0f, dw + wo, C, s);                    // dw1 = dg^T x
    };
    auto batched = [&](int k) {
        const long long sx = (long long)n * C, sf = (long long)n * F, sw = (long long)F * C;
        if (k == 0) gemm_gpu_batched(false, true, n, F, C, 1.0f, x, C, sx, w, C, sw, 0.0f, out_f, F, sf, E);
        else if (k == 1 || k == 4) gemm_gpu_batched(false, false, n, C, F, 1.0f, a, F, sf, w, C, sw, 0.0f, out_c, C, sx, E);
        else if (k == 2) gemm_gpu_batched(false, true, n, F, C, 1.0f, dy, C, sx, w, C, sw, 0.0f, out_f, F, sf, E);
        else if (k == 3) gemm_gpu_batched(true, false, F, C, n, 1.0f, a, F, sf, dy, C, sx, 0.0f, dw, C, sw, E);
        else gemm_gpu_batched(true, false, F, C, n, 1.0f, a, F, sf, x, C, sx, 0.0f, dw, C, sw, E);
    };
    auto streams = [&](int k, int ns) {
        if (ns == 1) { for (int e = 0; e < E; e++) one(k, e, 0); return; }
        cudaCheck(cudaEventRecord(fork, 0));
        for (int i = 0; i < ns; i++) cudaCheck(cudaStreamWaitEvent(side[i], fork, 0));
        for (int e = 0; e < E; e++) one(k, e, side[e % ns]);
        for (int i = 0; i < ns; i++) {
            cudaCheck(cudaEventRecord(join[i], side[i]));
            cudaCheck(cudaStreamWaitEvent(0, join[i], 0));
        }
    };
    const char* names[6] = {"up (x w1^T)", "down (a w2)", "down dgrad (dy w2^T)", "down wgrad (a^T dy)", "up dgrad (dg w1)", "up wgrad (dg^T x)"};
    double flops = 2.0 * R * C * F;
    for (int k = 0; k < 6; k++) {
        bool wgrad = k == 3 || k == 5;
        auto result = [&] {
            cudaCheck(cudaDeviceSynchronize());
            return wgrad ? from_device_f32(dw, W) : k == 1 || k == 4 ? from_device_bf16v(out_c, R * C) : from_device_bf16v(out_f, R * F);
        };
        auto clear = [&] {   // NaN everywhere before each variant: a GEMM that writes nothing fails the comparison
            if (wgrad) cudaCheck(cudaMemset(dw, 0xFF, W * sizeof(float)));
            else if (k == 1 || k == 4) cudaCheck(cudaMemset(out_c, 0xFF, R * C * sizeof(floatX)));
            else cudaCheck(cudaMemset(out_f, 0xFF, R * F * sizeof(floatX)));
        };
        clear();
        streams(k, 1);
        std::vector<float> want = result();
        char what[160];
        for (int ns : {2, 4}) {   // the same GEMMs, the same algorithms: the same bits
            clear();
            streams(k, ns);
            snprintf(what, sizeof what, "%s on %d streams against 1", names[k], ns);
            validate(what, result(), want, 0.0, 0.0);
        }
        clear();
        batched(k);   // (another algorithm may sum in another order)
        snprintf(what, sizeof what, "%s batched against per expert", names[k]);
        validate(what, result(), want, wgrad ? 1e-4 : 1e-2, wgrad ? 1e-4 : 1e-2);
        for (int ns : {1, 2, 4}) {
            snprintf(what, sizeof what, "%-22s per expert, %d stream(s)", names[k], ns);
            report_flops(what, flops, time_ms(5, [&] { streams(k, ns); }));
        }
        snprintf(what, sizeof what, "%-22s batched (1 call)", names[k]);
        report_flops(what, flops, time_ms(5, [&] { batched(k); }));
    }
    for (int i = 0; i < 4; i++) {
        cudaCheck(cudaStreamDestroy(side[i]));
        cudaCheck(cudaEventDestroy(join[i]));
    }
    cudaCheck(cudaEventDestroy(fork));
    for (void* p : {(void*)x, (void*)dy, (void*)a, (void*)w, (void*)out_f, (void*)out_c, (void*)dw}) cudaCheck(cudaFree(p));
    return finish();
}

// -c: C CTAs that hold their SMs for `spins` iterations (sink: one float per CTA, so the loop is not optimised away)
#define SM_HOLD_THREADS 512
#define SM_HOLD_SMEM (64 << 10)
__global__ void sm_hold_kernel(float* sink, long long spins) {
    float* held = (float*)dynamic_smem;   // (SM_HOLD_SMEM bytes: what keeps a GEMM CTA off the SM)
    float x = (float)threadIdx.x;
    for (long long i = 0; i < spins; i++) x = x * 0.999f + 1.0f;
    held[threadIdx.x] = x;
    __syncthreads();
    if (threadIdx.x == 0) sink[blockIdx.x] = held[SM_HOLD_THREADS - 1];
}

// ... and a bytes-bound kernel beside them: out = 2 in, 16 bytes an access (the model keeps such a kernel's time)
__global__ void sm_hold_stream_kernel(float4* out, const float4* in, size_t n4) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = in[i];
        out[i] = make_float4(2.0f * v.x, 2.0f * v.y, 2.0f * v.z, 2.0f * v.w);
    }
}

static int sm_hold() {
    struct Shape { const char* name; int m, n, k; };   // (m 0: the bytes-bound kernel over n x k floats)
    const Shape shapes[3] = {{"cube", EMULATED ? 64 : 8192, EMULATED ? 64 : 8192, EMULATED ? 64 : 8192},
                             {"DBRX-132B expert up", EMULATED ? 32 : 2048, EMULATED ? 96 : 10752, EMULATED ? 64 : 6144},
                             {"bytes-bound out = 2 in, float rows", 0, EMULATED ? 64 : 16384, EMULATED ? 64 : 16384}};
    int sms = 0;
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    char shape[64];
    snprintf(shape, sizeof shape, "%d SMs, BF16 GEMMs beside C CTAs held", sms);
    print_header("GEMMs beside a kernel holding SMs (the model's NCCL CTAs)", shape);
    cudaCheck(cudaFuncSetAttribute(sm_hold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SM_HOLD_SMEM));
    float* sink = deviceAlloc(float, 64);
    cudaStream_t side;
    cudaCheck(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    const int reps = EMULATED ? 1 : 10;
    for (const Shape& sh : shapes) {
        const bool bytes = sh.m == 0;
        const size_t ny = bytes ? (size_t)sh.n * sh.k : (size_t)sh.m * sh.n;   // (the output's elements)
        floatX *x = bytes ? nullptr : to_device_bf16v(round_bf16(make_random((size_t)sh.m * sh.k, 1)));
        floatX *w = bytes ? nullptr : to_device_bf16v(round_bf16(make_random((size_t)sh.n * sh.k, 2, 0.02)));
        floatX* y = bytes ? nullptr : deviceAlloc(floatX, ny);
        float *fin = bytes ? to_device(make_random(ny, 3)) : nullptr, *fout = bytes ? deviceAlloc(float, ny) : nullptr;
        auto gemms = [&] {
            for (int r = 0; r < reps; r++) {
                if (bytes) LAUNCH(sm_hold_stream_kernel, 4 * sms, 256, 0, (cudaStream_t)0, (float4*)fout, (const float4*)fin, ny / 4);
                else gemm_gpu(false, true, sh.m, sh.n, sh.k, 1.0f, x, sh.k, w, sh.k, 0.0f, y, sh.n, 0);
            }
        };
        auto result = [&] { return bytes ? from_device_f32(fout, ny) : from_device_bf16v(y, ny); };
        auto timed = [&](const std::function<void()>& before) {   // the GEMMs' time on stream 0 (events around them only)
            before();
            cudaCheck(cudaEventRecord(a, 0));
            gemms();
            cudaCheck(cudaEventRecord(b, 0));
            cudaCheck(cudaDeviceSynchronize());
            float ms = 0;
            if (!EMULATED) cudaCheck(cudaEventElapsedTime(&ms, a, b));
            return ms / reps;
        };
        gemms();   // warm-up
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> alone_bits = result();
        float alone = timed([] {});
        // spins: the hold alone lasts at least 3 x the GEMMs (timed once with 2^20 spins, then scaled)
        long long spins = EMULATED ? 64 : 1 << 20;
        if (!EMULATED) {
            LAUNCH(sm_hold_kernel, 1, SM_HOLD_THREADS, SM_HOLD_SMEM, side, sink, spins);
            cudaCheck(cudaEventRecord(a, side));
            LAUNCH(sm_hold_kernel, 1, SM_HOLD_THREADS, SM_HOLD_SMEM, side, sink, spins);
            cudaCheck(cudaEventRecord(b, side));
            cudaCheck(cudaDeviceSynchronize());
            float hold = 0;
            cudaCheck(cudaEventElapsedTime(&hold, a, b));
            spins = (long long)((double)spins * 3.0 * alone * reps / std::max(hold, 1e-3f)) + 1;
        }
        char what[160], name[80];
        if (bytes) snprintf(name, sizeof name, "%s %d x %d", sh.name, sh.n, sh.k);
        else snprintf(name, sizeof name, "%s %d x %d x %d", sh.name, sh.m, sh.n, sh.k);
        printf("  %s: alone %.4f ms a call\n", name, alone);
        for (int c : {8, 16, 24, 32}) {
            float beside = timed([&] { LAUNCH(sm_hold_kernel, c, SM_HOLD_THREADS, SM_HOLD_SMEM, side, sink, spins); });
            cudaCheck(cudaDeviceSynchronize());
            snprintf(what, sizeof what, "%s beside %d CTAs held: the bits alone", name, c);
            validate(what, result(), alone_bits, 0.0, 0.0);
            if (!EMULATED)
                printf("  %-44s %9.4f ms  %.3f x alone; the model: %.3f x\n", what, beside, beside / alone,
                       bytes ? 1.0 : (double)sms / (sms - c));
        }
        for (void* p : {(void*)x, (void*)w, (void*)y, (void*)fin, (void*)fout}) if (p) cudaCheck(cudaFree(p));
    }
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    cudaCheck(cudaStreamDestroy(side));
    cudaCheck(cudaFree(sink));
    return finish();
}

// -s FILE: one line per GEMM "m n k batch a b d trans_a trans_b beta fast_accum a_scale_mode b_scale_mode count"
// (predict.py --gemm-shapes), column-major as cuBLASLt takes it: D (m, n) = op(A) (m, k) op(B) (k, n) + beta D.
static cudaDataType_t sweep_type(const char* name, const char* path, int line) {
    if (!strcmp(name, "bf16")) return CUDA_R_16BF;
    if (!strcmp(name, "fp32")) return CUDA_R_32F;
    if (!strcmp(name, "e4m3")) return CUDA_R_8F_E4M3;
    if (!strcmp(name, "e5m2")) return CUDA_R_8F_E5M2;
    fprintf(stderr, "error: %s:%d: unknown type '%s' (bf16, fp32, e4m3, e5m2)\n", path, line, name);
    exit(2);
}
// The sweep's operands are filled on the device from a hash of their index (MurmurHash3's 64-bit finaliser):
// no host copies (the lm_head's D is 16384 x 100352 floats) but those the emulated validation reads back.
// BF16 / FP32: a normal-like spread (4 uniforms summed and centred, sd 0.5) rounded to BF16; FP8 (bytes 1):
// finite codes below 0x70 with either sign (finite in E4M3 and E5M2).
__device__ __forceinline__ uint64_t sweep_hash(uint64_t x) {
    x = (x ^ (x >> 33)) * 0xFF51AFD7ED558CCDull;
    x = (x ^ (x >> 33)) * 0xC4CEB9FE1A85EC53ull;
    return x ^ (x >> 33);
}
__global__ void sweep_fill_kernel(void* p, int bytes, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = sweep_hash(seed * 0x9E3779B97F4A7C15ull + i);
        if (bytes == 1) { ((uint8_t*)p)[i] = (uint8_t)(h % 0x70 | (h >> 63) << 7); continue; }
        float u = 0.0f;   // (the sum of 4 uniforms: mean 2, variance 1/3)
        for (int j = 0; j < 4; j++) u += (float)((h >> (16 * j)) & 0xFFFF) * (1.0f / 65536.0f);
        floatX x = __float2bfloat16(0.5f * 1.7320508f * (u - 2.0f));
        if (bytes == 4) ((float*)p)[i] = __bfloat162float(x);
        else ((floatX*)p)[i] = x;
    }
}
// an operand of n elements of type t (D of a beta-0 GEMM: NaN, which it must not read); *host: its values, read back
static void* sweep_operand(cudaDataType_t t, size_t n, uint64_t seed, bool fill, std::vector<float>* host) {
    int bytes = t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1;
    void* p = deviceAlloc(uint8_t, n * bytes);
    if (!fill) cudaCheck(cudaMemset(p, 0xFF, n * bytes));
    else LAUNCH(sweep_fill_kernel, (int)std::min<size_t>((n + 255) / 256, 4096), 256, 0, 0, p, bytes, n, seed);
    if (host) *host = t == CUDA_R_32F ? from_device_f32((float*)p, n) : from_device_bf16v((floatX*)p, n);
    return p;
}
// algos > 1 (-a N): each shape timed with each of the heuristic's first N answers (a new plan per candidate); ms= is the
// first's (the product's choice), then the fastest and every candidate's time, and at the end the step's sum both ways
static int gemm_sweep(const char* path, int algos) {
    FILE* f = fopen(path, "r");
    if (!f) { fprintf(stderr, "error: %s: cannot open the GEMM list (%s)\n", path, strerror(errno)); return 2; }
    print_header("matmul (cuBLASLt)", algos > 1 ? "the GEMMs of a step (-s), the heuristic's first answers (-a)" : "the GEMMs of a step (-s)");
    char buf[512];
    double sum_first = 0, sum_best = 0;   // (-a) count x ms over the list
    for (int line = 1; fgets(buf, sizeof buf, f); line++) {
        if (buf[0] == '#' || buf[0] == '\n') continue;
        int m, n, k, batch, ta, tb, fast, sa, sb, count;
        char an[8], bn[8], dn[8];
        float beta;
        if (sscanf(buf, "%d %d %d %d %7s %7s %7s %d %d %f %d %d %d %d", &m, &n, &k, &batch, an, bn, dn, &ta, &tb, &beta, &fast, &sa, &sb,
                   &count) != 14 || m <= 0 || n <= 0 || k <= 0 || batch <= 0) {
            fprintf(stderr, "error: %s:%d: not a GEMM line (m n k batch a b d trans_a trans_b beta fast_accum a_scale_mode b_scale_mode count)\n",
                    path, line);
            fclose(f);
            return 2;
        }
        cudaDataType_t at = sweep_type(an, path, line), bt = sweep_type(bn, path, line), dt = sweep_type(dn, path, line);
        int lda = ta ? k : m, ldb = tb ? n : k;
        long long sza = (long long)m * k, szb = (long long)k * n, szd = (long long)m * n;
        bool fp8 = is_fp8_type(at), check = EMULATED && !fp8 && beta == 0.0f;   // (check: validated against the CPU)
        std::vector<float> ha, hb;
        void* A = sweep_operand(at, (size_t)sza * batch, 11 + line, true, check ? &ha : nullptr);
        void* B = sweep_operand(bt, (size_t)szb * batch, 13 + line, true, check ? &hb : nullptr);
        void* D = sweep_operand(dt, (size_t)szd * batch, 17 + line, beta != 0.0f, nullptr);
        MatmulOptions opt = {};
        float *scale_a = nullptr, *scale_b = nullptr;
        if (fp8) {   // unit dequantisation factors in the operands' layouts
            scale_a = to_device(std::vector<float>(matmul_scale_count(sa, m, k), 1.0f));
            scale_b = to_device(std::vector<float>(matmul_scale_count(sb, n, k), 1.0f));
            opt = {scale_a, scale_b, nullptr, nullptr, fast, sa, sb, "A", "B"};
        }
        auto run = [&] {
            matmul_cublaslt(ta, tb, m, n, k, 1.0f, A, at, lda, sza, B, bt, ldb, szb, beta, D, dt, m, szd, batch, fp8 ? &opt : nullptr, 0,
                            __FILE__, __LINE__);
        };
        buf[strcspn(buf, "\n")] = 0;
        std::vector<float> want;
        if (check) {   // against the CPU on the operands' values: row-major D^T (n, m) = op(B)^T op(A)^T, per batch
            want.resize((size_t)szd * batch);
            for (int b = 0; b < batch; b++)
                gemm_cpu(tb, ta, n, m, k, 1.0f, hb.data() + b * szb, ldb, ha.data() + b * sza, lda, 0.0f, want.data() + b * szd, m);
        }
        auto run_checked = [&](const char* what) {
            if (check) {
                cudaCheck(cudaMemset(D, 0xFF, (size_t)szd * batch * (dt == CUDA_R_32F ? 4 : 2)));   // (NaN: each candidate writes D)
                run();
                std::vector<float> got = dt == CUDA_R_32F ? from_device_f32((float*)D, want.size()) : from_device_bf16v((floatX*)D, want.size());
                validate(what, got, want, 1e-2, 1e-2);
            } else if (EMULATED) run();   // (FP8, or D read: run, not validated)
        };
        MatmulHeuristicChoice& choice = matmul_heuristic_choice();
        std::vector<float> cand_ms;
        if (algos > 1) {   // how many answers the heuristic has for this shape (at most algos), then each in turn
            choice.request = algos;
            choice.pick = 0;
            matmul_plans_clear();
            run();
            const int found = choice.found;
            for (int r = 0; r < found && r < algos; r++) {
                choice.pick = r;
                matmul_plans_clear();
                char what[600];
                snprintf(what, sizeof what, "%s (the heuristic's answer %d)", buf, r);
                run_checked(what);
                cand_ms.push_back(time_ms(5, run));
            }
            choice.pick = 0;
            choice.request = 1;
            matmul_plans_clear();
        } else {
            run_checked(buf);
            cand_ms.push_back(time_ms(5, run));
        }
        float ms = cand_ms[0];
        printf("%s ms=%.6f tflops=%.2f", buf, ms, ms > 0 ? 2.0 * m * n * k * batch / (ms * 1e-3) / 1e12 : 0.0);
        if (algos > 1) {
            int best = 0;
            for (int r = 1; r < (int)cand_ms.size(); r++) if (cand_ms[r] < cand_ms[best]) best = r;
            printf(" best=%d:%.6f candidates=", best, cand_ms[best]);
            for (size_t r = 0; r < cand_ms.size(); r++) printf("%s%.6f", r ? "," : "", cand_ms[r]);
            sum_first += count * (double)cand_ms[0];
            sum_best += count * (double)cand_ms[best];
        }
        printf("\n");
        for (void* p : {A, B, D, (void*)scale_a, (void*)scale_b}) if (p) cudaCheck(cudaFree(p));
    }
    fclose(f);
    if (algos > 1)
        printf("# -a %d: the list's GEMMs, count x ms: %.3f ms at the heuristic's first answer, %.3f ms at the fastest of its first %d "
               "(%.1f%% less)\n", algos, sum_first, sum_best, algos, sum_first > 0 ? 100.0 * (1.0 - sum_best / sum_first) : 0.0);
    return finish();
}

int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "-x")) return expert_gemms();
    if (argc == 2 && !strcmp(argv[1], "-b")) return expert_streams();
    if (argc == 2 && !strcmp(argv[1], "-c")) return sm_hold();
    if (argc >= 3 && !strcmp(argv[1], "-s")) {
        int algos = 1;
        bool ok = true;
        for (int i = 3; i < argc && ok; i++) {
            if (!strcmp(argv[i], "-w")) g_time_flush_l2 = false;
            else if (!strcmp(argv[i], "-a") && i + 1 < argc) {
                char* end;
                long v = strtol(argv[++i], &end, 10);
                if (*end || v < 1 || v > 64) { fprintf(stderr, "error: -a %s: the number of the heuristic's answers to time, 1 to 64\n", argv[i]); return 2; }
                algos = (int)v;
            } else ok = false;
        }
        if (ok) return gemm_sweep(argv[2], algos);
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [-x | -b | -c | -s FILE [-w] [-a N]]   (-x: the experts at DBRX-132B's shapes against a dense GEMM; -b: dbrx-1b's "
                "expert GEMMs on 1, 2, 4 streams and batched; -c: GEMMs beside C CTAs held; -s: the GEMMs listed in FILE, predict.py --gemm-shapes; -w: L2 not flushed; "
                "-a: each with the heuristic's first N algorithms)\n",
                argv[0]);
        return 2;
    }
    print_header("matmul (cuBLASLt)", "dbrx-1b GEMMs");
    struct { const char* name; int N, C, OC; } shapes[] = {
        {"Wqkv (16384 x 1024 -> 1536)", 16384, 1024, 1536},
        {"out_proj (16384 x 1024 -> 1024)", 16384, 1024, 1024},
        {"expert w1 (4096 x 1024 -> 1792)", 4096, 1024, 1792},
        {"expert w2 (4096 x 1792 -> 1024)", 4096, 1792, 1024},
        {"lm_head (16384 x 1024 -> 100352)", 16384, 1024, 100352},
    };
    for (auto& s : shapes) {
        int N = EMULATED ? s.N / 64 + 3 : s.N, C = EMULATED ? s.C / 16 : s.C, OC = EMULATED ? s.OC / 64 + 5 : s.OC;
        std::vector<float> inp = round_bf16(make_random((size_t)N * C, 1)), w = round_bf16(make_random((size_t)OC * C, 2, 0.05));
        std::vector<float> dout = round_bf16(make_random((size_t)N * OC, 3));
        floatX *di = to_device_bf16v(inp), *dw = to_device_bf16v(w), *ddo = to_device_bf16v(dout), *dout_fw = deviceAlloc(floatX, (size_t)N * OC);
        float *ddi = deviceAlloc(float, (size_t)N * C), *ddw = deviceAlloc(float, (size_t)OC * C);
        double flops = 2.0 * N * C * OC;
        printf(" %s\n", s.name);
        auto fwd = [&] { matmul_forward_gpu(dout_fw, di, dw, N, C, OC); };
        auto dgrad = [&] { matmul_backward_gpu(ddi, (float*)nullptr, ddo, di, dw, N, C, OC, 0.0f); };
        auto wgrad = [&] { matmul_backward_gpu((float*)nullptr, ddw, ddo, di, dw, N, C, OC, 0.0f); };
        if (EMULATED) {   // validate against the CPU's CBLAS GEMMs
            std::vector<float> out((size_t)N * OC), dinp((size_t)N * C, 0.0f), dweight((size_t)OC * C, 0.0f);
            matmul_forward(out.data(), inp.data(), w.data(), N, C, OC);
            matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), w.data(), N, C, OC);
            cudaCheck(cudaMemset(ddw, 0, dweight.size() * sizeof(float)));
            fwd(); dgrad(); wgrad();
            validate("  forward (TN, bf16 out)", from_device_bf16v(dout_fw, out.size()), out, 1e-2, 1e-2);
            validate("  dgrad (NN, fp32 out)", from_device_f32(ddi, dinp.size()), dinp, 1e-4, 1e-5);
            validate("  wgrad (NT, fp32 accumulate)", from_device_f32(ddw, dweight.size()), dweight, 1e-4, 1e-5);
        }
        report_flops("  forward (TN, bf16 out)", flops, time_ms(10, fwd));
        report_flops("  dgrad (NN, fp32 out)", flops, time_ms(10, dgrad));
        report_flops("  wgrad (NT, fp32 accumulate)", flops, time_ms(10, wgrad));
        for (void* p : {(void*)di, (void*)dw, (void*)ddo, (void*)dout_fw, (void*)ddi, (void*)ddw}) cudaCheck(cudaFree(p));
    }
    return finish();
}
