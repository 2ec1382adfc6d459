#!/bin/bash
# call 3 of 2026-11-28: test_kernels_gpu whole (the FP8 wrapper's next candidates), test_step_cuda_gpu
. "$(dirname "$0")/lease_setup.sh"
step test_kernels_gpu 60 ./test/test_kernels_gpu
step test_fp8_cuda_gpu 40 ./test/test_fp8_cuda_gpu
echo "== done, t+$(( $(date +%s) - T0 ))"
