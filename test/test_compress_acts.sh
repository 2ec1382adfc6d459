#!/usr/bin/env bash
# test_compress_acts.sh — compressed saved activations (--compress-acts, model/act_compress.cuh): the
# experts' g and u (swiglu) and LayerNorm 1's output ln1 (attn) kept in E4M3 with 1x128 factors (or BF16 on
# the CPU) until the backward. What must hold, for each class:
#   - the forward is untouched: step 1's loss is bit-identical to the run without it;
#   - the compression is applied (negative control): step 1's gradient norm differs from the run without it,
#     and it differs again when only the first layer is compressed;
#   - the gradients are those of g and u to E4M3's 3 mantissa bits: the gradient norm within 0.2% of the run
#     without it (measured: ~0.1%), BF16 closer than E4M3;
#   - the emulated GPU agrees with the CPU as the uncompressed runs do (the same BF16 tolerance), at head_dim
#     128, under FP8 block scaling, ZeRO-3 np 2 and EP 2 (chunked or not); its peak device memory is --dry-run's plan within 0.1% and
#     below the run without it; the CPU's activations shrink (its dry-run estimate: test_memory_plan);
#   - composed with --recompute: a layer that recomputes its SwiGLU (its block) is not compressed (--recompute
#     swiglu + --compress-acts swiglu is --recompute swiglu's run bit for bit; block + attn is block's);
#   - bad values: one line naming the flag, exit 2.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
EMU=${EMU:-./train_dbrx_emu}
MPI="bash dev/mpirun.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
base=(--model dbrx-tiny --n-layers 3 --seq 64 --val-every 0 --ckpt-every 0)

# run NAME LAUNCH...: the run's "step loss grad_norm" lines (JSONL log, %.17g) into $tmp/NAME. One step: every check
# reads step 1 (its loss is the forward's, its gradient norm the backward's; the peak is reached in it)
run() {
    local name=$1; shift
    if ! "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1; then echo "FAILED" > "$tmp/$name"; tail -3 "$tmp/$name.out"; return; fi
    jsonl_steps "$tmp/$name.jsonl" > "$tmp/$name"
}
# compare REF NAME WHAT CHECK: CHECK is a python expression over l0, g0 (REF's step-1 loss and gradient norm) and
# l1, g1 (NAME's)
compare() {
    local ref=$1 name=$2 what=$3 check=$4
    if grep -q FAILED "$tmp/$ref" "$tmp/$name" || [ ! -s "$tmp/$ref" ] || [ ! -s "$tmp/$name" ]; then fail "$what: a run failed"; return; fi
    if /usr/bin/python3 -c "
import sys
a = open('$tmp/$ref').readline().split(); b = open('$tmp/$name').readline().split()
l0, g0, l1, g1 = float(a[1]), float(a[2]), float(b[1]), float(b[2])
print('step 1: loss %r / %r, grad norm %r / %r (rel %.2e)' % (l0, l1, g0, g1, abs(g1 / g0 - 1)))
sys.exit(0 if ($check) else 1)" > "$tmp/cmp.txt"; then pass "$what: $(cat "$tmp/cmp.txt")"; else fail "$what: $(cat "$tmp/cmp.txt")"; fi
}
close="l1 == l0 and g1 != g0 and abs(g1 / g0 - 1) < 2e-3"
# peak_check WHAT OFF RUN DRYRUN...: every rank's emulated peak device memory of RUN (SIMT_STEP_COUNTERS=1) is the plan
# of the --dry-run command DRYRUN within 0.1%, and below run OFF's
peak_check() {
    local what=$1 off=$2 name=$3; shift 3
    local plan peak peak_off
    plan=$("$@" --dry-run | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
    peak=$(sed -nE 's/^simt peak device memory: ([0-9]+) bytes.*/\1/p' "$tmp/$name.out" | sort -n | tail -1)
    peak_off=$(sed -nE 's/^simt peak device memory: ([0-9]+) bytes.*/\1/p' "$tmp/$off.out" | sort -n | tail -1)
    if [ -n "$plan" ] && [ -n "$peak" ] && [ -n "$peak_off" ] && [ "$peak" -lt "$peak_off" ] \
        && /usr/bin/python3 -c "import sys; sys.exit(abs($peak / $plan - 1) > 0.001)"; then
        pass "$what: peak per rank $peak bytes = the plan's $plan within 0.1%, < $peak_off without"
    else fail "$what: peak $peak, plan $plan, without $peak_off"; fi
}

echo "-- CPU"
cpu=("$BIN" "${base[@]}" --batch 2 --steps 1)
run c_off "${cpu[@]}"
run c_e4m3 "${cpu[@]}" --compress-acts swiglu
run c_bf16 "${cpu[@]}" --compress-acts swiglu --compress-format bf16
run c_first "${cpu[@]}" --compress-acts swiglu:first1
compare c_off c_e4m3 "CPU e4m3: the same forward, gradients within 0.2%" "$close"
compare c_off c_bf16 "CPU bf16: the same forward, gradients within 0.2%" "$close"
compare c_off c_first "CPU swiglu:first1 compresses layer 0 only" "$close and g1 != float(open('$tmp/c_e4m3').readline().split()[2])"
run c_rc "${cpu[@]}" --recompute swiglu
run c_rc_ca "${cpu[@]}" --recompute swiglu --compress-acts swiglu
cmp -s "$tmp/c_rc" "$tmp/c_rc_ca" && ! grep -q FAILED "$tmp/c_rc" && pass "CPU: a recomputed layer is not compressed (bit-identical to --recompute swiglu)" \
    || fail "CPU: --recompute swiglu with --compress-acts differs from --recompute swiglu"
run c_attn "${cpu[@]}" --compress-acts attn
run c_attn_bf16 "${cpu[@]}" --compress-acts attn --compress-format bf16
run c_both "${cpu[@]}" --compress-acts swiglu,attn:1-2
compare c_off c_attn "CPU attn e4m3: the same forward, gradients within 0.2%" "$close"
compare c_off c_attn_bf16 "CPU attn bf16: the same forward, gradients within 0.2%" "$close"
compare c_off c_both "CPU swiglu,attn:1-2" "$close and g1 != float(open('$tmp/c_e4m3').readline().split()[2])"
run c_rb "${cpu[@]}" --recompute block; run c_rb_ca "${cpu[@]}" --recompute block --compress-acts attn
cmp -s "$tmp/c_rb" "$tmp/c_rb_ca" && ! grep -q FAILED "$tmp/c_rb" && pass "CPU: a recomputed block's ln1 is not compressed (bit-identical to --recompute block)" \
    || fail "CPU: --recompute block with --compress-acts attn differs from --recompute block"
ep=($MPI -np 2 "$BIN" "${base[@]}" --batch 1 --steps 1 --shard-group-size 2 --expert-parallel 2)
run ce_off "${ep[@]}"; run ce_ca "${ep[@]}" --compress-acts swiglu
compare ce_off ce_ca "CPU EP 2 (the dispatcher's received rows)" "$close"
run ce_attn "${ep[@]}" --compress-acts attn
compare ce_off ce_attn "CPU EP 2, attn" "$close"
# the activations the run allocates (the CPU dry run's estimate of them: test_memory_plan) shrink
run c_mix "${cpu[@]}" --compress-acts swiglu:0-1 --recompute attn:1
got=$(sed -nE 's/^activations ([0-9.]+) MiB.*/\1/p' "$tmp/c_mix.out" | head -1)
off=$(sed -nE 's/^activations ([0-9.]+) MiB.*/\1/p' "$tmp/c_off.out" | head -1)
[ -n "$got" ] && [ -n "$off" ] && /usr/bin/python3 -c "import sys; sys.exit(0 if $got < $off else 1)" \
    && pass "CPU swiglu:0-1 with --recompute attn:1: activations $got MiB (< $off without)" || fail "CPU activations '$got' MiB, without '$off'"

if [ -x "$EMU" ]; then
    echo "-- emulated GPU"
    gpu=("$EMU" --device cuda "${base[@]}" --batch 2 --steps 1)
    SIMT_STEP_COUNTERS=1 run g_off "${gpu[@]}"
    SIMT_STEP_COUNTERS=1 run g_e4m3 "${gpu[@]}" --compress-acts swiglu
    compare g_off g_e4m3 "GPU e4m3: the same forward, gradients within 0.2%" "$close"
    compare c_e4m3 g_e4m3 "GPU e4m3 against the CPU's e4m3" "abs(l1 / l0 - 1) < 1e-4 and abs(g1 / g0 - 1) < 5e-3"
    peak_check "GPU" g_off g_e4m3 "${gpu[@]}" --compress-acts swiglu
    SIMT_STEP_COUNTERS=1 run g_attn "${gpu[@]}" --compress-acts attn
    compare g_off g_attn "GPU attn: the same forward, gradients within 0.2%" "$close"
    compare c_attn g_attn "GPU attn against the CPU's attn" "abs(l1 / l0 - 1) < 1e-4 and abs(g1 / g0 - 1) < 5e-3"
    peak_check "GPU attn" g_off g_attn "${gpu[@]}" --compress-acts attn
    SIMT_STEP_COUNTERS=1 run g_both "${gpu[@]}" --compress-acts attn:0-1,swiglu --recompute block:2
    peak_check "GPU attn:0-1,swiglu with --recompute block:2" g_off g_both "${gpu[@]}" --compress-acts attn:0-1,swiglu --recompute block:2
    hd=(--n-heads 1 --kv-heads 1 --n-layers 2)   # head_dim 128
    run g8_off "${gpu[@]}" "${hd[@]}" --fp8 block; run g8_ca "${gpu[@]}" "${hd[@]}" --fp8 block --compress-acts swiglu
    compare g8_off g8_ca "GPU --fp8 block, head_dim 128 (the padded layout's rows)" "$close"
    run g8_attn "${gpu[@]}" "${hd[@]}" --fp8 block --compress-acts attn
    compare g8_off g8_attn "GPU --fp8 block, head_dim 128, attn" "$close"
    gz=($MPI -np 2 "$EMU" --device cuda "${base[@]}" --batch 1 --steps 1 --shard-group-size 2)
    run gz_off "${gz[@]}"; run gz_ca "${gz[@]}" --compress-acts swiglu:1-2
    compare gz_off gz_ca "GPU ZeRO-3 np 2, swiglu:1-2" "$close"
    run gz_attn "${gz[@]}" --compress-acts attn:0-1
    compare gz_off gz_attn "GPU ZeRO-3 np 2, attn:0-1" "$close"
    # EP 2: the model's g, u, act hold the received rows; chunked exchange (default 2 chunks), one chunk, FP8 block
    SIMT_STEP_COUNTERS=1 run ge_off "${gz[@]}" --expert-parallel 2; SIMT_STEP_COUNTERS=1 run ge_ca "${gz[@]}" --expert-parallel 2 --compress-acts swiglu
    compare ge_off ge_ca "GPU EP 2, --ep-overlap-chunks 2" "$close"
    compare ce_ca ge_ca "GPU EP 2 against the CPU's EP 2" "abs(l1 / l0 - 1) < 1e-4 and abs(g1 / g0 - 1) < 5e-3"
    peak_check "GPU EP 2" ge_off ge_ca "${gz[@]:4}" --expert-parallel 2 --compress-acts swiglu --plan-gpus 2
    run ge1_ca "${gz[@]}" --expert-parallel 2 --ep-overlap-chunks 1 --compress-acts swiglu
    cmp -s "$tmp/ge_ca" "$tmp/ge1_ca" && pass "GPU EP 2: one chunk gives the chunked run's losses bit for bit" \
        || fail "GPU EP 2: --ep-overlap-chunks 1 differs: $(paste -d' ' "$tmp/ge_ca" "$tmp/ge1_ca" | head -2 | tr '\n' ';')"
    run ge_attn "${gz[@]}" --expert-parallel 2 --compress-acts attn
    compare ge_off ge_attn "GPU EP 2, attn" "$close"
    compare ce_attn ge_attn "GPU EP 2 attn against the CPU's EP 2 attn" "abs(l1 / l0 - 1) < 1e-4 and abs(g1 / g0 - 1) < 5e-3"
    run ge1_attn "${gz[@]}" --expert-parallel 2 --ep-overlap-chunks 1 --compress-acts attn
    compare ge_off ge1_attn "GPU EP 2, one chunk, attn" "$close"
    run ge8_off "${gz[@]}" --expert-parallel 2 --fp8 block; run ge8_ca "${gz[@]}" --expert-parallel 2 --fp8 block --compress-acts swiglu:0-1
    compare ge8_off ge8_ca "GPU EP 2 --fp8 block, swiglu:0-1" "$close"
    expect_exit 2 "--compress-format bf16 on the GPU" "${gpu[@]}" --compress-acts swiglu --compress-format bf16
fi

echo "-- bad values"
for bad in "moe" "block" "swiglu:3" "attn:0-3" "swiglu:x" "swiglu,,attn"; do
    expect_exit 2 "--compress-acts '$bad'" "$BIN" "${base[@]}" --steps 1 --compress-acts "$bad"
done
expect_exit 2 "--compress-format fp16" "$BIN" "${base[@]}" --steps 1 --compress-acts swiglu --compress-format fp16
