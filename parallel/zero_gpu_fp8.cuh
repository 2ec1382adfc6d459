/*
 * zero_gpu_fp8.cuh — the device store's --fp8-gather: the blocks' FP8 matrices gathered as E4M3 codes and
 * decoded into the working slot (the section below). Part of parallel/zero_gpu.cuh (included after the store's
 * set-up), moved here whole.
 */
#pragma once
// ---------------------------------------------------------------------------------------------
// --fp8-gather on the device (the CPU path's scheme, parallel/zero_fp8.h, with its GPU kernels). Once
// per step, before the first gather: the amax of every scale group over this rank's piece of the five
// matrices (from the BF16 shard the model would read), max-reduced in the shard group on the device; the
// scales (current and block from it; delayed: the weight slot's history scale, the model's); the codes
// of this rank's shard of each unit, at their shard positions in a byte piece as long as the shard, and
// its non-FP8 elements (norms, router) packed as BF16. A gather of a block's unit is then a byte
// all-gather of the codes per run (into the unit's flat order) and a small BF16 one, decoded into the
// unit's BF16 slot on the communication stream. The model quantises that slot as
// always, with the same scales, and gets the same codes: the losses are those of --fp8 without it. The
// weight slots' amax is set to the true tensor amax at the end of the step (zero_fp8_amax_reduce).

// Calls fn(a, b, pos) for each part [a, b) of matrix M of unit u that this rank holds; pos: where a lies in
// the rank's shard of the unit
template <typename Fn> static inline void fp8g_my_parts(const Zero* z, const Fp8GatherMatrix* M, int u, Fn fn) {
    size_t end = M->off + (size_t)M->rows * M->cols;
    zero_unit_pieces(z, u, z->lrank, [&](size_t lo, size_t hi, size_t at) {
        size_t a = M->off > lo ? M->off : lo, b = end < hi ? end : hi;
        if (a < b) fn(a, b, at + (a - lo));
    });
}

// Sets it up after zero_init, for a model with FP8 on. Returns 0 when there is nothing to gather (S = 1).
static inline int zero_enable_fp8_gather(ZeroGpu* zg) {
    Zero* z = &zg->z;
    DbrxGPU* m = zg->model;
    ZeroGpuFp8* f = &zg->fp8;
    if (z->S == 1 || !fp8_on(&m->fp8)) return 0;   // (S = 1, also under EP: every rank holds its units whole)
    const DbrxConfig* c = &m->cfg;
    f->block = m->fp8.cfg.recipe == FP8_BLOCK;
    f->groups = 0;
    f->mats.clear(); f->mat_unit.clear(); f->mat_slot.clear();
    f->unit_mats.assign(z->n_units, {});
    std::vector<std::vector<std::pair<size_t, size_t>>> plain(z->n_units);   // per unit: non-FP8 tensors (off, numel)
    for (const ParamInfo& p : m->table) {
        int l = dbrx_unit_layer(p.unit, c);
        if (l < 0) continue;   // the embedding and the head: no FP8 GEMM, gathered in BF16
        int lin = fp8g_linear_of(&p);
        if (lin < 0) { plain[p.unit].push_back({p.offset, p.numel}); continue; }
        int seg_rows = fp8g_seg_rows(&p, lin, c);
        Fp8GatherMatrix M = fp8g_matrix(p.offset, p.rows, p.cols, seg_rows, f->groups, f->block, NULL);
        f->groups += M.groups;
        f->unit_mats[p.unit].push_back((int)f->mats.size());
        f->mats.push_back(M);
        f->mat_unit.push_back(p.unit);
        f->mat_slot.push_back(fp8_slot(&m->fp8, l, lin, FP8_OP_W));
    }
    // per unit of a block: the code piece (its shard's length in bytes) and the side runs of the norms and
    // the router, of every member of the unit's gather group (the shard group; a block's experts under EP:
    // the expert shard group, whose runs land in the compact slot of this rank's experts, ShardRun.slot_off)
    f->codes_off.assign(z->n_units, 0); f->side_off.assign(z->n_units, 0); f->side_len.assign(z->n_units, 0);
    f->pack.assign(z->n_units, {}); f->unpack.assign(z->n_units, {});
    size_t codes_total = 0, side_total = 0, max_slot = 0, max_side = 0;
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
        f->codes_off[u] = codes_total; codes_total += z->shard_numel[u];
        f->side_off[u] = side_total; side_total += f->side_len[u];
        max_slot = std::max(max_slot, z->slot_numel[u]); max_side = std::max(max_side, f->side_len[u]);
    }
    auto take = [&](void** p, size_t b) { *p = (void*)deviceAlloc(char, b); zg->allocations.push_back(*p); zg->device_bytes += b; };
    take((void**)&f->amax, f->groups * sizeof(float)); take((void**)&f->scale, f->groups * sizeof(float));
    take((void**)&f->inv, f->groups * sizeof(float)); take((void**)&f->sat, sizeof(unsigned long long));
    take((void**)&f->codes_send, codes_total); take((void**)&f->codes_recv, max_slot);
    take((void**)&f->side_send, side_total * sizeof(floatX)); take((void**)&f->side_recv, max_side * z->S * sizeof(floatX));
    std::vector<size_t> table;
    for (size_t k = 0; k < f->mats.size(); k++) table.insert(table.end(), {(size_t)f->mat_slot[k], f->mats[k].group0, f->mats[k].groups});
    take((void**)&f->mat_table, table.size() * sizeof(size_t));
    cudaCheck(cudaMemcpy(f->mat_table, table.data(), table.size() * sizeof(size_t), cudaMemcpyHostToDevice));
    cudaCheck(cudaEventCreateWithFlags(&f->codes_ready, cudaEventDisableTiming));
    m->fp8.cfg.weights_quantized = 1;   // per tensor: the model quantises the weights with the agreed scales (zero_fp8_prepare)
    f->on = 1;
    f->ready = 0;
    return 1;
}

// This step's scales and codes (collective over the shard group; the first gather of the step calls it)
static inline void zero_fp8_prepare(ZeroGpu* zg) {
    Zero* z = &zg->z;
    ZeroGpuFp8* f = &zg->fp8;
    Fp8GPU* mf = &zg->model->fp8;
    cudaStream_t cs = zg->compute;
    // 1. the amax of our piece of every matrix (block: of every 128x128 block), from the BF16 shard
    cudaCheck(cudaMemsetAsync(f->amax, 0, f->groups * sizeof(float), cs));
    for (size_t k = 0; k < f->mats.size(); k++) {
        int u = f->mat_unit[k];
        fp8g_my_parts(z, &f->mats[k], u, [&](size_t a, size_t b, size_t pos) {
            fp8g_piece_amax_gpu(&f->mats[k], a, b, zg->master_bf16 + z->shard_off[u] + pos, f->amax, f->block, cs);
        });
    }
    // 2. the true amaxes on every rank of the shard group
    cudaStream_t comm = zero_comm_stream(zg);
    cudaCheck(cudaEventRecord(zg->comm_done, cs));
    cudaCheck(cudaStreamWaitEvent(comm, zg->comm_done, 0));
    comm_all_reduce_max_bits_dev(&z->shard, (unsigned int*)f->amax, f->groups);
    cudaCheck(cudaEventRecord(zg->comm_done, comm));
    cudaCheck(cudaStreamWaitEvent(cs, zg->comm_done, 0));
    // 3. the scales the model would use for the whole weight: from the amaxes (block: margin 0; current,
    // and delayed before its history has an entry: --fp8-margin), in one launch over every group; then,
    // delayed, each weight slot's history scale where it has one (per tensor: group k is matrix k)
    fp8g_scales_gpu(f->amax, f->scale, f->inv, f->groups, f->block ? 0 : mf->cfg.margin, cs);
    if (mf->cfg.recipe == FP8_DELAYED) {
        size_t n = f->mats.size();
        std::vector<float> host(2 * n);
        bool all = true;
        for (size_t k = 0; k < n; k++) {
            const Fp8Meta& meta = mf->metas[f->mat_slot[k]];
            float sc = g_debug_hooks.plant == PLANT_FP8_GATHER_SCALE ? 2 * meta.scale : meta.scale;   // (the tests' planted bug: a wrong scale)
            host[k] = sc; host[n + k] = 1.0f / sc;
            all = all && meta.filled > 0;
        }
        // the histories fill together (every slot steps at once), so it is all of them or none of them
        if (all) {
            cudaCheck(cudaMemcpyAsync(f->scale, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, cs));
            cudaCheck(cudaMemcpyAsync(f->inv, host.data() + n, n * sizeof(float), cudaMemcpyHostToDevice, cs));
            cudaCheck(cudaStreamSynchronize(cs));   // (host is a local)
        }
    }
    // the model's weight slots get the agreed per-tensor scales: it quantises the gathered weights with them
    // (Fp8Config.weights_quantized; under EP its own amax would be its experts' only)
    if (!f->block) LAUNCH(fp8g_weight_scales_kernel, (int)f->mats.size(), 32, 0, cs, mf->scale, f->mat_table, f->scale);
    // 4. our codes at their shard positions, and the norms and router as BF16
    for (size_t k = 0; k < f->mats.size(); k++) {
        int u = f->mat_unit[k];
        fp8g_my_parts(z, &f->mats[k], u, [&](size_t a, size_t b, size_t pos) {
            fp8g_piece_encode_gpu(&f->mats[k], a, b, zg->master_bf16 + z->shard_off[u] + pos, f->scale,
                                  f->codes_send + f->codes_off[u] + pos, f->sat, f->block, cs);
        });
    }
    for (int u = 0; u < z->n_units; u++)
        for (const Fp8SideRun& r : f->pack[u])
            cudaCheck(cudaMemcpyAsync(f->side_send + f->side_off[u] + r.dst, zg->master_bf16 + r.src, r.n * sizeof(floatX),
                                      cudaMemcpyDeviceToDevice, cs));
    cudaCheck(cudaEventRecord(f->codes_ready, cs));
    f->ready = 1;
}

// unit u of a block into `slot` on the communication stream: the codes and the side pieces gathered in the
// unit's group (a block's experts under EP: the expert shard group, into the compact slot of this rank's
// experts), decoded
static inline void zero_fp8_gather_unit(ZeroGpu* zg, int u, int slot) {
    Zero* z = &zg->z;
    ZeroGpuFp8* f = &zg->fp8;
    cudaStream_t comm = zero_comm_stream(zg);
    if (!f->ready) zero_fp8_prepare(zg);
    cudaCheck(cudaStreamWaitEvent(comm, f->codes_ready, 0));
    CommGroup* g = zero_unit_group(z, u);
    size_t sl = f->side_len[u];
    for (const ShardRun& r : z->runs[u])   // each run's codes into its place in the slot
        if (zero_run_mine(z, r))
            comm_all_gather(g, f->codes_send + f->codes_off[u] + r.shard_rel, f->codes_recv + r.slot_off, r.chunk, COMM_BYTE);
    if (sl) comm_all_gather(g, f->side_send + f->side_off[u], f->side_recv, sl, COMM_BF16);
    for (const ShardRun& r : z->runs[u]) {   // each run's part of each matrix, decoded at its place in the slot
        if (!zero_run_mine(z, r)) continue;
        for (int k : f->unit_mats[u]) {
            const Fp8GatherMatrix& M = f->mats[k];
            size_t a = std::max(M.off, r.flat_off), b = std::min(M.off + (size_t)M.rows * M.cols, r.flat_off + r.numel);
            if (a >= b) continue;
            size_t at = r.slot_off + (a - r.flat_off);
            fp8g_decode_bf16_gpu(&M, a, b, f->codes_recv + at, f->inv, zg->work[slot] + at, f->block, comm);
        }
    }
    for (const Fp8SideRun& r : f->unpack[u])
        cudaCheck(cudaMemcpyAsync(zg->work[slot] + r.dst, f->side_recv + (size_t)r.rank * sl + r.src, r.n * sizeof(floatX),
                                  cudaMemcpyDeviceToDevice, comm));
}
