"""kernel_cost.py — the global-memory bytes (read, written) and tensor-core FLOPs of each hand-written kernel, from
the arguments the emulator's work log records for its launch (SIMT_WORKLOG, test/simt/counters.h: pointers as
true/false, integers and floats by value, the FP8 structs as arrays) and its grid / dynamic shared memory.
predict.py costs a kernel at max(bytes / (HBM x HBM_FRACTION, or KERNEL_HBM_FRACTION of its name), mma FLOPs / (BF16 peak x MMA_SYNC_FRACTION)); a kernel
without a formula here costs its minimum launch time only ("no formula" in predict's table).

Every formula states what the kernel must read and write, each byte once (the DRAM traffic with a perfect cache):
the quantity the instrumented emulator counts ("rd", "wr", "mma" on each kernel line of a train_dbrx_emu_count
log, test/simt/bytecount.h). test/test_kernel_bytes.sh checks formula against count for every kernel of emulated
training steps (BF16, FP8, ZeRO-3, expert parallel); CHECK says how:
  exact   equal (up to SLACK bytes: a few scalars the formula leaves out, such as a histogram's counters)
  bound   data-dependent (data_dependent()): the count is at most the formula (a gather of rows by token id reads
          a repeated token's row once; the formula, each row, is the DRAM traffic without the cache hits; under
          expert parallelism the rows an expert receives are known on the device only: its padded segment is used)
Python 3, standard library only.
"""
import re

SLACK = 256          # bytes: scalars, counters and segment tables left out of a formula
# the share of the dense BF16 peak that the project's mma.sync flash kernels reach on Hopper, measured by make
# bench-gpu on an H200 (2026-11-26, dev/bench/results_gpu.md: B 8, T 4096, H 48, hd 128) on the 64-row kernels
# before issue 25 (forward 4 warps x 16 rows, backward dq + dk/dv): forward 19.5%, backward 15.8%; weighted by
# their FLOPs (backward 2.5 x forward) 1 / ((1 / 0.195 + 2.5 / 0.158) / 3.5) = 0.167.
# (FlashAttention-2 reaches about 35% of an H100: Shah et al., FlashAttention-3, 2024; what issue 25 aims at)
MMA_SYNC_FRACTION = 0.167
# How a new tiling moves that rate (PREDICTED, not measured): a flash kernel's time per mma FLOP is taken as a
# fixed part (softmax, exp, address arithmetic, latency: whatever the tiling does not change) plus its ldmatrix
# traffic at the shared-memory bandwidth, SMEM_BW = 128 B/clock/SM x 132 SMs x 1.755 GHz = 29.6 TB/s (H100 / H200
# SXM). Per FLOP: 1 / (peak x rate) = FIXED / peak + 1 / (SMEM_BW x r), r = the kernel's mma FLOPs per byte that
# its warps read from shared memory by ldmatrix (FLASH_FLOP_PER_SMEM_BYTE, from each kernel's loops: see there).
# FIXED is calibrated so that the kernels measured (fwd64, dq, dkv at dbrx-1b's FLOP shares 1 : 1.5 : 2) average
# MMA_SYNC_FRACTION; so each old kernel keeps about the measured rate and a new one moves by its r alone.
SMEM_BW_PER_PEAK = 29.6e12 / 989.4e12   # shared-memory bytes per dense-peak FLOP (H100 SXM; the H200's SMs are the same)
FLASH_FLOP_PER_SMEM_BYTE = {
    "fwd64": 16.0,       # 64-row forward (dev/cuda v3): per warp and 64-key tile K, V 256 hd B; S, PV 4096 hd FLOPs
    "fwd": 25.6,         # 128-row forward (model): the same K, V fragments serve two 16-row slices; Q re-read, 64 hd B
    "dq": 6144 / 448,    # dq: Q, dO 64 hd; K, V 256 hd; K again (dS K) 128 hd B per warp and tile; S, dP, dQ 6144 hd
    "dkv": 4096 / 320,   # dk/dv: K, V 64 hd; Q, dO twice (n- and k-major) 256 hd B per warp, 32-query tile; 4096 hd
    # 5-product backward (model), per warp and 32-query tile at hd 128: the dk/dv kernel's 320 hd B, then dQ: dS (A,
    # 2 KB) and half of K (64 hd B), and dS^T stored (1 KB); S^T, dP^T, dV, dK 4096 hd FLOPs + a quarter of dQ's 4096 hd
    "bwd5": 5120 * 128 / (384 * 128 + 2048 + 1024),
}
_OLD_SHARES = (("fwd64", 1.0), ("dq", 1.5), ("dkv", 2.0))
FLASH_FIXED = (sum(w for _, w in _OLD_SHARES) / MMA_SYNC_FRACTION
               - sum(w / (SMEM_BW_PER_PEAK * FLASH_FLOP_PER_SMEM_BYTE[k]) for k, w in _OLD_SHARES)) / sum(w for _, w in _OLD_SHARES)


# The wgmma forward (model/attention_wgmma_fwd.cuh) MEASURED: 271 TFLOP/s of causal FLOPs on an H100 SXM at DBRX-132B's
# attention shape (B 8, T 4096, H 48, KV 8, hd 128; dev/bench/results_gpu.md, 2026-11-27, dev/cuda/attention_wgmma v2),
# the mma.sync forward 221.5 in the same run. Its issued wgmma FLOPs there are 1.0467 x the causal ones (whole 64-key
# tiles for both warpgroups, one S product a block more: _flash_wgmma_fwd), so its tensor-core FLOPs run at
# 271 x 1.0467 / 989.4 of the peak. One shape measured: other shapes are predicted at the same share.
WGMMA_FWD_FRACTION = 271.0 * 1.0467 / 989.4
# Three warpgroups (192 query rows a block: the model's since session 62, dev/cuda/attention_wgmma v4) MEASURED against
# two on an H200 at dbrx-1b's attention (B 8, T 2048, H 8, KV 2, hd 128; dev/bench/results_gpu.md, 2026-11-30): 242.6
# against 211.9 TFLOP/s of causal FLOPs. Their issued FLOPs differ (_flash_wgmma_fwd's units: 1.1859 and 1.0932 x the
# causal ones there: 192-row blocks run more wholly masked tiles), so three warpgroups' issued FLOPs run
# 242.6 x 1.1859 / (211.9 x 1.0932) = 1.242 x faster than two's; one shape measured, applied to every shape
WGMMA_FWD_FRACTION_BY_NWG = {2: WGMMA_FWD_FRACTION, 3: WGMMA_FWD_FRACTION * 242.6 * 1.1859 / (211.9 * 1.0932)}


def flash_mma_fraction(kind):
    """the predicted share of the BF16 peak of a flash kernel's mma FLOPs (kind: fwd, fwd64, dq, dkv, bwd5)"""
    return 1.0 / (FLASH_FIXED + 1.0 / (SMEM_BW_PER_PEAK * FLASH_FLOP_PER_SMEM_BYTE[kind]))


# The wgmma backward (model/attention_wgmma_bwd.cuh: --attention-bwd auto's on Hopper, wgmma, wgmma-overlap) MEASURED: on
# an H100 SXM at dbrx-1b's attention shape (B 8, T 2048, H 8, KV 2, hd 128; dev/bench/results_gpu.md, 2026-11-28,
# dev/cuda/attention_wgmma_bwd -v 3 and -v 4, each kernel alone) the dk/dv kernel took 0.5008 ms, the dq kernel 0.3729, the
# overlapped dq 0.3521: 291.6, 293.7 and 323.3 TFLOP/s of the wgmma FLOPs they issue (_flash_wgmma_bwd's count), these
# shares of the peak. One shape measured: other shapes are predicted at the same share.
WGMMA_BWD = {"flash_attention_backward_dq_wgmma": 293.7 / 989.4,
             "flash_attention_backward_dq_wgmma_overlap": 323.3 / 989.4,
             "flash_attention_backward_dkv_wgmma": 291.6 / 989.4}


FLASH_FWD_BR = 128         # model/attention_flash.cuh: query rows of a forward block (4 warps x two 16-row slices)
FLASH_BR = FLASH_BC = 64   # query rows of a dq block / keys per tile (forward, dq)
FLASH_BQ = 32              # queries per tile of the dk/dv kernel
GRAD_NORM_BLOCKS = 256     # model/adamw.cuh


def _cdiv(a, b):
    return -(-a // b)


def _ln_fwd(a, g, x):   # (out, resid, mean, rstd, inp, add, weight, N, C, eps): inp (+ add) read, out (+ resid) written
    N, C = a[7], a[8]
    add = 1 if a[5] else 0
    return 2 * N * C * (1 + add) + 2 * C, 2 * N * C * (1 + add) + 8 * N


def _ln_bwd(a, g, x):   # (dinp, dinp_bf16, partial, dout, inp, weight, mean, rstd, N, C), one block per 32-row chunk:
    N, C = a[8], a[9]   # dout, inp read once; dinp += (FP32, read and written), its BF16 copy; a partial row per chunk
    return 4 * N * C + 2 * N * C + 2 * C + 8 * N + 4 * N * C, 4 * N * C + (2 * N * C if a[1] else 0) + 4 * g[0] * C


def _rope(a, g, x, backward):   # (qkv|dqkv, qkv_pre, cos, sin, B, T, H, KV, hd, clip): every head's row, T rows of cos/sin
    B, T, H, KV, hd, clip = a[4:10]
    n = 2 * B * T * (H + 2 * KV) * hd
    pre = n if backward and clip >= 0 else 0   # the backward reads qkv_pre only to zero the clipped values' gradient
    return n + pre + 2 * 4 * T * (hd // 2), n


def _flash_hd(smem, kind):   # head_dim from the launch's dynamic shared memory (the launchers' flash_*_smem<HD>)
    if kind == "bwd5":
        return (smem - 4 * FLASH_BQ * 4 - FLASH_BQ * (FLASH_BC + 8) * 2) // ((2 * FLASH_BC + 4 * FLASH_BQ) * 2) - 8
    if kind == "fwd":
        return smem // ((FLASH_FWD_BR + 4 * FLASH_BC) * 2) - 8
    if kind == "dq":
        return smem // ((2 * FLASH_BR + 4 * FLASH_BC) * 2) - 8
    return (smem - 4 * FLASH_BQ * 4) // ((2 * FLASH_BC + 4 * FLASH_BQ) * 2) - 8


def _flash_wgmma_fwd(item, a):   # flash_attention_forward_wgmma (out, lse, qkv, T, H, KV), grid (T / BR, H, B), NWG
    T, H, KV = a[3], a[4], a[5]   # warpgroups of 128 threads, BR = 64 NWG query rows; 3 K/V buffers: smem (BR + 6 64) hd 2
    B = item["grid"][2]           # + 1024. Reads every row of q, k, v; writes out and lse. Per block each warpgroup issues S
    nwg = item["block"][0] // 128   # for its ntiles + 1 key tiles (the last again, masked) and P V for ntiles: 2 64 64 hd each
    br = 64 * nwg
    hd = (item["smem"] - 1024) // ((br + 6 * 64) * 2)
    units = sum(nwg * (2 * ((min((qt + 1) * br, T) - 1) // 64 + 1) + 1) for qt in range(_cdiv(T, br)))
    return (2 * B * T * (H + 2 * KV) * hd, 2 * B * T * H * hd + 4 * B * H * T), 2 * 64 * 64 * hd * units * B * H


def _flash_wgmma_bwd(item, a, base):   # --attention-bwd wgmma | wgmma-overlap (model/attention_wgmma_bwd.cuh), after the D kernel
    T, H, KV = a[-3], a[-2], a[-1]       # args ..., T, H, KV; smem 1024 hd + 2048 (dq: Q, dO 128 rows, 2 K/V buffers; dk/dv:
    hd = (item["smem"] - 2048) // (1280 if base.endswith("_overlap") else 1024)   # K, V 128 keys, 2 Q, dO) or 1280 hd + 2048
    qkv, o, rows = 2 * T * (H + 2 * KV) * hd, 2 * T * H * hd, 4 * H * T    # (the overlapped dq's 3 K/V buffers), per sequence
    unit = 2 * 64 * 64 * hd   # one 64 x 64 x hd wgmma product of a warpgroup
    if base == "flash_attention_backward_dkv_wgmma":   # grid (T / 128 key tiles, KV, B): reads q, k, v, dout, lse, D; writes
        B = item["grid"][2]                            # dk, dv. Per block, its 2 warpgroups over every 64-query tile of the
        nqt = _cdiv(T, 64)                             # group's heads from the block's first key on: S^T, dP^T, dV, dK
        units = sum(2 * 4 * (H // KV) * (nqt - 2 * kt) for kt in range(_cdiv(T, 128)))
        return (B * (qkv + o + 2 * rows), B * 2 * T * 2 * KV * hd), unit * units * B * KV
    # dq, grid (H, B, T / 128 query tiles): reads q, k, v, dout, lse, D; writes dq. Per block both warpgroups over the key
    # tiles up to its last row: S, dP, dQ each; overlapped: S, dP once more (the last tile's again, masked)
    B = item["grid"][1]
    extra = 1 if base.endswith("_overlap") else 0
    units = sum(2 * (3 * nt + 2 * extra) for nt in ((min((qt + 1) * 128, T) - 1) // 64 + 1 for qt in range(_cdiv(T, 128))))
    return (B * (qkv + o + 2 * rows), B * o), unit * units * B * H


def _flash(item, a, kind):   # flash_attention_*_kernel<HD>: causal; grid (tiles, heads, B), the backward pair's (heads, B,
    T, H, KV = a[-3], a[-2], a[-1]   # tiles); args ..., T, H, KV
    pair = item["name"].startswith(("flash_attention_backward_dq_kernel", "flash_attention_backward_dkv_kernel"))
    B = item["grid"][1] if pair else item["grid"][2]
    hd = _flash_hd(item["smem"], kind)
    qkv = 2 * B * T * (H + 2 * KV) * hd     # q, k and v: every row of every head is needed
    o = 2 * B * T * H * hd                   # out / dout (BF16)
    rows = 4 * B * H * T                     # lse / D (FP32)
    nq = _cdiv(T, FLASH_BR)
    if kind == "fwd":    # S = Q K^T, O += P V per (16-row slice, key tile) pair: the block's key tiles up to its last
        pairs = 0         # row, of which a slice takes those that start at or before its own last row
        for qt in range(_cdiv(T, FLASH_FWD_BR)):
            ntiles = (min((qt + 1) * FLASH_FWD_BR, T) - 1) // FLASH_BC + 1
            pairs += sum(min(ntiles, (qt * FLASH_FWD_BR + 16 * i + 15) // FLASH_BC + 1) for i in range(FLASH_FWD_BR // 16))
        return (qkv, o + rows), 2 * 2 * 16 * FLASH_BC * hd * B * H * pairs
    if kind == "dq":     # reads q, k, v, dout, out (D = rowsum(dout out)), lse; writes dq and D; S, dP, dQ per pair
        return (qkv + 2 * o + rows, 2 * B * T * H * hd + rows), 3 * 2 * FLASH_BR * FLASH_BC * hd * B * H * nq * (nq + 1) // 2
    # dkv: reads q, k, v, dout, lse, D; writes dk, dv; S^T, dP^T, dV, dK per (key tile, 32-query tile from its diagonal)
    tiles = sum(_cdiv(T - j * FLASH_BC, FLASH_BQ) for j in range(_cdiv(T, FLASH_BC)))
    if kind == "dkv":
        return (qkv + o + 2 * rows, 2 * B * T * 2 * KV * hd), 4 * 2 * FLASH_BC * FLASH_BQ * hd * B * H * tiles
    # bwd5 (args dqkv, dq_acc, dq_sem, dout, lse, D, qkv, T, H, KV): the dk/dv kernel's reads and writes, and dq written
    # (BF16); the FP32 sums of the query tiles with more than one key tile (rows 64 ..) and their semaphores written
    # (each read only after an earlier block of the launch wrote it: not a read); a 5th product, dQ = dS K
    acc_rows, nsem = max(0, T - 2 * FLASH_BQ), max(0, _cdiv(T, FLASH_BQ) - 2)
    wr = 2 * B * T * (H + 2 * KV) * hd + 4 * B * H * acc_rows * hd + 4 * B * H * nsem
    return (qkv + o + 2 * rows, wr), 5 * 2 * FLASH_BC * FLASH_BQ * hd * B * H * tiles


def _flash_cp(item, a, kind):   # flash_attention_*_cp_kernel<HD>: a chunk pair; args ..., T, H, KV, [Tk, qrow0, nq, full]
    T, H, KV, (Tk, _, nq, full) = a[-4], a[-3], a[-2], a[-1]
    B = item["grid"][2]
    hd = _flash_hd(item["smem"], kind)
    q, kv = 2 * B * nq * H * hd, 2 * B * Tk * 2 * KV * hd   # the pair's query rows (BF16) and its K|V block
    o, rows = 2 * B * nq * H * hd, 4 * B * H * nq
    if kind == "fwd":    # per 128-query tile: every key tile (full) or those up to its last row (causal, as _flash)
        pairs = 0
        for qt in range(_cdiv(nq, FLASH_FWD_BR)):
            ntiles = _cdiv(Tk, FLASH_BC) if full else (min((qt + 1) * FLASH_FWD_BR, nq) - 1) // FLASH_BC + 1
            pairs += sum(ntiles if full else min(ntiles, (qt * FLASH_FWD_BR + 16 * i + 15) // FLASH_BC + 1)
                         for i in range(FLASH_FWD_BR // 16))
        return (q + kv, o + rows), 2 * 2 * 16 * FLASH_BC * hd * B * H * pairs
    # bwd5: q, dout, lse, D and the block read; dq's FP32 sums (the earlier pairs') read and written once (between the
    # key tiles of the launch they stay in L2, as _flash counts them), the block's FP32 dK|dV read and added to; 5
    # products per (key tile, 32-query tile it sees)
    nkt = _cdiv(Tk, FLASH_BC)
    tiles = nkt * _cdiv(nq, FLASH_BQ) if full else sum(_cdiv(nq - j * FLASH_BC, FLASH_BQ) for j in range(nkt))
    acc = 4 * B * H * nq * hd
    dkv = 4 * B * Tk * 2 * KV * hd
    return (2 * q + kv + 2 * rows + acc + dkv, acc + dkv), 5 * 2 * FLASH_BC * FLASH_BQ * hd * B * H * tiles


def _warp_attn(a, kind):   # attention_*_kernel (warp per row, head_dims the flash kernels lack): same traffic
    B, T, H, KV, hd = a[-5:]
    qkv, o, rows = 2 * B * T * (H + 2 * KV) * hd, 2 * B * T * H * hd, 4 * B * H * T
    if kind == "fwd":
        return qkv, o + rows
    if kind == "dq":
        return qkv + 2 * o + rows, 2 * B * T * H * hd + rows
    return qkv + o + 2 * rows, 2 * B * T * 2 * KV * hd


def _unit(name, default=4):   # gather_rows_kernel<int4> moves 16-byte units; <T> the element type's
    return 16 if "int4" in name else default


def _fp8_quantize(item, a, ctx):
    # fp8_quantize_kernel<MODE>(x, rows, cols, seg, fmt, scale, amax_in, margin, out): reads the segments' valid rows
    # of x (BF16; with valid counts, the padded expert layout, the routed rows: ctx "routed"), writes q and / or qt
    # (1 byte each), the dequantisation factors, max-accumulates the amax
    rows, cols, seg, out = a[1], a[2], a[3], a[8]
    mode = re.search(r"<(\w+)>", item["name"])
    mode = mode.group(1) if mode else ""
    q, qt, sinv, sinv_t, amax = out[0], out[1], out[2], out[3], out[4]
    nct = _cdiv(cols, 128)
    valid = ctx.get("routed", rows) if seg[1] and not ctx.get("ep") else rows   # (EP: the received rows are data)
    rd = 2 * valid * cols + (4 * (seg[2] + 1) if seg[0] else 0) + (4 * seg[2] if seg[1] else 0) + (4 if amax else 0)
    wr = 4 if amax else 0
    if mode == "FP8Q_AMAX":
        return rd, wr
    wr += rows * cols * ((1 if q else 0) + (1 if qt else 0))   # padding rows are written as zeros
    if mode == "FP8Q_TENSOR":
        wr += 4 if sinv else 0
        rd += 4   # the scale, or the amax it is made from
    elif mode == "FP8Q_ACT":    # one factor per (row, 128 columns) of q and per (column, 128 rows) of qt
        wr += 4 * (rows * nct if sinv else 0) + 4 * (cols * seg[4] if sinv_t else 0)
    else:                       # FP8Q_WEIGHT: one factor per 128 x 128 tile
        wr += 4 * seg[4] * nct * ((1 if sinv else 0) + (1 if sinv_t else 0))
    return rd, wr


# Global-memory (bytes read, bytes written) of a kernel from its logged arguments (a: the list, pointers as
# true/false), grid (g) and the item (x), by the kernel's name without template arguments
KERNELS = {
    # optimizer and gradient norm
    "adamw_kernel": lambda a, g, x: (16 * a[5], (14 if a[1] else 12) * a[5]),   # p, grad, m, v read; p, m, v (+ bf16) written
    "grad_norm_partials_kernel": lambda a, g, x: (4 * a[2], 4 * g[0]),          # (partial, grad, n, pre, vec): one partial per block
    "grad_sumsq_finish_kernel": lambda a, g, x: (4 * GRAD_NORM_BLOCKS, 8),     # (out, partial): the partials to a double
    "zero_sum_partials_kernel": lambda a, g, x: (4 * a[2], 8),                  # (out, partial, n)
    "zero_accumulate_kernel": lambda a, g, x: (8 * a[2], 4 * a[2]),            # (acc, x, n): acc += x, FP32
    "zero_scale_kernel": lambda a, g, x: (4 * a[2], 4 * a[2]),                 # (x, s, n): x *= s
    "zero_f32_to_bf16_kernel": lambda a, g, x: (4 * a[2], 2 * a[2]),           # (out, in, n)
    "zero_round_bf16_kernel": lambda a, g, x: (4 * a[2], 2 * a[2]),            # (out, in, n): --grad-reduce-dtype bf16
    "zero_accumulate_bf16_kernel": lambda a, g, x: (6 * a[2], 4 * a[2]),       # (acc, x, n): acc += x, x BF16
    "experts_zero_empty_kernel": lambda a, g, x: (4 * (a[4] + 1), 0),  # (dw1, dv1, dw2, offsets, E, n, vec): the offsets; 12 n
                                                                        # written per expert without rows (none when balanced)
    "zero_bf16_to_f32_kernel": lambda a, g, x: (2 * a[2], 4 * a[2]),           # (out, x, n): out = x (the step's first)
    # --zero-embedding rows (parallel/zero_gpu_embedding.cuh): one block per row of the piece, its table row of S entries
    "zero_emb_pack_kernel": lambda a, g, x: (2 * (a[4] - a[3]) + 8 * g[0] * a[7], 2 * a[8]),  # (pack, shard, table, lo, hi, v_lo, d, S, n_out)
    "zero_emb_accumulate_kernel": lambda a, g, x: (4 * a[11] + 8 * g[0] * a[7] + (0 if a[9] else 4 * (a[4] - a[3])),
                                                   4 * (a[4] - a[3])),  # (shard, recv, table, lo, hi, v_lo, d, S, me, first, rs_order, n_in)
    # context parallelism on the GPU (model/attention_cp_cuda.cuh; the chunk pairs: _flash_cp)
    "cp_pack_kv_kernel": lambda a, g, x: (4 * a[2] * a[4] * a[5], 4 * a[2] * a[4] * a[5]),     # (kv, qkv, rows, H, KV, hd): BF16 K|V
    "cp_unpack_dkv_kernel": lambda a, g, x: (8 * a[2] * a[4] * a[5], 4 * a[2] * a[4] * a[5]),  # FP32 dK|dV -> BF16
    "cp_out_to_f32_kernel": lambda a, g, x: (2 * a[2], 4 * a[2]),                             # (o32, out, n)
    "cp_out_from_f32_kernel": lambda a, g, x: (4 * a[2], 2 * a[2]),                           # (out, o32, n)
    "cp_add_f32_kernel": lambda a, g, x: (8 * a[2], 4 * a[2]),                                 # (dst, in, n): dst += in, FP32
    "cp_merge_kernel": lambda a, g, x: (a[4] * a[6] * a[9] * (6 * a[7] + 8), a[4] * a[6] * a[9] * (4 * a[7] + 4)),  # (o32, lse, out_p, lse_p, B, Tl, H, hd, qrow0, nq)
    "cp_dq_store_kernel": lambda a, g, x: (4 * a[2] * a[3] * a[4] * a[6], 2 * a[2] * a[3] * a[4] * a[6]),  # (dqkv, dq_acc, B, Tl, H, KV, hd)
    # embedding, layer norm, residual, loss
    "gather_rows_kernel": lambda a, g, x: (4 * a[3] + a[3] * a[4] * _unit(x["name"]), a[3] * a[4] * _unit(x["name"])),  # (out, src, idx, rows, units)
    "layernorm_forward_kernel": _ln_fwd,
    "layernorm_backward_kernel": _ln_bwd,
    "column_sum_groups_kernel": lambda a, g, x: (4 * a[1] * a[2], 4 * g[0] * a[2]),  # (partial, rows, C, group): a sum per group, in place
    "column_sum_kernel": lambda a, g, x: (4 * _cdiv(a[2], a[4]) * a[3] + (4 * a[3] if len(a) < 6 or a[5] else 0), 4 * a[3]),  # (out, partial, rows, C, stride, accumulate): out (+)= every stride-th row
    "classifier_fused_kernel": lambda a, g, x: (2 * g[0] * a[3] + 4 * g[0], (2 * g[0] * a[3] if a[5] else 0) + 4 * g[0]),  # N = grid.x rows of V logits
    "loss_mean_kernel": lambda a, g, x: (4 * a[2], 8),                          # (mean, losses, N)
    # attention
    "clip_rope_forward_kernel": lambda a, g, x: _rope(a, g, x, 0),
    "clip_rope_backward_kernel": lambda a, g, x: _rope(a, g, x, 1),
    "attention_forward_kernel": lambda a, g, x: _warp_attn(a, "fwd"),
    "attention_backward_dq_kernel": lambda a, g, x: _warp_attn(a, "dq"),
    "attention_backward_dkv_kernel": lambda a, g, x: _warp_attn(a, "dkv"),
    # (out, q, cache, pos, H, KV, hd): generation's one query row per head against pos + 1 cached k and v rows
    "attention_decode_kernel": lambda a, g, x: (2 * a[4] * a[6] + 2 * (a[3] + 1) * 2 * a[5] * a[6], 2 * a[4] * a[6]),
    # router and MoE (N tokens, E experts, top-k, C = d, n = rows x F)
    "router_forward_kernel": lambda a, g, x: (4 * a[5] * a[6], 4 * a[5] * a[6] + 4 * a[5] + 8 * a[5] * a[7]),  # logits -> probs, lse, idx, w
    "router_forward_warp_kernel": lambda a, g, x: (4 * a[5] * a[6], 4 * a[5] * a[6] + 4 * a[5] + 8 * a[5] * a[7]),  # (E <= 32: the same)
    "expert_histogram_kernel": lambda a, g, x: (4 * a[2], 0),                   # (counts, topk_idx, n, E): + E counters a block (SLACK)
    "router_stats_kernel": lambda a, g, x: (4 * a[3] * a[4] + 4 * a[3], 4 * (a[4] + 1)),  # (stats, probs, lse, N, E)
    "router_backward_kernel": lambda a, g, x: (4 * a[7] * (a[8] + 1 + 3 * a[9]) + 4 * a[8], 2 * a[7] * a[8]),  # probs, lse, dw, idx, w, counts
    "router_backward_warp_kernel": lambda a, g, x: (4 * a[7] * (a[8] + 1 + 3 * a[9]) + 4 * a[8], 2 * a[7] * a[8]),  # (E <= 32: the same)
    "moe_offsets_kernel": lambda a, g, x: (4 * a[2], 4 * (a[2] + 1)),          # (offsets, counts, E)
    "moe_permute_kernel": lambda a, g, x: (4 * a[4] * a[5] + 4 * g[1], 8 * a[4] * a[5]),  # grid (slices, E): idx, offsets -> row_token, slot_row
    "moe_combine_forward_kernel": lambda a, g, x: (2 * a[5] * a[7] * (1 + a[6]) + 8 * a[5] * a[6], 2 * a[5] * a[7]),  # resid + k rows of ye
    "moe_combine_backward_kernel": lambda a, g, x: (4 * a[6] * a[8] + 2 * a[6] * a[7] * a[8] + 8 * a[6] * a[7],
                                                    2 * a[6] * a[7] * a[8] + 4 * a[6] * a[7]),  # dout, ye, w, slot -> dye, dw
    # dxe rows -> dx (FP32); with the router's dr (N, E) and wr (E, C) (a[6], a[7]) the router's input gradient too
    "moe_gather_backward_kernel": lambda a, g, x: (2 * a[3] * a[4] * a[5] + 4 * a[3] * a[4] + (2 * a[3] * a[8] + 2 * a[8] * a[5] if a[6] else 0),
                                                   4 * a[3] * a[5]),
    "swiglu_forward_kernel": lambda a, g, x: (4 * a[3], 2 * a[3]),             # (a, g, u, n): g, u read, a written, BF16
    "swiglu_backward_kernel": lambda a, g, x: (6 * a[5], 4 * a[5]),            # (dg, du, da, g, u, n): 3 read, 2 written
    # --compress-acts' rebuild (g, u, act, qg, qu, sg, su, rows, F): 1-byte codes of g, u and a factor per row tile read;
    # g, u, act written in BF16
    # --compress-acts' codes (q, sinv, g, u, rows, R, F): g and u read in BF16, 1-byte codes and a factor per row tile written
    "swiglu_compress_kernel": lambda a, g, x: (4 * a[4] * a[6], 2 * a[4] * a[6] + 8 * a[4] * _cdiv(a[6], 128)),
    "swiglu_decompress_kernel": lambda a, g, x: (2 * a[7] * a[8] + 8 * a[7] * _cdiv(a[8], 128), 6 * a[7] * a[8]),
    "embedding_backward_kernel": None,                                          # needs the token count (ctx)
    # FP8 (model/fp8.cuh, model/dbrx_fp8_cuda.cuh, parallel/zero_fp8.h)
    "fp8_pad_slots_kernel": lambda a, g, x: (4 * a[3] + 8 * a[4], 4 * a[3]),    # (slot_row, offsets, seg, R, E): remapped in place
    "fp8_pad_rows_kernel": None,                                                # data-dependent: set below
    "fp8g_scales_kernel": lambda a, g, x: (4 * a[3], 8 * a[3]),                 # (amax, scale, inv, n, margin)
    "fp8g_factors_kernel": lambda a, g, x: (4 * a[2], 4 * a[2]),               # (inv, sinv, groups, ...): one factor each
    "fp8_transpose_kernel": lambda a, g, x: (a[2] * a[3], a[2] * a[3]),        # (qt, q, rows, cols): 1-byte codes
    "fp8_transpose16_kernel": lambda a, g, x: (a[2] * a[3], a[2] * a[3]),      # (the same, 16 codes an access)
    "fp8_transpose_factors_kernel": lambda a, g, x: (4 * a[2] * _cdiv(a[3], 128) * _cdiv(a[4], 128),) * 2,  # one per tile
    "fp8g_weight_scales_kernel": lambda a, g, x: (24 * g[0], 8 * g[0]),      # per matrix: its slot and group (2 size_t), its scale and 1/s
}
# data-dependent (CHECK "bound"): the formula is the traffic without cache hits on repeated rows, or (under expert
# parallelism) with every padded row of the experts' segments valid
BOUND = {"gather_rows_kernel", "fp8_pad_rows_kernel"}


def _fp8_fused(item, a, ctx=None):
    # fp8_swiglu_quantize_kernel<MODE> / fp8_swiglu_bwd_quantize_kernel<MODE>(p, rows, cols, seg, fmt, margin, o0, o1,
    # o2, fmt2) (model/fp8_fused.cuh): the producer's inputs over every row (padding rows too: g, u; da, g, u; BF16),
    # its BF16 output y if written (act), and per output (forward one, backward two: dg, du, or three with o2, act
    # recomputed; the blocks of a tile read the inputs, counted once) what fp8_quantize_kernel writes: codes q / qt
    # (1 byte, padding rows as zeros), the factors, the amax (max-accumulated), the scale or amax it is made from
    p, rows, cols, seg = a[0], a[1], a[2], a[3]
    mode = re.search(r"<(\w+)>", item["name"])
    mode = mode.group(1) if mode else ""
    n = rows * cols
    outs = [a[6], a[7]] if item["name"].startswith("fp8_swiglu_bwd_") else [a[6]]
    if item["name"].startswith("fp8_swiglu_bwd_") and len(a) > 8 and (a[8][2][0] or a[8][2][1] or a[8][2][4]):
        outs.append(a[8])   # act (fp8_fused_has: codes or an amax to write)
    rd = 2 * n * sum(1 for x in p[:3] if x) + (4 * (seg[2] + 1) if seg[0] else 0) + (4 * seg[2] if seg[1] else 0)
    if item["name"].startswith("fp8_gather_"):
        # fp8_gather_quantize_kernel: y = x[idx] (p [x, -, -, y, idx]): x's rows for every output row where y is
        # written (the padding rows too: token 0, as the unfused gather), else only the valid rows (padding: zeros,
        # not read; with valid counts the routed rows: ctx "routed"; under EP the received rows are data); idx
        # (4 bytes a row) where given
        ctx = ctx or {}
        valid = ctx.get("routed", rows) if seg[1] and not ctx.get("ep") else rows
        rd += 2 * cols * (rows if p[3] else valid) - 2 * n + (4 * rows if len(p) > 4 and p[4] else 0)
    wr = 2 * n if p[3] else 0
    for scale, amax_in, out in outs:
        q, qt, sinv, sinv_t, amax = out[0], out[1], out[2], out[3], out[4]
        rd += 4 if amax else 0
        wr += 4 if amax else 0
        if mode == "FP8Q_AMAX":
            continue
        wr += n * ((1 if q else 0) + (1 if qt else 0))
        if mode == "FP8Q_TENSOR":
            rd += 4
            wr += 4 if sinv else 0
        elif mode == "FP8Q_WEIGHT":   # (fp8_gather_quantize_kernel of a weight) one factor per 128 x 128 block
            wr += 4 * seg[4] * _cdiv(cols, 128) * ((1 if sinv else 0) + (1 if sinv_t else 0))
        else:   # FP8Q_ACT: a factor per (row, 128 columns) of q, per (column, 128 rows of a segment) of qt
            wr += 4 * (rows * _cdiv(cols, 128) if sinv else 0) + 4 * (cols * seg[4] if sinv_t else 0)
    return rd, wr


def data_dependent(item, ctx):
    base = re.sub(r"<.*", "", item["name"]).strip()
    if base in ("fp8_quantize_kernel", "fp8_gather_quantize_kernel"):
        a = item.get("args") or [None] * 4
        if base == "fp8_gather_quantize_kernel" and isinstance(a[0], list) and len(a[0]) > 4 and a[0][4]:
            return True   # a gather by token id (as gather_rows_kernel): repeated rows hit the cache
        return bool(ctx.get("ep") and isinstance(a[3], list) and a[3][1])
    return base in BOUND


def kernel_context(items):
    """what some formulas need from elsewhere in the step: the optimizer shard's size (the step's gradient-norm
    pass over the whole shard, padding included) and the token count (rows of the classifier)"""
    ctx = {"shard_n": max([it["args"][2] for it in items if it["t"] == "kernel" and it["name"] == "grad_norm_partials_kernel"
                           and len(it.get("args") or []) > 2 and isinstance(it["args"][2], int)] or [0])}
    n = [it["grid"][0] for it in items if it["t"] == "kernel" and it["name"].startswith("classifier_fused_kernel")]
    if n:
        ctx["tokens"] = max(n)
    n = [it["args"][2] for it in items if it["t"] == "kernel" and it["name"] == "expert_histogram_kernel"]
    if n:
        ctx["routed"] = max(n)   # token x top-k rows routed to this rank's experts (without expert parallelism)
    ctx["ep"] = any(it["t"] == "coll" and it.get("comm") == "expert_parallel" for it in items)
    n = [it["args"][3] for it in items if it["t"] == "kernel" and it["name"] == "fp8g_scales_kernel"]
    if n:
        ctx["fp8g_groups"] = max(n)   # the FP8 all-gather's scale groups (--fp8-gather)
    return ctx


def kernel_rw(item, ctx=None):
    """(bytes read, bytes written, tensor-core FLOPs) of a kernel line, or None without a formula"""
    base = re.sub(r"<.*", "", item["name"]).strip()
    a = item.get("args") or []
    if a and isinstance(a[-1], list) and a[-1][:1] == ["doc_mask"]:   # (the attention kernels' last argument, model/attention.cuh's
        a = a[:-1]                                                    # DocMask: the same tiles with or without a document mask)
    g = item.get("grid") or [1, 1, 1]
    ctx = ctx or {}
    try:
        if base == "flash_attention_backward_D_kernel":   # (D, dq_sem, dout, out, B, T, H, hd, nsem): dout, out -> D
            B, T, H, hd, nsem = a[4:9]                      # (B, H, T) FP32; the semaphores zeroed
            return 2 * 2 * B * T * H * hd, 4 * B * H * T + 4 * nsem, 0
        if base == "flash_attention_forward_wgmma":
            (rd, wr), mma = _flash_wgmma_fwd(item, a)
            return rd, wr, mma
        if base in WGMMA_BWD:
            (rd, wr), mma = _flash_wgmma_bwd(item, a, base)
            return rd, wr, mma
        if base.startswith("flash_attention_"):
            kind = _flash_kind(base)
            (rd, wr), mma = (_flash_cp if base.endswith("_cp_kernel") else _flash)(item, a, kind)
            return rd, wr, mma
        if base in ("adamw_fused_kernel", "adamw_fused_bf16_moments_kernel", "lion_fused_kernel", "lion_fused_bf16_moment_kernel"):   # its segments' sizes are on the device: the step's gradient-norm pass (over the
            n = a[18] if len(a) > 18 and a[18] else ctx.get("shard_n")   # whole shard) gives their sum, padding included,
            # unless the launch says (argument 18: the device store's optimizer in two launches, the first
            # units of the next step gathered after the first, parallel/zero_gpu_comm.cuh). Per element g, m, v, master
            # read (16 B); m, v, master (12), the BF16 copy (2) and, where clear_grad (argument 19: DDP + EP; ZeRO-3's
            # first reduce-scatter or one GPU's first backward overwrites the gradient instead), g = 0 (4) written; 20 B of table per segment (the
            # padding's elements: only the zero written, or nothing, counted as a parameter's here: a few per unit)
            # (--adam-moments bf16: adamw_fused_bf16_moments_kernel, m and v 2 bytes each: 4 fewer read, 4 fewer written)
            # (--optimizer lion: lion_fused_kernel, no v: 4 fewer read and written; lion_fused_bf16_moment_kernel, m in
            # 2 bytes too: 2 fewer more each)
            clear = a[19] if len(a) > 19 else 1
            less = {"adamw_fused_kernel": 0, "adamw_fused_bf16_moments_kernel": 4, "lion_fused_kernel": 4,
                    "lion_fused_bf16_moment_kernel": 6}[base]
            return (16 * n - less * n + 20 * g[1], (18 if clear else 14) * n - less * n, 0) if n else None
        if base == "embedding_backward_kernel":   # (dwte, dout, unique, offsets, positions, C), grid.x = U distinct
            U, C, N = g[0], a[5], ctx.get("tokens", g[0])   # tokens: dwte rows += the sum of their positions' dout rows
            return 4 * U * C + 4 * N * C + 4 * U + 4 * (U + 1) + 4 * N, 4 * U * C, 0
        if base == "fp8_quantize_kernel":
            rd, wr = _fp8_quantize(item, a, ctx)
            return rd, wr, 0
        if base in ("fp8_swiglu_quantize_kernel", "fp8_swiglu_bwd_quantize_kernel", "fp8_gather_quantize_kernel"):
            rd, wr = _fp8_fused(item, a, ctx)
            return rd, wr, 0
        if base in ("fp8g_piece_amax_kernel", "fp8g_piece_encode_kernel"):   # (x, piece [a, b, ...], ...)
            es = 2   # <T>: the store gathers from its BF16 copy of the shard (zero_gpu.cuh; FP32 only in tests)
            n = a[1][1] - a[1][0]
            groups = g[0] * g[1] if a[1][8] else 1   # block scaling: a group per 128 x 128 tile; else the matrix's one
            if base == "fp8g_piece_amax_kernel":     # max-accumulated: read and written
                return es * n + 4 * groups, 4 * groups, 0
            return es * n + 4 * groups, n, 0         # the codes; the group's scale read
        if base == "fp8g_decode_bf16_kernel":   # (y, codes, piece, inv): codes (1 byte) -> BF16
            n = a[2][1] - a[2][0]
            return n, 2 * n, 0
        if base == "fp8g_tensor_amax_kernel":   # (slot_amax, mats, amax): per matrix its table row (3 size_t) and
            groups = ctx.get("fp8g_groups", g[0])   # its groups' amaxes (all groups: ctx) -> one amax
            return 24 * g[0] + 4 * groups, 4 * g[0], 0
        if base == "fp8_pad_rows_kernel":       # (row_token_pad, row_token, offsets, seg, Rp, E)
            Rp, E = a[4], a[5]
            return 4 * Rp + 8 * (E + 1), 4 * Rp, 0
        f = KERNELS.get(base)
        if not f:
            return None
        rd, wr = f(a, g, item)
        return rd, wr, 0
    except (IndexError, TypeError, KeyError, ZeroDivisionError):
        return None


def _flash_kind(base):
    if "forward" in base:
        return "fwd"
    return "dq" if "_dq_" in base else "dkv" if "_dkv_" in base else "bwd5"


def kernel_mma_fraction(item):
    """the share of the BF16 peak at which a kernel line's mma.sync FLOPs run (predicted: flash_mma_fraction)"""
    base = re.sub(r"<.*", "", item["name"]).strip()
    if base == "flash_attention_forward_wgmma":
        return WGMMA_FWD_FRACTION_BY_NWG[item["block"][0] // 128]
    if base in WGMMA_BWD:
        return WGMMA_BWD[base]
    if base.startswith("flash_attention_"):
        return flash_mma_fraction(_flash_kind(base)) if base != "flash_attention_backward_D_kernel" else MMA_SYNC_FRACTION
    return MMA_SYNC_FRACTION


def kernel_bytes(item, ctx=None):
    """global-memory bytes (read + written) of a kernel line, or None without a formula"""
    r = kernel_rw(item, ctx)
    return None if r is None else r[0] + r[1]


def kernel_flops(item, ctx=None):
    """tensor-core (BF16 mma.sync) FLOPs of a kernel line: 0 for the memory-bound kernels"""
    r = kernel_rw(item, ctx)
    return 0 if r is None else r[2]
