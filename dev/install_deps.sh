#!/usr/bin/env bash
# install_deps.sh — installs the Debian packages train_dbrx needs that are missing (as root, or
# through sudo): compiler, OpenBLAS (CPU GEMMs), OpenMPI, doctest (tests), PyTorch and NumPy
# (the reference the tests compare against), matplotlib (dev/plot_run.py), npm (fetches the default
# dataset and the reference tokenizer js-tiktoken), clang with its libFuzzer runtime (the fuzz test of
# the data parsers).
# nvcc is optional: without it the CPU-only binary is built.
set -euo pipefail
pkgs=(g++ make libopenblas-dev libopenmpi-dev openmpi-bin doctest-dev python3 python3-torch python3-numpy python3-matplotlib
      clang libclang-rt-14-dev)
command -v npm >/dev/null || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then echo "deps: all installed"; exit 0; fi
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
