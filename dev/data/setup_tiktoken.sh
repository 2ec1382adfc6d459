#!/usr/bin/env bash
# setup_tiktoken.sh — installs the reference tokenizer js-tiktoken (pinned; MIT) from the npm
# registry into dev/data/.cache (git-ignored) and writes its cl100k_base ranks there as
# dev/data/.cache/cl100k_base.tiktoken, which dev/data/tokenize --tokenizer cl100k reads.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=dev/data/.cache
version=1.0.21
if [ -f "$cache/cl100k_base.tiktoken" ] && grep -q "\"version\": \"$version\"" "$cache/node_modules/js-tiktoken/package.json" 2>/dev/null; then
    exit 0
fi
command -v npm >/dev/null || { echo "error: npm not found: run 'make deps-test' (Debian package npm)"; exit 1; }
mkdir -p "$cache"
npm install --prefix "$cache" --no-audit --no-fund --no-save --silent "js-tiktoken@$version"
node dev/data/tiktoken_oracle.mjs --write-ranks "$cache/cl100k_base.tiktoken"
