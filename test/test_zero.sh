#!/usr/bin/env bash
# test_zero.sh — ZeRO-3 / HSDP / data parallel over MPI on the CPU (parallel/README.md):
#   * the communicator's collectives on uneven sizes, sub-groups and byte counters (comm_bench --selftest);
#   * np 1, 2, 3, 4 with ZeRO-3 (S = np), HSDP 2x2 (S = 2 of 4) and DDP (S = 1): 10 steps on the same
#     global batch give the same losses as one process (within 1e-5; np 1 bit-identical). The model has
#     d_model 130 and 15 experts so that no unit divides evenly by 3 or 4: the shards are padded;
#   * dbrx-tiny (2 layers), mpirun -np 4 --shard-group-size 2, the same losses as one process;
#   * per-rank memory of master weights + gradients + moments, measured as resident-set growth, is 1/S of
#     the one-process figure (within 3%);
#   * bytes sent per rank per step, counted by the communicator, equal the README's formula within 1%;
#   * a rank SIGKILLed mid-step: every other rank prints "lost rank R" and the job exits non-zero within
#     60 s; a rank that hangs (SIGSTOP): the job exits non-zero after --comm-timeout;
#   * --fp8-gather: each recipe's losses, grad norms and FP8 amax/scale bit-identical to --fp8 without it,
#     bytes sent per step as the README's formula with 1-byte FP8 pieces;
#   * --shard-group-size that does not divide the ranks: exit 2 with a clear message;
#   * the collective benchmark runs, checks its results, and --expect-busbw fails when a size falls short.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

# --- the communicator
for np in 3 4; do
    out=$($MPI -np $np dev/comm_bench --selftest 2>&1)
    if [ $? = 0 ] && grep -q "selftest: all passed" <<<"$out"; then pass "communicator selftest, $np ranks ($(grep -c '^ok' <<<"$out") checks)"
    else fail "communicator selftest, $np ranks: $(grep -v '^ok' <<<"$out" | head -5)"; fi
done

# --- equivalence with one process
U=(--model dbrx-tiny --n-layers 2 --d-model 130 --n-heads 5 --kv-heads 1 --experts 15 --seq 64 --steps 10 --val-every 0 --batch 1)
run1() {  # name, extra flags...: one process
    local name=$1; shift
    $BIN "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 || fail "$name: $(tail -2 "$tmp/$name.out")"
}
runp() {  # name, np, extra flags...
    local name=$1 np=$2; shift 2
    $MPI -np "$np" $BIN "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 || fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}
run1 ref4 "${U[@]}" --grad-accum 4
run1 ref3 "${U[@]}" --grad-accum 3
runp np1 1 "${U[@]}" --grad-accum 4
runp np2_zero 2 "${U[@]}" --grad-accum 2 --shard-group-size 2
runp np2_ddp 2 "${U[@]}" --grad-accum 2 --shard-group-size 1
runp np3_zero 3 "${U[@]}" --shard-group-size 3
runp np4_zero 4 "${U[@]}" --shard-group-size 4
runp np4_hsdp 4 "${U[@]}" --shard-group-size 2
runp np4_ddp 4 "${U[@]}" --shard-group-size 1
T=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 10 --val-every 0 --batch 1)
run1 tiny_ref "${T[@]}" --grad-accum 4
runp tiny_hsdp 4 "${T[@]}" --shard-group-size 2

$PY - "$tmp" <<'PY'
import json, os, re, sys
tmp = sys.argv[1]
def losses(name):
    p = os.path.join(tmp, name + ".jsonl")
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l] if os.path.exists(p) else []
checks = [("np1", "ref4", "np 1 (mpirun, S = 1) vs one process", 0.0),
          ("np2_zero", "ref4", "np 2 ZeRO-3 (S = 2, grad-accum 2) vs one process", 1e-5),
          ("np2_ddp", "ref4", "np 2 DDP (S = 1, grad-accum 2) vs one process", 1e-5),
          ("np3_zero", "ref3", "np 3 ZeRO-3 (S = 3, uneven shards) vs one process", 1e-5),
          ("np4_zero", "ref4", "np 4 ZeRO-3 (S = 4) vs one process", 1e-5),
          ("np4_hsdp", "ref4", "np 4 HSDP 2x2 (S = 2) vs one process", 1e-5),
          ("np4_ddp", "ref4", "np 4 DDP (S = 1) vs one process", 1e-5),
          ("tiny_hsdp", "tiny_ref", "dbrx-tiny mpirun -np 4 --shard-group-size 2 vs one process", 1e-5)]
with open(os.path.join(tmp, "results"), "w") as out:
    for name, ref, what, tol in checks:
        a, b = losses(name), losses(ref)
        ok = len(a) == len(b) == 10 and all(abs(x - y) <= tol for x, y in zip(a, b))
        diff = max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))
        kind = "bit-identical" if tol == 0 else "max |diff| %.1e <= %g" % (diff, tol)
        out.write("%s %s: 10 steps, %s\n" % ("pass" if ok else "fail", what, kind if ok else "max |diff| %.3g, %d vs %d steps" % (diff, len(a), len(b))))
PY
verdicts "$tmp/results" 8
grep -h "^step    10" "$tmp/ref4.out" | sed 's/^/   one process: /'

# --- memory: master + grads + moments per rank, measured, against the one-process figure / S
$PY - "$tmp" <<'PY' > "$tmp/mem"
import os, re, sys
tmp = sys.argv[1]
def mem(name):
    rows = re.findall(r"zero: rank (\d+): .*? (\d+) bytes allocated, (-?\d+) bytes measured", open(os.path.join(tmp, name + ".out")).read())
    return {int(r): (int(a), int(m)) for r, a, m in rows}
full = mem("np1")[0][1]
for name, S, world in [("np2_zero", 2, 2), ("np3_zero", 3, 3), ("np4_zero", 4, 4), ("np4_hsdp", 2, 4), ("np4_ddp", 1, 4)]:
    m = mem(name)
    ratios = [m[r][1] / (full / S) for r in sorted(m)]
    ok = len(m) == world and all(0.99 <= x <= 1.03 for x in ratios) and all(m[r][1] >= 0.99 * m[r][0] for r in m)
    print("%s %s: master+grads+moments per rank measured %s MiB = %s x (one process %.2f MiB / S=%d)" % (
        "pass" if ok else "fail", name, "/".join("%.2f" % (m[r][1] / 2**20) for r in sorted(m)),
        "/".join("%.3f" % x for x in ratios), full / 2**20, S))
PY
verdicts "$tmp/mem" 5

# --- bytes sent per rank per step against the formula of parallel/README.md
$PY - "$tmp" <<'PY' > "$tmp/bytes"
import os, re, sys
tmp = sys.argv[1]
def volume(d, L, V, E, F, H, kv, S, W, A, b=4):
    hd = d // H; qd = d + 2 * kv * hd
    pad = lambda n: S * -(-n // S)                      # n rounded up to a multiple of S
    # the units: wte; per block, the block without its experts and its experts (one run per tensor when
    # S divides E*F: no padding; else one padded run); norm_f + lm_head
    block = d + qd * d + d * d + d + E * d
    experts = 3 * E * F * d if (E * F) % S == 0 else pad(3 * E * F * d)
    Pb = L * (pad(block) + experts)
    P = pad(V * d) + Pb + pad(d + V * d)
    R = W // S
    return A * (S - 1) / S * b * (2 * P + Pb) + 2 * (R - 1) / R * b * P / S
U = dict(d=130, L=2, V=384, E=15, F=224, H=5, kv=1)
T = dict(d=128, L=2, V=384, E=16, F=224, H=4, kv=2)
for name, cfg, S, W, A in [("np2_zero", U, 2, 2, 2), ("np2_ddp", U, 1, 2, 2), ("np3_zero", U, 3, 3, 1),
                           ("np4_zero", U, 4, 4, 1), ("np4_hsdp", U, 2, 4, 1), ("np4_ddp", U, 1, 4, 1), ("tiny_hsdp", T, 2, 4, 1)]:
    want = volume(S=S, W=W, A=A, **cfg)
    got = {int(r): float(v) for r, v in re.findall(r"comm: rank (\d+) sent \d+ bytes in \d+ training steps \(([\d.]+) bytes/step\)",
                                                   open(os.path.join(tmp, name + ".out")).read())}
    ok = len(got) == W and all(abs(v / want - 1) < 0.01 for v in got.values())
    print("%s %s: bytes sent per rank per step %s, formula %.0f (S=%d, R=%d, grad-accum %d)" % (
        "pass" if ok else "fail", name, "/".join("%.0f" % got[r] for r in sorted(got)), want, S, W // S, A))
PY
verdicts "$tmp/bytes" 7

# --- --fp8-gather (parallel/zero_fp8.h): the blocks' FP8 matrices gathered as E4M3 codes. The codes
# are the ones the GEMMs use anyway, so every recipe gives the losses, gradient norms and FP8 amax/scale
# of the run without it, bit for bit (same world size), while the gathers send 1 byte per FP8 parameter.
G=(--steps 6 --fp8-log-every 1)
for cfg in "delayed 3 3" "current 4 2" "block 3 3"; do
    read -r recipe np S <<<"$cfg"
    runp f8_${recipe} "$np" "${U[@]}" "${G[@]}" --fp8 "$recipe" --shard-group-size "$S"
    runp f8g_${recipe} "$np" "${U[@]}" "${G[@]}" --fp8 "$recipe" --shard-group-size "$S" --fp8-gather
done
$PY - "$tmp" <<'PY' > "$tmp/fp8g"
import json, os, re, sys
tmp = sys.argv[1]
def log(name):
    p = os.path.join(tmp, name + ".jsonl")
    rows = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    steps = [(r["loss"], r["grad_norm"]) for r in rows if "loss" in r]
    # every tensor's amax and scale (the weights' saturated counts are counted once per step with the gather)
    fp8 = [{k: (v["amax"], v["scale"]) for k, v in r["fp8"].items()} for r in rows if "fp8" in r]
    return steps, fp8
def sent(name):
    return {int(r): float(v) for r, v in re.findall(r"comm: rank (\d+) sent \d+ bytes in \d+ training steps \(([\d.]+) bytes/step\)",
                                                   open(os.path.join(tmp, name + ".out")).read())}
# bytes per rank per step with the FP8 gather: the formula of parallel/README.md with each block's gather
# replaced by its packed pieces (1 byte per FP8-matrix element, 4 per other element, the longest piece
# over the ranks), plus the once-per-step amax all-reduce (as an all-gather) and saturation all-reduce
def volume_fp8(d, L, V, E, F, H, kv, S, W, A, recipe):
    hd = d // H; qd = d + 2 * kv * hd
    c = lambda n: -(-n // S)
    # a block's two units: (tensors (numel, FP8?), split into one run per tensor?)
    block = [(d, 0), (qd * d, 1), (d * d, 1), (d, 0), (E * d, 0)]
    experts = [(E * F * d, 1)] * 3
    split = (E * F) % S == 0
    def piece(tensors, per_tensor):   # the longest rank's packed shard: 1 byte per FP8 element, 4 per other
        runs = [[t] for t in tensors] if per_tensor else [tensors]
        best = 0
        for r in range(S):
            b = 0
            for run in runs:
                n_run = sum(n for n, _ in run); lo, hi, off = r * c(n_run), (r + 1) * c(n_run), 0
                for n, q in run:
                    b += max(0, min(hi, off + n) - max(lo, off)) * (1 if q else 4); off += n
            best = max(best, b)
        return best
    shard_block = c(sum(n for n, _ in block)) + (3 * c(E * F * d) if split else c(3 * E * F * d))
    cb = lambda rows, cols: -(-rows // 128) * -(-cols // 128)
    groups = L * ((cb(qd, d) + cb(d, d) + 3 * E * cb(F, d)) if recipe == "block" else 5)
    R = W // S
    P = S * (c(V * d) + c(d + V * d) + L * shard_block)
    return (A * ((S - 1) * 4 * (c(V * d) + c(d + V * d)) + 2 * L * (S - 1) * (piece(block, 0) + piece(experts, split))
                 + (S - 1) / S * 4 * P)
            + 2 * (R - 1) / R * 4 * P / S + (S - 1) * 4 * groups + 2 * (S - 1) / S * 8 * 5 * L)
U = dict(d=130, L=2, V=384, E=15, F=224, H=5, kv=1)
for recipe, np_, S in [("delayed", 3, 3), ("current", 4, 2), ("block", 3, 3)]:
    (a, fa), (b, fb) = log("f8_" + recipe), log("f8g_" + recipe)
    same = len(a) == 6 and a == b and len(fa) == 6 and fa == fb
    print("%s --fp8 %s, np %d S %d: with --fp8-gather losses, grad norms and every FP8 amax/scale of 6 steps %s" % (
        "pass" if same else "fail", recipe, np_, S, "bit-identical" if same else "differ: %s vs %s" % (a[:2], b[:2])))
    g, f = sent("f8g_" + recipe), sent("f8_" + recipe)
    want = volume_fp8(S=S, W=np_, A=1, recipe=recipe, **U)
    ok = len(g) == np_ and all(abs(v / want - 1) < 0.01 for v in g.values()) and max(g.values()) < min(f.values())
    print("%s --fp8 %s --fp8-gather: bytes sent per rank per step %s (formula %.0f), without: %s" % (
        "pass" if ok else "fail", recipe, "/".join("%.0f" % g[r] for r in sorted(g)), want, "/".join("%.0f" % f[r] for r in sorted(f))))
# the comparison can fail: FP8 off is not FP8 with the gather
off = log("np3_zero")[0][:6]
print("%s negative control: --fp8 delayed --fp8-gather differs from --fp8 off (%s vs %s)" % (
    "pass" if off and off != log("f8g_delayed")[0] else "fail", off[-1:], log("f8g_delayed")[0][-1:]))
PY
verdicts "$tmp/fp8g" 7
$MPI -np 2 $BIN "${U[@]}" --steps 1 --fp8-gather > "$tmp/bad.out" 2>&1; rc=$?
[ "$rc" = 2 ] && grep -q "error: --fp8-gather needs --fp8 delayed|current|block" "$tmp/bad.out" && pass "--fp8-gather without --fp8: exit 2" \
    || fail "--fp8-gather without --fp8: exit $rc: $(head -2 "$tmp/bad.out")"
$MPI -np 2 $BIN "${U[@]}" --steps 1 --fp8 current --fp8-gather --shard-group-size 1 > "$tmp/ddp.out" 2>&1; rc=$?
[ "$rc" = 0 ] && grep -q "note: --fp8-gather has no effect with --shard-group-size 1" "$tmp/ddp.out" && pass "--fp8-gather under DDP: runs, says it has no effect" \
    || fail "--fp8-gather under DDP: exit $rc: $(grep -v '^step' "$tmp/ddp.out" | head -3)"

# --- a lost rank: SIGKILL mid-step; no hang, every survivor names it
lost_rank_test() {  # np, S, victim, step
    local np=$1 S=$2 victim=$3 step=$4 t0 rc dt
    t0=$(date +%s)
    DBRX_DEBUG_KILL=$victim:$step timeout 120 $MPI -np "$np" $BIN "${U[@]}" --shard-group-size "$S" > "$tmp/kill.out" 2>&1
    rc=$?; dt=$(( $(date +%s) - t0 ))
    local named=0 r
    for r in $(seq 0 $((np - 1))); do
        [ "$r" = "$victim" ] && continue
        grep -q "error: rank $r: lost rank $victim " "$tmp/kill.out" && named=$((named + 1))
    done
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 60 ] && [ "$named" = $((np - 1)) ]; then
        pass "rank $victim of $np SIGKILLed in step $step: all $named survivors name it, exit $rc after ${dt} s"
    else fail "rank $victim of $np SIGKILLed: exit $rc after ${dt} s, $named of $((np - 1)) survivors named it: $(grep -i "error\|lost" "$tmp/kill.out" | head -5)"; fi
}
lost_rank_test 4 2 1 3
lost_rank_test 2 2 0 2
t0=$(date +%s)
DBRX_DEBUG_KILL=1:2:stop timeout 120 $MPI -np 2 $BIN "${U[@]}" --comm-timeout 5 > "$tmp/hang.out" 2>&1; rc=$?; dt=$(( $(date +%s) - t0 ))
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 60 ] && grep -q "made no progress for .* waiting for rank 1" "$tmp/hang.out"; then
    pass "a hung rank (SIGSTOP): exit $rc after ${dt} s, watchdog names the rank waited for"
else fail "a hung rank: exit $rc after ${dt} s: $(grep -i error "$tmp/hang.out" | head -3)"; fi

# --- topology errors
$MPI -np 4 $BIN "${U[@]}" --shard-group-size 3 > "$tmp/bad.out" 2>&1; rc=$?
if [ "$rc" = 2 ] && grep -q "error: --shard-group-size 3 must divide the number of ranks 4" "$tmp/bad.out"; then pass "world % S != 0: exit 2 ($(grep error: "$tmp/bad.out" | head -1 | cut -c1-90)...)"
else fail "world % S != 0: exit $rc: $(head -3 "$tmp/bad.out")"; fi
$MPI -np 2 $BIN "${U[@]}" --shard-group-size 4 > "$tmp/bad.out" 2>&1; rc=$?
[ "$rc" = 2 ] && grep -q "must divide the number of ranks 2" "$tmp/bad.out" && pass "S > world: exit 2" || fail "S > world: exit $rc"
expect_exit 2 "negative --shard-group-size" $BIN --shard-group-size -1 --dry-run

# --- the collective benchmark: results checked, and the health check
out=$($MPI -np 2 dev/comm_bench -b 8 -e 1M -n 2 -w 1 2>&1); rc=$?
rows=$(grep -cE "^ +[0-9]+ +[0-9]+ " <<<"$out")
if [ "$rc" = 0 ] && [ "$rows" = 72 ] && ! grep -q FAILED <<<"$out"; then pass "comm_bench: 4 collectives (all_to_all included) x 18 sizes (8 B..1 MiB), every result correct"
else fail "comm_bench: exit $rc, $rows rows: $(tail -3 <<<"$out")"; fi
out=$($MPI -np 2 dev/comm_bench --op all_reduce -b 1M -e 1M -n 2 -w 1 --expect-busbw 1000000 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "1 size(s) below the expected busbw" <<<"$out" && pass "comm_bench --expect-busbw: exit 1 when a size falls short" \
    || fail "comm_bench --expect-busbw (short): exit $rc: $(tail -2 <<<"$out")"
out=$($MPI -np 2 dev/comm_bench --op all_gather -b 1M -e 1M -n 2 -w 1 --expect-busbw 0.000001 2>&1); rc=$?
[ "$rc" = 0 ] && grep -q "0 size(s) below" <<<"$out" && pass "comm_bench --expect-busbw: exit 0 when every size meets it" \
    || fail "comm_bench --expect-busbw (met): exit $rc: $(tail -2 <<<"$out")"
