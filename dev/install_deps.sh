#!/usr/bin/env bash
# install_deps.sh — installs the Debian packages that are missing (as root, or through sudo), without
# recommended packages.
#   bash dev/install_deps.sh          (make deps)       what building, `make data` and `make train` need:
#       the compiler, OpenBLAS (the CPU GEMMs), OpenMPI (mpicxx, mpirun), curl and the CA certificates
#       (make data downloads the default dataset's tarball). No Python, no npm: nothing on the training
#       path runs them.
#   bash dev/install_deps.sh --test   (make deps-test)  that, and what the test suite needs besides:
#       doctest (the C++ tests), PyTorch and NumPy (the reference the parity tests compare against, and
#       dev/hf_logits.py), matplotlib (dev/plot_run.py, test_plot.sh), clang with its libFuzzer runtime
#       (the fuzz test of the data parsers), npm (installs the reference tokenizer js-tiktoken; brings nodejs).
# Counted with apt-get -s --no-install-recommends over Debian 12's required packages: training 119
# packages, training and tests 841 (before this split, make deps installed the latter set for training).
# nvcc (the CUDA toolkit, with cuBLASLt and NCCL) is not a Debian package here: without it `make` builds
# the CPU-only binary. test/test_deps.sh checks these lists against the Makefile's and scripts' messages.
set -euo pipefail
TRAIN_PKGS=(g++ make libopenblas-dev libopenmpi-dev openmpi-bin curl ca-certificates)
TEST_PKGS=(doctest-dev python3 python3-torch python3-numpy python3-matplotlib clang libclang-rt-14-dev npm)

case "${1:-}" in
    "") pkgs=("${TRAIN_PKGS[@]}"); what="training" ;;
    --test) pkgs=("${TRAIN_PKGS[@]}" "${TEST_PKGS[@]}"); what="training and the tests" ;;
    --list) echo "train: ${TRAIN_PKGS[*]}"; echo "test: ${TEST_PKGS[*]}"; exit 0 ;;
    *) echo "install_deps.sh: unknown option '$1' (none: training; --test: training and the tests; --list)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
    # an npm that is already there (e.g. NodeSource's nodejs package ships it) is kept: Debian's would conflict
    [ "$p" = npm ] && command -v npm >/dev/null && continue
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then echo "deps: all installed ($what)"; exit 0; fi
echo "deps: installing ${missing[*]} ($what)"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
