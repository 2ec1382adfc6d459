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
# How a rank's exit status is seen: mpirun starts rank.sh, which starts the trainer through setsid with a
# recorder as its parent; rank.sh hands the trainer mpirun's SIGTERM; the recorder writes the trainer's
# exit status and time. A trainer that exits after mpirun would have SIGKILLed it fails (its exit later
# than mpirun's own), so the isolation cannot hide a late rank.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
command -v mpirun > /dev/null || { fail "mpirun not found"; exit 0; }
BIN=$(realpath "$BIN")
T=(--model dbrx-tiny --n-layers 2 --seq 64 --batch 1 --steps 100000 --val-every 0)

cat > "$tmp/rank.sh" <<'EOF'
#!/usr/bin/env bash
# one rank under mpirun: the trainer in a session of its own, mpirun's SIGTERM handed on to it
d=$1; shift
setsid bash "$(dirname "$0")/recorder.sh" "$d" "$@" & c=$!
trap 'kill -TERM -- -$c 2>/dev/null' TERM
while kill -0 $c 2>/dev/null; do wait $c; done
EOF
cat > "$tmp/recorder.sh" <<'EOF'
#!/usr/bin/env bash
d=$1; shift; r=$OMPI_COMM_WORLD_RANK
trap ':' TERM
"$@" > "$d/out.$r" 2>&1 & c=$!
while :; do wait $c; rc=$?; kill -0 $c 2>/dev/null || break; done
echo "$rc $(date +%s.%N)" > "$d/rc.$r"
EOF

# one run: series S (1 or 2 ranks), run I, kind (random | ckpt | val); prints one verdict line
one_run() {
    local n=$1 i=$2 kind=$3 d="$tmp/s$1/r$2" extra=()
    mkdir -p "$d"
    case $kind in ckpt) extra=(--ckpt-every 1);; val) extra=(--val-every 2 --val-steps 24);; esac
    $MPI -np "$n" bash "$tmp/rank.sh" "$d" "$BIN" "${T[@]}" "${extra[@]}" --ckpt-dir "$d/ck" --log "$d/log.jsonl" \
        > "$d/mpirun.out" 2>&1 &
    local P=$!
    waitlog "$d/log.jsonl" 2 || { kill -KILL $P; echo "fail $n rank(s), run $i ($kind): no progress: $(tail -c 300 "$d"/out.0)"; return; }
    case $kind in
        ckpt) for _ in $(seq 1 2000); do compgen -G "$d/ck/.tmp-step_*" > /dev/null && break; done;;
        *) sleep "0.$((RANDOM % 9))$((RANDOM % 10))";;
    esac
    kill -INT $P
    wait $P; local mrc=$? mend; mend=$(date +%s.%N)
    local ok=1 why="" r rc t
    for r in $(seq 0 $((n - 1))); do
        read -r rc t < "$d/rc.$r" 2>/dev/null || { ok=0; why="$why rank $r: no exit recorded;"; continue; }
        [ "$rc" = 0 ] || { ok=0; why="$why rank $r exited $rc;"; }
        awk -v a="$t" -v b="$mend" 'BEGIN { exit !(a < b) }' || { ok=0; why="$why rank $r exited after mpirun (its SIGKILL);"; }
    done
    local stop; stop=$(sed -nE 's/^stop: SIGTERM received( during (.*))?: every rank stops after step ([0-9]+) and saves$/\3|\2/p' "$d/out.0")
    local step=${stop%%|*} phase=${stop#*|}
    [ -n "$step" ] || { ok=0; why="$why no stop line;"; }
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
