/*
 * expert_parallel_zc.cuh — expert parallelism's chunked exchange (--ep-overlap-chunks > 1) with the store's chunks of
 * my experts (--zero-chunk-mib: zc_K chunks of zc_Ec whole experts, each gathered and reduce-scattered by the store).
 * Part of parallel/expert_parallel_cuda.cuh (included after EpChunkRun).
 *
 * The exchange runs in the weight chunks, each in Rs = --ep-overlap-chunks row slices: exchange chunk c = (k, s),
 * c = k Rs + s, carries slice s of the rows of every rank's experts [k Ec, (k + 1) Ec), i.e. of each rank's weight
 * chunk k (ep_zc_chunk_layout). A slice's rows go to work as they arrive and home as soon as they are done, beside the
 * next slice's experts:
 *   forward    dispatch 0; for k: weight chunk k gathered (the store prefetches k + 1); for each of its slices c: the
 *              experts over slice c's rows on the experts' stream, dispatch c + 1 and combine c - 1 beside them;
 *              combine C - 1
 *   backward   dispatch C - 1; for k = K - 1 .. 0: weight chunk k gathered (the store prefetches k - 1, and with
 *              the first, --recompute moe/block, the block below into its recompute slot), --recompute swiglu's
 *              g, u, act of its rows (they need no exchange), then for c = its slices in reverse: the input
 *              gradients of slice c's rows, dispatch c - 1 and combine c + 1 beside them; its last slice's combine
 *              beside the chunk's weight gradients, which the store reduce-scatters at once
 * What nothing in a layer covers is its fill (the forward's first dispatch, the backward's) and drain (the forward's
 * last combine): the slices make them 1/Rs of a weight chunk's rows, and the slice order makes them a rank's own
 * rows (chunk 0's first slice and chunk K - 1's last hold, with balanced routing, the rows a rank routes to its own
 * experts when Rs >= EP degree, mostly so below), which never leave the GPU.
 * (Before session 33 the weight chunks ran outside the exchange's row chunks, whose combines all waited for the
 * last weight chunk: the exchange exposed; session 33's first version exchanged whole weight chunks: the fill and
 * drain 1/K of the layer's rows. parallel/README.md, "A bounded working set".) Every expert's weight gradients run
 * over its rows in one piece with the GEMMs of experts_backward_gpu; its forward and input gradients row by row over
 * the slices (as ep_gpu_forward_chunked's): the same numbers as the unit whole, bit for bit on the emulated GPU
 * (test/test_zero_chunks.sh, test/test_ep_overlap.sh; on a GPU as far as cuBLASLt computes a row the same whatever
 * the rows in the call: parallel/README.md, "Bit for bit").
 */
#pragma once

// Exchange chunk (k, s), index k Rs + s, of layer pl = row slice s of every rank's experts [k Ec, (k + 1) Ec):
// the C = K Rs chunks of ep_chunk_layout's EpChunks, with the same meaning and the same slicing within each weight
// chunk (rank r's expert j: its expert-major rows, every peer's in peer order, cut at lo_j + cnt_j t / Rs; rank r
// takes slice (s + r Rs / n + [k = K - 1]) mod Rs in sub-chunk s: every rank sends to about n / Rs ranks in each,
// and chunk 0's first slice and chunk K - 1's last, a layer's fill and drain, are the slice of rank r's own rows).
// offsets (E + 1): xe's rows per expert (this rank's routing). Slicing so keeps every row's place in the
// expert-major order: the forward and the input gradients are row by row, the weight gradients run over each
// expert's rows in one piece after its weight chunk's last slice (parallel/README.md, "Bit for bit").
static inline void ep_zc_chunk_layout(const ExpertParallel* ep, const EpPlan* pl, const int* offsets, int E, int K, int Ec, int Rs,
                                      EpChunks* ch) {
    int n = ep->n, El = E / n, me = ep->rank, C = K * Rs;
    const std::vector<int>& all = pl->all;   // (n, E)
    ENSURE(K * Ec == El && Rs >= 1, "internal error: %d weight chunks of %d experts (%d slices) for %d local experts", K, Ec, Rs, El);
    std::vector<int> lo((size_t)n * (El + 1), 0), base((size_t)n * n * El, 0);   // rank r's expert j: lo[r][j]; peer q's first row there
    for (int r = 0; r < n; r++)
        for (int j = 0; j < El; j++) {
            int s = lo[(size_t)r * (El + 1) + j];
            for (int q = 0; q < n; q++) { base[((size_t)q * n + r) * El + j] = s; s += all[(size_t)q * E + r * El + j]; }
            lo[(size_t)r * (El + 1) + j + 1] = s;
        }
    auto bound = [&](int r, int j, int t) {
        int a = lo[(size_t)r * (El + 1) + j], b = lo[(size_t)r * (El + 1) + j + 1];
        return a + (int)((long long)(b - a) * t / Rs);
    };
    auto slice = [&](int r, int c) { return (int)((c % Rs + (long long)r * Rs / n + (c / Rs == K - 1)) % Rs); };
    auto piece = [&](int q, int r, int j, int c, int* s0, int* s1) {   // peer q's rows for rank r's expert j in chunk c
        int b = base[((size_t)q * n + r) * El + j], e = b + all[(size_t)q * E + r * El + j], t = slice(r, c);
        *s0 = std::max(b, bound(r, j, t)); *s1 = std::max(*s0, std::min(e, bound(r, j, t + 1)));
    };
    ch->C = C;   // (the row counts and lists: ep_chunk_lists)
    ch->first.assign((size_t)El * C, 0); ch->last.assign((size_t)El * C, 0);
    for (int j = 0; j < El; j++)
        for (int c = 0; c < C; c++) {
            bool in = c / Rs == j / Ec;
            ch->first[(size_t)j * C + c] = in ? bound(me, j, slice(me, c)) : pl->loffsets[j];
            ch->last[(size_t)j * C + c] = in ? bound(me, j, slice(me, c) + 1) : pl->loffsets[j];
        }
    // chunk c = k Rs + s: slice s of the rows of every rank's experts of weight chunk k
    ep_chunk_lists(ch, offsets, n, me, El, pl->R, piece, [&](int q, int r, int j) { return base[((size_t)q * n + r) * El + j]; },
                   [&](int c) { return c / Rs * Ec; }, [&](int c) { return (c / Rs + 1) * Ec; });
}

// The experts' stream D->sx after the compute stream's work so far (to_sx: weight chunk k's gather, the dispatches'
// waits), or the compute stream after the experts' (before the store releases weight chunk k)
static inline void ep_gpu_zc_sync(EpDispatchGpu* D, bool to_sx) {
    cudaEvent_t e = to_sx ? D->ev_start : D->ev_end;
    cudaCheck(cudaEventRecord(e, to_sx ? 0 : D->sx));
    cudaCheck(cudaStreamWaitEvent(to_sx ? D->sx : 0, e, 0));
}

// A slice's rows of the weight chunk k's experts on the experts' stream (expert by expert, as ep_gpu_forward_chunked):
// gathered expert-major from the received rows, the forward, the results back to the received places
static inline void ep_zc_slice_forward(EpDispatchGpu* D, const EpChunkRun& run, int l, int k, int c, floatX* const* w, floatX* xl, floatX* yl) {
    DbrxGPU* m = D->model;
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, Ec = D->zc_Ec;
    size_t R = D->layers[l].plan.R;
    const int* ix = D->layers[l].cidx.p;
    floatX *g = m->acts[l].g, *u = m->acts[l].u, *act = m->acts[l].act;
    for (int j = k * Ec; j < (k + 1) * Ec; j++) {
        int rows, r0 = run.rows_of(j, c, &rows), off[2] = {0, rows};
        if (!rows) continue;
        size_t wo = (size_t)(j - k * Ec) * F * d, rd = (size_t)r0 * d, rF = (size_t)r0 * F;
        moe_gather_gpu(xl + rd, run.recv, ix + r0, rows, d, D->sx);   // expert-major
        experts_forward_gpu(yl + rd, g + rF, u + rF, act + rF, xl + rd, w[0] + wo, w[1] + wo, w[2] + wo, off, 1, d, F, D->sx);
    }
    size_t p0 = run.ch->recv_start[c], pr = run.ch->recv_start[c + 1] - p0;
    if (pr) moe_gather_gpu(run.recv + p0 * d, yl, ix + R + p0, (int)pr, d, D->sx);   // back to the received places
    cudaCheck(cudaEventRecord(D->ev_out[c], D->sx));
}

// The forward (the top comment). The issue order, the same on every rank whatever the counts (an empty slice is
// still exchanged): dispatch 0; for each weight chunk k: its gather (the store); for each of its slices c: dispatch
// c + 1, combine c - 1; then combine C - 1. Each exchange is issued after slice c's experts (the compute stream
// waits for it, and the experts of weight chunk k + 1 wait for the compute stream), so it runs beside them.
static inline void ep_gpu_forward_zc(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye) {
    DbrxGPU* m = D->model;
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    int d = m->cfg.d_model, K = D->zc_K, Rs = D->chunks, C = K * Rs;
    size_t R = a->plan.R, S = ch->send_start[C];
    const int* ix = a->cidx.p;   // perm (R), inv (R), stage (S), unstage (S)
    ENSURE(ch->C == C && (int)D->ev_in.size() >= C, "internal error: the exchange in %d chunks for %d weight chunks of %d slices", ch->C, K, Rs);
    floatX* yl = D->y.get(R * d, "the experts' outputs");
    floatX* xl = a->xl.get(R * d, "the received rows (kept for the backward)");
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' results"), ye, D->x.get(R * d, "the received rows"), xe, ix + 2 * R};
    run.dispatch(0);
    for (int k = 0; k < K; k++) {
        floatX* w[3];
        D->zc_begin(D->zc_ctx, l, k, 0, D->train, w, nullptr);
        ep_gpu_zc_sync(D, true);
        for (int c = k * Rs; c < (k + 1) * Rs; c++) {
            cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[c], 0));
            ep_zc_slice_forward(D, run, l, k, c, w, xl, yl);
            if (c + 1 < C) run.dispatch(c + 1);
            if (c >= 1) run.combine(c - 1);
        }
        ep_gpu_zc_sync(D, false);
        D->zc_end(D->zc_ctx, l, k, 0, D->train);
    }
    run.combine(C - 1);
    if (S) moe_gather_gpu(ye, run.home, ix + 2 * R + S, (int)S, d);   // xe's layout
}

// The backward (the top comment): weight chunks in reverse, each: gathered, its gradient slot zeroed (the store),
// --recompute swiglu's g, u, act of its rows (before its first slice arrives: they need only the kept rows), then
// slice by slice the input gradients (ep_gpu_backward_chunked's GEMMs, expert by expert over the slice's rows), the
// next slice dispatched and the previous combined beside them; the last slice combined beside the chunk's weight
// gradients (over each expert's rows in one piece), which the store reduce-scatters at once. Issue order: the first
// slice of chunk K - 1; for k = K - 1 .. 0, the store's gathers, then per slice: the next slice's dispatch (chunk
// k - 1's first after chunk k's last), the previous slice's combine; and chunk k's last slice's combine.
static inline void ep_gpu_backward_zc(EpDispatchGpu* D, int l, const floatX* dye, floatX* dxe) {
    DbrxGPU* m = D->model;
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    const BlockActsGPU* ma = &m->acts[l];
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, K = D->zc_K, Ec = D->zc_Ec, Rs = D->chunks, C = K * Rs;
    size_t R = a->plan.R, S = ch->send_start[C];
    const int* ix = a->cidx.p;
    const int* lo = a->plan.loffsets.data();
    ENSURE(ch->C == C && (int)D->ev_in.size() >= C, "internal error: the exchange in %d chunks for %d weight chunks of %d slices", ch->C, K, Rs);
    floatX* dyl = D->y.get(R * d, "the experts' output gradients");
    floatX* dxl = D->dx.get(R * d, "the experts' input gradients");
    floatX *da = m->da, *dg = m->dg, *du = m->du, *xl = a->xl.p;
    bool rc = (m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE);
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' input gradients"), dxe, D->x.get(R * d, "the received rows"), dye, ix + 2 * R};
    ep_gpu_zc_sync(D, true);
    if (m->rc_mode[l] & RC_CSWIGLU) gpu_decompress_rows(m, l, (int)R, D->sx);   // --compress-acts: rebuilt from the codes
    run.dispatch(C - 1);
    std::vector<int> rel;
    for (int k = K - 1; k >= 0; k--) {
        floatX* w[3];
        float* gw[3];
        D->zc_begin(D->zc_ctx, l, k, 1, 1, w, gw);
        ep_gpu_zc_sync(D, true);
        size_t k0 = ep_zc_rows(D, lo, k, &rel);
        if (rc && rel[Ec])
            experts_forward_gpu(nullptr, ma->g + k0 * F, ma->u + k0 * F, ma->act + k0 * F, xl + k0 * d, w[0], w[1], w[2], rel.data(), Ec, d, F, D->sx);
        for (int c = (k + 1) * Rs - 1; c >= k * Rs; c--) {   // (the slices in reverse too: the first, C - 1, is my own rows')
            cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[c], 0));
            for (int j = k * Ec; j < (k + 1) * Ec; j++) {   // the input gradients (experts_backward_gpu's), expert by expert
                int rows, r0 = run.rows_of(j, c, &rows);
                if (!rows) continue;
                size_t wo = (size_t)(j - k * Ec) * F * d, rF = (size_t)r0 * F;
                moe_gather_gpu(dyl + (size_t)r0 * d, run.recv, ix + r0, rows, d, D->sx);   // expert-major
                gemm_gpu(false, true, rows, F, d, 1.0f, dyl + (size_t)r0 * d, d, w[2] + wo, d, 0.0f, da + rF, F, D->sx);
                swiglu_backward_gpu(dg + rF, du + rF, da + rF, ma->g + rF, ma->u + rF, (size_t)rows * F, D->sx);
                matmul_backward_gpu(dxl + (size_t)r0 * d, (float*)nullptr, dg + rF, nullptr, w[0] + wo, rows, d, F, 0.0f, D->sx);
                matmul_backward_gpu(dxl + (size_t)r0 * d, (float*)nullptr, du + rF, nullptr, w[1] + wo, rows, d, F, 1.0f, D->sx);
            }
            size_t p0 = ch->recv_start[c], pr = ch->recv_start[c + 1] - p0;
            if (pr) moe_gather_gpu(run.recv + p0 * d, dxl, ix + R + p0, (int)pr, d, D->sx);   // back to the received places
            cudaCheck(cudaEventRecord(D->ev_out[c], D->sx));
            if (c > 0) run.dispatch(c - 1);   // (the next slice: of this chunk, or chunk k - 1's last)
            if (c + 1 < (k + 1) * Rs) run.combine(c + 1);
        }
        run.combine(k * Rs);
        long long sd, sg;   // the weight gradients of the chunk's experts (ep_gpu_backward_chunked's GEMMs)
        bool swap;
        ep_gpu_wgrad_pair(dg, du, gw[0], gw[1], &sd, &sg, &swap);
        for (int j = k * Ec; j < (k + 1) * Ec; j++) {
            int r0 = lo[j], n = lo[j + 1] - lo[j];
            if (n == 0) continue;
            size_t wo = (size_t)(j - k * Ec) * F * d, rF = (size_t)r0 * F;
            gemm_gpu(true, false, F, d, n, 1.0f, ma->act + rF, F, dyl + (size_t)r0 * d, d, 1.0f, gw[2] + wo, d, D->sx);
            gemm_gpu_batched(true, false, F, d, n, 1.0f, (swap ? du : dg) + rF, F, sd, xl + (size_t)r0 * d, d, 0, 1.0f,
                             (swap ? gw[1] : gw[0]) + wo, d, sg, 2, D->sx);
        }
        ep_gpu_zc_sync(D, false);
        D->zc_end(D->zc_ctx, l, k, 1, 1);
    }
    if (S) moe_gather_gpu(dxe, run.home, ix + 2 * R + S, (int)S, d);   // dye's layout
}
