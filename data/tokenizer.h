/*
 * tokenizer.h — the two tokenizers of dev/data/tokenize and of sampling (--sample-every, --generate):
 *   bytes:  one token per UTF-8 byte (0..255), end-of-text 256 (vocabulary 257, dbrx-tiny pads to 384);
 *   cl100k: the DBRX tokenizer, GPT-4's cl100k_base byte-level BPE (ranks from a .tiktoken file)
 *           plus DBRX's added special tokens; end-of-text 100257, vocabulary padded to 100352.
 *
 * cl100k pre-tokenisation is the regex of js-tiktoken's cl100k_base, written by hand:
 *   's|'S|'t|'T|'re|'rE|'Re|'RE|'ve|...|'d|'D          (ASCII case only, as js-tiktoken spells it)
 *   | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ' '?[^\s\p{L}\p{N}]+[\r\n]*
 *   | \s*[\r\n]+ | \s+(?!\S) | \s+
 * tried in that order at each position, with a backtracking engine's semantics (see
 * cl100k_next_piece). \p{L}, \p{N} and \s are the classes of unicode_classes.h, generated from
 * node's regular expressions (the reference's own definitions). Bytes that are not valid UTF-8 count
 * as one "other" character each (the reference, which works on decoded text, never sees them).
 * Each piece is one token when it is in the ranks, else merged by byte-pair encoding: repeatedly
 * merge the adjacent pair whose concatenation has the lowest rank, the leftmost on ties.
 */
#pragma once
#include <algorithm>
#include <queue>
#include <string>
#include <vector>
#include "../model/common.h"
#include "unicode_classes.h"

enum { UC_OTHER = 0, UC_LETTER = 1, UC_NUMBER = 2, UC_SPACE = 3 };

#define BYTES_EOT 256
#define BYTES_VOCAB 257
#define CL100K_EOT 100257
#define CL100K_IDS 100280   // the ids of DBRX's tokenizer: the ranks and the specials, up to <|im_end|> 100279
#define DBRX_VOCAB 100352

typedef struct { const char* text; uint32_t id; } SpecialToken;
// cl100k_base's special tokens, then DBRX's additions (in the order the reference matches them)
static const SpecialToken DBRX_SPECIALS[] = {
    {"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
    {"<|endofprompt|>", 100276}, {"<|pad|>", 100277}, {"<|im_start|>", 100278}, {"<|im_end|>", 100279},
};
static const int DBRX_NUM_SPECIALS = 8;

// ---------------------------------------------------------------------------------------------
// UTF-8 and the code point classes

static uint8_t* g_unicode_class = NULL;   // (0x110000) class of every code point

static inline void unicode_init() {
    if (g_unicode_class) return;
    g_unicode_class = (uint8_t*)mallocCheck(0x110000);
    memset(g_unicode_class, UC_OTHER, 0x110000);
    for (int i = 0; i < UNICODE_NUM_RANGES; i++)
        memset(g_unicode_class + UNICODE_RANGES[i].first, UNICODE_RANGES[i].cls, UNICODE_RANGES[i].last - UNICODE_RANGES[i].first + 1);
}

// Decodes the code point at s[0..n) (n >= 1): returns its length in bytes and sets *cls. An invalid
// or truncated sequence is one byte of class "other" (*cp = 0xFFFFFFFF).
static inline int utf8_next(const uint8_t* s, size_t n, uint32_t* cp, int* cls) {
    uint8_t b = s[0];
    if (b < 0x80) { *cp = b; *cls = g_unicode_class[b]; return 1; }
    int len = 0;
    uint32_t c = 0, lo = 0x80, hi = 0xBF;   // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) { len = 2; c = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; c = b & 0x0F; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; c = b & 0x07; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    if (len == 0 || (size_t)len > n || s[1] < lo || s[1] > hi) { *cp = 0xFFFFFFFF; *cls = UC_OTHER; return 1; }
    for (int k = 1; k < len; k++) {
        if (k > 1 && (s[k] & 0xC0) != 0x80) { *cp = 0xFFFFFFFF; *cls = UC_OTHER; return 1; }
        c = (c << 6) | (s[k] & 0x3F);
    }
    *cp = c;
    *cls = g_unicode_class[c];
    return len;
}

// ---------------------------------------------------------------------------------------------
// cl100k pre-tokenisation: the end of the piece that starts at s[i] (i < n)

static inline size_t cl100k_next_piece(const uint8_t* s, size_t n, size_t i) {
    uint32_t cp0, cp;
    int cls0, cls;
    int len0 = utf8_next(s + i, n - i, &cp0, &cls0);
    size_t j;
    // 's 't 're 've 'm 'll 'd, either ASCII case
    if (cp0 == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1] | 0x20, b = i + 2 < n ? (s[i + 2] | 0x20) : 0;   // |0x20 folds A-Z only where it is a letter
        bool alpha_a = (s[i + 1] >= 'A' && s[i + 1] <= 'Z') || (s[i + 1] >= 'a' && s[i + 1] <= 'z');
        bool alpha_b = i + 2 < n && ((s[i + 2] >= 'A' && s[i + 2] <= 'Z') || (s[i + 2] >= 'a' && s[i + 2] <= 'z'));
        if (alpha_a && (a == 's' || a == 't' || a == 'm' || a == 'd')) return i + 2;
        if (alpha_a && alpha_b && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))) return i + 3;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    j = i;
    if (cls0 == UC_LETTER) j = i + len0;
    else if (cls0 != UC_NUMBER && cp0 != '\r' && cp0 != '\n' && i + len0 < n) {
        int l = utf8_next(s + i + len0, n - i - len0, &cp, &cls);
        if (cls == UC_LETTER) j = i + len0 + l;
    }
    if (j > i) {
        while (j < n) { int l = utf8_next(s + j, n - j, &cp, &cls); if (cls != UC_LETTER) break; j += l; }
        return j;
    }
    // \p{N}{1,3}
    if (cls0 == UC_NUMBER) {
        j = i + len0;
        for (int k = 1; k < 3 && j < n; k++) { int l = utf8_next(s + j, n - j, &cp, &cls); if (cls != UC_NUMBER) break; j += l; }
        return j;
    }
    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    size_t p = i;
    int clsp = cls0;
    if (cp0 == ' ' && i + 1 < n) { p = i + 1; utf8_next(s + p, n - p, &cp, &clsp); if (clsp != UC_OTHER) p = i, clsp = cls0; }
    if (clsp == UC_OTHER) {
        j = p;
        while (j < n) { int l = utf8_next(s + j, n - j, &cp, &cls); if (cls != UC_OTHER) break; j += l; }
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    // cls0 is whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
    size_t last_nl_end = 0, last_start = i;
    j = i;
    while (j < n) {
        int l = utf8_next(s + j, n - j, &cp, &cls);
        if (cls != UC_SPACE) break;
        if (cp == '\r' || cp == '\n') last_nl_end = j + 1;
        last_start = j;
        j += l;
    }
    if (last_nl_end) return last_nl_end;        // up to and including the run's last newline
    if (j == n || last_start == i) return j;    // the run ends the text, or is one character
    return last_start;                          // all but the last, which joins the next piece
}

// ---------------------------------------------------------------------------------------------
// BPE ranks: byte string -> rank, in an open-addressing hash table over one arena of bytes

typedef struct {
    std::vector<uint8_t> arena;
    std::vector<uint64_t> slot_key;   // (offset << 16 | length) + 1; 0 = empty
    std::vector<int32_t> slot_rank;
    uint64_t mask;
    int32_t num_ranks;
} BpeRanks;

static inline uint64_t bpe_hash(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static inline int32_t bpe_rank(const BpeRanks* r, const uint8_t* p, size_t n) {
    for (uint64_t at = bpe_hash(p, n) & r->mask;; at = (at + 1) & r->mask) {
        uint64_t k = r->slot_key[at];
        if (k == 0) return -1;
        k--;
        if ((k & 0xffff) == n && memcmp(r->arena.data() + (k >> 16), p, n) == 0) return r->slot_rank[at];
    }
}

static inline int base64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Loads a .tiktoken file (one "BASE64 RANK" per line); any defect is bad input naming the line.
static inline void bpe_load(BpeRanks* r, const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) fail(EXIT_BAD_INPUT, "%s: cannot open the BPE ranks (%s); run dev/data/setup_tiktoken.sh", path, strerror(errno));
    std::vector<std::pair<std::string, int32_t>> entries;
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char* sp = strchr(line, ' ');
        if (!sp) fail(EXIT_BAD_INPUT, "%s:%d: not 'BASE64 RANK'", path, lineno);
        std::string bytes;
        uint32_t acc = 0;
        int bits = 0;
        for (char* c = line; c < sp; c++) {
            if (*c == '=') break;
            int v = base64_value((unsigned char)*c);
            if (v < 0) fail(EXIT_BAD_INPUT, "%s:%d: bad base64", path, lineno);
            acc = (acc << 6) | (uint32_t)v;
            bits += 6;
            if (bits >= 8) { bits -= 8; bytes += (char)((acc >> bits) & 0xff); }
        }
        char* end = NULL;
        long rank = strtol(sp + 1, &end, 10);
        if (bytes.empty() || bytes.size() > 0xffff || end == sp + 1 || (*end && *end != '\n' && *end != '\r') || rank < 0 || rank > INT32_MAX - 1)
            fail(EXIT_BAD_INPUT, "%s:%d: not 'BASE64 RANK'", path, lineno);
        entries.push_back({bytes, (int32_t)rank});
    }
    fclose(f);
    if (entries.empty()) fail(EXIT_BAD_INPUT, "%s: no ranks", path);
    size_t cap = 1;
    while (cap < entries.size() * 2) cap <<= 1;
    r->mask = cap - 1;
    r->slot_key.assign(cap, 0);
    r->slot_rank.assign(cap, -1);
    r->num_ranks = 0;
    for (const auto& e : entries) {
        const uint8_t* p = (const uint8_t*)e.first.data();
        if (bpe_rank(r, p, e.first.size()) >= 0) fail(EXIT_BAD_INPUT, "%s: a token appears twice (rank %d)", path, e.second);
        uint64_t at = bpe_hash(p, e.first.size()) & r->mask;
        while (r->slot_key[at]) at = (at + 1) & r->mask;
        r->slot_key[at] = (((uint64_t)r->arena.size() << 16) | e.first.size()) + 1;
        r->slot_rank[at] = e.second;
        r->arena.insert(r->arena.end(), e.first.begin(), e.first.end());
        r->num_ranks = std::max(r->num_ranks, e.second + 1);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if (bpe_rank(r, &c, 1) < 0) fail(EXIT_BAD_INPUT, "%s: byte %d has no rank (not a byte-level BPE)", path, b);
    }
}

// Byte-pair encodes one piece (n >= 1 bytes) and appends its tokens.
static inline void bpe_encode_piece(const BpeRanks* r, const uint8_t* p, size_t n, std::vector<uint32_t>* out) {
    int32_t whole = bpe_rank(r, p, n);
    if (whole >= 0) { out->push_back((uint32_t)whole); return; }
    const int32_t NONE = INT32_MAX;
    if (n <= 256) {
        // parts start at b[0..m); pair k = parts k and k+1, its rank in pr[k]. A linear scan finds
        // the lowest rank (the leftmost on ties); after a merge only the two neighbouring pairs change.
        uint32_t b[257];
        int32_t pr[257];
        size_t m = n;
        for (size_t k = 0; k <= n; k++) b[k] = (uint32_t)k;
        auto pair_rank = [&](size_t k) -> int32_t {   // parts k, k+1 (k + 2 <= m)
            int32_t x = bpe_rank(r, p + b[k], b[k + 2] - b[k]);
            return x < 0 ? NONE : x;
        };
        for (size_t k = 0; k + 1 < m; k++) pr[k] = pair_rank(k);
        while (m > 1) {
            int32_t best = NONE;
            size_t at = 0;
            for (size_t k = 0; k + 1 < m; k++) if (pr[k] < best) { best = pr[k]; at = k; }
            if (best == NONE) break;
            // merge parts at and at+1: drop boundary at+1
            for (size_t k = at + 1; k < m; k++) b[k] = b[k + 1];
            for (size_t k = at + 1; k + 1 < m; k++) pr[k] = pr[k + 1];
            m--;
            if (at + 1 < m) pr[at] = pair_rank(at);
            if (at > 0) pr[at - 1] = pair_rank(at - 1);
        }
        for (size_t k = 0; k < m; k++) out->push_back((uint32_t)bpe_rank(r, p + b[k], b[k + 1] - b[k]));
        return;
    }
    // long pieces: the same merges in O(n log n), parts in a linked list, candidate pairs in a heap
    // ordered by (rank, start); an entry is stale when its parts have changed since it was pushed.
    std::vector<uint32_t> end(n), next(n), prev(n);
    std::vector<bool> alive(n, true);
    for (size_t k = 0; k < n; k++) { end[k] = (uint32_t)k + 1; next[k] = (uint32_t)k + 1; prev[k] = (uint32_t)k - 1; }
    typedef struct { int32_t rank; uint32_t start, mid, stop; } Cand;
    auto later = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.start > y.start; };
    std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
    auto push = [&](uint32_t a) {   // the pair of part a and its successor
        if (a >= n || end[a] >= n) return;
        uint32_t c = end[a], stop = end[c];
        int32_t x = bpe_rank(r, p + a, stop - a);
        if (x >= 0) heap.push({x, a, c, stop});
    };
    for (uint32_t k = 0; k + 1 < n; k++) push(k);
    while (!heap.empty()) {
        Cand c = heap.top();
        heap.pop();
        if (!alive[c.start] || end[c.start] != c.mid || !alive[c.mid] || end[c.mid] != c.stop) continue;
        alive[c.mid] = false;
        end[c.start] = c.stop;
        if (c.stop < n) prev[c.stop] = c.start;
        if (c.start > 0) push(prev[c.start]);
        push(c.start);
    }
    for (uint32_t k = 0; k < n; k = end[k]) out->push_back((uint32_t)bpe_rank(r, p + k, end[k] - k));
}

// Encodes text as ordinary text (special tokens' text is plain text), appending the tokens.
static inline void cl100k_encode_ordinary(const BpeRanks* r, const uint8_t* s, size_t n, std::vector<uint32_t>* out) {
    for (size_t i = 0; i < n;) {
        size_t j = cl100k_next_piece(s, n, i);
        bpe_encode_piece(r, s + i, j - i, out);
        i = j;
    }
}

// Encodes text; with allow_special the special tokens' text becomes their ids.
static inline void cl100k_encode(const BpeRanks* r, const uint8_t* s, size_t n, bool allow_special, std::vector<uint32_t>* out) {
    if (!allow_special) { cl100k_encode_ordinary(r, s, n, out); return; }
    size_t start = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '<' || s[i + 1] != '|') continue;
        for (int k = 0; k < DBRX_NUM_SPECIALS; k++) {
            size_t len = strlen(DBRX_SPECIALS[k].text);
            if (i + len <= n && memcmp(s + i, DBRX_SPECIALS[k].text, len) == 0) {
                cl100k_encode_ordinary(r, s + start, i - start, out);
                out->push_back(DBRX_SPECIALS[k].id);
                start = i + len;
                i = start - 1;
                break;
            }
        }
    }
    cl100k_encode_ordinary(r, s + start, n - start, out);
}

// ---------------------------------------------------------------------------------------------
// The tokenizer of generation (train_dbrx --sample-every, --generate): text -> ids for the prompt, ids
// -> text for what the model writes, and which ids of the model's (padded) vocabulary are tokens at all.
//   bytes:  ids 0..255 are the bytes, 256 end-of-text; the vocabulary's padding (257..V-1) is no token.
//   cl100k: the ranks (the bytes of each id, from the .tiktoken file) and DBRX's specials; the ids in
//           between (100256, 100261..100275) and the padding (100280..V-1) are no token.
// Special tokens' text in a prompt is the special token (tiktoken's allowed_special="all"); for bytes,
// "<|endoftext|>" is end-of-text, as the tokenize tool separates documents.

enum TokenizerKind { TOKENIZER_BYTES, TOKENIZER_CL100K };

typedef struct {
    TokenizerKind kind;
    int eot;                              // end-of-text: BYTES_EOT or CL100K_EOT
    BpeRanks ranks;                       // cl100k: the encoder's
    std::vector<std::string> text;        // cl100k: the bytes of every id (empty: no token)
    std::vector<unsigned char> valid;     // (V) 1: a token of this tokenizer
} Tokenizer;

// vocab: the model's (padded) vocabulary size; it must hold every id of the tokenizer (bad input: the
// caller has checked, with the flag's name). ranks_path: the cl100k ranks (.tiktoken).
static inline void tokenizer_init(Tokenizer* t, TokenizerKind kind, const char* ranks_path, int vocab) {
    unicode_init();
    t->kind = kind;
    t->valid.assign(vocab, 0);
    if (kind == TOKENIZER_BYTES) {
        t->eot = BYTES_EOT;
        for (int i = 0; i < BYTES_VOCAB && i < vocab; i++) t->valid[i] = 1;
        return;
    }
    t->eot = CL100K_EOT;
    bpe_load(&t->ranks, ranks_path);
    t->text.assign(DBRX_VOCAB, std::string());
    for (size_t at = 0; at <= t->ranks.mask; at++) {   // every rank's bytes, from the hash table
        uint64_t key = t->ranks.slot_key[at];
        if (key == 0) continue;
        key--;
        int32_t r = t->ranks.slot_rank[at];
        if (r >= DBRX_VOCAB) fail(EXIT_BAD_INPUT, "%s: rank %d is beyond DBRX's vocabulary (%d)", ranks_path, r, DBRX_VOCAB);
        t->text[r].assign((const char*)t->ranks.arena.data() + (key >> 16), key & 0xffff);
    }
    for (int k = 0; k < DBRX_NUM_SPECIALS; k++) t->text[DBRX_SPECIALS[k].id] = DBRX_SPECIALS[k].text;
    for (int i = 0; i < DBRX_VOCAB && i < vocab; i++) t->valid[i] = !t->text[i].empty();
}

// the ids of text (specials' text -> the special token)
static inline std::vector<int> tokenizer_encode(const Tokenizer* t, const std::string& text) {
    std::vector<int> ids;
    if (t->kind == TOKENIZER_BYTES) {
        static const char eot[] = "<|endoftext|>";
        for (size_t i = 0; i < text.size(); i++) {
            if (text.compare(i, sizeof eot - 1, eot) == 0) { ids.push_back(BYTES_EOT); i += sizeof eot - 2; continue; }
            ids.push_back((unsigned char)text[i]);
        }
        return ids;
    }
    std::vector<uint32_t> out;
    cl100k_encode(&t->ranks, (const uint8_t*)text.data(), text.size(), true, &out);
    for (uint32_t x : out) ids.push_back((int)x);
    return ids;
}

// the bytes of ids, one after the other (an id that is no token: "<|id N|>"; a sampler never draws one)
static inline std::string tokenizer_decode(const Tokenizer* t, const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) {
        if (t->kind == TOKENIZER_BYTES && id >= 0 && id < 256) s.push_back((char)id);
        else if (t->kind == TOKENIZER_BYTES && id == BYTES_EOT) s += "<|endoftext|>";
        else if (t->kind == TOKENIZER_CL100K && id >= 0 && id < (int)t->text.size() && !t->text[id].empty()) s += t->text[id];
        else s += "<|id " + std::to_string(id) + "|>";
    }
    return s;
}

// Text for a log line: valid UTF-8 kept, control characters and the backslash escaped (\n, \t, \r, \\,
// else \xNN), and so is every byte that is not valid UTF-8 (a byte-level model can write any byte, and a
// multi-byte character may be cut at the end of a sample). One line, printable, reversible.
static inline std::string text_printable(const std::string& s) {
    unicode_init();
    std::string o;
    const uint8_t* p = (const uint8_t*)s.data();
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        int cls, n = utf8_next(p + i, s.size() - i, &cp, &cls);
        bool bad = cp == 0xFFFFFFFF;
        if (!bad && cp >= 0x20 && cp != 0x7F && cp != '\\') { o.append(s, i, n); i += n; continue; }
        char b[8];
        if (cp == '\n') o += "\\n"; else if (cp == '\t') o += "\\t"; else if (cp == '\r') o += "\\r"; else if (cp == '\\') o += "\\\\";
        else { snprintf(b, sizeof b, "\\x%02x", p[i]); o += b; }
        i += 1;   // (an escaped character is one byte)
    }
    return o;
}

// valid UTF-8 for a JSON string: every byte that is not valid UTF-8 becomes U+FFFD
static inline std::string text_utf8(const std::string& s) {
    unicode_init();
    std::string o;
    const uint8_t* p = (const uint8_t*)s.data();
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        int cls, n = utf8_next(p + i, s.size() - i, &cp, &cls);
        if (cp == 0xFFFFFFFF) o += "\xEF\xBF\xBD"; else o.append(s, i, n);
        i += n;
    }
    return o;
}
