/*
 * matmul.cuh — the GEMMs of the model. CPU reference: a row-major wrapper over CBLAS (OpenBLAS),
 * float or double to match `real`. Every linear layer of the model is one of three calls:
 *   forward   out = inp @ W^T          (N, OC) = (N, C) x (OC, C)^T
 *   dgrad     dinp += dout @ W         (N, C)  = (N, OC) x (OC, C)
 *   wgrad     dW  += dout^T @ inp      (OC, C) = (N, OC)^T x (N, C)
 * (The CUDA backend puts cuBLASLt behind the same three entry points.)
 */
#pragma once
#include <cblas.h>
#include "common.h"

// C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C, all row-major
static inline void gemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                            const float* B, int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}
static inline void gemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                            const double* B, int ldb, double beta, double* C, int ldc) {
    if (M == 0 || N == 0) return;
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
static inline void matmul_forward(real* out, const real* inp, const real* weight, int N, int C, int OC) {
    gemm_cpu(false, true, N, OC, C, 1.0, inp, C, weight, C, 0.0, out, OC);
}
// dinp (N, C) += dout (N, OC) @ weight (OC, C);  dweight (OC, C) += dout^T @ inp. Either may be NULL.
static inline void matmul_backward(real* dinp, real* dweight, const real* dout, const real* inp, const real* weight,
                                   int N, int C, int OC) {
    if (dinp) gemm_cpu(false, false, N, C, OC, 1.0, dout, OC, weight, C, 1.0, dinp, C);
    if (dweight && N > 0) gemm_cpu(true, false, OC, C, N, 1.0, dout, OC, inp, C, 1.0, dweight, C);
}
