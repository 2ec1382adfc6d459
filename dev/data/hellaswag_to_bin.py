#!/usr/bin/env python3
"""
hellaswag_to_bin.py — writes a multiple-choice eval file for train_dbrx --eval-mc (llm.c's .bin
format, data/README.md) from HellaSwag's jsonl, for users who have it (hellaswag_val.jsonl from
https://github.com/rowanz/hellaswag; this script downloads nothing).

    dev/data/hellaswag_to_bin.py hellaswag_val.jsonl -o hellaswag_val.bin [--tokenizer bytes|cl100k]
                                 [--version auto|1|2] [--limit N]

Each line is one example: "ctx" (the context), "endings" (its completions, usually 4) and "label"
(the index of the right one). As llm.c does, the context is tokenized as it is and every ending with a
space in front (" " + ending), separately. Tokenizers: bytes (the UTF-8 bytes: dbrx-tiny's byte-level
vocabulary) and cl100k (DBRX's, through dev/data/tokenize, which must be built: make dev/data/tokenize).
--version auto writes version 1 (llm.c's uint16 words) when every token fits (< 65535) and every
example is under 64 KiB, else version 2 (uint32 words). Bad input: one line naming the file and line,
exit 2.

The writer and reader (write_mc_bin, read_mc_bin) are importable: the tests build their sets with them.
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

MAGIC = 20240522
HEADER_INTS = 256
CL100K_EOT = 100257


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def encode_example(idx, label, ctx, endings, version):
    """The words of one example (data/mc_eval.h): START, BYTES, INDEX, LABEL, C, n_ctx, ctx, then n, tokens per ending."""
    start = 0xFFFF if version == 1 else 0xFFFFFFFF
    words = [start, 0, idx & 0xFFFF if version == 1 else idx, label, len(endings), len(ctx)] + list(ctx)
    for e in endings:
        words += [len(e)] + list(e)
    words[1] = len(words) * (2 if version == 1 else 4)
    return words


def write_mc_bin(path, examples, version=None):
    """examples: [{"label": int, "ctx": [tokens], "endings": [[tokens], ...]}]; version None: 1 if it fits, else 2.
    Returns the version written. The file is written aside and renamed: never half-written."""
    def fits_v1():
        for i, ex in enumerate(examples):
            toks = list(ex["ctx"]) + [t for e in ex["endings"] for t in e]
            if any(t >= 0xFFFF for t in toks) or len(encode_example(i, ex["label"], ex["ctx"], ex["endings"], 1)) * 2 >= 1 << 16:
                return False
        return True
    if version is None:
        version = 1 if fits_v1() else 2
    elif version == 1 and not fits_v1():
        raise ValueError("version 1 holds tokens < 65535 and examples under 64 KiB: use version 2")
    streams = [encode_example(i, ex["label"], ex["ctx"], ex["endings"], version) for i, ex in enumerate(examples)]
    longest = max(s[1] for s in streams)
    header = [MAGIC, version, len(examples), longest] + [0] * (HEADER_INTS - 4)
    fmt = "<%dH" if version == 1 else "<%dI"
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        for s in streams:
            f.write(struct.pack(fmt % len(s), *s))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return version


def read_mc_bin(path):
    """(version, [{"label", "ctx", "endings"}]) of a file written by write_mc_bin or llm.c (no checks beyond the layout)."""
    data = open(path, "rb").read()
    h = struct.unpack_from("<%di" % HEADER_INTS, data, 0)
    assert h[0] == MAGIC and h[1] in (1, 2), h[:2]
    w = 2 if h[1] == 1 else 4
    code = "H" if w == 2 else "I"
    words = struct.unpack_from("<%d%s" % ((len(data) - 4 * HEADER_INTS) // w, code), data, 4 * HEADER_INTS)
    out, at = [], 0
    for _ in range(h[2]):
        label, C, n = words[at + 3], words[at + 4], words[at + 5]
        at += 6
        ctx = list(words[at:at + n]); at += n
        endings = []
        for _ in range(C):
            n = words[at]; at += 1
            endings.append(list(words[at:at + n])); at += n
        out.append({"label": label, "ctx": ctx, "endings": endings})
    return h[1], out


def tokenize_bytes(texts):
    return [list(t.encode("utf-8")) for t in texts]


def tokenize_cl100k(texts, tool):
    """Every text through dev/data/tokenize --tokenizer cl100k: one document each (end-of-text, then its tokens)."""
    if not os.access(tool, os.X_OK):
        die(f"--tokenizer cl100k: {tool} is not built (make dev/data/tokenize)")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "texts.jsonl")
        with open(src, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"t": t}) + "\n")
        r = subprocess.run([tool, "--tokenizer", "cl100k", "--out-dir", d, "--name", "mc", "--jsonl", "t",
                            "--shard-tokens", "2000000000", "--quiet", src], capture_output=True, text=True)
        if r.returncode != 0:
            die(f"dev/data/tokenize failed (exit {r.returncode}): {r.stderr.strip()}")
        toks = []
        for shard in sorted(glob.glob(os.path.join(d, "mc_train_*.bin"))):
            raw = open(shard, "rb").read()
            h = struct.unpack_from("<256i", raw, 0)
            n = h[2] | (h[4] << 32) if h[1] == 2 else h[2]
            toks += struct.unpack_from("<%d%s" % (n, "I" if h[1] == 2 else "H"), raw, 1024)
    docs = []
    for t in toks:
        if t == CL100K_EOT:
            docs.append([])
        else:
            docs[-1].append(t)
    if len(docs) != len(texts):
        die(f"dev/data/tokenize returned {len(docs)} documents for {len(texts)} texts")
    return docs


def main():
    ap = argparse.ArgumentParser(description="HellaSwag jsonl -> train_dbrx --eval-mc file (llm.c's .bin format)")
    ap.add_argument("jsonl", help="HellaSwag jsonl (ctx, endings, label per line)")
    ap.add_argument("-o", "--out", required=True, help="the .bin to write")
    ap.add_argument("--tokenizer", default="bytes", choices=["bytes", "cl100k"], help="bytes (dbrx-tiny) or cl100k (DBRX)")
    ap.add_argument("--version", default="auto", choices=["auto", "1", "2"], help="1: uint16 (llm.c), 2: uint32, auto: 1 if it fits")
    ap.add_argument("--limit", type=int, default=0, help="only the first N examples (0: all)")
    ap.add_argument("--tokenize-bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenize"),
                    help="dev/data/tokenize (for cl100k)")
    a = ap.parse_args()
    if a.limit < 0:
        die(f"--limit {a.limit} must be >= 0")
    try:
        lines = open(a.jsonl, encoding="utf-8").read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        die(f"{a.jsonl}: cannot read: {e}")
    rows = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
            ctx, endings, label = ex["ctx"], ex["endings"], ex["label"]
        except (ValueError, KeyError, TypeError) as e:
            die(f"{a.jsonl}:{no}: not an example with ctx, endings and label ({type(e).__name__}: {e})")
        if not isinstance(ctx, str) or not ctx or not isinstance(endings, list) or not endings or \
                not all(isinstance(e, str) for e in endings):
            die(f"{a.jsonl}:{no}: ctx must be a non-empty string and endings a non-empty list of strings")
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(endings):
            die(f"{a.jsonl}:{no}: label {label!r} is not an index into its {len(endings)} endings")
        rows.append((no, ctx, endings, label))
        if a.limit and len(rows) == a.limit:
            break
    if not rows:
        die(f"{a.jsonl}: no examples")
    texts = []
    for _, ctx, endings, _ in rows:
        texts.append(ctx)
        texts += [" " + e for e in endings]   # (llm.c's rendering: the ending follows the context after a space)
    toks = tokenize_bytes(texts) if a.tokenizer == "bytes" else tokenize_cl100k(texts, a.tokenize_bin)
    examples, at = [], 0
    for no, ctx, endings, label in rows:
        ctx_t = toks[at]
        end_t = toks[at + 1:at + 1 + len(endings)]
        at += 1 + len(endings)
        if not ctx_t:
            die(f"{a.jsonl}:{no}: the context has no tokens")
        examples.append({"label": label, "ctx": ctx_t, "endings": end_t})
    try:
        version = write_mc_bin(a.out, examples, None if a.version == "auto" else int(a.version))
    except ValueError as e:
        die(f"{a.out}: {e}")
    except OSError as e:
        die(f"{a.out}: cannot write: {e}")
    n_tok = sum(len(e["ctx"]) + sum(len(x) for x in e["endings"]) for e in examples)
    print(f"{a.out}: {len(examples)} examples, {n_tok} tokens ({a.tokenizer}), version {version} "
          f"({'uint16' if version == 1 else 'uint32'} words)")


if __name__ == "__main__":
    main()
