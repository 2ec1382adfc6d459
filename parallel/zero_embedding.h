/*
 * zero_embedding.h — the layout facts of --zero-embedding rows (the GPU store's row exchange of the embedding,
 * parallel/zero_gpu_embedding.cuh): whether a layout has it, its table's size, its device bytes. Shared by the store
 * and --dry-run's plan (parallel/memory_plan.h), which the CPU-only build compiles too. Included at the end of zero.h.
 */
#pragma once
#include <algorithm>

// --zero-embedding rows|gather (train_flags.h; the GPU store, parallel/zero_gpu_embedding.cuh): the embedding's rows
// exchanged per micro-batch (1, the default) or its table gathered and its gradient reduce-scattered (0)
inline int g_zero_embedding_rows = 1;
// the exchange's NCCL communicator's channels (ncclConfig_t.maxCTAs, which caps its point-to-point channels too): its
// rows are few (~100 MB a micro-batch at DBRX-132B), and NCCL's per-peer buffers scale with the channels
#define ZERO_EMB_NCCL_CTAS 2
// the exchange is on for a layout: S > 1, the vocabulary slot (its pack buffer), every layout rank a piece of the embedding
static inline bool zero_emb_exchange_on(const Zero* z) { return g_zero_embedding_rows && z->S > 1 && z->vocab_rows > 0 && z->P == z->S; }
// the exchange's table entries (a row of a run's piece x S) on layout rank p, and the most on any rank (at least 1)
static inline size_t zero_emb_table_numel(const Zero* z, int p, size_t d) {
    size_t n = 0;
    shard_run_pieces(z->runs[0], p, [&](size_t lo, size_t hi, size_t) {
        if (hi > lo) n += ((hi - z->unit_off[0] + d - 1) / d - (lo - z->unit_off[0]) / d) * (size_t)z->S;
    });
    return n;
}
// its device bytes for micro-batches of N tokens: rows (BF16) and their gradients (FP32), each position's row and
// 0..N-1 (ints), two of the largest table (8-byte entries: one per forward parity); 0 where it is off
static inline size_t zero_emb_table_max(const Zero* z, size_t d) {
    size_t t = 1;
    for (int p = 0; p < z->S; p++) t = std::max(t, zero_emb_table_numel(z, p, d));
    return t;
}
static inline size_t zero_emb_exchange_bytes(const Zero* z, size_t N, size_t d) {
    if (!zero_emb_exchange_on(z)) return 0;
    return N * d * (2 + 4) + 2 * N * 4 + 2 * zero_emb_table_max(z, d) * 8;
}
