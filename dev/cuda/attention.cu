/*
 * attention.cu — causal GQA attention (B, T, H, KV, hd) versions:
 *   forward v1  one warp per query row, lanes split head_dim, one warp reduction per key
 *               (model/attention.cuh: the model's for head_dims the flash kernels do not take)
 *   forward v2  one warp per query row, 32 keys at a time: each lane scores one key (q in shared
 *               memory), two warp reductions per tile (max, sum), the probabilities broadcast by shuffles
 *   forward v3  flash (FlashAttention-2) on tensor cores: mma.sync m16n8k16 BF16, ldmatrix, cp.async
 *               double-buffered K/V tiles, online softmax, causal tile skipping; 64-row query tiles (this
 *               file: the model's before issue 25)
 *   forward v4  the same with 128-row query tiles, each warp two 16-row slices sharing every K/V fragment
 *               (model/attention_flash.cuh: the model's for head_dim 32, 64, 128)
 *   backward v1 dq: warp per query row; dk, dv: warp per key row over its query group
 *   backward v2 flash on tensor cores: dq kernel (+ D), dk/dv kernel over the kv group, 7 tile products
 *               per pair (model/attention_flash_bwd.cuh: the model's)
 *   backward v3 flash, one kernel over key tiles, 5 tile products, dQ summed in key-tile order
 *               (model/attention_flash_bwd5.cuh: context parallelism's chunk pairs; 4x slower than v2 on a GPU)
 *   backward v4 v2 reshaped (issue 25): dq kernel of 128-row query tiles, each warp two 16-row slices sharing
 *               every K/V fragment; dk/dv kernel's iterations split over two blocks (FP32 halves, a sum kernel)
 *               for the tail (model/attention_flash_bwd2.cuh; a candidate for the model's)
 * Every version is validated against the CPU reference (out, lse; dqkv), which at the full size runs
 * on the first batch row only.
 * FLOPs counted: causal forward 4 B H hd T(T+1)/2 (S and P V); backward 2.5x that (FlashAttention's
 * convention; the flash dq kernel recomputes S and dP, so it executes 3.5x).
 *   make dev/cuda/attention && ./dev/cuda/attention [-f N] [-g N] [-b B] [-t T] [-h H] [-k KV] [-d hd]
 *     -f N / -g N: only forward / backward version N (0: all, the default; -1: none); default shape
 *     B 8, T 2048, H 8, KV 2, hd 128 (dbrx-1b). The model's flash kernels at dbrx-132b's attention shape:
 *     ./dev/cuda/attention -f 4 -g 3 -b 8 -t 4096 -h 48 -k 8 -d 128
 *   Under the emulator (attention_emu) a list of small shapes, validation only. attention_race (the race
 *   detector's build) runs backward v4 at a given shape; -p 1 there drops its dq kernel's end-of-tile barrier.
 */
#include "common.h"
#include "../../model/attention.cuh"
#include "../../model/attention_flash_bwd2.cuh"
#if defined(SIMT_RACE_DETECT)
static const bool RACE_BUILD = true;   // (attention_race: the detector's build)
#else
static const bool RACE_BUILD = false;
#endif
// the race detector's negative control (-p 1): backward v4's dq kernel without its one barrier a tile (the copy of
// tile j + 1's keys lands over the buffer of tile j - 1 while other warps may still read it)
static void plant_race() {
#if defined(SIMT_RACE_DETECT)
    simt::race_drop_barrier_set("flash_bwd2_dq_tile", true);
#endif
}

// (FLASH_BR, 64 query rows, from model/attention_flash_bwd.cuh: the old forward v3 has the dq kernel's rows)

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

// forward v3: the model's flash forward before issue 25 (64-row query tiles, 4 warps x 16 rows: each K/V
// fragment feeds one warp's 16 rows, 16 FLOPs per shared-memory byte), kept for comparison with v4
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
attention_forward_v3(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV) {
    constexpr int LD = HD + 8, KT = HD / 16, NT = FLASH_BC / 8, OT = HD / 8;
    floatX* Qs = (floatX*)dynamic_smem;            // (BR, LD)
    floatX* Ks = Qs + FLASH_BR * LD;               // (2, BC, LD): double-buffered
    floatX* Vs = Ks + 2 * FLASH_BC * LD;           // (2, BC, LD)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_BR;   // the last (longest) query tiles first
    int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV), C = H * HD;
    size_t qkv_dim = (size_t)(H + 2 * KV) * HD;
    const floatX* Qg = qkv + (size_t)b * T * qkv_dim + (size_t)h * HD;
    const floatX* Kg = qkv + (size_t)b * T * qkv_dim + (size_t)(H + kvh) * HD;
    const floatX* Vg = Kg + (size_t)KV * HD;
    const float sl2 = rsqrtf((float)HD) * FLASH_LOG2E;          // scores in log2 units, for exp2f
    const int ntiles = (min(q0 + FLASH_BR, T) - 1) / FLASH_BC + 1;   // causal: keys up to the last query row
    const int row0 = warp * 16, qa = q0 + row0 + g, qb = qa + 8;  // this lane's two query rows

    flash_load_tile<HD>(Qs, Qg, qkv_dim, q0, FLASH_BR, T);
    flash_load_tile<HD>(Ks, Kg, qkv_dim, 0, FLASH_BC, T);
    flash_load_tile<HD>(Vs, Vg, qkv_dim, 0, FLASH_BC, T);
    cp_async_commit();

    uint32_t qf[KT][4];                                   // the warp's Q rows as A fragments, loaded once
    float o[OT][4] = {};                                  // O (16, HD), unnormalised
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   // running max (log2 units) and this lane's part of the sum
    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {   // tile j + 1 into the other buffer while tile j is used
            flash_load_tile<HD>(Ks + (j + 1) % 2 * FLASH_BC * LD, Kg, qkv_dim, (j + 1) * FLASH_BC, FLASH_BC, T);
            flash_load_tile<HD>(Vs + (j + 1) % 2 * FLASH_BC * LD, Vg, qkv_dim, (j + 1) * FLASH_BC, FLASH_BC, T);
        }
        cp_async_commit();      // (an empty group on the last tile keeps the count uniform)
        cp_async_wait<1>();     // all groups but the newest, so tile j (and Q), have landed for this thread...
        __syncthreads();        // ...and for every thread
        if (j == 0)
            for (int kk = 0; kk < KT; kk++) frag_a(qf[kk], Qs, LD, row0, kk * 16);
        const floatX* Kt = Ks + j % 2 * FLASH_BC * LD;
        const floatX* Vt = Vs + j % 2 * FLASH_BC * LD;

        // S = Q K^T: (16, BC) per warp
        float s[NT][4] = {};
        for (int kk = 0; kk < KT; kk++)
            for (int n = 0; n < NT; n += 2) {
                uint32_t kf[4];
                frag_b_nmajor(kf, Kt, LD, n * 8, kk * 16);
                mma_m16n8k16_bf16_f32(s[n], qf[kk], kf, s[n]);
                mma_m16n8k16_bf16_f32(s[n + 1], qf[kk], kf + 2, s[n + 1]);
            }
        // causal mask, only on a tile that reaches past the warp's first row
        const int k0 = j * FLASH_BC;
        if (k0 + FLASH_BC - 1 > q0 + row0)
            for (int n = 0; n < NT; n++)
                for (int e = 0; e < 4; e++)
                    if (k0 + n * 8 + 2 * t4 + e % 2 > (e < 2 ? qa : qb)) s[n][e] = -INFINITY;
        // online softmax of row qa (elements 0, 1) and qb (2, 3); a row's scores are in the 4 lanes of a quad
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
            for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(m[r], mx * sl2);
            float m_use = m_new == -INFINITY ? 0.0f : m_new;   // nothing unmasked yet: exp2f(-inf) = 0, not NaN
            float corr = exp2f(m[r] - m_use);
            l[r] *= corr;
            for (int n = 0; n < OT; n++) { o[n][2 * r] *= corr; o[n][2 * r + 1] *= corr; }
            for (int n = 0; n < NT; n++)
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    // (P is rounded to bf16 as the A operand of P V; the sum, hence lse, keeps fp32)
                    float p = exp2f(s[n][e] * sl2 - m_use);
                    s[n][e] = p;
                    l[r] += p;
                }
            m[r] = m_new;
        }
        // O += P V: two adjacent 16x8 accumulator tiles of P are the A fragment of a 16-key step
        for (int kk = 0; kk < FLASH_BC / 16; kk++) {
            uint32_t pf[4];
            frag_a_from_acc(pf, s[2 * kk], s[2 * kk + 1]);
            for (int n = 0; n < OT; n += 2) {
                uint32_t vf[4];
                frag_b_kmajor(vf, Vt, LD, kk * 16, n * 8);
                mma_m16n8k16_bf16_f32(o[n], pf, vf, o[n]);
                mma_m16n8k16_bf16_f32(o[n + 1], pf, vf + 2, o[n + 1]);
            }
        }
        __syncthreads();           // every warp is done with buffer j % 2 before iteration j + 1 refills it
    }
    // the row sums of the quads; O / l through the warp's own Q rows (read by no one else) to 16-byte stores
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    flash_acc_to_smem<OT>(Qs, LD, row0, o, 1.0f / l[0], 1.0f / l[1]);
    __syncwarp();
    flash_store_rows<HD>(out + (size_t)b * T * C + (size_t)h * HD, C, q0 + row0, T, Qs + row0 * LD);
    if (t4 == 0) {   // natural-log units, of the scaled scores
        if (qa < T) lse[((size_t)b * H + h) * T + qa] = (m[0] + log2f(l[0])) / FLASH_LOG2E;
        if (qb < T) lse[((size_t)b * H + h) * T + qb] = (m[1] + log2f(l[1])) / FLASH_LOG2E;
    }
}

template <int HD>
static void attention_forward_v3_hd(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV) {
    size_t smem = (size_t)(FLASH_BR + 4 * FLASH_BC) * (HD + 8) * sizeof(floatX);
    cudaCheck(cudaFuncSetAttribute(attention_forward_v3<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(attention_forward_v3<HD>, dim3(ceil_div(T, FLASH_BR), H, B), FLASH_THREADS, smem, 0, out, lse, qkv, T, H, KV);
}
static void attention_forward_v3_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd) {
    if (hd == 32) attention_forward_v3_hd<32>(out, lse, qkv, B, T, H, KV);
    else if (hd == 64) attention_forward_v3_hd<64>(out, lse, qkv, B, T, H, KV);
    else attention_forward_v3_hd<128>(out, lse, qkv, B, T, H, KV);
}

// two outputs equal bit for bit (v4 against v3), reported as validate reports
static void validate_bits(const char* name, const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c,
                          const std::vector<float>& d) {
    bool same = a.size() == b.size() && c.size() == d.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(float)) &&
                !memcmp(c.data(), d.data(), c.size() * sizeof(float));
    validate(name, same ? std::vector<float>{0.0f} : std::vector<float>{1.0f}, std::vector<float>{0.0f}, 0.0, 0.0);
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
    const int NF = 4, NB = 4;
    float* d_acc = deviceAlloc(float, flash_bwd5_acc_floats(B, T, H, hd));
    int* d_sem = deviceAlloc(int, flash_bwd5_sem_ints(B, T, H));
    float* d_part = deviceAlloc(float, flash_bwd2_part_floats(B, T, KV, hd));
    std::function<void()> fwd[NF] = {
        [&] { attention_forward_rows_gpu(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { LAUNCH(attention_forward_v2, ceil_div((long long)B * H * T, 4), 128, 0, 0, dy, dlse, dq, B, T, H, KV, hd); },
        [&] { attention_forward_v3_gpu(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { flash_attention_forward_gpu(dy, dlse, dq, B, T, H, KV, hd); },
    };
    const char* fnames[NF] = {"forward v1 (warp per row)", "forward v2 (32-key tiles)", "forward v3 (flash, 64-row tiles)",
                              "forward v4 (flash, 128-row tiles)"};
    std::function<void()> bwd[NB] = {
        [&] { attention_backward_rows_gpu(ddq, dD, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        [&] { flash_attention_backward_gpu(ddq, dD, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        [&] { flash_attention_backward5_gpu(ddq, dD, d_acc, d_sem, ddout, dy, dlse, dq, B, T, H, KV, hd); },
        [&] { flash_attention_backward2_gpu(ddq, dD, d_part, ddout, dy, dlse, dq, B, T, H, KV, hd); },
    };
    const char* bnames[NB] = {"backward v1 (warp per row)", "backward v2 (flash, dq + dk/dv, 7 products)",
                              "backward v3 (flash, 5 products)", "backward v4 (flash, 2-slice dq, split dk/dv)"};
    std::vector<float> v2_dqkv;
    std::vector<float> v3_out, v3_lse;
    for (int v = 0; v < NF; v++) {
        if ((only_f && only_f != v + 1) || (v >= 2 && !flash)) continue;
        cudaCheck(cudaMemset(dy, 0xFF, (size_t)B * T * C * sizeof(floatX)));
        cudaCheck(cudaMemset(dlse, 0xFF, (size_t)B * H * T * sizeof(float)));
        fwd[v]();
        validate(fnames[v], from_device_bf16v(dy, nv), out, 1e-2, 1e-2);
        validate("  lse", from_device_f32(dlse, nl), lse, 1e-4, 1e-5);
        if (v == 2) { v3_out = from_device_bf16v(dy, nv); v3_lse = from_device_f32(dlse, nl); }
        if (v == 3 && !v3_out.empty())   // v4 does v3's arithmetic per row, tile for tile: the same bits
            validate_bits("  v4 = v3 (out, lse)", from_device_bf16v(dy, nv), v3_out, from_device_f32(dlse, nl), v3_lse);
        report_flops(fnames[v], flops, time_ms(EMULATED ? 1 : 5, fwd[v]));
    }
    // the backward reads out and lse: the forward of the same kind (v1's for v1, flash for v2)
    for (int v = 0; v < NB; v++) {
        if ((only_g && only_g != v + 1) || (v >= 1 && !flash)) continue;
        fwd[v == 0 ? 0 : 3]();
        cudaCheck(cudaMemset(ddq, 0xFF, qkv.size() * sizeof(floatX)));
        bwd[v]();
        validate(bnames[v], from_device_bf16v(ddq, nqv), dqkv, 1e-2, 1e-2);
        if (v == 1) v2_dqkv = from_device_bf16v(ddq, nqv);
        if (v == 2 && !v2_dqkv.empty()) {   // dK and dV: v2's dk/dv arithmetic, the same bits (dQ: summed per key tile)
            std::vector<float> a = from_device_bf16v(ddq, nqv), kv3, kv2;
            for (size_t i = 0; i < nqv; i++)
                if (i % qd >= (size_t)C) { kv3.push_back(a[i]); kv2.push_back(v2_dqkv[i]); }
            validate_bits("  v3 dK, dV = v2's", kv3, kv2, {}, {});
            if (EMULATED) {   // the same bits again (the order of the dQ sums is fixed)
                bwd[v]();
                validate_bits("  v3 run twice", from_device_bf16v(ddq, nqv), a, {}, {});
            }
        }
        if (v == 3 && EMULATED) {   // deterministic: every sum in a fixed order, so a second run gives the same bits
            std::vector<float> a = from_device_bf16v(ddq, nqv);
            bwd[v]();
            validate_bits("  v4 run twice", from_device_bf16v(ddq, nqv), a, {}, {});
        }
        report_flops(bnames[v], 2.5 * flops, time_ms(EMULATED ? 1 : 3, bwd[v]));
    }
    for (void* p : {(void*)dq, (void*)dy, (void*)ddout, (void*)ddq, (void*)dlse, (void*)dD, (void*)d_acc, (void*)d_sem, (void*)d_part}) cudaCheck(cudaFree(p));
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
        else if (!strcmp(argv[i], "-p") && x == 1 && RACE_BUILD) plant_race();
        else {
            fprintf(stderr, "usage: %s [-f N] [-g N] [-b B] [-t T] [-h H] [-k KV] [-d hd] [-p 1 (race build: the planted race)]\n", argv[0]);
            return 2;
        }
    }
    print_header("attention", "causal GQA");
    if (EMULATED && !shape_given) {
        // small shapes: odd T (tiles cut short, a single token), GQA 4:2, 8:1 and dbrx-1b's 4:1 (T 200: no
        // tile size divides it), head_dim 32/64/128 (flash) and 40 (v1, v2 only); B 2 where the batch offsets matter
        const int shapes[][5] = {{1, 70, 4, 2, 64}, {1, 1, 4, 2, 64}, {2, 17, 4, 2, 128}, {1, 129, 8, 1, 128},
                                 {1, 256, 4, 2, 128}, {1, 200, 8, 2, 128}, {2, 45, 4, 2, 32}, {1, 45, 4, 2, 40}};
        for (const auto& s : shapes) run_shape(only_f, only_g, s[0], s[1], s[2], s[3], s[4]);
    } else {
        run_shape(only_f, only_g, B, T, H, KV, hd);
    }
    return finish();
}
