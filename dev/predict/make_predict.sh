#!/usr/bin/env bash
# make_predict.sh — make predict: the predicted GPU step of one configuration (dev/predict/README.md).
#   MODEL (dbrx-1b)  BATCH (8)  SEQ (2048)  NP (1)  DEVICE (h100-sxm | h100-pcie | h200)  FLAGS (more trainer flags,
#   e.g. '--fp8 block' or '--shard-group-size 64 --expert-parallel 8')  TRACE=FILE (the predicted timeline as a Chrome
#   trace)  JSON=1 (the summary as one JSON object)  EMU (./train_dbrx_emu)  GEMM_SHAPES=FILE (the step's distinct GEMMs
#   for dev/cuda/matmul -s: make bench-gpu's measured GEMM table)
#   RUN_LAYERS: empty (default): one run at the model's own layer count. "L1 L2": two runs, every number extrapolated
#   linearly in the layers to the model's count (for hundreds of ranks, whose emulated step is slow on a small machine).
# The run: 2 training steps of the emulated binary with SIMT_SHAPES_ONLY=1 (test/simt/simt.h: every launch, GEMM, copy
# and collective is checked and logged, none is computed; the router's place taken by a balanced routing) and
# SIMT_WORKLOG, and --profile for step 2 (its named ranges go to the work log: TRACE shows them on the predicted
# timeline, as a GPU's --profile trace shows them measured); the predictor takes step 2 of every rank's log (the slowest rank sets the step). Seconds for dbrx-1b at
# 8 x 2048 tokens; a minute or two for hundreds of emulated ranks on 2 cores. The emulated device is made large
# (SIMT_DEVICE_MEMORY) so that a configuration is predicted even where it does not fit; --dry-run's plan of it
# (parallel/memory_plan.h) says whether it does.
set -u
cd "$(dirname "$0")/../.." || exit 1
MODEL=${MODEL:-dbrx-1b} BATCH=${BATCH:-8} SEQ=${SEQ:-2048} NP=${NP:-1} DEVICE=${DEVICE:-h100-sxm}
RUN_LAYERS=${RUN_LAYERS:-} FLAGS=${FLAGS:-} EMU=${EMU:-./train_dbrx_emu} PY=${PYTHON:-/usr/bin/python3}
case "$DEVICE" in h100-sxm|h100-pcie|h200) ;;
    *) echo "error: make predict: DEVICE='$DEVICE' must be h100-sxm, h100-pcie or h200" >&2; exit 2 ;; esac
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || { echo "error: make predict: NP='$NP' must be a positive integer" >&2; exit 2; }
[ -x "$EMU" ] || { echo "error: make predict: $EMU is not built (make train_dbrx_emu)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Open MPI 4.1 with hundreds of ranks on a few cores: mpirun may report a rank "exiting improperly" (PID 0) after every
# rank has finished both steps and called MPI_Finalize (2 of 5 runs of 256 ranks on 2 cores here, both at 4 layers; its daemon, starved, sees
# the exit before the rank's finalize): such a run counts, with a note, when every rank printed its last line ("comm:
# rank R sent ... in 2 training steps", after the steps and before the finalize); predict.py then reads step 2 of
# every rank's work log, whole
finished_improperly() {
    [ "$NP" -gt 1 ] && grep -q "exiting improperly" "$1" || return 1
    local done; done=$(grep -cE "^comm: rank [0-9]+ sent [0-9]+ bytes in 2 training steps" "$1")
    [ "$done" = "$NP" ] || return 1
    echo "note: make predict: mpirun reported a rank exiting improperly after all $NP ranks had finished both steps (Open MPI's finalize under oversubscription): the run counts" >&2
}
runs=(${RUN_LAYERS:-""})
logs=() fpt="" layers=""
for l in "${runs[@]}"; do
    tag=${l:-all}
    echo "make predict: emulating 2 steps of $MODEL${l:+ with $l layer(s)}, batch $BATCH x $SEQ, $NP rank(s), shapes only" >&2
    # shellcheck disable=SC2086
    SIMT_SHAPES_ONLY=1 SIMT_GPUS_PER_NODE=8 SIMT_WORKLOG="$tmp/wl_$tag.jsonl" SIMT_DEVICES=$((NP > 8 ? NP : 8)) SIMT_DEVICE_MEMORY=$((1 << 50)) \
        OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive bash dev/mpirun.sh -np "$NP" "$EMU" --device cuda --model "$MODEL" \
        ${l:+--n-layers $l} --batch "$BATCH" --seq "$SEQ" --steps 2 --val-every 0 --comm-timeout 1e6 --profile "$tmp/prof_$tag.json" --profile-steps 2:2 $FLAGS > "$tmp/run_$tag.txt" 2>&1 \
        || finished_improperly "$tmp/run_$tag.txt" \
        || { echo "error: make predict: the emulated run failed:" >&2; grep -v '^ *$' "$tmp/run_$tag.txt" | grep -iv "^step\|^-*$" | tail -6 >&2; exit 1; }
    [ -n "$fpt" ] || fpt=$(sed -nE 's/^mfu: ([0-9.e+]+) FLOPs\/token.*/\1/p' "$tmp/run_$tag.txt" | head -1)
    [ -z "$l" ] && layers=$(sed -nE 's/^model .*, layers ([0-9]+),.*/\1/p' "$tmp/run_$tag.txt" | head -1)
    logs+=("$tmp/wl_$tag.jsonl")
done
[ -n "$fpt" ] || { echo "error: make predict: the run printed no 'mfu:' line (FLOPs per token)" >&2; exit 1; }
if [ -n "$RUN_LAYERS" ]; then   # the model's own layer count and FLOPs per token (the MFU count), from --dry-run
    # shellcheck disable=SC2086
    dry=$("$EMU" --model "$MODEL" --seq "$SEQ" $FLAGS --dry-run 2>&1)
    layers=$(sed -nE 's/^model .*, layers ([0-9]+),.*/\1/p' <<<"$dry" | head -1)
    fpt=$(sed -nE 's/^training FLOPs per token \(S = [0-9]+\): ([0-9.e+]+) .*/\1/p' <<<"$dry" | head -1)
    [ -n "$layers" ] && [ -n "$fpt" ] || { echo "error: make predict: cannot read the model's layers / FLOPs per token from --dry-run" >&2; exit 2; }
fi
# the memory per GPU: --dry-run's plan (parallel/memory_plan.h) of this configuration on this device
plan_dev=h100; [ "$DEVICE" = h200 ] && plan_dev=h200
# shellcheck disable=SC2086
plan=$("$EMU" --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --plan-gpus "$NP" --plan-device "$plan_dev" $FLAGS --dry-run 2>&1)
total=$(grep -m1 "^  total " <<<"$plan" | sed -E 's/^  total ([0-9.]+ GiB of [0-9.]+ GiB).*/\1/')
verdict=$(grep -m1 "^verdict: " <<<"$plan" | sed -E 's/^verdict: ([^(]*).*/\1/; s/ *$//')
[ -n "$total" ] && echo "memory (--dry-run's plan per GPU): $total: $verdict"
accum=$(sed -nE 's/.*--grad-accum[ =]([0-9]+).*/\1/p' <<<"$FLAGS"); accum=${accum:-1}
# one sequence is split over a context-parallel group: NP ranks train NP / CP sequences
cp=$(sed -nE 's/.*--context-parallel[ =]([0-9]+).*/\1/p' <<<"$FLAGS"); cp=${cp:-1}
args=(--device "$DEVICE" --flops-per-token "$fpt" --tokens $((BATCH * SEQ * NP * accum / cp)) --ranks "$NP")
[ -n "${TRACE:-}" ] && args+=(--trace "$TRACE")
[ -n "${JSON:-}" ] && args+=(--json)
[ -n "${GEMM_SHAPES:-}" ] && args+=(--gemm-shapes "$GEMM_SHAPES")
if [ "${#logs[@]}" = 2 ]; then
    echo "make predict: $MODEL ($layers layers) extrapolated from ${runs[0]} and ${runs[1]} layers; FLOPs/token $fpt (--dry-run)" >&2
    $PY dev/predict/predict.py "${logs[@]}" --layers "${runs[0]},${runs[1]}" --target-layers "$layers" "${args[@]}"
else
    echo "make predict: $MODEL ($layers layers) as run; FLOPs/token $fpt (the trainer's mfu: line)" >&2
    $PY dev/predict/predict.py "${logs[0]}" "${args[@]}"
fi
