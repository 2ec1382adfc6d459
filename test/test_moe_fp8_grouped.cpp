/*
 * test_moe_fp8_grouped.cpp — the experts' FP8 block-scaled grouped up-projection (model/moe_grouped_fp8.cuh) under
 * the SIMT emulator, against
 *   - a double-precision CPU product of the dequantised operands (sum over k of sx * s1|s2 * x8 * w8): g and u
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
 * promotion skipped for k block 1, 3 expect_tx 16 bytes high (a reported deadlock).
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
    std::vector<uint8_t> xe, w1, v1;   // E4M3 codes
    std::vector<float> sx, s1, s2;     // the dequantisation factors (layouts: model/moe_grouped_fp8.cuh)
    uint8_t *dxe, *dw1, *dv1;
    float *dsx, *ds1, *ds2;
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
    c.dxe = dev_copy(c.xe); c.dw1 = dev_copy(c.w1); c.dv1 = dev_copy(c.v1);
    c.dsx = dev_copy(c.sx); c.ds1 = dev_copy(c.s1); c.ds2 = dev_copy(c.s2);
    c.doff = dev_copy(c.off);
    return c;
}
static void free_case(Fp8Case& c) {
    for (void* p : {(void*)c.dxe, (void*)c.dw1, (void*)c.dv1, (void*)c.dsx, (void*)c.ds1, (void*)c.ds2, (void*)c.doff}) cudaCheck(cudaFree(p));
}

// cuBLASLt's twin, expert by expert: out (R, F) BF16 = xe_e w^T with the block factors (column-major D (F, n_e) is
// row-major (n_e, F)); the activations' factors copied per expert (VEC128's outer size is the GEMM's n = n_e)
static std::vector<uint16_t> twin_up(const Fp8Case& c, const std::vector<uint8_t>& w, const std::vector<float>& sw) {
    std::vector<uint16_t> out((size_t)c.R * c.F);
    for (int e = 0; e < c.E; e++) {
        const int n = c.off[e + 1] - c.off[e];
        if (n == 0) continue;
        std::vector<float> sxe((size_t)c.d / 128 * n);
        for (int kb = 0; kb < c.d / 128; kb++)
            for (int j = 0; j < n; j++) sxe[(size_t)kb * n + j] = c.sx[(size_t)kb * c.R + c.off[e] + j];
        TwinGemm g;
        memset(&g, 0, sizeof g);
        g.trans_a = true; g.m = c.F; g.n = n; g.k = c.d; g.batch = 1; g.alpha = 1.0f;
        g.A = w.data() + (size_t)e * c.F * c.d; g.lda = c.d;
        g.B = c.xe.data() + (size_t)c.off[e] * c.d; g.ldb = c.d;
        g.D = out.data() + (size_t)c.off[e] * c.F; g.ldd = c.F; g.ldc = c.F;
        g.a_type = g.b_type = CUDA_R_8F_E4M3; g.d_type = CUDA_R_16BF;
        g.a_scale = sw.data() + (size_t)e * c.F / 128 * c.KB4; g.a_mode = 2;
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

// the double-precision product of the dequantised operands: g, u (and their sums of |terms|) of row r, column j
static void cpu_gu(const Fp8Case& c, int e, int r, int j, double* val, double* mag) {
    for (int h = 0; h < 2; h++) {
        const std::vector<uint8_t>& w = h ? c.v1 : c.w1;
        const std::vector<float>& sw = h ? c.s2 : c.s1;
        const uint8_t* x = &c.xe[(size_t)r * c.d];
        const uint8_t* wr = &w[((size_t)e * c.F + j) * c.d];
        double v = 0, m = 0;
        for (int kb = 0; kb < c.d / 128; kb++) {
            double f = (double)c.sx[(size_t)kb * c.R + r] * sw[((size_t)e * c.F + j) / 128 * c.KB4 + kb];
            for (int p = kb * 128; p < kb * 128 + 128; p++) {
                double t = f * dec(x[p]) * dec(wr[p]);
                v += t; m += std::fabs(t);
            }
        }
        val[h] = v; mag[h] = m;
    }
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
                bad += !(std::fabs(G[i] - v[0]) <= std::ldexp(std::fabs(v[0]), -8) + std::ldexp(m[0], -16));
                bad += !(std::fabs(U[i] - v[1]) <= std::ldexp(std::fabs(v[1]), -8) + std::ldexp(m[1], -16));
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
    std::vector<uint16_t> tg = twin_up(c, c.w1, c.s1), tu = twin_up(c, c.v1, c.s2), ta(tg.size());
    for (size_t i = 0; i < ta.size(); i++) ta[i] = __nv_bfloat16_raw(__float2bfloat16(swiglu_value(bf(tg[i]), bf(tu[i])))).x;
    size_t bad = bit_mismatches(g, tg, c.R, c.F) + bit_mismatches(u, tu, c.R, c.F) + bit_mismatches(a, ta, c.R, c.F);
    if (check_cpu) CHECK(cpu_mismatches(c, g, u, a) == 0);
    for (void* p : {(void*)g, (void*)u, (void*)a}) cudaCheck(cudaFree(p));
    return bad;
}

#if defined(SIMT_RACE_DETECT)
static const std::vector<int> COUNTS = {0, 1, 65, 0, 130, 64};
constexpr int D_RUN = 384, F_RUN = 128;
#else
static const std::vector<int> COUNTS = {0, 1, 63, 64, 65, 200, 0, 129, 7, 128, 0, 31, 96, 2, 190, 65};   // 1035 rows
constexpr int D_RUN = 384, F_RUN = 256;
#endif

TEST_CASE("FP8 grouped up: the CPU product, cuBLASLt's twin bit for bit; uneven experts, tails, several tiles a block") {
    Fp8Case c = make_case(COUNTS, D_RUN, F_RUN);
    CHECK(fp8_vs_twin(c, true) == 0);
    free_case(c);
}

TEST_CASE("FP8 grouped up: d 1024 (8 k-tiles through 6 stages), the last expert empty") {
    Fp8Case c = make_case({70, 0, 130, 257, 1, 0}, 1024, 128);
    CHECK(fp8_vs_twin(c, true) == 0);
    free_case(c);
}

#if !defined(SIMT_RACE_DETECT)
TEST_CASE("FP8 grouped up at DBRX-132B's d 6144 and F 10752 (one at a time)") {
    Fp8Case c = make_case({70, 0, 130}, 6144, 128);   // 48 k-tiles: 8 passes around the ring per tile
    CHECK(fp8_vs_twin(c, true) == 0);
    free_case(c);
    Fp8Case f = make_case({70, 0, 130}, 128, 10752);   // 168 n-tiles x 2 m-tiles over 3 blocks
    CHECK(fp8_vs_twin(f, false) == 0);
    free_case(f);
}
#endif

TEST_CASE("FP8 grouped up negative controls: a wrong k block's factor, a skipped promotion, expect_tx") {
    Fp8Case c = make_case({65, 0, 130}, 384, 128);
    size_t wrong_block = fp8_vs_twin<1>(c, false), skipped = fp8_vs_twin<2>(c, false);
    MESSAGE("next k block's activation factor: " << wrong_block << " mismatches; promotion of k block 1 skipped: " << skipped);
    CHECK(wrong_block > 0);
    CHECK(skipped > 0);
    std::string e = simt::error_of([&] { fp8_vs_twin<3>(c, false); });
    MESSAGE(e.substr(0, 300));
    CHECK(e.find("deadlock in kernel experts_up_grouped_fp8") != std::string::npos);
    CHECK(e.find("tx-count 16 byte(s) not arrived") != std::string::npos);
    free_case(c);
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "FP8 grouped expert GEMMs", 20261127); }
