/*
 * moe_grouped_tma.cuh — version 4 of the experts' grouped GEMMs (issue 25): model/moe_grouped.cuh's two projections
 * (the same persistent tile schedule, grouped_schedule / grouped_tile; the same epilogue, SwiGLU fused into the
 * up-projection's) with the operands fed by the tensor memory accelerator to warp-specialised warpgroups
 * (model/tma.cuh), as CUTLASS's "TMA warp-specialized" kernels, FlashAttention-3 and DeepGEMM do:
 *   experts_up_grouped_tma_gpu    g = xe_e w1_e^T, u = xe_e v1_e^T, a = silu(g) u   (rows, F), per expert e
 *   experts_down_grouped_tma_gpu  ye_e = a_e w2_e                                    (rows, d)
 * and the backward's data gradients (issue 25's dgrad; the weight gradients: moe_grouped_wgrad.cuh):
 *   experts_down_backward_grouped_tma_gpu  da = dye_e w2_e^T, then dg, du = SwiGLU's backward (da, g, u) in the
 *       epilogue (g, u TMA-loaded during the tile's main loop; da not stored)        (rows, F)
 *   experts_up_backward_grouped_tma_gpu    dxe_e = dg_e w1_e + du_e v1_e             (rows, d)
 * The step runs them under --moe-gemm grouped (model/moe_experts_step.cuh).
 * Block: 384 threads = a producer warpgroup (one thread issues every copy; its other threads exit) + 2 consumer
 * warpgroups sharing each stage (cooperative: 128 rows of a tile, 64 each). The producer walks the block's stream of
 * (tile, k-tile) pairs: waits the stage's "empty" mbarrier, arms its "full" one with the stage's bytes
 * (arrive.expect_tx) and issues the stage's TMA boxes (128B swizzle: the K-major wgmma layout, SBO 1024):
 *   A   one box of 64 k x 128 rows of xe (UP) / a (DOWN) at (k0, m0): rows past the tensor's end come back zero
 *       (TMA's out-of-bounds fill); rows past the expert's end are the next expert's, computed and not stored
 *   UP  B = 128 rows of w1_e then the same 128 rows of v1_e (boxes of 64 k x 128 rows; wgmma N 256)
 *   DOWN B = w2_e (F, d) row-major, MN-major: 4 boxes of 64 columns x 64 k-rows, each exactly grouped_load_b_down's
 *       128B-swizzled panel (row k's chunk c at c ^ k % 8, panels 8192 bytes apart = LBO, SBO 1024; transpose flag 1)
 *   DA  (down-backward) A = dye, B = w2_e's rows n0.. K-major (as UP's w1_e; wgmma N BN)
 *   DX  (up-backward) A = dg then du (two maps), B = w1_e then v1_e MN-major (as DOWN's w2_e): K runs over F twice.
 *       Today's path is two GEMMs, the second adding its product to the first's BF16 output (beta 1): the consumers
 *       wait the first sum's MMAs, round it to BF16 (kept packed), and sum the second from 0; the epilogue stores
 *       BF16(second + first), the twin's D = acc + beta C. DA rounds da to BF16 (the GEMM's output) before
 *       moe.cuh's swiglu_grads, as swiglu_backward_kernel reads it. Both: today's bits under the emulator.
 * The consumers wait on "full", issue the k-tile's 4 wgmma k-steps, commit, keep one k-tile's MMAs in flight
 * (wait_group 1) and then release the PREVIOUS k-tile's stage: lane 0 of each consumer warp arrives on its "empty"
 * barrier (count 8) after the warp's wait_group, so a stage is refilled only once every MMA reading it completed.
 * No __syncthreads() after the schedule. Stage = 16 KiB of A + 32 KiB of B = 48 KiB, 4 stages (192 KiB + 1 KiB of
 * alignment + the epilogue's 32 KiB = 225 KiB of the 227 KiB limit); DA and DX: 128 x 128 tiles (DX also holds the
 * first sum: 32 registers), 6 stages of 32 KiB (DA 5: the tile's g and u take 64 KiB). Epilogues (moe_grouped.cuh's
 * grouped_stage_*): each consumer warp stages its 16 rows x 64 columns of an output through one of its two 2 KiB
 * swizzled buffers and writes them with 16-byte stores, whole 128-byte row segments; DX stores straight from its
 * fragments (staged, it spilled at 168 registers).
 * DA's g and u: the producer loads the tile's 128 x BN of each with TMA (boxes of 64 columns x 128 rows, 128B swizzle:
 * a warp's 16 rows of a box are laid out exactly as a staging buffer) into the epilogue's region, arming "epi_full",
 * once it has filled the ring with the tile's first k-tiles and the consumers have released the previous tile's g and
 * u ("epi_free", count 8: one arrival per consumer warp after its stores read the region, behind fence.proxy.async).
 * So the loads run during the main loop, and the epilogue waits for no global load: it overwrites its g, u fragments
 * with dg, du in place and stores them (Session 39's H100 run had A at 167 TFLOP/s, its epilogue's loads waiting
 * behind its stores; this version ran at 277 on session 45's H100.) The MMAs and their k order are v3's: under the emulator
 * the results are bit for bit moe_grouped.cuh's (and today's path's). Timed on an H100 before the staging (up
 * 1.469 ms with g, u, a stored against 0.853 with a only; A 1.440 ms at dbrx-1b) and after it, session 45 (up 539
 * TFLOP/s with g, u, a stored, 578 a only; A 277 against 167: dev/bench/results_gpu.md).
 * PLANT (tests only): 1, 2 as moe_grouped.cuh's (the scheduler's floor, the store mask one row too far); 4 the
 * producer skips the "empty" wait (a stage overwritten while read); 5 expect_tx 16 bytes above the stage's
 * (the phase never completes); 6 a consumer releases the stage it has just issued MMAs on, before they completed;
 * 7 DX's two products summed in one fp32 sum (not today's rounding points); 8 DA's SwiGLU backward from the unrounded da;
 * 9 the epilogue staging's __syncwarp between the fragment writes and the other lanes' reads (the stores) dropped;
 * 10 DA's producer skips the "epi_free" wait (the next tile's g, u loaded over the region the epilogue still reads);
 * 11 DA's consumer warps release the region before their epilogue reads it.
 */
#pragma once
#include "moe_grouped.cuh"
#include "tma.cuh"

#define MOE_TMA_BM 128        // rows per tile: 64 per consumer warpgroup
#define MOE_TMA_THREADS 384   // the producer warpgroup and 2 consumer warpgroups
#define MOE_SMEM_LIMIT (227 * 1024)

// the four GEMMs: the forward's projections and the backward's data gradients (d: dye's and dxe's width)
enum { MOE_UP = 0, MOE_DOWN = 1, MOE_DA = 2, MOE_DX = 3 };
// B K-major (UP: w1_e, v1_e; DA: w2_e, rows F = N), else MN-major (DOWN: w2_e; DX: w1_e, v1_e, rows F = K)
template <int MODE> __host__ __device__ constexpr bool grouped_b_kmajor() { return MODE == MOE_UP || MODE == MOE_DA; }
// the stage's bytes: A (128 rows of 128 bytes) then B (NB rows / k-rows of 128 bytes)
template <int MODE, int BN> __host__ __device__ constexpr int grouped_tma_stage_bytes() { return (MOE_TMA_BM + (MODE == MOE_UP ? 2 * BN : BN)) * 128; }
// the epilogue's shared memory after the stages: UP, DOWN 2 staging buffers per consumer warp (model/moe_grouped.cuh's
// grouped_stage_*); DA the tile's g and u as the producer's TMA loads them (each 128 rows x BN columns: BN / 64 panels
// of 128 rows x 128 bytes, 128B-swizzled: a warp's 16 rows of a panel are exactly a staging buffer); DX none
#define MOE_EPI_SMEM (8 * 2 * MOE_STAGE_BUF)   // 2 staging buffers per consumer warp (UP, DOWN; the FP8 kernels too)
template <int MODE, int BN> __host__ __device__ constexpr int grouped_epi_bytes() {
    return MODE == MOE_DA ? 2 * MOE_TMA_BM * BN * 2 : MODE == MOE_DX ? 0 : MOE_EPI_SMEM;
}
template <int MODE, int BN, int STAGES> constexpr size_t grouped_tma_smem() {
    return (size_t)STAGES * grouped_tma_stage_bytes<MODE, BN>() + grouped_epi_bytes<MODE, BN>() + 1024;
}
// k-tiles per tile: DX runs K (= F) twice, dg against w1_e then du against v1_e
template <int MODE> __device__ __forceinline__ int grouped_tma_ktiles(int K) { return (MODE == MOE_DX ? 2 : 1) * (K / MOE_GROUPED_BK); }

// the producer (one thread): every (tile, k-tile) of the block into the ring, each stage once its consumers released it
// (DA: ma1, mb1 are g's and u's maps, and after the tile's first min(STAGES, k-tiles) k-tiles, by then in flight, it
// loads the tile's g and u into the epilogue's region once the consumers have released the previous tile's: epi_free)
template <int MODE, int BN, int STAGES, int PLANT>
__device__ __forceinline__ void grouped_tma_produce(char* smem, uint64_t* full, uint64_t* empty, uint64_t* epi_full, uint64_t* epi_free,
                                                    const CUtensorMap* ma, const CUtensorMap* ma1, const CUtensorMap* mb0,
                                                    const CUtensorMap* mb1, const int* s_mt, const int* s_off, int E, int K, int Nout) {
    constexpr int STAGE = grouped_tma_stage_bytes<MODE, BN>(), A_BYTES = MOE_TMA_BM * 128;
    const int ntiles_n = Nout / BN, ktiles = grouped_tma_ktiles<MODE>(K), total = s_mt[E] * ntiles_n;
    int it = 0;   // the block's k-tile count: stage it % STAGES, its use it / STAGES
    for (int t = blockIdx.x, ti = 0; t < total; t += gridDim.x, ti++) {
        const GroupedTile tile = grouped_tile<MOE_TMA_BM, BN>(s_mt, s_off, E, ntiles_n, t);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES, second = MODE == MOE_DX && kt * MOE_GROUPED_BK >= K, k0 = kt * MOE_GROUPED_BK - (second ? K : 0);
            // the stage's previous use released by both consumers (its first use: parity 1 passes at once)
            if (PLANT != 4) mbarrier_wait_parity(&empty[s], ((it / STAGES) & 1) ^ 1);
            char* st = smem + s * STAGE;
            mbarrier_arrive_expect_tx(&full[s], STAGE + (PLANT == 5 ? 16 : 0));
            tma_load_2d(st, second ? ma1 : ma, k0, tile.m0, &full[s]);
            if constexpr (MODE == MOE_UP) {   // w1, v1 seen as (E F, d): expert e's rows n0 .. at e F + n0
                tma_load_2d(st + A_BYTES, mb0, k0, tile.e * Nout + tile.n0, &full[s]);
                tma_load_2d(st + A_BYTES + BN * 128, mb1, k0, tile.e * Nout + tile.n0, &full[s]);
            } else if constexpr (MODE == MOE_DA) {   // w2 seen as (E F, d): rows e F + n0 .., k = d's columns
                tma_load_2d(st + A_BYTES, mb0, k0, tile.e * Nout + tile.n0, &full[s]);
            } else {   // w2 (DOWN), w1 then v1 (DX) seen as (E F, d): k-rows e F + k0 .., 64 columns per panel
                for (int p = 0; p < BN / 64; p++) tma_load_2d(st + A_BYTES + p * 8192, second ? mb1 : mb0, tile.n0 + 64 * p, tile.e * K + k0, &full[s]);
            }
            // DA: the tile's g and u once the ring is full with its first k-tiles, i.e. no sooner than the consumers' last
            // k-tile of the previous tile, whose epilogue then still reads the region (PLANT 10: not waited for)
            if (MODE == MOE_DA && kt == (ktiles < STAGES ? ktiles : STAGES) - 1) {
                if (PLANT != 10) mbarrier_wait_parity(epi_free, (ti & 1) ^ 1);
                char* gu = smem + STAGES * STAGE;
                mbarrier_arrive_expect_tx(epi_full, grouped_epi_bytes<MODE, BN>());
                for (int p = 0; p < BN / 64; p++) {   // panels of 64 columns: g's, then u's
                    tma_load_2d(gu + p * MOE_TMA_BM * 128, ma1, tile.n0 + 64 * p, tile.m0, epi_full);
                    tma_load_2d(gu + (BN / 64 + p) * MOE_TMA_BM * 128, mb1, tile.n0 + 64 * p, tile.m0, epi_full);
                }
            }
        }
    }
}

// consumer warpgroup q's stage release: one arrival per warp (the empty barriers' count is 8), after the warp's
// wait_group completed the MMAs that read the stage
__device__ __forceinline__ void grouped_tma_release(uint64_t* empty) {
    if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
}

// k-tiles it .. it + n - 1 of the block's stream (each stage waited full, MMAs issued, the previous released once
// complete); the last one's stage is the caller's to release
template <bool KMAJOR, int NB, int STAGES, int PLANT>
__device__ __forceinline__ void grouped_tma_consume(float (&d)[NB / 2], char* smem, uint64_t* full, uint64_t* empty, int q, int& it, int n,
                                                    int stage_bytes) {
    for (int kt = 0; kt < n; kt++, it++) {
        const int s = it % STAGES;
        mbarrier_wait_parity(&full[s], (it / STAGES) & 1);
        grouped_mma_ktile<KMAJOR, NB>(d, smem + s * stage_bytes, smem + s * stage_bytes + MOE_TMA_BM * 128, q);
        if (PLANT == 6) grouped_tma_release(&empty[s]);
        wgmma_wait<1>();   // the previous k-tile's MMAs completed: its stage goes back to the producer
        if (kt > 0 && PLANT != 6) grouped_tma_release(&empty[(it - 1) % STAGES]);
    }
    wgmma_wait<0>();
    if (PLANT != 6) grouped_tma_release(&empty[(it - 1) % STAGES]);
}

// the backward's epilogues (grouped_epilogue_staged's fragment layout and row mask), 64 columns at a time:
//   DA  c = da rounded to BF16 as today's GEMM stores it, then dg, du from it and the tile's g, u with moe.cuh's
//       swiglu_grads as swiglu_backward_kernel does: out0 dg, out1 du, out2 da (null: not stored). g and u are in
//       shared memory already (the producer's TMA loads, waited for by the caller): `stage` is the warp's 16 rows of
//       g's first panel, a panel is MOE_TMA_BM * 128 bytes, u's panels follow g's. Each thread overwrites its g and u
//       fragments with dg and du, and the warp stores them as 16-byte rows (da after them, through g's panel)
//   DX  dxe = BF16(the du v1_e sum + c), c the dg w1_e sum rounded to BF16: today's second GEMM (beta 1 on the first's
//       BF16 output)
template <int MODE, int PLANT, int M>
__device__ __forceinline__ void grouped_bwd_epilogue(const float (&d)[M], const __nv_bfloat162* c, const GroupedTile& tile, int q, floatX* out0,
                                                     floatX* out1, floatX* out2, int Nout, char* stage) {
    const int r0 = tile.m0 + 64 * q + 16 * (threadIdx.x % 128 / 32);
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int h = 0; h < 2 * M / 64; h++) {
        const int col0 = tile.n0 + 64 * h;
        if constexpr (MODE == MOE_DA) {
            char *bg = stage + h * MOE_TMA_BM * 128, *bu = stage + (2 * M / 64 + h) * MOE_TMA_BM * 128;
            __nv_bfloat162 og[16], ou[16];   // dg, du: the warp's reads of g and u all done before any write over them
            for (int i = 32 * h; i < 32 * h + 32; i += 2) {
                float2 df = PLANT == 8 ? make_float2(d[i], d[i + 1]) : __bfloat1622float2(c[i / 2]),
                       gf = __bfloat1622float2(*grouped_stage_at(bg, i / 4 % 8, i / 2 % 2)),
                       uf = __bfloat1622float2(*grouped_stage_at(bu, i / 4 % 8, i / 2 % 2));
                float dg0, du0, dg1, du1;
                swiglu_grads(df.x, gf.x, uf.x, &dg0, &du0);
                swiglu_grads(df.y, gf.y, uf.y, &dg1, &du1);
                og[i / 2 % 16] = __floats2bfloat162_rn(dg0, dg1);
                ou[i / 2 % 16] = __floats2bfloat162_rn(du0, du1);
            }
            // (a lane writes only where it read, but its 4 bytes share 8-byte granules with its neighbours' reads, which
            // the race detector tracks as one; the __syncwarp costs nothing here)
            __syncwarp();
            for (int i = 32 * h; i < 32 * h + 32; i += 2) {
                *grouped_stage_at(bg, i / 4 % 8, i / 2 % 2) = og[i / 2 % 16];
                *grouped_stage_at(bu, i / 4 % 8, i / 2 % 2) = ou[i / 2 % 16];
            }
            grouped_stage_sync<PLANT>();
            grouped_stage_store<PLANT>(bg, out0, r0, tile.row_end, col0, Nout);
            grouped_stage_store<PLANT>(bu, out1, r0, tile.row_end, col0, Nout);
            if (out2) {   // da (the product leaves it unstored)
                __syncwarp();
                for (int i = 32 * h; i < 32 * h + 32; i += 2) *grouped_stage_at(bg, i / 4 % 8, i / 2 % 2) = c[i / 2];
                grouped_stage_sync<PLANT>();
                grouped_stage_store<PLANT>(bg, out2, r0, tile.row_end, col0, Nout);
            }
        } else {   // DX: straight from the fragments (staged, the kernel spilled at its 168 registers: c holds 32 more)
            const int g = threadIdx.x % 32 / 4, cl = threadIdx.x % 4;
            for (int i = 32 * h; i < 32 * h + 32; i += 2) {
                const int r = r0 + g + 8 * (i / 2 % 2), col = tile.n0 + 8 * (i / 4) + 2 * cl;
                if (PLANT == 2 ? r > tile.row_end : r >= tile.row_end) continue;
                float2 cf = __bfloat1622float2(c[i / 2]);
                *(__nv_bfloat162*)(out0 + (size_t)r * Nout + col) = __floats2bfloat162_rn(d[i] + cf.x, d[i + 1] + cf.y);
            }
        }
    }
}

// UP: out0 g, out1 u (both may be null), out2 a (rows, Nout = F) from A = xe (rows, K = d) (map_a), w1, v1 (map_b0,
// map_b1). DOWN: out0 ye (rows, Nout = d) from A = a (rows, K = F) (map_a), w2 (map_b0). DA: out0 dg, out1 du, out2 da
// (rows, Nout = F) from A = dye (rows, K = d), w2 (map_b0) and g, u (map_a1, map_b1: boxes of 64 columns x 128 rows). DX: out0 dxe (rows, Nout = d) from A = dg
// then du (map_a, map_a1; rows, K = F), w1 then v1 (map_b0, map_b1). Tiles of 128 rows x BN columns (UP: of g and of
// u, wgmma N 2 BN); K % 64 == 0, Nout % BN == 0
template <int MODE, int BN, int STAGES, int PLANT>
__global__ void __launch_bounds__(MOE_TMA_THREADS, 1)
    experts_grouped_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_a1,
                               const __grid_constant__ CUtensorMap map_b0, const __grid_constant__ CUtensorMap map_b1, floatX* out0,
                               floatX* out1, floatX* out2, const int* offsets, int E, int K, int Nout) {
    constexpr int NB = MODE == MOE_UP ? 2 * BN : BN, STAGE = grouped_tma_stage_bytes<MODE, BN>();
    constexpr bool KMAJOR = grouped_b_kmajor<MODE>();
    static_assert(NB <= 256 && BN % 64 == 0, "wgmma's N is at most 256; B panels of 64 columns");
    __shared__ int s_mt[MOE_GROUPED_MAX_E + 1], s_off[MOE_GROUPED_MAX_E + 1];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES], epi_full, epi_free;   // (epi_*: DA's g, u tile)
    // the swizzle repeats every 1024 bytes of shared address: the stages start on such a boundary
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);   // the producer's arrive.expect_tx, then the copies' bytes
            mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
        }
    if (threadIdx.x == 0 && MODE == MOE_DA) {
        mbarrier_init(&epi_full, 1);
        mbarrier_init(&epi_free, 8);
    }
    grouped_schedule<MOE_TMA_BM, PLANT>(s_mt, s_off, offsets, E);   // (its __syncthreads() publishes the barriers too)
    if (threadIdx.x < 128) {
        if (threadIdx.x == 0)
            grouped_tma_produce<MODE, BN, STAGES, PLANT>(smem, full, empty, &epi_full, &epi_free, &map_a, &map_a1, &map_b0, &map_b1, s_mt,
                                                         s_off, E, K, Nout);
        return;
    }
    const int q = threadIdx.x / 128 - 1, ntiles_n = Nout / BN, total = s_mt[E] * ntiles_n;
    int it = 0;
    for (int t = blockIdx.x, ti = 0; t < total; t += gridDim.x, ti++) {
        float d[NB / 2];
        __nv_bfloat162 c[MODE == MOE_DX || MODE == MOE_DA ? NB / 4 : 1];   // DX: the dg w1_e sum, rounded; DA: da, rounded
        for (int i = 0; i < NB / 2; i++) d[i] = 0.0f;
        wgmma_fence_operand(d);
        grouped_tma_consume<KMAJOR, NB, STAGES, PLANT>(d, smem, full, empty, q, it, K / MOE_GROUPED_BK, STAGE);
        if constexpr (MODE == MOE_DX) {   // rounded to BF16 as today's first GEMM stores it; the du v1_e sum from 0
            wgmma_fence_operand(d);
            for (int i = 0; i < NB / 2; i += 2) {
                c[i / 2] = PLANT == 7 ? __floats2bfloat162_rn(0.0f, 0.0f) : __floats2bfloat162_rn(d[i], d[i + 1]);
                if (PLANT != 7) d[i] = d[i + 1] = 0.0f;
            }
            wgmma_fence_operand(d);
            grouped_tma_consume<KMAJOR, NB, STAGES, PLANT>(d, smem, full, empty, q, it, K / MOE_GROUPED_BK, STAGE);
        }
        wgmma_fence_operand(d);
        if constexpr (MODE == MOE_DA)
            for (int i = 0; i < NB / 2; i += 2) c[i / 2] = __floats2bfloat162_rn(d[i], d[i + 1]);
        // (the tile and the staging buffers are only the epilogue's business: computed here, they hold no registers
        // through the main loop, which at 168 for DX has none to spare)
        const GroupedTile tile = grouped_tile<MOE_TMA_BM, BN>(s_mt, s_off, E, ntiles_n, t);
        if constexpr (MODE == MOE_UP || MODE == MOE_DOWN) {   // the warp's staging buffers
            char* epi = smem + STAGES * STAGE + (threadIdx.x / 32 - 4) * 2 * MOE_STAGE_BUF;
            grouped_epilogue_staged<MODE == MOE_UP, PLANT>(d, tile, q, out0, out1, out2, Nout, epi);
        } else if constexpr (MODE == MOE_DA) {   // the warp's 16 rows of the tile's g and u, once landed
            mbarrier_wait_parity(&epi_full, ti & 1);
            if (PLANT == 11 && threadIdx.x % 32 == 0) mbarrier_arrive(&epi_free);
            grouped_bwd_epilogue<MODE, PLANT>(d, c, tile, q, out0, out1, out2, Nout, smem + STAGES * STAGE + (threadIdx.x / 32 - 4) * 16 * 128);
            // the region back to the producer: this warp's reads (its stores') and writes done, the writes ordered
            // before the next tile's TMA writes over them (the async proxy)
            wgmma_fence_proxy();
            __syncwarp();
            if (PLANT != 11 && threadIdx.x % 32 == 0) mbarrier_arrive(&epi_free);
        } else {
            grouped_bwd_epilogue<MODE, PLANT>(d, c, tile, q, out0, out1, out2, Nout, nullptr);
        }
    }
}

// the tensor maps (built per call: a host-side encoding, no device work) and the launch. rows: the rows of A and of
// the outputs as allocated (offsets[E] <= rows: the rows past it are read, never stored; past rows TMA reads zeros)
template <int MODE, int BN, int STAGES, int PLANT>
static void experts_grouped_tma_launch(floatX* out0, floatX* out1, floatX* out2, const floatX* A, const floatX* A1, const floatX* B0,
                                       const floatX* B1, const floatX* in0, const floatX* in1, const int* offsets_dev, int rows, int E,
                                       int K, int Nout, cudaStream_t stream) {
    constexpr size_t smem = grouped_tma_smem<MODE, BN, STAGES>();
    // (the static arrays: the schedule's 2 (E + 1) ints and the 2 STAGES + 2 barriers)
    constexpr size_t smem_all = smem + 8 * (MOE_GROUPED_MAX_E + 1) + 16 * STAGES + 16;
    if (rows < 1 || E < 1 || E > MOE_GROUPED_MAX_E || K < MOE_GROUPED_BK || K % MOE_GROUPED_BK != 0 || Nout % BN != 0 ||
        !aligned16({out0, out1, out2, A, A1, B0, B1, in0, in1}) || smem_all > MOE_SMEM_LIMIT) {
        fprintf(stderr, "experts grouped GEMM (TMA): rows %d (>= 1), E %d (1..%d), K %d (a positive multiple of %d), N %d (of %d), "
                "16-byte aligned pointers, shared memory %zu bytes for %d stages (at most %d)\n", rows, E, MOE_GROUPED_MAX_E, K,
                MOE_GROUPED_BK, Nout, BN, smem_all, STAGES, MOE_SMEM_LIMIT);
        exit(EXIT_FAILURE);
    }
    alignas(64) CUtensorMap ma, ma1, mb0, mb1;
    tma_map_2d_bf16(&ma, A, K, rows, K, 64, MOE_TMA_BM, CU_TENSOR_MAP_SWIZZLE_128B);
    ma1 = ma;
    if (MODE == MOE_DX) tma_map_2d_bf16(&ma1, A1, K, rows, K, 64, MOE_TMA_BM, CU_TENSOR_MAP_SWIZZLE_128B);
    if (grouped_b_kmajor<MODE>()) {   // w1, v1 (UP), w2 (DA) (E F, d) = (E Nout, K): boxes of 64 k x BN rows
        tma_map_2d_bf16(&mb0, B0, K, (uint64_t)E * Nout, K, 64, BN, CU_TENSOR_MAP_SWIZZLE_128B);
        mb1 = mb0;
        if (MODE == MOE_UP) tma_map_2d_bf16(&mb1, B1, K, (uint64_t)E * Nout, K, 64, BN, CU_TENSOR_MAP_SWIZZLE_128B);
    } else {   // w2 (DOWN), w1, v1 (DX) (E F, d) = (E K, Nout): boxes of 64 columns x 64 k-rows
        tma_map_2d_bf16(&mb0, B0, Nout, (uint64_t)E * K, Nout, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
        mb1 = mb0;
        if (MODE == MOE_DX) tma_map_2d_bf16(&mb1, B1, Nout, (uint64_t)E * K, Nout, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    }
    if (MODE == MOE_DA) {   // g, u (rows, Nout = F): boxes of 64 columns x 128 rows, the epilogue's panels
        tma_map_2d_bf16(&ma1, in0, Nout, rows, Nout, 64, MOE_TMA_BM, CU_TENSOR_MAP_SWIZZLE_128B);
        tma_map_2d_bf16(&mb1, in1, Nout, rows, Nout, 64, MOE_TMA_BM, CU_TENSOR_MAP_SWIZZLE_128B);
    }
    // (the locals' names are the launches' in work logs and traces)
    auto experts_up_grouped_tma = experts_grouped_tma_kernel<MODE, BN, STAGES, PLANT>, experts_down_grouped_tma = experts_up_grouped_tma,
         experts_down_backward_grouped_tma = experts_up_grouped_tma, experts_up_backward_grouped_tma = experts_up_grouped_tma;
    cudaCheck(cudaFuncSetAttribute(experts_up_grouped_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
#define MOE_TMA_LAUNCH(kernel) \
    LAUNCH(kernel, grouped_blocks(), MOE_TMA_THREADS, smem, stream, ma, ma1, mb0, mb1, out0, out1, out2, offsets_dev, E, K, Nout)
    if (MODE == MOE_UP) MOE_TMA_LAUNCH(experts_up_grouped_tma);
    else if (MODE == MOE_DOWN) MOE_TMA_LAUNCH(experts_down_grouped_tma);
    else if (MODE == MOE_DA) MOE_TMA_LAUNCH(experts_down_backward_grouped_tma);
    else MOE_TMA_LAUNCH(experts_up_backward_grouped_tma);
#undef MOE_TMA_LAUNCH
}

// g, u (rows, F; both null: only a), a (rows, F) from xe (rows, d), w1, v1 (E F, d); offsets_dev (E + 1) on the
// device, offsets[E] <= rows. 128 rows x 128 columns of g and of u per tile (wgmma N 256), 4 stages of 48 KiB
template <int BN = 128, int STAGES = 4, int PLANT = 0>
static void experts_up_grouped_tma_gpu(floatX* g, floatX* u, floatX* a, const floatX* xe, const floatX* w1, const floatX* v1,
                                       const int* offsets_dev, int rows, int E, int d, int F, cudaStream_t stream = 0) {
    experts_grouped_tma_launch<MOE_UP, BN, STAGES, PLANT>(g, u, a, xe, nullptr, w1, v1, nullptr, nullptr, offsets_dev, rows, E, d, F, stream);
}
// ye (rows, d) from a (rows, F), w2 (E F, d); 128 rows x 256 columns per tile, 4 stages of 48 KiB
template <int BN = 256, int STAGES = 4, int PLANT = 0>
static void experts_down_grouped_tma_gpu(floatX* ye, const floatX* a, const floatX* w2, const int* offsets_dev, int rows, int E, int d, int F,
                                         cudaStream_t stream = 0) {
    experts_grouped_tma_launch<MOE_DOWN, BN, STAGES, PLANT>(ye, nullptr, nullptr, a, nullptr, w2, nullptr, nullptr, nullptr, offsets_dev, rows,
                                                            E, F, d, stream);
}
// the down-projection's data gradient with the SwiGLU backward fused: da = dye_e w2_e^T (rows, F), then dg, du (rows, F)
// from da, g, u as swiglu_backward_kernel (da stored only when non-null). 128 x 128 tiles, 5 stages of 32 KiB (the
// tile's g and u, 64 KiB, take the sixth's room)
template <int BN = 128, int STAGES = 5, int PLANT = 0>
static void experts_down_backward_grouped_tma_gpu(floatX* dg, floatX* du, floatX* da, const floatX* dye, const floatX* w2, const floatX* g,
                                                  const floatX* u, const int* offsets_dev, int rows, int E, int d, int F,
                                                  cudaStream_t stream = 0) {
    experts_grouped_tma_launch<MOE_DA, BN, STAGES, PLANT>(dg, du, da, dye, nullptr, w2, nullptr, g, u, offsets_dev, rows, E, d, F, stream);
}
// the up-projection's data gradient: dxe_e = dg_e w1_e + du_e v1_e (rows, d), rounded as today's two GEMMs (the first
// product to BF16, then the second's sum plus it). K runs over F twice; 128 x 128 tiles, 6 stages of 32 KiB
template <int BN = 128, int STAGES = 6, int PLANT = 0>
static void experts_up_backward_grouped_tma_gpu(floatX* dxe, const floatX* dg, const floatX* du, const floatX* w1, const floatX* v1,
                                                const int* offsets_dev, int rows, int E, int d, int F, cudaStream_t stream = 0) {
    experts_grouped_tma_launch<MOE_DX, BN, STAGES, PLANT>(dxe, nullptr, nullptr, dg, du, w1, v1, nullptr, nullptr, offsets_dev, rows, E, F, d,
                                                          stream);
}
