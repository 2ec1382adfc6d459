#!/usr/bin/env bash
# test_predict.sh — the step-time model (dev/predict/predict.py, make predict) and the emulator's work log
# (SIMT_WORKLOG=FILE, test/simt/counters.h):
#   - the model on hand-computed cases (test/test_predict.py): a GEMM, a memory-bound kernel, a collective (one
#     node, two nodes), two streams with and without an event, a host sync draining the pipeline; negative
#     controls: reduce-scatters moved onto the compute stream, a sync per layer, a kernel reading twice the bytes;
#     the Chrome trace; the measured GEMM table (--gemm-shapes, calibrate.py --gemms, a measured shape at its time);
#   - an emulated dbrx-tiny step (train_dbrx_emu, 2 steps, batch 2 x 32): its work log parses, every launch, GEMM
#     and host sync the emulator counted (SIMT_STEP_COUNTERS) is in it, its GEMM FLOPs equal the MFU formula's
#     matmul count (model/config.h);
#   - negative control on the real log: DBRX_DEBUG_PLANT=step_sync (one more sync per layer) adds L stream syncs
#     per micro-batch and raises the predicted step by what the model accounts for them (the host's extra waits
#     + one sync latency each);
#   - predict.py's command line on that log: the step, the MFU, the table, a valid trace; bad input: one line, exit 2;
#   - ZeRO-3 on 2 ranks (NCCL twin): a log per rank, the collectives on the store's stream, their exposed time.
# Alone: bash test/test_predict.sh (EMU= overrides ./train_dbrx_emu)
cd "$(dirname "$0")/.." || exit 1
source test/lib.sh
PY=${PYTHON:-/usr/bin/python3}
EMU=${EMU:-./train_dbrx_emu}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive

$PY test/test_predict.py > "$tmp/model.txt" 2>&1; verdicts "$tmp/model.txt" 50

if [ ! -x "$EMU" ]; then fail "$EMU is not built (make train_dbrx_emu)"; exit 0; fi
run() {   # run NAME [env...]: 2 steps of dbrx-tiny (4 layers) on the emulated GPU with the work log and the counters
    local name=$1; shift
    env SIMT_WORKLOG="$tmp/$name.jsonl" SIMT_STEP_COUNTERS=1 "$@" "$EMU" --device cuda --model dbrx-tiny --batch 2 --seq 32 \
        --steps 2 --val-every 0 > "$tmp/$name.out" 2> "$tmp/$name.err" || { fail "$name run (exit $?): $(tail -2 "$tmp/$name.err")"; return 1; }
    grep "^simt counters" "$tmp/$name.err" > "$tmp/$name.counters"
}
if run base; then
    # dbrx-tiny: L 4, d 128, heads 4 (kv 2), E 16, top-4, F 224, V 384; 64 tokens of 32
    $PY test/test_predict.py --e2e "$tmp/base.jsonl" "$tmp/base.counters" 4 128 4 2 16 4 224 384 64 32 > "$tmp/e2e.txt" 2>&1
    verdicts "$tmp/e2e.txt" 6
    fpt=$(sed -nE 's/^mfu: ([0-9.e+]+) FLOPs\/token.*/\1/p' "$tmp/base.out")
    out=$($PY dev/predict/predict.py "$tmp/base.jsonl" --device h100-sxm --flops-per-token "$fpt" --tokens 64 --trace "$tmp/trace.json" 2>&1)
    if grep -q "^predicted step on h100-sxm" <<<"$out" && grep -q "^MFU" <<<"$out" && grep -q "^exposed communication" <<<"$out" \
       && grep -q "^critical path" <<<"$out" && grep -q "gemm bf16" <<<"$out" \
       && $PY -c 'import json,sys; t=json.load(open(sys.argv[1]))["traceEvents"]; x=[e for e in t if e["ph"]=="X"]; sys.exit(0 if x and all(k in e for e in x for k in ("name","ts","dur","pid","tid")) else 1)' "$tmp/trace.json"; then
        pass "predict.py on the dbrx-tiny log: $(head -1 <<<"$out" | cut -c1-80); MFU, exposed communication, critical path, the table; a valid Chrome trace"
    else fail "predict.py on the dbrx-tiny log: $(head -5 <<<"$out")"; fi
    # negative control: one more sync per layer (the step budget's planted bug)
    if run planted DBRX_DEBUG_PLANT=step_sync; then
        $PY - "$tmp/base.jsonl" "$tmp/planted.jsonl" <<'PY' > "$tmp/planted.txt" 2>&1
import sys
sys.path.insert(0, "dev/predict")
import predict as P
a, b = (P.one_step(P.read_log(f), 2) for f in sys.argv[1:3])
ns = lambda st: sum(1 for it in st if it["t"] == "sync" and it["what"] == "stream")
ra, rb = P.simulate(a), P.simulate(b)
extra = ns(b) - ns(a)
print(("pass" if extra == 4 else "fail") + " the planted log has a stream sync more per layer: %d more (4 layers, 1 micro-batch)" % extra)
want = (rb["host_sync_wait"] - ra["host_sync_wait"]) + extra * P.SYNC_US * 1e-6
d = rb["step"] - ra["step"]
ok = d > 0 and abs(d - want) <= 1e-9 * rb["step"]
print(("pass" if ok else "fail") + " negative control: the planted syncs raise the predicted step by %.2f us = the host's extra waits "
      "+ %d x %.0f us sync latency (%.2f us)" % (d * 1e6, extra, P.SYNC_US, want * 1e6))
PY
        verdicts "$tmp/planted.txt" 2
    fi
fi
# two ranks, ZeRO-3 over the NCCL twin: one log per rank, the store's collectives on their own stream, costed
if env SIMT_WORKLOG="$tmp/z.jsonl" bash dev/mpirun.sh -np 2 "$EMU" --device cuda --model dbrx-tiny --batch 2 --seq 32 --steps 2 \
        --val-every 0 > "$tmp/z.out" 2>&1 && [ -s "$tmp/z.jsonl.0" ] && [ -s "$tmp/z.jsonl.1" ]; then
    $PY - "$tmp/z.jsonl.0" <<'PY' > "$tmp/z.txt" 2>&1
import sys
sys.path.insert(0, "dev/predict")
import predict as P
st = P.one_step(P.read_log(sys.argv[1]), 2)
cs = [it for it in st if it["t"] == "coll"]
kinds = {it["kind"] for it in cs}
ok = {"all_gather", "reduce_scatter"} <= kinds and all(it["stream"] != 0 and it["nranks"] == 2 for it in cs if it["comm"] == "shard")
print(("pass" if ok else "fail") + " ZeRO-3 on 2 ranks: rank 0's step 2 logs %d collectives (%s), the store's on a stream of their own" % (len(cs), ", ".join(sorted(kinds))))
r = P.simulate(st)
print(("pass" if r["exposed_comm"] > 0 and any(x["bound"] in ("exposed-comm", "comm (hidden)") for x in P.sinks(r)) else "fail")
      + " the prediction costs them: %.3f ms exposed communication of %.3f ms" % (r["exposed_comm"] * 1e3, r["step"] * 1e3))
PY
    verdicts "$tmp/z.txt" 2
else fail "ZeRO-3 on 2 ranks with SIMT_WORKLOG: $(tail -2 "$tmp/z.out")"; fi
# --nccl-ctas-internode: 4 ranks on 2 emulated nodes (SIMT_GPUS_PER_NODE=2), ZeRO-3 over 4 and EP 2 (an EP group in a node):
# the communicators across nodes run on 3 CTAs (the twin logs ncclConfig_t.maxCTAs as "ctas"), those within a node on
# NCCL's choice; the losses are those of the run without the flag, bit for bit; the model holds 3 SMs per collective
ctas_run() {   # ctas_run NAME [flags...]
    local name=$1; shift
    env SIMT_GPUS_PER_NODE=2 SIMT_WORKLOG="$tmp/$name.jsonl" bash dev/mpirun.sh -np 4 "$EMU" --device cuda --model dbrx-tiny --batch 1 \
        --seq 32 --steps 2 --val-every 0 --shard-group-size 4 --expert-parallel 2 --log "$tmp/$name.log.jsonl" "$@" > "$tmp/$name.out" 2>&1
}
if ctas_run c0 && ctas_run c3 --nccl-ctas-internode 3; then
    $PY - "$tmp" <<'PY' > "$tmp/ctas.txt" 2>&1
import json, sys
sys.path.insert(0, "dev/predict")
import predict as P
tmp = sys.argv[1]
for r in range(4):
    cs = [it for it in P.read_log("%s/c3.jsonl.%d" % (tmp, r)) if it["t"] == "coll"]
    across = lambda it: len({w // 2 for w in it["world_ranks"]}) > 1
    bad = [it["comm"] for it in cs if it.get("ctas") != (3 if across(it) else None)]
    comms = sorted({(it["comm"], it.get("ctas")) for it in cs}, key=str)
    print(("pass" if cs and not bad and any(across(it) for it in cs) and any(not across(it) for it in cs) else "fail")
          + " rank %d: %d collectives; those across the 2 nodes on 3 CTAs, those within one on NCCL's choice: %s%s"
          % (r, len(cs), comms, " (wrong: %s)" % sorted(set(bad)) if bad else ""))
    c0 = [it for it in P.read_log("%s/c0.jsonl.%d" % (tmp, r)) if it["t"] == "coll"]
    print(("pass" if c0 and all("ctas" not in it for it in c0) else "fail") + " rank %d without the flag: no collective capped" % r)
st = P.one_step(P.read_log("%s/c3.jsonl.0" % tmp), 2)
print(("pass" if {P.coll_ctas(it) for it in st if it["t"] == "coll" and it["nranks"] > 1} == {3, P.NCCL_CTAS} else "fail")
      + " the model: the capped collectives hold 3 SMs, the others %d" % P.NCCL_CTAS)
loss = lambda f: [(x["step"], x["loss"]) for x in map(json.loads, open(f)) if "loss" in x]
a, b = loss("%s/c0.log.jsonl" % tmp), loss("%s/c3.log.jsonl" % tmp)
print(("pass" if a and a == b else "fail") + " the losses with and without --nccl-ctas-internode 3, bit for bit: %s" % b)
PY
    verdicts "$tmp/ctas.txt" 10
else fail "--nccl-ctas-internode runs: $(tail -2 "$tmp/c0.out") $(tail -2 "$tmp/c3.out")"; fi
expect_exit 2 "--nccl-ctas-internode 33 (above NCCL's 32)" "$EMU" --device cuda --model dbrx-tiny --nccl-ctas-internode 33 --steps 1
expect_exit 2 "--nccl-ctas-internode -1" "$EMU" --device cuda --model dbrx-tiny --nccl-ctas-internode -1 --steps 1
expect_exit 2 "--nccl-ctas-internode on the CPU backend" "$EMU" --device cpu --model dbrx-tiny --nccl-ctas-internode 3 --steps 1
expect_exit 2 "SIMT_GPUS_PER_NODE=0 (the emulated ranks per node)" env SIMT_GPUS_PER_NODE=0 "$EMU" --device cuda --model dbrx-tiny \
    --shard-group-size 1 --steps 1 --val-every 0
expect_exit 2 "predict.py: a work log that is not JSON lines" $PY dev/predict/predict.py test/README.md
expect_exit 2 "predict.py --nccl-ctas 0 (1..64)" $PY dev/predict/predict.py "$tmp/base.jsonl" --nccl-ctas 0
expect_exit 2 "predict.py: an unknown device" $PY dev/predict/predict.py "$tmp/base.jsonl" --device a100
