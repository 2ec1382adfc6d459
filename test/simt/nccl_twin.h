/*
 * nccl_twin.h — the emulated twin of NCCL: the subset of nccl.h that parallel/comm.h uses, with NCCL's
 * semantics, computed on the CPU and carried between processes by MPI, so that the communicator's NCCL
 * path runs under the SIMT emulator (g++ -DSIMT_EMULATION) and mpirun in CI.
 *   types      ncclResult_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId, ncclComm_t (NCCL's values)
 *   set-up     ncclGetUniqueId, ncclCommInitRank, ncclCommInitRankConfig (ncclConfig_t, NCCL_CONFIG_INITIALIZER:
 *              the blocking flag; minCTAs and maxCTAs checked, maxCTAs in the work log), ncclCommFinalize, ncclCommDestroy, ncclCommAbort, ncclCommGetAsyncError,
 *              ncclGetErrorString, ncclGetLastError, ncclCommCount, ncclCommUserRank, ncclCommCuDevice
 *   collectives ncclAllGather, ncclReduceScatter, ncclAllReduce, ncclBroadcast (ncclBcast), ncclSend,
 *              ncclRecv, ncclGroupStart, ncclGroupEnd
 *   work log   every operation's line when it is issued (SIMT_WORKLOG: kind, communicator, bytes, stream, and
 *              "ctas" where the communicator's CTAs were capped; test/simt/counters.h)
 *   twin only  nccl_twin_bootstrap, nccl_twin_set_name / nccl_twin_get_name, nccl_twin_bytes_sent,
 *              nccl_twin_set_watchdog, nccl_twin_waiting_comm, g_nccl_twin_quiet
 *   not here   ncclReduce, ncclCommSplit, FP8 data types, user reduction operators (ncclRedOpCreate*),
 *              the ncclConfig_t fields other than blocking, minCTAs and maxCTAs: comm.h uses none of them
 * Non-blocking communicators and abort, the model (NCCL user guide, "Non-blocking communicators" and
 * "Fault tolerance"; NCCL 2.14+):
 *   - ncclCommInitRankConfig with config->blocking = 0 makes a non-blocking communicator. On it, init,
 *     every operation issued outside a group, ncclGroupEnd and ncclCommFinalize may return ncclInProgress;
 *     the caller must then poll ncclCommGetAsyncError until it answers something other than ncclInProgress
 *     (ncclSuccess, or the error) before it calls anything else on the communicator. The twin does its work
 *     at the call (it has no background thread) and then always takes that path: the call returns
 *     ncclInProgress and the next ncclCommGetAsyncError answers ncclInProgress once more before the real
 *     state, so that the caller's polling runs on every call. A call made while the state is still
 *     ncclInProgress is refused (ncclInvalidUsage, naming the rule) where NCCL's behaviour is undefined.
 *     blocking = 1, or unset (NCCL_CONFIG_UNDEF_INT, as NCCL_CONFIG_INITIALIZER leaves it): blocking, as
 *     ncclCommInitRank. Argument errors come back from the call itself in both modes, as in NCCL.
 *   - ncclCommAbort may be called from any thread, also while another thread is blocked inside an
 *     operation of the communicator (NCCL: the kernels and the proxy poll an abort flag). The twin's waits
 *     poll the flag too: the blocked operation gives up (ncclRemoteError) within one poll (<= 50 us of
 *     sleep), unwinds, and the abort then frees the communicator and returns. Called by the thread that is
 *     itself inside the operation (the twin's watchdog), it marks the communicator, returns at once, and the
 *     communicator is freed when the operation unwinds. An operation that failed on an aborted
 *     communicator on a deferred stream ends quietly (the stream completes, as an aborted NCCL kernel
 *     returns): what happens next is the aborting caller's decision. ncclCommAbort touches no MPI (its
 *     peers may be gone; it may run on a thread MPI was not initialised for): the duplicated MPI
 *     communicator is left to MPI_Finalize.
 *   - ncclCommFinalize then ncclCommDestroy: the orderly end; Finalize marks the communicator (non-blocking:
 *     ncclInProgress, then polled), Destroy frees it (collective over its ranks, as MPI_Comm_free is).
 * Test hook: NCCL_TWIN_DEBUG_PLANT=abort_hangs makes ncclCommAbort block forever (an abort stuck behind a
 * wedged GPU or network proxy, NVIDIA/nccl issue 829): the caller's deadline must end the process anyway.
 * Differences from NCCL, and why:
 *   - Bootstrap: NCCL connects the ranks of a unique id over its own sockets; the twin cannot find them
 *     from the id, so the caller hands it the group's MPI communicator first (nccl_twin_bootstrap).
 *     ncclCommInitRank still checks the id: every rank must hold the same bytes (an all-gather of a hash).
 *   - Buffers are host memory (the emulator's device memory). An operation runs on its stream: on the
 *     null stream when it is issued (at ncclGroupEnd inside a group), on a stream of cudaStreamCreate*
 *     when that stream is waited for (simt.h's deferred streams), in issue order, as NCCL does.
 *   - Algorithms: rings over nonblocking MPI point-to-point messages, with a fixed summation order:
 *       reduce-scatter, chunk j (its owner is rank j), S ranks, x_i = rank i's chunk j:
 *           ((x_{j+1} + x_{j+2}) + ...) + x_j          (indices mod S)
 *       all-reduce: that reduce-scatter over ceil(n / S)-element chunks (the last ones shorter or empty),
 *           then a ring all-gather of the reduced chunks, so every rank ends with the owner's bits.
 *       broadcast: a chain root -> root+1 -> ... -> root-1, in 1 MiB pieces.
 *     BF16/FP16 are added in FP32 and rounded to the storage type at every hop (as NCCL's kernels do;
 *     FP32 has at least 2p+2 bits, so this equals one correctly rounded BF16/FP16 operation). Integers
 *     wrap. ncclAvg is NCCL's: floating types pre-multiply every input by (storage type)(1.0 / S) and
 *     sum; integers sum and divide by S at the end (truncating).
 *   - Bytes: every byte handed to MPI_Isend is counted (nccl_twin_bytes_sent). Per rank r that is
 *       all_gather (S-1)*count*es   reduce_scatter (S-1)*recvcount*es   broadcast count*es except the
 *       chain's last rank (root-1)   all_reduce (2n - len(r) - len(r+1))*es, len(i) the length of chunk i,
 *       which is 2(S-1)/S*n*es when S divides n, and sums to 2(S-1)*n*es over the ranks   send/recv to
 *       another rank: the bytes; to itself: a local copy, not counted.
 *   - Waits: loops over MPI_Testsome that yield the core; while a wait makes no progress, the watchdog
 *     (nccl_twin_set_watchdog) is called about once a second with the world rank waited for, so that the
 *     caller can name a lost or hung rank (real NCCL hangs; comm.h's comm_sync polls it instead). Every
 *     sleep of a wait checks the abort flag (above).
 * Test hook: NCCL_TWIN_DEBUG_PLANT=reduce_order runs the reduce-scatter ring backwards (the order becomes
 * ((x_{j-1} + x_{j-2}) + ...) + x_j): a planted bug that test/test_nccl_twin.cpp must catch. It shows from
 * S = 4 on: for S <= 3 the two orders differ only by commutation, which IEEE addition does not notice.
 */
#pragma once
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>
#include "simt.h"   // cudaStream_t

typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7, ncclNumResults = 8
} ncclResult_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4,
    ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9, ncclNumTypes = 10
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

// ncclConfig_t: NCCL's first fields, in NCCL's order; the twin reads `blocking`, `minCTAs` and `maxCTAs`
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_TWIN_MAX_CTAS 64   // the most CTAs a communicator's kernels may use: NCCL's MAXCHANNELS (older releases: 32)
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;                  // 0: non-blocking (ncclInProgress, see the top); 1 or unset: blocking
    int cgaClusterSize, minCTAs, maxCTAs;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 0xcafebeef, 22800u, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, \
                                 NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT}

struct ncclComm {
    MPI_Comm mpi;                  // a duplicate of the bootstrap communicator: the twin's traffic is its own
    int rank, nranks;
    std::vector<int> world_ranks;  // rank in this communicator -> rank in MPI_COMM_WORLD (for the watchdog)
    uint64_t bytes_sent;           // bytes handed to MPI_Isend
    std::atomic<ncclResult_t> async_error;   // what ncclCommGetAsyncError reports (any thread may ask)
    char name[64];                 // the caller's name for the group (nccl_twin_set_name)
    std::vector<char> scratch;     // the rings' receive buffers
    int blocking;                  // 0: a non-blocking communicator (ncclCommInitRankConfig)
    int max_ctas;                  // ncclConfig_t.maxCTAs (0: unset, NCCL's own choice): the work log's "ctas"
    std::atomic<int> pending;      // > 0: the state is ncclInProgress; polls of ncclCommGetAsyncError to the final one
    int finalized;                 // ncclCommFinalize was called
    std::atomic<int> busy;         // operations in progress (on the thread `owner`)
    pthread_t owner;
    std::atomic<int> aborted;      // ncclCommAbort was called: every wait gives up at its next poll
    std::atomic<int> abort_waits;  // an abort from another thread waits for busy == 0 and frees (not the owner)
};
typedef struct ncclComm* ncclComm_t;

// one queued operation of a group (ncclGroupStart .. ncclGroupEnd)
enum { NCCL_TWIN_ALL_GATHER, NCCL_TWIN_REDUCE_SCATTER, NCCL_TWIN_ALL_REDUCE, NCCL_TWIN_BROADCAST, NCCL_TWIN_SEND,
       NCCL_TWIN_RECV };
typedef struct {
    int kind;
    const void* sendbuff;
    void* recvbuff;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int peer;                      // broadcast: the root; send/recv: the peer
    ncclComm_t comm;
    cudaStream_t stream;           // where it runs: the emulator's deferred streams (simt.h) run it when waited for
} NcclTwinOp;

typedef void (*NcclTwinWatchdog)(int peer_world_rank, const char* op, double waited_s);

inline MPI_Comm g_nccl_twin_bootstrap = MPI_COMM_NULL;   // consumed by the next ncclCommInitRank
inline uint64_t g_nccl_twin_ids = 0;                     // unique ids made by this process
inline NcclTwinWatchdog g_nccl_twin_watchdog = NULL;
inline ncclComm_t g_nccl_twin_waiting = NULL;            // the communicator of the wait now in progress
inline int g_nccl_twin_group_depth = 0;
inline int g_nccl_twin_groups = 0;                        // outermost ncclGroupStart calls so far (the work log's group ids)
inline std::vector<NcclTwinOp> g_nccl_twin_queue;
inline char g_nccl_twin_last_error[512] = "";
inline int g_nccl_twin_quiet = 0;                        // 1: errors are kept for ncclGetLastError, not printed

#define NCCL_TWIN_TAG_RING 11
#define NCCL_TWIN_TAG_BCAST 12
#define NCCL_TWIN_TAG_P2P 13
#define NCCL_TWIN_PIECE ((size_t)1 << 30)   // MPI counts are int: larger messages go in pieces

// ---------------------------------------------------------------------------------------------
// errors: every failure is printed (one line, naming the rank and the twin's file and line; NCCL would
// need NCCL_DEBUG=WARN, but a failing CI run should say why) unless g_nccl_twin_quiet (tests of expected
// errors), kept for ncclGetLastError, and comes back as NCCL's result code

// this process's rank in MPI_COMM_WORLD, or -1 (before MPI_Init, or if MPI cannot say: this names the
// rank in error messages, so it must not fail itself)
static inline int nccl_twin_world_rank() {
    int init = 0, r = -1;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init) return -1;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &r) != MPI_SUCCESS) return -1;
    return r;
}

static inline ncclResult_t nccl_twin_error(ncclResult_t res, ncclComm_t c, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
static inline ncclResult_t nccl_twin_error(ncclResult_t res, ncclComm_t c, const char* file, int line, const char* fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(g_nccl_twin_last_error, sizeof g_nccl_twin_last_error, "%s:%d: %s", file, line, msg);
    if (g_nccl_twin_quiet) return res;
    fprintf(stderr, "nccl twin: warning: rank %d%s%s: %s (%s:%d)\n", nccl_twin_world_rank(), c && c->name[0] ? " in group " : "",
            c ? c->name : "", msg, file, line);
    fflush(stderr);
    return res;
}
#define NCCL_TWIN_FAIL(res, comm, ...) return nccl_twin_error((res), (comm), __FILE__, __LINE__, __VA_ARGS__)

// an MPI call: a failure returns ncclSystemError from the calling function, naming the call's line
#define NCCL_TWIN_MPI(comm, call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { \
    char m_[MPI_MAX_ERROR_STRING]; int l_ = 0; MPI_Error_string(rc_, m_, &l_); \
    if (comm) (comm)->async_error = ncclSystemError; \
    NCCL_TWIN_FAIL(ncclSystemError, (comm), "MPI error in %s: %s", #call, m_); } } while (0)
// the same for calls that cannot return an error (cleanup after an abort): print and go on
#define NCCL_TWIN_MPI_WARN(comm, call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { \
    char m_[MPI_MAX_ERROR_STRING]; int l_ = 0; MPI_Error_string(rc_, m_, &l_); \
    nccl_twin_error(ncclSystemError, (comm), __FILE__, __LINE__, "MPI error in %s: %s", #call, m_); } } while (0)
#define NCCL_TWIN_TRY(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) return r_; } while (0)

static inline const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (nccl twin: an MPI call failed, see the warning above)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument (nccl twin: see the warning above)";
    case ncclInvalidUsage: return "invalid usage (nccl twin: see the warning above)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

// the last error this process saw (NCCL keeps it per thread; the twin is single-threaded)
static inline const char* ncclGetLastError(ncclComm_t comm) { (void)comm; return g_nccl_twin_last_error; }

// ---------------------------------------------------------------------------------------------
// element types: storage <-> the type the reduction computes in

static inline size_t nccl_twin_type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

// BF16 and FP16 by their bits, round to nearest even, so that the twin needs no CUDA header for them
// (test/test_nccl_twin.cpp checks them against cuda_bf16.h / cuda_fp16.h)
static inline float nccl_twin_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t nccl_twin_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   // NaN stays a (quiet) NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float nccl_twin_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {   // zero or subnormal: m * 2^-24
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    uint32_t u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t nccl_twin_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);    // NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   // >= 65520 rounds to infinity
    if (a < 0x38800000u) {                                     // below 2^-14: a multiple of 2^-24 (or 2^-14 itself)
        float x;
        memcpy(&x, &a, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(x * 16777216.0f));   // exact scaling, then round to even
    }
    return (uint16_t)(sign | (uint16_t)(((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10)));
}

struct NcclTwinBf16 {
    typedef uint16_t S;
    typedef float C;
    static C load(S v) { return nccl_twin_bf16_to_f32(v); }
    static S store(C v) { return nccl_twin_f32_to_bf16(v); }
};
struct NcclTwinF16 {
    typedef uint16_t S;
    typedef float C;
    static C load(S v) { return nccl_twin_f16_to_f32(v); }
    static S store(C v) { return nccl_twin_f32_to_f16(v); }
};
template <typename T> struct NcclTwinPlain {
    typedef T S;
    typedef T C;
    static C load(S v) { return v; }
    static S store(C v) { return v; }
};

// a (op) b in the compute type: integers wrap (unsigned arithmetic), floats use fmax/fmin
template <typename C> static inline C nccl_twin_apply(C a, C b, ncclRedOp_t op) {
    if constexpr (std::is_integral<C>::value) {
        typedef typename std::make_unsigned<C>::type U;
        switch (op) {
        case ncclProd: return (C)(U)((U)a * (U)b);
        case ncclMax: return a > b ? a : b;
        case ncclMin: return a < b ? a : b;
        default: return (C)(U)((U)a + (U)b);   // sum; avg sums, then divides at the end
        }
    } else {
        switch (op) {
        case ncclProd: return a * b;
        case ncclMax: return std::fmax(a, b);
        case ncclMin: return std::fmin(a, b);
        default: return a + b;                 // sum; avg: the inputs were pre-multiplied
        }
    }
}

// NCCL's ncclAvg: floating types pre-multiply each input by (storage)(1.0 / S) (PreMulSum), integers
// divide the sum by S (SumPostDiv)
template <typename IO> static inline bool nccl_twin_premul(ncclRedOp_t op) {
    return op == ncclAvg && !std::is_integral<typename IO::C>::value;
}
template <typename IO> static inline typename IO::C nccl_twin_scalar(int nranks) {
    typedef typename IO::C C;
    if constexpr (std::is_same<C, double>::value) return 1.0 / nranks;
    else return IO::load(IO::store((C)(float)(1.0 / nranks)));
}

// out[i] = pre(x[i]): what a rank sends of its own input (the identity unless ncclAvg on floats)
template <typename IO> static inline void nccl_twin_pre_t(void* out, const void* x, size_t n, ncclRedOp_t op, int nranks) {
    typedef typename IO::S S;
    S* o = (S*)out;
    const S* a = (const S*)x;
    if (!nccl_twin_premul<IO>(op)) { if (o != a) memmove(o, a, n * sizeof(S)); return; }
    typename IO::C s = nccl_twin_scalar<IO>(nranks);
    for (size_t i = 0; i < n; i++) o[i] = IO::store(IO::load(a[i]) * s);
}
// acc[i] = acc[i] (op) pre(x[i]), rounded to the storage type: one hop of the ring
template <typename IO> static inline void nccl_twin_reduce_t(void* acc, const void* x, size_t n, ncclRedOp_t op, int nranks) {
    typedef typename IO::S S;
    typedef typename IO::C C;
    S* a = (S*)acc;
    const S* b = (const S*)x;
    bool pre = nccl_twin_premul<IO>(op);
    C s = nccl_twin_scalar<IO>(nranks);
    for (size_t i = 0; i < n; i++) {
        C own = pre ? IO::load(IO::store(IO::load(b[i]) * s)) : IO::load(b[i]);
        a[i] = IO::store(nccl_twin_apply<C>(IO::load(a[i]), own, op));
    }
}
// buf[i] = post(buf[i]): ncclAvg on integers divides by S (C's truncating division, as NCCL)
template <typename IO> static inline void nccl_twin_post_t(void* buf, size_t n, ncclRedOp_t op, int nranks) {
    typedef typename IO::S S;
    if (op != ncclAvg || !std::is_integral<typename IO::C>::value) return;
    S* a = (S*)buf;
    for (size_t i = 0; i < n; i++) a[i] = (S)(a[i] / (S)nranks);
}

#define NCCL_TWIN_DISPATCH(t, fn, ...) do { switch (t) { \
    case ncclInt8: fn<NcclTwinPlain<int8_t>>(__VA_ARGS__); break; \
    case ncclUint8: fn<NcclTwinPlain<uint8_t>>(__VA_ARGS__); break; \
    case ncclInt32: fn<NcclTwinPlain<int32_t>>(__VA_ARGS__); break; \
    case ncclUint32: fn<NcclTwinPlain<uint32_t>>(__VA_ARGS__); break; \
    case ncclInt64: fn<NcclTwinPlain<int64_t>>(__VA_ARGS__); break; \
    case ncclUint64: fn<NcclTwinPlain<uint64_t>>(__VA_ARGS__); break; \
    case ncclFloat16: fn<NcclTwinF16>(__VA_ARGS__); break; \
    case ncclBfloat16: fn<NcclTwinBf16>(__VA_ARGS__); break; \
    case ncclFloat32: fn<NcclTwinPlain<float>>(__VA_ARGS__); break; \
    case ncclFloat64: fn<NcclTwinPlain<double>>(__VA_ARGS__); break; \
    default: break; } } while (0)

// ---------------------------------------------------------------------------------------------
// transport: pieces posted nonblocking, bytes counted where they are handed to MPI, a watchdog wait

static inline double nccl_twin_now() { return MPI_Wtime(); }

static inline int nccl_twin_mod(int a, int s) { return ((a % s) + s) % s; }

// the planted bug of the negative control (NCCL_TWIN_DEBUG_PLANT=reduce_order), read once
static inline int nccl_twin_plant_reduce_order() {
    static int plant = -1;
    if (plant < 0) {
        const char* p = getenv("NCCL_TWIN_DEBUG_PLANT");
        plant = p && !strcmp(p, "reduce_order");
        if (plant && nccl_twin_world_rank() <= 0)
            fprintf(stderr, "nccl twin: NCCL_TWIN_DEBUG_PLANT=reduce_order: the reduce-scatter ring runs backwards (a planted bug)\n");
    }
    return plant;
}

typedef struct {
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;        // the peer (rank in the communicator) of each request
} NcclTwinReqs;

static inline ncclResult_t nccl_twin_isend(ncclComm_t c, NcclTwinReqs* q, const void* buf, size_t bytes, int peer, int tag) {
    for (size_t off = 0; off < bytes; off += NCCL_TWIN_PIECE) {
        size_t n = bytes - off < NCCL_TWIN_PIECE ? bytes - off : NCCL_TWIN_PIECE;
        MPI_Request r;
        NCCL_TWIN_MPI(c, MPI_Isend((const char*)buf + off, (int)n, MPI_BYTE, peer, tag, c->mpi, &r));
        c->bytes_sent += n;   // handed to MPI: counted
        q->reqs.push_back(r);
        q->peers.push_back(peer);
    }
    return ncclSuccess;
}
static inline ncclResult_t nccl_twin_irecv(ncclComm_t c, NcclTwinReqs* q, void* buf, size_t bytes, int peer, int tag) {
    for (size_t off = 0; off < bytes; off += NCCL_TWIN_PIECE) {
        size_t n = bytes - off < NCCL_TWIN_PIECE ? bytes - off : NCCL_TWIN_PIECE;
        MPI_Request r;
        NCCL_TWIN_MPI(c, MPI_Irecv((char*)buf + off, (int)n, MPI_BYTE, peer, tag, c->mpi, &r));
        q->reqs.push_back(r);
        q->peers.push_back(peer);
    }
    return ncclSuccess;
}

// the requests of an aborted communicator: cancelled and released, nothing waits for them
static inline void nccl_twin_drop(ncclComm_t c, NcclTwinReqs* q) {
    for (MPI_Request& r : q->reqs)
        if (r != MPI_REQUEST_NULL) {
            NCCL_TWIN_MPI_WARN(c, MPI_Cancel(&r));
            NCCL_TWIN_MPI_WARN(c, MPI_Request_free(&r));
        }
    q->reqs.clear();
    q->peers.clear();
}

// Waits for every request of q. Spins, then yields the core (ranks may share cores), then sleeps in
// 50 us steps; while no request completes, calls the watchdog about once a second with the world rank of
// the first request still open. MPI errors and an abort (from the watchdog) come back as ncclRemoteError.
static inline ncclResult_t nccl_twin_wait(ncclComm_t c, NcclTwinReqs* q, const char* op) {
    int n = (int)q->reqs.size(), open = n;
    std::vector<int> done(n > 0 ? n : 1);
    double stalled_since = 0, last_call = 0, last_note = 0;
    ncclComm_t outer = g_nccl_twin_waiting;
    g_nccl_twin_waiting = c;
    ncclResult_t res = ncclSuccess;
    for (long spins = 0; open > 0; spins++) {
        int got = 0;
        int rc = MPI_Testsome(n, q->reqs.data(), &got, done.data(), MPI_STATUSES_IGNORE);
        int first = 0;
        while (first < n && q->reqs[first] == MPI_REQUEST_NULL) first++;
        int peer = first < n ? c->world_ranks[q->peers[first]] : -1;
        if (rc != MPI_SUCCESS) {
            char m[MPI_MAX_ERROR_STRING];
            int l = 0;
            MPI_Error_string(rc, m, &l);
            c->async_error = ncclRemoteError;
            // the watchdog names a lost rank, if one is gone
            if (g_nccl_twin_watchdog) g_nccl_twin_watchdog(peer, op, stalled_since ? nccl_twin_now() - stalled_since : 0);
            res = nccl_twin_error(ncclRemoteError, c, __FILE__, __LINE__, "MPI error in MPI_Testsome during %s (waiting for "
                                  "world rank %d): %s", op, peer, m);
            break;
        }
        if (got == MPI_UNDEFINED) break;   // nothing left open
        open -= got;
        if (open == 0) break;
        if (got > 0) { spins = 0; stalled_since = 0; continue; }
        if (spins < 64) continue;
        if (spins < 4096) { sched_yield(); continue; }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        if (c->aborted.load()) {   // ncclCommAbort, from the watchdog below or from another thread
            c->async_error = ncclRemoteError;
            res = nccl_twin_error(ncclRemoteError, c, __FILE__, __LINE__, "%s aborted (ncclCommAbort) while waiting for world rank %d",
                                  op, peer);
            break;
        }
        double now = nccl_twin_now();
        if (stalled_since == 0) { stalled_since = now; last_call = now; }
        if (now - last_call < 1.0) continue;
        last_call = now;
        if (g_nccl_twin_watchdog) g_nccl_twin_watchdog(peer, op, now - stalled_since);
        else if (now - last_note >= 60) {   // NCCL would hang silently; say what is waited for
            last_note = now;
            fprintf(stderr, "nccl twin: rank %d: %s in group %s waiting for rank %d for %.0f s\n", nccl_twin_world_rank(), op,
                    c->name, peer, now - stalled_since);
        }
    }
    if (res != ncclSuccess) nccl_twin_drop(c, q);
    q->reqs.clear();
    q->peers.clear();
    g_nccl_twin_waiting = outer;
    return res;
}

// sends sbytes to `dst` while receiving rbytes from `src`, and waits
static inline ncclResult_t nccl_twin_exchange(ncclComm_t c, const void* sbuf, size_t sbytes, int dst, void* rbuf, size_t rbytes,
                                              int src, int tag, const char* op) {
    NcclTwinReqs q;
    NCCL_TWIN_TRY(nccl_twin_irecv(c, &q, rbuf, rbytes, src, tag));
    NCCL_TWIN_TRY(nccl_twin_isend(c, &q, sbuf, sbytes, dst, tag));
    return nccl_twin_wait(c, &q, op);
}

static inline char* nccl_twin_scratch(ncclComm_t c, size_t bytes) {
    if (c->scratch.size() < bytes) c->scratch.resize(bytes);
    return c->scratch.data();
}

// ---------------------------------------------------------------------------------------------
// the rings

// Reduce-scatter over S chunks of `in` (chunk i: off[i], len[i] elements): `out` (len[r] elements) gets
// the reduction of chunk r over the ranks, in the order ((x_{r+1} + x_{r+2}) + ...) + x_r. Step k sends
// the partial sum of chunk r-1-k to the right and receives chunk r-2-k from the left, adding this rank's
// input to it. `in` is only read; out may be in's own chunk r (it is written last).
static inline ncclResult_t nccl_twin_ring_reduce_scatter(ncclComm_t c, const char* in, char* out, const size_t* off,
                                                         const size_t* len, ncclDataType_t t, ncclRedOp_t op, const char* opname) {
    int S = c->nranks, r = c->rank, d = nccl_twin_plant_reduce_order() ? -1 : 1;
    size_t es = nccl_twin_type_size(t), maxlen = 0;
    for (int i = 0; i < S; i++) maxlen = len[i] > maxlen ? len[i] : maxlen;
    if (S == 1) {
        NCCL_TWIN_DISPATCH(t, nccl_twin_pre_t, out, in + off[0] * es, len[0], op, S);
        NCCL_TWIN_DISPATCH(t, nccl_twin_post_t, out, len[0], op, S);
        return ncclSuccess;
    }
    int right = nccl_twin_mod(r + d, S), left = nccl_twin_mod(r - d, S);
    char* buf[2];
    buf[0] = nccl_twin_scratch(c, 2 * maxlen * es + 2);
    buf[1] = buf[0] + maxlen * es;
    int last = 0;
    for (int k = 0; k < S - 1; k++) {
        int sc = nccl_twin_mod(r - d * (1 + k), S), rc = nccl_twin_mod(r - d * (2 + k), S);
        const char* send = buf[(k + 1) & 1];   // the partial sum made in step k-1
        if (k == 0) {                          // this rank's own input (pre-multiplied for ncclAvg)
            NCCL_TWIN_DISPATCH(t, nccl_twin_pre_t, buf[1], in + off[sc] * es, len[sc], op, S);
            send = buf[1];
        }
        NCCL_TWIN_TRY(nccl_twin_exchange(c, send, len[sc] * es, right, buf[k & 1], len[rc] * es, left, NCCL_TWIN_TAG_RING, opname));
        NCCL_TWIN_DISPATCH(t, nccl_twin_reduce_t, buf[k & 1], in + off[rc] * es, len[rc], op, S);
        last = k & 1;
    }
    NCCL_TWIN_DISPATCH(t, nccl_twin_post_t, buf[last], len[r], op, S);
    memcpy(out, buf[last], len[r] * es);
    return ncclSuccess;
}

// All-gather in place over S chunks of buf (chunk r is this rank's): step k sends chunk r-k to the
// right and receives chunk r-k-1 from the left.
static inline ncclResult_t nccl_twin_ring_all_gather(ncclComm_t c, char* buf, const size_t* off, const size_t* len, size_t es,
                                                     const char* opname) {
    int S = c->nranks, r = c->rank, right = nccl_twin_mod(r + 1, S), left = nccl_twin_mod(r - 1, S);
    for (int k = 0; k < S - 1; k++) {
        int sc = nccl_twin_mod(r - k, S), rc = nccl_twin_mod(r - k - 1, S);
        NCCL_TWIN_TRY(nccl_twin_exchange(c, buf + off[sc] * es, len[sc] * es, right, buf + off[rc] * es, len[rc] * es, left,
                                         NCCL_TWIN_TAG_RING, opname));
    }
    return ncclSuccess;
}

static inline bool nccl_twin_overlap(const void* a, size_t na, const void* b, size_t nb) {
    const char *x = (const char*)a, *y = (const char*)b;
    return na && nb && x < y + nb && y < x + na;
}

static inline ncclResult_t nccl_twin_run_all_gather(const NcclTwinOp* o) {
    ncclComm_t c = o->comm;
    int S = c->nranks;
    size_t es = nccl_twin_type_size(o->type), bytes = o->count * es;
    char* recv = (char*)o->recvbuff;
    if (o->sendbuff != recv + (size_t)c->rank * bytes) memcpy(recv + (size_t)c->rank * bytes, o->sendbuff, bytes);
    std::vector<size_t> off(S), len(S, o->count);
    for (int i = 0; i < S; i++) off[i] = (size_t)i * o->count;
    return nccl_twin_ring_all_gather(c, recv, off.data(), len.data(), es, "AllGather");
}

static inline ncclResult_t nccl_twin_run_reduce_scatter(const NcclTwinOp* o) {
    ncclComm_t c = o->comm;
    int S = c->nranks;
    std::vector<size_t> off(S), len(S, o->count);
    for (int i = 0; i < S; i++) off[i] = (size_t)i * o->count;
    return nccl_twin_ring_reduce_scatter(c, (const char*)o->sendbuff, (char*)o->recvbuff, off.data(), len.data(), o->type, o->op,
                                         "ReduceScatter");
}

// chunk i of an all-reduce over n elements: ceil(n / S) elements each, the last ones shorter or empty
static inline void nccl_twin_chunk(size_t n, int S, int i, size_t* off, size_t* len) {
    size_t c = (n + S - 1) / S, lo = (size_t)i * c < n ? (size_t)i * c : n, hi = lo + c < n ? lo + c : n;
    *off = lo;
    *len = hi - lo;
}

static inline ncclResult_t nccl_twin_run_all_reduce(const NcclTwinOp* o) {
    ncclComm_t c = o->comm;
    int S = c->nranks, r = c->rank;
    size_t es = nccl_twin_type_size(o->type);
    std::vector<size_t> off(S), len(S);
    for (int i = 0; i < S; i++) nccl_twin_chunk(o->count, S, i, &off[i], &len[i]);
    char* recv = (char*)o->recvbuff;
    // the reduce-scatter reads the input (in place: recvbuff itself, each chunk before it is overwritten)
    NCCL_TWIN_TRY(nccl_twin_ring_reduce_scatter(c, (const char*)o->sendbuff, recv + off[r] * es, off.data(), len.data(), o->type,
                                                o->op, "AllReduce"));
    return nccl_twin_ring_all_gather(c, recv, off.data(), len.data(), es, "AllReduce");
}

static inline ncclResult_t nccl_twin_run_broadcast(const NcclTwinOp* o) {
    ncclComm_t c = o->comm;
    int S = c->nranks, pos = nccl_twin_mod(c->rank - o->peer, S);   // place in the chain
    size_t bytes = o->count * nccl_twin_type_size(o->type);
    char* buf = (char*)o->recvbuff;
    if (pos == 0 && o->sendbuff != buf) memcpy(buf, o->sendbuff, bytes);
    int next = nccl_twin_mod(c->rank + 1, S), prev = nccl_twin_mod(c->rank - 1, S);
    const size_t piece = (size_t)1 << 20;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        NcclTwinReqs q;
        if (pos > 0) {
            NCCL_TWIN_TRY(nccl_twin_irecv(c, &q, buf + off, n, prev, NCCL_TWIN_TAG_BCAST));
            NCCL_TWIN_TRY(nccl_twin_wait(c, &q, "Broadcast"));
        }
        if (pos < S - 1) {
            NCCL_TWIN_TRY(nccl_twin_isend(c, &q, buf + off, n, next, NCCL_TWIN_TAG_BCAST));
            NCCL_TWIN_TRY(nccl_twin_wait(c, &q, "Broadcast"));
        }
    }
    return ncclSuccess;
}

// Point-to-point operations of one group: every send and receive to another rank is posted, then all
// are waited for (so that a ring of sends and receives cannot deadlock). Sends to this rank itself are
// copied to the receives from itself, in order, and not counted as sent bytes.
static inline ncclResult_t nccl_twin_run_p2p(const std::vector<NcclTwinOp>& ops) {
    std::vector<ncclComm_t> comms;
    std::vector<NcclTwinReqs> reqs;
    for (const NcclTwinOp& o : ops) {
        if (o.kind != NCCL_TWIN_SEND && o.kind != NCCL_TWIN_RECV) continue;
        size_t i = 0;
        while (i < comms.size() && comms[i] != o.comm) i++;
        if (i == comms.size()) { comms.push_back(o.comm); reqs.push_back(NcclTwinReqs()); }
        // sends to itself: matched below
        if (o.peer == o.comm->rank) continue;
        size_t bytes = o.count * nccl_twin_type_size(o.type);
        if (o.kind == NCCL_TWIN_SEND) NCCL_TWIN_TRY(nccl_twin_isend(o.comm, &reqs[i], o.sendbuff, bytes, o.peer, NCCL_TWIN_TAG_P2P));
        else NCCL_TWIN_TRY(nccl_twin_irecv(o.comm, &reqs[i], o.recvbuff, bytes, o.peer, NCCL_TWIN_TAG_P2P));
    }
    for (size_t i = 0; i < comms.size(); i++) {
        ncclComm_t c = comms[i];
        std::vector<const NcclTwinOp*> sends, recvs;
        for (const NcclTwinOp& o : ops)
            if (o.comm == c && o.peer == c->rank) (o.kind == NCCL_TWIN_SEND ? sends : recvs).push_back(&o);
        if (sends.size() != recvs.size()) {
            nccl_twin_drop(c, &reqs[i]);
            NCCL_TWIN_FAIL(ncclInvalidUsage, c, "%zu send(s) to itself and %zu receive(s) from itself in one group", sends.size(),
                           recvs.size());
        }
        for (size_t k = 0; k < sends.size(); k++) {
            size_t sb = sends[k]->count * nccl_twin_type_size(sends[k]->type), rb = recvs[k]->count * nccl_twin_type_size(recvs[k]->type);
            if (sb != rb) {
                nccl_twin_drop(c, &reqs[i]);
                NCCL_TWIN_FAIL(ncclInvalidUsage, c, "a send to itself of %zu bytes met a receive of %zu bytes", sb, rb);
            }
            if (sb) memmove(recvs[k]->recvbuff, sends[k]->sendbuff, sb);
        }
    }
    // every request is posted before any wait: MPI progresses all of them while one communicator waits
    for (size_t i = 0; i < comms.size(); i++) NCCL_TWIN_TRY(nccl_twin_wait(comms[i], &reqs[i], "Send/Recv"));
    return ncclSuccess;
}

static inline void nccl_twin_free(ncclComm_t c);

// runs the queued operations of a group: the collectives in issue order, then the point-to-point ones.
// Every rank issues the same collectives in the same order (NCCL's rule too), so this cannot deadlock.
// *aborted (if given): a communicator of the operations was aborted (read before it may be freed).
static inline ncclResult_t nccl_twin_run(const std::vector<NcclTwinOp>& ops, bool* aborted = NULL) {
    ncclResult_t res = ncclSuccess;
    std::vector<ncclComm_t> comms;   // each communicator once
    for (const NcclTwinOp& o : ops) {
        bool seen = false;
        for (ncclComm_t c : comms) seen = seen || c == o.comm;
        if (!seen) comms.push_back(o.comm);
    }
    for (ncclComm_t c : comms) { c->owner = pthread_self(); c->busy++; }
    // SIMT_SHAPES_ONLY (simt.h): only the small operations move their data (a send and its receive have the
    // same size, a collective the same count on every rank: every rank keeps the same ones)
    std::vector<NcclTwinOp> small;
    for (const NcclTwinOp& o : ops)
        if (simt::moves_data(o.count * nccl_twin_type_size(o.type))) small.push_back(o);
    for (const NcclTwinOp& o : small) {
        if (res != ncclSuccess) break;
        if (o.comm->aborted.load()) { res = ncclRemoteError; break; }
        switch (o.kind) {
        case NCCL_TWIN_ALL_GATHER: res = nccl_twin_run_all_gather(&o); break;
        case NCCL_TWIN_REDUCE_SCATTER: res = nccl_twin_run_reduce_scatter(&o); break;
        case NCCL_TWIN_ALL_REDUCE: res = nccl_twin_run_all_reduce(&o); break;
        case NCCL_TWIN_BROADCAST: res = nccl_twin_run_broadcast(&o); break;
        default: break;
        }
    }
    if (res == ncclSuccess) res = nccl_twin_run_p2p(small);
    // A communicator aborted during the operation is freed once nothing uses it: here if this thread
    // aborted it (the twin's watchdog), else by the aborting thread, which waits for busy == 0. The
    // decision is read before busy drops: after that the other thread may free c at any moment.
    for (ncclComm_t c : comms) {
        bool was_aborted = c->aborted.load(), free_here = was_aborted && !c->abort_waits.load() && c->busy.load() == 1;
        if (aborted && was_aborted) *aborted = true;
        c->busy--;
        if (free_here) nccl_twin_free(c);
    }
    return res;
}

// A non-blocking communicator whose last call returned ncclInProgress must be polled to a final state
// before the next call (NCCL's rule; its behaviour otherwise is undefined, the twin's a refusal)
static inline ncclResult_t nccl_twin_check_ready(ncclComm_t c, const char* what) {
    if (c->pending > 0)
        NCCL_TWIN_FAIL(ncclInvalidUsage, c, "%s while the communicator's state is ncclInProgress: poll ncclCommGetAsyncError until "
                       "it is no longer ncclInProgress first", what);
    return ncclSuccess;
}
// what a call that did its work returns: on a non-blocking communicator ncclInProgress, and the state
// stays ncclInProgress for one more poll (the twin always takes the slow path: see the top)
static inline ncclResult_t nccl_twin_done(ncclComm_t c, ncclResult_t r) {
    if (r != ncclSuccess || c->blocking) return r;
    c->pending = 2;   // polls to the final state: one more ncclInProgress, then the state
    return ncclInProgress;
}

// Runs operations on their stream: now on the null stream; on a deferred stream (test/simt/simt.h) when
// the stream is waited for, as NCCL runs them when the stream gets there. A deferred operation that fails
// has no caller left to tell: it records the error for ncclCommGetAsyncError (comm_sync reads it) and, as
// nothing may read a half-done buffer, ends the process with one line.
static inline ncclResult_t nccl_twin_run_on(const std::vector<NcclTwinOp>& ops, cudaStream_t stream) {
    if (!stream) return nccl_twin_run(ops);
    simt::stream_enqueue(stream, [ops]() {
        bool aborted = false;
        ncclResult_t r = nccl_twin_run(ops, &aborted);
        // ended by ncclCommAbort (possibly from another thread, during the run): the stream completes, as an
        // aborted NCCL kernel returns, and the aborting caller decides what happens next
        if (r == ncclSuccess || aborted) return;
        for (const NcclTwinOp& o : ops) o.comm->async_error = r;
        fprintf(stderr, "error: nccl twin: a stream-ordered NCCL operation failed (%s); exiting\n", ncclGetErrorString(r));
        fflush(stderr);
        _exit(1);
    });
    return ncclSuccess;
}

// the work log's line of an operation (SIMT_WORKLOG: test/simt/counters.h), when it is issued
static inline void nccl_twin_worklog(const NcclTwinOp& o) {
    if (!simt::worklog_file()) return;
    static const char* const kinds[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "send", "recv"};
    size_t es = nccl_twin_type_size(o.type), n = (size_t)o.comm->nranks;
    size_t bytes = o.count * es * (o.kind == NCCL_TWIN_ALL_GATHER || o.kind == NCCL_TWIN_REDUCE_SCATTER ? n : 1);
    std::string wr;
    for (int r : o.comm->world_ranks) wr += (wr.empty() ? "" : ",") + std::to_string(r);
    std::lock_guard<std::mutex> lock(simt::worklog().mu);
    simt::worklog_line(simt::worklog_fmt("\"t\":\"coll\",\"kind\":\"%s\",\"comm\":\"%s\",\"nranks\":%d,\"count\":%zu,\"elem_bytes\":%zu,"
                                         "\"bytes\":%zu,\"rank\":%d,\"peer\":%d,\"group\":%d,\"stream\":%d,\"world_ranks\":[", kinds[o.kind],
                                         o.comm->name, o.comm->nranks, o.count, es, bytes, o.comm->rank, o.peer, g_nccl_twin_group_depth > 0 ? g_nccl_twin_groups : 0,
                                         simt::worklog_stream(o.stream)) + wr + "]" +
                        (o.comm->max_ctas > 0 ? ",\"ctas\":" + std::to_string(o.comm->max_ctas) : std::string()));
}

// issues one operation: queued inside a group, else run on its stream
static inline ncclResult_t nccl_twin_issue(const NcclTwinOp& o) {
    nccl_twin_worklog(o);
    if (g_nccl_twin_group_depth > 0) { g_nccl_twin_queue.push_back(o); return ncclSuccess; }
    bool nonblocking = !o.comm->blocking;
    ncclResult_t r = nccl_twin_run_on(std::vector<NcclTwinOp>(1, o), o.stream);
    // (o.comm may be an aborted one now: it is kept, see nccl_twin_free)
    return nonblocking ? nccl_twin_done(o.comm, r) : r;
}

// the checks NCCL makes when an operation is issued
static inline ncclResult_t nccl_twin_check(ncclComm_t c, ncclDataType_t t, ncclRedOp_t op, const char* what) {
    if (!c) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "%s: comm is NULL", what);
    if (c->aborted.load()) NCCL_TWIN_FAIL(ncclInvalidUsage, c, "%s on an aborted communicator", what);
    NCCL_TWIN_TRY(nccl_twin_check_ready(c, what));
    if (nccl_twin_type_size(t) == 0) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "%s: invalid data type %d", what, (int)t);
    if ((int)op < 0 || op >= ncclNumOps) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "%s: invalid reduction operation %d", what, (int)op);
    return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// the public API

// the communicator the next ncclCommInitRank of this process duplicates (the group's MPI communicator)
static inline void nccl_twin_bootstrap(MPI_Comm mpi) { g_nccl_twin_bootstrap = mpi; }

// the name the watchdog's messages give the group ("world", "shard", ...)
static inline void nccl_twin_set_name(ncclComm_t c, const char* name) {
    if (c) snprintf(c->name, sizeof c->name, "%s", name ? name : "");
}
static inline const char* nccl_twin_get_name(ncclComm_t c) { return c ? c->name : ""; }

// bytes this rank has handed to MPI_Isend in this communicator's operations
static inline uint64_t nccl_twin_bytes_sent(ncclComm_t c) { return c ? c->bytes_sent : 0; }

// fn(peer_world_rank, op, waited_s) is called about once a second while a wait makes no progress (and
// once when MPI reports an error). It may exit; if it calls ncclCommAbort and returns, the operation
// returns ncclRemoteError. NULL: wait forever, as NCCL does (a note every minute).
static inline void nccl_twin_set_watchdog(NcclTwinWatchdog fn) { g_nccl_twin_watchdog = fn; }

// the communicator whose wait called the watchdog (NULL outside a wait)
static inline ncclComm_t nccl_twin_waiting_comm() { return g_nccl_twin_waiting; }

static inline uint64_t nccl_twin_hash(const void* p, size_t n) {   // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
    return h;
}

// "NCCLTWIN", the world rank and pid of the rank that made it, and a counter: checkable, and different
// for every call
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclGetUniqueId: id is NULL");
    int init = 0;
    ncclComm_t none = NULL;
    NCCL_TWIN_MPI(none, MPI_Initialized(&init));
    if (!init) NCCL_TWIN_FAIL(ncclInvalidUsage, NULL, "ncclGetUniqueId: the twin needs MPI (MPI_Init first)");
    memset(id, 0, sizeof *id);
    int64_t fields[3] = {nccl_twin_world_rank(), (int64_t)getpid(), (int64_t)++g_nccl_twin_ids};
    memcpy(id->internal, "NCCLTWIN", 8);
    memcpy(id->internal + 8, fields, sizeof fields);
    return ncclSuccess;
}

// Duplicates the communicator set by nccl_twin_bootstrap (collective over it). Every rank then checks,
// from an all-gather: the same id everywhere, nranks equal to its size, rank equal to the MPI rank; all
// ranks return the same verdict (ncclInvalidArgument if any check failed anywhere).
// config (ncclCommInitRankConfig; NULL: defaults): blocking = 0 makes it non-blocking (see the top).
static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
    if (!comm) NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRank: comm is NULL");
    if (config && (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)))
        NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRankConfig: config was not made by NCCL_CONFIG_INITIALIZER");
    if (config && config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
        NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRankConfig: blocking %d (0 or 1)", config->blocking);
    // the CTA bounds: each unset or in [1, NCCL_TWIN_MAX_CTAS] (MAXCHANNELS), min <= max (NCCL refuses the rest)
    for (int v : {config ? config->minCTAs : NCCL_CONFIG_UNDEF_INT, config ? config->maxCTAs : NCCL_CONFIG_UNDEF_INT})
        if (v != NCCL_CONFIG_UNDEF_INT && (v < 1 || v > NCCL_TWIN_MAX_CTAS))
            NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRankConfig: minCTAs/maxCTAs %d (1..%d)", v, NCCL_TWIN_MAX_CTAS);
    if (config && config->minCTAs != NCCL_CONFIG_UNDEF_INT && config->maxCTAs != NCCL_CONFIG_UNDEF_INT && config->minCTAs > config->maxCTAs)
        NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRankConfig: minCTAs %d > maxCTAs %d", config->minCTAs, config->maxCTAs);
    *comm = NULL;
    if (g_nccl_twin_bootstrap == MPI_COMM_NULL)
        NCCL_TWIN_FAIL(ncclInvalidUsage, NULL, "ncclCommInitRank without nccl_twin_bootstrap: the twin connects the ranks over "
                       "an MPI communicator it is given first");
    MPI_Comm boot = g_nccl_twin_bootstrap;
    g_nccl_twin_bootstrap = MPI_COMM_NULL;
    ncclComm_t c = new ncclComm();
    c->bytes_sent = 0;
    c->async_error = ncclSuccess;
    c->name[0] = 0;
    c->busy = 0;
    c->aborted = 0;
    c->abort_waits = 0;
    c->blocking = !(config && config->blocking == 0);
    c->max_ctas = config && config->maxCTAs != NCCL_CONFIG_UNDEF_INT ? config->maxCTAs : 0;
    c->pending = 0;
    c->finalized = 0;
    NCCL_TWIN_MPI(c, MPI_Comm_dup(boot, &c->mpi));
    NCCL_TWIN_MPI(c, MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN));   // errors come back to the twin
    NCCL_TWIN_MPI(c, MPI_Comm_rank(c->mpi, &c->rank));
    NCCL_TWIN_MPI(c, MPI_Comm_size(c->mpi, &c->nranks));
    int64_t mine[5] = {(int64_t)nccl_twin_hash(id.internal, sizeof id.internal), nranks, rank, nccl_twin_world_rank(),
                       !memcmp(id.internal, "NCCLTWIN", 8)};
    std::vector<int64_t> all((size_t)5 * c->nranks);
    NCCL_TWIN_MPI(c, MPI_Allgather(mine, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, c->mpi));
    c->world_ranks.resize(c->nranks);
    int bad_id = 0, bad_shape = 0;
    for (int i = 0; i < c->nranks; i++) {
        const int64_t* a = &all[(size_t)5 * i];
        c->world_ranks[i] = (int)a[3];
        if (a[0] != all[0] || !a[4]) bad_id = 1;
        if (a[1] != c->nranks || a[2] != i) bad_shape = 1;
    }
    if (bad_id || bad_shape) {
        int me = c->rank, size = c->nranks;
        NCCL_TWIN_MPI(c, MPI_Comm_free(&c->mpi));
        delete c;
        if (bad_id)
            NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRank: the ranks hold different unique ids (or one that no "
                           "ncclGetUniqueId made): the id must be broadcast from one rank to all");
        NCCL_TWIN_FAIL(ncclInvalidArgument, NULL, "ncclCommInitRank(nranks %d, rank %d) does not match the bootstrap communicator "
                       "(rank %d of %d) on some rank", nranks, rank, me, size);
    }
    *comm = c;
    return nccl_twin_done(c, ncclSuccess);
}
static inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

// An aborted communicator is kept, its buffers released: operations still queued on a deferred stream
// find it aborted and end quietly, as the kernels NCCL launched before an abort do (a few hundred bytes
// per abort; a process aborts its communicators when it is about to end)
static inline void nccl_twin_free(ncclComm_t c) {
    if (g_nccl_twin_waiting == c) g_nccl_twin_waiting = NULL;
    if (c->aborted.load()) { std::vector<char>().swap(c->scratch); return; }
    delete c;
}

// The orderly end, step one: every operation issued has completed (the twin runs them by the time their
// stream is waited for, and a communicator's ranks finalize after waiting), so this marks it. Non-blocking:
// ncclInProgress, then polled.
static inline ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (!c) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "ncclCommFinalize: comm is NULL");
    if (c->aborted.load()) NCCL_TWIN_FAIL(ncclInvalidUsage, c, "ncclCommFinalize on an aborted communicator");
    NCCL_TWIN_TRY(nccl_twin_check_ready(c, "ncclCommFinalize"));
    if (c->busy.load()) NCCL_TWIN_FAIL(ncclInvalidUsage, c, "ncclCommFinalize during an operation of the communicator");
    c->finalized = 1;
    return nccl_twin_done(c, ncclSuccess);
}

// releases the communicator (collective over its ranks, as MPI_Comm_free is)
static inline ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (c->aborted.load()) NCCL_TWIN_FAIL(ncclInvalidUsage, c, "ncclCommDestroy on an aborted communicator (ncclCommAbort frees it)");
    NCCL_TWIN_TRY(nccl_twin_check_ready(c, "ncclCommDestroy"));
    if (c->busy.load()) NCCL_TWIN_FAIL(ncclInvalidUsage, c, "ncclCommDestroy during an operation of the communicator");
    NCCL_TWIN_MPI(c, MPI_Comm_free(&c->mpi));
    nccl_twin_free(c);
    return ncclSuccess;
}

// the planted hang of the deadline's test (NCCL_TWIN_DEBUG_PLANT=abort_hangs), read once
static inline int nccl_twin_plant_abort_hangs() {
    static int plant = -1;
    if (plant < 0) {
        const char* p = getenv("NCCL_TWIN_DEBUG_PLANT");
        plant = p && !strcmp(p, "abort_hangs");
    }
    return plant;
}

// Ends the communicator without talking to anyone (its peers may be gone), from any thread (see the top):
// a wait of another thread inside one of its operations gives up at its next poll; this returns once that
// operation has unwound. From the thread inside the operation (the twin's watchdog): marks it and returns;
// the operation fails with ncclRemoteError and the communicator is released when it unwinds.
static inline ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (nccl_twin_plant_abort_hangs()) {
        const char* m = "nccl twin: NCCL_TWIN_DEBUG_PLANT=abort_hangs: ncclCommAbort blocks forever (a planted hang)\n";
        ssize_t ignored = write(2, m, strlen(m));
        (void)ignored;
        for (;;) pause();
    }
    if (c->aborted.load()) return ncclSuccess;   // (aborted before: already released)
    bool other_thread = c->busy.load() > 0 && !pthread_equal(c->owner, pthread_self());
    if (other_thread) c->abort_waits = 1;        // before aborted: the owner must not release it too
    c->aborted = 1;
    if (other_thread) {
        while (c->busy.load() > 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        nccl_twin_free(c);
    } else if (c->busy.load() == 0) {
        nccl_twin_free(c);
    }
    return ncclSuccess;
}

// The state: ncclInProgress while a non-blocking call has not finished (see the top), else the first
// asynchronous error or ncclSuccess.
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* err) {
    if (!c || !err) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "ncclCommGetAsyncError: NULL argument");
    int p = c->pending.load();   // one step per poll, whichever thread polls (NCCL: its background progress)
    while (p > 0 && !c->pending.compare_exchange_weak(p, p - 1)) {}
    if (p > 1) { *err = ncclInProgress; return ncclSuccess; }
    *err = c->async_error.load();
    return ncclSuccess;
}
static inline ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
    if (!c || !count) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "ncclCommCount: NULL argument");
    *count = c->nranks;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
    if (!c || !rank) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "ncclCommUserRank: NULL argument");
    *rank = c->rank;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* device) {
    if (!c || !device) NCCL_TWIN_FAIL(ncclInvalidArgument, c, "ncclCommCuDevice: NULL argument");
    *device = 0;   // the emulator has one device
    return ncclSuccess;
}

// recvbuff (nranks * sendcount) <- every rank's sendbuff, in rank order. In place: sendbuff ==
// recvbuff + rank * sendcount.
static inline ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream) {
    NCCL_TWIN_TRY(nccl_twin_check(comm, datatype, ncclSum, "ncclAllGather"));
    size_t bytes = sendcount * nccl_twin_type_size(datatype);
    char* own = (char*)recvbuff + (size_t)comm->rank * bytes;
    if (sendbuff != own && nccl_twin_overlap(sendbuff, bytes, recvbuff, bytes * comm->nranks))
        NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclAllGather: sendbuff overlaps recvbuff but is not its chunk %d (in place)",
                       comm->rank);
    NcclTwinOp o = {NCCL_TWIN_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream};
    return nccl_twin_issue(o);
}

// recvbuff (recvcount) <- the reduction over ranks of sendbuff's chunk `rank` (sendbuff: nranks *
// recvcount). In place: recvbuff == sendbuff + rank * recvcount.
static inline ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    NCCL_TWIN_TRY(nccl_twin_check(comm, datatype, op, "ncclReduceScatter"));
    size_t bytes = recvcount * nccl_twin_type_size(datatype);
    if (recvbuff != (const char*)sendbuff + (size_t)comm->rank * bytes &&
        nccl_twin_overlap(sendbuff, bytes * comm->nranks, recvbuff, bytes))
        NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclReduceScatter: recvbuff overlaps sendbuff but is not its chunk %d (in place)",
                       comm->rank);
    NcclTwinOp o = {NCCL_TWIN_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream};
    return nccl_twin_issue(o);
}

// recvbuff (count) <- the reduction over ranks of sendbuff (count); in place when they are equal
static inline ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    NCCL_TWIN_TRY(nccl_twin_check(comm, datatype, op, "ncclAllReduce"));
    size_t bytes = count * nccl_twin_type_size(datatype);
    if (sendbuff != recvbuff && nccl_twin_overlap(sendbuff, bytes, recvbuff, bytes))
        NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclAllReduce: sendbuff and recvbuff overlap without being equal");
    NcclTwinOp o = {NCCL_TWIN_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream};
    return nccl_twin_issue(o);
}

// recvbuff (count) on every rank <- sendbuff of `root` (read on the root only); in place when equal
static inline ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
    NCCL_TWIN_TRY(nccl_twin_check(comm, datatype, ncclSum, "ncclBroadcast"));
    if (root < 0 || root >= comm->nranks)
        NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclBroadcast: root %d of %d ranks", root, comm->nranks);
    size_t bytes = count * nccl_twin_type_size(datatype);
    if (comm->rank == root && sendbuff != recvbuff && nccl_twin_overlap(sendbuff, bytes, recvbuff, bytes))
        NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclBroadcast: sendbuff and recvbuff overlap without being equal");
    NcclTwinOp o = {NCCL_TWIN_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream};
    return nccl_twin_issue(o);
}
static inline ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

// point-to-point: matched in order per peer; inside a group they run together at ncclGroupEnd
static inline ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream) {
    NCCL_TWIN_TRY(nccl_twin_check(comm, datatype, ncclSum, "ncclSend"));
    if (peer < 0 || peer >= comm->nranks) NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclSend: peer %d of %d ranks", peer, comm->nranks);
    NcclTwinOp o = {NCCL_TWIN_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream};
    return nccl_twin_issue(o);
}
static inline ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream) {
    NCCL_TWIN_TRY(nccl_twin_check(comm, datatype, ncclSum, "ncclRecv"));
    if (peer < 0 || peer >= comm->nranks) NCCL_TWIN_FAIL(ncclInvalidArgument, comm, "ncclRecv: peer %d of %d ranks", peer, comm->nranks);
    NcclTwinOp o = {NCCL_TWIN_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream};
    return nccl_twin_issue(o);
}

static inline ncclResult_t ncclGroupStart() {
    if (g_nccl_twin_group_depth++ == 0) g_nccl_twin_groups++;
    return ncclSuccess;
}
// the outermost ncclGroupEnd runs what the group queued
static inline ncclResult_t ncclGroupEnd() {
    if (g_nccl_twin_group_depth == 0) NCCL_TWIN_FAIL(ncclInvalidUsage, NULL, "ncclGroupEnd without ncclGroupStart");
    if (--g_nccl_twin_group_depth > 0) return ncclSuccess;
    std::vector<NcclTwinOp> ops;
    ops.swap(g_nccl_twin_queue);
    // the group runs as one, on its operations' stream (a group that mixes streams runs on the first)
    cudaStream_t stream = nullptr;
    for (const NcclTwinOp& o : ops) if (o.stream) { stream = o.stream; break; }
    for (const NcclTwinOp& o : ops) NCCL_TWIN_TRY(nccl_twin_check_ready(o.comm, "ncclGroupEnd"));
    ncclResult_t r = nccl_twin_run_on(ops, stream);
    // non-blocking communicators in the group: each is in progress, and the group returns ncclInProgress
    bool in_progress = false;
    for (const NcclTwinOp& o : ops)
        if (!o.comm->blocking && !o.comm->aborted.load() && r == ncclSuccess)
            in_progress = nccl_twin_done(o.comm, r) == ncclInProgress || in_progress;
    return in_progress ? ncclInProgress : r;
}
