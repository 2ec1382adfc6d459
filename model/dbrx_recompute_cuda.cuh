/*
 * dbrx_recompute_cuda.cuh — the GPU model's recomputation in the backward (--recompute:
 * model/recompute.h), as the CPU's (model/dbrx_recompute.h): a dropped buffer of layer l points into one
 * shared scratch set, and the backward refills it with the forward's own kernels on the saved inputs:
 *   moe/block  (block: LN1, Wqkv, clip + RoPE, attention, out_proj, and the fused residual + LN2 of the
 *              forward) or (moe) LN2 of the saved resid_mid: the same kernel without the add, whose
 *              arithmetic on the rounded row is the fused one's (the same vector width is checked);
 *              the gather by the SAVED routing (under FP8 the layer's saved padded layout); the experts
 *   swiglu     g, u, act of the saved xe (the down GEMM skipped: ye is saved); under expert parallelism the
 *              model's g, u, act hold the received rows, recomputed by the dispatcher's backward from its kept xl
 *   attn       atty (and the same lse) from the saved qkv
 * Under FP8 the quantisations of the recomputation record no amax or saturation (Fp8GPU::frozen): the
 * scales are the step's (delayed: fixed; current and block: of the same tensor, so the same).
 * Templates on the model type, instantiated in model/dbrx_cuda.cuh once DbrxGPU and its block calls exist.
 */
#pragma once
#include "recompute.h"
#include "act_compress.cuh"

// every buffer of the GPU's BlockActsGPU with its bytes and the recompute bit that drops it (R routed rows;
// Rx the experts' rows: R, or under expert parallelism the planned received rows; g holds g and u: one
// buffer of 2 Rx F); v(member, bytes, bit). act_kept false (FP8, gpu_act_kept): act has 0 bytes, no buffer
template <typename A, typename V> static inline void gpu_block_acts_fields(const DbrxConfig* c, size_t N, size_t R, size_t Rx, bool act_kept, V v) {
    size_t d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden, qd = qkv_dim(c), NH = N * c->n_heads;
    size_t X = sizeof(floatX), f = sizeof(float), i = sizeof(int);
    v(&A::ln1, N * d * X, RC_LN1); v(&A::ln1_mean, N * f, RC_BLOCK); v(&A::ln1_rstd, N * f, RC_BLOCK);
    v(&A::qkv_pre, N * qd * X, RC_BLOCK); v(&A::qkv, N * qd * X, RC_BLOCK); v(&A::att_lse, NH * f, RC_BLOCK);
    v(&A::atty, N * d * X, RC_ATTN); v(&A::resid_mid, N * d * X, RC_BLOCK);
    v(&A::ln2, N * d * X, RC_MOE); v(&A::ln2_mean, N * f, RC_MOE); v(&A::ln2_rstd, N * f, RC_MOE);
    v(&A::router_logits, N * E * f, RC_MOE); v(&A::probs, N * E * f, 0); v(&A::lse, N * f, 0); v(&A::topk_w, N * k * f, 0);
    v(&A::topk_idx, N * k * i, 0); v(&A::counts, E * i, 0); v(&A::offsets, (E + 1) * i, 0);
    v(&A::row_token, R * i, 0); v(&A::slot_row, R * i, 0);
    v(&A::xe, R * d * X, RC_XE); v(&A::g, 2 * Rx * F * X, RC_SWIGLU); v(&A::act, act_kept ? Rx * F * X : 0, RC_SWIGLU); v(&A::ye, R * d * X, RC_MOE);
    // --compress-acts swiglu (RC_CSWIGLU: only the layers it names keep these): g and u as E4M3 codes and factors
    v(&A::gu_codes, compress_code_bytes(COMPRESS_E4M3, Rx, F), RC_CSWIGLU); v(&A::gu_sinv, compress_factor_bytes(COMPRESS_E4M3, Rx, F), RC_CSWIGLU);
    // --compress-acts attn (RC_CATTN): ln1 as E4M3 codes and factors
    v(&A::ln1_codes, compress_tensor_code_bytes(COMPRESS_E4M3, N, d), RC_CATTN);
    v(&A::ln1_sinv, compress_tensor_factor_bytes(COMPRESS_E4M3, N, d), RC_CATTN);
}

// Layer l's block-unit part again, the unit gathered for it (a forward-phase gather inside the backward
// under ZeRO-3): the attention half (block), LN2 and the gather of the routed rows (moe)
template <typename M> static inline void gpu_recompute_block_half(M* m, int l, int rc) {
    const DbrxConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim, qd = qkv_dim(c);
    int k = c->top_k, E = c->n_experts;
    unit_begin(m, dbrx_block_unit(l), UNIT_FORWARD);
    const auto& w = m->p.blocks[l];
    auto* a = &m->acts[l];
    ProfTrack pt = dbrx_prof_track(m);
    prof_begin(pt, "layer", "layer %d recompute", l);
    m->fp8.frozen = true;
    if (rc & RC_BLOCK) {
        const floatX* x = m->resid[l];
        layernorm_forward_gpu(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.norm1, N, d, c->ln_eps);
        block_linear_forward(m, l, FP8_LIN_QKV, a->qkv_pre, a->ln1, w.wqkv, N, d, qd);
        clip_rope_forward_gpu(a->qkv, a->qkv_pre, m->rope_cos, m->rope_sin, B, T, H, KV, hd, c->clip_qkv);
        attention_hooked_forward_gpu(&m->attn, a->atty, a->att_lse, a->qkv, B, T, H, KV, hd, m->doc);
        block_linear_forward(m, l, FP8_LIN_PROJ, m->attproj, a->atty, w.wo, N, d, d);
        residual_layernorm_forward_gpu(a->ln2, a->resid_mid, a->ln2_mean, a->ln2_rstd, x, m->attproj, w.norm2, N, d, c->ln_eps);
    } else {   // the forward's fused kernel normalised the rounded sum it stored: the same arithmetic at the same width
        ENSURE(bf16_rows_vec8(d, {a->ln2, a->resid_mid, m->resid[l], m->attproj, w.norm2}) == bf16_rows_vec8(d, {a->ln2, a->resid_mid, w.norm2}),
               "--recompute moe: LayerNorm 2 of layer %d would run at another vector width than in the forward", l);
        layernorm_forward_gpu(a->ln2, a->ln2_mean, a->ln2_rstd, a->resid_mid, w.norm2, N, d, c->ln_eps);
    }
    m->fp8.frozen = false;
    bool f8 = fp8_on(&m->fp8) && !m->experts.forward;   // (the padded layout of the forward, kept per layer)
    const int* row_token = f8 ? m->fp8.routing[l].row_token : a->row_token;
    int rows = f8 ? m->fp8.routing[l].poff[E] : N * k;
    moe_gather_gpu(a->xe, a->ln2, row_token, rows, d);
    if (g_debug_hooks.plant == PLANT_RECOMPUTE_ROUTING && N * k >= 2)   // the negative control: two routed rows swapped
        cudaCheck(cudaMemcpyAsync(a->xe, a->xe + d, (size_t)d * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
    prof_end(pt);
    unit_end(m, dbrx_block_unit(l), UNIT_FORWARD);
}

// the rows of layer l's g, u and act that its forward filled: the routed rows, under FP8 in the padded layout
// (under expert parallelism the dispatcher knows its received rows and calls the two below itself)
template <typename M> static inline int gpu_expert_rows_filled(M* m, int l) {
    int E = m->cfg.n_experts;
    return fp8_on(&m->fp8) ? m->fp8.routing[l].poff[E] : m->acts[l].offsets_host[E];
}
// --compress-acts: the first `rows` rows of layer l's g and u into the layer's codes, and back (with act)
template <typename M> static inline void gpu_compress_rows(M* m, int l, int rows, cudaStream_t stream = 0) {
    auto* a = &m->acts[l];
    swiglu_compress_gpu(a->gu_codes, a->gu_sinv, a->g, a->u, rows, (int)m->expert_rows, m->cfg.ffn_hidden, stream);
}
template <typename M> static inline void gpu_decompress_rows(M* m, int l, int rows, cudaStream_t stream = 0) {
    auto* a = &m->acts[l];
    swiglu_decompress_gpu(a->g, a->u, a->act, a->gu_codes, a->gu_sinv, rows, (int)m->expert_rows, m->cfg.ffn_hidden, stream);
}
// the forward of a layer --compress-acts names leaves g and u in the layer's codes (training only)
template <typename M> static inline void gpu_compress_experts(M* m, int l, float dloss) {
    if ((m->rc_mode[l] & RC_CSWIGLU) && dloss > 0 && !m->experts.forward) gpu_compress_rows(m, l, gpu_expert_rows_filled(m, l));
}

// --compress-acts attn: the forward of a layer it names leaves ln1 in the layer's codes (training only), and
// the backward rebuilds it before the QKV GEMM's weight gradient
template <typename M> static inline void gpu_compress_attn(M* m, int l, float dloss) {
    auto* a = &m->acts[l];
    if ((m->rc_mode[l] & RC_CATTN) && dloss > 0) rows_compress_gpu(a->ln1_codes, a->ln1_sinv, a->ln1, m->B * m->T, m->cfg.d_model);
}
template <typename M> static inline void gpu_decompress_attn(M* m, int l) {
    auto* a = &m->acts[l];
    rows_decompress_gpu(a->ln1, a->ln1_codes, a->ln1_sinv, m->B * m->T, m->cfg.d_model);
}

// Layer l's experts forward again (its experts' unit held): g, u, act (swiglu); and ye (moe: under expert
// parallelism the dispatcher runs the layer again with its saved plan, train 2). Compressed (RC_CSWIGLU):
// g, u and act rebuilt from the layer's codes instead, no GEMM
template <typename M> static inline void gpu_recompute_experts(M* m, int l, int rc) {
    const DbrxConfig* c = &m->cfg;
    int d = c->d_model, E = c->n_experts, F = c->ffn_hidden;
    auto* a = &m->acts[l];
    const auto& w = m->p.blocks[l];
    if (rc & RC_CSWIGLU) {   // (under expert parallelism the dispatcher's backward rebuilds its received rows')
        if (!m->experts.forward) gpu_decompress_rows(m, l, gpu_expert_rows_filled(m, l));
        return;
    }
    if (m->experts.forward) {   // (swiglu alone: the dispatcher's backward recomputes its rows' g, u, act from the rows it keeps)
        if (rc & RC_MOE) m->experts.forward(m->experts.ctx, l, a->offsets_host.data(), a->xe, a->ye, 2);
        return;
    }
    floatX* ye = (rc & RC_MOE) ? a->ye : nullptr;   // (nullptr: the up GEMMs and SwiGLU only)
    m->fp8.frozen = true;
    if (fp8_on(&m->fp8)) fp8_experts_forward_gpu(&m->fp8, l, ye, a->g, a->u, a->act, a->xe, w.w1, w.v1, w.w2, E, d, F);
    else experts_forward_step_gpu(ye, a->g, a->u, a->act, a->xe, w.w1, w.v1, w.w2, a->offsets, a->offsets_host.data(),
                                  m->B * m->T * c->top_k, E, d, F);
    m->fp8.frozen = false;
}
