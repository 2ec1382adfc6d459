#!/bin/bash
# test_zero_embedding.sh — --zero-embedding rows (parallel/zero_gpu_embedding.cuh) on the emulated GPU under mpirun: the
# embedding's rows exchanged with their owners per micro-batch, against the table gathered and its gradient
# reduce-scattered (--zero-embedding gather), dbrx-tiny with the vocabulary slot (--zero-chunk-mib 0.02: its 384 rows
# in 5 gradient chunks of 80, each a run split over the shard group):
#   * bit-identical checkpoints (every rank's shard file: master weights and AdamW moments after 3 steps), losses,
#     validation losses and gradient norms, for ZeRO-3 np 2; np 3 (pieces that cut rows); np 3 with --grad-accum 2 and
#     --recompute block (the first micro-batch writes the shard, the second adds); HSDP 2x2; EP 2 within ZeRO-3 np 4;
#     --fp8 block --fp8-gather np 2;
#   * the exchange is what ran: its start-up line, and every rank sends fewer bytes a step than with the gather;
#   * a NaN step skipped by the spike guard (np 3, --grad-accum 2): the next step's first micro-batch rewrites the
#     embedding's pieces with their padding, as the reduce-scatter does (bit-identical to gather after it);
#   * the negative control: the owners' sums in rank order 0, 1, 2 (DBRX_DEBUG_PLANT=emb_sum_order), not the
#     reduce-scatter's, change np 3's checkpoint;
#   * off where it has no place: one rank per shard group (DDP), the units whole (no vocabulary slot): no start-up line,
#     the same losses as gather; a bad value is refused in one line, exit 2;
#   * --dry-run --fit takes the table gathered where only that fits without more recomputation (DBRX-132B, 64 H100s,
#     FP32 moments), the rows exchanged where they fit (BF16 moments);
#   * the planner: --dry-run's allocations equal the emulated peak (SIMT_STEP_COUNTERS) to 0.1%, with and without it.
# The step-time model's formulas for its two kernels: test_kernel_bytes.sh. ~3 minutes.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--device cuda --model dbrx-tiny --n-layers 2 --seq 32 --batch 2 --steps 3 --val-every 2 --zero-chunk-mib 0.02)

runp() {  # name, np, flags...: the emulated GPU under mpirun, its log, output and checkpoint under $tmp/name
    local name=$1 np=$2; shift 2
    bash dev/mpirun.sh -np "$np" ./train_dbrx_emu "${G[@]}" --log "$tmp/$name.jsonl" --ckpt-dir "$tmp/$name.ck" "$@" \
        > "$tmp/$name.out" 2>&1 || fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}
numbers() { grep -o '"loss": [^,]*\|"val_loss": [^,}]*\|"grad_norm": [^,]*' "$tmp/$1.jsonl" | tr '\n' ' '; }
same_shards() {  # a, b: every shard file of their final checkpoints byte for byte
    local a=$tmp/$1.ck/step_00000003 b=$tmp/$2.ck/step_00000003 f n=0
    for f in "$a"/shard_*.bin; do [ -f "$f" ] && cmp -s "$f" "$b/${f##*/}" || return 1; n=$((n + 1)); done
    [ "$n" -ge 2 ]
}
bytes() { grep -o "comm: rank [0-9]* sent [0-9]*" "$tmp/$1.out" | sort -k3,3n | awk '{print $5}' | tr '\n' ' '; }
fewer() {  # a, b: every rank of a sends fewer bytes than the same rank of b
    $PY_ - "$(bytes "$1")" "$(bytes "$2")" <<'PY'
import sys
a, b = [list(map(int, s.split())) for s in sys.argv[1:3]]
sys.exit(0 if a and len(a) == len(b) and all(x < y for x, y in zip(a, b)) else 1)
PY
}
PY_=${PYTHON:-python3}

cases=("np2 2 --shard-group-size 2" "np3 3 --shard-group-size 3" "np3_accum 3 --shard-group-size 3 --grad-accum 2 --recompute block"
       "hsdp 4 --shard-group-size 2" "ep2 4 --shard-group-size 4 --expert-parallel 2" "fp8 2 --shard-group-size 2 --fp8 block --fp8-gather")
for spec in "${cases[@]}"; do
    set -- $spec
    name=$1 np=$2; shift 2
    runp "$name.rows" "$np" "$@"
    runp "$name.gather" "$np" "$@" --zero-embedding gather
    grep -q "the embedding's rows exchanged per micro-batch" "$tmp/$name.rows.out" && ! grep -q "rows exchanged" "$tmp/$name.gather.out" \
        || fail "$name: the start-up line says the exchange is on with rows only: $(grep '^zero:' "$tmp/$name.rows.out" | head -3)"
    a=$(numbers "$name.rows"); b=$(numbers "$name.gather")
    [ -n "$a" ] && [ "$a" = "$b" ] && same_shards "$name.rows" "$name.gather" \
        && pass "$name ($*): rows exchanged = table gathered, bit for bit: every shard of the checkpoint, the losses and gradient norms ($a)" \
        || fail "$name ($*): rows exchanged differ from the table gathered: '$a' vs '$b' (shards $(same_shards "$name.rows" "$name.gather" && echo same || echo differ))"
    fewer "$name.rows" "$name.gather" && pass "$name: every rank sends fewer bytes a step with the rows exchanged ($(bytes "$name.rows")against $(bytes "$name.gather"))" \
        || fail "$name: bytes sent: rows $(bytes "$name.rows"), gather $(bytes "$name.gather")"
done

# a NaN step (DBRX_DEBUG_SPIKE=2:nan: the spike guard skips step 2, its gradient shard NaN, padding included): step 3's
# first micro-batch rewrites every element of the embedding's pieces, padding too (np 3: 2 elements of padding a run)
for m in rows gather; do DBRX_DEBUG_SPIKE=2:nan runp "nan.$m" 3 --shard-group-size 3 --grad-accum 2 --zero-embedding $m; done
a=$(numbers nan.rows); b=$(numbers nan.gather)
[ -n "$a" ] && [ "$a" = "$b" ] && ! grep -qi "nan" <<<"$(grep -o '"grad_norm": [^,]*' "$tmp/nan.rows.jsonl" | tail -1)" \
    && same_shards nan.rows nan.gather && pass "a NaN step 2, np 3 --grad-accum 2: step 3 on as with the gather, bit for bit ($a)" \
    || fail "a NaN step 2, np 3: rows '$a' vs gather '$b'"

# the negative control: the owners' sums in another order than the reduce-scatter's (np 3: three terms associate differently)
DBRX_DEBUG_PLANT=emb_sum_order runp plant 3 --shard-group-size 3
same_shards plant np3.gather && fail "DBRX_DEBUG_PLANT=emb_sum_order: the checkpoint is still the gather's (the comparison cannot fail)" \
    || pass "DBRX_DEBUG_PLANT=emb_sum_order (the owners' sums in rank order): np 3's checkpoint differs from the gather's, as it must"

# off where it has no place: DDP (every rank the whole table) and the units whole (no vocabulary slot)
runp ddp 2 --shard-group-size 1
runp whole 2 --shard-group-size 2 --zero-chunk-mib 0
for n in ddp whole; do
    ! grep -q "rows exchanged" "$tmp/$n.out" && pass "$n: no exchange (its start-up line absent)" || fail "$n: the exchange is on where it has no place"
done
[ "$(numbers whole)" = "$(numbers np2.gather)" ] && pass "the units whole: the same losses as the vocabulary slot's gather" \
    || fail "the units whole: '$(numbers whole)' vs '$(numbers np2.gather)'"
expect_exit 2 "--zero-embedding all refused" ./train_dbrx_emu --model dbrx-tiny --zero-embedding all --dry-run
grep -q -- "--zero-embedding 'all' must be rows or gather" <<<"$LAST_ERR" || fail "--zero-embedding all: the error does not name the flag: $LAST_ERR"

# --dry-run --fit (train_fit.h) ranks the rows exchanged after the recomputation: DBRX-132B on 64 H100s with FP32 moments
# needs its 0.4 GiB (buffers + NCCL margin) for --recompute attn,swiglu to fit, so it gathers the table there
# (--zero-embedding gather) and the same flags with the rows exchanged leave under --fit's 4 GiB; with BF16 moments
# the rows fit, and it keeps them
F132=(--model dbrx-132b --batch 1 --seq 4096 --plan-gpus 64 --plan-device h100)
f32=$(./train_dbrx_emu --dry-run --fit "${F132[@]}" 2>&1 | sed -n 's/^fit: \(--shard-group-size [^(]*\) (.*/\1/p')
f16=$(./train_dbrx_emu --dry-run --fit "${F132[@]}" --adam-moments bf16 2>&1 | sed -n 's/^fit: \(--shard-group-size [^(]*\) (.*/\1/p')
# shellcheck disable=SC2086
h=$(./train_dbrx_emu --dry-run "${F132[@]}" ${f32/--zero-embedding gather/} 2>&1 | sed -n 's/^verdict: FITS, \([0-9.]*\) GiB of headroom.*/\1/p')
[[ "$f32" == *"--zero-embedding gather"* ]] && [[ "$f16" != *"--zero-embedding"* ]] && [ -n "$h" ] && awk -v h="$h" 'BEGIN { exit !(h < 4) }' \
    && pass "--fit, DBRX-132B on 64 H100s: FP32 moments $f32 (rows exchanged: ${h} GiB of headroom, under 4); BF16 moments keeps the rows: $f16" \
    || fail "--fit with the exchange: FP32 moments '$f32' (its rows twin's headroom '$h'), BF16 moments '$f16'"

# the planner: the emulated peak of every rank against --dry-run's allocations (rows and gather: the exchange's buffers
# are exactly the difference); another batch's plan is not it (the negative control)
for m in rows gather; do
    SIMT_STEP_COUNTERS=1 runp "plan_$m" 3 --shard-group-size 3 --steps 2 --zero-embedding $m
    plan=$(./train_dbrx_emu "${G[@]}" --shard-group-size 3 --zero-embedding $m --dry-run --plan-gpus 3 | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
    other=$(./train_dbrx_emu "${G[@]}" --shard-group-size 3 --zero-embedding $m --batch 3 --dry-run --plan-gpus 3 | sed -nE 's/^plan bytes: allocations ([0-9]+),.*/\1/p')
    peak=$(sed -nE 's/^simt peak device memory: ([0-9]+) bytes/\1/p' "$tmp/plan_$m.out" | sort -n | tail -1)
    $PY_ -c "import sys; t, p, o = map(int, sys.argv[1:4]); sys.exit(0 if abs(t / p - 1) <= 1e-3 and abs(t / o - 1) > 1e-3 else 1)" \
        "${peak:-0}" "${plan:-1}" "${other:-1}" \
        && pass "--zero-embedding $m, np 3: the emulated peak $peak bytes = the plan's allocations $plan to 0.1% (batch 3's plan $other is not it)" \
        || fail "--zero-embedding $m, np 3: emulated peak '$peak', plan '$plan', batch 3's '$other'"
done
