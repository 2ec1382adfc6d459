/*
 * moe_wgrad.cu — the experts' weight gradients as grouped GEMMs (model/moe_grouped_wgrad.cuh: one launch per
 * projection for all experts, the offsets read on the device, TMA-fed stages, a producer thread and 2 consumer
 * warpgroups on wgmma, tiles of 128 x 256 of dW, 4 stages) against today's path (model/moe.cuh's experts_backward_gpu:
 * per expert one cuBLASLt GEMM for dw2_e += a_e^T dye_e and one strided batch of 2 for [dw1_e | dv1_e] += [dg_e | du_e]^T
 * xe_e, after a synchronising copy of the offsets):
 *   dw1_e (F, d) += dg_e^T xe_e,  dv1_e += du_e^T xe_e,  dw2_e += a_e^T dye_e   (fp32; beta 1 accumulates, 0 overwrites)
 * Validated at a small shape (rows 1024 over E 16 uneven experts, one empty; d 256, F 256; beta 0 and 1) against a
 * CPU product (double) and today's path: emulated, bit for bit (the same k-order fp32 sums as cuBLASLt's twin); on a
 * GPU within fp32 summation error. Then timed (not emulated): today's three gradients (offsets on the host, and with
 * the offsets' copy + sync first) and the grouped kernel's, in TFLOP/s, and checked against today's at the timing shape.
 *   make dev/cuda/moe_wgrad && ./dev/cuda/moe_wgrad [-s 1b | 132b]
 *   1b:   N 16384 tokens, k 4, E 16, d 1024, F 1792 (dbrx-1b);  132b: N 4096, k 4, E 16, d 6144, F 10752 (DBRX-132B)
 */
#include "common.h"
#include "../../model/moe_grouped_wgrad.cuh"

// the rows of E experts: R rows, expert e getting a share 1 + e % 4 (expert 3 none), the rest to the last
static std::vector<int> make_offsets(int R, int E) {
    std::vector<int> off(E + 1, 0);
    int wsum = 0;
    for (int e = 0; e < E; e++) wsum += e == 3 ? 0 : 1 + e % 4;
    for (int e = 0; e < E; e++) off[e + 1] = e == E - 1 ? R : off[e] + (e == 3 ? 0 : (int)((long long)R * (1 + e % 4) / wsum) - e % 3);
    return off;
}

struct Problem {
    int R, E, d, F;
    std::vector<int> off;
    floatX *dg, *du, *a, *xe, *dye;
    float *dw1, *dv1, *dw2;   // today's
    float *gw1, *gv1, *gw2;   // the grouped kernel's
    int *off_dev, *off_host;
};
static Problem make_problem(int R, int E, int d, int F, std::vector<float>* host) {
    Problem p = {R, E, d, F, make_offsets(R, E), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    std::vector<float> v[5];
    for (int i = 0; i < 5; i++) v[i] = round_bf16(make_random((size_t)R * (i < 3 ? F : d), 1 + i, 1.0));
    p.dg = to_device_bf16v(v[0]); p.du = to_device_bf16v(v[1]); p.a = to_device_bf16v(v[2]); p.xe = to_device_bf16v(v[3]);
    p.dye = to_device_bf16v(v[4]);
    const size_t nw = (size_t)E * F * d;
    for (float** w : {&p.dw1, &p.dv1, &p.dw2, &p.gw1, &p.gv1, &p.gw2}) *w = deviceAlloc(float, nw);
    p.off_dev = to_device(p.off);
    cudaCheck(cudaMallocHost((void**)&p.off_host, (E + 1) * sizeof(int)));
    if (host)
        for (int i = 0; i < 5; i++) host[i] = v[i];
    return p;
}
static void free_problem(Problem& p) {
    for (void* x : {(void*)p.dg, (void*)p.du, (void*)p.a, (void*)p.xe, (void*)p.dye, (void*)p.dw1, (void*)p.dv1, (void*)p.dw2, (void*)p.gw1,
                    (void*)p.gv1, (void*)p.gw2, (void*)p.off_dev})
        cudaCheck(cudaFree(x));
    cudaCheck(cudaFreeHost(p.off_host));
}

// today's weight-gradient GEMMs, as experts_backward_gpu issues them (the offsets copied to the host first when sync),
// an empty expert zeroed when beta is 0 (block_experts_backward's experts_zero_empty_kernel; a memset here)
static void run_today(Problem& p, float beta, bool sync) {
    if (sync) {
        cudaCheck(cudaMemcpyAsync(p.off_host, p.off_dev, (p.E + 1) * sizeof(int), cudaMemcpyDeviceToHost, 0));
        cudaCheck(cudaStreamSynchronize(0));
    }
    long long sd, sg;
    bool swap;
    bool pair = pair_strides(p.dg, p.du, sizeof(floatX), p.dw1, p.dv1, sizeof(float), &sd, &sg, &swap);
    const int F = p.F, C = p.d;
    for (int e = 0; e < p.E; e++) {
        int r0 = p.off[e], n = p.off[e + 1] - p.off[e];
        size_t wo = (size_t)e * F * C;
        if (n == 0) {
            for (float* w : {p.dw1, p.dv1, p.dw2})
                if (beta == 0.0f) cudaCheck(cudaMemsetAsync(w + wo, 0, (size_t)F * C * sizeof(float), 0));
            continue;
        }
        gemm_gpu(true, false, F, C, n, 1.0f, p.a + (size_t)r0 * F, F, p.dye + (size_t)r0 * C, C, beta, p.dw2 + wo, C);
        if (pair) {
            gemm_gpu_batched(true, false, F, C, n, 1.0f, (swap ? p.du : p.dg) + (size_t)r0 * F, F, sd, p.xe + (size_t)r0 * C, C, 0, beta,
                             (swap ? p.dv1 : p.dw1) + wo, C, sg, 2);
            continue;
        }
        gemm_gpu(true, false, F, C, n, 1.0f, p.dg + (size_t)r0 * F, F, p.xe + (size_t)r0 * C, C, beta, p.dw1 + wo, C);
        gemm_gpu(true, false, F, C, n, 1.0f, p.du + (size_t)r0 * F, F, p.xe + (size_t)r0 * C, C, beta, p.dv1 + wo, C);
    }
}
static void run_grouped(Problem& p, float beta) {
    experts_wgrad_grouped_all_gpu(p.gw1, p.gv1, p.gw2, p.dg, p.du, p.a, p.xe, p.dye, p.off_dev, p.R, p.E, p.d, p.F, beta);
}

// dW_e = X_e^T Y_e (+ init) in double on the host
static std::vector<float> cpu_wgrad(const std::vector<float>& X, const std::vector<float>& Y, const std::vector<int>& off, int E, int M, int N,
                                    const std::vector<float>* init) {
    std::vector<double> acc((size_t)E * M * N, 0.0);
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int m = 0; m < M; m++) {
                double x = X[(size_t)r * M + m];
                for (int j = 0; j < N; j++) acc[((size_t)e * M + m) * N + j] += x * Y[(size_t)r * N + j];
            }
    std::vector<float> out(acc.size());
    for (size_t i = 0; i < acc.size(); i++) out[i] = (float)(acc[i] + (init ? (*init)[i] : 0.0f));
    return out;
}

// the three gradients of both paths, beta 0 then beta 1 on top, against the CPU and each other (emulated: bit for bit)
static void validate_small() {
    const int R = 1024, E = 16, d = 256, F = 256;
    std::vector<float> h[5];
    Problem p = make_problem(R, E, d, F, h);
    const size_t nw = (size_t)E * F * d;
    const double rt = EMULATED ? 0 : 1e-4, at = EMULATED ? 0 : 1e-5;
    const char* names[3] = {"dw1", "dv1", "dw2"};
    std::vector<float> first[3];
    char what[96];
    for (float beta : {0.0f, 1.0f}) {
        run_today(p, beta, true);
        run_grouped(p, beta);
        float* today[3] = {p.dw1, p.dv1, p.dw2};
        float* grouped[3] = {p.gw1, p.gv1, p.gw2};
        for (int k = 0; k < 3; k++) {
            std::vector<float> cpu = cpu_wgrad(h[k], k < 2 ? h[3] : h[4], p.off, E, F, d, beta != 0.0f ? &first[k] : nullptr);
            std::vector<float> t = from_device_f32(today[k], nw), g = from_device_f32(grouped[k], nw);
            snprintf(what, sizeof what, "beta %g %s: today vs the CPU", beta, names[k]); validate(what, t, cpu, 1e-4, 1e-5);
            snprintf(what, sizeof what, "beta %g %s: grouped vs the CPU", beta, names[k]); validate(what, g, cpu, 1e-4, 1e-5);
            snprintf(what, sizeof what, "beta %g %s: grouped vs today's", beta, names[k]); validate(what, g, t, rt, at);
            first[k] = t;
        }
    }
    free_problem(p);
}

int main(int argc, char** argv) {
    MoeShape sh;
    if (!moe_bench_start(argc, argv, "moe grouped weight gradients (wgmma, TMA)", "d 256, F 256", &sh)) return 2;
    const int N = sh.N, k = sh.k, E = sh.E, d = sh.d, F = sh.F;
    validate_small();
    if (!EMULATED) {
        Problem p = make_problem(N * k, E, d, F, nullptr);
        const double flops = 3.0 * 2.0 * p.R * F * d;
        const size_t nw = (size_t)E * F * d;
        for (float beta : {0.0f, 1.0f}) {
            char what[96];
            snprintf(what, sizeof what, "today, beta %g: offsets on the host", beta);
            report_flops(what, flops, time_ms(10, [&] { run_today(p, beta, false); }));
            snprintf(what, sizeof what, "today, beta %g: sync + copy first", beta);
            report_flops(what, flops, time_ms(10, [&] { run_today(p, beta, true); }));
            snprintf(what, sizeof what, "grouped 128 x 256, beta %g", beta);
            report_flops(what, flops, time_ms(10, [&] { run_grouped(p, beta); }));
        }
        run_today(p, 0.0f, false);   // (beta 0: both from scratch, comparable)
        run_grouped(p, 0.0f);
        validate("timing shape: dw1 vs today's", from_device_f32(p.gw1, nw), from_device_f32(p.dw1, nw), 1e-3, 1e-5);
        validate("timing shape: dv1 vs today's", from_device_f32(p.gv1, nw), from_device_f32(p.dv1, nw), 1e-3, 1e-5);
        validate("timing shape: dw2 vs today's", from_device_f32(p.gw2, nw), from_device_f32(p.dw2, nw), 1e-3, 1e-5);
        free_problem(p);
    }
    return finish();
}
