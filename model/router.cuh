/*
 * router.cuh — the MoE router and its auxiliary losses.
 *   p = softmax(h @ Wr^T) over ALL E experts (fp32); w, e = topk(p, k); w = w / sum(w)
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

// probs (N, E), lse (N), topk_idx (N, k), topk_w (N, k), counts (E) from logits (N, E)
static inline void router_forward(real* probs, real* lse, int* topk_idx, real* topk_w, int* counts,
                                  const real* logits, int N, int E, int k) {
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
        real wsum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= (idx[i] == e);
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            w[j] = p[best];
            wsum += p[best];
        }
        for (int j = 0; j < k; j++) w[j] /= wsum;  // L1 renormalisation
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
//   renorm: w_j = p_j / S  =>  dp_j = (dw_j - sum_i dw_i w_i) / S
//   LBL:    dp[t, e] += w_lb * E / (L N k) * c[e] / N
//   softmax: dz = p * (dp - sum(p * dp));   z-loss: dz += w_z / L * 2 lse / N * p
static inline void router_backward(real* dlogits, const real* dtopk_w, const real* probs, const real* lse,
                                   const int* topk_idx, const real* topk_w, const int* counts, int N, int E, int k,
                                   int L, float lbl_weight, float z_weight, float dloss) {
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
        real S = 0, dw_w = 0;
        for (int j = 0; j < k; j++) { S += p[idx[j]]; dw_w += dw[j] * w[j]; }
        for (int j = 0; j < k; j++) dz[idx[j]] += (dw[j] - dw_w) / S;
        real pdp = 0;
        for (int e = 0; e < E; e++) pdp += p[e] * dz[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - pdp) + z_coef * lse[t] * p[e];
    }
}
