#!/bin/bash
# lease_next.sh — the checks the next lent GPU runs first (issue 25), in order of value, each under a limit, all before
# a deadline: `bash dev/bench/lease_pack.sh dev/bench/lease_next.sh` packs it with lease_setup.sh, the binaries, the
# libraries and the data into .lease/; run `BUDGET=360 bash .lease/lease_next.sh` in one call of timeout 420 (carry
# [".lease"]), give the machine back, then record the results in dev/bench/results_gpu.md and a
# dev/bench/gpu_<kind>_<date>/ folder (this script, the log, the traces). A machine starts in ~40 s (session 62's H200).
# Where things stand: dev/bench/results_gpu.md, session 62's section (an H200). What each step answers:
#   0. make test-gpu's device checks (dev/test_gpu.sh with a plan): test_kernels_gpu 28 of 28 on session 62's H200
#   1. the step end to end, balanced first (DBRX_DEBUG_ROUTE_BALANCED=1: the routing the model prices) on 2 streams (the
#      default) and on 1 (--moe-streams 1, the same binary: session 62's H200 gained 1.1 ms; on an H100 never run), then
#      the default routing (its losses to every digit across sessions: 2.6692058229236864 at step 30 on an H200,
#      2.6633126556989737 on an H100) and --grad-accum 4
#   2. the balanced step kernel by kernel (calibrate.py --kernels against make predict's trace of the same commit and
#      device, FLAGS="--moe-streams 1": --profile-kernels runs one stream): the model's misses on session 62's H200 were
#      bytes-bound kernels (the classifier 1.47 x, LayerNorm's backward 1.59 x, the combine and gather backwards 1.6-1.8 x)
#   3. the kernels alone on this device kind: dev/cuda/matmul -b (per-expert GEMMs on 1, 2, 4 streams; batched), -c
#      (GEMMs and a bytes-bound kernel beside C held CTAs: the model's HELD_CTAS_EXTRA, 0.075 from an H200), the cold GEMM
#      sweep (on an H100 it refreshes dev/predict/gemm_measured_h100-sxm.json with this commit's shapes, calibrate.py
#      --gemms), dev/cuda/attention_wgmma at dbrx-1b's and DBRX-132B's shapes (v4, 3 warpgroups, the model's since
#      session 62), dev/cuda/layernorm, dev/cuda/classifier, dev/cuda/moe (the next kernels to speed up)
#   4. FP8 block end to end and kernel by kernel (1.05 x BF16's time on session 62's H200)
. "$(dirname "$0")/lease_setup.sh"
for t in test_kernels test_step_cuda test_fp8_cuda test_zero_fp8_cuda test_decode; do echo "${t}_gpu|40|doctest|./test/${t}_gpu"; done \
    > "$O/plan.txt"
echo "smoke: dbrx-tiny 20 steps|60|cmd|smoke" >> "$O/plan.txt"
step test_gpu 150 env TEST_GPU_PLAN="$O/plan.txt" TEST_GPU_REPORT="$O/test_gpu_report.md" TEST_GPU_RAW="$R/test_gpu" \
    TEST_GPU_DEADLINE=$DEADLINE PYTHON=python3 bash dev/test_gpu.sh
step e2e_balanced 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_balanced.jsonl"
step e2e_balanced_s1 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 30 --moe-streams 1 --log "$R/e2e_balanced_s1.jsonl"
step e2e_bf16 40 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl"
step e2e_accum4 40 ./train_dbrx "${E2E[@]}" --steps 8 --grad-accum 4 --log "$R/e2e_accum4.jsonl"
step e2e_kernels 40 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 8 --log "$R/e2e_kernels.jsonl" \
    --profile "$R/e2e_kernels.json" --profile-steps 7:8 --profile-kernels
step matmul_b 70 dev/cuda/matmul -b
step gemm_sweep 50 dev/cuda/matmul -s .lease/gemm_shapes.txt -a 8
step attention_1b 30 dev/cuda/attention_wgmma -b 8 -t 2048 -h 8 -k 2 -d 128
step attention_132b 40 dev/cuda/attention_wgmma -b 8 -t 4096 -h 48 -k 8 -d 128
step matmul_c 60 dev/cuda/matmul -c
step layernorm 30 dev/cuda/layernorm
step classifier 40 dev/cuda/classifier
step moe 60 dev/cuda/moe
step e2e_fp8_block 40 ./train_dbrx "${E2E[@]}" --steps 20 --fp8 block --log "$R/e2e_fp8_block.jsonl" \
    --profile "$R/e2e_fp8_block_kernels.json" --profile-steps 9:10 --profile-kernels
echo "== done, t+$(( $(date +%s) - T0 ))"
