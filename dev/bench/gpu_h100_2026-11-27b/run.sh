#!/bin/bash
# session 39's device run: the checks in order of value, each under a limit, all before a deadline.
# Output: $OUT/log.txt (every step's tail) and $OUT/raw.tgz (every raw output).
. "$(dirname "$0")/lease_setup.sh"   # (dev/bench/lease_setup.sh, copied beside this script into .lease/)
hung() { grep -q "== $1: rc 12[4-9]\|== $1: rc 137" "$O/log.txt"; }
# 1. the TMA + mbarrier grouped kernels, first run on a GPU (each may hang: its own limit; a hang skips what needs it)
step moe_grouped_v4_1b 45 dev/cuda/moe_grouped -v 4 -s 1b
hung moe_grouped_v4_1b || step moe_grouped_v4_132b 60 dev/cuda/moe_grouped -v 4 -s 132b
step moe_wgrad_1b 40 dev/cuda/moe_wgrad -s 1b
hung moe_wgrad_1b || step moe_wgrad_132b 50 dev/cuda/moe_wgrad -s 132b
step moe_fp8_grouped_1b 40 dev/cuda/moe_fp8_grouped -s 1b
hung moe_fp8_grouped_1b || step moe_fp8_grouped_132b 50 dev/cuda/moe_fp8_grouped -s 132b
# 2. dbrx-1b BF16 end to end: today's step (the dq + dk/dv attention pair, never timed in the step), then grouped
step e2e_bf16 80 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl" --profile "$R/e2e_bf16_profile.json" --profile-steps 21:22
{ hung moe_grouped_v4_1b || hung moe_wgrad_1b; } || step e2e_grouped 80 ./train_dbrx "${E2E[@]}" --steps 30 --moe-gemm grouped --log "$R/e2e_grouped.jsonl" --profile "$R/e2e_grouped_profile.json" --profile-steps 21:22
# 3. the device test programs (seconds each)
for t in test_kernels_gpu test_fp8_cuda_gpu test_step_cuda_gpu test_zero_fp8_cuda_gpu test_decode_gpu; do
    TAILN=8 step "$t" 40 ./test/$t
done
# 4. the step's GEMMs one by one (the step-time model's measured table), attention backward pair vs 5-product
TAILN=70 step gemm_sweep 80 dev/cuda/matmul -s .lease/gemm_list.txt
step attention_bwd 60 dev/cuda/attention -f -1 -g 2
step attention_bwd5 60 dev/cuda/attention -f -1 -g 3
# 5. FP8 end to end
for p in delayed current block; do
    step e2e_fp8_$p 60 ./train_dbrx "${E2E[@]}" --steps 20 --fp8 $p --log "$R/e2e_fp8_$p.jsonl"
done
step attention_wgmma_bwd 60 dev/cuda/attention_wgmma_bwd
echo "== done, t+$(( $(date +%s) - T0 ))"
