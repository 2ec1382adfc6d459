/*
 * attention_cp_cuda.cuh — context parallelism's attention on the GPU (--context-parallel N, the all-gather form):
 * this rank's queries (its two balanced chunks, model/attention_ring.h) against the K|V of the whole sequence,
 * gathered from the CP group in rank order (kv_all (N, B, Tl, 2*kv*hd), BF16), with the causal mask by global
 * position; the backward gives dq here and dK|dV of every gathered row in FP32 (dkv_all, the same layout), which
 * the group reduce-scatters back to the rows' owners. No communication here (parallel/context_parallel.h does it).
 * The warp-per-row arithmetic of model/attention.cuh's simple kernels (not the flash kernels): a correctness path.
 * Within a gathered block (rank src's chunk i) the keys a query at global position P sees are a prefix: the first
 * min(c, P - start + 1) rows, start = the chunk's first position.
 */
#pragma once
#include "attention.cuh"

// the model's hooks (DbrxGPU.attn; NULL: the local attention): the same contract as the CPU's AttentionHooks
typedef struct {
    void (*forward)(void* ctx, floatX* out, float* lse, const floatX* qkv);
    void (*backward)(void* ctx, floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse);
    void* ctx;
} AttentionHooksGPU;

// the global position of local row tl of CP rank r (chunks r and 2n-1-r of c rows each)
__device__ inline int cp_row_pos(int r, int tl, int n, int c) { return (tl < c ? r : 2 * n - 1 - r) * c + tl % c; }

// kv (B*Tl, 2*kv*hd) = the K|V columns of qkv (B*Tl, qkv_dim)
__global__ void cp_pack_kv_kernel(floatX* kv, const floatX* qkv, size_t rows, int H, int KV, int hd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, kvw = 2 * (size_t)KV * hd;
    if (i >= rows * kvw) return;
    kv[i] = qkv[(i / kvw) * (size_t)(H + 2 * KV) * hd + H * hd + i % kvw];
}
// the K|V columns of dqkv = dkv (FP32, this rank's rows after the reduce-scatter), rounded to BF16
__global__ void cp_unpack_dkv_kernel(floatX* dqkv, const float* dkv, size_t rows, int H, int KV, int hd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, kvw = 2 * (size_t)KV * hd;
    if (i >= rows * kvw) return;
    dqkv[(i / kvw) * (size_t)(H + 2 * KV) * hd + H * hd + i % kvw] = __float2bfloat16(dkv[i]);
}

// one warp per query row (b, h, t): the online softmax over every gathered block's visible prefix
__global__ void cp_attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, const floatX* kv_all, int B, int Tl, int H, int KV,
                                            int hd, int n, int rank) {
    int lane = threadIdx.x % 32, c = Tl / 2;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * H * Tl) return;
    int t = row % Tl, h = (row / Tl) % H, b = row / ((size_t)Tl * H), kvh = h / (H / KV), qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd;
    int P = cp_row_pos(rank, t, n, c);
    float scale = 1.0f / sqrtf((float)hd), qr[ATT_MAX_PER_LANE], o[ATT_MAX_PER_LANE], m = -INFINITY, l = 0.0f;
    const floatX* q = qkv + ((size_t)b * Tl + t) * qd + h * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; qr[j] = i < hd ? __bfloat162float(q[i]) : 0.0f; o[j] = 0.0f; }
    for (int src = 0; src < n; src++)
        for (int ci = 0; ci < 2; ci++) {
            int start = cp_row_pos(src, ci * c, n, c), cnt = min(c, P - start + 1);
            for (int u = 0; u < cnt; u++) {
                const floatX* k = kv_all + (((size_t)src * B + b) * Tl + ci * c + u) * kvw + kvh * hd;
                const floatX* v = k + KV * hd;
                float s = 0.0f;
                for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) s += qr[j] * __bfloat162float(k[i]); }
                s = warp_sum(s) * scale;
                float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
                l = l * corr + p;
                for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) o[j] = o[j] * corr + p * __bfloat162float(v[i]); }
                m = mn;
            }
        }
    floatX* y = out + ((size_t)b * Tl + t) * H * hd + h * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) y[i] = __float2bfloat16(o[j] / l); }
    if (lane == 0) lse[row] = m + logf(l);
}

// dq (the Q columns of dqkv; the rest is the unpack's) and D (B, H, Tl) = rowsum(dout * out): one warp per query row
__global__ void cp_attention_dq_kernel(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse, const floatX* qkv,
                                       const floatX* kv_all, int B, int Tl, int H, int KV, int hd, int n, int rank) {
    int lane = threadIdx.x % 32, c = Tl / 2;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * H * Tl) return;
    int t = row % Tl, h = (row / Tl) % H, b = row / ((size_t)Tl * H), kvh = h / (H / KV), qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd;
    int P = cp_row_pos(rank, t, n, c);
    float scale = 1.0f / sqrtf((float)hd), qr[ATT_MAX_PER_LANE], dyr[ATT_MAX_PER_LANE], dq[ATT_MAX_PER_LANE], d = 0.0f;
    size_t qrow = (size_t)b * Tl + t;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
        int i = lane + 32 * j;
        qr[j] = i < hd ? __bfloat162float(qkv[qrow * qd + h * hd + i]) : 0.0f;
        dyr[j] = i < hd ? __bfloat162float(dout[qrow * H * hd + h * hd + i]) : 0.0f;
        if (i < hd) d += dyr[j] * __bfloat162float(out[qrow * H * hd + h * hd + i]);
        dq[j] = 0.0f;
    }
    d = warp_sum(d);
    float L = lse[row];
    for (int src = 0; src < n; src++)
        for (int ci = 0; ci < 2; ci++) {
            int start = cp_row_pos(src, ci * c, n, c), cnt = min(c, P - start + 1);
            for (int u = 0; u < cnt; u++) {
                const floatX* k = kv_all + (((size_t)src * B + b) * Tl + ci * c + u) * kvw + kvh * hd;
                const floatX* v = k + KV * hd;
                float s = 0.0f, dp = 0.0f;
                for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
                    int i = lane + 32 * j;
                    if (i < hd) { s += qr[j] * __bfloat162float(k[i]); dp += dyr[j] * __bfloat162float(v[i]); }
                }
                s = warp_sum(s) * scale;
                dp = warp_sum(dp);
                float ds = expf(s - L) * (dp - d) * scale;
                for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) dq[j] += ds * __bfloat162float(k[i]); }
            }
        }
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) dqkv[qrow * qd + h * hd + i] = __float2bfloat16(dq[j]); }
    if (lane == 0) Dbuf[row] = d;
}

// dK|dV of every gathered row (src, b, kvh, u) from this rank's queries that see it: one warp per key row; dkv_all FP32
__global__ void cp_attention_dkv_kernel(float* dkv_all, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv,
                                        const floatX* kv_all, int B, int Tl, int H, int KV, int hd, int n, int rank) {
    int lane = threadIdx.x % 32, c = Tl / 2;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // ((src, b, u), kvh)
    if (row >= (size_t)n * B * Tl * KV) return;
    int kvh = row % KV, qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd, group = H / KV;
    size_t krow = row / KV;   // (src, b, u)
    int u = krow % Tl, b = (krow / Tl) % B, src = krow / ((size_t)Tl * B);
    int Pk = cp_row_pos(src, u, n, c);
    float scale = 1.0f / sqrtf((float)hd), kr[ATT_MAX_PER_LANE], vr[ATT_MAX_PER_LANE], dk[ATT_MAX_PER_LANE], dv[ATT_MAX_PER_LANE];
    const floatX* k = kv_all + krow * kvw + kvh * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
        int i = lane + 32 * j;
        kr[j] = i < hd ? __bfloat162float(k[i]) : 0.0f;
        vr[j] = i < hd ? __bfloat162float(k[KV * hd + i]) : 0.0f;
        dk[j] = 0.0f; dv[j] = 0.0f;
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int t = 0; t < Tl; t++) {
            if (cp_row_pos(rank, t, n, c) < Pk) continue;   // (a query before the key: masked)
            size_t qrow = (size_t)b * Tl + t, r = ((size_t)b * H + h) * Tl + t;
            const floatX* q = qkv + qrow * qd + h * hd;
            const floatX* dy = dout + qrow * H * hd + h * hd;
            float s = 0.0f, dp = 0.0f;
            for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
                int i = lane + 32 * j;
                if (i < hd) { s += __bfloat162float(q[i]) * kr[j]; dp += __bfloat162float(dy[i]) * vr[j]; }
            }
            s = warp_sum(s) * scale;
            dp = warp_sum(dp);
            float p = expf(s - lse[r]), ds = p * (dp - Dbuf[r]) * scale;
            for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
                int i = lane + 32 * j;
                if (i < hd) { dk[j] += ds * __bfloat162float(q[i]); dv[j] += p * __bfloat162float(dy[i]); }
            }
        }
    float* o = dkv_all + krow * kvw + kvh * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) { o[i] = dk[j]; o[KV * hd + i] = dv[j]; } }
}

// the model's attention: the local one (flash or warp-per-row kernels), or the CP group's (hk->forward set)
static inline void attention_hooked_forward_gpu(const AttentionHooksGPU* hk, floatX* out, float* lse, const floatX* qkv, int B, int T, int H,
                                                int KV, int hd) {
    if (hk->forward) hk->forward(hk->ctx, out, lse, qkv);
    else attention_forward_gpu(out, lse, qkv, B, T, H, KV, hd);
}
static inline void attention_hooked_backward_gpu(const AttentionHooksGPU* hk, floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out,
                                                 const float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd) {
    if (hk->backward) hk->backward(hk->ctx, dqkv, dout, qkv, out, lse);
    else attention_backward_gpu(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, hd);
}
