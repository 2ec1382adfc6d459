#!/usr/bin/env python3
"""check_shapes_log.py — a shapes-only work log (SIMT_SHAPES_ONLY=1, test/simt/simt.h) against the work log of the same
run computed for real: the step-time model (dev/predict) may only predict from shapes-only runs if they ask the device
for the same work as the real step.

  check_shapes_log.py NAME [--fp8] REAL.jsonl SHAPES.jsonl [REAL.jsonl.1 SHAPES.jsonl.1 ...]   (a pair per rank)

One verdict line per check and rank, step 2 of each log ("pass ..." / "fail ..."):
  - the same sequence of kernels, copies, collectives, events and syncs (each with its stream, communicator, grid,
    block, shared memory, integer arguments, byte counts): every host decision that shapes the step took the same path.
    Floating-point arguments are values, not shapes (e.g. AdamW's clipping factor, from the gradient norm), and are
    left out; so are the numbers that follow the routing, which the shapes-only run takes balanced: the items between
    a layer's routing and its combine whose sizes differ (listed), and the expert GEMMs;
  - the GEMMs outside the experts: the same shapes, types and order;
  - the expert GEMMs, summed over the ranks given (under expert parallelism a rank computes the rows it receives, which
    the routing decides): the same FLOPs in total for every (m, types, transposes, beta) class (the rows sum to N k per
    rank in both runs; only how they split over experts and ranks differs). Whether an expert's w1 and v1 GEMMs go as
    one batched call (model/moe.cuh, pair_strides) depends on the buffers' addresses, so the batch count is not
    compared: under expert parallelism today's regrown buffers (cudaFree/cudaMalloc mid-step) change it per layer. With --fp8 the padded layouts differ (each expert's rows
    padded), so only the FLOPs' ratio is bounded (within the padding: 1 + 16 E / R).
"""
import sys

sys.path.insert(0, "dev/predict")
import predict as P  # noqa: E402


def shape_of(it):
    d = {k: v for k, v in it.items() if k not in ("args", "flops", "n", "k")}
    d["args"] = [a for a in it.get("args", []) if not isinstance(a, float)]
    return d


def sections(items):
    """the routed section of each layer: from its router forward kernel to its moe_combine_forward_kernel (forward),
    and from moe_combine_backward_kernel to its router backward kernel (backward): the expert GEMMs live there
    (router_forward_kernel / router_backward_kernel, or their _warp_kernel forms for E <= 32)"""
    inside, out = False, []
    for it in items:
        nm = it.get("name", "")
        if nm.startswith(("router_forward_kernel", "router_forward_warp_kernel", "moe_combine_backward_kernel")):
            inside = True
        out.append(inside)
        if nm.startswith(("moe_combine_forward_kernel", "router_backward_kernel", "router_backward_warp_kernel")):
            inside = False
    return out


def signature(it):
    return (it["t"], it.get("name"), it.get("kind"), it.get("stream"), it.get("comm"), it.get("event"), it.get("what"))


def expert_classes(items, sec, into):
    for it, f in zip(items, sec):
        if it["t"] == "gemm" and f:
            key = (it["m"], it["a"], it["b"], it["d"], it["trans_a"], it["trans_b"], it["beta"] != 0)
            into[key] = into.get(key, 0) + it["flops"]


def check_rank(name, real, shapes, ca, cb):
    sr, ss = sections(real), sections(shapes)
    nongemm = lambda items: [it for it in items if it["t"] != "gemm"]
    seq_r, seq_s = [signature(it) for it in nongemm(real)], [signature(it) for it in nongemm(shapes)]
    ok = seq_r == seq_s
    first = next((i for i, (a, b) in enumerate(zip(seq_r, seq_s)) if a != b), min(len(seq_r), len(seq_s)))
    print(("pass" if ok else "fail") + " %s: the same %d kernels, copies, collectives, events and syncs in the same order%s"
          % (name, len(seq_r), "" if ok else " (%d vs %d; first difference at %d: %s vs %s)" % (
              len(seq_r), len(seq_s), first, seq_r[first:first + 1], seq_s[first:first + 1])))
    if not ok:
        return
    routed_r = [f for it, f in zip(real, sr) if it["t"] != "gemm"]
    differ, routed_differ = [], set()
    for it_r, it_s, inside in zip(nongemm(real), nongemm(shapes), routed_r):
        if shape_of(it_r) != shape_of(it_s):
            if inside:
                routed_differ.add(it_r.get("name") or it_r.get("kind"))
            else:
                differ.append((it_r, it_s))
    print(("pass" if not differ else "fail") + " %s: every size outside the routed sections equal (grids, integer arguments, "
          "bytes)%s%s" % (name, "" if not differ else ": %d differ, e.g. %s vs %s" % (len(differ), differ[0][0], differ[0][1]),
                          "; routed items sized by the routing: " + ", ".join(sorted(routed_differ)) if routed_differ else ""))
    g_out = lambda items, sec: [shape_of(it) for it, f in zip(items, sec) if it["t"] == "gemm" and not f]
    a, b = g_out(real, sr), g_out(shapes, ss)
    print(("pass" if a == b and a else "fail") + " %s: the %d GEMMs outside the experts: the same shapes, types and order"
          % (name, len(a)))
    expert_classes(real, sr, ca)
    expert_classes(shapes, ss, cb)


def main():
    name, rest = sys.argv[1], sys.argv[2:]
    fp8 = "--fp8" in rest
    logs = [p for p in rest if p != "--fp8"]
    if len(logs) < 2 or len(logs) % 2:
        sys.exit("usage: check_shapes_log.py NAME [--fp8] REAL SHAPES [REAL SHAPES ...]")
    ca, cb = {}, {}
    for r in range(len(logs) // 2):
        real, shapes = (P.one_step(P.read_log(p), 2) for p in logs[2 * r:2 * r + 2])
        check_rank("%s%s" % (name, " rank %d" % r if len(logs) > 2 else ""), real, shapes, ca, cb)
    ranks = "summed over %d ranks" % (len(logs) // 2) if len(logs) > 2 else "one rank"
    if not fp8:
        ok = ca == cb and ca
        print(("pass" if ok else "fail") + " %s: the expert GEMMs' FLOPs per class equal (%s; %d classes, %.4g vs %.4g FLOPs): "
              "the balanced routing moves rows between experts, never adds or drops any"
              % (name, ranks, len(ca), sum(ca.values()), sum(cb.values())))
    else:
        ra, rb = sum(ca.values()), sum(cb.values())
        ok = set(ca) == set(cb) and ra > 0 and 0.5 < rb / ra < 2.0
        print(("pass" if ok else "fail") + " %s: the expert GEMMs: the same classes, FLOPs %.4g vs %.4g (%s; padded layouts)"
              % (name, ra, rb, ranks))


if __name__ == "__main__":
    main()
