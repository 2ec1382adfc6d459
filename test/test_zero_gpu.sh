#!/usr/bin/env bash
# test_zero_gpu.sh — the CUDA path with several ranks, end to end on the SIMT emulator (train_dbrx_emu
# --device cuda: the model's kernels on the emulator, the device store parallel/zero_gpu.cuh, its NCCL
# calls on the NCCL twin over MPI between the processes):
#   * mpirun -np 1, 2, 4 with ZeRO-3 (S = np), HSDP 2x2 and DDP (S = 1) on the same global batch: every
#     step's loss within 1e-2 (relative; BF16 activations and weights) of one CPU process, and within 2e-3
#     of one emulated GPU process (the same BF16 numerics; only the fp32 gradient summation order and
#     the shard-wise norm differ); np 1 under mpirun bit-identical to one process; the same HSDP run
#     twice, under two thread schedules, bit-identical;
#   * bytes sent per rank per step, counted by the NCCL twin where it hands them to MPI, against the
#     formula of parallel/README.md with BF16 gathers and FP32 reduce-scatters (within 1%);
#   * the device memory of master+grads+moments+bf16 shard per rank, measured by the emulated allocator,
#     is 1/S of one process's (within 3%: the padding);
#   * negative controls: a planted reduce-scatter error, and a skipped wait for a prefetched gather (the
#     emulator's streams run their work only when waited for), both caught;
#   * checkpoints on the GPU path: 4 steps = 2 + stop + resume + 2 bit-identically (np 2, ZeRO-3); a GPU
#     checkpoint of np 4 resumed on np 2 (reshard), and on the CPU backend; a CPU checkpoint resumed on the
#     GPU; SIGINT saves and exits 0;
#   * the planner (--dry-run's GPU plan): every rank's emulated peak device memory is its allocations within 0.1%,
#     for ZeRO-3, DDP, HSDP, --fp8 delayed and block (seq 16's plan is not: a negative control);
#   * --fp8 delayed on the device store: np 2 = one process (without clipping), and a resume carries the FP8
#     state exactly;
#   * --fp8-gather on the device store, each recipe: bit-identical to --fp8 without it, bytes per step
#     against the formula; the codes used as they are (block: no weight quantised by the model, none decoded,
#     one transposed copy a weight a step);
#   * Hugging Face interop on the GPU path: --export-hf from a GPU run, --init-hf + --dump-logits on the GPU
#     and on the CPU give the same logits within BF16 tolerance;
#   * a rank SIGKILLed and a rank stopped (hung) under mpirun -np 2 --device cuda: the job exits non-zero,
#     naming the rank, within the timeout; and with the host blocked inside the stuck collective (as on a
#     GPU, where comm_sync is not reached), the step watchdog thread ends it.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--model dbrx-tiny --n-layers 2 --seq 32 --steps 3 --val-every 0 --batch 1)

run1() {  # name, binary, flags...: one process
    local name=$1 bin=$2; shift 2
    $bin "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 || fail "$name: $(tail -2 "$tmp/$name.out")"
}
runp() {  # name, np, flags...: the emulated GPU under mpirun
    local name=$1 np=$2; shift 2
    $MPI -np "$np" ./train_dbrx_emu --device cuda "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 ||
        fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}

# --- equivalence: 3 steps of 4 x 32 tokens
run1 cpu_ref ./train_dbrx_cpu "${G[@]}" --device cpu --grad-accum 4
run1 gpu_ref ./train_dbrx_emu "${G[@]}" --device cuda --grad-accum 4
runp np1 1 "${G[@]}" --grad-accum 4
SIMT_STEP_COUNTERS=1 runp np2_zero 2 "${G[@]}" --grad-accum 2 --shard-group-size 2   # (+ the emulated peak memory: the planner, below)
SIMT_STEP_COUNTERS=1 runp np2_ddp 2 "${G[@]}" --grad-accum 2 --shard-group-size 1
runp np4_zero 4 "${G[@]}" --shard-group-size 4
SIMT_STEP_COUNTERS=1 runp np4_hsdp 4 "${G[@]}" --shard-group-size 2
SIMT_SCHEDULE=random:7 runp np4_hsdp_again 4 "${G[@]}" --shard-group-size 2
runp np4_ddp 4 "${G[@]}" --shard-group-size 1

$PY - "$tmp" <<'PY' > "$tmp/eq"
import json, os, sys
tmp = sys.argv[1]
def losses(name):
    p = os.path.join(tmp, name + ".jsonl")
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l] if os.path.exists(p) else []
cpu, gpu = losses("cpu_ref"), losses("gpu_ref")
print("info: cpu", [round(x, 6) for x in cpu], "gpu", [round(x, 6) for x in gpu])
for name, what in [("np1", "np 1 (mpirun)"), ("np2_zero", "np 2 ZeRO-3"), ("np2_ddp", "np 2 DDP"), ("np4_zero", "np 4 ZeRO-3"),
                   ("np4_hsdp", "np 4 HSDP 2x2"), ("np4_ddp", "np 4 DDP")]:
    a = losses(name)
    rc = max((abs(x - y) / y for x, y in zip(a, cpu)), default=9)
    rg = max((abs(x - y) / y for x, y in zip(a, gpu)), default=9)
    tol_g = 0.0 if name == "np1" else 2e-3
    ok = len(a) == len(cpu) == len(gpu) == 3 and rc < 1e-2 and rg <= tol_g
    print("%s %s --device cuda (emulated, NCCL twin): 3 steps, max rel. diff %.1e vs one CPU process (< 1e-2), %.1e vs one GPU "
          "process (%s)" % ("pass" if ok else "fail", what, rc, rg, "bit-identical" if tol_g == 0 else "<= %g" % tol_g))
a, b = losses("np4_hsdp"), losses("np4_hsdp_again")
print("%s np 4 HSDP on the emulated GPU, two thread schedules: bit-identical losses" % ("pass" if len(a) == 3 and a == b else "fail"))
PY
grep '^info' "$tmp/eq" | sed 's/^info:/  /'
grep -v '^info' "$tmp/eq" > "$tmp/eq2"; verdicts "$tmp/eq2" 7

# --- bytes per rank per step (counted by the NCCL twin) and device memory (the emulated allocator)
$PY - "$tmp" <<'PY' > "$tmp/vol"
import os, re, sys
tmp = sys.argv[1]
def volume(d, L, V, E, F, H, kv, S, W, A):
    hd = d // H; qd = d + 2 * kv * hd
    pad = lambda n: S * -(-n // S)
    # the units: wte; per block, the block without its experts and its experts (one run per tensor when
    # S divides E*F: no padding; else one padded run); norm_f + lm_head
    block = d + qd * d + d * d + d + E * d
    experts = 3 * E * F * d if (E * F) % S == 0 else pad(3 * E * F * d)
    Pb = L * (pad(block) + experts)
    P = pad(V * d) + Pb + pad(d + V * d)
    R = W // S
    # per micro-batch: BF16 gathers of every unit (forward) and of the blocks again (backward), FP32
    # reduce-scatter of every unit's gradient; per step: FP32 all-reduce of the gradient shard across replicas
    return A * (S - 1) / S * (2 * (P + Pb) + 4 * P) + 2 * (R - 1) / R * 4 * P / S
T = dict(d=128, L=2, V=384, E=16, F=224, H=4, kv=2)
for name, S, W, A in [("np2_zero", 2, 2, 2), ("np2_ddp", 1, 2, 2), ("np4_zero", 4, 4, 1), ("np4_hsdp", 2, 4, 1), ("np4_ddp", 1, 4, 1)]:
    want = volume(S=S, W=W, A=A, **T)
    text = open(os.path.join(tmp, name + ".out")).read()
    got = {int(r): float(v) for r, v in re.findall(r"comm: rank (\d+) sent \d+ bytes in \d+ training steps \(([\d.]+) bytes/step\)", text)}
    ok = len(got) == W and all(abs(v / want - 1) < 0.01 for v in got.values())
    print("%s %s: bytes sent per rank per step %s, formula %.0f (S=%d, R=%d, grad-accum %d)" % (
        "pass" if ok else "fail", name, "/".join("%.0f" % got[r] for r in sorted(got)), want, S, W // S, A))
def mem(name):
    rows = re.findall(r"zero: rank (\d+) \(cuda:\d+\): .*? (\d+) bytes allocated, (-?\d+) bytes measured", open(os.path.join(tmp, name + ".out")).read())
    return {int(r): (int(a), int(m)) for r, a, m in rows}
full = mem("np1")[0][1]
for name, S, W in [("np2_zero", 2, 2), ("np4_zero", 4, 4), ("np4_hsdp", 2, 4), ("np4_ddp", 1, 4)]:
    m = mem(name)
    ratios = [m[r][1] / (full / S) for r in sorted(m)]
    ok = len(m) == W and all(0.99 <= x <= 1.03 for x in ratios) and all(m[r][1] == m[r][0] for r in m)
    print("%s %s: device master+grads+moments+bf16 shard per rank measured %s KiB = %s x (one process %.1f KiB / S=%d)" % (
        "pass" if ok else "fail", name, "/".join("%.1f" % (m[r][1] / 1024) for r in sorted(m)),
        "/".join("%.3f" % x for x in ratios), full / 1024, S))
PY
verdicts "$tmp/vol" 9

# --- negative control: a planted error in the reduce-scatter (each rank adds its neighbour's chunk of the
# reduced gradient into its shard) must break the equality with one process
DBRX_DEBUG_PLANT=reduce_scatter_chunk runp planted 2 "${G[@]}" --grad-accum 2 --shard-group-size 2
$PY - "$tmp/planted.jsonl" "$tmp/gpu_ref.jsonl" <<'PY' && pass "negative control: a planted reduce-scatter error changes the losses (the equality checks can fail)" \
    || fail "negative control: the planted reduce-scatter error went unnoticed"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(a) == len(b) == 3 and max(abs(x - y) / y for x, y in zip(a, b)) > 2e-3, (a, b)
PY

# negative control of the stream ordering: the emulator's created streams run their work only when waited
# for (test/simt/simt.h), so a unit whose compute does not wait for its gather's event reads a slot not yet
# gathered (poison, or another unit's weights): the run must fail or give other losses
DBRX_DEBUG_PLANT=skip_gather_wait $MPI -np 2 ./train_dbrx_emu --device cuda "${G[@]}" --grad-accum 2 --shard-group-size 2 \
    --log "$tmp/nowait.jsonl" > "$tmp/nowait.out" 2>&1; rc=$?
if [ "$rc" != 0 ] || ! $PY - "$tmp/nowait.jsonl" "$tmp/gpu_ref.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
sys.exit(0 if a == b else 1)
PY
then pass "negative control: a skipped wait for the prefetched gather is caught (exit $rc: $(grep -m1 error "$tmp/nowait.out" | cut -c1-80))"
else fail "negative control: the skipped gather wait went unnoticed (the emulator ran the gather early?)"; fi

# --- checkpoints on the GPU path (the CPU path's format: the fp32 master shards and moments)
C=(--model dbrx-tiny --n-layers 2 --seq 32 --val-every 0 --batch 1 --steps 4)
losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"; }
runp c_full 2 "${C[@]}" --grad-accum 2 --shard-group-size 2
runp c_half 2 "${C[@]}" --grad-accum 2 --shard-group-size 2 --ckpt-dir "$tmp/ck" --stop-after 2
runp c_half 2 "${C[@]}" --grad-accum 2 --shard-group-size 2 --ckpt-dir "$tmp/ck" --resume auto
grep -q "^resume: $tmp/ck/step_00000002 (step 2" "$tmp/c_half.out" && [ "$(losses "$tmp/c_full.jsonl")" = "$(losses "$tmp/c_half.jsonl")" ] \
    && pass "GPU path, np 2 ZeRO-3: 4 steps = 2 + save + stop + resume + 2, bit-identical losses" \
    || fail "GPU resume: $(losses "$tmp/c_full.jsonl") vs $(losses "$tmp/c_half.jsonl"): $(grep -E 'resume|error' "$tmp/c_half.out" | head -2)"
# a checkpoint of np 4 (HSDP 2x2) resumed on np 2 (ZeRO-3), and on the CPU backend (one process)
runp r_full 4 "${C[@]}" --shard-group-size 2
runp r4 4 "${C[@]}" --shard-group-size 2 --ckpt-dir "$tmp/ck4" --stop-after 2
cp -r "$tmp/ck4" "$tmp/ck4cpu"
runp r4 2 "${C[@]}" --grad-accum 2 --shard-group-size 2 --ckpt-dir "$tmp/ck4" --resume auto
./train_dbrx_cpu "${C[@]}" --device cpu --grad-accum 4 --ckpt-dir "$tmp/ck4cpu" --resume auto --log "$tmp/r4cpu.jsonl" > "$tmp/r4cpu.out" 2>&1 \
    || fail "CPU resume of a GPU checkpoint: $(tail -2 "$tmp/r4cpu.out")"
# a CPU checkpoint resumed on the GPU
./train_dbrx_cpu "${C[@]}" --device cpu --grad-accum 4 --ckpt-dir "$tmp/ckc" --stop-after 2 > "$tmp/c1.out" 2>&1 || fail "CPU save: $(tail -2 "$tmp/c1.out")"
./train_dbrx_cpu "${C[@]}" --device cpu --grad-accum 4 --log "$tmp/cfull.jsonl" > "$tmp/c2.out" 2>&1 || fail "CPU run: $(tail -2 "$tmp/c2.out")"
runp cg 1 "${C[@]}" --grad-accum 4 --ckpt-dir "$tmp/ckc" --resume auto
$PY - "$tmp" <<'PY' > "$tmp/ckv"
import json, os, sys
tmp = sys.argv[1]
L = lambda n: [json.loads(l)["loss"] for l in open(os.path.join(tmp, n + ".jsonl")) if '"loss"' in l]
def check(what, got, want, tol):
    d = max((abs(x - y) / y for x, y in zip(got, want)), default=9)
    print("%s %s: steps 3-4 within %.1e (<= %g)" % ("pass" if len(got) == len(want) and d <= tol else "fail", what, d, tol))
full = L("r_full")
r4 = L("r4"); check("GPU checkpoint of np 4 (HSDP 2x2) resumed on np 2 (ZeRO-3): reshard", r4[2:], full[2:], 2e-3)
check("GPU checkpoint (np 4) resumed on the CPU backend (one process)", L("r4cpu"), full[2:], 1e-2)
check("CPU checkpoint resumed on the GPU path", L("cg"), L("cfull")[2:], 1e-2)
PY
verdicts "$tmp/ckv" 3
for f in r4.out r4cpu.out cg.out; do grep -q "^resume: .*(step 2," "$tmp/$f" || fail "$f did not resume from step 2: $(grep -E 'resume|error' "$tmp/$f" | head -2)"; done

# --fp8 delayed on the device store: np 2 ZeRO-3 gives one GPU process's losses, and its checkpoint
# carries the FP8 scaling state (amax histories, scales: uploaded to the device on resume) bit-exactly.
# Without clipping: the gradients and the FP8 state are bit-identical, but the shard-wise norm sums in
# another order than one process's (as in the BF16 equivalence above), so the clip factor can differ in
# its last bit (it did once dxe became BF16: losses 1.6e-7 apart at step 4)
F=(--model dbrx-tiny --n-layers 2 --seq 32 --val-every 0 --batch 2 --steps 4 --fp8 delayed --fp8-log-every 1 --grad-clip 0)
run1 f_ref ./train_dbrx_emu "${F[@]}" --device cuda --grad-accum 2
SIMT_STEP_COUNTERS=1 runp f_full 2 "${F[@]}" --shard-group-size 2
runp f_half 2 "${F[@]}" --shard-group-size 2 --ckpt-dir "$tmp/ckf" --stop-after 2
runp f_half 2 "${F[@]}" --shard-group-size 2 --ckpt-dir "$tmp/ckf" --resume auto
[ "$(losses "$tmp/f_full.jsonl")" = "$(losses "$tmp/f_ref.jsonl")" ] && pass "--fp8 delayed, np 2 ZeRO-3 on the device: the losses of one GPU process"     || fail "--fp8 delayed np 2: $(losses "$tmp/f_full.jsonl") vs $(losses "$tmp/f_ref.jsonl")"
[ "$(losses "$tmp/f_full.jsonl")" = "$(losses "$tmp/f_half.jsonl")" ] && grep -q '"recipe": "delayed"' "$tmp/ckf/step_00000002/manifest.json" \
    && pass "--fp8 delayed on the GPU path: 2 + save + resume + 2 = 4 steps bit-identically (the FP8 state in the checkpoint)" \
    || fail "--fp8 delayed GPU resume: $(losses "$tmp/f_full.jsonl") vs $(losses "$tmp/f_half.jsonl")"

# --fp8-gather on the device store: the blocks' FP8 matrices travel as E4M3 codes, the norms and router
# as BF16; the model's GEMMs read the codes as they are in the slot (the same bytes its own quantisation would
# write), so losses, gradient norms and every FP8 amax/scale equal --fp8 without it, bit for bit; bytes per step
# against the formula (the gathers of the blocks at 1 byte per element of a c-element piece plus the
# longest rank's norms/router piece at 2 bytes)
runp fg_delayed 2 "${F[@]}" --shard-group-size 2 --fp8-gather
DBRX_DEBUG_PLANT=fp8_gather_scale runp fg_planted 2 "${F[@]}" --shard-group-size 2 --fp8-gather
for r in current block; do   # (block: with the work log of every launch)
    if [ $r = block ]; then
        SIMT_WORKLOG="$tmp/wl_f" SIMT_STEP_COUNTERS=1 runp f_$r 2 "${F[@]}" --steps 3 --fp8 $r --shard-group-size 2
        SIMT_WORKLOG="$tmp/wl_fg" SIMT_STEP_COUNTERS=1 runp fg_$r 2 "${F[@]}" --steps 3 --fp8 $r --shard-group-size 2 --fp8-gather
    else
        SIMT_STEP_COUNTERS=1 runp f_$r 2 "${F[@]}" --steps 3 --fp8 $r --shard-group-size 2
        runp fg_$r 2 "${F[@]}" --steps 3 --fp8 $r --shard-group-size 2 --fp8-gather
    fi
done
# the codes used as they are: with the gather no weight is quantised by the model (its FP8 quantisations are 10 a layer
# a step fewer: 5 weights' q in the forward, their qt in the backward), nothing is decoded to BF16, and each weight's
# transposed copy is made from its codes once a step (in the backward, for dgrad)
$PY - "$tmp/wl_f.0" "$tmp/wl_fg.0" <<'PY' > "$tmp/fgk"
import collections, json, sys
def kernels(path):
    c = collections.Counter()
    for l in open(path):
        try: r = json.loads(l)
        except ValueError: continue
        if r.get("t") == "kernel": c[r["name"].split("<")[0]] += 1
    return c
f, g = kernels(sys.argv[1]), kernels(sys.argv[2])
L, steps = 2, 3
q = lambda c: sum(v for k, v in c.items() if k.startswith("fp8_") and "quantize" in k)
ok = q(f) - q(g) == 10 * L * steps and g["fp8g_decode_bf16_kernel"] == 0 and g["fp8_transpose16_kernel"] == 5 * L * steps
print("%s --fp8 block --fp8-gather on the device store: the codes used as they are: the model's FP8 quantisations %d (without the "
      "gather %d, %d fewer = 10 a layer a step), %d BF16 decodes, %d transposed copies of codes (5 a layer a step)" % (
      "pass" if ok else "fail", q(g), q(f), q(f) - q(g), g["fp8g_decode_bf16_kernel"], g["fp8_transpose16_kernel"]))
PY
verdicts "$tmp/fgk" 1
$PY - "$tmp" <<'PY' > "$tmp/fg"
import json, os, re, sys
tmp = sys.argv[1]
def log(name):
    rows = [json.loads(l) for l in open(os.path.join(tmp, name + ".jsonl"))]
    return ([(r["loss"], r["grad_norm"]) for r in rows if "loss" in r],
            [{k: (v["amax"], v["scale"]) for k, v in r["fp8"].items()} for r in rows if "fp8" in r])
def sent(name):
    return {int(r): float(v) for r, v in re.findall(r"comm: rank (\d+) sent \d+ bytes in \d+ training steps \(([\d.]+) bytes/step\)",
                                                   open(os.path.join(tmp, name + ".out")).read())}
d, L, V, E, F, H, kv, S, A = 128, 2, 384, 16, 224, 4, 2, 2, 1
hd = d // H; qd = d + 2 * kv * hd
# a block's two units: the block without its experts (one run), its experts (one run per tensor: S divides E*F)
tensors = [(d, 0), (qd * d, 1), (d * d, 1), (d, 0), (E * d, 0)]
nb = sum(n for n, _ in tensors); c = lambda n: -(-n // S)
assert (E * F) % S == 0
ne = 3 * c(E * F * d)   # the experts' shard: all FP8 codes, no side piece
def side():   # the longest rank's norms + router elements
    best = 0
    for r in range(S):
        lo, hi, off, k = r * c(nb), (r + 1) * c(nb), 0, 0
        for n, q in tensors:
            if not q: k += max(0, min(hi, off + n) - max(lo, off))
            off += n
        best = max(best, k)
    return best
P = S * (c(V * d) + c(d + V * d) + L * (c(nb) + ne))
def groups(block):
    cb = lambda rows, cols: -(-rows // 128) * -(-cols // 128)
    return L * ((cb(qd, d) + cb(d, d) + 3 * E * cb(F, d)) if block else 5)
def volume(block):
    gathers = (S - 1) * (2 * (c(V * d) + c(d + V * d)) + 2 * L * (c(nb) + 2 * side() + ne))   # forward: all units; backward: the blocks'
    return A * (gathers + (S - 1) / S * 4 * P) + 2 * (S - 1) / S * 4 * groups(block)
for recipe, ref in [("delayed", "f_full"), ("current", "f_current"), ("block", "f_block")]:
    (a, fa), (b, fb) = log(ref), log("fg_" + recipe)
    same = len(a) >= 3 and a == b and len(fa) == len(a) and fa == fb
    print("%s --fp8 %s on the device store, np 2 ZeRO-3: with --fp8-gather losses, grad norms and every FP8 amax/scale of %d steps %s" % (
        "pass" if same else "fail", recipe, len(a), "bit-identical" if same else "differ: %s vs %s" % (a[:1], b[:1])))
    g, f = sent("fg_" + recipe), sent(ref)
    want = volume(recipe == "block")
    ok = len(g) == 2 and all(abs(v / want - 1) < 0.01 for v in g.values()) and max(g.values()) < min(f.values())
    print("%s --fp8 %s --fp8-gather: bytes per rank per step %s (without: %s), formula %.0f" % ("pass" if ok else "fail", recipe,
          "/".join("%.0f" % g[r] for r in sorted(g)), "/".join("%.0f" % f[r] for r in sorted(f)), want))
PY
verdicts "$tmp/fg" 6
[ "$(losses "$tmp/fg_planted.jsonl")" != "$(losses "$tmp/f_full.jsonl")" ] \
    && pass "negative control: --fp8-gather with a planted factor of 2 in the delayed weight scale breaks the bit-identity" \
    || fail "negative control: the planted FP8 gather scale went unnoticed"

# SIGINT to the rank (as Ctrl-C in a terminal reaches it): the GPU path saves where it is and exits 0
./train_dbrx_emu "${C[@]}" --device cuda --steps 400 --ckpt-dir "$tmp/sig" --log "$tmp/sig.jsonl" > "$tmp/sig.out" 2>&1 & P=$!
waitlog "$tmp/sig.jsonl" 2 || fail "SIGINT test: no progress: $(tail -2 "$tmp/sig.out")"
kill -INT $P; wait $P; rc=$?
n=$(grep -c '"loss"' "$tmp/sig.jsonl")
[ "$rc" = 0 ] && [ "$n" -lt 400 ] && [ "$(cat "$tmp/sig/latest" 2>/dev/null)" = "$(printf 'step_%08d' "$n")" ] \
    && pass "SIGINT on the GPU path: saved step $n and exited 0" || fail "SIGINT on the GPU path: exit $rc, $n steps, latest $(cat "$tmp/sig/latest" 2>/dev/null)"

# --- the planner (parallel/memory_plan.h): every rank's peak of the emulated device memory over the run (the
# emulator's allocator, SIMT_STEP_COUNTERS) is what --dry-run says the run allocates, for ZeRO-3, DDP, HSDP,
# two FP8 recipes (block also on DDP, with the cached FP8 weights, and with --fp8-gather, also under EP), --adam-moments bf16, --optimizer lion and expert parallelism 2 (BF16; FP8 block at --ep-capacity-factor 1.5). Issue 23 asks for 2%; measured 320-380 bytes of 44-54 MB (7e-6: the store's segment tables),
# so held to 0.1%; the plan of another micro-batch (seq 16, 1-2% less) is not it (negative control)
# expert parallelism too: its buffers planned at start-up for --ep-capacity-factor's rows (model/CUDA.md)
SIMT_STEP_COUNTERS=1 runp ep2_plan 2 "${G[@]}" --shard-group-size 2 --expert-parallel 2
SIMT_STEP_COUNTERS=1 runp ep2_block_plan 2 "${G[@]}" --shard-group-size 2 --expert-parallel 2 --fp8 block --ep-capacity-factor 1.5
# (--fp8-gather: the store's codes, side pieces and scales in the plan, and no weight scratch in the model; with EP, whose
# ranks gather their own experts' codes, and the exchange in chunks)
SIMT_STEP_COUNTERS=1 runp ep2_gather_plan 2 "${G[@]}" --shard-group-size 2 --expert-parallel 2 --fp8 block --fp8-gather --ep-overlap-chunks 2
# (FP8 on DDP: the weights stay in place, so each keeps its quantised copy for the step: fp8_weight_gpu)
SIMT_STEP_COUNTERS=1 runp f8_ddp 2 "${F[@]}" --steps 2 --fp8 block --shard-group-size 1
# (--adam-moments bf16: the store's moments 2 bytes an element, in the plan too)
SIMT_STEP_COUNTERS=1 runp am16 2 "${G[@]}" --shard-group-size 2 --adam-moments bf16
# (--optimizer lion: m alone, no v, on the device and in the plan)
SIMT_STEP_COUNTERS=1 runp lion 2 "${G[@]}" --shard-group-size 2 --optimizer lion
for spec in "np2_zero 2 G --shard-group-size 2" "np2_ddp 2 G --shard-group-size 1" "np4_hsdp 4 G --shard-group-size 2" \
            "f_full 2 F --shard-group-size 2" "f_block 2 F --fp8 block --shard-group-size 2" "f8_ddp 2 F --fp8 block --shard-group-size 1" \
            "ep2_plan 2 G --shard-group-size 2 --expert-parallel 2" "am16 2 G --shard-group-size 2 --adam-moments bf16" \
            "lion 2 G --shard-group-size 2 --optimizer lion" \
            "ep2_block_plan 2 G --shard-group-size 2 --expert-parallel 2 --fp8 block --ep-capacity-factor 1.5" \
            "fg_block 2 F --fp8 block --shard-group-size 2 --fp8-gather" \
            "ep2_gather_plan 2 G --shard-group-size 2 --expert-parallel 2 --fp8 block --fp8-gather --ep-overlap-chunks 2"; do
    set -- $spec
    name=$1 np=$2 set_=$3; shift 3
    [ "$set_" = G ] && flags=("${G[@]}") || flags=("${F[@]}")
    plan=$(./train_dbrx_emu "${flags[@]}" "$@" --dry-run --plan-gpus "$np" | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
    other=$(./train_dbrx_emu "${flags[@]}" "$@" --seq 16 --dry-run --plan-gpus "$np" | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
    echo "$name $np $plan $other"
done > "$tmp/plans"
$PY - "$tmp" <<'PY' > "$tmp/planned"
import os, re, sys
tmp = sys.argv[1]
for line in open(os.path.join(tmp, "plans")):
    name, np, plan, other = line.split()
    peaks = [int(x) for x in re.findall(r"^simt peak device memory: (\d+) bytes", open(os.path.join(tmp, name + ".out")).read(), re.M)]
    top, plan, other = (max(peaks) if peaks else 0), int(plan), int(other)
    ok = len(peaks) >= int(np) and abs(top / plan - 1) <= 0.001 and abs(top / other - 1) > 0.001
    print("%s %s (np %s): the emulated peak per rank %d bytes, the --dry-run plan's allocations %d (%+.4f%%); seq 16's plan %d is not it" % (
        "pass" if ok else "fail", name, np, top, plan, 100 * (top / plan - 1), other))
PY
verdicts "$tmp/planned" 11

# --- Hugging Face interop on the GPU path: export (fp32) from np 2 ZeRO-3, PyTorch on the export
# reproduces the GPU's logits; import on the GPU gives the exported weights back. The tolerance is the
# largest logit difference over the tokens in BF16: ~0.01, but a token whose router sees a near-tie can
# take another expert in BF16 (measured: 0.05 at one token of 32, 2e-3 on average; the CPU's is 4e-7)
runp hf 2 "${C[@]}" --grad-accum 2 --shard-group-size 2 --steps 2 --export-hf "$tmp/hfG" --export-dtype fp32
./train_dbrx_emu "${C[@]}" --device cuda --init-hf "$tmp/hfG" --stop-after 0 --export-hf "$tmp/hfG2" --export-dtype fp32 \
    --dump-logits "$tmp/logitsG.st" > "$tmp/hf2.out" 2>&1 || fail "GPU --init-hf: $(tail -2 "$tmp/hf2.out")"
cmp -s "$tmp/hfG/model.safetensors" "$tmp/hfG2/model.safetensors" \
    && pass "GPU path: fp32 export (np 2 ZeRO-3) -> --init-hf on the GPU -> export: byte-identical" || fail "GPU HF round trip differs"
out=$($PY dev/hf_logits.py "$tmp/hfG" "$tmp/logitsG.st" 2>&1) && grep -q "tol 1.0e-01 (bf16 dump)" <<<"$out" \
    && pass "PyTorch on the GPU run's export reproduces its --dump-logits (BF16, the dump's default tolerance): ${out#*\): }" \
    || fail "hf_logits on the GPU export: $out"
# (a BF16 dump may have 2% of its tokens above the tolerance: near-ties in the router; a model that is off
# everywhere, here the same comparison held to 1e-6, is not let through by that allowance)
out=$($PY dev/hf_logits.py "$tmp/hfG" "$tmp/logitsG.st" --tol 1e-6 2>&1); rc=$?
[ "$rc" = 1 ] && grep -qE "hf_logits: [0-9]+ of [0-9]+ tokens above tol \((9[0-9]|100)\.[0-9]+%; allowed 2.00%\)" <<<"$out" \
    && pass "hf_logits: a dump off at (nearly) every token fails despite the BF16 outlier allowance" || fail "hf_logits --tol 1e-6: exit $rc: $out"

# --- a lost rank and a hung rank on the GPU path: every survivor exits non-zero, naming the rank, in time
t0=$(date +%s)
DBRX_DEBUG_KILL=1:2 timeout 120 $MPI -np 2 ./train_dbrx_emu --device cuda "${C[@]}" --shard-group-size 2 > "$tmp/kill.out" 2>&1; rc=$?
dt=$(( $(date +%s) - t0 ))
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 60 ] && grep -q "error: rank 0: lost rank 1 " "$tmp/kill.out" \
    && pass "GPU path: rank 1 of 2 SIGKILLed in step 2: rank 0 names it, exit $rc after ${dt} s" \
    || fail "GPU path, lost rank: exit $rc after ${dt} s: $(grep -i "error\|lost" "$tmp/kill.out" | head -3)"
t0=$(date +%s)
DBRX_DEBUG_KILL=1:2:stop timeout 120 $MPI -np 2 ./train_dbrx_emu --device cuda "${C[@]}" --shard-group-size 2 --comm-timeout 5 > "$tmp/hang.out" 2>&1; rc=$?
dt=$(( $(date +%s) - t0 ))
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 60 ] && grep -q "waiting for rank 1" "$tmp/hang.out" \
    && pass "GPU path: a hung rank (SIGSTOP): exit $rc after ${dt} s, the watchdog names rank 1" \
    || fail "GPU path, hung rank: exit $rc after ${dt} s: $(grep -i error "$tmp/hang.out" | head -3)"
# (the same hang with the host blocked inside the collective, DBRX_DEBUG_TWIN_BLOCKS: test_hang.sh's abort path)
