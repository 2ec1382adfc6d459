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

// The largest model the counts below may describe: 2^56 parameters (7.2e16, hundreds of times any model
// trained so far). Below it every count and byte size this program computes (18 bytes per parameter on
// the GPU, sums of them) fits in 63 bits; above it they would wrap (and no machine could hold it anyway).
#define CONFIG_MAX_PARAMS ((int64_t)1 << 56)

// The parameter counts in 128 bits, for the check against CONFIG_MAX_PARAMS (they cannot wrap for any
// int fields: each product has at most three 31-bit factors). Active: k of the E experts.
static inline __int128 params_wide(const DbrxConfig* c, int experts_touched) {
    __int128 d = c->d_model, qkv = (__int128)c->d_model + 2 * (__int128)c->kv_heads * c->head_dim;
    __int128 block = d * qkv + d * d + 2 * d + d * c->n_experts + (__int128)experts_touched * 3 * c->ffn_hidden * d;
    return (__int128)c->n_layers * block + 2 * (__int128)c->vocab_size * d + d;
}

// Inconsistent or impossible shapes are bad input: one line naming the flag and the value, exit 2.
static inline void config_validate(const DbrxConfig* c) {
    const struct { const char* flag; int v; } sizes[] = {
        {"--d-model", c->d_model}, {"--n-heads", c->n_heads}, {"--kv-heads", c->kv_heads}, {"--n-layers", c->n_layers},
        {"--ffn-hidden", c->ffn_hidden}, {"--experts", c->n_experts}, {"--top-k", c->top_k}, {"--vocab", c->vocab_size},
        {"--max-seq", c->max_seq_len}};
    for (const auto& s : sizes)
        if (s.v <= 0) fail(EXIT_BAD_INPUT, "%s %d must be positive", s.flag, s.v);
    if (c->d_model % c->n_heads != 0)
        fail(EXIT_BAD_INPUT, "--d-model %d is not divisible by --n-heads %d", c->d_model, c->n_heads);
    if (c->n_heads % c->kv_heads != 0)
        fail(EXIT_BAD_INPUT, "--n-heads %d is not divisible by --kv-heads %d", c->n_heads, c->kv_heads);
    if (c->head_dim != c->d_model / c->n_heads)
        fail(EXIT_BAD_INPUT, "head_dim %d must equal d_model / n_heads = %d", c->head_dim, c->d_model / c->n_heads);
    if (c->head_dim % 2 != 0)
        fail(EXIT_BAD_INPUT, "head_dim %d (--d-model %d / --n-heads %d) is odd; RoPE needs an even head_dim",
             c->head_dim, c->d_model, c->n_heads);
    if (c->top_k > c->n_experts)
        fail(EXIT_BAD_INPUT, "--top-k %d is larger than the number of experts %d (--experts)", c->top_k, c->n_experts);
    // widths the kernels and the parameter table hold in 32-bit ints (rows of a weight matrix)
    int64_t qkv = (int64_t)c->d_model + 2 * (int64_t)c->kv_heads * c->head_dim;
    if (qkv > INT32_MAX)
        fail(EXIT_BAD_INPUT, "--d-model %d with --kv-heads %d: the fused qkv width d_model + 2 * kv_heads * head_dim = %lld "
             "does not fit in 32 bits (at most %d)", c->d_model, c->kv_heads, (long long)qkv, INT32_MAX);
    if ((int64_t)c->n_experts * c->ffn_hidden > INT32_MAX)
        fail(EXIT_BAD_INPUT, "--experts %d x --ffn-hidden %d = %lld stacked expert rows do not fit in 32 bits (at most %d)",
             c->n_experts, c->ffn_hidden, (long long)c->n_experts * c->ffn_hidden, INT32_MAX);
    __int128 total = params_wide(c, c->n_experts);
    if (total > CONFIG_MAX_PARAMS)
        fail(EXIT_BAD_INPUT, "the model has %.3Lg parameters, more than the 2^56 this program counts (--d-model %d, --n-layers %d, "
             "--experts %d, --ffn-hidden %d, --vocab %d)", (long double)total, c->d_model, c->n_layers, c->n_experts,
             c->ffn_hidden, c->vocab_size);
    if (!(c->rope_theta > 0.0f)) fail(EXIT_BAD_INPUT, "--rope-theta %g must be positive", c->rope_theta);
    if (!(c->ln_eps > 0.0f)) fail(EXIT_BAD_INPUT, "--ln-eps %g must be positive", c->ln_eps);
    if (!(c->clip_qkv > 0.0f || c->clip_qkv == DBRX_OFF) || !std::isfinite(c->clip_qkv))
        fail(EXIT_BAD_INPUT, "--clip-qkv %g must be positive, or off (no clamp); a clamp at 0 would zero every q, k and v",
             c->clip_qkv);
    if (!(c->moe_norm_p >= 1.0f || c->moe_norm_p == DBRX_OFF) || !std::isfinite(c->moe_norm_p))
        fail(EXIT_BAD_INPUT, "--moe-normalize-expert-weights %g must be a p-norm's p >= 1 (DBRX: 1), or off (the top-k "
             "weights used as they are)", c->moe_norm_p);
    if (!(c->moe_loss_weight >= 0.0f) || !(c->z_loss_weight >= 0.0f))
        fail(EXIT_BAD_INPUT, "--moe-loss-weight %g and --z-loss-weight %g must be >= 0", c->moe_loss_weight, c->z_loss_weight);
    if (!(c->init_std > 0.0f)) fail(EXIT_BAD_INPUT, "--init-std %g must be positive", c->init_std);
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

// Training FLOPs per token for MFU, counted as Megatron-LM and PaLM count them: matmuls only — not the
// embedding lookup (a gather), not the norms, softmax or router top-k — with attention as executed under
// the causal mask (query t attends to t + 1 keys: (S + 1) / 2 on average), forward + backward = 3 x the
// forward:   6 * N_matmul + 6 * L * d * (S + 1)
// N_matmul: the GEMM weights one token goes through (per block Wqkv, out_proj, the router and k experts'
// w1, v1, w2; and lm_head).
static inline int64_t params_matmul_active(const DbrxConfig* c) {
    return c->n_layers * (params_attention(c) + (int64_t)c->d_model * c->n_experts + c->top_k * params_one_expert(c))
         + (int64_t)c->vocab_size * c->d_model;
}
// attn_share: the share of the causal pairs attention computes (--doc-mask: model/attention.cuh's doc_attended_share)
static inline double flops_per_token(const DbrxConfig* c, int seq_len, double attn_share = 1.0) {
    return 6.0 * (double)params_matmul_active(c) + 6.0 * c->n_layers * (double)c->d_model * (seq_len + 1.0) * attn_share;
}
#define FLOPS_PER_TOKEN_FORMULA "6 N_matmul + 6 L d (S + 1): matmuls only, no embedding lookup, causal attention (Megatron/PaLM)"

// The same as LLM Foundry counts it, for comparison with its numbers: 6 * N_active + 12 * L * d * S (the
// embedding table counted as a matmul, attention without the causal discount). It overstates the work.
static inline double flops_per_token_foundry(const DbrxConfig* c, int seq_len) {
    return 6.0 * (double)params_active(c) + 12.0 * c->n_layers * (double)c->d_model * seq_len;
}
#define FLOPS_PER_TOKEN_FOUNDRY_FORMULA "6 N_active + 12 L d S (LLM Foundry)"
