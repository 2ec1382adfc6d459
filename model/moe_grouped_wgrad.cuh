/*
 * moe_grouped_wgrad.cuh — the experts' weight-gradient GEMMs as one grouped launch per projection (issue 25; the
 * step's under --moe-gemm grouped, model/moe_experts_step.cuh; the default runs moe.cuh's cuBLASLt GEMMs per expert):
 *   experts_wgrad_grouped_gpu   dW_e (M, N) fp32 = beta dW_e + X_e^T Y_e   for every expert e
 * X (rows, M) and Y (rows, N) BF16 row-major, grouped by expert (offsets (E + 1) on the device): the reduction runs
 * over expert e's rows, K = n_e (any count, 0 included). The product's three:
 *   dw1_e (F, d) += dg_e^T xe_e,  dv1_e += du_e^T xe_e   (X = dg / du (rows, F), Y = xe (rows, d))
 *   dw2_e (F, d) += a_e^T dye_e                          (X = a (rows, F),       Y = dye (rows, d))
 * dw1, dv1, dw2 are (E F, d): dW_e at e M N. The structure is model/moe_grouped_tma.cuh's (v4): 384 threads, one
 * producer thread issuing TMA boxes into a ring of STAGES stages (full / empty mbarriers), 2 consumer warpgroups
 * (64 rows of dW each) on wgmma; a persistent schedule over the tiles (expert, m-tile, n-tile) of dW, every expert's
 * (the output is dense; the experts by rows, most first, the blocks' turns a snake: wgrad_position), the K loop
 * over the expert's rows in k-tiles of 64. Both operands are MN-major (k is the row): each TMA box is 64 columns x
 * 64 rows with the 128B swizzle, the MN-major panel of v4's DOWN B (row k's chunk c at c ^ k % 8; LBO the panel
 * stride 8192, SBO 1024, transpose flag 1): A = 2 panels of X (dW's 128 rows), B = BN / 64 panels of Y.
 * Stage = 16 KiB + BN / 64 x 8 KiB (48 KiB at BN 256; 4 stages).
 * The expert's last k-tile runs into the next expert's rows (or past the tensor: TMA's zeros), which must add
 * nothing. No thread writes the stage (a generic write would need fence.proxy.async and a barrier across both
 * consumer warpgroups, which the producer's exit rules out): the k-steps of 16 wholly past the end are not issued,
 * and the one straddling it takes A from registers (wgmma's register form), loaded from the stage with the rows past
 * the end set to 0. Those zeros meet the next rows of Y: a finite value gives +-0, which leaves the fp32 sum's bits
 * unchanged (a sum of products that is zero is +0, never -0); a non-finite one (a NaN in the next expert's rows of
 * the allocation) would leak in.
 * Numerics: the emulated wgmma sums the k products in order in fp32 from 0, as cuBLASLt's twin does; the epilogue
 * adds beta C as the twin (D = acc + beta C; beta 0: C not read): under the emulator dW is bit for bit
 * experts_backward_gpu's. An empty expert: beta 0 writes zeros (today: the GEMM is skipped and block_experts_backward
 * zeroes the expert, experts_zero_empty_kernel), beta != 0 leaves dW_e untouched (today: skipped).
 * PLANT (tests only): 1 the tail's k-steps issued from the stage as they are (the next expert's rows added);
 * 2 the producer skips the "empty" wait (a stage overwritten while read); 3 the consumers read a tail k-tile's
 * stage without waiting for its "full" barrier (a TMA destination read before it landed); 4 beta != 0: every batch of
 * the epilogue's loads reads the first batch's old dW; 5 the snake's odd rounds shifted by one (blocks 0 and 1 take
 * the same position: a tile computed twice, another never).
 */
#pragma once
#include "moe_grouped_tma.cuh"

#define WGRAD_BM 128   // rows of dW per tile: 64 per consumer warpgroup

// the stage's bytes: A (2 panels of 64 k-rows x 128 bytes) then B (BN / 64 panels)
template <int BN> __host__ __device__ constexpr int wgrad_stage_bytes() { return (WGRAD_BM + BN) * 128; }

// The schedule (persistent blocks): position j of the order runs the tile of expert s_order[j / per] (the experts by
// rows, most first), its m-tile, its n-tile (n fastest: the blocks running together share X's panel and all of Y_e);
// block b takes positions b, 2G - 1 - b, 2G + b, ... (G blocks; a snake over rounds of G). A tile's time grows with
// its expert's rows: round robin in expert order left dbrx-1b's blocks (6.8 tiles each, 4 sizes of expert) at
// 1.16x the mean work, sorted + snake at 1.05x (the rounds' sums pair a block's large tile with a small one).
struct WgradTile { int e, m0, n0, r0, n; };
template <int BN>
__device__ __forceinline__ WgradTile wgrad_tile(const int* s_off, const int* s_order, int M, int N, int j) {
    const int nt = N / BN, per = M / WGRAD_BM * nt, e = s_order[j / per], rem = j % per;
    WgradTile tile = {e, rem / nt * WGRAD_BM, rem % nt * BN, s_off[e], s_off[e + 1] - s_off[e]};
    return tile;
}
// block blockIdx.x's position in round r
template <int PLANT>
__device__ __forceinline__ int wgrad_position(int r) {
    const int G = gridDim.x, b = blockIdx.x;
    return r * G + (r % 2 == 0 ? b : PLANT == 5 ? G - b - (b == 0) : G - 1 - b);
}
// s_order (E): the experts by row count, most first (ties: lower index first); one thread
__device__ __forceinline__ void wgrad_sort_experts(int* s_order, const int* s_off, int E) {
    for (int e = 0; e < E; e++) {
        const int n = s_off[e + 1] - s_off[e];
        int i = e;
        for (; i > 0 && s_off[s_order[i - 1] + 1] - s_off[s_order[i - 1]] < n; i--) s_order[i] = s_order[i - 1];
        s_order[i] = e;
    }
}
__device__ __forceinline__ int wgrad_ktiles(int n) { return (n + MOE_GROUPED_BK - 1) / MOE_GROUPED_BK; }

// the producer (one thread): every (tile, k-tile) of the block into the ring, each stage once its consumers released it
template <int BN, int STAGES, int PLANT>
__device__ __forceinline__ void wgrad_produce(char* smem, uint64_t* full, uint64_t* empty, const CUtensorMap* mx, const CUtensorMap* my,
                                              const int* s_off, const int* s_order, int E, int M, int N) {
    constexpr int STAGE = wgrad_stage_bytes<BN>(), A_BYTES = WGRAD_BM * 128;
    const int total = E * (M / WGRAD_BM) * (N / BN);
    int it = 0;   // the block's k-tile count: stage it % STAGES, its use it / STAGES
    for (int r = 0, j; (j = wgrad_position<PLANT>(r)) < total; r++) {
        const WgradTile tile = wgrad_tile<BN>(s_off, s_order, M, N, j);
        for (int kt = 0; kt < wgrad_ktiles(tile.n); kt++, it++) {
            const int s = it % STAGES, k0 = tile.r0 + kt * MOE_GROUPED_BK;
            if (PLANT != 2) mbarrier_wait_parity(&empty[s], ((it / STAGES) & 1) ^ 1);
            char* st = smem + s * STAGE;
            mbarrier_arrive_expect_tx(&full[s], STAGE);
            for (int p = 0; p < 2; p++) tma_load_2d(st + p * 8192, mx, tile.m0 + 64 * p, k0, &full[s]);
            for (int p = 0; p < BN / 64; p++) tma_load_2d(st + A_BYTES + p * 8192, my, tile.n0 + 64 * p, k0, &full[s]);
        }
    }
}

// the register form's A (64 x 16: dW rows of the warpgroup's panel sa, k-rows k0 .. k0 + 15 of the stage) with the
// k-rows at or past `valid` zero; a[j] = A[16 warp + g + 8 (j % 2)][2 t + 8 (j / 2) + {0, 1}] (model/wgmma.cuh)
__device__ __forceinline__ void wgrad_tail_fragment(uint32_t (&a)[4], const char* sa, int k0, int valid) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int j = 0; j < 4; j++) {
        const int m = 16 * warp + g + 8 * (j % 2);
        uint32_t v[2];
        for (int h = 0; h < 2; h++) {
            const int k = k0 + 2 * t + 8 * (j / 2) + h;   // element (k, m) of the MN-major 128B-swizzled panel
            v[h] = k < valid ? *(const uint16_t*)(sa + k * 128 + ((m / 8) ^ (k % 8)) * 16 + (m % 8) * 2) : 0u;
        }
        a[j] = v[0] | v[1] << 16;
    }
}

// one k-tile (valid k-rows of 64) for the warpgroup whose A panel is sa, B's BN / 64 panels at sb; committed as one
// group. Full k-steps from shared memory; the step across `valid` from registers; the steps past it not issued
template <int BN, int PLANT>
__device__ __forceinline__ void wgrad_mma_ktile(float (&d)[BN / 2], const char* sa, const char* sb, int valid) {
    wgmma_fence();
    for (int s = 0; s < MOE_GROUPED_BK / 16; s++) {
        if (PLANT != 1 && 16 * s >= valid) break;
        const uint64_t db = wgmma_desc(sb + s * 16 * 128, 8192, 1024, WGMMA_SWIZZLE_128B);
        if (PLANT == 1 || 16 * s + 16 <= valid) {
            wgmma_bf16_ss<BN, 1, 1>(d, wgmma_desc(sa + s * 16 * 128, 8192, 1024, WGMMA_SWIZZLE_128B), db, 1);
        } else {
            uint32_t a[4];
            wgrad_tail_fragment(a, sa, 16 * s, valid);
            wgmma_fence();   // (the ISA's rule: registers written before an mma_async reads them are fenced)
            wgmma_bf16_rs<BN, 1>(d, a, db, 1);
        }
    }
    wgmma_commit();
}

// the k-tiles before a tile's end at which its old dW is prefetched into L2 (beta != 0): ~0.56 us each at the
// wgmma peak (2 128 BN 64 flops at 7.5 Tflop/s per SM, BN 256), ~4.5 us, several HBM latencies, so that the
// epilogue's loads hit L2 while the tile's 128 KiB stay there no longer than needed (132 SMs: 16.5 MB of 50)
#define WGRAD_PREFETCH_KTILES 8
// the old dW's rows of a tile into L2 ahead of the epilogue (beta != 0): a hint, as cp.async.bulk.prefetch.L2 (sm_90;
// bytes a multiple of 16 from a 16-byte aligned address); nothing under the emulator (no value changes)
__device__ __forceinline__ void wgrad_prefetch_l2(const float* p, int bytes) {
#if defined(SIMT_EMULATION)
    (void)p; (void)bytes;
#else
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"((uint64_t)__cvta_generic_to_global(p)), "r"(bytes) : "memory");
#endif
}

// the first float of the two rows that thread (warp, g, c) of warpgroup q writes: rows r and r + 8, columns n0 + 2 c ..
__device__ __forceinline__ float* wgrad_rows(const WgradTile& tile, int q, float* dw, int M, int N) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    return dw + ((size_t)tile.e * M + tile.m0 + 64 * q + 16 * warp + g) * N + tile.n0 + 2 * c;
}
// the quad (c 0..3) of rows r, r + 8 of the epilogue prefetches them: c % 2 the row, c / 2 its half of BN columns
template <int BN>
__device__ __forceinline__ void wgrad_prefetch_tile(const WgradTile& tile, int q, const float* dw, int M, int N) {
    const int c = threadIdx.x % 4;
    const float* row = wgrad_rows(tile, q, (float*)dw, M, N) - 2 * c + (size_t)8 * N * (c % 2);
    wgrad_prefetch_l2(row + BN / 2 * (c / 2), BN / 2 * 4);
}

// pair i of the thread's fragment (d[i], d[i + 1], i even): row r + 8 ((i/2) % 2), columns 8 (i/4) + 2 c, + 1
__device__ __forceinline__ float2* wgrad_pair(float* p, int i, int N) { return (float2*)(p + (size_t)8 * N * (i / 2 % 2) + 8 * (i / 4)); }

// warpgroup q's accumulators of `tile` into dW_e: D = acc + beta C (beta 0: C not read), as cuBLASLt's twin; an empty
// expert with beta != 0 is left as it is. d[i] = D[16 warp + g + 8 ((i/2)%2)][8 (i/4) + 2 t + i%2]. beta != 0: the old
// values in batches of LB pairs, every load of a batch before its stores (a load cannot pass an earlier store to what
// may be the same address: one at a time, each waited for, the loop ran at a quarter of HBM's rate). LB 8 at BN 256
// (16 registers over the 128 accumulators: ptxas's 168 hold it, 16 spill), 16 at BN 128
template <int BN, int PLANT>
__device__ __forceinline__ void wgrad_epilogue(const float (&d)[BN / 2], const WgradTile& tile, int q, float* dw, int M, int N, float beta) {
    if (tile.n == 0 && beta != 0.0f) return;
    float* p = wgrad_rows(tile, q, dw, M, N);
    if (beta == 0.0f) {
        for (int i = 0; i < BN / 2; i += 2) *wgrad_pair(p, i, N) = make_float2(d[i], d[i + 1]);
        return;
    }
    constexpr int LB = BN == 256 ? 8 : 16;
    static_assert(BN / 4 % LB == 0, "whole batches of pairs");
    for (int b = 0; b < BN / 2; b += 2 * LB) {
        float2 old[LB];
        for (int j = 0; j < LB; j++) old[j] = *wgrad_pair(p, PLANT == 4 ? 2 * j : b + 2 * j, N);
        for (int j = 0; j < LB; j++) {
            const int i = b + 2 * j;
            *wgrad_pair(p, i, N) = make_float2(d[i] + beta * old[j].x, d[i + 1] + beta * old[j].y);
        }
    }
}

// dW (E M, N) from X (rows, M) (map_x: boxes of 64 columns x 64 rows) and Y (rows, N) (map_y); M % 128 == 0, N % BN == 0
template <int BN, int STAGES, int PLANT>
__global__ void __launch_bounds__(MOE_TMA_THREADS, 1)
    experts_wgrad_grouped_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_y, float* dw,
                                 const int* offsets, int E, int M, int N, float beta) {
    constexpr int STAGE = wgrad_stage_bytes<BN>(), A_BYTES = WGRAD_BM * 128;
    static_assert(BN <= 256 && BN % 64 == 0, "wgmma's N is at most 256; B panels of 64 columns");
    __shared__ int s_off[MOE_GROUPED_MAX_E + 1], s_order[MOE_GROUPED_MAX_E];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    // the swizzle repeats every 1024 bytes of shared address: the stages start on such a boundary
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);   // the producer's arrive.expect_tx, then the copies' bytes
            mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
        }
        for (int e = 0; e <= E; e++) s_off[e] = offsets[e];
        wgrad_sort_experts(s_order, s_off, E);
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        if (threadIdx.x == 0) wgrad_produce<BN, STAGES, PLANT>(smem, full, empty, &map_x, &map_y, s_off, s_order, E, M, N);
        return;
    }
    const int q = threadIdx.x / 128 - 1, total = E * (M / WGRAD_BM) * (N / BN);
    int it = 0;
    for (int r = 0, j; (j = wgrad_position<PLANT>(r)) < total; r++) {
        WgradTile tile = wgrad_tile<BN>(s_off, s_order, M, N, j);
        // (the row count through a shuffle: ptxas then knows it warp-uniform, and the k-steps' branches on it do not
        // serialise the MMAs, as CUTLASS's canonical_warp_idx_sync does for the warp index)
        tile.n = __shfl_sync(0xFFFFFFFFu, tile.n, 0);
        const int ktiles = wgrad_ktiles(tile.n);
        float d[BN / 2];
        for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
        wgmma_fence_operand(d);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES, rest = tile.n - kt * MOE_GROUPED_BK,
                      valid = rest < MOE_GROUPED_BK ? rest : MOE_GROUPED_BK;
            if (beta != 0.0f && kt == (ktiles > WGRAD_PREFETCH_KTILES ? ktiles - WGRAD_PREFETCH_KTILES : 0))
                wgrad_prefetch_tile<BN>(tile, q, dw, M, N);
            if (PLANT != 3 || valid == MOE_GROUPED_BK) mbarrier_wait_parity(&full[s], (it / STAGES) & 1);
            wgrad_mma_ktile<BN, PLANT>(d, smem + s * STAGE + q * 8192, smem + s * STAGE + A_BYTES, valid);
            wgmma_wait<1>();   // the previous k-tile's MMAs completed: its stage goes back to the producer
            if (kt > 0) grouped_tma_release(&empty[(it - 1) % STAGES]);
        }
        wgmma_wait<0>();
        if (ktiles > 0) grouped_tma_release(&empty[(it - 1) % STAGES]);
        wgmma_fence_operand(d);
        wgrad_epilogue<BN, PLANT>(d, tile, q, dw, M, N, beta);
    }
}

// dW (E M, N) fp32 = beta dW + X_e^T Y_e per expert e, from X (rows, M), Y (rows, N) BF16; offsets_dev (E + 1) on the
// device, offsets[E] <= rows (the tensor maps end at `rows`: TMA's zeros past them). Tiles of 128 x BN of dW,
// STAGES stages of (128 + BN) x 128 bytes
template <int BN = 256, int STAGES = 4, int PLANT = 0>
static void experts_wgrad_grouped_gpu(float* dw, const floatX* X, const floatX* Y, const int* offsets_dev, int rows, int E, int M, int N,
                                      float beta, cudaStream_t stream = 0) {
    constexpr size_t smem = (size_t)STAGES * wgrad_stage_bytes<BN>() + 1024;
    constexpr size_t smem_all = smem + 4 * (2 * MOE_GROUPED_MAX_E + 1) + 16 * STAGES;   // (+ the static arrays)
    if (rows < 1 || E < 1 || E > MOE_GROUPED_MAX_E || M % WGRAD_BM != 0 || N % BN != 0 || !aligned16({dw, X, Y}) ||
        smem_all > MOE_SMEM_LIMIT) {
        fprintf(stderr, "experts grouped weight gradient: rows %d (>= 1), E %d (1..%d), M %d (of %d), N %d (of %d), 16-byte aligned "
                "pointers, shared memory %zu bytes for %d stages (at most %d)\n", rows, E, MOE_GROUPED_MAX_E, M, WGRAD_BM, N, BN,
                smem_all, STAGES, MOE_SMEM_LIMIT);
        exit(EXIT_FAILURE);
    }
    alignas(64) CUtensorMap mx, my;
    tma_map_2d_bf16(&mx, X, M, rows, M, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    tma_map_2d_bf16(&my, Y, N, rows, N, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    // (the local's name is the launch's in work logs and traces)
    auto experts_wgrad_grouped = experts_wgrad_grouped_kernel<BN, STAGES, PLANT>;
    cudaCheck(cudaFuncSetAttribute(experts_wgrad_grouped, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(experts_wgrad_grouped, grouped_blocks(), MOE_TMA_THREADS, smem, stream, mx, my, dw, offsets_dev, E, M, N, beta);
}

// the experts' three weight gradients as experts_backward_gpu computes them (dw1, dv1, dw2 (E F, d); wbeta 0: overwritten,
// empty experts zeroed), from dg, du, a (rows, F), xe, dye (rows, d)
static inline void experts_wgrad_grouped_all_gpu(float* dw1, float* dv1, float* dw2, const floatX* dg, const floatX* du, const floatX* a,
                                                 const floatX* xe, const floatX* dye, const int* offsets_dev, int rows, int E, int d,
                                                 int F, float wbeta, cudaStream_t stream = 0) {
    // tiles of 128 x 256 of dW where d allows, else 128 x 128
    auto launch = d % 256 == 0 ? experts_wgrad_grouped_gpu<256> : experts_wgrad_grouped_gpu<128>;
    launch(dw1, dg, xe, offsets_dev, rows, E, F, d, wbeta, stream);
    launch(dv1, du, xe, offsets_dev, rows, E, F, d, wbeta, stream);
    launch(dw2, a, dye, offsets_dev, rows, E, F, d, wbeta, stream);
}
