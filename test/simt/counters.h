/*
 * counters.h — what the emulated runtime saw the host ask of the "device": the numbers a step's
 * budget is written in (model/CUDA.md, "Host round trips"). Counted where the host issues the call,
 * not where a deferred stream runs it:
 *   launches        kernels through LAUNCH (simt::launch)
 *   gemms           cuBLASLt matmuls (the twin, test/simt/cublaslt_twin.h): a GPU launches >= 1 kernel each
 *   syncs           calls that make the host wait for the device: cudaStreamSynchronize,
 *                   cudaDeviceSynchronize, cudaEventSynchronize, and every blocking cudaMemcpy (it
 *                   waits for the work issued before it, as on a GPU)
 *   h2d/d2h         bytes and copies, blocking or not (cudaMemcpy and cudaMemcpyAsync by their kind)
 *   heuristic_queries, plan_creations   the cuBLASLt plan cache (model/matmul.cuh): heuristic calls
 *                   and descriptor sets made (steady-state steps make none)
 * simt::counters() reads them, simt::counters_reset() zeroes them. Host-side only, one process;
 * relaxed atomic additions (a helper thread, such as the communication watchdog, may copy too).
 */
#pragma once

namespace simt {
struct Counters {
    long long launches, gemms, syncs;
    long long h2d_bytes, d2h_bytes, h2d_copies, d2h_copies;
    long long heuristic_queries, plan_creations;
};
inline Counters& counters() { static Counters c = {}; return c; }
inline void counters_reset() { counters() = Counters{}; }
inline void count(long long* field, long long v = 1) { __atomic_add_fetch(field, v, __ATOMIC_RELAXED); }
inline void count_launch() { count(&counters().launches); }
inline void count_sync() { count(&counters().syncs); }
// a copy of `n` bytes of kind `kind` (cudaMemcpyKind: 1 host to device, 2 device to host); `blocking`: cudaMemcpy
inline void count_copy(int kind, size_t n, bool blocking) {
    Counters& c = counters();
    if (kind == 1) { count(&c.h2d_bytes, (long long)n); count(&c.h2d_copies); }
    if (kind == 2) { count(&c.d2h_bytes, (long long)n); count(&c.d2h_copies); }
    if (blocking) count_sync();
}
}  // namespace simt
