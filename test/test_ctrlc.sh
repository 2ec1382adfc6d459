#!/usr/bin/env bash
# test_ctrlc.sh — Ctrl-C through mpirun (README, Checkpoints): SIGINT to mpirun itself, as a terminal's
# Ctrl-C sends it (the ranks have process groups of their own). OpenMPI 4.1's mpirun then sends every rank
# SIGCONT, sleeps odls_base_sigkill_timeout s (1), SIGTERM, sleeps again (cut short when a rank exits),
# SIGKILL, and exits 1. Each run must leave a complete checkpoint of the step every rank stopped after (it
# loads: a resume trains one more step), and every rank must exit 0 before mpirun's SIGKILL.
#   10 runs in a row on 1 rank and 10 on 2 ranks (ZeRO-3), the two series side by side: SIGINT at random
#   moments; in some runs the moment a checkpoint is being written (--ckpt-every 1: mpirun is signalled
#   when DIR/.tmp-step_* appears) or while validation runs (--val-every 2 --val-steps 24: most of the time
#   goes to validation; the rank's stop line names the phase the signal came in).
# How a rank's end is seen: strace -f follows mpirun and its ranks (execve, and how each process ended:
# "exited with 0" or "killed by SIGKILL"); the ranks stay mpirun's own children, signalled as without it.
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

command -v strace > /dev/null || { echo "skipped: test_ctrlc.sh needs strace (apt-get install strace)"; exit 0; }

# one run: series S (1 or 2 ranks), run I, kind (random | ckpt | val); prints one verdict line
one_run() {
    local n=$1 i=$2 kind=$3 d="$tmp/s$1/r$2" extra=()
    mkdir -p "$d"
    case $kind in ckpt) extra=(--ckpt-every 1);; val) extra=(--val-every 2 --val-steps 24);; esac
    strace -f --seccomp-bpf -q -e trace=execve -e signal=none -o "$d/strace" $MPI -np "$n" "$BIN" "${T[@]}" "${extra[@]}" \
        --ckpt-dir "$d/ck" --log "$d/log.jsonl" > "$d/out" 2>&1 &
    local S=$!
    waitlog "$d/log.jsonl" 2 || { kill -KILL $S; echo "fail $n rank(s), run $i ($kind): no progress: $(tail -c 300 "$d/out")"; return; }
    case $kind in
        ckpt) for _ in $(seq 1 2000); do compgen -G "$d/ck/.tmp-step_*" > /dev/null && break; done;;
        *) sleep "0.$((RANDOM % 9))$((RANDOM % 10))";;
    esac
    kill -INT "$(children $S)"   # (mpirun: dev/mpirun.sh execs it)
    wait $S; local mrc=$?   # (strace exits with mpirun's status)
    local ok=1 why="" pid ranks=0
    for pid in $(sed -nE "s|^([0-9]+) +execve\(\"$BIN\".* = 0$|\1|p" "$d/strace"); do
        ranks=$((ranks + 1))
        grep -qE "^$pid +\+\+\+ exited with 0 \+\+\+" "$d/strace" \
            || { ok=0; why="$why rank pid $pid: $(grep -E "^$pid +\+\+\+" "$d/strace" | tr -s ' ');"; }
    done
    [ $ranks = "$n" ] || { ok=0; why="$why $ranks rank processes seen;"; }
    local stop; stop=$(sed -nE 's/^\{"step": ([0-9]+), "stop": "SIGTERM", "during": "(.*)"\}$/\1|\2/p' "$d/log.jsonl")
    local step=${stop%%|*} phase=${stop#*|}
    [ -n "$step" ] || { ok=0; why="$why no stop in the log;"; }
    # the checkpoint of that step is complete: a resume from it trains one more step (on one process)
    local res; res=$("$BIN" "${T[@]}" --ckpt-dir "$d/ck" --resume auto --stop-after 1 2>&1)
    grep -q "^resume: $d/ck/step_0*$step (step $step," <<<"$res" && grep -qE "^step +$((step + 1))/" <<<"$res" \
        || { ok=0; why="$why no loadable checkpoint of step '$step': $(grep -m1 -E '^(resume|error|warning)' <<<"$res");"; }
    [ "$mrc" = 1 ] || { ok=0; why="$why mpirun exited $mrc (OpenMPI's abort status is 1);"; }
    if [ $ok = 1 ]; then echo "pass $n rank(s), run $i ($kind): stopped after step $step (signal during: ${phase:-?}), saved, resumed, every rank exit 0"
    else echo "fail $n rank(s), run $i ($kind):$why"; fi
}
series() {
    local n=$1 kinds=(random ckpt val random ckpt val random random ckpt val)
    for i in $(seq 0 9); do one_run "$n" "$i" "${kinds[$i]}"; done > "$tmp/verdicts.$n"
}
t0=$(date +%s)
series 1 & s1=$!
series 2
wait $s1
verdicts "$tmp/verdicts.1" 10
verdicts "$tmp/verdicts.2" 10
cat "$tmp/verdicts.1" "$tmp/verdicts.2" > "$tmp/all"
grep -q "signal during: .*validation" "$tmp/all" && pass "a SIGINT came in during validation (and was saved from)" \
    || fail "no run's SIGINT came in during validation"
[ "$(grep -c '(ckpt): stopped' "$tmp/all")" -ge 4 ] && pass "SIGINT while a checkpoint was being written (DIR/.tmp-step_*): $(grep -c '(ckpt): stopped' "$tmp/all") runs saved" \
    || fail "too few runs signalled during a checkpoint write"
echo "   (20 Ctrl-C runs in $(( $(date +%s) - t0 )) s)"
