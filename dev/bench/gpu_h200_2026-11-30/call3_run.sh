#!/bin/bash
# call3_run.sh (session 62): the attention forward on 3 warpgroups (dev/cuda/attention_wgmma's v4, the model's now) in
# the step: test_kernels_gpu (the attention cases against the CPU), the default step (its losses must be calls 1-2's bit
# for bit: 2.6692058229236864 at step 30) and the balanced one; v2-v4 at DBRX-132B's attention shape (B 8, T 4096,
# H 48, KV 8: v2 271 TFLOP/s on session 45's H100; the step-time model now predicts v4 at 313 there, untimed).
. "$(dirname "$0")/lease_setup.sh"
step test_kernels 40 ./test/test_kernels_gpu
step e2e_bf16 40 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl"
step e2e_balanced 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_balanced.jsonl"
step attention_132b 40 dev/cuda/attention_wgmma -b 8 -t 4096 -h 48 -k 8 -d 128
step attention_doc 25 dev/cuda/attention_doc -b 8 -t 2048 -h 8 -k 2 -d 128 -l 512
echo "== done, t+$(( $(date +%s) - T0 ))"
