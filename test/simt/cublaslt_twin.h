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

// acc[r] += A(r, p) B(p) for p in [0, k), r < TWIN_ROWS: the panel holds TWIN_ROWS rows of op(A) interleaved, (k, TWIN_ROWS).
// Each row's sum is the scalar loop's (in k order, a rounded product then a rounded add: no FMA contraction, as GCC
// compiles that loop), the rows side by side in vector lanes: independent chains instead of one latency-bound chain.
static const int TWIN_ROWS = 16;
typedef float twin_v8 __attribute__((vector_size(32)));   // 8 rows' partial sums (GCC's vector extension: one AVX register)
__attribute__((optimize("fp-contract=off"))) static void twin_dot_rows(float* acc, const float* panel, const float* y, int k) {
    twin_v8 s0 = {}, s1 = {};
    for (int p = 0; p < k; p++) {
        twin_v8 a0, a1;
        memcpy(&a0, panel + (size_t)p * TWIN_ROWS, sizeof a0);
        memcpy(&a1, panel + (size_t)p * TWIN_ROWS + 8, sizeof a1);
        s0 = s0 + a0 * y[p];
        s1 = s1 + a1 * y[p];
    }
    memcpy(acc, &s0, sizeof s0);
    memcpy(acc + 8, &s1, sizeof s1);
}

static inline void twin_matmul_compute(const TwinGemm& g) {
    const int m = g.m, n = g.n, k = g.k;
    const bool blocks = g.a_mode != 0;
    const bool fast = g.fast_accum && !blocks;   // (the API twin refuses it with blocks)
    float scale = g.alpha;
    if (!blocks && g.a_scale) scale *= *g.a_scale;
    if (!blocks && g.b_scale) scale *= *g.b_scale;
    float d_scale = g.d_scale ? *g.d_scale : 1.0f;
    const int nchunks = (k + 127) / 128;
    std::vector<float> a_rows((size_t)m * k), b_cols((size_t)n * k);   // op(A) row i, op(B) column j, contiguous in k
    std::vector<float> a_panels;
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
        const size_t oa = (size_t)b * g.stride_a, ob = (size_t)b * g.stride_b, oc = (size_t)b * g.stride_c, od = (size_t)b * g.stride_d;
        for (int i = 0; i < m; i++)
            for (int p = 0; p < k; p++)
                a_rows[(size_t)i * k + p] = twin_load(g.A, g.a_type, oa + (g.trans_a ? (size_t)i * g.lda + p : (size_t)p * g.lda + i));
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++)
                b_cols[(size_t)j * k + p] = twin_load(g.B, g.b_type, ob + (g.trans_b ? (size_t)p * g.ldb + j : (size_t)j * g.ldb + p));
        // the plain FP32 accumulation (BF16 and per-tensor FP8 without FAST_ACCUM): op(A) in panels of TWIN_ROWS rows
        // (the last padded with zeros), every output's sum in k order as the scalar loop below would give it
        const bool panels = !blocks && !fast;
        const int npanels = (m + TWIN_ROWS - 1) / TWIN_ROWS;
        if (panels) {
            a_panels.assign((size_t)npanels * k * TWIN_ROWS, 0.0f);
            for (int i = 0; i < m; i++)
                for (int p = 0; p < k; p++)
                    a_panels[((size_t)(i / TWIN_ROWS) * k + p) * TWIN_ROWS + i % TWIN_ROWS] = a_rows[(size_t)i * k + p];
        }
        #pragma omp parallel for if ((double)m * n * k > 1e7)
        for (int j = 0; j < n; j++) {
            float panel_acc[TWIN_ROWS];
            for (int i = 0; i < m; i++) {
                const float* x = &a_rows[(size_t)i * k];
                const float* y = &b_cols[(size_t)j * k];
                float acc = 0.0f;
                if (panels) {
                    if (i % TWIN_ROWS == 0) {
                        twin_dot_rows(panel_acc, &a_panels[(size_t)(i / TWIN_ROWS) * k * TWIN_ROWS], y, k);
                    }
                    acc = panel_acc[i % TWIN_ROWS];
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
                if (g.beta != 0.0f) r += g.beta * twin_load(g.C, g.d_type, oc + (size_t)j * g.ldc + i);   // beta == 0: C is not read (may hold NaN)
                r *= d_scale;
                size_t di = od + (size_t)j * g.ldd + i;
                if (g.d_type == CUDA_R_32F) ((float*)g.D)[di] = r;
                else ((__nv_bfloat16*)g.D)[di] = __float2bfloat16(r);
            }
        }
    }
}
