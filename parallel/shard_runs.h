/*
 * shard_runs.h — a run: the piece of a sharding unit that is split evenly over ranks of a shard group
 * (parallel/zero.h's layout), and the pieces a rank holds. Shared by the store (zero.h), its FP8
 * gather (zero_fp8.h), the device store (zero_gpu.cuh) and the checkpoint loader.
 *   owner < 0    the run is split over all S ranks of the shard group: shard rank r holds piece r
 *   owner = o    expert parallelism (--expert-parallel n): the run belongs to the EP rank o (a slice of
 *                one expert tensor: EP rank o's experts) and is split over the Q = P/n ranks of the layout
 *                group that have EP rank o, layout rank r holding one piece of it (--ep-layout):
 *                  packed (default)  EP rank r % n, piece r / n: EP groups of n consecutive ranks, the
 *                                    expert shard group strided (one rank per node at 8 per node, Q = 8)
 *                  spread            EP rank r / Q, piece r % Q: the expert shard group Q consecutive
 *                                    ranks (inside a node), the EP groups strided by Q
 *                ep_layout_rank / ep_layout_piece are the one mapping; everything else asks them.
 * The layout group is the shard group (P = S) when n divides S; under data parallelism with EP (S = 1 < n)
 * it is the EP group (P = n): every rank holds the non-expert runs whole (r % 1 = piece 0) and its experts
 * whole (P/n = 1 piece). "r" below is the rank in the layout group (Zero.lrank).
 */
#pragma once
#include <cstddef>
#include <vector>

// flat range [flat_off, flat_off + numel), split into pieces of `chunk` = ceil(numel / parts) elements
// (the last padded); a holder's piece lies at shard_rel in its shard of the unit, and the whole run at
// slot_off in the unit's gathered working slot
typedef struct {
    size_t flat_off, numel, chunk, shard_rel, slot_off;
    int owner, ep_n;   // owner: -1, or the EP rank it belongs to (of ep_n)
    int parts;         // pieces it is split into: S (owner -1) or P/n
    int spread;        // owner >= 0: the EP layout, 1 = spread, 0 = packed (the top comment)
} ShardRun;

// layout rank r's EP rank and its piece of its EP rank's runs, for EP degree n, Q = P/n ranks per EP rank
static inline int ep_layout_rank(int r, int n, int q, int spread) { return spread ? r / q : r % n; }
static inline int ep_layout_piece(int r, int n, int q, int spread) { return spread ? r % q : r / n; }

// does layout rank r hold a piece of the run, and which
static inline bool shard_run_held(const ShardRun& run, int r) {
    return run.owner < 0 || ep_layout_rank(r, run.ep_n, run.parts, run.spread) == run.owner;
}
static inline int shard_run_piece(const ShardRun& run, int r) {
    return run.owner < 0 ? r % run.parts : ep_layout_piece(r, run.ep_n, run.parts, run.spread);
}

// Calls fn(lo, hi, at) for the piece of each run that shard rank r holds: flat range [lo, hi) (shorter
// than chunk only for the padded last piece; lo >= hi: all padding), `at` its place in the rank's shard
// of the unit.
template <typename Fn> static inline void shard_run_pieces(const std::vector<ShardRun>& runs, int r, Fn fn) {
    for (const ShardRun& run : runs) {
        if (!shard_run_held(run, r)) continue;
        size_t lo = run.flat_off + (size_t)shard_run_piece(run, r) * run.chunk, end = run.flat_off + run.numel;
        size_t hi = lo + run.chunk < end ? lo + run.chunk : end;
        fn(lo, hi, run.shard_rel);
    }
}
