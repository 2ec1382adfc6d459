#!/usr/bin/env bash
# run.sh — the guide's rule "every device line executes in some emulated test", measured: the working tree (a clone,
# its tracked and untracked, not ignored, files copied over it) in a scratch directory, built there with `make COVERAGE=1` (the
# emulated builds instrumented for gcov), the whole test suite run there (make test: about 37 minutes on 2 cores),
# then dev/coverage/report.py: the product's device lines and functions no test executed.
#
#   bash dev/coverage/run.sh [DIR]     # DIR: the scratch tree (default: a new mktemp -d), kept for gcov afterwards
#
# The suite's own verdict is printed but does not decide the exit status: gcov's counters slow the emulated tests,
# and a check that times itself may fail here where it passes in CI. Exit status: 0 with a report, 1 when the build
# or the report failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
dir=${1:-$(mktemp -d)}
mkdir -p "$dir" || exit 1
[ -z "$(ls -A "$dir")" ] || { echo "error: dev/coverage/run.sh: $dir is not empty" >&2; exit 1; }
# a clone (the suite asks git for the tree's root), then the working tree's files over it
git clone -q --no-hardlinks . "$dir" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$dir" \
    || { echo "error: dev/coverage/run.sh: copying the tree to $dir failed" >&2; exit 1; }
echo "coverage: the tree in $dir; make COVERAGE=1 test-build, then make COVERAGE=1 test (log: $dir/coverage_test.log)"
(cd "$dir" && make COVERAGE=1 test-build > coverage_build.log 2>&1) \
    || { echo "error: dev/coverage/run.sh: the build failed (tail of $dir/coverage_build.log):" >&2; tail -5 "$dir/coverage_build.log" >&2; exit 1; }
(cd "$dir" && make COVERAGE=1 test > coverage_test.log 2>&1)
echo "coverage: the suite said: $(tail -1 "$dir/coverage_test.log")"
python3 dev/coverage/report.py "$dir" --lines --json "$dir/coverage_never.json" || exit 1
