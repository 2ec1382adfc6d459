/*
 * expert_parallel.h — expert parallelism (--expert-parallel n > 1) on the CPU: the token dispatcher that
 * runs a MoE layer's experts over an EP group of n ranks, apart from the experts' arithmetic (the model,
 * model/dbrx.h), as Megatron-Core's token dispatcher lives apart from its experts. Defines
 *   ExpertParallel   the transport: this rank's place in the EP group and the store's all-to-all
 *   EpPlan, ep_plan  the exchange of one layer, planned from the routed rows' counts (every rank's: each
 *                    rank checks every rank's rows against the planned capacity, ep_plan_rows)
 *   ep_exchange      the rows of a plan, there (to the experts' ranks) or back
 *   EpDispatch       the dispatcher's state: the plans and buffers kept for the backward, scratch, statistics
 *   ep_install       hooks it into the model (Dbrx::experts), as parallel/zero.h hooks its gathers (UnitHooks)
 *   dbrx_ep_recv_rows, dbrx_ep_totals   its statistics, for the training loop
 * The experts of every MoE layer are split over the EP group, EP rank r holding experts
 * [r*E/n, (r+1)*E/n) (its experts unit's views hold only those, w1/v1/w2 each (E/n * F, d)). After
 * routing, the model hands the routed rows to the dispatcher, which sends every row to the rank that owns
 * its expert, runs this rank's experts over every peer's rows, and sends the results back, through
 * `all_to_allv` — the store's transport (MPI on the CPU, NCCL on the GPU: expert_parallel_cuda.cuh). The
 * plan and the row exchange are the same for both backends; the experts' arithmetic is each backend's.
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "../model/dbrx.h"
#include "comm.h"

// this rank's place in its EP group and the transport. host: the buffers are host memory (the counts),
// even on the GPU path. cap: the rows any rank may receive in one layer (0: no bound, the CPU's host
// vectors grow; the GPU's device buffers are planned at start-up for cap rows: ep_plan_rows), cap_how
// says where it comes from, for the messages. grow (the GPU's): when a routing needs more than cap, every
// buffer planned for the received rows allocated again for more (ep_grow: MoE stays dropless); it returns the
// bytes it added on this rank, or -1 when an allocation failed. cap_max: the dropless bound (ep_plan_rows); rows_mean: the
// rows a rank receives on average (tokens x top-k), for the factor the messages name.
typedef struct {
    int n = 1, rank = 0;
    void (*all_to_allv)(void* ctx, const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes, int host) = NULL;
    void* ctx = NULL;
    size_t cap = 0, cap_max = 0, rows_mean = 0;
    std::string cap_how;
    long long (*grow)(void* ctx, size_t rows) = NULL;
    void* grow_ctx = NULL;
} ExpertParallel;

// --ep-capacity-factor's default: each EP rank plans device buffers for twice the average rows
// (tokens x top-k) per MoE layer (README, --ep-capacity-factor: what it costs at DBRX-132B width)
#define EP_CAPACITY_DEFAULT 2.0

// --ep-overlap-chunks' default: the GPU's exchange of each MoE layer in this many chunks, overlapped with the
// experts (ep_chunk_layout; parallel/README.md, "Overlapping the exchange with the experts": why 2)
#define EP_OVERLAP_CHUNKS_DEFAULT 2
#define EP_OVERLAP_CHUNKS_DEFAULT_S "2"

// The rows one EP rank may receive in one MoE layer, planned: factor x N tokens x top-k (rounded up),
// at most the dropless bound n N min(k, E/n) (every peer's every token sends min(k, E/n) rows to this
// rank's E/n experts: no routing can need more), and at least that bound for one token per rank (the
// decode step's). factor 0: the dropless bound. *how (optional): the numbers, for the message.
static inline size_t ep_plan_rows(const DbrxConfig* c, size_t N, int n, double factor, std::string* how = nullptr) {
    size_t k = c->top_k, El = c->n_experts / n, per = std::min(k, El);
    size_t dropless = (size_t)n * N * per, want = factor > 0 ? (size_t)std::ceil(factor * (double)(N * k)) : dropless;
    size_t rows = std::max(std::min(want, dropless), (size_t)n * per);
    if (how) {
        char b[256];
        snprintf(b, sizeof b, "--ep-capacity-factor %g x %zu tokens x top-%zu = %zu rows planned per layer; the dropless bound is %zu rows "
                 "= --ep-capacity-factor %g or 0", factor, N, k, rows, dropless, (double)dropless / (double)(N * k));
        *how = b;
    }
    return rows;
}

// The exchange of one MoE layer, planned from the counts, kept for the backward. Rows to peer p are
// the rows of its experts, contiguous in xe (grouped by expert); rows from peer q arrive grouped by my
// experts; perm puts them expert-major (local expert j: every peer's rows for it, in peer order).
typedef struct {
    std::vector<int> recv_counts;              // (n * E/n): [q][j] rows peer q routes to my expert j
    std::vector<size_t> send_rows, recv_rows;  // (n)
    std::vector<int> loffsets, perm;           // (E/n + 1), (R): expert-major row i = received row perm[i]
    std::vector<int> all;                      // (n, E): every peer's counts (the chunked exchange's layout: ep_chunk_layout)
    int R;                                     // rows received (every peer's, for my experts)
} EpPlan;

// The rows the buffers grow to when a layer needs `need` rows, more than planned: an eighth more (so a routing that
// drifts up grows them a few times, not every step), in whole 64-row tiles, at most the dropless bound
static inline size_t ep_grow_rows(size_t need, size_t cap_max) {
    size_t rows = (need + need / 8 + 63) / 64 * 64;
    return cap_max ? std::min(std::max(rows, need), std::max(cap_max, need)) : rows;
}

// MoE is dropless (every routed row is computed): when layer l's routing sends EP rank `who` `need` rows, more than
// the buffers hold (ep->cap), every rank of the group grows its buffers here to the same new capacity. Every rank has
// the same counts and no row has moved yet; the allocations are then agreed (each rank's verdict to every rank), so
// that either every rank goes on with the larger buffers, or every rank stops with the same message (no rank left
// waiting in the exchange). Printed by EP rank 0: the rows and the bytes, and the factor that plans them at start-up.
static inline void ep_grow(ExpertParallel* ep, size_t need, int who, int l) {
    size_t rows = ep_grow_rows(need, ep->cap_max);
    long long added = ep->grow ? ep->grow(ep->grow_ctx, rows) : -1;
    std::vector<long long> mine(ep->n, added), all(ep->n);
    std::vector<size_t> b(ep->n, sizeof(long long));
    ep->all_to_allv(ep->ctx, mine.data(), b.data(), all.data(), b.data(), 1);
    for (int q = 0; q < ep->n; q++)
        if (all[q] < 0) {
            comm_agreed_failure();   // every rank exits over the same verdicts: none of them is a lost rank
            fail(EXIT_RUNTIME, "expert parallelism: layer %d: EP rank %d's experts would receive %zu rows, more than the %zu its buffers "
                 "hold (at start-up: %s), and EP rank %d could not allocate them for %zu rows: out of device memory; lower --batch/--seq, or "
                 "free memory (--recompute, --compress-acts: README, --ep-capacity-factor)", l, who, need, ep->cap, ep->cap_how.c_str(), q, rows);
        }
    if (ep->rank == 0) {
        printf("expert parallelism: layer %d: EP rank %d's experts receive %zu rows, more than the %zu its buffers hold: every EP "
               "rank's grown to %zu rows (+%.1f MiB on EP rank 0, world rank %d; --ep-capacity-factor %.3g plans them at start-up); "
               "MoE stays dropless\n", l, who, need, ep->cap, rows, (double)added / 1048576.0, g_comm_rank,
               ep->rows_mean ? (double)rows / (double)ep->rows_mean : 0.0);
        fflush(stdout);
    }
    ep->cap = rows;
}

// Plans the exchange of layer l from this rank's counts (E): every rank's counts go to every rank first
// (one small all-to-all of E ints per peer), so that every rank knows what it will receive, and what
// every other rank will: when a rank would receive more rows than planned (ep->cap), every rank grows its
// buffers here, before any row moves (ep_grow; where it cannot, every rank stops with the same message).
static inline void ep_plan(ExpertParallel* ep, EpPlan* pl, const int* counts, const int* offsets, int E, int l) {
    int n = ep->n, El = E / n;
    std::vector<int> mine((size_t)n * E), all((size_t)n * E);   // (n, E): my counts to every peer; every peer's counts
    for (int p = 0; p < n; p++) std::copy(counts, counts + E, mine.begin() + (size_t)p * E);
    std::vector<size_t> cb(n, E * sizeof(int));
    ep->all_to_allv(ep->ctx, mine.data(), cb.data(), all.data(), cb.data(), 1);
    size_t need = 0;
    int who = 0;
    for (int r = 0; ep->cap && r < n; r++) {   // (the same sums, in the same order, on every rank)
        size_t rows = 0;
        for (int q = 0; q < n; q++) for (int j = 0; j < El; j++) rows += all[(size_t)q * E + r * El + j];
        if (rows > need) { need = rows; who = r; }
    }
    if (ep->cap && need > ep->cap) ep_grow(ep, need, who, l);
    pl->all = all;
    pl->recv_counts.assign((size_t)n * El, 0);
    for (int q = 0; q < n; q++) for (int j = 0; j < El; j++) pl->recv_counts[(size_t)q * El + j] = all[(size_t)q * E + ep->rank * El + j];
    pl->send_rows.assign(n, 0); pl->recv_rows.assign(n, 0);
    for (int p = 0; p < n; p++) pl->send_rows[p] = offsets[(p + 1) * El] - offsets[p * El];
    for (int q = 0; q < n; q++) for (int j = 0; j < El; j++) pl->recv_rows[q] += pl->recv_counts[(size_t)q * El + j];
    pl->loffsets.assign(El + 1, 0);
    for (int j = 0; j < El; j++) {
        int rows = 0;
        for (int q = 0; q < n; q++) rows += pl->recv_counts[(size_t)q * El + j];
        pl->loffsets[j + 1] = pl->loffsets[j] + rows;
    }
    pl->R = pl->loffsets[El];
    pl->perm.resize(pl->R);
    std::vector<int> qstart(n + 1, 0);   // where peer q's rows start among the received ones
    for (int q = 0; q < n; q++) qstart[q + 1] = qstart[q] + (int)pl->recv_rows[q];
    for (int j = 0, i = 0; j < El; j++)
        for (int q = 0; q < n; q++) {
            int r0 = qstart[q];
            for (int jj = 0; jj < j; jj++) r0 += pl->recv_counts[(size_t)q * El + jj];
            for (int r = 0; r < pl->recv_counts[(size_t)q * El + j]; r++) pl->perm[i++] = r0 + r;
        }
}

// The exchange of one layer in chunks (--ep-overlap-chunks N: the GPU overlaps chunk c's experts with the
// exchange of chunks c - 1 and c + 1, expert_parallel_cuda.cuh). Rank r's local expert j has N slices of its
// expert-major rows (every peer's, in peer order: the unchunked order), slice t = [b(t), b(t + 1)),
// b(t) = lo_j + cnt_j t / N, and each (expert, slice) is a chunk of its own (ep_chunk_layout: C = El N). Slicing
// so keeps every row's place in the expert-major order: the experts' forward and input gradients are row by row,
// and the weight gradients can run over each expert's rows in one piece, in the unchunked order, after the last
// chunk (the same sums, bit for bit). Slice t holds the rows of peers about [t n / N, (t + 1) n / N): were it
// every rank's t-th chunk of the expert, those peers would send all their rows for it and the others none, each
// chunk's exchange as long as the whole one on a link-bound fabric. So rank r takes an expert's slices in a
// rotated order, slice (t + r N / n) mod N: in each chunk every rank sends to about n / N ranks, 1 / (El N) of
// its rows (balanced routing), and each expert's first chunk is the slice of rank r's own rows (N >= n: only
// those, which never leave the GPU). The sender's rows of a chunk for a peer are one contiguous piece of xe per
// expert of that peer (xe keeps a peer's rows in the order they take there), so they are staged chunk-major
// first (stage) and the chunk travels as one all-to-all(v); from peer q come, per chunk, its pieces for my
// experts in expert order. One chunk (C = 1) is the unchunked exchange: stage the identity, perm ep_plan's.
typedef struct {
    int C = 1;
    std::vector<size_t> send_rows, recv_rows;     // (C, n): rows to / from peer p in chunk c
    std::vector<size_t> send_start, recv_start;   // (C + 1): chunk c's first row among the staged (sent) / received rows
    std::vector<int> first, last;                 // (E/n, C): my expert j's rows in chunk c: [first, last) of my expert-major order
    std::vector<int> stage, unstage;              // (N k): staged row s = xe row stage[s]; xe row i = staged row unstage[i]
    std::vector<int> perm, inv;                   // (R): expert-major row i = received row perm[i]; received row i = expert-major inv[i]
} EpChunks;

// ch's send and receive lists (stage, perm, inv, unstage, the row counts and starts) of its C chunks: chunk c carries,
// for each rank r's experts j in [j0(c), j1(c)), piece(q, r, j, c, &s0, &s1) of peer q's rows (expert-major rows
// [s0, s1) of rank r; base(q, r, j): the first of peer q's rows for that expert). I send to rank r my pieces for its
// experts (xe grouped by expert: offsets), and receive from peer q its pieces for mine, in expert order.
template <typename Piece, typename Base, typename First, typename End>
static inline void ep_chunk_lists(EpChunks* ch, const int* offsets, int n, int me, int El, int R, Piece piece, Base base, First j0, End j1) {
    const int C = ch->C;
    ch->send_rows.assign((size_t)C * n, 0); ch->recv_rows.assign((size_t)C * n, 0);
    ch->send_start.assign(C + 1, 0); ch->recv_start.assign(C + 1, 0);
    ch->stage.clear(); ch->perm.assign(R, 0); ch->inv.clear();
    for (int c = 0; c < C; c++) {
        for (int r = 0; r < n; r++)   // what I send: to rank r, its experts' pieces of my rows
            for (int j = j0(c); j < j1(c); j++) {
                int s0, s1, e = r * El + j;
                piece(me, r, j, c, &s0, &s1);
                for (int s = s0; s < s1; s++) ch->stage.push_back(offsets[e] + s - base(me, r, j));
                ch->send_rows[(size_t)c * n + r] += s1 - s0;
            }
        for (int q = 0; q < n; q++)   // what I receive: from peer q, its pieces for my experts, in expert order
            for (int j = j0(c); j < j1(c); j++) {
                int s0, s1;
                piece(q, me, j, c, &s0, &s1);
                for (int s = s0; s < s1; s++) { ch->perm[s] = (int)ch->inv.size(); ch->inv.push_back(s); }
                ch->recv_rows[(size_t)c * n + q] += s1 - s0;
            }
        ch->send_start[c + 1] = ch->stage.size();
        ch->recv_start[c + 1] = ch->inv.size();
    }
    ch->unstage.assign(ch->stage.size(), 0);
    for (size_t s = 0; s < ch->stage.size(); s++) ch->unstage[ch->stage[s]] = (int)s;
}

// --ep-overlap-chunks C on the GPU under the FP8 recipe: C, but 1 (the exchange in one piece) under per-tensor scaling,
// which needs the amax of a layer's received rows before it quantises any (block scaling chunks it:
// parallel/expert_parallel_fp8.cuh)
static inline int ep_gpu_chunks(int chunks, int recipe) { return recipe == FP8_OFF || recipe == FP8_BLOCK ? chunks : 1; }
// ... and whether FP8 holds a layer's expert weights for its chunks (a third weight scratch: fp8_hold_expert_weights): EP of
// n > 1 ranks, block scaling, more than one chunk, and the weights gathered (weight_cache, no shard group: cached already)
static inline bool ep_fp8_hold(int n, int chunks, int recipe, bool weight_cache) {
    return n > 1 && recipe == FP8_BLOCK && ep_gpu_chunks(chunks, recipe) > 1 && !weight_cache;
}

// layer pl's exchange in N slices of every local expert's rows, one chunk per (expert, slice): C = El N chunks, chunk
// c = j N + t carrying slice (t + r N / n) mod N of rank r's expert j (rotated as above) and nothing of its other
// experts. offsets (E + 1): xe's rows per expert (this rank's routing). align: every slice bound of an expert's rows
// but its last a multiple of align rows from the expert's first (FP8: 16, so that only the slice with an expert's
// last rows needs padding in the padded layout: parallel/expert_parallel_fp8.cuh). By expert, because the experts'
// GEMMs are per expert anyway: a chunk's GEMMs are an N-th of one expert's rows, while the first dispatch and the
// last combine (the layer's fill and drain, which nothing covers) carry an El N-th of the rows. (Until session 54
// chunk c was slice c of every expert: at N = 2, El = 2 the fill and drain carried half the rows, and 4 chunks
// halved the GEMMs.) Each expert's rows keep their expert-major places: the same sums, bit for bit.
static inline void ep_chunk_layout(const ExpertParallel* ep, const EpPlan* pl, const int* offsets, int E, int N, EpChunks* ch, int align = 1) {
    int n = ep->n, El = E / n, me = ep->rank, C = N == 1 ? 1 : El * N;   // (N = 1: one chunk, every expert whole)
    const std::vector<int>& all = pl->all;
    // rank r's expert j: its first expert-major row (lo), its rows (cnt), and peer q's first among them (base)
    auto cnt = [&](int r, int j) { int s = 0; for (int q = 0; q < n; q++) s += all[(size_t)q * E + r * El + j]; return s; };
    auto lo = [&](int r, int j) { int s = 0; for (int jj = 0; jj < j; jj++) s += cnt(r, jj); return s; };
    auto base = [&](int q, int r, int j) { int s = lo(r, j); for (int qq = 0; qq < q; qq++) s += all[(size_t)qq * E + r * El + j]; return s; };
    auto bound = [&](int r, int j, int t) { return lo(r, j) + (t == N ? cnt(r, j) : (int)((long long)cnt(r, j) * t / N) / align * align); };
    auto slice = [&](int r, int c) { return (int)((c % N + (long long)r * N / n) % N); };   // rank r's chunk c: its expert c / N's slice
    // the piece of peer q's rows for rank r's expert j in chunk c: expert-major rows [*s0, *s1) of rank r
    auto piece = [&](int q, int r, int j, int c, int* s0, int* s1) {
        int b = base(q, r, j), e = b + all[(size_t)q * E + r * El + j], t = slice(r, c);
        *s0 = std::max(b, bound(r, j, t)); *s1 = std::max(*s0, std::min(e, bound(r, j, t + 1)));
    };
    ch->C = C;   // (the row counts and lists: ep_chunk_lists)
    ch->first.assign((size_t)El * C, 0); ch->last.assign((size_t)El * C, 0);
    auto j0 = [&](int c) { return C == 1 ? 0 : c / N; };   // chunk c's experts: [j0, j1)
    auto j1 = [&](int c) { return C == 1 ? El : c / N + 1; };
    for (int j = 0; j < El; j++)
        for (int c = 0; c < C; c++) {
            bool in = j0(c) <= j && j < j1(c);
            ch->first[(size_t)j * C + c] = in ? bound(me, j, slice(me, c)) : pl->loffsets[j];
            ch->last[(size_t)j * C + c] = in ? bound(me, j, slice(me, c) + 1) : pl->loffsets[j];
        }
    ep_chunk_lists(ch, offsets, n, me, El, pl->R, piece, base, j0, j1);
}

// chunk c's rows of `row_bytes` (ch: ep_chunk_layout): there (send: the staged rows, recv: the received
// ones, both from chunk c's first row), or back (back = 1: from the received rows' place into the staged)
static inline void ep_exchange_chunk(const ExpertParallel* ep, const EpChunks* ch, int c, const void* send, void* recv, size_t row_bytes,
                                     int back) {
    int n = ep->n;
    std::vector<size_t> sb(n), rb(n);
    for (int p = 0; p < n; p++) {
        size_t out = ch->send_rows[(size_t)c * n + p], in = ch->recv_rows[(size_t)c * n + p];
        sb[p] = (back ? in : out) * row_bytes;
        rb[p] = (back ? out : in) * row_bytes;
    }
    ep->all_to_allv(ep->ctx, send, sb.data(), recv, rb.data(), 0);
}

// rows of `row_bytes`: send blocks by send_rows, receive by recv_rows (or the reverse, back = 1)
static inline void ep_exchange(const ExpertParallel* ep, const EpPlan* pl, const void* send, void* recv, size_t row_bytes, int back) {
    int n = ep->n;
    std::vector<size_t> sb(n), rb(n);
    for (int p = 0; p < n; p++) {
        sb[p] = (back ? pl->recv_rows[p] : pl->send_rows[p]) * row_bytes;
        rb[p] = (back ? pl->send_rows[p] : pl->recv_rows[p]) * row_bytes;
    }
    ep->all_to_allv(ep->ctx, send, sb.data(), recv, rb.data(), 0);
}

// the rows exchanged by one rank: the statistics both backends' dispatchers keep
typedef struct {
    int recv_max;                                // the most rows this rank's experts received in one layer, last forward
    long long rows_out, rows_in, count_sends;    // rows sent to / received from other EP ranks, count messages:
                                                 // totals over every forward (the test's byte formula)
} EpStats;

// the statistics of one exchange planned: pl's rows to and from the other ranks
static inline void ep_stats_add(EpStats* s, const ExpertParallel* ep, const EpPlan* pl) {
    if (pl->R > s->recv_max) s->recv_max = pl->R;
    for (int p = 0; p < ep->n; p++)
        if (p != ep->rank) { s->rows_out += pl->send_rows[p]; s->rows_in += pl->recv_rows[p]; s->count_sends++; }
}

// ---------------------------------------------------------------------------------------------
// the CPU dispatcher

// one layer's exchange and my experts' rows (R of them: every peer's) and activations, kept for the backward
typedef struct {
    EpPlan plan;
    std::vector<real> xl, g, u, act;   // (R, d), (R, F) x3
    std::vector<uint8_t> gu_codes;     // --compress-acts: g, u compressed (model/act_compress.cuh), g, u, act freed
    std::vector<float> gu_sinv;
} EpLayer;

typedef struct {
    ExpertParallel ep;
    Dbrx* model;
    std::vector<EpLayer> layers;                    // (L)
    std::vector<real> buf, buf2, da, dg, du;        // scratch, grown as needed (dropless)
    std::vector<real> fq[5];                        // under --fp8: the received rows' quantised operands (the model's fq_* hold N k rows only)
    EpStats stats;
} EpDispatch;

// scratch operand i of n elements under FP8 (grown, never shrunk; NULL, and nothing grown, when the
// policy p does not quantise: FP32, or wgrad-only copies (block_only) under a per-tensor recipe)
static inline real* ep_fq(EpDispatch* D, const Fp8Policy* p, int i, size_t n, bool block_only = false) {
    if (!p->st || (block_only && p->cfg->recipe != FP8_BLOCK)) return NULL;
    if (D->fq[i].size() < n) D->fq[i].resize(n);
    return D->fq[i].data();
}

// The experts of layer l under expert parallelism: the rows of xe go to their experts' ranks, this rank
// runs its experts over every peer's rows, the results come back into ye in xe's layout (the combine is
// as without EP). xe's rows are grouped by expert (counts, offsets); layer l's plan and expert-major
// buffers are kept for the backward. Collective in the EP group: the training forward's rows, or the
// decode step's k rows of its one token (dbrx_decode_step; layer l's training plan and buffers serve as
// scratch: nothing reads them between steps). Under FP8 (policy p): the operands as without EP, over this
// rank's E/n experts and the rows it received (the amaxes are per tensor; the training loop max-reduces
// them over the world, so a tensor's is that of all its experts and rows, as without EP).
static inline void ep_experts_forward_rows(EpDispatch* D, int l, const int* counts, const int* offsets, const real* xe, real* ye,
                                           const Fp8Policy* p, bool recompute = false) {
    Dbrx* m = D->model;
    const DbrxConfig* c = &m->cfg;
    const BlockParams& w = m->p.blocks[l];
    EpLayer* a = &D->layers[l];
    int E = c->n_experts, d = c->d_model, F = c->ffn_hidden, El = E / D->ep.n;
    EpPlan* pl = &a->plan;
    if (!recompute) {   // (the backward's recomputation, --recompute moe/block: the forward's plan, kept; nothing counted again)
        ep_plan(&D->ep, pl, counts, offsets, E, l);
        ep_stats_add(&D->stats, &D->ep, pl);
    }
    size_t R = pl->R;
    D->buf.resize(std::max<size_t>(R, 1) * d);
    ep_exchange(&D->ep, pl, xe, D->buf.data(), d * sizeof(real), 0);           // (R, d) in peer order
    a->xl.resize(R * d); a->g.resize(R * F); a->u.resize(R * F); a->act.resize(R * F);
    moe_gather(a->xl.data(), D->buf.data(), pl->perm.data(), (int)R, d);   // expert-major
    const int *lo = pl->loffsets.data(), *ws = m->fp8_wseg.data();   // (ws: the first El + 1 are the local experts' rows)
    const real* xq = fp8_policy_grouped(p, FP8_LIN_W1, FP8_OP_X, ep_fq(D, p, 0, R * d), a->xl.data(), lo, El, d, 1, 128);
    const real* w1 = fp8_policy_weight(p, FP8_LIN_W1, m->fq_w, w.w1, ws, El, d);
    const real* v1 = fp8_policy_weight(p, FP8_LIN_V1, m->fq_w2, w.v1, ws, El, d);
    experts_up_forward(a->g.data(), a->u.data(), a->act.data(), xq, w1, v1, lo, El, d, F);
    const real* actq = fp8_policy_grouped(p, FP8_LIN_W2, FP8_OP_X, ep_fq(D, p, 0, R * F), a->act.data(), lo, El, F, 1, 128);
    const real* w2 = fp8_policy_weight(p, FP8_LIN_W2, m->fq_w3, w.w2, ws, El, d);
    D->buf2.resize(std::max<size_t>(R, 1) * d);
    experts_down_forward(D->buf2.data(), actq, w2, lo, El, d, F);   // (R, d) expert-major
    for (size_t i = 0; i < R; i++) memcpy(&D->buf[(size_t)pl->perm[i] * d], &D->buf2[i * d], d * sizeof(real));
    ep_exchange(&D->ep, pl, D->buf.data(), ye, d * sizeof(real), 1);          // back, in xe's layout
}

// the model's experts forward hook (ExpertHooks::forward): train 1, the training forward (FP8 numerics
// under --fp8, the rows-received maximum restarted at its first layer); 2, its recomputation in the
// backward (--recompute moe/block: the same rows with the saved plan); 0, generation's token (FP32)
static inline void ep_experts_forward(void* ctx, int l, const int* counts, const int* offsets, const real* xe, real* ye, int train) {
    EpDispatch* D = (EpDispatch*)ctx;
    if (train == 1 && l == 0) D->stats.recv_max = 0;
    Fp8Policy p = train ? block_fp8_policy(D->model, l) : Fp8Policy{&D->model->fp8, NULL};   // (generation: FP32)
    ep_experts_forward_rows(D, l, counts, offsets, xe, ye, &p, train == 2);
    EpLayer* a = &D->layers[l];
    if (train == 1 && (D->model->rc_mode[l] & RC_CSWIGLU)) {   // --compress-acts: the received rows' g, u kept compressed
        int R = (int)a->plan.R, F = D->model->cfg.ffn_hidden;
        CompressFormat f = (CompressFormat)g_compress_format;
        a->gu_codes.resize(compress_code_bytes(f, R, F)); a->gu_sinv.resize(compress_factor_bytes(f, R, F) / 4);
        swiglu_compress(a->gu_codes.data(), a->gu_sinv.data(), a->g.data(), a->u.data(), R, R, F, f);
        std::vector<real>().swap(a->g); std::vector<real>().swap(a->u); std::vector<real>().swap(a->act);
    }
}

// Its backward (ExpertHooks::backward): dye's rows to the experts' ranks, the experts' backward there
// (weight gradients of my experts, from every peer's rows), dxe back in xe's layout. Under FP8 the
// operands of block_experts_backward, over the local experts and received rows.
static inline void ep_experts_backward(void* ctx, int l, const real* dye, real* dxe) {
    EpDispatch* D = (EpDispatch*)ctx;
    Dbrx* m = D->model;
    const DbrxConfig* c = &m->cfg;
    const BlockParams& w = m->p.blocks[l];
    const BlockParams& gw = m->g.blocks[l];
    EpLayer* a = &D->layers[l];
    Fp8Policy p = block_fp8_policy(m, l);
    int d = c->d_model, F = c->ffn_hidden, El = c->n_experts / D->ep.n;
    EpPlan* pl = &a->plan;
    size_t R = pl->R;
    D->buf.resize(std::max<size_t>(R, 1) * d); D->buf2.resize(std::max<size_t>(R, 1) * d);
    ep_exchange(&D->ep, pl, dye, D->buf.data(), d * sizeof(real), 0);
    moe_gather(D->buf2.data(), D->buf.data(), pl->perm.data(), (int)R, d);   // dy, expert-major
    D->da.resize(R * F); D->dg.resize(R * F); D->du.resize(R * F);
    if (m->rc_mode[l] & RC_CSWIGLU) {   // --compress-acts: g, u, act rebuilt from the codes
        a->g.resize(R * F); a->u.resize(R * F); a->act.resize(R * F);
        swiglu_decompress(a->g.data(), a->u.data(), a->act.data(), a->gu_codes.data(), a->gu_sinv.data(), (int)R, (int)R, F,
                          (CompressFormat)g_compress_format);
    }
    const int *lo = pl->loffsets.data(), *ws = m->fp8_wseg.data();
    const real* dy = D->buf2.data();   // expert-major
    // (the operands of block_experts_backward, in its order, over the local experts and received rows)
    const real* dy_d = fp8_policy_grouped(&p, FP8_LIN_W2, FP8_OP_DY, ep_fq(D, &p, 1, R * d), dy, lo, El, d, 1, 128);
    const real* w2 = fp8_policy_weight(&p, FP8_LIN_W2, m->fq_w3, w.w2, ws, El, d);
    const real* dy_w = fp8_policy_grouped_wgrad(&p, FP8_LIN_W2, ep_fq(D, &p, 2, R * d, true), dy, dy_d, lo, El, d);
    const real* act_w = fp8_policy_grouped(&p, FP8_LIN_W2, FP8_OP_X, ep_fq(D, &p, 0, R * F), a->act.data(), lo, El, F, 128, 1);
    experts_down_backward(D->da.data(), gw.w2, dy_d, w2, act_w, dy_w, lo, El, d, F);
    swiglu_backward(D->dg.data(), D->du.data(), D->da.data(), a->g.data(), a->u.data(), R * F);
    const real *dg = D->dg.data(), *du = D->du.data();
    const real* dg_d = fp8_policy_grouped(&p, FP8_LIN_W1, FP8_OP_DY, ep_fq(D, &p, 1, R * F), dg, lo, El, F, 1, 128);
    const real* du_d = fp8_policy_grouped(&p, FP8_LIN_V1, FP8_OP_DY, ep_fq(D, &p, 3, R * F), du, lo, El, F, 1, 128);
    const real* w1 = fp8_policy_weight(&p, FP8_LIN_W1, m->fq_w, w.w1, ws, El, d);
    const real* v1 = fp8_policy_weight(&p, FP8_LIN_V1, m->fq_w2, w.v1, ws, El, d);
    const real* dg_w = fp8_policy_grouped_wgrad(&p, FP8_LIN_W1, ep_fq(D, &p, 2, R * F, true), dg, dg_d, lo, El, F);
    const real* du_w = fp8_policy_grouped_wgrad(&p, FP8_LIN_V1, ep_fq(D, &p, 4, R * F, true), du, du_d, lo, El, F);
    const real* xe_w = fp8_policy_grouped(&p, FP8_LIN_W1, FP8_OP_X, ep_fq(D, &p, 0, R * d), a->xl.data(), lo, El, d, 128, 1);
    experts_up_backward(D->buf2.data(), gw.w1, gw.v1, dg_d, du_d, w1, v1, dg_w, du_w, xe_w, lo, El, d, F);   // dx, expert-major
    for (size_t i = 0; i < R; i++) memcpy(&D->buf[(size_t)pl->perm[i] * d], &D->buf2[i * d], d * sizeof(real));
    ep_exchange(&D->ep, pl, D->buf.data(), dxe, d * sizeof(real), 1);
}

// Expert parallelism of degree n on `m`, this rank EP rank `rank`, the rows over `all_to_allv(ctx, ...)`
// (the store's transport): the dispatcher hooked into the model's experts forward and backward.
static inline void ep_install(EpDispatch* D, Dbrx* m, int n, int rank,
                              void (*all_to_allv)(void*, const void*, const size_t*, void*, const size_t*, int), void* ctx) {
    D->ep.n = n; D->ep.rank = rank; D->ep.all_to_allv = all_to_allv; D->ep.ctx = ctx;
    D->model = m;
    D->layers.assign(m->cfg.n_layers, EpLayer());
    D->stats = EpStats{0, 0, 0, 0};
    m->experts = ExpertHooks{ep_experts_forward, ep_experts_backward, D};
}
// (the model runs its own experts again)
static inline void ep_uninstall(EpDispatch* D) {
    if (D->model) D->model->experts = ExpertHooks{NULL, NULL, NULL};
    D->model = NULL;
}

// the dispatcher installed on m (NULL: none, every expert here)
static inline const EpDispatch* ep_dispatch_of(const Dbrx* m) {
    return m->experts.forward == ep_experts_forward ? (const EpDispatch*)m->experts.ctx : NULL;
}

// expert parallelism's statistics, for the training loop: either backend's model (ep_dispatch_of has an
// overload per model: the GPU's in expert_parallel_cuda.cuh)
template <typename Model>
static inline int dbrx_ep_recv_rows(const Model* m) {
    const auto* D = ep_dispatch_of(m);
    return D ? D->stats.recv_max : 0;
}
template <typename Model>
static inline void dbrx_ep_totals(const Model* m, long long* out, long long* in, long long* counts) {
    const auto* D = ep_dispatch_of(m);
    EpStats s = D ? D->stats : EpStats{0, 0, 0, 0};
    *out = s.rows_out; *in = s.rows_in; *counts = s.count_sends;
}
