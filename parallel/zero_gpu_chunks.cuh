/*
 * zero_gpu_chunks.cuh — the device store's chunked experts (--zero-chunk-mib; parallel/README.md, "A
 * bounded working set"). Part of parallel/zero_gpu.cuh (included after the unit hooks).
 *
 * A block's experts unit is 3 E F d parameters (3.17 G at DBRX-132B width): gathered whole, its BF16 slot
 * and FP32 gradient slot, twice, are ~38 GB per GPU. Chunked, the unit is E / Ec chunks of Ec whole
 * experts (zero_chunk_experts: the most that fit the budget), each its own three runs (zero_unit_runs),
 * and the working slots are sized for a chunk (or the largest other unit). Without EP the store installs itself
 * as the model's experts hook (ExpertHooksGPU) and runs the experts chunk by chunk; under EP the dispatcher is
 * the hook and runs a rank's own experts' chunks through zero_gpu_chunk_begin / _end (expert_parallel_cuda.cuh):
 *   forward    gather chunk j (prefetched while chunk j-1 computed), prefetch chunk j+1 (after the last
 *              chunk: the next unit), the experts of chunk j over their rows, release the slot
 *   backward   chunks in reverse: gather, prefetch j-1 (after chunk 0: the block unit before; with the first
 *              chunk, or the recomputation's first, --recompute moe/block: the block below into the recompute
 *              slot), zero the
 *              chunk's gradient slot (the chunk's length only), recompute g, u, act of its rows (--recompute
 *              swiglu), the experts' backward of its rows, reduce-scatter the chunk's gradient at once on the
 *              reduce-scatter stream, release
 *   recompute  (--recompute moe/block: train 2) the forward again, the last chunk kept for the backward
 * The same arithmetic as the unit whole: experts_forward_gpu / experts_backward_gpu run expert by expert
 * (the same GEMMs on the same rows), SwiGLU is elementwise, and a chunk's rows are a contiguous range of
 * the routed rows (grouped by expert). What changes is which rank owns which element of an expert tensor
 * (a chunk's rows are split over the S ranks, not whole experts per rank), hence the ring order in which
 * the ranks' gradients are summed (with 2 ranks a + b either way: bit-identical) and the order of the
 * shard's elements in the gradient norm's partial sums.
 */
#pragma once

// chunk j's routed rows [r0, r1) and their expert offsets relative to r0 (rel, Ec + 1)
static inline void zero_chunk_rows(const int* offsets_host, int j, int Ec, int* r0, int* r1, std::vector<int>* rel) {
    *r0 = offsets_host[j * Ec];
    *r1 = offsets_host[(j + 1) * Ec];
    rel->resize(Ec + 1);
    for (int e = 0; e <= Ec; e++) (*rel)[e] = offsets_host[j * Ec + e] - *r0;
}

// chunk j's w1, v1, w2 (or their gradients) in a slot: its three runs, in order
template <typename T> static inline void zero_chunk_tensors(const Zero* z, int u, int j, T* slot, T** t3) {
    int k = 0;
    for (size_t i = 0; i < z->runs[u].size() && k < 3; i++)
        if (z->run_chunk[u][i] == j && zero_run_mine(z, z->runs[u][i])) t3[k++] = slot + z->runs[u][i].slot_off;   // (EP: my experts')
    ENSURE(k == 3, "chunk %d of unit %d has %d runs, not w1, v1, w2", j, u, k);
}

// Item (u, j) ready on the compute stream: chunk j gathered (prefetched while the previous chunk computed), the
// next item's gather issued (forward: chunk j + 1, after the last the next unit, not in train 2's recomputation;
// backward: chunk j - 1, after chunk 0 the unit before; with the first chunk of the unit's backward or of its
// recomputation before it, the block below two units ahead, zero_gpu_rc_prefetch, as the unit whole does when its
// backward begins); backward: the chunk's gradient slot, zero once the previous reduce-scatter out of it (and the
// slot's zeroing after it, zero_gpu_reduce_scatter) has finished. w (and gw) its w1, v1, w2 in the slot.
static inline void zero_gpu_chunk_begin(ZeroGpu* zg, int u, int j, bool backward, int train, floatX** w, float** gw) {
    Zero* z = &zg->z;
    int K = z->unit_nchunks[u], slot = zero_item_slot(z, u, j);
    zero_gpu_gather_async(zg, u, j);
    if (g_debug_hooks.plant != PLANT_SKIP_GATHER_WAIT) zero_gpu_wait(zg, u, j);
    if (!backward && j + 1 < K) zero_gpu_gather_async(zg, u, j + 1);   // overlaps this chunk's compute
    else if (!backward && train != 2) zero_gpu_prefetch_next(zg, u, UNIT_FORWARD);
    else if (backward && j > 0) zero_gpu_gather_async(zg, u, j - 1);
    else if (backward) zero_gpu_prefetch_next(zg, u, UNIT_BACKWARD);
    if ((backward && j == K - 1) || (train == 2 && j == 0)) zero_gpu_rc_prefetch(zg, u);   // (the block below: the first of them)
    zero_chunk_tensors(z, u, j, zg->work[slot], w);
    if (!backward) return;
    cudaCheck(cudaStreamWaitEvent(zg->compute, zg->grads_reduced[slot], 0));
    zero_chunk_tensors(z, u, j, zg->gwork[slot], gw);
    if (g_debug_hooks.plant == PLANT_CHUNK_EARLY_RS) {   // the negative control: reduced before it is complete, and at
        zero_gpu_reduce_scatter(zg, u, j);                // once (the earliest a GPU may run it; the emulator would defer it)
        cudaCheck(cudaStreamSynchronize(zero_gpu_rs_stream(zg)));
    }
}

// Item (u, j) done on the compute stream: backward, its gradient reduce-scattered at once (on the reduce-scatter
// stream, beside the next chunk's backward); the slot released (not the last chunk of train 2's recomputation:
// the backward starts with it)
static inline void zero_gpu_chunk_end(ZeroGpu* zg, int u, int j, bool backward, int train) {
    if (backward && g_debug_hooks.plant != PLANT_CHUNK_EARLY_RS) zero_gpu_reduce_scatter(zg, u, j);
    if (!(!backward && train == 2 && j == zg->z.unit_nchunks[u] - 1)) zero_gpu_release(zg, u, j);
}

// the EP dispatcher's view of them (EpChunkHooks, parallel/expert_parallel_cuda.cuh): layer l's experts unit
static inline void zero_gpu_ep_chunk_begin(void* ctx, int l, int j, int backward, int train, floatX** w, float** gw) {
    zero_gpu_chunk_begin((ZeroGpu*)ctx, dbrx_experts_unit(l), j, backward, train, w, gw);
}
static inline void zero_gpu_ep_chunk_end(void* ctx, int l, int j, int backward, int train) {
    zero_gpu_chunk_end((ZeroGpu*)ctx, dbrx_experts_unit(l), j, backward, train);
}

// ExpertHooksGPU::forward: ye (rows, d) from xe over the chunks; train 0 (generation) in the decode scratch
static inline void zero_gpu_chunk_forward(void* ctx, int l, const int* offsets_host, const floatX* xe, floatX* ye, int train) {
    ZeroGpu* zg = (ZeroGpu*)ctx;
    Zero* z = &zg->z;
    DbrxGPU* m = zg->model;
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, Ec = z->chunk_experts, u = dbrx_experts_unit(l), K = z->unit_nchunks[u];
    floatX *g = train ? m->acts[l].g : m->dec.g, *uu = train ? m->acts[l].u : m->dec.u, *act = train ? m->acts[l].act : m->dec.act;
    std::vector<int> rel;
    for (int j = 0; j < K; j++) {
        int r0, r1;
        floatX* w[3];
        zero_gpu_chunk_begin(zg, u, j, false, train, w, nullptr);
        zero_chunk_rows(offsets_host, j, Ec, &r0, &r1, &rel);
        if (r1 > r0)
            experts_forward_gpu(ye + (size_t)r0 * d, g + (size_t)r0 * F, uu + (size_t)r0 * F, act + (size_t)r0 * F, xe + (size_t)r0 * d,
                                w[0], w[1], w[2], rel.data(), Ec, d, F);
        zero_gpu_chunk_end(zg, u, j, false, train);
    }
}

// ExpertHooksGPU::backward: dxe (rows, d) from dye; each chunk's weight gradients reduce-scattered when done
static inline void zero_gpu_chunk_backward(void* ctx, int l, const floatX* dye, floatX* dxe) {
    ZeroGpu* zg = (ZeroGpu*)ctx;
    Zero* z = &zg->z;
    DbrxGPU* m = zg->model;
    BlockActsGPU* a = &m->acts[l];
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, Ec = z->chunk_experts, u = dbrx_experts_unit(l), K = z->unit_nchunks[u];
    int rc = m->rc_mode[l];
    const int* offsets_host = a->offsets_host.data();
    std::vector<int> rel;
    for (int j = K - 1; j >= 0; j--) {
        int r0, r1;
        floatX* w[3];
        float* gw[3];
        zero_gpu_chunk_begin(zg, u, j, true, 1, w, gw);
        zero_chunk_rows(offsets_host, j, Ec, &r0, &r1, &rel);
        size_t rd = (size_t)r0 * d, rf = (size_t)r0 * F;
        if (r1 > r0) {
            if ((rc & RC_SWIGLU) && !(rc & RC_MOE))   // --recompute swiglu: this chunk's g, u, act (moe: the train-2 forward did)
                experts_forward_gpu(nullptr, a->g + rf, a->u + rf, a->act + rf, a->xe + rd, w[0], w[1], w[2], rel.data(), Ec, d, F);
            experts_backward_gpu(dxe + rd, gw[0], gw[1], gw[2], m->da + rf, m->dg + rf, m->du + rf, dye + rd, a->xe + rd, a->g + rf,
                                 a->u + rf, a->act + rf, w[0], w[1], w[2], rel.data(), Ec, d, F);
        }
        zero_gpu_chunk_end(zg, u, j, true, 1);
    }
}
