/*
 * zero_gpu_comm.cuh — the device store's communication streams and communicators, and the one order in
 * which every rank issues its NCCL operations. Part of parallel/zero_gpu.cuh (included after ZeroGpu).
 *
 *   gathers          the shard group's communicator `shard` on its stream (the gather stream); a block's
 *                    experts under EP: `expert_shard`, on the same stream (comm_share_stream); the head's in
 *                    the forward, with the vocabulary slot, on the reduce-scatter stream (zero_gpu_vocab_head_ahead)
 *   reduce-scatters  a second communicator over the same ranks, `shard_rs`, on its own stream (the
 *                    reduce-scatter stream); the experts': `expert_shard_rs`, on that stream too
 *   precision        FP32, or BF16 under --grad-reduce-dtype bf16: each run rounded into rs_scratch (2 B x the
 *                    longest run, in the memory plan), reduced there, this rank's chunk added to the FP32 shard
 *                    (half the bytes; the accuracy measured in parallel/README.md, "Reduction precision")
 *   why two          in the backward, unit u's reduce-scatter and the gather of unit u-2 (the prefetch
 *                    issued when unit u-1 begins) both become ready when unit u's compute ends, and both
 *                    have unit u-1's compute to hide behind. On one stream they run in series. Two streams
 *                    on ONE communicator would not help: NCCL progresses a communicator's operations in
 *                    the order they were issued, through its one set of channels and connections (the
 *                    collectives of a communicator are matched across ranks by that order), so they still
 *                    run one after the other. Hence a second communicator (NCCL user guide, "Creating more
 *                    communicators": each one is an independent set of resources) and a second stream.
 *                    Its price: one more communicator's buffers per GPU (parallel/memory_plan.h counts
 *                    `shard_rs` and `expert_shard_rs` in its NCCL margin).
 *   the issue order  NCCL user guide, "Using multiple NCCL communicators concurrently": operations on
 *                    different communicators may run concurrently only if every rank issues them in the
 *                    same order; NCCL gives no progress guarantee otherwise (a rank blocked in communicator
 *                    A's kernel while its peer waits in B's: a hang). Here that order holds by
 *                    construction: one host thread issues every NCCL operation of the step (the unit hooks,
 *                    the EP dispatcher's exchange, the step's reductions), in the program order of the step,
 *                    and that order does not depend on data (the EP counts change sizes, never the sequence
 *                    of calls; an exchange chunk with no row to or from a rank is an empty NCCL group there,
 *                    nothing its peers match). The events below order the streams; none of them reorders an issue.
 *                    test/test_comm_streams.sh checks it on the emulator's per-rank work logs
 *                    (test/check_comm_order.py: the global issue order projected onto every pair of
 *                    communicators two ranks share agrees), with a planted reordering as its control.
 *   events           compute -> gather stream: slot_free (slot no longer read), bf16_ready (shard written);
 *                    gather stream -> compute: gathered; compute -> reduce-scatter stream: grads_ready;
 *                    reduce-scatter stream -> compute: grads_reduced (the gradient slot may be zeroed and
 *                    reused; the gradient shard is final before the step's reductions read it). The gather
 *                    stream never waits for the reduce-scatter stream (DBRX_DEBUG_PLANT=serial_streams plants
 *                    that wait: the stream test's negative control).
 *   the step's end   (--zero-prefetch N, default 2) the first N items of the next step's forward (the embedding,
 *                    then layer 0's attention) are gathered while this step's optimizer runs: AdamW in two launches,
 *                    the shard's segments of those units first, bf16_ready recorded, their gathers issued, then
 *                    the rest of the shard. Each element's update is the one of the single launch (elementwise;
 *                    a segment's head and tail from its own offset), so nothing changes but the schedule. The
 *                    gathers run across the step's end (which waits for the model's stream only); the next
 *                    forward finds its items in their slots (slot_unit) and only waits for their events. Not
 *                    for a block under --fp8-gather: its codes need the next step's scales.
 */
#pragma once

// the communicator and stream of unit u's reduce-scatter (S > 1)
static inline CommGroup* zero_gpu_rs_group(ZeroGpu* zg, int u) { return zg->z.unit_ep[u] ? &zg->rs_expert_shard : &zg->rs_shard; }
static inline cudaStream_t zero_gpu_rs_stream(ZeroGpu* zg) { return zg->rs_shard.stream; }

// the reduce-scatter communicators (S > 1 only: S = 1 reduce-scatters nothing). comm_split is collective
// over the world: every rank calls this at the same point of zero_init
static inline void zero_gpu_comm_init(ZeroGpu* zg, int rank) {
    Zero* z = &zg->z;
    zg->rs_on = z->S > 1;
    if (!zg->rs_on) return;
    zg->rs_shard = comm_split(z->world, rank / z->S, rank, "shard_rs", 1);   // the shard group's ranks, again
    if (z->ep_n > 1) {
        zg->rs_expert_shard = comm_split(z->world, (rank / z->P) * z->ep_n + z->ep_rank, rank, "expert_shard_rs", 1);
        comm_share_stream(&zg->rs_expert_shard, &zg->rs_shard);
    }
}

static inline void zero_gpu_comm_watched(ZeroGpu* zg, std::vector<CommGroup*>* watched) {
    if (zg->emb.on) watched->push_back(&zg->emb.comm);   // (--zero-embedding rows' own communicator)
    if (!zg->rs_on) return;
    watched->push_back(&zg->rs_shard);
    if (zg->z.ep_n > 1) watched->push_back(&zg->rs_expert_shard);
}

static inline uint64_t zero_gpu_comm_bytes_sent(const ZeroGpu* zg) {
    if (!zg->rs_on) return 0;
    return comm_bytes_sent(&zg->rs_shard) + (zg->z.ep_n > 1 ? comm_bytes_sent(&zg->rs_expert_shard) : 0)
         + (zg->emb.on ? comm_bytes_sent(&zg->emb.comm) : 0);
}

static inline void zero_gpu_comm_free(ZeroGpu* zg) {
    if (!zg->rs_on) return;
    if (zg->z.ep_n > 1) comm_group_free(&zg->rs_expert_shard);
    comm_group_free(&zg->rs_shard);
    zg->rs_on = 0;
}

// ---------------------------------------------------------------------------------------------
// gathers and reduce-scatters of items: a unit, or a chunk of a chunked experts unit (zero_gpu_chunks.cuh)

// issues item (u, j)'s all-gather on the communication stream (nothing if its slot holds it)
static inline void zero_gpu_gather_async(ZeroGpu* zg, int u, int j) {
    Zero* z = &zg->z;
    if (zero_vocab_unit(z, u)) { zero_gpu_vocab_gather(zg, u); return; }   // (whole, into the vocabulary slot)
    int slot = zero_item_slot(z, u, j), item = zero_item(z, u, j);
    bool fp8 = zg->fp8.on && !zg->fp8.lay.unit_mats[u].empty();   // a block under --fp8-gather (never chunked): codes or BF16
    if (zg->slot_unit[slot] == item && (!fp8 || zg->fp8.slot_codes[slot] == (zg->model->fp8.bf16_weights ? 0 : 1))) return;
    cudaStream_t comm = zero_comm_stream(zg);
    cudaCheck(cudaStreamWaitEvent(comm, zg->slot_free[slot], 0));   // the compute stream is done reading it
    cudaCheck(cudaStreamWaitEvent(comm, zg->bf16_ready, 0));        // the shard is up to date
    if (g_debug_hooks.plant == PLANT_COMM_SERIAL && zg->rs_on) {    // (the negative control: the old serialisation)
        cudaCheck(cudaEventRecord(zg->comm_done, zero_gpu_rs_stream(zg)));
        cudaCheck(cudaStreamWaitEvent(comm, zg->comm_done, 0));
    }
    if (z->unit_nchunks[u] > 1)   // (--profile: model/profile.h; test/check_comm_order.py reads "all-gather unit U")
        prof_begin(prof_stream(comm, "communication (shard group)"), "comm", "all-gather unit %d chunk %d", u, j);
    else prof_begin(prof_stream(comm, "communication (shard group)"), "comm", "all-gather unit %d", u);
    if (zg->fp8.on && !fp8) fp8_given_forget(&zg->model->fp8, zg->work[slot], zg->work[slot] + z->work_numel);   // (codes it held)
    if (fp8) zero_fp8_gather_unit(zg, u, slot);
    else
        for (size_t i = 0; i < z->runs[u].size(); i++) {   // each run of the chunk into its place in the slot
            const ShardRun& r = z->runs[u][i];
            if (zero_run_mine(z, r) && z->run_chunk[u][i] == j)
                comm_all_gather(zero_unit_group(z, u), zg->master_bf16 + z->shard_off[u] + r.shard_rel, zg->work[slot] + r.slot_off,
                                r.chunk, COMM_BF16);
        }
    prof_end(prof_stream(comm, "communication (shard group)"));
    cudaCheck(cudaEventRecord(zg->gathered[slot], comm));
    zg->slot_unit[slot] = item;
}
static inline void zero_gpu_gather_unit_async(ZeroGpu* zg, int u) { zero_gpu_gather_async(zg, u, 0); }
// orders the compute stream after item (u, j)'s gather
static inline void zero_gpu_wait(ZeroGpu* zg, int u, int j) {
    if (zero_vocab_unit(&zg->z, u)) { cudaCheck(cudaStreamWaitEvent(zg->compute, zg->vocab_gathered, 0)); return; }
    cudaCheck(cudaStreamWaitEvent(zg->compute, zg->gathered[zero_item_slot(&zg->z, u, j)], 0));
}
static inline void zero_gpu_release(ZeroGpu* zg, int u, int j) {
    if (zero_vocab_unit(&zg->z, u)) {
        if (zg->vocab_unit == u) { cudaCheck(cudaEventRecord(zg->vocab_free, zg->compute)); zg->vocab_unit = -1; }
        return;
    }
    int slot = zero_item_slot(&zg->z, u, j);
    if (zg->slot_unit[slot] != zero_item(&zg->z, u, j)) return;
    cudaCheck(cudaEventRecord(zg->slot_free[slot], zg->compute));
    zg->slot_unit[slot] = -1;
}
// the next item's gather after unit u in `phase` (the prefetch), if any
static inline void zero_gpu_prefetch_next(ZeroGpu* zg, int u, int phase) {
    int next = zero_next_unit(&zg->z, u, phase);
    if (next >= 0) zero_gpu_gather_async(zg, next, zero_first_chunk(&zg->z, next, phase));
}

// In the backward under --recompute moe/block, layer l's block unit is needed by its recompute right after
// layer l+1's block unit (the same slot parity: its gather would wait for that unit's backward, exposed). When
// layer l+1's experts unit begins its backward, layer l's block is gathered into work_rc, behind that unit's compute.
// Chunked (--zero-chunk-mib, zero_gpu_chunks.cuh): when the first chunk of its recomputation or its backward begins.
static inline void zero_gpu_rc_prefetch(ZeroGpu* zg, int u) {
    Zero* z = &zg->z;
    const DbrxConfig* c = &zg->model->cfg;
    if (!zg->work_rc || u % 2 || u < 4 || u > 2 * c->n_layers) return;   // (u: the experts unit of layer l+1 >= 1)
    if (g_debug_hooks.plant == PLANT_NO_RC_PREFETCH) return;   // (the stream test's negative control: gathered when it begins)
    int l = u / 2 - 2, b = dbrx_block_unit(l);
    if (zg->rc_unit == b) return;   // (gathered already: a chunked unit's recomputation began)
    if (!(zg->model->rc_mode[l] & (RC_MOE | RC_BLOCK)) || zero_vocab_unit(z, b) || z->unit_nchunks[b] > 1) return;
    if (zg->fp8.on && !zg->fp8.lay.unit_mats[b].empty()) return;   // (--fp8-gather: its codes go through the slots)
    cudaStream_t comm = zero_comm_stream(zg);
    cudaCheck(cudaStreamWaitEvent(comm, zg->rc_free, 0));
    cudaCheck(cudaStreamWaitEvent(comm, zg->bf16_ready, 0));
    prof_begin(prof_stream(comm, "communication (shard group)"), "comm", "all-gather unit %d", b);
    for (size_t i = 0; i < z->runs[b].size(); i++) {
        const ShardRun& r = z->runs[b][i];
        if (zero_run_mine(z, r))
            comm_all_gather(zero_unit_group(z, b), zg->master_bf16 + z->shard_off[b] + r.shard_rel, zg->work_rc + r.slot_off, r.chunk, COMM_BF16);
    }
    prof_end(prof_stream(comm, "communication (shard group)"));
    cudaCheck(cudaEventRecord(zg->rc_gathered, comm));
    zg->rc_unit = b;
}

// --zero-prefetch (the top comment, "the step's end"): 0..2 items (0 where nothing is gathered, S = 1)
static inline void zero_gpu_set_step_prefetch(ZeroGpu* zg, int n) { zg->step_prefetch = zg->z.S > 1 ? std::min(n, 2) : 0; }

// The optimizer over the shard with the next step's first items gathered between its two launches:
// adamw(s0, s1, max_n, elems) updates segments [s0, s1) (elems: their elements; 0: the whole shard in one launch)
template <typename Fn> static inline void zero_gpu_adamw_prefetch(ZeroGpu* zg, Fn adamw) {
    Zero* z = &zg->z;
    std::vector<std::pair<int, int>> items;   // (unit, chunk) of the forward's first items
    size_t end = 0;                           // where their units' shards end
    for (int u = 0, j = 0; (int)items.size() < zg->step_prefetch && u < z->n_units;) {
        if (zg->fp8.on && !zg->fp8.lay.unit_mats[u].empty()) break;   // (an FP8 block: its codes need the next step's scales)
        if (u == 0 && zg->emb.on) { u++; continue; }   // (the embedding's rows are exchanged per batch: zero_gpu_embedding.cuh)
        items.push_back({u, j});
        end = std::max(end, z->shard_off[u] + z->shard_numel[u]);
        if (++j >= z->unit_nchunks[u] || zero_vocab_unit(z, u)) { u++; j = 0; }   // (a vocabulary unit: one gather, whole)
    }
    if (items.empty()) { adamw(0, zg->nseg, zg->seg_max, 0); return; }
    int k = 0;   // the segments before `end` (sorted by offset; a unit's shard is whole segments)
    while (k < zg->nseg && zg->seg_off_host[k] < end) k++;
    auto part = [&](int s0, int s1) {
        size_t max_n = 0, elems = 0;
        for (int s = s0; s < s1; s++) { max_n = std::max(max_n, zg->seg_n_host[s]); elems += zg->seg_n_host[s]; }
        if (s1 > s0) adamw(s0, s1, max_n, elems);
    };
    part(0, k);
    cudaCheck(cudaEventRecord(zg->bf16_ready, zg->compute));   // those units' BF16 shard is this step's
    for (const std::pair<int, int>& it : items) zero_gpu_gather_async(zg, it.first, it.second);
    part(k, zg->nseg);
}

// --grad-reduce-dtype bf16 (zero_gpu_reduce_scatter below): a run's FP32 gradient rounded to BF16, eight elements a thread
// (two 16-byte loads, one 16-byte store) where both ends are 16-byte aligned, else one at a time (a run's tail)
__global__ void zero_round_bf16_kernel(floatX* out, const float* in, size_t n) {
    bool vec = ((uintptr_t)in % 16 == 0) && ((uintptr_t)out % 16 == 0);
    for (size_t i = 8 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < n; i += 8 * (size_t)gridDim.x * blockDim.x) {
        if (vec && i + 8 <= n) {
            float4 a = *(const float4*)(in + i), b = *(const float4*)(in + i + 4);
            floatX h[8] = {__float2bfloat16(a.x), __float2bfloat16(a.y), __float2bfloat16(a.z), __float2bfloat16(a.w),
                           __float2bfloat16(b.x), __float2bfloat16(b.y), __float2bfloat16(b.z), __float2bfloat16(b.w)};
            *(uint4*)(out + i) = *(const uint4*)h;
        } else
            for (size_t k = i; k < i + 8 && k < n; k++) out[k] = __float2bfloat16(in[k]);
    }
}
// this rank's reduced BF16 chunk added to its FP32 gradient shard (the step's first: written into it)
__global__ void zero_accumulate_bf16_kernel(float* acc, const floatX* x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] += __bfloat162float(x[i]);
}
__global__ void zero_bf16_to_f32_kernel(float* out, const floatX* x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(x[i]);
}
// HSDP (R > 1, P = S): item (u, j)'s shard part summed over the replica group on its stream, after the reduce-scatter
// stream's work so far (after_rs; else after what the replica stream was ordered behind). During the step's last
// micro-batch each item goes right after its reduce-scatter, so the replicas' sums run beside the rest of the backward
// instead of all at once after it (DBRX-132B on 256 H100s, HSDP 64 x 4: 274 ms predicted, all exposed). Run by run:
// the shard's padding stays zero on every rank. The same sums as the shard at once for 2 replicas (a + b); for more
// the ring's order of an element follows its place in the call, so they may differ in the last bits (deterministic).
static inline void zero_gpu_replica_reduce(ZeroGpu* zg, int u, int j, bool after_rs) {
    Zero* z = &zg->z;
    ENSURE(!zg->replica_done[z->item_base[u] + j], "internal error: unit %d chunk %d summed over the replicas twice in one step "
           "(reduce-scattered twice in its last micro-batch)", u, j);
    if (after_rs) {
        cudaCheck(cudaEventRecord(zg->comm_done, zero_gpu_rs_stream(zg)));
        cudaCheck(cudaStreamWaitEvent(z->replica.stream, zg->comm_done, 0));
    }
    prof_begin(prof_stream(z->replica.stream, "communication (replica group)"), "comm", "all-reduce unit %d chunk %d", u, j);
    for (size_t i = 0; i < z->runs[u].size(); i++) {
        const ShardRun& r = z->runs[u][i];
        if (zero_run_mine(z, r) && z->run_chunk[u][i] == j) comm_all_reduce(&z->replica, zg->grad + z->shard_off[u] + r.shard_rel, r.chunk, COMM_F32);
    }
    prof_end(prof_stream(z->replica.stream, "communication (replica group)"));
    zg->replica_done[z->item_base[u] + j] = 1;
}

// item (u, j)'s gradient (its gradient slot: the unit's, or chunk j's of a chunked experts unit)
// reduce-scattered into the gradient shard on the reduce-scatter stream, after the compute stream has written it.
// The step's first reduce-scatter of the item (zg->grad_fresh: the first micro-batch's) overwrites the shard's part:
// FP32 reduce-scattered straight into it, BF16 converted into it; the later ones add to it (0 + x = x: the same
// values as accumulating into zeros, so AdamW no longer zeroes the gradient, model/adamw.cuh)
static inline void zero_gpu_reduce_scatter(ZeroGpu* zg, int u, int j) {
    Zero* z = &zg->z;
    int slot = zero_item_slot(z, u, j), item = z->item_base[u] + j;
    // (DBRX_DEBUG_PLANT=stale_grad: unit 1's first adds to the previous step's gradient, test/test_grad_overwrite.sh's control)
    bool first = zg->grad_fresh[item] && !(g_debug_hooks.plant == PLANT_STALE_GRAD && u == 1);
    zg->grad_fresh[item] = 0;
    cudaStream_t rs = zero_gpu_rs_stream(zg);
    cudaCheck(cudaEventRecord(zg->grads_ready[slot], zg->compute));
    cudaCheck(cudaStreamWaitEvent(rs, zg->grads_ready[slot], 0));
    if (z->unit_nchunks[u] > 1) prof_begin(prof_stream(rs, "communication (shard group, reduce-scatter)"), "comm", "reduce-scatter unit %d chunk %d", u, j);
    else prof_begin(prof_stream(rs, "communication (shard group, reduce-scatter)"), "comm", "reduce-scatter unit %d", u);
    // (test/test_zero_gpu.sh's negative control plants an error here: the neighbour's chunk)
    CommGroup* grp = zero_gpu_rs_group(zg, u);
    int mine = g_debug_hooks.plant == PLANT_REDUCE_SCATTER_CHUNK ? (grp->rank + 1) % grp->size : grp->rank;
    for (size_t i = 0; i < z->runs[u].size(); i++) {   // run by run, out of the full gradient of the unit (chunk)
        const ShardRun& r = z->runs[u][i];
        if (!zero_run_mine(z, r) || z->run_chunk[u][i] != j) continue;
        float *full = zg->gwork[slot] + r.slot_off, *shard = zg->grad + z->shard_off[u] + r.shard_rel;
        if (zg->rs_bf16 && grp->size > 1) {   // --grad-reduce-dtype bf16: rounded into the scratch, reduced there (the
                                              // stream orders its reuse; a group of one, EP's experts at S = EP, sums nothing)
            size_t n = r.chunk * (size_t)grp->size;
            const floatX* own = zg->rs_scratch + (size_t)mine * r.chunk;
            LAUNCH(zero_round_bf16_kernel, zero_grid((n + 7) / 8), 256, 0, rs, zg->rs_scratch, full, n);
            comm_reduce_scatter_inplace(grp, zg->rs_scratch, r.chunk, COMM_BF16);
            if (first) LAUNCH(zero_bf16_to_f32_kernel, zero_grid(r.chunk), 256, 0, rs, shard, own, r.chunk);
            else LAUNCH(zero_accumulate_bf16_kernel, zero_grid(r.chunk), 256, 0, rs, shard, own, r.chunk);
            continue;
        }
        if (first && mine == grp->rank) {   // the sums written where they belong: no accumulate pass
            comm_reduce_scatter(grp, full, shard, r.chunk, COMM_F32);
            continue;
        }
        comm_reduce_scatter_inplace(grp, full, r.chunk, COMM_F32);
        if (first) cudaCheck(cudaMemcpyAsync(shard, full + (size_t)mine * r.chunk, r.chunk * sizeof(float), cudaMemcpyDeviceToDevice, rs));
        else LAUNCH(zero_accumulate_kernel, zero_grid(r.chunk), 256, 0, rs, shard, full + (size_t)mine * r.chunk, r.chunk);
    }
    prof_end(prof_stream(rs, "communication (shard group, reduce-scatter)"));
    // the slot zeroed for its next unit (the unit's length: a slot is all zeros whenever it is free, zero_init zeroes
    // it first), here on the reduce-scatter stream beside the compute stream's next backward, not in front of it
    cudaCheck(cudaMemsetAsync(zg->gwork[slot], 0, z->slot_numel[u] * sizeof(float), rs));
    cudaCheck(cudaEventRecord(zg->grads_reduced[slot], rs));
    // (HSDP: beside the backward; DBRX_DEBUG_PLANT=replica_at_end: after it, test/test_comm_streams.sh's control)
    if (zg->last_micro && z->R > 1 && z->P == z->S && g_debug_hooks.plant != PLANT_REPLICA_AT_END) zero_gpu_replica_reduce(zg, u, j, true);
}

// S > 1, after the micro-batches: the shard's parts of items that no backward reduce-scattered this step (none in a
// training step: every unit's backward runs) zeroed on the reduce-scatter stream, so that no stale gradient is left
static inline void zero_gpu_zero_unwritten(ZeroGpu* zg) {
    Zero* z = &zg->z;
    cudaStream_t rs = zero_gpu_rs_stream(zg);
    bool waited = false;
    for (int u = 0; u < z->n_units; u++)
        for (size_t i = 0; i < z->runs[u].size(); i++) {
            const ShardRun& r = z->runs[u][i];
            if (!zero_run_mine(z, r) || !zg->grad_fresh[z->item_base[u] + z->run_chunk[u][i]]) continue;
            if (!waited) {   // (after the compute stream's last read of the gradient: the previous step's optimizer)
                cudaCheck(cudaEventRecord(zg->comm_done, zg->compute));
                cudaCheck(cudaStreamWaitEvent(rs, zg->comm_done, 0));
                waited = true;
            }
            cudaCheck(cudaMemsetAsync(zg->grad + z->shard_off[u] + r.shard_rel, 0, r.chunk * sizeof(float), rs));
        }
    std::fill(zg->grad_fresh.begin(), zg->grad_fresh.end(), 0);
}

// expert parallelism's row exchange for the dispatcher (ExpertParallel): the counts over MPI on the host; the
// rows over NCCL on the EP group's stream, ordered after the compute stream's work and before its next
static inline void zero_gpu_ep_all_to_allv(void* ctx, const void* send, const size_t* sb, void* recv, const size_t* rb, int host) {
    ZeroGpu* zg = (ZeroGpu*)ctx;
    CommGroup* g = &zg->z.ep;
    if (host) { comm_all_to_allv(g, send, sb, recv, rb, true); return; }
    cudaCheck(cudaEventRecord(zg->ep_ready, zg->compute));
    cudaCheck(cudaStreamWaitEvent(g->stream, zg->ep_ready, 0));
    comm_all_to_allv(g, send, sb, recv, rb, false);
    cudaCheck(cudaEventRecord(zg->ep_done, g->stream));
    cudaCheck(cudaStreamWaitEvent(zg->compute, zg->ep_done, 0));
}
