#!/usr/bin/env bash
# bench_gpu.sh — the GPU benchmarks of the fast training step in one command (`make bench-gpu`), each
# against its target:
#   1. attention, causal, at DBRX-132B's shape (B 8, H 48, KV 8, T 4096, hd 128): the flash kernels
#      (dev/cuda/attention -f 4 -g 2: the model's). FlashAttention-2 publishes ~330-350 TFLOP/s forward on an H100;
#      targets >= 300 forward, >= 220 backward (FLOPs: 4 B H hd T(T+1)/2 forward, 2.5x that backward).
#      Beside them the wgmma forward (dev/cuda/attention_wgmma: Hopper's warpgroup MMA, not in the product yet)
#      and the model's forward timed again in the same program, at the same shape; the same for the wgmma
#      backward (dev/cuda/attention_wgmma_bwd, beside bwd5 and the model's dq + dk/dv pair).
#   2. expert GEMMs at DBRX-132B's shapes (2048 tokens per expert, d 6144, F 10752) through the model's
#      expert path, against one dense cuBLASLt GEMM of the same total size: target >= 70%.
#   3. memory-bound kernels (LayerNorm, the MoE data movement, embedding, classifier, AdamW): GB/s
#      against the device's HBM peak: target >= 70%.
#   4. end to end: dbrx-1b on one GPU, batch 8 x 2048, BF16 (and FP8 delayed scaling): the median MFU of
#      the last 10 of 30 steps, by the convention train_dbrx prints (matmul FLOPs only, causal
#      attention: 6 N_matmul + 6 L d (S+1) per token); target >= 35% BF16. At the balanced routing the step-time model
#      prices (DBRX_DEBUG_ROUTE_BALANCED=1: every expert N k / E rows): dbrx-1b's router on the default data collapses
#      from step 1 (4 experts take every token), whose 16384-row expert GEMMs would flatter the step.
#   5. with more than one GPU: the all-to-all(v) bus bandwidth of dev/comm_bench (nccl-tests' convention),
#      and dbrx-1b with ZeRO-3 over every GPU, expert parallelism over all of them (at most 16) against none.
#   6. the step-time model's calibration: the BF16 step of 4. as --profile measured it against make predict's
#      timeline of the same configuration, per range class (dev/predict/calibrate.py); then kernel by kernel: a
#      short run with --profile-kernels (every launch and GEMM its own pair of events) against the same timeline
#      (calibrate.py --kernels, the 40 largest).
#   7. the step's own GEMMs (4.'s configuration, BF16, --fp8 delayed and block: every distinct cuBLASLt shape,
#      predict.py --gemm-shapes) timed one by one (dev/cuda/matmul -s) against the rate table; writes the measured
#      table dev/predict/gemm_measured_<device>.json, which make predict then uses for this device (commit it).
# The tables are appended to dev/bench/results_gpu.md with the GPU's name, the date and the commit;
# the raw output of every command goes to dev/bench/gpu_runs/ (ignored by git).
#   make bench-gpu                      (needs: nvcc, a GPU, make data)
#   bash dev/bench/bench_gpu.sh --emulated
#       runs every command of the benchmark at a tiny shape on the SIMT emulator's builds (no timings):
#       the test suite uses it so that the benchmark's commands and flags stay valid without a GPU.
#   bash dev/bench/bench_gpu.sh --quick
#       the sanity pass of make test-gpu (dev/test_gpu.sh): every single-GPU benchmark, end to end at 12
#       steps instead of 30, no multi-GPU part; the table is printed, not appended to results_gpu.md, and
#       the exit status is 1 if a command failed (a missed target is not a failure).
set -uo pipefail
cd "$(dirname "$0")/../.."
EMU=0; QUICK=0
case "${1:-}" in --emulated) EMU=1 ;; --quick) QUICK=1 ;; "") ;; *) echo "bench-gpu: unknown option '$1' (--emulated or --quick)" >&2; exit 2 ;; esac
fail() { echo "bench-gpu: $*" >&2; exit 1; }
if [ "$EMU" = 0 ]; then
    command -v nvidia-smi > /dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU 0" \
        || fail "no GPU here (nvidia-smi lists none): nothing measured; run it on a GPU node"
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); ngpu=$(nvidia-smi -L | grep -c "^GPU ")
    sfx=""; train=./train_dbrx; out=dev/bench/results_gpu.md; raw=dev/bench/gpu_runs
    [ "$QUICK" = 1 ] && { out=$(mktemp); raw=$(mktemp -d); ngpu=1; }
else
    gpu="SIMT emulator (validation of the commands only)"; ngpu=1
    sfx=_emu; train=./train_dbrx_emu; out=$(mktemp); raw=$(mktemp -d)
fi
mkdir -p "$raw"
for b in attention attention_wgmma attention_wgmma_bwd attention_doc moe_grouped moe_wgrad moe_fp8_grouped layernorm moe embedding classifier adamw matmul; do
    [ -x "dev/cuda/$b$sfx" ] || fail "dev/cuda/$b$sfx is not built (make dev/cuda/$b$sfx)"
done
[ -x "$train" ] || fail "$train is not built"
[ -f data/sotu/sotu_val_000000.bin ] || fail "no dataset: run make data"

# runs a command, keeping its output in $raw/NAME.txt; a failure is reported and the run goes on
bench() {  # name, command...
    local name=$1; shift
    if ! "$@" > "$raw/$name.txt" 2>&1; then echo "| $name | FAILED (exit $?): $(grep -m1 -iE 'error|fail' "$raw/$name.txt") | | |"; return 1; fi
}
# "| what | value | target | ok? |" rows from the lines of a dev/cuda output that carry UNIT (TFLOP/s or GB/s)
rows() {  # file, unit, target (percent of the peak, or an absolute TFLOP/s with abs:N), filter regex
    awk -v unit="$2" -v target="$3" -v filt="$4" '
        $0 ~ filt && index($0, unit) {
            n = split($0, f, /  +/); name = f[2]
            for (i = 1; i <= NF; i++) if ($i == unit) { val = $(i - 1) }
            match($0, /[0-9.]+% of/); pct = substr($0, RSTART, RLENGTH - 3)
            if (target ~ /^abs:/) { t = substr(target, 5); ok = (val + 0 >= t + 0) ? "yes" : "no"; tgt = ">= " t " " unit }
            else { ok = (pct + 0 >= target + 0) ? "yes" : "no"; tgt = ">= " target "%" }
            printf "| %s | %s %s (%s) | %s | %s |\n", name, val, unit, pct, tgt, ok
        }' "$1"
}
median_mfu() {  # jsonl -> "mfu% tok/s ms" over the last 10 steps
    /usr/bin/python3 -c "
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"mfu\"' in l][-10:]
if not r: sys.exit(1)
print('%.1f %.0f %.1f' % (100 * statistics.median(x['mfu'] for x in r), statistics.median(x['tok_per_s'] for x in r), statistics.median(x['ms'] for x in r)))" "$1"
}

if [ "$EMU" = 0 ]; then
    ATT=(-f 4 -g 2 -b 8 -t 4096 -h 48 -k 8 -d 128); WGA=(-b 8 -t 4096 -h 48 -k 8 -d 128); E2E=(--model dbrx-1b --batch 8 --seq 2048 --steps 30 --warmup 5); PSTEPS=21:22
    [ "$QUICK" = 1 ] && { E2E=(--model dbrx-1b --batch 8 --seq 2048 --steps 12 --warmup 2); PSTEPS=9:10; }
else   # the same flags at a shape the emulator runs in seconds
    ATT=(-f 4 -g 2 -b 1 -t 40 -h 4 -k 2 -d 128); WGA=(-b 1 -t 40 -h 4 -k 2 -d 128); E2E=(--model dbrx-tiny --batch 2 --seq 32 --steps 2 --warmup 1); PSTEPS=2:2
fi
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
echo; echo "## $(date -u +%Y-%m-%d) — $gpu (commit $rev), make bench-gpu"; echo
echo "| benchmark | measured | target | met |"; echo "|---|---|---|---|"
# 1. attention
if bench attention "dev/cuda/attention$sfx" "${ATT[@]}"; then
    rows "$raw/attention.txt" TFLOP/s abs:300 "forward v4"
    rows "$raw/attention.txt" TFLOP/s abs:220 "backward v2"
fi
# (a time limit in case it hangs; a wrong result fails it before any timing)
if bench attention_wgmma timeout 600 "dev/cuda/attention_wgmma$sfx" "${WGA[@]}"; then
    rows "$raw/attention_wgmma.txt" TFLOP/s abs:300 "forward"
fi
if bench attention_wgmma_bwd timeout 600 "dev/cuda/attention_wgmma_bwd$sfx" "${WGA[@]}"; then
    rows "$raw/attention_wgmma_bwd.txt" TFLOP/s abs:220 "backward"
fi
# v3 (the pair on wgmma) beside the model's pair at dbrx-1b's attention shape (the emulator: WGA's)
W1=(-v 3 -b 8 -t 2048 -h 8 -k 2 -d 128); [ "$EMU" = 0 ] || W1=(-v 3 "${WGA[@]}")
if bench attention_wgmma_bwd_1b timeout 600 "dev/cuda/attention_wgmma_bwd$sfx" "${W1[@]}"; then
    rows "$raw/attention_wgmma_bwd_1b.txt" TFLOP/s abs:220 "backward" | sed 's/^| \([^|]*[^ |]\) *|/| \1, dbrx-1b |/'
fi
# --doc-mask at dbrx-1b's attention shape, documents of 512 tokens (the attended FLOPs 25.0% of the causal ones: the kernels skip
# the tiles outside the documents): the attended FLOPs' rate, and the masked / causal time (the emulator: validation only)
DOC=(-b 8 -t 2048 -h 8 -k 2 -d 128 -l 512); [ "$EMU" = 0 ] || DOC=(-b 1 -t 130 -h 4 -k 2 -d 128 -l 40)
if bench attention_doc timeout 300 "dev/cuda/attention_doc$sfx" "${DOC[@]}"; then
    rows "$raw/attention_doc.txt" TFLOP/s 0 "documents" | sed 's/^| \([^|]*[^ |]\) *|/| \1, --doc-mask 512 |/'
fi
# 2. expert GEMMs against the dense GEMM of the same total size
if bench expert_gemm "dev/cuda/matmul$sfx" -x; then
    rows "$raw/expert_gemm.txt" TFLOP/s 0 "experts|dense"
    awk '/of the dense GEMM/ { for (i = 1; i <= NF; i++) if ($i ~ /%$/) p = $i; sub("%", "", p);
         printf "| expert GEMMs / dense | %s%% | >= 70%% | %s |\n", p, (p + 0 >= 70 ? "yes" : "no") }' "$raw/expert_gemm.txt"
fi
# dbrx-1b's expert GEMMs as the model runs them (a GEMM per expert, one stream), on 2 and 4 streams, and batched (the
# bound of a grouped GEMM of cuBLASLt's quality): what the per-expert launches leave of the GPU
if bench expert_streams "dev/cuda/matmul$sfx" -b; then
    rows "$raw/expert_streams.txt" TFLOP/s 0 "per expert|batched"
fi
# the grouped expert GEMMs on wgmma (model/moe_grouped.cuh) against today's per-expert path, at dbrx-1b and at a
# DBRX-132B slice (a time limit; a wrong result fails it before any timing). Emulated,
# both sizes validate the same small shape (moe_bench_start, dev/cuda/common.h): one checks the -s path
MOE_SIZES=(1b 132b)
[ "$EMU" = 1 ] && MOE_SIZES=(132b)
for s in "${MOE_SIZES[@]}"; do
    if bench moe_grouped_$s timeout 600 "dev/cuda/moe_grouped$sfx" -s $s -v 1-3; then
        rows "$raw/moe_grouped_$s.txt" TFLOP/s 0 "today|warpgroup"
    fi
    # v4 (TMA, mbarriers, a producer warpgroup: model/moe_grouped_tma.cuh) in a run of its own: a hang or a wrong
    # result there costs only its own rows; with the backward's data gradients against today's backward
    if bench moe_grouped_v4_$s timeout 300 "dev/cuda/moe_grouped$sfx" -s $s -v 4; then
        rows "$raw/moe_grouped_v4_$s.txt" TFLOP/s 0 "^ *v4|today: backward"
    fi
done
# the experts' weight gradients as grouped GEMMs (model/moe_grouped_wgrad.cuh: TMA, mbarriers, wgmma) against today's
# per-expert cuBLASLt GEMMs; a time limit, a wrong result fails it before any timing
for s in "${MOE_SIZES[@]}"; do
    if bench moe_wgrad_$s timeout 300 "dev/cuda/moe_wgrad$sfx" -s $s; then
        rows "$raw/moe_wgrad_$s.txt" TFLOP/s 0 "today|grouped"
    fi
done
# the experts' FP8 block-scaled up-projection as one grouped launch (model/moe_grouped_fp8.cuh) against today's
# per-expert cuBLASLt block-scaled GEMMs; a time limit, a wrong result fails it first
for s in "${MOE_SIZES[@]}"; do
    if bench moe_fp8_grouped_$s timeout 300 "dev/cuda/moe_fp8_grouped$sfx" -s $s; then
        rows "$raw/moe_fp8_grouped_$s.txt" TFLOP/s 0 "today|grouped"
    fi
done
# 3. memory-bound kernels
MEMBOUND=(layernorm moe embedding classifier adamw)
[ "$EMU" = 1 ] && MEMBOUND=(layernorm)   # (make test validates every dev/cuda program anyway: one checks the path here)
for b in "${MEMBOUND[@]}"; do
    bench "$b" "dev/cuda/$b$sfx" && rows "$raw/$b.txt" GB/s 70 "."
done
# 4. end to end on one GPU, BF16 and FP8
for prec in off delayed; do
    log="$raw/e2e_fp8_$prec.jsonl"; rm -f "$log"
    prof=(); [ "$prec" = off ] && prof=(--profile "$raw/e2e_profile.json" --profile-steps "$PSTEPS")   # (6. calibration)
    if bench "e2e_fp8_$prec" env DBRX_DEBUG_ROUTE_BALANCED=1 "$train" --device cuda "${E2E[@]}" --fp8 "$prec" --val-every 0 --log "$log" "${prof[@]}"; then
        if read -r mfu toks ms < <(median_mfu "$log"); then
            tgt=">= 35%"; ok=$(/usr/bin/python3 -c "print('yes' if $mfu >= 35 else 'no')"); [ "$prec" = off ] || { tgt="(BF16's target is the bar)"; ok="-"; }
            echo "| ${E2E[1]} end to end, --fp8 $prec | MFU $mfu%, $toks tok/s, $ms ms/step | $tgt | $ok |"
        else echo "| ${E2E[1]} end to end, --fp8 $prec | no step in the log | | |"; fi
    fi
done
grep -m1 "^mfu:" "$raw/e2e_fp8_off.txt" | sed 's/^/\nMFU convention, as train_dbrx prints it: /'
# 6. calibration of the step-time model (dev/predict): the BF16 step above as --profile measured it, against
#    make predict's timeline of the same configuration, range class by range class (dev/predict/calibrate.py)
dev_kind=h100-sxm; case "$gpu" in *H200*) dev_kind=h200 ;; *PCIe*|*PCIE*) dev_kind=h100-pcie ;; esac
if bench predict env MODEL="${E2E[1]}" BATCH="${E2E[3]}" SEQ="${E2E[5]}" NP=1 DEVICE="$dev_kind" TRACE="$raw/e2e_predicted.json" \
        bash dev/predict/make_predict.sh \
   && bench calibrate /usr/bin/python3 dev/predict/calibrate.py "$raw/e2e_profile.json" "$raw/e2e_predicted.json" --markdown; then
    echo; echo "The step-time model against this GPU (${E2E[1]}, batch ${E2E[3]} x ${E2E[5]}, BF16; predicted as $dev_kind by make predict;"
    echo "measured by --profile, steps $PSTEPS; dev/predict/calibrate.py; the ratios correct predict.py's rate table):"; echo
    cat "$raw/calibrate.txt"; echo
    # kernel by kernel: its own short run (the events' host time may slow the traced step; its kernels are what counts)
    kstep=$(( ${E2E[7]} < 6 ? ${E2E[7]} : 6 ))
    if bench e2e_kernels env DBRX_DEBUG_ROUTE_BALANCED=1 "$train" --device cuda "${E2E[@]:0:6}" --steps "$kstep" --warmup 1 --val-every 0 \
            --profile "$raw/e2e_kernels.json" --profile-steps "$kstep" --profile-kernels \
       && bench calibrate_kernels /usr/bin/python3 dev/predict/calibrate.py --kernels "$raw/e2e_kernels.json" "$raw/e2e_predicted.json" --markdown; then
        echo; echo "The same step kernel by kernel (--profile-kernels, step $kstep; calibrate.py --kernels; GEMMs by predict.py's classes):"; echo
        cat "$raw/calibrate_kernels.txt"; echo
    fi
fi
# 7. the step's GEMMs measured one by one (the step-time model's measured GEMM table for this device)
shapes="$raw/gemm_list.txt"; : > "$shapes"
for fl in "" "--fp8 delayed" "--fp8 block"; do   # (BF16; per-tensor FP8, as current scaling's; block-scaled FP8)
    tag=gemm_shapes_${fl##* }; tag=${tag%_}
    bench "$tag" env MODEL="${E2E[1]}" BATCH="${E2E[3]}" SEQ="${E2E[5]}" NP=1 DEVICE="$dev_kind" FLAGS="$fl" \
        GEMM_SHAPES="$raw/$tag.part" bash dev/predict/make_predict.sh && grep -v "^#" "$raw/$tag.part" >> "$shapes"
done
# (a GEMM the steps share, once, at its largest count per step)
awk '{ k = $1; for (i = 2; i <= 13; i++) k = k " " $i; if (!(k in c) || $14 > c[k]) c[k] = $14 } END { for (k in c) print k, c[k] }' \
    "$shapes" > "$shapes.u" && mv "$shapes.u" "$shapes"
if [ -s "$shapes" ] && bench gemm_sweep "dev/cuda/matmul$sfx" -s "$shapes"; then
    if [ "$EMU" = 1 ]; then   # (no times: every listed shape ran and the BF16 ones validated)
        [ "$(grep -c " ms=" "$raw/gemm_sweep.txt")" = "$(wc -l < "$shapes")" ] && ! grep -q FAIL "$raw/gemm_sweep.txt" \
            || echo "| gemm_sweep | FAILED: not every GEMM of $shapes ran and validated | | |"
    else
        # the same GEMMs with L2 not flushed between calls (operands warm, as in the step): the table's cold times were
        # 1.15 x the step's GEMMs (session 45's H100); raw output only, the table stays the cold one
        bench gemm_sweep_warm "dev/cuda/matmul$sfx" -s "$shapes" -w || true
    fi
    # each GEMM with the heuristic's first answers (8; the emulator's twin has 4): would timing them at the first step pay?
    # (its last line: the list's sum at the first answer and at the fastest). Emulated: every candidate ran and validated
    na=8; [ "$EMU" = 1 ] && na=4
    if bench gemm_algos "dev/cuda/matmul$sfx" -s "$shapes" -a "$na" && [ "$EMU" = 1 ]; then
        [ "$(grep -cE " ms=.* candidates=([0-9.]+,){3}[0-9.]+$" "$raw/gemm_algos.txt")" = "$(wc -l < "$shapes")" ] \
            && ! grep -q FAIL "$raw/gemm_algos.txt" || echo "| gemm_algos | FAILED: not every GEMM of $shapes ran its 4 candidates and validated | | |"
    fi
    if [ "$EMU" = 0 ] && bench gemm_fit /usr/bin/python3 dev/predict/calibrate.py --gemms "$raw/gemm_sweep.txt" --device "$dev_kind" --markdown \
            --out "dev/predict/gemm_measured_$dev_kind.json" --source "$gpu, $(date -u +%Y-%m-%d), commit $rev"; then
        echo; echo "The step's GEMMs (${E2E[1]}, batch ${E2E[3]} x ${E2E[5]}; BF16, --fp8 delayed and block) timed one by one by dev/cuda/matmul -s,"
        echo "against the rate table (written to dev/predict/gemm_measured_$dev_kind.json: make predict now uses them on $dev_kind):"; echo
        cat "$raw/gemm_fit.txt"; echo
    fi
fi
# 5. all-to-all over the GPUs of this node, and expert parallelism over them against none (ZeRO-3 over
#    all GPUs in both): the step time, and the tokens each rank's experts received (max/mean)
np=$ngpu; [ "$EMU" = 1 ] && np=2
if [ "$np" -gt 1 ]; then
    ep=$np; [ "$ep" -gt 16 ] && ep=16
    if [ "$EMU" = 0 ]; then
        bench all_to_all bash dev/mpirun.sh -np "$np" ./dev/comm_bench --op all_to_all \
            && { echo; echo "all-to-all(v), $np GPUs:"; echo '```'; cat "$raw/all_to_all.txt"; echo '```'; echo; }
    fi
    for e in 1 "$ep"; do
        log="$raw/ep_$e.jsonl"; rm -f "$log"
        if bench "ep_$e" bash dev/mpirun.sh -np "$np" "$train" --device cuda "${E2E[@]}" --expert-parallel "$e" --val-every 0 --log "$log"; then
            read -r mfu toks ms < <(median_mfu "$log") && echo "| ${E2E[1]}, $np GPUs ZeRO-3, --expert-parallel $e | $ms ms/step, $toks tok/s, MFU $mfu% | EP $ep faster than EP 1 | see the two rows |"
        fi
    done
fi
[ "$EMU" = 1 ] && echo "(emulated: the commands ran and validated; no timings)"
} | tee -a "$out"
if [ "$QUICK" = 1 ]; then   # (make test-gpu reads the table from stdout)
    ! grep -q "FAILED" "$out" && [ -s "$raw/e2e_fp8_off.jsonl" ]; rc=$?
    rm -rf "$out" "$raw"; exit $rc
fi
if [ "$EMU" = 1 ]; then
    # every command ran: no FAILED row, and the end-to-end logs have their steps
    ! grep -q "FAILED" "$out" && [ -s "$raw/e2e_fp8_off.jsonl" ] && [ -s "$raw/e2e_fp8_delayed.jsonl" ] && [ -s "$raw/ep_2.jsonl" ] \
        && grep -q "^| layer N attention | 8 |" "$raw/calibrate.txt" && grep -q "^| adamw_fused_kernel | 1, 1 |" "$raw/calibrate_kernels.txt"; rc=$?
    rm -rf "$out" "$raw"; exit $rc
fi
echo "bench-gpu: appended to $out; raw outputs in $raw/"
