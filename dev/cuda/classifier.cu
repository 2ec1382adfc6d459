/*
 * classifier.cu — the fused classifier (softmax + cross-entropy + dlogits over the vocabulary,
 * BF16 logits, one block per position):
 *   v1  scalar lane-strided loads (the model's for V % 8 != 0)
 *   v2  16-byte loads and stores (the model's, model/classifier.cuh)
 * Bytes: the logits are read twice (statistics, gradient) and written once: 3 x 2 B per element.
 *   make dev/cuda/classifier && ./dev/cuda/classifier     (N 16384 positions, V 100352)
 */
#include <string>
#include "common.h"
#include "../../model/classifier.cuh"

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
        [&] { LAUNCH(classifier_fused_kernel<1>, N, 512, 0, 0, dl, dlosses, dt, V, dloss, 1); },
        [&] { classifier_fused_gpu(dl, dlosses, dt, N, V, dloss, true); },
    };
    const char* names[2] = {"fused v1 (scalar)", "fused v2 (16 B accesses, model)"};
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
