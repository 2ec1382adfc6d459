#!/usr/bin/env bash
# test_ckpt.sh — checkpoints (checkpoint/README.md), on the CPU:
#   * exact resume: 20 steps in one go and 10 steps + --stop-after + --resume auto + 10 steps give
#     bit-identical losses (one process, and 2 ranks with ZeRO-3); the same with --fp8 delayed (the amax
#     histories and scales are in the manifest; 1 and 2 ranks), current and block; negative controls: the
#     FP8 state dropped (a format_version 1 manifest) or cut (--fp8-amax-history 4) -> a note, other losses;
#     a malformed fp8 section -> treated as damage; saved without FP8, resumed with delayed -> a note;
#   * reshard: saved by 4 ranks ZeRO-3, continued by 2 ranks; saved by HSDP 2x2, continued by 1 rank;
#     saved by 1 rank, continued by 4 ranks ZeRO-3: the same losses as the uninterrupted run (1e-5);
#   * every kind of damage: a flipped byte, a truncated shard, a missing shard, a missing or corrupt
#     manifest -> a warning naming it and the newest valid older checkpoint; none valid -> exit 2;
#     a checkpoint of another model -> exit 2 listing the mismatched fields; nothing saved -> fresh start;
#   * SIGKILL while saving (writing the shard, after the manifest, after the rename) and a full disk
#     (a file-size limit): the previous checkpoint stays loadable;
#   * retention (--ckpt-keep, --ckpt-keep-every) and the latest pointer; latest repaired on start (set back
#     by hand as a kill after the rename leaves it, missing, the newest damaged; 1 and 2 ranks; without
#     --resume auto); --ckpt-dir checked before step 1 (a file, below a file, latest a directory, /proc:
#     one line, exit 2, also on 2 ranks together; created with its parents; free space below one
#     checkpoint on a 1 MiB tmpfs: a warning, where mounting is allowed);
#   * SIGTERM (one process; the ranks under mpirun) and SIGUSR1 (to mpirun): save, exit 0;
#   * Hugging Face: fp32 export -> import (2 ranks) -> export is byte-identical, also bf16 and split
#     exports; dev/hf_logits.py (PyTorch) reproduces train_dbrx's logits from the export; an export of
#     another model -> exit 2 listing the fields; clip_qkv and moe_normalize_expert_weights off -> null
#     in config.json, round trip, PyTorch logits (also p = 2); null vs a run with them on, clip_qkv 0,
#     p 0.5, uniform_expert_assignment true, tie_word_embeddings true, model_type llama -> exit 2 naming the
#     field; p absent -> 1; a split export
#     without its index -> the shards found by name (one missing, or none at all -> exit 2).
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1" 2>/dev/null; }
# cmp_losses TOL REF PARTS...: exit 0 if the concatenated losses of PARTS equal REF's (TOL 0: bit-identical),
# 1 if not, 2 if either is not 20 steps; a summary in $tmp/cmp
cmp_losses() {
    local tol=$1 ref=$2; shift 2
    local got="" p; for p in "$@"; do got="$got $(losses "$p")"; done
    $PY - "$tol" "$(losses "$ref")" "$got" <<'PY' > "$tmp/cmp" 2>&1
import sys
tol, a, b = float(sys.argv[1]), [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
d = max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))
print("%d + resumed steps, max |diff| %.2g" % (len(b), d))
sys.exit(2 if not len(a) == len(b) == 20 else 0 if all((x == y) if tol == 0 else abs(x - y) <= tol for x, y in zip(a, b)) else 1)
PY
}
# same_losses NAME TOL REF PARTS...: the check passes if they are equal
same_losses() {
    local name=$1; shift
    if cmp_losses "$@"; then pass "$name: $(cat "$tmp/cmp")"; else fail "$name: $(cat "$tmp/cmp")"; fi
}
resume_step() {  # the step a --resume auto of DIR starts from ("fresh" or the number)
    local out; out=$($BIN "${T[@]}" --ckpt-dir "$1" --resume auto --stop-after 0 2>&1)
    if grep -q "starting fresh" <<<"$out"; then echo fresh; else sed -nE 's/^resume: .* \(step ([0-9]+),.*/\1/p' <<<"$out"; fi
}

T=(--model dbrx-tiny --n-layers 2 --seq 64 --batch 2 --steps 20 --val-every 0)

# --- exact resume
$BIN "${T[@]}" --log "$tmp/full.jsonl" > /dev/null 2>&1 || fail "one process, 20 steps"
$BIN "${T[@]}" --ckpt-dir "$tmp/r1" --ckpt-every 4 --stop-after 10 --log "$tmp/r1a.jsonl" > "$tmp/r1a.out" 2>&1 || fail "first half: $(tail -2 "$tmp/r1a.out")"
$BIN "${T[@]}" --ckpt-dir "$tmp/r1" --resume auto --log "$tmp/r1b.jsonl" > "$tmp/r1b.out" 2>&1 || fail "second half: $(tail -2 "$tmp/r1b.out")"
grep -q "resume: .*step_00000010 (step 10" "$tmp/r1b.out" || fail "resume did not start from step 10: $(grep resume "$tmp/r1b.out")"
same_losses "one process: 20 steps = 10 + stop + resume + 10, bit-identical" 0 "$tmp/full.jsonl" "$tmp/r1a.jsonl" "$tmp/r1b.jsonl"
$MPI -np 2 $BIN "${T[@]}" --batch 1 --log "$tmp/z2full.jsonl" > /dev/null 2>&1 || fail "2 ranks, 20 steps"
$MPI -np 2 $BIN "${T[@]}" --batch 1 --ckpt-dir "$tmp/r2" --stop-after 10 --log "$tmp/r2a.jsonl" > /dev/null 2>&1 || fail "2 ranks, first half"
$MPI -np 2 $BIN "${T[@]}" --batch 1 --ckpt-dir "$tmp/r2" --resume auto --log "$tmp/r2b.jsonl" > /dev/null 2>&1 || fail "2 ranks, second half"
same_losses "2 ranks ZeRO-3: 20 steps = 10 + stop + resume + 10, bit-identical" 0 "$tmp/z2full.jsonl" "$tmp/r2a.jsonl" "$tmp/r2b.jsonl"

# --- the FP8 scaling state (checkpoint/fp8_state.h): delayed scaling's amax histories and scales resume exactly
# recrc MANIFEST PYTHON-EXPR: rewrites the manifest's text t by the expression and checksums it again (CRC-32C)
recrc() {
    $PY - "$@" <<'PY'
import re, sys
p, expr = sys.argv[1], sys.argv[2]
t = eval(expr, {"re": re, "t": open(p).read()})
sys.path.insert(0, "test"); from crc32c import crc32c   # (test/crc32c.py)
i = t.rindex('"manifest_crc32c": "') + 20
t = t[:i] + "00000000" + t[i + 8:]
open(p, "w").write(t[:i] + "%08x" % crc32c(t.encode()) + t[i + 8:])
PY
}
fp8_resume() {  # recipe, ranks, extra launcher words...: 20 steps vs 10 + stop + resume + 10
    local r=$1 np=$2 d="$tmp/f_$1_$2"; shift 2
    local F=("${T[@]}" --fp8 "$r" --batch $((2 / np)))
    "$@" $BIN "${F[@]}" --log "$d.full.jsonl" > /dev/null 2>&1 || fail "--fp8 $r, $np rank(s), 20 steps"
    "$@" $BIN "${F[@]}" --ckpt-dir "$d" --ckpt-every 5 --stop-after 10 --log "$d.a.jsonl" > /dev/null 2>&1 || fail "--fp8 $r: first half"
    cp -r "$d" "$d.orig"   # for the negative controls
    "$@" $BIN "${F[@]}" --ckpt-dir "$d" --resume auto --log "$d.b.jsonl" > "$d.b.out" 2>&1 || fail "--fp8 $r: second half"
    grep -q "resume: .*step_00000010 (step 10" "$d.b.out" && ! grep -q "note" "$d.b.out" || fail "--fp8 $r: resume: $(grep -E 'note|resume' "$d.b.out")"
    same_losses "--fp8 $r, $np rank(s): 20 steps = 10 + stop + resume + 10, bit-identical" 0 "$d.full.jsonl" "$d.a.jsonl" "$d.b.jsonl"
}
fp8_resume delayed 1
fp8_resume delayed 2 $MPI -np 2
fp8_resume current 1
fp8_resume block 1
grep -q '"fp8": {"recipe": "delayed", "amax_history_len": 16, "margin": 0, "metas": \[' "$tmp/f_delayed_1/step_00000010/manifest.json" \
    && [ "$(grep -c '"name": "blocks\.[01]\..*"filled": 10, "amax_history": \[' "$tmp/f_delayed_1/step_00000010/manifest.json")" = 28 ] \
    && pass "--fp8 delayed: the manifest holds the 28 operands' scales and 10-entry amax histories" \
    || fail "--fp8 delayed: manifest fp8 section: $(grep -A2 '"fp8"' "$tmp/f_delayed_1/step_00000010/manifest.json" | cut -c1-200)"
# negative controls: the same comparison, the saved state not (or not all) used -> the losses differ
D=("${T[@]}" --fp8 delayed --batch 2)
fp8_control() {  # name, expected note, then extra flags for the resumed run (after $tmp/fc is set up)
    local name=$1 note=$2; shift 2
    rm -f "$tmp/fc.jsonl"   # (a resumed run appends to its log)
    $BIN "${D[@]}" --ckpt-dir "$tmp/fc" --resume auto --log "$tmp/fc.jsonl" "$@" > "$tmp/fc.out" 2>&1
    cmp_losses 0 "$tmp/f_delayed_1.full.jsonl" "$tmp/f_delayed_1.a.jsonl" "$tmp/fc.jsonl"; local rc=$?
    if [ "$rc" = 1 ] && grep -q "^note: resume: $note" "$tmp/fc.out" && grep -q "resume: .*step_00000010 (step 10" "$tmp/fc.out"; then
        pass "negative control, $name: '$(grep -m1 '^note' "$tmp/fc.out" | cut -c1-120)', the losses differ ($(cat "$tmp/cmp"))"
    else fail "negative control, $name: comparison $rc ($(cat "$tmp/cmp")): $(grep -E 'note|resume|warn|error' "$tmp/fc.out" | head -3)"; fi
}
rm -rf "$tmp/fc"; cp -r "$tmp/f_delayed_1.orig" "$tmp/fc"
recrc "$tmp/fc/step_00000010/manifest.json" \
    're.sub(r"  \"fp8\": \{.*?\n  \]\},\n", "", t, flags=re.S).replace("\"format_version\": 3", "\"format_version\": 1")'
grep -q '"fp8"' "$tmp/fc/step_00000010/manifest.json" && fail "the fp8 section was not removed"
fp8_control "a format_version 1 checkpoint (no FP8 state: it still loads)" "the checkpoint holds no FP8 scaling state"
rm -rf "$tmp/fc"; cp -r "$tmp/f_delayed_1.orig" "$tmp/fc"
fp8_control "resumed with --fp8-amax-history 4 (of 16)" "--fp8-amax-history is 4, the checkpoint's was 16: each amax history keeps its newest 4 entries" --fp8-amax-history 4
# a malformed fp8 section (with a valid checksum) is damage: the next older checkpoint is used
rm -rf "$tmp/fc"; cp -r "$tmp/f_delayed_1.orig" "$tmp/fc"
recrc "$tmp/fc/step_00000010/manifest.json" 't.replace("\"filled\": 10", "\"filled\": 11", 1)'
out=$($BIN "${D[@]}" --ckpt-dir "$tmp/fc" --resume auto --stop-after 0 2>&1); rc=$?
if [ "$rc" = 0 ] && grep -q "warning: checkpoint .*step_00000010 is not valid (manifest.json: fp8: metas\[0\]: filled 11 disagrees" <<<"$out" \
    && grep -q "resume: .*step_00000005 (step 5," <<<"$out"; then
    pass "a malformed fp8 section (checksum valid): $(grep -m1 warning <<<"$out" | sed "s|$tmp/||" | cut -c1-130) -> step 5"
else fail "malformed fp8 section: exit $rc: $(grep -E 'warning|resume|error' <<<"$out" | head -3)"; fi
out=$($BIN "${D[@]}" --ckpt-dir "$tmp/r1" --resume auto --stop-after 0 2>&1)
grep -q "^note: resume: the checkpoint was saved with --fp8 off, this run uses --fp8 delayed: the amax histories start empty" <<<"$out" \
    && pass "saved with --fp8 off, resumed with --fp8 delayed: a note, fresh histories" || fail "--fp8 off -> delayed: $(grep -E 'note|resume' <<<"$out")"

# --- reshard (d_model 130 and 15 experts: no unit divides evenly, the shards are padded)
U=(--model dbrx-tiny --n-layers 2 --d-model 130 --n-heads 5 --kv-heads 1 --experts 15 --seq 64 --steps 20 --val-every 0 --batch 1)
$BIN "${U[@]}" --grad-accum 4 --log "$tmp/ufull.jsonl" > /dev/null 2>&1 || fail "reshard reference"
reshard() {  # name, np_a, S_a, accum_a, np_b, S_b, accum_b
    local name=$1
    $MPI -np "$2" $BIN "${U[@]}" --shard-group-size "$3" --grad-accum "$4" --ckpt-dir "$tmp/$name" --stop-after 10 \
        --log "$tmp/$name.a.jsonl" > "$tmp/$name.a.out" 2>&1 || fail "$name (save): $(grep -i error "$tmp/$name.a.out" | head -2)"
    $MPI -np "$5" $BIN "${U[@]}" --shard-group-size "$6" --grad-accum "$7" --ckpt-dir "$tmp/$name" --resume auto \
        --log "$tmp/$name.b.jsonl" > "$tmp/$name.b.out" 2>&1 || fail "$name (load): $(grep -i error "$tmp/$name.b.out" | head -2)"
    grep -q "warning" "$tmp/$name.b.out" && fail "$name: warnings on load: $(grep warning "$tmp/$name.b.out" | head -2)"
    same_losses "reshard $name: same losses as one uninterrupted process (1e-5)" 1e-5 "$tmp/ufull.jsonl" "$tmp/$name.a.jsonl" "$tmp/$name.b.jsonl"
}
reshard "4-ranks-ZeRO-3-to-2-ranks" 4 4 1 2 2 2
reshard "HSDP-2x2-to-1-rank" 4 2 1 1 1 4
reshard "1-rank-to-4-ranks-ZeRO-3" 1 1 4 4 4 1

# --- damage: each kind on its own copy of three good checkpoints (steps 2, 4, 6)
$BIN "${T[@]}" --ckpt-dir "$tmp/good" --ckpt-every 2 --stop-after 6 > /dev/null 2>&1 || fail "make checkpoints"
damage() {  # name, expected resume step, command run in the copy's directory
    local name=$1 want=$2; shift 2
    rm -rf "$tmp/d"; cp -r "$tmp/good" "$tmp/d"
    (cd "$tmp/d" && eval "$@")
    local out; out=$($BIN "${T[@]}" --ckpt-dir "$tmp/d" --resume auto --stop-after 0 2>&1); local rc=$?
    local got; got=$(sed -nE 's/^resume: .* \(step ([0-9]+),.*/\1/p' <<<"$out")
    if [ "$rc" = 0 ] && [ "$got" = "$want" ] && grep -q "warning: checkpoint .*step_00000006 is not valid" <<<"$out"; then
        pass "$name: $(grep -m1 'warning: checkpoint' <<<"$out" | sed "s|$tmp/d/||g" | cut -c1-110) -> resumed from step $got"
    else fail "$name: exit $rc, resumed from '$got' (want $want): $(head -c 400 <<<"$out")"; fi
}
flip() { $PY -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0]^1]))" "$@"; }
damage "flipped byte in a shard (weights)" 4 flip step_00000006/shard_00000.bin 1000000
damage "flipped byte in a shard (AdamW v)" 4 flip step_00000006/shard_00000.bin 35000000
damage "flipped byte in the manifest" 4 flip step_00000006/manifest.json 300
damage "truncated shard" 4 truncate -s 20000000 step_00000006/shard_00000.bin
damage "missing shard" 4 rm step_00000006/shard_00000.bin
damage "missing manifest" 4 rm step_00000006/manifest.json
damage "two newest damaged" 2 "rm step_00000006/manifest.json; flip step_00000004/shard_00000.bin 64"
rm -rf "$tmp/d"; cp -r "$tmp/good" "$tmp/d"; for s in 2 4 6; do flip "$tmp/d/step_0000000$s/shard_00000.bin" 100; done
out=$($BIN "${T[@]}" --ckpt-dir "$tmp/d" --resume auto --stop-after 0 2>&1 >/dev/null); rc=$?
[ "$rc" = 2 ] && [ "$(grep -c 'is not valid' <<<"$out")" = 3 ] && tail -1 <<<"$out" | grep -q "^error: .*: no valid checkpoint (3 tried)" \
    && pass "every checkpoint damaged: 3 warnings, then exit 2: $(tail -1 <<<"$out" | sed "s|$tmp/||")" || fail "all damaged: exit $rc: $out"
out=$($BIN "${T[@]}" --resume "$tmp/d/step_00000004" --stop-after 0 2>&1 >/dev/null); rc=$?
[ "$rc" = 2 ] && tail -1 <<<"$out" | grep -q "^error: .*step_00000004: no valid checkpoint" \
    && pass "an explicit damaged checkpoint: exit 2, no fallback" || fail "explicit damaged: exit $rc: $out"
out=$($BIN "${T[@]}" --n-layers 3 --d-model 64 --ckpt-dir "$tmp/good" --resume auto --stop-after 0 2>&1); rc=$?
if [ "$rc" = 2 ] && grep -q "does not match this run's model: d_model 128 (checkpoint) vs 64 (this run), head_dim 32 (checkpoint) vs 16 (this run), n_layers 2 (checkpoint) vs 3 (this run)" <<<"$out"; then
    pass "another model's checkpoint: exit 2 listing d_model, head_dim, n_layers"
else fail "another model's checkpoint: exit $rc: $(grep error <<<"$out")"; fi
# a damaged shard written by rank 1 of 2: rank 1 finds it, both ranks fall back together
$MPI -np 2 $BIN "${T[@]}" --batch 1 --ckpt-dir "$tmp/g2" --ckpt-every 2 --stop-after 4 > /dev/null 2>&1
flip "$tmp/g2/step_00000004/shard_00001.bin" 5000
out=$($MPI -np 2 $BIN "${T[@]}" --batch 1 --ckpt-dir "$tmp/g2" --resume auto --stop-after 0 2>&1); rc=$?
if [ "$rc" = 0 ] && grep -q "warning: rank 1: .*shard_00001.bin: checksum mismatch" <<<"$out" && grep -q "resume: .*(step 2," <<<"$out"; then
    pass "2 ranks: rank 1's shard damaged -> found by rank 1, both resume from step 2"
else fail "2 ranks, damaged shard 1: exit $rc: $(grep -E 'warning|resume|error' <<<"$out" | head -4)"; fi
[ "$(resume_step "$tmp/none")" = fresh ] && pass "nothing to resume: starts fresh, says so" || fail "no checkpoint: not a fresh start"

# --- crashes while saving, and a full disk
for point in shard manifest rename; do
    rm -rf "$tmp/c"; cp -r "$tmp/good" "$tmp/c"
    (DBRX_DEBUG_CKPT_KILL=8:$point $BIN "${T[@]}" --ckpt-dir "$tmp/c" --resume auto --ckpt-every 2 --stop-after 4 > /dev/null 2>&1; exit $?) 2>/dev/null; rc=$?
    before=$(cat "$tmp/c/latest")
    got=$(resume_step "$tmp/c")
    # renamed = complete: the new one is valid; the kill left latest one behind, and the resume repairs it
    want=6 wantl=step_00000006; [ "$point" = rename ] && want=8 wantl=step_00000008
    if [ "$rc" = 137 ] && [ "$before" = step_00000006 ] && [ "$got" = "$want" ] && [ "$(cat "$tmp/c/latest")" = $wantl ]; then
        pass "SIGKILL during the save of step 8 ($point): latest left at step_00000006, resumes from step $got, latest then $wantl"
    else fail "SIGKILL during the save ($point): exit $rc, latest $before, resumes from '$got' (want $want), latest then $(cat "$tmp/c/latest") (want $wantl)"; fi
done
rm -rf "$tmp/c"; cp -r "$tmp/good" "$tmp/c"
(ulimit -f 20000; $BIN "${T[@]}" --ckpt-dir "$tmp/c" --resume auto --ckpt-every 2 --stop-after 2 > "$tmp/full.out" 2>&1); rc=$?
got=$(resume_step "$tmp/c")
if [ "$rc" = 1 ] && [ "$got" = 6 ] && grep -q "warning: checkpoint step 8 failed" "$tmp/full.out" && ! ls -a "$tmp/c" | grep -q tmp; then
    pass "disk full while saving (file-size limit): warning, exit 1, nothing half-written left, step 6 still loads"
else fail "disk full: exit $rc, resumes from '$got': $(grep -E 'warn|error' "$tmp/full.out" | head -3)"; fi

# --- the latest pointer repaired on start: a kill between the rename of a step directory and the update of
# latest (simulated: latest set back by hand) leaves it on an older step; --resume auto resumes from the newest
# and rewrites latest (rank 0, one line); a damaged newest one is passed over and latest names the one loaded
latest_repair() {  # name, want step, want latest, then launcher words; the copy is prepared in $tmp/lr
    local name=$1 want=$2 wantl=$3; shift 3
    local out; out=$("$@" $BIN "${T[@]}" --batch 1 --ckpt-dir "$tmp/lr" --resume auto --stop-after 0 2>&1); local rc=$?
    local got; got=$(sed -nE 's/^resume: .* \(step ([0-9]+),.*/\1/p' <<<"$out")
    local lines; lines=$(grep -c "latest rewritten" <<<"$out")
    if [ "$rc" = 0 ] && [ "$got" = "$want" ] && [ "$(cat "$tmp/lr/latest")" = "$wantl" ] && [ "$lines" = 1 ] \
        && ! ls -a "$tmp/lr" | grep -q probe; then
        pass "latest repaired, $name: resumed from step $got, '$(grep -m1 'latest rewritten' <<<"$out" | sed "s|$tmp/||" | cut -c1-120)'"
    else fail "latest repair, $name: exit $rc, resumed from '$got' (want $want), latest $(cat "$tmp/lr/latest") (want $wantl), $lines repair line(s): $(grep -E 'ckpt|error|warn' <<<"$out" | head -3)"; fi
}
rm -rf "$tmp/lr"; cp -r "$tmp/good" "$tmp/lr"; echo step_00000002 > "$tmp/lr/latest"
latest_repair "latest set back to step 2" 6 step_00000006
rm -rf "$tmp/lr"; cp -r "$tmp/good" "$tmp/lr"; echo step_00000004 > "$tmp/lr/latest"
latest_repair "2 ranks, latest set back to step 4" 6 step_00000006 $MPI -np 2
rm -rf "$tmp/lr"; cp -r "$tmp/good" "$tmp/lr"; rm "$tmp/lr/latest"
latest_repair "latest missing" 6 step_00000006
rm -rf "$tmp/lr"; cp -r "$tmp/good" "$tmp/lr"; flip "$tmp/lr/step_00000006/shard_00000.bin" 1000000
latest_repair "the newest (step 6) damaged: latest names step 4" 4 step_00000004
# the pointer already right: nothing rewritten (a negative control of the repair line)
rm -rf "$tmp/lr"; cp -r "$tmp/good" "$tmp/lr"
out=$($BIN "${T[@]}" --ckpt-dir "$tmp/lr" --resume auto --stop-after 0 2>&1)
! grep -q "latest rewritten" <<<"$out" && [ "$(cat "$tmp/lr/latest")" = step_00000006 ] \
    && pass "latest already names the newest: left alone" || fail "latest already right: $(grep -E 'latest|error' <<<"$out" | head -2)"
# without --resume auto, latest is pointed at the newest checkpoint whose manifest verifies, before step 1
rm -rf "$tmp/lr"; cp -r "$tmp/good" "$tmp/lr"; echo step_00000002 > "$tmp/lr/latest"; rm "$tmp/lr/step_00000006/manifest.json"
out=$($BIN "${T[@]}" --ckpt-dir "$tmp/lr" --resume "$tmp/lr/step_00000002" --stop-after 0 2>&1); rc=$?
[ "$rc" = 0 ] && grep -q "latest named 'step_00000002'; the newest complete checkpoint is step_00000004: latest rewritten" <<<"$out" \
    && [ "$(cat "$tmp/lr/latest")" = step_00000004 ] && pass "no --resume auto: latest pointed at the newest complete checkpoint (step 4; step 6 has no manifest)" \
    || fail "latest repair without --resume auto: exit $rc, latest $(cat "$tmp/lr/latest"): $(grep -E 'latest|error' <<<"$out" | head -2)"

# --- --ckpt-dir checked before step 1: one line naming the directory and the reason, exit 2, no step run
C=("${T[@]}" --steps 2)
: > "$tmp/afile"
expect_exit 2 "--ckpt-dir is a file" $BIN "${C[@]}" --ckpt-dir "$tmp/afile"
grep -q -- "--ckpt-dir $tmp/afile: it exists and is not a directory" <<<"$LAST_ERR" || fail "file as --ckpt-dir: $LAST_ERR"
expect_exit 2 "--ckpt-dir below a file" $BIN "${C[@]}" --ckpt-dir "$tmp/afile/sub"
grep -q "cannot create it (mkdir .*Not a directory)" <<<"$LAST_ERR" || fail "--ckpt-dir below a file: $LAST_ERR"
mkdir -p "$tmp/ldir/latest"
expect_exit 2 "--ckpt-dir whose latest is a directory" $BIN "${C[@]}" --ckpt-dir "$tmp/ldir"
grep -q "ldir/latest is a directory" <<<"$LAST_ERR" || fail "latest a directory: $LAST_ERR"
# a directory no file can be written in (/proc: refused even to root)
expect_exit 2 "--ckpt-dir where no file can be written (/proc)" $BIN "${C[@]}" --ckpt-dir /proc
grep -q -- "--ckpt-dir /proc: cannot write a test file" <<<"$LAST_ERR" || fail "unwritable --ckpt-dir: $LAST_ERR"
$BIN "${C[@]}" --ckpt-dir "$tmp/fresh/a/b" --stop-after 0 > /dev/null 2>&1 && [ -d "$tmp/fresh/a/b" ] && ! ls -a "$tmp/fresh/a/b" | grep -q probe \
    && pass "--ckpt-dir created (parents too), the test file removed" || fail "--ckpt-dir not created: $(ls -a "$tmp/fresh/a/b" 2>&1)"
# two ranks: rank 0 looks, both exit 2 together (none left waiting)
out=$(timeout -s KILL 60 $MPI -np 2 $BIN "${C[@]}" --batch 1 --ckpt-dir "$tmp/afile" 2>&1 >/dev/null); rc=$?
[ "$rc" = 2 ] && [ "$(grep -c '^error: --ckpt-dir' <<<"$out")" = 1 ] && pass "2 ranks, --ckpt-dir a file: one line, exit 2" \
    || fail "2 ranks, bad --ckpt-dir: exit $rc: $(head -c 300 <<<"$out")"
# less free space than one checkpoint: a warning naming both numbers (a 1 MiB tmpfs, where mounting is allowed)
mkdir -p "$tmp/small"
if mount -t tmpfs -o size=1m tmpfs "$tmp/small" 2>/dev/null; then
    out=$($BIN "${C[@]}" --ckpt-dir "$tmp/small" --stop-after 0 2>&1); rc=$?
    umount "$tmp/small"
    grep -qE "^warning: --ckpt-dir $tmp/small: [0-9]+ bytes free, one checkpoint needs [0-9]+ bytes" <<<"$out" \
        && pass "free space below one checkpoint: $(grep -m1 'bytes free' <<<"$out" | sed "s|$tmp/||")" || fail "free-space warning: exit $rc: $(head -c 300 <<<"$out")"
else echo "skipped: the free-space warning (mounting a 1 MiB tmpfs is not allowed here)"; fi

# --- retention and the latest pointer
$BIN "${T[@]}" --ckpt-dir "$tmp/keep" --ckpt-every 1 --ckpt-keep 2 --ckpt-keep-every 4 --stop-after 9 > /dev/null 2>&1
kept=$(ls "$tmp/keep" | tr '\n' ' ')
# (the last save, step 9, is not yet known good — nothing trained past it — so it is kept besides the 2
# newest known-good ones, 7 and 8, and every 4th: checkpoint/spike_guard.h, --ckpt-confirm)
[ "$kept" = "latest step_00000004 step_00000007 step_00000008 step_00000009 " ] && [ "$(cat "$tmp/keep/latest")" = step_00000009 ] \
    && pass "retention: keep 2 known-good + every 4th + the newest, not yet confirmed, of 9 saves -> $kept" || fail "retention: $kept"

# --- signals: save where we are, exit 0
sigtest() {  # name, launcher..., then: how to signal (a function of $P)
    local name=$1 how=$2; shift 2
    rm -rf "$tmp/s" "$tmp/s.jsonl"
    "$@" "${T[@]}" --steps 400 --batch 1 --ckpt-dir "$tmp/s" --log "$tmp/s.jsonl" > "$tmp/s.out" 2>&1 & P=$!
    waitlog "$tmp/s.jsonl" 3 || fail "$name: no progress: $(tail -2 "$tmp/s.out")"
    eval "$how"
    wait $P; local rc=$?
    local n; n=$(grep -c '"loss"' "$tmp/s.jsonl")
    local got; got=$(resume_step "$tmp/s")
    if [ "$rc" = 0 ] && [ "$got" = "$n" ] && [ "$n" -lt 400 ]; then pass "$name: saved step $n and exited 0"
    else fail "$name: exit $rc, $n steps logged, resumes from '$got': $(tail -2 "$tmp/s.out")"; fi
}
sigtest "SIGTERM (one process)" 'kill -TERM $P' $BIN
sigtest "SIGTERM to the ranks under mpirun (as a scheduler does)" 'kill -TERM $(children $P)' $MPI -np 2 $BIN
sigtest "SIGUSR1 to mpirun (forwarded to the ranks)" 'kill -USR1 $P' $MPI -np 2 $BIN

# --- Hugging Face export and import
$BIN "${T[@]}" --steps 3 --export-hf "$tmp/hfA" --export-dtype fp32 --dump-logits "$tmp/logitsA.st" > "$tmp/hf.out" 2>&1 || fail "export: $(tail -2 "$tmp/hf.out")"
$MPI -np 2 $BIN "${T[@]}" --batch 1 --init-hf "$tmp/hfA" --stop-after 0 --export-hf "$tmp/hfB" --export-dtype fp32 > "$tmp/hf2.out" 2>&1 || fail "import: $(tail -2 "$tmp/hf2.out")"
cmp -s "$tmp/hfA/model.safetensors" "$tmp/hfB/model.safetensors" && cmp -s "$tmp/hfA/config.json" "$tmp/hfB/config.json" \
    && pass "fp32 export -> import on 2 ranks (each reads only its shard) -> export: byte-identical" || fail "fp32 round trip differs"
out=$($PY dev/hf_logits.py "$tmp/hfA" "$tmp/logitsA.st" 2>&1) && grep -q "tol 1.0e-04 (fp32 dump)" <<<"$out" \
    && pass "PyTorch on the fp32 export reproduces the logits (the CPU dump's default tolerance): ${out#*\): }" || fail "hf_logits fp32: $out"
$BIN "${T[@]}" --steps 1 --fp8 delayed --dump-logits "$tmp/logitsF.st" > "$tmp/hfF.out" 2>&1 || fail "FP8 dump: $(tail -2 "$tmp/hfF.out")"
out=$($PY dev/hf_logits.py "$tmp/hfA" "$tmp/logitsF.st" 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "a fp8-delayed dump has no default tolerance .*: pass --tol" <<<"$out" \
    && pass "hf_logits on an FP8 run's dump without --tol: exit 1, names the dump's precision" || fail "hf_logits FP8 dump without --tol: exit $rc: $out"
$MPI -np 2 $BIN "${T[@]}" --batch 1 --init-hf "$tmp/hfA" --stop-after 0 --export-hf "$tmp/hfC" --export-max-file-gb 0.004 > /dev/null 2>&1
$BIN "${T[@]}" --init-hf "$tmp/hfC" --stop-after 0 --export-hf "$tmp/hfD" --export-max-file-gb 0.004 --dump-logits "$tmp/logitsC.st" > /dev/null 2>&1
nfiles=$(ls "$tmp/hfC" | grep -c "^model-.*-of-.*safetensors$")
same=1; for f in "$tmp"/hfC/model*; do cmp -s "$f" "$tmp/hfD/$(basename "$f")" || same=0; done
[ "$nfiles" -ge 2 ] && [ -f "$tmp/hfC/model.safetensors.index.json" ] && [ "$same" = 1 ] \
    && pass "bf16 export split into $nfiles files + index -> import -> export: byte-identical" || fail "bf16 split round trip ($nfiles files, same $same)"
out=$($PY dev/hf_logits.py "$tmp/hfC" "$tmp/logitsC.st" --tol 1e-4 2>&1) && pass "PyTorch on the bf16 split export reproduces the logits of the imported model: ${out#*\): }" || fail "hf_logits bf16: $out"
out=$($BIN "${T[@]}" --n-layers 3 --init-hf "$tmp/hfA" --stop-after 0 2>&1); rc=$?
[ "$rc" = 2 ] && grep -q "config.json does not match this run's model: n_layers 2 (config.json) vs 3 (this run)" <<<"$out" \
    && pass "an export of another model: exit 2 listing the fields" || fail "HF config mismatch: exit $rc: $(grep error <<<"$out")"
$PY - "$tmp/hfA/model.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = open(p, "rb").read(); open(p, "wb").write(b[:len(b) // 2])
PY
expect_exit 2 "a truncated safetensors file: clear error" $BIN "${T[@]}" --init-hf "$tmp/hfA" --stop-after 0

# --- Hugging Face: the settings as the original DBRX code reads them
# off (no clamp, top-k weights not renormalised) is null in config.json, and the run must say off too
OFF=(--clip-qkv off --moe-normalize-expert-weights off)
$BIN "${T[@]}" "${OFF[@]}" --steps 3 --export-hf "$tmp/hfN" --export-dtype fp32 --dump-logits "$tmp/logitsN.st" > "$tmp/hfN.out" 2>&1 \
    || fail "export with clip_qkv and the renormalisation off: $(tail -2 "$tmp/hfN.out")"
grep -q '"clip_qkv": null' "$tmp/hfN/config.json" && grep -q '"moe_normalize_expert_weights": null' "$tmp/hfN/config.json" \
    && pass "export: --clip-qkv off and --moe-normalize-expert-weights off are written as null" \
    || fail "export of off: $(grep -o '"clip_qkv": [^,]*\|"moe_normalize_expert_weights": [^,]*' "$tmp/hfN/config.json")"
grep -q "^model custom (from dbrx-tiny: --n-layers 2 --clip-qkv off --moe-normalize-expert-weights off): .*clip_qkv off, moe_normalize_expert_weights off," "$tmp/hfN.out" \
    && pass "banner: a preset changed by flags is named custom, with the flags" || fail "banner: $(grep '^model' "$tmp/hfN.out")"
$BIN "${T[@]}" "${OFF[@]}" --init-hf "$tmp/hfN" --stop-after 0 --export-hf "$tmp/hfN2" --export-dtype fp32 > "$tmp/hfN2.out" 2>&1
cmp -s "$tmp/hfN/model.safetensors" "$tmp/hfN2/model.safetensors" && cmp -s "$tmp/hfN/config.json" "$tmp/hfN2/config.json" \
    && pass "off settings: export -> import -> export byte-identical" || fail "off round trip: $(tail -2 "$tmp/hfN2.out")"
out=$($PY dev/hf_logits.py "$tmp/hfN" "$tmp/logitsN.st" --tol 1e-4 2>&1) \
    && pass "PyTorch without the clamp and the renormalisation (config null) reproduces the logits: ${out#*\): }" || fail "hf_logits off: $out"
$BIN "${T[@]}" --moe-normalize-expert-weights 2 --steps 3 --export-hf "$tmp/hfP" --export-dtype fp32 --dump-logits "$tmp/logitsP.st" > /dev/null 2>&1
grep -q '"moe_normalize_expert_weights": 2,' "$tmp/hfP/config.json" && out=$($PY dev/hf_logits.py "$tmp/hfP" "$tmp/logitsP.st" --tol 1e-4 2>&1) \
    && pass "PyTorch with the top-k weights over their L2 norm (moe_normalize_expert_weights 2) reproduces the logits: ${out#*\): }" \
    || fail "hf_logits p = 2: $out"
out=$($BIN "${T[@]}" --init-hf "$tmp/hfN" --stop-after 0 2>&1); rc=$?
[ "$rc" = 2 ] && grep -q "attn_config.clip_qkv null (config.json) vs 8 (this run), ffn_config.moe_normalize_expert_weights null (config.json) vs 1 (this run)" <<<"$out" \
    && pass "null settings imported by a run with the clamp and the renormalisation: exit 2 naming both" || fail "null vs on: exit $rc: $(grep error <<<"$out")"
# config.json edited: clip_qkv 0 (the original would clamp to 0), p < 1, uniform_expert_assignment true, tied embeddings,
# another model_type
hfedit() {  # hfedit SRC DST SECTION KEY VALUE(JSON, or "delete"): a copy of SRC's export with one field changed
    rm -rf "$2"; cp -r "$1" "$2"
    $PY - "$2/config.json" "$3" "$4" "$5" <<'PY'
import json, sys
path, section, key, value = sys.argv[1:]
c = json.load(open(path))
d = c if section == "." else c[section]   # (".": a top-level field)
if value == "delete": d.pop(key, None)
else: d[key] = json.loads(value)
json.dump(c, open(path, "w"), indent=2)
PY
}
hfedit "$tmp/hfN" "$tmp/hfX" attn_config clip_qkv 0
expect_exit 2 "config.json clip_qkv 0 (not 'off': the original clamps to 0): refused" $BIN "${T[@]}" "${OFF[@]}" --init-hf "$tmp/hfX" --stop-after 0
grep -q "config.json: attn_config.clip_qkv 0 must be a positive number or null" <<<"$LAST_ERR" || fail "clip_qkv 0: the error names the field: $LAST_ERR"
hfedit "$tmp/hfN" "$tmp/hfX" ffn_config moe_normalize_expert_weights 0.5
expect_exit 2 "config.json moe_normalize_expert_weights 0.5: refused" $BIN "${T[@]}" "${OFF[@]}" --init-hf "$tmp/hfX" --stop-after 0
grep -q "config.json: ffn_config.moe_normalize_expert_weights 0.5 must be a number >= 1" <<<"$LAST_ERR" || fail "p 0.5: the error names the field: $LAST_ERR"
hfedit "$tmp/hfN" "$tmp/hfX" ffn_config uniform_expert_assignment true
expect_exit 2 "config.json uniform_expert_assignment true: refused" $BIN "${T[@]}" "${OFF[@]}" --init-hf "$tmp/hfX" --stop-after 0
grep -q "config.json: ffn_config.uniform_expert_assignment true: " <<<"$LAST_ERR" || fail "uniform_expert_assignment: the error names the field: $LAST_ERR"
hfedit "$tmp/hfN" "$tmp/hfX" . tie_word_embeddings true
expect_exit 2 "config.json tie_word_embeddings true: refused" $BIN "${T[@]}" "${OFF[@]}" --init-hf "$tmp/hfX" --stop-after 0
grep -q "config.json: tie_word_embeddings true: DBRX's lm_head is a matrix of its own" <<<"$LAST_ERR" || fail "tie_word_embeddings: the error names the field: $LAST_ERR"
hfedit "$tmp/hfN" "$tmp/hfX" . model_type '"llama"'
expect_exit 2 "config.json model_type llama: refused" $BIN "${T[@]}" "${OFF[@]}" --init-hf "$tmp/hfX" --stop-after 0
grep -q "config.json: model_type \"llama\": a DBRX checkpoint" <<<"$LAST_ERR" || fail "model_type: the error names the field: $LAST_ERR"
hfedit "$tmp/hfN" "$tmp/hfX" ffn_config moe_normalize_expert_weights delete
out=$($BIN "${T[@]}" --clip-qkv off --init-hf "$tmp/hfX" --stop-after 0 2>&1) \
    && pass "config.json without moe_normalize_expert_weights: DbrxConfig's default 1 (a run with p 1 imports it)" || fail "absent p: $(grep error <<<"$out")"

# --- Hugging Face: a split export without model.safetensors.index.json
rm -rf "$tmp/hfE"; cp -r "$tmp/hfC" "$tmp/hfE"; rm "$tmp/hfE/model.safetensors.index.json"
$BIN "${T[@]}" --init-hf "$tmp/hfE" --stop-after 0 --export-hf "$tmp/hfF" --export-max-file-gb 0.004 > "$tmp/hfE.out" 2>&1
same=1; for f in "$tmp"/hfC/model*; do cmp -s "$f" "$tmp/hfF/$(basename "$f")" || same=0; done
[ "$same" = 1 ] && grep -q "note: --init-hf .*: no model.safetensors.index.json: the $nfiles shards model-\*-of-0000$nfiles.safetensors" "$tmp/hfE.out" \
    && pass "a split export without its index: the $nfiles shards found by name, imported, re-exported byte-identical" \
    || fail "split export without index: $(grep -E 'note|error' "$tmp/hfE.out")"
rm "$tmp/hfE/model-00002-of-0000$nfiles.safetensors"
expect_exit 2 "a split export without its index and a shard: clear error" $BIN "${T[@]}" --init-hf "$tmp/hfE" --stop-after 0
grep -q "no model.safetensors.index.json, and shard model-00002-of-0000$nfiles.safetensors of the $nfiles is missing" <<<"$LAST_ERR" \
    || fail "missing shard: the error names it: $LAST_ERR"
rm -f "$tmp"/hfE/model-*.safetensors
expect_exit 2 "an export directory without safetensors files: clear error" $BIN "${T[@]}" --init-hf "$tmp/hfE" --stop-after 0
grep -q "no model.safetensors, no model.safetensors.index.json, and no other \*.safetensors file" <<<"$LAST_ERR" || fail "no files: $LAST_ERR"
