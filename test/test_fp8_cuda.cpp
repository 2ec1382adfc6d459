/*
 * test_fp8_cuda.cpp — FP8 on the CUDA backend, against the CPU reference (model/fp8.cuh, the CPU's
 * FP8 emulation in model/dbrx.h). One source, two builds: g++ -DSIMT_EMULATION (make test: the
 * kernels under the SIMT emulator, cuBLASLt by its twin) and nvcc (make test-gpu).
 *   - the quantisation kernel, per tensor: every FP8 code bit-exact with fp8_from_float(x * s) for
 *     the same BF16 input and scale (both formats, given scales and current scaling's own amax),
 *     the transposed copy the transpose of the codes, the amax exact, padding rows zero, the
 *     saturation count equal to the CPU's, the dequantisation factor 1 / s;
 *   - block scaling: the dequantised values equal the CPU's fake quantisation with the same tiles
 *     (fp8_fake_quant_tiles: 1x128 and 128x1 per expert segment, 128x128 weight blocks), and every
 *     tile's factor sits where cuBLASLt's VEC128 / BLK128x128 layouts put it (the layouts written
 *     out here from the documentation, not from the code under test);
 *   - the FP8 GEMM through the wrapper (the twin under emulation) against an FP64 GEMM of the
 *     dequantised operands: per tensor and block scales, E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3;
 *     and the calls cuBLASLt refuses fail with one line naming the operand: non-TN, E5M2 x E5M2,
 *     leading dimensions and alignment, 128x128 x 128x128, an outer size not a multiple of 8, an amax of a D not FP8;
 *   - the quantisation fused into SwiGLU forward / backward (model/fp8_fused.cuh) against the unfused
 *     kernels, bit for bit (codes, factors, amax, saturations, act), 16 uneven experts, a slice of F;
 *   - the quantisation fused into the experts' gather, of a BF16 tensor as it is and of a weight in blocks
 *     (fp8_gather_quantize_kernel) against moe_gather_gpu + fp8_quantize_kernel, bit for bit, a slice of d;
 *   - the padded expert layout (slot and row maps);
 *   - a training step of dbrx-tiny (2 layers, 2 x 32 tokens, router zeroed so that routing agrees
 *     exactly) with each recipe against the CPU's FP8 emulation of the same recipe; see the last
 *     test cases for the metric, its tolerance and the negative controls showing it can fail.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
#include "../model/dbrx_cuda.cuh"
#include "cuda_test_helpers.h"

// the emulated build (make test) or the device build (make test-gpu): a device's FP8 accumulation is not the twin's
#if defined(SIMT_EMULATION)
static const bool EMULATED_TEST = true;
#else
static const bool EMULATED_TEST = false;
#endif

static float bits_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }

// A BF16 test tensor (rows, cols) whose rows span many binades (so that block scales differ from
// tile to tile); `outliers` values 64x larger
static std::vector<float> test_tensor(int rows, int cols, uint64_t seed, int outliers) {
    std::vector<float> x = randn((size_t)rows * cols, seed);
    Rng r = {seed + 11};
    for (int i = 0; i < rows; i++) {
        float m = std::ldexp(1.0f, (int)(rng_u64(&r) % 13) - 6);
        for (int j = 0; j < cols; j++) x[(size_t)i * cols + j] *= m;
    }
    for (int i = 0; i < outliers; i++) x[rng_u64(&r) % x.size()] *= 64.0f;
    for (float& v : x) v = __bfloat162float(__float2bfloat16(v));
    return x;
}

// segments of a tensor's rows: padded lengths and valid rows (host)
struct Segs { std::vector<int> len, valid; };
static std::vector<int> starts_of(const Segs& s) {
    std::vector<int> st(1, 0);
    for (int l : s.len) st.push_back(st.back() + l);
    return st;
}

// the device form of the segments; uniform when every segment is full and of equal length
static Fp8Segments device_segments(const Segs& s, std::vector<int*>* keep) {
    std::vector<int> st = starts_of(s);
    int tiles = 0;
    for (int l : s.len) tiles += (l + 127) / 128;
    int* d_start = dev_copy(st);
    int* d_valid = dev_copy(s.valid);
    keep->push_back(d_start);
    keep->push_back(d_valid);
    return {d_start, d_valid, (int)s.len.size(), 0, tiles};
}

static float fp8_value(uint8_t code, Fp8Format f) { return fp8_to_float(code, f); }

struct Quantized { std::vector<uint8_t> q, qt; std::vector<float> sinv, sinv_t; float amax; unsigned long long sat; };

// runs the kernel in `mode` on x (rows, cols) with segments; scale: FP8Q_TENSOR's given scale (or
// < 0: current scaling with `margin`, a first FP8Q_AMAX pass)
static Quantized quantize(const std::vector<float>& x, int rows, int cols, const Segs& segs, Fp8Format fmt, Fp8QuantMode mode,
                          float scale, int margin, size_t nsinv, size_t nsinv_t) {
    std::vector<int*> keep;
    Fp8Segments seg = device_segments(segs, &keep);
    floatX* dx = deviceAlloc(floatX, x.size());
    to_device_bf16(dx, x.data(), x.size());
    Fp8QuantOut out;
    out.q = dev_poisoned<__nv_fp8_storage_t>(x.size());
    out.qt = dev_poisoned<__nv_fp8_storage_t>(x.size());
    out.sinv = dev_poisoned<float>(nsinv);
    out.sinv_t = dev_poisoned<float>(nsinv_t);
    out.amax = deviceAlloc(unsigned int, 1);
    out.saturated = deviceAlloc(unsigned long long, 1);
    cudaCheck(cudaMemset(out.amax, 0, 4));
    cudaCheck(cudaMemset(out.saturated, 0, 8));
    float* dscale = dev_copy(std::vector<float>{scale});
    unsigned* dtmp = deviceAlloc(unsigned int, 1);
    if (mode == FP8Q_TENSOR && scale < 0) {
        cudaCheck(cudaMemset(dtmp, 0, 4));
        fp8_quantize_gpu({nullptr, nullptr, nullptr, nullptr, dtmp, nullptr}, dx, rows, cols, seg, fmt, FP8Q_AMAX, nullptr, nullptr, 0);
        fp8_quantize_gpu(out, dx, rows, cols, seg, fmt, mode, nullptr, dtmp, margin);
    } else {
        fp8_quantize_gpu(out, dx, rows, cols, seg, fmt, mode, dscale, nullptr, 0);
    }
    Quantized r;
    std::vector<__nv_fp8_storage_t> q = get(out.q, x.size()), qt = get(out.qt, x.size());
    r.q.assign(q.begin(), q.end());
    r.qt.assign(qt.begin(), qt.end());
    r.sinv = get(out.sinv, nsinv);
    r.sinv_t = get(out.sinv_t, nsinv_t);
    r.amax = bits_float(get(out.amax, 1)[0]);
    r.sat = get(out.saturated, 1)[0];
    for (void* p : {(void*)dx, (void*)out.q, (void*)out.qt, (void*)out.sinv, (void*)out.sinv_t, (void*)out.amax,
                    (void*)out.saturated, (void*)dscale, (void*)dtmp})
        cudaCheck(cudaFree(p));
    for (int* p : keep) cudaCheck(cudaFree(p));
    return r;
}

static bool valid_row(const Segs& s, int row) {
    std::vector<int> st = starts_of(s);
    for (size_t i = 0; i < s.len.size(); i++)
        if (row >= st[i] && row < st[i + 1]) return row - st[i] < s.valid[i];
    return false;
}

struct Case { const char* name; int cols; Segs segs; };
static std::vector<Case> activation_cases() {
    return {{"one segment, 200 x 130 (partial tiles)", 130, {{200}, {200}}},
            {"expert segments, valid 5/0/37/131 of 16/0/48/144 rows, 96 cols", 96, {{16, 0, 48, 144}, {5, 0, 37, 131}}}};
}

TEST_CASE("quantize kernel, per tensor: codes bit-exact with fp8_from_float, transposed copy, amax, saturation, padding") {
    int seed = 0;
    for (const Case& cs : activation_cases())
        for (Fp8Format fmt : {FP8_E4M3, FP8_E5M2})
            for (int current = 0; current < 2; current++) {
                int rows = starts_of(cs.segs).back(), cols = cs.cols;
                std::vector<float> x = test_tensor(rows, cols, ++seed, 9);
                float amax = 0;
                for (int i = 0; i < rows; i++)
                    if (valid_row(cs.segs, i))
                        for (int j = 0; j < cols; j++) amax = std::fmax(amax, std::fabs(x[(size_t)i * cols + j]));
                // a given scale 16x too large saturates the outliers; current scaling uses its own amax, margin 1
                float s = current ? fp8_scale_for(amax, fmt, 1) : fp8_scale_for(amax, fmt, 0) * 16.0f;
                Quantized r = quantize(x, rows, cols, cs.segs, fmt, FP8Q_TENSOR, current ? -1.0f : s, 1, 1, 1);
                INFO(cs.name << ", format " << (int)fmt << (current ? ", current scaling" : ", given scale"));
                long long sat = 0, bad = 0, bad_t = 0;
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < cols; j++) {
                        bool v = valid_row(cs.segs, i);
                        float xs = x[(size_t)i * cols + j] * s;
                        uint8_t want = v ? fp8_from_float(xs, fmt) : 0;
                        sat += v && fp8_saturates(xs, fmt);
                        bad += r.q[(size_t)i * cols + j] != want;
                        bad_t += r.qt[(size_t)j * rows + i] != want;
                    }
                CHECK(bad == 0);
                CHECK(bad_t == 0);
                CHECK(r.amax == amax);
                CHECK(r.sinv[0] == 1.0f / s);
                CHECK(r.sat == (unsigned long long)sat);
                if (!current) CHECK(sat > 0);   // the given scale did saturate something
                else CHECK(sat == 0);           // current scaling with a margin never does
            }
    // the saturation bound: E4M3 clips above 464 (464 itself rounds to 448), E5M2 from 61440
    CHECK(!fp8_saturates(464.0f, FP8_E4M3));
    CHECK(fp8_saturates(std::nextafter(464.0f, 1e9f), FP8_E4M3));
    CHECK(!fp8_saturates(std::nextafter(61440.0f, 0.0f), FP8_E5M2));
    CHECK(fp8_saturates(-61440.0f, FP8_E5M2));
    CHECK(fp8_from_float(464.0f, FP8_E4M3) == 0x7E);
}

// the factor positions, from cuBLASLt's layouts (outer rows of k): VEC128 [(p/128) * outer + o];
// BLK128x128 [(o/128) * round_up(ceil(k/128), 4) + p/128]; segments one after another
static size_t vec128(int o, int p, int outer) { return (size_t)(p / 128) * outer + o; }
static size_t blk128(int o, int p, int k) { return (size_t)(o / 128) * (((k + 127) / 128 + 3) / 4 * 4) + p / 128; }
static size_t vec128_count(int outer, int k) { return (size_t)((k + 127) / 128) * outer; }
static size_t blk128_count(int outer, int k) { return (size_t)((outer + 127) / 128) * (((k + 127) / 128 + 3) / 4 * 4); }

// The condition of the NaN gradient under --fp8 block (model/fp8.cuh, fp8_scale_for): an expert with one
// routed token, padded to 16 rows, whose gradient row is tiny (below max / FLT_MAX). Its 128 x 1 tiles (wgrad's
// qt) and its 1 x 128 tile (q) have an amax whose plain scale overflows; the padding rows are zeros in the same
// tiles. Uncapped, the codes of the zeros were NaN (0 * inf) and the factors 0: a NaN in the GEMM. Now every code
// is finite, every factor finite and positive, and the dequantised values are the CPU's fake quantisation.
TEST_CASE("quantize kernel, block scaling: a tiny-amax tile of an expert with one token gives no NaN code or zero factor") {
    for (Fp8Format fmt : {FP8_E4M3, FP8_E5M2}) {
        const int cols = 128;
        Segs segs = {{16, 16}, {1, 16}};   // expert 0: one token (tiny), expert 1: 16 ordinary tokens
        int rows = 32;
        float tiny = fmt == FP8_E4M3 ? 1e-37f : 1e-35f;
        std::vector<float> x = test_tensor(rows, cols, 77, 0);
        for (int j = 0; j < cols; j++) x[j] = __bfloat162float(__float2bfloat16(tiny * (1.0f + j % 5) * (j % 2 ? -1 : 1)));
        for (int i = 1; i < 16; i++)
            for (int j = 0; j < cols; j++) x[(size_t)i * cols + j] = 1e9f;   // padding rows: never read (quantised as zeros)
        size_t nq = 2 * vec128_count(16, cols), nt = 2 * vec128_count(cols, 16);
        Quantized r = quantize(x, rows, cols, segs, fmt, FP8Q_ACT, 0, 0, nq, nt);
        INFO("format " << (int)fmt);
        std::vector<real> in(x.begin(), x.begin() + cols), fq(cols), fqt(cols);
        fp8_fake_quant_tiles(fq.data(), in.data(), 1, cols, cols, 1, 128, fmt);
        fp8_fake_quant_tiles(fqt.data(), in.data(), 1, cols, cols, 128, 1, fmt);
        long long nan = 0, bad_f = 0, bad = 0;
        for (size_t i = 0; i < r.q.size(); i++) nan += !std::isfinite(fp8_value(r.q[i], fmt)) + !std::isfinite(fp8_value(r.qt[i], fmt));
        for (float f : r.sinv) bad_f += !(f > 0 && std::isfinite(f));
        for (float f : r.sinv_t) bad_f += !(f > 0 && std::isfinite(f));
        for (int i = 0; i < 16; i++)   // expert 0: the token's row as the CPU quantises it, the padding zeros
            for (int j = 0; j < cols; j++) {
                float got = fp8_value(r.q[(size_t)i * cols + j], fmt) * r.sinv[vec128(i, j, 16)];
                float got_t = fp8_value(r.qt[(size_t)j * rows + i], fmt) * r.sinv_t[vec128(j, i, cols)];
                bad += got != (i ? 0.0f : (float)fq[j]);
                bad += got_t != (i ? 0.0f : (float)fqt[j]);
            }
        CHECK(nan == 0);
        CHECK(bad_f == 0);
        CHECK(bad == 0);
        CHECK(r.sat == 0);
    }
}

TEST_CASE("quantize kernel, block scaling: the CPU's fake quantisation, factors in cuBLASLt's layouts") {
    int seed = 100;
    // activations and gradients: q in 1x128 tiles, qt in 128x1 tiles, per segment
    for (const Case& cs : activation_cases())
        for (Fp8Format fmt : {FP8_E4M3, FP8_E5M2}) {
            int rows = starts_of(cs.segs).back(), cols = cs.cols;
            std::vector<int> st = starts_of(cs.segs);
            size_t nq = 0, nt = 0;
            for (int l : cs.segs.len) { nq += vec128_count(l, cols); nt += vec128_count(cols, l); }
            std::vector<float> x = test_tensor(rows, cols, ++seed, 5);
            Quantized r = quantize(x, rows, cols, cs.segs, fmt, FP8Q_ACT, 0, 0, nq, nt);
            INFO(cs.name << ", format " << (int)fmt);
            // the CPU reference on every segment's valid rows: 1x128 and 128x1 tiles
            size_t bq = 0, bt = 0;
            long long bad = 0, bad_t = 0, bad_s = 0, bad_st = 0;
            for (size_t sg = 0; sg < cs.segs.len.size(); sg++) {
                int r0 = st[sg], len = cs.segs.len[sg], nv = cs.segs.valid[sg];
                std::vector<real> in(x.begin() + (size_t)r0 * cols, x.begin() + (size_t)(r0 + nv) * cols);
                std::vector<real> fq((size_t)nv * cols), fqt((size_t)nv * cols);
                fp8_fake_quant_tiles(fq.data(), in.data(), nv, cols, cols, 1, 128, fmt);
                fp8_fake_quant_tiles(fqt.data(), in.data(), nv, cols, cols, 128, 1, fmt);
                for (int i = 0; i < len; i++)
                    for (int j = 0; j < cols; j++) {
                        float sq = r.sinv[bq + vec128(i, j, len)], stt = r.sinv_t[bt + vec128(j, i, cols)];
                        float got = fp8_value(r.q[(size_t)(r0 + i) * cols + j], fmt) * sq;
                        float got_t = fp8_value(r.qt[(size_t)j * rows + r0 + i], fmt) * stt;
                        bool v = i < nv;
                        bad += got != (v ? (float)fq[(size_t)i * cols + j] : 0.0f);
                        bad_t += got_t != (v ? (float)fqt[(size_t)i * cols + j] : 0.0f);
                        // the factor is the tile's: 1 / fp8_scale_for(tile amax)
                        float ta = 0, tb = 0;
                        for (int jj = j / 128 * 128; jj < std::min(cols, j / 128 * 128 + 128); jj++)
                            if (v) ta = std::fmax(ta, std::fabs(x[(size_t)(r0 + i) * cols + jj]));
                        for (int ii = i / 128 * 128; ii < std::min(nv, i / 128 * 128 + 128); ii++)
                            tb = std::fmax(tb, std::fabs(x[(size_t)(r0 + ii) * cols + j]));
                        bad_s += sq != 1.0f / fp8_scale_for(ta, fmt, 0);
                        bad_st += stt != 1.0f / fp8_scale_for(tb, fmt, 0);
                    }
                bq += vec128_count(len, cols);
                bt += vec128_count(cols, len);
            }
            CHECK(bad == 0);
            CHECK(bad_t == 0);
            CHECK(bad_s == 0);
            CHECK(bad_st == 0);
            float amax = 0;
            for (int i = 0; i < rows; i++)
                if (valid_row(cs.segs, i))
                    for (int j = 0; j < cols; j++) amax = std::fmax(amax, std::fabs(x[(size_t)i * cols + j]));
            CHECK(r.amax == amax);
        }
    // weights: 128x128 blocks of every expert's (F, C) matrix, q and qt alike
    for (auto shape : {std::vector<int>{1, 200, 130}, {2, 224, 160}}) {
        int E = shape[0], F = shape[1], C = shape[2], rows = E * F;
        Segs segs{std::vector<int>(E, F), std::vector<int>(E, F)};
        size_t nq = E * blk128_count(F, C), nt = E * blk128_count(C, F);
        std::vector<float> x = test_tensor(rows, C, ++seed, 3);
        Quantized r = quantize(x, rows, C, segs, FP8_E4M3, FP8Q_WEIGHT, 0, 0, nq, nt);
        long long bad = 0, bad_t = 0;
        for (int e = 0; e < E; e++) {
            std::vector<real> in(x.begin() + (size_t)e * F * C, x.begin() + (size_t)(e + 1) * F * C), fq((size_t)F * C);
            fp8_fake_quant_tiles(fq.data(), in.data(), F, C, C, 128, 128, FP8_E4M3);
            for (int i = 0; i < F; i++)
                for (int j = 0; j < C; j++) {
                    float got = fp8_value(r.q[(size_t)(e * F + i) * C + j], FP8_E4M3) * r.sinv[e * blk128_count(F, C) + blk128(i, j, C)];
                    float got_t = fp8_value(r.qt[(size_t)j * rows + e * F + i], FP8_E4M3) * r.sinv_t[e * blk128_count(C, F) + blk128(j, i, F)];
                    bad += got != (float)fq[(size_t)i * C + j];
                    bad_t += got_t != (float)fq[(size_t)i * C + j];
                }
        }
        INFO("weights: " << E << " x (" << F << ", " << C << ")");
        CHECK(bad == 0);
        CHECK(bad_t == 0);
    }
}

// ---------------------------------------------------------------------------------------------
// the GEMM

// random FP8 codes (finite) of a format
static std::vector<uint8_t> random_codes(size_t n, Fp8Format f, uint64_t seed) {
    Rng r = {seed};
    std::vector<uint8_t> c(n);
    for (uint8_t& v : c) {
        do v = (uint8_t)(rng_u64(&r) & 0xFF);
        while (!std::isfinite(fp8_to_float(v, f)) || std::fabs(fp8_to_float(v, f)) > (f == FP8_E4M3 ? 64 : 1024));
    }
    return c;
}
static std::vector<float> random_factors(size_t n, uint64_t seed) {
    std::vector<float> v = randn(n, seed);
    for (float& x : v) x = std::ldexp(1.0f + std::fabs(x), (int)(std::fabs(x) * 4) - 6);   // positive, several binades
    return v;
}

struct GemmCase { Fp8Format fa, fb; int mode_a, mode_b; };

// The accumulation error a GEMM may have on the device, per output, in units of |products| (dequantised):
// FP32 sums over K <= 384 terms (4e-5 of sum |x y|), plus the tensor core's 14-bit accumulator
// (test/simt/cublaslt_twin.h's model: after every k-step of 32 the running sum truncated to 14
// significant bits, an error <= 2^-13 of the running sum of |products|, and as much again for the
// alignment of the step's products inside the tensor core, so 2^-12 per step). FAST_ACCUM keeps one
// running sum over all of k; per-tensor scaling without it promotes the sum to FP32 every 128, so the
// running sum restarts at every chunk. Block scales are bounded as one running sum too: on an H200
// (cuBLASLt 13.0, 2026-11-26, dev/bench/results_gpu.md) VEC128 x BLK128 and VEC128 x VEC128 GEMMs of
// 136 x 40 x 272 erred up to 1.22 x the promoted bound (about 0.6 x this one), the per-tensor ones within it; on an
// H100 (2026-11-27) a BLK128 x VEC128 GEMM of that shape erred 1.21 x this one: on a device the per-step term is
// taken twice as large (2^-11; the emulator keeps the twin's model, 2^-12).
// prod: the K dequantised products of one output; unpromoted: no restart every 128.
static double accumulation_bound(const std::vector<double>& prod, bool unpromoted) {
    double mag = 0, steps = 0, run = 0;
    for (size_t p = 0; p < prod.size(); p++) {
        mag += std::fabs(prod[p]);
        if (!unpromoted && p % 128 == 0) run = 0;
        run += std::fabs(prod[p]);
        if ((p + 1) % 32 == 0 || p + 1 == prod.size()) steps += run;   // the running sum after each step
    }
    return mag * 4e-5 + steps * std::ldexp(1.0, EMULATED_TEST ? -12 : -11);
}

// C (M, N) = A (M, K) @ B (N, K)^T, row-major, through gemm_fp8_gpu (the wrapper), against FP64 on
// the dequantised operands (dequantised here from the documented layouts). Returns how many outputs are
// out of bounds. Negative controls: want_factor != 1 checks against a result scaled by it (what a wrong
// scale in the code would give); fp32_bound: the bound of exact FP32 accumulation, without the tensor
// core's 14-bit terms (FAST_ACCUM's error must exceed it somewhere).
static long long check_fp8_gemm(const GemmCase& g, int M, int N, int K, bool fp32_out, int fast, uint64_t seed,
                                double want_factor = 1.0, bool fp32_bound = false) {
    std::vector<uint8_t> a = random_codes((size_t)M * K, g.fa, seed), b = random_codes((size_t)N * K, g.fb, seed + 1);
    auto nfac = [&](int mode, int outer) {
        return mode == MATMUL_SCALE_TENSOR ? 1 : mode == MATMUL_SCALE_VEC128 ? vec128_count(outer, K) : blk128_count(outer, K);
    };
    auto factor = [&](const std::vector<float>& s, int mode, int o, int p, int outer) {
        return mode == MATMUL_SCALE_TENSOR ? s[0] : mode == MATMUL_SCALE_VEC128 ? s[vec128(o, p, outer)] : s[blk128(o, p, K)];
    };
    std::vector<float> sa = random_factors(nfac(g.mode_a, M), seed + 2), sb = random_factors(nfac(g.mode_b, N), seed + 3);
    std::vector<float> c0 = randn((size_t)M * N, seed + 4);
    float alpha = 0.75f, beta = fp32_out ? 1.0f : 0.0f;
    bool fast_used = fast && g.mode_a == MATMUL_SCALE_TENSOR;   // gemm_fp8_gpu drops FAST_ACCUM for block scales
    std::vector<double> want((size_t)M * N), bound((size_t)M * N), prod(K);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0, mag = 0;
            for (int p = 0; p < K; p++) {
                double x = (double)fp8_to_float(a[(size_t)i * K + p], g.fa) * factor(sa, g.mode_a, i, p, M);
                double y = (double)fp8_to_float(b[(size_t)j * K + p], g.fb) * factor(sb, g.mode_b, j, p, N);
                prod[p] = x * y;
                acc += x * y;
                mag += std::fabs(x * y);
            }
            want[(size_t)i * N + j] = want_factor * alpha * acc + beta * c0[(size_t)i * N + j];
            bound[(size_t)i * N + j] = std::fabs(alpha) * (fp32_bound ? mag * 4e-5 : accumulation_bound(prod, fast_used || g.mode_a != MATMUL_SCALE_TENSOR)) + 1e-30;
        }
    uint8_t* da = dev_copy(a);
    uint8_t* db = dev_copy(b);
    float *dsa = dev_copy(sa), *dsb = dev_copy(sb);
    Fp8GemmOperand A = {da, g.fa == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2, K, dsa, g.mode_a, "a_test"};
    Fp8GemmOperand B = {db, g.fb == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2, K, dsb, g.mode_b, "b_test"};
    std::vector<float> got;
    if (fp32_out) {
        float* dc = dev_copy(c0);
        gemm_fp8_gpu(M, N, K, alpha, A, B, beta, dc, N, fast);
        got = get(dc, c0.size());
        cudaCheck(cudaFree(dc));
    } else {
        floatX* dc = dev_poisoned<floatX>(c0.size());   // beta 0: the old values are never read
        gemm_fp8_gpu(M, N, K, alpha, A, B, beta, dc, N, fast);
        std::vector<floatX> h = get(dc, c0.size());
        for (floatX v : h) got.push_back(__bfloat162float(v));
        cudaCheck(cudaFree(dc));
    }
    long long bad = 0;
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++) {
        double lim = bound[i] + (fp32_out ? 0 : std::fabs(want[i]) * std::ldexp(1.0, -8));   // BF16 output rounding
        double err = std::fabs(got[i] - want[i]);
        bad += !(err <= lim);
        worst = std::max(worst, err / lim);
    }
    if (want_factor == 1.0 && !fp32_bound) {
        INFO("A " << (int)g.fa << " scale mode " << g.mode_a << ", B " << (int)g.fb << " scale mode " << g.mode_b << ", " << M << " x " << N
                  << " x " << K << std::string(fp32_out ? ", fp32 out, beta 1" : ", bf16 out") << std::string(fast_used ? ", FAST_ACCUM" : "")
                  << ": worst error " << worst << " of the bound");
        CHECK(bad == 0);
    }
    for (void* p : {(void*)da, (void*)db, (void*)dsa, (void*)dsb}) cudaCheck(cudaFree(p));
    return bad;
}

TEST_CASE("FP8 GEMM (wrapper + twin) against FP64 on the dequantised operands: per-tensor and block scales, all type pairs") {
    uint64_t seed = 500;
    const int T = MATMUL_SCALE_TENSOR, V = MATMUL_SCALE_VEC128, Bk = MATMUL_SCALE_BLK128;
    for (auto types : {std::pair<Fp8Format, Fp8Format>{FP8_E4M3, FP8_E4M3}, {FP8_E4M3, FP8_E5M2}, {FP8_E5M2, FP8_E4M3}})
        for (auto modes : {std::pair<int, int>{T, T}, {V, Bk}, {Bk, V}, {V, V}})
            for (auto shape : {std::vector<int>{48, 64, 384}, {136, 40, 272}})
                for (int fp32 = 0; fp32 < 2; fp32++)
                    for (int fast = 0; fast < 2; fast++)
                        check_fp8_gemm({types.first, types.second, modes.first, modes.second}, shape[0], shape[1], shape[2], fp32, fast, ++seed);
}

TEST_CASE("FP8 GEMM bounds catch a wrong scale; FAST_ACCUM's reduced accumulator exceeds the FP32 bound (twin and device)") {
    const int T = MATMUL_SCALE_TENSOR, V = MATMUL_SCALE_VEC128, Bk = MATMUL_SCALE_BLK128;
    // a result off by a factor (a scale applied twice, a missing chunk factor, a wrong format's scale: all far
    // larger) fails the FAST_ACCUM bound and the promoted one; the smallest factor the bound catches somewhere
    for (double f : {1.25, 1.0 + 1.0 / 64}) {
        INFO("result scaled by " << f);
        CHECK(check_fp8_gemm({FP8_E4M3, FP8_E4M3, T, T}, 48, 64, 384, true, 1, 901, f) > 0);
        CHECK(check_fp8_gemm({FP8_E4M3, FP8_E4M3, T, T}, 48, 64, 384, false, 1, 902, f) > 0);
        CHECK(check_fp8_gemm({FP8_E5M2, FP8_E4M3, V, Bk}, 136, 40, 272, true, 0, 903, f) > 0);
    }
    // the twin models FAST_ACCUM: with it the error exceeds what FP32 accumulation allows in some outputs,
    // without it never (the twin sums in FP32). On the device both counts are printed, not checked: they
    // measure the real accumulator (FAST_ACCUM's count > 0 confirms the reduced precision).
    long long fast_over = check_fp8_gemm({FP8_E4M3, FP8_E4M3, T, T}, 48, 64, 384, true, 1, 904, 1.0, true);
    long long promoted_over = check_fp8_gemm({FP8_E4M3, FP8_E4M3, T, T}, 48, 64, 384, true, 0, 904, 1.0, true);
    MESSAGE("outputs (of 3072) over the FP32-accumulation bound: FAST_ACCUM " << fast_over << ", promoted " << promoted_over);
#ifdef SIMT_EMULATION
    CHECK(fast_over > 0);
    CHECK(promoted_over == 0);
#endif
}

// runs fn in a child process; returns its stderr and exit code (the wrapper's failures exit)
static std::string run_child(const std::function<void()>& fn, int* code) {
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        fn();
        _exit(0);
    }
    close(fd[1]);
    std::string out;
    char buf[512];
    ssize_t n;
    while ((n = read(fd[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)n);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

TEST_CASE("FP8 GEMM: the calls cuBLASLt refuses fail in emulation too, with one line naming the operand") {
    const int M = 32, N = 48, K = 64;
    uint8_t* da = dev_copy(random_codes((size_t)M * K + 64, FP8_E4M3, 1));
    uint8_t* db = dev_copy(random_codes((size_t)N * K + 64, FP8_E4M3, 2));
    float* ds = dev_copy(std::vector<float>(1024, 1.0f));
    float* dc = deviceAlloc(float, (size_t)M * N + 16);
    struct Bad { const char* what; std::function<void()> call; const char* expect; };
    auto op = [&](const void* p, cudaDataType_t t, int ld, int mode, const char* name) { return Fp8GemmOperand{p, t, ld, ds, mode, name}; };
    const int V = MATMUL_SCALE_VEC128, Bk = MATMUL_SCALE_BLK128, T = MATMUL_SCALE_TENSOR;
    std::vector<Bad> bad = {
        {"a non-TN FP8 call", [&] {
             MatmulOptions o = {ds, ds, nullptr, nullptr, 0, T, T, "blocks.0.qkv.w", "blocks.0.qkv.x"};
             matmul_cublaslt(false, false, M, N, K, 1.0f, da, CUDA_R_8F_E4M3, M, 0, db, CUDA_R_8F_E4M3, K, 0, 0.0f, dc, CUDA_R_32F, M, 0, 1,
                             &o, 0, __FILE__, __LINE__);
         }, "only the TN layout"},
        {"E5M2 x E5M2", [&] { gemm_fp8_gpu(M, N, K, 1.0f, op(da, CUDA_R_8F_E5M2, K, T, "dy"), op(db, CUDA_R_8F_E5M2, K, T, "dy2"), 0.0f, dc, N, 0); },
         "E5M2 x E5M2 is not supported"},
        {"a leading dimension not a multiple of 16", [&] { gemm_fp8_gpu(M, N, K, 1.0f, op(da, CUDA_R_8F_E4M3, K + 8, T, "blocks.1.w1.x"), op(db, CUDA_R_8F_E4M3, K, T, "w"), 0.0f, dc, N, 0); },
         "'blocks.1.w1.x' (e4m3"},
        {"a reduction not a multiple of 16", [&] { gemm_fp8_gpu(M, N, K - 8, 1.0f, op(da, CUDA_R_8F_E4M3, K, T, "x"), op(db, CUDA_R_8F_E4M3, K, T, "w"), 0.0f, dc, N, 0); },
         "k 56 and the leading dimension must be multiples of 16"},
        {"an operand not 16-byte aligned", [&] { gemm_fp8_gpu(M, N, K, 1.0f, op(da + 8, CUDA_R_8F_E4M3, K, T, "x_misaligned"), op(db, CUDA_R_8F_E4M3, K, T, "w"), 0.0f, dc, N, 0); },
         "'x_misaligned' (e4m3, 32 x 64"},
        {"128x128 x 128x128", [&] { gemm_fp8_gpu(M, N, K, 1.0f, op(da, CUDA_R_8F_E4M3, K, Bk, "x"), op(db, CUDA_R_8F_E4M3, K, Bk, "w"), 0.0f, dc, N, 0); },
         "both in 128x128 blocks"},
        {"per tensor x block", [&] { gemm_fp8_gpu(M, N, K, 1.0f, op(da, CUDA_R_8F_E4M3, K, T, "x"), op(db, CUDA_R_8F_E4M3, K, V, "w"), 0.0f, dc, N, 0); },
         "both per tensor, or both block-scaled"},
        {"1x128 tiles with an outer size not a multiple of 8", [&] { gemm_fp8_gpu(M - 4, N, K, 1.0f, op(da, CUDA_R_8F_E4M3, K, V, "tokens_x"), op(db, CUDA_R_8F_E4M3, K, Bk, "w"), 0.0f, dc, N, 0); },
         "'tokens_x' (e4m3, 28 x 64"},
        {"a scale pointer not 16-byte aligned", [&] {   // (an H100's cuBLASLt refused one 4 bytes off: NOT_SUPPORTED)
             gemm_fp8_gpu(M, N, K, 1.0f, op(da, CUDA_R_8F_E4M3, K, T, "x"), Fp8GemmOperand{db, CUDA_R_8F_E4M3, K, ds + 1, T, "w_scale_off"},
                          0.0f, dc, N, 0);
         }, "scale pointer of 'w_scale_off' (e4m3, 48 x 64"},
        {"an amax of a D that is not FP8", [&] {   // (an H100's cuBLASLt refused it at the heuristic: INVALID_VALUE)
             MatmulOptions o = {ds, ds, nullptr, ds + 16, 0, T, T, "x", "w"};
             matmul_cublaslt(true, false, N, M, K, 1.0f, db, CUDA_R_8F_E4M3, K, 0, da, CUDA_R_8F_E4M3, K, 0, 0.0f, dc, CUDA_R_32F, N, 0, 1,
                             &o, 0, __FILE__, __LINE__);
         }, "cuBLASLt computes amax for an FP8 D only"},
    };
    for (const Bad& b : bad) {
        int code = 0;
        std::string err = run_child(b.call, &code);
        INFO(b.what << ": exit " << code << ", stderr: " << err);
        CHECK(code == EXIT_RUNTIME);
        CHECK(err.find(b.expect) != std::string::npos);
        CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    }
    // and the good call of the same operands goes through
    gemm_fp8_gpu(M, N, K, 1.0f, op(da, CUDA_R_8F_E4M3, K, T, "x"), op(db, CUDA_R_8F_E4M3, K, T, "w"), 0.0f, dc, N, 0);
    for (void* p : {(void*)da, (void*)db, (void*)ds, (void*)dc}) cudaCheck(cudaFree(p));
}

TEST_CASE("the padded expert layout: slot and row maps") {
    // 4 experts with 5, 0, 17, 16 routed rows -> padded 16, 0, 32, 16
    std::vector<int> off = {0, 5, 5, 22, 38};
    int R = 38, E = 4;
    std::vector<int> slot_row(R), row_token(R);
    for (int s = 0; s < R; s++) slot_row[s] = (s * 7) % R;   // a permutation
    for (int r = 0; r < R; r++) row_token[r] = 100 + r;
    Fp8GPU f;
    f.routing.resize(1);
    f.routing[0].seg = deviceAlloc(int, 2 * E + 1);
    f.routing[0].row_token = dev_poisoned<int>(R + 15 * E);
    int *d_slot = dev_copy(slot_row), *d_tok = dev_copy(row_token), *d_off = dev_copy(off);
    const int* d_pad = fp8_pad_routing(&f, 0, d_slot, d_tok, d_off, off.data(), R, E);
    std::vector<int> poff = {0, 16, 16, 48, 64};
    CHECK(f.routing[0].poff == poff);
    CHECK(f.routing[0].row_tiles == 3);
    std::vector<int> got_slot = get(d_slot, R), got_tok = get(d_pad, 64);
    for (int s = 0; s < R; s++) {
        int r = slot_row[s], e = 0;
        while (off[e + 1] <= r) e++;
        CHECK(got_slot[s] == r - off[e] + poff[e]);
        CHECK(got_tok[got_slot[s]] == 100 + r);   // the padded row holds the same token
    }
    for (int e = 0; e < E; e++)
        for (int p = poff[e] + off[e + 1] - off[e]; p < poff[e + 1]; p++) CHECK(got_tok[p] == 0);   // padding: token 0
    for (void* p : {(void*)f.routing[0].seg, (void*)f.routing[0].row_token, (void*)d_slot, (void*)d_tok, (void*)d_off}) cudaCheck(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------
// the quantisation fused into SwiGLU (model/fp8_fused.cuh) against the unfused kernels: swiglu_*_gpu, then
// fp8_quantize_kernel on their BF16 output (itself checked against the CPU above). 16 experts with uneven padded
// segments (empty ones too; valid rows < padded), a 272-column slice of DBRX's F = 10752 (two full column tiles and
// a 16-wide one), inputs spanning many binades with outliers. Every code (padding rows included), factor, amax,
// saturation count and the forward's BF16 act: equal bit for bit. The backward with and without its third output
// (act recomputed, E4M3, as the model's w2 wgrad operand).

struct FusedOuts { Quantized r[3]; };

// runs the fused kernel of `prod` in `mode` (FP8Q_TENSOR: scale[i] given, or < 0: current scaling with margin 1,
// a first FP8Q_AMAX pass); y: SWIGLU_FWD's BF16 output (or NULL); act3: SWIGLU_BWD's third output (E4M3)
static FusedOuts run_fused(Fp8Producer prod, Fp8ProducerArgs p, int rows, int cols, const Segs& segs, Fp8Format fmt, Fp8QuantMode mode,
                           const float* scale, size_t nq, size_t nt, bool act3) {
    const int nout = prod == FP8P_SWIGLU_BWD ? (act3 ? 3 : 2) : 1;
    std::vector<int*> keep;
    Fp8Segments seg = device_segments(segs, &keep);
    size_t n = (size_t)rows * cols;
    Fp8FusedOut o[3] = {}, a[3] = {};
    unsigned* tmp = deviceAlloc(unsigned int, 3);
    cudaCheck(cudaMemset(tmp, 0, 12));
    std::vector<void*> bufs = {tmp};
    for (int i = 0; i < nout; i++) {
        bool per_tensor = mode == FP8Q_TENSOR;
        o[i].out = {dev_poisoned<__nv_fp8_storage_t>(n), dev_poisoned<__nv_fp8_storage_t>(n), dev_poisoned<float>(per_tensor ? 1 : nq),
                    per_tensor ? nullptr : dev_poisoned<float>(nt), deviceAlloc(unsigned int, 1), deviceAlloc(unsigned long long, 1)};
        cudaCheck(cudaMemset(o[i].out.amax, 0, 4));
        cudaCheck(cudaMemset(o[i].out.saturated, 0, 8));
        if (per_tensor && scale[i] >= 0) o[i].scale = dev_copy(std::vector<float>{scale[i]});
        if (per_tensor && scale[i] < 0) o[i].amax_in = tmp + i;
        a[i].out.amax = tmp + i;
        for (const void* b : {(const void*)o[i].out.q, (const void*)o[i].out.qt, (const void*)o[i].out.sinv, (const void*)o[i].out.sinv_t,
                              (const void*)o[i].out.amax, (const void*)o[i].out.saturated, (const void*)o[i].scale})
            bufs.push_back((void*)b);
    }
    if (mode == FP8Q_TENSOR && scale[0] < 0)
        fp8_fused_quantize_gpu(prod, p, rows, cols, seg, fmt, FP8Q_AMAX, 0, a[0], a[1], 0, act3 ? &a[2] : nullptr, FP8_E4M3);
    fp8_fused_quantize_gpu(prod, p, rows, cols, seg, fmt, mode, 1, o[0], o[1], 0, act3 ? &o[2] : nullptr, FP8_E4M3);
    FusedOuts r;
    for (int i = 0; i < nout; i++) {
        std::vector<__nv_fp8_storage_t> q = get(o[i].out.q, n), qt = get(o[i].out.qt, n);
        r.r[i].q.assign(q.begin(), q.end());
        r.r[i].qt.assign(qt.begin(), qt.end());
        r.r[i].sinv = get(o[i].out.sinv, mode == FP8Q_TENSOR ? 1 : nq);
        if (mode != FP8Q_TENSOR) r.r[i].sinv_t = get(o[i].out.sinv_t, nt);
        r.r[i].amax = bits_float(get(o[i].out.amax, 1)[0]);
        r.r[i].sat = get(o[i].out.saturated, 1)[0];
    }
    for (void* b : bufs) if (b) cudaCheck(cudaFree(b));
    for (int* k : keep) cudaCheck(cudaFree(k));
    return r;
}

TEST_CASE("quantize kernel, fused into SwiGLU forward and backward: bit-identical with the unfused kernels, 16 experts") {
    Segs segs{{16, 0, 144, 32, 0, 160, 16, 48, 0, 128, 16, 32, 0, 16, 64, 16}, {5, 0, 137, 32, 0, 129, 1, 40, 0, 128, 16, 17, 0, 3, 64, 9}};
    int rows = starts_of(segs).back(), cols = 272;
    size_t n = (size_t)rows * cols, nq = 0, nt = 0;
    for (int l : segs.len) { nq += vec128_count(l, cols); nt += vec128_count(cols, l); }
    std::vector<float> g = test_tensor(rows, cols, 901, 40), u = test_tensor(rows, cols, 902, 40), da = test_tensor(rows, cols, 903, 40);
    floatX *dg_in = deviceAlloc(floatX, n), *du_in = deviceAlloc(floatX, n), *dda = deviceAlloc(floatX, n);
    to_device_bf16(dg_in, g.data(), n);
    to_device_bf16(du_in, u.data(), n);
    to_device_bf16(dda, da.data(), n);
    // the unfused path's BF16 outputs: act (forward), dg, du (backward)
    floatX *act = dev_poisoned<floatX>(n), *gr = dev_poisoned<floatX>(2 * n), *act_fused = dev_poisoned<floatX>(n);
    swiglu_forward_gpu(act, dg_in, du_in, n);
    swiglu_backward_gpu(gr, gr + n, dda, dg_in, du_in, n);
    std::vector<float> ref[3] = {get_bf16(act, n), get_bf16(gr, n), get_bf16(gr + n, n)};
    std::vector<int> lens(segs.len);
    CHECK(fp8_fused_ok(rows, cols, lens, {act, dg_in}));
    CHECK(!fp8_fused_ok(rows, cols + 8, lens, {act}));            // 8 columns: no 16-byte code stores
    CHECK(!fp8_fused_ok(rows, cols, {8, 8}, {act}));              // a segment of 8 rows
    CHECK(!fp8_fused_ok(rows, cols, lens, {(const char*)act + 2}));   // unaligned
    for (Fp8QuantMode mode : {FP8Q_ACT, FP8Q_TENSOR})
        for (int current = 0; current < (mode == FP8Q_TENSOR ? 2 : 1); current++)
            for (int variant = 0; variant < 3; variant++) {   // forward; backward; backward with act
                const int bwd = variant > 0, nout = variant + 1;
                Fp8Format fmts[3] = {bwd ? FP8_E5M2 : FP8_E4M3, FP8_E5M2, FP8_E4M3};   // the model's: x E4M3, dy E5M2
                const std::vector<float>* refs[3] = {&ref[bwd], &ref[2], &ref[0]};   // act / dg, du, act
                float scale[3];
                for (int i = 0; i < nout; i++) {   // a given scale 16x too large saturates the outliers
                    float amax = 0;
                    for (int r = 0; r < rows; r++)
                        if (valid_row(segs, r))
                            for (int c = 0; c < cols; c++) amax = std::fmax(amax, std::fabs((*refs[i])[(size_t)r * cols + c]));
                    scale[i] = current ? -1.0f : fp8_scale_for(amax, fmts[i], 0) * 16.0f;
                }
                Fp8ProducerArgs p = bwd ? Fp8ProducerArgs{dda, dg_in, du_in, nullptr, nullptr} : Fp8ProducerArgs{dg_in, du_in, nullptr, act_fused, nullptr};
                FusedOuts got = run_fused(bwd ? FP8P_SWIGLU_BWD : FP8P_SWIGLU_FWD, p, rows, cols, segs, fmts[0], mode, scale, nq, nt, variant == 2);
                for (int i = 0; i < nout; i++) {
                    INFO("variant " << variant << ", output " << i << ", mode " << (int)mode << (current ? ", current" : ""));
                    Quantized want = quantize(*refs[i], rows, cols, segs, fmts[i], mode, scale[i], 1, mode == FP8Q_TENSOR ? 1 : nq,
                                              mode == FP8Q_TENSOR ? 1 : nt);
                    CHECK(got.r[i].q == want.q);
                    CHECK(got.r[i].qt == want.qt);
                    CHECK(got.r[i].sinv == want.sinv);
                    if (mode != FP8Q_TENSOR) CHECK(got.r[i].sinv_t == want.sinv_t);
                    CHECK(got.r[i].amax == want.amax);
                    CHECK(got.r[i].sat == want.sat);
                    if (mode == FP8Q_TENSOR && !current) CHECK(want.sat > 0);   // the given scale did saturate something
                }
                if (!bwd) {   // the forward's BF16 act, padding rows included
                    std::vector<float> a = get_bf16(act_fused, n);
                    CHECK(memcmp(a.data(), ref[0].data(), n * sizeof(float)) == 0);
                }
            }
    for (void* q : {(void*)dg_in, (void*)du_in, (void*)dda, (void*)act, (void*)gr, (void*)act_fused}) cudaCheck(cudaFree(q));
}

// The experts' gather fused with w1's quantisation (FP8P_GATHER: xe = x[row_token] in BF16 and its codes, row-wise
// and transposed: the model's xe_codes), and the
// same kernel quantising a BF16 tensor as it is (idx NULL, no y: fp8_quantize_operand's path for dye, LayerNorm's
// output, dqkv ...), against moe_gather_gpu + fp8_quantize_kernel: 16 experts with uneven padded segments (empty
// ones too), padding rows mapped to token 0 (as fp8_pad_routing), a 272-column slice of DBRX's d = 6144; and one
// segment of 208 rows (the attention's operands). Every code, factor, amax, saturation count and xe's BF16 bits
// equal; NaN in the padding rows of x as it is changes nothing (that they are not read at all: test_kernel_bytes.sh,
// whose count equals the formula of valid rows only). And a stacked
// weight as it is in 128 x 128 blocks (FP8Q_WEIGHT) against fp8_quantize_kernel's.
TEST_CASE("quantize kernel, fused into the experts' gather, and of a BF16 tensor as it is: bit-identical with the unfused kernels") {
    const int cols = 272, N = 150;
    Segs experts{{16, 0, 144, 32, 0, 160, 16, 48, 0, 128, 16, 32, 0, 16, 64, 16}, {5, 0, 137, 32, 0, 129, 1, 40, 0, 128, 16, 17, 0, 3, 64, 9}};
    Segs one{{208}, {208}};
    std::vector<float> x = test_tensor(N, cols, 911, 30);
    floatX* dx = deviceAlloc(floatX, x.size());
    to_device_bf16(dx, x.data(), x.size());
    for (const Segs* segs : {&experts, &one}) {
        int rows = starts_of(*segs).back();
        size_t n = (size_t)rows * cols, nq = 0, nt = 0;
        for (int l : segs->len) { nq += vec128_count(l, cols); nt += vec128_count(cols, l); }
        std::vector<int> row_token(rows, 0);   // valid rows: tokens in a scrambled order (repeats too); padding: token 0
        for (int r = 0; r < rows; r++)
            if (valid_row(*segs, r)) row_token[r] = (r * 37 + 11) % N;
        int* d_rt = dev_copy(row_token);
        floatX *xe = dev_poisoned<floatX>(n), *xe_fused = dev_poisoned<floatX>(n), *xe_nan = dev_poisoned<floatX>(n);
        moe_gather_gpu(xe, dx, d_rt, rows, cols);
        std::vector<float> ref = get_bf16(xe, n), with_nan = ref;
        for (int r = 0; r < rows; r++)
            if (!valid_row(*segs, r))
                for (int c = 0; c < cols; c++) with_nan[(size_t)r * cols + c] = NAN;
        to_device_bf16(xe_nan, with_nan.data(), n);
        float amax = 0;
        for (int r = 0; r < rows; r++)
            if (valid_row(*segs, r))
                for (int c = 0; c < cols; c++) amax = std::fmax(amax, std::fabs(ref[(size_t)r * cols + c]));
        for (Fp8QuantMode mode : {FP8Q_ACT, FP8Q_TENSOR})
            for (int current = 0; current < (mode == FP8Q_TENSOR ? 2 : 1); current++)
                for (int gather = 0; gather < 2; gather++) {
                    const Fp8Format fmt = gather ? FP8_E4M3 : FP8_E5M2;   // (the model's: xe E4M3; as it is, gradients too)
                    INFO((segs == &one ? "one segment" : "16 experts") << ", fmt " << (int)fmt << ", mode " << (int)mode
                         << (current ? ", current" : "") << (gather ? ", gather" : ", as it is"));
                    float scale[3] = {current ? -1.0f : fp8_scale_for(amax, fmt, 0) * 16.0f, 0, 0};   // 16x: saturates
                    Fp8ProducerArgs p = gather ? Fp8ProducerArgs{dx, nullptr, nullptr, xe_fused, d_rt}
                                               : Fp8ProducerArgs{xe_nan, nullptr, nullptr, nullptr, nullptr};
                    FusedOuts got = run_fused(FP8P_GATHER, p, rows, cols, *segs, fmt, mode, scale, nq, nt, false);
                    Quantized want = quantize(ref, rows, cols, *segs, fmt, mode, scale[0], 1, mode == FP8Q_TENSOR ? 1 : nq,
                                              mode == FP8Q_TENSOR ? 1 : nt);
                    CHECK(got.r[0].q == want.q);
                    CHECK(got.r[0].qt == want.qt);
                    CHECK(got.r[0].sinv == want.sinv);
                    if (mode != FP8Q_TENSOR) CHECK(got.r[0].sinv_t == want.sinv_t);
                    CHECK(got.r[0].amax == want.amax);
                    // (a gather's two copies under one scale count as two uses, the forward's and the backward's, as
                    // the CPU counts them: the model's xe_codes, fp8_experts_forward_gpu; the kernel's one count, once)
                    CHECK(got.r[0].sat == want.sat * (gather && mode == FP8Q_TENSOR ? 2 : 1));
                    if (mode == FP8Q_TENSOR && !current) CHECK(want.sat > 0);
                    if (gather) {   // xe in BF16, padding rows included (token 0's row, as moe_gather_gpu)
                        std::vector<float> a = get_bf16(xe_fused, n);
                        CHECK(memcmp(a.data(), ref.data(), n * sizeof(float)) == 0);
                    }
                }
        for (void* q : {(void*)d_rt, (void*)xe, (void*)xe_fused, (void*)xe_nan}) cudaCheck(cudaFree(q));
    }
    cudaCheck(cudaFree(dx));
    // a stacked expert weight as it is (FP8Q_WEIGHT: 128 x 128 blocks, the segments' tails short): 3 experts of 160 rows
    Segs wsegs{{160, 160, 160}, {160, 160, 160}};
    int wrows = 480;
    size_t nq = 0, nt = 0;
    for (int l : wsegs.len) { nq += blk128_count(l, cols); nt += blk128_count(cols, l); }
    std::vector<float> w = test_tensor(wrows, cols, 912, 20);
    floatX* dw = deviceAlloc(floatX, w.size());
    to_device_bf16(dw, w.data(), w.size());
    FusedOuts got = run_fused(FP8P_GATHER, {dw, nullptr, nullptr, nullptr, nullptr}, wrows, cols, wsegs, FP8_E4M3, FP8Q_WEIGHT, nullptr, nq, nt, false);
    Quantized want = quantize(w, wrows, cols, wsegs, FP8_E4M3, FP8Q_WEIGHT, 0, 0, nq, nt);
    CHECK(got.r[0].q == want.q);
    CHECK(got.r[0].qt == want.qt);
    // (bitwise: the layouts' padding entries are never written, both poisoned NaN)
    CHECK(memcmp(got.r[0].sinv.data(), want.sinv.data(), nq * sizeof(float)) == 0);
    CHECK(memcmp(got.r[0].sinv_t.data(), want.sinv_t.data(), nt * sizeof(float)) == 0);
    CHECK(got.r[0].amax == want.amax);
    CHECK(got.r[0].sat == want.sat);
    cudaCheck(cudaFree(dw));
}

// ---------------------------------------------------------------------------------------------
// training steps against the CPU's FP8 emulation

static const int SB = 2, ST = 32;
static const uint64_t SEED = 1337;
static const AdamWConfig OPT = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};

static DbrxConfig tiny2() {
    DbrxConfig c;
    REQUIRE(model_preset_lookup("dbrx-tiny", &c));
    c.n_layers = 2;
    return c;
}
static void batch(std::vector<int>* in, std::vector<int>* tg, uint64_t seed) {
    Rng r = {seed};
    in->resize(SB * ST); tg->resize(SB * ST);
    for (int i = 0; i < SB * ST; i++) { (*in)[i] = (int)(rng_u64(&r) % 257); (*tg)[i] = (int)(rng_u64(&r) % 257); }
}
// the initial parameters, rounded to BF16 (what both backends then compute with), router zeroed:
// every routing probability is exactly 1/E on both backends, so routing agrees exactly
static std::vector<float> step_params(const DbrxConfig& c) {
    Dbrx m;
    m.cfg = c;
    m.table = dbrx_param_table(&c);
    std::vector<float> p(m.table.back().offset + m.table.back().numel);
    m.params = p.data();
    dbrx_init_params(&m, SEED);
    for (float& x : p) x = __bfloat162float(__float2bfloat16(x));
    for (const ParamInfo& t : m.table)
        if (strstr(t.name, "router")) std::fill(p.begin() + t.offset, p.begin() + t.offset + t.numel, 0.0f);
    return p;
}

struct Fp8Step {
    std::vector<double> ce;                 // per step
    std::vector<float> grads;               // of the last step
    std::vector<std::string> names;         // FP8 tensors, and their amax in the last step
    std::vector<float> amax;
};

// `steps` training steps (forward, backward; an AdamW update between them) with the recipe
static Fp8Step gpu_run(const DbrxConfig& c, const std::vector<float>& params, Fp8Recipe recipe, int steps) {
    DbrxGPU g;
    Fp8Config fc = {recipe, 16, 0, 0};
    dbrx_build(&g, &c, SB, ST, SEED, &fc);
    dbrx_set_params(&g, params.data());
    Fp8Step r;
    for (int s = 0; s < steps; s++) {
        std::vector<int> in, tg;
        batch(&in, &tg, 40 + s);
        if (s) dbrx_update(&g, &OPT, OPT.lr, s);
        dbrx_zero_grad(&g);
        r.ce.push_back(dbrx_forward(&g, in.data(), tg.data(), 1.0f));
        dbrx_backward(&g, in.data(), tg.data(), 1.0f);
    }
    r.grads = get(g.grads, g.num_params);
    if (fp8_on(&g.fp8)) {
        fp8_gpu_collect(&g.fp8);
        r.names = g.fp8.names;
        for (const Fp8Meta& m : g.fp8.metas) r.amax.push_back(m.amax);
    }
    dbrx_free(&g);
    return r;
}
static Fp8Step cpu_run(const DbrxConfig& c, const std::vector<float>& params, Fp8Recipe recipe, int steps) {
    Dbrx m;
    dbrx_build(&m, &c, SB, ST, SEED);
    Fp8Config fc = {recipe, 16, 0, 0};
    dbrx_enable_fp8(&m, &fc);
    for (size_t i = 0; i < m.num_params; i++) m.params[i] = params[i];
    Fp8Step r;
    for (int s = 0; s < steps; s++) {
        std::vector<int> in, tg;
        batch(&in, &tg, 40 + s);
        if (s) dbrx_update(&m, &OPT, OPT.lr, s);
        dbrx_zero_grad(&m);
        r.ce.push_back(dbrx_forward(&m, in.data(), tg.data()));
        dbrx_backward(&m, in.data(), tg.data(), 1.0f);
    }
    r.grads.assign(m.grads, m.grads + m.num_params);
    for (Fp8MetaRef& ref : dbrx_fp8_metas(&m)) { r.names.push_back(ref.name); r.amax.push_back(ref.meta->amax); }
    dbrx_free(&m);
    return r;
}

// the relative L2 error of every gradient tensor (experts' w1, v1, w2 expert by expert); the worst
static double worst_rel_l2(const DbrxConfig& c, const std::vector<float>& got, const std::vector<float>& want, std::string* where) {
    double worst = 0;
    for (const ParamInfo& p : dbrx_param_table(&c)) {
        int parts = strstr(p.name, "experts.mlp") ? c.n_experts : 1;
        size_t slice = p.numel / parts;
        for (int e = 0; e < parts; e++) {
            double diff = 0, ref = 0;
            for (size_t i = p.offset + e * slice; i < p.offset + (e + 1) * slice; i++) {
                double d = (double)got[i] - want[i];
                diff += d * d;
                ref += (double)want[i] * want[i];
            }
            double rel = std::sqrt(diff / std::max(ref, 1e-300));
            if (rel > worst) { worst = rel; *where = std::string(p.name) + (parts > 1 ? " expert " + std::to_string(e) : ""); }
        }
    }
    return worst;
}


// |got - want| <= rtol |want| + atol max|want| everywhere; returns the worst ratio to the bound
static double close_ratio(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol) {
    double maxw = 0, worst = 0;
    for (float w : want) maxw = std::fmax(maxw, std::fabs(w));
    for (size_t i = 0; i < got.size(); i++) {
        double lim = rtol * std::fabs(want[i]) + atol * maxw + 1e-30, err = std::fabs((double)got[i] - want[i]);
        worst = std::max(worst, std::isnan(err) ? 1e30 : err / lim);
    }
    return worst;
}

// Every FP8 GEMM of block 0 in the GPU's training step, replayed by the CPU reference's FP8 code on
// the GPU's own BF16 inputs (block 0's activations and the gradients left in the scratch buffers
// after the backward pass), with the GPU's scales (delayed: the history's). The CPU's operands are
// then the same FP8 values as the GPU's (the kernel tests above show the codes bit-exact), so the
// outputs agree to FP32 summation order (FP32 outputs: 1e-4 |want| + 1e-5 max|want|) or BF16 rounding
// (BF16 outputs: 8e-3 |want| + 1e-3 max|want|; the w1+v1 dgrad rounded twice by the reference too, as
// the GPU's two GEMMs into one BF16 output do). `cpu_recipe` differs from `gpu_recipe` (or the GPU runs
// BF16) in the negative controls: then the ratios must exceed 1.
struct Replay { std::vector<std::pair<std::string, double>> ratios; };
static Replay replay_block0(Fp8Recipe gpu_recipe, Fp8Recipe cpu_recipe, int steps) {
    DbrxConfig c = tiny2();
    int N = SB * ST, d = c.d_model, qd = qkv_dim(&c), E = c.n_experts, k = c.top_k, F = c.ffn_hidden, R = N * k;
    std::vector<float> params(dbrx_param_table(&c).back().offset + dbrx_param_table(&c).back().numel);
    {   // the random router: uneven expert loads, some experts empty
        Dbrx m;
        m.cfg = c;
        m.table = dbrx_param_table(&c);
        m.params = params.data();
        dbrx_init_params(&m, SEED + 1);
    }
    DbrxGPU g;
    Fp8Config fc = {gpu_recipe, 16, 0, 0};
    dbrx_build(&g, &c, SB, ST, SEED, &fc);
    dbrx_set_params(&g, params.data());
    for (int s = 0; s < steps; s++) {
        std::vector<int> in, tg;
        batch(&in, &tg, 60 + s);
        if (s) dbrx_update(&g, &OPT, OPT.lr, s);
        dbrx_zero_grad(&g);
        dbrx_forward(&g, in.data(), tg.data(), 1.0f);
        dbrx_backward(&g, in.data(), tg.data(), 1.0f);
    }
    const BlockActsGPU& a = g.acts[0];
    const BlockViews<floatX>& w = g.p.blocks[0];
    const BlockViews<float>& gw = g.g.blocks[0];
    std::vector<int> off = a.offsets_host, poff = off;
    if (fp8_on(&g.fp8)) poff = g.fp8.routing[0].poff;
    int Rp = poff[E];
    // padded (GPU) rows -> the CPU's rows grouped by expert
    auto unpad = [&](const std::vector<float>& v, int cols) {
        std::vector<float> o((size_t)R * cols);
        for (int e = 0; e < E; e++)
            for (int j = 0; j < off[e + 1] - off[e]; j++)
                memcpy(&o[(size_t)(off[e] + j) * cols], &v[(size_t)(poff[e] + j) * cols], cols * sizeof(float));
        return o;
    };
    std::vector<float> ln1 = get_bf16(a.ln1, (size_t)N * d), atty = get_bf16(a.atty, (size_t)N * d);
    std::vector<float> wqkv = get_bf16(w.wqkv, (size_t)qd * d), wo = get_bf16(w.wo, (size_t)d * d);
    std::vector<float> w1 = get_bf16(w.w1, (size_t)E * F * d), v1 = get_bf16(w.v1, (size_t)E * F * d), w2 = get_bf16(w.w2, (size_t)E * F * d);
    // act: under FP8 the step's forward writes only its codes (model/dbrx_fp8_cuda.cuh), so its BF16 values come
    // from the unfused kernel on block 0's g, u, as dg, du below
    CHECK((a.act == nullptr) == fp8_on(&g.fp8));   // (gpu_act_kept: no act buffer under FP8)
    floatX* act_d = deviceAlloc(floatX, (size_t)Rp * F);
    if (fp8_on(&g.fp8)) swiglu_forward_gpu(act_d, a.g, a.u, (size_t)Rp * F);
    else cudaCheck(cudaMemcpy(act_d, a.act, (size_t)Rp * F * sizeof(floatX), cudaMemcpyDeviceToDevice));
    // xe: under FP8 the step's forward leaves xe's transposed codes in its buffer (fp8_xe_codes), so its BF16 rows
    // are gathered again from block 0's ln2, as the forward's fused gather read them
    floatX* xe_d = deviceAlloc(floatX, (size_t)Rp * d);
    if (fp8_on(&g.fp8)) {
        CHECK(g.fp8.routing[0].xe_codes);
        moe_gather_gpu(xe_d, a.ln2, g.fp8.routing[0].row_token, Rp, d);
    } else cudaCheck(cudaMemcpy(xe_d, a.xe, (size_t)Rp * d * sizeof(floatX), cudaMemcpyDeviceToDevice));
    std::vector<float> xe = unpad(get_bf16(xe_d, (size_t)Rp * d), d), act = unpad(get_bf16(act_d, (size_t)Rp * F), F);
    cudaCheck(cudaFree(act_d));
    cudaCheck(cudaFree(xe_d));
    std::vector<float> dqkv = get_bf16(g.dqkv, (size_t)N * qd), dres = get_bf16(g.dresid_bf16, (size_t)N * d);
    // dg, du: under FP8 the step's SwiGLU backward writes only their codes (model/fp8_fused.cuh), so their BF16
    // values come from the unfused kernel on block 0's da, g, u (the fused codes are those of these values: the
    // fused kernel's test case above)
    floatX* dgu = deviceAlloc(floatX, 2 * (size_t)Rp * F);
    swiglu_backward_gpu(dgu, dgu + (size_t)Rp * F, g.da, a.g, a.u, (size_t)Rp * F);
    std::vector<float> dye = unpad(get_bf16(g.dye, (size_t)Rp * d), d), dg = unpad(get_bf16(dgu, (size_t)Rp * F), F);
    std::vector<float> du = unpad(get_bf16(dgu + (size_t)Rp * F, (size_t)Rp * F), F);
    cudaCheck(cudaFree(dgu));
    // the GPU's outputs
    std::map<std::string, std::vector<float>> gpu;
    gpu["qkv forward"] = get_bf16(a.qkv_pre, (size_t)N * qd);
    gpu["qkv dgrad"] = get(g.dln, (size_t)N * d);
    gpu["qkv wgrad"] = get(gw.wqkv, (size_t)qd * d);
    gpu["proj dgrad"] = get_bf16(g.datty, (size_t)N * d);
    gpu["proj wgrad"] = get(gw.wo, (size_t)d * d);
    gpu["w1 forward"] = unpad(get_bf16(a.g, (size_t)Rp * F), F);
    gpu["v1 forward"] = unpad(get_bf16(a.u, (size_t)Rp * F), F);
    gpu["w2 forward"] = unpad(get_bf16(a.ye, (size_t)Rp * d), d);
    gpu["w2 dgrad"] = unpad(get_bf16(g.da, (size_t)Rp * F), F);
    gpu["w2 wgrad"] = get(gw.w2, (size_t)E * F * d);
    gpu["w1+v1 dgrad"] = unpad(get_bf16(g.dxe, (size_t)Rp * d), d);   // BF16 (model/CUDA.md: the routed input gradient)
    gpu["w1 wgrad"] = get(gw.w1, (size_t)E * F * d);
    gpu["v1 wgrad"] = get(gw.v1, (size_t)E * F * d);
    // the GPU's per-tensor scales of the step (delayed: from the history), for the CPU's metas
    Fp8BlockState st;
    Fp8Linear* lins[5] = {&st.qkv, &st.proj, &st.w1, &st.v1, &st.w2};
    for (int i = 0; i < 5; i++)
        for (int o = 0; o < 3; o++) {
            Fp8Meta* mt = o == 0 ? &lins[i]->x : o == 1 ? &lins[i]->w : &lins[i]->dy;
            fp8_meta_init(mt);
            if (fp8_on(&g.fp8)) *mt = g.fp8.metas[fp8_slot(&g.fp8, 0, i, o)];
            mt->amax = 0;
        }
    dbrx_free(&g);

    // the CPU reference's FP8 GEMMs (model/fp8.cuh; the experts as model/dbrx.h runs them)
    Fp8Config cc = {cpu_recipe, 16, 0, 0};
    std::map<std::string, std::vector<float>> cpu;
    size_t big = (size_t)std::max(R * std::max(d, F), E * F * d);
    std::vector<real> q1(big), q2(big), q3(big), q4(big), q5(big);
    std::vector<float> t1((size_t)N * qd), t2((size_t)N * d, 0.0f), t3((size_t)qd * d, 0.0f);
    fp8_matmul_forward(t1.data(), ln1.data(), wqkv.data(), N, d, qd, &st.qkv, &cc, q1.data(), q2.data());
    cpu["qkv forward"] = t1;
    fp8_matmul_backward(t2.data(), t3.data(), dqkv.data(), ln1.data(), wqkv.data(), N, d, qd, &st.qkv, &cc, q1.data(), q2.data(), q3.data(), q4.data());
    cpu["qkv dgrad"] = t2;
    cpu["qkv wgrad"] = t3;
    std::vector<float> p1((size_t)N * d, 0.0f), p2((size_t)d * d, 0.0f);
    fp8_matmul_backward(p1.data(), p2.data(), dres.data(), atty.data(), wo.data(), N, d, d, &st.proj, &cc, q1.data(), q2.data(), q3.data(), q4.data());
    cpu["proj dgrad"] = p1;
    cpu["proj wgrad"] = p2;
    std::vector<int> ws(E + 1);
    for (int e = 0; e <= E; e++) ws[e] = e * F;
    std::vector<float> eg((size_t)R * F), eu((size_t)R * F), ea((size_t)R * F), ey((size_t)R * d);
    fp8_operand_grouped(q1.data(), xe.data(), off.data(), E, d, &st.w1.x, &cc, FP8_E4M3, 1, 128);
    fp8_operand_grouped(q2.data(), w1.data(), ws.data(), E, d, &st.w1.w, &cc, FP8_E4M3, 128, 128);
    fp8_operand_grouped(q3.data(), v1.data(), ws.data(), E, d, &st.v1.w, &cc, FP8_E4M3, 128, 128);
    experts_up_forward(eg.data(), eu.data(), ea.data(), q1.data(), q2.data(), q3.data(), off.data(), E, d, F);
    cpu["w1 forward"] = eg;
    cpu["v1 forward"] = eu;
    fp8_operand_grouped(q1.data(), act.data(), off.data(), E, F, &st.w2.x, &cc, FP8_E4M3, 1, 128);
    fp8_operand_grouped(q2.data(), w2.data(), ws.data(), E, d, &st.w2.w, &cc, FP8_E4M3, 128, 128);
    experts_down_forward(ey.data(), q1.data(), q2.data(), off.data(), E, d, F);
    cpu["w2 forward"] = ey;
    bool block8 = cpu_recipe == FP8_BLOCK;
    std::vector<float> eda((size_t)R * F), edw2((size_t)E * F * d, 0.0f);
    fp8_operand_grouped(q1.data(), dye.data(), off.data(), E, d, &st.w2.dy, &cc, FP8_E5M2, 1, 128);
    fp8_operand_grouped(q2.data(), w2.data(), ws.data(), E, d, &st.w2.w, &cc, FP8_E4M3, 128, 128);
    if (block8) fp8_operand_grouped(q3.data(), dye.data(), off.data(), E, d, &st.w2.dy, &cc, FP8_E5M2, 128, 1);
    fp8_operand_grouped(q4.data(), act.data(), off.data(), E, F, &st.w2.x, &cc, FP8_E4M3, 128, 1);
    experts_down_backward(eda.data(), edw2.data(), q1.data(), q2.data(), q4.data(), block8 ? q3.data() : q1.data(), off.data(), E, d, F);
    cpu["w2 dgrad"] = eda;
    cpu["w2 wgrad"] = edw2;
    std::vector<real> q6(big), q7(big), q8(big);
    std::vector<float> edx((size_t)R * d), edw1((size_t)E * F * d, 0.0f), edv1((size_t)E * F * d, 0.0f);
    fp8_operand_grouped(q1.data(), dg.data(), off.data(), E, F, &st.w1.dy, &cc, FP8_E5M2, 1, 128);
    fp8_operand_grouped(q2.data(), du.data(), off.data(), E, F, &st.v1.dy, &cc, FP8_E5M2, 1, 128);
    fp8_operand_grouped(q3.data(), w1.data(), ws.data(), E, d, &st.w1.w, &cc, FP8_E4M3, 128, 128);
    fp8_operand_grouped(q4.data(), v1.data(), ws.data(), E, d, &st.v1.w, &cc, FP8_E4M3, 128, 128);
    if (block8) {
        fp8_operand_grouped(q5.data(), dg.data(), off.data(), E, F, &st.w1.dy, &cc, FP8_E5M2, 128, 1);
        fp8_operand_grouped(q6.data(), du.data(), off.data(), E, F, &st.v1.dy, &cc, FP8_E5M2, 128, 1);
    }
    fp8_operand_grouped(q7.data(), xe.data(), off.data(), E, d, &st.w1.x, &cc, FP8_E4M3, 128, 1);
    experts_up_backward(edx.data(), edw1.data(), edv1.data(), q1.data(), q2.data(), q3.data(), q4.data(), block8 ? q5.data() : q1.data(),
                        block8 ? q6.data() : q2.data(), q7.data(), off.data(), E, d, F);
    // the GPU's dgrad is two GEMMs into BF16 (model/moe.cuh): the first product rounded to BF16, the second
    // added to it and rounded again; the reference rounds its own products the same way (q8: zeros, the
    // second product left out)
    std::vector<float> dx1((size_t)R * d), s1((size_t)E * F * d, 0.0f), s2((size_t)E * F * d, 0.0f);
    experts_up_backward(dx1.data(), s1.data(), s2.data(), q1.data(), q8.data(), q3.data(), q4.data(), q1.data(), q8.data(), q7.data(),
                        off.data(), E, d, F);
    auto bf16r = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
    for (size_t i = 0; i < edx.size(); i++) edx[i] = bf16r(bf16r(dx1[i]) + (edx[i] - dx1[i]));
    cpu["w1+v1 dgrad"] = edx;
    cpu["w1 wgrad"] = edw1;
    cpu["v1 wgrad"] = edv1;

    Replay r;
    for (auto& kv : cpu) {
        const std::string& name = kv.first;
        bool bf16_out = name.find("forward") != std::string::npos || name == "proj dgrad" || name == "w2 dgrad" || name == "w1+v1 dgrad";
        // FP32 outputs (the wgrads): 1e-4 where the twin accumulates as the CPU does; on a device the tensor core's
        // 14-bit running sums (accumulation_bound's model) differ from the emulation's: an H100 (2026-11-27) erred up
        // to 6.2 x (1e-4, 1e-5) on the per-tensor recipes' wgrads, about 2.5 x 2^-12 of sum |x y| as the model says
        const double rt = EMULATED_TEST ? 1e-4 : 1e-3, at = EMULATED_TEST ? 1e-5 : 1e-4;
        // the dgrad of w1 + v1 rounds twice to BF16 (above): on an H100 (2026-11-27, session 39) the device's own
        // accumulation moved it across those roundings by up to 1.6 x (8e-3, 1e-3) in every recipe; 2 x there
        const double bt = !EMULATED_TEST && name == "w1+v1 dgrad" ? 2.0 : 1.0;
        r.ratios.push_back({name, bf16_out ? close_ratio(gpu[name], kv.second, bt * 8e-3, bt * 1e-3) : close_ratio(gpu[name], kv.second, rt, at)});
    }
    return r;
}

TEST_CASE("every FP8 GEMM of a training step equals the CPU reference's FP8 GEMM on the same BF16 inputs") {
    for (Fp8Recipe r : {FP8_DELAYED, FP8_CURRENT, FP8_BLOCK}) {
        Replay rp = replay_block0(r, r, r == FP8_DELAYED ? 2 : 1);   // delayed: the second step quantises with the history's scales
        double worst = 0;
        for (auto& x : rp.ratios) {
            INFO("recipe " << (int)r << ", block 0 " << x.first << ": error " << x.second << " of the tolerance");
            CHECK(x.second <= 1.0);
            worst = std::max(worst, x.second);
        }
        MESSAGE("recipe " << (int)r << ": 13 GEMM outputs of block 0, worst error " << worst << " of the tolerance");
    }
}

TEST_CASE("negative controls: the replay catches a wrong recipe, a wrong tiling and BF16 GEMMs") {
    struct Ctl { const char* what; Fp8Recipe gpu, cpu; };
    for (const Ctl& c : {Ctl{"GPU in BF16, CPU current", FP8_OFF, FP8_CURRENT}, Ctl{"GPU block, CPU current", FP8_BLOCK, FP8_CURRENT},
                         Ctl{"GPU current, CPU block", FP8_CURRENT, FP8_BLOCK}}) {
        Replay rp = replay_block0(c.gpu, c.cpu, 1);
        int failing = 0;
        for (auto& x : rp.ratios) failing += x.second > 1.0;
        MESSAGE(std::string(c.what) << ": " << failing << " of " << rp.ratios.size() << " GEMM outputs out of tolerance");
        CHECK(failing >= (int)rp.ratios.size() - 1);
    }
}

// The whole step with each recipe against the CPU's FP8 emulation of the same recipe. Both are
// FP8-rounded, but the GPU quantises BF16 activations and the CPU FP32 ones: a value within the
// BF16 rounding (2^-9) of an FP8 rounding boundary lands one FP8 step apart (E4M3: ~2% of the
// values, each by 6-12%; E5M2: ~1%, by 12-25%), which is a sizeable fraction of the FP8 error
// itself, compounded through the two blocks. Measured (dbrx-tiny, 2 layers, 2 x 32 tokens): every
// gradient tensor within 3-11% relative L2 (FP8 against FP32 on the CPU: 6-12%), the loss within
// 2e-4, the amaxes within 6%. Held to: every tensor 0.15, the loss 1e-3, and the amax of every FP8
// tensor (the same names in the same order as the CPU's) within 10%. This is a coarse check; the per-GEMM replay above is
// the precise one (its negative controls show it fails on a wrong recipe or BF16 GEMMs).
TEST_CASE("a training step with each recipe against the CPU's FP8 emulation of the recipe") {
    DbrxConfig c = tiny2();
    std::vector<float> params = step_params(c);
    for (Fp8Recipe r : {FP8_DELAYED, FP8_CURRENT, FP8_BLOCK}) {
        Fp8Step cpu = cpu_run(c, params, r, 1), gpu = gpu_run(c, params, r, 1);
        std::string where;
        double worst = worst_rel_l2(c, gpu.grads, cpu.grads, &where);
        MESSAGE("recipe " << (int)r << ": loss cpu " << cpu.ce[0] << " gpu " << gpu.ce[0] << "; worst gradient " << where << ", relative L2 " << worst);
        CHECK(std::fabs(gpu.ce[0] - cpu.ce[0]) / cpu.ce[0] < 1e-3);
        CHECK(worst < 0.15);
        REQUIRE(gpu.names == cpu.names);
        double worst_amax = 0;
        for (size_t i = 0; i < cpu.amax.size(); i++) {
            INFO(cpu.names[i] << ": amax cpu " << cpu.amax[i] << " gpu " << gpu.amax[i]);
            CHECK(cpu.amax[i] > 0);
            worst_amax = std::max(worst_amax, (double)std::fabs(gpu.amax[i] - cpu.amax[i]) / cpu.amax[i]);
        }
        MESSAGE("   amax of " << cpu.amax.size() << " FP8 tensors: worst relative difference " << worst_amax);
        CHECK(worst_amax < 0.1);
    }
}

TEST_CASE("two runs of an FP8 step (block recipe) under two thread schedules are bit-identical") {
    DbrxConfig c = tiny2();
    std::vector<float> params = step_params(c);
#if defined(SIMT_EMULATION)
    simt::set_schedule(true, 3);
#endif
    Fp8Step a = gpu_run(c, params, FP8_BLOCK, 2);
#if defined(SIMT_EMULATION)
    simt::set_schedule(true, 4);
#endif
    Fp8Step b = gpu_run(c, params, FP8_BLOCK, 2);
    CHECK(memcmp(a.ce.data(), b.ce.data(), a.ce.size() * sizeof(double)) == 0);
    CHECK(memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)) == 0);
    CHECK(memcmp(a.amax.data(), b.amax.data(), a.amax.size() * sizeof(float)) == 0);
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "FP8", 20240807); }
