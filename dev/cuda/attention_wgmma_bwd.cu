/*
 * attention_wgmma_bwd.cu — a causal GQA flash attention backward on Hopper's warpgroup MMA (model/wgmma.cuh), issue
 * 25's Hopper attention after the forward (attention_wgmma.cu; not in the product; first run on an H100 2026-11-27).
 * Same contract as the 5-product backward (model/attention_flash_bwd5.cuh, context parallelism's): from qkv
 * (B, T, (H + 2 KV) hd) after RoPE, out, dout (B, T, H hd), lse (B, H, T) and D (B, H, T) = rowsum(dout * out) (the product's D kernel, which also zeroes
 * the semaphores), dqkv (B, T, (H + 2 KV) hd) overwritten; scratch dq_acc FP32 (B, H, T, hd) and one int per (b, h,
 * 64-query tile) + a ticket.
 *   backward wgmma v1  grid (T/64 key tiles, KV, B), one warpgroup (128 threads) owning 64 keys: K, V of the tile and
 *        double-buffered 64-query tiles of Q, dO (every query head of the kv group, from the diagonal on) copied by
 *        cp.async into the 128B-swizzled layout (model/attention_wgmma_fwd.cuh's wgmma_load_rows). Per query tile, bwd5's 5 products:
 *          S^T, dP^T (64 x 64) = K Q^T, V dO^T   wgmma m64n64k16, both operands K-major from shared memory
 *          P^T = exp(S^T scale - lse) (causal mask), dS^T = P^T (dP^T - D) on the accumulators
 *          dV (64 x hd) += P^T dO, dK += dS^T Q   m64n(hd)k16, A from registers (the accumulators rounded to bf16),
 *                                                  B = dO, Q MN-major (head dims contiguous)
 *          dQ (64 x hd) = dS K                    dS^T stored transposed into a swizzled shared tile (queries x
 *                                                  64 keys: A K-major), K MN-major; m64n64k16 per 64 head dims
 *        dQ summed in FP32 over the key tiles in their order (a semaphore per query tile, as bwd5: deterministic);
 *        dK (times scale), dV stored as bf16 pairs from the accumulators. dK, dV's wgmma overlap the barrier before dQ's;
 *        each group waited for before the next is issued; no branch around a wgmma. Registers at hd 128: dK, dV 2 x 64
 *        floats, S^T, dP^T 2 x 32.
 *   backward wgmma v2  (hd 128) FlashAttention-3's shape: 2 warpgroups (256 threads) on 128 keys, the Q, dO tiles shared;
 *        warpgroup w owns keys 64 w .. (S^T .. dK as v1) and dQ's head dims 64 w .., summed over the two 64-key chunks
 *        one after the other (bwd5's order of key tiles: the same bits). Half the Q, dO copies and dQ sums per key.
 *   backward wgmma v3  the model's pair (7 products, no semaphores, no scratch but D) on wgmma, after the D kernel:
 *        dq kernel    grid (H, B, T/128 query tiles, the last first), 2 warpgroups x 64 query rows, the wgmma forward's
 *                     shape: Q, dO (128 rows) once, K, V tiles of 64 keys double-buffered by cp.async; per key tile up to
 *                     the block's last row, in order: S, dP (64 x 64) = Q K^T, dO V^T (ss, K-major), dS = P (dP - D),
 *                     dQ (64 x hd) += dS K (A = dS from registers, K MN-major); dQ scale stored as bf16 (plain stores)
 *        dk/dv kernel v2 without dQ: grid (T/128 key tiles, KV, B), key tile 0 (the most queries) of every head first;
 *                     2 warpgroups x 64 keys sharing the Q, dO tiles; S^T, dP^T, dV += P^T dO, dK += dS^T Q
 *   backward wgmma v4  v3 with the dq kernel on FlashAttention-3's intra-warpgroup overlap (the wgmma forward v2's order):
 *        S, dP of tile j + 1 issued with dQ += dS K of tile j, their dS computed while that runs; 3 K/V buffers, one
 *        barrier a tile. The same dk/dv kernel.
 *   Registers (nvcc 13, sm_90a; hd 128 / 64): v3's dq 177 / 145, v4's 191 / 159, dk/dv 254 / 188; v1 244 / 205, v2 248;
 *        no spill, no wgmma serialization. On a GPU, -v 3 also times each of v3, v4's kernels alone.
 *   bwd5 (mma.sync) and the model's backward (the dq + dk/dv pair, model/attention_flash_bwd.cuh) timed alongside
 * Validation: dqkv against the CPU reference (model/attention.cuh; 1e-2) and, emulated, bit for bit: v1, v2 against bwd5
 * (the same k-order sums: S^T, dP^T over head dims, dK, dV over queries in 16-query steps in bwd5's order, dQ per key tile
 * over its 64 keys then added in key-tile order), v3, v4 against the pair (its order: dQ over all keys in one accumulator,
 * key tiles in order, dK, dV over the group's heads and queries; the extra wholly masked tile adds zeros). On a GPU at the
 * timing shape against bwd5 (-v 3, 4: the pair; 1e-2).
 *   make dev/cuda/attention_wgmma_bwd && ./dev/cuda/attention_wgmma_bwd [-v 1|2|3|4] [-b B] [-t T] [-h H] [-k KV] [-d hd]
 *     default dbrx-132b's attention shape B 8, T 4096, H 48, KV 8, hd 128; under the emulator small shapes. dbrx-1b's:
 *     -v 3 -b 8 -t 2048 -h 8 -k 2 -d 128 (v3 and v4 beside the pair).
 *     -p 1 (emulated): v1 without the barrier between the dS stores and dQ's wgmma (the race detector must name it);
 *     -p 2: v3's dq kernel without the barrier after a tile's wgmma, before K, V tile j + 2 is copied over tile j;
 *     -p 3: v4's dq kernel with 2 K/V buffers (tile j + 2 copied over K(j) while dQ's wgmma reads it).
 */
#include "common.h"   // (and the emulator, before the pragma: its own code as built everywhere)
#if defined(SIMT_EMULATION) && defined(__GNUC__) && !defined(__clang__)
// the host compiler fuses a * b - c into an fma where its optimizer sees fit, which differs between kernels (the pair's
// P and this file's rounded differently in a few elements): off for the kernels and the reference from here on, so that the
// emulated kernels' elementwise arithmetic rounds alike and the bit-for-bit checks below compare the sum orders
#pragma GCC optimize("fp-contract=off")
#endif
#include "../../model/attention.cuh"

#define WGB_BQ 64   // queries per tile
#define WGB_BC 64   // keys of a block (one warpgroup)
#define WGB_THREADS 128

// D (64 x 64, the D fragment) = A B^T over HD, A and B (64 rows x HD) both K-major swizzled tiles (panels of 64 head
// dims, rows of 128 bytes; A's panels APS bytes apart, B's 64 rows), issued and committed
template <int HD, int APS> __device__ __forceinline__ void wgb_issue_kk(float (&d)[32], const char* A, const char* B) {
    wgmma_fence();
    for (int ks = 0; ks < HD / 16; ks++) {
        const int k = 32 * (ks % 4);
        wgmma_bf16_ss<64, 0, 0>(d, wgmma_desc(A + (ks / 4) * APS + k, 16, 1024, WGMMA_SWIZZLE_128B),
                                wgmma_desc(B + (ks / 4) * 64 * 128 + k, 16, 1024, WGMMA_SWIZZLE_128B), ks > 0);
    }
    wgmma_commit();
}

// acc (64 x HD) += A (64 x 64 queries, from registers) Bt (64 queries x HD, MN-major): k-step kk 16 queries (2048
// bytes) on, LBO the panel size between 64-dim panels, SBO 1024 between 8-row groups. Not committed
template <int HD> __device__ __forceinline__ void wgb_issue_rs(float (&acc)[HD / 2], const uint32_t (&a)[4][4], const char* Bt) {
    for (int kk = 0; kk < 4; kk++)
        wgmma_bf16_rs<HD, 1>(acc, a[kk], wgmma_desc(Bt + kk * 16 * 128, 64 * 128, 1024, WGMMA_SWIZZLE_128B), 1);
}

// P and dS of a completed S (s) and dP (dp) of 64 x 64, bwd5's arithmetic: s[i] = S[row 16 warp + g + 8 ((i / 2) % 2)]
// [column 8 (i / 4) + 2 t4 + i % 2], rows keys and columns queries (S^T: QROWS false) or rows queries (S: QROWS true); lt,
// Dt the queries' lse (log2 units) and D from q0, k0 the first key. P into s, dS into dp; dSs (not null): dS^T stored
// transposed as bf16 (query rows of 64 keys, 128B-swizzled)
template <bool QROWS>
__device__ __forceinline__ void wgb_softmax_grad(float (&s)[32], float (&dp)[32], char* dSs, const float* lt, const float* Dt, int k0, int q0,
                                                 float sl2) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    for (int i = 0; i < 32; i++) {
        const int r = 16 * warp + g + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * t4 + i % 2, kr = QROWS ? c : r, qi = QROWS ? r : c;
        float p = q0 + qi < k0 + kr ? 0.0f : exp2f(s[i] * sl2 - lt[qi]);
        s[i] = p;
        dp[i] = p * (dp[i] - Dt[qi]);
        if (dSs) *(floatX*)(dSs + qi * 128 + (((kr / 8) ^ (qi % 8)) * 16) + (kr % 8) * 2) = __float2bfloat16(dp[i]);
    }
}
// a 64 x 64 accumulator x rounded to bf16 as the A fragments of its 4 k-steps (f[kk]: rows g, g + 8; columns 16 kk + 2 t4 (+ 8))
__device__ __forceinline__ void wgb_pack(uint32_t (&f)[4][4], const float (&x)[32]) {
    for (int kk = 0; kk < 4; kk++)
        for (int q = 0; q < 4; q++) f[kk][q] = pack_bf16x2(x[8 * kk + 2 * q], x[8 * kk + 2 * q + 1]);
}

// a warpgroup's completed (64 x HD) accumulators acc times scale as bf16 pairs into rows row0 .. (< T) of dst (stride ld)
template <int HD>
__device__ __forceinline__ void wgb_store_acc(floatX* dst, size_t ld, const float (&acc)[HD / 2], float scale, int row0, int T) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 16 * warp + g + 8 * r;
        if (row < T)
            for (int n = 0; n < HD / 8; n++)
                *(uint32_t*)(dst + (size_t)row * ld + 8 * n + 2 * t4) = pack_bf16x2(acc[4 * n + 2 * r] * scale, acc[4 * n + 2 * r + 1] * scale);
    }
}

// Q, dO rows q0 .. q0 + 63 of head h (cp.async, not committed), lse (log2 units; +inf past T: P = 0) and D; THREADS
// the block's
template <int HD, int THREADS>
__device__ __forceinline__ void wgb_load_queries(char* Qt, char* dOt, float* lt, float* Dt, const floatX* qkv, const floatX* dout,
                                                 const float* lse, const float* Dbuf, int b, int h, int q0, int T, int H, int KV) {
    const size_t qkv_dim = (size_t)(H + 2 * KV) * HD, C = (size_t)H * HD;
    wgmma_load_rows<HD, THREADS>(Qt, qkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, q0, WGB_BQ, T);
    wgmma_load_rows<HD, THREADS>(dOt, dout + (size_t)b * T * C + (size_t)h * HD, C, q0, WGB_BQ, T);
    if (threadIdx.x < WGB_BQ) {
        const int q = q0 + threadIdx.x;
        const size_t row = ((size_t)b * H + h) * T + q;
        lt[threadIdx.x] = q < T ? lse[row] * FLASH_LOG2E : INFINITY;
        Dt[threadIdx.x] = q < T ? Dbuf[row] : 0.0f;
    }
}

// dQ columns 64 c .. of the query tile (the completed fragment dq; v2: then dq2, the next 64 keys') onto the key tiles
// before (dq_acc, FP32) in their order; the last key tile writes bf16 dQ scale into dqkv (rows < T)
__device__ __forceinline__ void wgb_store_dq(floatX* dQg, size_t qkv_dim, float* acc, int HD, const float (&dq)[32], const float* dq2, int c,
                                             int q0, int T, bool first, bool last, float scale) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    for (int n = 0; n < 8; n++)
        for (int r = 0; r < 2; r++) {
            const int q = q0 + 16 * warp + g + 8 * r, col = 64 * c + 8 * n + 2 * t4;
            if (q >= T) continue;
            // v2: the block's second 64 keys first, then its first (bwd5's order of 64-key tiles: downwards)
            float2 v = dq2 ? make_float2(dq2[4 * n + 2 * r], dq2[4 * n + 2 * r + 1]) : make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
            if (!first) {   // L2 (.cg): the previous key tile's block wrote it, maybe on another SM
                float2 prev = __ldcg((const float2*)(acc + (size_t)q * HD + col));
                v = make_float2(prev.x + v.x, prev.y + v.y);
            }
            if (dq2) v = make_float2(v.x + dq[4 * n + 2 * r], v.y + dq[4 * n + 2 * r + 1]);
            if (last) *(uint32_t*)(dQg + (size_t)q * qkv_dim + col) = pack_bf16x2(v.x * scale, v.y * scale);
            else __stcg((float2*)(acc + (size_t)q * HD + col), v);
        }
}

// dQ's product of key chunk j (64 keys): dq (64 x 64) = dS[:, j] (dSj: queries x 64 keys, K-major) K[j, 64 c ..] (Kj: the
// chunk's first key in the panel of head dims 64 c .., MN-major: 16 keys a k-step, 2048 bytes), issued and committed
__device__ __forceinline__ void wgb_issue_dq(float (&dq)[32], const char* dSj, const char* Kj) {
    wgmma_fence();
    for (int ks = 0; ks < 4; ks++)
        wgmma_bf16_ss<64, 0, 1>(dq, wgmma_desc(dSj + 32 * ks, 16, 1024, WGMMA_SWIZZLE_128B),
                                wgmma_desc(Kj + ks * 16 * 128, 64 * 128, 1024, WGMMA_SWIZZLE_128B), ks > 0);
    wgmma_commit();
}

// dQ's part of a v1 / v2 iteration (after dV, dK completed): dQ (64 x HD) = dS K, 64 head dims at a time, onto the key
// tiles before in their turn (a semaphore per query tile); ends with the barrier after which the buffers may be refilled
template <int HD, int NWG>
__device__ __forceinline__ void wgb_dq_step(floatX* dqkv, float* dq_acc, int* dq_sem, const char* dSs, const char* Ks, int it, int nqi,
                                            int b, int h, int qt, int kt, int T, int H, size_t qkv_dim, float scale) {
    constexpr int KPS = 64 * NWG * 128;
    const int wg = NWG == 1 ? 0 : threadIdx.x / 128, nqt = (T - 1) / WGB_BQ + 1, q0 = qt * WGB_BQ;
    // bwd5's order: the query tile's last key tile (qt / NWG) first, key tile 0 last; turn: the key tiles before this one
    const int turn = it % nqi / NWG;   // (= qt / NWG - kt)
    const bool first = turn == 0, last = kt == 0;
    int* sem = dq_sem + ((size_t)b * H + h) * nqt + qt;
    float* acc = dq_acc + ((size_t)b * H + h) * T * HD;
    floatX* dQg = dqkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
    for (int c = 0; c < (NWG == 1 ? HD / 64 : 1); c++) {
        float dq[32] = {}, dq2[32] = {};
        wgb_issue_dq(dq, dSs, Ks + (c + wg) * KPS);
        if constexpr (NWG == 2) wgb_issue_dq(dq2, dSs + 64 * 128, Ks + wg * KPS + 64 * 128);
        wgmma_wait<0>();
        wgmma_fence_operand(dq);
        if constexpr (NWG == 2) wgmma_fence_operand(dq2);   // (v1: no registers held for it)
        if (c == 0) {
            if (threadIdx.x == 0 && !first)
                while (*(volatile int*)sem != turn) {}
            __threadfence();
            __syncthreads();
        }
        wgb_store_dq(dQg, qkv_dim, acc, HD, dq, NWG == 2 ? dq2 : nullptr, c + wg, q0, T, first, last, scale);
    }
    __threadfence();   // the sums reach L2 before the next key tile is let in
    __syncthreads();   // (also: every warp done with this iteration's buffers, dS)
    if (threadIdx.x == 0 && !(first && last)) *(volatile int*)sem = last ? 0 : turn + 1;
}

// v1 (NWG 1) and v2 (NWG 2, hd 128): NWG warpgroups, warpgroup w owning keys 64 w .. of the block's 64 NWG. v2's dQ: warpgroup
// w the head dims 64 w .. over both key chunks, summed chunk by chunk (bwd5's order). PLANT 1 (v1): without the barrier that
// orders the dS stores before dQ's wgmma reads them, the negative control. DQ false: v3's dk/dv kernel (no dS, dQ, semaphores;
// the key tile from blockIdx, tile 0 of every head first: the most queries first)
template <int HD, int NWG, int PLANT, bool DQ>
__global__ void __launch_bounds__(128 * NWG)
attention_backward_wgmma(floatX* dqkv, float* dq_acc, int* dq_sem, const floatX* dout, const float* lse, const float* Dbuf,
                         const floatX* qkv, int T, int H, int KV) {
    static_assert(NWG == 1 || HD == 128 || !DQ, "v2 splits dQ's 128 head dims between its 2 warpgroups");
    constexpr int TB = 64 * HD * 2, KR = 64 * NWG, KPS = KR * 128, THREADS = 128 * NWG;   // (KPS: a K/V panel's bytes)
    // the swizzle repeats every 1024 bytes of shared address: the tiles start on such a boundary
    char* Ks = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);   // (KR keys, HD) swizzled panels
    char* Vs = Ks + NWG * TB;
    char* Qs = Vs + NWG * TB;                    // (2 buffers) x TB
    char* dOs = Qs + 2 * TB;                     // (2 buffers) x TB
    char* dSs = dOs + 2 * TB;                    // (DQ) NWG x (64 queries, 64 keys) bf16, swizzled
    float* ls = (float*)(dSs + (DQ ? NWG * 64 * 128 : 0));   // (2, 64)
    float* Ds = ls + 2 * WGB_BQ;                 // (2, 64)
    __shared__ int ticket;
    const int nqt = (T - 1) / WGB_BQ + 1, group = H / KV, wg = NWG == 1 ? 0 : threadIdx.x / 128;
    int kt, kvh, b;
    if constexpr (DQ) {
        // the key tile from a ticket, counted down: the last first (bwd5's reason: key tile j waits for j + 1, which started
        // earlier, so is running or done)
        if (threadIdx.x == 0) ticket = (int)(gridDim.x * gridDim.y * gridDim.z) - 1 - atomicAdd(dq_sem + (size_t)gridDim.z * H * nqt, 1);
        __syncthreads();
        kt = ticket % gridDim.x, kvh = ticket / gridDim.x % gridDim.y, b = ticket / (gridDim.x * gridDim.y);
    } else {   // blocks start in linear order (x fastest): the key tile slowest
        const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        kvh = lin % gridDim.y, b = lin / gridDim.y % gridDim.z, kt = lin / (gridDim.y * gridDim.z);
    }
    const int k0 = kt * KR;
    const size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int nqi = nqt - kt * NWG, n_it = group * nqi;   // (query head of the group, query tile from the diagonal on)
    wgmma_load_rows<HD, THREADS>(Ks, Kg, qkv_dim, k0, KR, T);
    wgmma_load_rows<HD, THREADS>(Vs, Kg + (size_t)KV * HD, qkv_dim, k0, KR, T);
    wgb_load_queries<HD, THREADS>(Qs, dOs, ls, Ds, qkv, dout, lse, Dbuf, b, kvh * group, k0, T, H, KV);
    cp_async_commit();
    float dk[HD / 2], dv[HD / 2];
    for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.0f;
    for (int it = 0; it < n_it; it++) {
        if (it + 1 < n_it) {   // the next query tile into the other buffer (its last reader finished before the last barrier)
            const int nb = (it + 1) % 2;
            wgb_load_queries<HD, THREADS>(Qs + nb * TB, dOs + nb * TB, ls + nb * WGB_BQ, Ds + nb * WGB_BQ, qkv, dout, lse, Dbuf, b,
                                          kvh * group + (it + 1) / nqi, (kt * NWG + (it + 1) % nqi) * WGB_BQ, T, H, KV);
        }
        cp_async_commit();
        cp_async_wait<1>();    // this tile landed for this thread...
        wgmma_fence_proxy();   // ...visible to the asynchronous proxy...
        __syncthreads();       // ...for every thread (and lt, Dt)
        const char *Qt = Qs + it % 2 * TB, *dOt = dOs + it % 2 * TB;
        const float *lt = ls + it % 2 * WGB_BQ, *Dt = Ds + it % 2 * WGB_BQ;
        const int h = kvh * group + it / nqi, qt = kt * NWG + it % nqi, q0 = qt * WGB_BQ;
        float s[32] = {}, dp[32] = {};
        wgb_issue_kk<HD, KPS>(s, Ks + wg * 64 * 128, Qt);
        wgb_issue_kk<HD, KPS>(dp, Vs + wg * 64 * 128, dOt);
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        wgmma_fence_operand(dp);
        uint32_t pf[4][4], df[4][4];
        wgb_softmax_grad<false>(s, dp, DQ ? dSs + wg * 64 * 128 : nullptr, lt, Dt, k0 + 64 * wg, q0, sl2);
        wgb_pack(pf, s);
        wgb_pack(df, dp);
        wgmma_fence_operand(dv);
        wgmma_fence_operand(dk);
        wgmma_fence();
        wgb_issue_rs<HD>(dv, pf, dOt);
        wgb_issue_rs<HD>(dk, df, Qt);
        wgmma_commit();
        if constexpr (DQ) {
            wgmma_fence_proxy();                     // dS's stores visible to the asynchronous proxy...
            if constexpr (!PLANT) __syncthreads();   // ...of every warp's keys, before dQ's wgmma reads them
        }
        wgmma_wait<0>();   // dV, dK complete (P^T, dS^T's registers free for dQ's: no spill at hd 128)
        wgmma_fence_operand(dv);
        wgmma_fence_operand(dk);
        if constexpr (DQ) wgb_dq_step<HD, NWG>(dqkv, dq_acc, dq_sem, dSs, Ks, it, nqi, b, h, qt, kt, T, H, qkv_dim, scale);
        else __syncthreads();   // every warp done with this iteration's Q, dO buffer before the copy after next over it
    }
    // dK scale, dV as bf16 pairs, keys < T
    floatX* dK = dqkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    wgb_store_acc<HD>(dK, qkv_dim, dk, scale, k0 + 64 * wg, T);
    wgb_store_acc<HD>(dK + (size_t)KV * HD, qkv_dim, dv, 1.0f, k0 + 64 * wg, T);
}

// the dq kernel's S, dP (64 x 64) = Q K^T, dO V^T of the warpgroup's rows (Qw, dOw: 64-row tiles) and a key tile (Kt, Vt)
// issued and waited for; dS = P (dP - D) (lw, Dw: the rows' lse, D; k0, wq0 the first key, row) rounded into df
template <int HD>
__device__ __forceinline__ void wgb_dq_ds(float (&s)[32], float (&dp)[32], uint32_t (&df)[4][4], const char* Qw, const char* dOw, const char* Kt,
                                          const char* Vt, const float* lw, const float* Dw, int k0, int wq0, float sl2) {
    wgb_issue_kk<HD, 64 * 128>(s, Qw, Kt);
    wgb_issue_kk<HD, 64 * 128>(dp, dOw, Vt);
    wgmma_wait<0>();
    wgmma_fence_operand(s);
    wgmma_fence_operand(dp);
    wgb_softmax_grad<true>(s, dp, nullptr, lw, Dw, k0, wq0, sl2);
    wgb_pack(df, dp);
}

// v3's dq kernel, the wgmma forward's shape: grid (H, B, 128-query tiles, the last (longest) first: the tile slowest, as the
// pair's), 2 warpgroups x 64 query rows; over the key tiles up to the block's last row in order (K, V tiles copied by
// cp.async): S = Q K^T, dP = dO V^T (K-major ss), dS = P (dP - D), dQ += dS K (dS from registers, K MN-major); dQ scale
// stored as bf16 from the accumulators. No branch around a wgmma: warpgroup 0 also runs the block's last key tile when
// that is past its rows, wholly masked (dS = 0, dQ unchanged).
//   OVL false (v3): per tile S, dP issued and waited for, dS, dQ += dS K issued and waited for; 2 K/V buffers, a barrier
//     at the end of the tile. PLANT 1: without it (tile j + 2 copied over tile j, which the other warpgroup's wgmma may
//     still read: the race detector's negative control)
//   OVL true (v4): FlashAttention-3's intra-warpgroup overlap (the wgmma forward v2's order): iteration j issues S(j + 1),
//     dP(j + 1) and dQ += dS(j) K(j), waits for S, dP only, runs their dS while dS(j) K(j) computes, then waits for that
//     and packs dS(j + 1). 3 K/V buffers (tile j + 2 into tile j - 1's: every warpgroup completed its reads before the
//     barrier at the top of iteration j); one barrier per tile. The last iteration issues S, dP of its own tile again,
//     wholly masked (unused). PLANT 1: 2 buffers (tile j + 2 copied over K(j), which dQ(j) reads)
template <int HD, bool OVL, int PLANT>
__global__ void __launch_bounds__(256)
attention_backward_wgmma_dq(floatX* dqkv, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv, int T, int H, int KV) {
    constexpr int TB = 64 * HD * 2, NB = OVL && !PLANT ? 3 : 2;
    char* Qs = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);   // (2 warpgroups) x TB, swizzled
    char* dOs = Qs + 2 * TB;                // (2 warpgroups) x TB
    char* Ks = dOs + 2 * TB;                // (NB buffers) x TB
    char* Vs = Ks + NB * TB;                // (NB buffers) x TB
    float* ls = (float*)(Vs + NB * TB);     // (128) lse, log2 units
    float* Ds = ls + 2 * WGB_BQ;            // (128)
    const int wg = threadIdx.x / 128, h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    const int q0 = (gridDim.z - 1 - blockIdx.z) * 2 * WGB_BQ, wq0 = q0 + 64 * wg;   // (the warpgroup's first row)
    const size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int ntiles = (min(q0 + 2 * WGB_BQ, T) - 1) / WGB_BC + 1;   // causal: keys up to the block's last row
    const char *Qw = Qs + wg * TB, *dOw = dOs + wg * TB;
    const float *lw = ls + wg * WGB_BQ, *Dw = Ds + wg * WGB_BQ;
    for (int w = 0; w < 2; w++)
        wgb_load_queries<HD, 256>(Qs + w * TB, dOs + w * TB, ls + w * WGB_BQ, Ds + w * WGB_BQ, qkv, dout, lse, Dbuf, b, h, q0 + 64 * w, T, H, KV);
    wgmma_load_rows<HD, 256>(Ks, Kg, qkv_dim, 0, WGB_BC, T);
    wgmma_load_rows<HD, 256>(Vs, Vg, qkv_dim, 0, WGB_BC, T);
    cp_async_commit();
    float dq[HD / 2], s[32] = {}, dp[32] = {};
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.0f;
    uint32_t df[4][4];
    if constexpr (!OVL) {
        for (int j = 0; j < ntiles; j++) {
            if (j + 1 < ntiles) {   // tile j + 1 into the other buffer (its last readers finished before the last barrier)
                wgmma_load_rows<HD, 256>(Ks + (j + 1) % 2 * TB, Kg, qkv_dim, (j + 1) * WGB_BC, WGB_BC, T);
                wgmma_load_rows<HD, 256>(Vs + (j + 1) % 2 * TB, Vg, qkv_dim, (j + 1) * WGB_BC, WGB_BC, T);
            }
            cp_async_commit();
            cp_async_wait<1>();    // tile j (and Q, dO) landed for this thread...
            wgmma_fence_proxy();   // ...visible to the asynchronous proxy...
            __syncthreads();       // ...for every thread (and lse, D)
            const char* Kt = Ks + j % 2 * TB;
            wgb_dq_ds<HD>(s, dp, df, Qw, dOw, Kt, Vs + j % 2 * TB, lw, Dw, j * WGB_BC, wq0, sl2);
            wgmma_fence_operand(dq);
            wgmma_fence();
            wgb_issue_rs<HD>(dq, df, Kt);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            if constexpr (!PLANT) __syncthreads();   // both warpgroups done with buffer j % 2 before tile j + 2 is copied over it
        }
    } else {
        if (ntiles > 1) {
            wgmma_load_rows<HD, 256>(Ks + TB, Kg, qkv_dim, WGB_BC, WGB_BC, T);
            wgmma_load_rows<HD, 256>(Vs + TB, Vg, qkv_dim, WGB_BC, WGB_BC, T);
        }
        cp_async_commit();
        cp_async_wait<1>();   // Q, dO and tile 0
        wgmma_fence_proxy();
        __syncthreads();
        wgb_dq_ds<HD>(s, dp, df, Qw, dOw, Ks, Vs, lw, Dw, 0, wq0, sl2);
        for (int j = 0; j < ntiles; j++) {
            cp_async_wait<0>();   // tile j + 1 landed for this thread, for every thread after the barrier
            wgmma_fence_proxy();
            __syncthreads();
            if (j + 2 < ntiles) {
                wgmma_load_rows<HD, 256>(Ks + (j + 2) % NB * TB, Kg, qkv_dim, (j + 2) * WGB_BC, WGB_BC, T);
                wgmma_load_rows<HD, 256>(Vs + (j + 2) % NB * TB, Vg, qkv_dim, (j + 2) * WGB_BC, WGB_BC, T);
            }
            cp_async_commit();
            const int jn = min(j + 1, ntiles - 1) % NB;
            wgb_issue_kk<HD, 64 * 128>(s, Qw, Ks + jn * TB);
            wgb_issue_kk<HD, 64 * 128>(dp, dOw, Vs + jn * TB);
            wgmma_fence_operand(dq);
            wgmma_fence();
            wgb_issue_rs<HD>(dq, df, Ks + j % NB * TB);
            wgmma_commit();
            wgmma_wait<1>();   // S(j + 1), dP(j + 1) complete (dS(j) K(j) may not be)
            wgmma_fence_operand(s);
            wgmma_fence_operand(dp);
            wgb_softmax_grad<true>(s, dp, nullptr, lw, Dw, (j + 1 < ntiles ? j + 1 : ntiles + 2) * WGB_BC, wq0, sl2);
            wgmma_wait<0>();   // dS(j) K(j) complete: its A registers may be rewritten
            wgmma_fence_operand(dq);
            wgb_pack(df, dp);
        }
    }
    wgb_store_acc<HD>(dqkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, dq, scale, wq0, T);
}

static size_t wgb_sem_ints(int B, int T, int H) { return (size_t)B * H * ceil_div(T, WGB_BQ) + 1; }   // (+ the ticket)

template <int HD, int NWG, int PLANT, bool DQ>
static size_t wgb_smem_set() {   // K, V (NWG tiles each), 2 x Q, dO, dS (DQ: NWG tiles of 64 x 64), lse, D, the alignment
    size_t smem = (size_t)(2 * NWG + 4) * 64 * HD * 2 + (DQ ? NWG * 64 * 128 : 0) + 4 * WGB_BQ * sizeof(float) + 1024;
    cudaCheck(cudaFuncSetAttribute(attention_backward_wgmma<HD, NWG, PLANT, DQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return smem;
}
template <int HD, int NWG, int PLANT>
static void attention_backward_wgmma_hd(floatX* dqkv, float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout, const floatX* out,
                                        const float* lse, const floatX* qkv, int B, int T, int H, int KV) {
    size_t smem = wgb_smem_set<HD, NWG, PLANT, true>();
    int nsem = (int)wgb_sem_ints(B, T, H);
    LAUNCH(flash_attention_backward_D_kernel, ceil_div(std::max((long long)B * T * H * 32, (long long)nsem), 128), 128, 0, 0, Dbuf, dq_sem,
           dout, out, B, T, H, HD, nsem);
    auto kernel = attention_backward_wgmma<HD, NWG, PLANT, true>;
    LAUNCH(kernel, dim3(ceil_div(T, 64 * NWG), KV, B), 128 * NWG, smem, 0, dqkv, dq_acc, dq_sem, dout, lse, Dbuf, qkv, T, H, KV);
}
// v3 (OVL false), v4 (OVL true): the D kernel, then the dq kernel and the dk/dv kernel (2 warpgroups on 128 keys), no
// scratch but D. parts: which of them (1 D, 2 dq, 4 dk/dv; the timing of each)
template <int HD, bool OVL, int PLANT>
static void attention_backward_wgmma_pair(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                          const floatX* qkv, int B, int T, int H, int KV, int parts) {
    auto dq_kernel = attention_backward_wgmma_dq<HD, OVL, PLANT>;
    auto dkv_kernel = attention_backward_wgmma<HD, 2, 0, false>;
    size_t smem_kv = wgb_smem_set<HD, 2, 0, false>();
    // Q, dO (128 rows), K, V (2 or 3 buffers), lse, D, the alignment
    size_t smem_q = (size_t)(4 + 2 * (OVL && !PLANT ? 3 : 2)) * 64 * HD * 2 + 4 * WGB_BQ * sizeof(float) + 1024;
    cudaCheck(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    if (parts & 1)
        LAUNCH(flash_attention_backward_D_kernel, ceil_div((long long)B * T * H * 32, 128), 128, 0, 0, Dbuf, (int*)nullptr, dout, out, B, T,
               H, HD, 0);
    if (parts & 2) LAUNCH(dq_kernel, dim3(H, B, ceil_div(T, 2 * WGB_BQ)), 256, smem_q, 0, dqkv, dout, lse, Dbuf, qkv, T, H, KV);
    if (parts & 4)
        LAUNCH(dkv_kernel, dim3(ceil_div(T, 128), KV, B), 256, smem_kv, 0, dqkv, (float*)nullptr, (int*)nullptr, dout, lse, Dbuf, qkv, T, H,
               KV);
}
// V 1, 2, 3, 4: v1, v2 (hd 128 only), v3, v4; PLANT 1: v1's dS race, v3's and v4's K/V races
template <int V, int PLANT>
static void attention_backward_wgmma_gpu(floatX* dqkv, float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout, const floatX* out,
                                         const float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd, int parts = 7) {
    constexpr int NWG = V == 2 ? 2 : 1;
    if constexpr (V >= 3) {
        if (hd == 128) attention_backward_wgmma_pair<128, V == 4, PLANT>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, parts);
        else attention_backward_wgmma_pair<64, V == 4, PLANT>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, parts);
    } else if (hd == 128) attention_backward_wgmma_hd<128, NWG, PLANT>(dqkv, Dbuf, dq_acc, dq_sem, dout, out, lse, qkv, B, T, H, KV);
    else if constexpr (V != 2) attention_backward_wgmma_hd<64, NWG, PLANT>(dqkv, Dbuf, dq_acc, dq_sem, dout, out, lse, qkv, B, T, H, KV);
}

// validates the wgmma backward (and bwd5, and the model's dq + dk/dv pair alongside) against the CPU reference at a shape;
// with `time_too` (a GPU) times them. only: the wgmma version to run (0: all); plant 1, 2: v1, v3 planted (their race)
static void run_shape(int B, int T, int H, int KV, int hd, bool time_too, int only, int plant = 0) {
    int qd = (H + 2 * KV) * hd, C = H * hd;
    printf("B %d, T %d, H %d, KV %d, hd %d\n", B, T, H, KV, hd);
    std::vector<float> qkv = round_bf16(make_random((size_t)B * T * qd, 1, 1.5));
    std::vector<float> dout = round_bf16(make_random((size_t)B * T * C, 2));
    size_t no = (size_t)B * T * C, nl = (size_t)B * H * T, nq = qkv.size();
    floatX *dq = to_device_bf16v(qkv), *dy = deviceAlloc(floatX, no), *ddout = to_device_bf16v(dout), *ddq = deviceAlloc(floatX, nq);
    float *dlse = deviceAlloc(float, nl), *dD = deviceAlloc(float, nl), *d_acc = deviceAlloc(float, flash_bwd5_acc_floats(B, T, H, hd));
    int* d_sem = deviceAlloc(int, std::max(flash_bwd5_sem_ints(B, T, H), wgb_sem_ints(B, T, H)));
    double flops = 2.5 * 4.0 * B * H * hd * (double)T * (T + 1) / 2;   // (FlashAttention's count: 2.5x the forward)
    const char* names[6] = {"backward bwd5 (CP's, mma.sync)", "backward wgmma v1", "backward wgmma v2 (2 warpgroups)",
                            "backward dq + dk/dv (model's, mma.sync)", "backward wgmma v3 (dq + dk/dv)", "backward wgmma v4 (v3, dq overlap)"};
    // (index: 0 bwd5, 1 .. 2 v1 .. v2, 3 the pair, 4 .. 5 v3 .. v4; parts: v3, v4's kernels to run)
#define WGB_RUN(V) [&](int parts) { if (plant) attention_backward_wgmma_gpu<V, 1>(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd, parts); \
                                    else attention_backward_wgmma_gpu<V, 0>(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd, parts); }
    std::function<void(int)> bwd[6] = {
        [&](int) { flash_attention_backward5_gpu(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        WGB_RUN(1),
        [&](int) { attention_backward_wgmma_gpu<2, 0>(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        [&](int) { flash_attention_backward_gpu(ddq, dD, ddout, dy, dlse, dq, B, T, H, KV, hd); },   // (timed beside them)
        WGB_RUN(3), WGB_RUN(4),
    };
#undef WGB_RUN
    flash_attention_forward_gpu(dy, dlse, dq, B, T, H, KV, hd);   // out and lse: the product's forward
    // the CPU reference where it is cheap (emulated shapes, or B * T * T * H small); else the first version run's result
    // (bwd5's; -v 3: the pair's)
    bool cpu = EMULATED || (double)B * T * T * H <= 1e9;
    std::vector<float> want(nq), runs[6];
    if (cpu) {
        std::vector<float> out(no), lse(nl);
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
        attention_backward(want.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd);
    }
    std::vector<int> order = only == 3 ? std::vector<int>{3, 4, 5} : only == 4 ? std::vector<int>{3, 5} : only ? std::vector<int>{0, only, 3}
                           : std::vector<int>{0, 1, 2, 3, 4, 5};
    if (plant) order = plant == 1 ? std::vector<int>{0, 1} : std::vector<int>{3, plant + 2};
    const char* ref = nullptr;
    for (int v : order) {
        if (v == 2 && hd != 128) continue;   // (v2: hd 128)
        cudaCheck(cudaMemset(ddq, 0xFF, nq * sizeof(floatX)));
        bwd[v](7);
        runs[v] = from_device_bf16v(ddq, nq);
        if (!cpu && !ref) { want = runs[v]; ref = v == 0 ? " vs bwd5" : " vs the pair"; }
        else {
            char what[96];
            snprintf(what, sizeof what, "%s%s", names[v], cpu ? "" : ref);
            validate(what, runs[v], want, 1e-2, 1e-2);
        }
        // emulated, v1 and v2 sum in bwd5's k order, v3 in the pair's (the emulator's mma.sync and wgmma: k order, fp32 after
        // each add), with the same elementwise arithmetic: the same bits (a GPU's wgmma may order the sums otherwise)
        if (EMULATED && v != 0 && v != 3) {
            bool same = !memcmp(runs[v].data(), runs[v >= 4 ? 3 : 0].data(), nq * sizeof(float));
            validate(v >= 4 ? "  wgmma = the pair bit for bit" : "  wgmma = bwd5 bit for bit", {same ? 0.0f : 1.0f}, {0.0f}, 0.0, 0.0);
        }
        if (time_too) report_flops(names[v], flops, time_ms(3, [&] { bwd[v](7); }));
        if (time_too && v >= 4) {   // v3, v4's kernels one by one (their own products' FLOPs: 3 and 4 of the 5 counted)
            report_flops(v == 4 ? "  its dq kernel (3 products)" : "  its dq kernel (overlapped)", 0.6 * flops, time_ms(3, [&] { bwd[v](2); }));
            if (v == 4) report_flops("  its dk/dv kernel (4 products)", 0.8 * flops, time_ms(3, [&] { bwd[v](4); }));
        }
    }
    for (void* p : {(void*)dq, (void*)dy, (void*)ddout, (void*)ddq, (void*)dlse, (void*)dD, (void*)d_acc, (void*)d_sem}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    int B = 8, T = 4096, H = 48, KV = 8, hd = 128, plant = 0, only = 0;
    bool shape_given = false;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        int x = atoi(argv[i + 1]);
        int* dst = !strcmp(argv[i], "-b") ? &B : !strcmp(argv[i], "-t") ? &T : !strcmp(argv[i], "-h") ? &H : !strcmp(argv[i], "-k") ? &KV
                 : !strcmp(argv[i], "-d") ? &hd : !strcmp(argv[i], "-p") ? &plant : !strcmp(argv[i], "-v") ? &only : nullptr;
        if (!dst || x <= 0 || (dst == &plant && x > 3) || (dst == &only && x > 4)) {
            fprintf(stderr, "usage: %s [-v 1|2|3|4] [-b B] [-t T] [-h H] [-k KV] [-d hd (64 or 128)] [-p 1|2|3 (emulated: v1's, v3's, v4's race)]\n",
                    argv[0]);
            return 2;
        }
        *dst = x;
        shape_given |= dst != &plant && dst != &only;
    }
    if ((hd != 64 && hd != 128) || H % KV) { fprintf(stderr, "%s: hd %d must be 64 or 128 and H %d a multiple of KV %d\n", argv[0], hd, H, KV); return 2; }
    print_header("attention, wgmma backward", "causal GQA");
    if (plant) {   // the race detector's negative controls: v1's dQ wgmma reads dS without the barrier after its stores; v3's
                   // dq kernel copies K, V tile j + 2 over tile j without the barrier after the wgmma reading it (3 key tiles);
                   // v4's with 2 buffers copies it over K(j) while dQ(j) reads it
        if (!EMULATED) { fprintf(stderr, "%s: -p is for the emulated builds\n", argv[0]); return 2; }
        run_shape(1, 130, 6, 1, 128, false, 0, plant);
    } else if (EMULATED && !shape_given) {
        // DBRX's head_dim 128 and GQA 6:1 (48 / 8 scaled down); T short of a tile (77, 130), B 2's offsets, 5 key tiles
        // (320); head_dim 64; 2 kv heads (dbrx-1b's GQA 4:1 halved)
        // (the race build: 2 heads, the same tiles and GQA sharing, a third of the checked accesses)
#if defined(SIMT_RACE_DETECT)
        const int shapes[][5] = {{2, 77, 2, 1, 128}, {1, 320, 2, 1, 128}, {1, 130, 2, 1, 64}};
#else
        const int shapes[][5] = {{2, 77, 6, 1, 128}, {1, 320, 6, 1, 128}, {1, 130, 6, 1, 64}, {1, 256, 4, 2, 128}};
#endif
        for (const auto& s : shapes) run_shape(s[0], s[1], s[2], s[3], s[4], false, only);
    } else {
        if (!EMULATED) run_shape(1, 1024, H, KV, hd, false, only);   // against the CPU first
        run_shape(B, T, H, KV, hd, !EMULATED, only);
    }
    return finish();
}
