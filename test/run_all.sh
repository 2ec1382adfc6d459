#!/usr/bin/env bash
# run_all.sh — the whole test suite (make test): unit tests, the finite-difference gradient check,
# PyTorch parity, the command line and bad input, the data loader and tools, end-to-end training,
# sharded training (ZeRO-3/HSDP), checkpoints, and the builds (the CUDA build with nvcc for sm_90a
# when nvcc is present). Ends with one line "N passed, M failed".
cd "$(dirname "$0")/.." || exit 1
export RESULTS; RESULTS=$(mktemp)
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}

# doctest binaries: every test case counts (arguments after the binary go to it)
doctest_run() {
    local out; out=$("$@" 2>&1); local rc=$?
    echo "$out" | grep -E "^\[doctest\] (test cases|assertions)|ERROR" | sed "s|^|   $1: |"
    local p f; p=$(echo "$out" | sed -nE 's/^\[doctest\] test cases: *[0-9]+ \| *([0-9]+) passed \| *([0-9]+) failed.*/\1/p')
    f=$(echo "$out" | sed -nE 's/^\[doctest\] test cases: *[0-9]+ \| *([0-9]+) passed \| *([0-9]+) failed.*/\2/p')
    for _ in $(seq 1 "${p:-0}"); do echo pass >> "$RESULTS"; done
    for _ in $(seq 1 "${f:-0}"); do echo fail >> "$RESULTS"; done
    [ "$rc" = 0 ] && [ -n "$p" ] || { [ "${f:-0}" != 0 ] || fail "$1 exited $rc"; }
}
# Sections run three at a time (TEST_JOBS, default 3 on CI's 2 cores: a section waiting on a watchdog, a timeout or
# yielding MPI ranks leaves a core idle that a third one takes; two at a time left ~15% of the CPU idle), each one's
# output collected and printed whole,
# in the order below, with its time; the checks that time a failure (hangs, kills, signals, watchdogs, time limits)
# run at the end, two at a time (tail_section: each has a core of its own), as does anything that must come first.
JOBS=${TEST_JOBS:-3}
secdir=$(mktemp -d); nsec=0; nprinted=0
# idle OpenMP threads wait passively: two sections share the cores, and spinning threads would steal them
export OMP_WAIT_POLICY=passive
flush() {   # the finished sections, in order
    while [ "$nprinted" -lt "$nsec" ] && [ -e "$secdir/$nprinted.done" ]; do cat "$secdir/$nprinted"; nprinted=$((nprinted + 1)); done
}
lanes_below() {   # wait until fewer than $1 sections run
    while [ "$(jobs -rp | wc -l)" -ge "$1" ]; do wait -n; flush; done
    flush
}
children_cpu() {   # FILE: the CPU seconds (user + system) of this shell's finished children so far, from the builtin
    times > "$1"      # (run here, not in a $(...) subshell, whose children would be its own)
}
cpu_of() { awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%.0f", t }' "$1"; }
section() {   # TITLE CMD...: in the background (at most JOBS at once)
    local title=$1; shift
    lanes_below "$JOBS"
    local sec_out="$secdir/$nsec"   # (a name no section's function sets: they run in this shell's scope)
    ( { echo "== $title"; sec_t0=$SECONDS; "$@"; children_cpu "$sec_out.cpu"; echo "   ($((SECONDS - sec_t0)) s, $(cpu_of "$sec_out.cpu") s of CPU)"; } > "$sec_out" 2>&1 < /dev/null; touch "$sec_out.done" ) &
    nsec=$((nsec + 1))
}
finish_sections() {   # after the last: a section whose shell died (killed, out of memory) printed as far as it got, and failed
    local i title
    lanes_below 1
    for ((i = nprinted; i < nsec; i++)); do
        cat "$secdir/$i" 2>/dev/null
        if [ ! -e "$secdir/$i.done" ]; then
            title=$(head -1 "$secdir/$i" 2>/dev/null); fail "section ${title#== } did not finish (its shell was killed)"
        fi
    done
    nprinted=$nsec
}
# Ctrl-C or a kill of the suite: the running sections with it, and what they printed so far
trap 'trap - INT TERM; kill $(jobs -p) 2>/dev/null; wait; for ((i = nprinted; i < nsec; i++)); do cat "$secdir/$i" 2>/dev/null; done; rm -rf "$secdir"; exit 130' INT TERM
tail_section() {   # TITLE CMD...: once every section before the tail is done, two at a time (a core each: the checks
    # that time a failure ran alone until session 48, the other core idle ~2 minutes; beside one another they
    # passed as alone)
    if [ "$JOBS" != 2 ]; then finish_sections; JOBS=2; fi
    section "$@"
}

echo "== dataset (the default one: several tests train on it)"
[ -f data/sotu/sotu_val_000000.bin ] || bash dev/data/prepare_sotu.sh || fail "make data"
# the longest sections first (about 100-250 CPU-seconds each): started last, they ran on alone at the end, the
# second core idle
if [ -n "${HAVE_CUDA_HEADERS:-}" ]; then
    # (their kill and hang checks, and test_zero.sh's and test_ckpt.sh's, allow a minute for what takes seconds:
    # they hold beside another section (test_zero_gpu.sh's passed at a load average of ~500))
    section "the CUDA path on several ranks: ZeRO-3/HSDP/DDP on the device over NCCL (the NCCL twin), checkpoints, interop, failures" \
        bash test/test_zero_gpu.sh
fi
section "expert parallelism (all-to-all of routed tokens; CPU and emulated GPU; checkpoints across EP degrees)" bash test/test_ep.sh
section "checkpoints: resume, reshard, damage, crashes, signals, Hugging Face" bash test/test_ckpt.sh
if [ -n "${HAVE_CUDA_HEADERS:-}" ]; then
    section "the store's chunked experts (--zero-chunk-mib): bit-identical to the units whole, the working set the plan's, a negative control" \
        bash test/test_zero_chunks.sh
fi
section "ZeRO-3 / HSDP / data parallel over MPI" bash test/test_zero.sh
layout() { local f; f=$(mktemp); { $PY test/check_layout.py; $PY test/check_layout.py --planted; } > "$f" 2>&1; verdicts "$f" 7; rm -f "$f"; }
section "the house rules (test/check_layout.py): includes, model/ free of parallelism, no getenv in the step, sizes" layout
section "set-up: make deps / make deps-test package lists against the build's and scripts' messages" bash test/test_deps.sh
section "unit tests (CPU reference ops)" doctest_run ./test/test_ops
section "finite-difference gradient check (double precision)" doctest_run ./test/test_gradcheck
section "checkpoint building blocks" doctest_run ./test/test_checkpoint
section "the GPU a rank takes under each launcher, the GPU peak per exact device" doctest_run ./test/test_gpu_select
fp8_numerics() {
    if [ -x ./test/test_fp8 ]; then doctest_run ./test/test_fp8; else echo "skipped: test_fp8 (no CUDA headers, the conversion oracle)"; fi
    bash test/test_fp8.sh
}
section "FP8 numerics (conversions against cuda_fp8.h, recipes)" fp8_numerics
cublaslt_dlopen() {
    if [ -x ./test/test_cublaslt_dlopen ]; then doctest_run ./test/test_cublaslt_dlopen
    else echo "skipped: test_cublaslt_dlopen (no CUDA headers)"; fi
}
section "the nvcc build's cuBLASLt, opened on first use (model/cublaslt_dlopen.h): lazily, every function, a missing library" cublaslt_dlopen

# CUDA backend under the SIMT emulator (g++ -DSIMT_EMULATION): the kernels run on the CPU
if [ -n "${HAVE_CUDA_HEADERS:-}" ]; then
    SIMT_THREADS=2 section "SIMT emulator" doctest_run ./test/test_simt
    section "CUDA kernels vs their CPU reference ops (SIMT emulator, random schedule)" doctest_run ./test/test_kernels
    # (not under the detector: the flash attention at DBRX's shape, 60 s there, and the embedding backward past gridDim.y's
    # limit, the same kernel as the small embedding case, and CP's chunk pairs at head_dim 128 up to T 1024, the kernels of
    # the small CP case, and the wgmma backward, 30 s there, whose kernels dev/cuda/attention_wgmma_bwd_race checks: test_kernels
    # runs them all)
    section "race detection: the kernels' shared/global accesses checked between barriers, negative controls (SIMT emulator)" \
        doctest_run ./test/test_race "-tce=flash attention at DBRX*,embedding backward with more distinct*,context parallelism: flash chunk pairs at DBRX*,wgmma attention backward*"
    # the FP8 kernels and a whole training step per recipe (the step's kernels) under the detector; ZeRO-3's FP8 all-gather kernels
    section "race detection: the FP8 kernels, a training step per recipe (SIMT emulator)" \
        doctest_run ./test/test_race_fp8 "-tc=quantize kernel*,FP8 GEMM*,the padded*,a training step with each recipe*"
    section "race detection: ZeRO-3's FP8 all-gather kernels (SIMT emulator)" doctest_run ./test/test_race_zero_fp8
    # Hopper's warpgroup MMA (model/wgmma.cuh): the emulator's wgmma against a double-precision product, then under the detector
    wgmma_tests() {
        doctest_run ./test/test_wgmma
        doctest_run ./test/test_race_wgmma
        local out rc; out=$(./dev/cuda/wgmma_gemm_race 2>&1); rc=$?
        [ "$rc" = 0 ] && pass "dev/cuda/wgmma_gemm's versions under the race detector: validated, no race" \
            || fail "dev/cuda/wgmma_gemm_race (exit $rc): $(grep -E 'FAIL|race' <<<"$out" | head -3)"
        out=$(./dev/cuda/attention_wgmma_race 2>&1); rc=$?
        [ "$rc" = 0 ] && pass "dev/cuda/attention_wgmma's forward under the race detector: validated against the CPU and v4, no race" \
            || fail "dev/cuda/attention_wgmma_race (exit $rc): $(grep -E 'FAIL|race' <<<"$out" | head -3)"
        # its negative control: v2 with 2 K/V buffers (tile j + 2 copied over V(j) while P(j) V(j) may still read it)
        out=$(./dev/cuda/attention_wgmma_race -p 1 2>&1); rc=$?
        [ "$rc" != 0 ] && grep -q "race in kernel.*cp.async.*wgmma.mma_async B\|race in kernel.*wgmma.mma_async B.*cp.async" <<<"$out" \
            && pass "negative control: attention_wgmma v2 with 2 K/V buffers races (cp.async over a tile wgmma still reads)" \
            || fail "negative control: attention_wgmma v2 with 2 buffers, no race reported (exit $rc): $(head -2 <<<"$out")"
        # the wgmma backward under the detector, then its negative control (-p 1: no barrier between the dS stores and
        # dQ's wgmma reading them), which must exit 1 with that race named
        local bwd=./dev/cuda/attention_wgmma_bwd_race
        if out=$($bwd 2>&1); then pass "$bwd: the wgmma backward validated against the CPU and bwd5 (bit for bit), no race"
        else fail "$bwd (exit $?): $(grep -E 'FAIL|race' <<<"$out" | head -3)"; fi
        if ! out=$($bwd -p 1 2>&1) && grep -q "race in kernel.*wgb_softmax_grad.*wgmma.mma_async A" <<<"$out"; then
            pass "negative control: $bwd -p 1 (no barrier after the dS stores) races: dS store / dQ's wgmma A"
        else fail "negative control: $bwd -p 1, the dS race not reported: $(head -2 <<<"$out")"; fi
        # v3's: its dq kernel without the barrier that keeps the copy of K, V tile j + 2 off tile j, still read by wgmma;
        # v4's: its dq kernel with 2 K/V buffers (tile j + 2 copied over K(j) while dQ(j)'s wgmma reads it)
        if ! out=$($bwd -p 2 2>&1) && grep -q "race in kernel flash_attention_backward_dq_wgmma.*\(cp.async.*wgmma.mma_async B\|wgmma.mma_async B.*cp.async\)" <<<"$out"; then
            pass "negative control: $bwd -p 2 (v3's dq kernel, no barrier before K, V are copied over a tile) races: cp.async / wgmma B"
        else fail "negative control: $bwd -p 2, the K/V race not reported: $(head -2 <<<"$out")"; fi
        if ! out=$($bwd -p 3 2>&1) && grep -q "race in kernel flash_attention_backward_dq_wgmma.*\(cp.async.*wgmma.mma_async B\|wgmma.mma_async B.*cp.async\)" <<<"$out"; then
            pass "negative control: $bwd -p 3 (v4's dq kernel with 2 K/V buffers) races: cp.async / wgmma B"
        else fail "negative control: $bwd -p 3, the K/V race not reported: $(head -2 <<<"$out")"; fi
    }
    section "wgmma (Hopper warpgroup MMA): every documented shared-memory layout, N 64/128/256, negative controls, race detector (SIMT emulator)" \
        wgmma_tests
    # Hopper's mbarriers and TMA (model/tma.cuh): boxes, a stage ring, a TMA-fed wgmma GEMM, negative controls; then under the detector
    tma_tests() { doctest_run ./test/test_tma; doctest_run ./test/test_race_tma; }
    section "TMA and mbarriers (Hopper): swizzled boxes with zero fill, a full/empty ring, TMA-fed wgmma, deadlocks and races reported (SIMT emulator)" \
        tma_tests
    section "grouped expert GEMMs on wgmma (model/moe_grouped.cuh): CPU and today's path bit for bit, planted bugs (SIMT emulator)" \
        doctest_run ./test/test_moe_grouped
    section "grouped expert GEMMs under the race detector, a dropped barrier reported (SIMT emulator)" \
        doctest_run ./test/test_race_moe_grouped "-tc=grouped up*,v4*,grouped backward*"
    section "grouped expert weight gradients (model/moe_grouped_wgrad.cuh): CPU and today's path bit for bit, planted bugs (SIMT emulator)" \
        doctest_run ./test/test_moe_wgrad
    section "grouped expert weight gradients under the race detector, a stage read before it landed reported (SIMT emulator)" \
        doctest_run ./test/test_race_moe_wgrad
    section "FP8 block-scaled grouped expert up-projection (model/moe_grouped_fp8.cuh): CPU and cuBLASLt's twin bit for bit, planted bugs (SIMT emulator)" \
        doctest_run ./test/test_moe_fp8_grouped
    section "FP8 block-scaled grouped expert up-projection under the race detector (SIMT emulator)" \
        doctest_run ./test/test_race_moe_fp8_grouped
    section "cuBLASLt's API twin: the library's rules as model/matmul_cublaslt.cuh meets them, the bucket fallback (SIMT emulator)" \
        doctest_run ./test/test_cublaslt_twin
    section "CUDA training step vs the CPU reference step (SIMT emulator)" doctest_run ./test/test_step_cuda
    section "generation: the KV-cache step vs the full forward on both backends, the sampler, decoding (SIMT emulator)" doctest_run ./test/test_decode
    section "FP8 on the CUDA backend: quantize kernels, FP8 GEMMs, training steps vs the CPU FP8 emulation (SIMT emulator)" \
        doctest_run ./test/test_fp8_cuda
    section "ZeRO-3's FP8 all-gather on the GPU: piece amax/codes vs the CPU path, gathered operands vs the quantize kernel (SIMT emulator)" \
        doctest_run ./test/test_zero_fp8_cuda
    section "the --dry-run planner: its terms by hand, against the model's walk and the store, the emulator's peak (SIMT emulator)" \
        doctest_run ./test/test_memory_plan
    dev_cuda() {
        for src in dev/cuda/*.cu; do   # (a .cu that dev/cuda/programs.cpp leaves out fails here: its link runs nothing)
            b=${src%.cu}_emu; out=$("$b" 2>&1); rc=$?
            [ "$rc" = 0 ] && pass "$b: every version validated against the CPU reference" || fail "$b (exit $rc): $(grep FAIL <<<"$out" | head -3)"
        done
        # dev/cuda/matmul -c: GEMMs beside a kernel holding SMs (the step-time model's NCCL CTAs) give the bits they give alone
        out=$(./dev/cuda/matmul_emu -c 2>&1); rc=$?
        [ "$rc" = 0 ] && grep -q "all versions validated" <<<"$out" && pass "dev/cuda/matmul_emu -c: GEMMs beside 8-32 CTAs held on another stream: the bits alone" \
            || fail "dev/cuda/matmul_emu -c (exit $rc): $(grep -E 'FAIL|error' <<<"$out" | head -3)"
        # dev/cuda/adamw -o: the model's AdamW issued on a stream of the least priority beside GEMMs on one of the greatest
        out=$(./dev/cuda/adamw_emu -o 2>&1); rc=$?
        [ "$rc" = 0 ] && grep -q "all versions validated" <<<"$out" && pass "dev/cuda/adamw_emu -o: AdamW beside the expert GEMMs on prioritised streams: the CPU's update" \
            || fail "dev/cuda/adamw_emu -o (exit $rc): $(grep -E 'FAIL|error' <<<"$out" | head -3)"
        # attention backward v4 (model/attention_flash_bwd2.cuh) under the race detector: dbrx-1b's GQA 4:1 at T 200 (no
        # tile divides it), head_dim 128 and 64; its negative control (-p 1: the dq kernel's one barrier a tile dropped)
        local r=./dev/cuda/attention_race
        if out=$($r -f -1 -g 4 -b 1 -t 200 -h 8 -k 2 -d 128 2>&1) && out=$($r -f -1 -g 4 -b 2 -t 77 -h 4 -k 2 -d 64 2>&1); then
            pass "$r: backward v4 validated against the CPU, no race"
        else fail "$r (exit $?): $(grep -E 'FAIL|race' <<<"$out" | head -3)"; fi
        if ! out=$($r -f -1 -g 4 -b 1 -t 200 -h 8 -k 2 -d 128 -p 1 2>&1) && grep -q "race in kernel flash_attention_backward2_dq_kernel" <<<"$out"; then
            pass "negative control: $r -p 1 (the dq kernel's tile barrier dropped) races"
        else fail "negative control: $r -p 1, no race reported: $(head -2 <<<"$out")"; fi
        # dev/cuda/layernorm under the detector: every version, bwd v4's warps' partials through shared memory among them
        if out=$(./dev/cuda/layernorm_race 2>&1); then pass "dev/cuda/layernorm_race: the forwards and backwards (v1-v4) validated, no race"
        else fail "dev/cuda/layernorm_race (exit $?): $(grep -E 'FAIL|race' <<<"$out" | head -3)"; fi
        # make bench-gpu's commands and flags, at a tiny shape on the emulated builds (no timings): the
        # benchmark a lent GPU runs must not have rotted
        out=$(bash dev/bench/bench_gpu.sh --emulated 2>&1); rc=$?
        [ "$rc" = 0 ] && pass "make bench-gpu's commands run on the emulated builds (attention, expert GEMMs, memory-bound kernels, end to end BF16 and FP8)" \
            || fail "bench_gpu.sh --emulated (exit $rc): $(grep -E 'FAILED|bench-gpu:' <<<"$out" | head -3)"
    }
    section "dev/cuda microbenchmarks, validation only (SIMT emulator)" dev_cuda
else
    echo "skipped: CUDA kernels under the SIMT emulator (no CUDA headers in \$CUDA_HOME/include)"
fi

# once for each renormalisation of the top-k router weights: DBRX's (the sum, p = 1), none (HF null), L2
parity() {
    local norm=$1 dump out rc p f
    dump=$(mktemp)
    ./test/dump_reference "$dump" $norm || fail "dump_reference $norm"
    out=$($PY test/test_pytorch_parity.py "$dump" 2>&1); rc=$?
    echo "$out" | sed 's/^/   /'
    p=$(echo "$out" | sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1/p'); f=$(echo "$out" | sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\2/p')
    for _ in $(seq 1 "${p:-0}"); do echo pass >> "$RESULTS"; done
    for _ in $(seq 1 "${f:-0}"); do echo fail >> "$RESULTS"; done
    [ -n "$p" ] || fail "parity test did not run (moe_normalize_expert_weights $norm, exit $rc)"
    rm -f "$dump"
}
for norm in 1 off 2; do section "PyTorch parity (float64 autograd reference), moe_normalize_expert_weights $norm" parity $norm; done
section "PyTorch parity (float64 autograd reference), --doc-mask (documents of 1 to 7 tokens)" parity "1 doc"

section "command line and bad input" bash test/test_cli.sh
section "data loader: order, ranks, resume, mixtures (doctest)" doctest_run ./test/test_data
section "data tools: tokenizer parity with js-tiktoken, mixtures in training, bad input, fuzzing" bash test/test_data.sh
section "training" bash test/test_train.sh
section "behaviour unchanged: losses, gradient norms and checkpoints of fixed runs bit-identical to test/golden/unchanged.txt" \
    bash test/test_unchanged.sh
section "generation: samples during training, --generate (checkpoint, Hugging Face export; cpu, emulated cuda; ZeRO-3), bad flags" \
    bash test/test_generate.sh
section "multiple-choice evaluation (--eval-mc): known answers, scores from the logits, ranks, bad files" bash test/test_mc_eval.sh
section "--eval-only: a checkpoint's or an export's validation loss (bit-identical to training's; cpu, ZeRO-3, EP, emulated cuda) and --eval-mc" \
    bash test/test_eval_only.sh
section "run plots (dev/plot_run.py) and the expert counts they read (--log-every-experts)" bash test/test_plot.sh
section "--profile: trace-event JSON of the CPU backend and of emulated ZeRO-3 on 2 ranks, checked; losses and the step's work unchanged" \
    bash test/test_profile.sh
if [ -n "${HAVE_CUDA_HEADERS:-}" ]; then
    section "training on the CUDA path (train_dbrx_emu: the SIMT emulator)" env NVCC="${NVCC:-}" bash test/test_cuda_train.sh
    section "--fp8 on the CUDA path (train_dbrx_emu) against the CPU's FP8 emulation" bash test/test_fp8_cuda.sh
    section "the step-time model (dev/predict/predict.py): hand-computed cases, negative controls, the emulator's work log of a step" \
        bash test/test_predict.sh
    section "the step-time model's kernel formulas (bytes read/written, mma FLOPs) against the emulator's count (train_dbrx_emu_count)" \
        bash test/test_kernel_bytes.sh
    section "the step-time model at full size: shapes-only emulation (SIMT_SHAPES_ONLY) against the real step, dbrx-1b 8 x 2048, make predict" \
        bash test/test_predict_shapes.sh
    section "the store's communication streams: reduce-scatters beside the gathers, one issue order of the communicators (work logs)" \
        bash test/test_comm_streams.sh
    section "the embedding's rows exchanged with their owners (--zero-embedding rows): bit-identical to the table gathered, fewer bytes, plan = peak" \
        bash test/test_zero_embedding.sh
    section "the gradient reduce-scatter in BF16 (--grad-reduce-dtype): fp32 the default's bits, bf16 near, half the bytes, the plan's scratch" \
        bash test/test_grad_reduce_dtype.sh
    section "the store's gradient shard overwritten by the first reduce-scatter, not zeroed: near the CPU, a stale-gradient control" \
        bash test/test_grad_overwrite.sh
    section "GEMM algorithms saved with checkpoints and pinned on resume (train_dbrx_emu: the cuBLASLt twin)" bash test/test_gemm_pins.sh
    section "--moe-gemm grouped: the step's expert forward and data gradients on the grouped GEMMs, bit-identical to cublaslt (1 GPU, routing to 4 experts, recompute, ZeRO-3), refusals" \
        bash test/test_moe_gemm.sh
    section "--attention-bwd auto (the default), wgmma, wgmma-overlap: the step's attention backward on wgmma, bit-identical to mma (head_dim 128, 64; 32 keeps mma), refusals" \
        bash test/test_attention_bwd.sh
    section "--doc-mask: attention inside each packed document on both backends (it acts, GPU near CPU at head_dim 32 and 128, recompute, no end-of-text changes nothing)" \
        bash test/test_doc_mask.sh
else
    echo "skipped: the CUDA training path under the SIMT emulator (no CUDA headers)"
fi
cp_tests() { doctest_run ./test/test_ring_attention; bash test/test_cp.sh; }
section "context parallelism (--context-parallel): ring attention vs the full-sequence reference, negative controls; CP 2/4 vs one process, bytes, resume" cp_tests
section "expert parallelism's exchange in chunks overlapped with the experts (--ep-overlap-chunks): bit-identical losses, streams" \
    bash test/test_ep_overlap.sh
if [ -x ./train_dbrx_emu ]; then
    section "expert parallelism past the planned rows (--ep-capacity-factor): the buffers grown on every rank, the dropless plan's losses bit for bit, an agreed stop" \
        bash test/test_ep_grow.sh
fi
section "--recompute: bit-identical losses and gradient norms with it (CPU, emulated GPU, ZeRO-3, EP, FP8); negative control" \
    bash test/test_recompute.sh
section "--compress-acts: compressed saved activations (CPU, emulated GPU: the same forward, gradients close, memory plan = peak)" \
    bash test/test_compress_acts.sh
section "the loss-spike and NaN guard, checkpoints known good" bash test/test_guard.sh

# the tail: checks that time a failure (a hung or killed rank named within seconds, Ctrl-C, watchdogs, time limits). Ctrl-C
# (the longest) beside only the two that mostly wait (hangs: ~40% of a core; the test-gpu runner): its 2-rank runs lose
# a race when a rank finds no core at the SIGINT (test_ctrlc.sh allows 2 of 10; session 48's CI, with heavier checks
# beside it, lost 1). Then the other three, two at a time
tail_section "Ctrl-C through mpirun (SIGINT to mpirun, 5 runs on 1 rank and 10 on 2 ranks): saved, loadable, every rank exits 0" bash test/test_ctrlc.sh
tail_section "hangs (every survivor names the same rank and its phase) and stragglers" bash test/test_hang.sh
if [ -n "${HAVE_CUDA_HEADERS:-}" ]; then
    tail_section "make test-gpu's runner (dev/test_gpu.sh) without a GPU: the no-GPU line, verdicts, time limits, the report, a smoke run" \
        bash test/test_gpu_report.sh
fi
finish_sections
if [ -n "${HAVE_CUDA_HEADERS:-}" ]; then
    nccl_twin() {   # in the tail: its abort and watchdog cases time a blocked call, and so does the hung rank
        for np in 1 2 3 4; do   # every rank runs every case; one check per run
            out=$(timeout 120 bash dev/mpirun.sh -np "$np" ./test/test_nccl_twin 2>&1); rc=$?
            ok=$(grep -cE '^rank [0-9]+: \[doctest\] test cases: .*\| +0 failed' <<<"$out")
            if [ "$rc" = 0 ] && [ "$ok" = "$np" ]; then pass "test_nccl_twin -np $np: $(grep -m1 -oE 'test cases: +[0-9]+' <<<"$out" | grep -oE '[0-9]+') test cases passed on each of $np rank(s)"
            else fail "test_nccl_twin -np $np (exit $rc, $ok of $np ranks passed): $(grep -E 'ERROR|error' <<<"$out" | head -3)"; fi
        done
        # negative control: the twin's planted bug (its reduce-scatter ring run backwards) must fail the order check
        out=$(NCCL_TWIN_DEBUG_PLANT=reduce_order timeout 120 bash dev/mpirun.sh -np 4 ./test/test_nccl_twin -tc='summation order*' 2>&1); rc=$?
        if [ "$rc" != 0 ] && grep -q "first element off the ring order" <<<"$out"; then pass "test_nccl_twin: a planted change of the summation order fails the order check (exit $rc)"
        else fail "test_nccl_twin: the planted change of the summation order went unnoticed (exit $rc)"; fi
        # a hung rank (SIGSTOP) under the NCCL path: rank 0's watchdog aborts and exits, naming it
        pidf=$(mktemp); t0=$(date +%s)
        NCCL_TWIN_TEST_HANG=1 NCCL_TWIN_TEST_PIDFILE=$pidf timeout 60 bash dev/mpirun.sh -np 2 ./test/test_nccl_twin > "$pidf.out" 2>&1; rc=$?
        dt=$(( $(date +%s) - t0 ))
        for f in "$pidf".[0-9]*; do   # nothing left stopped behind
            p=$(cat "$f" 2>/dev/null)
            if [ -n "$p" ] && grep -q test_nccl_twin "/proc/$p/cmdline" 2>/dev/null; then kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; fi
        done
        if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$dt" -lt 20 ] && grep -q "error: rank 0: NCCL AllReduce in group world made no progress for .* waiting for rank 1" "$pidf.out"; then
            pass "NCCL path, a hung rank (SIGSTOP): exit $rc after ${dt} s, the watchdog names rank 1"
        else fail "NCCL path, a hung rank: exit $rc after ${dt} s: $(grep -i error "$pidf.out" | head -3)"; fi
        rm -f "$pidf" "$pidf".*
    }
    tail_section "the NCCL twin (test/simt/nccl_twin.h) and comm.h's NCCL path over it, under mpirun (SIMT emulator)" nccl_twin
fi
tail_section "automatic restart (dev/supervise.sh): random kills, the same step failing, exit 2, signals" bash test/test_supervise.sh
tail_section "the health check: GEMM, collectives, forward on every rank; a slow rank named, the job stopped" bash test/test_health.sh
finish_sections
rm -rf "$secdir"
unset OMP_WAIT_POLICY

echo "== builds"
if [ -n "${NVCC:-}" ]; then
    # train_dbrx was built with ptxas's spill warnings as errors: no kernel of the step spills registers;
    # the negative control: a kernel that must spill fails the same flags, named
    out=$("$NVCC" ${NVCC_NOSPILL_FLAGS:--Xptxas -warn-spills,-Werror} -c test/spill_probe.cu -o /tmp/spill_probe.$$.o 2>&1); rc=$?
    rm -f /tmp/spill_probe.$$.o
    if [ "$rc" != 0 ] && grep -q "Registers are spilled to local memory in function '.*spill_probe" <<<"$out"; then
        pass "no-spill rule: train_dbrx's kernels spill no registers (ptxas -warn-spills as an error); a spilling kernel fails the build ($(grep -m1 -o '[0-9]* bytes spill stores' <<<"$out"))"
    else fail "no-spill rule: the spilling probe compiled (exit $rc): $(head -2 <<<"$out")"; fi
    # not linked with cuBLASLt: it opens on first use (model/cublaslt_dlopen.h); linked, its start-up cost every process
    # ~0.45 s of CPU, GPU or not
    if readelf -d train_dbrx | grep -q "NEEDED.*libnccl" && ! readelf -d train_dbrx | grep -q "NEEDED.*libcublasLt"; then
        pass "CUDA build: train_dbrx needs libnccl but not libcublasLt at start-up (opened on first use)"
    else fail "CUDA build: train_dbrx's libraries at start-up: $(readelf -d train_dbrx | grep -o 'NEEDED.*' | tr '\n' ' ')"; fi
    # make test-build compiled these with nvcc for sm_90a, warnings as errors (cuBLASLt opened at run time)
    for b in train_dbrx test/test_kernels_gpu test/test_step_cuda_gpu test/test_fp8_cuda_gpu test/test_zero_fp8_cuda_gpu test/test_decode_gpu; do
        if [ -x "$b" ]; then pass "CUDA build: $b compiled by nvcc for sm_90a, warnings as errors"
        else fail "CUDA build: $b missing or stale"; fi
    done
    # dev/cuda's programs, compiled as one unit (dev/cuda/programs.cpp); every .cu must be in it
    missing=$(for src in dev/cuda/*.cu; do grep -q "^#include \"$(basename "$src")\"" dev/cuda/programs.cpp || echo "$src"; done)
    if [ -x dev/cuda/programs_gpu ] && [ -z "$missing" ]; then
        pass "CUDA build: dev/cuda's $(ls dev/cuda/*.cu | wc -l) programs compiled by nvcc for sm_90a as one unit (dev/cuda/programs_gpu), warnings as errors, no spills"
    else fail "CUDA build: dev/cuda/programs_gpu missing, or dev/cuda/programs.cpp leaves out: $missing"; fi
else
    echo "skipped: CUDA build with nvcc (nvcc not found): train_dbrx was built by g++ (CPU only), the GPU tests and dev/cuda programs were not compiled"
fi
[ -x ./train_dbrx_cpu ] && ./train_dbrx_cpu --dry-run >/dev/null && pass "CPU-only g++ build" || fail "CPU-only g++ build"

np=$(grep -c pass "$RESULTS"); nf=$(grep -c fail "$RESULTS"); rm -f "$RESULTS"
echo
echo "$np passed, $nf failed"
[ "$nf" = 0 ]
