#!/bin/bash
# call 6 of 2026-11-28: test_kernels_gpu whole, its FP8 check accumulating (beta 1)
. "$(dirname "$0")/lease_setup.sh"
step test_kernels_gpu 60 ./test/test_kernels_gpu
echo "== done, t+$(( $(date +%s) - T0 ))"
