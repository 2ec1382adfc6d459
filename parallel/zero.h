/*
 * zero.h — ZeRO-3 and HSDP: the fp32 master weights, gradients and AdamW moments exist only as each
 * rank's shard.
 *
 * The unit of sharding is the model's sharding unit (model/dbrx.h: the embedding; each block without its
 * experts; each block's experts; norm_f + lm_head), each one contiguous range of the flat parameter
 * buffer, made of runs that are split evenly over the S ranks of a shard group: run k of n_k elements is
 * padded to S * c_k, c_k = ceil(n_k / S), and shard rank s owns [s*c_k, (s+1)*c_k) of it; its shard of
 * the unit is its pieces of the runs, one after the other.
 *   a unit without experts   one run, the whole unit (no divisibility requirement; the padding is zero
 *                            and is never updated)
 *   a block's experts        one run per tensor (w1, v1, w2: (E*F, d), the experts stacked), when S divides
 *                            E*F: each rank holds the same rows of the three, whole experts when S divides
 *                            E (rank s: experts [s*E/S, (s+1)*E/S)), so that expert parallelism can place
 *                            the same units. Else (S does not divide E*F) one run, as the other units.
 * A gather is one all-gather per run into the unit's place in a working slot (the unit's flat layout,
 * which the model's views read), a reduce-scatter one per run out of the full gradient of the unit.
 * The world of W ranks is cut into W / S shard groups of S consecutive ranks (HSDP; S = W is ZeRO-3,
 * S = 1 plain data parallelism). Ranks with the same place in their shard group form a replica group.
 *   forward, per unit:   all-gather the unit's parameters (shard group) into a working slot, run, release
 *   backward, per unit:  all-gather again (but the last unit, kept from its forward, and the embedding,
 *                        whose backward reads no parameter), run into a zeroed full-size gradient buffer,
 *                        reduce-scatter it (shard group) and add the result into the gradient shard
 *   end of the step:     all-reduce the gradient shard across the replica group, scale by 1 / W,
 *                        global-norm clipping (sum of squares all-reduced in the shard group), AdamW on
 *                        the shard.
 * Two working slots (unit u uses slot u % 2): while unit u runs, the next unit's gather goes to the other
 * slot (prefetch; on the CPU it completes at once, on the GPU it runs on the communication stream). The GPU
 * store may split a block's experts into chunks of whole experts, each its own runs and an item of the slot
 * ring (zero_unit_runs with Ec > 0, Zero.item_base; parallel/zero_gpu_chunks.cuh); the CPU store does not.
 * With S = 1 nothing is gathered: the model's buffers are the full shard, the hooks are not installed,
 * and the step is the unsharded one plus an all-reduce of the gradients across the replicas.
 * Expert parallelism (EP degree n) places the experts' runs by EP rank over the layout group of
 * P = max(S, n) ranks: the shard group when n divides S; under data parallelism (S = 1) the EP group,
 * each rank then holding the non-expert units and its experts whole, the model's views straight onto
 * its shard (parallel/README.md, "EP under data parallelism").
 */
#pragma once
#include <algorithm>
#include <vector>
#include "../model/dbrx.h"
#include "comm.h"
#include "shard_runs.h"
#include "zero_fp8.h"
#include "expert_parallel.h"

// a piece of one parameter tensor inside this rank's shard: where it lies in the shard and in the
// flat buffer, and whether it gets weight decay
typedef struct { size_t shard_off, flat_off, numel; int decay; } ShardSegment;


typedef struct {
    int S, R, W;                       // shard group size, replicas (= W / S), world size
    CommGroup shard, replica;          // this rank's shard group and replica group
    CommGroup* world;
    int n_units;
    std::vector<size_t> unit_off, unit_numel;   // each unit's range of the flat buffer
    std::vector<std::vector<ShardRun>> runs;    // each unit's runs
    // expert parallelism (--expert-parallel n, parallel/README.md): the layout group is P = max(S, n)
    // consecutive ranks (the shard group when n divides S; the EP group under data parallelism, S = 1 < n),
    // lrank a rank's place in it, EP rank = lrank % n (--ep-layout packed: the EP group n consecutive ranks)
    // or lrank / (P/n) (spread: the EP group strided by P/n; ep_rank_of); the EP group exchanges routed
    // rows; the experts' runs are sharded over the expert shard group (the layout group's ranks with the
    // same EP rank, P/n of them: strided when packed, consecutive when spread); ranks with the same lrank
    // hold the same shard: the expert replica group, across which the experts' gradients are summed (the replica group when P = S; it is its own group
    // under data parallelism, where the non-expert gradients are summed over the world)
    int ep_n, ep_rank, P, lrank;
    int ep_spread;                              // --ep-layout spread (1) or packed (0)
    CommGroup ep, expert_shard, expert_replica_own;   // (the last: P != S only; zero_expert_replica)
    EpDispatch* ep_dispatch;                    // the CPU model's experts dispatcher over `ep` (n > 1; NULL: none)
    std::vector<char> unit_ep;                  // per unit: 1 = a block's experts, placed by EP
    std::vector<size_t> shard_numel;            // sum of its runs' chunks: each unit's shard length
    std::vector<size_t> slot_numel;             // each unit's gathered length in a working slot (padding included)
    std::vector<size_t> shard_off;              // where each unit's shard lies in this rank's shard buffers
    size_t shard_total;                         // elements in this rank's shard buffers
    size_t work_numel;                          // S * max shard_numel: one working slot
    std::vector<ShardSegment> segs;             // the tensors' pieces in this rank's shard, in order
    // chunked experts units (the GPU store's --zero-chunk-mib; parallel/README.md, "A bounded working set"):
    // a block's experts gathered and reduce-scattered chunk by chunk, chunk j = experts [j Ec, (j+1) Ec), each
    // its own runs (w1, v1, w2 rows of those experts), slot_off relative to the chunk's slot. Every other unit
    // is one chunk. Items: the units' chunks in forward order, item_base[u] the first of unit u; item i uses
    // working slot i % 2
    int chunk_experts;                          // Ec (0: no unit is chunked)
    std::vector<int> unit_nchunks, item_base;
    std::vector<std::vector<int>> run_chunk;    // per unit, per run: its chunk
    // the GPU store's vocabulary units (the embedding, norm_f + lm_head) with vocab_rows > 0: gradients in chunks of
    // vocab_rows rows (one run each, norm_f in the head's chunk 0), parameters gathered whole (zero_gpu_vocab.cuh)
    int vocab_rows;                             // (0: the two units whole)
    real *master, *grad, *m, *v;                // shard_total each (S = 1: the model's full buffers)
    real *work[2];                              // gathered parameters of two units (S > 1)
    real *gwork;                                // the full gradient of the unit in backward (S > 1)
    int slot_unit[2];                           // unit held by each slot, -1: none
    Dbrx* model;
    size_t state_bytes;                         // master + grad + m + v, allocated
    long long state_rss;                        // the same, measured: resident-memory growth while allocating them
    size_t work_bytes;
    ZeroFp8 fp8;                                // --fp8-gather: the blocks' FP8 matrices gathered as E4M3 codes
    // the model's FP8 scaling state, which checkpoints save with the shards (checkpoint/fp8_state.h):
    // either backend's, attached by the training loop once FP8 is set up (NULL, empty: FP8 off)
    const Fp8Config* fp8_cfg;
    std::vector<Fp8MetaRef> fp8_metas;
} Zero;

// resident set size of this process in bytes (/proc/self/status VmRSS)
static inline long long zero_rss_bytes() {
    FILE* f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f)) if (!strncmp(line, "VmRSS:", 6)) kb = atoll(line + 6);
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

// A run as the layout is given it: a flat range, and the EP rank it belongs to (-1: all ranks)
typedef struct { size_t flat_off, numel; int owner; int chunk = 0; } RunSpec;   // chunk: of a chunked experts unit (else 0)

// The layout from the runs, unit by unit, for S ranks and EP degree n: unit_off, unit_numel, runs,
// shard_numel, shard_off, shard_total, work_numel (one rank's view: every rank holds as many elements of
// a unit). No groups, no storage. A checkpoint's layout is rebuilt from its manifest with it.
static inline void zero_layout_from_runs(Zero* z, const std::vector<std::vector<RunSpec>>& specs, int S, int n = 1, int spread = 0) {
    z->S = S;
    z->ep_n = n;
    z->ep_spread = spread;
    z->P = S > n ? S : n;   // (n divides S, or S = 1)
    z->n_units = (int)specs.size();
    z->unit_off.assign(z->n_units, 0); z->unit_numel.assign(z->n_units, 0);
    z->runs.assign(z->n_units, {});
    z->unit_ep.assign(z->n_units, 0);
    z->shard_numel.assign(z->n_units, 0); z->shard_off.assign(z->n_units, 0); z->slot_numel.assign(z->n_units, 0);
    z->unit_nchunks.assign(z->n_units, 1); z->item_base.assign(z->n_units, 0); z->run_chunk.assign(z->n_units, {});
    z->shard_total = 0;
    size_t max_slot = 0;
    int items = 0;
    for (int u = 0; u < z->n_units; u++) {
        z->shard_off[u] = z->shard_total;
        z->unit_off[u] = specs[u].empty() ? 0 : specs[u][0].flat_off;
        for (const RunSpec& r : specs[u]) z->unit_off[u] = std::min(z->unit_off[u], r.flat_off);
        for (const RunSpec& r : specs[u]) z->unit_nchunks[u] = std::max(z->unit_nchunks[u], r.chunk + 1);
        bool chunked = z->unit_nchunks[u] > 1;
        z->item_base[u] = items;
        items += z->unit_nchunks[u];
        std::vector<size_t> held(n + 1, 0), slot(n + 1, 0);   // per owner (index n: -1): shard and slot so far
        int last_chunk = 0;
        for (const RunSpec& r : specs[u]) {
            int parts = r.owner < 0 ? S : z->P / n, o = r.owner < 0 ? n : r.owner;
            if (r.chunk != last_chunk) { std::fill(slot.begin(), slot.end(), 0); last_chunk = r.chunk; }   // a chunk's own slot
            ShardRun run;
            run.flat_off = r.flat_off; run.numel = r.numel; run.chunk = (r.numel + parts - 1) / parts;
            run.owner = r.owner; run.ep_n = n; run.parts = parts; run.spread = spread;
            run.shard_rel = held[o];
            run.slot_off = r.owner < 0 && !chunked ? r.flat_off - z->unit_off[u] : slot[o];
            held[o] += run.chunk;
            slot[o] += run.chunk * parts;
            z->runs[u].push_back(run);
            z->run_chunk[u].push_back(r.chunk);
            z->unit_numel[u] += r.numel;
            if (r.owner >= 0) z->unit_ep[u] = 1;
        }
        // every holder's shard of the unit is as long (EP: each owner has runs of the same sizes)
        z->shard_numel[u] = z->unit_ep[u] ? held[0] : held[n];
        size_t slot_len = 0;
        for (const ShardRun& r : z->runs[u])
            if (r.owner <= 0) slot_len = std::max(slot_len, r.slot_off + r.chunk * r.parts);
        z->shard_total += z->shard_numel[u];
        z->slot_numel[u] = slot_len;
        max_slot = std::max(max_slot, slot_len);
    }
    z->work_numel = max_slot;
    z->chunk_experts = z->vocab_rows = 0;   // (zero_unit_layout sets them; a checkpoint's file layout has neither)
}

// The model's runs for S ranks and EP degree n (the top comment): every unit one run but a block's
// experts: without EP one run per tensor when S divides their rows (E*F), else one run; with EP one run
// per tensor and EP rank (its E/n experts' rows), split over the S/n ranks with that EP rank. Ec > 0 (the
// GPU store's chunked experts, zero_chunk_experts): one run per chunk of Ec experts and tensor, chunk-major
// (w1, v1, w2 of experts [0, Ec), then of [Ec, 2 Ec), ...), each split over the S ranks; with EP the same over
// each EP rank's E/n experts (chunk j: its experts [j Ec, (j+1) Ec)), one run per chunk, tensor and EP rank.
static inline void zero_vocab_runs(std::vector<std::vector<RunSpec>>* runs, const DbrxConfig* c, int Vc);
static inline std::vector<std::vector<RunSpec>> zero_unit_runs(const DbrxConfig* c, const std::vector<ParamInfo>& t, int S, int n = 1,
                                                               int Ec = 0, int Vc = 0) {
    std::vector<std::vector<RunSpec>> runs(dbrx_num_units(c));
    bool split = ((size_t)c->n_experts * c->ffn_hidden) % S == 0;
    std::vector<std::vector<const ParamInfo*>> chunked(runs.size());
    for (const ParamInfo& p : t) {
        std::vector<RunSpec>& r = runs[p.unit];
        bool experts = dbrx_is_experts_unit(p.unit, c);
        if (experts && Ec > 0) chunked[p.unit].push_back(&p);
        else if (experts && n > 1) {   // (runs in tensor order, then EP rank: each owner's w1, v1, w2 are its slot's three)
            size_t local = p.numel / n;
            for (int o = 0; o < n; o++) r.push_back(RunSpec{p.offset + o * local, local, o});
        }
        else if (split && experts) r.push_back(RunSpec{p.offset, p.numel, -1});
        else if (r.empty()) r.push_back(RunSpec{p.offset, p.numel, -1});
        else r[0].numel += p.numel;
    }
    for (size_t u = 0; u < runs.size(); u++) {
        if (chunked[u].empty()) continue;
        size_t per = (size_t)Ec * c->ffn_hidden * c->d_model;   // one chunk's rows of one tensor
        if (n > 1) {   // EP: chunk j of every owner's E/n experts; per chunk, tensor, then EP rank (each owner's three)
            size_t local = per / Ec * (c->n_experts / n);
            for (int j = 0; j < c->n_experts / n / Ec; j++)
                for (const ParamInfo* p : chunked[u])
                    for (int o = 0; o < n; o++) runs[u].push_back(RunSpec{p->offset + o * local + j * per, per, o, j});
            continue;
        }
        for (int j = 0; j < c->n_experts / Ec; j++)
            for (const ParamInfo* p : chunked[u]) runs[u].push_back(RunSpec{p->offset + j * per, per, -1, j});
    }
    if (Vc > 0) zero_vocab_runs(&runs, c, Vc);
    return runs;
}

// Vc > 0 (the GPU store's chunked vocabulary gradients, zero_vocab_rows): the embedding and norm_f + lm_head as
// one run per chunk of Vc vocabulary rows, in flat order (chunk j: rows [j Vc, (j+1) Vc); norm_f, which precedes
// lm_head, in the head's chunk 0), each split over the S ranks
static inline void zero_vocab_runs(std::vector<std::vector<RunSpec>>* runs, const DbrxConfig* c, int Vc) {
    int head = dbrx_head_unit(c);
    size_t d = c->d_model, V = c->vocab_size;
    for (int u : {0, head}) {
        size_t off = (*runs)[u][0].flat_off, extra = (*runs)[u][0].numel - V * d;   // (the head: norm_f's d first)
        ENSURE((*runs)[u].size() == 1 && extra == (u ? d : 0), "vocabulary unit %d is not one run of V d (+ d)", u);
        (*runs)[u].clear();
        for (size_t v0 = 0, j = 0; v0 < V; v0 += Vc, j++) {
            size_t rows = std::min((size_t)Vc, V - v0), n = rows * d + (j ? 0 : extra);
            (*runs)[u].push_back(RunSpec{off, n, -1, (int)j});
            off += n;
        }
    }
}

// Experts per chunk of a block's experts unit for the GPU store (--zero-chunk-mib; 0: the unit whole): the
// most whole experts whose BF16 w1, v1, w2 fit chunk_mib MiB (at least one; a divisor of E, so the chunks
// are alike). With EP of degree n the same over a rank's E/n experts (a divisor of E/n: the dispatcher runs
// them chunk by chunk, parallel/expert_parallel_cuda.cuh). Only where the store gathers (S > 1) and without
// FP8 (the FP8 experts quantise a weight over all experts at once); E/n itself means one chunk, i.e. none.
static inline int zero_chunk_experts(const DbrxConfig* c, int S, int n, bool fp8, double chunk_mib) {
    if (S <= 1 || fp8 || !(chunk_mib > 0)) return 0;
    int El = c->n_experts / (n > 1 ? n : 1);
    double expert_bytes = 2.0 * 3 * c->ffn_hidden * c->d_model;
    int best = 1;
    for (int e = 1; e <= El; e++)
        if (El % e == 0 && e * expert_bytes <= chunk_mib * 1048576.0) best = e;
    return best == El ? 0 : best;
}

// The units and their shards for S ranks, with no groups and no storage (the GPU store's memory
// estimate uses it before the groups exist).
static inline void zero_unit_layout(Zero* z, const DbrxConfig* c, const std::vector<ParamInfo>& t, int S, int n = 1, int Ec = 0,
                                    int Vc = 0, int spread = 0) {
    zero_layout_from_runs(z, zero_unit_runs(c, t, S, n, Ec, Vc), S, n, spread);
    z->chunk_experts = Ec;
    z->vocab_rows = Vc;
}

// Vocabulary rows per gradient chunk of the embedding and norm_f + lm_head for the GPU store (--zero-chunk-mib;
// 0: the two units whole, as the CPU store has them): the most rows, a multiple of 8, whose BF16 fit chunk_mib MiB
// and whose chunk (padded, norm_f included) fits the largest other item of the slot ring, so that the ring is
// never sized by the vocabulary (parallel/README.md, "A bounded working set"); 0 where that is the whole vocabulary
static inline int zero_vocab_rows(const DbrxConfig* c, int S, int n, bool fp8, double chunk_mib) {
    if (S <= 1 || !(chunk_mib > 0)) return 0;
    DbrxConfig one = *c;   // (every block the same units: one layer says it, whatever --n-layers)
    one.n_layers = 1;
    Zero z;
    zero_unit_layout(&z, &one, dbrx_param_table(&one), S, n, zero_chunk_experts(c, S, n, fp8, chunk_mib));
    size_t ring = 0, d = c->d_model;
    for (int u = 1; u + 1 < z.n_units; u++) ring = std::max(ring, z.slot_numel[u]);
    double budget = chunk_mib * 1048576.0 / (2.0 * d);
    size_t fit = ring > d + S ? (ring - d - S + 1) / d : 0;
    size_t rows = std::min(fit, budget < 1e12 ? (size_t)budget : fit) / 8 * 8;
    if (rows < 8) rows = 8;
    return rows >= (size_t)c->vocab_size ? 0 : (int)rows;
}
// is unit u a vocabulary unit with chunked gradients (its parameters in the vocabulary slot)
static inline bool zero_vocab_unit(const Zero* z, int u) { return z->vocab_rows > 0 && (u == 0 || u == z->n_units - 1); }
// the vocabulary slot: either unit gathered whole, with room for its last run's padding (S - 1 elements)
static inline size_t zero_vocab_slot_numel(const Zero* z) {
    return z->vocab_rows > 0 ? std::max(z->unit_numel[0], z->unit_numel[z->n_units - 1]) + z->S : 0;
}


// layout rank r's EP rank and its piece of its EP rank's experts runs (--ep-layout: shard_runs.h's one mapping)
static inline int ep_rank_of(const Zero* z, int r) { return ep_layout_rank(r, z->ep_n, z->P / z->ep_n, z->ep_spread); }
static inline int expert_piece_of(const Zero* z, int r) { return ep_layout_piece(r, z->ep_n, z->P / z->ep_n, z->ep_spread); }

// the ranks that hold the same shard as this one (the expert replica group): the replica group, but under
// data parallelism with EP (P != S) the W/n ranks with the same EP rank
static inline CommGroup* zero_expert_replica(Zero* z) { return z->P == z->S ? &z->replica : &z->expert_replica_own; }

// The layout of a checkpoint's files: the store's own, but under data parallelism with EP (P = n > S = 1)
// that of ZeRO-3 over the EP group (S = P = n): each of the n writers saves its experts and 1/n of every
// other unit, so that every parameter is saved once, and the files are those of an EP-n ZeRO-3 run
// (any layout loads into any other).
static inline void zero_file_layout(const Zero* z, Zero* f) {
    std::vector<std::vector<RunSpec>> specs(z->n_units);
    for (int u = 0; u < z->n_units; u++)
        for (size_t i = 0; i < z->runs[u].size(); i++) {
            const ShardRun& r = z->runs[u][i];
            specs[u].push_back(RunSpec{r.flat_off, r.numel, r.owner, z->run_chunk[u][i]});
        }
    zero_layout_from_runs(f, specs, z->P, z->ep_n, z->ep_spread);
}

// Copies every element that layout rank rf of `from` holds (in src, its shard buffer) and layout rank rt
// of `to` holds too into its place in dst (rt's shard buffer): the overlaps of two sorted piece lists.
static inline void zero_copy_pieces(const Zero* from, int rf, const real* src, const Zero* to, int rt, real* dst) {
    typedef struct { size_t lo, hi, at; } Pc;
    auto list = [](const Zero* L, int r) {
        std::vector<Pc> p;
        for (int u = 0; u < L->n_units; u++)
            shard_run_pieces(L->runs[u], r, [&](size_t lo, size_t hi, size_t at) { if (lo < hi) p.push_back(Pc{lo, hi, L->shard_off[u] + at}); });
        std::sort(p.begin(), p.end(), [](const Pc& a, const Pc& b) { return a.lo < b.lo; });
        return p;
    };
    std::vector<Pc> a = list(from, rf), b = list(to, rt);
    for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
        size_t lo = std::max(a[i].lo, b[j].lo), hi = std::min(a[i].hi, b[j].hi);
        if (lo < hi) memcpy(dst + b[j].at + (lo - b[j].lo), src + a[i].at + (lo - a[i].lo), (hi - lo) * sizeof(real));
        if (a[i].hi <= b[j].hi) i++; else j++;
    }
}

// the group a unit's gathers and reduce-scatters run in (EP experts: the expert shard group), and whether
// this rank holds a piece of a run
static inline CommGroup* zero_unit_group(Zero* z, int u) { return z->unit_ep[u] ? &z->expert_shard : &z->shard; }
static inline bool zero_run_mine(const Zero* z, const ShardRun& r) { return shard_run_held(r, z->lrank); }
// the longest run's full length (its pieces x piece), over every unit: the GPU store's scratch for
// --grad-reduce-dtype bf16 (parallel/zero_gpu_comm.cuh: one run's gradient in BF16 at a time)
static inline size_t zero_max_run_numel(const Zero* z) {
    size_t m = 0;
    for (const std::vector<ShardRun>& runs : z->runs)
        for (const ShardRun& r : runs) m = std::max(m, r.chunk * (size_t)r.parts);
    return m;
}

// the pieces of unit u that layout rank r holds (shard_run_pieces)
template <typename Fn> static inline void zero_unit_pieces(const Zero* z, int u, int r, Fn fn) { shard_run_pieces(z->runs[u], r, fn); }

static inline void zero_unit_begin(void* ctx, int unit, int phase);
static inline void zero_unit_end(void* ctx, int unit, int phase);

// The groups and the layout; no storage. S = 0 means the whole world (ZeRO-3). Every rank calls this
// with the same S. use_nccl: the groups get NCCL communicators (the GPU path, parallel/zero_gpu.cuh).
static inline void zero_init_layout(Zero* z, const DbrxConfig* c, const std::vector<ParamInfo>& t, Comm* comm, int S,
                                    int use_nccl, int ep_n = 1, int Ec = 0, int Vc = 0, int spread = 0) {
    int W = comm->world;
    if (S == 0) S = W;
    if (S < 0 || S > W || W % S != 0) {
        comm_agreed_failure();   // every rank exits over the same verdict: none of them is a lost rank
        if (comm->rank == 0)
            fail(EXIT_BAD_INPUT, "--shard-group-size %d must divide the number of ranks %d (S = %d: ZeRO-3, S = 1: data "
                 "parallel, else HSDP with %d / S replicas)", S, W, W, W);
        usleep(2000000);   // rank 0 says why first: the launcher ends the job at the first non-zero exit
        exit(EXIT_BAD_INPUT);
    }
    // expert parallelism: EP groups of n consecutive ranks inside a shard group, each holding E/n experts,
    // sharded over the shard group's S/n ranks with the same EP rank (parallel/README.md)
    const char* ep_err = NULL;
    char ep_buf[256];
    if (ep_n < 1) ep_err = "must be >= 1";
    else if (c->n_experts % ep_n) { snprintf(ep_buf, sizeof ep_buf, "must divide the %d experts", c->n_experts); ep_err = ep_buf; }
    else if (S == 1 && W % ep_n) {
        snprintf(ep_buf, sizeof ep_buf, "must divide the number of ranks %d (data parallel: EP groups of consecutive ranks)", W);
        ep_err = ep_buf;
    } else if (S > 1 && S % ep_n) {
        snprintf(ep_buf, sizeof ep_buf, "must divide the shard group size %d (an EP group lies in a shard group; or "
                 "--shard-group-size 1: data parallel with EP)", S);
        ep_err = ep_buf;
    } else if (ep_n > 1 && S > 1 && ((size_t)(c->n_experts / ep_n) * c->ffn_hidden) % (S / ep_n)) {
        snprintf(ep_buf, sizeof ep_buf, "leaves %d experts x %d rows per EP rank, not divisible over the %d ranks that shard them",
                 c->n_experts / ep_n, c->ffn_hidden, S / ep_n);
        ep_err = ep_buf;
    } else if (spread && (ep_n == 1 || S <= ep_n)) {   // Q = P/n = 1: one rank per EP rank, the two layouts are one
        snprintf(ep_buf, sizeof ep_buf, "with --ep-layout spread: spread needs N > 1 and a shard group larger than N "
                 "(--shard-group-size %d: the EP groups strided by S/N ranks; S <= N: use packed)", S);
        ep_err = ep_buf;
    }
    if (ep_err) {
        comm_agreed_failure();
        if (comm->rank == 0) fail(EXIT_BAD_INPUT, "--expert-parallel %d %s", ep_n, ep_err);
        usleep(2000000);   // (as above)
        exit(EXIT_BAD_INPUT);
    }
    z->S = S; z->W = W; z->R = W / S;
    z->world = &comm->world_group;
    z->model = NULL;
    z->master = z->grad = z->m = z->v = NULL;
    z->work[0] = z->work[1] = z->gwork = NULL;
    z->state_bytes = z->work_bytes = 0;
    z->state_rss = 0;
    // shard groups: S consecutive ranks; replica groups: the same place in every shard group
    z->shard = comm_split(z->world, comm->rank / S, comm->rank, "shard", use_nccl);
    z->replica = comm_split(z->world, comm->rank % S, comm->rank, "replica", use_nccl);
    z->ep_n = ep_n;
    z->P = S > ep_n ? S : ep_n;
    z->lrank = comm->rank % z->P;   // (S = P: the shard rank)
    z->ep_spread = spread;
    z->ep_rank = ep_rank_of(z, z->lrank);
    z->ep_dispatch = NULL;
    if (ep_n > 1) {   // EP group: the layout group's ranks with the same piece (ordered by world rank: by EP rank)
        int Q = z->P / ep_n;
        z->ep = comm_split(z->world, (comm->rank / z->P) * Q + expert_piece_of(z, z->lrank), comm->rank, "expert_parallel", use_nccl);
        z->expert_shard = comm_split(z->world, (comm->rank / z->P) * ep_n + z->ep_rank, comm->rank, "expert_shard", use_nccl);
        if (z->ep.rank != z->ep_rank || z->expert_shard.rank != expert_piece_of(z, z->lrank))   // the dispatcher's and gathers' premise
            fail(EXIT_RUNTIME, "expert parallelism: rank %d: EP comm rank %d / expert shard rank %d, layout says %d / %d", comm->rank,
                 z->ep.rank, z->expert_shard.rank, z->ep_rank, expert_piece_of(z, z->lrank));
    }
    if (z->P != S)   // data parallel with EP: the ranks holding the same experts
        z->expert_replica_own = comm_split(z->world, z->lrank, comm->rank, "expert_replica", use_nccl);
    zero_unit_layout(z, c, t, S, ep_n, Ec, Vc, spread);
    z->segs.clear();
    for (const ParamInfo& p : t)   // intersect each tensor with this rank's pieces of its unit
        zero_unit_pieces(z, p.unit, z->lrank, [&](size_t lo, size_t hi, size_t at) {
            size_t a = p.offset > lo ? p.offset : lo, b = p.offset + p.numel < hi ? p.offset + p.numel : hi;
            if (a < b) z->segs.push_back(ShardSegment{z->shard_off[p.unit] + at + (a - lo), a, b - a, p.decay});
        });
    z->slot_unit[0] = z->slot_unit[1] = -1;
    z->fp8.on = 0;
    z->fp8_cfg = NULL;
    z->fp8_metas.clear();
}

// The CPU path: the groups, the layout, and this rank's shard of the state in host memory, initialised
// as the unsharded model would be (seed); installs the hooks on `model` when S > 1.
static inline void zero_ep_all_to_allv(void* ctx, const void* send, const size_t* sb, void* recv, const size_t* rb, int host) {
    comm_all_to_allv(&((Zero*)ctx)->ep, send, sb, recv, rb, host);
}

static inline void zero_init(Zero* z, Dbrx* model, Comm* comm, int S, uint64_t seed, int ep_n = 1, int ep_spread = 0) {
    const DbrxConfig* c = &model->cfg;
    const std::vector<ParamInfo>& t = model->table;
    zero_init_layout(z, c, t, comm, S, 0, ep_n, 0, 0, ep_spread);
    if (ep_n > 1) {   // the model's experts run through the dispatcher, the rows over the EP group
        z->ep_dispatch = new EpDispatch();
        ep_install(z->ep_dispatch, model, ep_n, z->ep_rank, zero_ep_all_to_allv, z);
    }
    S = z->S;
    z->model = model;

    // the sharded state: allocated and touched here, so that the growth of the resident set measures it
    long long rss0 = zero_rss_bytes();
    size_t bytes = z->shard_total * sizeof(real);
    z->master = (real*)mallocCheck(bytes); z->grad = (real*)mallocCheck(bytes);
    z->m = (real*)mallocCheck(bytes); z->v = optimizer_moments() == 2 ? (real*)mallocCheck(bytes) : NULL;   // (LionW: no v)
    memset(z->master, 0, bytes); memset(z->grad, 0, bytes); memset(z->m, 0, bytes); if (z->v) memset(z->v, 0, bytes);
    for (const ShardSegment& g : z->segs)   // this rank's part of the initialisation, drawn alone
        dbrx_init_range(z->master + g.shard_off, g.flat_off, g.flat_off + g.numel, c, t, seed);
    z->state_rss = zero_rss_bytes() - rss0;
    z->state_bytes = (2 + optimizer_moments()) * bytes;

    model->g.blocks.resize(c->n_layers);
    model->p.blocks.resize(c->n_layers);
    if (z->P == 1) {   // the shard is the whole model: the unsharded code path, no hooks
        model->params = z->master; model->grads = z->grad; model->m = z->m; model->v = z->v;
        model->p = param_views(model->params, c, t);
        model->g = param_views(model->grads, c, t);
        z->work[0] = z->work[1] = z->gwork = NULL;
        z->work_bytes = 0;
    } else if (S == 1) {   // data parallel with EP: every unit's shard is its slot (all whole), no hooks
        model->params = model->grads = model->m = model->v = NULL;   // no flat buffer: the store updates its shard
        for (int u = 0; u < z->n_units; u++) {
            unit_views(&model->p, z->master + z->shard_off[u], u, c, t, ep_n);
            unit_views(&model->g, z->grad + z->shard_off[u], u, c, t, ep_n);
        }
        z->work[0] = z->work[1] = z->gwork = NULL;
        z->work_bytes = 0;
    } else {
        for (int i = 0; i < 2; i++) z->work[i] = (real*)mallocCheck(z->work_numel * sizeof(real));
        z->gwork = (real*)mallocCheck(z->work_numel * sizeof(real));
        z->work_bytes = 3 * z->work_numel * sizeof(real);
        model->hooks = UnitHooks{zero_unit_begin, zero_unit_end, z};
    }
}

static inline void zero_free(Zero* z) {
    if (z->model) {
        if (z->S == 1) z->model->params = z->model->grads = z->model->m = z->model->v = NULL;   // ours, freed here (or none)
        z->model->hooks = UnitHooks{NULL, NULL, NULL};
    }
    if (z->ep_dispatch) { ep_uninstall(z->ep_dispatch); delete z->ep_dispatch; z->ep_dispatch = NULL; }
    free(z->master); free(z->grad); free(z->m); free(z->v);
    free(z->work[0]); free(z->work[1]); free(z->gwork);
    comm_group_free(&z->shard);
    comm_group_free(&z->replica);
    if (z->ep_n > 1) { comm_group_free(&z->ep); comm_group_free(&z->expert_shard); }
    if (z->P != z->S) comm_group_free(&z->expert_replica_own);
}

// the layout ranks of the group unit u is gathered in, in the group's rank order (ZeroFp8.members): the
// shard group's, or for a block's experts under EP the expert shard group's (the layout ranks with this
// rank's EP rank o: o, o + n, ... packed, o Q .. o Q + Q - 1 spread, whose pieces make o's experts, in
// the order comm_split gives them: by world rank)
static inline std::vector<int> zero_unit_members(const Zero* z, int u) {
    std::vector<int> r;
    if (z->unit_ep[u]) { for (int k = 0; k < z->P; k++) if (ep_rank_of(z, k) == z->ep_rank) r.push_back(k); }
    else for (int k = 0; k < z->S; k++) r.push_back(k);
    return r;
}

// --fp8-gather, after dbrx_enable_fp8: the blocks' FP8 matrices are gathered as E4M3 codes with their
// scales (parallel/zero_fp8.h) and the model takes them as they are. Under expert parallelism a block's
// experts are gathered in the expert shard group, into the compact slot of this rank's experts, with the
// scales of the whole tensors (agreed in the shard group): the values the run without EP gathers.
// Returns 0 when there is nothing to gather (S = 1: every rank holds its units whole, its experts too
// under data parallelism with EP), 1 when on.
static inline int zero_enable_fp8_gather(Zero* z) {
    if (z->S == 1 || z->model->fp8.recipe == FP8_OFF) return 0;
    std::vector<std::vector<int>> members(z->n_units);
    for (int u = 0; u < z->n_units; u++) members[u] = zero_unit_members(z, u);
    zero_fp8_init(&z->fp8, z->model, z->S, z->lrank, z->unit_off, z->runs, members);
    z->model->fp8.weights_quantized = 1;
    z->work_bytes += z->fp8.send.size() + z->fp8.recv.size();
    return 1;
}

// FP8: the amax of every operand becomes the max over all ranks (every rank holds a piece of the data
// or of the weights). metas: the model's (dbrx_fp8_metas); amax_local, if given, gets this rank's own
// amaxes first (the log's amax_rank0). On the CPU the amaxes are host floats: one all-gather over the world.
static inline void zero_fp8_amax_reduce(Zero* z, std::vector<Fp8MetaRef>& metas, std::vector<float>* amax_local) {
    std::vector<float> amax;
    for (Fp8MetaRef& r : metas) amax.push_back(r.meta->amax);
    if (amax_local) *amax_local = amax;
    comm_all_reduce_max_f32(z->world, amax.data(), amax.size());
    for (size_t i = 0; i < amax.size(); i++) metas[i].meta->amax = amax[i];
}

// the layout and the host shards that checkpoints and Hugging Face interop read (the GPU store has one too)
static inline Zero* zero_layout(Zero* z) { return z; }

// host shards <-> the store's working state: the CPU store's state is its host shards
static inline void zero_to_host(Zero* z) { (void)z; }
static inline void zero_from_host(Zero* z) { (void)z; }

// Are the host shards (master, m, v: after zero_to_host) finite on every rank? Collective (world).
static inline bool zero_host_state_finite(Zero* z) {
    int bad = 0;
    for (const real* a : {z->master, z->m, z->v}) if (a) {   // (LionW: no v)
        size_t n = 0;
        #pragma omp parallel for reduction(+ : n)
        for (size_t i = 0; i < z->shard_total; i++) n += !std::isfinite(a[i]);
        bad += n > 0;
    }
    comm_all_reduce(z->world, &bad, 1, COMM_I32);
    return bad == 0;
}

// bytes this rank has sent in every group the training uses
static inline uint64_t zero_bytes_sent(const Zero* z) {
    uint64_t b = comm_bytes_sent(z->world) + comm_bytes_sent(&z->shard) + comm_bytes_sent(&z->replica);
    if (z->ep_n > 1) b += comm_bytes_sent(&z->ep) + comm_bytes_sent(&z->expert_shard);
    if (z->P != z->S) b += comm_bytes_sent(&z->expert_replica_own);
    return b;
}

// ---------------------------------------------------------------------------------------------
// gathering and reduce-scattering one unit

// Starts gathering unit u's parameters into its slot (u % 2). On the CPU (MPI) it completes here; the
// GPU path issues it on the communication stream and zero_wait_unit orders the compute stream after it.
static inline void zero_gather_unit_async(Zero* z, int u) {
    int slot = u & 1;
    if (z->slot_unit[slot] == u) return;   // already there (the last unit, kept for its backward; a prefetch)
    if (z->fp8.on && !z->fp8.tensors[u].empty()) {   // a block under --fp8-gather: E4M3 codes (zero_fp8.h; EP: the expert shard group's)
        if (!z->fp8.ready) zero_fp8_prepare(&z->fp8, &z->shard, z->master, z->shard_off);
        zero_fp8_gather_unit(&z->fp8, zero_unit_group(z, u), u, z->work[slot]);
    } else {   // each run into its place in the unit (EP: this rank's experts' runs, in the expert shard group)
        CommGroup* g = zero_unit_group(z, u);
        for (const ShardRun& r : z->runs[u])
            if (zero_run_mine(z, r))
                comm_all_gather(g, z->master + z->shard_off[u] + r.shard_rel, z->work[slot] + r.slot_off, r.chunk, COMM_F32);
    }
    z->slot_unit[slot] = u;
}
static inline void zero_wait_unit(Zero* z, int u) { (void)z; (void)u; }
static inline void zero_release_unit(Zero* z, int u) { if (z->slot_unit[u & 1] == u) z->slot_unit[u & 1] = -1; }

// the full gradient of unit u (in gwork) -> reduce-scatter in the shard group, run by run -> added into the shard
static inline void zero_reduce_scatter_unit(Zero* z, int u) {
    CommGroup* grp = zero_unit_group(z, u);
    for (const ShardRun& r : z->runs[u]) {
        if (!zero_run_mine(z, r)) continue;
        real* full = z->gwork + r.slot_off;
        comm_reduce_scatter_inplace(grp, full, r.chunk, COMM_F32);
        const real* mine = full + (size_t)grp->rank * r.chunk;
        real* g = z->grad + z->shard_off[u] + r.shard_rel;
        for (size_t i = 0; i < r.chunk; i++) g[i] += mine[i];
    }
}

// the unit after u in this pass whose parameters will be needed (-1: none)
static inline int zero_next_unit(const Zero* z, int u, int phase) {
    if (phase == UNIT_FORWARD) return u + 1 < z->n_units ? u + 1 : -1;
    return u - 1 >= 1 ? u - 1 : -1;   // the embedding's backward reads no parameter
}

// item (u, j): chunk j of unit u (j = 0 for a unit that is not chunked), in working slot zero_item_slot
static inline int zero_item(const Zero* z, int u, int j) { return z->item_base[u] + j; }
static inline int zero_item_slot(const Zero* z, int u, int j) { return zero_item(z, u, j) & 1; }
// the first item of unit u in the order of `phase` (the backward goes through a unit's chunks backwards)
static inline int zero_first_chunk(const Zero* z, int u, int phase) { return phase == UNIT_FORWARD ? 0 : z->unit_nchunks[u] - 1; }

static const char* const g_unit_phase_name[] = {"forward", "backward", "backward"};

static inline void zero_unit_begin(void* ctx, int u, int phase) {
    Zero* z = (Zero*)ctx;
    const DbrxConfig* c = &z->model->cfg;
    comm_phase("%s of unit %d (%s)", g_unit_phase_name[phase], u, dbrx_unit_name(u, c).c_str());   // the heartbeat
    if (phase != UNIT_BACKWARD_GRADS_ONLY) {
        zero_gather_unit_async(z, u);
        zero_wait_unit(z, u);
        unit_views(&z->model->p, z->work[u & 1], u, c, z->model->table, z->ep_n);
        int next = zero_next_unit(z, u, phase);
        if (next >= 0) zero_gather_unit_async(z, next);   // prefetch into the other slot
    }
    if (phase != UNIT_FORWARD) {   // gradients accumulate into a zeroed full-size buffer (padding included)
        memset(z->gwork, 0, z->slot_numel[u] * sizeof(real));
        unit_views(&z->model->g, z->gwork, u, c, z->model->table, z->ep_n);
    }
}

static inline void zero_unit_end(void* ctx, int u, int phase) {
    Zero* z = (Zero*)ctx;
    if (phase != UNIT_FORWARD) zero_reduce_scatter_unit(z, u);
    // released after use, but for the last unit after its forward: its backward follows at once
    if (!(phase == UNIT_FORWARD && u == z->n_units - 1)) zero_release_unit(z, u);
}

// ---------------------------------------------------------------------------------------------
// the step

static inline void zero_zero_grad(Zero* z) { memset(z->grad, 0, z->shard_total * sizeof(real)); }
// (the GPU store's replica reduction during the last micro-batch's backward; the CPU's MPI all-reduce waits for the
// backward anyway: nothing to do)
static inline void zero_last_micro(Zero*, bool) {}

// After the micro-batches: sum the gradient shards across the replicas, and average over the world
// (each rank's gradient is the mean over its own tokens).
static inline void zero_reduce_grads(Zero* z) {
    if (z->P != z->S) {   // data parallel with EP: non-expert units over the world, experts over their replicas
        for (int u = 0; u < z->n_units; u++) {
            CommGroup* g = z->unit_ep[u] ? zero_expert_replica(z) : &z->replica;
            if (g->size > 1) comm_all_reduce(g, z->grad + z->shard_off[u], z->shard_numel[u], COMM_F32);
        }
    } else if (z->R > 1) comm_all_reduce(&z->replica, z->grad, z->shard_total, COMM_F32);
    if (z->W > 1) {
        real inv = (real)1 / z->W;
        for (size_t i = 0; i < z->shard_total; i++) z->grad[i] *= inv;
    }
}

// global L2 norm of the gradient: S = 1 as unsharded; else the shard's sum of squares (fixed-size
// chunks in order) all-reduced in the shard group (replicas hold the same gradient)
static inline double zero_grad_norm(Zero* z) {
    if (z->P == 1) return dbrx_grad_norm(z->model);
    const size_t chunk = 1 << 16;
    if (z->P != z->S) {   // data parallel with EP: every rank has the non-expert gradient; the EP group the experts'
        double dense = 0, experts = 0;
        for (int u = 0; u < z->n_units; u++)
            for (size_t lo = 0; lo < z->shard_numel[u]; lo += chunk)
                (z->unit_ep[u] ? experts : dense) +=
                    grad_sumsq(z->grad + z->shard_off[u] + lo, (lo + chunk < z->shard_numel[u] ? lo + chunk : z->shard_numel[u]) - lo);
        comm_all_reduce(&z->ep, &experts, 1, COMM_F64);
        return sqrt(dense + experts);
    }
    double sumsq = 0;
    for (size_t lo = 0; lo < z->shard_total; lo += chunk)
        sumsq += grad_sumsq(z->grad + lo, (lo + chunk < z->shard_total ? lo + chunk : z->shard_total) - lo);
    comm_all_reduce(&z->shard, &sumsq, 1, COMM_F64);
    return sqrt(sumsq);
}

// one optimizer step t (1-based: AdamW, or LionW under --optimizer lion) on this rank's shard, with global-norm clipping by `norm` (zero_grad_norm's,
// which the training loop's spike guard reads first); returns it
static inline double zero_update(Zero* z, const AdamWConfig* o, float lr, int t, double norm) {
    z->slot_unit[0] = z->slot_unit[1] = -1;   // the gathered copies are stale after the update
    z->fp8.ready = 0;                          // and so are the FP8 codes
    if (z->P == 1) return dbrx_update(z->model, o, lr, t, norm);
    float scale = (o->grad_clip > 0 && norm > o->grad_clip) ? (float)(o->grad_clip / norm) : 1.0f;
    for (const ShardSegment& g : z->segs)
        optimizer_update(z->master + g.shard_off, z->grad + g.shard_off, z->m + g.shard_off, z->v ? z->v + g.shard_off : NULL, g.numel,
                         lr, o->beta1, o->beta2, o->eps, g.decay ? o->weight_decay : 0.0f, scale, t);
    dbrx_fp8_end_step(z->model);
    return norm;
}

// a step the spike guard skips: no update; its FP8 amaxes are dropped
static inline void zero_skip_update(Zero* z) {
    z->fp8.ready = 0;
    dbrx_fp8_discard_step(z->model);
}

// the gradient shard times f (DBRX_DEBUG_SPIKE: the tests' injected spike or NaN)
static inline void zero_scale_grads(Zero* z, float f) {
    for (size_t i = 0; i < z->shard_total; i++) z->grad[i] *= f;
}

DBRX_CHECK_STORE_CONTRACT(Zero, Dbrx);

#include "zero_embedding.h"   // --zero-embedding: the row exchange's layout facts (the GPU store's, the plan's)
