#!/bin/bash
# lease_setup.sh — sourced by a lent GPU's run.sh (dev/bench/gpu_*/run.sh, copied with it into .lease/): the time-limited
# step() runner before a deadline ($BUDGET seconds), the carried libraries and binaries unpacked, Open MPI as a
# singleton, the device's NCCL and cuBLASLt on the library path, the data shards in place.
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
