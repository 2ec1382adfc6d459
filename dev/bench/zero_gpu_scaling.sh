#!/usr/bin/env bash
# zero_gpu_scaling.sh — weak scaling of the CUDA path's device store (parallel/zero_gpu.cuh) on one node:
# the same micro-batch per GPU on 1, 2, 4, 8 GPUs (ZeRO-3 over all of them), tokens/s per GPU from the
# median step time of the last 10 of 20 steps, and the scaling efficiency t(1 GPU) / t(N GPUs) per step:
# 1 - efficiency bounds the communication left exposed (ZeRO-3 adds the gathers and reduce-scatters; with
# all of them hidden behind compute the step time would not grow). Then a DBRX-132B-shaped slice (4 layers
# of the real width, vocab 100352) on 8 GPUs, where one GPU cannot hold it.
#   bash dev/bench/zero_gpu_scaling.sh [max GPUs, default 8]      (needs: make, a GPU node, make data)
# Results go to dev/bench/results_zero_gpu.md (appended, with the GPU's name and the date).
set -euo pipefail
cd "$(dirname "$0")/../.."
MAX=${1:-8}
out=dev/bench/results_zero_gpu.md
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
median() { /usr/bin/python3 -c "import json,sys,statistics; r=[json.loads(l) for l in open(sys.argv[1]) if '\"loss\"' in l][-10:]; print('%.1f' % statistics.median(x['ms'] for x in r))" "$1"; }
run() {  # name, np, flags...
    local name=$1 np=$2; shift 2
    bash dev/mpirun.sh -np "$np" ./train_dbrx --device cuda --steps 20 --val-every 0 --warmup 5 "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 \
        || { echo "$name failed: $(tail -3 "$tmp/$name.out")"; return 1; }
}
{
echo; echo "## $(date -u +%Y-%m-%d) — $gpu, weak scaling of dbrx-1b (batch 4 x 2048 per GPU, ZeRO-3 over N)"; echo
echo "| GPUs | step ms (median) | tokens/s per GPU | efficiency t1/tN |"; echo "|---|---|---|---|"
t1=""
for np in 1 2 4 8; do
    [ "$np" -le "$MAX" ] || break
    run "1b_$np" "$np" --model dbrx-1b --batch 4 --seq 2048 || continue
    ms=$(median "$tmp/1b_$np.jsonl"); [ -n "$t1" ] || t1=$ms
    echo "| $np | $ms | $(/usr/bin/python3 -c "print('%.0f' % (4 * 2048 / ($ms / 1000)))") | $(/usr/bin/python3 -c "print('%.2f' % ($t1 / $ms))") |"
done
if [ "$MAX" -ge 8 ]; then
    run slice 8 --model dbrx-132b --n-layers 4 --batch 1 --seq 2048 && {
        ms=$(median "$tmp/slice.jsonl")
        echo; echo "DBRX-132B-shaped slice (4 layers, d 6144, 16 experts of 10752, vocab 100352), 8 GPUs ZeRO-3, batch 1 x 2048 per GPU:"
        echo "median step $ms ms, $(/usr/bin/python3 -c "print('%.0f' % (2048 / ($ms / 1000)))") tokens/s per GPU"
    }
fi
} | tee -a "$out"
