/*
 * expert_parallel_fp8.cuh — expert parallelism's chunked exchange (--ep-overlap-chunks C > 1) under --fp8 block: the
 * FP8 twin of ep_gpu_forward_chunked / ep_gpu_backward_chunked. Part of parallel/expert_parallel_cuda.cuh (included
 * after EpChunkRun).
 *
 * Why: the FP8 experts' GEMMs need every expert's rows padded to 16 and quantised segment by segment
 * (fp8_local_routing), which tied the exchange to one piece; at DBRX-132B on 64 GPUs that left the whole exchange
 * exposed (dev/bench/results_predicted.md). Here every exchange chunk is a padded layout of its own: chunk c holds, for
 * each local expert j, its rows [first, last) (ep_chunk_layout with align 16: every slice of an expert's rows but the
 * one with its last rows is a multiple of 16 rows, so the chunks together pad no more than the unchunked layout,
 * 15 rows an expert), laid chunk after chunk: chunk c's padded rows start at f8start[c], its experts' segments in
 * f8rt[c] (an Fp8Routing of its own, swapped into the model's place for the call). The experts' weights are quantised
 * once per layer pass for all the chunks (fp8_hold_expert_weights: w1, v1, w2 into the weight scratch w, w2, w3). On
 * the experts' stream each chunk
 * runs fp8_experts_forward_gpu (forward) or fp8_experts_backward_gpu (its input and weight gradients; the weight
 * gradients accumulate chunk after chunk) as it arrives, while the next is dispatched and the previous combined.
 *
 * Numbers: the forward and the input gradients are row by row (1x128 activation tiles, 128x128 weight blocks): as the
 * unchunked exchange's. The weight gradients' 128x1 tiles run over each chunk's rows of an expert (the unchunked: over
 * all its rows), and their sum is split at the chunks: close to the unchunked, not bit-identical
 * (test/test_ep_overlap.sh). The per-tensor recipes (delayed, current) keep the exchange in one piece: current scaling
 * needs the amax of a layer's rows before it quantises any of them.
 */
#pragma once

// The chunked exchange's weights (--ep-overlap-chunks > 1, block scaling, the weights gathered: fp8_gpu_buffers' hold,
// ep_fp8_hold): the experts' w1, v1, w2 of `layer`
// (E experts of F rows, C columns) quantised once into w, w2, w3 (the codes each wants: row-wise q, transposed qt) for
// every chunk's GEMMs, instead of once per chunk (fp8_weight_gpu returns them); the same codes and factors, as the
// weight is the same for the layer. Nothing held with the weight cache (it holds them already) or without w3. Under
// --fp8-gather every chunk's GEMMs read the gathered codes as they are: only their transposed copies are made here.
// fp8_release_expert_weights: back to quantising at every use.
static inline void fp8_hold_expert_weights(Fp8GPU* f, int layer, const floatX* w1, const floatX* v1, const floatX* w2, int E, int C, int F,
                                           const bool q[3], const bool qt[3], cudaStream_t stream) {
    if (f->wcache) return;
    const floatX* ws[3] = {w1, v1, w2};
    if (fp8_given_operand(f, w1, E * F, C, false, stream)) {   // (--fp8-gather: the gathered codes; the transposed copies the
        for (int i = 0; i < 3; i++)                            // chunks want made here, beside dispatch 0, as the hold would)
            ENSURE(fp8_given_operand(f, ws[i], E * F, C, qt[i], stream), "internal error: layer %d: expert weight %d gathered without codes", layer, i);
        return;
    }
    if (!f->w3.q) return;
    Fp8Buf* bufs[3] = {&f->w, &f->w2, &f->w3};
    for (int i = 0; i < 3; i++) {
        fp8_quantize_operand(f, fp8_slot(f, layer, FP8_LIN_W1 + i, FP8_OP_W), true, ws[i], E * F, C, fp8_uniform_segments(E, F), bufs[i], q[i],
                             qt[i], stream);
        f->held[i] = {ws[i], layer, q[i], qt[i]};
    }
}
static inline void fp8_release_expert_weights(Fp8GPU* f) {
    for (auto& h : f->held) h.src = nullptr;
}

// Chunk c's padded layout of layer l (ch: ep_chunk_layout's, align 16): its experts' rows, each padded to 16 (f8rt[c]),
// from f8start[c]; the padded row -> received row map (f8map: padding rows read received row 0, and are quantised as
// zeros) and the received row -> padded row map (f8inv), on the host for the device
static inline void ep_fp8_chunk_layout(EpDispatchGpu* D, int l, std::vector<int>* map, std::vector<int>* pinv) {
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    int El = D->model->cfg.n_experts / D->ep.n, C = ch->C;
    std::vector<int> off(El + 1);
    a->f8start.assign(C + 1, 0);
    map->clear();
    pinv->assign(a->plan.R, 0);
    for (int c = 0; c < C; c++) {
        Fp8Routing* rt = &a->f8rt[c];
        off[0] = 0;
        for (int j = 0; j < El; j++) off[j + 1] = off[j] + ch->last[(size_t)j * C + c] - ch->first[(size_t)j * C + c];
        fp8_routing_layout(rt, off.data(), El, 0);
        int P0 = a->f8start[c];
        a->f8start[c + 1] = P0 + rt->poff[El];
        map->resize(a->f8start[c + 1], 0);
        for (int j = 0; j < El; j++)
            for (int i = 0, r0 = ch->first[(size_t)j * C + c]; i < off[j + 1] - off[j]; i++) {
                int recv = ch->perm[r0 + i];
                (*map)[P0 + rt->poff[j] + i] = recv;
                (*pinv)[recv] = P0 + rt->poff[j] + i;
            }
    }
}

// the model's FP8 state set for chunk c of layer l (its padded layout in the layer's place, the scratch sized for the
// received rows: ep_fp8_scratch_swap), and back
static inline void ep_fp8_chunk_swap(EpDispatchGpu* D, int l, int c, bool in) {
    DbrxGPU* m = D->model;
    EpLayerGpu* a = &D->layers[l];
    std::swap(m->fp8.routing[l], a->f8rt[c]);
    if (in) ep_fp8_scratch_swap(D, (size_t)(a->f8start[c + 1] - a->f8start[c]), m->cfg.n_experts / D->ep.n);
    else ep_fp8_scratch_unswap(D);
}

// The forward (ep_gpu_forward_chunked's order): dispatch 0; for each chunk c: dispatch c + 1, chunk c's FP8 experts on
// the experts' stream (w1's quantisation gathers its rows from the received ones, fp8_experts_forward_gpu's xe_src),
// their results back to the received places, combine c - 1; then combine C - 1
static inline void ep_gpu_forward_chunked_fp8(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye) {
    DbrxGPU* m = D->model;
    const BlockViews<floatX>& w = m->p.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, El = m->cfg.n_experts / D->ep.n, C = ch->C;
    size_t R = a->plan.R, S = ch->send_start[C], Rp = a->f8start[C];
    const int* ix = a->cidx.p;   // map (Rp), pinv (R), stage (S), unstage (S)
    floatX* yl = D->y.get(Rp * d, "the experts' outputs");
    floatX* xl = a->xl.get(Rp * d, "the received rows (kept for the backward)");
    floatX *g = m->acts[l].g, *u = m->acts[l].u, *act = m->acts[l].act;   // (Rp, F) each: the model's, planned
    if (Rp > m->expert_rows) fail(EXIT_RUNTIME, "internal error: expert parallelism: %zu rows, the model's buffers hold %zu", Rp, m->expert_rows);
    // (xl's transposed codes for the backward in its place, unless --recompute swiglu reads xl again)
    bool xe_codes = !((m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE));
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' results"), ye, D->x.get(R * d, "the received rows"), xe, ix + Rp + R};
    cudaCheck(cudaEventRecord(D->ev_start, 0));   // (the weight scratch: after the attention's GEMMs read it)
    cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_start, 0));
    const bool q[3] = {true, true, false}, qt[3] = {false, false, true};   // (w1, v1 row-wise; w2 transposed)
    if (Rp) fp8_hold_expert_weights(&m->fp8, l, w.w1, w.v1, w.w2, El, d, F, q, qt, D->sx);   // once for the chunks, beside dispatch 0
    run.dispatch(0);
    for (int c = 0; c < C; c++) {
        if (c + 1 < C) run.dispatch(c + 1);
        cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[c], 0));
        size_t P0 = a->f8start[c], Pc = a->f8start[c + 1] - P0;
        if (Pc) {
            ep_fp8_chunk_swap(D, l, c, true);
            fp8_experts_forward_gpu(&m->fp8, l, yl + P0 * d, g + P0 * F, u + P0 * F, act ? act + P0 * F : nullptr, xl + P0 * d, w.w1, w.v1,
                                    w.w2, El, d, F, D->sx, run.recv, ix + P0, xe_codes);
            ep_fp8_chunk_swap(D, l, c, false);
        }
        run.finish(c, yl, ix + Rp);   // (back to the received places; combine c - 1)
    }
    fp8_release_expert_weights(&m->fp8);
    run.combine(C - 1);   // (it waits for the last chunk's experts: everything on the experts' stream)
    if (S) moe_gather_gpu(ye, run.home, ix + Rp + R + S, (int)S, d);   // xe's layout
}

// The backward: dye's rows chunk by chunk to the experts' ranks; on the experts' stream, as each chunk arrives, its
// padded rows gathered, --recompute swiglu's g, u (act) of them, fp8_experts_backward_gpu's input gradients, those
// back to the received places, then its weight gradients (added to the layer's) while they are combined; the next
// chunk dispatched and the previous combined beside it. So the last chunk's combine is hidden behind its weight
// gradients, as ep_gpu_backward_chunked's behind the experts' weight gradients
static inline void ep_gpu_backward_chunked_fp8(EpDispatchGpu* D, int l, const floatX* dye, floatX* dxe) {
    DbrxGPU* m = D->model;
    const BlockViews<floatX>& w = m->p.blocks[l];
    const BlockViews<float>& gw = m->g.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    const BlockActsGPU* ma = &m->acts[l];
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, El = m->cfg.n_experts / D->ep.n, C = ch->C;
    size_t R = a->plan.R, S = ch->send_start[C], Rp = a->f8start[C];
    const int* ix = a->cidx.p;
    floatX* dyl = D->y.get(Rp * d, "the experts' output gradients");
    floatX* dxl = D->dx.get(Rp * d, "the experts' input gradients");
    floatX *da = m->da, *dg = m->dg, *du = m->du, *xl = a->xl.p;   // (Rp, F) each (DbrxGPU::expert_rows)
    bool rc = (m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE);
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' input gradients"), dxe, D->x.get(R * d, "the received rows"), dye, ix + Rp + R};
    cudaCheck(cudaEventRecord(D->ev_start, 0));
    cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_start, 0));
    if (m->rc_mode[l] & RC_CSWIGLU) gpu_decompress_rows(m, l, (int)Rp, D->sx);   // --compress-acts: rebuilt from the codes
    // (w2 row-wise, w1 and v1 transposed; --recompute swiglu's forward also w1 and v1 row-wise: it stops before w2)
    const bool q[3] = {rc, rc, true}, qt[3] = {true, true, false};
    if (Rp) fp8_hold_expert_weights(&m->fp8, l, w.w1, w.v1, w.w2, El, d, F, q, qt, D->sx);
    run.dispatch(0);
    for (int c = 0; c < C; c++) {
        if (c + 1 < C) run.dispatch(c + 1);
        cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[c], 0));
        size_t P0 = a->f8start[c], Pc = a->f8start[c + 1] - P0, rd = P0 * d, rf = P0 * F;
        floatX* act = ma->act ? ma->act + rf : nullptr;
        if (Pc) {
            moe_gather_gpu(dyl + rd, run.recv, ix + P0, (int)Pc, d, D->sx);   // the padded layout (padding: quantised as zeros)
            ep_fp8_chunk_swap(D, l, c, true);
            if (rc) {   // --recompute swiglu: g, u, act of the kept rows again (recording no amax)
                m->fp8.frozen = true;
                fp8_experts_forward_gpu(&m->fp8, l, nullptr, ma->g + rf, ma->u + rf, act, xl + rd, w.w1, w.v1, w.w2, El, d, F, D->sx);
                m->fp8.frozen = false;
            }
            fp8_experts_backward_gpu(&m->fp8, l, dxl + rd, gw.w1, gw.v1, gw.w2, da + rf, dg + rf, du + rf, dyl + rd, xl + rd, ma->g + rf,
                                     ma->u + rf, w.w1, w.v1, w.w2, El, d, F, D->sx, 1.0f, FP8_BWD_DATA);
        }
        run.finish(c, dxl, ix + Rp);   // (back to the received places; combine c - 1)
        if (Pc) {   // the weight gradients after the input gradients left: the combine of chunk c runs beside them
            fp8_experts_backward_gpu(&m->fp8, l, dxl + rd, gw.w1, gw.v1, gw.w2, da + rf, dg + rf, du + rf, dyl + rd, xl + rd, ma->g + rf,
                                     ma->u + rf, w.w1, w.v1, w.w2, El, d, F, D->sx, 1.0f, FP8_BWD_WEIGHTS);
            ep_fp8_chunk_swap(D, l, c, false);
        }
    }
    fp8_release_expert_weights(&m->fp8);
    cudaCheck(cudaEventRecord(D->ev_end, D->sx));
    run.combine(C - 1);   // (beside the last chunk's weight gradients)
    cudaCheck(cudaStreamWaitEvent(0, D->ev_end, 0));   // (the weight gradients: the unit's end reduces them)
    if (S) moe_gather_gpu(dxe, run.home, ix + Rp + R + S, (int)S, d);   // dye's layout
}
