/*
 * fp8_fused.cu — FP8 block quantisation fused into SwiGLU (model/fp8_fused.cuh) against the unfused pair the model
 * ran before (a SwiGLU kernel writing BF16, then fp8_quantize_kernel reading it back), on the routed rows of the
 * experts (E segments of R / E rows, F columns; E4M3 forward, E5M2 backward):
 *   forward   v1: swiglu_forward_gpu + fp8_quantize_kernel<FP8Q_ACT> (act's row-wise codes)
 *             v2: fp8_swiglu_quantize_kernel<FP8Q_ACT> (model): act in BF16 and its codes in one pass
 *   backward  v1: swiglu_backward_gpu + fp8_quantize_kernel<FP8Q_ACT> twice (dg, du: codes and transposed codes),
 *                 and once on the forward's act (its transposed codes: w2's weight gradient)
 *             v2: fp8_swiglu_bwd_quantize_kernel<FP8Q_ACT> with two outputs: the codes of dg and du, no BF16 dg / du
 *                 (act still quantised by fp8_quantize_kernel, as v1)
 *             v3: fp8_swiglu_bwd_quantize_kernel<FP8Q_ACT> with three outputs (model): act recomputed from g, u, its
 *                 transposed codes a third output
 * v2, v3 are validated against v1 bit for bit (codes, factors, act). GB/s are for the bytes each version must move.
 *   make dev/cuda/fp8_fused && ./dev/cuda/fp8_fused        (R 65536 = 16384 tokens x top-4, E 16, F 1792: dbrx-1b)
 */
#include "common.h"
#include "../../model/fp8_fused.cuh"

static std::vector<float> codes_of(const __nv_fp8_storage_t* p, size_t n) {
    std::vector<__nv_fp8_storage_t> c(n);
    cudaCheck(cudaMemcpy(c.data(), p, n, cudaMemcpyDeviceToHost));
    return std::vector<float>(c.begin(), c.end());
}

int main() {
    const int E = EMULATED ? 4 : 16, R = EMULATED ? 4 * 144 : 65536, F = EMULATED ? 272 : 1792;
    char shape[96];
    snprintf(shape, sizeof shape, "R %d, E %d, F %d, block scaling", R, E, F);
    print_header("fp8_fused", shape);
    const size_t n = (size_t)R * F, nct = (F + 127) / 128;
    Fp8Segments seg = fp8_uniform_segments(E, R / E);
    const size_t nq = nct * R, nt = (size_t)seg.row_tiles * F;   // the factors of q (1x128) and qt (128x1)
    floatX *g = to_device_bf16v(make_random(n, 1, 2.0)), *u = to_device_bf16v(make_random(n, 2)), *da = to_device_bf16v(make_random(n, 3, 0.01));
    floatX *act = deviceAlloc(floatX, n), *dgu = deviceAlloc(floatX, 2 * n);
    Fp8QuantOut o[3];
    for (Fp8QuantOut& x : o)
        x = {deviceAlloc(__nv_fp8_storage_t, n), deviceAlloc(__nv_fp8_storage_t, n), deviceAlloc(float, nq), deviceAlloc(float, nt), nullptr, nullptr};
    o[2].q = nullptr;   // act: the transposed codes only
    o[2].sinv = nullptr;
    Fp8FusedOut fo[3] = {{nullptr, nullptr, o[0]}, {nullptr, nullptr, o[1]}, {nullptr, nullptr, o[2]}};
    Fp8QuantOut fwd_out = o[0];
    fwd_out.qt = nullptr;
    fwd_out.sinv_t = nullptr;
    Fp8FusedOut ffo = {nullptr, nullptr, fwd_out};

    // forward
    std::function<void()> fwd[2] = {
        [&] { swiglu_forward_gpu(act, g, u, n); fp8_quantize_gpu(fwd_out, act, R, F, seg, FP8_E4M3, FP8Q_ACT, nullptr, nullptr, 0); },
        [&] { fp8_fused_quantize_gpu(FP8P_SWIGLU_FWD, {g, u, nullptr, act}, R, F, seg, FP8_E4M3, FP8Q_ACT, 0, ffo, ffo); },
    };
    const char* fwn[2] = {"swiglu fwd + quantize v1 (unfused)", "swiglu fwd + quantize v2 (fused, model)"};
    std::vector<float> ref_q, ref_s, ref_a;
    for (int v = 0; v < 2; v++) {
        cudaCheck(cudaMemset(o[0].q, 0xFF, n));
        cudaCheck(cudaMemset(act, 0xFF, n * sizeof(floatX)));
        fwd[v]();
        std::vector<float> q = codes_of(o[0].q, n), s = from_device_f32(o[0].sinv, nq), a = from_device_bf16v(act, n);
        if (v == 0) { ref_q = q; ref_s = s; ref_a = a; }
        validate(fwn[v], q, ref_q, 0, 0);
        validate("  its factors", s, ref_s, 0, 0);
        validate("  its act (BF16)", a, ref_a, 0, 0);
        double bytes = v == 0 ? n * (4.0 + 2 + 2 + 1) + 4.0 * nq : n * (4.0 + 2 + 1) + 4.0 * nq;
        report_bandwidth(fwn[v], bytes, time_ms(20, fwd[v]));
    }
    // backward
    auto quantize_act = [&] { fp8_quantize_gpu(o[2], act, R, F, seg, FP8_E4M3, FP8Q_ACT, nullptr, nullptr, 0); };
    std::function<void()> bwd[3] = {
        [&] {
            swiglu_backward_gpu(dgu, dgu + n, da, g, u, n);
            for (int i = 0; i < 2; i++) fp8_quantize_gpu(o[i], dgu + i * n, R, F, seg, FP8_E5M2, FP8Q_ACT, nullptr, nullptr, 0);
            quantize_act();
        },
        [&] { fp8_fused_quantize_gpu(FP8P_SWIGLU_BWD, {da, g, u, nullptr}, R, F, seg, FP8_E5M2, FP8Q_ACT, 0, fo[0], fo[1]); quantize_act(); },
        [&] { fp8_fused_quantize_gpu(FP8P_SWIGLU_BWD, {da, g, u, nullptr}, R, F, seg, FP8_E5M2, FP8Q_ACT, 0, fo[0], fo[1], 0, &fo[2], FP8_E4M3); },
    };
    const char* bwn[3] = {"swiglu bwd + quantize v1 (unfused)", "swiglu bwd + quantize v2 (fused dg, du)", "swiglu bwd + quantize v3 (fused dg, du, act; model)"};
    std::vector<float> rb[3][4];
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < 3; i++) { if (o[i].q) cudaCheck(cudaMemset(o[i].q, 0xFF, n)); cudaCheck(cudaMemset(o[i].qt, 0xFF, n)); }
        bwd[v]();
        printf("  %s\n", bwn[v]);
        for (int i = 0; i < 3; i++) {
            std::vector<float> got[4] = {i < 2 ? codes_of(o[i].q, n) : std::vector<float>(), codes_of(o[i].qt, n),
                                         i < 2 ? from_device_f32(o[i].sinv, nq) : std::vector<float>(), from_device_f32(o[i].sinv_t, nt)};
            for (int k = 0; k < 4; k++) {
                if (v == 0) rb[i][k] = got[k];
                const char* what[3][4] = {{"  dg codes", "  dg transposed codes", "  dg factors", "  dg transposed factors"},
                                          {"  du codes", "  du transposed codes", "  du factors", "  du transposed factors"},
                                          {"", "  act transposed codes", "", "  act transposed factors"}};
                if (i < 2 || k % 2) validate(what[i][k], got[k], rb[i][k], 0, 0);
            }
        }
        // bytes: da, g, u read; dg, du written and read back (v1); the codes; act read back (v1, v2)
        double bytes = v == 0 ? n * (6.0 + 4 + 2 * (2 + 2) + 2 + 1) : v == 1 ? n * (6.0 + 4 + 2 + 1) : n * (6.0 + 4 + 1);
        report_bandwidth(bwn[v], bytes + 2 * 4.0 * (nq + nt) + 4.0 * nt, time_ms(20, bwd[v]));
    }
    return finish();
}
