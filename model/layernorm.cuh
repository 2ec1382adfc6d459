/*
 * layernorm.cuh — LayerNorm with a weight and no bias (DBRX's norm_1, norm_2, norm_f), fp32
 * statistics, biased variance.
 *   y = (x - mean) * rstd * w,   rstd = 1 / sqrt(var + eps)
 */
#pragma once
#include "common.h"

// out (N, C), mean (N), rstd (N) from inp (N, C), weight (C)
static inline void layernorm_forward(real* out, real* mean, real* rstd, const real* inp, const real* weight,
                                     int N, int C, float eps) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* x = inp + (size_t)t * C;
        real m = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        real v = 0;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        real s = (real)1 / std::sqrt(v + (real)eps);
        real* y = out + (size_t)t * C;
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c];
        mean[t] = m;
        rstd[t] = s;
    }
}

// dinp (N, C) += ..., dweight (C) += ...
//   n = (x - mean) * rstd,  dn = dy * w
//   dx = rstd * (dn - mean(dn) - n * mean(dn * n)),   dw = sum_t dy * n
static inline void layernorm_backward(real* dinp, real* dweight, const real* dout, const real* inp,
                                      const real* weight, const real* mean, const real* rstd, int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const real* x = inp + (size_t)t * C;
        const real* dy = dout + (size_t)t * C;
        real m = mean[t], s = rstd[t];
        real dn_mean = 0, dn_n_mean = 0;
        for (int c = 0; c < C; c++) {
            real n = (x[c] - m) * s, dn = dy[c] * weight[c];
            dn_mean += dn;
            dn_n_mean += dn * n;
        }
        dn_mean /= C;
        dn_n_mean /= C;
        real* dx = dinp + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            real n = (x[c] - m) * s, dn = dy[c] * weight[c];
            dx[c] += s * (dn - dn_mean - n * dn_n_mean);
        }
    }
    // the weight gradient reduces over tokens: fixed blocks of 32 tokens each write a partial row,
    // and the partials are added in block order, so the sum never depends on the thread count
    const int blk = 32, nblk = (N + blk - 1) / blk;
    real* partial = (real*)mallocCheck((size_t)nblk * C * sizeof(real));
    #pragma omp parallel for
    for (int b = 0; b < nblk; b++) {
        real* acc = partial + (size_t)b * C;
        for (int c = 0; c < C; c++) acc[c] = 0;
        for (int t = b * blk; t < N && t < (b + 1) * blk; t++) {
            const real* x = inp + (size_t)t * C;
            const real* dy = dout + (size_t)t * C;
            for (int c = 0; c < C; c++) acc[c] += dy[c] * (x[c] - mean[t]) * rstd[t];
        }
    }
    for (int b = 0; b < nblk; b++)
        for (int c = 0; c < C; c++) dweight[c] += partial[(size_t)b * C + c];
    free(partial);
}
