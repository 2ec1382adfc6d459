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
