/*
 * cublaslt_twin.h — the emulated twin of model/matmul.cuh's matmul_cublaslt: the same function,
 * the same semantics as cuBLASLt's cublasLtMatmul with CUBLAS_COMPUTE_32F, computed on the CPU.
 *   D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * D   (column-major)
 *   op(X) = X^T when trans; A stored (k, m) with lda >= k when trans_a, else (m, k) with lda >= m;
 *   `batch` matrices, each operand advancing by its stride; amax_d = max |result| before d_scale;
 *   an FP32 accumulator per output element, summed in k order; the output rounded to nearest even.
 * FP8 operands (E4M3 / E5M2) follow cuBLASLt's FP8 rules, checked by matmul_validate_fp8 as on the
 * device: a non-TN call or E5M2 x E5M2 fails. They are dequantised by their scales:
 *   per tensor   D = alpha * a_scale * b_scale * sum_p A8 B8
 *   block scales (1x128 tiles / 128x128 blocks along k, layouts in matmul.cuh) every 128-long chunk
 *                of k is summed in FP32 on the FP8 values and added times a_scale(i, chunk) *
 *                b_scale(j, chunk) — what Hopper's block-scaled kernels do (promotion per chunk).
 * FAST_ACCUM (per-tensor FP8 only) is modelled as Hopper's tensor-core accumulator without promotion:
 *   the products of each k-step of 32 (one FP8 WGMMA's k) are summed in FP32 (FP8 x FP8 products are
 *   exact in FP32), added to the running sum, and the running sum is truncated (rounded toward zero)
 *   to 14 significant bits (13 fraction bits) after every step, for the whole of k.
 *   Sources: DeepSeek-V3 technical report, section 3.3.2 ("the accumulation precision of FP8 GEMM on
 *   NVIDIA H800 GPUs is limited to retaining around 14 bits"; their kernels promote the partial sums
 *   to FP32 every N_C = 128 elements of k, as CUTLASS's non-FastAccum FP8 kernels and DeepGEMM do);
 *   Khattak and Mikaitis, "Accurate Models of NVIDIA Tensor Cores" (arXiv 2512.07004) and the PyTorch
 *   blog they cite: H100's FP8 accumulator is e8m13 and truncates. cuBLAS does not document its
 *   FAST_ACCUM precision (openxla/xla#6168): this is a model of the error's size, not of the device's
 *   bits. Its error per output is at most 2^-13 x (the running sum of |products| after each step),
 *   summed over the steps: test/test_fp8_cuda.cpp's bound allows twice that (the device's in-step
 *   alignment of the products may truncate as much again).
 * Without FAST_ACCUM (dgrad, wgrad, every block-scaled GEMM) the twin accumulates in FP32. The device
 *   promotes into FP32 every 128 of k (block scaling: every chunk), so its error within a chunk is of
 *   the same 14-bit kind over at most 4 steps; the tests' bounds allow for that, the twin does not
 *   produce it (exact FP32 keeps the emulated runs' numerics those of the CPU reference).
 * The plan cache (model/matmul.cuh) is the same map with the same keys as on the device; a plan
 * holds a fake algorithm, and making one counts a descriptor set and a heuristic query
 * (simt::counters(): plan_creations, heuristic_queries), and every matmul counts as a GEMM launch and
 * writes its line to the work log (SIMT_WORKLOG: shape, types, transposes, stream; test/simt/counters.h).
 * Pinned algorithms (model/matmul_pins.h) as on the device: a plan takes the key's pinned algorithm
 * when there is one, else the fake heuristic's, which names the process (word 0: a hash of the key,
 * word 1: the process id), so that a restarted process that asked the heuristic again would record
 * other algorithms than the run it resumes: the resume tests compare the saved tables. The twin's
 * cublasLtMatmulAlgoCheck refuses an algorithm whose word 7 is not zero (what a test uses for one from
 * another GPU).
 * Included by model/matmul.cuh under SIMT_EMULATION only (it needs matmul_validate, MatmulOptions).
 */
#pragma once
#include <unistd.h>
#include "../../model/matmul_pins.h"

// the library that chooses the algorithms, named in the saved tables
static const bool matmul_pins_library_named = [] { matmul_pins().library = "twin 1"; return true; }();

static inline float twin_load(const void* p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    case CUDA_R_32F: return ((const float*)p)[i];
    case CUDA_R_8F_E4M3: return (float)((const __nv_fp8_e4m3*)p)[i];
    case CUDA_R_8F_E5M2: return (float)((const __nv_fp8_e5m2*)p)[i];
    default: fail_at(__FILE__, __LINE__, "matmul twin: unsupported type %d", (int)t);
    }
}

// the emulator has every scale mode (the device needs cuBLAS 12.9+ and sm_90 for block scaling)
static inline bool matmul_fp8_block_supported(std::string* why) { (void)why; return true; }

// the dequantisation factor of element (o, p) of an operand with `outer` rows of k (block modes)
static inline float twin_block_scale(const float* s, int mode, int o, int p, int outer, int k) {
    return mode == MATMUL_SCALE_VEC128 ? s[matmul_scale_vec128_index(o, p, outer)] : s[matmul_scale_blk128_index(o, p, k)];
}

// the tensor core's accumulator under FAST_ACCUM (above): x truncated to 14 significant bits
static inline float twin_fast_accum_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;   // inf / NaN pass
    u &= ~0x3FFu;                                       // the low 10 of FP32's 23 fraction bits
    memcpy(&x, &u, 4);
    return x;
}
static const int TWIN_FAST_ACCUM_STEP = 32;

static inline void twin_matmul_run(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A, cudaDataType_t a_type,
                                   int lda, long long stride_a, const void* B, cudaDataType_t b_type, int ldb, long long stride_b,
                                   float beta, void* D, cudaDataType_t d_type, int ldd, long long stride_d, int batch,
                                   const MatmulOptions* opt, bool fp8);
static inline void matmul_cublaslt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A,
                                   cudaDataType_t a_type, int lda, long long stride_a, const void* B, cudaDataType_t b_type,
                                   int ldb, long long stride_b, float beta, void* D, cudaDataType_t d_type, int ldd,
                                   long long stride_d, int batch, const MatmulOptions* opt, cudaStream_t stream,
                                   const char* file, int line) {
    (void)matmul_pins_library_named;
    matmul_validate(trans_a, trans_b, m, n, k, a_type, lda, b_type, ldb, d_type, ldd, batch, file, line);
    if (m == 0 || n == 0) return;
    bool fp8 = is_fp8_type(a_type);
    if (fp8) matmul_validate_fp8(trans_a, trans_b, m, n, k, A, a_type, lda, B, b_type, ldb, D, d_type, batch, opt, file, line);
    {   // the device's plan cache, counted: a miss (or no cache) makes a plan, from a pin or the heuristic
        static std::map<MatmulKey, MatmulAlgoWords> plans;
        long long qn, qk;
        MatmulKey key = matmul_key(trans_a, trans_b, m, n, k, a_type, lda, stride_a, A, b_type, ldb, stride_b, B, d_type, ldd,
                                   stride_d, D, batch, opt, &qn, &qk);
        if (!matmul_plan_cache_enabled() || !plans.count(key)) {
            simt::count(&simt::counters().plan_creations);
            MatmulAlgoWords algo;
            bool pinned = matmul_pin_find(key, &algo);
            if (pinned && algo[7] != 0) { matmul_pin_refused("twin: CUBLAS_STATUS_NOT_SUPPORTED"); pinned = false; }
            if (pinned) matmul_pins().pins_taken++;
            else {
                simt::count(&simt::counters().heuristic_queries);
                uint64_t hsh = 1469598103934665603ull;   // FNV-1a of the key
                for (long long v : key) { hsh ^= (uint64_t)v; hsh *= 1099511628211ull; }
                algo = {hsh, (uint64_t)getpid(), 0, 0, 0, 0, 0, 0};
            }
            matmul_pin_record(key, algo);
            if (matmul_plan_cache_enabled()) plans[key] = algo;
        }
        simt::count(&simt::counters().gemms);
        if (simt::worklog_file()) {   // the work log's line (SIMT_WORKLOG: test/simt/counters.h)
            std::lock_guard<std::mutex> lock(simt::worklog().mu);
            simt::worklog_line(simt::worklog_fmt(
                "\"t\":\"gemm\",\"m\":%d,\"n\":%d,\"k\":%d,\"batch\":%d,\"a\":\"%s\",\"b\":\"%s\",\"d\":\"%s\",\"trans_a\":%s,"
                "\"trans_b\":%s,\"beta\":%.9g,\"fast_accum\":%d,\"a_scale_mode\":%d,\"b_scale_mode\":%d,\"epilogue\":\"none\","
                "\"stream\":%d,\"flops\":%lld", m, n, k, batch, dtype_name(a_type), dtype_name(b_type), dtype_name(d_type),
                trans_a ? "true" : "false", trans_b ? "true" : "false", (double)beta, opt ? opt->fast_accum : 0,
                opt ? opt->a_scale_mode : 0, opt ? opt->b_scale_mode : 0, simt::worklog_stream(stream), 2ll * m * n * k * batch));
        }
    }
    if (simt::options().shapes_only) return;   // SIMT_SHAPES_ONLY (simt.h): checked and logged, not computed
    // the arithmetic runs on `stream` as a kernel does: now on the null stream, when it is waited for on a
    // stream made by cudaStreamCreate* (simt.h, "Streams"; the scales and amax are read and written then)
    MatmulOptions o = opt ? *opt : MatmulOptions{};
    bool has_opt = opt != nullptr;
    simt::stream_enqueue(stream, [=]() {
        twin_matmul_run(trans_a, trans_b, m, n, k, alpha, A, a_type, lda, stride_a, B, b_type, ldb, stride_b, beta, D, d_type, ldd,
                        stride_d, batch, has_opt ? &o : nullptr, fp8);
    });
}

// matmul_cublaslt's arithmetic (above), in the stream order
static inline void twin_matmul_run(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A, cudaDataType_t a_type,
                                   int lda, long long stride_a, const void* B, cudaDataType_t b_type, int ldb, long long stride_b,
                                   float beta, void* D, cudaDataType_t d_type, int ldd, long long stride_d, int batch,
                                   const MatmulOptions* opt, bool fp8) {
    bool blocks = fp8 && opt && opt->a_scale_mode != MATMUL_SCALE_TENSOR;
    bool fast = fp8 && opt && opt->fast_accum && !blocks;   // (matmul_validate_fp8 refuses it with blocks)
    float scale = alpha;
    if (!blocks && opt && opt->a_scale) scale *= *opt->a_scale;
    if (!blocks && opt && opt->b_scale) scale *= *opt->b_scale;
    float d_scale = (opt && opt->d_scale) ? *opt->d_scale : 1.0f;
    float amax = 0.0f;
    const int nchunks = (k + 127) / 128;
    std::vector<float> a_rows((size_t)m * k), b_cols((size_t)n * k);   // op(A) row i, op(B) column j, contiguous in k
    std::vector<float> sa, sb;   // block scaling: the factor of op(A) row i / op(B) column j for every chunk of k
    if (blocks) {
        sa.resize((size_t)m * nchunks);
        sb.resize((size_t)n * nchunks);
        for (int i = 0; i < m; i++)
            for (int c = 0; c < nchunks; c++) sa[(size_t)i * nchunks + c] = twin_block_scale(opt->a_scale, opt->a_scale_mode, i, c * 128, m, k);
        for (int j = 0; j < n; j++)
            for (int c = 0; c < nchunks; c++) sb[(size_t)j * nchunks + c] = twin_block_scale(opt->b_scale, opt->b_scale_mode, j, c * 128, n, k);
    }
    for (int b = 0; b < batch; b++) {
        const size_t oa = (size_t)b * stride_a, ob = (size_t)b * stride_b, od = (size_t)b * stride_d;
        for (int i = 0; i < m; i++)
            for (int p = 0; p < k; p++)
                a_rows[(size_t)i * k + p] = twin_load(A, a_type, oa + (trans_a ? (size_t)i * lda + p : (size_t)p * lda + i));
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++)
                b_cols[(size_t)j * k + p] = twin_load(B, b_type, ob + (trans_b ? (size_t)p * ldb + j : (size_t)j * ldb + p));
        #pragma omp parallel for reduction(max : amax) if ((double)m * n * k > 1e7)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float* x = &a_rows[(size_t)i * k];
                const float* y = &b_cols[(size_t)j * k];
                float acc = 0.0f;
                if (blocks) {
                    for (int c = 0; c < nchunks; c++) {
                        float part = 0.0f;
                        for (int p = c * 128; p < k && p < c * 128 + 128; p++) part += x[p] * y[p];
                        acc += part * (sa[(size_t)i * nchunks + c] * sb[(size_t)j * nchunks + c]);
                    }
                } else if (fast) {
                    for (int p0 = 0; p0 < k; p0 += TWIN_FAST_ACCUM_STEP) {
                        float part = 0.0f;
                        for (int p = p0; p < k && p < p0 + TWIN_FAST_ACCUM_STEP; p++) part += x[p] * y[p];
                        acc = twin_fast_accum_round(acc + part);
                    }
                } else {
                    for (int p = 0; p < k; p++) acc += x[p] * y[p];
                }
                size_t di = od + (size_t)j * ldd + i;
                float r = scale * acc;
                if (beta != 0.0f) r += beta * twin_load(D, d_type, di);   // beta == 0: D is not read (may hold NaN)
                amax = fmaxf(amax, fabsf(r));
                r *= d_scale;
                if (d_type == CUDA_R_32F) ((float*)D)[di] = r;
                else ((__nv_bfloat16*)D)[di] = __float2bfloat16(r);
            }
    }
    if (opt && opt->amax_d) *opt->amax_d = amax;
}
