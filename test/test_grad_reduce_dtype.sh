#!/usr/bin/env bash
# test_grad_reduce_dtype.sh — --grad-reduce-dtype fp32|bf16 (parallel/zero_gpu_comm.cuh, zero_gpu_reduce_scatter): the
# device store's shard-group gradient reduce-scatter in BF16, on the SIMT emulator under mpirun (the NCCL twin, which
# sums BF16 in FP32 and rounds to BF16 at every ring hop, in its fixed order):
#   * np 2 ZeRO-3, 3 steps: fp32 (the default) and the flag's fp32 give the same losses bit for bit (the default's
#     bits: test_unchanged.sh); bf16 gives the same step-1 loss, steps 2-3 within 5e-3 of fp32 but not equal (the
#     BF16 path ran: a run that silently kept FP32 fails), and a second bf16 run is bit-identical (deterministic);
#   * the bytes: fp32 minus bf16 per step is exactly half the FP32 reduce-scatter, (S-1)/S x params x 2 B (every run
#     of dbrx-tiny splits evenly in 2; the parameter count from the model's dimensions, below);
#   * np 3 ZeRO-3 (runs that do not split evenly: the rounding kernel's unaligned and tail path), np 4 HSDP 2x2 (the
#     replica all-reduce stays FP32) and np 4 ZeRO-3 with EP 2 (the experts' own shard groups), 2 steps: within 5e-3;
#   * the memory: the bf16 plan (--dry-run) is larger than fp32's by the scratch, 2 B x the longest run (one expert
#     tensor of all the experts, E F d), and every rank's emulated peak is the bf16 plan's allocations (0.1%);
#   * bad values exit 2 with one line naming the flag; the CPU backend refuses bf16 in one line (MPI has no BF16 sum).
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--model dbrx-tiny --n-layers 2 --seq 32 --batch 1 --grad-clip 0 --val-every 0)
runp() {  # name, np, flags...: the emulated GPU under mpirun
    local name=$1 np=$2; shift 2
    $MPI -np "$np" ./train_dbrx_emu --device cuda "${G[@]}" "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 ||
        fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}

# --- bad values, and the CPU backend
for v in fp16 BF16 ""; do
    expect_exit 2 "--grad-reduce-dtype '$v' refused" ./train_dbrx_cpu --model dbrx-tiny --grad-reduce-dtype "$v" --dry-run
    echo "$LAST_ERR" | grep -q -- "--grad-reduce-dtype" || fail "--grad-reduce-dtype '$v': the error does not name the flag"
done
expect_exit 2 "the CPU backend refuses --grad-reduce-dtype bf16" ./train_dbrx_cpu --model dbrx-tiny --steps 1 --grad-reduce-dtype bf16
[ "$(printf '%s\n' "$LAST_ERR" | grep -c .)" = 1 ] && echo "$LAST_ERR" | grep -q -- "--grad-reduce-dtype bf16" \
    && pass "... in one line naming the flag: $LAST_ERR" || fail "CPU refusal: '$LAST_ERR'"

# --- the runs
runp def 2 --steps 3 --shard-group-size 2
runp f32 2 --steps 3 --shard-group-size 2 --grad-reduce-dtype fp32
SIMT_STEP_COUNTERS=1 runp b16 2 --steps 3 --shard-group-size 2 --grad-reduce-dtype bf16   # (+ the emulated peak memory)
runp b16b 2 --steps 3 --shard-group-size 2 --grad-reduce-dtype bf16
runp f32n3 3 --steps 2 --shard-group-size 3
runp b16n3 3 --steps 2 --shard-group-size 3 --grad-reduce-dtype bf16
runp f32h4 4 --steps 2 --shard-group-size 2
runp b16h4 4 --steps 2 --shard-group-size 2 --grad-reduce-dtype bf16
runp f32ep 4 --steps 2 --shard-group-size 4 --expert-parallel 2
runp b16ep 4 --steps 2 --shard-group-size 4 --expert-parallel 2 --grad-reduce-dtype bf16
D=(--model dbrx-tiny --n-layers 2 --seq 32 --batch 1 --shard-group-size 2 --dry-run --plan-gpus 2)
./train_dbrx_cpu "${D[@]}" > "$tmp/plan_f32" 2>&1 || fail "dry-run fp32"
./train_dbrx_cpu "${D[@]}" --grad-reduce-dtype bf16 > "$tmp/plan_b16" 2>&1 || fail "dry-run bf16"

$PY - "$tmp" <<'PY' > "$tmp/verdicts"
import json, os, re, sys
tmp = sys.argv[1]
def log(n): return [json.loads(l) for l in open(os.path.join(tmp, n + ".jsonl"))]
def losses(n): return [r["loss"] for r in log(n) if "loss" in r]
def field(n, k): return [r[k] for r in log(n) if k in r]
def out(n): return open(os.path.join(tmp, n)).read()
def v(ok, msg): print(("pass " if ok else "fail ") + msg)
d, f, b, b2 = losses("def"), losses("f32"), losses("b16"), losses("b16b")
v(len(d) == 3 and d == f, "np 2 ZeRO-3: --grad-reduce-dtype fp32 is the default, bit for bit %s" % f)
diff = [abs(x - y) for x, y in zip(f, b)]
v(len(b) == 3 and b[0] == f[0] and max(diff) <= 5e-3 and max(diff) > 0,
  "bf16: step 1 equal, steps 2-3 within 5e-3 of fp32 and not equal (the BF16 path ran): |diff| %s" % ["%.2e" % x for x in diff])
v(b == b2, "bf16 twice: bit-identical (the twin's fixed summation order)")
# bytes: dbrx-tiny's parameters from its dimensions (d 128, GQA 4:2 heads of 32, 16 experts of F 224, vocab rows 384)
dm, F, E, V, L, qkv = 128, 224, 16, 384, 2, 128 + 2 * 2 * 32
params = 2 * V * dm + dm + L * (2 * dm + qkv * dm + dm * dm + E * dm + 3 * E * F * dm)   # wte, lm_head, norm_f; per block
v(re.search(r"parameters: total ([\d,]+)", out("f32.out")).group(1).replace(",", "") == str(params),
  "the parameter count from the dimensions: %d" % params)
cf, cb = field("f32", "comm_bytes"), field("b16", "comm_bytes")
S = 2
v(len(cb) == 3 and all(x - y == (S - 1) * params * 2 // S for x, y in zip(cf, cb)),
  "the bytes per step: fp32 %d - bf16 %d = half the FP32 reduce-scatter, (S-1)/S x %d params x 2 B = %d" % (
      cf[0], cb[0], params, (S - 1) * params * 2 // S))
f3, b3 = losses("f32n3"), losses("b16n3")
d3 = [abs(x - y) for x, y in zip(f3, b3)]
v(len(b3) == 2 and b3[0] == f3[0] and max(d3) <= 5e-3 and max(d3) > 0,
  "np 3 ZeRO-3 (uneven runs): bf16 within 5e-3 of fp32, not equal: |diff| %s" % ["%.2e" % x for x in d3])
for a, bb, what in (("f32h4", "b16h4", "np 4 HSDP 2x2 (the replica all-reduce stays FP32)"),
                   ("f32ep", "b16ep", "np 4 ZeRO-3 with EP 2 (the experts' shard groups of 2)")):
    fa, fb = losses(a), losses(bb)
    dd = [abs(x - y) for x, y in zip(fa, fb)]
    v(len(fb) == 2 and fb[0] == fa[0] and max(dd) <= 5e-3 and max(dd) > 0,
      "%s: bf16 within 5e-3 of fp32, not equal: |diff| %s" % (what, ["%.2e" % x for x in dd]))
allocs = lambda n: int(re.search(r"^plan bytes: allocations (\d+)", out(n), re.M).group(1))
pf, pb = allocs("plan_f32"), allocs("plan_b16")
v(pb - pf == 2 * E * F * dm, "the plan: bf16's scratch is 2 B x the longest run (E F d = %d): %d bytes more" % (E * F * dm, pb - pf))
peak = [int(x) for x in re.findall(r"^simt peak device memory: (\d+) bytes", out("b16.out"), re.M)]
v(len(peak) >= 2 and abs(max(peak) / pb - 1) <= 0.001, "bf16 np 2: the emulated peak (max %d) is the plan's allocations %d (%+.4f%%)" % (
    max(peak) if peak else 0, pb, 100 * (max(peak) / pb - 1) if peak else 0))
PY
verdicts "$tmp/verdicts" 10
