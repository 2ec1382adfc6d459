/*
 * attention.cuh — DBRX attention after the fused Wqkv projection:
 *   clip_qkv clamp of the whole fused output, NeoX-style RoPE on q and k, and causal GQA
 *   attention (softmax in fp32). K and V are never repeated: query head h reads kv head
 *   h / (H / kv) in place.
 * Layout of one token's fused row (qkv_dim = d + 2*kv*hd):  [ Q: H*hd | K: kv*hd | V: kv*hd ].
 */
#pragma once
#include "common.h"

// ---------------------------------------------------------------------------------------------
// clip_qkv: out = clamp(inp, -clip, clip). Backward passes the gradient where -clip <= x <= clip
// (the clamp's own inclusive semantics) and zeroes it where the value was clamped.

static inline void clip_forward(real* out, const real* inp, size_t n, float clip) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
        out[i] = clip > 0 ? std::fmin(std::fmax(x, (real)-clip), (real)clip) : x;
    }
}
// dinout (n): gradient w.r.t. the clamp's output on entry, w.r.t. its input on return
static inline void clip_backward(real* dinout, const real* inp, size_t n, float clip) {
    if (clip <= 0) return;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        if (inp[i] < -clip || inp[i] > clip) dinout[i] = 0;
}

// ---------------------------------------------------------------------------------------------
// RoPE, NeoX / rotate_half style (not interleaved). For pair i < hd/2 at position p:
//   inv_freq_i = theta^(-2i/hd),  angle = p * inv_freq_i   (cos/sin in fp32)
//   out[i]        = x[i] * cos - x[i + hd/2] * sin
//   out[i + hd/2] = x[i + hd/2] * cos + x[i] * sin

// cos, sin (T, hd/2)
static inline void rope_tables(real* cos_t, real* sin_t, int T, int hd, float theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = (float)std::pow((double)theta, -2.0 * i / hd);
        for (int p = 0; p < T; p++) {
            float angle = (float)p * inv_freq;
            cos_t[p * half + i] = (real)(float)std::cos((double)angle);
            sin_t[p * half + i] = (real)(float)std::sin((double)angle);
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
// causal GQA attention
//   out (B, T, H*hd), att (B, H, T, T) softmax probabilities (row t holds t+1 valid entries),
//   from qkv (B, T, qkv_dim) after clip and RoPE.

static inline void attention_forward(real* out, real* att, const real* qkv, int B, int T, int H, int KV, int hd) {
    int qkv_dim = (H + 2 * KV) * hd, group = H / KV, C = H * hd;
    real scale = (real)1 / std::sqrt((real)hd);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int kvh = h / group;
                const real* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
                real* p = att + (((size_t)b * H + h) * T + t) * T;
                real maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const real* k = qkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
                    real s = 0;
                    #pragma omp simd reduction(+ : s)
                    for (int i = 0; i < hd; i++) s += q[i] * k[i];
                    s *= scale;
                    p[t2] = s;
                    if (s > maxv) maxv = s;
                }
                real sum = 0;
                for (int t2 = 0; t2 <= t; t2++) { p[t2] = std::exp(p[t2] - maxv); sum += p[t2]; }
                for (int t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++) p[t2] = 0;
                real* o = out + ((size_t)b * T + t) * C + h * hd;
                for (int i = 0; i < hd; i++) o[i] = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const real* v = qkv + ((size_t)b * T + t2) * qkv_dim + C + KV * hd + kvh * hd;
                    for (int i = 0; i < hd; i++) o[i] += p[t2] * v[i];
                }
            }
}

// dqkv (B, T, qkv_dim) = gradient of the attention inputs (overwritten), from dout (B, T, H*hd).
//   dp[t2] = dout . v[t2];  ds = p * (dp - sum(p * dp));  dq += scale ds k;  dk += scale ds q;  dv += p dout
// One thread per (batch, kv head) owns that kv head's dk, dv and its query heads' dq: race-free
// and the summation order is fixed.
static inline void attention_backward(real* dqkv, const real* dout, const real* qkv, const real* att,
                                      int B, int T, int H, int KV, int hd) {
    int qkv_dim = (H + 2 * KV) * hd, group = H / KV, C = H * hd;
    real scale = (real)1 / std::sqrt((real)hd);
    memset(dqkv, 0, (size_t)B * T * qkv_dim * sizeof(real));
    #pragma omp parallel
    {
        real* dp = (real*)mallocCheck((size_t)T * sizeof(real));
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++)
            for (int kvh = 0; kvh < KV; kvh++)
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int t = 0; t < T; t++) {
                        const real* p = att + (((size_t)b * H + h) * T + t) * T;
                        const real* q = qkv + ((size_t)b * T + t) * qkv_dim + h * hd;
                        const real* dy = dout + ((size_t)b * T + t) * C + h * hd;
                        real* dq = dqkv + ((size_t)b * T + t) * qkv_dim + h * hd;
                        real pdp = 0;
                        for (int t2 = 0; t2 <= t; t2++) {
                            const real* v = qkv + ((size_t)b * T + t2) * qkv_dim + C + KV * hd + kvh * hd;
                            real* dv = dqkv + ((size_t)b * T + t2) * qkv_dim + C + KV * hd + kvh * hd;
                            real s = 0;
                            #pragma omp simd reduction(+ : s)
                            for (int i = 0; i < hd; i++) { s += dy[i] * v[i]; dv[i] += p[t2] * dy[i]; }
                            dp[t2] = s;
                            pdp += p[t2] * s;
                        }
                        for (int t2 = 0; t2 <= t; t2++) {
                            real ds = p[t2] * (dp[t2] - pdp) * scale;
                            const real* k = qkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
                            real* dk = dqkv + ((size_t)b * T + t2) * qkv_dim + C + kvh * hd;
                            for (int i = 0; i < hd; i++) { dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                        }
                    }
        free(dp);
    }
}
