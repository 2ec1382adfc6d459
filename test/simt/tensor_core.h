/*
 * tensor_core.h — the emulator's warp-level matrix instructions: what model/tensor_core.cuh runs under
 * SIMT_EMULATION in place of its inline PTX. Included by simt.h.
 *
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32  D (16x8) = A (16x16) B (16x8) + C
 *   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16
 *   cp.async.cg.shared.global (16 bytes, optional zero fill), cp.async.commit_group, cp.async.wait_group N
 *
 * mma and ldmatrix are warp collectives (simt.h's OP_COLLECTIVE): the 32 lanes rendezvous, each
 * with a pointer to its registers; the last lane to arrive assembles the whole matrices from the
 * lanes' fragments with the layouts of the PTX ISA (below), computes, and hands every lane its
 * fragment of the result. A lane that is missing (exited, diverged) is reported as for a shuffle.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type";
 * g = lane / 4 ("groupID"), t = lane % 4 ("threadID_in_group"); a .b32 register holds two bf16,
 * the lower-indexed element in the low 16 bits):
 *   A (16x16, row-major), 4 regs:  a[0] = A[g][2t..2t+1]      a[1] = A[g+8][2t..2t+1]
 *                                  a[2] = A[g][2t+8..2t+9]    a[3] = A[g+8][2t+8..2t+9]
 *   B (16x8, "col": K x N),  2 regs:  b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
 *   C, D (16x8 fp32), 4 floats:    c[0..1] = C[g][2t..2t+1]   c[2..3] = C[g+8][2t..2t+1]
 *   ldmatrix: matrix i (0 .. x-1) is 8 rows of 8 b16, row r at the address lane 8 i + r supplies
 *     (16-byte aligned; the other lanes' addresses are not used); lane l receives in r[i]
 *     M_i[l/4][2(l%4) .. 2(l%4)+1], or with .trans M_i[2(l%4)][l/4] (low) and M_i[2(l%4)+1][l/4] (high).
 *
 * Accumulation: the products of two bf16 are exact in fp32; the emulator adds them to C in fp32, one
 * at a time in k order (d = c + a_0 b_0, then + a_1 b_1, ...: round to nearest even after every
 * addition). The hardware's internal order and precision of this sum is not specified by the PTX
 * ISA (tensor cores add groups of products with wider alignment and truncation), so results agree
 * with a GPU to fp32 summation order, not bit for bit: tests compare with tolerances against a
 * double-precision reference.
 *
 * cp.async: a copy lands when its thread waits for its group (cp.async.wait_group N completes
 * every committed group but the newest N), never earlier — the latest a GPU may deliver it. So a
 * read of the destination before the wait sees what was there before (shared memory is poisoned
 * with NaN at every block start): a missing wait gives a wrong result. The source is read when the
 * copy lands. Copies not yet committed are not waited for by wait_group (as in the ISA); copies a
 * thread never waits for never land.
 */
#pragma once

namespace simt {

inline float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// --- mma.sync m16n8k16, bf16 x bf16 + fp32 -> fp32 --------------------------------------------

struct MmaLane { uint32_t a[4], b[2]; float c[4], d[4]; };

inline void mma_m16n8k16_bf16_collective(void* const lanes[32]) {
    float A[16][16], B[16][8], C[16][8];
#if defined(SIMT_RACE_DETECT)
    bytes_mma(2 * 16 * 8 * 16);   // the launch's tensor-core FLOPs (bytecount.h)
#endif
    for (int l = 0; l < 32; l++) {
        const MmaLane* x = (const MmaLane*)lanes[l];
        int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; h++) {   // h: low / high half of each register
            A[g][2 * t + h] = bf16_bits_to_float(x->a[0] >> (16 * h) & 0xFFFF);
            A[g + 8][2 * t + h] = bf16_bits_to_float(x->a[1] >> (16 * h) & 0xFFFF);
            A[g][2 * t + 8 + h] = bf16_bits_to_float(x->a[2] >> (16 * h) & 0xFFFF);
            A[g + 8][2 * t + 8 + h] = bf16_bits_to_float(x->a[3] >> (16 * h) & 0xFFFF);
            B[2 * t + h][g] = bf16_bits_to_float(x->b[0] >> (16 * h) & 0xFFFF);
            B[2 * t + 8 + h][g] = bf16_bits_to_float(x->b[1] >> (16 * h) & 0xFFFF);
            C[g][2 * t + h] = x->c[h];
            C[g + 8][2 * t + h] = x->c[2 + h];
        }
    }
    // D = C + A B, each output's sum in k order (the product is exact in fp32, so a contracted fma rounds the
    // same: one rounding per addition); a row's 8 outputs advance together, one k at a time (independent sums,
    // which the compiler vectorises; an output at a time was a chain of 16 dependent additions)
    for (int row = 0; row < 16; row++)
        for (int k = 0; k < 16; k++) {
            float a = A[row][k];
            for (int col = 0; col < 8; col++) C[row][col] += a * B[k][col];
        }
    for (int l = 0; l < 32; l++) {
        MmaLane* x = (MmaLane*)lanes[l];
        int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) x->d[i] = C[g + 8 * (i / 2)][2 * t + i % 2];
    }
}

inline void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], const char* file,
                                  int line) {
    MmaLane x;
    SIMT_RACE_QUIET;
    memcpy(x.a, a, sizeof x.a);
    memcpy(x.b, b, sizeof x.b);
    memcpy(x.c, c, sizeof x.c);
    warp_op(OP_COLLECTIVE, 0xffffffffu, (uint64_t)(uintptr_t)&x, 0, 32, file, line, mma_m16n8k16_bf16_collective,
            "mma.sync.m16n8k16");
    memcpy(d, x.d, sizeof x.d);   // d may alias c
}

// --- ldmatrix.m8n8.{x1,x2,x4}{,.trans}.b16 ---------------------------------------------------

struct LdmatrixLane { const void* addr; uint32_t r[4]; };

template <int NMAT, bool TRANS> inline void ldmatrix_collective(void* const lanes[32]) {
    uint16_t M[4][8][8];   // matrix, row, column, as stored
    for (int i = 0; i < NMAT; i++)
        for (int r = 0; r < 8; r++) {
            const void* p = ((const LdmatrixLane*)lanes[8 * i + r])->addr;
            if (p == nullptr || (uintptr_t)p % 16 != 0) {
                Sched* s = tls_sched;
                char b[160];
                snprintf(b, sizeof b, ": lane %d supplies the row address %p, not 16-byte aligned", 8 * i + r, p);
                fiber_error(s, std::string("warp error in ") + where(s) + ": ldmatrix at " + s->fibers[s->current].file + ":" +
                               std::to_string(s->fibers[s->current].line) + b);
            }
#if defined(SIMT_RACE_DETECT)
            {   // the lane that supplies the row reads it
                Sched* s = tls_sched;
                int tid = s->current / 32 * 32 + 8 * i + r;
                race_collective_access(p, 16, false, tid, s->fibers[tid].race_pc, s->fibers[tid].collective_name);
            }
#endif
            memcpy(M[i][r], p, 16);
        }
    for (int l = 0; l < 32; l++) {
        LdmatrixLane* x = (LdmatrixLane*)lanes[l];
        for (int i = 0; i < NMAT; i++) {
            uint32_t lo, hi;
            if (TRANS) { lo = M[i][2 * (l % 4)][l / 4]; hi = M[i][2 * (l % 4) + 1][l / 4]; }
            else { lo = M[i][l / 4][2 * (l % 4)]; hi = M[i][l / 4][2 * (l % 4) + 1]; }
            x->r[i] = lo | hi << 16;
        }
    }
}

template <int NMAT, bool TRANS> SIMT_RACE_SITE inline void ldmatrix(uint32_t* r, const void* smem_row, const char* file, int line) {
    static_assert(NMAT == 1 || NMAT == 2 || NMAT == 4, "ldmatrix loads 1, 2 or 4 matrices");
    static const char* const names[2][5] = {{"", "ldmatrix.x1", "ldmatrix.x2", "", "ldmatrix.x4"},
                                            {"", "ldmatrix.x1.trans", "ldmatrix.x2.trans", "", "ldmatrix.x4.trans"}};
    SIMT_RACE_QUIET;
    LdmatrixLane x;
    x.addr = smem_row;
#if defined(SIMT_RACE_DETECT)
    tls_sched->fibers[tls_sched->current].race_pc = __builtin_return_address(0);   // this lane's read is reported there
#endif
    warp_op(OP_COLLECTIVE, 0xffffffffu, (uint64_t)(uintptr_t)&x, 0, 32, file, line, ldmatrix_collective<NMAT, TRANS>,
            names[TRANS][NMAT]);
    for (int i = 0; i < NMAT; i++) r[i] = x.r[i];
}

// --- cp.async ---------------------------------------------------------------------------------

inline void async_error(const char* what, const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    fiber_error(s, std::string("cp.async error in ") + where(s) + " at " + file + ":" + std::to_string(line) + ", " +
                   thread_name(s->fibers[s->current]) + ": " + what);
}

// 16 bytes from global src to shared dst; only the first src_bytes (0..16) are read, the rest zero
SIMT_RACE_SITE inline void cp_async_16(void* dst, const void* src, int src_bytes, const char* file, int line) {
    SIMT_RACE_QUIET;
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) async_error("a 16-byte copy needs 16-byte aligned addresses", file, line);
    if (src_bytes < 0 || src_bytes > 16) async_error("src-size must be 0..16", file, line);
    Sched* s = tls_sched;
#if defined(SIMT_RACE_DETECT)
    // the destination may be written any time from now to the wait: a write now, and again when it lands
    const void* pc = __builtin_return_address(0);
    race_collective_access(dst, 16, true, s->current, pc, "cp.async");
    if (src_bytes) race_collective_access(src, src_bytes, false, s->current, pc, "cp.async");
#else
    const void* pc = nullptr;
#endif
    s->fibers[s->current].async_open.push_back(AsyncCopy{dst, src, 16, src_bytes, pc});
}
inline void cp_async_commit() {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    Fiber& f = s->fibers[s->current];
    f.async_groups.push_back(std::move(f.async_open));   // an empty group is legal (and completes trivially)
    f.async_open.clear();
}
// every committed group of this thread but the newest n lands now
inline void cp_async_wait(int n) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    Fiber& f = s->fibers[s->current];
    while ((int)f.async_groups.size() > n) {
        for (const AsyncCopy& c : f.async_groups.front()) {
#if defined(SIMT_RACE_DETECT)
            race_collective_access(c.dst, c.bytes, true, s->current, c.pc, "cp.async landing");
#endif
            if (c.src_bytes) memcpy(c.dst, c.src, c.src_bytes);
            memset((char*)c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
        }
        f.async_groups.pop_front();
    }
}

}  // namespace simt
