#!/usr/bin/env python3
"""predict.py — the step-time model (issue 22): the emulator's work log of one training step, turned into a
predicted timeline on a named GPU. Python 3, standard library only.

  predict.py LOG [--device h100-sxm|h100-pcie|h200] [--gpus-per-node 8] [--flops-per-token F --tokens T --ranks W]
             [--step K] [--trace OUT.json] [--top N] [--json]
  predict.py LOG_L1 LOG_L2 --layers L1,L2 --target-layers L ...   (two runs that differ only in their layer count:
             every number extrapolated linearly in the layers, as --dry-run's memory estimate is)

LOG: what the emulated binary writes with SIMT_WORKLOG=FILE (test/simt/counters.h lists the lines). One step is
the work between two "mark" lines of the training loop's dbrx_sync (default: the last whole step).

The model, item by item (every rate in RATES below, with its source or marked as an assumption):
  gemm    max(2 m n k batch / (peak of the A type x efficiency of the shape class), bytes / (HBM x HBM_FRACTION)),
          at least GEMM_MIN_US; bytes = A + B + D (+ C when beta != 0)
  kernel  bytes / (HBM x HBM_FRACTION) where kernel_cost.py has a formula for it (from the launch's logged arguments),
          at least KERNEL_MIN_US; a kernel without a formula costs KERNEL_MIN_US ("no formula" in the table)
  coll    bytes x the ring factor (all_reduce 2(n-1)/n, all_gather/reduce_scatter (n-1)/n, broadcast and p2p 1)
          / the bus bandwidth of its placement (NVLink inside a node, InfiniBand across) + latency; a group of
          sends and receives (all-to-all) as one item over max(bytes sent, bytes received) to other ranks
  copy    bytes / PCIe (host <-> device), 2 bytes / HBM (device to device, memset 1x)
The simulation: the host issues items in log order, paying HOST_US per call; each stream runs its items in order,
an item starting when it is issued and its stream is free; an event records the point its stream has reached,
a wait makes the stream wait for that point; a sync (stream, device, event, blocking copy) stops the host until
that point, plus SYNC_US. Streams run concurrently; share_stretch then slows what shares the SMs or links (a
collective's CTAs, compute beside compute) and iterates to a fixed point. Exposed communication: collective time not overlapped by a
kernel or GEMM on any stream. MFU as the project counts it (model/README.md: FLOPs per token x tokens / (time x
peak x ranks), matmul FLOPs only) when --flops-per-token is given; else the GEMM FLOPs' share of the peak.
Not modelled yet (dev/predict/README.md): attention and the other kernels without a byte formula beyond their
minimum time, L2 reuse, wave quantisation, bytes-bound kernels beside compute on another stream (compute beside
compute shares the GPU: PAIR_EFFICIENCY), host work other than the API calls
(Python-free C++ loop: the data loader, MPI all-reduces of the metrics on the host).
"""
import argparse
import bisect
import json
import multiprocessing
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_cost import kernel_bytes, kernel_context, kernel_flops, kernel_mma_fraction  # noqa: E402  (the per-kernel byte and mma FLOP formulas)

# ---------------------------------------------------------------------------------------------------------
# the rate table. Sources: [gpu_peak] model/gpu_peak.h (NVIDIA's dense BF16 numbers, half the sparse datasheet
# figures); [ds-h100] NVIDIA H100 Tensor Core GPU datasheet (FP8 3,958 / 3,026 TFLOPS with sparsity for SXM /
# PCIe, FP32 67 / 51 TFLOPS, HBM 3.35 / 2.0 TB/s, NVLink 900 / 600 GB/s); [ds-h200] NVIDIA H200 product page
# (HBM3e 4.8 TB/s, the H100 SXM's compute, NVLink 900 GB/s); [cutlass] CUTLASS 3.5.1 on H100, BF16 GEMM at
# M=N=K 8192 / 4096 / 1024: ~75% / ~70% / ~58% of peak (a third-party summary of NVIDIA's CUTLASS benchmarks,
# mintlify.com/NVIDIA/cutlass/performance/benchmarks, read for the percentages only); [nccl-tests] 8x H100 SXM
# all_reduce busbw 460-480 GB/s at large sizes (docs.alayanew.com, "NCCL-tests in practice"). "assumption":
# no measurement found yet; make bench-gpu is to replace it (issue 22, item 3).
RATES = {
    "h100-sxm": {"bf16": 989.4e12, "fp8": 1978.9e12, "fp32": 66.9e12, "hbm": 3.35e12, "nvlink_busbw": 450e9,
                 "src": "[gpu_peak] BF16; [ds-h100] FP8, FP32, HBM; [nccl-tests] NVLink busbw (460-480 measured, 450 used)"},
    "h100-pcie": {"bf16": 756.0e12, "fp8": 1513.0e12, "fp32": 51.2e12, "hbm": 2.0e12, "nvlink_busbw": 200e9,
                  "src": "[gpu_peak] BF16; [ds-h100] FP8, FP32, HBM; NVLink bridge pairs only: 200 GB/s busbw (assumption)"},
    "h200": {"bf16": 989.4e12, "fp8": 1978.9e12, "fp32": 66.9e12, "hbm": 4.8e12, "nvlink_busbw": 450e9,
             "src": "[gpu_peak] BF16; [ds-h200] HBM, NVLink; compute as H100 SXM"},
}
# GEMM efficiency (fraction of the type's dense peak) by the smallest of m, n, k: [cutlass] for >= 4096 and
# >= 1024 (70% and 58% at 4096 / 1024, taken for the class below each); the two lower classes are assumptions
GEMM_EFFICIENCY = [(4096, 0.70), (1024, 0.58), (256, 0.40), (64, 0.20), (0, 0.08)]
HBM_FRACTION = 0.80        # memory-bound kernels and GEMMs reach this fraction of HBM bandwidth (assumption; the
                           # project's own target is >= 70%: README, Benchmarks)
# FP8. The first measurement (dev/bench/results_gpu.md, H200, 2026-11-26; the later ones: the same file): --fp8 block 114.8 ms against BF16 95.6,
# where the model had predicted 83.7 (BF16 95.3): 31 ms missed, all in what FP8 changes (the GEMMs of the blocks
# and the quantisation kernels; no FP8 per-range profile was taken, so the split below is assumed, not measured).
# Per-tensor FP8 GEMMs (one scale per operand) keep the datasheet's FP8 peak, 2 x BF16 (unmeasured: they failed
# NOT_SUPPORTED on the first device; they run since 2026-11-27, but their rate is not measured). Block-scaled ones (VEC128 / BLK128x128, cuBLASLt on Hopper) apply the scales in the
# main loop with promoted accumulation and run at FP8_BLOCK_GEMM_VS_BF16 x the BF16 rate of the same shape.
# FP8_BLOCK_GEMM_VS_BF16 by the GEMM's FLOPs (2 m n k per batch member), the first class it reaches:
#   >= 1e11 FLOPs: 1.45, measured (session 45, H100 SXM, dev/bench/gpu_h100_2026-11-28/call1_log.txt): the step's own
#     cuBLASLt per-expert GEMMs at the DBRX-132B slice's shapes (1024 rows an expert, d 6144, F 10752: 135 GFLOP each),
#     FP8 block (1 x 128 activation tiles, 128 x 128 weight blocks) 955 TFLOP/s up and down, against BF16 668 up
#     (its 630 less SwiGLU's 0.39 ms at 80% of HBM) and 643 down (the layer's 634 less the up): 1.43 and 1.49 x;
#     forward E4M3 x E4M3 only: the backward's E4M3 x E5M2 and wgrad GEMMs at this size are not timed yet (assumed
#     the same ratio)
#   smaller: 1.0, an assumption from public measurements of block-scaled FP8 at K ~ 1024 (CUTLASS issue 2923:
#     0.6-1.0 x FP16 for 128 x 128 blockwise FP8 on B200; DeepGEMM's hand-written Hopper kernels reach 1.0-1.5
#     PFLOP/s only at K >= 2048 with large tiles); the dbrx-1b step's own shapes (15-52 GFLOP) are in the measured
#     table instead (1.06-1.35 x BF16 there)
# That leaves 12.1 ms of the 31 on the quantisation kernels:
# fp8_quantize_kernel at KERNEL_HBM_FRACTION below instead of 0.80 (fitted to that residual: 1-byte stores, a warp
# per column for the transposed copy, three block-wide reductions per 128 x 128 tile). `make bench-gpu` with an FP8
# --profile is to replace both numbers; the lease's sweep of the 132B slice's GEMMs (dev/bench/lease_next.sh) the
# first.
FP8_BLOCK_GEMM_VS_BF16 = [(1e11, 1.45), (0, 1.0)]
# The bytes-bound kernels of the BF16 step MEASURED (session 62, one H200, the balanced dbrx-1b step 8 kernel by kernel:
# dev/bench/results_gpu.md, 2026-11-30; calibrate.py --kernels): each kernel's share of the H200's HBM bandwidth, 0.80 x
# predicted / measured ms (in the comments) with the predicted at HBM_FRACTION. One shape (d 1024, 16,384 tokens), one
# device: other shapes and the H100 are priced at the same shares. Kernels the profile did not time keep HBM_FRACTION
KERNEL_HBM_FRACTION = {"fp8_quantize_kernel": 0.31,
                       "classifier_fused_kernel": 0.546,             # 1.713 / 2.512 ms
                       "layernorm_backward_kernel": 0.504,           # 1.252 / 1.988 (19 launches)
                       "moe_combine_backward_kernel": 0.455,         # 0.788 / 1.386
                       "moe_gather_backward_kernel": 0.493,          # 0.474 / 0.768 (the router's input gradient fused)
                       "flash_attention_backward_D_kernel": 0.371,   # 0.159 / 0.341
                       "clip_rope_backward_kernel": 0.670,           # 0.356 / 0.425
                       "clip_rope_forward_kernel": 0.644,            # 0.238 / 0.296
                       "layernorm_forward_kernel": 0.699,            # 0.490 / 0.561
                       "moe_combine_forward_kernel": 0.767,          # 0.473 / 0.493
                       "adamw_fused_kernel": 0.773,                  # 7.984 / 8.261
                       "swiglu_backward_kernel": 0.897,              # 2.753 / 2.454
                       "swiglu_forward_kernel": 0.891,               # 1.652 / 1.483
                       "gather_rows_kernel": 0.913,                  # 0.647 / 0.567
                       "grad_norm_partials_kernel": 0.865,           # 1.065 / 0.985
                       # --fp8 block's fused quantisation (model/fp8_fused.cuh), the same lease's FP8 step 10 (a collapsed
                       # routing: its GEMMs had other shapes, these kernels the same rows in all)
                       "fp8_swiglu_bwd_quantize_kernel": 0.223,      # 3.071 / 11.004 (9 launches)
                       "fp8_gather_quantize_kernel": 0.360,          # 3.026 / 6.731 (117)
                       "fp8_swiglu_quantize_kernel": 0.468}          # 1.385 / 2.365 (9)
KERNEL_MIN_US = 2.5        # the shortest kernel on the device, launch to completion (assumption)
GEMM_MIN_US = 5.0          # the shortest cuBLASLt GEMM (assumption)
HOST_US = {"kernel": 4.0, "gemm": 6.0, "coll": 5.0, "record": 1.0, "wait": 1.0, "copy": 4.0}   # host time per call (assumption, "~4 us a launch")
SYNC_US = 5.0              # host wake-up after the device reached a sync point (assumption)
# Streams share the SMs and the links (session 57; until then a collective's SMs and link were free). NCCL runs each
# collective as a kernel of one CTA per channel, resident for the collective's whole duration, and a Hopper GEMM's CTA
# needs a whole SM (its registers and shared memory: cuBLASLt's sm90 kernels, like the project's wgmma kernels, leave
# no room beside them). So while collectives are in flight the compute runs on the SMs they leave: a FLOP-bound kernel
# or GEMM (measured ones too) takes SMS / (SMS - C) of its time, C the CTAs of the collectives in flight over its
# interval (their sum, averaged over the interval; at most COMM_CTAS_MAX of the SMs). Bytes-bound kernels are not
# stretched: fewer SMs still draw most of HBM's bandwidth (an assumption, the optimistic side). NCCL_CTAS: the CTAs of
# one collective, an assumption from an H100 profile with NCCL's defaults (NVIDIA developer forum, "Compute-communication
# overlap causes severe GEMM performance degradation because of tail effect": ncclAllGather launched 24 blocks beside a
# 132-block GEMM; DeepSeek-V3's report gives its own all-to-all 20 of 132 SMs). Proportional is the many-wave case; a
# GEMM of about one wave loses more (that profile: up to 2 x, its tail a wave of its own), not modelled.
# `dev/cuda/matmul -c` times GEMMs beside a kernel holding C = 8..32 SMs on one GPU: a lease's check of the proportion.
# Links: the collectives on one link (NVLink in a node, the network across nodes) share it (share_stretch).
SMS = {"h100-sxm": 132, "h100-pcie": 114, "h200": 132}
NCCL_CTAS = 24
# What one CTA moves, where a communicator's CTAs are capped (ncclConfig_t.maxCTAs: --nccl-ctas-internode, the
# embedding's 2): NVLink's bus bandwidth over NCCL's 24 (an assumption: the default CTAs reach the link's bandwidth, and
# a CTA's share is even), so 3 CTAs are enough for the network's 45 GB/s a GPU
NCCL_CTA_BW = 450e9 / NCCL_CTAS
# Measured on an H200 (session 62, dev/cuda/matmul -c: GEMMs and a bytes-bound kernel beside a kernel whose C = 8..32
# CTAs hold their SMs): a bytes-bound kernel took 1.074-1.076 x its time alone at every C, and the GEMMs took more than
# SMs / (SMs - C) by 0.003-0.177 (a cube 8192^3: +0.057, +0.092, +0.005, +0.003; DBRX-132B's one-wave expert up-projection:
# +0.135, +0.177, +0.090, +0.078; mean 0.080). The model adds HELD_CTAS_EXTRA to both while any collective is in flight.
HELD_CTAS_EXTRA = 0.075
COMM_CTAS_MAX = 0.75       # (of the SMs: the compute keeps a quarter whatever is in flight; an assumption)
# Compute beside compute (--moe-streams 2: the experts' GEMMs on two streams, model/moe.cuh): a FLOP-bound kernel or
# GEMM that runs beside n others (averaged over its interval) takes 1 + n (2 PAIR_EFFICIENCY - 1) times its time alone:
# two at once finish together in 2 PAIR_EFFICIENCY of one's time (processor sharing, less what the pair's tails fill).
# Calibrated on an H200 at dbrx-1b (session 62, dev/bench/results_gpu.md): the balanced step, medians of steps 21-30, took
# 85.09 ms on 1 stream and 83.98 on 2 in the same binary; 0.967 predicts that -1.11 ms (make predict MODEL=dbrx-1b with
# and without --moe-streams 1). dev/cuda/matmul -b's per-expert GEMMs alone gained more on 2 streams (0.81-0.91 x one
# stream's time, ~0.89 over the six projections): in the step the pairs are fewer and shorter. An H200's number applied
# to every device.
PAIR_EFFICIENCY = 0.967
SHARE_ITERATIONS = 12      # the fixed point: the stretched compute moves the collectives, which move the stretch; its
SHARE_TOLERANCE = 1e-3     # iterations stop when no op's factor moves by more than this
PCIE_BW = 25e9             # host <-> device copies of pageable memory (assumption; PCIe Gen5 x16 is 64 GB/s a direction)
COPY_MIN_US = 2.0
IB_BUSBW = 45e9            # per GPU across nodes: InfiniBand 8 x 400 Gb/s per node = 50 GB/s per GPU, 90% of it (assumption)
COLL_LATENCY_US = {"intra": 10.0, "inter": 25.0, "self": 2.0}   # (assumption)
RING_FACTOR = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "send": lambda n: 1.0, "recv": lambda n: 1.0}


# Measured GEMMs (make bench-gpu section 7): dev/cuda/matmul -s timed the step's own GEMM shapes on a GPU and
# calibrate.py --gemms wrote gemm_measured_<device>.json beside this file; a GEMM of the same key costs its measured
# time there instead of the rate table's (only on that device: an H200's times are not an H100's). {device: {key: s}}
MEASURED_GEMMS = {}
MEASURED_GEMMS_SOURCE = {}


def gemm_key(it):
    """one GEMM's shape as dev/cuda/matmul -s reads it: m n k batch a b d trans_a trans_b beta(0/1) fast_accum modes"""
    return "%d %d %d %d %s %s %s %d %d %d %d %d %d" % (
        it["m"], it["n"], it["k"], it["batch"], it["a"], it["b"], it["d"], bool(it["trans_a"]), bool(it["trans_b"]),
        it["beta"] != 0, it.get("fast_accum", 0), it.get("a_scale_mode", 0), it.get("b_scale_mode", 0))


def load_measured_gemms(dev, path=None):
    """the device's measured GEMM table: PATH, else gemm_measured_<dev>.json here when it exists; {} if none"""
    if path and not os.path.exists(path):
        die("--measured-gemms %s: no such file" % path)
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_measured_%s.json" % dev)
    if not os.path.exists(path):   # (the default table may be absent: the rate table then)
        MEASURED_GEMMS[dev] = {}
        return {}
    try:
        with open(path) as f:
            t = json.load(f)
        table = {k: float(v) * 1e-3 for k, v in t["gemms_ms"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        die("%s: not a measured GEMM table (%s)" % (path, e))
    bad = [k for k, v in table.items() if not 0 < v < float("inf")]
    if bad:
        die("%s: %s: a measured time must be a positive finite number of ms" % (path, bad[0]))
    if t.get("device") != dev:
        die("%s: measured on %s, not %s" % (path, t.get("device"), dev))
    MEASURED_GEMMS[dev], MEASURED_GEMMS_SOURCE[dev] = table, "%s (%s)" % (path, t.get("source", "?"))
    return table


def gemm_efficiency(m, n, k):
    small = min(m, n, k)
    for lim, eff in GEMM_EFFICIENCY:
        if small >= lim:
            return eff
    return GEMM_EFFICIENCY[-1][1]


def fp8_block_vs_bf16(flops):
    """a block-scaled FP8 GEMM's rate over the BF16 rate of its shape, by its FLOPs per batch member"""
    return next(r for lim, r in FP8_BLOCK_GEMM_VS_BF16 if flops >= lim)


SIZE = {"bf16": 2, "fp32": 4, "e4m3": 1, "e5m2": 1}


def cost(item, dev, gpus_per_node, ctx=None):
    """(device seconds, bound, flops, bytes) of one work item"""
    r = RATES[dev]
    t = item["t"]
    if t == "gemm":
        m, n, k, b = item["m"], item["n"], item["k"], item["batch"]
        flops = 2.0 * m * n * k * b
        fp8 = item["a"] in ("e4m3", "e5m2")
        block = fp8 and (item.get("a_scale_mode", 0) or item.get("b_scale_mode", 0))   # VEC128 / BLK128 (matmul.cuh)
        peak = r["bf16"] * fp8_block_vs_bf16(2.0 * m * n * k) if block else r["fp8"] if fp8 else r["bf16"]
        tc = flops / (peak * gemm_efficiency(m, n, k))
        nbytes = b * (m * k * SIZE[item["a"]] + k * n * SIZE[item["b"]] + m * n * SIZE[item["d"]] * (2 if item["beta"] else 1))
        table = MEASURED_GEMMS.get(dev)
        measured = table.get(gemm_key(item)) if table else None
        if measured is not None:   # (timed on this device: nothing else applies)
            return measured, "measured", flops, nbytes
        tm = nbytes / (r["hbm"] * HBM_FRACTION)
        d = max(tc, tm, GEMM_MIN_US * 1e-6)
        return d, ("FLOPs" if d == tc else "bytes" if d == tm else "latency"), flops, nbytes
    if t == "kernel":
        nbytes, flops = kernel_bytes(item, ctx), kernel_flops(item, ctx)
        if nbytes is None:
            return KERNEL_MIN_US * 1e-6, "no formula", 0.0, None
        tm = nbytes / (r["hbm"] * KERNEL_HBM_FRACTION.get(item["name"].split("<")[0], HBM_FRACTION))
        tc = flops / (r["bf16"] * kernel_mma_fraction(item)) if flops else 0.0   # its mma.sync FLOPs (flash attention), kernel_cost.py
        d = max(tm, tc, KERNEL_MIN_US * 1e-6)
        return d, ("FLOPs" if d == tc else "bytes" if d == tm else "latency"), flops, nbytes
    if t == "coll":
        n = item["nranks"]
        if n <= 1:
            return COLL_LATENCY_US["self"] * 1e-6, "latency", 0.0, 0
        place = coll_place(item, gpus_per_node)
        bw = coll_bandwidth(item, dev, gpus_per_node)
        moved = item["bytes"] * RING_FACTOR[item["kind"]](n)
        return moved / bw + COLL_LATENCY_US[place] * 1e-6, "comm", 0.0, item["bytes"]
    if t == "copy":
        nbytes = item["bytes"]
        if item["kind"] in ("h2d", "d2h", "h2h", "default", "unknown"):
            d = nbytes / PCIE_BW
        else:
            d = nbytes * (1 if item["kind"] == "memset" else 2) / (r["hbm"] * HBM_FRACTION)
        return max(d, COPY_MIN_US * 1e-6), "bytes", 0.0, nbytes
    raise ValueError("no cost for " + t)


# ---------------------------------------------------------------------------------------------------------
def is_grouped_expert_kernel(name):
    return name.startswith("experts_") and "grouped" in name


def die(msg):
    """bad input: one line, exit 2"""
    print("error: " + msg, file=sys.stderr)
    sys.exit(2)


def read_log(path):
    items = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    items.append(json.loads(line))
                except ValueError as e:
                    die("%s:%d: not a work-log line (JSON: %s)" % (path, n, e))
                if not isinstance(items[-1], dict) or "t" not in items[-1]:
                    die("%s:%d: a work-log line without \"t\"" % (path, n))
    except OSError as e:
        die("%s: %s" % (path, e.strerror))
    return items


def rank_logs(path):
    """the logs of one run: PATH itself, or under mpirun PATH.0, PATH.1, ... (every rank's, in rank order)"""
    if os.path.exists(path) or not os.path.exists(path + ".0"):
        return [path]
    out, r = [], 0
    while os.path.exists("%s.%d" % (path, r)):
        out.append("%s.%d" % (path, r))
        r += 1
    return out


def one_step(items, step=None):
    """the items of one step: between marks 2K-1 and 2K (the loop's dbrx_sync before and after step K; the
    closing sync included). Default: the last whole step; no marks: everything"""
    marks = [i for i, it in enumerate(items) if it["t"] == "mark"]
    if not marks:
        return items
    steps = len(marks) // 2
    if steps == 0:
        die("the work log has %d step mark(s): no whole step (run at least one training step)" % len(marks))
    k = steps if step is None else step
    if not 1 <= k <= steps:
        die("--step %d: the log holds steps 1..%d" % (k, steps))
    return items[marks[2 * k - 2] + 1:marks[2 * k - 1]]


def merge_groups(items):
    """consecutive p2p operations of one NCCL group become one item (an all-to-all): bytes = the larger of what
    this rank sends to and receives from other ranks"""
    out = []
    for it in items:
        if it["t"] == "coll" and it.get("group", 0) > 0 and it["kind"] in ("send", "recv"):
            prev = out[-1] if out else None
            if prev and prev.get("_group") == it["group"]:
                prev["_n"] += 1
            else:
                prev = dict(it, t="coll", kind="send", name="all_to_all (grouped send/recv)", _group=it["group"], _s=0, _r=0, _n=1)
                out.append(prev)
            if it["peer"] != it.get("rank", -1):
                prev["_s" if it["kind"] == "send" else "_r"] += it["bytes"]
            prev["bytes"] = max(prev["_s"], prev["_r"])
            continue
        out.append(it)
    return out


def label(it):
    t = it["t"]
    if t == "kernel":
        return re.sub(r"<.*", "", it["name"])
    if t == "gemm":
        small = min(it["m"], it["n"], it["k"])
        cls = next(lim for lim, _ in GEMM_EFFICIENCY if small >= lim)
        return "gemm %s%s, min(m,n,k) >= %d%s" % (it["a"], "x" + it["b"] if it["b"] != it["a"] else "", cls,
                                                   ", batched" if it["batch"] > 1 else "")
    if t == "coll":
        return it.get("name") or "%s (%s, %d ranks)" % (it["kind"], it.get("comm", "?"), it["nranks"])
    if t == "copy":
        return "copy %s%s" % (it["kind"], " (blocking)" if it.get("blocking") else "")
    return t


def _union(iv):
    """sorted intervals [(s, e)] merged into disjoint ones"""
    out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _overlap(a, b):
    """the length of the intersection of two lists of disjoint sorted intervals"""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            tot += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def set_nccl_ctas(n):
    """predict.py --nccl-ctas: the CTAs of a collective whose communicator is not capped (NCCL_CTAS; each CTA still
    moves NCCL_CTA_BW)"""
    global NCCL_CTAS
    NCCL_CTAS = n


def coll_ctas(it):
    """the CTAs a collective's NCCL kernel holds while it runs: its communicator's cap (ncclConfig_t.maxCTAs, logged as
    "ctas" by the NCCL twin: --nccl-ctas-internode, the embedding's 2), else NCCL_CTAS; 0 for a rank alone (a local copy)"""
    if it["t"] != "coll" or it.get("nranks", 1) <= 1:
        return 0
    return it.get("ctas") or NCCL_CTAS


def coll_place(it, gpus_per_node):
    """where a collective's bytes go: "intra" (NVLink, one node), "inter" (the node's network) or "self" """
    if it.get("nranks", 1) <= 1:
        return "self"
    return "intra" if len({w // gpus_per_node for w in it.get("world_ranks", [])}) <= 1 else "inter"


def link_bandwidth(place, dev):
    return RATES[dev]["nvlink_busbw"] if place == "intra" else IB_BUSBW


def coll_bandwidth(it, dev, gpus_per_node):
    """a collective's bus bandwidth alone on its link: the link's, or what its CTAs move (NCCL_CTA_BW each) if less"""
    return min(link_bandwidth(coll_place(it, gpus_per_node), dev), coll_ctas(it) * NCCL_CTA_BW)


class StepFunction:
    """a piecewise-constant level over time from (t, +-delta) edges, and its mean over an interval"""
    def __init__(self, edges):
        self.ts, self.level, self.area = [0.0], [0.0], [0.0]
        for t, dv in sorted(edges):
            self.area.append(self.area[-1] + self.level[-1] * (t - self.ts[-1]))
            self.ts.append(t)
            self.level.append(self.level[-1] + dv)

    def integral(self, t):
        i = bisect.bisect_right(self.ts, t) - 1
        return self.area[i] + self.level[i] * (t - self.ts[i])

    def mean(self, a, b):
        return (self.integral(b) - self.integral(a)) / (b - a)


def union_edges(intervals):
    """(t, +-1) edges of the union of the (start, end) intervals: a StepFunction of 1 where any of them is"""
    edges, cur = [], None
    for a, b in sorted(intervals):
        if cur and a <= cur[1]:
            cur[1] = max(cur[1], b)
            continue
        if cur:
            edges += [(cur[0], 1), (cur[1], -1)]
        cur = [a, b]
    return edges + ([(cur[0], 1), (cur[1], -1)] if cur else [])


def share_stretch(ops, dev, gpus_per_node):
    """each op's time factor for what it shares with the collectives in flight beside it:
    - a FLOP-bound kernel or GEMM: the SMs their CTAs hold, SMS / (SMS - C), C averaged over its interval, plus
      HELD_CTAS_EXTRA times the share of its interval with any collective's CTAs in flight;
    - a bytes-bound kernel: 1 + HELD_CTAS_EXTRA times that share;
    - a collective: its link (NVLink within a node, the network across nodes) with the others on it, processor-sharing:
      the bandwidth all of them would draw alone (coll_bandwidth, itself included) over the link's, averaged over its
      interval, when that is more than 1;
    - a FLOP-bound kernel or GEMM beside others on other streams: 1 + n (2 PAIR_EFFICIENCY - 1), n the others in flight
      averaged over its interval;
    1 for copies"""
    sms = SMS[dev]
    ctas, links, busy, held_spans = [], {"intra": [], "inter": []}, [], []
    for o in ops:
        it = o["item"]
        if it["t"] in ("kernel", "gemm") and o["bound"] in ("FLOPs", "measured") and o["end"] > o["start"]:
            busy += [(o["start"], 1), (o["end"], -1)]
        if it["t"] == "coll" and o["end"] > o["start"]:
            o["place"] = place = coll_place(it, gpus_per_node)
            c = coll_ctas(it)
            if c:
                ctas += [(o["start"], c), (o["end"], -c)]
                held_spans.append((o["start"], o["end"]))
            if place in links:
                b = coll_bandwidth(it, dev, gpus_per_node)
                links[place] += [(o["start"], b), (o["end"], -b)]
    held, computing, any_held = StepFunction(ctas), StepFunction(busy), StepFunction(union_edges(held_spans))
    demand = {k: StepFunction(v) for k, v in links.items()}
    out = []
    for o in ops:
        f, it = 1.0, o["item"]
        if o["end"] > o["start"]:
            if it["t"] in ("kernel", "gemm") and o["bound"] in ("FLOPs", "measured"):
                if ctas:
                    f = sms / (sms - min(held.mean(o["start"], o["end"]), COMM_CTAS_MAX * sms)) \
                        + HELD_CTAS_EXTRA * any_held.mean(o["start"], o["end"])
                others = computing.mean(o["start"], o["end"]) - 1   # (itself: 1 over all of its interval)
                if others > 1e-9:
                    f *= 1 + others * (2 * PAIR_EFFICIENCY - 1)
            elif it["t"] == "kernel" and o["bound"] == "bytes" and ctas:
                f = 1 + HELD_CTAS_EXTRA * any_held.mean(o["start"], o["end"])
            elif it["t"] == "coll" and o["place"] in links:
                f = max(1.0, demand[o["place"]].mean(o["start"], o["end"]) / link_bandwidth(o["place"], dev))
        out.append(f)
    return out


def simulate(items, dev="h100-sxm", gpus_per_node=8, share_sms=True):
    """the predicted timeline: returns dict(step, ops=[(item, start, end, bound, flops, bytes)], host_busy, ...); share_sms:
    the collectives slow the compute beside them and share their links (share_stretch, iterated to its fixed point)"""
    stretch, costs, merged = None, {}, merge_groups(items)
    for _ in range(SHARE_ITERATIONS if share_sms else 1):
        res = timeline(merged, dev, gpus_per_node, stretch, costs)
        new = share_stretch(res["ops"], dev, gpus_per_node) if share_sms else None
        if new is None or not any(f > 1 for f in new) or \
                (stretch is not None and max(abs(a - b) for a, b in zip(new, stretch)) < SHARE_TOLERANCE):
            break
        # the next factors halfway between: undamped, a step that the stretch lengthened moves the collectives past the
        # compute it slowed, and the iterations swing about the fixed point
        stretch = new if stretch is None else [(a + b) / 2 for a, b in zip(new, stretch)]
    return analyse(res)


def timeline(items, dev, gpus_per_node, stretch=None, costs=None):
    """the streams' and the host's timeline of the items (merge_groups's): every op's start and end, the ranges, the host's
    time; stretch: each op's time factor (share_stretch; None: 1); costs: each op's cost() and label by its index, kept
    between calls over the same items"""
    costs = {} if costs is None else costs
    host = 0.0
    free = {}           # stream -> time its issued work completes
    events = {}         # event -> the time its last record completes
    ops = []
    host_sync_wait = 0.0
    # the critical path: each item's predecessor is what its start waited for (its stream's previous item or the
    # event it waits on, else the host, whose own predecessor is the item its last sync waited for)
    spred, epred, host_pred = {}, {}, None
    ranges, open_ranges = [], {}   # --profile's ranges on the predicted timeline (stream -1: the host)
    ctx = kernel_context(items)   # what some kernel formulas need from the rest of the step (kernel_cost.py)
    # --moe-gemm grouped's kernels (model/moe_grouped.cuh, moe_grouped_tma.cuh: every launch named experts_*grouped*) have
    # no cost formula or measured rate yet: priced at the launch minimum they would make the step look faster than
    # anything measured, so no prediction is made
    grouped = sorted({it["name"] for it in items if it["t"] == "kernel" and is_grouped_expert_kernel(it["name"])})
    if grouped:
        die("the step runs --moe-gemm grouped's kernels (%s), which have no cost formula yet (dev/predict/kernel_cost.py): "
            "no prediction; time them with make bench-gpu (dev/cuda/moe_grouped)" % ", ".join(grouped))
    for it in items:
        t = it["t"]
        if t in ("kernel", "gemm", "coll", "copy"):
            host += HOST_US["copy" if t == "copy" else t] * 1e-6
            if len(ops) not in costs:
                costs[len(ops)] = cost(it, dev, gpus_per_node, ctx) + (label(it),)
            d, bound, flops, nbytes, name = costs[len(ops)]
            if stretch is not None:
                d *= stretch[len(ops)]
            s = it.get("stream", 0)
            start = max(host, free.get(s, 0.0))
            end = start + d
            free[s] = end
            ops.append({"item": it, "label": name, "stream": s, "start": start, "end": end, "bound": bound,
                        "flops": flops, "bytes": nbytes, "pred": spred.get(s) if start > host else host_pred})
            spred[s] = len(ops) - 1
            if t == "copy" and it.get("blocking"):
                host_sync_wait += max(0.0, end - host)
                host = end + SYNC_US * 1e-6
                host_pred = len(ops) - 1
        elif t == "record":
            host += HOST_US["record"] * 1e-6
            events[it["event"]] = max(free.get(it["stream"], 0.0), host)
            epred[it["event"]] = spred.get(it["stream"])
        elif t == "wait":
            host += HOST_US["wait"] * 1e-6
            s = it["stream"]
            if events.get(it["event"], 0.0) > free.get(s, 0.0):
                free[s] = events[it["event"]]
                spred[s] = epred.get(it["event"])
        elif t == "sync":
            what = it["what"]
            until = (max(free.values()) if free else 0.0) if what == "device" else \
                events.get(it.get("event"), 0.0) if what == "event" else free.get(it.get("stream", 0), 0.0)
            if until > host:
                host_sync_wait += until - host
                host_pred = max((i for i, o in enumerate(ops) if o["end"] == until), default=host_pred)
            host = max(host, until) + SYNC_US * 1e-6
        elif t == "range":   # --profile's named ranges: where the stream (or the host) is when each begins and ends
            s = it["stream"]
            at = host if s < 0 else max(free.get(s, 0.0), host)
            if it["ph"] == "B":
                open_ranges.setdefault(s, []).append((it["name"], at))
            elif open_ranges.get(s):
                name, t0 = open_ranges[s].pop()
                ranges.append({"name": name, "stream": s, "start": t0, "end": max(at, t0)})
        elif t == "mark":
            pass
        else:
            die("unknown work-log line type %r" % t)
    return {"step": max([host] + list(free.values())), "ops": ops, "ranges": ranges, "device": dev, "host_issue_end": host,
            "host_sync_wait": host_sync_wait, "host_pred": host_pred}


def analyse(res):
    """the timeline's exposed communication, idle time and critical path"""
    step, ops, host, host_pred = res["step"], res["ops"], res["host_issue_end"], res["host_pred"]
    comp = _union(sorted((o["start"], o["end"]) for o in ops if o["item"]["t"] in ("kernel", "gemm")))
    cs, upto = [s for s, _ in comp], [0.0]   # the compute's union: starts, and its length before each interval
    for s, e in comp:
        upto.append(upto[-1] + e - s)

    def covered(t):   # the compute's time before t
        i = bisect.bisect_right(cs, t) - 1
        return 0.0 if i < 0 else upto[i] + min(t, comp[i][1]) - comp[i][0]
    for o in ops:   # exposed communication: collective time no kernel or GEMM overlaps
        if o["item"]["t"] == "coll":
            o["exposed"] = (o["end"] - o["start"]) - (covered(o["end"]) - covered(o["start"]))
    # the step's exposed communication: the time some collective runs and no kernel or GEMM does (the union of the
    # collectives' intervals less the compute's). Not the sum of the per-collective figures above: two collectives in
    # the same gap (a gather beside a reduce-scatter, both beside an exchange the experts wait for) would count it twice.
    coll = _union(sorted((o["start"], o["end"]) for o in ops if o["item"]["t"] == "coll"))
    exposed_comm = sum(e - s for s, e in coll) - _overlap(coll, comp)
    busy = []   # the time any stream is busy (union), and the GPU idle time it leaves
    for s, e in sorted((o["start"], o["end"]) for o in ops):
        if busy and s <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e)
        else:
            busy.append([s, e])
    gpu_busy = sum(e - s for s, e in busy)
    path, i = [], (max(range(len(ops)), key=lambda j: ops[j]["end"]) if ops else None)
    if ops and host > ops[i]["end"]:
        i = host_pred
    while i is not None and len(path) <= len(ops):
        path.append(i)
        i = ops[i]["pred"]
    crit = {}
    for j in path:
        crit[ops[j]["label"]] = crit.get(ops[j]["label"], 0.0) + ops[j]["end"] - ops[j]["start"]
    return {"critical": sorted(crit.items(), key=lambda kv: -kv[1]), "critical_device": sum(crit.values()),
            "step": step, "ops": ops, "ranges": res["ranges"], "device": res["device"], "host_issue_end": host,
            "host_sync_wait": res["host_sync_wait"], "gpu_idle": step - gpu_busy, "exposed_comm": exposed_comm,
            "gemm_flops": sum(o["flops"] for o in ops if o["item"]["t"] == "gemm")}


def sinks(res):
    rows = {}
    for o in res["ops"]:
        r = rows.setdefault(o["label"], {"name": o["label"], "count": 0, "time": 0.0, "exposed": 0.0, "bounds": {}, "flops": 0.0})
        r["count"] += 1
        d = o["end"] - o["start"]
        r["time"] += d
        r["flops"] += o["flops"]
        r["exposed"] += o.get("exposed", 0.0)
        r["bounds"][o["bound"]] = r["bounds"].get(o["bound"], 0.0) + d
    for r in rows.values():
        b = max(r["bounds"], key=r["bounds"].get)
        if b == "comm":
            b = "exposed-comm" if r["exposed"] > 0.5 * r["time"] else "comm (hidden)"
        r["bound"] = b
    return sorted(rows.values(), key=lambda r: -r["time"])


def extrapolate(a, b, l1, l2, lt):
    """linear in the layer count through two simulated runs (l1, l2 layers) to lt layers"""
    f = (lt - l1) / float(l2 - l1)
    lin = lambda x, y: x + (y - x) * f
    out = {k: lin(a[k], b[k]) for k in ("step", "exposed_comm", "gemm_flops", "host_sync_wait", "gpu_idle")}
    ra, rb = {r["name"]: r for r in sinks(a)}, {r["name"]: r for r in sinks(b)}
    rows = []
    for name in set(ra) | set(rb):
        x = ra.get(name, {"count": 0, "time": 0.0, "exposed": 0.0, "flops": 0.0, "bound": rb.get(name, {}).get("bound")})
        y = rb.get(name, {"count": 0, "time": 0.0, "exposed": 0.0, "flops": 0.0, "bound": x["bound"]})
        rows.append({"name": name, "count": round(lin(x["count"], y["count"])), "time": lin(x["time"], y["time"]),
                     "exposed": lin(x["exposed"], y["exposed"]), "flops": lin(x["flops"], y["flops"]), "bound": y["bound"]})
    out["sinks"] = sorted(rows, key=lambda r: -r["time"])
    out["device"] = a["device"]
    out["critical"] = [(n, lin(dict(a["critical"]).get(n, 0.0), t)) for n, t in b["critical"]]
    out["critical_device"] = lin(a["critical_device"], b["critical_device"])
    for k in ("rank", "ranks_logged"):
        out[k] = b.get(k, 0)
    out["fastest"] = lin(a.get("fastest", a["step"]), b.get("fastest", b["step"]))
    return out


def report(res, rows, args, out=sys.stdout):
    step = res["step"]
    peak = RATES[res["device"]]["bf16"]
    print("predicted step on %s (BF16 peak %.1f TFLOP/s): %.3f ms" % (res["device"], peak / 1e12, step * 1e3), file=out)
    if args.flops_per_token and args.tokens:
        mfu = args.flops_per_token * args.tokens / (step * peak * max(1, args.ranks))
        print("MFU (the project's count: %.4g FLOPs/token x %d tokens / (%d GPU(s) x peak)): %.1f%%" %
              (args.flops_per_token, args.tokens, max(1, args.ranks), 100 * mfu), file=out)
    if res.get("ranks_logged", 1) > 1:
        print("ranks: %d logs; the slowest, rank %d, sets the step (the fastest rank's alone: %.3f ms): the collectives wait for it"
              % (res["ranks_logged"], res["rank"], res["fastest"] * 1e3), file=out)
    if getattr(args, "streams_independent", False):
        print("streams: independent (--streams-independent: the collectives' SMs and links cost the rest nothing)", file=out)
    else:
        print("streams: the collectives hold their CTAs' SMs (%d each unless their communicator is capped) and share their links"
              % NCCL_CTAS, file=out)
    print("GEMM FLOPs %.4g = %.1f%% of this GPU's BF16 peak over the step" % (res["gemm_flops"], 100 * res["gemm_flops"] / (step * peak)), file=out)
    print("exposed communication %.3f ms (%.1f%% of the step); GPU idle %.3f ms; host blocked in syncs %.3f ms" %
          (res["exposed_comm"] * 1e3, 100 * res["exposed_comm"] / step if step else 0, res["gpu_idle"] * 1e3, res["host_sync_wait"] * 1e3), file=out)
    if "critical" in res:
        print("critical path: %.3f ms of device work (%s), %.3f ms host issue and sync latency" %
              (res["critical_device"] * 1e3, ", ".join("%s %.3f ms" % (n, t * 1e3) for n, t in res["critical"][:4]),
               (step - res["critical_device"]) * 1e3), file=out)
    if MEASURED_GEMMS_SOURCE.get(res["device"]) and res.get("ops"):
        n, tot, share = measured_share(res)
        print("GEMMs at their measured times: %d of %d calls (%.1f%% of the GEMM FLOPs), from %s; the others by the rate table"
              % (n, tot, 100 * share, MEASURED_GEMMS_SOURCE[res["device"]]), file=out)
    print("%-52s %7s %10s %7s  %s" % ("time sink", "count", "ms", "% step", "bound by"), file=out)
    for r in rows[:args.top]:
        print("%-52s %7d %10.3f %6.1f%%  %s" % (r["name"][:52], r["count"], r["time"] * 1e3, 100 * r["time"] / step, r["bound"]), file=out)
    print("(device time per row, summed over streams: rows may overlap one another; a step is not their sum)", file=out)


def write_gemm_shapes(path, steps):
    """the distinct GEMMs of the steps (each rank's, each run's), the largest count per step of each, most FLOPs first"""
    count, flops = {}, {}
    for items in steps:
        here = {}
        for it in items:
            if it["t"] == "gemm":
                k = gemm_key(it)
                here[k] = here.get(k, 0) + 1
                flops[k] = it["flops"]
        for k, c in here.items():
            count[k] = max(count.get(k, 0), c)
    with open(path, "w") as f:
        f.write("# m n k batch a b d trans_a trans_b beta fast_accum a_scale_mode b_scale_mode count  (predict.py --gemm-shapes:\n"
                "# cuBLASLt's column-major shapes, the GEMMs of one step; dev/cuda/matmul -s times them)\n")
        for k in sorted(count, key=lambda k: -flops[k] * count[k]):
            f.write("%s %d\n" % (k, count[k]))


def measured_share(res):
    """(GEMM calls at measured times, all GEMM calls, their FLOP share) of a simulated step"""
    g = [o for o in res.get("ops", []) if o["item"]["t"] == "gemm"]
    m = [o for o in g if o["bound"] == "measured"]
    tot = sum(o["flops"] for o in g)
    return len(m), len(g), (sum(o["flops"] for o in m) / tot if tot else 0.0)


RANGE_TID = 1000   # the trace's tracks of --profile's ranges: 999 the host, 1000 + s stream s


def trace(res, path):
    ev = []
    for o in res["ops"]:
        it = o["item"]
        ev.append({"name": o["label"] if it["t"] != "kernel" else it["name"], "ph": "X", "ts": o["start"] * 1e6,
                   "dur": (o["end"] - o["start"]) * 1e6, "pid": 0, "tid": o["stream"],
                   "args": dict({"bound": o["bound"], "flops": o["flops"], "bytes": o["bytes"]},
                                **({"gemm": gemm_key(it)} if it["t"] == "gemm" else {}))})   # (calibrate.py --kernels)
    for s in sorted({o["stream"] for o in res["ops"]}):
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": "stream %d (predicted)" % s}})
    # --profile's ranges (when the emulated run had --profile): the same names as on a GPU, at their predicted times
    for r in res.get("ranges", []):
        ev.append({"name": r["name"], "ph": "X", "ts": r["start"] * 1e6, "dur": (r["end"] - r["start"]) * 1e6, "pid": 0,
                   "tid": RANGE_TID + max(r["stream"], -1), "args": {"predicted": True}})
    for s in sorted({r["stream"] for r in res.get("ranges", [])}):
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": RANGE_TID + s,
                   "args": {"name": "ranges: host (predicted)" if s < 0 else "ranges: stream %d (predicted)" % s}})
    with open(path, "w") as f:
        json.dump({"traceEvents": ev, "otherData": {"predicted_step_ms": res["step"] * 1e3, "device": res["device"],
                                                    "note": "predicted by dev/predict/predict.py, not measured"}}, f)


def predict_rank(job):
    """one rank's log (path, step, device, gpus per node, share_sms) simulated"""
    path, step, dev, gpus_per_node, share = job
    return simulate(one_step(read_log(path), step), dev, gpus_per_node, share)


def main(argv=None):
    ap = argparse.ArgumentParser(description="predict a GPU training step from the emulator's work log (SIMT_WORKLOG)")
    ap.error = die   # one line, exit 2
    ap.add_argument("logs", nargs="+", help="the work log; two logs with --layers/--target-layers")
    ap.add_argument("--device", default="h100-sxm", choices=sorted(RATES))
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--step", type=int, default=None, help="which step of the log (default: the last whole one)")
    ap.add_argument("--flops-per-token", type=float, default=0.0, help="the MFU count (the trainer's start-up 'mfu:' line)")
    ap.add_argument("--tokens", type=int, default=0, help="tokens per step over all ranks")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--layers", default=None, help="L1,L2: the layer counts of the two logs")
    ap.add_argument("--target-layers", type=int, default=None)
    ap.add_argument("--trace", default=None, help="write the predicted timeline as Chrome trace JSON")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object instead")
    ap.add_argument("--gemm-shapes", default=None, metavar="OUT",
                    help="write the step's distinct GEMMs (per-step counts) for dev/cuda/matmul -s, and predict as usual")
    ap.add_argument("--nccl-ctas", type=int, default=NCCL_CTAS, metavar="N",
                    help="what if NCCL's default were N CTAs a collective (default %d, an assumption; capped communicators "
                    "keep their cap)" % NCCL_CTAS)
    ap.add_argument("--streams-independent", action="store_true",
                    help="the model before session 57: a collective's SMs and link cost the rest nothing (share_stretch off)")
    ap.add_argument("--measured-gemms", default=None, metavar="FILE",
                    help="the measured GEMM table (default: gemm_measured_<device>.json here, when it exists)")
    args = ap.parse_args(argv)
    if not 1 <= args.nccl_ctas <= 64:
        ap.error("--nccl-ctas %d: want 1..64" % args.nccl_ctas)
    set_nccl_ctas(args.nccl_ctas)
    load_measured_gemms(args.device, args.measured_gemms)
    if len(args.logs) > 2 or (len(args.logs) == 2) != (args.layers is not None and args.target_layers is not None):
        ap.error("one log, or two logs with --layers L1,L2 and --target-layers L")
    if args.gemm_shapes:
        write_gemm_shapes(args.gemm_shapes, [one_step(read_log(f), args.step) for p in args.logs for f in rank_logs(p)])
    res = []
    for p in args.logs:   # each run: every rank's log, the slowest rank's prediction (the collectives wait for it)
        jobs = [(f, args.step, args.device, args.gpus_per_node, not args.streams_independent) for f in rank_logs(p)]
        if len(jobs) > 2 and (os.cpu_count() or 1) > 1:   # (hundreds of ranks: a second each)
            with multiprocessing.Pool(min(os.cpu_count(), 16)) as pool:
                per_rank = pool.map(predict_rank, jobs)
        else:
            per_rank = [predict_rank(j) for j in jobs]
        slow = max(range(len(per_rank)), key=lambda r: per_rank[r]["step"])
        res.append(dict(per_rank[slow], rank=slow, ranks_logged=len(per_rank), fastest=min(r["step"] for r in per_rank)))
    if len(res) == 2:
        try:
            l1, l2 = (int(x) for x in args.layers.split(","))
        except ValueError:
            ap.error("--layers %r: want L1,L2" % args.layers)
        if l1 == l2:
            ap.error("--layers: the two runs need different layer counts")
        out = extrapolate(res[0], res[1], l1, l2, args.target_layers)
        rows = out["sinks"]
    else:
        out, rows = res[0], sinks(res[0])
    if args.trace:
        trace(res[-1], args.trace)
    if args.json:
        summary = {k: out[k] for k in ("step", "exposed_comm", "gemm_flops", "host_sync_wait", "gpu_idle", "device")}
        summary.update({"slowest_rank": out.get("rank", 0), "ranks_logged": out.get("ranks_logged", 1),
                        "critical": [[n, t] for n, t in out.get("critical", [])[:8]]})
        if args.flops_per_token and args.tokens:
            summary["mfu"] = args.flops_per_token * args.tokens / (out["step"] * RATES[args.device]["bf16"] * max(1, args.ranks))
        summary["sinks"] = [{k: r[k] for k in ("name", "count", "time", "exposed", "bound")} for r in rows]
        print(json.dumps(summary))
    else:
        report(out, rows, args)


if __name__ == "__main__":
    main()
