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

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: the fused classifier. One block per position: an online softmax (max and sum in one read
// of the row), the loss, and, when asked, the gradient written over the logits in the same kernel:
//   dlogits = (softmax(logits) - onehot(target)) * dloss
// so the (N, V) logits are read twice and written once, and never held in fp32.
#include "cuda_common.h"

// losses (N) from logits (N, V); with write_grad the logits are replaced by their gradient.
// W logits per access: 8 (16-byte loads and stores) when the rows allow it, else 1.
template <int W>
__global__ void classifier_fused_kernel(floatX* logits, float* losses, const int* targets, int V, float dloss, int write_grad) {
    __shared__ float scratch[32];
    int row = blockIdx.x;
    floatX* z = logits + (size_t)row * V;
    int target = targets[row];
    float z_target = __bfloat162float(z[target]);   // read before any thread overwrites the row
    float m = -INFINITY, s = 0.0f, x[W];
    for (int i = threadIdx.x * W; i < V; i += blockDim.x * W) {
        load_bf16<W>(x, z + i);
        for (int j = 0; j < W; j++) {
            if (x[j] > m) { s = s * expf(m - x[j]) + 1.0f; m = x[j]; }
            else s += expf(x[j] - m);
        }
    }
    float M = block_max(m, scratch);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), scratch);   // (the barriers inside order the reads above before the writes below)
    float lse = M + logf(S);
    if (threadIdx.x == 0) losses[row] = lse - z_target;
    if (!write_grad) return;
    for (int i = threadIdx.x * W; i < V; i += blockDim.x * W) {
        load_bf16<W>(x, z + i);
        for (int j = 0; j < W; j++) x[j] = (expf(x[j] - lse) - (i + j == target ? 1.0f : 0.0f)) * dloss;
        store_bf16<W>(z + i, x);
    }
}

static inline void classifier_fused_gpu(floatX* logits, float* losses, const int* targets, int N, int V, float dloss,
                                        bool write_grad, cudaStream_t stream = 0) {
    if (bf16_rows_vec8(V, {logits}))
        LAUNCH(classifier_fused_kernel<8>, N, 512, 0, stream, logits, losses, targets, V, dloss, write_grad ? 1 : 0);
    else
        LAUNCH(classifier_fused_kernel<1>, N, 512, 0, stream, logits, losses, targets, V, dloss, write_grad ? 1 : 0);
}

// *mean = the mean of losses (N), on the device, so that the host reads one number instead of N: one
// block, each thread sums a fixed strided slice in double, then a fixed tree: the same order every run
__global__ void loss_mean_kernel(double* mean, const float* losses, int N) {
    __shared__ double part[256];
    double acc = 0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) acc += losses[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *mean = part[0] / N;
}
static inline void loss_mean_gpu(double* mean, const float* losses, int N, cudaStream_t stream = 0) {
    LAUNCH(loss_mean_kernel, 1, 256, 0, stream, mean, losses, N);
}
#endif  // DBRX_HAVE_CUDA
