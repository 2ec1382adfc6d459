#!/usr/bin/env python3
"""check_comm_order.py — two checks on the emulator's work logs (SIMT_WORKLOG=FILE: FILE.<rank> under mpirun,
test/simt/counters.h), for test/test_comm_streams.sh.

  order LOG.0 LOG.1 ...   NCCL communicators that cannot race (NCCL user guide, "Using multiple NCCL
      communicators concurrently": every rank must issue operations on its communicators in the same order).
      Each rank's collectives, in issue order, become a sequence of (communicator, its k-th operation) — a
      communicator is its name and its world ranks; the operations of one NCCL group call on one communicator
      count as one — and for every two ranks and every two communicators they share, the two ranks' sequences
      projected onto that pair must be the same. Fails naming the ranks, the communicators and the first
      operation where they differ.
  streams LOG             the overlap of the backward's communication (parallel/zero_gpu_comm.cuh): in the
      --profile'd step, for every reduce-scatter of a unit ("reduce-scatter unit U" range), the all-gather
      issued next after it (the prefetch of unit U-2) runs on another stream and does not depend on it: no
      chain of stream order and event waits (record -> wait) leads from the reduce-scatter's collectives to the
      gather's (the backward's gathers: those issued during the optimizer, --zero-prefetch, are the next
      step's and wait for every reduce-scatter through it). Fails naming the units.
  syncs LOG               no device-wide synchronisation inside a training step (between the training loop's
      dbrx_sync marks 2k-1 and 2k: each step's begin and end), and each step ends waiting for a stream (the
      model's, which every communication stream joins before the optimizer). Fails naming the step.
  ep_overlap LOG          the expert all-to-all overlapped with the experts (--ep-overlap-chunks > 1,
      parallel/expert_parallel_cuda.cuh): of the EP group's collectives (communicator expert_parallel; one per
      NCCL group call), at least half run concurrently with a GEMM on another stream — neither depends on the
      other through stream order and event waits. With chunks C per exchange, C - 1 of each forward's C
      dispatches and C combines overlap a chunk's experts (and the backward's last combine its weight
      gradients); with one chunk none does (the negative control). Fails with the counts.
  prefetch LOG            the next step's first items gathered during the optimizer (--zero-prefetch,
      parallel/zero_gpu_comm.cuh): in the --profile'd step, the optimizer runs in two launches, at least one
      all-gather of a unit is issued between them, each such gather's collectives wait for the first launch
      (through stream order and event waits) and not for the second (they run beside it), and the step's forward
      gathered none of those items again before its first kernel (the previous step's optimizer had). Fails
      naming what is missing (with --zero-prefetch 0: the optimizer in one launch).
  cp_ring LOG             context parallelism's ring on the GPU (parallel/context_parallel_cuda.cuh): every K|V hop (a
      grouped send/recv on the "context" communicator) runs concurrently with a chunk pair's flash kernel on another
      stream and a later pair's kernel waits for it (an event), in the forward and the backward; the backward's dK|dV
      hops are waited for by an add and all but each layer's last run beside a pair. Fails with the counts (the
      all-gather form, DBRX_DEBUG_PLANT=cp_all_gather: no hop).
  rc_prefetch LOG         the recompute's block gathered ahead (--recompute moe/block under ZeRO-3,
      parallel/zero_gpu_comm.cuh's zero_gpu_rc_prefetch): in the --profile'd step's backward, for every layer l
      below the last that recomputes ("layer l recompute"), the all-gather of its block (unit 2l+1) is issued
      before layer l+1's experts' first GEMM (two units ahead of its use: when their unit begins, or with the
      experts in chunks, --zero-chunk-mib, when their first chunk does), and its collectives do not wait for any
      kernel or GEMM of layer l+1's backward proper (its experts, router and attention; its
      recompute, which read the slot before, may be waited for) (stream order and event waits). Fails naming the layer
      (DBRX_DEBUG_PLANT=no_rc_prefetch: gathered when the recompute begins, after layer l+1's attention).
  head_ahead LOG           the head gathered ahead (the vocabulary slot under ZeRO-3, parallel/zero_gpu_vocab.cuh): in the
      --profile'd step's forward, the all-gathers of the head unit (2L + 1) are issued after the embedding's forward and
      before layer 0 begins, run on another stream than the blocks' gathers, wait for no kernel or GEMM of the layers
      (stream order and event waits), and no kernel or GEMM of the layers waits for them (the head's forward does).
      Fails naming what is missing (DBRX_DEBUG_PLANT=no_head_ahead: gathered by the last block's prefetch).
  replica_overlap LOG      HSDP on the GPU: at least half of the replica group's all-reduces of the gradient shard run
      concurrently with a GEMM on another stream (each unit's part as its last reduce-scatter ends,
      parallel/zero_gpu_comm.cuh); DBRX_DEBUG_PLANT=replica_at_end (the shard at once after the backward) fails it.
Exit 0 with "pass ..." lines, 1 with "fail ..." lines.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def comm_sequence(items):
    """[(comm id, k, kind)] in issue order; one entry per NCCL group call per communicator. A group of sends and
    receives of a rank to itself only (an exchange chunk whose rows all stay on this rank: no peer has rows for it,
    and a peer with no rows in that chunk at all issues nothing) is left out: it waits for no other rank, so it
    cannot take part in a cross-communicator hang, and its peers have no operation to match it with."""
    seq, count, last_group, last_call, calls = [], {}, {}, {}, []
    for it in items:
        if it.get("t") != "coll":
            continue
        cid = (it["comm"], tuple(it["world_ranks"]))
        g = it.get("group", 0)
        own = it["kind"] in ("send", "recv") and it.get("peer") == it.get("rank")
        if g and last_group.get(cid) == g:
            calls[last_call[cid]][2] = calls[last_call[cid]][2] and own   # (the rest of one group call: one operation)
            continue
        last_group[cid], last_call[cid] = g, len(calls)
        calls.append([cid, "group" if g else it["kind"], own])
    for cid, kind, own in calls:
        if own:
            continue
        k = count.get(cid, 0)
        count[cid] = k + 1
        seq.append((cid, k, kind))
    return seq


def check_order(paths):
    seqs = {r: comm_sequence(load(p)) for r, p in enumerate(paths)}
    bad = []
    for a in seqs:
        for b in seqs:
            if b <= a:
                continue
            shared = sorted({c for c, _, _ in seqs[a] if a in c[1] and b in c[1]} & {c for c, _, _ in seqs[b]})
            for i, A in enumerate(shared):
                for B in shared[i + 1:]:
                    pa = [x for x in seqs[a] if x[0] in (A, B)]
                    pb = [x for x in seqs[b] if x[0] in (A, B)]
                    if pa != pb:
                        j = next((j for j, (x, y) in enumerate(zip(pa, pb)) if x != y), min(len(pa), len(pb)))
                        name = lambda x: "%s#%d (%s)" % (x[0][0], x[1], x[2]) if x else "nothing"
                        bad.append("ranks %d and %d issue communicators %s and %s in another order: operation %d is %s on rank %d, "
                                   "%s on rank %d" % (a, b, A[0], B[0], j, name(pa[j] if j < len(pa) else None), a,
                                                      name(pb[j] if j < len(pb) else None), b))
    n = sum(len(s) for s in seqs.values())
    if bad:
        for x in bad[:5]:
            print("fail " + x)
        return 1
    print("pass %d ranks, %d operations: every two ranks issue every two shared communicators in the same order" % (len(seqs), n))
    return 0


def check_streams(path):
    unit_range = {}   # stream -> the unit range open on it ("reduce-scatter unit U" / "all-gather unit U")
    rs, ag = [], []   # (unit, stream, index on its stream, clock) of each collective inside a unit range
    profiled = optimizer = False
    for it, s, p, c in stream_clocks(load(path), with_ranges=True):
        if profiled and it.get("t") == "kernel" and it["name"].startswith("adamw_fused_kernel"):
            optimizer = True   # (gathers from here on are the next step's, --zero-prefetch: they wait for every
            continue           # reduce-scatter through the optimizer by design; the check "prefetch" has them)
        if optimizer:
            continue
        if it.get("t") == "range":
            name = it["name"]
            profiled = True
            if name.startswith(("reduce-scatter unit ", "all-gather unit ")):
                unit_range[it["stream"]] = name if it["ph"] == "B" else None
        elif it.get("t") == "coll" and profiled and unit_range.get(s):
            name = unit_range[s]
            (rs if name.startswith("reduce") else ag).append((int(name.split()[-1]), s, p, c, len(rs) + len(ag)))
    if not rs:
        print("fail no reduce-scatter of a unit in %s's profiled step (run with --profile and a shard group)" % path)
        return 1
    bad, checked, seen = [], 0, set()
    for u, s, p, c, order in rs:
        if u in seen:
            continue   # (one check per unit: its first collective; the later ones depend on it anyway)
        seen.add(u)
        nxt = next((g for g in ag if g[4] > order), None)
        if nxt is None:
            continue   # (the last units of the backward: nothing gathered after them)
        checked += 1
        gu, gs, gp, gc, _ = nxt
        if gs == s:
            bad.append("the reduce-scatter of unit %d and the all-gather of unit %d issued after it share stream %d" % (u, gu, s))
        elif gc.get(s, 0) >= p:
            bad.append("the all-gather of unit %d (stream %d) waits for the reduce-scatter of unit %d (stream %d)" % (gu, gs, u, s))
    if not checked:
        print("fail no all-gather issued after a reduce-scatter in %s" % path)
        return 1
    if bad:
        for x in bad[:5]:
            print("fail " + x)
        return 1
    print("pass %d reduce-scatters: each on its own stream, and the all-gather issued next after it does not wait for it" % checked)
    return 0


def stream_clocks(items, with_ranges=False):
    """[(item, stream, position on it, vector clock)] of the kernels, GEMMs, collectives and copies, in issue order
    (a vector clock per stream: {stream: its items known done}; with_ranges: the range items too, as (item, None, None, None))"""
    clock, events, pos, out = {}, {}, {}, []
    for it in items:
        t = it.get("t")
        if t == "range" and with_ranges:
            out.append((it, None, None, None))
            continue
        if t not in ("kernel", "gemm", "coll", "copy", "record", "wait"):
            continue
        s = it.get("stream", 0)
        c = clock.setdefault(s, {})
        if t == "record":
            events[it["event"]] = dict(c)
            continue
        if t == "wait":
            for k, v in events.get(it["event"], {}).items():
                c[k] = max(c.get(k, 0), v)
            continue
        pos[s] = pos.get(s, 0) + 1
        c[s] = pos[s]
        out.append((it, s, pos[s], dict(c)))
    return out


def check_ep_overlap(path):
    ops = stream_clocks(load(path))
    colls, last_group = [], None
    for o in ops:
        it = o[0]
        if it["t"] == "coll" and it.get("comm") == "expert_parallel":
            g = it.get("group", 0)
            if g and g == last_group:
                continue   # (one NCCL group call: one exchange)
            last_group = g
            colls.append(o)
    if not colls:
        print("fail no expert-parallel collective in %s (run with --expert-parallel on the emulated GPU)" % path)
        return 1
    return half_beside_gemms(ops, colls, "expert-parallel exchanges run concurrently with an expert GEMM on another stream")


def half_beside_gemms(ops, colls, what):
    """passes when at least half of colls run concurrently with a GEMM of ops on another stream (neither ordered before
    the other by stream order and event waits)"""
    gemms = [o for o in ops if o[0]["t"] == "gemm"]
    before = lambda x, y: y[3].get(x[1], 0) >= x[2]   # x is done before y starts
    overlapped = sum(1 for c in colls if any(g[1] != c[1] and not before(c, g) and not before(g, c) for g in gemms))
    said = "%d of %d %s" % (overlapped, len(colls), what)
    if 2 * overlapped < len(colls):
        print("fail only " + said)
        return 1
    print("pass " + said)
    return 0


def check_replica_overlap(path):
    """HSDP on the GPU (parallel/zero_gpu_comm.cuh, zero_gpu_replica_reduce): of the replica group's all-reduces of the
    gradient shard (communicator "replica"), at least half run concurrently with a GEMM on another stream (neither
    ordered before the other by stream order and event waits): each unit's part summed as its last reduce-scatter
    ends, beside the rest of the backward; the shard at once after the backward (DBRX_DEBUG_PLANT=replica_at_end)
    runs beside none"""
    ops = stream_clocks(load(path))
    colls = [o for o in ops if o[0]["t"] == "coll" and o[0].get("comm") == "replica" and o[0]["kind"] == "all_reduce"]
    if not colls:
        print("fail no all-reduce in the replica group in %s (run HSDP, --shard-group-size < ranks, on the emulated GPU)" % path)
        return 1
    return half_beside_gemms(ops, colls, "all-reduces in the replica group run concurrently with a GEMM on another stream")


def check_cp_ring(path):
    """context parallelism's ring on the GPU (parallel/context_parallel_cuda.cuh): every forward K|V hop (a grouped
    send/recv on the "context" communicator) runs concurrently with a forward chunk pair's flash kernel on another stream
    (neither ordered before the other by stream order and event waits) and a later pair's kernel waits for it (an event);
    in the backward likewise every K|V hop with the backward's pair kernels, and every dK|dV hop (twice a K|V hop's
    bytes) is waited for by an add (cp_add_f32_kernel) and runs beside a backward pair except the last of each layer's
    (n - 2 of its n - 1: nothing is left to compute beside it)"""
    ops = stream_clocks(load(path))
    hops, last_group = [], None
    for o in ops:
        it = o[0]
        if it["t"] == "coll" and it.get("comm") == "context" and it["kind"] in ("send", "recv"):
            g = it.get("group", 0)
            if g and g == last_group:
                continue   # (one NCCL group call: one hop)
            last_group = g
            hops.append(o)
    kern = lambda o, pre: o[0]["t"] == "kernel" and o[0]["name"].startswith(pre)
    fpairs = [o for o in ops if kern(o, "flash_attention_forward_cp_kernel")]
    bpairs = [o for o in ops if kern(o, "flash_attention_backward5_cp_kernel")]
    adds = [o for o in ops if kern(o, "cp_add_f32_kernel")]
    before = lambda x, y: y[3].get(x[1], 0) >= x[2]   # x is done before y starts
    beside = lambda c, ks: any(p[1] != c[1] and not before(c, p) and not before(p, c) for p in ks)
    waited = lambda c, ks: any(before(c, p) for p in ks)
    # a hop's phase: that of the next chunk-pair kernel issued after it (the ops are in issue order)
    idx = {id(o): i for i, o in enumerate(ops)}
    def phase(c):
        nxt = [o for o in ops[idx[id(c)] + 1:] if kern(o, "flash_attention_forward_cp_kernel") or kern(o, "flash_attention_backward5_cp_kernel")
               or kern(o, "cp_add_f32_kernel")]
        return "fwd" if nxt and kern(nxt[0], "flash_attention_forward_cp_kernel") else "bwd"
    fh = [c for c in hops if phase(c) == "fwd"]
    bh = [c for c in hops if phase(c) == "bwd"]
    small = min((c[0]["count"] * c[0]["elem_bytes"] for c in hops), default=0)
    bkv = [c for c in bh if c[0]["count"] * c[0]["elem_bytes"] == small]
    bg = [c for c in bh if c[0]["count"] * c[0]["elem_bytes"] == 2 * small]
    n = hops[0][0]["nranks"] if hops else 0
    res = [("forward K|V hops", fh, sum(beside(c, fpairs) for c in fh), len(fh), sum(waited(c, fpairs) for c in fh)),
           ("backward K|V hops", bkv, sum(beside(c, bpairs) for c in bkv), len(bkv), sum(waited(c, bpairs) for c in bkv)),
           ("backward dK|dV hops", bg, sum(beside(c, bpairs) for c in bg), len(bg) * (n - 2) // max(n - 1, 1), sum(waited(c, adds) for c in bg))]
    what = "; ".join("%s: %d of %d beside a chunk pair (want %d), %d waited for" % (w, b, len(hs), want, wt) for w, hs, b, want, wt in res)
    ok = bool(fh) and bool(bkv) and bool(bg) and len(bkv) + len(bg) == len(bh) and len(bg) == len(bkv)
    ok = ok and all(b >= want and wt == len(hs) for _, hs, b, want, wt in res)
    print(("pass " if ok else "fail ") + what)
    return 0 if ok else 1


def check_syncs(path):
    items = load(path)
    marks = [i for i, it in enumerate(items) if it.get("t") == "mark" and it.get("name") == "dbrx_sync"]
    steps = [(marks[i], marks[i + 1]) for i in range(0, len(marks) - 1, 2)]
    if not steps:
        print("fail no training step (dbrx_sync marks) in %s" % path)
        return 1
    bad = []
    for k, (a, b) in enumerate(steps):
        syncs = [it for it in items[a + 1:b] if it.get("t") == "sync"]
        dev = sum(1 for it in syncs if it.get("what") == "device")
        if dev:
            bad.append("step %d synchronises the whole device %d time(s)" % (k + 1, dev))
        if not (b > 0 and items[b - 1].get("t") == "sync" and items[b - 1].get("what") == "stream"):
            bad.append("step %d does not end waiting for a stream" % (k + 1))
    if bad:
        for x in bad[:5]:
            print("fail " + x)
        return 1
    print("pass %d steps: no device-wide synchronisation inside a step; each ends waiting for the model's stream" % len(steps))
    return 0


def check_prefetch(path):
    ops = stream_clocks(load(path), with_ranges=True)
    start = next((i for i, o in enumerate(ops) if o[1] is None), None)
    if start is None:
        print("fail no --profile'd step in %s" % path)
        return 1
    ops = ops[start:]
    adamw = [i for i, o in enumerate(ops) if o[1] is not None and o[0]["t"] == "kernel" and o[0]["name"].startswith("adamw_fused_kernel")]
    if len(adamw) < 2:
        print("fail the optimizer ran in %d launch(es) in %s's profiled step: nothing of the next step gathered during it" % (len(adamw), path))
        return 1
    a1, a2 = ops[adamw[0]], ops[adamw[-1]]
    open_range, pref, bad = {}, [], []
    for it, s, p, c in ops[adamw[0] + 1:adamw[-1]]:
        if s is None:
            if it["name"].startswith("all-gather unit "):
                open_range[it["stream"]] = it["name"][len("all-gather "):] if it["ph"] == "B" else None
            continue
        if it["t"] == "coll" and open_range.get(s):
            name = open_range[s]
            if name not in pref:
                pref.append(name)
            if c.get(a1[1], 0) < a1[2]:
                bad.append("the all-gather of %s does not wait for the optimizer's first launch" % name)
            if c.get(a2[1], 0) >= a2[2]:
                bad.append("the all-gather of %s waits for the optimizer's second launch" % name)
    if not pref:
        print("fail no all-gather of a unit issued between the optimizer's two launches in %s" % path)
        return 1
    first = next(i for i, o in enumerate(ops) if o[1] is not None and o[0]["t"] in ("kernel", "gemm"))
    again = [o[0]["name"][len("all-gather "):] for o in ops[:first]
             if o[1] is None and o[0]["name"].startswith("all-gather unit ") and o[0]["ph"] == "B"]
    bad += ["the forward gathered %s again before its first kernel" % u for u in again if u in pref]
    if bad:
        for x in bad[:5]:
            print("fail " + x)
        return 1
    print("pass %s gathered during the optimizer (beside its second launch), not again by the forward" % ", ".join(pref))
    return 0


def profiled_from(path, phase):
    """the log's items with their stream clocks from the --profile'd step's `phase` range on (None, said: no such range)"""
    ops = stream_clocks(load(path), with_ranges=True)
    i = next((i for i, o in enumerate(ops) if o[1] is None and o[0]["name"] == phase and o[0]["ph"] == "B"), None)
    if i is None:
        print("fail no --profile'd %s in %s" % (phase, path))
        return None
    return ops[i:]


def check_rc_prefetch(path):
    ops = profiled_from(path, "backward")
    if ops is None:
        return 1
    layer_begin, gathers, compute = {}, {}, {}   # range name -> index; unit -> [(index, clock)]; layer -> [(stream, pos)]
    cur, open_gather, cur_range, first_gemm = None, {}, None, {}   # first_gemm: layer -> index of its experts' first GEMM
    for i, (it, s, p, c) in enumerate(ops):
        if s is None:
            n = it["name"]
            if n.startswith("layer ") and it["ph"] == "B":
                layer_begin.setdefault(n, i)
                cur = None if n.endswith(" recompute") else int(n.split()[1])   # (its recompute is before, and may be waited for)
                cur_range = n
            elif n.startswith("all-gather unit "):
                open_gather[it["stream"]] = int(n.split()[2]) if it["ph"] == "B" else None
            continue
        if it["t"] == "coll" and open_gather.get(s) is not None:
            gathers.setdefault(open_gather[s], []).append((i, c))
        elif it["t"] in ("kernel", "gemm") and cur is not None:
            compute.setdefault(cur, []).append((s, p))
            if it["t"] == "gemm" and cur_range == "layer %d experts" % cur:
                first_gemm.setdefault(cur, i)
    rec = sorted(int(n.split()[1]) for n in layer_begin if n.endswith(" recompute"))
    L = 1 + max((int(n.split()[1]) for n in layer_begin), default=-1)
    checked, bad = [], []
    for l in (x for x in rec if x + 1 < L):
        u, e = 2 * l + 1, layer_begin.get("layer %d experts" % (l + 1))
        first = gathers.get(u, [])   # (experts in chunks, --zero-chunk-mib: issued by their first chunk, before its GEMMs)
        if e is None or not first or first[0][0] > first_gemm.get(l + 1, e):
            bad.append("layer %d's block (unit %d) is not gathered before layer %d's experts compute" % (l, u, l + 1))
            continue
        g = first[0][1]
        if any(g.get(s, 0) >= p for s, p in compute.get(l + 1, [])):
            bad.append("the gather of layer %d's block (unit %d) waits for layer %d's backward" % (l, u, l + 1))
            continue
        checked.append(l)
    if not rec or (not checked and not bad):
        print("fail no layer below the last recomputes in %s's backward" % path)
        return 1
    for x in bad[:5]:
        print("fail " + x)
    if bad:
        return 1
    print("pass the blocks of layers %s gathered before the experts of the layer above compute, beside its backward" % checked)
    return 0


def check_head_ahead(path):
    ops = profiled_from(path, "forward")
    if ops is None:
        return 1
    def at(name):
        return next((i for i, o in enumerate(ops) if o[1] is None and o[0]["name"] == name and o[0]["ph"] == "B"), None)
    l0, head = at("layer 0 attention"), at("lm_head + loss")
    L = len({o[0]["name"].split()[1] for o in ops[:head or 0] if o[1] is None and o[0]["name"].startswith("layer ")})
    if l0 is None or head is None or not L:
        print("fail no layer or no head in %s's profiled forward" % path)
        return 1
    H, open_gather, colls, gstreams, layers = 2 * L + 1, {}, [], set(), []
    for i, (it, s, p, c) in enumerate(ops[:head]):
        if s is None:
            if it["name"].startswith("all-gather unit "):
                open_gather[it["stream"]] = int(it["name"].split()[2]) if it["ph"] == "B" else None
            continue
        if it["t"] == "coll" and open_gather.get(s) is not None:
            if open_gather[s] == H:
                colls.append((i, s, p, c))
            else:
                gstreams.add(s)
        elif it["t"] in ("kernel", "gemm") and i > l0:
            layers.append((s, p, c))
    bad = []
    if not colls:
        bad.append("the head (unit %d) is not gathered in the forward before its own forward" % H)
    bad += ["the head's all-gather is issued after layer 0 begins" for i, s, p, c in colls[:1] if i > l0]
    bad += ["the head's all-gather runs on the blocks' gather stream %d" % s for i, s, p, c in colls[:1] if s in gstreams]
    bad += ["the head's all-gather waits for a layer's compute" for i, s, p, c in colls
            if any(c.get(ks, 0) >= kp for ks, kp, kc in layers)][:1]
    bad += ["a layer's compute waits for the head's all-gather" for ks, kp, kc in layers
            if any(kc.get(s, 0) >= p for i, s, p, c in colls)][:1]
    if bad:
        for x in bad:
            print("fail " + x)
        return 1
    print("pass the head's %d all-gather(s) issued after the embedding's forward, before layer 0, on their own stream, beside "
          "the %d layers' forward (neither waits for the other)" % (len(colls), L))
    return 0


if __name__ == "__main__":
    modes = {"order": lambda a: check_order(a), "streams": lambda a: check_streams(a[0]), "syncs": lambda a: check_syncs(a[0]),
             "ep_overlap": lambda a: check_ep_overlap(a[0]), "prefetch": lambda a: check_prefetch(a[0]),
             "cp_ring": lambda a: check_cp_ring(a[0]), "rc_prefetch": lambda a: check_rc_prefetch(a[0]),
             "head_ahead": lambda a: check_head_ahead(a[0]), "replica_overlap": lambda a: check_replica_overlap(a[0])}
    if len(sys.argv) < 3 or sys.argv[1] not in modes:
        print("usage: check_comm_order.py order LOG.0 LOG.1 ... | streams LOG | syncs LOG | ep_overlap LOG | prefetch LOG | cp_ring LOG | rc_prefetch LOG | head_ahead LOG | replica_overlap LOG", file=sys.stderr)
        sys.exit(2)
    sys.exit(modes[sys.argv[1]](sys.argv[2:]))
