/*
 * mc_eval.h — multiple-choice evaluation sets (HellaSwag and the like) in llm.c's .bin format: the
 * file reader, the rows the model scores, and the decision per example. The scoring loop itself
 * (forward passes, distributed over ranks) is evaluate_mc in train_dbrx.cu. Spec: data/README.md.
 *
 * File: a header of 256 little-endian int32, then the examples.
 *   h[0] magic 20240522, h[1] version, h[2] number of examples, h[3] bytes of the longest example.
 *   version 1 (llm.c's, read unchanged): every field and token below is a uint16;
 *   version 2 (ours, for vocabularies beyond 16 bits: DBRX's 100352): every one is a uint32.
 * Example i, a stream of words (uint16 or uint32):
 *   START (all ones: 65535 or 2^32-1), BYTES (of the whole example, START included), INDEX (= i,
 *   modulo 2^16 in version 1), LABEL (the correct completion), C (completions),
 *   n_ctx, the context's n_ctx tokens, then C times: n, the completion's n tokens.
 *
 * Rows: completion c of an example is one row of the batch: the sequence s = context + completion,
 * inputs s[0 .. len-2], targets s[1 .. len-1], so the completion's tokens are the targets at positions
 * n_ctx - 1 .. len - 2 (the last context token predicts the first completion token). A row holds T
 * inputs, so len may be at most T + 1: a longer one loses context tokens from the left (the most
 * recent context kept, at least one token); a completion longer than T keeps its first T tokens.
 * The rest of the row is padding (the set's own text: mc_filler), which the causal model never lets the scored
 * positions see.
 */
#pragma once
#include <sys/stat.h>
#include <string>
#include <vector>
#include "../model/common.h"

#define MC_MAGIC 20240522
#define MC_HEADER_INTS 256

typedef struct { int64_t off; int len; } McSpan;   // tokens [off, off + len) of McSet::tok
typedef struct {
    int label;
    McSpan ctx;
    std::vector<McSpan> endings;
} McExample;

typedef struct {
    std::string path;
    int version;                  // 1: uint16 words (llm.c), 2: uint32
    int64_t longest_bytes;        // h[3]
    std::vector<int> tok;         // every example's tokens, back to back
    std::vector<McExample> ex;
    int64_t rows;                 // completions over all examples
    int min_completions, max_completions;
} McSet;

// *err = the message and the byte offset it is about; returns false (for `return mc_bad(...)`)
__attribute__((format(printf, 3, 4))) static inline bool mc_bad(std::string* err, size_t off, const char* fmt, ...) {
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    *err = std::string(m) + " (byte offset " + std::to_string(off) + ")";
    return false;
}

// Parses a whole file's bytes; on bad input returns false with *err naming the byte offset.
static inline bool mc_parse(const uint8_t* b, size_t size, int vocab, McSet* s, std::string* err) {
    const size_t H = MC_HEADER_INTS * 4;
    if (size < H) return mc_bad(err, 0, "too short for the %zu-byte header: %zu bytes", H, size);
    int32_t h[MC_HEADER_INTS];
    memcpy(h, b, H);
    if (h[0] != MC_MAGIC) return mc_bad(err, 0, "bad magic %d (a multiple-choice eval file has %d; a token shard has 20240520)", h[0], MC_MAGIC);
    if (h[1] != 1 && h[1] != 2) return mc_bad(err, 4, "unsupported version %d (1: uint16 tokens, llm.c's; 2: uint32)", h[1]);
    if (h[2] <= 0) return mc_bad(err, 8, "%d examples (needs at least one)", h[2]);
    s->version = h[1];
    s->longest_bytes = h[3];
    const size_t W = s->version == 1 ? 2 : 4;   // bytes per word
    const uint64_t START = s->version == 1 ? 0xFFFFull : 0xFFFFFFFFull;
    auto word = [&](size_t off) -> uint64_t {
        if (W == 2) { uint16_t v; memcpy(&v, b + off, 2); return v; }
        uint32_t v; memcpy(&v, b + off, 4); return v;
    };
    s->tok.clear();
    s->ex.clear();
    s->rows = 0;
    s->min_completions = INT32_MAX;
    s->max_completions = 0;
    size_t at = H;
    for (int i = 0; i < h[2]; i++) {
        if (size - at < 6 * W) return mc_bad(err, at, "example %d: the file ends inside its header (truncated?)", i);
        if (word(at) != START) return mc_bad(err, at, "example %d: no start marker (%llu, expected %llu)", i, (unsigned long long)word(at),
                                          (unsigned long long)START);
        uint64_t bytes = word(at + W), index = word(at + 2 * W), label = word(at + 3 * W), C = word(at + 4 * W);
        if (bytes < 7 * W || bytes % W) return mc_bad(err, at + W, "example %d: a length of %llu bytes is impossible", i, (unsigned long long)bytes);
        if (bytes > size - at) return mc_bad(err, at + W, "example %d: %llu bytes, only %zu left in the file (truncated?)", i,
                                          (unsigned long long)bytes, size - at);
        if (s->longest_bytes > 0 && (int64_t)bytes > s->longest_bytes)
            return mc_bad(err, at + W, "example %d: %llu bytes, more than the header's longest example (%lld)", i, (unsigned long long)bytes,
                       (long long)s->longest_bytes);
        if (index != (uint64_t)(s->version == 1 ? (i & 0xFFFF) : i))
            return mc_bad(err, at + 2 * W, "example %d: its index field says %llu", i, (unsigned long long)index);
        if (C < 1 || C > 4096) return mc_bad(err, at + 4 * W, "example %d: %llu completions (1 to 4096)", i, (unsigned long long)C);
        if (label >= C) return mc_bad(err, at + 3 * W, "example %d: label %llu, but %llu completions", i, (unsigned long long)label,
                                   (unsigned long long)C);
        size_t end = at + bytes;
        at += 5 * W;
        McExample e;
        e.label = (int)label;
        // the context, then C completions: each a count and its tokens, none empty, every token < vocab
        for (uint64_t part = 0; part <= C; part++) {
            if (end - at < W) return mc_bad(err, at, "example %d: ends before its %s", i, part ? "completions" : "context");
            uint64_t n = word(at);
            if (n == 0) return mc_bad(err, at, "example %d: an empty %s", i, part ? "completion" : "context");
            if (n > (end - at - W) / W) return mc_bad(err, at, "example %d: %s of %llu tokens overruns the example's %llu bytes", i,
                                                   part ? "a completion" : "the context", (unsigned long long)n, (unsigned long long)bytes);
            at += W;
            McSpan span = {(int64_t)s->tok.size(), (int)n};
            for (uint64_t t = 0; t < n; t++, at += W) {
                uint64_t v = word(at);
                if (v >= (uint64_t)vocab) return mc_bad(err, at, "example %d: token %llu is >= the vocabulary size %d", i, (unsigned long long)v, vocab);
                s->tok.push_back((int)v);
            }
            if (part == 0) e.ctx = span;
            else e.endings.push_back(span);
        }
        if (at != end) return mc_bad(err, at, "example %d: %zu bytes left over after its completions (its length says %llu)", i, end - at,
                                  (unsigned long long)bytes);
        s->rows += (int64_t)C;
        if ((int)C < s->min_completions) s->min_completions = (int)C;
        if ((int)C > s->max_completions) s->max_completions = (int)C;
        s->ex.push_back(std::move(e));
    }
    if (at != size) return mc_bad(err, at, "%zu bytes after the last of the header's %d examples", size - at, h[2]);
    return true;
}

// Reads and checks FILE; bad input is one line naming the flag and the file (exit 2).
static inline void mc_load(McSet* s, const char* path, const char* flag, int vocab) {
    struct stat st;
    if (stat(path, &st) != 0) fail(EXIT_BAD_INPUT, "%s %s: cannot open: %s", flag, path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(EXIT_BAD_INPUT, "%s %s: not a regular file", flag, path);
    FILE* f = fopen(path, "rb");
    if (!f) fail(EXIT_BAD_INPUT, "%s %s: cannot open: %s", flag, path, strerror(errno));
    std::vector<uint8_t> bytes((size_t)st.st_size);
    size_t got = bytes.empty() ? 0 : fread(bytes.data(), 1, bytes.size(), f);
    fclose(f);
    if (got != bytes.size()) fail(EXIT_BAD_INPUT, "%s %s: read %zu of %zu bytes", flag, path, got, bytes.size());
    std::string err;
    s->path = path;
    if (!mc_parse(bytes.data(), bytes.size(), vocab, s, &err)) fail(EXIT_BAD_INPUT, "%s %s: %s", flag, path, err.c_str());
}

// The input at position i of a row no score reads (a row's tail past its completion, a rank's dummy rows): the set's own
// text, from a place that differs from row to row (`row`: any number naming the row; cyclic). Not a constant: under
// expert parallelism thousands of identical padding tokens route to the same experts, and the EP buffers would grow
// toward the dropless bound for them (parallel/expert_parallel_grow.cuh); nor the same text in every row of an example,
// which routes alike too. Causal attention and per-token routing leave the scored positions' losses what they are
// whatever follows them; except under FP8 per-tensor scaling (--fp8 current, and delayed's first step), whose amax takes
// in the whole batch, padding included (as it did with token 0).
static inline int mc_filler(const McSet* s, size_t row, int i) {
    return s->tok.empty() ? 0 : s->tok[(row * 2654435761ull + (size_t)i) % s->tok.size()];
}

// Row of completion c of example e: T inputs and targets (past the completion: mc_filler's text, targets 0); *first,
// *count: the positions whose targets are the completion's tokens. Returns whether the row had to be truncated.
static inline bool mc_row(const McSet* s, const McExample& e, int c, int T, int* inputs, int* targets, int* first, int* count) {
    const McSpan& end = e.endings[c];
    int n_end = end.len < T ? end.len : T;                  // a completion longer than the row: its first T tokens
    int n_ctx = e.ctx.len < T + 1 - n_end ? e.ctx.len : T + 1 - n_end;   // the most recent context that fits
    const int* ctx = &s->tok[e.ctx.off + e.ctx.len - n_ctx];
    const int* ending = &s->tok[end.off];
    int len = n_ctx + n_end;                                // <= T + 1
    auto at = [&](int i) { return i < n_ctx ? ctx[i] : ending[i - n_ctx]; };
    for (int i = 0; i < T; i++) {
        inputs[i] = i < len - 1 ? at(i) : mc_filler(s, (size_t)end.off * 4 + c, i);
        targets[i] = i < len - 1 ? at(i + 1) : 0;
    }
    *first = n_ctx - 1;
    *count = n_end;
    return n_ctx < e.ctx.len || n_end < end.len;
}

// The decision for one example from its completions' summed losses and token counts: pred = the
// lowest total loss (acc), pred_norm = the lowest mean loss per token (acc_norm); ties go to the lower
// index; a non-finite score never wins (all non-finite: -1, wrong).
static inline void mc_decide(const double* sum, const int* count, int C, int* pred, int* pred_norm) {
    *pred = *pred_norm = -1;
    for (int c = 0; c < C; c++) {
        double mean = sum[c] / count[c];
        if (std::isfinite(sum[c]) && (*pred < 0 || sum[c] < sum[*pred])) *pred = c;
        if (std::isfinite(mean) && (*pred_norm < 0 || mean < sum[*pred_norm] / count[*pred_norm])) *pred_norm = c;
    }
}
