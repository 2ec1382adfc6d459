#!/bin/bash
# lease_next.sh — the checks the next lent GPU runs first (issue 25), in order of value, each under a limit, all before
# a deadline: copy it with lease_setup.sh into .lease/ (as dev/bench/gpu_*/run.sh was), carry .lease, run
# `BUDGET=490 bash .lease/lease_next.sh` in one call of timeout 560, give the machine back, then record the results in
# dev/bench/results_gpu.md and a dev/bench/gpu_<kind>_<date>/ folder (this script, the log, the traces).
# What each answers (dev/bench/results_gpu.md, session 39's section, says where things stood):
#   1. the kernel-by-kernel step: --profile-kernels at dbrx-1b (every launch and GEMM timed in the step), against
#      make predict's timeline (calibrate.py --kernels, run afterwards on the development machine): which kernels the
#      model misprices (the router range measured 1.47 x its prediction; the embedding 2.27 x)
#   2. the grouped expert kernels as sessions 39-41 left them (staged epilogues, m-fastest tile groups, batched wgrad
#      beta-1 loads, snake order; backward A's g, u TMA-loaded during the main loop): still behind cuBLASLt, or ahead
#      (then: the BF16 default); and the "v4 probe" lines: N 128 tiles at ~0.75 x the N 256 rate means the operands'
#      path through L2 limits the main loop (next: 2-block clusters with TMA multicast), about equal means it does not
#   3. the attention backward: the model's pair (-g 2), bwd2 (-g 4: if it wins, wire it into the step; branch s39-awire, which did, was lost in session 43's move), and the
#      wgmma versions of dev/cuda/attention_wgmma_bwd (-v 3 times the pair, v3 = the pair on wgmma and v4 = v3 with
#      FlashAttention-3's overlap in dq, each kernel alone too; -v 2, -v 1 the 5-product ones); the forward: the wgmma
#      v2 (the model's since session 40, timed only at DBRX-132B's shape so far) against the mma.sync forward
#   4. end to end: default, --attention-bwd wgmma and wgmma-overlap (the pair on wgmma: if one wins, the default),
#      --moe-gemm grouped, FP8 current and block (start-up is seconds since session 39)
#   0. first, make test-gpu's device checks (dev/test_gpu.sh with a plan: the device test programs and the dbrx-tiny
#      smoke run against PyTorch; not its shell suites or bench --quick, which the steps below cover): cuBLASLt opened on
#      first use (model/cublaslt_dlopen.h, session 44) runs its matmuls, heuristics and algo checks here first
. "$(dirname "$0")/lease_setup.sh"
hung() { grep -q "== $1: rc 12[4-9]\|== $1: rc 137" "$O/log.txt"; }
# 0. the device test programs and the smoke run (report: $O/test_gpu_report.md)
for t in test_kernels test_step_cuda test_fp8_cuda test_zero_fp8_cuda test_decode; do echo "${t}_gpu|40|doctest|./test/${t}_gpu"; done \
    > "$O/plan.txt"
echo "smoke: dbrx-tiny 20 steps|60|cmd|smoke" >> "$O/plan.txt"
step test_gpu 200 env TEST_GPU_PLAN="$O/plan.txt" TEST_GPU_REPORT="$O/test_gpu_report.md" TEST_GPU_RAW="$R/test_gpu" \
    TEST_GPU_DEADLINE=$DEADLINE PYTHON=python3 bash dev/test_gpu.sh
# 1. the step kernel by kernel (and the range profile of the same run's earlier steps)
step e2e_kernels 80 ./train_dbrx "${E2E[@]}" --steps 8 --log "$R/e2e_kernels.jsonl" --profile "$R/e2e_kernels.json" \
    --profile-steps 7:8 --profile-kernels
# 2. the grouped expert kernels
step moe_grouped_v4_1b 45 dev/cuda/moe_grouped -v 4 -s 1b
hung moe_grouped_v4_1b || step moe_grouped_v4_132b 60 dev/cuda/moe_grouped -v 4 -s 132b
step moe_wgrad_1b 40 dev/cuda/moe_wgrad -s 1b
step moe_fp8_grouped_132b 50 dev/cuda/moe_fp8_grouped -s 132b
# 3. attention backward at dbrx-1b's shape (B 8, T 2048, H 8, KV 2, hd 128)
step attention_bwd_pair 40 dev/cuda/attention -f -1 -g 2 -b 8 -t 2048 -h 8 -k 2 -d 128
step attention_bwd_v4 40 dev/cuda/attention -f -1 -g 4 -b 8 -t 2048 -h 8 -k 2 -d 128
for v in 3 2 1; do
    step attention_wgmma_bwd_v$v 45 dev/cuda/attention_wgmma_bwd -v $v -b 8 -t 2048 -h 8 -k 2 -d 128
done
step attention_wgmma_fwd 30 dev/cuda/attention_wgmma -b 8 -t 2048 -h 8 -k 2 -d 128
# 4. end to end
step e2e_bf16 60 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl" --profile "$R/e2e_bf16_profile.json" --profile-steps 21:22
# (the wgmma backward pair in the step, session 41's --attention-bwd: unless its kernels hung alone above)
for a in wgmma wgmma-overlap; do
    hung attention_wgmma_bwd_v3 || step e2e_attn_$a 60 ./train_dbrx "${E2E[@]}" --steps 30 --attention-bwd $a --log "$R/e2e_attn_$a.jsonl" \
        --profile "$R/e2e_attn_${a}_profile.json" --profile-steps 21:22
done
{ hung moe_grouped_v4_1b || hung moe_wgrad_1b; } || step e2e_grouped 60 ./train_dbrx "${E2E[@]}" --steps 30 --moe-gemm grouped \
    --log "$R/e2e_grouped.jsonl" --profile "$R/e2e_grouped_profile.json" --profile-steps 21:22
for p in current block; do
    step e2e_fp8_$p 50 ./train_dbrx "${E2E[@]}" --steps 20 --fp8 $p --log "$R/e2e_fp8_$p.jsonl"
done
echo "== done, t+$(( $(date +%s) - T0 ))"
