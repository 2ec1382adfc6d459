/*
 * layernorm.cu — LayerNorm (weight only, fp32 statistics, BF16 in/out) versions:
 *   v1  one thread per row (naive: uncoalesced, little parallelism)
 *   v2  one warp per row, lane-strided scalar loads           (the model's for C % 8 != 0: W = 1)
 *   v3  one warp per row, 16-byte loads (8 BF16 per lane)      (the model's, model/layernorm.cuh)
 *   v4  the residual add fused in (resid = x + y written, then normalised; the model's for the MoE
 *       half's norm), against v5: the residual add and then the norm, two launches
 * and the model's backward (input gradient: warp per row; weight gradient: chunked column sums).
 * Bytes moved per forward: read x (2 B) + write y (2 B) per element (+ weight, stats: negligible);
 * fused: read x, y, write resid, out (8 B); unfused: the add's 6 B and the norm's 4 B.
 *   make dev/cuda/layernorm && ./dev/cuda/layernorm        (N = 16384 rows, C = 1024: dbrx-1b)
 */
#include "common.h"
#include "../../model/layernorm.cuh"
#include "../../model/residual.cuh"

// the residual add on its own (what the model ran before the fusion): out = bf16(x + y), 2-byte accesses
__global__ void residual_add_v1(floatX* out, const floatX* x, const floatX* y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

__global__ void layernorm_forward_v1(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w, int N, int C, float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float m = 0, v = 0;
    for (int c = 0; c < C; c++) m += __bfloat162float(x[c]);
    m /= C;
    for (int c = 0; c < C; c++) { float d = __bfloat162float(x[c]) - m; v += d * d; }
    float s = rsqrtf(v / C + eps);
    for (int c = 0; c < C; c++) out[(size_t)row * C + c] = __float2bfloat16((__bfloat162float(x[c]) - m) * s * __bfloat162float(w[c]));
    mean[row] = m;
    rstd[row] = s;
}

int main() {
    int N = EMULATED ? 77 : 16384, C = EMULATED ? 256 : 1024;
    char shape[64];
    snprintf(shape, sizeof shape, "N %d, C %d", N, C);
    print_header("layernorm", shape);
    std::vector<float> x = round_bf16(make_random((size_t)N * C, 1, 2.0)), w = round_bf16(make_random(C, 2));
    std::vector<float> out((size_t)N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    floatX *dx = to_device_bf16v(x), *dw = to_device_bf16v(w), *dout = deviceAlloc(floatX, out.size());
    float *dmean = deviceAlloc(float, N), *drstd = deviceAlloc(float, N);
    const float eps = 1e-5f;
    double bytes = 2.0 * N * C * sizeof(floatX);
    std::function<void()> versions[3] = {
        [&] { LAUNCH(layernorm_forward_v1, ceil_div(N, 128), 128, 0, 0, dout, dmean, drstd, dx, dw, N, C, eps); },
        [&] { LAUNCH(layernorm_forward_kernel<1>, ceil_div(N, 8), 256, 0, 0, dout, (floatX*)nullptr, dmean, drstd, dx,
                     (const floatX*)nullptr, dw, N, C, eps); },
        [&] { layernorm_forward_gpu(dout, dmean, drstd, dx, dw, N, C, eps); },
    };
    const char* names[3] = {"forward v1 (thread per row)", "forward v2 (warp per row, scalar)", "forward v3 (16 B accesses, model)"};
    for (int v = 0; v < 3; v++) {
        cudaCheck(cudaMemset(dout, 0xFF, out.size() * sizeof(floatX)));
        versions[v]();
        validate(names[v], from_device_bf16v(dout, out.size()), out, 1e-2, 1e-2);
        report_bandwidth(names[v], bytes, time_ms(20, versions[v]));
    }
    // the residual add fused in: resid = bf16(y + x), out = layernorm(resid), against the two steps
    {
        std::vector<float> y = round_bf16(make_random((size_t)N * C, 4)), resid((size_t)N * C), rout((size_t)N * C), rm(N), rs(N);
        residual_forward(resid.data(), y.data(), x.data(), resid.size());
        resid = round_bf16(resid);
        layernorm_forward(rout.data(), rm.data(), rs.data(), resid.data(), w.data(), N, C, eps);
        floatX *dy = to_device_bf16v(y), *dres = deviceAlloc(floatX, resid.size());
        float *fmean = deviceAlloc(float, N), *frstd = deviceAlloc(float, N);   // (the backward below reads dmean, drstd)
        auto fused = [&] { residual_layernorm_forward_gpu(dout, dres, fmean, frstd, dy, dx, dw, N, C, eps); };
        auto apart = [&] {
            LAUNCH(residual_add_v1, ceil_div((long long)N * C, 256), 256, 0, 0, dres, dy, dx, (size_t)N * C);
            layernorm_forward_gpu(dout, fmean, frstd, dres, dw, N, C, eps);
        };
        const char* fnames[2] = {"forward v4 (residual fused, model)", "forward v5 (residual, then v3)"};
        std::function<void()> fv[2] = {fused, apart};
        double fbytes[2] = {4.0 * N * C * sizeof(floatX), 5.0 * N * C * sizeof(floatX)};
        for (int v = 0; v < 2; v++) {
            cudaCheck(cudaMemset(dout, 0xFF, out.size() * sizeof(floatX)));
            cudaCheck(cudaMemset(dres, 0xFF, resid.size() * sizeof(floatX)));
            fv[v]();
            validate(fnames[v], from_device_bf16v(dout, out.size()), rout, 1e-2, 1e-2);
            validate("  the residual sum", from_device_bf16v(dres, resid.size()), resid, 0, 0);
            report_bandwidth(fnames[v], fbytes[v], time_ms(20, fv[v]));
        }
        for (void* p : {(void*)dy, (void*)dres, (void*)fmean, (void*)frstd}) cudaCheck(cudaFree(p));
    }
    // backward (the model's): reads dout fp32, x bf16, writes dinp fp32 (+ read) and its bf16 copy
    std::vector<float> dy = make_random((size_t)N * C, 3), dinp((size_t)N * C, 0.0f), dweight(C, 0.0f);
    layernorm_backward(dinp.data(), dweight.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    float *ddy = to_device(dy), *ddinp = deviceAlloc(float, dinp.size()), *ddw = deviceAlloc(float, C);
    float* scratch = deviceAlloc(float, layernorm_backward_scratch(N, C));
    floatX* ddinp16 = deviceAlloc(floatX, dinp.size());
    auto bwd = [&] {
        cudaCheck(cudaMemset(ddinp, 0, dinp.size() * sizeof(float)));
        cudaCheck(cudaMemset(ddw, 0, C * sizeof(float)));
        layernorm_backward_gpu(ddinp, ddinp16, ddw, scratch, ddy, dx, dw, dmean, drstd, N, C);
    };
    bwd();
    validate("backward dinp (model)", from_device_f32(ddinp, dinp.size()), dinp, 1e-4, 1e-5);
    validate("backward dweight (model)", from_device_f32(ddw, C), dweight, 1e-4, 1e-5);
    // dout read twice (dinp and dweight passes), x read twice, dinp read + written, bf16 copy written
    report_bandwidth("backward (model, incl. 2 memsets)", (double)N * C * (4 * 2 + 2 * 2 + 4 * 2 + 2), time_ms(20, bwd));
    return finish();
}
