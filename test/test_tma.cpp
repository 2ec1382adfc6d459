/*
 * test_tma.cpp — Hopper's mbarriers and tensor memory accelerator (model/tma.cuh) under the SIMT emulator
 * (test/simt/tma.h), against the host's copy of the data and a double-precision product:
 *   - tiles of a bf16 matrix (100 x 200) loaded one after another through one mbarrier (parity flipping) into
 *     128B-swizzled shared memory, boxes hanging off every edge (zero fill), read back by 128 threads with the
 *     swizzle written from the layout's description (row r's 16-byte chunk c at chunk c ^ r % 8); with try_wait and
 *     with test_wait;
 *   - 3D boxes (element strides 1, 1, 2) hanging off every dimension; one thread waiting and a __syncthreads();
 *   - a 3-stage ring over 9 k-tiles: a producer thread, 128 consumers, full (count 1 + tx) and empty (count 128)
 *     barriers, the producer's first wait on each empty barrier of parity 1;
 *   - a TMA-fed wgmma GEMM (model/wgmma.cuh; 64 x 64 tiles of out = A B^T, M 100, K 200: zero-filled edges);
 *   - negative controls that must fail: the tile read before the wait (NaN here, a race under the detector), a
 *     wgmma issued before the wait (NaN; a race), an expect_tx larger than the copies and an arrival count never
 *     reached (a reported deadlock, not a hang, waited for or polled), the tile read unswizzled or a map without
 *     swizzle (mismatches), the encoder twin's refusals (a misaligned address or stride, a box over 256, an inner
 *     box over the swizzle span), an ordinary store to the barrier, and (detector only: the values are right) a
 *     second barrier not waited for.
 * test/test_race_tma is this file under the race detector (-DSIMT_RACE_DETECT), which also checks that the copies'
 * global reads are the launch's bytes (bytecount.h). Built with g++ -DSIMT_EMULATION only.
 */
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest.h>
#include "../model/cuda_common.h"
#include "../model/wgmma.cuh"
#include "../model/tma.cuh"

extern __shared__ __align__(16) char dynamic_smem[];

enum { F_EARLY = 1, F_EXTRA_TX = 2, F_READ_LINEAR = 4, F_TWO_ARRIVALS = 8, F_LATE_WAIT = 16, F_TEST_WAIT = 32, F_CLOBBER_BAR = 64,
       F_ONE_WAITS = 128, F_SKIP_SECOND = 256 };

// element (r, c) of a tile of 128-byte rows of bf16 (1024-byte aligned); swizzled: 128B, chunk c / 8 of row r at (c / 8) ^ r % 8
__device__ __forceinline__ float tile_at(const char* tile, int r, int c, bool swizzled) {
    const int chunk = swizzled ? (c / 8) ^ (r % 8) : c / 8;
    return __bfloat162float(*(const __nv_bfloat16*)(tile + r * 128 + chunk * 16 + (c % 8) * 2));
}

// grid 1, 128 threads: the 64 x 32 boxes at (x0 + 64 i, y0 + 32 j), i < nx, j < ny, one after another through one
// mbarrier, each copied out as floats to out[t][32][64]; z >= 0: 3D boxes at (.., .., z) of 32 rows in all
__global__ void tma_tiles_kernel(const __grid_constant__ CUtensorMap map, float* out, int x0, int y0, int z, int nx, int ny, int flags) {
    __shared__ uint64_t bar;
    char* tile = dynamic_smem;
    if (threadIdx.x == 0) mbarrier_init(&bar, flags & F_TWO_ARRIVALS ? 2 : 1);
    __syncthreads();
    if (flags & F_CLOBBER_BAR && threadIdx.x == 1) bar = 0;
    for (int t = 0; t < nx * ny; t++) {
        if (threadIdx.x == 0) {
            mbarrier_arrive_expect_tx(&bar, 64 * 32 * 2 + (flags & F_EXTRA_TX ? 16 : 0));
            if (z < 0) tma_load_2d(tile, &map, x0 + 64 * (t % nx), y0 + 32 * (t / nx), &bar);
            else tma_load_3d(tile, &map, x0 + 64 * (t % nx), y0 + 32 * (t / nx), z, &bar);
        }
        if (flags & F_TEST_WAIT) {
            while (!mbarrier_test_wait_parity(&bar, t & 1)) {}
        } else if (flags & F_ONE_WAITS) {   // one thread waits, the barrier passes what it observed on to all
            if (threadIdx.x == 0) mbarrier_wait_parity(&bar, t & 1);
            __syncthreads();
        } else if (!(flags & F_EARLY)) {
            mbarrier_wait_parity(&bar, t & 1);
        }
        for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) out[(size_t)t * 2048 + i] = tile_at(tile, i / 64, i % 64, !(flags & F_READ_LINEAR));
        if (flags & F_EARLY) mbarrier_wait_parity(&bar, t & 1);
        __syncthreads();   // every thread has read the tile before the next copy overwrites it
    }
}

// grid 1, 128 threads: boxes (0, 0) and (64, 0) through two mbarriers, both waited for (F_SKIP_SECOND: only the first)
__global__ void tma_two_bars_kernel(const __grid_constant__ CUtensorMap map, float* out, int flags) {
    __shared__ uint64_t bar[2];
    if (threadIdx.x == 0) { mbarrier_init(&bar[0], 1); mbarrier_init(&bar[1], 1); }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int j = 0; j < 2; j++) {
            mbarrier_arrive_expect_tx(&bar[j], 4096);
            tma_load_2d(dynamic_smem + 4096 * j, &map, 64 * j, 0, &bar[j]);
        }
    mbarrier_wait_parity(&bar[0], 0);
    if (!(flags & F_SKIP_SECOND)) mbarrier_wait_parity(&bar[1], 0);
    for (int i = threadIdx.x; i < 2 * 2048; i += blockDim.x) out[i] = tile_at(dynamic_smem + 4096 * (i / 2048), i % 2048 / 64, i % 64, true);
}

// grid (rows / 32), 160 threads: thread 0 copies the nk k-tiles (64 x 32) of rows 32 b .. into a ring of STAGES
// stages; threads 32 .. 159 copy each to out (rows x 64 nk floats) and release its stage
template <int STAGES>
__global__ void tma_ring_kernel(const __grid_constant__ CUtensorMap map, float* out, int nk) {
    __shared__ uint64_t full[STAGES], empty[STAGES];
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) { mbarrier_init(&full[s], 1); mbarrier_init(&empty[s], 128); }
    __syncthreads();
    const int row0 = 32 * blockIdx.x, ldo = 64 * nk;
    if (threadIdx.x == 0) {
        for (int kt = 0; kt < nk; kt++) {
            const int s = kt % STAGES;
            mbarrier_wait_parity(&empty[s], ((kt / STAGES) & 1) ^ 1);   // the consumers released the stage's last use
            mbarrier_arrive_expect_tx(&full[s], 64 * 32 * 2);
            tma_load_2d(dynamic_smem + s * 4096, &map, 64 * kt, row0, &full[s]);
        }
    } else if (threadIdx.x >= 32) {
        for (int kt = 0; kt < nk; kt++) {
            const int s = kt % STAGES;
            mbarrier_wait_parity(&full[s], (kt / STAGES) & 1);
            for (int i = threadIdx.x - 32; i < 64 * 32; i += 128)
                out[(size_t)(row0 + i / 64) * ldo + 64 * kt + i % 64] = tile_at(dynamic_smem + s * 4096, i / 64, i % 64, true);
            mbarrier_arrive(&empty[s]);
        }
    }
}

// grid (ceil(M / 64)), 128 threads: out (M x 64) = A (M x K) B^T (B: 64 x K), k-tiles of 64 by TMA (128B swizzle,
// the K-major wgmma operand layout), 4 wgmma k-steps each
__global__ void tma_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, float* out, int M,
                                 int K, int flags) {
    __shared__ uint64_t full;
    char* ta = dynamic_smem;
    char* tb = dynamic_smem + 8192;
    if (threadIdx.x == 0) mbarrier_init(&full, 1);
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.0f;
    for (int kt = 0; kt < (K + 63) / 64; kt++) {
        if (threadIdx.x == 0) {
            mbarrier_arrive_expect_tx(&full, 2 * 8192);
            tma_load_2d(ta, &map_a, 64 * kt, 64 * blockIdx.x, &full);
            tma_load_2d(tb, &map_b, 64 * kt, 0, &full);
        }
        if (!(flags & F_LATE_WAIT)) mbarrier_wait_parity(&full, kt & 1);
        wgmma_fence();
        for (int s = 0; s < 4; s++)
            wgmma_bf16_ss<64, 0, 0>(d, wgmma_desc(ta + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B), wgmma_desc(tb + 32 * s, 16, 1024, WGMMA_SWIZZLE_128B), 1);
        wgmma_commit();
        wgmma_wait<0>();
        if (flags & F_LATE_WAIT) mbarrier_wait_parity(&full, kt & 1);
        __syncthreads();   // the warpgroup's MMAs have read the tiles before the next copy
    }
    const int q = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    for (int i = 0; i < 32; i++) {
        const int r = 64 * blockIdx.x + 16 * q + g + 8 * (i / 2 % 2), col = 8 * (i / 4) + 2 * c + i % 2;
        if (r < M) out[(size_t)r * 64 + col] = d[i];
    }
}

// --- the host side ----------------------------------------------------------------------------------------------

struct Matrix {   // a random bf16 matrix on the host and the device
    int rows, cols;
    std::vector<__nv_bfloat16> h;
    __nv_bfloat16* d = nullptr;
    Matrix(int r, int c, uint64_t seed) : rows(r), cols(c), h((size_t)r * c) {
        for (size_t i = 0; i < h.size(); i++) h[i] = __float2bfloat16((float)((simt::mix64(seed + i) % 2001) / 1000.0 - 1.0));
        cudaCheck(cudaMalloc((void**)&d, h.size() * 2));
        cudaCheck(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    ~Matrix() { cudaFree(d); }
    float at(long r, long c) const { return r >= 0 && r < rows && c >= 0 && c < cols ? __bfloat162float(h[(size_t)r * cols + c]) : 0.0f; }
};

// the tiles kernel on A's boxes; returns the number of elements unlike A's (zeros outside it). z >= 0: A seen as 10
// planes of 10 rows, boxes of 8 rows x 4 planes (every second plane from z: element strides 1, 1, 2)
static int run_tiles(const Matrix& A, CUtensorMapSwizzle swz, int x0, int y0, int nx, int ny, int flags, int z = -1) {
    alignas(64) CUtensorMap map;
    if (z < 0) {
        tma_map_2d_bf16(&map, A.d, A.cols, A.rows, A.cols, 64, 32, swz);
    } else {
        const cuuint64_t dim[3] = {(cuuint64_t)A.cols, 10, 10}, stride[2] = {(cuuint64_t)A.cols * 2, (cuuint64_t)A.cols * 20};
        const cuuint32_t box[3] = {64, 8, 8}, estride[3] = {1, 1, 2};
        cuCheck(tma_encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, A.d, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   swz, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    }
    float* out;
    const size_t n = (size_t)nx * ny * 2048;
    cudaCheck(cudaMalloc((void**)&out, n * 4));
    LAUNCH(tma_tiles_kernel, 1, 128, 4096, 0, map, out, x0, y0, z, nx, ny, flags);
    cudaCheck(cudaGetLastError());
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), out, n * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(out));
    int bad = 0;
    for (int t = 0; t < nx * ny; t++)
        for (int i = 0; i < 2048; i++) {
            const int r = i / 64, x = x0 + 64 * (t % nx) + i % 64, y = y0 + 32 * (t / nx);
            float want = A.at(y + r, x);
            if (z >= 0) {   // row r: row y + r % 8 of plane z + 2 (r / 8)
                const int yy = y + r % 8, zz = z + 2 * (r / 8);
                want = yy >= 0 && yy < 10 && zz >= 0 && zz < 10 ? A.at(10 * zz + yy, x) : 0.0f;
            }
            bad += !(h[(size_t)t * 2048 + i] == want);
        }
    return bad;
}

TEST_CASE("TMA 2D boxes into 128B-swizzled shared memory through one mbarrier: every edge zero-filled, try_wait and test_wait") {
    Matrix A(100, 200, 1);
    // columns -32 .. 223 by 64, rows -8 .. 120 by 32: boxes off the left, right, top and bottom edges
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, -32, -8, 4, 4, 0) == 0);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 4, 4, 0) == 0);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 136, 68, 1, 2, F_TEST_WAIT) == 0);
    simt::set_schedule(true, 3);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, -32, -8, 4, 4, 0) == 0);
    simt::set_schedule_warp_ahead(0);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, -32, -8, 4, 4, 0) == 0);
    simt::set_schedule(false, 0);
    // the unswizzled map read as unswizzled rows; one thread waits and a __syncthreads() releases the others
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_NONE, 8, 4, 2, 2, F_READ_LINEAR) == 0);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, -32, 68, 4, 2, F_ONE_WAITS) == 0);
}

TEST_CASE("TMA 3D boxes (element strides 1, 1, 2) off the edges of every dimension, and two mbarriers") {
    Matrix A(100, 200, 1);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, -32, -3, 4, 1, 0, 5) == 0);   // planes 5, 7, 9, 11 (out), rows -3 .. 4
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 136, 6, 1, 1, 0, -2) == 0);   // planes -2 (out), 0, 2, 4, rows 6 .. 13
    float* out;
    cudaCheck(cudaMalloc((void**)&out, 4096 * 4));
    alignas(64) CUtensorMap map;
    tma_map_2d_bf16(&map, A.d, A.cols, A.rows, A.cols, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B);
    LAUNCH(tma_two_bars_kernel, 1, 128, 8192, 0, map, out, 0);
    std::vector<float> h(4096);
    cudaCheck(cudaMemcpy(h.data(), out, 4096 * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 4096; i++) bad += !(h[i] == A.at(i % 2048 / 64, 64 * (i / 2048) + i % 64));
    CHECK(bad == 0);
#if defined(SIMT_RACE_DETECT)
    // the second barrier not waited for: its copy landed with the first (both at the same idle point), the reads race
    std::string e = simt::error_of([&] { LAUNCH(tma_two_bars_kernel, 1, 128, 8192, 0, map, out, F_SKIP_SECOND); });
    CHECK(e.find("race in kernel tma_two_bars_kernel") != std::string::npos);
    CHECK(e.find("without having waited for the mbarrier phase the copy completes") != std::string::npos);
#endif
    cudaCheck(cudaFree(out));
}

TEST_CASE("TMA ring: 3 stages, 9 k-tiles, full / empty mbarriers with parity flipping, a producer thread and 128 consumers") {
    Matrix A(100, 520, 2);   // 4 blocks of 32 rows (the last off the edge), 9 k-tiles (the last off the edge)
    alignas(64) CUtensorMap map;
    tma_map_2d_bf16(&map, A.d, A.cols, A.rows, A.cols, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B);
    const int nk = 9, rows = 128;
    float* out;
    cudaCheck(cudaMalloc((void**)&out, (size_t)rows * 64 * nk * 4));
    for (int sched = 0; sched < 3; sched++) {
        if (sched == 1) simt::set_schedule(true, 11);
        if (sched == 2) simt::set_schedule_warp_ahead(1);
        LAUNCH(tma_ring_kernel<3>, rows / 32, 160, 3 * 4096, 0, map, out, nk);
        cudaCheck(cudaGetLastError());
        std::vector<float> h((size_t)rows * 64 * nk);
        cudaCheck(cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < 64 * nk; c++) bad += !(h[(size_t)r * 64 * nk + c] == A.at(r, c));
        INFO("schedule " << sched);
        CHECK(bad == 0);
    }
    simt::set_schedule(false, 0);
    cudaCheck(cudaFree(out));
}

// the TMA-fed wgmma GEMM; returns the worst |out - ref| / (1e-3 (1 + |ref|)) (> 1: wrong)
static double run_gemm(const Matrix& A, const Matrix& B, int flags) {
    alignas(64) CUtensorMap ma, mb;
    tma_map_2d_bf16(&ma, A.d, A.cols, A.rows, A.cols, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    tma_map_2d_bf16(&mb, B.d, B.cols, B.rows, B.cols, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    float* out;
    cudaCheck(cudaMalloc((void**)&out, (size_t)A.rows * 64 * 4));
    LAUNCH(tma_wgmma_kernel, (A.rows + 63) / 64, 128, 16384, 0, ma, mb, out, A.rows, A.cols, flags);
    cudaCheck(cudaGetLastError());
    std::vector<float> h((size_t)A.rows * 64);
    cudaCheck(cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(out));
    double worst = 0;
    for (int m = 0; m < A.rows; m++)
        for (int n = 0; n < 64; n++) {
            double ref = 0;
            for (int k = 0; k < A.cols; k++) ref += (double)A.at(m, k) * B.at(n, k);
            double e = fabs(h[(size_t)m * 64 + n] - ref) / (1e-3 * (1 + fabs(ref)));
            worst = std::isnan(e) ? 1e30 : std::max(worst, e);
        }
    return worst;
}

TEST_CASE("TMA-fed wgmma GEMM: 128B-swizzled TMA tiles are wgmma operands (M 100, N 64, K 200: zero-filled edges)") {
    Matrix A(100, 200, 3), B(64, 200, 4);
    CHECK(run_gemm(A, B, 0) <= 1.0);
    simt::set_schedule(true, 5);
    CHECK(run_gemm(A, B, 0) <= 1.0);
    simt::set_schedule(false, 0);
}

TEST_CASE("TMA / mbarrier negative controls: early reads, a wrong expect_tx, arrivals never reached, wrong swizzle, bad maps") {
    Matrix A(100, 200, 1);
#if defined(SIMT_RACE_DETECT)
    std::string e = simt::error_of([&] { run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 2, 1, F_EARLY); });
    CHECK(e.find("race in kernel tma_tiles_kernel") != std::string::npos);
    CHECK(e.find("before the copy's mbarrier phase completed") != std::string::npos);
    Matrix B(64, 200, 4);
    e = simt::error_of([&] { run_gemm(A, B, F_LATE_WAIT); });
    CHECK(e.find("race in kernel tma_wgmma_kernel") != std::string::npos);
    CHECK(e.find("(wgmma.mma_async A)") != std::string::npos);
#else
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 2, 1, F_EARLY) > 0);   // the poison (NaN) before the copy lands
    Matrix B(64, 200, 4);
    CHECK(run_gemm(A, B, F_LATE_WAIT) > 1.0);
#endif
    // an expect_tx 16 bytes above the box: the phase never completes
    std::string d = simt::error_of([&] { run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 1, 1, F_EXTRA_TX); });
    CHECK(d.find("deadlock in kernel tma_tiles_kernel") != std::string::npos);
    CHECK(d.find("tx-count 16 byte(s) not arrived") != std::string::npos);
    d = simt::error_of([&] { run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 1, 1, F_TWO_ARRIVALS); });
    CHECK(d.find("deadlock in kernel tma_tiles_kernel") != std::string::npos);
    CHECK(d.find("1 of 2 arrival(s) pending") != std::string::npos);
    d = simt::error_of([&] { run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 1, 1, F_TWO_ARRIVALS | F_TEST_WAIT); });   // polled: no idle point
    CHECK(d.find("mbarrier.test_wait spins on a barrier that does not change (a deadlock): 1 arrival(s) pending") != std::string::npos);
    d = simt::error_of([&] { run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 1, 1, F_CLOBBER_BAR); });
    CHECK(d.find("changed by an ordinary store") != std::string::npos);
    // the swizzle: read unswizzled, or a map without it read swizzled
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, 0, 0, 1, 1, F_READ_LINEAR) > 0);
    CHECK(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_NONE, 0, 0, 1, 1, 0) > 0);
    // the encoder's documented refusals
    alignas(64) CUtensorMap map;
    CHECK(tma_encode_2d_bf16(&map, A.d + 1, 199, 100, 200, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);  // address % 16
    CHECK(tma_encode_2d_bf16(&map, A.d, 196, 100, 196, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);      // stride 392 B
    CHECK(tma_encode_2d_bf16(&map, A.d, 200, 100, 200, 64, 300, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);     // box > 256
    CHECK(tma_encode_2d_bf16(&map, A.d, 200, 100, 200, 128, 32, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);     // 256 B > 128
    CHECK(tma_encode_2d_bf16(&map, A.d, 200, 100, 200, 32, 32, CU_TENSOR_MAP_SWIZZLE_32B) == CUDA_ERROR_INVALID_VALUE);       // 64 B > 32
    CHECK(tma_encode_2d_bf16(&map, A.d, 200, 100, 200, 4, 32, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_ERROR_INVALID_VALUE);       // 8 B rows
    CHECK(tma_encode_2d_bf16(&map, A.d, 200, 100, 200, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_SUCCESS);
}

#if defined(SIMT_RACE_DETECT)
TEST_CASE("TMA: the copies' global reads are the launch's bytes (bytecount.h): the matrix's in-range elements once") {
    Matrix A(100, 200, 1);
    simt::bytes_launch_begin();
    REQUIRE(run_tiles(A, CU_TENSOR_MAP_SWIZZLE_128B, -32, -8, 4, 4, 0) == 0);   // boxes cover the whole matrix
    simt::ByteCounts c = simt::bytes_launch_end();
    CHECK(c.rd == 100LL * 200 * 2);
}
#endif
