/*
 * fp8_matmul.cu — FP8 against BF16 on the GEMMs of one dbrx-1b block (model/dbrx_fp8_cuda.cuh's
 * calls): Wqkv and out_proj on a micro-batch of 8 x 2048 = 16384 tokens, the expert GEMMs w1 (v1 is
 * the same shape) and w2 at 1024, 4096 (balanced routing: N k / E) and 16384 tokens. For each:
 *   bf16             cuBLASLt BF16, FP32 accumulation (the model without --fp8)
 *   fp8 tensor       E4M3 x E4M3 forward (fast accumulation), E5M2 x E4M3 dgrad and wgrad, one scale
 *                    per tensor (--fp8 delayed / current)
 *   fp8 block        the same with 1x128 / 128x1 activation tiles and 128x128 weight blocks (--fp8 block;
 *                    needs cuBLAS 12.9+ on sm_90: skipped with the reason otherwise)
 * forward (N, OC) = x (N, C) @ W^T, dgrad (N, C) = dy @ W (fp32 out), wgrad (OC, C) += dy^T @ x, each
 * 2 N C OC FLOPs against the dense peaks (H100 SXM: BF16 989.4, FP8 1978.9 TFLOP/s). The FP8 GEMMs are
 * timed on operands quantised beforehand; the quantisation kernel is timed on its own (GB/s: BF16 in,
 * FP8 out, both copies for the gradient) and, so that the end-to-end gain can be read off, "+quant"
 * lines time the model's sequence (quantise the operands, then the GEMM).
 * Validation: the FP8 GEMMs against the CPU reference's FP8 GEMMs (fp8_matmul_forward/backward, the
 * current and block recipes) on the same BF16 inputs. Under the emulator the shapes shrink (tokens
 * / 64, widths / 8) and only the validation runs.
 *   make dev/cuda/fp8_matmul && ./dev/cuda/fp8_matmul
 */
#include "common.h"
#include "../../model/fp8.cuh"

// Hopper's dense FP8 rate is twice its BF16 rate (H100 SXM 1978.9 TFLOP/s), the peak from model/gpu_peak.h
static inline void report_fp8_flops(const char* what, double flops, float ms) {
    if (EMULATED) return;
    double tf = flops / (ms * 1e-3) / 1e12, peak = 2 * bf16_peak_tflops();
    if (peak > 0) printf("  %-34s %9.4f ms  %8.1f TFLOP/s  %5.1f%% of FP8 dense (%.1f)\n", what, ms, tf, 100.0 * tf / peak, peak);
    else printf("  %-34s %9.4f ms  %8.1f TFLOP/s\n", what, ms, tf);
}

// one quantised operand: codes, transposed codes, factors, and the bookkeeping outputs
struct Q8 {
    __nv_fp8_storage_t *q, *qt;
    float *sinv, *sinv_t, *scale;
    unsigned int* amax;
    unsigned long long* sat;
    int rows, cols;
    Fp8Format fmt;
};
static Q8 q8_alloc(int rows, int cols, Fp8Format fmt) {
    Q8 b;
    size_t n = (size_t)rows * cols, tiles = rows / 128 + 1, nct = (cols + 127) / 128;
    b.q = deviceAlloc(__nv_fp8_storage_t, n);
    b.qt = deviceAlloc(__nv_fp8_storage_t, n);
    b.sinv = deviceAlloc(float, std::max(nct * rows, tiles * ((nct + 3) / 4 * 4)));
    b.sinv_t = deviceAlloc(float, std::max(tiles * cols, nct * (tiles + 4)));
    b.scale = deviceAlloc(float, 1);
    b.amax = deviceAlloc(unsigned int, 1);
    b.sat = deviceAlloc(unsigned long long, 1);
    cudaCheck(cudaMemset(b.amax, 0, 4));
    cudaCheck(cudaMemset(b.sat, 0, 8));
    b.rows = rows; b.cols = cols; b.fmt = fmt;
    return b;
}
static void q8_free(Q8& b) {
    for (void* p : {(void*)b.q, (void*)b.qt, (void*)b.sinv, (void*)b.sinv_t, (void*)b.scale, (void*)b.amax, (void*)b.sat}) cudaCheck(cudaFree(p));
}
// per tensor with the scale of the tensor's amax (what --fp8 current computes; `host` = the BF16 values)
static void q8_set_scale(Q8& b, const std::vector<float>& host) {
    float amax = 0;
    for (float v : host) amax = std::fmax(amax, std::fabs(v));
    float s = fp8_scale_for(amax, b.fmt, 0);
    cudaCheck(cudaMemcpy(b.scale, &s, sizeof s, cudaMemcpyHostToDevice));
}
static void q8_quantize(Q8& b, const floatX* x, bool block, bool weight, bool want_q, bool want_qt) {
    Fp8QuantOut out = {want_q ? b.q : nullptr, want_qt ? b.qt : nullptr, block ? (want_q ? b.sinv : nullptr) : b.sinv,
                       block && want_qt ? b.sinv_t : nullptr, b.amax, b.sat};
    Fp8QuantMode mode = !block ? FP8Q_TENSOR : weight ? FP8Q_WEIGHT : FP8Q_ACT;
    fp8_quantize_gpu(out, x, b.rows, b.cols, fp8_uniform_segments(1, b.rows), b.fmt, mode, b.scale, nullptr, 0);
}
// the GEMM operand: row-wise (ld = cols) or transposed (ld = rows)
static Fp8GemmOperand q8_operand(const Q8& b, bool transposed, bool block, bool weight, const char* name) {
    Fp8GemmOperand o;
    o.data = transposed ? b.qt : b.q;
    o.type = b.fmt == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    o.ld = transposed ? b.rows : b.cols;
    o.scale = block ? (transposed ? b.sinv_t : b.sinv) : b.sinv;
    o.scale_mode = !block ? MATMUL_SCALE_TENSOR : weight ? MATMUL_SCALE_BLK128 : MATMUL_SCALE_VEC128;
    o.name = name;
    return o;
}

int main() {
    print_header("fp8 matmul (cuBLASLt FP8 vs BF16)", "dbrx-1b GEMMs");
    std::string why;
    bool block_ok = matmul_fp8_block_supported(&why);
    if (!block_ok) printf("  fp8 block versions skipped: %s\n", why.c_str());
    struct { const char* name; int N, C, OC; } shapes[] = {
        {"Wqkv (16384 x 1024 -> 1536)", 16384, 1024, 1536},
        {"out_proj (16384 x 1024 -> 1024)", 16384, 1024, 1024},
        {"expert w1 (1024 x 1024 -> 1792)", 1024, 1024, 1792},
        {"expert w1 (4096 x 1024 -> 1792)", 4096, 1024, 1792},
        {"expert w1 (16384 x 1024 -> 1792)", 16384, 1024, 1792},
        {"expert w2 (4096 x 1792 -> 1024)", 4096, 1792, 1024},
    };
    for (auto& s : shapes) {
        int N = EMULATED ? std::max(128, s.N / 64) : s.N, C = EMULATED ? s.C / 8 : s.C, OC = EMULATED ? s.OC / 8 : s.OC;
        std::vector<float> inp = round_bf16(make_random((size_t)N * C, 1)), w = round_bf16(make_random((size_t)OC * C, 2, 0.05));
        std::vector<float> dout = round_bf16(make_random((size_t)N * OC, 3, 1e-3));
        floatX *di = to_device_bf16v(inp), *dw = to_device_bf16v(w), *ddo = to_device_bf16v(dout), *dout_fw = deviceAlloc(floatX, (size_t)N * OC);
        float *ddi = deviceAlloc(float, (size_t)N * C), *ddw = deviceAlloc(float, (size_t)OC * C);
        double flops = 2.0 * N * C * OC;
        printf(" %s%s\n", s.name, EMULATED ? " (shrunk)" : "");
        report_flops("  bf16 forward", flops, time_ms(10, [&] { matmul_forward_gpu(dout_fw, di, dw, N, C, OC); }));
        report_flops("  bf16 dgrad", flops, time_ms(10, [&] { matmul_backward_gpu(ddi, (float*)nullptr, ddo, di, dw, N, C, OC, 0.0f); }));
        report_flops("  bf16 wgrad", flops, time_ms(10, [&] { matmul_backward_gpu((float*)nullptr, ddw, ddo, di, dw, N, C, OC, 0.0f); }));
        Q8 qx = q8_alloc(N, C, FP8_E4M3), qw = q8_alloc(OC, C, FP8_E4M3), qg = q8_alloc(N, OC, FP8_E5M2);
        q8_set_scale(qx, inp); q8_set_scale(qw, w); q8_set_scale(qg, dout);
        for (int block = 0; block < 2; block++) {
            if (block && !block_ok) continue;
            const char* tag = block ? "fp8 block" : "fp8 tensor";
            auto quant_all = [&] {
                q8_quantize(qx, di, block, false, true, true);
                q8_quantize(qw, dw, block, true, true, true);
                q8_quantize(qg, ddo, block, false, true, true);
            };
            quant_all();
            auto fwd = [&] { gemm_fp8_gpu(N, OC, C, 1.0f, q8_operand(qx, false, block, false, "x"), q8_operand(qw, false, block, true, "w"), 0.0f, dout_fw, OC, 1); };
            auto dgrad = [&] { gemm_fp8_gpu(N, C, OC, 1.0f, q8_operand(qg, false, block, false, "dy"), q8_operand(qw, true, block, true, "w^T"), 0.0f, ddi, C, 0); };
            auto wgrad = [&] { gemm_fp8_gpu(OC, C, N, 1.0f, q8_operand(qg, true, block, false, "dy^T"), q8_operand(qx, true, block, false, "x^T"), 1.0f, ddw, C, 0); };
            if (EMULATED) {   // against the CPU reference's FP8 GEMMs on the same BF16 inputs
                Fp8Config cfg = {block ? FP8_BLOCK : FP8_CURRENT, 16, 0, 0};
                Fp8Linear st;
                fp8_meta_init(&st.x); fp8_meta_init(&st.w); fp8_meta_init(&st.dy);
                size_t big = std::max((size_t)N * std::max(C, OC), (size_t)OC * C);
                std::vector<float> q1(big), q2(big), q3(big), q4(big);
                std::vector<float> out((size_t)N * OC), dinp((size_t)N * C, 0.0f), dweight((size_t)OC * C, 0.0f);
                fp8_matmul_forward(out.data(), inp.data(), w.data(), N, C, OC, &st, &cfg, q1.data(), q2.data());
                fp8_matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), w.data(), N, C, OC, &st, &cfg, q1.data(),
                                    q2.data(), q3.data(), q4.data());
                cudaCheck(cudaMemset(ddw, 0, dweight.size() * sizeof(float)));
                fwd(); dgrad(); wgrad();
                std::string t(tag);
                validate((t + " forward (bf16 out)").c_str(), from_device_bf16v(dout_fw, out.size()), out, 8e-3, 1e-3);
                validate((t + " dgrad (fp32 out)").c_str(), from_device_f32(ddi, dinp.size()), dinp, 1e-4, 1e-5);
                validate((t + " wgrad (fp32 accumulate)").c_str(), from_device_f32(ddw, dweight.size()), dweight, 1e-4, 1e-5);
            }
            std::string t(tag);
            report_fp8_flops(("  " + t + " forward").c_str(), flops, time_ms(10, fwd));
            report_fp8_flops(("  " + t + " dgrad").c_str(), flops, time_ms(10, dgrad));
            report_fp8_flops(("  " + t + " wgrad").c_str(), flops, time_ms(10, wgrad));
            // the model's sequence: quantise what the GEMM needs, then the GEMM
            report_fp8_flops(("  " + t + " forward +quant").c_str(), flops, time_ms(10, [&] {
                q8_quantize(qx, di, block, false, true, false); q8_quantize(qw, dw, block, true, true, false); fwd(); }));
            report_fp8_flops(("  " + t + " dgrad+wgrad +quant").c_str(), 2 * flops, time_ms(10, [&] {
                q8_quantize(qg, ddo, block, false, true, true); q8_quantize(qw, dw, block, true, false, true); dgrad();
                q8_quantize(qx, di, block, false, false, true); wgrad(); }));
            report_bandwidth(("  " + t + " quantise dy (q + qt)").c_str(), (double)N * OC * 4, time_ms(10, [&] { q8_quantize(qg, ddo, block, false, true, true); }));
        }
        q8_free(qx); q8_free(qw); q8_free(qg);
        for (void* p : {(void*)di, (void*)dw, (void*)ddo, (void*)dout_fw, (void*)ddi, (void*)ddw}) cudaCheck(cudaFree(p));
    }
    return finish();
}
