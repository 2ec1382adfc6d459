/*
 * adamw.cuh — the optimizer: global gradient norm, the learning-rate schedule (linear warmup, then
 * cosine decay to a floor, or linear, constant, warmup-stable-decay: --lr-schedule), AdamW with decoupled weight decay (applied to matrices only; the caller
 * passes weight_decay = 0 for LayerNorm weights) and LionW (--optimizer lion: the same decay, one moment).
 */
#pragma once
#include <algorithm>
#include "common.h"

// sum of squares of grad (n), accumulated in double (the caller fixes the chunking, so the norm
// does not depend on the thread count)
static inline double grad_sumsq(const real* grad, size_t n) {
    return dot_lanes8<double>(grad, grad, n);
}

// --lr-schedule (set once at start-up, as --optimizer's g_optimizer_lion): after the linear warmup, over the n = total -
// warmup steps left, p = (s - warmup) / n going 0 -> 1, to the floor lr_min = floor_frac x lr_max:
//   cosine    lr_min + (lr_max - lr_min) (1 + cos(pi p)) / 2   (the default: LLM Foundry's DBRX recipe, llm.c, Megatron's)
//   linear    lr_max - (lr_max - lr_min) p
//   constant  lr_max (the floor unused)
//   wsd       warmup-stable-decay (MiniCPM; torchtitan's default decay): lr_max until the last D = --lr-decay-frac x n
//             steps (at least 1), then linearly to the floor over them, q = (s - (total - D)) / D going 0 -> 1:
//             lr_max - (lr_max - lr_min) q
//   wsd-sqrt  the same with the 1 - sqrt cooldown Hägele et al. (2024) found best: lr_min + (lr_max - lr_min) (1 - sqrt(q))
// A stable phase that ends in a short decay lets a run be extended from a checkpoint taken before the decay.
typedef enum { LR_COSINE = 0, LR_LINEAR, LR_CONSTANT, LR_WSD, LR_WSD_SQRT } LrScheduleKind;
inline int g_lr_schedule = LR_COSINE;
inline double g_lr_decay_frac = 0.2;   // --lr-decay-frac (wsd, wsd-sqrt)
static const char* const LR_SCHEDULE_NAMES[] = {"cosine", "linear", "constant", "wsd", "wsd-sqrt"};

// lr at 0-based step s of `total` steps
static inline float lr_schedule(int s, int total, float lr_max, int warmup, float floor_frac) {
    if (s < warmup) return lr_max * (float)(s + 1) / (float)warmup;
    int n = total - warmup > 1 ? total - warmup : 1;
    double p = std::min(1.0, (double)(s - warmup) / (double)n), lr_min = (double)lr_max * floor_frac, span = (double)lr_max - lr_min;
    if (g_lr_schedule == LR_LINEAR) return (float)(lr_max - span * p);
    if (g_lr_schedule == LR_CONSTANT) return lr_max;
    if (g_lr_schedule == LR_WSD || g_lr_schedule == LR_WSD_SQRT) {
        int D = std::max(1, (int)std::lround(g_lr_decay_frac * n));
        double q = std::min(1.0, std::max(0.0, (double)(s - (total - D)) / (double)D));
        return (float)(g_lr_schedule == LR_WSD ? lr_max - span * q : lr_min + span * (1.0 - std::sqrt(q)));
    }
    return (float)(lr_min + 0.5 * (1.0 + cos(M_PI * p)) * span);
}

// --adam-moments (set once at start-up, as --recompute's g_recompute): 0 keeps AdamW's moments m and v in FP32, 1 in
// BF16 (rounded to nearest even as they are stored; the step's update uses the FP32 values it has just computed, as
// TransformerEngine's FusedAdam with BF16 moment dtypes and Megatron-Core's --exp-avg-dtype bf16 do). BF16 halves the
// moments' memory (8 -> 4 bytes a parameter) and the optimizer pass's traffic (30 -> 22 bytes a parameter); the loss
// curve is not the FP32 one's bit for bit. The CPU keeps the rounded values in its FP32 arrays: the same numbers.
inline int g_adam_moments_bf16 = 0;

// t is the 1-based step count; grad_scale multiplies the gradient (global-norm clipping); moments_bf16: m and v
// stored rounded to BF16 (--adam-moments bf16)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m^ / (sqrt(v^) + eps) + wd p)
static inline void adamw_update(real* param, const real* grad, real* m, real* v, size_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, float grad_scale, int t, int moments_bf16 = 0) {
    real bc1 = (real)(1.0 - std::pow((double)beta1, t)), bc2 = (real)(1.0 - std::pow((double)beta2, t));
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real g = grad[i] * grad_scale;
        real mi = beta1 * m[i] + (1 - beta1) * g;
        real vi = beta2 * v[i] + (1 - beta2) * g * g;
        m[i] = moments_bf16 ? (real)bf16_round((float)mi) : mi;
        v[i] = moments_bf16 ? (real)bf16_round((float)vi) : vi;
        real mhat = mi / bc1, vhat = vi / bc2;
        param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
    }
}

// --optimizer (set once at start-up, as g_adam_moments_bf16): 0 AdamW (the default), 1 LionW (Chen et al. 2023,
// "Symbolic Discovery of Optimization Algorithms"; the optimizer of DBRX's published fine-tuning recipe, betas 0.9 / 0.95).
// LionW keeps one moment, m (in the store's m arrays; the v arrays are not allocated), and its update has the same size
// lr in every element, the sign of an interpolation of m and g. Weight decay as AdamW's here: decoupled, times lr (the
// paper's form; LLM Foundry's DecoupledLionW multiplies it by lr / lr_max instead: its weight_decay is ours times lr_max).
// Lion's step wants a smaller lr than AdamW's (the paper: 3-10x) and a larger weight decay; the flags are the user's.
// --adam-moments bf16 keeps Lion's m in BF16 too. Bytes a parameter a step: 22 (g, m, master read; m, master, BF16
// copy written), BF16 m 18, against AdamW's 30 / 22.
inline int g_optimizer_lion = 0;

// sign(x) with sign(0) = 0 (torch.sign's): a zero interpolation moves nothing
static inline real lion_sign(real x) { return (real)((x > 0) - (x < 0)); }

// one LionW step over n elements (no bias correction, no epsilon):
//   c = b1 m + (1-b1) g;  p -= lr (sign(c) + wd p);  m = b2 m + (1-b2) g
static inline void lion_update(real* param, const real* grad, real* m, size_t n, float lr, float beta1, float beta2,
                               float weight_decay, float grad_scale, int moments_bf16 = 0) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        real g = grad[i] * grad_scale;
        real c = beta1 * m[i] + (1 - beta1) * g;
        real mi = beta2 * m[i] + (1 - beta2) * g;
        m[i] = moments_bf16 ? (real)bf16_round((float)mi) : mi;
        param[i] -= lr * (lion_sign(c) + weight_decay * param[i]);
    }
}

// the run's optimizer (--optimizer, --adam-moments) over n elements: AdamW from m and v, or LionW from m (v unused: NULL)
static inline void optimizer_update(real* param, const real* grad, real* m, real* v, size_t n, float lr, float beta1, float beta2,
                                    float eps, float weight_decay, float grad_scale, int t) {
    if (g_optimizer_lion) lion_update(param, grad, m, n, lr, beta1, beta2, weight_decay, grad_scale, g_adam_moments_bf16);
    else adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t, g_adam_moments_bf16);
}
// the moment arrays the run's optimizer keeps a parameter: AdamW's m and v, LionW's m; with the fp32 master weight and
// gradient, the bytes of parameter state a parameter on the CPU
static inline int optimizer_moments() { return g_optimizer_lion ? 1 : 2; }
static inline int optimizer_state_bytes() { return 4 * (2 + optimizer_moments()); }

#if DBRX_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA: fp32 master weights, fp32 moments and gradients; the update writes the master weight and
// its BF16 working copy (round to nearest even). The global gradient norm: a fixed grid of blocks
// (independent of the device) each sums the squares of a fixed slice, one thread adds the partial
// sums in double, in order, and the host reads that one number. Deterministic.
//
// The parameter store's step (parallel/) makes two passes over its shard, all accesses 16 bytes wide:
//   grad_norm_partials_kernel  reads g                                                     4 B / param
//   adamw_fused_kernel         reads g, m, v, master; writes m, v, master, BF16 copy       16 + 14 B / param
//                              (--adam-moments bf16: adamw_fused_bf16_moments_kernel, m and v 2 B each: 12 + 10 B)
//                              and g = 0 where the next step's gradient accumulates into it     + 4 B
// = 34 B per parameter per step where the step's first writes overwrite the gradient, so nothing has to zero it:
// ZeRO-3/HSDP (S > 1: each item's first reduce-scatter of a step, parallel/) and one GPU or DDP, BF16 or FP8 (the first
// backward's weight-gradient GEMMs with beta 0: dbrx_grads_overwrite, model/dbrx_cuda.cuh; there the embedding's
// gradient is still memset before its scatter-add of the batch's rows: + 4 B per embedding element). 38 B where the model's
// backward accumulates into a zeroed shard (DDP + EP: the dispatcher's experts): there the gradient's zeroing (a memset before: 4 B
// written) is the fused pass's store of zeros over the g it has just read. The
// data-parallel 1/W scale of the gradient (a pass before: 8 B) is the factor `pre` both passes apply as they
// read g, so the values are the same products as before, bit for bit. BF16 moments take 8 B off each sum (26, 30).
#include <algorithm>
#include <array>
#include <vector>
#include "cuda_common.h"

// one element's arithmetic, the same expressions in every kernel (so their results are bit-identical)
__device__ __forceinline__ float adamw_math(float g, float* m, float* v, float p, float lr, float beta1, float beta2, float eps,
                                            float weight_decay, float bc1, float bc2) {
    float mi = beta1 * *m + (1 - beta1) * g;
    float vi = beta2 * *v + (1 - beta2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    return p - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
}
// LionW's, as lion_update's expressions, each product rounded before its sum (__fmul_rn, __fadd_rn: nvcc would fuse
// them into FMAs, which the CPU's -ffp-contract=off build does not): the CPU's bits on a GPU too. (On an H200, session
// 62, the fused m differed from the CPU's in 1,106 of 26,200 elements after two steps; AdamW's test takes a tolerance.)
__device__ __forceinline__ float lion_math(float g, float* m, float p, float lr, float beta1, float beta2, float weight_decay) {
    float c = __fadd_rn(__fmul_rn(beta1, *m), __fmul_rn(1 - beta1, g));
    *m = __fadd_rn(__fmul_rn(beta2, *m), __fmul_rn(1 - beta2, g));
    return __fsub_rn(p, __fmul_rn(lr, __fadd_rn((float)((c > 0) - (c < 0)), __fmul_rn(weight_decay, p))));
}

// 8 floats at p (32-byte aligned) as two 16-byte accesses
__device__ __forceinline__ void load_f32x8(float* f, const float* p) {
    float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
__device__ __forceinline__ void store_f32x8(float* p, const float* f) {
    ((float4*)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4*)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// one element's update: the moments, the master weight and its BF16 copy
__device__ inline void adamw_element(float* param, floatX* param_bf16, const float* grad, float* m, float* v, size_t i, float lr,
                                     float beta1, float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
    float p = adamw_math(grad[i] * grad_scale, &m[i], &v[i], param[i], lr, beta1, beta2, eps, weight_decay, bc1, bc2);
    param[i] = p;
    param_bf16[i] = __float2bfloat16(p);
}

__global__ void adamw_kernel(float* param, floatX* param_bf16, const float* grad, float* m, float* v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(param, param_bf16, grad, m, v, i, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2);
}

// t is the 1-based step count; the arguments of adamw_update, plus the BF16 copy (one tensor: dbrx_update)
static inline void adamw_update_gpu(float* param, floatX* param_bf16, const float* grad, float* m, float* v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                    int t, cudaStream_t stream = 0) {
    float bc1 = (float)(1.0 - pow((double)beta1, t)), bc2 = (float)(1.0 - pow((double)beta2, t));
    int blocks = (int)std::min<size_t>((n + 255) / 256, 4096);
    if (n == 0) return;
    LAUNCH(adamw_kernel, blocks, 256, 0, stream, param, param_bf16, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
           grad_scale, bc1, bc2);
}

// ---------------------------------------------------------------------------------------------
// The fused update over a shard: a table of segments (off, n, mode) in shard order, mode ADAMW_DECAY (a
// matrix: weight decay), ADAMW_NO_DECAY (a norm) or ADAMW_ZERO_ONLY (the padding between the tensors'
// pieces: only its gradient is zeroed, as the memset did, and only where the gradient is zeroed at all;
// master, m, v and the BF16 copy are not touched).
enum { ADAMW_NO_DECAY = 0, ADAMW_DECAY = 1, ADAMW_ZERO_ONLY = 2 };
typedef struct { std::vector<size_t> off, n; std::vector<int> mode; size_t max_n; } AdamwSegments;

// the table of the tensors' pieces (off, n, decay 0/1: any order, not overlapping) of a shard of `total`
// elements, with the gaps between them (and after the last) as ADAMW_ZERO_ONLY segments
static inline AdamwSegments adamw_segments(std::vector<std::array<size_t, 3>> pieces, size_t total) {
    std::sort(pieces.begin(), pieces.end());
    AdamwSegments t = {};
    size_t at = 0;
    auto add = [&](size_t off, size_t n, int mode) {
        t.off.push_back(off); t.n.push_back(n); t.mode.push_back(mode);
        t.max_n = std::max(t.max_n, n);
    };
    for (const std::array<size_t, 3>& p : pieces) {
        if (p[1] == 0) continue;
        if (p[0] > at) add(at, p[0] - at, ADAMW_ZERO_ONLY);
        add(p[0], p[1], p[2] ? ADAMW_DECAY : ADAMW_NO_DECAY);
        at = p[0] + p[1];
    }
    if (total > at) add(at, total - at, ADAMW_ZERO_ONLY);
    return t;
}

// the moments as stored (--adam-moments): FP32, or BF16 (16-byte accesses of 8 either way)
__device__ __forceinline__ float moment_load(const float* p) { return *p; }
__device__ __forceinline__ float moment_load(const floatX* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void moment_store(float* p, float x) { *p = x; }
__device__ __forceinline__ void moment_store(floatX* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void moments_load8(float* f, const float* p) { load_f32x8(f, p); }
__device__ __forceinline__ void moments_load8(float* f, const floatX* p) { load_bf16<8>(f, p); }
__device__ __forceinline__ void moments_store8(float* p, const float* f) { store_f32x8(p, f); }
__device__ __forceinline__ void moments_store8(floatX* p, const float* f) { store_bf16<8>(p, f); }

// Block (x, y) strides over segment y. vec (every array's base 16-byte aligned): a thread takes 8 elements at
// a time, 16-byte loads and stores of g, m, v, master (two each) and of the BF16 copy (one), the segment's
// first elements up to an 8-element boundary (head) and its last n % 8 (tail) one at a time; vec 0: all one
// at a time. Each element: g = (grad pre) scale (pre: the data-parallel 1/W, scale: the clipping), AdamW as
// adamw_element, then grad = 0 if clear_grad (else the gradient is left as it is: the next step's first writes
// overwrite it). elems: the segments' elements (the table is on the device; the step-time model,
// dev/predict/kernel_cost.py, reads the launch's arguments: a store that updates its shard in two launches says how
// much each covers, and clear_grad); the kernel does not need elems.
// LION (--optimizer lion): LionW's update from m alone (v is not read or written: it may be NULL).
template <typename M, int LION>   // the moments' type: float, or floatX (--adam-moments bf16)
__device__ __forceinline__ void adamw_fused_body(float* param, floatX* param_bf16, float* grad, M* m, M* v, const size_t* seg_off,
                                                 const size_t* seg_n, const int* seg_mode, int vec, float lr, float beta1, float beta2,
                                                 float eps, float weight_decay, float pre, float grad_scale, float bc1, float bc2,
                                                 int clear_grad) {
    size_t off = seg_off[blockIdx.y], n = seg_n[blockIdx.y];
    int mode = seg_mode[blockIdx.y];
    if (mode == ADAMW_ZERO_ONLY && !clear_grad) return;   // (padding: nothing to do)
    float wd = mode == ADAMW_DECAY ? weight_decay : 0.0f;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t head = vec ? (8 - off % 8) % 8 : n;
    if (head > n) head = n;
    size_t n8 = (n - head) / 8, rest = n - head - 8 * n8;
    for (size_t j = tid; j < head + rest; j += stride) {   // the scalar elements: the head, then the tail
        size_t i = off + (j < head ? j : head + 8 * n8 + (j - head));
        if (mode != ADAMW_ZERO_ONLY) {
            float mi = moment_load(m + i), p;
            if constexpr (LION) {
                p = lion_math((grad[i] * pre) * grad_scale, &mi, param[i], lr, beta1, beta2, wd);
            } else {
                float vi = moment_load(v + i);
                p = adamw_math((grad[i] * pre) * grad_scale, &mi, &vi, param[i], lr, beta1, beta2, eps, wd, bc1, bc2);
                moment_store(v + i, vi);
            }
            moment_store(m + i, mi);
            param[i] = p;
            param_bf16[i] = __float2bfloat16(p);
        }
        if (clear_grad) grad[i] = 0.0f;
    }
    const float zero[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t q = tid; q < n8; q += stride) {   // 8 elements at i (a multiple of 8: every access 16-byte aligned)
        size_t i = off + head + 8 * q;
        if (mode != ADAMW_ZERO_ONLY) {
            float gv[8], mv[8], vv[8], pv[8];
            load_f32x8(gv, grad + i); moments_load8(mv, m + i); load_f32x8(pv, param + i);
            if constexpr (LION) {
                for (int j = 0; j < 8; j++) pv[j] = lion_math((gv[j] * pre) * grad_scale, &mv[j], pv[j], lr, beta1, beta2, wd);
            } else {
                moments_load8(vv, v + i);
                for (int j = 0; j < 8; j++)
                    pv[j] = adamw_math((gv[j] * pre) * grad_scale, &mv[j], &vv[j], pv[j], lr, beta1, beta2, eps, wd, bc1, bc2);
                moments_store8(v + i, vv);
            }
            moments_store8(m + i, mv); store_f32x8(param + i, pv);
            store_bf16<8>(param_bf16 + i, pv);
        }
        if (clear_grad) store_f32x8(grad + i, zero);
    }
}
// FP32 moments (the default) and BF16 ones (--adam-moments bf16), AdamW and LionW: four names, so that a profile and the
// step-time model (dev/predict/kernel_cost.py: the bytes per element) tell them apart
#define ADAMW_FUSED_KERNEL(name, M, LION)                                                                                      \
    __global__ void name(float* param, floatX* param_bf16, float* grad, M* m, M* v, const size_t* seg_off, const size_t* seg_n,     \
                         const int* seg_mode, int vec, float lr, float beta1, float beta2, float eps, float weight_decay, float pre, \
                         float grad_scale, float bc1, float bc2, size_t elems, int clear_grad) {                                    \
        (void)elems;                                                                                                                \
        adamw_fused_body<M, LION>(param, param_bf16, grad, m, v, seg_off, seg_n, seg_mode, vec, lr, beta1, beta2, eps,              \
                                  weight_decay, pre, grad_scale, bc1, bc2, clear_grad);                                             \
    }
ADAMW_FUSED_KERNEL(adamw_fused_kernel, float, 0)
ADAMW_FUSED_KERNEL(adamw_fused_bf16_moments_kernel, floatX, 0)
ADAMW_FUSED_KERNEL(lion_fused_kernel, float, 1)              // (v: NULL)
ADAMW_FUSED_KERNEL(lion_fused_bf16_moment_kernel, floatX, 1)

// One step t (1-based) over a shard: the table (device: seg_off, seg_n, seg_mode, nseg entries, the longest
// max_n), the data-parallel factor pre (1: none) and the clipping scale grad_scale; the gradient ends zero if
// clear_grad (0: left as it is, for a store whose next gradient overwrites it). The moments: m, v in FP32, or (m, v
// NULL) m16, v16 in BF16 (--adam-moments bf16). lion (--optimizer lion): LionW from m (or m16) alone, v and v16 NULL.
static inline void adamw_fused_update_gpu(float* param, floatX* param_bf16, float* grad, float* m, float* v, const size_t* seg_off,
                                          const size_t* seg_n, const int* seg_mode, int nseg, size_t max_n, float lr, float beta1,
                                          float beta2, float eps, float weight_decay, float pre, float grad_scale, int t,
                                          cudaStream_t stream = 0, size_t elems = 0, int clear_grad = 1, floatX* m16 = NULL,
                                          floatX* v16 = NULL, int lion = 0) {
    if (nseg == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, t)), bc2 = (float)(1.0 - pow((double)beta2, t));
    int vec = aligned16({param, param_bf16, grad, m, v, m16, v16});
    int bx = (int)std::max<size_t>(1, std::min<size_t>((max_n + 2047) / 2048, 512));   // 256 threads x 8 elements
    ENSURE(lion ? ((m && !m16) || (!m && m16)) && !v && !v16 : (m && v && !m16 && !v16) || (!m && !v && m16 && v16),
           "adamw_fused_update_gpu: the moments in FP32 (m, v) or BF16 (m16, v16); LionW's m alone");
    dim3 grid(bx, nseg);
    if (lion && m16)
        LAUNCH(lion_fused_bf16_moment_kernel, grid, 256, 0, stream, param, param_bf16, grad, m16, (floatX*)NULL, seg_off, seg_n, seg_mode,
               vec, lr, beta1, beta2, eps, weight_decay, pre, grad_scale, bc1, bc2, elems, clear_grad);
    else if (lion)
        LAUNCH(lion_fused_kernel, grid, 256, 0, stream, param, param_bf16, grad, m, (float*)NULL, seg_off, seg_n, seg_mode, vec, lr,
               beta1, beta2, eps, weight_decay, pre, grad_scale, bc1, bc2, elems, clear_grad);
    else if (m16)
        LAUNCH(adamw_fused_bf16_moments_kernel, grid, 256, 0, stream, param, param_bf16, grad, m16, v16, seg_off, seg_n, seg_mode, vec,
               lr, beta1, beta2, eps, weight_decay, pre, grad_scale, bc1, bc2, elems, clear_grad);
    else
        LAUNCH(adamw_fused_kernel, grid, 256, 0, stream, param, param_bf16, grad, m, v, seg_off, seg_n, seg_mode, vec, lr, beta1, beta2,
               eps, weight_decay, pre, grad_scale, bc1, bc2, elems, clear_grad);
}

// ---------------------------------------------------------------------------------------------
// The gradient norm's partial sums. Their order is fixed: block b of GRAD_NORM_BLOCKS, virtual thread t of
// GRAD_NORM_THREADS sums (grad[i] pre)^2 over i = b GRAD_NORM_THREADS + t + k GRAD_NORM_BLOCKS GRAD_NORM_THREADS,
// k = 0, 1, ... in float, then the block adds its virtual threads' sums as block_sum does over 512 threads
// (warp butterflies 16, 8, 4, 2, 1, then the 16 warps' sums the same way). Each real thread is 4 consecutive
// virtual threads, so that it loads 16 bytes: the sums are those of a scalar kernel of 512 threads a block,
// bit for bit (dev/cuda/adamw.cu checks it against that kernel).
#define GRAD_NORM_BLOCKS 256
#define GRAD_NORM_THREADS 512   // virtual threads a block (4 a real thread: 128 real threads)
#define GRAD_NORM_UNROLL 8      // 16-byte loads in flight a thread
#define GRAD_NORM_SCRATCH (GRAD_NORM_BLOCKS + 2)   // floats: the partials, then their sum (a double)
// partial (GRAD_NORM_BLOCKS); vec: grad is 16-byte aligned (else 4-byte loads, the same sums)
__global__ void grad_norm_partials_kernel(float* partial, const float* grad, size_t n, float pre, int vec) {
    __shared__ float scratch[32];
    const size_t pass = (size_t)GRAD_NORM_BLOCKS * GRAD_NORM_THREADS;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // virtual threads 4 tid + j
    for (size_t i0 = (size_t)blockIdx.x * GRAD_NORM_THREADS + 4 * threadIdx.x; i0 < n; i0 += GRAD_NORM_UNROLL * pass) {
        float x[GRAD_NORM_UNROLL][4];   // past n: 0, which adds exactly nothing to a sum of squares
        for (int u = 0; u < GRAD_NORM_UNROLL; u++) {
            size_t i = i0 + u * pass;
            if (vec && i + 3 < n) {
                float4 q = *(const float4*)(grad + i);
                x[u][0] = q.x; x[u][1] = q.y; x[u][2] = q.z; x[u][3] = q.w;
            } else {
                for (int j = 0; j < 4; j++) x[u][j] = i + j < n ? grad[i + j] : 0.0f;
            }
        }
        for (int u = 0; u < GRAD_NORM_UNROLL; u++)
            for (int j = 0; j < 4; j++) {
                float y = x[u][j] * pre;
                acc[j] += y * y;
            }
    }
    // virtual lane offsets 16, 8, 4: real lanes 4, 2, 1 away (the 8 real threads of a virtual warp)
    for (int o = 4; o > 0; o >>= 1)
        for (int j = 0; j < 4; j++) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    float warp = (acc[0] + acc[2]) + (acc[1] + acc[3]);   // offsets 2 and 1: within the thread
    if (threadIdx.x % 8 == 0) scratch[threadIdx.x / 8] = warp;   // virtual warp threadIdx.x / 8, its lane 0
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < GRAD_NORM_THREADS / 32 ? scratch[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) partial[blockIdx.x] = v;
    }
}

// the partials of grad (n) times pre into partial (GRAD_NORM_BLOCKS floats of device memory)
static inline void grad_norm_partials_gpu(float* partial, const float* grad, size_t n, float pre, cudaStream_t stream = 0) {
    LAUNCH(grad_norm_partials_kernel, GRAD_NORM_BLOCKS, GRAD_NORM_THREADS / 4, 0, stream, partial, grad, n, pre, (int)aligned16({grad}));
}

// *out = the partials added in double, in order (one thread: 256 additions)
__global__ void grad_sumsq_finish_kernel(double* out, const float* partial) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double acc = 0;
    for (int b = 0; b < GRAD_NORM_BLOCKS; b++) acc += partial[b];
    *out = acc;
}

// sum of squares of grad (n), as grad_sumsq; scratch: GRAD_NORM_SCRATCH floats of device memory.
// The host's one read (8 bytes, synchronising) is what the clipping scale needs.
static inline double grad_sumsq_gpu(const float* grad, size_t n, float* scratch, cudaStream_t stream = 0) {
    grad_norm_partials_gpu(scratch, grad, n, 1.0f, stream);
    double* sum = (double*)(scratch + GRAD_NORM_BLOCKS);
    LAUNCH(grad_sumsq_finish_kernel, 1, 32, 0, stream, sum, scratch);
    double acc = 0;
    cudaCheck(cudaMemcpyAsync(&acc, sum, sizeof acc, cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    return acc;
}
#endif  // DBRX_HAVE_CUDA
