/*
 * health.h — the health check run before training (--health-check) or alone (--health-check-only), on
 * every rank, on either backend, so that a bad node stops the job before it costs a training run:
 *   gemm        a square GEMM whose exact result is known (small integers: every product and partial sum
 *               is exact in fp32 accumulation, in any order), every element compared; its rate (the best
 *               of ~5 ms trials over a quarter of a second) against the expected rate: --health-min-tflops
 *               when given, else a fraction of the device's peak when the peak is known (25% of the dense
 *               BF16 peak of a known GPU, 5% of the CPU's FP32 peak); and, with several ranks, against the
 *               median rank: a rank below half the median is named. The CPU backend times its CPU GEMM (gemm_cpu,
 *               OpenBLAS, the rank's OpenMP threads), the CUDA backend a BF16 cuBLASLt GEMM (gemm_gpu).
 *   collectives all_reduce and all_gather of --health-comm-mib MiB over the world (MPI on host buffers
 *               on the CPU backend, NCCL on device buffers on the CUDA backend), timed and checked as
 *               dev/comm_bench does (parallel/comm_check.h); every element exact on every rank, and the
 *               bus bandwidth >= --health-min-busbw GB/s when given.
 *   forward     one forward pass of the configured model with its actual weights on fixed synthetic
 *               tokens (the same on every rank): the loss finite on every rank, and the same on every
 *               rank (relative 1e-4 of the median rank's; the ranks run the same computation on the same
 *               weights). Under ZeRO the forward is collective: every rank runs it. Its FP8 amaxes are
 *               dropped afterwards (zero_skip_update), so a checked run trains exactly as an unchecked one.
 * Every rank's results are all-gathered, so every rank reaches the same verdict from the same numbers and
 * no rank can go on alone. Rank 0 prints one line per check and, for every rank out of range, one line
 * "error: health check: rank R: <what> (<value> vs <expected>)" on stderr; the caller then stops (exit 1).
 * Test hook: DBRX_DEBUG_SLOW_GEMM=R[:F] makes rank R's GEMM do F (8) GEMMs for every one it counts.
 */
#pragma once
#include <algorithm>
#include <string>
#include <vector>
#include "../model/common.h"
#include "../model/matmul.cuh"
#include "comm.h"
#include "comm_check.h"
#include "../model/debug_hooks.h"

typedef struct {
    double min_tflops;    // --health-min-tflops (0: not given)
    double min_busbw;     // --health-min-busbw GB/s (0: correctness only)
    int gemm_n;           // --health-gemm-size (0: the backend's default)
    int comm_mib;         // --health-comm-mib
    int batch, seq;       // the forward's shape: the training's micro-batch
    double median_ratio;  // --health-gemm-ratio: a rank below this x the median rank's GEMM rate is named
} HealthOptions;

// one rank's GEMM measurement
typedef struct { double flops; long long wrong; } HealthGemm;

// what a backend brings: its GEMM, the default size, the peak the rate is compared with
typedef struct {
    std::string gemm_what;                 // for the summary line
    HealthGemm (*gemm)(int n, int slow);   // runs, times and checks the GEMM; slow: work done per GEMM counted
    int gemm_n;                            // default size
    double peak;                           // this rank's peak FLOP/s for that GEMM (0: unknown: no floor)
    double floor_frac;                     // a rank below floor_frac x peak fails (without --health-min-tflops)
    std::string peak_how;
    int device;                            // 1: the collectives run on device buffers over NCCL
} HealthBackend;

static const double HEALTH_LOSS_RTOL = 1e-4;     // the forward loss of every rank within this of the median's

// The known-result GEMM C (n, n) = A (n, n) B (n, n), row-major: A[i][k] = (i + k) % 7 - 3,
// B[k][j] = (k + 2j) % 11 - 5. Products are at most 15 in magnitude, so |C| <= 15 n < 2^24 for n <= 32768:
// exact in fp32 whatever the order of the sums. C[i][j] depends only on (i % 7, j % 11), so the exact
// result is a 7 x 11 table, and every element is compared with it; 7 and 11 are prime to every power-of-two
// tile of a GEMM kernel, so a row, column or tile mix-up lands on a different value.
static inline int health_a(int i, int k) { return (i + k) % 7 - 3; }
static inline int health_b(int k, int j) { return (k + 2 * j) % 11 - 5; }
static inline void health_gemm_table(int n, double* table /* 7 x 11 */) {
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 11; b++) {
            long long s = 0;
            for (int k = 0; k < n; k++) s += (long long)health_a(a, k) * health_b(k, b);
            table[a * 11 + b] = (double)s;
        }
}
static inline long long health_gemm_wrong(const float* c, int n) {
    double table[77];
    health_gemm_table(n, table);
    long long wrong = 0;
    for (int i = 0; i < n; i++) {
        const double* row = table + (i % 7) * 11;
        for (int j = 0, jb = 0; j < n; j++, jb = jb == 10 ? 0 : jb + 1) wrong += (double)c[(size_t)i * n + j] != row[jb];
    }
    return wrong;
}

// the rate of `run` (one counted GEMM of 2 n^3 FLOPs, enqueued) with `sync` (waits for it): a warm-up, then
// trials of about 5 ms for a quarter of a second (at least 5), the best one. The best, not the mean, and
// short trials: another process taking the core (or the GPU) for a while does not make a rank look slow, as
// long as one trial ran alone; a rank slow in every trial is slow.
template <typename Run, typename Sync>
static double health_time_gemm(int n, Run run, Sync sync) {
    run();
    sync();
    double t0 = now_seconds();
    run();
    sync();
    double once = now_seconds() - t0;
    int reps = once > 0 ? (int)std::min(1000.0, std::max(1.0, 0.005 / once)) : 1000;
    double best = 0, start = now_seconds();
    for (int trial = 0; trial < 5 || (trial < 100 && now_seconds() - start < 0.25); trial++) {
        t0 = now_seconds();
        for (int r = 0; r < reps; r++) run();
        sync();
        double t = now_seconds() - t0;
        double rate = t > 0 ? 2.0 * n * n * (double)n * reps / t : 0;
        if (rate > best) best = rate;
        comm_heartbeat();
    }
    return best;
}

// the CPU backend's GEMM: gemm_cpu (OpenBLAS, rows split over this rank's OpenMP threads), fp32
static inline HealthGemm health_gemm_cpu(int n, int slow) {
    std::vector<real> a((size_t)n * n), b((size_t)n * n), c((size_t)n * n);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++) { a[(size_t)i * n + k] = (real)health_a(i, k); b[(size_t)i * n + k] = (real)health_b(i, k); }
    HealthGemm g;
    g.flops = health_time_gemm(n, [&] {
        for (int s = 0; s < slow; s++) gemm_cpu(false, false, n, n, n, 1, a.data(), n, b.data(), n, 0, c.data(), n);
    }, [] {});
    std::vector<float> cf(c.begin(), c.end());
    g.wrong = health_gemm_wrong(cf.data(), n);
    return g;
}

#if DBRX_HAVE_CUDA
// the CUDA backend's GEMM: BF16 operands, FP32 accumulation and output (cuBLASLt through gemm_gpu, the
// model's entry point); the small integers are exact in BF16
static inline HealthGemm health_gemm_gpu(int n, int slow) {
    size_t nn = (size_t)n * n;
    std::vector<floatX> ha(nn), hb(nn);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++) {
            ha[(size_t)i * n + k] = __float2bfloat16((float)health_a(i, k));
            hb[(size_t)i * n + k] = __float2bfloat16((float)health_b(i, k));
        }
    floatX *a, *b;
    float* c;
    cudaCheck(cudaMalloc((void**)&a, nn * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&b, nn * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&c, nn * sizeof(float)));
    cudaCheck(cudaMemcpy(a, ha.data(), nn * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(b, hb.data(), nn * sizeof(floatX), cudaMemcpyHostToDevice));
    HealthGemm g;
    g.flops = health_time_gemm(n, [&] {
        for (int s = 0; s < slow; s++) gemm_gpu(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    }, [] { cudaCheck(cudaDeviceSynchronize()); });
    std::vector<float> hc(nn);
    cudaCheck(cudaMemcpy(hc.data(), c, nn * sizeof(float), cudaMemcpyDeviceToHost));
    g.wrong = health_gemm_wrong(hc.data(), n);
    cudaCheck(cudaFree(a));
    cudaCheck(cudaFree(b));
    cudaCheck(cudaFree(c));
    return g;
}
#endif

// the upper median: with two ranks the faster one, so that the slower is measured against it
static inline double health_median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// the fixed tokens of the forward check: the same on every rank, spread over the vocabulary
static inline int health_token(size_t i, int vocab) { return (int)((i * 37 + 11) % (size_t)vocab); }

// one failure: "rank R: <what> (<value> vs <expected>)"; r < 0: the world's (a collective's bandwidth)
__attribute__((format(printf, 4, 5)))
static void health_error(std::vector<std::string>* errors, int r, int world, const char* fmt, ...) {
    char msg[400], line[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r >= 0) snprintf(line, sizeof line, "rank %d: %s", r, msg);
    else snprintf(line, sizeof line, "all %d ranks: %s", world, msg);
    errors->push_back(line);
}

// Runs the checks on every rank; true when every rank passed. Collective: every rank of the world calls it.
template <typename Model, typename Store>
static bool health_check(const HealthOptions& o, const HealthBackend& be, Comm* comm, Model* model, Store* store) {
    double t_start = now_seconds();
    int W = comm->world, me = comm->rank;
    CommGroup* host = &comm->world_group;
    std::vector<std::string> errors;   // "rank R: what (value vs expected)", the same on every rank

    // ---- the GEMM
    int n = o.gemm_n > 0 ? o.gemm_n : be.gemm_n;
    // (the tests' slow rank, DBRX_DEBUG_SLOW_GEMM: model/debug_hooks.h)
    int slow = g_debug_hooks.slow_gemm_rank == me ? g_debug_hooks.slow_gemm_factor : 1;
    HealthGemm gm = be.gemm(n, slow);
    comm_heartbeat();

    // ---- the collectives: on the backend's transport (NCCL on the GPU: a world communicator of its own)
    size_t bytes = (size_t)o.comm_mib << 20;
    CommGroup nccl_world, *cg = host;
    if (be.device) { nccl_world = comm_world_nccl(comm); cg = &nccl_world; }
    CollectiveResult ar = comm_check_collective(cg, host, "all_reduce", bytes, 2, 5, be.device);
    comm_heartbeat();
    CollectiveResult ag = comm_check_collective(cg, host, "all_gather", bytes, 2, 5, be.device);
    comm_heartbeat();
    if (be.device) comm_group_free(&nccl_world);

    // ---- the forward, on fixed tokens; its FP8 amaxes are not kept (the first step would take them in)
    size_t N = (size_t)o.batch * o.seq;
    int V = model->cfg.vocab_size;
    std::vector<int> inputs(N), targets(N);
    for (size_t i = 0; i < N; i++) { inputs[i] = health_token(i, V); targets[i] = health_token(i + 1, V); }
    double ce = dbrx_forward(model, inputs.data(), targets.data(), 0.0f);
    double loss = ce + model->lbl_loss + model->z_loss;
    zero_skip_update(store);
    comm_heartbeat();

    // ---- every rank's numbers to every rank: the same verdict everywhere
    const int K = 5;
    double mine[K] = {gm.flops, (double)gm.wrong, (double)ar.wrong_local, (double)ag.wrong_local, loss};
    std::vector<double> all((size_t)W * K);
    comm_all_gather(host, mine, all.data(), K, COMM_F64);
    auto at = [&](int r, int k) { return all[(size_t)r * K + k]; };
    char buf[512];
    std::vector<std::string> lines;

    // gemm: exact everywhere; the rate against the floor and the median
    std::vector<double> rates(W);
    int exact = 0, slowest = 0;
    for (int r = 0; r < W; r++) {
        rates[r] = at(r, 0);
        exact += at(r, 1) == 0;
        if (rates[r] < rates[slowest]) slowest = r;
    }
    double median = health_median(rates), rel_floor = W > 1 ? o.median_ratio * median : 0;
    double abs_floor = o.min_tflops > 0 ? o.min_tflops * 1e12 : be.peak > 0 ? be.floor_frac * be.peak : 0;
    std::string abs_what;
    if (o.min_tflops > 0) abs_what = "--health-min-tflops";
    else if (be.peak > 0) {
        snprintf(buf, sizeof buf, "%.0f%% of the peak %.4g TFLOP/s, %s", 100 * be.floor_frac, be.peak / 1e12, be.peak_how.c_str());
        abs_what = buf;
    }
    for (int r = 0; r < W; r++) {
        if (at(r, 1) != 0)
            health_error(&errors, r, W, "gemm %dx%dx%d result wrong (%.0f of %lld elements vs 0)", n, n, n, at(r, 1),
                         (long long)n * n);
        if (abs_floor > 0 && rates[r] < abs_floor)
            health_error(&errors, r, W, "gemm %.4g TFLOP/s (vs >= %.4g: %s)", rates[r] / 1e12, abs_floor / 1e12, abs_what.c_str());
        else if (rates[r] < rel_floor)
            health_error(&errors, r, W, "gemm %.4g TFLOP/s (vs >= %.4g: %.1f x the median %.4g of %d ranks)", rates[r] / 1e12,
                         rel_floor / 1e12, o.median_ratio, median / 1e12, W);
    }
    size_t n_gemm_err = errors.size();
    {
        std::string expect;
        if (rel_floor > 0) { snprintf(buf, sizeof buf, ">= %.4g (%.1f x median)", rel_floor / 1e12, o.median_ratio); expect = buf; }
        if (abs_floor > 0) {
            snprintf(buf, sizeof buf, "%s>= %.4g (%s)", expect.empty() ? "" : ", ", abs_floor / 1e12, abs_what.c_str());
            expect += buf;
        }
        snprintf(buf, sizeof buf, "health: gemm %dx%dx%d %s: exact on %d of %d rank(s); TFLOP/s median %.4g, slowest rank %d %.4g "
                 "(%.2f x median); expected %s: %s", n, n, n, be.gemm_what.c_str(), exact, W, median / 1e12, slowest,
                 rates[slowest] / 1e12, median > 0 ? rates[slowest] / median : 0.0,
                 expect.empty() ? "no bound (1 rank, unknown peak)" : expect.c_str(), n_gemm_err ? "FAILED" : "ok");
        lines.push_back(buf);
    }

    // collectives: exact on every rank; the bus bandwidth (the slowest rank's: one number for the world)
    const char* transport = be.device ? "NCCL, device buffers" : "MPI, host buffers";
    for (int which = 0; which < 2; which++) {
        const CollectiveResult& c = which ? ag : ar;
        const char* op = which ? "all_gather" : "all_reduce";
        size_t before = errors.size();
        int ok_ranks = 0;
        for (int r = 0; r < W; r++) {
            ok_ranks += at(r, 2 + which) == 0;
            if (at(r, 2 + which) != 0)
                health_error(&errors, r, W, "%s result wrong (%.0f of %zu elements vs 0)", op, at(r, 2 + which), c.total);
        }
        bool bw_checked = o.min_busbw > 0 && W > 1;
        if (bw_checked && c.busbw < o.min_busbw)
            health_error(&errors, -1, W, "%s busbw %.3f GB/s over %.1f MiB (vs >= %.3f GB/s: --health-min-busbw)", op, c.busbw,
                         c.bytes / 1048576.0, o.min_busbw);
        char expect[64] = "";
        if (W == 1) snprintf(expect, sizeof expect, "; 1 rank: nothing sent");
        else if (bw_checked) snprintf(expect, sizeof expect, "; expected >= %.3f GB/s", o.min_busbw);
        snprintf(buf, sizeof buf, "health: %s %.1f MiB fp32 (%s): exact on %d of %d rank(s); busbw %.3f GB/s (algbw %.3f, %.1f us)%s: %s",
                 op, c.bytes / 1048576.0, transport, ok_ranks, W, c.busbw, c.algbw, c.seconds * 1e6, expect,
                 errors.size() > before ? "FAILED" : "ok");
        lines.push_back(buf);
    }

    // forward: finite everywhere, and the same everywhere
    {
        size_t before = errors.size();
        std::vector<double> finite;
        for (int r = 0; r < W; r++) if (std::isfinite(at(r, 4))) finite.push_back(at(r, 4));
        double ref = health_median(finite), worst = 0;
        int worst_rank = 0;
        for (int r = 0; r < W; r++) {
            double l = at(r, 4);
            if (!std::isfinite(l)) { health_error(&errors, r, W, "forward loss %g (vs finite)", l); continue; }
            double dev = std::fabs(l - ref) / std::max(std::fabs(ref), 1e-30);
            if (dev > worst) { worst = dev; worst_rank = r; }
            if (dev > HEALTH_LOSS_RTOL)
                health_error(&errors, r, W, "forward loss %.7g (vs %.7g, the median rank's, within %g relative)", l, ref, HEALTH_LOSS_RTOL);
        }
        snprintf(buf, sizeof buf, "health: forward (the model's weights, %d x %d fixed tokens): loss %.6f, finite on %zu of %d rank(s), "
                 "largest deviation %.2g relative (rank %d; expected <= %g): %s", o.batch, o.seq, ref, finite.size(), W, worst, worst_rank,
                 HEALTH_LOSS_RTOL, errors.size() > before ? "FAILED" : "ok");
        lines.push_back(buf);
    }

    if (me == 0) {
        for (const std::string& l : lines) printf("%s\n", l.c_str());
        if (errors.empty()) printf("health: all checks passed on %d rank(s) in %.2f s\n", W, now_seconds() - t_start);
        fflush(stdout);
        for (const std::string& e : errors) fprintf(stderr, "error: health check: %s\n", e.c_str());
        fflush(stderr);
    }
    return errors.empty();
}
