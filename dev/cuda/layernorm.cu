/*
 * layernorm.cu — LayerNorm (weight only, fp32 statistics, BF16 in/out) versions:
 *   v1  one thread per row (naive: uncoalesced, little parallelism)
 *   v2  one warp per row, lane-strided scalar loads           (the model's for C % 8 != 0: W = 1)
 *   v3  one warp per row, 16-byte loads (8 BF16 per lane)      (the model's, model/layernorm.cuh)
 *   v4  the residual add fused in (resid = x + y written, then normalised; the model's for the MoE
 *       half's norm), against v5: the residual add and then the norm, two launches
 * and the backward:
 *   bwd v1  input gradient warp per row (scalar), weight gradient: 32-row chunk partials (a second pass over dout
 *           and x), then one column sum on C / 128 blocks (8 at d 1024): the model's before session 30
 *   bwd v2  one pass per 32-row chunk: the input gradient (16-byte accesses) and the chunk's partial together, then
 *           the partials summed in groups of 8 over (groups x C / 128) blocks and the groups in order: one column
 *           segment per warp (half the warps idle at d 1024), row-sum loads one at a time (the model's until session 46)
 *   bwd v3  v2 with its phases spread over every warp and four row-sum loads in flight: v2's bits (the model's);
 *           also at 512 threads a block (16-row slices): on an H200 (2026-11-28) 0.137 ms, v3 0.135, v2 0.157, v1 0.187
 *   bwd v4  a warp per row, the row in registers, all its loads 16-byte and in flight at once; the weight gradient's
 *           chunk partial summed by warps (other bits than v1-v3, deterministic); C = 256 NV. Untimed (session 58)
 * v2 and v3 give v1's bits for the input gradient always and for the weight gradient while the chunks fit one group
 * (N <= 256 rows: the emulated size); above that the weight gradient's summation order differs (checked to 1e-5).
 * Bytes moved per forward: read x (2 B) + write y (2 B) per element (+ weight, stats: negligible);
 * fused: read x, y, write resid, out (8 B); unfused: the add's 6 B and the norm's 4 B. Backward per element:
 * v1 reads dout (4 B) and x (2 B) twice, dinp 4 B, writes dinp 4 B and its BF16 copy 2 B: 22 B; v2, v3: 16 B.
 *   make dev/cuda/layernorm && ./dev/cuda/layernorm        (N = 16384 rows, C = 1024: dbrx-1b)
 */
#include "common.h"
#include "../../model/layernorm.cuh"
#include "../../model/residual.cuh"

// the residual add on its own (what the model ran before the fusion): out = bf16(x + y), 2-byte accesses
__global__ void residual_add_v1(floatX* out, const floatX* x, const floatX* y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

__global__ void layernorm_forward_v1(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w, int N, int C, float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float m = 0, v = 0;
    for (int c = 0; c < C; c++) m += __bfloat162float(x[c]);
    m /= C;
    for (int c = 0; c < C; c++) { float d = __bfloat162float(x[c]) - m; v += d * d; }
    float s = rsqrtf(v / C + eps);
    for (int c = 0; c < C; c++) out[(size_t)row * C + c] = __float2bfloat16((__bfloat162float(x[c]) - m) * s * __bfloat162float(w[c]));
    mean[row] = m;
    rstd[row] = s;
}

// the backward before session 30 (bwd v1): the input gradient, warp per row, lane-strided scalar accesses
__global__ void layernorm_backward_dinp_v1(float* dinp, floatX* dinp_bf16, const float* dout, const floatX* inp,
                                           const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const float* dy = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dn_sum = 0.0f, dn_n_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s, dn = dy[c] * __bfloat162float(weight[c]);
        dn_sum += dn;
        dn_n_sum += dn * n;
    }
    float dn_mean = warp_sum(dn_sum) / C, dn_n_mean = warp_sum(dn_n_sum) / C;
    float* dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s, dn = dy[c] * __bfloat162float(weight[c]);
        float v = dx[c] + s * (dn - dn_mean - n * dn_n_mean);
        dx[c] = v;
        if (dinp_bf16) dinp_bf16[(size_t)row * C + c] = __float2bfloat16(v);
    }
}
// its weight gradient: a second pass over dout and x, chunk j's sum per channel into partial row j
__global__ void layernorm_backward_dweight_partial_v1(float* partial, const float* dout, const floatX* inp, const float* mean,
                                                      const float* rstd, int N, int C, int rows_per_chunk) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.x * rows_per_chunk, r1 = min(r0 + rows_per_chunk, N);
    float acc = 0.0f;
    for (int t = r0; t < r1; t++)
        acc += dout[(size_t)t * C + c] * (__bfloat162float(inp[(size_t)t * C + c]) - mean[t]) * rstd[t];
    partial[(size_t)blockIdx.x * C + c] = acc;
}

// bwd v2 (the model's from session 30 to 46): the one-pass kernel with one column segment of 32 W channels per warp in
// the input gradient and the partial, so at d = 1024 (W = 8: 4 segments) half of a 256-thread block's warps wait in
// those phases, and the row sums' lane-strided loads one at a time. bwd v3 (the model's) spreads both phases over all
// the warps and keeps four row-sum loads in flight, in the same arithmetic order: the same bits.
template <int W>
__global__ void layernorm_backward_v2(float* dinp, floatX* dinp_bf16, float* partial, const float* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    __shared__ float dn_means[32], dn_n_means[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int r0 = blockIdx.x * LN_ROWS_PER_CHUNK, rows = min(LN_ROWS_PER_CHUNK, N - r0);
    float* part = partial + (size_t)blockIdx.x * C;
    for (int rb = 0; rb < rows; rb += nwarps) {
        int nb = min(nwarps, rows - rb);
        if (warp < nb) {
            int row = r0 + rb + warp;
            const floatX* x = inp + (size_t)row * C;
            const float* dy = dout + (size_t)row * C;
            float m = mean[row], s = rstd[row];
            float dn_sum = 0.0f, dn_n_sum = 0.0f;
            for (int c = lane; c < C; c += 32) {
                float n = (__bfloat162float(x[c]) - m) * s, dn = dy[c] * __bfloat162float(weight[c]);
                dn_sum += dn;
                dn_n_sum += dn * n;
            }
            float dn_mean = warp_sum(dn_sum) / C, dn_n_mean = warp_sum(dn_n_sum) / C;
            if (lane == 0) { dn_means[warp] = dn_mean; dn_n_means[warp] = dn_n_mean; }
        }
        __syncthreads();
        for (int seg = warp * 32 * W; seg < C; seg += blockDim.x * W) {
            int c = seg + lane * W;
            if (c < C) {
                float wv[W];
                load_bf16<W>(wv, weight + c);
                for (int i = 0; i < nb; i++) {
                    int row = r0 + rb + i;
                    size_t at = (size_t)row * C + c;
                    float m = mean[row], s = rstd[row], dn_mean = dn_means[i], dn_n_mean = dn_n_means[i];
                    float xv[W], dy[W], dx[W];
                    load_bf16<W>(xv, inp + at);
                    load_f32<W>(dy, dout + at);
                    load_f32<W>(dx, dinp + at);
                    for (int j = 0; j < W; j++) {
                        float n = (xv[j] - m) * s, dn = dy[j] * wv[j];
                        dx[j] = dx[j] + s * (dn - dn_mean - n * dn_n_mean);
                    }
                    store_f32<W>(dinp + at, dx);
                    if (dinp_bf16) store_bf16<W>(dinp_bf16 + at, dx);
                }
            }
            for (int j = 0; j < W; j++) {
                int cj = seg + lane + 32 * j;
                if (cj >= C) break;
                float acc = rb == 0 ? 0.0f : part[cj];
                for (int t = r0 + rb; t < r0 + rb + nb; t++)
                    acc += dout[(size_t)t * C + cj] * (__bfloat162float(inp[(size_t)t * C + cj]) - mean[t]) * rstd[t];
                part[cj] = acc;
            }
        }
        __syncthreads();   // dn_means is rewritten by the next slice
    }
}

// bwd v4: a warp per row with the whole row in registers (llm.c's layout): lane l holds channels 8 l + 256 i (i < NV = C /
// 256), every load of a row issued at once as 16-byte accesses (x, dout, the weight, and dinp for the add: 24 of them a
// lane at d 1024, where v3 keeps four 4-byte ones in flight and reads each row three times from L1/L2); the warp's rows of
// the chunk (warp, warp + 8, ...) add their dout * n to per-lane partials in registers, and the block sums its warps'
// partials in warp order through shared memory into the chunk's partial row (v3's scratch layout and column sums follow).
// Its sums go in another order than v1-v3 (the row sums by 16-byte vectors, the chunk by warps): not their bits;
// deterministic. A dev probe (the model keeps v3 until a device times them). Dynamic shared memory: nwarps * C floats
template <int NV>
__global__ void __launch_bounds__(256) layernorm_backward_v4(float* dinp, floatX* dinp_bf16, float* partial, const float* dout,
                                                             const floatX* inp, const floatX* weight, const float* mean,
                                                             const float* rstd, int N) {
    constexpr int C = 256 * NV;
    float* red = (float*)dynamic_smem;   // (nwarps, C): each warp's partial row
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int r0 = blockIdx.x * LN_ROWS_PER_CHUNK, rows = min(LN_ROWS_PER_CHUNK, N - r0);
    float acc[NV][8] = {};
    for (int r = warp; r < rows; r += nwarps) {
        const size_t row = r0 + r;
        float xv[NV][8], dy[NV][8];
        UNROLL for (int i = 0; i < NV; i++) {
            load_bf16<8>(xv[i], inp + row * C + 256 * i + 8 * lane);
            load_f32<8>(dy[i], dout + row * C + 256 * i + 8 * lane);
        }
        const float m = mean[row], s = rstd[row];
        float dn_sum = 0.0f, dn_n_sum = 0.0f;
        UNROLL for (int i = 0; i < NV; i++) {
            float wv[8];
            load_bf16<8>(wv, weight + 256 * i + 8 * lane);
            for (int j = 0; j < 8; j++) {
                float n = (xv[i][j] - m) * s, dn = dy[i][j] * wv[j];
                acc[i][j] += dy[i][j] * n;
                xv[i][j] = n;        // (n, then dn, kept for the input gradient)
                dy[i][j] = dn;
                dn_sum += dn;
                dn_n_sum += dn * n;
            }
        }
        const float dn_mean = warp_sum(dn_sum) / C, dn_n_mean = warp_sum(dn_n_sum) / C;
        UNROLL for (int i = 0; i < NV; i++) {
            float dx[8];
            const size_t at = row * C + 256 * i + 8 * lane;
            load_f32<8>(dx, dinp + at);
            for (int j = 0; j < 8; j++) dx[j] = dx[j] + s * (dy[i][j] - dn_mean - xv[i][j] * dn_n_mean);
            store_f32<8>(dinp + at, dx);
            if (dinp_bf16) store_bf16<8>(dinp_bf16 + at, dx);
        }
    }
    UNROLL for (int i = 0; i < NV; i++) store_f32<8>(red + (size_t)warp * C + 256 * i + 8 * lane, acc[i]);
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {   // the chunk's partial: the warps' rows in warp order
        float sum = 0.0f;
        for (int w = 0; w < nwarps; w++) sum += red[(size_t)w * C + c];
        partial[(size_t)blockIdx.x * C + c] = sum;
    }
}

int main() {
    int N = EMULATED ? 77 : 16384, C = EMULATED ? 512 : 1024;   // (emulated: bwd v4's two vectors a lane, a chunk cut short)
    char shape[64];
    snprintf(shape, sizeof shape, "N %d, C %d", N, C);
    print_header("layernorm", shape);
    std::vector<float> x = round_bf16(make_random((size_t)N * C, 1, 2.0)), w = round_bf16(make_random(C, 2));
    std::vector<float> out((size_t)N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    floatX *dx = to_device_bf16v(x), *dw = to_device_bf16v(w), *dout = deviceAlloc(floatX, out.size());
    float *dmean = deviceAlloc(float, N), *drstd = deviceAlloc(float, N);
    const float eps = 1e-5f;
    double bytes = 2.0 * N * C * sizeof(floatX);
    std::function<void()> versions[3] = {
        [&] { LAUNCH(layernorm_forward_v1, ceil_div(N, 128), 128, 0, 0, dout, dmean, drstd, dx, dw, N, C, eps); },
        [&] { LAUNCH(layernorm_forward_kernel<1>, ceil_div(N, 8), 256, 0, 0, dout, (floatX*)nullptr, dmean, drstd, dx,
                     (const floatX*)nullptr, dw, N, C, eps); },
        [&] { layernorm_forward_gpu(dout, dmean, drstd, dx, dw, N, C, eps); },
    };
    const char* names[3] = {"forward v1 (thread per row)", "forward v2 (warp per row, scalar)", "forward v3 (16 B accesses, model)"};
    for (int v = 0; v < 3; v++) {
        cudaCheck(cudaMemset(dout, 0xFF, out.size() * sizeof(floatX)));
        versions[v]();
        validate(names[v], from_device_bf16v(dout, out.size()), out, 1e-2, 1e-2);
        report_bandwidth(names[v], bytes, time_ms(20, versions[v]));
    }
    // the residual add fused in: resid = bf16(y + x), out = layernorm(resid), against the two steps
    {
        std::vector<float> y = round_bf16(make_random((size_t)N * C, 4)), resid((size_t)N * C), rout((size_t)N * C), rm(N), rs(N);
        residual_forward(resid.data(), y.data(), x.data(), resid.size());
        resid = round_bf16(resid);
        layernorm_forward(rout.data(), rm.data(), rs.data(), resid.data(), w.data(), N, C, eps);
        floatX *dy = to_device_bf16v(y), *dres = deviceAlloc(floatX, resid.size());
        float *fmean = deviceAlloc(float, N), *frstd = deviceAlloc(float, N);   // (the backward below reads dmean, drstd)
        auto fused = [&] { residual_layernorm_forward_gpu(dout, dres, fmean, frstd, dy, dx, dw, N, C, eps); };
        auto apart = [&] {
            LAUNCH(residual_add_v1, ceil_div((long long)N * C, 256), 256, 0, 0, dres, dy, dx, (size_t)N * C);
            layernorm_forward_gpu(dout, fmean, frstd, dres, dw, N, C, eps);
        };
        const char* fnames[2] = {"forward v4 (residual fused, model)", "forward v5 (residual, then v3)"};
        std::function<void()> fv[2] = {fused, apart};
        double fbytes[2] = {4.0 * N * C * sizeof(floatX), 5.0 * N * C * sizeof(floatX)};
        for (int v = 0; v < 2; v++) {
            cudaCheck(cudaMemset(dout, 0xFF, out.size() * sizeof(floatX)));
            cudaCheck(cudaMemset(dres, 0xFF, resid.size() * sizeof(floatX)));
            fv[v]();
            validate(fnames[v], from_device_bf16v(dout, out.size()), rout, 1e-2, 1e-2);
            validate("  the residual sum", from_device_bf16v(dres, resid.size()), resid, 0, 0);
            report_bandwidth(fnames[v], fbytes[v], time_ms(20, fv[v]));
        }
        for (void* p : {(void*)dy, (void*)dres, (void*)fmean, (void*)frstd}) cudaCheck(cudaFree(p));
    }
    // backward: v1 (three kernels, the model's before) and v2 (the model's), against the CPU and v2 against v1's bits
    std::vector<float> dy = make_random((size_t)N * C, 3), dinp((size_t)N * C, 0.0f), dweight(C, 0.0f);
    layernorm_backward(dinp.data(), dweight.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    float *ddy = to_device(dy), *ddinp = deviceAlloc(float, dinp.size()), *ddw = deviceAlloc(float, C);
    float* scratch = deviceAlloc(float, layernorm_backward_scratch(N, C));
    floatX* ddinp16 = deviceAlloc(floatX, dinp.size());
    int chunks = ceil_div(N, LN_ROWS_PER_CHUNK);
    auto zero = [&] {
        cudaCheck(cudaMemset(ddinp, 0, dinp.size() * sizeof(float)));
        cudaCheck(cudaMemset(ddw, 0, C * sizeof(float)));
    };
    std::function<void()> bv[5] = {
        [&] {
            zero();
            LAUNCH(layernorm_backward_dinp_v1, ceil_div(N, 8), 256, 0, 0, ddinp, ddinp16, ddy, dx, dw, dmean, drstd, N, C);
            LAUNCH(layernorm_backward_dweight_partial_v1, dim3(chunks, ceil_div(C, 128)), 128, 0, 0, scratch, ddy, dx, dmean, drstd,
                   N, C, LN_ROWS_PER_CHUNK);
            LAUNCH(column_sum_kernel, ceil_div(C, 128), 128, 0, 0, ddw, scratch, chunks, C, 1, 1);
        },
        [&] {
            zero();
            int groups = ceil_div(chunks, LN_CHUNKS_PER_GROUP);
            LAUNCH(layernorm_backward_v2<8>, chunks, 256, 0, 0, ddinp, ddinp16, scratch, ddy, dx, dw, dmean, drstd, N, C);
            LAUNCH(column_sum_groups_kernel, dim3(groups, ceil_div(C, 128)), 128, 0, 0, scratch, chunks, C, LN_CHUNKS_PER_GROUP);
            LAUNCH(column_sum_kernel, ceil_div(C, 128), 128, 0, 0, ddw, scratch, chunks, C, LN_CHUNKS_PER_GROUP, 1);
        },
        [&] {
            zero();
            layernorm_backward_gpu(ddinp, ddinp16, ddw, scratch, ddy, dx, dw, dmean, drstd, N, C);
        },
        [&] {   // v3 with 512 threads a block: slices of 16 rows, two per chunk (the same bits: a slice only splits the sum)
            zero();
            int groups = ceil_div(chunks, LN_CHUNKS_PER_GROUP);
            LAUNCH(layernorm_backward_kernel<8>, chunks, 512, 0, 0, ddinp, ddinp16, scratch, ddy, dx, dw, dmean, drstd, N, C);
            LAUNCH(column_sum_groups_kernel, dim3(groups, ceil_div(C, 128)), 128, 0, 0, scratch, chunks, C, LN_CHUNKS_PER_GROUP);
            LAUNCH(column_sum_kernel, ceil_div(C, 128), 128, 0, 0, ddw, scratch, chunks, C, LN_CHUNKS_PER_GROUP, 1);
        },
        [&] {   // v4: the row in registers (C = 256 NV: 512 emulated, 1024 on a GPU; 32 KiB of shared memory at most)
            zero();
            int groups = ceil_div(chunks, LN_CHUNKS_PER_GROUP);
            size_t smem = 8 * (size_t)C * sizeof(float);
            if (C == 512) LAUNCH(layernorm_backward_v4<2>, chunks, 256, smem, 0, ddinp, ddinp16, scratch, ddy, dx, dw, dmean, drstd, N);
            else LAUNCH(layernorm_backward_v4<4>, chunks, 256, smem, 0, ddinp, ddinp16, scratch, ddy, dx, dw, dmean, drstd, N);
            LAUNCH(column_sum_groups_kernel, dim3(groups, ceil_div(C, 128)), 128, 0, 0, scratch, chunks, C, LN_CHUNKS_PER_GROUP);
            LAUNCH(column_sum_kernel, ceil_div(C, 128), 128, 0, 0, ddw, scratch, chunks, C, LN_CHUNKS_PER_GROUP, 1);
        },
    };
    const char* bnames[5] = {"bwd v1 (3 kernels, 8-block sum)", "bwd v2 (one pass, a segment per warp)", "bwd v3 (one pass, all warps, model)",
                             "bwd v3 at 512 threads", "bwd v4 (the row in registers)"};
    double bbytes[5] = {22.0 * N * C, 16.0 * N * C, 16.0 * N * C, 16.0 * N * C, 16.0 * N * C};
    std::vector<float> v1_dinp, v1_dw, v2_dw;
    for (int v = 0; v < 5; v++) {
        bv[v]();
        std::vector<float> got_dinp = from_device_f32(ddinp, dinp.size()), got_dw = from_device_f32(ddw, C);
        validate(bnames[v], got_dinp, dinp, 1e-4, 1e-5);
        validate("  dweight", got_dw, dweight, 1e-4, 1e-5);
        if (v == 0) { v1_dinp = got_dinp; v1_dw = got_dw; continue; }
        if (v == 4) {   // (its own summation order: against the CPU above, and v1 within the order's rounding)
            validate("  dinp vs v1", got_dinp, v1_dinp, 1e-5, 1e-6);
            validate("  dweight vs v1", got_dw, v1_dw, 1e-5, 1e-6);
            report_bandwidth(bnames[v], bbytes[v], time_ms(20, bv[v]));
            continue;
        }
        validate("  dinp: v1's bits", got_dinp, v1_dinp, 0, 0);
        if (v >= 2) {
            validate("  dweight: v2's bits", got_dw, v2_dw, 0, 0);
            report_bandwidth(bnames[v], bbytes[v], time_ms(20, bv[v]));
            continue;
        }
        v2_dw = got_dw;
        bool one_group = chunks <= LN_CHUNKS_PER_GROUP;
        validate(one_group ? "  dweight: v1's bits (one group)" : "  dweight vs v1 (groups)", got_dw, v1_dw, one_group ? 0 : 1e-5, one_group ? 0 : 1e-6);
        report_bandwidth(bnames[v], bbytes[v], time_ms(20, bv[v]));
    }
    report_bandwidth(bnames[0], bbytes[0], time_ms(20, bv[0]));
    return finish();
}
