/*
 * embedding.cuh — token embedding lookup (wte; DBRX has no positional embedding: RoPE is applied
 * inside attention) and its backward.
 */
#pragma once
#include "common.h"

// out (N, C) = wte[tokens] ; wte (V, C)
static inline void embedding_forward(real* out, const int* tokens, const real* wte, int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) memcpy(out + (size_t)t * C, wte + (size_t)tokens[t] * C, C * sizeof(real));
}

// dwte (V, C) += scatter of dout (N, C) by token. Deterministic: each thread owns a slice of the
// C columns and adds tokens in order, so no two threads touch the same value and the summation
// order never changes.
static inline void embedding_backward(real* dwte, const real* dout, const int* tokens, int N, int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++)
        for (int t = 0; t < N; t++) dwte[(size_t)tokens[t] * C + c] += dout[(size_t)t * C + c];
}
