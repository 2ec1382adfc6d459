/*
 * platform.h — the one place that knows what the CUDA half of the product runs on. Three builds:
 *   g++ (CPU reference only)          no CUDA: DBRX_HAVE_CUDA is 0 and this header defines nothing else
 *   nvcc (sm_90a)                     the real CUDA runtime, cuBLASLt and NCCL
 *   g++ -DSIMT_EMULATION (the emulated CUDA of make test and train_dbrx_emu)
 *                                     the SIMT emulator, test/simt/simt.h, and its CPU twins of cuBLASLt's
 *                                     API (test/simt/cublaslt_api_twin.h: the product's cuBLASLt calls run
 *                                     there as on the device) and NCCL (test/simt/nccl_twin.h), with the
 *                                     same semantics
 * Every product file reaches CUDA, cuBLASLt and NCCL through this header (common.h includes it), and it
 * is the only product file that includes a header of test/simt/. The places where the two CUDA platforms
 * differ are here too, as small functions or macros named for what differs; model/CUDA.md ("Where the
 * emulator is named") lists the few product files that still name SIMT_EMULATION, and why.
 *
 * Two parts, so the header has include guards of its own instead of #pragma once:
 *   the core (always): DBRX_HAVE_CUDA; the CUDA runtime, BF16/FP8 types and cuBLASLt; LAUNCH; the
 *     emulator's hooks (race-detector barriers, step counters) and its size for the health check.
 *   the NCCL part, for the files that define PLATFORM_NCCL before including it (parallel/comm.h): NCCL,
 *     or its twin, and what differs between them. It needs MPI's headers (the twin runs over MPI), which
 *     the kernel tests are built without, so only the communicator asks for it.
 */
#ifndef DBRX_PLATFORM_H
#define DBRX_PLATFORM_H

// DBRX_HAVE_CUDA: 1 when the build has the CUDA backend (nvcc, or g++ against the emulator). The "CUDA half"
// of every op file is `#if DBRX_HAVE_CUDA`, so that the CPU-only g++ build never sees it.
#if defined(__CUDACC__) || defined(SIMT_EMULATION)
#define DBRX_HAVE_CUDA 1
#else
#define DBRX_HAVE_CUDA 0
#endif

#if defined(SIMT_EMULATION)
#include "../test/simt/simt.h"   // the CUDA runtime, the BF16/FP8 types and the kernels' built-ins, on the CPU
#include "../test/simt/cublaslt_api_twin.h"   // cuBLASLt's header and its functions, on the CPU
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cublasLt.h>
#include "cublaslt_dlopen.h"    // not linked: opened by the first cuBLASLt call (a run without a GPU never pays for it)
#include <nvtx3/nvToolsExt.h>   // header-only in CUDA 12+: NVTX ranges for nsys (model/profile.h)
#endif

#if DBRX_HAVE_CUDA

// true when the CUDA backend runs on the emulator: a value (not a rate) is all a measurement there means,
// and the sizes that are for the device's speed (the health check's GEMM) are cut down
#if defined(SIMT_EMULATION)
constexpr bool platform_emulated() { return true; }
#else
constexpr bool platform_emulated() { return false; }
#endif

// LAUNCH(kernel, grid, block, smem, stream, args...): the one way kernels are launched. The real
// build launches with <<<>>> and checks the launch; the emulated build runs the same kernel under
// the SIMT emulator (a launch-configuration error sets cudaGetLastError there too). (cudaCheck:
// model/cuda_common.h.)
// --profile-kernels (model/profile.h) sets g_launch_hook while a profiled step runs: every launch (and every GEMM,
// model/matmul_cublaslt.cuh) is then a range of its own, the hook called before (end false) and after it (end true);
// otherwise the hook is NULL and a launch pays one test for it.
typedef void (*PlatformLaunchHook)(const char* name, cudaStream_t stream, bool end);
inline PlatformLaunchHook g_launch_hook = nullptr;
#if defined(SIMT_EMULATION)
#define LAUNCH(kernel, grid, block, smem, stream, ...) do { \
    if (g_launch_hook) g_launch_hook(#kernel, stream, false); \
    simt::launch(#kernel, __FILE__, __LINE__, kernel, dim3(grid), dim3(block), smem, stream, __VA_ARGS__); \
    cudaCheck(cudaGetLastError()); \
    if (g_launch_hook) g_launch_hook(#kernel, stream, true); } while (0)
#else
#define LAUNCH(kernel, grid, block, smem, stream, ...) do { \
    if (g_launch_hook) g_launch_hook(#kernel, stream, false); \
    kernel<<<grid, block, smem, stream>>>(__VA_ARGS__); \
    cudaCheck(cudaGetLastError()); \
    if (g_launch_hook) g_launch_hook(#kernel, stream, true); } while (0)
#endif

// cuBLASLt's workspace (model/matmul_cublaslt.cuh). On a GPU device memory; the twin uses none, and its bytes are
// host memory outside the emulated device's count: the memory plan counts the workspace as a margin of its own,
// beside the allocations that the emulator's peak is checked against (parallel/memory_plan.h)
static inline cudaError_t platform_cublaslt_workspace_alloc(void** p, size_t bytes) {
#if defined(SIMT_EMULATION)
    *p = malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
#else
    return cudaMalloc(p, bytes);
#endif
}
// the library that chooses the GEMM algorithms, as the saved tables name it (model/matmul_pins.h): a table of the
// twin's fake algorithms is not offered to a GPU's cuBLASLt, nor the reverse
#if defined(SIMT_EMULATION)
static inline const char* platform_cublaslt_name() { return "cublasLt twin"; }
#else
static inline const char* platform_cublaslt_name() { return "cublasLt"; }
#endif

// A barrier the race detector's negative controls may remove at run time (test/test_race.cpp drops it by
// name to show the race it prevents is caught); a plain __syncthreads() in every other build.
#if defined(SIMT_RACE_DETECT)
#define DROPPABLE_SYNCTHREADS(name) do { if (!simt::race_drop_barrier(name)) __syncthreads(); } while (0)
#else
#define DROPPABLE_SYNCTHREADS(name) __syncthreads()
#endif

// A loop nvcc must unroll completely (its indices into register arrays then fold to constants; left
// rolled, the arrays go to the stack). g++ (the emulator) knows no `#pragma unroll`: nothing there.
#if defined(SIMT_EMULATION)
#define UNROLL
#else
#define UNROLL _Pragma("unroll")
#endif

// The step-time model's shapes-only emulation (SIMT_SHAPES_ONLY=1, test/simt/simt.h; dev/predict/README.md):
// the emulator records the step's work without doing it, so the product skips what only values need (its
// host-side initialisation) and takes a balanced routing (moe_dispatch_gpu), the router having not run.
// Always false on a GPU.
#if defined(SIMT_EMULATION)
static inline bool platform_shapes_only() { return simt::options().shapes_only; }
#else
static inline bool platform_shapes_only() { return false; }
#endif

// --profile's ranges (model/profile.h) in the emulator's work log (SIMT_WORKLOG): the step-time model puts their
// names on its predicted timeline (dev/predict). Nothing on a GPU (there, events and NVTX time them).
#if defined(SIMT_EMULATION)
static inline void platform_worklog_range(const char* name, bool begin, const void* stream, bool device) {
    simt::worklog_range(name, begin, stream, device);
}
#else
static inline void platform_worklog_range(const char*, bool, const void*, bool) {}
#endif

// NVTX ranges (--profile, model/profile.h): nsys shows them by name; nothing under the emulator
#if defined(SIMT_EMULATION)
static inline uint64_t platform_nvtx_start(const char* name) { (void)name; return 0; }
static inline void platform_nvtx_end(uint64_t id) { (void)id; }
#else
static inline uint64_t platform_nvtx_start(const char* name) { return nvtxRangeStartA(name); }
static inline void platform_nvtx_end(uint64_t id) { nvtxRangeEnd(id); }
#endif

// SIMT_STEP_COUNTERS=1 (emulator only): prints what the host asked of the device since the previous call,
// and starts counting again. The training loop calls it from dbrx_sync, before and after every step (so
// every second line is one whole step, its closing sync included): the training loop's side of the step
// budget (model/CUDA.md, "Host round trips in one step"; test/test_cuda_train.sh), and a second line, the
// emulated device memory's peak so far (the planner's allocations term, parallel/memory_plan.h). With SIMT_WORKLOG=FILE it also
// marks the same boundaries in the emulator's work log (dev/predict/predict.py takes one step between two). Nothing on a GPU.
static inline void platform_step_counters() {
#if defined(SIMT_EMULATION)
    simt::worklog_mark("dbrx_sync");   // SIMT_WORKLOG=FILE: the step boundaries in the work log (test/simt/counters.h)
    static const bool print = getenv("SIMT_STEP_COUNTERS") && atoi(getenv("SIMT_STEP_COUNTERS")) > 0;
    if (print) {
        const simt::Counters& k = simt::counters();
        fprintf(stderr, "simt counters: syncs %lld kernels %lld gemms %lld h2d %lld/%lld d2h %lld/%lld queries %lld allocs %lld frees %lld\n",
                k.syncs, k.launches, k.gemms, k.h2d_bytes, k.h2d_copies, k.d2h_bytes, k.d2h_copies, k.heuristic_queries, k.allocs, k.frees);
        simt::counters_reset();
        fprintf(stderr, "simt peak device memory: %zu bytes\n", simt::peak_device_bytes());   // (since the start: the planner's allocations)
    }
#endif
}

#endif  // DBRX_HAVE_CUDA
#endif  // DBRX_PLATFORM_H

// ---------------------------------------------------------------------------------------------
// the NCCL part (PLATFORM_NCCL defined by the includer): NCCL, or under the emulator its twin, which runs
// the same calls on the CPU over MPI; and the few things that differ between the two, as functions that
// exist on both, so that parallel/comm.h has one code path.
#if defined(PLATFORM_NCCL) && DBRX_HAVE_CUDA && !defined(DBRX_PLATFORM_NCCL_H)
#define DBRX_PLATFORM_NCCL_H
#include <mpi.h>
#include <stdint.h>
#if defined(SIMT_EMULATION)
#include "../test/simt/nccl_twin.h"
#else
#include <nccl.h>
#endif

// called about once a second while a wait of the twin makes no progress (the world rank waited for, the
// operation, the seconds waited), so that the caller can name a lost or hung rank
typedef void (*PlatformNcclWatchdog)(int peer_world_rank, const char* op, double waited_s);

#if defined(SIMT_EMULATION)

// The twin counts every byte it hands to MPI; NCCL does not say what it sent (the communicator counts
// NCCL's ring formula instead).
constexpr bool platform_nccl_counts_bytes() { return true; }
// what the communicator has sent so far (operations count once they have run)
static inline uint64_t platform_nccl_bytes_sent(ncclComm_t nc) { return nccl_twin_bytes_sent(nc); }
// ncclCommInitRankConfig. The twin connects the ranks over the group's MPI communicator (NCCL: its own
// sockets, found from the id; the twin still checks that every rank holds the same id), and takes the
// group's name for its messages. (Non-blocking: may return ncclInProgress, as NCCL's.)
static inline ncclResult_t platform_nccl_comm_init(ncclComm_t* nc, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config,
                                                   MPI_Comm mpi, const char* name) {
    nccl_twin_bootstrap(mpi);
    ncclResult_t r = ncclCommInitRankConfig(nc, nranks, id, rank, config);
    if (r == ncclSuccess || r == ncclInProgress) nccl_twin_set_name(*nc, name);
    return r;
}
// the node world rank r is on, for the NCCL choices that depend on it (--nccl-ctas-internode): under the emulator every
// rank shares one machine, so SIMT_GPUS_PER_NODE=n (when set) puts rank r on node r / n, as the step-time model counts
// nodes (dev/predict/make_predict.sh sets 8); unset: `node`, MPI's shared-memory node, as on a cluster
static inline int platform_node_of(int world_rank, int node) {
    const char* e = getenv("SIMT_GPUS_PER_NODE");
    if (!e) return node;
    char* end = NULL;
    long n = strtol(e, &end, 10);
    if (end == e || *end || n < 1 || n > 1 << 20) {
        fprintf(stderr, "error: SIMT_GPUS_PER_NODE='%s' must be a positive integer (the emulated ranks per node)\n", e);
        exit(2);
    }
    return world_rank / (int)n;
}
// the function the twin's waits call while they make no progress (NULL: none, a stuck collective blocks)
static inline void platform_nccl_set_watchdog(PlatformNcclWatchdog fn) { nccl_twin_set_watchdog(fn); }
// inside that function: the communicator that is waiting, and the name given to it
static inline ncclComm_t platform_nccl_waiting_comm() { return nccl_twin_waiting_comm(); }
static inline const char* platform_nccl_comm_name(ncclComm_t nc) { return nccl_twin_get_name(nc); }

#else

constexpr bool platform_nccl_counts_bytes() { return false; }
static inline uint64_t platform_nccl_bytes_sent(ncclComm_t nc) { (void)nc; return 0; }
static inline ncclResult_t platform_nccl_comm_init(ncclComm_t* nc, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config,
                                                   MPI_Comm mpi, const char* name) {
    (void)mpi; (void)name;
    return ncclCommInitRankConfig(nc, nranks, id, rank, config);
}
// a rank's node: MPI's shared-memory node
static inline int platform_node_of(int world_rank, int node) { (void)world_rank; return node; }
// NCCL's waits have no such hook (a stuck collective hangs on the stream: the communicator's sync and the step watchdog
// poll it instead), so the function is never called
static inline void platform_nccl_set_watchdog(PlatformNcclWatchdog fn) { (void)fn; }
static inline ncclComm_t platform_nccl_waiting_comm() { return nullptr; }
static inline const char* platform_nccl_comm_name(ncclComm_t nc) { (void)nc; return ""; }

#endif
#endif  // PLATFORM_NCCL
