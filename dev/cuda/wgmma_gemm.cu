/*
 * wgmma_gemm.cu — a BF16 GEMM on Hopper's warpgroup MMA (model/wgmma.cuh): the groundwork of a Hopper grouped
 * GEMM and attention (issue 25; no product kernel uses wgmma yet). out (M x N, fp32) = A (M x K) B^T, A and B
 * (N x K) row-major BF16: the model's x W^T ("TN"). One warpgroup (128 threads) per 64 x BN tile of out. Each
 * k-tile of 64 (one 128-byte row of A and of B) is copied with 16-byte cp.async straight into the K-major
 * 128-byte-swizzled layout of the PTX ISA (row r's 16-byte chunk c at chunk c ^ r % 8, rows 128 bytes apart,
 * 8-row atoms of 1024 bytes: SBO 1024, LBO unused), then 4 wgmma.mma_async k-steps of 16 (the descriptors'
 * start + 32 bytes each) accumulate in registers:
 *   v1  one stage: load the k-tile, wait, 4 MMAs, wait_group 0, the next k-tile     BN 128
 *   v2  two stages: the next k-tile's cp.async runs during this k-tile's MMAs       BN 128
 *   v3  v2 with BN 256 (128 fp32 accumulators per thread)
 *   v4  v2 with A's fragments read from the swizzled tile into registers (wgmma's A-in-registers form, as
 *       attention's P V takes P)
 *   v5  v2 with BN 64
 *   v6  v3 with two warpgroups (256 threads) on a 128 x 256 tile, sharing each B tile
 *   v7  TMA (model/tma.cuh): a producer thread copies the k-tiles (128B swizzle) into a ring of 4 stages with
 *       mbarriers (full: its arrival + the bytes; empty: the 128 consumers'), the warpgroup waits and multiplies  BN 128
 * 2 M N K FLOPs against the dense BF16 peak (cuBLASLt on the model's shapes: dev/cuda/matmul).
 *   make dev/cuda/wgmma_gemm && ./dev/cuda/wgmma_gemm [-v N (1-7)] [-m M] [-n N] [-k K]   (default 4096 each)
 * Every version is first validated at M 128, N 256, K 192 against the CPU GEMM in double precision (the
 * emulated build, make test, does only that).
 */
#include "common.h"
#include "../../model/wgmma.cuh"
#include "../../model/tma.cuh"

// (dynamic_smem: declared by model/wgmma.cuh)

#define WG_BK 64   // k per tile: one 128-byte swizzle row

// one k-tile of `rows` rows (k0 .. k0 + 63 of each) of src (row stride K) into the 128B-swizzled tile dst
__device__ __forceinline__ void load_tile_sw128(char* dst, const floatX* src, int rows, int K, int k0) {
    for (int i = threadIdx.x; i < rows * 8; i += blockDim.x) {
        int r = i / 8, c = i % 8;
        cp_async_16(dst + r * 128 + ((c ^ (r % 8)) * 16), src + (size_t)r * K + k0 + 8 * c);
    }
}

// A's fragment of k-step s (k 16 s .. 16 s + 15) from the warpgroup's 128B-swizzled 64 x 64 tile: each register
// two bf16 of one row (the m64nNk16 A layout: rows 16 warp + g (+ 8), k 2 (lane % 4) (+ 8)), at chunk (k / 8) ^ row % 8
__device__ __forceinline__ void frag_a_sw128(uint32_t a[4], const char* tile, int s) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    for (int j = 0; j < 4; j++) {
        int r = 16 * warp + g + 8 * (j % 2), k = 16 * s + 2 * c + 8 * (j / 2);
        a[j] = *(const uint32_t*)(tile + r * 128 + ((k / 8) ^ (r % 8)) * 16 + (k % 8) * 2);
    }
}

// grid (N / BN, M / (64 WG)), 128 WG threads: out (M x N); M % (64 WG) == 0, N % BN == 0, K % 64 == 0. Warpgroup
// q computes rows 64 q .. 64 q + 63 of the block's tile, all of them with the same B tile. AREG: A's fragments
// from shared memory into registers (as attention's P V takes P), else A by descriptor
template <int BN, int STAGES, bool AREG, int WG>
__global__ void __launch_bounds__(128 * WG) wgmma_gemm_kernel(float* out, const floatX* A, const floatX* B, int N, int K) {
    const int BM = 64 * WG, q = threadIdx.x / 128;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    // the swizzle repeats every 1024 bytes of shared address: the tiles start on such a boundary
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    const int a_bytes = BM * 128, stage_bytes = (BM + BN) * 128;
    const floatX* a_src = A + (size_t)m0 * K;
    const floatX* b_src = B + (size_t)n0 * K;
    float d[BN / 2];
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    const int tiles = K / WG_BK;
    if (STAGES == 2) {
        load_tile_sw128(smem, a_src, BM, K, 0);
        load_tile_sw128(smem + a_bytes, b_src, BN, K, 0);
        cp_async_commit();
    }
    for (int kt = 0; kt < tiles; kt++) {
        char* st = smem + (STAGES == 2 ? kt % 2 : 0) * stage_bytes;
        if (STAGES == 1) {
            load_tile_sw128(st, a_src, BM, K, kt * WG_BK);
            load_tile_sw128(st + a_bytes, b_src, BN, K, kt * WG_BK);
            cp_async_commit();
            cp_async_wait<0>();
        } else if (kt + 1 < tiles) {   // the next k-tile into the other stage, while this one multiplies
            char* nx = smem + (kt + 1) % 2 * stage_bytes;
            load_tile_sw128(nx, a_src, BM, K, (kt + 1) * WG_BK);
            load_tile_sw128(nx + a_bytes, b_src, BN, K, (kt + 1) * WG_BK);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        wgmma_fence_proxy();   // this thread's copies (generic proxy) visible to the MMAs' reads (async proxy)...
        __syncthreads();       // ...before the barrier that orders every thread's copies before any MMA
        uint32_t a[WG_BK / 16][4];   // (AREG) written before the fence: the ISA orders register writes before wgmma by it
        if (AREG)
            for (int s = 0; s < WG_BK / 16; s++) frag_a_sw128(a[s], st + q * 64 * 128, s);
        wgmma_fence_operand(d);
        wgmma_fence();
        for (int s = 0; s < WG_BK / 16; s++) {
            uint64_t db = wgmma_desc(st + a_bytes + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B);
            if (AREG) {
                wgmma_bf16_rs<BN, 0>(d, a[s], db, 1);
            } else {
                wgmma_bf16_ss<BN, 0, 0>(d, wgmma_desc(st + q * 64 * 128 + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B), db, 1);
            }
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(d);
        __syncthreads();   // every warp's MMAs are done before the stage is loaded again
    }
    // the accumulator fragment: d[i] = D[16 warp + g + 8 ((i/2)%2)][8 (i/4) + 2 (lane%4) + i%2]
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    for (int i = 0; i < BN / 2; i += 2) {
        int r = m0 + 64 * q + 16 * warp + g + 8 * (i / 2 % 2), col = n0 + 8 * (i / 4) + 2 * c;
        *(float2*)(out + (size_t)r * N + col) = make_float2(d[i], d[i + 1]);
    }
}

// v7: grid (N / BN, M / 64), 160 threads: warpgroup 0 multiplies, thread 128 (the fifth warp) produces. Stage s
// holds A's 64 x 64 and B's BN x 64 k-tile as TMA lands them (128B swizzle: the K-major wgmma layout)
template <int BN, int STAGES>
__global__ void __launch_bounds__(160) wgmma_gemm_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                                                             float* out, int N, int K) {
    __shared__ uint64_t full[STAGES], empty[STAGES];
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * BN, tiles = K / WG_BK, stage_bytes = (64 + BN) * 128;
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) { mbarrier_init(&full[s], 1); mbarrier_init(&empty[s], 128); }
    __syncthreads();
    if (threadIdx.x == 128) {
        for (int kt = 0; kt < tiles; kt++) {
            const int s = kt % STAGES;
            char* st = smem + s * stage_bytes;
            mbarrier_wait_parity(&empty[s], ((kt / STAGES) & 1) ^ 1);   // (the first round passes: parity 1)
            mbarrier_arrive_expect_tx(&full[s], stage_bytes);
            tma_load_2d(st, &map_a, kt * WG_BK, m0, &full[s]);
            tma_load_2d(st + 64 * 128, &map_b, kt * WG_BK, n0, &full[s]);
        }
    } else if (threadIdx.x < 128) {
        float d[BN / 2];
        for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
        for (int kt = 0; kt < tiles; kt++) {
            const int s = kt % STAGES;
            char* st = smem + s * stage_bytes;
            mbarrier_wait_parity(&full[s], (kt / STAGES) & 1);
            wgmma_fence_operand(d);
            wgmma_fence();
            for (int k = 0; k < WG_BK / 16; k++)
                wgmma_bf16_ss<BN, 0, 0>(d, wgmma_desc(st + 32 * k, 16, 1024, WGMMA_SWIZZLE_128B),
                                        wgmma_desc(st + 64 * 128 + 32 * k, 16, 1024, WGMMA_SWIZZLE_128B), 1);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operand(d);
            mbarrier_arrive(&empty[s]);   // the MMAs have read the stage
        }
        const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
        for (int i = 0; i < BN / 2; i += 2) {
            int r = m0 + 16 * warp + g + 8 * (i / 2 % 2), col = n0 + 8 * (i / 4) + 2 * c;
            *(float2*)(out + (size_t)r * N + col) = make_float2(d[i], d[i + 1]);
        }
    }
}
template <int BN, int STAGES> static void gemm_tma(float* out, const floatX* A, const floatX* B, int M, int N, int K) {
    alignas(64) CUtensorMap ma, mb;
    tma_map_2d_bf16(&ma, A, K, M, K, WG_BK, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    tma_map_2d_bf16(&mb, B, K, N, K, WG_BK, BN, CU_TENSOR_MAP_SWIZZLE_128B);
    size_t smem = (size_t)STAGES * (64 + BN) * 128 + 1024;
    cudaCheck(cudaFuncSetAttribute(wgmma_gemm_tma_kernel<BN, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH((wgmma_gemm_tma_kernel<BN, STAGES>), dim3(N / BN, M / 64), 160, smem, 0, ma, mb, out, N, K);
}

template <int BN, int STAGES, bool AREG, int WG = 1> static void gemm(float* out, const floatX* A, const floatX* B, int M, int N, int K) {
    size_t smem = (size_t)STAGES * (64 * WG + BN) * 128 + 1024;
    cudaCheck(cudaFuncSetAttribute(wgmma_gemm_kernel<BN, STAGES, AREG, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH((wgmma_gemm_kernel<BN, STAGES, AREG, WG>), dim3(N / BN, M / (64 * WG)), 128 * WG, smem, 0, out, A, B, N, K);
}

#define NVERSIONS 7
static const char* const NAMES[NVERSIONS] = {"v1 one stage, BN 128", "v2 two stages, BN 128", "v3 two stages, BN 256",
                                             "v4 v2, A from registers", "v5 two stages, BN 64", "v6 2 warpgroups, 128 x 256",
                                             "v7 TMA ring of 4, producer thread"};
static void run_version(int v, float* out, const floatX* A, const floatX* B, int M, int N, int K) {
    if (v == 1) gemm<128, 1, false>(out, A, B, M, N, K);
    else if (v == 2) gemm<128, 2, false>(out, A, B, M, N, K);
    else if (v == 3) gemm<256, 2, false>(out, A, B, M, N, K);
    else if (v == 4) gemm<128, 2, true>(out, A, B, M, N, K);
    else if (v == 5) gemm<64, 2, false>(out, A, B, M, N, K);
    else if (v == 6) gemm<256, 2, false, 2>(out, A, B, M, N, K);
    else gemm_tma<128, 4>(out, A, B, M, N, K);
}

#if !defined(SIMT_EMULATION)
// never launched: nvcc assembles every wrapper of model/wgmma.cuh for sm_90a (test/test_wgmma.cpp runs them all
// under the emulator), so that a PTX operand list that does not assemble fails the build
__global__ void wgmma_assemble_all(float* out, uint64_t da, uint64_t db, const uint32_t* a) {
    float d64[32] = {}, d128[64] = {}, d256[128] = {};
    wgmma_fence();
    wgmma_bf16_ss<64, 0, 1>(d64, da, db, 0); wgmma_bf16_ss<64, 1, 0>(d64, da, db, 1); wgmma_bf16_ss<64, 1, 1>(d64, da, db, 1);
    wgmma_bf16_ss<128, 0, 1>(d128, da, db, 0); wgmma_bf16_ss<128, 1, 0>(d128, da, db, 1); wgmma_bf16_ss<128, 1, 1>(d128, da, db, 1);
    wgmma_bf16_ss<256, 0, 1>(d256, da, db, 0); wgmma_bf16_ss<256, 1, 0>(d256, da, db, 1); wgmma_bf16_ss<256, 1, 1>(d256, da, db, 1);
    wgmma_bf16_rs<64, 1>(d64, a, db, 1); wgmma_bf16_rs<128, 1>(d128, a, db, 1); wgmma_bf16_rs<256, 1>(d256, a, db, 1);
    wgmma_bf16_rs<256, 0>(d256, a, db, 1);
    wgmma_fp8_ss<64, WGMMA_E4M3, WGMMA_E4M3>(d64, da, db, 1); wgmma_fp8_ss<128, WGMMA_E4M3, WGMMA_E5M2>(d128, da, db, 1);
    wgmma_fp8_ss<256, WGMMA_E5M2, WGMMA_E4M3>(d256, da, db, 1); wgmma_fp8_ss<128, WGMMA_E5M2, WGMMA_E5M2>(d128, da, db, 1);
    wgmma_fp8_rs<64, WGMMA_E4M3, WGMMA_E4M3>(d64, a, db, 1); wgmma_fp8_rs<128, WGMMA_E5M2, WGMMA_E4M3>(d128, a, db, 1);
    wgmma_fp8_rs<256, WGMMA_E4M3, WGMMA_E5M2>(d256, a, db, 1); wgmma_fp8_rs<256, WGMMA_E5M2, WGMMA_E5M2>(d256, a, db, 0);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_wait<0>();
    out[threadIdx.x] = d64[threadIdx.x % 32] + d128[threadIdx.x % 64] + d256[threadIdx.x];
}
#endif

int main(int argc, char** argv) {
    int only = 0, M = 4096, N = 4096, K = 4096;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        int x = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-v") && x >= 1 && x <= NVERSIONS) only = x;
        else if (!strcmp(argv[i], "-m") && x > 0 && x % 128 == 0) M = x;
        else if (!strcmp(argv[i], "-n") && x > 0 && x % 256 == 0) N = x;
        else if (!strcmp(argv[i], "-k") && x > 0 && x % WG_BK == 0) K = x;
        else { fprintf(stderr, "usage: %s [-v N (1-7)] [-m M (a multiple of 128)] [-n N (of 256)] [-k K (of 64)]\n", argv[0]); return 2; }
    }
    char shape[96];
    if (EMULATED) snprintf(shape, sizeof shape, "M 128, N 256, K 192");
    else snprintf(shape, sizeof shape, "M %d, N %d, K %d (validated at M 128, N 256, K 192)", M, N, K);
    print_header("wgmma GEMM (BF16, TN)", shape);
    // validation: the double-precision product, fp32 summation tolerance
    const int vm = 128, vn = 256, vk = 192;
    std::vector<float> a = round_bf16(make_random((size_t)vm * vk, 1)), b = round_bf16(make_random((size_t)vn * vk, 2));
    std::vector<float> want((size_t)vm * vn);
    for (int i = 0; i < vm; i++)
        for (int j = 0; j < vn; j++) {
            double s = 0;
            for (int k = 0; k < vk; k++) s += (double)a[(size_t)i * vk + k] * b[(size_t)j * vk + k];
            want[(size_t)i * vn + j] = (float)s;
        }
    floatX *da = to_device_bf16v(a), *db = to_device_bf16v(b);
    float* dout = deviceAlloc(float, (size_t)vm * vn);
    for (int v = 1; v <= NVERSIONS; v++) {
        if (only && v != only) continue;
        cudaCheck(cudaMemset(dout, 0xFF, (size_t)vm * vn * sizeof(float)));
        run_version(v, dout, da, db, vm, vn, vk);
        validate(NAMES[v - 1], from_device_f32(dout, (size_t)vm * vn), want, 1e-5, 5e-5);
    }
    cudaCheck(cudaFree(da)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(dout));
    if (!EMULATED) {   // the timing shape
        floatX *ta = to_device_bf16v(make_random((size_t)M * K, 3)), *tb = to_device_bf16v(make_random((size_t)N * K, 4));
        float* tout = deviceAlloc(float, (size_t)M * N);
        for (int v = 1; v <= NVERSIONS; v++)
            if (!only || v == only) report_flops(NAMES[v - 1], 2.0 * M * N * K, time_ms(20, [&] { run_version(v, tout, ta, tb, M, N, K); }));
        cudaCheck(cudaFree(ta)); cudaCheck(cudaFree(tb)); cudaCheck(cudaFree(tout));
    }
    return finish();
}
