#!/usr/bin/env bash
# test_cuda_train.sh — the CUDA training path of train_dbrx, run end to end on the SIMT emulator
# (train_dbrx_emu: train_dbrx.cu built by g++ -DSIMT_EMULATION), and the device selection:
#   * --device cuda trains dbrx-tiny (2 layers, 2 x 32 tokens) for 4 steps: every step's loss is
#     within 1e-2 (relative) of the CPU backend's on the same data, and the loss falls;
#   * two runs under different random thread schedules write bit-identical logs;
#   * --adam-moments bf16 on both backends: a resume continues bit for bit, GPU near CPU, not the FP32 moments' run;
#   * --optimizer lion (LionW) on both backends, FP32 and BF16 m: a resume continues bit for bit, GPU near CPU, not
#     AdamW's run; its checkpoint holds master and m; AdamW refuses to resume it (one line), --eval-only reads its weights;
#     ZeRO-3 over 2 ranks matches one process and its checkpoint resumes on one;
#   * --device auto picks the (emulated) GPU and says so; the CPU-only build refuses --device cuda
#     and the nvcc build without a GPU says no device is visible (exit 2, one line);
#   * out of GPU memory: one line with the memory estimate and what to change (exit 1); a start-up cudaMalloc that fails
#     although the estimate fitted (SIMT_MALLOC_FAIL: the first, a middle one, a late one): one line, exit 1;
#   * other GPUs (SIMT_SM 80, 89): FP8, block scaling and the Hopper kernels refused in one line; --attention-bwd auto
#     keeps the mma.sync backward off Hopper, with the wgmma pair's losses;
#   * the GPU of each rank under mpirun: the node-local rank with every GPU visible, GPU 0 with one GPU
#     per rank (CUDA_VISIBLE_DEVICES set); more ranks than GPUs, or the node's only GPU unbound: refused
#     with one line naming the fix.
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

# --adam-moments bf16 (model/adamw.cuh): on each backend 4 steps with the moments in BF16, and 2 + save + stop + resume + 2
# (the checkpoint keeps FP32 moments, which hold the BF16 values exactly): bit-identical losses; the GPU's within 1e-2
# of the CPU's as above; and not the FP32-moment run's losses (the flag takes effect), though within 1e-2 of them
am=(--model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --steps 4 --val-every 0 --adam-moments bf16)
for b in cpu emu; do
    dev=cpu; [ "$b" = emu ] && dev=cuda
    ./train_dbrx_$b "${am[@]}" --device $dev --log "$tmp/am_$b.jsonl" > "$tmp/am_$b.out" 2>&1 || fail "$b --adam-moments bf16: $(tail -2 "$tmp/am_$b.out")"
    ./train_dbrx_$b "${am[@]}" --device $dev --ckpt-dir "$tmp/amck_$b" --stop-after 2 --log "$tmp/amh_$b.jsonl" > /dev/null 2>&1
    ./train_dbrx_$b "${am[@]}" --device $dev --ckpt-dir "$tmp/amck_$b" --resume auto --log "$tmp/amh_$b.jsonl" > "$tmp/amh_$b.out" 2>&1
    ./train_dbrx_$b "${am[@]}" --device $dev --adam-moments fp32 --log "$tmp/am32_$b.jsonl" > /dev/null 2>&1
done
grep -q '"moments": "bf16"' "$tmp/amck_emu/step_00000002/manifest.json" 2>/dev/null || fail "--adam-moments bf16: the checkpoint's manifest does not say \"moments\": \"bf16\""
$PY - "$tmp" <<'PY' && pass "--adam-moments bf16: 4 steps = 2 + save + resume + 2 bit for bit (CPU and GPU), GPU within 1e-2 of CPU, not the FP32 moments' losses" || fail "--adam-moments bf16 (see above)"
import json, os, sys
t = sys.argv[1]
L = lambda n: [json.loads(l)["loss"] for l in open(os.path.join(t, n + ".jsonl")) if '"loss"' in l]
for b in ("cpu", "emu"):
    a, h, f = L("am_" + b), L("amh_" + b), L("am32_" + b)
    print("   %s bf16 moments %s, resumed %s, fp32 moments %s" % (b, [round(x, 6) for x in a], [round(x, 6) for x in h], [round(x, 6) for x in f]))
    assert len(a) == 4 and a == h, (b, a, h)
    assert len(f) == 4 and f != a and all(abs(x - y) / x < 1e-2 for x, y in zip(f, a)), (b, f, a)
assert all(abs(x - y) / x < 1e-2 for x, y in zip(L("am_cpu"), L("am_emu")))
PY

# --optimizer lion (model/adamw.cuh): as --adam-moments bf16 above, on each backend, with m in FP32 and in BF16: 4 steps
# = 2 + save + stop + resume + 2 bit for bit; the GPU's losses within 1e-2 of the CPU's; not AdamW's (the flag takes effect).
# The checkpoint: optimizer.kind "lion", arrays master and lion_m, shard files of 2 arrays; resumed by an AdamW run:
# refused in one line (exit 2); read by --eval-only without --optimizer (the weights alone): the validation loss of
# the Lion run's step 2, to 1e-6.
li=(--model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --steps 4 --val-every 0 --optimizer lion --lr 6e-4)
for b in cpu emu; do
    dev=cpu; [ "$b" = emu ] && dev=cuda
    for mo in fp32 bf16; do
        ./train_dbrx_$b "${li[@]}" --adam-moments $mo --device $dev --log "$tmp/li_${b}_$mo.jsonl" > "$tmp/li_$b.out" 2>&1 \
            || fail "$b --optimizer lion --adam-moments $mo: $(tail -2 "$tmp/li_$b.out")"
        ./train_dbrx_$b "${li[@]}" --adam-moments $mo --device $dev --ckpt-dir "$tmp/lick_${b}_$mo" --stop-after 2 --val-every 2 \
            --val-steps 1 --log "$tmp/lih_${b}_$mo.jsonl" > /dev/null 2>&1
        ./train_dbrx_$b "${li[@]}" --adam-moments $mo --device $dev --ckpt-dir "$tmp/lick_${b}_$mo" --resume auto \
            --log "$tmp/lih_${b}_$mo.jsonl" > /dev/null 2>&1
    done
    ./train_dbrx_$b "${li[@]}" --optimizer adamw --lr 2e-3 --device $dev --log "$tmp/liadam_$b.jsonl" > /dev/null 2>&1
done
ck=$tmp/lick_emu_fp32/step_00000002
grep -q '"kind": "lion"' "$ck/manifest.json" 2>/dev/null && grep -q '"arrays": \["master", "lion_m"\]' "$ck/manifest.json" \
    || fail "--optimizer lion: the checkpoint's manifest does not say kind lion, arrays master and lion_m"
$PY - "$tmp" <<'PY' && pass "--optimizer lion: 4 steps = 2 + save + resume + 2 bit for bit (CPU and GPU, m in FP32 and BF16), GPU within 1e-2 of CPU, not AdamW's losses; shard files of 2 arrays" || fail "--optimizer lion (see above)"
import json, os, sys
t = sys.argv[1]
L = lambda n: [json.loads(l)["loss"] for l in open(os.path.join(t, n + ".jsonl")) if '"loss"' in l]
for b in ("cpu", "emu"):
    for mo in ("fp32", "bf16"):
        a, h = L("li_%s_%s" % (b, mo)), L("lih_%s_%s" % (b, mo))
        print("   %s lion m %s %s, resumed %s" % (b, mo, [round(x, 6) for x in a], [round(x, 6) for x in h]))
        assert len(a) == 4 and a == h, (b, mo, a, h)
    f = L("liadam_" + b)
    assert len(f) == 4 and f[1:] != L("li_%s_fp32" % b)[1:], (b, f)
    assert L("li_%s_fp32" % b) != L("li_%s_bf16" % b), b
for mo in ("fp32", "bf16"):
    assert all(abs(x - y) / x < 1e-2 for x, y in zip(L("li_cpu_" + mo), L("li_emu_" + mo)))
# the shard file: 2 arrays where AdamW's (the --adam-moments run above, the same model and one rank) holds 3
h = json.load(open(os.path.join(t, "lick_emu_fp32", "step_00000002", "manifest.json")))["topology"]["header_bytes"]
size = lambda d: os.path.getsize(os.path.join(t, d, "step_00000002", "shard_00000.bin")) - h
print("   shard file payload: lion %d bytes, adamw %d" % (size("lick_emu_fp32"), size("amck_emu")))
assert size("lick_emu_fp32") * 3 == size("amck_emu") * 2
PY
expect_exit 2 "an AdamW run refuses to resume LionW's checkpoint, in one line" ./train_dbrx_emu "${li[@]}" --optimizer adamw --device cuda \
    --ckpt-dir "$tmp/lick_emu_fp32" --resume "$ck"
grep -q "holds lion's state: --optimizer adamw cannot continue it" <<<"$LAST_ERR" || fail "the refusal names both optimizers: $LAST_ERR"
./train_dbrx_emu "${li[@]}" --device cuda --val-every 2 --val-steps 1 --log "$tmp/liv.jsonl" > /dev/null 2>&1   # (the run's step-2 val_loss)
out=$(./train_dbrx_emu --device cuda --model dbrx-tiny --n-layers 2 --batch 2 --seq 32 --eval-only --resume "$ck" --val-steps 1 2>&1)
$PY - "$tmp/liv.jsonl" "$out" <<'PY' && pass "--eval-only reads a LionW checkpoint's weights without --optimizer: step 2's validation loss" || fail "--eval-only of a LionW checkpoint: $(tail -2 <<<"$out")"
import json, re, sys
want = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if '"val_loss"' in l and json.loads(l)["step"] == 2][0]
got = [float(x) for x in re.findall(r"val_loss ([0-9.]+)", sys.argv[2])]
print("   the run's step-2 val_loss %.6f, --eval-only's %s" % (want, got))
assert got and abs(got[0] - want) < 1e-6, (got, want)
PY
# ZeRO-3 on the emulated GPUs: 2 ranks (--shard-group-size 2) match one process (each rank half the batch), and the
# 2-rank checkpoint (each shard file half of master and m) resumes on one rank: its first loss the 2-rank run's step 3
lz=(--model dbrx-tiny --n-layers 2 --seq 32 --steps 4 --val-every 0 --optimizer lion --lr 6e-4 --device cuda)
OMP_NUM_THREADS=1 ./train_dbrx_emu "${lz[@]}" --batch 4 --log "$tmp/lz1.jsonl" > /dev/null 2>&1
OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 ./train_dbrx_emu "${lz[@]}" --batch 2 --shard-group-size 2 --log "$tmp/lz2.jsonl" > "$tmp/lz2.out" 2>&1
OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 ./train_dbrx_emu "${lz[@]}" --batch 2 --shard-group-size 2 --ckpt-dir "$tmp/lzck" --stop-after 2 > /dev/null 2>&1
OMP_NUM_THREADS=1 ./train_dbrx_emu "${lz[@]}" --batch 4 --ckpt-dir "$tmp/lzck" --resume auto --log "$tmp/lzr.jsonl" > "$tmp/lzr.out" 2>&1
$PY - "$tmp" <<'PY' && pass "--optimizer lion, ZeRO-3 over 2 emulated GPUs: one process's losses (1e-2), its checkpoint resumed on one GPU (step 3 to 1e-5)" || fail "--optimizer lion under ZeRO-3: $(tail -2 "$tmp/lz2.out" "$tmp/lzr.out")"
import json, os, sys
t = sys.argv[1]
L = lambda n: [json.loads(l)["loss"] for l in open(os.path.join(t, n + ".jsonl")) if '"loss"' in l]
a, b, r = L("lz1"), L("lz2"), L("lzr")
print("   1 GPU %s\n   2 GPUs %s\n   resumed on 1 %s" % (a, b, r))
assert len(a) == len(b) == 4 and all(abs(x - y) / x < 1e-2 for x, y in zip(a, b)), (a, b)
assert len(r) == 2 and abs(r[0] - b[2]) < 1e-5 and abs(r[1] - b[3]) / b[3] < 1e-2, (r, b)
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
# an allocation that fails although the estimate fitted (another process on the GPU, fragmentation): the emulator's
# SIMT_MALLOC_FAIL=N fails the N-th cudaMalloc; the first, one in the middle and one late in start-up (A: the start-up
# allocations, pinned host buffers among them) each give one "out of GPU memory" line and exit 1 (the model's buffers:
# the estimate and why; any other: the file, line and size)
A=$(SIMT_STEP_COUNTERS=1 ./train_dbrx_emu --device cuda --model dbrx-tiny --n-layers 2 --batch 1 --seq 32 --steps 1 --val-every 0 2>&1 \
    | sed -nE 's/^simt counters: .* allocs ([0-9]+) frees.*/\1/p' | head -1)
if [ -n "$A" ] && [ "$A" -ge 10 ]; then
    for n in 1 $((A / 2)) $((A * 9 / 10)); do
        expect_exit 1 "cudaMalloc $n of $A at start-up fails" env SIMT_MALLOC_FAIL=$n ./train_dbrx_emu --device cuda --model dbrx-tiny --n-layers 2 --batch 1 --seq 32 --steps 1 --val-every 0
        [ "$(grep -c . <<<"$LAST_ERR")" = 1 ] && grep -Eq "out of GPU memory: the run needs .*, yet one of the model's allocations failed|^error at [a-z_/]+\.cuh?:[0-9]+: out of GPU memory allocating [0-9]+ bytes \([0-9.]+ MiB; " <<<"$LAST_ERR" \
            || fail "cudaMalloc $n of $A: not one clear line: $LAST_ERR"
    done
else fail "SIMT_STEP_COUNTERS: no start-up allocation count ($A)"; fi

# other GPUs (the emulator's SIMT_SM reports their compute capability): FP8 refused before Ada, block scaling and the
# Hopper kernels (grouped experts, the wgmma attention backward) off Hopper, each in one line, exit 2; on an sm_89 GPU
# --attention-bwd auto keeps the mma.sync backward (no "attention: backward on wgmma" line at head_dim 128), whose
# losses are the wgmma pair's bit for bit (the sm_90 run's)
one_step=(./train_dbrx_emu --device cuda --model dbrx-tiny --n-layers 2 --batch 1 --seq 32 --steps 1 --val-every 0)
expect_exit 2 "--fp8 delayed on an sm_80 GPU" env SIMT_SM=80 "${one_step[@]}" --fp8 delayed
grep -q "need an sm_89 or newer GPU .* this one is sm_80" <<<"$LAST_ERR" || fail "the refusal names the GPU: $LAST_ERR"
expect_exit 2 "--fp8 block on an sm_89 GPU" env SIMT_SM=89 "${one_step[@]}" --fp8 block
grep -q "runs on sm_90 (Hopper); this GPU is sm_89: use --fp8 current or --fp8 delayed" <<<"$LAST_ERR" || fail "the refusal says what to use: $LAST_ERR"
expect_exit 2 "--moe-gemm grouped on an sm_89 GPU" env SIMT_SM=89 "${one_step[@]}" --ffn-hidden 128 --moe-gemm grouped
expect_exit 2 "--attention-bwd wgmma on an sm_89 GPU" env SIMT_SM=89 "${one_step[@]}" --attention-bwd wgmma
hd128=(--device cuda --model dbrx-tiny --n-layers 2 --n-heads 1 --kv-heads 1 --batch 1 --seq 32 --steps 2 --val-every 0)
o89=$(SIMT_SM=89 ./train_dbrx_emu "${hd128[@]}" 2>&1); r89=$?
o90=$(./train_dbrx_emu "${hd128[@]}" 2>&1); r90=$?
l89=$(grep -o "loss [0-9.]*" <<<"$o89" | tr '\n' ' '); l90=$(grep -o "loss [0-9.]*" <<<"$o90" | tr '\n' ' ')
[ "$r89" = 0 ] && [ "$r90" = 0 ] && ! grep -q "backward on wgmma" <<<"$o89" && grep -q "backward on wgmma" <<<"$o90" && [ -n "$l89" ] && [ "$l89" = "$l90" ] \
    && pass "--attention-bwd auto: mma.sync on sm_89, wgmma on sm_90, the same losses ($l89)" \
    || fail "--attention-bwd auto on sm_89 / sm_90: rc $r89 / $r90, losses '$l89' / '$l90'"

# the GPU of each rank (parallel/gpu_select.h; every case of the rule: test/test_gpu_select.cpp). The emulated
# node has SIMT_DEVICES GPUs (default 8); CUDA_VISIBLE_DEVICES is only read, as srun would have set it
one=(--device cuda "${small[@]}" --steps 1 --val-every 0)
out=$(env -u CUDA_VISIBLE_DEVICES bash dev/mpirun.sh -np 2 ./train_dbrx_emu "${one[@]}" 2>&1); rc=$?
if [ "$rc" = 0 ] && grep -q "^gpu: rank 1: cuda:1 = node-local rank 1 of 2 (from mpirun" <<<"$out" && grep -q "^zero: rank 1 (cuda:1)" <<<"$out"; then
    pass "mpirun -np 2, 8 GPUs visible: rank 1 trains on cuda:1, its node-local rank"
else fail "mpirun -np 2, 8 GPUs: exit $rc: $(grep -E '^gpu:|error' <<<"$out" | head -3)"; fi
out=$(SIMT_DEVICES=1 CUDA_VISIBLE_DEVICES=0 bash dev/mpirun.sh -np 2 ./train_dbrx_emu "${one[@]}" 2>&1); rc=$?
if [ "$rc" = 0 ] && [ "$(grep -c "^gpu: rank [01]: cuda:0, the one GPU this rank sees (CUDA_VISIBLE_DEVICES=0" <<<"$out")" = 2 ]; then
    pass "mpirun -np 2, one GPU per rank (CUDA_VISIBLE_DEVICES set, as srun --gpus-per-task=1 sets it): both train on cuda:0"
else fail "mpirun -np 2, one GPU per rank: exit $rc: $(grep -E '^gpu:|error' <<<"$out" | head -3)"; fi
out=$(SIMT_DEVICES=1 env -u CUDA_VISIBLE_DEVICES bash dev/mpirun.sh -np 2 ./train_dbrx_emu "${one[@]}" 2>&1); rc=$?
if [ "$rc" != 0 ] && grep -q "error: --device cuda: 2 ranks on this node see the same single GPU (CUDA_VISIBLE_DEVICES unset): run one rank per GPU" <<<"$out"; then
    pass "mpirun -np 2 on a node with 1 GPU, nothing binding it: refused with one line (exit $rc)"
else fail "mpirun -np 2, 1 GPU, CUDA_VISIBLE_DEVICES unset: exit $rc: $(head -3 <<<"$out")"; fi
out=$(SIMT_DEVICES=2 CUDA_VISIBLE_DEVICES=0,1 bash dev/mpirun.sh -np 3 ./train_dbrx_emu "${one[@]}" 2>&1); rc=$?
if [ "$rc" != 0 ] && grep -q "error: --device cuda: 3 ranks on this node, 2 GPUs visible to each (CUDA_VISIBLE_DEVICES=0,1)" <<<"$out"; then
    pass "mpirun -np 3 on 2 GPUs: refused with one line (exit $rc)"
else fail "mpirun -np 3, 2 GPUs: exit $rc: $(head -3 <<<"$out")"; fi

# The step budget in the training loop (model/CUDA.md, "Host round trips in one step"): SIMT_STEP_COUNTERS=1
# prints the emulator's counters at every dbrx_sync (before and after each step). Per step of G micro-batches,
# L layers, E experts, N tokens, BF16, one rank: syncs G (L + 1) + 2 (the offsets per layer and the forward's
# one read; the norm's read; the step's closing sync), kernels G (8 + 25 L) + 3 + L (the first backward's experts_zero_empty_kernel), H2D 4 G (5 N + 1) bytes in 2 G copies,
# D2H G (4 L (E + 1) + 4 (2 + L (E + 1))) + 8 bytes, no heuristic query after the first step, no device (or
# pinned host) allocation or free after the first step. Negative controls: DBRX_DEBUG_PLANT=step_sync (one more
# sync per layer) must break it; the counters before step 1 must have seen the model's allocations.
budget() {   # budget NAME E L G [env...]: exit 0 iff every step after the first is within the budget
    local name=$1 E=$2 L=$3 G=$4; shift 4
    env SIMT_STEP_COUNTERS=1 "$@" ./train_dbrx_emu --device cuda --model dbrx-tiny --n-layers "$L" --experts "$E" --top-k 2 --batch 2 \
        --seq 32 --steps 3 --val-every 0 --grad-accum "$G" 2>&1 | grep "^simt counters" > "$tmp/budget_$name.txt"
    $PY - "$tmp/budget_$name.txt" "$name" "$E" "$L" "$G" <<'PY'
import re, sys
f, name, E, L, G = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
N = 64
rows = [list(map(int, re.findall(r"(?<![a-z])\d+", l))) for l in open(f)]   # (not the 2 of h2d, d2h)
steps = rows[1::2]   # every second line closes a step
want = [G * (L + 1) + 2, G * (8 + 25 * L) + 3 + L, None, 4 * G * (5 * N + 1), 2 * G, G * (4 * L * (E + 1) + 4 * (2 + L * (E + 1))) + 8,
        G * (L + 1) + 1, 0, 0, 0]
names = ["syncs", "kernels", "gemms", "h2d bytes", "h2d copies", "d2h bytes", "d2h copies", "heuristic queries", "allocations", "frees"]
bad = []
assert len(steps) == 3, "%d step lines" % len(steps)
assert steps[0][7] > 0, "the first step made no plan"
assert rows[0][8] > 0, "the counters saw no allocation before step 1"   # (they count: the model's buffers)
for s, r in enumerate(steps[1:], 2):
    for i, w in enumerate(want):
        if w is not None and r[i] != w: bad.append("step %d: %s %d, budget %d" % (s, names[i], r[i], w))
print("   %s: step 3: syncs %d, kernels %d, GEMMs %d, H2D %d B, D2H %d B, heuristic queries %d, allocations %d, frees %d (before step 1: %d allocations)" % (
    name, *[steps[2][i] for i in (0, 1, 2, 3, 5, 7, 8, 9)], rows[0][8]))
if bad: print("   " + "; ".join(bad[:3]))
sys.exit(1 if bad else 0)
PY
}
budget e4 4 2 2 && budget e8 8 2 2 && budget l3 4 3 1 && pass "training loop: syncs, kernels, copies per step within the budget (E 4 and 8, L 2 and 3, grad-accum 2 and 1), no heuristic query, allocation or free after step 1" \
    || fail "training loop: the step budget"
budget planted 4 2 2 DBRX_DEBUG_PLANT=step_sync && fail "a planted sync per layer went unnoticed by the step budget" \
    || pass "negative control: a planted sync per layer breaks the step budget"

# No device allocation or free in a step after the first, on every rank of ZeRO-3 np 2 and of expert parallel 2
# (parallel/expert_parallel_cuda.cuh: every buffer planned at start-up for --ep-capacity-factor's rows), also under a
# forced extreme imbalance (DBRX_DEBUG_ROUTE_FIRST: every token to EP rank 0's experts) at the dropless bound (a planned
# bound too small for the routing grows the buffers in the step that needs it: test_ep_grow.sh).
SMALL=(--device cuda --model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 2 --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64
       --seq 32 --batch 1 --val-every 0 --steps 3)
no_alloc() {   # no_alloc NAME [env...] -- [flags...]: exit 0 iff neither rank allocates or frees after step 1 (steps 2, 3)
    local name=$1 envs=(); shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    env SIMT_STEP_COUNTERS=1 "${envs[@]}" timeout 300 bash dev/mpirun.sh --tag-output -np 2 ./train_dbrx_emu "${SMALL[@]}" "$@" \
        > "$tmp/alloc_$name.txt" 2>&1 || { echo "   $name: exit $?: $(grep -m1 error "$tmp/alloc_$name.txt")"; return 1; }
    $PY - "$tmp/alloc_$name.txt" "$name" <<'PY'
import re, sys
f, name = sys.argv[1], sys.argv[2]
bad, said = [], []
for r in (0, 1):
    rows = [list(map(int, re.findall(r"(?<![a-z])\d+", l.split("simt counters:")[1])))
            for l in open(f) if l.startswith("[1,%d]" % r) and "simt counters:" in l]
    if len(rows) != 6: bad.append("rank %d: %d counter lines, not 6" % (r, len(rows))); continue
    if rows[0][8] == 0: bad.append("rank %d: the counters saw no allocation before step 1" % r)
    for i, row in enumerate(rows[2:], 2):   # (line 0: start-up; 1: step 1; 2: between steps 1 and 2; 3: step 2; 4; 5: step 3)
        if row[8] or row[9]: bad.append("rank %d: counter line %d: %d allocations, %d frees" % (r, i, row[8], row[9]))
    said.append("rank %d: %d allocations before step 1, %d in step 1, 0 after" % (r, rows[0][8], rows[1][8]))
print("   %s: %s" % (name, "; ".join(bad) if bad else "; ".join(said)))
sys.exit(1 if bad else 0)
PY
}
no_alloc zero3 -- --shard-group-size 2 && pass "ZeRO-3 np 2: no device allocation or free in steps 2 and 3 on either rank" || fail "ZeRO-3 np 2 allocates in a step"
no_alloc ep2 -- --expert-parallel 2 && pass "EP 2 (ZeRO-3 np 2): no device allocation or free in steps 2 and 3 on either rank" || fail "EP 2 allocates in a step"
no_alloc ep2_fp8 -- --expert-parallel 2 --fp8 block && no_alloc ep2_fp8_imbalance DBRX_DEBUG_ROUTE_FIRST=1 -- --expert-parallel 2 --fp8 block --ep-capacity-factor 0 \
    && pass "EP 2 --fp8 block (the padded rows' FP8 scratch), also with every token to rank 0's experts at the dropless bound: no allocation or free in steps 2 and 3" \
    || fail "EP 2 --fp8 block allocates in a step"
planted=$(no_alloc ep2_planted DBRX_DEBUG_PLANT=ep_regrow -- --expert-parallel 2); rc=$?; echo "$planted"
if [ "$rc" != 0 ] && grep -q "rank 0: counter line 3: 1 allocations, 1 frees" <<<"$planted" && grep -q "rank 1: counter line 5: 1 allocations, 1 frees" <<<"$planted"; then
    pass "negative control: an EP buffer freed and allocated again in every step (DBRX_DEBUG_PLANT=ep_regrow) is counted in steps 2 and 3 on both ranks"
else fail "an EP buffer freed and allocated in every step went unnoticed (exit $rc)"; fi
if no_alloc ep2_imbalance DBRX_DEBUG_ROUTE_FIRST=1 -- --expert-parallel 2 --ep-capacity-factor 0 \
        && grep -q "ep recv 2.00x" "$tmp/alloc_ep2_imbalance.txt" && grep -q "ep: rank 0 sent .* 0 rows out, 384 rows in" "$tmp/alloc_ep2_imbalance.txt"; then
    pass "EP 2, every token to rank 0's experts, --ep-capacity-factor 0 (the dropless bound, 128 rows): 3 steps, rank 0 took all 384 rows, no allocation after step 1"
else fail "EP 2 forced imbalance at the dropless bound: $(grep -m1 error "$tmp/alloc_ep2_imbalance.txt")"; fi

# DBRX_DEBUG_ROUTE_BALANCED (benchmarks: the step-time model's balanced routing; a router collapsed at initialisation, as
# dbrx-1b's on the default data, gives the expert GEMMs other shapes): token t to experts (k t + j) mod E on both
# backends, so every expert takes N k / E rows: imbalance 1.00 at every step, the load-balancing loss at its minimum
# w_lb = 0.05 (sum_e c_e P_e = N k / E), the CPU's and the emulated GPU's losses agree; with ROUTE_FIRST refused
BAL=(--model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 2 --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64 --seq 32 --batch 2
     --val-every 0 --steps 3)
DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx_cpu --device cpu "${BAL[@]}" --log "$tmp/bal_cpu.jsonl" > "$tmp/bal_cpu.out" 2>&1
DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx_emu --device cuda "${BAL[@]}" --log "$tmp/bal_gpu.jsonl" > "$tmp/bal_gpu.out" 2>&1
./train_dbrx_cpu --device cpu "${BAL[@]}" > "$tmp/bal_off.out" 2>&1
if $PY - "$tmp/bal_cpu.jsonl" "$tmp/bal_gpu.jsonl" "$tmp/bal_off.out" <<'PY'
import json, re, sys
runs = [[json.loads(l) for l in open(f) if '"step"' in l and '"loss"' in l] for f in sys.argv[1:3]]
off = [float(x) for x in re.findall(r"\| imb ([0-9.]+) \|", open(sys.argv[3]).read())]
ok = all(len(r) == 3 for r in runs) and len(off) == 3
for r in runs:
    for s in r:
        ok &= abs(float(s["imbalance"]) - 1.0) < 1e-9 and abs(s["lbl"] - 0.05) < 1e-6
for a, b in zip(*runs):
    ok &= abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"])
ok &= min(off) > 1.05   # (the router's own routing of the same run is not balanced: the hook did it)
print("   losses CPU %s, GPU %s; imbalance without the hook %s" % ([round(s["loss"], 6) for s in runs[0]], [round(s["loss"], 6) for s in runs[1]], off))
sys.exit(0 if ok else 1)
PY
then pass "DBRX_DEBUG_ROUTE_BALANCED: every expert N k / E rows on the CPU and the emulated GPU (imbalance 1.00, LBL 0.05 at every step), their losses within 1e-4; without the hook the router's own routing is not balanced"
else fail "DBRX_DEBUG_ROUTE_BALANCED: $(tail -2 "$tmp/bal_gpu.out")"; fi
out=$(DBRX_DEBUG_ROUTE_BALANCED=1 DBRX_DEBUG_ROUTE_FIRST=1 ./train_dbrx_cpu --device cpu "${BAL[@]}" 2>&1); rc=$?
[ "$rc" = 2 ] && grep -q "^error: DBRX_DEBUG_ROUTE_FIRST and DBRX_DEBUG_ROUTE_BALANCED are exclusive" <<<"$out" \
    && pass "DBRX_DEBUG_ROUTE_BALANCED with DBRX_DEBUG_ROUTE_FIRST: refused in one line, exit 2" \
    || fail "DBRX_DEBUG_ROUTE_BALANCED with ROUTE_FIRST: exit $rc: $(head -2 <<<"$out")"
