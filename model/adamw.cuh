/*
 * adamw.cuh — the optimizer: global gradient norm, the learning-rate schedule (linear warmup, then
 * cosine decay to a floor) and AdamW with decoupled weight decay (applied to matrices only; the
 * caller passes weight_decay = 0 for LayerNorm weights).
 */
#pragma once
#include "common.h"

// sum of squares of grad (n), accumulated in double (the caller fixes the chunking, so the norm
// does not depend on the thread count)
static inline double grad_sumsq(const real* grad, size_t n) {
    double acc = 0;
    #pragma omp simd reduction(+ : acc)
    for (size_t i = 0; i < n; i++) acc += (double)grad[i] * grad[i];
    return acc;
}

// lr at 0-based step s of `total` steps
static inline float lr_schedule(int s, int total, float lr_max, int warmup, float floor_frac) {
    if (s < warmup) return lr_max * (float)(s + 1) / (float)warmup;
    double decay = (double)(s - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    if (decay > 1) decay = 1;
    double lr_min = (double)lr_max * floor_frac;
    return (float)(lr_min + 0.5 * (1.0 + cos(M_PI * decay)) * ((double)lr_max - lr_min));
}

// t is the 1-based step count; grad_scale multiplies the gradient (global-norm clipping)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m^ / (sqrt(v^) + eps) + wd p)
static inline void adamw_update(real* param, const real* grad, real* m, real* v, size_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, float grad_scale, int t) {
    real bc1 = (real)(1.0 - std::pow((double)beta1, t)), bc2 = (real)(1.0 - std::pow((double)beta2, t));
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        real mhat = m[i] / bc1, vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
    }
}
