/*
 * test_cublaslt_dlopen.cpp — model/cublaslt_dlopen.h, the nvcc build's cuBLASLt opened on first use, on a machine
 * without a GPU (g++ against CUDA's headers; this binary is not linked with libcublasLt, as train_dbrx is not):
 *   * nothing of the library is mapped before the first call, and it is after it (the start-up that no longer pays
 *     for it);
 *   * every function of the table resolves into libcublasLt.so.<the headers' major>, and the version it reports
 *     is the headers' (CUBLAS_VERSION);
 *   * the host-side calls the product makes (layouts, descriptors, preferences, their attributes, status names)
 *     succeed through the table's macros; cublasLtCreate without a GPU returns a status, it does not crash;
 *   * a library that is not there (a wrong soname) exits 1 with one line naming it (a forked child).
 */
#include <doctest/doctest.h>
#include <algorithm>
#include <string.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include "../model/cublaslt_dlopen.h"

// true when a mapping of this process names `what` (/proc/self/maps)
static bool mapped(const char* what) {
    FILE* f = fopen("/proc/self/maps", "r");
    REQUIRE(f);
    char line[4096];
    bool found = false;
    while (fgets(line, sizeof line, f)) found = found || strstr(line, what);
    fclose(f);
    return found;
}

TEST_CASE("cuBLASLt opens on the first call, and its functions resolve into the library the headers name") {
    CHECK_FALSE(mapped("libcublasLt"));   // not linked: nothing loaded at start-up
    size_t v = cublasLtGetVersion();
    CHECK(mapped("libcublasLt"));
    CHECK(v == (size_t)CUBLAS_VERSION);
    const CublasLtApi* api = cublaslt_api();
    REQUIRE(api);
    const void* fns[] = {
#define CUBLASLT_ADDR(f) (const void*)api->f,
        CUBLASLT_FUNCS(CUBLASLT_ADDR)
#undef CUBLASLT_ADDR
    };
    const std::string soname = CUBLASLT_SONAME;
    for (const void* fn : fns) {
        Dl_info info;
        REQUIRE(fn);
        REQUIRE(dladdr(fn, &info));
        CHECK(std::string(info.dli_fname).find(soname) != std::string::npos);
    }
    CHECK(sizeof fns / sizeof fns[0] == 16);   // every cuBLASLt function model/matmul_cublaslt.cuh calls
}

TEST_CASE("the product's host-side cuBLASLt calls through the table") {
    CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
    CHECK(strlen(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0);
    cublasLtMatrixLayout_t l;
    REQUIRE(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 128, 64, 128) == CUBLAS_STATUS_SUCCESS);
    int32_t batch = 2;
    CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, 1) != CUBLAS_STATUS_SUCCESS);   // a wrong size refused
    CHECK(cublasLtMatrixLayoutDestroy(l) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t d;
    REQUIRE(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    cublasOperation_t t = CUBLAS_OP_T;
    CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulDescDestroy(d) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t p;
    REQUIRE(cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS);
    size_t ws = 32u << 20;
    CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulPreferenceDestroy(p) == CUBLAS_STATUS_SUCCESS);
    // no GPU here (CI): a status, not a crash; on a machine with one, a handle
    cublasLtHandle_t h = nullptr;
    cublasStatus_t st = cublasLtCreate(&h);
    CHECK((st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_INITIALIZED));
}

TEST_CASE("a missing library: one line naming it, exit 1") {
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    fflush(stdout);   // (the child's exit flushes what it inherited)
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        CublasLtApi api;
        cublaslt_open(&api, "libcublasLt.so.0");   // (no such major)
        _exit(0);
    }
    close(fd[1]);
    char buf[1024] = {0};
    ssize_t n = 0, r;
    while ((r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0) n += r;
    close(fd[0]);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
    std::string err(buf);
    CHECK(err.find("error at ") == 0);
    CHECK(err.find("cannot load cuBLASLt (libcublasLt.so.0)") != std::string::npos);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}
