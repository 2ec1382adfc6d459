/*
 * attention_wgmma_fwd.cuh — the model's causal GQA flash attention forward at head_dim 64 and 128 on Hopper's
 * warpgroup MMA (model/wgmma.cuh; issue 25, FlashAttention-3's approach). Same contract as the mma.sync forward
 * (attention_flash.cuh, which keeps head_dim 32 and context parallelism's chunk pairs): from qkv (B, T, (H + 2 KV)
 * hd) after clip + RoPE, out (B, T, H hd) and lse (B, H, T) (natural log of the scaled scores).
 * Grid (T/192 query tiles, H, B), longest tiles first; 3 warpgroups (384 threads), warpgroup w owning query rows
 * 64 w .. 64 w + 63 of the tile (2 warpgroups and 128 rows until session 62). Q (192 x hd) and three K, V buffers of
 * 64 keys are copied by 16-byte cp.async into the 128B-swizzled layout: panels of 64 head dims (128 bytes a row),
 * 8-row atoms of 1024 bytes, the 16-byte chunk c of row r at c ^ r % 8. Per key tile:
 *   S (64 x 64) = Q K^T   hd/16 wgmma m64n64k16, A = Q and B = K by descriptor, both K-major (keys x head_dim
 *                         row-major is B's K-major layout: SBO 1024, k-step + 32 bytes, the next panel + rows 128 B)
 *   online softmax on the accumulators (thread rows g and g + 8 of its warp's 16: a row in the 4 lanes of a quad,
 *                         two shuffles), log2 domain, causal mask on the diagonal tiles (--doc-mask: the
 *                         keys before a row's document masked too; the key tiles before the block's first
 *                         row's document skipped)
 *   O (64 x hd) += P V    4 wgmma m64n(hd)k16, A = P from registers (the S accumulators rounded to bf16: the D layout
 *                         of two 8-column groups is the A fragment), B = V MN-major (transpose flag 1: head_dim
 *                         contiguous; SBO 1024 between 8-key groups, LBO the panel size, the next k-step + 2048 B)
 * with FlashAttention-3's intra-warpgroup overlap: iteration j issues S(j + 1) and O += P(j) V(j), waits for S(j + 1)
 * only and runs its softmax while P(j) V(j) computes. O / l stored as bf16 pairs straight from the accumulators.
 * Under the emulator the results are the mma.sync forward's bit for bit (the same k-order sums and softmax
 * arithmetic: dev/cuda/attention_wgmma checks it); on an H100 at DBRX-132B's attention shape 271 TFLOP/s against the
 * mma.sync forward's 221 (dev/bench/results_gpu.md, 2026-11-27). (Not there: the ping-pong of two warpgroups'
 * softmax and MMAs, a producer warpgroup with TMA, setmaxnreg. dev/cuda/attention_wgmma.cu keeps v1, one group
 * waited for at a time, and times both against the mma.sync forward.)
 */
#pragma once
#include "attention_flash.cuh"
#include "wgmma.cuh"

#define WGA_BR 128    // query rows of a block: 2 warpgroups x 64
#define WGA_BC 64     // keys per tile
#define WGA_THREADS 256

// rows [row0, row0 + rows) (HD columns) of a row-major src (row stride ld, T rows) into the swizzled panels of dst:
// panel p (head dims 64 p ..) at dst + p rows 128, row r 128 bytes, 16-byte chunk c at c ^ r % 8; rows >= T zero.
// THREADS: the block's threads, all of which call it (the wgmma backward in dev/cuda shares it)
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
template <int HD, int THREADS = WGA_THREADS>
__device__ __forceinline__ void wga_load_tile(char* dst, const floatX* src, size_t ld, int row0, int rows, int T) {
    wgmma_load_rows<HD, THREADS>(dst, src, ld, row0, rows, T);
}

// S (64 x BC, the warpgroup's D fragment; BC = 2 NS keys) = Q K^T, issued (not committed): k-step ks reads head dims
// 16 ks ..: panel ks / 4, + 32 bytes per step within it. Qw: the warpgroup's first Q row in panel 0 of a Q tile of BR rows
template <int HD, int BR = WGA_BR, int NS> __device__ __forceinline__ void wga_issue_s(float (&s)[NS], const char* Qw, const char* Kt) {
    constexpr int BC = 2 * NS;
    wgmma_fence();
    for (int ks = 0; ks < HD / 16; ks++) {
        uint64_t da = wgmma_desc(Qw + (ks / 4) * BR * 128 + 32 * (ks % 4), 16, 1024, WGMMA_SWIZZLE_128B);
        uint64_t db = wgmma_desc(Kt + (ks / 4) * BC * 128 + 32 * (ks % 4), 16, 1024, WGMMA_SWIZZLE_128B);
        wgmma_bf16_ss<BC, 0, 0>(s, da, db, ks > 0);
    }
}

// the causal mask (and the document mask: lo, the rows' first keys, attention.cuh) and the online softmax of a completed S
// of the key tile at k0 (BC = 2 NS keys): s[i] = S[16 warp + g + 8 ((i / 2) % 2)][8 (i / 4) + 2 t4 + i % 2], this thread's
// rows qa (r 0) and qb (r 1), elements 4 c + 2 r + e. Updates m and l, returns O's factors in corr, P (fp32) in s
template <int NS>
__device__ __forceinline__ void wga_softmax(float (&s)[NS], float m[2], float l[2], float corr[2], int k0, int wrow0, int qa, int qb,
                                            float sl2, const int lo[2]) {
    const int t4 = threadIdx.x % 4;
    if (k0 + 2 * NS - 1 > wrow0)   // a tile that reaches past the warpgroup's first row
        for (int i = 0; i < NS; i++)
            if (k0 + 8 * (i / 4) + 2 * t4 + i % 2 > ((i / 2) % 2 ? qb : qa)) s[i] = -INFINITY;
    if (k0 < max(lo[0], lo[1]))   // a tile that begins before a row's document
        for (int i = 0; i < NS; i++)
            if (k0 + 8 * (i / 4) + 2 * t4 + i % 2 < lo[(i / 2) % 2]) s[i] = -INFINITY;
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
        for (int c = 0; c < NS / 4; c++) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * r], s[4 * c + 2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float m_new = fmaxf(m[r], mx * sl2);
        float m_use = m_new == -INFINITY ? 0.0f : m_new;   // nothing unmasked yet: exp2f(-inf) = 0, not NaN
        corr[r] = exp2f(m[r] - m_use);
        l[r] *= corr[r];
        for (int c = 0; c < NS / 4; c++)
            for (int e = 0; e < 2; e++) {
                // (P is rounded to bf16 as the A operand of P V; the sum, hence lse, keeps fp32)
                float p = exp2f(s[4 * c + 2 * r + e] * sl2 - m_use);
                s[4 * c + 2 * r + e] = p;
                l[r] += p;
            }
        m[r] = m_new;
    }
}
// P rounded to bf16 as the A fragments of P V: pf[kk][q] = pack(s[8 kk + 2 q], s[8 kk + 2 q + 1]) (rows g, g + 8; keys
// 16 kk + 2 t4 (+ 8))
template <int NK>
__device__ __forceinline__ void wga_pack_p(uint32_t (&pf)[NK][4], const float (&s)[8 * NK]) {
    for (int kk = 0; kk < NK; kk++)
        for (int q = 0; q < 4; q++) pf[kk][q] = pack_bf16x2(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
}

// O (completed) *= corr per row, then O += P V issued and committed (BC = 16 NK keys): V's k-step kk starts 16 keys (2048
// bytes) on; MN-major, SBO 1024 between 8-key groups, LBO the panel size (BC rows of 128 bytes) between 64-dim panels
template <int HD, int NK>
__device__ __forceinline__ void wga_issue_pv(float (&o)[HD / 2], const float corr[2], const uint32_t (&pf)[NK][4], const char* Vt) {
    for (int c = 0; c < HD / 8; c++)
        for (int i = 0; i < 4; i++) o[4 * c + i] *= corr[i / 2];
    wgmma_fence_operand(o);
    wgmma_fence();
    for (int kk = 0; kk < NK; kk++)
        wgmma_bf16_rs<HD, 1>(o, pf[kk], wgmma_desc(Vt + kk * 16 * 128, 16 * NK * 128, 1024, WGMMA_SWIZZLE_128B), 1);
    wgmma_commit();
}

// O / l as bf16 pairs (rows < T) and lse, from the completed O, m, l of this thread's rows qa, qb
template <int HD>
__device__ __forceinline__ void wga_store(floatX* out, float* lse, const float (&o)[HD / 2], const float m[2], float l[2], int b, int h,
                                          int T, int H, int qa, int qb) {
    const int t4 = threadIdx.x % 4, C = H * HD;
    for (int r = 0; r < 2; r++) {   // the row sums of the quads
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    floatX* Og = out + (size_t)b * T * C + (size_t)h * HD;
    for (int r = 0; r < 2; r++) {
        const int row = r ? qb : qa;
        const float inv = 1.0f / l[r];   // (times 1 / l as the product's kernel: the same bits under the emulator)
        if (row < T)
            for (int c = 0; c < HD / 8; c++)
                *(uint32_t*)(Og + (size_t)row * C + 8 * c + 2 * t4) = pack_bf16x2(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
    }
    if (t4 == 0) {   // natural-log units, of the scaled scores
        if (qa < T) lse[((size_t)b * H + h) * T + qa] = (m[0] + log2f(l[0])) / FLASH_LOG2E;
        if (qb < T) lse[((size_t)b * H + h) * T + qb] = (m[1] + log2f(l[1])) / FLASH_LOG2E;
    }
}

// the block's common values: the tile's rows, the heads, the global tiles, the warpgroup's rows (BR query rows,
// BR / 64 warpgroups; BC keys per K, V tile)
#define WGA_SETUP_T(STAGES, BR, BC)                                                                                                \
    constexpr int KB = (BC) * HD * 2; /* bytes of one K or V tile */                                                             \
    /* the swizzle repeats every 1024 bytes of shared address: the tiles start on such a boundary */                             \
    char* Qs = dynamic_smem + ((1024 - ((uintptr_t)dynamic_smem & 1023)) & 1023);                                                \
    char* Ks = Qs + (BR) * HD * 2; /* (STAGES buffers) x KB */                                                                   \
    char* Vs = Ks + (STAGES) * KB; /* (STAGES buffers) x KB */                                                                   \
    const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, g = threadIdx.x % 32 / 4;                                  \
    const int q0 = (gridDim.x - 1 - blockIdx.x) * (BR); /* the last (longest) query tiles first */                              \
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV);                                                                \
    const size_t qkv_dim = (size_t)(H + 2 * KV) * HD;                                                                            \
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;                                                           \
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;                                                   \
    const floatX* Vg = Kg + (size_t)KV * HD;                                                                                     \
    const float sl2 = rsqrtf((float)HD) * FLASH_LOG2E;         /* scores in log2 units, for exp2f */                            \
    const int ntiles = (min(q0 + (BR), T) - 1) / (BC) + 1;      /* causal: keys up to the block's last query row */             \
    const int wrow0 = q0 + 64 * wg;                             /* the warpgroup's first query row */                           \
    const int qa = wrow0 + 16 * warp + g, qb = qa + 8;          /* this thread's two rows */                                    \
    const char* Qw = Qs + wg * 64 * 128;                                                                                         \
    float o[HD / 2];                                            /* O (64 x HD) of the warpgroup, unnormalised (D layout) */     \
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;                                                                                \
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* running max (log2 units), this lane's part of the sum */       \
    float corr[2];                                                                                                               \
    uint32_t pf[(BC) / 16][4]
#define WGA_SETUP(STAGES) WGA_SETUP_T(STAGES, WGA_BR, WGA_BC)

// v2: FlashAttention-3's intra-warpgroup overlap (its order): iteration j issues S(j + 1) = Q K(j + 1)^T, rescales O and
// issues O += P(j) V(j), waits for S(j + 1) only (wait_group 1) and runs its softmax while P(j) V(j) computes, then
// waits for that (wait_group 0) and packs P(j + 1). Three K/V buffers: at the top of iteration j (after a barrier)
// every warpgroup has completed P(j - 1) V(j - 1), tile j + 1 has landed, V(j) is still to be read: tile j + 2 goes to
// tile j - 1's buffer. No branch around a wgmma (ptxas serializes every wgmma of a kernel where one is in a path it
// cannot prove warpgroup-uniform): the last iteration issues S of its own tile again, its softmax wholly masked (key
// offset past the block's rows), and a warpgroup also runs a key tile past its rows (the causal tile of warpgroup 0
// in the block's last tile), wholly masked: P = 0, the factors 1, O, l and m unchanged bit for bit.
// NBUF 3; 2 only as the race detector's negative control (-p 1: tile j + 2 over tile j's V, still read by P(j) V(j)).
// The model's shape is NWG 3 warpgroups (192 query rows, 384 threads; dev/cuda/attention_wgmma's v4) and BC 64 keys a
// tile since session 62: on an H200 at dbrx-1b's attention (B 8, T 2048, H 8, KV 2, hd 128) 242.6 TFLOP/s against NWG 2's
// 211.9 (v2) and BC 128's 233.1 (v3): three warpgroups issue MMAs beside each other's softmax where two leave gaps. The
// same bits as NWG 2 (every row sees the same key tiles in the same order; a warpgroup's extra tiles are wholly masked)
template <int HD, int NBUF, int BC = WGA_BC, int NWG = 2>
__global__ void __launch_bounds__(128 * NWG) flash_attention_forward_wgmma_kernel(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV,
                                                                                   DocMask doc) {
    constexpr int BR = 64 * NWG, THREADS = 128 * NWG;
    WGA_SETUP_T(NBUF, BR, BC);
    const int lo[2] = {doc.start && qa < T ? doc.start[(size_t)b * T + qa] : 0,   // the document mask: the rows' first keys
                       doc.start && qb < T ? doc.start[(size_t)b * T + qb] : 0};
    // the document mask: the key tiles before the block's first row's document are skipped (every row of the block sees
    // none of their keys: a masked tile adds exactly nothing); buffers by the tile's index, as the loop's
    const int j0 = doc.start ? doc.start[(size_t)b * T + q0] / BC : 0;
    wga_load_tile<HD, THREADS>(Qs, Qg, qkv_dim, q0, BR, T);
    wga_load_tile<HD, THREADS>(Ks + j0 % NBUF * KB, Kg, qkv_dim, j0 * BC, BC, T);
    wga_load_tile<HD, THREADS>(Vs + j0 % NBUF * KB, Vg, qkv_dim, j0 * BC, BC, T);
    cp_async_commit();
    if (ntiles > j0 + 1) {
        wga_load_tile<HD, THREADS>(Ks + (j0 + 1) % NBUF * KB, Kg, qkv_dim, (j0 + 1) * BC, BC, T);
        wga_load_tile<HD, THREADS>(Vs + (j0 + 1) % NBUF * KB, Vg, qkv_dim, (j0 + 1) * BC, BC, T);
    }
    cp_async_commit();
    cp_async_wait<1>();   // Q and tile 0
    wgmma_fence_proxy();
    __syncthreads();
    float s[BC / 2] = {};
    wga_issue_s<HD, BR>(s, Qw, Ks + j0 % NBUF * KB);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(s);
    wga_softmax(s, m, l, corr, j0 * BC, wrow0, qa, qb, sl2, lo);
    wga_pack_p(pf, s);
    for (int j = j0; j < ntiles; j++) {
        cp_async_wait<0>();   // tile j + 1 landed for this thread, for every thread after the barrier
        wgmma_fence_proxy();
        __syncthreads();
        if (j + 2 < ntiles) {
            wga_load_tile<HD, THREADS>(Ks + (j + 2) % NBUF * KB, Kg, qkv_dim, (j + 2) * BC, BC, T);
            wga_load_tile<HD, THREADS>(Vs + (j + 2) % NBUF * KB, Vg, qkv_dim, (j + 2) * BC, BC, T);
        }
        cp_async_commit();
        wga_issue_s<HD, BR>(s, Qw, Ks + min(j + 1, ntiles - 1) % NBUF * KB);
        wgmma_commit();
        wga_issue_pv<HD>(o, corr, pf, Vs + j % NBUF * KB);
        wgmma_wait<1>();   // S(j + 1) complete (P(j) V(j) may not be)
        wgmma_fence_operand(s);
        wga_softmax(s, m, l, corr, (j + 1 < ntiles ? j + 1 : ntiles + 2) * BC, wrow0, qa, qb, sl2, lo);
        wgmma_wait<0>();   // P(j) V(j) complete: its A registers may be rewritten
        wgmma_fence_operand(o);
        wga_pack_p(pf, s);
    }
    wga_store<HD>(out, lse, o, m, l, b, h, T, H, qa, qb);
}

template <int HD, int NBUF, int BC = WGA_BC, int NWG = 2> static inline size_t attention_wgmma_forward_smem() {
    return (size_t)(64 * NWG + 2 * NBUF * BC) * HD * 2 + 1024;   // Q, NBUF K and V buffers, the 1024-byte alignment
}
template <int HD, int NBUF, int BC = WGA_BC, int NWG = 2>
static inline void attention_forward_wgmma_hd(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, cudaStream_t stream,
                                              DocMask doc) {
    size_t smem = attention_wgmma_forward_smem<HD, NBUF, BC, NWG>();
    auto flash_attention_forward_wgmma = flash_attention_forward_wgmma_kernel<HD, NBUF, BC, NWG>;   // (the launch's name in logs and traces)
    cudaCheck(cudaFuncSetAttribute(flash_attention_forward_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(flash_attention_forward_wgmma, dim3(ceil_div(T, 64 * NWG), H, B), 128 * NWG, smem, stream, out, lse, qkv, T, H, KV, doc);
}
static inline bool attention_wgmma_forward_supported(int hd) { return hd == 64 || hd == 128; }
// the model's causal attention forward at head_dim 64 or 128 (the caller checks attention_wgmma_forward_supported and
// the flash kernels' conditions: attention.cuh's attention_use_flash); doc: the document mask. NBUF 2: the race detector's negative control
// only (tile j + 2 copied over tile j's V while P(j) V(j) may still read it)
// (BC, NWG: the key tile and the warpgroups; the model's 64 and 3 (dev/cuda/attention_wgmma's v4), v2's 2, v3's BC 128)
template <int NBUF = 3, int BC = WGA_BC, int NWG = 3>
static inline void attention_forward_wgmma_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                               cudaStream_t stream = 0, DocMask doc = {}) {
    if (hd == 64) attention_forward_wgmma_hd<64, NBUF, BC, NWG>(out, lse, qkv, B, T, H, KV, stream, doc);
    else if (hd == 128) attention_forward_wgmma_hd<128, NBUF, BC, NWG>(out, lse, qkv, B, T, H, KV, stream, doc);
    else fail(EXIT_BAD_INPUT, "wgmma attention forward: head_dim %d is not 64 or 128", hd);
}
