/*
 * dbrx_recompute.h — the CPU model's recomputation in the backward (--recompute: model/recompute.h).
 * A dropped buffer of layer l points into the shared scratch (dbrx_activations), so the forward runs
 * unchanged and the backward refills the scratch with the forward's own ops on the saved inputs, just
 * before layer l's backward reads it:
 *   moe/block  dbrx_recompute_block_half: (block: LN1, Wqkv, clip, RoPE, attention, out_proj, + x =
 *              resid_mid), LN2, the gather of the routed rows xe by the SAVED routing (row_token); under
 *              ZeRO-3 the block's unit is gathered for it (a forward-phase gather inside the backward)
 *   swiglu     dbrx_recompute_experts: g, u, act from xe (moe: and ye; under expert parallelism the
 *              dispatcher runs the layer again with its saved plan: train 2, no statistics counted)
 *   attn       dbrx_backward itself: atty from the saved qkv (the lse it writes is the saved one)
 * Nothing of the routing runs again (no router GEMM, no top-k, no load-balancing or z-loss, no
 * statistics), and the FP8 GEMMs quantise with the step's scales on a copy of the layer's FP8 state,
 * dropped afterwards, so that no amax or saturation count is recorded twice. Every op is deterministic
 * (fixed reduction orders at any thread count), so the values are the forward's bit for bit.
 * DBRX_DEBUG_PLANT=recompute_routing swaps two routed rows of the recomputed xe: the negative control.
 */
#pragma once

// runs f with layer l's FP8 state frozen: f sees the step's scales, and what it records is dropped
template <typename Fn> static inline void dbrx_fp8_frozen(Dbrx* m, int l, Fn f) {
    if (m->fp8.recipe == FP8_OFF) { f(); return; }
    Fp8BlockState saved = m->fp8_state[l];
    f();
    m->fp8_state[l] = saved;
}

// the negative control: routed rows 0 and 1 of xe (rows, d) swapped, as if the recomputation had routed them otherwise
static inline void recompute_plant_routing(real* xe, int rows, int d) {
    if (g_debug_hooks.plant != PLANT_RECOMPUTE_ROUTING || rows < 2) return;
    for (int i = 0; i < d; i++) { real t = xe[i]; xe[i] = xe[d + i]; xe[d + i] = t; }
}

// layer l's attention half (block) and LN2 + gather (moe) again, with the block's unit gathered
static inline void dbrx_recompute_block_half(Dbrx* m, int l, int rc) {
    const DbrxConfig* c = &m->cfg;
    int N = m->B * m->T, d = c->d_model, k = c->top_k;
    unit_begin(m, dbrx_block_unit(l), UNIT_FORWARD);
    const BlockParams& w = m->p.blocks[l];
    BlockActs* a = &m->acts[l];
    prof_begin(PROF_HOST, "layer", "layer %d recompute", l);
    if (rc & RC_BLOCK)   // (the FP8 GEMMs with the step's scales, their amax bookkeeping frozen)
        dbrx_fp8_frozen(m, l, [&] { block_attention_forward(m, l, m->resid[l]); });
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->resid_mid, w.norm2, N, d, c->ln_eps);
    moe_gather(a->xe, a->ln2, a->row_token, N * k, d);
    recompute_plant_routing(a->xe, N * k, d);
    prof_end(PROF_HOST);
    unit_end(m, dbrx_block_unit(l), UNIT_FORWARD);
}

// layer l's experts forward again (its experts' unit is held): g, u, act (swiglu), and ye (moe)
static inline void dbrx_recompute_experts(Dbrx* m, int l, int rc) {
    const DbrxConfig* c = &m->cfg;
    BlockActs* a = &m->acts[l];
    const BlockParams& w = m->p.blocks[l];
    if (rc & RC_MOE) {   // (under expert parallelism: the dispatcher again, train 2)
        dbrx_fp8_frozen(m, l, [&] { block_experts_forward(m, l, a, w, 2); });
        return;
    }
    if (m->experts.forward) return;   // expert parallelism keeps its own rows' g, u, act (parallel/expert_parallel.h)
    int E = c->n_experts, d = c->d_model, F = c->ffn_hidden;
    dbrx_fp8_frozen(m, l, [&] {
        Fp8Policy p = block_fp8_policy(m, l);
        const int *o = a->offsets, *ws = m->fp8_wseg.data();
        const real* xe = fp8_policy_grouped(&p, FP8_LIN_W1, FP8_OP_X, m->fq_x, a->xe, o, E, d, 1, 128);
        const real* w1 = fp8_policy_weight(&p, FP8_LIN_W1, m->fq_w, w.w1, ws, E, d);
        const real* v1 = fp8_policy_weight(&p, FP8_LIN_V1, m->fq_w2, w.v1, ws, E, d);
        experts_up_forward(a->g, a->u, a->act, xe, w1, v1, o, E, d, F);
    });
}

// --compress-acts: the forward of a layer that names `part` (RC_CSWIGLU: g and u; RC_CATTN: ln1) leaves it in
// the layer's codes (training only: dloss > 0), and the backward rebuilds it (part 0: nothing)
static inline void dbrx_compress_layer(Dbrx* m, int l, int part, float dloss) {
    BlockActs* a = &m->acts[l];
    int N = m->B * m->T, R = N * m->cfg.top_k;
    CompressFormat f = (CompressFormat)g_compress_format;
    if (!(m->rc_mode[l] & part) || dloss <= 0) return;
    if (part == RC_CSWIGLU) swiglu_compress(a->gu_codes, a->gu_sinv, a->g, a->u, R, R, m->cfg.ffn_hidden, f);
    else compress_rows(a->ln1_codes, a->ln1_sinv, a->ln1, N, m->cfg.d_model, f);
}
static inline void dbrx_decompress_layer(Dbrx* m, int l, int part) {
    BlockActs* a = &m->acts[l];
    int N = m->B * m->T, R = N * m->cfg.top_k;
    CompressFormat f = (CompressFormat)g_compress_format;
    if (part == RC_CSWIGLU) swiglu_decompress(a->g, a->u, a->act, a->gu_codes, a->gu_sinv, R, R, m->cfg.ffn_hidden, f);
    else if (part == RC_CATTN) decompress_rows(a->ln1, a->ln1_codes, a->ln1_sinv, N, m->cfg.d_model, f);
}

// What --recompute (and --compress-acts) saves on this model (B x T micro-batches): the bytes the layers do
// not keep less the shared set they point into, less the compressed copies; the dry run's estimate
// (train_dbrx.cu: the walk without either, less this)
static inline long double dbrx_recompute_saved_bytes(const DbrxConfig* c, int B, int T) {
    if (g_recompute.items.empty() && g_compress.items.empty()) return 0;
    long double per_bit[RC_LN1 + 1] = {0}, saved = 0;
    block_acts_fields(c, (size_t)B * T, [&](auto f, size_t n, int bit) {
        using Tp = std::remove_pointer_t<std::remove_reference_t<decltype(std::declval<BlockActs&>().*f)>>;
        per_bit[bit] += (long double)n * sizeof(Tp);
    });
    int U = recompute_dropped_bits(recompute_union(&g_recompute, c->n_layers));
    for (int b = RC_ATTN; b <= RC_LN1; b <<= 1) {
        if (b == RC_CSWIGLU || b == RC_CATTN) {   // (the codes: kept by the layers that compress)
            for (int l = 0; l < c->n_layers; l++) if (recompute_mode(&g_recompute, l) & b) saved -= per_bit[b];
            continue;
        }
        if (U & b) saved -= per_bit[b];
        for (int l = 0; l < c->n_layers; l++) if (recompute_dropped_bits(recompute_mode(&g_recompute, l)) & b) saved += per_bit[b];
    }
    return saved;
}
