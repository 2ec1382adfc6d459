/*
 * recompute.h — selective activation recomputation (--recompute SPEC), shared by both backends: the
 * spec's syntax and parser, which layer recomputes what, which saved buffer each granularity drops,
 * and the FLOPs the recomputation adds (HFU).
 *
 * SPEC = ITEM[,ITEM...], ITEM = GRAN[:RANGE]
 *   GRAN   attn    the attention core: its output (atty) is recomputed from the saved qkv and lse
 *          swiglu  the experts' g, u, act: recomputed from the saved routed rows xe
 *          moe     the whole MoE half: only its input (resid_mid) and the routing decisions (top-k
 *                  indices and weights, probabilities, lse, the dispatch) are kept; LayerNorm 2, the
 *                  gather and the expert GEMMs run again (the router's GEMM and top-k do not)
 *          block   the whole block: only its input and the routing decisions are kept
 *   RANGE  all (the default) | firstN (layers 0..N-1) | M-K (layers M..K, inclusive) | everyN (layers
 *          0, N, 2N, ...) | L (the one layer L)
 * Items compose: a layer recomputes the union of what its items name (block > moe > swiglu; attn).
 * Recomputation re-runs the forward's own kernels on the saved inputs, with the routing decisions
 * reused, FP8 scales as saved (the amax and saturation bookkeeping frozen: Fp8Config::frozen) and the
 * statistics not counted again, so that losses and gradients are bit-identical to the run without it
 * (test/test_recompute.sh, on the CPU and the emulated GPU).
 */
#pragma once
#include <string>
#include <vector>
#include <stdlib.h>
#include <string.h>
#include "common.h"

// RC_CSWIGLU: not a recomputation but --compress-acts swiglu (model/act_compress.cuh): the layer keeps g and u
// compressed, its g, u and act point into the shared scratch like RC_SWIGLU's, and the backward rebuilds them.
// RC_CATTN: --compress-acts attn, the same for LayerNorm 1's output ln1 (the QKV GEMM's input, which only its
// weight gradient reads again). RC_LN1: not a mode bit but the field bit of ln1, dropped by block and by RC_CATTN.
// RC_XE: the GPU model's field bit of the routed rows xe, dropped by moe, and under expert parallelism by every
// layer (the dispatcher keeps the received rows its experts' weight gradients read: xe is not read after the forward)
enum { RC_ATTN = 1, RC_SWIGLU = 2, RC_MOE = 4, RC_BLOCK = 8, RC_CSWIGLU = 16, RC_CATTN = 32, RC_LN1 = 64, RC_XE = 128 };
// the --compress-acts granularities (its spec's items use the recompute bits: swiglu RC_SWIGLU, attn RC_ATTN)
enum { RC_COMPRESS_GRANS = RC_SWIGLU | RC_ATTN };
enum { RC_RANGE_ALL, RC_RANGE_FIRST, RC_RANGE_SPAN, RC_RANGE_EVERY };

typedef struct { int gran, kind, a, b; std::string text; } RecomputeItem;
typedef struct { std::vector<RecomputeItem> items; std::string text; } RecomputeSpec;

// the run's spec (set once at start-up by the flag parser; empty: nothing recomputed). Both models read
// it when they size their activations; a test sets it before building a model.
inline RecomputeSpec g_recompute;
// --compress-acts SPEC (the same syntax; granularities swiglu and attn) and --compress-format (0 e4m3, 1 bf16:
// CompressFormat, model/act_compress.cuh)
inline RecomputeSpec g_compress;
inline int g_compress_format = 0;

// parses SPEC (one line naming the bad part, exit 2); "" or "off": nothing
// (flag: the flag named in the errors; grans: the granularities it takes)
static inline RecomputeSpec recompute_parse(const std::string& spec, const char* flag = "--recompute", int grans = 15) {
    RecomputeSpec s;
    s.text = spec;
    if (spec.empty() || spec == "off") { s.text = ""; return s; }
    size_t pos = 0;
    while (pos <= spec.size()) {
        size_t comma = spec.find(',', pos);
        std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
        RecomputeItem it{0, RC_RANGE_ALL, 0, 0, item};
        size_t colon = item.find(':');
        std::string g = item.substr(0, colon), r = colon == std::string::npos ? "all" : item.substr(colon + 1);
        it.gran = g == "attn" ? RC_ATTN : g == "swiglu" ? RC_SWIGLU : g == "moe" ? RC_MOE : g == "block" ? RC_BLOCK : 0;
        if (!(it.gran & grans))
            fail(EXIT_BAD_INPUT, "%s '%s': granularity '%s' is not %s", flag, spec.c_str(), g.c_str(),
                 grans == 15 ? "attn, swiglu, moe or block" : "swiglu or attn");
        auto number = [&](const char* p, int* out) {
            char* end = NULL;
            long v = strtol(p, &end, 10);
            if (end == p || *end || v < 0 || v > 1000000) return false;
            *out = (int)v;
            return true;
        };
        bool ok;
        if (r == "all") ok = true;
        else if (!r.compare(0, 5, "first")) { it.kind = RC_RANGE_FIRST; ok = number(r.c_str() + 5, &it.a) && it.a > 0; }
        else if (!r.compare(0, 5, "every")) { it.kind = RC_RANGE_EVERY; ok = number(r.c_str() + 5, &it.a) && it.a > 0; }
        else if (r.find('-') != std::string::npos) {
            size_t dash = r.find('-');
            it.kind = RC_RANGE_SPAN;
            ok = number(r.substr(0, dash).c_str(), &it.a) && number(r.c_str() + dash + 1, &it.b) && it.a <= it.b;
        } else { it.kind = RC_RANGE_SPAN; ok = number(r.c_str(), &it.a); it.b = it.a; }
        if (!ok)
            fail(EXIT_BAD_INPUT, "%s '%s': range '%s' of '%s' is not all, firstN, M-K (M <= K), everyN or a layer number",
                 flag, spec.c_str(), r.c_str(), item.c_str());
        s.items.push_back(it);
    }
    return s;
}

// refuses a spec whose layers are not all in a model of L layers (one line naming the item, exit 2);
// --compress-acts' too, so that both are checked wherever the model is sized
static inline void recompute_check(const RecomputeSpec* s, int L, const char* flag = "--recompute") {
    for (const RecomputeItem& it : s->items) {
        int last = it.kind == RC_RANGE_FIRST ? it.a - 1 : it.kind == RC_RANGE_SPAN ? it.b : 0;
        if (last >= L)
            fail(EXIT_BAD_INPUT, "%s '%s': '%s' names layer %d, but the model has %d layers (0..%d)", flag, s->text.c_str(),
                 it.text.c_str(), last, L, L - 1);
    }
    if (s == &g_recompute) recompute_check(&g_compress, L, "--compress-acts");
}

static inline int recompute_items_mode(const RecomputeSpec* s, int l);
// what layer l of L recomputes: RC_* bits, normalised (block: every bit; moe: swiglu too); with the run's
// spec, RC_CSWIGLU (RC_CATTN) where --compress-acts names the layer and its SwiGLU (its ln1: block) is not
// recomputed anyway: a recomputed tensor is not compressed
static inline int recompute_mode(const RecomputeSpec* s, int l) {
    int mode = recompute_items_mode(s, l);
    if (s != &g_recompute || g_compress.items.empty()) return mode;
    int cm = recompute_items_mode(&g_compress, l);
    if (!(mode & RC_SWIGLU) && (cm & RC_SWIGLU)) mode |= RC_CSWIGLU;
    if (!(mode & RC_BLOCK) && (cm & RC_ATTN)) mode |= RC_CATTN;
    return mode;
}
// the field bits of the buffers a layer of this mode points into the shared scratch: RC_CSWIGLU drops g, u,
// act as RC_SWIGLU does; ln1 (RC_LN1) goes with block and RC_CATTN; xe (RC_XE) with moe (and RC_XE itself: the
// GPU model under expert parallelism passes mode | RC_XE)
static inline int recompute_dropped_bits(int mode) {
    return (mode & 15) | ((mode & RC_CSWIGLU) ? RC_SWIGLU : 0) | ((mode & (RC_BLOCK | RC_CATTN)) ? RC_LN1 : 0) |
           ((mode & (RC_MOE | RC_XE)) ? RC_XE : 0);
}
// where a layer of this mode keeps the buffer of field bit `bit` (RC_CSWIGLU, RC_CATTN: the codes that only
// compression keeps): 0 its own, 1 the shared scratch, 2 none
static inline int recompute_buffer_place(int mode, int bit) {
    if (bit == RC_CSWIGLU || bit == RC_CATTN) return (mode & bit) ? 0 : 2;
    return (recompute_dropped_bits(mode) & bit) ? 1 : 0;
}
// Whether the GPU model keeps the experts' act = silu(g) * u in BF16 (ffn_hidden: F). Under FP8 it does not where F
// is a multiple of 16: every layer's FP8 experts then take the fused path (model/fp8_fused.cuh: the padded layout's
// 16-row segments, 16-byte aligned g and u), whose forward quantises act for w2 without writing it and whose
// backward recomputes act's codes from g and u. Nothing else reads it (under FP8 --recompute swiglu and
// --compress-acts then rebuild g and u only). Its buffer is Rx F BF16 values a layer: a third of the experts'.
static inline bool gpu_act_kept(int ffn_hidden, bool fp8) { return !(fp8 && ffn_hidden % 16 == 0); }

static inline int recompute_items_mode(const RecomputeSpec* s, int l) {
    int mode = 0;
    for (const RecomputeItem& it : s->items) {
        bool in = it.kind == RC_RANGE_ALL || (it.kind == RC_RANGE_FIRST && l < it.a) ||
                  (it.kind == RC_RANGE_SPAN && l >= it.a && l <= it.b) || (it.kind == RC_RANGE_EVERY && l % it.a == 0);
        if (in) mode |= it.gran;
    }
    if (mode & RC_BLOCK) mode |= RC_MOE | RC_ATTN;
    if (mode & RC_MOE) mode |= RC_SWIGLU;
    return mode;
}
// the union of every layer's bits (which shared scratch buffers the recomputed layers need)
static inline int recompute_union(const RecomputeSpec* s, int L) {
    int u = 0;
    if (s->items.empty() && (s != &g_recompute || g_compress.items.empty())) return 0;   // (a model of 2^31 layers is not walked for nothing)
    for (int l = 0; l < L; l++) u |= recompute_mode(s, l);
    return u;
}

// The FLOPs per token that recomputation adds, counted as flops_per_token counts (matmuls, 2 per
// multiply-add; attention under the causal mask), averaged over the layers: the forward parts run
// again. attn: the attention core (QK^T and PV); swiglu: w1, v1 of k experts; moe: + w2 (the router's
// GEMM is not re-run: the routing is reused); block: + Wqkv, out_proj.
static inline double recompute_flops_per_token(const RecomputeSpec* s, int L, double d, double qd, double F, double k, double S,
                                               double attn_share = 1.0) {   // (--doc-mask: the share of the causal pairs computed)
    double total = 0;
    if (s->items.empty()) return 0;
    for (int l = 0; l < L; l++) {
        int mode = recompute_mode(s, l);
        if (mode & RC_ATTN) total += 2.0 * d * (S + 1) * attn_share;   // 2 (QK^T, PV) x 2 FLOPs x d x (S+1)/2 keys
        if (mode & RC_SWIGLU) total += 2.0 * k * 2 * d * F;
        if (mode & RC_MOE) total += 2.0 * k * d * F;
        if (mode & RC_BLOCK) total += 2.0 * (d * qd + d * d);
    }
    return total;
}
