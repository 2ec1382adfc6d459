#!/usr/bin/env bash
# test_gemm_pins.sh — the GEMM algorithms a run uses are saved with its checkpoints and pinned on resume
# (model/matmul_pins.h, checkpoint/ckpt.h), on the emulated GPU (train_dbrx_emu: the cuBLASLt twin, whose
# fake heuristic names the process, so that a resumed process that asked it again would record other
# algorithms than the saved run):
#   * 4 steps saving at 2 and 4; step 2 resumed: the step-2 table is listed in the manifest (size and
#     CRC-32C as computed here), every algorithm of it is the one the resumed run records at step 4,
#     the losses are bit-identical;
#   * negative control: the same checkpoint without its table (the manifest's entry removed, its CRC
#     redone) resumes, with one note, and the resumed run's algorithms differ from the saved ones;
#   * a damaged table (a flipped byte: the CRC-32C) and a table of algorithms the library refuses (the
#     twin's stand-in for another GPU) each give one line, and the run resumes with the heuristic.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
EMU=${EMU:-./train_dbrx_emu}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
C=(--device cuda --model dbrx-tiny --n-layers 2 --seq 32 --val-every 0 --batch 1 --steps 4 --grad-accum 2)

$EMU "${C[@]}" --ckpt-dir "$tmp/a" --ckpt-every 2 --log "$tmp/a.jsonl" > "$tmp/a.out" 2>&1 || fail "full run: $(tail -2 "$tmp/a.out")"
# resume CASE [EDIT]: step 2 of run a copied to $tmp/CASE, EDIT applied to it (python, below), resumed to step 4
resume() {
    mkdir -p "$tmp/$1" && cp -r "$tmp/a/step_00000002" "$tmp/$1/" || fail "copy"
    [ -z "${2:-}" ] || $PY - "$tmp/$1/step_00000002" "$2" <<'PY' || fail "edit $2"
import json, os, sys
d, edit = sys.argv[1:]
sys.path.insert(0, "test"); from crc32c import crc32c   # (test/crc32c.py)
man = open(os.path.join(d, "manifest.json")).read()
plans = os.path.join(d, "gemm_plans_00000.txt")
if edit == "drop":   # as a checkpoint without a table: the entry and the file gone
    i = man.index('  "gemm_plans"'); man = man[:i] + man[man.index('  "manifest_crc32c"'):]
    os.remove(plans)
elif edit == "flip":   # one byte of the table changed (the manifest untouched)
    t = bytearray(open(plans, "rb").read()); t[-5] ^= 1; open(plans, "wb").write(t)
elif edit == "refused":   # every algorithm's last word non-zero: the twin's check refuses it; the listing redone
    t = open(plans).read().replace(" 0000000000000000\n", " 0000000000000001\n").encode()
    open(plans, "wb").write(t)
    j = json.loads(man)["gemm_plans"][0]
    man = man.replace('"bytes": %d, "crc32c": "%s"' % (j["bytes"], j["crc32c"]), '"bytes": %d, "crc32c": "%08x"' % (len(t), crc32c(t)))
i = man.index('"manifest_crc32c": "') + len('"manifest_crc32c": "')
man = man[:i] + "00000000" + man[i + 8:]
man = man[:i] + "%08x" % crc32c(man.encode()) + man[i + 8:]
open(os.path.join(d, "manifest.json"), "w").write(man)
PY
    $EMU "${C[@]}" --ckpt-dir "$tmp/$1" --resume auto --log "$tmp/$1.jsonl" > "$tmp/$1.out" 2>&1 || fail "$1: resume: $(tail -2 "$tmp/$1.out")"
    grep -q "^resume: .*step_00000002 (step 2," "$tmp/$1.out" || fail "$1: did not resume from step 2: $(grep -E 'resume|error' "$tmp/$1.out" | head -2)"
}
# check CASE: "listed" (the step-2 table as the manifest lists it), "pinned N/M" (M of the N saved algorithms are the
# ones CASE's run recorded at step 4), "losses same|differ" (vs the full run's steps 3 and 4)
check() {
    $PY - "$tmp" "$1" <<'PY'
import json, os, sys
tmp, case = sys.argv[1:]
sys.path.insert(0, "test"); from crc32c import crc32c   # (test/crc32c.py)
def table(p):
    lines = open(p).read().splitlines()
    assert lines[0] == "train_dbrx gemm plans 1" and lines[1].startswith("library "), p
    return dict(l.split(" : ") for l in lines[2:])
d = os.path.join(tmp, "a", "step_00000002")
e = json.load(open(os.path.join(d, "manifest.json")))["gemm_plans"]
t = open(os.path.join(d, "gemm_plans_00000.txt"), "rb").read()
listed = len(e) == 1 and e[0]["name"] == "gemm_plans_00000.txt" and e[0]["rank"] == 0 and e[0]["bytes"] == len(t) and e[0]["crc32c"] == "%08x" % crc32c(t)
saved, got = table(os.path.join(d, "gemm_plans_00000.txt")), table(os.path.join(tmp, case, "step_00000004", "gemm_plans_00000.txt"))
same = sum(got.get(k) == v for k, v in saved.items())
L = lambda n: [json.loads(l)["loss"] for l in open(os.path.join(tmp, n + ".jsonl")) if '"loss"' in l]
print("listed" if listed else "unlisted", "pinned %d/%d" % (len(saved), same), "losses", "same" if L("a")[2:] == L(case) and L(case) else "differ")
PY
}
resume b
r=$(check b)
[[ "$r" =~ ^listed\ pinned\ ([0-9]+)/([0-9]+)\ losses\ same$ ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && [ "${BASH_REMATCH[1]}" -gt 10 ] \
    && grep -q "^resume: ${BASH_REMATCH[1]} GEMM algorithms to reuse" "$tmp/b.out" \
    && pass "resume pins the saved GEMM algorithms: $r (the table listed with its size and CRC-32C)" || fail "pinned resume: $r; $(grep -i gemm "$tmp/b.out")"
resume nofile drop
r=$(check nofile)
[[ "$r" =~ pinned\ [0-9]+/0\ losses\ same$ ]] && grep -q "^note: resume: .* has no GEMM algorithms" "$tmp/nofile.out" \
    && pass "negative control: a checkpoint without the table resumes (one note), and the heuristic's algorithms differ: $r" \
    || fail "checkpoint without the table: $r; $(grep -iE 'gemm|error' "$tmp/nofile.out" | head -2)"
for c in flip refused; do
    resume $c $c
    r=$(check $c)
    n=$(grep -cE "^(warning: a GEMM algorithm|note: resume: rank)" "$tmp/$c.out")
    [[ "$r" =~ pinned\ [0-9]+/0\ losses\ same$ ]] && [ "$n" = 1 ] \
        && pass "a $c table: one line ($(grep -E '^(warning: a GEMM algorithm|note: resume: rank)' "$tmp/$c.out" | cut -c1-100)...), the heuristic chooses: $r" \
        || fail "a $c table: $r; $n lines: $(grep -E 'GEMM|gemm' "$tmp/$c.out" | head -3)"
done

# --gemm-autotune 4 (model/matmul_cublaslt.cuh, matmul_plan_autotune): each new plan of the heuristic's that overwrites D
# timed with the twin's 4 answers (the same GEMM each here: the losses are the plain run's bit for bit), its choice in
# the table; resumed from step 2, the run takes the saved choices (pinned, not timed again) and its losses are the same
$EMU "${C[@]}" --gemm-autotune 4 --ckpt-dir "$tmp/t" --ckpt-every 2 --log "$tmp/t.jsonl" > "$tmp/t.out" 2>&1 || fail "--gemm-autotune 4 run: $(tail -2 "$tmp/t.out")"
mkdir -p "$tmp/tr" && cp -r "$tmp/t/step_00000002" "$tmp/tr/"
$EMU "${C[@]}" --gemm-autotune 4 --ckpt-dir "$tmp/tr" --resume auto --log "$tmp/tr.jsonl" > "$tmp/tr.out" 2>&1 || fail "--gemm-autotune resume: $(tail -2 "$tmp/tr.out")"
r=$($PY - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
def table(p):
    return dict(l.split(" : ") for l in open(p).read().splitlines()[2:])
L = lambda n: [json.loads(l)["loss"] for l in open(os.path.join(tmp, n + ".jsonl")) if '"loss"' in l]
saved, resumed = table(os.path.join(tmp, "t", "step_00000002", "gemm_plans_00000.txt")), table(os.path.join(tmp, "tr", "step_00000004", "gemm_plans_00000.txt"))
ranks = sorted({int(v.split()[5], 16) for v in saved.values()})   # (word 5: the twin's answer rank)
print("losses", "same" if L("t") == L("a") and L("tr") == L("a")[2:] else "differ", "answers", ",".join(map(str, ranks)),
      "pinned %d/%d" % (sum(resumed.get(k) == v for k, v in saved.items()), len(saved)))
PY
)
[[ "$r" =~ ^losses\ same\ answers\ [0-3,]+\ pinned\ ([0-9]+)/([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] \
    && [ "${BASH_REMATCH[1]}" -gt 10 ] && grep -q "^gemm: --gemm-autotune 4:" "$tmp/t.out" \
    && pass "--gemm-autotune 4: the losses of the plain run bit for bit (the twin's answers are one GEMM), the choices saved and pinned on resume: $r" \
    || fail "--gemm-autotune 4: $r; $(grep -iE 'gemm|error' "$tmp/t.out" | head -2)"
for bad in "--gemm-autotune 17" "--gemm-autotune -1"; do
    out=$($EMU "${C[@]}" $bad 2>&1); rc=$?
    [ "$rc" = 2 ] && [ "$(grep -c . <<<"$out")" = 1 ] && grep -q "^error: --gemm-autotune" <<<"$out" \
        && pass "$bad: exit 2, one line ($out)" || fail "$bad: exit $rc: $(head -2 <<<"$out")"
done
out=$($EMU --device cpu --model dbrx-tiny --n-layers 2 --seq 32 --steps 1 --gemm-autotune 4 2>&1); rc=$?
[ "$rc" = 2 ] && grep -q "^error: --gemm-autotune 4 is the CUDA step's" <<<"$out" \
    && pass "--gemm-autotune on the CPU backend: exit 2 ($(grep -m1 '^error' <<<"$out"))" || fail "--gemm-autotune on the CPU: exit $rc: $(head -2 <<<"$out")"
