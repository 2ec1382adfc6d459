#!/usr/bin/env bash
# test_plot.sh — the run plots (dev/plot_run.py) and the expert counts they read (--log-every-experts):
#   * --log-every-experts N writes {"step", "expert_counts": L lists of E counts} every N steps; every
#     layer's counts add up to the step's tokens x top-k, summed over the micro-batches (--grad-accum 2)
#     and over the ranks (mpirun -np 2), on the CPU and on the emulated CUDA path;
#   * a PNG rendered from two short runs' logs (one with FP8 logging, --eval-mc and validation, the
#     other on 2 ranks) is a valid PNG of the expected size, not blank (pixel variance, ink coverage);
#   * bad input: a log line that is not JSON, a missing log, --log-every-experts without --log or < 0:
#     one line, exit 2.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx_cpu}
EMU=${EMU:-./train_dbrx_emu}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-/usr/bin/python3}
$PY -c "import matplotlib" 2>/dev/null || { fail "python3-matplotlib is not installed (make deps)"; exit 0; }
run=(--model dbrx-tiny --n-layers 2 --batch 4 --seq 64 --steps 12 --val-every 4 --val-steps 1 --log-every-experts 3)

$PY test/gen_mc_eval.py data/sotu/sotu_val_000000.bin "$tmp/mc.bin" --n 8 > /dev/null
$BIN "${run[@]}" --grad-accum 2 --fp8 delayed --fp8-log-every 4 --eval-mc "$tmp/mc.bin" --eval-every 6 --log "$tmp/fp8_accum2.jsonl" \
    > "$tmp/a.out" 2>&1 || fail "run A: $(tail -3 "$tmp/a.out")"
OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $BIN "${run[@]}" --log "$tmp/np2.jsonl" > "$tmp/b.out" 2>&1 || fail "run B (np 2): $(tail -3 "$tmp/b.out")"
counts_check() {   # LOG STEPS TOKENS_PER_LAYER NAME
    $PY - "$@" <<'PY'
import json, sys
log, steps, want, name = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(log) if "expert_counts" in l]
assert [r["step"] for r in rows] == steps, [r["step"] for r in rows]
for r in rows:
    c = r["expert_counts"]
    assert len(c) == 2 and all(len(l) == 16 for l in c), "2 layers x 16 experts"
    assert all(sum(l) == want for l in c), (r["step"], [sum(l) for l in c], want)
print(f"   {name}: {len(rows)} rows, layer 0 at step {rows[-1]['step']}: {rows[-1]['expert_counts'][0]}")
PY
}
counts_check "$tmp/fp8_accum2.jsonl" 3,6,9,12 $((4 * 64 * 2 * 4)) "grad-accum 2" && pass "--log-every-experts 3: steps 3, 6, 9, 12; each layer's counts sum to 4 x 64 tokens x 2 micro-batches x top-4" || fail "expert counts with --grad-accum 2"
counts_check "$tmp/np2.jsonl" 3,6,9,12 $((4 * 64 * 2 * 4)) "np 2" && pass "--log-every-experts on 2 ranks: each layer's counts sum to 4 x 64 tokens x 2 ranks x top-4" || fail "expert counts over 2 ranks"
if [ -x "$EMU" ]; then
    OMP_WAIT_POLICY=passive $EMU --device cuda --model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --steps 2 --val-every 0 --grad-accum 2 \
        --log-every-experts 1 --log "$tmp/emu.jsonl" > "$tmp/emu.out" 2>&1 || fail "emulated CUDA run: $(tail -3 "$tmp/emu.out")"
    counts_check "$tmp/emu.jsonl" 1,2 $((2 * 32 * 2 * 4)) "emulated cuda" && pass "--log-every-experts on the emulated CUDA path: each layer's counts sum to 2 x 32 tokens x 2 micro-batches x top-4" || fail "expert counts on the CUDA path"
fi

t0=$(date +%s%N)
if $PY dev/plot_run.py "$tmp/fp8_accum2.jsonl" "$tmp/np2.jsonl" -o "$tmp/run.png" > "$tmp/plot.out" 2>&1; then
    dt=$(( ($(date +%s%N) - t0) / 1000000 ))
    cat "$tmp/plot.out" | sed 's/^/   /'
    $PY - "$tmp/run.png" <<'PY' && pass "dev/plot_run.py: two runs -> a valid, non-blank PNG (${dt} ms)" || fail "dev/plot_run.py: the PNG is not as expected"
import sys
import matplotlib.image as mpimg
import numpy as np
p = sys.argv[1]
head = open(p, "rb").read(8)
assert head == b"\x89PNG\r\n\x1a\n", head
img = mpimg.imread(p)[..., :3]
h, w = img.shape[:2]
ink = float((img.mean(axis=2) < 0.9).mean())
print(f"   {p}: {w} x {h} pixels, {len(open(p, 'rb').read())} bytes, pixel std {img.std():.3f}, {100 * ink:.1f}% ink")
assert w >= 1000 and h >= 1000 and len(open(p, "rb").read()) > 20000
assert img.std() > 0.05 and ink > 0.05, "blank"
PY
    grep -q "11 panels, 2 run(s)" "$tmp/plot.out" && pass "every panel present: loss, mc accuracy, lr, grad norm, tok/s, MFU, lbl, imbalance, FP8 amax and saturation, the expert heatmap" \
        || fail "panels: $(cat "$tmp/plot.out")"
else fail "dev/plot_run.py: $(cat "$tmp/plot.out")"; fi

printf '{"step": 1, "loss": 2.0}\nnot json\n' > "$tmp/bad.jsonl"
expect_exit 2 "dev/plot_run.py: a log line that is not JSON" $PY dev/plot_run.py "$tmp/bad.jsonl" -o "$tmp/x.png"
expect_exit 2 "dev/plot_run.py: a missing log" $PY dev/plot_run.py "$tmp/none.jsonl" -o "$tmp/x.png"
expect_exit 2 "--log-every-experts without --log" $BIN --model dbrx-tiny --steps 1 --log-every-experts 2
expect_exit 2 "--log-every-experts -1" $BIN --model dbrx-tiny --steps 1 --log-every-experts -1 --log "$tmp/x.jsonl"
