#!/usr/bin/env bash
# test_hang.sh — hangs and stragglers (parallel/comm.h: the heartbeat, the hang agreement):
#   * a rank stopped (SIGSTOP) in step 3 under mpirun -np 3 (ZeRO-3) and -np 4 (HSDP 2x2), on the CPU
#     path, and -np 3 on the emulated GPU path (NCCL twin): every survivor exits non-zero within the
#     timeout naming the same rank, and the phase it was last in (from the node-shared heartbeat);
#   * a rank made slow (DBRX_DEBUG_SLOW_RANK=1:80: 80 ms more per step) is named as a straggler, and every
#     rank's busy time is in the JSONL log;
#   * --comm-timeout 0 (the default) says how it resolves; a negative one is refused.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
EMU=${EMU:-./train_dbrx_emu}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
U=(--model dbrx-tiny --n-layers 2 --seq 64 --batch 1 --val-every 0 --steps 30)

# hang_test NAME NP VICTIM BIN FLAGS...: the victim SIGSTOPs itself in step 3
hang_test() {
    local name=$1 np=$2 victim=$3 bin=$4; shift 4
    local t0; t0=$(date +%s)
    DBRX_DEBUG_KILL=$victim:3:stop timeout 120 $MPI -np "$np" "$bin" "$@" --comm-timeout 5 > "$tmp/$name.out" 2>&1; local rc=$?
    local dt=$(( $(date +%s) - t0 ))
    local lines named same
    lines=$(grep -c "^error: rank [0-9]*: .* does not respond" "$tmp/$name.out")
    named=$(grep -c "^error: rank [0-9]*: .*: rank $victim does not respond (hung or lost; $((np - 1)) of $np ranks answered.*its last phase, [0-9]* s ago: step 3, " "$tmp/$name.out")
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 40 ] && [ "$lines" = $((np - 1)) ] && [ "$named" = $((np - 1)) ]; then
        pass "$name: rank $victim stopped in step 3: all $named survivors name it and its phase ('$(grep -m1 -o 'its last phase.*' "$tmp/$name.out" | cut -c1-80)'), exit $rc after ${dt} s"
    else fail "$name: exit $rc after ${dt} s, $named of $((np - 1)) survivors name rank $victim: $(grep '^error' "$tmp/$name.out" | cut -c1-200 | head -4)"; fi
}
hang_test "np 3 ZeRO-3 (CPU)" 3 1 "$BIN" "${U[@]}"
hang_test "np 4 HSDP 2x2 (CPU)" 4 2 "$BIN" "${U[@]}" --shard-group-size 2
if [ -x "$EMU" ]; then
    hang_test "np 3 ZeRO-3 (emulated GPU, NCCL twin)" 3 1 "$EMU" --device cuda --model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 2 \
        --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64 --seq 32 --val-every 0 --batch 1 --steps 30
fi

# --- a straggler
DBRX_DEBUG_SLOW_RANK=1:80 timeout 120 $MPI -np 3 $BIN "${U[@]}" --steps 14 --log "$tmp/slow.jsonl" > "$tmp/slow.out" 2>&1; rc=$?
if [ "$rc" = 0 ] && grep -q "^straggler: rank 1 was busy .* ms against a median of .* ms, slower than 1.2 x the median in \(8\|9\|10\) of the last 10 steps" "$tmp/slow.out" \
    && [ "$(grep -c '"straggler": 1,' "$tmp/slow.jsonl")" -ge 1 ] && ! grep -q "^straggler: rank [02]" "$tmp/slow.out" \
    && grep -q '"rank_busy_ms": \[[0-9.]*, [0-9.]*, [0-9.]*\], "max_busy_ms": [0-9.]*, "slowest_rank": 1' "$tmp/slow.jsonl"; then
    pass "a rank 80 ms slower per step is named: $(grep -m1 '^straggler' "$tmp/slow.out" | cut -c1-110)"
else fail "straggler: exit $rc: $(grep -E '^straggler|error' "$tmp/slow.out" | head -3)"; fi
# negative control: no plant, no straggler named
timeout 120 $MPI -np 3 $BIN "${U[@]}" --steps 14 > "$tmp/even.out" 2>&1
! grep -q "^straggler" "$tmp/even.out" && pass "negative control: without the plant nobody is named a straggler" \
    || fail "a straggler named without a plant: $(grep -m1 '^straggler' "$tmp/even.out")"

# --- the timeout flag
out=$($BIN "${U[@]}" --steps 1 2>&1)
grep -q "^comm: --comm-timeout auto: 600 s until step 1 is done and around checkpoints, 60 s otherwise" <<<"$out" \
    && pass "--comm-timeout 0 (default): auto, said at start-up" || fail "--comm-timeout auto not reported: $(grep -m1 '^comm' <<<"$out")"
expect_exit 2 "--comm-timeout -1" $BIN "${U[@]}" --comm-timeout -1
