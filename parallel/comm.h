/*
 * comm.h — the process group over MPI: start-up, rank and world size, and the collectives the
 * CPU backend needs today (all-reduce of gradients and metrics). Every MPI call is checked and a
 * failure names the file and line. Errors are returned, not fatal inside MPI, so the message is ours.
 * (ZeRO-3/HSDP add all-gather, reduce-scatter and sub-groups here; NCCL gets the same interface.)
 */
#pragma once
#include <mpi.h>
#include "../model/common.h"

#define MPI_CHECK(call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { \
    char msg_[MPI_MAX_ERROR_STRING]; int len_ = 0; MPI_Error_string(rc_, msg_, &len_); \
    fail_at(__FILE__, __LINE__, "MPI error: %s", msg_); } } while (0)

typedef struct { int rank, world, local_rank, local_size; } Comm;

static inline Comm comm_init(int* argc, char*** argv) {
    Comm c;
    MPI_CHECK(MPI_Init(argc, argv));
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c.world));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &c.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &c.local_size));
    MPI_CHECK(MPI_Comm_free(&node));
    return c;
}

static inline void comm_finalize() { MPI_CHECK(MPI_Finalize()); }

// in-place sum over all ranks
static inline void comm_allreduce_sum(float* x, size_t n) {
    const size_t chunk = (size_t)1 << 30;  // MPI counts are int
    for (size_t i = 0; i < n; i += chunk)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x + i, (int)(n - i < chunk ? n - i : chunk), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
}
// in-place maximum over all ranks (FP8 amax)
static inline void comm_allreduce_max(float* x, size_t n) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD));
}
static inline void comm_allreduce_sum(double* x, size_t n) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
}
