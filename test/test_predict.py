#!/usr/bin/env python3
"""test_predict.py — the step-time model (dev/predict/predict.py) on hand-computed cases, and the emulator's work log
(SIMT_WORKLOG, test/simt/counters.h) of a real emulated step.

  test_predict.py                     the model: a single GEMM, a memory-bound kernel, a collective, two streams
                                      with and without an event (overlap / serialisation), a host sync that empties
                                      the pipeline; negative controls: a reduce-scatter moved onto the compute stream,
                                      a sync per layer, a kernel reading twice the bytes
                                      measured GEMMs: --gemm-shapes's list, calibrate.py --gemms's table, a GEMM of
                                      the table at its measured time, any other by the rate table
  test_predict.py --e2e LOG COUNTERS L d H KV E k F V TOKENS SEQ
                                      a dbrx-tiny-shaped step's log: it parses, its GEMM FLOPs = the MFU formula's
                                      matmul count (model/config.h: 6 N_matmul per token; the attention term is the
                                      flash kernels', not cuBLASLt's), every launch / GEMM / sync of the emulator's
                                      counters (SIMT_STEP_COUNTERS line of that step) is in the log
Expected values are computed here from the rate table's documented constants (the formulas in predict.py's top
comment), never from the model's own output. Prints one "pass ..." / "fail ..." line per check (lib.sh verdicts).
"""
import contextlib
import io
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "predict"))
import predict as P  # noqa: E402

US = 1e-6
R = P.RATES["h100-sxm"]
HBM = R["hbm"] * P.KERNEL_HBM_FRACTION.get("swiglu_forward_kernel", P.HBM_FRACTION)   # (SW's kernel: its measured share)


def check(ok, what):
    print(("pass " if ok else "fail ") + what)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def K(name, n, stream=0):   # a swiglu_forward kernel over n elements: 6 n bytes (kernel_cost.KERNELS)
    return {"t": "kernel", "name": name, "grid": [1, 1, 1], "block": [256, 1, 1], "smem": 0, "stream": stream,
            "args": [True, True, True, n]}


def SW(n, stream=0):
    return K("swiglu_forward_kernel<8>", n, stream)


SYNC = {"t": "sync", "what": "device", "stream": 0}


def step(items, dev="h100-sxm"):
    return P.simulate(items, dev)


def model_cases():
    # a single GEMM, 8192^3 BF16: FLOPs-bound at the >= 4096 class's efficiency
    g = {"t": "gemm", "m": 8192, "n": 8192, "k": 8192, "batch": 1, "a": "bf16", "b": "bf16", "d": "bf16", "beta": 0, "stream": 0}
    d = 2.0 * 8192 ** 3 / (989.4e12 * 0.70)
    r = step([g, SYNC])
    check(close(r["step"], 6 * US + d + 5 * US), "one GEMM 8192^3 BF16 on an H100 SXM: %.4f ms predicted = 6 us issue + 2 m n k / "
          "(989.4 TFLOP/s x 0.70) + 5 us sync = %.4f ms" % (r["step"] * 1e3, (11 * US + d) * 1e3))
    check(r["ops"][0]["bound"] == "FLOPs", "the GEMM is bound by FLOPs (%s)" % r["ops"][0]["bound"])
    # the same GEMM as FP8: half the time of the compute
    g8 = dict(g, a="e4m3", b="e4m3")
    r8 = step([g8, SYNC])
    check(close(r8["step"], 11 * US + 2.0 * 8192 ** 3 / (1978.9e12 * 0.70)), "the GEMM in FP8 at the FP8 peak (1978.9 TFLOP/s)")
    # block-scaled FP8 (A in 128 x 128 blocks, B in 1 x 128 tiles: scale modes 2 and 1): at 1.1e12 FLOPs (>= 1e11) at
    # 1.45 x the BF16 rate of its shape (predict.py's FP8_BLOCK_GEMM_VS_BF16, session 45's H100 at the 132B slice's
    # expert GEMMs); a GEMM below 1e11 FLOPs (1024 x 1024 x 4096: 8.6e9) at the BF16 rate (the assumption there)
    rb = step([dict(g8, a_scale_mode=2, b_scale_mode=1), SYNC])
    check(close(rb["step"], 11 * US + d / 1.45), "the GEMM in block-scaled FP8 at 1.45 x the BF16 rate: %.4f ms (BF16 %.4f ms)"
          % (rb["step"] * 1e3, r["step"] * 1e3))
    small = dict(g, m=1024, n=1024, k=4096)
    rs, rsb = step([small, SYNC]), step([dict(small, a="e4m3", b="e4m3", a_scale_mode=2, b_scale_mode=1), SYNC])
    check(close(rsb["step"], rs["step"]) and close(rs["step"], 11 * US + 2.0 * 1024 * 1024 * 4096 / (989.4e12 * 0.58)),
          "a block-scaled GEMM of 8.6e9 FLOPs at the BF16 rate of its shape: %.4f ms (BF16 %.4f ms)" % (rsb["step"] * 1e3, rs["step"] * 1e3))
    # the FP8 quantisation kernel at 31% of HBM (KERNEL_HBM_FRACTION, fitted): one tensor of 2^20 x 128, one given
    # scale, the row-wise codes only: reads 2 B per element + the scale, writes 1 B per element
    rows = 1 << 20
    qk = {"t": "kernel", "name": "fp8_quantize_kernel<FP8Q_TENSOR>", "grid": [rows // 128, 1, 1], "block": [256, 1, 1], "smem": 0,
          "stream": 0, "args": [True, rows, 128, [False, False, 1, rows, rows // 128], 0, True, False, 0,
                                [True, False, False, False, False, False]]}
    rq = step([qk, SYNC])
    check(close(rq["step"], 9 * US + (3.0 * rows * 128 + 4) / (3.35e12 * 0.31)),
          "fp8_quantize_kernel over 2^27 elements: %.2f us = 4 us issue + (3 B / element + 4) / (0.31 x 3.35 TB/s) + 5 us" % (rq["step"] / US))
    # a memory-bound kernel: swiglu over 2^24 elements reads 2 and writes 1 BF16 each: 6 n bytes at its measured share
    # (KERNEL_HBM_FRACTION: 0.891) of 3.35 TB/s
    n = 1 << 24
    r = step([SW(n), SYNC])
    d = 6.0 * n / HBM
    check(close(r["step"], 4 * US + d + 5 * US), "swiglu_forward over 2^24: %.2f us = 4 us issue + 6 n B / (its share x 3.35 TB/s) + 5 us"
          % (r["step"] / US))
    check(r["ops"][0]["bytes"] == 6 * n and r["ops"][0]["bound"] == "bytes", "its bytes (6 n) and its bound (bytes)")
    r2 = step([SW(2 * n), SYNC])
    check(close(r2["step"] - r["step"], d), "negative control: a kernel reading twice the bytes takes %.2f us more (= its "
          "first duration)" % ((r2["step"] - r["step"]) / US))
    # a collective: all-reduce of 1 GiB BF16 over 8 GPUs of one node: 2 (n-1)/n x bytes / 450 GB/s + 10 us
    c = {"t": "coll", "kind": "all_reduce", "comm": "world", "nranks": 8, "count": 1 << 29, "elem_bytes": 2,
         "bytes": 1 << 30, "rank": 0, "peer": 0, "group": 0, "stream": 1, "world_ranks": list(range(8))}
    r = step([c, SYNC])
    d = (1 << 30) * 2 * 7 / 8 / 450e9 + 10 * US
    check(close(r["step"], 5 * US + d + 5 * US), "all-reduce 1 GiB over 8 H100 SXM (NVLink): %.3f ms = 2(n-1)/n x 1 GiB / 450 GB/s "
          "+ 10 us latency + 5 us issue + 5 us sync" % (r["step"] * 1e3))
    check(close(r["exposed_comm"], d), "with no compute beside it, all of it is exposed (%.3f ms)" % (r["exposed_comm"] * 1e3))
    # two such collectives at once on two streams (a gather beside a reduce-scatter), nothing else: the step's exposed
    # communication is the time some collective runs with no compute, counted once (not d + d)
    r = P.simulate([c, dict(c, stream=2), SYNC], share_sms=False)
    check(close(r["exposed_comm"], d + 5 * US), "two collectives side by side with no compute, streams independent: exposed %.3f ms "
          "= the union of their intervals (%.3f ms + 5 us issue), not their sum" % (r["exposed_comm"] * 1e3, d * 1e3))
    check(close(sum(o["exposed"] for o in r["ops"] if o["item"]["t"] == "coll"), 2 * d), "negative control: the per-collective "
          "figures (the sinks table's) sum to 2 x %.3f ms" % (d * 1e3))
    c2 = dict(c, world_ranks=[0, 1, 2, 3, 8, 9, 10, 11])
    r = step([c2, SYNC])
    d2 = (1 << 30) * 2 * 7 / 8 / 45e9 + 25 * US
    check(close(r["step"], 10 * US + d2), "the same over 2 nodes (InfiniBand, 45 GB/s busbw per GPU, 25 us): %.2f ms" % (r["step"] * 1e3))
    # two streams: A (stream 0) and B (stream 1) overlap without an event; with A -> record -> wait -> B they serialise
    da, db = 6.0 * n / HBM, 6.0 * (n // 2) / HBM
    r = step([SW(n, 0), SW(n // 2, 1), SYNC])
    want = max(4 * US + da, 8 * US + db) + 5 * US
    check(close(r["step"], want), "two streams, no event: they overlap, step = max(A, B) + issue + sync = %.2f us" % (r["step"] / US))
    ev = [SW(n, 0), {"t": "record", "event": 1, "stream": 0}, {"t": "wait", "event": 1, "stream": 1}, SW(n // 2, 1), SYNC]
    r = step(ev)
    want = 4 * US + da + db + 5 * US
    check(close(r["step"], want), "two streams with an event between them: serialised, step = A + B + issue + sync = %.2f us" % (r["step"] / US))
    # a host sync empties the pipeline: 10 GPU-bound kernels, then 10 more; a stream sync between them costs the
    # host's wake-up and the next launch's issue, during which the GPU idles
    ks = [SW(n) for _ in range(10)]
    base = step(ks + ks + [SYNC])
    synced = step(ks + [{"t": "sync", "what": "stream", "stream": 0}] + ks + [SYNC])
    check(close(base["step"], 4 * US + 20 * da + 5 * US), "20 GPU-bound kernels back to back: step = 4 us + 20 x kernel + 5 us")
    check(close(synced["step"] - base["step"], 5 * US + 4 * US), "a host sync between them drains the pipeline: +%.2f us = 5 us "
          "sync + 4 us issue of the next kernel" % ((synced["step"] - base["step"]) / US))


def shared_sms_and_links():
    """the collectives' CTAs take SMs from the compute beside them, and collectives on one link share it (share_stretch)"""
    sms = 132.0
    g = {"t": "gemm", "m": 8192, "n": 8192, "k": 8192, "batch": 1, "a": "bf16", "b": "bf16", "d": "bf16", "beta": 0, "stream": 0}
    dg = 2.0 * 8192 ** 3 / (989.4e12 * 0.70)
    # a reduce-scatter across 2 nodes, long enough to cover the GEMM: 8 GiB FP32 over 8 ranks at 45 GB/s
    rs = {"t": "coll", "kind": "reduce_scatter", "comm": "shard", "nranks": 8, "count": 1 << 28, "elem_bytes": 4, "bytes": 8 << 30,
          "rank": 0, "peer": 0, "group": 0, "stream": 1, "world_ranks": [0, 1, 2, 3, 8, 9, 10, 11]}
    drs = (8 << 30) * 7 / 8 / 45e9 + 25 * US
    r = step([rs, g, SYNC])
    gemm = [o for o in r["ops"] if o["item"]["t"] == "gemm"][0]
    x = P.HELD_CTAS_EXTRA   # (what held CTAs cost beyond their SMs, measured: predict.py)
    check(close(gemm["end"] - gemm["start"], dg * (sms / (sms - 24) + x), 1e-9), "a GEMM beside a collective's 24 CTAs runs on the "
          "108 SMs left, plus the extra measured: %.4f ms = %.4f ms x (132 / 108 + %.3f)" % ((gemm["end"] - gemm["start"]) * 1e3, dg * 1e3, x))
    coll = [o for o in r["ops"] if o["item"]["t"] == "coll"][0]
    check(close(coll["end"] - coll["start"], drs), "the collective alone on its link keeps its time (%.3f ms)" % (drs * 1e3))
    r0 = P.simulate([rs, g, SYNC], share_sms=False)
    g0 = [o for o in r0["ops"] if o["item"]["t"] == "gemm"][0]
    check(close(g0["end"] - g0["start"], dg), "negative control: with the streams independent (share_sms=False) the GEMM keeps "
          "%.4f ms" % (dg * 1e3))
    # the communicator capped at 4 CTAs (ncclConfig_t.maxCTAs, logged as "ctas"): 4 SMs held, 4 x 450/24 GB/s >= 45 GB/s
    r = step([dict(rs, ctas=4), g, SYNC])
    gemm = [o for o in r["ops"] if o["item"]["t"] == "gemm"][0]
    coll = [o for o in r["ops"] if o["item"]["t"] == "coll"][0]
    check(close(gemm["end"] - gemm["start"], dg * (sms / (sms - 4) + x), 1e-9) and close(coll["end"] - coll["start"], drs),
          "capped at 4 CTAs: the GEMM x (132 / 128 + extra), the collective still at the network's 45 GB/s (4 x 18.75 GB/s)")
    P.set_nccl_ctas(12)   # (predict.py --nccl-ctas 12: what if NCCL's default were 12)
    r = step([rs, g, SYNC])
    P.set_nccl_ctas(24)
    gemm = [o for o in r["ops"] if o["item"]["t"] == "gemm"][0]
    check(close(gemm["end"] - gemm["start"], dg * (sms / (sms - 12) + x), 1e-9), "--nccl-ctas 12: the GEMM beside the uncapped "
          "collective x (132 / 120 + extra)")
    r = step([dict(rs, ctas=2), SYNC])
    check(close(r["ops"][0]["end"] - r["ops"][0]["start"], (8 << 30) * 7 / 8 / 37.5e9 + 25 * US),
          "capped at 2 CTAs: the collective at 2 x 18.75 = 37.5 GB/s, below the network's 45")
    # a bytes-bound kernel beside the collective: only the extra (fewer SMs still draw HBM's bandwidth: the assumption)
    n = 1 << 26
    r = step([rs, SW(n), SYNC])
    k = [o for o in r["ops"] if o["item"]["t"] == "kernel"][0]
    check(close(k["end"] - k["start"], 6.0 * n / HBM * (1 + x), 1e-9), "a bytes-bound kernel beside the collective: x (1 + %.3f)" % x)
    r = step([SW(n), SYNC])
    check(close(r["ops"][0]["end"] - r["ops"][0]["start"], 6.0 * n / HBM), "negative control: alone, its time")
    # two collectives on the network at once share it: each takes about twice as long; one on NVLink beside one on the
    # network does not
    r = step([rs, dict(rs, stream=2), SYNC])
    t = [o["end"] - o["start"] for o in r["ops"] if o["item"]["t"] == "coll"]
    check(all(abs(x / (2 * drs) - 1) < 0.01 for x in t), "two collectives on one GPU's network link at once: each %.1f and %.1f ms, "
          "about twice its %.1f ms alone" % (t[0] * 1e3, t[1] * 1e3, drs * 1e3))
    nv = dict(rs, world_ranks=list(range(8)), stream=2)
    dnv = (8 << 30) * 7 / 8 / 450e9 + 10 * US
    r = step([rs, nv, SYNC])
    t = [o["end"] - o["start"] for o in r["ops"] if o["item"]["t"] == "coll"]
    check(close(t[0], drs) and close(t[1], dnv), "one on NVLink beside one on the network: each alone on its link (%.2f, %.2f ms)"
          % (t[0] * 1e3, t[1] * 1e3))


def compute_beside_compute():
    """two GEMMs on two streams share the GPU (--moe-streams 2): a pair in full overlap ends in 2 PAIR_EFFICIENCY of one's time"""
    g = {"t": "gemm", "m": 8192, "n": 8192, "k": 8192, "batch": 1, "a": "bf16", "b": "bf16", "d": "bf16", "beta": 0, "stream": 0}
    dg = 2.0 * 8192 ** 3 / (989.4e12 * 0.70)
    eta = P.PAIR_EFFICIENCY
    r = step([g, dict(g, stream=1), SYNC])
    t = [o["end"] - o["start"] for o in r["ops"] if o["item"]["t"] == "gemm"]
    check(len(t) == 2 and all(close(x, 2 * eta * dg, 0.005) for x in t) and close(r["step"], 2 * eta * dg, 0.01),
          "two equal GEMMs on two streams at once: each %.4f and %.4f ms = 2 x %.3f x %.4f ms alone, the step %.4f ms"
          % (t[0] * 1e3, t[1] * 1e3, eta, dg * 1e3, r["step"] * 1e3))
    r0 = P.simulate([g, dict(g, stream=1), SYNC], share_sms=False)
    t0 = [o["end"] - o["start"] for o in r0["ops"] if o["item"]["t"] == "gemm"]
    check(all(close(x, dg) for x in t0), "negative control: with the streams independent each keeps its time alone")
    r = step([g, dict(g, stream=1), dict(g, stream=1), SYNC])   # the second stream's second GEMM runs alone after the pair
    t = sorted(o["end"] - o["start"] for o in r["ops"] if o["item"]["t"] == "gemm")
    check(close(t[0], dg, 1e-3) and close(r["step"], (2 * eta + 1) * dg, 0.01),
          "one GEMM on stream 0 beside two in a row on stream 1: the pair shares, the third runs alone (step %.4f ms = %.3f x one)"
          % (r["step"] * 1e3, r["step"] / dg))
    n = 1 << 26   # a bytes-bound kernel beside a GEMM: neither slowed (bytes-bound kernels do not share: the model's assumption)
    r = step([g, SW(n, stream=1), SYNC])
    k = [o for o in r["ops"] if o["item"]["t"] == "kernel"][0]
    gm = [o for o in r["ops"] if o["item"]["t"] == "gemm"][0]
    check(close(k["end"] - k["start"], 6.0 * n / HBM) and close(gm["end"] - gm["start"], dg), "a bytes-bound kernel beside a GEMM: "
          "both keep their times")


def negative_controls():
    n = 1 << 24
    dk = 6.0 * n / HBM
    # a backward of 6 layers on stream 0; after each, its gradients' reduce-scatter on stream 1 (record / wait);
    # the last waits on the compute stream before the optimizer kernel
    rs = {"t": "coll", "kind": "reduce_scatter", "comm": "shard", "nranks": 8, "count": 1 << 23, "elem_bytes": 4,
          "bytes": 8 << 26, "rank": 0, "peer": 0, "group": 0, "stream": 1, "world_ranks": list(range(8))}
    drs = rs["bytes"] * 7 / 8 / 450e9 + 10 * US

    def backward(rs_stream, layers=6):
        items = []
        for l in range(layers):
            items += [SW(n), SW(n), {"t": "record", "event": 10 + l, "stream": 0}, {"t": "wait", "event": 10 + l, "stream": rs_stream},
                      dict(rs, stream=rs_stream), {"t": "record", "event": 20 + l, "stream": rs_stream}]
        items += [{"t": "wait", "event": 20 + layers - 1, "stream": 0}, SW(n), SYNC]
        return items
    x, P.HELD_CTAS_EXTRA = P.HELD_CTAS_EXTRA, 0.0   # (communication alone: the held CTAs' extra slowdown off)
    a, b = step(backward(1)), step(backward(0))
    P.HELD_CTAS_EXTRA = x
    hidden = sum(o["end"] - o["start"] - o["exposed"] for o in a["ops"] if o["item"]["t"] == "coll")
    check(close(b["step"] - a["step"], hidden, 1e-6), "negative control: the reduce-scatters moved onto the compute stream add "
          "%.3f ms = the communication the side stream hid (%.3f ms)" % ((b["step"] - a["step"]) * 1e3, hidden * 1e3))
    check(close(b["exposed_comm"], 6 * drs, 1e-9), "on the compute stream every reduce-scatter is exposed: %.3f ms = 6 x %.3f ms"
          % (b["exposed_comm"] * 1e3, drs * 1e3))
    check(a["exposed_comm"] < b["exposed_comm"] and hidden > 0, "on the side stream part of it is hidden (%.3f ms exposed)" % (a["exposed_comm"] * 1e3))
    # a sync per layer: 8 layers of 5 GPU-bound kernels; each planted stream sync costs 5 us sync + 4 us issue
    layer = [SW(n) for _ in range(5)]
    plain = sum((layer for _ in range(8)), []) + [SYNC]
    planted = sum((layer + [{"t": "sync", "what": "stream", "stream": 0}] for _ in range(8)), []) + [SYNC]
    d = step(planted)["step"] - step(plain)["step"]
    check(close(d, (8 * 5 + 7 * 4) * US), "negative control: a sync per layer (8 layers) adds %.1f us = 8 x 5 us sync + 7 x 4 us issue "
          "(the GPU idles while the host wakes and issues the next layer's first kernel)" % (d / US))
    # --profile's ranges on the predicted timeline: a device range around kernel B on stream 1 spans B (it begins where
    # stream 1 is when issued, after its wait for A), a host range spans the issue of both kernels
    rg = lambda name, ph, s: {"t": "range", "name": name, "ph": ph, "stream": s}
    r = step([rg("both", "B", -1), SW(n, 0), {"t": "record", "event": 1, "stream": 0}, {"t": "wait", "event": 1, "stream": 1},
              rg("layer 0 experts", "B", 1), SW(n, 1), rg("layer 0 experts", "E", 1), rg("both", "E", -1), SYNC])
    byname = {x["name"]: x for x in r["ranges"]}
    b = [o for o in r["ops"] if o["stream"] == 1][0]
    check(close(byname["layer 0 experts"]["start"], b["start"]) and close(byname["layer 0 experts"]["end"], b["end"])
          and close(byname["both"]["end"] - byname["both"]["start"], 2 * 4 * US + 2 * US),
          "a stream range spans its kernel (%.2f..%.2f us), a host range the host's issue of both kernels and the event "
          "(%.1f us)" % (byname["layer 0 experts"]["start"] / US, byname["layer 0 experts"]["end"] / US,
                         (byname["both"]["end"] - byname["both"]["start"]) / US))
    # the critical path through the serialised case is all device work but the issue and the sync
    r = step([SW(n, 0), {"t": "record", "event": 1, "stream": 0}, {"t": "wait", "event": 1, "stream": 1}, SW(n, 1), SYNC])
    check(close(r["critical_device"], 2 * dk), "critical path of A -> event -> B: both kernels (%.2f us)" % (r["critical_device"] / US))


def grouped_refused():
    # the grouped expert GEMMs (every version's launch name) have no cost formula: the step is not predicted, said why
    for name in ("experts_up_grouped", "experts_down_grouped", "experts_up_grouped_tma", "experts_down_grouped_tma"):
        try:
            with contextlib.redirect_stderr(io.StringIO()):   # (its one-line error: not the test's output)
                step([SW(1 << 20), K(name, 1 << 20), SYNC])
            check(False, "a step with %s: predicted, where no formula prices it" % name)
        except SystemExit as e:
            check(e.code != 0, "a step with %s is refused (no cost formula): exit %s" % (name, e.code))
    check(P.is_grouped_expert_kernel("experts_up_grouped_tma") and not P.is_grouped_expert_kernel("moe_gather_backward_kernel")
          and not P.is_grouped_expert_kernel("swiglu_forward_kernel<8>"), "only the experts' grouped launches are refused")


def chrome_trace():
    import tempfile
    r = step([SW(1 << 20, 0), SW(1 << 20, 1), SYNC])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        path = f.name
    P.trace(r, path)
    t = json.load(open(path))
    os.remove(path)
    xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
    ok = len(xs) == 2 and all(set(("name", "ph", "ts", "dur", "pid", "tid")) <= set(e) for e in xs) and {e["tid"] for e in xs} == {0, 1}
    check(ok, "the predicted timeline is Chrome trace JSON: 2 complete events on streams 0 and 1")


def e2e(log, counters, L, d, H, KV, E, k, F, V, tokens, seq):
    items = P.read_log(log)
    marks = [i for i, it in enumerate(items) if it["t"] == "mark"]
    check(len(marks) >= 4 and len(marks) % 2 == 0, "the work log parses: %d lines, %d step marks" % (len(items), len(marks)))
    st = P.one_step(items, 2)
    rows = [list(map(int, re.findall(r"(?<![a-z])\d+", l))) for l in open(counters) if l.startswith("simt counters")]
    c = rows[3]   # the 4th counters line closes step 2 (before and after every step)
    nk = sum(1 for it in st if it["t"] == "kernel")
    ng = sum(1 for it in st if it["t"] == "gemm")
    ns = sum(1 for it in st if it["t"] == "sync" or (it["t"] == "copy" and it.get("blocking")))
    check(nk == c[1], "every launch of step 2 is in the log: %d kernels, the emulator counted %d" % (nk, c[1]))
    check(ng == c[2], "every GEMM of step 2 is in the log: %d, counted %d" % (ng, c[2]))
    check(ns == c[0], "every host sync of step 2 is in the log: %d, counted %d" % (ns, c[0]))
    hd = d // H
    n_matmul = L * (d * (H + 2 * KV) * hd + d * d + d * E + k * 3 * F * d) + V * d
    want = 6.0 * n_matmul * tokens
    got = sum(it["flops"] for it in st if it["t"] == "gemm")
    # the router's input gradient dr (N, E) wr (E, d) is done by the gather backward (model/moe.cuh), not a GEMM
    fused = [it["args"] for it in st if it["t"] == "kernel" and re.sub(r"<.*", "", it["name"]) == "moe_gather_backward_kernel"
             and it["args"][6]]
    check(len(fused) == L, "the router's input gradient is fused into the gather backward in every layer: %d of %d" % (len(fused), L))
    got += sum(2 * a[3] * a[8] * a[5] for a in fused)
    check(got == want, "the step's GEMM FLOPs, with the router input gradient's in the gather backward, %d = 6 N_matmul x "
          "tokens = %d (model/config.h's MFU count less its attention term 6 L d (S+1), which the flash kernels do; no "
          "recomputed GEMM)" % (got, want))
    r = P.simulate(st)
    check(r["step"] > 0 and len(r["ops"]) >= nk + ng, "the step simulates: %.3f ms predicted on an H100 SXM" % (r["step"] * 1e3))


def measured_gemms():
    import contextlib
    import io
    import tempfile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "predict"))
    import calibrate as C
    g = lambda m, beta=0: {"t": "gemm", "m": m, "n": 4096, "k": 1024, "batch": 1, "a": "bf16", "b": "bf16", "d": "fp32",
                           "trans_a": True, "trans_b": False, "beta": beta, "stream": 0, "flops": 2 * m * 4096 * 1024}
    tmp = tempfile.mkdtemp()
    shapes, sweep, table = (os.path.join(tmp, n) for n in ("shapes.txt", "sweep.txt", "gemm_measured.json"))
    P.write_gemm_shapes(shapes, [[g(2048), g(2048), g(8192), K("x", 10)], [g(2048), g(8192), g(8192), g(8192)]])
    lines = [l for l in open(shapes).read().splitlines() if not l.startswith("#")]
    check(lines == ["8192 4096 1024 1 bf16 bf16 fp32 1 0 0 0 0 0 3", "2048 4096 1024 1 bf16 bf16 fp32 1 0 0 0 0 0 2"],
          "--gemm-shapes: the distinct GEMMs with their largest count per step over the logs, most FLOPs first: %s" % lines)
    with open(sweep, "w") as f:   # what dev/cuda/matmul -s prints for them (times made up here)
        f.write("matmul header line\n  %s ok\n%s ms=0.250000 tflops=275.0\n%s ms=0.050000 tflops=343.6\n" % (lines[0], lines[0], lines[1]))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        C.main(["--gemms", sweep, "--device", "h100-sxm", "--out", table, "--source", "test"])
    t = json.load(open(table))
    check(t["device"] == "h100-sxm" and t["gemms_ms"] == {lines[0][:-2]: 0.25, lines[1][:-2]: 0.05},
          "calibrate.py --gemms writes the measured table (device, ms per call by shape): %s" % t["gemms_ms"])
    want_table = 3 * 2.0 * 8192 * 4096 * 1024 / (989.4e12 * 0.58) + 2 * 2.0 * 2048 * 4096 * 1024 / (989.4e12 * 0.58)
    check("measured 0.850 ms" in out.getvalue() and ("rate table %.3f ms" % (want_table * 1e3)) in out.getvalue(),
          "calibrate.py --gemms: the step's GEMMs measured 3 x 0.25 + 2 x 0.05 = 0.850 ms against the rate table's %.3f ms "
          "(the >= 1024 class, 58%%)" % (want_table * 1e3))
    P.load_measured_gemms("h100-sxm", table)
    try:
        d, bound = P.cost(g(8192), "h100-sxm", 8)[:2]
        check(close(d, 0.25e-3) and bound == "measured", "a GEMM of the measured table costs its measured time: %.4f ms (%s)" % (d * 1e3, bound))
        d = P.cost(g(8192, beta=1), "h100-sxm", 8)[0]
        want = 2.0 * 8192 * 4096 * 1024 / (989.4e12 * 0.58)
        check(close(d, want), "the same GEMM reading C (beta 1) is another shape: the rate table's %.4f ms, got %.4f" % (want * 1e3, d * 1e3))
        d = P.cost(g(8192), "h200", 8)[0]
        check(close(d, want), "an H100's measured table does not price an H200's GEMM: %.4f ms, the table's %.4f" % (d * 1e3, want * 1e3))
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                P.load_measured_gemms("h200", table)
            check(False, "a table measured on h100-sxm refused for h200")
        except SystemExit as e:
            check(e.code == 2, "a table measured on h100-sxm is refused for h200 (exit %s)" % e.code)
    finally:
        P.MEASURED_GEMMS.clear()
        P.MEASURED_GEMMS_SOURCE.clear()
    for what, call in (("an explicit --measured-gemms FILE that does not exist", lambda: P.load_measured_gemms("h100-sxm", table + ".x")),
                       ("calibrate.py --gemms with an unknown option (--output)", lambda: C.main(["--gemms", sweep, "--device", "h100-sxm", "--output", table]))):
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                call()
            check(False, "bad input refused: %s" % what)
        except SystemExit as e:
            check(e.code == 2, "bad input refused, one line and exit 2: %s (exit %s)" % (what, e.code))
    # -a N's lines: the table keeps the first answer's time; the summary adds the fastest answers' sum and the shapes they win
    with open(sweep, "w") as f:
        f.write("%s ms=0.250000 tflops=275.0 best=3:0.200000 candidates=0.25,0.24,0.26,0.2\n" % lines[0])
        f.write("%s ms=0.050000 tflops=343.6 best=0:0.050000 candidates=0.05,0.06\n" % lines[1])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        C.main(["--gemms", sweep, "--device", "h100-sxm", "--out", table, "--source", "test"])
    t = json.load(open(table))
    o = out.getvalue()
    check(t["gemms_ms"] == {lines[0][:-2]: 0.25, lines[1][:-2]: 0.05} and "0.700 ms against the first answer's 0.850 (17.6% less)" in o
          and "1 of 2 shapes" in o and "answer 3 0.2000 ms against the first's 0.2500" in o,
          "calibrate.py --gemms on an -a sweep: the table keeps the first answers' times, the summary 3 x 0.2 + 2 x 0.05 = 0.700 ms "
          "against 0.850, the one shape another answer wins: %s" % o.strip().splitlines()[-2:])
    P.MEASURED_GEMMS.clear()
    with open(sweep, "w") as f:
        f.write("%s ms=0.000000 tflops=0.00\n" % lines[0])
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            C.main(["--gemms", sweep, "--device", "h100-sxm"])
        check(False, "negative control: an emulated sweep (no times) is refused as a measurement")
    except SystemExit as e:
        check(e.code == 2, "negative control: an emulated sweep (ms=0) is refused as a measurement (exit %s)" % e.code)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--e2e":
        a = sys.argv[2:]
        e2e(a[0], a[1], *map(int, a[2:]))
    else:
        model_cases()
        shared_sms_and_links()
        compute_beside_compute()
        negative_controls()
        grouped_refused()
        chrome_trace()
        measured_gemms()
