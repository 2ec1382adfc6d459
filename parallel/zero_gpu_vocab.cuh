/*
 * zero_gpu_vocab.cuh — the device store's vocabulary units: the embedding (unit 0) and norm_f + lm_head (the
 * last unit), V d parameters each (617 M at DBRX-132B width), the largest units once a block's experts are
 * gathered in chunks (parallel/README.md, "A bounded working set"). Part of parallel/zero_gpu.cuh (included
 * after the unit hooks). With z.vocab_rows > 0 (--zero-chunk-mib, zero_vocab_rows):
 *   parameters  one BF16 vocabulary slot for both (never live at once: the embedding's backward reads no
 *               parameter, and the head is gathered after the embedding's forward released the slot), gathered
 *               whole, so the forward and lm_head's input gradient (a sum over the vocabulary) are today's GEMMs
 *   gradients   in chunks of vocab_rows vocabulary rows, each its own run of the layout (zero_vocab_runs; norm_f
 *               in the head's chunk 0), computed chunk by chunk into the two ring gradient slots (item i: slot
 *               i % 2, as a block's experts' chunks) and reduce-scattered as soon as each is complete, beside the
 *               next chunk's compute. lm_head's weight gradient of rows [v0, v1) is the GEMM over the tokens for
 *               those rows (a strided slice of the logits' gradient: the same dot products, each summed in token
 *               order); the embedding's, the sums of its plan's distinct tokens in [v0, v1) (a contiguous range of
 *               the sorted plan); norm_f's backward (the residual's gradient with it) in the last chunk, chunk 0.
 * The ring's slots stay sized by the largest other item (one expert at DBRX-132B without EP), the vocabulary
 * slot adds V d + d + S BF16 elements: 3.36 GiB at DBRX-132B, S 64, against 6.89 GiB with the two units whole.
 */
#pragma once
#include <algorithm>

// unit u gathered whole into the vocabulary slot on stream `comm` over communicator `g` (the gather stream's
// `shard`; the head ahead, below: the reduce-scatters' `shard_rs`, the same ranks): its runs in flat order, each at
// its flat place. A run's padding (under S elements) lands on the next run's first elements, which that run's
// gather, later on the same stream, overwrites; the last run's in the slot's S elements of slack.
static inline void zero_gpu_vocab_gather_on(ZeroGpu* zg, int u, CommGroup* g, cudaStream_t comm) {
    Zero* z = &zg->z;
    if (zg->vocab_unit == u) return;
    cudaCheck(cudaStreamWaitEvent(comm, zg->vocab_free, 0));   // the compute stream is done reading the other unit
    cudaCheck(cudaStreamWaitEvent(comm, zg->bf16_ready, 0));
    if (g_debug_hooks.plant == PLANT_COMM_SERIAL && zg->rs_on && comm == zero_comm_stream(zg)) {   // (test_comm_streams.sh's control)
        cudaCheck(cudaEventRecord(zg->comm_done, zero_gpu_rs_stream(zg)));
        cudaCheck(cudaStreamWaitEvent(comm, zg->comm_done, 0));
    }
    const char* track = comm == zero_comm_stream(zg) ? "communication (shard group)" : "communication (shard group, reduce-scatter)";
    prof_begin(prof_stream(comm, track), "comm", "all-gather unit %d", u);
    for (const ShardRun& r : z->runs[u])
        comm_all_gather(g, zg->master_bf16 + z->shard_off[u] + r.shard_rel, zg->vocab + (r.flat_off - z->unit_off[u]), r.chunk, COMM_BF16);
    prof_end(prof_stream(comm, track));
    cudaCheck(cudaEventRecord(zg->vocab_gathered, comm));
    zg->vocab_unit = u;
}
static inline void zero_gpu_vocab_gather(ZeroGpu* zg, int u) { zero_gpu_vocab_gather_on(zg, u, &zg->z.shard, zero_comm_stream(zg)); }

// The head ahead: the slot is free once the embedding's forward is done, and the head is needed only after every
// block's forward, so the head is gathered then, on the reduce-scatter stream over its communicator `shard_rs`
// (idle in the forward: the backward's reduce-scatters begin after the head's forward), beside the blocks'
// prefetch on the gather stream: neither waits for the other. On the gather stream it would sit in the blocks'
// FIFO (V d = 617 M parameters at DBRX-132B: 26 ms across nodes at 64 ranks, predicted) or be exposed where the
// last block's prefetch issued it. The issue order stays one, in program order, on every rank (the two
// communicators' order: zero_gpu_comm.cuh); each element gathered is the same, so nothing but the schedule changes.
// DBRX_DEBUG_PLANT=no_head_ahead: gathered as before, by the last block's prefetch (test_comm_streams.sh's control).
static inline void zero_gpu_vocab_head_ahead(ZeroGpu* zg) {
    if (!zg->rs_on || zg->in_backward || g_debug_hooks.plant == PLANT_NO_HEAD_AHEAD) return;
    zero_gpu_vocab_gather_on(zg, zg->z.n_units - 1, &zg->rs_shard, zero_gpu_rs_stream(zg));
}

// the unit hooks' part for a vocabulary unit: the parameters (forward, and the head's backward: kept from its
// forward); the embedding's backward reads none, and the gradients are the backward hook's
static inline void zero_gpu_vocab_begin(ZeroGpu* zg, int u, int phase) {
    DbrxGPU* model = zg->model;
    if (phase == UNIT_BACKWARD_GRADS_ONLY) return;
    if (u == 0 && phase == UNIT_FORWARD && zg->emb.on && model->emb_exchange) {   // the batch's rows, not the table
        zero_gpu_emb_forward(zg);                                                  // (zero_gpu_embedding.cuh)
        zero_gpu_prefetch_next(zg, u, phase);
        return;
    }
    zero_gpu_vocab_gather(zg, u);
    if (g_debug_hooks.plant != PLANT_SKIP_GATHER_WAIT) zero_gpu_wait(zg, u, 0);
    model_unit_views(&model->p, zg->vocab, u, &model->cfg, model->table, zg->z.ep_n);
    zero_gpu_prefetch_next(zg, u, phase);   // overlaps this unit's compute
}
static inline void zero_gpu_vocab_end(ZeroGpu* zg, int u, int phase) {
    // the head after its forward: kept for its backward, which follows at once (after an evaluation's forward the
    // next gather waits for this event)
    if (phase == UNIT_FORWARD && u == zg->z.n_units - 1) cudaCheck(cudaEventRecord(zg->vocab_free, zg->compute));
    else if (u == 0 && zg->emb.active) {   // (the exchanged rows read: the slot, the pack's, free for the head)
        cudaCheck(cudaEventRecord(zg->vocab_free, zg->compute));
        zg->emb.active = 0;
    } else zero_gpu_release(zg, u, 0);
    if (phase == UNIT_FORWARD && u == 0) zero_gpu_vocab_head_ahead(zg);   // (the embedding's forward released the slot)
}

// VocabHooksGPU::backward (model/embedding.cuh): the embedding's or the head's backward, its weight gradients
// chunk by chunk (the top comment), each chunk's reduce-scattered when complete
static inline void zero_gpu_vocab_backward(void* ctx, int u) {
    ZeroGpu* zg = (ZeroGpu*)ctx;
    Zero* z = &zg->z;
    DbrxGPU* m = zg->model;
    const DbrxConfig* c = &m->cfg;
    int N = m->B * m->T, d = c->d_model, V = c->vocab_size, K = z->unit_nchunks[u], rows = z->vocab_rows;
    bool head = u != 0;
    if (!head && zg->emb.planned) { zero_gpu_emb_backward(zg); return; }   // (the rows back to their owners)
    // the head: lm_head's input gradient over the whole vocabulary (dlogits (N, V) in m->logits) from the whole weights
    if (head) matmul_backward_gpu(m->dln, (float*)nullptr, m->logits, m->lnf, m->p.lm_head, N, d, V, 0.0f, zg->compute);
    const int* uniq = m->host_in + 2 * (size_t)N;   // the embedding plan's distinct tokens, increasing (dbrx_forward's staging)
    for (int j = K - 1; j >= 0; j--) {
        int slot = zero_item_slot(z, u, j), v0 = j * rows, v1 = std::min(V, v0 + rows);
        float* gs = zg->gwork[slot];
        // a zero gradient slot, once the previous reduce-scatter out of it (and its zeroing after it) has finished
        cudaCheck(cudaStreamWaitEvent(zg->compute, zg->grads_reduced[slot], 0));
        bool early = g_debug_hooks.plant == PLANT_CHUNK_EARLY_RS;   // (the negative control, as for the experts' chunks)
        if (early) {
            zero_gpu_reduce_scatter(zg, u, j);
            cudaCheck(cudaStreamSynchronize(zero_gpu_rs_stream(zg)));
        }
        if (head) {   // lm_head rows [v0, v1) (after norm_f's d in chunk 0) += dlogits[:, v0:v1]^T lnf
            gemm_gpu(true, false, v1 - v0, d, N, 1.0f, m->logits + v0, V, m->lnf, d, 1.0f, gs + (j ? 0 : d), d, zg->compute);
            if (j == 0) {   // norm_f's backward: the residual's gradient, and norm_f's weight gradient at the chunk's start
                cudaCheck(cudaMemsetAsync(m->dresid, 0, (size_t)N * d * sizeof(float), zg->compute));
                layernorm_backward_gpu(m->dresid, (floatX*)nullptr, gs, m->ln_scratch, m->dln, m->resid[c->n_layers], m->p.norm_f,
                                       m->lnf_mean, m->lnf_rstd, N, d);
            }
        } else {   // the distinct tokens in [v0, v1), into the chunk's rows
            int a = (int)(std::lower_bound(uniq, uniq + m->emb_U, v0) - uniq), b = (int)(std::lower_bound(uniq, uniq + m->emb_U, v1) - uniq);
            embedding_backward_gpu(gs, m->dresid, m->emb_unique + a, m->emb_offsets + a, m->emb_positions, b - a, d, zg->compute, v0);
        }
        if (!early) zero_gpu_reduce_scatter(zg, u, j);   // on the reduce-scatter stream, beside the next chunk's compute
    }
}
