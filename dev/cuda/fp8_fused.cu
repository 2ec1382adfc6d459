/*
 * fp8_fused.cu — FP8 block quantisation fused into SwiGLU (model/fp8_fused.cuh) against the unfused pair the model
 * ran before (a SwiGLU kernel writing BF16, then fp8_quantize_kernel reading it back), on the routed rows of the
 * experts (E segments of R / E rows, F columns; E4M3 forward, E5M2 backward):
 *   forward   v1: swiglu_forward_gpu + fp8_quantize_kernel<FP8Q_ACT> (act's row-wise codes)
 *             v2: fp8_swiglu_quantize_kernel<FP8Q_ACT> (model): act in BF16 and its codes in one pass
 *   backward  v1: swiglu_backward_gpu + fp8_quantize_kernel<FP8Q_ACT> twice (dg, du: codes and transposed codes),
 *                 and once on the forward's act (its transposed codes: w2's weight gradient)
 *             v2: fp8_swiglu_bwd_quantize_kernel<FP8Q_ACT> with two outputs: the codes of dg and du, no BF16 dg / du
 *                 (act still quantised by fp8_quantize_kernel, as v1)
 *             v3: fp8_swiglu_bwd_quantize_kernel<FP8Q_ACT> with three outputs (model): act recomputed from g, u, its
 *                 transposed codes a third output
 *   gather    v1: moe_gather_gpu + fp8_quantize_kernel<FP8Q_ACT> (xe's row-wise codes, w1's forward operand)
 *             v2: fp8_gather_quantize_kernel<FP8Q_ACT> (model): xe in BF16 and its codes in one pass
 *   as it is  v1: fp8_quantize_kernel<FP8Q_ACT> on a BF16 tensor (R x d, E5M2: dye's codes and transposed codes)
 *             v2: fp8_gather_quantize_kernel<FP8Q_ACT> without idx and y (model): 16-byte stores
 *   weight^T  dgrad's operand W^T of a block weight (E experts of F rows, d columns, 128x128 blocks), its transposed codes
 *             and factors
 *             v1: fp8_gather_quantize_kernel<FP8Q_WEIGHT> of the BF16 weight (the model's per-use quantisation before
 *                 session 56, and where the weights are not gathered as codes)
 *             v2: fp8_transpose_kernel of the weight's codes, one byte an access, + fp8_transpose_factors_kernel
 *             v3: fp8_transpose16_kernel, 16 bytes an access (model: --fp8-gather's codes used as they are)
 * v2, v3 are validated against v1 bit for bit (codes, factors, act, xe). GB/s are for the bytes each version must move.
 *   make dev/cuda/fp8_fused && ./dev/cuda/fp8_fused        (R 65536 = 16384 tokens x top-4, E 16, F 1792, d 1024:
 *                                                           dbrx-1b)
 */
#include "common.h"
#include "../../model/fp8_fused.cuh"

static std::vector<float> codes_of(const __nv_fp8_storage_t* p, size_t n) {
    std::vector<__nv_fp8_storage_t> c(n);
    cudaCheck(cudaMemcpy(c.data(), p, n, cudaMemcpyDeviceToHost));
    return std::vector<float>(c.begin(), c.end());
}

// the gather and the quantisation of a BF16 tensor as it is, on R routed rows of d columns (E segments of R / E rows)
static void gather_versions(const Fp8Segments& seg, int R, int E) {
    const int d = EMULATED ? 144 : 1024, N = R / 4;   // (top-4: every token in 4 rows)
    const size_t n = (size_t)R * d, nq = (size_t)((d + 127) / 128) * R, nt = (size_t)seg.row_tiles * d;
    std::vector<int> rt(R);
    for (int r = 0; r < R; r++) rt[r] = (int)(((long long)r * 7919 + E) % N);
    int* row_token = deviceAlloc(int, R);
    cudaCheck(cudaMemcpy(row_token, rt.data(), R * sizeof(int), cudaMemcpyHostToDevice));
    floatX *x = to_device_bf16v(make_random((size_t)N * d, 4)), *xe = deviceAlloc(floatX, n), *dye = to_device_bf16v(make_random(n, 5, 1e-3));
    Fp8QuantOut o = {deviceAlloc(__nv_fp8_storage_t, n), deviceAlloc(__nv_fp8_storage_t, n), deviceAlloc(float, nq), deviceAlloc(float, nt), nullptr, nullptr};
    Fp8QuantOut oq = o;
    oq.qt = nullptr;
    oq.sinv_t = nullptr;
    const Fp8FusedOut fq = {nullptr, nullptr, oq}, fo = {nullptr, nullptr, o};
    std::function<void()> run[4] = {
        [&] { moe_gather_gpu(xe, x, row_token, R, d); fp8_quantize_gpu(oq, xe, R, d, seg, FP8_E4M3, FP8Q_ACT, nullptr, nullptr, 0); },
        [&] { fp8_fused_quantize_gpu(FP8P_GATHER, {x, nullptr, nullptr, xe, row_token}, R, d, seg, FP8_E4M3, FP8Q_ACT, 0, fq, fq); },
        [&] { fp8_quantize_gpu(o, dye, R, d, seg, FP8_E5M2, FP8Q_ACT, nullptr, nullptr, 0); },
        [&] { fp8_fused_quantize_gpu(FP8P_GATHER, {dye, nullptr, nullptr, nullptr, nullptr}, R, d, seg, FP8_E5M2, FP8Q_ACT, 0, fo, fo); },
    };
    const char* name[4] = {"gather + quantize v1 (unfused)", "gather + quantize v2 (fused, model)", "quantize as it is v1 (fp8_quantize_kernel)",
                           "quantize as it is v2 (16-byte stores, model)"};
    // bytes: x's rows (R of them, gathered), row_token, xe written (and read back: v1), the codes, the factors
    const double bytes[4] = {n * (2.0 + 2 + 2 + 1) + 4.0 * R + 4.0 * nq, n * (2.0 + 2 + 1) + 4.0 * R + 4.0 * nq, n * (2.0 + 2) + 4.0 * (nq + nt),
                             n * (2.0 + 2) + 4.0 * (nq + nt)};
    std::vector<float> ref[3];
    for (int v = 0; v < 4; v++) {
        cudaCheck(cudaMemset(o.q, 0xFF, n));
        cudaCheck(cudaMemset(o.qt, 0xFF, n));
        cudaCheck(cudaMemset(xe, 0xFF, n * sizeof(floatX)));
        run[v]();
        std::vector<float> got[3] = {codes_of(o.q, n), v < 2 ? from_device_bf16v(xe, n) : codes_of(o.qt, n), from_device_f32(o.sinv, nq)};
        if (v % 2 == 0) for (int k = 0; k < 3; k++) ref[k] = got[k];
        validate(name[v], got[0], ref[0], 0, 0);
        validate(v < 2 ? "  its xe (BF16)" : "  its transposed codes", got[1], ref[1], 0, 0);
        validate("  its factors", got[2], ref[2], 0, 0);
        report_bandwidth(name[v], bytes[v], time_ms(20, run[v]));
    }
}

// dgrad's W^T of a block weight (E experts of F rows, d columns): from the BF16 weight, or from its codes
static void weight_versions(int E, int F) {
    const int d = EMULATED ? 144 : 1024, rows = E * F;
    const size_t n = (size_t)rows * d;
    Fp8Segments seg = fp8_uniform_segments(E, F);
    const size_t nq = (size_t)E * ((F + 127) / 128) * (((d + 127) / 128 + 3) / 4 * 4), nt = (size_t)E * ((d + 127) / 128) * (((F + 127) / 128 + 3) / 4 * 4);
    floatX* w = to_device_bf16v(make_random(n, 6, 0.02));
    Fp8QuantOut q = {deviceAlloc(__nv_fp8_storage_t, n), nullptr, deviceAlloc(float, nq), nullptr, nullptr, nullptr};
    Fp8QuantOut t = {nullptr, deviceAlloc(__nv_fp8_storage_t, n), nullptr, deviceAlloc(float, nt), nullptr, nullptr};
    const Fp8FusedOut fq = {nullptr, nullptr, q}, ft = {nullptr, nullptr, t};
    fp8_fused_quantize_gpu(FP8P_GATHER, {w, nullptr, nullptr, nullptr, nullptr}, rows, d, seg, FP8_E4M3, FP8Q_WEIGHT, 0, fq, fq);   // the codes
    std::function<void()> run[3] = {
        [&] { fp8_fused_quantize_gpu(FP8P_GATHER, {w, nullptr, nullptr, nullptr, nullptr}, rows, d, seg, FP8_E4M3, FP8Q_WEIGHT, 0, ft, ft); },
        [&] {
            LAUNCH(fp8_transpose_kernel, dim3(ceil_div(d, FP8T_TILE), ceil_div(rows, FP8T_TILE)), FP8T_THREADS, 0, 0, t.qt, q.q, rows, d);
            LAUNCH(fp8_transpose_factors_kernel, ceil_div((int)(E * ((F + 127) / 128) * ((d + 127) / 128)), 256), 256, 0, 0, t.sinv_t, q.sinv, E, F, d);
        },
        [&] { fp8_transpose_gpu(t.qt, t.sinv_t, q.q, q.sinv, rows, d, F); },
    };
    const char* name[3] = {"weight^T v1 (quantise the BF16 weight)", "weight^T v2 (transpose its codes, 1 byte)",
                           "weight^T v3 (transpose its codes, 16 bytes; model)"};
    const double bytes[3] = {n * (2.0 + 1), n * 2.0, n * 2.0};   // (and the factors, 4 bytes a 128x128 block)
    std::vector<float> ref[2];
    for (int v = 0; v < 3; v++) {
        cudaCheck(cudaMemset(t.qt, 0xFF, n));
        cudaCheck(cudaMemset(t.sinv_t, 0, nt * sizeof(float)));   // (the padding columns: written by none)
        run[v]();
        std::vector<float> got[2] = {codes_of(t.qt, n), from_device_f32(t.sinv_t, nt)};
        if (v == 0) { ref[0] = got[0]; ref[1] = got[1]; }
        validate(name[v], got[0], ref[0], 0, 0);
        validate("  its factors", got[1], ref[1], 0, 0);
        report_bandwidth(name[v], bytes[v], time_ms(20, run[v]));
    }
}

int main() {
    const int E = EMULATED ? 4 : 16, R = EMULATED ? 4 * 144 : 65536, F = EMULATED ? 272 : 1792;
    char shape[96];
    snprintf(shape, sizeof shape, "R %d, E %d, F %d, block scaling", R, E, F);
    print_header("fp8_fused", shape);
    const size_t n = (size_t)R * F, nct = (F + 127) / 128;
    Fp8Segments seg = fp8_uniform_segments(E, R / E);
    const size_t nq = nct * R, nt = (size_t)seg.row_tiles * F;   // the factors of q (1x128) and qt (128x1)
    floatX *g = to_device_bf16v(make_random(n, 1, 2.0)), *u = to_device_bf16v(make_random(n, 2)), *da = to_device_bf16v(make_random(n, 3, 0.01));
    floatX *act = deviceAlloc(floatX, n), *dgu = deviceAlloc(floatX, 2 * n);
    Fp8QuantOut o[3];
    for (Fp8QuantOut& x : o)
        x = {deviceAlloc(__nv_fp8_storage_t, n), deviceAlloc(__nv_fp8_storage_t, n), deviceAlloc(float, nq), deviceAlloc(float, nt), nullptr, nullptr};
    o[2].q = nullptr;   // act: the transposed codes only
    o[2].sinv = nullptr;
    Fp8FusedOut fo[3] = {{nullptr, nullptr, o[0]}, {nullptr, nullptr, o[1]}, {nullptr, nullptr, o[2]}};
    Fp8QuantOut fwd_out = o[0];
    fwd_out.qt = nullptr;
    fwd_out.sinv_t = nullptr;
    Fp8FusedOut ffo = {nullptr, nullptr, fwd_out};

    // forward
    std::function<void()> fwd[2] = {
        [&] { swiglu_forward_gpu(act, g, u, n); fp8_quantize_gpu(fwd_out, act, R, F, seg, FP8_E4M3, FP8Q_ACT, nullptr, nullptr, 0); },
        [&] { fp8_fused_quantize_gpu(FP8P_SWIGLU_FWD, {g, u, nullptr, act, nullptr}, R, F, seg, FP8_E4M3, FP8Q_ACT, 0, ffo, ffo); },
    };
    const char* fwn[2] = {"swiglu fwd + quantize v1 (unfused)", "swiglu fwd + quantize v2 (fused, model)"};
    std::vector<float> ref_q, ref_s, ref_a;
    for (int v = 0; v < 2; v++) {
        cudaCheck(cudaMemset(o[0].q, 0xFF, n));
        cudaCheck(cudaMemset(act, 0xFF, n * sizeof(floatX)));
        fwd[v]();
        std::vector<float> q = codes_of(o[0].q, n), s = from_device_f32(o[0].sinv, nq), a = from_device_bf16v(act, n);
        if (v == 0) { ref_q = q; ref_s = s; ref_a = a; }
        validate(fwn[v], q, ref_q, 0, 0);
        validate("  its factors", s, ref_s, 0, 0);
        validate("  its act (BF16)", a, ref_a, 0, 0);
        double bytes = v == 0 ? n * (4.0 + 2 + 2 + 1) + 4.0 * nq : n * (4.0 + 2 + 1) + 4.0 * nq;
        report_bandwidth(fwn[v], bytes, time_ms(20, fwd[v]));
    }
    // backward
    auto quantize_act = [&] { fp8_quantize_gpu(o[2], act, R, F, seg, FP8_E4M3, FP8Q_ACT, nullptr, nullptr, 0); };
    std::function<void()> bwd[3] = {
        [&] {
            swiglu_backward_gpu(dgu, dgu + n, da, g, u, n);
            for (int i = 0; i < 2; i++) fp8_quantize_gpu(o[i], dgu + i * n, R, F, seg, FP8_E5M2, FP8Q_ACT, nullptr, nullptr, 0);
            quantize_act();
        },
        [&] { fp8_fused_quantize_gpu(FP8P_SWIGLU_BWD, {da, g, u, nullptr, nullptr}, R, F, seg, FP8_E5M2, FP8Q_ACT, 0, fo[0], fo[1]); quantize_act(); },
        [&] { fp8_fused_quantize_gpu(FP8P_SWIGLU_BWD, {da, g, u, nullptr, nullptr}, R, F, seg, FP8_E5M2, FP8Q_ACT, 0, fo[0], fo[1], 0, &fo[2], FP8_E4M3); },
    };
    const char* bwn[3] = {"swiglu bwd + quantize v1 (unfused)", "swiglu bwd + quantize v2 (fused dg, du)", "swiglu bwd + quantize v3 (fused dg, du, act; model)"};
    std::vector<float> rb[3][4];
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < 3; i++) { if (o[i].q) cudaCheck(cudaMemset(o[i].q, 0xFF, n)); cudaCheck(cudaMemset(o[i].qt, 0xFF, n)); }
        bwd[v]();
        printf("  %s\n", bwn[v]);
        for (int i = 0; i < 3; i++) {
            std::vector<float> got[4] = {i < 2 ? codes_of(o[i].q, n) : std::vector<float>(), codes_of(o[i].qt, n),
                                         i < 2 ? from_device_f32(o[i].sinv, nq) : std::vector<float>(), from_device_f32(o[i].sinv_t, nt)};
            for (int k = 0; k < 4; k++) {
                if (v == 0) rb[i][k] = got[k];
                const char* what[3][4] = {{"  dg codes", "  dg transposed codes", "  dg factors", "  dg transposed factors"},
                                          {"  du codes", "  du transposed codes", "  du factors", "  du transposed factors"},
                                          {"", "  act transposed codes", "", "  act transposed factors"}};
                if (i < 2 || k % 2) validate(what[i][k], got[k], rb[i][k], 0, 0);
            }
        }
        // bytes: da, g, u read; dg, du written and read back (v1); the codes; act read back (v1, v2)
        double bytes = v == 0 ? n * (6.0 + 4 + 2 * (2 + 2) + 2 + 1) : v == 1 ? n * (6.0 + 4 + 2 + 1) : n * (6.0 + 4 + 1);
        report_bandwidth(bwn[v], bytes + 2 * 4.0 * (nq + nt) + 4.0 * nt, time_ms(20, bwd[v]));
    }
    gather_versions(seg, R, E);
    weight_versions(EMULATED ? 2 : E, F);
    return finish();
}
