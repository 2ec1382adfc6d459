#!/usr/bin/env bash
# test_predict_shapes.sh — the step-time model's emulation at full size (SIMT_SHAPES_ONLY=1, test/simt/simt.h): the
# shapes-only run asks the device for the same work as the real run (test/check_shapes_log.py), and at dbrx-1b's
# full batch (8 x 2048 tokens, every width as the preset's) its step is the MFU formula's count; make predict on it.
#   - dbrx-tiny at the production head_dim 128 (d 256, 2 heads, kv 1), BF16; --fp8 block; ZeRO-3 on 2 ranks; expert
#     parallelism 2 (NCCL twin): step 2 of the real and of the shapes-only log, item by item (kernels, copies,
#     collectives, events, syncs, sizes; the expert GEMMs' FLOPs, which only the routing splits differently);
#   - negative control: a planted extra sync per layer (DBRX_DEBUG_PLANT=step_sync) in the shapes-only run fails it;
#   - dbrx-1b, 8 x 2048, shapes only: the log's GEMM FLOPs equal the MFU formula (test/test_predict.py --e2e), every
#     launch and GEMM the emulator counted is in it; make predict prints the step, the MFU and the memory verdict.
# Alone: bash test/test_predict_shapes.sh (EMU= overrides ./train_dbrx_emu)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
EMU=${EMU:-./train_dbrx_emu}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
if [ ! -x "$EMU" ]; then fail "$EMU is not built (make train_dbrx_emu)"; exit 0; fi

# pair NAME NP [env...] -- FLAGS...: the real and the shapes-only run of the same configuration (2 steps)
pair() {
    local name=$1 np=$2; shift 2
    local envs=() mode
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    for mode in 0 1; do
        env SIMT_SHAPES_ONLY=$mode SIMT_WORKLOG="$tmp/$name.$mode.jsonl" ${envs[@]+"${envs[@]}"} bash dev/mpirun.sh -np "$np" \
            "$EMU" --device cuda --model dbrx-tiny --batch 2 --seq 32 --steps 2 --val-every 0 "$@" > "$tmp/$name.$mode.out" 2>&1 \
            || { fail "$name: the $([ $mode = 1 ] && echo shapes-only || echo real) run failed: $(grep -v '^ *$' "$tmp/$name.$mode.out" | tail -2)"; return 1; }
        # the shapes-only run computes nothing: its losses are zeros (its values mean nothing)
        [ $mode = 1 ] && ! grep -q "^step     2/2 | loss 0.000000" "$tmp/$name.$mode.out" && { fail "$name: the shapes-only run computed a loss"; return 1; }
    done
    local logs=() r
    if [ "$np" = 1 ]; then logs=("$tmp/$name.0.jsonl" "$tmp/$name.1.jsonl")
    else for r in $(seq 0 $((np - 1))); do logs+=("$tmp/$name.0.jsonl.$r" "$tmp/$name.1.jsonl.$r"); done; fi
    $PY test/check_shapes_log.py "$name" $([ "$name" = fp8 ] && echo --fp8) "${logs[@]}" > "$tmp/$name.txt" 2>&1
    verdicts "$tmp/$name.txt" $((3 * np + 1))
}
hd128=(--d-model 256 --n-heads 2 --kv-heads 1)
pair bf16_hd128 1 -- "${hd128[@]}"
pair fp8 1 -- --fp8 block
pair zero3 2 -- "${hd128[@]}"
# (EP's exchange in one piece: in chunks (--ep-overlap-chunks) it skips the empty pieces of a chunk, so its sequence
# of sends, gathers and GEMMs follows the routing, which the shapes-only run balances; test/test_ep_overlap.sh
# holds the chunked exchange to the unchunked one's losses and bytes)
pair ep2 2 -- --expert-parallel 2 --ep-overlap-chunks 1

# negative control: one more stream sync per layer in the shapes-only run only
SIMT_SHAPES_ONLY=1 SIMT_WORKLOG="$tmp/planted.jsonl" DBRX_DEBUG_PLANT=step_sync "$EMU" --device cuda --model dbrx-tiny --batch 2 \
    --seq 32 --steps 2 --val-every 0 "${hd128[@]}" > "$tmp/planted.out" 2>&1
$PY test/check_shapes_log.py planted "$tmp/bf16_hd128.0.jsonl" "$tmp/planted.jsonl" > "$tmp/planted.txt" 2>&1
if grep -q "^fail planted: the same" "$tmp/planted.txt"; then pass "negative control: a planted sync per layer in the shapes-only run is caught ($(grep -m1 '^fail' "$tmp/planted.txt" | cut -c6-150))"
else fail "negative control: the planted sync per layer was not caught: $(head -2 "$tmp/planted.txt")"; fi

# dbrx-1b at its full batch, shapes only: the step's GEMM FLOPs against the MFU formula, the counters against the log
if SIMT_SHAPES_ONLY=1 SIMT_WORKLOG="$tmp/1b.jsonl" SIMT_STEP_COUNTERS=1 "$EMU" --device cuda --model dbrx-1b --batch 8 --seq 2048 \
        --steps 2 --val-every 0 --comm-timeout 1e6 > "$tmp/1b.out" 2> "$tmp/1b.err"; then
    grep "^simt counters" "$tmp/1b.err" > "$tmp/1b.counters"
    # dbrx-1b: L 9, d 1024, heads 8 (kv 2), E 16, top-4, F 1792, V 100352; 16384 tokens of 2048
    $PY test/test_predict.py --e2e "$tmp/1b.jsonl" "$tmp/1b.counters" 9 1024 8 2 16 4 1792 100352 16384 2048 > "$tmp/1b.txt" 2>&1
    verdicts "$tmp/1b.txt" 6
else fail "dbrx-1b 8 x 2048 shapes-only run: $(tail -2 "$tmp/1b.err")"; fi
out=$(make -s predict MODEL=dbrx-1b BATCH=8 SEQ=2048 EMU="$EMU" 2>&1)
if grep -q "^predicted step on h100-sxm" <<<"$out" && grep -q "^MFU" <<<"$out" && grep -q "^memory (--dry-run.s plan per GPU): .* FITS" <<<"$out" \
   && grep -q "^critical path" <<<"$out"; then
    pass "make predict (dbrx-1b, 8 x 2048, H100 SXM): $(grep -m1 '^predicted' <<<"$out" | cut -c1-70); $(grep -m1 '^MFU' <<<"$out" | sed 's/.*: //')"
else fail "make predict: $(head -5 <<<"$out")"; fi
expect_exit 2 "make predict, a bad DEVICE" env DEVICE=a100 NP=1 bash dev/predict/make_predict.sh
expect_exit 2 "make predict, a bad NP" env NP=0 bash dev/predict/make_predict.sh

# --profile under the emulator and make predict TRACE=: the same named ranges, measured (here the emulator's wall
# clock) and predicted, matched class by class by the calibration of make bench-gpu (dev/predict/calibrate.py)
if "$EMU" --device cuda --model dbrx-tiny --batch 2 --seq 32 --steps 3 --val-every 0 --profile "$tmp/meas.json" --profile-steps 2:3 \
        > "$tmp/meas.out" 2>&1 && env MODEL=dbrx-tiny BATCH=2 SEQ=32 TRACE="$tmp/pred.json" EMU="$EMU" bash dev/predict/make_predict.sh \
        > "$tmp/pred.out" 2>&1; then
    $PY dev/predict/calibrate.py "$tmp/meas.json" "$tmp/pred.json" --json > "$tmp/cal.json" 2> "$tmp/cal.err"
    $PY - "$tmp/cal.json" "$tmp/pred.json" <<'PY' > "$tmp/cal.txt" 2>&1
import json, sys
c = json.load(open(sys.argv[1]))
rows = {r["class"]: r for r in c["classes"]}
want = {"forward", "backward", "optimizer", "layer N attention", "layer N router", "layer N experts", "lm_head + loss", "embedding"}
both = [k for k, r in rows.items() if r["predicted_ms"] is not None and r["measured_ms"] is not None]
print(("pass" if want <= set(both) and len(both) == len(rows) else "fail") + " calibrate.py matches every range class of the "
      "emulated --profile trace with the predicted timeline's (%d classes: %s)" % (len(both), ", ".join(sorted(both))))
print(("pass" if rows["layer N attention"]["count"] == 8 else "fail") + " 'layer N attention': 8 ranges per step (4 layers, "
      "forward and backward) on the predicted timeline (%d)" % rows["layer N attention"]["count"])
t = json.load(open(sys.argv[2]))
step = t["otherData"]["predicted_step_ms"]
r = [e for e in t["traceEvents"] if e.get("ph") == "X" and (e.get("args") or {}).get("predicted") and e["name"] in ("forward", "backward", "optimizer")]
span = sum(e["dur"] for e in r) / 1e3
print(("pass" if r and 0.5 * step < span <= step * (1 + 1e-9) else "fail") + " the predicted forward, backward and optimizer ranges "
      "cover %.3f ms of the %.3f ms predicted step" % (span, step))
PY
    verdicts "$tmp/cal.txt" 3
else fail "--profile / make predict TRACE= for the calibration check: $(tail -2 "$tmp/meas.out" "$tmp/pred.out")"; fi

# CI keeps the recorded predictions current (dev/bench/predicted.json, results_predicted.md): the configurations that
# emulate in seconds predict what is recorded (a change that moves one re-records it: make predict-record)
$PY dev/predict/recorded.py current --cheap > "$tmp/rec.txt" 2>&1
verdicts "$tmp/rec.txt" 7
# record --only TEXT re-records the configurations whose names hold TEXT; a TEXT that names none is refused in one line,
# exit non-zero, the record untouched
sum0=$(cat dev/bench/predicted.json dev/bench/results_predicted.md | md5sum)
if $PY dev/predict/recorded.py record --only "no such configuration" > "$tmp/only.txt" 2>&1; then
    fail "recorded.py record --only with a text no configuration's name holds: exit 0"
elif [ "$(wc -l < "$tmp/only.txt")" = 1 ] && grep -q "^error: --only 'no such configuration'" "$tmp/only.txt" \
     && [ "$(cat dev/bench/predicted.json dev/bench/results_predicted.md | md5sum)" = "$sum0" ]; then
    pass "bad input refused: recorded.py record --only naming no configuration: one line, non-zero exit, the record untouched"
else fail "recorded.py record --only naming no configuration: $(head -2 "$tmp/only.txt")"; fi
# make predict's tolerance of Open MPI's "exiting improperly" at the end of an oversubscribed run (make_predict.sh's
# finished_improperly): the run counts only when the message is there and every rank printed its last line
source <(sed -n '/^finished_improperly()/,/^}/p' dev/predict/make_predict.sh)
{ for r in 0 1 2; do echo "comm: rank $r sent 7856 bytes in 2 training steps (3928.0 bytes/step)"; done
  echo "mpirun has exited due to process rank 1 with PID 0 on"; echo "node vm exiting improperly. There are three reasons this could occur:"; } > "$tmp/imp3.txt"
grep -v "rank 2 sent" "$tmp/imp3.txt" > "$tmp/imp2.txt"; grep -v "improperly" "$tmp/imp3.txt" > "$tmp/fail3.txt"
if NP=3 finished_improperly "$tmp/imp3.txt" 2> "$tmp/imp.err" && grep -q "^note: make predict: mpirun reported" "$tmp/imp.err" \
   && ! NP=3 finished_improperly "$tmp/imp2.txt" 2>/dev/null && ! NP=3 finished_improperly "$tmp/fail3.txt" 2>/dev/null \
   && ! NP=1 finished_improperly "$tmp/imp3.txt" 2>/dev/null; then
    pass "make predict counts a run that mpirun calls 'exiting improperly' after every rank's last line (with a note), and no other: 2 of 3 ranks done, another failure, one rank"
else fail "make_predict.sh's finished_improperly: a run it should (not) count"; fi
