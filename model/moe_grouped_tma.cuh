/*
 * moe_grouped_tma.cuh — version 4 of the experts' grouped GEMMs (issue 25): model/moe_grouped.cuh's two projections
 * (the same persistent tile schedule, grouped_schedule / grouped_tile; the same epilogue, SwiGLU fused into the
 * up-projection's) with the operands fed by the tensor memory accelerator to warp-specialised warpgroups
 * (model/tma.cuh), as CUTLASS's "TMA warp-specialized" kernels, FlashAttention-3 and DeepGEMM do:
 *   experts_up_grouped_tma_gpu    g = xe_e w1_e^T, u = xe_e v1_e^T, a = silu(g) u   (rows, F), per expert e
 *   experts_down_grouped_tma_gpu  ye_e = a_e w2_e                                    (rows, d)
 * Block: 384 threads = a producer warpgroup (one thread issues every copy; its other threads exit) + 2 consumer
 * warpgroups sharing each stage (cooperative: 128 rows of a tile, 64 each). The producer walks the block's stream of
 * (tile, k-tile) pairs: waits the stage's "empty" mbarrier, arms its "full" one with the stage's bytes
 * (arrive.expect_tx) and issues the stage's TMA boxes (128B swizzle: the K-major wgmma layout, SBO 1024):
 *   A   one box of 64 k x 128 rows of xe (UP) / a (DOWN) at (k0, m0): rows past the tensor's end come back zero
 *       (TMA's out-of-bounds fill); rows past the expert's end are the next expert's, computed and not stored
 *   UP  B = 128 rows of w1_e then the same 128 rows of v1_e (boxes of 64 k x 128 rows; wgmma N 256)
 *   DOWN B = w2_e (F, d) row-major, MN-major: 4 boxes of 64 columns x 64 k-rows, each exactly grouped_load_b_down's
 *       128B-swizzled panel (row k's chunk c at c ^ k % 8, panels 8192 bytes apart = LBO, SBO 1024; transpose flag 1)
 * The consumers wait on "full", issue the k-tile's 4 wgmma k-steps, commit, keep one k-tile's MMAs in flight
 * (wait_group 1) and then release the PREVIOUS k-tile's stage: lane 0 of each consumer warp arrives on its "empty"
 * barrier (count 8) after the warp's wait_group, so a stage is refilled only once every MMA reading it completed.
 * No __syncthreads() after the schedule. Stage = 16 KiB of A + 32 KiB of B = 48 KiB, 4 stages (192 KiB + 1 KiB of
 * alignment; 5 would pass the 227 KiB limit). The MMAs and their k order are v3's: under the emulator the results
 * are bit for bit moe_grouped.cuh's (and today's path's). Untimed on a GPU until the next lease.
 * PLANT (tests only): 1, 2 as moe_grouped.cuh's (the scheduler's floor, the store mask one row too far); 4 the
 * producer skips the "empty" wait (a stage overwritten while read); 5 expect_tx 16 bytes above the stage's
 * (the phase never completes); 6 a consumer releases the stage it has just issued MMAs on, before they completed.
 */
#pragma once
#include "moe_grouped.cuh"
#include "tma.cuh"

#define MOE_TMA_BM 128        // rows per tile: 64 per consumer warpgroup
#define MOE_TMA_THREADS 384   // the producer warpgroup and 2 consumer warpgroups
#define MOE_SMEM_LIMIT (227 * 1024)

// the stage's bytes: A (128 rows of 128 bytes) then B (NB rows / k-rows of 128 bytes)
template <bool UP, int BN> __host__ __device__ constexpr int grouped_tma_stage_bytes() { return (MOE_TMA_BM + (UP ? 2 * BN : BN)) * 128; }
template <bool UP, int BN, int STAGES> constexpr size_t grouped_tma_smem() { return (size_t)STAGES * grouped_tma_stage_bytes<UP, BN>() + 1024; }

// the producer (one thread): every (tile, k-tile) of the block into the ring, each stage once its consumers released it
template <bool UP, int BN, int STAGES, int PLANT>
__device__ __forceinline__ void grouped_tma_produce(char* smem, uint64_t* full, uint64_t* empty, const CUtensorMap* ma, const CUtensorMap* mb0,
                                                    const CUtensorMap* mb1, const int* s_mt, const int* s_off, int E, int K, int Nout) {
    constexpr int STAGE = grouped_tma_stage_bytes<UP, BN>(), A_BYTES = MOE_TMA_BM * 128;
    const int ntiles_n = Nout / BN, ktiles = K / MOE_GROUPED_BK, total = s_mt[E] * ntiles_n;
    int it = 0;   // the block's k-tile count: stage it % STAGES, its use it / STAGES
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const GroupedTile tile = grouped_tile<MOE_TMA_BM, BN>(s_mt, s_off, E, ntiles_n, t);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES, k0 = kt * MOE_GROUPED_BK;
            // the stage's previous use released by both consumers (its first use: parity 1 passes at once)
            if (PLANT != 4) mbarrier_wait_parity(&empty[s], ((it / STAGES) & 1) ^ 1);
            char* st = smem + s * STAGE;
            mbarrier_arrive_expect_tx(&full[s], STAGE + (PLANT == 5 ? 16 : 0));
            tma_load_2d(st, ma, k0, tile.m0, &full[s]);
            if constexpr (UP) {   // w1, v1 seen as (E F, d): expert e's rows n0 .. at e F + n0
                tma_load_2d(st + A_BYTES, mb0, k0, tile.e * Nout + tile.n0, &full[s]);
                tma_load_2d(st + A_BYTES + BN * 128, mb1, k0, tile.e * Nout + tile.n0, &full[s]);
            } else {   // w2 seen as (E F, d): k-rows e F + k0 .., 64 columns per panel
                for (int p = 0; p < BN / 64; p++) tma_load_2d(st + A_BYTES + p * 8192, mb0, tile.n0 + 64 * p, tile.e * K + k0, &full[s]);
            }
        }
    }
}

// consumer warpgroup q's stage release: one arrival per warp (the empty barriers' count is 8), after the warp's
// wait_group completed the MMAs that read the stage
__device__ __forceinline__ void grouped_tma_release(uint64_t* empty) {
    if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
}

// UP: out0 g, out1 u (both may be null), out2 a (rows, Nout = F) from A = xe (rows, K = d) (map_a), w1, v1 (map_b0,
// map_b1). DOWN: out0 ye (rows, Nout = d) from A = a (rows, K = F) (map_a), w2 (map_b0). Tiles of 128 rows x BN
// columns (UP: of g and of u, wgmma N 2 BN); K % 64 == 0, Nout % BN == 0
template <bool UP, int BN, int STAGES, int PLANT>
__global__ void __launch_bounds__(MOE_TMA_THREADS, 1)
    experts_grouped_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b0,
                               const __grid_constant__ CUtensorMap map_b1, floatX* out0, floatX* out1, floatX* out2, const int* offsets, int E,
                               int K, int Nout) {
    constexpr int NB = UP ? 2 * BN : BN, STAGE = grouped_tma_stage_bytes<UP, BN>(), A_BYTES = MOE_TMA_BM * 128;
    static_assert(NB <= 256 && BN % 64 == 0, "wgmma's N is at most 256; B panels of 64 columns");
    __shared__ int s_mt[MOE_GROUPED_MAX_E + 1], s_off[MOE_GROUPED_MAX_E + 1];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    // the swizzle repeats every 1024 bytes of shared address: the stages start on such a boundary
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);   // the producer's arrive.expect_tx, then the copies' bytes
            mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
        }
    grouped_schedule<MOE_TMA_BM, PLANT>(s_mt, s_off, offsets, E);   // (its __syncthreads() publishes the barriers too)
    if (threadIdx.x < 128) {
        if (threadIdx.x == 0) grouped_tma_produce<UP, BN, STAGES, PLANT>(smem, full, empty, &map_a, &map_b0, &map_b1, s_mt, s_off, E, K, Nout);
        return;
    }
    const int q = threadIdx.x / 128 - 1, ntiles_n = Nout / BN, ktiles = K / MOE_GROUPED_BK, total = s_mt[E] * ntiles_n;
    int it = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const GroupedTile tile = grouped_tile<MOE_TMA_BM, BN>(s_mt, s_off, E, ntiles_n, t);
        float d[NB / 2];
        for (int i = 0; i < NB / 2; i++) d[i] = 0.0f;
        wgmma_fence_operand(d);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            mbarrier_wait_parity(&full[s], (it / STAGES) & 1);
            grouped_mma_ktile<UP, NB>(d, smem + s * STAGE, smem + s * STAGE + A_BYTES, q);
            if (PLANT == 6) grouped_tma_release(&empty[s]);
            wgmma_wait<1>();   // the previous k-tile's MMAs completed: its stage goes back to the producer
            if (kt > 0 && PLANT != 6) grouped_tma_release(&empty[(it - 1) % STAGES]);
        }
        wgmma_wait<0>();
        if (PLANT != 6) grouped_tma_release(&empty[(it - 1) % STAGES]);
        wgmma_fence_operand(d);
        grouped_epilogue<UP, BN, PLANT>(d, tile, q, out0, out1, out2, Nout);
    }
}

// the tensor maps (built per call: a host-side encoding, no device work) and the launch. rows: the rows of A and of
// the outputs as allocated (offsets[E] <= rows: the rows past it are read, never stored; past rows TMA reads zeros)
template <bool UP, int BN, int STAGES, int PLANT>
static void experts_grouped_tma_launch(floatX* out0, floatX* out1, floatX* out2, const floatX* A, const floatX* B0, const floatX* B1,
                                       const int* offsets_dev, int rows, int E, int K, int Nout, cudaStream_t stream) {
    constexpr size_t smem = grouped_tma_smem<UP, BN, STAGES>();
    // (the static arrays: the schedule's 2 (E + 1) ints and the 2 STAGES barriers)
    constexpr size_t smem_all = smem + 8 * (MOE_GROUPED_MAX_E + 1) + 16 * STAGES;
    if (rows < 1 || E < 1 || E > MOE_GROUPED_MAX_E || K < MOE_GROUPED_BK || K % MOE_GROUPED_BK != 0 || Nout % BN != 0 ||
        !aligned16({out0, out1, out2, A, B0, B1}) || smem_all > MOE_SMEM_LIMIT) {
        fprintf(stderr, "experts grouped GEMM (TMA): rows %d (>= 1), E %d (1..%d), K %d (a positive multiple of %d), N %d (of %d), "
                "16-byte aligned pointers, shared memory %zu bytes for %d stages (at most %d)\n", rows, E, MOE_GROUPED_MAX_E, K,
                MOE_GROUPED_BK, Nout, BN, smem_all, STAGES, MOE_SMEM_LIMIT);
        exit(EXIT_FAILURE);
    }
    alignas(64) CUtensorMap ma, mb0, mb1;
    tma_map_2d_bf16(&ma, A, K, rows, K, 64, MOE_TMA_BM, CU_TENSOR_MAP_SWIZZLE_128B);
    if (UP) {   // w1, v1 (E F, d): boxes of BN rows
        tma_map_2d_bf16(&mb0, B0, K, (uint64_t)E * Nout, K, 64, BN, CU_TENSOR_MAP_SWIZZLE_128B);
        tma_map_2d_bf16(&mb1, B1, K, (uint64_t)E * Nout, K, 64, BN, CU_TENSOR_MAP_SWIZZLE_128B);
    } else {    // w2 (E F, d) = (E K, Nout): boxes of 64 columns x 64 k-rows
        tma_map_2d_bf16(&mb0, B0, Nout, (uint64_t)E * K, Nout, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
        mb1 = mb0;
    }
    // (the locals' names are the launches' in work logs and traces)
    auto experts_up_grouped_tma = experts_grouped_tma_kernel<UP, BN, STAGES, PLANT>, experts_down_grouped_tma = experts_up_grouped_tma;
    cudaCheck(cudaFuncSetAttribute(experts_up_grouped_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (UP) LAUNCH(experts_up_grouped_tma, grouped_blocks(), MOE_TMA_THREADS, smem, stream, ma, mb0, mb1, out0, out1, out2, offsets_dev, E, K, Nout);
    else LAUNCH(experts_down_grouped_tma, grouped_blocks(), MOE_TMA_THREADS, smem, stream, ma, mb0, mb1, out0, out1, out2, offsets_dev, E, K, Nout);
}

// g, u (rows, F; both null: only a), a (rows, F) from xe (rows, d), w1, v1 (E F, d); offsets_dev (E + 1) on the
// device, offsets[E] <= rows. 128 rows x 128 columns of g and of u per tile (wgmma N 256), 4 stages of 48 KiB
template <int BN = 128, int STAGES = 4, int PLANT = 0>
static void experts_up_grouped_tma_gpu(floatX* g, floatX* u, floatX* a, const floatX* xe, const floatX* w1, const floatX* v1,
                                       const int* offsets_dev, int rows, int E, int d, int F, cudaStream_t stream = 0) {
    experts_grouped_tma_launch<true, BN, STAGES, PLANT>(g, u, a, xe, w1, v1, offsets_dev, rows, E, d, F, stream);
}
// ye (rows, d) from a (rows, F), w2 (E F, d); 128 rows x 256 columns per tile, 4 stages of 48 KiB
template <int BN = 256, int STAGES = 4, int PLANT = 0>
static void experts_down_grouped_tma_gpu(floatX* ye, const floatX* a, const floatX* w2, const int* offsets_dev, int rows, int E, int d, int F,
                                         cudaStream_t stream = 0) {
    experts_grouped_tma_launch<false, BN, STAGES, PLANT>(ye, nullptr, nullptr, a, w2, nullptr, offsets_dev, rows, E, F, d, stream);
}
