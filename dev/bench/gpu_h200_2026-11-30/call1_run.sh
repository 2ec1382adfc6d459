#!/bin/bash
# call1_run.sh (session 62: dev/bench/lease_next.sh with the step's numbers first)
# lease_next.sh — the checks the next lent GPU runs first (issue 25), in order of value, each under a limit, all before
# a deadline: `bash dev/bench/lease_pack.sh dev/bench/lease_next.sh` packs it with lease_setup.sh, the binaries, the
# libraries and the data into .lease/; run `BUDGET=360 bash .lease/lease_next.sh` in one call of timeout 420 (carry
# [".lease"]), give the machine back, then record the results in dev/bench/results_gpu.md and a
# dev/bench/gpu_<kind>_<date>/ folder (this script, the log, the traces).
# What each answers (dev/bench/results_gpu.md, session 46's section, says where things stood):
#   0. make test-gpu's device checks (dev/test_gpu.sh with a plan): test_kernels_gpu whole (24 of 24 on an H200 in
#      session 46, before the router's warp kernels), the step, FP8, the smoke run against PyTorch
#   1. the kernels changed without a device: dev/cuda/moe (the router's forward and backward a warp per token against
#      v1, a thread per token: v1's bits, and the times), dev/cuda/classifier (v2 the model's; v3 and v4 probes: the
#      row in shared memory and less arithmetic, and the arithmetic alone), dev/cuda/layernorm (the backward's v3, 54%
#      of the H100's HBM in session 45's step, and session 58's v4: the row in registers, its 16-byte loads all in
#      flight; never timed), dev/cuda/fp8_fused (session 56's weight^T: dgrad's transposed codes from the gathered codes, 1 and 16 bytes an
#      access, against quantising the BF16 weight; never timed on a device), dev/cuda/attention_wgmma at dbrx-1b's
#      attention (B 8, T 2048, H 8, KV 2, hd 128; the model's v2 at 216 TFLOP/s on session 45's H100, issue 25's target
#      300): session 58's v3 (key tiles of 128) and v4 (3 warpgroups, 192 query rows), never timed; the fastest becomes
#      the model's; dev/cuda/attention_doc (session 60's --doc-mask, never timed): the masked forward and backward with
#      documents of 512 tokens against the causal ones (the kernels skip the tiles outside the documents: the attended
#      FLOPs are 25.0% of the causal ones at T 2048)
#   1b. the expert GEMMs (dev/cuda/matmul -b): dbrx-1b's per-expert GEMMs on 1, 2 and 4 streams and batched: do the
#      per-expert launches leave the GPU part idle (44 ms of the step are GEMMs)? And the step's GEMMs one by one, L2
#      flushed (the table make predict reads) and warm (-w): is the table's 1.15 x the step's GEMM time the flush?
#      On an H200 the cold sweep is the first H200 GEMM table (calibrate.py --gemms, after the call). The cold sweep
#      times each GEMM with the heuristic's first 8 answers too (-a 8; ms= stays the first's, the product's choice): its
#      last line says what an autotuner timing them at the first step would save over the step's GEMMs. The list holds
#      the DBRX-132B slice's GEMMs as well (8 GPUs, EP 8: BF16 and FP8 block), never timed: the model's rate table
#      prices them today, FP8 block at 1.45 x BF16 (predict.py's FP8_BLOCK_GEMM_VS_BF16: session 45's forward only)
#   1c. GEMMs and a bytes-bound kernel beside a kernel holding C = 8..32 SMs (dev/cuda/matmul -c): the step-time model's
#      price of a collective's NCCL CTAs beside the compute, SMs / (SMs - C) x for the GEMMs, 1 x for the bytes-bound
#      kernel (session 57, dev/predict/README.md); never measured
#   1d. AdamW beside one dbrx-1b layer's expert GEMMs (dev/cuda/adamw -o): the GEMMs on a stream of the greatest
#      priority, the model's AdamW over a layer's parameters on one of the least, at the product's grid and capped at
#      8-32 CTAs: how much of the optimizer (11 ms of the step) would hide under the next step's forward (session 58:
#      not built until this says it pays; the model's stream 0 cannot be given a priority above another's)
#   2. the step kernel by kernel (calibrate.py --kernels against make predict's trace of the same commit and device), at
#      the model's balanced routing (DBRX_DEBUG_ROUTE_BALANCED=1, session 58): sessions 45 and 46 profiled a router
#      collapsed from step 1 (imb 3.99-4.00: 4 experts take all 16384 tokens), whose 16384-row expert GEMMs run ~1.2 x
#      faster than the balanced 4096-row ones the model prices, so their 0.99 measured / predicted compared other shapes;
#      experts_zero_empty_kernel now with 16-byte stores (0.83 ms a step on session 45's H100 with the collapsed routing)
#   3. end to end: the default (bit-identical losses to session 46's: 2.6692058229236864 at step 30), the default at the
#      balanced routing (the step the model predicts: 90.4 ms), --grad-accum 4,
#      FP8 block (its steps 9-10 kernel by kernel: the FP8 step has never been profiled on a device; the model is 6.7 ms
#      optimistic there, session 45's H100), --gemm-autotune 8 (each GEMM shape's fastest of cuBLASLt's first 8 answers, timed in step 1: against the
#      default's median; -a 8's last line above says what the GEMMs alone would save), and --moe-gemm grouped (session
#      45's H100: 100.9 ms against the default's 89.4; unchanged since), and last, the balanced step with --optimizer lion
#      (session 59: predicted 87.4 ms against AdamW's 90.4, the optimizer's pass 22 B a parameter against 30), and the balanced
#      step with --doc-mask 256 (session 60: the default data's documents are ~46K bytes, so few sequences hold a boundary:
#      the mask's cost where it skips nothing, against e2e_balanced's time; the same losses up to those few sequences')
. "$(dirname "$0")/lease_setup.sh"
# 0. the device test programs and the smoke run (report: $O/test_gpu_report.md)
for t in test_kernels test_step_cuda test_fp8_cuda test_zero_fp8_cuda test_decode; do echo "${t}_gpu|40|doctest|./test/${t}_gpu"; done \
    > "$O/plan.txt"
echo "smoke: dbrx-tiny 20 steps|60|cmd|smoke" >> "$O/plan.txt"
step test_gpu 150 env TEST_GPU_PLAN="$O/plan.txt" TEST_GPU_REPORT="$O/test_gpu_report.md" TEST_GPU_RAW="$R/test_gpu" \
    TEST_GPU_DEADLINE=$DEADLINE PYTHON=python3 bash dev/test_gpu.sh
step e2e_balanced 45 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_balanced.jsonl"
step e2e_kernels 45 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 8 --log "$R/e2e_kernels.jsonl" \
    --profile "$R/e2e_kernels.json" --profile-steps 7:8 --profile-kernels
step e2e_bf16 45 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl" --profile "$R/e2e_bf16_profile.json" --profile-steps 21:22
step moe 60 dev/cuda/moe
step classifier 40 dev/cuda/classifier
step layernorm 30 dev/cuda/layernorm
step attention_wgmma 30 dev/cuda/attention_wgmma -b 8 -t 2048 -h 8 -k 2 -d 128
step attention_doc 25 dev/cuda/attention_doc -b 8 -t 2048 -h 8 -k 2 -d 128 -l 512
step fp8_fused 30 dev/cuda/fp8_fused
step gemm_sweep 50 dev/cuda/matmul -s .lease/gemm_shapes.txt -a 8
step matmul_b 20 dev/cuda/matmul -b
step matmul_c 30 dev/cuda/matmul -c
step adamw_o 30 dev/cuda/adamw -o
step e2e_fp8_block 40 ./train_dbrx "${E2E[@]}" --steps 20 --fp8 block --log "$R/e2e_fp8_block.jsonl" \
    --profile "$R/e2e_fp8_block_kernels.json" --profile-steps 9:10 --profile-kernels
step e2e_autotune 45 ./train_dbrx "${E2E[@]}" --steps 30 --gemm-autotune 8 --log "$R/e2e_autotune.jsonl"
step e2e_accum4 45 ./train_dbrx "${E2E[@]}" --steps 8 --grad-accum 4 --log "$R/e2e_accum4.jsonl"
step e2e_lion 30 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 20 --optimizer lion --lr 6e-4 --log "$R/e2e_lion.jsonl"
step e2e_docmask 30 env DBRX_DEBUG_ROUTE_BALANCED=1 ./train_dbrx "${E2E[@]}" --steps 20 --doc-mask 256 --log "$R/e2e_docmask.jsonl"
step e2e_grouped 40 ./train_dbrx "${E2E[@]}" --steps 20 --moe-gemm grouped --log "$R/e2e_grouped.jsonl"
step gemm_sweep_warm 25 dev/cuda/matmul -s .lease/gemm_shapes.txt -w
echo "== done, t+$(( $(date +%s) - T0 ))"
