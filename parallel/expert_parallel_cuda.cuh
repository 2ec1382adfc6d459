/*
 * expert_parallel_cuda.cuh — expert parallelism on the CUDA backend: parallel/expert_parallel.h's token
 * dispatcher for the GPU model (model/dbrx_cuda.cuh), hooked into its experts forward and backward
 * (DbrxGPU::experts). The plan (ep_plan) and the exchange (ep_exchange) are the CPU's: the plan comes from
 * the counts on the host (the expert GEMMs are issued from the host anyway); the rows travel over the
 * store's transport (NCCL, parallel/zero_gpu.cuh). Every device buffer is planned at start-up for the rows
 * --ep-capacity-factor allows (ep_plan_rows): no step allocates or frees device memory (a cudaFree
 * synchronises the whole device, in-flight NCCL work included), except when a routing needs more rows than
 * any before it: then every rank of the EP group grows them at the same point (expert_parallel_grow.cuh).
 * Defines
 *   EpDev            a device buffer planned at start-up (the received rows: their number changes every step)
 *   EpDispatchGpu    the dispatcher's state: the plans and device buffers kept for the backward, scratch
 *   ep_gpu_buffers   its device buffers for a number of planned rows: allocated, or only added up (--dry-run)
 *   ep_gpu_install   hooks it into the model; ep_gpu_free releases its buffers and unhooks it
 *   dbrx_ep_recv_rows, dbrx_ep_totals   its statistics, for the training loop
 *   ep_gpu_store_chunks  --zero-chunk-mib: my experts in chunks, gathered and reduced by the store chunk by chunk
 */
#pragma once
#include <vector>
#include "expert_parallel.h"
#include "../model/dbrx_cuda.cuh"

// A device buffer planned at start-up (ep_gpu_buffers) for the most elements a layer can need under the
// planned rows: ep_plan grows it (ep_gpu_grow) before a routing needs more.
template <typename T> struct EpDev {
    T* p = nullptr;
    size_t cap = 0;
    T* get(size_t n, const char* what) {
        if (n > cap) fail(EXIT_RUNTIME, "internal error: expert parallelism: %s needs %zu elements, %zu were planned", what, n, cap);
        return p;
    }
};

// one layer's exchange, and my experts' received rows, kept for the backward (their activations g, u, act:
// the model's own buffers of the layer, sized for the planned rows: DbrxGPU::expert_rows)
typedef struct {
    EpPlan plan;
    EpDev<floatX> xl;                // (Rc, d)
    EpDev<int> perm, inv;            // (Rc): expert-major row i = received row perm[i]; inv its inverse
    EpChunks ch;                     // --ep-overlap-chunks > 1: the chunked exchange's layout (ep_chunk_layout)
    EpDev<int> cidx;                 // ... and its indices on the device: perm, inv (R each), stage, unstage (N k each)
                                     // (--fp8 block: the padded row map, pinv, stage, unstage: expert_parallel_fp8.cuh)
    std::vector<Fp8Routing> f8rt;    // --fp8 block, chunked: each chunk's padded layout (C), from padded row f8start[c] (C + 1)
    std::vector<int> f8start;
} EpLayerGpu;

typedef struct {
    ExpertParallel ep;
    DbrxGPU* model;
    std::vector<EpLayerGpu> layers;            // (L)
    EpDev<floatX> x, y;                        // scratch: (Rc, d) x2 (the gradients da, dg, du: the model's)
    EpDev<floatX> dx, dxr;                     // (Rc, d) BF16 input gradients, expert-major and in peer order
    EpDev<__nv_fp8_storage_t> f8q[4];          // under --fp8: activation and gradient codes (q, qt) of the received rows
    EpDev<float> f8s[4];                       // and their block-scaling factors (the model's Fp8Buf hold N k + 15 E rows)
    EpStats stats;
    std::vector<void*> allocations;
    int chunks = 1;                            // --ep-overlap-chunks (ep_gpu_set_chunks): 1, the unchunked exchange
    cudaStream_t sx = 0;                       // chunks > 1: the experts' stream (the compute stream waits on the exchanges)
    std::vector<cudaEvent_t> ev_in, ev_out;    // (chunks): chunk c received (on the compute stream); its experts done (sx)
    cudaEvent_t ev_start = nullptr, ev_end = nullptr;
    // --zero-chunk-mib under EP (zero_chunk_experts > 0, BF16): my E/n experts in zc_K chunks of zc_Ec, each gathered,
    // run and (backward) reduce-scattered through the store's hooks (parallel/zero_gpu_chunks.cuh: zc_begin hands
    // chunk j's w1, v1, w2 and gradients); zc_K 1: the unit whole, its views in the model (m->p, m->g)
    int zc_K = 1, zc_Ec = 0, train = 1;        // train: the forward hook's (1 training, 2 its recomputation, 0 decode)
    void* zc_ctx = nullptr;
    void (*zc_begin)(void* ctx, int l, int j, int backward, int train, floatX** w, float** gw) = nullptr;
    void (*zc_end)(void* ctx, int l, int j, int backward, int train) = nullptr;
} EpDispatchGpu;

// chunk j's rows of my experts (expert-major offsets lo): the first row, and the offsets relative to it (Ec + 1)
static inline int ep_zc_rows(const EpDispatchGpu* D, const int* lo, int j, std::vector<int>* rel) {
    int Ec = D->zc_Ec, r0 = lo[j * Ec];
    rel->resize(Ec + 1);
    for (int e = 0; e <= Ec; e++) (*rel)[e] = lo[j * Ec + e] - r0;
    return r0;
}

// The chunked exchange's w1 / v1 weight gradients as one batch of 2 (experts_backward_gpu's pair): [dg | du] is one
// buffer of the model (dbrx_gpu_buffers) and dw1, dv1 are in the unit's order, so the two strides always share a sign
static inline void ep_gpu_wgrad_pair(const floatX* dg, const floatX* du, const float* gw1, const float* gv1, long long* sd, long long* sg,
                                     bool* swap) {
    ENSURE(pair_strides(dg, du, sizeof(floatX), gw1, gv1, sizeof(float), sd, sg, swap), "internal error: the experts' dg, du "
           "and their w1, v1 gradients are not two pairs of one direction (the batched weight-gradient GEMM)");
}

// my experts' BF16 forward over their received rows xl (expert-major, offsets lo): the unit whole, or chunk by
// chunk through the store, each chunk's experts over their rows (the same GEMMs, expert by expert)
static inline void ep_gpu_local_forward(EpDispatchGpu* D, int l, floatX* yl, floatX* g, floatX* u, floatX* act, const floatX* xl,
                                        const int* lo) {
    DbrxGPU* m = D->model;
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, El = m->cfg.n_experts / D->ep.n;
    if (D->zc_K <= 1) {
        const BlockViews<floatX>& w = m->p.blocks[l];
        experts_forward_gpu(yl, g, u, act, xl, w.w1, w.v1, w.w2, lo, El, d, F);
        return;
    }
    std::vector<int> rel;
    for (int j = 0; j < D->zc_K; j++) {
        floatX* w[3];
        D->zc_begin(D->zc_ctx, l, j, 0, D->train, w, nullptr);
        size_t r0 = ep_zc_rows(D, lo, j, &rel);
        if (rel[D->zc_Ec] > 0)
            experts_forward_gpu(yl + r0 * d, g + r0 * F, u + r0 * F, act + r0 * F, xl + r0 * d, w[0], w[1], w[2], rel.data(), D->zc_Ec, d, F);
        D->zc_end(D->zc_ctx, l, j, 0, D->train);
    }
}

// its backward, chunks in reverse (--recompute swiglu: each chunk's g, u, act first), each chunk's weight gradients
// reduce-scattered by the store as soon as they are done
static inline void ep_gpu_local_backward_chunks(EpDispatchGpu* D, int l, floatX* dxl, const floatX* dyl, const floatX* xl, const int* lo) {
    DbrxGPU* m = D->model;
    const BlockActsGPU* ma = &m->acts[l];
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, Ec = D->zc_Ec;
    bool rc = (m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE);
    std::vector<int> rel;
    for (int j = D->zc_K - 1; j >= 0; j--) {
        floatX* w[3];
        float* gw[3];
        D->zc_begin(D->zc_ctx, l, j, 1, 1, w, gw);
        size_t r0 = ep_zc_rows(D, lo, j, &rel), rd = r0 * d, rf = r0 * F;
        if (rel[Ec] > 0) {
            if (rc) experts_forward_gpu(nullptr, ma->g + rf, ma->u + rf, ma->act + rf, xl + rd, w[0], w[1], w[2], rel.data(), Ec, d, F);
            experts_backward_gpu(dxl + rd, gw[0], gw[1], gw[2], m->da + rf, m->dg + rf, m->du + rf, dyl + rd, xl + rd, ma->g + rf,
                                 ma->u + rf, ma->act + rf, w[0], w[1], w[2], rel.data(), Ec, d, F);
        }
        D->zc_end(D->zc_ctx, l, j, 1, 1);
    }
}

// The rows every buffer of the experts' side is planned for, per MoE layer, on an EP group of n: ep_plan_rows,
// and under --fp8 the padding of the local experts' rows to multiples of 16 (fp8_local_routing: < 16 per expert)
static inline size_t ep_gpu_planned_rows(const DbrxConfig* c, size_t N, int n, double factor, bool f8) {
    return ep_plan_rows(c, N, n, factor) + (f8 ? (size_t)15 * (c->n_experts / n) : 0);
}

// Walks the dispatcher's own device buffers for Rc planned rows per layer (ep_gpu_planned_rows) on an EP
// group of n: allocates them when D is given, and adds up the bytes either way (the memory check, --dry-run).
// recipe: the FP8 recipe (FP8_OFF: none). Per layer (Rc, d) BF16 + 2 Rc ints; scratch 4 (Rc, d) BF16; under
// --fp8 four (Rc, max(d, F)) code buffers, and with block scaling their factors.
static inline size_t ep_gpu_buffers(EpDispatchGpu* D, const DbrxConfig* c, int n, size_t Rc, int recipe) {
    size_t bytes = 0, d = c->d_model, F = c->ffn_hidden, El = c->n_experts / n;
    auto take = [&](auto* b, size_t elems) {
        using T = std::remove_reference_t<decltype(*b->p)>;
        bytes += elems * sizeof(T);
        if (!D) return;
        b->p = device_alloc<T>(elems, __FILE__, __LINE__);
        b->cap = elems;
        D->allocations.push_back(b->p);
    };
    EpLayerGpu sizing;
    for (int l = 0; l < c->n_layers; l++) {
        EpLayerGpu* a = D ? &D->layers[l] : &sizing;
        take(&a->xl, Rc * d); take(&a->perm, Rc); take(&a->inv, Rc);
    }
    EpDispatchGpu scratch;
    EpDispatchGpu* s = D ? D : &scratch;
    take(&s->x, Rc * d); take(&s->y, Rc * d); take(&s->dx, Rc * d); take(&s->dxr, Rc * d);
    if (recipe != FP8_OFF) {
        size_t elems, sq, st;
        fp8_expert_scratch_sizes(std::max<size_t>(Rc, 1), d, F, El, &elems, &sq, &st);
        for (int i = 0; i < 4; i++) take(&s->f8q[i], elems);
        if (recipe == FP8_BLOCK) for (int i = 0; i < 4; i++) take(&s->f8s[i], i % 2 ? st : sq);
    }
    return bytes;
}

// --ep-overlap-chunks N > 1: the device memory the chunked exchange adds to ep_gpu_buffers' for Rc planned rows
// and Nk routed rows (tokens x top-k) per micro-batch on an EP group of n: per layer its indices (ep_chunk_layout's
// perm, inv, stage, unstage: 2 Rc + 2 Nk ints; --fp8 block: every chunk's segment table, E/n N chunks of 2 E/n + 1
// ints), and room
// for Nk rows in the scratch dxr (the sender's results come back there: Rc rows already, unless
// --ep-capacity-factor < 1). recipe: the FP8 recipe; under a per-tensor one the exchange stays whole (ep_gpu_chunks).
static inline size_t ep_gpu_chunk_bytes(const DbrxConfig* c, size_t Rc, size_t Nk, int n, int chunks, int recipe) {
    chunks = ep_gpu_chunks(chunks, recipe);
    if (chunks <= 1) return 0;
    size_t El = c->n_experts / n, seg = recipe == FP8_BLOCK ? (size_t)chunks * El * (2 * El + 1) : 0;
    return (size_t)c->n_layers * (2 * Rc + 2 * Nk + seg) * sizeof(int) + (Nk > Rc ? (Nk - Rc) * c->d_model * sizeof(floatX) : 0);
}

// Under --fp8: the model's activation and gradient FP8 scratch swapped with buffers for Rp received
// rows in El segments (the expert GEMMs quantise into f->act and f->grad); swapped back after
static inline void ep_fp8_scratch_swap(EpDispatchGpu* D, size_t Rp, int El) {
    DbrxGPU* m = D->model;
    const DbrxConfig* c = &m->cfg;
    size_t elems, sq, st;   // (within the planned: Rp is at most the planned rows)
    fp8_expert_scratch_sizes(std::max<size_t>(Rp, 1), c->d_model, c->ffn_hidden, El, &elems, &sq, &st);
    bool blk = m->fp8.cfg.recipe == FP8_BLOCK;
    Fp8Buf* bufs[2] = {&m->fp8.act, &m->fp8.grad};
    for (int i = 0; i < 2; i++) {
        Fp8Buf mine = {D->f8q[2 * i].get(elems, "the received rows' FP8 codes"), D->f8q[2 * i + 1].get(elems, "the received rows' FP8 codes"),
                       blk ? D->f8s[2 * i].get(sq, "the received rows' FP8 scales") : nullptr,
                       blk ? D->f8s[2 * i + 1].get(st, "the received rows' FP8 scales") : nullptr};
        Fp8Buf t = *bufs[i];
        *bufs[i] = mine;
        D->f8q[2 * i].p = t.q; D->f8q[2 * i + 1].p = t.qt; D->f8s[2 * i].p = t.sinv; D->f8s[2 * i + 1].p = t.sinv_t;
    }
}
// (the swap back: the same exchange of pointers; the capacities stay with the EP buffers)
static inline void ep_fp8_scratch_unswap(EpDispatchGpu* D) {
    DbrxGPU* m = D->model;
    Fp8Buf* bufs[2] = {&m->fp8.act, &m->fp8.grad};
    for (int i = 0; i < 2; i++) {
        Fp8Buf t = *bufs[i];
        *bufs[i] = {D->f8q[2 * i].p, D->f8q[2 * i + 1].p, D->f8s[2 * i].p, D->f8s[2 * i + 1].p};
        D->f8q[2 * i].p = t.q; D->f8q[2 * i + 1].p = t.qt; D->f8s[2 * i].p = t.sinv; D->f8s[2 * i + 1].p = t.sinv_t;
    }
}

// The experts of layer l under expert parallelism (as ep_experts_forward_rows on the CPU): xe's rows to
// their experts' ranks, this rank's experts over every peer's rows, the results back into ye in xe's
// layout. xe's rows grouped by expert (offsets on the host); layer l's plan and buffers are kept for the
// backward. Collective in the EP group: the training forward's rows, or the decode step's k rows of its
// token (f8 false: BF16; layer l's training plan and buffers serve as scratch). Under --fp8 the local
// experts' FP8 GEMMs run on the received rows in a padded layout of their own (fp8_local_routing): perm
// maps a padded row to a received row, inv a received row (expert-major) to its padded row.
static inline void ep_gpu_forward_chunked(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye);
static inline void ep_gpu_forward_zc(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye);
static inline void ep_gpu_forward_chunked_fp8(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye);
static inline void ep_fp8_chunk_layout(EpDispatchGpu* D, int l, std::vector<int>* map, std::vector<int>* pinv);
static inline void ep_zc_chunk_layout(const ExpertParallel* ep, const EpPlan* pl, const int* offsets, int E, int K, int Ec, int Rs,
                                      EpChunks* ch);
static inline void ep_gpu_experts_forward_rows(EpDispatchGpu* D, int l, const int* offsets_host, const floatX* xe, floatX* ye, bool f8,
                                               bool recompute = false, bool chunked = false) {
    DbrxGPU* m = D->model;
    const DbrxConfig* c = &m->cfg;
    const BlockViews<floatX>& w = m->p.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    int d = c->d_model, E = c->n_experts, F = c->ffn_hidden, El = E / D->ep.n;
    std::vector<int> counts(E);
    for (int e = 0; e < E; e++) counts[e] = offsets_host[e + 1] - offsets_host[e];
    EpPlan* pl = &a->plan;
    if (!recompute) {   // (the backward's recomputation, --recompute moe/block: the forward's plan, kept; nothing counted again)
        ep_plan(&D->ep, pl, counts.data(), offsets_host, E, l);
        ep_stats_add(&D->stats, &D->ep, pl);
    }
    size_t R = pl->R;
    if (chunked) {   // --ep-overlap-chunks > 1: the layout and its indices (one copy), kept for the recomputation and the backward
        if (!recompute) {
            EpChunks* ch = &a->ch;
            if (D->zc_K > 1) ep_zc_chunk_layout(&D->ep, pl, offsets_host, E, D->zc_K, D->zc_Ec, D->chunks, ch);   // (the weight chunks' slices)
            else ep_chunk_layout(&D->ep, pl, offsets_host, E, D->chunks, ch, f8 ? 16 : 1);
            std::vector<int> idx(ch->perm), pinv;
            if (f8) ep_fp8_chunk_layout(D, l, &idx, &pinv);   // (FP8: the chunks' padded layouts; the padded row map, its inverse)
            const std::vector<int>& back = f8 ? pinv : ch->inv;
            idx.insert(idx.end(), back.begin(), back.end());
            idx.insert(idx.end(), ch->stage.begin(), ch->stage.end());
            idx.insert(idx.end(), ch->unstage.begin(), ch->unstage.end());
            int* ix = a->cidx.get(idx.size(), "the chunked exchange's row order");
            if (!idx.empty()) cudaCheck(cudaMemcpy(ix, idx.data(), idx.size() * sizeof(int), cudaMemcpyHostToDevice));
        }
        if (f8) ep_gpu_forward_chunked_fp8(D, l, xe, ye);
        else if (D->zc_K > 1) ep_gpu_forward_zc(D, l, xe, ye);
        else ep_gpu_forward_chunked(D, l, xe, ye);
        return;
    }
    std::vector<int> inv(R), perm = pl->perm;
    for (size_t i = 0; i < R; i++) inv[pl->perm[i]] = (int)i;
    size_t Rc = R;   // rows the experts compute: R, or under FP8 the padded layout's
    if (f8) {        // padded row -> received row = perm[map]; received row -> padded row = pinv[inv]
        std::vector<int> map, pinv;
        Rc = fp8_local_routing(&m->fp8, l, pl->loffsets.data(), El, &map, &pinv);
        perm.assign(Rc, 0);
        for (size_t p = 0; p < Rc; p++) perm[p] = R ? pl->perm[map[p]] : 0;
        for (size_t i = 0; i < R; i++) inv[i] = pinv[inv[i]];
    }
    int* perm_d = a->perm.get(Rc, "the expert-parallel row order");
    int* inv_d = a->inv.get(R, "the expert-parallel row order");
    if (Rc) cudaCheck(cudaMemcpy(perm_d, perm.data(), Rc * sizeof(int), cudaMemcpyHostToDevice));
    if (R) cudaCheck(cudaMemcpy(inv_d, inv.data(), R * sizeof(int), cudaMemcpyHostToDevice));
    floatX* xr = D->x.get(R * d, "the received rows");
    floatX* xl = a->xl.get(Rc * d, "the received rows (kept for the backward)");
    if (Rc > m->expert_rows) fail(EXIT_RUNTIME, "internal error: expert parallelism: %zu rows, the model's buffers hold %zu", Rc, m->expert_rows);
    floatX *g = m->acts[l].g, *u = m->acts[l].u, *act = m->acts[l].act;   // (Rc, F) each: the model's, planned
    floatX* yl = D->y.get(Rc * d, "the experts' outputs");
    ep_exchange(&D->ep, pl, xe, xr, d * sizeof(floatX), 0);             // (R, d) in peer order
    if (R && !f8) moe_gather_gpu(xl, xr, perm_d, (int)Rc, d);            // expert-major
    if (f8 && Rc) {   // (FP8: the padded expert-major rows gathered by w1's quantisation itself, model/fp8_fused.cuh)
        ep_fp8_scratch_swap(D, Rc, El);
        // (xl's transposed codes for the backward in its place, unless --recompute swiglu reads xl again)
        bool xe_codes = !((m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE));
        fp8_experts_forward_gpu(&m->fp8, l, yl, g, u, act, xl, w.w1, w.v1, w.w2, El, d, F, 0, xr, perm_d, xe_codes);
        ep_fp8_scratch_unswap(D);
    } else if (!f8)
        ep_gpu_local_forward(D, l, yl, g, u, act, xl, pl->loffsets.data());
    if (R) moe_gather_gpu(xr, yl, inv_d, (int)R, d);                     // back in peer order
    ep_exchange(&D->ep, pl, xr, ye, d * sizeof(floatX), 1);              // and home, in xe's layout
}

// --ep-overlap-chunks C > 1, the BF16 training step: the exchange in C chunks (ep_chunk_layout) on the EP group's
// stream, chunk c's experts on the experts' stream D->sx meanwhile. The issue order, the same on every rank
// whatever the counts (an empty chunk is still exchanged): dispatch 0; for each chunk c: dispatch c + 1,
// chunk c's experts, combine c - 1; then combine C - 1. The transport makes the compute stream wait for each
// exchange (zero_gpu_ep_all_to_allv); chunk c's experts wait only for its dispatch (ev_in[c], recorded on the
// compute stream right after it), combine c only for them (ev_out[c]): on the EP stream dispatch c + 1 and
// combine c - 1 run while chunk c computes. The sender's rows are staged chunk-major (stage), chunk by chunk
// before its dispatch, in its output buffer, the results come back into the scratch dxr, and go to the
// output's layout at the end (unstage).
// A chunk's received rows go to their expert-major places (perm), its results back to the received places
// (inv), in place over the consumed rows. Every row is computed as unchunked: its own GEMM rows.
struct EpChunkRun {
    EpDispatchGpu* D;
    const EpChunks* ch;
    floatX *home, *staged, *recv;   // the sender's results (dxr), its staged rows, the received rows (chunk-major)
    const floatX* src;              // the sender's rows (xe, dye), staged chunk by chunk (stage: the indices on the device)
    const int* stage;
    void dispatch(int c) {
        int d = D->model->cfg.d_model;
        size_t s0 = ch->send_start[c], rows = ch->send_start[c + 1] - s0;
        if (rows) moe_gather_gpu(staged + s0 * d, src, stage + s0, (int)rows, d);   // (chunk c + 1's beside chunk c's experts)
        ep_exchange_chunk(&D->ep, ch, c, staged + ch->send_start[c] * d, recv + ch->recv_start[c] * d, d * sizeof(floatX), 0);
        cudaCheck(cudaEventRecord(D->ev_in[c], 0));
    }
    void combine(int c) {
        int d = D->model->cfg.d_model;
        cudaCheck(cudaStreamWaitEvent(0, D->ev_out[c], 0));
        ep_exchange_chunk(&D->ep, ch, c, recv + ch->recv_start[c] * d, home + ch->send_start[c] * d, d * sizeof(floatX), 1);
    }
    // chunk c done on the experts' stream: its results (rows of `from`; back: the row of each received row there) to
    // the received places, and (on the EP stream, beside the next chunk's experts) chunk c - 1 combined
    void finish(int c, const floatX* from, const int* back) {
        int d = D->model->cfg.d_model;
        size_t p0 = ch->recv_start[c], pr = ch->recv_start[c + 1] - p0;
        if (pr) moe_gather_gpu(recv + p0 * d, from, back + p0, (int)pr, d, D->sx);
        cudaCheck(cudaEventRecord(D->ev_out[c], D->sx));
        if (c >= 1) combine(c - 1);
    }
    // chunk c's rows of local expert j: its first expert-major row, *rows of them
    int rows_of(int j, int c, int* rows) const {
        size_t i = (size_t)j * ch->C + c;
        *rows = ch->last[i] - ch->first[i];
        return ch->first[i];
    }
};

static inline void ep_gpu_forward_chunked(EpDispatchGpu* D, int l, const floatX* xe, floatX* ye) {
    DbrxGPU* m = D->model;
    const BlockViews<floatX>& w = m->p.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, El = m->cfg.n_experts / D->ep.n, C = ch->C;
    size_t R = a->plan.R, S = ch->send_start[C];
    const int* ix = a->cidx.p;   // perm (R), inv (R), stage (S), unstage (S)
    floatX* yl = D->y.get(R * d, "the experts' outputs");
    floatX* xl = a->xl.get(R * d, "the received rows (kept for the backward)");
    floatX *g = m->acts[l].g, *u = m->acts[l].u, *act = m->acts[l].act;   // (R, F) each, expert-major
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' results"), ye, D->x.get(R * d, "the received rows"), xe, ix + 2 * R};
    run.dispatch(0);
    for (int c = 0; c < C; c++) {
        if (c + 1 < C) run.dispatch(c + 1);
        cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[c], 0));
        for (int j = 0; j < El; j++) {
            int rows, r0 = run.rows_of(j, c, &rows);
            if (!rows) continue;
            int off[2] = {0, rows};
            size_t wo = (size_t)j * F * d;
            moe_gather_gpu(xl + (size_t)r0 * d, run.recv, ix + r0, rows, d, D->sx);
            experts_forward_gpu(yl + (size_t)r0 * d, g + (size_t)r0 * F, u + (size_t)r0 * F, act + (size_t)r0 * F, xl + (size_t)r0 * d,
                                w.w1 + wo, w.v1 + wo, w.w2 + wo, off, 1, d, F, D->sx);
        }
        run.finish(c, yl, ix + R);
    }
    run.combine(C - 1);
    if (S) moe_gather_gpu(ye, run.home, ix + 2 * R + S, (int)S, d);   // xe's layout
}

// Its backward: dye's rows chunk by chunk to the experts' ranks (staged in dxe), each chunk's input gradients
// (dgrad: row by row) on the experts' stream while the next is dispatched and the previous combined; the
// weight gradients after the last chunk over every expert's rows in one piece, the unchunked order and GEMMs
// of experts_backward_gpu (the same sums), while the last chunk goes home
static inline void ep_gpu_backward_chunked(EpDispatchGpu* D, int l, const floatX* dye, floatX* dxe) {
    DbrxGPU* m = D->model;
    const BlockViews<floatX>& w = m->p.blocks[l];
    const BlockViews<float>& gw = m->g.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    const EpChunks* ch = &a->ch;
    const BlockActsGPU* ma = &m->acts[l];
    int d = m->cfg.d_model, F = m->cfg.ffn_hidden, El = m->cfg.n_experts / D->ep.n, C = ch->C;
    size_t R = a->plan.R, S = ch->send_start[C];
    const int* ix = a->cidx.p;
    const int* lo = a->plan.loffsets.data();
    floatX* dyl = D->y.get(R * d, "the experts' output gradients");
    floatX* dxl = D->dx.get(R * d, "the experts' input gradients");
    floatX *da = m->da, *dg = m->dg, *du = m->du, *xl = a->xl.p;   // (R, F) each, expert-major (DbrxGPU::expert_rows)
    EpChunkRun run{D, ch, D->dxr.get(S * d, "the routed rows' input gradients"), dxe, D->x.get(R * d, "the received rows"), dye, ix + 2 * R};
    cudaCheck(cudaEventRecord(D->ev_start, 0));
    cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_start, 0));
    if ((m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE))   // --recompute swiglu: g, u, act of the kept rows again
        experts_forward_gpu(nullptr, ma->g, ma->u, ma->act, xl, w.w1, w.v1, w.w2, lo, El, d, F, D->sx);
    if (m->rc_mode[l] & RC_CSWIGLU) gpu_decompress_rows(m, l, (int)R, D->sx);   // --compress-acts: rebuilt from the codes
    run.dispatch(0);
    for (int c = 0; c < C; c++) {
        if (c + 1 < C) run.dispatch(c + 1);
        cudaCheck(cudaStreamWaitEvent(D->sx, D->ev_in[c], 0));
        for (int j = 0; j < El; j++) {   // experts_backward_gpu's input gradient, on chunk c's rows of expert j
            int rows, r0 = run.rows_of(j, c, &rows);
            if (!rows) continue;
            size_t wo = (size_t)j * F * d, rF = (size_t)r0 * F;
            floatX* dy = dyl + (size_t)r0 * d;
            moe_gather_gpu(dy, run.recv, ix + r0, rows, d, D->sx);
            gemm_gpu(false, true, rows, F, d, 1.0f, dy, d, w.w2 + wo, d, 0.0f, da + rF, F, D->sx);
            swiglu_backward_gpu(dg + rF, du + rF, da + rF, ma->g + rF, ma->u + rF, (size_t)rows * F, D->sx);
            matmul_backward_gpu(dxl + (size_t)r0 * d, (float*)nullptr, dg + rF, nullptr, w.w1 + wo, rows, d, F, 0.0f, D->sx);
            matmul_backward_gpu(dxl + (size_t)r0 * d, (float*)nullptr, du + rF, nullptr, w.v1 + wo, rows, d, F, 1.0f, D->sx);
        }
        run.finish(c, dxl, ix + R);
    }
    long long sd, sg;   // the weight gradients: experts_backward_gpu's GEMMs, over each expert's rows
    bool swap;
    ep_gpu_wgrad_pair(dg, du, gw.w1, gw.v1, &sd, &sg, &swap);
    for (int j = 0; j < El; j++) {
        int r0 = lo[j], n = lo[j + 1] - lo[j];
        if (n == 0) continue;
        size_t wo = (size_t)j * F * d, rF = (size_t)r0 * F;
        gemm_gpu(true, false, F, d, n, 1.0f, ma->act + rF, F, dyl + (size_t)r0 * d, d, 1.0f, gw.w2 + wo, d, D->sx);
        gemm_gpu_batched(true, false, F, d, n, 1.0f, (swap ? du : dg) + rF, F, sd, xl + (size_t)r0 * d, d, 0, 1.0f,
                         (swap ? gw.v1 : gw.w1) + wo, d, sg, 2, D->sx);
    }
    cudaCheck(cudaEventRecord(D->ev_end, D->sx));
    run.combine(C - 1);
    cudaCheck(cudaStreamWaitEvent(0, D->ev_end, 0));   // (the weight gradients: the unit's end reduces them)
    if (S) moe_gather_gpu(dxe, run.home, ix + 2 * R + S, (int)S, d);   // dye's layout
}

#include "expert_parallel_zc.cuh"   // (--ep-overlap-chunks with --zero-chunk-mib: the exchange in the weight chunks)
#include "expert_parallel_fp8.cuh"  // (--ep-overlap-chunks with --fp8 block: every chunk a padded FP8 layout of its own)

// DBRX_DEBUG_PLANT=ep_regrow, the allocation budget's negative control (test/test_cuda_train.sh): the scratch x
// freed and allocated again in every training forward, as the buffers that grew with the routing once were
static inline void ep_plant_regrow(EpDispatchGpu* D) {
    auto it = std::find(D->allocations.begin(), D->allocations.end(), (void*)D->x.p);
    cudaCheck(cudaFree(D->x.p));
    D->x.p = device_alloc<floatX>(D->x.cap, __FILE__, __LINE__);
    *it = D->x.p;
}

// the GPU model's experts forward hook (ExpertHooksGPU::forward): train 1, the training forward (FP8
// under --fp8, the rows-received maximum restarted at its first layer); 0, generation's token (BF16)
static inline void ep_gpu_experts_forward(void* ctx, int l, const int* offsets_host, const floatX* xe, floatX* ye, int train) {
    EpDispatchGpu* D = (EpDispatchGpu*)ctx;
    if (train == 1 && l == 0) D->stats.recv_max = 0;   // (train 2: its recomputation in the backward, --recompute moe/block)
    if (train == 1 && l == 0 && g_debug_hooks.plant == PLANT_EP_REGROW) ep_plant_regrow(D);
    bool f8 = train && fp8_on(&D->model->fp8);
    D->train = train;
    bool chunked = train && D->chunks > 1;   // (decode: in one piece)
    ep_gpu_experts_forward_rows(D, l, offsets_host, xe, ye, f8, train == 2, chunked);
    DbrxGPU* m = D->model;
    int Rp = !f8 ? (int)D->layers[l].plan.R : chunked ? D->layers[l].f8start.back() : m->fp8.routing[l].poff[m->cfg.n_experts / D->ep.n];
    if (train == 1 && (m->rc_mode[l] & RC_CSWIGLU)) gpu_compress_rows(m, l, Rp);   // --compress-acts: the received rows' g, u (FP8: padded)
}

// Its backward (ExpertHooksGPU::backward): dye's rows to the experts' ranks, the experts' backward there
// (weight gradients of my experts, from every peer's rows), dxe back in xe's layout.
static inline void ep_gpu_experts_backward(void* ctx, int l, const floatX* dye, floatX* dxe) {
    EpDispatchGpu* D = (EpDispatchGpu*)ctx;
    DbrxGPU* m = D->model;
    const DbrxConfig* c = &m->cfg;
    const BlockViews<floatX>& w = m->p.blocks[l];
    const BlockViews<float>& gw = m->g.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    int d = c->d_model, F = c->ffn_hidden, El = c->n_experts / D->ep.n;
    EpPlan* pl = &a->plan;
    size_t R = pl->R;
    bool f8 = fp8_on(&m->fp8);
    if (D->chunks > 1) {
        if (f8) ep_gpu_backward_chunked_fp8(D, l, dye, dxe);
        else if (D->zc_K > 1) ep_gpu_backward_zc(D, l, dye, dxe);
        else ep_gpu_backward_chunked(D, l, dye, dxe);
        return;
    }
    size_t Rc = f8 ? (size_t)m->fp8.routing[l].poff[El] : R;   // the forward's layout (FP8: padded)
    floatX* dyr = D->x.get(R * d, "the received rows");
    floatX* dyl = D->y.get(Rc * d, "the experts' outputs");
    floatX* dxl = D->dx.get(Rc * d, "the experts' input gradients");
    floatX* dxr = D->dxr.get(R * d, "the experts' input gradients");
    floatX *da = m->da, *dg = m->dg, *du = m->du;   // (Rc, F) each: the model's, planned (DbrxGPU::expert_rows)
    const BlockActsGPU* ma = &m->acts[l];
    ep_exchange(&D->ep, pl, dye, dyr, d * sizeof(floatX), 0);
    if (R) moe_gather_gpu(dyl, dyr, a->perm.p, (int)Rc, d);
    if (!f8 && D->zc_K > 1) {   // --zero-chunk-mib: chunk by chunk (--compress-acts: rebuilt first)
        if (m->rc_mode[l] & RC_CSWIGLU) gpu_decompress_rows(m, l, (int)Rc);
        ep_gpu_local_backward_chunks(D, l, dxl, dyl, a->xl.p, pl->loffsets.data());
        if (R) moe_gather_gpu(dxr, dxl, a->inv.p, (int)R, d);
        ep_exchange(&D->ep, pl, dxr, dxe, d * sizeof(floatX), 1);
        return;
    }
    if ((m->rc_mode[l] & RC_SWIGLU) && !(m->rc_mode[l] & RC_MOE)) {   // --recompute swiglu: g, u, act of the kept rows again
        m->fp8.frozen = true;                                          // (moe/block: the recomputed forward, train 2, left them)
        if (f8 && Rc) {
            ep_fp8_scratch_swap(D, Rc, El);
            fp8_experts_forward_gpu(&m->fp8, l, nullptr, ma->g, ma->u, ma->act, a->xl.p, w.w1, w.v1, w.w2, El, d, F);
            ep_fp8_scratch_unswap(D);
        } else if (!f8)
            experts_forward_gpu(nullptr, ma->g, ma->u, ma->act, a->xl.p, w.w1, w.v1, w.w2, pl->loffsets.data(), El, d, F);
        m->fp8.frozen = false;
    }
    if (m->rc_mode[l] & RC_CSWIGLU) gpu_decompress_rows(m, l, (int)Rc);   // --compress-acts: rebuilt from the codes
    if (f8 && Rc) {
        ep_fp8_scratch_swap(D, Rc, El);
        fp8_experts_backward_gpu(&m->fp8, l, dxl, gw.w1, gw.v1, gw.w2, da, dg, du, dyl, a->xl.p, ma->g, ma->u, w.w1,
                                 w.v1, w.w2, El, d, F);
        ep_fp8_scratch_unswap(D);
    } else if (!f8)
        experts_backward_gpu(dxl, gw.w1, gw.v1, gw.w2, da, dg, du, dyl, a->xl.p, ma->g, ma->u, ma->act, w.w1, w.v1, w.w2,
                             pl->loffsets.data(), El, d, F);
    if (R) moe_gather_gpu(dxr, dxl, a->inv.p, (int)R, d);
    ep_exchange(&D->ep, pl, dxr, dxe, d * sizeof(floatX), 1);   // BF16 rows: half the bytes of fp32
}

#include "expert_parallel_grow.cuh"   // (a routing past the planned rows: every buffer of them grown, ExpertParallel::grow)

// Expert parallelism of degree n on the GPU model `m`, this rank EP rank `rank`, the rows over
// `all_to_allv(ctx, ...)` (the store's transport): the dispatcher hooked into the model's experts, its
// buffers planned for `factor` (--ep-capacity-factor: ep_plan_rows) and allocated now (grown later only where a
// routing needs more: ep_gpu_grow). The model was built with room for those rows in its experts' buffers
// (dbrx_build_shape's expert_rows).

static inline void ep_gpu_install(EpDispatchGpu* D, DbrxGPU* m, int n, int rank, double factor,
                                  void (*all_to_allv)(void*, const void*, const size_t*, void*, const size_t*, int), void* ctx) {
    D->ep.n = n; D->ep.rank = rank; D->ep.all_to_allv = all_to_allv; D->ep.ctx = ctx;
    D->model = m;
    D->layers.assign(m->cfg.n_layers, EpLayerGpu());
    D->stats = EpStats{0, 0, 0, 0};
    size_t N = (size_t)m->B * m->T;
    D->ep.cap = ep_plan_rows(&m->cfg, N, n, factor, &D->ep.cap_how);
    D->ep.cap_max = ep_plan_rows(&m->cfg, N, n, 0);
    D->ep.rows_mean = N * m->cfg.top_k;
    D->ep.grow = ep_gpu_grow;
    D->ep.grow_ctx = D;
    size_t Rc = ep_gpu_planned_rows(&m->cfg, N, n, factor, fp8_on(&m->fp8));
    if (Rc > m->expert_rows)
        fail(EXIT_RUNTIME, "internal error: expert parallelism plans %zu rows per layer, the model was built for %zu", Rc, m->expert_rows);
    ep_gpu_buffers(D, &m->cfg, n, Rc, m->fp8.cfg.recipe);
    m->experts = ExpertHooksGPU{ep_gpu_experts_forward, ep_gpu_experts_backward, D};
}
// --ep-overlap-chunks C (1: the unchunked exchange): the chunked exchange's device memory (ep_gpu_chunk_bytes),
// the experts' stream and its events, at start-up. Under --fp8 delayed / current the exchange stays unchunked
// (ep_gpu_chunks: per-tensor scaling quantises a layer's received rows at once): the flag has no effect there.
static inline void ep_gpu_set_chunks(EpDispatchGpu* D, int chunks) {
    D->chunks = chunks = ep_gpu_chunks(chunks, D->model->fp8.cfg.recipe);
    if (chunks <= 1) { D->chunks = 1; return; }
    const DbrxGPU* m = D->model;
    size_t d = m->cfg.d_model, Nk = (size_t)m->B * m->T * m->cfg.top_k, Rc = D->x.cap / d;
    auto take = [&](auto* b, size_t elems) {
        using T = std::remove_reference_t<decltype(*b->p)>;
        b->p = device_alloc<T>(elems, __FILE__, __LINE__);
        b->cap = elems;
        D->allocations.push_back(b->p);
    };
    int El = m->cfg.n_experts / D->ep.n;
    for (EpLayerGpu& a : D->layers) {
        take(&a.cidx, 2 * Rc + 2 * Nk);
        if (D->model->fp8.cfg.recipe != FP8_BLOCK) continue;
        a.f8rt.assign(chunks * El, Fp8Routing{});   // (each chunk's segment table, one allocation a layer: expert_parallel_fp8.cuh)
        EpDev<int> seg;
        take(&seg, (size_t)chunks * El * (2 * El + 1));
        for (int c = 0; c < chunks * El; c++) a.f8rt[c].seg = seg.p + (size_t)c * (2 * El + 1);
    }
    if (D->dxr.cap < Nk * d) {   // (start-up: the scratch dxr again, for the sender's Nk rows)
        D->allocations.erase(std::find(D->allocations.begin(), D->allocations.end(), (void*)D->dxr.p));
        cudaCheck(cudaFree(D->dxr.p));
        take(&D->dxr, Nk * d);
    }
    cudaCheck(cudaStreamCreateWithFlags(&D->sx, cudaStreamNonBlocking));
    // the exchange's chunks: `chunks` slices of each local expert (ep_chunk_layout), or with --zero-chunk-mib of each
    // of the K weight chunks (expert_parallel_zc.cuh)
    int ne = chunks * (D->zc_K > 1 ? D->zc_K : El);
    D->ev_in.resize(ne); D->ev_out.resize(ne);
    for (int c = 0; c < ne; c++) {
        cudaCheck(cudaEventCreateWithFlags(&D->ev_in[c], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&D->ev_out[c], cudaEventDisableTiming));
    }
    cudaCheck(cudaEventCreateWithFlags(&D->ev_start, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&D->ev_end, cudaEventDisableTiming));
}

// --zero-chunk-mib under EP: my experts in K chunks of Ec, gathered and reduced through the store's begin/end
static inline void ep_gpu_store_chunks(EpDispatchGpu* D, int K, int Ec, void* ctx, void (*begin)(void*, int, int, int, int, floatX**, float**),
                                       void (*end)(void*, int, int, int, int)) {
    D->zc_K = K; D->zc_Ec = Ec; D->zc_ctx = ctx; D->zc_begin = begin; D->zc_end = end;
}

// its device buffers released, and the model runs its own experts again
static inline void ep_gpu_free(EpDispatchGpu* D) {
    for (void* p : D->allocations) cudaCheck(cudaFree(p));
    D->allocations.clear();
    if (D->sx) {
        for (size_t c = 0; c < D->ev_in.size(); c++) { cudaCheck(cudaEventDestroy(D->ev_in[c])); cudaCheck(cudaEventDestroy(D->ev_out[c])); }
        cudaCheck(cudaEventDestroy(D->ev_start)); cudaCheck(cudaEventDestroy(D->ev_end));
        cudaCheck(cudaStreamDestroy(D->sx));
        D->sx = 0; D->ev_in.clear(); D->ev_out.clear();
    }
    if (D->model) D->model->experts = ExpertHooksGPU{NULL, NULL, NULL};
    D->model = NULL;
}

// the dispatcher installed on m (NULL: none, every expert here)
static inline const EpDispatchGpu* ep_dispatch_of(const DbrxGPU* m) {
    return m->experts.forward == ep_gpu_experts_forward ? (const EpDispatchGpu*)m->experts.ctx : NULL;
}

