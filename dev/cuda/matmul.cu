/*
 * matmul.cu — the cuBLASLt wrapper (model/matmul.cuh) on the GEMMs of one dbrx-1b block and the
 * lm_head (micro-batch 8 x 2048 = 16384 tokens; an expert sees N k / E = 4096 rows on balanced
 * routing): forward (TN), dgrad (NN, fp32 out), wgrad (NT, fp32 accumulate). BF16 operands, FP32
 * accumulation. 2 M N K FLOPs each, against the dense BF16 peak.
 * Under the emulator the shapes shrink 64x and the results are validated against the CPU GEMM.
 *   make dev/cuda/matmul && ./dev/cuda/matmul
 */
#include "common.h"
#include "../../model/matmul.cuh"

int main() {
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
