/*
 * tokenize.cpp — turns text files or JSON documents into token shards (data/shard.h), on all cores.
 *
 *   dev/data/tokenize --tokenizer bytes|cl100k --out-dir DIR --name NAME [--jsonl FIELD | --json FIELD]
 *                     [--val-every N] [--shard-tokens N] [--threads N] [--ranks FILE] [--allow-special] FILES...
 *
 * Documents: by default each file is one document; --jsonl FIELD reads one JSON object per line and
 * takes its string FIELD; --json FIELD reads one JSON object per file. Files are taken in sorted
 * order. Every document is written as end-of-text followed by its tokens, so an end-of-text token
 * separates documents. With --val-every N, documents 0, N, 2N, ... go to NAME_val_*.bin, the others
 * to NAME_train_*.bin (N = 0: all to train); shards hold --shard-tokens tokens (the last fewer).
 * Tokenizers (data/tokenizer.h): bytes (version-1 uint16 shards) and cl100k, the DBRX tokenizer
 * (version-2 uint32 shards). Documents are tokenized in parallel, in batches, and written in order.
 * A progress line goes to stderr on a terminal; one summary line with the throughput to stdout.
 * Bad input (flags, unreadable file, bad JSON, missing field) is one line naming the file (and
 * line), exit 2, and the shards this run wrote are removed.
 */
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../../model/common.h"
#include "../../data/shard.h"
#include "../../data/tokenizer.h"

typedef struct {
    std::string tokenizer = "", out_dir = "", name = "", jsonl_field = "", json_field = "", ranks = "";
    int val_every = 0, threads = 0;
    long long shard_tokens = 100000000;
    bool allow_special = false, quiet = false;
    std::vector<std::string> files;
} Args;

static std::vector<std::string> g_written;   // shards written by this run, removed on bad input

[[noreturn]] static void bad_input(const char* fmt, ...) {
    for (const std::string& f : g_written) unlink(f.c_str());
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(EXIT_BAD_INPUT);
}

static void usage() {
    printf("usage: dev/data/tokenize --tokenizer bytes|cl100k --out-dir DIR --name NAME [options] FILES...\n"
           "  --jsonl FIELD       one JSON object per line; the document is its string FIELD\n"
           "  --json FIELD        one JSON object per file; the document is its string FIELD\n"
           "                      (neither: each file is one document of plain text)\n"
           "  --val-every N       documents 0, N, 2N, ... go to the validation shards (default 0: none)\n"
           "  --shard-tokens N    tokens per shard (default 100000000)\n"
           "  --threads N         worker threads (default: all cores)\n"
           "  --ranks FILE        cl100k_base .tiktoken ranks (default: dev/data/.cache/cl100k_base.tiktoken)\n"
           "  --allow-special     cl100k: the special tokens' text becomes their ids (default: plain text)\n"
           "  --quiet             no progress line\n");
}

static long long parse_int(const char* flag, const char* v, long long lo) {
    char* end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo) bad_input("%s expects an integer >= %lld, got '%s'", flag, lo, v);
    return x;
}

static Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; i++) {
        std::string f = argv[i];
        if (f == "--help" || f == "-h") { usage(); exit(0); }
        if (f == "--allow-special") { a.allow_special = true; continue; }
        if (f == "--quiet") { a.quiet = true; continue; }
        if (f.rfind("--", 0) != 0) { a.files.push_back(f); continue; }
        if (i + 1 >= argc) bad_input("%s needs a value", f.c_str());
        const char* v = argv[++i];
        if (f == "--tokenizer") a.tokenizer = v;
        else if (f == "--out-dir") a.out_dir = v;
        else if (f == "--name") a.name = v;
        else if (f == "--jsonl") a.jsonl_field = v;
        else if (f == "--json") a.json_field = v;
        else if (f == "--ranks") a.ranks = v;
        else if (f == "--val-every") a.val_every = (int)parse_int("--val-every", v, 0);
        else if (f == "--shard-tokens") a.shard_tokens = parse_int("--shard-tokens", v, 1);
        else if (f == "--threads") a.threads = (int)parse_int("--threads", v, 1);
        else bad_input("unknown flag '%s' (see --help)", f.c_str());
    }
    if (a.tokenizer != "bytes" && a.tokenizer != "cl100k") bad_input("--tokenizer '%s' must be bytes or cl100k", a.tokenizer.c_str());
    if (a.out_dir.empty() || a.name.empty()) bad_input("--out-dir and --name are required");
    if (!a.jsonl_field.empty() && !a.json_field.empty()) bad_input("--jsonl and --json exclude each other");
    if (a.files.empty()) bad_input("no input files");
    if (a.val_every > 0x7fffffff) bad_input("--val-every too large");
    return a;
}

// ---------------------------------------------------------------------------------------------
// JSON: the string value of one top-level field of an object (strictly parsed)

typedef struct { const char* p; const char* end; int depth; } Json;

static void json_ws(Json* j) { while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++; }

static void utf8_put(std::string* out, uint32_t c) {
    if (c < 0x80) *out += (char)c;
    else if (c < 0x800) { *out += (char)(0xC0 | (c >> 6)); *out += (char)(0x80 | (c & 0x3F)); }
    else if (c < 0x10000) { *out += (char)(0xE0 | (c >> 12)); *out += (char)(0x80 | ((c >> 6) & 0x3F)); *out += (char)(0x80 | (c & 0x3F)); }
    else { *out += (char)(0xF0 | (c >> 18)); *out += (char)(0x80 | ((c >> 12) & 0x3F)); *out += (char)(0x80 | ((c >> 6) & 0x3F)); *out += (char)(0x80 | (c & 0x3F)); }
}

static bool json_hex4(Json* j, uint32_t* v) {
    if (j->end - j->p < 4) return false;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = *j->p++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        *v = (*v << 4) | (uint32_t)d;
    }
    return true;
}

// a string at j->p (the opening quote); decoded into out when out != NULL. A lone surrogate
// becomes U+FFFD, as JavaScript's TextEncoder writes it.
static bool json_string(Json* j, std::string* out) {
    if (j->p >= j->end || *j->p != '"') return false;
    j->p++;
    while (j->p < j->end) {
        const char* run = j->p;
        while (j->p < j->end && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p >= 0x20) j->p++;
        if (out) out->append(run, j->p - run);
        if (j->p >= j->end || (unsigned char)*j->p < 0x20) return false;
        if (*j->p == '"') { j->p++; return true; }
        j->p++;   // backslash
        if (j->p >= j->end) return false;
        char e = *j->p++;
        uint32_t c;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            if (!json_hex4(j, &c)) return false;
            if (c >= 0xD800 && c <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
                Json save = *j;
                j->p += 2;
                uint32_t lo;
                if (json_hex4(j, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
                else *j = save;
            }
            if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
            break;
        }
        default: return false;
        }
        if (out) utf8_put(out, c);
    }
    return false;
}

static bool json_value(Json* j);
static bool json_skip_number(Json* j) {
    const char* s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    const char* d = j->p;
    while (j->p < j->end && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' || *j->p == 'E' || *j->p == '+' || *j->p == '-')) j->p++;
    return j->p > d && j->p > s;
}
static bool json_value(Json* j) {
    json_ws(j);
    if (j->p >= j->end) return false;
    char c = *j->p;
    if (c == '"') return json_string(j, NULL);
    if (c == '{' || c == '[') {
        if (++j->depth > 256) return false;
        char close = c == '{' ? '}' : ']';
        j->p++;
        json_ws(j);
        if (j->p < j->end && *j->p == close) { j->p++; j->depth--; return true; }
        for (;;) {
            if (c == '{') {
                json_ws(j);
                if (!json_string(j, NULL)) return false;
                json_ws(j);
                if (j->p >= j->end || *j->p != ':') return false;
                j->p++;
            }
            if (!json_value(j)) return false;
            json_ws(j);
            if (j->p >= j->end) return false;
            if (*j->p == ',') { j->p++; continue; }
            if (*j->p == close) { j->p++; j->depth--; return true; }
            return false;
        }
    }
    for (const char* lit : {"true", "false", "null"}) {
        size_t n = strlen(lit);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lit, n) == 0) { j->p += n; return true; }
    }
    return json_skip_number(j);
}

// Returns "" on success (the field's string in *out), else the problem.
static std::string json_field(const char* s, size_t n, const std::string& field, std::string* out) {
    Json j = {s, s + n, 0};
    json_ws(&j);
    if (j.p >= j.end || *j.p != '{') return "is not a JSON object";
    j.p++;
    bool found = false;
    json_ws(&j);
    if (j.p < j.end && *j.p == '}') j.p++;
    else for (;;) {
        json_ws(&j);
        std::string key;
        if (!json_string(&j, &key)) return "is not valid JSON (a key)";
        json_ws(&j);
        if (j.p >= j.end || *j.p != ':') return "is not valid JSON (':')";
        j.p++;
        json_ws(&j);
        if (key == field && !found) {
            if (j.p >= j.end || *j.p != '"') return "has a field '" + field + "' that is not a string";
            out->clear();
            if (!json_string(&j, out)) return "is not valid JSON (in field '" + field + "')";
            found = true;
        } else if (!json_value(&j)) return "is not valid JSON";
        json_ws(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        if (j.p < j.end && *j.p == '}') { j.p++; break; }
        return "is not valid JSON (',' or '}')";
    }
    json_ws(&j);
    if (j.p != j.end) return "has text after the JSON object";
    if (!found) return "has no field '" + field + "'";
    return "";
}

// ---------------------------------------------------------------------------------------------
// output: a split's token buffer, cut into shards

typedef struct {
    std::string prefix;   // DIR/NAME_split_
    std::vector<uint32_t> buf;
    int shards;
    int64_t tokens;
} Split;

static void split_flush(Split* s, int64_t shard_tokens, int version, bool final) {
    size_t at = 0;
    while (s->buf.size() - at >= (size_t)shard_tokens || (final && at < s->buf.size())) {
        size_t n = std::min(s->buf.size() - at, (size_t)shard_tokens);
        char path[4096];
        snprintf(path, sizeof path, "%s%06d.bin", s->prefix.c_str(), s->shards++);
        shard_write(path, s->buf.data() + at, (int64_t)n, version);
        g_written.push_back(path);
        at += n;
    }
    s->buf.erase(s->buf.begin(), s->buf.begin() + at);
}

typedef struct {
    int file;
    int64_t line;          // 1-based line for --jsonl, 0 otherwise
    std::string raw;       // the file or line as read
    std::vector<uint32_t> tokens;
    std::string error;
    int64_t text_bytes;    // of the document's text
} Doc;

static std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) bad_input("%s: cannot open: %s", path.c_str(), strerror(errno));
    std::string s;
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, got);
    if (ferror(f)) bad_input("%s: read error: %s", path.c_str(), strerror(errno));
    fclose(f);
    return s;
}

int main(int argc, char** argv) {
    Args a = parse_args(argc, argv);
    std::sort(a.files.begin(), a.files.end());
    int64_t total_bytes = 0;
    for (const std::string& f : a.files) {
        struct stat st;
        if (stat(f.c_str(), &st) != 0) bad_input("%s: cannot open: %s", f.c_str(), strerror(errno));
        if (!S_ISREG(st.st_mode)) bad_input("%s: not a regular file", f.c_str());
        if (access(f.c_str(), R_OK) != 0) bad_input("%s: cannot read: %s", f.c_str(), strerror(errno));
        total_bytes += st.st_size;
    }
    struct stat st;
    if (stat(a.out_dir.c_str(), &st) != 0 && mkdir(a.out_dir.c_str(), 0755) != 0)
        bad_input("--out-dir %s: cannot create: %s", a.out_dir.c_str(), strerror(errno));
    if (a.threads > 0) omp_set_num_threads(a.threads);
    int threads = omp_get_max_threads();

    bool cl100k = a.tokenizer == "cl100k";
    BpeRanks ranks;
    if (cl100k) {
        if (a.ranks.empty()) {   // next to this program: dev/data/.cache/cl100k_base.tiktoken
            char exe[4096];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            std::string dir = n > 0 ? std::string(exe, n) : std::string("dev/data/tokenize");
            dir = dir.substr(0, dir.rfind('/') + 1);
            a.ranks = dir + ".cache/cl100k_base.tiktoken";
        }
        bpe_load(&ranks, a.ranks.c_str());
        if (ranks.num_ranks > CL100K_EOT) bad_input("%s: %d ranks overlap the special tokens (from %d)", a.ranks.c_str(), ranks.num_ranks, CL100K_EOT);
        unicode_init();
    }
    uint32_t eot = cl100k ? CL100K_EOT : BYTES_EOT;
    int version = cl100k ? 2 : 1;

    Split splits[2];   // train, val
    const char* split_names[2] = {"train", "val"};
    for (int k = 0; k < 2; k++) { splits[k].prefix = a.out_dir + "/" + a.name + "_" + split_names[k] + "_"; splits[k].shards = 0; splits[k].tokens = 0; }
    int64_t docs_seen = 0, docs_split[2] = {0, 0}, bytes_done = 0, text_bytes = 0;
    bool tty = !a.quiet && isatty(2);
    double t0 = now_seconds(), last_print = -1;
    const size_t BATCH_BYTES = 8 << 20;
    std::vector<Doc> batch;
    size_t batch_bytes = 0;

    double t_encode = 0;   // wall time of the parallel sections (JSON parsing + tokenizing)
    auto run_batch = [&]() {
        double t_batch = now_seconds();
#pragma omp parallel for schedule(dynamic, 1)
        for (size_t d = 0; d < batch.size(); d++) {
            Doc& doc = batch[d];
            std::string text;
            const std::string* src = &doc.raw;
            const std::string& field = a.jsonl_field.empty() ? a.json_field : a.jsonl_field;
            if (!field.empty()) {
                doc.error = json_field(doc.raw.data(), doc.raw.size(), field, &text);
                if (!doc.error.empty()) continue;
                src = &text;
            }
            const uint8_t* s = (const uint8_t*)src->data();
            doc.text_bytes = (int64_t)src->size();
            doc.tokens.reserve(cl100k ? src->size() / 3 + 16 : src->size() + 1);
            doc.tokens.push_back(eot);
            if (cl100k) cl100k_encode(&ranks, s, src->size(), a.allow_special, &doc.tokens);
            else for (size_t i = 0; i < src->size(); i++) doc.tokens.push_back(s[i]);
        }
        t_encode += now_seconds() - t_batch;
        for (Doc& doc : batch) {
            if (!doc.error.empty()) {
                if (doc.line) bad_input("%s:%lld: %s", a.files[doc.file].c_str(), (long long)doc.line, doc.error.c_str());
                bad_input("%s: %s", a.files[doc.file].c_str(), doc.error.c_str());
            }
            int k = a.val_every > 0 && docs_seen % a.val_every == 0 ? 1 : 0;
            docs_seen++;
            docs_split[k]++;
            splits[k].buf.insert(splits[k].buf.end(), doc.tokens.begin(), doc.tokens.end());
            splits[k].tokens += (int64_t)doc.tokens.size();
            text_bytes += doc.text_bytes;
            split_flush(&splits[k], a.shard_tokens, version, false);
        }
        batch.clear();
        batch_bytes = 0;
        double now = now_seconds() - t0;
        if (tty && now - last_print > 0.2) {
            last_print = now;
            fprintf(stderr, "\r%s: %.1f / %.1f MB (%.0f%%), %.1f MB/s, %lld tokens   ", a.name.c_str(), bytes_done / 1e6,
                    total_bytes / 1e6, total_bytes ? 100.0 * bytes_done / total_bytes : 100.0, bytes_done / 1e6 / (now > 0 ? now : 1),
                    (long long)(splits[0].tokens + splits[1].tokens));
            fflush(stderr);
        }
    };
    auto add_doc = [&](int file, int64_t line, std::string&& raw) {
        batch_bytes += raw.size();
        batch.push_back({file, line, std::move(raw), {}, "", 0});
        if (batch_bytes >= BATCH_BYTES || batch.size() >= 65536) run_batch();
    };

    for (size_t fi = 0; fi < a.files.size(); fi++) {
        const std::string& path = a.files[fi];
        if (a.jsonl_field.empty()) {
            std::string raw = read_file(path);
            bytes_done += (int64_t)raw.size();
            add_doc((int)fi, 0, std::move(raw));
            continue;
        }
        FILE* f = fopen(path.c_str(), "rb");
        if (!f) bad_input("%s: cannot open: %s", path.c_str(), strerror(errno));
        char* line = NULL;
        size_t cap = 0;
        ssize_t len;
        int64_t lineno = 0;
        while ((len = getline(&line, &cap, f)) >= 0) {
            lineno++;
            bytes_done += len;
            size_t n = (size_t)len;
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
            bool blank = true;
            for (size_t k = 0; k < n && blank; k++) blank = line[k] == ' ' || line[k] == '\t';
            if (blank) continue;   // blank lines are not documents
            std::string raw(line, n);
            add_doc((int)fi, lineno, std::move(raw));
        }
        if (ferror(f)) bad_input("%s: read error: %s", path.c_str(), strerror(errno));
        free(line);
        fclose(f);
    }
    run_batch();
    for (int k = 0; k < 2; k++) split_flush(&splits[k], a.shard_tokens, version, true);
    double dt = now_seconds() - t0;
    if (tty) fprintf(stderr, "\n");
    for (int k = 0; k < 2; k++)
        if (docs_split[k] || k == 0)
            printf("%s: %lld documents, %lld tokens -> %s*.bin (%d shard%s)\n", split_names[k], (long long)docs_split[k],
                   (long long)splits[k].tokens, splits[k].prefix.c_str(), splits[k].shards, splits[k].shards == 1 ? "" : "s");
    // throughput in MB of the documents' text (UTF-8): of the whole run (start-up, reading, writing
    // and fsyncing the shards included), and of the encoding alone (parallel sections, wall time)
    int64_t tokens = splits[0].tokens + splits[1].tokens;
    double te = t_encode > 0 ? t_encode : 1e-9;
    printf("tokenized %.2f MB of text (%.2f MB of input), %lld tokens in %.2f s: %.2f MB/s overall, encoding %.2f MB/s "
           "(%.3g tokens/s), %d thread%s (%s)\n", text_bytes / 1e6, total_bytes / 1e6, (long long)tokens, dt,
           text_bytes / 1e6 / (dt > 0 ? dt : 1e-9), text_bytes / 1e6 / te, tokens / te, threads, threads == 1 ? "" : "s",
           a.tokenizer.c_str());
    return 0;
}
