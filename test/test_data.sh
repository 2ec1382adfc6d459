#!/usr/bin/env bash
# test_data.sh — the data tools end to end:
#   * dev/data/tokenize --tokenizer bytes: shards equal to an independent Python reading of the same
#     documents (text files and JSONL, train/val split, shard cut, header), whatever the threads;
#   * --tokenizer cl100k: token-for-token identical to js-tiktoken (the oracle, with DBRX's special
#     tokens) on a varied corpus (test/gen_tokenizer_corpus.py) and on State of the Union addresses,
#     with the special tokens' text as text and as special tokens;
#   * the tokenizer's bad input: one line naming the file (and line), exit 2, no shard left behind;
#   * train_dbrx: --data mixtures and --data-schedule (valid ones train, bad ones exit 2 naming the
#     flag), version-2 (uint32) shards, cl100k shards with a 100352 vocabulary, and token ids
#     beyond the model's vocabulary;
#   * shards that are not regular files (a FIFO as --data and --val-data: refused, never blocking; a
#     directory) and shards changed under a running job (truncated: SIGBUS named; rewritten in place,
#     replaced: found at the next epoch): one line, exit 2;
#   * a short libFuzzer run over the shard, state and flag parsers and the pre-tokenizer.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
TOK=./dev/data/tokenize
PY=${PYTHON:-/usr/bin/python3}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# --- byte-level tokenizer against an independent reading of the same documents
mkdir -p "$tmp/in"
printf 'first document\nwith two lines\n' > "$tmp/in/b.txt"
printf 'caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 <|endoftext|>' > "$tmp/in/a.txt"
: > "$tmp/in/c.txt"
printf 'third\r\n\t\n' > "$tmp/in/d.txt"
$PY - "$tmp/in/docs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(23):
        f.write(json.dumps({"n": i, "text": "doc %d: " % i + "\u00e9\u4e2d\U0001F600" * i, "x": [1, {"y": "z"}]}) + "\n")
        if i == 5: f.write("\n")   # a blank line is no document
PY
check_bytes() {   # name, tokenize flags..., -- files...
    local name=$1; shift
    local flags=() files=()
    while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
    files=("$@")
    for th in 1 2; do
        rm -rf "$tmp/out_$name"
        $TOK --tokenizer bytes --quiet --threads $th --out-dir "$tmp/out_$name" --name x "${flags[@]}" "${files[@]}" >/dev/null \
            || { fail "tokenize bytes $name (threads $th) exited $?"; return; }
        if $PY - "$tmp/out_$name" "${flags[*]}" "${files[@]}" <<'PY'
import json, os, struct, sys
out, flags, files = sys.argv[1], sys.argv[2].split(), sorted(sys.argv[3:])
opt = dict(zip(flags[::2], flags[1::2]))
docs = []
for path in files:
    raw = open(path, "rb").read()
    if "--jsonl" in opt:
        docs += [json.loads(l)[opt["--jsonl"]].encode() for l in raw.decode().split("\n") if l.strip()]
    else:
        docs.append(raw)
every, per = int(opt.get("--val-every", 0)), int(opt.get("--shard-tokens", 100000000))
for split, pick in (("train", lambda i: not (every and i % every == 0)), ("val", lambda i: every and i % every == 0)):
    want = []
    for i, d in enumerate(docs):
        if pick(i): want += [256] + list(d)
    got, k = [], 0
    while os.path.exists(f"{out}/x_{split}_{k:06d}.bin"):
        b = open(f"{out}/x_{split}_{k:06d}.bin", "rb").read()
        h = struct.unpack("<256i", b[:1024])
        assert h[:4] == (20240520, 1, (len(b) - 1024) // 2, 2) and not any(h[4:]), h[:5]
        assert h[2] == per or not os.path.exists(f"{out}/x_{split}_{k + 1:06d}.bin"), "shard size"
        got += struct.unpack("<%dH" % h[2], b[1024:])
        k += 1
    assert got == want, (split, len(got), len(want))
PY
        then pass "tokenize bytes $name (threads $th): shards match an independent reading"
        else fail "tokenize bytes $name (threads $th)"; fi
    done
}
check_bytes text --val-every 3 --shard-tokens 20 -- "$tmp"/in/*.txt
check_bytes jsonl --jsonl text --val-every 4 --shard-tokens 100 -- "$tmp/in/docs.jsonl"

# --- cl100k: token-for-token parity with js-tiktoken
if ! bash dev/data/setup_tiktoken.sh >/dev/null; then
    fail "dev/data/setup_tiktoken.sh (js-tiktoken from the npm registry)"
else
    $PY test/gen_tokenizer_corpus.py "$tmp/corpus" 300 | sed 's/^/   corpus: /'
    sotu=(dev/data/.cache/package/data/18[0-4]*.json)   # 50 addresses, about 1 MB
    parity() {   # name, flags..., -- files...
        local name=$1; shift
        local flags=()
        while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
        rm -rf "$tmp/tk"
        local out; out=$($TOK --tokenizer cl100k --quiet --out-dir "$tmp/tk" --name p "${flags[@]}" "$@") \
            || { fail "tokenize cl100k $name exited $?"; return; }
        node dev/data/tiktoken_oracle.mjs --out "$tmp/oracle.u32" "${flags[@]}" "$@" | sed 's/^/   /'
        if $PY - "$tmp/tk/p_train_000000.bin" "$tmp/oracle.u32" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
h = struct.unpack("<5i", b[:20])
assert h[:2] == (20240520, 2) and h[3] == 4 and h[2] == (len(b) - 1024) // 4, h
got = struct.unpack("<%dI" % h[2], b[1024:])
o = open(sys.argv[2], "rb").read()
want = struct.unpack("<%dI" % (len(o) // 4), o)
if got != want:
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
    sys.exit(f"   first difference at token {i} of {len(want)}: ours {got[max(0, i - 3):i + 5]} js-tiktoken {want[max(0, i - 3):i + 5]}")
assert max(got) < 100352
print(f"   {len(got)} tokens identical, ids {min(got)}..{max(got)}")
PY
        then pass "cl100k $name: identical to js-tiktoken"
        else fail "cl100k $name differs from js-tiktoken"; fi
    }
    parity "varied corpus (scripts, emoji, whitespace, numbers, contractions, long pieces)" --jsonl text -- "$tmp/corpus/corpus.jsonl"
    parity "varied corpus, special tokens allowed" --jsonl text --allow-special -- "$tmp/corpus/corpus.jsonl"
    if [ -f "${sotu[0]}" ]; then parity "State of the Union 1800-1849" --json text -- "${sotu[@]}"
    else fail "State of the Union addresses missing (run make data)"; fi
    $TOK --tokenizer cl100k --quiet --threads 1 --out-dir "$tmp/tk1" --name p --jsonl text "$tmp/corpus/corpus.jsonl" >/dev/null
    cmp -s "$tmp/tk/p_train_000000.bin" "$tmp/tk1/p_train_000000.bin" 2>/dev/null; rc=$?
    $TOK --tokenizer cl100k --quiet --threads 2 --out-dir "$tmp/tk" --name p --jsonl text "$tmp/corpus/corpus.jsonl" >/dev/null
    cmp -s "$tmp/tk/p_train_000000.bin" "$tmp/tk1/p_train_000000.bin" && pass "cl100k: 1 and 2 threads write the same shard" \
        || fail "cl100k: threads change the output"
fi

# --- the tokenizer's bad input
printf '{"text": "ok"}\n{"text": "ok", }\n' > "$tmp/in/badjson.jsonl"
printf '{"text": "ok"}\n{"body": "no text"}\n' > "$tmp/in/nofield.jsonl"
printf '{"text": 5}\n' > "$tmp/in/notstring.jsonl"
printf 'not a rank file\n' > "$tmp/in/bad.tiktoken"
tk() { $TOK --quiet --tokenizer bytes --out-dir "$tmp/bad_out" --name b "$@"; }
expect_exit 2 "tokenize: missing input file" tk "$tmp/in/nothere.txt"
grep -q "nothere.txt" <<<"$LAST_ERR" || fail "missing input names the file"
printf '{"text": "first"}\n{"text": "second"}\n' > "$tmp/in/a_good.jsonl"
expect_exit 2 "tokenize: bad JSON names file:line" tk --jsonl text --shard-tokens 3 "$tmp/in/badjson.jsonl" "$tmp/in/a_good.jsonl"
grep -q "badjson.jsonl:2" <<<"$LAST_ERR" || fail "bad JSON names file:line: $LAST_ERR"
[ -z "$(ls -A "$tmp/bad_out" 2>/dev/null)" ] && pass "tokenize: no shard left after bad input" || fail "shards left after bad input: $(ls "$tmp/bad_out")"
expect_exit 2 "tokenize: missing JSON field" tk --jsonl text "$tmp/in/nofield.jsonl"
grep -q "nofield.jsonl:2: has no field 'text'" <<<"$LAST_ERR" || fail "missing field message: $LAST_ERR"
expect_exit 2 "tokenize: field not a string" tk --jsonl text "$tmp/in/notstring.jsonl"
expect_exit 2 "tokenize: unknown tokenizer" $TOK --tokenizer gpt9 --out-dir "$tmp/x" --name b "$tmp/in/a.txt"
expect_exit 2 "tokenize: unknown flag" tk --bogus 1 "$tmp/in/a.txt"
expect_exit 2 "tokenize: no input" tk
expect_exit 2 "tokenize: bad --shard-tokens" tk --shard-tokens 0 "$tmp/in/a.txt"
expect_exit 2 "tokenize: bad ranks file" $TOK --tokenizer cl100k --ranks "$tmp/in/bad.tiktoken" --out-dir "$tmp/x" --name b "$tmp/in/a.txt"
grep -q "bad.tiktoken:1" <<<"$LAST_ERR" || fail "bad ranks names file:line: $LAST_ERR"

# --- train_dbrx with mixtures, schedules and uint32 shards
run() { $BIN --model dbrx-tiny --n-layers 1 --steps 2 --batch 2 --seq 64 --val-every 0 "$@"; }
mix="web=data/sotu/sotu_train_00000[01].bin:0.7,old=data/sotu/sotu_train_000002.bin:0.3"
out=$(run --data "$mix" --data-schedule "1:web=0.2,old=0.8" 2>&1) && grep -q "^--data web: 2 shard(s)" <<<"$out" \
    && pass "train_dbrx trains on a mixture with a schedule" || fail "mixture training: $(tail -3 <<<"$out")"
expect_exit 2 "--data mixture without a weight" run --data "web=data/sotu/sotu_train_*.bin"
grep -q -- "--data" <<<"$LAST_ERR" || fail "mixture error names --data"
expect_exit 2 "--data mixture with a zero weight" run --data "web=data/sotu/sotu_train_*.bin:0,b=data/sotu/sotu_val_*.bin:1"
expect_exit 2 "--data mixture source matching nothing" run --data "web=data/sotu/nothing_*.bin:1,b=data/sotu/sotu_val_*.bin:1"
grep -q "source 'web'" <<<"$LAST_ERR" || fail "mixture glob error names the source: $LAST_ERR"
expect_exit 2 "--data-schedule naming an unknown source" run --data "$mix" --data-schedule "5:web=1,code=1"
grep -q -- "--data-schedule" <<<"$LAST_ERR" || fail "schedule error names --data-schedule"
expect_exit 2 "--data-schedule without a mixture" run --data "data/sotu/sotu_train_*.bin" --data-schedule "5:web=1"
$PY - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(path, tokens, magic=20240520, version=2, bpt=4):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", magic, version, len(tokens), bpt, *([0] * 252)))
        f.write(struct.pack("<%dI" % len(tokens), *tokens))
shard(f"{d}/u32.bin", [(i * 7) % 300 for i in range(5000)])
shard(f"{d}/llmc_u32.bin", [(i * 7) % 300 for i in range(5000)], 20240801, 7, 0)
shard(f"{d}/u32_vocab.bin", [5] * 2000 + [100000] * 3000)
PY
run --data "$tmp/u32.bin" >/dev/null 2>&1 && pass "train_dbrx trains on version-2 (uint32) shards" || fail "uint32 shards"
run --data "$tmp/llmc_u32.bin" >/dev/null 2>&1 && pass "train_dbrx trains on llm.c's uint32 shards (magic 20240801 v7)" || fail "llm.c uint32 shards"
expect_exit 2 "uint32 token >= vocab names file and offset" run --data "$tmp/u32_vocab.bin" --batch 8
grep -q "u32_vocab.bin: token 100000 at offset 2000 (byte 9024)" <<<"$LAST_ERR" || fail "uint32 vocab message: $LAST_ERR"
if [ -f "$tmp/tk/p_train_000000.bin" ]; then
    out=$(run --data "$tmp/tk/p_train_000000.bin" --vocab 100352 --steps 1 2>&1) && grep -q "^step" <<<"$out" \
        && pass "train_dbrx trains on cl100k shards with --vocab 100352" || fail "cl100k shards: $(tail -2 <<<"$out")"
    expect_exit 2 "cl100k shards with the byte vocabulary: token >= vocab" run --data "$tmp/tk/p_train_000000.bin" --steps 1
fi

# --- shards that are not regular files, or that change under a running job
mkfifo "$tmp/fifo.bin"; mkdir -p "$tmp/adir.bin"
# (SIGKILL at the limit: a process blocked in open() of a FIFO would take SIGTERM as a request to stop)
expect_exit 2 "a FIFO as --data is refused, not opened (it would block)" timeout -s KILL 10 $BIN --steps 1 --val-every 0 --data "$tmp/fifo.bin"
grep -q "fifo.bin: not a regular file (a FIFO)" <<<"$LAST_ERR" || fail "FIFO message: $LAST_ERR"
expect_exit 2 "a FIFO as --val-data" timeout -s KILL 10 $BIN --steps 1 --val-every 1 --val-data "$tmp/fifo.bin"
expect_exit 2 "a directory matched by the --data glob" timeout -s KILL 10 $BIN --steps 1 --val-every 0 --data "$tmp/adir.*"
grep -q "adir.bin: not a regular file (a directory)" <<<"$LAST_ERR" || fail "directory message: $LAST_ERR"
$PY - "$tmp" <<'PY'
import array, struct, sys
d = sys.argv[1]
def shard(path, n):
    t = array.array("H", range(250)) * (n // 250 + 1)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, 2, *([0] * 252)))
        f.write(t[:n].tobytes())
shard(f"{d}/big.bin", 4000000)     # 62499 windows of 64: no epoch ends in this test
for name in ("small_a", "small_b", "small_c"): shard(f"{d}/{name}.bin", 1000)   # 15 windows: an epoch every 8 steps
PY
# live NAME WANT-REGEX SHARD ACTION: trains on SHARD in the background; after 2 steps runs ACTION (on the
# shard); the job must then end by itself with exit 2 and one stderr line matching WANT-REGEX
live() {
    local name=$1 want=$2 shard=$3 action=$4
    rm -f "$tmp/live.jsonl"
    $BIN --model dbrx-tiny --n-layers 1 --d-model 64 --n-heads 2 --kv-heads 1 --ffn-hidden 64 --batch 2 --seq 64 --steps 100000 \
         --val-every 0 --data "$shard" --log "$tmp/live.jsonl" > /dev/null 2> "$tmp/live.err" & local P=$!
    waitlog "$tmp/live.jsonl" 2 || fail "$name: no progress: $(tail -2 "$tmp/live.err")"
    eval "$action"
    local i; for i in $(seq 1 300); do kill -0 $P 2>/dev/null || break; sleep 0.1; done
    if kill -0 $P 2>/dev/null; then kill -9 $P; wait $P 2>/dev/null; fail "$name: still running 30 s later"; return; fi
    wait $P; local rc=$?
    if [ "$rc" = 2 ] && [ "$(grep -c . "$tmp/live.err")" = 1 ] && grep -qE "$want" "$tmp/live.err"; then
        pass "$name: exit 2 after $(grep -c '"loss"' "$tmp/live.jsonl") steps: $(sed "s|$tmp/||" "$tmp/live.err")"
    else fail "$name: exit $rc: $(head -c 400 "$tmp/live.err")"; fi
}
live "a shard truncated while training (SIGBUS in the mapping)" \
     "^error: $tmp/big.bin: SIGBUS reading byte [0-9]+ of the memory-mapped shard: the file was truncated .* \(it was 8001024 bytes when opened\)" \
     "$tmp/big.bin" 'truncate -s 100000 "$tmp/big.bin"'
live "a shard rewritten in place while training (found at the next epoch)" \
     "^error: $tmp/small_a.bin: the shard changed while training was running: it was modified" \
     "$tmp/small_a.bin" '$PY -c "import os, sys; p = sys.argv[1]; st = os.stat(p); f = open(p, \"r+b\"); f.seek(3000); f.write(bytes(2)); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))" "$tmp/small_a.bin"'
live "a shard replaced while training (found at the next epoch)" \
     "^error: $tmp/small_b.bin: the shard changed while training was running: it was replaced by another file" \
     "$tmp/small_b.bin" 'cp "$tmp/small_c.bin" "$tmp/small_b.tmp" && mv "$tmp/small_b.tmp" "$tmp/small_b.bin"'

# --- libFuzzer: shard, state and flag parsers, pre-tokenizer
if [ -x ./test/fuzz_data ]; then
    mkdir -p "$tmp/fuzz"
    $PY - "$tmp/fuzz" <<'PY'
import struct, sys
d = sys.argv[1]
open(f"{d}/v1", "wb").write(b"\0" + struct.pack("<256i", 20240520, 1, 3, 2, *([0] * 252)) + struct.pack("<3H", 1, 2, 999))
open(f"{d}/v2", "wb").write(b"\0" + struct.pack("<256i", 20240520, 2, 2, 4, *([0] * 252)) + struct.pack("<2I", 1, 70000))
open(f"{d}/state", "wb").write(b'\1{"version": 1, "seed": 7, "position": 5, "batches": 1, "sources": [{"epoch": 1, "position": 5, "windows": 4}]}')
open(f"{d}/spec", "wb").write(b"\2web=/d/a_*.bin:0.7,code=/d/b:c*.bin:0.3\n100:web=1,code=0;200:code=1,web=1")
open(f"{d}/text", "wb").write("\3Hello it's 12345 \u4e2d\u6587 \U0001F600\u200d  \n\n x\r\n 'RE \u00a0\ufeff".encode() + b"\xff\xc3")
PY
    mkdir -p test/fuzz_artifacts   # a finding is kept there (git-ignored): ./test/fuzz_data FILE replays it
    out=$(./test/fuzz_data -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -artifact_prefix=test/fuzz_artifacts/ "$tmp/fuzz" 2>&1); rc=$?
    runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" <<<"$out" | grep -oE "[0-9]+$")
    [ "$rc" = 0 ] && [ -n "$runs" ] && pass "libFuzzer ${FUZZ_SECONDS}s: $runs inputs, no finding" \
        || fail "libFuzzer finding (exit $rc): $(grep -E "ERROR|invariant|SUMMARY" <<<"$out" | head -5)"
else
    fail "test/fuzz_data not built (clang++ with libFuzzer: apt-get install clang)"
fi
