/*
 * moe_fp8_grouped.cu — the experts' GEMMs on FP8 block-scaled operands (--fp8 block's recipe: E4M3 codes, 1x128
 * activation factors, 128x128 weight block factors) as one grouped launch per projection, model/moe_grouped_fp8.cuh
 * (DeepGEMM's promotion per 128 of k on the v4 TMA skeleton; the up-projection with SwiGLU fused, the down-projection
 * on w2 transposed, its input random codes), against today's path: one cuBLASLt block-scaled GEMM per expert and
 * projection (VEC128 activations, BLK128x128 weights; cuBLASLt wants each expert's rows a multiple of 8, so the counts
 * here are), after a synchronising copy of the offsets, then swiglu_forward_gpu.
 * Validated at a small shape (rows 1024 over E 16 uneven experts, one empty; d 256, F 384) against a double-precision
 * CPU product of the dequantised operands and against today's path: emulated, bit for bit (cuBLASLt's twin promotes in
 * the same order, test/test_moe_fp8_grouped.cpp); on a GPU within FP8 accumulation's error. Then timed (not emulated):
 * today's up-projection (w1 and v1 GEMMs + SwiGLU) with and without the offsets' copy + sync, its down-projection, the
 * grouped kernels (up: g, u, a and a only; down), in TFLOP/s, each checked against today's at the timing shape.
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
    std::vector<float> r = make_random(std::min(n, period), seed, 60.0);
    std::vector<uint8_t> base(r.size()), c(n);
    for (size_t i = 0; i < r.size(); i++) base[i] = __nv_fp8_e4m3(r[i]).__x;
    for (size_t i = 0; i < n; i++) c[i] = base[i % period];
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
    std::vector<uint8_t> hx, hw1, hv1;          // host copies (the CPU check)
    std::vector<float> hsx, hs1, hs2;
    uint8_t *xe, *w1, *v1, *a8, *w2t;           // a8: the down-projection's input (random codes, not a)
    float *sx, *sx_today, *s1, *s2, *sa, *sa_today, *s3;   // *_today: expert e's (K / 128, n_e) at off[e] K / 128
    floatX *g, *u, *a, *ye;
    int *off_dev, *off_host;
};
// the factors sx (K / 128, R) regrouped per expert for today's VEC128 GEMMs: expert e's (K / 128, n_e) at off[e] K / 128
static std::vector<float> per_expert_factors(const Problem& p, const std::vector<float>& sx, int K) {
    std::vector<float> st(sx.size());
    for (int e = 0; e < p.E; e++) {
        const int n = p.off[e + 1] - p.off[e];
        for (int kb = 0; kb < K / 128; kb++)
            for (int j = 0; j < n; j++) st[(size_t)p.off[e] * (K / 128) + (size_t)kb * n + j] = sx[(size_t)kb * p.R + p.off[e] + j];
    }
    return st;
}
static Problem make_problem(int N, int k, int E, int d, int F) {
    Problem p;
    p.R = N * k; p.E = E; p.d = d; p.F = F; p.KB4 = (d / 128 + 3) / 4 * 4;
    p.off = make_offsets(p.R, E);
    size_t nw = (size_t)E * F * d, nb = (size_t)E * F / 128 * p.KB4, ns = (size_t)d / 128 * p.R;
    p.hx = make_codes((size_t)p.R * d, 1); p.hw1 = make_codes(nw, 2); p.hv1 = make_codes(nw, 3);
    p.hsx = make_factors(ns, 4); p.hs1 = make_factors(nb, 5); p.hs2 = make_factors(nb, 6);
    std::vector<float> hsa = make_factors((size_t)F / 128 * p.R, 7);
    p.xe = to_device(p.hx); p.w1 = to_device(p.hw1); p.v1 = to_device(p.hv1);
    p.a8 = to_device(make_codes((size_t)p.R * F, 8)); p.w2t = to_device(make_codes(nw, 9));
    p.sx = to_device(p.hsx); p.sx_today = to_device(per_expert_factors(p, p.hsx, d)); p.s1 = to_device(p.hs1); p.s2 = to_device(p.hs2);
    p.sa = to_device(hsa); p.sa_today = to_device(per_expert_factors(p, hsa, F));
    p.s3 = to_device(make_factors((size_t)E * d / 128 * ((F / 128 + 3) / 4 * 4), 10));
    size_t nf = (size_t)p.R * F;
    p.g = deviceAlloc(floatX, nf); p.u = deviceAlloc(floatX, nf); p.a = deviceAlloc(floatX, nf); p.ye = deviceAlloc(floatX, (size_t)p.R * d);
    p.off_dev = to_device(p.off);
    cudaCheck(cudaMallocHost((void**)&p.off_host, (E + 1) * sizeof(int)));
    return p;
}
static void free_problem(Problem& p) {
    for (void* x : {(void*)p.xe, (void*)p.w1, (void*)p.v1, (void*)p.a8, (void*)p.w2t, (void*)p.sx, (void*)p.sx_today, (void*)p.s1,
                    (void*)p.s2, (void*)p.sa, (void*)p.sa_today, (void*)p.s3, (void*)p.g, (void*)p.u, (void*)p.a, (void*)p.ye, (void*)p.off_dev})
        cudaCheck(cudaFree(x));
    cudaCheck(cudaFreeHost(p.off_host));
}

// today's GEMMs, expert by expert: out_e (n_e, N) = x_e (n_e, K) w_e^T, block-scaled cuBLASLt (column-major D (N, n_e) =
// w_e (N, K) x x_e^T: A the weights, BLK128x128 factors sw; B the activations, VEC128 factors sx_today)
static void today_gemms(const Problem& p, floatX* out, const uint8_t* x, const float* sx_today, const uint8_t* w, const float* sw, int K, int N) {
    for (int e = 0; e < p.E; e++) {
        const int n = p.off[e + 1] - p.off[e];
        if (n == 0) continue;
        MatmulOptions o = {};
        o.a_scale = sw + (size_t)e * N / 128 * ((K / 128 + 3) / 4 * 4); o.a_scale_mode = MATMUL_SCALE_BLK128;
        o.b_scale = sx_today + (size_t)p.off[e] * (K / 128); o.b_scale_mode = MATMUL_SCALE_VEC128;
        o.a_name = "w_e"; o.b_name = "x_e";
        matmul_cublaslt(true, false, N, n, K, 1.0f, w + (size_t)e * N * K, CUDA_R_8F_E4M3, K, 0, x + (size_t)p.off[e] * K, CUDA_R_8F_E4M3, K, 0,
                        0.0f, out + (size_t)p.off[e] * N, CUDA_R_16BF, N, 0, 1, &o, 0, __FILE__, __LINE__);
    }
}
// today's path: the offsets to the host, the up-projection's GEMMs and SwiGLU; (down) the down-projection's GEMMs
static void run_today(Problem& p, bool sync, bool up, bool down) {
    if (sync) {
        cudaCheck(cudaMemcpyAsync(p.off_host, p.off_dev, (p.E + 1) * sizeof(int), cudaMemcpyDeviceToHost, 0));
        cudaCheck(cudaStreamSynchronize(0));
    }
    if (up) {
        today_gemms(p, p.g, p.xe, p.sx_today, p.w1, p.s1, p.d, p.F);
        today_gemms(p, p.u, p.xe, p.sx_today, p.v1, p.s2, p.d, p.F);
        swiglu_forward_gpu(p.a, p.g, p.u, (size_t)p.R * p.F);
    }
    if (down) today_gemms(p, p.ye, p.a8, p.sa_today, p.w2t, p.s3, p.F, p.d);
}
static void run_grouped(Problem& p, bool a_only) {
    experts_up_grouped_fp8_gpu(a_only ? nullptr : p.g, a_only ? nullptr : p.u, p.a, p.xe, p.sx, p.w1, p.s1, p.v1, p.s2, p.off_dev, p.R, p.E,
                               p.d, p.F);
}
static void run_grouped_down(Problem& p) { experts_down_grouped_fp8_gpu(p.ye, p.a8, p.sa, p.w2t, p.s3, p.off_dev, p.R, p.E, p.d, p.F); }

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
    run_today(p, true, true, true);
    std::vector<float> tg = from_device_bf16v(p.g, nf), tu = from_device_bf16v(p.u, nf), ta = from_device_bf16v(p.a, nf);
    std::vector<float> tye = from_device_bf16v(p.ye, (size_t)p.R * p.d);
    validate("today's path: g vs the CPU", tg, cpu_g(p), 1e-2, 1e-3);
    for (floatX* x : {p.g, p.u, p.a}) cudaCheck(cudaMemset(x, 0xFF, nf * sizeof(floatX)));
    run_grouped(p, false);
    run_grouped_down(p);
    const double rt = EMULATED ? 0 : 1e-2, at = EMULATED ? 0 : 1e-3;   // emulated: the same bits
    validate("grouped FP8: g vs the CPU", from_device_bf16v(p.g, nf), cpu_g(p), 1e-2, 1e-3);
    validate("grouped FP8: g vs today's", from_device_bf16v(p.g, nf), tg, rt, at);
    validate("grouped FP8: u vs today's", from_device_bf16v(p.u, nf), tu, rt, at);
    validate("grouped FP8: a vs today's", from_device_bf16v(p.a, nf), ta, EMULATED ? 0 : 2e-2, EMULATED ? 0 : 2e-3);
    validate("grouped FP8: ye vs today's", from_device_bf16v(p.ye, (size_t)p.R * p.d), tye, rt, at);
    free_problem(p);
}

int main(int argc, char** argv) {
    MoeShape sh;
    if (!moe_bench_start(argc, argv, "moe grouped FP8 block-scaled GEMMs", "d 256, F 384", &sh)) return 2;
    const int N = sh.N, k = sh.k, E = sh.E, d = sh.d, F = sh.F;
    std::string why;
    if (!EMULATED && !matmul_fp8_block_supported(&why)) { printf("  skipped: %s\n", why.c_str()); return 0; }
    validate_small();
    if (!EMULATED) {
        Problem p = make_problem(N, k, E, d, F);
        double up = 2.0 * p.R * d * 2.0 * F;
        report_flops("today: up (cuBLASLt FP8 block)", up, time_ms(10, [&] { run_today(p, false, true, false); }));
        report_flops("today: up, sync + copy first", up, time_ms(10, [&] { run_today(p, true, true, false); }));
        report_flops("today: down (cuBLASLt FP8 block)", up / 2, time_ms(10, [&] { run_today(p, false, false, true); }));
        std::vector<float> ta = from_device_bf16v(p.a, (size_t)p.R * F), tye = from_device_bf16v(p.ye, (size_t)p.R * d);
        report_flops("grouped FP8: up (g, u, a)", up, time_ms(10, [&] { run_grouped(p, false); }));
        report_flops("grouped FP8: up, a only", up, time_ms(10, [&] { run_grouped(p, true); }));
        validate("grouped at the timing shape: a", from_device_bf16v(p.a, (size_t)p.R * F), ta, 2e-2, 2e-3);
        report_flops("grouped FP8: down", up / 2, time_ms(10, [&] { run_grouped_down(p); }));
        validate("grouped at the timing shape: ye", from_device_bf16v(p.ye, (size_t)p.R * d), tye, 1e-2, 1e-3);
        free_problem(p);
    }
    return finish();
}
