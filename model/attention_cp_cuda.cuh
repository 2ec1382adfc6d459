/*
 * attention_cp_cuda.cuh — context parallelism's attention on the GPU (--context-parallel N): this rank's queries (its two
 * balanced chunks, model/attention_ring.h) against every CP rank's K|V block (B, Tl, 2*kv*hd), BF16, pair k on rank
 * rank - k's, wherever the caller keeps it (kv_at[k]: one of the ring's two slots, or the all-gather form's rank-order
 * slot, parallel/context_parallel_cuda.cuh), as N chunk pairs on the flash kernels (attention_flash.cuh's
 * FlashBlock: the causal diagonal for the rank's own block, a full block with a query range or a key prefix for the
 * others), in the ring's order, each pair's (out, lse) merged by the online softmax in FP32. The backward runs the
 * same pairs with the merged lse and D = rowsum(dout out): dq summed over the pairs in FP32, this rank's dK|dV of every
 * block in FP32 (dkv_at[k]), which the group sums at the rows' owners (a ring or a reduce-scatter,
 * parallel/context_parallel_cuda.cuh). No communication here.
 */
#pragma once
#include <vector>
#include "attention.cuh"

// the model's hooks (DbrxGPU.attn; NULL: the local attention): the same contract as the CPU's AttentionHooks
typedef struct {
    void (*forward)(void* ctx, floatX* out, float* lse, const floatX* qkv);
    void (*backward)(void* ctx, floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse);
    // the load-balancing loss over the CP group's tokens (NULL: each rank's own, as under data parallelism): lbl takes
    // st (L, 2E) = every layer's expert counts and sums of the router probabilities over this rank's N tokens, returns the
    // loss summed over the layers at the group's n N tokens (the CPU's cp_lbl formula) and keeps the group's counts;
    // lbl_counts gives the router backward layer l's group counts (on the device) and the weight / n
    double (*lbl)(void* ctx, double* st, int N, int E, int k, int L, float weight);
    float (*lbl_counts)(void* ctx, int l, float weight, const int** counts_dev);
    double (*batch)(void* ctx, const int* inputs);   // (NULL: none) a forward's tokens (host, B x Tl), before its first layer (the CPU's)
    void* ctx;
} AttentionHooksGPU;

// kv (B*Tl, 2*kv*hd) = the K|V columns of qkv (B*Tl, qkv_dim)
__global__ void cp_pack_kv_kernel(floatX* kv, const floatX* qkv, size_t rows, int H, int KV, int hd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, kvw = 2 * (size_t)KV * hd;
    if (i >= rows * kvw) return;
    kv[i] = qkv[(i / kvw) * (size_t)(H + 2 * KV) * hd + H * hd + i % kvw];
}
// the K|V columns of dqkv = dkv (FP32, this rank's rows after the reduce-scatter), rounded to BF16
__global__ void cp_unpack_dkv_kernel(floatX* dqkv, const float* dkv, size_t rows, int H, int KV, int hd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, kvw = 2 * (size_t)KV * hd;
    if (i >= rows * kvw) return;
    dqkv[(i / kvw) * (size_t)(H + 2 * KV) * hd + H * hd + i % kvw] = __float2bfloat16(dkv[i]);
}

// the chunk pair of step k (0 .. n-1): this rank's queries against the K|V block of CP rank s = rank - k (mod n), the
// ring's order (k = 0: its own block). Rank s holds chunks s and 2n-1-s (rows [0, c) and [c, 2c) of Tl = 2c); by
// global position: own block, the causal diagonal over all 2c rows (the rows are in position order); s < rank,
// every query row sees the block's first chunk fully and its second not at all; s > rank, only the second query
// chunk (2n-1-rank) sees the block, both chunks fully. kv and dkv: the block's K|V (B, Tl, 2 kv hd), BF16, and its
// FP32 gradient, added to.
// qstart (B, Tl; NULL: none): --doc-mask's document starts of this rank's rows (global positions), against the block's keys'
// global positions (rank s's chunks s and 2n-1-s)
static inline FlashBlock cp_chunk_pair(const floatX* kv, float* dkv, int k, int n, int rank, int Tl, int KV, int hd, const int* qstart = nullptr) {
    int s = ((rank - k) % n + n) % n, c = Tl / 2;
    FlashBlock p = s == rank ? flash_block_pair(kv, dkv, Tl, KV, hd, Tl, 0, Tl, 0)
                 : s < rank  ? flash_block_pair(kv, dkv, Tl, KV, hd, c, 0, Tl, 1)
                             : flash_block_pair(kv, dkv, Tl, KV, hd, Tl, c, c, 1);
    p.qstart = qstart;
    p.kpos0 = s * c; p.kpos1 = (2 * n - 1 - s) * c; p.kc = c;
    return p;
}

// the scratch of the chunk pairs (B, Tl, H, hd this rank's): a pair's partial output and lse, the merged output in FP32;
// the backward's D, FP32 dQ and the dQ semaphores
typedef struct {
    floatX* out_p; float *lse_p, *o32;      // (B, Tl, H hd), (B, H, Tl), (B, Tl, H hd)
    float *D, *dq_acc; int* dq_sem;         // (B, H, Tl), (B, H, Tl, hd), flash_bwd5_sem_ints(B, Tl, H)
} CpAttnScratch;
static inline size_t cp_attn_scratch_bytes(int B, int Tl, int H, int hd) {
    size_t rows = (size_t)B * Tl * H;
    return rows * hd * (sizeof(floatX) + 2 * sizeof(float)) + rows * 2 * sizeof(float) + flash_bwd5_sem_ints(B, Tl, H) * sizeof(int);
}

// o32 (B, Tl, H hd) <-> out bf16
__global__ void cp_out_to_f32_kernel(float* o32, const floatX* out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o32[i] = __bfloat162float(out[i]);
}
__global__ void cp_out_from_f32_kernel(floatX* out, const float* o32, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(o32[i]);
}
// the online-softmax merge of a pair's partial (out_p, lse_p) into the running (o32, lse) over the query rows
// [qrow0, qrow0 + nq): lse' = log(e^lse + e^lse_p), o' = o e^(lse - lse') + o_p e^(lse_p - lse'); a warp per row (b, h, t)
__global__ void cp_merge_kernel(float* o32, float* lse, const floatX* out_p, const float* lse_p, int B, int Tl, int H, int hd, int qrow0,
                                int nq) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)B * H * nq) return;   // (warp-uniform)
    int t = qrow0 + row % nq, h = (row / nq) % H, b = row / ((size_t)nq * H);
    size_t lrow = ((size_t)b * H + h) * Tl + t, orow = (((size_t)b * Tl + t) * H + h) * hd;
    if (lse_p[lrow] == -INFINITY) return;   // (--doc-mask: the pair's keys all before the row's document; warp-uniform)
    float la = lse[lrow], lb = lse_p[lrow], mx = fmaxf(la, lb), ln = mx + logf(expf(la - mx) + expf(lb - mx));
    float fa = expf(la - ln), fb = expf(lb - ln);
    for (int i = lane; i < hd; i += 32) o32[orow + i] = o32[orow + i] * fa + __bfloat162float(out_p[orow + i]) * fb;
    __syncwarp();   // (every lane has read lse before lane 0 rewrites it)
    if (lane == 0) lse[lrow] = ln;
}
// the Q columns of dqkv (B, Tl, (H + 2 KV) hd) = dq_acc (B, H, Tl, hd) times the softmax scale, rounded to BF16
__global__ void cp_dq_store_kernel(floatX* dqkv, const float* dq_acc, int B, int Tl, int H, int KV, int hd) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * H * Tl * hd) return;
    int d = i % hd, t = (i / hd) % Tl, h = (i / ((size_t)hd * Tl)) % H, b = i / ((size_t)hd * Tl * H);
    dqkv[((size_t)b * Tl + t) * (H + 2 * KV) * hd + (size_t)h * hd + d] = __float2bfloat16(dq_acc[i] * rsqrtf((float)hd));
}

// the rank's attention over the group's K|V: out, lse of its Tl rows; the n chunk pairs in the ring's order, pair k on the
// block kv_at[k] (B, Tl, 2 kv hd) of rank rank - k, the partial results merged into FP32 (a fixed order: the same bits every
// run). before_pair (NULL: every block in place already) is called before pair k's launches: the ring's transport issues
// the next block's hop there and makes `stream` wait for block k's arrival (parallel/context_parallel_cuda.cuh)
static inline void cp_attention_forward_at_gpu(floatX* out, float* lse, const floatX* qkv, const floatX* const* kv_at, const CpAttnScratch* sc,
                                               int B, int Tl, int H, int KV, int hd, int n, int rank, cudaStream_t stream,
                                               void (*before_pair)(void* ctx, int k), void* ctx, const int* qstart = nullptr) {
    size_t on = (size_t)B * Tl * H * hd;
    for (int k = 0; k < n; k++) {
        if (before_pair) before_pair(ctx, k);
        FlashBlock p = cp_chunk_pair(kv_at[k], nullptr, k, n, rank, Tl, KV, hd, qstart);
        if (k == 0) {
            flash_attention_forward_block_gpu(out, lse, qkv, B, Tl, H, KV, hd, p, stream);
            if (n > 1) LAUNCH(cp_out_to_f32_kernel, ceil_div((long long)on, 256), 256, 0, stream, sc->o32, out, on);
            continue;
        }
        flash_attention_forward_block_gpu(sc->out_p, sc->lse_p, qkv, B, Tl, H, KV, hd, p, stream);
        LAUNCH(cp_merge_kernel, ceil_div((long long)B * H * p.nq, 4), 128, 0, stream, sc->o32, lse, sc->out_p, sc->lse_p, B, Tl, H, hd,
               p.qrow0, p.nq);
    }
    if (n > 1) LAUNCH(cp_out_from_f32_kernel, ceil_div((long long)on, 256), 256, 0, stream, out, sc->o32, on);
}
// pair k's block of kv_all (n, B, Tl, 2 kv hd), every rank's in rank order: rank - k's slot
template <typename T> static inline std::vector<T*> cp_rank_order_at(T* all, size_t blk, int n, int rank) {
    std::vector<T*> at(n);
    for (int k = 0; k < n; k++) at[k] = all + (size_t)(((rank - k) % n + n) % n) * blk;
    return at;
}
// the same over kv_all (n, B, Tl, 2 kv hd) in rank order (the all-gather form, the kernels' tests)
static inline void cp_attention_forward_gpu(floatX* out, float* lse, const floatX* qkv, const floatX* kv_all, const CpAttnScratch* sc,
                                            int B, int Tl, int H, int KV, int hd, int n, int rank, cudaStream_t stream = 0,
                                            const int* qstart = nullptr) {
    std::vector<const floatX*> at = cp_rank_order_at(kv_all, (size_t)B * Tl * 2 * KV * hd, n, rank);
    cp_attention_forward_at_gpu(out, lse, qkv, at.data(), sc, B, Tl, H, KV, hd, n, rank, stream, nullptr, nullptr, qstart);
}

// dst += in (FP32, n elements): the backward ring's accumulator, this rank's contribution plus the one that arrived
__global__ void cp_add_f32_kernel(float* dst, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dst[i] + in[i];
}

// the backward: dq into the Q columns of dqkv, and this rank's dK|dV contribution to the block of pair k into dkv_at[k]
// (B, Tl, 2 kv hd) FP32, zeroed just before the pair (the caller sums them over the group); the pairs in the forward's
// order, kv_at as its, each adding to FP32 sums. before_pair as the forward's; after_pair (NULL: none) is called after pair
// k's launches (the ring's transport passes block k's gradient on there; dkv_at[k] may be a slot the pair before used)
static inline void cp_attention_backward_at_gpu(floatX* dqkv, float* const* dkv_at, const floatX* dout, const floatX* out, const float* lse,
                                                const floatX* qkv, const floatX* const* kv_at, const CpAttnScratch* sc, int B, int Tl, int H,
                                                int KV, int hd, int n, int rank, cudaStream_t stream, void (*before_pair)(void* ctx, int k),
                                                void (*after_pair)(void* ctx, int k), void* ctx, const int* qstart = nullptr) {
    size_t blk = (size_t)B * Tl * 2 * KV * hd, rows = (size_t)B * Tl * H;
    LAUNCH(flash_attention_backward_D_kernel, ceil_div((long long)rows * 32, 128), 128, 0, stream, sc->D, (int*)nullptr, dout, out, B, Tl, H,
           hd, 0);
    cudaCheck(cudaMemsetAsync(sc->dq_acc, 0, rows * hd * sizeof(float), stream));
    for (int k = 0; k < n; k++) {
        if (before_pair) before_pair(ctx, k);
        cudaCheck(cudaMemsetAsync(dkv_at[k], 0, blk * sizeof(float), stream));
        FlashBlock p = cp_chunk_pair(kv_at[k], dkv_at[k], k, n, rank, Tl, KV, hd, qstart);
        flash_attention_backward_block_gpu(sc->dq_acc, sc->dq_sem, sc->D, dout, lse, qkv, B, Tl, H, KV, hd, p, stream);
        if (after_pair) after_pair(ctx, k);
    }
    LAUNCH(cp_dq_store_kernel, ceil_div((long long)rows * hd, 256), 256, 0, stream, dqkv, sc->dq_acc, B, Tl, H, KV, hd);
}
// the same over kv_all and dkv_all (n, B, Tl, 2 kv hd) in rank order (the all-gather form, the kernels' tests)
static inline void cp_attention_backward_gpu(floatX* dqkv, float* dkv_all, const floatX* dout, const floatX* out, const float* lse,
                                             const floatX* qkv, const floatX* kv_all, const CpAttnScratch* sc, int B, int Tl, int H, int KV,
                                             int hd, int n, int rank, cudaStream_t stream = 0, const int* qstart = nullptr) {
    size_t blk = (size_t)B * Tl * 2 * KV * hd;
    std::vector<const floatX*> kv_at = cp_rank_order_at(kv_all, blk, n, rank);
    std::vector<float*> dkv_at = cp_rank_order_at(dkv_all, blk, n, rank);
    cp_attention_backward_at_gpu(dqkv, dkv_at.data(), dout, out, lse, qkv, kv_at.data(), sc, B, Tl, H, KV, hd, n, rank, stream, nullptr,
                                 nullptr, nullptr, qstart);
}

// the model's attention: the local one (flash or warp-per-row kernels; doc: the document mask, attention.cuh), or the CP
// group's (hk->forward set; the document mask from its batch hook: parallel/context_parallel_cuda.cuh)
static inline void attention_hooked_forward_gpu(const AttentionHooksGPU* hk, floatX* out, float* lse, const floatX* qkv, int B, int T, int H,
                                                int KV, int hd, DocMask doc) {
    if (hk->forward) hk->forward(hk->ctx, out, lse, qkv);
    else attention_forward_gpu(out, lse, qkv, B, T, H, KV, hd, 0, doc);
}
static inline void attention_hooked_backward_gpu(const AttentionHooksGPU* hk, floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out,
                                                 const float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd, DocMask doc) {
    if (hk->backward) hk->backward(hk->ctx, dqkv, dout, qkv, out, lse);
    else attention_backward_gpu(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, hd, 0, doc);
}
