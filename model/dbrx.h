/*
 * dbrx.h — the DBRX model on the CPU reference backend (its parameter table and units: dbrx_params.h):
 * the activations saved for the backward pass, and the four calls of a training step: dbrx_forward,
 * dbrx_backward, dbrx_zero_grad, dbrx_update; and the rest of what the training loop asks of a model
 * (model/api.h, the contract both backends answer, checked at the end).
 *
 * One block (pre-LayerNorm), N = B*T tokens:
 *   h   = norm_1(x)                                (N, d)
 *   qkv = rope(clamp(h @ Wqkv^T, +-clip_qkv))      (N, d + 2*kv*hd)   (clip_qkv off: no clamp)
 *   x   = x + attention(qkv) @ Wo^T                (N, d)     causal GQA
 *   h   = norm_2(x)
 *   p   = softmax(h @ Wr^T); w, e = topk(p); w /= ||w||_P   (P = moe_normalize_expert_weights: DBRX 1,
 *                                                           i.e. w /= sum(w); off: w as it is)
 *   x   = x + sum_j w_j * expert_{e_j}(h)           dropless SwiGLU experts
 * then norm_f, lm_head (untied), cross-entropy; plus the load-balancing loss (and the z-loss).
 */
#pragma once
#include <vector>
#include <cblas.h>
#include "config.h"
#include "dbrx_params.h"
#include "matmul.cuh"
#include "embedding.cuh"
#include "layernorm.cuh"
#include "attention.cuh"
#include "attention_ring.h"
#include "router.cuh"
#include "moe.cuh"
#include "classifier.cuh"
#include "adamw.cuh"
#include "fp8.cuh"
#include "act_compress.cuh"
#include "profile.h"
#include "debug_hooks.h"
#include "api.h"
#include "recompute.h"
#include <type_traits>
#include <utility>

// ---------------------------------------------------------------------------------------------
// sharding hooks: dbrx_forward/dbrx_backward announce each unit before they read its parameters or
// write its gradients, and after. A sharded run (parallel/zero.h) gathers the unit's parameters in
// `begin` and reduce-scatters its gradients in `end`; unsharded, the hooks are NULL and cost nothing.

enum { UNIT_FORWARD, UNIT_BACKWARD, UNIT_BACKWARD_GRADS_ONLY };   // the last: reads no parameter (embedding)
typedef struct {
    void (*begin)(void* ctx, int unit, int phase);
    void (*end)(void* ctx, int unit, int phase);
    void* ctx;
} UnitHooks;

// The experts' dispatcher: a layer's routed rows may be computed on other ranks than this one. Expert
// parallelism (--expert-parallel n > 1: parallel/expert_parallel.h) installs it, so that the token
// exchange stays out of the model's arithmetic as the unit hooks keep sharding out of it; NULL: every
// expert is here and block_experts_forward/backward run them.
typedef struct {
    // ye (rows, d) = the experts of layer l over xe (rows, d), xe grouped by expert (counts (E), offsets
    // (E + 1)). train 1: the training (or evaluation) forward, whose state the backward reads, FP8 numerics
    // under --fp8; 2: its recomputation in the backward (--recompute moe/block: the same rows, layer by
    // layer on every rank, nothing counted again); 0: generation's one token (dbrx_decode_step: FP32).
    // Collective over the ranks that hold the experts: each of them calls it, layer by layer.
    void (*forward)(void* ctx, int l, const int* counts, const int* offsets, const real* xe, real* ye, int train);
    // backward of layer l's last training forward: dxe (N k, d) from dye (N k, d); the experts' weight
    // gradients accumulated into the model's g views
    void (*backward)(void* ctx, int l, const real* dye, real* dxe);
    void* ctx;
} ExpertHooks;

// ---------------------------------------------------------------------------------------------
// activations saved by the forward pass for the backward pass, per block

typedef struct {
    real *ln1, *ln1_mean, *ln1_rstd;   // (N, d), (N), (N)
    real *qkv_pre, *qkv;               // (N, qkv_dim): before the clamp, after clamp + RoPE
    real *att_lse;                     // (B, H, T) logsumexp of every attention score row
    real *atty;                        // (N, d) attention output before out_proj
    real *resid_mid;                   // (N, d) x after the attention residual
    real *ln2, *ln2_mean, *ln2_rstd;   // (N, d), (N), (N)
    real *router_logits, *probs, *lse; // (N, E), (N, E), (N)
    real *topk_w;                      // (N, k)
    int *topk_idx, *counts, *offsets;  // (N, k), (E), (E + 1)
    int *row_token, *slot_row;         // (N*k), (N*k)
    real *xe, *g, *u, *act, *ye;       // (N*k, d), (N*k, F) x3, (N*k, d)
    uint8_t* gu_codes; float* gu_sinv; // --compress-acts swiglu: g, u compressed (model/act_compress.cuh)
    uint8_t* ln1_codes; float* ln1_sinv; // --compress-acts attn: ln1 compressed
} BlockActs;

// Generation (dbrx_decode_step): one position at a time over a KV cache, batch 1. The cache of layer l
// holds, for every position computed so far, the K and V heads of its fused qkv row after clip and RoPE
// (the row's tail), so that a new position costs its own GEMMs and one attention row over the cache,
// never the whole prefix again. The rest is one token's scratch.
typedef struct {
    int T_max;                      // positions the cache holds (0: not allocated)
    std::vector<real*> kv;          // L of (T_max, 2*kv*hd): [K | V] of each position
    real *rope_cos, *rope_sin;      // (T_max, hd/2)
    real *x, *ln, *ln_mean, *ln_rstd, *qkv_pre, *qkv, *att, *atty, *resid_mid;   // (d), (d), (1), (1), (qkv_dim) x2, (H, T_max), (d), (d)
    real *router_logits, *probs, *lse, *topk_w;   // (E), (E), (1), (k)
    int *topk_idx, *counts, *offsets, *row_token, *slot_row;   // (k), (E), (E + 1), (k), (k)
    real *xe, *g, *u, *act, *ye, *logits;         // (k, d), (k, F) x3, (k, d), (V)
    std::vector<void*> allocations;
} DbrxDecode;

typedef struct {
    DbrxConfig cfg;
    std::vector<ParamInfo> table;
    size_t num_params;
    real *params, *grads, *m, *v;   // each num_params; m, v are the AdamW moments
    ParamTensors p, g;              // views of params and grads

    int B, T;                       // the micro-batch the activations are sized for
    std::vector<BlockActs> acts;
    std::vector<real*> resid;       // L+1 of (N, d): the input of block l, and the final output
    real *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;   // (N, d), (N), (N), (N, V), (N)
    real *rope_cos, *rope_sin;      // (T, hd/2)
    int* doc_bounds;                // (2, B, T): the micro-batch's document starts, then ends (--doc-mask: model/attention.cuh)
    DocMask doc;                    // this micro-batch's document mask (start NULL: none), set by the forward
    double attn_share;              // ... and the share of the causal attention pairs it keeps (1 without; MFU: model/config.h)
    // backward scratch, reused by every block
    real *dresid, *dln, *dqkv, *datty, *drouter, *dtopk_w, *dxe, *dye, *da, *dg, *du;
    // --recompute (model/recompute.h): each layer's RC_* bits, and the shared buffers its dropped ones point into
    std::vector<unsigned char> rc_mode;
    BlockActs rc_scratch;
    std::vector<void*> allocations;
    size_t activation_bytes;
    UnitHooks hooks;                // sharding hooks (all NULL: unsharded)
    ExpertHooks experts;            // the experts' dispatcher (all NULL: every expert here)
    AttentionHooks attn;            // context parallelism's ring attention (all NULL: the sequence is here)

    // FP8 (--fp8, off unless dbrx_enable_fp8): the recipe, every block's operand state, and scratch
    // for the fake-quantised operands (activation-sized fq_x, fq_dy, fq_dy2, fq_dz, fq_dz2;
    // weight-sized fq_w, fq_w2, fq_w3); fp8_wseg (E+1) = e*F, the experts' row ranges in w1/v1/w2
    Fp8Config fp8;
    std::vector<Fp8BlockState> fp8_state;
    real *fq_x, *fq_dy, *fq_dy2, *fq_dz, *fq_dz2, *fq_w, *fq_w2, *fq_w3;
    std::vector<int> fp8_wseg;

    DbrxDecode dec;                 // generation's KV cache and scratch (dbrx_decode_alloc)

    // results of the last forward pass
    double ce_loss, lbl_loss, z_loss;
    double imbalance;               // max over layers of (max / mean tokens per expert)
} Dbrx;

// every buffer of BlockActs with its elements and the recompute bit (model/recompute.h) that drops it:
// v(member, elements, bit)
template <typename V> static inline void block_acts_fields(const DbrxConfig* c, size_t N, V v) {
    size_t d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden, qd = qkv_dim(c), NH = N * c->n_heads;
    v(&BlockActs::ln1, N * d, RC_LN1); v(&BlockActs::ln1_mean, N, RC_BLOCK); v(&BlockActs::ln1_rstd, N, RC_BLOCK);
    v(&BlockActs::qkv_pre, N * qd, RC_BLOCK); v(&BlockActs::qkv, N * qd, RC_BLOCK); v(&BlockActs::att_lse, NH, RC_BLOCK);
    v(&BlockActs::atty, N * d, RC_ATTN); v(&BlockActs::resid_mid, N * d, RC_BLOCK);
    v(&BlockActs::ln2, N * d, RC_MOE); v(&BlockActs::ln2_mean, N, RC_MOE); v(&BlockActs::ln2_rstd, N, RC_MOE);
    v(&BlockActs::router_logits, N * E, RC_MOE); v(&BlockActs::probs, N * E, 0); v(&BlockActs::lse, N, 0);
    v(&BlockActs::topk_w, N * k, 0);
    v(&BlockActs::topk_idx, N * k, 0); v(&BlockActs::counts, E, 0); v(&BlockActs::offsets, E + 1, 0);
    v(&BlockActs::row_token, N * k, 0); v(&BlockActs::slot_row, N * k, 0);
    v(&BlockActs::xe, N * k * d, RC_MOE); v(&BlockActs::g, N * k * F, RC_SWIGLU); v(&BlockActs::u, N * k * F, RC_SWIGLU);
    v(&BlockActs::act, N * k * F, RC_SWIGLU); v(&BlockActs::ye, N * k * d, RC_MOE);
    CompressFormat cf = (CompressFormat)g_compress_format;   // (kept by the layers --compress-acts names: RC_CSWIGLU, RC_CATTN)
    v(&BlockActs::gu_codes, compress_code_bytes(cf, N * k, F), RC_CSWIGLU); v(&BlockActs::gu_sinv, compress_factor_bytes(cf, N * k, F) / 4, RC_CSWIGLU);
    v(&BlockActs::ln1_codes, compress_tensor_code_bytes(cf, N, d), RC_CATTN);
    v(&BlockActs::ln1_sinv, compress_tensor_factor_bytes(cf, N, d) / 4, RC_CATTN);
}

// Walks the activation buffers: allocates them when `m` is given, and returns their total bytes
// either way (the --dry-run memory estimate uses the same walk, so it cannot drift).
static inline size_t dbrx_activations(Dbrx* m, const DbrxConfig* c, int B, int T) {
    size_t bytes = 0;
    size_t N = (size_t)B * T, d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden;
    size_t qd = qkv_dim(c), V = c->vocab_size;
    recompute_check(&g_recompute, c->n_layers);
    auto take_real = [&](real** p, size_t n) {
        bytes += n * sizeof(real);
        if (m) { *p = (real*)mallocCheck(n * sizeof(real)); m->allocations.push_back(*p); }
    };
    real* dummy_real;
    // per block: a buffer that the layer's recomputation (--recompute, model/recompute.h) drops is not kept
    // per layer but points into one shared scratch set (m->rc_scratch), sized for the union of the layers'
    BlockActs dummy, dummy_scratch;
    BlockActs* sc = m ? &m->rc_scratch : &dummy_scratch;
    int U = recompute_union(&g_recompute, c->n_layers);
    auto take = [&](auto** p, size_t n) {
        using Tp = std::remove_pointer_t<std::remove_reference_t<decltype(*p)>>;
        bytes += n * sizeof(Tp);
        if (m) { *p = (Tp*)mallocCheck(n * sizeof(Tp)); m->allocations.push_back(*p); }
    };
    if (U) block_acts_fields(c, N, [&](auto f, size_t n, int bit) { if (recompute_buffer_place(U, bit) == 1) take(&(sc->*f), n); });
    if (m) m->rc_mode.assign(c->n_layers, 0);
    for (int l = 0; l < c->n_layers; l++) {
        BlockActs* a = m ? &m->acts[l] : &dummy;
        int mode = recompute_mode(&g_recompute, l);
        if (m) m->rc_mode[l] = (unsigned char)mode;
        block_acts_fields(c, N, [&](auto f, size_t n, int bit) {
            int place = recompute_buffer_place(mode, bit);   // (0: its own, 1: the shared scratch, 2: none)
            if (place) a->*f = place == 1 ? sc->*f : nullptr;
            else take(&(a->*f), n);
        });
    }
    for (int l = 0; l <= c->n_layers; l++) take_real(m ? &m->resid[l] : &dummy_real, N * d);
    take_real(m ? &m->lnf : &dummy_real, N * d); take_real(m ? &m->lnf_mean : &dummy_real, N);
    take_real(m ? &m->lnf_rstd : &dummy_real, N); take_real(m ? &m->logits : &dummy_real, N * V);
    take_real(m ? &m->losses : &dummy_real, N);
    take_real(m ? &m->rope_cos : &dummy_real, (size_t)T * c->head_dim / 2);
    take_real(m ? &m->rope_sin : &dummy_real, (size_t)T * c->head_dim / 2);
    int* dummy_int;
    take(m ? &m->doc_bounds : &dummy_int, 2 * N);
    take_real(m ? &m->dresid : &dummy_real, N * d); take_real(m ? &m->dln : &dummy_real, N * d);
    take_real(m ? &m->dqkv : &dummy_real, N * qd); take_real(m ? &m->datty : &dummy_real, N * d);
    take_real(m ? &m->drouter : &dummy_real, N * E); take_real(m ? &m->dtopk_w : &dummy_real, N * k);
    take_real(m ? &m->dxe : &dummy_real, N * k * d); take_real(m ? &m->dye : &dummy_real, N * k * d);
    take_real(m ? &m->da : &dummy_real, N * k * F); take_real(m ? &m->dg : &dummy_real, N * k * F);
    take_real(m ? &m->du : &dummy_real, N * k * F);
    return bytes;
}

// the whole flat buffer m->params, laid out by m->table
static inline void dbrx_init_params(Dbrx* m, uint64_t seed) {
    dbrx_init_range(m->params, 0, m->table.back().offset + m->table.back().numel, &m->cfg, m->table, seed);
}

// everything but the parameter, gradient and moment buffers: the table and the activations for
// micro-batches of (B, T). (A sharded run owns those buffers: parallel/zero.h.)
static inline void dbrx_build_shape(Dbrx* m, const DbrxConfig* cfg, int B, int T) {
    config_validate(cfg);
    // the CPU backend parallelises with OpenMP itself (model/matmul.cuh): OpenBLAS must not start a
    // second pool of spinning threads on the same cores
    openblas_set_num_threads(1);
    if (T > cfg->max_seq_len) fail(EXIT_BAD_INPUT, "--seq %d is longer than the model's max_seq_len %d", T, cfg->max_seq_len);
    m->cfg = *cfg;
    m->table = dbrx_param_table(cfg);
    m->num_params = m->table.back().offset + m->table.back().numel;
    if ((int64_t)m->num_params != params_total(cfg))
        fail_at(__FILE__, __LINE__, "parameter table (%zu) disagrees with params_total (%lld)", m->num_params,
                (long long)params_total(cfg));
    m->params = m->grads = m->m = m->v = NULL;
    m->hooks = UnitHooks{NULL, NULL, NULL};
    m->experts = ExpertHooks{NULL, NULL, NULL};
    m->attn = AttentionHooks{NULL, NULL, NULL, NULL, NULL, NULL};
    m->doc = DocMask{};
    m->B = B; m->T = T;
    m->dec.T_max = 0;
    m->fp8.recipe = FP8_OFF;
    m->acts.resize(cfg->n_layers);
    m->resid.resize(cfg->n_layers + 1);
    m->activation_bytes = dbrx_activations(m, cfg, B, T);
    rope_tables(m->rope_cos, m->rope_sin, T, cfg->head_dim, cfg->rope_theta);
}

// builds the model for micro-batches of (B, T): parameters, gradients, moments, activations
static inline void dbrx_build(Dbrx* m, const DbrxConfig* cfg, int B, int T, uint64_t seed) {
    dbrx_build_shape(m, cfg, B, T);
    size_t bytes = m->num_params * sizeof(real);
    m->params = (real*)mallocCheck(bytes);
    m->grads = (real*)calloc(m->num_params, sizeof(real));
    m->m = (real*)calloc(m->num_params, sizeof(real));
    m->v = (real*)calloc(m->num_params, sizeof(real));
    ENSURE(m->grads && m->m && m->v, "out of host memory for %zu parameters", m->num_params);
    m->p = param_views(m->params, cfg, m->table);
    m->g = param_views(m->grads, cfg, m->table);
    dbrx_init_params(m, seed);
}

// Switches the five GEMMs of every block (Wqkv, out_proj, w1, v1, w2) to FP8 numerics, emulated:
// their operands are fake-quantised (model/fp8.cuh) around the FP32 GEMMs.
static inline void dbrx_enable_fp8(Dbrx* m, const Fp8Config* cfg) {
    const DbrxConfig* c = &m->cfg;
    m->fp8 = *cfg;
    if (cfg->recipe == FP8_OFF) return;
    if (cfg->history_len < 1 || cfg->history_len > FP8_MAX_HISTORY)
        fail(EXIT_BAD_INPUT, "--fp8-amax-history %d must be in [1, %d]", cfg->history_len, FP8_MAX_HISTORY);
    size_t N = (size_t)m->B * m->T, k = c->top_k, d = c->d_model, F = c->ffn_hidden, qd = qkv_dim(c);
    size_t act = N * qd, w = qd * d;
    if (N * k * (d > F ? d : F) > act) act = N * k * (d > F ? d : F);
    if ((size_t)c->n_experts * F * d > w) w = (size_t)c->n_experts * F * d;
    real** bufs[] = {&m->fq_x, &m->fq_dy, &m->fq_dy2, &m->fq_dz, &m->fq_dz2, &m->fq_w, &m->fq_w2, &m->fq_w3};
    for (int i = 0; i < 8; i++) {
        *bufs[i] = (real*)mallocCheck((i < 5 ? act : w) * sizeof(real));
        m->allocations.push_back(*bufs[i]);
    }
    m->fp8_state.resize(c->n_layers);
    for (Fp8BlockState& b : m->fp8_state)
        for (Fp8Linear* q : {&b.qkv, &b.proj, &b.w1, &b.v1, &b.w2})
            for (Fp8Meta* mt : {&q->x, &q->w, &q->dy}) fp8_meta_init(mt);
    m->fp8_wseg.resize(c->n_experts + 1);
    for (int e = 0; e <= c->n_experts; e++) m->fp8_wseg[e] = e * c->ffn_hidden;
}

// every FP8 operand state with its name and format, in a fixed order (for the end-of-step update,
// the amax reduction across ranks and the log)
typedef struct { std::string name; Fp8Meta* meta; Fp8Format fmt; } Fp8MetaRef;
static inline std::vector<Fp8MetaRef> dbrx_fp8_metas(Dbrx* m) {
    std::vector<Fp8MetaRef> refs;
    if (m->fp8.recipe == FP8_OFF) return refs;
    for (const Fp8Operand& o : fp8_operand_table(m->cfg.n_layers))   // model/fp8.cuh: the table both backends share
        refs.push_back({o.name, fp8_block_meta(&m->fp8_state[o.layer], o.lin, o.op), o.fmt});
    return refs;
}

static inline void dbrx_decode_free(Dbrx* m) {
    for (void* p : m->dec.allocations) free(p);
    m->dec.allocations.clear();
    m->dec.T_max = 0;
}

static inline void dbrx_free(Dbrx* m) {
    dbrx_decode_free(m);
    for (void* p : m->allocations) free(p);
    m->allocations.clear();
    free(m->params); free(m->grads); free(m->m); free(m->v);
}

// the store's per-unit calls; under --profile, ranges for its gathers (and prefetches) and reduce-scatters
static inline void unit_begin(Dbrx* m, int unit, int phase) {
    if (!m->hooks.begin) return;
    bool timed = phase != UNIT_BACKWARD_GRADS_ONLY;
    if (timed) prof_begin(PROF_HOST, "comm", "gather unit %d", unit);
    m->hooks.begin(m->hooks.ctx, unit, phase);
    if (timed) prof_end(PROF_HOST);
}
static inline void unit_end(Dbrx* m, int unit, int phase) {
    if (!m->hooks.end) return;
    bool timed = phase != UNIT_FORWARD;
    if (timed) prof_begin(PROF_HOST, "comm", "reduce-scatter unit %d", unit);
    m->hooks.end(m->hooks.ctx, unit, phase);
    if (timed) prof_end(PROF_HOST);
}
// where --profile times this model's ranges: the host's clock (model/profile.h)
static inline ProfTrack dbrx_prof_track(const Dbrx* m) { (void)m; return PROF_HOST; }

// ---------------------------------------------------------------------------------------------
// The block's five GEMMs, each one call whose numerics the block's FP8 policy picks (model/fp8.cuh:
// Fp8Policy): FP32, or under --fp8 the same GEMM on fake-quantised operands with the operand state of
// layer l (m->fp8_state[l]). Wqkv and out_proj are block_linear_* (lin: FP8_LIN_QKV, FP8_LIN_PROJ, as
// the GPU model's); the experts' w1, v1, w2 are block_experts_*.

static inline Fp8BlockState* block_fp8(Dbrx* m, int l) { return m->fp8.recipe != FP8_OFF ? &m->fp8_state[l] : NULL; }
static inline Fp8Policy block_fp8_policy(Dbrx* m, int l) { return Fp8Policy{&m->fp8, block_fp8(m, l)}; }
// a linear's FP8 state under the policy (NULL: FP32)
static inline Fp8Linear* fp8_policy_linear(const Fp8Policy* p, int lin) {
    if (!p->st) return NULL;
    Fp8Linear* q[FP8_NLIN] = {&p->st->qkv, &p->st->proj, &p->st->w1, &p->st->v1, &p->st->w2};
    return q[lin];
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T
static inline void block_linear_forward(Dbrx* m, int l, int lin, real* out, const real* inp, const real* weight, int N, int C, int OC) {
    Fp8Policy p = block_fp8_policy(m, l);
    if (Fp8Linear* q = fp8_policy_linear(&p, lin)) fp8_matmul_forward(out, inp, weight, N, C, OC, q, p.cfg, m->fq_x, m->fq_w);
    else matmul_forward(out, inp, weight, N, C, OC);
}
// dinp += dout @ weight, dweight += dout^T @ inp
static inline void block_linear_backward(Dbrx* m, int l, int lin, real* dinp, real* dweight, const real* dout, const real* inp,
                                         const real* weight, int N, int C, int OC) {
    Fp8Policy p = block_fp8_policy(m, l);
    if (Fp8Linear* q = fp8_policy_linear(&p, lin))
        fp8_matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC, q, p.cfg, m->fq_x, m->fq_w, m->fq_dy, m->fq_dy2);
    else matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC);
}

// The SwiGLU experts over the routed rows of block l (grouped by expert: a->offsets):
// g, u, act = up(xe); ye = down(act). Under FP8: E4M3 operands, xe and act in 1x128 tiles along the
// GEMM's reduction, each expert's weights in 128x128 blocks.
// A dispatcher (m->experts) takes the rows instead (expert parallelism: parallel/expert_parallel.h).
static inline void block_experts_forward(Dbrx* m, int l, BlockActs* a, const BlockParams& w, int train = 1) {
    if (m->experts.forward) { m->experts.forward(m->experts.ctx, l, a->counts, a->offsets, a->xe, a->ye, train); return; }
    const DbrxConfig* c = &m->cfg;
    int E = c->n_experts, d = c->d_model, F = c->ffn_hidden;
    Fp8Policy p = block_fp8_policy(m, l);
    const int *o = a->offsets, *ws = m->fp8_wseg.data();   // (the rows of the routed rows' and of the weights' experts)
    const real* xe = fp8_policy_grouped(&p, FP8_LIN_W1, FP8_OP_X, m->fq_x, a->xe, o, E, d, 1, 128);
    const real* w1 = fp8_policy_weight(&p, FP8_LIN_W1, m->fq_w, w.w1, ws, E, d);
    const real* v1 = fp8_policy_weight(&p, FP8_LIN_V1, m->fq_w2, w.v1, ws, E, d);
    experts_up_forward(a->g, a->u, a->act, xe, w1, v1, o, E, d, F);
    const real* act = fp8_policy_grouped(&p, FP8_LIN_W2, FP8_OP_X, m->fq_x, a->act, o, E, F, 1, 128);
    const real* w2 = fp8_policy_weight(&p, FP8_LIN_W2, m->fq_w3, w.w2, ws, E, d);
    experts_down_forward(a->ye, act, w2, o, E, d, F);
}

// Backward of block_experts_forward from dye (m->dye): the weight gradients into gw, dxe (m->dxe).
// Under FP8: E5M2 gradients, in 1x128 tiles for dgrad (reduction along the row) and re-tiled 128x1
// for wgrad under block scaling (reduction over the tokens).
static inline void block_experts_backward(Dbrx* m, int l, BlockActs* a, const BlockParams& w, const BlockParams& gw) {
    if (m->experts.backward) { m->experts.backward(m->experts.ctx, l, m->dye, m->dxe); return; }
    const DbrxConfig* c = &m->cfg;
    int E = c->n_experts, d = c->d_model, F = c->ffn_hidden, N = m->B * m->T, k = c->top_k;
    Fp8Policy p = block_fp8_policy(m, l);
    const int *o = a->offsets, *ws = m->fp8_wseg.data();
    // down: dgrad da = dye @ w2_e^T reduces over d, wgrad dw2_e += a^T @ dye over the tokens
    const real* dye_d = fp8_policy_grouped(&p, FP8_LIN_W2, FP8_OP_DY, m->fq_dy, m->dye, o, E, d, 1, 128);
    const real* w2 = fp8_policy_weight(&p, FP8_LIN_W2, m->fq_w3, w.w2, ws, E, d);
    const real* dye_w = fp8_policy_grouped_wgrad(&p, FP8_LIN_W2, m->fq_dy2, m->dye, dye_d, o, E, d);
    const real* act_w = fp8_policy_grouped(&p, FP8_LIN_W2, FP8_OP_X, m->fq_x, a->act, o, E, F, 128, 1);
    experts_down_backward(m->da, gw.w2, dye_d, w2, act_w, dye_w, o, E, d, F);
    swiglu_backward(m->dg, m->du, m->da, a->g, a->u, (size_t)N * k * F);
    // up: dgrad dxe = dg @ w1_e + du @ v1_e reduces over F, wgrad over the tokens
    const real* dg_d = fp8_policy_grouped(&p, FP8_LIN_W1, FP8_OP_DY, m->fq_dy, m->dg, o, E, F, 1, 128);
    const real* du_d = fp8_policy_grouped(&p, FP8_LIN_V1, FP8_OP_DY, m->fq_dz, m->du, o, E, F, 1, 128);
    const real* w1 = fp8_policy_weight(&p, FP8_LIN_W1, m->fq_w, w.w1, ws, E, d);
    const real* v1 = fp8_policy_weight(&p, FP8_LIN_V1, m->fq_w2, w.v1, ws, E, d);
    const real* dg_w = fp8_policy_grouped_wgrad(&p, FP8_LIN_W1, m->fq_dy2, m->dg, dg_d, o, E, F);
    const real* du_w = fp8_policy_grouped_wgrad(&p, FP8_LIN_V1, m->fq_dz2, m->du, du_d, o, E, F);
    const real* xe_w = fp8_policy_grouped(&p, FP8_LIN_W1, FP8_OP_X, m->fq_x, a->xe, o, E, d, 128, 1);
    experts_up_backward(m->dxe, gw.w1, gw.v1, dg_d, du_d, w1, v1, dg_w, du_w, xe_w, o, E, d, F);
}

// layer l's attention half: LayerNorm 1, the fused qkv projection, clip, RoPE, attention, the output projection
// and the residual: resid_mid (N, d) = x + out_proj(attention(...)). The forward and --recompute's both run it.
static inline void block_attention_forward(Dbrx* m, int l, const real* x) {
    const DbrxConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim, qd = qkv_dim(c);
    const BlockParams& w = m->p.blocks[l];
    BlockActs* a = &m->acts[l];
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.norm1, N, d, c->ln_eps);
    block_linear_forward(m, l, FP8_LIN_QKV, a->qkv_pre, a->ln1, w.wqkv, N, d, qd);
    clip_forward(a->qkv, a->qkv_pre, (size_t)N * qd, c->clip_qkv);
    rope_forward(a->qkv, m->rope_cos, m->rope_sin, B, T, H, KV, hd);
    attention_hooked_forward(&m->attn, a->atty, a->att_lse, a->qkv, B, T, H, KV, hd, m->doc);
    block_linear_forward(m, l, FP8_LIN_PROJ, a->resid_mid, a->atty, w.wo, N, d, d);
    for (size_t i = 0; i < (size_t)N * d; i++) a->resid_mid[i] += x[i];
}

#include "dbrx_recompute.h"

// ---------------------------------------------------------------------------------------------
// forward: inputs, targets (B, T) token ids. Returns the cross-entropy; sets ce/lbl/z/imbalance.
// dloss: the training loop's 1 / grad_accum, or 0 for evaluation; the CPU needs it only in the
// backward (the GPU's fused classifier takes it here), so the two backends share one signature.

static inline double dbrx_forward(Dbrx* m, const int* inputs, const int* targets, float dloss = 0.0f) {
    const DbrxConfig* c = &m->cfg;
    int N = m->B * m->T, d = c->d_model;
    int E = c->n_experts, k = c->top_k, L = c->n_layers;
    m->doc = DocMask{};   // (--doc-mask: this batch's documents, which the backward's attention reads too; under context
    if (g_doc_mask_eot >= 0 && !m->attn.batch) {   // parallelism the group's, its batch hook's below)
        doc_bounds(m->doc_bounds, m->doc_bounds + N, inputs, m->B, m->T, g_doc_mask_eot);
        m->doc = DocMask{m->doc_bounds, m->doc_bounds + N};
    }
    m->attn_share = g_doc_mask_eot < 0 ? 1.0 : m->attn.batch ? m->attn.batch(m->attn.ctx, inputs)   // (context parallelism: the
                                       : doc_attended_share(inputs, m->B, m->T, g_doc_mask_eot);    // documents span the group's chunks)
    unit_begin(m, 0, UNIT_FORWARD);
    prof_begin(PROF_HOST, "layer", "embedding");
    embedding_forward(m->resid[0], inputs, m->p.wte, N, d);
    prof_end(PROF_HOST);
    unit_end(m, 0, UNIT_FORWARD);
    m->lbl_loss = 0; m->z_loss = 0; m->imbalance = 0;
    for (int l = 0; l < L; l++) {
        unit_begin(m, dbrx_block_unit(l), UNIT_FORWARD);
        const BlockParams& w = m->p.blocks[l];   // (a reference: the experts' views are set when their unit begins)
        BlockActs* a = &m->acts[l];
        real* x = m->resid[l];
        // attention half
        prof_begin(PROF_HOST, "layer", "layer %d attention", l);
        block_attention_forward(m, l, x);
        dbrx_compress_layer(m, l, RC_CATTN, dloss);   // (--compress-acts attn: ln1 kept compressed until the backward)
        // MoE half
        prof_next(PROF_HOST, "layer", "layer %d router", l);
        layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->resid_mid, w.norm2, N, d, c->ln_eps);
        matmul_forward(a->router_logits, a->ln2, w.router, N, d, E);
        if (g_debug_hooks.route_first)   // (the tests' forced imbalance: experts 0..k-1, one EP rank's, take every token)
            for (int t = 0; t < N; t++) for (int e = 0; e < k; e++) a->router_logits[(size_t)t * E + e] += 30;
        if (g_debug_hooks.route_balanced)   // (benchmarks: token t to experts (k t + j) mod E, each N k / E rows)
            for (int i = 0; i < N * k; i++) a->router_logits[(size_t)(i / k) * E + i % E] += 30;
        router_forward(a->probs, a->lse, a->topk_idx, a->topk_w, a->counts, a->router_logits, N, E, k, c->moe_norm_p);
        moe_dispatch(a->offsets, a->row_token, a->slot_row, a->topk_idx, a->counts, N, E, k);
        moe_gather(a->xe, a->ln2, a->row_token, N * k, d);
        prof_end(PROF_HOST);
        unit_end(m, dbrx_block_unit(l), UNIT_FORWARD);
        unit_begin(m, dbrx_experts_unit(l), UNIT_FORWARD);
        prof_begin(PROF_HOST, "layer", "layer %d experts", l);
        block_experts_forward(m, l, a, w);
        dbrx_compress_layer(m, l, RC_CSWIGLU, dloss);   // (--compress-acts swiglu: g, u kept compressed until the backward)
        unit_end(m, dbrx_experts_unit(l), UNIT_FORWARD);
        real* out = m->resid[l + 1];
        memcpy(out, a->resid_mid, (size_t)N * d * sizeof(real));
        moe_combine_forward(out, a->ye, a->topk_w, a->slot_row, N, k, d);
        // auxiliary losses and the load statistic
        m->lbl_loss += m->attn.lbl ? m->attn.lbl(m->attn.ctx, l, a->probs, a->counts, N, E, k, L, c->moe_loss_weight)   // (CP: the group's)
                                   : lbl_forward(a->probs, a->counts, N, E, k, L, c->moe_loss_weight);
        m->z_loss += zloss_forward(a->lse, N, L, c->z_loss_weight);
        int maxc = 0;
        for (int e = 0; e < E; e++) if (a->counts[e] > maxc) maxc = a->counts[e];
        double imb = (double)maxc / ((double)N * k / E);
        if (imb > m->imbalance) m->imbalance = imb;
        prof_end(PROF_HOST);
    }
    unit_begin(m, dbrx_head_unit(c), UNIT_FORWARD);
    prof_begin(PROF_HOST, "layer", "lm_head + loss");
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->resid[L], m->p.norm_f, N, d, c->ln_eps);
    matmul_forward(m->logits, m->lnf, m->p.lm_head, N, d, c->vocab_size);
    unit_end(m, dbrx_head_unit(c), UNIT_FORWARD);
    m->ce_loss = crossentropy_forward(m->losses, m->logits, targets, N, c->vocab_size);
    prof_end(PROF_HOST);
    return m->ce_loss;
}

// backward of dloss * (ce + lbl + z) of the last forward; gradients are ACCUMULATED into m->grads
// (dloss = 1 / grad_accum). Overwrites m->logits with dlogits.
static inline void dbrx_backward(Dbrx* m, const int* inputs, const int* targets, float dloss) {
    const DbrxConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim;
    int E = c->n_experts, k = c->top_k, qd = qkv_dim(c), L = c->n_layers, V = c->vocab_size;
    size_t Nd = (size_t)N * d;
    prof_begin(PROF_HOST, "layer", "lm_head + loss");
    crossentropy_backward(m->logits, targets, N, V, (real)(dloss / N));
    unit_begin(m, dbrx_head_unit(c), UNIT_BACKWARD);
    memset(m->dln, 0, Nd * sizeof(real));
    matmul_backward(m->dln, m->g.lm_head, m->logits, m->lnf, m->p.lm_head, N, d, V);
    memset(m->dresid, 0, Nd * sizeof(real));
    layernorm_backward(m->dresid, m->g.norm_f, m->dln, m->resid[L], m->p.norm_f, m->lnf_mean, m->lnf_rstd, N, d);
    prof_end(PROF_HOST);
    unit_end(m, dbrx_head_unit(c), UNIT_BACKWARD);
    for (int l = L - 1; l >= 0; l--) {
        int rc = m->rc_mode[l];   // --recompute: what this layer's forward did not keep (model/dbrx_recompute.h)
        if (rc & RC_MOE) dbrx_recompute_block_half(m, l, rc);
        unit_begin(m, dbrx_experts_unit(l), UNIT_BACKWARD);
        const BlockParams& w = m->p.blocks[l];
        const BlockParams& gw = m->g.blocks[l];
        BlockActs* a = &m->acts[l];
        // dresid = d loss / d resid[l+1]; the residual passes it to resid_mid unchanged
        // MoE half
        prof_begin(PROF_HOST, "layer", "layer %d experts", l);
        if (rc & RC_SWIGLU) dbrx_recompute_experts(m, l, rc);
        dbrx_decompress_layer(m, l, rc & RC_CSWIGLU);
        moe_combine_backward(m->dye, m->dtopk_w, m->dresid, a->ye, a->topk_w, a->slot_row, N, k, d);
        block_experts_backward(m, l, a, w, gw);
        prof_end(PROF_HOST);
        unit_end(m, dbrx_experts_unit(l), UNIT_BACKWARD);
        unit_begin(m, dbrx_block_unit(l), UNIT_BACKWARD);
        prof_begin(PROF_HOST, "layer", "layer %d router", l);
        memset(m->dln, 0, Nd * sizeof(real));
        moe_gather_backward(m->dln, m->dxe, a->slot_row, N, k, d);
        const int* lc = a->counts;   // (CP: the group's counts and the weight / n: lbl_counts)
        float lw = m->attn.lbl ? m->attn.lbl_counts(m->attn.ctx, l, c->moe_loss_weight, &lc) : c->moe_loss_weight;
        router_backward(m->drouter, m->dtopk_w, a->probs, a->lse, a->topk_idx, a->topk_w, lc, N, E, k, L, lw, c->z_loss_weight, dloss,
                        c->moe_norm_p);
        matmul_backward(m->dln, gw.router, m->drouter, a->ln2, w.router, N, d, E);
        layernorm_backward(m->dresid, gw.norm2, m->dln, a->resid_mid, w.norm2, a->ln2_mean, a->ln2_rstd, N, d);
        // attention half: dresid is now d loss / d resid_mid
        prof_next(PROF_HOST, "layer", "layer %d attention", l);
        if ((rc & RC_ATTN) && !(rc & RC_BLOCK)) attention_hooked_forward(&m->attn, a->atty, a->att_lse, a->qkv, B, T, H, KV, hd, m->doc);   // (the same lse)
        memset(m->datty, 0, Nd * sizeof(real));
        block_linear_backward(m, l, FP8_LIN_PROJ, m->datty, gw.wo, m->dresid, a->atty, w.wo, N, d, d);
        attention_hooked_backward(&m->attn, m->dqkv, m->datty, a->qkv, a->atty, a->att_lse, B, T, H, KV, hd, m->doc);
        rope_backward(m->dqkv, m->rope_cos, m->rope_sin, B, T, H, KV, hd);
        clip_backward(m->dqkv, a->qkv_pre, (size_t)N * qd, c->clip_qkv);
        memset(m->dln, 0, Nd * sizeof(real));
        dbrx_decompress_layer(m, l, rc & RC_CATTN);
        block_linear_backward(m, l, FP8_LIN_QKV, m->dln, gw.wqkv, m->dqkv, a->ln1, w.wqkv, N, d, qd);
        layernorm_backward(m->dresid, gw.norm1, m->dln, m->resid[l], w.norm1, a->ln1_mean, a->ln1_rstd, N, d);
        prof_end(PROF_HOST);
        unit_end(m, dbrx_block_unit(l), UNIT_BACKWARD);
    }
    unit_begin(m, 0, UNIT_BACKWARD_GRADS_ONLY);
    prof_begin(PROF_HOST, "layer", "embedding");
    embedding_backward(m->g.wte, m->dresid, inputs, N, d);
    prof_end(PROF_HOST);
    unit_end(m, 0, UNIT_BACKWARD_GRADS_ONLY);
}

static inline void dbrx_zero_grad(Dbrx* m) { memset(m->grads, 0, m->num_params * sizeof(real)); }

// The flat parameter buffer in fixed chunks of at most 64K elements that never straddle two tensors,
// so that the optimizer runs as one parallel loop whose result does not depend on the thread count.
typedef struct { size_t offset, n; int decay; } ParamChunk;
static inline std::vector<ParamChunk> param_chunks(const std::vector<ParamInfo>& table) {
    std::vector<ParamChunk> chunks;
    const size_t chunk = 1 << 16;
    for (const ParamInfo& p : table)
        for (size_t lo = 0; lo < p.numel; lo += chunk)
            chunks.push_back({p.offset + lo, p.numel - lo < chunk ? p.numel - lo : chunk, p.decay});
    return chunks;
}

// L2 norm of all gradients: per-chunk sums added in chunk order
static inline double dbrx_grad_norm(const Dbrx* m) {
    std::vector<ParamChunk> chunks = param_chunks(m->table);
    std::vector<double> partial(chunks.size());
    #pragma omp parallel for schedule(dynamic, 4)
    for (size_t i = 0; i < chunks.size(); i++) partial[i] = grad_sumsq(m->grads + chunks[i].offset, chunks[i].n);
    double total = 0;
    for (double p : partial) total += p;
    return sqrt(total);
}

// FP8 delayed scaling, after every optimizer step: this step's amaxes (already reduced across the
// ranks) join the histories and set the next step's scales
static inline void dbrx_fp8_end_step(Dbrx* m) {
    for (Fp8MetaRef& r : dbrx_fp8_metas(m)) fp8_meta_step(r.meta, &m->fp8, r.fmt);
}

// A skipped step (checkpoint/spike_guard.h): this step's amaxes are dropped, not added to the histories
// (a spike's, or a non-finite one, would set the scales of the next steps)
static inline void dbrx_fp8_discard_step(Dbrx* m) {
    for (Fp8MetaRef& r : dbrx_fp8_metas(m)) { r.meta->amax = 0; r.meta->saturated = 0; }
}

typedef struct { float lr, beta1, beta2, eps, weight_decay, grad_clip; } AdamWConfig;

// one optimizer step t (1-based) with global-norm clipping; returns the norm before clipping (norm >= 0:
// already computed by the caller, dbrx_grad_norm)
static inline double dbrx_update(Dbrx* m, const AdamWConfig* o, float lr, int t, double norm = -1) {
    if (norm < 0) norm = dbrx_grad_norm(m);
    float scale = (o->grad_clip > 0 && norm > o->grad_clip) ? (float)(o->grad_clip / norm) : 1.0f;
    std::vector<ParamChunk> chunks = param_chunks(m->table);
    #pragma omp parallel for schedule(dynamic, 4)
    for (size_t i = 0; i < chunks.size(); i++) {
        const ParamChunk& c = chunks[i];
        optimizer_update(m->params + c.offset, m->grads + c.offset, m->m + c.offset, m->v ? m->v + c.offset : NULL, c.n, lr,
                         o->beta1, o->beta2, o->eps, c.decay ? o->weight_decay : 0.0f, scale, t);
    }
    dbrx_fp8_end_step(m);
    return norm;
}

#include "dbrx_decode.h"   // (generation: dbrx_decode_alloc, dbrx_decode_step)

// ---------------------------------------------------------------------------------------------
// the rest of the training loop's calls (model/api.h): the ones only the GPU model has work for, and
// the last forward's results for the host

static inline void dbrx_sync(Dbrx* m) { (void)m; }
static inline float dbrx_fp8_log_scale(Dbrx* m, const Fp8MetaRef& r, int i) { (void)m; (void)i; return r.meta->scale; }
static inline void dbrx_logits_to_host(Dbrx* m, std::vector<float>* out) {
    out->assign(m->logits, m->logits + (size_t)m->B * m->T * m->cfg.vocab_size);
}
// the per-token cross-entropy of the last forward (B * T)
static inline void dbrx_losses_to_host(Dbrx* m, std::vector<float>* out) { out->assign(m->losses, m->losses + (size_t)m->B * m->T); }
// acc (L * E) += each layer's tokens per expert in the last forward (top-k assignments: k per token)
static inline void dbrx_expert_counts_add(Dbrx* m, std::vector<double>* acc) {
    int E = m->cfg.n_experts;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < E; e++) (*acc)[(size_t)l * E + e] += m->acts[l].counts[e];
}

DBRX_CHECK_MODEL_CONTRACT(Dbrx);
