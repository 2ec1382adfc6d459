#!/usr/bin/env bash
# test_generate.sh — generation (model/README.md, "Generation"), on the CPU backend ($BIN) and the emulated
# CUDA backend ($EMU, --device cuda), one process and ZeRO-3 over 2 ranks:
#   * a small model trained on one fixed text (a shard of that text repeated, each copy a document that
#     starts with the end-of-text token) prints samples during training (--sample-every) that reproduce
#     it, and logs them; --generate then reproduces it greedily from a prefix of it, through the KV cache:
#     from the checkpoint (--resume) and from its Hugging Face export (--init-hf), on the CPU and on the
#     emulated GPU, in one process and under ZeRO-3 with 2 ranks — stdout is the text and nothing else;
#   * sampling at temperature 1 (top-k 20, a seed): the same text with 1 and 2 ranks (ZeRO-3), on each
#     backend (rank 0 draws and broadcasts, the logits are the same: the gathered weights are);
#   * samples during training change nothing: the losses with --sample-every are bit-identical to those
#     without, on the CPU (1 rank, ZeRO-3 2 ranks) and the emulated GPU (1 rank, ZeRO-3 2 ranks), also with
#     --fp8 delayed --fp8-gather (the samples' GEMMs are not FP8 and leave the scaling state alone), and only
#     rank 0 prints them;
#   * the cl100k tokenizer (DBRX's): a model with DBRX's vocabulary picks it by itself, encodes the
#     prompt's special tokens, and writes text (when dev/data/.cache has the ranks);
#   * bad flags: one line, exit 2.
# test/test_decode.cpp has the exact checks (the KV cache against the full forward, position by position).
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx_cpu}
EMU=${EMU:-./train_dbrx_emu}
PY=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
t_start=$(date +%s)
have_emu=1; [ -x "$EMU" ] || { have_emu=0; echo "skipped: the emulated CUDA checks (no $EMU)"; }

TEXT='The quick brown fox jumps over the lazy dog, 1234567890 times!'
PREFIX='The quick'
$PY - "$tmp/mem_train_000000.bin" "$TEXT" <<'PY'
import struct, sys
text = sys.argv[2].encode()
toks = []
while len(toks) < 20000:
    toks += [256] + list(text)          # end-of-text, then the document (dev/data/tokenize's layout)
hdr = [20240520, 1, len(toks), 2] + [0] * 252   # data/README.md: version 1, uint16 tokens
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
PY
model=(--model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 4 --kv-heads 2 --experts 4 --top-k 2 --ffn-hidden 128 --max-seq 128)
train=("${model[@]}" --seq 64 --batch 8 --lr 3e-3 --warmup 10 --data "$tmp/mem_train_*.bin" --val-data '')

# ---- training with samples; a checkpoint and an fp32 export of the memorised model
OMP_NUM_THREADS=2 $BIN "${train[@]}" --steps 100 --sample-every 50 --temperature 0 --prompt "$PREFIX" --sample-len 80 \
    --ckpt-dir "$tmp/ck" --export-hf "$tmp/hf" --export-dtype fp32 --log "$tmp/mem.jsonl" > "$tmp/mem.out" 2>&1 \
    || { fail "training on the fixed text: $(tail -3 "$tmp/mem.out")"; exit 0; }
grep "^sample 100" "$tmp/mem.out" | head -1 | sed 's/^/   /'
if grep -qxF "sample 100: $TEXT" "$tmp/mem.out" && [ "$(grep -c '^sample [0-9]*: ' "$tmp/mem.out")" = 4 ]; then
    pass "--sample-every 50: 'sample 50', 'sample 100' printed (and their timing lines); the memorised text reproduced greedily"
else fail "--sample-every: $(grep '^sample' "$tmp/mem.out" | head -4)"; fi
$PY - "$tmp/mem.jsonl" "${TEXT#"$PREFIX"}" <<'PY' && pass "--sample-every: the samples are in the JSONL log as {\"step\", \"sample\"}" || fail "--sample-every: the JSONL log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = [r for r in rows if "sample" in r]
assert [r["step"] for r in s] == [50, 100], s
assert s[-1]["sample"] == sys.argv[2], s[-1]
PY

# ---- --generate: stdout is the text, and nothing else
expect="$TEXT"
gen() {   # gen NAME CMD...: stdout must be the memorised text
    local name=$1; shift
    local out; out=$("$@" 2>"$tmp/gen.err"); local rc=$?
    if [ "$rc" = 0 ] && [ "$out" = "$expect" ]; then pass "$name: '$out'"
    else fail "$name: exit $rc, stdout '$out': $(grep -i error "$tmp/gen.err" | head -2)"; fi
}
g=(--generate --prompt "$PREFIX" --temperature 0 --sample-len 80)
gen "--generate --resume (cpu, the shape from the manifest)" $BIN "${g[@]}" --resume "$tmp/ck/step_00000100"
gen "--generate --resume auto --ckpt-dir (cpu)" $BIN "${g[@]}" --resume auto --ckpt-dir "$tmp/ck"
gen "--generate --init-hf (cpu, the shape from config.json)" $BIN "${g[@]}" --init-hf "$tmp/hf"
gen "--generate --resume, ZeRO-3 mpirun -np 2 (cpu)" env OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $BIN "${g[@]}" --resume "$tmp/ck/step_00000100"
if [ $have_emu = 1 ]; then
    gen "--generate --resume (emulated cuda)" $EMU --device cuda "${g[@]}" --resume "$tmp/ck/step_00000100"
    gen "--generate --init-hf (emulated cuda)" $EMU --device cuda "${g[@]}" --init-hf "$tmp/hf"
    gen "--generate --resume, ZeRO-3 mpirun -np 2 (emulated cuda, NCCL twin)" env OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $EMU --device cuda "${g[@]}" --resume "$tmp/ck/step_00000100"
fi
# the banner and notes go to stderr; the tokens per second too
$BIN "${g[@]}" --resume "$tmp/ck/step_00000100" 2>&1 >/dev/null | grep -E "^(model|generate)" | sed 's/^/   /'

# ---- sampling (temperature 1, top-k 20, seeded) from a model that has not memorised anything: the same text on 1 and 2 ranks
OMP_NUM_THREADS=2 $BIN "${train[@]}" --steps 3 --ckpt-dir "$tmp/ck3" > "$tmp/ck3.out" 2>&1 || fail "3 steps for the sampling checks: $(tail -2 "$tmp/ck3.out")"
s=(--generate --resume "$tmp/ck3/step_00000003" --prompt "$PREFIX" --temperature 1 --sample-top-k 20 --sample-seed 5 --sample-len 40)
a=$($BIN "${s[@]}" 2>/dev/null); b=$(OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $BIN "${s[@]}" 2>/dev/null)
c=$($BIN "${s[@]}" --sample-seed 6 2>/dev/null)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && [ "${a#"$PREFIX"}" != "$a" ]; then pass "sampling (cpu): ZeRO-3 np 2 writes np 1's text; another --sample-seed another text"
else fail "sampling (cpu): np 1 '$a', np 2 '$b', seed 6 '$c'"; fi
if [ $have_emu = 1 ]; then
    a=$($EMU --device cuda "${s[@]}" 2>/dev/null); b=$(OMP_NUM_THREADS=1 bash dev/mpirun.sh -np 2 $EMU --device cuda "${s[@]}" 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "sampling (emulated cuda): ZeRO-3 np 2 writes np 1's text"
    else fail "sampling (emulated cuda): np 1 '$a', np 2 '$b'"; fi
fi

# ---- samples during training leave the training alone: bit-identical losses; rank 0 prints
losses() { $PY -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1]) if '\"loss\"' in l])" "$1"; }
same_losses() {   # same_losses NAME NP RUNNER...: the run with --sample-every 1 against the run without (flags: + $extra)
    local name=$1 np=$2; shift 2
    local short=("${model[@]}" --seq 32 --batch 2 --steps 3 --data "$tmp/mem_train_*.bin" --val-data '' $extra)
    OMP_NUM_THREADS=1 "$@" "${short[@]}" --log "$tmp/a.jsonl" > "$tmp/a.out" 2>&1
    OMP_NUM_THREADS=1 "$@" "${short[@]}" --sample-every 1 --sample-len 8 --log "$tmp/b.jsonl" > "$tmp/b.out" 2>&1
    local la lb n; la=$(losses "$tmp/a.jsonl"); lb=$(losses "$tmp/b.jsonl"); n=$(grep -c '^sample [123]: ' "$tmp/b.out")
    if [ -n "$la" ] && [ "$la" = "$lb" ] && [ "$n" = 6 ]; then pass "$name: losses with --sample-every 1 bit-identical to without $la; 3 samples printed once"
    else fail "$name: losses $la vs $lb, $n sample lines (want 6: rank 0 only): $(grep -i error "$tmp/b.out" | head -2)"; fi
}
same_losses "training (cpu)" 1 $BIN
same_losses "training, ZeRO-3 np 2 (cpu)" 2 bash dev/mpirun.sh -np 2 $BIN
extra="--fp8 delayed --fp8-gather" same_losses "training --fp8 delayed --fp8-gather, ZeRO-3 np 2 (cpu)" 2 bash dev/mpirun.sh -np 2 $BIN
if [ $have_emu = 1 ]; then
    same_losses "training (emulated cuda)" 1 $EMU --device cuda
    same_losses "training, ZeRO-3 np 2 (emulated cuda)" 2 bash dev/mpirun.sh -np 2 $EMU --device cuda
    extra="--fp8 delayed --fp8-gather" same_losses "training --fp8 delayed --fp8-gather, ZeRO-3 np 2 (emulated cuda)" 2 \
        bash dev/mpirun.sh -np 2 $EMU --device cuda
fi

# ---- the cl100k tokenizer: a model with DBRX's vocabulary (its weights as initialised: --stop-after 0 saves step 0)
ranks=dev/data/.cache/cl100k_base.tiktoken
if [ -f "$ranks" ]; then
    big=(--model dbrx-tiny --n-layers 1 --d-model 32 --n-heads 2 --kv-heads 1 --experts 2 --top-k 1 --ffn-hidden 32 --vocab 100352)
    OMP_NUM_THREADS=2 $BIN "${big[@]}" --seq 32 --batch 1 --steps 1 --stop-after 0 --data "$tmp/mem_train_*.bin" --val-data '' \
        --ckpt-dir "$tmp/ckbig" > "$tmp/big.out" 2>&1 || fail "a vocab-100352 checkpoint: $(tail -2 "$tmp/big.out")"
    out=$($BIN --generate --resume "$tmp/ckbig/step_00000000" --prompt '<|im_start|>user Hello' --sample-len 12 2>"$tmp/big.err"); rc=$?
    if [ "$rc" = 0 ] && [ "${out#'<|im_start|>user Hello'}" != "$out" ] && grep -q "generate: 4 prompt tokens .*cl100k tokenizer" "$tmp/big.err"; then
        pass "cl100k (auto for --vocab 100352): the prompt is 4 tokens (<|endoftext|>, <|im_start|>, 'user', ' Hello'), the text decoded: '$(printf %s "$out" | head -c 80)'"
    else fail "cl100k: exit $rc, '$out': $(grep -E 'error|generate' "$tmp/big.err" | head -2)"; fi
else echo "skipped: cl100k generation (no $ranks: dev/data/setup_tiktoken.sh)"; fi

# ---- bad input: one line, exit 2
ck=(--resume "$tmp/ck/step_00000100")
expect_exit 2 "--sample-len 0" $BIN --generate "${ck[@]}" --sample-len 0
expect_exit 2 "--temperature -1" $BIN --generate "${ck[@]}" --temperature -1
expect_exit 2 "--sample-top-k -1" $BIN --sample-every 5 --sample-top-k -1
expect_exit 2 "--sample-every -1" $BIN --sample-every -1
expect_exit 2 "--generate without weights" $BIN --generate
expect_exit 2 "--generate with --resume and --init-hf" $BIN --generate "${ck[@]}" --init-hf "$tmp/hf"
expect_exit 2 "--tokenizer unknown" $BIN --sample-every 5 --tokenizer gpt2
expect_exit 2 "--tokenizer cl100k for a 384-id vocabulary" $BIN --sample-every 5 --tokenizer cl100k
expect_exit 2 "--tokenizer-ranks missing" $BIN --sample-every 5 --vocab 100352 --tokenizer-ranks "$tmp/none.tiktoken"
expect_exit 2 "a prompt and --sample-len beyond max_seq" $BIN --generate "${ck[@]}" --sample-len 120 --prompt "$PREFIX"
expect_exit 2 "--generate --resume of no checkpoint" $BIN --generate --resume "$tmp/nothing"
expect_exit 2 "--generate --resume auto, none there" $BIN --generate --resume auto --ckpt-dir "$tmp/empty"
expect_exit 2 "--generate --resume with another --d-model" $BIN --generate "${ck[@]}" --d-model 128
echo "   test_generate.sh: $(( $(date +%s) - t_start )) s"
