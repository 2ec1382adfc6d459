/*
 * fp8_experts_cuda.cuh — the MoE experts under FP8 on the GPU, on the padded layout (every expert's rows padded to 16,
 * model/dbrx_fp8_cuda.cuh's Fp8Routing): fp8_experts_forward_gpu and fp8_experts_backward_gpu, the FP8 twins of
 * experts_forward_gpu / experts_backward_gpu (model/moe.cuh). The backward comes in two parts that a caller may run
 * apart, the input gradients and then the weight gradients (the chunked expert-parallel exchange sends the first home
 * before the second runs: parallel/expert_parallel_fp8.cuh). Part of model/dbrx_fp8_cuda.cuh (included from it).
 */
#pragma once

// the experts, on the padded layout: the FP8 twins of experts_forward_gpu / experts_backward_gpu.
// Expert e's rows are poff[e] .. poff[e+1]-1; its weights rows e F .. (e+1) F - 1 of w1, v1, w2.

static inline std::vector<int> fp8_weight_starts(int E, int F) {
    std::vector<int> s(E + 1);
    for (int e = 0; e <= E; e++) s[e] = e * F;
    return s;
}

// xe_src, row_token (or NULL: xe is given): xe (Rp, C) = xe_src[row_token] gathered here, by w1's quantisation itself
// (fp8_gather_quantize_kernel: xe in BF16 and its codes in one pass). xe_codes (with xe_src): in the same pass the
// transposed codes the backward's w1 / v1 weight gradients read go into xe's buffer in place of BF16 xe
// (fp8_xe_codes), so the backward neither reads xe back nor quantises it again; for a layer whose xe nothing else
// reads (not recomputed from it: --recompute swiglu; under expert parallelism xe is the dispatcher's kept rows xl)
static inline void fp8_experts_forward_gpu(Fp8GPU* f, int layer, floatX* ye, floatX* g, floatX* u, floatX* a, floatX* xe,
                                           const floatX* w1, const floatX* v1, const floatX* w2, int E, int C, int F,
                                           cudaStream_t stream = 0, const floatX* xe_src = nullptr, const int* row_token = nullptr,
                                           bool xe_codes = false) {
    Fp8Routing& rt = f->routing[layer];
    const std::vector<int>& p = rt.poff;
    std::vector<int> ws = fp8_weight_starts(E, F);
    int Rp = p[E], EF = E * F;
    Fp8Segments sx = fp8_expert_segments(rt), sw = fp8_uniform_segments(E, F);
    int s_x1 = fp8_slot(f, layer, FP8_LIN_W1, FP8_OP_X), s_w1 = fp8_slot(f, layer, FP8_LIN_W1, FP8_OP_W);
    int s_v1 = fp8_slot(f, layer, FP8_LIN_V1, FP8_OP_W), s_x2 = fp8_slot(f, layer, FP8_LIN_W2, FP8_OP_X);
    int s_w2 = fp8_slot(f, layer, FP8_LIN_W2, FP8_OP_W);
    // up: g_e, u_e (n, F) = xe_e (n, C) @ w1_e, v1_e (F, C)^T
    Fp8Buf xq = f->act;   // (xe_codes: the row-wise codes in the scratch, the transposed ones in xe's buffer)
    Fp8Buf* xb[1] = {&xq};
    rt.xe_codes = false;
    if (xe_src && fp8_fused_ok(Rp, C, rt.len, {xe, xe_src, f->act.q})) {
        if (xe_codes) {
            Fp8Buf t = fp8_xe_codes(f, xe, rt, Rp, C);
            xq.qt = t.qt;
            xq.sinv_t = t.sinv_t;
        }
        fp8_quantize_produced(f, FP8P_GATHER, {xe_src, nullptr, nullptr, xe_codes ? nullptr : xe, row_token}, &s_x1, Rp, C, sx, xb, true,
                              xe_codes, stream);
        rt.xe_codes = xe_codes;
    } else {
        if (xe_src) moe_gather_gpu(xe, xe_src, row_token, Rp, C, stream);
        fp8_quantize_operand(f, s_x1, false, xe, Rp, C, sx, &f->act, true, false, stream);
    }
    const Fp8Buf& qw1 = fp8_weight_gpu(f, layer, FP8_LIN_W1, w1, EF, C, sw, &f->w, true, false, stream);
    const Fp8Buf& qv1 = fp8_weight_gpu(f, layer, FP8_LIN_V1, v1, EF, C, sw, &f->w2, true, false, stream);
    cudaStream_t side = experts_fork(stream);   // (--moe-streams 2: busy experts alternate, joined after each loop; moe.cuh)
    for (int e = 0, busy = 0; e < E; e++) {
        if (rt.len[e] == 0) continue;
        cudaStream_t s = busy++ % 2 ? side : stream;
        Fp8GemmOperand x = fp8_operand_of(f, s_x1, f->act, false, false, p[e], C, fp8_scale_offset(p, e, C, false, false));
        size_t wo = fp8_scale_offset(ws, e, C, true, false);
        gemm_fp8_gpu(rt.len[e], F, C, 1.0f, x, fp8_operand_of(f, s_w1, qw1, true, false, (size_t)e * F, C, wo), 0.0f,
                     g + (size_t)p[e] * F, F, 1, s);
        gemm_fp8_gpu(rt.len[e], F, C, 1.0f, x, fp8_operand_of(f, s_v1, qv1, true, false, (size_t)e * F, C, wo), 0.0f,
                     u + (size_t)p[e] * F, F, 1, s);
    }
    experts_join(stream, side);
    if (!ye) {   // (--recompute swiglu: g, u, and act where the model keeps it)
        if (a) swiglu_forward_gpu(a, g, u, (size_t)Rp * F, stream);
        return;
    }
    // act = silu(g) * u, with w2's operand quantised in the same kernel. The BF16 act is not written (Rp F x 2
    // bytes a layer): its one reader would be w2's weight gradient, and the backward recomputes act's codes for it
    // from g, u (fp8_experts_backward_gpu)
    fp8_fused_shapes_check(layer, Rp, F, rt, {g, u});
    Fp8Buf* ab[1] = {&f->act};
    fp8_quantize_produced(f, FP8P_SWIGLU_FWD, {g, u, nullptr, nullptr, nullptr}, &s_x2, Rp, F, sx, ab, true, false, stream);
    // down: ye_e (n, C) = a_e (n, F) @ w2_e (F, C): reduces over F, so w2_e is read transposed (C, F)
    const Fp8Buf& qw2 = fp8_weight_gpu(f, layer, FP8_LIN_W2, w2, EF, C, sw, &f->w, false, true, stream);
    side = experts_fork(stream);
    for (int e = 0, busy = 0; e < E; e++) {
        if (rt.len[e] == 0) continue;
        gemm_fp8_gpu(rt.len[e], C, F, 1.0f, fp8_operand_of(f, s_x2, f->act, false, false, p[e], F, fp8_scale_offset(p, e, F, false, false)),
                     fp8_operand_of(f, s_w2, qw2, true, true, (size_t)e * F, EF, fp8_scale_offset(ws, e, C, true, true)), 0.0f,
                     ye + (size_t)p[e] * C, C, 1, busy++ % 2 ? side : stream);
    }
    experts_join(stream, side);
}

// fp8_experts_backward_gpu's parts: the input gradients (dxe) and the weight gradients (dw1, dv1, dw2). Apart, a
// caller sends dxe on its way before the weight gradients run (the chunked exchange: parallel/expert_parallel_fp8.cuh)
#define FP8_BWD_DATA 1
#define FP8_BWD_WEIGHTS 2
#define FP8_BWD_BOTH 3

// dxe (rows, C) BF16 overwritten (the second GEMM adds to the first's BF16 output, as experts_backward_gpu);
// dw1, dv1, dw2 (E*F, C) fp32 accumulated (wbeta 0: overwritten); da, dg, du (rows, F) scratch. part: FP8_BWD_BOTH,
// or FP8_BWD_DATA then (the same arguments, nothing between them overwriting the codes it left) FP8_BWD_WEIGHTS.
// The fused path: SwiGLU backward writes the codes of dg (into f->grad), du (into the BF16 dg / du scratch, which it
// leaves unused: 2 Rp F bytes of codes in dg's 2 Rp F, the factors in du's: fp8_buf_in) and act's transposed codes
// (recomputed from g, u; in du's scratch after du's factors: fp8_buf_after), and dye's codes go to f->act (free
// until xe's): the weight gradients read only those codes and xe's, so they may come after every input gradient.
static inline void fp8_experts_backward_gpu(Fp8GPU* f, int layer, floatX* dxe, float* dw1, float* dv1, float* dw2, floatX* da,
                                            floatX* dg, floatX* du, const floatX* dye, const floatX* xe, const floatX* g,
                                            const floatX* u, const floatX* w1, const floatX* v1, const floatX* w2,
                                            int E, int C, int F, cudaStream_t stream = 0, float wbeta = 1.0f, int part = FP8_BWD_BOTH) {
    const Fp8Routing& rt = f->routing[layer];
    const std::vector<int>& p = rt.poff;
    int Rp = p[E], EF = E * F;
    fp8_fused_shapes_check(layer, Rp, F, rt, {da, g, u, dg, du});
    std::vector<int> ws = fp8_weight_starts(E, F);
    Fp8Segments sx = fp8_expert_segments(rt), sw = fp8_uniform_segments(E, F);
    auto slot = [&](int lin, int op) { return fp8_slot(f, layer, lin, op); };
    const int sdy[3] = {slot(FP8_LIN_W1, FP8_OP_DY), slot(FP8_LIN_V1, FP8_OP_DY), slot(FP8_LIN_W2, FP8_OP_X)};
    const int sg2 = slot(FP8_LIN_W2, FP8_OP_DY), sw2 = slot(FP8_LIN_W2, FP8_OP_W), sx2 = slot(FP8_LIN_W2, FP8_OP_X);
    Fp8Buf dub = fp8_buf_in(f, dg, du, rt, Rp, F), actb = fp8_buf_after(f, dub, du, rt, Rp, F);
    Fp8Buf* gb[3] = {&f->grad, &dub, &actb};
    const floatX* wts[2] = {w1, v1};
    float* dws[2] = {dw1, dv1};
    if (part & FP8_BWD_DATA) {
        // down: da_e = dye_e @ w2_e^T (reduces over C: dye row-wise, w2 row-wise); then dg, du and their codes
        fp8_quantize_operand(f, sg2, false, dye, Rp, C, sx, &f->act, true, true, stream);
        const Fp8Buf& qw2 = fp8_weight_gpu(f, layer, FP8_LIN_W2, w2, EF, C, sw, &f->w, true, false, stream);
        cudaStream_t side = experts_fork(stream);
        for (int e = 0, busy = 0; e < E; e++) {
            if (rt.len[e] == 0) continue;
            gemm_fp8_gpu(rt.len[e], F, C, 1.0f, fp8_operand_of(f, sg2, f->act, false, false, p[e], C, fp8_scale_offset(p, e, C, false, false)),
                         fp8_operand_of(f, sw2, qw2, true, false, (size_t)e * F, C, fp8_scale_offset(ws, e, C, true, false)), 0.0f,
                         da + (size_t)p[e] * F, F, 0, busy++ % 2 ? side : stream);
        }
        experts_join(stream, side);
        fp8_quantize_produced(f, FP8P_SWIGLU_BWD, {da, g, u, nullptr, nullptr}, sdy, Rp, F, sx, gb, true, true, stream);
        // up: dxe_e = dg_e @ w1_e + du_e @ v1_e (reduces over F: the weights transposed (C, F))
        for (int i = 0; i < 2; i++) {
            int lin = i ? FP8_LIN_V1 : FP8_LIN_W1, sg = slot(lin, FP8_OP_DY), swt = slot(lin, FP8_OP_W);
            const Fp8Buf& qw = fp8_weight_gpu(f, layer, lin, wts[i], EF, C, sw, &f->w, false, true, stream);
            cudaStream_t side = experts_fork(stream);   // (joined before the next weight overwrites f->w)
            for (int e = 0, busy = 0; e < E; e++) {
                if (rt.len[e] == 0) continue;
                gemm_fp8_gpu(rt.len[e], C, F, 1.0f, fp8_operand_of(f, sg, *gb[i], false, false, p[e], F, fp8_scale_offset(p, e, F, false, false)),
                             fp8_operand_of(f, swt, qw, true, true, (size_t)e * F, EF, fp8_scale_offset(ws, e, C, true, true)),
                             i ? 1.0f : 0.0f, dxe + (size_t)p[e] * C, C, 0, busy++ % 2 ? side : stream);
            }
            experts_join(stream, side);
        }
    }
    if (!(part & FP8_BWD_WEIGHTS)) return;
    // dw2_e += a_e^T @ dye_e, then dw1_e += dg_e^T @ xe_e, dv1_e += du_e^T @ xe_e (over the tokens: all transposed);
    // xe's transposed codes from the forward where it left them in xe's buffer, else quantised here into f->act,
    // after dw2 has read dye's codes there
    cudaStream_t side = experts_fork(stream);
    for (int e = 0, busy = 0; e < E; e++) {
        if (rt.len[e] == 0) continue;
        gemm_fp8_gpu(F, C, rt.len[e], 1.0f, fp8_operand_of(f, sx2, actb, false, true, p[e], Rp, fp8_scale_offset(p, e, F, false, true)),
                     fp8_operand_of(f, sg2, f->act, false, true, p[e], Rp, fp8_scale_offset(p, e, C, false, true)), wbeta,
                     dw2 + (size_t)e * F * C, C, 0, busy++ % 2 ? side : stream);
    }
    experts_join(stream, side);   // (before xe's codes overwrite f->act, which these GEMMs read)
    const Fp8Buf xeb = rt.xe_codes ? fp8_xe_codes(f, xe, rt, Rp, C) : f->act;
    if (!rt.xe_codes) fp8_quantize_operand(f, slot(FP8_LIN_W1, FP8_OP_X), false, xe, Rp, C, sx, &f->act, false, true, stream);
    for (int i = 0; i < 2; i++) {
        int sg = slot(i ? FP8_LIN_V1 : FP8_LIN_W1, FP8_OP_DY), sxe = slot(FP8_LIN_W1, FP8_OP_X);
        side = experts_fork(stream);
        for (int e = 0, busy = 0; e < E; e++) {
            if (rt.len[e] == 0) continue;
            gemm_fp8_gpu(F, C, rt.len[e], 1.0f, fp8_operand_of(f, sg, *gb[i], false, true, p[e], Rp, fp8_scale_offset(p, e, F, false, true)),
                         fp8_operand_of(f, sxe, xeb, false, true, p[e], Rp, fp8_scale_offset(p, e, C, false, true)), wbeta,
                         dws[i] + (size_t)e * F * C, C, 0, busy++ % 2 ? side : stream);
        }
        experts_join(stream, side);
    }
}
