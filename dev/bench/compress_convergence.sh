#!/usr/bin/env bash
# compress_convergence.sh — the loss effect of --compress-acts (README "Compressed activations"), studied on the
# CPU: dbrx-tiny trained STEPS steps on the State of the Union text, batch 4 x 128, for each seed in SEEDS, with
# the saved activations uncompressed and with each compression setting below; the same seed and data in every
# run of a seed. Writes dev/bench/results_compress_convergence.md: per setting and seed, the mean train loss of
# the last 50 steps minus the uncompressed run's of the same seed, and the mean over the seeds.
#   bash dev/bench/compress_convergence.sh                 (300 steps, seeds 1 2 3: 15 runs, ~half an hour on 2 cores)
#   STEPS=100 SEEDS="1" bash dev/bench/compress_convergence.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-300}
SEEDS=${SEEDS:-"1 2 3"}
BIN=${BIN:-./train_dbrx_cpu}
PY=${PYTHON:-/usr/bin/python3}
out=dev/bench/compress_runs
mkdir -p "$out"
[ -x "$BIN" ] || make "${BIN#./}"
# name | flags (the uncompressed run first: the reference)
settings=("none|" "swiglu e4m3|--compress-acts swiglu" "swiglu bf16|--compress-acts swiglu --compress-format bf16"
          "attn e4m3|--compress-acts attn" "swiglu,attn e4m3|--compress-acts swiglu,attn")
for seed in $SEEDS; do
    for s in "${settings[@]}"; do
        name=${s%%|*}; flags=${s#*|}; tag=$(tr ' ,' '__' <<<"$name")
        echo "== seed $seed: $name"
        # shellcheck disable=SC2086
        "$BIN" --device cpu --model dbrx-tiny --batch 4 --seq 128 --steps "$STEPS" --val-every 0 --ckpt-every 0 \
            --seed "$seed" $flags --log "$out/${tag}_$seed.jsonl" > "$out/${tag}_$seed.txt" 2>&1 \
            || { echo "error: compress_convergence.sh: the run '$name' (seed $seed) failed: $(tail -1 "$out/${tag}_$seed.txt")" >&2; exit 1; }
    done
done
$PY - "$out" "$STEPS" "$SEEDS" "${settings[@]}" <<'PY'
import json, sys, os, datetime
out, steps, seeds, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), [s.split("|")[0] for s in sys.argv[4:]]
def last50(name, seed):
    path = os.path.join(out, "%s_%s.jsonl" % (name.replace(" ", "_").replace(",", "_"), seed))
    loss = [r["loss"] for r in map(json.loads, open(path)) if "loss" in r and "val_loss" not in r]
    if len(loss) < 50:
        sys.exit("error: compress_convergence.sh: %s has %d steps, fewer than 50" % (path, len(loss)))
    return sum(loss[-50:]) / 50
lines = ["# Compressed activations (`--compress-acts`) on the CPU: the loss effect", "",
         f"Written by `dev/bench/compress_convergence.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: dbrx-tiny, {steps} steps,",
         "batch 4 x 128 byte tokens of the State of the Union addresses; per seed every run has the same data and",
         "initialisation. The number: the mean train loss of the last 50 steps minus the uncompressed run's (same seed).", "",
         "| setting | " + " | ".join("seed " + s for s in seeds) + " | mean |", "|---|" + "---|" * (len(seeds) + 1)]
base = {s: last50(settings[0], s) for s in seeds}
lines.append("| none (the reference: its mean loss) | " + " | ".join("%.4f" % base[s] for s in seeds) + " | |")
for name in settings[1:]:
    d = [last50(name, s) - base[s] for s in seeds]
    lines.append("| %s | %s | %+.4f |" % (name, " | ".join("%+.4f" % x for x in d), sum(d) / len(d)))
open("dev/bench/results_compress_convergence.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
