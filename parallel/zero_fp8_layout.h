/*
 * zero_fp8_layout.h — where the device store's --fp8-gather (parallel/zero_gpu_fp8.cuh) puts things, in host code: the
 * blocks' FP8 matrices and their scale groups, each unit's code piece and side runs (the norms and router, sent as
 * BF16), this rank's part of every matrix in a working slot (where the model's GEMMs read its codes), and the bytes
 * of the store's buffers. The store allocates from it; --dry-run's plan (parallel/memory_plan.h) counts the same bytes.
 */
#pragma once
#include <algorithm>
#include <utility>
#include <vector>
#include "zero.h"

// a non-FP8 run: `n` elements between a rank's shard (or its packed side piece) and the unit's slot; rank: the member
// of the unit's gather group whose side piece it is
typedef struct { int rank; size_t src, dst, n; } Fp8SideRun;

typedef struct {
    int block;                                  // block scaling (128x128 weight blocks) or per tensor
    std::vector<Fp8GatherMatrix> mats;          // the FP8 matrices (flat offsets; meta unused here)
    std::vector<int> mat_unit, mat_layer, mat_lin;   // per matrix: its unit, layer and linear (FP8_LIN_*)
    std::vector<std::vector<int>> unit_mats;    // per unit: its matrices
    size_t groups;                              // scale groups of all matrices
    std::vector<size_t> side_len;               // per unit: its side piece (the longest member's norms and router elements)
    std::vector<std::vector<Fp8SideRun>> pack, unpack;   // per unit: shard -> side piece (this rank); pieces -> unit (all)
    // per matrix, this rank's part of it in a slot (the whole matrix, or under EP its experts' rows): its first
    // element's slot position, its first row and rows; block: its q and qt factors' offsets in the slot's factor buffer
    std::vector<size_t> part_at, part_row0, part_rows, part_fq, part_ft;
    size_t max_shard, max_slot, max_side, factors;   // the buffers' elements: one unit's code piece (its shard), byte
                                                     // slot and side piece; factors: per working slot
} Fp8GatherLayout;

// model/matmul.cuh's matmul_scale_count for BLK128 (host): an operand of `outer` rows of k, its 128x128 blocks' factors,
// k's blocks padded to 4 (the store checks it against the CUDA function)
static inline size_t fp8g_blk128_count(size_t outer, size_t k) { return (outer + 127) / 128 * (((k + 127) / 128 + 3) / 4 * 4); }

// The layout of the store's --fp8-gather for rank z->lrank of layout z (zero_unit_layout) and the parameter table
static inline void fp8g_device_layout(Fp8GatherLayout* f, const Zero* z, const std::vector<ParamInfo>& table, const DbrxConfig* c, int block) {
    f->block = block;
    f->groups = 0;
    f->mats.clear(); f->mat_unit.clear(); f->mat_layer.clear(); f->mat_lin.clear();
    f->unit_mats.assign(z->n_units, {});
    std::vector<std::vector<std::pair<size_t, size_t>>> plain(z->n_units);   // per unit: non-FP8 tensors (off, numel)
    for (const ParamInfo& p : table) {
        int l = dbrx_unit_layer(p.unit, c);
        if (l < 0) continue;   // the embedding and the head: no FP8 GEMM, gathered in BF16
        int lin = fp8g_linear_of(&p);
        if (lin < 0) { plain[p.unit].push_back({p.offset, p.numel}); continue; }
        Fp8GatherMatrix M = fp8g_matrix(p.offset, p.rows, p.cols, fp8g_seg_rows(&p, lin, c), f->groups, block, NULL);
        f->groups += M.groups;
        f->unit_mats[p.unit].push_back((int)f->mats.size());
        f->mats.push_back(M);
        f->mat_unit.push_back(p.unit); f->mat_layer.push_back(l); f->mat_lin.push_back(lin);
    }
    // per unit of a block: the code piece (its shard's length in bytes) and the side runs of the norms and
    // the router, of every member of the unit's gather group (the shard group; a block's experts under EP:
    // the expert shard group, whose runs land in the compact slot of this rank's experts, ShardRun.slot_off)
    f->side_len.assign(z->n_units, 0);
    f->pack.assign(z->n_units, {}); f->unpack.assign(z->n_units, {});
    f->max_shard = f->max_slot = f->max_side = 0;
    for (int u = 0; u < z->n_units; u++) {
        if (f->unit_mats[u].empty()) continue;
        std::vector<int> members = zero_unit_members(z, u);
        for (int j = 0; j < (int)members.size(); j++) {
            int r = members[j];
            size_t count = 0;
            for (const ShardRun& run : z->runs[u]) {
                if (!shard_run_held(run, r)) continue;
                size_t lo = run.flat_off + (size_t)shard_run_piece(run, r) * run.chunk, end = run.flat_off + run.numel;
                size_t hi = lo + run.chunk < end ? lo + run.chunk : end;
                for (auto& t : plain[u]) {
                    size_t a = t.first > lo ? t.first : lo, b = t.first + t.second < hi ? t.first + t.second : hi;
                    if (a >= b) continue;
                    f->unpack[u].push_back(Fp8SideRun{j, count, run.slot_off + (a - run.flat_off), b - a});
                    if (r == z->lrank) f->pack[u].push_back(Fp8SideRun{j, z->shard_off[u] + run.shard_rel + (a - lo), count, b - a});
                    count += b - a;
                }
            }
            f->side_len[u] = std::max(f->side_len[u], count);
        }
        f->max_shard = std::max(f->max_shard, z->shard_numel[u]);
        f->max_slot = std::max(f->max_slot, z->slot_numel[u]); f->max_side = std::max(f->max_side, f->side_len[u]);
    }
    // this rank's part of every matrix in a slot (the runs its gathers fill), its rows contiguous there
    size_t nf = f->mats.size();
    f->part_at.assign(nf, 0); f->part_row0.assign(nf, 0); f->part_rows.assign(nf, 0); f->part_fq.assign(nf, 0); f->part_ft.assign(nf, 0);
    f->factors = 0;
    std::vector<size_t> fsum(z->n_units, 0);
    for (size_t k = 0; k < nf; k++) {
        const Fp8GatherMatrix& M = f->mats[k];
        int u = f->mat_unit[k];
        size_t end = M.off + (size_t)M.rows * M.cols, lo = end, at = 0, n = 0;
        for (int pass = 0; pass < 2; pass++)
            for (const ShardRun& r : z->runs[u]) {
                size_t a = std::max(M.off, r.flat_off), b = std::min(end, r.flat_off + r.numel);
                if (!zero_run_mine(z, r) || a >= b) continue;
                if (pass == 0) {
                    if (a < lo) { lo = a; at = r.slot_off + (a - r.flat_off); }
                    n += b - a;
                } else {
                    ENSURE(r.slot_off + (a - r.flat_off) - at == a - lo, "internal error: --fp8-gather: matrix %zu of unit %d is not contiguous "
                           "in its slot", k, u);
                }
            }
        size_t expert = (size_t)M.seg_rows * M.cols;
        ENSURE(n > 0 && (lo - M.off) % expert == 0 && n % expert == 0 && at % 8 == 0, "internal error: --fp8-gather: matrix %zu of unit "
               "%d: %zu elements from %zu at slot position %zu, not whole experts of %zu at a 16-byte boundary", k, u, n, lo - M.off, at, expert);
        f->part_at[k] = at; f->part_row0[k] = (lo - M.off) / M.cols; f->part_rows[k] = n / M.cols;
        if (!block) continue;
        size_t nseg = f->part_rows[k] / M.seg_rows;
        f->part_fq[k] = fsum[u]; fsum[u] += nseg * fp8g_blk128_count(M.seg_rows, M.cols);   // (q: F rows of k = C)
        f->part_ft[k] = fsum[u]; fsum[u] += nseg * fp8g_blk128_count(M.cols, M.seg_rows);   // (qt: C rows of k = F)
        f->factors = std::max(f->factors, fsum[u]);
    }
}

// the device bytes of the store's --fp8-gather buffers (zero_enable_fp8_gather allocates them, in this order): the
// amax, scale and 1/s of every group, one unit's code piece (encoded just before its gather), the byte slot, one unit's
// side piece (BF16) and the S received, the matrices' table (3 size_t each) and, block, the factors of the two working
// slots. layers: the groups and matrices that many times (--dry-run's plan, parallel/memory_plan.h, from one layer's
// layout)
static inline long double fp8g_device_bytes(const Fp8GatherLayout* f, int S, size_t floatx = 2, long double layers = 1) {
    long double per = 3.0L * f->groups * sizeof(float) + 3.0L * f->mats.size() * sizeof(size_t);
    return layers * per + f->max_shard + f->max_slot + (long double)f->max_side * (1 + S) * floatx + 2.0L * f->factors * sizeof(float);
}
