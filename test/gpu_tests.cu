/*
 * gpu_tests.cu — the five device test programs (test/test_kernels.cpp, test_step_cuda.cpp, test_fp8_cuda.cpp,
 * test_zero_fp8_cuda.cpp, test_decode.cpp) compiled by nvcc as one translation unit: each compiled alone
 * repeated the same model headers and the same kernels, host and device, about 45 CPU-seconds a program;
 * together they compile in about a third of the five. The Makefile links the binary under each program's
 * name (test/test_kernels_gpu, ...), and main() runs the program its name says: that file's main(), with
 * doctest's --source-file filter restricting the run to that file's test cases.
 * (The emulated builds compile each source alone, as before.)
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
#include "../model/dbrx.h"
#include "../model/dbrx_cuda.cuh"
#include "../model/residual.cuh"
#include "../model/attention_cp_cuda.cuh"
#include "../model/sample.h"
#include "../data/tokenizer.h"
#include "../parallel/zero_fp8.h"
#include "cuda_test_helpers.h"

// Each source in its own namespace (their file-scope helpers share names: batch, SEED, OPT), its main() renamed;
// every header it includes was included above, so its #includes add nothing inside the namespace.
#define main program_main
namespace test_kernels {
#include "test_kernels.cpp"
}
namespace test_step_cuda {
#include "test_step_cuda.cpp"
}
namespace test_fp8_cuda {
#include "test_fp8_cuda.cpp"
}
namespace test_zero_fp8_cuda {
#include "test_zero_fp8_cuda.cpp"
}
namespace test_decode {
#include "test_decode.cpp"
}
#undef main

struct GpuProgram { const char* name; int (*main)(int, char**); };
static const GpuProgram PROGRAMS[] = {
    {"test_kernels", test_kernels::program_main},
    {"test_step_cuda", test_step_cuda::program_main},
    {"test_fp8_cuda", test_fp8_cuda::program_main},
    {"test_zero_fp8_cuda", test_zero_fp8_cuda::program_main},
    {"test_decode", test_decode::program_main},
};

int main(int argc, char** argv) {
    const char* slash = strrchr(argv[0], '/');
    std::string self = slash ? slash + 1 : argv[0];
    for (const GpuProgram& p : PROGRAMS) {
        if (self != std::string(p.name) + "_gpu") continue;
        // that program's test cases only: a filter on the source file of each case (its path ends in /NAME.cpp)
        std::string filter = std::string("--source-file=*/") + p.name + ".cpp";
        std::vector<char*> args(argv, argv + argc);
        args.push_back(&filter[0]);
        args.push_back(nullptr);
        return p.main(argc + 1, args.data());
    }
    fprintf(stderr, "%s: run as one of the device test programs (the Makefile's links to this binary):", argv[0]);
    for (const GpuProgram& p : PROGRAMS) fprintf(stderr, " test/%s_gpu", p.name);
    fprintf(stderr, "\n");
    return 2;
}
