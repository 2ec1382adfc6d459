#!/usr/bin/env bash
# test_mc_eval.sh — multiple-choice evaluation (--eval-mc, data/mc_eval.h, evaluate_mc in train_dbrx.cu):
#   * right answers known by construction (test/gen_mc_eval.py: the true continuation of validation text
#     against random lowercase letters): the untrained model is near chance, after 30 steps acc and
#     acc_norm >= 0.9 and above the untrained model's by 0.3; the JSONL rows and the console line;
#   * every completion's score recomputed in Python from the model's logits (--dump-logits on a
#     validation shard holding the same rows, built again from the documented rule): a context cut from
#     the left, completions of other lengths, one longer than --seq; sums within 1e-5, token counts, and
#     acc (lowest total) / acc_norm (lowest mean) decisions — on the CPU and on the emulated CUDA path;
#   * mpirun -np 2 ZeRO-3 scores what one process scores (41 examples: one rank runs a dummy forward to
#     match the other's count), on the CPU and on the emulated GPU; the version-2 (uint32) file of the same
#     examples scores bit-identically to the version-1 one;
#   * the evaluation leaves no trace: with --fp8 delayed, the losses are bit-identical with and without it;
#   * dev/data/hellaswag_to_bin.py: HellaSwag jsonl -> .bin (bytes: the UTF-8 bytes, " " + ending; cl100k
#     through dev/data/tokenize when it and its ranks are there), read by train_dbrx; its bad input;
#   * malformed files and flags: one line naming the file or flag, exit 2.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx_cpu}
EMU=${EMU:-./train_dbrx_emu}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-/usr/bin/python3}
VAL=data/sotu/sotu_val_000000.bin
tiny=(--model dbrx-tiny --n-layers 2 --val-every 0)

# ---- right answers known by construction
$PY test/gen_mc_eval.py $VAL "$tmp/mc.bin" --n 40 > /dev/null || fail "gen_mc_eval.py"
$BIN "${tiny[@]}" --batch 8 --seq 64 --steps 30 --eval-mc "$tmp/mc.bin" --eval-every 30 --log "$tmp/known.jsonl" > "$tmp/known.out" 2>&1 \
    || fail "training with --eval-mc: $(tail -3 "$tmp/known.out")"
grep -E "^(eval-mc|mc )" "$tmp/known.out" | sed 's/^/   /'
$PY - "$tmp/known.jsonl" <<'PY' && pass "known answers: untrained near chance, 30 steps: acc and acc_norm >= 0.9 and 0.3 above it; logged at step 0 and the end" || fail "known answers: accuracy not as expected"
import json, sys
mc = [json.loads(l) for l in open(sys.argv[1]) if "mc_acc" in l]
assert [r["step"] for r in mc] == [0, 30] and all(r["mc_n"] == 40 for r in mc), mc
u, t = mc
assert u["mc_acc"] <= 0.6 and t["mc_acc"] >= 0.9 and t["mc_acc_norm"] >= 0.9, mc
assert t["mc_acc"] >= u["mc_acc"] + 0.3 and t["mc_acc_norm"] >= u["mc_acc_norm"] + 0.3, mc
PY
grep -qE "^mc +30 \| acc [01]\.[0-9]{4} \| acc_norm [01]\.[0-9]{4} \| 40 examples \|" "$tmp/known.out" && pass "console line: mc STEP | acc | acc_norm | examples" || fail "console line: $(grep '^mc' "$tmp/known.out")"

# ---- every score recomputed from the logits (CPU: 20 steps trained; emulated GPU: 2)
rescore() {   # NAME BINARY SEQ STEPS [flags...]
    local name=$1 bin=$2 T=$3 steps=$4; shift 4
    $PY test/check_mc_eval.py make-check-set $VAL "$tmp/chk$T.bin" "$tmp/rows$T.bin" --seq "$T" > /dev/null || { fail "$name: make-check-set"; return; }
    $bin "${tiny[@]}" --batch 16 --seq "$T" --steps "$steps" --eval-mc "$tmp/chk$T.bin" --eval-every 0 --eval-mc-dump "$tmp/$name.dump" \
        --val-data "$tmp/rows$T.bin" --dump-logits "$tmp/$name.st" "$@" > "$tmp/$name.out" 2>&1 || { fail "$name: $(tail -3 "$tmp/$name.out")"; return; }
    $PY test/check_mc_eval.py rescore "$tmp/chk$T.bin" "$tmp/$name.st" "$tmp/$name.dump" --seq "$T" --tol 1e-5 > "$tmp/$name.v" 2>&1
    grep -v '^pass\|^fail' "$tmp/$name.v" | sed 's/^/   /'
    grep '^pass\|^fail' "$tmp/$name.v" | sed "s/^\(pass\|fail\) /\1 $name: /" > "$tmp/$name.vv"
    verdicts "$tmp/$name.vv" 6
}
rescore cpu $BIN 64 20
export OMP_WAIT_POLICY=passive   # (the emulator's fibers and idle OpenMP threads share the cores)
[ -x "$EMU" ] && rescore emulated-cuda $EMU 32 2 --device cuda || echo "skipped: the emulated CUDA path ($EMU not built)"

# ---- np 2 ZeRO-3 against one process: the evaluation of the same (initial) weights at step 0
$PY test/gen_mc_eval.py $VAL "$tmp/mc41.bin" --n 41 > /dev/null && $PY test/gen_mc_eval.py $VAL "$tmp/mc41v2.bin" --n 41 --version 2 > /dev/null
$PY test/gen_mc_eval.py $VAL "$tmp/mc5.bin" --n 5 --ctx 20 --end 8 > /dev/null
np_check() {   # NAME BINARY N_EXAMPLES_FILE [flags...]
    local name=$1 bin=$2 set=$3; shift 3
    local common=("${tiny[@]}" --steps 1 --eval-every 1 --eval-mc "$set" "$@")
    OMP_NUM_THREADS=1 $bin "${common[@]}" --eval-mc-dump "$tmp/$name.np1" > "$tmp/$name.np1.out" 2>&1 || { fail "$name np 1: $(tail -2 "$tmp/$name.np1.out")"; return; }
    OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $bin "${common[@]}" --shard-group-size 2 --eval-mc-dump "$tmp/$name.np2" > "$tmp/$name.np2.out" 2>&1 \
        || { fail "$name np 2: $(tail -2 "$tmp/$name.np2.out")"; return; }
    grep "^eval-mc\|^mc  *0 " "$tmp/$name.np1.out" "$tmp/$name.np2.out" | sed "s|^$tmp/|   |"
    $PY test/check_mc_eval.py same "$tmp/$name.np1" "$tmp/$name.np2" --step 0 --tol 1e-5 | sed "s/^\(pass\|fail\) /\1 $name np 2 ZeRO-3 vs np 1: /" > "$tmp/$name.v"
    verdicts "$tmp/$name.v" 3
}
np_check cpu $BIN "$tmp/mc41.bin" --batch 8 --seq 64
[ -x "$EMU" ] && np_check emulated-cuda $EMU "$tmp/mc5.bin" --device cuda --batch 4 --seq 32
OMP_NUM_THREADS=1 $BIN "${tiny[@]}" --batch 8 --seq 64 --steps 1 --eval-every 1 --eval-mc "$tmp/mc41v2.bin" --eval-mc-dump "$tmp/v2.dump" > "$tmp/v2.out" 2>&1
grep -q "version 2, uint32 tokens" "$tmp/v2.out" || fail "the version-2 file is read as version 2: $(grep eval-mc "$tmp/v2.out")"
$PY test/check_mc_eval.py same "$tmp/cpu.np1" "$tmp/v2.dump" --step 0 --tol 0 | sed 's/^\(pass\|fail\) /\1 version 2 (uint32) vs version 1 (uint16) file: /' > "$tmp/v2.v"
verdicts "$tmp/v2.v" 3

# ---- no trace: --fp8 delayed training with and without the evaluation (amaxes dropped)
trace=("${tiny[@]}" --seq 64 --batch 4 --steps 5 --val-every 2 --val-steps 1 --fp8 delayed)
$BIN "${trace[@]}" --log "$tmp/t0.jsonl" > /dev/null 2>&1
$BIN "${trace[@]}" --eval-mc "$tmp/mc.bin" --eval-every 2 --log "$tmp/t1.jsonl" > /dev/null 2>&1
losses() { grep -o '"loss": [^,]*\|"val_loss": [^}]*' "$1"; }
if [ "$(grep -c mc_acc "$tmp/t1.jsonl")" = 4 ] && [ -n "$(losses "$tmp/t0.jsonl")" ] && [ "$(losses "$tmp/t0.jsonl")" = "$(losses "$tmp/t1.jsonl")" ]; then
    pass "the evaluation leaves no trace: --fp8 delayed losses and validation bit-identical with --eval-mc (4 evaluations) and without"
else fail "--eval-mc changed training: $(diff <(losses "$tmp/t0.jsonl") <(losses "$tmp/t1.jsonl") | head -4)"; fi

# ---- dev/data/hellaswag_to_bin.py
cat > "$tmp/hs.jsonl" <<'EOF'
{"ind": 1, "ctx": "A man is sitting on a roof. he", "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "label": 3}
{"ind": 2, "ctx": "Caf\u00e9 au lait \u2014 a drink", "endings": ["made with coffee.", "x", "of \ud83d\ude00 joy", "made of stone"], "label": 0}

{"ind": 3, "ctx": "The cat", "endings": ["sat.", "flew to the moon and back again."], "label": 1}
EOF
if $PY dev/data/hellaswag_to_bin.py "$tmp/hs.jsonl" -o "$tmp/hs.bin" > "$tmp/hs.out" 2>&1; then
    $PY - "$tmp/hs.jsonl" "$tmp/hs.bin" <<'PY' && pass "hellaswag_to_bin.py (bytes): version 1, tokens = UTF-8 bytes of ctx and ' ' + ending, labels" || fail "hellaswag_to_bin.py (bytes): wrong file"
import json, sys
sys.path.insert(0, "dev/data")
from hellaswag_to_bin import read_mc_bin
src = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v, ex = read_mc_bin(sys.argv[2])
assert v == 1 and len(ex) == 3
for s, e in zip(src, ex):
    assert e["label"] == s["label"] and e["ctx"] == list(s["ctx"].encode()), (s, e)
    assert e["endings"] == [list((" " + x).encode()) for x in s["endings"]]
PY
    $BIN "${tiny[@]}" --steps 1 --eval-mc "$tmp/hs.bin" --eval-every 0 --log "$tmp/hs.log" > "$tmp/hs.run" 2>&1
    grep -q '"mc_n": 3' "$tmp/hs.log" && pass "train_dbrx reads it (2 and 4 completions per example): $(grep '^mc' "$tmp/hs.run")" || fail "train_dbrx on the converted file: $(tail -2 "$tmp/hs.run")"
else fail "hellaswag_to_bin.py: $(cat "$tmp/hs.out")"; fi
if [ -x dev/data/tokenize ] && [ -f dev/data/.cache/cl100k_base.tiktoken ]; then
    printf '{"ctx": "Hello", "endings": ["world", "there"], "label": 0}\n' > "$tmp/hw.jsonl"
    $PY dev/data/hellaswag_to_bin.py "$tmp/hw.jsonl" -o "$tmp/hw.bin" --tokenizer cl100k --version 2 > /dev/null 2>&1
    $PY -c "import sys; sys.path.insert(0, 'dev/data'); from hellaswag_to_bin import read_mc_bin; v, e = read_mc_bin('$tmp/hw.bin'); assert v == 2 and e[0]['ctx'] == [9906] and e[0]['endings'][0] == [1917], e" 2>/dev/null \
        && pass "hellaswag_to_bin.py --tokenizer cl100k (dev/data/tokenize): 'Hello' = [9906], ' world' = [1917], version 2" || fail "hellaswag_to_bin.py --tokenizer cl100k"
else echo "skipped: hellaswag_to_bin.py --tokenizer cl100k (dev/data/tokenize or its cl100k ranks missing)"; fi
printf '{"ctx": "a", "endings": ["b", "c"], "label": 2}\n' > "$tmp/bad.jsonl"
expect_exit 2 "hellaswag_to_bin.py: a label beyond the endings" $PY dev/data/hellaswag_to_bin.py "$tmp/bad.jsonl" -o "$tmp/bad.bin"
printf '{"ctx": "a", "label": 0}\n' > "$tmp/bad2.jsonl"
expect_exit 2 "hellaswag_to_bin.py: no endings" $PY dev/data/hellaswag_to_bin.py "$tmp/bad2.jsonl" -o "$tmp/bad.bin"

# ---- malformed files and flags: one line naming the file or flag, exit 2
$PY - "$tmp/mc5.bin" "$tmp" <<'PY'
import struct, sys
src, d = sys.argv[1], sys.argv[2]
b = bytearray(open(src, "rb").read())
def put(name, data): open(f"{d}/{name}.bin", "wb").write(bytes(data))
def w16(buf, off, v): struct.pack_into("<H", buf, off, v)
x = bytearray(b); struct.pack_into("<i", x, 0, 20240520); put("magic", x)
x = bytearray(b); struct.pack_into("<i", x, 4, 3); put("version", x)
put("truncated", b[:-3])
put("trailing", b + b"\0\0")
put("header", b[:100])
x = bytearray(b); w16(x, 1024 + 6, 4); put("label", x)          # LABEL of example 0 = its 4 completions
x = bytearray(b); w16(x, 1024 + 12, 300); put("token", x)       # the first context token = 300 >= --vocab 257
x = bytearray(b); w16(x, 1024 + 4, 7); put("index", x)          # INDEX of example 0
x = bytearray(b); w16(x, 1024, 0); put("start", x)              # START marker
PY
bad=("${tiny[@]}" --n-layers 1 --steps 1 --vocab 257 --seq 32 --batch 4)
for f in magic:"a token shard's magic" version:"version 3" truncated:"3 bytes cut off" trailing:"2 bytes too many" \
         header:"a cut header" label:"a label beyond the completions" token:"a token >= --vocab" index:"a wrong index field" \
         start:"no start marker"; do
    what=${f#*:}; f=${f%%:*}
    expect_exit 2 "--eval-mc: $what" $BIN "${bad[@]}" --eval-mc "$tmp/$f.bin"
    grep -q -- "--eval-mc $tmp/$f.bin" <<<"$LAST_ERR" || fail "the message names the flag and the file: $LAST_ERR"
done
expect_exit 2 "--eval-mc: a file that does not exist" $BIN "${bad[@]}" --eval-mc "$tmp/none.bin"
expect_exit 2 "--eval-mc: a directory" $BIN "${bad[@]}" --eval-mc "$tmp"
expect_exit 2 "--eval-every without --eval-mc" $BIN "${bad[@]}" --eval-every 5
expect_exit 2 "--eval-every -1" $BIN "${bad[@]}" --eval-mc "$tmp/mc5.bin" --eval-every -1
expect_exit 2 "--eval-mc-dump without --eval-mc" $BIN "${bad[@]}" --eval-mc-dump "$tmp/x.jsonl"
