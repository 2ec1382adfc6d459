/*
 * test_moe_grouped.cpp — the experts' grouped wgmma GEMMs (model/moe_grouped.cuh) under the SIMT emulator:
 * experts_up_grouped_gpu (g, u, a = silu(g) u fused) and experts_down_grouped_gpu (ye) against
 *   - the CPU reference (experts_up_forward / experts_down_forward, fp32 throughout: BF16 tolerances), and
 *   - today's GPU path (experts_forward_gpu: per-expert cuBLASLt GEMMs + swiglu_forward_kernel) BIT FOR BIT:
 *     the emulated wgmma and cuBLASLt's twin both sum the k products in order in fp32 from 0, and the epilogue
 *     rounds g and u to BF16 before the SwiGLU as swiglu_forward_kernel does (on a GPU the orders differ);
 * at DBRX-like slices (d 256, F 384; E 16 with counts 0, 1, 63, 64, 65, 200, ... : empty experts, partial tiles,
 * an empty last expert) in each kernel configuration, a-only (g = u = null), and E 128 (the scheduler's limit,
 * most experts empty). Outputs are allocated poisoned (NaN) with guard rows past the end: an unwritten row, or
 * a row written past an expert's end, fails. Negative controls (they must fail): PLANT 1, the scheduler's m-tile
 * count rounded down (the tails never computed); PLANT 2, the store mask one row too far.
 * v4 (model/moe_grouped_tma.cuh: TMA-fed stages, a producer warpgroup, full/empty mbarriers) the same way, with
 * A's tensor maps ending at the R rows (the last tile's rows past them TMA's zero fill), through 4 and 2 stages, at
 * E 128 and at DBRX-132B's d 6144 (96 k-tiles) and F 10752 (84 n-tiles, 168 k-tiles) one at a time; its negative
 * controls: PLANT 1, 2 as above, 4 the producer's empty wait skipped (a second arrival on a "full" barrier in its
 * phase, reported), 5 an expect_tx 16 bytes high (a reported deadlock), 6 a stage released before its MMAs
 * completed (NaN poison read; a race under the detector).
 * The backward's data gradients on v4 (A: da = dye w2_e^T with SwiGLU's backward fused, dg and du stored; B: dxe =
 * dg w1_e + du v1_e) against the CPU and today's path (experts_backward_gpu) bit for bit, from today's forward's g, u
 * (guard rows poisoned): the forward's counts, both directions of N (64/256), 2-6 stages, a warp run ahead, E 128, and
 * DBRX-132B's d 6144 and F 10752; planted bugs: the scheduler's floor and store mask in A and in B, B's products in
 * one fp32 sum, A's SwiGLU backward from the unrounded da (today's rounding points), B's early release and A's
 * producer loading the next tile's g, u without waiting for the epilogue's release (PLANT 10) or released before the
 * epilogue read them (PLANT 11) (under the detector,
 * which runs the pipeline's cases only: races).
 * The step's functions (experts_forward_step_gpu, experts_backward_step_gpu) grouped vs per expert at d 256, bit for bit.
 * make test/test_race_moe_grouped builds it under the race detector (the cp.async stages, wgmma, barriers),
 * where PLANT 3 (the end-of-k-tile barrier dropped: a stage refilled while the other warpgroup's wgmma reads it)
 * must be reported as a race, and v4's PLANT 9 (the epilogue staging's __syncwarp dropped) in the up-projection and A.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <algorithm>
#include <cstring>
#include "cuda_test_helpers.h"
#include "../model/moe_experts_step.cuh"

static const int GUARD = 64;   // poisoned rows after each output

struct Case {
    int E, d, F, R;
    std::vector<int> off;
    std::vector<float> xe, w1, v1, w2;
    floatX *dxe, *dw1, *dv1, *dw2;
    int* doff;
};
static Case make_case(const std::vector<int>& counts, int d, int F) {
    Case c;
    c.E = (int)counts.size(); c.d = d; c.F = F;
    c.off.assign(c.E + 1, 0);
    for (int e = 0; e < c.E; e++) c.off[e + 1] = c.off[e] + counts[e];
    c.R = c.off[c.E];
    size_t nw = (size_t)c.E * F * d;
    c.xe = randn((size_t)c.R * d, 1); c.w1 = randn(nw, 2, 0.06); c.v1 = randn(nw, 3, 0.06); c.w2 = randn(nw, 4, 0.06);
    for (auto* v : {&c.xe, &c.w1, &c.v1, &c.w2})
        for (float& x : *v) x = __bfloat162float(__float2bfloat16(x));
    auto up = [](const std::vector<float>& v) { floatX* p = dev_poisoned<floatX>(v.size()); to_device_bf16(p, v.data(), v.size()); return p; };
    c.dxe = up(c.xe); c.dw1 = up(c.w1); c.dv1 = up(c.v1); c.dw2 = up(c.w2);
    c.doff = dev_copy(c.off);
    return c;
}
static void free_case(Case& c) { for (void* p : {(void*)c.dxe, (void*)c.dw1, (void*)c.dv1, (void*)c.dw2, (void*)c.doff}) cudaCheck(cudaFree(p)); }

// the outputs of one path: g, u, a (R + GUARD rows of F), ye (R + GUARD rows of d), poisoned
struct Out { floatX *g, *u, *a, *ye; };
static Out make_out(const Case& c) {
    size_t nf = (size_t)(c.R + GUARD) * c.F, nd = (size_t)(c.R + GUARD) * c.d;
    return {dev_poisoned<floatX>(nf), dev_poisoned<floatX>(nf), dev_poisoned<floatX>(nf), dev_poisoned<floatX>(nd)};
}
static void free_out(Out& o) { for (void* p : {(void*)o.g, (void*)o.u, (void*)o.a, (void*)o.ye}) cudaCheck(cudaFree(p)); }
static std::vector<uint16_t> bits(const floatX* p, size_t n) { return get((const uint16_t*)p, n); }

// elements of `got` (rows R, then GUARD poisoned rows) differing in bits from `want` (R rows), plus guard elements
// no longer 0xFFFF
static size_t bit_mismatches(const floatX* got, const floatX* want, int R, int cols) {
    std::vector<uint16_t> g = bits(got, (size_t)(R + GUARD) * cols), w = bits(want, (size_t)R * cols);
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); i++) bad += i < w.size() ? g[i] != w[i] : g[i] != 0xFFFF;
    return bad;
}
static size_t close_mismatches(const floatX* got, const std::vector<float>& want, double rtol, double atol) {
    std::vector<float> g = get_bf16(got, want.size());
    double maxw = 0;
    for (float w : want) maxw = std::max(maxw, (double)std::fabs(w));
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); i++) bad += !(std::fabs((double)g[i] - want[i]) <= rtol * std::fabs(want[i]) + atol * maxw);
    return bad;
}

// one run of a grouped path (run(o): o.g, o.u (null when a_only), o.a, o.ye) against today's; returns the mismatches
// against today's path (g, u, a, ye; a only: a)
template <typename Run>
static size_t path_vs_today(Case& c, bool a_only, bool check_cpu, Run run) {
    Out t = make_out(c), o = make_out(c);
    experts_forward_gpu(t.ye, t.g, t.u, t.a, c.dxe, c.dw1, c.dv1, c.dw2, c.off.data(), c.E, c.d, c.F);
    run(Out{a_only ? nullptr : o.g, a_only ? nullptr : o.u, o.a, o.ye});
    size_t bad = bit_mismatches(o.a, t.a, c.R, c.F) + bit_mismatches(o.ye, t.ye, c.R, c.d);
    if (!a_only) bad += bit_mismatches(o.g, t.g, c.R, c.F) + bit_mismatches(o.u, t.u, c.R, c.F);
    if (check_cpu) {   // fp32 CPU: a within BF16 rounding of g, u, a; ye from BF16 a, cancelling sums: 1e-2 of max |ye|
        std::vector<float> g((size_t)c.R * c.F), u(g.size()), a(g.size()), ye((size_t)c.R * c.d);
        experts_up_forward(g.data(), u.data(), a.data(), c.xe.data(), c.w1.data(), c.v1.data(), c.off.data(), c.E, c.d, c.F);
        experts_down_forward(ye.data(), a.data(), c.w2.data(), c.off.data(), c.E, c.d, c.F);
        CHECK(close_mismatches(o.a, a, 2e-2, 2e-3) == 0);
        CHECK(close_mismatches(o.ye, ye, 2e-2, 1e-2) == 0);
        if (!a_only) CHECK(close_mismatches(o.g, g, 1e-2, 1e-3) == 0);
    }
    free_out(t); free_out(o);
    return bad;
}
// one configuration of the cp.async kernels (v1-v3)
template <int WG, int BNU, int BND, int STAGES, int PLANT = 0>
static size_t grouped_vs_today(Case& c, bool a_only, bool check_cpu) {
    return path_vs_today(c, a_only, check_cpu, [&](Out o) {
        experts_up_grouped_gpu<WG, BNU, STAGES, PLANT>(o.g, o.u, o.a, c.dxe, c.dw1, c.dv1, c.doff, c.E, c.d, c.F);
        experts_down_grouped_gpu<WG, BND, STAGES, PLANT>(o.ye, o.a, c.dw2, c.doff, c.E, c.d, c.F);
    });
}
// one configuration of the TMA-fed kernels (v4): A's tensor maps end at the R rows (the last tile's rows past them
// are TMA's zero fill; the outputs' guard rows are never read)
template <int BNU, int BND, int STAGES, int PLANT = 0>
static size_t tma_vs_today(Case& c, bool a_only, bool check_cpu) {
    return path_vs_today(c, a_only, check_cpu, [&](Out o) {
        experts_up_grouped_tma_gpu<BNU, STAGES, PLANT>(o.g, o.u, o.a, c.dxe, c.dw1, c.dv1, c.doff, c.R, c.E, c.d, c.F);
        experts_down_grouped_tma_gpu<BND, STAGES, PLANT>(o.ye, o.a, c.dw2, c.doff, c.R, c.E, c.d, c.F);
    });
}

static const std::vector<int> COUNTS = {0, 1, 63, 64, 65, 200, 0, 129, 7, 128, 0, 31, 96, 2, 190, 65};   // 1035 rows
#if defined(SIMT_RACE_DETECT)
// under the detector (each access checked: ~10x slower) a sixth of the work reaches the same paths: empty experts, one
// row, a tail, whole tiles, 2 tiles and a tail; 4 k-tiles each way, so every stage ring wraps across a block's tiles
static const std::vector<int> COUNTS_RUN = {0, 1, 65, 0, 130, 64};
constexpr int D_RUN = 256, F_RUN = 256;
#else
static const std::vector<int>& COUNTS_RUN = COUNTS;
constexpr int D_RUN = 256, F_RUN = 384;
#endif

// the persistent schedule's tile order (grouped_tile, host-side): every (expert, m-tile, n-tile) exactly once, and the
// tiles in flight together (132 blocks) inside a big expert share few n-tiles (the weights' L2 reuse)
TEST_CASE("grouped tile schedule: each tile once; groups of 16 m-tiles, m fastest") {
    const std::vector<int> counts = {0, 2053, 1, 0, 4100, 300, 0, 128};   // 17, 1, 33, 3, 1 m-tiles of 128
    const int E = (int)counts.size();
    std::vector<int> s_off(E + 1, 0), s_mt(E + 1, 0);
    for (int e = 0; e < E; e++) {
        s_off[e + 1] = s_off[e] + counts[e];
        s_mt[e + 1] = s_mt[e] + (counts[e] + 127) / 128;
    }
    for (int NT : {1, 3, 14, 84}) {
        std::vector<int> seen((size_t)s_mt[E] * NT, 0);
        for (int t = 0; t < s_mt[E] * NT; t++) {
            GroupedTile tile = grouped_tile<128, 128>(s_mt.data(), s_off.data(), E, NT, t);
            REQUIRE(counts[tile.e] > 0);
            REQUIRE(tile.row_end == s_off[tile.e + 1]);
            const int mt = (tile.m0 - s_off[tile.e]) / 128, nt = tile.n0 / 128;
            REQUIRE(tile.m0 == s_off[tile.e] + 128 * mt);
            REQUIRE((mt >= 0 && mt < s_mt[tile.e + 1] - s_mt[tile.e] && nt >= 0 && nt < NT));
            seen[(size_t)(s_mt[tile.e] + mt) * NT + nt]++;
        }
        CHECK(std::count(seen.begin(), seen.end(), 1) == (long)seen.size());
        // expert 4 (33 m-tiles): its first 132 tiles touch ceil(132 / 16) n-tiles, not all NT (n fastest did)
        std::vector<int> ns;
        const int first = s_mt[4] * NT, tiles4 = (s_mt[5] - s_mt[4]) * NT;
        for (int t = first; t < first + std::min(132, tiles4); t++)
            ns.push_back(grouped_tile<128, 128>(s_mt.data(), s_off.data(), E, NT, t).n0);
        std::sort(ns.begin(), ns.end());
        CHECK(std::unique(ns.begin(), ns.end()) - ns.begin() <= std::min(NT, (132 + 15) / 16));
    }
}

TEST_CASE("grouped up (fused SwiGLU) and down: CPU reference, today's path bit for bit, each configuration") {
    Case c = make_case(COUNTS_RUN, D_RUN, F_RUN);
    CHECK(grouped_vs_today<2, 64, 128, 4>(c, false, true) == 0);    // the launchers' defaults (v2)
    CHECK(grouped_vs_today<1, 64, 128, 2>(c, false, false) == 0);   // v1
    CHECK(grouped_vs_today<2, 128, 256, 4>(c, true, false) == 0);   // v3, a only
    CHECK(grouped_vs_today<1, 64, 128, 3>(c, false, false) == 0);   // 3 stages: copies 1 k-tile ahead, MMAs in flight
    free_case(c);
}

TEST_CASE("grouped GEMMs: E 128, most experts empty, the last ones too") {
    std::vector<int> counts(128, 0);
    for (int e = 0; e < 100; e += 3) counts[e] = 1 + e % 70;
    Case c = make_case(counts, 128, 128);
    CHECK(grouped_vs_today<2, 64, 128, 3>(c, false, true) == 0);
    CHECK(tma_vs_today<128, 128, 3>(c, false, false) == 0);   // v4 (d 128: down tiles of 128 columns)
    free_case(c);
}

TEST_CASE("negative controls: a planted scheduler off-by-one and store mask are caught") {
    Case c = make_case(COUNTS, 128, 128);
    size_t floor_tiles = grouped_vs_today<1, 64, 128, 2, 1>(c, false, false);
    size_t past_end = grouped_vs_today<1, 64, 128, 2, 2>(c, false, false);
    MESSAGE("m-tiles rounded down: " << floor_tiles << " mismatches; store mask one row too far: " << past_end);
    CHECK(floor_tiles > 0);
    CHECK(past_end > 0);
    free_case(c);
}

TEST_CASE("v4 (TMA-fed, warp-specialised): CPU reference, today's path bit for bit, each configuration") {
    Case c = make_case(COUNTS_RUN, D_RUN, F_RUN);
    CHECK(tma_vs_today<128, 256, 4>(c, false, true) == 0);    // the launchers' defaults
    CHECK(tma_vs_today<128, 256, 4>(c, true, false) == 0);    // a only
    CHECK(tma_vs_today<64, 128, 2>(c, false, false) == 0);    // N 128, 2 stages: every k-tile waits for its stage
    // the producer's warp run ahead of the consumers, then a consumer warp ahead of the producer
    const bool random = simt::options().random;
    const uint64_t seed = simt::options().seed;
    for (int w : {0, 4}) {
        simt::set_schedule_warp_ahead(w);
        INFO("warp " << w << " ahead");
        CHECK(tma_vs_today<128, 256, 2>(c, false, false) == 0);
    }
    simt::set_schedule(random, seed);
    free_case(c);
}

#if !defined(SIMT_RACE_DETECT)
// DBRX-132B's d and F, one at a time (the other small): 96 k-tiles (24 passes around the ring) of the up-projection
// and 24 n-tiles of 256 of the down-projection; then 84 n-tiles of the up-projection and 168 k-tiles of the down's
TEST_CASE("v4 at DBRX-132B's d 6144 and F 10752 (one at a time): many passes around the stage ring") {
    Case c = make_case({70, 0, 130, 257}, 6144, 128);   // 6 m-tiles: 2 per block, each 96 k-tiles
    CHECK(tma_vs_today<128, 256, 4>(c, false, true) == 0);
    free_case(c);
    Case f = make_case({70, 0, 130, 257}, 128, 10752);
    CHECK(tma_vs_today<128, 128, 4>(f, false, true) == 0);
    free_case(f);
}
#endif

// PLANT 6, a stage released before its MMAs completed: the refill's copy is issued over the stage the MMAs read at
// their wait (NaN poison read: mismatches), a race under the detector; run() returns the mismatches. (Also PLANT 11,
// A's g and u released before the epilogue read them: `what`)
template <typename Run>
static void check_early_release(const char* kernel, Run run, const char* what = "a stage released before its MMAs completed") {
    size_t bad = 0;
    std::string e = simt::error_of([&] { bad = run(); });
    MESSAGE(std::string(kernel) << ": " << what << ": " << bad << " mismatches; " << e);
#if defined(SIMT_RACE_DETECT)
    CHECK(e.find(std::string("race in kernel ") + kernel) != std::string::npos);
#else
    CHECK(bad > 0);
#endif
}

TEST_CASE("v4 negative controls: the scheduler, the store mask, the empty barrier, expect_tx, an early release") {
    Case c = make_case({65, 0, 130}, 128, 128);
    size_t floor_tiles = tma_vs_today<128, 128, 4, 1>(c, false, false), past_end = tma_vs_today<128, 128, 4, 2>(c, false, false);
    MESSAGE("v4: m-tiles rounded down: " << floor_tiles << " mismatches; store mask one row too far: " << past_end);
    CHECK(floor_tiles > 0);
    CHECK(past_end > 0);
    // a wrong expect_tx: the phase never completes, reported as a deadlock with the bytes missing
    std::string e = simt::error_of([&] { tma_vs_today<128, 128, 4, 5>(c, false, false); });
    CHECK(e.find("deadlock in kernel experts_up_grouped_tma") != std::string::npos);
    CHECK(e.find("tx-count 16 byte(s) not arrived") != std::string::npos);
    free_case(c);
    // the producer's empty wait skipped, a stage released before its MMAs completed: stages overwritten while read
    // (8 k-tiles of the up-projection through 2 stages)
    Case k = make_case({65, 0, 130}, 512, 128);
    // (skipped: the producer runs ahead and arrives on a stage's "full" barrier again within its phase)
    e = simt::error_of([&] { tma_vs_today<128, 128, 2, 4>(k, false, false); });
    MESSAGE("v4 empty wait skipped: " << e);
    CHECK(e.find("mbarrier.arrive with 0 arrival(s) pending in the current phase") != std::string::npos);
    check_early_release("experts_up_grouped_tma", [&] { return tma_vs_today<128, 128, 2, 6>(k, false, false); });
    free_case(k);
}

// the backward's data gradients: today's (experts_backward_gpu: per expert a cuBLASLt da GEMM, swiglu_backward_kernel,
// the two dxe GEMMs, the second adding to the first's BF16 output) against kernels A (da, dg, du: SwiGLU's backward
// fused) and B (dxe), from today's forward's g, u, a (poisoned guard rows past R: PLANT 2 reads them) and a random dye.
// Returns the bit mismatches (dg, du, da, dxe, guard rows included); check_cpu: also the fp32 CPU reference
template <int BNA, int BNX, int STAGES, int PLANT_A = 0, int PLANT_X = 0, int STAGES_X = STAGES>
static size_t bwd_vs_today(Case& c, bool check_cpu) {
    const int R = c.R, d = c.d, F = c.F;
    const size_t nw = (size_t)c.E * F * d;
    Out f = make_out(c), t = make_out(c), o = make_out(c);   // t, o: g dg, u du, a da, ye dxe
    experts_forward_gpu(f.ye, f.g, f.u, f.a, c.dxe, c.dw1, c.dv1, c.dw2, c.off.data(), c.E, d, F);
    std::vector<float> dye = randn((size_t)R * d, 5);
    for (float& x : dye) x = __bfloat162float(__float2bfloat16(x));
    floatX* ddye = dev_poisoned<floatX>(dye.size());
    to_device_bf16(ddye, dye.data(), dye.size());
    float* dw = dev_poisoned<float>(3 * nw);
    experts_backward_gpu(t.ye, dw, dw + nw, dw + 2 * nw, t.a, t.g, t.u, ddye, c.dxe, f.g, f.u, f.a, c.dw1, c.dv1, c.dw2, c.off.data(), c.E, d,
                         F, 0, 0.0f);
    experts_down_backward_grouped_tma_gpu<BNA, STAGES, PLANT_A>(o.g, o.u, o.a, ddye, c.dw2, f.g, f.u, c.doff, R, c.E, d, F);
    experts_up_backward_grouped_tma_gpu<BNX, STAGES_X, PLANT_X>(o.ye, o.g, o.u, c.dw1, c.dv1, c.doff, R, c.E, d, F);
    size_t bad = bit_mismatches(o.g, t.g, R, F) + bit_mismatches(o.u, t.u, R, F) + bit_mismatches(o.a, t.a, R, F) +
                 bit_mismatches(o.ye, t.ye, R, d);
    if (check_cpu) {   // fp32 throughout: BF16 roundings of g, u, da, dg, du apart; dxe sums 2F cancelling products
        std::vector<float> g((size_t)R * F), u(g.size()), a(g.size()), da(g.size()), dg(g.size()), du(g.size()), dxe((size_t)R * d);
        std::vector<float> dw2(nw, 0.0f), dw1(nw, 0.0f), dv1(nw, 0.0f);
        experts_up_forward(g.data(), u.data(), a.data(), c.xe.data(), c.w1.data(), c.v1.data(), c.off.data(), c.E, d, F);
        experts_down_backward(da.data(), dw2.data(), dye.data(), c.w2.data(), a.data(), dye.data(), c.off.data(), c.E, d, F);
        swiglu_backward(dg.data(), du.data(), da.data(), g.data(), u.data(), g.size());
        experts_up_backward(dxe.data(), dw1.data(), dv1.data(), dg.data(), du.data(), c.w1.data(), c.v1.data(), dg.data(), du.data(),
                            c.xe.data(), c.off.data(), c.E, d, F);
        CHECK(close_mismatches(o.a, da, 1e-2, 1e-3) == 0);
        CHECK(close_mismatches(o.g, dg, 3e-2, 3e-3) == 0);
        CHECK(close_mismatches(o.u, du, 3e-2, 3e-3) == 0);
        CHECK(close_mismatches(o.ye, dxe, 2e-2, 1e-2) == 0);
    }
    for (void* p : {(void*)ddye, (void*)dw}) cudaCheck(cudaFree(p));
    free_out(f); free_out(t); free_out(o);
    return bad;
}

TEST_CASE("grouped backward (A: da then SwiGLU's backward fused; B: dxe): CPU reference, today's path bit for bit") {
    Case c = make_case(COUNTS_RUN, D_RUN, F_RUN);
    CHECK(bwd_vs_today<128, 128, 5, 0, 0, 6>(c, true) == 0);   // the launchers' defaults
    CHECK(bwd_vs_today<64, 256, 2>(c, false) == 0);   // wgmma N 64 and 256; 2 stages: every k-tile waits for its stage
    // the producer's warp run ahead of the consumers, then a consumer warp ahead of the producer
    const bool random = simt::options().random;
    const uint64_t seed = simt::options().seed;
    for (int w : {0, 4}) {
        simt::set_schedule_warp_ahead(w);
        INFO("warp " << w << " ahead");
        CHECK(bwd_vs_today<128, 128, 3>(c, false) == 0);
    }
    simt::set_schedule(random, seed);
    free_case(c);
}

#if !defined(SIMT_RACE_DETECT)   // (the scheduler's, not the pipeline's: not under the detector)
TEST_CASE("grouped backward: E 128, most experts empty, the last ones too") {
    std::vector<int> counts(128, 0);
    for (int e = 0; e < 100; e += 3) counts[e] = 1 + e % 70;
    Case c = make_case(counts, 128, 128);
    CHECK(bwd_vs_today<128, 128, 4>(c, false) == 0);
    free_case(c);
}

// DBRX-132B's d and F, one at a time: A's K 6144 (96 k-tiles) and B's 48 n-tiles; then A's 84 n-tiles and B's K over
// F 10752 twice (336 k-tiles per tile, 56 passes around the ring)
TEST_CASE("grouped backward at DBRX-132B's d 6144 and F 10752 (one at a time)") {
    Case c = make_case({70, 0, 130, 257}, 6144, 128);
    CHECK(bwd_vs_today<128, 128, 5, 0, 0, 6>(c, true) == 0);
    free_case(c);
    Case f = make_case({70, 0, 130, 257}, 128, 10752);
    CHECK(bwd_vs_today<128, 128, 5, 0, 0, 6>(f, true) == 0);
    free_case(f);
}
#endif

// the step's two functions (experts_forward_step_gpu, experts_backward_step_gpu) with g_moe_grouped 0 and 1 at d 256
// (the down-projection's 256-column tiles; test_moe_gemm.sh's model has d 128): the same bits, forward (g, u, a, ye)
// and backward (dxe, dg, du, the weight gradients: the empty expert's zeroed by the grouped path); the grouped path leaves
// da unwritten (fused), today's writes it
TEST_CASE("the step's expert functions: --moe-gemm grouped bit for bit the per-expert path at d 256") {
    Case c = make_case({65, 0, 130, 1}, 256, 256);
    const size_t nw = (size_t)c.E * c.F * c.d;
    std::vector<float> dye = randn((size_t)c.R * c.d, 5);
    floatX* ddye = dev_poisoned<floatX>(dye.size());
    to_device_bf16(ddye, dye.data(), dye.size());
    Out f[2], b[2];   // b: ye dxe, g dg, u du, a da
    float* dw[2];
    for (int grouped = 0; grouped < 2; grouped++) {
        g_moe_grouped = grouped;
        Out x = f[grouped] = make_out(c), y = b[grouped] = make_out(c);
        float* w = dw[grouped] = dev_poisoned<float>(3 * nw);
        experts_forward_step_gpu(x.ye, x.g, x.u, x.a, c.dxe, c.dw1, c.dv1, c.dw2, c.doff, c.off.data(), c.R, c.E, c.d, c.F);
        experts_backward_step_gpu(y.ye, w, w + nw, w + 2 * nw, y.a, y.g, y.u, ddye, c.dxe, x.g, x.u, x.a, c.dw1, c.dv1, c.dw2, c.doff,
                                  c.off.data(), c.R, c.E, c.d, c.F, 0.0f);
    }
    g_moe_grouped = 0;
    CHECK(bit_mismatches(f[1].ye, f[0].ye, c.R, c.d) + bit_mismatches(f[1].a, f[0].a, c.R, c.F) == 0);
    CHECK(bit_mismatches(f[1].g, f[0].g, c.R, c.F) + bit_mismatches(f[1].u, f[0].u, c.R, c.F) == 0);
    CHECK(bit_mismatches(b[1].ye, b[0].ye, c.R, c.d) == 0);
    CHECK(bit_mismatches(b[1].g, b[0].g, c.R, c.F) + bit_mismatches(b[1].u, b[0].u, c.R, c.F) == 0);
    // the weight gradients (wbeta 0): equal but for the empty expert 1, which the grouped kernels overwrite with zeros and
    // the per-expert path leaves (the step's experts_zero_empty_kernel zeroes it there, model/moe.cuh)
    std::vector<uint32_t> w1 = get((const uint32_t*)dw[1], 3 * nw), w0 = get((const uint32_t*)dw[0], 3 * nw);
    const size_t ne = (size_t)c.F * c.d;   // one expert's slice of dw1, dv1 or dw2
    long differ = 0, zeros = 0;
    for (size_t i = 0; i < 3 * nw; i++) {
        if (i % nw / ne == 1) zeros += w1[i] == 0;
        else differ += w1[i] != w0[i];
    }
    CHECK(differ == 0);
    CHECK(zeros == (long)(3 * ne));
    std::vector<uint16_t> da1 = bits(b[1].a, (size_t)c.R * c.F), da0 = bits(b[0].a, (size_t)c.R * c.F);
    CHECK(std::count(da1.begin(), da1.end(), 0xFFFF) == (long)da1.size());   // (grouped: da never stored)
    CHECK(std::count(da0.begin(), da0.end(), 0xFFFF) == 0);
    for (int i = 0; i < 2; i++) {
        free_out(f[i]); free_out(b[i]);
        cudaCheck(cudaFree(dw[i]));
    }
    cudaCheck(cudaFree(ddye));
    free_case(c);
}

TEST_CASE("grouped backward negative controls: the scheduler, the store mask, the rounding points, an early release") {
    Case c = make_case({65, 0, 130, 1}, 128, 256);
#if !defined(SIMT_RACE_DETECT)   // (under the detector the early release alone)
    size_t a_floor = bwd_vs_today<128, 128, 4, 1, 0>(c, false), a_past = bwd_vs_today<128, 128, 4, 2, 0>(c, false);
    size_t x_floor = bwd_vs_today<128, 128, 4, 0, 1>(c, false), x_past = bwd_vs_today<128, 128, 4, 0, 2>(c, false);
    MESSAGE("A: m-tiles rounded down " << a_floor << ", store mask one row too far " << a_past << "; B: " << x_floor << ", " << x_past);
    CHECK(a_floor > 0); CHECK(a_past > 0); CHECK(x_floor > 0); CHECK(x_past > 0);
    // today's rounding points: B's two products in one fp32 sum, A's SwiGLU backward from the unrounded da (both close to
    // the CPU, not today's bits)
    size_t one_sum = bwd_vs_today<128, 128, 4, 0, 7>(c, false), unrounded = bwd_vs_today<128, 128, 4, 8, 0>(c, false);
    MESSAGE("B's products in one sum: " << one_sum << " mismatches; A's SwiGLU backward from fp32 da: " << unrounded);
    CHECK(one_sum > 0); CHECK(unrounded > 0);
#endif
    // B releasing a stage before its MMAs completed (K over F twice: 8 k-tiles through 2 stages)
    check_early_release("experts_up_backward_grouped_tma", [&] { return bwd_vs_today<128, 128, 2, 0, 6>(c, false); });
    // A's producer not waiting for the epilogue to release the tile's g and u: the next tile's loaded over them while
    // read (the copy's poison read: mismatches; under the detector a read of a TMA destination not landed)
    // (or, with the producer's next arrival inside epi_full's phase, an mbarrier error)
    {
        size_t bad = 0;
        const std::string e = simt::error_of([&] { bad = bwd_vs_today<128, 128, 4, 10, 0>(c, false); });
        MESSAGE("A's g, u loaded over the epilogue's: " << bad << " mismatches; " << e);
        CHECK((bad > 0 || e.find("race in kernel experts_down_backward_grouped_tma") != std::string::npos ||
               e.find("mbarrier error in kernel experts_down_backward_grouped_tma") != std::string::npos));
    }
    // A's consumers releasing g and u before their epilogue reads them (PLANT 11): the producer, waiting as it should,
    // loads the next tile's over them
    check_early_release("experts_down_backward_grouped_tma", [&] { return bwd_vs_today<128, 128, 4, 11, 0>(c, false); },
                        "g and u released before the epilogue read them");
    free_case(c);
}

#if defined(SIMT_RACE_DETECT)
TEST_CASE("grouped up: negative control for the detector, the end-of-k-tile barrier dropped") {
    Case c = make_case({65, 0, 130}, 128, 128);
    std::string e = simt::error_of([&] { grouped_vs_today<2, 64, 128, 3, 3>(c, false, false); });
    MESSAGE(e);
    CHECK(e.find("race in kernel") != std::string::npos);
    free_case(c);
}

// v4's epilogue staging (moe_grouped.cuh's grouped_stage_*): PLANT 9 drops the __syncwarp between the lanes' fragment
// writes and the other lanes' reads of the warp's buffer (the coalesced stores), in each kernel
TEST_CASE("v4 epilogues: negative control for the detector, the staging's __syncwarp dropped") {
    Case c = make_case({65, 0, 130}, 128, 128);
    const std::string up = simt::error_of([&] { tma_vs_today<128, 128, 4, 9>(c, false, false); });
    const std::string da = simt::error_of([&] { bwd_vs_today<128, 128, 4, 9, 0>(c, false); });
    MESSAGE(up << "\n" << da);   // (B, experts_up_backward_grouped_tma, stores from its fragments: no staging)
    CHECK(up.find("race in kernel experts_up_grouped_tma") != std::string::npos);
    CHECK(da.find("race in kernel experts_down_backward_grouped_tma") != std::string::npos);
    free_case(c);
}
#endif

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "grouped expert GEMMs", 20261126); }
