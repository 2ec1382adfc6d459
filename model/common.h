/*
 * common.h — what every file of train_dbrx shares: error-checking macros that name the file and
 * line, checked file I/O, a deterministic random number generator, timing, and `real`, the
 * scalar type of the CPU reference backend. It also brings in platform.h, which says whether the build
 * has CUDA (DBRX_HAVE_CUDA) and, when it does, what it runs on.
 */
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sys/mman.h>   // madvise: malloc_check's huge pages
#include "platform.h"   // DBRX_HAVE_CUDA; the CUDA runtime (real or emulated) when the build has it

// The CPU reference computes in `real`. The product builds it as float (FP32, the spec's CPU
// numerics); the finite-difference gradient test compiles the very same code with
// -DCPU_REAL=double so that its central differences are accurate to ~1e-10 and a wrong
// gradient cannot hide inside the tolerance.
#ifndef CPU_REAL
#define CPU_REAL float
#endif
typedef CPU_REAL real;

// sum over i < n of x[i] y[i] in A, as 8 interleaved partial sums (lane i % 8) added pairwise at the end. The CPU
// results are then the same bits on every x86 machine: an `omp simd` reduction's order followed the vector width GCC
// picked for the machine (-march=native: 8 floats with AVX2, 16 with AVX-512), and AVX2 and AVX-512 machines
// trained to different losses. Eight independent lanes vectorise as well, and their order is fixed.
template <typename A, typename T>
static inline A dot_lanes8(const T* x, const T* y, size_t n) {
    A lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t n8 = n - n % 8;
    for (size_t i = 0; i < n8; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += (A)x[i + l] * (A)y[i + l];
    for (size_t i = n8; i < n; i++) lane[i - n8] += (A)x[i] * (A)y[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// ----------------------------------------------------------------------------------------------
// BF16 on the host: float -> bits, round to nearest even as the CUDA conversion (__float2bfloat16) does, a NaN kept a
// NaN; bits -> float exactly. (Checkpoints' BF16 tensors, compressed activations, BF16 AdamW moments on the CPU.)
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ----------------------------------------------------------------------------------------------
// errors. Exit codes: 1 = runtime failure (I/O, MPI, CUDA), 2 = bad input (flags, data, config).

#define EXIT_RUNTIME 1
#define EXIT_BAD_INPUT 2

// Print one line "error: <message>" and exit with `code`. Used for bad input that the user can fix.
// The line is formatted first and written with one call: ranks sharing a terminal must not
// interleave pieces of their messages.
[[noreturn]] inline void fail(int code, const char* fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: %s\n", msg);
    fflush(stderr);
    exit(code);
}

// A failed check of a call: names the source file and line of the call.
[[noreturn]] inline void fail_at(const char* file, int line, const char* fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error at %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    exit(EXIT_RUNTIME);
}

#define ENSURE(cond, ...) do { if (!(cond)) fail_at(__FILE__, __LINE__, __VA_ARGS__); } while (0)

// ----------------------------------------------------------------------------------------------
// checked file I/O: every call is checked and a failure names the path and the caller's line.

inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (!f) fail_at(file, line, "cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    return f;
}
inline void fread_check(void* p, size_t size, size_t n, FILE* f, const char* what, const char* file, int line) {
    size_t got = fread(p, size, n, f);
    if (got != n) fail_at(file, line, "short read of %s: wanted %zu items, got %zu (%s)", what, n, got,
                          feof(f) ? "end of file" : strerror(errno));
}
inline void fwrite_check(const void* p, size_t size, size_t n, FILE* f, const char* what, const char* file, int line) {
    size_t put = fwrite(p, size, n, f);
    if (put != n) fail_at(file, line, "short write of %s: wanted %zu items, wrote %zu (%s)", what, n, put, strerror(errno));
}
inline void fclose_check(FILE* f, const char* what, const char* file, int line) {
    if (fclose(f) != 0) fail_at(file, line, "closing %s failed: %s", what, strerror(errno));
}
// Host buffers from 2 MiB on are 2 MiB-aligned and advised onto transparent huge pages (where the kernel offers them,
// as in its "madvise" mode): their first touch then faults once per 2 MiB, not once per 4 KiB page. On a
// paravirtualised 2-core machine page faults were ~25% of the CPU of a short dbrx-tiny run (the test suite runs
// hundreds); the emulator's device memory does the same (test/simt/simt.h). Advice only: where it is refused nothing changes.
inline void* malloc_check(size_t n, const char* file, int line) {
    const size_t huge = (size_t)2 << 20;
    void* p = nullptr;
    if (n >= huge) {
        if (posix_memalign(&p, huge, n) != 0) p = nullptr;
        else madvise(p, n & ~(huge - 1), MADV_HUGEPAGE);
    } else {
        p = malloc(n ? n : 1);
    }
    if (!p) fail_at(file, line, "out of host memory allocating %zu bytes", n);
    return p;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)
#define freadCheck(p, size, n, f, what) fread_check(p, size, n, f, what, __FILE__, __LINE__)
#define fwriteCheck(p, size, n, f, what) fwrite_check(p, size, n, f, what, __FILE__, __LINE__)
#define fcloseCheck(f, what) fclose_check(f, what, __FILE__, __LINE__)
#define mallocCheck(n) malloc_check(n, __FILE__, __LINE__)

// ----------------------------------------------------------------------------------------------
// deterministic RNG: splitmix64 stream + Box-Muller. The same seed gives the same numbers on
// every machine and compiler (no std:: distributions, whose output is implementation-defined).

typedef struct { uint64_t state; } Rng;

inline uint64_t rng_u64(Rng* r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
// uniform in [0, 1) with 53 random bits
inline double rng_uniform(Rng* r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
inline double rng_normal(Rng* r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// ----------------------------------------------------------------------------------------------
// wall-clock time in seconds

inline double now_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
