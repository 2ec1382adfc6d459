/*
 * test_moe_wgrad.cpp — the experts' grouped weight-gradient GEMM (model/moe_grouped_wgrad.cuh) under the SIMT emulator:
 * dW_e = beta dW_e + X_e^T Y_e per expert (fp32) against
 *   - a double-precision CPU product (within fp32 summation error: (n_e + 2) 2^-23 of the sum of |terms|), and
 *   - today's path BIT FOR BIT: model/moe.cuh's per-expert cuBLASLt GEMM (gemm_gpu(true, false, M, N, n_e, ...) on the
 *     twin; an empty expert skipped, zeroed when beta is 0, as block_experts_backward does), and experts_backward_gpu's
 *     dw1, dv1, dw2 themselves (from its dg, du and the forward's a, xe, dye);
 * beta 0 (dW allocated NaN: every element must be written, empty experts' included) and 1 (dW random), uneven experts
 * (0, 1, 63, 64, 65, 200, ... rows: empty ones, one row, tails of every kind, 1035 rows in all), tiles of 128 x 256 and
 * 128 x 128, 4 and 2 stages (the ring wrapping across a block's tiles: 3 persistent blocks), rows past the last expert
 * inside the allocation (finite, must add nothing) or past the tensor (TMA's zeros), E 128, and DBRX-132B's F 10752
 * (84 m-tiles) and d 6144 (24 n-tiles). A guard of NaN floats after dW must stay NaN.
 * Negative controls (they must fail): PLANT 1 the tail k-steps read from the stage as they are (wrong sums);
 * 2 the producer's empty wait skipped (reported by the emulator); 3 a tail k-tile's stage read without waiting for
 * its "full" barrier (NaN poison; a race under the detector, make test/test_race_moe_wgrad); 4 the beta != 0
 * epilogue's batches of loads all reading the first batch's old dW (wrong sums); 5 the schedule's snake shifted in
 * odd rounds (a tile never written: NaN).
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <cstring>
#include "cuda_test_helpers.h"
#include "../model/moe_grouped_wgrad.cuh"

static const int GUARD_ROWS = 64;     // finite rows of X and Y past the last expert
static const size_t GUARD_F = 4096;   // NaN floats after dW

struct Wcase {
    int E, M, N, R;
    std::vector<int> off;
    std::vector<float> x, y;   // (R + GUARD_ROWS, M), (R + GUARD_ROWS, N), BF16 values
    floatX *dx, *dy;
    int* doff;
};
static Wcase make_wcase(const std::vector<int>& counts, int M, int N) {
    Wcase c;
    c.E = (int)counts.size(); c.M = M; c.N = N;
    c.off.assign(c.E + 1, 0);
    for (int e = 0; e < c.E; e++) c.off[e + 1] = c.off[e] + counts[e];
    c.R = c.off[c.E];
    c.x = randn((size_t)(c.R + GUARD_ROWS) * M, 11); c.y = randn((size_t)(c.R + GUARD_ROWS) * N, 12);
    for (auto* v : {&c.x, &c.y})
        for (float& f : *v) f = __bfloat162float(__float2bfloat16(f));
    c.dx = dev_poisoned<floatX>(c.x.size()); to_device_bf16(c.dx, c.x.data(), c.x.size());
    c.dy = dev_poisoned<floatX>(c.y.size()); to_device_bf16(c.dy, c.y.data(), c.y.size());
    c.doff = dev_copy(c.off);
    return c;
}
static void free_wcase(Wcase& c) { for (void* p : {(void*)c.dx, (void*)c.dy, (void*)c.doff}) cudaCheck(cudaFree(p)); }

// today's path for one projection (model/moe.cuh's experts_backward_gpu, block_experts_backward's zeroing)
static void today_wgrad(float* dw, const floatX* X, const floatX* Y, const std::vector<int>& off, int E, int M, int N, float beta) {
    for (int e = 0; e < E; e++) {
        int r0 = off[e], n = off[e + 1] - off[e];
        size_t wo = (size_t)e * M * N;
        if (n == 0) {
            if (beta == 0.0f) cudaCheck(cudaMemset(dw + wo, 0, (size_t)M * N * sizeof(float)));
            continue;
        }
        gemm_gpu(true, false, M, N, n, 1.0f, X + (size_t)r0 * M, M, Y + (size_t)r0 * N, N, beta, dw + wo, N);
    }
}

// dW (E M N) then GUARD_F floats: beta 0 all NaN, else random values then the NaN guard
static float* make_dw(const Wcase& c, float beta, std::vector<float>* init) {
    size_t n = (size_t)c.E * c.M * c.N;
    float* p = dev_poisoned<float>(n + GUARD_F);
    if (beta != 0.0f) {
        *init = randn(n, 21);
        cudaCheck(cudaMemcpy(p, init->data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    return p;
}
static size_t bit_mismatches(const float* got, const float* want, size_t n) {
    std::vector<uint32_t> g = get((const uint32_t*)got, n + GUARD_F), w = get((const uint32_t*)want, n);
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); i++) bad += i < n ? g[i] != w[i] : g[i] != 0xFFFFFFFFu;
    return bad;
}
// against the double-precision product: |got - want| <= (n_e + 2) 2^-23 (sum of |x y| + |beta old|)
static size_t cpu_mismatches(const Wcase& c, const float* got, float beta, const std::vector<float>& init) {
    std::vector<float> g = get(got, (size_t)c.E * c.M * c.N);
    size_t bad = 0;
    for (int e = 0; e < c.E; e++)
        for (int m = 0; m < c.M; m++)
            for (int j = 0; j < c.N; j++) {
                size_t o = ((size_t)e * c.M + m) * c.N + j;
                double s = beta != 0.0f ? beta * (double)init[o] : 0.0, mag = std::fabs(s);
                for (int r = c.off[e]; r < c.off[e + 1]; r++) {
                    double t = (double)c.x[(size_t)r * c.M + m] * c.y[(size_t)r * c.N + j];
                    s += t;
                    mag += std::fabs(t);
                }
                bad += !(std::fabs(g[o] - s) <= (c.off[e + 1] - c.off[e] + 2) * 0x1p-23 * mag);
            }
    return bad;
}

// one configuration against today's path (bit mismatches, guard included) and, if asked, the CPU
template <int BN, int STAGES, int PLANT = 0>
static size_t wgrad_vs_today(Wcase& c, float beta, int rows, bool check_cpu) {
    std::vector<float> init;
    float *t = make_dw(c, beta, &init), *o = make_dw(c, beta, &init);
    today_wgrad(t, c.dx, c.dy, c.off, c.E, c.M, c.N, beta);
    experts_wgrad_grouped_gpu<BN, STAGES, PLANT>(o, c.dx, c.dy, c.doff, rows, c.E, c.M, c.N, beta);
    size_t n = (size_t)c.E * c.M * c.N, bad = bit_mismatches(o, t, n);
    if (check_cpu) CHECK(cpu_mismatches(c, o, beta, init) == 0);
    cudaCheck(cudaFree(t)); cudaCheck(cudaFree(o));
    return bad;
}

static const std::vector<int> COUNTS = {0, 1, 63, 64, 65, 200, 0, 129, 7, 128, 0, 31, 96, 2, 190, 65};   // 1035 rows
#if defined(SIMT_RACE_DETECT)
// under the detector (~10x slower): empty experts, one row, a tail, 2 k-tiles and a tail, whole k-tiles
static const std::vector<int> COUNTS_RUN = {0, 1, 65, 0, 130, 64};
#else
static const std::vector<int>& COUNTS_RUN = COUNTS;
#endif

TEST_CASE("grouped wgrad: CPU product, today's path bit for bit, beta 0 and 1, each configuration") {
    Wcase c = make_wcase(COUNTS_RUN, 128, 256);
    for (float beta : {0.0f, 1.0f}) {
        INFO("beta " << beta);
        CHECK(wgrad_vs_today<256, 4>(c, beta, c.R, true) == 0);                 // the launcher's defaults; TMA's zeros past R
        CHECK(wgrad_vs_today<128, 2>(c, beta, c.R + GUARD_ROWS, false) == 0);   // finite rows past the last expert
    }
    // the producer's warp run ahead of the consumers, then a consumer warp ahead of the producer
    const bool random = simt::options().random;
    const uint64_t seed = simt::options().seed;
    for (int w : {0, 4}) {
        simt::set_schedule_warp_ahead(w);
        INFO("warp " << w << " ahead");
        CHECK(wgrad_vs_today<256, 2>(c, 1.0f, c.R, false) == 0);
    }
    simt::set_schedule(random, seed);
    free_wcase(c);
}

TEST_CASE("grouped wgrad: the product's three weight gradients bit for bit (experts_backward_gpu)") {
    const std::vector<int>& counts = COUNTS_RUN;
    const int d = 256, F = 128, E = (int)counts.size();
    Wcase c = make_wcase(counts, F, d);   // (x: a, y: xe; dye, g, u, weights below)
    const size_t rf = (size_t)(c.R + GUARD_ROWS) * F, rd = (size_t)(c.R + GUARD_ROWS) * d, nw = (size_t)E * F * d;
    auto up = [](const std::vector<float>& v) { floatX* p = dev_poisoned<floatX>(v.size()); to_device_bf16(p, v.data(), v.size()); return p; };
    floatX *dye = up(randn(rd, 31)), *g = up(randn(rf, 32)), *u = up(randn(rf, 33)), *w1 = up(randn(nw, 34, 0.06)), *v1 = up(randn(nw, 35, 0.06)),
           *w2 = up(randn(nw, 36, 0.06));
    floatX *dxe = dev_poisoned<floatX>(rd), *da = dev_poisoned<floatX>(rf), *dg = dev_poisoned<floatX>(rf), *du = dev_poisoned<floatX>(rf);
    // (the rows past R of dg, du: finite, as the product's scratch would hold)
    cudaCheck(cudaMemset(dg, 0, rf * sizeof(floatX))); cudaCheck(cudaMemset(du, 0, rf * sizeof(floatX)));
    for (float beta : {1.0f, 0.0f}) {
        INFO("wbeta " << beta);
        std::vector<float> init;
        float* t[3] = {make_dw(c, beta, &init), make_dw(c, beta, &init), make_dw(c, beta, &init)};
        float* o[3] = {make_dw(c, beta, &init), make_dw(c, beta, &init), make_dw(c, beta, &init)};
        experts_backward_gpu(dxe, t[0], t[1], t[2], da, dg, du, dye, c.dy, g, u, c.dx, w1, v1, w2, c.off.data(), E, d, F, 0, beta);
        if (beta == 0.0f)   // block_experts_backward's experts_zero_empty_kernel
            for (int e = 0; e < E; e++)
                for (int k = 0; k < 3 && c.off[e + 1] == c.off[e]; k++) cudaCheck(cudaMemset(t[k] + (size_t)e * nw / E, 0, nw / E * sizeof(float)));
        experts_wgrad_grouped_all_gpu(o[0], o[1], o[2], dg, du, c.dx, c.dy, dye, c.doff, c.R, E, d, F, beta);
        for (int k = 0; k < 3; k++) {
            INFO("gradient " << (k == 0 ? "dw1" : k == 1 ? "dv1" : "dw2"));
            CHECK(bit_mismatches(o[k], t[k], nw) == 0);
            cudaCheck(cudaFree(t[k])); cudaCheck(cudaFree(o[k]));
        }
    }
    for (void* p : {(void*)dye, (void*)g, (void*)u, (void*)w1, (void*)v1, (void*)w2, (void*)dxe, (void*)da, (void*)dg, (void*)du}) cudaCheck(cudaFree(p));
    free_wcase(c);
}

#if !defined(SIMT_RACE_DETECT)
TEST_CASE("grouped wgrad: E 128, most experts empty, the last ones too") {
    std::vector<int> counts(128, 0);
    for (int e = 0; e < 100; e += 3) counts[e] = 1 + e % 70;
    Wcase c = make_wcase(counts, 128, 128);
    CHECK(wgrad_vs_today<128, 4>(c, 0.0f, c.R, true) == 0);
    CHECK(wgrad_vs_today<128, 3>(c, 1.0f, c.R, false) == 0);
    free_wcase(c);
}

// DBRX-132B's F (dW's rows: 84 m-tiles per expert) and d (its columns: 24 n-tiles of 256), one at a time
TEST_CASE("grouped wgrad at DBRX-132B's F 10752 and d 6144 (one at a time)") {
    Wcase c = make_wcase({70, 0, 130}, 10752, 256);
    CHECK(wgrad_vs_today<256, 4>(c, 1.0f, c.R, false) == 0);
    free_wcase(c);
    Wcase f = make_wcase({70, 0, 130}, 128, 6144);
    CHECK(wgrad_vs_today<256, 4>(f, 0.0f, f.R, false) == 0);
    free_wcase(f);
}
#endif

TEST_CASE("grouped wgrad negative controls: tails not zeroed, the empty wait skipped, a stage read before it landed, the epilogue's batches, the snake") {
    Wcase c = make_wcase({65, 0, 130, 200}, 128, 128);
    size_t tails = wgrad_vs_today<128, 4, 1>(c, 1.0f, c.R, false);
    MESSAGE("tail k-steps from the stage as they are: " << tails << " mismatches");
    CHECK(tails > 0);
    size_t bad = 0;
    std::string e = simt::error_of([&] { bad = wgrad_vs_today<128, 2, 2>(c, 0.0f, c.R, false); });
    MESSAGE("empty wait skipped: " << e);
    CHECK(e.find("mbarrier.arrive with 0 arrival(s) pending in the current phase") != std::string::npos);
    bad = 0;
    e = simt::error_of([&] { bad = wgrad_vs_today<128, 2, 3>(c, 0.0f, c.R, false); });
    MESSAGE("tail stage read before its full barrier: " << bad << " mismatches; " << e);
#if defined(SIMT_RACE_DETECT)
    CHECK(e.find("race in kernel experts_wgrad_grouped") != std::string::npos);
#else
    CHECK((bad > 0 || !e.empty()));
#endif
    // the epilogue's batches (beta != 0): every batch adding the first batch's old values
    size_t batches = wgrad_vs_today<128, 4, 4>(c, 1.0f, c.R, false);
    MESSAGE("beta 1, every batch of the epilogue with the first one's old dW: " << batches << " mismatches");
    CHECK(batches > 0);
    // the snake's odd rounds shifted (4 tiles over 3 blocks: round 1 holds one, the empty expert's): left NaN (beta 0)
    bad = 0;
    e = simt::error_of([&] { bad = wgrad_vs_today<128, 2, 5>(c, 0.0f, c.R, false); });
    MESSAGE("snake shifted: " << bad << " mismatches; " << e);
    CHECK((bad > 0 || !e.empty()));
    free_wcase(c);
}

int main(int argc, char** argv) { return cuda_test_main(argc, argv, "grouped expert weight gradients", 20261127); }
