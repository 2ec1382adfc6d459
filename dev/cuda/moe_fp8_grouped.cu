/*
 * moe_fp8_grouped.cu — the experts' up-projection on FP8 block-scaled operands (--fp8 block's recipe: E4M3 codes,
 * 1x128 activation factors, 128x128 weight block factors) as one grouped launch, model/moe_grouped_fp8.cuh
 * (DeepGEMM's promotion per 128 of k on the v4 TMA skeleton), against today's path: one cuBLASLt block-scaled GEMM
 * per expert and projection (VEC128 activations, BLK128x128 weights; cuBLASLt wants each expert's rows a multiple of 8,
 * so the experts' counts here are) after a synchronising copy of the offsets, then swiglu_forward_gpu.
 * Validated at a small shape (rows 1024 over E 16 uneven experts, one empty; d 256, F 384) against a double-precision
 * CPU product of the dequantised operands and against today's path: emulated, bit for bit (cuBLASLt's twin promotes in
 * the same order, test/test_moe_fp8_grouped.cpp); on a GPU within FP8 accumulation's error. Then timed (not emulated):
 * today's up-projection (w1 and v1 GEMMs + SwiGLU) with and without the offsets' copy + sync, the grouped kernel (g, u,
 * a) and a only, in TFLOP/s, and the grouped a checked against today's at the timing shape.
 *   make dev/cuda/moe_fp8_grouped && ./dev/cuda/moe_fp8_grouped [-s 1b | 132b]
 *   1b:   N 16384 tokens, k 4, E 16, d 1024, F 1792 (dbrx-1b);  132b: N 4096, k 4, E 16, d 6144, F 10752 (DBRX-132B)
 */
#include "common.h"
#include "../../model/moe_grouped_fp8.cuh"

// R rows over E experts by weights 1 + e % 4, expert 3 empty, each count a multiple of 8 (the last takes the rest)
static std::vector<int> make_offsets(int R, int E) {
    int wsum = 0;
    for (int e = 0; e < E; e++) wsum += e == 3 ? 0 : 1 + e % 4;
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; e++) {
        int n = e == 3 ? 0 : (int)((long long)R * (1 + e % 4) / wsum / 8 * 8);
        off[e + 1] = e == E - 1 ? R : off[e] + n;
    }
    return off;
}
// n E4M3 codes of randn * 60; past 2^20 a random block of 1048573 (a prime) repeated (DBRX-132B's 2 G codes)
static std::vector<uint8_t> make_codes(size_t n, uint64_t seed) {
    const size_t period = 1048573;
    std::vector<float> base = make_random(std::min(n, period), seed, 60.0);
    std::vector<uint8_t> c(n);
    for (size_t i = 0; i < n; i++) c[i] = __nv_fp8_e4m3(base[i % period]).__x;
    return c;
}
static std::vector<float> make_factors(size_t n, uint64_t seed) {
    std::vector<float> v = make_random(n, seed);
    for (float& x : v) x = 1e-3f * (1.0f + std::fabs(x));
    return v;
}

struct Problem {
    int R, E, d, F, KB4;
    std::vector<int> off;
    std::vector<uint8_t> hx, hw1, hv1;          // host copies (validation shape only)
    std::vector<float> hsx, hs1, hs2;
    uint8_t *xe, *w1, *v1;
    float *sx, *sx_today, *s1, *s2;             // sx_today: expert e's (d / 128, n_e) at off[e] d / 128
    floatX *g, *u, *a;
    int *off_dev, *off_host;
};
static Problem make_problem(int N, int k, int E, int d, int F) {
    Problem p;
    p.R = N * k; p.E = E; p.d = d; p.F = F; p.KB4 = (d / 128 + 3) / 4 * 4;
    p.off = make_offsets(p.R, E);
    size_t nw = (size_t)E * F * d, nb = (size_t)E * F / 128 * p.KB4, ns = (size_t)d / 128 * p.R;
    p.hx = make_codes((size_t)p.R * d, 1); p.hw1 = make_codes(nw, 2); p.hv1 = make_codes(nw, 3);
    p.hsx = make_factors(ns, 4); p.hs1 = make_factors(nb, 5); p.hs2 = make_factors(nb, 6);
    std::vector<float> st(ns);
    for (int e = 0; e < E; e++) {
        int n = p.off[e + 1] - p.off[e];
        for (int kb = 0; kb < d / 128; kb++)
            for (int j = 0; j < n; j++) st[(size_t)p.off[e] * (d / 128) + (size_t)kb * n + j] = p.hsx[(size_t)kb * p.R + p.off[e] + j];
    }
    p.xe = to_device(p.hx); p.w1 = to_device(p.hw1); p.v1 = to_device(p.hv1);
    p.sx = to_device(p.hsx); p.sx_today = to_device(st); p.s1 = to_device(p.hs1); p.s2 = to_device(p.hs2);
    size_t nf = (size_t)p.R * F;
    p.g = deviceAlloc(floatX, nf); p.u = deviceAlloc(floatX, nf); p.a = deviceAlloc(floatX, nf);
    p.off_dev = to_device(p.off);
    cudaCheck(cudaMallocHost((void**)&p.off_host, (E + 1) * sizeof(int)));
    return p;
}
static void free_problem(Problem& p) {
    for (void* x : {(void*)p.xe, (void*)p.w1, (void*)p.v1, (void*)p.sx, (void*)p.sx_today, (void*)p.s1, (void*)p.s2, (void*)p.g,
                    (void*)p.u, (void*)p.a, (void*)p.off_dev})
        cudaCheck(cudaFree(x));
    cudaCheck(cudaFreeHost(p.off_host));
}

// today's path: the offsets to the host, then per expert g_e, u_e = block-scaled cuBLASLt GEMMs (column-major D (F, n_e)
// = w_e (F, d) x xe_e^T: A the weights, BLK128x128; B the activations, VEC128), then the SwiGLU
static void run_today(Problem& p, bool sync) {
    if (sync) {
        cudaCheck(cudaMemcpyAsync(p.off_host, p.off_dev, (p.E + 1) * sizeof(int), cudaMemcpyDeviceToHost, 0));
        cudaCheck(cudaStreamSynchronize(0));
    }
    for (int e = 0; e < p.E; e++) {
        const int n = p.off[e + 1] - p.off[e];
        if (n == 0) continue;
        for (int h = 0; h < 2; h++) {
            MatmulOptions o = {};
            o.a_scale = (h ? p.s2 : p.s1) + (size_t)e * p.F / 128 * p.KB4; o.a_scale_mode = MATMUL_SCALE_BLK128;
            o.b_scale = p.sx_today + (size_t)p.off[e] * (p.d / 128); o.b_scale_mode = MATMUL_SCALE_VEC128;
            o.a_name = h ? "v1_e" : "w1_e"; o.b_name = "xe_e";
            matmul_cublaslt(true, false, p.F, n, p.d, 1.0f, (h ? p.v1 : p.w1) + (size_t)e * p.F * p.d, CUDA_R_8F_E4M3, p.d, 0,
                            p.xe + (size_t)p.off[e] * p.d, CUDA_R_8F_E4M3, p.d, 0, 0.0f, (h ? p.u : p.g) + (size_t)p.off[e] * p.F,
                            CUDA_R_16BF, p.F, 0, 1, &o, 0, __FILE__, __LINE__);
        }
    }
    swiglu_forward_gpu(p.a, p.g, p.u, (size_t)p.R * p.F);
}
static void run_grouped(Problem& p, bool a_only) {
    experts_up_grouped_fp8_gpu(a_only ? nullptr : p.g, a_only ? nullptr : p.u, p.a, p.xe, p.sx, p.w1, p.s1, p.v1, p.s2, p.off_dev, p.R, p.E,
                               p.d, p.F);
}

// g of the validation shape in double: sum over k blocks of sx s1 times the block's sum of decoded products
static std::vector<float> cpu_g(const Problem& p) {
    std::vector<float> g((size_t)p.R * p.F);
    auto dec = [](uint8_t c) { __nv_fp8_e4m3 v; v.__x = c; return (double)(float)v; };
    for (int e = 0; e < p.E; e++)
        for (int r = p.off[e]; r < p.off[e + 1]; r++)
            for (int j = 0; j < p.F; j++) {
                double v = 0;
                for (int kb = 0; kb < p.d / 128; kb++) {
                    double s = 0;
                    for (int q = kb * 128; q < kb * 128 + 128; q++) s += dec(p.hx[(size_t)r * p.d + q]) * dec(p.hw1[((size_t)e * p.F + j) * p.d + q]);
                    v += s * p.hsx[(size_t)kb * p.R + r] * p.hs1[((size_t)e * p.F + j) / 128 * p.KB4 + kb];
                }
                g[(size_t)r * p.F + j] = (float)v;
            }
    return g;
}

static void validate_small() {
    Problem p = make_problem(256, 4, 16, 256, 384);
    size_t nf = (size_t)p.R * p.F;
    run_today(p, true);
    std::vector<float> tg = from_device_bf16v(p.g, nf), tu = from_device_bf16v(p.u, nf), ta = from_device_bf16v(p.a, nf);
    validate("today's path: g vs the CPU", tg, cpu_g(p), 1e-2, 1e-3);
    for (floatX* x : {p.g, p.u, p.a}) cudaCheck(cudaMemset(x, 0xFF, nf * sizeof(floatX)));
    run_grouped(p, false);
    const double rt = EMULATED ? 0 : 1e-2, at = EMULATED ? 0 : 1e-3;   // emulated: the same bits
    validate("grouped FP8: g vs the CPU", from_device_bf16v(p.g, nf), cpu_g(p), 1e-2, 1e-3);
    validate("grouped FP8: g vs today's", from_device_bf16v(p.g, nf), tg, rt, at);
    validate("grouped FP8: u vs today's", from_device_bf16v(p.u, nf), tu, rt, at);
    validate("grouped FP8: a vs today's", from_device_bf16v(p.a, nf), ta, EMULATED ? 0 : 2e-2, EMULATED ? 0 : 2e-3);
    free_problem(p);
}

int main(int argc, char** argv) {
    MoeShape sh;
    if (!moe_shape_args(argc, argv, &sh)) return 2;
    const int N = sh.N, k = sh.k, E = sh.E, d = sh.d, F = sh.F;
    char shape[128] = "rows 1024, E 16 (one empty), d 256, F 384";
    if (!EMULATED) snprintf(shape, sizeof shape, "N %d, k %d, E %d, d %d, F %d (validated at rows 1024, d 256, F 384)", N, k, E, d, F);
    print_header("moe grouped FP8 block-scaled up-projection", shape);
    std::string why;
    if (!EMULATED && !matmul_fp8_block_supported(&why)) { printf("  skipped: %s\n", why.c_str()); return 0; }
    validate_small();
    if (!EMULATED) {
        Problem p = make_problem(N, k, E, d, F);
        double up = 2.0 * p.R * d * 2.0 * F;
        report_flops("today: up (cuBLASLt FP8 block)", up, time_ms(10, [&] { run_today(p, false); }));
        report_flops("today: up, sync + copy first", up, time_ms(10, [&] { run_today(p, true); }));
        std::vector<float> ta = from_device_bf16v(p.a, (size_t)p.R * F);
        report_flops("grouped FP8: up (g, u, a)", up, time_ms(10, [&] { run_grouped(p, false); }));
        report_flops("grouped FP8: up, a only", up, time_ms(10, [&] { run_grouped(p, true); }));
        validate("grouped at the timing shape: a", from_device_bf16v(p.a, (size_t)p.R * F), ta, 2e-2, 2e-3);
        free_problem(p);
    }
    return finish();
}
