#!/usr/bin/env bash
# test_zero_chunks.sh — the device store's chunked experts (--zero-chunk-mib, parallel/zero_gpu_chunks.cuh) on
# the SIMT emulator under mpirun (the NCCL twin), against the same store with the experts gathered whole
# (--zero-chunk-mib 0, today's path, itself checked against the CPU by test_zero_gpu.sh):
#   * np 2 ZeRO-3, chunks of 1 expert (16 chunks per layer) with evaluation and generation, and chunks of 4
#     experts with --recompute moe in layer 0 and swiglu in layer 1: every loss, validation loss and the sampled
#     text bit-identical, the bytes per step equal; np 4 HSDP 2x2 with chunks: the losses bit-identical;
#   * the memory bound: every rank's emulated peak device memory is the --dry-run plan's allocations (0.1%),
#     and lower than the unchunked run's by exactly 2 x (2 + 4) bytes x (the experts unit - one expert) per
#     slot, the sizes computed here from the model's dimensions; the planned working set at two expert widths
#     (ffn 224 and 896) stays within the budget while the unchunked one grows 4x; DBRX-132B's plan (S 64):
#     slots of the largest other unit (norm_f + lm_head, V d + d), not of the experts (3 E F d);
#   * --export-hf after the chunked run byte-identical; a chunked run's checkpoint resumed unchunked, bit-identical;
#   * the EP case (parallel/expert_parallel_cuda.cuh): each rank's own E/n = 8 experts in chunks of 1, np 2 EP 2 with the
#     exchange in 2 chunks (the default) and in 1, --recompute moe and swiglu, --compress-acts swiglu, with evaluation and
#     generation, and np 4 EP 2 spread and packed (the expert
#     shard group of 2): losses and bytes per step bit-identical to the unit whole; checkpoints EP chunked -> whole ->
#     chunked, each resumed step bit-identical; every rank's emulated peak = the plan (0.1%: np 4 spread, and np 2 with
#     --recompute moe, the recompute slot planned with the chunks); the negative control
#     chunk_early_rs on an EP chunk changes the losses;
#   * the vocabulary (parallel/zero_gpu_vocab.cuh): at --zero-chunk-mib 0.02 the embedding and the head gathered whole
#     into one vocabulary slot, their gradients in 5 chunks of 80 rows: the np 2 run above (with --recompute attn, evaluation,
#     generation, --export-hf) and np 4 HSDP bit-identical to the units whole, the peak to the plan (0.1%) and the plan
#     smaller by exactly the formula (2 x 6 B x the experts unit less one expert, less the vocabulary slot V d + d + S);
#     under EP 2 (the vocabulary alone chunked) bit-identical; checkpoints across the layouts both ways (chunked ->
#     whole -> chunked), each resumed step bit-identical; DBRX-132B S 64: the ring's slots one expert (3 F d), the
#     vocabulary slot V d + d + 64;
#   * negative controls: a chunk's gradient reduce-scattered before its backward (DBRX_DEBUG_PLANT=chunk_early_rs,
#     run at once) changes the losses, for the experts' chunks and (under EP 2) for the vocabulary's;
#   * bad values of --zero-chunk-mib: exit 2, one line naming the flag.
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--model dbrx-tiny --n-layers 2 --seq 32 --steps 3 --batch 1 --grad-clip 0)
runp() {  # name, np, flags...: the emulated GPU under mpirun
    local name=$1 np=$2; shift 2
    $MPI -np "$np" ./train_dbrx_emu --device cuda "${G[@]}" "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 ||
        fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}

# --- bad values
for v in -1 abc nan 2e6; do
    expect_exit 2 "--zero-chunk-mib $v refused" ./train_dbrx_cpu --model dbrx-tiny --zero-chunk-mib "$v" --dry-run
    echo "$LAST_ERR" | grep -q -- "--zero-chunk-mib" || fail "--zero-chunk-mib $v: the error does not name the flag"
done

# --- bit-identity (one expert = 3 x 224 x 128 BF16 = 0.164 MiB: 0.2 -> 1 expert per chunk, 0.7 -> 4; 0.02 -> 1, and the
# vocabulary's gradients in chunks of 80 rows of d 128 BF16 (the most, x 8, in 0.02 MiB: 81), 5 chunks of V 384)
# (the embedding's table gathered in both, --zero-embedding gather: the bytes compare the experts' chunks alone)
E=(--grad-accum 2 --shard-group-size 2 --val-every 2 --sample-every 2 --zero-embedding gather)
runp whole 2 "${E[@]}" --zero-chunk-mib 0 --export-hf "$tmp/hf_whole" --export-dtype fp32
runp c1 2 "${E[@]}" --zero-chunk-mib 0.02 --recompute attn --export-hf "$tmp/hf_c1" --export-dtype fp32
cmp -s "$tmp/hf_whole/model.safetensors" "$tmp/hf_c1/model.safetensors" \
    && pass "--export-hf after 3 steps: the chunked run's weights byte-identical to the unchunked run's" || fail "--export-hf differs"
# a checkpoint of the chunked layout (its runs with their flat offsets in the manifest) resumed with the experts whole
# (and back: the unchunked checkpoint of step 2 resumed with the experts and the vocabulary in chunks)
runp ck1 2 --grad-accum 2 --shard-group-size 2 --val-every 0 --zero-chunk-mib 0.02 --ckpt-dir "$tmp/ck" --stop-after 1
runp ck2 2 --grad-accum 2 --shard-group-size 2 --val-every 0 --zero-chunk-mib 0 --ckpt-dir "$tmp/ck" --resume auto --stop-after 1
runp ck3 2 --grad-accum 2 --shard-group-size 2 --val-every 0 --zero-chunk-mib 0.02 --ckpt-dir "$tmp/ck" --resume auto
# the CPU backend, one process, the same global batch (4 sequences a step): the usual BF16 tolerance (test_zero_gpu.sh's)
./train_dbrx_cpu --device cpu "${G[@]}" --grad-accum 4 --val-every 0 --log "$tmp/cpu.jsonl" > "$tmp/cpu.out" 2>&1 || fail "cpu: $(tail -2 "$tmp/cpu.out")"
runp c4rc 2 --grad-accum 2 --shard-group-size 2 --val-every 0 --zero-chunk-mib 0.7 --recompute moe:0,swiglu:1
SIMT_STEP_COUNTERS=1 runp h4 4 --shard-group-size 2 --val-every 0 --zero-chunk-mib 0.02 --zero-embedding gather   # (+ the emulated peak)
DBRX_DEBUG_PLANT=chunk_early_rs runp planted 2 --grad-accum 2 --shard-group-size 2 --val-every 0 --zero-chunk-mib 0.2
grep -q "in 16 chunks of 1 expert" "$tmp/c1.out" && grep -q "in 4 chunks of 4 expert" "$tmp/c4rc.out" \
    && grep -q "vocabulary slot of 49282 params, their gradients reduce-scattered in 5 chunks of 80 vocabulary rows" "$tmp/c1.out" \
    && ! grep -q "vocabulary slot" "$tmp/c4rc.out" \
    && pass "the store says how it chunks (16 chunks of 1 expert, 4 of 4; the vocabulary slot V d + d + S, 5 chunks of 80 rows)" \
    || fail "no chunking line: $(grep zero: "$tmp/c1.out" | head -3)"

# --- the EP case: each rank's own experts (E/n = 8) in chunks of 1 through the dispatcher (parallel/expert_parallel_cuda.cuh),
# against the experts unit whole (--zero-chunk-mib 0): the exchange in 2 chunks (the default), in one, --recompute moe/swiglu,
# np 4 with --ep-layout spread (the expert shard group of 2: real gathers and reduce-scatters of the chunks) and packed
G=(--model dbrx-tiny --n-layers 2 --seq 32 --steps 2 --batch 1 --val-every 0 --grad-clip 0)
X=(--shard-group-size 2 --expert-parallel 2)
runp epw 2 "${X[@]}" --zero-chunk-mib 0 --val-every 1 --sample-every 2
runp epwca 2 "${X[@]}" --zero-chunk-mib 0 --compress-acts swiglu
runp ep2ca 2 "${X[@]}" --zero-chunk-mib 0.2 --compress-acts swiglu
runp epw1 2 "${X[@]}" --zero-chunk-mib 0 --ep-overlap-chunks 1 --recompute moe
runp ep2 2 "${X[@]}" --zero-chunk-mib 0.2 --val-every 1 --sample-every 2   # (the vocabulary whole: 819 rows fit 0.2 MiB)
runp ep2o1 2 "${X[@]}" --zero-chunk-mib 0.2 --ep-overlap-chunks 1 --recompute moe
SIMT_STEP_COUNTERS=1 runp ep2rm 2 "${X[@]}" --zero-chunk-mib 0.2 --recompute moe   # (+ the peak: the recompute slot too)
runp ep2rs 2 "${X[@]}" --zero-chunk-mib 0.2 --recompute swiglu --ep-overlap-chunks 1
runp ep2v 2 "${X[@]}" --zero-chunk-mib 0.02
DBRX_DEBUG_PLANT=chunk_early_rs runp planted_v 2 "${X[@]}" --zero-chunk-mib 0.02
Y=(--shard-group-size 4 --expert-parallel 2 --ep-layout spread --steps 3)
runp ep4w 4 "${Y[@]}" --zero-chunk-mib 0
SIMT_STEP_COUNTERS=1 runp ep4 4 "${Y[@]}" --zero-chunk-mib 0.2 --recompute swiglu   # (+ the emulated peak memory)
runp ep4p 4 --shard-group-size 4 --expert-parallel 2 --steps 3 --zero-chunk-mib 0.2 --ep-overlap-chunks 1
runp ep4pw 4 --shard-group-size 4 --expert-parallel 2 --steps 3 --zero-chunk-mib 0   # (packed's own baseline: another ring order)
DBRX_DEBUG_PLANT=chunk_early_rs runp planted_e 4 "${Y[@]}" --zero-chunk-mib 0.2 --steps 2
# checkpoints across the layouts: EP chunked -> EP whole -> EP chunked, each resumed step bit-identical to ep4w's
runp eck1 4 "${Y[@]}" --zero-chunk-mib 0.2 --ckpt-dir "$tmp/eck" --stop-after 1
runp eck2 4 "${Y[@]}" --zero-chunk-mib 0 --ckpt-dir "$tmp/eck" --resume auto --stop-after 1
runp eck3 4 "${Y[@]}" --zero-chunk-mib 0.2 --ckpt-dir "$tmp/eck" --resume auto
./train_dbrx_cpu --model dbrx-tiny --n-layers 2 --seq 32 --batch 1 "${Y[@]}" --zero-chunk-mib 0.2 --recompute swiglu --dry-run --plan-gpus 4 > "$tmp/plan_ep4" 2>&1
./train_dbrx_cpu --model dbrx-tiny --n-layers 2 --seq 32 --batch 1 "${X[@]}" --zero-chunk-mib 0.2 --recompute moe --dry-run --plan-gpus 2 > "$tmp/plan_ep2rm" 2>&1
grep -q "in 8 chunks of 1 expert(s) of a rank's own" "$tmp/ep2.out" && grep -q "in 5 chunks of 80 vocabulary rows" "$tmp/ep2v.out" \
    && ! grep -q "chunks of 1 expert" "$tmp/epw.out" \
    && pass "under --expert-parallel 2 the store says it chunks a rank's own 8 experts (8 chunks of 1); the vocabulary in 5 chunks" \
    || fail "EP: $(grep -i 'chunk' "$tmp/ep2.out" | head -2)"
./train_dbrx_cpu --dry-run --model dbrx-132b --batch 1 --seq 4096 --shard-group-size 64 --expert-parallel 8 --plan-device h100 \
    --zero-embedding gather > "$tmp/plan_ep8" 2>&1

# the plans: allocations of the chunked run, the working set at two widths, DBRX-132B at S 64
D=(--model dbrx-tiny --n-layers 2 --seq 32 --batch 1 --shard-group-size 2 --dry-run --plan-gpus 4 --zero-embedding gather)
./train_dbrx_cpu "${D[@]}" --zero-chunk-mib 0.02 > "$tmp/plan_c1" 2>&1
./train_dbrx_cpu "${D[@]}" --zero-chunk-mib 0 > "$tmp/plan_whole" 2>&1
for f in 224 896; do
    for m in 0 0.7; do ./train_dbrx_cpu "${D[@]}" --ffn-hidden $f --zero-chunk-mib $m > "$tmp/plan_f${f}_$m" 2>&1; done
done
./train_dbrx_cpu --model dbrx-132b --batch 1 --seq 4096 --shard-group-size 64 --plan-gpus 64 --dry-run > "$tmp/plan_132b" 2>&1
./train_dbrx_cpu --model dbrx-132b --batch 1 --seq 4096 --shard-group-size 64 --plan-gpus 64 --dry-run --zero-chunk-mib 0 > "$tmp/plan_132b_whole" 2>&1

$PY - "$tmp" <<'PY' > "$tmp/verdicts"
import json, os, re, sys
tmp = sys.argv[1]
def log(n): return [json.loads(l) for l in open(os.path.join(tmp, n + ".jsonl"))]
def losses(n): return [(r["step"], r["loss"]) for r in log(n) if "loss" in r]
def field(n, k): return [r[k] for r in log(n) if k in r]
def out(n): return open(os.path.join(tmp, n)).read()
def v(ok, msg): print(("pass " if ok else "fail ") + msg)
w, c1 = losses("whole"), losses("c1")
v(len(w) == 3 and w == c1, "np 2 ZeRO-3, chunks of 1 expert: the 3 losses bit-identical to the experts gathered whole %s" % c1)
cpu = losses("cpu")
rc = max((abs(x[1] - y[1]) / y[1] for x, y in zip(c1, cpu)), default=9)
v(len(cpu) == 3 and rc < 1e-2, "... and the CPU backend's (one process, the same global batch) within %.1e relative (< 1e-2)" % rc)
v(field("whole", "val_loss") == field("c1", "val_loss") and field("c1", "val_loss"), "... and the validation losses %s" % field("c1", "val_loss"))
samples = lambda n: re.findall(r"^sample \d+: (?!\d+ tokens).*$", out(n + ".out"), re.M)
v(samples("whole") == samples("c1") and samples("c1"), "... and the sampled text (generation through the chunks, train 0)")
v(field("whole", "comm_bytes") == field("c1", "comm_bytes"), "... and the bytes per step %s" % field("c1", "comm_bytes")[:1])
v(losses("ck2") == w[1:2] and losses("ck3") == w[2:] and len(w) == 3,
  "a chunked run's checkpoint (experts and vocabulary) resumed whole, its checkpoint resumed chunked: steps 2, 3 bit-identical %s %s" % (
  losses("ck2"), losses("ck3")))
v(losses("c4rc") == w, "chunks of 4 experts with --recompute moe:0,swiglu:1: bit-identical %s" % losses("c4rc"))
v(losses("h4") == w, "np 4 HSDP 2x2 (grad-accum 1: the same global batch) with chunks: bit-identical %s" % losses("h4"))
v(losses("planted") != w, "negative control: a chunk reduce-scattered before its backward changes the losses %s" % losses("planted"))
# memory: the emulated peak per rank against the plan; the plan's slots against the sizes' formula
peak = lambda n: [int(x) for x in re.findall(r"^simt peak device memory: (\d+) bytes", out(n + ".out"), re.M)]
allocs = lambda n: int(re.search(r"^plan bytes: allocations (\d+)", out(n), re.M).group(1))
ew = losses("epw")
v(len(ew) == 2 and all(losses(n) == ew for n in ("ep2", "ep2o1", "ep2rm", "ep2rs", "ep2v", "epw1")),
  "EP 2, a rank's experts in chunks of 1: the exchange in 2 chunks and in 1, --recompute moe and swiglu, the vocabulary chunked too: "
  "the 2 losses bit-identical to the experts whole %s" % ew)
v(field("ep2", "val_loss") == field("epw", "val_loss") and field("ep2", "val_loss") and samples("ep2") == samples("epw") and samples("ep2")
  and losses("ep2ca") == losses("epwca") and len(losses("ep2ca")) == 2,
  "... and the validation losses, the sampled text (generation through the EP chunks), and with --compress-acts swiglu %s" % losses("ep2ca"))
v(field("ep2", "comm_bytes") == field("epw", "comm_bytes") and field("ep2o1", "comm_bytes") == field("epw1", "comm_bytes"),
  "... and the bytes per step (--recompute moe: the chunks gathered again as the unit was) %s" % field("ep2o1", "comm_bytes")[:1])
e4 = losses("ep4w")
v(len(e4) == 3 and losses("ep4") == e4 and field("ep4", "comm_bytes") == field("ep4w", "comm_bytes") and len(losses("ep4pw")) == 3
  and losses("ep4p") == losses("ep4pw") and field("ep4p", "comm_bytes") == field("ep4pw", "comm_bytes"),
  "np 4 EP 2 (expert shard group 2), spread with --recompute swiglu and packed with the exchange in one piece: losses and bytes "
  "bit-identical to the experts whole in the same layout %s %s" % (e4, losses("ep4p")))
v(losses("eck2") == e4[1:2] and losses("eck3") == e4[2:],
  "an EP chunked run's checkpoint resumed with the experts whole, that one's resumed chunked: steps 2, 3 bit-identical %s %s" % (
  losses("eck2"), losses("eck3")))
v(losses("planted_e") != e4[:2], "negative control: an EP chunk reduce-scattered before its backward changes the losses %s" % losses("planted_e"))
v(losses("planted_v") != ew, "negative control: the same with the vocabulary chunked too (EP 2) changes the losses %s" % losses("planted_v"))
pe, ape = peak("ep4"), allocs("plan_ep4")
v(len(pe) >= 4 and abs(max(pe) / ape - 1) <= 0.001, "np 4 EP 2 spread with chunks: every rank's emulated peak (max %d) is the plan's allocations %d (%+.4f%%)" % (
    max(pe) if pe else 0, ape, 100 * (max(pe) / ape - 1) if pe else 0))
pr, apr = peak("ep2rm"), allocs("plan_ep2rm")
v(len(pr) >= 2 and abs(max(pr) / apr - 1) <= 0.001 and "the recompute slot" in out("plan_ep2rm"),
  "np 2 EP 2 with chunks and --recompute moe: every rank's emulated peak (max %d) is the plan's allocations %d (%+.4f%%), "
  "the recompute slot planned" % (max(pr) if pr else 0, apr, 100 * (max(pr) / apr - 1) if pr else 0))
plan, pc = allocs("plan_c1"), peak("h4")   # (both at --zero-chunk-mib 0.02)
v(len(pc) >= 4 and abs(max(pc) / plan - 1) <= 0.001, "np 4 HSDP with chunks: every rank's emulated peak (max %d) is the --dry-run plan's allocations %d (%+.4f%%)" % (
    max(pc) if pc else 0, plan, 100 * (max(pc) / plan - 1) if pc else 0))
d, F, E, V = 128, 224, 16, 384
expert = 3 * F * d   # 86016: larger than every other unit of this model (norm_f + lm_head V d + d = 49280, a block's ~52 K)
m = re.search(r"working slots of (\d+) params", out("h4.out"))
slot = int(m.group(1)) if m else -1
v(slot == expert, "the chunked working slot holds one expert's w1, v1, w2: %d params (3 F d = %d)" % (slot, expert))
# whole minus chunked, in the plan: two slots of BF16 + FP32 of 3 E F d against 3 F d, less the vocabulary slot (V d + d + S
# BF16; the peak above holds the plan to 0.1%; what the plan leaves out, the AdamW segment table, 20 B per tensor piece, is
# a few KB more with the chunks here)
want = 2 * (2 + 4) * (3 * E * F * d - expert) - 2 * (V * d + d + 2)
got = allocs("plan_whole") - plan
v(got == want, "the plan with the experts whole is larger by 2 x (2 + 4) B x (3 E F d - 3 F d) = %d bytes (%d)" % (want, got))
ws = lambda n: int(re.search(r"two slots of (\d+) params", out(n)).group(1))
for f in (224, 896):
    cw, ww = ws("plan_f%d_0.7" % f), ws("plan_f%d_0" % f)
    v(ww == 3 * E * f * d and cw * 2 <= 0.7 * 2**20 and cw >= 3 * f * d,
      "ffn %d: the planned slot %d params (%.3f MiB BF16, within the budget 0.7) against the whole experts unit %d" % (f, cw, cw * 2 / 2**20, ww))
v(ws("plan_f896_0") == 4 * ws("plan_f224_0") and ws("plan_f896_0.7") == ws("plan_f224_0.7"),
  "4x the expert width: the whole unit's slot 4x, the chunked slot the same (4 experts per chunk at ffn 224, 1 at 896)")
dm, Fm, Em, Vm = 6144, 10752, 16, 100352
vs = re.search(r"the vocabulary slot [\d.]+ GiB \(the embedding or the head whole: (\d+) params; their gradients in chunks of (\d+) rows", out("plan_132b"))
v(ws("plan_132b") == 3 * Fm * dm and ws("plan_132b_whole") == 3 * Em * Fm * dm and vs and int(vs.group(1)) == Vm * dm + dm + 64,
  "DBRX-132B S 64: the ring's slots one expert (%d params = 3 F d) with the default chunks, the experts (%d) whole; the vocabulary slot %s" % (
  ws("plan_132b"), ws("plan_132b_whole"), vs.group(1) if vs else None))
ve = re.search(r"the vocabulary slot [\d.]+ GiB \(the embedding or the head whole: (\d+) params", out("plan_ep8"))
we = re.search(r"ZeRO working set .*experts in chunks of 1\)\s+([\d.]+) GiB", out("plan_ep8"))
v(ws("plan_ep8") == 3 * Fm * dm and ve and int(ve.group(1)) == Vm * dm + dm + 64 and we and we.group(1) == "3.36",
  "DBRX-132B S 64 EP 8: a rank's 2 experts in chunks of 1, the ring's slots one expert (%d params), the working set %s GiB "
  "(2 x 6 B x 3 F d + 2 B x (V d + d + 64) = 3.36; the unit whole: 5.58)" % (ws("plan_ep8"), we.group(1) if we else None))
PY
verdicts "$tmp/verdicts" 26
