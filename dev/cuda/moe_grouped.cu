/*
 * moe_grouped.cu — the experts' grouped GEMMs on Hopper's wgmma (model/moe_grouped.cuh: one launch per projection
 * for all experts, the offsets read on the device, SwiGLU fused into the up-projection) against today's path
 * (model/moe.cuh's experts_forward_gpu: one cuBLASLt GEMM per expert, w1 + v1 batched, after a synchronising copy
 * of the offsets, then swiglu_forward_kernel):
 *   v1  one warpgroup, 64 rows x 64 columns of g and u (wgmma N 128) / 64 x 128 of ye, 2 stages (each k-tile's MMAs
 *       waited for before the next are issued)
 *   v2  two warpgroups, 128 rows, the same columns, 4 stages, one k-tile's MMAs in flight while the
 *       next are issued, copies 2 k-tiles ahead (the launchers' defaults)
 *   v3  two warpgroups, 128 rows x 128 columns of g and u (N 256) / 128 x 256 of ye, 4 stages
 *   v4  v3's tiles fed by TMA (model/moe_grouped_tma.cuh): a producer warpgroup whose one thread issues the
 *       stages' bulk tensor copies, 2 consumer warpgroups that only wait on the stage's "full" mbarrier, issue
 *       wgmma and release it on "empty"; 4 stages of 48 KiB, 384 threads (timed on H100s in sessions 39 and 45: dev/bench/results_gpu.md)
 * and, with v4 (-v 4 or a range holding it), the backward's data gradients: today's (experts_backward_gpu: per expert
 * a cuBLASLt da GEMM, swiglu_backward_kernel, two dxe GEMMs; its weight gradients timed alone too) against v4's
 * grouped A (da = dye w2_e^T with SwiGLU's backward fused: dg, du) and B (dxe = dg w1_e + du v1_e), validated the same
 * way (emulated: today's bits) and timed alone and with today's weight gradients (the product's --moe-gemm grouped).
 * Validated at a small shape (rows N k = 1024 over E 16 uneven experts, one empty; d 256, F 384) against the CPU
 * reference (experts_up_forward / experts_down_forward, fp32) and against today's GPU path: emulated, bit for bit
 * (the same k-order fp32 sums as cuBLASLt's twin); on a GPU within BF16 rounding. Then timed (not emulated):
 * the up-projection (g, u, a), the down-projection and the layer, today's path with and without the offsets'
 * copy + sync, in TFLOP/s, and checked against today's path at the timing shape; with v4 also a probe of what limits its
 * main loop (time_tile_probe: the same kernels at N 256 and N 128 tiles).
 *   make dev/cuda/moe_grouped && ./dev/cuda/moe_grouped [-v N | N-M (of 1-4)] [-s 1b | 132b]
 *   1b:   N 16384 tokens, k 4, E 16, d 1024, F 1792 (dbrx-1b);  132b: N 4096, k 4, E 16, d 6144, F 10752 (DBRX-132B)
 */
#include "common.h"
#include "../../model/moe_grouped_tma.cuh"

// the rows of E experts: R rows drawn with weights 1 + e % 4, expert 3 empty (offsets E + 1)
static std::vector<int> make_offsets(int R, int E, uint64_t seed) {
    std::vector<float> r = make_random(R, seed);
    std::vector<int> counts(E, 0), off(E + 1, 0);
    int wsum = 0;
    for (int e = 0; e < E; e++) wsum += e == 3 ? 0 : 1 + e % 4;
    for (int i = 0; i < R; i++) {
        double x = 0.5 * (1.0 + std::erf(r[i] / std::sqrt(2.0))) * wsum;   // uniform in [0, wsum)
        int e = 0;
        for (double acc = 0; e < E - 1; e++) { acc += e == 3 ? 0 : 1 + e % 4; if (x < acc) break; }
        counts[e]++;
    }
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    return off;
}

// BF16-rounded random values; past 2^20 of them a random block of 1048573 (a prime) repeated: the DBRX-132B
// slice's weights are 3 x 1.06 G values, too many to draw one by one on the host
static std::vector<float> bench_random(size_t n, uint64_t seed, double scale) {
    const size_t period = 1048573;
    if (n <= (1u << 20)) return round_bf16(make_random(n, seed, scale));
    std::vector<float> base = round_bf16(make_random(period, seed, scale)), v(n);
    for (size_t i = 0; i < n; i++) v[i] = base[i % period];
    return v;
}

struct Problem {
    int R, E, d, F;
    std::vector<int> off;
    floatX *xe, *w1, *v1, *w2, *g, *u, *a, *ye;
    int *off_dev, *off_host;
};
static Problem make_problem(int N, int k, int E, int d, int F, std::vector<float>* host) {
    Problem p = {N * k, E, d, F, make_offsets(N * k, E, 7), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    std::vector<float> xe = bench_random((size_t)p.R * d, 1, 1.0), w1 = bench_random((size_t)E * F * d, 2, 0.05);
    std::vector<float> v1 = bench_random((size_t)E * F * d, 3, 0.05), w2 = bench_random((size_t)E * F * d, 4, 0.05);
    p.xe = to_device_bf16v(xe); p.w1 = to_device_bf16v(w1); p.v1 = to_device_bf16v(v1); p.w2 = to_device_bf16v(w2);
    p.g = deviceAlloc(floatX, (size_t)p.R * F); p.u = deviceAlloc(floatX, (size_t)p.R * F); p.a = deviceAlloc(floatX, (size_t)p.R * F);
    p.ye = deviceAlloc(floatX, (size_t)p.R * d);
    p.off_dev = to_device(p.off);
    cudaCheck(cudaMallocHost((void**)&p.off_host, (E + 1) * sizeof(int)));
    if (host) { host[0] = xe; host[1] = w1; host[2] = v1; host[3] = w2; }
    return p;
}
static void free_problem(Problem& p) {
    for (void* x : {(void*)p.xe, (void*)p.w1, (void*)p.v1, (void*)p.w2, (void*)p.g, (void*)p.u, (void*)p.a, (void*)p.ye, (void*)p.off_dev})
        cudaCheck(cudaFree(x));
    cudaCheck(cudaFreeHost(p.off_host));
}

#define NVERSIONS 4
static const char* const NAMES[NVERSIONS] = {"v1 1 warpgroup, 2 stages", "v2 2 warpgroups, 4 stages", "v3 2 warpgroups, N 256",
                                             "v4 TMA producer + 2 warpgroups, N 256"};
static void run_up(int v, Problem& p, floatX* g, floatX* u, floatX* a) {
    if (v == 1) experts_up_grouped_gpu<1, 64, 2>(g, u, a, p.xe, p.w1, p.v1, p.off_dev, p.E, p.d, p.F);
    else if (v == 2) experts_up_grouped_gpu<2, 64, 4>(g, u, a, p.xe, p.w1, p.v1, p.off_dev, p.E, p.d, p.F);
    else if (v == 3) experts_up_grouped_gpu<2, 128, 4>(g, u, a, p.xe, p.w1, p.v1, p.off_dev, p.E, p.d, p.F);
    else experts_up_grouped_tma_gpu(g, u, a, p.xe, p.w1, p.v1, p.off_dev, p.R, p.E, p.d, p.F);
}
static void run_down(int v, Problem& p, floatX* ye, const floatX* a) {
    if (v == 1) experts_down_grouped_gpu<1, 128, 2>(ye, a, p.w2, p.off_dev, p.E, p.d, p.F);
    else if (v == 2) experts_down_grouped_gpu<2, 128, 4>(ye, a, p.w2, p.off_dev, p.E, p.d, p.F);
    else if (v == 3) experts_down_grouped_gpu<2, 256, 4>(ye, a, p.w2, p.off_dev, p.E, p.d, p.F);
    else experts_down_grouped_tma_gpu(ye, a, p.w2, p.off_dev, p.R, p.E, p.d, p.F);
}
// today's path: the offsets to the host (the dispatch's synchronising copy), then experts_forward_gpu
static void run_today(Problem& p, bool sync, bool down) {
    if (sync) {
        cudaCheck(cudaMemcpyAsync(p.off_host, p.off_dev, (p.E + 1) * sizeof(int), cudaMemcpyDeviceToHost, 0));
        cudaCheck(cudaStreamSynchronize(0));
    }
    experts_forward_gpu(down ? p.ye : nullptr, p.g, p.u, p.a, p.xe, p.w1, p.v1, p.w2, p.off.data(), p.E, p.d, p.F);
}

// every version at the validation shape against the CPU and today's path (emulated: bit for bit)
static void validate_versions(int lo, int hi) {
    const int N = 256, k = 4, E = 16, d = 256, F = 384;
    std::vector<float> host[4];
    Problem p = make_problem(N, k, E, d, F, host);
    size_t nf = (size_t)p.R * F, nd = (size_t)p.R * d;
    std::vector<float> g(nf), u(nf), a(nf), ye(nd);
    experts_up_forward(g.data(), u.data(), a.data(), host[0].data(), host[1].data(), host[2].data(), p.off.data(), E, d, F);
    experts_down_forward(ye.data(), a.data(), host[3].data(), p.off.data(), E, d, F);
    run_today(p, true, true);
    std::vector<float> tg = from_device_bf16v(p.g, nf), tu = from_device_bf16v(p.u, nf), ta = from_device_bf16v(p.a, nf),
                       tye = from_device_bf16v(p.ye, nd);
    // ye against the CPU: from BF16 a (the CPU's a is fp32), sums of F products that cancel: 1e-2 of max |ye|
    validate("today's path: a vs the CPU", ta, a, 2e-2, 2e-3);
    validate("today's path: ye vs the CPU", tye, ye, 2e-2, 1e-2);
    const double rt = EMULATED ? 0 : 1e-2, at = EMULATED ? 0 : 1e-3;   // emulated: the same bits
    char what[96];
    for (int v = 1; v <= NVERSIONS; v++) {
        if (v < lo || v > hi) continue;
        for (floatX* x : {p.g, p.u, p.a, p.ye}) cudaCheck(cudaMemset(x, 0xFF, (x == p.ye ? nd : nf) * sizeof(floatX)));
        run_up(v, p, p.g, p.u, p.a);
        run_down(v, p, p.ye, p.a);
        std::vector<float> ga = from_device_bf16v(p.a, nf), gye = from_device_bf16v(p.ye, nd);
        snprintf(what, sizeof what, "v%d a vs the CPU", v); validate(what, ga, a, 2e-2, 2e-3);
        snprintf(what, sizeof what, "v%d ye vs the CPU", v); validate(what, gye, ye, 2e-2, 1e-2);
        snprintf(what, sizeof what, "v%d g vs today's", v); validate(what, from_device_bf16v(p.g, nf), tg, rt, at);
        snprintf(what, sizeof what, "v%d u vs today's", v); validate(what, from_device_bf16v(p.u, nf), tu, rt, at);
        snprintf(what, sizeof what, "v%d a vs today's", v); validate(what, ga, ta, rt, at);
        // (ye from today's a: the grouped a may differ from it on a GPU by a rounding)
        snprintf(what, sizeof what, "v%d ye vs today's", v); validate(what, gye, tye, EMULATED ? 0 : 2e-2, EMULATED ? 0 : 2e-3);
    }
    free_problem(p);
}

// the backward's buffers: dye (R, d), da, dg, du (R, F), dxe (R, d), the weight gradients dw1, dv1, dw2 (3 E F d, fp32)
struct Grads { floatX *dye, *da, *dg, *du, *dxe; float* dw; };
static Grads make_grads(const Problem& p, std::vector<float>* dye_host) {
    size_t nf = (size_t)p.R * p.F, nd = (size_t)p.R * p.d;
    std::vector<float> dye = bench_random(nd, 5, 1.0);
    Grads q = {to_device_bf16v(dye), deviceAlloc(floatX, nf), deviceAlloc(floatX, nf), deviceAlloc(floatX, nf), deviceAlloc(floatX, nd),
               deviceAlloc(float, 3 * (size_t)p.E * p.F * p.d)};
    if (dye_host) *dye_host = dye;
    return q;
}
static void free_grads(Grads& q) { for (void* x : {(void*)q.dye, (void*)q.da, (void*)q.dg, (void*)q.du, (void*)q.dxe, (void*)q.dw}) cudaCheck(cudaFree(x)); }
// today's backward from the forward's g, u, a in p: dgrad 0 the weight gradients only (dxe null: no da, SwiGLU, dxe)
static void run_bwd_today(Problem& p, Grads& q, bool dgrad) {
    size_t nw = (size_t)p.E * p.F * p.d;
    experts_backward_gpu(dgrad ? q.dxe : nullptr, q.dw, q.dw + nw, q.dw + 2 * nw, q.da, q.dg, q.du, q.dye, p.xe, p.g, p.u, p.a, p.w1, p.v1,
                         p.w2, p.off.data(), p.E, p.d, p.F, 0, 0.0f);
}
static void run_bwd_a(Problem& p, Grads& q) { experts_down_backward_grouped_tma_gpu(q.dg, q.du, nullptr, q.dye, p.w2, p.g, p.u, p.off_dev, p.R, p.E, p.d, p.F); }
static void run_bwd_b(Problem& p, Grads& q) { experts_up_backward_grouped_tma_gpu(q.dxe, q.dg, q.du, p.w1, p.v1, p.off_dev, p.R, p.E, p.d, p.F); }

// v4's backward data gradients at the validation shape against the CPU and today's path (emulated: bit for bit)
static void validate_backward() {
    const int N = 256, k = 4, E = 16, d = 256, F = 384;
    std::vector<float> host[4], dye;
    Problem p = make_problem(N, k, E, d, F, host);
    Grads q = make_grads(p, &dye);
    size_t nf = (size_t)p.R * F, nd = (size_t)p.R * d, nw = (size_t)E * F * d;
    std::vector<float> g(nf), u(nf), a(nf), da(nf), dg(nf), du(nf), dxe(nd), dw(3 * nw, 0.0f);
    experts_up_forward(g.data(), u.data(), a.data(), host[0].data(), host[1].data(), host[2].data(), p.off.data(), E, d, F);
    experts_down_backward(da.data(), dw.data(), dye.data(), host[3].data(), a.data(), dye.data(), p.off.data(), E, d, F);
    swiglu_backward(dg.data(), du.data(), da.data(), g.data(), u.data(), nf);
    experts_up_backward(dxe.data(), dw.data() + nw, dw.data() + 2 * nw, dg.data(), du.data(), host[1].data(), host[2].data(), dg.data(),
                        du.data(), host[0].data(), p.off.data(), E, d, F);
    run_today(p, true, false);
    run_bwd_today(p, q, true);
    std::vector<float> tdg = from_device_bf16v(q.dg, nf), tdu = from_device_bf16v(q.du, nf), tdxe = from_device_bf16v(q.dxe, nd);
    validate("today's backward: dg vs the CPU", tdg, dg, 3e-2, 3e-3);
    validate("today's backward: dxe vs the CPU", tdxe, dxe, 2e-2, 1e-2);
    for (floatX* x : {q.dg, q.du, q.dxe}) cudaCheck(cudaMemset(x, 0xFF, (x == q.dxe ? nd : nf) * sizeof(floatX)));
    run_bwd_a(p, q);
    run_bwd_b(p, q);
    const double rt = EMULATED ? 0 : 1e-2, at = EMULATED ? 0 : 1e-3;   // emulated: the same bits
    std::vector<float> gdg = from_device_bf16v(q.dg, nf), gdu = from_device_bf16v(q.du, nf), gdxe = from_device_bf16v(q.dxe, nd);
    validate("v4 backward A: dg vs the CPU", gdg, dg, 3e-2, 3e-3);
    validate("v4 backward A: du vs the CPU", gdu, du, 3e-2, 3e-3);
    validate("v4 backward B: dxe vs the CPU", gdxe, dxe, 2e-2, 1e-2);
    validate("v4 backward A: dg vs today's", gdg, tdg, rt, at);
    validate("v4 backward A: du vs today's", gdu, tdu, rt, at);
    validate("v4 backward B: dxe vs today's", gdxe, tdxe, EMULATED ? 0 : 2e-2, EMULATED ? 0 : 2e-3);
    free_grads(q);
    free_problem(p);
}
// the backward timed at the timing shape (p holds today's forward): today's, its weight gradients alone, v4's A, B
static void time_backward(Problem& p) {
    Grads q = make_grads(p, nullptr);
    double dgrad = 6.0 * p.R * p.d * p.F, wgrad = 6.0 * p.R * p.d * p.F;
    report_flops("today: backward (dgrad + wgrad)", dgrad + wgrad, time_ms(5, [&] { run_bwd_today(p, q, true); }));
    report_flops("today: backward, wgrad only", wgrad, time_ms(5, [&] { run_bwd_today(p, q, false); }));
    std::vector<float> tdxe = from_device_bf16v(q.dxe, (size_t)p.R * p.d);
    report_flops("v4 backward A: da, SwiGLU bwd", dgrad / 3, time_ms(10, [&] { run_bwd_a(p, q); }));
    report_flops("v4 backward B: dxe", dgrad * 2 / 3, time_ms(10, [&] { run_bwd_b(p, q); }));
    report_flops("v4 backward: dgrad (A + B)", dgrad, time_ms(10, [&] { run_bwd_a(p, q); run_bwd_b(p, q); }));
    report_flops("v4 backward + today's wgrad", dgrad + wgrad, time_ms(5, [&] { run_bwd_a(p, q); run_bwd_b(p, q); run_bwd_today(p, q, false); }));
    validate("v4 backward at the timing shape: dxe vs today's", from_device_bf16v(q.dxe, (size_t)p.R * p.d), tdxe, 2e-2, 2e-3);
    free_grads(q);
}

// What limits v4's main loop? Each k-tile brings A (128 rows) and B (N columns) into shared memory through L2 for
// 2 x 128 x N x 64 FLOPs: 85 FLOPs per byte at N 256 (the launchers'), 64 at N 128. If the operands' path (L2 to the
// SMs) is the limit, the N 128 tiles run at ~64 / 85 = 0.75 of the N 256 ones' rate, and the cure is a cluster of two
// blocks sharing one operand (TMA multicast, as cuBLASLt's and CUTLASS's Hopper kernels do); if the rates are about
// equal, it is not, and the epilogue's time (the up-projection with and without g, u) is the lever. (At DBRX-132B's
// shape, -s 132b, each tile's K loop is long and the tiles are many: the epilogue and the last wave weigh little.)
static void time_tile_probe(Problem& p, const std::vector<float>& ta, const std::vector<float>& tye) {
    const double up = 2.0 * p.R * p.d * 2.0 * p.F, down = 2.0 * p.R * p.F * p.d;
    auto up_a = [&](auto launch) { return time_ms(10, [&] { launch(nullptr, nullptr, p.a, p.xe, p.w1, p.v1, p.off_dev, p.R, p.E, p.d, p.F, 0); }); };
    auto dn = [&](auto launch) { return time_ms(10, [&] { launch(p.ye, p.a, p.w2, p.off_dev, p.R, p.E, p.d, p.F, 0); }); };
    report_flops("v4 probe: up, a only, N 256 (85 FLOP/B)", up, up_a(experts_up_grouped_tma_gpu<128, 4, 0>));
    report_flops("v4 probe: up, a only, N 128 (64 FLOP/B)", up, up_a(experts_up_grouped_tma_gpu<64, 4, 0>));
    validate("v4 probe at N 128: a vs today's", from_device_bf16v(p.a, (size_t)p.R * p.F), ta, 1e-2, 1e-3);
    report_flops("v4 probe: down, N 256 (85 FLOP/B)", down, dn(experts_down_grouped_tma_gpu<256, 4, 0>));
    report_flops("v4 probe: down, N 128 (64 FLOP/B)", down, dn(experts_down_grouped_tma_gpu<128, 4, 0>));
    validate("v4 probe at N 128: ye vs today's", from_device_bf16v(p.ye, (size_t)p.R * p.d), tye, 2e-2, 2e-3);
}

int main(int argc, char** argv) {
    int lo = 1, hi = NVERSIONS, big = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        if (!strcmp(argv[i], "-v")) {   // -v N: version N; -v N-M: N to M (bench_gpu.sh times an untried version on its own)
            int n = sscanf(argv[i + 1], "%d-%d", &lo, &hi);
            if (n == 1) hi = lo;
            if (n >= 1 && lo >= 1 && lo <= hi && hi <= NVERSIONS) continue;
        } else if (!strcmp(argv[i], "-s") && (!strcmp(argv[i + 1], "1b") || !strcmp(argv[i + 1], "132b"))) {
            big = !strcmp(argv[i + 1], "132b");
            continue;
        }
        fprintf(stderr, "usage: %s [-v N or N-M (versions 1-%d)] [-s 1b | 132b]\n", argv[0], NVERSIONS);
        return 2;
    }
    const int N = big ? 4096 : 16384, k = 4, E = 16, d = big ? 6144 : 1024, F = big ? 10752 : 1792;
    char shape[128];
    if (EMULATED) snprintf(shape, sizeof shape, "rows 1024, E 16 (one empty), d 256, F 384");
    else snprintf(shape, sizeof shape, "N %d, k %d, E %d, d %d, F %d (validated at rows 1024, d 256, F 384)", N, k, E, d, F);
    print_header("moe grouped GEMM (wgmma)", shape);
    validate_versions(lo, hi);
    if (hi >= 4) validate_backward();
    if (!EMULATED) {
        Problem p = make_problem(N, k, E, d, F, nullptr);
        double up = 2.0 * p.R * d * 2.0 * F, down = 2.0 * p.R * F * d;
        report_flops("today: up (w1+v1 GEMMs, SwiGLU)", up, time_ms(10, [&] { run_today(p, false, false); }));
        report_flops("today: layer, offsets on the host", up + down, time_ms(10, [&] { run_today(p, false, true); }));
        report_flops("today: layer, sync + copy first", up + down, time_ms(10, [&] { run_today(p, true, true); }));
        std::vector<float> ta = from_device_bf16v(p.a, (size_t)p.R * F), tye = from_device_bf16v(p.ye, (size_t)p.R * d);
        char what[96];
        for (int v = 1; v <= NVERSIONS; v++) {
            if (v < lo || v > hi) continue;
            snprintf(what, sizeof what, "%s: up", NAMES[v - 1]);
            report_flops(what, up, time_ms(10, [&] { run_up(v, p, p.g, p.u, p.a); }));
            snprintf(what, sizeof what, "%s: up, a only", NAMES[v - 1]);
            report_flops(what, up, time_ms(10, [&] { run_up(v, p, nullptr, nullptr, p.a); }));
            snprintf(what, sizeof what, "%s: down", NAMES[v - 1]);
            report_flops(what, down, time_ms(10, [&] { run_down(v, p, p.ye, p.a); }));
            snprintf(what, sizeof what, "%s: layer", NAMES[v - 1]);
            report_flops(what, up + down, time_ms(10, [&] { run_up(v, p, p.g, p.u, p.a); run_down(v, p, p.ye, p.a); }));
            snprintf(what, sizeof what, "v%d at the timing shape: a vs today's", v);
            validate(what, from_device_bf16v(p.a, (size_t)p.R * F), ta, 1e-2, 1e-3);
            snprintf(what, sizeof what, "v%d at the timing shape: ye vs today's", v);
            validate(what, from_device_bf16v(p.ye, (size_t)p.R * d), tye, 2e-2, 2e-3);
        }
        if (hi >= 4) {
            time_tile_probe(p, ta, tye);
            run_today(p, false, true);
            time_backward(p);
        }
        free_problem(p);
    }
    return finish();
}
