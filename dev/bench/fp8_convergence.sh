#!/usr/bin/env bash
# fp8_convergence.sh — the convergence effect of each FP8 recipe, studied on the CPU (FP8 numerics
# emulated): dbrx-tiny trained STEPS steps on the State of the Union text with --fp8 off | delayed |
# current | block, same seed and data; writes dev/bench/results_fp8_convergence.md (final train and
# val losses, difference to FP32) and, when matplotlib is installed, the loss curves as a PNG.
#   STEPS=300 bash dev/bench/fp8_convergence.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-300}
PY=${PYTHON:-/usr/bin/python3}
out=dev/bench/fp8_runs
mkdir -p "$out"
[ -x ./train_dbrx ] || make train_dbrx
for r in off delayed current block; do
    echo "== --fp8 $r"
    ./train_dbrx --model dbrx-tiny --steps "$STEPS" --val-every 100 --val-steps 8 --fp8 "$r" --log "$out/$r.jsonl" | grep -E "^(step|val)" | awk 'NR % 50 == 0'
done
$PY - "$out" "$STEPS" <<'PY'
import json, sys, os, datetime
out, steps = sys.argv[1], int(sys.argv[2])
runs = {}
for r in ["off", "delayed", "current", "block"]:
    rows = [json.loads(l) for l in open(os.path.join(out, r + ".jsonl"))]
    runs[r] = ([x["loss"] for x in rows if "loss" in x], [x["val_loss"] for x in rows if "val_loss" in x])
base_tr = sum(runs["off"][0][-20:]) / 20
base_val = runs["off"][1][-1]
lines = ["# FP8 recipes on the CPU (emulated FP8 numerics): convergence", "",
         f"Written by `dev/bench/fp8_convergence.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: dbrx-tiny, {steps} steps,",
         "batch 8 x 256 byte tokens of the State of the Union addresses, same seed and data for every run.",
         "FP8 applies to Wqkv, out_proj and the experts' w1, v1, w2 (forward, dgrad, wgrad); everything else FP32.", "",
         "| --fp8 | train loss (mean of last 20 steps) | vs off | final val loss | vs off |", "|---|---|---|---|---|"]
for r, (tr, val) in runs.items():
    t = sum(tr[-20:]) / 20
    lines.append(f"| {r} | {t:.4f} | {t - base_tr:+.4f} ({100 * (t - base_tr) / base_tr:+.2f}%) | {val[-1]:.4f} | {val[-1] - base_val:+.4f} ({100 * (val[-1] - base_val) / base_val:+.2f}%) |")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, (tr, _) in runs.items():
        ax.plot(range(1, len(tr) + 1), tr, label=f"--fp8 {r}", lw=1)
    ax.set_xlabel("step"); ax.set_ylabel("train loss (cross-entropy, nats/byte)"); ax.set_ylim(top=min(4.0, max(runs["off"][0])))
    ax.legend(); ax.grid(alpha=0.3); fig.tight_layout()
    fig.savefig("dev/bench/results_fp8_convergence.png", dpi=110)
    lines += ["", "![loss curves](results_fp8_convergence.png)"]
except ImportError:
    lines += ["", "(no plot: python3-matplotlib is not installed)"]
open("dev/bench/results_fp8_convergence.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
