#!/usr/bin/env bash
# test_kernel_bytes.sh — the step-time model's per-kernel formulas (dev/predict/kernel_cost.py: global-memory bytes
# read and written, tensor-core FLOPs) against what the emulator counts (train_dbrx_emu_count: the race detector's
# instrumentation counting every kernel's distinct global bytes and its mma.sync FLOPs into its work-log line,
# test/simt/bytecount.h), every kernel of one emulated training step of:
#   - BF16, head_dim 128 (d 256, 2 heads, GQA 1 kv head), 128 tokens (two flash-attention tiles: the causal tile
#     structure of the forward, dq and dk/dv FLOPs), 4 experts top-2, --compress-acts swiglu (its quantisation and
#     rebuild);
#   - --fp8 delayed at head_dim 48 (the warp-per-row attention kernels, per-tensor quantisation);
#   - 2 ranks: ZeRO-3 with expert parallelism 2, --fp8 block --fp8-gather (the ZeRO kernels, the FP8 all-gather's
#     amax/encode/decode, block quantisation of the padded expert layout, the all-to-all's row gathers);
#   - 3 ranks: ZeRO-3 with the vocabulary slot (--zero-chunk-mib 0.02) and the embedding's rows exchanged (the default
#     --zero-embedding rows: the pack and the owners' sums, pieces that cut rows);
#   - 2 ranks: --context-parallel 2 at head_dim 128, 256 tokens (the chunk pairs on the flash kernels, full and causal,
#     a key prefix and a query range; the merge, pack and unpack kernels), with --optimizer lion --adam-moments bf16 (LionW's
#     BF16-moment kernel on a shard);
#   - --attention-bwd wgmma at head_dim 128 and wgmma-overlap at head_dim 64, 160 tokens (the wgmma backward's dq, overlapped
#     dq and dk/dv kernels: a query block and a key block short of 128 rows), the former with --optimizer lion (LionW's
#     kernel), the latter with --adam-moments bf16 (AdamW's BF16-moment kernel);
# a kernel without a formula fails. Negative controls (test/test_kernel_bytes.py --control): a formula with twice the
# bytes, a kernel counted reading twice its bytes, flash attention's FLOPs one tile pair off, a kernel without a formula.
# Alone: bash test/test_kernel_bytes.sh (COUNT= overrides ./train_dbrx_emu_count)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
COUNT=${COUNT:-./train_dbrx_emu_count}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive

if [ ! -x "$COUNT" ]; then fail "$COUNT is not built (make train_dbrx_emu_count)"; exit 0; fi
small=(--device cuda --model dbrx-tiny --n-layers 1 --kv-heads 1 --experts 4 --top-k 2 --batch 1 --steps 1 --val-every 0)
run() {   # run NAME NP WANT ARGS...: one step with the counting work log; every kernel's verdict (at least WANT kernels)
    local name=$1 np=$2 want=$3; shift 3
    local logs=("$tmp/$name.jsonl")
    if [ "$np" = 1 ]; then
        SIMT_WORKLOG="$tmp/$name.jsonl" "$COUNT" "${small[@]}" "$@" > "$tmp/$name.out" 2>&1
    else
        SIMT_WORKLOG="$tmp/$name.jsonl" bash dev/mpirun.sh -np "$np" "$COUNT" "${small[@]}" "$@" > "$tmp/$name.out" 2>&1
        logs=(); for r in $(seq 0 $((np - 1))); do logs+=("$tmp/$name.jsonl.$r"); done
    fi || { fail "$name: the counting run failed (exit $?): $(tail -2 "$tmp/$name.out")"; return 1; }
    $PY test/test_kernel_bytes.py "$name" "${logs[@]}" > "$tmp/$name.txt" 2>&1
    verdicts "$tmp/$name.txt" "$want"
}
if run bf16-hd128 1 10 --d-model 256 --n-heads 2 --ffn-hidden 128 --seq 128 --compress-acts swiglu; then
    $PY test/test_kernel_bytes.py --control "$tmp/bf16-hd128.jsonl" > "$tmp/control.txt" 2>&1
    verdicts "$tmp/control.txt" 4
fi
run attn-bwd-wgmma-hd128 1 10 --d-model 256 --n-heads 2 --ffn-hidden 128 --seq 160 --attention-bwd wgmma --optimizer lion
run attn-bwd-wgmma-overlap-hd64 1 10 --d-model 128 --n-heads 2 --ffn-hidden 128 --seq 160 --attention-bwd wgmma-overlap --adam-moments bf16
run fp8-delayed-hd48 1 10 --d-model 96 --n-heads 2 --ffn-hidden 64 --seq 64 --fp8 delayed
run cp2-hd128 2 10 --d-model 256 --n-heads 2 --ffn-hidden 128 --seq 256 --context-parallel 2 --shard-group-size 2 --optimizer lion --adam-moments bf16
run zero3-emb-rows-np3 3 10 --d-model 128 --n-heads 1 --ffn-hidden 128 --seq 64 --shard-group-size 3 --zero-chunk-mib 0.02
run zero3-ep2-fp8-block-gather 2 10 --d-model 256 --n-heads 2 --ffn-hidden 128 --seq 128 --expert-parallel 2 --fp8 block --fp8-gather
