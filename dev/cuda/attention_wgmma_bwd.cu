/*
 * attention_wgmma_bwd.cu — a causal GQA flash attention backward on Hopper's warpgroup MMA (model/wgmma.cuh), issue
 * 25's Hopper attention after the forward (attention_wgmma.cu). v3 and v4 are the model's --attention-bwd wgmma and
 * wgmma-overlap since session 41 (model/attention_wgmma_bwd.cuh: their kernels, the keys kernel v1, v2 share, the helpers);
 * v1, v2 (the keys kernel with this file's semaphore dQ) stay here.
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
 *   backward wgmma v3  (the model's --attention-bwd wgmma) the pair (7 products, no semaphores, no scratch but D) on wgmma, after the D kernel:
 *        dq kernel    grid (H, B, T/128 query tiles, the last first), 2 warpgroups x 64 query rows, the wgmma forward's
 *                     shape: Q, dO (128 rows) once, K, V tiles of 64 keys double-buffered by cp.async; per key tile up to
 *                     the block's last row, in order: S, dP (64 x 64) = Q K^T, dO V^T (ss, K-major), dS = P (dP - D),
 *                     dQ (64 x hd) += dS K (A = dS from registers, K MN-major); dQ scale stored as bf16 (plain stores)
 *        dk/dv kernel v2 without dQ: grid (T/128 key tiles, KV, B), key tile 0 (the most queries) of every head first;
 *                     2 warpgroups x 64 keys sharing the Q, dO tiles; S^T, dP^T, dV += P^T dO, dK += dS^T Q
 *   backward wgmma v4  (--attention-bwd wgmma-overlap) v3 with the dq kernel on FlashAttention-3's intra-warpgroup overlap (the wgmma forward v2's order):
 *        S, dP of tile j + 1 issued with dQ += dS K of tile j, their dS computed while that runs; 3 K/V buffers, one
 *        barrier a tile. The same dk/dv kernel.
 *   Registers (nvcc 13, sm_90a; hd 128 / 64): v3's dq 177 / 145, v4's 191 / 159, dk/dv 254 / 188; v1 244 / 205, v2 248;
 *        no spill, no wgmma serialization. On a GPU, -v 3 also times each of v3, v4's kernels alone.
 *   bwd5 (mma.sync) and the model's backward (the dq + dk/dv pair, model/attention_flash_bwd.cuh) timed alongside
 * Validation: dqkv against the CPU reference (model/attention.cuh; 1e-2) and, emulated, bit for bit: v1, v2 against bwd5
 * (the same k-order sums: S^T, dP^T over head dims, dK, dV over queries in 16-query steps in bwd5's order, dQ per key tile
 * over its 64 keys then added in key-tile order), v3, v4 against the pair (its order: dQ over all keys in one accumulator,
 * key tiles in order, dK, dV over the group's heads and queries; the extra wholly masked tile adds zeros; S scale - lse one
 * explicit FMA in every kernel: g++ contracted it in some and not in others). On a GPU at the
 * timing shape against bwd5 (-v 3, 4: the pair; 1e-2).
 *   make dev/cuda/attention_wgmma_bwd && ./dev/cuda/attention_wgmma_bwd [-v 1|2|3|4] [-b B] [-t T] [-h H] [-k KV] [-d hd]
 *     default dbrx-132b's attention shape B 8, T 4096, H 48, KV 8, hd 128; under the emulator small shapes. dbrx-1b's:
 *     -v 3 -b 8 -t 2048 -h 8 -k 2 -d 128 (v3 and v4 beside the pair).
 *     -p 1 (emulated): v1 without the barrier between the dS stores and dQ's wgmma (the race detector must name it);
 *     -p 2: v3's dq kernel without the barrier after a tile's wgmma, before K, V tile j + 2 is copied over tile j;
 *     -p 3: v4's dq kernel with 2 K/V buffers (tile j + 2 copied over K(j) while dQ's wgmma reads it).
 */
#include "common.h"
#include "../../model/attention.cuh"   // (and model/attention_wgmma_bwd.cuh: v3, v4, their helpers)

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

// v1 (NWG 1) and v2 (NWG 2, hd 128): the model's keys kernel (model/attention_wgmma_bwd.cuh) with this dQ policy: dS^T
// stored to shared memory, dQ = dS K per tile onto the key tiles before through a semaphore per query tile (wgb_dq_step).
// v2's dQ: warpgroup w the head dims 64 w .. over both key chunks, summed chunk by chunk (bwd5's order). PLANT 1 (v1):
// without the barrier that orders the dS stores before dQ's wgmma reads them, the negative control
template <int PLANT> struct WgbSemDq {
    static constexpr bool ON = true;
    float* dq_acc;
    int* dq_sem;   // (B, H, query tiles) + the ticket
    // the key tile from a ticket, counted down: the last first (bwd5's reason: key tile j waits for j + 1, which started
    // earlier, so is running or done)
    __device__ void block(int* ticket, int& kt, int& kvh, int& b, int H, int nqt) const {
        if (threadIdx.x == 0) *ticket = (int)(gridDim.x * gridDim.y * gridDim.z) - 1 - atomicAdd(dq_sem + (size_t)gridDim.z * H * nqt, 1);
        __syncthreads();
        kt = *ticket % gridDim.x, kvh = *ticket / gridDim.x % gridDim.y, b = *ticket / (gridDim.x * gridDim.y);
    }
    __device__ void after_issue() const {
        wgmma_fence_proxy();                     // dS's stores visible to the asynchronous proxy...
        if constexpr (!PLANT) __syncthreads();   // ...of every warp's keys, before dQ's wgmma reads them
    }
    template <int HD, int NWG>
    __device__ void step(floatX* dqkv, const char* dSs, const char* Ks, int it, int nqi, int b, int h, int qt, int kt, int T, int H,
                         size_t qkv_dim, float scale) const {
        wgb_dq_step<HD, NWG>(dqkv, dq_acc, dq_sem, dSs, Ks, it, nqi, b, h, qt, kt, T, H, qkv_dim, scale);
    }
};

static size_t wgb_sem_ints(int B, int T, int H) { return (size_t)B * H * ceil_div(T, WGB_BQ) + 1; }   // (+ the ticket)

template <int HD, int NWG, int PLANT>
static void attention_backward_wgmma_hd(floatX* dqkv, float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout, const floatX* out,
                                        const float* lse, const floatX* qkv, int B, int T, int H, int KV) {
    size_t smem = wgb_keys_smem<HD, NWG, WgbSemDq<PLANT>>();
    int nsem = (int)wgb_sem_ints(B, T, H);
    LAUNCH(flash_attention_backward_D_kernel, ceil_div(std::max((long long)B * T * H * 32, (long long)nsem), 128), 128, 0, 0, Dbuf, dq_sem,
           dout, out, B, T, H, HD, nsem);
    auto kernel = attention_backward_wgmma_keys<HD, NWG, WgbSemDq<PLANT>>;
    LAUNCH(kernel, dim3(ceil_div(T, 64 * NWG), KV, B), 128 * NWG, smem, 0, dqkv, WgbSemDq<PLANT>{dq_acc, dq_sem}, dout, lse, Dbuf, qkv, T,
           H, KV, DocMask{});
}
// (v3, v4: model/attention_wgmma_bwd.cuh's attention_backward_wgmma_pair, the model's --attention-bwd wgmma, wgmma-overlap)
// V 1, 2, 3, 4: v1, v2 (hd 128 only), v3, v4; PLANT 1: v1's dS race, v3's and v4's K/V races
template <int V, int PLANT>
static void wgmma_backward_version(floatX* dqkv, float* Dbuf, float* dq_acc, int* dq_sem, const floatX* dout, const floatX* out,
                                   const float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd, int parts = 7) {
    constexpr int NWG = V == 2 ? 2 : 1;
    if constexpr (V >= 3) {
        if (hd == 128) attention_backward_wgmma_pair<128, V == 4, PLANT>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, parts, 0);
        else attention_backward_wgmma_pair<64, V == 4, PLANT>(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, parts, 0);
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
#define WGB_RUN(V) [&](int parts) { if (plant) wgmma_backward_version<V, 1>(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd, parts); \
                                    else wgmma_backward_version<V, 0>(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd, parts); }
    std::function<void(int)> bwd[6] = {
        [&](int) { flash_attention_backward5_gpu(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        WGB_RUN(1),
        [&](int) { wgmma_backward_version<2, 0>(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd); },
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
