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

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA. Forward: one thread per output element. Backward without float atomics: the host sorts
// the micro-batch's tokens (a counting sort, O(N + V), the tokens are on the host anyway) into
// "for each distinct token, its positions in order"; one thread per (distinct token, channel)
// sums its positions in that order and adds the sum to the fp32 gradient row. Deterministic.
#include <vector>
#include "cuda_common.h"

// out (N, C) = wte[tokens]; wte (V, C): a row gather (16 bytes per thread when C % 8 == 0)
static inline void embedding_forward_gpu(floatX* out, const int* tokens, const floatX* wte, int N, int C, cudaStream_t stream = 0) {
    gather_rows_gpu(out, wte, tokens, N, C, stream);
}

// the bucket plan of one micro-batch (host side): unique (U) distinct tokens in increasing order,
// offsets (U + 1) into positions (N), the positions of each token in increasing order
typedef struct { std::vector<int> unique, offsets, positions; } EmbeddingPlan;

static inline void embedding_plan_build(EmbeddingPlan* p, const int* tokens, int N, int V) {
    std::vector<int> count(V + 1, 0);
    for (int t = 0; t < N; t++) count[tokens[t] + 1]++;
    for (int v = 0; v < V; v++) count[v + 1] += count[v];   // count[v] = first position slot of token v
    p->positions.assign(N, 0);
    std::vector<int> cursor(count.begin(), count.end() - 1);
    for (int t = 0; t < N; t++) p->positions[cursor[tokens[t]]++] = t;
    p->unique.clear();
    p->offsets.clear();
    for (int v = 0; v < V; v++)
        if (count[v + 1] > count[v]) { p->unique.push_back(v); p->offsets.push_back(count[v]); }
    p->offsets.push_back(N);
}

// dwte (V, C) += for each distinct token u, the sum over its positions of dout (N, C) rows. The distinct
// tokens are on gridDim.x (up to 2^31 - 1; gridDim.y stops at 65,535, which a micro-batch of ~90 K
// tokens over DBRX's 100,352-token vocabulary reaches), the channel blocks on gridDim.y (C / block).
__global__ void embedding_backward_kernel(float* dwte, const float* dout, const int* unique, const int* offsets,
                                          const int* positions, int C, int row0) {
    int u = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    // eight rows loaded before they are added, in position order as one at a time would: the same sum, with eight
    // loads in flight (a token that fills a tenth of the batch is a long chain: one at a time, the H100 of 2026-11-28
    // took 0.30 ms for this kernel at dbrx-1b, where its bytes take ~0.03)
    float acc = 0.0f;
    int p = offsets[u], end = offsets[u + 1];
    for (; p + 8 <= end; p += 8) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = dout[(size_t)positions[p + j] * C + c];
        for (int j = 0; j < 8; j++) acc += r[j];
    }
    for (; p < end; p++) acc += dout[(size_t)positions[p] * C + c];
    dwte[(size_t)(unique[u] - row0) * C + c] += acc;
}

// d_unique, d_offsets, d_positions: device copies of the plan's vectors (sizes U, U + 1, N). A part of the
// vocabulary: d_unique, d_offsets at its first distinct token, U its distinct tokens, dwte its rows from row0
static inline void embedding_backward_gpu(float* dwte, const float* dout, const int* d_unique, const int* d_offsets,
                                          const int* d_positions, int U, int C, cudaStream_t stream = 0, int row0 = 0) {
    if (U == 0) return;
    const int block = C >= 128 ? 128 : ceil_div(C, 32) * 32;   // (a narrow C: no idle warps)
    LAUNCH(embedding_backward_kernel, dim3(U, ceil_div(C, block)), block, 0, stream, dwte, dout, d_unique, d_offsets,
           d_positions, C, row0);
}

// The weight gradients of a vocabulary unit computed by the parameter store (DbrxGPU.vocab; NULL: here):
// the embedding's (unit 0: its backward) or the head's (its whole backward: the input gradient of lm_head,
// norm_f's backward into the residual gradient, the weight gradients), in chunks of vocabulary rows, each
// reduced as it completes (parallel/README.md, "A bounded working set")
typedef struct {
    void (*backward)(void* ctx, int unit);
    void* ctx;
} VocabHooksGPU;
#endif  // DBRX_HAVE_CUDA
