/*
 * shard.h — the token shard format: a header of 256 little-endian int32, then the tokens.
 *
 *   h[0] magic    20240520
 *   h[1] version  1: uint16 tokens (llm.c's format, read unchanged)
 *                 2: uint32 tokens (this project's, for vocabularies above 65536, e.g. DBRX's 100352)
 *   h[2] tokens   version 1: the token count (int32, as llm.c writes it)
 *                 version 2: the low 32 bits of the token count (unsigned)
 *   h[3] bytes per token: version 1: 0 (llm.c leaves it 0) or 2; version 2: 4
 *   h[4] version 2: the high 32 bits of the token count (so a shard may hold more than 2^31 tokens)
 *   h[5..255] 0 (reserved)
 * llm.c's uint32 format (magic 20240801, version 7, h[2] = count) is read too.
 * The file size must be exactly 1024 + count * bytes-per-token. All offsets are 64-bit.
 *
 * shard_check() validates a header against the file's bytes and returns an error message instead
 * of exiting, so that the fuzzer (test/fuzz_data.cpp) can drive it with arbitrary bytes;
 * shard_open() maps a file (never reads it whole) and turns any problem into one line + exit 2.
 * shard_write() writes a shard aside, fsyncs it and renames it into place.
 *
 * A mapped file can change under a running job. Truncated, reading a page past its new end raises
 * SIGBUS: the handler installed by shard_open names the shard the address falls in, in one line, and
 * exits 2 (any other SIGBUS goes to the handler that was there before). Rewritten or replaced, the
 * mapping no longer holds what was validated: shard_unchanged() compares the file with what was opened
 * (device, inode, size, modification time); the loader asks at the start of every epoch.
 */
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include "../model/common.h"

#define SHARD_MAGIC 20240520
#define SHARD_MAGIC_LLMC_U32 20240801   // llm.c's llama-3 shards: version 7, uint32 tokens
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

typedef struct {
    int version;
    int bytes_per_token;   // 2 or 4
    int64_t num_tokens;
} ShardInfo;

// Validates the header at the start of a file of `size` bytes (`bytes` holds at least
// min(size, 1024) of them). Returns 1 and fills *info, or 0 and writes a message (without the file
// name) into err.
static inline int shard_check(const void* bytes, int64_t size, ShardInfo* info, char* err, size_t errlen) {
    if (size < SHARD_HEADER_BYTES) {
        snprintf(err, errlen, "truncated: %lld bytes is smaller than the %d-byte header", (long long)size, SHARD_HEADER_BYTES);
        return 0;
    }
    int32_t h[8];
    memcpy(h, bytes, sizeof h);   // the header of a mapped file is aligned, but fuzz input need not be
    if (h[0] == SHARD_MAGIC_LLMC_U32) {
        if (h[1] != 7) { snprintf(err, errlen, "unsupported version %d at offset 4 (magic %d expects 7)", h[1], h[0]); return 0; }
        info->version = 7; info->bytes_per_token = 4; info->num_tokens = h[2];
    } else if (h[0] != SHARD_MAGIC) {
        snprintf(err, errlen, "bad magic %d at offset 0 (expected %d)", h[0], SHARD_MAGIC);
        return 0;
    } else if (h[1] == 1) {
        if (h[3] != 0 && h[3] != 2) { snprintf(err, errlen, "version 1 has 2 bytes per token, header says %d at offset 12", h[3]); return 0; }
        info->version = 1; info->bytes_per_token = 2; info->num_tokens = h[2];
    } else if (h[1] == 2) {
        if (h[3] != 4) { snprintf(err, errlen, "version 2 has 4 bytes per token, header says %d at offset 12", h[3]); return 0; }
        info->version = 2; info->bytes_per_token = 4;
        info->num_tokens = (int64_t)(((uint64_t)(uint32_t)h[4] << 32) | (uint32_t)h[2]);
    } else {
        snprintf(err, errlen, "unsupported version %d at offset 4 (expected 1 or 2)", h[1]);
        return 0;
    }
    // the size check in 64 bits, guarded against overflow: count <= (size - header) / bpt
    int64_t payload = size - SHARD_HEADER_BYTES;
    if (info->num_tokens < 0 || info->num_tokens > payload / info->bytes_per_token ||
        info->num_tokens * info->bytes_per_token != payload) {
        snprintf(err, errlen, "file is %lld bytes but its header says %lld tokens (%lld bytes)", (long long)size,
                 (long long)info->num_tokens,
                 info->num_tokens < 0 || info->num_tokens > INT64_MAX / 8 ? -1LL
                     : (long long)(SHARD_HEADER_BYTES + info->num_tokens * info->bytes_per_token));
        return 0;
    }
    return 1;
}

// token i of a shard payload (little-endian uint16 or uint32)
static inline uint32_t shard_token_at(const uint8_t* payload, int bytes_per_token, int64_t i) {
    if (bytes_per_token == 2) { uint16_t t; memcpy(&t, payload + 2 * i, 2); return t; }
    uint32_t t; memcpy(&t, payload + 4 * i, 4); return t;
}

// Index of the first token >= vocab_size in [from, to), or -1.
static inline int64_t shard_find_bad_token(const uint8_t* payload, int bytes_per_token, int64_t from, int64_t to,
                                           int64_t vocab_size) {
    for (int64_t i = from; i < to; i++)
        if (shard_token_at(payload, bytes_per_token, i) >= (uint64_t)vocab_size) return i;
    return -1;
}

// ---------------------------------------------------------------------------------------------
// the SIGBUS guard: every mapped shard's address range and path, in a list the handler can walk
// (nodes are made and unlinked only by the thread that opens and closes shards, outside the handler)

typedef struct ShardMapEntry {
    uintptr_t lo, hi;             // the mapping [lo, hi)
    struct ShardMapEntry* volatile next;
    char path[1];                 // allocated to the path's length
} ShardMapEntry;
static ShardMapEntry* volatile g_shard_maps = NULL;
static struct sigaction g_shard_sigbus_prev;
static bool g_shard_sigbus_installed = false;

static inline void shard_write_u64(char* buf, size_t* n, uint64_t v) {   // decimal, signal-safe
    char d[24];
    int nd = 0;
    do { d[nd++] = (char)('0' + v % 10); v /= 10; } while (v > 0);
    while (nd > 0) buf[(*n)++] = d[--nd];
}

static inline void shard_on_sigbus(int sig, siginfo_t* info, void* ctx) {
    uintptr_t a = (uintptr_t)info->si_addr;
    const ShardMapEntry* hit = NULL;
    for (const ShardMapEntry* e = g_shard_maps; e && info->si_code > 0; e = e->next)
        if (a >= e->lo && a < e->hi) hit = e;
    if (!hit) {   // not ours: the previous disposition takes it (the faulting access runs again, or re-raise)
        sigaction(SIGBUS, &g_shard_sigbus_prev, NULL);
        if (info->si_code <= 0) raise(sig);
        (void)ctx;
        return;
    }
    char msg[4608];
    size_t n = 0;
    auto put = [&](const char* s) { while (*s && n < sizeof msg - 2) msg[n++] = *s++; };
    put("error: ");
    put(hit->path);
    put(": SIGBUS reading byte ");
    shard_write_u64(msg, &n, (uint64_t)(a - hit->lo));
    put(" of the memory-mapped shard: the file was truncated or replaced while training was running (it was ");
    shard_write_u64(msg, &n, (uint64_t)(hit->hi - hit->lo));
    put(" bytes when opened)\n");
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
    _exit(EXIT_BAD_INPUT);
}

typedef struct {
    std::string path;
    ShardInfo info;
    const uint8_t* payload;   // mapped tokens
    void* map;
    size_t map_bytes;
    ShardMapEntry* guard;     // its entry in the SIGBUS guard's list
    // the file as opened: a change of any of these while the job runs is a changed shard
    dev_t dev;
    ino_t ino;
    int64_t mtime_ns;
} Shard;

static inline void shard_guard_add(Shard* s);

static inline int64_t shard_mtime_ns(const struct stat* st) { return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec; }

// a file type in words, for "not a regular file"
static inline const char* shard_file_type(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

// Opens, validates and maps one shard; any problem is bad input: one line naming the file, exit 2.
static inline Shard shard_open(const char* path) {
    Shard s;
    s.path = path;
    s.map = NULL;
    s.guard = NULL;
    // only regular files: stat first, so that a FIFO (whose open() waits for a writer) or a device is
    // never opened; O_NONBLOCK too, in case the path is swapped for one between the two calls
    struct stat st;
    if (stat(path, &st) != 0) fail(EXIT_BAD_INPUT, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(EXIT_BAD_INPUT, "%s: not a regular file (%s)", path, shard_file_type(st.st_mode));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail(EXIT_BAD_INPUT, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) fail(EXIT_BAD_INPUT, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(EXIT_BAD_INPUT, "%s: not a regular file (%s)", path, shard_file_type(st.st_mode));
    s.dev = st.st_dev;
    s.ino = st.st_ino;
    s.mtime_ns = shard_mtime_ns(&st);
    int64_t size = st.st_size;
    uint8_t head[SHARD_HEADER_BYTES] = {0};
    ssize_t got = pread(fd, head, sizeof head, 0);
    if (got < 0) fail(EXIT_BAD_INPUT, "%s: cannot read: %s", path, strerror(errno));
    if (size >= SHARD_HEADER_BYTES && got != SHARD_HEADER_BYTES)
        fail(EXIT_BAD_INPUT, "%s: short read of the header (%lld of %d bytes)", path, (long long)got, SHARD_HEADER_BYTES);
    char err[256];
    if (!shard_check(head, size, &s.info, err, sizeof err)) fail(EXIT_BAD_INPUT, "%s: %s", path, err);
    void* map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) fail(EXIT_RUNTIME, "%s: mmap of %lld bytes failed: %s", path, (long long)size, strerror(errno));
    if (close(fd) != 0) fail(EXIT_RUNTIME, "%s: close: %s", path, strerror(errno));
    s.map = map;
    s.map_bytes = (size_t)size;
    s.payload = (const uint8_t*)map + SHARD_HEADER_BYTES;
    shard_guard_add(&s);
    return s;
}

// Installs the SIGBUS handler (once, keeping the previous one for other faults) and lists the mapping.
static inline void shard_guard_add(Shard* s) {
    if (!g_shard_sigbus_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = shard_on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &g_shard_sigbus_prev) != 0)
            fail(EXIT_RUNTIME, "sigaction(SIGBUS): %s", strerror(errno));
        g_shard_sigbus_installed = true;
    }
    ShardMapEntry* e = (ShardMapEntry*)mallocCheck(sizeof(ShardMapEntry) + s->path.size());
    e->lo = (uintptr_t)s->map;
    e->hi = e->lo + s->map_bytes;
    memcpy(e->path, s->path.c_str(), s->path.size() + 1);
    e->next = g_shard_maps;
    g_shard_maps = e;   // linked in complete: the handler sees the old list or the new one
    s->guard = e;
}

// "" if the file at s->path is still the one opened and mapped (device, inode, size, modification
// time), else what changed
static inline std::string shard_unchanged(const Shard* s) {
    struct stat st;
    if (stat(s->path.c_str(), &st) != 0) return std::string("it is gone (") + strerror(errno) + ")";
    char b[256];
    if (st.st_dev != s->dev || st.st_ino != s->ino) return "it was replaced by another file";
    if ((uint64_t)st.st_size != s->map_bytes) {
        snprintf(b, sizeof b, "its size went from %zu to %lld bytes", s->map_bytes, (long long)st.st_size);
        return b;
    }
    if (shard_mtime_ns(&st) != s->mtime_ns) return "it was modified (same size, new modification time)";
    return "";
}

static inline void shard_close(Shard* s) {
    if (s->guard) {   // unlinked before the unmap: the range may be reused by the next mapping
        for (ShardMapEntry* volatile* p = &g_shard_maps; *p; p = &(*p)->next)
            if (*p == s->guard) { *p = s->guard->next; break; }
        free(s->guard);
        s->guard = NULL;
    }
    if (s->map) munmap(s->map, s->map_bytes);
    s->map = NULL;
}

// Writes tokens as a shard: version 1 (uint16) when every id fits, else version 2 (uint32), or as
// forced by `version`. Written to path.tmp, fsynced, then renamed: never a half-written shard.
static inline void shard_write(const char* path, const uint32_t* tokens, int64_t n, int version) {
    if (version == 0) {
        version = 1;
        for (int64_t i = 0; i < n; i++) if (tokens[i] > 65535) { version = 2; break; }
    }
    int32_t h[SHARD_HEADER_INTS] = {0};
    h[0] = SHARD_MAGIC; h[1] = version;
    if (version == 1) {
        if (n > INT32_MAX) fail(EXIT_BAD_INPUT, "%s: %lld tokens do not fit a version-1 shard", path, (long long)n);
        h[2] = (int32_t)n; h[3] = 2;
    } else {
        h[2] = (int32_t)(uint32_t)((uint64_t)n & 0xffffffffu); h[3] = 4; h[4] = (int32_t)((uint64_t)n >> 32);
    }
    std::string tmp = std::string(path) + ".tmp";
    FILE* f = fopenCheck(tmp.c_str(), "wb");
    fwriteCheck(h, sizeof h, 1, f, tmp.c_str());
    const int64_t chunk = 1 << 20;
    uint16_t buf16[4096];
    for (int64_t i = 0; i < n; i += (version == 1 ? 4096 : chunk)) {
        if (version == 1) {
            int64_t m = n - i < 4096 ? n - i : 4096;
            for (int64_t j = 0; j < m; j++) {
                if (tokens[i + j] > 65535) fail(EXIT_BAD_INPUT, "%s: token %u does not fit a version-1 shard", path, tokens[i + j]);
                buf16[j] = (uint16_t)tokens[i + j];
            }
            fwriteCheck(buf16, 2, (size_t)m, f, tmp.c_str());
        } else {
            int64_t m = n - i < chunk ? n - i : chunk;
            fwriteCheck(tokens + i, 4, (size_t)m, f, tmp.c_str());
        }
    }
    ENSURE(fflush(f) == 0, "flushing %s: %s", tmp.c_str(), strerror(errno));
    ENSURE(fsync(fileno(f)) == 0, "fsync of %s: %s", tmp.c_str(), strerror(errno));
    fcloseCheck(f, tmp.c_str());
    ENSURE(rename(tmp.c_str(), path) == 0, "renaming %s to %s: %s", tmp.c_str(), path, strerror(errno));
}
