#!/usr/bin/env python3
"""recorded.py — the recorded predictions of the step-time model (issue 22, item 4): the configurations below, predicted
by make predict (dev/predict/make_predict.sh, shapes-only emulation) and kept in dev/bench/predicted.json, with their
table in dev/bench/results_predicted.md (between the "recorded:" markers). Python 3, standard library only.

  recorded.py record [--cheap]    predict every configuration (--cheap: those CI runs, the others kept as recorded),
                                  write predicted.json and the table                                (make predict-record)
  recorded.py check [--cheap]     predict again and compare with the record: a step more than 3% slower is a regression
                                  (exit 1); any other change is listed                             (make bench-predict)
  recorded.py current --cheap     CI (test/test_predict_shapes.sh): the record is current, i.e. the configurations that
                                  emulate in seconds predict what is recorded within 0.1% (exit 1 naming the stale ones:
                                  a change that moves a prediction re-records it with make predict-record)
Every number is a prediction of the model, not a measurement (dev/predict/README.md lists what it leaves out).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RECORD = os.path.join(ROOT, "dev", "bench", "predicted.json")
TABLE = os.path.join(ROOT, "dev", "bench", "results_predicted.md")
BEGIN, END = "<!-- recorded: begin (dev/predict/recorded.py record) -->", "<!-- recorded: end -->"
REGRESSION = 0.03    # a step this much slower than recorded is flagged
CURRENT = 0.001      # CI: the recorded predictions within this of today's

# name, MODEL, BATCH, SEQ, NP, DEVICE, FLAGS, RUN_LAYERS ("" = the model's own layers in one run), cheap (CI runs it).
# Every row runs all its layers (session 56: 64 ranks ~45 s here, 256 ~5 min; extrapolating from 2 and 4 layers had the
# 64-GPU FP8 pick 5.5% short)
CONFIGS = [
    ("dbrx-1b, 1 H100 SXM, BF16", "dbrx-1b", 8, 2048, 1, "h100-sxm", "", "", True),
    ("dbrx-1b, 1 H100 SXM, BF16, --grad-accum 4", "dbrx-1b", 8, 2048, 1, "h100-sxm", "--grad-accum 4", "", True),
    # BF16 AdamW moments (model/adamw.cuh: 8 bytes a parameter less of the optimizer's pass; opt-in, another loss curve)
    ("dbrx-1b, 1 H100 SXM, BF16, --adam-moments bf16", "dbrx-1b", 8, 2048, 1, "h100-sxm", "--adam-moments bf16", "", True),
    # LionW (--optimizer lion: one moment, 22 bytes a parameter of the optimizer's pass; 18 with its m in BF16)
    ("dbrx-1b, 1 H100 SXM, BF16, --optimizer lion", "dbrx-1b", 8, 2048, 1, "h100-sxm", "--optimizer lion", "", True),
    ("dbrx-1b, 1 H100 SXM, BF16, --optimizer lion --adam-moments bf16", "dbrx-1b", 8, 2048, 1, "h100-sxm",
     "--optimizer lion --adam-moments bf16", "", True),
    ("dbrx-1b, 1 H100 SXM, FP8 delayed", "dbrx-1b", 8, 2048, 1, "h100-sxm", "--fp8 delayed", "", True),
    ("dbrx-1b, 1 H100 SXM, FP8 current", "dbrx-1b", 8, 2048, 1, "h100-sxm", "--fp8 current", "", True),
    ("dbrx-1b, 1 H100 SXM, FP8 block", "dbrx-1b", 8, 2048, 1, "h100-sxm", "--fp8 block", "", True),
    ("dbrx-1b, 1 H200, BF16", "dbrx-1b", 8, 2048, 1, "h200", "", "", True),
    ("DBRX-132B width, 4 layers, 8 H100 (1 node): ZeRO-3 over 8, EP 8", "dbrx-132b", 1, 4096, 8, "h100-sxm",
     "--n-layers 4 --shard-group-size 8 --expert-parallel 8", "", True),
    # the same slice under FP8 block scaling (issue 25's >= 1.5x at DBRX-132B width; its block-scaled GEMMs at 1.45 x
    # the BF16 rate, predict.py's FP8_BLOCK_GEMM_VS_BF16 from the forward's per-expert GEMMs measured on an H100)
    ("DBRX-132B width, 4 layers, 8 H100 (1 node): ZeRO-3 over 8, EP 8, FP8 block", "dbrx-132b", 1, 4096, 8, "h100-sxm",
     "--n-layers 4 --shard-group-size 8 --expert-parallel 8 --fp8 block", "", False),
    # the same with the weights gathered as E4M3 codes, which the GEMMs read as they are (session 56: no weight quantised
    # by the model, each unit's piece encoded before its gathers; 168.2 ms when the codes were decoded to BF16 and quantised
    # again at every use)
    ("DBRX-132B width, 4 layers, 8 H100 (1 node): ZeRO-3 over 8, EP 8, FP8 block, --fp8-gather", "dbrx-132b", 1, 4096, 8, "h100-sxm",
     "--n-layers 4 --shard-group-size 8 --expert-parallel 8 --fp8 block --fp8-gather", "", False),
    # the layouts --dry-run --fit picks (train_fit.h: the fewest recomputed FLOPs that fit 80 GB at seq 4096)
    ("DBRX-132B, 64 H100 (8 nodes): ZeRO-3 over 64, EP 8 in a node, --ep-capacity-factor 1.25, --recompute moe",
     "dbrx-132b", 1, 4096, 64, "h100-sxm", "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --recompute moe",
     "", False),
    ("DBRX-132B, 64 H100 (8 nodes): the same, --ep-layout spread (the expert shard group in a node, EP 8 across nodes)",
     "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute moe", "", False),
    # (FP32 moments: the embedding's row exchange, 0.4 GiB with its NCCL margin, would leave under --fit's 4 GiB to spare,
    # so --fit gathers the table here: train_fit.h rule 2b)
    ("DBRX-132B, 64 H100 (8 nodes): the --fit pick with the experts in chunks under EP: spread, --ep-capacity-factor 1, "
     "--recompute attn,swiglu, --compress-acts attn, --zero-embedding gather", "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1 --ep-layout spread --recompute attn,swiglu "
     "--compress-acts attn --zero-embedding gather", "", False),
    # the same with the exchange in 4 row slices per weight chunk, and with BF16 reduce-scatters (issue 24's targets:
    # exposed communication <= 10% of the step, MFU >= 40%)
    ("DBRX-132B, 64 H100 (8 nodes): the --fit pick, --ep-overlap-chunks 4", "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1 --ep-layout spread --recompute attn,swiglu "
     "--compress-acts attn --zero-embedding gather --ep-overlap-chunks 4", "", False),
    ("DBRX-132B, 64 H100 (8 nodes): the --fit pick, --grad-reduce-dtype bf16", "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1 --ep-layout spread --recompute attn,swiglu "
     "--compress-acts attn --zero-embedding gather --grad-reduce-dtype bf16", "", False),
    # BF16 AdamW moments: 4 bytes a parameter of the shard less, so --fit recomputes only SwiGLU (at capacity 1.25); alone,
    # and with BF16 reduce-scatters (their scratch fits beside it)
    ("DBRX-132B, 64 H100 (8 nodes): --adam-moments bf16 and its --fit pick: spread, --ep-capacity-factor 1.25, --recompute swiglu",
     "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute swiglu --adam-moments bf16",
     "", False),
    # LionW: its one FP32 moment frees what BF16 AdamW moments free; the same --fit pick
    ("DBRX-132B, 64 H100 (8 nodes): --optimizer lion and its --fit pick: spread, --ep-capacity-factor 1.25, --recompute swiglu",
     "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute swiglu --optimizer lion",
     "", False),
    ("DBRX-132B, 64 H100 (8 nodes): the same, --grad-reduce-dtype bf16 (the --fit pick with both)", "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute swiglu --adam-moments bf16 "
     "--grad-reduce-dtype bf16", "", False),
    # (session 57: the collectives hold their CTAs' SMs and share their links, dev/predict/README.md; the communicators
    # across nodes on 3 CTAs, the fewest that keep the network's 45 GB/s by the model)
    ("DBRX-132B, 64 H100 (8 nodes): the same, --grad-reduce-dtype bf16, --nccl-ctas-internode 3", "dbrx-132b", 1, 4096, 64,
     "h100-sxm", "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute swiglu "
     "--adam-moments bf16 --grad-reduce-dtype bf16 --nccl-ctas-internode 3", "", False),
    # FP8 block at full scale (its --fit pick with BF16 moments: the BF16 pick's layout at capacity 1): the experts
    # stay whole and the exchange unchunked under --fp8 (parallel/expert_parallel_cuda.cuh), so the exchange that the
    # BF16 pick hides behind the weight chunks is exposed here
    ("DBRX-132B, 64 H100 (8 nodes): --fp8 block --adam-moments bf16 and its --fit pick: spread, --ep-capacity-factor 1, "
     "--recompute swiglu", "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1 --ep-layout spread --recompute swiglu "
     "--adam-moments bf16 --fp8 block", "", False),
    ("DBRX-132B, 64 H100 (8 nodes): the FP8 pick, --nccl-ctas-internode 3", "dbrx-132b", 1, 4096, 64, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1 --ep-layout spread --recompute swiglu "
     "--adam-moments bf16 --fp8 block --nccl-ctas-internode 3", "", False),
    # (with the links shared the network is what the step waits for: halving the gathers' bytes (--fp8-gather: E4M3 codes)
    # and the reduce-scatters' (BF16) pays, where with the links unshared both were hidden already)
    ("DBRX-132B, 64 H100 (8 nodes): the FP8 pick, --nccl-ctas-internode 3, --fp8-gather, --grad-reduce-dtype bf16", "dbrx-132b", 1,
     4096, 64, "h100-sxm", "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1 --ep-layout spread --recompute swiglu "
     "--adam-moments bf16 --fp8 block --nccl-ctas-internode 3 --fp8-gather --grad-reduce-dtype bf16", "", False),
    # (session 54: --fit keeps the experts' shard group in a node, train_fit.h rule 0b, so at 256 GPUs HSDP: 4 replicas
    # of the 64-GPU layout, the replicas' gradient sums beside the backward; until then ZeRO-3 over 256, EP 8 packed,
    # --ep-capacity-factor 1.25 --compress-acts swiglu, 2768.2 ms)
    ("DBRX-132B, 256 H100 (32 nodes): the --fit pick, HSDP: shard groups of 64 (EP 8 spread) x 4 replicas, "
     "--ep-capacity-factor 1.25, --recompute moe", "dbrx-132b", 1, 4096, 256, "h100-sxm",
     "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute moe", "", False),
    # (session 57: the same with the communicators across nodes on 3 CTAs, and BF16 reduce-scatters, which fit beside it)
    ("DBRX-132B, 256 H100 (32 nodes): the same, --nccl-ctas-internode 3, --grad-reduce-dtype bf16", "dbrx-132b", 1, 4096, 256,
     "h100-sxm", "--shard-group-size 64 --expert-parallel 8 --ep-capacity-factor 1.25 --ep-layout spread --recompute moe "
     "--nccl-ctas-internode 3 --grad-reduce-dtype bf16", "", False),
]


def predict(cfg):
    name, model, batch, seq, np_, dev, flags, layers, _ = cfg
    env = dict(os.environ, MODEL=model, BATCH=str(batch), SEQ=str(seq), NP=str(np_), DEVICE=dev, FLAGS=flags,
               RUN_LAYERS=layers, JSON="1")
    env.pop("TRACE", None)
    p = subprocess.run(["bash", os.path.join(ROOT, "dev", "predict", "make_predict.sh")], cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines or not lines[-1].startswith("{"):
        sys.exit("error: recorded.py: make predict failed for '%s': %s" % (name, (p.stderr or p.stdout).strip()[-400:]))
    s = json.loads(lines[-1])
    mem = next((ln.split(": ", 1)[1] for ln in lines if ln.startswith("memory (")), "")
    top = [{"name": r["name"], "ms": round(r["time"] * 1e3, 3), "bound": r["bound"]} for r in s["sinks"][:4]]
    return {"model": model, "batch": batch, "seq": seq, "gpus": np_, "device": dev, "flags": flags,
            "layers_extrapolated_from": layers, "step_ms": round(s["step"] * 1e3, 3),
            "mfu": round(s.get("mfu", 0.0), 4), "exposed_comm_ms": round(s["exposed_comm"] * 1e3, 3),
            "memory": mem, "top_sinks": top}


def table(rec):
    out = ["| configuration | tokens / step | predicted step | MFU | exposed comm. | top time sinks (ms, bound by) | memory per GPU |",
           "|---|---|---|---|---|---|---|"]
    for name, r in rec.items():
        accum = 4 if "--grad-accum 4" in r["flags"] else 1
        sinks = "; ".join("%s %.1f (%s)" % (t["name"], t["ms"], t["bound"]) for t in r["top_sinks"][:3])
        mem = r["memory"].split(",")[0] or "?"   # "X GiB of Y GiB: FITS" (--dry-run's plan)
        out.append("| %s%s | %d x %d x %d GPU(s)%s | %.1f ms | %.1f%% | %.1f ms | %s | %s |" % (
            name, " (layers extrapolated from %s)" % r["layers_extrapolated_from"].replace(" ", " and ")
            if r["layers_extrapolated_from"] else "", r["batch"], r["seq"], r["gpus"], " x 4 micro-batches" if accum > 1 else "",
            r["step_ms"], 100 * r["mfu"], r["exposed_comm_ms"], sinks, mem))
    return "\n".join(out)


def main():
    usage = "usage: recorded.py record [--cheap | --only TEXT] | check [--cheap] | current --cheap"
    if len(sys.argv) < 2 or sys.argv[1] not in ("record", "check", "current"):
        sys.exit(usage)
    cmd, cheap = sys.argv[1], "--cheap" in sys.argv[2:]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv[2:-1] else None   # record: the names holding TEXT
    if "--only" in sys.argv[2:] and (only is None or cmd != "record"):
        sys.exit("error: --only TEXT: record only, with the text a configuration's name holds\n" + usage)
    configs = [c for c in CONFIGS if (c[8] or not cheap) and (only is None or only in c[0])]
    if only is not None and not configs:
        sys.exit("error: --only '%s': no recorded configuration's name holds it" % only)
    if cmd == "record":   # (--cheap, --only: only those, the others' records kept as they are)
        try:
            old = json.load(open(RECORD)) if cheap or only is not None else {}
        except (OSError, ValueError):
            old = {}
        rec = {c[0]: old[c[0]] for c in CONFIGS if c[0] in old}
        for c in configs:
            print("predicting: %s" % c[0], file=sys.stderr)
            rec[c[0]] = predict(c)
        rec = {c[0]: rec[c[0]] for c in CONFIGS if c[0] in rec}   # (in the table's order)
        with open(RECORD + ".tmp", "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        os.replace(RECORD + ".tmp", RECORD)
        md = open(TABLE).read()
        if BEGIN not in md or END not in md:
            sys.exit("error: %s: no '%s' ... '%s' markers" % (TABLE, BEGIN, END))
        md = md[:md.index(BEGIN) + len(BEGIN)] + "\n" + table(rec) + "\n" + md[md.index(END):]
        with open(TABLE + ".tmp", "w") as f:
            f.write(md)
        os.replace(TABLE + ".tmp", TABLE)
        print("recorded %d predictions: %s and the table in %s" % (len(rec), RECORD, TABLE))
        return
    try:
        rec = json.load(open(RECORD))
    except (OSError, ValueError) as e:
        sys.exit("error: %s: %s (make predict-record writes it)" % (RECORD, e))
    bad = 0
    for c in configs:
        if c[0] not in rec:
            print("fail %s: not recorded (make predict-record)" % c[0])
            bad += 1
            continue
        now, was = predict(c), rec[c[0]]
        ch = now["step_ms"] / was["step_ms"] - 1.0
        if cmd == "current":   # the step and its exposed communication (within 0.1% of the step)
            dx = now["exposed_comm_ms"] - was.get("exposed_comm_ms", float("nan"))
            ok = abs(ch) <= CURRENT and abs(dx) <= CURRENT * was["step_ms"]
            print("%s the recorded prediction of %s is current: %.3f ms recorded, %.3f ms today (%+.2f%%); exposed "
                  "communication %.3f ms recorded, %.3f ms today%s"
                  % ("pass" if ok else "fail", c[0], was["step_ms"], now["step_ms"], 100 * ch, was.get("exposed_comm_ms", float("nan")),
                     now["exposed_comm_ms"], "" if ok else ": re-record it (make predict-record) with the change that moved it"))
        else:
            ok = ch <= REGRESSION
            print("%s %s: %.3f ms recorded, %.3f ms predicted now (%+.1f%%)%s" % (
                "ok  " if ok else "REGRESSION", c[0], was["step_ms"], now["step_ms"], 100 * ch,
                "" if ok else ": more than %.0f%% slower than recorded" % (100 * REGRESSION)))
        bad += 0 if ok else 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
