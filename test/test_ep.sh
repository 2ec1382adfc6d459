#!/usr/bin/env bash
# test_ep.sh — expert parallelism (--expert-parallel N; parallel/expert_parallel.h's exchange, parallel/zero.h's placement):
#   * mpirun -np 4 with EP 2 and EP 4 under ZeRO-3 (S = 4), EP 2 under HSDP 2x2, and EP 2 and EP 4 under
#     data parallelism (S = 1: the non-expert weights replicated, each rank its experts whole), against one
#     process with the same global batch: losses within 1e-5; under data parallelism each rank's state is
#     16 B x (P - P_experts x (N-1)/N), from the model's shape;
#   * a forced extreme imbalance (DBRX_DEBUG_ROUTE_FIRST: every token to experts 0..k-1, all EP rank 0's)
#     trains without losing a token: rank 0 receives every routed row, the others none, no error;
#   * the bytes each rank sends in its EP group equal the formula from its routing counts, exactly:
#     count messages x E x 4 B (every rank's counts to every peer) + 2 x d x 4 B x (rows out + rows in)  (forward rows and results back,
#     backward gradients and input gradients back);
#   * a checkpoint under EP 4 resumes bit-identically under EP 4, within 1e-5 under EP 2, one process and
#     data parallel EP 2; one under data parallel EP 2 (saved as ZeRO-3 over the EP group: each parameter
#     once) bit-identically under the same, within 1e-5 under EP 4 (ZeRO-3) and one process;
#   * the emulated CUDA path (NCCL twin): EP 2 and EP 4 give the losses of the run without EP (BF16 bound
#     2e-3; measured identical), under ZeRO-3 and under data parallelism, its bytes match the formula with
#     BF16 rows and BF16 input gradients (2 x d x 2 B x (rows out + rows in): half the CPU's), and EP 4 and data parallel EP 2 checkpoints resume bit-identically;
#   * --export-hf under data parallel EP 2 holds one process's weights (within 1e-5);
#   * generation under EP (the decode step's rows through the exchange): --generate under EP 4 (ZeRO-3) and
#     data parallel EP 2 writes one process's text; on the emulated GPU --sample-every under data parallel
#     EP 2 samples the text of the run without EP;
#   * the step line and the log carry the rows received per rank (max, mean);
#   * --fp8 with EP: block scaling's step 1 (loss, every operand's amax) is that of FP8 without EP, later
#     steps within 2e-3 (CPU: EP 2 ZeRO-3 and data parallel EP 4; emulated GPU: data parallel EP 2); under
#     delayed scaling every weight's step-1 amax equals that without EP (CPU);
#   * --fp8-gather with EP (the experts' E4M3 codes gathered in the expert shard group, with the whole
#     tensors' scales): every weight's step-1 amax/scale/saturation equals the run without EP (delayed and
#     block; CPU: EP 2 ZeRO-3 and HSDP 2x2; emulated GPU: block ZeRO-3, where step 1's loss and every
#     operand's amax are exact too, and delayed HSDP 2x2), later steps within 2e-3; block under EP 2 with
#     the gather bit-identical to without; delayed without the gather (the rank's own experts' scales) is
#     farther from the run without EP (negative control); the bytes the experts' gathers save (3 per element
#     over S/N - 1 peers), exactly on every rank; a save resumes bit-identically (CPU and emulated GPU); under
#     data parallel EP 2 nothing is gathered (a note, bit-identical to without);
#   * --ep-layout spread (EP groups strided, the expert shard group consecutive): np 4, S 4, EP 2 against one
#     process (1e-5, CPU) and the run without EP (emulated GPU, 2e-3; measured identical); the bytes of every rank
#     (the exchange's formula in the EP group, outside it exactly packed's); the groups of every collective from
#     the emulator's work log; a spread checkpoint resumes spread (bit-identical), packed and by one process, a
#     packed one spread (1e-5); emulated GPU --fp8 block --fp8-gather under spread: step 1 exactly the run without EP;
#   * bad degrees (not dividing the experts, the shard group, the ranks under data parallelism; spread where
#     S <= N) and a bad --ep-layout exit 2 with one line.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
T=(--model dbrx-tiny --n-layers 2 --seq 64 --val-every 0 --batch 1 --steps 6)

losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"; }
# close NAME TOL A B: the losses of logs A and B (B may be two resumed parts appended) within TOL
close() {
    $PY - "$@" <<'PY'
import json, sys
name, tol, a, b = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
def L(f):
    d = {}
    for l in open(f):
        r = json.loads(l)
        if "loss" in r: d[r["step"]] = r["loss"]
    return [d[s] for s in sorted(d)]
x, y = L(a), L(b)
diff = max(abs(p - q) for p, q in zip(x, y)) if x and len(x) == len(y) else float("inf")
ok = diff <= tol if tol > 0 else x == y
print("%s %s: %d steps, max |diff| %.1e %s %g" % ("pass" if ok else "fail", name, len(y), diff, "<=" if tol > 0 else "==", tol))
PY
}
verdict() { local r; r=$(close "$@"); [ "${r%% *}" = pass ] && pass "${r#* }" || fail "${r#* }"; }

$BIN "${T[@]}" --grad-accum 4 --log "$tmp/one.jsonl" --export-dtype fp32 --export-hf "$tmp/hf_one" > "$tmp/one.out" 2>&1 \
    || fail "one process: $(tail -2 "$tmp/one.out")"
for cfg in "2 4" "4 4" "2 2" "2 1" "4 1"; do
    set -- $cfg
    name="np 4 EP $1 (shard group $2$([ "$2" = 1 ] && echo ": data parallel"))"
    hf=(); [ "$1 $2" = "2 1" ] && hf=(--export-dtype fp32 --export-hf "$tmp/hf_ep2_1")   # (written by the EP group's ranks, below)
    $MPI -np 4 $BIN "${T[@]}" --expert-parallel "$1" --shard-group-size "$2" "${hf[@]}" --log "$tmp/ep$1_$2.jsonl" > "$tmp/ep$1_$2.out" 2>&1 \
        || fail "$name: $(grep -i error "$tmp/ep$1_$2.out" | head -2)"
    verdict "$name vs one process" 1e-5 "$tmp/one.jsonl" "$tmp/ep$1_$2.jsonl"
done
grep -q '"ep_recv_max": [0-9]*, "ep_recv_mean": [0-9.]*' "$tmp/ep2_4.jsonl" && grep -q "| ep recv [0-9.]*x |" "$tmp/ep2_4.out" \
    && pass "the rows received per rank (max, mean) are on the step line and in the log" || fail "EP receive statistics missing"

# --- the Hugging Face export under data parallel EP 2 (each of the EP group's ranks writes its experts) holds
# one process's weights
$PY - "$tmp/hf_one/model.safetensors" "$tmp/hf_ep2_1/model.safetensors" <<'PY' > "$tmp/hf"
import array, json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        a = array.array("f"); a.frombytes(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]); out[k] = a
    return out
A, B = load(sys.argv[1]), load(sys.argv[2])
d = max(max(abs(x - y) for x, y in zip(A[k], B[k])) for k in A) if A.keys() == B.keys() else float("inf")
print("%s --export-hf under np 4 data parallel EP 2: %d tensors, max |diff| %.1e <= 1e-5 against one process's export" % (
    "pass" if d <= 1e-5 else "fail", len(B), d))
PY
verdicts "$tmp/hf" 1

# --- the state each rank holds under data parallelism with EP: all but (N-1)/N of the experts; and what
# --dry-run says it will be before any rank exists
for n in 2 4; do $BIN "${T[@]}" --shard-group-size 1 --expert-parallel "$n" --dry-run > "$tmp/dry_$n.out" 2>&1; done
$PY - "$tmp/one.out" "$tmp/ep2_1.out" "$tmp/ep4_1.out" "$tmp/dry_2.out" "$tmp/dry_4.out" <<'PY' > "$tmp/state"
import re, sys
L, d, E, F = 2, 128, 16, 224   # dbrx-tiny with --n-layers 2
state = lambda p: [int(b) for b in re.findall(r"master\+grads\+moments (\d+) bytes allocated", open(p).read())]
P = state(sys.argv[1])[0] // 16
for path, dry, n in ((sys.argv[2], sys.argv[4], 2), (sys.argv[3], sys.argv[5], 4)):
    want = 16 * (P - L * 3 * E * F * d * (n - 1) // n)
    got = state(path)
    print("%s data parallel EP %d: every rank's state is 16 B x (P - P_experts x %d/%d) = %d bytes: %s" % (
        "pass" if len(got) == 4 and all(g == want for g in got) else "fail", n, n - 1, n, want, got))
    m = re.search(r"16 B/param of this rank's shard \(([\d,]+) of", open(dry).read())
    said = 16 * int(m.group(1).replace(",", "")) if m else None
    print("%s --dry-run --shard-group-size 1 --expert-parallel %d: the state per rank it announces, %s bytes, is the one allocated" % (
        "pass" if said == want else "fail", n, said))
PY
verdicts "$tmp/state" 4

# --- the bytes of the exchange, from each rank's own counts
$PY - "$tmp/ep2_4.out" "$tmp/ep2_2.out" "$tmp/ep2_1.out" <<'PY' > "$tmp/bytes"
import re, sys
d, E, f = 128, 16, 4
# (data parallel: + the gradient norm's expert part, one float64 all-reduced in the EP group per step, 2 (N-1)/N x 8 B)
for path, n, norm in ((sys.argv[1], 2, 0), (sys.argv[2], 2, 0), (sys.argv[3], 2, 6 * 8)):
    rows = re.findall(r"ep: rank (\d+) sent (\d+) bytes in its expert-parallel group: (\d+) count messages, (\d+) rows out, (\d+) rows in",
                      open(path).read())
    ok = len(rows) == 4
    for r, b, c, o, i in rows:
        want = int(c) * E * 4 + 2 * d * f * (int(o) + int(i)) + norm
        ok = ok and int(b) == want
    print("%s EP %d (%s): bytes sent in the EP group equal counts x E x 4 + 2 x d x 4 x (rows out + in)%s on every rank: %s" % (
        "pass" if ok else "fail", n, path.split("/")[-1], " + 6 x 8 (norm)" if norm else "",
        ", ".join("rank %s %s" % (r, b) for r, b, *_ in rows)))
PY
verdicts "$tmp/bytes" 3

# --- a forced extreme imbalance: every token to EP rank 0's experts
DBRX_DEBUG_ROUTE_FIRST=1 $MPI -np 4 $BIN "${T[@]}" --expert-parallel 4 --log "$tmp/imb.jsonl" > "$tmp/imb.out" 2>&1; rc=$?
r0=$(grep -o "ep: rank 0 sent .*" "$tmp/imb.out"); others=$(grep -c "ep: rank [123] sent .* 0 rows in$" "$tmp/imb.out")
# 6 steps x 2 layers x 4 ranks x 64 tokens x top-4 rows reach rank 0, 3/4 of them from the other ranks
if [ "$rc" = 0 ] && [ "$others" = 3 ] && grep -q ", $((6 * 2 * 3 * 64 * 4)) rows in$" <<<"$r0" && [ "$(grep -c '"loss"' "$tmp/imb.jsonl")" = 6 ] \
    && ! grep -q "nan" "$tmp/imb.jsonl"; then
    pass "forced imbalance (every token to EP rank 0's experts): 6 steps, rank 0 took all $((6 * 2 * 3 * 64 * 4)) rows from its peers, the others none, finite losses"
else fail "forced imbalance: exit $rc: $r0; $(grep -i error "$tmp/imb.out" | head -2)"; fi

# --- checkpoints: saved under EP 4, resumed under EP 4 (bit-identical), EP 2 and one process (1e-5)
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 4 --ckpt-dir "$tmp/ck" --stop-after 3 --log "$tmp/part.jsonl" > "$tmp/part.out" 2>&1 \
    || fail "EP 4 save: $(grep -i error "$tmp/part.out" | head -2)"
grep -q '"expert_parallel": 4' "$tmp/ck/step_00000003/manifest.json" || fail "the manifest does not record expert_parallel 4"
# resume SRC EP S [LAYOUT]: the checkpoint in $tmp/SRC (step 3) resumed under EP degree EP, shard group S (EP 1: one
# process), --ep-layout LAYOUT (default packed)
resume() {
    local to="$1_$2_$3${4:+_$4}"
    cp -r "$tmp/$1" "$tmp/ck_$to"; cp "$tmp/$1.jsonl" "$tmp/res_$to.jsonl"
    if [ "$2" = 1 ]; then $BIN "${T[@]}" --grad-accum 4 --ckpt-dir "$tmp/ck_$to" --resume auto --log "$tmp/res_$to.jsonl" > "$tmp/res_$to.out" 2>&1
    else $MPI -np 4 $BIN "${T[@]}" --expert-parallel "$2" --shard-group-size "$3" --ep-layout "${4:-packed}" --ckpt-dir "$tmp/ck_$to" --resume auto \
        --log "$tmp/res_$to.jsonl" > "$tmp/res_$to.out" 2>&1; fi
    grep -q "resume: .*step_00000003" "$tmp/res_$to.out" || fail "$1 resumed under EP $2 S $3: $(grep -iE 'error|warning' "$tmp/res_$to.out" | head -2)"
}
cp "$tmp/part.jsonl" "$tmp/ck.jsonl"
for to in "4 4" "2 4" "1 1" "2 1"; do resume ck $to; done
verdict "EP 4 checkpoint resumed under EP 4 (3 + 3 steps) vs uninterrupted EP 4" 0 "$tmp/ep4_4.jsonl" "$tmp/res_ck_4_4.jsonl"
verdict "EP 4 checkpoint resumed under EP 2 vs uninterrupted" 1e-5 "$tmp/ep4_4.jsonl" "$tmp/res_ck_2_4.jsonl"
verdict "EP 4 checkpoint resumed by one process (no EP) vs uninterrupted" 1e-5 "$tmp/ep4_4.jsonl" "$tmp/res_ck_1_1.jsonl"
verdict "EP 4 checkpoint resumed under data parallel EP 2 vs uninterrupted" 1e-5 "$tmp/ep4_4.jsonl" "$tmp/res_ck_2_1.jsonl"
# saved under data parallel EP 2: the files are those of ZeRO-3 over the EP group (2 shards, each parameter once)
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 2 --shard-group-size 1 --ckpt-dir "$tmp/dk" --stop-after 3 --log "$tmp/dk.jsonl" > "$tmp/dk.out" 2>&1 \
    || fail "data parallel EP 2 save: $(grep -i error "$tmp/dk.out" | head -2)"
[ "$(ls "$tmp/dk/step_00000003" | grep -c '^shard_')" = 2 ] && grep -q '"shard_group_size": 2, "replicas": 2, .*"expert_parallel": 2' "$tmp/dk/step_00000003/manifest.json" \
    && pass "data parallel EP 2 saves 2 shard files (ZeRO-3 over the EP group: each parameter once)" \
    || fail "data parallel EP 2 checkpoint files: $(ls "$tmp/dk/step_00000003")"
for to in "2 1" "4 4" "1 1"; do resume dk $to; done
verdict "data parallel EP 2 checkpoint resumed under the same (3 + 3 steps) vs uninterrupted" 0 "$tmp/ep2_1.jsonl" "$tmp/res_dk_2_1.jsonl"
verdict "data parallel EP 2 checkpoint resumed under EP 4 (ZeRO-3) vs uninterrupted" 1e-5 "$tmp/ep2_1.jsonl" "$tmp/res_dk_4_4.jsonl"
verdict "data parallel EP 2 checkpoint resumed by one process vs uninterrupted" 1e-5 "$tmp/ep2_1.jsonl" "$tmp/res_dk_1_1.jsonl"

# --- --ep-layout spread (parallel/shard_runs.h): EP rank = layout rank / Q (Q = S/N), the expert shard group Q
# consecutive ranks, the EP group strided by Q; at np 4, S 4, EP 2: EP groups {0, 2} {1, 3}, expert shard groups
# {0, 1} {2, 3} (the emulated GPU's work log checks the groups below). One process's losses within 1e-5; every rank
# sends, outside its EP group, exactly what the packed layout's rank sends (the same group sizes and pieces), and in
# it the exchange's formula; a spread checkpoint resumes packed and by one process, a packed one spread (1e-5), and
# the manifest records the layout
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 2 --ep-layout spread --log "$tmp/sp.jsonl" > "$tmp/sp.out" 2>&1 || fail "EP 2 spread: $(grep -i error "$tmp/sp.out" | head -2)"
verdict "np 4 EP 2 --ep-layout spread (shard group 4) vs one process" 1e-5 "$tmp/one.jsonl" "$tmp/sp.jsonl"
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 2 --ep-layout spread --ckpt-dir "$tmp/sk" --stop-after 3 --log "$tmp/sk.jsonl" > "$tmp/sk.out" 2>&1 \
    || fail "EP 2 spread save: $(grep -i error "$tmp/sk.out" | head -2)"
grep -q '"expert_parallel": 2, .*"ep_layout": "spread"' "$tmp/sk/step_00000003/manifest.json" && ! grep -q ep_layout "$tmp/ck/step_00000003/manifest.json" \
    && pass "the manifest records --ep-layout spread (a packed one has no ep_layout: packed)" || fail "manifest ep_layout: $(grep -o '"ep_layout[^,]*' "$tmp/sk/step_00000003/manifest.json")"
for to in "2 4 spread" "2 4" "1 1"; do resume sk $to; done
verdict "EP 2 spread checkpoint resumed spread (3 + 3 steps) vs uninterrupted" 0 "$tmp/sp.jsonl" "$tmp/res_sk_2_4_spread.jsonl"
verdict "EP 2 spread checkpoint resumed packed vs uninterrupted" 1e-5 "$tmp/sp.jsonl" "$tmp/res_sk_2_4.jsonl"
verdict "EP 2 spread checkpoint resumed by one process vs uninterrupted" 1e-5 "$tmp/sp.jsonl" "$tmp/res_sk_1_1.jsonl"
resume ck 2 4 spread
verdict "EP 4 packed checkpoint resumed under EP 2 spread vs uninterrupted" 1e-5 "$tmp/ep4_4.jsonl" "$tmp/res_ck_2_4_spread.jsonl"
$PY - "$tmp/sp.out" "$tmp/ep2_4.out" <<'PY' > "$tmp/spbytes"
import re, sys
d, E, f = 128, 16, 4
def sent(p):
    t = open(p).read()
    ep = {int(r): (int(b), int(c), int(o), int(i)) for r, b, c, o, i in
          re.findall(r"ep: rank (\d+) sent (\d+) bytes in its expert-parallel group: (\d+) count messages, (\d+) rows out, (\d+) rows in", t)}
    tot = {int(r): int(b) for r, b in re.findall(r"comm: rank (\d+) sent (\d+) bytes in \d+ training steps", t)}
    return ep, tot
(se, st), (pe, pt) = sent(sys.argv[1]), sent(sys.argv[2])
ok = len(se) == len(st) == len(pe) == len(pt) == 4
ok = ok and all(se[r][0] == se[r][1] * E * 4 + 2 * d * f * (se[r][2] + se[r][3]) for r in range(4))
ok = ok and all(st[r] - se[r][0] == pt[r] - pe[r][0] for r in range(4))
print("%s EP 2 spread: bytes in the EP group = counts x E x 4 + 2 x d x 4 x (rows out + in), and outside it those of packed, on every rank: %s" % (
    "pass" if ok else "fail", ", ".join("rank %d %s + %s" % (r, se[r][0] if r in se else "?", st[r] - se[r][0] if r in se and r in st else "?") for r in range(4))))
PY
verdicts "$tmp/spbytes" 1

# --- generation under EP: the decode step's rows go through the exchange; the same weights (the EP 4 run's
# step 6) give one process's text under EP 4 (ZeRO-3) and data parallel EP 2 (temperature 0.8: every token a draw)
GEN=(--model dbrx-tiny --n-layers 2 --seq 64 --generate --resume "$tmp/ck_ck_4_4/step_00000006" --prompt The --sample-len 24 --temperature 0.8)
$BIN "${GEN[@]}" > "$tmp/gen1.txt" 2> "$tmp/gen1.err" || fail "generate, one process: $(tail -1 "$tmp/gen1.err")"
for cfg in "4 4" "2 1"; do
    set -- $cfg
    $MPI -np 4 $BIN "${GEN[@]}" --expert-parallel "$1" --shard-group-size "$2" > "$tmp/gen_$1_$2.txt" 2> "$tmp/gen_$1_$2.err" \
        || fail "generate under EP $1 S $2: $(grep -i error "$tmp/gen_$1_$2.err" | head -1)"
    [ -s "$tmp/gen1.txt" ] && cmp -s "$tmp/gen1.txt" "$tmp/gen_$1_$2.txt" && grep -q "generate: 24 tokens" "$tmp/gen_$1_$2.err" \
        && pass "--generate under np 4 EP $1 (shard group $2): 24 tokens, the text of one process" \
        || fail "--generate under EP $1 S $2: $(od -c "$tmp/gen_$1_$2.txt" | head -2) vs $(od -c "$tmp/gen1.txt" | head -2)"
done

# --- FP8 with EP (the CPU path): the operands over the local experts and the received rows, the per-tensor
# amaxes max-reduced over the world. Block scaling's forward tiles (1x128 rows, 128x128 per expert) do not
# depend on where a row is computed: step 1's loss and every forward operand's amax (x, w) are those of FP8
# without EP (FP8 against FP32 differs by ~3e-3 at step 1); later steps differ within FP8's rounding (the 128x1
# wgrad tiles group other rows). The backward's gradient amaxes (dy) within 1e-2: EP's fp32 sums are not the
# same bits as one process's (the step-1 loss differs by ~1e-8 in FP32 too), and one E5M2 code rounded the other
# way upstream moves a dy's amax by ~1e-3 (session 43: qkv.dy 2.0e-3 after the builds stopped fusing FMAs).
# Delayed scaling: each weight's amax (a rank sees only its experts) is the whole tensor's, as without EP.
F8=(--model dbrx-tiny --n-layers 2 --seq 64 --val-every 0 --batch 1 --steps 4 --fp8-log-every 1)
for run in "block 1 4" "block 2 4" "block 4 1" "delayed 1 4" "delayed 2 1" "delayed 2 4"; do
    set -- $run
    $MPI -np 4 $BIN "${F8[@]}" --fp8 "$1" --expert-parallel "$2" --shard-group-size "$3" --log "$tmp/f8_$1_$2_$3.jsonl" > "$tmp/f8_$1_$2_$3.out" 2>&1 \
        || fail "--fp8 $1 EP $2 S $3: $(grep -i error "$tmp/f8_$1_$2_$3.out" | head -2)"
done
$PY - "$tmp" <<'PY' > "$tmp/f8"
import json, sys
t = sys.argv[1]
def L(name):
    loss, fp8 = {}, {}
    for l in open("%s/f8_%s.jsonl" % (t, name)):
        r = json.loads(l)
        if "loss" in r: loss[r["step"]] = r["loss"]
        if "fp8" in r: fp8[r["step"]] = {k: v["amax"] for k, v in r["fp8"].items()}
    return [loss[s] for s in sorted(loss)], fp8
b0, fb0 = L("block_1_4")
for name, what in (("block_2_4", "EP 2 (ZeRO-3)"), ("block_4_1", "data parallel EP 4")):
    b, fb = L(name)
    d1 = abs(b[0] - b0[0]); dn = max(abs(x - y) for x, y in zip(b, b0)) if len(b) == len(b0) == 4 else 1
    same = fb0.get(1) and fb.get(1) and sorted(fb[1]) == sorted(fb0[1])
    rel = lambda grads: max([abs(fb[1][k] - fb0[1][k]) / fb0[1][k] for k in fb0[1] if k.endswith(".dy") == grads] or [1]) if same else 1
    am, ag = rel(False), rel(True)
    ok = d1 <= 1e-6 and am <= 1e-5 and ag <= 1e-2 and dn <= 2e-3
    print("%s --fp8 block np 4 %s vs without EP: step 1 loss |diff| %.1e <= 1e-6, its %d amaxes: forward within %.1e <= 1e-5, gradients %.1e <= 1e-2 (relative), 4 steps within %.1e <= 2e-3" % (
        "pass" if ok else "fail", what, d1, len(fb0.get(1, {})), am, ag, dn))
_, fd0 = L("delayed_1_4"); _, fd = L("delayed_2_1")
w = [k for k in fd0.get(1, {}) if k.endswith(".w")]
ok = len(w) == 10 and all(fd[1][k] == fd0[1][k] for k in w)
print("%s --fp8 delayed np 4 data parallel EP 2: step 1's amax of all %d weights (each rank quantises only its experts) equals that without EP" % (
    "pass" if ok else "fail", len(w)))
PY
verdicts "$tmp/f8" 3

# --- --fp8-gather with EP (the CPU path, parallel/zero_fp8.h): a block's experts travel as E4M3 codes in the
# expert shard group, into the compact slot of the rank's experts, quantised with the scales of the whole
# tensors (their amaxes agreed in the shard group, which holds every expert once): the weights gathered are
# those the run without EP gathers. Exact: every weight's step-1 amax, scale and saturation count (the log);
# block scaling (per-expert weight blocks) also gives the losses of EP without the gather bit for bit, and
# step 1's loss of the run without EP within 1e-6 (FP32 sums in another order). Later steps within 2e-3:
# FP8's rounding of the activations, which under EP a rank quantises over the rows it received (delayed's
# step-1 activation scales; block's 128x1 wgrad tiles). Negative control: without the gather, delayed
# scaling under EP quantises step 1's weights with the amax of the rank's own experts: another step-1 loss.
# Bytes: the non-expert units save what they save without EP; the experts save 3 bytes per element over
# S/N - 1 peers instead of S - 1. Data parallel EP 2: nothing to gather, bit-identical to without, a note.
for run in "block 1 4" "block 2 4" "delayed 1 4" "delayed 2 4" "delayed 1 2" "delayed 2 2" "delayed 2 1"; do
    set -- $run
    $MPI -np 4 $BIN "${F8[@]}" --fp8 "$1" --fp8-gather --expert-parallel "$2" --shard-group-size "$3" --log "$tmp/g8_$1_$2_$3.jsonl" \
        > "$tmp/g8_$1_$2_$3.out" 2>&1 || fail "--fp8 $1 --fp8-gather EP $2 S $3: $(grep -i error "$tmp/g8_$1_$2_$3.out" | head -2)"
done
# saved after 2 steps under EP 2 ZeRO-3 with --fp8 delayed --fp8-gather, resumed under the same
$MPI -np 4 $BIN "${F8[@]}" --fp8 delayed --fp8-gather --expert-parallel 2 --ckpt-dir "$tmp/g8k" --stop-after 2 --log "$tmp/g8res.jsonl" > "$tmp/g8res.out" 2>&1
$MPI -np 4 $BIN "${F8[@]}" --fp8 delayed --fp8-gather --expert-parallel 2 --ckpt-dir "$tmp/g8k" --resume auto --log "$tmp/g8res.jsonl" > "$tmp/g8res2.out" 2>&1
verdict "--fp8 delayed --fp8-gather EP 2 (ZeRO-3): 2 + save + resume + 2 steps vs uninterrupted" 0 "$tmp/g8_delayed_2_4.jsonl" "$tmp/g8res.jsonl"
grep -q "note: --fp8-gather has no effect with --shard-group-size 1: every rank holds its units whole (with --expert-parallel, its experts)" \
    "$tmp/g8_delayed_2_1.out" && pass "--fp8-gather under data parallel EP 2: runs, says nothing is gathered" \
    || fail "--fp8-gather under data parallel EP 2: $(grep -iE 'note|error' "$tmp/g8_delayed_2_1.out" | head -2)"
$PY - "$tmp" <<'PY' > "$tmp/g8"
import json, re, sys
t = sys.argv[1]
def L(name):
    loss, fp8 = {}, {}
    for l in open("%s/%s.jsonl" % (t, name)):
        r = json.loads(l)
        if "loss" in r: loss[r["step"]] = (r["loss"], r["grad_norm"])
        if "fp8" in r: fp8[r["step"]] = r["fp8"]
    return [loss[s][0] for s in sorted(loss)], [loss[s] for s in sorted(loss)], fp8
def weights_equal(fa, fb):   # every weight's step-1 amax, amax_rank0, scale and saturation count
    w = [k for k in fa.get(1, {}) if k.endswith(".w")]
    return len(w) == 10 and all(fa[1][k] == fb.get(1, {}).get(k) for k in w)
for recipe, S, what in (("block", 4, "ZeRO-3"), ("delayed", 4, "ZeRO-3"), ("delayed", 2, "HSDP 2x2")):
    a, _, fa = L("g8_%s_1_%d" % (recipe, S)); b, _, fb = L("g8_%s_2_%d" % (recipe, S))
    d1 = abs(a[0] - b[0]) if a and b else 1
    dn = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) == 4 else 1
    tol1 = 1e-6 if recipe == "block" else 2e-4
    ok = weights_equal(fa, fb) and d1 <= tol1 and dn <= 2e-3
    print("%s --fp8 %s --fp8-gather np 4 EP 2 %s vs without EP: step 1's 10 weights' amax/scale/saturation equal, step 1 loss |diff| %.1e <= %g, 4 steps within %.1e <= 2e-3" % (
        "pass" if ok else "fail", recipe, what, d1, tol1, dn))
_, x, _ = L("f8_block_2_4"); _, y, _ = L("g8_block_2_4")
print("%s --fp8 block EP 2 (ZeRO-3): with --fp8-gather losses and grad norms of 4 steps bit-identical to without (the experts' weight blocks are per expert)" % (
    "pass" if len(x) == 4 and x == y else "fail"))
a, _, _ = L("g8_delayed_1_4"); b, _, _ = L("g8_delayed_2_4"); c, _, _ = L("f8_delayed_2_4")
ok = len(c) == 4 and abs(b[0] - a[0]) < abs(c[0] - a[0]) and c[0] != b[0]
print("%s negative control: --fp8 delayed under EP 2 without the gather (step 1's weight scales from the rank's own experts) is farther from the run without EP at step 1: |diff| %.1e vs %.1e with it" % (
    "pass" if ok else "fail", abs(c[0] - a[0]) if c and a else 1, abs(b[0] - a[0]) if b and a else 1))
_, x, fx = L("f8_delayed_2_1"); _, y, fy = L("g8_delayed_2_1")
print("%s --fp8 delayed data parallel EP 2: with --fp8-gather (nothing to gather) losses, grad norms and FP8 state of 4 steps bit-identical to without" % (
    "pass" if len(x) == 4 and x == y and fx == fy else "fail"))
def sent(name):
    return {int(r): float(v) for r, v in re.findall(r"comm: rank (\d+) sent \d+ bytes in \d+ training steps \(([\d.]+) bytes/step\)",
                                                   open("%s/%s.out" % (t, name)).read())}
# per rank per step: (no gather - gather) without EP, less (no gather - gather) under EP = the experts' gathers (forward and
# backward, L layers, 3 tensors of chunk E F d / S elements each, 3 bytes saved per element) over S - 1 vs S / N - 1 peers
d, E, F, L_, S, N = 128, 16, 224, 2, 4, 2
want = 2 * L_ * 3 * (E * F * d // S) * 3 * ((S - 1) - (S // N - 1))
f0, g0, f2, g2 = sent("f8_block_1_4"), sent("g8_block_1_4"), sent("f8_block_2_4"), sent("g8_block_2_4")
ok = all(len(m) == 4 for m in (f0, g0, f2, g2)) and all((f0[r] - g0[r]) - (f2[r] - g2[r]) == want for r in range(4))
print("%s --fp8 block --fp8-gather EP 2 (ZeRO-3): bytes saved per rank per step %s, without EP %s: the experts' gathers save %d less (S/N - 1 peers), on every rank" % (
    "pass" if ok else "fail", "/".join("%.0f" % (f2[r] - g2[r]) for r in sorted(g2)), "/".join("%.0f" % (f0[r] - g0[r]) for r in sorted(g0)), want))
PY
verdicts "$tmp/g8" 7

# --- the CUDA path under the emulator (the NCCL twin): the same exchange, rows as BF16 (input gradients
# back as fp32), NCCL send/recv on the EP group's stream; the counts over MPI on the host
EMU=${EMU:-./train_dbrx_emu}
if [ -x "$EMU" ]; then
    G=(--device cuda --model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 2 --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64 --seq 32
       --val-every 0 --batch 1 --steps 4)
    $MPI -np 4 "$EMU" "${G[@]}" --log "$tmp/g0.jsonl" > "$tmp/g0.out" 2>&1 || fail "emulated GPU np 4 without EP: $(grep -i error "$tmp/g0.out" | head -2)"
    for ep in 2 4; do
        $MPI -np 4 "$EMU" "${G[@]}" --expert-parallel $ep --log "$tmp/g$ep.jsonl" > "$tmp/g$ep.out" 2>&1 \
            || fail "emulated GPU EP $ep: $(grep -i error "$tmp/g$ep.out" | head -2)"
        verdict "emulated GPU np 4 EP $ep vs np 4 without EP (BF16)" 2e-3 "$tmp/g0.jsonl" "$tmp/g$ep.jsonl"
    done
    # --ep-layout spread: the losses (measured identical), and the groups every collective ran in, from the NCCL
    # twin's work log (world ranks): expert shard groups {0, 1} {2, 3}, EP groups {0, 2} {1, 3}
    SIMT_WORKLOG="$tmp/gswl" $MPI -np 4 "$EMU" "${G[@]}" --expert-parallel 2 --ep-layout spread --log "$tmp/gs.jsonl" > "$tmp/gs.out" 2>&1 \
        || fail "emulated GPU EP 2 spread: $(grep -i error "$tmp/gs.out" | head -2)"
    verdict "emulated GPU np 4 EP 2 --ep-layout spread vs np 4 without EP (BF16)" 2e-3 "$tmp/g0.jsonl" "$tmp/gs.jsonl"
    $PY - "$tmp/gswl" <<'PY' > "$tmp/gsgroups"
import json, sys
want = {"expert_shard": {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}, "expert_shard_rs": {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]},
        "expert_parallel": {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}}
seen, bad = {}, []
for r in range(4):
    for l in open("%s.%d" % (sys.argv[1], r)):
        if '"coll"' not in l: continue
        c = json.loads(l)
        if c["comm"] in want:
            seen[c["comm"]] = seen.get(c["comm"], 0) + 1
            if c["world_ranks"] != want[c["comm"]][r]: bad.append((r, c["comm"], c["world_ranks"]))
ok = not bad and all(seen.get(k, 0) > 0 for k in want)
print("%s emulated GPU EP 2 spread: every collective of the expert shard groups on ranks {0,1} {2,3} (consecutive), of the EP groups on {0,2} {1,3} (strided): %s%s" % (
    "pass" if ok else "fail", ", ".join("%s %d" % kv for kv in sorted(seen.items())), "; wrong: %s" % bad[:3] if bad else ""))
PY
    verdicts "$tmp/gsgroups" 1
    # data parallel with EP 2 (the non-expert weights replicated, each rank its experts whole), against
    # data parallel without EP; saved after 2 steps and resumed under the same
    # (with a sample after steps 2 and 4: the decode step's rows through the exchange, the same text)
    SMP=(--sample-every 2 --sample-len 12 --prompt The --temperature 0.8)
    $MPI -np 4 "$EMU" "${G[@]}" "${SMP[@]}" --shard-group-size 1 --log "$tmp/gd0.jsonl" > "$tmp/gd0.out" 2>&1 \
        || fail "emulated GPU data parallel: $(grep -i error "$tmp/gd0.out" | head -2)"
    $MPI -np 4 "$EMU" "${G[@]}" "${SMP[@]}" --shard-group-size 1 --expert-parallel 2 --log "$tmp/gd2.jsonl" > "$tmp/gd2.out" 2>&1 \
        || fail "emulated GPU data parallel EP 2: $(grep -i error "$tmp/gd2.out" | head -2)"
    verdict "emulated GPU np 4 data parallel EP 2 vs data parallel without EP (BF16)" 2e-3 "$tmp/gd0.jsonl" "$tmp/gd2.jsonl"
    s0=$(grep '"sample"' "$tmp/gd0.jsonl"); s2=$(grep '"sample"' "$tmp/gd2.jsonl")
    [ "$(grep -c . <<<"$s0")" = 2 ] && [ "$s0" = "$s2" ] && pass "emulated GPU --sample-every under data parallel EP 2: the samples of the run without EP" \
        || fail "emulated GPU samples under EP: $s2 vs $s0"
    $MPI -np 4 "$EMU" "${G[@]}" --shard-group-size 1 --expert-parallel 2 --ckpt-dir "$tmp/gdk" --stop-after 2 --log "$tmp/gdres.jsonl" > "$tmp/gdres.out" 2>&1
    $MPI -np 4 "$EMU" "${G[@]}" --shard-group-size 1 --expert-parallel 2 --ckpt-dir "$tmp/gdk" --resume auto --log "$tmp/gdres.jsonl" > "$tmp/gdres2.out" 2>&1
    verdict "emulated GPU data parallel EP 2: 2 + save + resume + 2 steps vs uninterrupted" 0 "$tmp/gd2.jsonl" "$tmp/gdres.jsonl"
    $PY - "$tmp/g2.out" "$tmp/gs.out" <<'PY' > "$tmp/gbytes"
import re, sys
d, E, n = 64, 4, 2
for path, what in ((sys.argv[1], "EP 2"), (sys.argv[2], "EP 2 spread")):
    rows = re.findall(r"ep: rank (\d+) sent (\d+) bytes in its expert-parallel group: (\d+) count messages, (\d+) rows out, (\d+) rows in",
                      open(path).read())
    # counts (int32, MPI) + forward rows out and results back (BF16) + backward gradients out and input gradients back (BF16)
    ok = len(rows) == 4 and all(int(b) == int(c) * E * 4 + 2 * d * 2 * (int(o) + int(i)) for r, b, c, o, i in rows)
    print("%s emulated GPU %s: bytes in the EP group = counts x E x 4 + 2 x d x 2 x (rows out + rows in) on every rank: %s" % (
        "pass" if ok else "fail", what, ", ".join("rank %s %s" % (r, b) for r, b, *_ in rows)))
PY
    verdicts "$tmp/gbytes" 2
    $MPI -np 4 "$EMU" "${G[@]}" --expert-parallel 4 --ckpt-dir "$tmp/gck" --stop-after 2 --log "$tmp/gres.jsonl" > "$tmp/gres.out" 2>&1
    $MPI -np 4 "$EMU" "${G[@]}" --expert-parallel 4 --ckpt-dir "$tmp/gck" --resume auto --log "$tmp/gres.jsonl" > "$tmp/gres2.out" 2>&1
    verdict "emulated GPU EP 4: 2 + save + resume + 2 steps vs uninterrupted" 0 "$tmp/g4.jsonl" "$tmp/gres.jsonl"
    # FP8 (block scaling) under data parallel EP 2: the local experts' cuBLASLt FP8 GEMMs on the received rows
    # in a padded layout of their own; step 1 (loss, every operand's amax) as without EP, as on the CPU
    for ep in 1 2; do
        $MPI -np 4 "$EMU" "${G[@]}" --steps 2 --fp8 block --fp8-log-every 1 --shard-group-size 1 --expert-parallel $ep --log "$tmp/gf$ep.jsonl" \
            > "$tmp/gf$ep.out" 2>&1 || fail "emulated GPU --fp8 block EP $ep: $(grep -i error "$tmp/gf$ep.out" | head -2)"
    done
    $PY - "$tmp/gf1.jsonl" "$tmp/gf2.jsonl" <<'PY' > "$tmp/gf8"
import json, sys
def L(p):
    loss, fp8 = {}, {}
    for l in open(p):
        r = json.loads(l)
        if "loss" in r: loss[r["step"]] = r["loss"]
        if "fp8" in r: fp8[r["step"]] = {k: v["amax"] for k, v in r["fp8"].items()}
    return [loss[s] for s in sorted(loss)], fp8
(a, fa), (b, fb) = L(sys.argv[1]), L(sys.argv[2])
ok = len(a) == len(b) == 2 and abs(a[0] - b[0]) <= 1e-6 and fa.get(1) and fa[1] == fb.get(1) and abs(a[1] - b[1]) <= 2e-3
print("%s emulated GPU --fp8 block np 4 data parallel EP 2 vs without EP: step 1 loss %s vs %s, its %d amaxes %s, step 2 within %.1e <= 2e-3" % (
    "pass" if ok else "fail", a[0] if a else None, b[0] if b else None, len(fa.get(1, {})), "equal" if fa.get(1) == fb.get(1) else "differ",
    abs(a[-1] - b[-1]) if a and b else 1))
PY
    verdicts "$tmp/gf8" 1
    # --fp8-gather with EP on the device store: the experts' codes gathered in the expert shard group and decoded
    # into the compact BF16 slot of the rank's experts; the model quantises them with the agreed whole-tensor
    # scales (per tensor: Fp8Config.weights_quantized; block: the per-expert blocks' own), so the GEMMs read
    # the codes of the run without EP: step 1's loss and every operand's amax and scale exactly (block, ZeRO-3),
    # every weight's step-1 amax/scale/saturation (delayed, HSDP 2x2; its step-1 activation scales are the
    # received rows'), step 2 within 2e-3; a save after step 1 resumes bit-identically
    for run in "block 1 4" "block 2 4" "delayed 1 2" "delayed 2 2" "block 2 4 spread"; do   # (spread: the expert shard group {0,1} {2,3})
        set -- $run
        $MPI -np 4 "$EMU" "${G[@]}" --steps 2 --fp8 "$1" --fp8-gather --fp8-log-every 1 --expert-parallel "$2" --shard-group-size "$3" \
            --ep-layout "${4:-packed}" --log "$tmp/gg_$1_$2_$3${4:+_$4}.jsonl" > "$tmp/gg.out" 2>&1 \
            || fail "emulated GPU --fp8 $1 --fp8-gather EP $2 S $3 $4: $(grep -i error "$tmp/gg.out" | head -2)"
    done
    GR=("${G[@]}" --steps 2 --fp8 delayed --fp8-gather --fp8-log-every 1 --expert-parallel 2 --shard-group-size 2 --ckpt-dir "$tmp/ggk" --log "$tmp/ggres.jsonl")
    $MPI -np 4 "$EMU" "${GR[@]}" --stop-after 1 > "$tmp/ggres.out" 2>&1
    $MPI -np 4 "$EMU" "${GR[@]}" --resume auto > "$tmp/ggres2.out" 2>&1
    verdict "emulated GPU --fp8 delayed --fp8-gather EP 2 (HSDP 2x2): 1 + save + resume + 1 steps vs uninterrupted" 0 "$tmp/gg_delayed_2_2.jsonl" "$tmp/ggres.jsonl"
    $PY - "$tmp" <<'PY' > "$tmp/gg8"
import json, sys
def L(name):
    loss, fp8 = {}, {}
    for l in open("%s/gg_%s.jsonl" % (sys.argv[1], name)):
        r = json.loads(l)
        if "loss" in r: loss[r["step"]] = r["loss"]
        if "fp8" in r: fp8[r["step"]] = {k: {x: y for x, y in v.items() if x != "amax_rank0"} for k, v in r["fp8"].items()}
    return [loss[s] for s in sorted(loss)], fp8
for recipe, S, what, lay in (("block", 4, "ZeRO-3", ""), ("delayed", 2, "HSDP 2x2", ""), ("block", 4, "ZeRO-3 --ep-layout spread", "_spread")):
    (a, fa), (b, fb) = L("%s_1_%d" % (recipe, S)), L("%s_2_%d%s" % (recipe, S, lay))
    w = [k for k in fa.get(1, {}) if k.endswith(".w")]
    same = fa.get(1) == fb.get(1) if recipe == "block" else len(w) == 10 and all(fa[1][k] == fb.get(1, {}).get(k) for k in w)
    d1 = abs(a[0] - b[0]) if a and b else 1
    ok = len(a) == len(b) == 2 and same and (d1 == 0 if recipe == "block" else d1 <= 2e-4) and abs(a[1] - b[1]) <= 2e-3
    print("%s emulated GPU --fp8 %s --fp8-gather np 4 EP 2 %s vs without EP: step 1 loss %r vs %r, %s, step 2 within %.1e <= 2e-3" % (
        "pass" if ok else "fail", recipe, what, a[0] if a else None, b[0] if b else None,
        "every operand's amax and scale equal" if recipe == "block" else "the 10 weights' amax/scale/saturation equal",
        abs(a[-1] - b[-1]) if a and b else 1))
PY
    verdicts "$tmp/gg8" 3
fi

# --- bad degrees
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 3 > "$tmp/bad.out" 2>&1; rc=$?
[ "$rc" = 2 ] && grep -q "^error: --expert-parallel 3 must divide the 16 experts" "$tmp/bad.out" \
    && pass "--expert-parallel 3 (16 experts): exit 2, $(grep -m1 error "$tmp/bad.out")" || fail "EP 3: exit $rc: $(grep -m1 error "$tmp/bad.out")"
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 4 --shard-group-size 2 > "$tmp/bad.out" 2>&1; rc=$?
[ "$rc" = 2 ] && grep -q "^error: --expert-parallel 4 must divide the shard group size 2" "$tmp/bad.out" \
    && pass "--expert-parallel 4 over shard groups of 2: exit 2, $(grep -m1 error "$tmp/bad.out" | cut -c1-90)" || fail "EP 4 S 2: exit $rc: $(grep -m1 error "$tmp/bad.out")"
$MPI -np 4 $BIN "${T[@]}" --expert-parallel 8 --shard-group-size 1 > "$tmp/bad.out" 2>&1; rc=$?
[ "$rc" = 2 ] && grep -q "^error: --expert-parallel 8 must divide the number of ranks 4" "$tmp/bad.out" \
    && pass "data parallel --expert-parallel 8 on 4 ranks: exit 2, $(grep -m1 error "$tmp/bad.out" | cut -c1-90)" || fail "DP EP 8 np 4: exit $rc: $(grep -m1 error "$tmp/bad.out")"
expect_exit 2 "--expert-parallel 0" $BIN "${T[@]}" --expert-parallel 0
expect_exit 2 "--ep-layout diagonal" $BIN "${T[@]}" --ep-layout diagonal
for cfg in "4 4" "2 1" "1 4"; do   # spread needs N > 1 and S > N (else one rank per EP rank: the layouts are one)
    set -- $cfg
    $MPI -np 4 $BIN "${T[@]}" --expert-parallel "$1" --shard-group-size "$2" --ep-layout spread > "$tmp/bad.out" 2>&1; rc=$?
    [ "$rc" = 2 ] && [ "$(grep -c '^error' "$tmp/bad.out")" = 1 ] && grep -q "^error: --expert-parallel $1 with --ep-layout spread: spread needs N > 1 and a shard group larger than N" "$tmp/bad.out" \
        && pass "--ep-layout spread with EP $1, shard group $2: exit 2, one line" || fail "spread EP $1 S $2: exit $rc: $(grep -m1 error "$tmp/bad.out")"
done
