/*
 * tma.h — the emulator's mbarriers and tensor memory accelerator (Hopper, sm_90): what model/tma.cuh runs under
 * SIMT_EMULATION in place of its inline PTX, and the driver's cuTensorMapEncodeTiled (reached, as in the product,
 * through cudaGetDriverEntryPointByVersion). Included by simt.h after wgmma.h.
 *
 *   mbarrier.init.shared::cta.b64 [bar], count           mbarrier.arrive{.expect_tx}.shared::cta.b64 state, [bar]{, tx}
 *   mbarrier.expect_tx.shared::cta.b64 [bar], tx         mbarrier.try_wait{.parity} / test_wait{.parity}
 *   cp.async.bulk.tensor.{1d..5d}.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0, ..}], [bar]
 *
 * Sources: NVIDIA PTX ISA 8.x, "Parallel Synchronization and Communication Instructions: mbarrier" (contents,
 * phase completion, tx-count, arrive / expect-tx / complete-tx, test_wait / try_wait, .parity) and "Data Movement
 * and Conversion Instructions: cp.async.bulk.tensor" ("Tensor Access Modes: tile", bounding box, out-of-bound
 * fill, swizzling modes); CUDA Driver API 6.30 "Tensor Map Object Management" (cuTensorMapEncodeTiled's
 * parameter requirements; cuda.h carries the same text).
 *
 * mbarrier: a 64-bit object in shared memory (8-byte aligned) holding the current phase's parity, the expected
 * arrival count (init: count in [1, 2^20 - 1]), the pending arrival count and the tx-count (bytes, in
 * [-(2^20 - 1), 2^20 - 1]). init: phase 0, pending = expected, tx 0. arrive(count): pending -= count, returns the
 * state before (its parity). expect_tx(b): tx += b; arrive.expect_tx: expect_tx, then arrive. complete_tx(b) (an
 * asynchronous copy's completion): tx -= b. The phase completes when pending = 0 and tx = 0: the parity flips,
 * pending = expected. try_wait.parity(P) is true once the phase of parity P has completed (the current parity is not
 * P): a consumer's first wait is parity 0, a producer's first wait on an "empty" barrier parity 1 passes at once.
 * The object is opaque: the emulator keeps those fields in it (its own encoding) and an ordinary store to it is
 * reported. A waiting thread is suspended (another runs) until the phase completes; try_wait returns true after
 * the suspension (legal: the ISA's try_wait may block). test_wait never blocks: false lets the other threads run,
 * and one that spins 2^20 times on an unchanged barrier is reported as a deadlock. When nothing can run, the
 * deadlock is reported with every waited barrier's state (arrivals pending, tx-count), not a hang.
 *
 * cp.async.bulk.tensor (tile mode, global -> shared): copies the box at coordinates c (elements, signed: a box may
 * hang off any edge) of the tensor map to dst (the dynamic shared memory, 128-byte aligned), dimension 0
 * innermost: box rows of boxDim[0] elements one after another (ceil(boxDim[i] / elementStrides[i]) elements along
 * dimension i > 0, every elementStrides[i]-th); elements outside [0, globalDim) are zeros (OOB fill NONE; the NaN
 * fill gives 0xFF bytes). With a 32/64/128B swizzle the element's shared-window byte address a is permuted as
 * wgmma.h's operands are (Swizzle<log2 w, 4, 3>: chunk bits a[4 ..) ^= a[7 ..)), so a tile TMA fills with 128B
 * swizzle and 128-byte rows is a K-major 128B-swizzled wgmma operand. Not emulated (reported when used): interleave,
 * the 128B_ATOM swizzles, a swizzled box whose inner bytes are less than the swizzle span, im2col, clusters
 * (multicast), bulk stores. Completion, at the latest point a GPU may act (as cp.async, tensor_core.h): nothing is
 * written at the issue but the destination's poison (0xFF: a read before the wait sees NaN); the copies land (and
 * complete their bytes on the mbarrier) only when no thread can run any more, i.e. every thread waits. So an
 * expect_tx larger than the copies' bytes is a reported deadlock, a smaller one completes the phase before the data
 * lands (the consumers read NaN), and a thread that writes the destination before the phase completes has its
 * store overwritten by the landing. The source is read when the copy lands (the byte count's "rd", bytecount.h).
 * Race detection (race.h): TMA's shared-memory writes are not the threads' (the detector's barrier epochs do not
 * model mbarriers); instead an access by any thread, or a wgmma's operand read, to a TMA destination whose copy has
 * not landed, or by a thread that has not observed (try_wait / test_wait true, or a __syncthreads() after a thread
 * that did) the completion of the phase the copy completed, is a race naming both sites. Not checked: a copy
 * issued over a tile other threads still read (the ring's "empty" barrier), ordinary data passed through mbarriers.
 */
#pragma once
#include <cuda.h>   // CUtensorMap, its enums and CUresult (types only: the emulated build links no driver)

namespace simt {

// --- the tensor map (the twin's contents of CUtensorMap's 128 opaque bytes) ------------------------------------
struct TmaMapData {
    uint32_t magic;
    uint8_t rank, dtype, esize, interleave, swizzle, l2, oob, pad;
    const char* addr;
    uint64_t dim[5], stride[5];   // stride[0] = element size
    uint16_t box[5];
    uint8_t estride[5];
};
static_assert(sizeof(TmaMapData) <= sizeof(CUtensorMap), "the twin's tensor map fits the 128 bytes");
static const uint32_t TMA_MAP_MAGIC = 0x544D4131u;
inline int tma_dtype_bytes(int t) {
    switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: case CU_TENSOR_MAP_DATA_TYPE_FLOAT16: case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32: case CU_TENSOR_MAP_DATA_TYPE_INT32: case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ: case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64: case CU_TENSOR_MAP_DATA_TYPE_INT64: case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
    default: return 0;   // the packed 4/6-bit types: not emulated
    }
}
// the twin's refusals are printed (the driver's are only an error code; the message says which rule)
inline CUresult tma_refuse(const char* why) {
    fprintf(stderr, "simt: cuTensorMapEncodeTiled: CUDA_ERROR_INVALID_VALUE: %s\n", why);
    return CUDA_ERROR_INVALID_VALUE;
}

// --- the block's mbarriers and TMA destinations ------------------------------------------------------------
struct TmaCopy { char* dst; TmaMapData map; int32_t c[5]; int bytes, tid, region; const void* pc; };
struct Mbar {
    uint64_t word = 0;             // what the emulator last wrote into the object
    uint64_t completed = 0;        // phases completed since init
    std::vector<TmaCopy> inflight; // issued copies that have not landed
    std::vector<int> waiters;      // threads suspended in try_wait
    std::vector<uint64_t> seen;    // per thread: the completed phases it has observed (race detection)
    uint64_t spin_word = 0;
    long spins = 0;
    const char* file = "";
    int line = 0;
};
struct TmaRegion { uintptr_t bar; uint64_t need; bool landed; int tid; const void* pc; };
struct TmaBlock {
    uint64_t serial = ~0ull;
    std::map<uintptr_t, Mbar> bars;
    std::vector<int32_t> chunk;    // per 16-byte chunk of the dynamic shared memory: its TMA region, or -1
    std::vector<TmaRegion> regions;
};
inline thread_local TmaBlock* tls_tma = nullptr;
inline TmaBlock* tma_block(Sched* s) {
    if (!tls_tma) tls_tma = new TmaBlock();
    if (tls_tma->serial != s->block_serial) {   // a new block: no barrier, nothing in flight
        tls_tma->serial = s->block_serial;
        tls_tma->bars.clear();
        if (!tls_tma->regions.empty()) std::fill(tls_tma->chunk.begin(), tls_tma->chunk.end(), -1);
        tls_tma->regions.clear();
    }
    return tls_tma;
}
inline TmaBlock* tma_block_if_any(Sched* s) { return tls_tma && tls_tma->serial == s->block_serial ? tls_tma : nullptr; }

[[noreturn]] inline void tma_error(const char* what_kind, const std::string& what, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    fiber_error(s, std::string(what_kind) + " error in " + where(s) + " at " + file + ":" + std::to_string(line) + ", " +
                   thread_name(s->fibers[s->current]) + ": " + what);
}
inline std::string tma_smem_name(const void* p) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)dynamic_smem;
    char buf[64];
    if (a >= b && a < b + SIMT_MAX_DYNAMIC_SMEM) snprintf(buf, sizeof buf, "dynamic shared memory +%llu", (unsigned long long)(a - b));
    else snprintf(buf, sizeof buf, "static __shared__ %p", p);
    return buf;
}

// the object's fields: [20:0] tx-count (signed), [40:21] pending, [60:41] expected, [63] phase parity
struct MbarFields { int phase; uint32_t expected, pending; int32_t tx; };
inline MbarFields mbar_unpack(uint64_t w) {
    return MbarFields{(int)(w >> 63), (uint32_t)(w >> 41 & 0xFFFFF), (uint32_t)(w >> 21 & 0xFFFFF), (int32_t)((uint32_t)(w << 11)) >> 11};
}
inline uint64_t mbar_pack(const MbarFields& f) {
    return (uint64_t)(f.phase & 1) << 63 | (uint64_t)(f.expected & 0xFFFFF) << 41 | (uint64_t)(f.pending & 0xFFFFF) << 21 |
           ((uint64_t)(uint32_t)f.tx & 0x1FFFFF);
}
static const int32_t MBAR_MAX = (1 << 20) - 1;

inline void mbar_store(uint64_t* bar, Mbar& m, const MbarFields& f) { m.word = mbar_pack(f); *bar = m.word; }
// the barrier's phase completes: waiters resume
inline void mbar_complete(Sched* s, uint64_t* bar, Mbar& m, MbarFields f) {
    f.phase ^= 1;
    f.pending = f.expected;
    f.tx = 0;
    m.completed++;
    mbar_store(bar, m, f);
    for (int t : m.waiters) make_ready(s, t);
    m.waiters.clear();
}
inline Mbar& mbar_get(uint64_t* bar, const char* file, int line) {
    Sched* s = tls_sched;
    TmaBlock* b = tma_block(s);
    if ((uintptr_t)bar % 8) tma_error("mbarrier", "the mbarrier object at " + tma_smem_name(bar) + " is not 8-byte aligned", file, line);
    auto it = b->bars.find((uintptr_t)bar);
    if (it == b->bars.end()) tma_error("mbarrier", "the mbarrier at " + tma_smem_name(bar) + " is used before mbarrier.init", file, line);
    if (*bar != it->second.word)
        tma_error("mbarrier", "the mbarrier object at " + tma_smem_name(bar) + " was changed by an ordinary store (it is opaque: only the "
                  "mbarrier instructions may access it)", file, line);
    return it->second;
}

// --- the instructions ---------------------------------------------------------------------------------------

inline void mbar_init(uint64_t* bar, uint32_t count, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    TmaBlock* b = tma_block(s);
    if ((uintptr_t)bar % 8) tma_error("mbarrier", "the mbarrier object at " + tma_smem_name(bar) + " is not 8-byte aligned", file, line);
    if (count < 1 || count > (uint32_t)MBAR_MAX) tma_error("mbarrier", "mbarrier.init count " + std::to_string(count) + " is not in [1, 2^20 - 1]", file, line);
    Mbar& m = b->bars[(uintptr_t)bar];
    if (!m.waiters.empty() || !m.inflight.empty())
        tma_error("mbarrier", "mbarrier.init on a barrier that threads wait on or copies complete on", file, line);
    m = Mbar();
    m.file = file; m.line = line;
    m.seen.assign(s->nthreads, 0);
    mbar_store(bar, m, MbarFields{0, count, count, 0});
}

inline void mbar_expect_tx(uint64_t* bar, uint32_t bytes, const char* file, int line) {
    SIMT_RACE_QUIET;
    Mbar& m = mbar_get(bar, file, line);
    MbarFields f = mbar_unpack(m.word);
    if ((int64_t)f.tx + bytes > MBAR_MAX) tma_error("mbarrier", "expect_tx: the tx-count would exceed 2^20 - 1 bytes", file, line);
    f.tx += (int32_t)bytes;
    mbar_store(bar, m, f);
}

// returns the state before the arrival (its bit 63: the phase's parity)
inline uint64_t mbar_arrive(uint64_t* bar, uint32_t count, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    Mbar& m = mbar_get(bar, file, line);
    MbarFields f = mbar_unpack(m.word);
    uint64_t state = m.word;
    if (count < 1 || f.pending < count)
        tma_error("mbarrier", "mbarrier.arrive with " + std::to_string(f.pending) + " arrival(s) pending in the current phase (more "
                  "arrivals than mbarrier.init's count " + std::to_string(f.expected) + ")", file, line);
    f.pending -= count;
    if (f.pending == 0 && f.tx == 0) mbar_complete(s, bar, m, f);   // copies still in flight do not hold the phase
    else mbar_store(bar, m, f);
    return state;
}

inline void mbar_observe(Mbar& m, int t) { if (t < (int)m.seen.size()) m.seen[t] = std::max(m.seen[t], m.completed); }

// suspends the caller until the phase of parity `parity` has completed
inline bool mbar_try_wait_parity(uint64_t* bar, int parity, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    int me = s->current;
    for (;;) {
        Mbar& m = mbar_get(bar, file, line);
        if ((int)(m.word >> 63) != (parity & 1)) { mbar_observe(m, me); return true; }
        m.waiters.push_back(me);
        Fiber& f = s->fibers[me];
        f.op = OP_COLLECTIVE; f.mask = 0; f.collective = nullptr; f.collective_name = "mbarrier.try_wait"; f.file = file; f.line = line;
        f.state = AT_WARP;
        suspend(s);
    }
}

inline bool mbar_land(Sched* s, TmaBlock* b, Mbar& m);
// never blocks: false lets the other threads run
inline bool mbar_test_wait_parity(uint64_t* bar, int parity, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    Mbar& m = mbar_get(bar, file, line);
    if ((int)(m.word >> 63) != (parity & 1)) { mbar_observe(m, s->current); return true; }
    if (mbar_unpack(m.word).pending == 0 && !m.inflight.empty()) {   // a poll cannot wait for the scheduler's idle point
        mbar_land(s, tma_block(s), m);
        if (!s->error.empty()) fiber_error(s, s->error);
        if ((int)(m.word >> 63) != (parity & 1)) { mbar_observe(m, s->current); return true; }
    }
    if (m.spin_word == m.word && ++m.spins > (1 << 20))
        tma_error("mbarrier", "mbarrier.test_wait spins on a barrier that does not change (a deadlock): " +
                  std::to_string(mbar_unpack(m.word).pending) + " arrival(s) pending, tx-count " + std::to_string(mbar_unpack(m.word).tx), file, line);
    if (m.spin_word != m.word) { m.spin_word = m.word; m.spins = 0; }
    make_ready(s, s->current);
    suspend(s);
    return false;
}

// the copy's bytes land in shared memory (the emulator's code: not the kernel's accesses)
inline void tma_copy_land(const TmaCopy& c) {
    const TmaMapData& t = c.map;
    const int e = t.esize;
    uint64_t n[5] = {1, 1, 1, 1, 1};
    int es[5] = {1, 1, 1, 1, 1};
    for (int d = 0; d < t.rank; d++) { es[d] = d == 0 ? 1 : t.estride[d]; n[d] = (t.box[d] + es[d] - 1) / es[d]; }
    const uint32_t w = t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 8 : t.swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 4 : t.swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 2 : 1;
    const uint32_t base = (uint32_t)(c.dst - dynamic_smem);
    uint64_t lin = 0;
    for (uint64_t i4 = 0; i4 < n[4]; i4++) for (uint64_t i3 = 0; i3 < n[3]; i3++) for (uint64_t i2 = 0; i2 < n[2]; i2++)
    for (uint64_t i1 = 0; i1 < n[1]; i1++) {
        int64_t g[5] = {0, c.c[1] + (int64_t)(i1 * es[1]), c.c[2] + (int64_t)(i2 * es[2]), c.c[3] + (int64_t)(i3 * es[3]), c.c[4] + (int64_t)(i4 * es[4])};
        bool row_in = true;
        int64_t row_off = 0;
        for (int d = 1; d < t.rank; d++) { row_in &= g[d] >= 0 && g[d] < (int64_t)t.dim[d]; row_off += g[d] * (int64_t)t.stride[d]; }
        for (uint64_t i0 = 0; i0 < n[0]; i0++, lin += e) {
            int64_t x = c.c[0] + (int64_t)i0;
            uint32_t a = base + (uint32_t)lin;
            a ^= ((a >> 7) & (w - 1)) << 4;
            char* dst = dynamic_smem + a;
            if (row_in && x >= 0 && x < (int64_t)t.dim[0]) {
                const char* src = t.addr + row_off + x * e;
                memcpy(dst, src, e);
#if defined(SIMT_RACE_DETECT)
                if (bytes_counting()) bytes_record(src, e, true, false);   // the kernel's global read (bytecount.h)
#endif
            } else {
                memset(dst, t.oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE ? 0 : 0xFF, e);
            }
#if defined(SIMT_RACE_DETECT)
            race_proxy_async_write(dst, e);   // the async proxy's write: wgmma reads it without a fence (race.h)
#endif
        }
    }
}

// every copy in flight on m lands; its phase completes if its arrivals are in and the bytes match
inline bool mbar_land(Sched* s, TmaBlock* b, Mbar& m) {
    uint64_t* bar = nullptr;
    for (auto& kv : b->bars) if (&kv.second == &m) bar = (uint64_t*)kv.first;
    MbarFields f = mbar_unpack(m.word);
    for (const TmaCopy& c : m.inflight) {
        tma_copy_land(c);
        f.tx -= c.bytes;
        if (c.region >= 0) { b->regions[c.region].landed = true; b->regions[c.region].need = m.completed + 1; }
    }
    bool any = !m.inflight.empty();
    m.inflight.clear();
    if (f.pending == 0 && f.tx < 0) {
        s->error = "mbarrier error in " + where(s) + ": the bulk copies completing on the mbarrier at " + tma_smem_name(bar) + " (initialised at " +
                   m.file + ":" + std::to_string(m.line) + ") bring " + std::to_string(-f.tx) + " byte(s) more than its expect_tx announced";
        return false;
    }
    if (f.pending == 0 && f.tx == 0) mbar_complete(s, bar, m, f);
    else mbar_store(bar, m, f);
    return any;
}

// the scheduler found no thread to run (simt.h run_block): the copies in flight land. True: a thread can run again
inline bool tma_idle(Sched* s) {
    TmaBlock* b = tma_block_if_any(s);
    if (!b || !s->error.empty()) return false;
    size_t ready = s->ready.size() - s->ready_head;
    for (auto& kv : b->bars) {
        if (kv.second.inflight.empty()) continue;
        mbar_land(s, b, kv.second);
        if (!s->error.empty()) return false;
    }
    return s->ready.size() - s->ready_head > ready;
}
// a deadlock's description of the barriers threads wait on
inline std::string tma_deadlock_note(Sched* s) {
    TmaBlock* b = tma_block_if_any(s);
    std::string note;
    for (auto& kv : b ? b->bars : std::map<uintptr_t, Mbar>()) {
        const Mbar& m = kv.second;
        if (m.waiters.empty()) continue;
        MbarFields f = mbar_unpack(m.word);
        const Fiber& w = s->fibers[m.waiters[0]];
        note += "; mbarrier at " + tma_smem_name((void*)kv.first) + " (initialised at " + m.file + ":" + std::to_string(m.line) + "): " +
                std::to_string(m.waiters.size()) + " thread(s) wait at " + w.file + ":" + std::to_string(w.line) + " for phase " +
                std::to_string(f.phase) + ", " + std::to_string(f.pending) + " of " + std::to_string(f.expected) +
                " arrival(s) pending, tx-count " + std::to_string(f.tx) + " byte(s) not arrived" +
                (f.pending ? " (an arrival missing?)" : " (expect_tx more than the copies bring?)");
    }
    return note;
}
// a __syncthreads(): every thread has observed what any thread observed before it
inline void tma_barrier_join(Sched* s) {
    TmaBlock* b = tma_block_if_any(s);
    if (!b) return;
    for (auto& kv : b->bars) {
        uint64_t mx = 0;
        for (uint64_t v : kv.second.seen) mx = std::max(mx, v);
        std::fill(kv.second.seen.begin(), kv.second.seen.end(), mx);
    }
}

// cp.async.bulk.tensor.Nd: the box at c[0 .. rank) of map to dst, completing its bytes on bar
SIMT_RACE_SITE inline void tma_load(void* dst, const CUtensorMap* map, const int32_t* c, int rank, uint64_t* bar, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    TmaMapData t;
    memcpy(&t, map, sizeof t);
    const char* op = "cp.async.bulk.tensor";
    if (t.magic != TMA_MAP_MAGIC) tma_error(op, "the tensor map was not made by cuTensorMapEncodeTiled", file, line);
    if (t.rank != rank) tma_error(op, std::to_string(rank) + "d copy with a tensor map of rank " + std::to_string(t.rank), file, line);
    if (t.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || t.swizzle > CU_TENSOR_MAP_SWIZZLE_128B)
        tma_error(op, "interleaved layouts and the 128B_ATOM swizzles are not emulated", file, line);
    const int span = t.swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0 : 16 << t.swizzle;
    if (span && t.box[0] * t.esize != span)
        tma_error(op, "a swizzled box whose inner dimension (" + std::to_string(t.box[0] * t.esize) + " bytes) is not the swizzle span (" +
                  std::to_string(span) + ") is not emulated", file, line);
    uintptr_t a = (uintptr_t)dst, lo = (uintptr_t)dynamic_smem;
    if (a < lo || a >= lo + SIMT_MAX_DYNAMIC_SMEM) tma_error(op, "the destination must be in the dynamic shared memory", file, line);
    if ((a - lo) % 128) tma_error(op, "the shared-memory destination must be 128-byte aligned", file, line);
    long long bytes = t.esize;
    for (int d = 0; d < rank; d++) bytes *= d == 0 ? t.box[0] : (t.box[d] + t.estride[d] - 1) / t.estride[d];
    if (a - lo + bytes > SIMT_MAX_DYNAMIC_SMEM) tma_error(op, "the box runs past the shared memory", file, line);
    Mbar& m = mbar_get(bar, file, line);
    TmaCopy cp;
    cp.dst = (char*)dst; cp.map = t; cp.bytes = (int)bytes; cp.tid = s->current; cp.region = -1;
    for (int d = 0; d < 5; d++) cp.c[d] = d < rank ? c[d] : 0;
#if defined(SIMT_RACE_DETECT)
    TmaBlock* b = tma_block(s);
    cp.pc = __builtin_return_address(0);
    if (b->chunk.empty()) b->chunk.assign(SIMT_MAX_DYNAMIC_SMEM / 16, -1);
    cp.region = (int)b->regions.size();
    b->regions.push_back(TmaRegion{(uintptr_t)bar, 0, false, s->current, cp.pc});
    for (uintptr_t k = (a - lo) / 16; k < (a - lo + bytes + 15) / 16; k++) b->chunk[k] = cp.region;
#else
    cp.pc = nullptr;
#endif
    memset(dst, 0xFF, bytes);   // until it lands the destination holds nothing a thread may use
    m.inflight.push_back(cp);
}

#if defined(SIMT_RACE_DETECT)
// race.h's check of an access by thread tid (or on its behalf, op) to the dynamic shared memory
__attribute__((no_sanitize_thread)) inline void tma_race_check(uintptr_t a, int size, bool write, int tid, const void* pc, const char* op) {
    Sched* s = tls_sched;
    TmaBlock* b = tma_block_if_any(s);
    uintptr_t lo = (uintptr_t)dynamic_smem;
    if (!b || b->regions.empty() || a < lo || a >= lo + SIMT_MAX_DYNAMIC_SMEM) return;
    for (uintptr_t k = (a - lo) / 16; k <= (a - lo + size - 1) / 16 && k < b->chunk.size(); k++) {
        int r = b->chunk[k];
        if (r < 0) continue;
        const TmaRegion& g = b->regions[r];
        auto it = b->bars.find(g.bar);
        if (it == b->bars.end()) continue;
        const Mbar& m = it->second;
        bool ok = g.landed && tid < (int)m.seen.size() && m.seen[tid] >= g.need;
        if (ok) continue;
        RaceAccess mine{pc, op, 0, (uint16_t)tid, 0, write}, tma{g.pc, "cp.async.bulk.tensor", 0, (uint16_t)g.tid, 0, 1};
        tls_race->active = false;
        std::string msg = "race in " + where(s) + ": " + thread_name(s->fibers[tid]) + (write ? " write" : " read") +
                          (op ? std::string(" (") + op + ")" : std::string()) + " at " + race_site(mine) + " of a TMA destination, " +
                          thread_name(s->fibers[g.tid]) + " write (cp.async.bulk.tensor) at " + race_site(tma) + ", " +
                          (g.landed ? "without having waited for the mbarrier phase the copy completes"
                                    : "before the copy's mbarrier phase completed") +
                          " (shared memory (dynamic) at +" + std::to_string(a - lo) + ", mbarrier at " + tma_smem_name((void*)g.bar) + ")";
        fiber_error(s, msg);
    }
}
#endif

}  // namespace simt

// --- the driver's tensor-map encoder and its entry point ------------------------------------------------------
extern "C" {
inline CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType dtype, cuuint32_t rank, void* globalAddress,
                                       const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
                                       const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                       CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
    using simt::tma_refuse;
    if (!tensorMap || (uintptr_t)tensorMap % 64) return tma_refuse("the tensor map's address must be 64-byte aligned");
    const int e = simt::tma_dtype_bytes(dtype);
    if (!e) return tma_refuse("tensorDataType: not one of the emulated types");
    if (rank < 1 || rank > 5 || (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3))
        return tma_refuse("tensorRank must be in [1, 5] (at least 3 with interleave)");
    const uintptr_t align = interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16;
    if (!globalAddress || (uintptr_t)globalAddress % align) return tma_refuse("globalAddress must be 16-byte aligned (32 with interleave 32B)");
    for (cuuint32_t d = 0; d < rank; d++) {
        if (globalDim[d] == 0 || globalDim[d] > (1ull << 32)) return tma_refuse("globalDim must be non-zero and at most 2^32");
        if (boxDim[d] == 0 || boxDim[d] > 256) return tma_refuse("boxDim must be non-zero and at most 256");
        if (elementStrides[d] == 0 || elementStrides[d] > 8) return tma_refuse("elementStrides must be non-zero and at most 8");
        if (d + 1 < rank && (globalStrides[d] % align || globalStrides[d] >= (1ull << 40)))
            return tma_refuse("globalStrides must be multiples of 16 (32 with interleave 32B) and less than 2^40");
    }
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && boxDim[0] * e % 16) return tma_refuse("boxDim[0] * element size must be a multiple of 16 bytes");
    if ((unsigned)interleave > CU_TENSOR_MAP_INTERLEAVE_32B || (unsigned)swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
        (unsigned)l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B || (unsigned)oobFill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
        return tma_refuse("an enum argument out of range");
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_32B && swizzle != CU_TENSOR_MAP_SWIZZLE_32B) return tma_refuse("interleave 32B requires swizzle 32B");
    const cuuint32_t span = swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0 : swizzle <= CU_TENSOR_MAP_SWIZZLE_128B ? 16u << swizzle : 128u;
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && span && boxDim[0] * e > span)
        return tma_refuse("the box's inner dimension (boxDim[0] * element size) must be at most the swizzle span");
    const bool is_float = dtype >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && dtype != CU_TENSOR_MAP_DATA_TYPE_UINT64 && dtype != CU_TENSOR_MAP_DATA_TYPE_INT64;
    if (oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float) return tma_refuse("the NaN OOB fill needs a floating-point type");
    simt::TmaMapData t;
    memset(&t, 0, sizeof t);
    t.magic = simt::TMA_MAP_MAGIC;
    t.rank = (uint8_t)rank; t.dtype = (uint8_t)dtype; t.esize = (uint8_t)e; t.interleave = (uint8_t)interleave;
    t.swizzle = (uint8_t)swizzle; t.l2 = (uint8_t)l2Promotion; t.oob = (uint8_t)oobFill;
    t.addr = (const char*)globalAddress;
    for (cuuint32_t d = 0; d < rank; d++) {
        t.dim[d] = globalDim[d];
        t.stride[d] = d == 0 ? (uint64_t)e : globalStrides[d - 1];
        t.box[d] = (uint16_t)boxDim[d];
        t.estride[d] = (uint8_t)elementStrides[d];
    }
    memset(tensorMap, 0, sizeof *tensorMap);
    memcpy(tensorMap, &t, sizeof t);
    return CUDA_SUCCESS;
}
// the driver functions the product takes through the runtime (cuTensorMapEncodeTiled only)
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* driverStatus) {
    bool known = symbol && strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *funcPtr = known ? (void*)&cuTensorMapEncodeTiled : nullptr;
    if (driverStatus) *driverStatus = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
}
