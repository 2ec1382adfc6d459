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

#if defined(__CUDACC__) || defined(SIMT_EMULATION)
// ---------------------------------------------------------------------------------------------
// CUDA: cuBLASLt behind one column-major entry point (matmul_cublaslt), and the row-major
// gemm_gpu / matmul_forward_gpu / matmul_backward_gpu the model calls, with the same arguments as
// their CPU twins above. BF16 operands, FP32 accumulation (CUBLAS_COMPUTE_32F), output BF16 or FP32.
// The emulated build (SIMT_EMULATION) replaces cuBLASLt by its CPU twin, test/simt/cublaslt_twin.h,
// which implements the same semantics (layouts, transposes, leading dimensions, strided batches,
// alpha/beta, FP8 scales and amax).
#include <library_types.h>
#include "cuda_common.h"

// The FP8 extension point. Callers that pass NULL (today's BF16 callers) get the defaults; FP8
// callers later set the operand types to CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 and these pointers.
typedef struct {
    const float* a_scale;   // device, dequantisation factor of A (1 / its quantisation scale); NULL = 1
    const float* b_scale;   // device, same for B
    const float* d_scale;   // device, quantisation scale of an FP8 D; NULL = 1
    float* amax_d;          // device, if set receives max |alpha op(A) op(B) + beta C| (before d_scale)
    int fast_accum;         // FP8 forward GEMMs only (Hopper FAST_ACCUM)
} MatmulOptions;

static inline const char* dtype_name(cudaDataType_t t) {
    switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_32F: return "fp32";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "unsupported";
    }
}

// Shapes and types the wrapper accepts, in both builds: one failure message, naming the caller.
static inline void matmul_validate(bool trans_a, bool trans_b, int m, int n, int k, cudaDataType_t a_type, int lda,
                                   cudaDataType_t b_type, int ldb, cudaDataType_t d_type, int ldd, int batch,
                                   const char* file, int line) {
    bool a8 = a_type == CUDA_R_8F_E4M3 || a_type == CUDA_R_8F_E5M2, b8 = b_type == CUDA_R_8F_E4M3 || b_type == CUDA_R_8F_E5M2;
    bool ok_types = (a_type == CUDA_R_16BF && b_type == CUDA_R_16BF) ||
                    (a8 && b8 && !(a_type == CUDA_R_8F_E5M2 && b_type == CUDA_R_8F_E5M2) && trans_a && !trans_b);
    ok_types = ok_types && (d_type == CUDA_R_16BF || d_type == CUDA_R_32F);
    if (!ok_types)
        fail_at(file, line, "matmul: unsupported types A %s B %s D %s (trans %c%c)", dtype_name(a_type), dtype_name(b_type),
                dtype_name(d_type), trans_a ? 'T' : 'N', trans_b ? 'T' : 'N');
    if (m < 0 || n < 0 || k < 0 || batch < 1 || lda < (trans_a ? k : m) || lda < 1 || ldb < (trans_b ? n : k) || ldb < 1 ||
        ldd < m || ldd < 1)
        fail_at(file, line, "matmul: bad shape m %d n %d k %d lda %d ldb %d ldd %d batch %d (trans %c%c)", m, n, k, lda, ldb,
                ldd, batch, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N');
}

#if defined(SIMT_EMULATION)
#include "../test/simt/cublaslt_twin.h"
#else
#include <cublasLt.h>

inline void cublas_check(cublasStatus_t st, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) fail_at(file, line, "cuBLAS error %s: %s", cublasLtGetStatusName(st), cublasLtGetStatusString(st));
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

// one handle and a 32 MiB workspace (what Hopper's kernels want) for the process
static const size_t cublaslt_workspace_bytes = 32ull << 20;
static inline cublasLtHandle_t cublaslt_handle(void** workspace) {
    static cublasLtHandle_t handle = nullptr;
    static void* ws = nullptr;
    if (!handle) {
        cublasCheck(cublasLtCreate(&handle));
        cudaCheck(cudaMalloc(&ws, cublaslt_workspace_bytes));
    }
    *workspace = ws;
    return handle;
}

// the largest power of two (<= 256) dividing the address: what the heuristic may assume
static inline uint32_t pointer_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al)) al >>= 1;
    return al;
}

static inline void layout_create(cublasLtMatrixLayout_t* l, cudaDataType_t t, int rows, int cols, int ld, int batch,
                                 long long stride) {
    cublasCheck(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
    if (batch > 1) {
        int32_t b = batch;
        int64_t s = stride;
        cublasCheck(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        cublasCheck(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s));
    }
}

// D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * D — COLUMN-major, cuBLAS conventions:
// A is stored (k, m) with lda >= k when trans_a, else (m, k) with lda >= m (likewise B); C is D.
// `batch` matrices, each operand advancing by its stride (elements). Descriptors are made per
// call (a few microseconds; caching them is later work).
static inline void matmul_cublaslt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A,
                                   cudaDataType_t a_type, int lda, long long stride_a, const void* B, cudaDataType_t b_type,
                                   int ldb, long long stride_b, float beta, void* D, cudaDataType_t d_type, int ldd,
                                   long long stride_d, int batch, const MatmulOptions* opt, cudaStream_t stream,
                                   const char* file, int line) {
    matmul_validate(trans_a, trans_b, m, n, k, a_type, lda, b_type, ldb, d_type, ldd, batch, file, line);
    if (m == 0 || n == 0) return;
    void* ws;
    cublasLtHandle_t h = cublaslt_handle(&ws);
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (opt) {
        if (opt->a_scale) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &opt->a_scale, sizeof(void*)));
        if (opt->b_scale) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &opt->b_scale, sizeof(void*)));
        if (opt->d_scale) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &opt->d_scale, sizeof(void*)));
        if (opt->amax_d) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &opt->amax_d, sizeof(void*)));
        if (opt->fast_accum) {
            int8_t fa = 1;
            cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
        }
    }
    cublasLtMatrixLayout_t la, lb, ld;
    layout_create(&la, a_type, trans_a ? k : m, trans_a ? m : k, lda, batch, stride_a);
    layout_create(&lb, b_type, trans_b ? n : k, trans_b ? k : n, ldb, batch, stride_b);
    layout_create(&ld, d_type, m, n, ldd, batch, stride_d);
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = cublaslt_workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    uint32_t al_a = pointer_alignment(A), al_b = pointer_alignment(B), al_d = pointer_alignment(D);
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0)
        fail_at(file, line, "cuBLASLt has no algorithm for m %d n %d k %d (trans %c%c, A %s B %s D %s, lda %d ldb %d ldd %d, batch %d)",
                m, n, k, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', dtype_name(a_type), dtype_name(b_type), dtype_name(d_type),
                lda, ldb, ldd, batch);
    cublasStatus_t st = cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo, ws, wsb, stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        fail_at(file, line, "cuBLASLt matmul m %d n %d k %d (trans %c%c) failed: %s: %s", m, n, k, trans_a ? 'T' : 'N',
                trans_b ? 'T' : 'N', cublasLtGetStatusName(st), cublasLtGetStatusString(st));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}
#endif  // SIMT_EMULATION

template <typename T> struct CudaType;
template <> struct CudaType<float> { static constexpr cudaDataType_t value = CUDA_R_32F; };
template <> struct CudaType<__nv_bfloat16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };

// ROW-major, the same arguments as gemm_cpu: C (M, N) = alpha * op(A) (M, K) op(B) (K, N) + beta * C,
// A and B bf16, C bf16 or fp32. (Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.)
#define gemm_gpu(...) gemm_gpu_at(__FILE__, __LINE__, __VA_ARGS__)
template <typename TC>
static inline void gemm_gpu_at(const char* file, int line, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                               const floatX* A, int lda, const floatX* B, int ldb, float beta, TC* C, int ldc,
                               cudaStream_t stream = 0) {
    matmul_cublaslt(trans_b, trans_a, N, M, K, alpha, B, CUDA_R_16BF, ldb, 0, A, CUDA_R_16BF, lda, 0, beta, C,
                    CudaType<TC>::value, ldc, 0, 1, nullptr, stream, file, line);
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T          (cuBLAS "TN": every operand contiguous in C)
template <typename TO>
static inline void matmul_forward_gpu(TO* out, const floatX* inp, const floatX* weight, int N, int C, int OC,
                                      cudaStream_t stream = 0) {
    gemm_gpu(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, stream);
}
// dinp (N, C) = dinp_beta * dinp + dout (N, OC) @ weight (OC, C);  dweight (OC, C) += dout^T @ inp
// (fp32 weight gradients). Either output may be NULL.
template <typename TI>
static inline void matmul_backward_gpu(TI* dinp, float* dweight, const floatX* dout, const floatX* inp, const floatX* weight,
                                       int N, int C, int OC, float dinp_beta, cudaStream_t stream = 0) {
    if (dinp) gemm_gpu(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C, stream);
    if (dweight && N > 0) gemm_gpu(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, stream);
}
#endif  // __CUDACC__ || SIMT_EMULATION
