#!/usr/bin/env bash
# test_gpu.sh — make test-gpu: everything that needs a real GPU, in one command, ending with a one-screen
# go/no-go report. Each check runs under its own time limit and the run goes on past a failure:
#   * the device test programs (test/*_gpu: the kernels, the training step, FP8, ZeRO-3's FP8 gather,
#     generation; SANITIZER=1 runs them under compute-sanitizer memcheck);
#   * the shell suites that run ./train_dbrx (the nvcc build, which picks the GPU by --device auto) in one
#     process: test_cli.sh, test_guard.sh; test_train.sh also runs mpirun -np 2, so it needs 2 GPUs
#     (skipped with fewer);
#   * a smoke run: dbrx-tiny on the default data, 20 steps on the GPU: the loss must fall; tok/s and MFU;
#     PyTorch (dev/hf_logits.py) on its Hugging Face export reproduces its --dump-logits at the BF16
#     default tolerance;
#   * the GPU benchmarks' sanity pass (dev/bench/bench_gpu.sh --quick: every command runs; the numbers
#     are reported, a missed target is not a failure).
# The report (a table: name, PASS/FAIL/SKIP, seconds, key number; then GO or NO-GO) is printed and written
# to dev/bench/test_gpu_report.md (commit it after a GPU run); raw outputs go to dev/bench/gpu_runs/test_gpu/.
# Exit status: 0 on GO, 1 on NO-GO, 1 with one line when no GPU is visible (--gpu-check: only that check).
#   make test-gpu            (builds train_dbrx, the test programs and dev/cuda with nvcc, and the dataset, first)
# Overrides (test/test_gpu_report.sh uses them to check this script without a GPU):
#   TEST_GPU_PLAN=FILE       the checks to run instead of the default list, one a line: NAME|SECONDS|KIND|COMMAND
#                            (KIND: doctest, suite or cmd; COMMAND is evaluated by bash, and may call smoke)
#   NVIDIA_SMI=CMD           what lists the GPUs (default nvidia-smi)
#   TEST_GPU_REPORT=FILE     where the report goes;  TRAIN=BIN  the binary of the smoke run (./train_dbrx)
# A command's status 77 means SKIP; its last "key: ..." line is the report's key number.
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-/usr/bin/python3}
SMI=${NVIDIA_SMI:-nvidia-smi}
REPORT=${TEST_GPU_REPORT:-dev/bench/test_gpu_report.md}
TRAIN=${TRAIN:-./train_dbrx}
RAW=${TEST_GPU_RAW:-dev/bench/gpu_runs/test_gpu}

gpus=$($SMI -L 2>/dev/null | grep -c "^GPU [0-9]")
if [ "${gpus:-0}" = 0 ]; then
    echo "test-gpu: no GPU visible ($SMI -L lists none): nothing ran; run make test-gpu on a GPU machine" >&2
    exit 1
fi
[ "${1:-}" = --gpu-check ] && exit 0
gpu_name=$($SMI -L | sed -nE '1s/^GPU 0: (.*) \(UUID.*$/\1/p')

# --- helpers the plan's commands use
# need_gpus N: SKIP (77) with a key line when fewer than N GPUs are visible
need_gpus() { [ "$gpus" -ge "$1" ] && return 0; echo "key: needs $1 GPUs, $gpus visible"; return 77; }
# smoke [FLAGS...]: dbrx-tiny 20 steps on the GPU (FLAGS appended: later flags win); the loss must fall;
# then PyTorch on its export must reproduce its logits at the dump's default tolerance (BF16: 1e-1)
smoke() {
    local d; d=$(mktemp -d)
    "$TRAIN" --device cuda --model dbrx-tiny --steps 20 --val-every 0 --log "$d/smoke.jsonl" \
        --export-hf "$d/hf" --export-dtype fp32 --dump-logits "$d/logits.st" "$@" || { rm -rf "$d"; return 1; }
    local hf; hf=$($PY dev/hf_logits.py "$d/hf" "$d/logits.st" 2>&1); local hrc=$?
    echo "$hf"
    $PY - "$d/smoke.jsonl" "$hrc" "$hf" <<'PY'; local rc=$?
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
hf_ok, hf = sys.argv[2] == "0", sys.argv[3]
last = r[-5:] if len(r) >= 5 else r
falls = len(r) >= 2 and r[-1]["loss"] < r[0]["loss"]
diff = hf.split("max |torch - train_dbrx| = ")[-1].split(" ")[0] if "max |torch" in hf else "?"
print("key: loss %.3f -> %.3f%s, %.0f tok/s, MFU %.1f%%, hf_logits %s%s" % (
    r[0]["loss"], r[-1]["loss"], "" if falls else " (NOT falling)", statistics.median(x["tok_per_s"] for x in last),
    100 * statistics.median(x["mfu"] for x in last), diff, "" if hf_ok else " (FAILED)"))
sys.exit(0 if falls and hf_ok else 1)
PY
    rm -rf "$d"; return $rc
}
# bench_quick: bench_gpu.sh --quick; the key: attention forward, expert GEMMs / dense, end-to-end MFU
bench_quick() {   # (BENCH_GPU_MODE=--emulated: the same parsing over the emulated builds' table)
    local out; out=$(bash dev/bench/bench_gpu.sh "${BENCH_GPU_MODE:---quick}" 2>&1); local rc=$?
    echo "$out"
    local att ex e2e
    att=$(grep -m1 "forward v4" <<<"$out" | awk -F'|' '{print $3}' | awk '{print $1}')
    ex=$(grep -m1 "expert GEMMs / dense" <<<"$out" | awk -F'|' '{print $3}' | tr -d ' ')
    e2e=$(grep -m1 "end to end, --fp8 off" <<<"$out" | sed -nE 's/^\| ([a-z0-9-]+) end to end.*(MFU [0-9.]+%).*/\1 BF16 \2/p')
    echo "key: attention fwd ${att:-?} TFLOP/s, experts/dense ${ex:-?}, ${e2e:-end to end MFU ?}"
    return $rc
}

default_plan() {
    local san=""; [ -n "${SANITIZER:-}" ] && san="compute-sanitizer --tool memcheck --error-exitcode 1 "
    local t
    for t in test_kernels test_step_cuda test_fp8_cuda test_zero_fp8_cuda test_decode; do
        echo "${t}_gpu|600|doctest|${san}./test/${t}_gpu"
    done
    echo "test_cli.sh|300|suite|BIN=./train_dbrx bash test/test_cli.sh"
    echo "test_guard.sh|300|suite|BIN=./train_dbrx bash test/test_guard.sh"
    echo "test_train.sh|300|suite|need_gpus 2 && BIN=./train_dbrx bash test/test_train.sh"
    echo "smoke: dbrx-tiny 20 steps|180|cmd|smoke"
    echo "bench_gpu.sh --quick|600|cmd|bench_quick"
}

plan=$(if [ -n "${TEST_GPU_PLAN:-}" ]; then cat "$TEST_GPU_PLAN"; else default_plan; fi)
mkdir -p "$RAW"
rows=(); nfail=0; npass=0; i=0
while IFS='|' read -r name limit kind cmd; do
    [ -z "$name" ] && continue
    i=$((i + 1)); log="$RAW/$(printf %02d "$i")_$(printf %s "$name" | tr -c 'A-Za-z0-9_.-' '_').txt"
    if [ -n "${TEST_GPU_DEADLINE:-}" ]; then   # (the lease's end: cut the limit, or skip)
        left=$((TEST_GPU_DEADLINE - $(date +%s)))
        if [ "$left" -lt 5 ]; then
            echo "== $name: SKIP (deadline reached)"; rows+=("| $name | SKIP | 0 | deadline reached |"); continue
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    echo "== $name (limit ${limit} s)"
    t0=$(date +%s.%N)
    # the check in its own shell, under the time limit; this script's functions and variables go with it
    timeout -k 10 "$limit" bash -c "$(declare -f need_gpus smoke bench_quick); gpus=$gpus PY=$PY TRAIN=$TRAIN; $cmd" \
        < /dev/null > "$log" 2>&1
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
    key=$(grep "^key: " "$log" | tail -1 | cut -c6-)
    case "$kind" in
        doctest)
            c=$(grep -m1 -E "^\[doctest\] test cases:" "$log")
            p=$(sed -nE 's/^\[doctest\] test cases: *([0-9]+) \| *([0-9]+) passed.*/\2\/\1 cases passed/p' <<<"$c")
            [ "${p#*/}" = "0 cases passed" ] && p=""
            key=${p:-no test case ran}
            { [ -z "$p" ] || [ "${p%%/*}" = 0 ]; } && [ "$rc" = 0 ] && rc=1 ;;
        suite)
            [ -z "$key" ] && key="$(grep -c '^ok ' "$log") ok, $(grep -c '^FAIL ' "$log") FAIL"
            grep -q '^FAIL ' "$log" && [ "$rc" = 0 ] && rc=1 ;;
    esac
    if [ "$rc" = 77 ]; then verdict=SKIP
    elif [ "$rc" = 0 ]; then verdict=PASS; npass=$((npass + 1))
    else
        verdict=FAIL; nfail=$((nfail + 1))
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then key="time limit ${limit} s reached${key:+; $key}"
        else
            first=$(grep -m1 -E "^FAIL |ERROR|error|Error|FAILED" "$log" | cut -c1-100)
            key="exit $rc${key:+; $key}${first:+; $first}"
        fi
    fi
    echo "   $verdict ($secs s) $key"
    rows+=("| $name | $verdict | $secs | ${key//|//} |")
done <<<"$plan"

if [ "$nfail" = 0 ] && [ "$npass" -gt 0 ]; then verdict_line="GO: $npass passed, 0 failed, $((i - npass)) skipped"
else verdict_line="NO-GO: $nfail of $i failed ($npass passed, $((i - npass - nfail)) skipped)"; fi
{
    echo "# make test-gpu — $gpu_name ($gpus GPU(s)), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| check | result | s | key number |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "$verdict_line"
    echo
    echo "(raw outputs: $RAW/)"
} > "$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT"
echo; cat "$REPORT"
[ "$nfail" = 0 ] && [ "$npass" -gt 0 ]
