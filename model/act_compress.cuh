/*
 * act_compress.cuh — compressed saved activations (--compress-acts, model/recompute.h): the SwiGLU
 * experts' g and u kept between the forward and the backward in a smaller format, act dropped, and all
 * three rebuilt just before the layer's backward reads them.
 *
 * Why g and u: per routed row the experts save g, u and act (3 F values) against d for xe and ye; at
 * DBRX width (F 10752, d 6144) they are 70% of a layer's saved bytes. act = silu(g) * u follows from
 * g and u elementwise, so it costs nothing to rebuild; recomputing g and u (--recompute swiglu) costs
 * two of the layer's three expert GEMMs again.
 * --compress-acts attn keeps LayerNorm 1's output ln1 (N, d) the same way (1x128 tiles along d): only the QKV
 * GEMM's weight gradient reads it again (LayerNorm's backward reads its input and statistics), the classic
 * FP8 wgrad input; the attention's own saved tensors (qkv, lse, atty) are left alone (the attention
 * backward's softmax reads them).
 * Formats (CompressFormat):
 *   e4m3  FP8 E4M3 codes with one scale per 1x128 tile along F (each row's own tiles: the FP8 block
 *         recipe's activation tiling, with its scale and conversion functions: fp8_scale_for,
 *         fp8_cvt_dev). Kept: 1 byte per value + 4 bytes per 128 values = 2.06 F bytes per row for g
 *         and u, against 6 F (GPU, BF16) or 12 F (CPU, FP32) for g, u and act.
 *   bf16  BF16 (round to nearest even): the CPU's FP32 activations halved (the GPU's are BF16 already).
 * The rebuilt value is the code times the stored dequantisation factor 1/s (s = 448 / the tile's
 * amax, fp8_scale_for), one float multiply on both backends, so the emulated GPU's rebuilt g and u
 * equal the CPU reference's bit for bit for the same BF16 input (test_kernels). The loss is not the
 * uncompressed run's: the backward sees g and u to 3 mantissa bits (measured: model/README.md).
 * Layout of one layer's codes (rows R of the buffers, `rows` of them filled):
 *   q     (2, R, F)                 g's codes, then u's (1 byte; bf16: 2 bytes, the bits)
 *   sinv  (2, ceil(F/128), R)       e4m3: factor of tile (r, c/128) of g at [(c/128) * rows + r], u's after R * ceil(F/128)
 */
#pragma once
#include <stdint.h>
#include "common.h"
#include "fp8.cuh"
#include "moe.cuh"

typedef enum { COMPRESS_E4M3 = 0, COMPRESS_BF16 = 1 } CompressFormat;

// bytes kept per (R rows, C) tensor in the format: codes and factors (--compress-acts attn: ln1 (N, d))
static inline size_t compress_tensor_code_bytes(CompressFormat f, size_t R, size_t C) { return R * C * (f == COMPRESS_BF16 ? 2 : 1); }
static inline size_t compress_tensor_factor_bytes(CompressFormat f, size_t R, size_t C) {
    return f == COMPRESS_BF16 ? 0 : R * ((C + 127) / 128) * sizeof(float);
}
// ... and per (R rows, F) pair g, u
static inline size_t compress_code_bytes(CompressFormat f, size_t R, size_t F) { return 2 * compress_tensor_code_bytes(f, R, F); }
static inline size_t compress_factor_bytes(CompressFormat f, size_t R, size_t F) { return 2 * compress_tensor_factor_bytes(f, R, F); }

// one (rows, F) tensor x -> codes q (rows, F) and, for e4m3, factors sinv ((F/128), rows)
static inline void compress_rows(uint8_t* q, float* sinv, const real* x, int rows, int F, CompressFormat fmt) {
    const int nct = (F + 127) / 128;
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        const real* xr = x + (size_t)r * F;
        if (fmt == COMPRESS_BF16) {
            for (int c = 0; c < F; c++) {
                uint16_t b = f32_to_bf16(xr[c]);
                memcpy(q + ((size_t)r * F + c) * 2, &b, 2);
            }
            continue;
        }
        for (int t = 0; t < nct; t++) {
            int c0 = t * 128, c1 = c0 + 128 < F ? c0 + 128 : F;
            float amax = 0.0f;
            for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(xr[c]));
            float s = fp8_scale_for(amax, FP8_E4M3, 0);
            for (int c = c0; c < c1; c++) q[(size_t)r * F + c] = fp8_from_float(xr[c] * s, FP8_E4M3);
            sinv[(size_t)t * rows + r] = 1.0f / s;
        }
    }
}
// the inverse: x (rows, F) from q and sinv
static inline void decompress_rows(real* x, const uint8_t* q, const float* sinv, int rows, int F, CompressFormat fmt) {
    #pragma omp parallel for
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < F; c++) {
            size_t i = (size_t)r * F + c;
            if (fmt == COMPRESS_BF16) {
                uint16_t b;
                memcpy(&b, q + i * 2, 2);
                x[i] = bf16_to_f32(b);
            } else {
                x[i] = fp8_to_float(q[i], FP8_E4M3) * sinv[(size_t)(c / 128) * rows + r];
            }
        }
}

// The layer's forward leaves g, u (rows, F) [rows of R] in the codes
static inline void swiglu_compress(uint8_t* q, float* sinv, const real* g, const real* u, int rows, int R, int F, CompressFormat fmt) {
    size_t e = fmt == COMPRESS_BF16 ? 2 : 1, ft = (size_t)R * ((F + 127) / 128);
    compress_rows(q, sinv, g, rows, F, fmt);
    compress_rows(q + (size_t)R * F * e, sinv ? sinv + ft : nullptr, u, rows, F, fmt);
}
// ...and its backward rebuilds g, u and act = silu(g) * u (rows, F) from them
static inline void swiglu_decompress(real* g, real* u, real* act, const uint8_t* q, const float* sinv, int rows, int R, int F,
                                     CompressFormat fmt) {
    size_t e = fmt == COMPRESS_BF16 ? 2 : 1, ft = (size_t)R * ((F + 127) / 128);
    decompress_rows(g, q, sinv, rows, F, fmt);
    decompress_rows(u, q + (size_t)R * F * e, sinv ? sinv + ft : nullptr, rows, F, fmt);
    swiglu_forward(act, g, u, (size_t)rows * F);
}

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA. Compression is one pass over g and u: a warp per 128-value row tile (W values per lane), its
// amax by a warp reduction, the codes written 4 bytes per lane, the tile's factor by lane 0. (The FP8
// recipes' fp8_quantize_kernel would do it too, but it stages 128x128 tiles for the transposed copy and
// the column scales these rows never need.) The rebuild is one elementwise pass: each thread W consecutive values of one row (W divides 128, so
// they share one tile's factor), g and u rounded to BF16 as the forward stored them, act from those
// rounded values with swiglu_forward_kernel's arithmetic.
template <int W>
__global__ void swiglu_decompress_kernel(floatX* g, floatX* u, floatX* act, const __nv_fp8_storage_t* qg, const __nv_fp8_storage_t* qu,
                                         const float* sg, const float* su, int rows, int F) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (i >= (size_t)rows * F) return;
    int r = (int)(i / F), c = (int)(i % F);
    float fg = sg[(size_t)(c / 128) * rows + r], fu = su[(size_t)(c / 128) * rows + r];
    float gv[W], uv[W], av[W];
    for (int j = 0; j < W; j++) {
        __nv_fp8_e4m3 a, b;
        a.__x = qg[i + j];
        b.__x = qu[i + j];
        gv[j] = __bfloat162float(__float2bfloat16((float)a * fg));
        uv[j] = __bfloat162float(__float2bfloat16((float)b * fu));
        av[j] = gv[j] / (1.0f + expf(-gv[j])) * uv[j];
    }
    store_bf16<W>(g + i, gv);
    store_bf16<W>(u + i, uv);
    if (act) store_bf16<W>(act + i, av);   // (NULL: the model keeps no act, model/dbrx_recompute_cuda.cuh)
}

// blockIdx.y: 0 g, 1 u (its codes after R F, its factors after R ceil(F/128)); W = 4 needs F % 4 == 0
template <int W>
__global__ void swiglu_compress_kernel(__nv_fp8_storage_t* q, float* sinv, const floatX* g, const floatX* u, int rows, int R, int F) {
    const int nct = (F + 127) / 128, lane = threadIdx.x % 32;
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= (long long)rows * nct) return;   // (a whole warp: w is the same for its 32 lanes)
    const int r = (int)(w / nct), t = (int)(w % nct), c0 = t * 128;
    const floatX* x = (blockIdx.y ? u : g) + (size_t)r * F;
    __nv_fp8_storage_t* qr = q + (size_t)blockIdx.y * R * F + (size_t)r * F;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // this lane's values: 4 consecutive at c0 + 4 lane (W 4, one 8-byte load), or c0 + lane + 32 j
    if (W == 4 && c0 + lane * 4 < F) load_bf16<4>(v, x + c0 + lane * 4);
    if (W == 1)
        for (int j = 0; j < 4; j++) v[j] = c0 + lane + 32 * j < F ? __bfloat162float(x[c0 + lane + 32 * j]) : 0.0f;
    float amax = 0.0f;
    for (int j = 0; j < 4; j++) amax = fmaxf(amax, fabsf(v[j]));
    amax = warp_max(amax);
    const float s = fp8_scale_for_dev(amax, FP8_E4M3, 0);
    if (W == 4 && c0 + lane * 4 < F) {
        uint32_t packed = 0;
        for (int j = 0; j < 4; j++) packed |= (uint32_t)fp8_cvt_dev(v[j] * s, FP8_E4M3) << (8 * j);
        *(uint32_t*)(qr + c0 + lane * 4) = packed;
    } else if (W == 1) {
        for (int j = 0; j < 4; j++)
            if (c0 + lane + 32 * j < F) qr[c0 + lane + 32 * j] = fp8_cvt_dev(v[j] * s, FP8_E4M3);
    }
    if (lane == 0) sinv[(size_t)blockIdx.y * R * nct + (size_t)t * rows + r] = 1.0f / s;
}

// g, u (rows, F) [BF16, rows of R; u = g + R F as the model's one buffer or anywhere] -> the layer's codes
static inline void swiglu_compress_gpu(uint8_t* q, float* sinv, const floatX* g, const floatX* u, int rows, int R, int F,
                                       cudaStream_t stream = 0) {
    long long warps = (long long)rows * ((F + 127) / 128);
    if (warps == 0) return;
    dim3 grid(ceil_div(warps * 32, 256), 2);
    __nv_fp8_storage_t* qq = (__nv_fp8_storage_t*)q;
    if (F % 4 == 0 && aligned16({g, u, q}) && (size_t)R * F % 4 == 0)
        LAUNCH(swiglu_compress_kernel<4>, grid, 256, 0, stream, qq, sinv, g, u, rows, R, F);
    else
        LAUNCH(swiglu_compress_kernel<1>, grid, 256, 0, stream, qq, sinv, g, u, rows, R, F);
}
// the rebuild of g, u and act (rows, F) from the codes, before the layer's experts backward (act NULL: g, u only)
static inline void swiglu_decompress_gpu(floatX* g, floatX* u, floatX* act, const uint8_t* q, const float* sinv, int rows, int R, int F,
                                         cudaStream_t stream = 0) {
    size_t n = (size_t)rows * F, ft = (size_t)R * ((F + 127) / 128);
    if (n == 0) return;
    const __nv_fp8_storage_t* qg = (const __nv_fp8_storage_t*)q;
    const __nv_fp8_storage_t* qu = qg + (size_t)R * F;
    if (F % 8 == 0 && aligned16({g, u, act}))
        LAUNCH(swiglu_decompress_kernel<8>, ceil_div((long long)n / 8, 256), 256, 0, stream, g, u, act, qg, qu, sinv, sinv + ft, rows, F);
    else
        LAUNCH(swiglu_decompress_kernel<1>, ceil_div((long long)n, 256), 256, 0, stream, g, u, act, qg, qu, sinv, sinv + ft, rows, F);
}

// One tensor x (rows, C) [BF16] -> codes q (rows, C) and factors ((C/128), rows): the kernel above on its g
// half alone (--compress-acts attn: ln1)
static inline void rows_compress_gpu(uint8_t* q, float* sinv, const floatX* x, int rows, int C, cudaStream_t stream = 0) {
    long long warps = (long long)rows * ((C + 127) / 128);
    if (warps == 0) return;
    dim3 grid(ceil_div(warps * 32, 256), 1);
    __nv_fp8_storage_t* qq = (__nv_fp8_storage_t*)q;
    if (C % 4 == 0 && aligned16({x, q}))
        LAUNCH(swiglu_compress_kernel<4>, grid, 256, 0, stream, qq, sinv, x, x, rows, rows, C);
    else
        LAUNCH(swiglu_compress_kernel<1>, grid, 256, 0, stream, qq, sinv, x, x, rows, rows, C);
}
// ...and back: each thread W consecutive values of one row (one tile's factor), rounded to BF16 as stored
template <int W>
__global__ void rows_decompress_kernel(floatX* x, const __nv_fp8_storage_t* q, const float* sinv, int rows, int C) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (i >= (size_t)rows * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    float f = sinv[(size_t)(c / 128) * rows + r], v[W];
    for (int j = 0; j < W; j++) {
        __nv_fp8_e4m3 a;
        a.__x = q[i + j];
        v[j] = (float)a * f;
    }
    store_bf16<W>(x + i, v);
}
static inline void rows_decompress_gpu(floatX* x, const uint8_t* q, const float* sinv, int rows, int C, cudaStream_t stream = 0) {
    size_t n = (size_t)rows * C;
    if (n == 0) return;
    const __nv_fp8_storage_t* qq = (const __nv_fp8_storage_t*)q;
    if (C % 8 == 0 && aligned16({x}))
        LAUNCH(rows_decompress_kernel<8>, ceil_div((long long)n / 8, 256), 256, 0, stream, x, qq, sinv, rows, C);
    else
        LAUNCH(rows_decompress_kernel<1>, ceil_div((long long)n, 256), 256, 0, stream, x, qq, sinv, rows, C);
}
#endif  // DBRX_HAVE_CUDA
