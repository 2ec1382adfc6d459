/*
 * expert_parallel_cuda.cuh — expert parallelism on the CUDA backend: parallel/expert_parallel.h's token
 * dispatcher for the GPU model (model/dbrx_cuda.cuh), hooked into its experts forward and backward
 * (DbrxGPU::experts). The plan (ep_plan) and the exchange (ep_exchange) are the CPU's: the plan comes from
 * the counts on the host (the expert GEMMs are issued from the host anyway); the rows travel over the
 * store's transport (NCCL, parallel/zero_gpu.cuh). Defines
 *   EpDev            a device buffer that grows (the received rows: their number changes every step)
 *   EpDispatchGpu    the dispatcher's state: the plans and device buffers kept for the backward, scratch
 *   ep_gpu_install   hooks it into the model; ep_gpu_free releases its buffers and unhooks it
 *   dbrx_ep_recv_rows, dbrx_ep_totals   its statistics, for the training loop
 */
#pragma once
#include <vector>
#include "expert_parallel.h"
#include "../model/dbrx_cuda.cuh"

// A device buffer that grows (expert parallelism's received rows: their number changes every step, and
// no token is dropped). Growing says how much it needs when the device has not got it.
template <typename T> struct EpDev {
    T* p = nullptr;
    size_t cap = 0;
    T* get(size_t n, const char* what) {
        if (n <= cap) return p;
        // (cudaFree waits for the device's work on the old buffer itself; no synchronisation here, which
        // would be taken at a rank-dependent moment — ranks grow their buffers at different steps — and
        // the emulator's collectives run when their rank waits: every rank must wait at the same points)
        size_t free_b = 0, total_b = 0;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        size_t want = n * sizeof(T), have = cap * sizeof(T);
        if (want > free_b + have)
            fail(EXIT_RUNTIME, "expert parallelism: %s needs %.1f MiB for %zu elements (the routed rows this rank's experts took), "
                 "the device has %.1f MiB free: the routing is too imbalanced for this memory (fewer tokens per micro-batch, or more EP "
                 "ranks)", what, want / 1048576.0, n, (free_b + have) / 1048576.0);
        if (p) cudaCheck(cudaFree(p));
        cudaCheck(cudaMalloc((void**)&p, want));
        cap = n;
        return p;
    }
    void release() { if (p) cudaCheck(cudaFree(p)); p = nullptr; cap = 0; }
};

// one layer's exchange, and my experts' R rows and activations, kept for the backward
typedef struct {
    EpPlan plan;
    EpDev<floatX> xl, g, u, act;     // (R, d), (R, F) x3: grown as needed
    EpDev<int> perm, inv;            // (R): expert-major row i = received row perm[i]; inv its inverse
} EpLayerGpu;

typedef struct {
    ExpertParallel ep;
    DbrxGPU* model;
    std::vector<EpLayerGpu> layers;            // (L)
    EpDev<floatX> x, y, da, dg, du;            // scratch: (R, d) x2, (R, F) x3
    EpDev<floatX> dx, dxr;                     // (R, d) BF16 input gradients, expert-major and in peer order
    EpDev<__nv_fp8_storage_t> f8q[4];          // under --fp8: activation and gradient codes (q, qt) of the received rows
    EpDev<float> f8s[4];                       // and their block-scaling factors (the model's Fp8Buf hold N k + 15 E rows)
    EpStats stats;
} EpDispatchGpu;

// Under --fp8: the model's activation and gradient FP8 scratch swapped with buffers for Rp received
// rows in El segments (the expert GEMMs quantise into f->act and f->grad); swapped back after
static inline void ep_fp8_scratch_swap(EpDispatchGpu* D, size_t Rp, int El) {
    DbrxGPU* m = D->model;
    const DbrxConfig* c = &m->cfg;
    size_t elems, sq, st;
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
static inline void ep_gpu_experts_forward_rows(EpDispatchGpu* D, int l, const int* offsets_host, const floatX* xe, floatX* ye, bool f8,
                                               bool recompute = false) {
    DbrxGPU* m = D->model;
    const DbrxConfig* c = &m->cfg;
    const BlockViews<floatX>& w = m->p.blocks[l];
    EpLayerGpu* a = &D->layers[l];
    int d = c->d_model, E = c->n_experts, F = c->ffn_hidden, El = E / D->ep.n;
    std::vector<int> counts(E);
    for (int e = 0; e < E; e++) counts[e] = offsets_host[e + 1] - offsets_host[e];
    EpPlan* pl = &a->plan;
    if (!recompute) {   // (the backward's recomputation, --recompute moe/block: the forward's plan, kept; nothing counted again)
        ep_plan(&D->ep, pl, counts.data(), offsets_host, E);
        ep_stats_add(&D->stats, &D->ep, pl);
    }
    size_t R = pl->R;
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
    floatX* g = a->g.get(Rc * F, "the experts' activations");
    floatX* u = a->u.get(Rc * F, "the experts' activations");
    floatX* act = a->act.get(Rc * F, "the experts' activations");
    floatX* yl = D->y.get(Rc * d, "the experts' outputs");
    ep_exchange(&D->ep, pl, xe, xr, d * sizeof(floatX), 0);             // (R, d) in peer order
    if (R) moe_gather_gpu(xl, xr, perm_d, (int)Rc, d);                   // expert-major (FP8: padded)
    if (f8 && Rc) {
        ep_fp8_scratch_swap(D, Rc, El);
        fp8_experts_forward_gpu(&m->fp8, l, yl, g, u, act, xl, w.w1, w.v1, w.w2, El, d, F);
        ep_fp8_scratch_unswap(D);
    } else if (!f8)
        experts_forward_gpu(yl, g, u, act, xl, w.w1, w.v1, w.w2, pl->loffsets.data(), El, d, F);
    if (R) moe_gather_gpu(xr, yl, inv_d, (int)R, d);                     // back in peer order
    ep_exchange(&D->ep, pl, xr, ye, d * sizeof(floatX), 1);              // and home, in xe's layout
}

// the GPU model's experts forward hook (ExpertHooksGPU::forward): train 1, the training forward (FP8
// under --fp8, the rows-received maximum restarted at its first layer); 0, generation's token (BF16)
static inline void ep_gpu_experts_forward(void* ctx, int l, const int* offsets_host, const floatX* xe, floatX* ye, int train) {
    EpDispatchGpu* D = (EpDispatchGpu*)ctx;
    if (train == 1 && l == 0) D->stats.recv_max = 0;   // (train 2: its recomputation in the backward, --recompute moe/block)
    ep_gpu_experts_forward_rows(D, l, offsets_host, xe, ye, train && fp8_on(&D->model->fp8), train == 2);
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
    size_t Rc = f8 ? (size_t)m->fp8.routing[l].poff[El] : R;   // the forward's layout (FP8: padded)
    floatX* dyr = D->x.get(R * d, "the received rows");
    floatX* dyl = D->y.get(Rc * d, "the experts' outputs");
    floatX* dxl = D->dx.get(Rc * d, "the experts' input gradients");
    floatX* dxr = D->dxr.get(R * d, "the experts' input gradients");
    floatX* da = D->da.get(Rc * F, "the experts' gradients");
    floatX* dg = D->dg.get(Rc * F, "the experts' gradients");
    floatX* du = D->du.get(Rc * F, "the experts' gradients");
    ep_exchange(&D->ep, pl, dye, dyr, d * sizeof(floatX), 0);
    if (R) moe_gather_gpu(dyl, dyr, a->perm.p, (int)Rc, d);
    if (f8 && Rc) {
        ep_fp8_scratch_swap(D, Rc, El);
        fp8_experts_backward_gpu(&m->fp8, l, dxl, gw.w1, gw.v1, gw.w2, da, dg, du, dyl, a->xl.p, a->g.p, a->u.p, a->act.p,
                                 w.w1, w.v1, w.w2, El, d, F);
        ep_fp8_scratch_unswap(D);
    } else if (!f8)
        experts_backward_gpu(dxl, gw.w1, gw.v1, gw.w2, da, dg, du, dyl, a->xl.p, a->g.p, a->u.p, a->act.p, w.w1, w.v1, w.w2,
                             pl->loffsets.data(), El, d, F);
    if (R) moe_gather_gpu(dxr, dxl, a->inv.p, (int)R, d);
    ep_exchange(&D->ep, pl, dxr, dxe, d * sizeof(floatX), 1);   // BF16 rows: half the bytes of fp32
}

// Expert parallelism of degree n on the GPU model `m`, this rank EP rank `rank`, the rows over
// `all_to_allv(ctx, ...)` (the store's transport): the dispatcher hooked into the model's experts.
static inline void ep_gpu_install(EpDispatchGpu* D, DbrxGPU* m, int n, int rank,
                                  void (*all_to_allv)(void*, const void*, const size_t*, void*, const size_t*, int), void* ctx) {
    D->ep.n = n; D->ep.rank = rank; D->ep.all_to_allv = all_to_allv; D->ep.ctx = ctx;
    D->model = m;
    D->layers.assign(m->cfg.n_layers, EpLayerGpu());
    D->stats = EpStats{0, 0, 0, 0};
    m->experts = ExpertHooksGPU{ep_gpu_experts_forward, ep_gpu_experts_backward, D};
}
// its device buffers released, and the model runs its own experts again
static inline void ep_gpu_free(EpDispatchGpu* D) {
    for (EpLayerGpu& a : D->layers) { a.xl.release(); a.g.release(); a.u.release(); a.act.release(); a.perm.release(); a.inv.release(); }
    D->x.release(); D->y.release(); D->da.release(); D->dg.release(); D->du.release(); D->dx.release(); D->dxr.release();
    for (int i = 0; i < 4; i++) { D->f8q[i].release(); D->f8s[i].release(); }
    if (D->model) D->model->experts = ExpertHooksGPU{NULL, NULL, NULL};
    D->model = NULL;
}

// the dispatcher installed on m (NULL: none, every expert here)
static inline const EpDispatchGpu* ep_dispatch_of(const DbrxGPU* m) {
    return m->experts.forward == ep_gpu_experts_forward ? (const EpDispatchGpu*)m->experts.ctx : NULL;
}

