/*
 * dataloader.h — reads pre-tokenized shards and serves (B, T) batches of inputs and next-token
 * targets.
 * Shard format (llm.c's): a header of 256 int32 — [0] magic 20240520, [1] version 1, [2] number of
 * tokens — then the tokens as uint16. Shards are memory-mapped, never read whole; the file size is
 * checked against the header.
 * Order (for now): the shards of a glob in sorted order, read as one stream of windows of B*T+1
 * tokens; rank r of W takes window r, r+W, ... of every step, so the ranks read disjoint slices.
 * A shard's last partial window is skipped. (The data issue replaces this with a seeded, rank-count
 * independent order and exact resume.)
 */
#pragma once
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "../model/common.h"

#define SHARD_MAGIC 20240520
#define SHARD_HEADER_INTS 256

typedef struct {
    std::string path;
    const uint16_t* tokens;   // mapped
    int64_t num_tokens;
    void* map;
    size_t map_bytes;
} Shard;

// Opens and validates one shard; any problem is bad input: one line naming the file, exit 2.
static inline Shard shard_open(const char* path, int64_t min_tokens) {
    Shard s;
    s.path = path;
    int fd = open(path, O_RDONLY);
    if (fd < 0) fail(EXIT_BAD_INPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fail(EXIT_BAD_INPUT, "%s: cannot stat: %s", path, strerror(errno));
    int64_t size = st.st_size;
    if (size < (int64_t)(SHARD_HEADER_INTS * sizeof(int32_t)))
        fail(EXIT_BAD_INPUT, "%s: truncated: %lld bytes is smaller than the 1024-byte header", path, (long long)size);
    void* map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) fail(EXIT_RUNTIME, "%s: mmap failed: %s", path, strerror(errno));
    close(fd);
    const int32_t* h = (const int32_t*)map;
    if (h[0] != SHARD_MAGIC) fail(EXIT_BAD_INPUT, "%s: bad magic %d at offset 0 (expected %d)", path, h[0], SHARD_MAGIC);
    if (h[1] != 1) fail(EXIT_BAD_INPUT, "%s: unsupported version %d at offset 4 (expected 1)", path, h[1]);
    int64_t n = h[2];
    int64_t expect = (int64_t)SHARD_HEADER_INTS * 4 + n * 2;
    if (n < 0 || size != expect)
        fail(EXIT_BAD_INPUT, "%s: file is %lld bytes but its header says %lld tokens (%lld bytes)", path,
             (long long)size, (long long)n, (long long)expect);
    if (n < min_tokens)
        fail(EXIT_BAD_INPUT, "%s: %lld tokens is smaller than one sequence (%lld tokens)", path, (long long)n,
             (long long)min_tokens);
    s.tokens = (const uint16_t*)((const char*)map + SHARD_HEADER_INTS * 4);
    s.num_tokens = n;
    s.map = map;
    s.map_bytes = (size_t)size;
    return s;
}

typedef struct {
    std::vector<Shard> shards;
    int B, T, rank, world, vocab_size;
    size_t shard_index;
    int64_t position;        // token offset of this step's first window in the current shard
    std::vector<int> inputs, targets;   // (B, T) each
} DataLoader;

static inline std::vector<std::string> glob_files(const char* pattern, const char* flag) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0))
        fail(EXIT_BAD_INPUT, "%s '%s' matches no file", flag, pattern);
    if (rc != 0) fail(EXIT_BAD_INPUT, "%s '%s': glob failed (%d)", flag, pattern, rc);
    std::vector<std::string> files(g.gl_pathv, g.gl_pathv + g.gl_pathc);  // glob sorts them
    globfree(&g);
    return files;
}

static inline void dataloader_init(DataLoader* dl, const char* pattern, const char* flag, int B, int T, int rank,
                                   int world, int vocab_size) {
    dl->B = B; dl->T = T; dl->rank = rank; dl->world = world; dl->vocab_size = vocab_size;
    for (const std::string& f : glob_files(pattern, flag)) dl->shards.push_back(shard_open(f.c_str(), (int64_t)T + 1));
    dl->shard_index = 0;
    dl->position = 0;
    dl->inputs.resize((size_t)B * T);
    dl->targets.resize((size_t)B * T);
}

static inline void dataloader_reset(DataLoader* dl) { dl->shard_index = 0; dl->position = 0; }

static inline void dataloader_free(DataLoader* dl) {
    for (Shard& s : dl->shards) munmap(s.map, s.map_bytes);
    dl->shards.clear();
}

// Fills inputs/targets with this rank's B windows of the next global batch. Returns 1 when it
// wrapped around to the first shard (an epoch ended).
static inline int dataloader_next(DataLoader* dl) {
    int wrapped = 0;
    int64_t step_tokens = (int64_t)dl->B * dl->T * dl->world;
    for (size_t tries = 0;; tries++) {
        const Shard& s = dl->shards[dl->shard_index];
        if (dl->position + step_tokens + 1 <= s.num_tokens) break;
        if (tries > dl->shards.size())
            fail(EXIT_BAD_INPUT, "%s: no shard holds one global batch of %lld tokens (batch %d x seq %d x %d ranks, +1)",
                 s.path.c_str(), (long long)step_tokens + 1, dl->B, dl->T, dl->world);
        // the rest of this shard cannot hold a whole global batch: move on to the next shard
        dl->position = 0;
        if (++dl->shard_index == dl->shards.size()) { dl->shard_index = 0; wrapped = 1; }
    }
    const Shard& s = dl->shards[dl->shard_index];
    int64_t base = dl->position + (int64_t)dl->rank * dl->B * dl->T;
    for (int64_t i = 0; i < (int64_t)dl->B * dl->T; i++) {
        int64_t at = base + i;
        int in = s.tokens[at], tg = s.tokens[at + 1];
        if (in >= dl->vocab_size || tg >= dl->vocab_size) {
            int64_t bad = in >= dl->vocab_size ? at : at + 1;
            fail(EXIT_BAD_INPUT, "%s: token %d at offset %lld (byte %lld) is >= the vocabulary size %d", s.path.c_str(),
                 (int)s.tokens[bad], (long long)bad, (long long)(SHARD_HEADER_INTS * 4 + bad * 2), dl->vocab_size);
        }
        dl->inputs[i] = in;
        dl->targets[i] = tg;
    }
    dl->position += step_tokens;
    return wrapped;
}
