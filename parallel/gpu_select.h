/*
 * gpu_select.h — which GPU a rank uses: one rule for the training set-up (train_cuda.cuh) and the NCCL
 * world (comm.h's comm_world_nccl, which the health check's collectives run on), so that the two never
 * disagree. Pure logic over (GPUs this process sees, its node-local rank and size from MPI, the
 * launcher's environment), so that every launch is tested on the CPU (test/test_gpu_select.cpp).
 *
 * The rule (README.md, "On a Slurm cluster"), one process per GPU:
 *   - every GPU of the node visible (mpirun; srun --gpus-per-node=8 without per-task binding):
 *     GPU = the node-local rank; more ranks than visible GPUs is refused;
 *   - exactly one GPU visible and CUDA_VISIBLE_DEVICES set (srun --gpus-per-task=1 / --gpu-bind, or a
 *     wrapper that sets it per rank): GPU 0, the rank's own. If every rank was given the same one, they
 *     share it: setting CUDA_VISIBLE_DEVICES is how a deliberate share is asked for;
 *   - one GPU visible to several ranks with CUDA_VISIBLE_DEVICES unset: the node has one GPU and nothing
 *     bound it, so the ranks would share it by accident: refused; 1 < GPUs < ranks: refused.
 * The node-local rank is MPI's (MPI_Comm_split_type, comm.h). The launcher's own idea of it is the
 * cross-check: OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE under mpirun, else SLURM_LOCALID /
 * SLURM_STEP_TASKS_PER_NODE under srun (not SLURM_NTASKS_PER_NODE: the batch script inherits it too,
 * where a single process runs). When MPI joined fewer tasks than the launcher started on the node, srun
 * started them but MPI did not join them (an OpenMPI without PMIx/Slurm support makes every task a world
 * of its own): refused, naming it. Launcher values that cannot be read are not checked (and said so).
 * The environment is read once, at start-up (gpu_launch_env_read, a check_layout.py reader).
 */
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

typedef struct {
    const char* cuda_visible_devices;     // NULL: unset
    const char* ompi_local_rank, *ompi_local_size;
    const char* slurm_localid, *slurm_step_tasks_per_node, *slurm_nodeid;
} GpuLaunchEnv;

static inline GpuLaunchEnv gpu_launch_env_read() {
    GpuLaunchEnv e;
    e.cuda_visible_devices = getenv("CUDA_VISIBLE_DEVICES");
    e.ompi_local_rank = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    e.ompi_local_size = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    e.slurm_localid = getenv("SLURM_LOCALID");
    e.slurm_step_tasks_per_node = getenv("SLURM_STEP_TASKS_PER_NODE");
    e.slurm_nodeid = getenv("SLURM_NODEID");
    return e;
}

// a non-negative decimal integer, all of s; -1 otherwise
static inline int gpu_env_int(const char* s) {
    if (!s || !*s) return -1;
    long v = 0;
    for (const char* p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > 1000000) return -1;
        v = v * 10 + (*p - '0');
    }
    return (int)v;
}

// the tasks on node `node` from Slurm's compressed list "8(x2),7" (= 8,8,7); -1 if it cannot tell
static inline int gpu_slurm_tasks_on_node(const char* list, int node) {
    if (!list || node < 0) return -1;
    int i = 0;
    for (const char* p = list; *p;) {
        char* end;
        long n = strtol(p, &end, 10), rep = 1;
        if (end == p || n < 0) return -1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return -1;
            rep = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || rep < 1) return -1;
            p = end + 1;
        }
        if (node < i + rep) return (int)n;
        i += (int)rep;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return -1;
}

// The GPU of this rank: 0 <= device < ndev, and *how says why; or -1 and *how holds the one-line error.
// ndev: cudaGetDeviceCount; local_rank, local_size: MPI's node-local rank and size.
static inline int gpu_select(int ndev, int local_rank, int local_size, const GpuLaunchEnv& env, std::string* how) {
    char buf[512];
    const char* cvd = env.cuda_visible_devices;
    // the launcher's local rank and size (a cross-check of MPI's): mpirun's first, srun's otherwise
    int l_rank = -1, l_size = -1;
    const char* launcher = NULL;
    if (env.ompi_local_rank || env.ompi_local_size) {
        launcher = "mpirun (OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE)";
        l_rank = gpu_env_int(env.ompi_local_rank), l_size = gpu_env_int(env.ompi_local_size);
    } else if (env.slurm_localid && env.slurm_step_tasks_per_node) {
        launcher = "srun (SLURM_LOCALID / SLURM_STEP_TASKS_PER_NODE)";
        l_rank = gpu_env_int(env.slurm_localid);
        int node = env.slurm_nodeid ? gpu_env_int(env.slurm_nodeid) : 0;
        l_size = gpu_slurm_tasks_on_node(env.slurm_step_tasks_per_node, node);
    }
    std::string note;
    if (launcher && (l_rank < 0 || l_size < 1 || l_rank >= l_size)) {   // a cross-check only: not a reason to refuse
        note = std::string("; ") + launcher + "'s values unreadable, not checked";
        launcher = NULL;
    }
    // MPI joined fewer tasks than the launcher started on this node: the tasks are not one MPI job. (More is
    // fine: a launcher inside a launcher, e.g. MPICH's mpirun starting one proxy per node with srun, whose
    // ranks inherit the proxy's SLURM_LOCALID 0 of 1.)
    if (launcher && (l_size > local_size || (l_size == local_size && l_rank != local_rank))) {
        snprintf(buf, sizeof buf, "the launcher, %s, started %d task(s) on this node (this is task %d) but MPI joined %d "
                 "(this is rank %d there): the tasks are not one MPI job. Under srun, OpenMPI needs PMIx/Slurm support "
                 "(srun --mpi=pmix; see srun --mpi=list and ompi_info | grep -i pmix), or launch with mpirun",
                 launcher, l_size, l_rank, local_size, local_rank);
        *how = buf;
        return -1;
    }
    if (launcher && l_size < local_size) launcher = NULL;   // (that case: MPI's numbers, the launcher's say nothing)
    const char* from = launcher ? launcher : "MPI_Comm_split_type";
    if (ndev <= 0) {
        snprintf(buf, sizeof buf, "no GPU visible to this rank (CUDA_VISIBLE_DEVICES=%s)", cvd ? cvd : "unset");
        *how = buf;
        return -1;
    }
    if (ndev >= local_size) {   // the node's GPUs (or at least one per rank) visible to every rank
        snprintf(buf, sizeof buf, "cuda:%d = node-local rank %d of %d (from %s), %d GPU(s) visible%s", local_rank, local_rank,
                 local_size, from, ndev, note.c_str());
        *how = buf;
        return local_rank;
    }
    if (ndev == 1 && cvd) {   // one GPU per rank, bound by the launcher or by hand (the same one: deliberately shared)
        snprintf(buf, sizeof buf, "cuda:0, the one GPU this rank sees (CUDA_VISIBLE_DEVICES=%s; node-local rank %d of %d, from %s%s)",
                 cvd, local_rank, local_size, from, note.c_str());
        *how = buf;
        return 0;
    }
    if (ndev == 1)
        snprintf(buf, sizeof buf, "%d ranks on this node see the same single GPU (CUDA_VISIBLE_DEVICES unset): run one rank "
                 "per GPU (mpirun -np <GPUs>), or give each rank its own (srun --gpus-per-task=1); to share one GPU on "
                 "purpose, set CUDA_VISIBLE_DEVICES", local_size);
    else
        snprintf(buf, sizeof buf, "%d ranks on this node, %d GPUs visible to each (CUDA_VISIBLE_DEVICES=%s): run one rank per "
                 "GPU, with every GPU visible to every rank or one GPU per rank (srun --gpus-per-task=1)", local_size, ndev,
                 cvd ? cvd : "unset");
    *how = buf;
    return -1;
}
