/*
 * cublaslt_twin.h — the arithmetic of cuBLASLt's twin: what cublasLtMatmul computes with CUBLAS_COMPUTE_32F,
 * on the CPU. The API twin (test/simt/cublaslt_api_twin.h: handles, descriptors, layouts, the heuristic,
 * the rules the library enforces) calls twin_matmul_compute once a call is accepted.
 *   D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C   (column-major; C is read only when beta != 0)
 *   op(X) = X^T when trans; A stored (k, m) with lda >= k when trans_a, else (m, k) with lda >= m;
 *   `batch` matrices, each operand advancing by its stride (no amax: the API twin refuses it, R8, as D is never FP8);
 *   an FP32 accumulator per output element, summed in k order; the output rounded to nearest even.
 * FP8 operands (E4M3 / E5M2) are dequantised by their scales:
 *   per tensor   D = alpha * a_scale * b_scale * sum_p A8 B8
 *   block scales (1x128 tiles / 128x128 blocks along k: cuBLAS's VEC128_32F / BLK128x128_32F, the layouts
 *                model/matmul.cuh describes) every 128-long chunk of k is summed in FP32 on the FP8 values
 *                and added times a_scale(i, chunk) * b_scale(j, chunk) — what Hopper's block-scaled
 *                kernels do (promotion per chunk).
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
 * Included by test/simt/cublaslt_api_twin.h only.
 */
#pragma once
#include <math.h>
#include <string.h>
#include <algorithm>
#include <vector>

// one GEMM as the API twin accepted it (types, shapes and scale modes already checked there)
typedef struct {
    bool trans_a, trans_b;
    int m, n, k, batch;
    float alpha, beta;
    const void *A, *B, *C;
    void* D;
    cudaDataType_t a_type, b_type, d_type;   // C has D's type
    long long lda, ldb, ldc, ldd, stride_a, stride_b, stride_c, stride_d;
    const float *a_scale, *b_scale, *d_scale;   // NULL = 1; block modes: the factors (layouts above)
    int a_mode, b_mode;                          // 0 per tensor, 1 1x128 tiles, 2 128x128 blocks
    bool fast_accum;
} TwinGemm;

static inline float twin_load(const void* p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    case CUDA_R_32F: return ((const float*)p)[i];
    case CUDA_R_8F_E4M3: return (float)((const __nv_fp8_e4m3*)p)[i];
    case CUDA_R_8F_E5M2: return (float)((const __nv_fp8_e5m2*)p)[i];
    default: fprintf(stderr, "cuBLASLt twin: type %d reached the arithmetic\n", (int)t); abort();   // (the API twin refuses it first)
    }
}

// the dequantisation factor of element (o, p) of an operand with `outer` rows of k (block modes): 1x128 tiles
// scale[(p / 128) * outer + o], 128x128 blocks scale[(o / 128) * round_up(ceil(k / 128), 4) + p / 128]
static inline float twin_block_scale(const float* s, int mode, int o, int p, int outer, int k) {
    return mode == 1 ? s[(size_t)(p / 128) * outer + o] : s[(size_t)(o / 128) * (((k + 127) / 128 + 3) / 4 * 4) + p / 128];
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

// count elements of an operand, element c at src[off + c * stride], converted to FP32 into dst[c * dst_stride]
// (twin_load's conversions, with the type's switch once per run instead of once per element)
template <typename T, typename F> static inline void twin_run(float* dst, size_t dst_stride, const T* src, size_t stride, int count, F cvt) {
    if (dst_stride == 1 && stride == 1) {   // (both contiguous: a loop the compiler vectorises)
        for (int c = 0; c < count; c++) dst[c] = cvt(src[c]);
        return;
    }
    for (int c = 0; c < count; c++) dst[(size_t)c * dst_stride] = cvt(src[(size_t)c * stride]);
}
static inline void twin_load_run(float* dst, size_t dst_stride, const void* p, cudaDataType_t t, size_t off, size_t stride, int count) {
    switch (t) {
    case CUDA_R_16BF:
        twin_run(dst, dst_stride, (const __nv_bfloat16*)p + off, stride, count, [](__nv_bfloat16 x) { return __bfloat162float(x); });
        return;
    case CUDA_R_32F: twin_run(dst, dst_stride, (const float*)p + off, stride, count, [](float x) { return x; }); return;
    case CUDA_R_8F_E4M3: twin_run(dst, dst_stride, (const __nv_fp8_e4m3*)p + off, stride, count, [](__nv_fp8_e4m3 x) { return (float)x; }); return;
    case CUDA_R_8F_E5M2: twin_run(dst, dst_stride, (const __nv_fp8_e5m2*)p + off, stride, count, [](__nv_fp8_e5m2 x) { return (float)x; }); return;
    default: twin_load(p, t, off); return;   // (reports the type and aborts)
    }
}

// acc0[r] += A(r, p) y0(p), acc1[r] += A(r, p) y1(p) for p in [0, k), r < TWIN_ROWS: the panel holds TWIN_ROWS rows of op(A)
// interleaved, (k, TWIN_ROWS); y0, y1: two columns of op(B). Each output's sum is the scalar loop's (in k order, a rounded
// product then a rounded add: no FMA contraction, as GCC compiles that loop), the rows side by side in vector lanes:
// independent chains instead of one latency-bound chain, and each load of the panel serves two columns.
static const int TWIN_ROWS = 16;
typedef float twin_v8 __attribute__((vector_size(32)));   // 8 rows' partial sums (GCC's vector extension: one AVX register)
__attribute__((optimize("fp-contract=off"))) static void twin_dot_rows(float* acc0, float* acc1, const float* panel, const float* y0,
                                                                     const float* y1, int k) {
    twin_v8 s00 = {}, s01 = {}, s10 = {}, s11 = {};
    for (int p = 0; p < k; p++) {
        twin_v8 a0, a1;
        memcpy(&a0, panel + (size_t)p * TWIN_ROWS, sizeof a0);
        memcpy(&a1, panel + (size_t)p * TWIN_ROWS + 8, sizeof a1);
        s00 = s00 + a0 * y0[p];
        s01 = s01 + a1 * y0[p];
        s10 = s10 + a0 * y1[p];
        s11 = s11 + a1 * y1[p];
    }
    memcpy(acc0, &s00, sizeof s00);
    memcpy(acc0 + 8, &s01, sizeof s01);
    memcpy(acc1, &s10, sizeof s10);
    memcpy(acc1 + 8, &s11, sizeof s11);
}

// op(A) of batch entry b into a_rows (row i contiguous in k) or, panels, into TWIN_ROWS-row panels (twin_dot_rows's
// layout); op(B) into b_cols (column j contiguous in k). Each loop runs along the operand's contiguous dimension.
static inline void twin_load_operands(const TwinGemm& g, int b, bool panels, float* a_rows, float* a_panels, float* b_cols) {
    const int m = g.m, n = g.n, k = g.k;
    const size_t oa = (size_t)b * g.stride_a, ob = (size_t)b * g.stride_b;
    if (g.trans_a) {   // A(i, p) at i * lda + p
        for (int i = 0; i < m; i++) {
            const size_t src = oa + (size_t)i * g.lda;
            if (panels) twin_load_run(a_panels + (size_t)(i / TWIN_ROWS) * k * TWIN_ROWS + i % TWIN_ROWS, TWIN_ROWS, g.A, g.a_type, src, 1, k);
            else twin_load_run(a_rows + (size_t)i * k, 1, g.A, g.a_type, src, 1, k);
        }
    } else {           // A(i, p) at p * lda + i
        for (int p = 0; p < k; p++) {
            if (panels) {
                for (int i0 = 0; i0 < m; i0 += TWIN_ROWS)
                    twin_load_run(a_panels + ((size_t)(i0 / TWIN_ROWS) * k + p) * TWIN_ROWS, 1, g.A, g.a_type, oa + (size_t)p * g.lda + i0, 1,
                                  std::min(TWIN_ROWS, m - i0));
            } else {
                twin_load_run(a_rows + p, k, g.A, g.a_type, oa + (size_t)p * g.lda, 1, m);
            }
        }
    }
    if (g.trans_b) {   // B(p, j) at p * ldb + j
        for (int p = 0; p < k; p++) twin_load_run(b_cols + p, k, g.B, g.b_type, ob + (size_t)p * g.ldb, 1, n);
    } else {           // B(p, j) at j * ldb + p
        for (int j = 0; j < n; j++) twin_load_run(b_cols + (size_t)j * k, 1, g.B, g.b_type, ob + (size_t)j * g.ldb, 1, k);
    }
}

static inline void twin_matmul_compute(const TwinGemm& g) {
    const int m = g.m, n = g.n, k = g.k;
    const bool blocks = g.a_mode != 0;
    const bool fast = g.fast_accum && !blocks;   // (the API twin refuses it with blocks)
    float scale = g.alpha;
    if (!blocks && g.a_scale) scale *= *g.a_scale;
    if (!blocks && g.b_scale) scale *= *g.b_scale;
    float d_scale = g.d_scale ? *g.d_scale : 1.0f;
    // (copies: a store through D could alias g, so the loop would read g's fields again after every output)
    const float beta = g.beta;
    const void* C = g.C;
    void* D = g.D;
    const cudaDataType_t d_type = g.d_type;
    const long long ldc = g.ldc, ldd = g.ldd;
    const int nchunks = (k + 127) / 128;
    // the plain FP32 accumulation (BF16 and per-tensor FP8 without FAST_ACCUM): op(A) in panels of TWIN_ROWS rows
    // (the last padded with zeros: never written, they stay the zeros of the allocation), every output's sum in k
    // order as the scalar loops below would give it; the other modes read op(A) by rows
    const bool panels = !blocks && !fast;
    const int npanels = (m + TWIN_ROWS - 1) / TWIN_ROWS;
    std::vector<float> a_rows(panels ? 0 : (size_t)m * k), b_cols((size_t)n * k);   // op(A) row i, op(B) column j, contiguous in k
    std::vector<float> a_panels(panels ? (size_t)npanels * k * TWIN_ROWS : 0);
    std::vector<float> sa, sb;   // block scaling: the factor of op(A) row i / op(B) column j for every chunk of k
    if (blocks) {
        sa.resize((size_t)m * nchunks);
        sb.resize((size_t)n * nchunks);
        for (int i = 0; i < m; i++)
            for (int c = 0; c < nchunks; c++) sa[(size_t)i * nchunks + c] = twin_block_scale(g.a_scale, g.a_mode, i, c * 128, m, k);
        for (int j = 0; j < n; j++)
            for (int c = 0; c < nchunks; c++) sb[(size_t)j * nchunks + c] = twin_block_scale(g.b_scale, g.b_mode, j, c * 128, n, k);
    }
    for (int b = 0; b < g.batch; b++) {
        const size_t oc = (size_t)b * g.stride_c, od = (size_t)b * g.stride_d;
        twin_load_operands(g, b, panels, a_rows.data(), a_panels.data(), b_cols.data());
        // two columns of D at a time (twin_dot_rows), TWIN_ROWS rows at a time
        #pragma omp parallel for if ((double)m * n * k > 1e7)
        for (int j0 = 0; j0 < n; j0 += 2) {
            const int nj = std::min(2, n - j0);
            for (int i0 = 0; i0 < m; i0 += TWIN_ROWS) {
                float panel_acc[2][TWIN_ROWS];
                if (panels)   // (a single last column: computed twice, the copy unused)
                    twin_dot_rows(panel_acc[0], panel_acc[1], &a_panels[(size_t)(i0 / TWIN_ROWS) * k * TWIN_ROWS], &b_cols[(size_t)j0 * k],
                                  &b_cols[(size_t)(j0 + nj - 1) * k], k);
                for (int j = j0; j < j0 + nj; j++)
                    for (int i = i0; i < m && i < i0 + TWIN_ROWS; i++) {
                        const float* x = panels ? nullptr : &a_rows[(size_t)i * k];
                        const float* y = &b_cols[(size_t)j * k];
                        float acc = 0.0f;
                        if (panels) {
                            acc = panel_acc[j - j0][i - i0];
                        } else if (blocks) {
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
                        }
                        float r = scale * acc;
                        if (beta != 0.0f) r += beta * twin_load(C, d_type, oc + (size_t)j * ldc + i);   // beta == 0: C is not read (may hold NaN)
                        r *= d_scale;
                        size_t di = od + (size_t)j * ldd + i;
                        if (d_type == CUDA_R_32F) ((float*)D)[di] = r;
                        else ((__nv_bfloat16*)D)[di] = __float2bfloat16(r);
                    }
            }
        }
    }
}
