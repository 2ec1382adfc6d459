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
#include <omp.h>
#include "common.h"

// single-threaded CBLAS calls, float or double to match `real`
static inline void cblas_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                              const float* B, int ldb, float beta, float* C, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}
static inline void cblas_gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                              const double* B, int ldb, double beta, double* C, int ldc) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

// C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C, all row-major.
// OpenBLAS runs single-threaded (train_dbrx sets it so): its own thread pool and OpenMP's would
// spin against each other on the same cores. Parallelism is ours instead: outside a parallel region
// the rows of C are split into one block per OpenMP thread; inside one (e.g. the loop over experts)
// the call runs on its thread as it is. No reduction over K is ever split between threads.
static inline void gemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, real alpha, const real* A, int lda,
                            const real* B, int ldb, real beta, real* C, int ldc) {
    if (M == 0 || N == 0) return;
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (threads == 1 || M < 64) { cblas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); return; }
    int rows = (M + threads - 1) / threads;
    #pragma omp parallel for num_threads(threads)
    for (int i0 = 0; i0 < M; i0 += rows) {
        int m = M - i0 < rows ? M - i0 : rows;
        // row block of op(A): rows of A, or columns of A when it is transposed
        const real* a = trans_a ? A + i0 : A + (size_t)i0 * lda;
        cblas_gemm(trans_a, trans_b, m, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)i0 * ldc, ldc);
    }
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
