/*
 * simt.h — a SIMT emulator: the project's CUDA kernel source, compiled by g++ with
 * -DSIMT_EMULATION, runs on the CPU with the execution model of a GPU, so that CI (no GPU) executes
 * every kernel and checks it against the CPU reference.
 *
 *   - threadIdx, blockIdx, blockDim, gridDim, dim3, warpSize; __global__/__device__/__host__,
 *     __launch_bounds__, __restrict__ and cache-hint loads (__ldg, __ldcs, __stcs, ...) as no-ops;
 *     BF16/FP8 types and conversions are the CUDA headers' own host paths (cuda_bf16.h, cuda_fp8.h).
 *   - The threads of a block run as cooperative fibers on one OS thread (a 30-instruction context
 *     switch on x86-64, ucontext elsewhere). A fiber runs until it reaches __syncthreads() or a warp
 *     operation, then the next one runs (switched to from the fiber that stops; a fiber's stack is taken
 *     when it first runs, and an exited fiber's stack is reused). __syncthreads() releases the block when every thread has
 *     arrived; warp shuffles (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync),
 *     votes (__ballot_sync, __any_sync, __all_sync) and __syncwarp() are a rendezvous of the lanes
 *     named in the mask, in 32-lane warps. Blocks run one after another (or on SIMT_THREADS OS
 *     threads, each block on one).
 *   - The tensor-core instructions of model/tensor_core.cuh (test/simt/tensor_core.h): mma.sync
 *     m16n8k16 BF16 and ldmatrix are warp collectives computing the PTX ISA's per-lane fragment
 *     layouts; cp.async copies land when their thread's cp.async.wait_group covers them. Hopper's
 *     wgmma (model/wgmma.cuh, test/simt/wgmma.h) is a 128-thread warpgroup rendezvous; its shared-memory
 *     operands are read and its accumulators written when wgmma.wait_group completes its group. Hopper's mbarriers
 *     and TMA loads (model/tma.cuh, test/simt/tma.h): a waiting thread is suspended until the phase completes, and
 *     the bulk tensor copies land when no thread can run (run_block's idle point), never earlier.
 *   - Static __shared__ variables are thread_local statics: one instance per OS thread, hence per
 *     running block. Dynamic shared memory is declared, as in the real build,
 *         extern __shared__ __align__(16) char dynamic_smem[];
 *     (one name for the whole project, as CUDA aliases every extern __shared__ array anyway); the
 *     emulator poisons it with 0xFF bytes (NaN) before every block.
 *   - Errors a GPU would hang on or silently get wrong are reported with the kernel name, the
 *     launch site and the block: a barrier that not all threads reach ("barrier divergence"), threads
 *     waiting at different barriers, a warp operation whose mask names an exited or absent lane,
 *     a deadlock. Launch-configuration errors set cudaGetLastError() as the runtime does.
 *   - Schedule: SIMT_SCHEDULE=sequential (default) runs ready threads in index order;
 *     SIMT_SCHEDULE=random:SEED (or simt::set_schedule) picks a random ready thread every time, so a
 *     missing __syncthreads() shows up as a wrong result. Per block the order is a function of the
 *     seed, the launch count and the block index only: runs are reproducible.
 *     SIMT_SCHEDULE=warp_ahead[:W] (or simt::set_schedule_warp_ahead) is the adversary: warp W (default
 *     0) runs whenever one of its threads can, so it reaches its next barrier before any other thread
 *     runs; the other threads run in reverse index order.
 *   - Race detection (test/simt/race.h, built with -DSIMT_RACE_DETECT and g++ -fsanitize=thread, linked
 *     without it): every load and store of a kernel is recorded per block and barrier epoch; two threads
 *     touching the same byte, one writing, with no barrier or warp synchronisation between them, fail
 *     the launch naming the kernel, the block, both threads and both source lines. The ordering is the
 *     program's, not the schedule's: a race is caught under any schedule, the sequential one included.
 *   - The CUDA runtime calls the project uses (cudaMalloc, cudaMemcpy, events, ...) are implemented
 *     on host memory; cudaMalloc poisons with 0xFF. SIMT_DEVICE_MEMORY=BYTES sets the emulated
 *     device size (default 80 GiB), so the out-of-memory path can be tested; SIMT_MALLOC_FAIL=N makes the
 *     N-th cudaMalloc of the process fail (cudaErrorMemoryAllocation), so can an allocation that fails after
 *     a memory estimate said it would fit (another process on the GPU, fragmentation). SIMT_SM=89 (say)
 *     reports that compute capability instead of 9.0, for the product's refusals and defaults on other GPUs.
 *   - SIMT_SHAPES_ONLY=1: the step-time model's mode (dev/predict/README.md). Every call is checked and
 *     logged (SIMT_WORKLOG, the counters) as usual, but no kernel body runs, the cuBLASLt twin computes
 *     nothing, and copies, memsets and NCCL operations above SIMT_SHAPES_SMALL bytes (4096) move no
 *     data; device memory is reserved address space (mmap MAP_NORESERVE, zeros, no poison), so a model
 *     of any size runs its real control flow in seconds and in little host memory. Values are
 *     meaningless (zeros); the product asks platform_shapes_only() (model/platform.h) only to skip its
 *     host-side initialisation and to take a balanced routing instead of the router's (which did not run).
 * One launch helper serves both builds: LAUNCH(kernel, grid, block, smem, stream, args...) in
 * model/cuda_common.h.
 */
#pragma once
#ifndef SIMT_EMULATION
#error "test/simt/simt.h is the SIMT emulation layer: compile with -DSIMT_EMULATION"
#endif

// CUDA qualifiers, defined before the CUDA headers so that their host defaults do not apply
#define __shared__ thread_local
#define __launch_bounds__(...)
#define __grid_constant__
#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#if defined(SIMT_RACE_DETECT)
// The instrumentation sees a store only as an assignment: `out[i] = __float2bfloat16(x)` left as a call that
// returns the struct straight into global memory (GCC does not inline it in a large translation unit) would
// escape the race detector and the byte count (bytecount.h). Inlined, it is a plain 2-byte store.
static inline __nv_bfloat16 __float2bfloat16(const float a) __attribute__((always_inline));
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <ctime>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>
#include <omp.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include "counters.h"   // launches, syncs and copies per step (the step's budget)

// ---------------------------------------------------------------------------------------------
// built-in variables and device functions

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

// the largest dynamic shared memory of a block on Hopper (227 KiB)
#define SIMT_MAX_DYNAMIC_SMEM (227 * 1024)
// (aligned to 1024 bytes: the 128-byte swizzle of wgmma operands repeats every 1024 bytes of address, wgmma.h)
inline thread_local __attribute__((aligned(1024))) char dynamic_smem[SIMT_MAX_DYNAMIC_SMEM];

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
// the single-rounding intrinsics (never fused into an FMA): plain operations, which SIMT_FLAGS' -ffp-contract=off keeps apart
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

// cache-hint loads and stores: plain memory accesses on the CPU
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldca(const T* p) { return *p; }
template <typename T> inline T __ldlu(const T* p) { return *p; }
template <typename T> inline T __ldcv(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
template <typename T> inline void __stwb(T* p, T v) { *p = v; }
template <typename T> inline void __stwt(T* p, T v) { *p = v; }
#if defined(SIMT_RACE_DETECT)
// g++ refuses a bare fence under -fsanitize=thread (-Werror=tsan): a sequentially consistent read-modify-write,
// which on x86-64 is as full a barrier (its variable is atomic: the race detector does not record it)
inline int simt_fence_word;
inline void __threadfence() { __atomic_fetch_add(&simt_fence_word, 0, __ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_fetch_add(&simt_fence_word, 0, __ATOMIC_SEQ_CST); }
#else
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#endif
inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }

// atomics: real atomics, because blocks may run on several OS threads
template <typename T> inline T simt_atomic_float_op(T* p, T v, int op) {
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        want = op == 0 ? old + v : op == 1 ? (v > old ? v : old) : (v < old ? v : old);
    } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return old;
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) { return simt_atomic_float_op(p, v, 0); }
inline double atomicAdd(double* p, double v) { return simt_atomic_float_op(p, v, 0); }
inline int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicSub(unsigned* p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
inline int atomicMax(int* p, int v) { return simt_atomic_float_op(p, v, 1); }
inline unsigned atomicMax(unsigned* p, unsigned v) { return simt_atomic_float_op(p, v, 1); }
inline int atomicMin(int* p, int v) { return simt_atomic_float_op(p, v, 2); }
inline unsigned atomicMin(unsigned* p, unsigned v) { return simt_atomic_float_op(p, v, 2); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline float atomicExch(float* p, float v) { float old; __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST); return old; }
template <typename T> inline T simt_atomic_cas(T* p, T compare, T val) {
    __atomic_compare_exchange_n(p, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;  // the old value either way
}
inline int atomicCAS(int* p, int c, int v) { return simt_atomic_cas(p, c, v); }
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { return simt_atomic_cas(p, c, v); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c, unsigned long long v) { return simt_atomic_cas(p, c, v); }
inline int atomicAnd(int* p, int v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline int atomicXor(int* p, int v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAnd(unsigned* p, unsigned v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicXor(unsigned* p, unsigned v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }

// ---------------------------------------------------------------------------------------------
// fibers: the context switch

#if defined(__x86_64__)
// simt_switch(save, load): saves the callee-saved registers on the current stack, stores the stack
// pointer in *save, and resumes the context whose stack pointer is `load`. (MXCSR and the x87
// control word are not switched: kernels do not change them.) Weak, so that every translation
// unit may carry it.
extern "C" void simt_switch(void** save, void* load);
__asm__(
    ".text\n"
    ".weak simt_switch\n"
    ".type simt_switch,@function\n"
    "simt_switch:\n"
    "  endbr64\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size simt_switch,.-simt_switch\n");
#endif

namespace simt {

// An error the GPU would show as a hang, a crash or a wrong result. Reported with the kernel and
// block; thrown when set_throw_errors(true) (the emulator's own tests), else printed + exit(1).
struct Error : std::runtime_error { using std::runtime_error::runtime_error; };

enum FiberState { READY, RUNNING, AT_BARRIER, AT_WARP, EXITED };
enum WarpOp { OP_SHFL_IDX, OP_SHFL_XOR, OP_SHFL_DOWN, OP_SHFL_UP, OP_BALLOT, OP_SYNCWARP, OP_COLLECTIVE };
static const char* const warp_op_names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync",
                                            "__ballot_sync/__any_sync/__all_sync", "__syncwarp", "a warp-collective instruction"};

// A warp-collective instruction (mma.sync, ldmatrix; test/simt/tensor_core.h): every lane brings a
// pointer to its own operands and results; the last lane to arrive runs the instruction for the
// whole warp (lanes[j]: lane j's pointer, NULL outside the mask), writing every lane's results.
typedef void (*WarpCollective)(void* const lanes[32]);

// a cp.async copy a thread has issued and that has not landed yet (test/simt/tensor_core.h):
// 16 bytes to dst, the first src_bytes of them from src and the rest zeros; pc: where it was issued (race
// detection)
struct AsyncCopy { void* dst; const void* src; int bytes, src_bytes; const void* pc; };

// (the fields that a switch and a warp operation read come first, together: the scheduler visits the fibers of a
// 1024-thread block in turn, and their cache lines do not all stay in L1)
struct Fiber {
    void* sp;                      // saved stack pointer (x86-64)
    uint3 tid;
    int state;
    int stack_k;                   // its stack (Sched::stacks' number stack_k); -1 until it first runs (start_fiber)
    // the warp operation this lane waits at
    int op, arg, width;
    unsigned mask;
    uint64_t value, result;
#if !defined(__x86_64__)
    ucontext_t ctx;
#endif
    const char* file;
    int line;
    WarpCollective collective;     // op == OP_COLLECTIVE: the instruction, and its name for messages
    const char* collective_name;
    const void* race_pc;           // race detection: where this lane issued its collective
    // cp.async: the copies issued since the last commit, and the committed groups, oldest first.
    // They land when the thread waits for them (cp.async.wait_group), never earlier.
    std::vector<AsyncCopy> async_open;
    std::deque<std::vector<AsyncCopy>> async_groups;
};
inline const char* op_name(const Fiber& f) { return f.op == OP_COLLECTIVE ? f.collective_name : warp_op_names[f.op]; }

struct Options {
    bool random = false;
    uint64_t seed = 0;
    int warp_ahead = -1;           // >= 0: the adversarial schedule (SIMT_SCHEDULE=warp_ahead[:W])
    bool throw_errors = false;
    int os_threads = 1;            // blocks run in parallel on this many OS threads
    size_t stack_bytes = 64 * 1024;
    size_t device_memory = (size_t)80 << 30;
    unsigned long long malloc_fail = 0;   // SIMT_MALLOC_FAIL=N (> 0): the N-th cudaMalloc fails
    int sm = 90;                          // SIMT_SM=MAJORMINOR: the compute capability reported (80: an A100, 89: an L40S)
    bool shapes_only = false;      // SIMT_SHAPES_ONLY=1 (above): record the work, do none of it
    bool loaded = false;
};

inline Options& options() {
    static Options o;
    if (!o.loaded) {
        o.loaded = true;
        const char* s = getenv("SIMT_SCHEDULE");
        if (s && !strncmp(s, "random", 6)) { o.random = true; o.seed = s[6] == ':' ? strtoull(s + 7, NULL, 10) : 1; }
        else if (s && !strncmp(s, "warp_ahead", 10)) o.warp_ahead = s[10] == ':' ? atoi(s + 11) : 0;
        else if (s && *s && strcmp(s, "sequential") != 0) {
            fprintf(stderr, "error: SIMT_SCHEDULE='%s' must be 'sequential', 'random:SEED' or 'warp_ahead[:W]'\n", s);
            exit(2);
        }
        const char* t = getenv("SIMT_THREADS");
        if (t && atoi(t) > 0) o.os_threads = atoi(t);
        const char* k = getenv("SIMT_STACK_KB");
        if (k && atoi(k) >= 16) o.stack_bytes = (size_t)atoi(k) * 1024;
        const char* m = getenv("SIMT_DEVICE_MEMORY");
        if (m && strtoull(m, NULL, 10) > 0) o.device_memory = strtoull(m, NULL, 10);
        const char* sm = getenv("SIMT_SM");
        if (sm && *sm) {
            char* end = nullptr;
            long v = strtol(sm, &end, 10);
            if (*end || v < 50 || v > 129) { fprintf(stderr, "error: SIMT_SM='%s' must be a compute capability such as 80, 89 or 90\n", sm); exit(2); }
            o.sm = (int)v;
        }
        const char* mf = getenv("SIMT_MALLOC_FAIL");
        if (mf && *mf) {
            char* end = nullptr;
            o.malloc_fail = strtoull(mf, &end, 10);
            if (*end || o.malloc_fail == 0) { fprintf(stderr, "error: SIMT_MALLOC_FAIL='%s' must be a positive integer\n", mf); exit(2); }
        }
        const char* so = getenv("SIMT_SHAPES_ONLY");
        if (so && *so && strcmp(so, "0") != 0) {
            if (strcmp(so, "1") != 0) { fprintf(stderr, "error: SIMT_SHAPES_ONLY='%s' must be 0 or 1\n", so); exit(2); }
            o.shapes_only = true;
        }
    }
    return o;
}
inline void set_throw_errors(bool on) { options().throw_errors = on; }
// for tests: the message of the simt::Error that f() raises ("" if none)
template <typename F> inline std::string error_of(F f) {
    set_throw_errors(true);
    std::string msg;
    try { f(); } catch (const Error& e) { msg = e.what(); }
    set_throw_errors(false);
    return msg;
}
inline void set_os_threads(int n) { options().os_threads = n > 0 ? n : 1; }
// SIMT_SHAPES_ONLY's device memory: one reserved region (32 TiB of address space, MAP_NORESERVE: a page exists
// only once written), handed out upwards in 256-byte-aligned pieces and never reused, so that allocations made
// one after another have increasing addresses, as cudaMalloc's do (the product's pair_strides batches two
// experts' GEMMs when their buffers' distances have the same sign: the allocator's order shapes the step)
inline void* shapes_alloc(size_t n) {
    static char* base = nullptr;
    static size_t used = 0, cap = (size_t)1 << 45;
    if (!base) {
        void* b = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b == MAP_FAILED) return nullptr;
        base = (char*)b;
    }
    size_t take = (std::max<size_t>(n, 1) + 255) & ~(size_t)255;
    if (used + take > cap) return nullptr;
    used += take;
    return base + used - take;
}
// SIMT_SHAPES_ONLY: does an operation of n bytes move its data? (only the small ones: the host reads them)
static const size_t SHAPES_SMALL = 4096;
inline bool moves_data(size_t n) { return !options().shapes_only || n <= SHAPES_SMALL; }

inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// the scheduler of one OS thread: runs one block at a time
struct Sched {
    std::vector<Fiber> fibers;
    char* stacks = nullptr;
    size_t stack_bytes = 0, stack_stride = 0;
    // The stacks are handed out when a fiber first runs, and an exited fiber's stack is reused: in a block
    // without barriers or warp operations every thread runs to its end on one of two stacks that stay in the
    // cache, instead of touching a stack per thread. (A block whose threads all wait somewhere holds one each.)
    std::vector<int> free_stacks;     // given back by exited fibers, the latest last
    int stacks_used = 0;              // stacks [0, stacks_used) have been handed out in this block
    int dead_stack = -1;              // the stack of the fiber that just exited: free once another context runs
    int capacity = 0;
    void* main_sp = nullptr;
#if !defined(__x86_64__)
    ucontext_t main_ctx;
#endif
    int current = -1;
    std::vector<int> ready;
    size_t ready_head = 0;
    int nthreads = 0, nexited = 0, nbarrier = 0;
    dim3 shape = dim3(0, 0, 0);   // the block shape the fibers' thread indices were computed for
    const char* barrier_file = nullptr;
    int barrier_line = 0;
    unsigned warp_arrived[32];
    unsigned warp_exited[32];
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    uint64_t rng = 0;
    bool random = false;
    int warp_ahead = -1;           // SIMT_SCHEDULE=warp_ahead:W
    std::string error;             // set inside a fiber, raised by the scheduler
    const char* kernel = "";
    const char* launch_file = "";
    int launch_line = 0;
    uint64_t block_serial = 0;     // counts the blocks run: per-block state kept elsewhere (wgmma.h) knows it is stale

    ~Sched() { if (stacks) munmap(stacks, (size_t)capacity * stack_stride); }
};
inline thread_local Sched* tls_sched = nullptr;

inline Sched* sched() {
    if (!tls_sched) tls_sched = new Sched();   // one per OS thread, kept for the program's life
    return tls_sched;
}

inline std::string where(const Sched* s) {
    char buf[512];
    snprintf(buf, sizeof buf, "kernel %s (launched at %s:%d) block (%u,%u,%u)", s->kernel, s->launch_file,
             s->launch_line, blockIdx.x, blockIdx.y, blockIdx.z);
    return buf;
}
inline std::string thread_name(const Fiber& f) {
    char buf[64];
    snprintf(buf, sizeof buf, "thread (%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
    return buf;
}

inline void to_main(Sched* s) {
    Fiber& f = s->fibers[s->current];
#if defined(__x86_64__)
    simt_switch(&f.sp, s->main_sp);
#else
    swapcontext(&f.ctx, &s->main_ctx);
#endif
}

// a fiber-side error: recorded, and the fiber never runs again
[[noreturn]] inline void fiber_error(Sched* s, const std::string& msg) {
    if (s->error.empty()) s->error = msg;
    s->fibers[s->current].state = EXITED;
    to_main(s);
    __builtin_unreachable();
}

#if defined(SIMT_RACE_DETECT)
}  // namespace simt
#include "race.h"
namespace simt {
#define SIMT_RACE_QUIET simt::RaceQuiet race_quiet_
// an emulated instruction that reports its caller as the access site: not inlined into the kernel
#define SIMT_RACE_SITE __attribute__((noinline))
#else
#define SIMT_RACE_QUIET
#define SIMT_RACE_SITE
#endif

// the mbarriers' and bulk tensor copies' hooks (tma.h)
inline bool tma_idle(Sched* s);
inline std::string tma_deadlock_note(Sched* s);
inline void tma_barrier_join(Sched* s);
inline void suspend(Sched* s);   // (with run_block's loop, below)

inline void make_ready(Sched* s, int i) {
    s->fibers[i].state = READY;
    s->ready.push_back(i);
}

[[noreturn]] inline void fiber_exit(Sched* s) {
    SIMT_RACE_QUIET;
    Fiber& f = s->fibers[s->current];
    int lin = s->current;
    f.state = EXITED;
    s->nexited++;
    s->warp_exited[lin / 32] |= 1u << (lin % 32);
    if (s->nbarrier > 0)
        fiber_error(s, "barrier divergence in " + where(s) + ": " + thread_name(f) + " exited while " +
                       std::to_string(s->nbarrier) + " thread(s) wait at __syncthreads() at " + s->barrier_file + ":" +
                       std::to_string(s->barrier_line));
    // a lane that leaves while others of its warp wait for it in a warp operation
    for (int l = 0; s->warp_arrived[lin / 32] && l < 32; l++) {
        int j = (lin / 32) * 32 + l;
        if (j >= s->nthreads || s->fibers[j].state != AT_WARP) continue;
        if (s->fibers[j].mask & (1u << (lin % 32)))
            fiber_error(s, std::string("warp divergence in ") + where(s) + ": " + thread_name(f) +
                           " exited while lane " + std::to_string(l) + " waits for it in " +
                           op_name(s->fibers[j]) + " at " + s->fibers[j].file + ":" +
                           std::to_string(s->fibers[j].line));
    }
    s->dead_stack = f.stack_k;   // (reused once this fiber is off it)
    suspend(s);
    __builtin_unreachable();
}

// the exited fiber's stack goes back to the pool: called by whichever context runs after it (run_block's loop,
// a fiber resumed in suspend(), a fiber starting in fiber_entry), on its own stack
inline void free_dead_stack(Sched* s) {
    if (s->dead_stack >= 0) { s->free_stacks.push_back(s->dead_stack); s->dead_stack = -1; }
}

inline void fiber_entry() {
    Sched* s = tls_sched;
    {
        SIMT_RACE_QUIET;   // (the emulator's bookkeeping, not the kernel's accesses)
        free_dead_stack(s);
    }
    s->body(s->body_arg);
    fiber_exit(s);
}

#if !defined(__x86_64__)
inline void fiber_entry_uc() { fiber_entry(); }
#endif

inline void ensure_capacity(Sched* s, int n) {
    size_t want_stack = options().stack_bytes;
    if (n <= s->capacity && want_stack == s->stack_bytes) return;
    s->shape = dim3(0, 0, 0);
    if (s->stacks) munmap(s->stacks, (size_t)s->capacity * s->stack_stride);
    long page = sysconf(_SC_PAGESIZE);
    s->stack_bytes = want_stack;
    s->stack_stride = want_stack + page;         // one guard page below each stack
    s->capacity = n > 256 ? 1024 : 256;
    s->stacks = (char*)mmap(NULL, (size_t)s->capacity * s->stack_stride, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s->stacks == MAP_FAILED) { fprintf(stderr, "error: simt: cannot map fiber stacks\n"); exit(1); }
    s->fibers.assign(s->capacity, Fiber());
    for (int i = 0; i < s->capacity; i++) mprotect(s->stacks + (size_t)i * s->stack_stride, page, PROT_NONE);
}

// the fiber's first run: a stack (an exited fiber's, else the next unused one) and the context that enters fiber_entry
inline void start_fiber(Sched* s, Fiber& f) {
    int k;
    if (!s->free_stacks.empty()) {
        k = s->free_stacks.back();
        s->free_stacks.pop_back();
    } else {
        k = s->stacks_used++;
    }
    f.stack_k = k;
    char* stack = s->stacks + (size_t)k * s->stack_stride + (s->stack_stride - s->stack_bytes);   // (above its guard page)
#if defined(__x86_64__)
    // the stack tops are staggered by 64 bytes per stack (mod 4 KiB): with equal page offsets every
    // fiber's top frame would fall into the same L1 cache set
    uint64_t* sp = (uint64_t*)(((uintptr_t)(stack + s->stack_bytes - (k % 64) * 64)) & ~(uintptr_t)15);
    *--sp = 0;                                   // fiber_entry's (never used) return address
    *--sp = (uint64_t)(uintptr_t)&fiber_entry;   // where simt_switch's `ret` goes
    for (int r = 0; r < 6; r++) *--sp = 0;       // rbp rbx r12 r13 r14 r15
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = s->stack_bytes;
    f.ctx.uc_link = NULL;
    makecontext(&f.ctx, fiber_entry_uc, 0);
#endif
}

// takes the next fiber off the ready queue as the schedule says, and makes it the running one (run_block's
// loop, and suspend() on a fiber's way out: the same choice either way)
__attribute__((always_inline)) inline int pick_next(Sched* s) {
    int i;
    if (s->warp_ahead >= 0) {
        // the adversary: warp `warp_ahead` first whenever it can run, then the others in reverse index
        // order, so that one warp runs ahead to its next barrier (or warp operation) and the last
        // threads of the block overtake the first ones
        size_t pick = s->ready_head;
        for (size_t k = s->ready_head; k < s->ready.size(); k++) {
            int c = s->ready[k], p = s->ready[pick];
            bool ca = c / 32 == s->warp_ahead, pa = p / 32 == s->warp_ahead;
            if (ca != pa ? ca : ca ? c < p : c > p) pick = k;
        }
        i = s->ready[pick];
        s->ready[pick] = s->ready[s->ready_head];
    } else if (s->random) {
        size_t n = s->ready.size() - s->ready_head;
        s->rng = mix64(s->rng);
        size_t pick = s->ready_head + (size_t)(s->rng % n);
        i = s->ready[pick];
        s->ready[pick] = s->ready[s->ready_head];
    } else {
        i = s->ready[s->ready_head];
    }
    s->ready_head++;
    if (s->ready_head > 4096 && s->ready_head * 2 > s->ready.size()) {   // compact the queue
        s->ready.erase(s->ready.begin(), s->ready.begin() + s->ready_head);
        s->ready_head = 0;
    }
    s->current = i;
    Fiber& f = s->fibers[i];
    f.state = RUNNING;
    threadIdx = f.tid;
    if (f.stack_k < 0) start_fiber(s, f);
    return i;
}

// The running fiber stops (it waits, or it has exited; its state says which) and the next ready one runs, switched
// to from here: one context switch instead of two through run_block's loop, which picks the same fiber. The loop
// itself runs when no fiber is ready (its idle point: deadlock or landing bulk copies, tma.h) or an error is pending.
inline void suspend(Sched* s) {
    if (!s->error.empty() || s->ready_head == s->ready.size()) { to_main(s); return; }
    int me = s->current;
#if defined(SIMT_RACE_DETECT)
    race_set_active(false);   // as in run_block's loop: the choice is the emulator's, not a fiber's
#endif
    int i = pick_next(s);
#if defined(SIMT_RACE_DETECT)
    race_set_active(true);
#endif
    if (i == me) return;      // (it was ready again itself: a random schedule's yield, mbarrier.test_wait)
#if defined(__x86_64__)
    simt_switch(&s->fibers[me].sp, s->fibers[i].sp);
#else
    swapcontext(&s->fibers[me].ctx, &s->fibers[i].ctx);
#endif
    free_dead_stack(s);   // (back in this fiber, which may have been switched to from one that exited)
}

// Runs block `blockIdx` of the current launch to its end. Returns false (with s->error) on an error.
inline bool run_block(Sched* s, int nthreads) {
    s->nthreads = nthreads;
    s->block_serial++;
    s->nexited = 0;
    s->nbarrier = 0;
    s->error.clear();
    s->ready.clear();
    s->ready_head = 0;
    memset(s->warp_arrived, 0, sizeof s->warp_arrived);
    memset(s->warp_exited, 0, sizeof s->warp_exited);
    bool same_shape = s->shape.x == blockDim.x && s->shape.y == blockDim.y && s->shape.z == blockDim.z;
    s->shape = blockDim;
    s->ready.resize(nthreads);
    for (int i = 0; i < nthreads; i++) {
        Fiber& f = s->fibers[i];
        if (!same_shape) {
            f.tid.x = i % blockDim.x;
            f.tid.y = (i / blockDim.x) % blockDim.y;
            f.tid.z = i / (blockDim.x * blockDim.y);
        }
        f.state = READY;
        f.async_open.clear();   // copies a thread of the previous block left unwaited never land here
        if (!f.async_groups.empty()) f.async_groups.clear();   // (its clear() is a call even when empty)
        f.stack_k = -1;         // (a stack when it first runs: start_fiber)
        s->ready[i] = i;
    }
    s->free_stacks.clear();     // (the previous block's: every stack is unused now)
    s->stacks_used = 0;
    s->dead_stack = -1;
#if defined(SIMT_RACE_DETECT)
    race_block_start(s, nthreads);
#endif
    while (s->ready_head < s->ready.size() || tma_idle(s)) {   // (idle: bulk copies in flight land, tma.h)
        int i = pick_next(s);
#if defined(SIMT_RACE_DETECT)
        race_set_active(true);
#endif
#if defined(__x86_64__)
        simt_switch(&s->main_sp, s->fibers[i].sp);
#else
        swapcontext(&s->main_ctx, &s->fibers[i].ctx);
#endif
#if defined(SIMT_RACE_DETECT)
        race_set_active(false);
#endif
        free_dead_stack(s);
        if (!s->error.empty()) return false;
    }
    if (!s->error.empty()) return false;
    if (s->nexited == nthreads) return true;
    // nothing can run, yet not every thread has finished: describe who waits where
    int at_barrier = 0, at_warp = 0;
    const Fiber* w = nullptr;
    for (int i = 0; i < nthreads; i++) {
        if (s->fibers[i].state == AT_BARRIER) at_barrier++;
        if (s->fibers[i].state == AT_WARP) { at_warp++; if (!w) w = &s->fibers[i]; }
    }
    std::string msg = "deadlock in " + where(s) + ": " + std::to_string(at_barrier) + " thread(s) wait at __syncthreads()";
    if (at_barrier) msg += std::string(" at ") + s->barrier_file + ":" + std::to_string(s->barrier_line);
    msg += ", " + std::to_string(at_warp) + " at a warp operation";
    if (w) msg += std::string(" (") + op_name(*w) + " at " + w->file + ":" + std::to_string(w->line) + ")";
    msg += ", " + std::to_string(s->nexited) + " exited" + tma_deadlock_note(s);
    s->error = msg;
    return false;
}

// ---------------------------------------------------------------------------------------------
// barriers and warp operations (called from inside a fiber)

inline void syncthreads(const char* file, int line) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    Fiber& f = s->fibers[s->current];
    if (s->nexited > 0)
        fiber_error(s, "barrier divergence in " + where(s) + ": " + thread_name(f) + " reached __syncthreads() at " +
                       file + ":" + std::to_string(line) + " after " + std::to_string(s->nexited) +
                       " thread(s) of the block exited");
    if (s->nbarrier == 0) { s->barrier_file = file; s->barrier_line = line; }
    else if (s->barrier_line != line || strcmp(s->barrier_file, file) != 0)
        fiber_error(s, "barrier divergence in " + where(s) + ": " + thread_name(f) + " waits at __syncthreads() at " +
                       file + ":" + std::to_string(line) + " while others wait at " + s->barrier_file + ":" +
                       std::to_string(s->barrier_line));
    f.state = AT_BARRIER;
    if (++s->nbarrier == s->nthreads) {   // the last to arrive releases the block
        s->nbarrier = 0;
#if defined(SIMT_RACE_DETECT)
        race_barrier();   // everything before the barrier is ordered before everything after it
        tma_barrier_join(s);   // and what one thread observed of an mbarrier, all have (tma.h)
#endif
        for (int i = 0; i < s->nthreads; i++) make_ready(s, i);
    }
    suspend(s);
}

// a warp operation's error (out of line: the common path builds no strings)
[[noreturn]] __attribute__((noinline, cold)) inline void warp_error(Sched* s, const std::string& msg) {
    fiber_error(s, "warp error in " + where(s) + msg);
}
[[noreturn]] __attribute__((noinline, cold)) inline void warp_op_error(Sched* s, int op, const char* collective_name, const char* file,
                                                                      int line, int lane, int w, const std::string& what) {
    const char* name = op == OP_COLLECTIVE ? collective_name : warp_op_names[op];
    warp_error(s, std::string(": ") + name + " at " + file + ":" + std::to_string(line) + ", lane " + std::to_string(lane) +
                  " of warp " + std::to_string(w) + ": " + what);
}

// the value lane `l` gets from a shuffle, all lanes of the mask having arrived (a ballot's and the others' are
// the same for every lane: warp_op computes them once)
__attribute__((always_inline)) inline uint64_t warp_result(Sched* s, int w, int l) {
    const Fiber& f = s->fibers[w * 32 + l];
    int width = f.width, src = l;
    switch (f.op) {
    case OP_SHFL_IDX: src = (l & ~(width - 1)) + (f.arg & (width - 1)); break;
    case OP_SHFL_XOR: src = l ^ f.arg; if (src >= (l / width + 1) * width || src > 31) src = l; break;
    case OP_SHFL_DOWN: src = (l % width) + f.arg >= width ? l : l + f.arg; break;
    case OP_SHFL_UP: src = (l % width) < f.arg ? l : l - f.arg; break;
    }
    if (__builtin_expect(!(f.mask >> src & 1), 0))
        warp_error(s, ": lane " + std::to_string(l) + " of warp " + std::to_string(w) + " reads lane " + std::to_string(src) +
                      " which is not in the mask in " + op_name(f) + " at " + f.file + ":" + std::to_string(f.line));
    return s->fibers[w * 32 + src].value;
}

inline uint64_t warp_op(int op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line,
                        WarpCollective collective = nullptr, const char* collective_name = nullptr) {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    int me = s->current, w = me / 32, lane = me % 32;
    Fiber& f = s->fibers[me];
    int lanes = std::min(32, s->nthreads - w * 32);
    unsigned present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
#define SIMT_WARP_ERR(what) warp_op_error(s, op, collective_name, file, line, lane, w, what)
    if (width < 1 || width > 32 || (width & (width - 1))) SIMT_WARP_ERR("width " + std::to_string(width) + " is not a power of 2 <= 32");
    if (!(mask >> lane & 1)) SIMT_WARP_ERR("the calling lane is not in the mask");
    if (mask & ~present) {
        char b[128];
        snprintf(b, sizeof b, "mask 0x%08x names lanes that do not exist (this warp has %d lanes)", mask, lanes);
        SIMT_WARP_ERR(b);
    }
    if (mask & s->warp_exited[w]) {
        char b[128];
        snprintf(b, sizeof b, "mask 0x%08x names lanes that have exited (0x%08x): warp divergence", mask, mask & s->warp_exited[w]);
        SIMT_WARP_ERR(b);
    }
    if (unsigned waiting = s->warp_arrived[w] & mask) {   // lanes already waiting in this mask: the same operation
        int j = __builtin_ctz(waiting);
        const Fiber& o = s->fibers[w * 32 + j];
        if (o.mask != mask || o.op != op || o.collective != collective) {
            char b[256];
            snprintf(b, sizeof b, "lane %d waits in %s (mask 0x%08x) at %s:%d with mask 0x%08x: divergent warp operations",
                     j, op_name(o), o.mask, o.file, o.line, mask);
            SIMT_WARP_ERR(b);
        }
    }
#undef SIMT_WARP_ERR
    f.op = op; f.mask = mask; f.value = value; f.arg = arg; f.width = width; f.file = file; f.line = line;
    f.collective = collective; f.collective_name = collective_name;
    f.state = AT_WARP;
    s->warp_arrived[w] |= 1u << lane;
    if ((s->warp_arrived[w] & mask) == mask) {   // the last lane of the mask: everybody's result, then go on
        Fiber* warp = &s->fibers[w * 32];
        if (op == OP_COLLECTIVE) {
            void* ptrs[32];
            for (int j = 0; j < 32; j++) ptrs[j] = mask >> j & 1 ? (void*)(uintptr_t)warp[j].value : nullptr;
            collective(ptrs);
        } else if (op == OP_BALLOT || op == OP_SYNCWARP) {   // one result for all
            uint64_t bits = 0;
            if (op == OP_BALLOT)
                for (unsigned m = mask; m; m &= m - 1)
                    if (warp[__builtin_ctz(m)].value) bits |= 1ull << __builtin_ctz(m);
            for (unsigned m = mask; m; m &= m - 1) warp[__builtin_ctz(m)].result = bits;
        } else {
            for (unsigned m = mask; m; m &= m - 1) warp[__builtin_ctz(m)].result = warp_result(s, w, __builtin_ctz(m));
        }
#if defined(SIMT_RACE_DETECT)
        race_warp_sync(w, mask);   // (after a collective's own accesses, which are the lanes' before the meeting)
#endif
        s->warp_arrived[w] &= ~mask;
        for (unsigned m = mask & ~(1u << lane); m; m &= m - 1) make_ready(s, w * 32 + __builtin_ctz(m));
        f.state = RUNNING;
        if (s->random) { make_ready(s, me); suspend(s); }   // let the others overtake this lane too
    } else {
        suspend(s);
    }
    return f.result;
}

template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffles move up to 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T> inline T from_bits(uint64_t b) { T v; memcpy(&v, &b, sizeof(T)); return v; }

template <typename T> inline T shfl(const char* file, int line, unsigned mask, T v, int src, int width = 32) {
    return from_bits<T>(warp_op(OP_SHFL_IDX, mask, to_bits(v), src, width, file, line));
}
template <typename T> inline T shfl_xor(const char* file, int line, unsigned mask, T v, int lane_mask, int width = 32) {
    return from_bits<T>(warp_op(OP_SHFL_XOR, mask, to_bits(v), lane_mask, width, file, line));
}
template <typename T> inline T shfl_down(const char* file, int line, unsigned mask, T v, unsigned delta, int width = 32) {
    return from_bits<T>(warp_op(OP_SHFL_DOWN, mask, to_bits(v), (int)delta, width, file, line));
}
template <typename T> inline T shfl_up(const char* file, int line, unsigned mask, T v, unsigned delta, int width = 32) {
    return from_bits<T>(warp_op(OP_SHFL_UP, mask, to_bits(v), (int)delta, width, file, line));
}
inline unsigned ballot(const char* file, int line, unsigned mask, int pred) {
    return (unsigned)warp_op(OP_BALLOT, mask, pred != 0, 0, 32, file, line);
}
struct SyncwarpAt {   // __syncwarp() and __syncwarp(mask) through one macro
    const char* file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { warp_op(OP_SYNCWARP, mask, 0, 0, 32, file, line); }
};
// the lanes of the calling warp that exist and have not exited
inline unsigned activemask() {
    SIMT_RACE_QUIET;
    Sched* s = tls_sched;
    int w = s->current / 32, lanes = std::min(32, s->nthreads - w * 32);
    unsigned present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
    return present & ~s->warp_exited[w];
}

// ---------------------------------------------------------------------------------------------
// the launch

inline double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct Runtime {
    std::mutex mu;
    cudaError_t last_error = cudaSuccess;
    uint64_t launches = 0;
    std::map<const void*, int> max_dynamic_smem;   // cudaFuncAttributeMaxDynamicSharedMemorySize
    std::map<void*, size_t> allocations;
    size_t allocated = 0;
    unsigned long long mallocs = 0;   // cudaMalloc calls so far (SIMT_MALLOC_FAIL)
    std::map<std::string, std::pair<long long, double>> profile;   // kernel -> launches, seconds (SIMT_PROFILE=1)
    ~Runtime() {
        if (profile.empty()) return;
        std::vector<std::pair<double, std::string>> rows;
        for (auto& p : profile) rows.push_back({p.second.second, p.first});
        std::sort(rows.rbegin(), rows.rend());
        fprintf(stderr, "simt profile (emulated seconds per kernel):\n");
        for (auto& r : rows) fprintf(stderr, "  %9.3f s %8lld launches  %s\n", r.first, profile[r.second].first, r.second.c_str());
    }
};
inline Runtime& runtime() { static Runtime r; return r; }
// the peak of the emulated device memory (counters.h); the reset starts it again from what is allocated now
inline size_t peak_device_bytes() { std::lock_guard<std::mutex> g(runtime().mu); return device_peak(); }
inline void peak_device_bytes_reset() { std::lock_guard<std::mutex> g(runtime().mu); device_peak() = runtime().allocated; }

// a new schedule: the stream of per-block orders starts again from `seed` at the next launch
inline void set_schedule(bool random, uint64_t seed) {
    options().random = random;
    options().seed = seed;
    options().warp_ahead = -1;
    runtime().launches = 0;
}

// the adversarial schedule: warp w runs first whenever it can, the others in reverse order (w < 0: off)
inline void set_schedule_warp_ahead(int w) {
    options().random = false;
    options().warp_ahead = w;
    runtime().launches = 0;
}

#if defined(SIMT_RACE_DETECT)
inline bool race_is_global(const void* p) {
    Runtime& rt = runtime();
    std::lock_guard<std::mutex> g(rt.mu);
    auto it = rt.allocations.upper_bound((void*)p);
    if (it == rt.allocations.begin()) return false;
    --it;
    return (const char*)p < (const char*)it->first + it->second;
}
#endif

[[noreturn]] inline void raise(const std::string& msg) {
    if (options().throw_errors) throw Error(msg);
    fprintf(stderr, "error: simt: %s\n", msg.c_str());
    fflush(stderr);
    exit(1);
}

inline void run_grid(const char* kernel, const void* fn, const char* file, int line, dim3 grid, dim3 block,
                     size_t smem, void (*body)(void*), void* arg) {
    Runtime& rt = runtime();
    unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    int smem_limit = 48 * 1024;
    {
        std::lock_guard<std::mutex> g(rt.mu);
        auto it = rt.max_dynamic_smem.find(fn);
        if (it != rt.max_dynamic_smem.end()) smem_limit = it->second;
    }
    const char* bad = nullptr;
    if (nthreads == 0 || nthreads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) bad = "block size";
    else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) bad = "grid size";
    else if (smem > (size_t)smem_limit) bad = "dynamic shared memory (above 48 KiB needs cudaFuncSetAttribute)";
    if (bad) {
        fprintf(stderr, "simt: invalid launch of %s at %s:%d: %s (grid %u,%u,%u block %u,%u,%u smem %zu)\n", kernel, file,
                line, bad, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        rt.last_error = cudaErrorInvalidConfiguration;
        return;
    }
    Options& o = options();
    uint64_t launch_id;
    {
        std::lock_guard<std::mutex> g(rt.mu);
        launch_id = rt.launches++;
    }
    if (o.shapes_only) return;   // SIMT_SHAPES_ONLY: checked and counted, not run
    double t_start = now();
    long long nblocks = (long long)grid.x * grid.y * grid.z;
    int nt = (int)std::min<long long>(o.os_threads, nblocks);
    std::string first_error;
    std::mutex err_mu;
    volatile bool stop = false;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (long long b = 0; b < nblocks; b++) {
        if (stop) continue;
        Sched* s = sched();
        ensure_capacity(s, (int)nthreads);
        s->kernel = kernel; s->launch_file = file; s->launch_line = line;
        s->body = body; s->body_arg = arg;
        s->random = o.random;
        s->warp_ahead = o.warp_ahead;
        s->rng = mix64(o.seed ^ mix64(launch_id * 0x100000001b3ull + (uint64_t)b));
        blockDim = block;
        gridDim = grid;
        blockIdx.x = (unsigned)(b % grid.x);
        blockIdx.y = (unsigned)((b / grid.x) % grid.y);
        blockIdx.z = (unsigned)(b / ((long long)grid.x * grid.y));
        if (smem) memset(dynamic_smem, 0xFF, smem);
        if (!run_block(s, (int)nthreads)) {
            std::lock_guard<std::mutex> g(err_mu);
            if (first_error.empty()) first_error = s->error;
            stop = true;
        }
    }
    if (!first_error.empty()) raise(first_error);
    static const bool prof = getenv("SIMT_PROFILE") && atoi(getenv("SIMT_PROFILE")) > 0;
    if (prof) {
        std::lock_guard<std::mutex> g(rt.mu);
        auto& p = rt.profile[kernel];
        p.first++;
        p.second += now() - t_start;
    }
}

// LAUNCH's emulated half: the arguments are converted to the kernel's parameter types once, as a
// real launch does, and every thread calls the kernel with its own copy of them.
}  // namespace simt

// Streams. The null stream (0: the model's) runs its work when it is issued. A stream made by
// cudaStreamCreate* DEFERS its work: kernels, async copies and sets, event records and NCCL operations
// (test/simt/nccl_twin.h) issued on it are queued, and run in order only when something waits for them:
// cudaStreamSynchronize, cudaStreamQuery, cudaDeviceSynchronize, cudaEventSynchronize, or
// cudaStreamWaitEvent on an event recorded on it (another deferred stream that waits runs it when its own
// queue reaches the wait). A GPU may run such work any time after it is issued; running it as late as the
// waits allow is the schedule that exposes a missing wait: the work that should have waited reads what
// was there before (a working slot not yet gathered, a gradient not yet reduced). It exposes one direction
// only: the null stream never runs late, so a communication stream that forgets to wait for the compute
// (a slot still being read) is not caught here. Launch-configuration errors of a deferred kernel surface
// when it runs. Under mpirun the NCCL twin's collectives run when their rank waits for them, so every rank
// must wait at the same points (the training step does: the same program on every rank); a GPU's NCCL
// kernels would progress without the wait.
struct CUstream_st { std::deque<std::function<void()>> queue; uint64_t issued = 0, done = 0; };
namespace simt {
inline std::vector<CUstream_st*>& streams() { static std::vector<CUstream_st*> v; return v; }
// runs s's queued work until its op number `upto` has run
inline void stream_run(CUstream_st* s, uint64_t upto) {
    while (s && s->done < upto && !s->queue.empty()) {
        std::function<void()> fn = std::move(s->queue.front());
        s->queue.pop_front();
        s->done++;   // counted first: a wait inside fn on this stream's earlier work finds it done
        fn();
    }
}
inline void stream_enqueue(cudaStream_t s, std::function<void()> fn) {
    if (!s) { fn(); return; }
    s->queue.push_back(std::move(fn));
    s->issued++;
}
inline void streams_run_all() {
    for (bool again = true; again;) {
        again = false;
        for (CUstream_st* s : streams()) if (!s->queue.empty()) { stream_run(s, s->issued); again = true; }
    }
}
template <typename... KArgs, typename... Args>
inline void launch(const char* name, const char* file, int line, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                   size_t smem, cudaStream_t stream, Args&&... args) {
    static_assert(sizeof...(KArgs) == sizeof...(Args), "LAUNCH: wrong number of kernel arguments");
    auto params = std::make_shared<std::tuple<std::decay_t<KArgs>...>>(std::forward<Args>(args)...);
    count_launch();
    long long logged = worklog_kernel(name, grid, block, smem, stream, *params);   // SIMT_WORKLOG (counters.h)
    auto run = [=]() {   // on a deferred stream it runs later: the converted arguments are kept by value
        auto call = [&]() { std::apply(kernel, *params); };
#if defined(SIMT_RACE_DETECT)
        if (logged >= 0) bytes_launch_begin();   // the launch's bytes and mma FLOPs for its log line (bytecount.h)
#endif
        run_grid(name, (const void*)kernel, file, line, grid, block, smem, [](void* p) { (*(decltype(call)*)p)(); }, &call);
#if defined(SIMT_RACE_DETECT)
        if (logged >= 0) {
            ByteCounts c = bytes_launch_end();
            worklog_kernel_done(logged, c.rd, c.wr, c.rd_sec, c.wr_sec, c.mma);
        }
#else
        (void)logged;
#endif
    };
    stream_enqueue(stream, run);
}


}  // namespace simt

#define __syncthreads() simt::syncthreads(__FILE__, __LINE__)
#define __shfl_sync(...) simt::shfl(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) simt::shfl_xor(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) simt::shfl_down(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) simt::shfl_up(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) simt::ballot(__FILE__, __LINE__, mask, pred)
#define __any_sync(mask, pred) (simt::ballot(__FILE__, __LINE__, mask, pred) != 0u)
#define __all_sync(mask, pred) (simt::ballot(__FILE__, __LINE__, mask, pred) == (unsigned)(mask))
#define __syncwarp(...) simt::SyncwarpAt{__FILE__, __LINE__}(__VA_ARGS__)
#define __activemask() simt::activemask()

// cudaFuncSetAttribute(kernel, ...) as cuda_runtime.h's template overload provides it
template <typename T> inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void*)entry, attr, value);
}

// ---------------------------------------------------------------------------------------------
// the CUDA runtime calls, on host memory (the emulated build links no CUDA library)

struct CUevent_st { double t; CUstream_st* s; uint64_t seq; };   // s, seq: the op of the record (s NULL: done)

extern "C" {
inline cudaError_t cudaMalloc(void** p, size_t n) {
    simt::Runtime& rt = simt::runtime();
    std::lock_guard<std::mutex> g(rt.mu);
    bool planted = ++rt.mallocs == simt::options().malloc_fail;   // (SIMT_MALLOC_FAIL: this call fails)
    if (planted || rt.allocated + n > simt::options().device_memory) {
        *p = nullptr;
        rt.last_error = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    void* q = nullptr;
    if (simt::options().shapes_only) {   // reserved address space: pages appear (zeros) only where written
        if (!(q = simt::shapes_alloc(n))) { *p = nullptr; rt.last_error = cudaErrorMemoryAllocation; return cudaErrorMemoryAllocation; }
    } else {
        // from 2 MiB on, 2 MiB-aligned and advised onto transparent huge pages (where the kernel offers them: the
        // CI machines' "madvise" mode): the poisoning below then faults once per 2 MiB, not per 4 KiB page. Page
        // faults were ~30% of a small emulated run's CPU on a paravirtualised 2-core machine (measured 2026-11-28:
        // a 1-step dbrx-tiny run 0.94 -> 0.69 s of CPU, page faults 25.9k -> 14.7k). Advice only: its failure
        // changes nothing.
        const size_t huge = (size_t)2 << 20, align = n >= huge ? huge : 256;
        if (posix_memalign(&q, align, n ? n : 1) != 0) { *p = nullptr; rt.last_error = cudaErrorMemoryAllocation; return cudaErrorMemoryAllocation; }
        if (align == huge) madvise(q, n & ~(huge - 1), MADV_HUGEPAGE);
        memset(q, 0xFF, n);   // poison: NaN for floats, -1 for ints
    }
    rt.allocations[q] = n;
    rt.allocated += n;
    simt::device_bytes_note(rt.allocated);
    *p = q;
    simt::count(&simt::counters().allocs);
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    simt::Runtime& rt = simt::runtime();
    std::lock_guard<std::mutex> g(rt.mu);
    auto it = rt.allocations.find(p);
    if (it == rt.allocations.end()) return rt.last_error = cudaErrorInvalidValue;
    rt.allocated -= it->second;
    if (simt::options().shapes_only) madvise(p, it->second, MADV_DONTNEED);   // (its address is not reused)
    else free(p);
    rt.allocations.erase(it);
    simt::count(&simt::counters().frees);
    return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t n) {
    *p = malloc(n ? n : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    simt::count(&simt::counters().allocs);
    return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
    if (p) simt::count(&simt::counters().frees);
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    simt::count_copy((int)kind, n, true);
    if (n && simt::moves_data(n)) memmove(dst, src, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    simt::count_copy((int)kind, n, false, s);
    simt::stream_enqueue(s, [=]() { if (n && simt::moves_data(n)) memmove(dst, src, n); });
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    simt::count_copy(-1, n, false);
    if (simt::moves_data(n)) memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
    simt::count_copy(-1, n, false, s);
    simt::stream_enqueue(s, [=]() { if (simt::moves_data(n)) memset(p, v, n); });
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize(void) { simt::count_sync(); simt::streams_run_all(); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { simt::count_sync("stream", s); if (s) simt::stream_run(s, s->issued); return cudaSuccess; }
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = new CUstream_st(); simt::streams().push_back(*s); return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
// stream priorities: a GPU's block scheduler prefers the pending blocks of a higher-priority stream; here every created
// stream defers as above whatever its priority (the range a Hopper GPU reports: 0 the least, -5 the greatest)
inline cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int, int) { return cudaStreamCreate(s); }
// the host asks whether s is done: it runs what s has queued (see Streams above), and then it is
inline cudaError_t cudaStreamQuery(cudaStream_t s) { if (s) simt::stream_run(s, s->issued); return cudaSuccess; }
// s waits for e: the null stream runs e's stream up to e now; a deferred stream when it gets there
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    simt::worklog_record(e, s, true);
    CUstream_st* es = e->s;
    uint64_t seq = e->seq;
    if (!es || es == s) return cudaSuccess;   // recorded on the null stream (done), or in order on s itself
    if (!s) simt::stream_run(es, seq);        // the null stream waits now
    else simt::stream_enqueue(s, [es, seq]() { simt::stream_run(es, seq); });
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaSuccess;
    simt::stream_run(s, s->issued);   // as CUDA: the work already issued completes
    auto& v = simt::streams();
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaGetLastError(void) { cudaError_t e = simt::runtime().last_error; simt::runtime().last_error = cudaSuccess; return e; }
inline cudaError_t cudaPeekAtLastError(void) { return simt::runtime().last_error; }
inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaError (emulated)";
    }
}
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "emulated CUDA error";
    }
}
// An emulated node has SIMT_DEVICES GPUs (default 8, as an HGX node), so that one process per GPU
// under mpirun picks its device from its node-local rank as on a real node. Every process is its own
// device: the "device" it selects only names it (its memory is the process's own).
inline int device_count() { const char* e = getenv("SIMT_DEVICES"); int n = e ? atoi(e) : 8; return n > 0 ? n : 1; }
inline thread_local int current_device = 0;
inline cudaError_t cudaGetDeviceCount(int* n) { *n = device_count(); return cudaSuccess; }
inline cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return simt::runtime().last_error = cudaErrorInvalidDevice;
    current_device = d;
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) { *d = current_device; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "SIMT emulator (CPU)");
    p->totalGlobalMem = simt::options().device_memory;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = SIMT_MAX_DYNAMIC_SMEM;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->multiProcessorCount = 132;
    p->major = simt::options().sm / 10; p->minor = simt::options().sm % 10;
    p->l2CacheSize = 50 * 1024 * 1024;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = SIMT_MAX_DYNAMIC_SMEM; break;
    case cudaDevAttrL2CacheSize: *v = 50 * 1024 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *v = simt::options().sm / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *v = simt::options().sm % 10; break;
    default: *v = 0;
    }
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total) {
    simt::Runtime& rt = simt::runtime();
    std::lock_guard<std::mutex> g(rt.mu);
    *total = simt::options().device_memory;
    *free_b = *total - rt.allocated;
    return cudaSuccess;
}
inline cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > SIMT_MAX_DYNAMIC_SMEM) return simt::runtime().last_error = cudaErrorInvalidValue;
        std::lock_guard<std::mutex> g(simt::runtime().mu);
        simt::runtime().max_dynamic_smem[func] = value;
    }
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new CUevent_st{0, nullptr, 0}; return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { *e = new CUevent_st{0, nullptr, 0}; return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    simt::worklog_record(e, s, false);
    if (!s) { e->t = simt::now(); e->s = nullptr; e->seq = 0; return cudaSuccess; }
    simt::stream_enqueue(s, [e]() { e->t = simt::now(); });
    e->s = s;
    e->seq = s->issued;   // the wait runs s up to this record
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) { simt::count_sync("event", e); if (e->s) simt::stream_run(e->s, e->seq); return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { *ms = (float)((b->t - a->t) * 1e3); return cudaSuccess; }
inline cudaError_t cudaRuntimeGetVersion(int* v) { *v = CUDART_VERSION; return cudaSuccess; }
inline cudaError_t cudaDriverGetVersion(int* v) { *v = CUDART_VERSION; return cudaSuccess; }
}

// the warp-level matrix instructions (mma.sync, ldmatrix) and cp.async: model/tensor_core.cuh's emulated half
#include "tensor_core.h"
// the warpgroup-level matrix instructions (wgmma.mma_async, fence, commit_group, wait_group): model/wgmma.cuh's emulated half
#include "wgmma.h"
// the mbarriers and the tensor memory accelerator (cp.async.bulk.tensor, cuTensorMapEncodeTiled): model/tma.cuh's emulated half
#include "tma.h"
