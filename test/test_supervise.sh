#!/usr/bin/env bash
# test_supervise.sh — dev/supervise.sh, automatic restart (checkpoint/README.md, "Automatic restart"), on the CPU:
#   * a run SIGKILLed three times at random moments (from outside: any point of a step or of a save) is
#     restarted three times with --resume auto, with the exponential back-off capped, and ends with the
#     losses of an uninterrupted run, bit for bit (the last logged loss of every step);
#   * the same under mpirun -np 2 with rank 1 SIGKILLed: rank 0 exits naming it, the cause is logged, the
#     restart ends with the uninterrupted 2-rank run's losses, bit for bit;
#   * a run that dies at the same step every time (DBRX_DEBUG_KILL, which every restart inherits) stops
#     after --max-same-step failures without a new checkpoint, and a run that keeps failing stops after
#     --max-restarts, each with a clear line and the run's exit code;
#   * the run's own exit 2 (a bad flag) is not retried;
#   * SIGTERM to the supervisor under mpirun: passed on (as SIGUSR1 to mpirun), the run saves and exits 0,
#     no restart;
#   * the supervisor's usage errors: one line, exit 2, nothing run.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
SUP="bash dev/supervise.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

T=(--model dbrx-tiny --n-layers 2 --seq 64 --steps 20 --val-every 0)
C=(--ckpt-every 1)   # a checkpoint after every step: the kills land anywhere in a save too
# same_losses REF GOT: the last logged loss of each step (a restarted run logs the steps after its
# checkpoint again; a line cut short by a kill is skipped) must be REF's, bit for bit, for steps 1..20
same_losses() {
    $PY - "$1" "$2" <<'PY' > "$tmp/cmp" 2>&1
import json, sys
def last(p):
    d, n = {}, 0
    for l in open(p, errors="replace"):
        try: o = json.loads(l)
        except ValueError: continue
        if "loss" in o: d[o["step"]] = o["loss"]; n += 1
    return d, n
(a, _), (b, n) = last(sys.argv[1]), last(sys.argv[2])
ok = sorted(a) == sorted(b) == list(range(1, 21)) and all(a[s] == b[s] for s in a)
d = max((abs(a[s] - b.get(s, float("inf"))) for s in a), default=float("nan"))
print("%d step lines logged for steps %d..%d, the last of each vs the reference: max |diff| %.3g" % (n, min(b, default=0), max(b, default=0), d))
sys.exit(0 if ok else 1)
PY
}
descendants() {   # "pid comm" of every process under pid $1, from one pass over /proc (the kills must be quick)
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
        { match($0, /.*\) /); o = index($0, "("); split(substr($0, RLENGTH + 1), f, " ")   # "pid (comm) S ppid ..."
          kids[f[2]] = kids[f[2]] " " $1; comm[$1] = substr($0, o + 1, RLENGTH - o - 2) }
        END { q = root; while (q != "") { n = split(q, a, " "); q = ""
                  for (i = 1; i <= n; i++) { m = split(kids[a[i]], c, " "); for (j = 1; j <= m; j++) { print c[j], comm[c[j]]; q = q " " c[j] } } } }'
}
trainers() {   # the train_dbrx processes under pid $1 (rank $2 only, if given)
    local p c; descendants "$1" | while read -r p c; do
        case $c in train_dbrx*) ;; *) continue ;; esac
        [ -z "${2:-}" ] || tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" || continue
        echo "$p"
    done
}
rnd() { echo $(( ${SRANDOM:-$RANDOM} % $1 )); }   # 0..N-1 (SRANDOM: the kernel's randomness, bash >= 5.1)
maxstep() { sed -nE 's/^\{"step": ([0-9]+), "loss".*/\1/p' "$1" 2>/dev/null | sort -n | tail -1; }
waitstep() { local i s; for i in $(seq 1 600); do s=$(maxstep "$1"); [ "${s:-0}" -ge "$2" ] && return 0; sleep 0.05; done; return 1; }
# killer SUP_PID LOG RANK STEP...: for each STEP, once the log reaches it, SIGKILLs the training process
# (rank RANK of it, or "" for a single process) 0-0.15 s later; appends STEP to $tmp/kills
killer() {
    local sup=$1 log=$2 rank=$3 s p i; shift 3
    for s in "$@"; do
        waitstep "$log" "$s" || return
        sleep "0.$(printf '%02d' "$(rnd 16)")"
        for i in $(seq 1 100); do p=$(trainers "$sup" "$rank" | head -1); [ -n "$p" ] && break; sleep 0.05; done
        [ -n "$p" ] && kill -9 "$p" && echo "$s" >> "$tmp/kills"
        while kill -0 "$p" 2>/dev/null; do sleep 0.02; done
    done
}
t_start=$(date +%s)

# --- one process, SIGKILLed three times at random moments
$BIN "${T[@]}" --batch 2 --log "$tmp/ref1.jsonl" > "$tmp/ref1.out" 2>&1 || fail "reference run: $(tail -2 "$tmp/ref1.out")"
: > "$tmp/kills"
$SUP --backoff 0.2 --backoff-max 0.5 --log "$tmp/k.sup" -- $BIN "${T[@]}" "${C[@]}" --batch 2 --ckpt-dir "$tmp/k" --log "$tmp/k.jsonl" > "$tmp/k.out" 2>&1 &
sup=$!
# one kill in each third of the run: steps 2-5, 7-10, 12-15 (the restart has to get past the last kill)
killer "$sup" "$tmp/k.jsonl" "" $((2 + $(rnd 4))) $((7 + $(rnd 4))) $((12 + $(rnd 4))) &
kpid=$!
wait $sup; rc=$?; wait $kpid
kills=$(paste -sd, "$tmp/kills" | sed 's/,/, /g')
nk=$(grep -c . "$tmp/kills"); nfail=$(grep -c "failed after .*exit 137 (SIGKILL)" "$tmp/k.sup")
if [ "$rc" = 0 ] && [ "$nk" = 3 ] && [ "$nfail" = 3 ] && grep -q "attempt 4 finished (exit 0) .* 3 restart(s) in all" "$tmp/k.sup"; then
    pass "SIGKILLed 3 times at random (once steps $kills were logged): 3 failures logged with the cause, 3 restarts, exit 0"
else fail "3 random kills ($kills): exit $rc, $nfail failures logged: $(grep -E 'failed|giving|finished' "$tmp/k.sup" | cut -c1-200)"; fi
delays=$(sed -nE 's/.*restart [0-9]+ of 10 in ([0-9.]+) s.*/\1/p' "$tmp/k.sup" | tr '\n' ' ')
[ "$delays" = "0.2 0.4 0.5 " ] && pass "back-off 0.2 s doubled per restart, capped by --backoff-max 0.5: $delays" || fail "back-off: '$delays'"
[ "$(grep -c -- 'attempt [234]: .* --resume auto$' "$tmp/k.sup")" = 3 ] && ! grep -m1 'attempt 1:' "$tmp/k.sup" | grep -q -- --resume \
    && pass "the restarts (only) run the command with --resume auto appended" || fail "--resume: $(grep attempt "$tmp/k.sup" | grep -v failed | cut -c1-60)"
if same_losses "$tmp/ref1.jsonl" "$tmp/k.jsonl"; then pass "killed 3 times and restarted = uninterrupted, bit-identical: $(cat "$tmp/cmp")"
else fail "killed 3 times and restarted vs uninterrupted: $(cat "$tmp/cmp")"; fi

# --- mpirun -np 2: rank 1 SIGKILLed; rank 0 names it; the restart continues the run exactly
$MPI -np 2 $BIN "${T[@]}" --batch 1 --log "$tmp/ref2.jsonl" > "$tmp/ref2.out" 2>&1 || fail "2-rank reference: $(tail -2 "$tmp/ref2.out")"
: > "$tmp/kills"
$SUP --backoff 0 --log "$tmp/m.sup" -- $MPI -np 2 $BIN "${T[@]}" "${C[@]}" --batch 1 --ckpt-dir "$tmp/m" --log "$tmp/m.jsonl" > "$tmp/m.out" 2>&1 &
sup=$!
killer "$sup" "$tmp/m.jsonl" 1 $((4 + $(rnd 10))) &
kpid=$!
wait $sup; rc=$?; wait $kpid
if [ "$rc" = 0 ] && [ "$(grep -c . "$tmp/kills")" = 1 ] && grep -q "attempt 1 failed .*cause: error: rank 0: lost rank 1 " "$tmp/m.sup" \
    && grep -q "attempt 2 finished (exit 0)" "$tmp/m.sup"; then
    pass "mpirun -np 2, rank 1 SIGKILLed once step $(cat "$tmp/kills") was logged: $(grep -m1 -o 'exit [0-9]* .*cause: .*lost rank 1 ([^)]*)' "$tmp/m.sup" | sed 's/(pid [0-9]*/(pid N/'); 1 restart, exit 0"
else fail "mpirun -np 2, rank 1 killed ($(cat "$tmp/kills")): exit $rc: $(grep -E 'failed|giving|finished' "$tmp/m.sup" | cut -c1-250)"; fi
if same_losses "$tmp/ref2.jsonl" "$tmp/m.jsonl"; then pass "2 ranks, rank 1 killed and the job restarted = uninterrupted, bit-identical: $(cat "$tmp/cmp")"
else fail "2 ranks, killed and restarted vs uninterrupted: $(cat "$tmp/cmp")"; fi

# --- the same failure every time: DBRX_DEBUG_KILL=0:6 kills the process in step 6 of every attempt
t0=$(date +%s)
DBRX_DEBUG_KILL=0:6 $SUP --backoff 0 --max-same-step 2 --log "$tmp/s.sup" -- $BIN "${T[@]}" "${C[@]}" --batch 2 --ckpt-dir "$tmp/s" > "$tmp/s.out" 2>&1; rc=$?
dt=$(( $(date +%s) - t0 ))
if [ "$rc" = 137 ] && [ "$(grep -c 'failed after' "$tmp/s.sup")" = 3 ] && [ "$dt" -lt 20 ] \
    && tail -1 "$tmp/s.sup" | grep -q "giving up: 2 failure(s) in a row without a new checkpoint (newest step [0-9]*; --max-same-step 2): it fails at the same place every time"; then
    pass "dies in step 6 every time: 3 attempts (the 2nd and 3rd add no checkpoint), then '$(tail -1 "$tmp/s.sup" | sed 's/^supervise: [0-9-]* [0-9:]* //')', exit $rc after ${dt} s"
else fail "same step every time: exit $rc after ${dt} s: $(grep -E 'failed|giving' "$tmp/s.sup" | cut -c1-200)"; fi
DBRX_DEBUG_KILL=0:6 $SUP --backoff 0 --max-restarts 1 --max-same-step 0 --log "$tmp/r.sup" -- $BIN "${T[@]}" "${C[@]}" --batch 2 --ckpt-dir "$tmp/r" > "$tmp/r.out" 2>&1; rc=$?
if [ "$rc" = 137 ] && [ "$(grep -c 'failed after' "$tmp/r.sup")" = 2 ] && tail -1 "$tmp/r.sup" | grep -q "giving up: 1 restart(s) done, --max-restarts 1; last exit 137 (SIGKILL)"; then
    pass "--max-restarts 1 (the same-step stop off): 2 attempts, then '$(tail -1 "$tmp/r.sup" | sed 's/^supervise: [0-9-]* [0-9:]* //')'"
else fail "--max-restarts 1: exit $rc: $(grep -E 'failed|giving' "$tmp/r.sup" | cut -c1-200)"; fi

# --- the run's exit 2 (bad input) is not retried
$SUP --backoff 0 --log "$tmp/b.sup" -- $BIN "${T[@]}" --ckpt-dir "$tmp/b" --no-such-flag > "$tmp/b.out" 2>&1; rc=$?
if [ "$rc" = 2 ] && [ "$(grep -c 'attempt [0-9]*:' "$tmp/b.sup")" = 1 ] && grep -q "cause: error: unknown flag '--no-such-flag'" "$tmp/b.sup" \
    && tail -1 "$tmp/b.sup" | grep -q "giving up: exit 2 is bad input or configuration"; then
    pass "the run exits 2 (a bad flag): one attempt, the cause logged, not retried, exit 2"
else fail "run exit 2: exit $rc: $(cut -c1-200 "$tmp/b.sup")"; fi

# --- SIGTERM to the supervisor: passed on (SIGUSR1 to mpirun), the ranks save and exit 0, no restart
$SUP --backoff 0 --log "$tmp/t.sup" -- $MPI -np 2 $BIN "${T[@]}" --steps 400 --batch 1 --ckpt-dir "$tmp/t" --log "$tmp/t.jsonl" > "$tmp/t.out" 2>&1 &
sup=$!
waitstep "$tmp/t.jsonl" 3 || fail "SIGTERM: no progress: $(tail -2 "$tmp/t.out")"
kill -TERM $sup; wait $sup; rc=$?
n=$(grep -c '"loss"' "$tmp/t.jsonl")
if [ "$rc" = 0 ] && [ "$(cat "$tmp/t/latest" 2>/dev/null)" = "$(printf 'step_%08d' "$n")" ] && [ "$n" -lt 400 ] \
    && grep -q "received SIGTERM: sending SIGUSR1 to the run" "$tmp/t.sup" && ! grep -q "restart [0-9]" "$tmp/t.sup"; then
    pass "SIGTERM to the supervisor under mpirun: SIGUSR1 to mpirun, the ranks saved step $n and exited 0, no restart, exit 0"
else fail "SIGTERM to the supervisor: exit $rc, $n steps logged, latest $(cat "$tmp/t/latest" 2>/dev/null): $(cut -c1-200 "$tmp/t.sup")"; fi

# --- the supervisor's own usage errors: one line, exit 2
expect_exit 2 "supervise.sh: no command" $SUP --max-restarts 3 --
expect_exit 2 "supervise.sh: a command without --ckpt-dir" $SUP -- $BIN "${T[@]}"
expect_exit 2 "supervise.sh: a bad --max-restarts" $SUP --max-restarts -1 -- $BIN "${T[@]}" --ckpt-dir "$tmp/u"
expect_exit 2 "supervise.sh: an unknown option" $SUP --retries 3 -- $BIN "${T[@]}" --ckpt-dir "$tmp/u"
[ -e "$tmp/u" ] && fail "a usage error ran the command"
echo "test_supervise.sh: $(( $(date +%s) - t_start )) s"
