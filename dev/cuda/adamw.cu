/*
 * adamw.cu — the optimizer step over n parameters and the global gradient norm:
 *   AdamW v1  grid-stride, scalar (the model's kernel, model/adamw.cuh)
 *   AdamW v2  grid-stride over float4 (n % 4 == 0)
 *   grad norm (the model's: fixed grid, block sums, one thread adds the partials in double)
 * Bytes per parameter for AdamW: grad 4 + m, v, master 3 x (4 read + 4 write) + bf16 copy 2 = 30 B.
 *   make dev/cuda/adamw && ./dev/cuda/adamw      (n = 2^28: 1 GiB per fp32 array, far beyond L2)
 */
#include "common.h"
#include "../../model/adamw.cuh"

__global__ void adamw_v2(float4* param, floatX* param_bf16, const float4* grad, float4* m, float4* v, size_t n4, float lr,
                         float beta1, float beta2, float eps, float wd, float grad_scale, float bc1, float bc2) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 g = grad[i], mi = m[i], vi = v[i], p = param[i];
        float* gp = &g.x; float* mp = &mi.x; float* vp = &vi.x; float* pp = &p.x;
        for (int j = 0; j < 4; j++) {
            float gj = gp[j] * grad_scale;
            mp[j] = beta1 * mp[j] + (1 - beta1) * gj;
            vp[j] = beta2 * vp[j] + (1 - beta2) * gj * gj;
            pp[j] -= lr * ((mp[j] / bc1) / (sqrtf(vp[j] / bc2) + eps) + wd * pp[j]);
            param_bf16[4 * i + j] = __float2bfloat16(pp[j]);
        }
        m[i] = mi; v[i] = vi; param[i] = p;
    }
}

int main() {
    size_t n = EMULATED ? 100000 : ((size_t)1 << 28);
    char shape[64];
    snprintf(shape, sizeof shape, "n %zu", n);
    print_header("adamw", shape);
    std::vector<float> g = make_random(n, 1, 0.01), p = make_random(n, 2, 0.02), m = make_random(n, 3, 1e-3), v = make_random(n, 4, 1e-3);
    for (float& x : v) x = x * x;
    float *dg = to_device(g), *dp = to_device(p), *dm = to_device(m), *dv = to_device(v), *partial = deviceAlloc(float, GRAD_NORM_SCRATCH);
    floatX* dp16 = deviceAlloc(floatX, n);
    double want = grad_sumsq(g.data(), n), got = grad_sumsq_gpu(dg, n, partial);
    validate("grad norm^2 (model)", {(float)got}, {(float)want}, 1e-5, 0);
    report_bandwidth("grad norm (model)", 4.0 * n, time_ms(10, [&] { grad_sumsq_gpu(dg, n, partial); }));
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    float bc1 = (float)(1.0 - pow(0.9, 3)), bc2 = (float)(1.0 - pow(0.95, 3));
    std::vector<float> p0 = make_random(n, 2, 0.02), m0 = make_random(n, 3, 1e-3), v0 = make_random(n, 4, 1e-3);
    for (float& x : v0) x = x * x;
    std::function<void()> versions[2] = {
        [&] { adamw_update_gpu(dp, dp16, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3); },
        [&] { LAUNCH(adamw_v2, (int)std::min<size_t>((n / 4 + 255) / 256, 4096), 256, 0, 0, (float4*)dp, dp16, (const float4*)dg,
                     (float4*)dm, (float4*)dv, n / 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, bc1, bc2); },
    };
    const char* names[2] = {"adamw v1 (model)", "adamw v2 (float4)"};
    for (int ver = 0; ver < 2; ver++) {
        cudaCheck(cudaMemcpy(dp, p0.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dm, m0.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dv, v0.data(), n * 4, cudaMemcpyHostToDevice));
        versions[ver]();
        validate(names[ver], from_device_f32(dp, n), p, 1e-5, 1e-7);
        report_bandwidth(names[ver], 30.0 * n, time_ms(10, versions[ver]));
    }
    return finish();
}
