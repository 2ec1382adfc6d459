/*
 * attention_wgmma_common.h — what the wgmma attention forward (attention_wgmma.cu) and backward
 * (attention_wgmma_bwd.cu) share: the cp.async copy of a tile of rows into Hopper's 128B-swizzled layout.
 */
#pragma once
#include "../../model/wgmma.cuh"

// rows [row0, row0 + rows) (HD columns) of a row-major src (row stride ld, T rows) into the swizzled panels of dst:
// panel p (head dims 64 p ..) at dst + p rows 128, row r 128 bytes, 16-byte chunk c at c ^ r % 8; rows >= T zero.
// THREADS: the block's threads, all of which call it
template <int HD, int THREADS>
__device__ __forceinline__ void wgmma_load_rows(char* dst, const floatX* src, size_t ld, int row0, int rows, int T) {
    constexpr int CH = HD / 8;
    for (int i = threadIdx.x; i < rows * CH; i += THREADS) {
        int r = i / CH, c = i % CH;
        char* d = dst + (c / 8) * rows * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16;
        if (row0 + r < T) cp_async_16(d, src + (size_t)(row0 + r) * ld + 8 * c);
        else cp_async_16_zfill(d, src, 0);
    }
}
