/*
 * cublaslt_api_twin.h — cuBLASLt's API twin for the emulated builds: the cuBLASLt functions that
 * model/matmul_cublaslt.cuh calls (handle, matmul descriptor, matrix layouts, preference, the heuristic,
 * cublasLtMatmulAlgoCheck, cublasLtMatmul, version and status names), defined on the CPU over the real
 * header's types (<cublasLt.h>), so that the emulated builds run the same plan code as the device:
 * descriptors, layouts, the heuristic, the bucket fallback, pinned algorithms. The arithmetic of an
 * accepted cublasLtMatmul is test/simt/cublaslt_twin.h's. Included by model/platform.h (emulated builds).
 *
 * The rules the twin enforces, each answered as the library does (sources: the doc comments of CUDA 13.1's
 * cublasLt.h, NVIDIA's cuBLAS guide, and the project's first H200 run, dev/bench/results_gpu.md):
 *   R1 a layout's ld >= its rows (column order), at every use: INVALID_VALUE (cublasLt.h, LAYOUT_LD:
 *      "must be large enough so that matrix memory locations are not overlapping (e.g. greater or equal
 *      to CUBLASLT_MATRIX_LAYOUT_ROWS in case of CUBLASLT_ORDER_COL)"; cublasLtMatmul: INVALID_VALUE "if
 *      parameters are in conflict or in an impossible configuration"). Also INVALID_VALUE: op(A), op(B),
 *      C and D whose shapes or batches do not agree.
 *   R2 FP8 operands only TN (A transposed, B not): NOT_SUPPORTED (cuBLAS guide, cublasLtMatmul: "To use FP8
 *      kernels ... A must be transposed and B non-transposed (The "TN" format)" on Hopper). Also
 *      NOT_SUPPORTED: E5M2 x E5M2, types other than BF16 x BF16 / FP8 x FP8 into BF16 / FP32, a compute
 *      type other than CUBLAS_COMPUTE_32F with FP32 scales (the twin models no more).
 *   R3 a block scale mode (VEC128_32F / BLK128x128_32F) with no scale pointer for that operand on the
 *      descriptor: INVALID_VALUE, the heuristic included, with the H200's message "[cublasLtMatmulAlgoGetHeuristic]
 *      The scaling mode for A scale (BLK128x128_32F) requires a custom pointer for A scale" (results_gpu.md).
 *      Block modes: both operands, not both BLK128 (cuBLAS guide, 1D/2D block scaling), else NOT_SUPPORTED.
 *   R4 an algorithm keeps the set of scale / amax pointers the heuristic saw (bit field in word 2);
 *      AlgoCheck / cublasLtMatmul with a pointer outside that set: NOT_SUPPORTED (the H200: a heuristic
 *      asked without the scale pointers may choose an algorithm that the scaled call refuses).
 *   R5 the preference: the heuristic returns only algorithms whose workspace (word 3, a split-K stand-in:
 *      1 MiB when k exceeds both m and n and the preference allows it, else none) fits MAX_WORKSPACE_BYTES
 *      (cublasLt.h: "Maximum allowed workspace size", default 0); cublasLtMatmul with less workspace than
 *      the algorithm needs: INVALID_VALUE (cublasLt.h, cublasLtMatmul: "when workspaceSizeInBytes is less
 *      than workspace required by configured algo"). The algorithm needs the alignment of A, B, C, D that
 *      the preference's MIN_ALIGNMENT_*_BYTES promised (word 2; cublasLt.h: default 256, "selecting a
 *      smaller value will exclude algorithms that can not work with matrix A that is not as strictly
 *      aligned as they need"); cublasLtMatmul with a less aligned pointer (or batch stride): NOT_SUPPORTED
 *      (cublasLt.h, AlgoCheck: "will fail if e.g. buffers are not correctly aligned").
 *   R6 FAST_ACCUM only with per-tensor FP8: with block scale modes NOT_SUPPORTED (cublasLt.h: FAST_ACCUM is
 *      "fp8 fast accumulation mode", intermediate results not promoted; block scaling promotes per block).
 *   R7 AlgoCheck refuses an algorithm whose word 7 is not 0: NOT_SUPPORTED (the twin's stand-in for an
 *      algorithm of another GPU; test/test_gemm_pins.sh).
 *   R8 an AMAX_D pointer with a D that is not FP8 (the twin's D is BF16 or FP32: always): INVALID_VALUE, the
 *      heuristic included (cublasLt.h, AMAX_D_POINTER: INVALID_VALUE "if set for an unsupported matrix data, scale,
 *      and compute type combination"; an H100 refused E4M3 x E4M3 -> FP32 with it at the heuristic).
 *   R9 a scale pointer (A, B, D) not 16-byte aligned: cublasLtMatmul NOT_SUPPORTED, whatever the algorithm (an H100's
 *      cuBLASLt 13 refused a per-tensor B scale 4 bytes off for each of its heuristic's three candidates and took one 16
 *      bytes off, 2026-11-28, results_gpu.md; the heuristic itself answered).
 * The fake algorithm: word 0 an FNV-1a hash of the problem the heuristic saw, word 1 the process id (a
 * restarted process that asked again records other algorithms than the run it resumes: the resume tests),
 * word 2 the pointer set (bits 0-3: A, B, D scale, amax) and log2 of the alignments it needs (4 bits each
 * from bit 8: A, B, C, D), word 3 its workspace, word 4 the heuristic's n << 32 | k, word 5 its rank among the
 * heuristic's answers (up to 4, as many as asked for: the same GEMM each).
 * Counters (simt::counters()): a matmul descriptor made counts a plan (plan_creations), a heuristic call a
 * query (heuristic_queries), an accepted cublasLtMatmul a GEMM, with its line in the work log (SIMT_WORKLOG:
 * test/simt/counters.h; dev/predict reads it). CUBLASLT_LOG_LEVEL >= 1 prints each refusal on stderr, as
 * cuBLASLt's own log does; cublaslt_twin_last_error() gives the last one to the tests.
 * cublaslt_twin_strict_shapes(true) (tests only): an algorithm takes no shape but the one the heuristic
 * was asked for (NOT_SUPPORTED otherwise), the stand-in for a bucket's algorithm that the exact shape does
 * not fit, to exercise model/matmul_cublaslt.cuh's fallback. cublaslt_twin_answer_delay_us(us) (tests only): a GEMM run
 * with the heuristic's answer r takes (3 - r) x us microseconds longer (wall clock, which the emulator's events time),
 * so that the last answer is the fastest: --gemm-autotune's choice (model/matmul_cublaslt.cuh) under test.
 */
#pragma once
#include <cublasLt.h>
#include <stdarg.h>
#include <unistd.h>
#include <string>
#include "cublaslt_twin.h"

struct cublasLtContext { int live; };

namespace lt_twin {

// the twin's state behind the header's semi-opaque types (the opaque part first: the handle is its address)
struct Desc {
    cublasLtMatmulDescOpaque_t opaque;
    cublasComputeType_t compute;
    cudaDataType_t scale_type;
    int32_t trans[2];        // cublasOperation_t of A, B
    int8_t fast_accum;
    int32_t mode[2];         // cublasLtMatmulMatrixScale_t of A, B
    const void* ptr[4];      // A, B, D scale, amax D
};
struct Layout {
    cublasLtMatrixLayoutOpaque_t opaque;
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
};
struct Pref {
    cublasLtMatmulPreferenceOpaque_t opaque;
    uint64_t max_workspace;
    uint32_t align[4];       // A, B, C, D
};
static inline Desc* desc(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
static inline Layout* layout(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }
static inline Pref* pref(cublasLtMatmulPreference_t p) { return reinterpret_cast<Pref*>(p); }

struct State { std::string last_error; bool strict_shapes = false; int answer_delay_us = 0; };
static inline State& state() { static State s; return s; }

// a refusal: remembered, and logged as cuBLASLt's CUBLASLT_LOG_LEVEL >= 1 does
static inline cublasStatus_t refuse(cublasStatus_t st, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static inline cublasStatus_t refuse(cublasStatus_t st, const char* fn, const char* fmt, ...) {
    static const bool log = getenv("CUBLASLT_LOG_LEVEL") && atoi(getenv("CUBLASLT_LOG_LEVEL")) >= 1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    state().last_error = std::string("[") + fn + "] " + msg;
    if (log) fprintf(stderr, "[cuBLASLt twin][Error]%s\n", state().last_error.c_str());
    return st;
}
// sizeInBytes must be the attribute's own (cublasLt.h, the SetAttribute functions: INVALID_VALUE otherwise)
template <typename T>
static inline cublasStatus_t set(T* field, const void* buf, size_t n, const char* fn, int attr) {
    if (!buf || n != sizeof(T)) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: %zu bytes, expected %zu", attr, n, sizeof(T));
    memcpy(field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}
static inline bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
static inline size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1; }
static inline const char* type_name(cudaDataType_t t) {
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_32F ? "fp32" : t == CUDA_R_8F_E4M3 ? "e4m3" : t == CUDA_R_8F_E5M2 ? "e5m2" : "unsupported";
}
static inline const char* mode_name(int32_t m) {
    return m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? "VEC128_32F" : m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F ? "BLK128x128_32F" : "SCALAR_32F";
}
static inline bool block_mode(int32_t m) {
    return m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}
// the pointer set of a descriptor (bit i: ptr[i] set)
static inline uint64_t pointer_set(const Desc* d) {
    uint64_t s = 0;
    for (int i = 0; i < 4; i++) s |= d->ptr[i] ? 1ull << i : 0;
    return s;
}
static inline uint32_t log2u(uint32_t x) { uint32_t r = 0; while (x > 1) { x >>= 1; r++; } return r; }
// the alignment of an address (bytes, up to 256), and of every matrix of a strided batch
static inline uint32_t alignment(const void* p, int64_t stride, int32_t batch, cudaDataType_t t) {
    uintptr_t a = (uintptr_t)p | (batch > 1 ? (uintptr_t)(stride * (int64_t)type_bytes(t)) : 0) | 256;
    return (uint32_t)(a & (~a + 1));
}

// the problem of a call: R1, R2, R3, R6, R8 (see the top); m, n, k out
static inline cublasStatus_t check_problem(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t la,
                                           cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                           const char* fn, int* m, int* n, int* k) {
    if (!h || !h->live) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, fn, "the handle is not initialised");
    if (!dd || !la || !lb || !lc || !ld) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "a descriptor is NULL");
    const Desc* d = desc(dd);
    const Layout *A = layout(la), *B = layout(lb), *C = layout(lc), *D = layout(ld);
    const Layout* all[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)   // R1
        if (all[i]->ld < 0 || (uint64_t)all[i]->ld < all[i]->rows)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "matrix %c: ld %lld < rows %llu", "ABCD"[i], (long long)all[i]->ld,
                          (unsigned long long)all[i]->rows);
    bool ta = d->trans[0] == CUBLAS_OP_T, tb = d->trans[1] == CUBLAS_OP_T;
    uint64_t am = ta ? A->cols : A->rows, ak = ta ? A->rows : A->cols, bk = tb ? B->cols : B->rows, bn = tb ? B->rows : B->cols;
    if (ak != bk || am != D->rows || bn != D->cols || C->rows != D->rows || C->cols != D->cols || A->batch != D->batch ||
        B->batch != D->batch || C->batch != D->batch)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu (batches %d %d %d %d) do not agree",
                      (unsigned long long)am, (unsigned long long)ak, (unsigned long long)bk, (unsigned long long)bn,
                      (unsigned long long)C->rows, (unsigned long long)C->cols, (unsigned long long)D->rows,
                      (unsigned long long)D->cols, A->batch, B->batch, C->batch, D->batch);
    *m = (int)am; *n = (int)bn; *k = (int)ak;
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale_type != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the twin models CUBLAS_COMPUTE_32F with FP32 scales only");
    bool fp8 = is_fp8(A->type) && is_fp8(B->type);
    bool types = (fp8 || (A->type == CUDA_R_16BF && B->type == CUDA_R_16BF)) && C->type == D->type &&
                 (D->type == CUDA_R_16BF || D->type == CUDA_R_32F) && !(A->type == CUDA_R_8F_E5M2 && B->type == CUDA_R_8F_E5M2);
    if (!types)   // R2
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "types A %s B %s C %s D %s", type_name(A->type), type_name(B->type),
                      type_name(C->type), type_name(D->type));
    if (fp8 && !(ta && !tb))   // R2
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "FP8 operands need the TN layout (A transposed, B not), got %c%c", ta ? 'T' : 'N',
                      tb ? 'T' : 'N');
    if (d->ptr[3] && !is_fp8(D->type))   // R8
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "an AMAX_D pointer with D %s: amax is computed for an FP8 D only", type_name(D->type));
    bool blocks = block_mode(d->mode[0]) || block_mode(d->mode[1]);
    if (blocks) {   // R3, R6
        if (!fp8) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "block scale modes need FP8 operands");
        for (int i = 0; i < 2; i++)
            if (block_mode(d->mode[i]) && !d->ptr[i])
                return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "The scaling mode for %c scale (%s) requires a custom pointer for %c scale",
                              "AB"[i], mode_name(d->mode[i]), "AB"[i]);
        if (!block_mode(d->mode[0]) || !block_mode(d->mode[1]) ||
            (d->mode[0] == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && d->mode[1] == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "scale modes A %s B %s", mode_name(d->mode[0]), mode_name(d->mode[1]));
        if (d->fast_accum) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "FAST_ACCUM with block scale modes");
    }
    return CUBLAS_STATUS_SUCCESS;
}

// whether `algo` takes this call's descriptor and shape (R4, R7, the strict-shapes knob); workspace and
// alignment are the matmul's (R5)
static inline cublasStatus_t check_algo(const Desc* d, const cublasLtMatmulAlgo_t* algo, int n, int k, const char* fn) {
    const uint64_t* w = algo->data;
    if (w[7] != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the algorithm is not one of this device's (word 7 %llx)", (unsigned long long)w[7]);
    uint64_t extra = pointer_set(d) & ~(w[2] & 0xF);
    if (extra)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the algorithm was chosen without the %s pointer the call sets",
                      extra & 1 ? "A scale" : extra & 2 ? "B scale" : extra & 4 ? "D scale" : "amax D");
    if (state().strict_shapes && w[4] != ((uint64_t)n << 32 | (uint32_t)k))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the algorithm was chosen for n %llu k %llu, not n %d k %d",
                      (unsigned long long)(w[4] >> 32), (unsigned long long)(uint32_t)w[4], n, k);
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace lt_twin

// tests only: the last refusal's message, and the strict-shapes knob (above)
static inline const std::string& cublaslt_twin_last_error() { return lt_twin::state().last_error; }
static inline void cublaslt_twin_strict_shapes(bool on) { lt_twin::state().strict_shapes = on; }
static inline void cublaslt_twin_answer_delay_us(int us) { lt_twin::state().answer_delay_us = us; }

// ---- the functions of cublasLt.h the product calls ----
inline size_t cublasLtGetVersion() { return CUBLAS_VERSION; }   // the header's: the twin stands for that library
inline const char* cublasLtGetStatusName(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}
// the status's meaning, and (the twin's addition, as cuBLASLt's log would show it) the last refusal
inline const char* cublasLtGetStatusString(cublasStatus_t st) {
    static thread_local std::string s;
    s = st == CUBLAS_STATUS_INVALID_VALUE ? "an unsupported value or parameter was passed to the function"
        : st == CUBLAS_STATUS_NOT_SUPPORTED ? "the functionality requested is not supported"
        : st == CUBLAS_STATUS_NOT_INITIALIZED ? "the library was not initialized" : "see the status name";
    if (st != CUBLAS_STATUS_SUCCESS && !lt_twin::state().last_error.empty()) s += " (cuBLASLt twin: " + lt_twin::state().last_error + ")";
    return s.c_str();
}

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale_type) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    simt::count(&simt::counters().plan_creations);   // one per plan made (model/matmul_cublaslt.cuh)
    lt_twin::Desc* x = new lt_twin::Desc();
    x->compute = compute;
    x->scale_type = scale_type;
    x->trans[0] = x->trans[1] = CUBLAS_OP_N;
    *d = reinterpret_cast<cublasLtMatmulDesc_t>(x);   // (the whole object: its opaque part is first)
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete lt_twin::desc(d); return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t dd, cublasLtMatmulDescAttributes_t a, const void* buf, size_t n) {
    const char* fn = "cublasLtMatmulDescSetAttribute";
    if (!dd) return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "the descriptor is NULL");
    lt_twin::Desc* d = lt_twin::desc(dd);
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return lt_twin::set(&d->trans[0], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return lt_twin::set(&d->trans[1], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return lt_twin::set(&d->fast_accum, buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return lt_twin::set(&d->mode[0], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return lt_twin::set(&d->mode[1], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return lt_twin::set(&d->ptr[0], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return lt_twin::set(&d->ptr[1], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return lt_twin::set(&d->ptr[2], buf, n, fn, a);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return lt_twin::set(&d->ptr[3], buf, n, fn, a);
    default: return lt_twin::refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the twin does not model descriptor attribute %d", (int)a);
    }
}

inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    lt_twin::Layout* x = new lt_twin::Layout();
    x->type = t; x->rows = rows; x->cols = cols; x->ld = ld; x->batch = 1;
    *l = reinterpret_cast<cublasLtMatrixLayout_t>(x);
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete lt_twin::layout(l); return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t ll, cublasLtMatrixLayoutAttribute_t a, const void* buf, size_t n) {
    const char* fn = "cublasLtMatrixLayoutSetAttribute";
    if (!ll) return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "the descriptor is NULL");
    lt_twin::Layout* l = lt_twin::layout(ll);
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return lt_twin::set(&l->rows, buf, n, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return lt_twin::set(&l->cols, buf, n, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_LD: return lt_twin::set(&l->ld, buf, n, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return lt_twin::set(&l->batch, buf, n, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return lt_twin::set(&l->stride, buf, n, fn, a);
    default: return lt_twin::refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the twin does not model layout attribute %d", (int)a);
    }
}

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    lt_twin::Pref* x = new lt_twin::Pref();
    x->max_workspace = 0;                                        // cublasLt.h's defaults
    for (int i = 0; i < 4; i++) x->align[i] = 256;
    *p = reinterpret_cast<cublasLtMatmulPreference_t>(x);
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete lt_twin::pref(p); return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pp, cublasLtMatmulPreferenceAttributes_t a,
                                                           const void* buf, size_t n) {
    const char* fn = "cublasLtMatmulPreferenceSetAttribute";
    if (!pp) return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "the descriptor is NULL");
    lt_twin::Pref* p = lt_twin::pref(pp);
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return lt_twin::set(&p->max_workspace, buf, n, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return lt_twin::set(&p->align[0], buf, n, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return lt_twin::set(&p->align[1], buf, n, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return lt_twin::set(&p->align[2], buf, n, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return lt_twin::set(&p->align[3], buf, n, fn, a);
    default: return lt_twin::refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the twin does not model preference attribute %d", (int)a);
    }
}

// one algorithm (the twin has one per problem): see the top for its words
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t la,
                                                     cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                                     cublasLtMatmulPreference_t pp, int requested, cublasLtMatmulHeuristicResult_t results[],
                                                     int* returned) {
    const char* fn = "cublasLtMatmulAlgoGetHeuristic";
    simt::count(&simt::counters().heuristic_queries);
    if (requested <= 0 || !results || !returned || !pp) return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "no room for results");
    *returned = 0;
    int m, n, k;
    cublasStatus_t st = lt_twin::check_problem(h, dd, la, lb, lc, ld, fn, &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const lt_twin::Desc* d = lt_twin::desc(dd);
    const lt_twin::Pref* p = lt_twin::pref(pp);
    uint64_t hsh = 1469598103934665603ull;   // FNV-1a of what the heuristic sees
    auto mix = [&](uint64_t v) { hsh ^= v; hsh *= 1099511628211ull; };
    mix(d->trans[0]); mix(d->trans[1]); mix((uint64_t)d->fast_accum); mix(d->mode[0]); mix(d->mode[1]); mix(lt_twin::pointer_set(d));
    for (cublasLtMatrixLayout_t l : {la, lb, ld}) {
        const lt_twin::Layout* x = lt_twin::layout(l);
        mix(x->type); mix(x->rows); mix(x->cols); mix((uint64_t)x->ld); mix((uint64_t)x->batch); mix((uint64_t)x->stride);
    }
    for (int i = 0; i < 4; i++) mix(p->align[i]);
    uint64_t want = (k > m && k > n) ? 1ull << 20 : 0;   // the split-K stand-in (R5)
    uint64_t ws = want <= p->max_workspace ? want : 0;
    uint64_t req = lt_twin::pointer_set(d);
    for (int i = 0; i < 4; i++) req |= (uint64_t)lt_twin::log2u(p->align[i]) << (8 + 4 * i);
    // up to TWIN_HEURISTIC_ANSWERS candidates, best first as cuBLASLt orders them: word 5 the candidate's rank (the
    // same arithmetic in each: the twin has one GEMM; dev/cuda/matmul -a validates every candidate it times)
    const int TWIN_HEURISTIC_ANSWERS = 4;
    for (int i = 0; i < requested && i < TWIN_HEURISTIC_ANSWERS; i++) {
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof r);
        uint64_t words[8] = {hsh, (uint64_t)getpid(), req, ws, (uint64_t)n << 32 | (uint32_t)k, (uint64_t)i, 0, 0};
        memcpy(r.algo.data, words, sizeof words);
        r.workspaceSize = ws;
        r.state = CUBLAS_STATUS_SUCCESS;
        r.wavesCount = 1.0f;
        results[i] = r;
        *returned = i + 1;
    }
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                              const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
    const char* fn = "cublasLtMatmulAlgoCheck";
    if (!algo || !result) return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "algo or result is NULL");
    memset(result, 0, sizeof *result);
    int m, n, k;
    cublasStatus_t st = lt_twin::check_problem(h, dd, la, lb, lc, ld, fn, &m, &n, &k);
    if (st == CUBLAS_STATUS_SUCCESS) st = lt_twin::check_algo(lt_twin::desc(dd), algo, n, k, fn);
    result->state = st;
    result->workspaceSize = algo->data[3];
    result->wavesCount = 1.0f;
    return st;
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, const void* alpha, const void* A, cublasLtMatrixLayout_t la,
                                     const void* B, cublasLtMatrixLayout_t lb, const void* beta, const void* C, cublasLtMatrixLayout_t lc,
                                     void* D, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
    const char* fn = "cublasLtMatmul";
    int m, n, k;
    cublasStatus_t st = lt_twin::check_problem(h, dd, la, lb, lc, ld, fn, &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!algo || !alpha || !beta) return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "algo, alpha or beta is NULL (the twin needs an algorithm)");
    const lt_twin::Desc* d = lt_twin::desc(dd);
    if ((st = lt_twin::check_algo(d, algo, n, k, fn)) != CUBLAS_STATUS_SUCCESS) return st;
    for (int i = 0; i < 3; i++)   // R9
        if ((uintptr_t)d->ptr[i] % 16)
            return lt_twin::refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the %c scale pointer %p is not 16-byte aligned", "ABD"[i], d->ptr[i]);
    const lt_twin::Layout* L[4] = {lt_twin::layout(la), lt_twin::layout(lb), lt_twin::layout(lc), lt_twin::layout(ld)};
    const void* P[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {   // R5: the alignment the algorithm was chosen for
        uint32_t need = 1u << ((algo->data[2] >> (8 + 4 * i)) & 0xF), have = lt_twin::alignment(P[i], L[i]->stride, L[i]->batch, L[i]->type);
        if (have < need)
            return lt_twin::refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "matrix %c is %u-byte aligned, the algorithm needs %u", "ABCD"[i], have, need);
    }
    if (workspace_bytes < algo->data[3] || (algo->data[3] && !workspace))   // R5
        return lt_twin::refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %zu bytes, the algorithm needs %llu", workspace_bytes,
                               (unsigned long long)algo->data[3]);
    int mode[2];
    for (int i = 0; i < 2; i++)   // the scale modes as model/matmul.cuh numbers them (0 per tensor, 1 1x128, 2 128x128)
        mode[i] = d->mode[i] == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? 1 : d->mode[i] == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F ? 2 : 0;
    float al = *(const float*)alpha, be = *(const float*)beta;
    if (lt_twin::state().answer_delay_us && algo->data[5] < 3) usleep((useconds_t)((3 - algo->data[5]) * lt_twin::state().answer_delay_us));
    simt::count(&simt::counters().gemms);
    if (simt::worklog_file()) {   // the work log's line (SIMT_WORKLOG: test/simt/counters.h)
        std::lock_guard<std::mutex> lock(simt::worklog().mu);
        simt::worklog_line(simt::worklog_fmt(
            "\"t\":\"gemm\",\"m\":%d,\"n\":%d,\"k\":%d,\"batch\":%d,\"a\":\"%s\",\"b\":\"%s\",\"d\":\"%s\",\"trans_a\":%s,"
            "\"trans_b\":%s,\"beta\":%.9g,\"fast_accum\":%d,\"a_scale_mode\":%d,\"b_scale_mode\":%d,\"epilogue\":\"none\","
            "\"stream\":%d,\"flops\":%lld", m, n, k, L[3]->batch, lt_twin::type_name(L[0]->type), lt_twin::type_name(L[1]->type),
            lt_twin::type_name(L[3]->type), d->trans[0] == CUBLAS_OP_T ? "true" : "false", d->trans[1] == CUBLAS_OP_T ? "true" : "false",
            (double)be, (int)d->fast_accum, mode[0], mode[1], simt::worklog_stream(stream), 2ll * m * n * k * L[3]->batch));
    }
    if (simt::options().shapes_only) return CUBLAS_STATUS_SUCCESS;   // SIMT_SHAPES_ONLY (simt.h): checked and logged, not computed
    TwinGemm g;
    g.trans_a = d->trans[0] == CUBLAS_OP_T; g.trans_b = d->trans[1] == CUBLAS_OP_T;
    g.m = m; g.n = n; g.k = k; g.batch = L[3]->batch;
    g.alpha = al; g.beta = be;
    g.A = A; g.B = B; g.C = C; g.D = D;
    g.a_type = L[0]->type; g.b_type = L[1]->type; g.d_type = L[3]->type;
    g.lda = L[0]->ld; g.ldb = L[1]->ld; g.ldc = L[2]->ld; g.ldd = L[3]->ld;
    g.stride_a = L[0]->stride; g.stride_b = L[1]->stride; g.stride_c = L[2]->stride; g.stride_d = L[3]->stride;
    g.a_scale = (const float*)d->ptr[0]; g.b_scale = (const float*)d->ptr[1]; g.d_scale = (const float*)d->ptr[2];
    g.a_mode = mode[0]; g.b_mode = mode[1];
    g.fast_accum = d->fast_accum != 0;
    // the arithmetic runs on `stream` as a kernel does: now on the null stream, when it is waited for on a
    // stream made by cudaStreamCreate* (simt.h, "Streams"; the scales are read and amax written then)
    simt::stream_enqueue(stream, [g]() { twin_matmul_compute(g); });
    return CUBLAS_STATUS_SUCCESS;
}
