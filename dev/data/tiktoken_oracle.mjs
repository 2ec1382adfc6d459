// tiktoken_oracle.mjs — the reference tokenizer of the tests and benchmarks: js-tiktoken (pinned in
// dev/data/setup_tiktoken.sh, installed into dev/data/.cache) with cl100k_base plus DBRX's added
// special tokens. It never reads anything of ours but the input text.
//   node dev/data/tiktoken_oracle.mjs --write-ranks OUT.tiktoken
//        writes js-tiktoken's cl100k_base ranks as a .tiktoken file ("BASE64 RANK" per line)
//   node dev/data/tiktoken_oracle.mjs [--jsonl FIELD | --json FIELD] [--allow-special] --out OUT.u32 FILES...
//        the same documents as dev/data/tokenize (files in sorted order, end-of-text before each
//        document), written as little-endian uint32; prints the encoding throughput
import { readFileSync, writeFileSync, renameSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, ".cache", "node_modules", "js-tiktoken", "dist");
const { Tiktoken } = await import(join(pkg, "lite.js"));
const ranks = (await import(join(pkg, "ranks", "cl100k_base.js"))).default;
const DBRX_SPECIALS = { "<|pad|>": 100277, "<|im_start|>": 100278, "<|im_end|>": 100279 };
const EOT = 100257;

const args = process.argv.slice(2);
let out = null, jsonl = null, json = null, allowSpecial = false, writeRanks = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--write-ranks") writeRanks = args[++i];
  else if (a === "--out") out = args[++i];
  else if (a === "--jsonl") jsonl = args[++i];
  else if (a === "--json") json = args[++i];
  else if (a === "--allow-special") allowSpecial = true;
  else files.push(a);
}

if (writeRanks) {   // the compressed js-tiktoken form: lines "! OFFSET TOKEN TOKEN ..." (base64 tokens)
  const lines = [];
  for (const row of ranks.bpe_ranks.split("\n").filter(Boolean)) {
    const [, offset, ...tokens] = row.split(" ");
    tokens.forEach((t, k) => lines.push(`${t} ${Number.parseInt(offset, 10) + k}`));
  }
  writeFileSync(writeRanks + ".tmp", lines.join("\n") + "\n");
  renameSync(writeRanks + ".tmp", writeRanks);
  console.log(`wrote ${lines.length} ranks to ${writeRanks}`);
  process.exit(0);
}

const enc = new Tiktoken(ranks, DBRX_SPECIALS);
const docs = [];
for (const f of files.sort()) {
  const text = readFileSync(f, "utf8");
  if (json) docs.push(JSON.parse(text)[json]);
  else if (jsonl) for (const line of text.split("\n")) { if (line.trim() !== "") docs.push(JSON.parse(line)[jsonl]); }
  else docs.push(text);
}
let bytes = 0;
for (const d of docs) bytes += Buffer.byteLength(d, "utf8");
const t0 = process.hrtime.bigint();
const tokens = [];
for (const d of docs) {
  tokens.push(EOT);
  for (const t of (allowSpecial ? enc.encode(d, "all") : enc.encode(d, [], []))) tokens.push(t);
}
const dt = Number(process.hrtime.bigint() - t0) / 1e9;
if (out) writeFileSync(out, Buffer.from(new Uint32Array(tokens).buffer));
console.log(`js-tiktoken: ${docs.length} documents, ${(bytes / 1e6).toFixed(2)} MB, ${tokens.length} tokens in ${dt.toFixed(2)} s: ${(bytes / 1e6 / dt).toFixed(2)} MB/s (1 thread)`);
