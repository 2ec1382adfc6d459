#!/usr/bin/env bash
# test_eval_only.sh — --eval-only (README, Evaluation without training): the weights of a checkpoint or of a
# Hugging Face export, the validation loss and --eval-mc, printed and logged, exit 0.
#   * a training run (6 steps, validation every 3, a checkpoint at the end) logs its validation loss at
#     step 6; --eval-only --resume of that checkpoint logs the same number, bit for bit (%.17g in the
#     log), on the same backend and ranks: CPU 1 process, CPU ZeRO-3 on 2 ranks, EP 2 (--expert-parallel 2
#     on 2 ranks), the emulated GPU (when built);
#   * an fp32 Hugging Face export of that run (export -> import is exact): --eval-only --init-hf gives the
#     training run's final validation loss, logged at step 0;
#   * --eval-mc: acc and acc_norm logged once; --eval-mc-dump written;
#   * --context-parallel 2: bit-identical to a CP 2 training run's validation, within tolerance of one process's;
#   * bad use: no weights, both sources, nothing to evaluate, with --generate: one line, exit 2.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
BIN=${BIN:-./train_dbrx}
EMU=${EMU:-./train_dbrx_emu}
MPI="bash dev/mpirun.sh"
PY=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
M=(--model dbrx-tiny --n-layers 2 --batch 2 --seq 64 --val-steps 3)
val_at() { sed -nE "s/^\{\"step\": $2, \"val_loss\": ([^}]*)\}$/\1/p" "$1" | tail -1; }

# case NAME LAUNCH... : trains, then evaluates the checkpoint with the same launcher and flags
case_resume() {
    local name=$1; shift
    local d="$tmp/$name"; mkdir -p "$d"
    "$@" "${M[@]}" --steps 6 --val-every 3 --ckpt-dir "$d/ck" --log "$d/train.jsonl" > "$d/train.out" 2>&1 \
        || { fail "$name: training: $(tail -2 "$d/train.out")"; return; }
    "$@" "${M[@]}" --eval-only --resume "$d/ck/step_00000006" --log "$d/eval.jsonl" > "$d/eval.out" 2>&1; local rc=$?
    local want got; want=$(val_at "$d/train.jsonl" 6); got=$(val_at "$d/eval.jsonl" 6)
    [ "$rc" = 0 ] && [ -n "$want" ] && [ "$got" = "$want" ] && grep -q "^val      6 | val_loss" "$d/eval.out" \
        && ! grep -q '"loss"' "$d/eval.jsonl" \
        && pass "$name: --eval-only --resume: val_loss at step 6 $got, bit-identical to the training run's; no step trained" \
        || fail "$name: exit $rc, eval-only val_loss '$got', training's '$want': $(tail -2 "$d/eval.out")"
}
case_resume cpu $BIN --device cpu
case_resume "cpu ZeRO-3 2 ranks" $MPI -np 2 $BIN --device cpu
case_resume "cpu EP 2 (2 ranks)" $MPI -np 2 $BIN --device cpu --expert-parallel 2
if [ -x "$EMU" ]; then case_resume "emulated GPU" $EMU --device cuda
else echo "skipped: --eval-only on the emulated GPU ($EMU not built)"; fi

# context parallelism (--context-parallel 2, 2 ranks: each its two chunks of every sequence, the ring attention): --eval-only
# of a CP 2 run's checkpoint logs that run's validation loss bit for bit (CPU; the emulated GPU when built), and one process's
# checkpoint evaluated at CP 2 gives one process's validation loss within 1e-5 (CPU) / 2e-3 relative (the emulated GPU, BF16)
case_resume "cpu CP 2 (2 ranks)" $MPI -np 2 $BIN --device cpu --context-parallel 2
cp_cross() {  # name, the 1-process case's dir, tolerance (relative), launcher...
    local name=$1 ref=$2 tol=$3; shift 3
    "$@" "${M[@]}" --context-parallel 2 --eval-only --resume "$tmp/$ref/ck/step_00000006" --log "$tmp/$ref/cp2.jsonl" > "$tmp/$ref/cp2.out" 2>&1
    local rc=$? want got; want=$(val_at "$tmp/$ref/train.jsonl" 6); got=$(val_at "$tmp/$ref/cp2.jsonl" 6)
    [ "$rc" = 0 ] && $PY -c "import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)" "${got:-nan}" "${want:-0}" "$tol" \
        && pass "$name: one process's checkpoint, --eval-only at CP 2: val_loss $got, one process's $want (within $tol relative)" \
        || fail "$name: --eval-only at CP 2: exit $rc, val_loss '$got', one process's '$want': $(tail -2 "$tmp/$ref/cp2.out")"
}
cp_cross "cpu" cpu 1e-5 $MPI -np 2 $BIN --device cpu
if [ -x "$EMU" ]; then
    case_resume "emulated GPU CP 2 (2 ranks)" $MPI -np 2 $EMU --device cuda --context-parallel 2
    cp_cross "emulated GPU" "emulated GPU" 2e-3 $MPI -np 2 $EMU --device cuda
fi

# a Hugging Face export (fp32: exact), evaluated with --init-hf; and --eval-mc once, with its dump
d="$tmp/hf"; mkdir -p "$d"
$PY test/gen_mc_eval.py data/sotu/sotu_val_000000.bin "$d/mc.bin" --n 12 > /dev/null || fail "gen_mc_eval.py"
$BIN "${M[@]}" --steps 6 --val-every 3 --export-hf "$d/export" --export-dtype fp32 --log "$d/train.jsonl" > "$d/train.out" 2>&1 \
    || fail "export: $(tail -2 "$d/train.out")"
$BIN "${M[@]}" --eval-only --init-hf "$d/export" --eval-mc "$d/mc.bin" --eval-mc-dump "$d/mc.jsonl" --log "$d/eval.jsonl" > "$d/eval.out" 2>&1; rc=$?
want=$(val_at "$d/train.jsonl" 6); got=$(val_at "$d/eval.jsonl" 0)
[ "$rc" = 0 ] && [ -n "$want" ] && [ "$got" = "$want" ] \
    && pass "--eval-only --init-hf (fp32 export): val_loss $got, the training run's final one, logged at step 0" \
    || fail "--eval-only --init-hf: exit $rc, val_loss '$got', training's '$want': $(tail -2 "$d/eval.out")"
[ "$(grep -c '"mc_acc"' "$d/eval.jsonl")" = 1 ] && grep -q "^mc       0 | acc " "$d/eval.out" && [ "$(grep -c . "$d/mc.jsonl")" = 12 ] \
    && pass "--eval-only --eval-mc: $(grep '^mc ' "$d/eval.out" | cut -d'|' -f2,3 | tr -s ' '), logged once, 12 examples dumped" \
    || fail "--eval-only --eval-mc: $(grep -c '"mc_acc"' "$d/eval.jsonl") mc lines, $(grep -c . "$d/mc.jsonl" 2>/dev/null) dumped"

# bad use: one line, exit 2
expect_exit 2 "--eval-only without weights" $BIN "${M[@]}" --eval-only
expect_exit 2 "--eval-only with both --resume and --init-hf" $BIN "${M[@]}" --eval-only --resume "$tmp/cpu/ck" --init-hf "$d/export"
expect_exit 2 "--eval-only with nothing to evaluate" $BIN "${M[@]}" --eval-only --init-hf "$d/export" --val-data ''
expect_exit 2 "--eval-only with --generate" $BIN "${M[@]}" --eval-only --init-hf "$d/export" --generate
expect_exit 2 "--generate with --context-parallel 2 (CP generation: not yet)" $BIN "${M[@]}" --generate --init-hf "$d/export" --context-parallel 2
grep -q -- "--context-parallel 2 does not support --generate yet" <<<"$LAST_ERR" || fail "--generate with --context-parallel: the message names both"
expect_exit 2 "--eval-only --resume auto, no checkpoint" $BIN "${M[@]}" --eval-only --resume auto --ckpt-dir "$tmp/empty"
