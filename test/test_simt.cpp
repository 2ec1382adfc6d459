/*
 * test_simt.cpp — tests of the SIMT emulator itself (test/simt/simt.h): a block reduction with
 * barriers and shuffles, a shared-memory transpose, the semantics of every warp operation, atomics
 * across blocks on several OS threads, a kernel with a missing __syncthreads() that the random
 * schedule catches (and the sequential one does not), the adversarial warp_ahead schedule (its order,
 * and the same missing barrier caught), and the errors a GPU would hang on:
 * barrier divergence, divergent warp operations, deadlock, bad launch configurations; the deferred
 * streams (work on a created stream runs when it is waited for, in order, across event waits).
 * Built with g++ -DSIMT_EMULATION only.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include "../model/cuda_common.h"
#include "../model/tensor_core.cuh"

// ---------------------------------------------------------------------------------------------
// kernels under test

// out[blockIdx.x] = sum of in[blockIdx.x * n .. +n), with block_sum (barriers + shuffles)
__global__ void block_sum_kernel(float* out, const float* in, int n) {
    __shared__ float scratch[32];
    const float* x = in + (size_t)blockIdx.x * n;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// out (cols, rows) = in (rows, cols)^T through a 32 x 33 shared tile, block (32, 8)
__global__ void transpose_kernel(float* out, const float* in, int rows, int cols) {
    __shared__ float tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8)
        if (x < cols && y0 + j < rows) tile[j][threadIdx.x] = in[(size_t)(y0 + j) * cols + x];
    __syncthreads();
    int ox = blockIdx.y * 32 + threadIdx.x, oy0 = blockIdx.x * 32;
    for (int j = threadIdx.y; j < 32; j += 8)
        if (ox < rows && oy0 + j < cols) out[(size_t)(oy0 + j) * rows + ox] = tile[threadIdx.x][j];
}

// out[t] = in[t - 1] (out[0] = 0) through dynamic shared memory; `with_barrier` = 0 drops the
// barrier between the write and the read: the bug the random schedule must expose
__global__ void shift_kernel(float* out, const float* in, int with_barrier) {
    extern __shared__ __align__(16) char dynamic_smem[];
    float* buf = (float*)dynamic_smem;
    int t = threadIdx.x;
    buf[t] = in[blockIdx.x * blockDim.x + t];
    if (with_barrier) __syncthreads();
    out[blockIdx.x * blockDim.x + t] = t > 0 ? buf[t - 1] : 0.0f;
}

// every warp operation, results per lane: out (blockDim.x, 8)
__global__ void warp_ops_kernel(int* out) {
    int lane = threadIdx.x % 32;
    int* o = out + threadIdx.x * 8;
    o[0] = __shfl_sync(0xffffffffu, lane * 10, 5);               // everyone reads lane 5
    o[1] = __shfl_sync(0xffffffffu, lane * 10, lane + 3, 8);     // within groups of 8, index mod 8
    o[2] = __shfl_xor_sync(0xffffffffu, lane * 10, 1);
    o[3] = __shfl_down_sync(0xffffffffu, lane * 10, 4);          // lanes 28..31 keep their own
    o[4] = __shfl_up_sync(0xffffffffu, lane * 10, 2, 16);        // lanes 0,1,16,17 keep their own
    o[5] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[6] = __any_sync(0xffffffffu, lane == 7) + 2 * __all_sync(0xffffffffu, lane < 32) + 4 * __all_sync(0xffffffffu, lane < 31);
    __syncwarp();
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;        // two independent half-warp groups
    o[7] = __shfl_xor_sync(half, lane, 8);
}

// histogram of in (n) into counts (bins) with integer atomics
__global__ void histogram_kernel(int* counts, const int* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&counts[in[i]], 1);
}

// broken kernels: each should be reported, never hang
__global__ void early_exit_barrier_kernel(float* out) {
    if (threadIdx.x >= 16) return;              // the classic bug: half the block leaves...
    __syncthreads();                            // ...and the rest waits here forever on a GPU
    out[threadIdx.x] = 1.0f;
}
__global__ void two_barriers_kernel(float* out) {
    if (threadIdx.x % 2) { __syncthreads(); out[threadIdx.x] = 1.0f; }
    else { __syncthreads(); out[threadIdx.x] = 2.0f; }
}
__global__ void shuffle_exited_lane_kernel(float* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void deadlock_kernel(float* out) {
    if (threadIdx.x < 32) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);   // warp 0 complete: fine
    if (threadIdx.x == 40) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);  // waits for warp 1...
    else __syncthreads();                                                              // ...which waits here
}
__global__ void big_smem_kernel(float* out) {
    extern __shared__ __align__(16) char dynamic_smem[];
    float* buf = (float*)dynamic_smem;
    buf[threadIdx.x] = 1.0f;
    out[threadIdx.x] = buf[threadIdx.x];
}

// ---------------------------------------------------------------------------------------------

static std::vector<float> random_floats(size_t n, uint64_t seed) {
    Rng r = {seed};
    std::vector<float> v(n);
    for (float& x : v) x = (float)rng_normal(&r);
    return v;
}

template <typename T> static T* upload(const std::vector<T>& v) {
    T* d = deviceAlloc(T, v.size());
    cudaCheck(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> static std::vector<T> download(const T* d, size_t n) {
    std::vector<T> v(n);
    cudaCheck(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

using simt::error_of;   // the message of the simt::Error a call raises

TEST_CASE("block reduction with barriers and shuffles, every block size, random schedule") {
    simt::set_schedule(true, 7);
    for (int threads : {32, 64, 96, 256, 1024})
        for (int n : {1, 31, 1000, 4099}) {
            const int blocks = 3;
            std::vector<float> x = random_floats((size_t)blocks * n, threads + n);
            float* dx = upload(x);
            float* dout = deviceAlloc(float, blocks);
            LAUNCH(block_sum_kernel, blocks, threads, 0, 0, dout, dx, n);
            std::vector<float> out = download(dout, blocks);
            for (int b = 0; b < blocks; b++) {
                double want = 0;
                for (int i = 0; i < n; i++) want += x[(size_t)b * n + i];
                CHECK(out[b] == doctest::Approx(want).epsilon(1e-5).scale(n));
            }
            cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dout));
        }
    simt::set_schedule(false, 0);
}

TEST_CASE("shared-memory transpose, sizes not multiples of the tile") {
    simt::set_schedule(true, 11);
    for (auto rc : {std::pair<int, int>{32, 32}, {45, 70}, {1, 33}, {100, 7}}) {
        int rows = rc.first, cols = rc.second;
        std::vector<float> x = random_floats((size_t)rows * cols, rows * 1000 + cols);
        float* dx = upload(x);
        float* dout = deviceAlloc(float, (size_t)rows * cols);
        LAUNCH(transpose_kernel, dim3(ceil_div(cols, 32), ceil_div(rows, 32)), dim3(32, 8), 0, 0, dout, dx, rows, cols);
        std::vector<float> out = download(dout, (size_t)rows * cols);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) REQUIRE(out[(size_t)c * rows + r] == x[(size_t)r * cols + c]);
        cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dout));
    }
    simt::set_schedule(false, 0);
}

TEST_CASE("a missing __syncthreads() gives a wrong result under the random schedule") {
    const int threads = 128, blocks = 4, n = threads * blocks;
    std::vector<float> x = random_floats(n, 5);
    float* dx = upload(x);
    float* dout = deviceAlloc(float, n);
    auto run = [&](bool random, int with_barrier) {
        simt::set_schedule(random, 3);
        LAUNCH(shift_kernel, blocks, threads, threads * sizeof(float), 0, dout, dx, with_barrier);
        std::vector<float> out = download(dout, n);
        int wrong = 0;
        for (int b = 0; b < blocks; b++)
            for (int t = 0; t < threads; t++) wrong += out[b * threads + t] != (t > 0 ? x[b * threads + t - 1] : 0.0f);
        return wrong;
    };
    CHECK(run(true, 1) == 0);     // with the barrier: right under any order
    CHECK(run(false, 1) == 0);
    CHECK(run(false, 0) == 0);    // index order happens to hide the bug...
    int wrong = run(true, 0);     // ...the random order exposes it
    CHECK(wrong > n / 8);
    MESSAGE("missing barrier: " << wrong << " of " << n << " outputs wrong under the random schedule");
    cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dout));
    simt::set_schedule(false, 0);
}

// the order in which the threads of a block reach two points, with a barrier between them
__global__ void arrival_order_kernel(int* order, int* counter) {
    order[threadIdx.x] = atomicAdd(counter, 1);
    __syncthreads();
    order[blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

TEST_CASE("the adversarial schedule warp_ahead: one warp runs ahead to its next barrier, the others in reverse order") {
    const int threads = 128;
    int* dorder = deviceAlloc(int, 2 * threads);
    int* dcount = deviceAlloc(int, 1);
    cudaCheck(cudaMemset(dcount, 0, sizeof(int)));
    simt::set_schedule_warp_ahead(1);
    LAUNCH(arrival_order_kernel, 1, threads, 0, 0, dorder, dcount);
    std::vector<int> order = download(dorder, 2 * threads);
    for (int phase = 0; phase < 2; phase++)   // warp 1 in lane order, then 127 .. 64, then 31 .. 0
        for (int t = 0; t < threads; t++) {
            int want = t / 32 == 1 ? t - 32 : t >= 64 ? 32 + (threads - 1 - t) : 32 + 64 + (31 - t);
            CHECK(order[phase * threads + t] == phase * threads + want);
        }
    // the missing barrier of shift_kernel, which the sequential order hides, is exposed at once
    const int blocks = 2, n = threads * blocks;
    std::vector<float> x = random_floats(n, 6);
    float* dx = upload(x);
    float* dout = deviceAlloc(float, n);
    auto wrong = [&](int with_barrier) {
        LAUNCH(shift_kernel, blocks, threads, threads * sizeof(float), 0, dout, dx, with_barrier);
        std::vector<float> out = download(dout, n);
        int w = 0;
        for (int i = 0; i < n; i++) w += out[i] != (i % threads > 0 ? x[i - 1] : 0.0f);
        return w;
    };
    CHECK(wrong(1) == 0);
    CHECK(wrong(0) > n / 2);
    simt::set_schedule(false, 0);
    CHECK(wrong(0) == 0);   // (the sequential order)
    cudaCheck(cudaFree(dorder)); cudaCheck(cudaFree(dcount)); cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dout));
}

TEST_CASE("warp shuffles and votes follow the CUDA semantics") {
    simt::set_schedule(true, 99);
    const int threads = 64;
    int* dout = deviceAlloc(int, threads * 8);
    LAUNCH(warp_ops_kernel, 1, threads, 0, 0, dout);
    std::vector<int> out = download(dout, threads * 8);
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++) if (l % 3 == 0) ballot |= 1u << l;
    for (int t = 0; t < threads; t++) {
        int l = t % 32;
        const int* o = &out[t * 8];
        CHECK(o[0] == 50);
        CHECK(o[1] == ((l & ~7) + ((l + 3) & 7)) * 10);
        CHECK(o[2] == (l ^ 1) * 10);
        CHECK(o[3] == (l + 4 < 32 ? l + 4 : l) * 10);
        CHECK(o[4] == ((l % 16) < 2 ? l : l - 2) * 10);
        CHECK((unsigned)o[5] == ballot);
        CHECK(o[6] == 1 + 2);
        CHECK(o[7] == (l ^ 8));
    }
    cudaCheck(cudaFree(dout));
    simt::set_schedule(false, 0);
}

TEST_CASE("integer atomics across blocks running on two OS threads") {
    simt::set_os_threads(2);
    const int n = 10007, bins = 13;
    std::vector<int> in(n), want(bins, 0);
    Rng r = {17};
    for (int& v : in) { v = (int)(rng_u64(&r) % bins); want[v]++; }
    int* din = upload(in);
    int* dcounts = deviceAlloc(int, bins);
    cudaCheck(cudaMemset(dcounts, 0, bins * sizeof(int)));
    LAUNCH(histogram_kernel, ceil_div(n, 256), 256, 0, 0, dcounts, din, n);
    CHECK(download(dcounts, bins) == want);
    cudaCheck(cudaFree(din)); cudaCheck(cudaFree(dcounts));
    simt::set_os_threads(1);
}

TEST_CASE("barrier divergence, divergent warp operations and deadlock are reported, not hung on") {
    float* dout = deviceAlloc(float, 64);
    std::string e = error_of([&] { LAUNCH(early_exit_barrier_kernel, 2, 32, 0, 0, dout); });
    CHECK(e.find("barrier divergence in kernel early_exit_barrier_kernel") != std::string::npos);
    CHECK(e.find("block (0,0,0)") != std::string::npos);
    MESSAGE(e);
    e = error_of([&] { LAUNCH(two_barriers_kernel, 1, 64, 0, 0, dout); });
    CHECK(e.find("barrier divergence") != std::string::npos);
    CHECK(e.find("waits at __syncthreads() at") != std::string::npos);
    e = error_of([&] { LAUNCH(shuffle_exited_lane_kernel, 1, 32, 0, 0, dout); });
    CHECK(e.find("warp divergence") != std::string::npos);
    MESSAGE(e);
    e = error_of([&] { LAUNCH(deadlock_kernel, 1, 64, 0, 0, dout); });
    CHECK(e.find("deadlock in kernel deadlock_kernel") != std::string::npos);
    MESSAGE(e);
    // the emulator is usable again after an error
    LAUNCH(big_smem_kernel, 1, 32, 128, 0, dout);
    CHECK(download(dout, 1)[0] == 1.0f);
    cudaCheck(cudaFree(dout));
}

TEST_CASE("launch configuration errors set cudaGetLastError, as on the GPU") {
    float* dout = deviceAlloc(float, 2048);
    simt::launch("big_smem_kernel", __FILE__, __LINE__, big_smem_kernel, dim3(1), dim3(2048), 0, 0, dout);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);   // and the error is cleared by reading it
    simt::launch("big_smem_kernel", __FILE__, __LINE__, big_smem_kernel, dim3(1), dim3(256), 64 * 1024, 0, dout);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);   // > 48 KiB without the attribute
    // the grid's limits (x 2^31 - 1, y and z 65,535) and the block's z (64), as CUDA's; nothing runs
    for (dim3 g : {dim3(2147483648u), dim3(1, 65536), dim3(1, 1, 65536), dim3(0)}) {
        simt::launch("big_smem_kernel", __FILE__, __LINE__, big_smem_kernel, g, dim3(32), 0, 0, dout);
        CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    }
    simt::launch("big_smem_kernel", __FILE__, __LINE__, big_smem_kernel, dim3(1), dim3(1, 1, 65), 0, 0, dout);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    cudaCheck(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    LAUNCH(big_smem_kernel, 1, 256, 64 * 1024, 0, dout);
    CHECK(download(dout, 256)[255] == 1.0f);
    cudaCheck(cudaFree(dout));
}

TEST_CASE("the random schedule is reproducible: same seed, same interleaving") {
    const int threads = 128, n = threads * 2;
    std::vector<float> x = random_floats(n, 8);
    float* dx = upload(x);
    float* dout = deviceAlloc(float, n);
    std::vector<float> runs[3];
    for (int r = 0; r < 3; r++) {
        simt::set_schedule(true, r < 2 ? 21 : 22);
        LAUNCH(shift_kernel, 2, threads, threads * sizeof(float), 0, dout, dx, 0);   // racy on purpose
        runs[r] = download(dout, n);
    }
    CHECK(memcmp(runs[0].data(), runs[1].data(), n * sizeof(float)) == 0);
    CHECK(memcmp(runs[0].data(), runs[2].data(), n * sizeof(float)) != 0);
    cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dout));
    simt::set_schedule(false, 0);
}

TEST_CASE("device memory: cudaMalloc poisons, the emulated size limit gives cudaErrorMemoryAllocation") {
    float* p = deviceAlloc(float, 4);
    std::vector<float> v = download(p, 4);
    CHECK(std::isnan(v[0]));
    cudaCheck(cudaFree(p));
    void* q = nullptr;
    CHECK(cudaMalloc(&q, simt::options().device_memory + 1) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
}

TEST_CASE("BF16 conversion of the CUDA headers' host path rounds to nearest even") {
    // 1 + 2^-8 is halfway between two bf16 values: ties go to the even mantissa (1.0)
    CHECK(__bfloat162float(__float2bfloat16(1.0f + 0.00390625f)) == 1.0f);
    CHECK(__bfloat162float(__float2bfloat16(1.0f + 3 * 0.00390625f)) == 1.0f + 4 * 0.00390625f);
    CHECK(__bfloat162float(__float2bfloat16(-3.0f)) == -3.0f);
    CHECK(std::isnan(__bfloat162float(__float2bfloat16(NAN))));
    Rng r = {4};
    for (int i = 0; i < 100000; i++) {   // against the bit formula of round-to-nearest-even
        float f = (float)(rng_normal(&r) * 100);
        uint32_t u; memcpy(&u, &f, 4);
        uint32_t rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
        float want; memcpy(&want, &rounded, 4);
        REQUIRE(__bfloat162float(__float2bfloat16(f)) == want);
    }
}

// out[i] = in[i] + add, one thread per element
__global__ void add_kernel(float* out, const float* in, float add, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + add;
}

TEST_CASE("streams: the null stream runs at once; a created stream defers until waited for, in order, across event waits") {
    const int n = 100;
    float *a = nullptr, *b = nullptr;
    REQUIRE(cudaMalloc((void**)&a, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc((void**)&b, n * sizeof(float)) == cudaSuccess);
    cudaStream_t s1 = nullptr, s2 = nullptr;
    cudaEvent_t e1 = nullptr, e2 = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming) == cudaSuccess);
    // the null stream: done when issued
    cudaCheck(cudaMemsetAsync(a, 0, n * sizeof(float), 0));
    CHECK(a[7] == 0.0f);
    // s1: a = 1 (queued), b = a + 1 on s2 after s1's event: nothing has run yet
    LAUNCH(add_kernel, 1, 128, 0, s1, a, a, 1.0f, n);
    cudaCheck(cudaEventRecord(e1, s1));
    LAUNCH(add_kernel, 1, 128, 0, s1, a, a, 10.0f, n);   // after the event: not needed by s2
    cudaCheck(cudaStreamWaitEvent(s2, e1, 0));
    LAUNCH(add_kernel, 1, 128, 0, s2, b, a, 1.0f, n);
    cudaCheck(cudaEventRecord(e2, s2));
    CHECK(a[7] == 0.0f);
    // the null stream waits for s2's event: s2 runs, and first s1 up to e1 (not the +10)
    cudaCheck(cudaStreamWaitEvent(0, e2, 0));
    CHECK(a[7] == 1.0f);
    CHECK(b[7] == 2.0f);
    // the rest of s1 runs when the host asks for it
    CHECK(cudaStreamQuery(s1) == cudaSuccess);
    CHECK(a[7] == 11.0f);
    // a queued copy and a queued set, then cudaDeviceSynchronize runs every stream
    cudaCheck(cudaMemsetAsync(b, 0, n * sizeof(float), s2));
    cudaCheck(cudaMemcpyAsync(b, a, sizeof(float), cudaMemcpyDeviceToDevice, s2));
    CHECK(b[0] == 2.0f);
    cudaCheck(cudaDeviceSynchronize());
    CHECK(b[0] == 11.0f);
    CHECK(b[7] == 0.0f);
    // negative control of the schedule: without the wait, the reader sees what was there before
    LAUNCH(add_kernel, 1, 128, 0, s1, a, a, 100.0f, n);
    LAUNCH(add_kernel, 1, 128, 0, 0, b, a, 0.0f, n);
    CHECK(b[7] == 11.0f);
    cudaCheck(cudaStreamSynchronize(s1));
    CHECK(a[7] == 111.0f);
    cudaCheck(cudaEventDestroy(e1)); cudaCheck(cudaEventDestroy(e2));
    cudaCheck(cudaStreamDestroy(s1)); cudaCheck(cudaStreamDestroy(s2));
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b));
}

// ---------------------------------------------------------------------------------------------
// the warp-level matrix instructions (model/tensor_core.cuh, emulated by test/simt/tensor_core.h),
// each against a scalar reference of the PTX ISA's documented fragment layout

// one warp: d = a b + c with a (16, 16) row-major bf16, b (16, 8) as B[k][n] row-major bf16, c, d
// (16, 8) fp32; every lane gathers its fragments by the documented layout with scalar loads, and
// scatters its fragment of d the same way
__global__ void mma_kernel(float* d, const floatX* a, const floatX* b, const float* c) {
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto A = [&](int r, int k) { return __bfloat16_as_ushort(a[r * 16 + k]); };
    auto B = [&](int k, int n) { return __bfloat16_as_ushort(b[k * 8 + n]); };
    uint32_t af[4] = {A(g, 2 * t) | (uint32_t)A(g, 2 * t + 1) << 16, A(g + 8, 2 * t) | (uint32_t)A(g + 8, 2 * t + 1) << 16,
                      A(g, 2 * t + 8) | (uint32_t)A(g, 2 * t + 9) << 16, A(g + 8, 2 * t + 8) | (uint32_t)A(g + 8, 2 * t + 9) << 16};
    uint32_t bf[2] = {B(2 * t, g) | (uint32_t)B(2 * t + 1, g) << 16, B(2 * t + 8, g) | (uint32_t)B(2 * t + 9, g) << 16};
    float cf[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    float df[4];
    mma_m16n8k16_bf16_f32(df, af, bf, cf);
    d[g * 8 + 2 * t] = df[0]; d[g * 8 + 2 * t + 1] = df[1];
    d[(g + 8) * 8 + 2 * t] = df[2]; d[(g + 8) * 8 + 2 * t + 1] = df[3];
}

// one warp: ldmatrix from a (32, 16) b16 array staged in shared memory; lane l supplies the row
// address &tile[rows[l]][cols[l]] (cols 0 or 8); variant: 0..2 x1, x2, x4; 3..5 the same with
// .trans. For x1 and x2 the lanes whose address is not used pass NULL. out (32 lanes, 4 regs)
__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* m, const int* rows, const int* cols, int variant) {
    __shared__ __align__(16) uint16_t tile[32][16];
    int lane = threadIdx.x;
    for (int i = lane; i < 32 * 16; i += 32) tile[i / 16][i % 16] = m[i];
    __syncwarp();
    int nmat = 1 << (variant % 3);
    const void* p = lane < 8 * nmat ? &tile[rows[lane]][cols[lane]] : nullptr;
    uint32_t r[4] = {0, 0, 0, 0};
    switch (variant) {
    case 0: ldmatrix_x1(r, p); break;
    case 1: ldmatrix_x2(r, p); break;
    case 2: ldmatrix_x4(r, p); break;
    case 3: ldmatrix_x1_trans(r, p); break;
    case 4: ldmatrix_x2_trans(r, p); break;
    case 5: ldmatrix_x4_trans(r, p); break;
    }
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];
}

// cp.async through dynamic shared memory, 64 threads, 16 bytes each per region, then each thread
// reads its neighbour's chunk (so the copy must have landed and the barrier passed). in (512 words),
// out (768 words). mode 0: wait_group 0 (right); 1: no wait (the bug: stale data); 2: two groups,
// wait_group 1 lands the older only, the newer after wait_group 0 (out[512..]); 3: zero fill, thread
// t reads 4 (t % 5) bytes of its 16
__global__ void cp_async_kernel(uint32_t* out, const uint32_t* in, int mode) {
    extern __shared__ __align__(16) char dynamic_smem[];
    uint32_t* buf = (uint32_t*)dynamic_smem;   // (2, 64 threads, 4 words)
    int t = threadIdx.x, u = (t + 1) % 64;
    if (mode == 3) cp_async_16_zfill(buf + 4 * t, in + 4 * t, 4 * (t % 5));
    else cp_async_16(buf + 4 * t, in + 4 * t);
    cp_async_commit();
    if (mode == 2) { cp_async_16(buf + 256 + 4 * t, in + 256 + 4 * t); cp_async_commit(); cp_async_wait<1>(); }
    else if (mode != 1) cp_async_wait<0>();
    __syncthreads();
    // the second region: the thread's own chunk (a neighbour may already be past its wait_group 0)
    for (int j = 0; j < 4; j++) { out[4 * t + j] = buf[4 * u + j]; out[256 + 4 * t + j] = buf[256 + 4 * t + j]; }
    if (mode == 2) {
        cp_async_wait<0>();
        __syncthreads();
        for (int j = 0; j < 4; j++) out[512 + 4 * t + j] = buf[256 + 4 * u + j];
    }
}

// misuse: lane 3 leaves before the mma; a misaligned ldmatrix row address
__global__ void mma_exited_lane_kernel(float* d) {
    if (threadIdx.x == 3) return;
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0};
    mma_m16n8k16_bf16_f32(c, a, b, c);
    d[threadIdx.x] = c[0];
}
__global__ void ldmatrix_misaligned_kernel(uint32_t* out) {
    __shared__ __align__(16) uint16_t tile[8][16];
    uint32_t r[1];
    ldmatrix_x1(r, &tile[threadIdx.x % 8][threadIdx.x == 5 ? 1 : 0]);
    out[threadIdx.x] = r[0];
}

TEST_CASE("mma.sync m16n8k16 bf16: fragments of the documented layout give D = A B + C") {
    simt::set_schedule(true, 41);
    for (int trial = 0; trial < 4; trial++) {
        std::vector<float> a = random_floats(16 * 16, 100 + trial), b = random_floats(16 * 8, 200 + trial);
        std::vector<float> c = random_floats(16 * 8, 300 + trial);
        if (trial == 3) for (float& x : a) x *= 1e4f;   // large products: the fp32 rounding of the sum shows
        std::vector<floatX> ab(a.size()), bb(b.size());
        for (size_t i = 0; i < a.size(); i++) { ab[i] = __float2bfloat16(a[i]); a[i] = __bfloat162float(ab[i]); }
        for (size_t i = 0; i < b.size(); i++) { bb[i] = __float2bfloat16(b[i]); b[i] = __bfloat162float(bb[i]); }
        floatX *da = upload(ab), *db = upload(bb);
        float *dc = upload(c), *dd = deviceAlloc(float, 16 * 8);
        LAUNCH(mma_kernel, 1, 32, 0, 0, dd, da, db, dc);
        std::vector<float> d = download(dd, 16 * 8);
        int exact = 0, close = 0, close_transposed = 0;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                float acc = c[i * 8 + j];   // the emulator's documented order: fp32, k ascending
                double ref = c[i * 8 + j], mag = std::fabs(c[i * 8 + j]), ref_t = c[i * 8 + j];
                for (int k = 0; k < 16; k++) {
                    acc += a[i * 16 + k] * b[k * 8 + j];
                    ref += (double)a[i * 16 + k] * b[k * 8 + j];
                    mag += std::fabs((double)a[i * 16 + k] * b[k * 8 + j]);
                    ref_t += (double)a[k * 16 + i] * b[k * 8 + j];   // the layout misread: A transposed
                }
                double tol = 16 * 6e-8 * mag;   // 16 fp32 roundings of partial sums
                exact += d[i * 8 + j] == acc;
                close += std::fabs(d[i * 8 + j] - ref) <= tol;
                close_transposed += std::fabs(d[i * 8 + j] - ref_t) <= tol;
            }
        CHECK(exact == 128);
        CHECK(close == 128);
        CHECK(close_transposed < 8);   // the check can tell layouts apart
        cudaCheck(cudaFree(da)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(dc)); cudaCheck(cudaFree(dd));
    }
    simt::set_schedule(false, 0);
}

TEST_CASE("ldmatrix x1, x2, x4, with and without .trans: lane l gets row l/4, columns 2(l%4)+{0,1} of each 8x8 matrix") {
    simt::set_schedule(true, 43);
    std::vector<uint16_t> m(32 * 16);
    for (int i = 0; i < 32 * 16; i++) m[i] = (uint16_t)(i * 7 + 1);   // distinct tags
    Rng r = {5};
    std::vector<int> rows(32), cols(32);
    for (int l = 0; l < 32; l++) { rows[l] = (int)(rng_u64(&r) % 32); cols[l] = 8 * (int)(rng_u64(&r) % 2); }
    uint16_t* dm = upload(m);
    int *drows = upload(rows), *dcols = upload(cols);
    uint32_t* dout = deviceAlloc(uint32_t, 32 * 4);
    for (int variant = 0; variant < 6; variant++) {
        LAUNCH(ldmatrix_kernel, 1, 32, 0, 0, dout, dm, drows, dcols, variant);
        std::vector<uint32_t> out = download(dout, 32 * 4);
        int nmat = 1 << (variant % 3), wrong = 0;
        bool trans = variant >= 3;
        // M_i[row][col]: row `row` of matrix i is at the address lane 8 i + row supplied
        auto M = [&](int i, int row, int col) { int l = 8 * i + row; return (uint32_t)m[rows[l] * 16 + cols[l] + col]; };
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < nmat; i++) {
                uint32_t want = trans ? M(i, 2 * (l % 4), l / 4) | M(i, 2 * (l % 4) + 1, l / 4) << 16
                                      : M(i, l / 4, 2 * (l % 4)) | M(i, l / 4, 2 * (l % 4) + 1) << 16;
                wrong += out[l * 4 + i] != want;
            }
        INFO("variant " << variant);
        CHECK(wrong == 0);
    }
    cudaCheck(cudaFree(dm)); cudaCheck(cudaFree(drows)); cudaCheck(cudaFree(dcols)); cudaCheck(cudaFree(dout));
    simt::set_schedule(false, 0);
}

TEST_CASE("cp.async: copies land at cp.async.wait_group, group by group; without the wait the reader sees stale data") {
    std::vector<uint32_t> in(512);
    for (int i = 0; i < 512; i++) in[i] = 0x1000u + (uint32_t)i;
    uint32_t* din = upload(in);
    uint32_t* dout = deviceAlloc(uint32_t, 768);
    auto run = [&](int mode) {
        simt::set_schedule(true, 47 + mode);
        cudaCheck(cudaMemset(dout, 0, 768 * sizeof(uint32_t)));
        LAUNCH(cp_async_kernel, 2, 64, 2 * 256 * sizeof(uint32_t), 0, dout, din, mode);
        return download(dout, 768);
    };
    auto chunk = [&](const std::vector<uint32_t>& out, int base, int t, int j) { return out[base + 4 * t + j]; };
    const uint32_t stale = 0xFFFFFFFFu;   // the poison of shared memory at block start
    int wrong[4] = {0, 0, 0, 0};
    std::vector<uint32_t> o0 = run(0), o1 = run(1), o2 = run(2), o3 = run(3);
    for (int t = 0; t < 64; t++)
        for (int j = 0; j < 4; j++) {
            int u = (t + 1) % 64;
            wrong[0] += chunk(o0, 0, t, j) != in[4 * u + j];
            wrong[1] += chunk(o1, 0, t, j) != stale;
            wrong[2] += chunk(o2, 0, t, j) != in[4 * u + j] || chunk(o2, 256, t, j) != stale || chunk(o2, 512, t, j) != in[256 + 4 * u + j];
            wrong[3] += chunk(o3, 0, t, j) != (j < u % 5 ? in[4 * u + j] : 0u);
        }
    CHECK(wrong[0] == 0);
    CHECK(wrong[1] == 0);   // the negative control: no wait, nothing landed
    CHECK(wrong[2] == 0);
    CHECK(wrong[3] == 0);
    cudaCheck(cudaFree(din)); cudaCheck(cudaFree(dout));
    simt::set_schedule(false, 0);
}

TEST_CASE("tensor-core instructions: a missing lane and a misaligned row address are reported") {
    float* dd = deviceAlloc(float, 32);
    std::string e = error_of([&] { LAUNCH(mma_exited_lane_kernel, 1, 32, 0, 0, dd); });
    CHECK(e.find("mma.sync.m16n8k16") != std::string::npos);
    MESSAGE(e);
    e = error_of([&] { LAUNCH(ldmatrix_misaligned_kernel, 1, 32, 0, 0, (uint32_t*)dd); });
    CHECK(e.find("lane 5 supplies the row address") != std::string::npos);
    MESSAGE(e);
    cudaCheck(cudaFree(dd));
}
