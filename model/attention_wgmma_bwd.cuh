/*
 * attention_wgmma_bwd.cuh — the model's causal GQA flash attention backward at head_dim 64 and 128 on Hopper's warpgroup
 * MMA (model/wgmma.cuh), under --attention-bwd wgmma | wgmma-overlap (the default, mma, runs attention_flash_bwd.cuh's
 * mma.sync pair; so do head_dim 32 and context parallelism's chunk pairs, attention_flash_bwd5.cuh). The pair's contract
 * and its 7 products, no semaphores and no scratch but D: from qkv (B, T, (H + 2 KV) hd) after RoPE, out, dout
 * (B, T, H hd) and lse (B, H, T), dqkv (B, T, (H + 2 KV) hd) overwritten; Dbuf (B, H, T) FP32 scratch. Three launches:
 *   D kernel     D (B, H, T) = rowsum(dout * out) (attention_flash_bwd5.cuh's, one warp a row)
 *   dq kernel    grid (H, B, T/128 query tiles, the last first), 2 warpgroups x 64 query rows, the wgmma forward's shape:
 *                Q, dO (128 rows) copied once, K, V tiles of 64 keys by cp.async into the 128B-swizzled layout
 *                (attention_wgmma_fwd.cuh's wgmma_load_rows); per key tile up to the block's last row, in order:
 *                  S, dP (64 x 64) = Q K^T, dO V^T    wgmma m64n64k16, both operands K-major from shared memory
 *                  dS = P (dP - D), P = exp(S scale - lse) (causal mask) on the accumulators
 *                  dQ (64 x hd) += dS K               m64n(hd)k16, A = dS from registers (rounded to bf16), K MN-major
 *                dQ scale stored as bf16 pairs from the accumulators. wgmma: each group waited for before the next;
 *                wgmma-overlap: FlashAttention-3's intra-warpgroup overlap (the wgmma forward's order: S, dP of tile
 *                j + 1 issued with dQ += dS(j) K(j), their dS computed while that runs; 3 K/V buffers)
 *   dk/dv kernel grid (T/128 key tiles, KV, B), key tile 0 of every head first; 2 warpgroups x 64 keys sharing the Q, dO
 *                tiles (every query head of the kv group, from the diagonal on, double-buffered):
 *                  S^T, dP^T (64 x 64) = K Q^T, V dO^T   ss, K-major
 *                  dV (64 x hd) += P^T dO, dK += dS^T Q  A from registers, dO, Q MN-major (head dims contiguous)
 *                dK scale, dV stored as bf16 pairs
 * Under the emulator the results are the pair's bit for bit (the same k-order sums, and the same elementwise arithmetic:
 * dQ over all keys in one accumulator, key tiles in order; dK, dV over the group's heads and queries; a wholly masked
 * tile adds zeros; S scale - lse one FMA in both); test_kernels and test/test_attention_bwd.sh check it, the latter on a
 * training step. First timed on session 45's H100, 2026-11-28 (dev/cuda/attention_wgmma_bwd -v 3 times both beside the
 * pair; dev/bench/results_gpu.md). No branch around
 * a wgmma (ptxas serializes every wgmma of a kernel where one is in a path it cannot prove warpgroup-uniform).
 * Registers (nvcc 13, sm_90a, the product build; hd 128 / 64): the dq kernel 180 / 149, overlapped 199 / 159, the dk/dv
 * kernel 249 / 183 (the pair's: dq 227 / 162, dk/dv 247 / 165); no spill, no wgmma serialization (the document mask's
 * data-dependent first key tile and last query tile included); one block an SM, as before the mask (177 / 145, 191 / 159,
 * 254 / 188; the pair's 223 / 159, 245 / 162).
 */
#pragma once
#include "attention_flash_bwd5.cuh"   // (the D kernel)
#include "attention_wgmma_fwd.cuh"    // (wgmma_load_rows, the 128B-swizzled tile copy)

#define WGB_BQ 64   // queries per tile
#define WGB_BC 64   // keys of a block (one warpgroup)

// --attention-bwd (train_cuda.cuh sets it): 0 mma (the pair), 1 wgmma, 2 wgmma-overlap; at head_dim 64 and 128 (attention.cuh)
inline int g_attention_bwd = 0;

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
// Dt the queries' lse (log2 units) and D from q0, k0 the first key; lim, the document mask (attention.cuh) of this thread's
// two rows (r 0, 1: (i / 2) % 2): the first key a query row sees (QROWS), the first query that no longer sees a key row
// (not QROWS; T: none). P into s, dS into dp; dSs (not null): dS^T stored
// transposed as bf16 (query rows of 64 keys, 128B-swizzled). S scale - lse as one explicit FMA, as the pair and bwd5 compute
// it: nvcc contracts it so anyway, g++ (the emulator) where its optimizer sees fit, which differed between the kernels
template <bool QROWS>
__device__ __forceinline__ void wgb_softmax_grad(float (&s)[32], float (&dp)[32], char* dSs, const float* lt, const float* Dt, int k0, int q0,
                                                 float sl2, const int lim[2]) {
    const int warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
    for (int i = 0; i < 32; i++) {
        const int r = 16 * warp + g + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * t4 + i % 2, kr = QROWS ? c : r, qi = QROWS ? r : c;
        const bool doc_masked = QROWS ? k0 + kr < lim[(i / 2) % 2] : q0 + qi >= lim[(i / 2) % 2];
        float p = q0 + qi < k0 + kr || doc_masked ? 0.0f : exp2f(fmaf(s[i], sl2, -lt[qi]));
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

// The keys kernel: NWG warpgroups, warpgroup w owning keys 64 w .. of the block's 64 NWG, over the query tiles of every query
// head of the kv group from the diagonal on (Q, dO double-buffered): S^T, dP^T = K Q^T, V dO^T (ss, K-major), P^T and
// dS^T on the accumulators, dV += P^T dO, dK += dS^T Q (A from registers, Q and dO MN-major); dK scale, dV stored as bf16.
// DQ, the policy of the dQ product: the model's WgbNoDq (none: the pair's dk/dv kernel, NWG 2, the key tile from blockIdx,
// tile 0 of every head first: the most queries first); dev/cuda/attention_wgmma_bwd's v1, v2 add dQ = dS K per tile
// through a semaphore per query tile (DQ::ON: dS^T stored to shared memory and a barrier before dQ's wgmma reads it).
// dk, dv's registers at hd 128: 2 x 64 floats, S^T, dP^T 2 x 32. A DQ::ON policy takes no document mask (doc.start NULL):
// its turn chain needs every key block to visit every query tile, which the mask's skipped query tiles would break.
struct WgbNoDq {
    static constexpr bool ON = false;
    // blocks start in linear order (x fastest): the key tile slowest, every head's tile 0 (the most queries) first
    __device__ void block(int* ticket, int& kt, int& kvh, int& b, int H, int nqt) const {
        (void)ticket, (void)H, (void)nqt;
        const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        kvh = lin % gridDim.y, b = lin / gridDim.y % gridDim.z, kt = lin / (gridDim.y * gridDim.z);
    }
    __device__ void after_issue() const {}
    // every warp done with this iteration's Q, dO buffer before the copy after next over it
    template <int HD, int NWG>
    __device__ void step(floatX*, const char*, const char*, int, int, int, int, int, int, int, int, size_t, float) const { __syncthreads(); }
};
template <int HD, int NWG, class DQ>
__global__ void __launch_bounds__(128 * NWG)
attention_backward_wgmma_keys(floatX* dqkv, DQ dq, const floatX* dout, const float* lse, const float* Dbuf,
                         const floatX* qkv, int T, int H, int KV, DocMask doc) {
    static_assert(NWG == 1 || HD == 128 || !DQ::ON, "v2 splits dQ's 128 head dims between its 2 warpgroups");
    constexpr int TB = 64 * HD * 2, KR = 64 * NWG, KPS = KR * 128, THREADS = 128 * NWG;   // (KPS: a K/V panel's bytes)
    // the swizzle repeats every 1024 bytes of shared address: the tiles start on such a boundary
    char* Ks = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);   // (KR keys, HD) swizzled panels
    char* Vs = Ks + NWG * TB;
    char* Qs = Vs + NWG * TB;                    // (2 buffers) x TB
    char* dOs = Qs + 2 * TB;                     // (2 buffers) x TB
    char* dSs = dOs + 2 * TB;                    // (DQ::ON) NWG x (64 queries, 64 keys) bf16, swizzled
    float* ls = (float*)(dSs + (DQ::ON ? NWG * 64 * 128 : 0));   // (2, 64)
    float* Ds = ls + 2 * WGB_BQ;                 // (2, 64)
    __shared__ int ticket;
    const int nqt = (T - 1) / WGB_BQ + 1, group = H / KV, wg = NWG == 1 ? 0 : threadIdx.x / 128;
    int kt, kvh, b;
    dq.block(&ticket, kt, kvh, b, H, nqt);
    const int k0 = kt * KR;
    const size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    // (query head of the group, query tile from the diagonal on; under the document mask to the last holding a query of the
    // block's last key's document: the later ones see none of the block's keys)
    const int qend = doc.start ? doc.end[(size_t)b * T + min(k0 + KR, T) - 1] : T;
    const int nqi = (qend - 1) / WGB_BQ + 1 - kt * NWG, n_it = group * nqi;
    int lim[2];   // the document mask: where the documents of this thread's two keys end (T: none)
    for (int r = 0; r < 2; r++) {
        const int key = k0 + 64 * wg + 16 * (threadIdx.x % 128 / 32) + threadIdx.x % 32 / 4 + 8 * r;
        lim[r] = doc.start && key < T ? doc.end[(size_t)b * T + key] : T;
    }
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
        wgb_softmax_grad<false>(s, dp, DQ::ON ? dSs + wg * 64 * 128 : nullptr, lt, Dt, k0 + 64 * wg, q0, sl2, lim);
        wgb_pack(pf, s);
        wgb_pack(df, dp);
        wgmma_fence_operand(dv);
        wgmma_fence_operand(dk);
        wgmma_fence();
        wgb_issue_rs<HD>(dv, pf, dOt);
        wgb_issue_rs<HD>(dk, df, Qt);
        wgmma_commit();
        dq.after_issue();
        wgmma_wait<0>();   // dV, dK complete (P^T, dS^T's registers free for dQ's: no spill at hd 128)
        wgmma_fence_operand(dv);
        wgmma_fence_operand(dk);
        dq.template step<HD, NWG>(dqkv, dSs, Ks, it, nqi, b, h, qt, kt, T, H, qkv_dim, scale);
    }
    // dK scale, dV as bf16 pairs, keys < T
    floatX* dK = dqkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    wgb_store_acc<HD>(dK, qkv_dim, dk, scale, k0 + 64 * wg, T);
    wgb_store_acc<HD>(dK + (size_t)KV * HD, qkv_dim, dv, 1.0f, k0 + 64 * wg, T);
}


// the dq kernel's S, dP (64 x 64) = Q K^T, dO V^T of the warpgroup's rows (Qw, dOw: 64-row tiles) and a key tile (Kt, Vt)
// issued and waited for; dS = P (dP - D) (lw, Dw: the rows' lse, D; k0, wq0 the first key, row; lo: the document mask) rounded into df
template <int HD>
__device__ __forceinline__ void wgb_dq_ds(float (&s)[32], float (&dp)[32], uint32_t (&df)[4][4], const char* Qw, const char* dOw, const char* Kt,
                                          const char* Vt, const float* lw, const float* Dw, int k0, int wq0, float sl2, const int lo[2]) {
    wgb_issue_kk<HD, 64 * 128>(s, Qw, Kt);
    wgb_issue_kk<HD, 64 * 128>(dp, dOw, Vt);
    wgmma_wait<0>();
    wgmma_fence_operand(s);
    wgmma_fence_operand(dp);
    wgb_softmax_grad<true>(s, dp, nullptr, lw, Dw, k0, wq0, sl2, lo);
    wgb_pack(df, dp);
}

// the dq kernel (dev/cuda's v3, v4), the wgmma forward's shape: grid (H, B, 128-query tiles, the last (longest) first: the tile slowest, as the
// pair's), 2 warpgroups x 64 query rows; over the key tiles up to the block's last row in order (K, V tiles copied by
// cp.async): S = Q K^T, dP = dO V^T (K-major ss), dS = P (dP - D), dQ += dS K (dS from registers, K MN-major); dQ scale
// stored as bf16 from the accumulators. No branch around a wgmma: warpgroup 0 also runs the block's last key tile when
// that is past its rows, wholly masked (dS = 0, dQ unchanged).
//   OVL false (wgmma, v3): per tile S, dP issued and waited for, dS, dQ += dS K issued and waited for; 2 K/V buffers, a barrier
//     at the end of the tile. PLANT 1: without it (tile j + 2 copied over tile j, which the other warpgroup's wgmma may
//     still read: the race detector's negative control)
//   OVL true (wgmma-overlap, v4): FlashAttention-3's intra-warpgroup overlap (the wgmma forward v2's order): iteration j issues S(j + 1),
//     dP(j + 1) and dQ += dS(j) K(j), waits for S, dP only, runs their dS while dS(j) K(j) computes, then waits for that
//     and packs dS(j + 1). 3 K/V buffers (tile j + 2 into tile j - 1's: every warpgroup completed its reads before the
//     barrier at the top of iteration j); one barrier per tile. The last iteration issues S, dP of its own tile again,
//     wholly masked (unused). PLANT 1: 2 buffers (tile j + 2 copied over K(j), which dQ(j) reads)
template <int HD, bool OVL, int PLANT>
__global__ void __launch_bounds__(256)
attention_backward_wgmma_dq(floatX* dqkv, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv, int T, int H, int KV,
                            DocMask doc) {
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
    int lo[2];   // the document mask: the first keys of this thread's two rows (0: none)
    for (int r = 0; r < 2; r++) {
        const int q = wq0 + 16 * (threadIdx.x % 128 / 32) + threadIdx.x % 32 / 4 + 8 * r;
        lo[r] = doc.start && q < T ? doc.start[(size_t)b * T + q] : 0;
    }
    // the document mask: the key tiles before the block's first row's document are skipped (they add exactly nothing);
    // buffers by the tile's index, as the loops'
    const int j0 = doc.start ? doc.start[(size_t)b * T + q0] / WGB_BC : 0;
    for (int w = 0; w < 2; w++)
        wgb_load_queries<HD, 256>(Qs + w * TB, dOs + w * TB, ls + w * WGB_BQ, Ds + w * WGB_BQ, qkv, dout, lse, Dbuf, b, h, q0 + 64 * w, T, H, KV);
    wgmma_load_rows<HD, 256>(Ks + j0 % NB * TB, Kg, qkv_dim, j0 * WGB_BC, WGB_BC, T);
    wgmma_load_rows<HD, 256>(Vs + j0 % NB * TB, Vg, qkv_dim, j0 * WGB_BC, WGB_BC, T);
    cp_async_commit();
    float dq[HD / 2], s[32] = {}, dp[32] = {};
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.0f;
    uint32_t df[4][4];
    if constexpr (!OVL) {
        for (int j = j0; j < ntiles; j++) {
            if (j + 1 < ntiles) {   // tile j + 1 into the other buffer (its last readers finished before the last barrier)
                wgmma_load_rows<HD, 256>(Ks + (j + 1) % 2 * TB, Kg, qkv_dim, (j + 1) * WGB_BC, WGB_BC, T);
                wgmma_load_rows<HD, 256>(Vs + (j + 1) % 2 * TB, Vg, qkv_dim, (j + 1) * WGB_BC, WGB_BC, T);
            }
            cp_async_commit();
            cp_async_wait<1>();    // tile j (and Q, dO) landed for this thread...
            wgmma_fence_proxy();   // ...visible to the asynchronous proxy...
            __syncthreads();       // ...for every thread (and lse, D)
            const char* Kt = Ks + j % 2 * TB;
            wgb_dq_ds<HD>(s, dp, df, Qw, dOw, Kt, Vs + j % 2 * TB, lw, Dw, j * WGB_BC, wq0, sl2, lo);
            wgmma_fence_operand(dq);
            wgmma_fence();
            wgb_issue_rs<HD>(dq, df, Kt);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            if constexpr (!PLANT) __syncthreads();   // both warpgroups done with buffer j % 2 before tile j + 2 is copied over it
        }
    } else {
        if (ntiles > j0 + 1) {
            wgmma_load_rows<HD, 256>(Ks + (j0 + 1) % NB * TB, Kg, qkv_dim, (j0 + 1) * WGB_BC, WGB_BC, T);
            wgmma_load_rows<HD, 256>(Vs + (j0 + 1) % NB * TB, Vg, qkv_dim, (j0 + 1) * WGB_BC, WGB_BC, T);
        }
        cp_async_commit();
        cp_async_wait<1>();   // Q, dO and tile j0
        wgmma_fence_proxy();
        __syncthreads();
        wgb_dq_ds<HD>(s, dp, df, Qw, dOw, Ks + j0 % NB * TB, Vs + j0 % NB * TB, lw, Dw, j0 * WGB_BC, wq0, sl2, lo);
        for (int j = j0; j < ntiles; j++) {
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
            wgb_softmax_grad<true>(s, dp, nullptr, lw, Dw, (j + 1 < ntiles ? j + 1 : ntiles + 2) * WGB_BC, wq0, sl2, lo);
            wgmma_wait<0>();   // dS(j) K(j) complete: its A registers may be rewritten
            wgmma_fence_operand(dq);
            wgb_pack(df, dp);
        }
    }
    wgb_store_acc<HD>(dqkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, dq, scale, wq0, T);
}

// the keys kernel's shared memory: K, V (NWG tiles each), 2 x Q, dO, dS (DQ::ON: NWG tiles of 64 x 64), lse, D, the alignment
template <int HD, int NWG, class DQ> static inline size_t wgb_keys_smem() {
    size_t smem = (size_t)(2 * NWG + 4) * 64 * HD * 2 + (DQ::ON ? NWG * 64 * 128 : 0) + 4 * WGB_BQ * sizeof(float) + 1024;
    cudaCheck(cudaFuncSetAttribute(attention_backward_wgmma_keys<HD, NWG, DQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return smem;
}
// OVL false (wgmma), true (wgmma-overlap): the D kernel, then the dq kernel and the dk/dv kernel. parts: which of them (1 D,
// 2 dq, 4 dk/dv: dev/cuda times each alone); PLANT: the dq kernel's race, the race detector's negative control; doc: the
// document mask
template <int HD, bool OVL, int PLANT = 0>
static inline void attention_backward_wgmma_pair(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                                 const floatX* qkv, int B, int T, int H, int KV, int parts, cudaStream_t stream,
                                                 DocMask doc = {}) {
    // (the launches' names in logs, traces and dev/predict/kernel_cost.py)
    auto flash_attention_backward_dq_wgmma = attention_backward_wgmma_dq<HD, false, PLANT>;
    auto flash_attention_backward_dq_wgmma_overlap = attention_backward_wgmma_dq<HD, true, PLANT>;
    auto flash_attention_backward_dkv_wgmma = attention_backward_wgmma_keys<HD, 2, WgbNoDq>;
    size_t smem_kv = wgb_keys_smem<HD, 2, WgbNoDq>();
    // Q, dO (128 rows), K, V (2 or 3 buffers), lse, D, the alignment
    size_t smem_q = (size_t)(4 + 2 * (OVL && !PLANT ? 3 : 2)) * 64 * HD * 2 + 4 * WGB_BQ * sizeof(float) + 1024;
    cudaCheck(cudaFuncSetAttribute(OVL ? flash_attention_backward_dq_wgmma_overlap : flash_attention_backward_dq_wgmma,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    if (parts & 1)
        LAUNCH(flash_attention_backward_D_kernel, ceil_div((long long)B * T * H * 32, 128), 128, 0, stream, Dbuf, (int*)nullptr, dout, out,
               B, T, H, HD, 0);
    const dim3 grid_q(H, B, ceil_div(T, 2 * WGB_BQ));
    if ((parts & 2) && OVL)
        LAUNCH(flash_attention_backward_dq_wgmma_overlap, grid_q, 256, smem_q, stream, dqkv, dout, lse, Dbuf, qkv, T, H, KV, doc);
    else if (parts & 2) LAUNCH(flash_attention_backward_dq_wgmma, grid_q, 256, smem_q, stream, dqkv, dout, lse, Dbuf, qkv, T, H, KV, doc);
    if (parts & 4)
        LAUNCH(flash_attention_backward_dkv_wgmma, dim3(ceil_div(T, 128), KV, B), 256, smem_kv, stream, dqkv, WgbNoDq{}, dout, lse, Dbuf, qkv,
               T, H, KV, doc);
}
static inline bool attention_wgmma_backward_supported(int hd) { return hd == 64 || hd == 128; }
// the model's backward under --attention-bwd wgmma (overlap false) or wgmma-overlap (true), at head_dim 64 or 128 (the
// caller checks attention_wgmma_backward_supported and attention.cuh's attention_use_flash); doc: the document mask
static inline void attention_backward_wgmma_gpu(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                                const floatX* qkv, int B, int T, int H, int KV, int hd, bool overlap, cudaStream_t stream = 0,
                                                DocMask doc = {}) {
    if (hd == 128 && overlap) attention_backward_wgmma_pair<128, true>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, 7, stream, doc);
    else if (hd == 128) attention_backward_wgmma_pair<128, false>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, 7, stream, doc);
    else if (hd == 64 && overlap) attention_backward_wgmma_pair<64, true>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, 7, stream, doc);
    else if (hd == 64) attention_backward_wgmma_pair<64, false>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, 7, stream, doc);
    else fail(EXIT_BAD_INPUT, "wgmma attention backward: head_dim %d is not 64 or 128", hd);
}
