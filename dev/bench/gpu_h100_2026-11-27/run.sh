#!/bin/bash
# session 37's device run: the checks in order of value, each under a limit, all before a deadline.
# Output: $OUT/log.txt (every step's tail) and $OUT/raw.tgz (every raw output).
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-500}))
O=${OUT:-/tmp/out}; R=$O/raw; mkdir -p "$R"
exec > >(tee "$O/log.txt") 2>&1
left() { echo $((DEADLINE - $(date +%s))); }
step() {  # name limit command...
    local name=$1 lim=$2 l s rc; shift 2; l=$(left)
    if [ "$l" -lt 8 ]; then echo "== $name: SKIP (deadline)"; return; fi
    [ "$lim" -gt "$l" ] && lim=$l
    echo "== $name (limit $lim s, t+$(( $(date +%s) - T0 )))"; s=$(date +%s)
    timeout -k 3 "$lim" "$@" > "$R/$name.txt" 2>&1; rc=$?
    echo "== $name: rc $rc, $(( $(date +%s) - s )) s"; tail -n "${TAILN:-20}" "$R/$name.txt" | cut -c1-240
}
finish() { (cd "$O" && tar -czf raw.tgz raw && rm -rf raw); }
trap finish EXIT

# --- the environment: the carried libraries, Open MPI as a singleton, NCCL and cuBLASLt of the device
cd .lease && tar -xzf libs.tgz && tar -xzf bins.tgz -C .. && cd .. || { echo "unpack failed"; exit 1; }
[ -d /usr/lib/x86_64-linux-gnu/openmpi ] || tar -C / -xzf .lease/ompi.tgz
for f in .lease/lib2/*; do ldconfig -p | grep -q "$(basename "$f")" || cp "$f" .lease/lib/; done
nccl=$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')
[ -n "$nccl" ] || nccl=$(find /usr/local /opt /usr/lib -name libnccl.so.2 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$PWD/.lease/lib:${nccl:+$(dirname "$nccl"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
mkdir -p data/sotu && cp .lease/data/* data/sotu/
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
echo "nccl: $nccl"; lscpu | grep -m1 "Model name"
ldd ./train_dbrx | grep -i "not found"; ldd dev/cuda/moe_grouped | grep -i "not found"

E2E=(--device cuda --model dbrx-1b --batch 8 --seq 2048 --warmup 5 --val-every 0)
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
