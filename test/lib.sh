# lib.sh — helpers shared by the shell tests: `pass`/`fail` record one check each; counts are
# appended to $RESULTS (one "pass"/"fail" line per check) so run_all.sh can total them.
RESULTS=${RESULTS:-/dev/null}
pass() { echo "ok   $*"; echo pass >> "$RESULTS"; }
fail() { echo "FAIL $*"; echo fail >> "$RESULTS"; }
# jsonl_steps LOG: one "step loss grad_norm" line per step of a training run's JSONL log (--log), the numbers
# as the log holds them (repr: every digit), so that two runs compare with cmp
jsonl_steps() {
    /usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"
}
# expect_exit CODE NAME CMD...: runs CMD, checks its exit code, and that stderr is one line
expect_exit() {
    local code=$1 name=$2; shift 2
    local err; err=$(mktemp)
    "$@" >/dev/null 2>"$err"; local rc=$?
    local lines; lines=$(grep -c . "$err")
    if [ "$rc" = "$code" ] && [ "$lines" = 1 ]; then pass "$name (exit $rc: $(cat "$err"))"
    else fail "$name: exit $rc (want $code), stderr $lines line(s): $(head -c 400 "$err")"; fi
    LAST_ERR=$(cat "$err"); rm -f "$err"
}
# verdicts FILE N: records FILE's "pass ..." / "fail ..." lines (written by a checker script) as checks,
# and one failure if there are fewer than N of them (the checker crashed or skipped some)
verdicts() {
    local file=$1 want=$2 n=0 verdict rest
    while read -r verdict rest; do
        n=$((n + 1)); [ "$verdict" = pass ] && pass "$rest" || fail "$rest"
    done < "$file"
    [ "$n" -ge "$want" ] || fail "$file: $n of $want verdicts (the checker failed: see its output above)"
}
# waitlog FILE N: waits (up to 60 s) until the JSONL log FILE holds N step lines
waitlog() { local i n; for i in $(seq 1 600); do n=$(grep -c '"loss"' "$1" 2>/dev/null); [ "${n:-0}" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }
children() {  # pids whose parent is $1 (from /proc: no procps needed)
    local parent=$1 f st
    for f in /proc/[0-9]*/stat; do
        st=$(cat "$f" 2>/dev/null) || continue
        st=${st##*) }   # after the command name, which may hold spaces: "S ppid ..."
        set -- $st
        [ "$2" = "$parent" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
    done
}
