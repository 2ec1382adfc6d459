#!/usr/bin/env bash
# test_profile.sh — --profile FILE (model/profile.h): the trace of the --profile-steps, checked by
# test/check_trace.py (valid trace-event JSON, every event's fields, ranges nested per track, the phases
# and layers present, each step's range = the time the log prints, the phases adding up to the step):
#   * the CPU backend, one rank, steps 2:3 (the default), with a validation and a checkpoint save in them;
#   * the CUDA backend on the emulator (train_dbrx_emu --device cuda), 2 ranks under ZeRO-3: one file per
#     rank (.rank<r>), the model's ranges on the compute stream, all-gathers and reduce-scatters on the
#     communication stream; 2 ranks data parallel with 2 micro-batches: the replicas' all-reduce on theirs;
#   * profiling changes nothing: the losses and gradient norms of both runs bit-identical without
#     --profile, and (emulator) the launches, GEMMs, synchronisations and copies of every step the same
#     (SIMT_STEP_COUNTERS, the counters of the step budget: model/CUDA.md);
#   * --profile-kernels (emulator, one rank): one "kernel" range per launch and GEMM of each traced step (the
#     emulator's counters), the losses unchanged, and calibrate.py --kernels finding the same kernels, launch for
#     launch, in `make predict`'s trace of the same configuration (negative control: the model's trace of 3 layers);
#     refused without --profile and on the CPU backend;
#   * bad input: an unwritable --profile path (before step 1, exit 2, one line naming the flag, nothing
#     left behind, also on 2 ranks), bad --profile-steps, --profile-steps without --profile, --profile
#     with a mode that trains nothing.
# BIN (default ./train_dbrx_cpu) and EMU (default ./train_dbrx_emu; skipped when it is not built).
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
BIN=${BIN:-./train_dbrx_cpu}
EMU=${EMU:-./train_dbrx_emu}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--model dbrx-tiny --n-layers 2 --seq 32 --batch 1 --steps 3 --val-every 0)
PHASES=(--need "zero grad" --need data --need forward --need backward --need "gradient reduction" --need optimizer)
LAYERS=(--need embedding --need "layer 0 attention" --need "layer 1 router" --need "layer 1 experts" --need "lm_head + loss")

# same_losses NAME A.jsonl B.jsonl: every step's loss and gradient norm the same text (%.17g: bit-identical)
same_losses() {
    local a b; a=$(grep -o '"loss": [^,]*, .*"grad_norm": [^,]*' "$2"); b=$(grep -o '"loss": [^,]*, .*"grad_norm": [^,]*' "$3")
    [ -n "$a" ] && [ "$a" = "$b" ] && pass "$1: losses and gradient norms bit-identical with and without --profile ($(grep -c . <<<"$a") steps)" \
        || fail "$1: losses differ with --profile: $(diff <(echo "$a") <(echo "$b") | head -4)"
}

# --- the CPU backend: steps 2:3 (the default), a validation (step 3) and a checkpoint save (step 2) in them. Steps of
# 4 x 256 tokens (~0.2 s, not 30 ms): a scheduler's time slice lost between two phases (the suite runs three sections on
# two cores) is then a few percent of the step, not the 14% that once failed the phases' 10%
C=("${G[@]}" --val-every 2 --val-steps 1 --ckpt-every 2 --seq 256 --batch 4)
$BIN "${C[@]}" --ckpt-dir "$tmp/ck0" --log "$tmp/cpu0.jsonl" > "$tmp/cpu0.out" 2>&1 || fail "cpu run: $(tail -2 "$tmp/cpu0.out")"
$BIN "${C[@]}" --ckpt-dir "$tmp/ck1" --log "$tmp/cpu1.jsonl" --profile "$tmp/cpu.json" > "$tmp/cpu1.out" 2>&1 \
    || fail "cpu run with --profile: $(tail -2 "$tmp/cpu1.out")"
grep -q "^profile: steps 2:3, .* written to $tmp/cpu.json" "$tmp/cpu1.out" && pass "cpu: the trace's line" || fail "cpu: no profile line"
$PY test/check_trace.py "$tmp/cpu.json" --rank 0 --steps 2:3 --log "$tmp/cpu1.jsonl" "${PHASES[@]}" "${LAYERS[@]}" \
    --need validation --need "checkpoint save" > "$tmp/v_cpu" 2>&1
verdicts "$tmp/v_cpu" 6
same_losses cpu "$tmp/cpu0.jsonl" "$tmp/cpu1.jsonl"
# negative controls: the checker fails a trace whose ranges overlap (a layer's range past its phase's end), one
# without a phase (backward), and one whose step lasts other than the log says
$PY - "$tmp/cpu.json" "$tmp" <<'PY'
import json, sys
src, d = sys.argv[1], sys.argv[2]
def planted(name, change):
    t = json.load(open(src))
    change([e for e in t["traceEvents"] if e["ph"] == "X"], t)
    json.dump(t, open("%s/planted_%s.json" % (d, name), "w"))
def overlap(X, t):
    fwd = next(e for e in X if e["name"] == "forward")
    r = next(e for e in X if e["name"] == "layer 0 router" and fwd["ts"] <= e["ts"] <= fwd["ts"] + fwd["dur"])
    r["dur"] = fwd["ts"] + fwd["dur"] - r["ts"] + 50
def no_backward(X, t):
    t["traceEvents"] = [e for e in t["traceEvents"] if e["name"] != "backward"]
def long_step(X, t):
    next(e for e in X if e["name"] == "step 2")["dur"] *= 1.5
planted("overlap", overlap); planted("no_backward", no_backward); planted("long_step", long_step)
PY
for p in "overlap:nest properly" "no_backward:every range asked for" "long_step:lasts the time the log prints"; do
    out=$($PY test/check_trace.py "$tmp/planted_${p%%:*}.json" --rank 0 --steps 2:3 --log "$tmp/cpu1.jsonl" "${PHASES[@]}" 2>&1)
    grep -q "^fail .*${p#*:}" <<<"$out" && pass "check_trace.py catches a planted trace: ${p%%:*} ($(grep -c '^fail' <<<"$out") check(s) fail)" \
        || fail "check_trace.py passed a planted trace (${p%%:*}): $out"
done

# a run that stops before its --profile-steps: a warning, and a valid trace without ranges
$BIN "${G[@]}" --stop-after 1 --profile-steps 3 --profile "$tmp/early.json" > "$tmp/early.out" 2>&1
grep -q "^warning: --profile: no step of --profile-steps 3:3 ran" "$tmp/early.out" \
    && $PY -c "import json,sys; t=json.load(open(sys.argv[1])); sys.exit(any(e['ph'] == 'X' for e in t['traceEvents']))" "$tmp/early.json" \
    && pass "stopped before --profile-steps 3: a warning, a valid trace without ranges" || fail "stopped before the traced steps: $(tail -3 "$tmp/early.out")"

# --- bad input (the CPU build): exit 2, one line naming the flag, before step 1
expect_exit 2 "--profile in a directory that does not exist" $BIN "${G[@]}" --profile "$tmp/nodir/t.json"
grep -q -- "^error: --profile $tmp/nodir/t.json: the directory $tmp/nodir does not exist" <<<"$LAST_ERR" || fail "--profile no dir: $LAST_ERR"
expect_exit 2 "--profile where no file can be created (/proc)" $BIN "${G[@]}" --profile /proc/t.json
grep -q -- "^error: --profile /proc/t.json: it cannot be created" <<<"$LAST_ERR" || fail "--profile in /proc: $LAST_ERR"
out=$(timeout -s KILL 60 $MPI -np 2 $BIN "${G[@]}" --profile "$tmp/nodir/t.json" 2>&1 >/dev/null); rc=$?
[ "$rc" = 2 ] && [ "$(grep -c '^error: --profile' <<<"$out")" = 1 ] && pass "2 ranks, bad --profile: one line, exit 2" \
    || fail "2 ranks, bad --profile: exit $rc: $(head -c 300 <<<"$out")"
for v in 0 3:2 x 2:x 1:4 " 2" 2:3:4 -1; do
    expect_exit 2 "--profile-steps '$v'" $BIN "${G[@]}" --profile "$tmp/bad.json" --profile-steps "$v"
done
expect_exit 2 "--profile-steps without --profile" $BIN "${G[@]}" --profile-steps 1:2
expect_exit 2 "--profile with --dry-run" $BIN "${G[@]}" --profile "$tmp/bad.json" --dry-run
[ -z "$(ls "$tmp" | grep -E '^bad|^t\.json|\.tmp$')" ] && pass "the refused runs left no file behind" || fail "left behind: $(ls "$tmp")"

# --- the CUDA backend on the emulator: 2 ranks, ZeRO-3
if [ -x "$EMU" ]; then
    Z=("${G[@]}" --device cuda --shard-group-size 2)
    SIMT_STEP_COUNTERS=1 $MPI --tag-output -np 2 $EMU "${Z[@]}" --log "$tmp/emu0.jsonl" > "$tmp/emu0.out" 2>&1 \
        || fail "emulated run: $(grep -v step "$tmp/emu0.out" | tail -2)"
    SIMT_STEP_COUNTERS=1 $MPI --tag-output -np 2 $EMU "${Z[@]}" --log "$tmp/emu1.jsonl" --profile "$tmp/emu.json" --profile-steps 2:3 \
        > "$tmp/emu1.out" 2>&1 || fail "emulated run with --profile: $(grep -v step "$tmp/emu1.out" | tail -2)"
    for r in 0 1; do
        $PY test/check_trace.py "$tmp/emu.rank$r.json" --rank $r --steps 2:3 $([ $r = 0 ] && echo --log "$tmp/emu1.jsonl") \
            "${PHASES[@]}" "${LAYERS[@]}" --need "compute:forward" --need "compute:layer 0 experts" \
            --need "communication:all-gather unit*" --need "communication:reduce-scatter unit*" > "$tmp/v_emu$r" 2>&1
        verdicts "$tmp/v_emu$r" 6
    done
    same_losses "emulated ZeRO-3, 2 ranks" "$tmp/emu0.jsonl" "$tmp/emu1.jsonl"
    # data parallel (S = 1) with 2 micro-batches: the replicas' gradient all-reduce on its own stream
    $MPI -np 2 $EMU "${G[@]}" --device cuda --shard-group-size 1 --grad-accum 2 --steps 2 --profile "$tmp/ddp.json" --profile-steps 2 \
        --log "$tmp/ddp.jsonl" > "$tmp/ddp.out" 2>&1 || fail "emulated DDP run with --profile: $(grep -v step "$tmp/ddp.out" | tail -2)"
    $PY test/check_trace.py "$tmp/ddp.rank0.json" --rank 0 --steps 2:2 --log "$tmp/ddp.jsonl" "${PHASES[@]}" \
        --need "replica group:all-reduce gradients" > "$tmp/v_ddp" 2>&1
    verdicts "$tmp/v_ddp" 6
    # every rank's counters, line by line (each step's, and between steps), the same with --profile; the negative
    # control: one more synchronisation per layer (DBRX_DEBUG_PLANT=step_sync) shows in them
    counters() { grep -E "^\[[0-9]+,$2\]<stderr>: ?simt counters" "$1"; }
    for r in 0 1; do
        a=$(counters "$tmp/emu0.out" $r); b=$(counters "$tmp/emu1.out" $r)
        [ -n "$a" ] && [ "$a" = "$b" ] && pass "emulated rank $r: the same launches, GEMMs, syncs and copies with --profile ($(grep -c . <<<"$a") counter lines)" \
            || fail "emulated rank $r: --profile changed the step's work: $(diff <(echo "$a") <(echo "$b") | head -4)"
    done
    DBRX_DEBUG_PLANT=step_sync SIMT_STEP_COUNTERS=1 $MPI --tag-output -np 2 $EMU "${Z[@]}" --steps 2 --profile "$tmp/emu2.json" \
        > "$tmp/emu2.out" 2>&1 || fail "emulated run with a planted sync: $(grep -v step "$tmp/emu2.out" | tail -2)"
    a=$(counters "$tmp/emu0.out" 0 | sed -n 4p); b=$(counters "$tmp/emu2.out" 0 | sed -n 4p)
    [ -n "$b" ] && [ "$a" != "$b" ] && pass "negative control: a planted sync per layer changes step 2's counters ($b)" \
        || fail "negative control: the planted sync did not show in the counters: '$a' vs '$b'"
    # --profile-kernels: every launch and GEMM of the traced steps a range of its own (cat "kernel"), as many per step as
    # the emulator's counters count; the losses unchanged; the kernels, launch for launch, the ones the step-time
    # model's trace of the same configuration has (calibrate.py --kernels; negative control: a model of 3 layers)
    K=("${G[@]}" --device cuda)
    SIMT_STEP_COUNTERS=1 $EMU "${K[@]}" --log "$tmp/k1.jsonl" --profile "$tmp/k.json" --profile-steps 2:3 --profile-kernels \
        > "$tmp/k1.out" 2>&1 || fail "emulated run with --profile-kernels: $(grep -v step "$tmp/k1.out" | tail -2)"
    $EMU "${K[@]}" --log "$tmp/k0.jsonl" > /dev/null 2>&1
    same_losses "--profile-kernels" "$tmp/k0.jsonl" "$tmp/k1.jsonl"
    $PY test/check_trace.py "$tmp/k.json" --rank 0 --steps 2:3 --log "$tmp/k1.jsonl" "${PHASES[@]}" "${LAYERS[@]}" \
        --need "compute:layernorm_forward_kernel*" --need "compute:adamw_fused_kernel" --need "compute:gemm *" > "$tmp/v_k" 2>&1
    verdicts "$tmp/v_k" 6
    $PY - "$tmp/k.json" "$tmp/k1.out" <<'PY' && pass "--profile-kernels: one kernel range per launch and per GEMM of steps 2 and 3 (the emulator's counters)" || fail "--profile-kernels: the kernel ranges are not the step's launches"
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
rows = [l for l in open(sys.argv[2]) if l.startswith("simt counters")]
for s in (2, 3):   # every second counter line closes a step (test_cuda_train.sh)
    c = dict((k, int(v)) for k, v in re.findall(r"\b(kernels|gemms) (\d+)", rows[2 * s - 1]))
    got = sum(1 for e in ev if e.get("cat") == "kernel" and e["args"]["step"] == s)
    assert c and got == c["kernels"] + c["gemms"]
PY
    make -s predict MODEL=dbrx-tiny BATCH=1 SEQ=32 FLAGS="--n-layers 2" TRACE="$tmp/kp2.json" EMU=$EMU > /dev/null 2>&1
    make -s predict MODEL=dbrx-tiny BATCH=1 SEQ=32 FLAGS="--n-layers 3" TRACE="$tmp/kp3.json" EMU=$EMU > /dev/null 2>&1
    same_kernels() {   # same_kernels PREDICTED: every kernel but the GEMMs (whose shapes follow the routing) as often in both
        $PY dev/predict/calibrate.py --kernels "$tmp/k.json" "$1" --json | $PY -c '
import json, sys
d = json.load(sys.stdin)
bad = [k for k, v in d.items() if not k.startswith("gemm") and not k.startswith("copy") and v["measured_launches"] != v["predicted_launches"]]
print(" ".join(bad)); sys.exit(1 if bad or len(d) < 20 else 0)'
    }
    out=$(same_kernels "$tmp/kp2.json") && pass "calibrate.py --kernels: the GPU run's kernels are the step-time model's, launch for launch" \
        || fail "calibrate.py --kernels: the kernels differ from the model's: $out"
    out=$(same_kernels "$tmp/kp3.json") && fail "negative control: a 3-layer model's kernels matched a 2-layer run's" \
        || pass "negative control: a 3-layer model's kernels differ from the 2-layer run's ($(wc -w <<<"$out") kernels)"
    # the routing: every token to experts 0..k-1 (DBRX_DEBUG_ROUTE_FIRST) launches fewer expert GEMMs than the model's
    # balanced step, and calibrate.py --kernels says the two are not the same work; at the model's routing
    # (DBRX_DEBUG_ROUTE_BALANCED) it has nothing to say
    for r in FIRST BALANCED; do
        env DBRX_DEBUG_ROUTE_$r=1 $EMU "${K[@]}" --profile "$tmp/kr_$r.json" --profile-steps 2:2 --profile-kernels > /dev/null 2>&1 \
            || fail "emulated run with DBRX_DEBUG_ROUTE_$r=1 and --profile-kernels"
        $PY dev/predict/calibrate.py --kernels "$tmp/kr_$r.json" "$tmp/kp2.json" > "$tmp/kr_$r.txt" 2>&1
    done
    if grep -q "^warning: the GEMM launches differ (measured [0-9]* a step, predicted [0-9]*)" "$tmp/kr_FIRST.txt" \
            && ! grep -q "GEMM launches differ" "$tmp/kr_BALANCED.txt" && grep -q "^all [0-9]* kernels" "$tmp/kr_BALANCED.txt"; then
        pass "calibrate.py --kernels: a run routing every token to experts 0..k-1 is flagged as other work ($(grep -o 'measured [0-9]* a step, predicted [0-9]*' "$tmp/kr_FIRST.txt")); at the balanced routing not"
    else fail "calibrate.py --kernels' routing check: $(grep -h "warning\|error" "$tmp"/kr_*.txt | head -2)"; fi
    expect_exit 2 "--profile-kernels without --profile" $EMU "${K[@]}" --profile-kernels
    expect_exit 2 "--profile-kernels on the CPU backend" $BIN "${G[@]}" --profile "$tmp/bad.json" --profile-kernels
    grep -q -- "^error: --profile-kernels is the CUDA step's: this run is on the CPU" <<<"$LAST_ERR" || fail "--profile-kernels on the CPU: $LAST_ERR"
else
    echo "skipped: the emulated CUDA backend ($EMU not built)"
fi
