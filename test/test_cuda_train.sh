#!/usr/bin/env bash
# test_cuda_train.sh — the CUDA training path of train_dbrx, run end to end on the SIMT emulator
# (train_dbrx_emu: train_dbrx.cu built by g++ -DSIMT_EMULATION), and the device selection:
#   * --device cuda trains dbrx-tiny (2 layers, 2 x 32 tokens) for 4 steps: every step's loss is
#     within 1e-2 (relative) of the CPU backend's on the same data, and the loss falls;
#   * two runs under different random thread schedules write bit-identical logs;
#   * --device auto picks the (emulated) GPU and says so; the CPU-only build refuses --device cuda
#     and the nvcc build without a GPU says no device is visible (exit 2, one line);
#   * out of GPU memory: one line with the memory estimate and what to change (exit 1);
#   * more ranks on a node than it has GPUs: refused with one line naming the fix.
# (Several ranks on the CUDA path, checkpoints and interop there: test/test_zero_gpu.sh.)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-/usr/bin/python3}
export OMP_WAIT_POLICY=passive
small=(--model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --steps 4 --val-every 2 --val-steps 1)

./train_dbrx_emu "${small[@]}" --device cuda --log "$tmp/gpu.jsonl" > "$tmp/gpu.out" 2>&1 || fail "emulated CUDA training: $(tail -3 "$tmp/gpu.out")"
./train_dbrx_cpu "${small[@]}" --device cpu --log "$tmp/cpu.jsonl" > "$tmp/cpu.out" 2>&1 || fail "CPU training: $(tail -3 "$tmp/cpu.out")"
grep -q "^device: cuda:0 SIMT emulator" "$tmp/gpu.out" && pass "--device cuda trains on the (emulated) GPU" || fail "--device cuda: $(head -3 "$tmp/gpu.out")"
$PY - "$tmp/cpu.jsonl" "$tmp/gpu.jsonl" <<'PY' && pass "CUDA path: every step's loss within 1e-2 of the CPU backend's, and falling" || fail "CUDA path losses differ from the CPU's"
import json, sys
cpu, gpu = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
lc = [r["loss"] for r in cpu if "loss" in r]; lg = [r["loss"] for r in gpu if "loss" in r]
vc = [r["val_loss"] for r in cpu if "val_loss" in r]; vg = [r["val_loss"] for r in gpu if "val_loss" in r]
print("   cpu", [round(x, 5) for x in lc], "val", [round(x, 5) for x in vc])
print("   gpu", [round(x, 5) for x in lg], "val", [round(x, 5) for x in vg])
assert len(lc) == len(lg) == 4 and len(vc) == len(vg) == 3
assert all(abs(a - b) / a < 1e-2 for a, b in zip(lc + vc, lg + vg))
assert lg[-1] < lg[0] and vg[-1] < vg[0]
PY

SIMT_SCHEDULE=random:1 ./train_dbrx_emu "${small[@]}" --steps 2 --device cuda --log "$tmp/r1.jsonl" >/dev/null 2>&1
SIMT_SCHEDULE=random:2 ./train_dbrx_emu "${small[@]}" --steps 2 --device cuda --log "$tmp/r2.jsonl" >/dev/null 2>&1
strip() { $PY -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k not in ('ms','tok_per_s','mfu','mfu_foundry','eta_s','rank_busy_ms','max_busy_ms','slowest_rank')}) for l in open(sys.argv[1])]" "$1"; }
if [ -s "$tmp/r1.jsonl" ] && [ "$(strip "$tmp/r1.jsonl")" = "$(strip "$tmp/r2.jsonl")" ]; then pass "two emulated CUDA runs, two thread schedules: bit-identical losses"
else fail "emulated CUDA runs differ between schedules"; fi

out=$(./train_dbrx_emu "${small[@]}" --steps 1 --val-every 0 2>&1)
grep -q "^device: cuda:0 .*(auto: a GPU is visible)" <<<"$out" && pass "--device auto picks the GPU and says so" || fail "--device auto: $(head -2 <<<"$out")"
out=$(./train_dbrx_cpu "${small[@]}" --steps 1 --val-every 0 2>&1)
grep -q "^device: cpu (auto: built without CUDA)" <<<"$out" && pass "--device auto on the CPU-only build picks the CPU and says why" || fail "--device auto (cpu build): $(head -2 <<<"$out")"

expect_exit 2 "CPU-only build refuses --device cuda" ./train_dbrx_cpu --device cuda --steps 1
grep -q "without CUDA" <<<"$LAST_ERR" || fail "the refusal says the build has no CUDA: $LAST_ERR"
if [ -n "${NVCC:-}" ] && ! nvidia-smi >/dev/null 2>&1; then
    expect_exit 2 "nvcc build without a GPU: --device cuda says no device is visible" ./train_dbrx --device cuda --steps 1
fi

expect_exit 1 "out of GPU memory: one clear line" env SIMT_DEVICE_MEMORY=20000000 ./train_dbrx_emu --device cuda --model dbrx-tiny --steps 1
grep -q "out of GPU memory: the run needs .* per GPU .*Lower --batch or --seq" <<<"$LAST_ERR" || fail "the OOM message gives the estimate and the fix: $LAST_ERR"

out=$(SIMT_DEVICES=1 bash dev/mpirun.sh -np 2 ./train_dbrx_emu --device cuda "${small[@]}" 2>&1); rc=$?
if [ "$rc" != 0 ] && grep -q "error: --device cuda: 2 ranks on this node, 1 GPU(s) visible: run one rank per GPU" <<<"$out"; then
    pass "mpirun -np 2 --device cuda on a node with 1 GPU: refused with one line (exit $rc)"
else fail "mpirun -np 2 --device cuda, 1 GPU: exit $rc: $(head -3 <<<"$out")"; fi
