/*
 * memory_plan.h — the planner behind --dry-run: what one GPU of a CUDA run will hold, as a sum of named
 * terms (MemoryPlan), computed by one function (memory_plan) from the model, the micro-batch and the
 * topology, with no GPU and no walk of the layers. Pure host code: every build prints the same plan,
 * the CPU-only g++ build included.
 *
 * The terms are the allocations the CUDA run makes, in closed form:
 *   parameter state  the store's shard (parallel/zero_gpu.cuh, zero_gpu_bytes): fp32 master, gradients,
 *                    AdamW m and v (fp32, or bf16 under --adam-moments bf16), the BF16 working copy, the grad-norm scratch; from the store's own
 *                    layout (zero_unit_layout: padding and expert placement included)
 *   working set      ZeRO-3/HSDP (S > 1): two gathered BF16 slots and two FP32 gradient slots of one unit, or of
 *                    one chunk of a block's experts where it is larger (--zero-chunk-mib: zero_chunk_experts), and
 *                    with the vocabulary's gradients in chunks (zero_vocab_rows) one BF16 vocabulary slot of
 *                    V d + d + S (parallel/zero_gpu_vocab.cuh), the ring then sized by the other units;
 *                    under --recompute moe/block one more BF16 slot of a block unit (zero_rc_slot_numel; with the
 *                    experts in chunks too)
 *   activations      model/dbrx_cuda.cuh's dbrx_gpu_buffers, by class: saved per layer (x L), the head,
 *                    the backward scratch the blocks share, and the FP8 scratch and state (--fp8)
 *   routing          the per-layer routing indices, and under expert parallelism the exchange's buffers
 *                    (parallel/expert_parallel_cuda.cuh), planned at start-up for --ep-capacity-factor's rows
 *                    (ep_plan_rows; the model's experts' g, u, act and da, dg, du are sized for them too)
 *   context parallel --context-parallel N (memory_plan_cp; the terms above at T / N tokens): the GPU ring's two K|V
 *                    slots, its dK|dV slots, the chunk pairs' scratch, the group's expert counts
 * Their sum is `allocations`, what the run cudaMallocs (and what the emulator's allocator peaks at:
 * test/test_memory_plan.cpp checks the classes against the walk itself, and the sum against the peak).
 * On a real GPU the run needs more than it allocates; these margins are predicted, not measured here:
 *   cuBLASLt workspaces 2 x 32 MiB: the process's and the experts' side stream's (--moe-streams 2, the default;
 *                       model/matmul_cublaslt.cuh, model/moe.cuh; the emulator's twin has none)
 *   CUDA context        600 MiB: PyTorch measured 667 MB eager and 287 MB lazy (pytorch/pytorch#86509);
 *                       lazy loading is the default from CUDA 12.2 (CUDA Programming Guide, "Lazy
 *                       Loading"), and NCCL's and cuBLASLt's kernels load into it too
 *   NCCL                per communicator of more than one rank the project creates (parallel/zero.h:
 *                       shard, replica, and under EP expert_parallel, expert_shard, expert_replica; with
 *                       S > 1 the reduce-scatters' shard_rs and expert_shard_rs, parallel/zero_gpu_comm.cuh):
 *                       512 MiB = NCCL_BUFFSIZE (4 MiB default) x 32 channels (H100 NVLink) x 2 ring
 *                       neighbours x 2 graphs (ring, tree); NCCL's memory is linear in the channels
 *                       (NVIDIA/nccl#986). The EP group's all-to-all connects every peer: + 448 MiB per
 *                       peer, from the 8 x H100 measurement of NVIDIA/nccl#1685 (3.28 GB more after
 *                       the first all-to-all, 7 peers). Set NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS lower
 *                       and the margin shrinks in proportion (the plan assumes the defaults).
 * The capacity: --plan-device h100 (81559 MiB, nvidia-smi's total of the H100 SXM 80GB), h200 (143771 MiB,
 * the H200 141GB) or a number of GiB; by default the free memory of the GPU when the build has CUDA and
 * one is visible, else h100. The verdict: FITS when total <= capacity.
 */
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include "zero.h"
#include "expert_parallel.h"
#include "context_parallel.h"
#include "../model/fp8.cuh"
#include "../model/recompute.h"
#include "../model/act_compress.cuh"
#include "zero_fp8_layout.h"

static const long double PLAN_MIB = 1048576.0L, PLAN_GIB = 1073741824.0L;
static const long double PLAN_CUBLASLT_BYTES = 2 * 32 * PLAN_MIB;    // model/matmul_cublaslt.cuh's workspaces (two streams)
static const long double PLAN_CUDA_CONTEXT_BYTES = 600 * PLAN_MIB;
static const long double PLAN_NCCL_COMM_BYTES = 4 * PLAN_MIB * 32 * 2 * 2;   // BUFFSIZE x channels x neighbours x graphs
static const long double PLAN_NCCL_PEER_BYTES = 448 * PLAN_MIB;      // all-to-all, per peer
static const int PLAN_GPUS_PER_NODE = 8;                              // an HGX H100/H200 node (the step-time model's too)
// --zero-embedding rows' communicator (parallel/zero_gpu_embedding.cuh), point-to-point only and capped at
// ZERO_EMB_NCCL_CTAS channels: NCCL's memory is linear in the channels (NVIDIA/nccl#986), so the per-communicator and
// the per-peer figures above at ZERO_EMB_NCCL_CTAS / 32 for the peers inside a node, and for those across nodes one pool
// per communicator, whatever their number (NCCL_NET_SHARED_BUFFERS, on by default: channels x 16 steps x the 512 KiB
// NCCL_P2P_NET_CHUNKSIZE); NCCL's defaults as documented, not measured
static inline long double plan_nccl_emb_bytes(int S) {
    long double share = ZERO_EMB_NCCL_CTAS / 32.0L;
    int near = std::min(S, PLAN_GPUS_PER_NODE) - 1;
    return PLAN_NCCL_COMM_BYTES * share + near * PLAN_NCCL_PEER_BYTES * share
         + (S > PLAN_GPUS_PER_NODE ? ZERO_EMB_NCCL_CTAS * 16 * 0.5L * PLAN_MIB : 0);
}
static const long double PLAN_H100_BYTES = 81559 * PLAN_MIB, PLAN_H200_BYTES = 143771 * PLAN_MIB;
// the CUDA half's constants the closed forms use (model/adamw.cuh, model/layernorm.cuh; the test checks the sum)
static const int PLAN_GRAD_NORM_BLOCKS = 256, PLAN_LN_ROWS_PER_CHUNK = 32;

typedef struct {
    // the run planned
    int B, T, S, n, gpus;            // micro-batch, shard group, EP degree, GPUs in all
    Fp8Recipe fp8;
    long double shard_params;        // parameters in this GPU's shard (padding included)
    // parameter state: this GPU's shard
    long double master, grads, adam_m, adam_v, bf16_copy, norm_scratch;
    // the ZeRO working set (S > 1)
    long double gathered_slots, grad_slots, slot_params, rs_scratch;   // (grad_slots includes rs_scratch)
    int chunk_experts;               // experts per gathered chunk of a block's experts (0: the unit whole)
    int vocab_rows;                  // vocabulary rows per gradient chunk of the embedding and the head (0: the units whole)
    long double vocab_slot;          // their BF16 vocabulary slot (in gathered_slots; 0 without vocab_rows)
    long double rc_slot;             // the recompute slot (in gathered_slots; zero_gpu_comm.cuh's zero_gpu_rc_prefetch; 0: none)
    long double emb_exchange;        // --zero-embedding rows: the batch's rows, their gradients, the plan's table (not in the
                                     // slots: zero_gpu_embedding.cuh, zero_emb_exchange_bytes; 0: off)
    // activations: per layer (x L) by class, then the rest
    long double layer_attention, layer_norms, layer_router, layer_experts, layer_routing;
    long double saved;               // L x (attention + norms + router + experts), less what --recompute drops
    // --recompute (model/recompute.h, the run's g_recompute): the per-layer bytes each RC_* bit drops (index:
    // attn, swiglu, moe, block), what the layers drop in all, and the one shared scratch set they point into
    long double rc_bit_bytes[4], recompute_dropped, recompute_scratch;
    std::string recompute;           // the spec ("": none)
    long double compressed_kept;     // --compress-acts: the compressed g, u (swiglu) and ln1 (attn) of the layers it names (their g, u,
                                     // act and ln1 are dropped above)
    long double compressed_swiglu, compressed_attn;   // ... by class: the codes and factors of one layer
    std::string compress;            // its spec ("": none)
    long double head, scratch, fp8_scratch;
    long double fp8_gather;          // --fp8-gather (S > 1): the store's codes, side pieces and scales (zero_fp8_layout.h)
    // routing buffers: L x the routing indices, and the EP exchange's
    long double routing_index, ep_exchange;
    long double ep_rows;             // EP: the rows received per layer the buffers are planned for (0 without EP)
    // context parallelism (memory_plan_cp; the plan's B x T are then this rank's T / cp tokens per sequence): the GPU ring's
    // two BF16 K|V slots, its FP32 dK|dV slots, the chunk pairs' scratch, the group's expert counts; their sum
    int cp;
    long double cp_kv, cp_dkv, cp_scratch, cp_counts, cp_bytes;
    long double allocations;         // the sum of everything above: what the run allocates
    // margins on a real GPU
    long double cublaslt, cuda_context, nccl;
    int communicators, a2a_peers;
    long double nccl_emb;            // of nccl: --zero-embedding rows' communicator (plan_nccl_emb_bytes; 0: off)
    std::string comm_names;          // e.g. "shard 64, expert_parallel 8, expert_shard 8"
    long double total;
} MemoryPlan;

static inline long double plan_param_state(const MemoryPlan* p) {
    return p->master + p->grads + p->adam_m + p->adam_v + p->bf16_copy + p->norm_scratch;
}

// the store's layout for S and n, extrapolated in the layers from 1, 2, 3 (each block the same units)
// (run: the longest run's full length, zero_max_run_numel, the same for any layers: each block the same runs)
// (vocab: the vocabulary slot's elements, zero_vocab_slot_numel, the same for any layers)
static inline void plan_store_layout(const DbrxConfig* c, int S, int n, int Ec, int Vc, long double* shard, long double* work, long double* run,
                                     long double* vocab, long double* block) {
    auto one = [&](int L, long double* sh, long double* wk) {
        DbrxConfig x = *c;
        x.n_layers = L;
        Zero z;
        zero_unit_layout(&z, &x, dbrx_param_table(&x), S, n, Ec, Vc);
        *sh = (long double)z.shard_total;
        *wk = S > 1 ? (long double)z.work_numel : 0;
        *run = S > 1 ? (long double)zero_max_run_numel(&z) : 0;
        *vocab = S > 1 ? (long double)zero_vocab_slot_numel(&z) : 0;
        *block = S > 1 ? (long double)z.slot_numel[1] : 0;   // (a block unit's slot: the recompute slot's, zero_rc_slot_numel)
    };
    if (c->n_layers <= 3) { one(c->n_layers, shard, work); return; }
    long double s[3], w[3];
    for (int l = 1; l <= 3; l++) one(l, &s[l - 1], &w[l - 1]);
    ENSURE(s[2] - s[1] == s[1] - s[0] && w[2] - w[1] == w[1] - w[0], "the store's layout is not affine in the layers");
    *shard = s[0] + (c->n_layers - 1) * (s[1] - s[0]);
    *work = w[0] + (c->n_layers - 1) * (w[1] - w[0]);
}

// model/dbrx_fp8_cuda.cuh's fp8_scale_bound
static inline long double plan_fp8_scale_bound(long double rows, long double cols, long double nseg, bool weight, bool transposed) {
    long double nct = std::ceil(cols / 128), tiles = std::floor(rows / 128) + nseg;
    if (!weight) return transposed ? tiles * cols : nct * rows;
    return transposed ? nct * (std::floor(rows / 128) + 4 * nseg) : tiles * (std::ceil(nct / 4) * 4);
}

// fp8_gpu_buffers' bytes: the quantised scratch of activations, gradients and weights, the scaling state,
// every layer's padded routing, and with weight_cache (no shard group: S = 1) every block weight's quantised copy;
// gathered (--fp8-gather): no weight scratch (the GEMMs read the gathered codes)
static inline long double plan_fp8_bytes(const DbrxConfig* c, long double N, bool block, bool weight_cache, int n = 1, bool hold = false,
                                         bool gathered = false) {
    long double d = c->d_model, F = c->ffn_hidden, E = c->n_experts, qd = qkv_dim(c), L = c->n_layers, El = E / n;
    long double Rp = N * c->top_k + 15 * E;
    struct Shape { long double rows, cols, nseg; };
    auto buf = [&](std::initializer_list<Shape> shapes, bool weight) {
        long double elems = 0, sq = 0, st = 0;
        for (const Shape& s : shapes) {
            elems = std::max(elems, s.rows * s.cols);
            sq = std::max(sq, plan_fp8_scale_bound(s.rows, s.cols, s.nseg, weight, false));
            st = std::max(st, plan_fp8_scale_bound(s.rows, s.cols, s.nseg, weight, true));
        }
        return 2 * elems + (block ? 4 * (sq + st) : 0);
    };
    // (EP, n > 1: the weights of a rank's El experts; act and grad the attention's only, the experts' in the dispatcher's
    // scratch, ep_exchange below; hold: a third expert weight, held for a layer's exchange chunks, ep_fp8_hold)
    long double b = n > 1 ? buf({{N, d, 1}}, false) + buf({{N, qd, 1}, {N, d, 1}}, false)
                          : buf({{N, d, 1}, {Rp, d, E}, {Rp, F, E}}, false) + buf({{N, qd, 1}, {N, d, 1}, {Rp, d, E}, {Rp, F, E}}, false);
    if (!gathered)
        b += buf({{qd, d, 1}, {d, d, 1}, {El * F, d, El}}, true) + buf({{El * F, d, El}}, true) + (hold ? buf({{El * F, d, El}}, true) : 0);
    long double slots = 14 * L;   // fp8_operand_table: 5 linears x (x, w, dy) per layer, v1's x shared with w1's
    b += slots * (4 + 16 + 4 + 8) + 12;               // scale, scale_inv (16 B apart), amax, sat; tmp_amax (3)
    b += L * ((2 * E + 1) * 4 + (n > 1 ? 0 : Rp * 4));   // per layer: segments, padded row_token (not under EP)
    if (weight_cache)                                 // per layer: Wqkv, out_proj, w1, v1, w2 (fp8_weight_shape)
        b += L * (buf({{qd, d, 1}}, true) + buf({{d, d, 1}}, true) + 3 * buf({{El * F, d, El}}, true));
    return b;
}

// --fp8-gather's buffers in the device store (fp8g_device_bytes of its layout), from one layer's layout: every unit is
// sharded alone, so the code pieces, side pieces, scale groups and matrices grow with the layers, the byte slot, the
// side pieces received and the slots' factors are one unit's
static inline long double plan_fp8_gather_bytes(const DbrxConfig* c, int S, int n, bool block, int chunk_experts, int vocab_rows) {
    DbrxConfig one = *c;
    one.n_layers = 1;
    std::vector<ParamInfo> table = dbrx_param_table(&one);
    Zero z;
    zero_unit_layout(&z, &one, table, S, n, chunk_experts, vocab_rows);
    z.lrank = z.ep_rank = 0;   // (every rank's buffers are as long: rank 0's)
    Fp8GatherLayout f;
    fp8g_device_layout(&f, &z, table, &one, block);
    return fp8g_device_bytes(&f, S, 2, c->n_layers);
}

// The plan for micro-batches of B x T on `gpus` GPUs, shard groups of S, EP degree n (validated by the caller);
// fp8_gather: --fp8-gather (on with FP8 and S > 1: the store's code buffers, and no weight scratch in the model)
static inline MemoryPlan memory_plan(const DbrxConfig* c, int B, int T, int S, int n, int gpus, Fp8Recipe fp8,
                                     double ep_capacity = EP_CAPACITY_DEFAULT, double chunk_mib = 0, bool rs_bf16 = false,
                                     int ep_chunks = 1, bool fp8_gather = false) {
    MemoryPlan p;
    p.B = B; p.T = T; p.S = S; p.n = n; p.gpus = gpus; p.fp8 = fp8;
    const long double f4 = 4, bf = 2, i4 = 4;
    long double N = (long double)B * T, d = c->d_model, k = c->top_k, E = c->n_experts, F = c->ffn_hidden;
    long double qd = qkv_dim(c), V = c->vocab_size, L = c->n_layers, H = c->n_heads, hd = c->head_dim;
    bool on8 = fp8 != FP8_OFF;
    long double R = N * k + (on8 ? 15 * E : 0);   // the routed rows (FP8: room for every expert padded to 16)
    // EP: the rows every buffer of the experts' side is planned for (ep_gpu_planned_rows), and the model's g, u, act
    // and da, dg, du with them (DbrxGPU::expert_rows); without EP those hold the routed rows
    long double Rc = n > 1 ? (long double)ep_plan_rows(c, (size_t)N, n, ep_capacity) + (on8 ? 15 * (E / n) : 0) : 0;
    long double Rx = n > 1 ? Rc : R;
    p.ep_rows = Rc;
    p.cp = 1;
    p.cp_kv = p.cp_dkv = p.cp_scratch = p.cp_counts = p.cp_bytes = 0;

    // parameter state and working set: zero_gpu_bytes
    long double shard, work;
    p.chunk_experts = zero_chunk_experts(c, S, n, fp8 != FP8_OFF, chunk_mib);   // --zero-chunk-mib (parallel/zero_gpu_chunks.cuh)
    p.vocab_rows = zero_vocab_rows(c, S, n, fp8 != FP8_OFF, chunk_mib);     // (parallel/zero_gpu_vocab.cuh)
    long double run, vocab, block;
    plan_store_layout(c, S, n, p.chunk_experts, p.vocab_rows, &shard, &work, &run, &vocab, &block);
    p.shard_params = shard;
    p.master = p.grads = f4 * shard;
    p.adam_m = p.adam_v = (g_adam_moments_bf16 ? bf : f4) * shard;   // (--adam-moments)
    if (g_optimizer_lion) p.adam_v = 0;                               // (--optimizer lion: m alone)
    p.bf16_copy = bf * shard;
    p.norm_scratch = PLAN_GRAD_NORM_BLOCKS * f4 + 8;
    p.slot_params = work;
    p.vocab_slot = bf * vocab;
    // the recompute slot: a block unit's BF16 slot, gathered ahead in the backward for --recompute moe/block (RC_MOE)
    p.rc_slot = S > 1 && c->n_layers >= 2 && (recompute_union(&g_recompute, c->n_layers) & RC_MOE) ? bf * block : 0;
    p.gathered_slots = 2 * bf * work + p.vocab_slot + p.rc_slot;
    p.rs_scratch = rs_bf16 ? bf * run : 0;   // --grad-reduce-dtype bf16: one run's gradient in BF16 (zero_gpu_comm.cuh)
    p.grad_slots = 2 * f4 * work + p.rs_scratch;
    {   // the embedding's row exchange (the same for any layer count: unit 0's runs)
        DbrxConfig one = *c;
        one.n_layers = 1;
        Zero z;
        zero_unit_layout(&z, &one, dbrx_param_table(&one), S, n, p.chunk_experts, p.vocab_rows);
        p.emb_exchange = (long double)zero_emb_exchange_bytes(&z, (size_t)N, (size_t)d);
    }

    // activations saved per layer (dbrx_gpu_buffers' per-block buffers), by class
    p.layer_attention = bf * N * d + 2 * f4 * N + 2 * bf * N * qd + f4 * B * H * T + bf * N * d;   // ln1, stats, qkv_pre, qkv, lse, atty
    p.layer_norms = bf * N * d + bf * N * d + 2 * f4 * N + bf * N * d;   // resid_mid, ln2 and its stats, the block's input (resid)
    p.layer_router = 2 * f4 * N * E + f4 * N + f4 * N * k + f4 * (E + 1);   // logits, probs, lse, top-k weights, statistics
    // xe, g and u, act (not under FP8: gpu_act_kept), ye; under EP the layers share one xe (the dispatcher keeps the
    // rows the weight gradients read)
    const long double gua = gpu_act_kept(c->ffn_hidden, on8) ? 3 : 2;
    p.layer_experts = (n > 1 ? 0 : bf * R * d) + gua * bf * Rx * F + bf * R * d;
    p.layer_routing = i4 * N * k + i4 * E + i4 * (E + 1) + 2 * i4 * R;    // topk_idx, counts, offsets, row_token, slot_row
    p.saved = L * (p.layer_attention + p.layer_norms + p.layer_router + p.layer_experts) + (n > 1 ? bf * R * d : 0);
    // --recompute: a dropped buffer is not kept per layer; the layers that drop it share one (dbrx_gpu_buffers)
    p.rc_bit_bytes[0] = bf * N * d;                                                       // attn: atty
    p.rc_bit_bytes[1] = gua * bf * Rx * F;                                                // swiglu: g and u, act (EP: the planned rows)
    p.rc_bit_bytes[2] = bf * N * d + 2 * f4 * N + f4 * N * E + (n > 1 ? 1 : 2) * bf * R * d;   // moe: ln2, stats, logits, xe (not EP), ye
    p.rc_bit_bytes[3] = bf * N * d + 2 * f4 * N + 2 * bf * N * qd + f4 * B * H * T + bf * N * d;   // block: ln1, stats, qkv x2, lse, resid_mid
    p.recompute = g_recompute.text;
    p.compress = g_compress.text;
    p.recompute_dropped = p.recompute_scratch = p.compressed_kept = 0;
    int rc_union = recompute_union(&g_recompute, c->n_layers);
    p.compressed_swiglu = (long double)compress_code_bytes(COMPRESS_E4M3, (size_t)Rx, (size_t)F) +
                          (long double)compress_factor_bytes(COMPRESS_E4M3, (size_t)Rx, (size_t)F);
    p.compressed_attn = (long double)compress_tensor_code_bytes(COMPRESS_E4M3, (size_t)N, (size_t)d) +
                        (long double)compress_tensor_factor_bytes(COMPRESS_E4M3, (size_t)N, (size_t)d);
    // the buffers of the dropped field bits (ln1, RC_LN1, is in block's bytes: counted alone where only RC_CATTN drops it)
    auto dropped = [&](int mode) {
        int bits = recompute_dropped_bits(mode);
        long double b = 0;
        for (int i = 0; i < 4; i++) if (bits & (1 << i)) b += p.rc_bit_bytes[i];
        return b + ((bits & RC_LN1) && !(bits & RC_BLOCK) ? bf * N * d : 0);
    };
    for (int l = 0; l < (rc_union ? c->n_layers : 0); l++) {
        int mode = recompute_mode(&g_recompute, l);
        p.recompute_dropped += dropped(mode);
        p.compressed_kept += ((mode & RC_CSWIGLU) ? p.compressed_swiglu : 0) + ((mode & RC_CATTN) ? p.compressed_attn : 0);
    }
    p.recompute_scratch = dropped(rc_union);
    p.saved += p.recompute_scratch - p.recompute_dropped + p.compressed_kept;
    // the head and the step's inputs: step_out's loss, the final residual, lnf and its stats, logits, losses,
    // RoPE tables, the token ids, the embedding plan and the documents' bounds (--doc-mask)
    p.head = 2 * f4 + bf * N * d + bf * N * d + 2 * f4 * N + bf * N * V + f4 * N + 2 * f4 * std::floor(T * hd / 2) + i4 * (7 * N + 1);
    // the backward's scratch, shared by the blocks: attproj, dresid, dln, dresid_bf16, datty, dqkv, drouter,
    // dtopk_w, dxe, att_D, the LayerNorm partials, the grad-norm partials, dye, da, dg and du. att_D: D (B, H, T)
    long double att_D = B * H * T;
    p.scratch = bf * N * d + 2 * f4 * N * d + 2 * bf * N * d + bf * N * qd + bf * N * E + f4 * N * k + bf * R * d + f4 * att_D
              + f4 * std::ceil(N / PLAN_LN_ROWS_PER_CHUNK) * d + f4 * (PLAN_GRAD_NORM_BLOCKS + 2) + bf * R * d + 3 * bf * Rx * F;
    bool gathered = on8 && fp8_gather && S > 1;
    p.fp8_scratch = on8 ? plan_fp8_bytes(c, N, fp8 == FP8_BLOCK, S == 1, n, ep_fp8_hold(n, ep_chunks, fp8, S == 1), gathered) : 0;
    p.fp8_gather = gathered ? plan_fp8_gather_bytes(c, S, n, fp8 == FP8_BLOCK, p.chunk_experts, p.vocab_rows) : 0;

    // routing: the indices of every layer; EP's exchange (ep_gpu_buffers) for Rc planned rows: kept per layer xl
    // (Rc, d) and perm, inv (Rc); shared x, y, dx, dxr (Rc, d); under FP8 four code buffers (Rc, max(d, F)) and
    // with block scaling their factors (fp8_expert_scratch_sizes over the local experts' segments)
    p.routing_index = L * p.layer_routing;
    p.ep_exchange = 0;
    if (n > 1) {
        long double El = E / n, rows = std::max(Rc, 1.0L);
        p.ep_exchange = L * (bf * Rc * d + 2 * i4 * Rc) + 4 * bf * Rc * d;
        if (on8) {
            long double sq = std::max(plan_fp8_scale_bound(rows, d, El, false, false), plan_fp8_scale_bound(rows, F, El, false, false));
            long double st = std::max(plan_fp8_scale_bound(rows, d, El, false, true), plan_fp8_scale_bound(rows, F, El, false, true));
            p.ep_exchange += 4 * rows * std::max(d, F) + (fp8 == FP8_BLOCK ? 4 * (2 * sq + 2 * st) : 0);
        }
        // --ep-overlap-chunks C > 1 (ep_gpu_chunk_bytes): per layer the chunks' indices (2 Rc + 2 N k; --fp8 block: every
        // chunk's segment table, 2 E/n + 1), and dxr grown to N k rows where fewer are planned
        long double C = ep_gpu_chunks(ep_chunks, fp8), Nk = N * k;
        if (C > 1)
            p.ep_exchange += L * i4 * (2 * Rc + 2 * Nk + (fp8 == FP8_BLOCK ? C * (2 * El + 1) : 0)) + (Nk > Rc ? bf * (Nk - Rc) * d : 0);
    }
    p.allocations = plan_param_state(&p) + p.gathered_slots + p.grad_slots + p.emb_exchange + p.fp8_gather + p.saved + p.head + p.scratch
                  + p.fp8_scratch + p.routing_index + p.ep_exchange;

    // margins: the communicators parallel/zero.h creates with NCCL (those of one rank connect no peer)
    int P = S > n ? S : n;
    struct { const char* name; int size; } comms[] = {
        {"shard", S}, {"replica", gpus / S}, {"expert_parallel", n > 1 ? n : 1}, {"expert_shard", n > 1 ? P / n : 1},
        {"expert_replica", n > 1 && P != S ? gpus / P : 1},
        // the reduce-scatters' own communicators (S > 1: parallel/zero_gpu_comm.cuh, why a second one)
        {"shard_rs", S}, {"expert_shard_rs", n > 1 && S > 1 ? P / n : 1}};
    p.communicators = 0;
    p.comm_names.clear();
    for (auto& cm : comms) {
        if (cm.size <= 1) continue;
        p.communicators++;
        p.comm_names += (p.comm_names.empty() ? "" : ", ") + std::string(cm.name) + " " + std::to_string(cm.size);
    }
    p.a2a_peers = n > 1 ? n - 1 : 0;
    p.nccl = p.communicators * PLAN_NCCL_COMM_BYTES + p.a2a_peers * PLAN_NCCL_PEER_BYTES;
    p.nccl_emb = p.emb_exchange > 0 ? plan_nccl_emb_bytes(S) : 0;   // (--zero-embedding rows: "embedding", every peer)
    p.nccl += p.nccl_emb;
    p.cublaslt = PLAN_CUBLASLT_BYTES;
    p.cuda_context = PLAN_CUDA_CONTEXT_BYTES;
    p.total = p.allocations + p.cublaslt + p.cuda_context + p.nccl;
    return p;
}

// --context-parallel n on the GPU (parallel/context_parallel_cuda.cuh's cpg_init) added to the plan p, which memory_plan made
// for this rank's tokens (T / n per sequence: every per-token buffer is already there): the ring's two BF16 K|V slots and
// its 3 or 4 FP32 dK|dV slots (cp_ring_dkv_slots), whatever n; the chunk pairs' scratch (model/attention_cp_cuda.cuh's
// cp_attn_scratch_bytes: a pair's BF16 output, the FP32 merged output and dQ, the pair's lse and D, a semaphore per 32
// queries and a ticket); with the load-balancing loss the group's expert counts (L E ints). One more NCCL communicator
// ("context"). The all-gather form (DBRX_DEBUG_PLANT=cp_all_gather, the tests' reference) is not planned. n must divide
// the plan's GPUs (exit 2, one line).
static inline void memory_plan_cp(MemoryPlan* p, const DbrxConfig* c, int n) {
    if (n <= 1) return;
    if (p->gpus % n)
        fail(EXIT_BAD_INPUT, "--context-parallel %d must divide the GPUs planned, %d (--plan-gpus, or a run's ranks: CP groups are %d "
             "consecutive ranks)", n, p->gpus, n);
    const long double f4 = 4, bf = 2;
    long double B = p->B, Tl = p->T, kvn = B * Tl * 2 * c->kv_heads * c->head_dim, rows = B * Tl * c->n_heads;
    p->cp = n;
    p->cp_kv = 2 * bf * kvn;
    p->cp_dkv = cp_ring_dkv_slots(n) * f4 * kvn;
    p->cp_scratch = rows * c->head_dim * (bf + 2 * f4) + rows * 2 * f4 + 4 * (B * c->n_heads * std::ceil(Tl / 32) + 1);
    p->cp_counts = c->moe_loss_weight != 0 ? 4.0L * c->n_layers * c->n_experts : 0;
    p->cp_bytes = p->cp_kv + p->cp_dkv + p->cp_scratch + p->cp_counts;
    p->allocations += p->cp_bytes;
    p->communicators++;
    p->comm_names += (p->comm_names.empty() ? "" : ", ") + std::string("context ") + std::to_string(n);
    p->nccl += PLAN_NCCL_COMM_BYTES;
    p->total = p->allocations + p->cublaslt + p->cuda_context + p->nccl;
}

// --plan-device: h100 | h200 | a number of GiB (> 0); false on anything else
static inline bool plan_device_parse(const std::string& s, long double* bytes, std::string* name) {
    if (s == "h100") { *bytes = PLAN_H100_BYTES; *name = "H100 80GB (81559 MiB)"; return true; }
    if (s == "h200") { *bytes = PLAN_H200_BYTES; *name = "H200 141GB (143771 MiB)"; return true; }
    char* end = NULL;
    errno = 0;
    double g = strtod(s.c_str(), &end);
    if (s.empty() || *end || errno || !std::isfinite(g) || !(g > 0) || g > 1e9) return false;
    *bytes = (long double)g * PLAN_GIB;
    *name = s + " GiB";
    return true;
}

static inline const char* plan_fp8_name(Fp8Recipe r) {
    return r == FP8_OFF ? "off" : r == FP8_DELAYED ? "delayed" : r == FP8_CURRENT ? "current" : "block";
}

// The plan as --dry-run prints it: every term, the total against `capacity`, the verdict
static inline void memory_plan_print(const MemoryPlan* p, const DbrxConfig* c, long double capacity, const char* capacity_how) {
    auto G = [](long double b) { return (double)(b / PLAN_GIB); };
    auto M = [](long double b) { return (double)(b / PLAN_MIB); };
    printf("GPU plan per GPU (a CUDA run: %d GPU(s), shard group %d, expert parallel %d, micro-batch %d x %d, FP8 %s; "
           "parallel/memory_plan.h):\n", p->gpus, p->S, p->n, p->B, p->T, plan_fp8_name(p->fp8));
    printf("  parameter state, this GPU's shard of %.0Lf params (padding included)  %9.2f GiB\n", p->shard_params, G(plan_param_state(p)));
    char moments[64];   // (--optimizer: AdamW's m and v, or LionW's m alone)
    if (g_optimizer_lion) snprintf(moments, sizeof moments, "LionW m %.2f", G(p->adam_m));
    else snprintf(moments, sizeof moments, "AdamW m %.2f, AdamW v %.2f", G(p->adam_m), G(p->adam_v));
    printf("    fp32 master %.2f, fp32 gradients %.2f, %s, bf16 copy %.2f GiB; grad-norm scratch %.0Lf B\n", G(p->master), G(p->grads),
           moments, G(p->bf16_copy), p->norm_scratch);
    std::string ch = p->chunk_experts ? "experts in chunks of " + std::to_string(p->chunk_experts) : "experts whole";
    printf("  ZeRO working set (S > 1: two slots of %.0Lf params; %s)%*s%9.2f GiB\n", p->slot_params, ch.c_str(),
           std::max(0, 22 - (int)ch.size()), "", G(p->gathered_slots + p->grad_slots + p->emb_exchange + p->fp8_gather));
    printf("    gathered bf16 slots %.2f GiB, fp32 gradient slots %.2f GiB", G(p->gathered_slots), G(p->grad_slots - p->rs_scratch));
    if (p->vocab_slot > 0)
        printf("; of the bf16, the vocabulary slot %.2f GiB (the embedding or the head whole: %.0Lf params; their gradients in chunks "
               "of %d rows through the two slots)", G(p->vocab_slot), p->vocab_slot / 2, p->vocab_rows);
    if (p->rc_slot > 0) printf("; the recompute slot %.2f GiB (a block gathered ahead for its recompute)", G(p->rc_slot));
    if (p->rs_scratch > 0) printf(", bf16 reduce-scatter scratch %.2f GiB (--grad-reduce-dtype bf16)", G(p->rs_scratch));
    if (p->emb_exchange > 0) printf("; the embedding's row exchange %.1f MiB (--zero-embedding rows)", M(p->emb_exchange));
    if (p->fp8_gather > 0) printf("; --fp8-gather's codes and scales %.2f GiB (the block weights' scratch not needed)", G(p->fp8_gather));
    printf("\n");
    printf("  activations (%d layers; FP8 scratch included)                           %9.2f GiB\n", c->n_layers,
           G(p->saved + p->head + p->scratch + p->fp8_scratch));
    printf("    saved per layer: attention %.1f, norms+residual %.1f, router %.1f, experts' rows %.1f MiB; x %d = %.2f GiB\n",
           M(p->layer_attention), M(p->layer_norms), M(p->layer_router), M(p->layer_experts), c->n_layers, G(p->saved));
    if (!p->recompute.empty())
        printf("    --recompute %s: %.2f GiB not kept (per layer: attn %.1f, swiglu %.1f, moe %.1f, block %.1f MiB), one shared set "
               "%.2f GiB; included above\n", p->recompute.c_str(), G(p->recompute_dropped), M(p->rc_bit_bytes[0]), M(p->rc_bit_bytes[1]),
               M(p->rc_bit_bytes[2]), M(p->rc_bit_bytes[3]), G(p->recompute_scratch));
    if (!p->compress.empty())
        printf("    --compress-acts %s: kept in E4M3 with 1x128 factors, %.2f GiB (per layer: swiglu's g, u %.1f MiB, attn's ln1 %.1f "
               "MiB; the tensors they replace counted as not kept above)\n", p->compress.c_str(), G(p->compressed_kept),
               M(p->compressed_swiglu), M(p->compressed_attn));
    printf("    head (final norm, logits, losses, RoPE, token ids) %.2f GiB, backward scratch %.2f GiB, FP8 scratch and state %.2f GiB\n",
           G(p->head), G(p->scratch), G(p->fp8_scratch));
    printf("  routing buffers                                                        %9.2f GiB\n", G(p->routing_index + p->ep_exchange));
    printf("    routing indices %.1f MiB per layer, x %d = %.2f GiB; expert-parallel exchange %.2f GiB (planned for %.0Lf rows "
           "received per layer: --ep-capacity-factor)\n", M(p->layer_routing), c->n_layers, G(p->routing_index), G(p->ep_exchange), p->ep_rows);
    if (p->cp > 1)
        printf("%-73s%9.2f GiB\n    K|V slots (2, BF16) %.1f MiB, dK|dV slots (%d, FP32) %.1f MiB, chunk-pair scratch %.1f MiB, "
               "the group's expert counts %.0Lf B\n", ("  context parallel " + std::to_string(p->cp) + " (the GPU ring's buffers)").c_str(), G(p->cp_bytes),
               M(p->cp_kv), cp_ring_dkv_slots(p->cp), M(p->cp_dkv), M(p->cp_scratch), p->cp_counts);
    printf("  allocations (what the run allocates; the emulator's peak)              %9.2f GiB\n", G(p->allocations));
    printf("  margins on a GPU (predicted): cuBLASLt workspace %.0f MiB, CUDA context %.0f MiB, NCCL %.2f GiB\n", M(p->cublaslt),
           M(p->cuda_context), G(p->nccl));
    printf("    NCCL: %d communicator(s) of more than one rank%s%s%s x 512 MiB (4 MiB NCCL_BUFFSIZE x 32 channels x 2 neighbours x 2 graphs)"
           " + %d all-to-all peer(s) x 448 MiB", p->communicators, p->communicators ? " (" : "", p->comm_names.c_str(),
           p->communicators ? ")" : "", p->a2a_peers);
    if (p->nccl_emb > 0)
        printf(" + the embedding's row exchange %.0f MiB (its communicator of %d ranks at %d channels: %d peer(s) in the node at "
               "%.0f MiB, those across nodes one shared pool)", M(p->nccl_emb), p->S, ZERO_EMB_NCCL_CTAS, std::min(p->S, PLAN_GPUS_PER_NODE) - 1,
               M(PLAN_NCCL_PEER_BYTES * ZERO_EMB_NCCL_CTAS / 32));
    printf("\n");
    printf("  total %.2f GiB of %.2f GiB (%s)\n", G(p->total), G(capacity), capacity_how);
    printf("plan bytes: allocations %.0Lf, total %.0Lf, capacity %.0Lf\n", p->allocations, p->total, capacity);
    if (p->total <= capacity)
        printf("verdict: FITS, %.2f GiB of headroom per GPU\n", G(capacity - p->total));
    else
        printf("verdict: DOES NOT FIT, %.2f GiB over per GPU (lower --batch or --seq, shard over more GPUs, more --expert-parallel; "
               "--recompute)\n", G(p->total - capacity));
}
