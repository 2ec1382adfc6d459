/*
 * attention_flash_bwd.cuh — the model's flash attention backward at head_dim 32, 64, 128: FlashAttention-2's
 * pair of kernels, no atomics and no semaphores (deterministic: every sum in a fixed order in one block).
 *   dq kernel    grid (H, B, T/64 query tiles), 4 warps x 16 query rows: D = rowsum(dout * out) of its rows
 *                (written to Dbuf), then over the key tiles up to its last row: S = Q K^T, dP = dO V^T,
 *                dS = P (dP - D), dQ += dS K (3 tile products); the last (longest) query tiles go first
 *   dk/dv kernel grid (KV, B, T/64 key tiles), 4 warps x 16 keys: over the 32-query tiles from the diagonal
 *                on, of every query head of the kv group (K, V loaded once per group): S^T = K Q^T,
 *                dP^T = V dO^T, dV += P^T dO, dK += dS^T Q (4 tile products); reads the dq kernel's D
 * 7 tile products per (query tile, key tile) pair where the 5-product kernel (attention_flash_bwd5.cuh, which
 * context parallelism's chunk pairs use) does 5: that one sums dQ over key tiles in order through a semaphore
 * per query tile, and on an H100 it ran at 41 TFLOP/s (4% of the BF16 peak) at DBRX-132B's attention shape,
 * where this pair ran at 157 TFLOP/s on an H200 (dev/bench/results_gpu.md): its key tiles then waited on each
 * other's dQ sums in a chain, with an L2 round trip at every handoff, which cost far more than the 2 products saved
 * (it sums downwards since, which removes the chain but not the handoffs; on session 39's H100 at dbrx-1b's shape it
 * ran at 46.9 TFLOP/s: dev/bench/results_gpu.md).
 * dqkv (B, T, (H + 2 KV) hd) overwritten; Dbuf (B, H, T) FP32 scratch.
 */
#pragma once
#include "attention_flash.cuh"

#define FLASH_BR 64   // query rows of a dq block (4 warps x 16)

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dq_kernel(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                   const floatX* qkv, int T, int H, int KV, DocMask doc) {
    constexpr int LD = HD + 8, KT = HD / 16, NT = FLASH_BC / 8, OT = HD / 8;
    floatX* Qs = (floatX*)dynamic_smem;            // (BR, LD)
    floatX* dOs = Qs + FLASH_BR * LD;              // (BR, LD)
    floatX* Ks = dOs + FLASH_BR * LD;              // (2, BC, LD): double-buffered
    floatX* Vs = Ks + 2 * FLASH_BC * LD;           // (2, BC, LD)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int q0 = (gridDim.z - 1 - blockIdx.z) * FLASH_BR;   // (the query tile is the grid's slowest index: see the launcher)
    int h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV), C = H * HD;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const floatX* dOg = dout + (size_t)b * T * C + (size_t)h * HD;
    const floatX* Og = out + (size_t)b * T * C + (size_t)h * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int ntiles = (min(q0 + FLASH_BR, T) - 1) / FLASH_BC + 1;
    const int row0 = warp * 16, qa = q0 + row0 + g, qb = qa + 8;

    // the document mask: the key tiles before the block's first row's document are skipped (they add exactly nothing)
    const int j0 = doc.start ? doc.start[(size_t)b * T + q0] / FLASH_BC : 0;

    flash_load_tile<HD>(Qs, Qg, qkv_dim, q0, FLASH_BR, T);
    flash_load_tile<HD>(dOs, dOg, C, q0, FLASH_BR, T);
    flash_load_tile<HD>(Ks + j0 % 2 * FLASH_BC * LD, Kg, qkv_dim, j0 * FLASH_BC, FLASH_BC, T);
    flash_load_tile<HD>(Vs + j0 % 2 * FLASH_BC * LD, Vg, qkv_dim, j0 * FLASH_BC, FLASH_BC, T);
    cp_async_commit();

    // while the copies fly: D of the warp's 16 rows (lanes split HD, a row at a time), and lse, in log2 units. (D's sums and
    // S scale - lse below are explicit FMAs, as nvcc contracts them anyway: g++ contracts where its optimizer sees fit,
    // differently in other kernels and units, and the emulated wgmma backward must give these bits: attention_wgmma_bwd.cuh)
    float Da = 0.0f, Db = 0.0f;
    for (int r = 0; r < 16; r++) {
        int q = q0 + row0 + r;
        float d = 0.0f;
        if (q < T)
            for (int i = lane; i < HD; i += 32) d = fmaf(__bfloat162float(dOg[(size_t)q * C + i]), __bfloat162float(Og[(size_t)q * C + i]), d);
        d = warp_sum(d);
        if (r == g) Da = d;
        if (r == g + 8) Db = d;
        if (lane == 0 && q < T) Dbuf[((size_t)b * H + h) * T + q] = d;
    }
    float la = qa < T ? lse[((size_t)b * H + h) * T + qa] * FLASH_LOG2E : 0.0f;   // rows past T: never stored
    float lb = qb < T ? lse[((size_t)b * H + h) * T + qb] * FLASH_LOG2E : 0.0f;
    // the document mask (attention.cuh): the first key of each row (0: none)
    const int loa = doc.start && qa < T ? doc.start[(size_t)b * T + qa] : 0, lob = doc.start && qb < T ? doc.start[(size_t)b * T + qb] : 0;

    float dq[OT][4] = {};
    for (int j = j0; j < ntiles; j++) {
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
        // P = exp(S scale - lse), 0 where the key is after the query (or before its document); dS = P (dP - D), into s
        const int k0 = j * FLASH_BC;
        const bool diag = k0 + FLASH_BC - 1 > q0 + row0;
        for (int n = 0; n < NT; n++)
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * t4 + e % 2;
                bool masked = (diag && key > (e < 2 ? qa : qb)) || key < (e < 2 ? loa : lob);
                float p = masked ? 0.0f : exp2f(fmaf(s[n][e], sl2, -(e < 2 ? la : lb)));
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

// the dk/dv products, shared with the 5-product kernel (attention_flash_bwd5.cuh). S^T = K Q^T and dP^T = V dO^T of a
// warp's 16 keys (K, V rows row0 ..) and a tile's BQ queries: (16, BQ) each, accumulated onto s, dp (zeros)
template <int HD>
__device__ __forceinline__ void flash_bwd_st_dpt(float (&s)[FLASH_BQ / 8][4], float (&dp)[FLASH_BQ / 8][4], const floatX* Ks,
                                                 const floatX* Vs, const floatX* Qt, const floatX* dOt, int row0) {
    constexpr int LD = HD + 8;
    UNROLL
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t kf[4], vf[4];
        frag_a(kf, Ks, LD, row0, kk * 16);
        frag_a(vf, Vs, LD, row0, kk * 16);
        UNROLL
        for (int n = 0; n < FLASH_BQ / 8; n += 2) {
            uint32_t qf[4], of[4];
            frag_b_nmajor(qf, Qt, LD, n * 8, kk * 16);
            frag_b_nmajor(of, dOt, LD, n * 8, kk * 16);
            mma_m16n8k16_bf16_f32(s[n], kf, qf, s[n]);
            mma_m16n8k16_bf16_f32(s[n + 1], kf, qf + 2, s[n + 1]);
            mma_m16n8k16_bf16_f32(dp[n], vf, of, dp[n]);
            mma_m16n8k16_bf16_f32(dp[n + 1], vf, of + 2, dp[n + 1]);
        }
    }
}
// dV += P^T dO and dK += dS^T Q over the tile's queries (P^T in s, dS^T in dp: the accumulators as A fragments)
template <int HD>
__device__ __forceinline__ void flash_bwd_dv_dk(float (&dv)[HD / 8][4], float (&dk)[HD / 8][4], const float (&s)[FLASH_BQ / 8][4],
                                                const float (&dp)[FLASH_BQ / 8][4], const floatX* Qt, const floatX* dOt) {
    constexpr int LD = HD + 8;
    UNROLL
    for (int kk = 0; kk < FLASH_BQ / 16; kk++) {
        uint32_t pf[4], df[4];
        frag_a_from_acc(pf, s[2 * kk], s[2 * kk + 1]);
        frag_a_from_acc(df, dp[2 * kk], dp[2 * kk + 1]);
        UNROLL
        for (int n = 0; n < HD / 8; n += 2) {
            uint32_t of[4], qf[4];
            frag_b_kmajor(of, dOt, LD, kk * 16, n * 8);
            frag_b_kmajor(qf, Qt, LD, kk * 16, n * 8);
            mma_m16n8k16_bf16_f32(dv[n], pf, of, dv[n]);
            mma_m16n8k16_bf16_f32(dv[n + 1], pf, of + 2, dv[n + 1]);
            mma_m16n8k16_bf16_f32(dk[n], df, qf, dk[n]);
            mma_m16n8k16_bf16_f32(dk[n + 1], df, qf + 2, dk[n + 1]);
        }
    }
}

// the dk/dv kernel (flash_load_queries, which the 5-product kernel shares, is in model/attention_flash.cuh)
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dkv_kernel(floatX* dqkv, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv,
                                    int T, int H, int KV, DocMask doc) {
    constexpr int LD = HD + 8, NT = FLASH_BQ / 8, OT = HD / 8;
    floatX* Ks = (floatX*)dynamic_smem;            // (BC, LD)
    floatX* Vs = Ks + FLASH_BC * LD;               // (BC, LD)
    floatX* Qs = Vs + FLASH_BC * LD;               // (2, BQ, LD): double-buffered
    floatX* dOs = Qs + 2 * FLASH_BQ * LD;          // (2, BQ, LD)
    float* ls = (float*)(dOs + 2 * FLASH_BQ * LD); // (2, BQ)
    float* Ds = ls + 2 * FLASH_BQ;                 // (2, BQ)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int k0 = blockIdx.z * FLASH_BC;   // (the key tile is the grid's slowest index: see the launcher)
    int kvh = blockIdx.x, b = blockIdx.y, group = H / KV;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int row0 = warp * 16, ka = k0 + row0 + g, kb = ka + 8;   // this lane's two keys
    // the document mask (attention.cuh): the queries from where each key's document ends see it no more (T: none)
    const int enda = doc.start && ka < T ? doc.end[(size_t)b * T + ka] : T, endb = doc.start && kb < T ? doc.end[(size_t)b * T + kb] : T;
    // iterations: (query head of the group, query tile from the one holding key k0 to the last; under the document mask
    // to the last holding a query of the block's last key's document: the later ones see none of the block's keys)
    const int qend = doc.start ? doc.end[(size_t)b * T + min(k0 + FLASH_BC, T) - 1] : T;
    const int qt0 = k0 / FLASH_BQ, nq = (qend - 1) / FLASH_BQ + 1 - qt0, n_it = group * nq;

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
        flash_bwd_st_dpt<HD>(s, dp, Ks, Vs, Qt, dOt, row0);
        // P^T = exp(S^T scale - lse[query]), 0 where the query is before the key; dS^T = P^T (dP^T - D[query])
        const bool diag = q0 < k0 + row0 + 15;
        for (int n = 0; n < NT; n++)
            for (int e = 0; e < 4; e++) {
                int qi = n * 8 + 2 * t4 + e % 2;
                bool masked = (diag && q0 + qi < (e < 2 ? ka : kb)) || q0 + qi >= (e < 2 ? enda : endb);
                float p = masked ? 0.0f : exp2f(fmaf(s[n][e], sl2, -lt[qi]));
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - Dt[qi]);
            }
        flash_bwd_dv_dk<HD>(dv, dk, s, dp, Qt, dOt);   // dV += P^T dO, dK += dS^T Q
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

template <int HD> static inline size_t flash_dq_smem() { return (size_t)(2 * FLASH_BR + 4 * FLASH_BC) * (HD + 8) * sizeof(floatX); }
template <int HD> static inline size_t flash_dkv_smem() {
    return (size_t)(2 * FLASH_BC + 4 * FLASH_BQ) * (HD + 8) * sizeof(floatX) + 4 * FLASH_BQ * sizeof(float);
}

template <int HD>
static inline void flash_attention_backward_hd(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                               const floatX* qkv, int B, int T, int H, int KV, cudaStream_t stream, DocMask doc) {
    size_t smem_dq = flash_dq_smem<HD>(), smem_dkv = flash_dkv_smem<HD>();
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward_dq_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward_dkv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dkv));
    // the dq kernel writes D, which the dk/dv kernel reads. Both grids put the tile in z, the slowest index, in order of
    // decreasing work (the last query tiles see the most keys, the first key tiles the most queries): blocks start in
    // linear order, so every head's longest tiles start first and the short ones fill the tail (longest processing
    // time first). With the tile in x (until session 39) every head's long-to-short run started in turn, and a
    // dbrx-1b dk/dv launch (512 blocks from 32 down to 1 unit of work, 2 per SM) left SMs idle in its tail.
    LAUNCH(flash_attention_backward_dq_kernel<HD>, dim3(H, B, ceil_div(T, FLASH_BR)), FLASH_THREADS, smem_dq, stream, dqkv, Dbuf,
           dout, out, lse, qkv, T, H, KV, doc);
    LAUNCH(flash_attention_backward_dkv_kernel<HD>, dim3(KV, B, ceil_div(T, FLASH_BC)), FLASH_THREADS, smem_dkv, stream, dqkv,
           dout, lse, Dbuf, qkv, T, H, KV, doc);
}

// the model's flash backward (attention.cuh's attention_backward_gpu): dqkv (B, T, (H + 2 KV) hd) overwritten; doc: the
// document mask
static inline void flash_attention_backward_gpu(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                                const floatX* qkv, int B, int T, int H, int KV, int hd, cudaStream_t stream = 0,
                                                DocMask doc = {}) {
    if (hd == 32) flash_attention_backward_hd<32>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, stream, doc);
    else if (hd == 64) flash_attention_backward_hd<64>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, stream, doc);
    else if (hd == 128) flash_attention_backward_hd<128>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, stream, doc);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
