/*
 * attention_flash.cuh — causal GQA attention on tensor cores, FlashAttention-2's algorithm, for
 * head_dim 32, 64 and 128 (the model's attention_forward_gpu / attention_backward_gpu use it for those,
 * model/attention.cuh). Same contract as the CPU reference and the warp-per-row kernels: from qkv
 * (B, T, (H + 2 KV) hd) after clip + RoPE, the forward writes out (B, T, H hd) and the logsumexp of
 * every scaled score row, lse (B, H, T); the backward recomputes the probabilities from q, k and lse.
 *
 * Every matrix product is mma.sync m16n8k16 (BF16 operands, FP32 accumulation) fed by ldmatrix from
 * shared-memory tiles that cp.async fills (model/tensor_core.cuh). Blocks of 4 warps; a warp owns 16-row
 * slices of the block's tile, so a softmax row lives in the 4 lanes of a quad and is reduced with two
 * shuffles. Shared-memory rows are padded by 8 elements (16 bytes) so that the 8 row addresses of an
 * ldmatrix fall in 8 different bank groups.
 *   forward  grid (T/128 query tiles, H, B): each warp two 16-row slices, so that every K/V fragment it
 *            loads serves 32 rows (issue 25; the 64-row kernel it replaced is dev/cuda/attention.cu's
 *            forward v3). Q tile once, K/V tiles of 64 keys double-buffered (the copy of tile j + 1
 *            overlaps the math of tile j); S = Q K^T, online softmax in the log2 domain (exp2f), P
 *            rounded to bf16 straight from the accumulator registers as the A operand of O += P V.
 *            Causal: key tiles past the query tile are never loaded, a slice skips the tiles wholly past
 *            its rows, the mask is applied only on tiles that reach past a slice's first row. Query
 *            tiles run longest first.
 *   backward the model's is attention_flash_bwd5.cuh (5 tile products per pair). The pair of kernels
 *            here (dev/cuda/attention.cu's backward v2, and the dk/dv half's loop which bwd5 extends):
 *            dq   grid (T/64, H, B): also writes D = rowsum(dout * out) of its rows; per key tile
 *                 S = Q K^T, dP = dO V^T, P = exp(S scale - lse), dS = P (dP - D), dQ += dS K;
 *            dkdv grid (T/64 key tiles, KV, B): the warp owns 16 keys and works on S^T = K Q^T and
 *                 dP^T = V dO^T over 32-query tiles from the diagonal on, of every query head of
 *                 the kv group (GQA: K/V read once per group, never repeated), dV += P^T dO,
 *                 dK += dS^T Q; Q/dO/lse/D tiles double-buffered.
 *            The dq kernel recomputes S and dP (7 products per tile pair instead of 5) in exchange for
 *            no float atomics on dQ.
 * Rows past T are zero-filled by the copies (no global read) and never stored; in the backward their
 * lse is +inf, so their probabilities are 0.
 */
#pragma once
#include "tensor_core.cuh"

#define FLASH_FWD_BR 128   // query rows of a forward block (4 warps x two 16-row slices)
#define FLASH_BR 64        // query rows of a dq block (4 warps x 16)
#define FLASH_BC 64        // keys per tile (forward, dq); keys of a dk/dv block (4 warps x 16)
#define FLASH_BQ 32        // queries per tile of the dk/dv block: S^T and dP^T are 16 x 32 per warp (registers)
#define FLASH_THREADS 128
#define FLASH_LOG2E 1.4426950408889634f

// dynamic shared memory, declared at file scope: the emulator's g++ build does not resolve a
// block-scope extern thread_local array inside a template kernel
extern __shared__ __align__(16) char dynamic_smem[];

static inline bool flash_attention_supported(int hd) { return hd == 32 || hd == 64 || hd == 128; }

// rows [row0, row0 + rows) of a row-major matrix src (row stride ld_g elements, T rows), HD columns,
// into a shared tile dst (rows, HD + 8) by cp.async, the whole block; rows >= T are zero-filled
template <int HD>
__device__ __forceinline__ void flash_load_tile(floatX* dst, const floatX* src, size_t ld_g, int row0, int rows, int T) {
    constexpr int LD = HD + 8, CHUNKS = HD / 8;   // 16-byte chunks per row
    for (int c = threadIdx.x; c < rows * CHUNKS; c += FLASH_THREADS) {
        int r = c / CHUNKS, k = c % CHUNKS * 8;
        if (row0 + r < T) cp_async_16(dst + r * LD + k, src + (size_t)(row0 + r) * ld_g + k);
        else cp_async_16_zfill(dst + r * LD + k, src, 0);
    }
}

// a warp's accumulators for 16 rows x (8 NT) columns (C layout), row g times f0 and row g + 8
// times f1, as bf16 into rows row0 .. row0 + 15 of a shared tile
template <int NT>
__device__ __forceinline__ void flash_acc_to_smem(floatX* tile, int ld, int row0, const float acc[NT][4], float f0, float f1) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int n = 0; n < NT; n++) {
        *(uint32_t*)(tile + (size_t)(row0 + g) * ld + n * 8 + 2 * t) = pack_bf16x2(acc[n][0] * f0, acc[n][1] * f0);
        *(uint32_t*)(tile + (size_t)(row0 + g + 8) * ld + n * 8 + 2 * t) = pack_bf16x2(acc[n][2] * f1, acc[n][3] * f1);
    }
}

// 16 rows (HD + 8 stride) of a shared tile to rows row0 .. row0 + 15 of dst (row stride ld_g), those < T;
// one warp, 16-byte stores
template <int HD>
__device__ __forceinline__ void flash_store_rows(floatX* dst, size_t ld_g, int row0, int T, const floatX* src) {
    constexpr int LD = HD + 8, CHUNKS = HD / 8;
    for (int c = threadIdx.x % 32; c < 16 * CHUNKS; c += 32) {
        int r = c / CHUNKS, k = c % CHUNKS * 8;
        if (row0 + r < T) *(uint4*)(dst + (size_t)(row0 + r) * ld_g + k) = *(const uint4*)(src + r * LD + k);
    }
}

// ---------------------------------------------------------------------------------------------
// forward: out (B, T, H HD), lse (B, H, T) from qkv (B, T, (H + 2 KV) HD)
//
// A block takes 128 query rows (FLASH_FWD_BR): 4 warps, each warp two 16-row slices (rows warp 32 ..
// warp 32 + 31). Every K or V fragment a warp loads by ldmatrix feeds the mma.sync of both its slices,
// so the warp does 32 FLOPs per byte it reads from shared memory (a warp of one slice does 16: the
// shared-memory bandwidth bound the 64-row kernel of dev/cuda/attention.cu hits). Q stays in shared
// memory and is re-read per tile (8 KB per warp per tile against K and V's 32 KB; two slices of Q as
// fragments would not fit in the registers next to O). A slice skips a key tile that lies wholly past
// its last row (causal), so the diagonal costs what the 64-row kernel's does.

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV) {
    constexpr int LD = HD + 8, KT = HD / 16, NT = FLASH_BC / 8, OT = HD / 8, MS = FLASH_FWD_BR / 64;   // MS slices per warp
    floatX* Qs = (floatX*)dynamic_smem;            // (FWD_BR, LD)
    floatX* Ks = Qs + FLASH_FWD_BR * LD;           // (2, BC, LD): double-buffered
    floatX* Vs = Ks + 2 * FLASH_BC * LD;           // (2, BC, LD)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_FWD_BR;   // the last (longest) query tiles first
    int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV), C = H * HD;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float sl2 = rsqrtf((float)HD) * FLASH_LOG2E;          // scores in log2 units, for exp2f
    const int ntiles = (min(q0 + FLASH_FWD_BR, T) - 1) / FLASH_BC + 1;   // causal: keys up to the last query row
    const int wrow0 = warp * 16 * MS;                            // the warp's first row in the tile

    flash_load_tile<HD>(Qs, Qg, qkv_dim, q0, FLASH_FWD_BR, T);
    flash_load_tile<HD>(Ks, Kg, qkv_dim, 0, FLASH_BC, T);
    flash_load_tile<HD>(Vs, Vg, qkv_dim, 0, FLASH_BC, T);
    cp_async_commit();

    float o[MS][OT][4] = {};                                       // O (16, HD) per slice, unnormalised
    float m[MS][2], l[MS][2];                                      // running max (log2 units) and this lane's part of the sum
    UNROLL
    for (int sl = 0; sl < MS; sl++)
        UNROLL
        for (int r = 0; r < 2; r++) { m[sl][r] = -INFINITY; l[sl][r] = 0.0f; }
    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {   // tile j + 1 into the other buffer while tile j is used
            flash_load_tile<HD>(Ks + (j + 1) % 2 * FLASH_BC * LD, Kg, qkv_dim, (j + 1) * FLASH_BC, FLASH_BC, T);
            flash_load_tile<HD>(Vs + (j + 1) % 2 * FLASH_BC * LD, Vg, qkv_dim, (j + 1) * FLASH_BC, FLASH_BC, T);
        }
        cp_async_commit();      // (an empty group on the last tile keeps the count uniform)
        cp_async_wait<1>();     // all groups but the newest, so tile j (and Q), have landed for this thread...
        __syncthreads();        // ...and for every thread
        const floatX* Kt = Ks + j % 2 * FLASH_BC * LD;
        const floatX* Vt = Vs + j % 2 * FLASH_BC * LD;
        const int k0 = j * FLASH_BC;
        // the first slice of the warp that has a key of this tile at or before its last row (slices
        // are in row order, so the later ones do too); MS: none (warp-uniform)
        int s0 = 0;
        while (s0 < MS && k0 > q0 + wrow0 + 16 * s0 + 15) s0++;
        if (s0 < MS) {
            // S = Q K^T: (16, BC) per slice; each K fragment serves every active slice
            float s[MS][NT][4] = {};
            UNROLL
            for (int kk = 0; kk < KT; kk++) {
                uint32_t qf[MS][4];
                UNROLL
                for (int sl = 0; sl < MS; sl++) if (sl >= s0) frag_a(qf[sl], Qs, LD, wrow0 + 16 * sl, kk * 16);
                UNROLL
                for (int n = 0; n < NT; n += 2) {
                    uint32_t kf[4];
                    frag_b_nmajor(kf, Kt, LD, n * 8, kk * 16);
                    UNROLL
                    for (int sl = 0; sl < MS; sl++) if (sl >= s0) {
                        mma_m16n8k16_bf16_f32(s[sl][n], qf[sl], kf, s[sl][n]);
                        mma_m16n8k16_bf16_f32(s[sl][n + 1], qf[sl], kf + 2, s[sl][n + 1]);
                    }
                }
            }
            UNROLL
            for (int sl = 0; sl < MS; sl++) if (sl >= s0) {
                const int qa = q0 + wrow0 + 16 * sl + g, qb = qa + 8;   // this lane's two query rows of the slice
                // causal mask, only on a tile that reaches past the slice's first row
                if (k0 + FLASH_BC - 1 > qa - g)
                    UNROLL
                    for (int n = 0; n < NT; n++)
                        UNROLL
                        for (int e = 0; e < 4; e++)
                            if (k0 + n * 8 + 2 * t4 + e % 2 > (e < 2 ? qa : qb)) s[sl][n][e] = -INFINITY;
                // online softmax of row qa (elements 0, 1) and qb (2, 3); a row's scores are in the 4 lanes of a quad
                UNROLL
                for (int r = 0; r < 2; r++) {
                    float mx = -INFINITY;
                    UNROLL
                    for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[sl][n][2 * r], s[sl][n][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    float m_new = fmaxf(m[sl][r], mx * sl2);
                    float m_use = m_new == -INFINITY ? 0.0f : m_new;   // nothing unmasked yet: exp2f(-inf) = 0, not NaN
                    float corr = exp2f(m[sl][r] - m_use);
                    l[sl][r] *= corr;
                    UNROLL
                    for (int n = 0; n < OT; n++) { o[sl][n][2 * r] *= corr; o[sl][n][2 * r + 1] *= corr; }
                    UNROLL
                    for (int n = 0; n < NT; n++)
                        UNROLL
                        for (int e = 2 * r; e < 2 * r + 2; e++) {
                            // (P is rounded to bf16 as the A operand of P V; the sum, hence lse, keeps fp32)
                            float p = exp2f(s[sl][n][e] * sl2 - m_use);
                            s[sl][n][e] = p;
                            l[sl][r] += p;
                        }
                    m[sl][r] = m_new;
                }
            }
            // O += P V: two adjacent 16x8 accumulator tiles of P are the A fragment of a 16-key step;
            // each V fragment serves every active slice
            UNROLL
            for (int kk = 0; kk < FLASH_BC / 16; kk++) {
                uint32_t pf[MS][4];
                UNROLL
                for (int sl = 0; sl < MS; sl++) if (sl >= s0) frag_a_from_acc(pf[sl], s[sl][2 * kk], s[sl][2 * kk + 1]);
                UNROLL
                for (int n = 0; n < OT; n += 2) {
                    uint32_t vf[4];
                    frag_b_kmajor(vf, Vt, LD, kk * 16, n * 8);
                    UNROLL
                    for (int sl = 0; sl < MS; sl++) if (sl >= s0) {
                        mma_m16n8k16_bf16_f32(o[sl][n], pf[sl], vf, o[sl][n]);
                        mma_m16n8k16_bf16_f32(o[sl][n + 1], pf[sl], vf + 2, o[sl][n + 1]);
                    }
                }
            }
        }
        DROPPABLE_SYNCTHREADS("flash_forward_tile");   // every warp is done with buffer j % 2 before iteration j + 1 refills it
    }
    // the row sums of the quads; O / l through the warp's own Q rows (read by no one else) to 16-byte stores
    UNROLL
    for (int sl = 0; sl < MS; sl++) {
        const int qa = q0 + wrow0 + 16 * sl + g, qb = qa + 8;
        UNROLL
        for (int r = 0; r < 2; r++) {
            l[sl][r] += __shfl_xor_sync(0xffffffffu, l[sl][r], 1);
            l[sl][r] += __shfl_xor_sync(0xffffffffu, l[sl][r], 2);
        }
        flash_acc_to_smem<OT>(Qs, LD, wrow0 + 16 * sl, o[sl], 1.0f / l[sl][0], 1.0f / l[sl][1]);
        __syncwarp();
        flash_store_rows<HD>(out + (size_t)b * T * C + (size_t)h * HD, C, q0 + wrow0 + 16 * sl, T, Qs + (wrow0 + 16 * sl) * LD);
        if (t4 == 0) {   // natural-log units, of the scaled scores
            if (qa < T) lse[((size_t)b * H + h) * T + qa] = (m[sl][0] + log2f(l[sl][0])) / FLASH_LOG2E;
            if (qb < T) lse[((size_t)b * H + h) * T + qb] = (m[sl][1] + log2f(l[sl][1])) / FLASH_LOG2E;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// backward, dq: the Q rows of dqkv, and D (B, H, T) = rowsum(dout * out)

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dq_kernel(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                   const floatX* qkv, int T, int H, int KV) {
    constexpr int LD = HD + 8, KT = HD / 16, NT = FLASH_BC / 8, OT = HD / 8;
    floatX* Qs = (floatX*)dynamic_smem;            // (BR, LD)
    floatX* dOs = Qs + FLASH_BR * LD;              // (BR, LD)
    floatX* Ks = dOs + FLASH_BR * LD;              // (2, BC, LD): double-buffered
    floatX* Vs = Ks + 2 * FLASH_BC * LD;           // (2, BC, LD)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_BR;
    int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV), C = H * HD;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const floatX* dOg = dout + (size_t)b * T * C + (size_t)h * HD;
    const floatX* Og = out + (size_t)b * T * C + (size_t)h * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int ntiles = (min(q0 + FLASH_BR, T) - 1) / FLASH_BC + 1;
    const int row0 = warp * 16, qa = q0 + row0 + g, qb = qa + 8;

    flash_load_tile<HD>(Qs, Qg, qkv_dim, q0, FLASH_BR, T);
    flash_load_tile<HD>(dOs, dOg, C, q0, FLASH_BR, T);
    flash_load_tile<HD>(Ks, Kg, qkv_dim, 0, FLASH_BC, T);
    flash_load_tile<HD>(Vs, Vg, qkv_dim, 0, FLASH_BC, T);
    cp_async_commit();

    // while the copies fly: D of the warp's 16 rows (lanes split HD, a row at a time), and lse, in log2 units
    float Da = 0.0f, Db = 0.0f;
    for (int r = 0; r < 16; r++) {
        int q = q0 + row0 + r;
        float d = 0.0f;
        if (q < T)
            for (int i = lane; i < HD; i += 32) d += __bfloat162float(dOg[(size_t)q * C + i]) * __bfloat162float(Og[(size_t)q * C + i]);
        d = warp_sum(d);
        if (r == g) Da = d;
        if (r == g + 8) Db = d;
        if (lane == 0 && q < T) Dbuf[((size_t)b * H + h) * T + q] = d;
    }
    float la = qa < T ? lse[((size_t)b * H + h) * T + qa] * FLASH_LOG2E : 0.0f;   // rows past T: never stored
    float lb = qb < T ? lse[((size_t)b * H + h) * T + qb] * FLASH_LOG2E : 0.0f;

    float dq[OT][4] = {};
    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {
            flash_load_tile<HD>(Ks + (j + 1) % 2 * FLASH_BC * LD, Kg, qkv_dim, (j + 1) * FLASH_BC, FLASH_BC, T);
            flash_load_tile<HD>(Vs + (j + 1) % 2 * FLASH_BC * LD, Vg, qkv_dim, (j + 1) * FLASH_BC, FLASH_BC, T);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const floatX* Kt = Ks + j % 2 * FLASH_BC * LD;
        const floatX* Vt = Vs + j % 2 * FLASH_BC * LD;

        // S = Q K^T and dP = dO V^T: (16, BC) per warp
        float s[NT][4] = {}, dp[NT][4] = {};
        for (int kk = 0; kk < KT; kk++) {
            uint32_t qf[4], of[4];
            frag_a(qf, Qs, LD, row0, kk * 16);
            frag_a(of, dOs, LD, row0, kk * 16);
            for (int n = 0; n < NT; n += 2) {
                uint32_t kf[4], vf[4];
                frag_b_nmajor(kf, Kt, LD, n * 8, kk * 16);
                frag_b_nmajor(vf, Vt, LD, n * 8, kk * 16);
                mma_m16n8k16_bf16_f32(s[n], qf, kf, s[n]);
                mma_m16n8k16_bf16_f32(s[n + 1], qf, kf + 2, s[n + 1]);
                mma_m16n8k16_bf16_f32(dp[n], of, vf, dp[n]);
                mma_m16n8k16_bf16_f32(dp[n + 1], of, vf + 2, dp[n + 1]);
            }
        }
        // P = exp(S scale - lse), 0 where the key is after the query; dS = P (dP - D), into s
        const int k0 = j * FLASH_BC;
        const bool diag = k0 + FLASH_BC - 1 > q0 + row0;
        for (int n = 0; n < NT; n++)
            for (int e = 0; e < 4; e++) {
                bool masked = diag && k0 + n * 8 + 2 * t4 + e % 2 > (e < 2 ? qa : qb);
                float p = masked ? 0.0f : exp2f(s[n][e] * sl2 - (e < 2 ? la : lb));
                s[n][e] = p * (dp[n][e] - (e < 2 ? Da : Db));
            }
        // dQ += dS K
        for (int kk = 0; kk < FLASH_BC / 16; kk++) {
            uint32_t df[4];
            frag_a_from_acc(df, s[2 * kk], s[2 * kk + 1]);
            for (int n = 0; n < OT; n += 2) {
                uint32_t kf[4];
                frag_b_kmajor(kf, Kt, LD, kk * 16, n * 8);
                mma_m16n8k16_bf16_f32(dq[n], df, kf, dq[n]);
                mma_m16n8k16_bf16_f32(dq[n + 1], df, kf + 2, dq[n + 1]);
            }
        }
        __syncthreads();
    }
    // dQ scale, through the warp's own Q rows to 16-byte stores
    flash_acc_to_smem<OT>(Qs, LD, row0, dq, scale, scale);
    __syncwarp();
    flash_store_rows<HD>(dqkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, q0 + row0, T, Qs + row0 * LD);
}

// ---------------------------------------------------------------------------------------------
// backward, dk and dv: the K and V rows of dqkv, from lse and D

// queries [q0, q0 + BQ) of query head h: Q and dO tiles by cp.async; lse (log2 units, +inf past T)
// and D by plain loads
template <int HD>
__device__ __forceinline__ void flash_load_queries(floatX* Qt, floatX* dOt, float* lt, float* Dt, const floatX* qkv,
                                                   const floatX* dout, const float* lse, const float* Dbuf, int b, int h,
                                                   int q0, int T, int H, int KV) {
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    int C = H * HD;
    flash_load_tile<HD>(Qt, qkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, q0, FLASH_BQ, T);
    flash_load_tile<HD>(dOt, dout + (size_t)b * T * C + (size_t)h * HD, C, q0, FLASH_BQ, T);
    if (threadIdx.x < FLASH_BQ) {
        int q = q0 + threadIdx.x;
        size_t row = ((size_t)b * H + h) * T + q;
        lt[threadIdx.x] = q < T ? lse[row] * FLASH_LOG2E : INFINITY;
        Dt[threadIdx.x] = q < T ? Dbuf[row] : 0.0f;
    }
}

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dkv_kernel(floatX* dqkv, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv,
                                    int T, int H, int KV) {
    constexpr int LD = HD + 8, KT = HD / 16, NT = FLASH_BQ / 8, OT = HD / 8;
    floatX* Ks = (floatX*)dynamic_smem;            // (BC, LD)
    floatX* Vs = Ks + FLASH_BC * LD;               // (BC, LD)
    floatX* Qs = Vs + FLASH_BC * LD;               // (2, BQ, LD): double-buffered
    floatX* dOs = Qs + 2 * FLASH_BQ * LD;          // (2, BQ, LD)
    float* ls = (float*)(dOs + 2 * FLASH_BQ * LD); // (2, BQ)
    float* Ds = ls + 2 * FLASH_BQ;                 // (2, BQ)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int k0 = blockIdx.x * FLASH_BC;   // the first key tiles have the most queries: they go first
    int kvh = blockIdx.y, b = blockIdx.z, group = H / KV;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int row0 = warp * 16, ka = k0 + row0 + g, kb = ka + 8;   // this lane's two keys
    // iterations: (query head of the group, query tile from the one holding key k0 to the last)
    const int qt0 = k0 / FLASH_BQ, nq = (T - 1) / FLASH_BQ + 1 - qt0, n_it = group * nq;

    flash_load_tile<HD>(Ks, Kg, qkv_dim, k0, FLASH_BC, T);
    flash_load_tile<HD>(Vs, Vg, qkv_dim, k0, FLASH_BC, T);
    flash_load_queries<HD>(Qs, dOs, ls, Ds, qkv, dout, lse, Dbuf, b, kvh * group, qt0 * FLASH_BQ, T, H, KV);
    cp_async_commit();

    float dk[OT][4] = {}, dv[OT][4] = {};
    for (int it = 0; it < n_it; it++) {
        if (it + 1 < n_it) {
            int nb = (it + 1) % 2;
            flash_load_queries<HD>(Qs + nb * FLASH_BQ * LD, dOs + nb * FLASH_BQ * LD, ls + nb * FLASH_BQ, Ds + nb * FLASH_BQ, qkv,
                                   dout, lse, Dbuf, b, kvh * group + (it + 1) / nq, (qt0 + (it + 1) % nq) * FLASH_BQ, T, H, KV);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const floatX* Qt = Qs + it % 2 * FLASH_BQ * LD;
        const floatX* dOt = dOs + it % 2 * FLASH_BQ * LD;
        const float* lt = ls + it % 2 * FLASH_BQ;
        const float* Dt = Ds + it % 2 * FLASH_BQ;
        const int q0 = (qt0 + it % nq) * FLASH_BQ;

        // S^T = K Q^T and dP^T = V dO^T: (16 keys, BQ queries) per warp
        float s[NT][4] = {}, dp[NT][4] = {};
        for (int kk = 0; kk < KT; kk++) {
            uint32_t kf[4], vf[4];
            frag_a(kf, Ks, LD, row0, kk * 16);
            frag_a(vf, Vs, LD, row0, kk * 16);
            for (int n = 0; n < NT; n += 2) {
                uint32_t qf[4], of[4];
                frag_b_nmajor(qf, Qt, LD, n * 8, kk * 16);
                frag_b_nmajor(of, dOt, LD, n * 8, kk * 16);
                mma_m16n8k16_bf16_f32(s[n], kf, qf, s[n]);
                mma_m16n8k16_bf16_f32(s[n + 1], kf, qf + 2, s[n + 1]);
                mma_m16n8k16_bf16_f32(dp[n], vf, of, dp[n]);
                mma_m16n8k16_bf16_f32(dp[n + 1], vf, of + 2, dp[n + 1]);
            }
        }
        // P^T = exp(S^T scale - lse[query]), 0 where the query is before the key; dS^T = P^T (dP^T - D[query])
        const bool diag = q0 < k0 + row0 + 15;
        for (int n = 0; n < NT; n++)
            for (int e = 0; e < 4; e++) {
                int qi = n * 8 + 2 * t4 + e % 2;
                bool masked = diag && q0 + qi < (e < 2 ? ka : kb);
                float p = masked ? 0.0f : exp2f(s[n][e] * sl2 - lt[qi]);
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - Dt[qi]);
            }
        // dV += P^T dO and dK += dS^T Q, over the tile's queries
        for (int kk = 0; kk < FLASH_BQ / 16; kk++) {
            uint32_t pf[4], df[4];
            frag_a_from_acc(pf, s[2 * kk], s[2 * kk + 1]);
            frag_a_from_acc(df, dp[2 * kk], dp[2 * kk + 1]);
            for (int n = 0; n < OT; n += 2) {
                uint32_t of[4], qf[4];
                frag_b_kmajor(of, dOt, LD, kk * 16, n * 8);
                frag_b_kmajor(qf, Qt, LD, kk * 16, n * 8);
                mma_m16n8k16_bf16_f32(dv[n], pf, of, dv[n]);
                mma_m16n8k16_bf16_f32(dv[n + 1], pf, of + 2, dv[n + 1]);
                mma_m16n8k16_bf16_f32(dk[n], df, qf, dk[n]);
                mma_m16n8k16_bf16_f32(dk[n + 1], df, qf + 2, dk[n + 1]);
            }
        }
        __syncthreads();
    }
    // dK scale, dV, through the warp's own K and V rows to 16-byte stores
    flash_acc_to_smem<OT>(Ks, LD, row0, dk, scale, scale);
    flash_acc_to_smem<OT>(Vs, LD, row0, dv, 1.0f, 1.0f);
    __syncwarp();
    floatX* dK = dqkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    flash_store_rows<HD>(dK, qkv_dim, k0 + row0, T, Ks + row0 * LD);
    flash_store_rows<HD>(dK + (size_t)KV * HD, qkv_dim, k0 + row0, T, Vs + row0 * LD);
}

// ---------------------------------------------------------------------------------------------
// launchers (head_dim HD in {32, 64, 128}; the caller checks flash_attention_supported)

template <int HD> static inline size_t flash_forward_smem() { return (size_t)(FLASH_FWD_BR + 4 * FLASH_BC) * (HD + 8) * sizeof(floatX); }
template <int HD> static inline size_t flash_dq_smem() { return (size_t)(2 * FLASH_BR + 4 * FLASH_BC) * (HD + 8) * sizeof(floatX); }
template <int HD> static inline size_t flash_dkv_smem() {
    return (size_t)(2 * FLASH_BC + 4 * FLASH_BQ) * (HD + 8) * sizeof(floatX) + 4 * FLASH_BQ * sizeof(float);
}

template <int HD>
static inline void flash_attention_forward_hd(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV,
                                              cudaStream_t stream) {
    size_t smem = flash_forward_smem<HD>();
    cudaCheck(cudaFuncSetAttribute(flash_attention_forward_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(flash_attention_forward_kernel<HD>, dim3(ceil_div(T, FLASH_FWD_BR), H, B), FLASH_THREADS, smem, stream, out, lse, qkv, T,
           H, KV);
}
template <int HD>
static inline void flash_attention_backward_hd(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                               const floatX* qkv, int B, int T, int H, int KV, cudaStream_t stream) {
    size_t smem_dq = flash_dq_smem<HD>(), smem_dkv = flash_dkv_smem<HD>();
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward_dq_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward_dkv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dkv));
    // the dq kernel writes D, which the dk/dv kernel reads
    LAUNCH(flash_attention_backward_dq_kernel<HD>, dim3(ceil_div(T, FLASH_BR), H, B), FLASH_THREADS, smem_dq, stream, dqkv, Dbuf,
           dout, out, lse, qkv, T, H, KV);
    LAUNCH(flash_attention_backward_dkv_kernel<HD>, dim3(ceil_div(T, FLASH_BC), KV, B), FLASH_THREADS, smem_dkv, stream, dqkv,
           dout, lse, Dbuf, qkv, T, H, KV);
}

// out (B, T, H hd) bf16, lse (B, H, T) fp32 from qkv (B, T, (H + 2 KV) hd)
static inline void flash_attention_forward_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                               cudaStream_t stream = 0) {
    if (hd == 32) flash_attention_forward_hd<32>(out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 64) flash_attention_forward_hd<64>(out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 128) flash_attention_forward_hd<128>(out, lse, qkv, B, T, H, KV, stream);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
// dqkv (B, T, (H + 2 KV) hd) overwritten; Dbuf (B, H, T) fp32 scratch. The pair of kernels before issue 25 (7 tile
// products per pair): dev/cuda/attention.cu's backward v2; the model's is attention_flash_bwd5.cuh's
static inline void flash_attention_backward_v2_gpu(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                                const floatX* qkv, int B, int T, int H, int KV, int hd, cudaStream_t stream = 0) {
    if (hd == 32) flash_attention_backward_hd<32>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 64) flash_attention_backward_hd<64>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 128) flash_attention_backward_hd<128>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, stream);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
