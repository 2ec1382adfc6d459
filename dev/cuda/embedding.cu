/*
 * embedding.cu — the small memory-bound kernels of the step, the model's versions:
 *   embedding forward (gather of BF16 rows), embedding backward (deterministic: host-sorted
 *   buckets, one thread per (distinct token, channel)), clip_qkv + RoPE forward
 *   and backward (fused).
 *   make dev/cuda/embedding && ./dev/cuda/embedding    (N 16384 tokens, C 1024, V 100352; qkv of dbrx-1b)
 */
#include "common.h"
#include "../../model/embedding.cuh"
#include "../../model/attention.cuh"

int main() {
    int N = EMULATED ? 150 : 16384, C = EMULATED ? 64 : 1024, V = EMULATED ? 300 : 100352;
    char shape[64];
    snprintf(shape, sizeof shape, "N %d, C %d, V %d", N, C, V);
    print_header("embedding, rope", shape);
    std::vector<int> tok(N);
    Rng r = {3};
    for (int& t : tok) t = (int)(rng_u64(&r) % (uint64_t)(V / 4));   // repeats, as in text
    std::vector<float> wte = round_bf16(make_random((size_t)V * C, 1)), out((size_t)N * C);
    embedding_forward(out.data(), tok.data(), wte.data(), N, C);
    int* dtok = to_device(tok);
    floatX *dwte = to_device_bf16v(wte), *dout = deviceAlloc(floatX, out.size());
    auto fwd = [&] { embedding_forward_gpu(dout, dtok, dwte, N, C); };
    fwd();
    validate("embedding forward", from_device_bf16v(dout, out.size()), out, 0, 0);
    report_bandwidth("embedding forward", 2.0 * N * C * 2, time_ms(20, fwd));
    std::vector<float> dy = make_random((size_t)N * C, 2), dw((size_t)V * C, 0.0f);
    embedding_backward(dw.data(), dy.data(), tok.data(), N, C);
    EmbeddingPlan plan;
    embedding_plan_build(&plan, tok.data(), N, V);
    int *du = to_device(plan.unique), *doff = to_device(plan.offsets), *dpos = to_device(plan.positions);
    float *ddy = to_device(dy), *ddw = deviceAlloc(float, dw.size());
    cudaCheck(cudaMemset(ddw, 0, dw.size() * sizeof(float)));
    auto bwd = [&] { embedding_backward_gpu(ddw, ddy, du, doff, dpos, (int)plan.unique.size(), C); };
    bwd();
    validate("embedding backward", from_device_f32(ddw, dw.size()), dw, 1e-5, 1e-6);
    report_bandwidth("embedding backward", (double)N * C * 4 + 2.0 * plan.unique.size() * C * 4, time_ms(20, bwd));

    int B = EMULATED ? 2 : 8, T = N / B, H = EMULATED ? 4 : 8, KV = 2, hd = EMULATED ? 16 : 128, qd = (H + 2 * KV) * hd;
    std::vector<float> pre = round_bf16(make_random((size_t)B * T * qd, 6, 4.0)), qkv(pre.size());
    std::vector<float> ct((size_t)T * hd / 2), st((size_t)T * hd / 2);
    rope_tables(ct.data(), st.data(), T, hd, 500000.0f);
    clip_forward(qkv.data(), pre.data(), qkv.size(), 8.0f);
    rope_forward(qkv.data(), ct.data(), st.data(), B, T, H, KV, hd);
    floatX *dpre = to_device_bf16v(pre), *dq = deviceAlloc(floatX, qkv.size());
    float *dct = to_device(ct), *dst = to_device(st);
    auto rope = [&] { clip_rope_forward_gpu(dq, dpre, dct, dst, B, T, H, KV, hd, 8.0f); };
    rope();
    validate("clip + rope forward", from_device_bf16v(dq, qkv.size()), qkv, 1e-2, 1e-2);
    report_bandwidth("clip + rope forward", 2.0 * qkv.size() * 2, time_ms(20, rope));
    std::vector<float> g = round_bf16(make_random(qkv.size(), 7));
    floatX* dgq = to_device_bf16v(g);
    rope_backward(g.data(), ct.data(), st.data(), B, T, H, KV, hd);
    clip_backward(g.data(), pre.data(), g.size(), 8.0f);
    clip_rope_backward_gpu(dgq, dpre, dct, dst, B, T, H, KV, hd, 8.0f);
    validate("clip + rope backward", from_device_bf16v(dgq, g.size()), g, 1e-2, 1e-2);
    report_bandwidth("clip + rope backward", 3.0 * g.size() * 2,
                     time_ms(20, [&] { clip_rope_backward_gpu(dgq, dpre, dct, dst, B, T, H, KV, hd, 8.0f); }));
    return finish();
}
