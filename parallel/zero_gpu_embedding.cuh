/*
 * zero_gpu_embedding.cuh — the embedding's rows exchanged instead of its table gathered (--zero-embedding rows, the
 * default where the vocabulary units have their slot: z.vocab_rows > 0). Part of parallel/zero_gpu.cuh.
 * A micro-batch of N tokens reads at most N rows of the (V, d) embedding, and its weight gradient has at most N
 * nonzero rows; gathered whole, the table costs every rank (S-1)/S V d BF16 in the forward and (S-1)/S V d FP32 in
 * the reduce-scatter: at DBRX-132B on 64 GPUs 1.2 + 2.4 GB per step across nodes, ~80 ms exposed at the step's ends
 * (the predicted trace, dev/bench/results_predicted.md). Here, per micro-batch:
 * The exchange has its own NCCL communicator over the shard group's ranks, "embedding", capped at ZERO_EMB_NCCL_CTAS
 * channels (its point-to-point connections reach every rank of the group, and NCCL's buffers per peer grow with the
 * channels: parallel/memory_plan.h counts them), and its own stream. Per micro-batch:
 *   lists     every rank of the shard group learns every rank's distinct tokens (increasing): one all-gather of
 *             N + 1 ints on the host (MPI), so each rank plans both directions alone, the same plan everywhere
 *   forward   the owner of each piece of the table (a run's piece: shard_runs.h) packs, for every rank q in rank
 *             order, q's rows of its piece (a row cut by a piece boundary: its part) from its BF16 shard into the
 *             vocabulary slot (free then: the head is gathered after the embedding's forward); one grouped
 *             send/recv per run lands them in `rows` (N, d), q's distinct rows in order, which the embedding
 *             forward reads through `index` (each position's row): the gathered table's values
 *   backward  the embedding backward sums each distinct token's positions into `grads` (N, d) FP32 (the sums the
 *             table-sized slot would hold), whose rows go back to their owners, one grouped send/recv per run,
 *             into the run's gradient slot once its last reduce-scatter is done; the owner adds each element's
 *             contributions in the reduce-scatter's order (ranks r+1, ..., r-1, r: the NCCL twin's ring) and writes
 *             (first micro-batch: the piece's padding too) or adds the sum to its gradient shard, as the
 *             reduce-scatter would; the reduce-scatter stream then waits for it (the step's reductions follow it)
 * Both directions use one plan per run: for each row of this rank's piece and each rank q, where q's part of the row
 * starts in the packed (forward) or received (backward) buffer (`table`, one per forward parity, so the next forward's
 * upload never waits for this one's backward; EMB_ABSENT if q has no such token).
 * Under the emulator the losses, gradient norms and weights are bit-identical to the gather (test/test_zero_embedding.sh);
 * on a GPU the reduce-scatter's order is NCCL's. The gradient rows travel in FP32 also under --grad-reduce-dtype bf16.
 * Bytes per rank and micro-batch: about U d (2 + 4) (S-1)/S against V d (2 + 4) (S-1)/S, U <= N its distinct tokens.
 */
#pragma once
#include <algorithm>
#include <climits>

// (the plan's types, EmbRun and ZeroGpuEmb, are in zero_gpu.cuh, beside ZeroGpu)

// the elements of `list`'s rows (d each, increasing) that lie before flat element f of the unit
static inline size_t emb_elems_before(const std::vector<int>& list, size_t f, int d) {
    size_t v = f / d, a = std::lower_bound(list.begin(), list.end(), (int)std::min<size_t>(v, INT_MAX)) - list.begin();
    return a * d + (a < list.size() && (size_t)list[a] == v ? f % d : 0);
}

// Forward, the owner: for each element of its piece (row v, column c), into each rank q's block of the pack where q
// has token v. One block per row of the piece, threads over its columns; every element read once
__global__ void zero_emb_pack_kernel(floatX* pack, const floatX* shard, const long long* table, size_t lo, size_t hi, int v_lo, int d,
                                     int S, size_t n_out) {
    const size_t v = (size_t)v_lo + blockIdx.x, f0 = lo > v * d ? lo : v * d, f1 = hi < v * d + d ? hi : v * d + d;
    const long long* t = table + (size_t)blockIdx.x * S;
    for (size_t f = f0 + threadIdx.x; f < f1; f += blockDim.x) {
        floatX x = shard[f - lo];
        for (int q = 0; q < S; q++)
            if (t[q] != EMB_ABSENT) pack[t[q] + (long long)(f - v * d)] = x;
    }
    (void)n_out;   // (the pack's elements: kernel_cost.py's bytes)
}

// Backward, the owner: each element of its piece summed over the ranks that sent it, in the reduce-scatter's order
// (me+1, ..., me-1, me; from +0, so a row no rank sent is +0), then written to the gradient shard (first) or added
__global__ void zero_emb_accumulate_kernel(float* shard, const float* recv, const long long* table, size_t lo, size_t hi, int v_lo, int d,
                                           int S, int me, int first, int rs_order, size_t n_in) {
    const size_t v = (size_t)v_lo + blockIdx.x, f0 = lo > v * d ? lo : v * d, f1 = hi < v * d + d ? hi : v * d + d;
    const long long* t = table + (size_t)blockIdx.x * S;
    for (size_t f = f0 + threadIdx.x; f < f1; f += blockDim.x) {
        float acc = 0.0f;
        for (int k = 1; k <= S; k++) {
            int q = rs_order ? (me + k) % S : k - 1;   // (DBRX_DEBUG_PLANT=emb_sum_order: 0, 1, ..., the test's control)
            if (t[q] != EMB_ABSENT) acc += recv[t[q] + (long long)(f - v * d)];
        }
        shard[f - lo] = first ? acc : shard[f - lo] + acc;
    }
    (void)n_in;
}

// the plan's fixed part, once (zero_gpu_emb_setup): the runs of unit 0 and every rank's piece of each
static inline void zero_gpu_emb_layout(ZeroGpuEmb* e, const Zero* z, int d) {
    e->runs.clear();
    e->table_numel = 0;
    size_t u0 = z->unit_off[0];
    for (const ShardRun& r : z->runs[0]) {
        EmbRun er;
        er.run_lo = r.flat_off - u0;
        er.chunk = r.chunk;
        er.lo_of.assign(e->S, 0); er.hi_of.assign(e->S, 0);
        for (int p = 0; p < e->S; p++) {
            std::vector<ShardRun> one = {r};
            shard_run_pieces(one, p, [&](size_t lo, size_t hi, size_t) {
                er.lo_of[p] = lo - u0;
                er.hi_of[p] = std::max(lo, hi) - u0;
            });
        }
        er.lo = er.lo_of[e->me]; er.hi = er.hi_of[e->me];
        er.at = z->shard_off[0] + r.shard_rel;
        er.v_lo = (int)(er.lo / d);
        er.v_hi = er.hi > er.lo ? (int)((er.hi + d - 1) / d) : er.v_lo;
        er.table_off = e->table_numel;
        e->table_numel += (size_t)(er.v_hi - er.v_lo) * e->S;
        e->runs.push_back(er);
    }
}

// In zero_init, where zero_emb_exchange_on says (parallel/zero.h: --zero-embedding rows, S > 1, the vocabulary slot for
// the forward's pack, every layout rank a piece of the embedding): the exchange's own communicator over the shard group's
// ranks, "embedding", capped at ZERO_EMB_NCCL_CTAS channels (its point-to-point buffers per peer scale with them:
// parallel/memory_plan.h), its stream, the buffers for the model's N tokens per micro-batch. Collective over the world
// (comm_split): every rank calls it at the same point. Returns whether it is on
static inline int zero_gpu_emb_setup(ZeroGpu* zg, int N, int rank) {
    ZeroGpuEmb* e = &zg->emb;
    Zero* z = &zg->z;
    e->on = zero_emb_exchange_on(z);
    if (!e->on) return 0;
    const DbrxConfig* c = &zg->model->cfg;
    e->N = N; e->d = c->d_model; e->S = z->S; e->me = z->lrank;
    e->comm = comm_split(z->world, rank / z->S, rank, "embedding", 1, ZERO_EMB_NCCL_CTAS);
    ENSURE(e->comm.size == e->S && e->comm.rank == e->me && e->comm.members == zero_unit_group(z, 0)->members,
           "--zero-embedding rows: the exchange's group is not the embedding's layout ranks in their order");
    zero_gpu_emb_layout(e, z, e->d);
    ENSURE(e->table_numel == zero_emb_table_numel(z, e->me, e->d), "--zero-embedding rows: the table's layout disagrees with the plan's");
    size_t bytes = zero_emb_exchange_bytes(z, (size_t)N, e->d), table_max = zero_emb_table_max(z, e->d);
    auto take = [&](void** p, size_t b) { *p = (void*)deviceAlloc(char, b); zg->allocations.push_back(*p); };
    take((void**)&e->rows, (size_t)N * e->d * sizeof(floatX));
    take((void**)&e->grads, (size_t)N * e->d * sizeof(float));
    take((void**)&e->index, (size_t)N * sizeof(int));
    take((void**)&e->iota, (size_t)N * sizeof(int));
    for (int b = 0; b < 2; b++) {   // (the most any rank needs: the plan's per-GPU bytes)
        take((void**)&e->table[b], table_max * sizeof(long long));
        cudaCheck(cudaMallocHost((void**)&e->host_table[b], std::max<size_t>(1, e->table_numel) * sizeof(long long)));
        cudaCheck(cudaEventCreateWithFlags(&e->table_free[b], cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(e->table_free[b], zg->compute));
    }
    std::vector<int> iota(N);
    for (int i = 0; i < N; i++) iota[i] = i;
    cudaCheck(cudaMemcpy(e->iota, iota.data(), (size_t)N * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMallocHost((void**)&e->host_index, (size_t)N * sizeof(int)));
    for (cudaEvent_t* ev : {&e->ready, &e->arrived, &e->grads_done, &e->sent}) {
        cudaCheck(cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(*ev, zg->compute));
    }
    e->active = e->planned = e->forwards = e->cur = 0;
    zg->device_bytes += bytes;
    return 1;
}

static inline void zero_gpu_emb_free(ZeroGpu* zg) {
    ZeroGpuEmb* e = &zg->emb;
    if (!e->on) return;
    cudaCheck(cudaFreeHost(e->host_index));
    for (int b = 0; b < 2; b++) { cudaCheck(cudaFreeHost(e->host_table[b])); cudaCheck(cudaEventDestroy(e->table_free[b])); }
    for (cudaEvent_t ev : {e->ready, e->arrived, e->grads_done, e->sent}) cudaCheck(cudaEventDestroy(ev));
    comm_group_free(&e->comm);
    e->on = 0;   // (the device buffers are the store's allocations)
}

// The micro-batch's plan from its tokens (the model's host staging copy): the lists (one host all-gather in the
// exchange's group), every run's counts in both directions, each position's row, and this rank's table (host_table[b])
static inline void zero_gpu_emb_plan(ZeroGpuEmb* e, const int* tokens, int b) {
    const int N = e->N, S = e->S, d = e->d;
    e->mine.assign(tokens, tokens + N);
    std::sort(e->mine.begin(), e->mine.end());
    e->mine.erase(std::unique(e->mine.begin(), e->mine.end()), e->mine.end());
    for (int i = 0; i < N; i++) e->host_index[i] = (int)(std::lower_bound(e->mine.begin(), e->mine.end(), tokens[i]) - e->mine.begin());
    std::vector<int> send(N + 1, 0), all((size_t)S * (N + 1));   // [U, tokens..., padding] from every rank
    send[0] = (int)e->mine.size();
    std::copy(e->mine.begin(), e->mine.end(), send.begin() + 1);
    comm_all_gather(&e->comm, send.data(), all.data(), (size_t)N + 1, COMM_I32, true);
    e->lists.assign(S, {});
    for (int q = 0; q < S; q++) {
        const int* l = all.data() + (size_t)q * (N + 1);
        ENSURE(l[0] >= 0 && l[0] <= N, "--zero-embedding rows: rank %d of the shard group sent %d distinct tokens (at most %d)", q, l[0], N);
        e->lists[q].assign(l + 1, l + 1 + l[0]);
    }
    for (EmbRun& r : e->runs) {
        r.from.assign(S, 0); r.to.assign(S, 0);
        r.my_start = emb_elems_before(e->mine, r.run_lo, d);
        for (int p = 0; p < S; p++) {
            r.from[p] = emb_elems_before(e->mine, r.hi_of[p], d) - emb_elems_before(e->mine, std::min(r.lo_of[p], r.hi_of[p]), d);
            r.to[p] = r.hi > r.lo ? emb_elems_before(e->lists[p], r.hi, d) - emb_elems_before(e->lists[p], r.lo, d) : 0;
        }
        // the table: element (v, c) of rank q's part at table[(v - v_lo) S + q] + (c), in q's block of the pack
        long long* t = e->host_table[b] + r.table_off;
        std::fill(t, t + (size_t)(r.v_hi - r.v_lo) * S, EMB_ABSENT);
        size_t base = 0;
        for (int q = 0; q < S; q++) {
            const std::vector<int>& l = e->lists[q];
            size_t before = emb_elems_before(l, r.lo, d);
            for (size_t a = std::lower_bound(l.begin(), l.end(), r.v_lo) - l.begin(); a < l.size() && l[a] < r.v_hi; a++)
                t[(size_t)(l[a] - r.v_lo) * S + q] = (long long)base + (long long)(a * d) - (long long)before;
            base += r.to[q];
        }
    }
}

// unit 0's begin in dbrx_forward (model->emb_exchange): the plan and its upload on the compute stream (into the table
// of this forward's parity: the other one may still be read by the last backward's sums), then on the exchange's
// stream per run the pack into the vocabulary slot and one grouped send/recv into `rows`; the model's views then read
// `rows` through `index`. The compute stream's `ready` orders everything the exchange's stream reads behind what
// wrote it there: the plan, the BF16 shard (AdamW, a load), the slot's last reader (the head), `rows`' last reader
static inline void zero_gpu_emb_forward(ZeroGpu* zg) {
    ZeroGpuEmb* e = &zg->emb;
    DbrxGPU* m = zg->model;
    const int S = e->S, b = e->forwards++ % 2;
    cudaStream_t es = e->comm.stream;
    zero_gpu_emb_plan(e, m->host_in, b);
    cudaCheck(cudaStreamWaitEvent(zg->compute, e->table_free[b], 0));   // (its last reader: two exchanges ago)
    if (e->table_numel)
        cudaCheck(cudaMemcpyAsync(e->table[b], e->host_table[b], e->table_numel * sizeof(long long), cudaMemcpyHostToDevice, zg->compute));
    cudaCheck(cudaMemcpyAsync(e->index, e->host_index, (size_t)e->N * sizeof(int), cudaMemcpyHostToDevice, zg->compute));
    zg->vocab_unit = -1;   // (the slot becomes the pack; the head is gathered again after this forward)
    cudaCheck(cudaEventRecord(e->ready, zg->compute));
    cudaCheck(cudaStreamWaitEvent(es, e->ready, 0));
    prof_begin(prof_stream(es, "communication (embedding rows)"), "comm", "embedding rows, unit 0");
    std::vector<size_t> sb(S), rb(S);
    for (const EmbRun& r : e->runs) {
        size_t n_out = 0;
        for (int p = 0; p < S; p++) { sb[p] = r.to[p] * sizeof(floatX); rb[p] = r.from[p] * sizeof(floatX); n_out += r.to[p]; }
        if (r.v_hi > r.v_lo && n_out)
            LAUNCH(zero_emb_pack_kernel, r.v_hi - r.v_lo, 256, 0, es, zg->vocab, zg->master_bf16 + r.at, e->table[b] + r.table_off, r.lo, r.hi,
                   r.v_lo, e->d, S, n_out);
        comm_all_to_allv(&e->comm, zg->vocab, sb.data(), e->rows + r.my_start, rb.data());
    }
    prof_end(prof_stream(es, "communication (embedding rows)"));
    cudaCheck(cudaEventRecord(e->table_free[b], es));
    cudaCheck(cudaEventRecord(e->arrived, es));
    cudaCheck(cudaStreamWaitEvent(zg->compute, e->arrived, 0));
    m->p.wte = e->rows;
    m->emb_index = e->index;
    e->active = 1;
    e->cur = b;
    e->planned = m->emb_exchange == 2;   // (a training forward: its backward sends the gradient rows)
}

// unit 0's weight gradient (the vocabulary hook's embedding part): the distinct tokens' sums into `grads` on the compute
// stream, then on the exchange's stream per run (chunk j: the run's item, its gradient slot, in the reduce-scatter's
// chunk order) the rows to their owners, into the slot once its last reduce-scatter is done, and the owners' sums into
// the gradient shard (the first micro-batch writes the shard piece, padding included, as a reduce-scatter would). The
// reduce-scatter stream then waits for it: the step's reductions, after that stream, see the whole shard
static inline void zero_gpu_emb_backward(ZeroGpu* zg) {
    ZeroGpuEmb* e = &zg->emb;
    Zero* z = &zg->z;
    DbrxGPU* m = zg->model;
    const int S = e->S, U = (int)e->mine.size(), b = e->cur;
    ENSURE(e->planned && U == m->emb_U, "--zero-embedding rows: the embedding's backward without its training forward's plan");
    cudaStream_t es = e->comm.stream;
    cudaCheck(cudaStreamWaitEvent(zg->compute, e->sent, 0));   // (the last backward's rows sent out of `grads`)
    cudaCheck(cudaMemsetAsync(e->grads, 0, (size_t)U * e->d * sizeof(float), zg->compute));
    embedding_backward_gpu(e->grads, m->dresid, e->iota, m->emb_offsets, m->emb_positions, U, e->d, zg->compute);
    cudaCheck(cudaEventRecord(e->grads_done, zg->compute));
    cudaCheck(cudaStreamWaitEvent(es, e->grads_done, 0));
    std::vector<size_t> sb(S), rb(S);
    for (int j = (int)e->runs.size() - 1; j >= 0; j--) {
        const EmbRun& r = e->runs[j];
        int slot = zero_item_slot(z, 0, j), item = z->item_base[0] + j;
        bool first = zg->grad_fresh[item];
        zg->grad_fresh[item] = 0;
        cudaCheck(cudaStreamWaitEvent(es, zg->grads_reduced[slot], 0));   // the slot's last reduce-scatter done (zeros)
        prof_begin(prof_stream(es, "communication (embedding rows)"), "comm", "embedding gradient rows, unit 0 chunk %d", j);
        size_t n_in = 0;
        for (int p = 0; p < S; p++) { sb[p] = r.from[p] * sizeof(float); rb[p] = r.to[p] * sizeof(float); n_in += r.to[p]; }
        float* recv = zg->gwork[slot] + z->runs[0][j].slot_off;
        comm_all_to_allv(&e->comm, e->grads + r.my_start, sb.data(), recv, rb.data());
        if (r.v_hi > r.v_lo)
            LAUNCH(zero_emb_accumulate_kernel, r.v_hi - r.v_lo, 256, 0, es, zg->grad + r.at, recv, e->table[b] + r.table_off, r.lo, r.hi, r.v_lo,
                   e->d, S, e->me, first ? 1 : 0, g_debug_hooks.plant == PLANT_EMB_SUM_ORDER ? 0 : 1, n_in);
        if (first && r.chunk > r.hi - r.lo)   // (the piece's padding, as the reduce-scatter writes it: zeros)
            cudaCheck(cudaMemsetAsync(zg->grad + r.at + (r.hi - r.lo), 0, (r.chunk - (r.hi - r.lo)) * sizeof(float), es));
        prof_end(prof_stream(es, "communication (embedding rows)"));
        if (n_in) cudaCheck(cudaMemsetAsync(recv, 0, n_in * sizeof(float), es));   // (a slot is all zeros whenever it is free)
        cudaCheck(cudaEventRecord(zg->grads_reduced[slot], es));
    }
    cudaCheck(cudaEventRecord(e->table_free[b], es));
    cudaCheck(cudaEventRecord(e->sent, es));
    cudaCheck(cudaStreamWaitEvent(zero_gpu_rs_stream(zg), e->sent, 0));
    e->planned = 0;
}
