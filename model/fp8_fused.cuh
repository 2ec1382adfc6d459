/*
 * fp8_fused.cuh — FP8 quantisation fused into the kernel that produces the activation (issue 25, "FP8 that
 * pays"). fp8_quantize_kernel (model/fp8.cuh) reads a BF16 tensor its producer wrote; here the producer itself
 * computes a 128 x 128 tile, rounds it to BF16 (the values the unfused path would have read back) and
 * quantises it from shared memory:
 *   FP8P_SWIGLU_FWD  act = silu(g) * u: w2's forward operand, the row-wise E4M3 codes, and optionally act in
 *                    BF16 (the model's step leaves it out: its fused backward recomputes act from g, u)
 *   FP8P_SWIGLU_BWD  dg, du from da, g, u: only their FP8 codes (row-wise for dgrad, transposed for wgrad) and
 *                    factors; the BF16 dg, du are not written at all (the FP8 GEMMs were their only readers).
 *                    Optionally a third output: act = silu(g) * u recomputed (the forward's BF16 act, bit for bit:
 *                    the same g, u, the same arithmetic), quantised for w2's weight gradient (its transposed
 *                    codes), so the backward does not read act back to quantise it
 *   FP8P_GATHER      y = x[idx[row]]: the experts' gathered input xe (moe_gather_gpu's rows, model/moe.cuh): w1's /
 *                    v1's forward operand, its row-wise E4M3 codes, so xe is not read back to quantise it; and either
 *                    xe in BF16 (where --recompute swiglu reads it again) or, in the same pass, its transposed codes
 *                    for the backward's w1 / v1 weight gradients (the model's step: fp8_xe_codes). With idx NULL
 *                    and no y, the quantisation of x itself (a BF16 tensor some kernel produced that this file does not
 *                    fuse: dye, LayerNorm's output, dqkv ...) with the 16-byte stores and transposes of these kernels,
 *                    in place of fp8_quantize_kernel's 1-byte ones (fp8_quantize_operand, model/dbrx_fp8_cuda.cuh)
 * The codes, the factors (the layouts of model/matmul.cuh), the amax and the saturation count are those of
 * fp8_quantize_kernel on the BF16 output, bit for bit: the same BF16 values, the same scale functions, amax by
 * max (exact in any order). test/test_fp8_cuda.cpp checks it against the unfused kernels; the losses of
 * test/test_fp8_cuda.sh and test/golden/unchanged.txt do not move.
 * Stores are 16 bytes (16 codes, 8 BF16 values): the tile's rows and the segments' starts must be multiples of
 * 16 rows and the columns a multiple of 16 — the padded expert layout guarantees both (fp8_fused_ok checks).
 * The outputs of the backward are two (three) blocks per tile, adjacent in the grid, so that the later blocks'
 * reads of da, g, u hit L2.
 */
#pragma once
#include <string>
#include "fp8.cuh"
#include "moe.cuh"

#if DBRX_HAVE_CUDA
typedef enum { FP8P_SWIGLU_FWD = 0, FP8P_SWIGLU_BWD = 1, FP8P_GATHER = 2 } Fp8Producer;

// the producer's inputs (rows, cols) and its optional BF16 output
typedef struct {
    const floatX *a, *b, *c;   // SWIGLU_FWD: g, u; SWIGLU_BWD: da, g, u; GATHER: x
    floatX* y;                 // SWIGLU_FWD: act; GATHER: the gathered rows; written in BF16 too (NULL: not written)
    const int* idx;            // GATHER: output row -> row of x (NULL: the same row)
} Fp8ProducerArgs;

// one quantised output: FP8Q_TENSOR's scale is *scale, or fp8_scale_for(*amax_in, margin) (current scaling)
typedef struct {
    const float* scale;
    const unsigned int* amax_in;
    Fp8QuantOut out;
} Fp8FusedOut;

#if defined(SIMT_EMULATION)
// the work log's fields (dev/predict/kernel_cost.py): [a?, b?, c?, y?, idx?] and [scale?, amax_in?, out's fields]
static inline std::string worklog_fields(const Fp8ProducerArgs& p) {
    std::string r = "[";
    for (const void* q : {(const void*)p.a, (const void*)p.b, (const void*)p.c, (const void*)p.y, (const void*)p.idx})
        r += std::string(r.size() > 1 ? "," : "") + (q ? "true" : "false");
    return r + "]";
}
static inline std::string worklog_fields(const Fp8FusedOut& o) {
    return std::string("[") + (o.scale ? "true," : "false,") + (o.amax_in ? "true," : "false,") + worklog_fields(o.out) + "]";
}
#endif

// SWIGLU_BWD's third output (act) is there when it has anything to write
__host__ __device__ __forceinline__ bool fp8_fused_has(const Fp8FusedOut& o) { return o.out.q || o.out.qt || o.out.amax; }
__host__ __device__ __forceinline__ int fp8_fused_nout(int prod, const Fp8FusedOut& o2) {
    return prod == FP8P_SWIGLU_BWD ? (fp8_fused_has(o2) ? 3 : 2) : 1;
}

// the fused path's shape rule: 16-row tiles and segment starts, 16-column tiles, 16-byte aligned pointers
static inline bool fp8_fused_ok(int rows, int cols, const std::vector<int>& seg_len, std::initializer_list<const void*> ptrs) {
    if (rows % 16 || cols % 16 || !aligned16(ptrs)) return false;
    for (int l : seg_len) if (l % 16) return false;
    return true;
}

// 8 consecutive values of the producer's output z at (row, col) of its (rows, cols) output, element i (16-byte loads)
template <int PROD>
__device__ __forceinline__ void fp8_produce8(float* v, const Fp8ProducerArgs& p, size_t i, int row, int cols, int col, int z) {
    if (PROD == FP8P_GATHER) {
        load_bf16<8>(v, p.a + (size_t)(p.idx ? p.idx[row] : row) * cols + col);
    } else if (PROD == FP8P_SWIGLU_FWD) {
        float g[8], u[8];
        load_bf16<8>(g, p.a + i);
        load_bf16<8>(u, p.b + i);
        for (int j = 0; j < 8; j++) v[j] = swiglu_value(g[j], u[j]);
    } else if (z == 2) {   // SWIGLU_BWD's act
        float g[8], u[8];
        load_bf16<8>(g, p.b + i);
        load_bf16<8>(u, p.c + i);
        for (int j = 0; j < 8; j++) v[j] = swiglu_value(g[j], u[j]);
    } else {
        float d[8], g[8], u[8], dg, du;
        load_bf16<8>(d, p.a + i);
        load_bf16<8>(g, p.b + i);
        load_bf16<8>(u, p.c + i);
        for (int j = 0; j < 8; j++) {
            swiglu_grads(d[j], g[j], u[j], &dg, &du);
            v[j] = z ? du : dg;
        }
    }
}

// 16 codes of tile values x[0], x[step], ... scaled by s, packed for one 16-byte store; counts saturations
__device__ __forceinline__ uint4 fp8_pack16(const floatX* x, int step, float s, int fmt, int* sat) {
    uint32_t w[4] = {0, 0, 0, 0};
    for (int j = 0; j < 16; j++) {
        float v = __bfloat162float(x[j * step]) * s;
        *sat += fp8_saturates_dev(v, fmt);
        w[j / 4] |= (uint32_t)fp8_cvt_dev(v, fmt) << (8 * (j % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

#define FP8F_THREADS 256
#define FP8F_LD 136   // the tile's row stride in BF16 values (272 bytes: rows 16-byte aligned)

// The kernels: one block per (128-row tile of a segment, 128 columns[, output z]): as fp8_quantize_kernel's FP8Q_AMAX,
// FP8Q_TENSOR and FP8Q_ACT modes, on the producer's output (and its FP8Q_WEIGHT mode for FP8P_GATHER of a weight as
// it is: one scale per 128 x 128 block, from the block's amax). Padding rows (past a segment's valid count) are
// quantised as zeros; their BF16 output (SWIGLU_FWD's act) is the producer's value, as the unfused kernel's.
// (The body of the kernels below, one per producer.)
// o2, fmt2: SWIGLU_BWD's optional third output (act) and its format.
template <int MODE, int PROD>
__device__ __forceinline__ void fp8_fused_tile(const Fp8ProducerArgs& p, int rows, int cols, const Fp8Segments& seg, int fmt0, int margin,
                                               const Fp8FusedOut& o0, const Fp8FusedOut& o1, const Fp8FusedOut& o2, int fmt2) {
    __shared__ uint4 tile_raw[128 * FP8F_LD / 8];   // (uint4: 16-byte aligned for the 16-byte accesses)
    floatX* tile = (floatX*)tile_raw;
    __shared__ float row_s[128], col_s[128], colm[2][128];
    __shared__ float scratch[32];
    const int tid = threadIdx.x, nout = fp8_fused_nout(PROD, o2);
    const int z = blockIdx.x % nout;   // the output (dg 0, du 1, act 2): the blocks of a tile adjacent
    const Fp8FusedOut& oz = z == 2 ? o2 : z ? o1 : o0;
    const Fp8QuantOut& out = oz.out;
    const int fmt = z == 2 ? fmt2 : fmt0;
    int t = blockIdx.x / nout, tiles_before = 0, seg0 = 0, len = 0;
    long long base_t = 0;   // (weights: the offset of the segment's transposed factors)
    const int s = fp8_tile_segment(seg, t, MODE == FP8Q_WEIGHT ? (cols + 127) / 128 : 0, &seg0, &len, &tiles_before, &base_t);
    if (s == seg.nseg) return;   // cannot happen with row_tiles from the same segments
    const int lt = t - tiles_before, row0 = seg0 + lt * 128, h = min(128, len - lt * 128);
    const int valid = seg.valid ? seg.valid[s] : len, vh = max(0, min(h, valid - lt * 128));
    const int c0 = blockIdx.y * 128, w = min(128, cols - c0);

    // produce the tile: 16 threads x 8 columns per row, 16 rows per pass (h a multiple of 16); each row's
    // amax over the tile's columns (its 16 threads: a half warp) gives the row's block scale
    float amax = 0.0f;
    for (int r0 = 0; r0 < h; r0 += 16) {
        const int r = r0 + tid / 16, c = (tid % 16) * 8;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, m = 0.0f;
        if (c < w) {
            size_t i = (size_t)(row0 + r) * cols + c0 + c;
            // (GATHER: a padding row is read only to write y, as the unfused gather writes it: x's own padding rows
            // may never have been written)
            if (PROD != FP8P_GATHER || r < vh || p.y) fp8_produce8<PROD>(v, p, i, row0 + r, cols, c0 + c, z);
            if (p.y) store_bf16<8>(p.y + i, v);
            Bf16Vec<8> b;
            for (int j = 0; j < 8; j++) {
                b.v[j] = __float2bfloat16(r < vh ? v[j] : 0.0f);   // the BF16 value the consumer would read
                m = fmaxf(m, fabsf(__bfloat162float(b.v[j])));
            }
            *(Bf16Vec<8>*)&tile[r * FP8F_LD + c] = b;
        }
        for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (MODE == FP8Q_ACT && tid % 16 == 0) row_s[r] = fp8_scale_for_dev(m, fmt, 0);
        amax = fmaxf(amax, m);
    }
    amax = block_max(amax, scratch);   // (its barriers also publish the tile and row_s)
    if (tid == 0 && out.amax) atomicMax(out.amax, __float_as_uint(amax));
    if (MODE == FP8Q_AMAX) return;

    if (MODE == FP8Q_ACT) {   // every column's scale: two halves of the rows, then their max
        const int c = tid % 128, half = tid / 128;
        float m = 0.0f;
        if (c < w)
            for (int r = half; r < h; r += 2) m = fmaxf(m, fabsf(__bfloat162float(tile[r * FP8F_LD + c])));
        colm[half][c] = m;
        __syncthreads();
        if (tid < 128) col_s[tid] = fp8_scale_for_dev(fmaxf(colm[0][tid], colm[1][tid]), fmt, 0);
    } else {                  // FP8Q_TENSOR: one scale; FP8Q_WEIGHT: the block's own
        float st = MODE == FP8Q_WEIGHT ? fp8_scale_for_dev(amax, fmt, 0)
                   : oz.amax_in        ? fp8_scale_for_dev(__uint_as_float(*oz.amax_in), fmt, margin) : *oz.scale;
        if (tid < 128) { row_s[tid] = st; col_s[tid] = st; }
    }
    __syncthreads();

    // q, row-wise: 8 threads x 16 codes per row, 32 rows per pass
    int sat = 0;
    if (out.q)
        for (int r0 = 0; r0 < h; r0 += 32) {
            const int r = r0 + tid / 8, c = (tid % 8) * 16;
            if (r < h && c < w)
                *(uint4*)(out.q + (size_t)(row0 + r) * cols + c0 + c) = fp8_pack16(&tile[r * FP8F_LD + c], 1, row_s[r], fmt, &sat);
        }
    // qt (cols, rows): a thread per (column, 16 rows); one tensor (or block) scale counts its saturations once
    if (out.qt) {
        int sat_t = 0;
        for (int i = tid; i < 128 * (h / 16); i += FP8F_THREADS) {
            const int c = i % 128, r = (i / 128) * 16;
            if (c < w)
                *(uint4*)(out.qt + (size_t)(c0 + c) * rows + row0 + r) = fp8_pack16(&tile[r * FP8F_LD + c], FP8F_LD, col_s[c], fmt, &sat_t);
        }
        // (counted apart where they are two uses: block scaling's two scales; the transposed copy alone; a gathered
        // xe's transposed codes for the backward beside its forward's, fp8_experts_forward_gpu's xe_codes, as the
        // CPU counts its forward and backward quantisations. A weight's one scale: once per step.)
        if (MODE == FP8Q_ACT || !out.q || p.idx) sat += sat_t;
    }
    float sat_block = block_sum((float)sat, scratch);   // < 2^24 per block: exact
    if (tid == 0 && out.saturated && sat_block > 0) atomicAdd(out.saturated, (unsigned long long)sat_block);

    // the dequantisation factors, in fp8_quantize_kernel's layouts
    if (MODE == FP8Q_TENSOR) {
        if (tid == 0 && t == 0 && blockIdx.y == 0 && out.sinv) out.sinv[0] = 1.0f / row_s[0];
    } else if (MODE == FP8Q_ACT) {
        fp8_act_factors_store(out, row_s, col_s, h, w, cols, seg0, len, lt, tiles_before, c0, tid, FP8F_THREADS);
    } else if (tid == 0) {
        fp8_weight_factors_store(out, 1.0f / row_s[0], cols, len, lt, tiles_before, base_t, c0);
    }
}

template <int MODE>
__global__ void __launch_bounds__(FP8F_THREADS) fp8_swiglu_quantize_kernel(Fp8ProducerArgs p, int rows, int cols, Fp8Segments seg, int fmt,
                                                                           int margin, Fp8FusedOut o0, Fp8FusedOut o1, Fp8FusedOut o2,
                                                                           int fmt2) {
    fp8_fused_tile<MODE, FP8P_SWIGLU_FWD>(p, rows, cols, seg, fmt, margin, o0, o1, o2, fmt2);
}
template <int MODE>
__global__ void __launch_bounds__(FP8F_THREADS) fp8_swiglu_bwd_quantize_kernel(Fp8ProducerArgs p, int rows, int cols, Fp8Segments seg,
                                                                               int fmt, int margin, Fp8FusedOut o0, Fp8FusedOut o1,
                                                                               Fp8FusedOut o2, int fmt2) {
    fp8_fused_tile<MODE, FP8P_SWIGLU_BWD>(p, rows, cols, seg, fmt, margin, o0, o1, o2, fmt2);
}
template <int MODE>
__global__ void __launch_bounds__(FP8F_THREADS) fp8_gather_quantize_kernel(Fp8ProducerArgs p, int rows, int cols, Fp8Segments seg, int fmt,
                                                                           int margin, Fp8FusedOut o0, Fp8FusedOut o1, Fp8FusedOut o2,
                                                                           int fmt2) {
    fp8_fused_tile<MODE, FP8P_GATHER>(p, rows, cols, seg, fmt, margin, o0, o1, o2, fmt2);
}

// Launches the producer `prod` with its output(s) quantised in `mode` (FP8Q_AMAX, FP8Q_TENSOR, FP8Q_ACT; FP8Q_WEIGHT:
// FP8P_GATHER without idx and y); o1 is
// the second output's (SWIGLU_BWD's du); o2 (or NULL) SWIGLU_BWD's third (act, in format fmt2). The caller checked
// fp8_fused_ok.
static inline void fp8_fused_quantize_gpu(Fp8Producer prod, const Fp8ProducerArgs& p, int rows, int cols, const Fp8Segments& seg,
                                          Fp8Format fmt, Fp8QuantMode mode, int margin, const Fp8FusedOut& o0, const Fp8FusedOut& o1,
                                          cudaStream_t stream = 0, const Fp8FusedOut* o2 = nullptr, Fp8Format fmt2 = FP8_E4M3) {
    if (rows == 0 || cols == 0 || seg.row_tiles == 0) return;
    if (mode == FP8Q_WEIGHT && (prod != FP8P_GATHER || p.idx || p.y))
        fail(EXIT_FAILURE, "fp8_fused_quantize_gpu: weights are quantised as they are (FP8P_GATHER without idx and y) only");
    const Fp8FusedOut none = {}, &o2v = o2 && prod == FP8P_SWIGLU_BWD ? *o2 : none;
    dim3 grid(seg.row_tiles * fp8_fused_nout(prod, o2v), ceil_div(cols, 128));
#define FP8F_LAUNCH(K) LAUNCH(K, grid, FP8F_THREADS, 0, stream, p, rows, cols, seg, (int)fmt, margin, o0, o1, o2v, (int)fmt2)
    if (prod == FP8P_SWIGLU_FWD) {
        if (mode == FP8Q_AMAX) FP8F_LAUNCH(fp8_swiglu_quantize_kernel<FP8Q_AMAX>);
        else if (mode == FP8Q_TENSOR) FP8F_LAUNCH(fp8_swiglu_quantize_kernel<FP8Q_TENSOR>);
        else FP8F_LAUNCH(fp8_swiglu_quantize_kernel<FP8Q_ACT>);
    } else if (prod == FP8P_GATHER) {
        if (mode == FP8Q_AMAX) FP8F_LAUNCH(fp8_gather_quantize_kernel<FP8Q_AMAX>);
        else if (mode == FP8Q_TENSOR) FP8F_LAUNCH(fp8_gather_quantize_kernel<FP8Q_TENSOR>);
        else if (mode == FP8Q_WEIGHT) FP8F_LAUNCH(fp8_gather_quantize_kernel<FP8Q_WEIGHT>);
        else FP8F_LAUNCH(fp8_gather_quantize_kernel<FP8Q_ACT>);
    } else {
        if (mode == FP8Q_AMAX) FP8F_LAUNCH(fp8_swiglu_bwd_quantize_kernel<FP8Q_AMAX>);
        else if (mode == FP8Q_TENSOR) FP8F_LAUNCH(fp8_swiglu_bwd_quantize_kernel<FP8Q_TENSOR>);
        else FP8F_LAUNCH(fp8_swiglu_bwd_quantize_kernel<FP8Q_ACT>);
    }
#undef FP8F_LAUNCH
}
#endif  // DBRX_HAVE_CUDA
