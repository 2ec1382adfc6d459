/*
 * adamw.cu — the optimizer step over n parameters and the global gradient norm:
 *   AdamW v1  grid-stride, scalar, one tensor (the model's adamw_update_gpu: dbrx_update)
 *   AdamW v2  grid-stride over float4 (the last n % 4 by v1)
 *   AdamW v3  the store's segment table, scalar, then the gradient zeroed by a memset (the store's step before
 *             issue 25: adamw_multi_kernel)
 *   AdamW v4  the fused pass (model: adamw_fused_kernel): the segment table, 8 elements a thread with 16-byte
 *             accesses, the 1/W factor and the clipping applied as g is read, the gradient zeroed in the same pass
 *   AdamW v5  v4 with the moments in BF16 (--adam-moments bf16, model: adamw_fused_bf16_moments_kernel): 26 B
 *   LionW v6  v4's pass with LionW's update (--optimizer lion, model: lion_fused_kernel): m alone, 26 B with the zeroing
 *   norm  v1  scalar, 256 blocks of 512 threads (the model's before issue 25)
 *   norm  v2  256 blocks of 128 threads, 4 virtual threads each, 16-byte loads (model: grad_norm_partials_kernel):
 *             the same partial sums as v1, bit for bit (checked here)
 * Bytes per parameter: AdamW v1-v3 g 4 + m, v, master 3 x (4 read + 4 write) + bf16 copy 2 = 30 B; v4 the same +
 * the gradient's zero 4 = 34 B; the norm 4 B. The optimizer step (norm + AdamW + zeroing) is 38 B either way:
 * before v1 + v3 + memset, now v2 + v4.
 *   make dev/cuda/adamw && ./dev/cuda/adamw [-v N] [-n N]   (-v: only AdamW version N, 0 all; n = 2^28 by
 *   default: 1 GiB per fp32 array, far beyond L2)
 *   ./dev/cuda/adamw -o   AdamW v4 beside a layer's expert GEMMs, at stream priorities and CTA caps (overlap_probe below)
 */
#include <algorithm>
#include <cstring>
#include "common.h"
#include "../../model/adamw.cuh"
#include "../../model/matmul.cuh"

__global__ void adamw_v2(float4* param, floatX* param_bf16, const float4* grad, float4* m, float4* v, size_t n4, float lr,
                         float beta1, float beta2, float eps, float wd, float grad_scale, float bc1, float bc2) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 g = grad[i], mi = m[i], vi = v[i], p = param[i];
        float gv[4] = {g.x, g.y, g.z, g.w}, mv[4] = {mi.x, mi.y, mi.z, mi.w}, vv[4] = {vi.x, vi.y, vi.z, vi.w}, pv[4] = {p.x, p.y, p.z, p.w};
        for (int j = 0; j < 4; j++) {
            pv[j] = adamw_math(gv[j] * grad_scale, &mv[j], &vv[j], pv[j], lr, beta1, beta2, eps, wd, bc1, bc2);
            param_bf16[4 * i + j] = __float2bfloat16(pv[j]);
        }
        m[i] = make_float4(mv[0], mv[1], mv[2], mv[3]);
        v[i] = make_float4(vv[0], vv[1], vv[2], vv[3]);
        param[i] = make_float4(pv[0], pv[1], pv[2], pv[3]);
    }
}

// the store's kernel before the fused one: block (x, y) strides over segment y, one element a thread
__global__ void adamw_v3(float* param, floatX* param_bf16, const float* grad, float* m, float* v, const size_t* seg_off, const size_t* seg_n,
                         const int* seg_mode, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, float bc1,
                         float bc2) {
    size_t off = seg_off[blockIdx.y], n = seg_n[blockIdx.y];
    if (seg_mode[blockIdx.y] == ADAMW_ZERO_ONLY) return;
    float wd = seg_mode[blockIdx.y] == ADAMW_DECAY ? weight_decay : 0.0f;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        adamw_element(param, param_bf16, grad, m, v, off + j, lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2);
}

// the gradient norm's partials before: thread t of block b sums grad[i]^2 over i = b 512 + t + k 256 512
__global__ void grad_norm_v1(float* partial, const float* grad, size_t n) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += grad[i] * grad[i];
    float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// -o: AdamW beside the forward's GEMMs. Issue 25: dbrx-1b's step spends 11 ms of its ~89 in AdamW (its 30 B a
// parameter: at the floor), while its forward and backward alone run at ~45% MFU; the optimizer of step t could run
// under step t + 1's forward, a unit ahead of it, if the GPU ran the two side by side. Not built, because whether it
// does is unknown: cuBLASLt's Hopper GEMMs hold a whole SM each (registers, shared memory), so AdamW's blocks may only
// get the SMs between GEMMs and in their last waves, and the model's stream 0 has CUDA's least priority, so the
// optimizer could not be put below it. This measures it: one dbrx-1b layer's expert forward (E experts x rows: g and u
// = x w1^T, x v1^T, then g w2, as cuBLASLt GEMMs) on a stream of the greatest priority, and the model's fused AdamW
// over one layer's parameters (FP32 moments; its gradient kept) issued first on a stream of the least priority, at the
// product's grid and at C = 8, 16, 32 CTAs (the kernel strides over its segment), then the same with both streams of
// one priority (what the model's streams would be: stream 0 has the least). Each prints the GEMMs' time, AdamW's and both's against the two alone, and the share of
// AdamW hidden: (GEMMs alone + AdamW alone - both) / AdamW alone. Emulated (2 experts of 64 rows, d 64, F 96; 100003
// parameters): AdamW issued beside the GEMMs gives the CPU's update.
static int overlap_probe() {
    const int E = EMULATED ? 2 : 16, rows = EMULATED ? 64 : 4096, d = EMULATED ? 64 : 1024, F = EMULATED ? 96 : 1792;
    const size_t n = EMULATED ? 100003 : (size_t)91 << 20, er = (size_t)E * rows;
    char shape[112];
    snprintf(shape, sizeof shape, "experts %d x %d rows, d %d, F %d; AdamW over %zu parameters", E, rows, d, F, n);
    print_header("AdamW beside the expert GEMMs (the optimizer under the next forward)", shape);
    floatX *x = to_device_bf16v(round_bf16(make_random(er * d, 1))), *w1 = to_device_bf16v(round_bf16(make_random((size_t)E * F * d, 2, 0.02)));
    floatX *v1 = to_device_bf16v(round_bf16(make_random((size_t)E * F * d, 3, 0.02))), *w2 = to_device_bf16v(round_bf16(make_random((size_t)E * F * d, 4, 0.02)));
    floatX *g = deviceAlloc(floatX, er * F), *u = deviceAlloc(floatX, er * F), *ye = deviceAlloc(floatX, er * d);
    int least = 0, greatest = 0;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t hi, lo, same;   // the GEMMs' (greatest priority), AdamW's (least), AdamW's at the GEMMs' priority
    cudaCheck(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));
    cudaCheck(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, least));
    cudaCheck(cudaStreamCreateWithPriority(&same, cudaStreamNonBlocking, greatest));
    auto gemms = [&](cudaStream_t s) {
        for (int e = 0; e < E; e++) {
            const size_t xo = (size_t)e * rows * d, ho = (size_t)e * rows * F, wo = (size_t)e * F * d;
            gemm_gpu(false, true, rows, F, d, 1.0f, x + xo, d, w1 + wo, d, 0.0f, g + ho, F, s);
            gemm_gpu(false, true, rows, F, d, 1.0f, x + xo, d, v1 + wo, d, 0.0f, u + ho, F, s);
            gemm_gpu(false, false, rows, d, F, 1.0f, g + ho, F, w2 + wo, d, 0.0f, ye + xo, d, s);
        }
    };
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f;
    const int t = 3;
    const float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
    std::vector<float> hg = make_random(n, 5, 0.01), hp = make_random(n, 6, 0.02), hm = make_random(n, 7, 1e-3), hv = make_random(n, 8, 1e-3);
    for (float& a : hv) a = a * a;
    float *dg = to_device(hg), *dp = to_device(hp), *dm = to_device(hm), *dv = to_device(hv);
    floatX* dp16 = deviceAlloc(floatX, n);
    AdamwSegments tab = adamw_segments({{0, n, 1}}, n);
    size_t *doff = to_device(tab.off), *dn = to_device(tab.n);
    int* dmode = to_device(tab.mode);
    const int vec = aligned16({dp, dp16, dg, dm, dv});
    auto adamw = [&](cudaStream_t s, int ctas) {   // ctas 0: the product's grid; the gradient kept (clear_grad 0)
        if (!ctas) adamw_fused_update_gpu(dp, dp16, dg, dm, dv, doff, dn, dmode, 1, tab.max_n, lr, b1, b2, eps, wd, 1.0f, scale, t, s, 0, 0);
        else LAUNCH(adamw_fused_kernel, dim3(ctas, 1), 256, 0, s, dp, dp16, dg, dm, dv, doff, dn, dmode, vec, lr, b1, b2, eps, wd, 1.0f,
                    scale, bc1, bc2, (size_t)0, 0);
    };
    cudaEvent_t e0, eg, ea;
    for (cudaEvent_t* e : {&e0, &eg, &ea}) cudaCheck(cudaEventCreate(e));
    // one run: AdamW on sa (ctas; -1: none) issued first, then the GEMMs on hi (unless !with_gemms); ms of each and of both
    auto run = [&](cudaStream_t sa, int ctas, bool with_gemms, float ms[3]) {
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaEventRecord(e0, hi));
        cudaCheck(cudaStreamWaitEvent(sa, e0, 0));
        if (ctas >= 0) adamw(sa, ctas);
        if (with_gemms) gemms(hi);
        cudaCheck(cudaEventRecord(eg, hi));
        cudaCheck(cudaEventRecord(ea, sa));
        cudaCheck(cudaDeviceSynchronize());
        ms[0] = ms[1] = ms[2] = 0;
        if (!EMULATED) {
            cudaCheck(cudaEventElapsedTime(&ms[0], e0, eg));
            cudaCheck(cudaEventElapsedTime(&ms[1], e0, ea));
            ms[2] = std::max(ms[0], ms[1]);
        }
    };
    auto median = [&](cudaStream_t sa, int ctas, bool with_gemms, float out[3]) {   // of 5 runs, each column apart
        std::vector<float> c[3];
        for (int r = 0; r < (EMULATED ? 1 : 5); r++) {
            float ms[3];
            run(sa, ctas, with_gemms, ms);
            for (int i = 0; i < 3; i++) c[i].push_back(ms[i]);
        }
        for (int i = 0; i < 3; i++) { std::sort(c[i].begin(), c[i].end()); out[i] = c[i][c[i].size() / 2]; }
    };
    // AdamW issued beside the GEMMs (capped at 16 CTAs, at the least priority) updates as the CPU does
    std::vector<float> p = hp, m = hm, v = hv;
    adamw_update(p.data(), hg.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, scale, t);
    float ms[3];
    run(lo, 16, true, ms);
    validate("AdamW (16 CTAs) beside the GEMMs = the CPU's update", from_device_f32(dp, n), p, 1e-5, 1e-7);
    validate("  m", from_device_f32(dm, n), m, 1e-5, 1e-7);
    validate("  bf16 copy = round(master)", from_device_bf16v(dp16, n), round_bf16(from_device_f32(dp, n)), 0, 0);
    float gem[3], alone[3];
    median(lo, -1, true, gem);    // the GEMMs alone
    median(lo, 0, false, alone);  // AdamW alone, the product's grid
    if (!EMULATED) printf("  the GEMMs alone %.3f ms; AdamW alone (the product's grid) %.3f ms, %.0f GB/s\n", gem[0], alone[1],
                          30.0 * n / (alone[1] * 1e-3) / 1e9);
    struct Case { const char* name; cudaStream_t s; int ctas; };
    const Case cases[8] = {{"least priority, the product's grid", lo, 0}, {"least priority, 8 CTAs", lo, 8},
                           {"least priority, 16 CTAs", lo, 16}, {"least priority, 32 CTAs", lo, 32},
                           {"the GEMMs' priority, the product's grid", same, 0}, {"the GEMMs' priority, 8 CTAs", same, 8},
                           {"the GEMMs' priority, 16 CTAs", same, 16}, {"the GEMMs' priority, 32 CTAs", same, 32}};
    for (const Case& c : cases) {
        float a[3], both[3];
        median(c.s, c.ctas, false, a);   // this AdamW alone
        median(c.s, c.ctas, true, both);
        if (!EMULATED)
            printf("  AdamW at %-40s alone %7.3f ms | beside: GEMMs %7.3f ms (%.2f x), AdamW ends %7.3f, both %7.3f ms: %5.1f%% of "
                   "AdamW (the product's grid) hidden\n", c.name, a[1], both[0], both[0] / gem[0], both[1], both[2],
                   100.0 * (gem[0] + alone[1] - both[2]) / alone[1]);
    }
    for (cudaEvent_t e : {e0, eg, ea}) cudaCheck(cudaEventDestroy(e));
    for (cudaStream_t st : {hi, lo, same}) cudaCheck(cudaStreamDestroy(st));
    for (void* q : {(void*)x, (void*)w1, (void*)v1, (void*)w2, (void*)g, (void*)u, (void*)ye, (void*)dg, (void*)dp, (void*)dm, (void*)dv,
                    (void*)dp16, (void*)doff, (void*)dn, (void*)dmode})
        cudaCheck(cudaFree(q));
    return finish();
}

int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "-o")) return overlap_probe();
    size_t n = EMULATED ? 100003 : ((size_t)1 << 28);
    int only = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        long long x = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "-v") && x >= 0 && x <= 6) only = (int)x;
        else if (!strcmp(argv[i], "-n") && x > 0) n = (size_t)x;
        else { fprintf(stderr, "usage: %s [-v N (0-6)] [-n N (> 0)] | -o (AdamW beside the expert GEMMs)\n", argv[0]); return 2; }
    }
    char shape[64];
    snprintf(shape, sizeof shape, "n %zu", n);
    print_header("adamw", shape);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f;
    const int t = 3;
    std::vector<float> g = make_random(n, 1, 0.01), p0 = make_random(n, 2, 0.02), m0 = make_random(n, 3, 1e-3), v0 = make_random(n, 4, 1e-3);
    for (float& x : v0) x = x * x;
    float *dg = to_device(g), *dp = to_device(p0), *dm = to_device(m0), *dv = to_device(v0);
    float *partial = deviceAlloc(float, GRAD_NORM_SCRATCH), *partial1 = deviceAlloc(float, GRAD_NORM_BLOCKS);
    floatX* dp16 = deviceAlloc(floatX, n);

    // the norm: v2's partials = v1's, bit for bit; their sum against the CPU
    LAUNCH(grad_norm_v1, GRAD_NORM_BLOCKS, 512, 0, 0, partial1, dg, n);
    double want = grad_sumsq(g.data(), n), got = grad_sumsq_gpu(dg, n, partial);
    validate("norm v2 partials = v1's (bits)", from_device_f32(partial, GRAD_NORM_BLOCKS), from_device_f32(partial1, GRAD_NORM_BLOCKS), 0, 0);
    validate("grad norm^2 (model)", {(float)got}, {(float)want}, 1e-5, 0);
    report_bandwidth("norm v1 (scalar)", 4.0 * n, time_ms(10, [&] { LAUNCH(grad_norm_v1, GRAD_NORM_BLOCKS, 512, 0, 0, partial1, dg, n); }));
    report_bandwidth("norm v2 (model, 16 B)", 4.0 * n, time_ms(10, [&] { grad_norm_partials_gpu(partial, dg, n, 1.0f, 0); }));

    // AdamW: one matrix segment over all n, against the CPU reference
    std::vector<float> p = p0, m = m0, v = v0;
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, scale, t);
    float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
    AdamwSegments tab = adamw_segments({{0, n, 1}}, n);
    size_t *doff = to_device(tab.off), *dn = to_device(tab.n);
    int* dmode = to_device(tab.mode);
    int nseg = (int)tab.off.size();
    std::function<void()> versions[4] = {
        [&] { adamw_update_gpu(dp, dp16, dg, dm, dv, n, lr, b1, b2, eps, wd, scale, t); },
        [&] {
            size_t n4 = n / 4;
            if (n4) LAUNCH(adamw_v2, (int)std::min<size_t>((n4 + 255) / 256, 4096), 256, 0, 0, (float4*)dp, dp16, (const float4*)dg,
                           (float4*)dm, (float4*)dv, n4, lr, b1, b2, eps, wd, scale, bc1, bc2);
            adamw_update_gpu(dp + 4 * n4, dp16 + 4 * n4, dg + 4 * n4, dm + 4 * n4, dv + 4 * n4, n - 4 * n4, lr, b1, b2, eps, wd, scale, t);
        },
        [&] {
            int bx = (int)std::max<size_t>(1, std::min<size_t>((tab.max_n + 255) / 256, 512));
            LAUNCH(adamw_v3, dim3(bx, nseg), 256, 0, 0, dp, dp16, dg, dm, dv, doff, dn, dmode, lr, b1, b2, eps, wd, scale, bc1, bc2);
        },
        [&] { adamw_fused_update_gpu(dp, dp16, dg, dm, dv, doff, dn, dmode, nseg, tab.max_n, lr, b1, b2, eps, wd, 1.0f, scale, t); },
    };
    const char* names[4] = {"adamw v1 (model: one tensor)", "adamw v2 (float4)", "adamw v3 (segments, scalar)", "adamw v4 (model: fused)"};
    const double bytes[4] = {30, 30, 30, 34};
    std::vector<float> master3;
    for (int ver = 0; ver < 4; ver++) {
        if (only && only != ver + 1) continue;
        cudaCheck(cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dp, p0.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dm, m0.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dv, v0.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(dp16, 0xFF, n * sizeof(floatX)));
        versions[ver]();
        std::vector<float> master = from_device_f32(dp, n);
        validate(names[ver], master, p, 1e-5, 1e-7);
        validate("  m", from_device_f32(dm, n), m, 1e-5, 1e-7);
        validate("  v", from_device_f32(dv, n), v, 1e-5, 1e-7);
        validate("  bf16 copy = round(master)", from_device_bf16v(dp16, n), round_bf16(master), 0, 0);
        if (ver == 2) master3 = master;
        if (ver == 3) {
            validate("  gradient zeroed", from_device_f32(dg, n), std::vector<float>(n, 0.0f), 0, 0);
            if (!master3.empty()) validate("  master = v3's (bits)", master, master3, 0, 0);
        }
        report_bandwidth(names[ver], bytes[ver] * n, time_ms(10, versions[ver]));
    }
    // AdamW v5: v4 with BF16 moments, against the CPU's update with moments_bf16 (the same BF16 numbers, but where an FP32
    // value lies within an ulp of a rounding boundary: 1 BF16 ulp, 2^-7 relative at most)
    if (!only || only == 5) {
        std::vector<float> m16 = round_bf16(m0), v16 = round_bf16(v0), p5 = p0, m5 = m16, v5 = v16;
        adamw_update(p5.data(), g.data(), m5.data(), v5.data(), n, lr, b1, b2, eps, wd, scale, t, 1);
        floatX *dm16 = deviceAlloc(floatX, n), *dv16 = deviceAlloc(floatX, n);
        auto v5run = [&] { adamw_fused_update_gpu(dp, dp16, dg, NULL, NULL, doff, dn, dmode, nseg, tab.max_n, lr, b1, b2, eps, wd, 1.0f,
                                                  scale, t, 0, 0, 1, dm16, dv16); };
        cudaCheck(cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dp, p0.data(), n * 4, cudaMemcpyHostToDevice));
        to_device_bf16(dm16, m16.data(), n);
        to_device_bf16(dv16, v16.data(), n);
        v5run();
        validate("adamw v5 (model: fused, BF16 moments)", from_device_f32(dp, n), p5, 1e-5, 1e-7);
        validate("  m (BF16, within an ulp)", from_device_bf16v(dm16, n), m5, 1.0 / 128, 0);
        validate("  v (BF16, within an ulp)", from_device_bf16v(dv16, n), v5, 1.0 / 128, 0);
        validate("  gradient zeroed", from_device_f32(dg, n), std::vector<float>(n, 0.0f), 0, 0);
        report_bandwidth("adamw v5 (model: fused, BF16 moments)", 26.0 * n, time_ms(10, v5run));
        cudaCheck(cudaFree(dm16)); cudaCheck(cudaFree(dv16));
    }
    // LionW v6: the fused pass with LionW's update, against the CPU's lion_update (the same expressions: bit for bit)
    if (!only || only == 6) {
        std::vector<float> p6 = p0, m6 = m0;
        lion_update(p6.data(), g.data(), m6.data(), n, lr, b1, b2, wd, scale);
        auto v6run = [&] { adamw_fused_update_gpu(dp, dp16, dg, dm, NULL, doff, dn, dmode, nseg, tab.max_n, lr, b1, b2, eps, wd, 1.0f,
                                                  scale, t, 0, 0, 1, NULL, NULL, 1); };
        cudaCheck(cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dp, p0.data(), n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(dm, m0.data(), n * 4, cudaMemcpyHostToDevice));
        v6run();
        validate("lionw v6 (model: fused, --optimizer lion)", from_device_f32(dp, n), p6, 0, 0);
        validate("  m", from_device_f32(dm, n), m6, 0, 0);
        validate("  gradient zeroed", from_device_f32(dg, n), std::vector<float>(n, 0.0f), 0, 0);
        report_bandwidth("lionw v6 (model: fused, --optimizer lion)", 26.0 * n, time_ms(10, v6run));
    }
    // the whole optimizer step over the shard's gradient (38 B per parameter both ways)
    if (!only) {
        report_bandwidth("step before (norm v1, v3, memset)", 38.0 * n, time_ms(10, [&] {
            LAUNCH(grad_norm_v1, GRAD_NORM_BLOCKS, 512, 0, 0, partial1, dg, n);
            versions[2]();
            cudaCheck(cudaMemsetAsync(dg, 0, n * sizeof(float), 0));
        }));
        report_bandwidth("step now (norm v2, v4)", 38.0 * n, time_ms(10, [&] {
            grad_norm_partials_gpu(partial, dg, n, 1.0f, 0);
            versions[3]();
        }));
    }
    return finish();
}
