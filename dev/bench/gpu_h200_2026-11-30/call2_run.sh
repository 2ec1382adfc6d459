#!/bin/bash
# call2_run.sh (session 62): call 1's findings checked on the device. The experts' per-expert GEMMs on 2 streams
# (--moe-streams 2, new, the default) against 1 in the same binary, the steps interleaved; the losses must be call 1's
# bit for bit (2.6692058229236864 at step 30). LionW's fused update with its products rounded apart (test_kernels_gpu
# failed it in call 1). Then what call 1 cut short: dev/cuda/matmul -b (the backward's four expert GEMMs on 1/2/4
# streams), dev/cuda/fp8_fused, dev/cuda/matmul -c.
. "$(dirname "$0")/lease_setup.sh"
step test_kernels 40 ./test/test_kernels_gpu
step test_step_cuda 30 ./test/test_step_cuda_gpu
step e2e_bf16 40 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl"
step e2e_balanced 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_balanced.jsonl"
step e2e_balanced_s1 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 30 --moe-streams 1 --log "$R/e2e_balanced_s1.jsonl"
step e2e_bf16_s1 40 ./train_dbrx "${E2E[@]}" --steps 30 --moe-streams 1 --log "$R/e2e_bf16_s1.jsonl"
step e2e_accum4 40 ./train_dbrx "${E2E[@]}" --steps 8 --grad-accum 4 --log "$R/e2e_accum4.jsonl"
step e2e_balanced_accum4 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 8 --grad-accum 4 --log "$R/e2e_balanced_accum4.jsonl"
step e2e_balanced_profile 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 12 --log "$R/e2e_balanced_profile.jsonl" \
    --profile "$R/e2e_balanced_profile.json" --profile-steps 10:11
step matmul_b 70 dev/cuda/matmul -b
step fp8_fused 60 dev/cuda/fp8_fused
step matmul_c 60 dev/cuda/matmul -c
echo "== done, t+$(( $(date +%s) - T0 ))"
