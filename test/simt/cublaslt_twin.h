/*
 * cublaslt_twin.h — the emulated twin of model/matmul.cuh's matmul_cublaslt: the same function,
 * the same semantics as cuBLASLt's cublasLtMatmul with CUBLAS_COMPUTE_32F, computed on the CPU.
 *   D (m, n) = alpha * a_scale * b_scale * op(A) (m, k) @ op(B) (k, n) + beta * D   (column-major)
 *   op(X) = X^T when trans; A stored (k, m) with lda >= k when trans_a, else (m, k) with lda >= m;
 *   `batch` matrices, each operand advancing by its stride; amax_d = max |result| before d_scale;
 *   an FP32 accumulator per output element, summed in k order; the output rounded to nearest even.
 * Included by model/matmul.cuh under SIMT_EMULATION only (it needs matmul_validate, MatmulOptions).
 */
#pragma once

static inline float twin_load(const void* p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    case CUDA_R_32F: return ((const float*)p)[i];
    case CUDA_R_8F_E4M3: return (float)((const __nv_fp8_e4m3*)p)[i];
    case CUDA_R_8F_E5M2: return (float)((const __nv_fp8_e5m2*)p)[i];
    default: fail_at(__FILE__, __LINE__, "matmul twin: unsupported type %d", (int)t);
    }
}

static inline void matmul_cublaslt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A,
                                   cudaDataType_t a_type, int lda, long long stride_a, const void* B, cudaDataType_t b_type,
                                   int ldb, long long stride_b, float beta, void* D, cudaDataType_t d_type, int ldd,
                                   long long stride_d, int batch, const MatmulOptions* opt, cudaStream_t stream,
                                   const char* file, int line) {
    (void)stream;
    matmul_validate(trans_a, trans_b, m, n, k, a_type, lda, b_type, ldb, d_type, ldd, batch, file, line);
    if (m == 0 || n == 0) return;
    float scale = alpha;
    if (opt && opt->a_scale) scale *= *opt->a_scale;
    if (opt && opt->b_scale) scale *= *opt->b_scale;
    float d_scale = (opt && opt->d_scale) ? *opt->d_scale : 1.0f;
    float amax = 0.0f;
    std::vector<float> a_rows((size_t)m * k), b_cols((size_t)n * k);   // op(A) row i, op(B) column j, contiguous in k
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
                for (int p = 0; p < k; p++) acc += x[p] * y[p];
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
