/*
 * expert_parallel_grow.cuh — dropless expert parallelism on the GPU past the start-up plan: when a layer's routing
 * sends an EP rank more rows than its buffers were planned for (--ep-capacity-factor), ep_plan (expert_parallel.h's
 * ep_grow) has every rank of the EP group call ep_gpu_grow with the same new row count, before any row moves. Defines
 *   ep_regrow             one device allocation made again, larger, its contents kept
 *   ep_grow_model_rows    the model's buffers of the experts' rows (g, u, act, their compressed codes; da, dg, du)
 *   ep_gpu_grow           ExpertParallel::grow: those and the dispatcher's own (expert_parallel_cuda.cuh's EpDispatchGpu)
 * A step otherwise allocates nothing (the buffers are planned at start-up); this is the exception, printed when it happens,
 * once a routing needs more than any earlier one. Every buffer keeps what it holds: the layers already computed in this
 * forward keep their rows for the backward. The device is synchronised first (a cudaFree would do it anyway): every
 * collective it waits for was issued by every peer before its own ep_plan of this layer (the issue order is the same on
 * every rank), so none of them waits for a rank that is here.
 */
#pragma once
#include <algorithm>
#include <vector>

// *p, `parts` parts of old_part bytes each, allocated again as parts of new_part bytes, each part's bytes copied to the
// start of its new part (a buffer holding two tensors of capacity rows each, as g and u: 2 parts); its entry in the
// allocation list follows it. NULL stays NULL. False (*p unchanged) when the allocation failed.
static inline bool ep_regrow(void** p, size_t old_part, size_t new_part, int parts, std::vector<void*>* allocs, long long* added) {
    if (!*p || new_part <= old_part) return true;
    void* q = nullptr;
    if (cudaMalloc(&q, new_part * parts) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    for (int i = 0; i < parts; i++)
        if (old_part) cudaCheck(cudaMemcpy((char*)q + i * new_part, (char*)*p + i * old_part, old_part, cudaMemcpyDeviceToDevice));
    auto it = std::find(allocs->begin(), allocs->end(), *p);
    ENSURE(it != allocs->end(), "internal error: expert parallelism: a grown buffer is not in its allocation list");
    cudaCheck(cudaFree(*p));
    *it = q;
    *p = q;
    *added += (long long)((new_part - old_part) * parts);
    return true;
}

// The model's buffers of the experts' rows (DbrxGPU::expert_rows) for Rx rows: each layer's g|u, act and --compress-acts'
// codes and factors of g|u (a layer --recompute shares them with others points into rc_scratch, which grows once), and
// the backward's da, dg|du. Any other per-layer buffer whose size follows the rows is an internal error here, so that a
// buffer added to gpu_block_acts_fields later cannot be forgotten.
static inline bool ep_grow_model_rows(DbrxGPU* m, size_t Rx, long long* added) {
    const DbrxConfig* c = &m->cfg;
    size_t R0 = m->expert_rows, F = c->ffn_hidden, N = (size_t)m->B * m->T, X = sizeof(floatX), nct = (F + 127) / 128;
    if (Rx <= R0) return true;
    bool kept = gpu_act_kept(c->ffn_hidden, fp8_on(&m->fp8));
    BlockActsGPU probe;
    std::vector<size_t> s0, moved;
    gpu_block_acts_fields<BlockActsGPU>(c, N, N * c->top_k, R0, kept, [&](auto, size_t n, int) { s0.push_back(n); });
    size_t i = 0;
    gpu_block_acts_fields<BlockActsGPU>(c, N, N * c->top_k, Rx, kept, [&](auto f, size_t n, int) {
        if (n != s0[i++]) moved.push_back((size_t)((char*)&(probe.*f) - (char*)&probe));
    });
    auto at = [&](const void* field) { return (size_t)((const char*)field - (const char*)&probe); };
    for (size_t off : moved)
        ENSURE(off == at(&probe.g) || off == at(&probe.act) || off == at(&probe.gu_codes) || off == at(&probe.gu_sinv),
               "internal error: expert parallelism: a buffer of the experts' rows is not grown");
    size_t code = compress_tensor_code_bytes(COMPRESS_E4M3, 1, F), fac = nct * sizeof(float);   // (per row)
    // each field: its bytes per row and parts (g|u, and their codes and factors: two tensors of the capacity's rows each)
    auto field = [&](auto BlockActsGPU::*f, size_t row_bytes, int parts) {
        BlockActsGPU& s = m->rc_scratch;   // (the shared set, where a layer points into it: grown once, the layers follow)
        bool shared = false;
        for (const BlockActsGPU& a : m->acts) shared = shared || (a.*f && a.*f == s.*f);
        auto old = s.*f;
        if (shared && !ep_regrow((void**)&(s.*f), R0 * row_bytes, Rx * row_bytes, parts, &m->allocations, added)) return false;
        for (BlockActsGPU& a : m->acts) {
            if (shared && a.*f == old) a.*f = s.*f;
            else if (!ep_regrow((void**)&(a.*f), R0 * row_bytes, Rx * row_bytes, parts, &m->allocations, added)) return false;
        }
        return true;
    };
    if (!field(&BlockActsGPU::g, F * X, 2) || !field(&BlockActsGPU::act, F * X, 1) || !field(&BlockActsGPU::gu_codes, code, 2)
        || !field(&BlockActsGPU::gu_sinv, fac, 2)) return false;
    for (BlockActsGPU& a : m->acts) if (a.g) a.u = a.g + Rx * F;
    if (!ep_regrow((void**)&m->da, R0 * F * X, Rx * F * X, 1, &m->allocations, added)
        || !ep_regrow((void**)&m->dg, R0 * F * X, Rx * F * X, 2, &m->allocations, added)) return false;
    m->du = m->dg + Rx * F;
    m->expert_rows = Rx;
    return true;
}

// an EpDev buffer for `elems` elements (never smaller), its contents kept
template <typename T> static inline bool ep_regrow_dev(EpDev<T>* b, size_t elems, std::vector<void*>* allocs, long long* added) {
    if (elems <= b->cap || !b->p) return true;
    if (!ep_regrow((void**)&b->p, b->cap * sizeof(T), elems * sizeof(T), 1, allocs, added)) return false;
    b->cap = elems;
    return true;
}

// ExpertParallel::grow on the GPU: every buffer planned for the received rows, the model's and the dispatcher's, for
// `rows` rows (+ FP8's padding of the local experts, ep_gpu_planned_rows). The bytes added on this rank, or -1 when an
// allocation failed (DBRX_DEBUG_EP_GROW_FAIL: on that EP rank, for the test of the agreed stop).
static inline long long ep_gpu_grow(void* ctx, size_t rows) {
    EpDispatchGpu* D = (EpDispatchGpu*)ctx;
    DbrxGPU* m = D->model;
    const DbrxConfig* c = &m->cfg;
    size_t d = c->d_model, F = c->ffn_hidden, El = c->n_experts / D->ep.n, Nk = (size_t)m->B * m->T * c->top_k;
    size_t Rc = rows + (fp8_on(&m->fp8) ? 15 * El : 0);
    // every stream's work on the old buffers done before they move; on every rank, the one that fails too (the emulator
    // runs a rank's queued collectives when its host waits for them: its peers' syncs need its own)
    cudaCheck(cudaDeviceSynchronize());
    if (g_debug_hooks.ep_grow_fail == D->ep.rank) return -1;
    long long added = 0;
    std::vector<void*>* al = &D->allocations;
    bool ok = ep_grow_model_rows(m, Rc, &added);
    for (EpLayerGpu& a : D->layers)
        ok = ok && ep_regrow_dev(&a.xl, Rc * d, al, &added) && ep_regrow_dev(&a.perm, Rc, al, &added)
             && ep_regrow_dev(&a.inv, Rc, al, &added) && ep_regrow_dev(&a.cidx, 2 * Rc + 2 * Nk, al, &added);
    ok = ok && ep_regrow_dev(&D->x, Rc * d, al, &added) && ep_regrow_dev(&D->y, Rc * d, al, &added)
         && ep_regrow_dev(&D->dx, Rc * d, al, &added) && ep_regrow_dev(&D->dxr, Rc * d, al, &added);
    if (ok && m->fp8.cfg.recipe != FP8_OFF) {
        size_t elems, sq, st;
        fp8_expert_scratch_sizes(Rc, d, F, El, &elems, &sq, &st);
        for (int i = 0; i < 4; i++) ok = ok && ep_regrow_dev(&D->f8q[i], elems, al, &added) && ep_regrow_dev(&D->f8s[i], i % 2 ? st : sq, al, &added);
    }
    return ok ? added : -1;
}
