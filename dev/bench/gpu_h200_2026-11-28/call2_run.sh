#!/bin/bash
# call 2 (session 46, H200): the kernels rewritten this session — LayerNorm backward on every warp, the combine backward
# a warp per token, the classifier's row in shared memory (all designed to keep the bits) — and test_kernels_gpu whole
# with its FP8 tolerance at Hopper's accumulator precision
. "$(dirname "$0")/lease_setup.sh"
step test_kernels 60 ./test/test_kernels_gpu
step layernorm 40 dev/cuda/layernorm
step classifier 40 dev/cuda/classifier
step moe 60 dev/cuda/moe
step e2e_kernels 45 ./train_dbrx "${E2E[@]}" --steps 8 --log "$R/e2e_kernels.jsonl" --profile "$R/e2e_kernels.json" \
    --profile-steps 7:8 --profile-kernels
step e2e_bf16 45 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl" --profile "$R/e2e_bf16_profile.json" --profile-steps 21:22
step e2e_accum4 45 ./train_dbrx "${E2E[@]}" --steps 8 --grad-accum 4 --log "$R/e2e_accum4.jsonl"
echo "== done, t+$(( $(date +%s) - T0 ))"
