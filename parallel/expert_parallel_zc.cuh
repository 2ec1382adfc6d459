/*
 * expert_parallel_zc.cuh — expert parallelism's chunked exchange (--ep-overlap-chunks > 1) with the store's chunks of
 * my experts (--zero-chunk-mib: zc_K chunks of zc_Ec whole experts, each gathered and reduce-scattered by the store).
 * Part of parallel/expert_parallel_cuda.cuh (included after EpChunkRun).
 *
 * The exchange's chunks are the weight chunks: exchange chunk k carries the rows of every rank's experts
 * [k Ec, (k + 1) Ec), i.e. of each rank's weight chunk k (ep_zc_chunk_layout). A chunk's rows are then complete
 * when its weight chunk's experts are, and go home at once, beside the next weight chunk's experts:
 *   forward    dispatch 0; for k: weight chunk k gathered (the store prefetches k + 1), its experts over exchange
 *              chunk k's rows on the experts' stream, dispatch k + 1 and combine k - 1 beside them; combine K - 1
 *   backward   dispatch K - 1; for k = K - 1 .. 0: weight chunk k gathered (the store prefetches k - 1, and with
 *              the first, --recompute moe/block, the block below into its recompute slot), the input gradients of
 *              chunk k's rows, then dispatch k - 1 and combine k beside chunk k's weight gradients, which the store
 *              reduce-scatters at once
 * (Before session 33 the weight chunks ran outside the exchange's row chunks, whose combines all waited for the
 * last weight chunk: the exchange exposed. parallel/README.md, "A bounded working set".) Every expert's rows are
 * computed in one piece, with the GEMMs of experts_forward_gpu / experts_backward_gpu, expert by expert: the
 * same numbers as the unit whole, bit for bit (test/test_zero_chunks.sh).
 */
#pragma once

// Exchange chunk k of layer pl = the rows of every rank's experts [k Ec, (k + 1) Ec); offsets (E + 1): xe's rows
// per expert (this rank's routing). The fields of ep_chunk_layout's EpChunks, C = K, with the same meaning: the
// sender's rows of a chunk for peer r are its rows for r's experts of the chunk (xe order, staged chunk-major);
// from peer q come its rows for my experts of the chunk, in expert order; the expert-major order is ep_plan's
// (my expert j: every peer's rows, in peer order), each expert's rows in one chunk. With balanced routing every
// rank sends about 1/K of its rows to every peer in each chunk.
static inline void ep_zc_chunk_layout(const ExpertParallel* ep, const EpPlan* pl, const int* offsets, int E, int K, int Ec, EpChunks* ch) {
    int n = ep->n, El = E / n, me = ep->rank;
    const std::vector<int>& all = pl->all;   // (n, E)
    const int* lo = pl->loffsets.data();
    ENSURE(K * Ec == El, "internal error: %d weight chunks of %d experts for %d local experts", K, Ec, El);
    ch->C = K;
    ch->send_rows.assign((size_t)K * n, 0); ch->recv_rows.assign((size_t)K * n, 0);
    ch->send_start.assign(K + 1, 0); ch->recv_start.assign(K + 1, 0);
    ch->first.assign((size_t)El * K, 0); ch->last.assign((size_t)El * K, 0);
    for (int j = 0; j < El; j++)
        for (int c = 0; c < K; c++) {
            ch->first[(size_t)j * K + c] = lo[j];
            ch->last[(size_t)j * K + c] = c == j / Ec ? lo[j + 1] : lo[j];
        }
    ch->stage.clear(); ch->perm.assign(pl->R, 0); ch->inv.clear();
    for (int c = 0; c < K; c++) {
        for (int r = 0; r < n; r++)   // what I send: to rank r, my rows for its experts of chunk c
            for (int j = c * Ec; j < (c + 1) * Ec; j++) {
                int e = r * El + j;
                for (int i = offsets[e]; i < offsets[e + 1]; i++) ch->stage.push_back(i);
                ch->send_rows[(size_t)c * n + r] += offsets[e + 1] - offsets[e];
            }
        for (int q = 0; q < n; q++)   // what I receive: from peer q, its rows for my experts of chunk c
            for (int j = c * Ec; j < (c + 1) * Ec; j++) {
                int s0 = lo[j], cnt = all[(size_t)q * E + me * El + j];
                for (int qq = 0; qq < q; qq++) s0 += all[(size_t)qq * E + me * El + j];
                for (int s = s0; s < s0 + cnt; s++) { ch->perm[s] = (int)ch->inv.size(); ch->inv.push_back(s); }
                ch->recv_rows[(size_t)c * n + q] += cnt;
            }
        ch->send_start[c + 1] = ch->stage.size();
        ch->recv_start[c + 1] = ch->inv.size();
    }
    ch->unstage.assign(ch->stage.size(), 0);
    for (size_t s = 0; s < ch->stage.size(); s++) ch->unstage[ch->stage[s]] = (int)s;
}

// The experts' stream D->sx after the compute stream's work so far (to_sx: weight chunk k's gather, the dispatches'
// waits), or the compute stream after the experts' (before the store releases weight chunk k)
static inline void ep_gpu_zc_sync(EpDispatchGpu* D, bool to_sx) {
    cudaEvent_t e = to_sx ? D->ev_start : D->ev_end;
    cudaCheck(cudaEventRecord(e, to_sx ? 0 : D->sx));
    cudaCheck(cudaStreamWaitEvent(to_sx ? D->sx : 0, e, 0));
}

// The forward (the top comment). The issue order, the same on every rank whatever the counts (an empty chunk is
// still exchanged): dispatch 0; for each k: weight chunk k's gather (the store), dispatch k + 1, combine k - 1; then
// combine K - 1. Each exchange is issued after weight chunk k's experts (the compute stream waits for it, and the
// experts of chunk k + 1 wait for the compute stream), so it runs beside them.
static inline void ep_gpu_forward_zc(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye) {
    DbrxGPU* m = D->model;
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, K = D->zc_K, Ec = D->zc_Ec;
    size_t R = a->plan.R, S = ch->send_start[K];
    const int* ix = a->cidx.p;   // perm (R), inv (R), stage (S), unstage (S)
    const int* lo = a->plan.loffsets.data();
    ENSURE(ch->C == K && (int)D->ev_in.size() >= K, "internal error: the exchange in %d chunks for %d weight chunks", ch->C, K);
    floatX* yl = D->y.get(R * d, "the experts' outputs");
    floatX* xl = a->xl.get(R * d, "the received rows (kept for the backward)");
    floatX *g = m->acts[l].g, *u = m->acts[l].u, *act = m->acts[l].act;
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' results"), ye, D->x.get(R * d, "the received rows"), xe, ix + 2 * R};
    std::vector<int> rel;
    run.dispatch(0);
    for (int k = 0; k < K; k++) {
        floatX* w[3];
        D->zc_begin(D->zc_ctx, l, k, 0, D->train, w, nullptr);
        ep_gpu_zc_sync(D, true);
        cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[k], 0));
        size_t r0 = ep_zc_rows(D, lo, k, &rel), p0 = ch->recv_start[k], pr = ch->recv_start[k + 1] - p0;   // (pr = rel[Ec])
        if (pr) {
            moe_gather_gpu(xl + r0 * d, run.recv, ix + r0, (int)pr, d, D->sx);   // expert-major
            experts_forward_gpu(yl + r0 * d, g + r0 * F, u + r0 * F, act + r0 * F, xl + r0 * d, w[0], w[1], w[2], rel.data(), Ec, d, F, D->sx);
            moe_gather_gpu(run.recv + p0 * d, yl, ix + R + p0, (int)pr, d, D->sx);   // back to the received places
        }
        cudaCheck(cudaEventRecord(D->ev_out[k], D->sx));
        if (k + 1 < K) run.dispatch(k + 1);
        if (k >= 1) run.combine(k - 1);
        ep_gpu_zc_sync(D, false);
        D->zc_end(D->zc_ctx, l, k, 0, D->train);
    }
    run.combine(K - 1);
    if (S) moe_gather_gpu(ye, run.home, ix + 2 * R + S, (int)S, d);   // xe's layout
}

// The backward (the top comment): weight chunks in reverse, each: gathered, its gradient slot zeroed (the store),
// --recompute swiglu's g, u, act of its rows, their input gradients (ep_gpu_backward_chunked's GEMMs, expert by
// expert over its rows), dispatch k - 1 and combine k, then its weight gradients (beside them), reduce-scattered by
// the store at once. Issue order: dispatch K - 1; for k = K - 1 .. 0: the store's gathers, dispatch k - 1, combine k.
static inline void ep_gpu_backward_zc(EpDispatchGpu* D, int l, const floatX* dye, floatX* dxe) {
    DbrxGPU* m = D->model;
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    const BlockActsGPU* ma = &m->acts[l];
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, K = D->zc_K, Ec = D->zc_Ec;
    size_t R = a->plan.R, S = ch->send_start[K];
    const int* ix = a->cidx.p;
    const int* lo = a->plan.loffsets.data();
    ENSURE(ch->C == K && (int)D->ev_in.size() >= K, "internal error: the exchange in %d chunks for %d weight chunks", ch->C, K);
    floatX* dyl = D->y.get(R * d, "the experts' output gradients");
    floatX* dxl = D->dx.get(R * d, "the experts' input gradients");
    floatX *da = m->da, *dg = m->dg, *du = m->du, *xl = a->xl.p;
    bool rc = (m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE);
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' input gradients"), dxe, D->x.get(R * d, "the received rows"), dye, ix + 2 * R};
    ep_gpu_zc_sync(D, true);
    if (m->rc_mode[l] & RC_CSWIGLU) gpu_decompress_rows(m, l, (int)R, D->sx);   // --compress-acts: rebuilt from the codes
    run.dispatch(K - 1);
    std::vector<int> rel;
    for (int k = K - 1; k >= 0; k--) {
        floatX* w[3];
        float* gw[3];
        D->zc_begin(D->zc_ctx, l, k, 1, 1, w, gw);
        ep_gpu_zc_sync(D, true);
        cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[k], 0));
        size_t k0 = ep_zc_rows(D, lo, k, &rel), p0 = ch->recv_start[k], pr = ch->recv_start[k + 1] - p0;
        if (pr) moe_gather_gpu(dyl + k0 * d, run.recv, ix + k0, (int)pr, d, D->sx);   // expert-major
        if (rc && pr)
            experts_forward_gpu(nullptr, ma->g + k0 * F, ma->u + k0 * F, ma->act + k0 * F, xl + k0 * d, w[0], w[1], w[2], rel.data(), Ec, d, F, D->sx);
        for (int j = k * Ec; j < (k + 1) * Ec; j++) {   // the input gradients (experts_backward_gpu's), expert by expert
            int r0 = lo[j], rows = lo[j + 1] - lo[j];
            if (!rows) continue;
            size_t wo = (size_t)(j - k * Ec) * F * d, rF = (size_t)r0 * F;
            gemm_gpu(false, true, rows, F, d, 1.0f, dyl + (size_t)r0 * d, d, w[2] + wo, d, 0.0f, da + rF, F, D->sx);
            swiglu_backward_gpu(dg + rF, du + rF, da + rF, ma->g + rF, ma->u + rF, (size_t)rows * F, D->sx);
            matmul_backward_gpu(dxl + (size_t)r0 * d, (float*)nullptr, dg + rF, nullptr, w[0] + wo, rows, d, F, 0.0f, D->sx);
            matmul_backward_gpu(dxl + (size_t)r0 * d, (float*)nullptr, du + rF, nullptr, w[1] + wo, rows, d, F, 1.0f, D->sx);
        }
        if (pr) moe_gather_gpu(run.recv + p0 * d, dxl, ix + R + p0, (int)pr, d, D->sx);   // back to the received places
        cudaCheck(cudaEventRecord(D->ev_out[k], D->sx));
        if (k > 0) run.dispatch(k - 1);
        run.combine(k);
        long long sd, sg;   // the weight gradients of the chunk's experts (ep_gpu_backward_chunked's GEMMs)
        bool swap, pair = pair_strides(dg, du, sizeof(floatX), gw[0], gw[1], sizeof(float), &sd, &sg, &swap);
        for (int j = k * Ec; j < (k + 1) * Ec; j++) {
            int r0 = lo[j], n = lo[j + 1] - lo[j];
            if (n == 0) continue;
            size_t wo = (size_t)(j - k * Ec) * F * d, rF = (size_t)r0 * F;
            gemm_gpu(true, false, F, d, n, 1.0f, ma->act + rF, F, dyl + (size_t)r0 * d, d, 1.0f, gw[2] + wo, d, D->sx);
            if (pair) {
                gemm_gpu_batched(true, false, F, d, n, 1.0f, (swap ? du : dg) + rF, F, sd, xl + (size_t)r0 * d, d, 0, 1.0f,
                                 (swap ? gw[1] : gw[0]) + wo, d, sg, 2, D->sx);
                continue;
            }
            matmul_backward_gpu((floatX*)nullptr, gw[0] + wo, dg + rF, xl + (size_t)r0 * d, w[0] + wo, n, d, F, 0.0f, D->sx);
            matmul_backward_gpu((floatX*)nullptr, gw[1] + wo, du + rF, xl + (size_t)r0 * d, w[1] + wo, n, d, F, 0.0f, D->sx);
        }
        ep_gpu_zc_sync(D, false);
        D->zc_end(D->zc_ctx, l, k, 1, 1);
    }
    if (S) moe_gather_gpu(dxe, run.home, ix + 2 * R + S, (int)S, d);   // dye's layout
}
