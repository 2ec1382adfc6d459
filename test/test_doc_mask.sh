#!/usr/bin/env bash
# test_doc_mask.sh — --doc-mask EOT (model/attention.cuh: attention stays inside each document of a packed sequence, an
# end-of-text opening one) end to end, on byte-token shards of short documents (3 to 40 tokens, so that every sequence
# holds several):
#   * the mask acts: dbrx-tiny's losses with it differ from those without, on both backends;
#   * the emulated GPU within 1e-2 of the CPU with it (step 1 ten times nearer the CPU's masked loss than its unmasked
#     one), at head_dim 32 (the mma.sync flash kernels) and 128 (the wgmma
#     forward; the backward's wgmma-overlap, the default, and the mma.sync pair, the same bits);
#   * the recomputed attention (--recompute attn, block) reads the same documents: the same losses bit for bit;
#   * shards with no end-of-text: the mask changes nothing, bit for bit, on both backends;
#   * the banner says so; a validation pass is masked too (the validation loss moves with it);
#   * MFU counts attention as executed (model/config.h): without end-of-text the causal count, with documents each
#     step's share of the causal pairs (about a third here), on both backends.
# (The kernels against the CPU reference: test_kernels' "document-masked attention"; the CPU model against PyTorch:
# test_pytorch_parity.py's --doc-mask run; bad values: test_cli.sh.)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-/usr/bin/python3}
export OMP_WAIT_POLICY=passive

# shards (llm.c's uint16 format): documents of 3-40 random bytes, each opened by the end-of-text 256; and none at all
$PY - "$tmp" <<'PY' || { fail "writing the test shards"; exit 0; }
import random, struct, sys
def shard(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), 2, *([0] * 252)))
        f.write(struct.pack("<%dH" % len(toks), *toks))
for name, n, seed, docs in (("doc_train", 20000, 1, True), ("doc_val", 4000, 2, True), ("flat_train", 20000, 3, False), ("flat_val", 4000, 4, False)):
    r, toks = random.Random(seed), []
    while len(toks) < n:
        if docs: toks.append(256)
        toks += [r.randrange(256) for _ in range(r.randint(3, 40))]
    shard("%s/%s_000000.bin" % (sys.argv[1], name), toks[:n])
PY
base=(--model dbrx-tiny --n-layers 2 --batch 2 --seq 64 --steps 4 --val-every 2 --val-steps 1 --peak-tflops 1e-6)
doc=(--data "$tmp/doc_train_*.bin" --val-data "$tmp/doc_val_*.bin")
flat=(--data "$tmp/flat_train_*.bin" --val-data "$tmp/flat_val_*.bin")
hd128=(--d-model 128 --n-heads 1 --kv-heads 1)
run() {   # run NAME BACKEND(cpu|emu) FLAGS...: the JSONL log $tmp/NAME.jsonl
    local name=$1 b=$2; shift 2
    local dev=cpu; [ "$b" = emu ] && dev=cuda
    ./train_dbrx_$b "${base[@]}" --device $dev "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 || fail "$name: $(tail -2 "$tmp/$name.out")"
}
for b in cpu emu; do
    run "on_$b" $b "${doc[@]}" --doc-mask 256
    run "off_$b" $b "${doc[@]}"
    run "flat_on_$b" $b "${flat[@]}" --doc-mask 256
    run "flat_off_$b" $b "${flat[@]}"
    run "rc_attn_$b" $b "${doc[@]}" --doc-mask 256 --recompute attn
    run "rc_block_$b" $b "${doc[@]}" --doc-mask 256 --recompute block
    run "h128_$b" $b "${doc[@]}" --doc-mask 256 "${hd128[@]}"
done
run h128_off_cpu cpu "${doc[@]}" "${hd128[@]}"
run h128_mma_emu emu "${doc[@]}" --doc-mask 256 "${hd128[@]}" --attention-bwd mma
grep -q "attention inside documents (--doc-mask 256)" "$tmp/on_emu.out" && pass "the banner names --doc-mask" \
    || fail "the banner does not name --doc-mask: $(grep '^batch' "$tmp/on_emu.out")"

$PY - "$tmp" <<'PY' > "$tmp/verdicts"
import json, os, sys
t = sys.argv[1]
def L(n, key="loss"):
    p = os.path.join(t, n + ".jsonl")
    return [json.loads(l)[key] for l in open(p) if '"%s"' % key in l] if os.path.exists(p) else []
def v(ok, msg): print(("pass " if ok else "fail ") + msg)
# within 1e-2 at every step, and step 1 (the same weights and batch on both) 10 x nearer the CPU's masked loss than its unmasked one
close = lambda a, b, off: len(a) == len(b) > 0 and all(abs(x - y) / abs(y) < 1e-2 for x, y in zip(a, b)) and \
    10 * abs(a[0] - b[0]) < abs(off[0] - b[0])
for b in ("cpu", "emu"):
    on, off = L("on_" + b), L("off_" + b)
    print("   %s: with --doc-mask %s, without %s" % (b, [round(x, 5) for x in on], [round(x, 5) for x in off]), file=sys.stderr)
    v(len(on) == 4 and on[0] != off[0] and L("on_" + b, "val_loss")[0] != L("off_" + b, "val_loss")[0],
      "%s: the mask acts (step 1's loss and the validation loss differ from the unmasked run's)" % b)
    v(L("flat_on_" + b) == L("flat_off_" + b) != [] and L("flat_on_" + b, "val_loss") == L("flat_off_" + b, "val_loss"),
      "%s: shards with no end-of-text: the same losses bit for bit with and without the mask" % b)
    v(L("rc_attn_" + b) == L("on_" + b) and L("rc_block_" + b) == L("on_" + b),
      "%s: --recompute attn and block give the masked run's losses bit for bit" % b)
v(close(L("on_emu") + L("on_emu", "val_loss"), L("on_cpu") + L("on_cpu", "val_loss"), L("off_cpu")),
  "the emulated GPU within 1e-2 of the CPU with the mask, head_dim 32 (mma.sync flash kernels): %s" % [round(x, 5) for x in L("on_emu")])
v(close(L("h128_emu") + L("h128_emu", "val_loss"), L("h128_cpu") + L("h128_cpu", "val_loss"), L("h128_off_cpu")),
  "the emulated GPU within 1e-2 of the CPU with the mask, head_dim 128 (wgmma): %s" % [round(x, 5) for x in L("h128_emu")])
v(L("h128_mma_emu") == L("h128_emu") != [], "head_dim 128: --attention-bwd mma gives wgmma-overlap's losses bit for bit")
# MFU counts attention as executed: the FLOPs per token a step's mfu implies (mfu x the 1e6 FLOP/s peak / tok/s) are the
# banner's causal count without end-of-text, and below it by the attention term 6 L d (S + 1) x (1 - the step's share)
# with it, the share that of documents of 4-41 tokens in 64 (about a third; each step its own batch's)
import re
banner = lambda n: float(re.search(r"^mfu: ([0-9.e+]+) FLOPs/token", open(os.path.join(t, n + ".out")).read(), re.M).group(1))
implied = lambda n: [m * 1e6 / s for m, s in zip(L(n, "mfu"), L(n, "tok_per_s"))]
attn = 6 * 2 * 128 * 65
for b in ("cpu", "emu"):
    flat, on, causal = implied("flat_on_" + b), implied("on_" + b), banner("on_" + b)
    share = [1 - (causal - f) / attn for f in on]
    v(len(flat) == 4 and all(abs(f / causal - 1) < 1e-3 for f in flat) and len(share) == 4 and all(0.1 < x < 0.7 for x in share)
      and len(set(round(x, 3) for x in share)) > 1 and "(--doc-mask: each step's attention term" in open(os.path.join(t, "on_%s.out" % b)).read(),
      "%s: mfu counts attention as executed: no end-of-text the causal %.0f FLOPs/token, documents %s of the causal pairs"
      % (b, causal, [round(x, 3) for x in share]))
PY
verdicts "$tmp/verdicts" 11
