/*
 * bytecount.h — the global-memory bytes and tensor-core FLOPs of each kernel launch, counted by the emulator
 * (the instrumented build: -DSIMT_RACE_DETECT, whose ThreadSanitizer hooks in race.h see every load and store
 * of a kernel; included by race.h). On only while the work log is on (SIMT_WORKLOG, counters.h): each kernel's
 * log line then carries, once the kernel has run,
 *   "rd":R,"wr":W          distinct bytes of global memory (inside a cudaMalloc allocation) the launch read /
 *                          wrote: each byte once however often it is touched, i.e. the DRAM traffic with a
 *                          perfect cache. A byte read before it is written counts in both (an update in place);
 *                          one read only after the launch wrote it does not count as read (the OS thread that
 *                          wrote it is the one that later reads it, as blocks of a launch do not communicate);
 *                          atomics count as a read and a write; cp.async's source is a read
 *   "rd_sec":r,"wr_sec":w  the same in 32-byte sectors touched (the DRAM/L2 transaction granule: a strided or
 *                          misaligned access costs whole sectors)
 *   "mma":F                tensor-core FLOPs: 2*16*8*16 per emulated mma.sync.m16n8k16 (tensor_core.h)
 * Not counted: __shared__ arrays (thread_local here) and the dynamic shared memory, the fibers' stacks (a
 * thread's locals), the kernel's arguments, and the emulator's own code (RaceQuiet). Race detection is
 * independent of it (race_detect_set; the counting trainer train_dbrx_emu_count builds with it off).
 * Each OS thread that runs blocks keeps its own table of sectors (address / 32 -> read and written byte
 * masks); the launch's end merges them (one launch runs at a time per process, as the emulator runs them).
 */
#pragma once

namespace simt {

struct ByteSector { uintptr_t key; uint32_t rd, wr; };   // key: sector number + 1 (0: empty)
struct ByteTable {
    ByteSector* t = nullptr;
    size_t cap = 0, used = 0;
    long long mma = 0;
};
inline std::vector<ByteTable*>& byte_tables() { static std::vector<ByteTable*> v; return v; }
inline std::mutex& byte_tables_mu() { static std::mutex m; return m; }
inline thread_local ByteTable* tls_bytes = nullptr;
// on while a launch is counted (bytes_launch_begin .. end)
inline bool& bytes_counting() { static bool on = false; return on; }

SIMT_NOTSAN inline ByteTable* byte_table() {
    if (!tls_bytes) {
        tls_bytes = new ByteTable();
        tls_bytes->cap = 1 << 12;
        tls_bytes->t = (ByteSector*)calloc(tls_bytes->cap, sizeof(ByteSector));
        std::lock_guard<std::mutex> g(byte_tables_mu());
        byte_tables().push_back(tls_bytes);
    }
    return tls_bytes;
}
SIMT_NOTSAN inline ByteSector* byte_slot(ByteTable* b, uintptr_t key) {
    if (b->used * 2 >= b->cap) {   // grow: double and rehash
        size_t ncap = b->cap * 2;
        ByteSector* n = (ByteSector*)calloc(ncap, sizeof(ByteSector));
        for (size_t i = 0; i < b->cap; i++) {
            if (!b->t[i].key) continue;
            size_t h = mix64(b->t[i].key) & (ncap - 1);
            while (n[h].key) h = (h + 1) & (ncap - 1);
            n[h] = b->t[i];
        }
        free(b->t);
        b->t = n;
        b->cap = ncap;
    }
    size_t h = mix64(key) & (b->cap - 1);
    while (b->t[h].key && b->t[h].key != key) h = (h + 1) & (b->cap - 1);
    if (!b->t[h].key) { b->t[h].key = key; b->used++; }
    return &b->t[h];
}
// `size` bytes at p, read and/or written by the running kernel (its stack excluded by the caller)
SIMT_NOTSAN inline void bytes_record(const void* p, int size, bool rd, bool wr) {
    ByteTable* b = byte_table();
    uintptr_t a = (uintptr_t)p;
    for (uintptr_t s = a & ~(uintptr_t)31; s < a + (uintptr_t)size; s += 32) {
        uintptr_t lo = std::max(s, a), hi = std::min(s + 32, a + (uintptr_t)size);
        uint32_t mask = (uint32_t)((hi - lo == 32 ? ~0ull : ((1ull << (hi - lo)) - 1)) << (lo - s));
        ByteSector* e = byte_slot(b, s / 32 + 1);
        if (rd) e->rd |= mask & ~e->wr;   // a byte this thread wrote first is read from its cache
        if (wr) e->wr |= mask;
    }
}
SIMT_NOTSAN inline void bytes_mma(long long flops) { if (bytes_counting()) byte_table()->mma += flops; }

struct ByteCounts { long long rd, wr, rd_sec, wr_sec, mma; };
inline void bytes_launch_begin() { bytes_counting() = true; }
// the launch's totals; every thread's table emptied for the next launch
inline ByteCounts bytes_launch_end() {
    bytes_counting() = false;
    ByteTable all;
    all.cap = 1 << 12;
    all.t = (ByteSector*)calloc(all.cap, sizeof(ByteSector));
    std::lock_guard<std::mutex> g(byte_tables_mu());
    for (ByteTable* b : byte_tables()) {
        for (size_t i = 0; i < b->cap && b->used; i++) {
            if (!b->t[i].key) continue;
            ByteSector* e = byte_slot(&all, b->t[i].key);
            e->rd |= b->t[i].rd;
            e->wr |= b->t[i].wr;
        }
        all.mma += b->mma;
        b->mma = 0;
        if (b->used) memset(b->t, 0, b->cap * sizeof(ByteSector));
        b->used = 0;
    }
    ByteCounts c = {0, 0, 0, 0, all.mma};
    for (size_t i = 0; i < all.cap; i++) {
        const ByteSector& e = all.t[i];
        if (!e.key || !race_is_global((const void*)((e.key - 1) * 32 + __builtin_ctz(e.rd | e.wr)))) continue;
        c.rd += __builtin_popcount(e.rd);
        c.wr += __builtin_popcount(e.wr);
        c.rd_sec += e.rd != 0;
        c.wr_sec += e.wr != 0;
    }
    free(all.t);
    return c;
}

}  // namespace simt
