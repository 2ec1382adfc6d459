#!/usr/bin/env bash
# test_fp8.sh — FP8 across ranks: under delayed scaling every tensor's amax is the max over the
# ranks, so two ranks with half the batch each log the same amaxes as one process with the whole
# batch; rank 0's own amax (logged beside it) is smaller for the tensors whose maximum sits in
# rank 1's half.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
PY=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(--model dbrx-tiny --n-layers 2 --steps 2 --val-every 0 --seq 64 --fp8 delayed --fp8-log-every 1)
OMP_NUM_THREADS=1 $BIN "${common[@]}" --batch 4 --log "$tmp/np1.jsonl" >/dev/null 2>&1
OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $BIN "${common[@]}" --batch 2 --log "$tmp/np2.jsonl" > "$tmp/np2.out" 2>&1
$PY - "$tmp/np1.jsonl" "$tmp/np2.jsonl" <<'PY' && pass "FP8 amax reduced across ranks (np 2 == np 1)" || fail "FP8 amax across ranks: $(tail -2 "$tmp/np2.out")"
import json, sys
a, b = ([json.loads(l)["fp8"] for l in open(p) if '"fp8"' in l] for p in sys.argv[1:])
assert len(a) == len(b) == 2, (len(a), len(b))
# step 1 under delayed scaling quantises with each rank's own amax (no history yet), so only the
# first quantised activation (blocks.0.qkv.x) and the weights are the same tensors in both runs
n = 0
for name, v in a[0].items():
    if name == "blocks.0.qkv.x" or name.endswith(".w"):
        w = b[0][name]
        assert abs(v["amax"] - w["amax"]) <= 1e-4 * v["amax"], (name, v, w)
        n += 1
# and rank 0's own amax was below the reduced one somewhere: the reduction did something
below = [k for k, v in b[0].items() if v["amax_rank0"] < v["amax"]]
assert below, "no tensor's amax changed in the reduction"
print(f"   {n} tensors with the same amax as one process; reduction raised rank 0's amax of {len(below)} tensors")
PY
expect_exit 2 "bad --fp8 recipe" $BIN --fp8 fp4 --dry-run
