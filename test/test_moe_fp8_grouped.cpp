/*
 * test_moe_fp8_grouped.cpp — the experts' FP8 block-scaled grouped GEMMs (model/moe_grouped_fp8.cuh: the
 * up-projection with SwiGLU, the down-projection on w2 transposed) under the SIMT emulator, against
 *   - a double-precision CPU product of the dequantised operands (sum over k of sx * s1|s2 * x8 * w8): g, u and ye
 *     within 2^-8 |ref| (BF16's rounding, half an ulp is 2^-9) + 2^-16 sum |terms| (fp32 sums of exact E4M3 products:
 *     at most (128 + d / 128) roundings of 2^-24 each, for d <= 6144 under 2^-16.4); a = silu(g) u within 2e-2;
 *   - cuBLASLt's twin (test/simt/cublaslt_twin.h, twin_matmul_compute) run per expert on the same codes and factors
 *     in its block-scaled modes (weights BLK128x128, activations VEC128), with swiglu_value on its BF16 g and u, BIT
 *     FOR BIT: the twin sums each 128-chunk of k in order from 0 in fp32 and adds it times the product of the two
 *     factors, chunk after chunk; the emulated wgmma sums the 4 k-steps' products in k order from 0 (scale-d 0) and
 *     the kernel promotes the same way (on a GPU the in-chunk order and precision differ).
 * Codes are random E4M3 values, the factors random per row and k block / per 128x128 block (a wrong index fails).
 * Uneven experts (empty, 1 row, tails, an empty last expert), 1035 rows (the last tile's rows past them TMA's zero
 * fill), 3 emulated persistent blocks walking several tiles, d 1024 (8 k-tiles: the 6-stage ring wraps within a
 * tile), DBRX-132B's d 6144 and F 10752 one at a time. Outputs poisoned (NaN) with guard rows: an unwritten row or one
 * written past the end fails. Negative controls (must fail): PLANT 1 the next k block's activation factor, 2 the
 * promotion skipped for k block 1 (both projections), 3 expect_tx 16 bytes high (a reported deadlock), 4 a stage
 * released before its MMAs completed (wrong bits; under the race detector, test_race_moe_fp8_grouped, a race). The down
 * input a8 is independent random codes (not the up-projection's a): each GEMM is checked on its own.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <cstring>
#include "cuda_test_helpers.h"
#include "../model/moe_grouped_fp8.cuh"

static const int GUARD = 64;   // poisoned rows after each output

struct Fp8Case {
    int E, d, F, R, KB4;
    std::vector<int> off;
    std::vector<uint8_t> xe, w1, v1, a8, w2t;   // E4M3 codes (a8: the down-projection's input, independent of g, u)
    std::vector<float> sx, s1, s2, sa, s3;      // the dequantisation factors (layouts: model/moe_grouped_fp8.cuh)
    uint8_t *dxe, *dw1, *dv1, *da8, *dw2t;
    float *dsx, *ds1, *ds2, *dsa, *ds3;
    int* doff;
};
static std::vector<uint8_t> codes(size_t n, uint64_t seed) {
    std::vector<float> v = randn(n, seed, 60.0);   // E4M3 spans +-448: many exponents, some saturated
    std::vector<uint8_t> c(n);
    for (size_t i = 0; i < n; i++) c[i] = __nv_fp8_e4m3(v[i]).__x;
    return c;
}
static std::vector<float> factors(size_t n, uint64_t seed) {
    std::vector<float> v = randn(n, seed);
    for (float& x : v) x = 1e-3f * (1.0f + std::fabs(x)) * (x < 0 ? 0.37f : 1.0f);
    return v;
}
static float dec(uint8_t c) { __nv_fp8_e4m3 v; v.__x = c; return (float)v; }

static Fp8Case make_case(const std::vector<int>& counts, int d, int F) {
    Fp8Case c;
    c.E = (int)counts.size(); c.d = d; c.F = F; c.KB4 = (d / 128 + 3) / 4 * 4;
    c.off.assign(c.E + 1, 0);
    for (int e = 0; e < c.E; e++) c.off[e + 1] = c.off[e] + counts[e];
    c.R = c.off[c.E];
    size_t nw = (size_t)c.E * F * d, nb = (size_t)c.E * F / 128 * c.KB4;
    c.xe = codes((size_t)c.R * d, 1); c.w1 = codes(nw, 2); c.v1 = codes(nw, 3);
    c.sx = factors((size_t)d / 128 * c.R, 4); c.s1 = factors(nb, 5); c.s2 = factors(nb, 6);
    c.a8 = codes((size_t)c.R * F, 7); c.w2t = codes(nw, 8);
    c.sa = factors((size_t)F / 128 * c.R, 9); c.s3 = factors((size_t)c.E * d / 128 * ((F / 128 + 3) / 4 * 4), 10);
    c.dxe = dev_copy(c.xe); c.dw1 = dev_copy(c.w1); c.dv1 = dev_copy(c.v1); c.da8 = dev_copy(c.a8); c.dw2t = dev_copy(c.w2t);
    c.dsx = dev_copy(c.sx); c.ds1 = dev_copy(c.s1); c.ds2 = dev_copy(c.s2); c.dsa = dev_copy(c.sa); c.ds3 = dev_copy(c.s3);
    c.doff = dev_copy(c.off);
    return c;
}
static void free_case(Fp8Case& c) {
    for (void* p : {(void*)c.dxe, (void*)c.dw1, (void*)c.dv1, (void*)c.da8, (void*)c.dw2t, (void*)c.dsx, (void*)c.ds1, (void*)c.ds2,
                    (void*)c.dsa, (void*)c.ds3, (void*)c.doff})
        cudaCheck(cudaFree(p));
}

// cuBLASLt's twin, expert by expert: out (R, N) BF16 = x_e w_e^T, x (R, K) with factors sx (K / 128, R), w (E N, K)
// with sw (E, N / 128, KB4) (column-major D (N, n_e) is row-major (n_e, N)); the activations' factors copied per
// expert (VEC128's outer size is the GEMM's n = n_e)
static std::vector<uint16_t> twin_gemm(const Fp8Case& c, const std::vector<uint8_t>& x, const std::vector<float>& sx,
                                       const std::vector<uint8_t>& w, const std::vector<float>& sw, int K, int N) {
    std::vector<uint16_t> out((size_t)c.R * N);
    const int KB4 = (K / 128 + 3) / 4 * 4;
    for (int e = 0; e < c.E; e++) {
        const int n = c.off[e + 1] - c.off[e];
        if (n == 0) continue;
        std::vector<float> sxe((size_t)K / 128 * n);
        for (int kb = 0; kb < K / 128; kb++)
            for (int j = 0; j < n; j++) sxe[(size_t)kb * n + j] = sx[(size_t)kb * c.R + c.off[e] + j];
        TwinGemm g;
        memset(&g, 0, sizeof g);
        g.trans_a = true; g.m = N; g.n = n; g.k = K; g.batch = 1; g.alpha = 1.0f;
        g.A = w.data() + (size_t)e * N * K; g.lda = K;
        g.B = x.data() + (size_t)c.off[e] * K; g.ldb = K;
        g.D = out.data() + (size_t)c.off[e] * N; g.ldd = N; g.ldc = N;
        g.a_type = g.b_type = CUDA_R_8F_E4M3; g.d_type = CUDA_R_16BF;
        g.a_scale = sw.data() + (size_t)e * N / 128 * KB4; g.a_mode = 2;
        g.b_scale = sxe.data(); g.b_mode = 1;
        twin_matmul_compute(g);
    }
    return out;
}
static float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

// elements of `got` (R rows, then GUARD poisoned rows) differing in bits from `want`, plus guard elements changed
static size_t bit_mismatches(const floatX* got, const std::vector<uint16_t>& want, int R, int cols) {
    std::vector<uint16_t> g = get((const uint16_t*)got, (size_t)(R + GUARD) * cols);
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); i++) bad += i < want.size() ? g[i] != want[i] : g[i] != 0xFFFF;
    return bad;
}

// the double-precision product of the dequantised operands x (R, K) with factors sx, w (E N, K) with sw at row r
// (expert e), column j: its value and its sum of |terms|
static void cpu_dot(const Fp8Case& c, const std::vector<uint8_t>& x, const std::vector<float>& sx, const std::vector<uint8_t>& w,
                    const std::vector<float>& sw, int K, int N, int e, int r, int j, double* val, double* mag) {
    const int KB4 = (K / 128 + 3) / 4 * 4;
    const uint8_t* xr = &x[(size_t)r * K];
    const uint8_t* wr = &w[((size_t)e * N + j) * K];
    double v = 0, m = 0;
    for (int kb = 0; kb < K / 128; kb++) {
        double f = (double)sx[(size_t)kb * c.R + r] * sw[((size_t)e * N + j) / 128 * KB4 + kb];
        for (int p = kb * 128; p < kb * 128 + 128; p++) {
            double t = f * dec(xr[p]) * dec(wr[p]);
            v += t; m += std::fabs(t);
        }
    }
    *val = v; *mag = m;
}
// |got - ref| within BF16's rounding and fp32's summation (the file's top comment)
static bool within(double got, double v, double m) { return std::fabs(got - v) <= std::ldexp(std::fabs(v), -8) + std::ldexp(m, -16); }
static void cpu_gu(const Fp8Case& c, int e, int r, int j, double* val, double* mag) {
    cpu_dot(c, c.xe, c.sx, c.w1, c.s1, c.d, c.F, e, r, j, &val[0], &mag[0]);
    cpu_dot(c, c.xe, c.sx, c.v1, c.s2, c.d, c.F, e, r, j, &val[1], &mag[1]);
}
// g, u, a against the CPU product (bounds above): the failures
static size_t cpu_mismatches(const Fp8Case& c, const floatX* g, const floatX* u, const floatX* a) {
    std::vector<float> G = get_bf16(g, (size_t)c.R * c.F), U = get_bf16(u, G.size()), A = get_bf16(a, G.size());
    size_t bad = 0;
    for (int e = 0; e < c.E; e++)
        for (int r = c.off[e]; r < c.off[e + 1]; r++)
            for (int j = 0; j < c.F; j++) {
                double v[2], m[2];
                cpu_gu(c, e, r, j, v, m);
                size_t i = (size_t)r * c.F + j;
                bad += !within(G[i], v[0], m[0]) + !within(U[i], v[1], m[1]);
                double aref = v[0] / (1.0 + std::exp(-v[0])) * v[1];
                bad += !(std::fabs(A[i] - aref) <= 2e-2 * std::fabs(aref) + 1e-2 * (m[0] + m[1]) * 1e-2);
            }
    return bad;
}

// the grouped kernel against the twin bit for bit (g, u, a), and (check_cpu) against the CPU product
template <int PLANT = 0>
static size_t fp8_vs_twin(const Fp8Case& c, bool check_cpu) {
    size_t nf = (size_t)(c.R + GUARD) * c.F;
    floatX *g = dev_poisoned<floatX>(nf), *u = dev_poisoned<floatX>(nf), *a = dev_poisoned<floatX>(nf);
    experts_up_grouped_fp8_gpu<PLANT>(g, u, a, c.dxe, c.dsx, c.dw1, c.ds1, c.dv1, c.ds2, c.doff, c.R, c.E, c.d, c.F);
    std::vector<uint16_t> tg = twin_gemm(c, c.xe, c.sx, c.w1, c.s1, c.d, c.F), tu = twin_gemm(c, c.xe, c.sx, c.v1, c.s2, c.d, c.F), ta(tg.size());
    for (size_t i = 0; i < ta.size(); i++) ta[i] = __nv_bfloat16_raw(__float2bfloat16(swiglu_value(bf(tg[i]), bf(tu[i])))).x;
    size_t bad = bit_mismatches(g, tg, c.R, c.F) + bit_mismatches(u, tu, c.R, c.F) + bit_mismatches(a, ta, c.R, c.F);
    if (check_cpu) CHECK(cpu_mismatches(c, g, u, a) == 0);
    for (void* p : {(void*)g, (void*)u, (void*)a}) cudaCheck(cudaFree(p));
    return bad;
}

// the down-projection (ye from the independent a8, w2t) against the twin bit for bit and (check_cpu) the CPU product
template <int PLANT = 0>
static size_t fp8_down_vs_twin(const Fp8Case& c, bool check_cpu) {
    floatX* ye = dev_poisoned<floatX>((size_t)(c.R + GUARD) * c.d);
    experts_down_grouped_fp8_gpu<PLANT>(ye, c.da8, c.dsa, c.dw2t, c.ds3, c.doff, c.R, c.E, c.d, c.F);
    size_t bad = bit_mismatches(ye, twin_gemm(c, c.a8, c.sa, c.w2t, c.s3, c.F, c.d), c.R, c.d), far = 0;
    if (check_cpu) {
        std::vector<float> Y = get_bf16(ye, (size_t)c.R * c.d);
        for (int e = 0; e < c.E; e++)
            for (int r = c.off[e]; r < c.off[e + 1]; r++)
                for (int j = 0; j < c.d; j++) {
                    double v, m;
                    cpu_dot(c, c.a8, c.sa, c.w2t, c.s3, c.F, c.d, e, r, j, &v, &m);
                    far += !within(Y[(size_t)r * c.d + j], v, m);
                }
        CHECK(far == 0);
    }
    cudaCheck(cudaFree(ye));
    return bad;
}

#if defined(SIMT_RACE_DETECT)
static const std::vector<int> COUNTS = {0, 1, 65, 0, 130, 64};
constexpr int D_RUN = 384, F_RUN = 128;
#else
static const std::vector<int> COUNTS = {0, 1, 63, 64, 65, 200, 0, 129, 7, 128, 0, 31, 96, 2, 190, 65};   // 1035 rows
constexpr int D_RUN = 384, F_RUN = 256;
#endif

TEST_CASE("FP8 grouped up and down: the CPU product, cuBLASLt's twin bit for bit; uneven experts, tails, several tiles a block") {
    Fp8Case c = make_case(COUNTS, D_RUN, F_RUN);
    CHECK(fp8_vs_twin(c, true) == 0);
    CHECK(fp8_down_vs_twin(c, true) == 0);
    free_case(c);
}

TEST_CASE("FP8 grouped up and down: d 1024 (8 k-tiles through 6 stages), the last expert empty") {
    Fp8Case c = make_case({70, 0, 130, 257, 1, 0}, 1024, 128);
    CHECK(fp8_vs_twin(c, true) == 0);
    CHECK(fp8_down_vs_twin(c, true) == 0);   // (N 1024: 8 n-tiles of 128)
    free_case(c);
}

#if !defined(SIMT_RACE_DETECT)
TEST_CASE("FP8 grouped up and down at DBRX-132B's d 6144") {
    Fp8Case c = make_case({70, 0, 130}, 6144, 128);   // 48 k-tiles: 8 passes around the ring per tile
    CHECK(fp8_vs_twin(c, true) == 0);
    CHECK(fp8_down_vs_twin(c, false) == 0);   // (N 6144: 48 n-tiles)
    free_case(c);
}
TEST_CASE("FP8 grouped up and down at DBRX-132B's F 10752") {
    Fp8Case f = make_case({70, 0, 130}, 128, 10752);   // 168 n-tiles x 2 m-tiles over 3 blocks
    CHECK(fp8_vs_twin(f, false) == 0);
    CHECK(fp8_down_vs_twin(f, true) == 0);    // (K 10752: 84 k-tiles, 14 passes around the ring)
    free_case(f);
}
#endif

TEST_CASE("FP8 grouped negative controls: a wrong k block's factor, a skipped promotion, expect_tx") {
    Fp8Case c = make_case({65, 0, 130}, 384, 128);
    size_t wrong_block = fp8_vs_twin<1>(c, false), skipped = fp8_vs_twin<2>(c, false);
    MESSAGE("next k block's activation factor: " << wrong_block << " mismatches; promotion of k block 1 skipped: " << skipped);
    CHECK(wrong_block > 0);
    CHECK(skipped > 0);
    Fp8Case f = make_case({65, 0, 130}, 128, 384);   // the down-projection's K = F: 3 k-tiles
    size_t down_block = fp8_down_vs_twin<1>(f, false), down_skipped = fp8_down_vs_twin<2>(f, false);
    free_case(f);
    MESSAGE("down: next k block's factor: " << down_block << " mismatches; promotion skipped: " << down_skipped);
    CHECK(down_block > 0);
    CHECK(down_skipped > 0);
    std::string e = simt::error_of([&] { fp8_vs_twin<3>(c, false); });
    MESSAGE(e.substr(0, 300));
    CHECK(e.find("deadlock in kernel experts_up_grouped_fp8") != std::string::npos);
    CHECK(e.find("tx-count 16 byte(s) not arrived") != std::string::npos);
    // a stage released before its MMAs completed: the producer's refill lands while they read it (a race; without the
    // detector the emulated MMAs read the refilled stage at their wait: wrong bits)
    // (d 1024: 8 k-tiles, the 6-stage ring wraps within a tile; the producer's warp scheduled ahead)
    Fp8Case k = make_case({65, 0, 130}, 1024, 128);
    const bool random = simt::options().random;
    const uint64_t seed = simt::options().seed;
    simt::set_schedule_warp_ahead(0);
    size_t early = 0;
    e = simt::error_of([&] { early = fp8_vs_twin<4>(k, false); });
    simt::set_schedule(random, seed);
    free_case(k);
    MESSAGE("stage released before its MMAs completed: " << early << " mismatches; " << e.substr(0, 200));
#if defined(SIMT_RACE_DETECT)
    CHECK(e.find("race in kernel experts_up_grouped_fp8") != std::string::npos);
#else
    CHECK(early > 0);
#endif
    free_case(c);
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "FP8 grouped expert GEMMs", 20261127); }
