/*
 * test_gpu_select.cpp — the cluster-facing start-up logic, on the CPU:
 *   - parallel/gpu_select.h: which GPU a rank takes under each launcher and GPU visibility (mpirun,
 *     srun with every GPU visible or one per task, srun without PMIx, MPICH's launcher inside Slurm, a
 *     batch script's single process), with the environment as each launcher sets it;
 *   - model/gpu_peak.h: the dense BF16 peak per exact device, against NVIDIA's published numbers.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include <cmath>
#include <cstdlib>
#include <string>
#include "../parallel/gpu_select.h"
#include "../model/gpu_peak.h"

static GpuLaunchEnv no_env() { return GpuLaunchEnv{NULL, NULL, NULL, NULL, NULL, NULL}; }
static GpuLaunchEnv ompi(const char* r, const char* n) { GpuLaunchEnv e = no_env(); e.ompi_local_rank = r; e.ompi_local_size = n; return e; }
static GpuLaunchEnv slurm(const char* id, const char* tasks, const char* node) {
    GpuLaunchEnv e = no_env();
    e.slurm_localid = id, e.slurm_step_tasks_per_node = tasks, e.slurm_nodeid = node;
    return e;
}
static bool has(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

TEST_CASE("Slurm's compressed tasks-per-node list") {
    CHECK(gpu_slurm_tasks_on_node("8", 0) == 8);
    CHECK(gpu_slurm_tasks_on_node("8(x2),7", 0) == 8);
    CHECK(gpu_slurm_tasks_on_node("8(x2),7", 1) == 8);
    CHECK(gpu_slurm_tasks_on_node("8(x2),7", 2) == 7);
    CHECK(gpu_slurm_tasks_on_node("8(x2),7", 3) == -1);
    CHECK(gpu_slurm_tasks_on_node("2,4(x3)", 3) == 4);
    CHECK(gpu_slurm_tasks_on_node("8(2)", 0) == -1);
    CHECK(gpu_slurm_tasks_on_node("x", 0) == -1);
    CHECK(gpu_env_int("12") == 12);
    CHECK(gpu_env_int("") == -1);
    CHECK(gpu_env_int("3a") == -1);
}

TEST_CASE("mpirun, every GPU of the node visible: the node-local rank") {
    std::string how;
    CHECK(gpu_select(8, 3, 8, ompi("3", "8"), &how) == 3);
    CHECK(has(how, "cuda:3 = node-local rank 3 of 8"));
    CHECK(has(how, "mpirun"));
    CHECK(gpu_select(8, 0, 1, no_env(), &how) == 0);   // one process, no launcher
    CHECK(has(how, "MPI_Comm_split_type"));
    CHECK(gpu_select(8, 1, 2, ompi("1", "2"), &how) == 1);   // fewer ranks than GPUs
    // mpirun inside an sbatch script: its daemons were started by srun (SLURM_LOCALID 0 of 1): mpirun's variables win
    GpuLaunchEnv e = ompi("6", "8");
    e.slurm_localid = "0", e.slurm_step_tasks_per_node = "1";
    CHECK(gpu_select(8, 6, 8, e, &how) == 6);
}

TEST_CASE("srun, every GPU visible (--gpus-per-node=8): SLURM_LOCALID") {
    std::string how;
    CHECK(gpu_select(8, 5, 8, slurm("5", "8(x2)", "1"), &how) == 5);
    CHECK(has(how, "srun"));
    CHECK(gpu_select(8, 6, 7, slurm("6", "8(x2),7", "2"), &how) == 6);   // the third node runs 7 tasks
}

TEST_CASE("srun --gpus-per-task=1: one GPU per rank, device 0") {
    std::string how;
    GpuLaunchEnv e = slurm("5", "8(x2)", "0");
    e.cuda_visible_devices = "5";   // as Slurm sets it without device cgroups ("0" with them)
    CHECK(gpu_select(1, 5, 8, e, &how) == 0);
    CHECK(has(how, "CUDA_VISIBLE_DEVICES=5"));
    GpuLaunchEnv m = ompi("2", "8");   // the same under mpirun with a per-rank wrapper
    m.cuda_visible_devices = "2";
    CHECK(gpu_select(1, 2, 8, m, &how) == 0);
    m.cuda_visible_devices = "0";      // every rank on GPU 0: a deliberate share
    CHECK(gpu_select(1, 2, 8, m, &how) == 0);
}

TEST_CASE("refused: more ranks than GPUs, no GPU, the same single GPU by accident") {
    std::string how;
    CHECK(gpu_select(1, 1, 8, ompi("1", "8"), &how) == -1);   // CUDA_VISIBLE_DEVICES unset: one GPU on the node
    CHECK(has(how, "8 ranks on this node see the same single GPU"));
    GpuLaunchEnv e = ompi("3", "4");
    e.cuda_visible_devices = "0,1";
    CHECK(gpu_select(2, 3, 4, e, &how) == -1);
    CHECK(has(how, "4 ranks on this node, 2 GPUs visible to each (CUDA_VISIBLE_DEVICES=0,1)"));
    e.cuda_visible_devices = "";
    CHECK(gpu_select(0, 3, 4, e, &how) == -1);
    CHECK(has(how, "no GPU visible to this rank (CUDA_VISIBLE_DEVICES=)"));
}

TEST_CASE("srun without PMIx: every task a world of one, refused naming it") {
    std::string how;
    CHECK(gpu_select(8, 0, 1, slurm("3", "8", "0"), &how) == -1);
    CHECK(has(how, "started 8 task(s) on this node (this is task 3) but MPI joined 1"));
    CHECK(has(how, "PMIx"));
    CHECK(gpu_select(8, 0, 2, ompi("1", "2"), &how) == -1);   // same size, another order: not one job either
}

TEST_CASE("a launcher inside a launcher, a batch script, unreadable values: MPI's numbers") {
    std::string how;
    // MPICH's mpirun starts one proxy per node with srun: every rank inherits the proxy's SLURM_LOCALID 0 of 1
    CHECK(gpu_select(8, 5, 8, slurm("0", "1", "0"), &how) == 5);
    CHECK(has(how, "MPI_Comm_split_type"));
    // a single process in an sbatch script: SLURM_LOCALID set, no step variables (SLURM_NTASKS_PER_NODE is not read)
    CHECK(gpu_select(8, 0, 1, slurm("0", NULL, NULL), &how) == 0);
    CHECK(gpu_select(8, 3, 8, slurm("3", "eight", "0"), &how) == 3);
    CHECK(has(how, "unreadable, not checked"));
}

TEST_CASE("the environment's names, read once at start-up") {
    setenv("CUDA_VISIBLE_DEVICES", "4", 1);
    setenv("SLURM_LOCALID", "4", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "8(x4)", 1);
    setenv("SLURM_NODEID", "3", 1);
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    GpuLaunchEnv e = gpu_launch_env_read();
    std::string how;
    CHECK(gpu_select(1, 4, 8, e, &how) == 0);
    CHECK(has(how, "CUDA_VISIBLE_DEVICES=4"));
    CHECK(has(how, "srun"));
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
    e = gpu_launch_env_read();
    CHECK(gpu_select(1, 4, 8, e, &how) == -1);   // mpirun says local rank 2, MPI 4
}

// NVIDIA's datasheets, dense BF16 (half the "with sparsity" number): H100 SXM 1979, PCIe 1513, NVL 1671;
// H200 SXM 1979, NVL 1671; A100 312 (dense). SM counts: H100 SXM/NVL and H200 132, H100 PCIe 114, A100 108.
TEST_CASE("dense BF16 peak per exact device, against the published numbers") {
    struct { const char* name; int sms, khz; double tflops; } cases[] = {
        {"NVIDIA H100 80GB HBM3", 132, 1980000, 989.4},
        {"NVIDIA H100 PCIe", 114, 1755000, 756.0},
        {"NVIDIA H100 NVL", 132, 1785000, 835.0},
        {"NVIDIA H200", 132, 1980000, 989.4},
        {"NVIDIA H200 NVL", 132, 1785000, 835.0},
        {"NVIDIA GH200 480GB", 132, 1980000, 989.4},
        {"NVIDIA H800", 132, 1980000, 989.4},
        {"NVIDIA A100-SXM4-80GB", 108, 1410000, 312.0},
        {"NVIDIA A100 80GB PCIe", 108, 1410000, 312.0},
        {"NVIDIA H100 80GB HBM3", 132, 0, 989.4},   // clock unknown: the datasheet's
    };
    for (auto& c : cases) {
        std::string how;
        double p = gpu_peak_bf16_dense(c.name, c.sms, c.khz, &how);
        INFO(c.name, ": ", how);
        CHECK(std::fabs(p / 1e12 - c.tflops) < 0.0005 * c.tflops);
        CHECK(has(how, "NVIDIA"));
    }
    std::string how;
    // the H100 SXM number is 132 SMs x 4096 FLOP/clock x 1830 MHz
    gpu_peak_bf16_dense("NVIDIA H100 80GB HBM3", 132, 1980000, &how);
    CHECK(has(how, "H100 SXM dense BF16 (NVIDIA: 989.4 TFLOP/s = 132 SMs x 4096 FLOP/clock x 1830 MHz)"));
    // a MIG slice of 60 SMs: its share
    double mig = gpu_peak_bf16_dense("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60, 1980000, &how);
    CHECK(std::fabs(mig / 1e12 - 989.4 * 60 / 132) < 0.5);
    CHECK(has(how, "MIG"));
    // a max clock below the datasheet's: SMs x 4096 x that clock
    double slow = gpu_peak_bf16_dense("NVIDIA H100 80GB HBM3", 132, 1500000, &how);
    CHECK(std::fabs(slow - 132.0 * 4096 * 1.5e9) < 1e9);
    CHECK(has(how, "max clock"));
}

TEST_CASE("unknown devices: 0 and the --peak-tflops hint") {
    for (const char* name : {"NVIDIA RTX A1000", "NVIDIA H20", "NVIDIA L40S", "SIMT emulator (CPU)", "NVIDIA GeForce RTX 4090"}) {
        std::string how;
        INFO(name);
        CHECK(gpu_peak_bf16_dense(name, 80, 2000000, &how) == 0.0);
        CHECK(has(how, "--peak-tflops"));
    }
}
