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
 *            tiles run longest first. --doc-mask (attention.cuh's DocMask): the key tiles before the block's
 *            first row's document are skipped, the keys before a row's document masked (a chunk pair's by
 *            their global positions, FlashBlock's qstart, kpos0, kpos1, kc).
 *   backward attention_flash_bwd5.cuh (5 tile products per pair); this file has what it shares, the
 *            query tiles' loader. (The pair of kernels it replaced, a dq kernel and a dk/dv kernel with 7
 *            products per pair, is dev/cuda/attention.cu's backward v2.)
 * Rows past T are zero-filled by the copies (no global read) and never stored; in the backward their
 * lse is +inf, so their probabilities are 0.
 */
#pragma once
#include "tensor_core.cuh"

#define FLASH_FWD_BR 128   // query rows of a forward block (4 warps x two 16-row slices)
#define FLASH_BC 64        // keys per tile (forward, dq); keys of a dk/dv block (4 warps x 16)
#define FLASH_BQ 32        // queries per tile of the dk/dv block: S^T and dP^T are 16 x 32 per warp (registers)
#define FLASH_THREADS 128
#define FLASH_LOG2E 1.4426950408889634f


static inline bool flash_attention_supported(int hd) { return hd == 32 || hd == 64 || hd == 128; }

// The keys and the query rows of a chunk pair of context parallelism (model/attention_cp_cuda.cuh): a K|V block
// (B, T, 2 KV hd) of T rows per batch entry like qkv's (the rank's gathered or received block), of which the first Tk
// are keys, and a range of query rows; full = 1 where every query sees every key (a key chunk before the query
// chunk: no mask but keys >= Tk), full = 0 the causal diagonal, query row i against key row i (qrow0 = 0, nq = Tk).
// (The model's causal attention is every row of qkv against its own K|V: flash_block_local, constants.)
typedef struct {
    const floatX* kv;    // K of (batch 0, key row 0, kv head 0); V at + KV hd
    float* dkv;          // the backward's dK|dV, FP32, kv's layout, added to
    size_t ld, bstride;  // = 2 KV hd, T ld: its row and batch strides (set by flash_block_pair)
    int Tk, qrow0, nq;   // key rows; the query rows [qrow0, qrow0 + nq) of qkv's T
    int full;            // 1: no causal mask (keys past Tk masked); 0: causal, query row i sees key rows <= i
    // --doc-mask (model/attention.cuh) under context parallelism: qstart (B, T; NULL: no mask) each query row's document's
    // first global position; key row j sits at global position kpos0 + j (j < kc), kpos1 + j - kc (j >= kc): the keys
    // before a row's document are masked
    const int* qstart;
    int kpos0, kpos1, kc;
} FlashBlock;
// key row j's global position in a chunk pair (FlashBlock's kpos0, kpos1, kc)
__host__ __device__ inline int flash_key_pos(const FlashBlock& kb, int j) { return j < kb.kc ? kb.kpos0 + j : kb.kpos1 + j - kb.kc; }

#if defined(SIMT_EMULATION)
// the emulator's work log (SIMT_WORKLOG) records a chunk pair as [Tk, qrow0, nq, full] for the step-time model's
// formulas (dev/predict/kernel_cost.py)
static inline std::string worklog_fields(const FlashBlock& kb) {
    return "[" + std::to_string(kb.Tk) + "," + std::to_string(kb.qrow0) + "," + std::to_string(kb.nq) + "," + std::to_string(kb.full) + "]";
}
#endif
__host__ __device__ inline FlashBlock flash_block_local(const floatX* qkv, int T, int H, int KV, int hd) {
    size_t qkv_dim = (size_t)(H + 2 * KV) * hd;
    return FlashBlock{qkv + (size_t)H * hd, nullptr, qkv_dim, T * qkv_dim, T, 0, T, 0, nullptr, 0, 0, 0};
}
static inline FlashBlock flash_block_pair(const floatX* kv, float* dkv, int T, int KV, int hd, int Tk, int qrow0, int nq, int full) {
    size_t ld = 2 * (size_t)KV * hd;
    return FlashBlock{kv, dkv, ld, T * ld, Tk, qrow0, nq, full, nullptr, 0, 0, 0};
}

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

// CP false: the model's causal attention, kb = flash_block_local (constants: the compiler folds them), with doc's document
// mask (attention.cuh; start NULL: none); CP true: a chunk pair
template <int HD, bool CP>
__device__ __forceinline__ void flash_forward_body(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV, const FlashBlock& kb,
                                                   DocMask doc = {}) {
    constexpr int LD = HD + 8, KT = HD / 16, NT = FLASH_BC / 8, OT = HD / 8, MS = FLASH_FWD_BR / 64;   // MS slices per warp
    floatX* Qs = (floatX*)dynamic_smem;            // (FWD_BR, LD)
    floatX* Ks = Qs + FLASH_FWD_BR * LD;           // (2, BC, LD): double-buffered
    floatX* Vs = Ks + 2 * FLASH_BC * LD;           // (2, BC, LD)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_FWD_BR;   // the last (longest) query tiles first
    int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV), C = H * HD;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const int nq = kb.nq, Tk = kb.Tk;                             // (the model's: both T)
    const bool full = CP && kb.full;
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;   // (a chunk pair's launcher offsets qkv, out, lse by qrow0)
    const size_t kv_ld = kb.ld;
    const floatX* Kg = kb.kv + (size_t)b * kb.bstride + (size_t)kvh * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float sl2 = rsqrtf((float)HD) * FLASH_LOG2E;          // scores in log2 units, for exp2f
    // causal: keys up to the last query row; full: all
    const int ntiles = ((full ? Tk : min(q0 + FLASH_FWD_BR, nq)) - 1) / FLASH_BC + 1;
    const int wrow0 = warp * 16 * MS;                            // the warp's first row in the tile
    // the document mask: the key tiles before the block's first row's document are skipped (every row of the block sees
    // none of their keys: a masked tile adds exactly nothing)
    const int j0 = !CP && doc.start ? doc.start[(size_t)b * T + q0] / FLASH_BC : 0;

    flash_load_tile<HD>(Qs, Qg, qkv_dim, q0, FLASH_FWD_BR, nq);
    flash_load_tile<HD>(Ks + j0 % 2 * FLASH_BC * LD, Kg, kv_ld, j0 * FLASH_BC, FLASH_BC, Tk);
    flash_load_tile<HD>(Vs + j0 % 2 * FLASH_BC * LD, Vg, kv_ld, j0 * FLASH_BC, FLASH_BC, Tk);
    cp_async_commit();

    float o[MS][OT][4] = {};                                       // O (16, HD) per slice, unnormalised
    float m[MS][2], l[MS][2];                                      // running max (log2 units) and this lane's part of the sum
    UNROLL
    for (int sl = 0; sl < MS; sl++)
        UNROLL
        for (int r = 0; r < 2; r++) { m[sl][r] = -INFINITY; l[sl][r] = 0.0f; }
    // the document mask: the first key of each row of the block (0: none; a chunk pair's: a global position), in shared
    // memory (registers are at the limit at head_dim 128), visible after the first tile's barrier
    __shared__ int row_lo[FLASH_FWD_BR];
    for (int i = threadIdx.x; i < FLASH_FWD_BR; i += FLASH_THREADS) {
        const int q = q0 + i;
        const int* st = CP ? kb.qstart : doc.start;
        row_lo[i] = st && q < nq ? st[(size_t)b * T + (CP ? kb.qrow0 : 0) + q] : 0;
    }
    for (int j = j0; j < ntiles; j++) {
        if (j + 1 < ntiles) {   // tile j + 1 into the other buffer while tile j is used
            flash_load_tile<HD>(Ks + (j + 1) % 2 * FLASH_BC * LD, Kg, kv_ld, (j + 1) * FLASH_BC, FLASH_BC, Tk);
            flash_load_tile<HD>(Vs + (j + 1) % 2 * FLASH_BC * LD, Vg, kv_ld, (j + 1) * FLASH_BC, FLASH_BC, Tk);
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
        while (!full && s0 < MS && k0 > q0 + wrow0 + 16 * s0 + 15) s0++;
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
                if (full) {   // (a chunk pair with no mask: only the keys past the block's end)
                    if (k0 + FLASH_BC > Tk)
                        UNROLL
                        for (int n = 0; n < NT; n++)
                            UNROLL
                            for (int e = 0; e < 4; e++)
                                if (k0 + n * 8 + 2 * t4 + e % 2 >= Tk) s[sl][n][e] = -INFINITY;
                } else if (k0 + FLASH_BC - 1 > qa - g)
                    UNROLL
                    for (int n = 0; n < NT; n++)
                        UNROLL
                        for (int e = 0; e < 4; e++)
                            if (k0 + n * 8 + 2 * t4 + e % 2 > (e < 2 ? qa : qb)) s[sl][n][e] = -INFINITY;
                const int* lo = row_lo + wrow0 + 16 * sl + g;   // (rows qa: lo[0], qb: lo[8])
                if (CP ? kb.qstart != nullptr : k0 < max(lo[0], lo[8]))   // the document mask: keys before the row's document
                    UNROLL
                    for (int n = 0; n < NT; n++)
                        UNROLL
                        for (int e = 0; e < 4; e++) {
                            const int key = k0 + n * 8 + 2 * t4 + e % 2;
                            if ((CP ? flash_key_pos(kb, key) : key) < lo[e < 2 ? 0 : 8]) s[sl][n][e] = -INFINITY;
                        }
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
        // (l 0: a chunk pair's row that sees none of the pair's keys, --doc-mask's: O 0, lse -inf, which the merge skips)
        flash_acc_to_smem<OT>(Qs, LD, wrow0 + 16 * sl, o[sl], CP && !(l[sl][0] > 0.0f) ? 0.0f : 1.0f / l[sl][0],
                              CP && !(l[sl][1] > 0.0f) ? 0.0f : 1.0f / l[sl][1]);
        __syncwarp();
        flash_store_rows<HD>(out + (size_t)b * T * C + (size_t)h * HD, C, q0 + wrow0 + 16 * sl, nq, Qs + (wrow0 + 16 * sl) * LD);
        if (t4 == 0) {   // natural-log units, of the scaled scores
            float* lrow = lse + ((size_t)b * H + h) * T;
            if (qa < nq) lrow[qa] = (m[sl][0] + log2f(l[sl][0])) / FLASH_LOG2E;
            if (qb < nq) lrow[qb] = (m[sl][1] + log2f(l[sl][1])) / FLASH_LOG2E;
        }
    }
}
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS) flash_attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV,
                                                                                DocMask doc) {
    flash_forward_body<HD, false>(out, lse, qkv, T, H, KV, flash_block_local(qkv, T, H, KV, HD), doc);
}
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_forward_cp_kernel(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV, FlashBlock kb) {
    flash_forward_body<HD, true>(out, lse, qkv, T, H, KV, kb);
}

// ---------------------------------------------------------------------------------------------
// backward, dk and dv: the K and V rows of dqkv, from lse and D

// queries [q0, q0 + BQ) of query head h: Q and dO tiles by cp.async; lse (log2 units, +inf past T)
// and D by plain loads
template <int HD>
__device__ __forceinline__ void flash_load_queries(floatX* Qt, floatX* dOt, float* lt, float* Dt, const floatX* qkv,
                                                   const floatX* dout, const float* lse, const float* Dbuf, int b, int h,
                                                   int q0, int T, int H, int KV, int nq = -1) {
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    int C = H * HD;
    if (nq < 0) nq = T;   // (rows past nq zero-filled: a chunk pair's query rows, the pointers offset by its launcher)
    flash_load_tile<HD>(Qt, qkv + (size_t)b * T * qkv_dim + (size_t)h * HD, qkv_dim, q0, FLASH_BQ, nq);
    flash_load_tile<HD>(dOt, dout + (size_t)b * T * C + (size_t)h * HD, C, q0, FLASH_BQ, nq);
    if (threadIdx.x < FLASH_BQ) {
        int q = q0 + threadIdx.x;
        size_t row = ((size_t)b * H + h) * T + q;
        lt[threadIdx.x] = q < nq ? lse[row] * FLASH_LOG2E : INFINITY;
        Dt[threadIdx.x] = q < nq ? Dbuf[row] : 0.0f;
    }
}

// ---------------------------------------------------------------------------------------------
// launchers (head_dim HD in {32, 64, 128}; the caller checks flash_attention_supported)

template <int HD> static inline size_t flash_forward_smem() { return (size_t)(FLASH_FWD_BR + 4 * FLASH_BC) * (HD + 8) * sizeof(floatX); }

// kb NULL: the model's causal attention (doc: its document mask); else a chunk pair
template <int HD>
static inline void flash_attention_forward_hd(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV,
                                              const FlashBlock* kb, cudaStream_t stream, DocMask doc) {
    size_t smem = flash_forward_smem<HD>();
    if (!kb) {
        cudaCheck(cudaFuncSetAttribute(flash_attention_forward_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        LAUNCH(flash_attention_forward_kernel<HD>, dim3(ceil_div(T, FLASH_FWD_BR), H, B), FLASH_THREADS, smem, stream, out, lse, qkv, T,
               H, KV, doc);
        return;
    }
    cudaCheck(cudaFuncSetAttribute(flash_attention_forward_cp_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    size_t qr = kb->qrow0;   // the query rows' offset into qkv, out and lse
    LAUNCH(flash_attention_forward_cp_kernel<HD>, dim3(ceil_div(kb->nq, FLASH_FWD_BR), H, B), FLASH_THREADS, smem, stream,
           out + qr * H * HD, lse + qr, qkv + qr * (H + 2 * KV) * HD, T, H, KV, *kb);
}
static inline void flash_attention_forward_dispatch(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                                    const FlashBlock* kb, cudaStream_t stream, DocMask doc = {}) {
    if (hd == 32) flash_attention_forward_hd<32>(out, lse, qkv, B, T, H, KV, kb, stream, doc);
    else if (hd == 64) flash_attention_forward_hd<64>(out, lse, qkv, B, T, H, KV, kb, stream, doc);
    else if (hd == 128) flash_attention_forward_hd<128>(out, lse, qkv, B, T, H, KV, kb, stream, doc);
    else fail(EXIT_BAD_INPUT, "flash attention: head_dim %d is not 32, 64 or 128", hd);
}
// the model's causal attention: out (B, T, H hd) bf16, lse (B, H, T) fp32 from qkv (B, T, (H + 2 KV) hd); doc: the document
// mask (attention.cuh)
static inline void flash_attention_forward_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                               cudaStream_t stream = 0, DocMask doc = {}) {
    flash_attention_forward_dispatch(out, lse, qkv, B, T, H, KV, hd, nullptr, stream, doc);
}
// a chunk pair: the query rows kb.qrow0 .. + kb.nq of out (B, T, H hd) bf16 and lse (B, H, T) fp32 from those of qkv
// (B, T, (H + 2 KV) hd) against kb's keys
static inline void flash_attention_forward_block_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                                     const FlashBlock& kb, cudaStream_t stream = 0) {
    flash_attention_forward_dispatch(out, lse, qkv, B, T, H, KV, hd, &kb, stream);
}
