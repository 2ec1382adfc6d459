/*
 * moe.cuh — the dropless mixture of SwiGLU experts.
 *   dispatch: per-expert histogram -> offsets -> permutation of the N*k (token, slot) pairs into
 *             expert order (a stable counting sort: tokens keep their order within an expert)
 *   experts:  for each expert e over its rows xe_e (n_e, d):
 *             g = xe_e @ w1_e^T, u = xe_e @ v1_e^T (n_e, F);  a = silu(g) * u;  ye_e = a @ w2_e (n_e, d)
 *             w1, v1, w2 are each (E*F, d); expert e owns rows e*F..(e+1)*F-1; w2_e is used as is.
 *   combine:  y[t] = sum_j w[t, j] * ye[row(t, j)]   (slots in order: deterministic)
 * Dropless: no capacity factor, every routed token is computed.
 */
#pragma once
#include "common.h"
#include "debug_hooks.h"
#include "matmul.cuh"

// offsets (E+1), row_token (N*k): grouped row -> token, slot_row (N*k): token slot t*k+j -> grouped row
static inline void moe_dispatch(int* offsets, int* row_token, int* slot_row, const int* topk_idx, const int* counts,
                                int N, int E, int k) {
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    int* cursor = (int*)mallocCheck(E * sizeof(int));
    memcpy(cursor, offsets, E * sizeof(int));
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int r = cursor[topk_idx[t * k + j]]++;
            row_token[r] = t;
            slot_row[t * k + j] = r;
        }
    free(cursor);
}

// xe (N*k, C) = x[row_token]
static inline void moe_gather(real* xe, const real* x, const int* row_token, int rows, int C) {
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) memcpy(xe + (size_t)r * C, x + (size_t)row_token[r] * C, C * sizeof(real));
}

// dx (N, C) += sum over the token's slots of dxe[slot_row]
static inline void moe_gather_backward(real* dx, const real* dxe, const int* slot_row, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            const real* src = dxe + (size_t)slot_row[t * k + j] * C;
            real* dst = dx + (size_t)t * C;
            for (int c = 0; c < C; c++) dst[c] += src[c];
        }
}

// SwiGLU: a = silu(g) * u,  silu(g) = g * sigmoid(g)
static inline void swiglu_forward(real* a, const real* g, const real* u, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
}
// dg = da * u * silu'(g),  du = da * silu(g);  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
static inline void swiglu_backward(real* dg, real* du, const real* da, const real* g, const real* u, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real s = 1 / (1 + std::exp(-g[i]));
        dg[i] = da[i] * u[i] * s * (1 + g[i] * (1 - s));
        du[i] = da[i] * g[i] * s;
    }
}

// The experts, rows grouped by expert, in two halves so that the FP8 path can quantise the SwiGLU
// output between them:  up: g = xe @ w1_e^T, u = xe @ v1_e^T, a = silu(g) * u;  down: ye = a @ w2_e.
// The experts run in parallel, one per thread at a time (their GEMMs are single-threaded inside the
// parallel loop); each writes only its own rows and weight gradients, so any order gives the same result.

// g, u, a (rows, F) from xe (rows, C)
static inline void experts_up_forward(real* g, real* u, real* a, const real* xe, const real* w1, const real* v1,
                                      const int* offsets, int E, int C, int F) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        size_t wo = (size_t)e * F * C;
        matmul_forward(g + (size_t)r0 * F, xe + (size_t)r0 * C, w1 + wo, n, C, F);
        matmul_forward(u + (size_t)r0 * F, xe + (size_t)r0 * C, v1 + wo, n, C, F);
        swiglu_forward(a + (size_t)r0 * F, g + (size_t)r0 * F, u + (size_t)r0 * F, (size_t)n * F);
    }
}

// ye (rows, C) = a (rows, F) @ w2_e (F, C), expert by expert
static inline void experts_down_forward(real* ye, const real* a, const real* w2, const int* offsets, int E, int C, int F) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        gemm_cpu(false, false, n, C, F, 1.0, a + (size_t)r0 * F, F, w2 + (size_t)e * F * C, C, 0.0, ye + (size_t)r0 * C, C);
    }
}

// da (rows, F) overwritten, dw2 (E*F, C) accumulated. The operands are named by their use so that
// FP8 can hand each GEMM its own quantisation: dgrad da = dye @ w2_e^T, wgrad dw2_e += a^T @ dye.
static inline void experts_down_backward(real* da, real* dw2, const real* dye_dgrad, const real* w2,
                                         const real* a_wgrad, const real* dye_wgrad, const int* offsets,
                                         int E, int C, int F) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        size_t wo = (size_t)e * F * C;
        gemm_cpu(false, true, n, F, C, 1.0, dye_dgrad + (size_t)r0 * C, C, w2 + wo, C, 0.0, da + (size_t)r0 * F, F);
        gemm_cpu(true, false, F, C, n, 1.0, a_wgrad + (size_t)r0 * F, F, dye_wgrad + (size_t)r0 * C, C, 1.0, dw2 + wo, C);
    }
}

// dxe (rows, C) overwritten; dw1, dv1 (E*F, C) accumulated, from dg, du (rows, F):
//   dgrad dxe = dg @ w1_e + du @ v1_e;  wgrad dw1_e += dg^T @ xe, dv1_e += du^T @ xe
static inline void experts_up_backward(real* dxe, real* dw1, real* dv1, const real* dg_dgrad, const real* du_dgrad,
                                       const real* w1, const real* v1, const real* dg_wgrad, const real* du_wgrad,
                                       const real* xe_wgrad, const int* offsets, int E, int C, int F) {
    memset(dxe, 0, (size_t)offsets[E] * C * sizeof(real));
    #pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        size_t wo = (size_t)e * F * C;
        real* dx = dxe + (size_t)r0 * C;
        matmul_backward(dx, NULL, dg_dgrad + (size_t)r0 * F, NULL, w1 + wo, n, C, F);
        matmul_backward(dx, NULL, du_dgrad + (size_t)r0 * F, NULL, v1 + wo, n, C, F);
        matmul_backward(NULL, dw1 + wo, dg_wgrad + (size_t)r0 * F, xe_wgrad + (size_t)r0 * C, NULL, n, C, F);
        matmul_backward(NULL, dv1 + wo, du_wgrad + (size_t)r0 * F, xe_wgrad + (size_t)r0 * C, NULL, n, C, F);
    }
}

// out (N, C) += sum_j topk_w[t, j] * ye[slot_row[t, j]]
static inline void moe_combine_forward(real* out, const real* ye, const real* topk_w, const int* slot_row,
                                       int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            real w = topk_w[t * k + j];
            const real* y = ye + (size_t)slot_row[t * k + j] * C;
            real* o = out + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] += w * y[c];
        }
}
// dye (N*k, C) overwritten, dtopk_w (N, k) overwritten, from dout (N, C)
static inline void moe_combine_backward(real* dye, real* dtopk_w, const real* dout, const real* ye,
                                        const real* topk_w, const int* slot_row, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int r = slot_row[t * k + j];
            real w = topk_w[t * k + j], dot = 0;
            const real* dy = dout + (size_t)t * C;
            for (int c = 0; c < C; c++) { dye[(size_t)r * C + c] = w * dy[c]; dot += dy[c] * ye[(size_t)r * C + c]; }
            dtopk_w[t * k + j] = dot;
        }
}

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA. Dispatch: the expert histogram comes from the router (router_forward_gpu); offsets are
// its exclusive scan; the permutation is the CPU's stable counting sort, one block per expert
// scanning the N*k assignments in order with a block-wide prefix sum (ballots + shared memory),
// so row_token and slot_row are identical to the CPU's. Expert GEMMs: cuBLASLt GEMMs per expert
// over its rows (w1 and v1 batched together, below); the host needs the expert offsets to issue
// them, so moe_dispatch_gpu copies the (E + 1) offsets to the host: one small synchronising copy
// per MoE layer, kept rather than a device-side grouped GEMM (the numbers: model/CUDA.md, "The expert
// GEMMs"). Gather-backward and combine are one owner per output element, summing the token's k
// slots in order: deterministic.
#include "cuda_common.h"

__global__ void moe_offsets_kernel(int* offsets, const int* counts, int E) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
}

// row_token (N*k), slot_row (N*k): block (s, e) places expert e's assignments among those of slice s,
// [s * slice, (s + 1) * slice), in (token, slot) order, at rows offsets[e] + (expert e's assignments before the slice),
// ... : the CPU's stable counting sort, the same rows. The count before the slice is a block sum over the earlier
// assignments (integers: exact in any order); the slice is then placed in chunks of blockDim.x (a multiple of 32)
// with ballots and a block prefix sum. Slices x experts blocks: the GPU filled, where one block per expert walked
// all N k assignments in sequence. Both loops keep loads in flight (an H100 ran this kernel in 57 us a dbrx-1b layer
// when each thread loaded one int, then waited on it): the count reads the earlier assignments 4 at a time (int4s where
// topk_idx is 16-byte aligned) and the placement loads the next chunk's assignment before it places this one.
__global__ void moe_permute_kernel(int* row_token, int* slot_row, const int* topk_idx, const int* offsets, int N, int k, int slice) {
    __shared__ int warp_counts[32];
    int e = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int total = N * k, begin = blockIdx.x * slice, end = min(begin + slice, total);
    int before = 0, whole = (uintptr_t)topk_idx % 16 == 0 ? begin / 4 : 0;   // int4s before the slice; the rest one by one
    const int4* earlier = (const int4*)topk_idx;
    for (int i = threadIdx.x; i < whole; i += blockDim.x) {
        int4 q = earlier[i];
        before += (q.x == e) + (q.y == e) + (q.z == e) + (q.w == e);
    }
    for (int i = 4 * whole + threadIdx.x; i < begin; i += blockDim.x) before += topk_idx[i] == e;
    for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
    if (lane == 0) warp_counts[warp] = before;
    __syncthreads();
    int running = offsets[e];
    for (int w = 0; w < nwarps; w++) running += warp_counts[w];
    __syncthreads();   // warp_counts is rewritten below
    int next = begin + (int)threadIdx.x < end ? topk_idx[begin + threadIdx.x] : -1;
    for (int start = begin; start < end; start += blockDim.x) {
        int i = start + threadIdx.x, cur = next;
        int ahead = i + (int)blockDim.x;
        next = ahead < end ? topk_idx[ahead] : -1;
        bool mine = i < end && cur == e;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int prior = 0, chunk = 0;
        for (int w = 0; w < nwarps; w++) { if (w < warp) prior += warp_counts[w]; chunk += warp_counts[w]; }
        if (mine) {
            int r = running + prior + before_in_warp;
            row_token[r] = i / k;
            slot_row[i] = r;
        }
        running += chunk;
        __syncthreads();   // warp_counts is rewritten by the next chunk
    }
}

// the permutation's slice of assignments per block: at least 1,024 (4 chunks of a 256-thread block), at most 16
// slices (block s counts the s slices before it: 16 x 16 / 2 slices read per expert, from L2)
static inline int moe_permute_slice(int total) { return std::max(1024, ceil_div(total, 16)); }

// offsets (device, E + 1), row_token, slot_row from topk_idx (N, k) and counts (device, E);
// offsets_host (E + 1) receives a copy of the offsets
static inline void moe_dispatch_gpu(int* offsets, int* row_token, int* slot_row, int* offsets_host, const int* topk_idx,
                                    const int* counts, int N, int E, int k, cudaStream_t stream = 0) {
    LAUNCH(moe_offsets_kernel, 1, 32, 0, stream, offsets, counts, E);
    int slice = moe_permute_slice(N * k);
    LAUNCH(moe_permute_kernel, dim3(std::max(1, ceil_div(N * k, slice)), E), 256, 0, stream, row_token, slot_row, topk_idx, offsets,
           N, k, slice);
    cudaCheck(cudaMemcpyAsync(offsets_host, offsets, (E + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    if (platform_shapes_only())   // the step-time model (model/platform.h): the N k rows spread evenly, as a balanced router would
        for (int e = 0; e <= E; e++) offsets_host[e] = (int)((long long)N * k * e / E);
}

// dx (N, C) fp32 = sum over the token's slots j (in order) of the BF16 rows dxe[slot_row[t, j]], summed in
// fp32 (overwrites dx): the rows are BF16 (model/CUDA.md, "The routed input gradient in BF16"), the sum joins
// the fp32 residual-stream gradient. W channels per thread (8: 16-byte reads when C, dxe and wr allow it).
// With dr (N, E) and wr (E, C) (BF16; the training step's router), the router's input gradient dr wr joins dx in the
// same pass: dx = (sum_e dr[t, e] wr[e, :]) + the slots' sum. On the CPU that is moe_gather_backward, then
// matmul_backward's dinp += dout weight; on the GPU it was a cuBLASLt GEMM after this kernel, k = E = 16, which an
// H100 ran at 7 TFLOP/s (77 us a layer at dbrx-1b for 0.5 GFLOP: dev/bench/results_gpu.md's GEMM table), where
// here it adds E FMAs per element to a pass that reads k rows anyway (wr, E C elements, stays in L1/L2). The sum over
// e runs in e order from 0 as cuBLASLt's twin sums k, then adds the slots' sum as the twin's beta = 1 adds C: under
// the emulator the bits of the GEMM it replaces (test_kernels checks them against the pair).
template <int W>
__global__ void moe_gather_backward_kernel(float* dx, const floatX* dxe, const int* slot_row, int N, int k, int C,
                                           const floatX* dr, const floatX* wr, int E) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (i >= (size_t)N * C) return;
    size_t t = i / C, c = i % C;
    float acc[W], row[W];
    for (int q = 0; q < W; q++) acc[q] = 0.0f;
    for (int j = 0; j < k; j++) {
        load_bf16<W>(row, dxe + (size_t)slot_row[t * k + j] * C + c);
        for (int q = 0; q < W; q++) acc[q] += row[q];
    }
    if (dr) {
        float racc[W];
        for (int q = 0; q < W; q++) racc[q] = 0.0f;
        for (int e = 0; e < E; e++) {
            float g = __bfloat162float(dr[t * E + e]);
            load_bf16<W>(row, wr + (size_t)e * C + c);
            for (int q = 0; q < W; q++) racc[q] = racc[q] + g * row[q];
        }
        for (int q = 0; q < W; q++) acc[q] = racc[q] + acc[q];
    }
    for (int q = 0; q < W; q++) dx[i + q] = acc[q];
}

// one element of SwiGLU forward / backward: the float operations every SwiGLU kernel shares (the FP8 fused
// producers of model/fp8_fused.cuh included), so that their BF16 results are the same bits
__device__ __forceinline__ float swiglu_value(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float* dg, float* du) {
    float s = 1.0f / (1.0f + expf(-g));
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * g * s;
}
// a = silu(g) * u; W elements per thread (8: 16-byte accesses, when n and the pointers allow it)
template <int W>
__global__ void swiglu_forward_kernel(floatX* a, const floatX* g, const floatX* u, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (i >= n) return;
    float gv[W], uv[W];
    load_bf16<W>(gv, g + i);
    load_bf16<W>(uv, u + i);
    for (int j = 0; j < W; j++) gv[j] = swiglu_value(gv[j], uv[j]);
    store_bf16<W>(a + i, gv);
}
// dg = da * u * s (1 + g (1 - s)), du = da * g * s, s = sigmoid(g)
template <int W>
__global__ void swiglu_backward_kernel(floatX* dg, floatX* du, const floatX* da, const floatX* g, const floatX* u, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (i >= n) return;
    float gv[W], uv[W], d[W], og[W], ou[W];
    load_bf16<W>(gv, g + i);
    load_bf16<W>(uv, u + i);
    load_bf16<W>(d, da + i);
    for (int j = 0; j < W; j++) swiglu_grads(d[j], gv[j], uv[j], &og[j], &ou[j]);
    store_bf16<W>(dg + i, og);
    store_bf16<W>(du + i, ou);
}

// out (N, C) = resid (N, C) + sum_j topk_w[t, j] * ye[slot_row[t, j]]   (the residual add, fused);
// W channels per thread (8: 16-byte accesses when C and the pointers allow it)
template <int W>
__global__ void moe_combine_forward_kernel(floatX* out, const floatX* resid, const floatX* ye, const float* topk_w,
                                           const int* slot_row, int N, int k, int C) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (i >= (size_t)N * C) return;
    size_t t = i / C, c = i % C;
    float acc[W], y[W];
    load_bf16<W>(acc, resid + i);
    for (int j = 0; j < k; j++) {
        float w = topk_w[t * k + j];
        load_bf16<W>(y, ye + (size_t)slot_row[t * k + j] * C + c);
        for (int q = 0; q < W; q++) acc[q] += w * y[q];
    }
    store_bf16<W>(out + i, acc);
}
// dye (N*k, C) = w * dout[t];  dtopk_w (N, k) = dout[t] . ye[row]. One warp per token, its k slots in groups of up
// to 4, so that dout's row is read once per group (once at DBRX's k = 4, where a warp per slot read it k times); four
// channels' loads in flight per lane. Each lane sums the channels lane, lane + 32, ... in that order for each slot,
// the order of the warp-per-slot kernel before (dev/cuda/moe's combine backward v1): the same bits.
__global__ void moe_combine_backward_kernel(floatX* dye, float* dtopk_w, const float* dout, const floatX* ye,
                                            const float* topk_w, const int* slot_row, int N, int k, int C) {
    int lane = threadIdx.x % 32;
    size_t t = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= (size_t)N) return;   // a whole warp leaves
    const float* dy = dout + t * C;
    for (int j0 = 0; j0 < k; j0 += 4) {
        int nj = min(4, k - j0);   // the same for the whole warp
        float w[4], dot[4];
        size_t r[4];
        UNROLL for (int j = 0; j < 4; j++) {
            w[j] = j < nj ? topk_w[t * k + j0 + j] : 0.0f;
            r[j] = j < nj ? (size_t)slot_row[t * k + j0 + j] * C : 0;
            dot[j] = 0.0f;
        }
        int c = lane;
        for (; c + 96 < C; c += 128) {   // channels c, c + 32, c + 64, c + 96
            float d[4];
            UNROLL for (int q = 0; q < 4; q++) d[q] = dy[c + 32 * q];
            UNROLL for (int j = 0; j < 4; j++) {
                if (j < nj) {
                    float y[4];
                    UNROLL for (int q = 0; q < 4; q++) y[q] = __bfloat162float(ye[r[j] + c + 32 * q]);
                    UNROLL for (int q = 0; q < 4; q++) {
                        dye[r[j] + c + 32 * q] = __float2bfloat16(w[j] * d[q]);
                        dot[j] += d[q] * y[q];
                    }
                }
            }
        }
        for (; c < C; c += 32) {
            float d = dy[c];
            UNROLL for (int j = 0; j < 4; j++) {
                if (j < nj) {
                    dye[r[j] + c] = __float2bfloat16(w[j] * d);
                    dot[j] += d * __bfloat162float(ye[r[j] + c]);
                }
            }
        }
        UNROLL for (int j = 0; j < 4; j++) {
            if (j < nj) {
                float sum = warp_sum(dot[j]);
                if (lane == 0) dtopk_w[t * k + j0 + j] = sum;
            }
        }
    }
}

// xe (rows, C) = x[row_token]   (BF16 activations, and expert parallelism's BF16 input gradients)
template <typename T>
static inline void moe_gather_gpu(T* xe, const T* x, const int* row_token, int rows, int C, cudaStream_t stream = 0) {
    gather_rows_gpu(xe, x, row_token, rows, C, stream);
}
// dx (N, C) = the slots' sum of dxe + dr (N, E) wr (E, C) (the kernel's comment); dr, wr null: the slots' sum alone
static inline void moe_gather_router_backward_gpu(float* dx, const floatX* dxe, const int* slot_row, const floatX* dr,
                                                  const floatX* wr, int N, int k, int C, int E, cudaStream_t stream = 0) {
    if (bf16_rows_vec8(C, {dxe, wr}))
        LAUNCH(moe_gather_backward_kernel<8>, ceil_div((long long)N * C / 8, 256), 256, 0, stream, dx, dxe, slot_row, N, k, C,
               dr, wr, E);
    else
        LAUNCH(moe_gather_backward_kernel<1>, ceil_div((long long)N * C, 256), 256, 0, stream, dx, dxe, slot_row, N, k, C,
               dr, wr, E);
}
static inline void moe_gather_backward_gpu(float* dx, const floatX* dxe, const int* slot_row, int N, int k, int C,
                                           cudaStream_t stream = 0) {
    moe_gather_router_backward_gpu(dx, dxe, slot_row, (const floatX*)nullptr, (const floatX*)nullptr, N, k, C, 0, stream);
}
static inline void swiglu_forward_gpu(floatX* a, const floatX* g, const floatX* u, size_t n, cudaStream_t stream = 0) {
    if (n == 0) return;
    if (n % 8 == 0 && aligned16({a, g, u}))
        LAUNCH(swiglu_forward_kernel<8>, ceil_div((long long)n / 8, 256), 256, 0, stream, a, g, u, n);
    else
        LAUNCH(swiglu_forward_kernel<1>, ceil_div((long long)n, 256), 256, 0, stream, a, g, u, n);
}
static inline void swiglu_backward_gpu(floatX* dg, floatX* du, const floatX* da, const floatX* g, const floatX* u, size_t n,
                                       cudaStream_t stream = 0) {
    if (n == 0) return;
    if (n % 8 == 0 && aligned16({dg, du, da, g, u}))
        LAUNCH(swiglu_backward_kernel<8>, ceil_div((long long)n / 8, 256), 256, 0, stream, dg, du, da, g, u, n);
    else
        LAUNCH(swiglu_backward_kernel<1>, ceil_div((long long)n, 256), 256, 0, stream, dg, du, da, g, u, n);
}
static inline void moe_combine_forward_gpu(floatX* out, const floatX* resid, const floatX* ye, const float* topk_w,
                                           const int* slot_row, int N, int k, int C, cudaStream_t stream = 0) {
    if (bf16_rows_vec8(C, {out, resid, ye}))
        LAUNCH(moe_combine_forward_kernel<8>, ceil_div((long long)N * C / 8, 256), 256, 0, stream, out, resid, ye, topk_w, slot_row, N, k, C);
    else
        LAUNCH(moe_combine_forward_kernel<1>, ceil_div((long long)N * C, 256), 256, 0, stream, out, resid, ye, topk_w, slot_row, N, k, C);
}
static inline void moe_combine_backward_gpu(floatX* dye, float* dtopk_w, const float* dout, const floatX* ye,
                                            const float* topk_w, const int* slot_row, int N, int k, int C,
                                            cudaStream_t stream = 0) {
    LAUNCH(moe_combine_backward_kernel, ceil_div(N, 4), 128, 0, stream, dye, dtopk_w, dout, ye, topk_w, slot_row, N, k, C);
}

// w1 and v1 as one GEMM: they are two tensors (the checkpoint's and HF's layout, kept), so expert e's
// w1_e and v1_e are not one (2F, C) matrix, but they sit at the same offset of two equally shaped
// tensors: one strided-batched GEMM of 2 does both products of the expert's rows (xe read with stride
// 0 — cuBLASLt's default batch stride: every batch reads the same matrix —, the weights with stride
// v1 - w1, the outputs g and u with stride u - g), and so does the weight
// gradient (dw1_e, dv1_e from dg_e, du_e against the same xe_e). The input gradient dg w1_e + du v1_e
// is a sum of two products: one GEMM would need [dg | du] and [w1_e; v1_e] each contiguous along 2F,
// which neither is, so it stays two GEMMs (the second accumulating, beta 1). The batch strides are
// positive: when the second tensors of both pairs lie below the first, the batch runs (v1, w1) and
// (u, g); mixed directions take two GEMMs. The same arithmetic per output element either way.
static inline long long elem_distance(const void* first, const void* second, size_t elem) {
    long long d = (long long)((const char*)second - (const char*)first);
    return d % (long long)elem == 0 ? d / (long long)elem : 0;
}
// pairs (p0, p1) and (q0, q1) as batches of 2: the strides, and whether the batch starts at the second
// of each pair (*swap); false: no common direction
static inline bool pair_strides(const void* p0, const void* p1, size_t pe, const void* q0, const void* q1, size_t qe, long long* sp,
                                long long* sq, bool* swap) {
    *sp = elem_distance(p0, p1, pe);
    *sq = elem_distance(q0, q1, qe);
    *swap = *sp < 0;
    if (*swap) { *sp = -*sp; *sq = -*sq; }
    return *sp > 0 && *sq > 0;
}

// --moe-streams 2 (the default): the per-expert GEMMs alternate, expert by expert with rows, between the caller's stream
// and one side stream (non-blocking, its own cuBLASLt workspace), forked from and joined back to the caller's stream by
// events around each loop. A GEMM of one expert's 4,096 rows does not fill an H200 (132 SMs): two at a time do. On an
// H200 at dbrx-1b (dev/cuda/matmul -b, session 62) the up-projection went 564 -> 698 TFLOP/s, the down 658 -> 721. The
// same GEMMs with the same algorithms on either stream: the same bits. FP8's experts (fp8_experts_cuda.cuh) do the same.
// One stream under --profile-kernels (each GEMM's range its own time) and under --moe-streams 1.
inline int g_moe_streams = 2;
typedef struct { cudaStream_t side; cudaEvent_t fork, join; } ExpertStreams;
static inline ExpertStreams& expert_streams() {
    static ExpertStreams x = {};
    return x;
}
// the side stream when the experts use two (made at the first call), else `stream`; stream's work so far before it
static inline cudaStream_t experts_fork(cudaStream_t stream) {
    if (g_moe_streams < 2 || g_launch_hook) return stream;
    ExpertStreams& x = expert_streams();
    if (!x.side) {
        cudaCheck(cudaStreamCreateWithFlags(&x.side, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&x.fork, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&x.join, cudaEventDisableTiming));
        cublaslt_stream_workspace_add(x.side);
    }
    cudaCheck(cudaEventRecord(x.fork, stream));
    cudaCheck(cudaStreamWaitEvent(x.side, x.fork, 0));
    return x.side;
}
// stream waits for the side stream's work (nothing when experts_fork returned stream)
static inline void experts_join(cudaStream_t stream, cudaStream_t side) {
    if (side == stream || g_debug_hooks.plant == PLANT_EXPERTS_NO_JOIN) return;   // (the plant: a test's negative control)
    cudaCheck(cudaEventRecord(expert_streams().join, side));
    cudaCheck(cudaStreamWaitEvent(stream, expert_streams().join, 0));
}

// all experts, rows grouped by expert (offsets_host, E + 1, on the host): g, u, a (rows, F),
// ye (rows, C) from xe (rows, C); w1, v1, w2 (E*F, C)
static inline void experts_forward_gpu(floatX* ye, floatX* g, floatX* u, floatX* a, const floatX* xe, const floatX* w1,
                                       const floatX* v1, const floatX* w2, const int* offsets_host, int E, int C, int F,
                                       cudaStream_t stream = 0) {
    long long sw, so;
    bool swap;
    bool pair = pair_strides(w1, v1, sizeof(floatX), g, u, sizeof(floatX), &sw, &so, &swap);
    const floatX* wb = swap ? v1 : w1;   // the batch's first weight and output
    floatX* ob = swap ? u : g;
    cudaStream_t side = experts_fork(stream);
    for (int e = 0, busy = 0; e < E; e++) {
        int r0 = offsets_host[e], n = offsets_host[e + 1] - offsets_host[e];
        if (n == 0) continue;
        cudaStream_t s = busy++ % 2 ? side : stream;
        size_t wo = (size_t)e * F * C;
        if (pair) {   // [g_e | u_e] = xe_e @ [w1_e | v1_e]^T
            gemm_gpu_batched(false, true, n, F, C, 1.0f, xe + (size_t)r0 * C, C, 0, wb + wo, C, sw, 0.0f, ob + (size_t)r0 * F, F, so, 2, s);
            continue;
        }
        matmul_forward_gpu(g + (size_t)r0 * F, xe + (size_t)r0 * C, w1 + wo, n, C, F, s);
        matmul_forward_gpu(u + (size_t)r0 * F, xe + (size_t)r0 * C, v1 + wo, n, C, F, s);
    }
    experts_join(stream, side);
    swiglu_forward_gpu(a, g, u, (size_t)offsets_host[E] * F, stream);
    if (!ye) return;   // (--recompute swiglu: g, u, act only)
    side = experts_fork(stream);
    for (int e = 0, busy = 0; e < E; e++) {
        int r0 = offsets_host[e], n = offsets_host[e + 1] - offsets_host[e];
        if (n == 0) continue;
        // ye_e (n, C) = a_e (n, F) @ w2_e (F, C)
        gemm_gpu(false, false, n, C, F, 1.0f, a + (size_t)r0 * F, F, w2 + (size_t)e * F * C, C, 0.0f, ye + (size_t)r0 * C, C,
                 busy++ % 2 ? side : stream);
    }
    experts_join(stream, side);
}

// dxe (rows, C) BF16 overwritten; dw1, dv1, dw2 (E*F, C) fp32 accumulated (wbeta 0: overwritten; an expert without
// rows is not written); da, dg, du (rows, F) scratch. dxe null: the weight gradients only, from dg, du as given (the
// grouped data gradients computed them: model/moe_experts_step.cuh's experts_backward_step_gpu).
// dxe = dg w1_e + du v1_e is two GEMMs, each accumulating in fp32: the first writes BF16, the second adds
// its product to that BF16 C and rounds again. Two roundings of a BF16 output, no fp32 scratch: measured
// as close to the CPU's fp32 gradients as one rounding, and as the fp32 dxe before (model/CUDA.md, "The
// routed input gradient in BF16").
static inline void experts_backward_gpu(floatX* dxe, float* dw1, float* dv1, float* dw2, floatX* da, floatX* dg, floatX* du,
                                        const floatX* dye, const floatX* xe, const floatX* g, const floatX* u, const floatX* a,
                                        const floatX* w1, const floatX* v1, const floatX* w2, const int* offsets_host,
                                        int E, int C, int F, cudaStream_t stream = 0, float wbeta = 1.0f) {
    cudaStream_t side = experts_fork(stream);
    for (int e = 0, busy = 0; e < E; e++) {
        int r0 = offsets_host[e], n = offsets_host[e + 1] - offsets_host[e];
        if (n == 0) continue;
        cudaStream_t s = busy++ % 2 ? side : stream;
        size_t wo = (size_t)e * F * C;
        const floatX* dy = dye + (size_t)r0 * C;
        // ye = a @ w2_e:  da = dye @ w2_e^T,  dw2_e += a^T @ dye
        if (dxe) gemm_gpu(false, true, n, F, C, 1.0f, dy, C, w2 + wo, C, 0.0f, da + (size_t)r0 * F, F, s);
        gemm_gpu(true, false, F, C, n, 1.0f, a + (size_t)r0 * F, F, dy, C, wbeta, dw2 + wo, C, s);
    }
    experts_join(stream, side);
    if (dxe) swiglu_backward_gpu(dg, du, da, g, u, (size_t)offsets_host[E] * F, stream);
    long long sd, sg;
    bool swap;
    bool pair = pair_strides(dg, du, sizeof(floatX), dw1, dv1, sizeof(float), &sd, &sg, &swap);
    const floatX* db = swap ? du : dg;   // the batch's first activation gradient and weight gradient
    float* gb = swap ? dv1 : dw1;
    side = experts_fork(stream);
    for (int e = 0, busy = 0; e < E; e++) {
        int r0 = offsets_host[e], n = offsets_host[e + 1] - offsets_host[e];
        if (n == 0) continue;
        cudaStream_t s = busy++ % 2 ? side : stream;
        size_t wo = (size_t)e * F * C;
        floatX* dxe_e = dxe ? dxe + (size_t)r0 * C : nullptr;
        if (!pair) {
            matmul_backward_gpu(dxe_e, dw1 + wo, dg + (size_t)r0 * F, xe + (size_t)r0 * C, w1 + wo, n, C, F, 0.0f, s, wbeta);
            matmul_backward_gpu(dxe_e, dv1 + wo, du + (size_t)r0 * F, xe + (size_t)r0 * C, v1 + wo, n, C, F, 1.0f, s, wbeta);
            continue;
        }
        // dxe_e = dg_e @ w1_e + du_e @ v1_e (two GEMMs, see above); [dw1_e | dv1_e] += [dg_e | du_e]^T @ xe_e (one)
        if (dxe) {
            matmul_backward_gpu(dxe_e, (float*)nullptr, dg + (size_t)r0 * F, nullptr, w1 + wo, n, C, F, 0.0f, s);
            matmul_backward_gpu(dxe_e, (float*)nullptr, du + (size_t)r0 * F, nullptr, v1 + wo, n, C, F, 1.0f, s);
        }
        gemm_gpu_batched(true, false, F, C, n, 1.0f, db + (size_t)r0 * F, F, sd, xe + (size_t)r0 * C, C, 0, wbeta, gb + wo, C, sg, 2, s);
    }
    experts_join(stream, side);
}
// the weight gradients (3 x E x n: w1, v1, w2) of the experts without rows zeroed, block (x, e) on expert e: one launch
// whatever the routing (offsets on the device), so that the step's work list does not depend on it. vec (n a multiple
// of 4, the three 16-byte aligned): 16-byte stores, 3 x 4 floats a thread per pass (a collapsed routing leaves half the
// experts empty: 176 MB a layer at dbrx-1b, 0.83 ms a step on an H100 with 4-byte stores)
__global__ void experts_zero_empty_kernel(float* dw1, float* dv1, float* dw2, const int* offsets, int E, size_t n, int vec) {
    int e = blockIdx.y;
    if (e >= E || offsets[e + 1] > offsets[e]) return;
    size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (size_t i = first; i < n / 4; i += stride) {
            size_t j = (size_t)e * (n / 4) + i;
            ((float4*)dw1)[j] = z; ((float4*)dv1)[j] = z; ((float4*)dw2)[j] = z;
        }
        return;
    }
    for (size_t i = first; i < n; i += stride) {
        size_t j = (size_t)e * n + i;
        dw1[j] = 0.0f; dv1[j] = 0.0f; dw2[j] = 0.0f;
    }
}
// dw1, dv1, dw2 (E, n) of the experts without rows (offsets (E + 1) on the device) = 0; the others untouched
static inline void experts_zero_empty_gpu(float* dw1, float* dv1, float* dw2, const int* offsets, int E, size_t n, cudaStream_t stream = 0) {
    LAUNCH(experts_zero_empty_kernel, dim3(64, E), 256, 0, stream, dw1, dv1, dw2, offsets, E, n,
           (int)(n % 4 == 0 && aligned16({dw1, dv1, dw2})));
}
#endif  // DBRX_HAVE_CUDA
