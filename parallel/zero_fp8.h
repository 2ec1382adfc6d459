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
 *   4. this rank's shard of every block unit packed into a send buffer, in flat order: a 1-byte code
 *      for each element of an FP8 matrix, the 4-byte float for every other element; the saturated
 *      counts summed over the shard group (so counted once per step, not at every use).
 * Gathering a block unit: all-gather the packed pieces (each rank's padded to the longest of them) and
 * decode into the unit's FP32 working slot: code -> fp8_to_float(code) / scale, exactly the value the
 * fake quantisation (fp8_fake_quant) gives, floats copied. The model takes those weights as they are
 * (Fp8Config.weights_quantized). Same world size, same losses as --fp8 without --fp8-gather, bit for bit.
 * The GPU side (model/CUDA.md) would gather the codes the same way and feed them to cuBLASLt directly.
 */
#pragma once
#include <cmath>
#include <cstring>
#include <vector>
#include "../model/dbrx.h"
#include "comm.h"

// one FP8 weight matrix of a block unit: (rows, cols) row-major at `off` in the flat buffer, in
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
    int S, s;                                 // shard group size, this rank's place in it
    std::vector<size_t> unit_off, chunk;      // per unit: flat offset, shard length c = ceil(n / S)
    std::vector<std::vector<Fp8GatherTensor>> tensors;   // per unit (block units only; others empty)
    std::vector<Fp8GatherMatrix> mats;
    std::vector<float> amax, scale, inv;      // per scale group
    std::vector<double> saturated;            // per matrix, this step
    std::vector<size_t> piece, send_off;      // per unit: bytes of a packed piece (the longest over the ranks), ours in send
    std::vector<uint8_t> send, recv;
    float decode[256];                        // E4M3 code -> value (+0 for both zeros, as fp8_round)
} ZeroFp8;

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

// the bytes a rank's shard [lo, hi) of a unit takes packed: 1 per FP8-matrix element, 4 per other
// element; the padding past the last tensor is not sent
static inline size_t fp8g_packed_bytes(const std::vector<Fp8GatherTensor>& ts, size_t lo, size_t hi) {
    size_t bytes = 0;
    for (const Fp8GatherTensor& t : ts) {
        size_t a = t.off > lo ? t.off : lo, b = t.off + t.numel < hi ? t.off + t.numel : hi;
        if (a < b) bytes += (b - a) * (t.mat >= 0 ? 1 : sizeof(float));
    }
    return bytes;
}

// Sets up the FP8 gather for a model whose FP8 recipe is already enabled (dbrx_enable_fp8): the
// matrices, their scale groups, every unit's piece size. unit_off / shard_numel: zero.h's layout.
static inline void zero_fp8_init(ZeroFp8* f, Dbrx* m, int S, int s, const std::vector<size_t>& unit_off,
                                 const std::vector<size_t>& shard_numel) {
    const DbrxConfig* c = &m->cfg;
    f->on = 1; f->ready = 0;
    f->cfg = m->fp8;
    f->S = S; f->s = s;
    f->unit_off = unit_off; f->chunk = shard_numel;
    int n_units = (int)unit_off.size();
    f->tensors.assign(n_units, {});
    f->mats.clear();
    int block = f->cfg.recipe == FP8_BLOCK;
    size_t groups = 0;
    for (const ParamInfo& p : m->table) {
        int l = p.unit - 1;
        if (l < 0 || l >= c->n_layers) continue;   // the embedding and the head: no FP8 GEMM
        Fp8BlockState* b = &m->fp8_state[l];
        const char* name = p.name;
        size_t len = strlen(name);
        auto ends = [&](const char* suf) { size_t k = strlen(suf); return len >= k && !strcmp(name + len - k, suf); };
        Fp8Meta* meta = ends(".attn.Wqkv.weight") ? &b->qkv.w : ends(".attn.out_proj.weight") ? &b->proj.w
                      : ends(".mlp.w1") ? &b->w1.w : ends(".mlp.v1") ? &b->v1.w : ends(".mlp.w2") ? &b->w2.w : NULL;
        int mat = -1;
        if (meta) {
            Fp8GatherMatrix M;
            M.off = p.offset; M.rows = p.rows; M.cols = p.cols;
            M.seg_rows = ends(".attn.Wqkv.weight") || ends(".attn.out_proj.weight") ? p.rows : c->ffn_hidden;
            M.row_blocks = (M.seg_rows + 127) / 128; M.col_blocks = (M.cols + 127) / 128;
            M.group0 = groups;
            M.groups = block ? (size_t)(M.rows / M.seg_rows) * M.row_blocks * M.col_blocks : 1;
            M.meta = meta;
            groups += M.groups;
            mat = (int)f->mats.size();
            f->mats.push_back(M);
        }
        f->tensors[p.unit].push_back(Fp8GatherTensor{p.offset, p.numel, mat});
    }
    f->amax.assign(groups, 0.0f); f->scale.assign(groups, 1.0f); f->inv.assign(groups, 1.0f);
    f->saturated.assign(f->mats.size(), 0.0);
    f->piece.assign(n_units, 0); f->send_off.assign(n_units, 0);
    size_t send_total = 0, max_piece = 0;
    for (int u = 0; u < n_units; u++) {
        if (f->tensors[u].empty()) continue;
        for (int r = 0; r < S; r++) {   // every rank's piece: the gather needs equal sizes, so the longest
            size_t lo = unit_off[u] + (size_t)r * shard_numel[u];
            size_t b = fp8g_packed_bytes(f->tensors[u], lo, lo + shard_numel[u]);
            if (b > f->piece[u]) f->piece[u] = b;
        }
        f->send_off[u] = send_total;
        send_total += f->piece[u];
        if (f->piece[u] > max_piece) max_piece = f->piece[u];
    }
    f->send.assign(send_total, 0);
    f->recv.assign(max_piece * S, 0);
    for (int v = 0; v < 256; v++) f->decode[v] = (v & 0x7F) == 0 ? 0.0f : fp8_to_float((uint8_t)v, FP8_E4M3);
}

// Steps 1-4 of the top comment: agree on the scales, pack this rank's shards. master: this rank's
// shard buffer (zero.h's layout: unit u's shard at shard_off[u]). Collective over the shard group.
static inline void zero_fp8_prepare(ZeroFp8* f, CommGroup* g, const real* master, const std::vector<size_t>& shard_off) {
    const int block = f->cfg.recipe == FP8_BLOCK;
    std::fill(f->amax.begin(), f->amax.end(), 0.0f);
    std::fill(f->saturated.begin(), f->saturated.end(), 0.0);
    // 1. the amax of our piece of every matrix (block: of every block)
    for (size_t u = 0; u < f->tensors.size(); u++) {
        size_t lo = f->unit_off[u] + (size_t)f->s * f->chunk[u], hi = lo + f->chunk[u];
        for (const Fp8GatherTensor& t : f->tensors[u]) {
            size_t a = t.off > lo ? t.off : lo, b = t.off + t.numel < hi ? t.off + t.numel : hi;
            if (t.mat < 0 || a >= b) continue;
            fp8g_piece_amax(&f->mats[t.mat], a, b, master + shard_off[u] + (a - lo), f->amax.data(), block);
        }
    }
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
        if (f->tensors[u].empty()) continue;
        size_t lo = f->unit_off[u] + (size_t)f->s * f->chunk[u], hi = lo + f->chunk[u];
        uint8_t* out = f->send.data() + f->send_off[u];
        for (const Fp8GatherTensor& t : f->tensors[u]) {
            size_t a = t.off > lo ? t.off : lo, b = t.off + t.numel < hi ? t.off + t.numel : hi;
            if (a >= b) continue;
            const real* x = master + shard_off[u] + (a - lo);
            if (t.mat < 0) {
                for (size_t i = 0; i < b - a; i++, out += sizeof(float)) { float v = (float)x[i]; memcpy(out, &v, sizeof v); }
                continue;
            }
            f->saturated[t.mat] += (double)fp8g_piece_encode(&f->mats[t.mat], a, b, x, f->scale.data(), out, block);
            out += b - a;
        }
    }
    comm_all_reduce(g, f->saturated.data(), f->saturated.size(), COMM_F64);
    for (size_t k = 0; k < f->mats.size(); k++) f->mats[k].meta->saturated += (long long)f->saturated[k];
    f->ready = 1;
}

// Gathers block unit u into `work` (the unit's S * chunk floats, in flat order from unit_off[u]):
// the packed pieces of every rank, decoded. Collective over the shard group.
static inline void zero_fp8_gather_unit(ZeroFp8* f, CommGroup* g, int u, real* work) {
    const int block = f->cfg.recipe == FP8_BLOCK;
    size_t P = f->piece[u];
    comm_all_gather(g, f->send.data() + f->send_off[u], f->recv.data(), P, COMM_BYTE);
    for (int r = 0; r < f->S; r++) {
        size_t lo = f->unit_off[u] + (size_t)r * f->chunk[u], hi = lo + f->chunk[u];
        const uint8_t* in = f->recv.data() + (size_t)r * P;
        for (const Fp8GatherTensor& t : f->tensors[u]) {
            size_t a = t.off > lo ? t.off : lo, b = t.off + t.numel < hi ? t.off + t.numel : hi;
            if (a >= b) continue;
            real* y = work + (a - f->unit_off[u]);
            if (t.mat < 0) {
                for (size_t i = 0; i < b - a; i++, in += sizeof(float)) { float v; memcpy(&v, in, sizeof v); y[i] = (real)v; }
                continue;
            }
            fp8g_piece_decode(&f->mats[t.mat], a, b, in, f->inv.data(), f->decode, y, block);
            in += b - a;
        }
    }
}
