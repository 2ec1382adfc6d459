#!/usr/bin/env python3
"""tokenize_bytes.py — byte-level tokenizer: each document becomes <|endoftext|> (256) followed by
its UTF-8 bytes (0..255), written as llm.c-format shards (256 x int32 header: magic 20240520,
version 1, token count; then uint16 tokens). Every --val-every-th document (in sorted file order)
goes to the validation split. Standard library only.

  tokenize_bytes.py --out-dir data/x --name x [--json-field text] [--val-every 10] FILES...
"""
import argparse, array, json, os, struct, sys

EOT = 256
MAGIC, VERSION = 20240520, 1
SHARD_TOKENS = 1 << 22


def write_shard(path, tokens):
    header = struct.pack("<256i", MAGIC, VERSION, len(tokens), *([0] * 253))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:  # written aside and renamed: never a half-written shard
        f.write(header)
        f.write(array.array("H", tokens).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--json-field", default=None, help="read this field of a JSON object per file")
    ap.add_argument("--val-every", type=int, default=10)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    splits = {"train": [], "val": []}
    for i, path in enumerate(sorted(a.files)):
        try:
            with open(path, "rb") as f:
                raw = f.read()
            text = json.loads(raw)[a.json_field].encode("utf-8") if a.json_field else raw
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"error: {path}: {e}")
        splits["val" if i % a.val_every == 0 else "train"].append(text)
    for split, docs in splits.items():
        tokens = array.array("H")
        for d in docs:
            tokens.append(EOT)
            tokens.extend(d)
        for s in range(0, max(len(tokens), 1), SHARD_TOKENS):
            path = os.path.join(a.out_dir, f"{a.name}_{split}_{s // SHARD_TOKENS:06d}.bin")
            write_shard(path, tokens[s:s + SHARD_TOKENS])
        print(f"{split}: {len(docs)} documents, {len(tokens):,} tokens -> {a.out_dir}/{a.name}_{split}_*.bin")


if __name__ == "__main__":
    main()
