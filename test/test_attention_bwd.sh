#!/usr/bin/env bash
# test_attention_bwd.sh — --attention-bwd wgmma | wgmma-overlap: the GPU step's attention backward at head_dim 64 and 128
# on model/attention_wgmma_bwd.cuh's kernels (the D kernel, a wgmma dq kernel, a wgmma dk/dv kernel) instead of the
# mma.sync pair (model/attention_flash_bwd.cuh). On the emulated GPU they sum in the pair's k order with its elementwise
# arithmetic, so the training step must not change by a bit:
#   * dbrx-tiny at head_dim 128 (1 head: GQA 1:1; T 160: three key tiles, a query block short of 128 rows) and at head_dim
#     64 (2 query heads on 1 kv head), 2 steps: losses and gradient norms bit-identical to --attention-bwd mma's;
#   * the control that the comparison is not vacuous: the work logs (SIMT_WORKLOG) hold one dq and one dk/dv wgmma launch
#     per layer per step (the overlapped dq kernel under its own name), the mma run none and the pair's instead;
#   * head_dim 32 (dbrx-tiny's own) keeps the pair, and says so at start-up;
#   * the default, auto: wgmma-overlap on Hopper (the emulator reports sm_90) at head_dim 128, bit-identical, saying so;
#     the pair at head_dim 32, silently;
#   * refused in one line, exit 2: an unknown value (naming the flag), the CPU backend.
# (the kernels themselves against the CPU and the pair: test_kernels; under the race detector with planted races:
# dev/cuda/attention_wgmma_bwd_race -p 2, -p 3)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
EMU=${EMU:-./train_dbrx_emu}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--model dbrx-tiny --n-layers 2 --seq 160 --batch 1 --steps 2 --val-every 0)
run() {  # name, flags...: a run with its work log (the kernels launched) and its JSONL log
    local name=$1; shift
    if ! SIMT_WORKLOG="$tmp/$name.wl" $EMU --device cuda "${G[@]}" "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1; then
        fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
    fi
}
same() {  # what, a, b: the runs' losses and gradient norms bit-identical (jsonl_steps: every digit), 2 steps at least
    jsonl_steps "$tmp/$2.jsonl" > "$tmp/$2.steps"; jsonl_steps "$tmp/$3.jsonl" > "$tmp/$3.steps"
    if [ "$(grep -c . "$tmp/$2.steps")" -ge 2 ] && cmp -s "$tmp/$2.steps" "$tmp/$3.steps"; then pass "$1"
    else fail "$1: $(diff "$tmp/$2.steps" "$tmp/$3.steps" | head -3)"; fi
}
H128=(--n-heads 1 --kv-heads 1)
H64=(--n-heads 2 --kv-heads 1)
run m128 "${H128[@]}" --attention-bwd mma
run w128 "${H128[@]}" --attention-bwd wgmma
run o128 "${H128[@]}" --attention-bwd wgmma-overlap
same "head_dim 128, 2 steps: --attention-bwd wgmma's losses and gradient norms bit-identical to mma's" m128 w128
same "head_dim 128, 2 steps: --attention-bwd wgmma-overlap's bit-identical to mma's" m128 o128
run m64 "${H64[@]}" --attention-bwd mma
run w64 "${H64[@]}" --attention-bwd wgmma
run o64 "${H64[@]}" --attention-bwd wgmma-overlap
same "head_dim 64 (GQA 2:1), 2 steps: --attention-bwd wgmma bit-identical to mma" m64 w64
same "head_dim 64 (GQA 2:1), 2 steps: --attention-bwd wgmma-overlap bit-identical to mma" m64 o64
# the default, auto: wgmma-overlap on Hopper (the emulator reports sm_90) at head_dim 128; the pair at 32, silently
run a128 "${H128[@]}"
same "head_dim 128, 2 steps: the default (auto) bit-identical to mma" m128 a128
grep -q "^attention: backward on wgmma (dq's products overlapped) (--attention-bwd auto)$" "$tmp/a128.out" \
    && pass "the default (auto) says wgmma-overlap at head_dim 128 on sm_90" || fail "a128: $(grep -m1 attention "$tmp/a128.out")"
run a32
grep -q "^attention:" "$tmp/a32.out" && fail "head_dim 32, the default: an attention: line: $(grep -m1 attention "$tmp/a32.out")" \
    || pass "head_dim 32 (dbrx-tiny's), the default: no attention: line (the pair runs)"
grep -q "^attention: backward on wgmma$" "$tmp/w128.out" && grep -q "^attention: backward on wgmma (dq's products overlapped)$" "$tmp/o128.out" \
    && pass "--attention-bwd wgmma, wgmma-overlap say so at start-up" || fail "no attention: line: $(grep -m1 attention "$tmp/w128.out")"
run w32 --attention-bwd wgmma
grep -q "^attention: backward on wgmma only at head_dim 64 and 128 without context parallelism: this run keeps the mma.sync kernels$" \
    "$tmp/w32.out" && pass "head_dim 32 (dbrx-tiny's): --attention-bwd wgmma says the pair runs" || fail "w32: $(grep -m1 attention "$tmp/w32.out")"

# the work logs: which backward kernels ran (a launch line names its kernel)
$PY - "$tmp" <<'PY' > "$tmp/verdicts"
import os, re, sys
tmp = sys.argv[1]
def count(name, kernel): return sum(1 for l in open(os.path.join(tmp, name + ".wl")) if re.search(r'"name":"%s[<"]' % kernel, l))
L, S = 2, 2   # layers, training steps: one backward per layer per step
DQ, DQO, DKV = "flash_attention_backward_dq_wgmma", "flash_attention_backward_dq_wgmma_overlap", "flash_attention_backward_dkv_wgmma"
PAIR = "flash_attention_backward_dq_kernel"
for name, want in (("w128", (L * S, 0, L * S)), ("o128", (0, L * S, L * S)), ("w64", (L * S, 0, L * S)), ("o64", (0, L * S, L * S)),
                   ("m128", (0, 0, 0)), ("m64", (0, 0, 0)), ("w32", (0, 0, 0)),
                   ("a128", (0, L * S, L * S)), ("a32", (0, 0, 0))):
    got = (count(name, DQ), count(name, DQO), count(name, DKV))
    pair = count(name, PAIR)
    ok = got == want and (pair == 0) == (want != (0, 0, 0))
    print(("pass" if ok else "fail") + " %s: %d dq, %d overlapped dq, %d dk/dv wgmma launches (want %d, %d, %d), %d of the pair's dq kernel"
          % ((name,) + got + want + (pair,)))
PY
verdicts "$tmp/verdicts" 9

# refused
expect_exit 2 "--attention-bwd foo" $EMU --device cuda "${G[@]}" --attention-bwd foo
grep -q -- "--attention-bwd 'foo' must be auto, mma, wgmma or wgmma-overlap" <<<"$LAST_ERR" || fail "--attention-bwd foo: $LAST_ERR"
expect_exit 2 "--attention-bwd wgmma on the CPU backend" $EMU --device cpu "${G[@]}" --attention-bwd wgmma
grep -q -- "--attention-bwd wgmma is the CUDA step's" <<<"$LAST_ERR" || fail "the CPU refusal does not name the flag: $LAST_ERR"
