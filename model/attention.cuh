/*
 * attention.cuh — DBRX attention after the fused Wqkv projection:
 *   clip_qkv clamp of the whole fused output, NeoX-style RoPE on q and k, and causal GQA
 *   attention (softmax in fp32). K and V are never repeated: query head h reads kv head
 *   h / (H / kv) in place. For generation, the attention of one new position over a KV cache
 *   (attention_decode_forward / attention_decode_gpu).
 * Layout of one token's fused row (qkv_dim = d + 2*kv*hd):  [ Q: H*hd | K: kv*hd | V: kv*hd ].
 */
#pragma once
#include "common.h"

// ---------------------------------------------------------------------------------------------
// clip_qkv: out = clamp(inp, -clip, clip). Backward passes the gradient where -clip <= x <= clip
// (the clamp's own inclusive semantics) and zeroes it where the value was clamped. A negative clip
// (DBRX_OFF, Hugging Face's clip_qkv null) is no clamp; every clip >= 0 clamps, as the original's
// clamp(min=-clip, max=clip) does (config_validate refuses 0 before it gets here).

static inline void clip_forward(real* out, const real* inp, size_t n, float clip) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
        out[i] = clip >= 0 ? std::fmin(std::fmax(x, (real)-clip), (real)clip) : x;
    }
}
// dinout (n): gradient w.r.t. the clamp's output on entry, w.r.t. its input on return
static inline void clip_backward(real* dinout, const real* inp, size_t n, float clip) {
    if (clip < 0) return;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        if (inp[i] < -clip || inp[i] > clip) dinout[i] = 0;
}

// ---------------------------------------------------------------------------------------------
// RoPE, NeoX / rotate_half style (not interleaved). For pair i < hd/2 at position p:
//   inv_freq_i = theta^(-2i/hd),  angle = p * inv_freq_i   (cos/sin in fp32)
//   out[i]        = x[i] * cos - x[i + hd/2] * sin
//   out[i + hd/2] = x[i + hd/2] * cos + x[i] * sin

// inv_freq_i, bit for bit as the original DBRX code computes it in fp32:
//   1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
// three fp32 roundings: the exponent 2i/hd, the power, the reciprocal. (Rounding theta^(-2i/hd) once
// from double differs by an ulp in 18 of the 64 frequencies at hd 128, theta 5e5, which moves the
// angle at position 32k by up to 2e-3 rad.) The power is computed in double and rounded once to fp32,
// i.e. the correctly rounded fp32 power, which is what torch's fp32 pow returns for these arguments
// (test/test_pytorch_parity.py checks every frequency of hd 128, theta 5e5 against torch, bit for bit).
static inline float rope_inv_freq(int i, int hd, float theta) {
    float e = (float)(2 * i) / (float)hd;
    float pw = (float)std::pow((double)theta, (double)e);
    return 1.0f / pw;
}

// cos, sin (T, hd/2). The angle is the fp32 product p * inv_freq_i (the original multiplies fp32
// positions by the fp32 frequencies, one rounding); cos and sin of that fp32 angle are computed in
// double and rounded to fp32, within an ulp of torch's fp32 cos/sin (which are not correctly rounded
// either way, and differ between its CPU and CUDA kernels).
static inline void rope_tables(real* cos_t, real* sin_t, int T, int hd, float theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = rope_inv_freq(i, hd, theta);
        for (int p = 0; p < T; p++) {
            float angle = (float)p * inv_freq;
            cos_t[(size_t)p * half + i] = (real)(float)std::cos((double)angle);
            sin_t[(size_t)p * half + i] = (real)(float)std::sin((double)angle);
        }
    }
}

// Rotates, in place, the Q and K heads of qkv (B, T, qkv_dim). The inverse rotation (sin -> -sin)
// is the backward: the rotation is orthogonal.
static inline void rope_rotate(real* qkv, const real* cos_t, const real* sin_t, int B, int T, int H, int KV,
                               int hd, bool inverse) {
    int half = hd / 2, qkv_dim = (H + 2 * KV) * hd;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            real* row = qkv + ((size_t)b * T + t) * qkv_dim;
            const real* c = cos_t + t * half;
            const real* s = sin_t + t * half;
            for (int h = 0; h < H + KV; h++) {  // H query heads, then KV key heads
                real* x = row + h * hd;
                for (int i = 0; i < half; i++) {
                    real sn = inverse ? -s[i] : s[i];
                    real x1 = x[i], x2 = x[i + half];
                    x[i] = x1 * c[i] - x2 * sn;
                    x[i + half] = x2 * c[i] + x1 * sn;
                }
            }
        }
}
static inline void rope_forward(real* qkv, const real* cos_t, const real* sin_t, int B, int T, int H, int KV, int hd) {
    rope_rotate(qkv, cos_t, sin_t, B, T, H, KV, hd, false);
}
// dqkv (B, T, qkv_dim): gradient w.r.t. the rotated q, k on entry, w.r.t. the unrotated on return
static inline void rope_backward(real* dqkv, const real* cos_t, const real* sin_t, int B, int T, int H, int KV, int hd) {
    rope_rotate(dqkv, cos_t, sin_t, B, T, H, KV, hd, true);
}

// ---------------------------------------------------------------------------------------------
// Document masking (--doc-mask EOT; LLM Foundry's attn_uses_sequence_id, which its DBRX yamls set): a packed
// sequence holds several documents, and a token attends to the earlier tokens of its own document only. This
// project's shards put the end-of-text token before every document (data/README.md), so an end-of-text opens a
// document: doc (B, T) holds, for each token, the position of its document's first token in the sequence (the
// last t' <= t whose input is EOT; 0 where no EOT precedes it: a document that began before the sequence), and
// query t sees the keys doc[t] <= t2 <= t. (LLM Foundry's EOS ends a document instead, its sequence_id shifted
// by one: the separator sees the document before it. RoPE positions stay the sequence's, as there.) The kernels
// that walk the keys of a query row read its start; those that walk the query rows of a key read where the key's
// document ends (the next document's start, or T): query t sees key t2 <= t exactly when t < end[t2]. The flash kernels
// skip the tiles no row of a block sees (the key tiles before its first row's document; the query tiles past its last
// key's document): a masked tile adds exact zeros, so skipping changes no bit.
// start NULL: plain causal attention, bit for bit the same as before the option existed.
inline int g_doc_mask_eot = -1;   // --doc-mask: the end-of-text token id (-1: off)
typedef struct {
    const int* start;   // (B, T): the position of the token's document's first token; NULL: no document mask
    const int* end;     // (B, T): the position after its document's last token
} DocMask;
#if defined(SIMT_EMULATION)
#include <string>
// the emulator's work log (SIMT_WORKLOG) records a kernel's DocMask as ["doc_mask", 0 | 1]: the step-time model's formulas
// (dev/predict/kernel_cost.py) take it off the arguments (the kernels run the same tiles with or without it)
static inline std::string worklog_fields(const DocMask& doc) { return doc.start ? "[\"doc_mask\",1]" : "[\"doc_mask\",0]"; }
#endif

// The share of the causal (query, key) pairs that --doc-mask keeps for inputs (B, T): each query t sees t - start + 1
// keys instead of t + 1 (MFU counts attention as executed: model/config.h's flops_per_token)
static inline double doc_attended_share(const int* inputs, int B, int T, int eot) {
    double kept = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0, s = 0; t < T; t++) {
            if (inputs[(size_t)b * T + t] == eot) s = t;
            kept += t - s + 1;
        }
    return B > 0 && T > 0 ? kept / ((double)B * T * (T + 1) / 2) : 1.0;
}

// start, end (B, T each) of the documents of inputs (B, T)
static inline void doc_bounds(int* start, int* end, const int* inputs, int B, int T, int eot) {
    for (int b = 0; b < B; b++) {
        const int* in = inputs + (size_t)b * T;
        for (int t = 0, s = 0; t < T; t++) {
            if (in[t] == eot) s = t;
            start[(size_t)b * T + t] = s;
        }
        for (int t = T - 1, e = T; t >= 0; t--) {
            end[(size_t)b * T + t] = e;
            if (in[t] == eot) e = t;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// causal GQA attention
//   out (B, T, H*hd) and lse (B, H, T), the logsumexp of every row of scaled scores, from qkv
//   (B, T, qkv_dim) after clip and RoPE. The (T, T) probabilities are never stored: the backward
//   recomputes p[t][t2] = exp(scale q_t . k_t2 - lse[t]), the contract of the GPU kernels too.
//   doc: the document mask above (row t over the keys doc.start[t] .. t; none where doc.start is NULL).

// One query row: o (hd) = softmax(scale q . k[t2]) v[t2] over t2 < n, the keys and values `stride`
// elements apart (k0, v0: the first); p (n) scratch. Returns the logsumexp of the scaled scores. The causal
// forward's row t is n = t + 1 over qkv; the decode step's is n = pos + 1 over the KV cache: one arithmetic.
static inline real attention_row(real* o, real* p, const real* q, const real* k0, const real* v0, size_t stride, int n, int hd,
                                 real scale) {
    real maxv = -INFINITY;
    for (int t2 = 0; t2 < n; t2++) {
        const real* k = k0 + (size_t)t2 * stride;
        real s = dot_lanes8<real>(q, k, hd);
        s *= scale;
        p[t2] = s;
        if (s > maxv) maxv = s;
    }
    real sum = 0;
    for (int t2 = 0; t2 < n; t2++) { p[t2] = std::exp(p[t2] - maxv); sum += p[t2]; }
    for (int i = 0; i < hd; i++) o[i] = 0;
    for (int t2 = 0; t2 < n; t2++) {
        const real* v = v0 + (size_t)t2 * stride;
        real pt = p[t2] / sum;
        for (int i = 0; i < hd; i++) o[i] += pt * v[i];
    }
    return maxv + std::log(sum);
}

static inline void attention_forward(real* out, real* lse, const real* qkv, int B, int T, int H, int KV, int hd,
                                     DocMask doc = {}) {
    int qkv_dim = (H + 2 * KV) * hd, group = H / KV, C = H * hd;
    real scale = (real)1 / std::sqrt((real)hd);
    #pragma omp parallel
    {
        real* p = (real*)mallocCheck((size_t)T * sizeof(real));
        #pragma omp for collapse(3)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    int kvh = h / group, lo = doc.start ? doc.start[(size_t)b * T + t] : 0;   // (keys lo .. t)
                    const real* row0 = qkv + (size_t)b * T * qkv_dim;   // this sequence's first row
                    const real* klo = row0 + (size_t)lo * qkv_dim + C + kvh * hd;
                    lse[((size_t)b * H + h) * T + t] =
                        attention_row(out + ((size_t)b * T + t) * C + h * hd, p, row0 + (size_t)t * qkv_dim + h * hd,
                                      klo, klo + KV * hd, qkv_dim, t + 1 - lo, hd, scale);
                }
        free(p);
    }
}

// dqkv (B, T, qkv_dim) = gradient of the attention inputs (overwritten), from dout (B, T, H*hd) and
// the forward's lse:
//   p[t2] = exp(scale q . k[t2] - lse);  dp[t2] = dout . v[t2];  ds = p * (dp - sum(p * dp));
//   dq += scale ds k;  dk += scale ds q;  dv += p dout
// One thread per (batch, kv head) owns that kv head's dk, dv and its query heads' dq: race-free
// and the summation order is fixed.
static inline void attention_backward(real* dqkv, const real* dout, const real* qkv, const real* lse,
                                      int B, int T, int H, int KV, int hd, DocMask doc = {}) {
    int qkv_dim = (H + 2 * KV) * hd, group = H / KV, C = H * hd;
    real scale = (real)1 / std::sqrt((real)hd);
    memset(dqkv, 0, (size_t)B * T * qkv_dim * sizeof(real));
    #pragma omp parallel
    {
        real* p = (real*)mallocCheck((size_t)T * sizeof(real));
        real* dp = (real*)mallocCheck((size_t)T * sizeof(real));
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++)
            for (int kvh = 0; kvh < KV; kvh++)
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int t = 0; t < T; t++) {
                        real row_lse = lse[((size_t)b * H + h) * T + t];
                        const real* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
                        const real* dy = dout + ((size_t)b * T + t) * C + h * hd;
                        real* dq = dqkv + ((size_t)b * T + t) * qkv_dim + h * hd;
                        const int lo = doc.start ? doc.start[(size_t)b * T + t] : 0;
                        real pdp = 0;
                        for (int t2 = lo; t2 <= t; t2++) {
                            const real* k = qkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
                            const real* v = k + KV * hd;
                            real* dv = dqkv + ((size_t)b * T + t2) * qkv_dim + C + KV * hd + kvh * hd;
                            real s = dot_lanes8<real>(q, k, hd);
                            p[t2] = std::exp(s * scale - row_lse);
                            real d = dot_lanes8<real>(dy, v, hd);
                            for (int i = 0; i < hd; i++) dv[i] += p[t2] * dy[i];
                            dp[t2] = d;
                            pdp += p[t2] * d;
                        }
                        for (int t2 = lo; t2 <= t; t2++) {
                            real ds = p[t2] * (dp[t2] - pdp) * scale;
                            const real* k = qkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
                            real* dk = dqkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
                            for (int i = 0; i < hd; i++) { dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                        }
                    }
        free(p);
        free(dp);
    }
}

// ---------------------------------------------------------------------------------------------
// decoding with a KV cache (generation): the attention of one new position over the keys and values
// of every position before it and its own, which the cache holds. The same arithmetic as
// attention_forward's row t = pos, so that a cached step reproduces the full causal forward.
//   cache (T_max, 2*KV*hd): row t2 = [K: KV*hd | V: KV*hd] of position t2, K after clip and RoPE
//   (the K/V tail of that position's fused qkv row), rows 0..pos filled
//   q (H*hd): the query heads of position pos (the head of its fused row), after clip and RoPE
//   out (H*hd); att (H, pos+1) scratch

static inline void attention_decode_forward(real* out, real* att, const real* q, const real* cache, int pos, int H, int KV,
                                            int hd) {
    int group = H / KV, kvw = 2 * KV * hd;
    real scale = (real)1 / std::sqrt((real)hd);
    #pragma omp parallel for
    for (int h = 0; h < H; h++) {
        int kvh = h / group;
        attention_row(out + (size_t)h * hd, att + (size_t)h * (pos + 1), q + (size_t)h * hd, cache + kvh * hd,
                      cache + KV * hd + kvh * hd, kvw, pos + 1, hd, scale);
    }
}

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA. clip_qkv + RoPE is one fused kernel each way. Attention: the flash kernels on tensor cores
// (attention_flash.cuh) for head_dim 32, 64 and 128, and for any other head_dim these simple ones,
// with the same contract as the CPU reference: the forward saves only the output and the
// logsumexp of every score row (B, H, T), never the (T, T) probabilities; the backward recomputes
// the probabilities from q, k and the logsumexp.
//   forward:  one warp per query row (b, h, t), lanes split head_dim, an online softmax over the
//             keys t2 <= t (fp32);
//   backward: D = rowsum(dout * out);  ds = p (dp - D), dp = dout . v
//             dq: one warp per query row, summing over its keys;
//             dk, dv: one warp per (b, kv head, key row t2), summing over the query rows t >= t2 of
//             the kv head's whole group of query heads (GQA). Each output row has one owner: no
//             atomics, deterministic.
#include "cuda_common.h"
#include <initializer_list>
#include "attention_flash_bwd.cuh"    // the model's flash backward (and attention_flash.cuh)
#include "attention_flash_bwd5.cuh"   // context parallelism's chunk pairs
#include "attention_wgmma_fwd.cuh"    // the model's forward at head_dim 64 and 128 (Hopper's wgmma)
#include "attention_wgmma_bwd.cuh"    // the backward at head_dim 64 and 128 on wgmma (--attention-bwd auto on Hopper, wgmma*)

// qkv (B, T, qkv_dim) = rope(clamp(qkv_pre)); cos_t, sin_t (T, hd/2). One thread per W rotated pairs (i, i + hd/2):
// W = 8 moves 16 bytes per access (a warp: 512 contiguous bytes of each half) where hd/2 is a multiple of 8 and the
// rows aligned, W = 1 otherwise; the same arithmetic per pair either way (an H100 ran W = 1 at ~34% of HBM's rate,
// 97 us a dbrx-1b layer: 2-byte accesses and 64-bit index arithmetic per pair).
template <int W>
__global__ void clip_rope_forward_kernel(floatX* qkv, const floatX* qkv_pre, const float* cos_t, const float* sin_t,
                                         int B, int T, int H, int KV, int hd, float clip) {
    int half = hd / 2, heads = H + 2 * KV, groups = half / W;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * heads * groups) return;
    int i = (int)(idx % groups) * W;
    int h = (idx / groups) % heads;
    size_t bt = idx / ((size_t)groups * heads);
    int t = bt % T;
    size_t base = bt * heads * hd + (size_t)h * hd;
    float x1[W], x2[W], y1[W], y2[W];
    load_bf16<W>(x1, qkv_pre + base + i);
    load_bf16<W>(x2, qkv_pre + base + i + half);
    for (int j = 0; j < W; j++) {
        if (clip >= 0) { x1[j] = fminf(fmaxf(x1[j], -clip), clip); x2[j] = fminf(fmaxf(x2[j], -clip), clip); }   // (< 0: off)
        y1[j] = x1[j]; y2[j] = x2[j];
        if (h < H + KV) {   // query and key heads rotate, value heads do not
            float c = cos_t[t * half + i + j], s = sin_t[t * half + i + j];
            y1[j] = x1[j] * c - x2[j] * s;
            y2[j] = x2[j] * c + x1[j] * s;
        }
    }
    store_bf16<W>(qkv + base + i, y1);
    store_bf16<W>(qkv + base + i + half, y2);
}

// dqkv (B, T, qkv_dim), in place: gradient w.r.t. the rotated values on entry, w.r.t. the
// pre-clamp values on return (inverse rotation, then zero where the clamp was active); W as the forward's
template <int W>
__global__ void clip_rope_backward_kernel(floatX* dqkv, const floatX* qkv_pre, const float* cos_t, const float* sin_t,
                                          int B, int T, int H, int KV, int hd, float clip) {
    int half = hd / 2, heads = H + 2 * KV, groups = half / W;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * heads * groups) return;
    int i = (int)(idx % groups) * W;
    int h = (idx / groups) % heads;
    size_t bt = idx / ((size_t)groups * heads);
    int t = bt % T;
    size_t base = bt * heads * hd + (size_t)h * hd;
    float d1[W], d2[W], p1[W] = {}, p2[W] = {};
    load_bf16<W>(d1, dqkv + base + i);
    load_bf16<W>(d2, dqkv + base + i + half);
    if (clip >= 0) {
        load_bf16<W>(p1, qkv_pre + base + i);
        load_bf16<W>(p2, qkv_pre + base + i + half);
    }
    for (int j = 0; j < W; j++) {
        if (h < H + KV) {
            float c = cos_t[t * half + i + j], s = -sin_t[t * half + i + j];
            float r1 = d1[j] * c - d2[j] * s, r2 = d2[j] * c + d1[j] * s;
            d1[j] = r1; d2[j] = r2;
        }
        if (clip >= 0) {
            if (p1[j] < -clip || p1[j] > clip) d1[j] = 0.0f;
            if (p2[j] < -clip || p2[j] > clip) d2[j] = 0.0f;
        }
    }
    store_bf16<W>(dqkv + base + i, d1);
    store_bf16<W>(dqkv + base + i + half, d2);
}

// 8 pairs a thread where every row start (hd elements apart) and half-row start is 16-byte aligned
static inline bool clip_rope_vec8(int hd, std::initializer_list<const void*> ptrs) { return hd % 16 == 0 && aligned16(ptrs); }
static inline void clip_rope_forward_gpu(floatX* qkv, const floatX* qkv_pre, const float* cos_t, const float* sin_t, int B,
                                         int T, int H, int KV, int hd, float clip, cudaStream_t stream = 0) {
    const int block = 256;
    long long pairs = (long long)B * T * (H + 2 * KV) * (hd / 2);
    if (clip_rope_vec8(hd, {qkv, qkv_pre}))
        LAUNCH(clip_rope_forward_kernel<8>, ceil_div(pairs / 8, block), block, 0, stream, qkv, qkv_pre, cos_t, sin_t, B, T, H, KV, hd, clip);
    else
        LAUNCH(clip_rope_forward_kernel<1>, ceil_div(pairs, block), block, 0, stream, qkv, qkv_pre, cos_t, sin_t, B, T, H, KV, hd, clip);
}
static inline void clip_rope_backward_gpu(floatX* dqkv, const floatX* qkv_pre, const float* cos_t, const float* sin_t, int B,
                                          int T, int H, int KV, int hd, float clip, cudaStream_t stream = 0) {
    const int block = 256;
    long long pairs = (long long)B * T * (H + 2 * KV) * (hd / 2);
    if (clip_rope_vec8(hd, {dqkv, qkv_pre}))
        LAUNCH(clip_rope_backward_kernel<8>, ceil_div(pairs / 8, block), block, 0, stream, dqkv, qkv_pre, cos_t, sin_t, B, T, H, KV, hd, clip);
    else
        LAUNCH(clip_rope_backward_kernel<1>, ceil_div(pairs, block), block, 0, stream, dqkv, qkv_pre, cos_t, sin_t, B, T, H, KV, hd, clip);
}

// head_dim up to 32 * ATT_MAX_PER_LANE
#define ATT_MAX_PER_LANE 8

// One query row, one warp: y (hd) = softmax(scale q . k[t2]) v[t2] over t2 < n, keys `stride` apart from
// k0 and each value kv_off after its key; lanes split head_dim, an online softmax (fp32). Returns the
// row's logsumexp. The causal forward's row t (n = t + 1 over qkv) and the decode step's (n = pos + 1
// over the KV cache): one arithmetic, as attention_row on the CPU.
__device__ inline float attention_row_warp(floatX* y, const floatX* q, const floatX* k0, size_t stride, size_t kv_off, int n, int hd) {
    int lane = threadIdx.x % 32;
    float scale = 1.0f / sqrtf((float)hd);
    float qr[ATT_MAX_PER_LANE], o[ATT_MAX_PER_LANE];
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
        int i = lane + 32 * j;
        qr[j] = i < hd ? __bfloat162float(q[i]) : 0.0f;
        o[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t2 = 0; t2 < n; t2++) {
        const floatX* k = k0 + (size_t)t2 * stride;
        const floatX* v = k + kv_off;
        float s = 0.0f;
        for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) s += qr[j] * __bfloat162float(k[i]); }
        s = warp_sum(s) * scale;
        float m_new = fmaxf(m, s), corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) o[j] = o[j] * corr + p * __bfloat162float(v[i]); }
        m = m_new;
    }
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) y[i] = __float2bfloat16(o[j] / l); }
    return m + logf(l);
}

// out (B, T, H*hd), lse (B, H, T) from qkv (B, T, qkv_dim) after clip and RoPE; doc: the document mask (its start)
__global__ void attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                         DocMask doc) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // (b, h, t)
    if (row >= (size_t)B * H * T) return;
    int t = row % T, h = (row / T) % H, b = row / ((size_t)T * H);
    int qkv_dim = (H + 2 * KV) * hd, C = H * hd, kvh = h / (H / KV);
    const floatX* seq = qkv + (size_t)b * T * qkv_dim;   // this sequence's first row
    const int lo = doc.start ? doc.start[(size_t)b * T + t] : 0;     // (keys lo .. t)
    float row_lse = attention_row_warp(out + ((size_t)b * T + t) * C + h * hd, seq + (size_t)t * qkv_dim + h * hd,
                                       seq + (size_t)lo * qkv_dim + C + kvh * hd, qkv_dim, (size_t)KV * hd, t + 1 - lo, hd);
    if (threadIdx.x % 32 == 0) lse[row] = row_lse;
}

// dq rows of dqkv (overwritten) and D (B, H, T) = rowsum(dout * out), one warp per query row
__global__ void attention_backward_dq_kernel(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                             const floatX* qkv, int B, int T, int H, int KV, int hd, DocMask doc) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * H * T) return;
    int t = row % T, h = (row / T) % H, b = row / ((size_t)T * H);
    int qkv_dim = (H + 2 * KV) * hd, C = H * hd, kvh = h / (H / KV);
    float scale = 1.0f / sqrtf((float)hd);
    const floatX* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
    const floatX* dy = dout + ((size_t)b * T + t) * C + h * hd;
    const floatX* y = out + ((size_t)b * T + t) * C + h * hd;
    float qr[ATT_MAX_PER_LANE], dyr[ATT_MAX_PER_LANE], dq[ATT_MAX_PER_LANE];
    float d = 0.0f;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
        int i = lane + 32 * j;
        qr[j] = i < hd ? __bfloat162float(q[i]) : 0.0f;
        dyr[j] = i < hd ? __bfloat162float(dy[i]) : 0.0f;
        if (i < hd) d += dyr[j] * __bfloat162float(y[i]);
        dq[j] = 0.0f;
    }
    d = warp_sum(d);
    float L = lse[row];
    for (int t2 = doc.start ? doc.start[(size_t)b * T + t] : 0; t2 <= t; t2++) {
        const floatX* k = qkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
        const floatX* v = k + KV * hd;
        float s = 0.0f, dp = 0.0f;
        for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
            int i = lane + 32 * j;
            if (i < hd) { s += qr[j] * __bfloat162float(k[i]); dp += dyr[j] * __bfloat162float(v[i]); }
        }
        s = warp_sum(s) * scale;
        dp = warp_sum(dp);
        float p = expf(s - L), ds = p * (dp - d) * scale;
        for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) dq[j] += ds * __bfloat162float(k[i]); }
    }
    floatX* dqo = dqkv + ((size_t)b * T + t) * qkv_dim + h * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) { int i = lane + 32 * j; if (i < hd) dqo[i] = __float2bfloat16(dq[j]); }
    if (lane == 0) Dbuf[row] = d;
}

// dk, dv rows of dqkv (overwritten): one warp per (b, kv head, key row t2), over the query rows t2 .. (its document's end)
__global__ void attention_backward_dkv_kernel(floatX* dqkv, const floatX* dout, const float* lse, const float* Dbuf,
                                              const floatX* qkv, int B, int T, int H, int KV, int hd, DocMask doc) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // (b, kvh, t2)
    if (row >= (size_t)B * KV * T) return;
    int t2 = row % T, kvh = (row / T) % KV, b = row / ((size_t)T * KV);
    int qkv_dim = (H + 2 * KV) * hd, C = H * hd, group = H / KV;
    float scale = 1.0f / sqrtf((float)hd);
    const floatX* k = qkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
    const floatX* v = k + KV * hd;
    float kr[ATT_MAX_PER_LANE], vr[ATT_MAX_PER_LANE], dk[ATT_MAX_PER_LANE], dv[ATT_MAX_PER_LANE];
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
        int i = lane + 32 * j;
        kr[j] = i < hd ? __bfloat162float(k[i]) : 0.0f;
        vr[j] = i < hd ? __bfloat162float(v[i]) : 0.0f;
        dk[j] = 0.0f;
        dv[j] = 0.0f;
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int t = t2; t < (doc.start ? doc.end[(size_t)b * T + t2] : T); t++) {
            const floatX* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
            const floatX* dy = dout + ((size_t)b * T + t) * C + h * hd;
            float s = 0.0f, dp = 0.0f;
            for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
                int i = lane + 32 * j;
                if (i < hd) { s += __bfloat162float(q[i]) * kr[j]; dp += __bfloat162float(dy[i]) * vr[j]; }
            }
            s = warp_sum(s) * scale;
            dp = warp_sum(dp);
            size_t r = ((size_t)b * H + h) * T + t;
            float p = expf(s - lse[r]), ds = p * (dp - Dbuf[r]) * scale;
            for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
                int i = lane + 32 * j;
                if (i < hd) { dk[j] += ds * __bfloat162float(q[i]); dv[j] += p * __bfloat162float(dy[i]); }
            }
        }
    floatX* dko = dqkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
    floatX* dvo = dko + KV * hd;
    for (int j = 0; j < ATT_MAX_PER_LANE; j++) {
        int i = lane + 32 * j;
        if (i < hd) { dko[i] = __float2bfloat16(dk[j]); dvo[i] = __float2bfloat16(dv[j]); }
    }
}

static inline void attention_check_shape(int H, int KV, int hd) {
    if (hd > 32 * ATT_MAX_PER_LANE || H % KV != 0)
        fail(EXIT_BAD_INPUT, "attention: head_dim %d > %d or n_heads %d not a multiple of kv_heads %d is not supported "
             "by the CUDA kernels", hd, 32 * ATT_MAX_PER_LANE, H, KV);
}

// the warp-per-row kernels (any head_dim up to 256): out (B, T, H*hd) bf16, lse (B, H, T) fp32 from qkv (B, T, qkv_dim);
// doc: the document mask (device arrays)
static inline void attention_forward_rows_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                              cudaStream_t stream = 0, DocMask doc = {}) {
    attention_check_shape(H, KV, hd);
    const int block = 128, warps = block / 32;
    LAUNCH(attention_forward_kernel, ceil_div((long long)B * H * T, warps), block, 0, stream, out, lse, qkv, B, T, H, KV, hd, doc);
}
// dqkv (B, T, qkv_dim) overwritten; Dbuf (B, H, T) fp32 scratch
static inline void attention_backward_rows_gpu(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                               const floatX* qkv, int B, int T, int H, int KV, int hd, cudaStream_t stream = 0,
                                               DocMask doc = {}) {
    attention_check_shape(H, KV, hd);
    const int block = 128, warps = block / 32;
    LAUNCH(attention_backward_dq_kernel, ceil_div((long long)B * H * T, warps), block, 0, stream, dqkv, Dbuf, dout, out, lse,
           qkv, B, T, H, KV, hd, doc);
    LAUNCH(attention_backward_dkv_kernel, ceil_div((long long)B * KV * T, warps), block, 0, stream, dqkv, dout, lse, Dbuf,
           qkv, B, T, H, KV, hd, doc);
}
// The model's attention: the flash kernels (tensor cores, attention_flash.cuh; the forward at head_dim 64 and 128 on
// Hopper's wgmma, attention_wgmma_fwd.cuh) for head_dim 32, 64 and 128, the warp-per-row kernels otherwise (and for a micro-batch of more than 65,535 sequences: the
// flash grids put the batch on gridDim.z, whose limit that is; the row kernels' grid is one-dimensional).
// Same contract either way.
static inline bool attention_use_flash(int B, int H, int KV, int hd, std::initializer_list<const void*> ptrs) {
    if (!flash_attention_supported(hd) || H % KV != 0 || B > 65535) return false;
    for (const void* p : ptrs) if ((uintptr_t)p % 16) return false;   // 16-byte copies and stores
    return true;
}
// doc: the document mask (device arrays; every path)
static inline void attention_forward_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int H, int KV, int hd,
                                         cudaStream_t stream = 0, DocMask doc = {}) {
    if (!attention_use_flash(B, H, KV, hd, {out, qkv})) attention_forward_rows_gpu(out, lse, qkv, B, T, H, KV, hd, stream, doc);
    else if (attention_wgmma_forward_supported(hd)) attention_forward_wgmma_gpu(out, lse, qkv, B, T, H, KV, hd, stream, doc);
    else flash_attention_forward_gpu(out, lse, qkv, B, T, H, KV, hd, stream, doc);
}
// the floats of attention_backward_gpu's Dbuf: D (B, H, T) (parallel/memory_plan.h plans the same)
static inline size_t attention_backward_scratch_floats(int B, int T, int H, int hd) { (void)hd; return (size_t)B * H * T; }
// Dbuf: attention_backward_scratch_floats(B, T, H, hd) floats
static inline void attention_backward_gpu(floatX* dqkv, float* Dbuf, const floatX* dout, const floatX* out, const float* lse,
                                          const floatX* qkv, int B, int T, int H, int KV, int hd, cudaStream_t stream = 0,
                                          DocMask doc = {}) {
    if (!attention_use_flash(B, H, KV, hd, {dqkv, dout, out, qkv}))
        attention_backward_rows_gpu(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, hd, stream, doc);
    else if (g_attention_bwd && attention_wgmma_backward_supported(hd))   // --attention-bwd wgmma | wgmma-overlap (the same bits)
        attention_backward_wgmma_gpu(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, hd, g_attention_bwd == 2, stream, doc);
    else flash_attention_backward_gpu(dqkv, Dbuf, dout, out, lse, qkv, B, T, H, KV, hd, stream, doc);
}
// Decoding: out (H*hd) of the query q (H*hd) of position pos over the cache (T_max, 2*KV*hd), rows
// 0..pos (see attention_decode_forward). One warp per query head, lanes split head_dim, an online
// softmax over the pos + 1 keys: the warp-per-row forward kernel's arithmetic for row t = pos (the flash
// kernel, which the full forward uses at head_dim 32/64/128, sums in tiles: the two agree to BF16 rounding). (One warp walks all the keys: a split over
// the keys for long contexts is later work.)
__global__ void attention_decode_kernel(floatX* out, const floatX* q, const floatX* cache, int pos, int H, int KV, int hd) {
    int h = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (h >= H) return;
    int kvh = h / (H / KV);
    attention_row_warp(out + (size_t)h * hd, q + (size_t)h * hd, cache + (size_t)kvh * hd, (size_t)2 * KV * hd, (size_t)KV * hd, pos + 1, hd);
}

// out (H*hd) bf16 from q (H*hd) and cache rows 0..pos (T_max, 2*KV*hd)
static inline void attention_decode_gpu(floatX* out, const floatX* q, const floatX* cache, int pos, int H, int KV, int hd,
                                        cudaStream_t stream = 0) {
    attention_check_shape(H, KV, hd);
    const int block = 128, warps = block / 32;
    LAUNCH(attention_decode_kernel, ceil_div(H, warps), block, 0, stream, out, q, cache, pos, H, KV, hd);
}
#endif  // DBRX_HAVE_CUDA
