#!/usr/bin/env bash
# lion_convergence.sh — LionW (--optimizer lion, model/adamw.cuh) against AdamW on the CPU: dbrx-tiny trained STEPS
# steps on the State of the Union text at the default batch (8 x 256), one seed, AdamW at its defaults (lr 2e-3, weight
# decay 0.1) and LionW at the lr / weight-decay pairs below (lr x weight decay held at AdamW's 2e-4, as the Lion paper
# advises when the lr is lowered). Writes dev/bench/results_lion_convergence.md: the validation loss every 50 steps.
#   bash dev/bench/lion_convergence.sh          (300 steps: 5 runs, ~6 minutes on 2 cores)
#   STEPS=100 bash dev/bench/lion_convergence.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-300}
SEED=${SEED:-1}
BIN=${BIN:-./train_dbrx_cpu}
PY=${PYTHON:-/usr/bin/python3}
out=dev/bench/lion_runs
mkdir -p "$out"
[ -x "$BIN" ] || make "${BIN#./}"
[ -f data/sotu/sotu_val_000000.bin ] || { echo "error: lion_convergence.sh: no dataset in data/sotu: run 'make data' first" >&2; exit 2; }
# name | flags (AdamW first: the reference)
settings=("AdamW, lr 2e-3, wd 0.1|" "LionW, lr 2e-3, wd 0.1|--optimizer lion --lr 2e-3 --weight-decay 0.1"
          "LionW, lr 1.2e-3, wd 0.17|--optimizer lion --lr 1.2e-3 --weight-decay 0.17"
          "LionW, lr 6e-4, wd 0.3|--optimizer lion --lr 6e-4 --weight-decay 0.3"
          "LionW, lr 2e-4, wd 1.0|--optimizer lion --lr 2e-4 --weight-decay 1.0")
names=()
for s in "${settings[@]}"; do
    name=${s%%|*}; flags=${s#*|}; tag=$(tr -c 'a-zA-Z0-9.\n' '_' <<<"$name")
    names+=("$name|$out/$tag.jsonl")
    echo "== $name"
    # shellcheck disable=SC2086
    "$BIN" --device cpu --model dbrx-tiny --steps "$STEPS" --val-every 50 --val-steps 8 --ckpt-every 0 --seed "$SEED" $flags \
        --log "$out/$tag.jsonl" > "$out/$tag.txt" 2>&1 \
        || { echo "error: lion_convergence.sh: the run '$name' failed: $(tail -1 "$out/$tag.txt")" >&2; exit 1; }
done
"$PY" - "$STEPS" "$SEED" "$(date -u '+%Y-%m-%d %H:%M UTC')" "${names[@]}" > dev/bench/results_lion_convergence.md <<'PY'
import json, sys
steps, seed, when, runs = sys.argv[1], sys.argv[2], sys.argv[3], [a.split("|") for a in sys.argv[4:]]
val = {}
for name, path in runs:
    val[name] = {json.loads(l)["step"]: json.loads(l)["val_loss"] for l in open(path) if '"val_loss"' in l}
cols = sorted(val[runs[0][0]])
print("# LionW (`--optimizer lion`) against AdamW on the CPU: the validation loss\n")
print("Written by `dev/bench/lion_convergence.sh` on %s: dbrx-tiny, %s steps, batch 8 x 256 byte tokens of the State of" % (when, steps))
print("the Union addresses, seed %s (every run the same data and initialisation), the default schedule (10 warmup steps," % seed)
print("cosine to 0.1 x), gradient clipping 1.0, betas 0.9 / 0.95 for both. Validation loss over 8 batches.\n")
print("| optimizer | " + " | ".join("step %d" % c for c in cols) + " |")
print("|---|" + "---|" * len(cols))
for name, _ in runs:
    print("| %s | " % name + " | ".join("%.4f" % val[name][c] for c in cols) + " |")
PY
echo "wrote dev/bench/results_lion_convergence.md"
