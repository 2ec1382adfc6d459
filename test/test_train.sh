#!/usr/bin/env bash
# test_train.sh — end-to-end training on the CPU backend:
#   * dbrx-tiny, 40 steps on real text (the State of the Union shards): the loss falls well below
#     its starting value (last-10 mean < 0.6 x the first step's loss; val loss likewise);
#   * two identical runs give bit-identical losses (determinism);
#   * mpirun -np 2 with half the micro-batch per rank sees the same global batch as one process:
#     the same first loss (1e-6: same data, same weights), then the same losses up to the order of
#     the gradient reduction, which AdamW's first steps and top-k routing amplify (1e-3; measured
#     differences over four data seeds: up to 2.2e-4).
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-/usr/bin/python3}

$BIN --model dbrx-tiny --steps 40 --val-every 20 --val-steps 4 --log "$tmp/train.jsonl" > "$tmp/train.out" 2>&1 \
    || { fail "training 40 steps: $(tail -3 "$tmp/train.out")"; exit 0; }
tail -2 "$tmp/train.out"
$PY - "$tmp/train.jsonl" <<'PY' && pass "dbrx-tiny 40 steps: loss falls" || fail "dbrx-tiny 40 steps: loss did not fall enough"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loss = [r["loss"] for r in rows if "loss" in r]
val = [r["val_loss"] for r in rows if "val_loss" in r]
first, last10 = loss[0], sum(loss[-10:]) / 10
print(f"   train loss {first:.3f} -> {last10:.3f} (last 10 mean), val {val[0]:.3f} -> {val[-1]:.3f}")
assert len(loss) == 40
assert last10 < 0.6 * first, (first, last10)
assert val[-1] < 0.6 * val[0], val
PY
# progress: every step line says the tokens seen and the time left, the log has them exactly (tokens =
# step x batch 8 x seq 256), the time left falls to 0 at the last step
$PY - "$tmp/train.jsonl" "$tmp/train.out" <<'PY' && pass "progress: the step line and the log carry the tokens seen (step x 2048) and the time left" \
    || fail "progress: tokens or time left missing or wrong"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert all(r["tokens"] == r["step"] * 8 * 256 for r in rows), [r["tokens"] for r in rows[:3]]
assert rows[-1]["eta_s"] == 0 and rows[0]["eta_s"] > 0, (rows[0]["eta_s"], rows[-1]["eta_s"])
lines = [l for l in open(sys.argv[2]) if l.startswith("step ")]
assert len(lines) == 40 and all(re.search(r"\| [0-9.]+[KMBT]? tok \| eta [0-9dhms]+$", l.strip()) for l in lines), lines[-1]
assert lines[-1].strip().endswith("81.9K tok | eta 0s"), lines[-1]
PY

# determinism: the same run twice, bit-identical log (but for the timings)
for r in 1 2; do
    $BIN --model dbrx-tiny --n-layers 2 --steps 4 --batch 2 --val-every 2 --val-steps 1 --log "$tmp/det$r.jsonl" >/dev/null 2>&1
    $PY -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k not in ('ms','tok_per_s','mfu','mfu_foundry','eta_s','rank_busy_ms','max_busy_ms','slowest_rank')}) for l in open(sys.argv[1])]" "$tmp/det$r.jsonl" > "$tmp/det$r.txt"
done
if [ -s "$tmp/det1.txt" ] && cmp -s "$tmp/det1.txt" "$tmp/det2.txt"; then pass "two identical runs: bit-identical losses"
else fail "two identical runs differ"; fi

# data parallel over MPI
common=(--model dbrx-tiny --n-layers 2 --steps 3 --val-every 0 --seq 128)
OMP_NUM_THREADS=1 $BIN "${common[@]}" --batch 4 --log "$tmp/np1.jsonl" >/dev/null 2>&1
OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $BIN "${common[@]}" --batch 2 --log "$tmp/np2.jsonl" > "$tmp/np2.out" 2>&1
$PY - "$tmp/np1.jsonl" "$tmp/np2.jsonl" <<'PY' && pass "mpirun -np 2 matches one process (first loss 1e-6, then 1e-3)" || fail "mpirun -np 2: $(tail -3 "$tmp/np2.out")"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
print("   np1", a, "\n   np2", b)
assert len(a) == len(b) == 3 and abs(a[0] - b[0]) < 1e-6 and all(abs(x - y) < 1e-3 for x, y in zip(a, b))
PY

# two runs at once without a launcher (Open MPI singletons, started isolated: parallel/comm.h): each has an MPI
# session directory of its own under TMPDIR, named by its pid, gone after it exits. Isolated singletons share one
# job id, and in the directory they shared one run's exit removed what another was creating (its MPI_Init failed:
# 1 start in ~330 with three at a time). A session directory the user names wins.
mkdir -p "$tmp/td"
sing=(--model dbrx-tiny --n-layers 2 --steps 100000 --val-every 0 --seq 32 --batch 1)
TMPDIR=$tmp/td $BIN "${sing[@]}" --log "$tmp/s1.jsonl" > "$tmp/s1.out" 2>&1 & s1=$!
TMPDIR=$tmp/td $BIN "${sing[@]}" --log "$tmp/s2.jsonl" > "$tmp/s2.out" 2>&1 & s2=$!
TMPDIR=$tmp/td OMPI_MCA_orte_top_session_dir=$tmp/td/mine $BIN "${sing[@]}" --log "$tmp/s3.jsonl" > "$tmp/s3.out" 2>&1 & s3=$!
waitlog "$tmp/s1.jsonl" 1; waitlog "$tmp/s2.jsonl" 1; waitlog "$tmp/s3.jsonl" 1
during=$(cd "$tmp/td" && ls -d */jf.0/1 2>/dev/null | sort | tr '\n' ' ')
kill -INT $s1 $s2 $s3; wait $s1; r1=$?; wait $s2; r2=$?; wait $s3; r3=$?
want=$(printf 'mine/jf.0/1 ompi.singleton.%s.%s/jf.0/1 ompi.singleton.%s.%s/jf.0/1 ' "$(id -u)" $s1 "$(id -u)" $s2 | tr ' ' '\n' | sort | tr '\n' ' ')
[ "$during" = "$want" ] && [ "$r1$r2$r3" = 000 ] && [ -z "$(ls "$tmp/td")" ] \
    && pass "three runs at once without a launcher: their own MPI session directories ($during), none left after exit 0" \
    || fail "singleton session directories: during '$during' (want '$want'), exits $r1 $r2 $r3, left '$(ls "$tmp/td" | tr '\n' ' ')': $(tail -2 "$tmp/s1.out")"
