#!/usr/bin/env bash
# test_fp8_cuda.sh — --fp8 on the CUDA training path, end to end on the SIMT emulator
# (train_dbrx_emu --device cuda), against the CPU backend's FP8 emulation:
#   * each recipe trains dbrx-tiny (2 layers, 2 x 32 tokens) for 3 steps: every step's loss within
#     1e-2 (relative) of the CPU's with the same recipe (measured: < 1e-3);
#   * --fp8-log-every 1 writes one "fp8" JSONL line per step with the same tensors, in the same
#     order, as the CPU's, each with amax, amax_rank0, scale and saturated;
#   * the cached FP8 weights (one quantisation per step, --shard-group-size 1) under EP 2: ZeRO-3's losses bit for bit;
#   * bad input, one line and exit 2: a token count that is not a multiple of 16, a bad history.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-/usr/bin/python3}
export OMP_WAIT_POLICY=passive
small=(--model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --steps 3 --val-every 0 --fp8-log-every 1)

for r in delayed current block; do
    ./train_dbrx_emu "${small[@]}" --device cuda --fp8 $r --log "$tmp/gpu_$r.jsonl" > "$tmp/gpu_$r.out" 2>&1 || fail "--fp8 $r on the emulated GPU: $(tail -3 "$tmp/gpu_$r.out")"
    ./train_dbrx_cpu "${small[@]}" --device cpu --fp8 $r --log "$tmp/cpu_$r.jsonl" > "$tmp/cpu_$r.out" 2>&1 || fail "--fp8 $r on the CPU: $(tail -3 "$tmp/cpu_$r.out")"
    grep -q "^fp8: $r scaling on the block GEMMs" "$tmp/gpu_$r.out" || fail "--fp8 $r: the CUDA path does not say it runs FP8: $(head -4 "$tmp/gpu_$r.out")"
    $PY - "$tmp/cpu_$r.jsonl" "$tmp/gpu_$r.jsonl" $r <<'PY' && pass "--fp8 $r on the CUDA path: losses within 1e-2 of the CPU's FP8 emulation, the same FP8 log" || fail "--fp8 $r: the CUDA path differs from the CPU's"
import json, sys
cpu, gpu = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
lc = [r["loss"] for r in cpu if "loss" in r]; lg = [r["loss"] for r in gpu if "loss" in r]
print("   %-7s cpu" % sys.argv[3], [round(x, 5) for x in lc], "gpu", [round(x, 5) for x in lg])
assert len(lc) == len(lg) == 3 and all(abs(a - b) / a < 1e-2 for a, b in zip(lc, lg))
fc = [r["fp8"] for r in cpu if "fp8" in r]; fg = [r["fp8"] for r in gpu if "fp8" in r]
assert len(fc) == len(fg) == 3, (len(fc), len(fg))
for a, b in zip(fc, fg):
    assert list(a) == list(b), "different FP8 tensors"
    for name, v in b.items():
        assert set(v) == {"amax", "amax_rank0", "scale", "saturated"} and v["amax"] > 0 and v["amax"] == v["amax_rank0"], (name, v)
        assert isinstance(v["saturated"], int) and v["saturated"] >= 0 and v["scale"] > 0, (name, v)
print("   %d FP8 tensors logged per step" % len(fg[0]))
PY
done

# the weights quantised once per step (fp8_weight_gpu) where they stay in place: with expert parallelism 2 on data
# parallel ranks (--shard-group-size 1: each rank's own experts cached) the losses of ZeRO-3 (S 2: every use
# quantises the gathered weights), bit for bit; a planted scale error in the cache's copy would show here
f8ep=(--device cuda --model dbrx-tiny --n-layers 2 --seq 32 --val-every 0 --batch 1 --steps 3 --fp8 block --grad-clip 0 --expert-parallel 2)
for S in 1 2; do
    bash dev/mpirun.sh -np 2 ./train_dbrx_emu "${f8ep[@]}" --shard-group-size $S --log "$tmp/ep_s$S.jsonl" > "$tmp/ep_s$S.out" 2>&1 \
        || fail "--fp8 block EP 2, S $S: $(grep -i error "$tmp/ep_s$S.out" | head -2)"
done
l1=$(grep -o '"loss": [0-9.e+-]*' "$tmp/ep_s1.jsonl" | tr '\n' ' '); l2=$(grep -o '"loss": [0-9.e+-]*' "$tmp/ep_s2.jsonl" | tr '\n' ' ')
[ -n "$l1" ] && [ "$(wc -w <<<"$l1")" = 6 ] && [ "$l1" = "$l2" ] \
    && pass "--fp8 block, EP 2: cached FP8 weights (S 1) give ZeRO-3's (S 2) losses bit for bit" || fail "--fp8 block EP 2 cache: $l1 vs $l2"

expect_exit 2 "--fp8 on the GPU with a token count that is not a multiple of 16" ./train_dbrx_emu --device cuda --fp8 current --model dbrx-tiny --n-layers 2 --batch 3 --seq 5 --steps 1
grep -q "multiple of 16" <<<"$LAST_ERR" || fail "the refusal names the rule: $LAST_ERR"
expect_exit 2 "--fp8 delayed with --fp8-amax-history 0" ./train_dbrx_emu --device cuda --fp8 delayed --fp8-amax-history 0 --model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --steps 1
# the widths: every FP8 tensor of the step is then on the fused kernels' shapes (model/dbrx_fp8_cuda.cuh: no other path)
expect_exit 2 "--fp8 on the GPU with an expert width (--ffn-hidden 200) that is not a multiple of 16" ./train_dbrx_emu --device cuda --fp8 block --model dbrx-tiny --n-layers 2 --ffn-hidden 200 --batch 2 --seq 32 --steps 1
grep -q "ffn_hidden (200) .* multiples of 16" <<<"$LAST_ERR" || fail "the refusal names the width and the rule: $LAST_ERR"
# --fp8-gather on one rank (nothing is gathered): it trains, and one note says the flag has no effect
out=$(./train_dbrx_emu --device cuda --fp8 block --fp8-gather --model dbrx-tiny --n-layers 2 --batch 1 --seq 32 --steps 1 --val-every 0 2>&1); rc=$?
[ "$rc" = 0 ] && [ "$(grep -c '^note: --fp8-gather has no effect with --shard-group-size 1' <<<"$out")" = 1 ] \
    && pass "--fp8-gather on one rank: trains, one note that it has no effect" || fail "--fp8-gather on one rank: rc $rc: $(grep -m2 -i 'error\|note' <<<"$out")"
