/*
 * cuda_test_helpers.h — what the CUDA tests share (built under the SIMT emulator or by nvcc):
 * seeded random inputs, device buffers allocated poisoned, copies to and from the device, and main().
 * Include it after <doctest.h> (with DOCTEST_CONFIG_IMPLEMENT defined).
 */
#pragma once
#include <cstdlib>
#include <vector>
#include "../model/cuda_common.h"

static inline std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
    Rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    std::vector<float> v(n);
    for (float& x : v) x = (float)(scale * rng_normal(&r));
    return v;
}

// device buffers: allocated poisoned (0xFF bytes: NaN in floats and bf16, -1 in ints), so an output
// the kernel forgot to write cannot pass for a right one
template <typename T> static T* dev_poisoned(size_t n) {
    T* p = deviceAlloc(T, n);
    cudaCheck(cudaMemset(p, 0xFF, (n ? n : 1) * sizeof(T)));
    return p;
}
template <typename T> static T* dev_copy(const std::vector<T>& v) {
    T* p = dev_poisoned<T>(v.size());
    cudaCheck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <typename T> static std::vector<T> get(const T* p, size_t n) {
    std::vector<T> v(n);
    cudaCheck(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}
static inline std::vector<float> get_bf16(const floatX* p, size_t n) {
    std::vector<float> v(n);
    from_device_bf16(v.data(), p, n);
    return v;
}

// A test program's main: under the emulator a random thread schedule (seeded; SIMT_SCHEDULE overrides
// it), so that a missing barrier shows up; on a GPU the device's name. Then the doctest cases.
static inline int cuda_test_main(int argc, char** argv, const char* what, uint64_t schedule_seed) {
#if defined(SIMT_EMULATION)
    if (!getenv("SIMT_SCHEDULE")) simt::set_schedule(true, schedule_seed);
    printf("%s under the SIMT emulator, %s schedule (seed %llu)\n", what, simt::options().random ? "random" : "sequential",
           (unsigned long long)simt::options().seed);
#else
    (void)schedule_seed;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("%s on %s\n", what, prop.name);
#endif
    doctest::Context ctx(argc, argv);
    return ctx.run();
}
