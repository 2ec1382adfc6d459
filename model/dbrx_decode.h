/*
 * dbrx_decode.h — generation on the CPU reference model (moved out of model/dbrx.h, which includes it
 * after the training step): the KV cache and one position's forward, dbrx_decode_step.
 */
#pragma once

// ---------------------------------------------------------------------------------------------
// generation: one position at a time with a KV cache (batch 1). The step runs dbrx_forward's block for
// the one new token, with the same ops on one row, and the same unit hooks in the same order, so that
// it runs sharded (ZeRO-3/HSDP: every rank of the shard group must call it, for the same token), and
// appends the position's K and V to the cache instead of recomputing the prefix:
//   x = wte[token];  per block: h = norm_1(x); qkv = rope_pos(clamp(h Wqkv^T)); cache[pos] = qkv's K|V;
//   x += attention(q, cache[0..pos]) Wo^T;  h = norm_2(x); router top-k; x += sum_j w_j expert_j(h);
//   logits = lm_head(norm_f(x))
// The GEMMs are the FP32 ones even under --fp8: sampling must not touch the FP8 scaling state of the
// training step (its amaxes), and an FP8 GEMM of one row is nothing to measure anyway.

// (Re)allocates the cache and scratch for positions 0..T_max-1 (nothing when it already holds as many)
static inline void dbrx_decode_alloc(Dbrx* m, int T_max) {
    const DbrxConfig* c = &m->cfg;
    if (T_max > c->max_seq_len)
        fail(EXIT_BAD_INPUT, "generation: %d positions are more than the model's max_seq_len %d (--max-seq)", T_max, c->max_seq_len);
    DbrxDecode* s = &m->dec;
    if (s->T_max >= T_max) return;
    dbrx_decode_free(m);
    size_t d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden, qd = qkv_dim(c), kvw = 2 * (size_t)c->kv_heads * c->head_dim;
    auto take_real = [&](real** p, size_t n) { *p = (real*)mallocCheck(n * sizeof(real)); s->allocations.push_back(*p); };
    auto take_int = [&](int** p, size_t n) { *p = (int*)mallocCheck(n * sizeof(int)); s->allocations.push_back(*p); };
    s->kv.assign(c->n_layers, NULL);
    for (int l = 0; l < c->n_layers; l++) take_real(&s->kv[l], (size_t)T_max * kvw);
    take_real(&s->rope_cos, (size_t)T_max * c->head_dim / 2); take_real(&s->rope_sin, (size_t)T_max * c->head_dim / 2);
    take_real(&s->x, d); take_real(&s->ln, d); take_real(&s->ln_mean, 1); take_real(&s->ln_rstd, 1);
    take_real(&s->qkv_pre, qd); take_real(&s->qkv, qd); take_real(&s->att, (size_t)c->n_heads * T_max);
    take_real(&s->atty, d); take_real(&s->resid_mid, d);
    take_real(&s->router_logits, E); take_real(&s->probs, E); take_real(&s->lse, 1); take_real(&s->topk_w, k);
    take_int(&s->topk_idx, k); take_int(&s->counts, E); take_int(&s->offsets, E + 1); take_int(&s->row_token, k);
    take_int(&s->slot_row, k);
    take_real(&s->xe, k * d); take_real(&s->g, k * F); take_real(&s->u, k * F); take_real(&s->act, k * F);
    take_real(&s->ye, k * d); take_real(&s->logits, c->vocab_size);
    rope_tables(s->rope_cos, s->rope_sin, T_max, c->head_dim, c->rope_theta);   // (the training tables' values, longer)
    s->T_max = T_max;
}

// One position: token at position pos (0 <= pos < T_max), the cache holding positions 0..pos-1 of the
// same sequence. Returns its logits (V), valid until the next step. Collective under a sharded store.
static inline const real* dbrx_decode_step(Dbrx* m, int token, int pos) {
    const DbrxConfig* c = &m->cfg;
    DbrxDecode* s = &m->dec;
    ENSURE(pos >= 0 && pos < s->T_max, "dbrx_decode_step: position %d outside the cache (%d positions)", pos, s->T_max);
    ENSURE(token >= 0 && token < c->vocab_size, "dbrx_decode_step: token %d outside the vocabulary (%d)", token, c->vocab_size);
    int d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim, E = c->n_experts, k = c->top_k;
    int qd = qkv_dim(c), L = c->n_layers, half = hd / 2, kvw = 2 * KV * hd;
    unit_begin(m, 0, UNIT_FORWARD);
    embedding_forward(s->x, &token, m->p.wte, 1, d);
    unit_end(m, 0, UNIT_FORWARD);
    for (int l = 0; l < L; l++) {
        unit_begin(m, dbrx_block_unit(l), UNIT_FORWARD);
        const BlockParams& w = m->p.blocks[l];   // (a reference: the experts' views are set when their unit begins)
        // attention half: this position's q, k, v; k and v join the cache
        layernorm_forward(s->ln, s->ln_mean, s->ln_rstd, s->x, w.norm1, 1, d, c->ln_eps);
        matmul_forward(s->qkv_pre, s->ln, w.wqkv, 1, d, qd);
        clip_forward(s->qkv, s->qkv_pre, (size_t)qd, c->clip_qkv);
        rope_forward(s->qkv, s->rope_cos + (size_t)pos * half, s->rope_sin + (size_t)pos * half, 1, 1, H, KV, hd);   // (the tables at pos)
        memcpy(s->kv[l] + (size_t)pos * kvw, s->qkv + (size_t)H * hd, kvw * sizeof(real));
        attention_decode_forward(s->atty, s->att, s->qkv, s->kv[l], pos, H, KV, hd);
        matmul_forward(s->resid_mid, s->atty, w.wo, 1, d, d);
        for (int i = 0; i < d; i++) s->resid_mid[i] += s->x[i];
        // MoE half: the token's k experts
        layernorm_forward(s->ln, s->ln_mean, s->ln_rstd, s->resid_mid, w.norm2, 1, d, c->ln_eps);
        matmul_forward(s->router_logits, s->ln, w.router, 1, d, E);
        router_forward(s->probs, s->lse, s->topk_idx, s->topk_w, s->counts, s->router_logits, 1, E, k, c->moe_norm_p);
        moe_dispatch(s->offsets, s->row_token, s->slot_row, s->topk_idx, s->counts, 1, E, k);
        moe_gather(s->xe, s->ln, s->row_token, k, d);
        unit_end(m, dbrx_block_unit(l), UNIT_FORWARD);
        unit_begin(m, dbrx_experts_unit(l), UNIT_FORWARD);
        if (m->experts.forward) {   // a dispatcher (EP): the k rows to their experts' ranks; every rank of the EP group
            // runs this step (its own copy of the same token), so each takes part in every exchange
            m->experts.forward(m->experts.ctx, l, s->counts, s->offsets, s->xe, s->ye, 0);   // (FP32, as below)
        } else {
            experts_up_forward(s->g, s->u, s->act, s->xe, w.w1, w.v1, s->offsets, E, d, c->ffn_hidden);
            experts_down_forward(s->ye, s->act, w.w2, s->offsets, E, d, c->ffn_hidden);
        }
        unit_end(m, dbrx_experts_unit(l), UNIT_FORWARD);
        memcpy(s->x, s->resid_mid, (size_t)d * sizeof(real));
        moe_combine_forward(s->x, s->ye, s->topk_w, s->slot_row, 1, k, d);
    }
    unit_begin(m, dbrx_head_unit(c), UNIT_FORWARD);
    layernorm_forward(s->ln, s->ln_mean, s->ln_rstd, s->x, m->p.norm_f, 1, d, c->ln_eps);
    matmul_forward(s->logits, s->ln, m->p.lm_head, 1, d, c->vocab_size);
    unit_end(m, dbrx_head_unit(c), UNIT_FORWARD);
    return s->logits;
}

