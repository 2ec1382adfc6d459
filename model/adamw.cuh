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

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: fp32 master weights, fp32 moments and gradients; the update writes the master weight and
// its BF16 working copy (round to nearest even). The global gradient norm: a fixed grid of blocks
// (independent of the device) each sums the squares of a fixed slice, one thread adds the partial
// sums in double, in order, and the host reads that one number. Deterministic.
#include "cuda_common.h"

// one element's update: the moments, the master weight and its BF16 copy
__device__ inline void adamw_element(float* param, floatX* param_bf16, const float* grad, float* m, float* v, size_t i, float lr,
                                     float beta1, float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + (1 - beta1) * g;
    float vi = beta2 * v[i] + (1 - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2, p = param[i];
    p -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
    param[i] = p;
    param_bf16[i] = __float2bfloat16(p);
}

__global__ void adamw_kernel(float* param, floatX* param_bf16, const float* grad, float* m, float* v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(param, param_bf16, grad, m, v, i, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2);
}

// t is the 1-based step count; the arguments of adamw_update, plus the BF16 copy
static inline void adamw_update_gpu(float* param, floatX* param_bf16, const float* grad, float* m, float* v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                    int t, cudaStream_t stream = 0) {
    float bc1 = (float)(1.0 - pow((double)beta1, t)), bc2 = (float)(1.0 - pow((double)beta2, t));
    int blocks = (int)std::min<size_t>((n + 255) / 256, 4096);
    if (n == 0) return;
    LAUNCH(adamw_kernel, blocks, 256, 0, stream, param, param_bf16, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
           grad_scale, bc1, bc2);
}

// One launch for many tensors (the parameter store's shard: its segments, each one tensor's piece, at
// seg_off with seg_n elements, decay 1: a matrix, weight decay; 0: a norm): block (x, y) strides over
// segment y. The same arithmetic per element as adamw_kernel, so the result is bit-identical to one
// launch per segment; the elements outside every segment (the shards' padding) are not touched.
__global__ void adamw_multi_kernel(float* param, floatX* param_bf16, const float* grad, float* m, float* v, const size_t* seg_off,
                                   const size_t* seg_n, const int* seg_decay, float lr, float beta1, float beta2, float eps,
                                   float weight_decay, float grad_scale, float bc1, float bc2) {
    size_t off = seg_off[blockIdx.y], n = seg_n[blockIdx.y];
    float wd = seg_decay[blockIdx.y] ? weight_decay : 0.0f;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        adamw_element(param, param_bf16, grad, m, v, off + j, lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2);
}

// the segments' table on the device (seg_off, seg_n, seg_decay: nseg each), their longest n
static inline void adamw_multi_update_gpu(float* param, floatX* param_bf16, const float* grad, float* m, float* v, const size_t* seg_off,
                                          const size_t* seg_n, const int* seg_decay, int nseg, size_t max_n, float lr, float beta1,
                                          float beta2, float eps, float weight_decay, float grad_scale, int t, cudaStream_t stream = 0) {
    if (nseg == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, t)), bc2 = (float)(1.0 - pow((double)beta2, t));
    int bx = (int)std::max<size_t>(1, std::min<size_t>((max_n + 255) / 256, 512));
    LAUNCH(adamw_multi_kernel, dim3(bx, nseg), 256, 0, stream, param, param_bf16, grad, m, v, seg_off, seg_n, seg_decay, lr, beta1, beta2,
           eps, weight_decay, grad_scale, bc1, bc2);
}

#define GRAD_NORM_BLOCKS 256
#define GRAD_NORM_SCRATCH (GRAD_NORM_BLOCKS + 2)   // floats: the partials, then their sum (a double)
// partial (GRAD_NORM_BLOCKS): block b sums grad[i]^2 over i = b*blockDim + tid + k*gridDim*blockDim
__global__ void grad_sumsq_kernel(float* partial, const float* grad, size_t n) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += grad[i] * grad[i];
    float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// *out = the partials added in double, in order (one thread: 256 additions)
__global__ void grad_sumsq_finish_kernel(double* out, const float* partial) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double acc = 0;
    for (int b = 0; b < GRAD_NORM_BLOCKS; b++) acc += partial[b];
    *out = acc;
}

// sum of squares of grad (n), as grad_sumsq; scratch: GRAD_NORM_SCRATCH floats of device memory.
// The host's one read (8 bytes, synchronising) is what the clipping scale needs.
static inline double grad_sumsq_gpu(const float* grad, size_t n, float* scratch, cudaStream_t stream = 0) {
    LAUNCH(grad_sumsq_kernel, GRAD_NORM_BLOCKS, 512, 0, stream, scratch, grad, n);
    double* sum = (double*)(scratch + GRAD_NORM_BLOCKS);
    LAUNCH(grad_sumsq_finish_kernel, 1, 32, 0, stream, sum, scratch);
    double acc = 0;
    cudaCheck(cudaMemcpyAsync(&acc, sum, sizeof acc, cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    return acc;
}
#endif  // DBRX_HAVE_CUDA
