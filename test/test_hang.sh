#!/usr/bin/env bash
# test_hang.sh — hangs and stragglers (parallel/comm.h: the heartbeat, the hang agreement, the abort path):
#   * a rank stopped (SIGSTOP) in step 3 under mpirun -np 3 (ZeRO-3; rank 0) and -np 4 (HSDP 2x2), on the
#     CPU path, and -np 3 on the emulated GPU path (NCCL twin): every survivor exits non-zero within the
#     timeout naming the same rank, and the phase it was last in (from the node-shared heartbeat); every
#     survivor's line names only ranks that are true for it (the rank it waits for is not itself, and is
#     the stopped one or said to answer);
#   * the abort path on the emulated GPU (parallel/README.md, "A watchdog that cannot hang"): with the host
#     blocked inside the collective (DBRX_DEBUG_TWIN_BLOCKS), the step watchdog thread's ncclCommAbort ends
#     the main thread's wait and the rank exits; with an abort that never returns (NCCL_TWIN_DEBUG_PLANT=
#     abort_hangs) the deadline ends the rank anyway;
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
E=(--device cuda --model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 2 --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64 --seq 32
   --val-every 0 --batch 1 --steps 30)

# true_ranks FILE NP VICTIM: every survivor's line names only ranks that are true for it — the culprit is
# the victim; "waiting for rank X" is never the survivor itself, and X is the victim or said to answer
true_ranks() {
    local f=$1 np=$2 victim=$3 r line x bad=""
    for ((r = 0; r < np; r++)); do
        [ "$r" = "$victim" ] && continue
        line=$(grep -m1 "^error: rank $r: .* does not respond" "$f")
        [ -n "$line" ] || { bad+=" rank $r said nothing;"; continue; }
        grep -q ": rank $victim does not respond" <<<"$line" || bad+=" rank $r names another culprit;"
        x=$(grep -o "waiting for rank [0-9]*" <<<"$line" | grep -o "[0-9]*$")
        [ "$x" = "$r" ] && bad+=" rank $r waits for itself;"
        [ -n "$x" ] && [ "$x" != "$victim" ] && ! grep -q "waiting for rank $x (which answers: it waits in turn)" <<<"$line" \
            && bad+=" rank $r names rank $x, which is neither the victim nor said to answer;"
    done
    echo "$bad"
}

# hang_test NAME NP VICTIM BIN FLAGS...: the victim SIGSTOPs itself in step 3
hang_test() {
    local name=$1 np=$2 victim=$3 bin=$4; shift 4
    local t0; t0=$(date +%s)
    DBRX_DEBUG_KILL=$victim:3:stop timeout 120 $MPI -np "$np" "$bin" "$@" --comm-timeout 5 > "$tmp/$name.out" 2>&1; local rc=$?
    local dt=$(( $(date +%s) - t0 ))
    local lines named bad
    lines=$(grep -c "^error: rank [0-9]*: .* does not respond" "$tmp/$name.out")
    named=$(grep -c "^error: rank [0-9]*: .*: rank $victim does not respond (hung or lost; $((np - 1)) of $np ranks answered.*its last phase, [0-9]* s ago: step 3, " "$tmp/$name.out")
    bad=$(true_ranks "$tmp/$name.out" "$np" "$victim")
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 40 ] && [ "$lines" = $((np - 1)) ] && [ "$named" = $((np - 1)) ] && [ -z "$bad" ]; then
        pass "$name: rank $victim stopped in step 3: all $named survivors name it and its phase ('$(grep -m1 -o 'its last phase.*' "$tmp/$name.out" | cut -c1-80)'), each only ranks true for it, exit $rc after ${dt} s"
    else fail "$name: exit $rc after ${dt} s, $named of $((np - 1)) survivors name rank $victim;$bad $(grep '^error' "$tmp/$name.out" | cut -c1-200 | head -4)"; fi
}
# the three runs at once (each mostly waits on its watchdog; the verdicts printed in order after)
hang_test "np 3 ZeRO-3 (CPU)" 3 0 "$BIN" "${U[@]}" > "$tmp/v1" &
hang_test "np 4 HSDP 2x2 (CPU)" 4 2 "$BIN" "${U[@]}" --shard-group-size 2 > "$tmp/v2" &
[ -x "$EMU" ] && hang_test "np 3 ZeRO-3 (emulated GPU, NCCL twin)" 3 1 "$EMU" "${E[@]}" > "$tmp/v3" &
wait
cat "$tmp/v1" "$tmp/v2" "$tmp/v3" 2>/dev/null
# rank 0 stopped: rank 1 receives from it in every ring, so it waits for rank 0 (never for itself)
grep -q "^error: rank 1: .* waiting for rank 0: rank 0 does not respond" "$tmp/np 3 ZeRO-3 (CPU).out" \
    && pass "np 3, rank 0 stopped: rank 1 says it waits for rank 0" \
    || fail "np 3, rank 0 stopped: rank 1's line: $(grep -m1 '^error: rank 1' "$tmp/np 3 ZeRO-3 (CPU).out" | cut -c1-200)"
if [ -x "$EMU" ]; then
    grep -q "^error: rank [02]: [0-9]* NCCL communicator(s) aborted in [0-9.]* s; exiting" "$tmp/np 3 ZeRO-3 (emulated GPU, NCCL twin).out" \
        && pass "emulated GPU: after the verdict the survivors abort their NCCL communicators and exit" \
        || fail "emulated GPU: no 'communicators aborted' line: $(grep '^error' "$tmp/np 3 ZeRO-3 (emulated GPU, NCCL twin).out" | head -3)"

    # the abort path, two runs at once (both mostly wait): rank 1 stops in step 3 of 2
    t0=$(date +%s)
    DBRX_DEBUG_TWIN_BLOCKS=1 DBRX_DEBUG_KILL=1:3:stop timeout 120 $MPI -np 2 "$EMU" "${E[@]}" --comm-timeout 3 > "$tmp/blocks.out" 2>&1 &
    pid_blocks=$!
    NCCL_TWIN_DEBUG_PLANT=abort_hangs DBRX_DEBUG_KILL=1:3:stop timeout 120 $MPI -np 2 "$EMU" "${E[@]}" --comm-timeout 3 > "$tmp/stuck.out" 2>&1 &
    pid_stuck=$!
    wait $pid_blocks; rc=$?; dt_blocks=$(( $(date +%s) - t0 ))
    wait $pid_stuck; rc2=$?; dt_stuck=$(( $(date +%s) - t0 ))
    # the host blocked inside the collective (no twin watchdog): only the step watchdog thread can end it,
    # from another thread: its ncclCommAbort must end the main thread's wait (the twin says so), and return
    f=$tmp/blocks.out
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt_blocks" -lt 45 ] \
        && grep -q "^error: rank 0: the GPU step made no progress for [0-9]* s: a NCCL collective cannot complete" "$f" \
        && grep -q "^nccl twin: warning: rank 0 in group [a-z_]*: [A-Za-z/]* aborted (ncclCommAbort) while waiting for world rank 1" "$f" \
        && grep -q "^error: rank 0: [0-9]* NCCL communicator(s) aborted in [0-9.]* s; exiting" "$f"; then
        pass "emulated GPU, host blocked in a collective behind a stopped rank: the step watchdog's ncclCommAbort (another thread) ends the wait; exit $rc after ${dt_blocks} s"
    else fail "emulated GPU, abort from the step watchdog: exit $rc after ${dt_blocks} s: $(grep -E '^error|^nccl twin' "$f" | head -4)"; fi
    # an abort that never returns: the deadline (COMM_ABORT_DEADLINE_S, 10 s) ends the rank regardless
    f=$tmp/stuck.out
    if [ "$rc2" != 0 ] && [ "$rc2" != 124 ] && [ "$dt_stuck" -lt 50 ] && grep -q "^error: rank 0: .*rank 1 does not respond" "$f" \
        && grep -q "^error: rank 0: ncclCommAbort did not return within 10 s; exiting without it" "$f" \
        && ! grep -q "^error: rank 0: [0-9]* NCCL communicator(s) aborted" "$f"; then
        pass "emulated GPU, ncclCommAbort planted to hang: the rank still exits $rc2 after ${dt_stuck} s (diagnosis first, then the deadline)"
    else fail "emulated GPU, a hanging ncclCommAbort: exit $rc2 after ${dt_stuck} s: $(grep -E '^error|^nccl twin' "$f" | head -4)"; fi
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
