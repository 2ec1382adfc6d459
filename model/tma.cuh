/*
 * tma.cuh — Hopper's mbarriers and tensor memory accelerator (sm_90a), one small device function each, for a
 * producer warp that feeds wgmma consumers through a ring of shared-memory stages (issue 25):
 *   mbarrier_init(bar, count)                 mbarrier.init + fence.mbarrier_init (one thread; a __syncthreads() before
 *                                             the others use it)
 *   mbarrier_arrive(bar)                      mbarrier.arrive, returns the state
 *   mbarrier_arrive_expect_tx(bar, bytes)     mbarrier.arrive.expect_tx: the phase also waits for `bytes` of copies
 *   mbarrier_wait_parity(bar, parity)         loops on mbarrier.try_wait.parity until the phase of that parity completed
 *   tma_load_2d(dst, map, x, y, bar)          cp.async.bulk.tensor.2d global -> shared, completing its bytes on bar
 *   tma_load_3d(dst, map, x, y, z, bar)       the same in 3 dimensions
 *   tma_map_2d_bf16(map, base, cols, rows, ld, box_cols, box_rows, swizzle)   the host's tensor map of a row-major bf16
 *                                             matrix (x: the column, y: the row), through cuTensorMapEncodeTiled
 * Under nvcc: inline PTX; the encoder is the driver's, taken with cudaGetDriverEntryPointByVersion (no -lcuda).
 * Under SIMT_EMULATION: the emulator's test/simt/tma.h, whose top comment has the rules with their sources (PTX ISA
 * "mbarrier", "cp.async.bulk.tensor"; CUDA Driver API "Tensor Map Object Management"), in short: a phase completes
 * when its arrivals (init's count) are in and its tx-count (expect_tx minus the bytes the copies completed) is 0; the
 * parity flips then; a consumer waits on parity 0 first, a producer on an "empty" barrier on parity 1 first (passes).
 * A TMA box lands as rows of box_cols elements; with CU_TENSOR_MAP_SWIZZLE_128B and 64 bf16 columns it is a K-major
 * 128B-swizzled wgmma operand (model/wgmma.cuh: SBO 1024, 1024-byte aligned stages); out-of-range elements are 0.
 * The tensor map is a kernel argument: `const __grid_constant__ CUtensorMap map`, passed as &map.
 */
#pragma once
#include <cuda.h>
#include "tensor_core.cuh"

inline void cu_check(CUresult err, const char* file, int line) {
    if (err != CUDA_SUCCESS) fail_at(file, line, "CUDA driver error %d", (int)err);
}
#define cuCheck(call) cu_check((call), __FILE__, __LINE__)

// the encoder's lookup below (cudaGetDriverEntryPointByVersion) came with CUDA 12.5; an older toolkit stops here, named
#if !defined(SIMT_EMULATION) && defined(CUDART_VERSION) && CUDART_VERSION < 12050
#error "model/tma.cuh needs CUDA 12.5 or newer (cudaGetDriverEntryPointByVersion); this toolkit is older"
#endif

#if defined(SIMT_EMULATION)

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) { simt::mbar_init(bar, count, __FILE__, __LINE__); }
__device__ __forceinline__ uint64_t mbarrier_arrive(uint64_t* bar) { return simt::mbar_arrive(bar, 1, __FILE__, __LINE__); }
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    simt::mbar_expect_tx(bar, bytes, __FILE__, __LINE__);
    simt::mbar_arrive(bar, 1, __FILE__, __LINE__);
}
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    return simt::mbar_try_wait_parity(bar, (int)parity, __FILE__, __LINE__);
}
__device__ __forceinline__ bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity) {
    return simt::mbar_test_wait_parity(bar, (int)parity, __FILE__, __LINE__);
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
    const int32_t c[2] = {x, y};
    simt::tma_load(dst, map, c, 2, bar, __FILE__, __LINE__);
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
    const int32_t c[3] = {x, y, z};
    simt::tma_load(dst, map, c, 3, bar, __FILE__, __LINE__);
}

#else

// (the mbarrier instructions exist from sm_80, the bulk tensor copies from sm_90)
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
    // the initialised barrier visible to the asynchronous proxy (the copies' complete_tx), as CUTLASS's pipelines do
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ uint64_t mbarrier_arrive(uint64_t* bar) {
    uint64_t state;
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];\n" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
    return state;
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    return done != 0;
}
__device__ __forceinline__ bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    return done != 0;
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(x), "r"(y), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar)) : "memory");
}

#endif

// waits until the phase of `parity` has completed (try_wait may give up after a time: it is retried)
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {}
}

// the driver's cuTensorMapEncodeTiled (the emulator's twin under SIMT_EMULATION), looked up once
typedef CUresult (*TmaEncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                                     const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline TmaEncodeTiledFn tma_encode_tiled() {
    static TmaEncodeTiledFn fn = nullptr;
    if (!fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !p) fail_at(__FILE__, __LINE__, "the driver has no cuTensorMapEncodeTiled (CUDA 12+ needed)");
        fn = (TmaEncodeTiledFn)p;
    }
    return fn;
}
// the tensor map of a row-major (rows, cols) bf16 matrix with `ld` elements per row, boxes of box_rows x box_cols;
// returns the driver's result (tma_map_2d_bf16 checks it)
inline CUresult tma_encode_2d_bf16(CUtensorMap* map, const __nv_bfloat16* base, uint64_t cols, uint64_t rows, uint64_t ld,
                                   uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
    const cuuint64_t dim[2] = {cols, rows}, stride[1] = {ld * sizeof(__nv_bfloat16)};
    const cuuint32_t box[2] = {box_cols, box_rows}, estride[2] = {1, 1};
    return tma_encode_tiled()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)base, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
#define tma_map_2d_bf16(...) cuCheck(tma_encode_2d_bf16(__VA_ARGS__))
