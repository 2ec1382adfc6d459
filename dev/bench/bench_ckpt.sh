#!/usr/bin/env bash
# bench_ckpt.sh — checkpoint save throughput against the disk's sequential write speed, measured in
# the same run, and how long the training loop blocks. Writes dev/bench/results_ckpt.md.
#   bash dev/bench/bench_ckpt.sh [DIR] [NP]      (DIR: where to write, default /tmp; NP ranks, default 1)
# 1. dd: the checkpoint's size of zeros, with fsync (conv=fsync), twice; the better is the disk's speed.
# 2. train_dbrx saves a 591 MiB checkpoint (dbrx-tiny widened to d 384, 4 layers: 51.6 M parameters;
#    master weights + AdamW m and v, 12 B/parameter) every other step, keeping one; per save it reports
#    the time the loop blocked (the shard copied to host memory), the background write (file, checksum,
#    fsync) and start-to-commit, and each step's time shows whether the write slowed the compute.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-/tmp}; NP=${2:-1}
BIN=./train_dbrx
OUT=dev/bench/results_ckpt.md
work=$(mktemp -d "$DIR/bench_ckpt.XXXXXX"); trap 'rm -rf "$work"' EXIT
[ -x "$BIN" ] || make train_dbrx >/dev/null
M=(--model dbrx-tiny --d-model 384 --n-heads 4 --kv-heads 2 --ffn-hidden 672 --n-layers 4 --batch 1 --seq 32 --val-every 0)
bytes=$($BIN "${M[@]}" --dry-run | sed -nE 's/^parameters: total ([0-9,]+).*/\1/p' | tr -d ,)
mb=$(( bytes * 12 / 1048576 ))

dd_speed() {
    local out; out=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mb" conv=fsync 2>&1 | tail -1)
    rm -f "$work/dd.bin"
    sed -nE 's/^([0-9]+) bytes .* copied, ([0-9.]+) s, .*/\1 \2/p' <<<"$out" | awk '{printf "%.1f", $1 / $2 / 1048576}'
}
d1=$(dd_speed); d2=$(dd_speed)
disk=$(awk -v a="$d1" -v b="$d2" 'BEGIN { print (a > b ? a : b) }')

launch=("$BIN"); [ "$NP" -gt 1 ] && launch=(bash dev/mpirun.sh -np "$NP" "$BIN")
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "${launch[@]}" "${M[@]}" --steps 8 --ckpt-dir "$work/ck" --ckpt-every 2 --ckpt-keep 1 \
    --log "$work/log.jsonl" > "$work/out" 2>&1 || { tail -5 "$work/out"; exit 1; }

/usr/bin/python3 - "$work/log.jsonl" "$disk" "$d1" "$d2" "$bytes" "$NP" "$DIR" > "$OUT" <<'PY'
import json, platform, subprocess, sys, time
log, disk, d1, d2, params, np_, where = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
rows = [json.loads(l) for l in open(log)]
steps = [r for r in rows if "loss" in r]
saves = [r for r in rows if "ckpt_step" in r]
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
fs = subprocess.run(["sh", "-c", "df -T %s | tail -1 | awk '{print $2}'" % where], capture_output=True, text=True).stdout.strip()
print("# Checkpoint save throughput\n")
print("Written by `dev/bench/bench_ckpt.sh` (overwritten each run). %s, %s; %s rank(s); checkpoints in %s (%s).\n" % (
    time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpu, np_, where, fs))
print("Model: dbrx-tiny widened to d 384, 4 layers, %s parameters; a checkpoint is master weights + AdamW m and v, "
      "12 B/parameter, plus a 64-byte header per shard.\n" % format(params, ","))
print("| measure | value |\n|---|---|")
print("| disk sequential write, `dd bs=1M conv=fsync` of the checkpoint's size (best of 2: %s, %s MiB/s) | **%.1f MiB/s** |" % (d1, d2, disk))
for s in saves:
    mbs = s["bytes"] / 1048576
    print("| save of step %d: %.1f MiB | blocked **%.1f ms**, background write %.0f ms (**%.1f MiB/s = %.0f%% of dd**), start to commit %.0f ms |" % (
        s["ckpt_step"], mbs, s["blocked_ms"], s["write_ms"], mbs / (s["write_ms"] / 1e3), 100 * mbs / (s["write_ms"] / 1e3) / disk,
        s["total_ms"]))
# a step ran during a background write if it comes after the save's step and before the save's commit in the log
inflight = set()
for i, r in enumerate(rows):
    if "ckpt_step" in r:
        inflight |= {x["step"] for x in rows[:i] if "loss" in x and x["step"] > r["ckpt_step"]}
print("\nStep times (steps 2, 4, 6 start a save when they end; step 8's save is the one on the way out, waited for):\n")
print("| step | ms | a background write in flight |\n|---|---|---|")
for r in steps:
    print("| %d | %.0f | %s |" % (r["step"], r["ms"], "yes" if r["step"] in inflight else ""))
print("\nThe loop blocks only for the copy of the shard into host memory (the `blocked` column); the file is written, "
      "checksummed (CRC-32C) and fsynced by a background thread, and the commit (manifest, rename, `latest`) happens at "
      "the first step end after every writer is done. The last save is waited for before the run exits.")
PY
cat "$OUT"
