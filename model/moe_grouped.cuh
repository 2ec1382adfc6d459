/*
 * moe_grouped.cuh — the experts' GEMMs as Hopper grouped GEMMs (issue 25; versions 1-3, cp.async-fed: the dev program's;
 * the product's --moe-gemm grouped runs version 4, model/moe_grouped_tma.cuh):
 * one launch per projection for all experts, the expert offsets read ON THE DEVICE (no host sync), on
 * warpgroup MMA (model/wgmma.cuh), with the SwiGLU fused into the up-projection's epilogue:
 *   experts_up_grouped_gpu    g = xe_e w1_e^T, u = xe_e v1_e^T, a = silu(g) u   (rows, F), per expert e
 *   experts_down_grouped_gpu  ye_e = a_e w2_e                                    (rows, d)
 * Rows are grouped by expert (offsets (E + 1) on the device, as moe_dispatch_gpu leaves them); w1, v1 (E F, d)
 * K-major, w2 (E F, d) is w2_e (F, d) row-major: the down-projection's B is MN-major (wgmma's transpose flag).
 * Persistent tile scheduler: a fixed grid (the SM count) of blocks; each block loads the offsets into shared
 * memory, prefix-sums the experts' m-tile counts (ceil(n_e / BM); an empty expert has none) and walks the tiles
 * t = blockIdx.x, + gridDim.x, ... (expert by expert; inside one, groups of 16 m-tiles, m fastest: grouped_tile,
 * for L2 reuse): a tile never straddles two experts; its rows past the expert's end are zero-filled on load
 * (cp.async zfill: never read past the rows) and not stored.
 * Per tile: k-tiles of 64 (one 128-byte swizzle row) cp.async'd into the 128B-swizzled layouts (A and the
 * up-projection's B K-major; w2 MN-major in 64-column panels, SBO 1024, LBO the panel), STAGES deep (the pipeline
 * runs on across the block's tiles), then 4 wgmma k-steps of 16 per warpgroup (WG warpgroups: 64 WG rows, sharing
 * the B tile; from 3 stages one k-tile's MMAs stay in flight while the next are issued). The up-projection's B
 * tile is BN rows of w1_e over the same BN rows of v1_e (wgmma N = 2 BN): each thread holds g and u of the same
 * columns (accumulators i and i + BN / 2), so the epilogue rounds both to BF16 and computes a from the
 * rounded values with moe.cuh's swiglu_value, as swiglu_forward_kernel does: a has the product's bits whenever
 * g and u do (the same k-order fp32 sums as cuBLASLt's twin; on a GPU the summation orders differ).
 * PLANT (tests only): 1 the scheduler's m-tile count floor(n_e / BM) (tails dropped), 2 the store mask one row
 * too far (a row of the next expert / past the end overwritten), 3 the k-tile's barrier dropped (a race).
 */
#pragma once
#include "cuda_common.h"
#include "moe.cuh"
#include "wgmma.cuh"

#define MOE_GROUPED_MAX_E 128
#define MOE_GROUPED_BK 64   // k per k-tile: one 128-byte swizzle row of bf16


// the block's tile t: expert e (rows [row0, row_end) of it from m0 on), output columns n0..
struct GroupedTile { int e, m0, row_end, n0; };

// s_mt (E + 1): the prefix sum of the experts' m-tile counts; s_off (E + 1) the offsets. Thread 0 fills them
// (E <= 128 additions: nothing next to a tile's GEMM)
template <int BM, int PLANT>
__device__ __forceinline__ void grouped_schedule(int* s_mt, int* s_off, const int* offsets, int E) {
    if (threadIdx.x == 0) {
        s_mt[0] = 0;
        s_off[0] = offsets[0];
        for (int e = 0; e < E; e++) {
            s_off[e + 1] = offsets[e + 1];
            int n = s_off[e + 1] - s_off[e];
            s_mt[e + 1] = s_mt[e] + (PLANT == 1 ? n / BM : (n + BM - 1) / BM);
        }
    }
    __syncthreads();
}
// tile t of NT n-tiles per m-tile. Expert e owns tiles [s_mt[e] NT, s_mt[e + 1] NT): the expert is the last e with
// s_mt[e] <= t / NT (empty experts before it share its s_mt value and are passed over). Inside the expert the
// tiles go in groups of MOE_GROUPED_GM m-tiles, n-tile by n-tile, m fastest: the blocks running at once then share
// each B tile (a weight slice: 2 x 128 x 6144 BF16 = 3 MiB at DBRX-132B's up-projection) among up to 16 m-tiles and
// each A tile among the n-tiles in flight, so the step's weights stream from HBM about once per group. With n fastest
// (until session 39) the 132 tiles in flight spanned ~1.6 m-tiles and every n-tile: ~260 MB of w1/v1 per wave from
// HBM, which capped the 132B up-projection at 35% of the peak on an H100.
#define MOE_GROUPED_GM 16
template <int BM, int BN>
__device__ __forceinline__ GroupedTile grouped_tile(const int* s_mt, const int* s_off, int E, int NT, int t) {
    int lo = 0, hi = E;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (s_mt[mid] * NT <= t) lo = mid;
        else hi = mid;
    }
    const int local = t - s_mt[lo] * NT, mts = s_mt[lo + 1] - s_mt[lo];   // the expert's tile and its m-tile count
    const int g0 = local / (MOE_GROUPED_GM * NT) * MOE_GROUPED_GM;          // the group's first m-tile
    // the group's m-tiles (the last group is short; at least 1: the cp.async versions look one tile past the end)
    const int gm = max(1, min(MOE_GROUPED_GM, mts - g0)), r = local - g0 * NT;
    const int mt = g0 + r % gm, nt = r / gm;
    GroupedTile tile = {lo, s_off[lo] + mt * BM, s_off[lo + 1], nt * BN};
    return tile;
}

// rows m0 .. m0 + rows - 1 (those at or past row_end zero-filled), k0 .. k0 + 63 of src (row stride K) into the
// K-major 128B-swizzled tile dst: row r's 16-byte chunk c at chunk c ^ r % 8, rows 128 bytes apart
template <int NTHREADS>
__device__ __forceinline__ void grouped_load_a(char* dst, const floatX* src, int rows, int m0, int row_end, int K, int k0) {
    for (int i = threadIdx.x; i < rows * 8; i += NTHREADS) {
        int r = i / 8, c = i % 8;
        bool in = m0 + r < row_end;
        // (a zero-filled chunk reads nothing: its address is the tile's first row, which exists)
        cp_async_16_zfill(dst + r * 128 + ((c ^ (r % 8)) * 16), src + (size_t)(in ? m0 + r : m0) * K + k0 + 8 * c, in ? 16 : 0);
    }
}
// the up-projection's B: rows n0 .. n0 + BN - 1 of w1_e, then the same of v1_e, K-major swizzled (2 BN rows)
template <int NTHREADS, int BN>
__device__ __forceinline__ void grouped_load_b_up(char* dst, const floatX* w1e, const floatX* v1e, int n0, int K, int k0) {
    for (int i = threadIdx.x; i < 2 * BN * 8; i += NTHREADS) {
        int r = i / 8, c = i % 8;
        const floatX* src = r < BN ? w1e + (size_t)(n0 + r) * K : v1e + (size_t)(n0 + r - BN) * K;
        cp_async_16(dst + r * 128 + ((c ^ (r % 8)) * 16), src + k0 + 8 * c);
    }
}
// the down-projection's B: rows k0 .. k0 + 63 of w2_e (F, Nout), columns n0 .. n0 + BN - 1, MN-major swizzled:
// BN / 64 panels of 64 k-rows x 128 bytes (64 columns), row k's chunk c at chunk c ^ k % 8
template <int NTHREADS, int BN>
__device__ __forceinline__ void grouped_load_b_down(char* dst, const floatX* w2e, int n0, int Nout, int k0) {
    for (int i = threadIdx.x; i < BN * 8; i += NTHREADS) {
        int p = i / 512, k = i / 8 % 64, c = i % 8;
        cp_async_16(dst + p * 8192 + k * 128 + ((c ^ (k % 8)) * 16), w2e + (size_t)(k0 + k) * Nout + n0 + 64 * p + 8 * c);
    }
}

// k-tile kt of `tile` into the stage st: A (BM rows) then B (the expert's (F, d) blocks of B0 and B1)
template <bool UP, int NT, int BM, int BN>
__device__ __forceinline__ void grouped_load_stage(char* st, const GroupedTile& tile, const floatX* A, const floatX* B0, const floatX* B1,
                                                   int K, int Nout, int kt) {
    const size_t wo = (size_t)tile.e * Nout * K;
    grouped_load_a<NT>(st, A, BM, tile.m0, tile.row_end, K, kt * MOE_GROUPED_BK);
    if constexpr (UP) grouped_load_b_up<NT, BN>(st + BM * 128, B0 + wo, B1 + wo, tile.n0, K, kt * MOE_GROUPED_BK);
    else grouped_load_b_down<NT, BN>(st + BM * 128, B0 + wo, tile.n0, Nout, kt * MOE_GROUPED_BK);
}

// one k-tile's 4 wgmma k-steps of 16 for warpgroup q (rows 64 q ..) of the stage's A (K-major) and B (UP: K-major;
// DOWN: MN-major panels of 64 columns, 8192 bytes apart), committed as one group
template <bool UP, int NB>
__device__ __forceinline__ void grouped_mma_ktile(float (&d)[NB / 2], const char* sa, const char* sb, int q) {
    wgmma_fence();
    for (int s = 0; s < MOE_GROUPED_BK / 16; s++) {
        uint64_t da = wgmma_desc(sa + q * 64 * 128 + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B);
        if constexpr (UP) wgmma_bf16_ss<NB, 0, 0>(d, da, wgmma_desc(sb + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B), 1);
        else wgmma_bf16_ss<NB, 0, 1>(d, da, wgmma_desc(sb + s * 16 * 128, 8192, 1024, WGMMA_SWIZZLE_128B), 1);
    }
    wgmma_commit();
}

// warpgroup q's accumulators of `tile` to global memory, rows past the expert's end skipped. d[i] = D[16 warp + g +
// 8 ((i/2)%2)][8 (i/4) + 2 (lane%4) + i%2]; UP: g's columns, u's at i + BN / 2 (a from the BF16-rounded g and u)
template <bool UP, int BN, int PLANT, int M>
__device__ __forceinline__ void grouped_epilogue(const float (&d)[M], const GroupedTile& tile, int q, floatX* out0, floatX* out1, floatX* out2,
                                                 int Nout) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    constexpr int COLS = UP ? BN / 2 : M;
    for (int i = 0; i < COLS; i += 2) {
        int r = tile.m0 + 64 * q + 16 * warp + g + 8 * (i / 2 % 2), col = tile.n0 + 8 * (i / 4) + 2 * c;
        if (PLANT == 2 ? r > tile.row_end : r >= tile.row_end) continue;
        size_t o = (size_t)r * Nout + col;
        __nv_bfloat162 gv = __floats2bfloat162_rn(d[i], d[i + 1]);
        if constexpr (UP) {
            __nv_bfloat162 uv = __floats2bfloat162_rn(d[i + BN / 2], d[i + BN / 2 + 1]);
            float2 gf = __bfloat1622float2(gv), uf = __bfloat1622float2(uv);
            *(__nv_bfloat162*)(out2 + o) = __floats2bfloat162_rn(swiglu_value(gf.x, uf.x), swiglu_value(gf.y, uf.y));
            if (out1) *(__nv_bfloat162*)(out1 + o) = uv;
        }
        if (out0) *(__nv_bfloat162*)(out0 + o) = gv;
    }
}

// v4's and the FP8 kernel's epilogue staging: each consumer warp owns two buffers of 16 rows (its rows of the tile)
// x 64 columns of BF16 (MOE_STAGE_BUF bytes each) in shared memory. The accumulator fragments go in as 4-byte writes,
// row r's 16-byte chunk j at chunk j ^ r % 8: a warp instruction's 8 rows x 16 bytes land on 8 distinct chunks of
// the 32 banks (no conflict), and come out as 16-byte coalesced stores, each warp instruction writing 4 whole
// 128-byte row segments (rather than 8 rows x 16 bytes of 4-byte stores straight from the fragments)
#define MOE_STAGE_BUF 2048
__device__ __forceinline__ int grouped_stage_off(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) * 16); }
// the thread's fragment pair at columns 8 j + 2 (lane % 4) of row lane / 4 + 8 h (d[i]: j = i / 4 % 8, h = i / 2 % 2)
__device__ __forceinline__ __nv_bfloat162* grouped_stage_at(char* buf, int j, int h) {
    const int lane = threadIdx.x % 32;
    return (__nv_bfloat162*)(buf + grouped_stage_off(lane / 4 + 8 * h, j) + 4 * (lane % 4));
}
// buffer -> rows r0 .. r0 + 15 (those at or past row_end skipped: the next expert's), columns col0 .. col0 + 63 of out
template <int PLANT>
__device__ __forceinline__ void grouped_stage_store(const char* buf, floatX* out, int r0, int row_end, int col0, int Nout) {
    const int lane = threadIdx.x % 32, ch = lane % 8;
    for (int k = 0; k < 4; k++) {
        const int row = lane / 8 + 4 * k;
        if (PLANT == 2 ? r0 + row > row_end : r0 + row >= row_end) continue;
        *(uint4*)(out + (size_t)(r0 + row) * Nout + col0 + 8 * ch) = *(const uint4*)(buf + grouped_stage_off(row, ch));
    }
}
// the fragments' __syncwarp: the lanes' buffer writes before the other lanes' reads (PLANT 9 drops it: a race). (A
// buffer is written either by fragments or by 16-byte rows, never both: the race detector merges a thread's accesses
// to an 8-byte granule, and a lane's fragment write after its row write would then look unordered with its neighbours')
template <int PLANT> __device__ __forceinline__ void grouped_stage_sync() {
    if (PLANT != 9) __syncwarp();
}

// grouped_epilogue through the warp's staging buffers b0, b1 (stage: 2 MOE_STAGE_BUF bytes). M accumulators (UP: g's
// then u's, M columns; else 2 M columns), 64 columns at a time. UP: a into b0 and g into b1, stored; then u into b0;
// else chunk h into b[h % 2]. A __syncwarp between a buffer's fragment writes and its stores' reads, and between
// those reads and the buffer's next writes (each chunk opens with one)
template <bool UP, int PLANT, int M>
__device__ __forceinline__ void grouped_epilogue_staged(const float (&d)[M], const GroupedTile& tile, int q, floatX* out0, floatX* out1,
                                                        floatX* out2, int Nout, char* stage) {
    const int r0 = tile.m0 + 64 * q + 16 * (threadIdx.x % 128 / 32);
    char *b0 = stage, *b1 = stage + MOE_STAGE_BUF;
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int h = 0; h < (UP ? M : 2 * M) / 64; h++) {
        const int col0 = tile.n0 + 64 * h;
        if (UP || h < 2) __syncwarp();   // (else the previous chunk's __syncwarp orders chunk h - 2's reads of this buffer)
        char* b = UP || h % 2 == 0 ? b0 : b1;
        for (int i = 32 * h; i < 32 * h + 32; i += 2) {   // a (UP), the output
            __nv_bfloat162 gv = __floats2bfloat162_rn(d[i], d[i + 1]);
            if constexpr (UP) {
                if (out0) *grouped_stage_at(b1, i / 4 % 8, i / 2 % 2) = gv;
                float2 gf = __bfloat1622float2(gv), uf = __bfloat1622float2(__floats2bfloat162_rn(d[i + M / 2], d[i + M / 2 + 1]));
                gv = __floats2bfloat162_rn(swiglu_value(gf.x, uf.x), swiglu_value(gf.y, uf.y));
            }
            *grouped_stage_at(b, i / 4 % 8, i / 2 % 2) = gv;
        }
        grouped_stage_sync<PLANT>();
        grouped_stage_store<PLANT>(b, UP ? out2 : out0, r0, tile.row_end, col0, Nout);
        if constexpr (UP) {
            if (out0) grouped_stage_store<PLANT>(b1, out0, r0, tile.row_end, col0, Nout);
            if (out1) {
                __syncwarp();
                for (int i = 32 * h; i < 32 * h + 32; i += 2)
                    *grouped_stage_at(b0, i / 4 % 8, i / 2 % 2) = __floats2bfloat162_rn(d[i + M / 2], d[i + M / 2 + 1]);
                grouped_stage_sync<PLANT>();
                grouped_stage_store<PLANT>(b0, out1, r0, tile.row_end, col0, Nout);
            }
        }
    }
}

// UP: out0 g, out1 u (both may be null), out2 a (rows, Nout = F) from A = xe (rows, K = d), B0 = w1, B1 = v1.
// else: out0 ye (rows, Nout = d) from A = a (rows, K = F), B0 = w2. 128 WG threads; tiles of 64 WG rows x BN
// columns; K % 64 == 0, Nout % BN == 0
template <bool UP, int WG, int BN, int STAGES, int PLANT>
__global__ void __launch_bounds__(128 * WG) experts_grouped_kernel(floatX* out0, floatX* out1, floatX* out2, const floatX* A,
                                                                  const floatX* B0, const floatX* B1, const int* offsets, int E,
                                                                  int K, int Nout) {
    constexpr int BM = 64 * WG, NB = UP ? 2 * BN : BN, NT = 128 * WG;   // NB: wgmma's N
    __shared__ int s_mt[MOE_GROUPED_MAX_E + 1], s_off[MOE_GROUPED_MAX_E + 1];
    // the swizzle repeats every 1024 bytes of shared address: the tiles start on such a boundary
    char* smem = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);
    constexpr int a_bytes = BM * 128, stage_bytes = (BM + NB) * 128;
    const int q = threadIdx.x / 128, ntiles_n = Nout / BN, ktiles = K / MOE_GROUPED_BK;
    grouped_schedule<BM, PLANT>(s_mt, s_off, offsets, E);
    const int total = s_mt[E] * ntiles_n;
    // INFLIGHT: one k-tile's MMAs left in flight while the next k-tile's are issued (3 stages or more). The producer
    // runs L = STAGES - 1 - INFLIGHT k-tiles ahead through the block's stream of (tile, k-tile) pairs, across tiles
    // (the next tile's first k-tiles load during this tile's last MMAs and its epilogue), refilling after the step's
    // barrier the stage of k-tile c - 1 - INFLIGHT, whose MMAs every warpgroup has waited for before that barrier.
    // Each step commits one copy group (empty past the stream's end): wait_group L - 1 completes the step's own
    constexpr int INFLIGHT = STAGES >= 3 ? 1 : 0, L = STAGES - 1 - INFLIGHT;
    int pt = blockIdx.x, pk = 0, produced = 0, consumed = 0;
    GroupedTile ptile = grouped_tile<BM, BN>(s_mt, s_off, E, ntiles_n, pt);
    auto produce = [&]() {
        if (pt < total) {
            grouped_load_stage<UP, NT, BM, BN>(smem + produced++ % STAGES * stage_bytes, ptile, A, B0, B1, K, Nout, pk);
            if (++pk == ktiles) {
                pk = 0;
                pt += gridDim.x;
                ptile = grouped_tile<BM, BN>(s_mt, s_off, E, ntiles_n, pt);
            }
        }
        cp_async_commit();
    };
    for (int s = 0; s < L; s++) produce();
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const GroupedTile tile = grouped_tile<BM, BN>(s_mt, s_off, E, ntiles_n, t);
        float d[NB / 2];
        for (int i = 0; i < NB / 2; i++) d[i] = 0.0f;
        wgmma_fence_operand(d);
        for (int kt = 0; kt < ktiles; kt++) {
            cp_async_wait<L - 1>();
            wgmma_fence_proxy();   // this thread's copies (generic proxy) visible to the MMAs' reads (async proxy), then
            if (PLANT != 3) __syncthreads();   // every thread's: the stage's copies landed; the refilled stage's MMAs are done
            produce();
            const char* st = smem + consumed++ % STAGES * stage_bytes;
            grouped_mma_ktile<UP, NB>(d, st, st + a_bytes, q);
            wgmma_wait<INFLIGHT>();
        }
        wgmma_wait<0>();
        wgmma_fence_operand(d);
        grouped_epilogue<UP, BN, PLANT>(d, tile, q, out0, out1, out2, Nout);
    }
}

// the number of persistent blocks: one per SM (a few under the emulator, so that each walks several tiles)
static inline int grouped_blocks() {
#if defined(SIMT_EMULATION)
    return 3;
#else
    int dev = 0, sms = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
#endif
}

template <bool UP, int WG, int BN, int STAGES, int PLANT>
static void experts_grouped_launch(floatX* out0, floatX* out1, floatX* out2, const floatX* A, const floatX* B0, const floatX* B1,
                                   const int* offsets_dev, int E, int K, int Nout, cudaStream_t stream) {
    if (E < 1 || E > MOE_GROUPED_MAX_E || K % MOE_GROUPED_BK != 0 || Nout % BN != 0 || !aligned16({out0, out1, out2, A, B0, B1})) {
        fprintf(stderr, "experts grouped GEMM: E %d (1..%d), K %d (a multiple of %d), N %d (of %d), 16-byte aligned pointers\n", E,
                MOE_GROUPED_MAX_E, K, MOE_GROUPED_BK, Nout, BN);
        exit(EXIT_FAILURE);
    }
    constexpr int NB = UP ? 2 * BN : BN;
    size_t smem = (size_t)STAGES * (64 * WG + NB) * 128 + 1024;
    // (the locals' names are the launches' in work logs and traces: experts_up_grouped, experts_down_grouped)
    auto experts_up_grouped = experts_grouped_kernel<UP, WG, BN, STAGES, PLANT>, experts_down_grouped = experts_up_grouped;
    cudaCheck(cudaFuncSetAttribute(experts_up_grouped, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (UP) LAUNCH(experts_up_grouped, grouped_blocks(), 128 * WG, smem, stream, out0, out1, out2, A, B0, B1, offsets_dev, E, K, Nout);
    else LAUNCH(experts_down_grouped, grouped_blocks(), 128 * WG, smem, stream, out0, out1, out2, A, B0, B1, offsets_dev, E, K, Nout);
}

// g, u (rows, F; both null: only a), a (rows, F) from xe (rows, d), w1, v1 (E F, d); offsets_dev (E + 1) on the
// device. Two warpgroups on 128 rows x 64 columns of g and of u (wgmma N 128), 4 stages
template <int WG = 2, int BN = 64, int STAGES = 4, int PLANT = 0>
static void experts_up_grouped_gpu(floatX* g, floatX* u, floatX* a, const floatX* xe, const floatX* w1, const floatX* v1,
                                   const int* offsets_dev, int E, int d, int F, cudaStream_t stream = 0) {
    experts_grouped_launch<true, WG, BN, STAGES, PLANT>(g, u, a, xe, w1, v1, offsets_dev, E, d, F, stream);
}
// ye (rows, d) from a (rows, F), w2 (E F, d); two warpgroups on 128 rows x 128 columns, 4 stages
template <int WG = 2, int BN = 128, int STAGES = 4, int PLANT = 0>
static void experts_down_grouped_gpu(floatX* ye, const floatX* a, const floatX* w2, const int* offsets_dev, int E, int d, int F,
                                     cudaStream_t stream = 0) {
    experts_grouped_launch<false, WG, BN, STAGES, PLANT>(ye, nullptr, nullptr, a, w2, nullptr, offsets_dev, E, F, d, stream);
}

// --moe-gemm grouped (train_cuda.cuh sets it): the step's expert forward and data gradients on the TMA-fed kernels
// (model/moe_experts_step.cuh: experts_forward_step_gpu, experts_backward_step_gpu); v1-v3 above are the dev program's
inline int g_moe_grouped = 0;

// "" when the model's experts fit the product's kernels (d and F multiples of their 128-column tiles, E <= 128), else
// why not: the run is refused at start-up with it
static inline std::string moe_grouped_unfit(int E, int d, int F) {
    char buf[200] = "";
    if (E > MOE_GROUPED_MAX_E || d % 128 != 0 || F % 128 != 0)
        snprintf(buf, sizeof buf, "needs at most %d experts (%d), d_model a multiple of 128 (%d) and ffn_hidden of 128 (%d)",
                 MOE_GROUPED_MAX_E, E, d, F);
    return buf;
}
