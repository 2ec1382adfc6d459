/*
 * wgmma.cuh — Hopper's warpgroup-level matrix instructions (sm_90a), one small device function each, the
 * groundwork for a Hopper attention and grouped GEMM (issue 25; no product kernel uses them yet):
 *   wgmma_desc(smem, lbo, sbo, swizzle)          the 64-bit shared-memory matrix descriptor
 *   wgmma_fence, wgmma_commit, wgmma_wait<N>     wgmma.fence / commit_group / wait_group N (.sync.aligned)
 *   wgmma_bf16_ss<N, TA, TB>(d, desc_a, desc_b, scale_d)   D (64xN fp32) = A B + (scale_d ? D : 0), A and B
 *                                                 from shared memory; TA / TB: 0 K-major, 1 MN-major
 *   wgmma_bf16_rs<N, TB>(d, a, desc_b, scale_d)  the same with A from registers (4 .b32 per thread)
 *   wgmma_fp8_ss<N, AT, BT>, wgmma_fp8_rs<N, AT, BT>   the FP8 forms (m64nNk32, AT / BT WGMMA_E4M3 or WGMMA_E5M2,
 *                                                 K-major operands only; A's 4 registers hold 4 codes each)
 *   wgmma_fence_operand(regs)                    keeps the compiler from moving register accesses across
 *                                                 the asynchronous MMA (nvcc; nothing under the emulator)
 * A warpgroup is 128 threads (4 consecutive warps, the first a multiple of 4); all of them execute each call.
 * Under nvcc they are inline PTX (wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16, N = 64, 128 or 256
 * here); under SIMT_EMULATION the emulator's test/simt/wgmma.h (every N a multiple of 8 in [8, 256]), whose top
 * comment has the layouts with their source (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-
 * Accumulate"), in short: thread 32 q + 4 g + t holds d[i] = D[16 q + g + 8 ((i/2) % 2)][8 (i/4) + 2t + i%2]
 * and A as mma.m16n8k16's fragment of rows 16 q ..; in shared memory an operand is made of core matrices of
 * 8 rows x 16 bytes. K-major without swizzle: core matrices along k LBO bytes apart, along m / n SBO bytes
 * apart; K-major 128B swizzle: rows of 128 bytes (64 bf16 of k), 8-row groups SBO (1024) apart, the 16-byte
 * chunk index XORed with the row index within the 1024-byte atom, the next k-step at start + 32 bytes.
 * Hopper's asynchronous proxy: shared memory written by the threads' ordinary stores must be made visible
 * to wgmma with fence.proxy.async (wgmma_fence_proxy below) before the wgmma reads it.
 */
#pragma once
#include "tensor_core.cuh"


#define WGMMA_SWIZZLE_NONE 0
#define WGMMA_SWIZZLE_128B 1
#define WGMMA_SWIZZLE_64B 2
#define WGMMA_SWIZZLE_32B 3
#define WGMMA_E4M3 1
#define WGMMA_E5M2 2

// the descriptor's bits: [13:0] address >> 4, [29:16] LBO >> 4, [45:32] SBO >> 4, [51:49] base offset 0,
// [63:62] swizzle mode
__device__ __forceinline__ uint64_t wgmma_desc_encode(uint32_t addr, uint32_t lbo, uint32_t sbo, int swizzle) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 | (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 |
           (uint64_t)swizzle << 62;
}

#if defined(SIMT_EMULATION)

__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo, int swizzle) {
    return wgmma_desc_encode(simt::wgmma_smem_addr(smem, __FILE__, __LINE__), lbo, sbo, swizzle);
}
__device__ __forceinline__ void wgmma_fence() { simt::wgmma_fence(__FILE__, __LINE__); }
__device__ __forceinline__ void wgmma_commit() { simt::wgmma_commit(__FILE__, __LINE__); }
template <int N> __device__ __forceinline__ void wgmma_wait() { simt::wgmma_wait(N, __FILE__, __LINE__); }
// (the emulator's shared memory has one proxy: the stores are visible to wgmma at once; the race detector
// checks the fence's place, test/simt/race.h)
__device__ __forceinline__ void wgmma_fence_proxy() { simt::wgmma_fence_proxy(); }
template <int M> __device__ __forceinline__ void wgmma_fence_operand(float (&)[M]) {}
template <int N, int TA, int TB>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N a multiple of 8 in [8, 256]");
    simt::wgmma_mma(d, N, nullptr, desc_a, desc_b, scale_d, TA, TB, __FILE__, __LINE__);
}
template <int N, int TB>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int scale_d) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N a multiple of 8 in [8, 256]");
    simt::wgmma_mma(d, N, a, 0, desc_b, scale_d, 0, TB, __FILE__, __LINE__);
}
template <int N, int AT, int BT>
__device__ __forceinline__ void wgmma_fp8_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk32: N a multiple of 8 in [8, 256]");
    simt::wgmma_mma(d, N, nullptr, desc_a, desc_b, scale_d, 0, 0, __FILE__, __LINE__, AT, BT);
}
template <int N, int AT, int BT>
__device__ __forceinline__ void wgmma_fp8_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int scale_d) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk32: N a multiple of 8 in [8, 256]");
    simt::wgmma_mma(d, N, a, 0, desc_b, scale_d, 0, 0, __FILE__, __LINE__, AT, BT);
}

#else

// wgmma exists on sm_90a only: nvcc -arch=sm_90a also embeds compute_90 PTX (for later GPUs, JIT), where
// these instructions do not assemble; there they trap (a kernel using them needs an sm_90a GPU)
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_SM90A(...) __VA_ARGS__
#else
#define WGMMA_SM90A(...) __trap()
#endif

__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo, int swizzle) {
    return wgmma_desc_encode(smem_u32(smem), lbo, sbo, swizzle);
}
__device__ __forceinline__ void wgmma_fence() { WGMMA_SM90A(asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory")); }
__device__ __forceinline__ void wgmma_commit() { WGMMA_SM90A(asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory")); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    WGMMA_SM90A(asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"));
}
__device__ __forceinline__ void wgmma_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int M> __device__ __forceinline__ void wgmma_fence_operand(float (&r)[M]) {
#pragma unroll
    for (int i = 0; i < M; i++) asm volatile("" : "+f"(r[i])::"memory");
}

// the accumulators' operand lists: "%0, %1, ..., %(R-1)" and "+f"(d[0]), ..., for R = N / 2 registers
#define WG_R10(p) "%" #p "0, %" #p "1, %" #p "2, %" #p "3, %" #p "4, %" #p "5, %" #p "6, %" #p "7, %" #p "8, %" #p "9, "
#define WG_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " WG_R10(1) WG_R10(2) "%30, %31"
#define WG_REGS64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " WG_R10(1) WG_R10(2) WG_R10(3) WG_R10(4) WG_R10(5) "%60, %61, %62, %63"
#define WG_REGS128                                                                                                              \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " WG_R10(1) WG_R10(2) WG_R10(3) WG_R10(4) WG_R10(5) WG_R10(6) WG_R10(7) WG_R10(8) \
        WG_R10(9) WG_R10(10) WG_R10(11) "%120, %121, %122, %123, %124, %125, %126, %127"
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32(i) WG_D8(i), WG_D8(i + 8), WG_D8(i + 16), WG_D8(i + 24)
// A and B from descriptors: %IA, %IB the descriptors, %IS scale-d (a predicate), %ITA, %ITB the transposes
#define WGMMA_SS(NS, REGS, IA, IB, IS, ITA, ITB, ...)                                                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #NS "k16.f32.bf16.bf16 {" REGS \
                 "}, %" #IA ", %" #IB ", p, 1, 1, %" #ITA ", %" #ITB ";\n}\n"                                               \
                 : __VA_ARGS__                                                                                               \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))
// A from registers %IA .. %IA+3
#define WGMMA_RS(NS, REGS, IA0, IA1, IA2, IA3, IB, IS, ITB, ...)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #NS "k16.f32.bf16.bf16 {" REGS \
                 "}, {%" #IA0 ", %" #IA1 ", %" #IA2 ", %" #IA3 "}, %" #IB ", p, 1, 1, %" #ITB ";\n}\n"                      \
                 : __VA_ARGS__                                                                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB))

template <int N, int TA, int TB>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "the nvcc wrappers cover N = 64, 128, 256");
    if constexpr (N == 64) WGMMA_SM90A(WGMMA_SS(64, WG_REGS32, 32, 33, 34, 35, 36, WG_D32(0)));
    else if constexpr (N == 128) WGMMA_SM90A(WGMMA_SS(128, WG_REGS64, 64, 65, 66, 67, 68, WG_D32(0), WG_D32(32)));
    else WGMMA_SM90A(WGMMA_SS(256, WG_REGS128, 128, 129, 130, 131, 132, WG_D32(0), WG_D32(32), WG_D32(64), WG_D32(96)));
}
template <int N, int TB>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "the nvcc wrappers cover N = 64, 128, 256");
    if constexpr (N == 64) WGMMA_SM90A(WGMMA_RS(64, WG_REGS32, 32, 33, 34, 35, 36, 37, 38, WG_D32(0)));
    else if constexpr (N == 128) WGMMA_SM90A(WGMMA_RS(128, WG_REGS64, 64, 65, 66, 67, 68, 69, 70, WG_D32(0), WG_D32(32)));
    else WGMMA_SM90A(WGMMA_RS(256, WG_REGS128, 128, 129, 130, 131, 132, 133, 134, WG_D32(0), WG_D32(32), WG_D32(64), WG_D32(96)));
}
// FP8: TYPES ".e4m3.e4m3" etc.; no transposes
#define WGMMA_SS8(NS, TYPES, REGS, IA, IB, IS, ...)                                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #NS "k32.f32" TYPES " {" REGS \
                 "}, %" #IA ", %" #IB ", p, 1, 1;\n}\n"                                                                    \
                 : __VA_ARGS__                                                                                               \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define WGMMA_RS8(NS, TYPES, REGS, IA0, IA1, IA2, IA3, IB, IS, ...)                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #NS "k32.f32" TYPES " {" REGS \
                 "}, {%" #IA0 ", %" #IA1 ", %" #IA2 ", %" #IA3 "}, %" #IB ", p, 1, 1;\n}\n"                               \
                 : __VA_ARGS__                                                                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define WGMMA_SS8_N(TYPES)                                                                                                  \
    if constexpr (N == 64) WGMMA_SM90A(WGMMA_SS8(64, TYPES, WG_REGS32, 32, 33, 34, WG_D32(0)));                             \
    else if constexpr (N == 128) WGMMA_SM90A(WGMMA_SS8(128, TYPES, WG_REGS64, 64, 65, 66, WG_D32(0), WG_D32(32)));          \
    else WGMMA_SM90A(WGMMA_SS8(256, TYPES, WG_REGS128, 128, 129, 130, WG_D32(0), WG_D32(32), WG_D32(64), WG_D32(96)))
#define WGMMA_RS8_N(TYPES)                                                                                                  \
    if constexpr (N == 64) WGMMA_SM90A(WGMMA_RS8(64, TYPES, WG_REGS32, 32, 33, 34, 35, 36, 37, WG_D32(0)));                 \
    else if constexpr (N == 128) WGMMA_SM90A(WGMMA_RS8(128, TYPES, WG_REGS64, 64, 65, 66, 67, 68, 69, WG_D32(0), WG_D32(32))); \
    else WGMMA_SM90A(WGMMA_RS8(256, TYPES, WG_REGS128, 128, 129, 130, 131, 132, 133, WG_D32(0), WG_D32(32), WG_D32(64), WG_D32(96)))
template <int N, int AT, int BT>
__device__ __forceinline__ void wgmma_fp8_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "the nvcc wrappers cover N = 64, 128, 256");
    static_assert((AT == WGMMA_E4M3 || AT == WGMMA_E5M2) && (BT == WGMMA_E4M3 || BT == WGMMA_E5M2), "FP8: E4M3 or E5M2");
    if constexpr (AT == WGMMA_E4M3 && BT == WGMMA_E4M3) { WGMMA_SS8_N(".e4m3.e4m3"); }
    else if constexpr (AT == WGMMA_E4M3) { WGMMA_SS8_N(".e4m3.e5m2"); }
    else if constexpr (BT == WGMMA_E4M3) { WGMMA_SS8_N(".e5m2.e4m3"); }
    else { WGMMA_SS8_N(".e5m2.e5m2"); }
}
template <int N, int AT, int BT>
__device__ __forceinline__ void wgmma_fp8_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "the nvcc wrappers cover N = 64, 128, 256");
    static_assert((AT == WGMMA_E4M3 || AT == WGMMA_E5M2) && (BT == WGMMA_E4M3 || BT == WGMMA_E5M2), "FP8: E4M3 or E5M2");
    if constexpr (AT == WGMMA_E4M3 && BT == WGMMA_E4M3) { WGMMA_RS8_N(".e4m3.e4m3"); }
    else if constexpr (AT == WGMMA_E4M3) { WGMMA_RS8_N(".e4m3.e5m2"); }
    else if constexpr (BT == WGMMA_E4M3) { WGMMA_RS8_N(".e5m2.e4m3"); }
    else { WGMMA_RS8_N(".e5m2.e5m2"); }
}
#undef WGMMA_SS8_N
#undef WGMMA_RS8_N
#undef WGMMA_SS8
#undef WGMMA_RS8
#undef WGMMA_SS
#undef WGMMA_RS
#undef WG_D32
#undef WG_D8
#undef WG_REGS128
#undef WG_REGS64
#undef WG_REGS32
#undef WG_R10
#undef WGMMA_SM90A

#endif
