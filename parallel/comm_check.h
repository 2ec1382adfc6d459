/*
 * comm_check.h — one collective, timed and checked: what dev/comm_bench measures at every size and what
 * the health check (parallel/health.h) measures once before training. nccl-tests' definitions:
 *   size S = the bytes of the whole buffer (all_reduce: the buffer; all_gather: the gathered output;
 *            reduce_scatter: the input), n = ranks, t = time of one operation (the slowest rank's mean)
 *   algbw = S / t;  busbw = algbw * 2(n-1)/n (all_reduce), algbw * (n-1)/n (all_gather, reduce_scatter,
 *   all_to_all: S = one rank's send buffer, of which (n-1)/n leaves the rank)
 * and after the timed operations one more on fresh data, every element compared with the exact result
 * (the values are small integers, so every sum is exact in float32 whatever the order).
 * Buffers are host memory for an MPI group and device memory for a NCCL group (device = 1; the NCCL
 * path exists where comm.h has it: nvcc, or the SIMT emulator's NCCL twin).
 */
#pragma once
#include <string>
#include <vector>
#include "comm.h"

// value rank r puts at element i: small integers, so that sums are exact in float
static inline float comm_check_pattern(int r, size_t i) { return (float)((r + 1) * 3 + (int)(i % 13)); }

static inline bool comm_check_op_known(const std::string& op) {
    return op == "all_reduce" || op == "all_gather" || op == "reduce_scatter" || op == "all_to_all";
}

static inline void* comm_buf_alloc(size_t bytes, int device) {
#ifdef COMM_HAVE_NCCL
    if (device) { void* p; CUDA_CHECK_COMM(cudaMalloc(&p, bytes ? bytes : 1)); return p; }
#endif
    (void)device;
    return mallocCheck(bytes ? bytes : 1);
}
static inline void comm_buf_free(void* p, int device) {
#ifdef COMM_HAVE_NCCL
    if (device) { CUDA_CHECK_COMM(cudaFree(p)); return; }
#endif
    (void)device;
    free(p);
}
static inline void comm_buf_upload(void* dst, const std::vector<float>& src, int device) {
#ifdef COMM_HAVE_NCCL
    if (device) { CUDA_CHECK_COMM(cudaMemcpy(dst, src.data(), src.size() * 4, cudaMemcpyHostToDevice)); return; }
#endif
    (void)device;
    memcpy(dst, src.data(), src.size() * 4);
}
static inline std::vector<float> comm_buf_download(const void* src, size_t n, int device) {
    std::vector<float> out(n);
#ifdef COMM_HAVE_NCCL
    if (device) { CUDA_CHECK_COMM(cudaMemcpy(out.data(), src, n * 4, cudaMemcpyDeviceToHost)); return out; }
#endif
    (void)device;
    memcpy(out.data(), src, n * 4);
    return out;
}

typedef struct {
    size_t bytes;              // S: the whole buffer (0: the size rounds to no element; nothing was run)
    size_t total;              // its float32 elements
    double seconds;            // the slowest rank's mean time of one operation
    double algbw, busbw;       // GB/s
    long long wrong_local;     // elements of this rank's result that differ from the exact one
    long long wrong;           // the same summed over the group
} CollectiveResult;

// one operation on `count` floats per rank-chunk (all_reduce: the whole buffer)
static inline void comm_check_run_op(CommGroup* g, const std::string& op, float* send, float* recv, size_t count) {
    if (op == "all_reduce") comm_all_reduce(g, recv, count, COMM_F32);
    else if (op == "all_gather") comm_all_gather(g, send, recv, count, COMM_F32);
    else if (op == "all_to_all") {   // expert parallelism's exchange (comm_all_to_allv), equal blocks here
        std::vector<size_t> b(g->size, count * sizeof(float));
        comm_all_to_allv(g, send, b.data(), recv, b.data());
    } else comm_reduce_scatter(g, send, recv, count, COMM_F32);
}

// `op` over g on a whole buffer of about `bytes` (rounded down to a multiple of n floats for the chunked
// collectives, as nccl-tests does): `warmup` untimed operations, a barrier, `iters` timed ones (to the end
// of the group's stream), one checked one. The time and the wrong counts are agreed over `host`, an MPI
// group of the same ranks (g itself may be a NCCL group, whose collectives need device buffers).
static inline CollectiveResult comm_check_collective(CommGroup* g, CommGroup* host, const std::string& op, size_t bytes, int warmup,
                                                     int iters, int device) {
    CollectiveResult res = {0, 0, 0, 0, 0, 0, 0};
    int n = g->size, r = g->rank;
    size_t total = bytes / 4;
    if (op != "all_reduce") total = total / n * n;
    if (total == 0) return res;
    size_t chunk = op == "all_reduce" ? total : total / n;   // the count argument
    size_t send_n = op == "all_gather" ? chunk : total, recv_n = op == "reduce_scatter" ? chunk : total;
    float* send = (float*)comm_buf_alloc(send_n * 4, device);
    float* recv = (float*)comm_buf_alloc(recv_n * 4, device);
    std::vector<float> init(op == "all_reduce" ? recv_n : send_n);
    for (size_t i = 0; i < init.size(); i++) init[i] = comm_check_pattern(r, i);
    float* in = op == "all_reduce" ? recv : send;   // all_reduce works in place
    comm_buf_upload(in, init, device);
    for (int i = 0; i < warmup; i++) comm_check_run_op(g, op, send, recv, chunk);
    comm_barrier(g);
    double t0 = now_seconds();
    for (int i = 0; i < iters; i++) comm_check_run_op(g, op, send, recv, chunk);
    comm_sync(g);
    double t = (now_seconds() - t0) / iters;
    // correctness: one more operation on fresh data, every element checked
    comm_buf_upload(in, init, device);
    comm_check_run_op(g, op, send, recv, chunk);
    comm_sync(g);
    std::vector<float> out = comm_buf_download(recv, recv_n, device);
    long long wrong = 0;
    for (size_t i = 0; i < recv_n; i++) {
        float want;
        if (op == "all_reduce") { want = 0; for (int q = 0; q < n; q++) want += comm_check_pattern(q, i); }
        else if (op == "all_gather") want = comm_check_pattern((int)(i / chunk), i % chunk);
        else if (op == "all_to_all") want = comm_check_pattern((int)(i / chunk), (size_t)r * chunk + i % chunk);
        else { want = 0; for (int q = 0; q < n; q++) want += comm_check_pattern(q, (size_t)r * chunk + i); }
        if (out[i] != want) wrong++;
    }
    comm_buf_free(send, device);
    comm_buf_free(recv, device);
    // the slowest rank's time and the group's wrong count, the same on every rank (an all-gather: every
    // rank then takes the same maximum and sum)
    double mine[2] = {t, (double)wrong};
    std::vector<double> all((size_t)host->size * 2);
    comm_all_gather(host, mine, all.data(), 2, COMM_F64);
    res.bytes = total * 4;
    res.total = total;
    res.wrong_local = wrong;
    for (int q = 0; q < host->size; q++) {
        if (all[2 * q] > res.seconds) res.seconds = all[2 * q];
        res.wrong += (long long)all[2 * q + 1];
    }
    res.algbw = res.seconds > 0 ? (double)res.bytes / res.seconds / 1e9 : 0.0;
    res.busbw = res.algbw * (op == "all_reduce" ? 2.0 * (n - 1) / n : (double)(n - 1) / n);
    return res;
}
