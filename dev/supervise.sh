#!/usr/bin/env bash
# supervise.sh — runs a training command and, when it fails, runs it again with --resume auto, so that a
# long run survives crashes, lost ranks and killed nodes without a person watching (checkpoint/README.md, "Automatic
# restart"):
#   dev/supervise.sh [--max-restarts N] [--backoff S] [--backoff-max S] [--max-same-step K] [--log FILE] \
#       -- bash dev/mpirun.sh -np 8 ./train_dbrx ... --ckpt-dir D --ckpt-every 100
# * exit 0: done. Exit 2 (the run's "bad input or configuration"): not retried, a restart cannot fix it.
#   Anything else (a crash, a signal, a lost rank): one line with the cause, a back-off of
#   S * 2^(restart-1) seconds (at most --backoff-max), and the command again with --resume auto (an existing
#   --resume VALUE is replaced, none is appended: the same command works for the first run and the restarts).
# * it gives up, with the run's last exit code, after --max-restarts restarts, or after K failures in a row
#   that did not add a checkpoint (a run that fails at the same step every time would loop forever).
# * SIGTERM/SIGINT/SIGHUP: passed on to the run (SIGUSR1 when the command is mpirun: mpirun answers SIGTERM
#   by killing the ranks before they can save), which saves and exits; no restart, the run's exit code.
# Its own usage errors: one line, exit 2, before anything runs.
set -u

me=supervise.sh
max_restarts=10 backoff=10 backoff_max=300 max_same=3 log=""
usage() {
    cat <<EOF
usage: dev/supervise.sh [options] -- COMMAND...
  runs COMMAND (a train_dbrx command line with --ckpt-dir, directly or under mpirun) and reruns it with
  --resume auto after a failure. Options:
  --max-restarts N   restarts before giving up (default $max_restarts)
  --backoff S        seconds before the first restart, doubled for each next one (default $backoff)
  --backoff-max S    the longest back-off (default $backoff_max)
  --max-same-step K  give up after K failures in a row without a new checkpoint (default $max_same; 0: never)
  --log FILE         append the supervisor's lines (starts, failures and causes, restarts) to FILE too
exit: 0 when the run finishes; the run's exit code when it gives up, the run exits 2 (bad input: not
retried) or a signal stopped it; 2 for a usage error of its own.
EOF
}
# usage errors: one line naming the flag, exit 2 (the project's convention for bad input)
bad() { echo "error: $me: $*" >&2; exit 2; }
need() { [ $# -ge 2 ] || bad "$1 needs a value"; }
isnum() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }

while [ $# -gt 0 ]; do
    case $1 in
        --max-restarts) need "$@"; [[ $2 =~ ^[0-9]+$ ]] || bad "--max-restarts '$2' is not a whole number >= 0"; max_restarts=$2; shift 2 ;;
        --backoff) need "$@"; isnum "$2" || bad "--backoff '$2' is not a number of seconds >= 0"; backoff=$2; shift 2 ;;
        --backoff-max) need "$@"; isnum "$2" || bad "--backoff-max '$2' is not a number of seconds >= 0"; backoff_max=$2; shift 2 ;;
        --max-same-step) need "$@"; [[ $2 =~ ^[0-9]+$ ]] || bad "--max-same-step '$2' is not a whole number >= 0"; max_same=$2; shift 2 ;;
        --log) need "$@"; [ -n "$2" ] || bad "--log needs a file name"; log=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) bad "unknown option '$1' (the command goes after --; see --help)" ;;
        *) break ;;   # the command starts here
    esac
done
[ $# -gt 0 ] || bad "no command to run (usage: dev/supervise.sh [options] -- COMMAND...)"
cmd=("$@")

# the checkpoint directory: without one a restart would start from step 0 every time
ckdir="" has_every=0
for ((i = 0; i < ${#cmd[@]}; i++)); do
    case ${cmd[i]} in
        --ckpt-dir) ckdir=${cmd[i + 1]:-} ;;
        --ckpt-dir=*) ckdir=${cmd[i]#--ckpt-dir=} ;;
        --ckpt-every|--ckpt-every=*) has_every=1 ;;
    esac
done
[ -n "$ckdir" ] || bad "the command has no --ckpt-dir: a restart would have nothing to resume from"
if [ -n "$log" ]; then : >> "$log" 2>/dev/null || bad "--log '$log' cannot be written"; fi

# the restart command: --resume auto in place of any --resume (the last one given counts, so all are replaced)
rcmd=() had_resume=""
for ((i = 0; i < ${#cmd[@]}; i++)); do
    a=${cmd[i]}
    if [ "$a" = --resume ] && [ $((i + 1)) -lt ${#cmd[@]} ]; then had_resume=${cmd[i + 1]}; rcmd+=(--resume auto); i=$((i + 1))
    elif [[ $a == --resume=* ]]; then had_resume=${a#--resume=}; rcmd+=(--resume=auto)
    else rcmd+=("$a"); fi
done
[ -n "$had_resume" ] || rcmd+=(--resume auto)

exec 3>&2   # the supervisor's own lines: stderr, also while a `wait` has its stderr sent to /dev/null
say() {   # one line, to the console (stderr) and to --log
    local line; line="supervise: $(date '+%Y-%m-%d %H:%M:%S') $*"
    echo "$line" >&3
    if [ -n "$log" ]; then echo "$line" >> "$log"; fi
}
quoted() { local s; s=$(printf '%q ' "$@"); echo "${s% }"; }
newest_step() {   # the newest complete checkpoint (step_N directories appear only when complete), or -1
    local d n best=-1
    for d in "$ckdir"/step_[0-9]*; do
        [ -d "$d" ] || continue
        n=${d##*/step_}; [[ $n =~ ^[0-9]+$ ]] || continue
        n=$((10#$n)); [ "$n" -gt "$best" ] && best=$n
    done
    echo "$best"
}
stepname() { [ "$1" -ge 0 ] && echo "step $1" || echo "none"; }
signame() { local n; n=$(kill -l $(($1 - 128)) 2>/dev/null) && echo "SIG$n" || echo "signal $(($1 - 128))"; }
describe_exit() {   # "exit 137 (SIGKILL)": a shell reports death by signal N as 128 + N
    if [ "$1" -gt 128 ] && [ "$1" -le 192 ]; then echo "exit $1 ($(signame "$1"))"; else echo "exit $1"; fi
}

[ "$has_every" = 1 ] || say "warning: the command has no --ckpt-every: a run that crashes has saved nothing since it started (checkpoints are then only written on the way out)"
tmpd=$(mktemp -d) || bad "cannot create a temporary directory"
child="" stop_sig="" interrupted=0 sleeper=""
cleanup() { rm -rf "$tmpd"; }
trap cleanup EXIT

# A stop request is the run's to answer (it finishes the step, saves, exits 0): pass it on, never restart.
on_signal() {
    local sig=$1 fwd=$1
    interrupted=1
    [ "$sig" = HUP ] && fwd=TERM   # train_dbrx saves on TERM/INT/USR1; HUP would kill it unsaved
    # a second one is passed on too: the user insists (train_dbrx then exits at once, without saving)
    local again=""; [ -n "$stop_sig" ] && again=" again"
    stop_sig=$sig
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        case $(cat "/proc/$child/comm" 2>/dev/null) in
            mpirun|mpiexec|orterun|prterun) fwd=USR1 ;;   # mpirun forwards USR1 to the ranks; TERM it answers by killing them
        esac
        say "received SIG$sig$again: sending SIG$fwd to the run (pid $child) so that it saves and exits; no restart"
        kill -s "$fwd" "$child" 2>/dev/null
    elif [ -n "$sleeper" ]; then
        kill "$sleeper" 2>/dev/null
    fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

# The run's output goes on to the console as it comes; each stream is read line by line through a FIFO by a
# reader that keeps only what the failure line needs (the last "step N/M" line, the last error line), so a
# run of weeks does not fill a file. The readers ignore the stop signals: they must outlive the run.
mkfifo "$tmpd/out" "$tmpd/err" || bad "cannot create FIFOs in $tmpd"
reader() {   # FIFO, summary file, stdout|stderr
    trap '' INT TERM HUP
    local line step="" err="" mpi=""
    while IFS= read -r line || [ -n "$line" ]; do
        if [ "$3" = stderr ]; then printf '%s\n' "$line" >&2; else printf '%s\n' "$line"; fi
        case $line in
            step\ *) step=$line ;;
            error*) err=$line ;;   # "error: ..." (fail()), "error at file:line: ..." (the checks), "error: rank 0: lost rank 1 ..."
            *"exited on signal"*|*"noticed that process"*) mpi=$line ;;
        esac
    done < "$1"
    printf '%s\n%s\n%s\n' "$step" "$err" "$mpi" > "$2"
}
# setsid: the run gets its own session, so a Ctrl-C at the terminal reaches only this script, which passes
# one stop request on (mpirun would answer a SIGINT of its own by killing the ranks before they save)
launcher=(); command -v setsid >/dev/null && launcher=(setsid)
run_once() {   # the command; sets rc, reached (the last step line), cause
    rm -f "$tmpd/out.sum" "$tmpd/err.sum"
    reader "$tmpd/out" "$tmpd/out.sum" stdout & local r1=$!
    reader "$tmpd/err" "$tmpd/err.sum" stderr & local r2=$!
    "${launcher[@]}" "$@" > "$tmpd/out" 2> "$tmpd/err" &
    child=$!
    # a trapped signal cuts `wait` short (status > 128) while the run is still saving: wait again
    while :; do
        interrupted=0
        wait "$child" 2>/dev/null; rc=$?   # (2>/dev/null: bash's own "Killed" notice; the cause line says it)
        [ "$interrupted" = 1 ] || break
        if kill -0 "$child" 2>/dev/null; then continue; fi
        wait "$child" 2>/dev/null; local r=$?; [ "$r" = 127 ] || rc=$r   # 127: its status was already taken
        break
    done
    child=""
    # the readers end when the last writer closes; a leftover process holding the pipes must not hang us
    local i; for i in $(seq 1 50); do kill -0 "$r1" 2>/dev/null || kill -0 "$r2" 2>/dev/null || break; sleep 0.1; done
    kill "$r1" "$r2" 2>/dev/null; wait "$r1" "$r2" 2>/dev/null
    local sum_step="" sum_err="" sum_mpi=""
    { read -r sum_step; } < "$tmpd/out.sum" 2>/dev/null
    { read -r _; read -r sum_err; read -r sum_mpi; } < "$tmpd/err.sum" 2>/dev/null
    reached=$(sed -nE 's/^step +([0-9]+)\/.*/\1/p' <<<"$sum_step")
    cause=${sum_err:-$sum_mpi}
    if [ -z "$cause" ]; then
        cause="no error line in the run's output"
        [ "$rc" -gt 128 ] && [ "$rc" -le 192 ] && cause="$cause: killed by $(signame "$rc") (from outside, or the kernel's OOM killer?)"
    fi
}

attempt=0 restarts=0 same=0
run=("${cmd[@]}")
while :; do
    attempt=$((attempt + 1))
    before=$(newest_step)
    t0=$(date +%s)
    say "attempt $attempt: $(quoted "${run[@]}")"
    run_once "${run[@]}"
    dt=$(($(date +%s) - t0))
    after=$(newest_step)
    if [ -n "$stop_sig" ]; then
        say "stopped by SIG$stop_sig: the run ended with $(describe_exit "$rc"), newest checkpoint $(stepname "$after"); not restarting"
        exit "$rc"
    fi
    if [ "$rc" = 0 ]; then
        say "attempt $attempt finished (exit 0) after $dt s; $restarts restart(s) in all; newest checkpoint $(stepname "$after")"
        exit 0
    fi
    say "attempt $attempt failed after $dt s: $(describe_exit "$rc")${reached:+ after step $reached}; newest checkpoint $(stepname "$after") (was $(stepname "$before")); cause: $cause"
    if [ "$rc" = 2 ]; then
        say "giving up: exit 2 is bad input or configuration (the cause above), which a restart cannot fix"
        exit 2
    fi
    if [ "$after" -gt "$before" ]; then same=0; else same=$((same + 1)); fi
    if [ "$max_same" -gt 0 ] && [ "$same" -ge "$max_same" ]; then
        say "giving up: $same failure(s) in a row without a new checkpoint (newest $(stepname "$after"); --max-same-step $max_same): it fails at the same place every time"
        exit "$rc"
    fi
    if [ "$restarts" -ge "$max_restarts" ]; then
        say "giving up: $restarts restart(s) done, --max-restarts $max_restarts; last $(describe_exit "$rc")"
        exit "$rc"
    fi
    restarts=$((restarts + 1))
    delay=$(awk -v b="$backoff" -v k="$restarts" -v m="$backoff_max" 'BEGIN { d = b * 2 ^ (k - 1); if (d > m) d = m; print d }')
    note=""; [ -n "$had_resume" ] && [ "$had_resume" != auto ] && [ "$restarts" = 1 ] && note=" (in place of --resume $had_resume)"
    say "restart $restarts of $max_restarts in $delay s, with --resume auto$note"
    sleep "$delay" & sleeper=$!
    wait "$sleeper" 2>/dev/null; sleeper=""
    if [ -n "$stop_sig" ]; then
        say "stopped by SIG$stop_sig during the back-off: not restarting; newest checkpoint $(stepname "$after")"
        exit $((128 + $(kill -l "$stop_sig")))
    fi
    run=("${rcmd[@]}")
done
