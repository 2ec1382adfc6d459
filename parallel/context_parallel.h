/*
 * context_parallel.h — context (sequence) parallelism, --context-parallel N, on the CPU backend (MPI); the GPU's
 * form (the same ring over NCCL, two K|V slots) is context_parallel_cuda.cuh.
 *
 * The CP group is N consecutive ranks; they hold the same parameters (CP lives inside the data-parallel
 * ranks: the store, ZeRO-3/HSDP and EP see them as data-parallel ranks with T / N tokens per sequence, and
 * the gradient reduction over the world, / world, is the mean over the global tokens because every rank
 * holds the same number of them). Each sequence of T tokens is cut into 2N chunks and CP rank r holds
 * chunks r and 2N-1-r (causal load balancing: model/attention_ring.h); the data loader hands it exactly
 * those (dataloader_context_parallel), RoPE rotates by the global positions, and everything per token
 * stays local. Attention is ring attention over the group, installed as the model's AttentionHooks:
 *   forward:  the K|V block of every rank passes once around the ring (N-1 sendrecvs); each block's
 *             partial (out, lse) merged with the online softmax, in the ring's order
 *   backward: the blocks go around again with their dK|dV accumulators, which make one more hop home
 *             (N-1 sends of K|V, N of dK|dV)
 * Bytes per rank per layer, KVB = B * (T/N) * 2 * kv_heads * head_dim * 4: forward (N-1) KVB,
 * backward (2N-1) KVB (counted in the group's bytes_sent; test/test_cp.sh checks the formula).
 * The K|V hops are started (MPI_Isend/Irecv) before the arithmetic of the block at hand and waited for after it
 * (cp_hop_start / cp_hop_wait); the dK|dV hop follows the arithmetic that adds to it (blocking: the next step adds to
 * what it brings). The same arithmetic in the same order as the blocking form: the same bits.
 */
#pragma once
#include <vector>
#include <utility>
#include "comm.h"
#include "../model/dbrx.h"

typedef struct {
    CommGroup group;                // the CP group ("context"): N consecutive world ranks
    int n, rank;                    // N, and this rank's place in the group
    int B, Tl, H, KV, hd;           // micro-batch, local tokens per sequence (T / N), heads
    std::vector<real> kv[2], dkv[2], D;   // the block at hand and the one arriving; their gradients; rowsum(dout*out)
    uint64_t fwd_calls, bwd_calls;  // ring attentions run, forward and backward
    int L, E;
    std::vector<int> counts_g;      // (L, E) the group's expert counts of the last forward (the load-balancing loss)
    uint64_t lbl_bytes;             // what the load-balancing loss's all-reduces sent (the rest is the ring's)
    std::vector<int> qstart;        // --doc-mask: (B, Tl) each local row's document's first global position (cp_batch; empty: off)
    std::vector<int> all_inputs;    // (N, B, Tl) the group's tokens (cp_batch)
    uint64_t doc_bytes;             // what cp_batch's all-gathers sent
} ContextParallel;

// the GPU ring's FP32 dK|dV slots (context_parallel_cuda.cuh): this rank's block's, the two sums on the ring, and for
// N > 2 the contribution of the pair at hand (the planner counts them: parallel/memory_plan.h)
static inline int cp_ring_dkv_slots(int n) { return n > 2 ? 4 : 3; }

static inline void cp_chunks_of(const ContextParallel* cp, int r, int g[2]) { g[0] = cp_chunk(r, 0, cp->n, 1); g[1] = cp_chunk(r, 1, cp->n, 1); }

// one K|V hop of the ring, started before the arithmetic of the block at hand and finished after it (MPI_Isend of the
// block at hand, which the arithmetic only reads, and MPI_Irecv of the next block into the other buffer): the transfer
// runs beside the arithmetic as far as the MPI library progresses it without being called (a small block goes eagerly at
// the start; a large one may wait for the rendezvous in MPI_Wait unless the library has a progress thread or offload).
// Not timed here. Tag 12: no other operation of the group is in flight meanwhile. Counted: bytes.
// DBRX_DEBUG_PLANT=cp_all_gather: the former blocking form (waited for before the arithmetic), the tests' reference.
typedef struct { MPI_Request r[2]; int peers[2]; size_t bytes; const char* op; bool done; } CpHop;
static inline void cp_hop_wait(ContextParallel* cp, CpHop* h) {
    if (h->done) return;
    comm_wait(&cp->group, h->r, 2, h->peers, h->op);
    cp->group.bytes_sent += h->bytes;
    h->done = true;
}
static inline void cp_hop_start(ContextParallel* cp, CpHop* h, const void* send, void* recv, size_t bytes, const char* op) {
    ENSURE(bytes < ((size_t)1 << 31), "ring attention: a K|V block of %zu bytes (MPI counts are int: at most 2 GiB)", bytes);
    int right = (cp->rank + 1) % cp->n, left = (cp->rank + cp->n - 1) % cp->n;
    h->peers[0] = left; h->peers[1] = right; h->bytes = bytes;
    MPI_CHECK(MPI_Irecv(recv, (int)bytes, MPI_BYTE, left, 12, cp->group.mpi, &h->r[0]));
    MPI_CHECK(MPI_Isend(send, (int)bytes, MPI_BYTE, right, 12, cp->group.mpi, &h->r[1]));
    h->op = op; h->done = false;
    if (g_debug_hooks.plant == PLANT_CP_ALL_GATHER) cp_hop_wait(cp, h);
}

// --doc-mask: a forward's tokens (B, Tl) of every rank of the group g (all (n, B, Tl): an all-gather on the host, once a
// micro-batch; *bytes counts it) give each local row its document's first global position, qstart (B, Tl; cp_doc_starts,
// whose share of the causal pairs it returns)
static inline double cp_doc_gather(CommGroup* g, const int* inputs, int* all, int* qstart, int n, int rank, int B, int Tl, uint64_t* bytes) {
    uint64_t b0 = comm_bytes_sent(g);
    comm_all_gather(g, inputs, all, (size_t)B * Tl, COMM_I32, true);
    *bytes += comm_bytes_sent(g) - b0;
    return cp_doc_starts(qstart, all, n, rank, B, Tl, g_doc_mask_eot);
}
// the ring's masks read the rows' document starts (the model's batch hook, before the forward's first layer)
static inline double cp_batch(void* ctx, const int* inputs) {
    ContextParallel* cp = (ContextParallel*)ctx;
    return cp_doc_gather(&cp->group, inputs, cp->all_inputs.data(), cp->qstart.data(), cp->n, cp->rank, cp->B, cp->Tl, &cp->doc_bytes);
}
static inline const int* cp_qstart(const ContextParallel* cp) { return cp->qstart.empty() ? nullptr : cp->qstart.data(); }

static inline void cp_forward(void* ctx, real* out, real* lse, const real* qkv) {
    ContextParallel* cp = (ContextParallel*)ctx;
    size_t rows = (size_t)cp->B * cp->Tl, bytes = rows * 2 * cp->KV * cp->hd * sizeof(real);
    int gq[2], gk[2];
    cp_chunks_of(cp, cp->rank, gq);
    ring_pack_kv(cp->kv[0].data(), qkv, rows, cp->H, cp->KV, cp->hd);
    attention_ring_begin(out, lse, cp->B, cp->Tl, cp->H, cp->hd);
    for (int s = 0; s < cp->n; s++) {   // step s: the block of rank rank - s; the next one arrives meanwhile
        CpHop h;
        if (s < cp->n - 1) cp_hop_start(cp, &h, cp->kv[0].data(), cp->kv[1].data(), bytes, "ring attention K/V (forward)");
        cp_chunks_of(cp, (cp->rank - s + cp->n) % cp->n, gk);
        attention_ring_forward(out, lse, qkv, cp->kv[0].data(), cp->B, cp->Tl, cp->H, cp->KV, cp->hd, gq, gk, cp_qstart(cp));
        if (s < cp->n - 1) cp_hop_wait(cp, &h);
        std::swap(cp->kv[0], cp->kv[1]);
    }
    cp->fwd_calls++;
}

static inline void cp_backward(void* ctx, real* dqkv, const real* dout, const real* qkv, const real* out, const real* lse) {
    ContextParallel* cp = (ContextParallel*)ctx;
    size_t rows = (size_t)cp->B * cp->Tl, bytes = rows * 2 * cp->KV * cp->hd * sizeof(real);
    int right = (cp->rank + 1) % cp->n, left = (cp->rank + cp->n - 1) % cp->n, gq[2], gk[2];
    cp_chunks_of(cp, cp->rank, gq);
    ring_pack_kv(cp->kv[0].data(), qkv, rows, cp->H, cp->KV, cp->hd);
    memset(cp->dkv[0].data(), 0, bytes);
    memset(dqkv, 0, rows * (cp->H + 2 * cp->KV) * cp->hd * sizeof(real));
    attention_ring_rowdot(cp->D.data(), dout, out, cp->B, cp->Tl, cp->H, cp->hd);
    for (int s = 0; s < cp->n; s++) {
        CpHop h;   // (the next K|V block arrives beside this step's arithmetic)
        if (s < cp->n - 1) cp_hop_start(cp, &h, cp->kv[0].data(), cp->kv[1].data(), bytes, "ring attention K/V (backward)");
        cp_chunks_of(cp, (cp->rank - s + cp->n) % cp->n, gk);
        attention_ring_backward(dqkv, cp->dkv[0].data(), dout, qkv, cp->kv[0].data(), lse, cp->D.data(), cp->B, cp->Tl, cp->H, cp->KV,
                                cp->hd, gq, gk, cp_qstart(cp));
        if (s < cp->n - 1) cp_hop_wait(cp, &h);
        // the block's gradient follows it (the next step adds to it: not overlapped); after the N-th hop each rank holds its own block's dK|dV
        comm_sendrecv(&cp->group, cp->dkv[0].data(), bytes, right, cp->dkv[1].data(), bytes, left, "ring attention dK/dV");
        std::swap(cp->kv[0], cp->kv[1]);
        std::swap(cp->dkv[0], cp->dkv[1]);
    }
    ring_unpack_dkv(dqkv, cp->dkv[0].data(), rows, cp->H, cp->KV, cp->hd);
    cp->bwd_calls++;
}

// layer l's load-balancing loss over the group's tokens: the counts and the sums of the probabilities (in token
// order, double) all-reduced over the group, then lbl_forward's formula at n N tokens
static inline double cp_lbl(void* ctx, int l, const real* probs, const int* counts, int N, int E, int k, int L, float weight) {
    ContextParallel* cp = (ContextParallel*)ctx;
    std::vector<double> st(2 * (size_t)E, 0.0);
    for (int e = 0; e < E; e++) {
        st[e] = counts[e];
        for (int t = 0; t < N; t++) st[E + e] += probs[(size_t)t * E + e];
    }
    uint64_t b0 = comm_bytes_sent(&cp->group);
    comm_all_reduce(&cp->group, st.data(), 2 * (size_t)E, COMM_F64);
    cp->lbl_bytes += comm_bytes_sent(&cp->group) - b0;
    double Ng = (double)cp->n * N, acc = 0;
    for (int e = 0; e < E; e++) {
        cp->counts_g[(size_t)l * E + e] = (int)st[e];   // (integers: exact in double)
        acc += st[e] * (st[E + e] / Ng);
    }
    return (double)weight * E / ((double)L * Ng * k) * acc;
}
// the backward's counts (the group's) and weight (/ n: the n ranks' gradients add up, / world, to the group's loss's)
static inline float cp_lbl_counts(void* ctx, int l, float weight, const int** counts) {
    ContextParallel* cp = (ContextParallel*)ctx;
    *counts = &cp->counts_g[(size_t)l * cp->E];
    return weight / cp->n;
}

// Collective over the world (comm_split). n = 1: nothing (the group of one is not even made). Otherwise
// the world must split into groups of n and the model's T (per rank) is T_full / n: RoPE's tables are
// rewritten for this rank's global positions and the ring attention installed.
static inline void cp_init(ContextParallel* cp, Comm* comm, int n, Dbrx* m, int T_full) {
    cp->n = n; cp->rank = 0; cp->fwd_calls = cp->bwd_calls = 0; cp->lbl_bytes = 0; cp->doc_bytes = 0;
    if (n <= 1) return;
    if (comm->world % n != 0)
        fail(EXIT_BAD_INPUT, "--context-parallel %d must divide the number of ranks %d (CP groups are %d consecutive ranks)", n, comm->world, n);
    cp->group = comm_split(&comm->world_group, comm->rank / n, comm->rank % n, "context", 0);
    cp->rank = cp->group.rank;
    const DbrxConfig* c = &m->cfg;
    cp->B = m->B; cp->Tl = m->T; cp->H = c->n_heads; cp->KV = c->kv_heads; cp->hd = c->head_dim;
    std::vector<int> pos(cp->Tl);
    cp_positions(pos.data(), T_full, n, cp->rank, 1);
    rope_tables_at(m->rope_cos, m->rope_sin, pos.data(), cp->Tl, c->head_dim, c->rope_theta);
    size_t kvn = (size_t)cp->B * cp->Tl * 2 * cp->KV * cp->hd;
    for (int i = 0; i < 2; i++) { cp->kv[i].assign(kvn, 0); cp->dkv[i].assign(kvn, 0); }
    cp->D.assign((size_t)cp->B * cp->H * cp->Tl, 0);
    cp->L = c->n_layers; cp->E = c->n_experts;
    cp->counts_g.assign((size_t)cp->L * cp->E, 0);
    bool lbl = c->moe_loss_weight != 0;   // (weight 0: no loss, nothing to gather)
    if (g_doc_mask_eot >= 0) { cp->qstart.assign((size_t)cp->B * cp->Tl, 0); cp->all_inputs.assign((size_t)n * cp->B * cp->Tl, 0); }
    m->attn = AttentionHooks{cp_forward, cp_backward, lbl ? cp_lbl : NULL, lbl ? cp_lbl_counts : NULL, g_doc_mask_eot >= 0 ? cp_batch : NULL, cp};
}

// the line at the end of a run: this rank's ring bytes and the formula's
static inline void cp_report(const ContextParallel* cp, const Comm* comm) {
    if (cp->n <= 1) return;
    uint64_t kvb = (uint64_t)cp->B * cp->Tl * 2 * cp->KV * cp->hd * sizeof(real);
    uint64_t formula = (cp->fwd_calls * (cp->n - 1) + cp->bwd_calls * (2 * cp->n - 1)) * kvb;
    printf("cp: rank %d: context-parallel rank %d of %d, sent %llu bytes in %llu forward and %llu backward ring attentions "
           "(formula (F (N-1) + B (2N-1)) x %llu bytes of K|V: %llu), %llu bytes for the load-balancing loss, %llu for --doc-mask's tokens\n",
           comm->rank, cp->rank, cp->n, (unsigned long long)(comm_bytes_sent(&cp->group) - cp->lbl_bytes - cp->doc_bytes),
           (unsigned long long)cp->fwd_calls, (unsigned long long)cp->bwd_calls, (unsigned long long)kvb, (unsigned long long)formula,
           (unsigned long long)cp->lbl_bytes, (unsigned long long)cp->doc_bytes);
    fflush(stdout);
}

// --dry-run: what CP changes, beside the GPU plan printed above it (which is for T/N tokens per rank and holds the GPU ring's
// buffers: memory_plan_cp): the CPU ring's buffers (two K|V blocks and their two gradients, fp32) and bytes, and the GPU
// ring's bytes (BF16 K|V, FP32 dK|dV sums: per layer (N-1) 2 KVB forward, (N-1) (2 + 4) KVB backward)
static inline void cp_plan_print(const DbrxConfig* c, int B, int T, int n) {
    if (n <= 1) return;
    double kvb = (double)B * (T / n) * 2 * c->kv_heads * c->head_dim, gib = 1024.0 * 1024 * 1024;
    double ring = (double)c->n_layers * ((n - 1) + (2 * n - 1)) * kvb * 4, gpu = (double)c->n_layers * (n - 1) * 8 * kvb;
    printf("  context parallel %d: each rank holds %d of every sequence's %d tokens (2 chunks of %d; the activations above are "
           "for them); K|V per rank %.0f elements; CPU ring: buffers %.3f GiB, bytes sent per micro-batch %.3f GiB (fp32); GPU "
           "ring: buffers in the plan above, bytes sent per micro-batch %.3f GiB\n", n, T / n, T, T / (2 * n),
           kvb, 4 * kvb * 4 / gib, ring / gib, gpu / gib);
}
