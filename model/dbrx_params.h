/*
 * dbrx_params.h — the DBRX model's parameters, shared by both backends (model/dbrx.h, model/dbrx_cuda.cuh),
 * the parameter store (parallel/) and the checkpoints (checkpoint/): the table of tensors (Hugging Face
 * names, shapes, offsets in one flat buffer), the sharding units, the views of a unit's tensors into a
 * buffer, and the initialisation a rank can draw for any range of the flat buffer alone.
 */
#pragma once
#include <string>
#include <vector>
#include "common.h"
#include "config.h"

// ---------------------------------------------------------------------------------------------
// parameters: one flat buffer, laid out unit by unit so that a sharding unit is one contiguous range:
//   unit 0        wte
//   unit 1 + 2l   block l without its experts: norm_1, Wqkv, out_proj, norm_2, router
//   unit 2 + 2l   block l's experts: w1, v1, w2, each (E * F, d) with the experts stacked
//   unit 2L + 1   norm_f + lm_head
// The experts are a unit of their own so that a store can shard them along the expert dimension
// (parallel/zero.h) and expert parallelism can place them as whole experts.

typedef struct {
    char name[96];    // Hugging Face DbrxForCausalLM name
    size_t offset;    // into the parameter buffer, in elements
    size_t numel;
    int rows, cols;   // cols == 0 for a vector
    int unit;         // sharding unit
    int decay;        // 1: a matrix, gets weight decay; 0: a LayerNorm weight
} ParamInfo;

typedef struct { real *norm1, *wqkv, *wo, *norm2, *router, *w1, *v1, *w2; } BlockParams;
typedef struct { real* wte; std::vector<BlockParams> blocks; real* norm_f; real* lm_head; } ParamTensors;

// the sharding units of block l, of the final norm and head, and their count (2L + 2)
static inline int dbrx_block_unit(int l) { return 1 + 2 * l; }
static inline int dbrx_experts_unit(int l) { return 2 + 2 * l; }
static inline int dbrx_head_unit(const DbrxConfig* c) { return 2 * c->n_layers + 1; }
static inline int dbrx_num_units(const DbrxConfig* c) { return 2 * c->n_layers + 2; }
static inline bool dbrx_is_experts_unit(int unit, const DbrxConfig* c) { return unit >= 2 && unit <= 2 * c->n_layers && unit % 2 == 0; }
// the layer a unit belongs to (-1: the embedding, the head)
static inline int dbrx_unit_layer(int unit, const DbrxConfig* c) { return unit >= 1 && unit <= 2 * c->n_layers ? (unit - 1) / 2 : -1; }

// a unit in words, for messages: "embedding", "block 3", "block 3 experts", "norm_f + lm_head"
static inline std::string dbrx_unit_name(int unit, const DbrxConfig* c) {
    if (unit == 0) return "embedding";
    if (unit == dbrx_head_unit(c)) return "norm_f + lm_head";
    return "block " + std::to_string(dbrx_unit_layer(unit, c)) + (dbrx_is_experts_unit(unit, c) ? " experts" : "");
}

// the table of every parameter tensor, in buffer order
static inline std::vector<ParamInfo> dbrx_param_table(const DbrxConfig* c) {
    std::vector<ParamInfo> t;
    size_t off = 0;
    auto add = [&](const char* name, int rows, int cols, int unit, int decay) {
        ParamInfo p;
        snprintf(p.name, sizeof(p.name), "%s", name);
        p.offset = off; p.rows = rows; p.cols = cols; p.unit = unit; p.decay = decay;
        p.numel = (size_t)rows * (cols ? cols : 1);
        off += p.numel;
        t.push_back(p);
    };
    int d = c->d_model, EF = c->n_experts * c->ffn_hidden;
    char nm[96];
    // (the units, in the order above)
    add("transformer.wte.weight", c->vocab_size, d, 0, 1);
    for (int l = 0; l < c->n_layers; l++) {
        const char* pre = "transformer.blocks";
        snprintf(nm, sizeof nm, "%s.%d.norm_attn_norm.norm_1.weight", pre, l);      add(nm, d, 0, dbrx_block_unit(l), 0);
        snprintf(nm, sizeof nm, "%s.%d.norm_attn_norm.attn.Wqkv.weight", pre, l);  add(nm, qkv_dim(c), d, dbrx_block_unit(l), 1);
        snprintf(nm, sizeof nm, "%s.%d.norm_attn_norm.attn.out_proj.weight", pre, l); add(nm, d, d, dbrx_block_unit(l), 1);
        snprintf(nm, sizeof nm, "%s.%d.norm_attn_norm.norm_2.weight", pre, l);      add(nm, d, 0, dbrx_block_unit(l), 0);
        snprintf(nm, sizeof nm, "%s.%d.ffn.router.layer.weight", pre, l);          add(nm, c->n_experts, d, dbrx_block_unit(l), 1);
        snprintf(nm, sizeof nm, "%s.%d.ffn.experts.mlp.w1", pre, l);               add(nm, EF, d, dbrx_experts_unit(l), 1);
        snprintf(nm, sizeof nm, "%s.%d.ffn.experts.mlp.v1", pre, l);               add(nm, EF, d, dbrx_experts_unit(l), 1);
        snprintf(nm, sizeof nm, "%s.%d.ffn.experts.mlp.w2", pre, l);               add(nm, EF, d, dbrx_experts_unit(l), 1);
    }
    add("transformer.norm_f.weight", d, 0, dbrx_head_unit(c), 0);
    add("lm_head.weight", c->vocab_size, d, dbrx_head_unit(c), 1);
    return t;
}

// first table entry of each unit (8 tensors per block: 5 in its block unit, then 3 experts)
static inline size_t unit_first_entry(int unit, const DbrxConfig* c) {
    if (unit == 0) return 0;
    int l = dbrx_unit_layer(unit, c);
    if (l < 0) return 1 + 8 * (size_t)c->n_layers;
    return 1 + 8 * (size_t)l + (dbrx_is_experts_unit(unit, c) ? 5 : 0);
}

// Points the views of one sharding unit into `unit_base`, a buffer laid out as that unit's range of
// the flat buffer (a sharded run gathers a unit into a working buffer and points the views there).
static inline void unit_views(ParamTensors* p, real* unit_base, int unit, const DbrxConfig* c,
                              const std::vector<ParamInfo>& t, int ep_n = 1) {
    size_t i = unit_first_entry(unit, c), start = t[i].offset;
    auto at = [&](size_t j) { return unit_base + (t[j].offset - start); };
    if (unit == 0) { p->wte = at(i); return; }
    if (unit == dbrx_head_unit(c)) { p->norm_f = at(i); p->lm_head = at(i + 1); return; }
    BlockParams& b = p->blocks[dbrx_unit_layer(unit, c)];
    if (dbrx_is_experts_unit(unit, c) && ep_n > 1) {   // expert parallelism: this rank's E/n experts of each, back to back
        size_t local = (size_t)(c->n_experts / ep_n) * c->ffn_hidden * c->d_model;
        b.w1 = unit_base; b.v1 = unit_base + local; b.w2 = unit_base + 2 * local;
        return;
    }
    if (dbrx_is_experts_unit(unit, c)) { b.w1 = at(i); b.v1 = at(i + 1); b.w2 = at(i + 2); return; }
    b.norm1 = at(i); b.wqkv = at(i + 1); b.wo = at(i + 2); b.norm2 = at(i + 3); b.router = at(i + 4);
}

// pointer views of a flat buffer laid out by the table
static inline ParamTensors param_views(real* base, const DbrxConfig* c, const std::vector<ParamInfo>& t) {
    ParamTensors p;
    p.blocks.resize(c->n_layers);
    for (int u = 0; u < dbrx_num_units(c); u++) unit_views(&p, base + t[unit_first_entry(u, c)].offset, u, c, t);
    return p;
}

// Initialisation. --init hf (the default, HF DbrxForCausalLM's): every matrix normal(0, init_std). --init foundry (LLM
// Foundry's DBRX yamls' kaiming_normal, fan_in, relu gain, on MegaBlocks' experts; *unconfirmed for the released 132B run*,
// the reference says): every matrix normal(0, sqrt(2 / fan_in)). fan_in is d (every matrix here is stored (rows, d), and
// torch's kaiming on such a tensor takes d: the embedding, the head, Wqkv, out_proj, the router, each expert's w1 and v1)
// but F for each expert's w2 (Foundry flips its fan mode: MegaBlocks computes x w2); the residual outputs (out_proj, w2)
// are then divided by sqrt(2 n_layers) (Foundry's init_div_is_residual). LayerNorm weights 1 either way.
// Drawn in table order from one stream seeded by `seed`, so a seed fixes the model everywhere.
// Fills dst (hi - lo) with the elements [lo, hi) of the flat parameter buffer: splitmix64's state is a
// counter (two draws per matrix element), so a rank can initialise its shard alone.
inline int g_init_foundry = 0;   // --init foundry (1) or hf (0)
// the std of a matrix's normal init under the --init scheme
static inline double dbrx_init_std(const ParamInfo& t, const DbrxConfig* c) {
    if (!g_init_foundry) return c->init_std;
    bool w2 = strstr(t.name, "experts.mlp.w2"), residual = w2 || strstr(t.name, "attn.out_proj.weight");
    return std::sqrt(2.0 / (w2 ? c->ffn_hidden : t.cols)) / (residual ? std::sqrt(2.0 * c->n_layers) : 1.0);
}
static inline void dbrx_init_range(real* dst, size_t lo, size_t hi, const DbrxConfig* c,
                                   const std::vector<ParamInfo>& table, uint64_t seed) {
    uint64_t draws = 0;   // draws taken by the matrices before the current tensor
    for (const ParamInfo& t : table) {
        size_t a = t.offset > lo ? t.offset : lo, b = t.offset + t.numel < hi ? t.offset + t.numel : hi;
        if (a < b) {
            real* p = dst + (a - lo);
            if (t.cols == 0) for (size_t i = 0; i < b - a; i++) p[i] = 1;
            else {
                // element i of the tensor takes draws 2 i and 2 i + 1 of its splitmix64 stream, whose state is a
                // counter: a chunk seeded at its own first element continues the stream exactly, so the chunks run
                // in parallel and give the serial loop's bits (dbrx-1b's 1.02 B draws took ~50 s on one core)
                const size_t CH = (size_t)1 << 18, nch = (b - a + CH - 1) / CH;
                const float std = (float)dbrx_init_std(t, c);   // (hf: init_std itself, the same bits as before)
                #pragma omp parallel for schedule(static)
                for (size_t ch = 0; ch < nch; ch++) {
                    const size_t i0 = ch * CH, i1 = i0 + CH < b - a ? i0 + CH : b - a;
                    Rng rng = {seed + (draws + 2 * (a - t.offset + i0)) * 0x9E3779B97F4A7C15ull};
                    for (size_t i = i0; i < i1; i++) p[i] = (real)(std * rng_normal(&rng));
                }
            }
        }
        if (t.cols != 0) draws += 2 * t.numel;
    }
}
