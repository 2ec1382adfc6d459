/*
 * dbrx_cuda.cuh — the DBRX model on the CUDA backend: the same forward and backward, in the same
 * order, as model/dbrx.h (the CPU reference, the spec), with every op's CUDA kernels (model/<op>.cuh)
 * and cuBLASLt GEMMs. Numerics:
 *   parameters  fp32 master weights + AdamW moments + fp32 gradients (16 B/param) and a BF16
 *               working copy (2 B/param) that the forward and backward read;
 *   activations BF16, except the LayerNorm statistics, the router (logits, probabilities, top-k
 *               weights: fp32, as the reference requires), the attention logsumexp and the
 *               losses (fp32); the residual-stream gradient and the LayerNorm input gradients
 *               are accumulated in fp32.
 * FP8 (--fp8, model/dbrx_fp8_cuda.cuh): the five GEMMs of every block on FP8 operands; the routed
 * rows are then padded per expert to multiples of 16 (fp8_pad_routing).
 * One GPU per process: the GPU parameter store (under parallel/: ZeRO-3/HSDP or data parallel over NCCL)
 * owns the weights behind the views and gathers them unit by unit through the unit hooks; expert
 * parallelism (parallel/expert_parallel_cuda.cuh) runs the experts through the experts' dispatcher.
 * The calls the training loop makes of it are model/api.h's (checked at the end of this file).
 * Emulated (train_dbrx_emu, make test): "device" memory is host memory, the kernels run under the SIMT emulator (test/test_step_cuda.cpp).
 */
#pragma once
#include <string>
#include <vector>
#include "dbrx.h"
#include "residual.cuh"
#include "cuda_common.h"
#include "dbrx_fp8_cuda.cuh"
#include "attention_cp_cuda.cuh"
#include "moe_experts_step.cuh"   // (--moe-gemm grouped: before the recomputation, which calls it too)
#include "dbrx_recompute_cuda.cuh"

template <typename T> struct BlockViews { T *norm1, *wqkv, *wo, *norm2, *router, *w1, *v1, *w2; };
template <typename T> struct ModelViews { T* wte; std::vector<BlockViews<T>> blocks; T* norm_f; T* lm_head; };

// Points the views of one sharding unit into `unit_base`, a buffer laid out as that unit's range of
// the flat buffer (as unit_views does on the CPU: a sharded run gathers a unit into a working slot).
template <typename T> static inline void model_unit_views(ModelViews<T>* p, T* unit_base, int unit, const DbrxConfig* c,
                                                          const std::vector<ParamInfo>& t, int ep_n = 1) {
    size_t i = unit_first_entry(unit, c), start = t[i].offset;
    auto at = [&](size_t j) { return unit_base + (t[j].offset - start); };
    if (unit == 0) { p->wte = at(i); return; }
    if (unit == dbrx_head_unit(c)) { p->norm_f = at(i); p->lm_head = at(i + 1); return; }
    BlockViews<T>& b = p->blocks[dbrx_unit_layer(unit, c)];
    if (dbrx_is_experts_unit(unit, c) && ep_n > 1) {   // expert parallelism: this rank's E/n experts of each, back to back
        size_t local = (size_t)(c->n_experts / ep_n) * c->ffn_hidden * c->d_model;
        b.w1 = unit_base; b.v1 = unit_base + local; b.w2 = unit_base + 2 * local;
        return;
    }
    if (dbrx_is_experts_unit(unit, c)) { b.w1 = at(i); b.v1 = at(i + 1); b.w2 = at(i + 2); return; }
    b.norm1 = at(i); b.wqkv = at(i + 1); b.wo = at(i + 2); b.norm2 = at(i + 3); b.router = at(i + 4);
}

// pointer views of a flat (device) buffer laid out by the parameter table, as param_views
template <typename T> static inline ModelViews<T> model_views(T* base, const DbrxConfig* c, const std::vector<ParamInfo>& t) {
    ModelViews<T> p;
    p.blocks.resize(c->n_layers);
    for (int u = 0; u < dbrx_num_units(c); u++) model_unit_views(&p, base + t[unit_first_entry(u, c)].offset, u, c, t);
    return p;
}

// activations saved by the forward pass, per block (N = B*T tokens, R = N*k routed rows)
typedef struct {
    floatX *ln1; float *ln1_mean, *ln1_rstd;     // (N, d), (N), (N)
    floatX *qkv_pre, *qkv;                       // (N, qkv_dim): before the clamp, after clamp + RoPE
    float* att_lse;                              // (B, H, T) logsumexp of every score row
    floatX *atty, *resid_mid;                    // (N, d)
    floatX *ln2; float *ln2_mean, *ln2_rstd;     // (N, d), (N), (N)
    float *router_logits, *probs, *lse, *topk_w; // (N, E), (N, E), (N), (N, k)
    float* router_stats;                         // (E + 1): column sums of probs, sum of lse^2 (in DbrxGPU::step_out)
    int *topk_idx, *counts, *offsets;            // (N, k), (E), (E + 1)
    int *row_token, *slot_row;                   // (R), (R)
    floatX *xe, *g, *u, *act, *ye; uint8_t* gu_codes; float* gu_sinv;   // (R, d), (R, F) x3, (R, d); --compress-acts' g, u (act_compress.cuh)
    uint8_t* ln1_codes; float* ln1_sinv;         // --compress-acts attn: ln1's codes and factors
    std::vector<int> offsets_host, counts_host;  // host copies (the expert GEMMs are issued from the host)
} BlockActsGPU;

// The experts' dispatcher (model/dbrx.h's ExpertHooks, on the device): expert parallelism
// (parallel/expert_parallel_cuda.cuh) installs it; NULL: every expert is here.
typedef struct {
    // ye (rows, d) = the experts of layer l over xe (rows, d) grouped by expert (offsets_host (E + 1), on
    // the host); train 1: the training forward (FP8 under --fp8), 2: its recomputation (--recompute), 0: generation (BF16)
    void (*forward)(void* ctx, int l, const int* offsets_host, const floatX* xe, floatX* ye, int train);
    // backward of layer l's last training forward: dxe (N k, d) from dye (N k, d), weight gradients into g
    void (*backward)(void* ctx, int l, const floatX* dye, floatX* dxe);
    void* ctx;
} ExpertHooksGPU;

// Generation's KV cache and one token's scratch on the device (model/dbrx.h's DbrxDecode; batch 1): the
// cache in BF16, as the full forward's qkv that it reproduces.
typedef struct {
    int T_max;                        // positions the cache holds (0: not allocated)
    std::vector<floatX*> kv;          // L of (T_max, 2*kv*hd): [K | V] of each position, after clip and RoPE
    float *rope_cos, *rope_sin;       // (T_max, hd/2)
    int* token;                       // (1)
    floatX *x, *ln, *qkv_pre, *qkv, *atty, *attproj, *resid_mid;   // (d), (d), (qkv_dim) x2, (d) x3
    float *ln_mean, *ln_rstd;         // (1), (1)
    float *router_logits, *probs, *lse, *topk_w, *router_stats;   // (E), (E), (1), (k), (E + 1)
    int *topk_idx, *counts, *offsets, *row_token, *slot_row;      // (k), (E), (E + 1), (k), (k)
    floatX *xe, *g, *u, *act, *ye;    // (k, d), (k, F) x3, (k, d)
    float* logits;                    // (V) fp32: what the sampler reads
    std::vector<int> offsets_host;    // (E + 1)
    std::vector<float> logits_host;   // (V)
    std::vector<void*> allocations;
} DbrxDecodeGPU;

typedef struct {
    DbrxConfig cfg;
    std::vector<ParamInfo> table;
    size_t num_params;
    // the parameters: the model reads p (BF16) and accumulates into g (fp32). Who owns the memory
    // behind the views is the parameter store's business (the GPU store under parallel/): the whole model
    // (one GPU, data parallel) or one unit at a time in a gathered slot (ZeRO-3/HSDP, via the hooks).
    // dbrx_build (tests, one GPU without a store) allocates them here: master, grads, m, v, params.
    float *master, *grads, *m, *v;     // fp32, num_params each (dbrx_build only; NULL under a store)
    floatX* params;                    // the BF16 working copy (dbrx_build only)
    ModelViews<floatX> p;
    ModelViews<float> g;
    UnitHooks hooks;                   // the store's per-unit calls (model/dbrx.h); NULL: nothing to gather

    int B, T;
    std::vector<BlockActsGPU> acts;
    std::vector<floatX*> resid;        // L + 1 of (N, d)
    floatX* lnf; float *lnf_mean, *lnf_rstd;   // (N, d), (N), (N)
    floatX* logits;                    // (N, V): the logits, replaced by their gradient in training
    float* losses;                     // (N)
    float *rope_cos, *rope_sin;        // (T, hd/2)
    int *inputs, *targets;             // (N) on the device
    int *emb_unique, *emb_offsets, *emb_positions;   // the embedding-backward plan (N, N + 1, N)
    int emb_U;                         // (the five are one device buffer of 5 N + 1 ints: two copies, dbrx_forward's)
    double attn_share;                 // --doc-mask: the share of the causal attention pairs the mask keeps (1 without; MFU)
    DocMask doc;                       // --doc-mask: this micro-batch's document starts and ends ((N) each, after the five
                                       // in that buffer; model/attention.cuh), start NULL: none; set by dbrx_forward
    int* host_in;                      // its pinned host staging copy (the copy does not wait for the device)
    const int* emb_index;              // (N) the embedding forward's row of each position in p.wte: inputs, or a store's own
    int emb_exchange;                  // in dbrx_forward's unit 0 begin: 1 (2 training): a store may exchange the batch's
                                       // rows instead of gathering the table (parallel/README.md, "The embedding's rows")
    float* step_out;                   // (2 + L (E + 1)) device: the mean loss (a double) and every layer's router
                                       // statistics, brought to the host by one copy per forward
    std::vector<float> step_out_host;
    // scratch shared by the blocks
    floatX* attproj;                   // (N, d) out_proj output before the residual add
    float *dresid, *dln;               // (N, d) fp32
    floatX *dresid_bf16, *datty, *dqkv, *drouter;   // (N, d), (N, d), (N, qkv_dim), (N, E)
    float *dtopk_w, *att_D, *ln_scratch, *norm_partial;
    floatX *dxe, *dye, *da, *dg, *du;  // (R, d) x2, (Rx, F) x3: the routed rows' gradients, BF16 (dxe: model/CUDA.md)
    size_t expert_rows;                // Rx, the rows of the experts' buffers (g, u, act; da, dg, du): R, or EP's planned rows
    std::vector<unsigned char> rc_mode; BlockActsGPU rc_scratch;   // --recompute: each layer's RC_* bits; the shared set
    std::vector<void*> allocations;
    size_t param_bytes, activation_bytes;
    float last_dloss;                  // dloss of the last forward (0: evaluation, no dlogits)
    int grad_first;                    // the next backward is the step's first: it overwrites g (dbrx_grads_overwrite)
    Fp8GPU fp8;                        // --fp8: the FP8 state (recipe FP8_OFF: unused)
    ExpertHooksGPU experts; AttentionHooksGPU attn; VocabHooksGPU vocab;   // the experts' dispatcher, CP's attention, the store's vocabulary gradients (NULL: here)
    DbrxDecodeGPU dec;                 // generation's KV cache and scratch (dbrx_decode_alloc)

    // results of the last forward pass
    double ce_loss, lbl_loss, z_loss, imbalance;
} DbrxGPU;

// Walks every device buffer of the model: allocates it when `m` is given, and adds up the bytes
// either way, so the memory estimate (dry run, out-of-memory message) is the allocation itself.
// With FP8 (fp8 != NULL, recipe not off) the routed-row buffers have room for the padded layout,
// and the FP8 scratch and state are included. expert_rows (0: R): the rows of the experts' activations and
// gradients, under expert parallelism the planned received rows (parallel/expert_parallel_cuda.cuh). fp8_weight_cache: the
// weights stay in place (no shard group gathers them): FP8 keeps their quantised copies (fp8_weight_gpu, once per step).
// ep_n: the EP degree (FP8's weight scratch holds a rank's E / ep_n experts); fp8_hold: a third weight scratch for the
// chunked exchange (fp8_gpu_buffers).
static inline size_t dbrx_gpu_buffers(DbrxGPU* m, const DbrxConfig* c, int B, int T, size_t* param_bytes, const Fp8Config* fp8 = nullptr,
                                      bool with_params = true, size_t expert_rows = 0, bool fp8_weight_cache = false, int ep_n = 1,
                                      bool fp8_hold = false) {
    bool with_fp8 = fp8 && fp8->recipe != FP8_OFF;
    size_t bytes = 0, N = (size_t)B * T, d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden;
    size_t R = N * k + (with_fp8 ? fp8_row_padding(c) : 0), qd = qkv_dim(c), V = c->vocab_size, P = (size_t)params_total(c);
    size_t Rx = expert_rows ? expert_rows : R;
    auto take = [&](void** p, size_t n) {
        bytes += n;
        if (m) {
            cudaError_t err = cudaMalloc(p, n ? n : 1);
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                *p = nullptr;
                return false;
            }
            m->allocations.push_back(*p);
        }
        return true;
    };
    bool ok = true;
    DbrxGPU sizing;   // without `m`, the walk fills the pointers of a throw-away model
    DbrxGPU* mm = m ? m : &sizing;
    if (!m) { sizing.acts.resize(c->n_layers); sizing.resid.resize(c->n_layers + 1); sizing.fp8.cfg.recipe = FP8_OFF; }
#define TAKE(ptr, type, n) ok = take((void**)&(ptr), (size_t)(n) * sizeof(type)) && ok
    // parameters: fp32 master, gradients, two moments; BF16 working copy (unless a store owns them)
    if (with_params) {
        TAKE(mm->master, float, P); TAKE(mm->grads, float, P); TAKE(mm->m, float, P); TAKE(mm->v, float, P);
        TAKE(mm->params, floatX, P);
    }
    if (param_bytes) *param_bytes = bytes;
    // per block; a buffer the layer's --recompute drops points into one shared set (model/dbrx_recompute_cuda.cuh)
    // (under expert parallelism, expert_rows > 0, every layer's xe is the shared one: RC_XE, model/recompute.h)
    int ep_xe = expert_rows ? RC_XE : 0;
    int U = (recompute_check(&g_recompute, c->n_layers), recompute_union(&g_recompute, c->n_layers)) | ep_xe;
    bool act_kept = gpu_act_kept(c->ffn_hidden, with_fp8);   // (0 bytes: no buffer, the pointer NULL)
    if (U) gpu_block_acts_fields<BlockActsGPU>(c, N, R, Rx, act_kept, [&](auto f, size_t n, int bit) {
        if (recompute_buffer_place(U, bit) == 1 && n) ok = take((void**)&(mm->rc_scratch.*f), n) && ok;
    });
    mm->rc_mode.assign(c->n_layers, 0);
    for (int l = 0; l < c->n_layers; l++) {
        BlockActsGPU& a = mm->acts[l];
        int mode = mm->rc_mode[l] = (unsigned char)recompute_mode(&g_recompute, l);
        gpu_block_acts_fields<BlockActsGPU>(c, N, R, Rx, act_kept, [&](auto f, size_t n, int bit) {
            int place = recompute_buffer_place(mode | ep_xe, bit);   // (0: its own, 1: the shared scratch, 2: none)
            if (n == 0) a.*f = nullptr;
            else if (place) a.*f = place == 1 ? mm->rc_scratch.*f : nullptr;
            else ok = take((void**)&(a.*f), n) && ok;
        });
        if (m) a.u = a.g + Rx * F;   // (g and u one buffer: w1 and v1 as one batched GEMM, model/moe.cuh)
    }
    TAKE(mm->step_out, float, 2 + (size_t)c->n_layers * (E + 1));
    if (m) for (int l = 0; l < c->n_layers; l++) mm->acts[l].router_stats = mm->step_out + 2 + (size_t)l * (E + 1);
    for (int l = 0; l <= c->n_layers; l++) TAKE(mm->resid[l], floatX, N * d);
    TAKE(mm->lnf, floatX, N * d); TAKE(mm->lnf_mean, float, N); TAKE(mm->lnf_rstd, float, N);
    TAKE(mm->logits, floatX, N * V); TAKE(mm->losses, float, N);
    TAKE(mm->rope_cos, float, (size_t)T * c->head_dim / 2); TAKE(mm->rope_sin, float, (size_t)T * c->head_dim / 2);
    TAKE(mm->inputs, int, 7 * N + 1);   // inputs, targets, the embedding plan's unique, offsets, positions, the documents' starts, ends
    if (m) {
        mm->targets = mm->inputs + N;
        mm->emb_unique = mm->inputs + 2 * N; mm->emb_offsets = mm->inputs + 3 * N; mm->emb_positions = mm->inputs + 4 * N + 1;
    }
    TAKE(mm->attproj, floatX, N * d);
    TAKE(mm->dresid, float, N * d); TAKE(mm->dln, float, N * d);
    TAKE(mm->dresid_bf16, floatX, N * d); TAKE(mm->datty, floatX, N * d);
    TAKE(mm->dqkv, floatX, N * qd); TAKE(mm->drouter, floatX, N * E);
    TAKE(mm->dtopk_w, float, N * k); TAKE(mm->dxe, floatX, R * d);
    TAKE(mm->att_D, float, attention_backward_scratch_floats(B, T, c->n_heads, c->head_dim));   // D (B, H, T)
    TAKE(mm->ln_scratch, float, layernorm_backward_scratch((int)N, (int)d));
    TAKE(mm->norm_partial, float, GRAD_NORM_SCRATCH);
    TAKE(mm->dye, floatX, R * d); TAKE(mm->da, floatX, Rx * F); TAKE(mm->dg, floatX, 2 * Rx * F);
    if (m) { mm->du = mm->dg + Rx * F; mm->expert_rows = Rx; }
    if (with_fp8) {
        if (!m) fp8_gpu_setup(&mm->fp8, fp8, c, B, T, fp8_weight_cache);   // the sizing walk: the slots only
        fp8_gpu_buffers(&mm->fp8, c, B, T, [&](void** p, size_t n) { ok = take(p, n) && ok; }, ep_n, fp8_hold);
    }
#undef TAKE
    if (!ok) return 0;
    return bytes;
}

// the device memory the model needs (parameters, optimizer state, activations, scratch), in bytes;
// with_params false: activations and scratch only (a parameter store owns the rest)
static inline size_t dbrx_gpu_memory_estimate(const DbrxConfig* c, int B, int T, size_t* param_bytes, const Fp8Config* fp8 = nullptr,
                                              bool with_params = true, size_t expert_rows = 0, bool fp8_weight_cache = false, int ep_n = 1,
                                              bool fp8_hold = false) {
    return dbrx_gpu_buffers(nullptr, c, B, T, param_bytes, fp8, with_params, expert_rows, fp8_weight_cache, ep_n, fp8_hold);
}

static inline std::string gib(double bytes) { char b[32]; snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0)); return b; }

// Out of memory: one clear line with the estimate and what to change (exit 1). param_bytes: the
// parameter state's share of `need` (a store's shard, or the whole model's). Where the estimate fitted the free memory
// and an allocation failed all the same, the line says so (memory taken meanwhile, or free only in pieces).
[[noreturn]] static inline void dbrx_gpu_out_of_memory(const DbrxConfig* c, int B, int T, size_t need, size_t param_bytes) {
    size_t free_b = 0, total = 0;
    (void)cudaGetLastError();   // (the failed allocation's error, if that is how we got here)
    cudaMemGetInfo(&free_b, &total);
    fail(EXIT_RUNTIME, "out of GPU memory: the run needs %s per GPU (parameter state %s: fp32 master, grads, optimizer moments "
         "and bf16 copy of this rank's shard plus the gathered slots; activations and scratch %s for micro-batch %d x %d of "
         "a %.2f%s-parameter model); the GPU has %s free of %s%s. Lower --batch or --seq, shard over more GPUs (mpirun -np, "
         "--shard-group-size), or use a smaller --model", gib((double)need).c_str(), gib((double)param_bytes).c_str(),
         gib((double)(need - param_bytes)).c_str(), B, T, (double)params_total(c) >= 1e9 ? params_total(c) / 1e9 : params_total(c) / 1e6,
         (double)params_total(c) >= 1e9 ? "B" : "M", gib((double)free_b).c_str(), gib((double)total).c_str(),
         need <= free_b ? ", yet one of the model's allocations failed (another process took memory, or it is free only in pieces)" : "");
}

// Everything but the parameter state: the table, the activations and scratch for micro-batches of
// (B, T), the FP8 state, the RoPE tables; on the current device. The views p and g are set by the
// parameter store (the GPU store under parallel/) or by dbrx_build. store_bytes: what the store will
// allocate, for the out-of-memory check; expert_rows, fp8_weight_cache, ep_n, fp8_hold: dbrx_gpu_buffers'.
static inline void dbrx_build_shape(DbrxGPU* m, const DbrxConfig* cfg, int B, int T, const Fp8Config* fp8 = nullptr,
                                    size_t store_bytes = 0, size_t expert_rows = 0, bool fp8_weight_cache = false, int ep_n = 1,
                                    bool fp8_hold = false) {
    config_validate(cfg);
    if (T > cfg->max_seq_len) fail(EXIT_BAD_INPUT, "--seq %d is longer than the model's max_seq_len %d", T, cfg->max_seq_len);
    attention_check_shape(cfg->n_heads, cfg->kv_heads, cfg->head_dim);
    m->cfg = *cfg;
    m->table = dbrx_param_table(cfg);
    m->num_params = m->table.back().offset + m->table.back().numel;
    m->B = B; m->T = T;
    m->master = m->grads = m->m = m->v = nullptr;
    m->params = nullptr;
    m->hooks = UnitHooks{NULL, NULL, NULL};
    m->host_in = nullptr;
    m->emb_index = nullptr; m->emb_exchange = 0;
    m->doc = DocMask{};
    m->experts = ExpertHooksGPU{NULL, NULL, NULL}; m->attn = AttentionHooksGPU{NULL, NULL, NULL, NULL, NULL, NULL}; m->vocab = VocabHooksGPU{NULL, NULL};
    m->acts.assign(cfg->n_layers, BlockActsGPU());
    m->resid.assign(cfg->n_layers + 1, nullptr);
    m->p.blocks.resize(cfg->n_layers);
    m->g.blocks.resize(cfg->n_layers);
    fp8_gpu_setup(&m->fp8, fp8, cfg, B, T, fp8_weight_cache);
    size_t acts = dbrx_gpu_memory_estimate(cfg, B, T, nullptr, fp8, false, expert_rows, fp8_weight_cache, ep_n, fp8_hold);
    size_t free_b = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total));
    if (acts + store_bytes > free_b) dbrx_gpu_out_of_memory(cfg, B, T, acts + store_bytes, store_bytes);
    if (dbrx_gpu_buffers(m, cfg, B, T, nullptr, fp8, false, expert_rows, fp8_weight_cache, ep_n, fp8_hold) == 0) dbrx_gpu_out_of_memory(cfg, B, T, acts + store_bytes, store_bytes);
    fp8_gpu_reset(&m->fp8);
    cudaCheck(cudaMallocHost((void**)&m->host_in, (7 * (size_t)B * T + 1) * sizeof(int)));
    m->step_out_host.assign(2 + (size_t)cfg->n_layers * (cfg->n_experts + 1), 0.0f);
    m->param_bytes = 0;
    m->activation_bytes = acts;
    for (BlockActsGPU& a : m->acts) { a.offsets_host.assign(cfg->n_experts + 1, 0); a.counts_host.assign(cfg->n_experts, 0); }
    std::vector<real> c((size_t)T * cfg->head_dim / 2), s((size_t)T * cfg->head_dim / 2);
    rope_tables(c.data(), s.data(), T, cfg->head_dim, cfg->rope_theta);
    std::vector<float> cf(c.begin(), c.end()), sf(s.begin(), s.end());
    cudaCheck(cudaMemcpy(m->rope_cos, cf.data(), cf.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(m->rope_sin, sf.data(), sf.size() * sizeof(float), cudaMemcpyHostToDevice));
    m->last_dloss = 0;
    m->grad_first = 0;
    m->ce_loss = m->lbl_loss = m->z_loss = m->imbalance = 0;
    m->dec.T_max = 0;
}

// The model with its own parameter state, for one GPU without a store (the tests): dbrx_build_shape,
// then fp32 master, gradients, moments and the BF16 copy of the whole model, initialised as the CPU
// reference is (dbrx_init_range: the same seed gives the same model on both backends).
static inline void dbrx_build(DbrxGPU* m, const DbrxConfig* cfg, int B, int T, uint64_t seed, const Fp8Config* fp8 = nullptr) {
    size_t P = (size_t)params_total(cfg);
    dbrx_build_shape(m, cfg, B, T, fp8, P * (4 * sizeof(float) + sizeof(floatX)), 0, true);   // (its weights stay in place)
    m->master = deviceAlloc(float, P); m->grads = deviceAlloc(float, P);
    m->m = deviceAlloc(float, P); m->v = deviceAlloc(float, P); m->params = deviceAlloc(floatX, P);
    for (void* q : {(void*)m->master, (void*)m->grads, (void*)m->m, (void*)m->v, (void*)m->params}) m->allocations.push_back(q);
    m->param_bytes = P * (4 * sizeof(float) + sizeof(floatX));
    m->p = model_views(m->params, cfg, m->table);
    m->g = model_views(m->grads, cfg, m->table);
    std::vector<real> host(m->num_params);
    dbrx_init_range(host.data(), 0, m->num_params, cfg, m->table, seed);
    std::vector<float> master(host.begin(), host.end());
    cudaCheck(cudaMemcpy(m->master, master.data(), m->num_params * sizeof(float), cudaMemcpyHostToDevice));
    to_device_bf16(m->params, master.data(), m->num_params);
    cudaCheck(cudaMemset(m->grads, 0, m->num_params * sizeof(float)));
    cudaCheck(cudaMemset(m->m, 0, m->num_params * sizeof(float)));
    cudaCheck(cudaMemset(m->v, 0, m->num_params * sizeof(float)));
}

static inline void dbrx_decode_free(DbrxGPU* m) {
    for (void* p : m->dec.allocations) cudaCheck(cudaFree(p));
    m->dec.allocations.clear();
    m->dec.T_max = 0;
}

static inline void dbrx_free(DbrxGPU* m) {
    dbrx_decode_free(m);
    for (void* p : m->allocations) cudaCheck(cudaFree(p));
    m->allocations.clear();
    if (m->host_in) cudaCheck(cudaFreeHost(m->host_in));
    m->host_in = nullptr;
}

// sets the master weights (host, num_params) and their BF16 copy (dbrx_build's model)
static inline void dbrx_set_params(DbrxGPU* m, const float* host) {
    cudaCheck(cudaMemcpy(m->master, host, m->num_params * sizeof(float), cudaMemcpyHostToDevice));
    to_device_bf16(m->params, host, m->num_params);
}

static inline void unit_begin(DbrxGPU* m, int unit, int phase) { if (m->hooks.begin) m->hooks.begin(m->hooks.ctx, unit, phase); }
static inline void unit_end(DbrxGPU* m, int unit, int phase) { if (m->hooks.end) m->hooks.end(m->hooks.ctx, unit, phase); }
// where --profile times this model's ranges: events on its stream, the null stream (model/profile.h)
static inline ProfTrack dbrx_prof_track(const DbrxGPU* m) { (void)m; return prof_stream(0, "compute"); }

// every FP8 operand state with its name and format, in the order of the CPU's dbrx_fp8_metas (the
// host bookkeeping: fp8_gpu_collect brings this step's amaxes into it)
static inline std::vector<Fp8MetaRef> dbrx_fp8_metas(DbrxGPU* m) {
    std::vector<Fp8MetaRef> refs;
    if (!fp8_on(&m->fp8)) return refs;
    for (int i = 0; i < m->fp8.nslots; i++) refs.push_back({m->fp8.names[i], &m->fp8.metas[i], m->fp8.fmts[i]});
    return refs;
}

// ---------------------------------------------------------------------------------------------
// The block's five GEMMs, each one call that picks its numerics (as model/dbrx.h's): BF16 cuBLASLt,
// or under --fp8 cuBLASLt FP8 on operands quantised with layer l's slots (model/dbrx_fp8_cuda.cuh).

// out (N, OC) = inp (N, C) @ weight (OC, C)^T; lin: FP8_LIN_QKV or FP8_LIN_PROJ
template <typename TO>
static inline void block_linear_forward(DbrxGPU* m, int l, int lin, TO* out, const floatX* inp, const floatX* weight, int N, int C, int OC) {
    if (fp8_on(&m->fp8)) fp8_matmul_forward_gpu(&m->fp8, l, lin, out, inp, weight, N, C, OC);
    else matmul_forward_gpu(out, inp, weight, N, C, OC);
}
// dinp (N, C) = dout @ weight, dweight += dout^T @ inp
template <typename TI>
static inline void block_linear_backward(DbrxGPU* m, int l, int lin, TI* dinp, float* dweight, const floatX* dout, const floatX* inp,
                                         const floatX* weight, int N, int C, int OC, float wbeta) {
    if (fp8_on(&m->fp8)) fp8_matmul_backward_gpu(&m->fp8, l, lin, dinp, dweight, dout, inp, weight, N, C, OC, 0.0f, 0, wbeta);
    else matmul_backward_gpu(dinp, dweight, dout, inp, weight, N, C, OC, 0.0f, 0, wbeta);
}

// The routed rows of block l gathered from ln2 (xe), and the SwiGLU experts over them (ye). Under FP8
// every expert's rows are padded to a multiple of 16 first (slot_row remapped in place). A dispatcher
// (m->experts: expert parallelism) takes the gathered rows instead.
static inline void block_experts_forward(DbrxGPU* m, int l, BlockActsGPU* a, const BlockViews<floatX>& w) {
    const DbrxConfig* c = &m->cfg;
    int N = m->B * m->T, d = c->d_model, E = c->n_experts, k = c->top_k, F = c->ffn_hidden;
    if (m->experts.forward) {
        if (g_moe_grouped) fail(EXIT_BAD_INPUT, "--moe-gemm grouped: not with the store's chunked experts (--zero-chunk-mib) or expert parallelism");
        moe_gather_gpu(a->xe, a->ln2, a->row_token, N * k, d);
        m->experts.forward(m->experts.ctx, l, a->offsets_host.data(), a->xe, a->ye, 1);
        return;
    }
    if (fp8_on(&m->fp8)) {
        const int* row_token = fp8_pad_routing(&m->fp8, l, a->slot_row, a->row_token, a->offsets, a->offsets_host.data(), N * k, E);
        // (gathers xe; its transposed codes for the backward in its place, unless --recompute swiglu reads xe again)
        bool xe_codes = !(m->rc_mode[l] & (RC_SWIGLU | RC_XE));
        fp8_experts_forward_gpu(&m->fp8, l, a->ye, a->g, a->u, a->act, a->xe, w.w1, w.v1, w.w2, E, d, F, 0, a->ln2, row_token, xe_codes);
    } else {
        moe_gather_gpu(a->xe, a->ln2, a->row_token, N * k, d);
        experts_forward_step_gpu(a->ye, a->g, a->u, a->act, a->xe, w.w1, w.v1, w.w2, a->offsets, a->offsets_host.data(), N * k, E, d, F);
    }
}
// Backward of block_experts_forward from dye (m->dye): the weight gradients into gw (wbeta 0: overwritten), dxe (m->dxe).
static inline void block_experts_backward(DbrxGPU* m, int l, BlockActsGPU* a, const BlockViews<floatX>& w, const BlockViews<float>& gw,
                                          float wbeta) {
    if (m->experts.backward) { m->experts.backward(m->experts.ctx, l, m->dye, m->dxe); return; }
    const DbrxConfig* c = &m->cfg;
    int d = c->d_model, E = c->n_experts, F = c->ffn_hidden;
    if (fp8_on(&m->fp8)) fp8_experts_backward_gpu(&m->fp8, l, m->dxe, gw.w1, gw.v1, gw.w2, m->da, m->dg, m->du, m->dye, a->xe, a->g,
                                                  a->u, w.w1, w.v1, w.w2, E, d, F, 0, wbeta);
    else experts_backward_step_gpu(m->dxe, gw.w1, gw.v1, gw.w2, m->da, m->dg, m->du, m->dye, a->xe, a->g, a->u, a->act, w.w1, w.v1,
                                   w.w2, a->offsets, a->offsets_host.data(), m->B * m->T * c->top_k, E, d, F, wbeta);
    if (wbeta == 0.0f && !g_moe_grouped)   // (overwriting: an expert without rows wrote nothing; the grouped weight
                                           // gradients write its zeros themselves; --fp8 refuses grouped)
        experts_zero_empty_gpu(gw.w1, gw.v1, gw.w2, a->offsets, E, (size_t)F * d);
}

// ---------------------------------------------------------------------------------------------
// forward: inputs, targets (B, T) token ids on the host. Returns the cross-entropy; sets
// ce/lbl/z/imbalance. dloss > 0 (training: 1 / grad_accum) makes the fused classifier leave the
// gradient of dloss * mean cross-entropy in m->logits for dbrx_backward; 0 = evaluation.

// The embedding backward's plan for the batch's tokens (inputs, N): a counting sort over the vocabulary, built on the
// host, which has the tokens, into the staging buffer after the tokens and targets, and its asynchronous copy into
// emb_unique, emb_offsets, emb_positions (one device buffer with m->inputs). dbrx_forward calls it once layer 0's
// attention is queued: built before the embedding, its ~0.7 ms left the GPU idle at the start of every micro-batch
// (the H100 profile of 2026-11-27, dev/bench/results_gpu.md: 0.68 ms between "forward" and "embedding").
static inline void dbrx_upload_embedding_plan(DbrxGPU* m, const int* inputs) {
    int N = m->B * m->T, V = m->cfg.vocab_size;
    int* hplan = m->host_in + 2 * (size_t)N;   // (B, T) x 3 + 1: unique, offsets, positions, as the device buffer
    EmbeddingPlan plan;
    embedding_plan_build(&plan, inputs, N, V);
    m->emb_U = (int)plan.unique.size();
    memcpy(hplan, plan.unique.data(), plan.unique.size() * sizeof(int));
    memcpy(hplan + N, plan.offsets.data(), plan.offsets.size() * sizeof(int));
    memcpy(hplan + 2 * N + 1, plan.positions.data(), plan.positions.size() * sizeof(int));
    cudaCheck(cudaMemcpyAsync(m->emb_unique, hplan, (3 * (size_t)N + 1) * sizeof(int), cudaMemcpyHostToDevice, 0));
}

static inline double dbrx_forward(DbrxGPU* m, const int* inputs, const int* targets, float dloss) {
    const DbrxConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim;
    int E = c->n_experts, k = c->top_k, qd = qkv_dim(c), L = c->n_layers, V = c->vocab_size;
    // The tokens and the targets travel in one asynchronous copy from the pinned staging buffer (the embedding
    // backward's plan follows in a second one, dbrx_upload_embedding_plan, once layer 0's attention is queued).
    // Reusing that buffer in the next forward is safe: this forward's first synchronisation (the expert offsets of
    // layer 0) comes after both copies on the same stream.
    int* hin = m->host_in;
    memcpy(hin, inputs, N * sizeof(int));
    memcpy(hin + N, targets, N * sizeof(int));
    cudaCheck(cudaMemcpyAsync(m->inputs, hin, 2 * (size_t)N * sizeof(int), cudaMemcpyHostToDevice, 0));
    m->doc = DocMask{};   // --doc-mask: this batch's documents (model/attention.cuh), which the backward reads too (under
    if (g_doc_mask_eot >= 0 && !m->attn.batch) {   // context parallelism the group's: its batch hook's below)
        int* hdoc = hin + 5 * (size_t)N + 1;
        doc_bounds(hdoc, hdoc + N, inputs, B, T, g_doc_mask_eot);
        int* ddoc = m->inputs + 5 * (size_t)N + 1;
        cudaCheck(cudaMemcpyAsync(ddoc, hdoc, 2 * (size_t)N * sizeof(int), cudaMemcpyHostToDevice, 0));
        m->doc = DocMask{ddoc, ddoc + N};
    }
    m->attn_share = g_doc_mask_eot < 0 ? 1.0 : m->attn.batch ? m->attn.batch(m->attn.ctx, inputs)   // (context parallelism: the
                                       : doc_attended_share(inputs, B, T, g_doc_mask_eot);          // documents span the group's chunks)
    ProfTrack pt = dbrx_prof_track(m);   // (--profile: the ranges begin after the unit hooks' waits for the gathers)
    m->emb_index = m->inputs;
    m->emb_exchange = dloss > 0 ? 2 : 1;   // (a store may set p.wte to this batch's rows and emb_index to their order)
    unit_begin(m, 0, UNIT_FORWARD);
    m->emb_exchange = 0;
    prof_begin(pt, "layer", "embedding");
    embedding_forward_gpu(m->resid[0], m->emb_index, m->p.wte, N, d);
    prof_end(pt);
    unit_end(m, 0, UNIT_FORWARD);
    m->lbl_loss = 0; m->z_loss = 0; m->imbalance = 0;
    // DBRX_DEBUG_PLANT=step_sync: one more synchronisation per layer, the step budget test's negative control
    bool plant_sync = g_debug_hooks.plant == PLANT_STEP_SYNC;
    for (int l = 0; l < L; l++) {
        unit_begin(m, dbrx_block_unit(l), UNIT_FORWARD);
        const BlockViews<floatX>& w = m->p.blocks[l];   // (a reference: the experts' views are set when their unit begins)
        BlockActsGPU* a = &m->acts[l];
        floatX* x = m->resid[l];
        // attention half
        prof_begin(pt, "layer", "layer %d attention", l);
        layernorm_forward_gpu(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.norm1, N, d, c->ln_eps);
        block_linear_forward(m, l, FP8_LIN_QKV, a->qkv_pre, a->ln1, w.wqkv, N, d, qd);
        gpu_compress_attn(m, l, dloss);   // (--compress-acts attn)
        clip_rope_forward_gpu(a->qkv, a->qkv_pre, m->rope_cos, m->rope_sin, B, T, H, KV, hd, c->clip_qkv);
        attention_hooked_forward_gpu(&m->attn, a->atty, a->att_lse, a->qkv, B, T, H, KV, hd, m->doc);
        block_linear_forward(m, l, FP8_LIN_PROJ, m->attproj, a->atty, w.wo, N, d, d);
        if (l == 0 && dloss > 0) dbrx_upload_embedding_plan(m, inputs);   // (the host's work while the GPU runs layer 0)
        // MoE half: resid_mid = x + attproj and its LayerNorm, in one kernel
        prof_next(pt, "layer", "layer %d router", l);
        residual_layernorm_forward_gpu(a->ln2, a->resid_mid, a->ln2_mean, a->ln2_rstd, x, m->attproj, w.norm2, N, d, c->ln_eps);
        matmul_forward_gpu(a->router_logits, a->ln2, w.router, N, d, E);
        if (g_debug_hooks.route_first) route_first_gpu(a->router_logits, N, E, k);   // (the tests' forced imbalance)
        if (g_debug_hooks.route_balanced) route_balanced_gpu(a->router_logits, N, E, k);   // (benchmarks' balanced routing)
        router_forward_gpu(a->probs, a->lse, a->topk_idx, a->topk_w, a->counts, a->router_stats, a->router_logits, N, E, k,
                           c->moe_norm_p);
        moe_dispatch_gpu(a->offsets, a->row_token, a->slot_row, a->offsets_host.data(), a->topk_idx, a->counts, N, E, k);
        prof_end(pt);
        unit_end(m, dbrx_block_unit(l), UNIT_FORWARD);
        unit_begin(m, dbrx_experts_unit(l), UNIT_FORWARD);
        prof_begin(pt, "layer", "layer %d experts", l);
        block_experts_forward(m, l, a, w);
        gpu_compress_experts(m, l, dloss);   // (--compress-acts)
        unit_end(m, dbrx_experts_unit(l), UNIT_FORWARD);
        moe_combine_forward_gpu(m->resid[l + 1], a->resid_mid, a->ye, a->topk_w, a->slot_row, N, k, d);
        prof_end(pt);
        if (plant_sync) cudaCheck(cudaStreamSynchronize(0));
    }
    unit_begin(m, dbrx_head_unit(c), UNIT_FORWARD);
    prof_begin(pt, "layer", "lm_head + loss");
    layernorm_forward_gpu(m->lnf, m->lnf_mean, m->lnf_rstd, m->resid[L], m->p.norm_f, N, d, c->ln_eps);
    matmul_forward_gpu(m->logits, m->lnf, m->p.lm_head, N, d, V);
    unit_end(m, dbrx_head_unit(c), UNIT_FORWARD);
    classifier_fused_gpu(m->logits, m->losses, m->targets, N, V, dloss / N, dloss > 0);
    // one copy brings the mean loss and every layer's router statistics (the forward's last synchronisation)
    loss_mean_gpu((double*)m->step_out, m->losses, N);
    prof_end(pt);
    std::vector<float>& so = m->step_out_host;
    cudaCheck(cudaMemcpy(so.data(), m->step_out, so.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double mean;
    memcpy(&mean, so.data(), sizeof mean);
    m->ce_loss = mean;
    // auxiliary losses and the load statistic (the counts follow from the offsets already on the host); CP: the
    // load-balancing loss over the group's tokens, from every layer's counts and probability sums (st, the hook's)
    std::vector<double> st(m->attn.lbl ? (size_t)L * 2 * E : 0);
    for (int l = 0; l < L; l++) {
        BlockActsGPU* a = &m->acts[l];
        const float* stats = so.data() + 2 + (size_t)l * (E + 1);
        int maxc = 0;
        for (int e = 0; e < E; e++) {
            a->counts_host[e] = a->offsets_host[e + 1] - a->offsets_host[e];
            if (a->counts_host[e] > maxc) maxc = a->counts_host[e];
        }
        if (m->attn.lbl) for (int e = 0; e < E; e++) st[(size_t)l * 2 * E + e] = a->counts_host[e], st[(size_t)(l * 2 + 1) * E + e] = stats[e];
        else m->lbl_loss += lbl_from_stats(a->counts_host.data(), stats, N, E, k, L, c->moe_loss_weight);
        m->z_loss += zloss_from_stats(stats, N, E, L, c->z_loss_weight);
        double imb = (double)maxc / ((double)N * k / E);
        if (imb > m->imbalance) m->imbalance = imb;
    }
    if (m->attn.lbl) m->lbl_loss = m->attn.lbl(m->attn.ctx, st.data(), N, E, k, L, c->moe_loss_weight);
    m->last_dloss = dloss;
    return m->ce_loss;
}

// backward of dloss * (ce + lbl + z) of the last forward (which must have been given the same
// dloss); gradients are ACCUMULATED into the views g, as on the CPU, but in the step's first backward
// (m->grad_first, set by the store where dbrx_grads_overwrite) every weight gradient is written, not added
// (GEMM beta 0, the norms' column sums =, an expert without rows and the embedding zeroed first), so that
// nothing has to zero g between steps. inputs and targets are the forward's (already on the device: unused
// here, the signature is the CPU's).
static inline void dbrx_backward(DbrxGPU* m, const int* inputs, const int* targets, float dloss) {
    (void)inputs; (void)targets;
    const DbrxConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim;
    int E = c->n_experts, k = c->top_k, qd = qkv_dim(c), L = c->n_layers, V = c->vocab_size;
    ENSURE(m->last_dloss == dloss && dloss > 0, "dbrx_backward(dloss %g) after a forward with dloss %g", dloss, m->last_dloss);
    float wb = m->grad_first ? 0.0f : 1.0f;   // the weight gradients' beta (0: overwritten)
    int wacc = !m->grad_first;
    m->grad_first = 0;
    // m->logits holds dlogits (the fused classifier wrote them)
    ProfTrack pt = dbrx_prof_track(m);
    unit_begin(m, dbrx_head_unit(c), UNIT_BACKWARD);
    prof_begin(pt, "layer", "lm_head + loss");
    if (m->vocab.backward) m->vocab.backward(m->vocab.ctx, dbrx_head_unit(c));   // (the same, its weight gradients in chunks)
    else { float hb = g_debug_hooks.plant == PLANT_STALE_GRAD ? 1.0f : wb;   // (the plant: lm_head's stale gradient left in)
    matmul_backward_gpu(m->dln, m->g.lm_head, m->logits, m->lnf, m->p.lm_head, N, d, V, 0.0f, 0, hb);
    cudaCheck(cudaMemset(m->dresid, 0, (size_t)N * d * sizeof(float)));
    layernorm_backward_gpu(m->dresid, (floatX*)nullptr, m->g.norm_f, m->ln_scratch, m->dln, m->resid[L], m->p.norm_f,
                           m->lnf_mean, m->lnf_rstd, N, d, 0, wacc); }
    prof_end(pt);
    unit_end(m, dbrx_head_unit(c), UNIT_BACKWARD);
    for (int l = L - 1; l >= 0; l--) {
        int rc = m->rc_mode[l];   // --recompute: what this layer's forward did not keep (model/dbrx_recompute_cuda.cuh)
        if (rc & RC_MOE) gpu_recompute_block_half(m, l, rc);
        unit_begin(m, dbrx_experts_unit(l), UNIT_BACKWARD);
        const BlockViews<floatX>& w = m->p.blocks[l];
        const BlockViews<float>& gw = m->g.blocks[l];
        BlockActsGPU* a = &m->acts[l];
        // dresid = d loss / d resid[l+1]; the residual passes it to resid_mid unchanged
        // MoE half
        prof_begin(pt, "layer", "layer %d experts", l);
        if (rc & (RC_SWIGLU | RC_CSWIGLU)) gpu_recompute_experts(m, l, rc);
        moe_combine_backward_gpu(m->dye, m->dtopk_w, m->dresid, a->ye, a->topk_w, a->slot_row, N, k, d);
        block_experts_backward(m, l, a, w, gw, wb);
        prof_end(pt);
        unit_end(m, dbrx_experts_unit(l), UNIT_BACKWARD);
        unit_begin(m, dbrx_block_unit(l), UNIT_BACKWARD);
        prof_begin(pt, "layer", "layer %d router", l);
        const int* lc = a->counts;   // (CP: the group's counts and the weight / n: lbl_counts)
        float lw = m->attn.lbl ? m->attn.lbl_counts(m->attn.ctx, l, c->moe_loss_weight, &lc) : c->moe_loss_weight;
        router_backward_gpu(m->drouter, m->dtopk_w, a->probs, a->lse, a->topk_idx, a->topk_w, lc, N, E, k, L, lw,
                            c->z_loss_weight, dloss, c->moe_norm_p);
        // dln = the routed rows' gradients summed per token + drouter w.router (one pass: moe.cuh), then d w.router
        moe_gather_router_backward_gpu(m->dln, m->dxe, a->slot_row, m->drouter, w.router, N, k, d, E);
        matmul_backward_gpu((float*)nullptr, gw.router, m->drouter, a->ln2, w.router, N, d, E, 0.0f, 0, wb);
        layernorm_backward_gpu(m->dresid, m->dresid_bf16, gw.norm2, m->ln_scratch, m->dln, a->resid_mid, w.norm2, a->ln2_mean,
                               a->ln2_rstd, N, d, 0, wacc);
        // attention half: dresid is now d loss / d resid_mid
        prof_next(pt, "layer", "layer %d attention", l);
        if ((rc & RC_ATTN) && !(rc & RC_BLOCK)) attention_hooked_forward_gpu(&m->attn, a->atty, a->att_lse, a->qkv, B, T, H, KV, hd, m->doc);   // (the same lse)
        block_linear_backward(m, l, FP8_LIN_PROJ, m->datty, gw.wo, m->dresid_bf16, a->atty, w.wo, N, d, d, wb);
        attention_hooked_backward_gpu(&m->attn, m->dqkv, m->att_D, m->datty, a->atty, a->att_lse, a->qkv, B, T, H, KV, hd, m->doc);
        clip_rope_backward_gpu(m->dqkv, a->qkv_pre, m->rope_cos, m->rope_sin, B, T, H, KV, hd, c->clip_qkv);
        if (rc & RC_CATTN) gpu_decompress_attn(m, l);   // (--compress-acts attn: ln1 rebuilt)
        block_linear_backward(m, l, FP8_LIN_QKV, m->dln, gw.wqkv, m->dqkv, a->ln1, w.wqkv, N, d, qd, wb);
        layernorm_backward_gpu(m->dresid, (floatX*)nullptr, gw.norm1, m->ln_scratch, m->dln, m->resid[l], w.norm1, a->ln1_mean,
                               a->ln1_rstd, N, d, 0, wacc);
        prof_end(pt);
        unit_end(m, dbrx_block_unit(l), UNIT_BACKWARD);
    }
    unit_begin(m, 0, UNIT_BACKWARD_GRADS_ONLY);
    prof_begin(pt, "layer", "embedding");
    if (m->vocab.backward) m->vocab.backward(m->vocab.ctx, 0);
    else {   // (the rows of tokens not in the batch get nothing: zeroed first when overwriting)
        if (!wacc) cudaCheck(cudaMemsetAsync(m->g.wte, 0, (size_t)V * d * sizeof(float), 0));
        embedding_backward_gpu(m->g.wte, m->dresid, m->emb_unique, m->emb_offsets, m->emb_positions, m->emb_U, d);
    }
    prof_end(pt);
    unit_end(m, 0, UNIT_BACKWARD_GRADS_ONLY);
}

// dbrx_build's model (one GPU, no store): zero the gradients, and one optimizer step t (1-based) with
// global-norm clipping, returning the norm before clipping. A store does both on its shard.
static inline void dbrx_zero_grad(DbrxGPU* m) { cudaCheck(cudaMemset(m->grads, 0, m->num_params * sizeof(float))); }
// the step's first backward can overwrite every weight gradient (m->grad_first; the store with S = 1 sets it): BF16 or
// FP8, the experts and the vocabulary here (a dispatcher's experts and the store's chunks accumulate, into zeros)
static inline bool dbrx_grads_overwrite(const DbrxGPU* m) { return !m->experts.backward && !m->vocab.backward; }

// (the model's own update, FP32 moments: the tests' step; training updates through the parameter store in parallel/)
static inline double dbrx_update(DbrxGPU* m, const AdamWConfig* o, float lr, int t) {
    ENSURE(!g_adam_moments_bf16 && !g_optimizer_lion, "dbrx_update (model/dbrx_cuda.cuh) is AdamW with FP32 moments: --adam-moments bf16 "
           "and --optimizer lion update through the parameter store");
    double norm = sqrt(grad_sumsq_gpu(m->grads, m->num_params, m->norm_partial));
    float scale = (o->grad_clip > 0 && norm > o->grad_clip) ? (float)(o->grad_clip / norm) : 1.0f;
    for (const ParamInfo& p : m->table)
        adamw_update_gpu(m->master + p.offset, m->params + p.offset, m->grads + p.offset, m->m + p.offset, m->v + p.offset,
                         p.numel, lr, o->beta1, o->beta2, o->eps, p.decay ? o->weight_decay : 0.0f, scale, t);
    // FP8 delayed scaling: this step's amaxes join the histories and set the next step's scales
    fp8_gpu_step(&m->fp8);
    return norm;
}

#include "dbrx_decode_cuda.cuh"   // (generation: dbrx_decode_alloc, dbrx_decode_step)

// ---------------------------------------------------------------------------------------------
// the rest of the training loop's calls (model/api.h): the device synchronisation, the FP8 scales to log,
// and the last forward's results brought to the host
static inline void dbrx_sync(DbrxGPU* m) {
    (void)m;
    // the model's stream only, not the device: every other stream of the step (the store's gathers and
    // reduce-scatters, the replica and EP groups') is joined to it by an event before the optimizer reads the
    // gradient, so waiting for it waits for the step (parallel/README.md, "Communication streams"); the host
    // needs no more
    cudaCheck(cudaStreamSynchronize(0));
    platform_step_counters();   // the emulator's counters of this step (SIMT_STEP_COUNTERS=1; model/platform.h)
}
// the per-tensor scale of the tensor's last quantisation (block recipe: 1, its scales are per tile)
static inline float dbrx_fp8_log_scale(DbrxGPU* m, const Fp8MetaRef& r, int i) { (void)r; return m->fp8.last_scale[i]; }
static inline void dbrx_logits_to_host(DbrxGPU* m, std::vector<float>* out) {
    out->resize((size_t)m->B * m->T * m->cfg.vocab_size);
    from_device_bf16(out->data(), m->logits, out->size());
}
// the per-token cross-entropy of the last forward (B * T, fp32 on the device)
static inline void dbrx_losses_to_host(DbrxGPU* m, std::vector<float>* out) {
    out->resize((size_t)m->B * m->T);
    cudaCheck(cudaMemcpy(out->data(), m->losses, out->size() * sizeof(float), cudaMemcpyDeviceToHost));
}
// acc (L * E) += each layer's tokens per expert in the last forward (the host copies the forward keeps)
static inline void dbrx_expert_counts_add(DbrxGPU* m, std::vector<double>* acc) {
    int E = m->cfg.n_experts;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < E; e++) (*acc)[(size_t)l * E + e] += m->acts[l].counts_host[e];
}

DBRX_CHECK_MODEL_CONTRACT(DbrxGPU);
