/*
 * test_race.cpp — the SIMT emulator's race detector (test/simt/race.h). Built with -DSIMT_RACE_DETECT and
 * g++ -fsanitize=thread, linked without libtsan (Makefile): every load and store of the kernels is checked.
 *   1. Every case of test_kernels.cpp (included below): the model's kernels with shared memory and
 *      intra-block cooperation run with every access checked, and must report no race.
 *   2. Synthetic races (shared memory across warps, within a warp, after a __syncwarp the reader was not
 *      part of, global memory within a block) are reported naming the kernel, both threads and both
 *      source lines; their synchronised twins, shared-memory atomics and adjacent bf16 stores are not.
 *   3. Negative controls on the model's own kernels, under the default sequential schedule: the trailing
 *      barrier of block_max dropped (the classifier's block_max then races with its block_sum), the
 *      end-of-tile barrier of the flash attention forward dropped (the next tile's cp.async overwrites a
 *      buffer another warp still reads with ldmatrix) and the dS barrier of the flash backward dropped (a warp's
 *      dQ product reads, by ldmatrix, dS that other warps have not finished storing) are caught; the first passes every value check
 *      under the sequential and random schedules, and fails under the adversarial warp_ahead schedule.
 */
#include "test_kernels.cpp"
#include <fstream>

using simt::error_of;   // the message of the simt::Error a call raises
// the line number of the first line of `file` containing `text`, after the line containing `after`
static int line_of(const char* file, const char* after, const char* text) {
    std::ifstream in(file);
    std::string l;
    bool seen = false;
    for (int n = 1; std::getline(in, l); n++) {
        if (!seen) { seen = l.find(after) != std::string::npos; continue; }
        if (l.find(text) != std::string::npos) return n;
    }
    return -1;
}
static bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
// the controls run their blocks on one OS thread: which block reports first is then fixed (with SIMT_THREADS
// blocks run in parallel and the first to fail wins)
struct OneOsThread {
    int saved = simt::options().os_threads;
    OneOsThread() { simt::set_os_threads(1); }
    ~OneOsThread() { simt::set_os_threads(saved); }
};

// ---------------------------------------------------------------------------------------------
// synthetic kernels

static const int L_SH_WRITE = __LINE__ + 4;
static const int L_SH_READ = __LINE__ + 5;
__global__ void shared_neighbour_kernel(float* out, int sync) {
    __shared__ float buf[64];
    buf[threadIdx.x] = (float)threadIdx.x;
    if (sync) __syncthreads();
    out[threadIdx.x] = buf[(threadIdx.x + 32) % 64];   // thread 0 reads what thread 32 (another warp) writes
}
// within one warp: lane l reads lane l ^ 1's word; only __syncwarp orders them
__global__ void warp_neighbour_kernel(float* out, int sync) {
    __shared__ float buf[32];
    buf[threadIdx.x] = (float)threadIdx.x;
    if (sync) __syncwarp();
    out[threadIdx.x] = buf[threadIdx.x ^ 1];
}
// a __syncwarp over lanes 0..15 orders lane 0's write before lane `reader`'s read only if the reader was in it
__global__ void half_warp_kernel(float* out, int reader) {
    __shared__ float buf[32];
    if (threadIdx.x == 0) buf[0] = 7.0f;
    if (threadIdx.x < 16) __syncwarp(0x0000ffffu);
    if ((int)threadIdx.x == reader) out[0] = buf[0];
}
// global memory within a block: thread 0 writes, thread 40 reads
static const int L_G_WRITE = __LINE__ + 3;
static const int L_G_READ = __LINE__ + 4;
__global__ void global_flag_kernel(float* g, int sync) {
    if (threadIdx.x == 0) g[0] = 1.0f;
    if (sync) __syncthreads();
    if (threadIdx.x == 40) g[1] = g[0];
}
// shared-memory atomics from every thread: no race; the barriers order the plain accesses around them
__global__ void shared_atomic_kernel(int* out) {
    __shared__ int count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    atomicAdd(&count, 1);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = count;
}
// bf16 neighbours in one word, each written by its own thread: no race (byte-exact shadow)
__global__ void bf16_pairs_kernel(floatX* out) {
    __shared__ floatX buf[64];
    buf[threadIdx.x] = __float2bfloat16((float)threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = buf[63 - threadIdx.x];
}

TEST_CASE("race detector: synthetic races are reported with the kernel, both threads and both lines; their twins are not") {
    OneOsThread one;
    simt::set_schedule(false, 0);
    float* d = dev_poisoned<float>(64);
    std::string msg = error_of([&] { LAUNCH(shared_neighbour_kernel, 1, 64, 0, 0, d, 0); });
    INFO(msg);
    CHECK(contains(msg, "race in kernel shared_neighbour_kernel"));
    CHECK(contains(msg, "thread (0,0,0) read at test/test_race.cpp:" + std::to_string(L_SH_READ)));
    CHECK(contains(msg, "thread (32,0,0) write at test/test_race.cpp:" + std::to_string(L_SH_WRITE)));
    CHECK(contains(msg, "shared memory (static __shared__)"));
    CHECK(error_of([&] { LAUNCH(shared_neighbour_kernel, 1, 64, 0, 0, d, 1); }) == "");
    std::vector<float> got = get(d, 64);
    for (int i = 0; i < 64; i++) CHECK(got[i] == (float)((i + 32) % 64));

    msg = error_of([&] { LAUNCH(warp_neighbour_kernel, 1, 32, 0, 0, d, 0); });
    INFO(msg);
    CHECK(contains(msg, "race in kernel warp_neighbour_kernel"));
    CHECK(contains(msg, "thread (1,0,0) write"));
    CHECK(error_of([&] { LAUNCH(warp_neighbour_kernel, 1, 32, 0, 0, d, 1); }) == "");
    CHECK(error_of([&] { LAUNCH(half_warp_kernel, 1, 32, 0, 0, d, 3); }) == "");
    CHECK(get(d, 1)[0] == 7.0f);
    msg = error_of([&] { LAUNCH(half_warp_kernel, 1, 32, 0, 0, d, 20); });
    CHECK(contains(msg, "race in kernel half_warp_kernel"));
    CHECK(contains(msg, "thread (0,0,0) write"));
    CHECK(contains(msg, "thread (20,0,0) read"));

    msg = error_of([&] { LAUNCH(global_flag_kernel, 1, 64, 0, 0, d, 0); });
    INFO(msg);
    CHECK(contains(msg, "race in kernel global_flag_kernel"));
    CHECK(contains(msg, "thread (0,0,0) write at test/test_race.cpp:" + std::to_string(L_G_WRITE)));
    CHECK(contains(msg, "thread (40,0,0) read at test/test_race.cpp:" + std::to_string(L_G_READ)));
    CHECK(contains(msg, "global memory"));
    CHECK(error_of([&] { LAUNCH(global_flag_kernel, 1, 64, 0, 0, d, 1); }) == "");
    // blocks are checked one by one: the same word written by two blocks is not a race within a block
    CHECK(error_of([&] { LAUNCH(global_flag_kernel, 4, 64, 0, 0, d, 1); }) == "");

    int* di = dev_poisoned<int>(1);
    CHECK(error_of([&] { LAUNCH(shared_atomic_kernel, 1, 256, 0, 0, di); }) == "");
    CHECK(get(di, 1)[0] == 256);
    floatX* dh = dev_poisoned<floatX>(64);
    CHECK(error_of([&] { LAUNCH(bf16_pairs_kernel, 1, 64, 0, 0, dh); }) == "");
    std::vector<float> h = get_bf16(dh, 64);
    for (int i = 0; i < 64; i++) CHECK(h[i] == (float)(63 - i));
    cudaCheck(cudaFree(d));
    cudaCheck(cudaFree(di));
    cudaCheck(cudaFree(dh));
}

// ---------------------------------------------------------------------------------------------
// negative controls on the model's kernels

TEST_CASE("race detector: the classifier's block_max without its trailing barrier races with block_sum") {
    const int N = 3, V = 1000;
    std::vector<float> logits = bf16_round(randn((size_t)N * V, 5, 2.0));
    std::vector<int> targets = randint(N, V, 6);
    std::vector<float> want_logits = logits, want(N);
    crossentropy_forward(want.data(), want_logits.data(), targets.data(), N, V);
    floatX* d_logits = dev_bf16(logits);
    float* d_losses = dev_poisoned<float>(N);
    int* d_targets = dev_copy(targets);
    auto run = [&] { classifier_fused_gpu(d_logits, d_losses, d_targets, N, V, 1.0f, false); };
    OneOsThread one;
    simt::set_schedule(false, 0);
    CHECK(error_of(run) == "");   // the kernel as it is
    expect_close("losses", get(d_losses, N), want, TOL_F32);

    simt::race_drop_barrier_set("block_max", true);
    std::string msg = error_of(run);
    MESSAGE(msg);
    int l_read = line_of("model/cuda_common.h", "block_max(float v", "scratch[lane]");
    int l_write = line_of("model/cuda_common.h", "block_sum(float v", "scratch[warp] = v");
    CHECK(contains(msg, "race in kernel classifier_fused_kernel"));
    CHECK(contains(msg, "block (0,0,0)"));
    // (block_max's read of another warp's slot, by a thread the sequential order runs early, then block_sum's write)
    // (whether the compiler inlined block_max into the kernel decides if the chain "inlined at
    // model/classifier.cuh:..." follows the function's name)
    CHECK(contains(msg, " read at model/cuda_common.h:" + std::to_string(l_read) + " (block_max"));
    CHECK(contains(msg, " write at model/cuda_common.h:" + std::to_string(l_write) + " (block_sum"));
    CHECK(error_of(run) == msg);   // deterministic
    for (int seed = 1; seed <= 10; seed++) {   // and under every schedule (the pair's order may differ)
        simt::set_schedule(true, seed);
        std::string m = error_of(run);
        CHECK(contains(m, "race in kernel classifier_fused_kernel"));
        CHECK(contains(m, "model/cuda_common.h:" + std::to_string(l_read) + " (block_max"));
        CHECK(contains(m, "model/cuda_common.h:" + std::to_string(l_write) + " (block_sum"));
    }
    simt::set_schedule_warp_ahead(3);
    CHECK(contains(error_of(run), "race in kernel classifier_fused_kernel"));
    simt::set_schedule(false, 0);

    // why the schedules alone miss it: with detection off the values are right under the sequential and
    // random schedules; the adversarial schedule (one warp ahead to its next barrier) gets them wrong
    simt::race_detect_set(false);
    CHECK(error_of(run) == "");
    expect_close("losses (sequential)", get(d_losses, N), want, TOL_F32);
    for (int seed = 1; seed <= 3; seed++) {
        simt::set_schedule(true, seed);
        run();
        expect_close("losses (random)", get(d_losses, N), want, TOL_F32);
    }
    simt::set_schedule_warp_ahead(3);
    run();
    std::vector<float> got = get(d_losses, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += !(std::fabs(got[i] - want[i]) <= 1e-4 * std::fabs(want[i]) + 1e-5);
    CHECK(bad > 0);
    simt::race_detect_set(true);
    simt::race_drop_barrier_set("block_max", false);
    simt::set_schedule(false, 0);
    for (void* p : {(void*)d_logits, (void*)d_losses, (void*)d_targets}) cudaCheck(cudaFree(p));
}

TEST_CASE("race detector: flash attention backward without its dS barrier (a warp's dQ reads other warps' dS by ldmatrix)") {
    const int B = 1, T = 96, H = 2, KV = 1, hd = 64, qd = (H + 2 * KV) * hd;
    std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, 10, 1.5)), dout = bf16_round(randn((size_t)B * T * H * hd, 11));
    floatX *d_qkv = dev_bf16(qkv), *d_out = dev_poisoned<floatX>((size_t)B * T * H * hd), *d_dout = dev_bf16(dout);
    floatX* d_dqkv = dev_poisoned<floatX>(qkv.size());
    float *d_lse = dev_poisoned<float>((size_t)B * H * T), *d_D = dev_poisoned<float>(attention_backward_scratch_floats(B, T, H, hd));
    float* d_acc = dev_poisoned<float>(flash_bwd5_acc_floats(B, T, H, hd));   // (the 5-product kernel's dQ sums, semaphores)
    int* d_sem = dev_poisoned<int>(flash_bwd5_sem_ints(B, T, H));
    REQUIRE(flash_attention_supported(hd));
    attention_forward_gpu(d_out, d_lse, d_qkv, B, T, H, KV, hd);
    OneOsThread one;
    simt::set_schedule(false, 0);
    // the model's pair of kernels (dq, dk/dv), then the 5-product kernel of context parallelism: no race
    CHECK(error_of([&] { attention_backward_gpu(d_dqkv, d_D, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd); }) == "");
    auto run = [&] { flash_attention_backward5_gpu(d_dqkv, d_D, d_acc, d_sem, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd); };
    CHECK(error_of(run) == "");
    simt::race_drop_barrier_set("flash_bwd5_ds", true);
    std::string msg = error_of(run);
    simt::race_drop_barrier_set("flash_bwd5_ds", false);
    MESSAGE(msg);
    CHECK(contains(msg, "race in kernel flash_attention_backward5_kernel"));
    CHECK(contains(msg, "(ldmatrix"));
    CHECK(contains(msg, "in flash_attention_backward5_kernel<64>"));
    CHECK(contains(msg, "shared memory (dynamic)"));
    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_dout, (void*)d_dqkv, (void*)d_lse, (void*)d_D, (void*)d_acc, (void*)d_sem})
        cudaCheck(cudaFree(p));
}

TEST_CASE("race detector: flash attention forward without its end-of-tile barrier (cp.async over a buffer ldmatrix reads)") {
    const int B = 1, T = 192, H = 1, KV = 1, hd = 128, qd = (H + 2 * KV) * hd;   // 3 key tiles: a buffer is refilled
    std::vector<float> qkv = bf16_round(randn((size_t)B * T * qd, 9, 1.5));
    floatX *d_qkv = dev_bf16(qkv), *d_out = dev_poisoned<floatX>((size_t)B * T * H * hd);
    float* d_lse = dev_poisoned<float>((size_t)B * H * T);
    REQUIRE(flash_attention_supported(hd));
    // (the mma.sync forward: the model's at head_dim 32 and for context parallelism; at 64 and 128 it runs the wgmma
    // forward, whose negative control is dev/cuda/attention_wgmma_race -p 1)
    auto run = [&] { flash_attention_forward_gpu(d_out, d_lse, d_qkv, B, T, H, KV, hd); };
    OneOsThread one;
    simt::set_schedule(false, 0);
    CHECK(error_of(run) == "");
    simt::race_drop_barrier_set("flash_forward_tile", true);
    std::string msg = error_of(run);
    simt::race_drop_barrier_set("flash_forward_tile", false);
    MESSAGE(msg);
    CHECK(contains(msg, "race in kernel flash_attention_forward_kernel"));
    CHECK(contains(msg, "(cp.async) at "));
    CHECK(contains(msg, "(ldmatrix"));
    CHECK(contains(msg, "in flash_load_tile<128>, at model/attention_flash.cuh:"));
    CHECK(contains(msg, "in flash_attention_forward_kernel<128>)"));
    CHECK(contains(msg, "shared memory (dynamic)"));
    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse}) cudaCheck(cudaFree(p));
}
