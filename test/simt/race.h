/*
 * race.h — the SIMT emulator's data-race detector (built with -DSIMT_RACE_DETECT; included by simt.h).
 *
 * Plain loads and stores of a kernel (to `__shared__` arrays, which are thread_local here, and to global
 * memory) cannot be hooked by macros, so the translation unit is compiled with g++ -fsanitize=thread
 * (and --param=tsan-instrument-func-entry-exit=0) but linked WITHOUT it: the compiler's ThreadSanitizer
 * instrumentation calls __tsan_read4(addr), __tsan_write8(addr), ... before every memory access, and this
 * file defines those functions itself (no libtsan). Outside a kernel they return at once.
 *
 * Inside a kernel every access that is not to a fiber's own stack (locals) is recorded in a shadow table
 * keyed by its 8-byte granule (with a byte mask), per block, tagged with the block's barrier epoch: a
 * __syncthreads() orders everything before it with everything after, so it simply starts a new epoch.
 * Two accesses conflict when they are in the same epoch, by different threads, touch a common byte, at
 * least one writes, neither is atomic (atomics are not recorded), and they are not ordered by a warp
 * synchronisation: lanes of one warp carry vector clocks that every warp rendezvous (shuffle, vote,
 * __syncwarp, mma.sync, ldmatrix) joins, so an access of lane A is ordered before one of lane B when B
 * has since taken part, directly or transitively, in a rendezvous A joined after its access. The
 * ordering depends on the program, not the schedule: a race is caught under any schedule, including the
 * default sequential one.
 *
 * The emulated warp collectives record their memory accesses explicitly, attributed to the lane: ldmatrix
 * reads each lane's row of shared memory, cp.async writes its destination when issued and again when it
 * lands (and reads its source). The emulator's own code, run inside a fiber (barriers, warp operations),
 * is excluded by a per-fiber "quiet" flag (RaceQuiet).
 *
 * A race fails the launch as the emulator's other errors do (simt::Error, or a message and exit 1):
 *   race in kernel K (launched at f:l) block (x,y,z): thread (a) write at model/x.cuh:12, thread (b) read at
 *   model/x.cuh:20, no barrier or warp synchronisation between them (shared memory (dynamic) at +OFFSET)
 * The access sites are return addresses into the kernel's code (of the instrumentation call, or of the
 * emulated instruction's call, which is not inlined in this build), turned into file:line and the inlining
 * caller by addr2line when a race is reported (so build with -g).
 * Negative controls may drop named barriers at run time: DROPPABLE_SYNCTHREADS(name) in the kernels
 * (model/cuda_common.h) is a plain __syncthreads() unless simt::race_drop_barrier(name) is set.
 *
 * The async proxy: a wgmma operand byte last written through the generic proxy (a store, a landed cp.async)
 * needs its writer's fence.proxy.async after the write and ordered before the wgmma's issue (race_proxy_check:
 * "async-proxy race in kernel K ...", model/CUDA.md); TMA's writes are the async proxy's own.
 * Not checked: races between blocks (each block has its own shadow, reset when it starts), an atomic
 * against a plain access, memory fences as ordering (only barriers and warp rendezvous order threads).
 * Compiler-generated guards of thread_local statics are not kernel memory (race_is_tls_guard).
 */
#pragma once
#include <dlfcn.h>

#define SIMT_NOTSAN __attribute__((no_sanitize_thread, noinline))

namespace simt {

// one recorded access: who, where, and the thread's own warp clock when it made it
struct RaceAccess {
    const void* pc;       // the access site: a return address into the kernel's code
    const char* op;       // NULL: a load or store; else the emulated instruction (cp.async, ldmatrix)
    uint32_t clock;
    uint16_t tid;         // linear thread index in the block
    uint8_t mask;         // bytes of the granule
    uint8_t write;
};
// the shadow of one 8-byte granule in the current epoch: two writers and two readers (distinct threads).
// A third thread's access takes the second slot: the first and the newest are kept, and of any two
// distinct threads at least one differs from a later accessor, so a race is lost only when the evicted
// access was the one unordered with it (a thread's repeated accesses merge their byte masks and keep the
// newest warp clock)
struct RaceEntry {
    uintptr_t key;        // granule address / 8
    uint32_t epoch;
    uint8_t nw, nr;
    RaceAccess w[2], r[2];
};

// fence.proxy.async: the last write of one byte of the dynamic shared memory through the generic proxy
struct ProxyByte {
    const void* pc;       // the write site (NULL: none this block, or its last write was TMA's: the async proxy)
    const char* op;       // NULL: a store; else the emulated instruction (cp.async landing)
    uint32_t epoch;       // the barrier epoch of the write (older than the block's first: stale)
    uint32_t gen;         // the writer's fence count at the write: its first fence after it is fence number gen
    uint16_t tid;
};
enum { PROXY_RING = 8 };  // the barrier epochs of each thread's newest fences

struct RaceState {
    bool active = false;            // a fiber of a block runs (set by the scheduler around each switch)
    bool in_hook = false;
    uint32_t epoch = 1;
    RaceEntry* table = nullptr;
    size_t cap = 0, used = 0;
    uint32_t* vc = nullptr;         // (threads, 32): each thread's vector clock over the lanes of its warp
    uint8_t quiet[1024];            // the thread runs emulator code
    int vc_threads = 0;
    uintptr_t stack_lo = 0, stack_hi = 0;   // all fiber stacks of this OS thread
    ProxyByte* proxy = nullptr;     // (SIMT_MAX_DYNAMIC_SMEM): allocated at the first write of a race build's kernel
    uint32_t block_epoch = 0;       // the epoch the running block started in
    uint32_t fences[1024];          // per thread: its fence.proxy.async count this block
    uint32_t fence_epoch[1024][PROXY_RING];   // ... and the epochs of its newest PROXY_RING fences (fence i at i % RING)
};
inline thread_local RaceState* tls_race = nullptr;

// the emulator's code inside a fiber is not the kernel's: its accesses are not recorded
struct RaceQuiet {
    RaceState* r; int i;
    SIMT_NOTSAN RaceQuiet() : r(tls_race), i(-1) {
        Sched* s = tls_sched;
        if (r && s && s->current >= 0) { i = s->current; r->quiet[i]++; }
    }
    SIMT_NOTSAN ~RaceQuiet() { if (i >= 0) r->quiet[i]--; }
};

// barrier names the negative controls drop (DROPPABLE_SYNCTHREADS)
inline std::vector<std::string>& race_dropped() { static std::vector<std::string> v; return v; }
inline void race_drop_barrier_set(const char* name, bool drop) {
    auto& v = race_dropped();
    v.erase(std::remove(v.begin(), v.end(), std::string(name)), v.end());
    if (drop) v.push_back(name);
}
inline bool race_drop_barrier(const char* name) {
    RaceQuiet q;   // (called by kernels: the emulator's own bookkeeping)
    for (const std::string& n : race_dropped()) if (n == name) return true;
    return false;
}

SIMT_NOTSAN inline RaceState* race_state() {
    if (!tls_race) {
        tls_race = new RaceState();
        tls_race->cap = 1 << 16;
        tls_race->table = (RaceEntry*)calloc(tls_race->cap, sizeof(RaceEntry));
    }
    return tls_race;
}

// a new block: new epoch, fresh clocks (called by run_block, outside any fiber)
SIMT_NOTSAN inline void race_block_start(Sched* s, int nthreads) {
    RaceState* r = race_state();
    if (r->vc_threads < nthreads) {
        free(r->vc);
        r->vc = (uint32_t*)malloc((size_t)nthreads * 32 * sizeof(uint32_t));
        r->vc_threads = nthreads;
    }
    memset(r->vc, 0, (size_t)nthreads * 32 * sizeof(uint32_t));
    memset(r->quiet, 0, sizeof r->quiet);
    r->in_hook = false;
    r->epoch++;
    r->used = 0;
    r->block_epoch = r->epoch;
    memset(r->fences, 0, sizeof(uint32_t) * (size_t)std::min(nthreads, 1024));
    r->stack_lo = (uintptr_t)s->stacks;
    r->stack_hi = (uintptr_t)s->stacks + (size_t)s->capacity * s->stack_stride;
}
SIMT_NOTSAN inline void race_barrier() { RaceState* r = tls_race; if (r) { r->epoch++; r->used = 0; } }
inline bool race_is_global(const void* p);   // inside a cudaMalloc allocation (defined after the runtime)
// detection can be switched off at run time (a test that wants the values a racy kernel computes)
#ifndef SIMT_RACE_DETECT_DEFAULT
#define SIMT_RACE_DETECT_DEFAULT 1   // 0: the byte-counting trainer (train_dbrx_emu_count) counts without checking
#endif
inline bool& race_detect_enabled() { static bool on = SIMT_RACE_DETECT_DEFAULT; return on; }
inline void race_detect_set(bool on) { race_detect_enabled() = on; }
}  // namespace simt
#include "bytecount.h"   // per-launch byte and mma counts (the work log's "rd", "wr", "mma"): the same hooks
namespace simt {
// the hooks run while a block's fiber runs and either the detector or the byte count is on
inline void race_set_active(bool on) { if (tls_race) tls_race->active = on && (race_detect_enabled() || bytes_counting()); }

// the lanes of `mask` in warp w have met: each ticks its own clock, then all take the join
SIMT_NOTSAN inline void race_warp_sync(int w, unsigned mask) {
    RaceState* r = tls_race;
    if (!r) return;
    uint32_t join[32] = {0};
    for (int j = 0; j < 32; j++) {
        if (!(mask >> j & 1)) continue;
        uint32_t* v = r->vc + (size_t)(w * 32 + j) * 32;
        v[j]++;
        for (int k = 0; k < 32; k++) join[k] = v[k] > join[k] ? v[k] : join[k];
    }
    for (int j = 0; j < 32; j++)
        if (mask >> j & 1) memcpy(r->vc + (size_t)(w * 32 + j) * 32, join, sizeof join);
}


// this program's file (a command run by popen has its own /proc/self)
inline std::string race_exe_path() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, (size_t)n) : std::string("/proc/self/exe");
}
// a path from the project root
inline std::string race_short_path(std::string where) {
    size_t cut = where.find(" (discriminator");
    if (cut != std::string::npos) where.resize(cut);
    for (const char* dir : {"/model/", "/test/", "/parallel/", "/dev/"}) {
        size_t k = where.rfind(dir);
        if (k != std::string::npos) return where.substr(k + 1);
    }
    return where;
}
// file:line of an access site (addr2line on the object that holds it; needs -g), and where its function
// was inlined, up to the kernel:
//   model/cuda_common.h:83 (block_max, inlined at model/classifier.cuh:60 in classifier_fused_kernel)
inline std::string race_site(const RaceAccess& a) {
    Dl_info info;
    char buf[1024];
    if (!a.pc || !dladdr(a.pc, &info) || !info.dli_fname) { snprintf(buf, sizeof buf, "%p", a.pc); return buf; }
    uintptr_t off = (uintptr_t)a.pc - 1 - (uintptr_t)info.dli_fbase;   // -1: inside the call instruction
    std::string exe = info.dli_fname[0] && strchr(info.dli_fname, '/') ? info.dli_fname : race_exe_path();
    snprintf(buf, sizeof buf, "addr2line -f -C -i -e '%s' 0x%llx 2>/dev/null", exe.c_str(), (unsigned long long)off);
    std::vector<std::string> lines;   // function, file:line; the innermost (inlined) frame first
    if (FILE* f = popen(buf, "r")) {
        while (fgets(buf, sizeof buf, f)) {
            std::string l = buf;
            while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.pop_back();
            lines.push_back(l);
        }
        pclose(f);
    }
    if (lines.size() < 2 || lines[1][0] == '?') { snprintf(buf, sizeof buf, "%p", a.pc); return buf; }
    auto fn = [&](size_t i) {   // a function's name without its parameter list
        std::string f = lines[i];
        size_t paren = f.find('(');
        if (paren != std::string::npos) f.resize(paren);
        return f.compare(0, 5, "void ") == 0 ? f.substr(5) : f;   // a kernel's return type
    };
    std::string where = race_short_path(lines[1]);
    if (lines.size() == 2) where += " (" + fn(0) + ")";   // a function the compiler did not inline: no chain to the kernel
    if (lines.size() >= 4) {
        where += " (" + fn(0);
        for (size_t i = 2; i + 1 < lines.size() && i < 8; i += 2)
            where += std::string(i == 2 ? ", inlined at " : ", at ") + race_short_path(lines[i + 1]) + " in " + fn(i);
        where += ")";
    }
    return where;
}

[[noreturn]] inline void race_report(Sched* s, uintptr_t addr, const RaceAccess& first, const RaceAccess& second) {
    RaceState* r = tls_race;
    r->active = false;   // the report's own code (strings, popen) is not the kernel's
    const Fiber& fa = s->fibers[first.tid];
    const Fiber& fb = s->fibers[second.tid];
    char region[160];
    uintptr_t dyn = (uintptr_t)dynamic_smem;
    if (addr >= dyn && addr < dyn + SIMT_MAX_DYNAMIC_SMEM)
        snprintf(region, sizeof region, "shared memory (dynamic) at +%llu", (unsigned long long)(addr - dyn));
    else if (race_is_global((const void*)addr)) snprintf(region, sizeof region, "global memory at %p", (void*)addr);
    else snprintf(region, sizeof region, "shared memory (static __shared__) at %p", (void*)addr);
    auto what = [](const RaceAccess& a) {
        return std::string(a.write ? " write" : " read") + (a.op ? std::string(" (") + a.op + ")" : std::string()) + " at ";
    };
    std::string msg = "race in " + where(s) + ": " + thread_name(fa) + what(first) + race_site(first) + ", " + thread_name(fb) +
                      what(second) + race_site(second) + ", no barrier or warp synchronisation between them (" + region + ")";
    fiber_error(s, msg);
}

[[noreturn]] inline void race_proxy_report(Sched* s, uintptr_t off, const ProxyByte& b, int reader, const void* pc, const char* what, bool fenced) {
    tls_race->active = false;
    RaceAccess w = {b.pc, b.op, 0, b.tid, 0, 1}, rd = {pc, nullptr, 0, (uint16_t)reader, 0, 0};
    std::string msg = "async-proxy race in " + where(s) + ": " + what + " issued at " + race_site(rd) + " by warpgroup " +
                      std::to_string(reader / 128) + " reads shared memory written by " + thread_name(s->fibers[b.tid]) +
                      (b.op ? std::string(" (") + b.op + ")" : std::string()) + " at " + race_site(w) +
                      " through the generic proxy without a fence.proxy.async ordered before the read (" +
                      (fenced ? "the writer's fence after the write is in the read's barrier epoch, in another warpgroup: "
                                "fence before the barrier" : "the writer has not fenced since the write") +
                      "; shared memory (dynamic) at +" + std::to_string((unsigned long long)off) + ")";
    fiber_error(s, msg);
}

// Compiler-generated guards of thread_local statics (a __shared__ array of a class type such as
// __nv_bfloat16 gets one) are written once per OS thread, by the first fiber that reaches the declaration,
// and read by the others: not the kernel's memory, and no race. They are found by name (_ZGV*, __tls_guard)
// among the TLS symbols of the executable (readelf), only when a conflict is about to be reported.
inline bool race_is_tls_guard(uintptr_t addr) {
    static std::mutex mu;
    static bool loaded = false;
    static long long self = -1;                                  // simt::tls_race's offset in the TLS block
    static std::vector<std::pair<uintptr_t, uintptr_t>> guards;  // offset, size
    {
        std::lock_guard<std::mutex> g(mu);
        if (!loaded) {
            loaded = true;
            std::string cmd = "readelf -sW '" + race_exe_path() + "' 2>/dev/null";
            if (FILE* f = popen(cmd.c_str(), "r")) {
                char line[4096], type[32], name[2048];
                unsigned long long value, size;
                while (fgets(line, sizeof line, f)) {
                    // "   Num: Value Size Type Bind Vis Ndx Name"
                    if (sscanf(line, " %*[0-9]: %llx %llu %31s %*s %*s %*s %2047s", &value, &size, type, name) != 4) continue;
                    if (strcmp(type, "TLS") != 0) continue;
                    if (!strncmp(name, "_ZGV", 4) || !strncmp(name, "__tls_guard", 11)) guards.push_back({value, size ? size : 1});
                    if (!strcmp(name, "_ZN4simt8tls_raceE")) self = (long long)value;
                }
                pclose(f);
            }
        }
    }
    if (self < 0) return false;
    uintptr_t base = (uintptr_t)&tls_race - (uintptr_t)self;
    for (const auto& g : guards)
        if (addr - (base + g.first) < g.second) return true;
    return false;
}

// the table doubles when half full; only this epoch's entries move
SIMT_NOTSAN inline void race_grow(RaceState* r) {
    size_t ncap = r->cap * 2;
    RaceEntry* t = (RaceEntry*)calloc(ncap, sizeof(RaceEntry));
    for (size_t i = 0; i < r->cap; i++) {
        const RaceEntry& e = r->table[i];
        if (e.epoch != r->epoch) continue;
        size_t h = mix64(e.key) & (ncap - 1);
        while (t[h].epoch == r->epoch) h = (h + 1) & (ncap - 1);
        t[h] = e;
    }
    free(r->table);
    r->table = t;
    r->cap = ncap;
}

// a and b (b by the thread running now, clock vc_b) are ordered, or are the same thread
SIMT_NOTSAN inline bool race_ordered(const RaceState* r, const RaceAccess& a, int tid_b) {
    if (a.tid == tid_b) return true;
    if (a.tid / 32 != tid_b / 32) return false;   // only a barrier orders different warps
    return r->vc[(size_t)tid_b * 32 + a.tid % 32] > a.clock;
}

SIMT_NOTSAN inline void race_granule(RaceState* r, Sched* s, uintptr_t key, unsigned mask, bool write, const RaceAccess& acc) {
    if (r->used * 2 >= r->cap) race_grow(r);
    size_t h = mix64(key) & (r->cap - 1);
    while (r->table[h].epoch == r->epoch && r->table[h].key != key) h = (h + 1) & (r->cap - 1);
    RaceEntry& e = r->table[h];
    if (e.epoch != r->epoch) {   // stale or empty: this epoch's first access to the granule
        e.key = key; e.epoch = r->epoch; e.nw = e.nr = 0;
        r->used++;
    }
    int me = acc.tid;
    const RaceAccess* other = nullptr;
    for (int i = 0; i < e.nw && !other; i++)   // any access against an earlier write
        if ((e.w[i].mask & mask) && !race_ordered(r, e.w[i], me)) other = &e.w[i];
    for (int i = 0; write && i < e.nr && !other; i++)   // a write against an earlier read
        if ((e.r[i].mask & mask) && !race_ordered(r, e.r[i], me)) other = &e.r[i];
    if (other) {
        uintptr_t addr = key * 8 + __builtin_ctz(other->mask & mask);
        if (race_is_tls_guard(addr)) return;
        race_report(s, addr, *other, acc);
    }
    RaceAccess* slots = write ? e.w : e.r;
    uint8_t& n = write ? e.nw : e.nr;
    for (int i = 0; i < n; i++)   // this thread's earlier access: merge (its newest clock and site)
        if (slots[i].tid == me) { uint8_t m = slots[i].mask | (uint8_t)mask; slots[i] = acc; slots[i].mask = m; return; }
    if (n < 2) { slots[n] = acc; slots[n].mask = (uint8_t)mask; n++; }
    else { slots[1] = acc; slots[1].mask = (uint8_t)mask; }   // keep the first (distinct) thread and the newest
}

// --- the async proxy (fence.proxy.async) -------------------------------------------------------------------
// wgmma reads its shared-memory operands through the async proxy: a byte whose last write was a thread's
// (generic proxy: a store, or a cp.async once its wait returned) must have been followed by that thread's
// fence.proxy.async, and that fence ordered before the wgmma's issue: in an earlier barrier epoch, or by a
// thread of the reading warpgroup itself (its fence precedes its own arrival at the rendezvous).
// TMA's writes are the async proxy's own (race_proxy_async_write): they need no fence.
SIMT_NOTSAN inline void race_proxy_write(RaceState* r, uintptr_t off, int size, int tid, const void* pc, const char* op) {
    if (!r->proxy) r->proxy = (ProxyByte*)calloc(SIMT_MAX_DYNAMIC_SMEM, sizeof(ProxyByte));
    ProxyByte b = {pc, op, r->epoch, r->fences[tid], (uint16_t)tid};
    for (int i = 0; i < size && off + i < SIMT_MAX_DYNAMIC_SMEM; i++) r->proxy[off + i] = b;
}
// bytes a TMA copy landed in (tma.h): their last write is the async proxy's
SIMT_NOTSAN inline void race_proxy_async_write(const char* p, int size) {
    RaceState* r = tls_race;
    uintptr_t off = (uintptr_t)p - (uintptr_t)dynamic_smem;
    if (!r || !r->proxy || !race_detect_enabled()) return;
    for (int i = 0; i < size && off + i < SIMT_MAX_DYNAMIC_SMEM; i++) r->proxy[off + i].pc = nullptr;
}
// fence.proxy.async.shared::cta by the running thread (model/wgmma.cuh's wgmma_fence_proxy)
SIMT_NOTSAN inline void race_proxy_fence() {
    RaceState* r = tls_race;
    if (!r || !r->active || !race_detect_enabled()) return;
    int tid = tls_sched->current;
    uint32_t n = r->fences[tid];
    r->fence_epoch[tid][n % PROXY_RING] = r->epoch;
    r->fences[tid] = n + 1;
}
[[noreturn]] inline void race_proxy_report(Sched* s, uintptr_t off, const ProxyByte& b, int reader, const void* pc, const char* what, bool fenced);
// a wgmma's operand read of `size` bytes at dynamic_smem + off, issued by the warpgroup of thread `first` at pc
SIMT_NOTSAN inline void race_proxy_check(uintptr_t off, int size, int first, const void* pc, const char* what) {
    RaceState* r = tls_race;
    if (!r || !r->active || !r->proxy || !race_detect_enabled()) return;
    for (int i = 0; i < size; i++) {
        const ProxyByte& b = r->proxy[off + i];
        if (!b.pc || b.epoch < r->block_epoch) continue;   // no generic write in this block
        uint32_t n = r->fences[b.tid];
        if (n == b.gen) race_proxy_report(tls_sched, off + i, b, first, pc, what, false);
        // the first fence after the write (if the ring has moved past it, its oldest: no earlier than it)
        uint32_t k = n - b.gen > PROXY_RING ? n - PROXY_RING : b.gen;
        if (r->fence_epoch[b.tid][k % PROXY_RING] >= r->epoch && b.tid / 128 != first / 128)
            race_proxy_report(tls_sched, off + i, b, first, pc, what, true);
    }
}

// a TMA destination accessed before its mbarrier phase completed (tma.h)
__attribute__((no_sanitize_thread)) inline void tma_race_check(uintptr_t a, int size, bool write, int tid, const void* pc, const char* op);
// records an access of `size` bytes at p by thread tid (a collective records for its lanes)
SIMT_NOTSAN inline void race_record(const void* p, int size, bool write, int tid, const void* pc, const char* op) {
    RaceState* r = tls_race;
    Sched* s = tls_sched;
    uintptr_t a = (uintptr_t)p;
    if (a - r->stack_lo < r->stack_hi - r->stack_lo) return;   // a fiber's stack: locals
    r->in_hook = true;
    tma_race_check(a, size, write, tid, pc, op);
    if (write && a - (uintptr_t)dynamic_smem < SIMT_MAX_DYNAMIC_SMEM) race_proxy_write(r, a - (uintptr_t)dynamic_smem, size, tid, pc, op);
    RaceAccess acc;
    acc.pc = pc; acc.op = op; acc.tid = (uint16_t)tid; acc.write = write;
    acc.clock = r->vc[(size_t)tid * 32 + tid % 32];
    acc.mask = 0;
    r->in_hook = true;
    for (uintptr_t g = a & ~(uintptr_t)7; g < a + size; g += 8) {
        uintptr_t lo = std::max(g, a), hi = std::min(g + 8, a + size);
        unsigned mask = ((1u << (hi - lo)) - 1) << (lo - g);
        race_granule(r, s, g / 8, mask, write, acc);
    }
    r->in_hook = false;
}

// the instrumentation's entry: a kernel's own access by the running thread
SIMT_NOTSAN inline void race_hook(const void* p, int size, bool write, const void* pc) {
    RaceState* r = tls_race;
    if (!r || !r->active || r->in_hook) return;
    Sched* s = tls_sched;
    if (r->quiet[s->current]) return;
    if (bytes_counting() && (uintptr_t)p - r->stack_lo >= r->stack_hi - r->stack_lo) { r->in_hook = true; bytes_record(p, size, !write, write); r->in_hook = false; }
    if (race_detect_enabled()) race_record(p, size, write, s->current, pc, nullptr);
}
// an atomic's access (a read and / or a write): counted, never checked for races
SIMT_NOTSAN inline void race_atomic_hook(const volatile void* p, int size, bool rd, bool wr) {
    RaceState* r = tls_race;
    if (!r || !r->active || r->in_hook || !bytes_counting()) return;
    if (r->quiet[tls_sched->current]) return;
    if ((uintptr_t)p - r->stack_lo >= r->stack_hi - r->stack_lo) { r->in_hook = true; bytes_record((const void*)p, size, rd, wr); r->in_hook = false; }
}
// an emulated instruction's access on behalf of thread tid; pc: where the thread issued it
inline void race_collective_access(const void* p, int size, bool write, int tid, const void* pc, const char* op) {
    RaceState* r = tls_race;
    if (!r || !r->active) return;
    if (bytes_counting() && (uintptr_t)p - r->stack_lo >= r->stack_hi - r->stack_lo) { r->in_hook = true; bytes_record(p, size, !write, write); r->in_hook = false; }
    if (race_detect_enabled()) race_record(p, size, write, tid, pc, op);
}

}  // namespace simt

// the ThreadSanitizer instrumentation interface, without libtsan: weak, so that every translation unit may
// carry it; the atomics are plain atomics (never recorded: atomics do not race with each other)
extern "C" {
#define SIMT_TSAN_RW(n)                                                                                                   \
    __attribute__((weak)) SIMT_NOTSAN void __tsan_read##n(void* p) { simt::race_hook(p, n, false, __builtin_return_address(0)); }    \
    __attribute__((weak)) SIMT_NOTSAN void __tsan_write##n(void* p) { simt::race_hook(p, n, true, __builtin_return_address(0)); }    \
    __attribute__((weak)) SIMT_NOTSAN void __tsan_unaligned_read##n(void* p) { simt::race_hook(p, n, false, __builtin_return_address(0)); } \
    __attribute__((weak)) SIMT_NOTSAN void __tsan_unaligned_write##n(void* p) { simt::race_hook(p, n, true, __builtin_return_address(0)); }
SIMT_TSAN_RW(1) SIMT_TSAN_RW(2) SIMT_TSAN_RW(4) SIMT_TSAN_RW(8) SIMT_TSAN_RW(16)
#undef SIMT_TSAN_RW
__attribute__((weak)) SIMT_NOTSAN void __tsan_read_range(void* p, unsigned long n) { simt::race_hook(p, (int)n, false, __builtin_return_address(0)); }
__attribute__((weak)) SIMT_NOTSAN void __tsan_write_range(void* p, unsigned long n) { simt::race_hook(p, (int)n, true, __builtin_return_address(0)); }
__attribute__((weak)) SIMT_NOTSAN void __tsan_init() {}
__attribute__((weak)) SIMT_NOTSAN void __tsan_func_entry(void*) {}
__attribute__((weak)) SIMT_NOTSAN void __tsan_func_exit() {}
__attribute__((weak)) SIMT_NOTSAN void __tsan_vptr_update(void**, void*) {}
__attribute__((weak)) SIMT_NOTSAN void __tsan_vptr_read(void**) {}
__attribute__((weak)) SIMT_NOTSAN void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
__attribute__((weak)) SIMT_NOTSAN void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
#define SIMT_TSAN_ATOMIC(n, T)                                                                                            \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_load(const volatile T* a, int) { simt::race_atomic_hook(a, n / 8, true, false); return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN void __tsan_atomic##n##_store(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, false, true); __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_exchange(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_fetch_xor(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_fetch_nand(volatile T* a, T v, int) { simt::race_atomic_hook(a, n / 8, true, true); return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
    __attribute__((weak)) SIMT_NOTSAN int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { simt::race_atomic_hook(a, n / 8, true, true);                \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }                       \
    __attribute__((weak)) SIMT_NOTSAN int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) { simt::race_atomic_hook(a, n / 8, true, true);                  \
        return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }                        \
    __attribute__((weak)) SIMT_NOTSAN T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) { simt::race_atomic_hook(a, n / 8, true, true);                      \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }
SIMT_TSAN_ATOMIC(8, char) SIMT_TSAN_ATOMIC(16, short) SIMT_TSAN_ATOMIC(32, int) SIMT_TSAN_ATOMIC(64, long long)
#undef SIMT_TSAN_ATOMIC
}
