/*
 * test_kernels.cpp — every CUDA kernel of the training step against its CPU reference op
 * (model/<op>.cuh), on fresh random inputs, outputs poisoned (NaN) beforehand, several shapes including
 * sizes that are not multiples of the block size. One source, two builds:
 *   make test      g++ -DSIMT_EMULATION: the kernels run under the SIMT emulator, random schedule;
 *   make test-gpu  nvcc: the same checks on a real device (cuBLASLt instead of its twin).
 *
 * Inputs are rounded to BF16 first and the CPU reference gets the very same rounded values, so
 * the differences come only from the kernel's own arithmetic. Tolerances, |got - want| <=
 * rtol * |want| + atol * max|want| for every element:
 *   TOL_BF16  rtol 1e-2, atol 1e-2: outputs stored in BF16 (one rounding is <= 2^-9 relative,
 *             plus FP32 summation in another order, plus BF16 intermediates such as the recomputed
 *             attention probabilities); gradients that cancel get the atol part.
 *   TOL_F32   rtol 1e-4, atol 1e-5: FP32 outputs from the same BF16 inputs (summation order, and
 *             on a GPU the last-bit differences of expf/rsqrtf).
 *   TOL_FP8_ACC rtol 1e-4, atol 2^-12: FP32 outputs of an FP8 GEMM on a Hopper GPU, whose tensor cores keep about
 *             14 bits of the running sum between cuBLASLt's promotions to FP32 (DeepSeek-V3's report, section 3.3.2;
 *             seen on an H200 2026-11-28: 701 of 3,072 outputs off by up to 7.8e-5 x max|want| at k 384, which
 *             TOL_F32 refuses). A wrong scale or operand is off by a factor, far past it; the emulator sums in FP32.
 *   exact     integer outputs (top-k indices, counts, offsets, permutations) and copies.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <algorithm>
#include <vector>
#include "../model/dbrx.h"
#include "../model/residual.cuh"
#include "../model/attention_cp_cuda.cuh"
#include "cuda_test_helpers.h"

struct Tol { double rtol, atol; };
static const Tol TOL_BF16 = {1e-2, 1e-2};
static const Tol TOL_F32 = {1e-4, 1e-5};
static const Tol TOL_FP8_ACC = {1e-4, 1.0 / 4096};

static std::vector<float> bf16_round(std::vector<float> v) {
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
    return v;
}
static std::vector<int> randint(size_t n, int hi, uint64_t seed) {
    Rng r = {seed + 77};
    std::vector<int> v(n);
    for (int& x : v) x = (int)(rng_u64(&r) % (uint64_t)hi);
    return v;
}

static floatX* dev_bf16(const std::vector<float>& v) {
    floatX* p = dev_poisoned<floatX>(v.size());
    to_device_bf16(p, v.data(), v.size());
    return p;
}

// every element within tolerance (a NaN never is); reports the worst element
static void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, Tol tol) {
    REQUIRE(got.size() == want.size());
    double maxw = 0;
    for (float w : want) maxw = std::max(maxw, (double)std::fabs(w));
    size_t bad = 0, worst = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < got.size(); i++) {
        double err = std::fabs((double)got[i] - want[i]), lim = tol.rtol * std::fabs(want[i]) + tol.atol * maxw + 1e-30;
        bool ok = err <= lim;
        if (!ok) bad++;
        double excess = std::isnan(err) ? 1e30 : err / lim;
        if (excess > worst_excess) { worst_excess = excess; worst = i; }
    }
    INFO(what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst [" << worst << "] got "
              << got[worst] << " want " << want[worst] << " (max |want| " << maxw << ")");
    CHECK(bad == 0);
}
template <typename T> static void expect_equal(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
    REQUIRE(got.size() == want.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++) if (!(got[i] == want[i])) { if (!bad) first = i; bad++; }
    INFO(what << ": " << bad << " of " << got.size() << " differ, first at [" << first << "]");
    CHECK(bad == 0);
}

// ---------------------------------------------------------------------------------------------

// the column-major reference of matmul_cublaslt, in double
static std::vector<double> naive_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const std::vector<float>& A, int lda,
                                      long long sa, const std::vector<float>& B, int ldb, long long sb, double beta,
                                      const std::vector<float>& D0, int ldd, long long sd, int batch) {
    std::vector<double> D(D0.begin(), D0.end());
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0;
                for (int p = 0; p < k; p++) {
                    double a = A[b * sa + (ta ? (size_t)i * lda + p : (size_t)p * lda + i)];
                    double bb = B[b * sb + (tb ? (size_t)p * ldb + j : (size_t)j * ldb + p)];
                    acc += a * bb;
                }
                size_t di = b * sd + (size_t)j * ldd + i;
                D[di] = alpha * acc + beta * D0[di];
            }
    return D;
}

TEST_CASE("matmul wrapper: every transpose, leading dimensions, strided batches, alpha/beta, BF16/FP32 out") {
    int seed = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (auto shape : {std::vector<int>{5, 7, 3, 1}, {33, 17, 40, 3}, {64, 48, 32, 2}}) {
                int m = shape[0], n = shape[1], k = shape[2], batch = shape[3];
                int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 1, ldd = m + 2;
                long long sa = (long long)lda * (ta ? m : k) + 5, sb = (long long)ldb * (tb ? k : n), sd = (long long)ldd * n + 7;
                std::vector<float> A = bf16_round(randn(sa * batch, ++seed)), B = bf16_round(randn(sb * batch, ++seed));
                for (int out_f32 = 0; out_f32 < 2; out_f32++) {
                    std::vector<float> D0 = bf16_round(randn(sd * batch, ++seed));
                    float alpha = 0.75f, beta = out_f32 ? 0.5f : 0.0f;
                    std::vector<double> want = naive_gemm(ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, D0, ldd, sd, batch);
                    floatX* dA = dev_bf16(A);
                    floatX* dB = dev_bf16(B);
                    std::vector<float> got(D0.size()), wantf(D0.size());
                    if (out_f32) {
                        float* dD = dev_copy(D0);
                        matmul_cublaslt(ta, tb, m, n, k, alpha, dA, CUDA_R_16BF, lda, sa, dB, CUDA_R_16BF, ldb, sb, beta, dD,
                                        CUDA_R_32F, ldd, sd, batch, nullptr, 0, __FILE__, __LINE__);
                        got = get(dD, D0.size());
                        cudaCheck(cudaFree(dD));
                    } else {
                        floatX* dD = dev_bf16(D0);   // beta = 0: D's old values (here, random) must not matter
                        matmul_cublaslt(ta, tb, m, n, k, alpha, dA, CUDA_R_16BF, lda, sa, dB, CUDA_R_16BF, ldb, sb, beta, dD,
                                        CUDA_R_16BF, ldd, sd, batch, nullptr, 0, __FILE__, __LINE__);
                        got = get_bf16(dD, D0.size());
                        cudaCheck(cudaFree(dD));
                    }
                    // compare only the m x n block of every batch; the padding must be untouched
                    std::vector<float> g1, w1;
                    for (int b = 0; b < batch; b++)
                        for (int j = 0; j < n; j++)
                            for (int i = 0; i < m; i++) {
                                size_t di = b * sd + (size_t)j * ldd + i;
                                g1.push_back(got[di]);
                                w1.push_back((float)want[di]);
                                got[di] = D0[di];
                            }
                    INFO("trans " << ta << tb << " m " << m << " n " << n << " k " << k << " batch " << batch << " fp32 out " << out_f32);
                    expect_close("D", g1, w1, out_f32 ? TOL_F32 : TOL_BF16);
                    expect_equal("padding", got, D0);
                    cudaCheck(cudaFree(dA)); cudaCheck(cudaFree(dB));
                }
            }
}

TEST_CASE("matmul wrapper on a created stream: the twin's GEMM runs when the stream is waited for, as a kernel's (simt.h)") {
    int m = 6, n = 5, k = 4;
    std::vector<float> A = bf16_round(randn((size_t)m * k, 71)), B = bf16_round(randn((size_t)k * n, 72)), D0((size_t)m * n, -1.0f);
    std::vector<double> want = naive_gemm(false, false, m, n, k, 1.0f, A, m, 0, B, k, 0, 0.0f, D0, m, 0, 1);
    floatX *dA = dev_bf16(A), *dB = dev_bf16(B);
    float* dD = dev_copy(D0);
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    matmul_cublaslt(false, false, m, n, k, 1.0f, dA, CUDA_R_16BF, m, 0, dB, CUDA_R_16BF, k, 0, 0.0f, dD, CUDA_R_32F, m, 0, 1, nullptr, s,
                    __FILE__, __LINE__);
    cudaCheck(cudaEventRecord(e, s));
#if defined(SIMT_EMULATION)   // (the emulator's queue; a GPU's non-blocking stream may have run the GEMM already)
    expect_equal("D before the stream is waited for (queued: untouched)", get(dD, D0.size()), D0);
#endif
    cudaCheck(cudaStreamWaitEvent(0, e, 0));   // the null stream waits: the queued GEMM runs now
    std::vector<float> wantf(want.begin(), want.end());
    expect_close("D after the wait", get(dD, D0.size()), wantf, TOL_F32);
    cudaCheck(cudaEventDestroy(e)); cudaCheck(cudaStreamDestroy(s));
    cudaCheck(cudaFree(dA)); cudaCheck(cudaFree(dB)); cudaCheck(cudaFree(dD));
}

TEST_CASE("matmul wrapper: FP8 operands (E5M2 x E4M3, the weight gradients' pair) with scale pointers (the TN layout)") {
    // (no amax: cuBLASLt computes one for an FP8 D only, and the wrapper refuses it otherwise: test/test_fp8_cuda.cpp).
    // E5M2 x E4M3 into FP32 D is a pair the step uses (dev/bench/gpu_h100_2026-11-27b/gemm_sweep.txt). Each scale in its
    // own allocation: with the B scale 4 bytes after the A scale, in one allocation, an H100's cuBLASLt refused this
    // call NOT_SUPPORTED (dev/bench/results_gpu.md, 2026-11-28); the wrapper now refuses such a pointer itself
    const int m = 64, n = 48, k = 384;
    std::vector<float> A = randn((size_t)k * m, 301, 2.0), B = randn((size_t)k * n, 302, 2.0);
    std::vector<__nv_fp8_e5m2> A8(A.size());
    std::vector<__nv_fp8_e4m3> B8(B.size());
    for (size_t i = 0; i < A.size(); i++) { A8[i] = __nv_fp8_e5m2(A[i]); A[i] = (float)A8[i]; }
    for (size_t i = 0; i < B.size(); i++) { B8[i] = __nv_fp8_e4m3(B[i]); B[i] = (float)B8[i]; }
    float *dsa = dev_copy(std::vector<float>{0.5f}), *dsb = dev_copy(std::vector<float>{0.25f});
    __nv_fp8_e5m2* dA = dev_copy(A8);
    __nv_fp8_e4m3* dB = dev_copy(B8);
    float* dD = dev_poisoned<float>((size_t)m * n);
    MatmulOptions opt = {dsa, dsb, nullptr, nullptr, 0, MATMUL_SCALE_TENSOR, MATMUL_SCALE_TENSOR, nullptr, nullptr};
    matmul_cublaslt(true, false, m, n, k, 1.0f, dA, CUDA_R_8F_E5M2, k, 0, dB, CUDA_R_8F_E4M3, k, 0, 0.0f, dD, CUDA_R_32F, m, 0, 1,
                    &opt, 0, __FILE__, __LINE__);
    std::vector<double> want = naive_gemm(true, false, m, n, k, 0.125, A, k, 0, B, k, 0, 0.0, std::vector<float>((size_t)m * n, 0.0f), m, 0, 1);
    std::vector<float> wantf(want.begin(), want.end());
    expect_close("fp8 D", get(dD, (size_t)m * n), wantf, TOL_FP8_ACC);
    cudaCheck(cudaFree(dsa)); cudaCheck(cudaFree(dsb)); cudaCheck(cudaFree(dA)); cudaCheck(cudaFree(dB)); cudaCheck(cudaFree(dD));
}

TEST_CASE("matmul_forward_gpu / matmul_backward_gpu match the CPU matmul_forward / matmul_backward") {
    for (auto s : {std::vector<int>{1, 8, 16}, {37, 64, 24}, {130, 96, 200}}) {
        int N = s[0], C = s[1], OC = s[2];
        std::vector<float> inp = bf16_round(randn((size_t)N * C, N)), w = bf16_round(randn((size_t)OC * C, C, 0.1));
        std::vector<float> dout = bf16_round(randn((size_t)N * OC, OC));
        std::vector<float> out((size_t)N * OC), dinp = randn((size_t)N * C, 5), dw = randn((size_t)OC * C, 6);
        floatX *d_inp = dev_bf16(inp), *d_w = dev_bf16(w), *d_dout = dev_bf16(dout), *d_out = dev_poisoned<floatX>(out.size());
        float *d_dinp = dev_copy(dinp), *d_dw = dev_copy(dw);
        matmul_forward(out.data(), inp.data(), w.data(), N, C, OC);
        matmul_forward_gpu(d_out, d_inp, d_w, N, C, OC);
        expect_close("out", get_bf16(d_out, out.size()), out, TOL_BF16);
        matmul_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), N, C, OC);
        matmul_backward_gpu(d_dinp, d_dw, d_dout, d_inp, d_w, N, C, OC, 1.0f);
        expect_close("dinp", get(d_dinp, dinp.size()), dinp, TOL_F32);
        expect_close("dweight", get(d_dw, dw.size()), dw, TOL_F32);
        for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_dout, (void*)d_out, (void*)d_dinp, (void*)d_dw}) cudaCheck(cudaFree(p));
    }
}

TEST_CASE("embedding forward and deterministic backward") {
    // (400 tokens over 11 distinct: ~36 positions per token, the backward's eight-row loads and their remainder)
    for (auto s : {std::vector<int>{7, 33, 11}, {64, 128, 384}, {300, 130, 257}, {400, 64, 30}}) {
        int N = s[0], C = s[1], V = s[2];
        std::vector<int> tok = randint(N, V / 3 + 1, N);   // few distinct tokens: many repeats
        std::vector<float> wte = bf16_round(randn((size_t)V * C, V)), dout = randn((size_t)N * C, C);
        std::vector<float> dwte = randn((size_t)V * C, 3), out((size_t)N * C);
        int* d_tok = dev_copy(tok);
        floatX *d_wte = dev_bf16(wte), *d_out = dev_poisoned<floatX>(out.size());
        float *d_dout = dev_copy(dout), *d_dwte = dev_copy(dwte);
        embedding_forward(out.data(), tok.data(), wte.data(), N, C);
        embedding_forward_gpu(d_out, d_tok, d_wte, N, C);
        expect_equal("out", get_bf16(d_out, out.size()), out);
        EmbeddingPlan plan;
        embedding_plan_build(&plan, tok.data(), N, V);
        int *d_u = dev_copy(plan.unique), *d_o = dev_copy(plan.offsets), *d_p = dev_copy(plan.positions);
        embedding_backward(dwte.data(), dout.data(), tok.data(), N, C);
        embedding_backward_gpu(d_dwte, d_dout, d_u, d_o, d_p, (int)plan.unique.size(), C);
        expect_close("dwte", get(d_dwte, dwte.size()), dwte, TOL_F32);
        for (void* p : {(void*)d_tok, (void*)d_wte, (void*)d_out, (void*)d_dout, (void*)d_dwte, (void*)d_u, (void*)d_o, (void*)d_p})
            cudaCheck(cudaFree(p));
    }
}

// 80,000 distinct tokens of DBRX's 100,352-token vocabulary in one micro-batch (90,000 tokens, 10,000
// of them repeats): one block per distinct token is past gridDim.y's 65,535, the limit the kernel once
// hit; on gridDim.x it is not. A narrow C keeps it to seconds under the emulator.
TEST_CASE("embedding backward with more distinct tokens than gridDim.y allows (DBRX vocabulary)") {
    const int V = 100352, N = 90000, C = 8, distinct = 80000;
    std::vector<int> tok(N);
    for (int t = 0; t < N; t++) tok[t] = (int)((long long)(t % distinct) * 7919 % V);   // 7919 is prime to V = 2^11 7^2
    std::vector<float> dout = randn((size_t)N * C, 17), dwte = randn((size_t)V * C, 5);
    EmbeddingPlan plan;
    embedding_plan_build(&plan, tok.data(), N, V);
    REQUIRE(plan.unique.size() == (size_t)distinct);
    float *d_dout = dev_copy(dout), *d_dwte = dev_copy(dwte);
    int *d_u = dev_copy(plan.unique), *d_o = dev_copy(plan.offsets), *d_p = dev_copy(plan.positions);
    embedding_backward(dwte.data(), dout.data(), tok.data(), N, C);
    embedding_backward_gpu(d_dwte, d_dout, d_u, d_o, d_p, (int)plan.unique.size(), C);
    expect_close("dwte", get(d_dwte, dwte.size()), dwte, TOL_F32);
    for (void* p : {(void*)d_dout, (void*)d_dwte, (void*)d_u, (void*)d_o, (void*)d_p}) cudaCheck(cudaFree(p));
}

TEST_CASE("layernorm forward and backward") {
    // 300 x 6144: a DBRX-width slice, 16-byte accesses, 10 weight-gradient chunks in 2 column-sum groups; 531 x 257:
    // the scalar path over 3 groups, the last chunk and group partial
    for (auto s : {std::vector<int>{1, 32}, {7, 100}, {67, 128}, {130, 257}, {300, 6144}, {531, 257}}) {
        int N = s[0], C = s[1];
        std::vector<float> x = bf16_round(randn((size_t)N * C, N + C, 2.0)), w = bf16_round(randn(C, C));
        for (size_t i = 0; i < x.size(); i++) x[i] += (float)(i % C) * 0.01f;   // a non-zero mean
        x = bf16_round(x);
        std::vector<float> out((size_t)N * C), mean(N), rstd(N);
        layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
        floatX *d_x = dev_bf16(x), *d_w = dev_bf16(w), *d_out = dev_poisoned<floatX>(out.size());
        float *d_mean = dev_poisoned<float>(N), *d_rstd = dev_poisoned<float>(N);
        layernorm_forward_gpu(d_out, d_mean, d_rstd, d_x, d_w, N, C, 1e-5f);
        expect_close("out", get_bf16(d_out, out.size()), out, TOL_BF16);
        expect_close("mean", get(d_mean, N), mean, TOL_F32);
        expect_close("rstd", get(d_rstd, N), rstd, TOL_F32);

        std::vector<float> dout = randn((size_t)N * C, 9), dinp = randn((size_t)N * C, 10), dw = randn(C, 11);
        float *d_dout = dev_copy(dout), *d_dinp = dev_copy(dinp), *d_dw = dev_copy(dw);
        float* d_scratch = dev_poisoned<float>(layernorm_backward_scratch(N, C));
        floatX* d_dinp16 = dev_poisoned<floatX>(dinp.size());
        layernorm_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
        layernorm_backward_gpu(d_dinp, d_dinp16, d_dw, d_scratch, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
        expect_close("dinp", get(d_dinp, dinp.size()), dinp, TOL_F32);
        expect_close("dinp bf16 copy", get_bf16(d_dinp16, dinp.size()), dinp, TOL_BF16);
        expect_close("dweight", get(d_dw, C), dw, TOL_F32);
        for (void* p : {(void*)d_x, (void*)d_w, (void*)d_out, (void*)d_mean, (void*)d_rstd, (void*)d_dout, (void*)d_dinp,
                        (void*)d_dw, (void*)d_scratch, (void*)d_dinp16})
            cudaCheck(cudaFree(p));
    }
}

TEST_CASE("residual add fused into the layernorm after it") {
    // 16-byte rows (C % 8 == 0) and the scalar fallback; the residual sum is rounded to BF16 before the
    // norm reads it, as the CPU reference's BF16 activations are
    for (auto s : {std::vector<int>{1, 64}, {9, 104}, {33, 128}, {5, 100}, {3, 257}}) {
        int N = s[0], C = s[1];
        size_t n = (size_t)N * C;
        std::vector<float> x = bf16_round(randn(n, N + C, 2.0)), y = bf16_round(randn(n, N + C + 1)), w = bf16_round(randn(C, C + 2));
        std::vector<float> resid(n), out(n), mean(N), rstd(N);
        residual_forward(resid.data(), x.data(), y.data(), n);
        resid = bf16_round(resid);
        layernorm_forward(out.data(), mean.data(), rstd.data(), resid.data(), w.data(), N, C, 1e-5f);
        floatX *dx = dev_bf16(x), *dy = dev_bf16(y), *dw = dev_bf16(w), *dres = dev_poisoned<floatX>(n), *dout = dev_poisoned<floatX>(n);
        float *dmean = dev_poisoned<float>(N), *drstd = dev_poisoned<float>(N);
        residual_layernorm_forward_gpu(dout, dres, dmean, drstd, dx, dy, dw, N, C, 1e-5f);
        std::vector<float> got_res = get_bf16(dres, n);
        CHECK_MESSAGE(got_res == resid, "the residual sum differs from bf16(x + y)");
        expect_close("out", get_bf16(dout, n), out, TOL_BF16);
        expect_close("mean", get(dmean, N), mean, TOL_F32);
        expect_close("rstd", get(drstd, N), rstd, TOL_F32);
        for (void* p : {(void*)dx, (void*)dy, (void*)dw, (void*)dres, (void*)dout, (void*)dmean, (void*)drstd}) cudaCheck(cudaFree(p));
    }
}

// head_dim 16, 32 and 128 move 8 pairs a thread (16-byte accesses), 8 and 24 one
TEST_CASE("clip_qkv + RoPE, fused, forward and backward") {
    for (auto s : {std::vector<int>{1, 5, 2, 1, 8}, {2, 37, 4, 2, 16}, {2, 64, 4, 2, 32}, {1, 9, 8, 2, 128}, {1, 7, 2, 1, 24}})
        for (float clip : {0.5f, DBRX_OFF, 0.0f}) {   // a clamp, none (HF null), and a clamp to +-0 (the op's, as the original's)
            int B = s[0], T = s[1], H = s[2], KV = s[3], hd = s[4], qd = (H + 2 * KV) * hd;
            size_t n = (size_t)B * T * qd;
            std::vector<float> pre = bf16_round(randn(n, T + hd, 0.6)), cos_t((size_t)T * hd / 2), sin_t((size_t)T * hd / 2);
            rope_tables(cos_t.data(), sin_t.data(), T, hd, 10000.0f);
            std::vector<float> qkv(n);
            clip_forward(qkv.data(), pre.data(), n, clip);
            rope_forward(qkv.data(), cos_t.data(), sin_t.data(), B, T, H, KV, hd);
            floatX *d_pre = dev_bf16(pre), *d_qkv = dev_poisoned<floatX>(n);
            float *d_cos = dev_copy(cos_t), *d_sin = dev_copy(sin_t);
            clip_rope_forward_gpu(d_qkv, d_pre, d_cos, d_sin, B, T, H, KV, hd, clip);
            expect_close("qkv", get_bf16(d_qkv, n), qkv, TOL_BF16);
            std::vector<float> dq = bf16_round(randn(n, 5));
            floatX* d_dq = dev_bf16(dq);
            rope_backward(dq.data(), cos_t.data(), sin_t.data(), B, T, H, KV, hd);
            clip_backward(dq.data(), pre.data(), n, clip);
            clip_rope_backward_gpu(d_dq, d_pre, d_cos, d_sin, B, T, H, KV, hd, clip);
            expect_close("dqkv", get_bf16(d_dq, n), dq, TOL_BF16);
            for (void* p : {(void*)d_pre, (void*)d_qkv, (void*)d_cos, (void*)d_sin, (void*)d_dq}) cudaCheck(cudaFree(p));
        }
}

// head_dim 32, 64 and 128 run the flash kernels (tensor cores), the others the warp-per-row kernels
TEST_CASE("causal GQA attention forward (output, logsumexp) and backward") {
    for (auto s : {std::vector<int>{1, 1, 1, 1, 2}, {2, 13, 4, 2, 8}, {1, 70, 4, 4, 40}, {2, 64, 4, 2, 32}, {1, 33, 8, 2, 64},
                   {1, 1, 4, 2, 128}, {2, 17, 4, 2, 128}, {1, 129, 8, 1, 128}, {1, 256, 4, 2, 128}, {1, 100, 8, 1, 64},
                   {1, 70, 4, 4, 64}}) {
        int B = s[0], T = s[1], H = s[2], KV = s[3], hd = s[4], qd = (H + 2 * KV) * hd, C = H * hd;
        std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, T * hd, 1.5));
        std::vector<float> out((size_t)B * T * C), lse((size_t)B * H * T);
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
        floatX *d_qkv = dev_bf16(qkv), *d_out = dev_poisoned<floatX>(out.size());
        float* d_lse = dev_poisoned<float>(lse.size());
        attention_forward_gpu(d_out, d_lse, d_qkv, B, T, H, KV, hd);
        INFO("B " << B << " T " << T << " H " << H << " KV " << KV << " hd " << hd << (flash_attention_supported(hd) ? " (flash)" : ""));
        expect_close("out", get_bf16(d_out, out.size()), out, TOL_BF16);
        expect_close("lse", get(d_lse, lse.size()), lse, TOL_F32);
        // backward: the CPU reference from the same qkv, its own lse, and the same dout
        std::vector<float> dout = bf16_round(randn(out.size(), 17)), dqkv(qkv.size());
        attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd);
        floatX *d_dout = dev_bf16(dout), *d_dqkv = dev_poisoned<floatX>(qkv.size());
        float* d_D = dev_poisoned<float>(attention_backward_scratch_floats(B, T, H, hd));
        attention_backward_gpu(d_dqkv, d_D, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd);
        expect_close("dqkv", get_bf16(d_dqkv, dqkv.size()), dqkv, TOL_BF16);
        for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse, (void*)d_dout, (void*)d_dqkv, (void*)d_D}) cudaCheck(cudaFree(p));
    }
}

// the attention backward through the model's dispatch under the first `variants` of --attention-bwd mma (the pair), wgmma,
// wgmma-overlap (0, 1, 2), each against the CPU's dqkv and, emulated, the pair's bits (the same k-order sums)
static void attention_backward_variants_check(const std::vector<float>& dqkv, const floatX* d_dout, const floatX* d_out, const float* d_lse,
                                              const floatX* d_qkv, int B, int T, int H, int KV, int hd, int variants, DocMask doc = {}) {
    std::vector<float> got[3];
    for (int v = 0; v < variants; v++) {
        floatX* d_dqkv = dev_poisoned<floatX>(dqkv.size());
        float* d_D = dev_poisoned<float>(attention_backward_scratch_floats(B, T, H, hd));
        g_attention_bwd = v;
        attention_backward_gpu(d_dqkv, d_D, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd, 0, doc);
        g_attention_bwd = 0;
        got[v] = get_bf16(d_dqkv, dqkv.size());
        INFO("--attention-bwd " << (v == 0 ? "mma" : v == 1 ? "wgmma" : "wgmma-overlap"));
        expect_close("dqkv", got[v], dqkv, TOL_BF16);
#if defined(SIMT_EMULATION)
        if (v) CHECK_MESSAGE(memcmp(got[v].data(), got[0].data(), got[0].size() * sizeof(float)) == 0, "dqkv differs from the pair's");
#endif
        for (void* p : {(void*)d_dqkv, (void*)d_D}) cudaCheck(cudaFree(p));
    }
}

// --attention-bwd wgmma, wgmma-overlap (model/attention_wgmma_bwd.cuh) through the model's dispatch: against the CPU reference
// and, emulated, the mma.sync pair's bits (the same k-order sums and elementwise arithmetic); head_dim 128 (B 2, T short of
// a tile, GQA 6:1; T 192: three key tiles, v4's buffer rotation) and 64 (T 130, 2 kv heads)
TEST_CASE("wgmma attention backward (--attention-bwd wgmma, wgmma-overlap): the CPU reference, the pair's bits") {
    for (auto s : {std::vector<int>{2, 77, 6, 1, 128}, {1, 192, 2, 1, 128}, {1, 130, 4, 2, 64}}) {
        int B = s[0], T = s[1], H = s[2], KV = s[3], hd = s[4], qd = (H + 2 * KV) * hd, C = H * hd;
        INFO("B " << B << " T " << T << " H " << H << " KV " << KV << " hd " << hd);
        std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, T + hd, 1.5)), dout = bf16_round(randn((size_t)B * T * C, 31));
        std::vector<float> out((size_t)B * T * C), lse((size_t)B * H * T), dqkv(qkv.size());
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd);
        floatX *d_qkv = dev_bf16(qkv), *d_out = dev_poisoned<floatX>(out.size()), *d_dout = dev_bf16(dout);
        float* d_lse = dev_poisoned<float>(lse.size());
        attention_forward_gpu(d_out, d_lse, d_qkv, B, T, H, KV, hd);
        attention_backward_variants_check(dqkv, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd, 3);
        for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse, (void*)d_dout}) cudaCheck(cudaFree(p));
    }
}

// --doc-mask (model/attention.cuh): attention inside each document of a packed sequence, on every GPU path (head_dim 16: the
// warp-per-row kernels; 32: the mma.sync flash forward and pair; 64 and 128: the wgmma forward, and the backward's pair,
// wgmma and wgmma-overlap, the latter two the pair's bits under the emulator) against the CPU reference. Documents open at an
// end-of-text: at 0, one of a single token, runs across 64-key and 128-row tiles, a sequence whose first document began
// before it. The CPU reference itself: each document's rows equal the causal attention of that document alone, bit for bit,
// and differ from the unmasked attention (the mask is not a no-op). A micro-batch with no end-of-text gives the unmasked
// kernels' bits.
TEST_CASE("document-masked attention (--doc-mask): every GPU path, the CPU reference against each document alone") {
    const int EOT = 7;
#if defined(SIMT_RACE_DETECT)   // (the race detector's build: fewer heads and sequences, the same tiles and documents)
    const std::vector<std::vector<int>> shapes = {{1, 200, 2, 1, 128}, {1, 130, 2, 1, 64}, {1, 100, 2, 1, 32}, {1, 40, 2, 1, 16}};
#else
    // (T 520: blocks whose first key tile is 2, 4 and 8, the last of them its only tile: the 3-buffer kernels' every slot)
    const std::vector<std::vector<int>> shapes = {{2, 200, 6, 1, 128}, {1, 520, 2, 1, 128}, {1, 130, 4, 2, 64}, {2, 100, 4, 2, 32},
                                                  {2, 40, 2, 1, 16}};
#endif
    for (const std::vector<int>& s : shapes) {
        int B = s[0], T = s[1], H = s[2], KV = s[3], hd = s[4], qd = (H + 2 * KV) * hd, C = H * hd;
        INFO("B " << B << " T " << T << " H " << H << " KV " << KV << " hd " << hd);
        std::vector<int> inputs((size_t)B * T, 1), bounds(2 * (size_t)B * T);
        for (int t : {0, 5, 6, 64, 66, 129, 130, 300, 400, 512, T - 1}) if (t < T) inputs[t] = EOT;   // sequence 0
        for (int t : {37, 128}) if (B > 1 && t < T) inputs[(size_t)T + t] = EOT;    // sequence 1: its first document began before it
        doc_bounds(bounds.data(), bounds.data() + B * T, inputs.data(), B, T, EOT);
        DocMask doc = {bounds.data(), bounds.data() + B * T};
        long long seen = 0;   // (MFU's share, doc_attended_share: the pairs the mask keeps, counted one by one from the ends)
        for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int t2 = 0; t2 <= t; t2++) seen += t < bounds[(size_t)B * T + (size_t)b * T + t2];
        CHECK(doc_attended_share(inputs.data(), B, T, EOT) == doctest::Approx(seen / ((double)B * T * (T + 1) / 2)).epsilon(1e-12));
        std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, 3 * T + hd, 1.5)), dout = bf16_round(randn((size_t)B * T * C, 41));
        std::vector<float> out((size_t)B * T * C), lse((size_t)B * H * T), dqkv(qkv.size()), causal((size_t)B * T * C), clse(lse.size());
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd, doc);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd, doc);
        attention_forward(causal.data(), clse.data(), qkv.data(), B, T, H, KV, hd);
        double moved = 0;
        for (size_t i = 0; i < out.size(); i++) moved = std::max(moved, (double)std::fabs(out[i] - causal[i]));
        CHECK_MESSAGE(moved > 0.1, "the document mask changed the output by only " << moved);
        for (int b = 0; b < B; b++)   // every document alone: its rows' causal attention, the same bits
            for (int t0 = 0; t0 < T;) {
                const int t1 = bounds[(size_t)B * T + (size_t)b * T + t0], n = t1 - t0;
                std::vector<float> part(qkv.begin() + ((size_t)b * T + t0) * qd, qkv.begin() + ((size_t)b * T + t1) * qd);
                std::vector<float> po((size_t)n * C), pl((size_t)H * n);
                attention_forward(po.data(), pl.data(), part.data(), 1, n, H, KV, hd);
                CHECK_MESSAGE(memcmp(po.data(), out.data() + ((size_t)b * T + t0) * C, po.size() * sizeof(float)) == 0,
                              "sequence " << b << ": the document at " << t0 << " differs from its attention alone");
                t0 = t1;
            }
        floatX *d_qkv = dev_bf16(qkv), *d_out = dev_poisoned<floatX>(out.size()), *d_dout = dev_bf16(dout);
        float* d_lse = dev_poisoned<float>(lse.size());
        int* d_bounds = dev_copy(bounds);
        DocMask d_doc = {d_bounds, d_bounds + B * T};
        attention_forward_gpu(d_out, d_lse, d_qkv, B, T, H, KV, hd, 0, d_doc);
        expect_close("out", get_bf16(d_out, out.size()), out, TOL_BF16);
        expect_close("lse", get(d_lse, lse.size()), lse, TOL_F32);
        attention_backward_variants_check(dqkv, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd, hd >= 64 ? 3 : 1, d_doc);
        // no end-of-text in the micro-batch: every document the whole sequence, the unmasked kernels' bits
        std::vector<int> none(2 * (size_t)B * T);
        doc_bounds(none.data(), none.data() + B * T, std::vector<int>((size_t)B * T, 1).data(), B, T, EOT);
        int* d_none = dev_copy(none);
        std::vector<float> bits[2][2];
        for (int masked = 0; masked < 2; masked++) {
            DocMask dm = masked ? DocMask{d_none, d_none + B * T} : DocMask{};
            floatX *o2 = dev_poisoned<floatX>(out.size()), *dq2 = dev_poisoned<floatX>(qkv.size());
            float *l2 = dev_poisoned<float>(lse.size()), *D2 = dev_poisoned<float>(attention_backward_scratch_floats(B, T, H, hd));
            g_attention_bwd = hd >= 64 ? 2 : 0;
            attention_forward_gpu(o2, l2, d_qkv, B, T, H, KV, hd, 0, dm);
            attention_backward_gpu(dq2, D2, d_dout, o2, l2, d_qkv, B, T, H, KV, hd, 0, dm);
            g_attention_bwd = 0;
            bits[masked][0] = get_bf16(o2, out.size());
            bits[masked][1] = get_bf16(dq2, qkv.size());
            for (void* p : {(void*)o2, (void*)dq2, (void*)l2, (void*)D2}) cudaCheck(cudaFree(p));
        }
        for (int i = 0; i < 2; i++)
            CHECK_MESSAGE(memcmp(bits[0][i].data(), bits[1][i].data(), bits[0][i].size() * sizeof(float)) == 0,
                          (i ? "dqkv" : "out") << ": one document per sequence differs from no mask");
        for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse, (void*)d_dout, (void*)d_bounds, (void*)d_none}) cudaCheck(cudaFree(p));
    }
}

// DBRX's attention shapes (head_dim 128): T 512, its 48:8 query/KV grouping (6 queries per KV head,
// not a power of two) at an odd T, the first and last query rows of T 2048 against the reference, and
// bit-identical results under two different thread schedules (and blocks on 1 and on 3 OS threads)
TEST_CASE("flash attention at DBRX's shapes: T 512, GQA 48:8, rows of T 2048, determinism") {
    for (auto s : {std::vector<int>{1, 512, 2, 1, 128}, {1, 37, 48, 8, 128}, {1, 2048, 1, 1, 128}}) {
        int B = s[0], T = s[1], H = s[2], KV = s[3], hd = s[4], qd = (H + 2 * KV) * hd, C = H * hd;
        INFO("B " << B << " T " << T << " H " << H << " KV " << KV << " hd " << hd);
        std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, T + H, 1.5));
        std::vector<float> dout = bf16_round(randn((size_t)B * T * C, 23));
        std::vector<float> first[3];
#if defined(SIMT_EMULATION)
        const bool was_random = simt::options().random;
        const uint64_t was_seed = simt::options().seed;
        const int was_threads = simt::options().os_threads;
#endif
        for (int run = 0; run < 2; run++) {
#if defined(SIMT_EMULATION)
            simt::set_schedule(true, 1000 + 77 * run);   // (on a GPU: two runs of the hardware's own schedule)
            // blocks one after another, then on 3 OS threads at once: the backward's key-tile blocks then really
            // wait for one another on their dQ semaphores (attention_flash_bwd5.cuh)
            simt::set_os_threads(run == 0 ? 1 : 3);
#endif
            floatX *d_qkv = dev_bf16(qkv), *d_out = dev_poisoned<floatX>((size_t)B * T * C), *d_dout = dev_bf16(dout);
            float *d_lse = dev_poisoned<float>((size_t)B * H * T), *d_D = dev_poisoned<float>(attention_backward_scratch_floats(B, T, H, hd));
            floatX* d_dqkv = dev_poisoned<floatX>(qkv.size());
            attention_forward_gpu(d_out, d_lse, d_qkv, B, T, H, KV, hd);
            attention_backward_gpu(d_dqkv, d_D, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd);
            std::vector<float> got[3] = {get_bf16(d_out, (size_t)B * T * C), get(d_lse, (size_t)B * H * T), get_bf16(d_dqkv, qkv.size())};
            if (run == 0) {
                if (T <= 512) {   // the whole reference
                    std::vector<float> out((size_t)B * T * C), lse((size_t)B * H * T), dqkv(qkv.size());
                    attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
                    attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd);
                    expect_close("out", got[0], out, TOL_BF16);
                    expect_close("lse", got[1], lse, TOL_F32);
                    expect_close("dqkv", got[2], dqkv, TOL_BF16);
                } else {          // T 2048: the reference forward of the first and last 8 query rows (causal: row t sees 0..t)
                    for (int t0 : {0, T - 8}) {
                        int Tp = t0 + 8;   // the prefix up to the last row checked is its own causal problem
                        std::vector<float> pre(qkv.begin(), qkv.begin() + (size_t)Tp * qd), out((size_t)Tp * C), lse((size_t)H * Tp);
                        attention_forward(out.data(), lse.data(), pre.data(), 1, Tp, H, KV, hd);
                        std::vector<float> go(got[0].begin() + (size_t)t0 * C, got[0].begin() + (size_t)Tp * C);
                        std::vector<float> wo(out.begin() + (size_t)t0 * C, out.end());
                        expect_close("out rows", go, wo, TOL_BF16);
                        std::vector<float> gl(got[1].begin() + t0, got[1].begin() + Tp), wl(lse.begin() + t0, lse.end());
                        expect_close("lse rows", gl, wl, TOL_F32);
                    }
                }
                for (int i = 0; i < 3; i++) first[i] = got[i];
            } else {
                for (int i = 0; i < 3; i++)
                    CHECK_MESSAGE(memcmp(first[i].data(), got[i].data(), got[i].size() * sizeof(float)) == 0,
                                  "output " << i << " (out, lse, dqkv) differs between two thread schedules");
            }
            for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse, (void*)d_dout, (void*)d_dqkv, (void*)d_D}) cudaCheck(cudaFree(p));
        }
#if defined(SIMT_EMULATION)
        simt::set_schedule(was_random, was_seed);
        simt::set_os_threads(was_threads);
#endif
    }
}

// context parallelism's chunk pairs on the flash kernels (model/attention_cp_cuda.cuh): a sequence of T split over n CP
// ranks with the causal balancing (rank r holds chunks r and 2n-1-r of c = T/2n rows), each rank's queries against every
// rank's K|V block, merged by the online softmax; against the full-sequence CPU reference (out, lse, dq, and dK|dV summed
// over the ranks). Bit-identical under two thread schedules. Negative controls: the pairs of another rank (a wrong
// offset), the backward with a wrong lse, both out of tolerance.
static double cp_worst_excess(const std::vector<float>& got, const std::vector<float>& want, Tol tol) {
    double maxw = 0, worst = 0;
    for (float w : want) maxw = std::max(maxw, (double)std::fabs(w));
    for (size_t i = 0; i < got.size(); i++) {
        double err = std::fabs((double)got[i] - want[i]), lim = tol.rtol * std::fabs(want[i]) + tol.atol * maxw + 1e-30;
        worst = std::max(worst, std::isnan(err) ? 1e30 : err / lim);
    }
    return worst;
}
// s = {B, T, H, KV, hd, n}; controls: the determinism check and the negative controls too; doc: --doc-mask's documents (an
// end-of-text at 0, 5, 6, c + 3, T / 2 and T - 2 of sequence 0, at c + 1 of sequence 1: some pairs see none of a row's
// document) against the full-sequence reference with the mask, each rank's rows given their documents' global starts
static void cp_pairs_check(const std::vector<int>& s, bool controls, bool doc = false) {
    {
        int B = s[0], T = s[1], H = s[2], KV = s[3], hd = s[4], n = s[5], qd = (H + 2 * KV) * hd, C = H * hd, kvw = 2 * KV * hd;
        int Tl = T / n, c = Tl / 2;
        INFO("B " << B << " T " << T << " H " << H << " KV " << KV << " hd " << hd << " CP " << n << (doc ? " --doc-mask" : ""));
        std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, T + H + n, 1.5)), dout = bf16_round(randn((size_t)B * T * C, 29));
        std::vector<float> out((size_t)B * T * C), lse((size_t)B * H * T), dqkv(qkv.size());
        std::vector<int> inputs((size_t)B * T, 1), bounds(2 * (size_t)B * T);
        for (int t : {0, 5, 6, c + 3, T / 2, T - 2}) inputs[t] = 9;
        if (B > 1) inputs[(size_t)T + c + 1] = 9;
        doc_bounds(bounds.data(), bounds.data() + (size_t)B * T, inputs.data(), B, T, 9);
        DocMask dm = doc ? DocMask{bounds.data(), bounds.data() + (size_t)B * T} : DocMask{};
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd, dm);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd, dm);
        auto pos = [&](int r, int t) { return (t < c ? r : 2 * n - 1 - r) * c + t % c; };   // global position of rank r's row t
        std::vector<int*> d_qstart(n, nullptr);   // (doc) each rank's rows' document starts
        for (int r = 0; r < n && doc; r++) {
            std::vector<int> qs((size_t)B * Tl);
            for (int b = 0; b < B; b++) for (int t = 0; t < Tl; t++) qs[(size_t)b * Tl + t] = bounds[(size_t)b * T + pos(r, t)];
            d_qstart[r] = dev_copy(qs);
        }
        // every rank's rows of qkv and dout; kv_all (n, B, Tl, 2 kv hd)
        std::vector<std::vector<float>> lq(n), ld(n);
        std::vector<float> kv_all((size_t)n * B * Tl * kvw);
        for (int r = 0; r < n; r++) {
            lq[r].resize((size_t)B * Tl * qd); ld[r].resize((size_t)B * Tl * C);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tl; t++) {
                    size_t g = (size_t)b * T + pos(r, t), l = (size_t)b * Tl + t;
                    std::copy(qkv.begin() + g * qd, qkv.begin() + (g + 1) * qd, lq[r].begin() + l * qd);
                    std::copy(dout.begin() + g * C, dout.begin() + (g + 1) * C, ld[r].begin() + l * C);
                    std::copy(qkv.begin() + g * qd + C, qkv.begin() + (g + 1) * qd, kv_all.begin() + ((size_t)r * B * Tl + l) * kvw);
                }
        }
        floatX* d_kv = dev_bf16(kv_all);
        CpAttnScratch sc;
        size_t rows = (size_t)B * Tl * H;
        sc.out_p = dev_poisoned<floatX>(rows * hd); sc.o32 = dev_poisoned<float>(rows * hd); sc.dq_acc = dev_poisoned<float>(rows * hd);
        sc.lse_p = dev_poisoned<float>(rows); sc.D = dev_poisoned<float>(rows); sc.dq_sem = dev_poisoned<int>(flash_bwd5_sem_ints(B, Tl, H));
        float* d_dkv = dev_poisoned<float>(kv_all.size());
        // one rank's forward and backward (pairs of rank `as`; lse shifted by dl before the backward): out, lse, dq, dkv_all
        auto run = [&](int r, int as, float dl) {
            floatX *d_qkv = dev_bf16(lq[r]), *d_dout = dev_bf16(ld[r]), *d_out = dev_poisoned<floatX>((size_t)B * Tl * C);
            floatX* d_dqkv = dev_poisoned<floatX>(lq[r].size());
            float* d_lse = dev_poisoned<float>(rows);
            cp_attention_forward_gpu(d_out, d_lse, d_qkv, d_kv, &sc, B, Tl, H, KV, hd, n, as, 0, d_qstart[as]);
            std::vector<float> o = get_bf16(d_out, (size_t)B * Tl * C), l = get(d_lse, rows);
            if (dl != 0) { std::vector<float> l2 = l; for (float& x : l2) x += dl; cudaCheck(cudaMemcpy(d_lse, l2.data(), rows * 4, cudaMemcpyHostToDevice)); }
            cp_attention_backward_gpu(d_dqkv, d_dkv, d_dout, d_out, d_lse, d_qkv, d_kv, &sc, B, Tl, H, KV, hd, n, as, 0, d_qstart[as]);
            std::vector<float> dq = get_bf16(d_dqkv, lq[r].size()), dkv = get(d_dkv, kv_all.size());
            for (void* p : {(void*)d_qkv, (void*)d_dout, (void*)d_out, (void*)d_dqkv, (void*)d_lse}) cudaCheck(cudaFree(p));
            return std::vector<std::vector<float>>{o, l, dq, dkv};
        };
        // the reference's rows of rank r: out, lse, dq (Q columns), and dK|dV of the rank's rows
        auto want = [&](int r) {
            std::vector<std::vector<float>> w(4);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tl; t++) {
                    size_t g = (size_t)b * T + pos(r, t);
                    w[0].insert(w[0].end(), out.begin() + g * C, out.begin() + (g + 1) * C);
                    w[2].insert(w[2].end(), dqkv.begin() + g * qd, dqkv.begin() + g * qd + C);
                    w[3].insert(w[3].end(), dqkv.begin() + g * qd + C, dqkv.begin() + (g + 1) * qd);
                }
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++)
                    for (int t = 0; t < Tl; t++) w[1].push_back(lse[((size_t)b * H + h) * T + pos(r, t)]);
            return w;
        };
        std::vector<float> dkv_sum(kv_all.size(), 0.0f);   // dK|dV of every rank's rows, summed over the ranks' pairs
        std::vector<std::vector<float>> first;
        for (int r = 0; r < n; r++) {
            std::vector<std::vector<float>> got = run(r, r, 0.0f), w = want(r);
            expect_close("out", got[0], w[0], TOL_BF16);
            expect_close("lse", got[1], w[1], TOL_F32);
            std::vector<float> dq;
            for (size_t i = 0; i < (size_t)B * Tl; i++) dq.insert(dq.end(), got[2].begin() + i * qd, got[2].begin() + i * qd + C);
            expect_close("dq", dq, w[2], TOL_BF16);
            for (size_t i = 0; i < dkv_sum.size(); i++) dkv_sum[i] += got[3][i];
            if (r == n - 1) first = got;
        }
        for (int r = 0; r < n; r++) {
            std::vector<float> g(dkv_sum.begin() + (size_t)r * B * Tl * kvw, dkv_sum.begin() + (size_t)(r + 1) * B * Tl * kvw);
            expect_close("dK|dV summed over the ranks", bf16_round(g), want(r)[3], TOL_BF16);
        }
        if (controls) {
#if defined(SIMT_EMULATION)   // the last rank again under another schedule, blocks on 3 OS threads: the same bits
            const bool was_random = simt::options().random;
            const uint64_t was_seed = simt::options().seed;
            const int was_threads = simt::options().os_threads;
            simt::set_schedule(true, 4242);
            simt::set_os_threads(3);
#endif
            std::vector<std::vector<float>> again = run(n - 1, n - 1, 0.0f);
#if defined(SIMT_EMULATION)
            simt::set_schedule(was_random, was_seed);
            simt::set_os_threads(was_threads);
#endif
            for (int i = 0; i < 4; i++)
                CHECK_MESSAGE(memcmp(first[i].data(), again[i].data(), again[i].size() * sizeof(float)) == 0,
                              "output " << i << " (out, lse, dq, dkv) differs between two thread schedules");
            // negative controls: rank 1's data through rank 0's pairs (a wrong offset); a wrong lse in the backward
            std::vector<std::vector<float>> wo = run(1, 0, 0.0f), wl = run(1, 1, 0.25f), w = want(1);
            CHECK_MESSAGE(cp_worst_excess(wo[0], w[0], TOL_BF16) > 1.0, "a wrong offset still passes");
            std::vector<float> dq;
            for (size_t i = 0; i < (size_t)B * Tl; i++) dq.insert(dq.end(), wl[2].begin() + i * qd, wl[2].begin() + i * qd + C);
            CHECK_MESSAGE(cp_worst_excess(dq, w[2], TOL_BF16) > 1.0, "a wrong lse still passes");
        }
        for (void* p : {(void*)d_kv, (void*)d_dkv, (void*)sc.out_p, (void*)sc.o32, (void*)sc.dq_acc, (void*)sc.lse_p, (void*)sc.D, (void*)sc.dq_sem})
            cudaCheck(cudaFree(p));
        for (int* p : d_qstart) if (p) cudaCheck(cudaFree(p));
    }
}
// (the race detector runs this one, test_race: every kernel of the CP path at small sizes; the next one only here)
TEST_CASE("context parallelism: flash chunk pairs small (head_dim 128 at CP 2; head_dim 32 at CP 4; both with --doc-mask)") {
    cp_pairs_check({1, 128, 4, 2, 128, 2}, false);
    cp_pairs_check({2, 96, 4, 2, 32, 4}, false);
    cp_pairs_check({2, 128, 4, 2, 128, 2}, false, true);
    cp_pairs_check({2, 96, 4, 2, 32, 4}, false, true);
}
TEST_CASE("context parallelism: flash chunk pairs at DBRX's head_dim (GQA 12:2 at CP 4; 4:2 at CP 2 and 4 up to T 1024; controls)") {
    cp_pairs_check({2, 256, 12, 2, 128, 4}, true);
    cp_pairs_check({1, 256, 4, 2, 128, 2}, false);
    cp_pairs_check({1, 1024, 4, 2, 128, 4}, false);
}

TEST_CASE("router: softmax, top-k, renormalisation (L1, L2, none), histogram, LBL and z-loss, backward") {
    for (float norm_p : {1.0f, DBRX_OFF, 2.0f})
    // (E 256: the histogram's shared counters all used; E 300: past them, its global atomics)
    for (auto s : {std::vector<int>{1, 4, 1, 0}, {37, 16, 4, 0}, {130, 8, 2, 0}, {300, 16, 4, 0}, {65, 16, 4, 1}, {90, 256, 3, 0},
                   {70, 300, 2, 0}}) {
        int N = s[0], E = s[1], k = s[2], L = 3, ties = s[3];
        std::vector<float> logits = randn((size_t)N * E, N * E, 1.5);
        if (ties) for (float& z : logits) z = std::floor(z);   // many equal probabilities: ties to the lower index
        std::vector<float> probs((size_t)N * E), lse(N), w((size_t)N * k);
        std::vector<int> idx((size_t)N * k), counts(E);
        router_forward(probs.data(), lse.data(), idx.data(), w.data(), counts.data(), logits.data(), N, E, k, norm_p);
        float *d_logits = dev_copy(logits), *d_probs = dev_poisoned<float>(probs.size()), *d_lse = dev_poisoned<float>(N);
        float *d_w = dev_poisoned<float>(w.size()), *d_stats = dev_poisoned<float>(E + 1);
        int *d_idx = dev_poisoned<int>(idx.size()), *d_counts = dev_poisoned<int>(E);
        router_forward_gpu(d_probs, d_lse, d_idx, d_w, d_counts, d_stats, d_logits, N, E, k, norm_p);
        INFO("N " << N << " E " << E << " k " << k << " moe_normalize_expert_weights " << dbrx_setting_str(norm_p));
        expect_close("probs", get(d_probs, probs.size()), probs, TOL_F32);
        expect_close("lse", get(d_lse, N), lse, TOL_F32);
        expect_equal("topk_idx", get(d_idx, idx.size()), idx);
        expect_close("topk_w", get(d_w, w.size()), w, TOL_F32);
        std::vector<int> hc = get(d_counts, E);
        expect_equal("counts", hc, counts);
        std::vector<float> stats = get(d_stats, E + 1);
        CHECK(lbl_from_stats(hc.data(), stats.data(), N, E, k, L, 0.05f) ==
              doctest::Approx(lbl_forward(probs.data(), counts.data(), N, E, k, L, 0.05f)).epsilon(1e-5));
        CHECK(zloss_from_stats(stats.data(), N, E, L, 0.01f) == doctest::Approx(zloss_forward(lse.data(), N, L, 0.01f)).epsilon(1e-5));
        std::vector<float> dw = randn(w.size(), 31), dlogits((size_t)N * E);
        float* d_dw = dev_copy(dw);
        floatX* d_dlogits = dev_poisoned<floatX>(dlogits.size());
        router_backward(dlogits.data(), dw.data(), probs.data(), lse.data(), idx.data(), w.data(), counts.data(), N, E, k, L,
                        0.05f, 0.01f, 0.5f, norm_p);
        router_backward_gpu(d_dlogits, d_dw, d_probs, d_lse, d_idx, d_w, d_counts, N, E, k, L, 0.05f, 0.01f, 0.5f, norm_p);
        expect_close("dlogits", get_bf16(d_dlogits, dlogits.size()), dlogits, TOL_BF16);
        for (void* p : {(void*)d_logits, (void*)d_probs, (void*)d_lse, (void*)d_w, (void*)d_stats, (void*)d_idx, (void*)d_counts,
                        (void*)d_dw, (void*)d_dlogits})
            cudaCheck(cudaFree(p));
    }
}

TEST_CASE("MoE dispatch (histogram, offsets, permutation), gather and its backward") {
    // 3000 x top-4 of 16: DBRX's experts, the permutation over 12 slices, experts 3 and 11 empty; 4099 x top-4: slices
    // of 1,025 assignments (the count before a slice ends in a part of an int4)
    // (40 x 16 x top-4 at DBRX's d 6144: the fused router gradient's wr rows at their production length)
    for (auto s : {std::vector<int>{1, 4, 1, 8}, {37, 16, 4, 24}, {300, 16, 4, 40}, {129, 5, 2, 33}, {3000, 16, 4, 8}, {4099, 16, 4, 8},
                   {40, 16, 4, 6144}}) {
        int N = s[0], E = s[1], k = s[2], C = s[3];
        // top-k indices: k distinct experts per token, skewed so that some experts get nothing
        std::vector<int> idx((size_t)N * k), counts(E, 0);
        Rng r = {(uint64_t)N * 13 + E};
        for (int t = 0; t < N; t++)
            for (int j = 0; j < k; j++) {
                int e;
                bool again;
                do {
                    e = (int)((rng_u64(&r) % (uint64_t)E) * (rng_u64(&r) % (uint64_t)E) / E);
                    again = N >= 3000 && (e == 3 || e == 11);
                    for (int i = 0; i < j; i++) again |= idx[t * k + i] == e;
                } while (again);
                idx[t * k + j] = e;
                counts[e]++;
            }
        std::vector<int> offsets(E + 1), row_token((size_t)N * k), slot_row((size_t)N * k);
        moe_dispatch(offsets.data(), row_token.data(), slot_row.data(), idx.data(), counts.data(), N, E, k);
        int *d_idx = dev_copy(idx), *d_counts = dev_copy(counts), *d_off = dev_poisoned<int>(E + 1);
        int *d_rt = dev_poisoned<int>(row_token.size()), *d_sr = dev_poisoned<int>(slot_row.size());
        std::vector<int> off_host(E + 1, -7);
        moe_dispatch_gpu(d_off, d_rt, d_sr, off_host.data(), d_idx, d_counts, N, E, k);
        INFO("N " << N << " E " << E << " k " << k);
        if (N >= 3000) CHECK((counts[3] == 0 && counts[11] == 0 && counts[0] > 2 * counts[15]));   // empty and uneven
        expect_equal("offsets", get(d_off, E + 1), offsets);
        expect_equal("offsets (host copy)", off_host, offsets);
        expect_equal("row_token", get(d_rt, row_token.size()), row_token);
        expect_equal("slot_row", get(d_sr, slot_row.size()), slot_row);
        if (N >= 3000) {   // top-k indices not 16-byte aligned: the count before a slice reads them one by one
            std::vector<int> idx1(idx.size() + 1, 0);
            std::copy(idx.begin(), idx.end(), idx1.begin() + 1);
            int* d_idx1 = dev_copy(idx1);
            moe_dispatch_gpu(d_off, d_rt, d_sr, off_host.data(), d_idx1 + 1, d_counts, N, E, k);
            expect_equal("row_token (indices 4 bytes off alignment)", get(d_rt, row_token.size()), row_token);
            expect_equal("slot_row (indices 4 bytes off alignment)", get(d_sr, slot_row.size()), slot_row);
            cudaCheck(cudaFree(d_idx1));
        }
        std::vector<float> x = bf16_round(randn((size_t)N * C, 4)), xe((size_t)N * k * C);
        moe_gather(xe.data(), x.data(), row_token.data(), N * k, C);
        floatX *d_x = dev_bf16(x), *d_xe = dev_poisoned<floatX>(xe.size());
        moe_gather_gpu(d_xe, d_x, d_rt, N * k, C);
        expect_equal("xe", get_bf16(d_xe, xe.size()), xe);
        // the routed rows' gradients are BF16, their sum per token fp32
        std::vector<float> dxe = bf16_round(randn(xe.size(), 8)), dx((size_t)N * C, 0.0f);
        moe_gather_backward(dx.data(), dxe.data(), slot_row.data(), N, k, C);
        floatX* d_dxe = dev_bf16(dxe);
        float* d_dx = dev_poisoned<float>(dx.size());
        moe_gather_backward_gpu(d_dx, d_dxe, d_sr, N, k, C);
        expect_close("dx", get(d_dx, dx.size()), dx, TOL_F32);
        // the training step's form: the router's input gradient dr wr in the same pass. Against the CPU's pair
        // (moe_gather_backward, then matmul_backward's dinp += dout weight) and, bit for bit, the GPU pair it replaced
        // (the gather, then cuBLASLt's dinp GEMM with beta 1) under the emulator
        std::vector<float> dr = bf16_round(randn((size_t)N * E, 11)), wr = bf16_round(randn((size_t)E * C, 12, 0.1)), dxr = dx;
        matmul_backward(dxr.data(), nullptr, dr.data(), nullptr, wr.data(), N, C, E);
        floatX *d_dr = dev_bf16(dr), *d_wr = dev_bf16(wr);
        float* d_dxr = dev_poisoned<float>(dx.size());
        moe_gather_router_backward_gpu(d_dxr, d_dxe, d_sr, d_dr, d_wr, N, k, C, E);
        std::vector<float> fused = get(d_dxr, dx.size());
        expect_close("dx + dr wr", fused, dxr, TOL_F32);
#if defined(SIMT_EMULATION)   // (the twin's GEMM sums in the kernel's order; cuBLASLt on a GPU does not: an H100 differed)
        matmul_backward_gpu(d_dx, (float*)nullptr, d_dr, (const floatX*)nullptr, d_wr, N, C, E, 1.0f);
        CHECK(memcmp(fused.data(), get(d_dx, dx.size()).data(), fused.size() * sizeof(float)) == 0);
#endif
        for (void* p : {(void*)d_idx, (void*)d_counts, (void*)d_off, (void*)d_rt, (void*)d_sr, (void*)d_x, (void*)d_xe, (void*)d_dxe,
                        (void*)d_dx, (void*)d_dr, (void*)d_wr, (void*)d_dxr})
            cudaCheck(cudaFree(p));
    }
}

TEST_CASE("SwiGLU forward and backward") {
    for (size_t n : {(size_t)1, (size_t)1000, (size_t)4099}) {
        std::vector<float> g = bf16_round(randn(n, n, 3.0)), u = bf16_round(randn(n, n + 1)), a(n);
        swiglu_forward(a.data(), g.data(), u.data(), n);
        floatX *d_g = dev_bf16(g), *d_u = dev_bf16(u), *d_a = dev_poisoned<floatX>(n);
        swiglu_forward_gpu(d_a, d_g, d_u, n);
        expect_close("a", get_bf16(d_a, n), a, TOL_BF16);
        std::vector<float> da = bf16_round(randn(n, 3)), dg(n), du(n);
        swiglu_backward(dg.data(), du.data(), da.data(), g.data(), u.data(), n);
        floatX *d_da = dev_bf16(da), *d_dg = dev_poisoned<floatX>(n), *d_du = dev_poisoned<floatX>(n);
        swiglu_backward_gpu(d_dg, d_du, d_da, d_g, d_u, n);
        expect_close("dg", get_bf16(d_dg, n), dg, TOL_BF16);
        expect_close("du", get_bf16(d_du, n), du, TOL_BF16);
        for (void* p : {(void*)d_g, (void*)d_u, (void*)d_a, (void*)d_da, (void*)d_dg, (void*)d_du}) cudaCheck(cudaFree(p));
    }
}

// --compress-acts (model/act_compress.cuh): the GPU's codes and factors are the CPU reference's bit for bit
// (the same quantisation of the same BF16 values), its rebuilt g and u the CPU's rebuilt values rounded to
// BF16, act within BF16 of SwiGLU on them; and the rebuild within E4M3's rounding of the original. Rows
// of R (> rows: the buffers' planned rows), F of DBRX (10752), of dbrx-1b (1792), with a partial tile, and odd (131: the
// kernels' scalar paths, which a model whose F is not a multiple of 8 takes).
TEST_CASE("compressed SwiGLU activations: E4M3 codes with 1x128 factors, and the rebuild of g, u, act") {
    struct Shape { int rows, R, F; };
    for (Shape sh : {Shape{1, 3, 10752}, Shape{37, 40, 1792}, Shape{130, 130, 200}, Shape{0, 4, 200}, Shape{9, 11, 131}}) {
        int rows = sh.rows, R = sh.R, F = sh.F;
        size_t n = (size_t)R * F, nf = (size_t)R * ((F + 127) / 128);
        std::vector<float> gu = randn(2 * n, (uint64_t)F + rows, 2.0);
        for (size_t i = 0; i < 2 * n; i += 97) gu[i] *= 40.0f;   // (outliers: each tile's own scale matters)
        for (int c = 0; c < F && rows > 0; c++) gu[c] = 0.0f;      // (an all-zero row of g: scale 1, codes 0)
        gu = bf16_round(gu);
        std::vector<uint8_t> q(2 * n, 0);
        std::vector<float> sinv(2 * nf, 0.0f);
        swiglu_compress(q.data(), sinv.data(), gu.data(), gu.data() + n, rows, R, F, COMPRESS_E4M3);
        floatX* d_gu = dev_bf16(gu);
        uint8_t* d_q = dev_copy(std::vector<uint8_t>(2 * n, 0));
        float* d_s = dev_copy(std::vector<float>(2 * nf, 0.0f));
        swiglu_compress_gpu(d_q, d_s, d_gu, d_gu + n, rows, R, F);
        expect_equal("codes", get(d_q, 2 * n), q);
        expect_equal("factors", get(d_s, 2 * nf), sinv);
        // the rebuild: the CPU's, then rounded to BF16 as the GPU stores g and u
        std::vector<float> g(n), u(n), act(n);
        swiglu_decompress(g.data(), u.data(), act.data(), q.data(), sinv.data(), rows, R, F, COMPRESS_E4M3);
        size_t m = (size_t)rows * F;
        std::vector<float> gb = bf16_round(std::vector<float>(g.begin(), g.begin() + m)),
                           ub = bf16_round(std::vector<float>(u.begin(), u.begin() + m)), ab(m);
        swiglu_forward(ab.data(), gb.data(), ub.data(), m);
        floatX *d_g = dev_poisoned<floatX>(n), *d_u = dev_poisoned<floatX>(n), *d_a = dev_poisoned<floatX>(n);
        swiglu_decompress_gpu(d_g, d_u, d_a, d_q, d_s, rows, R, F);
        expect_equal("g", get_bf16(d_g, m), gb);
        expect_equal("u", get_bf16(d_u, m), ub);
        expect_close("act", get_bf16(d_a, m), ab, TOL_BF16);
        // E4M3 keeps 3 mantissa bits: |err| <= 2^-4 |x| (normal codes) + half the subnormal step 2^-10 / s
        for (int t = 0; t < 2; t++)
            for (size_t i = 0; i < m; i++) {
                size_t r = i / F, tile = (i % F) / 128;
                float x = gu[t * n + i], y = t ? u[i] : g[i], f = sinv[t * nf + tile * rows + r];
                REQUIRE(std::fabs(y - x) <= std::ldexp(std::fabs(x), -4) + std::ldexp(f, -10));
            }
        for (void* p : {(void*)d_gu, (void*)d_q, (void*)d_s, (void*)d_g, (void*)d_u, (void*)d_a}) cudaCheck(cudaFree(p));
    }
    // the BF16 format (the CPU's): round to nearest even, the rebuild is the rounded value
    std::vector<float> x = randn(1000, 5), g(500), u(500), act(500), none;
    std::vector<uint8_t> q(2000 * 2);
    swiglu_compress(q.data(), nullptr, x.data(), x.data() + 500, 500, 500, 1, COMPRESS_BF16);
    swiglu_decompress(g.data(), u.data(), act.data(), q.data(), nullptr, 500, 500, 1, COMPRESS_BF16);
    std::vector<float> xb = bf16_round(x);
    CHECK(std::equal(g.begin(), g.end(), xb.begin()));
    CHECK(std::equal(u.begin(), u.end(), xb.begin() + 500));
}

// --compress-acts attn: one tensor (ln1 (N, d)) through the same compression kernel (its g half alone) and the
// plain rebuild: codes and factors the CPU's bit for bit, the rebuilt values the CPU's rounded to BF16 (d of DBRX,
// of dbrx-tiny, a partial tile and an odd width: the vector and the scalar paths)
TEST_CASE("compressed LayerNorm output: one tensor's E4M3 codes with 1x128 factors, and its rebuild") {
    for (auto sh : {std::pair<int, int>{3, 6144}, {33, 256}, {17, 200}, {5, 131}}) {
        int rows = sh.first, C = sh.second;
        size_t n = (size_t)rows * C, nf = (size_t)rows * ((C + 127) / 128);
        std::vector<float> x = randn(n, (uint64_t)C + rows, 1.0);
        for (size_t i = 0; i < n; i += 89) x[i] *= 30.0f;
        x = bf16_round(x);
        std::vector<uint8_t> q(n, 0);
        std::vector<float> sinv(nf, 0.0f), y(n);
        compress_rows(q.data(), sinv.data(), x.data(), rows, C, COMPRESS_E4M3);
        decompress_rows(y.data(), q.data(), sinv.data(), rows, C, COMPRESS_E4M3);
        floatX* d_x = dev_bf16(x);
        uint8_t* d_q = dev_copy(std::vector<uint8_t>(n, 0));
        float* d_s = dev_copy(std::vector<float>(nf, 0.0f));
        rows_compress_gpu(d_q, d_s, d_x, rows, C);
        expect_equal("codes", get(d_q, n), q);
        expect_equal("factors", get(d_s, nf), sinv);
        floatX* d_y = dev_poisoned<floatX>(n);
        rows_decompress_gpu(d_y, d_q, d_s, rows, C);
        expect_equal("rebuilt", get_bf16(d_y, n), bf16_round(y));
        for (size_t i = 0; i < n; i++)
            REQUIRE(std::fabs(y[i] - x[i]) <= std::ldexp(std::fabs(x[i]), -4) + std::ldexp(sinv[(i % C) / 128 * rows + i / C], -10));
        for (void* p : {(void*)d_x, (void*)d_q, (void*)d_s, (void*)d_y}) cudaCheck(cudaFree(p));
    }
}

// a routing of N tokens to k of E experts through the CPU router: idx, w, counts, offsets, ...
struct Routing {
    std::vector<float> w;
    std::vector<int> idx, counts, offsets, row_token, slot_row;
};
static Routing make_routing(int N, int E, int k, uint64_t seed) {
    Routing r;
    std::vector<float> logits = randn((size_t)N * E, seed, 2.0), probs((size_t)N * E), lse(N);
    r.w.resize((size_t)N * k); r.idx.resize((size_t)N * k); r.counts.resize(E); r.offsets.resize(E + 1);
    r.row_token.resize((size_t)N * k); r.slot_row.resize((size_t)N * k);
    router_forward(probs.data(), lse.data(), r.idx.data(), r.w.data(), r.counts.data(), logits.data(), N, E, k, 1.0f);
    moe_dispatch(r.offsets.data(), r.row_token.data(), r.slot_row.data(), r.idx.data(), r.counts.data(), N, E, k);
    return r;
}

TEST_CASE("weighted combine (with the residual add) forward and backward") {
    // the backward's warp per token: four channels per lane in flight (C > 128) and the remainder (C 200: two more
    // per lane, 8 of them one more); k 6: slot groups of 4 and 2
    for (auto s : {std::vector<int>{1, 4, 2, 8}, {37, 16, 4, 33}, {100, 8, 2, 64}, {37, 16, 4, 1024}, {50, 16, 6, 200}}) {
        int N = s[0], E = s[1], k = s[2], C = s[3];
        Routing r = make_routing(N, E, k, N + C);
        std::vector<float> resid = bf16_round(randn((size_t)N * C, 1)), ye = bf16_round(randn((size_t)N * k * C, 2));
        std::vector<float> out = resid;
        moe_combine_forward(out.data(), ye.data(), r.w.data(), r.slot_row.data(), N, k, C);
        floatX *d_resid = dev_bf16(resid), *d_ye = dev_bf16(ye), *d_out = dev_poisoned<floatX>(out.size());
        float* d_w = dev_copy(r.w);
        int* d_sr = dev_copy(r.slot_row);
        moe_combine_forward_gpu(d_out, d_resid, d_ye, d_w, d_sr, N, k, C);
        expect_close("out", get_bf16(d_out, out.size()), out, TOL_BF16);
        std::vector<float> dout = randn((size_t)N * C, 3), dye(ye.size()), dw((size_t)N * k);
        moe_combine_backward(dye.data(), dw.data(), dout.data(), ye.data(), r.w.data(), r.slot_row.data(), N, k, C);
        float *d_dout = dev_copy(dout), *d_dw = dev_poisoned<float>(dw.size());
        floatX* d_dye = dev_poisoned<floatX>(dye.size());
        moe_combine_backward_gpu(d_dye, d_dw, d_dout, d_ye, d_w, d_sr, N, k, C);
        expect_close("dye", get_bf16(d_dye, dye.size()), dye, TOL_BF16);
        expect_close("dtopk_w", get(d_dw, dw.size()), dw, TOL_F32);
        for (void* p : {(void*)d_resid, (void*)d_ye, (void*)d_out, (void*)d_w, (void*)d_sr, (void*)d_dout, (void*)d_dw, (void*)d_dye})
            cudaCheck(cudaFree(p));
    }
}

TEST_CASE("expert GEMMs + SwiGLU, forward and backward, with empty experts") {
    for (auto s : {std::vector<int>{13, 8, 2, 32, 48}, {40, 4, 2, 24, 40}}) {
        int N = s[0], E = s[1], k = s[2], C = s[3], F = s[4], rows = N * k;
        Routing r = make_routing(N, E, k, 5 + N);
        int empty = 0;
        for (int e = 0; e < E; e++) empty += r.counts[e] == 0;
        std::vector<float> xe = bf16_round(randn((size_t)rows * C, 1)), w1 = bf16_round(randn((size_t)E * F * C, 2, 0.2)),
                           v1 = bf16_round(randn((size_t)E * F * C, 3, 0.2)), w2 = bf16_round(randn((size_t)E * F * C, 4, 0.2));
        std::vector<float> ye((size_t)rows * C), g((size_t)rows * F), u((size_t)rows * F), a((size_t)rows * F);
        experts_up_forward(g.data(), u.data(), a.data(), xe.data(), w1.data(), v1.data(), r.offsets.data(), E, C, F);
        experts_down_forward(ye.data(), a.data(), w2.data(), r.offsets.data(), E, C, F);
        floatX *d_xe = dev_bf16(xe), *d_w1 = dev_bf16(w1), *d_v1 = dev_bf16(v1), *d_w2 = dev_bf16(w2);
        floatX *d_ye = dev_poisoned<floatX>(ye.size()), *d_g = dev_poisoned<floatX>(g.size()), *d_u = dev_poisoned<floatX>(u.size()),
               *d_a = dev_poisoned<floatX>(a.size());
        experts_forward_gpu(d_ye, d_g, d_u, d_a, d_xe, d_w1, d_v1, d_w2, r.offsets.data(), E, C, F);
        INFO("N " << N << " E " << E << " k " << k << " (" << empty << " experts without tokens)");
        expect_close("g", get_bf16(d_g, g.size()), g, TOL_BF16);
        expect_close("u", get_bf16(d_u, u.size()), u, TOL_BF16);
        expect_close("ye", get_bf16(d_ye, ye.size()), ye, TOL_BF16);
        // the backward from the GPU's own (BF16) activations, given to the CPU as well
        std::vector<float> gg = get_bf16(d_g, g.size()), uu = get_bf16(d_u, u.size()), aa = get_bf16(d_a, a.size());
        std::vector<float> dye = bf16_round(randn(ye.size(), 6)), dxe(xe.size()), da(a.size()), dg(a.size()), du(a.size());
        std::vector<float> dw1 = randn(w1.size(), 7, 0.1), dv1 = randn(w1.size(), 8, 0.1), dw2 = randn(w1.size(), 9, 0.1);
        float *d_dw1 = dev_copy(dw1), *d_dv1 = dev_copy(dv1), *d_dw2 = dev_copy(dw2);
        floatX *d_dxe = dev_poisoned<floatX>(dxe.size()), *d_dye = dev_bf16(dye), *d_da = dev_poisoned<floatX>(a.size()), *d_dg = dev_poisoned<floatX>(a.size()),
               *d_du = dev_poisoned<floatX>(a.size());
        experts_down_backward(da.data(), dw2.data(), dye.data(), w2.data(), aa.data(), dye.data(), r.offsets.data(), E, C, F);
        swiglu_backward(dg.data(), du.data(), da.data(), gg.data(), uu.data(), (size_t)rows * F);
        experts_up_backward(dxe.data(), dw1.data(), dv1.data(), dg.data(), du.data(), w1.data(), v1.data(), dg.data(), du.data(),
                            xe.data(), r.offsets.data(), E, C, F);
        experts_backward_gpu(d_dxe, d_dw1, d_dv1, d_dw2, d_da, d_dg, d_du, d_dye, d_xe, d_g, d_u, d_a, d_w1, d_v1, d_w2,
                             r.offsets.data(), E, C, F);
        expect_close("dxe", get_bf16(d_dxe, dxe.size()), dxe, TOL_BF16);
        expect_close("dw1", get(d_dw1, dw1.size()), dw1, TOL_BF16);
        expect_close("dv1", get(d_dv1, dv1.size()), dv1, TOL_BF16);
        expect_close("dw2", get(d_dw2, dw2.size()), dw2, TOL_F32);
        for (void* p : {(void*)d_xe, (void*)d_w1, (void*)d_v1, (void*)d_w2, (void*)d_ye, (void*)d_g, (void*)d_u, (void*)d_a,
                        (void*)d_dw1, (void*)d_dv1, (void*)d_dw2, (void*)d_dxe, (void*)d_dye, (void*)d_da, (void*)d_dg, (void*)d_du})
            cudaCheck(cudaFree(p));
    }
}

TEST_CASE("the weight gradients of experts without rows zeroed, 16-byte and 4-byte stores, the others untouched") {
    // n a multiple of 4 with aligned pointers: the 16-byte path; the same pointers + 1 float: the 4-byte path
    for (int misaligned : {0, 1}) {
        const int E = 8, F = 12, C = 20, N = 3, k = 2;   // (6 slots: at least 2 experts without rows)
        const size_t n = (size_t)F * C;
        Routing r = make_routing(N, E, k, 3);
        int empty = 0;
        for (int e = 0; e < E; e++) empty += r.counts[e] == 0;
        REQUIRE(empty > 0);
        REQUIRE(empty < E);
        std::vector<float> w[3];
        float* d[3];
        for (int i = 0; i < 3; i++) {
            w[i] = randn(E * n + 1, 11 + i);
            d[i] = dev_copy(w[i]);
        }
        int* d_off = dev_copy(r.offsets);
        experts_zero_empty_gpu(d[0] + misaligned, d[1] + misaligned, d[2] + misaligned, d_off, E, n);
        INFO((misaligned ? "4-byte stores" : "16-byte stores") << ", " << empty << " of " << E << " experts without rows");
        for (int i = 0; i < 3; i++) {
            std::vector<float> got = get(d[i], w[i].size()), want = w[i];
            for (int e = 0; e < E; e++)
                if (r.counts[e] == 0) std::fill(want.begin() + misaligned + e * n, want.begin() + misaligned + (e + 1) * n, 0.0f);
            CHECK(got == want);
            cudaCheck(cudaFree(d[i]));
        }
        cudaCheck(cudaFree(d_off));
    }
}

TEST_CASE("fused classifier: softmax, cross-entropy and dlogits in one kernel") {
    for (auto s : {std::vector<int>{1, 5}, {7, 384}, {33, 1000}, {3, 100352}}) {
        int N = s[0], V = s[1];
        std::vector<float> logits = bf16_round(randn((size_t)N * V, N + V, 3.0)), losses(N);
        std::vector<int> targets = randint(N, V, V);
        double mean = crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
        floatX* d_logits = dev_bf16(logits);
        float* d_losses = dev_poisoned<float>(N);
        int* d_t = dev_copy(targets);
        float dloss = 1.0f / N;
        classifier_fused_gpu(d_logits, d_losses, d_t, N, V, dloss, false);   // validation: logits left alone
        expect_equal("logits untouched", get_bf16(d_logits, logits.size()), logits);
        classifier_fused_gpu(d_logits, d_losses, d_t, N, V, dloss, true);
        std::vector<float> gl = get(d_losses, N);
        INFO("N " << N << " V " << V);
        expect_close("losses", gl, losses, TOL_F32);
        double gm = 0;
        for (float l : gl) gm += l;
        CHECK(gm / N == doctest::Approx(mean).epsilon(1e-5));
        crossentropy_backward(logits.data(), targets.data(), N, V, dloss);
        expect_close("dlogits", get_bf16(d_logits, logits.size()), logits, TOL_BF16);
        cudaCheck(cudaFree(d_logits)); cudaCheck(cudaFree(d_losses)); cudaCheck(cudaFree(d_t));
    }
}

TEST_CASE("global gradient norm and AdamW (fp32 master -> bf16 weights)") {
    float* d_partial = dev_poisoned<float>(GRAD_NORM_SCRATCH);
    for (size_t n : {(size_t)1, (size_t)1000, (size_t)1000003}) {
        std::vector<float> grad = randn(n, n, 0.01), p = randn(n, n + 1, 0.02), m = randn(n, n + 2, 1e-3), v = randn(n, n + 3, 1e-3);
        for (float& x : v) x = x * x;
        float* d_grad = dev_copy(grad);
        CHECK(grad_sumsq_gpu(d_grad, n, d_partial) == doctest::Approx(grad_sumsq(grad.data(), n)).epsilon(1e-5));
        float *d_p = dev_copy(p), *d_m = dev_copy(m), *d_v = dev_copy(v);
        floatX* d_p16 = dev_poisoned<floatX>(n);
        for (int t : {1, 7}) {
            adamw_update(p.data(), grad.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
            adamw_update_gpu(d_p, d_p16, d_grad, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        }
        std::vector<float> gp = get(d_p, n);
        expect_close("master", gp, p, TOL_F32);
        expect_close("m", get(d_m, n), m, TOL_F32);
        expect_close("v", get(d_v, n), v, TOL_F32);
        expect_equal("bf16 weights = round(master)", get_bf16(d_p16, n), bf16_round(gp));
        for (void* q : {(void*)d_grad, (void*)d_p, (void*)d_m, (void*)d_v, (void*)d_p16}) cudaCheck(cudaFree(q));
    }
    cudaCheck(cudaFree(d_partial));
}

// The store's optimizer step (parallel/zero_gpu.cuh): the gradient norm's partials with the data-parallel factor
// pre, then the fused AdamW over a shard's segment table (pieces at offsets that are not multiples of 8, a norm
// of DBRX's width 1024 and sizes that leave every head and tail length, padding between them and at the end):
// against the CPU reference AdamW on (grad pre), every gradient element zeroed, the padding's master, moments
// and BF16 copy untouched; then the same through misaligned base pointers (the 4-byte path), which must give
// the same bits as the 16-byte one.
TEST_CASE("fused AdamW over a shard's segments, the gradient zeroed, and the norm's 16-byte partials") {
    const float pre = 1.0f / 3, scale = 0.7f;
    std::vector<std::array<size_t, 3>> pieces = {{3, 1000, 1}, {1003, 1024, 0}, {2027, 7, 1}, {2040, 20001, 1}, {22043, 1, 0},
                                                 {22051, 4099, 1}};
    const size_t total = 26300;
    AdamwSegments t = adamw_segments(pieces, total);
    REQUIRE(t.off.size() == 11);   // 6 pieces; gaps at 0, 2034, 22041, 22044 and after the last
    CHECK(t.mode[0] == ADAMW_ZERO_ONLY);
    CHECK(t.mode.back() == ADAMW_ZERO_ONLY);
    CHECK(t.off.back() + t.n.back() == total);
    size_t *d_off = dev_copy(t.off), *d_n = dev_copy(t.n);
    int* d_mode = dev_copy(t.mode);
    std::vector<float> grad = randn(total, 11, 0.01), p = randn(total, 12, 0.02), m = randn(total, 13, 1e-3), v = randn(total, 14, 1e-3);
    for (float& x : v) x = x * x;
    std::vector<floatX> p16_init(total + 8, __float2bfloat16(-3.0f));
    std::vector<float> bits[2];
    for (int shift : {0, 1}) {   // 0: 16-byte aligned bases; 1: one element off (every access 4 bytes)
        INFO("bases shifted by " << shift << " element(s)");
        std::vector<float> pad(shift, 0.0f);
        auto with = [&](const std::vector<float>& x) { std::vector<float> y = pad; y.insert(y.end(), x.begin(), x.end()); return y; };
        float *d_g = dev_copy(with(grad)), *d_p = dev_copy(with(p)), *d_m = dev_copy(with(m)), *d_v = dev_copy(with(v));
        floatX* d_p16 = dev_copy(p16_init);
        float* d_partial = dev_poisoned<float>(GRAD_NORM_BLOCKS);
        grad_norm_partials_gpu(d_partial, d_g + shift, total, pre, 0);
        std::vector<float> partial = get(d_partial, GRAD_NORM_BLOCKS);
        double sum = 0;
        for (float x : partial) sum += x;
        std::vector<float> scaled = grad;
        for (float& x : scaled) x = x * pre;
        CHECK(sum == doctest::Approx(grad_sumsq(scaled.data(), total)).epsilon(1e-5));
        bits[shift] = partial;
        adamw_fused_update_gpu(d_p + shift, d_p16 + shift, d_g + shift, d_m + shift, d_v + shift, d_off, d_n, d_mode, (int)t.off.size(),
                               t.max_n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, pre, scale, 3);
        std::vector<float> wp = p, wm = m, wv = v;
        for (const std::array<size_t, 3>& q : pieces)
            adamw_update(wp.data() + q[0], scaled.data() + q[0], wm.data() + q[0], wv.data() + q[0], q[1], 1e-3f, 0.9f, 0.95f, 1e-8f,
                         q[2] ? 0.1f : 0.0f, scale, 3);
        std::vector<float> gp = get(d_p + shift, total), gp16 = get_bf16(d_p16 + shift, total), p16_want = bf16_round(gp);
        for (size_t k = 0; k < t.off.size(); k++)   // the padding: its BF16 copy not written
            if (t.mode[k] == ADAMW_ZERO_ONLY)
                for (size_t i = t.off[k]; i < t.off[k] + t.n[k]; i++) p16_want[i] = -3.0f;
        expect_close("master", gp, wp, TOL_F32);   // (the padding: untouched, so equal)
        expect_close("m", get(d_m + shift, total), wm, TOL_F32);
        expect_close("v", get(d_v + shift, total), wv, TOL_F32);
        expect_equal("bf16 weights = round(master)", gp16, p16_want);
        expect_equal("gradient zeroed", get(d_g + shift, total), std::vector<float>(total, 0.0f));
        for (void* q : {(void*)d_g, (void*)d_p, (void*)d_m, (void*)d_v, (void*)d_p16, (void*)d_partial}) cudaCheck(cudaFree(q));
    }
    expect_equal("norm partials: 4-byte loads = 16-byte loads", bits[1], bits[0]);
    for (void* q : {(void*)d_off, (void*)d_n, (void*)d_mode}) cudaCheck(cudaFree(q));
}

// --adam-moments bf16: the fused update with its moments in BF16 (adamw_fused_bf16_moments_kernel), two steps over the
// segments above, against the CPU reference AdamW with moments_bf16: the moments the same BF16 numbers (an element whose
// FP32 value lies within an ulp of a rounding boundary may round the other way: at most 1%, and 1 BF16 ulp), the
// master weights close as with FP32 moments; the padding's moments untouched; the 4-byte path the 16-byte one's bits.
// Negative control: the CPU's FP32 moments are not those numbers (the BF16 rounding is there to be seen).
TEST_CASE("fused AdamW with BF16 moments (--adam-moments bf16) against the CPU's, two steps") {
    const float pre = 1.0f / 3, scale = 0.7f;
    std::vector<std::array<size_t, 3>> pieces = {{3, 1000, 1}, {1003, 1024, 0}, {2027, 7, 1}, {2040, 20001, 1}, {22051, 4099, 1}};
    const size_t total = 26200;
    AdamwSegments t = adamw_segments(pieces, total);
    size_t *d_off = dev_copy(t.off), *d_n = dev_copy(t.n);
    int* d_mode = dev_copy(t.mode);
    std::vector<float> g1 = randn(total, 21, 0.01), g2 = randn(total, 22, 0.01), p = randn(total, 23, 0.02);
    std::vector<float> m = bf16_round(randn(total, 24, 1e-3)), v = randn(total, 25, 1e-3);
    for (float& x : v) x = x * x;
    v = bf16_round(v);
    // the CPU: two steps, BF16 moments (wm, wv) and FP32 ones (fm, fv: the negative control)
    std::vector<float> wp = p, wm = m, wv = v, fp = p, fm = m, fv = v;
    for (int step = 0; step < 2; step++) {
        std::vector<float> sc = step ? g2 : g1;
        for (float& x : sc) x = x * pre;
        for (const std::array<size_t, 3>& q : pieces) {
            adamw_update(wp.data() + q[0], sc.data() + q[0], wm.data() + q[0], wv.data() + q[0], q[1], 1e-3f, 0.9f, 0.95f, 1e-8f,
                         q[2] ? 0.1f : 0.0f, scale, 3 + step, 1);
            adamw_update(fp.data() + q[0], sc.data() + q[0], fm.data() + q[0], fv.data() + q[0], q[1], 1e-3f, 0.9f, 0.95f, 1e-8f,
                         q[2] ? 0.1f : 0.0f, scale, 3 + step, 0);
        }
    }
    std::vector<float> got_m[2], got_v[2], got_p[2];
    for (int shift : {0, 1}) {   // 0: 16-byte aligned bases; 1: one element off (every access scalar)
        INFO("bases shifted by " << shift << " element(s)");
        std::vector<float> pad(shift, 0.0f);
        auto with = [&](const std::vector<float>& x) { std::vector<float> y = pad; y.insert(y.end(), x.begin(), x.end()); return y; };
        float *d_p = dev_copy(with(p)), *d_g = dev_copy(with(g1));
        floatX *d_m = dev_bf16(with(m)), *d_v = dev_bf16(with(v)), *d_p16 = dev_bf16(with(p));
        for (int step = 0; step < 2; step++) {
            if (step) cudaCheck(cudaMemcpy(d_g + shift, g2.data(), total * sizeof(float), cudaMemcpyHostToDevice));
            adamw_fused_update_gpu(d_p + shift, d_p16 + shift, d_g + shift, NULL, NULL, d_off, d_n, d_mode, (int)t.off.size(), t.max_n,
                                   1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, pre, scale, 3 + step, 0, 0, 1, d_m + shift, d_v + shift);
        }
        got_m[shift] = get_bf16(d_m + shift, total); got_v[shift] = get_bf16(d_v + shift, total); got_p[shift] = get(d_p + shift, total);
        for (std::vector<float>* x : {&got_m[shift], &got_v[shift]}) {   // BF16 numbers: mostly the same bits, else 1 ulp
            const std::vector<float>& want = x == &got_m[shift] ? wm : wv;
            size_t same = 0;
            for (size_t i = 0; i < total; i++) same += (*x)[i] == want[i];
            INFO((x == &got_m[shift] ? "m" : "v") << ": " << same << " of " << total << " the CPU's BF16 number");
            CHECK(same >= total * 99 / 100);
            expect_close(x == &got_m[shift] ? "m within a BF16 ulp" : "v within a BF16 ulp", *x, want, {1.0 / 128, 0});
        }
        expect_close("master", got_p[shift], wp, TOL_F32);
        for (size_t k = 0; k < t.off.size(); k++)   // the padding: its moments not written
            if (t.mode[k] == ADAMW_ZERO_ONLY)
                for (size_t i = t.off[k]; i < t.off[k] + t.n[k]; i++) { CHECK(got_m[shift][i] == m[i]); CHECK(got_v[shift][i] == v[i]); }
        for (void* q : {(void*)d_g, (void*)d_p, (void*)d_m, (void*)d_v, (void*)d_p16}) cudaCheck(cudaFree(q));
    }
    expect_equal("m: scalar path = 16-byte path", got_m[1], got_m[0]);
    expect_equal("v: scalar path = 16-byte path", got_v[1], got_v[0]);
    expect_equal("master: scalar path = 16-byte path", got_p[1], got_p[0]);
    size_t off_f32 = 0;   // the negative control
    for (size_t i = 0; i < total; i++) off_f32 += std::fabs(got_m[0][i] - fm[i]) > 1e-4 * std::fabs(fm[i]) + 1e-12;
    CHECK(off_f32 > total / 2);
    for (void* q : {(void*)d_off, (void*)d_n, (void*)d_mode}) cudaCheck(cudaFree(q));
}

// --optimizer lion: the fused update's LionW (lion_fused_kernel; with --adam-moments bf16 lion_fused_bf16_moment_kernel), two
// steps over the segments above, against the CPU reference lion_update: the same expressions in the same order, so the
// master weights and m are its bits (BF16 m: the same rounding of the same FP32 value); the padding untouched, v never
// passed (NULL); the 4-byte path the 16-byte one's bits. Controls: every updated element moved by lr (sign + wd p), and
// the gradient's zeros (a quarter of the elements, m 0) gave sign 0: only the decay moved them.
TEST_CASE("fused LionW (--optimizer lion) against the CPU's, FP32 and BF16 m, two steps") {
    const float pre = 1.0f / 3, scale = 0.7f, lr = 3e-4f, wd = 0.1f;
    std::vector<std::array<size_t, 3>> pieces = {{3, 1000, 1}, {1003, 1024, 0}, {2027, 7, 1}, {2040, 20001, 1}, {22051, 4099, 1}};
    const size_t total = 26200;
    AdamwSegments t = adamw_segments(pieces, total);
    size_t *d_off = dev_copy(t.off), *d_n = dev_copy(t.n);
    int* d_mode = dev_copy(t.mode);
    std::vector<float> g1 = randn(total, 31, 0.01), g2 = randn(total, 32, 0.01), p = randn(total, 33, 0.02), m0 = randn(total, 34, 1e-3);
    for (size_t i = 0; i < total; i += 4) { g1[i] = g2[i] = 0.0f; m0[i] = 0.0f; }   // sign(0) = 0
    for (int bf16 : {0, 1}) {
        INFO("m in " << (bf16 ? "BF16" : "FP32"));
        std::vector<float> m = bf16 ? bf16_round(m0) : m0, wp = p, wm = m, p1;
        for (int step = 0; step < 2; step++) {
            std::vector<float> sc = step ? g2 : g1;
            for (float& x : sc) x = x * pre;
            for (const std::array<size_t, 3>& q : pieces)
                lion_update(wp.data() + q[0], sc.data() + q[0], wm.data() + q[0], q[1], lr, 0.9f, 0.95f, q[2] ? wd : 0.0f, scale, bf16);
            if (step == 0) p1 = wp;
        }
        for (const std::array<size_t, 3>& q : pieces)   // control: step 1 moved each element by lr (sign + wd p)
            for (size_t i = q[0]; i < q[0] + q[1]; i++) {
                float d = (p[i] - p1[i]) / lr - (q[2] ? wd : 0.0f) * p[i];
                if (i % 4 == 0) CHECK(std::fabs(d) < 1e-3);
                else CHECK(std::fabs(std::fabs(d) - 1.0f) < 1e-3);
            }
        std::vector<float> got_m[2], got_p[2];
        for (int shift : {0, 1}) {   // 0: 16-byte aligned bases; 1: one element off (every access scalar)
            INFO("bases shifted by " << shift << " element(s)");
            std::vector<float> pad(shift, 0.0f);
            auto with = [&](const std::vector<float>& x) { std::vector<float> y = pad; y.insert(y.end(), x.begin(), x.end()); return y; };
            float *d_p = dev_copy(with(p)), *d_g = dev_copy(with(g1)), *d_m = bf16 ? NULL : dev_copy(with(m));
            floatX *d_m16 = bf16 ? dev_bf16(with(m)) : NULL, *d_p16 = dev_bf16(with(p));
            for (int step = 0; step < 2; step++) {
                if (step) cudaCheck(cudaMemcpy(d_g + shift, g2.data(), total * sizeof(float), cudaMemcpyHostToDevice));
                adamw_fused_update_gpu(d_p + shift, d_p16 + shift, d_g + shift, bf16 ? NULL : d_m + shift, NULL, d_off, d_n, d_mode,
                                       (int)t.off.size(), t.max_n, lr, 0.9f, 0.95f, 1e-8f, wd, pre, scale, 3 + step, 0, 0, 0,
                                       bf16 ? d_m16 + shift : NULL, NULL, 1);
            }
            got_m[shift] = bf16 ? get_bf16(d_m16 + shift, total) : get(d_m + shift, total);
            got_p[shift] = get(d_p + shift, total);
            expect_equal("master = the CPU's", got_p[shift], wp);   // (the padding: untouched, so equal)
            expect_equal("m = the CPU's", got_m[shift], wm);
            std::vector<float> p16_want = bf16_round(got_p[shift]);
            for (size_t k = 0; k < t.off.size(); k++)   // the padding: its BF16 copy not written
                if (t.mode[k] == ADAMW_ZERO_ONLY)
                    for (size_t i = t.off[k]; i < t.off[k] + t.n[k]; i++) p16_want[i] = bf16_round(std::vector<float>{p[i]})[0];
            expect_equal("bf16 weights = round(master)", get_bf16(d_p16 + shift, total), p16_want);
            for (void* q : {(void*)d_g, (void*)d_p, (void*)d_m, (void*)d_m16, (void*)d_p16}) if (q) cudaCheck(cudaFree(q));
        }
        expect_equal("master: scalar path = 16-byte path", got_p[1], got_p[0]);
        expect_equal("m: scalar path = 16-byte path", got_m[1], got_m[0]);
    }
    for (void* q : {(void*)d_off, (void*)d_n, (void*)d_mode}) cudaCheck(cudaFree(q));
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "kernels", 20240601); }
