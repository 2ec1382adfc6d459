/*
 * matmul_cublaslt.cuh — matmul_cublaslt on the real cuBLASLt (nvcc builds): one handle and workspace for
 * the process, the FP8 block-scaling capability check, and the plan cache's cuBLASLt objects (descriptor,
 * layouts, the heuristic's algorithm) made, re-shaped per call and run. The emulated builds run this same
 * code on cuBLASLt's API twin (test/simt/cublaslt_api_twin.h, included by model/platform.h), which enforces
 * the library's rules as the device does. Not included on its own: model/matmul.cuh includes it after the
 * declarations it builds on (MatmulOptions, MatmulKey, matmul_key, matmul_validate).
 */
#pragma once
#include <map>
#include <string>
#include <vector>
#include "matmul_pins.h"

inline void cublas_check(cublasStatus_t st, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) fail_at(file, line, "cuBLAS error %s: %s", cublasLtGetStatusName(st), cublasLtGetStatusString(st));
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

// the library that chooses the algorithms, named in the saved tables (model/matmul_pins.h): a table saved
// under another cuBLASLt version is not used. Named by the CUDA set-up (train_cuda.cuh) and by the first
// handle, not at start-up: on the GPU the library opens on first use (model/cublaslt_dlopen.h)
static inline void matmul_pins_name_library() {
    if (matmul_pins().library.empty())
        matmul_pins().library = std::string(platform_cublaslt_name()) + " " + std::to_string((unsigned long long)cublasLtGetVersion());
}

// one handle and a 32 MiB workspace (what Hopper's kernels want) for the process; a stream given its own with
// cublaslt_stream_workspace_add uses that one instead: GEMMs that run at the same time on two streams must not share a
// workspace (a split-K algorithm keeps its partial sums there). Every other stream shares the process's: its GEMMs are
// ordered with the default stream's (dev/cuda/matmul -b runs the experts' GEMMs on side streams)
static const size_t cublaslt_workspace_bytes = 32ull << 20;
#define CUBLASLT_MAX_STREAM_WORKSPACES 8
typedef struct {
    cudaStream_t stream[CUBLASLT_MAX_STREAM_WORKSPACES];
    void* ws[CUBLASLT_MAX_STREAM_WORKSPACES];
    int n;
} CublasltStreamWorkspaces;
static inline CublasltStreamWorkspaces& cublaslt_stream_workspaces() {
    static CublasltStreamWorkspaces w = {};
    return w;
}
static inline void cublaslt_stream_workspace_add(cudaStream_t stream) {
    CublasltStreamWorkspaces& w = cublaslt_stream_workspaces();
    for (int i = 0; i < w.n; i++) if (w.stream[i] == stream) return;
    if (w.n == CUBLASLT_MAX_STREAM_WORKSPACES) fail(EXIT_FAILURE, "cublaslt_stream_workspace_add: more than %d streams", CUBLASLT_MAX_STREAM_WORKSPACES);
    cudaCheck(platform_cublaslt_workspace_alloc(&w.ws[w.n], cublaslt_workspace_bytes));
    w.stream[w.n++] = stream;
}
static inline cublasLtHandle_t cublaslt_handle(void** workspace, cudaStream_t stream = 0) {
    static cublasLtHandle_t handle = nullptr;
    static void* ws = nullptr;
    if (!handle) {
        matmul_pins_name_library();
        cublasCheck(cublasLtCreate(&handle));
        cudaCheck(platform_cublaslt_workspace_alloc(&ws, cublaslt_workspace_bytes));
    }
    *workspace = ws;
    const CublasltStreamWorkspaces& w = cublaslt_stream_workspaces();
    for (int i = 0; i < w.n; i++) if (w.stream[i] == stream) *workspace = w.ws[i];
    return handle;
}

// FP8 block scaling (the VEC128 / BLK128x128 scale modes) needs cuBLAS 12.9 or newer, at compile
// time and in the library loaded at run time, and a Hopper GPU (sm_90). Returns false and says why.
static inline bool matmul_fp8_block_check(std::string* why) {
    char buf[256];
#if CUBLAS_VERSION < 120900
    snprintf(buf, sizeof buf, "built against cuBLAS %d, which lacks the 1x128 / 128x128 block-scale modes (12.9+): "
             "use --fp8 current or --fp8 delayed", (int)CUBLAS_VERSION);
    *why = buf;
    return false;
#else
    size_t v = cublasLtGetVersion();
    if (v < 120900) {
        snprintf(buf, sizeof buf, "the cuBLASLt loaded at run time is %zu, which lacks the 1x128 / 128x128 block-scale modes "
                 "(12.9+): use --fp8 current or --fp8 delayed, or a newer CUDA", v);
        *why = buf;
        return false;
    }
    int dev = 0, major = 0, minor = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9) {
        snprintf(buf, sizeof buf, "cuBLAS's FP8 block scaling (1x128 / 128x128 FP32 scales) runs on sm_90 (Hopper); this GPU is "
                 "sm_%d%d: use --fp8 current or --fp8 delayed", major, minor);
        *why = buf;
        return false;
    }
    return true;
#endif
}
static inline bool matmul_fp8_block_supported(std::string* why) {
    static int known = -1;   // the answer does not change within the process: asked once
    static std::string reason;
    if (known >= 0) { *why = reason; return known; }
    known = matmul_fp8_block_check(&reason);
    *why = reason;
    return known;
}

static inline void layout_create(cublasLtMatrixLayout_t* l, cudaDataType_t t, long long rows, long long cols, int ld, int batch,
                                 long long stride) {
    cublasCheck(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
    if (batch > 1) {
        int32_t b = batch;
        int64_t s = stride;
        cublasCheck(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        cublasCheck(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s));
    }
}
static inline void layout_resize(cublasLtMatrixLayout_t l, long long rows, long long cols) {
    uint64_t r = (uint64_t)rows, c = (uint64_t)cols;
    cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof r));
    cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof c));
}

// One cached plan (see the plan cache above): the descriptor, the three layouts, the algorithm.
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} MatmulPlan;

static inline void matmul_plan_destroy(MatmulPlan* p) {
    cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
}

static inline MatmulAlgoWords matmul_algo_words(const cublasLtMatmulAlgo_t& a) {
    static_assert(sizeof(a.data) == sizeof(MatmulAlgoWords), "cublasLtMatmulAlgo_t is 8 uint64");
    MatmulAlgoWords w;
    memcpy(w.data(), a.data, sizeof w);
    return w;
}

// the pinned algorithm of key, if cuBLASLt accepts it for the plan's layouts as they are now
static inline bool matmul_plan_pinned(MatmulPlan* p, cublasLtHandle_t h, const MatmulKey& key, cublasLtMatmulAlgo_t* algo) {
    MatmulAlgoWords w;
    if (!matmul_pin_find(key, &w)) return false;
    memcpy(algo->data, w.data(), sizeof w);
    cublasLtMatmulHeuristicResult_t check;
    cublasStatus_t st = cublasLtMatmulAlgoCheck(h, p->desc, p->la, p->lb, p->ld, p->ld, algo, &check);
    if (st == CUBLAS_STATUS_SUCCESS && check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= cublaslt_workspace_bytes) {
        matmul_pins().pins_taken++;
        return true;
    }
    matmul_pin_refused(cublasLtGetStatusName(st != CUBLAS_STATUS_SUCCESS ? st : check.state));
    return false;
}

// Which of the heuristic's answers a new plan takes. The product takes its first (pick 0, one asked for), unless
// --gemm-autotune N (autotune > 1): then a plan the heuristic chose is timed with each of its first N answers at its
// first call and keeps the fastest (matmul_plan_autotune). dev/cuda/matmul -s FILE -a N times a shape's first N one by
// one, asking for `request` and reading how many came back (`found`, at the last query). tuned, trials: counts
typedef struct { int pick, request, found, autotune; long long tuned, trials; } MatmulHeuristicChoice;
static inline MatmulHeuristicChoice& matmul_heuristic_choice() { static MatmulHeuristicChoice c = {0, 1, 0, 0, 0, 0}; return c; }

// the heuristic's first n answers for the plan's layouts as they are now (the workspace and the alignments the key
// records as the preference); returns how many came back
static inline int matmul_heuristic_answers(MatmulPlan* p, cublasLtHandle_t h, const MatmulKey& key, int n,
                                           std::vector<cublasLtMatmulHeuristicResult_t>* out) {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = cublaslt_workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    uint32_t al_a = (uint32_t)key[15], al_b = (uint32_t)key[16], al_d = (uint32_t)key[17];
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    out->resize(n);
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->la, p->lb, p->ld, p->ld, pref, n, out->data(), &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

// the heuristic's best algorithm (its answer number `pick`, above) for the plan's layouts as they are now; false if it has none
static inline bool matmul_plan_query(MatmulPlan* p, cublasLtHandle_t h, const MatmulKey& key, cublasLtMatmulAlgo_t* algo) {
    MatmulHeuristicChoice& c = matmul_heuristic_choice();
    std::vector<cublasLtMatmulHeuristicResult_t> heur;
    c.found = matmul_heuristic_answers(p, h, key, c.request > c.pick + 1 ? c.request : c.pick + 1, &heur);
    if (c.found > c.pick) *algo = heur[c.pick].algo;
    return c.found > c.pick;
}

// the FP8 scale and amax pointers of this call on the descriptor. At a plan's creation too, before the heuristic
// is asked: it chooses among the algorithms that take the scales the call has (found on an H200: without them it
// refuses block scaling, INVALID_VALUE "requires a custom pointer for A scale", and may pick a per-tensor algorithm
// that the call with its scales then refuses, NOT_SUPPORTED). (amax_d reaches here only with an FP8 D: matmul_validate)
static inline void matmul_desc_set_pointers(cublasLtMatmulDesc_t desc, const MatmulOptions* opt) {
    if (!opt) return;
    const void* ptrs[4] = {opt->a_scale, opt->b_scale, opt->d_scale, opt->amax_d};
    const cublasLtMatmulDescAttributes_t attrs[4] = {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER};
    for (int i = 0; i < 4; i++)
        if (ptrs[i]) cublasCheck(cublasLtMatmulDescSetAttribute(desc, attrs[i], &ptrs[i], sizeof(void*)));
}

// a new plan: descriptor (transposes, FP8 modes; the pointers are set per call), layouts at the
// bucketed n and k, and the algorithm for them: the one pinned by the checkpoint resumed from, else the
// heuristic's; recorded for the next checkpoint
// (returns true when the heuristic chose the algorithm, false when a pin did)
static inline bool matmul_plan_create(MatmulPlan* p, cublasLtHandle_t h, const MatmulKey& key, long long qn, long long qk,
                                      const MatmulOptions* opt, const char* file, int line) {
    bool trans_a = key[0], trans_b = key[1];
    long long m = key[2];
    int lda = (int)key[8], ldb = (int)key[9], ldd = (int)key[10], batch = (int)key[11];
    cudaDataType_t a_type = (cudaDataType_t)key[5], b_type = (cudaDataType_t)key[6], d_type = (cudaDataType_t)key[7];
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (opt && opt->fast_accum) {
        int8_t fa = 1;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    }
    if (opt && is_fp8_type(a_type) && opt->a_scale_mode != MATMUL_SCALE_TENSOR) {   // block scaling (validated)
        std::string why;
        if (!matmul_fp8_block_supported(&why)) fail_at(file, line, "FP8 matmul with block scales: %s", why.c_str());
#if CUBLAS_VERSION >= 120900
        int32_t sm[2];
        for (int i = 0; i < 2; i++) {
            int mode = i ? opt->b_scale_mode : opt->a_scale_mode;
            sm[i] = mode == MATMUL_SCALE_VEC128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        }
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm[0], sizeof sm[0]));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm[1], sizeof sm[1]));
#endif
    }
    matmul_desc_set_pointers(p->desc, opt);
    layout_create(&p->la, a_type, trans_a ? qk : m, trans_a ? m : qk, lda, batch, key[12]);
    layout_create(&p->lb, b_type, trans_b ? qn : qk, trans_b ? qk : qn, ldb, batch, key[13]);
    layout_create(&p->ld, d_type, m, qn, ldd, batch, key[14]);
    if (matmul_plan_pinned(p, h, key, &p->algo)) {
        matmul_pin_record(key, matmul_algo_words(p->algo));
        return false;
    }
    if (matmul_plan_query(p, h, key, &p->algo)) {
        matmul_pin_record(key, matmul_algo_words(p->algo));
        return true;
    }
    fail_at(file, line, "cuBLASLt has no algorithm for m %lld n %lld k %lld (trans %c%c, A %s B %s D %s, lda %d ldb %d ldd %d, batch %d)",
                m, qn, qk, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', dtype_name(a_type), dtype_name(b_type), dtype_name(d_type),
                lda, ldb, ldd, batch);
}

static inline std::map<MatmulKey, MatmulPlan>& matmul_plans() { static std::map<MatmulKey, MatmulPlan> plans; return plans; }
// the fallback's algorithms, per exact shape (key with the exact n and k, marked in key[22]): the
// bucket's own algorithm stays what it was
static inline std::map<MatmulKey, cublasLtMatmulAlgo_t>& matmul_exact_algos() { static std::map<MatmulKey, cublasLtMatmulAlgo_t> a; return a; }
// --gemm-autotune N: the plan's algorithm (the heuristic's first) against its next answers, each timed on this very call
// (its layouts, operands and stream: one warm-up, then 3 runs between two events; the host waits for them), the fastest
// kept (a tie: the earlier answer) and recorded for the checkpoint, so a resumed run takes it again. Only a call that
// overwrites D (beta 0) and writes no FP8 amax: the trial runs write D as the call itself does next. An answer the call
// refuses is skipped. Once per plan, at its first call (the first step); a run's choices follow the device's timings, so
// two fresh runs may choose differently (their last bits differ) where the heuristic alone would not.
static inline void matmul_plan_autotune(MatmulPlan* p, cublasLtHandle_t h, const MatmulKey& key, const float* alpha, const void* A,
                                        const void* B, const float* beta, void* D, void* ws, size_t wsb, cudaStream_t stream) {
    MatmulHeuristicChoice& c = matmul_heuristic_choice();
    std::vector<cublasLtMatmulHeuristicResult_t> heur;
    const int found = matmul_heuristic_answers(p, h, key, c.autotune, &heur);
    if (found < 2) return;
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    float best_ms = 0.0f;
    int best = -1;
    for (int r = 0; r < found; r++) {
        if (heur[r].state != CUBLAS_STATUS_SUCCESS || heur[r].workspaceSize > wsb) continue;
        const cublasLtMatmulAlgo_t* algo = &heur[r].algo;
        if (cublasLtMatmul(h, p->desc, alpha, A, p->la, B, p->lb, beta, D, p->ld, D, p->ld, algo, ws, wsb, stream) != CUBLAS_STATUS_SUCCESS)
            continue;   // (refused for this call: not a candidate)
        cudaCheck(cudaEventRecord(e0, stream));
        for (int i = 0; i < 3; i++) cublasCheck(cublasLtMatmul(h, p->desc, alpha, A, p->la, B, p->lb, beta, D, p->ld, D, p->ld, algo, ws, wsb, stream));
        cudaCheck(cudaEventRecord(e1, stream));
        cudaCheck(cudaEventSynchronize(e1));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
        c.trials++;
        if (best < 0 || ms < best_ms) { best_ms = ms; best = r; }
    }
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    if (best < 0) return;   // (none ran: the heuristic's first stays)
    p->algo = heur[best].algo;
    matmul_pin_record(key, matmul_algo_words(p->algo));
    c.tuned++;
}

// every cached plan destroyed (the next call of a shape makes its plan again: dev/cuda/matmul -a, between candidates)
static inline void matmul_plans_clear() {
    for (auto& kv : matmul_plans()) matmul_plan_destroy(&kv.second);
    matmul_plans().clear();
    matmul_exact_algos().clear();
}

// D (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * D — COLUMN-major, cuBLAS conventions:
// A is stored (k, m) with lda >= k when trans_a, else (m, k) with lda >= m (likewise B); C is D.
// `batch` matrices, each operand advancing by its stride (elements). The descriptors, layouts and
// algorithm come from the plan cache (above); per call only the exact shape and the FP8 pointers are
// set on them.
static inline void matmul_cublaslt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A,
                                   cudaDataType_t a_type, int lda, long long stride_a, const void* B, cudaDataType_t b_type,
                                   int ldb, long long stride_b, float beta, void* D, cudaDataType_t d_type, int ldd,
                                   long long stride_d, int batch, const MatmulOptions* opt, cudaStream_t stream,
                                   const char* file, int line) {
    matmul_validate(trans_a, trans_b, m, n, k, a_type, lda, b_type, ldb, d_type, ldd, batch, opt, file, line);
    if (m == 0 || n == 0) return;
    bool fp8 = is_fp8_type(a_type);
    if (fp8) matmul_validate_fp8(trans_a, trans_b, m, n, k, A, a_type, lda, B, b_type, ldb, D, d_type, batch, opt, file, line);
    void* ws;
    cublasLtHandle_t h = cublaslt_handle(&ws, stream);
    long long qn, qk;
    MatmulKey key = matmul_key(trans_a, trans_b, m, n, k, a_type, lda, stride_a, A, b_type, ldb, stride_b, B, d_type, ldd, stride_d, D,
                               batch, opt, &qn, &qk);
    bool cached = matmul_plan_cache_enabled(), tune = false;
    MatmulPlan local, *p = &local;
    if (cached) {
        auto it = matmul_plans().find(key);
        if (it == matmul_plans().end()) {
            tune = matmul_plan_create(&local, h, key, qn, qk, opt, file, line) && matmul_heuristic_choice().autotune > 1 &&
                   beta == 0.0f && !(opt && opt->amax_d);   // (--gemm-autotune: a new plan of the heuristic's, below)
            it = matmul_plans().emplace(key, local).first;
        }
        p = &it->second;
    } else {
        matmul_plan_create(&local, h, key, qn, qk, opt, file, line);
    }
    // this call's shape and pointers on the plan's objects
    layout_resize(p->la, trans_a ? k : m, trans_a ? m : k);
    layout_resize(p->lb, trans_b ? n : k, trans_b ? k : n);
    layout_resize(p->ld, m, n);
    matmul_desc_set_pointers(p->desc, opt);
    size_t wsb = cublaslt_workspace_bytes;
    if (tune) matmul_plan_autotune(p, h, key, &alpha, A, B, &beta, D, ws, wsb, stream);
    char gname[128];   // --profile-kernels: the GEMM's range, named by its shape as dev/cuda/matmul -s keys it (predict.py's gemm_key)
    if (g_launch_hook) {
        snprintf(gname, sizeof gname, "gemm %d %d %d %d %s %s %s %d %d %d %d %d %d", m, n, k, batch, dtype_name(a_type), dtype_name(b_type),
                 dtype_name(d_type), trans_a, trans_b, beta != 0.0f, opt ? opt->fast_accum : 0, opt ? opt->a_scale_mode : 0,
                 opt ? opt->b_scale_mode : 0);
        g_launch_hook(gname, stream, false);
    }
    cublasStatus_t st = cublasLtMatmul(h, p->desc, &alpha, A, p->la, B, p->lb, &beta, D, p->ld, D, p->ld, &p->algo, ws, wsb, stream);
    if ((st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) && (qn != n || qk != k)) {
        // the bucket's algorithm does not take this exact shape: an algorithm for the exact shape, pinned or
        // asked for once, kept (and saved) under the exact shape's key; the bucket keeps its own
        MatmulKey exact = key;
        exact[3] = n; exact[4] = k; exact[22] = 1;
        auto it = matmul_exact_algos().find(exact);
        cublasLtMatmulAlgo_t algo;
        bool have = it != matmul_exact_algos().end();
        if (have) algo = it->second;
        else if ((have = matmul_plan_pinned(p, h, exact, &algo) || matmul_plan_query(p, h, exact, &algo))) {
            if (cached) matmul_exact_algos()[exact] = algo;
            matmul_pin_record(exact, matmul_algo_words(algo));
        }
        if (have) st = cublasLtMatmul(h, p->desc, &alpha, A, p->la, B, p->lb, &beta, D, p->ld, D, p->ld, &algo, ws, wsb, stream);
    }
    if (g_launch_hook) g_launch_hook(gname, stream, true);
    if (st != CUBLAS_STATUS_SUCCESS)
        fail_at(file, line, "cuBLASLt matmul m %d n %d k %d (trans %c%c) failed: %s: %s", m, n, k, trans_a ? 'T' : 'N',
                trans_b ? 'T' : 'N', cublasLtGetStatusName(st), cublasLtGetStatusString(st));
    if (!cached) matmul_plan_destroy(&local);
}
