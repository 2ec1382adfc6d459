#!/usr/bin/env bash
# make_predict.sh — make predict: the predicted GPU step of one configuration (dev/predict/README.md).
#   MODEL (dbrx-1b)  BATCH (1)  SEQ (256)  NP (1)  DEVICE (h100-sxm | h100-pcie | h200)
#   RUN_LAYERS ("1 2"): the emulated runs' layer counts; the prediction is extrapolated linearly in the layers to
#                the model's own count (LAYERS, default the preset's, read from --dry-run). One value: no
#                extrapolation (that run's layer count is the prediction's).
#   FLAGS: more trainer flags (e.g. --fp8 delayed); TRACE=FILE: the predicted timeline (the last run's) as a
#   Chrome trace; EMU: the emulated binary (./train_dbrx_emu)
# Each run is 2 training steps of the emulated binary with SIMT_WORKLOG (rank 0's log under mpirun); the predictor
# takes step 2 (steady state: no GEMM plan is made in it). An emulated step of dbrx-1b takes minutes: the runs set
# --comm-timeout 1e6 (the watchdog's 60 s after step 1 would end them).
set -u
cd "$(dirname "$0")/../.." || exit 1
MODEL=${MODEL:-dbrx-1b} BATCH=${BATCH:-1} SEQ=${SEQ:-256} NP=${NP:-1} DEVICE=${DEVICE:-h100-sxm}
RUN_LAYERS=${RUN_LAYERS:-1 2} FLAGS=${FLAGS:-} EMU=${EMU:-./train_dbrx_emu} PY=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
set -- $RUN_LAYERS
[ $# = 1 ] && LAYERS=$1   # one run: its own layer count (no extrapolation)
# the model's layers and FLOPs per token (the MFU count), as --dry-run prints them
# shellcheck disable=SC2086
dry=$("$EMU" --model "$MODEL" --seq "$SEQ" ${LAYERS:+--n-layers $LAYERS} $FLAGS --dry-run 2>&1) \
    || { echo "error: make predict: --dry-run failed: $(tail -1 <<<"$dry")"; exit 2; }
fpt=$(sed -nE 's/^training FLOPs per token \(S = [0-9]+\): ([0-9.e+]+) .*/\1/p' <<<"$dry")
layers=$(sed -nE 's/^model .*, layers ([0-9]+),.*/\1/p' <<<"$dry" | head -1)
[ -n "$fpt" ] && [ -n "$layers" ] || { echo "error: make predict: cannot read the FLOPs per token / the layers from --dry-run"; exit 2; }
logs=() ran=()
for l in $RUN_LAYERS; do
    echo "make predict: emulating 2 steps of $MODEL with $l layer(s), batch $BATCH x $SEQ, $NP rank(s) (slow: the GPU's work on the CPU)"
    # shellcheck disable=SC2086
    SIMT_WORKLOG="$tmp/wl_$l.jsonl" OMP_WAIT_POLICY=passive bash dev/mpirun.sh -np "$NP" "$EMU" --device cuda --model "$MODEL" \
        --n-layers "$l" --batch "$BATCH" --seq "$SEQ" --steps 2 --val-every 0 --comm-timeout 1e6 $FLAGS > "$tmp/run_$l.txt" 2>&1 \
        || { echo "error: make predict: the emulated run failed:"; grep -v '^ *$' "$tmp/run_$l.txt" | grep -iv "^step\|^-*$" | tail -6; exit 1; }
    f="$tmp/wl_$l.jsonl"; [ "$NP" -gt 1 ] && f="$f.0"
    logs+=("$f"); ran+=("$l")
done
args=(--device "$DEVICE" --flops-per-token "$fpt" --tokens $((BATCH * SEQ * NP)) --ranks "$NP")
[ -n "${TRACE:-}" ] && args+=(--trace "$TRACE")
if [ "${#logs[@]}" = 2 ]; then
    echo "make predict: $MODEL ($layers layers) extrapolated from ${ran[0]} and ${ran[1]} layers; FLOPs/token $fpt (--dry-run)"
    $PY dev/predict/predict.py "${logs[@]}" --layers "${ran[0]},${ran[1]}" --target-layers "$layers" "${args[@]}"
else
    echo "make predict: $MODEL with ${ran[0]} layer(s), as run (no extrapolation); FLOPs/token $fpt (--dry-run)"
    $PY dev/predict/predict.py "${logs[0]}" "${args[@]}"
fi
