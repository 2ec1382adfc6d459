/*
 * comm.h — the communicator: one interface for the collectives of sharded training, with two
 * implementations behind it.
 *   MPI  (host buffers; the CPU backend, and the bootstrap of everything): ring algorithms written
 *        here on top of nonblocking point-to-point messages, so that (1) the bytes each rank sends
 *        are counted where they are handed to MPI, not estimated, (2) the summation order of a
 *        reduction is fixed and documented (parallel/README.md), and (3) every wait has a watchdog
 *        that names a lost rank instead of hanging.
 *   NCCL (device buffers, stream-ordered on the group's stream): ncclUniqueId broadcast over the group's
 *        MPI communicator, one NCCL communicator per group. Compiled by nvcc against NCCL; under the SIMT
 *        emulator against NCCL's twin (model/platform.h picks it), which runs the same calls on the CPU
 *        over MPI, so that this path is executed in CI. There the bytes sent are measured by the twin; on
 *        NCCL they are NCCL's ring volume (a formula: NCCL does not report them).
 * Collectives: all_gather, reduce_scatter (sum), all_reduce (sum), broadcast, barrier, all_to_all,
 * and comm_split for sub-groups (HSDP's shard and replica groups).
 *
 * Failure handling: a rank killed mid-step must not leave the others hanging. Every rank records the
 * pid and start time of the ranks on its node at start-up; a wait that makes no progress checks them
 * every second, and the SIGTERM that mpirun sends the survivors when a rank dies checks them too. A
 * dead rank is reported as "lost rank R" and the process exits with status 1. A wait with no progress
 * for --comm-timeout seconds (a rank on another node is gone, or hangs) exits the same way, naming
 * the rank that does not respond. On NCCL the communicators are non-blocking and the exit aborts them
 * under a deadline (comm_watchdog.h, "the abort path"): no failure can leave a rank waiting on NCCL.
 *
 * The files, one job each (include this one: it includes the others after the types they use):
 *   comm.h           the interface: CommGroup and Comm, start-up, the collectives (each dispatched to MPI
 *                    or NCCL by its group), sub-groups
 *   comm_watchdog.h  liveness of the node's ranks, the heartbeat, the hang agreement, the step watchdog
 *   comm_mpi.h       the MPI transport: the watched wait, send/receive pairs, the rings
 *   comm_nccl.h      NCCL: its checks, the type map, the byte count, the watched stream wait (comm_sync)
 */
#pragma once
#include <mpi.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "../model/common.h"
#include "../model/debug_hooks.h"   // g_debug_hooks.twin_blocks
#include "gpu_select.h"              // the rank's GPU (comm_select_gpu)
#if DBRX_HAVE_CUDA
// NCCL, or under the emulator its twin (the NCCL path below, run on the CPU over MPI): platform.h's NCCL part
#define PLATFORM_NCCL
#include "../model/platform.h"
#define COMM_HAVE_NCCL 1
#endif

typedef enum { COMM_F32, COMM_F64, COMM_BF16, COMM_I32, COMM_BYTE } CommType;
static inline size_t comm_type_size(CommType t) {
    switch (t) { case COMM_F64: return 8; case COMM_BF16: return 2; case COMM_BYTE: return 1; default: return 4; }
}
static inline const char* comm_type_name(CommType t) {
    switch (t) { case COMM_F32: return "float"; case COMM_F64: return "double"; case COMM_BF16: return "bfloat16";
                 case COMM_I32: return "int32"; default: return "byte"; }
}

// One group of ranks. The world is a group; comm_split makes sub-groups.
typedef struct {
    std::string name;            // "world", "shard", "replica": named in error messages
    int rank, size;              // this process's rank in the group, and the group's size
    std::vector<int> members;    // group rank -> world rank
    MPI_Comm mpi;
    int nccl;                    // 1: collectives run on NCCL over device buffers
#ifdef COMM_HAVE_NCCL
    ncclComm_t nc;
    cudaStream_t stream;         // the group's communication stream; NCCL collectives are ordered on it
    int owns_stream;             // 0: another group's stream, shared (comm_share_stream)
#endif
    uint64_t bytes_sent;         // payload bytes this rank has sent in this group's collectives
    uint64_t nccl_formula_bytes; // NCCL groups: the same count from NCCL's ring formulas (under the emulator
                                 // bytes_sent is the twin's measurement instead: tests compare the two)
    uint64_t calls;              // collectives issued
    std::vector<char> scratch;   // the ring's receive buffer (MPI)
    std::vector<char> staging;   // copy of an out-of-place reduce-scatter's input (MPI)
} CommGroup;

// The process: world rank/size, the rank on the node (its GPU), and the world group.
typedef struct {
    int rank, world, local_rank, local_size;
    CommGroup world_group;
} Comm;
static std::vector<int> g_comm_node_of;   // world rank -> its node (the world rank of the node's first rank): comm_init

// the communicator's parts (the top comment says what each holds), after the types they use
#include "comm_watchdog.h"
#include "comm_mpi.h"
#include "comm_nccl.h"

// ---------------------------------------------------------------------------------------------
// start-up

static inline void comm_group_init_world(CommGroup* g) {
    g->name = "world";
    g->mpi = MPI_COMM_WORLD;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g->size));
    g->members.resize(g->size);
    for (int i = 0; i < g->size; i++) g->members[i] = i;
    g->nccl = 0;
    g->bytes_sent = 0;
    g->nccl_formula_bytes = 0;
    g->calls = 0;
}

static inline Comm comm_init(int* argc, char*** argv) {
    Comm c;
    // One process started without a launcher (./train_dbrx): Open MPI forks a daemon (orted) for a singleton, in case it
    // spawns processes later, which this program never does. Isolated it does not: start-up ~0.2 s shorter and
    // ~0.15 s of CPU less (measured 2026-11-28, 2 cores). A launcher's ranks (mpirun, srun: OMPI_COMM_WORLD_SIZE or
    // PMIX_RANK set) are not singletons; a user's own setting wins; other MPIs ignore the variables.
    // Isolated singletons all take job id [0,1], so they share one session directory (<tmp>/ompi.<host>.<uid>/jf.0/1):
    // one that exits removes it while another creates it, and that one fails in MPI_Init ("mkdir ... jf.0/1: No such
    // file or directory"; 1 start in ~330 with three at a time, 2026-11-28). So each gets a top session directory of
    // its own, named by its pid, which Open MPI removes at MPI_Finalize.
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) {
        setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
        const char* tmp = getenv("TMPDIR");
        std::string top = std::string(tmp && *tmp ? tmp : "/tmp") + "/ompi.singleton." + std::to_string((long long)getuid()) +
                          "." + std::to_string((long long)getpid());
        setenv("OMPI_MCA_orte_top_session_dir", top.c_str(), 0);
    }
    MPI_CHECK(MPI_Init(argc, argv));
    // errors come back as return codes, so that every message names our file and line
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c.world));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(node, &c.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &c.local_size));
    // the watchdog's evidence: world rank, pid and start time of every rank on this node
    unsigned long long start = 0;
    comm_proc_alive((int)getpid(), 0, &start);
    long long mine[3] = {c.rank, (long long)getpid(), (long long)start};
    std::vector<long long> all((size_t)3 * c.local_size);
    MPI_CHECK(MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, node));
    // a CommLocalSlot per local rank in node-shared memory: "exiting over a failure I detected", the heartbeat
    CommLocalSlot* base = NULL;
    MPI_CHECK(MPI_Win_allocate_shared(sizeof(CommLocalSlot), sizeof(CommLocalSlot), MPI_INFO_NULL, node, &base, &g_comm_win));
    MPI_Aint wsize;
    int disp;
    MPI_CHECK(MPI_Win_shared_query(g_comm_win, 0, &wsize, &disp, &base));
    if (c.local_size <= COMM_MAX_LOCAL) g_comm_slots = base;
    g_comm_my_local = c.local_rank;
    if (g_comm_slots) { g_comm_slots[c.local_rank].exiting = 0; g_comm_slots[c.local_rank].since = now_seconds();
                        snprintf(g_comm_slots[c.local_rank].phase, sizeof g_comm_slots[0].phase, "start-up"); }
    g_comm_world_size = c.world;
    // every world rank's node (the world rank of its node's first rank): comm_split asks whether a group spans nodes
    int node_id = (int)all[0];
    g_comm_node_of.assign(c.world, 0);
    MPI_CHECK(MPI_Allgather(&node_id, 1, MPI_INT, g_comm_node_of.data(), 1, MPI_INT, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm_probe));
    MPI_CHECK(MPI_Comm_set_errhandler(g_comm_probe, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Barrier(node));
    g_comm_node = node;
    g_comm_rank = c.rank;
    g_comm_nlocal = c.local_size < COMM_MAX_LOCAL ? c.local_size : COMM_MAX_LOCAL;
    for (int i = 0; i < g_comm_nlocal; i++) {
        g_comm_local_rank[i] = (int)all[3 * i];
        g_comm_local_pid[i] = (int)all[3 * i + 1];
        g_comm_local_start[i] = (unsigned long long)all[3 * i + 2];
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = comm_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);   // mpirun forwards SIGUSR1 to the ranks (it answers SIGTERM by killing them)
    comm_group_init_world(&c.world_group);
    return c;
}

static inline void comm_set_timeout(double seconds) { g_comm_timeout = seconds; }
// --comm-timeout 0 (auto): the long one for the first step (start-up, the first collectives, NCCL set-up,
// a checkpoint load) and around checkpoint saves (a writer may be slower than the others, who wait for
// it); the steady one after: tens of seconds, so a hang is found quickly
#define COMM_TIMEOUT_LONG 600
#define COMM_TIMEOUT_STEADY 60

static inline void comm_finalize() {
    g_comm_slots = NULL;
    MPI_CHECK(MPI_Comm_free(&g_comm_probe));
    MPI_CHECK(MPI_Win_free(&g_comm_win));
    MPI_CHECK(MPI_Comm_free(&g_comm_node));
    MPI_CHECK(MPI_Finalize());
}

// Payload bytes this rank has sent in g's collectives: counted where they are handed to MPI (MPI groups),
// NCCL's ring formula (NCCL groups), or under the emulator the NCCL twin's measurement of what has run
// (read it when the group's stream has been waited for: queued operations count once they run).
static inline uint64_t comm_bytes_sent(const CommGroup* g) {
#ifdef COMM_HAVE_NCCL
    if (g->nccl) return g->bytes_sent + platform_nccl_bytes_sent(g->nc);   // (NCCL: + 0, its formula is in bytes_sent)
#endif
    return g->bytes_sent;
}

// ---------------------------------------------------------------------------------------------
// the collectives. MPI: host buffers, complete on return. NCCL: device buffers, enqueued on g->stream
// (comm_sync waits). Counts are in elements of `t`.

// recv (size * count) <- every rank's send (count), in group-rank order. host: the MPI path even for an NCCL group
// (host buffers: the embedding's token lists, parallel/zero_gpu_embedding.cuh)
static inline void comm_all_gather(CommGroup* g, const void* send, void* recv, size_t count, CommType t, bool host = false) {
    size_t es = comm_type_size(t), bytes = count * es;
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl && !host) {
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclAllGather(send, recv, count * es, ncclInt8, g->nc, g->stream));
        comm_nccl_count(g, (uint64_t)(g->size - 1) * bytes);   // ring: S-1 chunks out
        return;
    }
#else
    (void)host;
#endif
    char* own = (char*)recv + (size_t)g->rank * bytes;
    if (own != send) memmove(own, send, bytes);
    if (g->size > 1) ring_all_gather_inplace(g, recv, count * g->size, es, "all_gather");
}

// In place: buf holds size * count; afterwards chunk `rank` of buf (count) holds the sum over ranks of
// every rank's chunk `rank` (the other chunks hold partial sums). No copy; ZeRO reduces its gradient
// buffer this way.
static inline void comm_reduce_scatter_inplace(CommGroup* g, void* buf, size_t count, CommType t) {
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        char* own = (char*)buf + (size_t)g->rank * count * comm_type_size(t);
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclReduceScatter(buf, own, count, nccl_type(t), ncclSum, g->nc, g->stream));
        comm_nccl_count(g, (uint64_t)(g->size - 1) * count * comm_type_size(t));
        return;
    }
#endif
    if (g->size > 1) ring_reduce_scatter_inplace(g, buf, count * g->size, t, "reduce_scatter");
}

// recv (count) <- the sum over ranks of send's chunk `rank` (send holds size * count; left intact)
static inline void comm_reduce_scatter(CommGroup* g, const void* send, void* recv, size_t count, CommType t) {
    size_t bytes = count * comm_type_size(t);
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        g->calls++;
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, g->nc, g->stream));
        comm_nccl_count(g, (uint64_t)(g->size - 1) * bytes);
        return;
    }
#endif
    if (g->size == 1) { g->calls++; if (recv != send) memmove(recv, send, bytes); return; }
    if (g->staging.size() < bytes * g->size) g->staging.resize(bytes * g->size);
    memcpy(g->staging.data(), send, bytes * g->size);
    comm_reduce_scatter_inplace(g, g->staging.data(), count, t);
    memcpy(recv, g->staging.data() + (size_t)g->rank * bytes, bytes);
}

// buf (count) <- the sum over ranks, in place: a ring reduce-scatter then a ring all-gather, so every
// rank ends with the same bits
static inline void comm_all_reduce(CommGroup* g, void* buf, size_t count, CommType t) {
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, g->nc, g->stream));
        // reduce-scatter + all-gather: 2 (S-1) / S of the buffer. The twin's measurement equals it when S
        // divides count; otherwise its uneven chunks make a rank's differ by less than two chunks (the sum
        // over the ranks is still exact)
        comm_nccl_count(g, (uint64_t)2 * (g->size - 1) * count * comm_type_size(t) / g->size);
        return;
    }
#endif
    if (g->size == 1) return;
    ring_reduce_scatter_inplace(g, buf, count, t, "all_reduce");   // leaves chunk r complete at rank r
    ring_all_gather_inplace(g, buf, count, comm_type_size(t), "all_reduce");
}

// buf (count floats, host memory: an MPI group) <- the element-wise maximum over ranks (the FP8
// amax): an all-gather, then every rank takes the same maximum, so every rank ends with the same bits
static inline void comm_all_reduce_max_f32(CommGroup* g, float* buf, size_t count) {
    if (g->size == 1) { g->calls++; return; }
    std::vector<float> all((size_t)g->size * count);
    comm_all_gather(g, buf, all.data(), count, COMM_F32);
    for (int r = 0; r < g->size; r++)
        for (size_t i = 0; i < count; i++) buf[i] = std::fmax(buf[i], all[(size_t)r * count + i]);
}

#ifdef COMM_HAVE_NCCL
// buf (count non-negative floats as their bits, device memory: a NCCL group) <- the element-wise
// maximum over ranks, on the device: non-negative floats order as their bit patterns, so an integer
// max is the float max, exact and the same on every rank (the GPU's FP8 amaxes are kept as bits)
static inline void comm_all_reduce_max_bits_dev(CommGroup* g, unsigned int* buf, size_t count) {
    ENSURE(g->nccl, "comm_all_reduce_max_bits_dev: group %s has no NCCL communicator", g->name.c_str());
    g->calls++;
    NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclAllReduce(buf, buf, count, ncclUint32, ncclMax, g->nc, g->stream));
    comm_nccl_count(g, (uint64_t)2 * (g->size - 1) * count * 4 / g->size);
}
#endif

// buf (bytes) from group rank `root` to all: a chain root -> root+1 -> ..., pipelined in pieces
static inline void comm_broadcast(CommGroup* g, void* buf, size_t bytes, int root) {
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclBroadcast(buf, buf, bytes, ncclInt8, root, g->nc, g->stream));
        comm_nccl_count(g, ring_mod(g->rank + 1 - root, g->size) != 0 ? bytes : 0);   // all but the chain's last
        return;
    }
#endif
    int s = g->size;
    if (s == 1) return;
    int pos = ring_mod(g->rank - root, s);   // place in the chain
    int next = ring_mod(g->rank + 1, s), prev = ring_mod(g->rank - 1, s);
    const size_t piece = (size_t)4 << 20;
    for (size_t off = 0; off < bytes || off == 0; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        MPI_Request r;
        if (pos > 0) {
            MPI_CHECK(MPI_Irecv((char*)buf + off, (int)n, MPI_BYTE, prev, 8, g->mpi, &r));
            comm_wait(g, &r, 1, &prev, "broadcast");
        }
        if (pos < s - 1) {
            MPI_CHECK(MPI_Isend((char*)buf + off, (int)n, MPI_BYTE, next, 8, g->mpi, &r));
            comm_wait(g, &r, 1, &next, "broadcast");
            g->bytes_sent += n;
        }
        if (bytes == 0) break;
    }
}

// recv chunk j (count) <- rank j's send chunk `rank`; send and recv hold size * count. Pairwise
// exchange: in round k rank r sends to r+k and receives from r-k. (For expert parallelism.)
static inline void comm_all_to_all(CommGroup* g, const void* send, void* recv, size_t count, CommType t) {
    size_t bytes = count * comm_type_size(t);
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        NCCL_CHECK(ncclGroupStart());
        for (int p = 0; p < g->size; p++) {
            NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclSend((const char*)send + p * bytes, bytes, ncclInt8, p, g->nc, g->stream));
            NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclRecv((char*)recv + p * bytes, bytes, ncclInt8, p, g->nc, g->stream));
        }
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclGroupEnd());
        comm_nccl_count(g, (uint64_t)(g->size - 1) * bytes);   // the chunk to itself stays on the GPU
        return;
    }
#endif
    int s = g->size, r = g->rank;
    memmove((char*)recv + (size_t)r * bytes, (const char*)send + (size_t)r * bytes, bytes);
    for (int k = 1; k < s; k++) {
        int dst = ring_mod(r + k, s), src = ring_mod(r - k, s);
        comm_sendrecv(g, (const char*)send + (size_t)dst * bytes, bytes, dst, (char*)recv + (size_t)src * bytes, bytes,
                      src, "all_to_all");
    }
}

#ifdef COMM_HAVE_NCCL
// one hop of a ring (context parallelism's K|V blocks on the GPU): `bytes` of send to group rank dst and as many from
// src into recv, one grouped ncclSend + ncclRecv on the group's stream, not waited for (the caller records an event
// after it). NCCL groups only. Counted: bytes.
static inline void comm_send_recv(CommGroup* g, const void* send, size_t bytes, int dst, void* recv, int src) {
    ENSURE(g->nccl, "comm_send_recv: group %s has no NCCL communicator", g->name.c_str());
    g->calls++;
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclSend(send, bytes, ncclInt8, dst, g->nc, g->stream));
    NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclRecv(recv, bytes, ncclInt8, src, g->nc, g->stream));
    NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclGroupEnd());
    comm_nccl_count(g, (uint64_t)bytes);
}
#endif

// All-to-all with variable sizes (expert parallelism's token exchange): to rank p go send_bytes[p]
// bytes, the blocks one after the other in rank order in `send`; from rank q come recv_bytes[q] bytes into
// `recv`, likewise. Both sides must agree on the sizes (exchange the counts first). host: the MPI path
// even for an NCCL group (host buffers, e.g. the counts). Pairwise exchange, as comm_all_to_all.
static inline void comm_all_to_allv(CommGroup* g, const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes,
                                    bool host = false) {
    int s = g->size, r = g->rank;
    std::vector<size_t> so(s + 1, 0), ro(s + 1, 0);
    for (int p = 0; p < s; p++) { so[p + 1] = so[p] + send_bytes[p]; ro[p + 1] = ro[p] + recv_bytes[p]; }
    g->calls++;
#ifdef COMM_HAVE_NCCL
    if (g->nccl && !host) {
        uint64_t sent = 0;
        NCCL_CHECK(ncclGroupStart());
        for (int p = 0; p < s; p++) {
            if (send_bytes[p]) NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclSend((const char*)send + so[p], send_bytes[p], ncclInt8, p, g->nc, g->stream));
            if (recv_bytes[p]) NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclRecv((char*)recv + ro[p], recv_bytes[p], ncclInt8, p, g->nc, g->stream));
            if (p != r) sent += send_bytes[p];
        }
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclGroupEnd());
        comm_nccl_count(g, sent);
        return;
    }
#else
    (void)host;
#endif
    if (send_bytes[r] != recv_bytes[r])
        fail_at(__FILE__, __LINE__, "all_to_allv in group %s: rank %d sends itself %zu bytes but expects %zu", g->name.c_str(), r,
                send_bytes[r], recv_bytes[r]);
    memmove((char*)recv + ro[r], (const char*)send + so[r], send_bytes[r]);
    const size_t piece = (size_t)1 << 30;   // MPI counts are int: a block goes in pieces, as many on both sides
    for (int k = 1; k < s; k++) {
        int dst = ring_mod(r + k, s), src = ring_mod(r - k, s);
        std::vector<MPI_Request> reqs;
        std::vector<int> peers;
        for (size_t off = 0; off < recv_bytes[src]; off += piece) {
            MPI_Request q;
            MPI_CHECK(MPI_Irecv((char*)recv + ro[src] + off, (int)std::min(piece, recv_bytes[src] - off), MPI_BYTE, src, 10, g->mpi, &q));
            reqs.push_back(q);
            peers.push_back(src);
        }
        for (size_t off = 0; off < send_bytes[dst]; off += piece) {
            MPI_Request q;
            size_t n = std::min(piece, send_bytes[dst] - off);
            MPI_CHECK(MPI_Isend((const char*)send + so[dst] + off, (int)n, MPI_BYTE, dst, 10, g->mpi, &q));
            reqs.push_back(q);
            peers.push_back(dst);
            g->bytes_sent += n;
        }
        if (!reqs.empty()) comm_wait(g, reqs.data(), (int)reqs.size(), peers.data(), "all_to_allv");
    }
}

// all ranks of the group arrive (NCCL: after the group's stream has drained)
static inline void comm_barrier(CommGroup* g) {
    g->calls++;
    comm_sync(g);
    if (g->size == 1) return;
    MPI_Request r;
    MPI_CHECK(MPI_Ibarrier(g->mpi, &r));
    comm_wait(g, &r, 1, NULL, "barrier");   // (a barrier waits for every rank: none in particular)
}

// ---------------------------------------------------------------------------------------------
// sub-groups

// --nccl-ctas-internode N (0: NCCL's choice): the CTAs (channels) of every NCCL communicator whose ranks span nodes.
// Each collective's NCCL kernel holds its CTAs' SMs for as long as it runs, and at scale three run beside the compute
// (the gathers, the reduce-scatters, EP's exchange: dev/predict/README.md, "Streams share the SMs"); a node's network
// needs a few CTAs where NVLink needs many, so only the communicators across nodes are capped.
static int g_comm_ctas_internode = 0;
static inline void comm_set_ctas_internode(int n) {
    g_comm_ctas_internode = n;
    if (n > 0 && g_comm_rank == 0) printf("comm: --nccl-ctas-internode %d: the NCCL communicators across nodes on %d CTAs each\n", n, n);
}

// Splits `parent` into groups of the ranks with equal `color`, ordered by `key` (MPI_Comm_split).
// use_nccl: also create the group's NCCL communicator (rank 0 of the group makes the ncclUniqueId and
// broadcasts it over the group's MPI communicator) and its communication stream.
// max_ctas > 0: the NCCL communicator's channels capped (ncclConfig_t.minCTAs = maxCTAs = max_ctas; the twin logs it);
// 0: --nccl-ctas-internode's where the group spans nodes, else NCCL's choice
static inline CommGroup comm_split(CommGroup* parent, int color, int key, const char* name, int use_nccl, int max_ctas = 0) {
    CommGroup g;
    g.name = name;
    MPI_CHECK(MPI_Comm_split(parent->mpi, color, key, &g.mpi));
    MPI_CHECK(MPI_Comm_set_errhandler(g.mpi, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(g.mpi, &g.rank));
    MPI_CHECK(MPI_Comm_size(g.mpi, &g.size));
    int me = parent->members[parent->rank];
    g.members.resize(g.size);
    MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, g.members.data(), 1, MPI_INT, g.mpi));
    g.bytes_sent = 0;
    g.nccl_formula_bytes = 0;
    g.calls = 0;
    g.nccl = 0;
    if (use_nccl) {
#ifdef COMM_HAVE_NCCL
        ncclUniqueId id;
        if (g.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g.mpi));
        // ncclCommInitRank. The twin first connects the ranks over the group's MPI communicator (NCCL: its own
        // sockets, found from the id; the twin still checks that every rank holds the same id), then names the group
        // non-blocking (parallel/README.md, "A watchdog that cannot hang"): no NCCL call holds a host thread,
        // and ncclCommAbort from the thread that finds a failure ends whatever the others are stuck in
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        bool across = false;   // (a rank's node: MPI's, or under the emulator SIMT_GPUS_PER_NODE's: model/platform.h)
        for (int m : g.members) across = across || platform_node_of(m, g_comm_node_of[m]) != platform_node_of(me, g_comm_node_of[me]);
        if (max_ctas <= 0 && across) max_ctas = g_comm_ctas_internode;
        if (max_ctas > 0) config.minCTAs = config.maxCTAs = max_ctas;
        NCCL_CHECK_NB(g.nc, name, platform_nccl_comm_init(&g.nc, g.size, id, g.rank, &config, g.mpi, name));
        {
            std::lock_guard<std::mutex> lock(g_comm_nccl_mu);
            g_comm_nccl_comms.push_back(g.nc);
        }
        // DBRX_DEBUG_TWIN_BLOCKS=1 (a test hook): no watchdog inside the twin's waits, so that a stuck
        // collective blocks the host as a GPU's CUDA call would, and only the step watchdog can end it
        // (NCCL's waits have no such hook: there this sets nothing)
        if (!g_debug_hooks.twin_blocks) platform_nccl_set_watchdog(comm_nccl_twin_watchdog);
        CUDA_CHECK_COMM(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
        g.owns_stream = 1;
        g.nccl = 1;
#else
        (void)max_ctas;
        fail(EXIT_BAD_INPUT, "this build has no NCCL (it was built without nvcc)");
#endif
    }
    return g;
}

#ifdef COMM_HAVE_NCCL
// this rank's GPU by parallel/gpu_select.h's rule, made current; decided once per process (the training
// set-up and the NCCL world ask the same question), *how says how it was picked
static inline int comm_select_gpu(const Comm* c, std::string* how = NULL) {
    static int dev = -1;
    static std::string why;
    if (dev < 0) {
        int ndev = 0;
        CUDA_CHECK_COMM(cudaGetDeviceCount(&ndev));
        const GpuLaunchEnv env = gpu_launch_env_read();
        dev = gpu_select(ndev, c->local_rank, c->local_size, env, &why);
        if (dev < 0) fail(EXIT_BAD_INPUT, "--device cuda: %s", why.c_str());
    }
    CUDA_CHECK_COMM(cudaSetDevice(dev));
    if (how) *how = why;
    return dev;
}
#endif

// the world group on NCCL: the same ranks, with a NCCL communicator, each rank on its GPU (comm_select_gpu)
static inline CommGroup comm_world_nccl(Comm* c) {
#ifdef COMM_HAVE_NCCL
    comm_select_gpu(c);
#endif
    return comm_split(&c->world_group, 0, c->rank, "world", 1);
}

// g's collectives from now on on `other`'s stream (ordered with other's, under the same events); its own
// stream is released. Both groups' collectives must then be issued in the same order on every rank.
static inline void comm_share_stream(CommGroup* g, const CommGroup* other) {
#ifdef COMM_HAVE_NCCL
    if (!g->nccl || !other->nccl) return;
    if (g->owns_stream) CUDA_CHECK_COMM(cudaStreamDestroy(g->stream));
    g->stream = other->stream;
    g->owns_stream = 0;
#else
    (void)g; (void)other;
#endif
}

static inline void comm_group_free(CommGroup* g) {
#ifdef COMM_HAVE_NCCL
    if (g->nccl) {
        {
            std::lock_guard<std::mutex> lock(g_comm_nccl_mu);
            g_comm_nccl_comms.erase(std::remove(g_comm_nccl_comms.begin(), g_comm_nccl_comms.end(), g->nc), g_comm_nccl_comms.end());
        }
        // the orderly end of a non-blocking communicator: finalize (polled to its end), then destroy
        NCCL_CHECK_NB(g->nc, g->name.c_str(), ncclCommFinalize(g->nc));
        NCCL_CHECK(ncclCommDestroy(g->nc));
        if (g->owns_stream) CUDA_CHECK_COMM(cudaStreamDestroy(g->stream));
    }
#endif
    if (g->mpi != MPI_COMM_WORLD) MPI_CHECK(MPI_Comm_free(&g->mpi));
}
