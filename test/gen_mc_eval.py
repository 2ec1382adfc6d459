#!/usr/bin/env python3
"""
gen_mc_eval.py — a multiple-choice set whose right answers are known by construction, from a byte-level
token shard (the State of the Union validation text): the context is CTX bytes of the text, the right
completion the next END bytes, the wrong ones END random lowercase letters and spaces (in-alphabet,
so only a model that learned the text's statistics tells them apart). The label's place is random.

    test/gen_mc_eval.py SHARD OUT.bin [--n 40] [--ctx 48] [--end 16] [--completions 4] [--seed 1] [--version 1|2]
"""
import argparse
import os
import random
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "data"))
from hellaswag_to_bin import write_mc_bin  # noqa: E402

EOT = 256


def shard_tokens(path):
    raw = open(path, "rb").read()
    h = struct.unpack_from("<256i", raw, 0)
    assert h[0] == 20240520 and h[1] == 1, "a version-1 (uint16) shard"
    return struct.unpack_from("<%dH" % h[2], raw, 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shard")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=48)
    ap.add_argument("--end", type=int, default=16)
    ap.add_argument("--completions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--version", type=int, default=None)
    a = ap.parse_args()
    toks = shard_tokens(a.shard)
    rng = random.Random(a.seed)
    span = a.ctx + a.end
    stride = (len(toks) - span) // a.n
    alphabet = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz "]
    examples = []
    for i in range(a.n):
        p = i * stride
        while EOT in toks[p:p + span]:   # no document boundary inside an example
            p += span
        ctx, right = list(toks[p:p + a.ctx]), list(toks[p + a.ctx:p + span])
        wrong = [[rng.choice(alphabet) for _ in range(a.end)] for _ in range(a.completions - 1)]
        label = rng.randrange(a.completions)
        endings = wrong[:label] + [right] + wrong[label:]
        examples.append({"label": label, "ctx": ctx, "endings": endings})
    v = write_mc_bin(a.out, examples, a.version)
    print(f"{a.out}: {a.n} examples, {a.completions} completions, context {a.ctx}, completion {a.end} tokens, version {v}")


if __name__ == "__main__":
    main()
