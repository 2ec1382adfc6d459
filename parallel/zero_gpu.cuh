/*
 * zero_gpu.cuh — the parameter store of the CUDA path: ZeRO-3/HSDP (and, with S = 1, plain data
 * parallelism) with the state in device memory and the collectives on NCCL. parallel/zero.h has the
 * layout (units, shards, segments) and the groups, and is the store of the CPU path; this file is the
 * same store with the same calls (zero_init, zero_zero_grad, zero_reduce_grads, zero_update,
 * zero_bytes_sent, zero_to_host, zero_from_host, zero_free), overloaded on ZeroGpu, so that the one
 * training loop of train_dbrx.cu drives either. The model (model/dbrx_cuda.cuh) knows nothing of it:
 * it announces its units through the hooks, as the CPU model does.
 *
 *   state      fp32 master, gradient and AdamW moment shards on the device, and a BF16 copy of the
 *              master shard (what the all-gathers send; AdamW writes it with the master). Host copies of
 *              master, m and v (Zero's) exist only for checkpoints and Hugging Face import/export:
 *              zero_to_host before a save or an export, zero_from_host after a load or an import.
 *   S > 1      two BF16 working slots (unit u in slot u % 2; with --zero-chunk-mib a block's experts are gathered
 *              in chunks of whole experts, each an item of the slot ring: zero_gpu_chunks.cuh) and two fp32
 *              gradient slots. Gathers run on
 *              the shard group's stream, reduce-scatters on a second communicator's stream (the streams,
 *              communicators, events and the one issue order: parallel/zero_gpu_comm.cuh), ordered against
 *              the compute stream with events: while unit u computes, unit u+1 (forward) or u-1 (backward)
 *              is gathered into the other slot, and unit u's gradient is reduce-scattered while unit u-1's
 *              backward runs, beside the gather of unit u-2. Gradients are reduced in FP32 (parallel/README.md:
 *              bytes and the accuracy trade-off). Under --recompute moe/block a third BF16 slot of one block unit
 *              (work_rc): layer l's block, which its recompute needs right after layer l+1's block, is gathered
 *              into it when layer l+1's experts begin their backward (zero_gpu_comm.cuh, zero_gpu_rc_prefetch).
 *   S = 1      the shard is the whole model: the model's views point into the store's buffers, nothing
 *              is gathered, and the gradients are all-reduced across the replicas after the micro-batches.
 *   the step   gradient shards all-reduced across the replica group and scaled by 1 / W; the global norm
 *              from a device sum of squares, all-reduced (fp64) in the shard group on the device, read
 *              once by the host (the clip scale and the log line); AdamW over every tensor segment of the shard in one launch.
 * Under the SIMT emulator (train_dbrx_emu) the NCCL calls go to the NCCL twin (model/platform.h picks it)
 * and run between processes over MPI, so this file executes in CI under mpirun.
 */
#pragma once
#include "zero.h"
#include "zero_fp8.h"
#include "zero_fp8_layout.h"
#include "../model/debug_hooks.h"
#include "../model/dbrx_cuda.cuh"
#include "expert_parallel_cuda.cuh"

// --fp8-gather on the device: the blocks' five FP8 matrices travel as E4M3 codes (1 byte/param), the
// rest of a block (norms, router) as BF16; in the working slot the codes stay codes, which the model's FP8 GEMMs read
// as they are (generation, whose GEMMs are BF16: decoded back to BF16; zero_gpu_fp8.cuh). Where things go: `lay`
// (parallel/zero_fp8_layout.h, which --dry-run's plan counts too).
typedef struct {
    int on, ready;
    Fp8GatherLayout lay;
    std::vector<int> mat_slot;                  // per matrix: the model's weight slot (Fp8GPU)
    float *amax, *scale, *inv;                  // device, per group
    size_t* mat_table;                          // device (3 per matrix): its weight slot, first group, group count
    __nv_fp8_storage_t *codes_send, *codes_recv;   // device: a unit's codes of this rank by shard position; the largest slot
    floatX *side_send, *side_recv;              // device: a unit's non-FP8 elements of this rank; S * max side
    std::vector<char> encoded;                  // per unit: encoded this step (its saturations counted)
    cudaEvent_t codes_ready;                    // compute -> comm: this step's scales agreed (the encodes may run)
    float* factors[2];                          // device, per working slot (block): its matrices' factors, q's and qt's
    int slot_codes[2];                          // per working slot: its block matrices hold codes (1), BF16 (0), nothing (-1)
} ZeroGpuFp8;

// --zero-embedding rows (zero_gpu_embedding.cuh: what each field is for)
#include <climits>
#define EMB_ABSENT LLONG_MIN

// one run of the embedding unit (zero_unit_layout's runs of unit 0): this rank's piece [lo, hi) of the unit's flat
// elements at shard position `at`, its rows [v_lo, v_hi), and this micro-batch's counts (elements)
typedef struct {
    size_t lo, hi, at, run_lo, chunk;  // (chunk: a rank's piece with its padding, ShardRun.chunk)
    int v_lo, v_hi;
    size_t table_off;                  // its rows' entries in `table`: (v_hi - v_lo) x S
    std::vector<size_t> lo_of, hi_of;  // every group rank's piece of the run
    std::vector<size_t> from, to;      // per group rank: elements of my rows in its piece; of its rows in mine
    size_t my_start;                   // where the run's rows begin in `rows` / `grads` (elements)
} EmbRun;

typedef struct ZeroGpuEmb {
    int on, N, d, S, me;
    CommGroup comm;                    // "embedding": the shard group's ranks, at most ZERO_EMB_NCCL_CTAS channels; its stream
                                       // runs the exchange (pack, both directions' send/recv, the owners' sums)
    floatX* rows;                      // device (N, d): this micro-batch's distinct tokens' rows, increasing token
    float* grads;                      // device (N, d): their weight gradients (the sums over each token's positions)
    int *index, *iota;                 // device (N): each position's row in `rows`; 0, 1, ... (the compact backward)
    long long* table[2];               // device: every run's entries (EmbRun.table_off), one per forward parity
    int* host_index;                   // pinned (N)
    long long* host_table[2];          // pinned, as table
    size_t table_numel;
    std::vector<EmbRun> runs;
    std::vector<int> mine;             // this micro-batch's distinct tokens, increasing
    std::vector<std::vector<int>> lists;   // every group rank's
    int forwards, cur;                 // exchanges so far; the last one's table (forwards - 1) % 2
    int active;                        // this forward's unit 0 was exchanged (its end releases the vocabulary slot)
    int planned;                       // the last training forward exchanged (its backward sends the gradient rows)
    cudaEvent_t ready, arrived;        // compute -> exchange: the plan uploaded (and all before it); exchange -> compute: rows in
    cudaEvent_t grads_done, sent;      // compute -> exchange: `grads` written; exchange -> compute, reduce-scatter: summed
    cudaEvent_t table_free[2];         // exchange -> compute: table[b] no longer read
} ZeroGpuEmb;

typedef struct {
    Zero z;                           // layout, groups (NCCL), host shards for checkpoints and import/export
    DbrxGPU* model;
    float *master, *grad, *m, *v;     // device, z.shard_total each (m, v: NULL under --adam-moments bf16; v under --optimizer lion)
    floatX *m16, *v16;                // device, z.shard_total each: the moments in BF16 (--adam-moments bf16), else NULL
    floatX* master_bf16;              // device, z.shard_total: the all-gathers' input (S = 1: the model's weights)
    floatX* work[2];                  // device, z.work_numel each: gathered units (S > 1)
    float* gwork[2];                  // device, z.work_numel each: full gradients of units in backward (S > 1)
    int rs_bf16;                      // --grad-reduce-dtype bf16: the shard group's reduce-scatters in BF16 (zero_gpu_comm.cuh)
    floatX* rs_scratch;               // device, zero_max_run_numel (rs_bf16 and S > 1): one run's gradient rounded to BF16
    int slot_unit[2];
    floatX* work_rc;                  // device, zero_rc_slot_numel (NULL: none): a block unit gathered ahead for its recompute
    int rc_unit, in_backward;         // the unit work_rc holds (-1: none); the step is in its backward (zero_gpu_comm.cuh)
    cudaEvent_t rc_gathered, rc_free; // comm -> compute: work_rc filled; compute -> comm: no longer read
    floatX* vocab;                    // device, zero_vocab_slot_numel (z.vocab_rows > 0): the embedding or the head, gathered whole
    int vocab_unit;                   // the unit it holds (-1: none; zero_gpu_vocab.cuh)
    cudaEvent_t vocab_gathered, vocab_free;   // comm -> compute: filled; compute -> comm: no longer read
    float* norm_partial;              // device (GRAD_NORM_BLOCKS): partial sums of squares
    size_t *seg_off, *seg_n;          // device (nseg): the shard's segments and padding, for AdamW's one launch
    int* seg_mode;                    // (adamw_segments, model/adamw.cuh)
    float grad_pre;                   // the factor the gradient awaits: 1 / W after the reduction (the optimizer applies it)
    int grad_clean;                   // the gradient shard is all zeros (S = 1: the fused AdamW zeroes it)
    std::vector<char> grad_fresh;     // S > 1, per item (z.item_base[u] + j): its shard part not yet written this step,
                                      // so its next reduce-scatter overwrites it (zero_gpu_comm.cuh); nothing is zeroed
    int last_micro;                   // the backward running is the step's last micro-batch's (zero_last_micro)
    std::vector<char> replica_done;   // HSDP, per item: its shard part summed over the replicas this step (zero_gpu_comm.cuh)
    int nseg;
    size_t seg_max;
    std::vector<size_t> seg_off_host, seg_n_host;   // the same table on the host (the optimizer's split: zero_gpu_comm.cuh)
    int step_prefetch;                // --zero-prefetch: items of the next step gathered during the optimizer (zero_gpu_comm.cuh)
    double* norm_sumsq;               // device (1): this rank's sum of squares, then the group's
    double* norm_units;               // device (2 x units), data parallel with EP: per unit, non-expert | expert
    cudaStream_t compute;             // the model's stream
    cudaEvent_t gathered[2];          // comm -> compute: slot filled
    cudaEvent_t slot_free[2];         // compute -> comm: slot no longer read
    cudaEvent_t grads_ready[2];       // compute -> comm: gradient slot written
    cudaEvent_t grads_reduced[2];     // comm -> compute: gradient slot reduced, may be reused
    cudaEvent_t bf16_ready;           // compute -> comm: master_bf16 up to date
    cudaEvent_t comm_done;            // comm -> compute / the other comm stream
    cudaEvent_t ep_ready, ep_done;    // expert parallelism: compute -> the EP group's stream -> compute
    CommGroup rs_shard, rs_expert_shard;   // S > 1: the reduce-scatters' communicators (zero_gpu_comm.cuh)
    int rs_on;
    EpDispatchGpu* ep_dispatch;       // the model's experts dispatcher over z.ep (EP degree > 1; NULL: none)
    size_t device_bytes;              // what the store allocated on the device
    long long shard_bytes_measured;   // the five shard arrays, measured by the device's free memory
    ZeroGpuFp8 fp8;                   // --fp8-gather (off: fp8.on == 0)
    ZeroGpuEmb emb;                   // --zero-embedding rows (off: emb.on == 0; zero_gpu_emb_setup)
    std::vector<void*> allocations;
    int plant_deferred;               // DBRX_DEBUG_PLANT=reorder_issue: a prefetch held back until the unit ends (-1: none)
} ZeroGpu;

__global__ void zero_accumulate_kernel(float* acc, const float* x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] += x[i];
}
__global__ void zero_scale_kernel(float* x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
__global__ void zero_f32_to_bf16_kernel(floatX* out, const float* in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}
// one thread adds the partial sums in order, in double: the same result on every device
__global__ void zero_sum_partials_kernel(double* out, const float* partial, int n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double acc = 0;
    for (int b = 0; b < n; b++) acc += partial[b];
    *out = acc;
}
static inline int zero_grid(size_t n) { size_t b = (n + 255) / 256; return (int)(b < 4096 ? (b ? b : 1) : 4096); }

static inline cudaStream_t zero_comm_stream(ZeroGpu* zg) { return zg->z.shard.stream; }   // the gather stream

// the recompute slot's elements (zero_gpu_rc_prefetch, zero_gpu_comm.cuh): a block unit's (unit 1: every block's
// the same), where S > 1 and some layer's backward recomputes its block's forward (--recompute moe/block: RC_MOE);
// with the experts in chunks too (--zero-chunk-mib: gathered by the first chunk of their recompute or backward)
static inline size_t zero_rc_slot_numel(const Zero* z) {
    int L = (z->n_units - 2) / 2;
    return z->S > 1 && L >= 2 && (recompute_union(&g_recompute, L) & RC_MOE) ? z->slot_numel[1] : 0;
}

// device memory of the store for a layout: the fp32 master and gradient shards, the moments (AdamW's two, LionW's one;
// fp32, or BF16 under --adam-moments bf16), the BF16 shard, and for S > 1 the slots
static inline size_t zero_gpu_bytes(const Zero* z, int rs_bf16 = 0) {
    size_t moment = g_adam_moments_bf16 ? sizeof(floatX) : sizeof(float);   // (--adam-moments)
    size_t b = z->shard_total * (2 * sizeof(float) + optimizer_moments() * moment + sizeof(floatX)) + GRAD_NORM_BLOCKS * sizeof(float) + sizeof(double);
    if (z->S > 1) b += 2 * z->work_numel * (sizeof(floatX) + sizeof(float)) + (rs_bf16 ? zero_max_run_numel(z) * sizeof(floatX) : 0)
                     + (zero_vocab_slot_numel(z) + zero_rc_slot_numel(z)) * sizeof(floatX);
    return b;
}

// the same, before the groups exist: from the parameter table, S and the EP degree n (the model's memory
// check, --dry-run); a degree that does not fit is left to zero_init to refuse (estimated as none)
static inline size_t zero_gpu_estimate_bytes(const DbrxConfig* c, int S, int n = 1, int Ec = 0, int rs_bf16 = 0, int Vc = 0) {
    if (n < 1 || c->n_experts % n || (S > 1 && S % n)) n = 1;
    Zero z;
    zero_unit_layout(&z, c, dbrx_param_table(c), S, n, Ec, Vc);
    return zero_gpu_bytes(&z, rs_bf16);
}

static inline void zero_gpu_unit_begin(void* ctx, int u, int phase);
static inline void zero_gpu_unit_end(void* ctx, int u, int phase);
static inline void zero_from_host(ZeroGpu* zg);
static inline void zero_fp8_gather_unit(ZeroGpu* zg, int u, int slot);
static inline void zero_gpu_chunk_forward(void* ctx, int l, const int* offsets_host, const floatX* xe, floatX* ye, int train);
static inline void zero_gpu_chunk_backward(void* ctx, int l, const floatX* dye, floatX* dxe);
static inline void zero_gpu_ep_chunk_begin(void* ctx, int l, int j, int backward, int train, floatX** w, float** gw);
static inline void zero_gpu_ep_chunk_end(void* ctx, int l, int j, int backward, int train);
static inline void zero_gpu_vocab_backward(void* ctx, int u);
static inline int zero_gpu_emb_setup(ZeroGpu* zg, int N, int rank);
static inline void zero_gpu_vocab_begin(ZeroGpu* zg, int u, int phase);
static inline void zero_gpu_vocab_end(ZeroGpu* zg, int u, int phase);
static inline void zero_gpu_vocab_gather(ZeroGpu* zg, int u);
#include "zero_gpu_comm.cuh"

// The store of the CUDA path: the groups (NCCL communicators on shard and replica groups), the layout,
// this rank's shard initialised as the unsharded model would be (seed) in host memory and uploaded.
// Installs the hooks on `model` when S > 1, else points its views at the whole-model buffers. The
// model is built first (dbrx_build_shape), with the store's bytes in its memory check. chunk_mib:
// --zero-chunk-mib (zero_chunk_experts: a block's experts gathered chunk by chunk; 0: whole).
static inline void zero_init(ZeroGpu* zg, DbrxGPU* model, Comm* comm, int S, uint64_t seed, int ep_n = 1, double ep_factor = EP_CAPACITY_DEFAULT,
                             double chunk_mib = 0, int rs_bf16 = 0, int ep_spread = 0) {
    Zero* z = &zg->z;
    const DbrxConfig* c = &model->cfg;
    const std::vector<ParamInfo>& t = model->table;
    int Ec = zero_chunk_experts(c, S ? S : comm->world, ep_n, fp8_on(&model->fp8), chunk_mib);
    int Vc = zero_vocab_rows(c, S ? S : comm->world, ep_n, fp8_on(&model->fp8), chunk_mib);   // (zero_gpu_vocab.cuh)
    zero_init_layout(z, c, t, comm, S, 1, ep_n, Ec, Vc, ep_spread);
    if (comm->rank == 0 && Vc)
        printf("zero: the embedding and lm_head gathered whole into one vocabulary slot of %zu params, their gradients "
               "reduce-scattered in %d chunks of %d vocabulary rows\n", zero_vocab_slot_numel(z), z->unit_nchunks[0], Vc);
    if (comm->rank == 0 && Ec)
        printf("zero: a block's experts gathered and reduce-scattered in %d chunks of %d expert(s)%s (--zero-chunk-mib %g): working slots "
               "of %zu params\n", c->n_experts / ep_n / Ec, Ec, ep_n > 1 ? " of a rank's own" : "", chunk_mib, z->work_numel);
    else if (comm->rank == 0 && fp8_on(&model->fp8) && zero_chunk_experts(c, z->S, ep_n, false, chunk_mib))
        printf("note: --zero-chunk-mib has no effect on the experts with --fp8: a block's experts are one unit (under EP its %d experts only)\n",
               c->n_experts / ep_n);
    zero_gpu_comm_init(zg, comm->rank);   // the reduce-scatters' communicators (S > 1)
    zg->plant_deferred = -1; zg->step_prefetch = 0;   // (zero_gpu_set_step_prefetch)
    zg->ep_dispatch = NULL;
    if (ep_n > 1) {
        // the experts' gathers and reduce-scatters (the expert shard group) go on the shard group's stream,
        // under the same events as every other unit's
        comm_share_stream(&z->expert_shard, &z->shard);
        cudaCheck(cudaEventCreateWithFlags(&zg->ep_ready, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&zg->ep_done, cudaEventDisableTiming));
        zg->ep_dispatch = new EpDispatchGpu();   // the model's experts run through it, the rows over the EP group
        ep_gpu_install(zg->ep_dispatch, model, ep_n, z->ep_rank, ep_factor, zero_gpu_ep_all_to_allv, zg);
    }
    zg->model = model;
    zg->compute = 0;
    // host shards (checkpoints, import/export): master, m, v (LionW: no v)
    size_t n = z->shard_total, bytes = n * sizeof(float);
    const bool has_v = optimizer_moments() == 2;
    z->master = (real*)mallocCheck(bytes); z->m = (real*)mallocCheck(bytes); z->v = has_v ? (real*)mallocCheck(bytes) : NULL;
    z->grad = NULL;
    if (!platform_shapes_only()) {   // (the step-time model's emulation needs no values: model/platform.h)
        memset(z->master, 0, bytes); memset(z->m, 0, bytes);
        if (has_v) memset(z->v, 0, bytes);
        for (const ShardSegment& g : z->segs)   // this rank's part of the initialisation, drawn alone
            dbrx_init_range(z->master + g.shard_off, g.flat_off, g.flat_off + g.numel, c, t, seed);
    }
    // device state: the shards, measured as the drop in the device's free memory (the emulator's allocator
    // counts exactly; a real GPU in its allocation granularity), then the slots
    zg->allocations.clear();
    auto take = [&](void** p, size_t b) { *p = (void*)deviceAlloc(char, b); zg->allocations.push_back(*p); };
    size_t free0 = 0, free1 = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free0, &total));
    take((void**)&zg->master, bytes); take((void**)&zg->grad, bytes);
    zg->m = zg->v = NULL; zg->m16 = zg->v16 = NULL;
    if (g_adam_moments_bf16) { take((void**)&zg->m16, n * sizeof(floatX)); if (has_v) take((void**)&zg->v16, n * sizeof(floatX)); }
    else { take((void**)&zg->m, bytes); if (has_v) take((void**)&zg->v, bytes); }
    take((void**)&zg->master_bf16, n * sizeof(floatX));
    cudaCheck(cudaMemGetInfo(&free1, &total));
    zg->shard_bytes_measured = (long long)free0 - (long long)free1;
    take((void**)&zg->norm_partial, GRAD_NORM_BLOCKS * sizeof(float));
    {   // AdamW's segment table: one launch per step for the whole shard (adamw_fused_update_gpu)
        std::vector<std::array<size_t, 3>> pieces;
        for (const ShardSegment& g : z->segs) pieces.push_back({g.shard_off, g.numel, (size_t)g.decay});
        AdamwSegments t = adamw_segments(pieces, n);
        zg->nseg = (int)t.off.size();
        zg->seg_max = t.max_n;
        zg->seg_off_host = t.off; zg->seg_n_host = t.n;
        take((void**)&zg->seg_off, std::max<size_t>(1, t.off.size()) * sizeof(size_t));
        take((void**)&zg->seg_n, std::max<size_t>(1, t.n.size()) * sizeof(size_t));
        take((void**)&zg->seg_mode, std::max<size_t>(1, t.mode.size()) * sizeof(int));
        if (zg->nseg) {
            cudaCheck(cudaMemcpy(zg->seg_off, t.off.data(), t.off.size() * sizeof(size_t), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(zg->seg_n, t.n.data(), t.n.size() * sizeof(size_t), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(zg->seg_mode, t.mode.data(), t.mode.size() * sizeof(int), cudaMemcpyHostToDevice));
        }
    }
    take((void**)&zg->norm_sumsq, sizeof(double));
    zg->norm_units = nullptr;
    if (z->P != z->S) {   // (each entry is written by its own unit; the other half stays zero)
        take((void**)&zg->norm_units, 2 * z->n_units * sizeof(double));
        cudaCheck(cudaMemset(zg->norm_units, 0, 2 * z->n_units * sizeof(double)));
    }
    zg->work[0] = zg->work[1] = nullptr;
    zg->gwork[0] = zg->gwork[1] = nullptr;
    zg->rs_bf16 = rs_bf16;
    zg->rs_scratch = nullptr;
    if (rs_bf16 && z->S > 1) take((void**)&zg->rs_scratch, zero_max_run_numel(z) * sizeof(floatX));
    zg->vocab = nullptr;
    zg->vocab_unit = -1;
    if (z->vocab_rows) take((void**)&zg->vocab, zero_vocab_slot_numel(z) * sizeof(floatX));
    cudaCheck(cudaEventCreateWithFlags(&zg->vocab_gathered, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&zg->vocab_free, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(zg->vocab_free, zg->compute));
    zg->work_rc = nullptr; zg->rc_unit = -1; zg->in_backward = 0;
    if (zero_rc_slot_numel(z)) take((void**)&zg->work_rc, zero_rc_slot_numel(z) * sizeof(floatX));
    cudaCheck(cudaEventCreateWithFlags(&zg->rc_gathered, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&zg->rc_free, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(zg->rc_free, zg->compute));
    for (int i = 0; i < 2; i++) {
        if (z->S > 1) {
            take((void**)&zg->work[i], z->work_numel * sizeof(floatX));
            take((void**)&zg->gwork[i], z->work_numel * sizeof(float));
            cudaCheck(cudaMemset(zg->gwork[i], 0, z->work_numel * sizeof(float)));   // (zero whenever free: zero_gpu_reduce_scatter)
        }
        cudaCheck(cudaEventCreateWithFlags(&zg->gathered[i], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&zg->slot_free[i], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&zg->grads_ready[i], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&zg->grads_reduced[i], cudaEventDisableTiming));
        // recorded once, so that the first waits on them are satisfied
        cudaCheck(cudaEventRecord(zg->slot_free[i], zg->compute));
        cudaCheck(cudaEventRecord(zg->grads_reduced[i], zg->compute));
        zg->slot_unit[i] = -1;
    }
    cudaCheck(cudaEventCreateWithFlags(&zg->bf16_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&zg->comm_done, cudaEventDisableTiming));
    zg->device_bytes = zero_gpu_bytes(z, rs_bf16);
    zg->fp8.on = 0;
    zg->emb.on = zg->emb.active = zg->emb.planned = 0;
    z->state_bytes = zg->device_bytes;
    z->work_bytes = z->S > 1 ? 2 * z->work_numel * (sizeof(floatX) + sizeof(float)) + (rs_bf16 ? zero_max_run_numel(z) * sizeof(floatX) : 0)
                                   + (zero_vocab_slot_numel(z) + zero_rc_slot_numel(z)) * sizeof(floatX) : 0;
    z->state_rss = 0;
    cudaCheck(cudaMemset(zg->grad, 0, bytes));
    zg->grad_clean = 1;
    zg->grad_fresh.assign(z->n_units ? z->item_base.back() + z->unit_nchunks.back() : 0, 0);   // (zero: accumulating into it is right)
    zg->replica_done.assign(zg->grad_fresh.size(), 0);
    zg->last_micro = 1;
    zg->grad_pre = 1.0f;
    if (z->P == 1) {   // the shard is the whole model: the model reads and writes the store's buffers directly
        model->p = model_views(zg->master_bf16, c, t);
        model->g = model_views(zg->grad, c, t);
        model->hooks = UnitHooks{NULL, NULL, NULL};
    } else if (z->S == 1) {   // data parallel with EP: every unit's shard is its slot (all whole), read directly
        for (int u = 0; u < z->n_units; u++) {
            model_unit_views(&model->p, zg->master_bf16 + z->shard_off[u], u, c, t, ep_n);
            model_unit_views(&model->g, zg->grad + z->shard_off[u], u, c, t, ep_n);
        }
        model->hooks = UnitHooks{NULL, NULL, NULL};
    } else {
        model->hooks = UnitHooks{zero_gpu_unit_begin, zero_gpu_unit_end, zg};
        if (z->chunk_experts && !zg->ep_dispatch) model->experts = ExpertHooksGPU{zero_gpu_chunk_forward, zero_gpu_chunk_backward, zg};
        if (z->chunk_experts && zg->ep_dispatch)   // (under EP the dispatcher runs my experts' chunks: zero_gpu_chunks.cuh)
            ep_gpu_store_chunks(zg->ep_dispatch, z->unit_nchunks[dbrx_experts_unit(0)], z->chunk_experts, zg, zero_gpu_ep_chunk_begin, zero_gpu_ep_chunk_end);
        if (z->vocab_rows) model->vocab = VocabHooksGPU{zero_gpu_vocab_backward, zg};
    }
    zero_gpu_emb_setup(zg, model->B * model->T, comm->rank);   // (--zero-embedding rows: zero_gpu_embedding.cuh)
    zero_from_host(zg);
    std::vector<CommGroup*> watched = {&z->shard, &z->replica};   // a host blocked behind a stuck collective still ends
    if (ep_n > 1) { watched.push_back(&z->ep); watched.push_back(&z->expert_shard); }
    if (z->P != z->S) watched.push_back(&z->expert_replica_own);
    zero_gpu_comm_watched(zg, &watched);
    comm_watchdog_start(watched);
}

// the BF16 copy of the master shard, after the master changed other than by AdamW (a load)
static inline void zero_gpu_refresh_bf16(ZeroGpu* zg) {
    size_t n = zg->z.shard_total;
    if (zg->z.S > 1) {   // (a gather still reading the copy finishes first: the optimizer's prefetch on the gather
        cudaCheck(cudaEventRecord(zg->comm_done, zero_comm_stream(zg)));   // stream, the head's on the reduce-scatter one)
        cudaCheck(cudaStreamWaitEvent(zg->compute, zg->comm_done, 0));
        if (zg->rs_on) {
            cudaCheck(cudaEventRecord(zg->comm_done, zero_gpu_rs_stream(zg)));
            cudaCheck(cudaStreamWaitEvent(zg->compute, zg->comm_done, 0));
        }
    }
    if (zg->emb.on) {   // (and the embedding's pack, on its exchange's stream)
        cudaCheck(cudaEventRecord(zg->comm_done, zg->emb.comm.stream));
        cudaCheck(cudaStreamWaitEvent(zg->compute, zg->comm_done, 0));
    }
    LAUNCH(zero_f32_to_bf16_kernel, zero_grid(n), 256, 0, zg->compute, zg->master_bf16, zg->master, n);
    cudaCheck(cudaEventRecord(zg->bf16_ready, zg->compute));
    zg->slot_unit[0] = zg->slot_unit[1] = zg->vocab_unit = zg->rc_unit = -1;
    fp8_gpu_weights_changed(&zg->model->fp8);   // (the model's cached FP8 weights are stale too)
}

// FP32 host moments <-> BF16 device moments (--adam-moments bf16), a million at a time (no shard-sized staging copy)
static inline void zero_moments_to_bf16(floatX* dev, const float* host, size_t n) {
    if (platform_shapes_only()) { cudaCheck(cudaMemcpy(dev, host, n * sizeof(floatX), cudaMemcpyHostToDevice)); return; }   // (no values)
    for (size_t i = 0; i < n; i += (1u << 20)) to_device_bf16(dev + i, host + i, std::min<size_t>(n - i, 1u << 20));
}
static inline void zero_moments_from_bf16(float* host, const floatX* dev, size_t n) {
    if (platform_shapes_only()) { cudaCheck(cudaMemcpy(host, dev, n * sizeof(floatX), cudaMemcpyDeviceToHost)); return; }
    for (size_t i = 0; i < n; i += (1u << 20)) from_device_bf16(host + i, dev + i, std::min<size_t>(n - i, 1u << 20));
}

// host shards (master, m, v: a checkpoint's, an import's, or zero_init's) -> device
static inline void zero_from_host(ZeroGpu* zg) {
    Zero* z = &zg->z;
    size_t bytes = z->shard_total * sizeof(float);
    cudaCheck(cudaMemcpy(zg->master, z->master, bytes, cudaMemcpyHostToDevice));
    if (zg->m16) {   // (--adam-moments bf16: rounded; a BF16 run's checkpoint holds BF16 values, exact)
        zero_moments_to_bf16(zg->m16, z->m, z->shard_total);
        if (zg->v16) zero_moments_to_bf16(zg->v16, z->v, z->shard_total);
    } else {
        cudaCheck(cudaMemcpy(zg->m, z->m, bytes, cudaMemcpyHostToDevice));
        if (zg->v) cudaCheck(cudaMemcpy(zg->v, z->v, bytes, cudaMemcpyHostToDevice));
    }
    zero_gpu_refresh_bf16(zg);
    // the FP8 scales may have been restored with them (checkpoint/fp8_state.h): up to the device
    fp8_gpu_upload_scales(&zg->model->fp8);
}

// device shards -> host shards of z (before a checkpoint save or an export, which read z.master, z.m, z.v)
static inline void zero_to_host(ZeroGpu* zg) {
    Zero* z = &zg->z;
    size_t bytes = z->shard_total * sizeof(float);
    cudaCheck(cudaDeviceSynchronize());   // every stream: the communication streams are non-blocking
    cudaCheck(cudaMemcpy(z->master, zg->master, bytes, cudaMemcpyDeviceToHost));
    if (zg->m16) {   // (--adam-moments bf16: widened exactly; checkpoints keep FP32 moments either way)
        zero_moments_from_bf16(z->m, zg->m16, z->shard_total);
        if (zg->v16) zero_moments_from_bf16(z->v, zg->v16, z->shard_total);
    } else {
        cudaCheck(cudaMemcpy(z->m, zg->m, bytes, cudaMemcpyDeviceToHost));
        if (zg->v) cudaCheck(cudaMemcpy(z->v, zg->v, bytes, cudaMemcpyDeviceToHost));
    }
}

#include "zero_gpu_fp8.cuh"

static inline void zero_gpu_unit_begin(void* ctx, int u, int phase) {
    ZeroGpu* zg = (ZeroGpu*)ctx;
    Zero* z = &zg->z;
    DbrxGPU* model = zg->model;
    comm_phase("%s of unit %d (%s)", g_unit_phase_name[phase], u, dbrx_unit_name(u, &model->cfg).c_str());   // the heartbeat (host side)
    if (phase != UNIT_FORWARD) zg->in_backward = 1; else if (u == 0) zg->in_backward = 0;
    if (phase == UNIT_FORWARD && zg->in_backward && zg->rc_unit == u) {   // a recompute's block, gathered ahead (zero_gpu_rc_prefetch)
        cudaCheck(cudaStreamWaitEvent(zg->compute, zg->rc_gathered, 0));
        model_unit_views(&model->p, zg->work_rc, u, &model->cfg, model->table, z->ep_n);
        zero_gpu_prefetch_next(zg, u, phase);
        return;
    }
    if (zero_vocab_unit(z, u)) { zero_gpu_vocab_begin(zg, u, phase); return; }   // (zero_gpu_vocab.cuh)
    if (z->unit_nchunks[u] > 1) return;   // chunked experts: the experts hook gathers, computes and reduces chunk by chunk
    int slot = zero_item_slot(z, u, 0);
    if (phase != UNIT_BACKWARD_GRADS_ONLY) {
        zero_gpu_gather_unit_async(zg, u);
        if (g_debug_hooks.plant != PLANT_SKIP_GATHER_WAIT) zero_gpu_wait(zg, u, 0);   // (the negative control skips it)
        model_unit_views(&model->p, zg->work[slot], u, &model->cfg, model->table, z->ep_n);
        int next = zero_next_unit(z, u, phase);
        // DBRX_DEBUG_PLANT=reorder_issue: world rank 1 holds the backward's prefetch back until after the unit's
        // reduce-scatter (two communicators issued in another order than its peers: the order check's control)
        if (next >= 0 && g_debug_hooks.plant == PLANT_COMM_REORDER && phase != UNIT_FORWARD && z->world->rank == 1) zg->plant_deferred = next;
        else zero_gpu_prefetch_next(zg, u, phase);   // overlaps this unit's compute
        if (phase != UNIT_FORWARD) zero_gpu_rc_prefetch(zg, u);
    }
    if (phase != UNIT_FORWARD) {   // a zeroed gradient slot, once the previous reduce-scatter out of it (and its zeroing
        cudaCheck(cudaStreamWaitEvent(zg->compute, zg->grads_reduced[slot], 0));   // after it, zero_gpu_comm.cuh) has finished
        model_unit_views(&model->g, zg->gwork[slot], u, &model->cfg, model->table, z->ep_n);
    }
}

static inline void zero_gpu_unit_end(void* ctx, int u, int phase) {
    ZeroGpu* zg = (ZeroGpu*)ctx;
    Zero* z = &zg->z;
    if (zero_vocab_unit(z, u)) { zero_gpu_vocab_end(zg, u, phase); return; }
    if (phase == UNIT_FORWARD && zg->in_backward && zg->rc_unit == u) {   // (the recompute's block: work_rc read)
        cudaCheck(cudaEventRecord(zg->rc_free, zg->compute));
        zg->rc_unit = -1;
        return;
    }
    if (z->unit_nchunks[u] > 1) return;   // (each chunk was reduce-scattered and released by the experts hook)
    if (phase != UNIT_FORWARD) zero_gpu_reduce_scatter(zg, u, 0);   // on the reduce-scatter stream
    if (zg->plant_deferred >= 0) {
        int d = zg->plant_deferred;
        zero_gpu_gather_async(zg, d, zero_first_chunk(z, d, phase));
        zg->plant_deferred = -1;
    }
    // released after use, but for the last unit after its forward: its backward follows at once, and keeps
    // using the slot. The slot's event is recorded all the same: after a forward-only pass (evaluation)
    // the next gather into that slot must wait for this unit's compute to be done reading it.
    if (!(phase == UNIT_FORWARD && u == z->n_units - 1)) zero_gpu_release(zg, u, 0);
    else cudaCheck(cudaEventRecord(zg->slot_free[zero_item_slot(z, u, 0)], zg->compute));
}

#include "zero_gpu_chunks.cuh"
#include "zero_gpu_embedding.cuh"
#include "zero_gpu_vocab.cuh"

// ---------------------------------------------------------------------------------------------
// the step

// S > 1: every item's first reduce-scatter of the step overwrites its part of the shard (the parts tile the shard,
// its padding included): nothing to zero. S = 1: the model's first backward overwrites the shard where it can
// (dbrx_grads_overwrite); else it accumulates into it (after an update: zeroed by it).
static inline bool zero_grad_overwritten(ZeroGpu* zg) { return zg->z.S > 1 || dbrx_grads_overwrite(zg->model); }
static inline void zero_last_micro(ZeroGpu* zg, bool last) { zg->last_micro = last ? 1 : 0; }
static inline void zero_zero_grad(ZeroGpu* zg) {
    if (zg->z.S > 1) std::fill(zg->grad_fresh.begin(), zg->grad_fresh.end(), 1);
    else if (zero_grad_overwritten(zg)) zg->model->grad_first = 1;
    else if (!zg->grad_clean) cudaCheck(cudaMemsetAsync(zg->grad, 0, zg->z.shard_total * sizeof(float), zg->compute));
    zg->grad_clean = 0;
    zg->grad_pre = 1.0f;
}

// After the micro-batches: all-reduce the gradient shard across the replicas (on the replica group's
// stream, after the shard stream's reduce-scatters); the 1 / W is left to the norm and AdamW (grad_pre, as
// they read the gradient: the same products as a scaling pass, without its 8 bytes per element); the
// compute stream waits for it.
static inline void zero_reduce_grads(ZeroGpu* zg) {
    Zero* z = &zg->z;
    cudaStream_t last = zg->compute;
    if (z->S > 1) last = zero_gpu_rs_stream(zg);   // the gradient shard's last writer
    if (z->S > 1) zero_gpu_zero_unwritten(zg);      // (an item no backward reduce-scattered this step: zeroed)
    if (z->P != z->S) {   // data parallel with EP: non-expert units over the world, then experts over their replicas
        for (int ex = 0; ex < 2; ex++) {
            CommGroup* g = ex ? zero_expert_replica(z) : &z->replica;
            if (g->size == 1) continue;
            cudaCheck(cudaEventRecord(zg->comm_done, last));
            cudaCheck(cudaStreamWaitEvent(g->stream, zg->comm_done, 0));
            for (int u = 0; u < z->n_units; u++)
                if (z->unit_ep[u] == ex) comm_all_reduce(g, zg->grad + z->shard_off[u], z->shard_numel[u], COMM_F32);
            last = g->stream;
        }
    } else if (z->R > 1) {
        cudaCheck(cudaEventRecord(zg->comm_done, last));
        cudaCheck(cudaStreamWaitEvent(z->replica.stream, zg->comm_done, 0));
        bool some = std::find(zg->replica_done.begin(), zg->replica_done.end(), 1) != zg->replica_done.end();
        if (!some) {   // (S = 1, or no reduce-scatter in the last micro-batch: the shard at once)
            prof_begin(prof_stream(z->replica.stream, "communication (replica group)"), "comm", "all-reduce gradients");
            comm_all_reduce(&z->replica, zg->grad, z->shard_total, COMM_F32);
            prof_end(prof_stream(z->replica.stream, "communication (replica group)"));
        } else {   // the items the last backward summed already (zero_gpu_replica_reduce): the others' parts only
            for (int u = 0; u < z->n_units; u++)
                for (int j = 0; j < z->unit_nchunks[u]; j++)
                    if (!zg->replica_done[z->item_base[u] + j]) zero_gpu_replica_reduce(zg, u, j, false);
        }
        std::fill(zg->replica_done.begin(), zg->replica_done.end(), 0);
        last = z->replica.stream;
    }
    if (z->W > 1) zg->grad_pre = 1.0f / z->W;
    cudaCheck(cudaEventRecord(zg->comm_done, last));
    cudaCheck(cudaStreamWaitEvent(zg->compute, zg->comm_done, 0));
}

// global L2 norm of the gradient: the shard's sum of squares on the device, all-reduced in the shard
// group on the device (replicas hold the same gradient), read by the host once
static inline double zero_grad_norm(ZeroGpu* zg) {
    Zero* z = &zg->z;
    if (z->P != z->S) {   // data parallel with EP: every rank has the non-expert gradient; the EP group the experts'
        int U = z->n_units;
        for (int u = 0; u < U; u++) {
            grad_norm_partials_gpu(zg->norm_partial, zg->grad + z->shard_off[u], z->shard_numel[u], zg->grad_pre, zg->compute);
            LAUNCH(zero_sum_partials_kernel, 1, 32, 0, zg->compute, zg->norm_units + (z->unit_ep[u] ? U : 0) + u, zg->norm_partial,
                   GRAD_NORM_BLOCKS);
        }
        cudaCheck(cudaEventRecord(zg->comm_done, zg->compute));
        cudaCheck(cudaStreamWaitEvent(z->ep.stream, zg->comm_done, 0));
        comm_all_reduce(&z->ep, zg->norm_units + U, U, COMM_F64);
        comm_sync(&z->ep);
        if (z->R > 1) comm_sync(&z->replica);
        if (zero_expert_replica(z)->size > 1) comm_sync(zero_expert_replica(z));
        std::vector<double> h(2 * U);
        cudaCheck(cudaMemcpy(h.data(), zg->norm_units, 2 * U * sizeof(double), cudaMemcpyDeviceToHost));
        double sumsq = 0;
        for (double x : h) sumsq += x;
        return sqrt(sumsq);
    }
    grad_norm_partials_gpu(zg->norm_partial, zg->grad, z->shard_total, zg->grad_pre, zg->compute);
    LAUNCH(zero_sum_partials_kernel, 1, 32, 0, zg->compute, zg->norm_sumsq, zg->norm_partial, GRAD_NORM_BLOCKS);
    if (z->S > 1) {
        cudaStream_t comm = zero_comm_stream(zg);
        cudaCheck(cudaEventRecord(zg->comm_done, zg->compute));
        cudaCheck(cudaStreamWaitEvent(comm, zg->comm_done, 0));
        comm_all_reduce(&z->shard, zg->norm_sumsq, 1, COMM_F64);
        comm_sync(&z->shard);   // the watchdog's wait: a lost rank ends here, named, not in a blocking copy
    }
    if (z->R > 1) comm_sync(&z->replica);
    double sumsq = 0;
    cudaCheck(cudaMemcpy(&sumsq, zg->norm_sumsq, sizeof sumsq, cudaMemcpyDeviceToHost));
    return sqrt(sumsq);
}

// one AdamW step t (1-based) on this rank's shard, with global-norm clipping by `norm` (zero_grad_norm's,
// which the training loop's spike guard reads first); returns it. AdamW writes the BF16 copy with the
// master (the next step's gathers send it; with S = 1 the model reads it).
static inline double zero_update(ZeroGpu* zg, const AdamWConfig* o, float lr, int t, double norm) {
    float scale = (o->grad_clip > 0 && norm > o->grad_clip) ? (float)(o->grad_clip / norm) : 1.0f;
    zg->slot_unit[0] = zg->slot_unit[1] = zg->vocab_unit = zg->rc_unit = -1;   // the gathered copies are stale
    zg->fp8.ready = 0;                          // and so are the FP8 codes
    // one launch over the shard, or two with the next step's first items gathered between them (zero_gpu_comm.cuh);
    // the gradient zeroed only where the next step accumulates into it (zero_zero_grad)
    int clear_grad = !zero_grad_overwritten(zg);
    zero_gpu_adamw_prefetch(zg, [&](int s0, int s1, size_t max_n, size_t elems) {
        adamw_fused_update_gpu(zg->master, zg->master_bf16, zg->grad, zg->m, zg->v, zg->seg_off + s0, zg->seg_n + s0, zg->seg_mode + s0,
                               s1 - s0, max_n, lr, o->beta1, o->beta2, o->eps, o->weight_decay, zg->grad_pre, scale, t, zg->compute, elems,
                               clear_grad, zg->m16, zg->v16, g_optimizer_lion);
    });
    zg->grad_clean = clear_grad;
    cudaCheck(cudaEventRecord(zg->bf16_ready, zg->compute));
    fp8_gpu_step(&zg->model->fp8);              // FP8 delayed scaling: the amaxes join the histories
    return norm;
}

// a step the spike guard skips: no update; its FP8 amaxes are dropped
static inline void zero_skip_update(ZeroGpu* zg) {
    zg->fp8.ready = 0;
    fp8_gpu_discard_step(&zg->model->fp8);
}

// the gradient shard times f (DBRX_DEBUG_SPIKE: the tests' injected spike or NaN)
static inline void zero_scale_grads(ZeroGpu* zg, float f) {   // (1 / W first, as it was before)
    if (zg->grad_pre != 1.0f) LAUNCH(zero_scale_kernel, zero_grid(zg->z.shard_total), 256, 0, zg->compute, zg->grad, zg->grad_pre, zg->z.shard_total);
    zg->grad_pre = 1.0f;
    LAUNCH(zero_scale_kernel, zero_grid(zg->z.shard_total), 256, 0, zg->compute, zg->grad, f, zg->z.shard_total);
}

// FP8: the amax of every operand becomes the max over all ranks, on the device: the slots' amax array
// (float bits) max-reduced in the shard group, then across the replicas (together: the world), then
// brought to the host metas once (fp8_gpu_collect). amax_local, if given, gets this rank's own first
// (one more copy, only on the steps that log them).
static inline void zero_fp8_amax_reduce(ZeroGpu* zg, std::vector<Fp8MetaRef>& metas, std::vector<float>* amax_local) {
    Fp8GPU* f = &zg->model->fp8;
    Zero* z = &zg->z;
    if (zg->fp8.on && zg->fp8.ready)   // --fp8-gather: the weights' amax is the true one, agreed in the prepare
        LAUNCH(fp8g_tensor_amax_kernel, (int)zg->fp8.lay.mats.size(), 256, 0, zg->compute, f->amax, zg->fp8.mat_table, zg->fp8.amax);
    if (amax_local) {
        fp8_gpu_collect(f);
        amax_local->clear();
        for (Fp8MetaRef& r : metas) amax_local->push_back(r.meta->amax);
        f->collected = false;
    }
    cudaStream_t last = zg->compute;
    for (CommGroup* g : {&z->shard, &z->replica}) {
        if (g->size == 1) continue;
        cudaCheck(cudaEventRecord(zg->comm_done, last));
        cudaCheck(cudaStreamWaitEvent(g->stream, zg->comm_done, 0));
        comm_all_reduce_max_bits_dev(g, f->amax, f->nslots);
        comm_sync(g);   // the watchdog's wait (the host reads the result next)
        last = g->stream;
    }
    fp8_gpu_collect(f);
}

static inline uint64_t zero_bytes_sent(const ZeroGpu* zg) { return zero_bytes_sent(&zg->z) + zero_gpu_comm_bytes_sent(zg); }
static inline Zero* zero_layout(ZeroGpu* zg) { return &zg->z; }

static inline void zero_free(ZeroGpu* zg) {
    Zero* z = &zg->z;
    cudaCheck(cudaDeviceSynchronize());
    comm_watchdog_stop();
    for (void* p : zg->allocations) cudaCheck(cudaFree(p));
    zg->allocations.clear();
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaEventDestroy(zg->gathered[i])); cudaCheck(cudaEventDestroy(zg->slot_free[i]));
        if (i == 0) { cudaCheck(cudaEventDestroy(zg->rc_gathered)); cudaCheck(cudaEventDestroy(zg->rc_free)); }
        cudaCheck(cudaEventDestroy(zg->grads_ready[i])); cudaCheck(cudaEventDestroy(zg->grads_reduced[i]));
    }
    cudaCheck(cudaEventDestroy(zg->bf16_ready));
    cudaCheck(cudaEventDestroy(zg->vocab_gathered)); cudaCheck(cudaEventDestroy(zg->vocab_free));
    cudaCheck(cudaEventDestroy(zg->comm_done));
    if (zg->fp8.on) cudaCheck(cudaEventDestroy(zg->fp8.codes_ready));
    if (z->ep_n > 1) { cudaCheck(cudaEventDestroy(zg->ep_ready)); cudaCheck(cudaEventDestroy(zg->ep_done)); }
    if (zg->ep_dispatch) { ep_gpu_free(zg->ep_dispatch); delete zg->ep_dispatch; zg->ep_dispatch = NULL; }
    zg->model->hooks = UnitHooks{NULL, NULL, NULL};
    if (z->chunk_experts) zg->model->experts = ExpertHooksGPU{NULL, NULL, NULL};
    zg->model->vocab = VocabHooksGPU{NULL, NULL};
    free(z->master); free(z->m); free(z->v);
    z->master = z->m = z->v = NULL;
    zero_gpu_comm_free(zg);
    zero_gpu_emb_free(zg);
    if (z->ep_n > 1) { comm_group_free(&z->ep); comm_group_free(&z->expert_shard); }
    if (z->P != z->S) comm_group_free(&z->expert_replica_own);
    comm_group_free(&z->shard);
    comm_group_free(&z->replica);
}

DBRX_CHECK_STORE_CONTRACT(ZeroGpu, DbrxGPU);
