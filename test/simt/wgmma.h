/*
 * wgmma.h — the emulator's warpgroup-level matrix instructions (Hopper, sm_90a): what model/wgmma.cuh runs
 * under SIMT_EMULATION in place of its inline PTX. Included by simt.h after tensor_core.h.
 *
 *   wgmma.fence.sync.aligned
 *   wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16   D (64xN fp32) = A (64x16) B (16xN) + (scale-d ? D : 0)
 *       N a multiple of 8 in [8, 256]; A from registers or from a shared-memory matrix descriptor, B from a
 *       descriptor; imm-trans-a / imm-trans-b (0: K-major, 1: MN-major); imm-scale-a = imm-scale-b = 1
 *   wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2}   the same with k 32 of FP8 codes, K-major
 *       operands only (the ISA has the transposes for .f16 / .bf16 only)
 *   wgmma.commit_group.sync.aligned, wgmma.wait_group.sync.aligned N
 *
 * Source of every rule below: NVIDIA, PTX ISA (8.x/9.x), section "Asynchronous Warpgroup Level Matrix
 * Multiply-Accumulate Instructions": "Register Fragments" (m64nNk16), "Shared Memory Matrix Layout",
 * "Leading/Stride Dimension Byte Offset", "Canonical Layouts" and "Matrix Descriptor Format".
 *
 * Warpgroup: the 128 threads of 4 consecutive warps, the first warp's index a multiple of 4 (threads
 * 128 w .. 128 w + 127 of the block). Every one of these instructions is .sync.aligned: the 128 threads
 * rendezvous (a deadlock or an error if one is missing, has exited, or waits in another wgmma instruction);
 * the last to arrive acts for the warpgroup.
 *
 * Register fragments (warp q = (thread % 128) / 32 of the warpgroup, lane l, g = l / 4, t = l % 4; a .b32
 * register holds two bf16, the lower-indexed element in its low half) — each warp owns rows 16 q .. 16 q + 15,
 * laid out as mma.m16n8k16's fragments (tensor_core.h), repeated every 8 columns for D:
 *   A (64x16), 4 regs:   a[0] = A[16q+g][2t, 2t+1]    a[1] = A[16q+g+8][2t, 2t+1]
 *                        a[2] = A[16q+g][2t+8, 2t+9]  a[3] = A[16q+g+8][2t+8, 2t+9]
 *   D (64xN fp32), N/2 floats:  d[i] = D[16q + g + 8 ((i / 2) % 2)][8 (i / 4) + 2t + i % 2]
 *   A (64x32 FP8, m64nNk32), 4 regs of 4 codes, the lowest byte first:
 *                        a[j] = A[16q + g + 8 (j % 2)][4t + 16 (j / 2) .. + 3]
 *   (The same layouts as CUTLASS's CLayout_64xN / ALayout_64x16 / ALayout_64x32, cute/atom/mma_traits_sm90_gmma.hpp.)
 *
 * Shared-memory operands (T elements = 16 bytes: 8 bf16 or 16 FP8 codes; a core matrix is 8 rows of 16 bytes).
 * An operand is an (MN x K) matrix: A is 64 x 16 (mn = m), B is N x 16 (mn = n). K-major (trans 0): k is
 * contiguous; MN-major (trans 1): mn is contiguous. The byte offset of element (mn, k) from the descriptor's
 * start address, per the ISA's canonical layouts (CuTe notation: shape:stride in elements) with w = 1, 2, 4, 8
 * 16-byte units per swizzle row (no swizzle, 32B, 64B, 128B), LBO / SBO the descriptor's byte offsets:
 *   K-major,  none:     ((8,m),(T,2k)):((1T,SBO),(1,LBO))  (mn%8) 16 + (mn/8) SBO + (k%T) e + (k/T) LBO
 *   K-major,  swizzled: ((8,m),(T,2k)):((wT,SBO),(1,T))    (mn%8) 16w + (mn/8) SBO + (k%T) e + (k/T) 16
 *                        (e the element's bytes; the MN-major forms below are bf16's, e = 2, T = 8)
 *                        (LBO unused: "assumed 1")
 *   MN-major, none:     ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))  (mn%8) 2 + (mn/8) SBO + (k%8) 16 + (k/8) LBO
 *   MN-major, swizzled: ((T,w,m),(8,k)):((1,T,LBO),(wT,SBO))  (mn%8w) 2 + (mn/8w) LBO + (k%8) 16w + (k/8) SBO
 * then the swizzle Swizzle<log2 w, 4, 3> on the resulting shared-memory byte address a: the 16-byte chunk
 * bits a[4 .. 4+log2 w) are XORed with a[7 .. 7+log2 w) (128B: chunk ^= (a / 128) % 8 within each 1024-byte
 * atom). The swizzle is a function of the address, so a tile whose atoms are aligned (1024 bytes for 128B)
 * is addressed from any start inside a row, e.g. start + 32 bytes for the next k-step of a K-major 128B tile.
 * Matrix descriptor (64 bits): [13:0] (start address & 0x3FFFF) >> 4, [29:16] LBO >> 4, [45:32] SBO >> 4,
 * [51:49] base offset, [63:62] swizzle mode (0 none, 1 128B, 2 64B, 3 32B). Not emulated: a non-zero base
 * offset (reported as an error; the ISA needs it only when the swizzle pattern does not start on its 1024 /
 * 512 / 256-byte boundary). Shared memory here is the block's dynamic shared memory (simt.h aligns it to
 * 1024 bytes); its shared-window address is the offset from its start. A descriptor of a static __shared__
 * array is reported as an error (the emulator's static shared arrays have no window address).
 *
 * Asynchrony, emulated at the latest point a GPU may act (as cp.async in tensor_core.h): an mma_async reads
 * nothing and writes nothing when issued. Its shared-memory operands are read, and its accumulators
 * computed and written, when a wgmma.wait_group completes its group (wait_group N completes every committed
 * group of the warpgroup but the newest N; ops not yet committed are not waited for). At the issue the
 * accumulator registers' values are taken as the input D (or, when an earlier pending op of the thread
 * writes the same registers, that op's result) and the registers are poisoned with NaN until the wait: a
 * read of the accumulators before wait_group, or a write of the operands' shared memory between the issue
 * and the wait, gives a wrong result. A from registers is taken at the issue. A thread must execute
 * wgmma.fence before its first mma_async after each wait_group (the ISA's rule for register accesses
 * before an mma_async; kernels fence once per batch of mma_async). Accumulation: as mma.sync
 * (tensor_core.h): D's input plus the 16 exact bf16 products (32 exact FP8 products) in k order, rounding in fp32
 * after each add. (Hopper's FP8 MMA is known to keep fewer accumulator bits than fp32 — DeepSeek-V3's report
 * measures ~14 — which this does not model: emulated FP8 results are as exact as BF16's, a GPU's less so.)
 * Race detection (race.h): the operands' shared-memory reads are recorded at the issue (after the
 * rendezvous: a later write by any thread before the wait is a race) and again at the wait (before it),
 * each 16-byte chunk attributed to thread (chunk address / 16) % 128 of the warpgroup; the rendezvous
 * orders the lanes of each warp as a warp synchronisation does. Other warps, of the warpgroup included,
 * are ordered only by barriers (the detector's model): a write after wait_group by another warp needs a
 * __syncthreads() first. FLOPs: 2 * 64 * N * k per completed mma_async (k 16 or 32; bytecount.h).
 */
#pragma once

namespace simt {

enum { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };
enum { WGMMA_BF16 = 0, WGMMA_E4M3 = 1, WGMMA_E5M2 = 2 };   // the operands' element types
inline int wgmma_k(int type) { return type == WGMMA_BF16 ? 16 : 32; }   // k of one instruction: 32 bytes of a row
inline float wgmma_decode_fp8(int type, unsigned char code) {
    if (type == WGMMA_E4M3) { __nv_fp8_e4m3 v; v.__x = code; return (float)v; }
    __nv_fp8_e5m2 v; v.__x = code; return (float)v;
}
inline float wgmma_decode_elem(int type, const unsigned char* p) {
    if (type != WGMMA_BF16) return wgmma_decode_fp8(type, *p);
    uint16_t bits;
    memcpy(&bits, p, 2);
    return bf16_bits_to_float(bits);
}

// one issued wgmma.mma_async of one thread
struct WgmmaOp {
    float* d;              // the thread's accumulator registers (n / 2 floats)
    int n, scale_d, trans_a, trans_b;
    int atype, btype;      // WGMMA_BF16 (k 16), WGMMA_E4M3 / WGMMA_E5M2 (k 32)
    bool a_regs;           // A from registers (a), else from desc_a
    uint32_t a[4];
    uint64_t desc_a, desc_b;
    bool has_in;           // d_in holds the input D (else the result of an earlier pending op on d)
    float d_in[128];
    const char* file;
    int line;
    const void* pc;        // where it was issued (race reports)
};
struct WgLane {
    std::vector<WgmmaOp> open;                 // issued since the last commit
    std::deque<std::vector<WgmmaOp>> groups;   // committed, oldest first
    bool fenced = false;
};
// the state of the running block's warpgroups (one per OS thread: one block runs at a time on it)
struct WgBlock {
    uint64_t serial = ~0ull;       // Sched::block_serial it belongs to
    WgLane lanes[1024];
    int arrived[8] = {0};
    const char* name[8] = {nullptr};
    void* ptr[1024];
};
inline thread_local WgBlock* tls_wg = nullptr;
inline WgBlock* wg_block(Sched* s) {
    if (!tls_wg) tls_wg = new WgBlock();
    if (tls_wg->serial != s->block_serial) {   // a new block: nothing pending (a thread's unwaited ops never land)
        tls_wg->serial = s->block_serial;
        for (WgLane& l : tls_wg->lanes) { l.open.clear(); l.groups.clear(); l.fenced = false; }
        memset(tls_wg->arrived, 0, sizeof tls_wg->arrived);
    }
    return tls_wg;
}

[[noreturn]] inline void wgmma_error(const std::string& what, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    fiber_error(s, std::string("wgmma error in ") + where(s) + " at " + file + ":" + std::to_string(line) + ", " +
                   thread_name(s->fibers[s->current]) + ": " + what);
}

// the shared-window address of p: its offset in the block's dynamic shared memory
inline uint32_t wgmma_smem_addr(const void* p, const char* file, int line) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)dynamic_smem;
    if (a < b || a >= b + SIMT_MAX_DYNAMIC_SMEM)
        wgmma_error("a matrix descriptor's address must be in the dynamic shared memory (extern __shared__ dynamic_smem)", file, line);
    return (uint32_t)(a - b);
}

struct WgDesc { uint32_t start, lbo, sbo; int base, swz; };
inline WgDesc wgmma_decode(uint64_t d) {
    WgDesc w;
    w.start = (uint32_t)(d & 0x3FFF) << 4;
    w.lbo = (uint32_t)(d >> 16 & 0x3FFF) << 4;
    w.sbo = (uint32_t)(d >> 32 & 0x3FFF) << 4;
    w.base = (int)(d >> 49 & 7);
    w.swz = (int)(d >> 62 & 3);
    return w;
}
// the shared-window byte address of element (mn, k) of an operand of esize-byte elements (see the top comment)
inline uint32_t wgmma_elem_addr(const WgDesc& d, bool mn_major, int mn, int k, int esize = 2) {
    const uint32_t w = d.swz == WGMMA_SWIZZLE_NONE ? 1 : d.swz == WGMMA_SWIZZLE_128B ? 8 : d.swz == WGMMA_SWIZZLE_64B ? 4 : 2;
    const int T = 16 / esize;   // elements per 16 bytes
    uint32_t off;
    if (!mn_major) off = (mn % 8) * 16 * w + (mn / 8) * d.sbo + (k % T) * esize + (k / T) * (d.swz ? 16 : d.lbo);
    else if (!d.swz) off = (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
    else off = (mn % (8 * w)) * 2 + (mn / (8 * w)) * d.lbo + (k % 8) * 16 * w + (k / 8) * d.sbo;
    uint32_t a = d.start + off;
    return a ^ ((a >> 7) & (w - 1)) << 4;
}
// an operand's (rows x k) elements of `type` as floats; every address checked against the window
inline void wgmma_load(float* out, int rows, uint64_t desc, bool mn_major, int type, const char* file, int line) {
    WgDesc d = wgmma_decode(desc);
    if (d.base) wgmma_error("a matrix descriptor with a non-zero base offset (not emulated: align the swizzle atoms)", file, line);
    const int kk = wgmma_k(type), esize = type == WGMMA_BF16 ? 2 : 1;
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < kk; k++) {
            uint32_t a = wgmma_elem_addr(d, mn_major, r, k, esize);
            if (a + esize > SIMT_MAX_DYNAMIC_SMEM) wgmma_error("a matrix descriptor addresses beyond the shared memory", file, line);
            out[r * kk + k] = wgmma_decode_elem(type, (const unsigned char*)dynamic_smem + a);
        }
}
#if defined(SIMT_RACE_DETECT)
// the operand's reads, each 16-byte chunk attributed to one thread of the warpgroup (first ..)
inline void wgmma_race_reads(const WgmmaOp* const* ops, int first, int rows, uint64_t desc, bool mn_major, int type, const char* what,
                             bool issue = false) {
    WgDesc d = wgmma_decode(desc);
    const int esize = type == WGMMA_BF16 ? 2 : 1;
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < wgmma_k(type); k++) {
            uint32_t a = wgmma_elem_addr(d, mn_major, r, k, esize);
            int t = (int)(a / 16 % 128);
            race_collective_access(dynamic_smem + a, esize, false, first + t, ops[t]->pc, what);
            if (issue) race_proxy_check(a, esize, first, ops[0]->pc, what);   // (race.h: fence.proxy.async)
        }
}
#endif

// fence.proxy.async.shared::cta: the detector's record of it (race.h); otherwise nothing (one proxy here)
inline void wgmma_fence_proxy() {
#if defined(SIMT_RACE_DETECT)
    race_proxy_fence();
#endif
}

// the 128 threads of the caller's warpgroup meet; the last to arrive runs fn(first thread, their pointers).
// sync_first: the warps' clocks join before fn's recorded accesses (they are not ordered before later
// accesses of the lanes), else after (they are)
typedef void (*WgCollective)(int first, void* const lanes[128]);
inline void warpgroup_op(const char* name, void* mine, WgCollective fn, bool sync_first, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    WgBlock* st = wg_block(s);
    int me = s->current, wg = me / 128, first = wg * 128;
    Fiber& f = s->fibers[me];
    if (first + 128 > s->nthreads)
        wgmma_error(std::string(name) + " needs the 128 threads of warpgroup " + std::to_string(wg) + " (threads " +
                    std::to_string(first) + ".." + std::to_string(first + 127) + "): the block has " + std::to_string(s->nthreads), file, line);
    for (int w = first / 32; w < first / 32 + 4; w++)
        if (s->warp_exited[w]) wgmma_error(std::string(name) + ": a thread of the warpgroup has exited (warp " + std::to_string(w) + ")", file, line);
    if (st->arrived[wg] && strcmp(st->name[wg], name) != 0)
        wgmma_error(std::string(name) + " while other threads of the warpgroup wait in " + st->name[wg] + ": divergent warpgroup operations", file, line);
    st->name[wg] = name;
    st->ptr[me] = mine;
    f.op = OP_COLLECTIVE; f.mask = 0; f.collective = nullptr; f.collective_name = name; f.file = file; f.line = line;
    f.state = AT_WARP;
    if (++st->arrived[wg] < 128) { suspend(s); return; }
    st->arrived[wg] = 0;
#if defined(SIMT_RACE_DETECT)
    if (sync_first) for (int w = first / 32; w < first / 32 + 4; w++) race_warp_sync(w, 0xffffffffu);
#endif
    if (fn) fn(first, st->ptr + first);
#if defined(SIMT_RACE_DETECT)
    if (!sync_first) for (int w = first / 32; w < first / 32 + 4; w++) race_warp_sync(w, 0xffffffffu);
#else
    (void)sync_first;
#endif
    for (int j = first; j < first + 128; j++) if (j != me) make_ready(s, j);
    f.state = RUNNING;
    if (s->random) { make_ready(s, me); suspend(s); }   // let the others overtake this thread too
}

// --- the instructions -------------------------------------------------------------------------

SIMT_RACE_SITE inline void wgmma_fence(const char* file, int line) {
    warpgroup_op("wgmma.fence", nullptr, nullptr, true, file, line);
    tls_wg->lanes[tls_sched->current].fenced = true;
}

// at the issue: the same instruction on every thread; the operands are readable
inline void wgmma_issue_collective(int first, void* const lanes[128]) {
    const WgmmaOp* const* ops = (const WgmmaOp* const*)lanes;
    const WgmmaOp& o = *ops[0];
    for (int t = 1; t < 128; t++) {
        const WgmmaOp& p = *ops[t];
        if (p.n != o.n || p.a_regs != o.a_regs || p.desc_b != o.desc_b || (!o.a_regs && p.desc_a != o.desc_a) || p.scale_d != o.scale_d ||
            p.trans_a != o.trans_a || p.trans_b != o.trans_b || p.atype != o.atype || p.btype != o.btype)
            wgmma_error("thread " + std::to_string(first + t) + " issues another wgmma.mma_async (shape, descriptors, scale-d or transpose) "
                        "than thread " + std::to_string(first) + ": .aligned needs the same instruction", o.file, o.line);
    }
    static thread_local float buf[256 * 32];   // the addresses are checked now, where the instruction is issued
    if (!o.a_regs) wgmma_load(buf, 64, o.desc_a, o.trans_a, o.atype, o.file, o.line);
    wgmma_load(buf, o.n, o.desc_b, o.trans_b, o.btype, o.file, o.line);
#if defined(SIMT_RACE_DETECT)
    if (!o.a_regs) wgmma_race_reads(ops, first, 64, o.desc_a, o.trans_a, o.atype, "wgmma.mma_async A", true);
    wgmma_race_reads(ops, first, o.n, o.desc_b, o.trans_b, o.btype, "wgmma.mma_async B", true);
#endif
}

// d (n / 2 floats) = A B + (scale_d ? d : 0), A from a (4 regs) or, if a is NULL, from desc_a; atype / btype:
// WGMMA_BF16 (both: m64nNk16) or WGMMA_E4M3 / WGMMA_E5M2 (m64nNk32, K-major only)
SIMT_RACE_SITE inline void wgmma_mma(float* d, int n, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, int scale_d, int trans_a,
                                     int trans_b, const char* file, int line, int atype = WGMMA_BF16, int btype = WGMMA_BF16) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    WgLane& me = wg_block(s)->lanes[s->current];
    if (n < 8 || n > 256 || n % 8) wgmma_error("wgmma.mma_async.m64nNk16: N = " + std::to_string(n) + " is not a multiple of 8 in [8, 256]", file, line);
    if ((trans_a | trans_b) & ~1) wgmma_error("imm-trans-a / imm-trans-b must be 0 or 1", file, line);
    if ((atype == WGMMA_BF16) != (btype == WGMMA_BF16)) wgmma_error("A and B are both bf16 or both FP8", file, line);
    if (atype != WGMMA_BF16 && ((a ? 0 : trans_a) | trans_b))
        wgmma_error("FP8 wgmma (m64nNk32) takes K-major operands only: the transposes are for .f16 / .bf16", file, line);
    if (!me.fenced)
        wgmma_error("wgmma.mma_async without a wgmma.fence since the thread's last wgmma.wait_group (the fence orders the "
                    "accumulator and A registers' accesses before the asynchronous MMA)", file, line);
    WgmmaOp op;
    op.d = d; op.n = n; op.scale_d = scale_d != 0; op.trans_a = a ? 0 : trans_a; op.trans_b = trans_b;
    op.a_regs = a != nullptr;
    op.atype = atype; op.btype = btype;
    for (int i = 0; i < 4; i++) op.a[i] = a ? a[i] : 0;
    op.desc_a = a ? 0 : desc_a; op.desc_b = desc_b;
    op.file = file; op.line = line;
#if defined(SIMT_RACE_DETECT)
    op.pc = __builtin_return_address(0);
#else
    op.pc = nullptr;
#endif
    warpgroup_op("wgmma.mma_async", &op, wgmma_issue_collective, true, file, line);
    // the input D: the registers now, unless an earlier pending op of this thread writes them
    bool pending = false;
    for (const auto& g : me.groups) for (const WgmmaOp& p : g) pending |= p.d == d;
    for (const WgmmaOp& p : me.open) pending |= p.d == d;
    op.has_in = !pending;
    if (op.has_in) memcpy(op.d_in, d, sizeof(float) * n / 2);
    for (int i = 0; i < n / 2; i++) d[i] = __builtin_nanf("");   // nothing may read them before the wait
    me.open.push_back(op);
}

inline void wgmma_commit(const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    WgLane& me = wg_block(s)->lanes[s->current];
    me.groups.push_back(std::move(me.open));   // an empty group is legal
    me.open.clear();
    warpgroup_op("wgmma.commit_group", nullptr, nullptr, true, file, line);
}

// completes the oldest committed group of threads first .. first + 127 (each has one)
inline void wgmma_complete_group(int first) {
    WgLane* lanes = tls_wg->lanes + first;
    const size_t nops = lanes[0].groups.front().size();
    struct Acc { float* d; int n; float v[128]; };
    std::vector<Acc> acc[128];   // per thread: the results so far, by accumulator registers
    static thread_local float A[64 * 32], B[256 * 32], D[64 * 256];
    const WgmmaOp* ops[128];
    for (size_t j = 0; j < nops; j++) {
        for (int t = 0; t < 128; t++) ops[t] = &lanes[t].groups.front()[j];
        const WgmmaOp& o = *ops[0];
        const int n = o.n, kk = wgmma_k(o.atype);
        if (o.a_regs && o.atype != WGMMA_BF16)   // m64nNk32: a[j] = A[16q+g+8 (j%2)][4c + 16 (j/2) + 0..3], the lowest byte first
            for (int t = 0; t < 128; t++) {
                int q = t / 32, g = t % 32 / 4, c = t % 4;
                for (int j = 0; j < 4; j++)
                    for (int b = 0; b < 4; b++) {
                        A[(16 * q + g + 8 * (j % 2)) * 32 + 4 * c + 16 * (j / 2) + b] =
                            wgmma_decode_fp8(o.atype, (unsigned char)(ops[t]->a[j] >> (8 * b)));
                    }
            }
        else if (o.a_regs)
            for (int t = 0; t < 128; t++) {
                int q = t / 32, g = t % 32 / 4, c = t % 4;
                for (int h = 0; h < 2; h++) {
                    A[(16 * q + g) * 16 + 2 * c + h] = bf16_bits_to_float(ops[t]->a[0] >> (16 * h) & 0xFFFF);
                    A[(16 * q + g + 8) * 16 + 2 * c + h] = bf16_bits_to_float(ops[t]->a[1] >> (16 * h) & 0xFFFF);
                    A[(16 * q + g) * 16 + 2 * c + 8 + h] = bf16_bits_to_float(ops[t]->a[2] >> (16 * h) & 0xFFFF);
                    A[(16 * q + g + 8) * 16 + 2 * c + 8 + h] = bf16_bits_to_float(ops[t]->a[3] >> (16 * h) & 0xFFFF);
                }
            }
        else wgmma_load(A, 64, o.desc_a, o.trans_a, o.atype, o.file, o.line);
        wgmma_load(B, n, o.desc_b, o.trans_b, o.btype, o.file, o.line);   // B[n][k]
#if defined(SIMT_RACE_DETECT)
        if (!o.a_regs) wgmma_race_reads(ops, first, 64, o.desc_a, o.trans_a, o.atype, "wgmma.mma_async A (at wait_group)");
        wgmma_race_reads(ops, first, n, o.desc_b, o.trans_b, o.btype, "wgmma.mma_async B (at wait_group)");
        bytes_mma(2LL * 64 * n * kk);   // the launch's tensor-core FLOPs (bytecount.h)
#endif
        for (int t = 0; t < 128; t++) {   // the input D, fragment by fragment
            const float* in = ops[t]->d_in;
            if (!ops[t]->has_in) {
                in = nullptr;
                for (const Acc& x : acc[t]) if (x.d == ops[t]->d) in = x.v;
                if (!in) wgmma_error("internal: no input for a chained wgmma.mma_async", o.file, o.line);
            }
            int q = t / 32, g = t % 32 / 4, c = t % 4;
            for (int i = 0; i < n / 2; i++) D[(16 * q + g + 8 * (i / 2 % 2)) * 256 + 8 * (i / 4) + 2 * c + i % 2] = in[i];
        }
        for (int m = 0; m < 64; m++)
            for (int col = 0; col < n; col++) {
                float s = o.scale_d ? D[m * 256 + col] : 0.0f;
                for (int k = 0; k < kk; k++) s += A[m * kk + k] * B[col * kk + k];   // exact products, one rounding per add
                D[m * 256 + col] = s;
            }
        for (int t = 0; t < 128; t++) {
            Acc* x = nullptr;
            for (Acc& y : acc[t]) if (y.d == ops[t]->d) x = &y;
            if (!x) { acc[t].push_back(Acc{ops[t]->d, n, {}}); x = &acc[t].back(); }
            x->n = n;
            int q = t / 32, g = t % 32 / 4, c = t % 4;
            for (int i = 0; i < n / 2; i++) x->v[i] = D[(16 * q + g + 8 * (i / 2 % 2)) * 256 + 8 * (i / 4) + 2 * c + i % 2];
        }
    }
    for (int t = 0; t < 128; t++) {
        lanes[t].groups.pop_front();
        for (const Acc& x : acc[t]) {   // to the registers, or on to the next pending op on them
            WgmmaOp* next = nullptr;
            for (auto& g : lanes[t].groups) for (WgmmaOp& p : g) if (!next && p.d == x.d) next = &p;
            for (WgmmaOp& p : lanes[t].open) if (!next && p.d == x.d) next = &p;
            if (next) { next->has_in = true; memcpy(next->d_in, x.v, sizeof(float) * x.n / 2); }
            else memcpy(x.d, x.v, sizeof(float) * x.n / 2);
        }
    }
}

inline void wgmma_wait_collective(int first, void* const lanes[128]) {
    int n = *(const int*)lanes[0];
    WgLane* l = tls_wg->lanes + first;
    for (int t = 0; t < 128; t++) {
        if (*(const int*)lanes[t] != n || l[t].groups.size() != l[0].groups.size() || l[t].open.size() != l[0].open.size())
            wgmma_error("thread " + std::to_string(first + t) + " of the warpgroup has another wgmma.wait_group count or other pending "
                        "wgmma groups than thread " + std::to_string(first), tls_sched->fibers[tls_sched->current].file,
                        tls_sched->fibers[tls_sched->current].line);
        if (!l[t].groups.empty() && l[t].groups.front().size() != l[0].groups.front().size())
            wgmma_error("the warpgroup's threads committed different wgmma groups", tls_sched->fibers[tls_sched->current].file,
                        tls_sched->fibers[tls_sched->current].line);
    }
    while ((int)l[0].groups.size() > n) wgmma_complete_group(first);
}

// every committed group of the warpgroup but the newest n completes now
inline void wgmma_wait(int n, const char* file, int line) {
    SIMT_RACE_QUIET;
    if (n < 0) wgmma_error("wgmma.wait_group N needs N >= 0", file, line);
    warpgroup_op("wgmma.wait_group", &n, wgmma_wait_collective, false, file, line);
    tls_wg->lanes[tls_sched->current].fenced = false;
}

}  // namespace simt
