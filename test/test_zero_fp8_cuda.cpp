/*
 * test_zero_fp8_cuda.cpp — the GPU side of ZeRO-3's FP8 all-gather (the CUDA section of
 * parallel/zero_fp8.h) against its CPU reference and against the GPU model's own FP8 operands. One
 * source, two builds: g++ -DSIMT_EMULATION (make test: the kernels under the SIMT emulator) and nvcc
 * (make test-gpu).
 *   - pieces of a block matrix cut anywhere (the shard boundaries of ZeRO-3 at S = 5; hand-picked cuts
 *     through 128x128 blocks, inside a row and at an expert boundary; random cuts), from FP32 values
 *     spanning many binades, with outliers, zeros of both signs, tiny values (E4M3 subnormals after
 *     scaling, FP32 denormals) and an all-zero block: fp8g_piece_amax_gpu's per-group amax equal to
 *     fp8g_piece_amax's, fp8g_piece_encode_gpu's codes and saturated count bit-exact with
 *     fp8g_piece_encode's; per tensor (a given scale that saturates: delayed; current with a margin)
 *     and 128x128 blocks; experts E = 3 of F = 208 rows and one segment, d = 144 (F, d not multiples
 *     of 128);
 *   - the whole GPU pipeline from BF16 values (what the GPU model quantises): every piece's amax into
 *     one array (as the all-reduce max leaves it), fp8g_scales_gpu, every piece's codes into one buffer
 *     and fp8g_factors_gpu equal, byte for byte, fp8_quantize_gpu's q and sinv for the whole weight
 *     (and its amax and saturated count); fp8_transpose_gpu of them its qt and sinv_t (its 16-byte kernel on
 *     shapes of multiples of 16, as the model's weights, which the device store's slot hands to the GEMMs
 *     as they are; its one-byte kernel on experts 2 x (200, 136));
 *   - negative controls: one group's scale doubled, and the transposed factors copied without
 *     re-indexing, are caught by the same comparisons.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../model/dbrx_cuda.cuh"
#include "../parallel/zero_fp8.h"
#include "cuda_test_helpers.h"

typedef enum { R_DELAYED = 0, R_CURRENT, R_BLOCK } Recipe;
static const char* recipe_name(Recipe r) { return r == R_DELAYED ? "delayed (given scale)" : r == R_CURRENT ? "current" : "block"; }
static const int kMargin = 1;   // current scaling's --fp8-margin here

struct Shape { const char* name; int E, F, C; };
// (multiples of 16: the transpose's 16-byte kernel, as every weight of the model; the third: its one-byte kernel)
static const Shape kShapes[] = {{"experts 3 x (208, 144)", 3, 208, 144}, {"one segment (176, 144)", 1, 176, 144},
                                {"experts 2 x (200, 136)", 2, 200, 136}};

// The matrix of a shape at flat offset 1000 of its unit, after 3 other groups (so that group0 and the
// offset are not 0)
static const size_t kOff = 1000, kGroup0 = 3;
static Fp8GatherMatrix matrix_of(const Shape& s, int block) {
    return fp8g_matrix(kOff, s.E * s.F, s.C, s.F, kGroup0, block, nullptr);
}

// FP32 test values (rows, C): rows spanning 2^-6 .. 2^6, outliers 64x, zeros of both signs, tiny
// values (1e-30, the FP32 denormal 2^-130), the last 128x128 block of the last expert all zero
static std::vector<float> test_values(const Shape& s, uint64_t seed) {
    int rows = s.E * s.F, C = s.C;
    std::vector<float> x = randn((size_t)rows * C, seed);
    Rng r = {seed + 7};
    for (int i = 0; i < rows; i++) {
        float m = std::ldexp(1.0f, (int)(rng_u64(&r) % 13) - 6);
        for (int j = 0; j < C; j++) x[(size_t)i * C + j] *= m;
    }
    for (int k = 0; k < 12; k++) x[rng_u64(&r) % x.size()] *= 64.0f;
    for (size_t i = 0; i < x.size(); i += 97) x[i] = (i / 97) % 2 ? -0.0f : 0.0f;
    for (size_t i = 5; i < x.size(); i += 101) x[i] = (i % 2 ? -1e-30f : 1e-30f);
    for (size_t i = 9; i < x.size(); i += 211) x[i] = std::ldexp(1.0f, -130);
    int rb = (s.F - 1) / 128, cb = (C - 1) / 128;
    for (int i = rb * 128; i < s.F; i++)
        for (int j = cb * 128; j < C; j++) x[(size_t)((s.E - 1) * s.F + i) * C + j] = 0.0f;
    return x;
}
static std::vector<float> bf16_rounded(std::vector<float> x) {
    for (float& v : x) v = __bfloat162float(__float2bfloat16(v));
    return x;
}

// the pieces [cuts[i], cuts[i+1]) of matrix M: 0 the shards of ZeRO-3 at S = 5 over a unit with 1000
// elements before M and 41 after; 1 hand-picked cuts (the second element, the last of expert 0 and
// the expert boundary, inside expert 1's second row block and column block, a short piece inside one
// row); 2 random cuts
static std::vector<size_t> cuts_of(const Fp8GatherMatrix& M, int kind, uint64_t seed) {
    size_t n = (size_t)M.rows * M.cols, lo = M.off, hi = M.off + n;
    std::vector<size_t> c = {lo, hi};
    auto add = [&](size_t v) { if (v > lo && v < hi) c.push_back(v); };
    if (kind == 0) {
        size_t unit = hi + 41, S = 5, chunk = (unit + S - 1) / S;
        for (size_t s = 1; s < S; s++) add(s * chunk);
    } else if (kind == 1) {
        size_t F = M.seg_rows, C = M.cols, r = M.rows - 3;
        add(lo + 1);
        add(lo + F * C - 1);
        add(lo + F * C);
        add(lo + (F + 130) * C + 77);
        add(lo + r * C + 50);
        add(lo + r * C + 60);
    } else {
        Rng r = {seed};
        for (int k = 0; k < 6; k++) add(lo + 1 + rng_u64(&r) % (n - 1));
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    return c;
}

// the agreed scales of every group (host) from the whole matrix's group amax, as zero_fp8_prepare's
// step 3: delayed a given scale 8x too large (it saturates), current fp8_scale_for(amax, margin), block
// per group with margin 0
static std::vector<float> host_scales(const Fp8GatherMatrix& M, const std::vector<float>& amax, Recipe rc) {
    std::vector<float> s(amax.size(), 1.0f);
    for (size_t g = M.group0; g < M.group0 + M.groups; g++)
        s[g] = rc == R_DELAYED ? fp8_scale_for(amax[g], FP8_E4M3, 0) * 8.0f
             : rc == R_CURRENT ? fp8_scale_for(amax[g], FP8_E4M3, kMargin) : fp8_scale_for(amax[g], FP8_E4M3, 0);
    return s;
}

TEST_CASE("piece amax and codes on the GPU (FP32 values) equal fp8g_piece_amax / fp8g_piece_encode, pieces cut anywhere") {
    uint64_t seed = 1;
    for (const Shape& sh : kShapes)
        for (Recipe rc : {R_DELAYED, R_CURRENT, R_BLOCK}) {
            const int block = rc == R_BLOCK;
            Fp8GatherMatrix M = matrix_of(sh, block);
            size_t n = (size_t)M.rows * M.cols, G = M.group0 + M.groups;
            std::vector<float> x = test_values(sh, ++seed);
            float* dx = dev_copy(x);
            // the whole matrix's group amax (CPU) and the agreed scales
            std::vector<float> amax_all(G, 0.0f);
            fp8g_piece_amax(&M, M.off, M.off + n, x.data(), amax_all.data(), block);
            std::vector<float> scale = host_scales(M, amax_all, rc);
            float* dscale = dev_copy(scale);
            float* damax = deviceAlloc(float, G);
            unsigned long long* dsat = deviceAlloc(unsigned long long, 1);
            for (int kind = 0; kind < 3; kind++) {
                std::vector<size_t> cuts = cuts_of(M, kind, seed * 31 + kind);
                long long bad_amax = 0, bad_codes = 0, bad_sat = 0, sat_total = 0, subnormal = 0, zero = 0;
                for (size_t i = 0; i + 1 < cuts.size(); i++) {
                    size_t a = cuts[i], b = cuts[i + 1];
                    const float* xp = x.data() + (a - M.off);
                    // amax: every group (the untouched ones stay 0)
                    std::vector<float> want_amax(G, 0.0f);
                    fp8g_piece_amax(&M, a, b, xp, want_amax.data(), block);
                    cudaCheck(cudaMemset(damax, 0, G * sizeof(float)));
                    fp8g_piece_amax_gpu(&M, a, b, dx + (a - M.off), damax, block);
                    std::vector<float> got_amax = get(damax, G);
                    for (size_t g = 0; g < G; g++) bad_amax += memcmp(&got_amax[g], &want_amax[g], 4) != 0;
                    // codes and saturations
                    std::vector<uint8_t> want(b - a);
                    long long want_sat = fp8g_piece_encode(&M, a, b, xp, scale.data(), want.data(), block);
                    __nv_fp8_storage_t* dcodes = dev_poisoned<__nv_fp8_storage_t>(b - a);
                    cudaCheck(cudaMemset(dsat, 0, sizeof(unsigned long long)));
                    fp8g_piece_encode_gpu(&M, a, b, dx + (a - M.off), dscale, dcodes, dsat, block);
                    std::vector<__nv_fp8_storage_t> got = get(dcodes, b - a);
                    for (size_t k = 0; k < b - a; k++) {
                        bad_codes += got[k] != want[k];
                        subnormal += (want[k] & 0x78) == 0 && (want[k] & 0x07) != 0;
                        zero += (want[k] & 0x7F) == 0;
                    }
                    bad_sat += (long long)get(dsat, 1)[0] != want_sat;
                    sat_total += want_sat;
                    cudaCheck(cudaFree(dcodes));
                }
                INFO(sh.name << ", " << recipe_name(rc) << ", cuts " << kind << " (" << cuts.size() - 1 << " pieces)");
                CHECK(bad_amax == 0);
                CHECK(bad_codes == 0);
                CHECK(bad_sat == 0);
                CHECK(subnormal > 0);   // the tiny values were exercised
                CHECK(zero > 0);
                if (rc == R_DELAYED) CHECK(sat_total > 0);   // the given scale saturated values
                else CHECK(sat_total == 0);
            }
            for (void* p : {(void*)dx, (void*)dscale, (void*)damax, (void*)dsat}) cudaCheck(cudaFree(p));
        }
}

// ---------------------------------------------------------------------------------------------
// the whole pipeline against fp8_quantize_gpu

typedef enum { FAULT_NONE = 0, FAULT_SCALE_X2, FAULT_FACTORS_NOT_REINDEXED } Fault;

struct PipelineResult {
    long long bad_q = 0, bad_sinv = 0, bad_qt = 0, bad_sinv_t = 0, pieces = 0;
    bool amax_equal = false, sat_equal = false;
    unsigned long long sat = 0;
};

template <typename T> static long long bytes_differ(const std::vector<T>& a, const std::vector<T>& b) {
    long long n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return n;
}

// One rank's view after the gather, every rank's pieces run here: amax of every piece into one array,
// the scales, every piece's codes into the gathered buffer, the factors, the transposed copy; against
// fp8_quantize_gpu on the whole BF16 weight with the recipe's mode and scale.
static PipelineResult run_pipeline(const Shape& sh, Recipe rc, int cut_kind, uint64_t seed, Fault fault) {
    const int block = rc == R_BLOCK;
    Fp8GatherMatrix M = matrix_of(sh, block);
    const int rows = M.rows, C = M.cols;
    size_t n = (size_t)rows * C, G = M.group0 + M.groups;
    std::vector<float> x = bf16_rounded(test_values(sh, seed));
    floatX* dx = deviceAlloc(floatX, n);
    to_device_bf16(dx, x.data(), n);
    std::vector<int> seg_len(sh.E, sh.F);
    size_t nsinv = block ? fp8_block_scale_count(FP8Q_WEIGHT, false, seg_len, C) : 1;
    size_t nsinv_t = block ? fp8_block_scale_count(FP8Q_WEIGHT, true, seg_len, C) : 1;
    PipelineResult res;

    // 1-2. the amax of every piece into one array (= the all-reduce max over the ranks)
    std::vector<size_t> cuts = cuts_of(M, cut_kind, seed);
    res.pieces = (long long)cuts.size() - 1;
    float* damax = deviceAlloc(float, G);
    cudaCheck(cudaMemset(damax, 0, G * sizeof(float)));
    for (size_t i = 0; i + 1 < cuts.size(); i++) fp8g_piece_amax_gpu(&M, cuts[i], cuts[i + 1], dx + (cuts[i] - M.off), damax, block);
    // 3. the scales: current and block on the device; delayed given by the host (the history's)
    float* dscale = dev_poisoned<float>(G);
    float* dinv = dev_poisoned<float>(G);
    std::vector<float> amax = get(damax, G);
    float given = fp8_scale_for(amax[M.group0], FP8_E4M3, 0) * 8.0f;
    if (rc == R_DELAYED) {
        float inv = 1.0f / given;
        cudaCheck(cudaMemcpy(dscale + M.group0, &given, 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dinv + M.group0, &inv, 4, cudaMemcpyHostToDevice));
    } else {
        fp8g_scales_gpu(damax + M.group0, dscale + M.group0, dinv + M.group0, M.groups, block ? 0 : kMargin);
    }
    if (fault == FAULT_SCALE_X2) {
        size_t g = M.group0 + M.groups / 2;
        float s = get(dscale + g, 1)[0] * 2.0f;
        cudaCheck(cudaMemcpy(dscale + g, &s, 4, cudaMemcpyHostToDevice));
    }
    // 4. every piece's codes at its place in the gathered buffer, the saturations summed
    __nv_fp8_storage_t* dq = dev_poisoned<__nv_fp8_storage_t>(n);
    unsigned long long* dsat = deviceAlloc(unsigned long long, 1);
    cudaCheck(cudaMemset(dsat, 0, 8));
    for (size_t i = 0; i + 1 < cuts.size(); i++)
        fp8g_piece_encode_gpu(&M, cuts[i], cuts[i + 1], dx + (cuts[i] - M.off), dscale, dq + (cuts[i] - M.off), dsat, block);
    // the gathered operand's factors, and the transposed copy for dgrad
    float* dsinv = dev_poisoned<float>(nsinv);
    fp8g_factors_gpu(&M, dinv, dsinv, block);
    __nv_fp8_storage_t* dqt = dev_poisoned<__nv_fp8_storage_t>(n);
    float* dsinv_t = dev_poisoned<float>(nsinv_t);
    if (fault == FAULT_FACTORS_NOT_REINDEXED) {
        fp8_transpose_gpu(dqt, nullptr, dq, nullptr, rows, C, M.seg_rows);
        cudaCheck(cudaMemcpy(dsinv_t, dsinv, std::min(nsinv, nsinv_t) * 4, cudaMemcpyDeviceToDevice));
    } else {
        fp8_transpose_gpu(dqt, block ? dsinv_t : nullptr, dq, block ? dsinv : nullptr, rows, C, M.seg_rows);
    }

    // the reference: fp8_quantize_gpu on the whole weight, as the GPU model quantises it (fp8_quantize_operand)
    Fp8QuantOut ref;
    ref.q = dev_poisoned<__nv_fp8_storage_t>(n);
    ref.qt = dev_poisoned<__nv_fp8_storage_t>(n);
    ref.sinv = dev_poisoned<float>(nsinv);
    ref.sinv_t = block ? dev_poisoned<float>(nsinv_t) : nullptr;
    ref.amax = deviceAlloc(unsigned int, 1);
    ref.saturated = deviceAlloc(unsigned long long, 1);
    cudaCheck(cudaMemset(ref.amax, 0, 4));
    cudaCheck(cudaMemset(ref.saturated, 0, 8));
    Fp8Segments seg = fp8_uniform_segments(sh.E, sh.F);
    float* dgiven = dev_copy(std::vector<float>{given});
    unsigned int* dtmp = deviceAlloc(unsigned int, 1);
    if (rc == R_BLOCK) {
        fp8_quantize_gpu(ref, dx, rows, C, seg, FP8_E4M3, FP8Q_WEIGHT, nullptr, nullptr, 0);
    } else if (rc == R_CURRENT) {
        cudaCheck(cudaMemset(dtmp, 0, 4));
        fp8_quantize_gpu({nullptr, nullptr, nullptr, nullptr, dtmp, nullptr}, dx, rows, C, seg, FP8_E4M3, FP8Q_AMAX, nullptr, nullptr, 0);
        fp8_quantize_gpu(ref, dx, rows, C, seg, FP8_E4M3, FP8Q_TENSOR, nullptr, dtmp, kMargin);
    } else {
        fp8_quantize_gpu(ref, dx, rows, C, seg, FP8_E4M3, FP8Q_TENSOR, dgiven, nullptr, 0);
    }

    res.bad_q = bytes_differ(get(dq, n), get(ref.q, n));
    res.bad_qt = bytes_differ(get(dqt, n), get(ref.qt, n));
    res.bad_sinv = bytes_differ(get(dsinv, nsinv), get(ref.sinv, nsinv));   // the padding: unwritten by both
    if (block) res.bad_sinv_t = bytes_differ(get(dsinv_t, nsinv_t), get(ref.sinv_t, nsinv_t));
    // the tensor's amax (what reaches the weight's slot) is the maximum of its groups'
    float tensor_amax = 0;
    for (size_t g = M.group0; g < G; g++) tensor_amax = std::fmax(tensor_amax, amax[g]);
    unsigned ref_amax = get(ref.amax, 1)[0];
    res.amax_equal = memcmp(&ref_amax, &tensor_amax, 4) == 0;
    res.sat = get(dsat, 1)[0];
    res.sat_equal = res.sat == get(ref.saturated, 1)[0];
    for (void* p : {(void*)dx, (void*)damax, (void*)dscale, (void*)dinv, (void*)dq, (void*)dsat, (void*)dsinv, (void*)dqt,
                    (void*)dsinv_t, (void*)ref.q, (void*)ref.qt, (void*)ref.sinv, (void*)ref.sinv_t, (void*)ref.amax,
                    (void*)ref.saturated, (void*)dgiven, (void*)dtmp})
        if (p) cudaCheck(cudaFree(p));
    return res;
}

TEST_CASE("gathered codes (BF16 values) + fp8g_factors_gpu = fp8_quantize_gpu's q and sinv; fp8_transpose_gpu = its qt and sinv_t") {
    uint64_t seed = 100;
    for (const Shape& sh : kShapes)
        for (Recipe rc : {R_DELAYED, R_CURRENT, R_BLOCK})
            for (int kind = 0; kind < 3; kind++) {
                PipelineResult r = run_pipeline(sh, rc, kind, ++seed, FAULT_NONE);
                INFO(sh.name << ", " << recipe_name(rc) << ", cuts " << kind << " (" << r.pieces << " pieces)");
                CHECK(r.bad_q == 0);
                CHECK(r.bad_sinv == 0);
                CHECK(r.bad_qt == 0);
                CHECK(r.bad_sinv_t == 0);
                CHECK(r.amax_equal);
                CHECK(r.sat_equal);
                CHECK((rc == R_DELAYED) == (r.sat > 0));
            }
}

TEST_CASE("negative controls: a wrong scale, transposed factors not re-indexed") {
    const Shape& sh = kShapes[0];
    PipelineResult wrong = run_pipeline(sh, R_BLOCK, 1, 7, FAULT_SCALE_X2);
    CHECK(wrong.bad_q > 0);       // the doubled group's codes differ ...
    CHECK(wrong.bad_qt > 0);
    CHECK(wrong.bad_sinv == 0);   // ... and only they: its factor is the agreed one
    PipelineResult wrong_t = run_pipeline(sh, R_DELAYED, 0, 8, FAULT_SCALE_X2);   // per tensor: every code, more saturated
    CHECK(wrong_t.bad_q > 0);
    CHECK(!wrong_t.sat_equal);
    PipelineResult flat = run_pipeline(sh, R_BLOCK, 0, 9, FAULT_FACTORS_NOT_REINDEXED);
    CHECK(flat.bad_q == 0);
    CHECK(flat.bad_qt == 0);
    CHECK(flat.bad_sinv_t > 0);
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "ZeRO-3 FP8 gather kernels", 20240901); }
