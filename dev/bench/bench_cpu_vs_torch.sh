#!/usr/bin/env bash
# bench_cpu_vs_torch.sh — tokens/s of one full training step (forward, backward, AdamW) of the CPU
# backend (dev/bench/bench_step.cpp) against a PyTorch implementation of the same model
# (dev/bench/torch_step.py), same config, same threads, runs interleaved (train_dbrx, pytorch,
# train_dbrx, pytorch, ...); the best run of each counts. Prints
#   train_dbrx <x> tok/s, pytorch <y> tok/s, ratio <x/y>
# and writes the same numbers to dev/bench/results_cpu_step.md (overwritten each run).
#
# Environment (defaults in brackets):
#   THREADS [nproc]             OMP_NUM_THREADS for both, and torch.set_num_threads
#   OPENBLAS_THREADS [THREADS]  OPENBLAS_NUM_THREADS for both (Debian's OpenBLAS is the pthreads build:
#                               its threads and the OpenMP threads share the cores; see the results file)
#   MODEL [dbrx-tiny] BATCH [8] SEQ [256] STEPS [10] WARMUP [2] ROUNDS [2] PYTHON [/usr/bin/python3]
#   IDLE_WAIT [120]             seconds to wait, before each run, for other processes to leave the CPUs
#
#   bash dev/bench/bench_cpu_vs_torch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

THREADS=${THREADS:-$(nproc)}
OPENBLAS_THREADS=${OPENBLAS_THREADS:-$THREADS}
MODEL=${MODEL:-dbrx-tiny}
BATCH=${BATCH:-8}
SEQ=${SEQ:-256}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
PYTHON=${PYTHON:-/usr/bin/python3}
IDLE_WAIT=${IDLE_WAIT:-120}
BIN=dev/bench/bench_step
OUT_MD=dev/bench/results_cpu_step.md

for v in THREADS OPENBLAS_THREADS BATCH SEQ STEPS ROUNDS IDLE_WAIT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $WARMUP =~ ^[0-9]+$ ]] || { echo "error: WARMUP must be an integer >= 0, got '$WARMUP'" >&2; exit 2; }
command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON not found" >&2; exit 1; }

# build bench_step when missing or older than its sources
if [[ ! -x $BIN || -n $(find dev/bench/bench_step.cpp model -newer "$BIN" \( -name '*.cpp' -o -name '*.h' -o -name '*.cuh' \) 2>/dev/null) ]]; then
    echo "building $BIN"
    g++ -std=c++17 -O3 -march=native -fopenmp -Wall -Wextra -Werror -o "$BIN" dev/bench/bench_step.cpp -lopenblas -lm
fi

TORCH_MODEL_FLAGS=$("$BIN" --model "$MODEL" --torch-flags)   # the preset, from model/config.h
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$OPENBLAS_THREADS
LOGDIR=$(mktemp -d)
trap 'rm -rf "$LOGDIR"' EXIT

# Busy share (%) of all CPUs over half a second, from /proc/stat.
cpu_busy() {
    local a b
    read -r -a a < <(head -1 /proc/stat)
    sleep 0.5
    read -r -a b < <(head -1 /proc/stat)
    local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
    for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
    echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
# Waits up to IDLE_WAIT s for the CPUs to be idle (< 10% busy); records a note when they were not.
NOTES=()
wait_idle() {
    local waited=0 busy
    busy=$(cpu_busy)
    while (( busy >= 10 && waited < IDLE_WAIT )); do sleep 2; waited=$((waited + 2)); busy=$(cpu_busy); done
    if (( busy >= 10 )); then
        echo "warning: CPUs ${busy}% busy with other work before the $1 run: its numbers are not clean" >&2
        NOTES+=("the CPUs were ${busy}% busy with other processes before a $1 run")
    fi
}

run_one() {   # $1 = impl, $2 = round; sets RES_TPS, RES_MS
    local log=$LOGDIR/$1.$2.log
    wait_idle "$1"
    if [[ $1 == train_dbrx ]]; then
        "$BIN" --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup-steps "$WARMUP" >"$log" 2>&1 \
            || { cat "$log" >&2; echo "error: bench_step failed" >&2; exit 1; }
    else
        # shellcheck disable=SC2086
        "$PYTHON" dev/bench/torch_step.py $TORCH_MODEL_FLAGS --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" \
            --warmup-steps "$WARMUP" --threads "$THREADS" >"$log" 2>&1 \
            || { cat "$log" >&2; echo "error: torch_step.py failed" >&2; exit 1; }
    fi
    local line
    line=$(grep '^RESULT ' "$log" | tail -1)
    [[ -n $line ]] || { cat "$log" >&2; echo "error: no RESULT line from $1" >&2; exit 1; }
    echo "  round $2: $line ($(grep '^median' "$log" | sed 's/^median of [0-9]* steps: //'))"
    RES_TPS=$(sed -E 's/.*tok_per_s=([0-9.]+).*/\1/' <<<"$line")
    RES_MS=$(sed -E 's/.*ms_per_step=([0-9.]+).*/\1/' <<<"$line")
}

echo "model $MODEL, batch $BATCH x seq $SEQ, $STEPS timed + $WARMUP warmup steps, OMP_NUM_THREADS=$THREADS," \
     "OPENBLAS_NUM_THREADS=$OPENBLAS_THREADS, $ROUNDS round(s)"
best_c=0 best_c_ms=0 best_t=0 best_t_ms=0
ROWS=()
for r in $(seq 1 "$ROUNDS"); do
    for impl in train_dbrx pytorch; do
        run_one "$impl" "$r"
        tps=$RES_TPS ms=$RES_MS
        ROWS+=("| $r | $impl | $tps | $ms |")
        if [[ $impl == train_dbrx ]]; then
            if awk -v a="$tps" -v b="$best_c" 'BEGIN { exit !(a > b) }'; then best_c=$tps; best_c_ms=$ms; fi
        else
            if awk -v a="$tps" -v b="$best_t" 'BEGIN { exit !(a > b) }'; then best_t=$tps; best_t_ms=$ms; fi
        fi
    done
done
ratio=$(awk -v a="$best_c" -v b="$best_t" 'BEGIN { printf "%.3f", a / b }')
summary="train_dbrx $best_c tok/s, pytorch $best_t tok/s, ratio $ratio"
echo "$summary"

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
{
    echo "# CPU training step: train_dbrx CPU backend vs PyTorch"
    echo
    echo "Written by \`dev/bench/bench_cpu_vs_torch.sh\` (overwritten each run). One step = zero_grad + forward +"
    echo "backward + global-norm clip + AdamW; random tokens; median over $STEPS timed steps after $WARMUP warmup steps;"
    echo "runs interleaved, best of $ROUNDS per implementation."
    echo
    echo "| field | value |"
    echo "|---|---|"
    echo "| date | $(date -u '+%Y-%m-%d %H:%M UTC') |"
    echo "| CPU | $cpu ($(nproc) CPUs visible) |"
    echo "| threads | OMP_NUM_THREADS=$THREADS, OPENBLAS_NUM_THREADS=$OPENBLAS_THREADS, torch.set_num_threads($THREADS) |"
    echo "| config | $MODEL: $TORCH_MODEL_FLAGS; batch $BATCH x seq $SEQ = $((BATCH * SEQ)) tokens/step |"
    echo "| PyTorch | $torch_version (float32) |"
    echo "| **train_dbrx** | **$best_c tok/s** ($best_c_ms ms/step) |"
    echo "| **pytorch** | **$best_t tok/s** ($best_t_ms ms/step) |"
    echo "| **ratio train_dbrx / pytorch** | **$ratio** |"
    echo
    echo "All runs:"
    echo
    echo "| round | impl | tok/s | ms/step |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    if (( THREADS > 1 && OPENBLAS_THREADS > 1 )); then
        echo
        echo "Note: Debian's OpenBLAS is the pthreads build. Both programs run OpenMP threads *and* OpenBLAS threads"
        echo "here, and the two pools spin-wait on the same cores, so these numbers are contention-bound and vary a"
        echo "lot from run to run. \`OPENBLAS_THREADS=1\` (single-threaded GEMMs, OpenMP for the rest) was 2-5x"
        echo "faster for both on the 2-core machine this was written on."
    fi
    if (( ${#NOTES[@]} )); then
        echo
        echo "Caution:"
        printf -- '- %s\n' "${NOTES[@]}"
    fi
} >"$OUT_MD"
echo "wrote $OUT_MD"
