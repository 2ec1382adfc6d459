/*
 * moe_grouped_fp8.cuh — the experts' up-projection on FP8 block-scaled operands (issue 25, "FP8 that pays"), a dev
 * kernel (not in the product yet): DeepGEMM's scheme on model/moe_grouped_tma.cuh's v4 skeleton (the same persistent
 * schedule grouped_schedule / grouped_tile, TMA ring with full / empty mbarriers, 1 producer thread + 2 consumer
 * warpgroups, the same epilogue with SwiGLU fused):
 *   experts_up_grouped_fp8_gpu    g = xe_e w1_e^T, u = xe_e v1_e^T, a = silu(g) u   (rows, F) BF16, per expert e
 *   experts_down_grouped_fp8_gpu  ye_e = a_e w2_e = a_e (w2t_e)^T                    (rows, d) BF16
 * Operands (E4M3 codes; the scales are the dequantisation factors, as --fp8 block stores them):
 *   xe (rows, d) with sx (d / 128, rows): row r's factor for k block kb at sx[kb rows + r] (cuBLAS's VEC128_32F
 *       layout, outer = rows)
 *   w1, v1 (E F, d) with s1, s2 (E, F / 128, KB4), KB4 = d / 128 rounded up to 4: expert e's 128x128 block
 *       (nb, kb) at [(e F / 128 + nb) KB4 + kb] (cuBLAS's BLK128x128_32F per expert, stacked)
 *   down: a (rows, F) with sa (F / 128, rows); w2t (E d, F) = each w2_e (F, d) transposed (FP8 wgmma reads K-major
 *       operands only: --fp8 block's quantiser writes such transposed copies) with s3 (E, d / 128, round_up(F / 128, 4))
 * Per k-tile of 128 (one 128-byte swizzle row of FP8 = one scale block): the producer's boxes (A 128 rows x 128 bytes
 * of xe; UP: B 64 rows of w1_e then the same 64 of v1_e, DOWN: 128 rows of w2t_e: wgmma N 128 either way), the consumers' 4 wgmma m64n128k32 k-steps into a
 * temporary fp32 accumulator (scale-d 0 on the first), wait_group 0, the stage released, then the promotion
 *   acc += tmp * (sx[row] * s1|s2[block])
 * in registers, per 128 of k: the partial sums never stay in the tensor core's accumulator (about 14 bits on a GPU)
 * for more than 4 k-steps. The order is cuBLASLt's twin's for block-scaled GEMMs (each 128-chunk summed from 0 in k
 * order, then added times the product of the two factors, chunk after chunk): under the emulator the results are
 * its bits (test/test_moe_fp8_grouped.cpp). N 128 (UP: g's and u's 64 columns; tmp and acc 64 floats each): a thread
 * holds 128 accumulators within the 168 registers of a 384-thread block (ptxas: 164, no spills; no setmaxnreg yet).
 * Stage 32 KiB, 6 stages, then v4's epilogue staging (32 KiB). Each k-tile's MMAs are waited for before the
 * promotion (wait_group 0, as DeepGEMM): the other consumer warpgroup's MMAs and the producer's copies overlap it.
 * Timed on H100s in sessions 39 and 45 (2026-11-27, 2026-11-28: dev/bench/results_gpu.md).
 * PLANT (tests only): 1 the activation scale of the next k block (k blocks wrapped), 2 the promotion skipped for
 * k block 1, 3 expect_tx 16 bytes above the stage's (the phase never completes: a reported deadlock), 4 the stage
 * released before its MMAs completed (the refill's copy over a stage being read: a race).
 */
#pragma once
#include "moe_grouped_tma.cuh"

#define MOE_FP8_BK 128   // k per k-tile: 128 E4M3 codes = one swizzle row = one scale block
#define MOE_FP8_BN 64    // columns of g and of u per up-projection tile (the down-projection's: 128)
#define MOE_FP8_STAGES 6
#define MOE_FP8_STAGE_BYTES ((MOE_TMA_BM + 2 * MOE_FP8_BN) * 128)

// the tensor map of a row-major (rows, cols) byte matrix (E4M3 codes), boxes of box_rows x box_cols bytes
inline CUresult tma_encode_2d_u8(CUtensorMap* map, const void* base, uint64_t cols, uint64_t rows, uint32_t box_cols, uint32_t box_rows) {
    const cuuint64_t dim[2] = {cols, rows}, stride[1] = {cols};
    const cuuint32_t box[2] = {box_cols, box_rows}, estride[2] = {1, 1};
    return tma_encode_tiled()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void*)base, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// the producer (one thread): every (tile, k-tile) of the block into the ring, each stage once its consumers released it
template <bool UP, int PLANT>
__device__ __forceinline__ void grouped_fp8_produce(char* smem, uint64_t* full, uint64_t* empty, const CUtensorMap* ma, const CUtensorMap* m1,
                                                    const CUtensorMap* m2, const int* s_mt, const int* s_off, int E, int K, int F) {
    constexpr int BN = UP ? MOE_FP8_BN : 2 * MOE_FP8_BN;
    const int ntiles_n = F / BN, ktiles = K / MOE_FP8_BK, total = s_mt[E] * ntiles_n;
    int it = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const GroupedTile tile = grouped_tile<MOE_TMA_BM, BN>(s_mt, s_off, E, ntiles_n, t);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % MOE_FP8_STAGES, k0 = kt * MOE_FP8_BK;
            mbarrier_wait_parity(&empty[s], ((it / MOE_FP8_STAGES) & 1) ^ 1);
            char* st = smem + s * MOE_FP8_STAGE_BYTES;
            mbarrier_arrive_expect_tx(&full[s], MOE_FP8_STAGE_BYTES + (PLANT == 3 ? 16 : 0));
            tma_load_2d(st, ma, k0, tile.m0, &full[s]);
            tma_load_2d(st + MOE_TMA_BM * 128, m1, k0, tile.e * F + tile.n0, &full[s]);
            if (UP) tma_load_2d(st + (MOE_TMA_BM + MOE_FP8_BN) * 128, m2, k0, tile.e * F + tile.n0, &full[s]);
        }
    }
}

// the promotion's acc + tmp f, the product rounded before the add (not one FMA): cuBLASLt's twin's rounding (its
// scalar loop is not contracted), so emulated results are its bits; on a GPU one FP32 instruction more per accumulator
// and k-tile. (g++ contracts by default: the attribute keeps the two roundings under the emulator)
#if defined(SIMT_EMULATION)
__attribute__((optimize("fp-contract=off"))) inline float fp8_promote(float acc, float tmp, float f) { return acc + tmp * f; }
#else
__device__ __forceinline__ float fp8_promote(float acc, float tmp, float f) { return __fadd_rn(acc, __fmul_rn(tmp, f)); }
#endif

// warpgroup q's 4 FP8 k-steps of 32 over the stage into tmp (overwritten: scale-d 0 on the first), one commit group
__device__ __forceinline__ void grouped_fp8_mma_ktile(float (&tmp)[MOE_FP8_BN], const char* sa, const char* sb, int q) {
    wgmma_fence();
    for (int s = 0; s < MOE_FP8_BK / 32; s++) {
        uint64_t da = wgmma_desc(sa + q * 64 * 128 + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B);
        wgmma_fp8_ss<2 * MOE_FP8_BN, WGMMA_E4M3, WGMMA_E4M3>(tmp, da, wgmma_desc(sb + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B), s > 0);
    }
    wgmma_commit();
}

// UP: out0 g, out1 u (both may be null), out2 a (rows, F) from xe (map_a; factors sx), w1, v1 (map_1, map_2; factors
// s1, s2). DOWN: out0 ye (rows, F = d) from a (map_a, factors sx), w2^T (map_1, factors s1; s2 = s1). rows: A's rows
// (sx's outer size). K % 128 == 0, F % 128 == 0. (F: the output's columns)
template <bool UP, int PLANT>
__global__ void __launch_bounds__(MOE_TMA_THREADS, 1)
    experts_grouped_fp8_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_1,
                                  const __grid_constant__ CUtensorMap map_2, floatX* out0, floatX* out1, floatX* out2, const float* sx,
                                  const float* s1, const float* s2, const int* offsets, int rows, int E, int K, int F) {
    constexpr int STAGES = MOE_FP8_STAGES, BN = UP ? MOE_FP8_BN : 2 * MOE_FP8_BN;   // wgmma N 128 either way
    __shared__ int s_mt[MOE_GROUPED_MAX_E + 1], s_off[MOE_GROUPED_MAX_E + 1];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 8);
        }
    grouped_schedule<MOE_TMA_BM, 0>(s_mt, s_off, offsets, E);
    if (threadIdx.x < 128) {
        if (threadIdx.x == 0) grouped_fp8_produce<UP, PLANT>(smem, full, empty, &map_a, &map_1, &map_2, s_mt, s_off, E, K, F);
        return;
    }
    const int q = threadIdx.x / 128 - 1, ntiles_n = F / BN, ktiles = K / MOE_FP8_BK, total = s_mt[E] * ntiles_n;
    const int KB4 = (ktiles + 3) / 4 * 4, warp = threadIdx.x % 128 / 32, g8 = threadIdx.x % 32 / 4;
    int it = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const GroupedTile tile = grouped_tile<MOE_TMA_BM, BN>(s_mt, s_off, E, ntiles_n, t);
        // the thread's two rows (accumulators with (i / 2) % 2 == 0, == 1); rows past xe's end (TMA's zeros) read row 0's
        // factors: their products are 0 and never stored
        int r0 = tile.m0 + 64 * q + 16 * warp + g8, r1 = r0 + 8;
        r0 = r0 < rows ? r0 : 0;
        r1 = r1 < rows ? r1 : 0;
        const size_t wb = ((size_t)tile.e * F + tile.n0) / 128 * KB4;   // the weights' block row of the tile's columns
        float acc[MOE_FP8_BN], tmp[MOE_FP8_BN];
        for (int i = 0; i < MOE_FP8_BN; i++) acc[i] = 0.0f;
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            mbarrier_wait_parity(&full[s], (it / STAGES) & 1);
            wgmma_fence_operand(tmp);
            grouped_fp8_mma_ktile(tmp, smem + s * MOE_FP8_STAGE_BYTES, smem + s * MOE_FP8_STAGE_BYTES + MOE_TMA_BM * 128, q);
            // the factors' loads overlap the MMAs (the accumulators untouched until the wait)
            const int kx = PLANT == 1 ? (kt + 1) % ktiles : kt;
            const float x0 = sx[(size_t)kx * rows + r0], x1 = sx[(size_t)kx * rows + r1], b1 = s1[wb + kt], b2 = s2[wb + kt];
            if (PLANT == 4) grouped_tma_release(&empty[s]);
            wgmma_wait<0>();
            wgmma_fence_operand(tmp);
            if (PLANT != 4) grouped_tma_release(&empty[s]);
            if (PLANT == 2 && kt == 1) continue;
            const float f[4] = {x0 * b1, x1 * b1, x0 * b2, x1 * b2};   // (row half, g / u; DOWN: b2 = b1)
            for (int i = 0; i < MOE_FP8_BN; i++) acc[i] = fp8_promote(acc[i], tmp[i], f[(i / 2) % 2 + 2 * (i >= MOE_FP8_BN / 2)]);
        }
        char* epi = smem + STAGES * MOE_FP8_STAGE_BYTES + (threadIdx.x / 32 - 4) * 2 * MOE_STAGE_BUF;   // the warp's staging buffers
        grouped_epilogue_staged<UP, 0>(acc, tile, q, out0, out1, out2, F, epi);
    }
}

// the tensor maps (host-side encodings) and the launch: A (rows, K), B1 / B2 (E Nout, K) K-major, E4M3 codes
template <bool UP, int PLANT>
static void experts_grouped_fp8_launch(floatX* out0, floatX* out1, floatX* out2, const uint8_t* A, const float* sx, const uint8_t* B1,
                                       const float* s1, const uint8_t* B2, const float* s2, const int* offsets_dev, int rows, int E, int K,
                                       int Nout, cudaStream_t stream) {
    constexpr size_t smem = (size_t)MOE_FP8_STAGES * MOE_FP8_STAGE_BYTES + MOE_EPI_SMEM + 1024;   // (the epilogue's staging after the stages)
    constexpr size_t smem_all = smem + 8 * (MOE_GROUPED_MAX_E + 1) + 16 * MOE_FP8_STAGES;
    static_assert(smem_all <= MOE_SMEM_LIMIT, "the stages fit Hopper's 227 KiB");
    if (rows < 1 || E < 1 || E > MOE_GROUPED_MAX_E || K < MOE_FP8_BK || K % MOE_FP8_BK != 0 || Nout % 128 != 0 ||
        !aligned16({out0, out1, out2, A, B1, B2})) {
        fprintf(stderr, "experts grouped FP8 GEMM: rows %d (>= 1), E %d (1..%d), K %d (a positive multiple of %d), N %d (of 128), "
                "16-byte aligned pointers\n", rows, E, MOE_GROUPED_MAX_E, K, MOE_FP8_BK, Nout);
        exit(EXIT_FAILURE);
    }
    alignas(64) CUtensorMap ma, m1, m2;
    cuCheck(tma_encode_2d_u8(&ma, A, K, rows, MOE_FP8_BK, MOE_TMA_BM));
    cuCheck(tma_encode_2d_u8(&m1, B1, K, (uint64_t)E * Nout, MOE_FP8_BK, UP ? MOE_FP8_BN : 2 * MOE_FP8_BN));
    m2 = m1;
    if (UP) cuCheck(tma_encode_2d_u8(&m2, B2, K, (uint64_t)E * Nout, MOE_FP8_BK, MOE_FP8_BN));
    // (the locals' names are the launches' in work logs and traces)
    auto experts_up_grouped_fp8 = experts_grouped_fp8_kernel<UP, PLANT>, experts_down_grouped_fp8 = experts_up_grouped_fp8;
    cudaCheck(cudaFuncSetAttribute(experts_up_grouped_fp8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (UP) LAUNCH(experts_up_grouped_fp8, grouped_blocks(), MOE_TMA_THREADS, smem, stream, ma, m1, m2, out0, out1, out2, sx, s1, s2, offsets_dev,
                   rows, E, K, Nout);
    else LAUNCH(experts_down_grouped_fp8, grouped_blocks(), MOE_TMA_THREADS, smem, stream, ma, m1, m2, out0, out1, out2, sx, s1, s2, offsets_dev,
                rows, E, K, Nout);
}

// g, u (rows, F; both null: only a), a (rows, F) from xe (rows, d) E4M3 + sx, w1, v1 (E F, d) E4M3 + s1, s2 (layouts
// above); offsets_dev (E + 1) on the device, offsets[E] <= rows. Tiles of 128 rows x 64 columns of g and of u
template <int PLANT = 0>
static void experts_up_grouped_fp8_gpu(floatX* g, floatX* u, floatX* a, const uint8_t* xe, const float* sx, const uint8_t* w1, const float* s1,
                                       const uint8_t* v1, const float* s2, const int* offsets_dev, int rows, int E, int d, int F,
                                       cudaStream_t stream = 0) {
    experts_grouped_fp8_launch<true, PLANT>(g, u, a, xe, sx, w1, s1, v1, s2, offsets_dev, rows, E, d, F, stream);
}
// ye (rows, d) from a (rows, F) E4M3 + sa (F / 128, rows), w2t (E d, F) E4M3 (w2_e transposed: FP8 wgmma is K-major only)
// + s3 (E, d / 128, round_up(F / 128, 4)); tiles of 128 rows x 128 columns
template <int PLANT = 0>
static void experts_down_grouped_fp8_gpu(floatX* ye, const uint8_t* a, const float* sa, const uint8_t* w2t, const float* s3, const int* offsets_dev,
                                         int rows, int E, int d, int F, cudaStream_t stream = 0) {
    experts_grouped_fp8_launch<false, PLANT>(ye, nullptr, nullptr, a, sa, w2t, s3, w2t, s3, offsets_dev, rows, E, F, d, stream);
}
