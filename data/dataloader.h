/*
 * dataloader.h — serves (B, T) batches of inputs and next-token targets from token shards
 * (data/shard.h), in an order that depends only on the data and the seed, never on the number of
 * ranks, and that resumes exactly from a small state. The full specification is data/README.md.
 *
 * A sequence window is T+1 consecutive tokens of one shard: window w of a shard covers tokens
 * [w*T, w*T + T + 1), so a shard of n tokens holds (n - 1) / T windows (a shard smaller than one
 * window is bad input). A source is the shards of one glob. Its stream of windows is, epoch after
 * epoch: the shards in a seeded permutation, and inside each shard its windows in a seeded
 * permutation — both re-drawn every epoch (keyed Feistel permutations: random access, no tables).
 * With several sources (a mixture), global sequence i comes from a source drawn with the weights in
 * force at that step (a hash of seed and i), and takes that source's next window.
 * Global batch g is global sequences [g*GB, (g+1)*GB), GB = B * world; rank r takes the B sequences
 * [g*GB + r*B, g*GB + (r+1)*B). Every rank advances the whole (global) state.
 * Validation (shuffle = 0): one source, the shards in sorted order and their windows in order.
 *
 * State (DataLoaderState): seed, global position in sequences, global batches served, and per
 * source its position in sequences (epoch = position / windows). dataloader_state_write/_parse turn
 * it into one JSON line and back, for checkpoints.
 */
#pragma once
#include <glob.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../model/common.h"
#include "shard.h"

#define DATA_MAX_SOURCES 16
#define DATA_MAX_STAGES 64

// ---------------------------------------------------------------------------------------------
// the --data and --data-schedule syntax (parsed without touching the file system, so the fuzzer
// can drive it; errors come back as a message)

typedef struct {
    std::string name;      // "" for a plain glob
    std::string pattern;
    double weight;
} DataSpecEntry;

typedef struct {
    int64_t step;                       // first optimizer step at which these weights hold
    double weight[DATA_MAX_SOURCES];    // by source index, >= 0, not normalised
} DataStage;

static inline bool data_is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// Parses a strictly positive finite number that spans all of s.
static inline bool data_parse_weight(const std::string& s, double* out) {
    if (s.empty() || s.size() > 64) return false;
    char* end = NULL;
    errno = 0;
    double v = strtod(s.c_str(), &end);
    if (*end || errno || !std::isfinite(v)) return false;
    *out = v;
    return true;
}

static inline std::vector<std::string> data_split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    for (;;) {
        size_t at = s.find(sep, start);
        out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
        if (at == std::string::npos) return out;
        start = at + 1;
    }
}

// `spec` is a glob, or a mixture NAME=GLOB:WEIGHT[,NAME=GLOB:WEIGHT...] (NAME of [A-Za-z0-9_-];
// the weight follows the entry's last ':'; globs cannot hold ','). A value is a mixture iff it
// starts with NAME=. Returns 1, or 0 with *err set.
static inline int data_spec_parse(const char* spec, std::vector<DataSpecEntry>* out, std::string* err) {
    out->clear();
    std::string s = spec;
    if (s.empty()) { *err = "is empty"; return 0; }
    size_t n = 0;
    while (n < s.size() && data_is_name_char(s[n])) n++;
    if (n == 0 || n >= s.size() || s[n] != '=') {   // a plain glob
        out->push_back({"", s, 1.0});
        return 1;
    }
    std::vector<std::string> entries = data_split(s, ',');
    if (entries.size() > DATA_MAX_SOURCES) { *err = "has more than " + std::to_string(DATA_MAX_SOURCES) + " sources"; return 0; }
    for (size_t k = 0; k < entries.size(); k++) {
        const std::string& e = entries[k];
        std::string where = "source " + std::to_string(k + 1) + " '" + e.substr(0, 200) + "'";
        size_t eq = e.find('=');
        if (eq == std::string::npos || eq == 0) { *err = where + " is not NAME=GLOB:WEIGHT"; return 0; }
        std::string name = e.substr(0, eq);
        for (char c : name)
            if (!data_is_name_char(c)) { *err = where + ": the name may only hold letters, digits, '_' and '-'"; return 0; }
        size_t colon = e.rfind(':');
        if (colon == std::string::npos || colon < eq) { *err = where + " has no ':WEIGHT' (syntax NAME=GLOB:WEIGHT,...)"; return 0; }
        std::string pattern = e.substr(eq + 1, colon - eq - 1);
        double w;
        if (pattern.empty()) { *err = where + " has an empty glob"; return 0; }
        if (!data_parse_weight(e.substr(colon + 1), &w) || !(w > 0)) {
            *err = where + ": the weight '" + e.substr(colon + 1, 64) + "' must be a positive number";
            return 0;
        }
        for (const DataSpecEntry& o : *out)
            if (o.name == name) { *err = "names source '" + name + "' twice"; return 0; }
        out->push_back({name, pattern, w});
    }
    return 1;
}

// `spec` is STEP:NAME=W,NAME=W[;STEP:...]: from optimizer step STEP on, the sources draw with these
// weights (every source named, W >= 0, one W > 0, steps increasing and >= 1). Returns 1, or 0 + err.
static inline int data_schedule_parse(const char* spec, const std::vector<DataSpecEntry>& sources,
                                      std::vector<DataStage>* out, std::string* err) {
    out->clear();
    std::string s = spec;
    if (s.empty()) return 1;
    if (sources.size() < 2 || sources[0].name.empty()) { *err = "needs a mixture of two or more sources in --data (NAME=GLOB:WEIGHT,...)"; return 0; }
    std::vector<std::string> stages = data_split(s, ';');
    if (stages.size() > DATA_MAX_STAGES - 1) { *err = "has more than " + std::to_string(DATA_MAX_STAGES - 1) + " stages"; return 0; }
    int64_t last = 0;
    for (size_t k = 0; k < stages.size(); k++) {
        const std::string& st = stages[k];
        std::string where = "stage " + std::to_string(k + 1) + " '" + st.substr(0, 200) + "'";
        size_t colon = st.find(':');
        if (colon == std::string::npos) { *err = where + " is not STEP:NAME=WEIGHT,..."; return 0; }
        std::string step_s = st.substr(0, colon);
        char* end = NULL;
        errno = 0;
        long long step = strtoll(step_s.c_str(), &end, 10);
        if (step_s.empty() || *end || errno || step < 1) { *err = where + ": the step '" + step_s.substr(0, 32) + "' must be an integer >= 1"; return 0; }
        if (step <= last) { *err = where + ": steps must increase"; return 0; }
        last = step;
        DataStage stage = {};
        stage.step = step;
        std::vector<bool> seen(sources.size(), false);
        double total = 0;
        for (const std::string& item : data_split(st.substr(colon + 1), ',')) {
            size_t eq = item.find('=');
            if (eq == std::string::npos) { *err = where + ": '" + item.substr(0, 64) + "' is not NAME=WEIGHT"; return 0; }
            std::string name = item.substr(0, eq);
            size_t idx = 0;
            while (idx < sources.size() && sources[idx].name != name) idx++;
            if (idx == sources.size()) { *err = where + ": no source named '" + name.substr(0, 64) + "' in --data"; return 0; }
            if (seen[idx]) { *err = where + " names '" + name + "' twice"; return 0; }
            double w;
            if (!data_parse_weight(item.substr(eq + 1), &w) || w < 0) {
                *err = where + ": the weight of '" + name + "' must be a number >= 0";
                return 0;
            }
            seen[idx] = true;
            stage.weight[idx] = w;
            total += w;
        }
        for (size_t i = 0; i < sources.size(); i++)
            if (!seen[i]) { *err = where + " gives no weight to source '" + sources[i].name + "' (name every source)"; return 0; }
        if (!(total > 0)) { *err = where + ": the weights sum to 0"; return 0; }
        out->push_back(stage);
    }
    return 1;
}

// ---------------------------------------------------------------------------------------------
// hashing and permutations

static inline uint64_t data_mix(uint64_t x) {   // splitmix64's finaliser
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static inline uint64_t data_key(uint64_t a, uint64_t b) { return data_mix(a ^ data_mix(b + 0x9E3779B97F4A7C15ull)); }

#define DATA_TAG_SHARDS 0x5348415244ull   // keys of the different draws
#define DATA_TAG_WINDOWS 0x57494e444full
#define DATA_TAG_MIX 0x4d4958ull

// A keyed pseudo-random permutation of [0, n), evaluated at i: a 4-round Feistel network over the
// smallest power of four >= n, repeated ("cycle walking") until the value falls inside [0, n).
// The walk ends: the Feistel map is a bijection, so i's cycle returns to [0, n) (expected < 4 rounds).
static inline int64_t data_permute(int64_t i, int64_t n, uint64_t key) {
    if (n <= 1) return i;
    int bits = 64 - __builtin_clzll((uint64_t)(n - 1));
    bits += bits & 1;
    int half = bits / 2;
    uint64_t mask = (1ull << half) - 1, x = (uint64_t)i;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t t = l ^ (data_mix(key ^ (round << 56) ^ r) & mask);
            l = r;
            r = t;
        }
        x = (l << half) | r;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

// ---------------------------------------------------------------------------------------------
// the loader

typedef struct {
    std::string name, pattern;
    std::vector<Shard> shards;          // in glob (sorted) order
    std::vector<int64_t> windows;       // windows of each shard
    int64_t total_windows;
    int64_t cached_epoch;               // the epoch whose shard order is in order/prefix
    std::vector<int64_t> order;         // shard indices in this epoch's order
    std::vector<int64_t> prefix;        // prefix[k] = windows of order[0..k)
} DataSource;

typedef struct {
    uint64_t seed;        // seed of every permutation and draw
    int shuffle;          // 1: the training order above; 0: the fixed order of validation
    int grad_accum;       // micro-batches per optimizer step (the schedule counts optimizer steps)
    const char* schedule; // --data-schedule, or NULL
} DataLoaderOptions;

typedef struct {
    std::vector<DataSource> sources;
    std::vector<DataStage> stages;      // stage 0 (step 0) holds the --data weights
    int B, T, rank, world, vocab_size, grad_accum, shuffle;
    int cp_n, cp_rank;                  // context parallelism: rank/world are the CP groups'; this rank's place in its group
    uint64_t seed;
    int64_t position;                   // global sequences served
    int64_t batches;                    // global batches (micro-batches) served
    std::vector<int64_t> source_position;   // sequences taken from each source
    std::vector<int> inputs, targets;   // (B, T) each (under CP the first B x T/cp_n: this rank's chunks)
    std::vector<int> row_source;        // (B) the source of each row of this rank's last batch
} DataLoader;

// The state that resumes the token stream exactly: a plain struct of integers.
typedef struct {
    uint64_t seed;
    int64_t position;                   // global sequences served (the next global sequence index)
    int64_t batches;                    // global batches served
    int32_t num_sources;
    int64_t source_epoch[DATA_MAX_SOURCES];     // = source_position / source_windows
    int64_t source_position[DATA_MAX_SOURCES];  // sequences drawn from each source
    int64_t source_windows[DATA_MAX_SOURCES];   // windows of each source (checked on restore)
} DataLoaderState;

static inline std::vector<std::string> glob_files(const char* pattern, const char* flag) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        if (rc == 0) globfree(&g);
        fail(EXIT_BAD_INPUT, "%s '%s' matches no file", flag, pattern);
    }
    if (rc != 0) fail(EXIT_BAD_INPUT, "%s '%s': glob failed (%d)", flag, pattern, rc);
    std::vector<std::string> files(g.gl_pathv, g.gl_pathv + g.gl_pathc);  // glob sorts them
    globfree(&g);
    return files;
}

// the weights of the stage in force at micro-batch `batch`
static inline const DataStage* data_stage_at(const DataLoader* dl, int64_t batch) {
    int64_t step = batch / dl->grad_accum;
    size_t k = 0;
    while (k + 1 < dl->stages.size() && dl->stages[k + 1].step <= step) k++;
    return &dl->stages[k];
}

// the source of global sequence i under stage st
static inline int data_pick_source(const DataLoader* dl, const DataStage* st, int64_t i) {
    int ns = (int)dl->sources.size();
    if (ns == 1) return 0;
    double total = 0;
    for (int s = 0; s < ns; s++) total += st->weight[s];
    double u = (double)(data_key(data_key(dl->seed, DATA_TAG_MIX), (uint64_t)i) >> 11) * (1.0 / 9007199254740992.0) * total;
    int last = 0;
    double acc = 0;
    for (int s = 0; s < ns; s++) {
        if (st->weight[s] <= 0) continue;
        acc += st->weight[s];
        last = s;
        if (u < acc) return s;
    }
    return last;   // u rounded up to the total
}

// Copies window `p` of source `src`'s stream (position p counted over all epochs) into dst (T+1).
static inline void data_read_window(DataLoader* dl, int src, int64_t p, int* dst_in, int* dst_tg) {
    DataSource* s = &dl->sources[src];
    int64_t epoch = p / s->total_windows, idx = p % s->total_windows;
    int64_t ns = (int64_t)s->shards.size();
    if (s->cached_epoch != epoch) {
        uint64_t key = data_key(data_key(data_key(dl->seed, DATA_TAG_SHARDS), (uint64_t)src), (uint64_t)epoch);
        s->order.resize(ns);
        s->prefix.resize(ns + 1);
        s->prefix[0] = 0;
        for (int64_t k = 0; k < ns; k++) {
            s->order[k] = dl->shuffle ? data_permute(k, ns, key) : k;
            s->prefix[k + 1] = s->prefix[k] + s->windows[s->order[k]];
        }
        s->cached_epoch = epoch;
    }
    int64_t k = (int64_t)(std::upper_bound(s->prefix.begin(), s->prefix.end(), idx) - s->prefix.begin()) - 1;
    int64_t shard = s->order[k], local = idx - s->prefix[k];
    int64_t w = local;
    if (dl->shuffle) {
        uint64_t key = data_key(data_key(data_key(data_key(dl->seed, DATA_TAG_WINDOWS), (uint64_t)src), (uint64_t)epoch),
                                (uint64_t)shard);
        w = data_permute(local, s->windows[shard], key);
    }
    const Shard* sh = &s->shards[shard];
    int64_t at = w * dl->T, T = dl->T;
    uint32_t vmax = 0;
    if (sh->info.bytes_per_token == 2) {
        const uint16_t* t = (const uint16_t*)sh->payload + at;
        for (int64_t i = 0; i < T; i++) { dst_in[i] = t[i]; dst_tg[i] = t[i + 1]; vmax = std::max(vmax, (uint32_t)t[i]); }
        vmax = std::max(vmax, (uint32_t)t[T]);
    } else {
        const uint32_t* t = (const uint32_t*)sh->payload + at;
        for (int64_t i = 0; i < T; i++) { dst_in[i] = (int)t[i]; dst_tg[i] = (int)t[i + 1]; vmax = std::max(vmax, t[i]); }
        vmax = std::max(vmax, t[T]);
    }
    if (vmax >= (uint32_t)dl->vocab_size) {   // name the shard's first bad token
        int64_t bad = shard_find_bad_token(sh->payload, sh->info.bytes_per_token, 0, sh->info.num_tokens, dl->vocab_size);
        fail(EXIT_BAD_INPUT, "%s: token %u at offset %lld (byte %lld) is >= the vocabulary size %d", sh->path.c_str(),
             shard_token_at(sh->payload, sh->info.bytes_per_token, bad), (long long)bad,
             (long long)(SHARD_HEADER_BYTES + bad * sh->info.bytes_per_token), dl->vocab_size);
    }
}

// spec: a glob or a mixture (data_spec_parse); flag names it in errors. opt NULL: validation order.
static inline void dataloader_init(DataLoader* dl, const char* spec, const char* flag, int B, int T, int rank, int world,
                                   int vocab_size, const DataLoaderOptions* opt) {
    dl->B = B; dl->T = T; dl->rank = rank; dl->world = world; dl->vocab_size = vocab_size;
    dl->cp_n = 1; dl->cp_rank = 0;
    dl->seed = opt ? opt->seed : 0;
    dl->shuffle = opt ? opt->shuffle : 0;
    dl->grad_accum = opt && opt->grad_accum > 0 ? opt->grad_accum : 1;
    std::vector<DataSpecEntry> entries;
    std::string err;
    if (!data_spec_parse(spec, &entries, &err)) fail(EXIT_BAD_INPUT, "%s '%s' %s", flag, spec, err.c_str());
    if (!opt && entries.size() > 1) fail(EXIT_BAD_INPUT, "%s '%s': validation takes one glob, not a mixture", flag, spec);
    DataStage first = {};
    first.step = 0;
    for (size_t i = 0; i < entries.size(); i++) first.weight[i] = entries[i].weight;
    dl->stages.assign(1, first);
    if (opt && opt->schedule && opt->schedule[0]) {
        std::vector<DataStage> more;
        if (!data_schedule_parse(opt->schedule, entries, &more, &err))
            fail(EXIT_BAD_INPUT, "--data-schedule '%s' %s", opt->schedule, err.c_str());
        dl->stages.insert(dl->stages.end(), more.begin(), more.end());
    }
    for (const DataSpecEntry& e : entries) {
        DataSource s;
        s.name = e.name;
        s.pattern = e.pattern;
        s.total_windows = 0;
        s.cached_epoch = -1;
        std::string what = e.name.empty() ? std::string(flag) : std::string(flag) + " source '" + e.name + "'";
        for (const std::string& f : glob_files(e.pattern.c_str(), what.c_str())) {
            Shard sh = shard_open(f.c_str());
            if (sh.info.num_tokens < (int64_t)T + 1)
                fail(EXIT_BAD_INPUT, "%s: %lld tokens is smaller than one sequence (%lld tokens)", f.c_str(),
                     (long long)sh.info.num_tokens, (long long)T + 1);
            s.windows.push_back((sh.info.num_tokens - 1) / T);
            s.total_windows += s.windows.back();
            s.shards.push_back(sh);
        }
        dl->sources.push_back(s);
    }
    dl->position = 0;
    dl->batches = 0;
    dl->source_position.assign(dl->sources.size(), 0);
    dl->inputs.assign((size_t)B * T, 0);
    dl->targets.assign((size_t)B * T, 0);
    dl->row_source.assign((size_t)B, 0);
}

// A shard that changed on disk since it was opened (rewritten, replaced, truncated: data/shard.h) is
// no longer the data that was validated, and a resume would not see what this run saw: one line naming
// it, exit 2. Asked at the start of every epoch of a source, and at every reset (validation passes):
// a few stat() calls per epoch.
static inline void data_source_check(const DataSource* s) {
    for (const Shard& sh : s->shards) {
        std::string why = shard_unchanged(&sh);
        if (!why.empty())
            fail(EXIT_BAD_INPUT, "%s: the shard changed while training was running: %s (restore it, or restart the run)",
                 sh.path.c_str(), why.c_str());
    }
}

static inline void dataloader_reset(DataLoader* dl) {
    for (const DataSource& s : dl->sources) data_source_check(&s);
    dl->position = 0;
    dl->batches = 0;
    std::fill(dl->source_position.begin(), dl->source_position.end(), 0);
}

static inline void dataloader_free(DataLoader* dl) {
    for (DataSource& s : dl->sources)
        for (Shard& sh : s.shards) shard_close(&sh);
    dl->sources.clear();
}

// Context parallelism over groups of n consecutive ranks (parallel/context_parallel.h): the n ranks of a
// group read the same sequences, the group's slice of the global batch (the slices are the groups', world /
// n of them), and rank r of the group keeps chunks r and 2n-1-r of the 2n chunks of every sequence
// (model/attention_ring.h): inputs/targets become (B, T/n). The global state is the same: resume is exact
// and checkpoints do not depend on n. T % (2n) and world % n are checked by the caller.
static inline void dataloader_context_parallel(DataLoader* dl, int n) {
    if (n <= 1) return;
    dl->cp_n = n; dl->cp_rank = dl->rank % n;
    dl->rank /= n; dl->world /= n;
}
// in place: row b's chunks to [b Tl, (b+1) Tl); every destination lies at or before its source
static inline void data_cp_compact(DataLoader* dl, std::vector<int>* v) {
    int n = dl->cp_n, c = dl->T / (2 * n), Tl = dl->T / n;
    for (int64_t b = 0; b < dl->B; b++)
        for (int i = 0; i < 2; i++) {
            int g = i == 0 ? dl->cp_rank : 2 * n - 1 - dl->cp_rank;
            memmove(v->data() + b * Tl + (int64_t)i * c, v->data() + b * dl->T + (int64_t)g * c, (size_t)c * sizeof(int));
        }
}

// Fills inputs/targets (B, T) with this rank's slice of the next global batch and advances the
// global state. Returns 1 when some source began a new epoch during this batch.
static inline int dataloader_next(DataLoader* dl) {
    int64_t GB = (int64_t)dl->B * dl->world, lo = (int64_t)dl->rank * dl->B;
    const DataStage* st = data_stage_at(dl, dl->batches);
    int wrapped = 0;
    for (int64_t j = 0; j < GB; j++) {
        int src = data_pick_source(dl, st, dl->position + j);
        int64_t p = dl->source_position[src]++;
        if (p > 0 && p % dl->sources[src].total_windows == 0) {   // a new epoch of this source
            wrapped = 1;
            data_source_check(&dl->sources[src]);
        }
        if (j >= lo && j < lo + dl->B) {
            int64_t row = j - lo;
            data_read_window(dl, src, p, &dl->inputs[row * dl->T], &dl->targets[row * dl->T]);
            dl->row_source[row] = src;
        }
    }
    dl->position += GB;
    dl->batches++;
    if (dl->cp_n > 1) { data_cp_compact(dl, &dl->inputs); data_cp_compact(dl, &dl->targets); }
    return wrapped;
}

// one line per source: shards, tokens, windows, weight
static inline std::string dataloader_describe(const DataLoader* dl, const char* flag) {
    std::string out;
    char line[512];
    for (size_t i = 0; i < dl->sources.size(); i++) {
        const DataSource& s = dl->sources[i];
        int64_t tokens = 0;
        for (const Shard& sh : s.shards) tokens += sh.info.num_tokens;
        snprintf(line, sizeof line, "%s%s%s: %zu shard(s), %lld tokens, %lld sequences of %d+1 tokens%s", flag,
                 s.name.empty() ? "" : " ", s.name.c_str(), s.shards.size(), (long long)tokens, (long long)s.total_windows,
                 dl->T, dl->shuffle ? "" : " (fixed order)");
        out += line;
        if (dl->sources.size() > 1) {
            snprintf(line, sizeof line, ", weight %g", dl->stages[0].weight[i]);
            out += line;
        }
        out += "\n";
    }
    for (size_t k = 1; k < dl->stages.size(); k++) {
        snprintf(line, sizeof line, "--data-schedule: from step %lld:", (long long)dl->stages[k].step);
        out += line;
        for (size_t i = 0; i < dl->sources.size(); i++) {
            snprintf(line, sizeof line, " %s %g", dl->sources[i].name.c_str(), dl->stages[k].weight[i]);
            out += line;
        }
        out += "\n";
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// state: get/set, and one JSON line for checkpoints

static inline void dataloader_get_state(const DataLoader* dl, DataLoaderState* st) {
    memset(st, 0, sizeof *st);
    st->seed = dl->seed;
    st->position = dl->position;
    st->batches = dl->batches;
    st->num_sources = (int32_t)dl->sources.size();
    for (size_t i = 0; i < dl->sources.size(); i++) {
        st->source_position[i] = dl->source_position[i];
        st->source_windows[i] = dl->sources[i].total_windows;
        st->source_epoch[i] = dl->source_position[i] / dl->sources[i].total_windows;
    }
}

// Restores a state taken from a loader over the same data and --seq (any number of ranks and any
// micro-batch size); a state that does not fit this data is bad input. The seed comes from the state.
static inline void dataloader_set_state(DataLoader* dl, const DataLoaderState* st, const char* what) {
    if (st->num_sources != (int32_t)dl->sources.size())
        fail(EXIT_BAD_INPUT, "%s: the data loader state has %d source(s), --data has %zu", what, st->num_sources, dl->sources.size());
    for (size_t i = 0; i < dl->sources.size(); i++)
        if (st->source_windows[i] != dl->sources[i].total_windows)
            fail(EXIT_BAD_INPUT, "%s: source %zu has %lld sequences of %d+1 tokens but the state was taken over %lld: "
                 "the data or --seq changed", what, i + 1, (long long)dl->sources[i].total_windows, dl->T,
                 (long long)st->source_windows[i]);
    dl->seed = st->seed;
    dl->position = st->position;
    dl->batches = st->batches;
    for (size_t i = 0; i < dl->sources.size(); i++) {
        dl->source_position[i] = st->source_position[i];
        dl->sources[i].cached_epoch = -1;
    }
}

// {"version": 1, "seed": S, "position": P, "batches": N, "sources": [{"epoch": E, "position": P, "windows": W}, ...]}
static inline std::string dataloader_state_write(const DataLoaderState* st) {
    char buf[256];
    snprintf(buf, sizeof buf, "{\"version\": 1, \"seed\": %llu, \"position\": %lld, \"batches\": %lld, \"sources\": [",
             (unsigned long long)st->seed, (long long)st->position, (long long)st->batches);
    std::string out = buf;
    for (int i = 0; i < st->num_sources; i++) {
        snprintf(buf, sizeof buf, "%s{\"epoch\": %lld, \"position\": %lld, \"windows\": %lld}", i ? ", " : "",
                 (long long)st->source_epoch[i], (long long)st->source_position[i], (long long)st->source_windows[i]);
        out += buf;
    }
    return out + "]}";
}

// a small strict reader for exactly the line above (whitespace free between tokens)
typedef struct { const char* p; } DataJson;
static inline void data_json_ws(DataJson* j) { while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r') j->p++; }
static inline bool data_json_lit(DataJson* j, const char* lit) {
    data_json_ws(j);
    size_t n = strlen(lit);
    if (strncmp(j->p, lit, n) != 0) return false;
    j->p += n;
    return true;
}
static inline bool data_json_u64(DataJson* j, uint64_t* v) {
    data_json_ws(j);
    if (*j->p < '0' || *j->p > '9') return false;
    char* end = NULL;
    errno = 0;
    unsigned long long x = strtoull(j->p, &end, 10);
    if (errno) return false;
    j->p = end;
    *v = x;
    return true;
}
static inline bool data_json_field(DataJson* j, const char* key, uint64_t* v, bool first) {
    char lit[64];
    snprintf(lit, sizeof lit, "\"%s\"", key);
    return (first || data_json_lit(j, ",")) && data_json_lit(j, lit) && data_json_lit(j, ":") && data_json_u64(j, v);
}

// Parses dataloader_state_write's line; returns 1, or 0 with err set. Checks its consistency.
static inline int dataloader_state_parse(const char* text, DataLoaderState* st, std::string* err) {
    memset(st, 0, sizeof *st);
    DataJson j = {text};
    uint64_t version = 0, position = 0, batches = 0;
    if (!data_json_lit(&j, "{") || !data_json_field(&j, "version", &version, true) || version != 1) {
        *err = "is not a version-1 data loader state";
        return 0;
    }
    if (!data_json_field(&j, "seed", &st->seed, false) || !data_json_field(&j, "position", &position, false) ||
        !data_json_field(&j, "batches", &batches, false) || !data_json_lit(&j, ",") || !data_json_lit(&j, "\"sources\"") ||
        !data_json_lit(&j, ":") || !data_json_lit(&j, "[")) {
        *err = "is malformed before \"sources\"";
        return 0;
    }
    if (position > (uint64_t)INT64_MAX || batches > (uint64_t)INT64_MAX) { *err = "has a position out of range"; return 0; }
    st->position = (int64_t)position;
    st->batches = (int64_t)batches;
    uint64_t sum = 0;
    for (int i = 0;; i++) {
        if (data_json_lit(&j, "]")) break;
        if (i == DATA_MAX_SOURCES) { *err = "has too many sources"; return 0; }
        if (i > 0 && !data_json_lit(&j, ",")) { *err = "is malformed in \"sources\""; return 0; }
        uint64_t e, p, w;
        if (!data_json_lit(&j, "{") || !data_json_field(&j, "epoch", &e, true) || !data_json_field(&j, "position", &p, false) ||
            !data_json_field(&j, "windows", &w, false) || !data_json_lit(&j, "}")) {
            *err = "is malformed in source " + std::to_string(i + 1);
            return 0;
        }
        if (w == 0 || w > (uint64_t)INT64_MAX || p > (uint64_t)INT64_MAX || e != p / w) {
            *err = "has an inconsistent source " + std::to_string(i + 1) + " (epoch must be position / windows)";
            return 0;
        }
        st->source_epoch[i] = (int64_t)e;
        st->source_position[i] = (int64_t)p;
        st->source_windows[i] = (int64_t)w;
        sum += p;
        if (sum > (uint64_t)INT64_MAX) { *err = "has positions out of range"; return 0; }
        st->num_sources = i + 1;
    }
    if (!data_json_lit(&j, "}")) { *err = "is malformed at its end"; return 0; }
    data_json_ws(&j);
    if (*j.p) { *err = "has trailing characters"; return 0; }
    if (st->num_sources == 0) { *err = "has no source"; return 0; }
    if (sum != position) { *err = "is inconsistent: the sources' positions do not add up to the position"; return 0; }
    return 1;
}
