#!/usr/bin/env bash
# test_gpu_report.sh — dev/test_gpu.sh (make test-gpu) without a GPU: the device check, and the runner and
# its report over a plan of emulated commands (TEST_GPU_PLAN, a fake nvidia-smi that lists one GPU):
#   * no GPU (nvidia-smi missing, or listing none): one line, exit 1, nothing run, no report written;
#   * a plan with a passing doctest program (test_simt, the emulator), one that runs no test case, a shell
#     suite with a FAIL line, a check past its time limit and one that needs 2 GPUs: each row's verdict
#     (PASS, FAIL, FAIL, FAIL with the limit named and stopped within it, SKIP), the run goes past each
#     failure, NO-GO with the counts, exit 1, the same table in the report file;
#   * the smoke run on the emulated GPU (train_dbrx_emu at a small shape): PASS with the loss, tok/s, MFU and
#     dev/hf_logits.py at the dump's BF16 tolerance in its key; with it and the doctest program alone: GO, exit 0.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive TEST_GPU_RAW=$tmp/raw TEST_GPU_REPORT=$tmp/report.md
if [ ! -x ./train_dbrx_emu ] || [ ! -x ./test/test_simt ]; then echo "skipped: test_gpu_report.sh (train_dbrx_emu, test/test_simt not built)"; exit 0; fi

# --- no GPU
for smi in /nonexistent/nvidia-smi true; do
    out=$(NVIDIA_SMI=$smi bash dev/test_gpu.sh 2>&1); rc=$?
    if [ "$rc" = 1 ] && [ "$(grep -c . <<<"$out")" = 1 ] && grep -q "^test-gpu: no GPU visible" <<<"$out" && [ ! -e "$tmp/report.md" ]; then
        pass "no GPU ($smi): one line, exit 1, nothing run ($out)"
    else fail "no GPU ($smi): exit $rc: $out"; fi
done
out=$(NVIDIA_SMI=true bash dev/test_gpu.sh --gpu-check 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "no GPU visible" <<<"$out" && pass "--gpu-check without a GPU: exit 1 (make test-gpu stops before building)" || fail "--gpu-check: exit $rc: $out"

# --- a fake nvidia-smi with one GPU, and a plan of emulated checks
printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-test)"\n' > "$tmp/smi"; chmod +x "$tmp/smi"
export NVIDIA_SMI=$tmp/smi
SMOKE="smoke --n-layers 2 --d-model 64 --n-heads 2 --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64 --seq 32 --batch 2 --steps 8 --lr 3e-3"
cat > "$tmp/plan" <<EOF
simt warp ops|120|doctest|./test/test_simt -tc='warp shuffles*'
no cases|60|doctest|./test/test_simt -tc='no such case'
suite with a failure|60|suite|printf 'ok   one\nFAIL two: planted\nok   three\n'
too slow|2|cmd|sleep 60
two GPUs|60|cmd|need_gpus 2 && echo unreachable
EOF
t0=$(date +%s)
out=$(TEST_GPU_PLAN=$tmp/plan bash dev/test_gpu.sh 2>&1); rc=$?
dt=$(( $(date +%s) - t0 ))
row() { grep "^| $1 |" <<<"$out"; }
if [ "$rc" = 1 ] && row "simt warp ops" | grep -q "| PASS | [0-9]* | 1/1 cases passed |" && row "no cases" | grep -q "| FAIL | .* no test case ran" \
    && row "suite with a failure" | grep -q "| FAIL | .*2 ok, 1 FAIL; FAIL two: planted" && row "too slow" | grep -q "| FAIL | [2-4] | time limit 2 s reached" \
    && row "two GPUs" | grep -q "| SKIP | .* | needs 2 GPUs, 1 visible |" && grep -q "^NO-GO: 3 of 5 failed (1 passed, 1 skipped)$" <<<"$out" \
    && grep -q "^# make test-gpu — NVIDIA H100 80GB HBM3 (1 GPU(s))" "$tmp/report.md" && [ "$dt" -lt 60 ] \
    && diff <(grep "^|" "$tmp/report.md") <(grep "^|" <<<"$out") > /dev/null; then
    pass "a plan with 1 pass, 3 failures (no test case, a FAIL line, past the time limit) and a skip: each row right, NO-GO, exit 1, the same table in the report (${dt} s)"
else fail "the NO-GO plan: exit $rc after ${dt} s: $(grep -E '^\||GO' <<<"$out" | tr '\n' ' ' | cut -c1-600)"; fi

# --- the smoke run on the emulated GPU, and a GO
printf 'simt warp ops|120|doctest|./test/test_simt -tc=%s\nsmoke|300|cmd|TRAIN=./train_dbrx_emu %s\n' "'warp shuffles*'" "$SMOKE" > "$tmp/plan2"
rm -f "$tmp/report.md"
out=$(TEST_GPU_PLAN=$tmp/plan2 bash dev/test_gpu.sh 2>&1); rc=$?
if [ "$rc" = 0 ] && row smoke | grep -qE "\| PASS \| [0-9]+ \| loss [0-9.]+ -> [0-9.]+, [0-9]+ tok/s, MFU [0-9.]+%, hf_logits [0-9.e+-]+ \|" \
    && grep -q "tol 1.0e-01 (bf16 dump)" "$tmp/raw/02_smoke.txt" && grep -q "^GO: 2 passed, 0 failed, 0 skipped$" "$tmp/report.md"; then
    pass "the smoke run on the emulated GPU: $(row smoke | cut -d'|' -f5 | sed 's/^ //;s/ $//'); GO, exit 0"
else fail "the GO plan: exit $rc: $(grep -E '^\||GO' <<<"$out" | tr '\n' ' ' | cut -c1-400); $(tail -3 "$tmp/raw/02_smoke.txt" 2>/dev/null)"; fi

# --- a lease's deadline (TEST_GPU_DEADLINE): a check's limit is cut to it, and the checks after it are SKIPs
printf 'cut|60|cmd|sleep 30\nafter|60|cmd|echo unreachable\n' > "$tmp/plan3"
t0=$(date +%s)
out=$(TEST_GPU_DEADLINE=$((t0 + 8)) TEST_GPU_PLAN=$tmp/plan3 bash dev/test_gpu.sh 2>&1); rc=$?
dt=$(( $(date +%s) - t0 ))
if [ "$rc" = 1 ] && row cut | grep -qE "\| FAIL \| [0-9]+ \| time limit [5-8] s reached" && row after | grep -q "| SKIP | 0 | deadline reached |" \
    && [ "$dt" -lt 25 ]; then
    pass "TEST_GPU_DEADLINE: the running check cut to the deadline, the next one a SKIP (${dt} s)"
else fail "TEST_GPU_DEADLINE: exit $rc after ${dt} s: $(grep -E '^\||GO' <<<"$out" | tr '\n' ' ' | cut -c1-400)"; fi
