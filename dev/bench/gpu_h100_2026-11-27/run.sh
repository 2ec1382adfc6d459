#!/bin/bash
# session 37's device run: the checks in order of value, each under a limit, all before a deadline.
# Output: $OUT/log.txt (every step's tail) and $OUT/raw.tgz (every raw output).
. "$(dirname "$0")/lease_setup.sh"   # (dev/bench/lease_setup.sh, copied beside this script into .lease/)
# 1. dbrx-1b BF16: today's step, then --moe-gemm grouped (first run on a GPU), both profiled at steps 21:22
step e2e_bf16 90 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl" --profile "$R/e2e_bf16_profile.json" --profile-steps 21:22
step e2e_grouped 90 ./train_dbrx "${E2E[@]}" --steps 30 --moe-gemm grouped --log "$R/e2e_grouped.jsonl" --profile "$R/e2e_grouped_profile.json" --profile-steps 21:22
# 2. the grouped GEMMs against today's expert path (validated first), the wgmma attention pair (first runs)
step moe_grouped_1b 60 dev/cuda/moe_grouped -s 1b
step moe_grouped_132b 60 dev/cuda/moe_grouped -s 132b
step attention_wgmma 60 dev/cuda/attention_wgmma
step attention_wgmma_bwd 90 dev/cuda/attention_wgmma_bwd
# 3. the device test programs (test_fp8_cuda_gpu: the per-tensor FP8 fix, never run on a device)
for t in test_fp8_cuda_gpu test_kernels_gpu test_step_cuda_gpu test_zero_fp8_cuda_gpu test_decode_gpu; do
    TAILN=8 step "$t" 60 ./test/$t
done
# 4. the step's GEMMs one by one (the step-time model's measured table for the H100)
step gemm_sweep 90 dev/cuda/matmul -s .lease/gemm_list.txt
# 5. FP8 end to end (delayed / current: NOT_SUPPORTED on the H200 before the fix; block)
for p in delayed current block; do
    step e2e_fp8_$p 60 ./train_dbrx "${E2E[@]}" --steps 20 --fp8 $p --log "$R/e2e_fp8_$p.jsonl"
done
# 6. memory-bound kernels, grad-accum 4
for b in layernorm moe classifier adamw embedding; do TAILN=12 step $b 30 dev/cuda/$b; done
step e2e_accum4 90 ./train_dbrx "${E2E[@]}" --steps 12 --grad-accum 4 --log "$R/e2e_accum4.jsonl"
echo "== done, t+$(( $(date +%s) - T0 ))"
