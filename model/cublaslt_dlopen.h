/*
 * cublaslt_dlopen.h — cuBLASLt opened on first use, for the nvcc build (model/platform.h includes it after
 * <cublasLt.h>). A binary linked with -lcublasLt pays the library's static initialisers when it starts, whether
 * it uses a GPU or not: ~0.45 s of CPU per process (an empty main() linked with it: 450 ms, with libnccl 6 ms;
 * measured 2026-11-28 on CI's kind of machine, CUDA 13). Every --help, --dry-run and CPU-fallback run of the
 * nvcc-built ./train_dbrx paid it, and the test suite starts it about a thousand times.
 * So the binary is not linked with it. The first cuBLASLt call opens libcublasLt.so.<major of the headers the
 * build used> (the loader's search: LD_LIBRARY_PATH, then ld.so's cache) and resolves every function the
 * product calls; a missing library or function is a one-line error naming it. After the table below, each of
 * those names is a macro that calls through it, so model/matmul_cublaslt.cuh reads as plain cuBLASLt. A
 * function the product starts calling must join CUBLASLT_FUNCS and the macros: without, the link fails
 * (undefined reference), which is the reminder. test/test_cublaslt_dlopen.cpp opens the library through this
 * header on a machine without a GPU and calls its host-side functions.
 */
#pragma once
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <cublasLt.h>

#define CUBLASLT_FUNCS(X) \
    X(cublasLtGetVersion) X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtCreate) \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatrixLayoutDestroy) \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulDescDestroy) \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulPreferenceDestroy) \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulAlgoCheck) X(cublasLtMatmul)

// the library's functions as the headers declare them (decltype: no reference to the symbol itself)
typedef struct {
#define CUBLASLT_MEMBER(f) decltype(&::f) f;
    CUBLASLT_FUNCS(CUBLASLT_MEMBER)
#undef CUBLASLT_MEMBER
} CublasLtApi;

#define CUBLASLT_STR2(x) #x
#define CUBLASLT_STR(x) CUBLASLT_STR2(x)
// the soname of the headers' major version: a library of another major is another ABI
#define CUBLASLT_SONAME "libcublasLt.so." CUBLASLT_STR(CUBLAS_VER_MAJOR)

// opens the library and fills *api; exits with one line naming what is missing (fail_at's format, written out: this
// header comes before model/common.h, which includes platform.h, and test_cublaslt_dlopen includes it alone)
static inline const CublasLtApi* cublaslt_open(CublasLtApi* api, const char* soname) {
    void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "error at %s:%d: cannot load cuBLASLt (%s): %s: install CUDA's cuBLAS %d, or put its lib64 on LD_LIBRARY_PATH\n",
                __FILE__, __LINE__, soname, dlerror(), (int)CUBLAS_VER_MAJOR);
        exit(1);
    }
#define CUBLASLT_RESOLVE(f) \
    api->f = (decltype(api->f))dlsym(lib, #f); \
    if (!api->f) { \
        fprintf(stderr, "error at %s:%d: %s has no %s: not the cuBLASLt this build's headers describe\n", __FILE__, __LINE__, soname, #f); \
        exit(1); \
    }
    CUBLASLT_FUNCS(CUBLASLT_RESOLVE)
#undef CUBLASLT_RESOLVE
    return api;
}

// the table, opened by the first call (thread-safe: a function-local static's initialisation)
static inline const CublasLtApi* cublaslt_api() {
    static CublasLtApi api;
    static const CublasLtApi* opened = cublaslt_open(&api, CUBLASLT_SONAME);
    return opened;
}

#define cublasLtGetVersion(...) (cublaslt_api()->cublasLtGetVersion(__VA_ARGS__))
#define cublasLtGetStatusName(...) (cublaslt_api()->cublasLtGetStatusName(__VA_ARGS__))
#define cublasLtGetStatusString(...) (cublaslt_api()->cublasLtGetStatusString(__VA_ARGS__))
#define cublasLtCreate(...) (cublaslt_api()->cublasLtCreate(__VA_ARGS__))
#define cublasLtMatrixLayoutCreate(...) (cublaslt_api()->cublasLtMatrixLayoutCreate(__VA_ARGS__))
#define cublasLtMatrixLayoutSetAttribute(...) (cublaslt_api()->cublasLtMatrixLayoutSetAttribute(__VA_ARGS__))
#define cublasLtMatrixLayoutDestroy(...) (cublaslt_api()->cublasLtMatrixLayoutDestroy(__VA_ARGS__))
#define cublasLtMatmulDescCreate(...) (cublaslt_api()->cublasLtMatmulDescCreate(__VA_ARGS__))
#define cublasLtMatmulDescSetAttribute(...) (cublaslt_api()->cublasLtMatmulDescSetAttribute(__VA_ARGS__))
#define cublasLtMatmulDescDestroy(...) (cublaslt_api()->cublasLtMatmulDescDestroy(__VA_ARGS__))
#define cublasLtMatmulPreferenceCreate(...) (cublaslt_api()->cublasLtMatmulPreferenceCreate(__VA_ARGS__))
#define cublasLtMatmulPreferenceSetAttribute(...) (cublaslt_api()->cublasLtMatmulPreferenceSetAttribute(__VA_ARGS__))
#define cublasLtMatmulPreferenceDestroy(...) (cublaslt_api()->cublasLtMatmulPreferenceDestroy(__VA_ARGS__))
#define cublasLtMatmulAlgoGetHeuristic(...) (cublaslt_api()->cublasLtMatmulAlgoGetHeuristic(__VA_ARGS__))
#define cublasLtMatmulAlgoCheck(...) (cublaslt_api()->cublasLtMatmulAlgoCheck(__VA_ARGS__))
#define cublasLtMatmul(...) (cublaslt_api()->cublasLtMatmul(__VA_ARGS__))
