/*
 * common.h — the harness of the dev/cuda microbenchmarks (llm.c style): random inputs, validation
 * of a kernel version against the CPU reference op, timing with CUDA events over many repeats
 * with the L2 cache flushed before each, and the result as GB/s or TFLOP/s with the percentage of
 * the roofline: HBM from the device's own memory clock and bus width (H100 SXM 3.35 TB/s, H200
 * 4.8 TB/s), dense BF16 from model/gpu_peak.h (the trainer's MFU denominator: 989.4 TFLOP/s on an
 * H100 or H200 SXM, 756 on an H100 PCIe, 835 on the NVL boards).
 * Built with nvcc it validates and times; built with g++ -DSIMT_EMULATION (make test) it runs the
 * kernels under the SIMT emulator at a small size and validates only.
 */
#pragma once
#include <cmath>
#include <functional>
#include <vector>
#include "../../model/cuda_common.h"
#include "../../model/gpu_peak.h"   // the dense BF16 peak, as the trainer's MFU takes it

static const double H100_HBM_GBS = 3350.0;     // when the device does not say (see hbm_peak_gbs)

#if defined(SIMT_EMULATION)
static const bool EMULATED = true;
#else
static const bool EMULATED = false;
#endif

static inline int g_failures = 0;

static inline std::vector<float> make_random(size_t n, uint64_t seed, double scale = 1.0) {
    Rng r = {seed * 0x9E3779B97F4A7C15ull + 3};
    std::vector<float> v(n);
    for (float& x : v) x = (float)(scale * rng_normal(&r));
    return v;
}
static inline std::vector<float> round_bf16(std::vector<float> v) {
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
    return v;
}
template <typename T> static inline T* to_device(const std::vector<T>& v) {
    T* p = deviceAlloc(T, v.size());
    cudaCheck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
static inline floatX* to_device_bf16v(const std::vector<float>& v) {
    floatX* p = deviceAlloc(floatX, v.size());
    to_device_bf16(p, v.data(), v.size());
    return p;
}

// |got - want| <= rtol |want| + atol max|want| everywhere; prints one line, counts a failure
static inline void validate(const char* what, const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol) {
    double maxw = 0, worst = 0;
    size_t bad = 0, at = 0;
    for (float w : want) maxw = std::fmax(maxw, std::fabs(w));
    for (size_t i = 0; i < got.size(); i++) {
        double lim = rtol * std::fabs(want[i]) + atol * maxw + 1e-30, err = std::fabs((double)got[i] - want[i]);
        if (!(err <= lim)) bad++;
        double x = std::isnan(err) ? 1e30 : err / lim;
        if (x > worst) { worst = x; at = i; }
    }
    if (bad) { g_failures++; printf("  %-34s FAIL: %zu of %zu out of tolerance, worst [%zu] %g vs %g\n", what, bad, got.size(), at, got[at], want[at]); }
    else printf("  %-34s ok (worst error %.2f of the tolerance)\n", what, worst);
}
static inline std::vector<float> from_device_f32(const float* p, size_t n) {
    std::vector<float> v(n);
    cudaCheck(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}
static inline std::vector<float> from_device_bf16v(const floatX* p, size_t n) {
    std::vector<float> v(n);
    from_device_bf16(v.data(), p, n);
    return v;
}

// time_ms flushes L2 before each timed run (the operands cold) unless a program clears this (dev/cuda/matmul -s -w)
static inline bool g_time_flush_l2 = true;
// Mean milliseconds of `run` over `repeats` launches, each after an L2 flush (a write of twice the
// L2 size), timed with CUDA events. Under the emulator: not timed (returns 0).
static inline float time_ms(int repeats, const std::function<void()>& run) {
    if (EMULATED) return 0.0f;
    static char* flush = nullptr;
    static size_t flush_bytes = 0;
    if (!flush) {
        int l2 = 0;
        cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
        flush_bytes = 2 * (size_t)l2;
        cudaCheck(cudaMalloc((void**)&flush, flush_bytes));
    }
    run();   // warm-up
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    float total = 0;
    for (int i = 0; i < repeats; i++) {
        if (g_time_flush_l2) cudaCheck(cudaMemset(flush, i & 0xFF, flush_bytes));
        cudaCheck(cudaEventRecord(a, 0));
        run();
        cudaCheck(cudaEventRecord(b, 0));
        cudaCheck(cudaEventSynchronize(b));
        float ms = 0;
        cudaCheck(cudaEventElapsedTime(&ms, a, b));
        total += ms;
    }
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    return total / repeats;
}

// the device's peak HBM bandwidth in GB/s: 2 transfers per memory clock (DDR) x the bus width
// (H100 SXM: 2619 MHz x 5120 bit -> 3352 GB/s; H200: 4.8 TB/s), so an H200 is not scored as an H100
static inline double hbm_peak_gbs() {
    static double peak = 0;
    if (peak == 0) {
        int khz = 0, bits = 0;
        cudaCheck(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0));
        cudaCheck(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, 0));
        peak = khz > 0 && bits > 0 ? 2.0 * khz * 1e3 * (bits / 8) / 1e9 : H100_HBM_GBS;
    }
    return peak;
}

// one line per version: time, bandwidth and its share of the HBM roofline
static inline void report_bandwidth(const char* what, double bytes, float ms) {
    if (EMULATED) return;
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("  %-34s %9.4f ms  %8.1f GB/s  %5.1f%% of HBM peak (%.0f GB/s)\n", what, ms, gbs, 100.0 * gbs / hbm_peak_gbs(), hbm_peak_gbs());
}
// the device's dense BF16 peak in TFLOP/s (model/gpu_peak.h; 0: a GPU it does not know)
static inline double bf16_peak_tflops() {
    static double peak = -1;
    if (peak < 0) {
        cudaDeviceProp prop;
        int khz = 0;
        cudaCheck(cudaGetDeviceProperties(&prop, 0));
        cudaCheck(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        std::string how;
        peak = gpu_peak_bf16_dense(prop.name, prop.multiProcessorCount, khz, &how) / 1e12;
        printf("BF16 peak: %s\n", how.c_str());
    }
    return peak;
}
static inline void report_flops(const char* what, double flops, float ms) {
    if (EMULATED) return;
    double tf = flops / (ms * 1e-3) / 1e12, peak = bf16_peak_tflops();
    if (peak > 0) printf("  %-34s %9.4f ms  %8.1f TFLOP/s  %5.1f%% of BF16 dense (%.1f)\n", what, ms, tf, 100.0 * tf / peak, peak);
    else printf("  %-34s %9.4f ms  %8.1f TFLOP/s\n", what, ms, tf);
}

static inline void print_header(const char* name, const char* shape) {
    setvbuf(stdout, nullptr, _IOLBF, 0);   // line by line into a file too: a run killed by its time limit keeps its lines
#if defined(SIMT_EMULATION)
    if (!getenv("SIMT_SCHEDULE")) simt::set_schedule(true, 7);
    printf("%s, %s: SIMT emulator (validation only)\n", name, shape);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %s: %s\n", name, shape, prop.name);
#endif
}
static inline int finish() {
    printf(g_failures ? "%d validation(s) FAILED\n" : "all versions validated\n", g_failures);
    return g_failures ? 1 : 0;
}

// 16-byte vectors of BF16 (8 values), for the vectorised versions: C % 8 == 0, aligned rows
struct alignas(16) Pack8 { floatX v[8]; };
__device__ __forceinline__ Pack8 load8(const floatX* p) { return *(const Pack8*)p; }
__device__ __forceinline__ void store8(floatX* p, const Pack8& x) { *(Pack8*)p = x; }

// the expert benchmarks' shape option, -s 1b | 132b: dbrx-1b's experts (N 16384 tokens, k 4, E 16, d 1024, F 1792; the
// default) or DBRX-132B's (N 4096, k 4, E 16, d 6144, F 10752); false (usage printed) on anything else
struct MoeShape { int N, k, E, d, F; };
static inline bool moe_shape_args(int argc, char** argv, MoeShape* s) {
    bool big = false;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 < argc && !strcmp(argv[i], "-s") && (!strcmp(argv[i + 1], "1b") || !strcmp(argv[i + 1], "132b"))) {
            big = !strcmp(argv[i + 1], "132b");
            continue;
        }
        fprintf(stderr, "usage: %s [-s 1b | 132b]\n", argv[0]);
        return false;
    }
    *s = big ? MoeShape{4096, 4, 16, 6144, 10752} : MoeShape{16384, 4, 16, 1024, 1792};
    return true;
}
// the expert benchmarks' start: the -s option (moe_shape_args), then the header naming the shape timed and the small
// one validated (small: e.g. "d 256, F 384"; emulated runs validate only); false: usage printed
static inline bool moe_bench_start(int argc, char** argv, const char* title, const char* small, MoeShape* s) {
    if (!moe_shape_args(argc, argv, s)) return false;
    char shape[160];
    if (EMULATED) snprintf(shape, sizeof shape, "rows 1024, E 16 (one empty), %s", small);
    else snprintf(shape, sizeof shape, "N %d, k %d, E %d, d %d, F %d (validated at rows 1024, %s)", s->N, s->k, s->E, s->d, s->F, small);
    print_header(title, shape);
    return true;
}
