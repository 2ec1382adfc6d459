/*
 * classifier.cu — the fused classifier (softmax + cross-entropy + dlogits over the vocabulary,
 * BF16 logits, one block per position):
 *   v1  scalar lane-strided loads (the model's kernel, model/classifier.cuh)
 *   v2  16-byte loads and stores (V % 8 == 0)
 * Bytes: the logits are read twice (statistics, gradient) and written once: 3 x 2 B per element.
 *   make dev/cuda/classifier && ./dev/cuda/classifier     (N 16384 positions, V 100352)
 */
#include <string>
#include "common.h"
#include "../../model/classifier.cuh"

__global__ void classifier_fused_v2(floatX* logits, float* losses, const int* targets, int V, float dloss) {
    __shared__ float scratch[32];
    floatX* z = logits + (size_t)blockIdx.x * V;
    int target = targets[blockIdx.x];
    float z_target = __bfloat162float(z[target]);
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
        Pack8 p = load8(z + i);
        for (int j = 0; j < 8; j++) {
            float x = __bfloat162float(p.v[j]);
            if (x > m) { s = s * expf(m - x) + 1.0f; m = x; }
            else s += expf(x - m);
        }
    }
    float M = block_max(m, scratch);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), scratch);
    float lse = M + logf(S);
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - z_target;
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
        Pack8 p = load8(z + i), g;
        for (int j = 0; j < 8; j++)
            g.v[j] = __float2bfloat16((expf(__bfloat162float(p.v[j]) - lse) - (i + j == target ? 1.0f : 0.0f)) * dloss);
        store8(z + i, g);
    }
}

int main() {
    int N = EMULATED ? 9 : 16384, V = EMULATED ? 1000 : 100352;
    char shape[64];
    snprintf(shape, sizeof shape, "N %d, V %d", N, V);
    print_header("classifier", shape);
    std::vector<float> logits = round_bf16(make_random((size_t)N * V, 1, 3.0)), losses(N);
    std::vector<int> targets(N);
    Rng r = {5};
    for (int& t : targets) t = (int)(rng_u64(&r) % (uint64_t)V);
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    std::vector<float> grad = logits;
    float dloss = 1.0f / N;
    crossentropy_backward(grad.data(), targets.data(), N, V, dloss);
    floatX* dl = deviceAlloc(floatX, logits.size());
    float* dlosses = deviceAlloc(float, N);
    int* dt = to_device(targets);
    std::function<void()> versions[2] = {
        [&] { classifier_fused_gpu(dl, dlosses, dt, N, V, dloss, true); },
        [&] { LAUNCH(classifier_fused_v2, N, 512, 0, 0, dl, dlosses, dt, V, dloss); },
    };
    const char* names[2] = {"fused v1 (model)", "fused v2 (16 B loads)"};
    for (int v = 0; v < 2; v++) {
        to_device_bf16(dl, logits.data(), logits.size());
        versions[v]();
        validate((std::string(names[v]) + ": losses").c_str(), from_device_f32(dlosses, N), losses, 1e-4, 1e-5);
        validate((std::string(names[v]) + ": dlogits").c_str(), from_device_bf16v(dl, grad.size()), grad, 1e-2, 1e-2);
        // timing rewrites the logits in place every repeat: the bytes moved are the same
        report_bandwidth(names[v], 3.0 * N * V * 2, time_ms(10, versions[v]));
    }
    return finish();
}
