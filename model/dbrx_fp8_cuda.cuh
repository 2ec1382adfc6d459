/*
 * dbrx_fp8_cuda.cuh — FP8 training on the CUDA backend: the five GEMMs of every block (Wqkv,
 * out_proj, and the experts' w1, v1, w2; forward, dgrad and wgrad) on cuBLASLt FP8 operands, with
 * the CPU reference's recipes and tiling (model/fp8.cuh, model/dbrx.h):
 *   forward   out = x @ W^T        E4M3 x E4M3, fast accumulation, x in 1x128 tiles, W in 128x128
 *   dgrad     dx  = dy @ W         E5M2 x E4M3, promoted accumulation, dy in 1x128 tiles
 *   wgrad     dW += dy^T @ x       E5M2 x E4M3, promoted accumulation, dy and x in 128x1 tiles
 * Hopper's FP8 GEMMs are TN only: each operand is read contiguous along the GEMM's reduction, so the
 * quantisation kernel writes the transposed copy where the reduction runs over rows (dgrad's W,
 * wgrad's dy and x). Operands are quantised from the BF16 tensors at their point of use, into
 * scratch buffers shared by the blocks (as the CPU's fake quantisation does); the weights, where they
 * stay in place for the step, once per step into copies of their own (fp8_weight_gpu); the experts' SwiGLU
 * output (act) and gradients (dg, du) by SwiGLU itself (fp8_quantize_produced, model/fp8_fused.cuh).
 *
 * Per-tensor bookkeeping: every operand (layer, linear, x | w | dy) has a slot with its Fp8Meta on
 * the host (the CPU's struct and fp8_meta_step) and, on the device, the delayed recipe's scale, the
 * dequantisation factor of its last quantisation, this step's amax (max over the micro-batches) and
 * saturation count. Once per step the amaxes come back to the host (one copy), are reduced across
 * the ranks that share the tensor, logged, and roll into the histories; the new scales go up in one
 * copy. The slots are named and ordered as dbrx_fp8_metas names the CPU's (v1's input is w1's).
 *
 * Experts: the FP8 GEMMs need every token count they see as a dimension to be a multiple of 16
 * (wgrad's reduction, leading dimensions) or 8 (block scaling's outer sizes). With FP8 on, the
 * routed rows are therefore laid out with every expert's rows padded to a multiple of 16
 * (fp8_pad_routing: the dispatch's slot -> row map is remapped in place, the gather reads a padded
 * row -> token map); the padding rows are never read by the combine and are quantised as zeros,
 * so they add nothing to any GEMM.
 */
#pragma once
#include <algorithm>
#include <array>
#include <functional>
#include <string>
#include <vector>
#include "fp8.cuh"
#include "fp8_fused.cuh"
#include "moe.cuh"

// one scratch FP8 operand: the row-wise codes, the transposed codes, and (block scaling) their factors
typedef struct { __nv_fp8_storage_t *q, *qt; float *sinv, *sinv_t; } Fp8Buf;

// a block weight that arrived as codes (--fp8-gather, the device store's slot): its row-wise codes q (rows, cols) and
// factors as the GEMMs read them, and room for the transposed copy qt, made at the first GEMM that wants it (has_qt)
typedef struct {
    const floatX* w;   // the weight's place in the slot (the model's pointer to it)
    Fp8Buf buf;
    int rows, cols, seg_rows;
    bool has_qt;
} Fp8Given;

// the padded expert layout of one layer's routed rows (FP8 only)
typedef struct {
    std::vector<int> poff;   // host (E + 1): expert e owns padded rows poff[e] .. poff[e+1]-1
    std::vector<int> len;    // host (E): padded rows of each expert
    int* seg;                // device (2E + 1): poff, then the valid (routed) rows of every expert
    int* row_token;          // device (R + 15 E): padded row -> token (padding: token 0, never used)
    int row_tiles;
    bool xe_codes;           // the experts' forward left xe's transposed codes in xe's buffer, not BF16 xe (fp8_xe_codes)
} Fp8Routing;

// each slot's per-tensor 1/scale 16 bytes from the next: the GEMMs take it as their scale pointer. On an H200
// (cuBLASLt 13.0) a per-tensor FP8 GEMM failed NOT_SUPPORTED in the model, where these pointers were 4 bytes apart,
// and ran in the tests, where each had its own allocation. The alignment is the cause: an H100 (cuBLASLt 13, 2026-11-28,
// dev/bench/results_gpu.md) refused a scale pointer 4 bytes off 16-byte alignment and took one 16 bytes off; the
// wrapper refuses such a pointer in one line (matmul_validate_fp8)
#define FP8_SINV_STRIDE 4

typedef struct {
    Fp8Config cfg;                              // recipe FP8_OFF: nothing below is used
    int nslots;
    std::vector<std::string> names;             // per slot, as dbrx_fp8_metas names the CPU's
    std::vector<Fp8Format> fmts;
    std::vector<Fp8Meta> metas;                 // host bookkeeping (delayed: the amax history)
    std::vector<std::array<int, 15>> slot;      // per layer: [linear * 3 + op] -> slot (v1's x: w1's)
    float *scale, *scale_inv;                   // device (nslots; scale_inv every FP8_SINV_STRIDE): delayed scales; 1 / scale of the last cast
    unsigned int *amax, *tmp_amax;              // device (nslots) float bits; (3) current scaling's first pass
    unsigned long long* sat;                    // device (nslots)
    std::vector<float> last_scale;              // host (nslots): per-tensor scale of the last cast (log)
    Fp8Buf act, grad, w, w2, w3;                // scratch: activations, gradients, weights (w2: v1's; w3: EP + block only, w2's
                                                // held for a layer's exchange chunks: fp8_hold_expert_weights, parallel/expert_parallel_fp8.cuh)
    std::vector<Fp8Routing> routing;            // per layer
    bool collected;                             // amaxes of this step already on the host
    bool frozen = false;                        // --recompute: quantisations record no amax or saturation
    // the weights quantised once per step (fp8_weight_gpu), where they stay in place for the step (no shard group
    // gathers them: one GPU, or replicas with --shard-group-size 1). Off: each use quantises into w / w2.
    bool wcache = false;
    std::vector<Fp8Buf> wq;                     // per layer x linear ([layer * FP8_NLIN + lin]): q, qt, (block) factors
    std::vector<const floatX*> wq_src;          // the weight each copy was made from in this step (nullptr: stale)
    // the experts' w1, v1, w2 of one layer quantised once into w, w2, w3 for the GEMMs of its exchange chunks
    // (fp8_hold_expert_weights, parallel/expert_parallel_fp8.cuh; src nullptr: none held), which read them as fp8_weight_gpu's
    struct { const floatX* src; int layer; bool q, qt; } held[3] = {};
    // --fp8-gather's codes used as they are (the device store, under parallel/): the block weights it placed in its
    // working slots as their E4M3 codes and factors, by their BF16 pointer (fp8_given_add); fp8_weight_gpu returns them
    std::vector<Fp8Given> given;
    bool bf16_weights = false;                  // generation runs: the store gathers the block weights as BF16 (not codes)
} Fp8GPU;

static inline bool fp8_on(const Fp8GPU* f) { return f->cfg.recipe != FP8_OFF; }
static inline int fp8_slot(const Fp8GPU* f, int layer, int lin, int op) { return f->slot[layer][lin * 3 + op]; }

// the extra expert rows of the padded layout (every expert rounded up to 16 rows)
static inline size_t fp8_row_padding(const DbrxConfig* c) { return (size_t)15 * c->n_experts; }

// Checks the shapes FP8 needs and names the slots. Bad input: one line, exit 2. weight_cache: the block
// weights stay in place for a step (no shard group gathers them), so each is quantised once per step into
// a copy of its own (fp8_weight_gpu).
static inline void fp8_gpu_setup(Fp8GPU* f, const Fp8Config* cfg, const DbrxConfig* c, int B, int T, bool weight_cache = false) {
    f->cfg = cfg ? *cfg : Fp8Config{FP8_OFF, 16, 0, 0};
    f->nslots = 0;
    f->collected = false;
    f->names.clear();
    f->fmts.clear();
    f->wcache = false;
    f->wq.clear();
    f->wq_src.clear();
    if (!fp8_on(f)) return;
    if (cfg->history_len < 1 || cfg->history_len > FP8_MAX_HISTORY)
        fail(EXIT_BAD_INPUT, "--fp8-amax-history %d must be in [1, %d]", cfg->history_len, FP8_MAX_HISTORY);
    if (((long long)B * T) % 16)
        fail(EXIT_BAD_INPUT, "--fp8 on the GPU needs batch x seq (%d x %d = %lld tokens) to be a multiple of 16: the FP8 "
             "GEMMs reduce over the tokens in wgrad, and cuBLASLt wants that dimension in multiples of 16", B, T, (long long)B * T);
    int qd = qkv_dim(c);
    if (c->d_model % 16 || c->ffn_hidden % 16 || qd % 16)
        fail(EXIT_BAD_INPUT, "--fp8 on the GPU needs d_model (%d), ffn_hidden (%d) and the qkv width (%d) to be multiples of 16 "
             "(cuBLASLt's FP8 leading dimensions)", c->d_model, c->ffn_hidden, qd);
    f->slot.assign(c->n_layers, std::array<int, 15>());
    for (const Fp8Operand& o : fp8_operand_table(c->n_layers)) {   // one slot per operand, in the table's order
        f->slot[o.layer][o.lin * 3 + o.op] = f->nslots++;
        f->names.push_back(o.name);
        f->fmts.push_back(o.fmt);
    }
    for (int l = 0; l < c->n_layers; l++)   // v1 reads w1's input
        f->slot[l][FP8_LIN_V1 * 3 + FP8_OP_X] = f->slot[l][FP8_LIN_W1 * 3 + FP8_OP_X];
    f->metas.resize(f->nslots);
    for (Fp8Meta& m : f->metas) fp8_meta_init(&m);
    f->last_scale.assign(f->nslots, 1.0f);
    f->wcache = weight_cache;
    if (weight_cache) { f->wq.assign((size_t)c->n_layers * FP8_NLIN, Fp8Buf{}); f->wq_src.assign((size_t)c->n_layers * FP8_NLIN, nullptr); }
}

// the shape of block weight `lin` (rows, cols, segments: the experts' stacked F rows) on a rank of an EP group of ep_n
// (its E / ep_n experts)
static inline void fp8_weight_shape(const DbrxConfig* c, int lin, size_t* rows, size_t* cols, size_t* nseg, int ep_n = 1) {
    size_t d = c->d_model, E = c->n_experts / ep_n, F = c->ffn_hidden;
    *cols = d;
    *rows = lin == FP8_LIN_QKV ? (size_t)qkv_dim(c) : lin == FP8_LIN_PROJ ? d : E * F;
    *nseg = lin == FP8_LIN_QKV || lin == FP8_LIN_PROJ ? 1 : E;
}

// Bounds of the scale-factor arrays of a tensor of `rows` in `nseg` segments (fp8_block_scale_count
// for any segment lengths): row-wise (q) or transposed (qt) factors, activation or weight tiles.
static inline size_t fp8_scale_bound(size_t rows, size_t cols, size_t nseg, bool weight, bool transposed) {
    size_t nct = (cols + 127) / 128, tiles = rows / 128 + nseg;   // >= the sum of ceil(len / 128)
    if (!weight) return transposed ? tiles * cols : nct * rows;
    return transposed ? nct * (rows / 128 + 4 * nseg) : tiles * ((nct + 3) / 4 * 4);
}

// Walks the FP8 buffers of the model: `take(ptr, bytes)` allocates (or only counts) each one. The block weights' scratch
// (w, w2, w3) only where the weights are quantised by the model: not under --fp8-gather (cfg.weights_quantized, set
// before the model is built), whose codes the store places in its slots (fp8_given_operand). Under expert parallelism
// (ep_n > 1) a rank quantises only its E / ep_n experts' weights, and the experts' activations and gradients go to the
// dispatcher's own scratch (ep_fp8_scratch_swap): act and grad hold the attention's operands only, no layer has a
// padded row -> token map. hold: w3 for the third expert weight held for a layer's exchange chunks (EP, block scaling,
// --ep-overlap-chunks > 1, no weight cache: fp8_hold_expert_weights).
static inline void fp8_gpu_buffers(Fp8GPU* f, const DbrxConfig* c, int B, int T, const std::function<void(void**, size_t)>& take,
                                   int ep_n = 1, bool hold = false) {
    if (!fp8_on(f)) return;
    size_t N = (size_t)B * T, d = c->d_model, F = c->ffn_hidden, E = c->n_experts, qd = qkv_dim(c), El = E / ep_n;
    bool ep = ep_n > 1;
    size_t Rp = N * c->top_k + fp8_row_padding(c);
    struct Shape { size_t rows, cols, nseg; };
    auto buf = [&](Fp8Buf* b, std::vector<Shape> shapes, bool weight) {
        size_t elems = 0, sq = 0, st = 0;
        for (const Shape& s : shapes) {
            elems = std::max(elems, s.rows * s.cols);
            sq = std::max(sq, fp8_scale_bound(s.rows, s.cols, s.nseg, weight, false));
            st = std::max(st, fp8_scale_bound(s.rows, s.cols, s.nseg, weight, true));
        }
        take((void**)&b->q, elems);
        take((void**)&b->qt, elems);
        b->sinv = b->sinv_t = nullptr;
        if (f->cfg.recipe == FP8_BLOCK) { take((void**)&b->sinv, sq * sizeof(float)); take((void**)&b->sinv_t, st * sizeof(float)); }
    };
    if (ep) {
        buf(&f->act, {{N, d, 1}}, false);
        buf(&f->grad, {{N, qd, 1}, {N, d, 1}}, false);
    } else {
        buf(&f->act, {{N, d, 1}, {Rp, d, E}, {Rp, F, E}}, false);
        buf(&f->grad, {{N, qd, 1}, {N, d, 1}, {Rp, d, E}, {Rp, F, E}}, false);
    }
    f->w = f->w2 = f->w3 = Fp8Buf{};
    if (!f->cfg.weights_quantized) {   // (--fp8-gather: the weights arrive as codes, which the GEMMs read as they are)
        buf(&f->w, {{qd, d, 1}, {d, d, 1}, {El * F, d, El}}, true);
        buf(&f->w2, {{El * F, d, El}}, true);
        if (hold) buf(&f->w3, {{El * F, d, El}}, true);
    }
    for (size_t i = 0; i < f->wq.size(); i++) {   // the weight cache: every block weight's q and qt (and factors)
        size_t rows, cols, nseg;
        fp8_weight_shape(c, (int)(i % FP8_NLIN), &rows, &cols, &nseg, ep_n);
        buf(&f->wq[i], {{rows, cols, nseg}}, true);
    }
    size_t n = f->nslots;
    take((void**)&f->scale, n * sizeof(float));
    take((void**)&f->scale_inv, n * FP8_SINV_STRIDE * sizeof(float));
    take((void**)&f->amax, n * sizeof(unsigned int));
    take((void**)&f->tmp_amax, 3 * sizeof(unsigned int));
    take((void**)&f->sat, n * sizeof(unsigned long long));
    f->routing.resize(c->n_layers);
    for (Fp8Routing& r : f->routing) {
        take((void**)&r.seg, (2 * E + 1) * sizeof(int));
        r.row_token = nullptr;
        if (!ep) take((void**)&r.row_token, Rp * sizeof(int));
    }
}

// The weights changed (an optimizer step, a checkpoint or import, a refreshed BF16 copy): the cached
// quantised copies are stale; the next use of each weight quantises it again
static inline void fp8_gpu_weights_changed(Fp8GPU* f) { std::fill(f->wq_src.begin(), f->wq_src.end(), nullptr); }

// the device state of a fresh model: scales 1, nothing seen yet
static inline void fp8_gpu_reset(Fp8GPU* f) {
    if (!fp8_on(f)) return;
    fp8_gpu_weights_changed(f);
    std::vector<float> ones(f->nslots, 1.0f);
    cudaCheck(cudaMemcpy(f->scale, ones.data(), f->nslots * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<float> ones_sinv((size_t)f->nslots * FP8_SINV_STRIDE, 1.0f);
    cudaCheck(cudaMemcpy(f->scale_inv, ones_sinv.data(), ones_sinv.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(f->amax, 0, f->nslots * sizeof(unsigned int)));
    cudaCheck(cudaMemset(f->sat, 0, f->nslots * sizeof(unsigned long long)));
    for (Fp8Meta& m : f->metas) fp8_meta_init(&m);
    f->collected = false;
}

// ---------------------------------------------------------------------------------------------
// the padded expert layout

// slot -> row of the dispatch, remapped to the padded rows (expert e's rows move by poff[e] - off[e])
__global__ void fp8_pad_slots_kernel(int* slot_row, const int* offsets, const int* seg, int R, int E) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= R) return;
    int r = slot_row[s], e = 0;
    while (e + 1 < E && offsets[e + 1] <= r) e++;
    slot_row[s] = r - offsets[e] + seg[e];
}
// padded row -> token: the dispatch's row_token where the row holds a routed token, else token 0
__global__ void fp8_pad_rows_kernel(int* row_token_pad, const int* row_token, const int* offsets, const int* seg, int Rp, int E) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= Rp) return;
    int e = 0;
    while (e + 1 < E && seg[e + 1] <= p) e++;
    int j = p - seg[e];
    row_token_pad[p] = j < offsets[e + 1] - offsets[e] ? row_token[offsets[e] + j] : 0;
}

// The padded layout of E experts whose rows start at offsets_host (E + 1, host): each expert's rows
// rounded up to a multiple of 16 (poff, len, row_tiles of 128), and its device table seg: the padded
// offsets (E + 1), then the real row counts (E).
static inline void fp8_routing_layout(Fp8Routing* rt, const int* offsets_host, int E, cudaStream_t stream) {
    rt->poff.assign(E + 1, 0);
    rt->len.assign(E, 0);
    std::vector<int> seg(2 * E + 1);
    rt->row_tiles = 0;
    for (int e = 0; e < E; e++) {
        int n = offsets_host[e + 1] - offsets_host[e];
        rt->len[e] = (n + 15) / 16 * 16;
        rt->poff[e + 1] = rt->poff[e] + rt->len[e];
        rt->row_tiles += (rt->len[e] + 127) / 128;
        seg[E + 1 + e] = n;
    }
    for (int e = 0; e <= E; e++) seg[e] = rt->poff[e];
    cudaCheck(cudaMemcpyAsync(rt->seg, seg.data(), seg.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
}

// Builds layer `layer`'s padded layout from the dispatch's offsets (host and device copies), remaps
// slot_row (R = N k) in place; returns the padded row -> token map for the gather.
static inline const int* fp8_pad_routing(Fp8GPU* f, int layer, int* slot_row, const int* row_token, const int* offsets,
                                         const int* offsets_host, int R, int E, cudaStream_t stream = 0) {
    Fp8Routing& rt = f->routing[layer];
    fp8_routing_layout(&rt, offsets_host, E, stream);
    LAUNCH(fp8_pad_slots_kernel, ceil_div(R, 256), 256, 0, stream, slot_row, offsets, (const int*)rt.seg, R, E);
    int Rp = rt.poff[E];
    if (Rp > 0) LAUNCH(fp8_pad_rows_kernel, ceil_div(Rp, 256), 256, 0, stream, rt.row_token, row_token, offsets, (const int*)rt.seg, Rp, E);
    return rt.row_token;
}

// Expert parallelism: layer `layer`'s padded layout over the El local experts from the received rows'
// expert-major offsets loff (El + 1, host): every expert's rows rounded up to 16, as fp8_pad_routing.
// Fills map (padded row -> expert-major row; padding: row 0, quantised as zero) and inv (expert-major
// row -> padded row). Returns the padded row count.
static inline int fp8_local_routing(Fp8GPU* f, int layer, const int* loff, int El, std::vector<int>* map, std::vector<int>* inv,
                                    cudaStream_t stream = 0) {
    Fp8Routing& rt = f->routing[layer];
    fp8_routing_layout(&rt, loff, El, stream);
    map->assign(rt.poff[El], 0);
    inv->assign(loff[El], 0);
    for (int e = 0; e < El; e++)
        for (int j = 0; j < loff[e + 1] - loff[e]; j++) { (*map)[rt.poff[e] + j] = loff[e] + j; (*inv)[loff[e] + j] = rt.poff[e] + j; }
    return rt.poff[El];
}

// the element counts of activation / gradient scratch (Fp8Buf) for rows routed rows in nseg expert
// segments of d or F columns: codes, row-wise factors, transposed factors (block scaling)
static inline void fp8_expert_scratch_sizes(size_t rows, size_t d, size_t F, size_t nseg, size_t* elems, size_t* sq, size_t* st) {
    *elems = rows * std::max(d, F);
    *sq = std::max(fp8_scale_bound(rows, d, nseg, false, false), fp8_scale_bound(rows, F, nseg, false, false));
    *st = std::max(fp8_scale_bound(rows, d, nseg, false, true), fp8_scale_bound(rows, F, nseg, false, true));
}

static inline Fp8Segments fp8_expert_segments(const Fp8Routing& rt) {
    int E = (int)rt.len.size();
    return {rt.seg, rt.seg + E + 1, E, 0, rt.row_tiles};
}

// An Fp8Buf for an activation / gradient of rows (padded expert layout rt) x cols laid into two BF16 buffers of
// at least rows x cols each that are otherwise unused: the codes q, qt (1 byte each) in `codes`, the block factors
// (exact counts, fp8_block_scale_count; at most rows (cols / 128 + 1) + rows cols / 16 floats <= 2 rows cols bytes
// for cols >= 16) in `factors`
static inline Fp8Buf fp8_buf_in(const Fp8GPU* f, floatX* codes, floatX* factors, const Fp8Routing& rt, int rows, int cols) {
    Fp8Buf b;
    b.q = (__nv_fp8_storage_t*)codes;
    b.qt = b.q + (size_t)rows * cols;
    b.sinv = b.sinv_t = nullptr;
    if (f->cfg.recipe != FP8_BLOCK) return b;
    size_t nq = fp8_block_scale_count(FP8Q_ACT, false, rt.len, cols), nt = fp8_block_scale_count(FP8Q_ACT, true, rt.len, cols);
    if ((nq + nt) * sizeof(float) > (size_t)rows * cols * sizeof(floatX))
        fail(EXIT_FAILURE, "fp8_buf_in: %zu factors do not fit a %d x %d BF16 buffer", nq + nt, rows, cols);
    b.sinv = (float*)factors;
    b.sinv_t = b.sinv + (nq + 3) / 4 * 4;
    return b;
}

// The transposed codes of act (rows x cols, padded expert layout rt) for w2's weight gradient, laid into the BF16
// scratch `factors` after the factors fp8_buf_in put there (fp8_buf_in(f, ., factors, ...) of the same shape): the
// codes (rows cols bytes), then (block scaling) their factors. It fits: fp8_buf_in's factors are at most
// rows (cols / 128 + 1) + rows cols / 16 floats, these at most rows cols / 16: with the codes <= 1.6 rows cols +
// 4 rows <= 2 rows cols bytes for cols >= 16 (fp8_fused_ok)
static inline Fp8Buf fp8_buf_after(const Fp8GPU* f, const Fp8Buf& before, floatX* factors, const Fp8Routing& rt, int rows, int cols) {
    Fp8Buf b = {nullptr, (__nv_fp8_storage_t*)factors, nullptr, nullptr};
    size_t nt = 0;
    if (f->cfg.recipe == FP8_BLOCK) {   // (before's transposed factors: as many as these, the last of its factors)
        nt = fp8_block_scale_count(FP8Q_ACT, true, rt.len, cols);
        b.qt = (__nv_fp8_storage_t*)(before.sinv_t + (nt + 3) / 4 * 4);
        b.sinv_t = (float*)(b.qt + (size_t)rows * cols);
    }
    if ((size_t)((char*)(b.qt + (size_t)rows * cols) - (char*)factors) + nt * sizeof(float) > (size_t)rows * cols * sizeof(floatX))
        fail(EXIT_FAILURE, "fp8_buf_after: act's transposed codes do not fit a %d x %d BF16 buffer", rows, cols);
    return b;
}

// xe's transposed codes (rows x cols, padded expert layout rt: the w1 / v1 weight gradients' operand) and, under
// block scaling, their factors, laid into xe's own BF16 buffer in place of xe (fp8_experts_forward_gpu's xe_codes):
// the codes (rows cols bytes, rounded up to 16), then the factors. They fit: at most rows cols / 4 floats (a factor
// per column and 128-row tile of a non-empty expert, whose padded rows are at least 16), 1.25 rows cols + 16 bytes
// of the buffer's 2 rows cols.
static inline Fp8Buf fp8_xe_codes(const Fp8GPU* f, const floatX* xe, const Fp8Routing& rt, int rows, int cols) {
    Fp8Buf b = {nullptr, (__nv_fp8_storage_t*)const_cast<floatX*>(xe), nullptr, nullptr};
    size_t codes = ((size_t)rows * cols + 15) / 16 * 16, nt = 0;
    if (f->cfg.recipe == FP8_BLOCK) {
        nt = fp8_block_scale_count(FP8Q_ACT, true, rt.len, cols);
        b.sinv_t = (float*)(b.qt + codes);
    }
    if (codes + nt * sizeof(float) > (size_t)rows * cols * sizeof(floatX))
        fail(EXIT_FAILURE, "fp8_xe_codes: xe's transposed codes do not fit its %d x %d BF16 buffer", rows, cols);
    return b;
}

// ---------------------------------------------------------------------------------------------
// quantisation of one operand under the recipe, and the GEMM operands it yields

// The recipe's quantisation of a producer's output(s) into bufs (one per output, slots[i]; SWIGLU_BWD: dg, du and,
// where bufs[2] is not NULL, act), fused into the producer (model/fp8_fused.cuh): the codes, factors, amaxes and
// saturation counts fp8_quantize_operand gives on the BF16 output (bufs[i]->q NULL: no row-wise codes). Block: one pass. Per tensor with a known scale (delayed): one pass. Current scaling (and
// delayed before its first history entry): a first pass takes the amax (and writes p.y); then a second pass makes the
// codes: from p.y (FP8P_GATHER of p.y itself) where the producer writes it, else from the producer again.
// weight: x itself (FP8P_GATHER, no idx or y) is a block weight (fp8_quantize_operand's weight rules).
static inline void fp8_quantize_produced(Fp8GPU* f, Fp8Producer prod, Fp8ProducerArgs p, const int* slots, int rows, int cols,
                                         const Fp8Segments& seg, Fp8Buf* const* bufs, bool want_q, bool want_qt, cudaStream_t stream,
                                         bool weight = false) {
    const int nout = prod == FP8P_SWIGLU_BWD ? (bufs[2] ? 3 : 2) : 1;
    const Fp8Format fmt = f->fmts[slots[0]], fmt2 = nout == 3 ? f->fmts[slots[2]] : FP8_E4M3;
    ENSURE(nout == 1 || f->fmts[slots[1]] == fmt, "fused FP8 quantisation: dg and du in one format (slots %d, %d)", slots[0], slots[1]);
    Fp8FusedOut o[3] = {};
    bool first = false;
    for (int i = 0; i < nout; i++) {
        int sl = slots[i];
        o[i].out = {want_q ? bufs[i]->q : nullptr, want_qt ? bufs[i]->qt : nullptr, nullptr, nullptr,
                    f->frozen ? nullptr : f->amax + sl, f->frozen ? nullptr : f->sat + sl};
        if (f->cfg.recipe == FP8_BLOCK) {
            o[i].out.sinv = want_q ? bufs[i]->sinv : nullptr;
            o[i].out.sinv_t = want_qt ? bufs[i]->sinv_t : nullptr;
            continue;
        }
        o[i].out.sinv = f->scale_inv + FP8_SINV_STRIDE * sl;
        bool given = weight && f->cfg.weights_quantized;   // (--fp8-gather: the slot holds the whole tensor's agreed scale)
        if (!given && (f->cfg.recipe == FP8_CURRENT || f->metas[sl].filled == 0)) { o[i].amax_in = f->tmp_amax + i; first = true; }
        else o[i].scale = f->scale + sl;
    }
    const Fp8FusedOut* o2 = nout == 3 ? &o[2] : nullptr;
    if (f->cfg.recipe == FP8_BLOCK) {
        fp8_fused_quantize_gpu(prod, p, rows, cols, seg, fmt, weight ? FP8Q_WEIGHT : FP8Q_ACT, 0, o[0], o[1], stream, o2, fmt2);
        return;
    }
    if (first) {
        Fp8FusedOut a[3] = {};
        for (int i = 0; i < nout; i++) a[i].out.amax = f->tmp_amax + i;
        cudaCheck(cudaMemsetAsync(f->tmp_amax, 0, 3 * sizeof(unsigned int), stream));
        fp8_fused_quantize_gpu(prod, p, rows, cols, seg, fmt, FP8Q_AMAX, 0, a[0], a[1], stream, nout == 3 ? &a[2] : nullptr, fmt2);
        if (p.y) { p = {p.y, nullptr, nullptr, nullptr, nullptr}; prod = FP8P_GATHER; }   // (one output) the codes from p.y
    }
    fp8_fused_quantize_gpu(prod, p, rows, cols, seg, fmt, FP8Q_TENSOR, f->cfg.margin, o[0], o[1], stream, o2, fmt2);
}

// The 16-row rule of the fused kernels (fp8_fused_ok) for the segments of a tensor: uniform segments of a multiple of
// 16 rows, or a layer's padded expert layout (every expert's rows rounded up to 16: fp8_routing_layout)
static inline bool fp8_segments_ok16(const Fp8GPU* f, const Fp8Segments& seg) {
    if (!seg.start) return seg.seg_len % 16 == 0;
    for (const Fp8Routing& rt : f->routing)
        if (rt.seg == seg.start) return true;
    return false;
}

// The fused kernels' shapes (fp8_fused_ok) for `rows` x `cols` in segments of rt's padded expert layout: what
// fp8_gpu_setup's checks (tokens, d_model, ffn_hidden and the qkv width multiples of 16) and the padded layout (every
// expert's rows rounded up to 16) guarantee, so a failure is an internal error, not an input the product handles.
// (Until session 55 each FP8 site kept an unfused fallback for other shapes: code no test could reach.)
static inline void fp8_fused_shapes_check(int layer, int rows, int cols, const Fp8Routing& rt, std::initializer_list<const void*> ptrs) {
    ENSURE(fp8_fused_ok(rows, cols, rt.len, ptrs), "internal error: layer %d: the FP8 experts' fused kernels want %d rows, %d "
           "columns and every expert's padded rows in multiples of 16, and 16-byte aligned buffers", layer, rows, cols);
}

// Quantises x (rows, cols) into `buf`: the row-wise codes (want_q) and/or the transposed copy (want_qt), by
// fp8_gather_quantize_kernel (x itself: fp8_quantize_produced, FP8P_GATHER; the same codes, factors, amax and count as
// fp8_quantize_kernel's, with 16-byte stores), on the fused kernels' shapes (fp8_fused_ok: fp8_gpu_setup's checks make
// every tensor the step quantises one). The slot's amax and saturation count accumulate. weight: 128x128 blocks under
// the block recipe. Per tensor: delayed uses the slot's scale, except before the first history entry (then, as current
// scaling, this tensor's own amax, as the CPU's fp8_operand); a weight under --fp8-gather (cfg.weights_quantized) the
// slot's scale, which the store set to the whole tensor's agreed one (the GPU store, under parallel/): under expert
// parallelism this rank's weights are only its experts.
static inline void fp8_quantize_operand(Fp8GPU* f, int slot, bool weight, const floatX* x, int rows, int cols,
                                        const Fp8Segments& seg, Fp8Buf* buf, bool want_q, bool want_qt, cudaStream_t stream = 0) {
    ENSURE(fp8_segments_ok16(f, seg) && fp8_fused_ok(rows, cols, {}, {x, buf->q, buf->qt}), "internal error: FP8 operand %s "
           "(%d x %d) off the fused kernels' shapes: rows, columns and segments in multiples of 16, 16-byte aligned buffers",
           f->names[slot].c_str(), rows, cols);
    Fp8Buf* bufs[3] = {buf, nullptr, nullptr};
    fp8_quantize_produced(f, FP8P_GATHER, {x, nullptr, nullptr, nullptr, nullptr}, &slot, rows, cols, seg, bufs, want_q, want_qt, stream,
                          weight);
}

// The scale-factor offset of segment `e` of a quantised tensor (segment starts `start`, E + 1, host;
// `cols` columns) in the layouts the kernel writes: row-wise (q) or transposed (qt), activation tiles
// or weight blocks.
static inline size_t fp8_scale_offset(const std::vector<int>& start, int e, int cols, bool weight, bool transposed) {
    size_t nct = (cols + 127) / 128, off = 0;
    for (int s = 0; s < e; s++) {
        size_t len = start[s + 1] - start[s], nt = (len + 127) / 128;
        if (!weight) off += transposed ? nt * cols : nct * len;
        else off += transposed ? nct * ((nt + 3) / 4 * 4) : nt * ((nct + 3) / 4 * 4);
    }
    return off;
}

// A GEMM operand from a quantised buffer: rows [r0, ...) of the row-wise codes (ld = cols), or
// columns [r0, ...) of the transposed ones (ld = rows of the tensor); scale factors at `scale_off`
static inline Fp8GemmOperand fp8_operand_of(const Fp8GPU* f, int slot, const Fp8Buf& b, bool weight, bool transposed,
                                            size_t r0, int ld, size_t scale_off) {
    Fp8GemmOperand o;
    o.data = (transposed ? b.qt : b.q) + (transposed ? r0 : r0 * (size_t)ld);
    o.type = f->fmts[slot] == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    o.ld = ld;
    if (f->cfg.recipe == FP8_BLOCK) {
        o.scale = (transposed ? b.sinv_t : b.sinv) + scale_off;
        o.scale_mode = weight ? MATMUL_SCALE_BLK128 : MATMUL_SCALE_VEC128;
    } else {
        o.scale = f->scale_inv + FP8_SINV_STRIDE * slot;
        o.scale_mode = MATMUL_SCALE_TENSOR;
    }
    o.name = f->names[slot].c_str();
    return o;
}

// --fp8-gather's codes used as they are: the device store placed weight w's codes (buf.q, buf.sinv) where its BF16 values
// would be (the device store's gather, under parallel/); fp8_given_forget drops the entries of a slot it regathers
static inline void fp8_given_forget(Fp8GPU* f, const void* lo, const void* hi) {
    f->given.erase(std::remove_if(f->given.begin(), f->given.end(), [&](const Fp8Given& g) {
        return (const char*)g.w >= (const char*)lo && (const char*)g.w < (const char*)hi; }), f->given.end());
}
static inline void fp8_given_add(Fp8GPU* f, const floatX* w, Fp8Buf buf, int rows, int cols, int seg_rows) {
    ENSURE(seg_rows > 0 && rows % seg_rows == 0, "internal error: FP8 weight codes of %d rows in experts of %d", rows, seg_rows);
    f->given.push_back(Fp8Given{w, buf, rows, cols, seg_rows, false});
}
// The codes of weight w if the store gave them (else NULL): the transposed copy is made from q, once per gather, when
// a GEMM first wants it (dgrad's W^T, Hopper's TN rule): the bytes and factors the model's own quantisation writes as
// qt and sinv_t (test/test_zero_fp8_cuda.cpp)
static inline const Fp8Buf* fp8_given_operand(Fp8GPU* f, const floatX* w, int rows, int cols, bool want_qt, cudaStream_t stream) {
    for (Fp8Given& g : f->given) {
        if (g.w != w) continue;
        ENSURE(g.rows == rows && g.cols == cols, "internal error: FP8 weight codes of %d x %d read as %d x %d", g.rows, g.cols, rows, cols);
        if (want_qt && !g.has_qt) {
            fp8_transpose_gpu(g.buf.qt, g.buf.sinv_t, g.buf.q, g.buf.sinv, rows, cols, g.seg_rows, stream);
            g.has_qt = true;
        }
        return &g.buf;
    }
    return nullptr;
}

// Block weight `lin` of `layer` (rows, cols in segments `seg`) as its GEMMs read it. With the cache (f->wcache)
// it is quantised at its first use in a step, q and qt together, into its own copy, and every later GEMM of the
// step reads that copy: the forward, the recomputation, the backward and the other micro-batches of
// --grad-accum. The codes and factors are those each use would make (the weight and, per tensor, its scale are
// fixed for the step); its amax is recorded once, which is the same maximum; its saturations are counted once per
// step, where the CPU counts them at every use. Without the cache: quantised into `scratch` at every use. Gathered as
// codes (--fp8-gather): those codes, as they arrived (fp8_given_operand), no quantisation at all.
static inline const Fp8Buf& fp8_weight_gpu(Fp8GPU* f, int layer, int lin, const floatX* w, int rows, int cols, const Fp8Segments& seg,
                                           Fp8Buf* scratch, bool want_q, bool want_qt, cudaStream_t stream) {
    int slot = fp8_slot(f, layer, lin, FP8_OP_W);
    if (const Fp8Buf* g = fp8_given_operand(f, w, rows, cols, want_qt, stream)) return *g;
    if (!f->wcache) {
        if (lin >= FP8_LIN_W1) {   // (held for a layer's exchange chunks: fp8_hold_expert_weights, parallel/expert_parallel_fp8.cuh)
            const auto& h = f->held[lin - FP8_LIN_W1];
            if (h.src == w && h.layer == layer) {   // (quantising into the scratch now would overwrite held codes)
                ENSURE((h.q || !want_q) && (h.qt || !want_qt), "layer %d: FP8 weight %d is held without the codes a GEMM wants", layer, lin);
                return lin == FP8_LIN_W1 ? f->w : lin == FP8_LIN_V1 ? f->w2 : f->w3;
            }
        }
        ENSURE(scratch->q, "internal error: layer %d: FP8 weight %s was not gathered as codes, and the model has no scratch to quantise "
               "it into (--fp8-gather)", layer, f->names[slot].c_str());
        fp8_quantize_operand(f, slot, true, w, rows, cols, seg, scratch, want_q, want_qt, stream);
        return *scratch;
    }
    size_t i = (size_t)layer * FP8_NLIN + lin;
    if (f->wq_src[i] != w) {
        fp8_quantize_operand(f, slot, true, w, rows, cols, seg, &f->wq[i], true, true, stream);
        f->wq_src[i] = w;
    }
    return f->wq[i];
}

// ---------------------------------------------------------------------------------------------
// the linear layers of attention: the FP8 twins of matmul_forward_gpu / matmul_backward_gpu

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
template <typename TO>
static inline void fp8_matmul_forward_gpu(Fp8GPU* f, int layer, int lin, TO* out, const floatX* inp, const floatX* weight,
                                          int N, int C, int OC, cudaStream_t stream = 0) {
    int sx = fp8_slot(f, layer, lin, FP8_OP_X), sw = fp8_slot(f, layer, lin, FP8_OP_W);
    fp8_quantize_operand(f, sx, false, inp, N, C, fp8_uniform_segments(1, N), &f->act, true, false, stream);
    const Fp8Buf& wb = fp8_weight_gpu(f, layer, lin, weight, OC, C, fp8_uniform_segments(1, OC), &f->w, true, false, stream);
    gemm_fp8_gpu(N, OC, C, 1.0f, fp8_operand_of(f, sx, f->act, false, false, 0, C, 0), fp8_operand_of(f, sw, wb, true, false, 0, C, 0),
                 0.0f, out, OC, 1, stream);
}

// dinp (N, C) = dinp_beta * dinp + dout (N, OC) @ weight (OC, C);  dweight (OC, C) += dout^T @ inp
template <typename TI>
static inline void fp8_matmul_backward_gpu(Fp8GPU* f, int layer, int lin, TI* dinp, float* dweight, const floatX* dout,
                                           const floatX* inp, const floatX* weight, int N, int C, int OC, float dinp_beta,
                                           cudaStream_t stream = 0, float wbeta = 1.0f) {
    int sx = fp8_slot(f, layer, lin, FP8_OP_X), sw = fp8_slot(f, layer, lin, FP8_OP_W), sg = fp8_slot(f, layer, lin, FP8_OP_DY);
    fp8_quantize_operand(f, sg, false, dout, N, OC, fp8_uniform_segments(1, N), &f->grad, true, true, stream);
    const Fp8Buf& wb = fp8_weight_gpu(f, layer, lin, weight, OC, C, fp8_uniform_segments(1, OC), &f->w, false, true, stream);
    // dgrad reduces over OC: dout row-wise, the weight transposed (C, OC)
    gemm_fp8_gpu(N, C, OC, 1.0f, fp8_operand_of(f, sg, f->grad, false, false, 0, OC, 0), fp8_operand_of(f, sw, wb, true, true, 0, OC, 0),
                 dinp_beta, dinp, C, 0, stream);
    // wgrad reduces over the N tokens: both transposed, dout^T (OC, N) and inp^T (C, N)
    fp8_quantize_operand(f, sx, false, inp, N, C, fp8_uniform_segments(1, N), &f->act, false, true, stream);
    gemm_fp8_gpu(OC, C, N, 1.0f, fp8_operand_of(f, sg, f->grad, false, true, 0, N, 0), fp8_operand_of(f, sx, f->act, false, true, 0, N, 0),
                 wbeta, dweight, C, 0, stream);   // (wbeta 0: the step's first backward overwrites, dbrx_grads_overwrite)
}

#include "fp8_experts_cuda.cuh"   // the experts on the padded layout: the FP8 twins of experts_forward_gpu / _backward_gpu

#include "fp8_step_cuda.cuh"   // the end of a step: amaxes to the host, the histories, the next scales
