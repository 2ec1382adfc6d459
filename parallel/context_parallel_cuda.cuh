/*
 * context_parallel_cuda.cuh — --context-parallel N on the CUDA backend. Forward: a ring; each rank attends its two
 * balanced chunks' queries over the whole sequence as N chunk pairs on the flash kernels (model/attention_cp_cuda.cuh),
 * and before each pair the K|V block at hand hops to the next rank while the next block arrives (grouped
 * ncclSend/ncclRecv on the group's stream, waited for with an event when a pair needs it: the transfer runs beside the
 * pair at hand; cpg_ring_hop). Two K|V slots, whatever N: the block at hand (read by the pair, sent on) and the one
 * arriving (into the slot the pair before read). Backward: the same ring for K|V, and the blocks' FP32 dK|dV sums travel
 * it too (cpg_grad_hop): after pair k a rank adds its contribution to the sum that arrived for block k and passes it on,
 * beside pair k + 1; the owner adds its own last (a fixed order, every run the same bits). FP32 slots: the rank's own
 * block's gradient, the two sums on the ring (one sent, one arriving) and, N > 2, the contribution of the pair at hand:
 * 3 or 4 whatever N (parallel/memory_plan.h's memory_plan_cp counts them). No host sync. DBRX_DEBUG_PLANT=cp_all_gather:
 * the former all-gather form (all-gather of K|V into N slots, reduce-scatter of dK|dV, host-synchronised), the tests'
 * reference. Bytes per rank per layer, KVB = B (T/N) 2 kv hd: forward (N-1) 2 KVB (N-1 hops), backward (N-1) 2 KVB +
 * (N-1) 4 KVB (either form). The data loader, RoPE at the global positions, the store
 * (ZeRO-3/HSDP/EP over the ranks as data-parallel ranks) are the CPU path's (parallel/context_parallel.h). The
 * load-balancing loss is the group's tokens', as on the CPU: every layer's counts and probability sums come to the host
 * with the forward's last copy and are all-reduced (doubles, one call for all layers) over an MPI twin of the group.
 */
#pragma once
#include "context_parallel.h"
#include "../model/dbrx_cuda.cuh"

typedef struct {
    CommGroup group;                // "context": N consecutive ranks, NCCL
    int n, rank, B, Tl, H, KV, hd;
    floatX* ring_kv;                // (2, B, Tl, 2 kv hd): the ring's K|V slots; pair k reads slot k % 2 (cpg_ring_hop)
    float* ring_dkv;                // (3 or 4, B, Tl, 2 kv hd) FP32: this rank's block's gradient; the two sums on the ring
                                    // (pair k's sum is sent from slot 1 + k % 2); N > 2: the contribution of pair k >= 2
    std::vector<const floatX*> kv_at;   // (N) pair k's K|V block: a ring slot, or the all-gather form's rank-order one
    std::vector<float*> dkv_at;         // (N) pair k's dK|dV target (the ring's, or the all-gather form's)
    floatX *kv, *kv_all;            // the all-gather form only: (B, Tl, 2 kv hd) this rank's K|V; (N, B, Tl, 2 kv hd) the group's
    float *dkv_all, *dkv;           // ... their FP32 gradients: this rank's contribution to every block; its rows, summed
    CpAttnScratch sc;               // the chunk pairs' scratch (model/attention_cp_cuda.cuh)
    uint64_t fwd_calls, bwd_calls;
    CommGroup host_group;           // the same ranks, MPI (the load-balancing loss's statistics are on the host)
    std::vector<int> counts_g;      // (L, E) the group's expert counts of the last forward; counts_dev their device copy
    int* counts_dev, E;
    cudaEvent_t packed, arrived[2]; // the ring: the compute stream so far (the group's stream waits for it); a hop done (the group's stream)
    cudaEvent_t summed[2];          // the backward's gradient hop done (the group's stream)
    uint64_t lbl_bytes;             // what the load-balancing loss's all-reduces sent
    int* qstart;                    // --doc-mask: (B, Tl) device, each local row's document's first global position (NULL: off)
    std::vector<int> qstart_host, all_inputs;   // ... its host copy; the group's tokens (N, B, Tl)
    uint64_t doc_bytes;             // what cpg_batch's all-gathers sent
} ContextParallelGPU;

static inline bool cpg_all_gather_form() { return g_debug_hooks.plant == PLANT_CP_ALL_GATHER; }

static inline void cpg_gather(ContextParallelGPU* cp, const floatX* qkv) {
    size_t rows = (size_t)cp->B * cp->Tl, kvn = rows * 2 * cp->KV * cp->hd;
    LAUNCH(cp_pack_kv_kernel, ceil_div((long long)kvn, 256), 256, 0, 0, cp->kv, qkv, rows, cp->H, cp->KV, cp->hd);
    cudaCheck(cudaStreamSynchronize(0));   // (the K|V written before the group's stream reads them)
    comm_all_gather(&cp->group, cp->kv, cp->kv_all, kvn, COMM_BF16);
    comm_sync(&cp->group);
}

// the forward's ring, called before chunk pair k (model/attention_cp_cuda.cuh's before_pair): block k (rank r - k's, in slot
// k % 2) hops to the right while rank r - k - 1's arrives from the left into slot (k + 1) % 2, on the group's stream, issued
// before pair k's kernels so that it runs beside them; the group's stream first waits for the compute stream so far
// (`packed`: the pack of this rank's block for k = 0, and pair k - 1, which read the slot the hop overwrites); the compute
// stream waits (an event, no host sync) for the hop that brought block k, issued before pair k - 1. The next layer's pack
// into slot 0 follows the last wait. Two events suffice: arrived[k % 2] is recorded again only after the compute stream's
// wait on it was enqueued.
static inline void cpg_ring_hop(void* ctx, int k) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    int n = cp->n, r = cp->rank;
    size_t blk = (size_t)cp->B * cp->Tl * 2 * cp->KV * cp->hd;
    if (k < n - 1) {
        cudaCheck(cudaEventRecord(cp->packed, 0));
        cudaCheck(cudaStreamWaitEvent(cp->group.stream, cp->packed, 0));
        comm_send_recv(&cp->group, cp->ring_kv + (k % 2) * blk, blk * sizeof(floatX), (r + 1) % n, cp->ring_kv + ((k + 1) % 2) * blk, (r + n - 1) % n);
        cudaCheck(cudaEventRecord(cp->arrived[k % 2], cp->group.stream));
    }
    if (k >= 1) cudaCheck(cudaStreamWaitEvent(0, cp->arrived[(k - 1) % 2], 0));
}

// --doc-mask: the rows' document starts (context_parallel.h's cp_doc_gather, over the host twin of the group), uploaded for
// the chunk pairs' masks (the model's batch hook, before the forward's first layer)
static inline double cpg_batch(void* ctx, const int* inputs) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    double share = cp_doc_gather(&cp->host_group, inputs, cp->all_inputs.data(), cp->qstart_host.data(), cp->n, cp->rank, cp->B, cp->Tl,
                                 &cp->doc_bytes);
    cudaCheck(cudaMemcpy(cp->qstart, cp->qstart_host.data(), cp->qstart_host.size() * sizeof(int), cudaMemcpyHostToDevice));
    return share;
}

static inline void cpg_forward(void* ctx, floatX* out, float* lse, const floatX* qkv) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    if (!attention_use_flash(cp->B, cp->H, cp->KV, cp->hd, {out, qkv}))   // (16-byte aligned: the model's buffers are)
        fail(EXIT_RUNTIME, "context parallelism: the attention's buffers are not 16-byte aligned");
    if (cpg_all_gather_form()) {   // (the former all-gather form: the tests' reference, the same bits)
        cpg_gather(cp, qkv);
        cp_attention_forward_gpu(out, lse, qkv, cp->kv_all, &cp->sc, cp->B, cp->Tl, cp->H, cp->KV, cp->hd, cp->n, cp->rank, 0, cp->qstart);
    } else {
        size_t rows = (size_t)cp->B * cp->Tl, kvn = rows * 2 * cp->KV * cp->hd;
        LAUNCH(cp_pack_kv_kernel, ceil_div((long long)kvn, 256), 256, 0, 0, cp->ring_kv, qkv, rows, cp->H, cp->KV, cp->hd);
        cp_attention_forward_at_gpu(out, lse, qkv, cp->kv_at.data(), &cp->sc, cp->B, cp->Tl, cp->H, cp->KV, cp->hd, cp->n, cp->rank, 0,
                                    cpg_ring_hop, cp, cp->qstart);
    }
    cp->fwd_calls++;
}

// the backward's gradient ring, called after chunk pair k (model/attention_cp_cuda.cuh's after_pair). Pair k wrote this
// rank's contribution c_r to block s = r - k into dkv_at[k]: for k = 0 the own slot, k = 1 the ring's slot 1 + 1, k >= 2 the
// contribution slot. For k >= 2 the sum of ranks s + 1 .. r - 1 for block s arrived into ring slot 1 + k % 2 (the hop
// issued after pair k - 1, run beside pair k) and the contribution is added to it (arrived + c, the same bits as c +
// arrived); then that slot hops to the right (beside pair k + 1) while the sum for block r - k - 1 arrives into the other
// ring slot, which the hop before sent from (the same stream). The owner's contribution (pair 0) is not sent: after the
// last pair the sum of all other ranks arrives and is added to it. Block s's gradient is so c_s + (c_{s-1} + (.. +
// (c_{s+2} + c_{s+1}))) (c_j: rank j's contribution), the same order every run. A ring slot is written again by the hop
// two on, issued after the add that read it (the `packed` event: the compute stream so far); the contribution slot is
// zeroed for pair k + 1 after the add read it (stream order).
static inline void cpg_grad_hop(void* ctx, int k) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    int n = cp->n, r = cp->rank;
    size_t blk = (size_t)cp->B * cp->Tl * 2 * cp->KV * cp->hd;
    float *own = cp->ring_dkv, *ring = cp->ring_dkv + blk;   // (ring: the two slots)
    if (k >= 2) {
        cudaCheck(cudaStreamWaitEvent(0, cp->summed[(k - 1) % 2], 0));
        LAUNCH(cp_add_f32_kernel, ceil_div((long long)blk, 256), 256, 0, 0, ring + (k % 2) * blk, cp->dkv_at[k], blk);
    }
    if (k >= 1) {
        cudaCheck(cudaEventRecord(cp->packed, 0));
        cudaCheck(cudaStreamWaitEvent(cp->group.stream, cp->packed, 0));
        comm_send_recv(&cp->group, ring + (k % 2) * blk, blk * sizeof(float), (r + 1) % n, ring + ((k + 1) % 2) * blk, (r + n - 1) % n);
        cudaCheck(cudaEventRecord(cp->summed[k % 2], cp->group.stream));
    }
    if (k == n - 1) {   // (the sum of the other ranks' contributions to this rank's block)
        cudaCheck(cudaStreamWaitEvent(0, cp->summed[k % 2], 0));
        LAUNCH(cp_add_f32_kernel, ceil_div((long long)blk, 256), 256, 0, 0, own, ring + ((k + 1) % 2) * blk, blk);
    }
}

static inline void cpg_backward(void* ctx, floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    size_t rows = (size_t)cp->B * cp->Tl, kvn = rows * 2 * cp->KV * cp->hd;
    if (!cpg_all_gather_form()) {
        LAUNCH(cp_pack_kv_kernel, ceil_div((long long)kvn, 256), 256, 0, 0, cp->ring_kv, qkv, rows, cp->H, cp->KV, cp->hd);
        cp_attention_backward_at_gpu(dqkv, cp->dkv_at.data(), dout, out, lse, qkv, cp->kv_at.data(), &cp->sc, cp->B, cp->Tl, cp->H, cp->KV,
                                     cp->hd, cp->n, cp->rank, 0, cpg_ring_hop, cpg_grad_hop, cp, cp->qstart);
        LAUNCH(cp_unpack_dkv_kernel, ceil_div((long long)kvn, 256), 256, 0, 0, dqkv, cp->ring_dkv, rows, cp->H, cp->KV, cp->hd);
        cp->bwd_calls++;
        return;
    }
    cpg_gather(cp, qkv);
    cp_attention_backward_gpu(dqkv, cp->dkv_all, dout, out, lse, qkv, cp->kv_all, &cp->sc, cp->B, cp->Tl, cp->H, cp->KV, cp->hd, cp->n,
                              cp->rank, 0, cp->qstart);
    cudaCheck(cudaStreamSynchronize(0));
    comm_reduce_scatter(&cp->group, cp->dkv_all, cp->dkv, kvn, COMM_F32);
    comm_sync(&cp->group);
    LAUNCH(cp_unpack_dkv_kernel, ceil_div((long long)kvn, 256), 256, 0, 0, dqkv, cp->dkv, rows, cp->H, cp->KV, cp->hd);
    cp->bwd_calls++;
}

// the load-balancing loss over the group's tokens (model/attention_cp_cuda.cuh's lbl): st (L, 2E) all-reduced in rank
// order, then parallel/context_parallel.h's cp_lbl formula per layer at n N tokens; the group's counts to the device
static inline double cpg_lbl(void* ctx, double* st, int N, int E, int k, int L, float weight) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    uint64_t b0 = comm_bytes_sent(&cp->host_group);
    comm_all_reduce(&cp->host_group, st, (size_t)L * 2 * E, COMM_F64);
    cp->lbl_bytes += comm_bytes_sent(&cp->host_group) - b0;
    double Ng = (double)cp->n * N, loss = 0;
    for (int l = 0; l < L; l++) {
        double acc = 0;
        for (int e = 0; e < E; e++) {
            cp->counts_g[(size_t)l * E + e] = (int)st[(size_t)l * 2 * E + e];   // (integers: exact in double)
            acc += st[(size_t)l * 2 * E + e] * (st[(size_t)(2 * l + 1) * E + e] / Ng);
        }
        loss += (double)weight * E / ((double)L * Ng * k) * acc;
    }
    cudaCheck(cudaMemcpy(cp->counts_dev, cp->counts_g.data(), cp->counts_g.size() * sizeof(int), cudaMemcpyHostToDevice));
    return loss;
}
// the router backward's counts (the group's) and weight (/ n: the n ranks' gradients add up, / world, to the group's loss's)
static inline float cpg_lbl_counts(void* ctx, int l, float weight, const int** counts_dev) {
    ContextParallelGPU* cp = (ContextParallelGPU*)ctx;
    *counts_dev = cp->counts_dev + (size_t)l * cp->E;
    return weight / cp->n;
}

// collective over the world; n = 1: nothing. RoPE's device tables rewritten for this rank's global positions.
static inline void cpg_init(ContextParallelGPU* cp, Comm* comm, int n, DbrxGPU* m, int T_full) {
    cp->n = n; cp->rank = 0; cp->fwd_calls = cp->bwd_calls = 0; cp->kv = cp->kv_all = cp->ring_kv = nullptr; cp->dkv = cp->dkv_all = cp->ring_dkv = nullptr;
    cp->counts_dev = nullptr; cp->lbl_bytes = 0; cp->qstart = nullptr; cp->doc_bytes = 0;
    if (n <= 1) return;
    if (comm->world % n != 0)
        fail(EXIT_BAD_INPUT, "--context-parallel %d must divide the number of ranks %d (CP groups are %d consecutive ranks)", n, comm->world, n);
    cp->group = comm_split(&comm->world_group, comm->rank / n, comm->rank % n, "context", 1);
    cp->rank = cp->group.rank;
    const DbrxConfig* c = &m->cfg;
    bool lbl = c->moe_loss_weight != 0, doc = g_doc_mask_eot >= 0;   // (weight 0: no loss, nothing to all-reduce)
    if (lbl || doc) cp->host_group = comm_split(&comm->world_group, comm->rank / n, comm->rank % n, "context (host)", 0);
    if (doc) {
        cp->qstart_host.assign((size_t)m->B * m->T, 0);
        cp->all_inputs.assign((size_t)n * m->B * m->T, 0);
        cudaCheck(cudaMalloc((void**)&cp->qstart, cp->qstart_host.size() * sizeof(int)));
    }
    if (lbl) {
        cp->E = c->n_experts;
        cp->counts_g.assign((size_t)c->n_layers * cp->E, 0);
        cudaCheck(cudaMalloc((void**)&cp->counts_dev, cp->counts_g.size() * sizeof(int)));
    }
    if (!attention_use_flash(m->B, c->n_heads, c->kv_heads, c->head_dim, {}))
        fail(EXIT_BAD_INPUT, "--context-parallel %d on the GPU needs the flash kernels: head_dim 32, 64 or 128 (not %d), n_heads a multiple "
             "of kv_heads, a micro-batch of at most 65535", n, c->head_dim);
    cp->B = m->B; cp->Tl = m->T; cp->H = c->n_heads; cp->KV = c->kv_heads; cp->hd = c->head_dim;
    size_t half = c->head_dim / 2, kvn = (size_t)cp->B * cp->Tl * 2 * cp->KV * cp->hd;
    std::vector<int> pos(cp->Tl);
    std::vector<real> cs((size_t)cp->Tl * half), sn((size_t)cp->Tl * half);
    cp_positions(pos.data(), T_full, n, cp->rank, 1);
    rope_tables_at(cs.data(), sn.data(), pos.data(), cp->Tl, c->head_dim, c->rope_theta);
    std::vector<float> cf(cs.begin(), cs.end()), sf(sn.begin(), sn.end());
    cudaCheck(cudaMemcpy(m->rope_cos, cf.data(), cf.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(m->rope_sin, sf.data(), sf.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaEventCreateWithFlags(&cp->packed, cudaEventDisableTiming));
    for (cudaEvent_t& e : cp->arrived) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : cp->summed) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (cpg_all_gather_form()) {   // (the tests' reference form: N slots)
        cudaCheck(cudaMalloc((void**)&cp->kv, kvn * sizeof(floatX)));
        cudaCheck(cudaMalloc((void**)&cp->kv_all, n * kvn * sizeof(floatX)));
        cudaCheck(cudaMalloc((void**)&cp->dkv_all, n * kvn * sizeof(float)));
        cudaCheck(cudaMalloc((void**)&cp->dkv, kvn * sizeof(float)));
        m->activation_bytes += kvn * (sizeof(floatX) * (1 + n) + sizeof(float) * (n + 1));
    } else {   // the ring: pair k's K|V in slot k % 2; its dK|dV in the own slot (k 0), the ring's second (k 1), the contribution slot
        int dslots = cp_ring_dkv_slots(n);
        cudaCheck(cudaMalloc((void**)&cp->ring_kv, 2 * kvn * sizeof(floatX)));
        cudaCheck(cudaMalloc((void**)&cp->ring_dkv, dslots * kvn * sizeof(float)));
        cp->kv_at.resize(n); cp->dkv_at.resize(n);
        for (int k = 0; k < n; k++) {
            cp->kv_at[k] = cp->ring_kv + (k % 2) * kvn;
            cp->dkv_at[k] = cp->ring_dkv + (k == 0 ? 0 : k == 1 ? 2 : 3) * kvn;
        }
        m->activation_bytes += kvn * (2 * sizeof(floatX) + dslots * sizeof(float));
    }
    size_t rows = (size_t)cp->B * cp->Tl * cp->H;
    cudaCheck(cudaMalloc((void**)&cp->sc.out_p, rows * cp->hd * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&cp->sc.o32, rows * cp->hd * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&cp->sc.dq_acc, rows * cp->hd * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&cp->sc.lse_p, rows * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&cp->sc.D, rows * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&cp->sc.dq_sem, flash_bwd5_sem_ints(cp->B, cp->Tl, cp->H) * sizeof(int)));
    m->activation_bytes += cp_attn_scratch_bytes(cp->B, cp->Tl, cp->H, cp->hd);
    m->attn = AttentionHooksGPU{cpg_forward, cpg_backward, lbl ? cpg_lbl : NULL, lbl ? cpg_lbl_counts : NULL, doc ? cpg_batch : NULL, cp};
}

static inline void cpg_free(ContextParallelGPU* cp, const Comm* comm) {
    if (cp->n <= 1) return;
    printf("cp: rank %d: context-parallel rank %d of %d (GPU, %s), sent %llu bytes in %llu forward and %llu backward attentions, "
           "%llu bytes for the load-balancing loss\n", comm->rank, cp->rank, cp->n,
           cpg_all_gather_form() ? "all-gather" : "ring", (unsigned long long)comm_bytes_sent(&cp->group),
           (unsigned long long)cp->fwd_calls, (unsigned long long)cp->bwd_calls, (unsigned long long)cp->lbl_bytes);
    fflush(stdout);
    if (cp->counts_dev) cudaCheck(cudaFree(cp->counts_dev));
    if (cp->qstart) cudaCheck(cudaFree(cp->qstart));
    cudaCheck(cudaEventDestroy(cp->packed)); cudaCheck(cudaEventDestroy(cp->arrived[0])); cudaCheck(cudaEventDestroy(cp->arrived[1]));
    cudaCheck(cudaEventDestroy(cp->summed[0])); cudaCheck(cudaEventDestroy(cp->summed[1]));
    for (void* p : {(void*)cp->kv, (void*)cp->kv_all, (void*)cp->dkv_all, (void*)cp->dkv, (void*)cp->ring_kv, (void*)cp->ring_dkv})
        if (p) cudaCheck(cudaFree(p));
    for (void* p : {(void*)cp->sc.out_p, (void*)cp->sc.o32, (void*)cp->sc.dq_acc, (void*)cp->sc.lse_p, (void*)cp->sc.D, (void*)cp->sc.dq_sem})
        cudaCheck(cudaFree(p));
}
