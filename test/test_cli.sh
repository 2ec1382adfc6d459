#!/usr/bin/env bash
# test_cli.sh — the command line: published parameter counts of the presets (--dry-run), --help,
# and every kind of bad input (flags, shapes, data files): one line on stderr and exit code 2.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# --- parameter counts: dbrx-132b exactly as published; the LLM Foundry sizes to their 2 decimals
out=$($BIN --model dbrx-132b --dry-run 2>&1)
if grep -q "parameters: total 131,596,523,520, active 36,469,708,800" <<<"$out"; then pass "dbrx-132b counts 131,596,523,520 / 36,469,708,800"
else fail "dbrx-132b counts: $out"; fi
for row in "dbrx-73b 73.51 20.66" "dbrx-35b 35.65 10.29" "dbrx-18b 18.61 5.53" "dbrx-9b 9.17 2.83" "dbrx-1b 1.02 0.43"; do
    set -- $row
    line=$($BIN --model "$1" --dry-run | grep "^parameters:")
    got=$(sed -E 's/.*total ([0-9,]+), active ([0-9,]+).*/\1 \2/; s/,//g' <<<"$line" | awk '{printf "%.2f %.2f", $1/1e9, $2/1e9}')
    [ "$got" = "$2 $3" ] && pass "$1 counts ${got} B" || fail "$1 counts: got '$got' want '$2 $3' ($line)"
done
$BIN --model dbrx-132b --dry-run | grep -q "FLOPs per token" && pass "dry-run prints FLOPs per token" || fail "dry-run FLOPs"
$BIN --model dbrx-132b --dry-run | grep -q "memory per rank" && pass "dry-run prints memory per rank" || fail "dry-run memory"
# a flag overrides the preset, and the banner says so
$BIN --model dbrx-tiny --n-layers 8 --dry-run | grep -q "layers 8," && pass "flags override the preset" || fail "override"
line=$($BIN --model dbrx-tiny --n-layers 8 --clip-qkv off --dry-run | grep "^model")
grep -q "^model custom (from dbrx-tiny: --n-layers 8 --clip-qkv off): .*clip_qkv off, moe_normalize_expert_weights 1," <<<"$line" \
    && pass "a preset changed by flags is 'custom (from PRESET: the flags)'" || fail "custom banner: $line"
$BIN --model dbrx-tiny --dry-run | grep -q "^model dbrx-tiny: " && pass "the preset as it is keeps its name" || fail "preset banner"

# --- help lists every flag the README promises
help=$($BIN --help)
missing=""
for f in --model --steps --batch --seq --grad-accum --lr --seed --device --data --val-data --dry-run --help \
         --d-model --n-heads --kv-heads --n-layers --ffn-hidden --experts --top-k --vocab --rope-theta --clip-qkv \
         --moe-normalize-expert-weights \
         --moe-loss-weight --z-loss-weight --warmup --weight-decay --grad-clip --val-every --log; do
    grep -q -- "$f" <<<"$help" || missing="$missing $f"
done
[ -z "$missing" ] && pass "--help lists every flag" || fail "--help misses:$missing"

# --- bad flags and shapes
expect_exit 2 "unknown flag" $BIN --bogus
expect_exit 2 "unknown preset" $BIN --model dbrx-999b
expect_exit 2 "non-numeric value" $BIN --batch eight
expect_exit 2 "missing value" $BIN --lr
expect_exit 2 "d_model % n_heads" $BIN --d-model 130 --n-heads 4 --dry-run
expect_exit 2 "n_heads % kv_heads" $BIN --n-heads 4 --kv-heads 3 --dry-run
expect_exit 2 "top_k > experts" $BIN --top-k 17 --dry-run
expect_exit 2 "odd head_dim" $BIN --d-model 12 --n-heads 4 --dry-run
expect_exit 2 "seq > max_seq" $BIN --seq 512 --dry-run
expect_exit 2 "bad device" $BIN --device tpu
expect_exit 2 "negative steps" $BIN --steps -1
# off is spelled 'off': a 0 is not off (the original DBRX code would clamp to 0), nor a negative number
expect_exit 2 "--clip-qkv 0" $BIN --clip-qkv 0 --dry-run
grep -q "expects a positive number or 'off'" <<<"$LAST_ERR" || fail "--clip-qkv 0: $LAST_ERR"
expect_exit 2 "--clip-qkv -1" $BIN --clip-qkv -1 --dry-run
expect_exit 2 "--moe-normalize-expert-weights 0" $BIN --moe-normalize-expert-weights 0 --dry-run
expect_exit 2 "--moe-normalize-expert-weights 0.5 (not a norm)" $BIN --moe-normalize-expert-weights 0.5 --dry-run
$BIN --clip-qkv off --moe-normalize-expert-weights off --dry-run > /dev/null && pass "--clip-qkv off, --moe-normalize-expert-weights off" \
    || fail "off settings refused"

# --- bad data: each names the file
mk() { /usr/bin/python3 - "$@" <<'PY'
import struct, sys
path, magic, version, ntok, nbytes_tokens, value = sys.argv[1], *map(int, sys.argv[2:])
with open(path, "wb") as f:
    f.write(struct.pack("<256i", magic, version, ntok, *([0] * 253)))
    f.write(struct.pack("<%dH" % nbytes_tokens, *([value] * nbytes_tokens)))
PY
}
mk "$tmp/good.bin" 20240520 1 4000 4000 65
mk "$tmp/magic.bin" 12345 1 4000 4000 65
mk "$tmp/version.bin" 20240520 7 4000 4000 65
mk "$tmp/trunc.bin" 20240520 1 4000 3000 65
mk "$tmp/vocab.bin" 20240520 1 4000 4000 400
mk "$tmp/small.bin" 20240520 1 100 100 65
run() { $BIN --steps 1 --batch 1 --seq 128 --val-every 0 "$@"; }
expect_exit 2 "glob matches nothing" run --data "$tmp/none_*.bin"
grep -q "none_" <<<"$LAST_ERR" || fail "glob error names the pattern"
expect_exit 2 "bad magic" run --data "$tmp/magic.bin"
grep -q "magic.bin" <<<"$LAST_ERR" || fail "bad magic error names the file"
expect_exit 2 "bad version" run --data "$tmp/version.bin"
expect_exit 2 "truncated shard" run --data "$tmp/trunc.bin"
grep -q "trunc.bin" <<<"$LAST_ERR" || fail "truncation error names the file"
expect_exit 2 "token id >= vocab" run --data "$tmp/vocab.bin"
grep -q "offset 0" <<<"$LAST_ERR" || fail "vocab error names the offset: $LAST_ERR"
expect_exit 2 "shard smaller than one sequence" run --data "$tmp/small.bin"
expect_exit 2 "bad validation data" run --data "$tmp/good.bin" --val-data "$tmp/magic.bin" --val-every 1
# and the good file trains
if run --data "$tmp/good.bin" >/dev/null 2>&1; then pass "a valid shard trains"; else fail "a valid shard does not train"; fi
