#!/usr/bin/env bash
# test_recompute.sh — selective activation recomputation (--recompute, model/recompute.h): with it, the
# per-step losses (%.17g) and gradient norms of the JSONL log are bit-identical to the run without it,
# for every granularity (attn, swiglu, moe, block) and several ranges (all, firstN, M-K, everyN, one
# layer, composed), on the CPU and the emulated GPU (train_dbrx_emu), under ZeRO-3 (np 2), expert
# parallelism (EP 2: the dispatcher re-runs its saved plan, or recomputes its rows' SwiGLU) and FP8 (delayed on the CPU, whose scales come
# from the amax history the recomputation must not touch; block on the GPU, and delayed under EP 2, whose exchange
# stays in one piece); head_dim 128 once on the GPU.
# Negative control: DBRX_DEBUG_PLANT=recompute_routing (the recomputation swaps two routed rows) must
# change them. Bad specs: one line naming the bad part, exit 2. HFU is printed only with --recompute.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
EMU=${EMU:-./train_dbrx_emu}
MPI="bash dev/mpirun.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
base=(--model dbrx-tiny --n-layers 3 --seq 64 --val-every 0 --ckpt-every 0)

# run NAME LAUNCH...: the run's "step loss grad_norm" lines (from its JSONL log) into $tmp/NAME
run() {
    local name=$1; shift
    if ! "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1; then echo "FAILED" > "$tmp/$name"; tail -3 "$tmp/$name.out"; return; fi
    jsonl_steps "$tmp/$name.jsonl" > "$tmp/$name"
}
# same REF NAME WHAT: NAME's losses and gradient norms are REF's, bit for bit
same() {
    if [ -s "$tmp/$1" ] && ! grep -q FAILED "$tmp/$1" "$tmp/$2" && cmp -s "$tmp/$1" "$tmp/$2"; then pass "$3: bit-identical ($(wc -l < "$tmp/$1") steps)"
    else fail "$3: differs: $(paste -d' ' "$tmp/$1" "$tmp/$2" | head -3 | tr '\n' ';')"; fi
}
differs() {
    if [ -s "$tmp/$2" ] && ! grep -q FAILED "$tmp/$2" && ! cmp -s "$tmp/$1" "$tmp/$2"; then pass "$3: the planted bug is seen"
    else fail "$3: the planted bug went unseen"; fi
}

echo "-- CPU"
cpu=("$BIN" "${base[@]}" --batch 2 --steps 2)
run c_off "${cpu[@]}"
for spec in attn swiglu:first2 moe:1-2 block:every2 block attn,swiglu:2,block:0; do
    run "c_$spec" "${cpu[@]}" --recompute "$spec"; same c_off "c_$spec" "CPU --recompute $spec"
done
grep -q "hfu .*%" "$tmp/c_block.out" && grep -q '"hfu"' "$tmp/c_block.jsonl" && ! grep -q "hfu" "$tmp/c_off.out" \
    && pass "HFU on the step line and in the log with --recompute only" || fail "HFU: $(grep -m1 '^step' "$tmp/c_block.out")"
DBRX_DEBUG_PLANT=recompute_routing run c_plant "${cpu[@]}" --recompute moe; differs c_off c_plant "CPU negative control (moe)"
run c8_off "$BIN" "${base[@]}" --batch 2 --steps 3 --fp8 delayed --fp8-log-every 1
run c8_rc "$BIN" "${base[@]}" --batch 2 --steps 3 --fp8 delayed --fp8-log-every 1 --recompute block:0-1,swiglu:2,attn
same c8_off c8_rc "CPU --fp8 delayed, --recompute block:0-1,swiglu:2,attn"
# every FP8 tensor's amax, scale and saturation count (proj.x saturates under delayed scaling here) recorded once
if grep -q '"saturated": [1-9]' "$tmp/c8_off.jsonl" && cmp -s <(grep -v '"loss"' "$tmp/c8_off.jsonl") <(grep -v '"loss"' "$tmp/c8_rc.jsonl"); then
    pass "CPU --fp8 delayed: the FP8 log (amaxes, scales, saturation counts) is the same with --recompute"
else fail "CPU --fp8 delayed: the FP8 log differs with --recompute (or nothing saturated)"; fi
zero=($MPI -np 2 "$BIN" "${base[@]}" --batch 1 --steps 2 --shard-group-size 2)
run z_off "${zero[@]}"; run z_rc "${zero[@]}" --recompute block:0,moe:1-2,attn; same z_off z_rc "CPU ZeRO-3 np 2, --recompute block:0,moe:1-2,attn"
ep=("${zero[@]}" --expert-parallel 2)
run e_off "${ep[@]}"; run e_rc "${ep[@]}" --recompute moe:first2,block:2; same e_off e_rc "CPU EP 2, --recompute moe:first2,block:2"

# peak_check OFF RC FLAGS...: every rank's emulated peak device memory of run RC (SIMT_STEP_COUNTERS=1) is --dry-run's
# plan for it within 0.1% (test_zero_gpu.sh's bound), and below run OFF's peak
peak_check() {
    local off=$1 rc=$2; shift 2
    local plan peak_rc peak_off
    plan=$("${gz[@]:4}" "$@" --dry-run --plan-gpus 2 | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
    peak_rc=$(sed -nE 's/^simt peak device memory: ([0-9]+) bytes.*/\1/p' "$tmp/$rc.out" | sort -n | tail -1)
    peak_off=$(sed -nE 's/^simt peak device memory: ([0-9]+) bytes.*/\1/p' "$tmp/$off.out" | sort -n | tail -1)
    if [ -n "$plan" ] && [ -n "$peak_rc" ] && [ -n "$peak_off" ] && [ "$peak_rc" -lt "$peak_off" ] \
        && /usr/bin/python3 -c "import sys; sys.exit(abs($peak_rc / $plan - 1) > 0.001)"; then
        pass "$rc ($*): peak per rank $peak_rc bytes = the plan's $plan within 0.1%, < $peak_off without --recompute"
    else fail "$rc ($*): peak $peak_rc, plan $plan, peak without $peak_off"; fi
}

if [ -x "$EMU" ]; then
    echo "-- emulated GPU"
    gpu=("$EMU" --device cuda "${base[@]}" --batch 1 --steps 2)
    run g_off "${gpu[@]}"
    for spec in attn swiglu:0-1 moe:every2 block:1 block; do
        run "g_$spec" "${gpu[@]}" --recompute "$spec"; same g_off "g_$spec" "GPU --recompute $spec"
    done
    DBRX_DEBUG_PLANT=recompute_routing run g_plant "${gpu[@]}" --recompute block; differs g_off g_plant "GPU negative control (block)"
    hd=(--n-heads 1 --kv-heads 1 --n-layers 2)   # head_dim 128
    run g8_off "${gpu[@]}" "${hd[@]}" --fp8 block; run g8_rc "${gpu[@]}" "${hd[@]}" --fp8 block --recompute moe:0,block:1
    same g8_off g8_rc "GPU --fp8 block, head_dim 128, --recompute moe:0,block:1"
    gz=($MPI -np 2 "$EMU" --device cuda "${base[@]}" --batch 1 --steps 2 --shard-group-size 2)
    SIMT_STEP_COUNTERS=1 run gz_off "${gz[@]}"; SIMT_STEP_COUNTERS=1 run gz_rc "${gz[@]}" --recompute block:0-1,swiglu:2
    same gz_off gz_rc "GPU ZeRO-3 np 2, --recompute block:0-1,swiglu:2"
    peak_check gz_off gz_rc --recompute block:0-1,swiglu:2
    # EP: the model's g, u, act hold the received rows, which the dispatcher recomputes (swiglu) or re-runs (moe, block)
    SIMT_STEP_COUNTERS=1 run ge_off "${gz[@]}" --expert-parallel 2
    SIMT_STEP_COUNTERS=1 run ge_rc "${gz[@]}" --expert-parallel 2 --recompute swiglu:0-1,moe:2,block:0
    same ge_off ge_rc "GPU EP 2, --recompute swiglu:0-1,moe:2,block:0"
    peak_check ge_off ge_rc --expert-parallel 2 --recompute swiglu:0-1,moe:2,block:0
    run ge8_off "${gz[@]}" --expert-parallel 2 --fp8 block; run ge8_rc "${gz[@]}" --expert-parallel 2 --fp8 block --recompute swiglu,block:1
    same ge8_off ge8_rc "GPU EP 2 --fp8 block, --recompute swiglu,block:1"
    # the per-tensor recipes keep the exchange in one piece (ep_gpu_chunks): the unchunked dispatcher's FP8 recomputation
    run ge8d_off "${gz[@]}" --expert-parallel 2 --fp8 delayed; run ge8d_rc "${gz[@]}" --expert-parallel 2 --fp8 delayed --recompute swiglu
    same ge8d_off ge8d_rc "GPU EP 2 --fp8 delayed (the exchange in one piece), --recompute swiglu"
fi

echo "-- bad specs"
for bad in "mlp" "attn:x" "block:3" "moe:2-1" "swiglu:first0" "attn,,block"; do
    expect_exit 2 "--recompute '$bad'" "$BIN" "${base[@]}" --steps 1 --recompute "$bad"
done
