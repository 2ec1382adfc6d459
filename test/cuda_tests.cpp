/*
 * cuda_tests.cpp — the CUDA test programs compiled as one translation unit per build:
 *   g++ -DSIMT_EMULATION (test/cuda_tests): test_kernels, test_step_cuda, test_fp8_cuda, test_zero_fp8_cuda,
 *       test_decode, test_moe_grouped, test_moe_wgrad, test_moe_fp8_grouped, test_memory_plan, test_cublaslt_twin
 *       (test/NAME.cpp each), under the emulator;
 *   nvcc (test/cuda_tests_gpu): the first five on a device (make test-gpu runs them);
 *   the race detector's build (test/cuda_tests_race): test_race (test/test_race.cpp, which includes
 *       test_kernels.cpp), test_race_fp8, test_race_zero_fp8 and test_race_moe_grouped, _moe_wgrad,
 *       _moe_fp8_grouped (test_fp8_cuda.cpp, test_zero_fp8_cuda.cpp, test_moe_*.cpp).
 * Each program compiled alone repeated the same model headers and kernels, host and device: one unit takes a
 * third to two thirds of the CPU of its programs compiled apart. The Makefile links each binary under its
 * programs' names (test/test_kernels, test/test_kernels_gpu, test/test_race_fp8, ...), and main() runs the
 * program its name says: that source's main(), with doctest's --source-file filter restricting the run to
 * that source's test cases.
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <algorithm>
#include <cstring>
#include <fstream>
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
#if defined(SIMT_EMULATION)
#include "../model/matmul.cuh"
#include "../model/moe_experts_step.cuh"
#include "../model/moe_grouped_wgrad.cuh"
#include "../model/moe_grouped_fp8.cuh"
#include "../parallel/zero_gpu.cuh"
#include "../parallel/memory_plan.h"
#endif
#include "cuda_test_helpers.h"

// Each source in its own namespace (their file-scope helpers share names: batch, SEED, OPT), its main() renamed;
// every header it includes was included above, so its #includes add nothing inside the namespace.
#define main program_main
#if defined(SIMT_RACE_DETECT)
namespace test_race {
#include "test_race.cpp"   // (test_kernels.cpp's cases, then its own)
}
#else
namespace test_kernels {
#include "test_kernels.cpp"
}
namespace test_step_cuda {
#include "test_step_cuda.cpp"
}
namespace test_decode {
#include "test_decode.cpp"
}
#endif
#if defined(SIMT_EMULATION)   // (emulated builds only, plain and race)
namespace test_moe_grouped {
#include "test_moe_grouped.cpp"
}
namespace test_moe_wgrad {
#include "test_moe_wgrad.cpp"
}
namespace test_moe_fp8_grouped {
#include "test_moe_fp8_grouped.cpp"
}
#if !defined(SIMT_RACE_DETECT)
namespace test_memory_plan {
#include "test_memory_plan.cpp"
}
namespace test_cublaslt_twin {
#include "test_cublaslt_twin.cpp"
}
#endif
#endif
namespace test_fp8_cuda {
#include "test_fp8_cuda.cpp"
}
namespace test_zero_fp8_cuda {
#include "test_zero_fp8_cuda.cpp"
}
#undef main

// a program: its name, the sources of its test cases (doctest --source-file filters), its main()
struct CudaProgram { const char* name; const char* sources; int (*main)(int, char**); };
static const CudaProgram PROGRAMS[] = {
#if defined(SIMT_RACE_DETECT)
    {"test_race", "*/test_race.cpp,*/test_kernels.cpp", test_race::program_main},
    {"test_race_fp8", "*/test_fp8_cuda.cpp", test_fp8_cuda::program_main},
    {"test_race_zero_fp8", "*/test_zero_fp8_cuda.cpp", test_zero_fp8_cuda::program_main},
    {"test_race_moe_grouped", "*/test_moe_grouped.cpp", test_moe_grouped::program_main},
    {"test_race_moe_wgrad", "*/test_moe_wgrad.cpp", test_moe_wgrad::program_main},
    {"test_race_moe_fp8_grouped", "*/test_moe_fp8_grouped.cpp", test_moe_fp8_grouped::program_main},
#else
    {"test_kernels", "*/test_kernels.cpp", test_kernels::program_main},
    {"test_step_cuda", "*/test_step_cuda.cpp", test_step_cuda::program_main},
    {"test_fp8_cuda", "*/test_fp8_cuda.cpp", test_fp8_cuda::program_main},
    {"test_zero_fp8_cuda", "*/test_zero_fp8_cuda.cpp", test_zero_fp8_cuda::program_main},
    {"test_decode", "*/test_decode.cpp", test_decode::program_main},
#if defined(SIMT_EMULATION)
    {"test_moe_grouped", "*/test_moe_grouped.cpp", test_moe_grouped::program_main},
    {"test_moe_wgrad", "*/test_moe_wgrad.cpp", test_moe_wgrad::program_main},
    {"test_moe_fp8_grouped", "*/test_moe_fp8_grouped.cpp", test_moe_fp8_grouped::program_main},
    {"test_memory_plan", "*/test_memory_plan.cpp", test_memory_plan::program_main},
    {"test_cublaslt_twin", "*/test_cublaslt_twin.cpp", test_cublaslt_twin::program_main},
#endif
#endif
};

int main(int argc, char** argv) {
    const char* slash = strrchr(argv[0], '/');
    std::string self = slash ? slash + 1 : argv[0];
    if (self.size() > 4 && self.compare(self.size() - 4, 4, "_gpu") == 0) self.resize(self.size() - 4);
    for (const CudaProgram& p : PROGRAMS) {
        if (self != p.name) continue;
        // that program's test cases only: a filter on the source file of each case
        std::string filter = std::string("--source-file=") + p.sources;
        std::vector<char*> args(argv, argv + argc);
        args.push_back(&filter[0]);
        args.push_back(nullptr);
        return p.main(argc + 1, args.data());
    }
    fprintf(stderr, "%s: run as one of the test programs (the Makefile's links to this binary):", argv[0]);
#if defined(SIMT_EMULATION)
    const char* suffix = "";
#else
    const char* suffix = "_gpu";
#endif
    for (const CudaProgram& p : PROGRAMS) fprintf(stderr, " test/%s%s", p.name, suffix);
    fprintf(stderr, "\n");
    return 2;
}
