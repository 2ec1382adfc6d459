/*
 * layernorm.cuh — LayerNorm with a weight and no bias (DBRX's norm_1, norm_2, norm_f), fp32
 * statistics, biased variance.
 *   y = (x - mean) * rstd * w,   rstd = 1 / sqrt(var + eps)
 */
#pragma once
#include "common.h"

// out (N, C), mean (N), rstd (N) from inp (N, C), weight (C)
static inline void layernorm_forward(real* out, real* mean, real* rstd, const real* inp, const real* weight,
                                     int N, int C, float eps) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* x = inp + (size_t)t * C;
        real m = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        real v = 0;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        real s = (real)1 / std::sqrt(v + (real)eps);
        real* y = out + (size_t)t * C;
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c];
        mean[t] = m;
        rstd[t] = s;
    }
}

// dinp (N, C) += ..., dweight (C) += ...
//   n = (x - mean) * rstd,  dn = dy * w
//   dx = rstd * (dn - mean(dn) - n * mean(dn * n)),   dw = sum_t dy * n
static inline void layernorm_backward(real* dinp, real* dweight, const real* dout, const real* inp,
                                      const real* weight, const real* mean, const real* rstd, int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* x = inp + (size_t)t * C;
        const real* dy = dout + (size_t)t * C;
        real m = mean[t], s = rstd[t];
        real dn_mean = 0, dn_n_mean = 0;
        for (int c = 0; c < C; c++) {
            real n = (x[c] - m) * s, dn = dy[c] * weight[c];
            dn_mean += dn;
            dn_n_mean += dn * n;
        }
        dn_mean /= C;
        dn_n_mean /= C;
        real* dx = dinp + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            real n = (x[c] - m) * s, dn = dy[c] * weight[c];
            dx[c] += s * (dn - dn_mean - n * dn_n_mean);
        }
    }
    // the weight gradient reduces over tokens: fixed blocks of 32 tokens each write a partial row,
    // and the partials are added in block order, so the sum never depends on the thread count
    const int blk = 32, nblk = (N + blk - 1) / blk;
    real* partial = (real*)mallocCheck((size_t)nblk * C * sizeof(real));
    #pragma omp parallel for
    for (int b = 0; b < nblk; b++) {
        real* acc = partial + (size_t)b * C;
        for (int c = 0; c < C; c++) acc[c] = 0;
        for (int t = b * blk; t < N && t < (b + 1) * blk; t++) {
            const real* x = inp + (size_t)t * C;
            const real* dy = dout + (size_t)t * C;
            for (int c = 0; c < C; c++) acc[c] += dy[c] * (x[c] - mean[t]) * rstd[t];
        }
    }
    for (int b = 0; b < nblk; b++)
        for (int c = 0; c < C; c++) dweight[c] += partial[(size_t)b * C + c];
    free(partial);
}

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: BF16 in and out, FP32 statistics. Forward and the input gradient: one warp per row.
// The weight gradient reduces over tokens without atomics: each block sums a fixed chunk of rows
// per channel into a scratch row, then one pass adds the chunks up in order. Deterministic.
#include "cuda_common.h"

// out (N, C), mean (N), rstd (N) from inp (N, C), weight (C). With `add` (N, C) the residual add is
// fused in: resid = bf16(inp + add) is written and normalised (rounded first, exactly as the unfused
// residual kernel then the norm computed it), which saves a launch and a round trip of the row through
// HBM. W values per access: 8 (16-byte loads and stores) when the rows allow it, else 1. A lane
// re-reads only what it wrote itself, so the warp needs no barrier between the passes.
template <int W>
__global__ void layernorm_forward_kernel(floatX* out, floatX* resid, float* mean, float* rstd, const floatX* inp,
                                         const floatX* add, const floatX* weight, int N, int C, float eps) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;   // a whole warp leaves: no barrier follows
    size_t base = (size_t)row * C;
    const floatX* x = add ? resid + base : inp + base;   // the row that is normalised
    float v[W], sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        load_bf16<W>(v, inp + base + c);
        if (add) {
            float a[W];
            load_bf16<W>(a, add + base + c);
            for (int j = 0; j < W; j++) v[j] = __bfloat162float(__float2bfloat16(v[j] + a[j]));
            store_bf16<W>(resid + base + c, v);
        }
        for (int j = 0; j < W; j++) sum += v[j];
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        load_bf16<W>(v, x + c);
        for (int j = 0; j < W; j++) { float dv = v[j] - m; var += dv * dv; }
    }
    float s = rsqrtf(warp_sum(var) / C + eps);
    for (int c = lane * W; c < C; c += 32 * W) {
        float wv[W];
        load_bf16<W>(v, x + c);
        load_bf16<W>(wv, weight + c);
        for (int j = 0; j < W; j++) v[j] = (v[j] - m) * s * wv[j];
        store_bf16<W>(out + base + c, v);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = s; }
}

// resid (N, C) = inp + add, out (N, C) = layernorm(resid): the residual add of the attention half fused
// into the norm of the MoE half. add == nullptr: a plain layernorm of inp (resid unused).
static inline void residual_layernorm_forward_gpu(floatX* out, floatX* resid, float* mean, float* rstd, const floatX* inp,
                                                  const floatX* add, const floatX* weight, int N, int C, float eps,
                                                  cudaStream_t stream = 0) {
    const int block = 256, rows_per_block = block / 32;
    if (bf16_rows_vec8(C, {out, resid, inp, add, weight}))
        LAUNCH(layernorm_forward_kernel<8>, ceil_div(N, rows_per_block), block, 0, stream, out, resid, mean, rstd, inp, add, weight, N, C, eps);
    else
        LAUNCH(layernorm_forward_kernel<1>, ceil_div(N, rows_per_block), block, 0, stream, out, resid, mean, rstd, inp, add, weight, N, C, eps);
}
static inline void layernorm_forward_gpu(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                         int N, int C, float eps, cudaStream_t stream = 0) {
    residual_layernorm_forward_gpu(out, nullptr, mean, rstd, inp, nullptr, weight, N, C, eps, stream);
}

// dinp (N, C) += rstd * (dn - mean(dn) - n * mean(dn * n)),  n = (x - mean) * rstd, dn = dout * w.
// dinp_bf16 (optional): a BF16 copy of the updated dinp, for the GEMMs that read it next.
__global__ void layernorm_backward_dinp_kernel(float* dinp, floatX* dinp_bf16, const float* dout, const floatX* inp,
                                               const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const float* dy = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dn_sum = 0.0f, dn_n_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s, dn = dy[c] * __bfloat162float(weight[c]);
        dn_sum += dn;
        dn_n_sum += dn * n;
    }
    float dn_mean = warp_sum(dn_sum) / C, dn_n_mean = warp_sum(dn_n_sum) / C;
    float* dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s, dn = dy[c] * __bfloat162float(weight[c]);
        float v = dx[c] + s * (dn - dn_mean - n * dn_n_mean);
        dx[c] = v;
        if (dinp_bf16) dinp_bf16[(size_t)row * C + c] = __float2bfloat16(v);
    }
}

// partial (chunks, C): chunk j holds sum over rows [j*rows_per_chunk, ...) of dout * n, per channel. The
// chunks on gridDim.x (N / 32 of them: past gridDim.y's 65,535 at 2.1 M tokens), the channel blocks on y
__global__ void layernorm_backward_dweight_partial_kernel(float* partial, const float* dout, const floatX* inp,
                                                          const float* mean, const float* rstd, int N, int C,
                                                          int rows_per_chunk) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.x * rows_per_chunk, r1 = min(r0 + rows_per_chunk, N);
    float acc = 0.0f;
    for (int t = r0; t < r1; t++)
        acc += dout[(size_t)t * C + c] * (__bfloat162float(inp[(size_t)t * C + c]) - mean[t]) * rstd[t];
    partial[(size_t)blockIdx.x * C + c] = acc;
}

// out (C) += sum over the rows of partial (rows, C), in row order
__global__ void column_sum_kernel(float* out, const float* partial, int rows, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; r++) acc += partial[(size_t)r * C + c];
    out[c] += acc;
}

static const int LN_ROWS_PER_CHUNK = 32;
// floats of scratch layernorm_backward_gpu needs
static inline size_t layernorm_backward_scratch(int N, int C) { return (size_t)ceil_div(N, LN_ROWS_PER_CHUNK) * C; }

// dinp (fp32) += ..., dinp_bf16 (optional) = bf16(dinp), dweight (fp32) += ... from dout (fp32)
static inline void layernorm_backward_gpu(float* dinp, floatX* dinp_bf16, float* dweight, float* scratch, const float* dout,
                                          const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                                          int N, int C, cudaStream_t stream = 0) {
    const int block = 256, rows_per_block = block / 32;
    LAUNCH(layernorm_backward_dinp_kernel, ceil_div(N, rows_per_block), block, 0, stream, dinp, dinp_bf16, dout, inp,
           weight, mean, rstd, N, C);
    int chunks = ceil_div(N, LN_ROWS_PER_CHUNK);
    LAUNCH(layernorm_backward_dweight_partial_kernel, dim3(chunks, ceil_div(C, 128)), 128, 0, stream, scratch, dout, inp,
           mean, rstd, N, C, LN_ROWS_PER_CHUNK);
    LAUNCH(column_sum_kernel, ceil_div(C, 128), 128, 0, stream, dweight, scratch, chunks, C);
}
#endif  // DBRX_HAVE_CUDA
