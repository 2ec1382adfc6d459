#!/usr/bin/env bash
# test_cp.sh — context parallelism (--context-parallel N, parallel/context_parallel.h) on the CPU backend, mpirun:
#   * CP 2 and CP 4 against one process on the same sequences: losses within 1e-5 for 6 steps (data
#     parallel, ZeRO-3, HSDP with two CP groups, EP 2), the validation loss, and the load-balancing loss (the
#     CP group's expert counts and probability sums all-reduced: the whole sequences' loss, as one process's);
#   * the gradients after one step (a checkpoint's AdamW first moment) per unit, CP 2 and 4 vs one process;
#   * the same topology twice: the same losses and gradient norms bit for bit;
#   * the ring's bytes per rank (the CP group's counter) equal the formula computed here by hand;
#   * checkpoints do not depend on the CP degree: CP 4 -> CP 2 -> one process and one process -> CP 2 resume;
#   * the emulated GPU's ring (two K|V slots) against the all-gather form bit for bit, and its peak device memory per rank
#     against --dry-run's plan (parallel/memory_plan.h's memory_plan_cp) within 0.1%;
#   * --doc-mask under CP: CPU CP 2 and 4 against one process (1e-5), the emulated GPU's CP 2 and 4 against one GPU (2e-3);
#     MFU's FLOPs per token (attention as executed) one process's under CP 2 and 4;
#   * bad degrees and unsupported combinations: exit 2, one line naming the flag.
# (the ring's arithmetic against the full-sequence attention, and its negative controls: test/test_ring_attention)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

U=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 6 --val-every 0 --device cpu)
run() {  # name, np (0: one process, no mpirun), flags...
    local name=$1 np=$2; shift 2
    if [ "$np" = 0 ]; then $BIN "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1
    else $MPI -np "$np" $BIN "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1; fi
    [ $? = 0 ] || fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}
run ref1 0 "${U[@]}" --batch 1 --val-every 3 --val-steps 2
run ref2 0 "${U[@]}" --batch 1 --grad-accum 2   # (the two CP groups' sequences as two micro-batches: each its own load-balancing loss)
run cp2_ddp 2 "${U[@]}" --batch 1 --context-parallel 2 --shard-group-size 1 --val-every 3 --val-steps 2
run cp2_zero 2 "${U[@]}" --batch 1 --context-parallel 2 --shard-group-size 2
run cp2_zero_again 2 "${U[@]}" --batch 1 --context-parallel 2 --shard-group-size 2
run cp2_ep 2 "${U[@]}" --batch 1 --context-parallel 2 --expert-parallel 2
run cp4_zero 4 "${U[@]}" --batch 1 --context-parallel 4
run cp4_ep 4 "${U[@]}" --batch 1 --context-parallel 4 --expert-parallel 2 --shard-group-size 2
run cp2_rc 2 "${U[@]}" --batch 1 --grad-accum 2 --context-parallel 2 --recompute attn
run cp2x2_hsdp 4 "${U[@]}" --batch 1 --context-parallel 2 --shard-group-size 2
# resume across CP degrees: CP 4 (steps 1-2) -> CP 2 (3-4) -> one process (5-6); one process (1-3) -> CP 2 (4-6)
run r4 4 "${U[@]}" --batch 1 --context-parallel 4 --ckpt-dir "$tmp/ck421" --ckpt-every 2 --stop-after 2
run r42 2 "${U[@]}" --batch 1 --context-parallel 2 --ckpt-dir "$tmp/ck421" --ckpt-every 2 --stop-after 2 --resume auto
run r421 0 "${U[@]}" --batch 1 --ckpt-dir "$tmp/ck421" --resume auto
run r12a 0 "${U[@]}" --batch 1 --ckpt-dir "$tmp/ck12" --ckpt-every 3 --stop-after 3
run r12b 2 "${U[@]}" --batch 1 --context-parallel 2 --ckpt-dir "$tmp/ck12" --resume auto

$PY - "$tmp" > "$tmp/results" <<'PY'
import json, os, re, sys
tmp = sys.argv[1]
def log(name, key):
    p = os.path.join(tmp, name + ".jsonl")
    return [(o["step"], o[key]) for o in map(json.loads, open(p)) if key in o] if os.path.exists(p) else []
def same(name, ref, what, key="loss", tol=1e-5):
    a, b = dict(log(name, key)), dict(log(ref, key))
    steps = sorted(a)
    if not steps or any(s not in b for s in steps):
        print(f"fail {what}: {key} steps {steps} vs {sorted(b)}"); return
    d = max(abs(a[s] - b[s]) for s in steps)
    print(("pass" if d <= tol else "fail") + f" {what}: {len(steps)} {key}es, max |diff| {d:.2e} (<= {tol:g})")
same("cp2_ddp", "ref1", "CP 2 (np 2, data parallel) vs one process")
same("cp2_ddp", "ref1", "CP 2 validation loss vs one process", key="val_loss")
same("cp2_zero", "ref1", "CP 2 with ZeRO-3 (np 2, shard group 2) vs one process")
same("cp2_zero_again", "cp2_zero", "CP 2 with ZeRO-3 twice: the same losses bit for bit", tol=0.0)
same("cp2_zero_again", "cp2_zero", "CP 2 with ZeRO-3 twice: the same gradient norms bit for bit", key="grad_norm", tol=0.0)
same("cp2_ep", "ref1", "CP 2 with EP 2 (np 2) vs one process")
same("cp4_zero", "ref1", "CP 4 with ZeRO-3 (np 4) vs one process")
same("cp4_ep", "ref1", "CP 4 with HSDP 2 and EP 2 (np 4) vs one process")
same("cp2_ddp", "ref1", "CP 2: the gradient norms (the log's 6 decimals), as one process's", key="grad_norm", tol=1e-5)
same("cp4_ep", "ref1", "CP 4, HSDP 2, EP 2: the gradient norms, as one process's", key="grad_norm", tol=1e-5)
same("cp2_ddp", "ref1", "CP 2: the load-balancing loss of the whole sequences, as one process's", key="lbl")
same("cp4_ep", "ref1", "CP 4, HSDP 2, EP 2: the load-balancing loss, as one process's", key="lbl")
same("cp2x2_hsdp", "ref2", "CP 2 x 2 data-parallel groups (np 4, HSDP shard group 2) vs one process at grad-accum 2")
same("cp2_rc", "ref2", "CP 2 with --grad-accum 2 and --recompute attn (the ring run again in the backward) vs one process")
same("r42", "ref1", "resume: 2 steps at CP 4, then 2 at CP 2, vs one process")
same("r421", "ref1", "resume: ... then the last 2 in one process, vs one process")
same("r12b", "ref1", "resume: 3 steps in one process, then 3 at CP 2, vs one process")
# the ring's bytes: per layer and rank, forward (N-1) KVB, backward (2N-1) KVB, KVB = B (T/N) 2 kv hd 4;
# dbrx-tiny: kv 2, hd 32; 2 layers, 6 steps, batch 1, T 64; cp2_ddp adds 3 validations of 2 batches (forwards)
def bytes_check(name, N, val_fwd):
    out = open(os.path.join(tmp, name + ".out")).read()
    got = [int(x) for x in re.findall(r"^cp: rank \d+: .* sent (\d+) bytes", out, re.M)]
    kvb = 1 * (64 // N) * 2 * 2 * 32 * 4
    want = 2 * ((6 + val_fwd) * (N - 1) + 6 * (2 * N - 1)) * kvb
    ok = len(got) > 0 and all(g == want for g in got)
    print(("pass" if ok else "fail") + f" {name}: ring bytes per rank {sorted(set(got))} = the formula {want} "
          f"(2 layers x ({6 + val_fwd} forwards x (N-1) + 6 backwards x (2N-1)) x {kvb} B)")
bytes_check("cp2_ddp", 2, 6)   # validation at steps 0 and 3 and at the end, 2 batches each
bytes_check("cp4_zero", 4, 0)
PY
verdicts "$tmp/results" 19

# gradients compared directly: after one step (data parallel: rank 0 saves the whole model) a checkpoint's AdamW
# first moment is 0.1 x the clipped gradient; per sharding unit, CP 2 and CP 4 against one process
G=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 1 --val-every 0 --device cpu --batch 1 --shard-group-size 1)
run g1 0 "${G[@]}" --ckpt-dir "$tmp/g1"
run g2 2 "${G[@]}" --context-parallel 2 --ckpt-dir "$tmp/g2"
run g4 4 "${G[@]}" --context-parallel 4 --ckpt-dir "$tmp/g4"
$PY - "$tmp" > "$tmp/grads" <<'PY'
import glob, json, sys
import numpy as np
tmp = sys.argv[1]
def moment(name):   # the checkpoint's adam_m (the arrays: master, adam_m, adam_v) and the units' sizes
    try:
        d = glob.glob(f"{tmp}/{name}/step_*")[0]
        t = json.load(open(d + "/manifest.json"))["topology"]
        n = sum(t["unit_numel"])
        a = np.fromfile(d + "/shard_00000.bin", dtype=np.float32, offset=t["header_bytes"])
        return a[n:2 * n], t["unit_numel"]
    except Exception as e:
        return None, str(e)
names = ["wte", "block 0", "block 0 experts", "block 1", "block 1 experts", "head"]
ref, units = moment("g1")
for name in ("g2", "g4"):
    m, _ = moment(name)
    if ref is None or m is None or m.size != ref.size:
        print(f"fail {name}: the checkpoints could not be compared ({units})"); continue
    errs, o = [], 0
    for n in units:
        a, b = ref[o:o + n], m[o:o + n]; o += n
        errs.append(float(np.abs(a - b).max() / np.abs(a).max()))
    ok = all(e < 1e-5 for e in errs)
    print(("pass" if ok else "fail") + f" {name}: gradients after one step (the AdamW first moment), per unit, relative to one process: "
          + ", ".join(f"{u} {e:.1e}" for u, e in zip(names, errs)) + " (< 1e-5)")
PY
verdicts "$tmp/grads" 2

# the CPU ring's K|V hops beside the arithmetic (MPI_Isend/Irecv started before a block's arithmetic, waited for after it:
# cp_hop_start) against the former blocking form (DBRX_DEBUG_PLANT=cp_all_gather: each hop waited for before the
# arithmetic): CP 4 with ZeRO-3, the same losses and gradient norms bit for bit
DBRX_DEBUG_PLANT=cp_all_gather run cp4_blocking 4 "${U[@]}" --batch 1 --context-parallel 4
$PY - "$tmp" > "$tmp/overlap" <<'PY'
import json, os, sys
tmp = sys.argv[1]
def log(name):
    p = os.path.join(tmp, name + ".jsonl")
    return [(o["loss"], o["grad_norm"]) for o in map(json.loads, open(p)) if "loss" in o] if os.path.exists(p) else []
a, b = log("cp4_zero"), log("cp4_blocking")
print(("pass" if len(a) == 6 and a == b else "fail") + f" CPU CP 4: the overlapped K|V hops' {len(a)} losses and gradient norms bit-identical to the blocking form's")
PY
verdicts "$tmp/overlap" 1

# the CUDA backend (train_dbrx_emu: the SIMT emulator, NCCL on the twin; K|V and the backward's dK|dV sums on a ring, the
# chunk pairs on the flash kernels, parallel/context_parallel_cuda.cuh): CP 2 (ZeRO-3; EP 2) and CP 4 (ZeRO-3; EP 2)
# against one emulated GPU process (BF16: within 2e-3, as the store's ranks are) and one CPU process (1e-2); CP 2 and
# CP 4 twice, under two thread schedules, bit for bit. The load-balancing loss (dbrx-tiny's weight 0.05) is the CP group's on both backends: the
# lbl column of every GPU run against one GPU process's and CP 2's against the CPU CP 2 run's (2e-3 relative).
EMU=${EMU:-./train_dbrx_emu}
if [ -x "$EMU" ]; then
    X=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 3 --val-every 0 --batch 1 --moe-loss-weight 0.05)
    runx() {  # name, np (0: one process), flags...
        local name=$1 np=$2; shift 2
        if [ "$np" = 0 ]; then OMP_WAIT_POLICY=passive $EMU --device cuda "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1
        else OMP_WAIT_POLICY=passive $MPI -np "$np" $EMU --device cuda "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1; fi
        [ $? = 0 ] || fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
    }
    run xcpu 0 "${X[@]}"
    run xcpu2 2 "${X[@]}" --context-parallel 2
    runx x1 0 "${X[@]}"
    SIMT_STEP_COUNTERS=1 runx x2 2 "${X[@]}" --context-parallel 2 --shard-group-size 2
    SIMT_SCHEDULE=random:7 runx x2b 2 "${X[@]}" --context-parallel 2 --shard-group-size 2
    runx x2ep 2 "${X[@]}" --context-parallel 2 --expert-parallel 2
    SIMT_STEP_COUNTERS=1 runx x4 4 "${X[@]}" --context-parallel 4 --shard-group-size 4
    SIMT_SCHEDULE=random:7 runx x4b 4 "${X[@]}" --context-parallel 4 --shard-group-size 4
    SIMT_STEP_COUNTERS=1 runx x4ep 4 "${X[@]}" --context-parallel 4 --expert-parallel 2
    # the ring (forward: K|V hops; backward: K|V and dK|dV hops, grouped send/recv beside the chunk pairs) against the former
    # all-gather of K|V + reduce-scatter of dK|dV: the same bits (the dK|dV sums' order differs, the BF16 gradients agree)
    DBRX_DEBUG_PLANT=cp_all_gather runx x2g 2 "${X[@]}" --context-parallel 2 --shard-group-size 2
    DBRX_DEBUG_PLANT=cp_all_gather runx x4g 4 "${X[@]}" --context-parallel 4 --shard-group-size 4
    DBRX_DEBUG_PLANT=cp_all_gather runx x4epg 4 "${X[@]}" --context-parallel 4 --expert-parallel 2
    $PY - "$tmp" > "$tmp/gpu" <<'PY'
import json, os, sys
tmp = sys.argv[1]
def losses(name, key="loss"):
    p = os.path.join(tmp, name + ".jsonl")
    return [json.loads(l)[key] for l in open(p) if '"loss"' in l] if os.path.exists(p) else []
def rel(a, b):
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=9) if len(a) == len(b) == 3 else 9
# the load-balancing loss: the group's on the GPU as on the CPU (the whole sequences' loss: one process's)
l1, lc2 = losses("x1", "lbl"), losses("xcpu2", "lbl")
for name, what in (("x2", "CP 2 with ZeRO-3"), ("x2ep", "CP 2 with EP 2"), ("x4", "CP 4 with ZeRO-3"), ("x4ep", "CP 4 with EP 2")):
    r1 = rel(losses(name, "lbl"), l1)
    print(("pass" if r1 <= 2e-3 and min(l1, default=0) > 0 else "fail") + f" --device cuda (emulated) {what}: load-balancing loss max rel. diff {r1:.1e} vs one GPU process (<= 2e-3)")
rc2 = rel(losses("x2", "lbl"), lc2)
print(("pass" if rc2 <= 2e-3 else "fail") + f" --device cuda (emulated) CP 2: load-balancing loss max rel. diff {rc2:.1e} vs the CPU CP 2 run (<= 2e-3)")
c, g1, g2, g2b = losses("xcpu"), losses("x1"), losses("x2"), losses("x2b")
ok = len(c) == len(g1) == len(g2) == 3
rg = max((abs(x - y) / y for x, y in zip(g2, g1)), default=9)
rc = max((abs(x - y) / y for x, y in zip(g2, c)), default=9)
print(("pass" if ok and rg <= 2e-3 else "fail") + f" --device cuda (emulated) CP 2 with ZeRO-3: 3 steps, max rel. diff {rg:.1e} vs one GPU process (<= 2e-3)")
for name, what in (("x2ep", "CP 2 with EP 2"), ("x4", "CP 4 with ZeRO-3"), ("x4ep", "CP 4 with EP 2")):
    ge = losses(name)
    re_ = max((abs(x - y) / y for x, y in zip(ge, g1)), default=9)
    print(("pass" if len(ge) == 3 and re_ <= 2e-3 else "fail") + f" --device cuda (emulated) {what}: max rel. diff {re_:.1e} vs one GPU process (<= 2e-3)")
print(("pass" if ok and rc < 1e-2 else "fail") + f" --device cuda (emulated) CP 2: max rel. diff {rc:.1e} vs one CPU process (< 1e-2)")
print(("pass" if ok and g2 == g2b else "fail") + " --device cuda (emulated) CP 2, two thread schedules: bit-identical losses")
same4 = all(len(losses("x4", key)) == 3 and losses("x4", key) == losses("x4b", key) for key in ("loss", "grad_norm"))
print(("pass" if same4 else "fail") + " --device cuda (emulated) CP 4 (the ring backward), two thread schedules: bit-identical losses and gradient norms")
for ring, gath, what in (("x2", "x2g", "CP 2"), ("x4", "x4g", "CP 4"), ("x4ep", "x4epg", "CP 4 with EP 2")):
    same = all(len(losses(ring, key)) == 3 and losses(ring, key) == losses(gath, key) for key in ("loss", "lbl", "grad_norm"))
    print(("pass" if same else "fail") + f" --device cuda (emulated) {what}: the ring's losses, lbl and gradient norms bit-identical to the all-gather form's")
# bytes per rank (NCCL's ring formulas), KVB = 1 x (64/N) x 2 x 2 x 32 elements: per layer, forward the all-gather (N-1) 2 KVB,
# backward the all-gather again and the reduce-scatter of dK|dV (N-1) 4 KVB; 2 layers, 3 steps
import re
# (the ring: forward N-1 K|V hops of 2 KVB bytes, backward N-1 K|V hops and N-1 dK|dV hops of 4 KVB: the collectives' volumes)
for name, N, what in (("x2", 2, "CP 2, the ring"), ("x2g", 2, "CP 2, the all-gather form"), ("x4", 4, "CP 4, the ring"),
                      ("x4g", 4, "CP 4, the all-gather form")):
    got = re.findall(r"^cp: rank \d+: .* sent (\d+) bytes", open(os.path.join(tmp, name + ".out")).read(), re.M)
    kvb = 1 * (64 // N) * 2 * 2 * 32
    want = 2 * 3 * ((N - 1) * 2 * kvb + (N - 1) * 2 * kvb + (N - 1) * 4 * kvb)
    print(("pass" if len(got) == N and all(int(g) == want for g in got) else "fail") + f" --device cuda (emulated) {what}: bytes per rank {sorted(set(got))} = the formula {want}")
PY
    verdicts "$tmp/gpu" 19
    # the memory plan (parallel/memory_plan.h's memory_plan_cp: the ring's two K|V slots, its dK|dV slots, the chunk pairs'
    # scratch, at T/N tokens per rank): the emulated peak per rank is the --dry-run plan's allocations within 0.1%; the plan
    # of the rank's tokens without the CP term (--seq 64/N, no CP) is not
    for spec in "x2 2 2 --shard-group-size 2" "x4 4 4 --shard-group-size 4" "x4ep 4 4 --expert-parallel 2"; do
        set -- $spec; name=$1 np=$2 N=$3; shift 3
        plan=$($EMU "${X[@]}" --context-parallel $N "$@" --dry-run --plan-gpus $np | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
        other=$($EMU "${X[@]}" --seq $((64 / N)) "$@" --dry-run --plan-gpus $np | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
        peak=$(sed -nE 's/^simt peak device memory: ([0-9]+) bytes.*/\1/p' "$tmp/$name.out" | sort -n | tail -1)
        $PY -c "import sys; p, q, t = map(int, sys.argv[1:]); sys.exit(0 if abs(t / p - 1) <= 1e-3 and abs(t / q - 1) > 1e-3 else 1)" \
            "${plan:-1}" "${other:-1}" "${peak:-0}" \
            && pass "--device cuda (emulated) CP $N ($name): the peak per rank $peak bytes is the --dry-run plan's $plan within 0.1% (without the CP term: $other)" \
            || fail "CP $N ($name): the emulated peak per rank '$peak' vs the plan '$plan' (0.1%), without the CP term '$other'"
    done
    # the ring's stream structure (the emulator's work log, test/check_comm_order.py cp_ring): CP 4, every K|V hop (forward
    # and backward) runs beside a chunk pair's flash kernel on the group's stream and a later pair waits for it, the
    # backward's dK|dV hops are waited for by the adds and beside a pair but each layer's last; the all-gather form has no hop
    W=(--model dbrx-tiny --n-layers 1 --seq 32 --steps 1 --val-every 0 --batch 1 --context-parallel 4)
    for plant in none cp_all_gather; do
        if [ $plant = none ]; then env_=(); else env_=(DBRX_DEBUG_PLANT=$plant); fi
        env "${env_[@]}" SIMT_WORKLOG="$tmp/wl_$plant" OMP_WAIT_POLICY=passive $MPI -np 4 $EMU --device cuda "${W[@]}" > "$tmp/wl_$plant.out" 2>&1 \
            || fail "work log run ($plant): $(tail -2 "$tmp/wl_$plant.out")"
        out=$($PY test/check_comm_order.py cp_ring "$tmp/wl_$plant.2" 2>&1); rc=$?
        if [ $plant = none ]; then [ $rc = 0 ] && pass "--device cuda (emulated) CP 4, rank 2: ${out#pass }" || fail "CP 4 ring streams: $out"
        else [ $rc = 1 ] && grep -q '^fail ' <<<"$out" && pass "the all-gather form fails the ring's stream check as it must: ${out#fail }" \
            || fail "the all-gather form's stream check did not fail (rc $rc): $out"; fi
    done
    # CP on the GPU runs the flash kernels: head_dim 48 (--d-model 96, 2 heads) refused, exit 2, named
    out=$(OMP_WAIT_POLICY=passive $MPI -np 2 $EMU --device cuda "${X[@]}" --d-model 96 --n-heads 2 --context-parallel 2 2>&1); rc=$?
    if [ "$rc" = 2 ] && grep -q -- "--context-parallel 2 on the GPU needs the flash kernels: head_dim 32, 64 or 128 (not 48)" <<<"$out"; then
        pass "--device cuda --context-parallel 2 at head_dim 48: exit 2, named"
    else fail "--device cuda --context-parallel 2 at head_dim 48: exit $rc: $(grep -i error <<<"$out" | head -2)"; fi
else
    echo "skipped: --context-parallel on the emulated GPU (no $EMU)"
fi

# --doc-mask under CP (parallel/context_parallel.h's cp_batch: the group's tokens give each row its document's first global
# position; the ring's masks compare the keys' global positions with it): byte shards of 3-40-token documents; CPU CP 2
# and CP 4 against one process within 1e-5, and not the unmasked CP 2's losses; on the emulated GPU (hd 32 and 128) CP 2
# and CP 4 against one GPU process within 2e-3, the ring's bits the all-gather form's
$PY - "$tmp" <<'PY'
import random, struct, sys
for name, n, seed in (("doc_train", 20000, 1), ("doc_val", 4000, 2)):
    r, toks = random.Random(seed), []
    while len(toks) < n:
        toks.append(256); toks += [r.randrange(256) for _ in range(r.randint(3, 40))]
    with open("%s/%s_000000.bin" % (sys.argv[1], name), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, 2, *([0] * 252)) + struct.pack("<%dH" % n, *toks[:n]))
PY
DM=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 3 --val-every 3 --val-steps 1 --batch 1 --data "$tmp/doc_train_*.bin"
    --val-data "$tmp/doc_val_*.bin" --doc-mask 256 --peak-tflops 1e-6)
run dm1 0 "${DM[@]}" --device cpu
run dm2 2 "${DM[@]}" --device cpu --context-parallel 2
run dm4 4 "${DM[@]}" --device cpu --context-parallel 4 --shard-group-size 4
run dm2_off 2 "${DM[@]:0:18}" --device cpu --context-parallel 2
if [ -x "$EMU" ]; then
    for hd in 32 128; do
        H=(); [ $hd = 128 ] && H=(--d-model 128 --n-heads 1 --kv-heads 1)
        runx "gdm1_$hd" 0 "${DM[@]}" "${H[@]}"
        runx "gdm2_$hd" 2 "${DM[@]}" "${H[@]}" --context-parallel 2
        DBRX_DEBUG_PLANT=cp_all_gather runx "gdm2g_$hd" 2 "${DM[@]}" "${H[@]}" --context-parallel 2
        runx "gdm4_$hd" 4 "${DM[@]}" "${H[@]}" --context-parallel 4 --shard-group-size 4
    done
fi
$PY - "$tmp" "$([ -x "$EMU" ] && echo gpu)" > "$tmp/docmask" <<'PY'
import json, os, sys
tmp, gpu = sys.argv[1], sys.argv[2] == "gpu"
def L(name):
    p = os.path.join(tmp, name + ".jsonl")
    return [json.loads(l).get("loss", json.loads(l).get("val_loss")) for l in open(p) if "loss" in l] if os.path.exists(p) else []
def rel(a, b):
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=9) if len(a) == len(b) >= 4 else 9
one = L("dm1")
for cp in ("dm2", "dm4"):
    r = rel(L(cp), one)
    print(("pass" if r <= 1e-5 else "fail") + f" --doc-mask, CPU CP {cp[2:]}: losses and the validation loss max rel. diff {r:.1e} vs one process (<= 1e-5)")
r = rel(L("dm2_off"), one)
print(("pass" if r > 1e-3 else "fail") + f" --doc-mask, CPU CP 2: the unmasked run's losses {r:.1e} away (the mask acts under CP)")
for hd in ((32, 128) if gpu else ()):
    g1 = L(f"gdm1_{hd}")
    for cp in ("gdm2", "gdm4"):
        r = rel(L(f"{cp}_{hd}"), g1)
        print(("pass" if r <= 2e-3 else "fail") + f" --doc-mask, emulated GPU head_dim {hd}, CP {cp[3:]}: max rel. diff {r:.1e} vs one GPU process (<= 2e-3)")
    same = L(f"gdm2_{hd}") == L(f"gdm2g_{hd}") != []
    print(("pass" if same else "fail") + f" --doc-mask, emulated GPU head_dim {hd}, CP 2: the ring's losses bit-identical to the all-gather form's")
# MFU counts attention as executed under CP too (each rank's share of its rows' causal pairs, averaged): the FLOPs per token
# each step's mfu implies, as mfu / mfu_foundry x the banner's Foundry count (their tok/s and peak cancel), are one
# process's, and below the banner's causal count
import re
def fps(name):
    out = open(os.path.join(tmp, name + ".out")).read()
    m = re.search(r"^(?:\[1,0\]<stdout>:)?mfu: ([0-9.e+]+) FLOPs/token.*mfu_foundry: ([0-9.e+]+) FLOPs/token", out, re.M)
    rows = [json.loads(l) for l in open(os.path.join(tmp, name + ".jsonl")) if '"mfu"' in l]
    return float(m.group(1)), [r["mfu"] / r["mfu_foundry"] * float(m.group(2)) for r in rows]
for names in (("dm1", "dm2", "dm4"),) + ((("gdm1_32", "gdm2_32", "gdm4_32"),) if gpu else ()):
    (causal, one), others = fps(names[0]), [fps(n)[1] for n in names[1:]]
    ok = len(one) == 3 and all(x < causal * (1 - 1e-3) for x in one) and all(
        len(o) == 3 and all(abs(a - b) <= 1e-6 * b for a, b in zip(o, one)) for o in others)
    print(("pass" if ok else "fail") + f" --doc-mask, {names[0]} vs CP 2 and 4: the FLOPs per token mfu counts are one process's "
          f"({[round(x) for x in one]} vs {[[round(x) for x in o] for o in others]}), below the causal {causal:.0f}")
PY
verdicts "$tmp/docmask" $([ -x "$EMU" ] && echo 11 || echo 4)

# bad degrees and combinations not supported yet: exit 2, one line
B=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 1 --device cpu)
expect_exit 2 "--context-parallel 0" $BIN "${B[@]}" --context-parallel 0
grep -q -- "--context-parallel 0 must be >= 1" <<<"$LAST_ERR" || fail "--context-parallel 0: the message names the flag and value"
expect_exit 2 "--context-parallel 3 with --seq 64 (not divisible by 6)" $BIN "${B[@]}" --context-parallel 3
expect_exit 2 "--context-parallel 2 with --sample-every" $BIN "${B[@]}" --context-parallel 2 --sample-every 1
expect_exit 2 "--context-parallel 2 on 1 rank" $BIN "${B[@]}" --context-parallel 2
expect_exit 2 "--dry-run --context-parallel 4 --plan-gpus 6" $BIN "${B[@]}" --dry-run --context-parallel 4 --plan-gpus 6
grep -q -- "--context-parallel 4 must divide the GPUs planned, 6" <<<"$LAST_ERR" || fail "--dry-run --context-parallel 4 --plan-gpus 6: the message names both"
out=$($MPI -np 3 $BIN "${B[@]}" --context-parallel 2 2>&1); rc=$?
if [ "$rc" = 2 ] && grep -q -- "--context-parallel 2 must divide the number of ranks 3" <<<"$out"; then pass "--context-parallel 2 on 3 ranks: exit 2, named"
else fail "--context-parallel 2 on 3 ranks: exit $rc: $(grep -i error <<<"$out" | head -2)"; fi
