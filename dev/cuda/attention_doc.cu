/*
 * attention_doc.cu — the model's attention under --doc-mask (model/attention.cuh: attention inside each document of a
 * packed sequence, an end-of-text opening one) against the plain causal attention, at one shape:
 *   forward   the wgmma forward (model/attention_wgmma_fwd.cuh) at head_dim 64 and 128, the mma.sync one otherwise
 *   backward  the model's default on Hopper, wgmma-overlap (model/attention_wgmma_bwd.cuh: the D kernel, dq, dk/dv)
 * with documents of -l LEN tokens (every sequence: an end-of-text at 0, LEN, 2 LEN, ...; the last one shorter) and without
 * a mask. The masked kernels skip the key tiles before a block's first row's document and the query tiles past its
 * last key's document, and mask the rest: on a device the time should fall toward the documents' share of the causal
 * FLOPs, which this program prints beside each time ("attended": 4 hd H B sum over documents of n (n + 1) / 2 for the
 * forward, 2.5 x that for the backward's five products).
 * Validation: the masked forward and backward against the CPU reference with the mask (out 1e-2, lse 1e-4, dqkv 1e-2);
 * the CPU reference is cheap at the emulated shapes and at -t 1024 on a device, which checks before it times.
 *   make dev/cuda/attention_doc && ./dev/cuda/attention_doc [-b B] [-t T] [-h H] [-k KV] [-d hd] [-l LEN]
 *     default dbrx-1b's attention shape B 8, T 2048, H 8, KV 2, hd 128, documents of 512 tokens; under the emulator small
 *     shapes.
 */
#include "common.h"
#include "../../model/attention.cuh"

// inputs (B, T) with an end-of-text (7) every len tokens; bounds (2, B, T): the documents' starts then ends
static std::vector<int> doc_inputs_bounds(int B, int T, int len) {
    std::vector<int> in((size_t)B * T, 1), bounds(2 * (size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t += len) in[(size_t)b * T + t] = 7;
    doc_bounds(bounds.data(), bounds.data() + (size_t)B * T, in.data(), B, T, 7);
    return bounds;
}

static void run_shape(int B, int T, int H, int KV, int hd, int len, bool time_too) {
    int qd = (H + 2 * KV) * hd, C = H * hd;
    printf("B %d, T %d, H %d, KV %d, hd %d, documents of %d tokens\n", B, T, H, KV, hd, len);
    std::vector<float> qkv = round_bf16(make_random((size_t)B * T * qd, 1, 1.5)), dout = round_bf16(make_random((size_t)B * T * C, 2));
    std::vector<int> bounds = doc_inputs_bounds(B, T, len);
    size_t no = (size_t)B * T * C, nl = (size_t)B * H * T;
    floatX *dq = to_device_bf16v(qkv), *dy = deviceAlloc(floatX, no), *ddout = to_device_bf16v(dout), *ddqkv = deviceAlloc(floatX, qkv.size());
    float *dlse = deviceAlloc(float, nl), *dD = deviceAlloc(float, attention_backward_scratch_floats(B, T, H, hd));
    int* dbounds = to_device(bounds);
    const DocMask doc = {dbounds, dbounds + (size_t)B * T}, none = {};
    g_attention_bwd = 2;   // (the model's backward on Hopper; the mma.sync pair at head_dims without a wgmma kernel)
    auto fwd = [&](DocMask m) { attention_forward_gpu(dy, dlse, dq, B, T, H, KV, hd, 0, m); };
    auto bwd = [&](DocMask m) { attention_backward_gpu(ddqkv, dD, ddout, dy, dlse, dq, B, T, H, KV, hd, 0, m); };
    bool cpu = EMULATED || (double)B * T * T * H <= 1e9;
    if (cpu) {
        std::vector<float> out(no), lse(nl), dqkv(qkv.size());
        DocMask host = {bounds.data(), bounds.data() + (size_t)B * T};
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd, host);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, hd, host);
        fwd(doc);
        validate("forward with the document mask", from_device_bf16v(dy, no), out, 1e-2, 1e-2);
        validate("  lse", from_device_f32(dlse, nl), lse, 1e-4, 1e-5);
        bwd(doc);
        validate("backward with the document mask (wgmma-overlap)", from_device_bf16v(ddqkv, qkv.size()), dqkv, 1e-2, 1e-2);
    }
    if (time_too) {
        double causal = 4.0 * B * H * hd * (double)T * (T + 1) / 2, attended = 0;
        for (int s = 0; s < T; s += len) { double n = std::min(len, T - s); attended += 4.0 * B * H * hd * n * (n + 1) / 2; }
        printf("  attended FLOPs %.1f%% of the causal ones\n", 100.0 * attended / causal);
        float f0 = time_ms(5, [&] { fwd(none); }), f1 = time_ms(5, [&] { fwd(doc); });
        fwd(none);
        float b0 = time_ms(5, [&] { bwd(none); });
        fwd(doc);
        float b1 = time_ms(5, [&] { bwd(doc); });
        report_flops("forward, causal", causal, f0);
        report_flops("forward, documents (attended FLOPs)", attended, f1);
        report_flops("backward, causal", 2.5 * causal, b0);
        report_flops("backward, documents (attended FLOPs)", 2.5 * attended, b1);
        printf("  masked / causal time: forward %.3f, backward %.3f (the attended share %.3f)\n", f1 / f0, b1 / b0, attended / causal);
    }
    g_attention_bwd = 0;
    for (void* p : {(void*)dq, (void*)dy, (void*)ddout, (void*)ddqkv, (void*)dlse, (void*)dD, (void*)dbounds}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    int B = 8, T = 2048, H = 8, KV = 2, hd = 128, len = 512;
    bool shape_given = false;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]); return 2; }
        int x = atoi(argv[i + 1]);
        int* dst = !strcmp(argv[i], "-b") ? &B : !strcmp(argv[i], "-t") ? &T : !strcmp(argv[i], "-h") ? &H : !strcmp(argv[i], "-k") ? &KV
                 : !strcmp(argv[i], "-d") ? &hd : !strcmp(argv[i], "-l") ? &len : nullptr;
        if (!dst || x <= 0) {
            fprintf(stderr, "usage: %s [-b B] [-t T] [-h H] [-k KV] [-d hd] [-l document length]\n", argv[0]);
            return 2;
        }
        *dst = x;
        shape_given = true;
    }
    if (H % KV || hd % 2 || hd > 256) { fprintf(stderr, "%s: H %d must be a multiple of KV %d, hd %d even and <= 256\n", argv[0], H, KV, hd); return 2; }
    print_header("attention with the document mask (--doc-mask)", "causal GQA, packed documents");
    if (EMULATED && !shape_given) {
        // head_dim 128 (DBRX's) at GQA 6:1, documents of 100 (blocks of 128 rows start inside one: the forward and dq
        // skip key tiles, dk/dv query tiles); 64 with documents of 33; 32 (the mma.sync kernels) with documents of 50
        run_shape(2, 320, 6, 1, 128, 100, false);
        run_shape(1, 200, 4, 2, 64, 33, false);
        run_shape(1, 160, 4, 2, 32, 50, false);
    } else {
        if (!EMULATED) run_shape(1, 1024, H, KV, hd, std::min(len, 1024), false);   // against the CPU first
        run_shape(B, T, H, KV, hd, len, !EMULATED);
    }
    return finish();
}
