/*
 * attention.cu — causal GQA attention (B, T, H, KV, hd) versions:
 *   forward v1  one warp per query row, lanes split head_dim, one warp reduction per key
 *               (model/attention.cuh: the model's for head_dims the flash kernels do not take)
 *   forward v2  one warp per query row, 32 keys at a time: each lane scores one key (q in shared
 *               memory), two warp reductions per tile (max, sum), the probabilities broadcast by shuffles
 *   forward v3  flash (FlashAttention-2) on tensor cores: mma.sync m16n8k16 BF16, ldmatrix, cp.async
 *               double-buffered K/V tiles, online softmax, causal tile skipping (model/attention_flash.cuh;
 *               the model's for head_dim 32, 64, 128)
 *   backward v1 dq: warp per query row; dk, dv: warp per key row over its query group
 *   backward v2 flash on tensor cores: dq kernel (+ D), dk/dv kernel over the kv group (the model's)
 * Every version is validated against the CPU reference (out, lse; dqkv), which at the full size runs
 * on the first batch row only.
 * FLOPs counted: causal forward 4 B H hd T(T+1)/2 (S and P V); backward 2.5x that (FlashAttention's
 * convention; the flash dq kernel recomputes S and dP, so it executes 3.5x).
 *   make dev/cuda/attention && ./dev/cuda/attention [-f N] [-g N] [-b B] [-t T] [-h H] [-k KV] [-d hd]
 *     -f N / -g N: only forward / backward version N (0: all, the default; -1: none); default shape
 *     B 8, T 2048, H 8, KV 2, hd 128 (dbrx-1b). The flash pair at dbrx-132b's attention shape:
 *     ./dev/cuda/attention -f 3 -g 2 -b 8 -t 4096 -h 48 -k 8 -d 128
 *   Under the emulator (attention_emu) a list of small shapes, validation only.
 */
#include "common.h"
#include "../../model/attention.cuh"

__global__ void attention_forward_v2(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd) {
    __shared__ float qs[4][256];   // blockDim 128: 4 warps, one query row each, hd <= 256
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    size_t row = (size_t)blockIdx.x * 4 + w;
    if (row >= (size_t)B * H * T) return;
    int t = row % T, h = (row / T) % H, b = row / ((size_t)T * H);
    int qkv_dim = (H + 2 * KV) * hd, C = H * hd, kvh = h / (H / KV);
    float scale = 1.0f / sqrtf((float)hd);
    const floatX* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
    for (int i = lane; i < hd; i += 32) qs[w][i] = __bfloat162float(q[i]) * scale;
    __syncwarp();
    const floatX* kbase = qkv + (size_t)b * T * qkv_dim + C + kvh * hd;
    const floatX* vbase = kbase + KV * hd;
    float o[ATT_MAX_PER_LANE];
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int t0 = 0; t0 <= t; t0 += 32) {
        int t2 = t0 + lane;
        float s = -INFINITY;
        if (t2 <= t) {
            const floatX* k = kbase + (size_t)t2 * qkv_dim;
            s = 0.0f;
            for (int i = 0; i < hd; i++) s += qs[w][i] * __bfloat162float(k[i]);
        }
        float m_new = fmaxf(m, warp_max(s));
        float p = t2 <= t ? expf(s - m_new) : 0.0f, corr = expf(m - m_new);
        l = l * corr + warp_sum(p);
        for (int j = 0; j < ATT_MAX_PER_LANE; j++) o[j] *= corr;
        int n = min(32, t - t0 + 1);
        for (int jj = 0; jj < n; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const floatX* v = vbase + (size_t)(t0 + jj) * qkv_dim;
            for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) o[j] += pj * __bfloat162float(v[i]); }
        }
        m = m_new;
    }
    floatX* y = out + ((size_t)b * T + t) * C + h * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) y[i] = __float2bfloat16(o[j] / l); }
    if (lane == 0) lse[row] = m + logf(l);
}

// validates (and on a GPU times) the selected versions at one shape
static void run_shape(int only_f, int only_g, int B, int T, int H, int KV, int hd) {
    int qd = (H + 2 * KV) * hd, C = H * hd;
    printf("B %d, T %d, H %d, KV %d, hd %d\n", B, T, H, KV, hd);
    std::vector<float> qkv = round_bf16(make_random((size_t)B * T * qd, 1, 1.5));
    std::vector<float> dout = round_bf16(make_random((size_t)B * T * C, 2));
    // the CPU reference on the first batch row at the full size (it is slow), on all of them emulated
    int Bv = EMULATED ? B : 1;
    size_t nv = (size_t)Bv * T * C, nqv = (size_t)Bv * T * qd, nl = (size_t)Bv * H * T;
    std::vector<float> out(nv), lse(nl), dqkv(nqv);
    attention_forward(out.data(), lse.data(), qkv.data(), Bv, T, H, KV, hd);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), Bv, T, H, KV, hd);
    floatX *dq = to_device_bf16v(qkv), *dy = deviceAlloc(floatX, (size_t)B * T * C), *ddout = to_device_bf16v(dout);
    floatX* ddq = deviceAlloc(floatX, qkv.size());
    float *dlse = deviceAlloc(float, (size_t)B * H * T), *dD = deviceAlloc(float, (size_t)B * H * T);
    double flops = 4.0 * B * H * hd * (double)T * (T + 1) / 2;
    bool flash = flash_attention_supported(hd);
    const int NF = 3, NB = 2;
    std::function<void()> fwd[NF] = {
        [&] { attention_forward_rows_gpu(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { LAUNCH(attention_forward_v2, ceil_div((long long)B * H * T, 4), 128, 0, 0, dy, dlse, dq, B, T, H, KV, hd); },
        [&] { flash_attention_forward_gpu(dy, dlse, dq, B, T, H, KV, hd); },
    };
    const char* fnames[NF] = {"forward v1 (warp per row)", "forward v2 (32-key tiles)", "forward v3 (flash, tensor cores)"};
    std::function<void()> bwd[NB] = {
        [&] { attention_backward_rows_gpu(ddq, dD, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        [&] { flash_attention_backward_gpu(ddq, dD, ddout, dy, dlse, dq, B, T, H, KV, hd); },
    };
    const char* bnames[NB] = {"backward v1 (warp per row)", "backward v2 (flash, tensor cores)"};
    for (int v = 0; v < NF; v++) {
        if ((only_f && only_f != v + 1) || (v == 2 && !flash)) continue;
        cudaCheck(cudaMemset(dy, 0xFF, (size_t)B * T * C * sizeof(floatX)));
        cudaCheck(cudaMemset(dlse, 0xFF, (size_t)B * H * T * sizeof(float)));
        fwd[v]();
        validate(fnames[v], from_device_bf16v(dy, nv), out, 1e-2, 1e-2);
        validate("  lse", from_device_f32(dlse, nl), lse, 1e-4, 1e-5);
        report_flops(fnames[v], flops, time_ms(EMULATED ? 1 : 5, fwd[v]));
    }
    // the backward reads out and lse: the forward of the same kind (v1's for v1, flash for v2)
    for (int v = 0; v < NB; v++) {
        if ((only_g && only_g != v + 1) || (v == 1 && !flash)) continue;
        fwd[v == 0 ? 0 : 2]();
        cudaCheck(cudaMemset(ddq, 0xFF, qkv.size() * sizeof(floatX)));
        bwd[v]();
        validate(bnames[v], from_device_bf16v(ddq, nqv), dqkv, 1e-2, 1e-2);
        report_flops(bnames[v], 2.5 * flops, time_ms(EMULATED ? 1 : 3, bwd[v]));
    }
    for (void* p : {(void*)dq, (void*)dy, (void*)ddout, (void*)ddq, (void*)dlse, (void*)dD}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    int only_f = 0, only_g = 0, B = 8, T = 2048, H = 8, KV = 2, hd = 128;
    bool shape_given = false;
    for (int i = 1; i < argc; i += 2) {
        int x = i + 1 < argc ? atoi(argv[i + 1]) : 0;
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        if (!strcmp(argv[i], "-f")) only_f = x;
        else if (!strcmp(argv[i], "-g")) only_g = x;
        else if (!strcmp(argv[i], "-b")) { B = x; shape_given = true; }
        else if (!strcmp(argv[i], "-t")) { T = x; shape_given = true; }
        else if (!strcmp(argv[i], "-h")) { H = x; shape_given = true; }
        else if (!strcmp(argv[i], "-k")) { KV = x; shape_given = true; }
        else if (!strcmp(argv[i], "-d")) { hd = x; shape_given = true; }
        else { fprintf(stderr, "usage: %s [-f N] [-g N] [-b B] [-t T] [-h H] [-k KV] [-d hd]\n", argv[0]); return 2; }
    }
    print_header("attention", "causal GQA");
    if (EMULATED && !shape_given) {
        // small shapes: odd T (tiles cut short, a single token), GQA 4:2 and 8:1, head_dim 32/64/128
        // (flash) and 40 (v1, v2 only); B 2 where the batch offsets matter
        const int shapes[][5] = {{1, 70, 4, 2, 64}, {1, 1, 4, 2, 64}, {2, 17, 4, 2, 128}, {1, 129, 8, 1, 128},
                                 {1, 256, 4, 2, 128}, {2, 45, 4, 2, 32}, {1, 45, 4, 2, 40}};
        for (const auto& s : shapes) run_shape(only_f, only_g, s[0], s[1], s[2], s[3], s[4]);
    } else {
        run_shape(only_f, only_g, B, T, H, KV, hd);
    }
    return finish();
}
