/*
 * attention_flash_bwd2.cuh — flash attention backward v4 (issue 25; dev/cuda/attention.cu's -g 4, not yet the
 * model's): attention_flash_bwd.cuh's pair of kernels reshaped where it lost on an H100, plus a small sum kernel.
 *   dq kernel    grid (T/128 query tiles, H, B), 4 warps x two 16-row slices, as the forward: every K and V
 *                fragment a warp reads by ldmatrix feeds both slices (the pair's dq kernel, one slice per warp,
 *                reads each for 16 rows), and the two slices' independent MMA chains hide each other's latency.
 *                Key tiles of 32 so that S, dP (two slices) and dQ (two slices, 128 floats at HD 128) fit the
 *                registers. D = rowsum(dout * out) by 16-byte loads, through shared memory.
 *   dk/dv kernel the pair's (4 warps x 16 keys, 32-query tiles of every head of the kv group, 4 products), with
 *                the block's (query head, query tile) iterations split in two halves over two blocks: no block
 *                has more than half the longest block's work (the pair's 256 iterations at T 2048, GQA 4:1,
 *                against 171 per resident block on average: a third of the H100 idled in its tail); the key
 *                tiles are the grid's slowest index, so the longest blocks start first. Each half writes its
 *                dK, dV in FP32 to part (2, B, T, 2 KV, HD).
 *   sum kernel   dK, dV = half 0 + half 1, in bf16 into dqkv's K and V columns.
 * Deterministic: no atomics, no semaphores, every sum in a fixed order. Same contract as the pair: dqkv
 * (B, T, (H + 2 KV) hd) overwritten; Dbuf (B, H, T) and part (flash_bwd2_part_floats) FP32 scratch.
 */
#pragma once
#include "attention_flash_bwd.cuh"

#define FLASH_BWD2_BC 32   // keys per tile of the v4 dq kernel

// the dot product of two bf16 pairs packed in 32-bit words (a bf16 is the top half of a float's bits)
__device__ __forceinline__ float flash_bwd2_dot2(uint32_t x, uint32_t y) {
    return __uint_as_float(x << 16) * __uint_as_float(y << 16) + __uint_as_float(x & 0xffff0000u) * __uint_as_float(y & 0xffff0000u);
}

// D of rows r0 .. r0 + 31 of the query tile into Dsm[r0 ..] and Dbuf (rows < T), their lse (log2 units; 0 past T)
// into Lsm[r0 ..]: one warp, HD / 8 lanes per row (a 16-byte load of dout and out each), the row's partial sums
// reduced by shuffles within its lanes
template <int HD>
__device__ __forceinline__ void flash_bwd2_rows_D(float* Dsm, float* Lsm, float* Drow, const float* lrow, const floatX* dOg,
                                                  const floatX* Og, int C, int q0, int r0, int T) {
    constexpr int CH = HD / 8, RP = 32 / CH;   // lanes per row, rows per pass
    int lane = threadIdx.x % 32;
    for (int p = 0; p < 32 / RP; p++) {
        int r = r0 + p * RP + lane / CH, q = q0 + r, c = lane % CH * 8;
        float d = 0.0f;
        if (q < T) {
            uint4 a = *(const uint4*)(dOg + (size_t)q * C + c), o = *(const uint4*)(Og + (size_t)q * C + c);
            d = flash_bwd2_dot2(a.x, o.x) + flash_bwd2_dot2(a.y, o.y) + flash_bwd2_dot2(a.z, o.z) + flash_bwd2_dot2(a.w, o.w);
        }
        for (int off = CH / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
        if (lane % CH == 0) {
            Dsm[r] = d;
            Lsm[r] = q < T ? lrow[q] * FLASH_LOG2E : 0.0f;   // rows past T: dO is 0, so is their dS; never stored
            if (q < T) Drow[q] = d;
        }
    }
    __syncwarp();
}

// one 16-deep step k0 of acc[sl] += A_sl B for the slices sl >= s0: (16, NT 8) per slice, af the slices' A
// fragments; B from a shared tile (row stride ld) n-major (K, V: row n holds k) or k-major (K in dS K); each B
// fragment serves every active slice
template <bool KMAJOR, int MS, int NT>
__device__ __forceinline__ void flash_bwd2_slices_step(float (&acc)[MS][NT][4], const uint32_t (&af)[MS][4], const floatX* Bt, int ld,
                                                       int k0, int s0) {
    UNROLL
    for (int n = 0; n < NT; n += 2) {
        uint32_t bf[4];
        if (KMAJOR) frag_b_kmajor(bf, Bt, ld, k0, n * 8);
        else frag_b_nmajor(bf, Bt, ld, n * 8, k0);
        UNROLL
        for (int sl = 0; sl < MS; sl++) if (sl >= s0) {
            mma_m16n8k16_bf16_f32(acc[sl][n], af[sl], bf, acc[sl][n]);
            mma_m16n8k16_bf16_f32(acc[sl][n + 1], af[sl], bf + 2, acc[sl][n + 1]);
        }
    }
}
// acc[sl] += (rows wrow0 + 16 sl .. + 15 of As) Bt^T over HD (S = Q K^T, dP = dO V^T)
template <int HD, int MS, int NT>
__device__ __forceinline__ void flash_bwd2_slices_abt(float (&acc)[MS][NT][4], const floatX* As, const floatX* Bt, int wrow0, int s0) {
    UNROLL
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t af[MS][4];
        UNROLL
        for (int sl = 0; sl < MS; sl++) if (sl >= s0) frag_a(af[sl], As, HD + 8, wrow0 + 16 * sl, kk * 16);
        flash_bwd2_slices_step<false>(acc, af, Bt, HD + 8, kk * 16, s0);
    }
}

template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward2_dq_kernel(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                    const floatX* qkv, int T, int H, int KV) {
    constexpr int LD = HD + 8, BC = FLASH_BWD2_BC, NT = BC / 8, OT = HD / 8, BR = FLASH_FWD_BR, MS = BR / 64;
    floatX* Qs = (floatX*)dynamic_smem;            // (BR, LD)
    floatX* dOs = Qs + BR * LD;                    // (BR, LD)
    floatX* Ks = dOs + BR * LD;                    // (2, BC, LD): double-buffered
    floatX* Vs = Ks + 2 * BC * LD;                 // (2, BC, LD)
    float* Dsm = (float*)(Vs + 2 * BC * LD);       // (BR)
    float* Lsm = Dsm + BR;                         // (BR)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * BR;    // the last (longest) query tiles first
    int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV), C = H * HD;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const floatX* dOg = dout + (size_t)b * T * C + (size_t)h * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int ntiles = (min(q0 + BR, T) - 1) / BC + 1;
    const int wrow0 = warp * 16 * MS;              // the warp's first row in the tile

    flash_load_tile<HD>(Qs, Qg, qkv_dim, q0, BR, T);
    flash_load_tile<HD>(dOs, dOg, C, q0, BR, T);
    flash_load_tile<HD>(Ks, Kg, qkv_dim, 0, BC, T);
    flash_load_tile<HD>(Vs, Vg, qkv_dim, 0, BC, T);
    cp_async_commit();

    // while the copies fly: D and lse of the warp's rows, into shared memory (read back per tile: registers are short)
    flash_bwd2_rows_D<HD>(Dsm, Lsm, Dbuf + ((size_t)b * H + h) * T, lse + ((size_t)b * H + h) * T, dOg,
                          out + (size_t)b * T * C + (size_t)h * HD, C, q0, wrow0, T);

    float dq[MS][OT][4] = {};
    for (int j = 0; j < ntiles; j++) {
        // one barrier a tile (the pair has two): tile j has landed for every thread, and every warp is done with
        // tile j - 1, whose buffer the copy of tile j + 1, issued after it, overwrites while tile j is used
        cp_async_wait<0>();
        DROPPABLE_SYNCTHREADS("flash_bwd2_dq_tile");
        if (j + 1 < ntiles) {
            flash_load_tile<HD>(Ks + (j + 1) % 2 * BC * LD, Kg, qkv_dim, (j + 1) * BC, BC, T);
            flash_load_tile<HD>(Vs + (j + 1) % 2 * BC * LD, Vg, qkv_dim, (j + 1) * BC, BC, T);
            cp_async_commit();
        }
        const floatX* Kt = Ks + j % 2 * BC * LD;
        const floatX* Vt = Vs + j % 2 * BC * LD;
        const int k0 = j * BC;
        // the warp's first slice with a key of this tile at or before its last row; MS: none (warp-uniform)
        const int s0 = k0 > q0 + wrow0 ? min(MS, (k0 - q0 - wrow0) / 16) : 0;
        if (s0 < MS) {
            // S = Q K^T, then dP = dO V^T: (16, BC) per slice; each K (V) fragment serves every active slice
            float s[MS][NT][4] = {}, dp[MS][NT][4] = {};
            flash_bwd2_slices_abt<HD>(s, Qs, Kt, wrow0, s0);
            flash_bwd2_slices_abt<HD>(dp, dOs, Vt, wrow0, s0);
            // P = exp(S scale - lse), 0 where the key is after the query; dS = P (dP - D), into s
            UNROLL
            for (int sl = 0; sl < MS; sl++) if (sl >= s0) {
                const int ra = wrow0 + 16 * sl + g, qa = q0 + ra, qb = qa + 8;
                const float la = Lsm[ra], lb = Lsm[ra + 8], Da = Dsm[ra], Db = Dsm[ra + 8];
                const bool diag = k0 + BC - 1 > qa - g;
                UNROLL
                for (int n = 0; n < NT; n++)
                    UNROLL
                    for (int e = 0; e < 4; e++) {
                        bool masked = diag && k0 + n * 8 + 2 * t4 + e % 2 > (e < 2 ? qa : qb);
                        float p = masked ? 0.0f : exp2f(s[sl][n][e] * sl2 - (e < 2 ? la : lb));
                        s[sl][n][e] = p * (dp[sl][n][e] - (e < 2 ? Da : Db));
                    }
            }
            // dQ += dS K; each K fragment serves every active slice
            UNROLL
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t df[MS][4];
                UNROLL
                for (int sl = 0; sl < MS; sl++) if (sl >= s0) frag_a_from_acc(df[sl], s[sl][2 * kk], s[sl][2 * kk + 1]);
                flash_bwd2_slices_step<true>(dq, df, Kt, LD, kk * 16, s0);
            }
        }
    }
    // dQ scale, through the warp's own Q rows (read by no other warp) to 16-byte stores
    UNROLL
    for (int sl = 0; sl < MS; sl++) {
        flash_acc_to_smem<OT>(Qs, LD, wrow0 + 16 * sl, dq[sl], scale, scale);
        __syncwarp();
        flash_store_rows<HD>(dqkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, q0 + wrow0 + 16 * sl, T, Qs + (wrow0 + 16 * sl) * LD);
    }
}

// the dk/dv kernel of attention_flash_bwd.cuh on half of its iterations: grid (2 halves x KV x B, key tiles)
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward2_dkv_kernel(float* part, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv, int B,
                                     int T, int H, int KV) {
    constexpr int LD = HD + 8, NT = FLASH_BQ / 8, OT = HD / 8;
    floatX* Ks = (floatX*)dynamic_smem;            // (BC, LD)
    floatX* Vs = Ks + FLASH_BC * LD;               // (BC, LD)
    floatX* Qs = Vs + FLASH_BC * LD;               // (2, BQ, LD): double-buffered
    floatX* dOs = Qs + 2 * FLASH_BQ * LD;          // (2, BQ, LD)
    float* ls = (float*)(dOs + 2 * FLASH_BQ * LD); // (2, BQ)
    float* Ds = ls + 2 * FLASH_BQ;                 // (2, BQ)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int half = blockIdx.x % 2, kvh = blockIdx.x / 2 % KV, b = blockIdx.x / (2 * KV), group = H / KV;
    int k0 = blockIdx.y * FLASH_BC;   // the first key tiles have the most queries: the grid's slowest index, they go first
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int row0 = warp * 16, ka = k0 + row0 + g, kb = ka + 8;   // this lane's two keys
    // iterations (query head of the group, query tile from the one holding key k0 to the last); this half's share
    const int qt0 = k0 / FLASH_BQ, nq = (T - 1) / FLASH_BQ + 1 - qt0, n_it = group * nq;
    const int it0 = half ? n_it / 2 : 0, it1 = half ? n_it : n_it / 2;

    flash_load_tile<HD>(Ks, Kg, qkv_dim, k0, FLASH_BC, T);
    flash_load_tile<HD>(Vs, Vg, qkv_dim, k0, FLASH_BC, T);
    if (it0 < it1)
        flash_load_queries<HD>(Qs, dOs, ls, Ds, qkv, dout, lse, Dbuf, b, kvh * group + it0 / nq, (qt0 + it0 % nq) * FLASH_BQ, T, H, KV);
    cp_async_commit();

    float dk[OT][4] = {}, dv[OT][4] = {};
    for (int it = it0; it < it1; it++) {
        const int cur = (it - it0) % 2;
        cp_async_wait<0>();   // one barrier an iteration, as in the dq kernel
        DROPPABLE_SYNCTHREADS("flash_bwd2_dkv_tile");
        if (it + 1 < it1) {
            int nb = 1 - cur;
            flash_load_queries<HD>(Qs + nb * FLASH_BQ * LD, dOs + nb * FLASH_BQ * LD, ls + nb * FLASH_BQ, Ds + nb * FLASH_BQ, qkv,
                                   dout, lse, Dbuf, b, kvh * group + (it + 1) / nq, (qt0 + (it + 1) % nq) * FLASH_BQ, T, H, KV);
            cp_async_commit();
        }
        const floatX* Qt = Qs + cur * FLASH_BQ * LD;
        const floatX* dOt = dOs + cur * FLASH_BQ * LD;
        const float* lt = ls + cur * FLASH_BQ;
        const float* Dt = Ds + cur * FLASH_BQ;
        const int q0 = (qt0 + it % nq) * FLASH_BQ;

        // S^T = K Q^T and dP^T = V dO^T: (16 keys, BQ queries) per warp
        float s[NT][4] = {}, dp[NT][4] = {};
        flash_bwd_st_dpt<HD>(s, dp, Ks, Vs, Qt, dOt, row0);
        // P^T = exp(S^T scale - lse[query]), 0 where the query is before the key; dS^T = P^T (dP^T - D[query]);
        // a lane's two query columns are adjacent: their lse and D in one 8-byte load each
        const bool diag = q0 < k0 + row0 + 15;
        UNROLL
        for (int n = 0; n < NT; n++) {
            const int qi = n * 8 + 2 * t4;
            const float2 l2 = *(const float2*)(lt + qi), D2 = *(const float2*)(Dt + qi);
            UNROLL
            for (int e = 0; e < 4; e++) {
                bool masked = diag && q0 + qi + e % 2 < (e < 2 ? ka : kb);
                float p = masked ? 0.0f : exp2f(s[n][e] * sl2 - (e % 2 ? l2.y : l2.x));
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - (e % 2 ? D2.y : D2.x));
            }
        }
        flash_bwd_dv_dk<HD>(dv, dk, s, dp, Qt, dOt);   // dV += P^T dO, dK += dS^T Q
    }
    // this half's dK (scaled) and dV, FP32, straight from the accumulators: a quad's 8 floats of a row are contiguous
    float* P = part + (size_t)half * B * T * 2 * KV * HD;
    UNROLL
    for (int r = 0; r < 2; r++) {
        const int key = r ? kb : ka;
        if (key >= T) continue;
        float* pk = P + ((size_t)b * T + key) * 2 * KV * HD + (size_t)kvh * HD + 2 * t4;
        float* pv = pk + (size_t)KV * HD;
        UNROLL
        for (int n = 0; n < OT; n++) {
            *(float2*)(pk + n * 8) = make_float2(dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
            *(float2*)(pv + n * 8) = make_float2(dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

// dqkv's K and V columns = the two halves' sums, in bf16; 4 values a thread
__global__ void flash_attention_backward2_sum_kernel(floatX* dqkv, const float* part, int B, int T, int H, int KV, int hd) {
    size_t n4 = (size_t)B * T * 2 * KV * hd / 4, i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 a = ((const float4*)part)[i], c = ((const float4*)part)[i + n4];
    size_t row = i * 4 / (2 * KV * hd), col = i * 4 % (2 * KV * hd);
    floatX* d = dqkv + row * (H + 2 * KV) * hd + (size_t)H * hd + col;
    *(uint2*)d = make_uint2(pack_bf16x2(a.x + c.x, a.y + c.y), pack_bf16x2(a.z + c.z, a.w + c.w));
}

// the FP32 scratch of the two halves' dK, dV
static inline size_t flash_bwd2_part_floats(int B, int T, int KV, int hd) { return 2 * (size_t)B * T * 2 * KV * hd; }
template <int HD> static inline size_t flash_bwd2_dq_smem() {
    return (size_t)(2 * FLASH_FWD_BR + 4 * FLASH_BWD2_BC) * (HD + 8) * sizeof(floatX) + 2 * FLASH_FWD_BR * sizeof(float);
}

template <int HD>
static inline void flash_attention_backward2_hd(floatX* dqkv, float* Dbuf, float* part, const floatX* dout, const floatX* out,
                                                const float* lse, const floatX* qkv, int B, int T, int H, int KV, cudaStream_t stream) {
    size_t smem_dq = flash_bwd2_dq_smem<HD>(), smem_dkv = flash_dkv_smem<HD>();
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward2_dq_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward2_dkv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dkv));
    // the dq kernel writes D, which the dk/dv kernel reads; the sum kernel reads the dk/dv kernel's halves
    LAUNCH(flash_attention_backward2_dq_kernel<HD>, dim3(ceil_div(T, FLASH_FWD_BR), H, B), FLASH_THREADS, smem_dq, stream, dqkv, Dbuf,
           dout, out, lse, qkv, T, H, KV);
    LAUNCH(flash_attention_backward2_dkv_kernel<HD>, dim3(2 * KV * B, ceil_div(T, FLASH_BC)), FLASH_THREADS, smem_dkv, stream, part,
           dout, lse, Dbuf, qkv, B, T, H, KV);
    size_t n4 = (size_t)B * T * 2 * KV * HD / 4;
    LAUNCH(flash_attention_backward2_sum_kernel, (unsigned)ceil_div((long long)n4, 256LL), 256, 0, stream, dqkv, part, B, T, H, KV, HD);
}

// backward v4: dqkv (B, T, (H + 2 KV) hd) overwritten; Dbuf (B, H, T), part (flash_bwd2_part_floats) scratch
static inline void flash_attention_backward2_gpu(floatX* dqkv, float* Dbuf, float* part, const floatX* dout, const floatX* out,
                                                 const float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                                 cudaStream_t stream = 0) {
    if (hd == 32) flash_attention_backward2_hd<32>(dqkv, Dbuf, part, dout, out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 64) flash_attention_backward2_hd<64>(dqkv, Dbuf, part, dout, out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 128) flash_attention_backward2_hd<128>(dqkv, Dbuf, part, dout, out, lse, qkv, B, T, H, KV, stream);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
