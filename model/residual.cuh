/*
 * residual.cuh — the residual add of the attention half, out = x + y. (The MoE half's residual
 * add is fused into moe_combine_forward_gpu.) The backward is the identity: the gradient of
 * out flows to both x and y unchanged.
 */
#pragma once
#include "common.h"

// out (n) = x (n) + y (n)
static inline void residual_forward(real* out, const real* x, const real* y, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}

#if defined(__CUDACC__) || defined(SIMT_EMULATION)
#include "cuda_common.h"

__global__ void residual_forward_kernel(floatX* out, const floatX* x, const floatX* y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

static inline void residual_forward_gpu(floatX* out, const floatX* x, const floatX* y, size_t n, cudaStream_t stream = 0) {
    LAUNCH(residual_forward_kernel, ceil_div((long long)n, 256), 256, 0, stream, out, x, y, n);
}
#endif  // __CUDACC__ || SIMT_EMULATION
