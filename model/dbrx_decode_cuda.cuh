/*
 * dbrx_decode_cuda.cuh — generation on the GPU model (moved out of model/dbrx_cuda.cuh, which includes it
 * after the training step): the device KV cache and one position's forward, dbrx_decode_step.
 */
#pragma once

// ---------------------------------------------------------------------------------------------
// generation: model/dbrx.h's dbrx_decode_step on the device, one position with a KV cache, the same
// kernels as dbrx_forward on one row (cuBLASLt GEMMs with N = 1, the router and dispatch of one token,
// the experts of its k rows) plus the decode-attention kernel (model/attention.cuh) over the cache; RoPE
// at position pos is the fused clip + RoPE kernel of one row given the tables from row pos. The same
// unit hooks as the forward: under ZeRO-3/HSDP the store gathers each unit for it. BF16 GEMMs even
// under --fp8 (the FP8 scaling state belongs to training; a GEMM of one row needs no FP8).

// (Re)allocates the device cache and scratch for positions 0..T_max-1
static inline void dbrx_decode_alloc(DbrxGPU* m, int T_max) {
    const DbrxConfig* c = &m->cfg;
    if (T_max > c->max_seq_len)
        fail(EXIT_BAD_INPUT, "generation: %d positions are more than the model's max_seq_len %d (--max-seq)", T_max, c->max_seq_len);
    DbrxDecodeGPU* s = &m->dec;
    if (s->T_max >= T_max) return;
    dbrx_decode_free(m);
    size_t d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden, qd = qkv_dim(c), kvw = 2 * (size_t)c->kv_heads * c->head_dim;
    size_t half = c->head_dim / 2;
    auto take = [&](void** p, size_t bytes) { *p = (void*)deviceAlloc(char, bytes); s->allocations.push_back(*p); };
#define DTAKE(ptr, type, n) take((void**)&(ptr), (size_t)(n) * sizeof(type))
    s->kv.assign(c->n_layers, nullptr);
    for (int l = 0; l < c->n_layers; l++) DTAKE(s->kv[l], floatX, (size_t)T_max * kvw);
    DTAKE(s->rope_cos, float, (size_t)T_max * half); DTAKE(s->rope_sin, float, (size_t)T_max * half);
    DTAKE(s->token, int, 1);
    DTAKE(s->x, floatX, d); DTAKE(s->ln, floatX, d); DTAKE(s->qkv_pre, floatX, qd); DTAKE(s->qkv, floatX, qd);
    DTAKE(s->atty, floatX, d); DTAKE(s->attproj, floatX, d); DTAKE(s->resid_mid, floatX, d);
    DTAKE(s->ln_mean, float, 1); DTAKE(s->ln_rstd, float, 1);
    DTAKE(s->router_logits, float, E); DTAKE(s->probs, float, E); DTAKE(s->lse, float, 1); DTAKE(s->topk_w, float, k);
    DTAKE(s->router_stats, float, E + 1);
    DTAKE(s->topk_idx, int, k); DTAKE(s->counts, int, E); DTAKE(s->offsets, int, E + 1); DTAKE(s->row_token, int, k);
    DTAKE(s->slot_row, int, k);
    DTAKE(s->xe, floatX, k * d); DTAKE(s->g, floatX, 2 * k * F); DTAKE(s->act, floatX, k * F);
    s->u = s->g + k * F;   // (one buffer: w1 and v1 as one batched GEMM, model/moe.cuh)
    DTAKE(s->ye, floatX, k * d); DTAKE(s->logits, float, c->vocab_size);
#undef DTAKE
    // the training tables' values (model/attention.cuh's rope_tables), for T_max positions
    std::vector<real> cs((size_t)T_max * half), sn((size_t)T_max * half);
    rope_tables(cs.data(), sn.data(), T_max, c->head_dim, c->rope_theta);
    std::vector<float> cf(cs.begin(), cs.end()), sf(sn.begin(), sn.end());
    cudaCheck(cudaMemcpy(s->rope_cos, cf.data(), cf.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(s->rope_sin, sf.data(), sf.size() * sizeof(float), cudaMemcpyHostToDevice));
    s->offsets_host.assign(E + 1, 0);
    s->logits_host.assign(c->vocab_size, 0.0f);
    s->T_max = T_max;
}

// One position (model/dbrx.h's contract): returns its logits (V, host, fp32), valid until the next step.
static inline const float* dbrx_decode_step(DbrxGPU* m, int token, int pos) {
    const DbrxConfig* c = &m->cfg;
    DbrxDecodeGPU* s = &m->dec;
    ENSURE(pos >= 0 && pos < s->T_max, "dbrx_decode_step: position %d outside the cache (%d positions)", pos, s->T_max);
    ENSURE(token >= 0 && token < c->vocab_size, "dbrx_decode_step: token %d outside the vocabulary (%d)", token, c->vocab_size);
    int d = c->d_model, H = c->n_heads, KV = c->kv_heads, hd = c->head_dim, E = c->n_experts, k = c->top_k, F = c->ffn_hidden;
    int qd = qkv_dim(c), L = c->n_layers, V = c->vocab_size, half = hd / 2, kvw = 2 * KV * hd;
    cudaCheck(cudaMemcpy(s->token, &token, sizeof(int), cudaMemcpyHostToDevice));
    m->fp8.bf16_weights = true;   // (--fp8-gather: the store decodes the block weights' codes for these BF16 GEMMs)
    unit_begin(m, 0, UNIT_FORWARD);
    embedding_forward_gpu(s->x, s->token, m->p.wte, 1, d);
    unit_end(m, 0, UNIT_FORWARD);
    for (int l = 0; l < L; l++) {
        unit_begin(m, dbrx_block_unit(l), UNIT_FORWARD);
        const BlockViews<floatX>& w = m->p.blocks[l];   // (a reference: the experts' views are set when their unit begins)
        // attention half: this position's q, k, v (RoPE from row pos of the tables); k and v join the cache
        layernorm_forward_gpu(s->ln, s->ln_mean, s->ln_rstd, s->x, w.norm1, 1, d, c->ln_eps);
        matmul_forward_gpu(s->qkv_pre, s->ln, w.wqkv, 1, d, qd);
        clip_rope_forward_gpu(s->qkv, s->qkv_pre, s->rope_cos + (size_t)pos * half, s->rope_sin + (size_t)pos * half, 1, 1, H, KV, hd,
                              c->clip_qkv);
        cudaCheck(cudaMemcpyAsync(s->kv[l] + (size_t)pos * kvw, s->qkv + (size_t)H * hd, kvw * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
        attention_decode_gpu(s->atty, s->qkv, s->kv[l], pos, H, KV, hd);
        matmul_forward_gpu(s->attproj, s->atty, w.wo, 1, d, d);
        // MoE half: the token's k experts (the dispatch brings the offsets to the host, as in the forward)
        residual_layernorm_forward_gpu(s->ln, s->resid_mid, s->ln_mean, s->ln_rstd, s->x, s->attproj, w.norm2, 1, d, c->ln_eps);
        matmul_forward_gpu(s->router_logits, s->ln, w.router, 1, d, E);
        router_forward_gpu(s->probs, s->lse, s->topk_idx, s->topk_w, s->counts, s->router_stats, s->router_logits, 1, E, k,
                           c->moe_norm_p);
        moe_dispatch_gpu(s->offsets, s->row_token, s->slot_row, s->offsets_host.data(), s->topk_idx, s->counts, 1, E, k);
        unit_end(m, dbrx_block_unit(l), UNIT_FORWARD);
        unit_begin(m, dbrx_experts_unit(l), UNIT_FORWARD);
        moe_gather_gpu(s->xe, s->ln, s->row_token, k, d);
        if (m->experts.forward)   // a dispatcher (EP): every rank of the EP group runs this step
            m->experts.forward(m->experts.ctx, l, s->offsets_host.data(), s->xe, s->ye, 0);
        else
            experts_forward_gpu(s->ye, s->g, s->u, s->act, s->xe, w.w1, w.v1, w.w2, s->offsets_host.data(), E, d, F);
        unit_end(m, dbrx_experts_unit(l), UNIT_FORWARD);
        moe_combine_forward_gpu(s->x, s->resid_mid, s->ye, s->topk_w, s->slot_row, 1, k, d);   // (x is free again: in place)
    }
    unit_begin(m, dbrx_head_unit(c), UNIT_FORWARD);
    layernorm_forward_gpu(s->ln, s->ln_mean, s->ln_rstd, s->x, m->p.norm_f, 1, d, c->ln_eps);
    matmul_forward_gpu(s->logits, s->ln, m->p.lm_head, 1, d, V);
    unit_end(m, dbrx_head_unit(c), UNIT_FORWARD);
    m->fp8.bf16_weights = false;
    cudaCheck(cudaMemcpy(s->logits_host.data(), s->logits, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost));
    return s->logits_host.data();
}

