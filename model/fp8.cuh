/*
 * fp8.cuh — FP8 numerics: the E4M3 / E5M2 formats, quantisation with per-tensor or per-tile scales,
 * and the scaling recipes (delayed, current, block), as the CPU reference.
 *
 * A tensor x is stored in FP8 as q = cvt(x * s) with a scale s chosen so that the largest |x| maps
 * near the format's maximum; a GEMM on FP8 operands multiplies by the dequantisation factors 1/s.
 * On the CPU we emulate exactly that: fake-quantise (x -> cvt(x * s) / s) the operands, then run the
 * ordinary FP32 GEMM — the same values an FP8 GEMM with FP32 accumulation sees.
 *   E4M3 (weights, activations): 4 exponent bits, 3 mantissa, bias 7, max 448, no infinities
 *   E5M2 (gradients):            5 exponent bits, 2 mantissa, bias 15, max 57344
 * Conversions round to nearest even and saturate to +-max (CUDA's __NV_SATFINITE); NaN -> 0x7F. They
 * are bit-exact with cuda_fp8.h's __nv_cvt_float_to_fp8 (test/test_fp8.cpp checks every BF16 input).
 * Recipes (--fp8):
 *   delayed  scale = max / (max of the amax history) / 2^margin; this step's amax joins the history
 *            after the step (TransformerEngine's delayed scaling; E4M3 forward, E5M2 gradients)
 *   current  scale = max / amax(x of this step) / 2^margin
 *   block    one scale per 1x128 tile of activations / gradients (along the GEMM's reduction
 *            dimension) and per 128x128 block of weights, from that tile's own amax
 * The CUDA side (below, under the kernels' guard): the quantisation kernel that casts BF16 tensors to
 * FP8 with these scales, writing the transposed copy Hopper's TN-only FP8 GEMMs need; the model's
 * use of it is model/dbrx_fp8_cuda.cuh.
 */
#pragma once
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include "common.h"
#include "matmul.cuh"

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } Fp8Format;
typedef enum { FP8_OFF = 0, FP8_DELAYED, FP8_CURRENT, FP8_BLOCK } Fp8Recipe;

static inline float fp8_max(Fp8Format f) { return f == FP8_E4M3 ? 448.0f : 57344.0f; }

// float -> FP8 bits, round to nearest even, saturating
static inline uint8_t fp8_from_float(float x, Fp8Format f) {
    const int M = f == FP8_E4M3 ? 3 : 2, bias = f == FP8_E4M3 ? 7 : 15;
    const uint8_t max_code = f == FP8_E4M3 ? 0x7E : 0x7B;
    if (std::isnan(x)) return 0x7F;
    uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    float a = std::fabs(x);
    if (a >= fp8_max(f)) return sign | max_code;
    if (a == 0.0f) return sign;
    int e;
    std::frexp(a, &e);                   // a = frac * 2^e, frac in [0.5, 1): unbiased exponent e - 1
    int E = e - 1 < 1 - bias ? 1 - bias : e - 1;   // below the normal range: subnormal spacing
    float ulp = std::ldexp(1.0f, E - M);
    int q = (int)std::nearbyint(a / ulp);           // exact scaling; nearbyint rounds half to even
    if (q == (2 << M)) { q = 1 << M; E += 1; }      // rounding carried into the next binade
    if (q < (1 << M)) return sign | (uint8_t)q;     // subnormal: exponent field 0
    return sign | (uint8_t)(((E + bias) << M) | (q - (1 << M)));
}

// FP8 bits -> float
static inline float fp8_to_float(uint8_t v, Fp8Format f) {
    const int M = f == FP8_E4M3 ? 3 : 2, bias = f == FP8_E4M3 ? 7 : 15, emax = f == FP8_E4M3 ? 15 : 31;
    int exp = (v & 0x7F) >> M, mant = v & ((1 << M) - 1);
    float sign = (v & 0x80) ? -1.0f : 1.0f;
    if (f == FP8_E4M3 && exp == emax && mant == (1 << M) - 1) return NAN;
    if (f == FP8_E5M2 && exp == emax) return mant == 0 ? sign * INFINITY : NAN;
    if (exp == 0) return sign * std::ldexp((float)mant, 1 - bias - M);
    return sign * std::ldexp((float)((1 << M) | mant), exp - bias - M);
}

// The FP8 value nearest to y (round to nearest even, saturating): fp8_to_float(fp8_from_float(y)),
// computed with float arithmetic for speed — the fake quantisation runs on every GEMM operand.
//   normal range: round the float's mantissa to M bits in place (a carry moves into the exponent);
//   subnormal range: adding and subtracting C = 1.5 * 2^(23 + e_ulp) rounds to a multiple of 2^e_ulp.
static inline float fp8_round(float y, Fp8Format f) {
    const int M = f == FP8_E4M3 ? 3 : 2, bias = f == FP8_E4M3 ? 7 : 15;
    const float mx = fp8_max(f), min_normal = std::ldexp(1.0f, 1 - bias);
    float a = std::fabs(y);
    if (!(a < mx)) return std::isnan(y) ? y : std::copysign(mx, y);
    if (a < min_normal) {
        const float C = std::ldexp(1.5f, 23 + 1 - bias - M);
        return (y + C) - C;
    }
    uint32_t u;
    memcpy(&u, &y, 4);
    const int drop = 23 - M;
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1);
    u &= ~((1u << drop) - 1);
    float r;
    memcpy(&r, &u, 4);
    return r;
}

// the scale that maps `amax` to the format's maximum, backed off by 2^margin; 1 for an all-zero
// (or non-finite) tensor, so that nothing is divided by zero. A tiny amax (below max / FLT_MAX: 1.3e-36
// for E4M3, 1.7e-34 for E5M2, e.g. one small gradient in a tile of zero padding rows) would give an
// infinite scale: then 0 * s = NaN in the codes and 1 / s = 0 in the factors, a NaN in the GEMM. Such a
// scale is capped at FP8_SCALE_CAP = 2^126 instead (its factor 2^-126 exact and normal; amax * 2^126 <
// 2^7 for E4M3, < 2^14 for E5M2: no value saturates). test/test_fp8.cpp checks it.
#define FP8_SCALE_CAP 8.50705917302346159e37f   // 2^126
static inline float fp8_scale_for(float amax, Fp8Format f, int margin) {
    if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
    float s = fp8_max(f) / amax;
    return std::ldexp(std::isinf(s) ? FP8_SCALE_CAP : s, -margin);
}

// A value x * s saturates when the cast clips it: it lies beyond the rounding range of the largest
// finite value (E4M3: above 464, half-way to the next code, which would be NaN; ties go to 448;
// E5M2: 61440 and above, which round to infinity). x * s = max itself, which current and block
// scaling produce for the amax element (up to a float rounding), is not a saturation.
static inline bool fp8_saturates(float xs, Fp8Format f) {
    float a = std::fabs(xs);
    return f == FP8_E4M3 ? a > 464.0f : a >= 61440.0f;
}

// out = dequantize(quantize(in * scale)) for a (rows, cols) sub-matrix with leading dimension ld;
// returns how many values saturated (fp8_saturates)
static inline long long fp8_fake_quant(real* out, const real* in, int rows, int cols, int ld, float scale, Fp8Format f) {
    long long saturated = 0;
    float inv = 1.0f / scale;
    #pragma omp parallel for reduction(+ : saturated) if (rows >= 64)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float x = (float)in[(size_t)r * ld + c] * scale;
            saturated += fp8_saturates(x, f);
            out[(size_t)r * ld + c] = (real)(fp8_round(x, f) * inv);
        }
    return saturated;
}

static inline float amax_of(const real* in, int rows, int cols, int ld) {
    float amax = 0.0f;
    #pragma omp parallel for reduction(max : amax) if (rows >= 64)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) amax = std::fmax(amax, std::fabs((float)in[(size_t)r * ld + c]));
    return amax;
}

// Block scaling: every (tile_rows, tile_cols) tile of the (rows, cols) matrix gets the scale of its
// own amax. Tiles: 1x128 (activations, gradients along the reduction dimension), 128x1 (the same
// tensors when the reduction runs over rows, as in wgrad), 128x128 (weights).
static inline long long fp8_fake_quant_tiles(real* out, const real* in, int rows, int cols, int ld, int tile_rows,
                                             int tile_cols, Fp8Format f) {
    long long saturated = 0;
    int nr = (rows + tile_rows - 1) / tile_rows, nc = (cols + tile_cols - 1) / tile_cols;
    #pragma omp parallel for collapse(2) reduction(+ : saturated)
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) {
            int r0 = i * tile_rows, c0 = j * tile_cols;
            int h = rows - r0 < tile_rows ? rows - r0 : tile_rows, w = cols - c0 < tile_cols ? cols - c0 : tile_cols;
            const real* src = in + (size_t)r0 * ld + c0;
            float s = fp8_scale_for(amax_of(src, h, w, ld), f, 0);
            saturated += fp8_fake_quant(out + (size_t)r0 * ld + c0, src, h, w, ld, s, f);
        }
    return saturated;
}

// ---------------------------------------------------------------------------------------------
// per-tensor scaling state of one GEMM operand

#define FP8_MAX_HISTORY 1024

typedef struct {
    Fp8Recipe recipe;
    int history_len;   // delayed: amax history window (--fp8-amax-history)
    int margin;        // scale backed off by 2^margin (--fp8-margin)
    int weights_quantized;   // the block weights arrive fake-quantised, their amax recorded: ZeRO-3's FP8
                             // all-gather (--fp8-gather, the FP8 gather under parallel/) quantised the shards before sending
} Fp8Config;

typedef struct {
    float scale;          // the scale used by this step (delayed: decided before the step)
    float amax;           // amax seen this step (max over the micro-batches)
    float history[FP8_MAX_HISTORY];
    int filled;           // history entries in use (the window is history[0 .. filled))
    long long saturated;  // values that saturated this step
} Fp8Meta;

static inline void fp8_meta_init(Fp8Meta* m) {
    memset(m, 0, sizeof(*m));
    m->scale = 1.0f;
}

// the scale for this step's quantisation of x (rows, cols, ld) under per-tensor recipes
static inline float fp8_meta_scale(Fp8Meta* m, const Fp8Config* c, Fp8Format f, float amax_now) {
    m->amax = std::fmax(m->amax, amax_now);
    if (c->recipe == FP8_CURRENT) return fp8_scale_for(amax_now, f, c->margin);
    return m->scale;   // delayed: fixed for the whole step
}

// end of step (delayed): roll this step's amax into the history (newest at the end) and derive the
// scale of the next step from the history's maximum. `amax` must already be reduced across the
// ranks that share the tensor. The very first step has no history: it uses the step's own amax.
static inline void fp8_meta_step(Fp8Meta* m, const Fp8Config* c, Fp8Format f) {
    if (c->recipe != FP8_DELAYED) { m->amax = 0; m->saturated = 0; return; }
    if (m->filled == c->history_len) {
        memmove(m->history, m->history + 1, (c->history_len - 1) * sizeof(float));
        m->filled--;
    }
    m->history[m->filled++] = m->amax;
    float hmax = 0;
    for (int i = 0; i < m->filled; i++) hmax = std::fmax(hmax, m->history[i]);
    m->scale = fp8_scale_for(hmax, f, c->margin);
    m->amax = 0;
    m->saturated = 0;
}

static inline Fp8Recipe fp8_recipe_parse(const char* s) {
    if (!strcmp(s, "off")) return FP8_OFF;
    if (!strcmp(s, "delayed")) return FP8_DELAYED;
    if (!strcmp(s, "current")) return FP8_CURRENT;
    if (!strcmp(s, "block")) return FP8_BLOCK;
    fail(EXIT_BAD_INPUT, "--fp8 '%s' must be off, delayed, current or block", s);
}

// ---------------------------------------------------------------------------------------------
// a linear layer's three operands under FP8: x (E4M3), w (E4M3) and the output gradient dy (E5M2)

typedef struct { Fp8Meta x, w, dy; } Fp8Linear;

// Fake-quantises operand `in` (rows, cols, ld) into `out`. For block scaling, tile_rows x tile_cols
// are the tile; per-tensor recipes ignore them. With delayed scaling the very first step has no
// history yet, so it quantises with the current amax (and records it).
static inline void fp8_operand(real* out, const real* in, int rows, int cols, int ld, Fp8Meta* m, const Fp8Config* c,
                               Fp8Format f, int tile_rows, int tile_cols) {
    if (c->recipe == FP8_BLOCK) {
        m->amax = std::fmax(m->amax, amax_of(in, rows, cols, ld));
        m->saturated += fp8_fake_quant_tiles(out, in, rows, cols, ld, tile_rows, tile_cols, f);
        return;
    }
    float amax = amax_of(in, rows, cols, ld);
    float s = fp8_meta_scale(m, c, f, amax);
    if (c->recipe == FP8_DELAYED && m->filled == 0) s = fp8_scale_for(amax, f, c->margin);
    m->saturated += fp8_fake_quant(out, in, rows, cols, ld, s, f);
}

// An operand stacked by expert: segment e is rows seg[e] .. seg[e+1]-1 (tokens grouped by expert,
// or expert e's F rows of w1/v1/w2). Block scaling tiles each segment on its own, so that no tile
// straddles two experts; per-tensor recipes scale the whole stack with one scale.
static inline void fp8_operand_grouped(real* out, const real* in, const int* seg, int E, int cols, Fp8Meta* m,
                                       const Fp8Config* c, Fp8Format f, int tile_rows, int tile_cols) {
    if (c->recipe != FP8_BLOCK) {
        fp8_operand(out + (size_t)seg[0] * cols, in + (size_t)seg[0] * cols, seg[E] - seg[0], cols, cols, m, c, f,
                    tile_rows, tile_cols);
        return;
    }
    for (int e = 0; e < E; e++)
        fp8_operand(out + (size_t)seg[e] * cols, in + (size_t)seg[e] * cols, seg[e + 1] - seg[e], cols, cols, m, c, f,
                    tile_rows, tile_cols);
}

// A block weight (rows seg[0] .. seg[E]-1, experts stacked) as its GEMMs read it: fake-quantised
// into `qw` in 128x128 blocks per expert (block recipe) or with the tensor's scale — or, when the
// weights arrived already quantised (cfg->weights_quantized: ZeRO-3's FP8 all-gather quantised each
// shard with these very scales and recorded the amax), the weight itself: quantising it again would
// give the same values but the wrong amax.
static inline const real* fp8_weight_operand(real* qw, const real* w, const int* seg, int E, int cols, Fp8Meta* m,
                                             const Fp8Config* c) {
    if (c->weights_quantized) return w;
    fp8_operand_grouped(qw, w, seg, E, cols, m, c, FP8_E4M3, 128, 128);
    return qw;
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T on E4M3 operands: inp in 1x128 tiles and weight in
// 128x128 blocks along the reduction dimension C. qx (N, C), qw (OC, C) are scratch.
static inline void fp8_matmul_forward(real* out, const real* inp, const real* weight, int N, int C, int OC,
                                      Fp8Linear* st, const Fp8Config* cfg, real* qx, real* qw) {
    const int seg[2] = {0, OC};
    fp8_operand(qx, inp, N, C, C, &st->x, cfg, FP8_E4M3, 1, 128);
    matmul_forward(out, qx, fp8_weight_operand(qw, weight, seg, 1, C, &st->w, cfg), N, C, OC);
}

// dgrad dinp += dy @ weight reduces over OC: dy (E5M2) in 1x128 tiles; wgrad dweight += dy^T @ inp
// reduces over the N tokens, so block scaling re-tiles dy and inp along N (128x1).
// qx (N, C), qw (OC, C), qdy, qdy2 (N, OC) are scratch.
static inline void fp8_matmul_backward(real* dinp, real* dweight, const real* dout, const real* inp, const real* weight,
                                       int N, int C, int OC, Fp8Linear* st, const Fp8Config* cfg, real* qx, real* qw,
                                       real* qdy, real* qdy2) {
    const int seg[2] = {0, OC};
    fp8_operand(qdy, dout, N, OC, OC, &st->dy, cfg, FP8_E5M2, 1, 128);
    matmul_backward(dinp, NULL, qdy, NULL, fp8_weight_operand(qw, weight, seg, 1, C, &st->w, cfg), N, C, OC);
    const real* dy_wgrad = qdy;
    if (cfg->recipe == FP8_BLOCK) {
        fp8_operand(qdy2, dout, N, OC, OC, &st->dy, cfg, FP8_E5M2, 128, 1);
        dy_wgrad = qdy2;
    }
    fp8_operand(qx, inp, N, C, C, &st->x, cfg, FP8_E4M3, 128, 1);
    matmul_backward(NULL, dweight, dy_wgrad, qx, NULL, N, C, OC);
}

// the FP8 state of one block's five GEMMs (v1 reads the same quantised input as w1: its x is unused)
typedef struct { Fp8Linear qkv, proj, w1, v1, w2; } Fp8BlockState;

// THE TABLE OF FP8 OPERANDS, one for both backends (the CPU's Fp8BlockState, the GPU's slots in
// model/dbrx_fp8_cuda.cuh), the checkpoints' FP8 state and the logs: per layer, per linear (Wqkv,
// out_proj, w1, v1, w2), its input x and weight w (E4M3) and output gradient dy (E5M2), named
// "blocks.L.<linear>.<operand>". v1 reads w1's input, so "v1.x" is not an operand of its own.
enum { FP8_LIN_QKV = 0, FP8_LIN_PROJ, FP8_LIN_W1, FP8_LIN_V1, FP8_LIN_W2, FP8_NLIN };
enum { FP8_OP_X = 0, FP8_OP_W, FP8_OP_DY };
typedef struct { int layer, lin, op; std::string name; Fp8Format fmt; } Fp8Operand;
static inline std::vector<Fp8Operand> fp8_operand_table(int n_layers) {
    const char* lin[FP8_NLIN] = {"qkv", "proj", "w1", "v1", "w2"};
    const char* op[3] = {"x", "w", "dy"};
    std::vector<Fp8Operand> t;
    for (int l = 0; l < n_layers; l++)
        for (int i = 0; i < FP8_NLIN; i++)
            for (int o = 0; o < 3; o++) {
                if (i == FP8_LIN_V1 && o == FP8_OP_X) continue;
                t.push_back({l, i, o, "blocks." + std::to_string(l) + "." + lin[i] + "." + op[o], o == FP8_OP_DY ? FP8_E5M2 : FP8_E4M3});
            }
    return t;
}
// the CPU's state of one operand of the table
static inline Fp8Meta* fp8_block_meta(Fp8BlockState* b, int lin, int op) {
    Fp8Linear* q[FP8_NLIN] = {&b->qkv, &b->proj, &b->w1, &b->v1, &b->w2};
    return op == FP8_OP_X ? &q[lin]->x : op == FP8_OP_W ? &q[lin]->w : &q[lin]->dy;
}

// ---------------------------------------------------------------------------------------------
// THE FP8 POLICY of one block on the CPU: the recipe and the block's operand states (st NULL: FP32).
// A GEMM of the block asks it for each operand it reads, by (linear, operand) of the table above, and
// gets the tensor itself (FP32) or its fake-quantised copy in the scratch it names: the call sites do
// not fork on the recipe, and the format is the table's (x, w: E4M3; dy: E5M2).
typedef struct { const Fp8Config* cfg; Fp8BlockState* st; } Fp8Policy;

static inline Fp8Format fp8_operand_format(int op) { return op == FP8_OP_DY ? FP8_E5M2 : FP8_E4M3; }

// An operand of the grouped GEMMs (rows grouped by expert: seg (E + 1), (seg[E], cols)) in tiles along
// the GEMM's reduction: 1 x 128 when it runs along the row (forward, dgrad), 128 x 1 over the tokens (wgrad)
static inline const real* fp8_policy_grouped(const Fp8Policy* p, int lin, int op, real* scratch, const real* in, const int* seg,
                                             int E, int cols, int tile_rows, int tile_cols) {
    if (!p->st) return in;
    fp8_operand_grouped(scratch, in, seg, E, cols, fp8_block_meta(p->st, lin, op), p->cfg, fp8_operand_format(op), tile_rows, tile_cols);
    return scratch;
}
// A gradient's wgrad copy: block scaling re-tiles it 128 x 1 (over the tokens) into `scratch`; the
// per-tensor recipes (and FP32) read its dgrad copy `dgrad` again
static inline const real* fp8_policy_grouped_wgrad(const Fp8Policy* p, int lin, real* scratch, const real* in, const real* dgrad,
                                                   const int* seg, int E, int cols) {
    if (!p->st || p->cfg->recipe != FP8_BLOCK) return dgrad;
    return fp8_policy_grouped(p, lin, FP8_OP_DY, scratch, in, seg, E, cols, 128, 1);
}
// A weight as its GEMMs read it (fp8_weight_operand: 128 x 128 blocks per expert, or as it arrived
// from ZeRO-3's FP8 gather)
static inline const real* fp8_policy_weight(const Fp8Policy* p, int lin, real* scratch, const real* w, const int* seg, int E, int cols) {
    if (!p->st) return w;
    return fp8_weight_operand(scratch, w, seg, E, cols, fp8_block_meta(p->st, lin, FP8_OP_W), p->cfg);
}

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: the quantisation kernel. One pass over a BF16 tensor x (rows, cols), row-major:
//   - amax: max |x| over the valid rows (block maxima, then one integer atomicMax on the float's
//     bits: max is exact and order-independent, so the result is deterministic);
//   - the FP8 codes q = cvt(x * s) (round to nearest even, saturating: __nv_cvt_float_to_fp8 with
//     __NV_SATFINITE, bit-exact with fp8_from_float above), row-wise (rows, cols) and/or the
//     transposed copy (cols, rows) that the GEMMs reducing over rows read (Hopper's FP8 GEMMs are
//     TN only: every operand must be contiguous along the reduction);
//   - the count of saturated values, fp8_saturates(x * s) (integer atomics);
//   - the dequantisation factors 1 / s the GEMMs take (layouts of model/matmul.cuh).
// Modes:
//   FP8Q_AMAX    amax only (the first pass of current scaling)
//   FP8Q_TENSOR  one scale s: from `scale`, or fp8_scale_for(*amax_in, margin) (current scaling)
//   FP8Q_ACT     block scaling of an activation / gradient: q in 1x128 tiles along cols (the
//                reduction of dgrad / forward), qt in 128x1 tiles along rows (wgrad's), each tile
//                scaled by its own amax (margin 0, as fp8_fake_quant_tiles)
//   FP8Q_WEIGHT  block scaling of a weight: 128x128 blocks, one scale for q and qt alike
// Rows come in segments (the experts of a stacked tensor): tiles never straddle two segments and
// start at each segment's first row, as the CPU's per-expert tiling does; the rows of a segment
// past its `valid` count are padding: read as 0, written as 0, outside the amax.
// One CUDA block per tile of <= 128 rows (within a segment) x 128 cols, staged in shared memory
// so that both copies are written from it.

typedef enum { FP8Q_AMAX = 0, FP8Q_TENSOR, FP8Q_ACT, FP8Q_WEIGHT } Fp8QuantMode;

// the rows of a tensor in segments: segment s is rows start[s] .. start[s+1]-1, of which the first
// valid[s] hold data. start == NULL: nseg segments of seg_len rows; valid == NULL: all valid.
typedef struct {
    const int* start;   // device (nseg + 1)
    const int* valid;   // device (nseg)
    int nseg, seg_len;
    int row_tiles;      // sum over the segments of ceil(len / 128): the grid's x (host)
} Fp8Segments;

static inline Fp8Segments fp8_uniform_segments(int nseg, int seg_len) {
    return {nullptr, nullptr, nseg, seg_len, nseg * ((seg_len + 127) / 128)};
}

// the outputs of one quantisation; any pointer may be NULL (not written)
typedef struct {
    __nv_fp8_storage_t* q;       // (rows, cols)
    __nv_fp8_storage_t* qt;      // (cols, rows)
    float* sinv;                 // FP8Q_TENSOR: one float, 1 / s; block modes: the factors of q's tiles
    float* sinv_t;               // block modes: the factors of qt's tiles
    unsigned int* amax;          // max |x| (as float bits), max-accumulated
    unsigned long long* saturated;   // accumulated
} Fp8QuantOut;

#if defined(SIMT_EMULATION)
// the emulator's work log (SIMT_WORKLOG) records these arguments of fp8_quantize_kernel for the byte formulas
// (dev/predict/kernel_cost.py): [start?, valid?, nseg, seg_len, row_tiles] and [q?, qt?, sinv?, sinv_t?, amax?, saturated?]
static inline std::string worklog_fields(const Fp8Segments& s) {
    return "[" + std::string(s.start ? "true," : "false,") + (s.valid ? "true," : "false,") + std::to_string(s.nseg) + "," +
           std::to_string(s.seg_len) + "," + std::to_string(s.row_tiles) + "]";
}
static inline std::string worklog_fields(const Fp8QuantOut& o) {
    std::string r = "[";
    for (const void* p : {(const void*)o.q, (const void*)o.qt, (const void*)o.sinv, (const void*)o.sinv_t, (const void*)o.amax, (const void*)o.saturated})
        r += std::string(r.size() > 1 ? "," : "") + (p ? "true" : "false");
    return r + "]";
}
#endif

// the number of dequantisation factors of q / qt in the block modes (per segment, the layouts of
// matmul.cuh: q's are the factors of an operand with `len` rows of k = cols, qt's of one with
// `cols` rows of k = len; VEC128 for activations, BLK128 for weights), given the segment lengths
static inline size_t fp8_block_scale_count(Fp8QuantMode mode, bool transposed, const std::vector<int>& seg_len, int cols) {
    size_t n = 0;
    for (int len : seg_len) {
        int outer = transposed ? cols : len, k = transposed ? len : cols;
        n += matmul_scale_count(mode == FP8Q_WEIGHT ? MATMUL_SCALE_BLK128 : MATMUL_SCALE_VEC128, outer, k);
    }
    return n;
}

__device__ __forceinline__ float fp8_max_dev(int fmt) { return fmt == FP8_E4M3 ? 448.0f : 57344.0f; }
// fp8_scale_for on the device: the same float operations, so the same scale as the host's
__device__ __forceinline__ float fp8_scale_for_dev(float amax, int fmt, int margin) {
    if (!(amax > 0.0f) || !(amax <= 3.40282347e38f)) return 1.0f;   // zero, NaN or infinite: 1, as on the host
    float s = fp8_max_dev(fmt) / amax;
    return ldexpf(s > 3.40282347e38f ? FP8_SCALE_CAP : s, -margin);   // an infinite scale capped, as on the host
}
// fp8_saturates on the device
__device__ __forceinline__ int fp8_saturates_dev(float v, int fmt) {
    float a = fabsf(v);
    return fmt == FP8_E4M3 ? a > 464.0f : a >= 61440.0f;
}
__device__ __forceinline__ __nv_fp8_storage_t fp8_cvt_dev(float v, int fmt) {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// row tile t of the segments (128 rows each, a segment's last tile short): its segment (seg.nseg: past the last), the
// segment's first row and length, the tiles of the segments before it, and (base_t) the scale offset of those
// segments' transposed factors, nct column tiles of them per 4 row tiles (weights: fp8_quantize_kernel)
__device__ inline int fp8_tile_segment(const Fp8Segments& seg, int t, int nct, int* seg0, int* len, int* tiles_before, long long* base_t) {
    int s = 0;
    for (s = 0; s < seg.nseg; s++) {
        *seg0 = seg.start ? seg.start[s] : s * seg.seg_len;
        *len = (seg.start ? seg.start[s + 1] : (s + 1) * seg.seg_len) - *seg0;
        int nt = (*len + 127) / 128;
        if (t < *tiles_before + nt) break;
        *tiles_before += nt;
        *base_t += (long long)nct * ((nt + 3) / 4 * 4);
    }
    return s;
}

// The dequantisation factors 1 / s of one activation tile (FP8Q_ACT: h rows x w columns at row tile lt of its segment,
// columns from c0) in the layouts the GEMMs read (model/matmul.cuh): q's per segment an operand of `len` rows of
// k = cols in 1x128 tiles, [kb * len + row], after the segments before it (cols-tiles x their rows); qt's `cols` rows
// of k = len, after the row tiles before it. row_s / col_s: the scales of the tile's rows / columns. (Shared by
// fp8_quantize_kernel and the fused producers of model/fp8_fused.cuh: the same factors, bit for bit.)
__device__ inline void fp8_act_factors_store(const Fp8QuantOut& out, const float* row_s, const float* col_s, int h, int w, int cols,
                                             int seg0, int len, int lt, int tiles_before, int c0, int tid, int nthreads) {
    const int nct = (cols + 127) / 128;
    if (out.sinv)
        for (int r = tid; r < h; r += nthreads)
            out.sinv[(size_t)nct * seg0 + matmul_scale_vec128_index(lt * 128 + r, c0, len)] = 1.0f / row_s[r];
    if (out.sinv_t)
        for (int c = tid; c < w; c += nthreads)
            out.sinv_t[(size_t)tiles_before * cols + matmul_scale_vec128_index(c0 + c, lt * 128, cols)] = 1.0f / col_s[c];
}

// The dequantisation factor inv = 1 / s of one 128 x 128 weight block (FP8Q_WEIGHT: row tile lt of its segment, columns
// from c0) in both layouts: q's blocks are (row tile, col tile), after the row tiles before it; qt's the transpose,
// from base_t (fp8_tile_segment). (Shared by fp8_quantize_kernel and the 16-byte kernels of model/fp8_fused.cuh.)
__device__ inline void fp8_weight_factors_store(const Fp8QuantOut& out, float inv, int cols, int len, int lt, int tiles_before,
                                                long long base_t, int c0) {
    const int kb_pad = ((cols + 127) / 128 + 3) / 4 * 4;
    if (out.sinv) out.sinv[(size_t)tiles_before * kb_pad + matmul_scale_blk128_index(lt * 128, c0, cols)] = inv;
    if (out.sinv_t) out.sinv_t[base_t + matmul_scale_blk128_index(c0, lt * 128, len)] = inv;
}

#define FP8Q_THREADS 256
template <int MODE>
__global__ void __launch_bounds__(FP8Q_THREADS) fp8_quantize_kernel(const floatX* __restrict__ x, int rows, int cols,
                                                                     Fp8Segments seg, int fmt, const float* scale,
                                                                     const unsigned int* amax_in, int margin, Fp8QuantOut out) {
    __shared__ floatX tile[128][130];
    __shared__ float row_s[128], col_s[128];   // scales of the tile's rows (q) and columns (qt)
    __shared__ float scratch[32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = FP8Q_THREADS / 32;
    // the segment and the tile within it; base_t: the scale offset of the segment's qt factors (weights)
    int t = blockIdx.x, tiles_before = 0, seg0 = 0, len = 0;   // (row tiles on x: y stops at 65,535 tiles, 8.4 M rows)
    long long base_t = 0;
    const int nct = (cols + 127) / 128;
    const int s = fp8_tile_segment(seg, t, nct, &seg0, &len, &tiles_before, &base_t);
    if (s == seg.nseg) return;   // cannot happen with row_tiles from the same segments
    const int lt = t - tiles_before, row0 = seg0 + lt * 128, h = min(128, len - lt * 128);
    const int valid = seg.valid ? seg.valid[s] : len, vh = max(0, min(h, valid - lt * 128));
    const int c0 = blockIdx.y * 128, w = min(128, cols - c0);
    float s_tensor = 1.0f;
    if (MODE == FP8Q_TENSOR) s_tensor = amax_in ? fp8_scale_for_dev(__uint_as_float(*amax_in), fmt, margin) : *scale;

    // load the tile (padding rows as 0); the thread's amax
    float amax = 0.0f;
    for (int r = warp; r < h; r += nwarps)
        for (int c = lane; c < w; c += 32) {
            floatX v = r < vh ? x[(size_t)(row0 + r) * cols + c0 + c] : __float2bfloat16(0.0f);
            tile[r][c] = v;
            amax = fmaxf(amax, fabsf(__bfloat162float(v)));
        }
    amax = block_max(amax, scratch);   // (its barriers also publish the tile)
    if (tid == 0 && out.amax) atomicMax(out.amax, __float_as_uint(amax));
    if (MODE == FP8Q_AMAX) return;

    // the scales: of every row of q and every column of qt
    if (MODE == FP8Q_ACT) {
        for (int r = warp; r < h; r += nwarps) {
            float m = 0.0f;
            for (int c = lane; c < w; c += 32) m = fmaxf(m, fabsf(__bfloat162float(tile[r][c])));
            m = warp_max(m);
            if (lane == 0) row_s[r] = fp8_scale_for_dev(m, fmt, 0);
        }
        for (int c = warp; c < w; c += nwarps) {
            float m = 0.0f;
            for (int r = lane; r < h; r += 32) m = fmaxf(m, fabsf(__bfloat162float(tile[r][c])));
            m = warp_max(m);
            if (lane == 0) col_s[c] = fp8_scale_for_dev(m, fmt, 0);
        }
    } else {   // one scale for the tile (weights) or the tensor
        float sc = MODE == FP8Q_WEIGHT ? fp8_scale_for_dev(amax, fmt, 0) : s_tensor;
        for (int i = tid; i < 128; i += FP8Q_THREADS) { row_s[i] = sc; col_s[i] = sc; }
    }
    __syncthreads();

    // q, row-wise: a warp per row, coalesced along the columns
    int sat = 0;
    if (out.q)
        for (int r = warp; r < h; r += nwarps)
            for (int c = lane; c < w; c += 32) {
                float v = __bfloat162float(tile[r][c]) * row_s[r];
                sat += fp8_saturates_dev(v, fmt);
                out.q[(size_t)(row0 + r) * cols + c0 + c] = fp8_cvt_dev(v, fmt);
            }
    // qt (cols, rows): a warp per column, coalesced along the rows. Per-tensor and weight scales
    // give the same values as q: their saturations are counted once.
    if (out.qt)
        for (int c = warp; c < w; c += nwarps)
            for (int r = lane; r < h; r += 32) {
                float v = __bfloat162float(tile[r][c]) * col_s[c];
                if (MODE == FP8Q_ACT || !out.q) sat += fp8_saturates_dev(v, fmt);
                out.qt[(size_t)(c0 + c) * rows + row0 + r] = fp8_cvt_dev(v, fmt);
            }
    float sat_block = block_sum((float)sat, scratch);   // < 2^24 per block: exact
    if (tid == 0 && out.saturated && sat_block > 0) atomicAdd(out.saturated, (unsigned long long)sat_block);

    // the dequantisation factors, in the layouts the GEMMs read (model/matmul.cuh)
    if (MODE == FP8Q_TENSOR) {
        if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && out.sinv) out.sinv[0] = 1.0f / s_tensor;
    } else if (MODE == FP8Q_ACT) {
        fp8_act_factors_store(out, row_s, col_s, h, w, cols, seg0, len, lt, tiles_before, c0, tid, FP8Q_THREADS);
    } else if (tid == 0) {   // FP8Q_WEIGHT
        fp8_weight_factors_store(out, 1.0f / row_s[0], cols, len, lt, tiles_before, base_t, c0);
    }
}

// Launches one quantisation of x (rows, cols) [BF16] in `mode` (see above). Per tensor, the scale
// is *scale, or computed from *amax_in (current scaling: fp8_scale_for(amax, fmt, margin)). The step quantises with
// the fused kernels (model/fp8_fused.cuh: the same codes with 16-byte stores, on shapes of multiples of 16); this one,
// any shape, is what they are held to (test/test_fp8_cuda.cpp, test/test_zero_fp8_cuda.cpp) and dev/cuda/fp8_fused's v1.
static inline void fp8_quantize_gpu(const Fp8QuantOut& out, const floatX* x, int rows, int cols, const Fp8Segments& seg,
                                    Fp8Format fmt, Fp8QuantMode mode, const float* scale, const unsigned int* amax_in,
                                    int margin, cudaStream_t stream = 0) {
    if (rows == 0 || cols == 0 || seg.row_tiles == 0) return;
    dim3 grid(seg.row_tiles, ceil_div(cols, 128));   // the row tiles on x (2^31 - 1), the column tiles on y
    switch (mode) {
    case FP8Q_AMAX: LAUNCH(fp8_quantize_kernel<FP8Q_AMAX>, grid, FP8Q_THREADS, 0, stream, x, rows, cols, seg, (int)fmt, scale, amax_in, margin, out); break;
    case FP8Q_TENSOR: LAUNCH(fp8_quantize_kernel<FP8Q_TENSOR>, grid, FP8Q_THREADS, 0, stream, x, rows, cols, seg, (int)fmt, scale, amax_in, margin, out); break;
    case FP8Q_ACT: LAUNCH(fp8_quantize_kernel<FP8Q_ACT>, grid, FP8Q_THREADS, 0, stream, x, rows, cols, seg, (int)fmt, scale, amax_in, margin, out); break;
    case FP8Q_WEIGHT: LAUNCH(fp8_quantize_kernel<FP8Q_WEIGHT>, grid, FP8Q_THREADS, 0, stream, x, rows, cols, seg, (int)fmt, scale, amax_in, margin, out); break;
    }
}
// ---------------------------------------------------------------------------------------------
// CUDA: the transposed copy of FP8 codes. Hopper's FP8 GEMMs are TN only, so dgrad reads a weight W (rows, cols) as W^T
// (cols, rows), contiguous along the rows. A weight that arrived as codes (--fp8-gather: the device store, parallel/)
// gets it from its codes, byte for byte what fp8_quantize_gpu writes as qt (one scale per 128x128 block or per tensor:
// a code transposes to the same code), its block factors re-indexed to qt's layout.

// qt (cols, rows) = q (rows, cols)^T, FP8 codes: one CUDA block per 64x64 tile, read along q's rows
// into shared memory and written along qt's rows. Any shape, one byte per access (fp8_transpose16_kernel: 16)
#define FP8T_TILE 64
#define FP8T_THREADS 256
__global__ void __launch_bounds__(FP8T_THREADS) fp8_transpose_kernel(__nv_fp8_storage_t* __restrict__ qt,
                                                                      const __nv_fp8_storage_t* __restrict__ q, int rows, int cols) {
    __shared__ __nv_fp8_storage_t tile[FP8T_TILE][FP8T_TILE + 1];
    const int r0 = blockIdx.y * FP8T_TILE, c0 = blockIdx.x * FP8T_TILE;
    const int h = min(FP8T_TILE, rows - r0), w = min(FP8T_TILE, cols - c0);
    for (int i = threadIdx.x; i < FP8T_TILE * FP8T_TILE; i += FP8T_THREADS) {
        int r = i / FP8T_TILE, c = i % FP8T_TILE;
        if (r < h && c < w) tile[r][c] = q[(size_t)(r0 + r) * cols + c0 + c];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < FP8T_TILE * FP8T_TILE; i += FP8T_THREADS) {
        int c = i / FP8T_TILE, r = i % FP8T_TILE;
        if (r < h && c < w) qt[(size_t)(c0 + c) * rows + r0 + r] = tile[r][c];
    }
}

// The same with 16-byte accesses, rows and cols multiples of 16, q and qt 16-byte aligned (fp8_gpu_setup's shapes): the
// 64x64 tile is 256 loads of 16 codes along q's rows, one a thread, and 256 stores of 16 codes along qt's rows, each
// a column of 16 codes of the tile in shared memory
__global__ void __launch_bounds__(FP8T_THREADS) fp8_transpose16_kernel(__nv_fp8_storage_t* __restrict__ qt,
                                                                        const __nv_fp8_storage_t* __restrict__ q, int rows, int cols) {
    __shared__ __nv_fp8_storage_t tile[FP8T_TILE][FP8T_TILE + 1];
    const int r0 = blockIdx.y * FP8T_TILE, c0 = blockIdx.x * FP8T_TILE;
    const int h = min(FP8T_TILE, rows - r0), w = min(FP8T_TILE, cols - c0);   // (multiples of 16)
    const int a = threadIdx.x / 4, b = threadIdx.x % 4 * 16;   // a row of the tile and 16 of its columns; below, a column and 16 rows
    if (a < h && b < w) {
        uint4 v = *(const uint4*)(q + (size_t)(r0 + a) * cols + c0 + b);
        const __nv_fp8_storage_t* x = (const __nv_fp8_storage_t*)&v;
        for (int i = 0; i < 16; i++) tile[a][b + i] = x[i];
    }
    __syncthreads();
    if (a < w && b < h) {
        uint4 v;
        __nv_fp8_storage_t* x = (__nv_fp8_storage_t*)&v;
        for (int i = 0; i < 16; i++) x[i] = tile[b + i][a];
        *(uint4*)(qt + (size_t)(c0 + a) * rows + r0 + b) = v;
    }
}

// qt's BLK128 factors from q's, segments of seg_rows rows: per segment, qt's operand has `cols` rows
// of k = seg_rows, and its block (cb, rb) is q's block (rb, cb) (fp8_quantize_gpu's `sinv_t`)
__global__ void fp8_transpose_factors_kernel(float* sinv_t, const float* sinv, int nseg, int seg_rows, int cols) {
    const int row_blocks = (seg_rows + 127) / 128, col_blocks = (cols + 127) / 128;
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= nseg * row_blocks * col_blocks) return;
    int e = g / (row_blocks * col_blocks), rb = g / col_blocks % row_blocks, cb = g % col_blocks;
    size_t off = (size_t)e * row_blocks * ((col_blocks + 3) / 4 * 4), off_t = (size_t)e * col_blocks * ((row_blocks + 3) / 4 * 4);
    sinv_t[off_t + matmul_scale_blk128_index(cb * 128, rb * 128, seg_rows)] = sinv[off + matmul_scale_blk128_index(rb * 128, cb * 128, cols)];
}

// dgrad's operand W^T from the gathered row-wise codes q (rows, cols), experts of seg_rows rows
// stacked: qt (cols, rows) — the whole stack transposed, so expert e's W_e^T is columns e * seg_rows ..
// of qt with ld = rows, exactly the model's transposed weight operand (fp8_operand_of(..., transposed,
// e * F, ld E F, fp8_scale_offset(..., true, true))), which fp8_quantize_gpu writes as `qt`. Block
// scaling: sinv_t (q's factors sinv re-indexed, its `sinv_t` layout; padding not written); per tensor
// pass sinv = sinv_t = NULL: the transposed copy has the same one factor.
static inline void fp8_transpose_gpu(__nv_fp8_storage_t* qt, float* sinv_t, const __nv_fp8_storage_t* q, const float* sinv, int rows,
                                     int cols, int seg_rows, cudaStream_t stream = 0) {
    if (rows == 0 || cols == 0) return;
    ENSURE(seg_rows > 0 && rows % seg_rows == 0, "fp8_transpose_gpu: %d rows are not segments of %d", rows, seg_rows);
    ENSURE(ceil_div(rows, FP8T_TILE) <= 65535, "fp8_transpose_gpu: %d rows exceed the grid", rows);
    dim3 grid(ceil_div(cols, FP8T_TILE), ceil_div(rows, FP8T_TILE));
    if (rows % 16 == 0 && cols % 16 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)qt % 16 == 0)   // (every weight under --fp8)
        LAUNCH(fp8_transpose16_kernel, grid, FP8T_THREADS, 0, stream, qt, q, rows, cols);
    else
        LAUNCH(fp8_transpose_kernel, grid, FP8T_THREADS, 0, stream, qt, q, rows, cols);
    if (sinv && sinv_t) {
        int n = rows / seg_rows * ((seg_rows + 127) / 128) * ((cols + 127) / 128);
        LAUNCH(fp8_transpose_factors_kernel, ceil_div(n, 256), 256, 0, stream, sinv_t, sinv, rows / seg_rows, seg_rows, cols);
    }
}
#endif  // DBRX_HAVE_CUDA
