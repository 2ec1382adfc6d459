#!/usr/bin/env python3
"""calibrate.py — the step-time model against a measured step (issue 22, item 3): a GPU's --profile trace and the
predicted trace of the same configuration (make predict TRACE=FILE, whose emulated run had --profile: the same range
names at their predicted times), compared range class by range class. Python 3, standard library only.

  calibrate.py MEASURED.json PREDICTED.json [--markdown] [--json]

MEASURED: one rank's trace of the trainer's --profile (model/profile.h): on a GPU its device ranges are CUDA events
on every stream; on the CPU backend or under the emulator they are wall clock (the comparison then checks only that
the two traces name the same work). A class is a range name with its numbers replaced by N ("layer N attention",
"reduce-scatter unit N"); its time per step is the sum of its ranges in one profiled step, averaged over the profiled
steps (device tracks where the trace has them, else the host's). The step: the measured "step N" ranges against the
prediction's step (the trace's otherData.predicted_step_ms).

Prints, per class: count per step, predicted ms, measured ms, measured / predicted; then the step. The ratios are
what the rate table (predict.py's RATES, GEMM_EFFICIENCY, HBM_FRACTION, ...) is to be corrected by: make bench-gpu
records this table in dev/bench/results_gpu.md; the published starting values stay documented beside any change.

  calibrate.py --kernels MEASURED.json PREDICTED.json [--markdown | --json] [--top N] [--gemm-shapes]

Per kernel, where the GPU run had --profile-kernels (every launch and GEMM a range of category "kernel", model/profile.h):
each kernel's device time per step (its name without template arguments; a GEMM by its shape key, "gemm m n k batch a
b d ta tb beta fast modes", as dev/cuda/matmul -s keys it; grouped by predict.py's GEMM classes unless --gemm-shapes, as
the experts' shapes follow the routing) against the same kernels' predicted time on the predicted
trace (its device rows; a GEMM's key in its args), largest measured first: where the model's rates are wrong, kernel
by kernel, and how much of the step each kernel takes in the step (a GEMM in the step against its isolated time).
When the two steps launch different numbers of GEMMs it says so ("the GEMM launches differ"): the model routes every
token evenly, and a GPU run whose router sends its tokens to fewer experts (dbrx-1b's collapses at init) ran fewer,
larger expert GEMMs, faster than the balanced ones priced; DBRX_DEBUG_ROUTE_BALANCED=1 gives the run the model's routing.

  calibrate.py --gemms SWEEP.txt --device DEV [--out FILE] [--source TEXT] [--markdown]

SWEEP: what dev/cuda/matmul -s printed for the GEMMs predict.py --gemm-shapes listed (one line per shape, ms=
appended). Prints each shape's measured time against the rate table's (predict.py's cost(): its efficiency class),
weighted by its count per step, and with --out writes the measured table predict.py reads for that device
(gemm_measured_<device>.json: {"device", "source", "gemms_ms": {shape key: ms per call}}).
"""
import json
import re
import sys


def die(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            t = json.load(f)
    except (OSError, ValueError) as e:
        die("%s: not a trace (%s)" % (path, e))
    if not isinstance(t, dict) or not isinstance(t.get("traceEvents"), list):
        die("%s: no traceEvents" % path)
    return t


def cls(name):
    return re.sub(r"\d+", "N", name)


def measured_classes(t):
    """{class: (count per step, seconds per step)} and the mean step, from a --profile trace"""
    ev = t["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device = {tid for tid, n in names.items() if n.startswith("CUDA stream")}
    per = {}    # class -> {step: [count, seconds]} on the device tracks, and separately on the host
    steps, step_time = set(), []
    for e in ev:
        if e.get("ph") != "X":
            continue
        st = (e.get("args") or {}).get("step")
        if e.get("cat") == "kernel":
            continue   # (--profile-kernels: --kernels compares them)
        if e.get("cat") == "step":
            step_time.append(e["dur"] * 1e-6)
            continue
        steps.add(st)
        key = (cls(e["name"]), e["tid"] in device)
        c = per.setdefault(key, {}).setdefault(st, [0, 0.0])
        c[0] += 1
        c[1] += e["dur"] * 1e-6
    out = {}
    for (c, dev), bystep in per.items():
        if not dev and (c, True) in per:
            continue   # the device's time where the trace has it
        n = float(len(bystep))
        out[c] = (sum(v[0] for v in bystep.values()) / n, sum(v[1] for v in bystep.values()) / n)
    return out, (sum(step_time) / len(step_time) if step_time else None)


def predicted_classes(t):
    ev = t["traceEvents"]
    out = {}
    for e in ev:
        if e.get("ph") == "X" and (e.get("args") or {}).get("predicted"):
            c = out.setdefault(cls(e["name"]), [0, 0.0])
            c[0] += 1
            c[1] += e["dur"] * 1e-6
    step = (t.get("otherData") or {}).get("predicted_step_ms")
    return {k: tuple(v) for k, v in out.items()}, (step * 1e-3 if step else None)


def read_sweep(path):
    """[(key, count, ms)] from dev/cuda/matmul -s's output lines ("KEY COUNT ms=X tflops=Y")"""
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        die("%s: %s" % (path, e))
    for no, line in enumerate(lines, 1):
        m = re.match(r"^((?:\d+ ){4}(?:\w+ ){3}(?:\d+ ){6})(\d+) ms=([0-9.eE+-]+)", line)
        if m:
            try:
                ms = float(m.group(3))
            except ValueError:
                die("%s:%d: ms=%s is not a number" % (path, no, m.group(3)))
            out.append((m.group(1).strip(), int(m.group(2)), ms))
        elif re.match(r"^\d+ \d+ \d+ ", line):
            die("%s:%d: a GEMM line without its time: %s" % (path, no, line[:80]))
    if not out:
        die("%s: no timed GEMM lines (dev/cuda/matmul -s's output)" % path)
    return out


def read_best(path):
    """{key: (rank, ms)} from the lines of dev/cuda/matmul -s FILE -a N ("KEY COUNT ms=X tflops=Y best=R:MS candidates=...")"""
    out = {}
    for line in open(path).read().splitlines():
        m = re.match(r"^((?:\d+ ){4}(?:\w+ ){3}(?:\d+ ){6})\d+ ms=\S+ tflops=\S+ best=(\d+):([0-9.eE+-]+)", line)
        if m:
            out[m.group(1).strip()] = (int(m.group(2)), float(m.group(3)))
    return out


def gemms_main(args):
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    import predict
    opt = lambda name: args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None
    known = {"--gemms", "--device", "--out", "--source", "--markdown"}
    for i, a in enumerate(args):
        if a.startswith("--") and a not in known:
            die("calibrate.py --gemms: unknown option %s" % a)
        if a in known - {"--markdown"} and (i + 1 >= len(args) or args[i + 1].startswith("--")):
            die("calibrate.py --gemms: %s needs a value" % a)
    path, dev, out, source = opt("--gemms"), opt("--device"), opt("--out"), opt("--source") or "dev/cuda/matmul -s"
    if not path or dev not in predict.RATES:
        die("usage: calibrate.py --gemms SWEEP.txt --device {%s} [--out FILE] [--source TEXT] [--markdown]" % "|".join(sorted(predict.RATES)))
    rows = []
    for key, count, ms in read_sweep(path):
        it = gemm_item(key)
        if not 0 < ms < float("inf"):
            die("%s: %s: ms=%g is no time (an emulated sweep is not a measurement)" % (path, key, ms))
        table_s = predict.cost(it, dev, 8)[0]
        rows.append((key, count, ms, table_s * 1e3, 2.0 * it["m"] * it["n"] * it["k"] * it["batch"]))
    tm, tt = sum(c * ms for _, c, ms, _, _ in rows), sum(c * t for _, c, _, t, _ in rows)
    if out:
        with open(out, "w") as fo:
            json.dump({"device": dev, "source": source, "gemms_ms": {k: ms for k, _, ms, _, _ in rows}}, fo, indent=0, sort_keys=True)
            fo.write("\n")
    md = "--markdown" in args
    peak = predict.RATES[dev]["bf16"]
    if md:
        print("| GEMM (m n k batch a b d ta tb beta fast modes) | per step | measured ms | TFLOP/s | rate table ms | measured / table |")
        print("|---|---|---|---|---|---|")
    for key, count, ms, t, fl in sorted(rows, key=lambda r: -r[1] * r[2]):
        cells = (key, count, ms, fl / (ms * 1e-3) / 1e12, t, ms / t)
        print(("| %s | %d | %.4f | %.1f | %.4f | %.2f |" if md else "%-44s %4d %10.4f %8.1f %10.4f %6.2f") % cells)
    print(("| **all listed, each x its count per step** | %d | %.3f | (%.1f%% of the BF16 peak) | %.3f | %.2f |" if md else
           "all listed GEMMs, each x its count per step: %d calls, measured %.3f ms (%.1f%% of the BF16 peak), rate table %.3f ms, "
           "measured / table %.2f")
          % (sum(c for _, c, _, _, _ in rows), tm, 100 * sum(c * fl for _, c, _, _, fl in rows) / (tm * 1e-3) / peak, tt, tm / tt))
    best = read_best(path)
    if best:   # (-a N: each shape's fastest of cuBLASLt's first answers; the table above keeps the first, the product's)
        tb = sum(c * min(ms, best[k][1]) for k, c, ms, _, _ in rows if k in best) + sum(c * ms for k, c, ms, _, _ in rows if k not in best)
        faster = [(k, c, ms, best[k]) for k, c, ms, _, _ in rows if k in best and best[k][1] < 0.97 * ms]
        print(("%sthe fastest of cuBLASLt's first answers (-a), each x its count per step: %.3f ms against the first answer's %.3f "
               "(%.1f%% less); %d of %d shapes 3%% or more faster with another answer%s")
              % ("\n" if md else "", tb, tm, 100 * (1 - tb / tm), len(faster), len(best), ":" if faster else ""))
        for k, c, ms, (r, bms) in sorted(faster, key=lambda f: -f[1] * (f[2] - f[3][1])):
            print("%s%s x %d: answer %d %.4f ms against the first's %.4f" % ("- " if md else "  ", k, c, r, bms, ms))


def gemm_item(key):
    f = key.split()
    return {"t": "gemm", "m": int(f[0]), "n": int(f[1]), "k": int(f[2]), "batch": int(f[3]), "a": f[4], "b": f[5], "d": f[6],
            "trans_a": f[7] == "1", "trans_b": f[8] == "1", "beta": int(f[9]), "fast_accum": int(f[10]),
            "a_scale_mode": int(f[11]), "b_scale_mode": int(f[12])}


GEMM_SHAPES = False   # --gemm-shapes: a GEMM per shape key; else by predict.py's classes (the experts' shapes follow the routing)


def kernel_name(name):
    if not name.startswith("gemm "):
        return re.sub(r"<.*", "", name)
    if GEMM_SHAPES:
        return name
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    import predict
    return predict.label(gemm_item(name[5:]))


def measured_kernels(t):
    """{kernel: (launches per step, seconds per step)} over the "kernel" ranges of a --profile-kernels trace"""
    per = {}
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            c = per.setdefault(kernel_name(e["name"]), {}).setdefault((e.get("args") or {}).get("step"), [0, 0.0])
            c[0] += 1
            c[1] += e["dur"] * 1e-6
    return {k: (sum(v[0] for v in b.values()) / len(b), sum(v[1] for v in b.values()) / len(b)) for k, b in per.items()}


def predicted_kernels(t):
    """the same from the predicted trace's device rows (GEMMs by their args' key)"""
    out = {}
    for e in t["traceEvents"]:
        a = e.get("args") or {}
        if e.get("ph") == "X" and not a.get("predicted") and "bound" in a:
            c = out.setdefault(kernel_name("gemm " + a["gemm"] if "gemm" in a else e["name"]), [0, 0.0])
            c[0] += 1
            c[1] += e["dur"] * 1e-6
    return {k: tuple(v) for k, v in out.items()}


def kernels_main(args):
    global GEMM_SHAPES
    GEMM_SHAPES = "--gemm-shapes" in args
    files = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--top")]
    if len(files) != 2:
        die("usage: calibrate.py --kernels MEASURED.json PREDICTED.json [--markdown | --json] [--top N] [--gemm-shapes]")
    top = int(args[args.index("--top") + 1]) if "--top" in args and args.index("--top") + 1 < len(args) else 40
    meas, pred = measured_kernels(load(files[0])), predicted_kernels(load(files[1]))
    if not meas:
        die("%s: no kernel ranges (the GPU run needs --profile --profile-kernels)" % files[0])
    if not pred:
        die("%s: no predicted device rows (make predict TRACE=FILE)" % files[1])
    keys = sorted(set(meas) | set(pred), key=lambda k: -max(meas.get(k, (0, 0.0))[1], pred.get(k, (0, 0.0))[1]))
    # the model routes every token evenly (make predict's shapes-only run); a GPU run whose router sends its tokens to
    # fewer experts launches fewer, larger expert GEMMs (a collapsed router: 4 experts take every token), which run faster
    # than the balanced ones the model prices: the two steps are then not the same work, and the table says so
    gemms = [sum(v[0] for k, v in d.items() if k.startswith("gemm")) for d in (meas, pred)]
    routing = None if abs(gemms[0] - gemms[1]) < 0.5 else (
        "the GEMM launches differ (measured %g a step, predicted %g): the runs' expert GEMMs have other shapes, as when a "
        "router sends its tokens to fewer experts than the model's balanced routing; measure with DBRX_DEBUG_ROUTE_BALANCED=1" % tuple(gemms))
    if "--json" in args:
        out = {k: {"measured_launches": meas.get(k, (0, None))[0], "predicted_launches": pred.get(k, (0, None))[0],
                   "measured_ms": meas[k][1] * 1e3 if k in meas else None,
                   "predicted_ms": pred[k][1] * 1e3 if k in pred else None} for k in keys}
        if routing:
            print("warning: " + routing, file=sys.stderr)
        print(json.dumps(out))
        return
    md = "--markdown" in args
    f = lambda x, p="%.3f": p % x if x is not None else "—"
    if md:
        print("| kernel | launches / step (measured, predicted) | predicted ms | measured ms | measured / predicted |")
        print("|---|---|---|---|---|")
    else:
        print("%-58s %9s %12s %12s %9s" % ("kernel", "launches", "predicted ms", "measured ms", "meas/pred"))
    tm = tp = 0.0
    for i, k in enumerate(keys):
        mc, mt = meas.get(k, (0, None))
        pc, pt = pred.get(k, (0, None))
        tm += mt or 0.0
        tp += pt or 0.0
        if i >= top:
            continue
        cells = (k, "%g, %g" % (mc, pc), f(pt * 1e3 if pt is not None else None), f(mt * 1e3 if mt is not None else None),
                 f(mt / pt if mt is not None and pt else None, "%.2f"))
        print(("| %s | %s | %s | %s | %s |" if md else "%-58s %9s %12s %12s %9s") % cells)
    print(("| **all %d kernels** | | %.3f | %.3f | %.2f |" if md else "all %d kernels: predicted %.3f ms, measured %.3f ms, %.2f")
          % (len(keys), tp * 1e3, tm * 1e3, tm / tp if tp else float("nan")))
    if routing:
        print(("\n**Not the same work:** %s." if md else "warning: %s") % routing)


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if "--gemms" in args:
        return gemms_main(args)
    if "--kernels" in args:
        return kernels_main([a for a in args if a != "--kernels"])
    md, as_json = "--markdown" in args, "--json" in args
    files = [a for a in args if not a.startswith("--")]
    if len(files) != 2:
        die("usage: calibrate.py MEASURED.json PREDICTED.json [--markdown] [--json]")
    meas, mstep = measured_classes(load(files[0]))
    pred, pstep = predicted_classes(load(files[1]))
    if not pred:
        die("%s: no predicted ranges (make predict TRACE=FILE writes them; its run has --profile)" % files[1])
    rows = []
    for c in sorted(set(meas) | set(pred), key=lambda k: -pred.get(k, (0, 0.0))[1]):
        pc, pt = pred.get(c, (0, None))
        mc, mt = meas.get(c, (0, None))
        rows.append({"class": c, "count": pc or mc, "predicted_ms": pt * 1e3 if pt is not None else None,
                     "measured_ms": mt * 1e3 if mt is not None else None,
                     "ratio": mt / pt if mt is not None and pt else None})
    step = {"predicted_ms": pstep * 1e3 if pstep else None, "measured_ms": mstep * 1e3 if mstep else None,
            "ratio": mstep / pstep if mstep and pstep else None}
    if as_json:
        print(json.dumps({"classes": rows, "step": step}))
        return
    f = lambda x, p="%.3f": p % x if x is not None else "—"
    if md:
        print("| range class | count / step | predicted ms | measured ms | measured / predicted |")
        print("|---|---|---|---|---|")
        for r in rows:
            print("| %s | %d | %s | %s | %s |" % (r["class"], r["count"], f(r["predicted_ms"]), f(r["measured_ms"]),
                                                 f(r["ratio"], "%.2f")))
        print("| **step** | 1 | %s | %s | %s |" % (f(step["predicted_ms"]), f(step["measured_ms"]), f(step["ratio"], "%.2f")))
    else:
        print("%-36s %6s %12s %12s %9s" % ("range class", "count", "predicted ms", "measured ms", "meas/pred"))
        for r in rows:
            print("%-36s %6d %12s %12s %9s" % (r["class"][:36], r["count"], f(r["predicted_ms"]), f(r["measured_ms"]),
                                               f(r["ratio"], "%.2f")))
        print("%-36s %6d %12s %12s %9s" % ("step", 1, f(step["predicted_ms"]), f(step["measured_ms"]), f(step["ratio"], "%.2f")))
    missing = [r["class"] for r in rows if r["predicted_ms"] is None or r["measured_ms"] is None]
    if missing:
        print("only in one of the traces: %s" % ", ".join(missing), file=sys.stderr)


if __name__ == "__main__":
    main()
