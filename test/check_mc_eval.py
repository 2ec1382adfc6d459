#!/usr/bin/env python3
"""
check_mc_eval.py — the independent side of test/test_mc_eval.sh: the rows of data/README.md's rule
written again in Python, and the scores recomputed from the model's logits.

  make-check-set SHARD OUT.bin ROWS.bin --seq T
      two examples from a byte-level shard's text that take every path of the row rule: a context
      longer than the row (cut from the left), completions of several lengths, one longer than T
      (cut to its first T tokens); and ROWS.bin, a validation shard whose first 2R windows hold the
      R rows (row r in window 2r: a row may fill all T + 1 tokens of its window, and windows overlap by
      one token), for train_dbrx --dump-logits.
  rescore OUT.bin LOGITS.safetensors DUMP.jsonl --seq T --tol X
      every completion's summed loss from the dumped logits (float64 log-softmax) against
      --eval-mc-dump's, the token counts, and the acc / acc_norm decisions. Prints pass/fail lines.
  same DUMP_A DUMP_B --step S --tol X
      two dumps of the same evaluation (step S) agree: every sum within X (relative), every decision.
"""
import argparse
import json
import os
import random
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "data"))
from hellaswag_to_bin import read_mc_bin, write_mc_bin  # noqa: E402

verdicts = []


def check(ok, what):
    verdicts.append(ok)
    print(("pass " if ok else "fail ") + what)


def row(ctx, end, T):
    """The documented rule: s = context + completion, at most T + 1 tokens; a completion longer than T
    keeps its first T tokens, the context keeps its last T + 1 - len(completion) (at least 1)."""
    end = end[:T]
    ctx = ctx[-(T + 1 - len(end)):]
    return ctx + end, len(ctx) - 1, len(end)   # the tokens, the first scored position, the count


def read_safetensors(path):
    buf = open(path, "rb").read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    dt = {"F32": np.float32, "I32": np.int32}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(buf[8 + n + b:8 + n + e], dtype=dt[t["dtype"]]).reshape(t["shape"])
    return out


def make_check_set(a):
    raw = open(a.shard, "rb").read()
    h = struct.unpack_from("<256i", raw, 0)
    toks = [t for t in struct.unpack_from("<%dH" % h[2], raw, 1024)[:200000] if t != 256]
    rng = random.Random(7)
    T = a.seq
    letters = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz "]
    p = 1000
    ex0 = {"label": 2, "ctx": toks[p:p + T + 36],
           "endings": [[rng.choice(letters) for _ in range(16)] for _ in range(4)]}
    ex0["endings"][2] = toks[p + T + 36:p + T + 52]
    q = 5000
    lens = [5, 16, T + 6, 9]
    ex1 = {"label": 1, "ctx": toks[q:q + 20], "endings": [toks[q + 20 + 100 * i:q + 20 + 100 * i + n] for i, n in enumerate(lens)]}
    write_mc_bin(a.out, [ex0, ex1], 1)
    rows = [row(ex["ctx"], e, T)[0] for ex in (ex0, ex1) for e in ex["endings"]]
    stream = [0] * (2 * len(rows) * T + 1)
    for r, s in enumerate(rows):
        assert len(s) <= T + 1
        stream[2 * r * T:2 * r * T + len(s)] = s
    header = [20240520, 1, len(stream), 2] + [0] * 252
    with open(a.rows, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(stream), *stream))
    print(f"{a.out}: 2 examples, {len(rows)} rows; {a.rows}: {len(rows)} rows in even windows of {T} + 1 tokens")


def last_step(path):
    rows = [json.loads(l) for l in open(path)]
    s = max(r["step"] for r in rows)
    return {r["example"]: r for r in rows if r["step"] == s}, s


def rescore(a):
    T = a.seq
    _, examples = read_mc_bin(a.mcbin)
    st = read_safetensors(a.logits)
    logits = st["logits"].astype(np.float64)
    dump, step = last_step(a.dump)
    r = 0
    for i, ex in enumerate(examples):
        sums, counts = [], []
        for e in ex["endings"]:
            s, first, n = row(ex["ctx"], e, T)
            lg = logits[2 * r]   # row r was in window 2r
            assert list(st["inputs"][2 * r][:len(s) - 1]) == s[:-1], "the dumped batch's inputs are not the row"
            z = lg - lg.max(axis=1, keepdims=True)
            lse = np.log(np.exp(z).sum(axis=1))
            tgt = s[1:]
            sums.append(sum(lse[t] - z[t, tgt[t]] for t in range(first, first + n)))
            counts.append(n)
            r += 1
        d = dump[i]
        rel = max(abs(x - y) / abs(y) for x, y in zip(d["sum"], sums))
        print(f"   example {i}: label {ex['label']}, counts {counts}, summed losses ours {['%.5f' % x for x in d['sum']]}, "
              f"recomputed {['%.5f' % x for x in sums]}: max relative difference {rel:.2e}")
        check(d["count"] == counts, f"example {i}: token counts {d['count']} are the row rule's {counts}")
        check(rel <= a.tol, f"example {i}: every completion's summed loss equals the recomputation from the logits "
                            f"({rel:.1e} <= {a.tol:g})")
        means = [x / n for x, n in zip(sums, counts)]
        check(d["pred"] == int(np.argmin(sums)) and d["pred_norm"] == int(np.argmin(means)) and d["label"] == ex["label"],
              f"example {i}: acc picks the lowest total ({d['pred']}), acc_norm the lowest mean per token ({d['pred_norm']})")
    print(f"   (the dump's evaluation at step {step})")


def same(a):
    A = {(r["step"], r["example"]): r for r in map(json.loads, open(a.a))}
    B = {(r["step"], r["example"]): r for r in map(json.loads, open(a.b))}
    ka = sorted(k for k in A if k[0] == a.step)
    kb = sorted(k for k in B if k[0] == a.step)
    check(ka == kb and len(ka) > 0, f"both dumps score the same {len(ka)} examples at step {a.step}")
    worst, decisions = 0.0, True
    for k in ka:
        x, y = A[k], B[k]
        worst = max([worst] + [abs(p - q) / max(abs(q), 1e-30) for p, q in zip(x["sum"], y["sum"])])
        decisions &= x["pred"] == y["pred"] and x["pred_norm"] == y["pred_norm"] and x["count"] == y["count"]
    check(worst <= a.tol, f"every summed loss agrees within {a.tol:g} (largest relative difference {worst:.1e})")
    check(decisions, "every decision (acc, acc_norm) and token count is the same")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-check-set"); p.add_argument("shard"); p.add_argument("out"); p.add_argument("rows")
    p.add_argument("--seq", type=int, required=True)
    p = sub.add_parser("rescore"); p.add_argument("mcbin"); p.add_argument("logits"); p.add_argument("dump")
    p.add_argument("--seq", type=int, required=True); p.add_argument("--tol", type=float, required=True)
    p = sub.add_parser("same"); p.add_argument("a"); p.add_argument("b"); p.add_argument("--step", type=int, required=True)
    p.add_argument("--tol", type=float, required=True)
    a = ap.parse_args()
    {"make-check-set": make_check_set, "rescore": rescore, "same": same}[a.cmd](a)
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
