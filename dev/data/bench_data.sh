#!/usr/bin/env bash
# bench_data.sh — the data pipeline's speed (results recorded in data/README.md):
#   1. loader tokens/s from the page cache (dev/data/bench_loader): the SOTU byte shards at
#      dbrx-tiny's shape, and 100M synthetic uint32 tokens (8 shards) at seq 2048, plain and mixed;
#   2. tokenizer MB/s: dev/data/tokenize --tokenizer cl100k (1 thread and all cores) against the
#      js-tiktoken oracle (one thread: JavaScript; its figure counts encoding only, ours includes
#      reading, JSON parsing and writing the shards) on the same text: all SOTU addresses (10.8 MB).
#   bash dev/data/bench_data.sh     (after make data; writes ~400 MB under /tmp, removed at the end)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s dev/data/bench_loader dev/data/tokenize
bash dev/data/prepare_sotu.sh >/dev/null
bash dev/data/setup_tiktoken.sh >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## loader (page cache, one rank, single thread)"
./dev/data/bench_loader --data 'data/sotu/sotu_train_*.bin' --batch 8 --seq 256 | tail -1
./dev/data/bench_loader --synthetic "$tmp" 8 12500000 >/dev/null
./dev/data/bench_loader --data "$tmp/synthetic_*.bin" --batch 8 --seq 2048 | tail -1
./dev/data/bench_loader --data "web=$tmp/synthetic_00000[0-5].bin:0.7,code=$tmp/synthetic_00000[67].bin:0.3" --batch 8 --seq 2048 | tail -1
./dev/data/bench_loader --data "$tmp/synthetic_*.bin" --batch 1 --seq 2048 --world 64 | tail -1
echo "## tokenizer (cl100k + DBRX specials), all SOTU addresses"
files=(dev/data/.cache/package/data/*.json)
cat "${files[@]}" >/dev/null
./dev/data/tokenize --tokenizer cl100k --quiet --threads 1 --json text --out-dir "$tmp/tk" --name s "${files[@]}" | tail -1
./dev/data/tokenize --tokenizer cl100k --quiet --json text --out-dir "$tmp/tk" --name s "${files[@]}" | tail -1
node dev/data/tiktoken_oracle.mjs --json text "${files[@]}"
./dev/data/tokenize --tokenizer bytes --quiet --json text --out-dir "$tmp/tb" --name s "${files[@]}" | tail -1
