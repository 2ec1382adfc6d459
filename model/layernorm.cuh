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
// CUDA: BF16 in and out, FP32 statistics. Forward: one warp per row. Backward: one block per 32-row chunk
// computes the input gradient and the chunk's weight-gradient partial in one pass; the partials are added in
// groups, then the groups in order, without atomics. Deterministic.
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

// fp32 rows W at a time (4 or 8: 16-byte accesses; 1: scalar)
template <int W> struct alignas(W % 4 == 0 ? 16 : 4) F32Vec { float v[W]; };
template <int W> __device__ __forceinline__ void load_f32(float* f, const float* p) {
    F32Vec<W> x = *(const F32Vec<W>*)p;
    for (int j = 0; j < W; j++) f[j] = x.v[j];
}
template <int W> __device__ __forceinline__ void store_f32(float* p, const float* f) {
    F32Vec<W> x;
    for (int j = 0; j < W; j++) x.v[j] = f[j];
    *(F32Vec<W>*)p = x;
}

static const int LN_ROWS_PER_CHUNK = 32;   // rows per block of the backward = rows per weight-gradient partial
static const int LN_CHUNKS_PER_GROUP = 8;  // partials per block of the column sum's first stage

// The backward in one pass over a chunk of LN_ROWS_PER_CHUNK rows per block (blockDim.x a multiple of 32):
//   dinp (N, C) += rstd * (dn - mean(dn) - n * mean(dn * n)),  n = (x - mean) * rstd, dn = dout * w;
//   dinp_bf16 (optional): a BF16 copy of the updated dinp, for the GEMMs that read it next;
//   partial (chunks, C): row j = sum over the chunk's rows, in row order, of dout * (x - mean) * rstd.
// The chunk goes by in slices of one row per warp, each read from HBM once and then re-read while it is in L1/L2.
// Three phases per slice, each spread over every warp of the block:
//   the row sums, warp per row: mean(dn), mean(dn n), each lane summing the channels lane, lane + 32, ... in that
//   order (the order of the warp-per-row kernel before, so the bits are the same), four channels' loads in flight;
//   the input gradient: (row, column segment of 32 W channels) pairs over the warps, W channels per lane (8: 16-byte
//   accesses);
//   the partial: 32-channel column groups over the warps, a lane per channel (coalesced), the slice's rows added
//   to the running sum in partial's row: the weight-gradient kernel's expression and loop, so that the compiler
//   forms the same FMAs (g++ leaves a loop-carried sum unfused when it is its loop's one multiply-add: the
//   emulator's bits depend on it), and the sum is the same sequence of roundings as that kernel's.
// Which warp does which piece moves no value: dev/cuda/layernorm's bwd v2 (one segment per warp, so at d = 1024 half
// the warps idle in the last two phases) gives these very bits. dout and inp are read once from HBM.
template <int W>
__global__ void layernorm_backward_kernel(float* dinp, floatX* dinp_bf16, float* partial, const float* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    __shared__ float dn_means[32], dn_n_means[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int r0 = blockIdx.x * LN_ROWS_PER_CHUNK, rows = min(LN_ROWS_PER_CHUNK, N - r0);
    int segs = (C + 32 * W - 1) / (32 * W), groups = (C + 31) / 32;
    float* part = partial + (size_t)blockIdx.x * C;
    for (int rb = 0; rb < rows; rb += nwarps) {
        int nb = min(nwarps, rows - rb);
        if (warp < nb) {
            int row = r0 + rb + warp;
            const floatX* x = inp + (size_t)row * C;
            const float* dy = dout + (size_t)row * C;
            float m = mean[row], s = rstd[row];
            float dn_sum = 0.0f, dn_n_sum = 0.0f;
            int c = lane;
            for (; c + 96 < C; c += 128) {   // channels c, c + 32, c + 64, c + 96: loaded together, added in order
                float xv[4], dv[4], wv[4];
                UNROLL for (int k = 0; k < 4; k++) {
                    xv[k] = __bfloat162float(x[c + 32 * k]);
                    dv[k] = dy[c + 32 * k];
                    wv[k] = __bfloat162float(weight[c + 32 * k]);
                }
                UNROLL for (int k = 0; k < 4; k++) {
                    float n = (xv[k] - m) * s, dn = dv[k] * wv[k];
                    dn_sum += dn;
                    dn_n_sum += dn * n;
                }
            }
            for (; c < C; c += 32) {
                float n = (__bfloat162float(x[c]) - m) * s, dn = dy[c] * __bfloat162float(weight[c]);
                dn_sum += dn;
                dn_n_sum += dn * n;
            }
            float dn_mean = warp_sum(dn_sum) / C, dn_n_mean = warp_sum(dn_n_sum) / C;
            if (lane == 0) { dn_means[warp] = dn_mean; dn_n_means[warp] = dn_n_mean; }
        }
        __syncthreads();
        for (int item = warp; item < nb * segs; item += nwarps) {   // (row i of the slice, segment)
            int i = item / segs, c = (item % segs) * 32 * W + lane * W;
            if (c >= C) continue;
            int row = r0 + rb + i;
            size_t at = (size_t)row * C + c;
            float m = mean[row], s = rstd[row], dn_mean = dn_means[i], dn_n_mean = dn_n_means[i];
            float wv[W], xv[W], dy[W], dx[W];
            load_bf16<W>(wv, weight + c);
            load_bf16<W>(xv, inp + at);
            load_f32<W>(dy, dout + at);
            load_f32<W>(dx, dinp + at);
            for (int j = 0; j < W; j++) {
                float n = (xv[j] - m) * s, dn = dy[j] * wv[j];
                dx[j] = dx[j] + s * (dn - dn_mean - n * dn_n_mean);
            }
            store_f32<W>(dinp + at, dx);
            if (dinp_bf16) store_bf16<W>(dinp_bf16 + at, dx);
        }
        for (int g = warp; g < groups; g += nwarps) {   // channel cj of the slice's partial row
            int cj = g * 32 + lane;
            if (cj >= C) continue;
            float acc = rb == 0 ? 0.0f : part[cj];
            for (int t = r0 + rb; t < r0 + rb + nb; t++)
                acc += dout[(size_t)t * C + cj] * (__bfloat162float(inp[(size_t)t * C + cj]) - mean[t]) * rstd[t];
            part[cj] = acc;
        }
        __syncthreads();   // dn_means is rewritten by the next slice
    }
}

// First stage of the column sum: partial row g * group = the sum, in row order, of rows [g * group, (g + 1) * group)
// (in place: each thread reads and then overwrites only its own column of its own group). One block per
// (group, 128 channels): the groups on x (they grow with the tokens), so the GPU is filled where one block per
// 128 channels was 8 blocks at d = 1024.
__global__ void column_sum_groups_kernel(float* partial, int rows, int C, int group) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.x * group, r1 = min(r0 + group, rows);
    float acc = 0.0f;
    for (int r = r0; r < r1; r++) acc += partial[(size_t)r * C + c];
    partial[(size_t)r0 * C + c] = acc;
}

// out (C) += (accumulate; else =) sum over rows 0, stride, 2 stride, ... (< rows) of partial (rows, C), in row order
__global__ void column_sum_kernel(float* out, const float* partial, int rows, int C, int stride, int accumulate) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; r += stride) acc += partial[(size_t)r * C + c];
    out[c] = accumulate ? out[c] + acc : acc;
}

// floats of scratch layernorm_backward_gpu needs
static inline size_t layernorm_backward_scratch(int N, int C) { return (size_t)ceil_div(N, LN_ROWS_PER_CHUNK) * C; }

// dinp (fp32) += ..., dinp_bf16 (optional) = bf16(dinp), dweight (fp32) += ... (dweight_acc 0: =) from dout (fp32). The weight gradient:
// 32-row chunk partials (the fused kernel), summed in groups of LN_CHUNKS_PER_GROUP chunks, then the groups in order:
// deterministic; with one group (N <= 256 rows) the very sum of the chunks in order that a single pass gives.
static inline void layernorm_backward_gpu(float* dinp, floatX* dinp_bf16, float* dweight, float* scratch, const float* dout,
                                          const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                                          int N, int C, cudaStream_t stream = 0, int dweight_acc = 1) {
    if (N == 0) return;
    int chunks = ceil_div(N, LN_ROWS_PER_CHUNK), groups = ceil_div(chunks, LN_CHUNKS_PER_GROUP);
    if (bf16_rows_vec8(C, {dinp, dinp_bf16, scratch, dout, inp, weight}))
        LAUNCH(layernorm_backward_kernel<8>, chunks, 256, 0, stream, dinp, dinp_bf16, scratch, dout, inp, weight, mean, rstd, N, C);
    else
        LAUNCH(layernorm_backward_kernel<1>, chunks, 256, 0, stream, dinp, dinp_bf16, scratch, dout, inp, weight, mean, rstd, N, C);
    LAUNCH(column_sum_groups_kernel, dim3(groups, ceil_div(C, 128)), 128, 0, stream, scratch, chunks, C, LN_CHUNKS_PER_GROUP);
    LAUNCH(column_sum_kernel, ceil_div(C, 128), 128, 0, stream, dweight, scratch, chunks, C, LN_CHUNKS_PER_GROUP, dweight_acc);
}
#endif  // DBRX_HAVE_CUDA
