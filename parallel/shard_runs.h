/*
 * shard_runs.h — a run: the piece of a sharding unit that is split evenly over the S ranks of a shard
 * group (parallel/zero.h's layout), and the pieces a rank holds. Shared by the store (zero.h), its FP8
 * gather (zero_fp8.h) and the device store (zero_gpu.cuh).
 */
#pragma once
#include <cstddef>
#include <vector>

// flat range [flat_off, flat_off + numel), split into S pieces of `chunk` = ceil(numel / S) elements
// (the last padded); a rank's piece lies at shard_rel in its shard of the unit
typedef struct { size_t flat_off, numel, chunk, shard_rel; } ShardRun;

// Calls fn(lo, hi, at) for the piece of each run that shard rank r holds: flat range [lo, hi) (shorter
// than chunk only for the padded last piece; lo >= hi: all padding), `at` its place in the rank's shard
// of the unit.
template <typename Fn> static inline void shard_run_pieces(const std::vector<ShardRun>& runs, int r, Fn fn) {
    for (const ShardRun& run : runs) {
        size_t lo = run.flat_off + (size_t)r * run.chunk, end = run.flat_off + run.numel;
        size_t hi = lo + run.chunk < end ? lo + run.chunk : end;
        fn(lo, hi, run.shard_rel);
    }
}
