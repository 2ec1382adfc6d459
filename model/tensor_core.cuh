/*
 * tensor_core.cuh — the warp-level matrix instructions the kernels use, one small device function each:
 *   mma_m16n8k16_bf16_f32   D (16x8 fp32) = A (16x16 bf16) B (16x8 bf16) + C, one warp
 *   ldmatrix_x{1,2,4}[_trans]  1, 2 or 4 8x8 b16 matrices from shared memory into fragments
 *   cp_async_16[_zfill], cp_async_commit, cp_async_wait<N>   asynchronous global -> shared copies
 *   pack_bf16x2             two floats -> one .b32 register of two bf16 (an A or B fragment register)
 * Under nvcc they are inline PTX (sm_80 and later); under SIMT_EMULATION they call the emulator's
 * implementations (its tensor_core.h, which model/platform.h brings in with the emulator), warp
 * collectives computing exactly the per-lane fragment layouts of the PTX ISA. Both sets stay in this
 * file, the emulator's under the names of the PTX they model (model/CUDA.md, "Where the emulator is
 * named"). The layouts (g = lane / 4, t = lane % 4; a .b32 register holds two bf16, the lower-indexed
 * element in its low half):
 *   A (16x16, row):  a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
 *   B (16x8, col):   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
 *   C, D (16x8):     c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
 *   ldmatrix: lane 8i + r gives the address of row r of matrix i (16 bytes, 16-byte aligned); lane l
 *     receives r[i] = M_i[l/4][2(l%4), 2(l%4)+1], with .trans M_i[2(l%4), 2(l%4)+1][l/4].
 * Hence a row-major 16x16 tile in shared memory is an A fragment by ldmatrix_x4 with lane l pointing
 * at row l % 16, column 8 (l / 16); a tile stored n-major (rows = N, k contiguous) is a B fragment
 * without .trans, one stored k-major (rows = K, n contiguous) with .trans; and an accumulator C of
 * two adjacent 16x8 tiles, rounded to bf16 pairwise, is the A fragment of their 16x16 product
 * (c[0..1] -> a[0] or a[2], c[2..3] -> a[1] or a[3]), which is how attention feeds P to P V.
 */
#pragma once
#include "cuda_common.h"

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16;
}

#if defined(SIMT_EMULATION)

__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    simt::mma_m16n8k16_bf16_f32(d, a, b, c, __FILE__, __LINE__);
}
__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* p) { simt::ldmatrix<1, false>(r, p, __FILE__, __LINE__); }
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* p) { simt::ldmatrix<2, false>(r, p, __FILE__, __LINE__); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) { simt::ldmatrix<4, false>(r, p, __FILE__, __LINE__); }
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* p) { simt::ldmatrix<1, true>(r, p, __FILE__, __LINE__); }
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* p) { simt::ldmatrix<2, true>(r, p, __FILE__, __LINE__); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) { simt::ldmatrix<4, true>(r, p, __FILE__, __LINE__); }
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) { simt::cp_async_16(smem, gmem, 16, __FILE__, __LINE__); }
// reads the first src_bytes (0..16) of gmem and zero-fills the rest: out-of-range rows cost no read
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    simt::cp_async_16(smem, gmem, src_bytes, __FILE__, __LINE__);
}
__device__ __forceinline__ void cp_async_commit() { simt::cp_async_commit(); }
template <int N> __device__ __forceinline__ void cp_async_wait() { simt::cp_async_wait(N); }

#else

__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
// shared-state-space address of a generic pointer into shared memory
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)) : "memory");
}
// .cg: cached in L2 only (the tile is staged in shared memory: no reuse from L1)
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(__cvta_generic_to_global(gmem)) : "memory");
}
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(__cvta_generic_to_global(gmem)),
                 "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

#endif

// ---------------------------------------------------------------------------------------------
// fragments of tiles in shared memory (bf16, row stride `ld` elements, rows 16-byte aligned), for
// one m16n8k16 step. Each is one ldmatrix_x4 whose lane addresses follow the layouts above.

// A fragment of the 16x16 block at (row0, col0) of a row-major tile
__device__ __forceinline__ void frag_a(uint32_t a[4], const floatX* tile, int ld, int row0, int col0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (size_t)(row0 + lane % 16) * ld + col0 + 8 * (lane / 16));
}
// B fragments of two adjacent n-tiles, B (16 x 16: k0.., n0..) read from a tile stored n-major
// (row n holds k contiguous, as K in Q K^T): b[0..1] for n0..n0+7, b[2..3] for n0+8..n0+15
__device__ __forceinline__ void frag_b_nmajor(uint32_t b[4], const floatX* tile, int ld, int n0, int k0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(b, tile + (size_t)(n0 + lane % 8 + 8 * (lane / 16)) * ld + k0 + 8 * (lane / 8 % 2));
}
// the same from a tile stored k-major (row k holds n contiguous, as V in P V): .trans
__device__ __forceinline__ void frag_b_kmajor(uint32_t b[4], const floatX* tile, int ld, int k0, int n0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4_trans(b, tile + (size_t)(k0 + lane % 8 + 8 * (lane / 8 % 2)) * ld + n0 + 8 * (lane / 16));
}
// the A fragment of a 16x16 block whose two 16x8 halves are accumulators c0 (columns 0..7) and c1
__device__ __forceinline__ void frag_a_from_acc(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}
