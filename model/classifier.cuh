/*
 * classifier.cuh — next-token cross-entropy over the (padded) vocabulary.
 *   loss_t = logsumexp(logits_t) - logits_t[target_t]        (mean over the N positions)
 *   dlogits_t = (softmax(logits_t) - onehot(target_t)) * dloss
 */
#pragma once
#include "common.h"

// losses (N) from logits (N, V); returns their mean
static inline double crossentropy_forward(real* losses, const real* logits, const int* targets, int N, int V) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* z = logits + (size_t)t * V;
        real maxv = z[0];
        for (int i = 1; i < V; i++) if (z[i] > maxv) maxv = z[i];
        real sum = 0;
        for (int i = 0; i < V; i++) sum += std::exp(z[i] - maxv);
        losses[t] = maxv + std::log(sum) - z[targets[t]];
    }
    double mean = 0;
    for (int t = 0; t < N; t++) mean += losses[t];
    return mean / N;
}

// logits (N, V) are replaced, in place, by the gradient of dloss * sum_t loss_t
static inline void crossentropy_backward(real* logits, const int* targets, int N, int V, real dloss) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        real* z = logits + (size_t)t * V;
        real maxv = z[0];
        for (int i = 1; i < V; i++) if (z[i] > maxv) maxv = z[i];
        real sum = 0;
        for (int i = 0; i < V; i++) { z[i] = std::exp(z[i] - maxv); sum += z[i]; }
        for (int i = 0; i < V; i++) z[i] = z[i] / sum * dloss;
        z[targets[t]] -= dloss;
    }
}
