/*
 * residual.cuh — the residual add of the attention half, out = x + y: the CPU reference. On the GPU
 * it is fused into the LayerNorm that reads it (residual_layernorm_forward_gpu, model/layernorm.cuh),
 * and the MoE half's residual add into moe_combine_forward_gpu. The backward is the identity: the
 * gradient of out flows to both x and y unchanged.
 */
#pragma once
#include "common.h"

// out (n) = x (n) + y (n)
static inline void residual_forward(real* out, const real* x, const real* y, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}
