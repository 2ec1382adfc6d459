/*
 * attention_wgmma.cu — the causal GQA flash attention forward on Hopper's warpgroup MMA (model/wgmma.cuh), issue 25's
 * Hopper attention (FlashAttention-3's approach): the model's forward at head_dim 64 and 128 (model/attention_wgmma_fwd.cuh)
 * was v2 from session 40 and is v4 since session 62; v1 stays here. Same contract as the mma.sync forward (model/attention_flash.cuh,
 * dev/cuda/attention.cu's forward v4, which the model keeps for head_dim 32 and context parallelism): from qkv
 * (B, T, (H + 2 KV) hd) after clip + RoPE, out (B, T, H hd) and lse (B, H, T) (natural log of the scaled scores).
 *   forward wgmma v1  grid (T/128 query tiles, H, B), 2 warpgroups (256 threads); warpgroup w owns query rows
 *        64 w .. 64 w + 63 of the tile. Q (128 x hd) and double-buffered K, V tiles of 64 keys are copied by
 *        16-byte cp.async into the 128B-swizzled layout: panels of 64 head dims (128 bytes a row), 8-row atoms
 *        of 1024 bytes, the 16-byte chunk c of row r at c ^ r % 8. Per key tile:
 *          S (64 x 64) = Q K^T   hd/16 wgmma m64n64k16, A = Q and B = K by descriptor, both K-major
 *                                (keys x head_dim row-major is B's K-major layout: SBO 1024, k-step + 32 bytes,
 *                                the next panel + rows 128 bytes)
 *          online softmax on the accumulators (thread rows g and g + 8 of its warp's 16: a row in the 4 lanes of
 *                                a quad, two shuffles), log2 domain, causal mask on the diagonal tiles
 *          O (64 x hd) += P V    4 wgmma m64n(hd)k16, A = P from registers (the S accumulators rounded to bf16:
 *                                the D layout of two 8-column groups is the A fragment), B = V MN-major
 *                                (transpose flag 1: head_dim contiguous; SBO 1024 between 8-key groups, LBO
 *                                = the panel size between 64-dim panels, the next k-step + 2048 bytes)
 *        A warpgroup skips a key tile wholly past its last row (causal). The copy of tile j + 1 overlaps tile j's
 *        math; each wgmma group is waited for at once. O / l stored as bf16 pairs straight from the accumulators.
 *   forward wgmma v2  (the model's until session 62: model/attention_wgmma_fwd.cuh) v1 with FlashAttention-3's intra-warpgroup overlap, in its order: iteration j issues
 *        S(j + 1) = Q K(j + 1)^T and O += P(j) V(j), waits for S(j + 1) only and runs its softmax while P(j) V(j)
 *        computes; 3 K/V buffers (tile j + 2 copied during tile j). No branch around a wgmma (ptxas serializes
 *        them all otherwise): a warpgroup also runs the tile past its rows, wholly masked (a no-op bit for bit).
 *        (Not there: the ping-pong of two warpgroups' softmax and MMAs, a producer warpgroup with TMA, setmaxnreg.)
 *   forward wgmma v3  v2 at key tiles of 128 (BC 128: S is m64n128k16, 8 P V k-steps a tile; half the barriers, waits and
 *        softmax reductions per key; 225 KiB of shared memory at hd 128). Its softmax goes by 128 keys: not v4's bits.
 *   forward wgmma v4  v2 with 3 consumer warpgroups, 192 query rows a block (384 threads: three warpgroups issue
 *        MMAs beside each other's softmax where v2 has two; 145 KiB; warpgroup 0 runs up to two masked tiles, 1 one).
 *        v3 and v4 are v2's kernel at other template arguments (model/attention_wgmma_fwd.cuh). On an H200 (session 62)
 *        at dbrx-1b's attention: v2 211.9 TFLOP/s, v3 233.1, v4 242.6: v4 is the model's since (v2 was until then).
 *   forward v4  the mma.sync forward (model/attention_flash.cuh, the model's before session 40), timed alongside
 * Validation: against the CPU reference (out 1e-2, lse 1e-4), and at the timing shape against forward v4.
 *   make dev/cuda/attention_wgmma && ./dev/cuda/attention_wgmma [-b B] [-t T] [-h H] [-k KV] [-d hd (64, 128)]
 *     default dbrx-132b's attention shape B 8, T 4096, H 48, KV 8, hd 128; under the emulator small shapes.
 */
#include "common.h"
#include "../../model/attention.cuh"

// (the tile copy, S, the softmax, P V, the store and the block's setup: model/attention_wgmma_fwd.cuh, with v2)

// v1: per key tile, S = Q K^T issued and waited for, the softmax, O += P V issued and waited for
template <int HD>
__global__ void __launch_bounds__(WGA_THREADS) attention_forward_wgmma(floatX* out, float* lse, const floatX* qkv, int T, int H, int KV) {
    WGA_SETUP(2);
    wga_load_tile<HD>(Qs, Qg, qkv_dim, q0, WGA_BR, T);
    wga_load_tile<HD>(Ks, Kg, qkv_dim, 0, WGA_BC, T);
    wga_load_tile<HD>(Vs, Vg, qkv_dim, 0, WGA_BC, T);
    cp_async_commit();
    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {   // tile j + 1 into the other buffer while tile j is used
            wga_load_tile<HD>(Ks + (j + 1) % 2 * KB, Kg, qkv_dim, (j + 1) * WGA_BC, WGA_BC, T);
            wga_load_tile<HD>(Vs + (j + 1) % 2 * KB, Vg, qkv_dim, (j + 1) * WGA_BC, WGA_BC, T);
        }
        cp_async_commit();      // (an empty group on the last tile keeps the count uniform)
        cp_async_wait<1>();     // tile j (and Q) landed for this thread...
        wgmma_fence_proxy();    // ...made visible to the asynchronous proxy (wgmma's operand reads)...
        __syncthreads();        // ...for every thread
        const int k0 = j * WGA_BC;
        if (k0 <= wrow0 + 63) {   // (warpgroup-uniform) a key of this tile at or before the warpgroup's last row
            float s[WGA_BC / 2] = {};
            wga_issue_s<HD>(s, Qw, Ks + j % 2 * KB);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operand(s);
            const int no_doc[2] = {0, 0};   // (no document mask)
            wga_softmax(s, m, l, corr, k0, wrow0, qa, qb, sl2, no_doc);
            wga_pack_p(pf, s);
            wga_issue_pv<HD>(o, corr, pf, Vs + j % 2 * KB);
            wgmma_wait<0>();
            wgmma_fence_operand(o);
        }
        __syncthreads();   // every warpgroup's MMAs are done with buffer j % 2 before iteration j + 1 refills it
    }
    wga_store<HD>(out, lse, o, m, l, b, h, T, H, qa, qb);
}

// V 1: v1 here; 2: v2 (2 warpgroups); 3: v2 at key tiles of 128; 4: v2 with 3 warpgroups (192 query rows: the model's);
// 5: the model's with 2 buffers, planted (a race)
template <int V> static void wgmma_forward_version(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd) {
    if (V == 2) return attention_forward_wgmma_gpu<3, 64, 2>(out, lse, qkv, B, T, H, KV, hd);
    if (V == 3) return attention_forward_wgmma_gpu<3, 128, 2>(out, lse, qkv, B, T, H, KV, hd);
    if (V == 4) return attention_forward_wgmma_gpu<3>(out, lse, qkv, B, T, H, KV, hd);   // (the model's: NWG 3)
    if (V == 5) return attention_forward_wgmma_gpu<2>(out, lse, qkv, B, T, H, KV, hd);
    size_t smem = (size_t)(WGA_BR + 4 * WGA_BC) * hd * 2 + 1024;   // Q, 2 K/V buffers, the alignment
    auto kernel = hd == 64 ? attention_forward_wgmma<64> : attention_forward_wgmma<128>;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(kernel, dim3(ceil_div(T, WGA_BR), H, B), WGA_THREADS, smem, 0, out, lse, qkv, T, H, KV);
}

// validates the wgmma forwards (and the product's v4 alongside) against the CPU reference at a shape; with `time_too`
// (a GPU) times them
static void run_shape(int B, int T, int H, int KV, int hd, bool time_too, bool plant = false) {
    int qd = (H + 2 * KV) * hd, C = H * hd;
    printf("B %d, T %d, H %d, KV %d, hd %d\n", B, T, H, KV, hd);
    std::vector<float> qkv = round_bf16(make_random((size_t)B * T * qd, 1, 1.5));
    size_t no = (size_t)B * T * C, nl = (size_t)B * H * T;
    floatX *dq = to_device_bf16v(qkv), *dy = deviceAlloc(floatX, no);
    float* dlse = deviceAlloc(float, nl);
    double flops = 4.0 * B * H * hd * (double)T * (T + 1) / 2;
    const char* names[5] = {"forward v4 (mma.sync)", "forward wgmma v1", "forward wgmma v2 (overlap)",
                            "forward wgmma v3 (v2, key tiles of 128)", "forward wgmma v4 (v2, 3 warpgroups: 192 rows; the model's)"};
    std::function<void()> fwd[5] = {
        [&] { flash_attention_forward_gpu(dy, dlse, dq, B, T, H, KV, hd); },   // (the mma.sync kernel, not attention_forward_gpu)
        [&] { wgmma_forward_version<1>(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { if (plant) wgmma_forward_version<5>(dy, dlse, dq, B, T, H, KV, hd);
              else wgmma_forward_version<2>(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { wgmma_forward_version<3>(dy, dlse, dq, B, T, H, KV, hd); },
        [&] { wgmma_forward_version<4>(dy, dlse, dq, B, T, H, KV, hd); },
    };
    // the CPU reference where it is cheap (emulated shapes, or B * T * T * H small); else v4's result
    bool cpu = EMULATED || (double)B * T * T * H <= 1e9;
    std::vector<float> want_o(no), want_l(nl), v4_o, v4_l;
    if (cpu) attention_forward(want_o.data(), want_l.data(), qkv.data(), B, T, H, KV, hd);
    for (int v = 0; v < 5; v++) {
        if (plant && v != 2) continue;
        cudaCheck(cudaMemset(dy, 0xFF, no * sizeof(floatX)));
        cudaCheck(cudaMemset(dlse, 0xFF, nl * sizeof(float)));
        fwd[v]();
        std::vector<float> got_o = from_device_bf16v(dy, no), got_l = from_device_f32(dlse, nl);
        if (!cpu && v == 0) { want_o = got_o; want_l = got_l; }
        if (plant) continue;
        if (v == 0) { v4_o = got_o; v4_l = got_l; }
        char what[96];
        snprintf(what, sizeof what, "%s%s", names[v], cpu ? "" : " vs v4");
        validate(what, got_o, want_o, 1e-2, 1e-2);
        validate("  lse", got_l, want_l, 1e-4, 1e-5);
        // emulated, both kernels sum every product in the same order (the emulator's mma.sync and wgmma: k order,
        // fp32 after each add) and do the same softmax arithmetic: the same bits (a GPU's wgmma may order the sums
        // otherwise). Not v3: its softmax goes by 128 keys, so its running maxima and O's rescalings fall elsewhere
        if (EMULATED && v >= 1 && v != 3) {
            bool same = !memcmp(got_o.data(), v4_o.data(), no * sizeof(float)) && !memcmp(got_l.data(), v4_l.data(), nl * sizeof(float));
            validate("  wgmma = v4 bit for bit", {same ? 0.0f : 1.0f}, {0.0f}, 0.0, 0.0);
        }
        if (time_too) report_flops(names[v], flops, time_ms(5, fwd[v]));
    }
    for (void* p : {(void*)dq, (void*)dy, (void*)dlse}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    int B = 8, T = 4096, H = 48, KV = 8, hd = 128, plant = 0;
    bool shape_given = false;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        int x = atoi(argv[i + 1]);
        int* dst = !strcmp(argv[i], "-b") ? &B : !strcmp(argv[i], "-t") ? &T : !strcmp(argv[i], "-h") ? &H : !strcmp(argv[i], "-k") ? &KV
                 : !strcmp(argv[i], "-d") ? &hd : !strcmp(argv[i], "-p") ? &plant : nullptr;
        if (!dst || x <= 0 || (dst == &plant && x != 1)) {
            fprintf(stderr, "usage: %s [-b B] [-t T] [-h H] [-k KV] [-d hd (64 or 128)] [-p 1 (emulated: v2's planted race)]\n", argv[0]);
            return 2;
        }
        *dst = x;
        shape_given |= dst != &plant;
    }
    if ((hd != 64 && hd != 128) || H % KV) { fprintf(stderr, "%s: hd %d must be 64 or 128 and H %d a multiple of KV %d\n", argv[0], hd, H, KV); return 2; }
    print_header("attention, wgmma forward", "causal GQA");
    if (plant) {   // the race detector's negative control: v2 with 2 K/V buffers at 5 key tiles
        if (!EMULATED) { fprintf(stderr, "%s: -p 1 is for the emulated builds\n", argv[0]); return 2; }
        run_shape(1, 320, 6, 1, 128, false, true);
    } else if (EMULATED && !shape_given) {
        // DBRX's head_dim 128 and GQA 6:1 (48 / 8 scaled down; T 320: 5 key tiles, v2's 4 buffers wrap), T cut short
        // of a tile, B 2's offsets; head_dim 64; T 600: v3's 5 key tiles of 128 (its buffers wrap), cut short of a tile
        // (the race build: 2 heads where there are 4 or 6, the same tiles and GQA sharing, a third of the checked accesses)
#if defined(SIMT_RACE_DETECT)
        const int shapes[][5] = {{1, 320, 2, 1, 128}, {2, 77, 2, 1, 128}, {1, 130, 2, 1, 64}, {1, 600, 1, 1, 128}};
#else
        const int shapes[][5] = {{1, 320, 6, 1, 128}, {2, 77, 4, 2, 128}, {1, 130, 4, 1, 64}, {1, 600, 2, 1, 128}};
#endif
        for (const auto& s : shapes) run_shape(s[0], s[1], s[2], s[3], s[4], false);
    } else {
        if (!EMULATED) run_shape(1, 1024, H, KV, hd, false);   // against the CPU first
        run_shape(B, T, H, KV, hd, !EMULATED);
    }
    return finish();
}
