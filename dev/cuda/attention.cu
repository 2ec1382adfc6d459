/*
 * attention.cu — causal GQA attention (B, T, H, KV, hd) versions, forward:
 *   v1  one warp per query row, lanes split head_dim, one warp reduction per key
 *       (the model's kernel, model/attention.cuh)
 *   v2  one warp per query row, 32 keys at a time: each lane scores one key (q in shared memory),
 *       two warp reductions per tile (max, sum), the probabilities broadcast by shuffles
 * and the model's backward (dq: warp per query row; dk, dv: warp per key row over its query group).
 * Neither is a flash kernel (tiles in shared memory, tensor cores): that is later work, behind the
 * same interface (out + logsumexp saved, probabilities recomputed in the backward).
 * FLOPs counted: causal forward 4 B H hd T(T+1)/2; backward 2.5x that.
 *   make dev/cuda/attention && ./dev/cuda/attention     (B 8, T 2048, H 8, KV 2, hd 128: dbrx-1b)
 */
#include "common.h"
#include "../../model/attention.cuh"

__global__ void attention_forward_v2(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd) {
    __shared__ float qs[4][256];   // blockDim 128: 4 warps, one query row each, hd <= 256
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * 4 + w;
    if (row >= (size_t)B * H * T) return;
    int t = row % T, h = (row / T) % H, b = row / ((size_t)T * H);
    int qkv_dim = (H + 2 * KV) * hd, C = H * hd, kvh = h / (H / KV);
    float scale = 1.0f / sqrtf((float)hd);
    const floatX* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
    for (int i = lane; i < hd; i += 32) qs[w][i] = __bfloat162float(q[i]) * scale;
    __syncwarp();
    const floatX* kbase = qkv + (size_t)b * T * qkv_dim + C + kvh * hd;
    const floatX* vbase = kbase + KV * hd;
    float o[ATT_MAX_PER_LANE];
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int t0 = 0; t0 <= t; t0 += 32) {
        int t2 = t0 + lane;
        float s = -INFINITY;
        if (t2 <= t) {
            const floatX* k = kbase + (size_t)t2 * qkv_dim;
            s = 0.0f;
            for (int i = 0; i < hd; i++) s += qs[w][i] * __bfloat162float(k[i]);
        }
        float m_new = fmaxf(m, warp_max(s));
        float p = t2 <= t ? expf(s - m_new) : 0.0f, corr = expf(m - m_new);
        l = l * corr + warp_sum(p);
        for (int j = 0; j < ATT_MAX_PER_LANE; j++) o[j] *= corr;
        int n = min(32, t - t0 + 1);
        for (int jj = 0; jj < n; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const floatX* v = vbase + (size_t)(t0 + jj) * qkv_dim;
            for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) o[j] += pj * __bfloat162float(v[i]); }
        }
        m = m_new;
    }
    floatX* y = out + ((size_t)b * T + t) * C + h * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) y[i] = __float2bfloat16(o[j] / l); }
    if (lane == 0) lse[row] = m + logf(l);
}

int main() {
    int B = EMULATED ? 1 : 8, T = EMULATED ? 45 : 2048, H = EMULATED ? 4 : 8, KV = 2, hd = EMULATED ? 40 : 128;
    int qd = (H + 2 * KV) * hd, C = H * hd;
    char shape[96];
    snprintf(shape, sizeof shape, "B %d, T %d, H %d, KV %d, hd %d", B, T, H, KV, hd);
    print_header("attention", shape);
    std::vector<float> qkv = round_bf16(make_random((size_t)B * T * qd, 1, 1.5));
    std::vector<float> out((size_t)B * T * C), att(EMULATED ? (size_t)B * H * T * T : 1);
    std::vector<float> dout = round_bf16(make_random(out.size(), 2)), dqkv(qkv.size());
    // the CPU reference holds (B, H, T, T) probabilities: at the full size it validates the first
    // batch row only (B = 1 view of the same data)
    int Bv = EMULATED ? B : 1;
    att.assign((size_t)Bv * H * T * T, 0.0f);
    attention_forward(out.data(), att.data(), qkv.data(), Bv, T, H, KV, hd);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), Bv, T, H, KV, hd);
    size_t nv = (size_t)Bv * T * C, nqv = (size_t)Bv * T * qd;
    out.resize(nv); dqkv.resize(nqv);
    floatX *dq = to_device_bf16v(qkv), *dy = deviceAlloc(floatX, (size_t)B * T * C), *ddout = to_device_bf16v(dout);
    floatX* ddq = deviceAlloc(floatX, qkv.size());
    float *dlse = deviceAlloc(float, (size_t)B * H * T), *dD = deviceAlloc(float, (size_t)B * H * T);
    double flops = 4.0 * B * H * hd * (double)T * (T + 1) / 2;
    std::function<void()> versions[2] = {
        [&] { attention_forward_gpu(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { LAUNCH(attention_forward_v2, ceil_div((long long)B * H * T, 4), 128, 0, 0, dy, dlse, dq, B, T, H, KV, hd); },
    };
    const char* names[2] = {"forward v1 (model)", "forward v2 (32-key tiles)"};
    for (int v = 0; v < 2; v++) {
        cudaCheck(cudaMemset(dy, 0xFF, (size_t)B * T * C * sizeof(floatX)));
        versions[v]();
        validate(names[v], from_device_bf16v(dy, nv), out, 1e-2, 1e-2);
        report_flops(names[v], flops, time_ms(EMULATED ? 1 : 5, versions[v]));
    }
    versions[0]();   // the backward reads the model's out and lse
    auto bwd = [&] { attention_backward_gpu(ddq, dD, ddout, dy, dlse, dq, B, T, H, KV, hd); };
    bwd();
    validate("backward (model)", from_device_bf16v(ddq, nqv), dqkv, 1e-2, 1e-2);
    report_flops("backward (model)", 2.5 * flops, time_ms(EMULATED ? 1 : 3, bwd));
    return finish();
}
