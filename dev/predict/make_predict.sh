#!/usr/bin/env bash
# make_predict.sh — make predict: the predicted GPU step of one configuration (dev/predict/README.md).
#   MODEL (dbrx-1b)  BATCH (8)  SEQ (2048)  NP (1)  DEVICE (h100-sxm | h100-pcie | h200)  FLAGS (more trainer flags,
#   e.g. '--fp8 block' or '--shard-group-size 64 --expert-parallel 8')  TRACE=FILE (the predicted timeline as a Chrome
#   trace)  JSON=1 (the summary as one JSON object)  EMU (./train_dbrx_emu)
#   RUN_LAYERS: empty (default): one run at the model's own layer count. "L1 L2": two runs, every number extrapolated
#   linearly in the layers to the model's count (for hundreds of ranks, whose emulated step is slow on a small machine).
# The run: 2 training steps of the emulated binary with SIMT_SHAPES_ONLY=1 (test/simt/simt.h: every launch, GEMM, copy
# and collective is checked and logged, none is computed; the router's place taken by a balanced routing) and
# SIMT_WORKLOG; the predictor takes step 2 of every rank's log (the slowest rank sets the step). Seconds for dbrx-1b at
# 8 x 2048 tokens; a minute or two for hundreds of emulated ranks on 2 cores. The emulated device is made large
# (SIMT_DEVICE_MEMORY) so that a configuration is predicted even where it does not fit: the run's own per-rank memory
# line is printed, with the verdict against the device's memory.
set -u
cd "$(dirname "$0")/../.." || exit 1
MODEL=${MODEL:-dbrx-1b} BATCH=${BATCH:-8} SEQ=${SEQ:-2048} NP=${NP:-1} DEVICE=${DEVICE:-h100-sxm}
RUN_LAYERS=${RUN_LAYERS:-} FLAGS=${FLAGS:-} EMU=${EMU:-./train_dbrx_emu} PY=${PYTHON:-/usr/bin/python3}
case "$DEVICE" in h100-sxm|h100-pcie) mem_gib=80 ;; h200) mem_gib=141 ;;
    *) echo "error: make predict: DEVICE='$DEVICE' must be h100-sxm, h100-pcie or h200" >&2; exit 2 ;; esac
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || { echo "error: make predict: NP='$NP' must be a positive integer" >&2; exit 2; }
[ -x "$EMU" ] || { echo "error: make predict: $EMU is not built (make train_dbrx_emu)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
runs=(${RUN_LAYERS:-""})
logs=() fpt="" layers=""
for l in "${runs[@]}"; do
    tag=${l:-all}
    echo "make predict: emulating 2 steps of $MODEL${l:+ with $l layer(s)}, batch $BATCH x $SEQ, $NP rank(s), shapes only" >&2
    # shellcheck disable=SC2086
    SIMT_SHAPES_ONLY=1 SIMT_WORKLOG="$tmp/wl_$tag.jsonl" SIMT_DEVICES=$((NP > 8 ? NP : 8)) SIMT_DEVICE_MEMORY=$((1 << 50)) \
        OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive bash dev/mpirun.sh -np "$NP" "$EMU" --device cuda --model "$MODEL" \
        ${l:+--n-layers $l} --batch "$BATCH" --seq "$SEQ" --steps 2 --val-every 0 --comm-timeout 1e6 $FLAGS > "$tmp/run_$tag.txt" 2>&1 \
        || { echo "error: make predict: the emulated run failed:" >&2; grep -v '^ *$' "$tmp/run_$tag.txt" | grep -iv "^step\|^-*$" | tail -6 >&2; exit 1; }
    [ -n "$fpt" ] || fpt=$(sed -nE 's/^mfu: ([0-9.e+]+) FLOPs\/token.*/\1/p' "$tmp/run_$tag.txt" | head -1)
    [ -z "$l" ] && layers=$(sed -nE 's/^model .*, layers ([0-9]+),.*/\1/p' "$tmp/run_$tag.txt" | head -1)
    mem=$(grep -m1 "^GPU memory per rank" "$tmp/run_$tag.txt")
    logs+=("$tmp/wl_$tag.jsonl")
done
[ -n "$fpt" ] || { echo "error: make predict: the run printed no 'mfu:' line (FLOPs per token)" >&2; exit 1; }
if [ -n "$RUN_LAYERS" ]; then   # the model's own layer count, from --dry-run
    # shellcheck disable=SC2086
    layers=$("$EMU" --model "$MODEL" --seq "$SEQ" $FLAGS --dry-run 2>&1 | sed -nE 's/^model .*, layers ([0-9]+),.*/\1/p' | head -1)
    [ -n "$layers" ] || { echo "error: make predict: cannot read the model's layers from --dry-run" >&2; exit 2; }
fi
# the run's memory line (the last run's; per rank, as the trainer itself computes it) against the device
if [ -n "${mem:-}" ] && [ -z "$RUN_LAYERS" ]; then
    mib=$(awk '{for (i = 1; i <= NF; i++) if ($i == "MiB," || $i == "MiB") s += $(i - 1)} END {print s + 0}' <<<"${mem//(*/}")
    verdict=$(awk -v m="$mib" -v g="$mem_gib" 'BEGIN {print (m / 1024 <= g * 0.93) ? "fits" : "DOES NOT FIT"}')
    echo "memory: ${mem%% (*} = $(awk -v m="$mib" 'BEGIN {printf "%.1f", m / 1024}') GiB per rank: $verdict in $mem_gib GB ($DEVICE, 7% kept for the CUDA context and NCCL)"
fi
args=(--device "$DEVICE" --flops-per-token "$fpt" --tokens $((BATCH * SEQ * NP)) --ranks "$NP")
[ -n "${TRACE:-}" ] && args+=(--trace "$TRACE")
[ -n "${JSON:-}" ] && args+=(--json)
if [ "${#logs[@]}" = 2 ]; then
    echo "make predict: $MODEL ($layers layers) extrapolated from ${runs[0]} and ${runs[1]} layers; FLOPs/token $fpt (the trainer's mfu: line)" >&2
    $PY dev/predict/predict.py "${logs[@]}" --layers "${runs[0]},${runs[1]}" --target-layers "$layers" "${args[@]}"
else
    echo "make predict: $MODEL ($layers layers) as run; FLOPs/token $fpt (the trainer's mfu: line)" >&2
    $PY dev/predict/predict.py "${logs[0]}" "${args[@]}"
fi
