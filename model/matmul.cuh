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

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: cuBLASLt behind one column-major entry point (matmul_cublaslt), and the row-major
// gemm_gpu / matmul_forward_gpu / matmul_backward_gpu the model calls, with the same arguments as
// their CPU twins above. BF16 operands, FP32 accumulation (CUBLAS_COMPUTE_32F), output BF16 or FP32.
// The emulated build runs the same code on cuBLASLt's API twin (test/simt/cublaslt_api_twin.h, included
// by model/platform.h), which implements the same semantics (layouts, transposes, leading dimensions,
// strided batches, alpha/beta, FP8 scales) and the library's rules (an amax of D: refused, as here).
#include <library_types.h>
#include <string>
#include "cuda_common.h"

// FP8 GEMMs (Hopper): A and B are E4M3 or E5M2 (not both E5M2), TN only (every operand contiguous
// along the reduction dimension k), FP32 accumulation, BF16 or FP32 output. The scale pointers carry
// DEQUANTISATION factors (1 / the quantisation scale), in one of three layouts. For an operand
// stored k-contiguous with `outer` = m (A) or n (B) rows of k:
//   MATMUL_SCALE_TENSOR  one float for the whole operand
//   MATMUL_SCALE_VEC128  one float per 1 x 128 tile along k (cuBLAS's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F):
//                        the factor of element (o, p) is scale[(p / 128) * outer + o]  (outer index fastest)
//   MATMUL_SCALE_BLK128  one float per 128 x 128 block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F):
//                        scale[(o / 128) * round_up(ceil(k / 128), 4) + p / 128]  (k blocks fastest, padded to 4)
// Block scaling (cuBLAS 12.9+, sm_90): both operands block-scaled, not both BLK128; the outer size of a
// VEC128 operand and of A is a multiple of 8 (what cuBLAS's kernels require; TransformerEngine's checks).
typedef enum { MATMUL_SCALE_TENSOR = 0, MATMUL_SCALE_VEC128 = 1, MATMUL_SCALE_BLK128 = 2 } MatmulScaleMode;

// The FP8 options; BF16 callers pass NULL.
typedef struct {
    const float* a_scale;   // device, dequantisation factor(s) of A (layout: a_scale_mode); NULL = 1
    const float* b_scale;   // device, same for B
    const float* d_scale;   // device, quantisation scale of an FP8 D; NULL = 1
    float* amax_d;          // device, max |alpha op(A) op(B) + beta C| (before d_scale): refused, D is never FP8 here
                            // (cuBLASLt computes it for an FP8 D only; an H100 refused it with FP32 D, INVALID_VALUE)
    int fast_accum;         // FP8 forward GEMMs only (Hopper FAST_ACCUM); dgrad/wgrad accumulate promoted
    int a_scale_mode, b_scale_mode;   // MatmulScaleMode
    const char* a_name;     // names of the operands for error messages (NULL: "A", "B")
    const char* b_name;
} MatmulOptions;

// (__host__ __device__ are empty under the emulator: the same functions are host code there)
#define MATMUL_HD __host__ __device__
// where the dequantisation factor of element (o, p) of a block-scaled operand lives (layouts above)
MATMUL_HD static inline size_t matmul_scale_vec128_index(int o, int p, int outer) { return (size_t)(p / 128) * outer + o; }
MATMUL_HD static inline size_t matmul_scale_blk128_index(int o, int p, int k) {
    return (size_t)(o / 128) * (((k + 127) / 128 + 3) / 4 * 4) + p / 128;
}
// the number of factors of an operand (outer rows of k) in each layout
static inline size_t matmul_scale_count(int mode, int outer, int k) {
    if (mode == MATMUL_SCALE_VEC128) return (size_t)((k + 127) / 128) * outer;
    if (mode == MATMUL_SCALE_BLK128) return (size_t)((outer + 127) / 128) * (((k + 127) / 128 + 3) / 4 * 4);
    return 1;
}

static inline const char* dtype_name(cudaDataType_t t) {
    switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_32F: return "fp32";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "unsupported";
    }
}
static inline const char* scale_mode_name(int m) {
    return m == MATMUL_SCALE_VEC128 ? "1x128 tiles" : m == MATMUL_SCALE_BLK128 ? "128x128 blocks" : "per tensor";
}
static inline bool is_fp8_type(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// Shapes and types the wrapper accepts, in both builds: one failure message, naming the caller.
static inline void matmul_validate(bool trans_a, bool trans_b, int m, int n, int k, cudaDataType_t a_type, int lda,
                                   cudaDataType_t b_type, int ldb, cudaDataType_t d_type, int ldd, int batch,
                                   const MatmulOptions* opt, const char* file, int line) {
    bool a8 = is_fp8_type(a_type), b8 = is_fp8_type(b_type);
    bool ok_types = (a_type == CUDA_R_16BF && b_type == CUDA_R_16BF) || (a8 && b8);
    ok_types = ok_types && (d_type == CUDA_R_16BF || d_type == CUDA_R_32F);
    if (!ok_types)
        fail_at(file, line, "matmul: unsupported types A %s B %s D %s (trans %c%c)", dtype_name(a_type), dtype_name(b_type),
                dtype_name(d_type), trans_a ? 'T' : 'N', trans_b ? 'T' : 'N');
    if (opt && opt->amax_d && !is_fp8_type(d_type))   // (the twin refuses it the same way: cublaslt_api_twin.h, R8)
        fail_at(file, line, "matmul: an amax of D (MatmulOptions.amax_d) with D %s: cuBLASLt computes amax for an FP8 D only "
                "(an H100 refused it with an FP32 D, INVALID_VALUE at the heuristic)", dtype_name(d_type));
    if (m < 0 || n < 0 || k < 0 || batch < 1 || lda < (trans_a ? k : m) || lda < 1 || ldb < (trans_b ? n : k) || ldb < 1 ||
        ldd < m || ldd < 1)
        fail_at(file, line, "matmul: bad shape m %d n %d k %d lda %d ldb %d ldd %d batch %d (trans %c%c)", m, n, k, lda, ldb,
                ldd, batch, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N');
}

// The FP8 rules (cuBLASLt on Hopper), in both builds, so that the emulator fails where the device
// would: every message names the operand and its shape. Pointers: 16-byte aligned.
static inline void matmul_validate_fp8(bool trans_a, bool trans_b, int m, int n, int k, const void* A, cudaDataType_t a_type,
                                       int lda, const void* B, cudaDataType_t b_type, int ldb, const void* D,
                                       cudaDataType_t d_type, int batch, const MatmulOptions* opt, const char* file, int line) {
    const char* an = opt && opt->a_name ? opt->a_name : "A";
    const char* bn = opt && opt->b_name ? opt->b_name : "B";
    // "'name' (e4m3, 256 x 128, k-contiguous, ld 128)": the operand as op(A) (m x k) / op(B)^T (n x k)
    char as[200], bs[200];
    snprintf(as, sizeof as, "'%s' (%s, %d x %d, %s, ld %d)", an, dtype_name(a_type), m, k, trans_a ? "k-contiguous" : "m-contiguous", lda);
    snprintf(bs, sizeof bs, "'%s' (%s, %d x %d, %s, ld %d)", bn, dtype_name(b_type), n, k, trans_b ? "n-contiguous" : "k-contiguous", ldb);
    if (a_type == CUDA_R_8F_E5M2 && b_type == CUDA_R_8F_E5M2)
        fail_at(file, line, "FP8 matmul: E5M2 x E5M2 is not supported by cuBLASLt (A %s, B %s): one operand must be E4M3", as, bs);
    if (!trans_a || trans_b)
        fail_at(file, line, "FP8 matmul: Hopper runs only the TN layout (A transposed, B not: both contiguous along k), got "
                "trans %c%c for A %s, B %s: pass the transposed FP8 copy", trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', as, bs);
    if (k % 16 || lda % 16)
        fail_at(file, line, "FP8 matmul: A %s: k %d and the leading dimension must be multiples of 16", as, k);
    if (ldb % 16) fail_at(file, line, "FP8 matmul: B %s: the leading dimension must be a multiple of 16", bs);
    if ((uintptr_t)A % 16) fail_at(file, line, "FP8 matmul: A %s is not 16-byte aligned (%p)", as, A);
    if ((uintptr_t)B % 16) fail_at(file, line, "FP8 matmul: B %s is not 16-byte aligned (%p)", bs, B);
    if ((uintptr_t)D % 16) fail_at(file, line, "FP8 matmul: D (%s, %d x %d) is not 16-byte aligned (%p)", dtype_name(d_type), m, n, D);
    // the scale pointers 16-byte aligned: an H100's cuBLASLt 13 refused a per-tensor B scale 4 bytes off, NOT_SUPPORTED
    // for every algorithm its heuristic offered, and took it 16 bytes off (dev/bench/results_gpu.md, 2026-11-28)
    const void* sp[3] = {opt ? opt->a_scale : nullptr, opt ? opt->b_scale : nullptr, opt ? opt->d_scale : nullptr};
    const char* spn[3] = {as, bs, "D"};
    for (int i = 0; i < 3; i++)
        if ((uintptr_t)sp[i] % 16)
            fail_at(file, line, "FP8 matmul: the %c scale pointer of %s is not 16-byte aligned (%p): cuBLASLt refuses it", "ABD"[i], spn[i], sp[i]);
    int am = opt ? opt->a_scale_mode : MATMUL_SCALE_TENSOR, bm = opt ? opt->b_scale_mode : MATMUL_SCALE_TENSOR;
    if (am < 0 || am > 2 || bm < 0 || bm > 2) fail_at(file, line, "FP8 matmul: unknown scale modes %d, %d", am, bm);
    if ((am == MATMUL_SCALE_TENSOR) != (bm == MATMUL_SCALE_TENSOR))
        fail_at(file, line, "FP8 matmul: A %s scaled %s but B %s scaled %s: both per tensor, or both block-scaled", as,
                scale_mode_name(am), bs, scale_mode_name(bm));
    if (am == MATMUL_SCALE_TENSOR) return;
    if (am == MATMUL_SCALE_BLK128 && bm == MATMUL_SCALE_BLK128)
        fail_at(file, line, "FP8 matmul: A %s and B %s are both in 128x128 blocks: cuBLAS takes 1x128 x 128x128, 128x128 x 1x128 "
                "or 1x128 x 1x128", as, bs);
    if (!opt->a_scale || !opt->b_scale) fail_at(file, line, "FP8 matmul: block scaling of A %s / B %s without scale tensors", as, bs);
    if (opt->fast_accum) fail_at(file, line, "FP8 matmul: FAST_ACCUM with block scales (A %s, B %s): block scaling accumulates per 128-chunk", as, bs);
    if (batch != 1) fail_at(file, line, "FP8 matmul: block scaling of A %s, B %s with %d strided batches (one matrix only)", as, bs, batch);
    if (m % 8) fail_at(file, line, "FP8 matmul: block-scaled A %s: m %d must be a multiple of 8", as, m);
    if (bm == MATMUL_SCALE_VEC128 && n % 8) fail_at(file, line, "FP8 matmul: B %s in 1x128 tiles: n %d must be a multiple of 8", bs, n);
}

// ---------------------------------------------------------------------------------------------
// The plan cache (both builds). cuBLASLt's descriptors, layouts and the heuristic's algorithm are made
// once per GEMM description and reused: a heuristic query costs tens of microseconds of host time, and
// the experts issue 7 GEMMs per expert and layer (9 before w1 and v1 were paired), ~1,100 GEMMs per
// micro-step of dbrx-1b, so a step would otherwise spend more host time asking than launching.
// The key is the whole description: transposes, types, m, n, k, the leading dimensions, batch and
// strides, the pointer alignments the heuristic may assume (of every matrix of a strided batch; capped
// at 16 bytes: no kernel asks more, and a row slice's alignment above 16 changes with its first row),
// and the FP8 options (which scale pointers are set, their modes, FAST_ACCUM; the pointers themselves
// are set on the cached descriptor at every call). The expert GEMMs' row count changes with the routing
// every step: the token dimension is keyed by its bucket (a quarter octave, from 64: matmul_bucket; n,
// and k for the weight gradient: the dimension that is a layout's column count, so the bucket never
// exceeds a leading dimension; where it is a row count the bucket is capped by the ld). The heuristic
// is asked once per bucket, at the bucket's size, and every call runs the exact shape with that
// algorithm, which is expected to take the smaller shape (the same layouts, no more split-K workspace);
// cublasLtMatmul checks every call, and should it refuse, the call asks again for the exact shape and
// keeps that answer for the bucket (a fallback, not the steady state). So the queries are bounded by 4 x (GEMM sites) x
// log2(tokens / 64), and a steady-state step makes none: the emulated twin counts them
// (simt::counters()), tested in test/test_step_cuda.cpp and test/test_cuda_train.sh.
// MATMUL_PLAN_CACHE=0 turns the cache off: every call queries (the test's negative control).
#include <array>
#include <map>
typedef std::array<long long, 24> MatmulKey;

// (the environment is read once, not on every GEMM; the test's negative control switches it in-process)
static inline bool& matmul_plan_cache_flag() {
    static bool on = [] { const char* e = getenv("MATMUL_PLAN_CACHE"); return !(e && strcmp(e, "0") == 0); }();
    return on;
}
static inline bool matmul_plan_cache_enabled() { return matmul_plan_cache_flag(); }
static inline void matmul_plan_cache_set(bool on) { matmul_plan_cache_flag() = on; }
// the alignment (bytes) the heuristic may assume: the largest power of two <= 16 dividing the address
static inline uint32_t matmul_alignment(const void* p) {
    uint32_t al = 16;
    while (al > 1 && ((uintptr_t)p % al)) al >>= 1;
    return al;
}
// the alignment every matrix of a strided batch keeps: its first's, and that of the stride in bytes
static inline uint32_t matmul_batch_alignment(const void* p, cudaDataType_t t, long long stride, int batch) {
    size_t bytes = t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1;
    uint32_t al = matmul_alignment(p);
    if (batch > 1) al = std::min(al, matmul_alignment((const void*)(uintptr_t)(stride * (long long)bytes)));
    return al;
}
// the token dimension's bucket: x rounded up to a quarter of an octave (p, 1.25 p, 1.5 p, 1.75 p, 2 p: at
// most 25% above x, so the heuristic's answer fits the shape it runs, and a dense GEMM's 3 x 2^k tokens
// is its own bucket), from 64 up, capped (a row count must stay <= its ld). From 64: Hopper's BF16
// kernels tile the token dimension by 64 to 256, so below 64 rows every choice computes one partly filled
// tile, and experts with few rows (and the decode step's one) share a plan.
static inline long long matmul_bucket(int x, long long cap) {
    long long p = 64;
    while (2 * p < x) p <<= 1;   // p < x <= 2 p (or x <= 64)
    long long q = p / 4, b = x <= 64 ? 64 : (x + q - 1) / q * q;
    return b < cap ? b : (cap > x ? cap : x);
}
// the key of a call; *qn, *qk: the n and k the heuristic is asked with (the buckets)
static inline MatmulKey matmul_key(bool trans_a, bool trans_b, int m, int n, int k, cudaDataType_t a_type, int lda,
                                   long long stride_a, const void* A, cudaDataType_t b_type, int ldb, long long stride_b,
                                   const void* B, cudaDataType_t d_type, int ldd, long long stride_d, const void* D, int batch,
                                   const MatmulOptions* opt, long long* qn, long long* qk) {
    long long big = 1ll << 40;
    *qn = matmul_bucket(n, trans_b ? ldb : big);                                      // B (n, k) when transposed: n its rows
    *qk = matmul_bucket(k, std::min<long long>(trans_a ? lda : big, trans_b ? big : ldb));   // A (k, m) / B (k, n): k their rows
    MatmulKey key = {trans_a, trans_b, m, *qn, *qk, a_type, b_type, d_type, lda, ldb, ldd, batch, stride_a, stride_b, stride_d,
                     matmul_batch_alignment(A, a_type, stride_a, batch), matmul_batch_alignment(B, b_type, stride_b, batch),
                     matmul_batch_alignment(D, d_type, stride_d, batch), 0, 0, 0, 0, 0, 0};
    if (opt) {
        key[18] = (opt->a_scale ? 1 : 0) | (opt->b_scale ? 2 : 0) | (opt->d_scale ? 4 : 0) | (opt->amax_d ? 8 : 0);
        key[19] = opt->fast_accum; key[20] = opt->a_scale_mode; key[21] = opt->b_scale_mode;
    }
    return key;
}

// matmul_cublaslt itself, on cuBLASLt: the real library, or under the emulator its API twin (model/platform.h)
#include "matmul_cublaslt.cuh"

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

// `batch` GEMMs in one call, operand b at A + b sa, B + b sb, C + b sc (elements; a stride 0 reuses the
// operand): the experts' w1 and v1 products of the same rows (model/moe.cuh)
#define gemm_gpu_batched(...) gemm_gpu_batched_at(__FILE__, __LINE__, __VA_ARGS__)
template <typename TC>
static inline void gemm_gpu_batched_at(const char* file, int line, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                       const floatX* A, int lda, long long sa, const floatX* B, int ldb, long long sb, float beta,
                                       TC* C, int ldc, long long sc, int batch, cudaStream_t stream = 0) {
    matmul_cublaslt(trans_b, trans_a, N, M, K, alpha, B, CUDA_R_16BF, ldb, sb, A, CUDA_R_16BF, lda, sa, beta, C,
                    CudaType<TC>::value, ldc, sc, batch, nullptr, stream, file, line);
}

// One FP8 GEMM operand: the FP8 data, K-contiguous (row-major rows of K with leading dimension ld),
// its dequantisation factors and their layout (MatmulScaleMode), and a name for error messages.
typedef struct {
    const void* data;
    cudaDataType_t type;    // CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2
    int ld;
    const float* scale;     // device dequantisation factor(s)
    int scale_mode;
    const char* name;
} Fp8GemmOperand;

// ROW-major FP8 GEMM, the one layout Hopper runs: C (M, N) = alpha * A (M, K) @ B (N, K)^T + beta * C,
// both operands K-contiguous, FP32 accumulation, C bf16 or fp32 (ldc). Column-major this is
// C^T (N, M) = B (TN) A^T, so B is cuBLAS's A. fast_accum: forward GEMMs only, and per-tensor scaling
// only (block-scaled kernels promote every 128-long chunk anyway; the flag is dropped for them).
#define gemm_fp8_gpu(...) gemm_fp8_gpu_at(__FILE__, __LINE__, __VA_ARGS__)
template <typename TC>
static inline void gemm_fp8_gpu_at(const char* file, int line, int M, int N, int K, float alpha, const Fp8GemmOperand& A,
                                   const Fp8GemmOperand& B, float beta, TC* C, int ldc, int fast_accum, cudaStream_t stream = 0) {
    int fa = fast_accum && A.scale_mode == MATMUL_SCALE_TENSOR;
    MatmulOptions opt = {B.scale, A.scale, nullptr, nullptr, fa, B.scale_mode, A.scale_mode, B.name, A.name};
    matmul_cublaslt(true, false, N, M, K, alpha, B.data, B.type, B.ld, 0, A.data, A.type, A.ld, 0, beta, C, CudaType<TC>::value,
                    ldc, 0, 1, &opt, stream, file, line);
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T          (cuBLAS "TN": every operand contiguous in C)
template <typename TO>
static inline void matmul_forward_gpu(TO* out, const floatX* inp, const floatX* weight, int N, int C, int OC,
                                      cudaStream_t stream = 0) {
    gemm_gpu(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, stream);
}
// dinp (N, C) = dinp_beta * dinp + dout (N, OC) @ weight (OC, C);  dweight (OC, C) = dweight_beta * dweight + dout^T @ inp
// (fp32 weight gradients: accumulated, or with dweight_beta 0 overwritten). Either output may be NULL.
template <typename TI>
static inline void matmul_backward_gpu(TI* dinp, float* dweight, const floatX* dout, const floatX* inp, const floatX* weight,
                                       int N, int C, int OC, float dinp_beta, cudaStream_t stream = 0, float dweight_beta = 1.0f) {
    if (dinp) gemm_gpu(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C, stream);
    if (dweight && N > 0) gemm_gpu(true, false, OC, C, N, 1.0f, dout, OC, inp, C, dweight_beta, dweight, C, stream);
}
#endif  // DBRX_HAVE_CUDA
