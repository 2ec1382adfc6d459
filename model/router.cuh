/*
 * router.cuh — the MoE router and its auxiliary losses.
 *   p = softmax(h @ Wr^T) over ALL E experts (fp32); w, e = topk(p, k); w = w / ||w||_P
 * P is the config's moe_normalize_expert_weights (norm_p below): ||w||_P = (sum_j w_j^P)^(1/P), the
 * original DBRX code's torch.norm(w, p=P); DBRX uses P = 1 (w / sum(w), computed as that very sum).
 * norm_p DBRX_OFF (HF null): no renormalisation, w = the top-k probabilities as they are.
 * Top-k ties go to the lower expert index. The slots of a token are ordered by descending
 * probability (ties: lower index first).
 * Load-balancing loss (MegaBlocks, as LLM Foundry trains DBRX), per MoE layer over its N tokens:
 *   lbl_l = w_lb * E / (L * N * k) * sum_e c[e] * P[e]
 *   c[e] = top-k assignments to expert e (no gradient), P[e] = mean_t p[t, e]
 * Router z-loss (optional, default weight 0); our choice of normalisation is the mean over layers:
 *   z_l = w_z / L * mean_t logsumexp(logits_t)^2
 */
#pragma once
#include "common.h"
#include "config.h"   // DBRX_OFF

// ||v||_P of a token's k top probabilities v_j = p[idx[j]] (P >= 1; P = 1: their plain sum, in slot
// order), the divisor of the renormalisation; 1 when it is off (norm_p DBRX_OFF)
static inline real topk_norm(const real* p, const int* idx, int k, float norm_p) {
    if (dbrx_is_off(norm_p)) return 1;
    real s = 0;
    if (norm_p == 1.0f) { for (int j = 0; j < k; j++) s += p[idx[j]]; return s; }
    for (int j = 0; j < k; j++) s += std::pow(p[idx[j]], (real)norm_p);
    return std::pow(s, (real)(1.0 / norm_p));
}

// probs (N, E), lse (N), topk_idx (N, k), topk_w (N, k), counts (E) from logits (N, E);
// norm_p: the renormalisation of the top-k weights (see the top of the file)
static inline void router_forward(real* probs, real* lse, int* topk_idx, real* topk_w, int* counts,
                                  const real* logits, int N, int E, int k, float norm_p) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* z = logits + (size_t)t * E;
        real* p = probs + (size_t)t * E;
        real maxv = z[0];
        for (int e = 1; e < E; e++) if (z[e] > maxv) maxv = z[e];
        real sum = 0;
        for (int e = 0; e < E; e++) { p[e] = std::exp(z[e] - maxv); sum += p[e]; }
        for (int e = 0; e < E; e++) p[e] /= sum;
        lse[t] = maxv + std::log(sum);
        // top-k by repeated arg-max; a strict '>' scanning upward keeps the lower index on ties
        int* idx = topk_idx + (size_t)t * k;
        real* w = topk_w + (size_t)t * k;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= (idx[i] == e);
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            w[j] = p[best];
        }
        if (!dbrx_is_off(norm_p)) {
            real S = topk_norm(p, idx, k, norm_p);
            for (int j = 0; j < k; j++) w[j] /= S;
        }
    }
    for (int e = 0; e < E; e++) counts[e] = 0;
    for (size_t i = 0; i < (size_t)N * k; i++) counts[topk_idx[i]]++;
}

// this layer's load-balancing loss term
static inline double lbl_forward(const real* probs, const int* counts, int N, int E, int k, int L, float weight) {
    double acc = 0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int t = 0; t < N; t++) P += probs[(size_t)t * E + e];
        acc += counts[e] * (P / N);
    }
    return (double)weight * E / ((double)L * N * k) * acc;
}

// this layer's z-loss term
static inline double zloss_forward(const real* lse, int N, int L, float weight) {
    double acc = 0;
    for (int t = 0; t < N; t++) acc += (double)lse[t] * lse[t];
    return (double)weight / L * acc / N;
}

// dlogits (N, E) = gradient of the router logits (overwritten), from:
//   dtopk_w (N, k)  gradient of the renormalised weights (from the combine),
//   the LBL and z-loss terms of this layer, each scaled by `dloss` (1 / grad_accum).
//   renorm: w_j = p_j / S, S = (sum_i p_i^P)^(1/P), dS/dp_j = (p_j / S)^(P-1) = w_j^(P-1)
//           =>  dp_j = (dw_j - (sum_i dw_i w_i) w_j^(P-1)) / S     (P = 1: (dw_j - sum_i dw_i w_i) / S)
//           off: w_j = p_j  =>  dp_j = dw_j
//   LBL:    dp[t, e] += w_lb * E / (L N k) * c[e] / N
//   softmax: dz = p * (dp - sum(p * dp));   z-loss: dz += w_z / L * 2 lse / N * p
static inline void router_backward(real* dlogits, const real* dtopk_w, const real* probs, const real* lse,
                                   const int* topk_idx, const real* topk_w, const int* counts, int N, int E, int k,
                                   int L, float lbl_weight, float z_weight, float dloss, float norm_p) {
    real lbl_coef = (real)((double)lbl_weight * E / ((double)L * N * k) / N * dloss);
    real z_coef = (real)((double)z_weight / L * 2.0 / N * dloss);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* p = probs + (size_t)t * E;
        const int* idx = topk_idx + (size_t)t * k;
        const real* w = topk_w + (size_t)t * k;
        const real* dw = dtopk_w + (size_t)t * k;
        real* dz = dlogits + (size_t)t * E;
        for (int e = 0; e < E; e++) dz[e] = lbl_coef * counts[e];  // dz holds dp for now
        if (dbrx_is_off(norm_p)) {
            for (int j = 0; j < k; j++) dz[idx[j]] += dw[j];
        } else {
            real S = topk_norm(p, idx, k, norm_p), dw_w = 0;
            for (int j = 0; j < k; j++) dw_w += dw[j] * w[j];
            for (int j = 0; j < k; j++) {
                real g = norm_p == 1.0f ? (real)1 : std::pow(w[j], (real)(norm_p - 1.0f));
                dz[idx[j]] += (dw[j] - dw_w * g) / S;
            }
        }
        real pdp = 0;
        for (int e = 0; e < E; e++) pdp += p[e] * dz[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - pdp) + z_coef * lse[t] * p[e];
    }
}

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA, all in fp32 (the router logits come out of a BF16 GEMM with an fp32 output). The forward
// is one thread per token running the CPU's very algorithm (softmax, top-k by repeated arg-max with
// ties to the lower index, the p-norm renormalisation or none: topk_norm_dev is topk_norm). The expert counts are an integer histogram
// (atomics on integers: exact). The LBL and z-loss need per-expert sums of the probabilities and
// the sum of lse^2: one block per column, a fixed-order block reduction; the host finishes the two
// scalars in double (it copies the counts anyway, see moe.cuh). The backward is one thread per
// token, the CPU's formula, writing the logit gradient in BF16 for the router's GEMMs.
#include "cuda_common.h"

// the CPU's topk_norm: ||p[idx[0..k)]||_P (P = 1: the plain sum in slot order), 1 when off
__device__ inline float topk_norm_dev(const float* p, const int* idx, int k, float norm_p) {
    if (norm_p < 0.0f) return 1.0f;
    float s = 0.0f;
    if (norm_p == 1.0f) { for (int j = 0; j < k; j++) s += p[idx[j]]; return s; }
    for (int j = 0; j < k; j++) s += powf(p[idx[j]], norm_p);
    return powf(s, 1.0f / norm_p);
}

// probs (N, E), lse (N), topk_idx (N, k), topk_w (N, k) from logits (N, E)
__global__ void router_forward_kernel(float* probs, float* lse, int* topk_idx, float* topk_w, const float* logits,
                                      int N, int E, int k, float norm_p) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float* z = logits + (size_t)t * E;
    float* p = probs + (size_t)t * E;
    float maxv = z[0];
    for (int e = 1; e < E; e++) if (z[e] > maxv) maxv = z[e];
    float sum = 0.0f;
    for (int e = 0; e < E; e++) { p[e] = expf(z[e] - maxv); sum += p[e]; }
    for (int e = 0; e < E; e++) p[e] /= sum;
    lse[t] = maxv + logf(sum);
    int* idx = topk_idx + (size_t)t * k;
    float* w = topk_w + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= (idx[i] == e);
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[j] = best;
        w[j] = p[best];
    }
    if (norm_p >= 0.0f) {
        float S = topk_norm_dev(p, idx, k, norm_p);
        for (int j = 0; j < k; j++) w[j] /= S;
    }
}

// The same for E <= 32 with a warp per token, lane e holding expert e (the thread per token above leaves 128 blocks
// at 16,384 tokens, one per SM, each thread walking its row in global memory k E times). The same bits: the sum
// of the exponentials and the renormalisation run in the same order, every lane adding the values it is passed;
// the max does not depend on order; the top-k's argmax breaks ties to the lower expert as the loop's strict > does.
__global__ void router_forward_warp_kernel(float* probs, float* lse, int* topk_idx, float* topk_w, const float* logits,
                                           int N, int E, int k, float norm_p) {
    const unsigned all = 0xffffffffu;
    int lane = threadIdx.x % 32;
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= N) return;   // a whole warp leaves
    bool expert = lane < E;
    float z = expert ? logits[(size_t)t * E + lane] : -INFINITY;
    float maxv = warp_max(z);
    float ex = expert ? expf(z - maxv) : 0.0f, sum = 0.0f;
    for (int e = 0; e < E; e++) sum += __shfl_sync(all, ex, e);
    float p = ex / sum;
    if (expert) probs[(size_t)t * E + lane] = p;
    if (lane == 0) lse[t] = maxv + logf(sum);
    bool taken = !expert;
    float w = 0.0f;   // lane j < k: slot j's weight
    int idx = 0;      // lane j < k: slot j's expert
    for (int j = 0; j < k; j++) {
        float v = taken ? -1.0f : p;   // (probabilities are >= 0)
        int best = lane;
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(all, v, o);
            int b2 = __shfl_xor_sync(all, best, o);
            if (v2 > v || (v2 == v && b2 < best)) { v = v2; best = b2; }
        }
        if (lane == best) taken = true;
        if (lane == j) { w = v; idx = best; }
    }
    if (norm_p >= 0.0f) {   // topk_norm_dev's sum, in slot order
        float S = 0.0f;
        for (int j = 0; j < k; j++) {
            float wj = __shfl_sync(all, w, j);
            S += norm_p == 1.0f ? wj : powf(wj, norm_p);
        }
        if (norm_p != 1.0f) S = powf(S, 1.0f / norm_p);
        w /= S;
    }
    if (lane < k) { topk_idx[(size_t)t * k + lane] = idx; topk_w[(size_t)t * k + lane] = w; }
}

// counts (E), zeroed by the caller, += the number of assignments to each expert. A block counts its blockDim.x (<= 256)
// assignments in shared memory and adds its E counts with one global atomic each (one global atomic per assignment
// queued N k / E deep on the E counters: 65,536 onto 16 at dbrx-1b). Integers: the same counts in any order. More
// experts than the block's 256 counters: one global atomic per assignment, as they come.
#define HIST_MAX_E 256
__global__ void expert_histogram_kernel(int* counts, const int* topk_idx, int n, int E) {
    __shared__ int hist[HIST_MAX_E];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (E > HIST_MAX_E) {
        if (i < n) atomicAdd(&counts[topk_idx[i]], 1);
        return;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    if (i < n) atomicAdd(&hist[topk_idx[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (hist[e]) atomicAdd(&counts[e], hist[e]);
}

// stats (E + 1): stats[e] = sum_t probs[t, e] for block e < E; stats[E] = sum_t lse[t]^2
__global__ void router_stats_kernel(float* stats, const float* probs, const float* lse, int N, int E) {
    __shared__ float scratch[32];
    int e = blockIdx.x;
    float acc = 0.0f;
    for (int t = threadIdx.x; t < N; t += blockDim.x) acc += e < E ? probs[(size_t)t * E + e] : lse[t] * lse[t];
    float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) stats[e] = total;
}

// the renormalisation's part of dp for slot j (the CPU's router_backward): (dw_j - dw_w w_j^(P-1)) / S,
// dw_j when the renormalisation is off
__device__ inline float renorm_dp(const float* dw, const float* w, int j, float dw_w, float S, float norm_p) {
    if (norm_p < 0.0f) return dw[j];
    float g = norm_p == 1.0f ? 1.0f : powf(w[j], norm_p - 1.0f);
    return (dw[j] - dw_w * g) / S;
}

// dlogits (N, E) bf16, the CPU's router_backward: renormalisation, LBL (counts) and z-loss terms
__global__ void router_backward_kernel(floatX* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                                       const int* topk_idx, const float* topk_w, const int* counts, int N, int E, int k,
                                       float lbl_coef, float z_coef, float norm_p) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float* p = probs + (size_t)t * E;
    const int* idx = topk_idx + (size_t)t * k;
    const float* w = topk_w + (size_t)t * k;
    const float* dw = dtopk_w + (size_t)t * k;
    float S = topk_norm_dev(p, idx, k, norm_p), dw_w = 0.0f;
    for (int j = 0; j < k; j++) dw_w += dw[j] * w[j];
    // dp[e] = lbl_coef * counts[e] + the renormalisation's part of every slot j routed to e
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) {
        float dp = lbl_coef * counts[e];
        for (int j = 0; j < k; j++) if (idx[j] == e) dp += renorm_dp(dw, w, j, dw_w, S, norm_p);
        pdp += p[e] * dp;
    }
    for (int e = 0; e < E; e++) {
        float dp = lbl_coef * counts[e];
        for (int j = 0; j < k; j++) if (idx[j] == e) dp += renorm_dp(dw, w, j, dw_w, S, norm_p);
        dlogits[(size_t)t * E + e] = __float2bfloat16(p[e] * (dp - pdp) + z_coef * lse[t] * p[e]);
    }
}

// The same for E <= 32 with a warp per token, lane e computing expert e's dp and dlogit. The same bits: every lane
// forms S, dw . w and p . dp from the values it is passed, in the thread kernel's order and expressions.
__global__ void router_backward_warp_kernel(floatX* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                                            const int* topk_idx, const float* topk_w, const int* counts, int N, int E, int k,
                                            float lbl_coef, float z_coef, float norm_p) {
    const unsigned all = 0xffffffffu;
    int lane = threadIdx.x % 32;
    int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= N) return;   // a whole warp leaves
    const float* p = probs + (size_t)t * E;
    const int* idx = topk_idx + (size_t)t * k;
    const float* w = topk_w + (size_t)t * k;
    const float* dw = dtopk_w + (size_t)t * k;
    float S = topk_norm_dev(p, idx, k, norm_p), dw_w = 0.0f;
    for (int j = 0; j < k; j++) dw_w += dw[j] * w[j];
    bool expert = lane < E;
    float pe = expert ? p[lane] : 0.0f, dp = expert ? lbl_coef * counts[lane] : 0.0f;
    for (int j = 0; j < k; j++) if (idx[j] == lane) dp += renorm_dp(dw, w, j, dw_w, S, norm_p);
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) {
        float pv = __shfl_sync(all, pe, e), dv = __shfl_sync(all, dp, e);
        pdp += pv * dv;
    }
    if (expert) dlogits[(size_t)t * E + lane] = __float2bfloat16(pe * (dp - pdp) + z_coef * lse[t] * pe);
}

// DBRX_DEBUG_ROUTE_FIRST (the tests' forced imbalance, as on the CPU, model/dbrx.h): logits (N, E) of experts 0..k-1 + 30
__global__ void route_first_kernel(float* logits, int N, int E, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * k) logits[(size_t)(i / k) * E + i % k] += 30.0f;
}
static inline void route_first_gpu(float* logits, int N, int E, int k, cudaStream_t stream = 0) {
    LAUNCH(route_first_kernel, ceil_div(N * k, 256), 256, 0, stream, logits, N, E, k);
}
// DBRX_DEBUG_ROUTE_BALANCED (benchmarks: the step-time model's balanced routing, as on the CPU, model/dbrx.h): logits (N, E)
// of experts (k t + j) mod E, j < k, of token t + 30
__global__ void route_balanced_kernel(float* logits, int N, int E, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * k) logits[(size_t)(i / k) * E + i % E] += 30.0f;
}
static inline void route_balanced_gpu(float* logits, int N, int E, int k, cudaStream_t stream = 0) {
    LAUNCH(route_balanced_kernel, ceil_div(N * k, 256), 256, 0, stream, logits, N, E, k);
}

// forward: probs, lse, topk_idx, topk_w, counts (device, E) and stats (device, E + 1); norm_p as on the CPU
static inline void router_forward_gpu(float* probs, float* lse, int* topk_idx, float* topk_w, int* counts, float* stats,
                                      const float* logits, int N, int E, int k, float norm_p, cudaStream_t stream = 0) {
    if (E <= 32)
        LAUNCH(router_forward_warp_kernel, ceil_div(N, 4), 128, 0, stream, probs, lse, topk_idx, topk_w, logits, N, E, k, norm_p);
    else
        LAUNCH(router_forward_kernel, ceil_div(N, 128), 128, 0, stream, probs, lse, topk_idx, topk_w, logits, N, E, k, norm_p);
    cudaCheck(cudaMemsetAsync(counts, 0, E * sizeof(int), stream));
    LAUNCH(expert_histogram_kernel, ceil_div((long long)N * k, 256), 256, 0, stream, counts, topk_idx, N * k, E);
    LAUNCH(router_stats_kernel, E + 1, 256, 0, stream, stats, probs, lse, N, E);
}

// this layer's LBL and z-loss terms from the host copies of counts (E) and stats (E + 1): the
// formulas of lbl_forward and zloss_forward
static inline double lbl_from_stats(const int* counts, const float* stats, int N, int E, int k, int L, float weight) {
    double acc = 0;
    for (int e = 0; e < E; e++) acc += counts[e] * ((double)stats[e] / N);
    return (double)weight * E / ((double)L * N * k) * acc;
}
static inline double zloss_from_stats(const float* stats, int N, int E, int L, float weight) {
    return (double)weight / L * (double)stats[E] / N;
}

static inline void router_backward_gpu(floatX* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                                       const int* topk_idx, const float* topk_w, const int* counts, int N, int E, int k,
                                       int L, float lbl_weight, float z_weight, float dloss, float norm_p,
                                       cudaStream_t stream = 0) {
    float lbl_coef = (float)((double)lbl_weight * E / ((double)L * N * k) / N * dloss);
    float z_coef = (float)((double)z_weight / L * 2.0 / N * dloss);
    if (E <= 32)
        LAUNCH(router_backward_warp_kernel, ceil_div(N, 4), 128, 0, stream, dlogits, dtopk_w, probs, lse, topk_idx, topk_w,
               counts, N, E, k, lbl_coef, z_coef, norm_p);
    else
        LAUNCH(router_backward_kernel, ceil_div(N, 128), 128, 0, stream, dlogits, dtopk_w, probs, lse, topk_idx, topk_w, counts,
               N, E, k, lbl_coef, z_coef, norm_p);
}
#endif  // DBRX_HAVE_CUDA
