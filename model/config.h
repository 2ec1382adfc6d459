/*
 * config.h — the DBRX model configuration: the presets, validation of a configuration,
 * parameter counts (total and active), and training FLOPs per token.
 */
#pragma once
#include <cstring>
#include <string>
#include "common.h"

typedef struct {
    int d_model;       // d
    int n_heads;       // H query heads
    int kv_heads;      // kv heads (GQA: each serves n_heads / kv_heads query heads)
    int head_dim;      // hd = d / H
    int n_layers;      // L
    int ffn_hidden;    // F, per expert
    int n_experts;     // E
    int top_k;         // k experts per token
    int vocab_size;    // V (padded)
    int max_seq_len;   // longest sequence the model is configured for
    float rope_theta;
    float clip_qkv;    // clamp of the fused qkv output to +-clip_qkv (> 0), or DBRX_OFF: no clamp (HF null)
    float moe_norm_p;  // moe_normalize_expert_weights: the top-k weights are divided by their p-norm (p >= 1;
                       // DBRX: 1, the L1 renormalisation), or DBRX_OFF: used as they are (HF null)
    float ln_eps;
    float moe_loss_weight;  // load-balancing loss weight (DBRX: 0.05)
    float z_loss_weight;    // router z-loss weight (DBRX: 0)
    float init_std;         // normal(0, init_std) for every matrix; LayerNorm weights 1
} DbrxConfig;

// "off" of the optional settings clip_qkv and moe_norm_p (Hugging Face's null). A negative sentinel, so
// that no legal value means off: an explicit 0 is refused (config_validate), where the original DBRX code
// would clamp q, k and v to +-0, or divide by torch.norm's p = 0 "norm" (the count of non-zero weights).
#define DBRX_OFF (-1.0f)
static inline bool dbrx_is_off(float v) { return v < 0.0f; }
// an optional setting for messages and the banner: "off" or the number
static inline std::string dbrx_setting_str(float v) {
    if (dbrx_is_off(v)) return "off";
    char b[32];
    snprintf(b, sizeof b, "%g", v);
    return b;
}

typedef struct { const char* name; DbrxConfig cfg; const char* about; } ModelPreset;

// DBRX-shaped: kv 8, 16 experts top-4, F = 1.75 d, vocab 100352, clip 8, theta 5e5 (shared reference).
static inline DbrxConfig dbrx_shape(int d, int heads, int layers, int seq) {
    DbrxConfig c;
    c.d_model = d; c.n_heads = heads; c.kv_heads = 8; c.head_dim = d / heads; c.n_layers = layers;
    c.ffn_hidden = d * 7 / 4; c.n_experts = 16; c.top_k = 4; c.vocab_size = 100352;
    c.max_seq_len = seq; c.rope_theta = 500000.0f; c.clip_qkv = 8.0f; c.moe_norm_p = 1.0f; c.ln_eps = 1e-5f;
    c.moe_loss_weight = 0.05f; c.z_loss_weight = 0.0f; c.init_std = 0.02f;
    return c;
}

static inline int model_presets(const ModelPreset** out) {
    static ModelPreset presets[8];
    static int n = 0;
    if (n == 0) {
        presets[n++] = {"dbrx-132b", dbrx_shape(6144, 48, 40, 32768), "the released DBRX (132B total, 36B active)"};
        presets[n++] = {"dbrx-73b", dbrx_shape(5120, 40, 32, 4096), "LLM Foundry dbrx-73b"};
        presets[n++] = {"dbrx-35b", dbrx_shape(4096, 32, 24, 4096), "LLM Foundry dbrx-35b"};
        presets[n++] = {"dbrx-18b", dbrx_shape(3072, 24, 22, 4096), "LLM Foundry dbrx-18b"};
        presets[n++] = {"dbrx-9b", dbrx_shape(2048, 16, 24, 4096), "LLM Foundry dbrx-9b"};
        // one GPU: ~1.0B total, fits with optimizer state in 80 GB; head_dim 128 as in DBRX
        DbrxConfig g = dbrx_shape(1024, 8, 9, 2048);
        g.kv_heads = 2;
        presets[n++] = {"dbrx-1b", g, "one-GPU preset (~1.0B total, ~0.4B active)"};
        // two CPU cores, about a minute: byte-level vocabulary (256 bytes + end-of-text, padded to 384)
        DbrxConfig t = dbrx_shape(128, 4, 4, 256);
        t.kv_heads = 2; t.ffn_hidden = 224; t.vocab_size = 384; t.rope_theta = 10000.0f;
        presets[n++] = {"dbrx-tiny", t, "CPU preset: d 128, 4 layers, 16 experts top-4, GQA 4:2, byte vocab"};
    }
    *out = presets;
    return n;
}

// returns 1 and fills *cfg if `name` is a preset
static inline int model_preset_lookup(const char* name, DbrxConfig* cfg) {
    const ModelPreset* p;
    int n = model_presets(&p);
    for (int i = 0; i < n; i++) if (strcmp(p[i].name, name) == 0) { *cfg = p[i].cfg; return 1; }
    return 0;
}

// Inconsistent shapes are bad input: one line naming the offending values, exit 2.
static inline void config_validate(const DbrxConfig* c) {
    if (c->d_model <= 0 || c->n_heads <= 0 || c->kv_heads <= 0 || c->n_layers <= 0 || c->ffn_hidden <= 0 ||
        c->n_experts <= 0 || c->top_k <= 0 || c->vocab_size <= 0 || c->max_seq_len <= 0)
        fail(EXIT_BAD_INPUT, "model sizes must be positive (d_model %d, n_heads %d, kv_heads %d, n_layers %d, "
             "ffn_hidden %d, experts %d, top_k %d, vocab %d, max_seq %d)", c->d_model, c->n_heads, c->kv_heads,
             c->n_layers, c->ffn_hidden, c->n_experts, c->top_k, c->vocab_size, c->max_seq_len);
    if (c->d_model % c->n_heads != 0)
        fail(EXIT_BAD_INPUT, "d_model %d is not divisible by n_heads %d", c->d_model, c->n_heads);
    if (c->n_heads % c->kv_heads != 0)
        fail(EXIT_BAD_INPUT, "n_heads %d is not divisible by kv_heads %d", c->n_heads, c->kv_heads);
    if (c->head_dim != c->d_model / c->n_heads)
        fail(EXIT_BAD_INPUT, "head_dim %d must equal d_model / n_heads = %d", c->head_dim, c->d_model / c->n_heads);
    if (c->head_dim % 2 != 0)
        fail(EXIT_BAD_INPUT, "head_dim %d (d_model %d / n_heads %d) is odd; RoPE needs an even head_dim",
             c->head_dim, c->d_model, c->n_heads);
    if (c->top_k > c->n_experts)
        fail(EXIT_BAD_INPUT, "top_k %d is larger than the number of experts %d", c->top_k, c->n_experts);
    if (!(c->rope_theta > 0.0f)) fail(EXIT_BAD_INPUT, "rope_theta %g must be positive", c->rope_theta);
    if (!(c->clip_qkv > 0.0f || c->clip_qkv == DBRX_OFF) || !std::isfinite(c->clip_qkv))
        fail(EXIT_BAD_INPUT, "clip_qkv %g must be positive, or off (no clamp); a clamp at 0 would zero every q, k and v",
             c->clip_qkv);
    if (!(c->moe_norm_p >= 1.0f || c->moe_norm_p == DBRX_OFF) || !std::isfinite(c->moe_norm_p))
        fail(EXIT_BAD_INPUT, "moe_normalize_expert_weights %g must be a p-norm's p >= 1 (DBRX: 1), or off (the top-k "
             "weights used as they are)", c->moe_norm_p);
    if (!(c->ln_eps > 0.0f)) fail(EXIT_BAD_INPUT, "ln_eps %g must be positive", c->ln_eps);
    if (!(c->moe_loss_weight >= 0.0f) || !(c->z_loss_weight >= 0.0f))
        fail(EXIT_BAD_INPUT, "moe_loss_weight %g and z_loss_weight %g must be >= 0", c->moe_loss_weight, c->z_loss_weight);
    if (!(c->init_std > 0.0f)) fail(EXIT_BAD_INPUT, "init_std %g must be positive", c->init_std);
}

static inline int qkv_dim(const DbrxConfig* c) { return c->d_model + 2 * c->kv_heads * c->head_dim; }

// parameters of one block, counted the way the shared reference counts them
static inline int64_t params_attention(const DbrxConfig* c) {
    return (int64_t)c->d_model * qkv_dim(c) + (int64_t)c->d_model * c->d_model;
}
static inline int64_t params_one_expert(const DbrxConfig* c) { return 3ll * c->ffn_hidden * c->d_model; }
static inline int64_t params_block_dense(const DbrxConfig* c) {  // everything but the experts
    return params_attention(c) + 2ll * c->d_model + (int64_t)c->d_model * c->n_experts;
}
static inline int64_t params_total(const DbrxConfig* c) {
    return c->n_layers * (params_block_dense(c) + c->n_experts * params_one_expert(c))
         + 2ll * c->vocab_size * c->d_model + c->d_model;
}
// active = what one token touches: the dense part and k of the E experts
static inline int64_t params_active(const DbrxConfig* c) {
    return c->n_layers * (params_block_dense(c) + c->top_k * params_one_expert(c))
         + 2ll * c->vocab_size * c->d_model + c->d_model;
}

// Training FLOPs per token, LLM Foundry's count: 6 * N_active + 12 * L * d * S (forward + backward,
// no causal discount). N_active includes the embedding table as LLM Foundry does.
static inline double flops_per_token(const DbrxConfig* c, int seq_len) {
    return 6.0 * (double)params_active(c) + 12.0 * c->n_layers * (double)c->d_model * seq_len;
}
