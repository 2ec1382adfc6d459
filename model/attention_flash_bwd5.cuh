/*
 * attention_flash_bwd5.cuh — the flash attention backward in FlashAttention-2's 5 tile products per
 * (query tile, key tile) pair, with dQ accumulated in a fixed order (deterministic, no float atomics).
 * Same contract as flash_attention_backward_gpu (attention_flash_bwd.cuh, the model's pair of kernels): dqkv
 * (B, T, (H + 2 KV) hd) from dout, out, lse and qkv; D (B, H, T) = rowsum(dout * out) into Dbuf; more scratch:
 * dq_acc, FP32 (B, H, T, hd), and dq_sem, one int per (b, h, 32-query tile). Context parallelism's chunk pairs
 * (flash_attention_backward_block_gpu) use it; the plain backward does not: on an H100 the dQ handoffs between
 * key tiles made it 4x slower than the pair (attention_flash_bwd.cuh's comment).
 *   D kernel    a warp per (b, t, h) row: D = rowsum(dout * out), the dq kernel's arithmetic (same bits);
 *               it also zeroes dq_sem (so nothing has to be zero before the call).
 *   main kernel grid (T/64 key tiles, KV, B), 4 warps, each owning 16 keys (dK, dV in registers), over
 *               32-query tiles from the diagonal on, of every query head of the kv group, as the dk/dv
 *               kernel does: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q; then the 5th
 *               product, dQ (32 x hd) = dS K over the tile's 64 keys: dS^T goes to shared memory, and
 *               the 4 warps split dQ (two 16-query slices x two halves of hd).
 * dQ of a query tile is the sum over the key tiles j = hi, hi - 1, .. 0 (hi = its last query / 64) of their
 * products, in that order. Key tile j adds its product to dq_acc only when dq_sem of that query tile says
 * hi - j (key tile hi writes instead of adding, key tile 0 writes the BF16 result, scaled, into dqkv, and
 * sets the semaphore back to 0, which the next D kernel does anyway; the others set it to hi - j + 1):
 * every element is summed in the same order on any schedule, so the result is the same bits on every run.
 * The block of key tile j waits only for key tile j + 1 of the same (kv head, batch), the block one ticket
 * earlier: each block takes its tile from an atomic ticket when it starts (CUDA promises no order of
 * blocks), the last key tile first, so the awaited one is running or done. Why downwards: key tile j + 1
 * starts two query tiles later on the diagonal, so it reaches a query tile before key tile j does (2 + 2h
 * iterations earlier on the group's h-th head) and the wait is rarely a wait. Upwards (session 36 and
 * before), key tile j waited on j - 1, which reached each query tile that much later: a chain through
 * every key tile of a kv head, and on an H100 the kernel ran at 4% of the peak (results_gpu.md).
 */
#pragma once
#include "attention_flash_bwd.cuh"   // (the dk/dv products it shares with the pair; attention_flash.cuh)

#define FLASH_DQ_WARP_COLS(HD) ((HD) / 2)   // dQ columns of a warp in the 5th product (two warps per 16-query slice)

// D (B, H, T) = rowsum(dout * out), a warp per row (b, t, h); and the main kernel's nsem semaphores set to 0
// (head_dim hd a run-time argument: the work log records it, and the sum is the dq kernel's, lane-strided)
__global__ void flash_attention_backward_D_kernel(float* Dbuf, int* dq_sem, const floatX* dout, const floatX* out, int B, int T, int H,
                                                  int hd, int nsem) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, row = i / 32;
    int lane = threadIdx.x % 32;
    if (i < nsem) dq_sem[i] = 0;
    if (row >= (long long)B * T * H) return;   // (warp-uniform)
    int h = row % H, t = (row / H) % T, b = row / ((long long)H * T);
    const floatX* dO = dout + (size_t)row * hd;   // row-major (B, T, H hd): row (b, t, h) at row hd
    const floatX* O = out + (size_t)row * hd;
    float d = 0.0f;
    // (explicit FMAs here and in the kernel's P below, as in the pair: the same bits under g++, which contracts at will, and nvcc)
    for (int k = lane; k < hd; k += 32) d = fmaf(__bfloat162float(dO[k]), __bfloat162float(O[k]), d);
    d = warp_sum(d);
    if (lane == 0) Dbuf[((size_t)b * H + h) * T + t] = d;
}

// The block's (key tile, kv head, batch) comes from a ticket taken when it starts, not from blockIdx: a key
// tile waits for the one after it, and a GPU runs blocks in no promised order. The ticket counts down (the last
// key tiles first), so that block started earlier, and is running or done: the wait always ends. (The ticket is
// dq_sem's last int, zeroed by the D kernel.)
// context parallelism: a warp's dK (times scale) and dV accumulators (C layout: keys ka and ka + 8) added to a block's
// FP32 dK|dV (row stride ld, V at + vcol); keys >= Tk are not the block's. Every element is one thread's in a call and the
// calls run in stream order: a fixed order of the adds.
template <int OT>
__device__ __forceinline__ void flash_add_dkv(float* dK, size_t ld, size_t vcol, int ka, int Tk, const float dk[OT][4], const float dv[OT][4],
                                              float scale) {
    int t4 = threadIdx.x % 4;
    UNROLL
    for (int n = 0; n < OT; n++)
        UNROLL
        for (int r = 0; r < 2; r++) {
            int k = ka + 8 * r, c = n * 8 + 2 * t4;
            if (k >= Tk) continue;
            float2 *pk = (float2*)(dK + (size_t)k * ld + c), *pv = (float2*)(dK + (size_t)k * ld + vcol + c);
            float2 a = *pk, v = *pv;
            *pk = make_float2(a.x + dk[n][2 * r] * scale, a.y + dk[n][2 * r + 1] * scale);
            *pv = make_float2(v.x + dv[n][2 * r], v.y + dv[n][2 * r + 1]);
        }
}

// CP false: the model's causal attention, blk = flash_block_local (constants). CP true: a chunk pair, dQ and dK|dV added
// to FP32; query row i sits at position i + off against key row j at j, off = 0 on the diagonal and Tk for a full block
// (every key visible), so both take the causal code. (A kernel without the mask allocates its registers differently and
// spills at head_dim 128.) The zero-filled keys past Tk of a full block are not masked: their probabilities are clamped
// to <= 1 (a visible key's is exp(score - lse) <= 1 anyway), so dS stays finite and its product with their zero K is 0.
template <int HD, bool CP>
__device__ __forceinline__ void flash_bwd5_body(floatX* dqkv, float* dq_acc, int* dq_sem, const floatX* dout, const float* lse,
                                                const float* Dbuf, const floatX* qkv, int T, int H, int KV, const FlashBlock& blk) {
    constexpr int LD = HD + 8, NT = FLASH_BQ / 8, OT = HD / 8, LDS = FLASH_BC + 8;
    constexpr int QC = FLASH_DQ_WARP_COLS(HD), QN = QC / 8;   // the warp's dQ columns, in 8-column tiles
    floatX* Ks = (floatX*)dynamic_smem;            // (BC, LD)
    floatX* Vs = Ks + FLASH_BC * LD;               // (BC, LD)
    floatX* Qs = Vs + FLASH_BC * LD;               // (2, BQ, LD): double-buffered
    floatX* dOs = Qs + 2 * FLASH_BQ * LD;          // (2, BQ, LD)
    float* ls = (float*)(dOs + 2 * FLASH_BQ * LD); // (2, BQ)
    float* Ds = ls + 2 * FLASH_BQ;                 // (2, BQ)
    floatX* dSs = (floatX*)(Ds + 2 * FLASH_BQ);    // (BQ, LDS): dS of the tile, query-major (the A operand of dS K)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    __shared__ int ticket;
    const int nq = blk.nq, Tk = blk.Tk, nqt = (nq - 1) / FLASH_BQ + 1, off = CP && blk.full ? Tk : 0;   // (the model's: T, T, 0)
    if (threadIdx.x == 0) ticket = (int)(gridDim.x * gridDim.y * gridDim.z) - 1 - atomicAdd(dq_sem + (size_t)gridDim.z * H * nqt, 1);
    __syncthreads();
    int kt = ticket % gridDim.x, k0 = kt * FLASH_BC, kvh = ticket / gridDim.x % gridDim.y, b = ticket / (gridDim.x * gridDim.y), group = H / KV;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const size_t kv_ld = CP ? blk.ld : qkv_dim;   // the K|V block's row stride
    const floatX* Kg = CP ? blk.kv + (size_t)b * blk.bstride + (size_t)kvh * HD : qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float scale = rsqrtf((float)HD), sl2 = scale * FLASH_LOG2E;
    const int row0 = warp * 16, ka = k0 + row0 + g, kb = ka + 8;   // this lane's two keys
    // --doc-mask (a chunk pair's blk.qstart): the two keys' global positions, against each query's document start
    const int kga = CP ? flash_key_pos(blk, ka) : 0, kgb = CP ? flash_key_pos(blk, kb) : 0;
    const int* qst = CP && blk.qstart ? blk.qstart + (size_t)b * T + blk.qrow0 : nullptr;
    const int qsl = warp % 2, qcol = warp / 2 * QC;                  // the warp's part of dQ: 16-query slice, columns
    // iterations: (query head of the group, query tile from the one holding key k0 (position) to the last)
    const int qt0 = max(k0 - off, 0) / FLASH_BQ, nqi = nqt - qt0, n_it = group * nqi;

    flash_load_tile<HD>(Ks, Kg, kv_ld, k0, FLASH_BC, Tk);
    flash_load_tile<HD>(Vs, Vg, kv_ld, k0, FLASH_BC, Tk);
    flash_load_queries<HD>(Qs, dOs, ls, Ds, qkv, dout, lse, Dbuf, b, kvh * group, qt0 * FLASH_BQ, T, H, KV, nq);
    cp_async_commit();

    float dk[OT][4] = {}, dv[OT][4] = {};
    for (int it = 0; it < n_it; it++) {
        if (it + 1 < n_it) {
            int nb = (it + 1) % 2;
            flash_load_queries<HD>(Qs + nb * FLASH_BQ * LD, dOs + nb * FLASH_BQ * LD, ls + nb * FLASH_BQ, Ds + nb * FLASH_BQ, qkv,
                                   dout, lse, Dbuf, b, kvh * group + (it + 1) / nqi, (qt0 + (it + 1) % nqi) * FLASH_BQ, T, H, KV,
                                   nq);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const floatX* Qt = Qs + it % 2 * FLASH_BQ * LD;
        const floatX* dOt = dOs + it % 2 * FLASH_BQ * LD;
        const float* lt = ls + it % 2 * FLASH_BQ;
        const float* Dt = Ds + it % 2 * FLASH_BQ;
        const int h = kvh * group + it / nqi, qt = qt0 + it % nqi, q0 = qt * FLASH_BQ;

        // S^T = K Q^T and dP^T = V dO^T: (16 keys, BQ queries) per warp
        float s[NT][4] = {}, dp[NT][4] = {};
        flash_bwd_st_dpt<HD>(s, dp, Ks, Vs, Qt, dOt, row0);
        // P^T = exp(S^T scale - lse), 0 where the query is before the key; dS^T = P^T (dP^T - D), also to shared memory (BF16)
        const int qp0 = q0 + off, diag = qp0 < k0 + row0 + 15;   // (qp0: the tile's first query's position)
        UNROLL
        for (int n = 0; n < NT; n++)
            UNROLL
            for (int e = 0; e < 4; e++) {
                int qi = n * 8 + 2 * t4 + e % 2;
                bool masked = (diag && qp0 + qi < (e < 2 ? ka : kb)) || (qst && q0 + qi < nq && (e < 2 ? kga : kgb) < qst[q0 + qi]);
                float p = masked ? 0.0f : exp2f(CP ? fminf(fmaf(s[n][e], sl2, -lt[qi]), 0.0f) : fmaf(s[n][e], sl2, -lt[qi]));
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - Dt[qi]);
                dSs[qi * LDS + row0 + g + (e < 2 ? 0 : 8)] = __float2bfloat16(dp[n][e]);
            }
        flash_bwd_dv_dk<HD>(dv, dk, s, dp, Qt, dOt);   // dV += P^T dO, dK += dS^T Q
        DROPPABLE_SYNCTHREADS("flash_bwd5_ds");   // dS complete: every warp's keys, before any warp's dQ reads them
        // dQ part (16 queries of slice qsl, columns qcol..) = dS (16, BC) K (BC, QC)
        float dq[QN][4] = {};
        UNROLL
        for (int kk = 0; kk < FLASH_BC / 16; kk++) {
            uint32_t af[4];
            frag_a(af, dSs, LDS, qsl * 16, kk * 16);
            UNROLL
            for (int n = 0; n < QN; n += 2) {
                uint32_t kf[4];
                frag_b_kmajor(kf, Ks, LD, kk * 16, qcol + n * 8);
                mma_m16n8k16_bf16_f32(dq[n], af, kf, dq[n]);
                mma_m16n8k16_bf16_f32(dq[n + 1], af, kf + 2, dq[n + 1]);
            }
        }
        // this key tile's turn (how many add before it) on the query tile: key tiles hi, hi - 1, .. 0 add in that order (CP: onto earlier sums)
        const int turn = (CP ? min((int)gridDim.x - 1, (qp0 + FLASH_BQ - 1) / FLASH_BC) : qt / 2) - k0 / FLASH_BC;
        const bool acc32 = CP, first = turn == 0, last = k0 == 0;
        int* sem = dq_sem + ((size_t)b * H + h) * nqt + qt;
        if (threadIdx.x == 0 && !first)
            while (*(volatile int*)sem != turn) {}
        __threadfence();
        __syncthreads();
        float* acc = dq_acc + (((size_t)b * H + h) * T) * HD;   // (a chunk pair's launcher offsets it, qkv, dout, lse, D by qrow0)
        floatX* dQg = dqkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
        UNROLL
        for (int n = 0; n < QN; n++)
            UNROLL
            for (int r = 0; r < 2; r++) {
                int q = q0 + qsl * 16 + g + 8 * r, c = qcol + n * 8 + 2 * t4;
                if (q >= nq) continue;
                float2 v = make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
                if (!first || acc32) {   // L2 (.cg): the previous key tile's block wrote it, maybe on another SM
                    float2 prev = __ldcg((const float2*)(acc + (size_t)q * HD + c));
                    v = make_float2(prev.x + v.x, prev.y + v.y);
                }
                if (last && !acc32) *(uint32_t*)(dQg + (size_t)q * qkv_dim + c) = pack_bf16x2(v.x * scale, v.y * scale);
                else __stcg((float2*)(acc + (size_t)q * HD + c), v);
            }
        __threadfence();   // the sums reach L2 before the next key tile is let in
        __syncthreads();
        if (threadIdx.x == 0 && !(first && last)) *(volatile int*)sem = last ? 0 : turn + 1;
    }
    if (CP) return flash_add_dkv<OT>(blk.dkv + (size_t)b * blk.bstride + (size_t)kvh * HD, blk.ld, (size_t)KV * HD, ka, Tk, dk, dv, scale);
    // dK scale, dV, through the warp's own K and V rows to 16-byte stores
    flash_acc_to_smem<OT>(Ks, LD, row0, dk, scale, scale);
    flash_acc_to_smem<OT>(Vs, LD, row0, dv, 1.0f, 1.0f);
    __syncwarp();
    floatX* dK = dqkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    flash_store_rows<HD>(dK, qkv_dim, k0 + row0, Tk, Ks + row0 * LD);
    flash_store_rows<HD>(dK + (size_t)KV * HD, qkv_dim, k0 + row0, Tk, Vs + row0 * LD);
}
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward5_kernel(floatX* dqkv, float* dq_acc, int* dq_sem, const floatX* dout, const float* lse, const float* Dbuf,
                                 const floatX* qkv, int T, int H, int KV) {
    flash_bwd5_body<HD, false>(dqkv, dq_acc, dq_sem, dout, lse, Dbuf, qkv, T, H, KV, flash_block_local(qkv, T, H, KV, HD));
}
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward5_cp_kernel(float* dq_acc, int* dq_sem, const floatX* dout, const float* lse, const float* Dbuf, const floatX* qkv,
                                    int T, int H, int KV, FlashBlock blk) {
    flash_bwd5_body<HD, true>(nullptr, dq_acc, dq_sem, dout, lse, Dbuf, qkv, T, H, KV, blk);
}

template <int HD> static inline size_t flash_bwd5_smem() {
    return (size_t)(2 * FLASH_BC + 4 * FLASH_BQ) * (HD + 8) * sizeof(floatX) + 4 * FLASH_BQ * sizeof(float) +
           (size_t)FLASH_BQ * (FLASH_BC + 8) * sizeof(floatX);
}
// the workspace of flash_attention_backward5_gpu: dq_acc floats, dq_sem ints
static inline size_t flash_bwd5_acc_floats(int B, int T, int H, int hd) { return (size_t)B * H * T * hd; }
static inline size_t flash_bwd5_sem_ints(int B, int T, int H) { return (size_t)B * H * ceil_div(T, FLASH_BQ) + 1; }   // (+ the ticket)

// a chunk pair's kernel on blk's keys and query rows (dq_sem: flash_bwd5_sem_ints(B, blk.nq, H) ints, zero)
template <int HD>
static inline void flash_attention_backward5_pair(const float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout, const float* lse,
                                                  const floatX* qkv, int B, int T, int H, int KV, const FlashBlock& blk, cudaStream_t stream) {
    size_t smem = flash_bwd5_smem<HD>();
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward5_cp_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    size_t qr = blk.qrow0;   // the query rows' offset into dq_acc, dout, lse, D and qkv
    LAUNCH(flash_attention_backward5_cp_kernel<HD>, dim3(ceil_div(blk.Tk, FLASH_BC), KV, B), FLASH_THREADS, smem, stream,
           dq_acc + qr * HD, dq_sem, dout + qr * H * HD, lse + qr, Dbuf + qr, qkv + qr * (H + 2 * KV) * HD, T, H, KV, blk);
}
template <int HD>
static inline void flash_attention_backward5_hd(floatX* dqkv, float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout,
                                                const floatX* out, const float* lse, const floatX* qkv, int B, int T, int H, int KV,
                                                cudaStream_t stream) {
    size_t smem = flash_bwd5_smem<HD>();
    cudaCheck(cudaFuncSetAttribute(flash_attention_backward5_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int nsem = (int)flash_bwd5_sem_ints(B, T, H);
    LAUNCH(flash_attention_backward_D_kernel, ceil_div(std::max((long long)B * T * H * 32, (long long)nsem), 128), 128, 0, stream,
           Dbuf, dq_sem, dout, out, B, T, H, HD, nsem);
    LAUNCH(flash_attention_backward5_kernel<HD>, dim3(ceil_div(T, FLASH_BC), KV, B), FLASH_THREADS, smem, stream, dqkv, dq_acc,
           dq_sem, dout, lse, Dbuf, qkv, T, H, KV);
}
// context parallelism's chunk pair (model/attention_cp_cuda.cuh): blk's query rows' dQ added to dq_acc (B, H, T, hd) FP32,
// unscaled, and its keys' dK|dV to blk.dkv; D (B, H, T) computed before; dq_sem flash_bwd5_sem_ints(B, blk.nq, H) ints (zeroed here)
static inline void flash_attention_backward_block_gpu(float* dq_acc, int* dq_sem, const float* Dbuf, const floatX* dout, const float* lse,
                                                      const floatX* qkv, int B, int T, int H, int KV, int hd, const FlashBlock& blk,
                                                      cudaStream_t stream = 0) {
    if (!blk.dkv) fail(EXIT_BAD_INPUT, "flash attention: a chunk pair's backward needs its FP32 dK|dV (blk.dkv)");
    cudaCheck(cudaMemsetAsync(dq_sem, 0, flash_bwd5_sem_ints(B, blk.nq, H) * sizeof(int), stream));
    if (hd == 32) flash_attention_backward5_pair<32>(Dbuf, dq_acc, dq_sem, dout, lse, qkv, B, T, H, KV, blk, stream);
    else if (hd == 64) flash_attention_backward5_pair<64>(Dbuf, dq_acc, dq_sem, dout, lse, qkv, B, T, H, KV, blk, stream);
    else if (hd == 128) flash_attention_backward5_pair<128>(Dbuf, dq_acc, dq_sem, dout, lse, qkv, B, T, H, KV, blk, stream);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
// dqkv (B, T, (H + 2 KV) hd) overwritten; Dbuf (B, H, T) fp32 scratch; dq_acc (B, H, T, hd) fp32 scratch (16-byte
// aligned); dq_sem (B H ceil(T / 32)) ints scratch
static inline void flash_attention_backward5_gpu(floatX* dqkv, float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout,
                                                 const floatX* out, const float* lse, const floatX* qkv, int B, int T, int H, int KV,
                                                 int hd, cudaStream_t stream = 0) {
    if (hd == 32) flash_attention_backward5_hd<32>(dqkv, Dbuf, dq_acc, dq_sem, dout, out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 64) flash_attention_backward5_hd<64>(dqkv, Dbuf, dq_acc, dq_sem, dout, out, lse, qkv, B, T, H, KV, stream);
    else if (hd == 128) flash_attention_backward5_hd<128>(dqkv, Dbuf, dq_acc, dq_sem, dout, out, lse, qkv, B, T, H, KV, stream);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
