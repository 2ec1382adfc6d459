/*
 * moe.cu — the router and the dropless MoE data movement (N tokens, E experts, top-k, width C,
 * expert hidden F), the model's kernels (model/router.cuh, model/moe.cuh) unless numbered:
 *   router forward (softmax, top-k, renormalise; histogram; LBL/z-loss column sums) and backward: v1 a thread per token
 *   (the model's for E > 32, and for every E until session 46), the model's a warp per token for E <= 32 (v1's bits)
 *   dispatch: offsets + the stable permutation, v1 one block per expert walking all N k assignments in sequence
 *   (E = 16 blocks: latency-bound, before the host sync; the model's before session 30), v2 (slices x experts
 *   blocks, each counting the assignments before its slice: the model's), both the CPU's rows exactly; gather, gather backward
 *   (alone; with the router's input gradient fused, the model's; the gather then cuBLASLt's k = E GEMM, before session 43),
 *   SwiGLU forward v1 (scalar) and v2 (16-byte accesses, the model's), combine forward (+ residual) and backward
 *   (v1 a warp per slot, the model's until session 46; v2 a warp per token, dout read once: the model's, v1's bits).
 * Memory-bound: each line gives GB/s for the bytes the kernel must move.
 * The expert layer's GEMMs (model/CUDA.md, "The expert GEMMs: one sync per MoE layer"): experts_forward_gpu
 * (w1+v1 as one batched GEMM per expert, SwiGLU, w2) with the dispatch's synchronising offsets copy
 * before it, the same without the copy (offsets already on the host), w1 and v1 as two GEMMs, and one
 * dense GEMM of the same FLOPs (all R rows against one expert: what a grouped GEMM reading the offsets
 * on the device could approach). TFLOP/s; the first two lines' difference is the sync's cost.
 *   make dev/cuda/moe && ./dev/cuda/moe        (N 16384, E 16, k 4, C 1024, F 1792: dbrx-1b)
 */
#include "common.h"
#include "../../model/router.cuh"
#include "../../model/moe.cuh"

// combine backward v1 (the model's until session 46): one warp per (token, slot), so dout's row is read k times, and
// one load at a time per lane; the model's (v2) reads it once per four slots with four loads in flight, in v1's order
__global__ void moe_combine_backward_v1(floatX* dye, float* dtopk_w, const float* dout, const floatX* ye,
                                        const float* topk_w, const int* slot_row, int N, int k, int C) {
    int lane = threadIdx.x % 32;
    size_t slot = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (slot >= (size_t)N * k) return;
    size_t t = slot / k, r = slot_row[slot];
    float w = topk_w[slot], dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dy = dout[t * C + c];
        dye[r * C + c] = __float2bfloat16(w * dy);
        dot += dy * __bfloat162float(ye[r * C + c]);
    }
    dot = warp_sum(dot);
    if (lane == 0) dtopk_w[slot] = dot;
}

// the permutation before session 30: block e places expert e's assignments, walking all N k of them in chunks
__global__ void moe_permute_v1(int* row_token, int* slot_row, const int* topk_idx, const int* offsets, int N, int k) {
    __shared__ int warp_counts[32];
    int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int total = N * k, running = offsets[e];
    for (int start = 0; start < total; start += blockDim.x) {
        int i = start + threadIdx.x;
        bool mine = i < total && topk_idx[i] == e;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, chunk = 0;
        for (int w = 0; w < nwarps; w++) { if (w < warp) before += warp_counts[w]; chunk += warp_counts[w]; }
        if (mine) {
            int r = running + before + before_in_warp;
            row_token[r] = i / k;
            slot_row[i] = r;
        }
        running += chunk;
        __syncthreads();
    }
}

int main() {
    int N = EMULATED ? 300 : 16384, E = 16, k = 4, C = EMULATED ? 64 : 1024, F = EMULATED ? 96 : 1792, R = N * k;
    char shape[96];
    snprintf(shape, sizeof shape, "N %d, E %d, k %d, C %d, F %d", N, E, k, C, F);
    print_header("moe", shape);
    // router
    std::vector<float> logits = make_random((size_t)N * E, 1, 1.5), probs((size_t)N * E), lse(N), w((size_t)N * k);
    std::vector<int> idx((size_t)N * k), counts(E);
    router_forward(probs.data(), lse.data(), idx.data(), w.data(), counts.data(), logits.data(), N, E, k, 1.0f);
    float *dlogits = to_device(logits), *dprobs = deviceAlloc(float, probs.size()), *dlse = deviceAlloc(float, N);
    float *dw = deviceAlloc(float, w.size()), *dstats = deviceAlloc(float, E + 1);
    int *didx = deviceAlloc(int, idx.size()), *dcounts = deviceAlloc(int, E);
    auto router_v1 = [&] {   // a thread per token (the model's for E > 32; until session 46 for all E)
        LAUNCH(router_forward_kernel, ceil_div(N, 128), 128, 0, 0, dprobs, dlse, didx, dw, dlogits, N, E, k, 1.0f);
    };
    auto router = [&] {   // a warp per token (the model's for E <= 32), with the histogram and the LBL/z-loss sums
        router_forward_gpu(dprobs, dlse, didx, dw, dcounts, dstats, dlogits, N, E, k, 1.0f);
    };
    router_v1();
    std::vector<float> probs_v1 = from_device_f32(dprobs, probs.size()), w_v1 = from_device_f32(dw, w.size());
    std::vector<float> lse_v1 = from_device_f32(dlse, N);
    std::vector<int> idx_v1(idx.size()), idx_got(idx.size());
    cudaCheck(cudaMemcpy(idx_v1.data(), didx, idx.size() * sizeof(int), cudaMemcpyDeviceToHost));
    report_bandwidth("router forward v1 (thread per token)", (double)N * E * 4 * 2 + (double)N * k * 8, time_ms(20, router_v1));
    router();
    validate("router forward: probs", from_device_f32(dprobs, probs.size()), probs, 1e-4, 1e-5);
    validate("router forward: top-k weights", from_device_f32(dw, w.size()), w, 1e-4, 1e-5);
    cudaCheck(cudaMemcpy(idx_got.data(), didx, idx.size() * sizeof(int), cudaMemcpyDeviceToHost));
    validate("  probs: v1's bits", from_device_f32(dprobs, probs.size()), probs_v1, 0, 0);
    validate("  top-k experts: v1's", std::vector<float>(idx_got.begin(), idx_got.end()), std::vector<float>(idx_v1.begin(), idx_v1.end()), 0, 0);
    validate("  lse: v1's bits", from_device_f32(dlse, N), lse_v1, 0, 0);
    validate("  top-k weights: v1's bits", from_device_f32(dw, w.size()), w_v1, 0, 0);
    report_bandwidth("router forward (warp per token + histogram + stats, model)", (double)N * E * 4 * 3 + (double)N * k * 8,
                     time_ms(20, router));
    {   // the router's backward: v1 a thread per token, the model's a warp per token (E <= 32)
        std::vector<float> dtw = make_random(w.size(), 21), dlg((size_t)N * E);
        std::vector<int> cnt_h(E);
        cudaCheck(cudaMemcpy(cnt_h.data(), dcounts, E * sizeof(int), cudaMemcpyDeviceToHost));
        router_backward(dlg.data(), dtw.data(), probs.data(), lse.data(), idx.data(), w.data(), cnt_h.data(), N, E, k, 4,
                        0.05f, 0.01f, 1.0f, 1.0f);
        float* ddtw = to_device(dtw);
        floatX* ddlg = deviceAlloc(floatX, dlg.size());
        // (router_backward_gpu's coefficients for L 4, weights 0.05 and 0.01, dloss 1)
        float lbl_coef = (float)((double)0.05f * E / (4.0 * N * k) / N * 1.0f), z_coef = (float)((double)0.01f / 4 * 2.0 / N * 1.0f);
        auto rb_v1 = [&] {
            LAUNCH(router_backward_kernel, ceil_div(N, 128), 128, 0, 0, ddlg, ddtw, dprobs, dlse, didx, dw, dcounts, N, E, k,
                   lbl_coef, z_coef, 1.0f);
        };
        auto rb = [&] { router_backward_gpu(ddlg, ddtw, dprobs, dlse, didx, dw, dcounts, N, E, k, 4, 0.05f, 0.01f, 1.0f, 1.0f); };
        rb_v1();
        std::vector<float> dlg_v1 = from_device_bf16v(ddlg, dlg.size());
        validate("router backward v1 (thread per token)", dlg_v1, dlg, 1e-2, 1e-2);
        report_bandwidth("router backward v1 (thread per token)", (double)N * E * (4 + 2) + (double)N * k * 12, time_ms(20, rb_v1));
        rb();
        validate("router backward (warp per token, model)", from_device_bf16v(ddlg, dlg.size()), dlg, 1e-2, 1e-2);
        validate("  v1's bits", from_device_bf16v(ddlg, dlg.size()), dlg_v1, 0, 0);
        report_bandwidth("router backward (warp per token, model)", (double)N * E * (4 + 2) + (double)N * k * 12, time_ms(20, rb));
        cudaCheck(cudaFree(ddtw)); cudaCheck(cudaFree(ddlg));
    }
    // dispatch
    std::vector<int> offsets(E + 1), row_token(R), slot_row(R), off_host(E + 1);
    moe_dispatch(offsets.data(), row_token.data(), slot_row.data(), idx.data(), counts.data(), N, E, k);
    int *doff = deviceAlloc(int, E + 1), *drt = deviceAlloc(int, R), *dsr = deviceAlloc(int, R);
    auto dispatch = [&] { moe_dispatch_gpu(doff, drt, dsr, off_host.data(), didx, dcounts, N, E, k); };
    auto dispatch_v1 = [&] {
        LAUNCH(moe_offsets_kernel, 1, 32, 0, 0, doff, dcounts, E);
        LAUNCH(moe_permute_v1, E, 256, 0, 0, drt, dsr, didx, doff, N, k);
        cudaCheck(cudaMemcpy(off_host.data(), doff, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost));
    };
    std::function<void()> dv[2] = {dispatch_v1, dispatch};
    const char* dvn[2] = {"dispatch v1 (E blocks scan N*k)", "dispatch v2 (slices x E, model)"};
    auto as_float = [](const std::vector<int>& v) { return std::vector<float>(v.begin(), v.end()); };
    for (int v = 0; v < 2; v++) {
        cudaCheck(cudaMemset(drt, 0xFF, R * sizeof(int)));
        cudaCheck(cudaMemset(dsr, 0xFF, R * sizeof(int)));
        dv[v]();
        std::vector<int> got(R);
        cudaCheck(cudaMemcpy(got.data(), drt, R * sizeof(int), cudaMemcpyDeviceToHost));
        validate(dvn[v], as_float(got), as_float(row_token), 0, 0);
        cudaCheck(cudaMemcpy(got.data(), dsr, R * sizeof(int), cudaMemcpyDeviceToHost));
        validate("  slot_row", as_float(got), as_float(slot_row), 0, 0);
        report_bandwidth(dvn[v], 4.0 * R + 2.0 * R * 4, time_ms(20, dv[v]));
    }
    // gather and its backward
    std::vector<float> x = round_bf16(make_random((size_t)N * C, 2)), xe((size_t)R * C);
    moe_gather(xe.data(), x.data(), row_token.data(), R, C);
    floatX *dx = to_device_bf16v(x), *dxe = deviceAlloc(floatX, xe.size());
    auto gather = [&] { moe_gather_gpu(dxe, dx, drt, R, C); };
    gather();
    validate("gather", from_device_bf16v(dxe, xe.size()), xe, 0, 0);
    report_bandwidth("gather", 2.0 * R * C * 2, time_ms(20, gather));
    std::vector<float> dxeb = round_bf16(make_random((size_t)R * C, 3)), dxh((size_t)N * C, 0.0f);   // BF16 rows, fp32 sums
    moe_gather_backward(dxh.data(), dxeb.data(), slot_row.data(), N, k, C);
    floatX* ddxe = to_device_bf16v(dxeb);
    float* ddx = deviceAlloc(float, dxh.size());
    auto gather_bwd = [&] { moe_gather_backward_gpu(ddx, ddxe, dsr, N, k, C); };
    gather_bwd();
    validate("gather backward", from_device_f32(ddx, dxh.size()), dxh, 1e-5, 1e-6);
    report_bandwidth("gather backward", (double)R * C * 2 + (double)N * C * 4, time_ms(20, gather_bwd));
    // the training step's form: + the router's input gradient dr (N, E) wr (E, C) in the same pass (the model's), and
    // the pair it replaced: the gather, then cuBLASLt's dinp += dr wr (k = E)
    std::vector<float> drh = round_bf16(make_random((size_t)N * E, 12)), wrh = round_bf16(make_random((size_t)E * C, 13, 0.1));
    std::vector<float> dxr = dxh;
    matmul_backward(dxr.data(), nullptr, drh.data(), nullptr, wrh.data(), N, C, E);
    floatX *ddr = to_device_bf16v(drh), *dwr = to_device_bf16v(wrh);
    std::function<void()> gr[2] = {
        [&] { moe_gather_backward_gpu(ddx, ddxe, dsr, N, k, C); matmul_backward_gpu(ddx, (float*)nullptr, ddr, (const floatX*)nullptr, dwr, N, C, E, 1.0f); },
        [&] { moe_gather_router_backward_gpu(ddx, ddxe, dsr, ddr, dwr, N, k, C, E); },
    };
    const char* grn[2] = {"gather bwd, then router dinp GEMM", "gather bwd + router dinp (model)"};
    for (int v = 0; v < 2; v++) {
        cudaCheck(cudaMemset(ddx, 0xFF, dxh.size() * sizeof(float)));
        gr[v]();
        validate(grn[v], from_device_f32(ddx, dxh.size()), dxr, 1e-4, 1e-5);
        report_bandwidth(grn[v], (double)R * C * 2 + (double)N * C * 4 + (double)N * E * 2, time_ms(20, gr[v]));
    }
    // SwiGLU
    size_t n = (size_t)R * F;
    std::vector<float> g = round_bf16(make_random(n, 4, 2.0)), u = round_bf16(make_random(n, 5)), a(n);
    swiglu_forward(a.data(), g.data(), u.data(), n);
    floatX *dg = to_device_bf16v(g), *du = to_device_bf16v(u), *da = deviceAlloc(floatX, n);
    std::function<void()> sw[2] = {
        [&] { LAUNCH(swiglu_forward_kernel<1>, ceil_div((long long)n, 256), 256, 0, 0, da, dg, du, n); },
        [&] { swiglu_forward_gpu(da, dg, du, n); },
    };
    const char* swn[2] = {"swiglu forward v1 (scalar)", "swiglu forward v2 (16 B, model)"};
    for (int v = 0; v < 2; v++) {
        cudaCheck(cudaMemset(da, 0xFF, n * sizeof(floatX)));
        sw[v]();
        validate(swn[v], from_device_bf16v(da, n), a, 1e-2, 1e-2);
        report_bandwidth(swn[v], 3.0 * n * 2, time_ms(20, sw[v]));
    }
    // combine (+ residual) and its backward
    std::vector<float> resid = round_bf16(make_random((size_t)N * C, 6)), ye = round_bf16(make_random((size_t)R * C, 7));
    std::vector<float> out = resid;
    moe_combine_forward(out.data(), ye.data(), w.data(), slot_row.data(), N, k, C);
    floatX *dres = to_device_bf16v(resid), *dye = to_device_bf16v(ye), *dout = deviceAlloc(floatX, out.size());
    auto comb = [&] { moe_combine_forward_gpu(dout, dres, dye, dw, dsr, N, k, C); };
    comb();
    validate("combine forward", from_device_bf16v(dout, out.size()), out, 1e-2, 1e-2);
    report_bandwidth("combine forward", (double)R * C * 2 + 2.0 * N * C * 2, time_ms(20, comb));
    std::vector<float> dy = make_random((size_t)N * C, 8), dyeh((size_t)R * C), dwh((size_t)N * k);
    moe_combine_backward(dyeh.data(), dwh.data(), dy.data(), ye.data(), w.data(), slot_row.data(), N, k, C);
    float *ddy = to_device(dy), *ddw = deviceAlloc(float, dwh.size());
    floatX* ddye = deviceAlloc(floatX, dyeh.size());
    auto comb_bwd1 = [&] {
        LAUNCH(moe_combine_backward_v1, ceil_div((long long)N * k, 4), 128, 0, 0, ddye, ddw, ddy, dye, dw, dsr, N, k, C);
    };
    auto comb_bwd = [&] { moe_combine_backward_gpu(ddye, ddw, ddy, dye, dw, dsr, N, k, C); };
    comb_bwd1();
    validate("combine backward v1 (warp per slot): dye", from_device_bf16v(ddye, dyeh.size()), dyeh, 1e-2, 1e-2);
    std::vector<float> dw_v1 = from_device_f32(ddw, dwh.size());
    validate("  dtopk_w", dw_v1, dwh, 1e-4, 1e-5);
    report_bandwidth("combine backward v1 (warp per slot)", (double)R * C * (2 + 2) + (double)N * C * 4, time_ms(20, comb_bwd1));
    comb_bwd();
    validate("combine backward v2 (warp per token, model): dye", from_device_bf16v(ddye, dyeh.size()), dyeh, 1e-2, 1e-2);
    validate("  dtopk_w", from_device_f32(ddw, dwh.size()), dwh, 1e-4, 1e-5);
    validate("  dtopk_w: v1's bits", from_device_f32(ddw, dwh.size()), dw_v1, 0, 0);
    report_bandwidth("combine backward v2 (warp per token, model)", (double)R * C * (2 + 2) + (double)N * C * 4, time_ms(20, comb_bwd));

    // the expert layer: w1 and v1 adjacent tensors (the model's layout), g and u (R, F), ye (R, C)
    size_t wn = (size_t)E * F * C;
    std::vector<float> wts = round_bf16(make_random(3 * wn, 9, 0.05)), gh((size_t)R * F), uh((size_t)R * F), ah((size_t)R * F);
    std::vector<float> yeh((size_t)R * C);
    experts_up_forward(gh.data(), uh.data(), ah.data(), xe.data(), wts.data(), wts.data() + wn, offsets.data(), E, C, F);
    experts_down_forward(yeh.data(), ah.data(), wts.data() + 2 * wn, offsets.data(), E, C, F);
    floatX *dwts = to_device_bf16v(wts), *dgg = deviceAlloc(floatX, 2 * n), *duu = dgg + n, *daa = deviceAlloc(floatX, n);
    floatX* dyy = deviceAlloc(floatX, (size_t)R * C);
    floatX *dw1 = dwts, *dv1 = dwts + wn, *dw2 = dwts + 2 * wn;
    auto experts_sync = [&] { dispatch(); experts_forward_gpu(dyy, dgg, duu, daa, dxe, dw1, dv1, dw2, off_host.data(), E, C, F); };
    auto experts = [&] { experts_forward_gpu(dyy, dgg, duu, daa, dxe, dw1, dv1, dw2, off_host.data(), E, C, F); };
    auto experts_two = [&] {   // w1 and v1 as two GEMMs per expert (the model before the batched pair)
        for (int e = 0; e < E; e++) {
            int r0 = off_host[e], ne = off_host[e + 1] - off_host[e];
            if (ne == 0) continue;
            matmul_forward_gpu(dgg + (size_t)r0 * F, dxe + (size_t)r0 * C, dw1 + (size_t)e * F * C, ne, C, F);
            matmul_forward_gpu(duu + (size_t)r0 * F, dxe + (size_t)r0 * C, dv1 + (size_t)e * F * C, ne, C, F);
        }
        swiglu_forward_gpu(daa, dgg, duu, n);
        for (int e = 0; e < E; e++) {
            int r0 = off_host[e], ne = off_host[e + 1] - off_host[e];
            if (ne == 0) continue;
            gemm_gpu(false, false, ne, C, F, 1.0f, daa + (size_t)r0 * F, F, dw2 + (size_t)e * F * C, C, 0.0f, dyy + (size_t)r0 * C, C);
        }
    };
    auto dense = [&] {   // the same FLOPs in one launch per projection: every row against expert 0
        gemm_gpu_batched(false, true, R, F, C, 1.0f, dxe, C, 0, dw1, C, (long long)wn, 0.0f, dgg, F, (long long)n, 2);
        swiglu_forward_gpu(daa, dgg, duu, n);
        gemm_gpu(false, false, R, C, F, 1.0f, daa, F, dw2, C, 0.0f, dyy, C);
    };
    const char* exn[4] = {"experts fwd: sync + per-expert GEMMs", "experts fwd: per-expert GEMMs", "experts fwd: w1, v1 two GEMMs",
                          "experts fwd: dense, same FLOPs"};
    std::function<void()> exf[4] = {experts_sync, experts, experts_two, dense};
    double flops = 2.0 * R * C * F * 3;
    for (int v = 0; v < 4; v++) {
        cudaCheck(cudaMemset(dyy, 0xFF, (size_t)R * C * sizeof(floatX)));
        exf[v]();
        cudaCheck(cudaDeviceSynchronize());
        if (v < 3) validate(exn[v], from_device_bf16v(dyy, yeh.size()), yeh, 2e-2, 2e-2);
        report_flops(exn[v], flops, time_ms(20, exf[v]));
    }
    if (!EMULATED) printf("  (%d experts: %d GEMM launches per expert forward, 1 synchronising copy per layer)\n", E, 2);
    return finish();
}
