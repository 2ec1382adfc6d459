/*
 * zero_gpu_fp8.cuh — the device store's --fp8-gather: the blocks' FP8 matrices gathered as E4M3 codes into the working
 * slot, where the model's FP8 GEMMs read them as they are (the section below; where things go: zero_fp8_layout.h).
 * Part of parallel/zero_gpu.cuh (included after the store's set-up).
 */
#pragma once
// ---------------------------------------------------------------------------------------------
// --fp8-gather on the device (the CPU path's scheme, parallel/zero_fp8.h, with its GPU kernels). Once
// per step, before the first gather: the amax of every scale group over this rank's piece of the five
// matrices (from the BF16 shard the model would read), max-reduced in the shard group on the device; the
// scales (current and block from it; delayed: the weight slot's history scale, the model's); the codes
// of this rank's shard of a unit, at their shard positions in a byte piece as long as the unit's shard, and
// its non-FP8 elements (norms, router) packed as BF16, encoded on the communication stream just before each gather of
// the unit (zero_fp8_encode_unit: one unit's piece in memory, not the whole shard's). A gather of a block's unit is
// then a byte all-gather of the codes per run and a small BF16 one, on the communication stream.
// The codes are used as they are (zero_fp8_place_unit): each matrix's codes q (rows, cols) lie in the first half of
// the bytes its BF16 values would take in the working slot, and the model's FP8 GEMMs read them there (Fp8GPU.given,
// fp8_weight_gpu), with the agreed factors; the transposed copy dgrad reads is made from q into the second half at its
// first use (fp8_given_operand). So no weight is quantised by the model: each rank encodes its 1/S piece (its shard).
// The codes and factors are the very bytes the model's own quantisation of the BF16 weights writes (same scales:
// test/test_zero_fp8_cuda.cpp), so the losses are those of --fp8 without the gather, bit for bit. Generation's GEMMs are
// BF16 (Fp8GPU.bf16_weights): for them the codes are decoded into the slot's BF16 (fp8g_decode_bf16_gpu), and a slot
// holding the other form is gathered again. A weight's saturation count is its owner's encode's, once per step (this
// rank's piece; the CPU path sums the pieces over the shard group). The weight slots' amax is set to the true tensor
// amax at the end of the step (zero_fp8_amax_reduce).

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
    Fp8GatherLayout* L = &f->lay;
    fp8g_device_layout(L, z, m->table, &m->cfg, m->fp8.cfg.recipe == FP8_BLOCK);
    f->mat_slot.clear();
    for (size_t k = 0; k < L->mats.size(); k++) {
        f->mat_slot.push_back(fp8_slot(&m->fp8, L->mat_layer[k], L->mat_lin[k], FP8_OP_W));
        if (!L->block) continue;
        std::vector<int> segs(L->part_rows[k] / L->mats[k].seg_rows, L->mats[k].seg_rows);   // (the host count = the CUDA one)
        ENSURE(L->part_ft[k] - L->part_fq[k] == fp8_block_scale_count(FP8Q_WEIGHT, false, segs, L->mats[k].cols),
               "internal error: --fp8-gather: matrix %zu's factor count", k);
    }
    // the buffers, in fp8g_device_bytes' order (--dry-run's plan counts them)
    size_t before = zg->device_bytes;
    auto take = [&](void** p, size_t b) { *p = (void*)deviceAlloc(char, b); zg->allocations.push_back(*p); zg->device_bytes += b; };
    take((void**)&f->amax, L->groups * sizeof(float)); take((void**)&f->scale, L->groups * sizeof(float));
    take((void**)&f->inv, L->groups * sizeof(float));
    take((void**)&f->codes_send, L->max_shard); take((void**)&f->codes_recv, L->max_slot);
    take((void**)&f->side_send, L->max_side * sizeof(floatX)); take((void**)&f->side_recv, L->max_side * z->S * sizeof(floatX));
    std::vector<size_t> table;
    for (size_t k = 0; k < L->mats.size(); k++) table.insert(table.end(), {(size_t)f->mat_slot[k], L->mats[k].group0, L->mats[k].groups});
    take((void**)&f->mat_table, table.size() * sizeof(size_t));
    cudaCheck(cudaMemcpy(f->mat_table, table.data(), table.size() * sizeof(size_t), cudaMemcpyHostToDevice));
    for (int i = 0; i < 2; i++) {
        f->factors[i] = nullptr;
        if (L->factors) take((void**)&f->factors[i], L->factors * sizeof(float));
        f->slot_codes[i] = -1;
    }
    size_t planned = (size_t)fp8g_device_bytes(L, z->S, sizeof(floatX));
    ENSURE(zg->device_bytes - before == planned, "internal error: --fp8-gather's buffers: %zu bytes allocated, %zu planned",
           zg->device_bytes - before, planned);
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
    cudaCheck(cudaMemsetAsync(f->amax, 0, f->lay.groups * sizeof(float), cs));
    for (size_t k = 0; k < f->lay.mats.size(); k++) {
        int u = f->lay.mat_unit[k];
        fp8g_my_parts(z, &f->lay.mats[k], u, [&](size_t a, size_t b, size_t pos) {
            fp8g_piece_amax_gpu(&f->lay.mats[k], a, b, zg->master_bf16 + z->shard_off[u] + pos, f->amax, f->lay.block, cs);
        });
    }
    // 2. the true amaxes on every rank of the shard group
    cudaStream_t comm = zero_comm_stream(zg);
    cudaCheck(cudaEventRecord(zg->comm_done, cs));
    cudaCheck(cudaStreamWaitEvent(comm, zg->comm_done, 0));
    comm_all_reduce_max_bits_dev(&z->shard, (unsigned int*)f->amax, f->lay.groups);
    cudaCheck(cudaEventRecord(zg->comm_done, comm));
    cudaCheck(cudaStreamWaitEvent(cs, zg->comm_done, 0));
    // 3. the scales the model would use for the whole weight: from the amaxes (block: margin 0; current,
    // and delayed before its history has an entry: --fp8-margin), in one launch over every group; then,
    // delayed, each weight slot's history scale where it has one (per tensor: group k is matrix k)
    fp8g_scales_gpu(f->amax, f->scale, f->inv, f->lay.groups, f->lay.block ? 0 : mf->cfg.margin, cs);
    if (mf->cfg.recipe == FP8_DELAYED) {
        size_t n = f->lay.mats.size();
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
    if (!f->lay.block)   // (and the factor its GEMMs read: the codes are not quantised by the model)
        LAUNCH(fp8g_weight_scales_kernel, (int)f->lay.mats.size(), 32, 0, cs, mf->scale, mf->scale_inv, FP8_SINV_STRIDE, f->mat_table, f->scale, f->inv);
    f->encoded.assign(z->n_units, 0);   // (4. each unit's codes: zero_fp8_encode_unit, just before its gathers)
    cudaCheck(cudaEventRecord(f->codes_ready, cs));
    f->ready = 1;
}

// matrix k's part in `slot`: its codes where its BF16 values would be (q, then room for qt), its factors (block)
static inline Fp8Buf zero_fp8_part_buf(ZeroGpu* zg, int k, int slot) {
    ZeroGpuFp8* f = &zg->fp8;
    Fp8Buf b;
    b.q = (__nv_fp8_storage_t*)(zg->work[slot] + f->lay.part_at[k]);
    b.qt = b.q + f->lay.part_rows[k] * f->lay.mats[k].cols;
    b.sinv = f->lay.block ? f->factors[slot] + f->lay.part_fq[k] : nullptr;
    b.sinv_t = f->lay.block ? f->factors[slot] + f->lay.part_ft[k] : nullptr;
    return b;
}
// run r of unit u gathered straight into matrix k's codes: it lies within the matrix's part, and all the group's pieces
// (padding included) land within the bytes of the part's BF16 values (what is past q is qt's room, written later)
static inline __nv_fp8_storage_t* zero_fp8_direct(ZeroGpu* zg, int u, int slot, const ShardRun& r, const CommGroup* g) {
    ZeroGpuFp8* f = &zg->fp8;
    for (int k : f->lay.unit_mats[u]) {
        const Fp8GatherMatrix& M = f->lay.mats[k];
        size_t lo = M.off + f->lay.part_row0[k] * M.cols, n = f->lay.part_rows[k] * M.cols;
        if (r.flat_off >= lo && r.flat_off + r.numel <= lo + n && r.slot_off - f->lay.part_at[k] + (size_t)g->size * r.chunk <= 2 * n)
            return zero_fp8_part_buf(zg, k, slot).q + (r.slot_off - f->lay.part_at[k]);
    }
    return nullptr;
}

// 4. unit u's piece on this rank, on the communication stream right before its all-gathers: the codes at their shard
// positions (one unit's piece: the stream's order keeps the next unit's encode from overwriting it before this unit's
// all-gather has read it; every group of the store gathers on that one stream) and the norms and router as BF16. Its
// saturations are counted at the step's first encode of the unit (its forward gather), into each weight's slot.
static inline void zero_fp8_encode_unit(ZeroGpu* zg, int u, cudaStream_t comm) {
    Zero* z = &zg->z;
    ZeroGpuFp8* f = &zg->fp8;
    Fp8GPU* mf = &zg->model->fp8;
    bool first = !f->encoded[u];
    f->encoded[u] = 1;
    for (int k : f->lay.unit_mats[u])
        fp8g_my_parts(z, &f->lay.mats[k], u, [&](size_t a, size_t b, size_t pos) {
            fp8g_piece_encode_gpu(&f->lay.mats[k], a, b, zg->master_bf16 + z->shard_off[u] + pos, f->scale, f->codes_send + pos,
                                  first ? mf->sat + f->mat_slot[k] : nullptr, f->lay.block, comm);
        });
    for (const Fp8SideRun& r : f->lay.pack[u])
        cudaCheck(cudaMemcpyAsync(f->side_send + r.dst, zg->master_bf16 + r.src, r.n * sizeof(floatX), cudaMemcpyDeviceToDevice, comm));
}

// unit u of a block into `slot` on the communication stream: the codes and the side pieces gathered in the
// unit's group (a block's experts under EP: the expert shard group, into the compact slot of this rank's
// experts). The codes stay codes (the model's FP8 GEMMs read them: Fp8GPU.given), or, for generation
// (Fp8GPU.bf16_weights), are decoded to BF16.
static inline void zero_fp8_gather_unit(ZeroGpu* zg, int u, int slot) {
    Zero* z = &zg->z;
    ZeroGpuFp8* f = &zg->fp8;
    Fp8GPU* mf = &zg->model->fp8;
    cudaStream_t comm = zero_comm_stream(zg);
    if (!f->ready) zero_fp8_prepare(zg);
    cudaCheck(cudaStreamWaitEvent(comm, f->codes_ready, 0));
    CommGroup* g = zero_unit_group(z, u);
    const bool codes = !mf->bf16_weights;
    fp8_given_forget(mf, zg->work[slot], zg->work[slot] + z->work_numel);   // (what the slot held is gone)
    zero_fp8_encode_unit(zg, u, comm);
    size_t sl = f->lay.side_len[u];
    for (const ShardRun& r : z->runs[u])   // each run's codes into its place: a matrix's codes, or the byte slot
        if (zero_run_mine(z, r)) {
            __nv_fp8_storage_t* direct = codes ? zero_fp8_direct(zg, u, slot, r, g) : nullptr;
            comm_all_gather(g, f->codes_send + r.shard_rel, direct ? direct : f->codes_recv + r.slot_off, r.chunk, COMM_BYTE);
        }
    if (sl) comm_all_gather(g, f->side_send, f->side_recv, sl, COMM_BF16);
    for (const ShardRun& r : z->runs[u]) {   // each run's part of each matrix from the byte slot: copied, or decoded
        if (!zero_run_mine(z, r) || (codes && zero_fp8_direct(zg, u, slot, r, g))) continue;
        for (int k : f->lay.unit_mats[u]) {
            const Fp8GatherMatrix& M = f->lay.mats[k];
            size_t a = std::max(M.off, r.flat_off), b = std::min(M.off + (size_t)M.rows * M.cols, r.flat_off + r.numel);
            if (a >= b) continue;
            size_t at = r.slot_off + (a - r.flat_off);
            if (codes)
                cudaCheck(cudaMemcpyAsync(zero_fp8_part_buf(zg, k, slot).q + (at - f->lay.part_at[k]), f->codes_recv + at, b - a,
                                          cudaMemcpyDeviceToDevice, comm));
            else
                fp8g_decode_bf16_gpu(&M, a, b, f->codes_recv + at, f->inv, zg->work[slot] + at, f->lay.block, comm);
        }
    }
    if (codes)   // the factors of each matrix's part, and the model told where its codes are
        for (int k : f->lay.unit_mats[u]) {
            const Fp8GatherMatrix& M = f->lay.mats[k];
            int rows = (int)f->lay.part_rows[k];
            Fp8Buf b = zero_fp8_part_buf(zg, k, slot);
            if (f->lay.block) {
                size_t g0 = M.group0 + f->lay.part_row0[k] / M.seg_rows * M.row_blocks * M.col_blocks;
                Fp8GatherMatrix P = fp8g_matrix(M.off + f->lay.part_row0[k] * M.cols, rows, M.cols, M.seg_rows, g0, 1, NULL);
                fp8g_factors_gpu(&P, f->inv, b.sinv, 1, comm);
            }
            fp8_given_add(mf, zg->work[slot] + f->lay.part_at[k], b, rows, M.cols, M.seg_rows);
        }
    f->slot_codes[slot] = codes ? 1 : 0;
    for (const Fp8SideRun& r : f->lay.unpack[u])
        cudaCheck(cudaMemcpyAsync(zg->work[slot] + r.dst, f->side_recv + (size_t)r.rank * sl + r.src, r.n * sizeof(floatX),
                                  cudaMemcpyDeviceToDevice, comm));
}
