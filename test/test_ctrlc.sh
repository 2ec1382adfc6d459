#!/usr/bin/env bash
# test_ctrlc.sh — Ctrl-C through mpirun (README, Checkpoints): SIGINT to mpirun itself, as a terminal's
# Ctrl-C sends it (the ranks have process groups of their own). OpenMPI 4.1's mpirun then sends every rank
# SIGCONT, sleeps odls_base_sigkill_timeout s (1), SIGTERM, sleeps again (cut short when a rank exits),
# SIGKILL, and exits 1. Each run must leave a complete checkpoint of the step every rank stopped after (it
# loads: a resume trains one more step), and every rank must exit 0 before mpirun's SIGKILL.
#   5 runs in a row on 1 rank, then 10 on 2 ranks (ZeRO-3, where the exit races: below): SIGINT at random
#   moments; in some runs the moment a checkpoint is being written (--ckpt-every 1: mpirun is signalled
#   when DIR/.tmp-step_* appears) or while validation runs (--val-every 2 --val-steps 32 on 1 rank, 8 on 2:
#   most of the time goes to validation; the rank's stop line names the phase the signal came in; up to 4 more 1-rank
#   val runs when none of them was signalled during validation).
# How a rank's end is seen: mpirun runs under a child subreaper (prctl PR_SET_CHILD_SUBREAPER, in Python),
# which inherits the ranks when mpirun exits (mpirun does not reap them after its SIGKILL) and writes how
# each ended: "exited 0", or "killed by 9" (what the ranks of the trainer before this change got: they
# waited in MPI_Finalize for mpirun). The ranks stay mpirun's own children, signalled as without it.
# The console lines after the Ctrl-C may not come back through mpirun: the stop (its step and the phase the
# signal came in) is read from the JSONL log.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
command -v mpirun > /dev/null || { fail "mpirun not found"; exit 0; }
BIN=$(realpath "$BIN")
T=(--model dbrx-tiny --n-layers 2 --seq 64 --batch 1 --steps 100000 --val-every 0)

PY=${PYTHON:-/usr/bin/python3}
cat > "$tmp/reaper.py" <<'EOF'
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER: orphans of the launched tree come here
out, pid = open(sys.argv[1], "w"), os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
open(sys.argv[1] + ".pid", "w").write("%d\n" % pid)
rc = 1
while True:
    try: p, st = os.waitpid(-1, 0)
    except ChildProcessError: break
    if p == pid: rc = os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st)
    else: out.write("%d %s at %.3f\n" % (p, "exited %d" % os.WEXITSTATUS(st) if os.WIFEXITED(st) else "killed by %d" % os.WTERMSIG(st), time.time()))
out.close()
sys.exit(rc)
EOF

# one run: series S (1 or 2 ranks), run I, kind (random | ckpt | val); prints one verdict line
one_run() {
    local n=$1 i=$2 kind=$3 d="$tmp/s$1/r$2" extra=()
    mkdir -p "$d"
    case $kind in ckpt) extra=(--ckpt-every 1);; val) extra=(--val-every 2 --val-steps $((32 / (n * n))));; esac
    $PY "$tmp/reaper.py" "$d/ends" $MPI -np "$n" "$BIN" "${T[@]}" "${extra[@]}" --ckpt-dir "$d/ck" --log "$d/log.jsonl" \
        > "$d/out" 2>&1 &
    local S=$!
    waitlog "$d/log.jsonl" 1 || { kill -KILL $S; echo "fail $n rank(s), run $i ($kind): no progress: $(tail -c 300 "$d/out")"; return; }
    case $kind in
        ckpt) for _ in $(seq 1 2000); do compgen -G "$d/ck/.tmp-step_*" > /dev/null && break; done;;
        *) sleep "0.$((RANDOM % 6))$((RANDOM % 10))";;
    esac
    local t0; t0=$(date +%s.%N)
    kill -INT "$(cat "$d/ends.pid")"   # (mpirun: the reaper's child; dev/mpirun.sh execs it)
    wait $S; local mrc=$?   # (the reaper exits with mpirun's status)
    local ok=1 why="" raced=""
    local zeros; zeros=$(grep -c ' exited 0 at ' "$d/ends")
    local ends; ends="$(awk -v t0="$t0" '{ t = $NF; $NF = ""; $(NF - 1) = ""; printf "%s(reaped %.3f s after the SIGINT); ", $0, t - t0 }' "$d/ends")"
    [ "$(grep -c . "$d/ends")" = "$n" ] && [ "$zeros" -ge 1 ] || { ok=0; why="$why the ranks ended: $ends"; }
    [ "$zeros" = "$n" ] || raced="the ranks ended: $ends"
    local stop; stop=$(sed -nE 's/^\{"step": ([0-9]+), "stop": "SIGTERM", "during": "(.*)"\}$/\1|\2/p' "$d/log.jsonl")
    local step=${stop%%|*} phase=${stop#*|}
    [ -n "$step" ] || { ok=0; why="$why no stop in the log;"; }
    # the checkpoint of that step is complete: a resume from it trains one more step (on one process)
    local res; res=$("$BIN" "${T[@]}" --ckpt-dir "$d/ck" --resume auto --stop-after 1 2>&1)
    grep -q "^resume: $d/ck/step_0*$step (step $step," <<<"$res" && grep -qE "^step +$((step + 1))/" <<<"$res" \
        || { ok=0; why="$why no loadable checkpoint of step '$step': $(grep -m1 -E '^(resume|error|warning)' <<<"$res");"; }
    [ "$mrc" = 1 ] || { ok=0; why="$why mpirun exited $mrc (OpenMPI's abort status is 1);"; }
    if [ $ok = 1 ] && [ -z "$raced" ]; then echo "pass $n rank(s), run $i ($kind): stopped after step $step (signal during: ${phase:-?}), saved, resumed, every rank exit 0"
    elif [ $ok = 1 ] && [ "$n" -gt 1 ]; then echo "raced $n rank(s), run $i ($kind): stopped after step $step, saved, resumed; $raced"
    else echo "fail $n rank(s), run $i ($kind):$why $raced"; fi
}
# series N RUNS: RUNS runs on N ranks, the kinds in this order
series() {
    local n=$1 runs=$2 kinds=(random ckpt val random ckpt val random random ckpt val)
    for i in $(seq 0 $((runs - 1))); do one_run "$n" "$i" "${kinds[$i]}"; done > "$tmp/verdicts.$n"
}
t0=$(date +%s)
series 1 5
series 2 10
verdicts "$tmp/verdicts.1" 5
# 2 ranks: every run saved; a run where one rank exited 0 and mpirun's SIGKILL took the other (the race of
# the ranks' common exit with mpirun's reaction to the first one, lost when a rank has no core at that
# moment: the shared 2-core machine, ~1 run in 10) is shown, and at most 2 of the 10 may lose it
grep '^raced' "$tmp/verdicts.2" | sed 's/^/   /'
raced=$(grep -c '^raced' "$tmp/verdicts.2")
grep -v '^raced' "$tmp/verdicts.2" > "$tmp/v2"; verdicts "$tmp/v2" $((10 - raced))
[ "$raced" -le 2 ] && pass "2 ranks: every rank exited 0 in $((10 - raced)) of 10 runs (the rest: one exited 0, one SIGKILLed at that moment)" \
    || fail "2 ranks: every rank exited 0 in only $((10 - raced)) of 10 runs"
cat "$tmp/verdicts.1" "$tmp/verdicts.2" > "$tmp/all"
# the moment is random, and validation ~70% of a 1-rank val run's time (less on 2 ranks, and under the suite's load):
# when none of the 4 val runs was signalled in it (session 51's CI: 3 in the optimizer, 1 in a backward), up to 4
# more 1-rank val runs, each checked as the others, until one is
for i in 5 6 7 8; do
    grep -q "signal during: .*validation" "$tmp/all" && break
    one_run 1 "$i" val > "$tmp/vx.$i"; cat "$tmp/vx.$i" >> "$tmp/all"; verdicts "$tmp/vx.$i" 1
done
grep -q "signal during: .*validation" "$tmp/all" && pass "a SIGINT came in during validation (and was saved from)" \
    || fail "no run's SIGINT came in during validation (in 4 val runs and 4 more on 1 rank)"
[ "$(grep -c '(ckpt): stopped' "$tmp/all")" -ge 4 ] && pass "SIGINT while a checkpoint was being written (DIR/.tmp-step_*): $(grep -c '(ckpt): stopped' "$tmp/all") runs saved" \
    || fail "too few runs signalled during a checkpoint write"
echo "   (15 Ctrl-C runs in $(( $(date +%s) - t0 )) s)"
