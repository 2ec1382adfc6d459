// test_cublaslt_twin.cpp — the emulated builds run model/matmul_cublaslt.cuh on cuBLASLt's API twin
// (test/simt/cublaslt_api_twin.h): each rule the twin enforces, called as the product calls the library,
// with the status the library answers, next to the same call made right (the control); the two orders of
// the FP8 plan's set-up (the heuristic asked before the scale pointers are on the descriptor, as before
// commit c1c65a6, and after); and model/matmul_cublaslt.cuh's bucket fallback, taken when the bucket's
// algorithm refuses the exact shape, checked against a CPU reference.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <string>
#include <vector>
#include "../model/matmul.cuh"
#include "cuda_test_helpers.h"

static const float ONE = 1.0f, ZERO = 0.0f;

// a plan made by hand, as model/matmul_cublaslt.cuh makes one: D (m, n) = op(A) op(B), column-major
struct Plan {
    cublasLtHandle_t h = nullptr;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
    Plan(cudaDataType_t ab, cudaDataType_t d, bool ta, bool tb, int m, int n, int k, int lda, int ldb, int ldd) {
        REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
        cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatrixLayoutCreate(&la, ab, ta ? k : m, ta ? m : k, lda) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatrixLayoutCreate(&lb, ab, tb ? n : k, tb ? k : n, ldb) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatrixLayoutCreate(&ld, d, m, n, ldd) == CUBLAS_STATUS_SUCCESS);
    }
    ~Plan() {
        cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
    }
    void set(cublasLtMatmulDescAttributes_t a, const void* v, size_t n) {
        REQUIRE(cublasLtMatmulDescSetAttribute(desc, a, v, n) == CUBLAS_STATUS_SUCCESS);
    }
    void set_ptr(cublasLtMatmulDescAttributes_t a, const void* p) { set(a, &p, sizeof p); }
    // the heuristic with a preference (workspace, alignment of every matrix), as matmul_plan_query asks
    cublasStatus_t query(uint64_t max_ws = 32 << 20, uint32_t align = 16) {
        cublasLtMatmulPreference_t pref = nullptr;
        REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws) == CUBLAS_STATUS_SUCCESS);
        for (cublasLtMatmulPreferenceAttributes_t a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                       CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, a, &align, sizeof align) == CUBLAS_STATUS_SUCCESS);
        cublasLtMatmulHeuristicResult_t r;
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &r, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st == CUBLAS_STATUS_SUCCESS) { REQUIRE(found == 1); algo = r.algo; ws = r.workspaceSize; }
        return st;
    }
    cublasStatus_t run(const void* A, const void* B, void* D, void* workspace, size_t wsb) {
        return cublasLtMatmul(h, desc, &ONE, A, la, B, lb, &ZERO, D, ld, D, ld, &algo, workspace, wsb, 0);
    }
};

TEST_CASE("R1: a layout's ld below its rows is refused INVALID_VALUE, at the heuristic and at the matmul") {
    floatX* a = deviceAlloc(floatX, 64 * 64);
    floatX* b = deviceAlloc(floatX, 64 * 64);
    float* d = deviceAlloc(float, 64 * 64);
    Plan ok(CUDA_R_16BF, CUDA_R_32F, false, false, 32, 16, 8, 32, 8, 32);
    CHECK(ok.query() == CUBLAS_STATUS_SUCCESS);
    CHECK(ok.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    Plan bad(CUDA_R_16BF, CUDA_R_32F, false, false, 32, 16, 8, 31, 8, 32);   // A (32 x 8) with ld 31
    CHECK(bad.query() == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublaslt_twin_last_error().find("matrix A: ld 31 < rows 32") != std::string::npos);
    bad.algo = ok.algo;   // the matmul checks it too
    CHECK(bad.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_INVALID_VALUE);
    Plan shapes(CUDA_R_16BF, CUDA_R_32F, false, false, 32, 16, 8, 32, 8, 32);
    uint64_t rows = 9;   // op(A)'s k no longer op(B)'s
    REQUIRE(cublasLtMatrixLayoutSetAttribute(shapes.lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows) == CUBLAS_STATUS_SUCCESS);
    CHECK(shapes.query() == CUBLAS_STATUS_INVALID_VALUE);
    int32_t wrong_size = 9;   // an attribute given with another size than its own
    CHECK(cublasLtMatrixLayoutSetAttribute(shapes.lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &wrong_size, sizeof wrong_size) == CUBLAS_STATUS_INVALID_VALUE);
    cudaFree(a); cudaFree(b); cudaFree(d);
}

TEST_CASE("R2: FP8 operands only TN (NOT_SUPPORTED otherwise); E5M2 x E5M2 refused") {
    uint8_t* a = deviceAlloc(uint8_t, 64 * 64);
    uint8_t* b = deviceAlloc(uint8_t, 64 * 64);
    float* d = deviceAlloc(float, 64 * 64);
    Plan tn(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 64, 64, 64, 32);
    CHECK(tn.query(0) == CUBLAS_STATUS_SUCCESS);   // (no workspace: the calls below pass none)
    CHECK(tn.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    Plan nn(CUDA_R_8F_E4M3, CUDA_R_32F, false, false, 32, 16, 64, 32, 64, 32);
    CHECK(nn.query() == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublaslt_twin_last_error().find("TN layout") != std::string::npos);
    Plan e5(CUDA_R_8F_E5M2, CUDA_R_32F, true, false, 32, 16, 64, 64, 64, 32);
    CHECK(e5.query() == CUBLAS_STATUS_NOT_SUPPORTED);
    cudaFree(a); cudaFree(b); cudaFree(d);
}

// an FP8 TN plan with block scales: A in 1x128 tiles, B in 128x128 blocks (m 32, n 16, k 128)
static void block_modes(Plan* p) {
    int32_t va = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, bb = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    p->set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &va, sizeof va);
    p->set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bb, sizeof bb);
}

TEST_CASE("R3: block scaling without its scale pointers at the heuristic: INVALID_VALUE with the H200's message") {
    float* sa = dev_copy(std::vector<float>(64, 1.0f));
    float* sb = dev_copy(std::vector<float>(64, 1.0f));
    // before commit c1c65a6: the modes set, the heuristic asked, the pointers set per call afterwards
    Plan before(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 128, 128, 128, 32);
    block_modes(&before);
    CHECK(before.query() == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublaslt_twin_last_error() ==
          "[cublasLtMatmulAlgoGetHeuristic] The scaling mode for A scale (VEC128_32F) requires a custom pointer for A scale");
    before.set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sa);
    CHECK(before.query() == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublaslt_twin_last_error() ==
          "[cublasLtMatmulAlgoGetHeuristic] The scaling mode for B scale (BLK128x128_32F) requires a custom pointer for B scale");
    // after: the pointers on the descriptor first (matmul_desc_set_pointers)
    before.set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sb);
    CHECK(before.query() == CUBLAS_STATUS_SUCCESS);
    // both operands in 128x128 blocks: not a mode pair cuBLAS has
    Plan blk(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 128, 128, 128, 32);
    int32_t bb = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    blk.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &bb, sizeof bb);
    blk.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bb, sizeof bb);
    blk.set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sa);
    blk.set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sb);
    CHECK(blk.query() == CUBLAS_STATUS_NOT_SUPPORTED);
    cudaFree(sa); cudaFree(sb);
}

TEST_CASE("R4: an algorithm chosen without the scale pointers is refused NOT_SUPPORTED by the call that has them") {
    uint8_t* a = deviceAlloc(uint8_t, 64 * 64);
    uint8_t* b = deviceAlloc(uint8_t, 64 * 64);
    float* d = deviceAlloc(float, 64 * 64);
    float* s = dev_copy(std::vector<float>(16, 0.5f));
    Plan p(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 64, 64, 64, 32);
    REQUIRE(p.query() == CUBLAS_STATUS_SUCCESS);   // per tensor, no pointers yet (the order before c1c65a6)
    p.set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s);
    p.set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s + 4);
    CHECK(p.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublaslt_twin_last_error().find("without the A scale pointer") != std::string::npos);
    cublasLtMatmulHeuristicResult_t check;
    CHECK(cublasLtMatmulAlgoCheck(p.h, p.desc, p.la, p.lb, p.ld, p.ld, &p.algo, &check) == CUBLAS_STATUS_NOT_SUPPORTED);
    REQUIRE(p.query(0) == CUBLAS_STATUS_SUCCESS);   // asked again with them: taken (no workspace: none passed)
    CHECK(p.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(s);
}

TEST_CASE("R5: the preference's workspace and alignment bound the algorithm; the matmul refuses less") {
    floatX* a = deviceAlloc(floatX, 64 * 512 + 64);
    floatX* b = deviceAlloc(floatX, 64 * 512 + 64);
    float* d = deviceAlloc(float, 64 * 64 + 64);
    void* ws = nullptr;
    REQUIRE(cudaMalloc(&ws, 1 << 20) == cudaSuccess);
    Plan p(CUDA_R_16BF, CUDA_R_32F, true, false, 32, 16, 512, 512, 512, 32);   // k beyond m and n: the split-K stand-in
    REQUIRE(p.query(0) == CUBLAS_STATUS_SUCCESS);   // no workspace allowed: an algorithm without
    CHECK(p.ws == 0);
    CHECK(p.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(p.query(32 << 20) == CUBLAS_STATUS_SUCCESS);
    CHECK(p.ws == (1u << 20));
    CHECK(p.run(a, b, d, ws, (1 << 20) - 1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(p.run(a, b, d, ws, 1 << 20) == CUBLAS_STATUS_SUCCESS);
    // alignment: the default preference (256 bytes) against a pointer 16 bytes in; 16 promised: taken
    REQUIRE(p.query(0, 256) == CUBLAS_STATUS_SUCCESS);
    CHECK(p.run(a + 8, b, d, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublaslt_twin_last_error().find("matrix A is 16-byte aligned, the algorithm needs 256") != std::string::npos);
    REQUIRE(p.query(0, 16) == CUBLAS_STATUS_SUCCESS);
    CHECK(p.run(a + 8, b, d, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    CHECK(p.run(a + 1, b, d, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);   // 2-byte aligned
    cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(ws);
}

TEST_CASE("R6 and R7: FAST_ACCUM only with per-tensor FP8; AlgoCheck refuses another device's algorithm") {
    float* s = dev_copy(std::vector<float>(64, 1.0f));
    int8_t fa = 1;
    Plan tensor(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 128, 128, 128, 32);
    tensor.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
    CHECK(tensor.query() == CUBLAS_STATUS_SUCCESS);
    Plan blocks(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 128, 128, 128, 32);
    block_modes(&blocks);
    blocks.set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s);
    blocks.set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s);
    REQUIRE(blocks.query() == CUBLAS_STATUS_SUCCESS);
    blocks.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
    CHECK(blocks.query() == CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatmulHeuristicResult_t check;
    CHECK(cublasLtMatmulAlgoCheck(tensor.h, tensor.desc, tensor.la, tensor.lb, tensor.ld, tensor.ld, &tensor.algo, &check) == CUBLAS_STATUS_SUCCESS);
    CHECK(check.state == CUBLAS_STATUS_SUCCESS);
    tensor.algo.data[7] = 1;
    CHECK(cublasLtMatmulAlgoCheck(tensor.h, tensor.desc, tensor.la, tensor.lb, tensor.ld, tensor.ld, &tensor.algo, &check) == CUBLAS_STATUS_NOT_SUPPORTED);
    cudaFree(s);
}

TEST_CASE("R8: an AMAX_D pointer with a D that is not FP8 is refused INVALID_VALUE, at the heuristic and at the matmul") {
    uint8_t* a = deviceAlloc(uint8_t, 64 * 64);
    uint8_t* b = deviceAlloc(uint8_t, 64 * 64);
    float* s = dev_copy(std::vector<float>(12, 1.0f));
    for (cudaDataType_t dt : {CUDA_R_32F, CUDA_R_16BF}) {
        float* d = deviceAlloc(float, 64 * 64);
        Plan p(CUDA_R_8F_E4M3, dt, true, false, 32, 16, 64, 64, 64, 32);
        p.set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s);
        p.set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s + 4);
        REQUIRE(p.query(0) == CUBLAS_STATUS_SUCCESS);   // the control: the same call without amax
        CHECK(p.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
        p.set_ptr(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, s + 8);
        CHECK(p.run(a, b, d, nullptr, 0) == CUBLAS_STATUS_INVALID_VALUE);
        CHECK(cublaslt_twin_last_error().find("an AMAX_D pointer with D ") != std::string::npos);
        CHECK(p.query(0) == CUBLAS_STATUS_INVALID_VALUE);   // what the H100 answered
        CHECK(cublaslt_twin_last_error().find("[cublasLtMatmulAlgoGetHeuristic] an AMAX_D pointer") == 0);
        cudaFree(d);
    }
    cudaFree(a); cudaFree(b); cudaFree(s);
}

TEST_CASE("R9: a scale pointer not 16-byte aligned is refused NOT_SUPPORTED by the matmul, not by the heuristic (an H100's answer)") {
    uint8_t* a = deviceAlloc(uint8_t, 64 * 64);
    uint8_t* b = deviceAlloc(uint8_t, 64 * 64);
    float* s = dev_copy(std::vector<float>(12, 1.0f));
    float* d = deviceAlloc(float, 64 * 64);
    for (int which = 0; which < 2; which++)
        for (int off : {4, 1}) {   // 16 bytes off: taken; 4 bytes off: refused
            INFO((which ? "B" : "A") << " scale " << 4 * off << " bytes off");
            Plan p(CUDA_R_8F_E4M3, CUDA_R_32F, true, false, 32, 16, 64, 64, 64, 32);
            p.set_ptr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, which ? s : s + off);
            p.set_ptr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, which ? s + off : s + 8);
            REQUIRE(p.query(0) == CUBLAS_STATUS_SUCCESS);
            CHECK(p.run(a, b, d, nullptr, 0) == (off == 4 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED));
            if (off == 1) CHECK(cublaslt_twin_last_error().find(which ? "the B scale pointer" : "the A scale pointer") != std::string::npos);
        }
    cudaFree(a); cudaFree(b); cudaFree(s); cudaFree(d);
}

// matmul_forward_gpu's GEMM through matmul_cublaslt: out (n tokens, m) = inp (n, k) @ W (m, k)^T, row-major,
// against a double-precision reference of the same BF16 inputs
static double forward_error(int n, int m, int k, uint64_t seed) {
    std::vector<float> x = randn((size_t)n * k, seed), w = randn((size_t)m * k, seed + 1);
    std::vector<floatX> xb(x.size()), wb(w.size());
    for (size_t i = 0; i < x.size(); i++) { xb[i] = __float2bfloat16(x[i]); x[i] = __bfloat162float(xb[i]); }
    for (size_t i = 0; i < w.size(); i++) { wb[i] = __float2bfloat16(w[i]); w[i] = __bfloat162float(wb[i]); }
    floatX* dx = dev_copy(xb);
    floatX* dw = dev_copy(wb);
    float* dd = dev_poisoned<float>((size_t)n * m);
    // D (m, n) col-major = W^T... as the wrapper calls it: trans_a (W stored (k, m) col-major), B = x (k, n)
    matmul_cublaslt(true, false, m, n, k, 1.0f, dw, CUDA_R_16BF, k, 0, dx, CUDA_R_16BF, k, 0, 0.0f, dd, CUDA_R_32F, m, 0, 1, nullptr,
                    0, __FILE__, __LINE__);
    std::vector<float> d = get(dd, (size_t)n * m);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int o = 0; o < m; o++) {
            double ref = 0;
            for (int p = 0; p < k; p++) ref += (double)x[(size_t)t * k + p] * w[(size_t)o * k + p];
            worst = std::max(worst, std::fabs(ref - d[(size_t)t * m + o]));
        }
    cudaFree(dx); cudaFree(dw); cudaFree(dd);
    return worst;
}

TEST_CASE("the bucket fallback: the bucket's algorithm refused for the exact shape, one for the exact shape asked once and kept") {
    const int m = 48, k = 32, n = 70;   // n 70 is in the bucket of 80 (model/matmul.cuh, matmul_bucket)
    REQUIRE(matmul_bucket(n, 1ll << 40) == 80);
    simt::counters_reset();
    CHECK(forward_error(n, m, k, 1) < 1e-4);   // control: the bucket's algorithm takes n 70
    CHECK(simt::counters().heuristic_queries == 1);
    CHECK(matmul_exact_algos().empty());
    cublaslt_twin_strict_shapes(true);   // now an algorithm takes only the shape it was chosen for
    const int n2 = 100;   // bucket 112, a plan of its own
    REQUIRE(matmul_bucket(n2, 1ll << 40) == 112);
    simt::counters_reset();
    CHECK(forward_error(n2, m, k, 2) < 1e-4);
    CHECK(simt::counters().plan_creations == 1);
    CHECK(simt::counters().heuristic_queries == 2);   // the bucket's, then the exact shape's
    CHECK(simt::counters().gemms == 1);
    REQUIRE(matmul_exact_algos().size() == 1);
    MatmulKey exact = matmul_exact_algos().begin()->first;
    CHECK(exact[3] == n2);
    CHECK(exact[22] == 1);
    CHECK(matmul_pins().used.count(exact) == 1);   // recorded for the next checkpoint
    simt::counters_reset();
    CHECK(forward_error(n2, m, k, 3) < 1e-4);   // the same shape again: the kept algorithm, no query
    CHECK(simt::counters().heuristic_queries == 0);
    CHECK(simt::counters().plan_creations == 0);
    cublaslt_twin_strict_shapes(false);
}

TEST_CASE("the heuristic's later answers (dev/cuda/matmul -a): the plan takes answer `pick`, a new plan after matmul_plans_clear") {
    const int m = 48, k = 32, n = 64;
    MatmulHeuristicChoice& c = matmul_heuristic_choice();
    REQUIRE(c.pick == 0);
    REQUIRE(c.request == 1);   // the product asks for one
    matmul_plans_clear();
    simt::counters_reset();
    CHECK(forward_error(n, m, k, 5) < 1e-4);
    CHECK(c.found == 1);
    c.request = 8;   // the twin has 4
    for (int r = 0; r < 4; r++) {
        c.pick = r;
        matmul_plans_clear();
        matmul_pins().used.clear();
        CHECK(forward_error(n, m, k, 6 + r) < 1e-4);   // (every answer the same GEMM in the twin)
        CHECK(c.found == 4);
        REQUIRE(matmul_pins().used.size() == 1);
        CHECK(matmul_pins().used.begin()->second[5] == (uint64_t)r);   // the algorithm the plan took: answer r
    }
    CHECK(simt::counters().plan_creations == 5);   // one per clear: the cache kept none across them
    // without the clear the cached plan stays: answer 3's, not asked again
    c.pick = 0;
    simt::counters_reset();
    CHECK(forward_error(n, m, k, 11) < 1e-4);
    CHECK(simt::counters().heuristic_queries == 0);
    c.request = 1;
    matmul_plans_clear();
    matmul_pins().used.clear();
    CHECK(forward_error(n, m, k, 12) < 1e-4);
    CHECK(matmul_pins().used.begin()->second[5] == 0);
}

TEST_CASE("--gemm-autotune: a new plan of the heuristic's keeps the fastest of its first N answers, timed at its first call; "
          "beta 1 and pinned plans untouched") {
    const int m = 48, k = 32, n = 64;
    MatmulHeuristicChoice& c = matmul_heuristic_choice();
    c.autotune = 4;
    cublaslt_twin_answer_delay_us(3000);   // answer r runs (3 - r) x 3 ms longer: the last is the fastest
    matmul_plans_clear();
    matmul_pins().used.clear();
    simt::counters_reset();
    long long tuned = c.tuned, trials = c.trials;
    CHECK(forward_error(n, m, k, 21) < 1e-4);   // (the trials wrote D; the call itself then did)
    CHECK(c.tuned == tuned + 1);
    CHECK(c.trials == trials + 4);
    CHECK(simt::counters().gemms == 1 + 4 * 4);   // each answer: a warm-up and 3 timed runs; then the call
    REQUIRE(matmul_pins().used.size() == 1);
    const MatmulKey key = matmul_pins().used.begin()->first;
    CHECK(matmul_pins().used.begin()->second[5] == 3);   // the fastest answer, recorded for the checkpoint
    simt::counters_reset();
    CHECK(forward_error(n, m, k, 22) < 1e-4);   // the plan's second call: no trials
    CHECK(simt::counters().gemms == 1);
    CHECK(c.tuned == tuned + 1);
    // a pinned key (a resumed run) takes its pin: answer 1 here, not timed again
    MatmulAlgoWords pin = matmul_pins().used[key];
    pin[5] = 1;
    matmul_pins().pinned[key] = pin;
    matmul_plans_clear();
    matmul_pins().used.clear();
    simt::counters_reset();
    CHECK(forward_error(n, m, k, 23) < 1e-4);
    CHECK(simt::counters().gemms == 1);
    CHECK(matmul_pins().used[key][5] == 1);
    matmul_pins().pinned.clear();
    // beta 1 (D read: the trials would change it): the heuristic's first, untimed
    matmul_plans_clear();
    matmul_pins().used.clear();
    std::vector<floatX> ab((size_t)k * m, __float2bfloat16(0.5f)), bb((size_t)k * n, __float2bfloat16(0.25f));
    floatX *da = dev_copy(ab), *db = dev_copy(bb);
    float* dd = dev_copy(std::vector<float>((size_t)m * n, 1.0f));
    simt::counters_reset();
    matmul_cublaslt(true, false, m, n, k, 1.0f, da, CUDA_R_16BF, k, 0, db, CUDA_R_16BF, k, 0, 1.0f, dd, CUDA_R_32F, m, 0, 1, nullptr, 0,
                    __FILE__, __LINE__);
    CHECK(simt::counters().gemms == 1);
    CHECK(matmul_pins().used.begin()->second[5] == 0);
    std::vector<float> d = get(dd, (size_t)m * n);
    CHECK(d[0] == doctest::Approx(1.0f + k * 0.125f));   // D + A B: the call's own sum, once
    cudaFree(da); cudaFree(db); cudaFree(dd);
    c.autotune = 0;
    cublaslt_twin_answer_delay_us(0);
    matmul_plans_clear();
    matmul_pins().used.clear();
}

// an FP8 TN GEMM through matmul_cublaslt (D (m, n) = A (k, m)^T B (k, n), E4M3 small integers, exact in FP32),
// per tensor or with A in 1x128 tiles and B in 128x128 blocks: the result against the dequantised reference
static void fp8_through_matmul_cublaslt(bool blocks) {
    const int m = 32, n = 64, k = 256;   // (n its own bucket: no fallback to rescue a refused algorithm)
    REQUIRE(matmul_bucket(n, 1ll << 40) == n);
    std::vector<__nv_fp8_e4m3> a((size_t)k * m), b((size_t)k * n);
    std::vector<float> af(a.size()), bf(b.size());
    for (size_t i = 0; i < a.size(); i++) { af[i] = (float)((int)(i * 7 % 5) - 2); a[i] = __nv_fp8_e4m3(af[i]); }
    for (size_t i = 0; i < b.size(); i++) { bf[i] = (float)((int)(i * 3 % 7) - 3); b[i] = __nv_fp8_e4m3(bf[i]); }
    // the factors: per tensor one each; block: A's per (row, chunk of k), B's per (128 rows, chunk)
    std::vector<float> sa(blocks ? (size_t)m * 2 : 1), sb(blocks ? 4 : 1);
    for (size_t i = 0; i < sa.size(); i++) sa[i] = 0.5f * (float)(1 + i % 3);
    for (size_t i = 0; i < sb.size(); i++) sb[i] = 0.25f * (float)(1 + i);
    auto fa = [&](int i, int p) { return blocks ? sa[(size_t)(p / 128) * m + i] : sa[0]; };   // (1x128 tiles: outer index fastest)
    auto fb = [&](int j, int p) { return blocks ? sb[(size_t)(j / 128) * 4 + p / 128] : sb[0]; };   // (128x128: k blocks, padded to 4)
    __nv_fp8_e4m3* da = dev_copy(a);
    __nv_fp8_e4m3* db = dev_copy(b);
    float* dsa = dev_copy(sa);
    float* dsb = dev_copy(sb);
    float* dd = dev_poisoned<float>((size_t)m * n);
    MatmulOptions opt = {};
    opt.a_scale = dsa; opt.b_scale = dsb;
    opt.a_scale_mode = blocks ? MATMUL_SCALE_VEC128 : MATMUL_SCALE_TENSOR;
    opt.b_scale_mode = blocks ? MATMUL_SCALE_BLK128 : MATMUL_SCALE_TENSOR;
    matmul_cublaslt(true, false, m, n, k, 1.0f, da, CUDA_R_8F_E4M3, k, 0, db, CUDA_R_8F_E4M3, k, 0, 0.0f, dd, CUDA_R_32F, m, 0, 1, &opt,
                    0, __FILE__, __LINE__);
    std::vector<float> d = get(dd, (size_t)m * n);
    int wrong = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double ref = 0;
            for (int p = 0; p < k; p++) ref += (double)af[(size_t)i * k + p] * bf[(size_t)j * k + p] * fa(i, p) * fb(j, p);
            wrong += d[(size_t)j * m + i] != (float)ref;
        }
    CHECK(wrong == 0);
    cudaFree(da); cudaFree(db); cudaFree(dsa); cudaFree(dsb); cudaFree(dd);
}

// (with the heuristic asked before matmul_desc_set_pointers, as before commit c1c65a6, the per-tensor call fails
// NOT_SUPPORTED: its algorithm was chosen without the scale pointers; and the block-scaled one INVALID_VALUE "The
// scaling mode for A scale (VEC128_32F) requires a custom pointer for A scale", as on the H200)
TEST_CASE("an FP8 GEMM per tensor through model/matmul_cublaslt.cuh on the twin") { fp8_through_matmul_cublaslt(false); }
TEST_CASE("an FP8 GEMM with block scales through model/matmul_cublaslt.cuh on the twin") { fp8_through_matmul_cublaslt(true); }

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "cuBLASLt's API twin", 41); }
