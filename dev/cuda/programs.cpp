/*
 * programs.cpp — the dev/cuda microbenchmarks compiled as one translation unit, for the test suite's builds:
 *   g++ -DSIMT_EMULATION (dev/cuda/programs_emu): every program, validated under the emulator (make test runs
 *       dev/cuda/NAME_emu, a link to this binary);
 *   the race detector's build (dev/cuda/programs_race): attention, attention_wgmma, attention_wgmma_bwd,
 *       wgmma_gemm and layernorm (dev/cuda/NAME_race);
 *   nvcc (dev/cuda/programs_gpu): every program, so that make test checks they all compile for sm_90a with
 *       warnings as errors and no register spills.
 * Compiled apart, each program repeated the emulator's and the model's headers: ~300 CPU-seconds for the
 * emulated builds, where one unit takes ~70. On a GPU, make dev/cuda/NAME still builds each program from
 * its own .cu (make bench-gpu and make test-gpu do): this file only includes them.
 * Each program lives in its own namespace (their kernels and helpers share names: version tables, run_version,
 * NVERSIONS), its main() renamed; main() runs the one its name (argv[0], less _emu/_race/_gpu) says.
 */
#include <cstring>
#include <string>
#include "common.h"
// every model header a program includes, here first: inside a namespace its #include then adds nothing
#include "../../model/adamw.cuh"
#include "../../model/attention.cuh"
#include "../../model/attention_flash_bwd2.cuh"
#include "../../model/classifier.cuh"
#include "../../model/embedding.cuh"
#include "../../model/fp8.cuh"
#include "../../model/fp8_fused.cuh"
#include "../../model/layernorm.cuh"
#include "../../model/matmul.cuh"
#include "../../model/moe.cuh"
#include "../../model/moe_grouped_fp8.cuh"
#include "../../model/moe_grouped_tma.cuh"
#include "../../model/moe_grouped_wgrad.cuh"
#include "../../model/residual.cuh"
#include "../../model/router.cuh"
#include "../../model/tma.cuh"
#include "../../model/wgmma.cuh"

#define main program_main
namespace attention {
#include "attention.cu"
}
#undef NVERSIONS
namespace attention_wgmma {
#include "attention_wgmma.cu"
}
#undef NVERSIONS
namespace attention_wgmma_bwd {
#include "attention_wgmma_bwd.cu"
}
#undef NVERSIONS
namespace wgmma_gemm {
#include "wgmma_gemm.cu"
}
#undef NVERSIONS
namespace layernorm {
#include "layernorm.cu"
}
#undef NVERSIONS
#if !defined(SIMT_RACE_DETECT)
namespace attention_doc {
#include "attention_doc.cu"
}
#undef NVERSIONS
namespace adamw {
#include "adamw.cu"
}
#undef NVERSIONS
namespace classifier {
#include "classifier.cu"
}
#undef NVERSIONS
namespace embedding {
#include "embedding.cu"
}
#undef NVERSIONS
namespace fp8_fused {
#include "fp8_fused.cu"
}
#undef NVERSIONS
namespace fp8_matmul {
#include "fp8_matmul.cu"
}
#undef NVERSIONS
namespace matmul {
#include "matmul.cu"
}
#undef NVERSIONS
namespace moe {
#include "moe.cu"
}
#undef NVERSIONS
namespace moe_fp8_grouped {
#include "moe_fp8_grouped.cu"
}
#undef NVERSIONS
namespace moe_grouped {
#include "moe_grouped.cu"
}
#undef NVERSIONS
namespace moe_wgrad {
#include "moe_wgrad.cu"
}
#undef NVERSIONS
#endif
#undef main

// the programs whose main() takes no arguments, called as the others are
template <int (*MAIN)()> static int without_args(int, char**) { return MAIN(); }

struct DevProgram { const char* name; int (*main)(int, char**); };
static const DevProgram PROGRAMS[] = {
    {"attention", attention::program_main},
    {"attention_wgmma", attention_wgmma::program_main},
    {"attention_wgmma_bwd", attention_wgmma_bwd::program_main},
    {"wgmma_gemm", wgmma_gemm::program_main},
    {"layernorm", without_args<layernorm::program_main>},
#if !defined(SIMT_RACE_DETECT)
    {"attention_doc", attention_doc::program_main},
    {"adamw", adamw::program_main},
    {"classifier", without_args<classifier::program_main>},
    {"embedding", without_args<embedding::program_main>},
    {"fp8_fused", without_args<fp8_fused::program_main>},
    {"fp8_matmul", without_args<fp8_matmul::program_main>},
    {"matmul", matmul::program_main},
    {"moe", without_args<moe::program_main>},
    {"moe_fp8_grouped", moe_fp8_grouped::program_main},
    {"moe_grouped", moe_grouped::program_main},
    {"moe_wgrad", moe_wgrad::program_main},
#endif
};

#if defined(SIMT_RACE_DETECT)
static const char* const SUFFIX = "_race";
#elif defined(SIMT_EMULATION)
static const char* const SUFFIX = "_emu";
#else
static const char* const SUFFIX = "_gpu";
#endif

int main(int argc, char** argv) {
    const char* slash = strrchr(argv[0], '/');
    std::string self = slash ? slash + 1 : argv[0];
    size_t n = strlen(SUFFIX);
    if (self.size() > n && self.compare(self.size() - n, n, SUFFIX) == 0) self.resize(self.size() - n);
    for (const DevProgram& p : PROGRAMS)
        if (self == p.name) return p.main(argc, argv);
    fprintf(stderr, "%s: run as one of the dev/cuda programs (the Makefile's links to this binary):", argv[0]);
    for (const DevProgram& p : PROGRAMS) fprintf(stderr, " dev/cuda/%s%s", p.name, SUFFIX);
    fprintf(stderr, "\n");
    return 2;
}
