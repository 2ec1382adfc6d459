/*
 * zero_fp8.h — ZeRO-3's FP8 all-gather (--fp8-gather): the five FP8 matrices of every block (Wqkv,
 * out_proj, w1, v1, w2) travel between the ranks of a shard group as E4M3 codes, 1 byte per parameter
 * instead of 4 (the CPU's FP32 gather) or 2 (a BF16 gather); the LayerNorms, the router, the embedding
 * and lm_head are gathered as before.
 *
 * The codes are exactly the ones the GEMMs would use: every rank quantises its own shard with the scale
 * the whole tensor gets (delayed: the history's; current: from the tensor's amax; block: each expert's
 * 128x128 blocks from their own amax, model/fp8.cuh), so the ranks must agree on the scales before
 * anyone quantises. The weights change only in the update, so once per step, before its first gather:
 *   1. the amax of this rank's piece of every matrix (block: of every 128x128 block it touches);
 *   2. one all-reduce (max) of all of them in the shard group: the true amax of every tensor (block),
 *      the same on every rank — this is how the amax/scale travel with the codes;
 *   3. the scales from them, and the tensor's amax into its Fp8Meta, as if the model had quantised the
 *      whole weight (delayed scaling's history needs it);
 *   4. this rank's shard of every unit of a block packed into a send buffer, in the shard's order: a 1-byte code
 *      for each element of an FP8 matrix, the 4-byte float for every other element; the saturated
 *      counts summed over the shard group (so counted once per step, not at every use).
 * Gathering a unit of a block: all-gather the packed pieces (each rank's padded to the longest of them) and
 * decode into the unit's FP32 working slot: code -> fp8_to_float(code) / scale, exactly the value the
 * fake quantisation (fp8_fake_quant) gives, floats copied. The model takes those weights as they are
 * (Fp8Config.weights_quantized). Same world size, same losses as --fp8 without --fp8-gather, bit for bit.
 * Expert parallelism: a block's experts unit is gathered in the expert shard group (the layout ranks with
 * this rank's EP rank: ZeroFp8.members), each part decoded at its place in the compact slot of this
 * rank's experts (ShardRun.slot_off); the amaxes are still agreed in the shard group, which holds every
 * expert once, so the scales and codes are those of the run without EP (parallel/README.md).
 * The GPU side's kernels are at the end of this file, next to their CPU reference: the device store
 * (parallel/zero_gpu.cuh) gathers the codes the same way and decodes them into its BF16 slot, which the
 * GPU model quantises back to the same codes (model/CUDA.md).
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#include "../model/dbrx.h"
#include "comm.h"
#include "shard_runs.h"

// one FP8 weight matrix of a block: (rows, cols) row-major at `off` in the flat buffer, in
// segments of seg_rows rows (the experts of w1/v1/w2; Wqkv and out_proj: one segment)
typedef struct {
    size_t off;
    int rows, cols, seg_rows;
    int row_blocks, col_blocks;   // block recipe: 128x128 blocks per segment
    size_t group0, groups;        // its scale groups in ZeroFp8's amax/scale arrays (per tensor: 1)
    Fp8Meta* meta;                // the weight operand's meta (model->fp8_state[l].<gemm>.w)
} Fp8GatherMatrix;

// a piece of a unit in flat order: a whole tensor, either one of the FP8 matrices (mat >= 0) or sent as floats
typedef struct { size_t off, numel; int mat; } Fp8GatherTensor;

typedef struct {
    int on;                                   // S > 1 and --fp8-gather
    int ready;                                // this step's codes are packed (cleared by the update)
    Fp8Config cfg;
    int S, s;                                 // shard group size, this rank's place in the layout group (zero.h's lrank)
    std::vector<size_t> unit_off;             // per unit: flat offset
    std::vector<std::vector<ShardRun>> runs;  // per unit: its runs (zero.h's layout)
    // per unit: the layout ranks of the group its gather runs in, in the group's rank order: the shard
    // group (0 .. S-1), or under expert parallelism for a block's experts the expert shard group (the
    // ranks with this rank's EP rank o: o, o + n, o + 2n, ...), whose pieces make this rank's experts
    std::vector<std::vector<int>> members;
    std::vector<std::vector<Fp8GatherTensor>> tensors;   // per unit (a block's units only; others empty)
    std::vector<Fp8GatherMatrix> mats;
    std::vector<float> amax, scale, inv;      // per scale group
    std::vector<double> saturated;            // per matrix, this step
    std::vector<size_t> piece, send_off;      // per unit: bytes of a packed piece (the longest over the ranks), ours in send
    std::vector<uint8_t> send, recv;
    float decode[256];                        // E4M3 code -> value (+0 for both zeros, as fp8_round)
} ZeroFp8;

// matrix (rows, cols) at `off` in segments of seg_rows rows, its scale groups from group0 on
static inline Fp8GatherMatrix fp8g_matrix(size_t off, int rows, int cols, int seg_rows, size_t group0, int block, Fp8Meta* meta) {
    Fp8GatherMatrix M;
    M.off = off; M.rows = rows; M.cols = cols; M.seg_rows = seg_rows;
    M.row_blocks = (seg_rows + 127) / 128; M.col_blocks = (cols + 127) / 128;
    M.group0 = group0;
    M.groups = block ? (size_t)(rows / seg_rows) * M.row_blocks * M.col_blocks : 1;
    M.meta = meta;
    return M;
}

// the scale group of element i (row-major index inside the matrix)
static inline size_t fp8g_group(const Fp8GatherMatrix* M, size_t i, int block) {
    if (!block) return M->group0;
    size_t r = i / M->cols, c = i % M->cols;
    size_t e = r / M->seg_rows, rr = r % M->seg_rows;
    return M->group0 + (e * M->row_blocks + rr / 128) * M->col_blocks + c / 128;
}

// Calls fn(i, n, group) for the runs of consecutive elements [i, i + n) of the piece [a, b) (flat
// indices) of matrix M that share a scale group: the whole piece per tensor, at most 128 columns of a row
// under block scaling. The loops inside then read one scale.
template <typename Fn>
static inline void fp8g_runs(const Fp8GatherMatrix* M, size_t a, size_t b, int block, Fn fn) {
    if (!block) { if (a < b) fn(a, b - a, M->group0); return; }
    for (size_t i = a; i < b;) {
        size_t k = i - M->off, c = k % M->cols;
        size_t n = 128 - c % 128;                    // to the end of this 128-column block
        if (n > M->cols - c) n = M->cols - c;        // or of the row
        if (n > b - i) n = b - i;
        fn(i, n, fp8g_group(M, k, 1));
        i += n;
    }
}

// The three element-wise operations on a piece [a, b) of matrix M, x = its values (x[0] is element a):
// the amax of every scale group it touches (max-accumulated), the codes (returns the saturated count),
// and the decoding of codes back to values. These are the CPU reference of the GPU side's kernels.
static inline void fp8g_piece_amax(const Fp8GatherMatrix* M, size_t a, size_t b, const real* x, float* amax, int block) {
    fp8g_runs(M, a, b, block, [&](size_t i, size_t n, size_t g) {
        float m = amax[g];
        for (size_t j = 0; j < n; j++) m = std::fmax(m, std::fabs((float)x[i - a + j]));
        amax[g] = m;
    });
}
static inline long long fp8g_piece_encode(const Fp8GatherMatrix* M, size_t a, size_t b, const real* x, const float* scale,
                                          uint8_t* codes, int block) {
    long long sat = 0;
    fp8g_runs(M, a, b, block, [&](size_t i, size_t n, size_t g) {
        const float s = scale[g];
        for (size_t j = i - a; j < i - a + n; j++) {
            float xs = (float)x[j] * s;
            sat += fp8_saturates(xs, FP8_E4M3);
            codes[j] = fp8_from_float(xs, FP8_E4M3);
        }
    });
    return sat;
}
// value = the code's E4M3 value / scale: decode[] maps both zeros to +0, as fp8_round does
static inline void fp8g_piece_decode(const Fp8GatherMatrix* M, size_t a, size_t b, const uint8_t* codes, const float* inv,
                                     const float* decode, real* y, int block) {
    fp8g_runs(M, a, b, block, [&](size_t i, size_t n, size_t g) {
        const float v = inv[g];
        for (size_t j = i - a; j < i - a + n; j++) y[j] = (real)(decode[codes[j]] * v);
    });
}

// Calls fn(t, a, b, pos, spos) for the part [a, b) of each tensor of a unit that layout rank r holds, in
// the order of the rank's shard (its pieces of the runs, each in flat order); pos: where a lies in the
// rank's shard of the unit, spos: in the unit's gathered working slot (the unit's flat order, or under
// expert parallelism the compact slot of the EP rank's experts: ShardRun.slot_off). The padding is not visited.
template <typename Fn>
static inline void fp8g_rank_parts(const std::vector<Fp8GatherTensor>& ts, const std::vector<ShardRun>& runs, int r, Fn fn) {
    for (const ShardRun& run : runs) {
        if (!shard_run_held(run, r)) continue;
        size_t lo = run.flat_off + (size_t)shard_run_piece(run, r) * run.chunk, end = run.flat_off + run.numel;
        size_t hi = lo + run.chunk < end ? lo + run.chunk : end;
        for (const Fp8GatherTensor& t : ts) {
            size_t a = t.off > lo ? t.off : lo, b = t.off + t.numel < hi ? t.off + t.numel : hi;
            if (a < b) fn(t, a, b, run.shard_rel + (a - lo), run.slot_off + (a - run.flat_off));
        }
    }
}

// the bytes rank r's shard of a unit takes packed: 1 per FP8-matrix element, 4 per other element; the
// padding is not sent
static inline size_t fp8g_packed_bytes(const std::vector<Fp8GatherTensor>& ts, const std::vector<ShardRun>& runs, int r) {
    size_t bytes = 0;
    fp8g_rank_parts(ts, runs, r, [&](const Fp8GatherTensor& t, size_t a, size_t b, size_t, size_t) { bytes += (b - a) * (t.mat >= 0 ? 1 : sizeof(float)); });
    return bytes;
}

// The FP8 linear a block's parameter tensor is the weight of (FP8_LIN_*), or -1 (norms, router), and
// the rows of its scale segments (the experts' w1/v1/w2: F rows each; Wqkv and out_proj: one segment).
// Both FP8 gathers (this file's, and the device store's) find their matrices with them.
static inline int fp8g_linear_of(const ParamInfo* p) {
    size_t len = strlen(p->name);
    auto ends = [&](const char* suf) { size_t k = strlen(suf); return len >= k && !strcmp(p->name + len - k, suf); };
    return ends(".attn.Wqkv.weight") ? FP8_LIN_QKV : ends(".attn.out_proj.weight") ? FP8_LIN_PROJ
         : ends(".mlp.w1") ? FP8_LIN_W1 : ends(".mlp.v1") ? FP8_LIN_V1 : ends(".mlp.w2") ? FP8_LIN_W2 : -1;
}
static inline int fp8g_seg_rows(const ParamInfo* p, int lin, const DbrxConfig* c) {
    return lin == FP8_LIN_QKV || lin == FP8_LIN_PROJ ? p->rows : c->ffn_hidden;
}

// Sets up the FP8 gather for a model whose FP8 recipe is already enabled (dbrx_enable_fp8): the
// matrices, their scale groups, every unit's piece size. unit_off / runs: zero.h's layout; s: this
// rank's layout rank; members: per unit, its gather group's layout ranks (ZeroFp8.members).
static inline void zero_fp8_init(ZeroFp8* f, Dbrx* m, int S, int s, const std::vector<size_t>& unit_off,
                                 const std::vector<std::vector<ShardRun>>& runs, const std::vector<std::vector<int>>& members) {
    const DbrxConfig* c = &m->cfg;
    f->on = 1; f->ready = 0;
    f->cfg = m->fp8;
    f->S = S; f->s = s;
    f->unit_off = unit_off; f->runs = runs; f->members = members;
    int n_units = (int)unit_off.size();
    f->tensors.assign(n_units, {});
    f->mats.clear();
    int block = f->cfg.recipe == FP8_BLOCK;
    size_t groups = 0;
    for (const ParamInfo& p : m->table) {
        int l = dbrx_unit_layer(p.unit, c);
        if (l < 0) continue;   // the embedding and the head: no FP8 GEMM
        Fp8BlockState* b = &m->fp8_state[l];
        int lin = fp8g_linear_of(&p);
        Fp8Meta* meta = lin >= 0 ? fp8_block_meta(b, lin, FP8_OP_W) : NULL;   // the weight operand of the table (model/fp8.cuh)
        int mat = -1;
        if (meta) {
            int seg_rows = fp8g_seg_rows(&p, lin, c);
            Fp8GatherMatrix M = fp8g_matrix(p.offset, p.rows, p.cols, seg_rows, groups, block, meta);
            groups += M.groups;
            mat = (int)f->mats.size();
            f->mats.push_back(M);
        }
        f->tensors[p.unit].push_back(Fp8GatherTensor{p.offset, p.numel, mat});
    }
    f->amax.assign(groups, 0.0f); f->scale.assign(groups, 1.0f); f->inv.assign(groups, 1.0f);
    f->saturated.assign(f->mats.size(), 0.0);
    f->piece.assign(n_units, 0); f->send_off.assign(n_units, 0);
    size_t send_total = 0, max_recv = 0;
    for (int u = 0; u < n_units; u++) {
        if (f->tensors[u].empty()) continue;
        for (int r : members[u]) {   // every member's piece: the gather needs equal sizes, so the longest
            size_t b = fp8g_packed_bytes(f->tensors[u], runs[u], r);
            if (b > f->piece[u]) f->piece[u] = b;
        }
        f->send_off[u] = send_total;
        send_total += f->piece[u];
        max_recv = std::max(max_recv, f->piece[u] * members[u].size());
    }
    f->send.assign(send_total, 0);
    f->recv.assign(max_recv, 0);
    for (int v = 0; v < 256; v++) f->decode[v] = (v & 0x7F) == 0 ? 0.0f : fp8_to_float((uint8_t)v, FP8_E4M3);
}

// Steps 1-4 of the top comment: agree on the scales, pack this rank's shards. master: this rank's
// shard buffer (zero.h's layout: unit u's shard at shard_off[u]). Collective over the shard group g:
// under expert parallelism too, since a tensor's scale is the whole tensor's (every expert's) and the
// shard group holds every expert once (its EP ranks' expert shard groups together), so the max of the
// amaxes and the sum of the saturation counts over it are the whole tensor's, as without EP.
static inline void zero_fp8_prepare(ZeroFp8* f, CommGroup* g, const real* master, const std::vector<size_t>& shard_off) {
    const int block = f->cfg.recipe == FP8_BLOCK;
    std::fill(f->amax.begin(), f->amax.end(), 0.0f);
    std::fill(f->saturated.begin(), f->saturated.end(), 0.0);
    // 1. the amax of our piece of every matrix (block: of every block)
    for (size_t u = 0; u < f->tensors.size(); u++)
        fp8g_rank_parts(f->tensors[u], f->runs[u], f->s, [&](const Fp8GatherTensor& t, size_t a, size_t b, size_t pos, size_t) {
            if (t.mat >= 0) fp8g_piece_amax(&f->mats[t.mat], a, b, master + shard_off[u] + pos, f->amax.data(), block);
        });
    // 2. the true amax of every tensor / block on every rank
    comm_all_reduce_max_f32(g, f->amax.data(), f->amax.size());
    // 3. the scales (as fp8_operand would choose them for the whole weight), the tensors' amax
    for (Fp8GatherMatrix& M : f->mats) {
        float tensor_amax = 0;
        for (size_t k = 0; k < M.groups; k++) {
            size_t gi = M.group0 + k;
            float a = f->amax[gi], s;
            tensor_amax = std::fmax(tensor_amax, a);
            if (block) s = fp8_scale_for(a, FP8_E4M3, 0);
            else if (f->cfg.recipe == FP8_DELAYED && M.meta->filled > 0) s = M.meta->scale;
            else s = fp8_scale_for(a, FP8_E4M3, f->cfg.margin);   // current, and delayed's first step
            f->scale[gi] = s;
            f->inv[gi] = 1.0f / s;
        }
        M.meta->amax = std::fmax(M.meta->amax, tensor_amax);
    }
    // 4. pack: codes for the FP8 matrices, floats for the rest
    for (size_t u = 0; u < f->tensors.size(); u++) {
        uint8_t* out = f->send.data() + f->send_off[u];
        fp8g_rank_parts(f->tensors[u], f->runs[u], f->s, [&](const Fp8GatherTensor& t, size_t a, size_t b, size_t pos, size_t) {
            const real* x = master + shard_off[u] + pos;
            if (t.mat < 0) {
                for (size_t i = 0; i < b - a; i++, out += sizeof(float)) { float v = (float)x[i]; memcpy(out, &v, sizeof v); }
                return;
            }
            f->saturated[t.mat] += (double)fp8g_piece_encode(&f->mats[t.mat], a, b, x, f->scale.data(), out, block);
            out += b - a;
        });
    }
    comm_all_reduce(g, f->saturated.data(), f->saturated.size(), COMM_F64);
    for (size_t k = 0; k < f->mats.size(); k++) f->mats[k].meta->saturated += (long long)f->saturated[k];
    f->ready = 1;
}

// Gathers unit u of a block into `work` (its working slot: the unit in flat order from unit_off[u],
// or the compact slot of this EP rank's experts): the packed pieces of every member of the unit's group,
// decoded. Collective over g, the unit's group (zero_unit_group: the shard group, or the expert shard group).
static inline void zero_fp8_gather_unit(ZeroFp8* f, CommGroup* g, int u, real* work) {
    const int block = f->cfg.recipe == FP8_BLOCK;
    size_t P = f->piece[u];
    ENSURE(g->size == (int)f->members[u].size(), "zero_fp8_gather_unit: unit %d's group has %d ranks, its layout %d", u, g->size,
           (int)f->members[u].size());
    comm_all_gather(g, f->send.data() + f->send_off[u], f->recv.data(), P, COMM_BYTE);
    for (int j = 0; j < g->size; j++) {
        const uint8_t* in = f->recv.data() + (size_t)j * P;
        fp8g_rank_parts(f->tensors[u], f->runs[u], f->members[u][j], [&](const Fp8GatherTensor& t, size_t a, size_t b, size_t, size_t spos) {
            real* y = work + spos;
            if (t.mat < 0) {
                for (size_t i = 0; i < b - a; i++, in += sizeof(float)) { float v; memcpy(&v, in, sizeof v); y[i] = (real)v; }
                return;
            }
            fp8g_piece_decode(&f->mats[t.mat], a, b, in, f->inv.data(), f->decode, y, block);
            in += b - a;
        });
    }
}


#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: the GPU side's building blocks. On the GPU the gathered codes are not decoded: a block
// matrix's codes, gathered into one buffer in the matrix's row-major order (rows, C), experts stacked,
// are the very bytes fp8_quantize_gpu writes as `q` for the whole weight with the same scales
// (FP8Q_TENSOR with the agreed scale, FP8Q_WEIGHT), so the model's GEMMs read them as they are (the device
// store's slot, parallel/zero_gpu_fp8.cuh; Fp8GPU.given). Per step, as zero_fp8_prepare on the CPU:
//   fp8g_piece_amax_gpu    1. the amax of every scale group this rank's piece touches
//                          2. (the all-reduce max of the amax array in the shard group: NCCL, float max)
//   fp8g_scales_gpu        3. scale and 1/s of every group from its amax (current, block; delayed: the host's)
//   fp8g_piece_encode_gpu  4. the piece's E4M3 codes and saturated count
// and per gathered matrix:
//   fp8g_factors_gpu       the agreed 1/s in the layout the GEMM reads (q's `sinv`; per tensor one float)
//   fp8_transpose_gpu      (model/fp8.cuh) dgrad's W^T: the codes transposed and the block factors re-indexed,
//                          the bytes fp8_quantize_gpu writes as `qt` and `sinv_t`
// The values may be FP32 (the master shard: the CPU path's codes) or BF16 (its bf16 copy: then the
// codes are those of the GPU's --fp8 without the gather, which quantises the BF16 weights).
// The weights' scale groups tile each expert's rows from its first row (Fp8Segments of E segments of
// F rows, fp8_uniform_segments): the experts' weights are never padded (only the routed token rows
// are, the padded expert layout of model/dbrx_fp8_cuda.cuh).

// a piece [a, b) of a matrix (indices relative to the matrix) as the kernels walk it: one CUDA block
// per 128x128 tile of the scale groups' grid that the piece touches. Tile (blockIdx.x, blockIdx.y) is
// column block blockIdx.x of row block k = k0 + blockIdx.y, k = e * row_blocks + (block within expert e).
typedef struct {
    size_t a, b;
    int cols, seg_rows, row_blocks, col_blocks;
    size_t group0;
    int k0, block;
} Fp8gPiece;

#if defined(SIMT_EMULATION)
// the emulator's work log (SIMT_WORKLOG) records a piece for the byte formulas (dev/predict/kernel_cost.py):
// [a, b, cols, seg_rows, row_blocks, col_blocks, group0, k0, block]
static inline std::string worklog_fields(const Fp8gPiece& p) {
    char buf[256];
    snprintf(buf, sizeof buf, "[%zu,%zu,%d,%d,%d,%d,%zu,%d,%d]", p.a, p.b, p.cols, p.seg_rows, p.row_blocks, p.col_blocks, p.group0, p.k0, p.block);
    return buf;
}
#endif

// the launch of a piece: its tiles' row blocks k0 .. k0 + *nk - 1 (those of its first and last rows)
static inline Fp8gPiece fp8g_piece(const Fp8GatherMatrix* M, size_t a, size_t b, int block, int* nk) {
    Fp8gPiece p = {a - M->off, b - M->off, M->cols, M->seg_rows, M->row_blocks, M->col_blocks, M->group0, 0, block};
    auto k_of = [&](size_t r) { return (int)((r / M->seg_rows) * M->row_blocks + (r % M->seg_rows) / 128); };
    p.k0 = k_of(p.a / M->cols);
    *nk = k_of((p.b - 1) / M->cols) - p.k0 + 1;
    return p;
}

__device__ __forceinline__ float fp8g_value(float v) { return v; }
__device__ __forceinline__ float fp8g_value(floatX v) { return __bfloat162float(v); }

// the tile of this CUDA block: its rows [*r_lo, *r_hi), first column *c0 and width *w, its scale group
__device__ __forceinline__ size_t fp8g_tile(const Fp8gPiece& p, size_t* r_lo, size_t* r_hi, int* c0, int* w) {
    const int k = p.k0 + blockIdx.y, cb = blockIdx.x, e = k / p.row_blocks, rb = k % p.row_blocks;
    const size_t seg_end = (size_t)(e + 1) * p.seg_rows;
    *r_lo = (size_t)e * p.seg_rows + (size_t)rb * 128;
    *r_hi = *r_lo + 128 < seg_end ? *r_lo + 128 : seg_end;
    *c0 = cb * 128;
    *w = min(128, p.cols - *c0);
    return p.block ? p.group0 + (size_t)k * p.col_blocks + cb : p.group0;
}

#define FP8G_THREADS 256

// amax[group] = max(amax[group], max |x| over the tile's elements in the piece): a block maximum, then
// one integer atomicMax on the float's bits (non-negative floats order as their bits: exact, any order)
template <typename T>
__global__ void __launch_bounds__(FP8G_THREADS) fp8g_piece_amax_kernel(const T* __restrict__ x, Fp8gPiece p, float* amax) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = FP8G_THREADS / 32;
    size_t r_lo, r_hi;
    int c0, w;
    const size_t group = fp8g_tile(p, &r_lo, &r_hi, &c0, &w);
    float m = 0.0f;
    for (size_t r = r_lo + warp; r < r_hi; r += nwarps)   // a warp per row, coalesced along it
        for (int c = lane; c < w; c += 32) {
            size_t i = r * p.cols + c0 + c;
            if (i >= p.a && i < p.b) m = fmaxf(m, fabsf(fp8g_value(x[i - p.a])));
        }
    m = block_max(m, scratch);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax((unsigned int*)&amax[group], __float_as_uint(m));
}

// codes[i - a] = cvt(x * scale[group]) (E4M3, saturating: fp8_from_float), the saturations counted
template <typename T>
__global__ void __launch_bounds__(FP8G_THREADS) fp8g_piece_encode_kernel(const T* __restrict__ x, Fp8gPiece p, const float* scale,
                                                                         __nv_fp8_storage_t* codes, unsigned long long* saturated) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = FP8G_THREADS / 32;
    size_t r_lo, r_hi;
    int c0, w;
    const size_t group = fp8g_tile(p, &r_lo, &r_hi, &c0, &w);
    const float s = scale[group];
    int sat = 0;
    for (size_t r = r_lo + warp; r < r_hi; r += nwarps)
        for (int c = lane; c < w; c += 32) {
            size_t i = r * p.cols + c0 + c;
            if (i < p.a || i >= p.b) continue;
            float v = fp8g_value(x[i - p.a]) * s;
            sat += fp8_saturates_dev(v, FP8_E4M3);
            codes[i - p.a] = fp8_cvt_dev(v, FP8_E4M3);
        }
    float n = block_sum((float)sat, scratch);   // <= 16384 per tile: exact
    if (threadIdx.x == 0 && n > 0.0f && saturated) atomicAdd(saturated, (unsigned long long)n);
}

// Step 1 on the device: fp8g_piece_amax of the piece [a, b) (flat indices) of M, x its values (device,
// b - a of them), max-accumulated into amax (device, per scale group; non-negative, e.g. zeroed)
template <typename T>
static inline void fp8g_piece_amax_gpu(const Fp8GatherMatrix* M, size_t a, size_t b, const T* x, float* amax, int block,
                                       cudaStream_t stream = 0) {
    if (a >= b) return;
    int nk;
    Fp8gPiece p = fp8g_piece(M, a, b, block, &nk);
    LAUNCH(fp8g_piece_amax_kernel<T>, dim3(M->col_blocks, nk), FP8G_THREADS, 0, stream, x, p, amax);
}

// Step 4 on the device: fp8g_piece_encode, codes (device, b - a) from the groups' scales (device);
// the saturated count is added to *saturated (device; NULL: not counted)
template <typename T>
static inline void fp8g_piece_encode_gpu(const Fp8GatherMatrix* M, size_t a, size_t b, const T* x, const float* scale,
                                         __nv_fp8_storage_t* codes, unsigned long long* saturated, int block, cudaStream_t stream = 0) {
    if (a >= b) return;
    int nk;
    Fp8gPiece p = fp8g_piece(M, a, b, block, &nk);
    LAUNCH(fp8g_piece_encode_kernel<T>, dim3(M->col_blocks, nk), FP8G_THREADS, 0, stream, x, p, scale, codes, saturated);
}

// Step 3 on the device for n groups: scale = fp8_scale_for(amax, E4M3, margin) (current scaling: the
// tensor's margin; block: 0), inv = 1 / scale — the host's float operations, so the same numbers
__global__ void fp8g_scales_kernel(const float* amax, float* scale, float* inv, size_t n, int margin) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = fp8_scale_for_dev(amax[i], FP8_E4M3, margin);
    scale[i] = s;
    inv[i] = 1.0f / s;
}
static inline void fp8g_scales_gpu(const float* amax, float* scale, float* inv, size_t n, int margin, cudaStream_t stream = 0) {
    if (n == 0) return;
    LAUNCH(fp8g_scales_kernel, ceil_div(n, 256), 256, 0, stream, amax, scale, inv, n, margin);
}

// q's BLK128 factors (fp8_quantize_gpu's FP8Q_WEIGHT `sinv`): per expert an operand of seg_rows rows
// of k = cols, the experts' arrays one after another (fp8_scale_offset); group k * col_blocks + cb
// is block (rb, cb) of expert e (k = e * row_blocks + rb). The padding columns are not written.
__global__ void fp8g_factors_kernel(const float* inv, float* sinv, int groups, int row_blocks, int col_blocks, int cols) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    int k = g / col_blocks, cb = g % col_blocks, e = k / row_blocks, rb = k % row_blocks;
    size_t seg_off = (size_t)e * row_blocks * ((col_blocks + 3) / 4 * 4);
    sinv[seg_off + matmul_scale_blk128_index(rb * 128, cb * 128, cols)] = inv[g];
}

// The dequantisation factors of M's gathered codes, in the layout its GEMM operand reads, from the
// agreed per-group 1/s (inv, device, all groups): per tensor the one float 1/s (the slot's scale_inv
// for fp8_operand_of), block the BLK128 array fp8_quantize_gpu writes as `sinv` for FP8Q_WEIGHT
// (fp8_block_scale_count(FP8Q_WEIGHT, false, {seg_rows} x E, cols) floats).
static inline void fp8g_factors_gpu(const Fp8GatherMatrix* M, const float* inv, float* sinv, int block, cudaStream_t stream = 0) {
    if (!block) {
        cudaCheck(cudaMemcpyAsync(sinv, inv + M->group0, sizeof(float), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    LAUNCH(fp8g_factors_kernel, ceil_div(M->groups, 256), 256, 0, stream, inv + M->group0, sinv, (int)M->groups, M->row_blocks,
           M->col_blocks, M->cols);
}

// The device store's decoding (parallel/zero_gpu.cuh): a gathered piece [a, b) of a matrix (flat indices,
// whole rows: the matrix, or under expert parallelism the rows of one EP rank's experts) from its codes
// back to BF16 weights, y = bf16(e4m3(code) * inv[group]) — fp8g_piece_decode's value, rounded to BF16.
// With the agreed scale the model's own quantisation of y gives the same codes again (y is within 2^-9 of
// code / s, half an E4M3 step is at least 2^-5 of it), and a block's largest y is its amax.
__global__ void fp8g_decode_bf16_kernel(floatX* __restrict__ y, const __nv_fp8_storage_t* __restrict__ codes, Fp8gPiece p,
                                        const float* inv) {
    size_t n = p.b - p.a;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = (p.a + i) / p.cols, c = (p.a + i) % p.cols;   // (the group from the element's place in the matrix)
        size_t g = p.group0;
        if (p.block) g += ((r / p.seg_rows) * p.row_blocks + (r % p.seg_rows) / 128) * p.col_blocks + c / 128;
        __half_raw h = __nv_cvt_fp8_to_halfraw(codes[i], __NV_E4M3);
        y[i] = __float2bfloat16(__half2float(__half(h)) * inv[g]);
    }
}
// codes and y: the piece's first element
static inline void fp8g_decode_bf16_gpu(const Fp8GatherMatrix* M, size_t a, size_t b, const __nv_fp8_storage_t* codes, const float* inv,
                                        floatX* y, int block, cudaStream_t stream = 0) {
    if (a >= b) return;
    int nk;
    Fp8gPiece p = fp8g_piece(M, a, b, block, &nk);
    size_t n = b - a;
    LAUNCH(fp8g_decode_bf16_kernel, (int)std::min<size_t>((n + 255) / 256, 4096), 256, 0, stream, y, codes, p, inv);
}

// --fp8-gather with a per-tensor recipe: each weight slot's scale in the model (Fp8GPU::scale) becomes the
// scale the store agreed for the whole tensor (a block per matrix; mats as below), and its dequantisation factor
// (Fp8GPU::scale_inv, every inv_stride floats) the agreed 1 / s, which the GEMMs read with the gathered codes (under
// expert parallelism a rank's own amax would be its experts' only; for generation's BF16 decoding the model's FP8 path
// would quantise the decoded weights with that scale, Fp8Config.weights_quantized, and get the same codes)
__global__ void fp8g_weight_scales_kernel(float* slot_scale, float* slot_inv, int inv_stride, const size_t* mats, const float* scale,
                                          const float* inv) {
    const size_t* mt = mats + 3 * blockIdx.x;
    if (threadIdx.x == 0) {
        slot_scale[mt[0]] = scale[mt[1]];
        slot_inv[(size_t)inv_stride * mt[0]] = inv[mt[1]];
    }
}

// every matrix's tensor amax (the max of its groups' amaxes, non-negative) as float bits into its slot
// of Fp8GPU::amax: a block per matrix; mats (3 per matrix): the slot, the first group, the group count
__global__ void fp8g_tensor_amax_kernel(unsigned int* slot_amax, const size_t* mats, const float* amax) {
    __shared__ float scratch[32];
    const size_t* mt = mats + 3 * blockIdx.x;
    float m = 0.0f;
    for (size_t i = threadIdx.x; i < mt[2]; i += blockDim.x) m = fmaxf(m, amax[mt[1] + i]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) slot_amax[mt[0]] = __float_as_uint(m);
}

#endif  // DBRX_HAVE_CUDA
