/*
 * test_wgmma.cpp — Hopper's warpgroup MMA (model/wgmma.cuh) under the SIMT emulator (test/simt/wgmma.h),
 * against a double-precision CPU product. Each warpgroup kernel places random BF16 A (64 x K) and B (K x N,
 * given as Bt, N x K) in dynamic shared memory in one of the PTX ISA's layouts, written here from the
 * layouts' own descriptions (core matrices of 8 rows x 16 bytes; the 32/64/128-byte swizzles row by row: row
 * r's 16-byte chunk c stored at chunk c ^ (r / (8 / w)) % w of the row, w = 2/4/8 chunks per row, 8-row atoms)
 * rather than from the emulator's address-bit formula, builds the matrix descriptors, and runs the k-steps of 16 as a chain
 * of wgmma.mma_async accumulating in registers:
 *   - every N in {64, 128, 256} x K-major / MN-major A and B (transpose flags) x no swizzle (two LBO/SBO
 *     arrangements), 32B, 64B, 128B swizzles, K 128 (attention's head_dim);
 *   - FP8 (m64nNk32, e4m3 / e5m2 in each pairing): every K-major layout at N 64/128/256 and 200, A from
 *     registers; controls: E4M3 codes read as E5M2, a wrong SBO, a transpose refused;
 *   - A from registers (the m64nNk16 A fragment), an accumulator input C, scale-d 0 on the first step
 *     over garbage registers, one commit group per k-step with wait_group 1 (a chain across groups), N 8
 *     and 200, two warpgroups in one block;
 *   - negative controls that must fail: the accumulators read before wait_group (NaN), a wrong leading or
 *     stride byte offset, a wrong swizzle mode (mismatches); a missing wgmma.fence, a block of 96
 *     threads, one thread's descriptor differing, a base offset, a stride past the shared memory, a static
 *     __shared__ operand (errors), the operands' shared memory overwritten between the issue and the wait (a mismatch here, a
 *     race under the detector: make test/test_race_wgmma builds this file with -DSIMT_RACE_DETECT, and there
 *     checks the FLOPs the byte count (bytecount.h) records);
 *   - fence.proxy.async (wgmma_fence_proxy) after the operands' stores or cp.async waits and before the barrier, two
 *     warpgroups; controls the detector reports (race.h): no fence (one warpgroup, two), the fence after the
 *     barrier, the fence before the cp.async wait.
 * Built with g++ -DSIMT_EMULATION only.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include "../model/cuda_common.h"
#include "../model/wgmma.cuh"

// an operand's placement in shared memory: mn_major (the transpose flag), swizzle width w in 16-byte
// units (1: none, 2: 32B, 4: 64B, 8: 128B); without swizzle, mn_adjacent picks which core matrices are
// neighbours (0: along k, LBO 128; 1: along m / n, SBO 128). lbo_delta / sbo_delta / swz_code: the
// negative controls' wrong descriptor fields (swz_code -1: the right one)
struct Layout { int mn_major, w, mn_adjacent, lbo_delta, sbo_delta, swz_code; };

__device__ __forceinline__ int swizzle_code(int w) { return w == 1 ? WGMMA_SWIZZLE_NONE : w == 2 ? WGMMA_SWIZZLE_32B : w == 4 ? WGMMA_SWIZZLE_64B : WGMMA_SWIZZLE_128B; }

// the byte offset of element (mn, k) of an MN x K operand tile, and the LBO / SBO of its descriptors
__device__ __forceinline__ uint32_t place(const Layout& L, int MN, int K, int mn, int k) {
    const int w = L.w;
    if (w == 1) {   // core matrices of 8 x 16 bytes, each contiguous
        uint32_t core = L.mn_major ? (k % 8) * 16 + (mn % 8) * 2 : (mn % 8) * 16 + (k % 8) * 2;
        int i = mn / 8, j = k / 8;
        return (L.mn_adjacent ? j * (MN / 8) + i : i * (K / 8) + j) * 128 + core;
    }
    // swizzled: rows of 16 w bytes in atoms of 8 rows; row r's 16-byte chunk c sits at chunk c ^ (r / (8 / w)) % w
    if (!L.mn_major) {   // a row is one mn, 8 w elements of k; k blocks of 8 w one after another, each MN rows
        int b = k / (8 * w), c = k % (8 * w) / 8, r = mn;
        return (uint32_t)(b * MN * 16 * w + r * 16 * w + (c ^ (r / (8 / w)) % w) * 16 + (k % 8) * 2);
    }
    // MN-major: a row is one k, 8 w elements of mn; mn blocks of 8 w one after another, each K rows
    int b = mn / (8 * w), c = mn % (8 * w) / 8, r = k;
    return (uint32_t)(b * K * 16 * w + r * 16 * w + (c ^ (r / (8 / w)) % w) * 16 + (mn % 8) * 2);
}
// the descriptor of k-step s (k = 16 s .. 16 s + 15) of the tile at `tile`
__device__ __forceinline__ uint64_t step_desc(const char* tile, const Layout& L, int MN, int K, int s) {
    const int w = L.w;
    uint32_t start, lbo, sbo;
    if (w == 1) {   // LBO: between core matrices along k (K-major) / along k (MN-major: "the next 8 k"); SBO: along m / n
        uint32_t along_k = L.mn_adjacent ? (MN / 8) * 128 : 128, along_mn = L.mn_adjacent ? 128 : (K / 8) * 128;
        start = 2 * s * along_k;
        lbo = along_k;
        sbo = along_mn;
    } else if (!L.mn_major) {   // LBO unused; SBO: between 8-row groups
        start = (16 * s) / (8 * w) * MN * 16 * w + (16 * s) % (8 * w) * 2;
        lbo = 16;
        sbo = 8 * 16 * w;
    } else {   // LBO: between blocks of 8 w mn; SBO: between groups of 8 k rows
        start = 2 * s * 8 * 16 * w;
        lbo = K * 16 * w;
        sbo = 8 * 16 * w;
    }
    int code = L.swz_code >= 0 ? L.swz_code : swizzle_code(w);
    return wgmma_desc(tile + start, lbo + L.lbo_delta, sbo + L.sbo_delta, code);
}

enum { F_C = 1, F_ZERO_FIRST = 2, F_GROUP_PER_STEP = 4, F_EARLY_READ = 8, F_NO_FENCE = 16, F_CLOBBER = 32, F_DIVERGE = 64,
       F_BASE_OFFSET = 128, F_PROXY_NONE = 256, F_PROXY_LATE = 512, F_CP_ASYNC = 1024, F_CP_EARLY = 2048 };

// block: 128 threads per warpgroup; warpgroup q computes rows 64 q .. of out (rows x N) = A Bt^T (+ C).
// A: (rows, K) row-major; Bt: (N, K) row-major; both bf16. AREG: A fragments from global memory into registers.
template <int N, int TA, int TB, bool AREG>
__global__ void wgmma_kernel(float* out, const floatX* A, const floatX* Bt, const float* C, int K, Layout la, Layout lb, int flags) {
    const int tid = threadIdx.x, q = tid / 128, t = tid % 128, warp = t / 32, g = t % 32 / 4, c4 = t % 4;
    const int rows = blockDim.x / 128 * 64;
    char* smem_b = dynamic_smem;                                    // N x K, then one 64 x K tile per warpgroup
    char* smem_a = dynamic_smem + (size_t)N * K * 2;                // (N K 2 is a multiple of 1024)
    const bool cp = flags & (F_CP_ASYNC | F_CP_EARLY);
    if (cp) {   // B by cp.async (K-major B: 8 k of a row are 16 contiguous bytes in every layout)
        for (int i = tid * 8; i < N * K; i += blockDim.x * 8) cp_async_16(smem_b + place(lb, N, K, i / K, i % K), Bt + i);
        cp_async_commit();
    } else {
        for (int i = tid; i < N * K; i += blockDim.x)
            *(floatX*)(smem_b + place(lb, N, K, i / K, i % K)) = Bt[i];
    }
    for (int i = tid; i < rows * K; i += blockDim.x)
        *(floatX*)(smem_a + (size_t)(i / K / 64) * 64 * K * 2 + place(la, 64, K, i / K % 64, i % K)) = A[i];
    if (flags & F_CP_EARLY) wgmma_fence_proxy();   // (control: the copies have not landed, it covers A's stores only)
    if (cp) cp_async_wait<0>();
    // this thread's writes (generic proxy) visible to the async proxy's wgmma reads, by any warpgroup: before the barrier
    if (!(flags & (F_PROXY_NONE | F_PROXY_LATE | F_CP_EARLY))) wgmma_fence_proxy();
    __syncthreads();
    if (flags & F_PROXY_LATE) wgmma_fence_proxy();   // (control: too late for the other warpgroup's wgmma)
    const char* my_a = smem_a + (size_t)q * 64 * K * 2;
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) {   // the fragment layout: d[i] = D[16 warp + g + 8 ((i/2)%2)][8 (i/4) + 2 c4 + i%2]
        int r = 64 * q + 16 * warp + g + 8 * (i / 2 % 2), col = 8 * (i / 4) + 2 * c4 + i % 2;
        d[i] = flags & F_ZERO_FIRST ? 1e30f : flags & F_C ? C[(size_t)r * N + col] : 0.0f;
    }
    if (!(flags & F_NO_FENCE)) wgmma_fence();
    const int steps = K / 16;
    for (int s = 0; s < steps; s++) {
        if (s > 0 && (flags & F_GROUP_PER_STEP)) wgmma_fence();
        uint64_t db = step_desc(smem_b, lb, N, K, s);
        if ((flags & F_DIVERGE) && t == 37) db += 1;          // one thread's B starts 16 bytes further
        if (flags & F_BASE_OFFSET) db |= (uint64_t)1 << 49;   // a matrix base offset of 1
        int scale_d = s == 0 && (flags & F_ZERO_FIRST) ? 0 : 1;
        if (AREG) {
            auto e = [&](int r, int k) { return (uint32_t)__bfloat16_as_ushort(A[(size_t)(64 * q + 16 * warp + r) * K + 16 * s + k]); };
            uint32_t a[4] = {e(g, 2 * c4) | e(g, 2 * c4 + 1) << 16, e(g + 8, 2 * c4) | e(g + 8, 2 * c4 + 1) << 16,
                             e(g, 2 * c4 + 8) | e(g, 2 * c4 + 9) << 16, e(g + 8, 2 * c4 + 8) | e(g + 8, 2 * c4 + 9) << 16};
            wgmma_bf16_rs<N, TB>(d, a, db, scale_d);
        } else {
            wgmma_bf16_ss<N, TA, TB>(d, step_desc(my_a, la, 64, K, s), db, scale_d);
        }
        if (flags & F_GROUP_PER_STEP) { wgmma_commit(); wgmma_wait<1>(); }
    }
    if (!(flags & F_GROUP_PER_STEP)) wgmma_commit();
    if (flags & F_CLOBBER)   // the operands' memory reused before the MMA is known complete (no wait, no barrier)
        for (int i = tid; i < N * K / 2; i += blockDim.x) ((uint32_t*)smem_b)[i] = 0;
    auto store = [&]() {
        for (int i = 0; i < N / 2; i++)
            out[(size_t)(64 * q + 16 * warp + g + 8 * (i / 2 % 2)) * N + 8 * (i / 4) + 2 * c4 + i % 2] = d[i];
    };
    if (flags & F_EARLY_READ) store();
    wgmma_fence_operand(d);
    wgmma_wait<0>();
    wgmma_fence_operand(d);
    if (!(flags & F_EARLY_READ)) store();
}

// FP8 (m64nNk32, K-major only): A (rows, K) and Bt (N, K) of 1-byte codes, AT / BT their formats. A K-major FP8
// row is the same bytes as a bf16 row of half the elements: code (mn, k) sits where bf16 element (mn, k / 2) would,
// byte k % 2, and a k-step of 32 codes is the bf16 k-step of 16 (32 bytes)
template <int N, int AT, int BT, bool AREG>
__global__ void wgmma_fp8_kernel(float* out, const uint8_t* A, const uint8_t* Bt, const float* C, int K, Layout la, Layout lb, int flags) {
    const int tid = threadIdx.x, t = tid % 128, warp = t / 32, g = t % 32 / 4, c4 = t % 4;
    char* smem_b = dynamic_smem;
    char* smem_a = dynamic_smem + ((size_t)N * K + 1023) / 1024 * 1024;   // (the 128B swizzle's atoms start on 1024 bytes)
    for (int i = tid; i < N * K; i += blockDim.x) smem_b[place(lb, N, K / 2, i / K, i % K / 2) + i % 2] = (char)Bt[i];
    for (int i = tid; i < 64 * K; i += blockDim.x) smem_a[place(la, 64, K / 2, i / K, i % K / 2) + i % 2] = (char)A[i];
    wgmma_fence_proxy();   // (before the barrier: see wgmma_kernel)
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; i++)
        d[i] = flags & F_C ? C[(size_t)(16 * warp + g + 8 * (i / 2 % 2)) * N + 8 * (i / 4) + 2 * c4 + i % 2] : 0.0f;
    wgmma_fence();
    for (int s = 0; s < K / 32; s++) {
        if (s > 0 && (flags & F_GROUP_PER_STEP)) wgmma_fence();
        uint64_t db = step_desc(smem_b, lb, N, K / 2, s);
        if (AREG) {   // a[j] = A[16 warp + g + 8 (j % 2)][32 s + 4 c4 + 16 (j / 2) + 0..3], the lowest byte first
            uint32_t a[4];
            for (int j = 0; j < 4; j++) memcpy(&a[j], A + (size_t)(16 * warp + g + 8 * (j % 2)) * K + 32 * s + 4 * c4 + 16 * (j / 2), 4);
            wgmma_fp8_rs<N, AT, BT>(d, a, db, 1);
        } else {
            wgmma_fp8_ss<N, AT, BT>(d, step_desc(smem_a, la, 64, K / 2, s), db, 1);
        }
        if (flags & F_GROUP_PER_STEP) { wgmma_commit(); wgmma_wait<1>(); }
    }
    if (!(flags & F_GROUP_PER_STEP)) wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < N / 2; i++) out[(size_t)(16 * warp + g + 8 * (i / 2 % 2)) * N + 8 * (i / 4) + 2 * c4 + i % 2] = d[i];
}
// FP8 with a transpose flag: refused (the emulator's own call: model/wgmma.cuh's FP8 forms have no transposes)
__global__ void wgmma_fp8_trans_kernel(float* out) {
    float d[4] = {};
    uint64_t desc = wgmma_desc(dynamic_smem, 128, 256, WGMMA_SWIZZLE_NONE);
    wgmma_fence();
    simt::wgmma_mma(d, 8, nullptr, desc, desc, 1, 0, 1, __FILE__, __LINE__, WGMMA_E4M3, WGMMA_E4M3);
    wgmma_commit();
    wgmma_wait<0>();
    out[threadIdx.x] = d[0];
}

// a descriptor of a static __shared__ array: the emulator has no window address for it (an error)
__global__ void wgmma_static_smem_kernel(float* out) {
    __shared__ __align__(1024) floatX tile[64 * 16];
    float d[4] = {};
    uint64_t desc = wgmma_desc(tile, 128, 256, WGMMA_SWIZZLE_NONE);
    wgmma_fence();
    wgmma_bf16_ss<8, 0, 0>(d, desc, desc, 0);
    wgmma_commit();
    wgmma_wait<0>();
    out[threadIdx.x] = d[0];
}

// ---------------------------------------------------------------------------------------------
// host side

static std::vector<float> random_bf16(size_t n, uint64_t seed) {
    Rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    std::vector<float> v(n);
    for (float& x : v) x = __bfloat162float(__float2bfloat16((float)rng_normal(&r)));
    return v;
}
template <typename T> static T* upload(const std::vector<T>& v) {
    T* p = deviceAlloc(T, v.size());
    cudaCheck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
static floatX* upload_bf16(const std::vector<float>& v) {
    std::vector<floatX> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = __float2bfloat16(v[i]);
    return upload(b);
}

struct Run { int bad; double worst; };   // elements out of tolerance, the worst error / tolerance
// out (rows, N) against the double-precision c0(i, j) + sum over k of ab(i, j, k), within fp32 summation's tolerance
template <typename AB, typename C0>
static Run check_product(const std::vector<float>& out, int rows, int N, int K, AB ab, C0 c0) {
    Run r = {0, 0};
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < N; j++) {
            double ref = c0(i, j), mag = std::fabs(ref);
            for (int k = 0; k < K; k++) {
                double p = ab(i, j, k);
                ref += p;
                mag += std::fabs(p);
            }
            double tol = (K + 1) * 1.2e-7 * mag + 1e-30, err = std::fabs(out[(size_t)i * N + j] - ref);
            if (!(err <= tol)) r.bad++;
            r.worst = std::isnan(err) ? 1e30 : std::max(r.worst, err / tol);
        }
    return r;
}

// one launch of wgmma_kernel<N, TA, TB, AREG> on random data, checked against the double-precision product
template <int N, int TA, int TB, bool AREG>
static Run run_wgmma(Layout la, Layout lb, int flags, int warpgroups = 1, int K = 128, uint64_t seed = 1) {
    const int rows = 64 * warpgroups;
    std::vector<float> a = random_bf16((size_t)rows * K, seed), bt = random_bf16((size_t)N * K, seed + 7);
    std::vector<float> c = random_bf16((size_t)rows * N, seed + 13);
    floatX *da = upload_bf16(a), *dbt = upload_bf16(bt);
    float *dc = upload(c), *dout = deviceAlloc(float, (size_t)rows * N);
    size_t smem = (size_t)(N + rows) * K * 2;
    cudaCheck(cudaFuncSetAttribute(wgmma_kernel<N, TA, TB, AREG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    la.mn_major = TA;
    lb.mn_major = TB;
    LAUNCH((wgmma_kernel<N, TA, TB, AREG>), 1, 128 * warpgroups, smem, 0, dout, da, dbt, dc, K, la, lb, flags);
    cudaCheck(cudaGetLastError());
    std::vector<float> out((size_t)rows * N);
    cudaCheck(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    Run r = check_product(out, rows, N, K, [&](int i, int j, int k) { return (double)a[(size_t)i * K + k] * bt[(size_t)j * K + k]; },
                          [&](int i, int j) { return (flags & F_C) && !(flags & F_ZERO_FIRST) ? (double)c[(size_t)i * N + j] : 0.0; });
    cudaCheck(cudaFree(da)); cudaCheck(cudaFree(dbt)); cudaCheck(cudaFree(dc)); cudaCheck(cudaFree(dout));
    return r;
}

static float fp8_value(int type, uint8_t code) {
    if (type == WGMMA_E4M3) { __nv_fp8_e4m3 v; v.__x = code; return (float)v; }
    __nv_fp8_e5m2 v; v.__x = code; return (float)v;
}
// random FP8 codes of `type` (the normal distribution's values, saturated to the format)
static std::vector<uint8_t> random_fp8(size_t n, int type, uint64_t seed) {
    Rng r = {seed * 0x9E3779B97F4A7C15ull + 5};
    std::vector<uint8_t> v(n);
    for (uint8_t& x : v) {
        float f = (float)rng_normal(&r);
        x = type == WGMMA_E4M3 ? __nv_fp8_e4m3(f).__x : __nv_fp8_e5m2(f).__x;
    }
    return v;
}
// one launch of wgmma_fp8_kernel on random codes; DT: the format the data really is in for A (AT when right)
template <int N, int AT, int BT, bool AREG>
static Run run_fp8(Layout la, Layout lb, int flags, int K = 128, int data_at = AT) {
    std::vector<uint8_t> a = random_fp8((size_t)64 * K, data_at, 3), bt = random_fp8((size_t)N * K, BT, 4);
    std::vector<float> c = random_bf16((size_t)64 * N, 5);
    uint8_t *da = upload(a), *dbt = upload(bt);
    float *dc = upload(c), *dout = deviceAlloc(float, (size_t)64 * N);
    size_t smem = ((size_t)N * K + 1023) / 1024 * 1024 + (size_t)64 * K;
    cudaCheck(cudaFuncSetAttribute(wgmma_fp8_kernel<N, AT, BT, AREG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH((wgmma_fp8_kernel<N, AT, BT, AREG>), 1, 128, smem, 0, dout, da, dbt, dc, K, la, lb, flags);
    std::vector<float> out((size_t)64 * N);
    cudaCheck(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    Run r = check_product(out, 64, N, K,
                          [&](int i, int j, int k) { return (double)fp8_value(data_at, a[(size_t)i * K + k]) * fp8_value(BT, bt[(size_t)j * K + k]); },
                          [&](int i, int j) { return flags & F_C ? (double)c[(size_t)i * N + j] : 0.0; });
    cudaCheck(cudaFree(da)); cudaCheck(cudaFree(dbt)); cudaCheck(cudaFree(dc)); cudaCheck(cudaFree(dout));
    return r;
}

// the layouts: no swizzle with core matrices adjacent along k, then along mn; 32B, 64B, 128B swizzles
static const Layout LAYOUTS[5] = {{0, 1, 0, 0, 0, -1}, {0, 1, 1, 0, 0, -1}, {0, 2, 0, 0, 0, -1}, {0, 4, 0, 0, 0, -1}, {0, 8, 0, 0, 0, -1}};
static const char* const LAYOUT_NAMES[5] = {"none (k-adjacent)", "none (mn-adjacent)", "32B", "64B", "128B"};

template <int N, int TA, int TB> static void all_layouts() {
    for (int i = 0; i < 5; i++) {
        int j = (i + N / 64) % 5;   // B's layout differs from A's: every pairing of roles over the N
        Run r = run_wgmma<N, TA, TB, false>(LAYOUTS[i], LAYOUTS[j], 0);
        INFO("N " << N << " A " << (TA ? "MN" : "K") << "-major " << LAYOUT_NAMES[i] << ", B " << (TB ? "MN" : "K") << "-major "
                  << LAYOUT_NAMES[j] << ": worst error " << r.worst << " of the tolerance");
        CHECK(r.bad == 0);
    }
}

TEST_CASE("wgmma m64nNk16 bf16 from shared memory: every documented layout, K-major and MN-major, N 64/128/256, K 128") {
    simt::set_schedule(true, 7);
    all_layouts<64, 0, 0>(); all_layouts<64, 0, 1>(); all_layouts<64, 1, 0>(); all_layouts<64, 1, 1>();
    all_layouts<128, 0, 0>(); all_layouts<128, 0, 1>(); all_layouts<128, 1, 0>(); all_layouts<128, 1, 1>();
    all_layouts<256, 0, 0>(); all_layouts<256, 0, 1>(); all_layouts<256, 1, 0>(); all_layouts<256, 1, 1>();
    simt::set_schedule(false, 0);
}

TEST_CASE("wgmma: A from registers, an accumulator input, scale-d 0, a group per k-step, N 8 and 200, two warpgroups") {
    const Layout sw128 = LAYOUTS[4], none = LAYOUTS[0];
    CHECK(run_wgmma<64, 0, 0, true>(none, sw128, 0).bad == 0);
    CHECK(run_wgmma<128, 0, 1, true>(none, sw128, F_C).bad == 0);
    CHECK(run_wgmma<256, 0, 0, true>(none, LAYOUTS[1], F_ZERO_FIRST).bad == 0);
    CHECK(run_wgmma<128, 0, 0, false>(sw128, sw128, F_C).bad == 0);
    CHECK(run_wgmma<128, 1, 0, false>(sw128, sw128, F_ZERO_FIRST | F_C).bad == 0);   // C ignored: scale-d 0 first
    CHECK(run_wgmma<128, 0, 1, false>(sw128, sw128, F_GROUP_PER_STEP | F_C).bad == 0);
    CHECK(run_wgmma<64, 1, 1, true>(none, LAYOUTS[3], F_GROUP_PER_STEP | F_ZERO_FIRST).bad == 0);
    CHECK(run_wgmma<8, 0, 0, false>(LAYOUTS[1], LAYOUTS[1], F_C).bad == 0);
    CHECK(run_wgmma<200, 0, 1, false>(sw128, LAYOUTS[0], F_C, 1, 64).bad == 0);
    CHECK(run_wgmma<128, 0, 0, false>(sw128, sw128, F_C, 2).bad == 0);        // warpgroups 0 and 1 of a 256-thread block
    CHECK(run_wgmma<64, 1, 0, true>(none, sw128, F_GROUP_PER_STEP, 2, 256).bad == 0);
}

TEST_CASE("wgmma negative controls: early accumulator reads, wrong LBO / SBO / swizzle, no fence, 96 threads, divergent "
          "descriptors, a base offset, addresses past the shared memory or in static shared memory, operands overwritten") {
    const Layout sw128 = LAYOUTS[4], kadj = LAYOUTS[0], mnadj = LAYOUTS[1];
    // the layouts as they are pass (the controls below differ in one thing each)
    REQUIRE(run_wgmma<128, 0, 0, false>(kadj, mnadj, 0).bad == 0);
    REQUIRE(run_wgmma<128, 1, 1, false>(sw128, sw128, 0).bad == 0);
    CHECK(run_wgmma<128, 0, 0, false>(kadj, mnadj, F_EARLY_READ).bad == 64 * 128);   // NaN until wait_group
    Layout wrong = kadj;
    wrong.lbo_delta = 128;
    CHECK(run_wgmma<128, 0, 0, false>(wrong, mnadj, 0).bad > 1000);
    wrong = mnadj;
    wrong.sbo_delta = 16;
    CHECK(run_wgmma<128, 0, 0, false>(kadj, wrong, 0).bad > 1000);
    wrong = sw128;
    wrong.sbo_delta = -512;
    CHECK(run_wgmma<128, 1, 1, false>(sw128, wrong, 0).bad > 1000);
    for (int code : {WGMMA_SWIZZLE_NONE, WGMMA_SWIZZLE_64B, WGMMA_SWIZZLE_32B}) {
        wrong = sw128;
        wrong.swz_code = code;
        CHECK(run_wgmma<128, 0, 0, false>(sw128, wrong, 0).bad > 1000);
        CHECK(run_wgmma<128, 1, 1, false>(wrong, sw128, 0).bad > 1000);
    }
    std::string e = simt::error_of([&] { run_wgmma<64, 0, 0, false>(sw128, sw128, F_NO_FENCE); });
    CHECK(e.find("without a wgmma.fence") != std::string::npos);
    e = simt::error_of([&] {
        LAUNCH((wgmma_kernel<64, 0, 0, false>), 1, 96, 0, 0, (float*)nullptr, (const floatX*)nullptr, (const floatX*)nullptr,
               (const float*)nullptr, 0, sw128, sw128, 0);
    });
    CHECK(e.find("needs the 128 threads of warpgroup 0") != std::string::npos);
    e = simt::error_of([&] { run_wgmma<64, 0, 0, false>(sw128, sw128, F_DIVERGE); });
    CHECK(e.find("thread 37 issues another wgmma.mma_async") != std::string::npos);
    e = simt::error_of([&] { run_wgmma<64, 0, 0, false>(sw128, sw128, F_BASE_OFFSET); });
    CHECK(e.find("non-zero base offset") != std::string::npos);
    wrong = mnadj;
    wrong.sbo_delta = 200000;   // (the field holds up to 256 KiB)
    e = simt::error_of([&] { run_wgmma<128, 0, 0, false>(kadj, wrong, 0); });
    CHECK(e.find("beyond the shared memory") != std::string::npos);
    e = simt::error_of([&] { LAUNCH(wgmma_static_smem_kernel, 1, 128, 0, 0, (float*)nullptr); });
    CHECK(e.find("must be in the dynamic shared memory") != std::string::npos);
#if defined(SIMT_RACE_DETECT)
    e = simt::error_of([&] { run_wgmma<64, 0, 0, false>(sw128, sw128, F_CLOBBER); });
    MESSAGE(e);
    CHECK(e.find("race in kernel") != std::string::npos);
    CHECK(e.find("wgmma.mma_async B") != std::string::npos);
#else
    CHECK(run_wgmma<64, 0, 0, false>(sw128, sw128, F_CLOBBER).bad > 1000);
#endif
}

TEST_CASE("wgmma: fence.proxy.async after the operands' writes, before the barrier; controls: none, after the barrier, "
          "before cp.async landed") {
    const Layout kadj = LAYOUTS[0], sw128 = LAYOUTS[4];
    // the right order, the operands stored or B copied by cp.async, two warpgroups (each reads the other's writes)
    CHECK(run_wgmma<64, 0, 0, false>(kadj, sw128, 0, 2).bad == 0);
    CHECK(run_wgmma<64, 0, 0, false>(sw128, kadj, F_CP_ASYNC, 2).bad == 0);
    const int controls[4][2] = {{F_PROXY_NONE, 1}, {F_PROXY_NONE, 2}, {F_PROXY_LATE, 2}, {F_CP_EARLY, 2}};
    for (const auto& c : controls) {
#if defined(SIMT_RACE_DETECT)
        std::string e = simt::error_of([&] { run_wgmma<64, 0, 0, false>(kadj, sw128, c[0], c[1]); });
        MESSAGE(e);
        CHECK(e.find("async-proxy race in kernel") != std::string::npos);
        CHECK(e.find("through the generic proxy without a fence.proxy.async ordered before the read") != std::string::npos);
        if (c[0] == F_PROXY_NONE) CHECK(e.find("the writer has not fenced since the write") != std::string::npos);
        if (c[0] == F_PROXY_LATE) CHECK(e.find("in another warpgroup: fence before the barrier") != std::string::npos);
        if (c[0] == F_CP_EARLY) CHECK(e.find("(cp.async landing) at model/tensor_core.cuh") != std::string::npos);
#else
        CHECK(run_wgmma<64, 0, 0, false>(kadj, sw128, c[0], c[1]).bad == 0);   // (one proxy under emulation: no error)
#endif
    }
}

template <int N, int AT, int BT, bool AREG> static void fp8_layouts() {
    for (int i = 0; i < 5; i++) {
        int j = (i + 1 + N / 128) % 5;
        Run r = run_fp8<N, AT, BT, AREG>(LAYOUTS[i], LAYOUTS[j], i % 2 ? F_C : F_GROUP_PER_STEP);
        INFO("FP8 N " << N << " types " << AT << "." << BT << (AREG ? " A from registers" : "") << ", A " << LAYOUT_NAMES[i] << ", B "
                      << LAYOUT_NAMES[j] << ": worst error " << r.worst << " of the tolerance");
        CHECK(r.bad == 0);
    }
}

TEST_CASE("wgmma m64nNk32 FP8 (e4m3 / e5m2): every K-major layout, N 64/128/256, K 128, A from registers; controls") {
    simt::set_schedule(true, 9);
    fp8_layouts<64, WGMMA_E4M3, WGMMA_E4M3, false>(); fp8_layouts<128, WGMMA_E4M3, WGMMA_E5M2, false>();
    fp8_layouts<256, WGMMA_E5M2, WGMMA_E4M3, false>(); fp8_layouts<128, WGMMA_E5M2, WGMMA_E5M2, false>();
    fp8_layouts<64, WGMMA_E5M2, WGMMA_E4M3, true>(); fp8_layouts<256, WGMMA_E4M3, WGMMA_E4M3, true>();
    CHECK(run_fp8<200, WGMMA_E4M3, WGMMA_E4M3, false>(LAYOUTS[4], LAYOUTS[0], F_C, 64).bad == 0);
    // controls: E4M3 data read as E5M2; a wrong SBO
    CHECK(run_fp8<128, WGMMA_E5M2, WGMMA_E4M3, false>(LAYOUTS[4], LAYOUTS[4], 0, 128, WGMMA_E4M3).bad > 1000);
    Layout wrong = LAYOUTS[4];
    wrong.sbo_delta = 512;
    CHECK(run_fp8<128, WGMMA_E4M3, WGMMA_E4M3, false>(LAYOUTS[4], wrong, 0).bad > 1000);
    std::string e = simt::error_of([&] { LAUNCH(wgmma_fp8_trans_kernel, 1, 128, 1024, 0, (float*)nullptr); });
    CHECK(e.find("FP8 wgmma (m64nNk32) takes K-major operands only") != std::string::npos);
    simt::set_schedule(false, 0);
}

#if defined(SIMT_RACE_DETECT)
TEST_CASE("wgmma: the tensor-core FLOPs of the byte count (bytecount.h), 2 x 64 x N x k per completed mma_async") {
    simt::bytes_launch_begin();
    REQUIRE(run_wgmma<128, 0, 0, false>(LAYOUTS[4], LAYOUTS[4], 0).bad == 0);   // K 128: 8 k-steps
    CHECK(simt::bytes_launch_end().mma == 2LL * 64 * 128 * 16 * 8);
    simt::bytes_launch_begin();
    REQUIRE(run_wgmma<64, 0, 0, true>(LAYOUTS[0], LAYOUTS[0], F_GROUP_PER_STEP, 2, 64).bad == 0);   // 2 warpgroups x 4 k-steps
    CHECK(simt::bytes_launch_end().mma == 2LL * 64 * 64 * 16 * 4 * 2);
    simt::bytes_launch_begin();
    REQUIRE(run_fp8<64, WGMMA_E4M3, WGMMA_E4M3, false>(LAYOUTS[4], LAYOUTS[4], 0).bad == 0);   // K 128: 4 k-steps of 32
    CHECK(simt::bytes_launch_end().mma == 2LL * 64 * 64 * 32 * 4);
}
#endif
