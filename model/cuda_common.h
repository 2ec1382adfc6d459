/*
 * cuda_common.h — what every CUDA kernel file shares, in the real build (nvcc) and in the emulated
 * one (the same source on the SIMT emulator; model/platform.h brings in the runtime of either): the
 * BF16 storage type, error checks that name the file and line, warp and block reductions, and device
 * buffers. (LAUNCH, the one launch helper of both builds, is platform.h's.) Included by the model's
 * .cuh files only under `#if DBRX_HAVE_CUDA`, so the g++ CPU-only build never sees it.
 */
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>
#include "common.h"   // platform.h: the CUDA runtime, LAUNCH, DROPPABLE_SYNCTHREADS

// storage type of activations and working weights; accumulation is always fp32
typedef __nv_bfloat16 floatX;

// ---------------------------------------------------------------------------------------------
// errors: every CUDA call is checked, and a failure names the caller's file and line

inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fail_at(file, line, "CUDA error %s: %s", cudaGetErrorName(err), cudaGetErrorString(err));
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// dynamic shared memory, declared once at file scope: the emulator's g++ build does not resolve a block-scope extern
// thread_local array inside a template kernel (the flash attention, wgmma and grouped-GEMM kernels use it)
extern __shared__ __align__(16) char dynamic_smem[];

// ---------------------------------------------------------------------------------------------
// W consecutive BF16 values moved in one access, converted to / from fp32 registers. W = 8 is one
// 16-byte load or store (128-bit: a quarter of the instructions of 4-byte ones, full sectors per
// warp); the pointer must be 16-byte aligned. W = 1 is the scalar fallback for odd widths.
template <int W> struct alignas(2 * W) Bf16Vec { floatX v[W]; };
template <int W> __device__ __forceinline__ void load_bf16(float* f, const floatX* p) {
    Bf16Vec<W> x = *(const Bf16Vec<W>*)p;
    for (int j = 0; j < W; j++) f[j] = __bfloat162float(x.v[j]);
}
template <int W> __device__ __forceinline__ void store_bf16(floatX* p, const float* f) {
    Bf16Vec<W> x;
    for (int j = 0; j < W; j++) x.v[j] = __float2bfloat16(f[j]);
    *(Bf16Vec<W>*)p = x;
}
// true when every pointer given is 16-byte aligned (nullptr counts as aligned: an absent operand)
inline bool aligned16(std::initializer_list<const void*> ptrs) {
    for (const void* p : ptrs) if ((uintptr_t)p % 16) return false;
    return true;
}
// true when rows of C BF16 values starting at every pointer given can be read 8 at a time
inline bool bf16_rows_vec8(int C, std::initializer_list<const void*> ptrs) { return C % 8 == 0 && aligned16(ptrs); }

// rows[r] of a table, for any element type: out (rows, C) = src[idx[r]] (C elements each). Moved in
// units U: int4 (16 bytes per thread) when the rows are 16-byte multiples and aligned, else the
// element itself. (The embedding lookup and the MoE's row gathers.)
template <typename U>
__global__ void gather_rows_kernel(U* out, const U* src, const int* idx, int rows, int units_per_row) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * units_per_row) return;
    size_t r = i / units_per_row, c = i % units_per_row;
    out[i] = src[(size_t)idx[r] * units_per_row + c];
}
template <typename T>
inline void gather_rows_gpu(T* out, const T* src, const int* idx, int rows, int C, cudaStream_t stream = 0) {
    if (rows == 0) return;
    size_t row_bytes = (size_t)C * sizeof(T);
    if (row_bytes % 16 == 0 && aligned16({out, src})) {
        int units = (int)(row_bytes / 16);
        LAUNCH(gather_rows_kernel<int4>, ceil_div((long long)rows * units, 256), 256, 0, stream, (int4*)out, (const int4*)src, idx,
               rows, units);
    } else {
        LAUNCH(gather_rows_kernel<T>, ceil_div((long long)rows * C, 256), 256, 0, stream, out, src, idx, rows, C);
    }
}

// ---------------------------------------------------------------------------------------------
// reductions. Every lane of the warp gets the result (butterfly), and the order of the additions
// is fixed, so the result does not depend on scheduling.

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` is 32 floats of shared memory, free again when the function returns.
__device__ inline float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();   // scratch may be reused by the caller right after
    return v;
}
__device__ inline float block_max(float v, float* scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    v = warp_max(v);
    DROPPABLE_SYNCTHREADS("block_max");   // scratch may be reused by the caller right after
    return v;
}

// ---------------------------------------------------------------------------------------------
// device memory helpers (host side)

template <typename T> inline T* device_alloc(size_t n, const char* file, int line) {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, (n ? n : 1) * sizeof(T));
    if (err != cudaSuccess) {
        size_t free_b = 0, total = 0;
        (void)cudaGetLastError();
        cudaMemGetInfo(&free_b, &total);
        fail_at(file, line, "out of GPU memory allocating %zu bytes (%.1f MiB; %.1f of %.1f MiB free): %s", n * sizeof(T),
                n * sizeof(T) / 1048576.0, free_b / 1048576.0, total / 1048576.0, cudaGetErrorString(err));
    }
    return (T*)p;
}
#define deviceAlloc(T, n) device_alloc<T>((n), __FILE__, __LINE__)

// host float <-> device bf16 (round to nearest even, the CUDA conversion)
inline void to_device_bf16(floatX* dst, const float* src, size_t n) {
    std::vector<floatX> tmp(n);
    for (size_t i = 0; i < n; i++) tmp[i] = __float2bfloat16(src[i]);
    cudaCheck(cudaMemcpy(dst, tmp.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
}
inline void from_device_bf16(float* dst, const floatX* src, size_t n) {
    std::vector<floatX> tmp(n);
    cudaCheck(cudaMemcpy(tmp.data(), src, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) dst[i] = __bfloat162float(tmp[i]);
}
