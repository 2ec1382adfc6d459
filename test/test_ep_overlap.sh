#!/usr/bin/env bash
# test_ep_overlap.sh — the expert all-to-all overlapped with the experts (--ep-overlap-chunks N; parallel/expert_parallel.h's
# ep_chunk_layout, parallel/expert_parallel_cuda.cuh's chunked forward and backward), on the emulated GPU under mpirun
# (train_dbrx_emu --device cuda, the NCCL and cuBLASLt twins) and on the CPU:
#   * the same losses and gradient norms bit for bit with 1, 2 and 4 slices of each expert's rows (a chunk per expert and
#     slice; and 3 slices of 8 experts' rows): EP 2 under
#     ZeRO-3 on 2 ranks with the model's own uneven routing; every token to EP rank 0's experts (DBRX_DEBUG_ROUTE_FIRST at
#     the dropless bound: rank 1's experts receive no row, empty chunks still exchanged); --recompute moe and swiglu;
#     data parallel EP 2; the CPU (whose MPI exchange stays in one piece) with and without the flag;
#   * the bytes each rank sends in its EP group: those of one piece, the formula of test/test_ep.sh, exactly;
#   * the stream structure (test/check_comm_order.py ep_overlap on the work log): with 4 chunks most EP exchanges run
#     concurrently with an expert GEMM on another stream; with 1 chunk none does (the negative control);
#   * every rank issues its communicators in one order with chunks (check_comm_order.py order);
#   * with a rank's experts in chunks too (--zero-chunk-mib): the same losses as the unit whole, most exchanges beside
#     an expert GEMM (the exchange in the weight chunks, parallel/expert_parallel_zc.cuh), one issue order; each weight
#     chunk's exchange in 2 and 3 row slices: the same losses, the exchanges beside no GEMM (a layer's fill and drain)
#     as many with 3 slices as with 2, and under 10% of the bytes (my own rows' slices);
#   * no device allocation or free after step 1 on either rank with 4 chunks (SIMT_STEP_COUNTERS);
#   * under --fp8 block every chunk a padded FP8 layout of its own (parallel/expert_parallel_fp8.cuh): where every slice
#     of an expert's rows is whole 128-row tiles, 1 and 2 chunks bit-identical; with the model's routing step 1 and its
#     amaxes exactly, later steps within 2e-3; recomputation bit for bit; the overlap, the issue order, no allocation;
#     at 4 experts (every chunk with rows) as many exchanges hidden as BF16's, 3 exposed a layer pass: the backward's
#     last combine beside the last chunk's weight gradients;
#     under --fp8 delayed the exchange stays in one piece: the same numbers, and one note says so;
#   * --ep-capacity-factor 0.5 with 2 chunks: the scratch for the rows coming home regrown at start-up, and the buffers
#     grown in step 1 (no routing fits a plan below a rank's own rows: parallel/expert_parallel_grow.cuh), the 2-chunk
#     run's numbers bit for bit;
#   * bad values (0, 65, a word) exit 2 with one line naming the flag.
# About 40 s on 2 shared cores.
set -u
cd "$(dirname "$0")/.."
source test/lib.sh
BIN=${BIN:-./train_dbrx}
EMU=${EMU:-./train_dbrx_emu}
PY=${PY:-python3}
MPI="bash dev/mpirun.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
SMALL=(--model dbrx-tiny --n-layers 2 --d-model 64 --n-heads 2 --kv-heads 1 --experts 4 --top-k 2 --ffn-hidden 64 --seq 32 --batch 1
       --val-every 0 --steps 3)

run() {  # name, binary, env..., --, flags...: np 2, the log $tmp/name.jsonl
    local name=$1 bin=$2 envs=(); shift 2
    while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    env "${envs[@]}" timeout 300 $MPI --tag-output -np 2 "$bin" "${SMALL[@]}" "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 \
        || fail "$name: exit $?: $(grep -m2 -i error "$tmp/$name.out")"
}
no_step_allocs() {  # FILE (mpirun --tag-output, SIMT_STEP_COUNTERS, 3 steps): no device allocation or free after step 1 on ranks 0, 1
    $PY - "$1" <<'PY'
import re, sys
bad, said = [], []
for r in (0, 1):
    rows = [list(map(int, re.findall(r"(?<![a-z])\d+", l.split("simt counters:")[1])))
            for l in open(sys.argv[1]) if l.startswith("[1,%d]" % r) and "simt counters:" in l]
    if len(rows) != 6: bad.append("rank %d: %d counter lines, not 6" % (r, len(rows))); continue
    for i, row in enumerate(rows[2:], 2):   # (0: start-up; 1: step 1; 2: between steps 1 and 2; 3: step 2; 4; 5: step 3)
        if row[8] or row[9]: bad.append("rank %d: counter line %d: %d allocations, %d frees" % (r, i, row[8], row[9]))
    said.append("rank %d: %d allocations before step 1" % (r, rows[0][8]))
print("; ".join(bad) if bad else "; ".join(said))
sys.exit(1 if bad else 0)
PY
}
numbers() { grep -o '"\(loss\|grad_norm\)": [^,]*' "$tmp/$1.jsonl" | tr '\n' ' '; }
same() {  # what, names...: the losses and gradient norms of every run equal the first's
    local what=$1 first=$2; shift 2
    local a; a=$(numbers "$first")
    for b in "$@"; do
        [ -n "$a" ] && [ "$a" = "$(numbers "$b")" ] || { fail "$what: $first '$a' vs $b '$(numbers "$b")'"; return; }
    done
    pass "$what: bit-identical ($(grep -c '"loss"' "$tmp/$first.jsonl") steps, losses $(grep -o '"loss": [^,]*' "$tmp/$first.jsonl" | head -1 | cut -d' ' -f2) ...)"
}

if [ -x "$EMU" ]; then
    G=(--device cuda --expert-parallel 2)
    for c in 1 2 4; do run "c$c" "$EMU" SIMT_STEP_COUNTERS=1 SIMT_WORKLOG="$tmp/c$c.wl" -- "${G[@]}" --ep-overlap-chunks $c; done
    same "emulated GPU, EP 2 (ZeRO-3 np 2), the model's routing: 1, 2 and 4 chunks" c1 c2 c4
    run e8c1 "$EMU" -- "${G[@]}" --experts 8 --ep-overlap-chunks 1
    run e8c3 "$EMU" -- "${G[@]}" --experts 8 --ep-overlap-chunks 3
    same "emulated GPU, EP 2, 8 experts (4 per rank): 1 and 3 chunks" e8c1 e8c3
    for c in 1 4; do run "first$c" "$EMU" DBRX_DEBUG_ROUTE_FIRST=1 -- "${G[@]}" --ep-capacity-factor 0 --ep-overlap-chunks $c; done
    grep -q "ep: rank 1 sent .* 0 rows in" "$tmp/first4.out" \
        && same "emulated GPU, EP 2, every token to rank 0's experts (rank 1's receive no row): 1 and 4 chunks" first1 first4 \
        || fail "the forced imbalance: rank 1 received rows: $(grep -m1 'ep: rank 1' "$tmp/first4.out")"
    # a capacity factor below 1 plans fewer rows than a rank sends, so the chunked exchange's scratch for the rows coming
    # home grows at start-up (ep_gpu_set_chunks); no routing fits such a plan: the buffers grow in step 1 (the chunks'
    # indices with them), and the numbers are the 2-chunk run's
    run half "$EMU" -- "${G[@]}" --ep-capacity-factor 0.5 --ep-overlap-chunks 2
    grep -q "^\[1,0\]<stdout>:expert parallelism: layer 0: EP rank [01]'s experts receive [0-9]* rows, more than the 32 its buffers hold" "$tmp/half.out" \
        && same "--ep-capacity-factor 0.5 with 2 chunks (32 rows planned, 64 sent): start-up whole, grown in step 1, the 2-chunk run's numbers" c2 half \
        || fail "--ep-capacity-factor 0.5 with 2 chunks: not grown: $(grep -m2 -i "error\|grown" "$tmp/half.out")"
    for rc in moe swiglu; do
        for c in 1 2; do run "rc_${rc}_$c" "$EMU" -- "${G[@]}" --recompute $rc --ep-overlap-chunks $c; done
        same "emulated GPU, EP 2, --recompute $rc: 1 and 2 chunks (and as without recomputation)" rc_${rc}_1 rc_${rc}_2 c1
    done
    for c in 1 4; do run "dp$c" "$EMU" -- "${G[@]}" --shard-group-size 1 --ep-overlap-chunks $c; done
    same "emulated GPU, data parallel EP 2: 1 and 4 chunks" dp1 dp4

    # the bytes of the exchange: as in one piece (test/test_ep.sh's formula), on every rank
    out=$($PY - "$tmp/c1.out" "$tmp/c4.out" <<'PY'
import re, sys
d, E = 64, 4
got = [re.findall(r"ep: rank (\d+) sent (\d+) bytes in its expert-parallel group: (\d+) count messages, (\d+) rows out, (\d+) rows in",
                  open(p).read()) for p in sys.argv[1:]]
ok = all(len(g) == 2 for g in got) and sorted(got[0]) == sorted(got[1]) and all(
    int(b) == int(c) * E * 4 + 2 * d * 2 * (int(o) + int(i)) for r, b, c, o, i in got[1])
print(("pass" if ok else "fail") + " bytes in the EP group with 4 chunks = with 1 = counts x E x 4 + 2 x d x 2 x (rows out + rows in): " +
      "; ".join("rank %s %s (%s out, %s in)" % (r, b, o, i) for r, b, c, o, i in sorted(got[1])))
sys.exit(0 if ok else 1)
PY
) && pass "${out#pass }" || fail "$out"

    # the stream structure, and its negative control
    out=$($PY test/check_comm_order.py ep_overlap "$tmp/c4.wl.0" 2>&1) && pass "4 chunks: $out" || fail "4 chunks: $out"
    out=$($PY test/check_comm_order.py ep_overlap "$tmp/c1.wl.0" 2>&1); rc=$?
    [ $rc = 1 ] && grep -q "^fail only 0 of" <<<"$out" && pass "negative control, 1 chunk: $out" \
        || fail "1 chunk: the overlap check did not fail (rc $rc): $out"
    out=$($PY test/check_comm_order.py order "$tmp/c4.wl.0" "$tmp/c4.wl.1" 2>&1) && pass "4 chunks: $out" || fail "4 chunks: $out"

    # a rank's experts in chunks too (--zero-chunk-mib 0.03: its 2 experts in 2 chunks of 1, 3 x 64 x 64 x 2 B = 0.023 MiB
    # each): the exchange runs in the weight chunks (parallel/expert_parallel_zc.cuh), each chunk's combine beside the next
    # chunk's experts. Session 32's order (every combine after the last weight chunk) had 12 of 48 exchanges beside a GEMM
    run zc "$EMU" SIMT_WORKLOG="$tmp/zc.wl" -- "${G[@]}" --ep-overlap-chunks 2 --zero-chunk-mib 0.03
    grep -q "in 2 chunks of 1 expert(s) of a rank's own" "$tmp/zc.out" && same "emulated GPU, EP 2, experts in 2 chunks: as the unit whole" c2 zc \
        || fail "--zero-chunk-mib 0.03: no chunking line: $(grep -m1 'zero: a block' "$tmp/zc.out")"
    out=$($PY test/check_comm_order.py ep_overlap "$tmp/zc.wl.0" 2>&1) && pass "experts in chunks: $out" || fail "experts in chunks: $out"
    out=$($PY test/check_comm_order.py order "$tmp/zc.wl.0" "$tmp/zc.wl.1" 2>&1) && pass "experts in chunks: $out" || fail "experts in chunks: $out"

    # ... each weight chunk's exchange in --ep-overlap-chunks row slices (2 above, 3 here): the same losses; every exchange
    # the slices add runs beside an expert GEMM (as many alone with 2 slices as with 3: each layer's forward's first
    # dispatch and last combine, the backward's first dispatch, the plan's counts), and those alone are my own rows'
    # slices (chunk 0's first, the last chunk's last), under 10% of the bytes sent to the other rank (session 33's
    # first version, the weight chunks unsliced: 37% and 44%, the layer's fill and drain)
    run zc3 "$EMU" SIMT_WORKLOG="$tmp/zc3.wl" -- "${G[@]}" --ep-overlap-chunks 3 --zero-chunk-mib 0.03
    same "emulated GPU, EP 2, experts in 2 chunks, 2 and 3 slices each" c2 zc zc3
    out=$($PY - "$tmp/zc.wl.0" "$tmp/zc.wl.1" "$tmp/zc3.wl.0" <<'PY'
import sys
sys.path.insert(0, "test")
import check_comm_order as cc
res = []
for path in sys.argv[1:]:   # per log: exchanges, those beside no GEMM, their bytes to the other rank, all bytes so
    ops = cc.stream_clocks(cc.load(path))
    gemms = [o for o in ops if o[0]["t"] == "gemm"]
    ex, last = [], None
    for o in ops:
        it = o[0]
        if it["t"] != "coll" or it.get("comm") != "expert_parallel":
            continue
        if not (it.get("group", 0) and it.get("group") == last):
            ex.append([o, 0])
        last = it.get("group", 0)
        if it["kind"] == "send" and it.get("peer") != it.get("rank"):
            ex[-1][1] += it["bytes"]
    before = lambda x, y: y[3].get(x[1], 0) >= x[2]
    alone = [b for o, b in ex if not any(g[1] != o[1] and not before(o, g) and not before(g, o) for g in gemms)]
    res.append((len(ex), len(alone), sum(alone), sum(b for _, b in ex)))
said = "; ".join("%d exchanges, %d beside no GEMM, %d of %d bytes" % r for r in res)
ok = res[0][1] == res[2][1] and res[2][0] > res[0][0] and all(10 * r[2] < r[3] for r in res[:2])
print(said)
sys.exit(0 if ok else 1)
PY
) && pass "experts in chunks, sliced: the fill and drain are my own rows ($out)" || fail "experts in chunks, sliced: $out"

    # no device allocation or free after step 1 on either rank (SIMT_STEP_COUNTERS: test/test_cuda_train.sh's no_alloc)
    out=$(no_step_allocs "$tmp/c4.out") && pass "4 chunks: no device allocation or free in steps 2 and 3 ($out)" || fail "4 chunks allocate in a step: $out"

    # --fp8 block: every chunk a padded FP8 layout of its own (parallel/expert_parallel_fp8.cuh). Every token to rank 0's
    # experts 0-3 at seq 128: each receives 256 rows, 2 chunks of 128, so every 128x1 tile of the weight gradients is
    # the unchunked one's: 1 and 2 chunks bit-identical. The model's routing (slices of any length): step 1's loss and
    # every operand's amax as in one piece (the forward and the input gradients are row by row), steps 2-3 within 2e-3
    # of it (the weight gradients' tiles end at the chunks'), with 2 and 4 chunks; --recompute swiglu and moe give 2
    # chunks' numbers bit for bit, and so does --fp8-gather (the held weights are the gathered codes); most exchanges run beside an expert GEMM (as many as BF16's), one issue order, no
    # allocation in a step.
    # --fp8 delayed (per-tensor scaling) keeps the exchange in one piece: the same numbers, one note.
    F8=(--model dbrx-tiny --n-layers 2 --batch 1 --steps 3 --val-every 0 --device cuda --expert-parallel 2 --fp8-log-every 1)
    f8run() {   # name, env..., --, flags...
        local name=$1 envs=(); shift
        while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
        env "${envs[@]}" timeout 300 $MPI --tag-output -np 2 "$EMU" "${F8[@]}" "$@" --log "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1 \
            || fail "$name: exit $?: $(grep -m2 -i error "$tmp/$name.out")"
    }
    for c in 1 2; do f8run "f8first$c" DBRX_DEBUG_ROUTE_FIRST=1 -- --seq 128 --fp8 block --ep-capacity-factor 0 --ep-overlap-chunks $c; done
    grep -q "ep: rank 1 sent .* 0 rows in" "$tmp/f8first2.out" \
        && same "emulated GPU, EP 2 --fp8 block, every token to rank 0's experts (256 rows each): 1 and 2 chunks of 128 rows" f8first1 f8first2 \
        || fail "--fp8 block, the forced imbalance: rank 1 received rows: $(grep -m1 'ep: rank 1' "$tmp/f8first2.out")"
    f8run f8c1 -- --seq 64 --fp8 block --ep-overlap-chunks 1
    f8run f8c2 -- --seq 64 --fp8 block --ep-overlap-chunks 2
    f8run f8c4 SIMT_STEP_COUNTERS=1 SIMT_WORKLOG="$tmp/f8c4.wl" -- --seq 64 --fp8 block --ep-overlap-chunks 4
    for rc in swiglu moe; do f8run "f8rc_$rc" -- --seq 64 --fp8 block --ep-overlap-chunks 2 --recompute $rc; done
    f8run f8c2g -- --seq 64 --fp8 block --ep-overlap-chunks 2 --fp8-gather
    same "emulated GPU, EP 2 --fp8 block, 2 chunks: --recompute swiglu and moe, and --fp8-gather (every chunk's GEMMs on the gathered codes as they are), as without" \
        f8c2 f8rc_swiglu f8rc_moe f8c2g
    out=$($PY - "$tmp/f8c1.jsonl" "$tmp/f8c2.jsonl" "$tmp/f8c4.jsonl" <<'PY'
import json, sys
def L(p):
    loss, amax = {}, {}
    for l in open(p):
        r = json.loads(l)
        if "loss" in r: loss[r["step"]] = (r["loss"], r["grad_norm"])
        if "fp8" in r: amax[r["step"]] = {k: v["amax"] for k, v in r["fp8"].items()}
    return [loss[s] for s in sorted(loss)], amax
(a, fa), ok, said = L(sys.argv[1]), True, []
for p, c in zip(sys.argv[2:], (2, 4)):
    b, fb = L(p)
    d = max(abs(x[0] - y[0]) for x, y in zip(a[1:], b[1:])) if len(a) == len(b) == 3 else 1
    good = len(a) == len(b) == 3 and a[0][0] == b[0][0] and fa.get(1) and fa[1] == fb.get(1) and d <= 2e-3 and a[1] != b[1]
    ok &= bool(good)
    said.append("%d chunks: step 1's loss %s, its %d amaxes %s, steps 2-3 within %.1e" % (c, "equal" if a and b and a[0][0] == b[0][0] else "differs",
                len(fb.get(1, {})), "equal" if fa.get(1) == fb.get(1) else "differ", d))
print(("pass" if ok else "fail") + " emulated GPU, EP 2 --fp8 block vs 1 chunk (<= 2e-3, not equal): " + "; ".join(said))
sys.exit(0 if ok else 1)
PY
) && pass "${out#pass }" || fail "${out#fail }"
    out=$($PY test/check_comm_order.py ep_overlap "$tmp/f8c4.wl.0" 2>&1) && pass "--fp8 block, 4 chunks: $out" || fail "--fp8 block, 4 chunks: $out"
    # the same exchanges hidden as BF16's, at 4 experts (every chunk holds rows: 128 an expert, 4 slices of 32): all but
    # each layer pass's first dispatch and last combine in the forward and its first dispatch in the backward, i.e. the
    # backward's last combine beside the last chunk's weight gradients too (fp8_experts_backward_gpu's FP8_BWD_DATA,
    # then FP8_BWD_WEIGHTS; the weight gradients first: 3 more exposed a layer pass)
    f8run f8e4 SIMT_WORKLOG="$tmp/f8e4.wl" -- --seq 64 --experts 4 --fp8 block --ep-overlap-chunks 4
    f8run bfe4 SIMT_WORKLOG="$tmp/bfe4.wl" -- --seq 64 --experts 4 --ep-overlap-chunks 4
    f8n=$($PY test/check_comm_order.py ep_overlap "$tmp/f8e4.wl.0" 2>&1 | grep -o '[0-9]* of [0-9]*')
    bfn=$($PY test/check_comm_order.py ep_overlap "$tmp/bfe4.wl.0" 2>&1 | grep -o '[0-9]* of [0-9]*')
    [ -n "$f8n" ] && [ "$f8n" = "$bfn" ] && [ $(( ${bfn#* of } - ${bfn% of*} )) = 18 ] \
        && pass "--fp8 block, 4 experts, 4 slices: $f8n exchanges hidden, as BF16's: 3 exposed a layer pass (2 layers, 3 steps)" \
        || fail "--fp8 block, 4 experts, 4 slices: $f8n exchanges hidden, BF16's $bfn (18 exposed expected)"
    out=$($PY test/check_comm_order.py order "$tmp/f8c4.wl.0" "$tmp/f8c4.wl.1" 2>&1) && pass "--fp8 block, 4 chunks: $out" || fail "--fp8 block, 4 chunks: $out"
    out=$(no_step_allocs "$tmp/f8c4.out") && pass "--fp8 block, 4 chunks: no device allocation or free in steps 2 and 3 ($out)" \
        || fail "--fp8 block, 4 chunks allocate in a step: $out"
    for c in 1 2; do f8run "f8d$c" -- --seq 64 --fp8 delayed --ep-overlap-chunks $c; done
    same "emulated GPU, EP 2 --fp8 delayed: 1 and 2 chunks (the exchange in one piece)" f8d1 f8d2
    n1=$(grep -c "note: --ep-overlap-chunks" "$tmp/f8d1.out") n2=$(grep -c "note: --ep-overlap-chunks 2 has no effect with --fp8 delayed" "$tmp/f8d2.out")
    nb=$(grep -c "note: --ep-overlap-chunks" "$tmp/f8c2.out")
    [ "$n1" = 0 ] && [ "$n2" = 1 ] && [ "$nb" = 0 ] && pass "--fp8 delayed --ep-overlap-chunks 2: one note that the flag has no effect (none with 1, none under block)" \
        || fail "--ep-overlap-chunks notes: delayed $n1 with 1 chunk, $n2 with 2, block $nb (expected 0, 1, 0)"
else
    echo "skip the emulated GPU ($EMU not built)"
fi

# the CPU: the option accepted, the exchange in one piece, the same losses
if [ -x "$BIN" ]; then
    run cpu1 "$BIN" -- --expert-parallel 2 --ep-overlap-chunks 1
    run cpu4 "$BIN" -- --expert-parallel 2 --ep-overlap-chunks 4
    same "CPU, EP 2 (ZeRO-3 np 2): 1 and 4 chunks" cpu1 cpu4
    for v in 0 65 two; do
        out=$("$BIN" "${SMALL[@]}" --ep-overlap-chunks $v 2>&1); rc=$?
        [ $rc = 2 ] && [ "$(grep -c . <<<"$out")" = 1 ] && grep -q "ep-overlap-chunks" <<<"$out" && ! grep -q "unknown flag" <<<"$out" \
            && pass "--ep-overlap-chunks $v: exit 2, one line: $out" || fail "--ep-overlap-chunks $v: exit $rc: $out"
    done
else
    echo "skip the CPU build ($BIN not built)"
fi

