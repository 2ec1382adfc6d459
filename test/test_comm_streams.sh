#!/usr/bin/env bash
# test_comm_streams.sh — the device store's communication streams and communicators (parallel/zero_gpu_comm.cuh),
# on the SIMT emulator under mpirun (train_dbrx_emu --device cuda, the NCCL twin), from the work logs
# (SIMT_WORKLOG, with --profile's unit ranges on step 2) that test/check_comm_order.py reads:
#   * the overlap: every reduce-scatter of a unit runs on another stream than the all-gather issued next after
#     it (the backward's prefetch), and that gather does not depend on it through any chain of stream order and
#     event waits; ZeRO-3 on 2 ranks, EP 2 with ZeRO-3 on 4; negative control: DBRX_DEBUG_PLANT=serial_streams
#     (the gather stream waits for the reduce-scatter stream, the old one-stream schedule's ordering) fails it;
#   * communicators that cannot race: every two ranks issue every two communicators they share in the same
#     order (ZeRO-3 np 2, HSDP 2x2, EP 2 + ZeRO-3 np 4: shard, shard_rs, replica, expert_parallel, expert_shard,
#     expert_shard_rs); negative control: DBRX_DEBUG_PLANT=reorder_issue (world rank 1 issues its backward
#     prefetch after the unit's reduce-scatter) fails it; also with EP's exchange in 2 chunks (--ep-overlap-chunks 2,
#     whose exchanges run beside the experts: check_comm_order.py ep_overlap);
#   * HSDP 2x2: each unit's gradient shard summed over the replicas as its last reduce-scatter ends, beside the
#     backward (check_comm_order.py replica_overlap), the same losses as at once (also with --grad-accum 2, where only
#     the last micro-batch's backward sums them); negative control:
#     DBRX_DEBUG_PLANT=replica_at_end (the shard at once after the backward) fails it;
#   * no device-wide synchronisation inside a step (each step ends waiting for the model's stream); negative
#     control: the same work log with a device synchronisation planted in step 2 fails it;
#   * the next step's first units gathered during the optimizer (--zero-prefetch, default 2): between the optimizer's two
#     launches, beside the second, and not gathered again by the next forward; ZeRO-3 np 2, and 1 item; negative
#     control: --zero-prefetch 0 (the optimizer in one launch) fails it;
#   * the recompute's block gathered two units ahead (--recompute moe under ZeRO-3, zero_gpu_rc_prefetch): in the
#     backward, layer l's block is gathered before layer l+1's experts compute and beside layer l+1's backward;
#     ZeRO-3 np 2, HSDP 2x2, EP 2 + ZeRO-3 np 4, and EP 2 with a rank's experts in chunks (--zero-chunk-mib: the gather
#     issued by their first chunk; its exchanges beside the experts, one issue order); negative control:
#     DBRX_DEBUG_PLANT=no_rc_prefetch fails it (unit whole and chunks);
#   * the head gathered ahead (the vocabulary slot, --zero-chunk-mib 0.02: parallel/zero_gpu_vocab.cuh): in the forward the
#     head's all-gathers are issued after the embedding's forward and before layer 0, on the reduce-scatter stream, and
#     neither they nor the layers' compute wait for the other; ZeRO-3 np 2, HSDP 2x2, EP 2 + ZeRO-3 np 4, each with one
#     issue order of the communicators; negative control: DBRX_DEBUG_PLANT=no_head_ahead fails it; the losses
#     bit-identical with and without it and to the units whole (the runs above);
#   * the schedule changes no number: the losses of the planted schedules (serialised; reordered) and of
#     --zero-prefetch 0 and 1 are bit-identical to the overlapped one's; with --recompute moe, with and without
#     the recompute slot's gather ahead and without recomputation, on ZeRO-3 np 2, HSDP 2x2 and EP 2.
# About 45 s on 2 shared cores (2 min under load).
set -u
cd "$(dirname "$0")/.."
source test/lib.sh
PY=${PY:-python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
G=(--model dbrx-tiny --n-layers 2 --seq 32 --steps 2 --val-every 0 --batch 1 --profile "$tmp/prof.json" --profile-steps 2:2)

runp() {  # name, np, flags...: the emulated GPU under mpirun, its work log $tmp/name.wl.<rank>
    local name=$1 np=$2; shift 2
    SIMT_WORKLOG="$tmp/$name.wl" $MPI -np "$np" ./train_dbrx_emu --device cuda "${G[@]}" "$@" --log "$tmp/$name.jsonl" \
        > "$tmp/$name.out" 2>&1 || fail "$name: $(grep -v '^step' "$tmp/$name.out" | tail -3)"
}
check() {  # expect (pass|fail), what, check_comm_order.py arguments...
    local want=$1 what=$2; shift 2
    local out; out=$($PY test/check_comm_order.py "$@" 2>&1); local rc=$?
    if [ "$want" = pass ]; then [ $rc = 0 ] && pass "$what: ${out#pass }" || fail "$what: $out"
    else [ $rc = 1 ] && grep -q '^fail ' <<<"$out" && pass "$what fails as it must: $(head -1 <<<"$out")" || fail "$what: the check did not fail (rc $rc): $out"; fi
}
losses() { grep -o '"loss": [^,]*' "$tmp/$1.jsonl" | tr '\n' ' '; }

for v in -1 3; do   # (one working slot per prefetched unit: at most 2)
    expect_exit 2 "--zero-prefetch $v refused" ./train_dbrx_emu --model dbrx-tiny --zero-prefetch "$v" --dry-run
    echo "$LAST_ERR" | grep -q -- "--zero-prefetch $v must be in \[0, 2\]" || fail "--zero-prefetch $v: the error does not name the flag: $LAST_ERR"
done
runp zero2 2 --shard-group-size 2
runp hsdp 4 --shard-group-size 2
runp ep2 4 --shard-group-size 4 --expert-parallel 2 --ep-overlap-chunks 1
runp ep2c 4 --shard-group-size 4 --expert-parallel 2 --ep-overlap-chunks 2
runp pf0 2 --shard-group-size 2 --zero-prefetch 0
runp pf1 2 --shard-group-size 2 --zero-prefetch 1
runp rc 2 --shard-group-size 2 --recompute moe
runp rch 4 --shard-group-size 2 --recompute moe
runp rce 4 --shard-group-size 4 --expert-parallel 2 --ep-overlap-chunks 1 --recompute moe
DBRX_DEBUG_PLANT=no_rc_prefetch runp rcoff 2 --shard-group-size 2 --recompute moe
DBRX_DEBUG_PLANT=no_rc_prefetch runp rceoff 4 --shard-group-size 4 --expert-parallel 2 --ep-overlap-chunks 1 --recompute moe
runp rcz 2 --shard-group-size 2 --expert-parallel 2 --zero-chunk-mib 0.2 --recompute moe   # (a rank's 8 experts in 8 chunks)
DBRX_DEBUG_PLANT=no_rc_prefetch runp rczoff 2 --shard-group-size 2 --expert-parallel 2 --zero-chunk-mib 0.2 --recompute moe
DBRX_DEBUG_PLANT=serial_streams runp serial 2 --shard-group-size 2
DBRX_DEBUG_PLANT=reorder_issue runp reorder 2 --shard-group-size 2
DBRX_DEBUG_PLANT=replica_at_end runp hsdp_end 4 --shard-group-size 2
runp hsdp_acc 4 --shard-group-size 2 --grad-accum 2
DBRX_DEBUG_PLANT=replica_at_end runp hsdp_acc_end 4 --shard-group-size 2 --grad-accum 2

check pass "ZeRO-3 np 2: the backward's reduce-scatters beside the gathers" streams "$tmp/zero2.wl.0"
check pass "EP 2 + ZeRO-3 np 4: the backward's reduce-scatters beside the gathers" streams "$tmp/ep2.wl.0"
check fail "the planted serialisation (DBRX_DEBUG_PLANT=serial_streams)" streams "$tmp/serial.wl.0"
check pass "ZeRO-3 np 2: one issue order of the communicators" order "$tmp/zero2.wl.0" "$tmp/zero2.wl.1"
check pass "HSDP 2x2: one issue order of the communicators" order "$tmp"/hsdp.wl.{0,1,2,3}
# HSDP: each unit's gradient shard summed over the replicas right after its last reduce-scatter, beside the backward
# (parallel/zero_gpu_comm.cuh, zero_gpu_replica_reduce); at once after the backward (the planted control) beside nothing;
# the same losses (2 replicas: a + b either way)
check pass "HSDP 2x2: the replicas' sums beside the backward" replica_overlap "$tmp/hsdp.wl.0"
check fail "the shard summed over the replicas after the backward (DBRX_DEBUG_PLANT=replica_at_end)" replica_overlap "$tmp/hsdp_end.wl.0"
[ -n "$(losses hsdp)" ] && [ "$(losses hsdp)" = "$(losses hsdp_end)" ] && pass "HSDP 2x2: the same losses with the replicas' sums unit by unit or at once ($(losses hsdp))" \
    || fail "HSDP 2x2: the losses differ unit by unit '$(losses hsdp)' and at once '$(losses hsdp_end)'"
# with 2 micro-batches only the last one's backward sums them (the first's part would be counted R times)
[ -n "$(losses hsdp_acc)" ] && [ "$(losses hsdp_acc)" = "$(losses hsdp_acc_end)" ] \
    && pass "HSDP 2x2, --grad-accum 2: the same losses unit by unit in the last micro-batch or at once ($(losses hsdp_acc))" \
    || fail "HSDP 2x2, --grad-accum 2: the losses differ unit by unit '$(losses hsdp_acc)' and at once '$(losses hsdp_acc_end)'"
check pass "EP 2 + ZeRO-3 np 4: one issue order of the communicators" order "$tmp"/ep2.wl.{0,1,2,3}
check pass "EP 2 + ZeRO-3 np 4, the exchange in 2 chunks (--ep-overlap-chunks): one issue order of the communicators" order "$tmp"/ep2c.wl.{0,1,2,3}
check pass "EP 2 + ZeRO-3 np 4, 2 chunks: the exchanges beside the experts" ep_overlap "$tmp/ep2c.wl.2"
check fail "the planted reordering on rank 1 (DBRX_DEBUG_PLANT=reorder_issue)" order "$tmp/reorder.wl.0" "$tmp/reorder.wl.1"
grep -q 'shard_rs' "$tmp/ep2.wl.0" && grep -q 'expert_shard_rs' "$tmp/ep2.wl.0" \
    && pass "EP 2 + ZeRO-3: the reduce-scatters go to their own communicators (shard_rs, expert_shard_rs)" \
    || fail "EP 2 + ZeRO-3: no reduce-scatter on shard_rs / expert_shard_rs in the work log"

check pass "ZeRO-3 np 2: the next step's first 2 items gathered during the optimizer" prefetch "$tmp/zero2.wl.1"
check pass "ZeRO-3 np 2, --zero-prefetch 1: the next step's first item gathered during the optimizer" prefetch "$tmp/pf1.wl.0"
check fail "--zero-prefetch 0 (nothing gathered during the optimizer)" prefetch "$tmp/pf0.wl.0"
check pass "ZeRO-3 np 2, --zero-prefetch 1: one issue order of the communicators" order "$tmp/pf1.wl.0" "$tmp/pf1.wl.1"
check pass "ZeRO-3 np 2, --recompute moe: the recompute's block gathered ahead" rc_prefetch "$tmp/rc.wl.1"
check pass "HSDP 2x2, --recompute moe: the recompute's block gathered ahead" rc_prefetch "$tmp/rch.wl.2"
check pass "EP 2 + ZeRO-3 np 4, --recompute moe: the recompute's block gathered ahead" rc_prefetch "$tmp/rce.wl.3"
check fail "the recompute's block gathered when it begins (DBRX_DEBUG_PLANT=no_rc_prefetch)" rc_prefetch "$tmp/rcoff.wl.0"
check pass "EP 2 + ZeRO-3 np 2, experts in chunks (--zero-chunk-mib), --recompute moe: the recompute's block gathered ahead" rc_prefetch "$tmp/rcz.wl.1"
check fail "... with the experts in chunks, gathered when it begins (DBRX_DEBUG_PLANT=no_rc_prefetch)" rc_prefetch "$tmp/rczoff.wl.0"
check pass "EP 2 + ZeRO-3 np 2, experts in chunks, --recompute moe: one issue order of the communicators" order "$tmp/rcz.wl.0" "$tmp/rcz.wl.1"
check pass "EP 2 + ZeRO-3 np 2, experts in chunks, --recompute moe: the exchanges beside the experts" ep_overlap "$tmp/rcz.wl.0"
check pass "ZeRO-3 np 2, --recompute moe: one issue order of the communicators" order "$tmp/rc.wl.0" "$tmp/rc.wl.1"
check pass "EP 2 + ZeRO-3 np 4, --recompute moe: one issue order of the communicators" order "$tmp"/rce.wl.{0,1,2,3}
check pass "ZeRO-3 np 2: the step's synchronisations" syncs "$tmp/zero2.wl.0"
check pass "EP 2 + ZeRO-3 np 4: the step's synchronisations" syncs "$tmp/ep2.wl.1"
check pass "EP 2 + ZeRO-3 np 4, 2 chunks: the step's synchronisations" syncs "$tmp/ep2c.wl.1"
awk '/"mark".*"n":3/ { print; print "{\"t\":\"sync\",\"what\":\"device\",\"stream\":0}"; next } { print }' "$tmp/zero2.wl.0" > "$tmp/planted_sync.wl"
check fail "a device synchronisation planted in step 2's work log" syncs "$tmp/planted_sync.wl"

[ -n "$(losses ep2)" ] && [ "$(losses ep2)" = "$(losses ep2c)" ] && pass "EP 2 + ZeRO-3 np 4: losses bit-identical with the exchange in 2 chunks ($(losses ep2))" \
    || fail "EP 2 + ZeRO-3 np 4: losses differ with 2 chunks: '$(losses ep2)' vs '$(losses ep2c)'"
a=$(losses zero2); b=$(losses serial); c=$(losses reorder); p0=$(losses pf0); p1=$(losses pf1)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ "$a" = "$p0" ] && [ "$a" = "$p1" ] \
    && pass "losses bit-identical: overlapped, serialised and reordered schedules, --zero-prefetch 0, 1 and 2 ($a)" \
    || fail "losses differ between schedules: overlapped '$a', serialised '$b', reordered '$c', --zero-prefetch 0 '$p0', 1 '$p1'"
r=$(losses rc); r0=$(losses rcoff); rh=$(losses rch); h=$(losses hsdp); re=$(losses rce); re0=$(losses rceoff); e=$(losses ep2)
[ -n "$r" ] && [ "$r" = "$r0" ] && [ "$r" = "$a" ] && [ "$rh" = "$h" ] && [ -n "$re" ] && [ "$re" = "$re0" ] && [ "$re" = "$e" ] \
    && pass "losses bit-identical with --recompute moe, its block gathered ahead or not, and without recomputation (ZeRO-3 $r; HSDP 2x2 $rh; EP 2 $re)" \
    || fail "--recompute moe: losses differ: ZeRO-3 '$r' / not ahead '$r0' / none '$a'; HSDP '$rh' / none '$h'; EP 2 '$re' / not ahead '$re0' / none '$e'"
z=$(losses rcz); z0=$(losses rczoff)
[ -n "$z" ] && [ "$z" = "$z0" ] && pass "EP 2, experts in chunks, --recompute moe: losses bit-identical with the block gathered ahead or not ($z)" \
    || fail "EP 2, experts in chunks, --recompute moe: losses differ: ahead '$z' / not '$z0'"

# the head gathered ahead into the vocabulary slot (--zero-chunk-mib 0.02: dbrx-tiny's vocabulary in 5 chunks of 80 rows)
runp head 2 --shard-group-size 2 --zero-chunk-mib 0.02
runp headh 4 --shard-group-size 2 --zero-chunk-mib 0.02
runp heade 4 --shard-group-size 4 --expert-parallel 2 --ep-overlap-chunks 1 --zero-chunk-mib 0.02
DBRX_DEBUG_PLANT=no_head_ahead runp headoff 2 --shard-group-size 2 --zero-chunk-mib 0.02
grep -q "vocabulary slot of" "$tmp/head.out" || fail "--zero-chunk-mib 0.02: the run has no vocabulary slot (the test's premise)"
check pass "ZeRO-3 np 2: the head gathered ahead" head_ahead "$tmp/head.wl.1"
check pass "HSDP 2x2: the head gathered ahead" head_ahead "$tmp/headh.wl.2"
check pass "EP 2 + ZeRO-3 np 4: the head gathered ahead" head_ahead "$tmp/heade.wl.3"
check fail "the head gathered by the last block's prefetch (DBRX_DEBUG_PLANT=no_head_ahead)" head_ahead "$tmp/headoff.wl.0"
check pass "ZeRO-3 np 2, the head ahead: one issue order of the communicators" order "$tmp"/head.wl.{0,1}
check pass "HSDP 2x2, the head ahead: one issue order of the communicators" order "$tmp"/headh.wl.{0,1,2,3}
check pass "EP 2 + ZeRO-3 np 4, the head ahead: one issue order of the communicators" order "$tmp"/heade.wl.{0,1,2,3}
v=$(losses head); v0=$(losses headoff); vh=$(losses headh); ve=$(losses heade)
[ -n "$v" ] && [ "$v" = "$v0" ] && [ "$v" = "$(losses zero2)" ] && [ "$vh" = "$(losses hsdp)" ] && [ "$ve" = "$(losses ep2)" ] \
    && pass "losses bit-identical with the head gathered ahead or not, and to the units whole (ZeRO-3 $v; HSDP 2x2 $vh; EP 2 $ve)" \
    || fail "the head ahead: losses differ: ZeRO-3 '$v' / not ahead '$v0' / whole '$(losses zero2)'; HSDP '$vh' / '$(losses hsdp)'; EP 2 '$ve' / '$(losses ep2)'"
