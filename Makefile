# Makefile — builds ./train_dbrx (nvcc for sm_90a when nvcc is present, else g++: the same
# sources, CPU backend only), the tests, and the set-up targets of the README:
#   make deps      install what is missing to build, prepare the data and train (Debian packages; needs root)
#   make deps-test install that and what the test suite needs (doctest, PyTorch, matplotlib, clang)
#   make           build ./train_dbrx
#   make data      prepare the default dataset (State of the Union addresses, byte-level tokens)
#   make train     train the default model (dbrx-tiny) with mpirun
#   make test      build and run the whole test suite (the CUDA kernels under the SIMT emulator)
#   make predict   the predicted H100/H200 step of a configuration (MODEL=, BATCH=, SEQ=, NP=, DEVICE=, FLAGS=) from the emulator
#   make predict-record / bench-predict   re-record the recorded predictions / flag a step > 3% slower than recorded
#   make test-gpu  every check that needs a real GPU, then a go/no-go report (dev/test_gpu.sh; SANITIZER=1:
#                  the device test programs under compute-sanitizer memcheck)

# build in parallel on every core unless the command line says -j (the test build is ~30 binaries: on CI's 2
# cores this halves its time)
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc)
endif

CXX      ?= g++
PYTHON   ?= /usr/bin/python3
GPU_ARCH ?= sm_90a
NP       ?= 1
# make predict's configuration (dev/predict/make_predict.sh)
MODEL    ?= dbrx-1b
BATCH    ?= 8
SEQ      ?= 2048
DEVICE   ?= h100-sxm

NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
MPICXX := $(shell command -v mpicxx 2>/dev/null)
MPI_CFLAGS := -DOMPI_SKIP_MPICXX=1 $(patsubst -I%,-isystem %,$(if $(MPICXX),$(shell $(MPICXX) --showme:compile)))
MPI_LIBS := $(if $(MPICXX),$(shell $(MPICXX) --showme:link))

# -ffp-contract=off: no a*b+c fused into an FMA behind the source's back. Whether GCC fuses depends on -march=native's
# tuning (its znver tunings avoid FMA chains, haswell's do not), so the CPU's results did too; with it off (and the CPU
# reductions in fixed lanes, model/common.h's dot_lanes8) every x86 machine computes the same bits (test_unchanged.sh)
FP_EXACT := -ffp-contract=off
CXXFLAGS := -std=c++17 -O3 -march=native $(FP_EXACT) -fopenmp -Wall -Wextra -Werror $(MPI_CFLAGS)
LDLIBS   := -lopenblas $(MPI_LIBS) -lm
# the kernels of the training step may not spill registers: ptxas reports a spill as a warning, made an error
# (test/spill_probe.cu is the negative control, compiled by test/run_all.sh with these flags)
NVCC_NOSPILL := -Xptxas -warn-spills,-Werror
NVCCFLAGS := -std=c++17 -O3 -arch=$(GPU_ARCH) -Werror all-warnings \
             -Xcompiler -fopenmp,-march=native,$(FP_EXACT),-Wall,-Wextra,-Werror $(MPI_CFLAGS)
HEADERS  := $(wildcard model/*.h model/*.cuh data/*.h parallel/*.h parallel/*.cuh checkpoint/*.h) train_cuda.cuh $(wildcard train_*.h)
# (not -lcublasLt: the library opens on first use, model/cublaslt_dlopen.h: linked, it cost every process ~0.45 s of CPU)
CUDA_LIBS := -lnccl -lgomp

.PHONY: all deps deps-test check-deps check-test-deps data train test test-build test-build-all emu-build gpu-build test-gpu bench-gpu predict predict-record bench-predict clean
all: train_dbrx

# A missing dependency stops the build with one line naming the Debian package. (DEPS_CHECKED=1: test-build's sub-make,
# after test-build has run them)
ifeq ($(DEPS_CHECKED),1)
check-deps check-test-deps: ;
else
check-deps:
	@command -v $(CXX) >/dev/null || { echo "error: $(CXX) not found: apt-get install g++"; exit 1; }
	@echo '#include <cblas.h>' | $(CXX) -E -x c++ - >/dev/null 2>&1 || { echo "error: cblas.h not found: apt-get install libopenblas-dev"; exit 1; }
	@test -n "$(MPICXX)" || { echo "error: mpicxx not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	@echo '#include <omp.h>' | $(CXX) -fopenmp -E -x c++ - >/dev/null 2>&1 || { echo "error: OpenMP (omp.h) not found: apt-get install g++ (libgomp)"; exit 1; }

check-test-deps: check-deps
	@test -f /usr/include/doctest/doctest.h || { echo "error: doctest.h not found: apt-get install doctest-dev"; exit 1; }
	@$(PYTHON) -c 'import torch, numpy' 2>/dev/null || { echo "error: $(PYTHON) cannot import torch: apt-get install python3-torch python3-numpy"; exit 1; }
	@$(PYTHON) -c 'import matplotlib' 2>/dev/null || { echo "error: $(PYTHON) cannot import matplotlib: apt-get install python3-matplotlib"; exit 1; }
endif

ifneq ($(NVCC),)
train_dbrx: train_dbrx.cu $(HEADERS) | check-deps
	$(NVCC) $(NVCCFLAGS) $(NVCC_NOSPILL) -o $@ train_dbrx.cu $(LDLIBS) $(CUDA_LIBS)
else
train_dbrx: train_dbrx.cu $(HEADERS) | check-deps
	@echo "nvcc not found: building the CPU-only binary with $(CXX)"
	$(CXX) $(CXXFLAGS) -x c++ -o $@ train_dbrx.cu $(LDLIBS)
endif

# the collective-bandwidth benchmark over the communicator (parallel/README.md); MPI on the CPU,
# and NCCL on the GPU when built by nvcc
ifneq ($(NVCC),)
dev/comm_bench: dev/comm_bench.cu $(HEADERS) | check-deps
	$(NVCC) $(NVCCFLAGS) -o $@ dev/comm_bench.cu $(LDLIBS) -lnccl -lgomp
else
dev/comm_bench: dev/comm_bench.cu $(HEADERS) | check-deps
	$(CXX) $(CXXFLAGS) -x c++ -o $@ dev/comm_bench.cu $(LDLIBS)
endif

# the CPU-only build of the same source with g++ (what a machine without nvcc builds)
train_dbrx_cpu: train_dbrx.cu $(HEADERS) | check-deps
	$(CXX) $(CXXFLAGS) -x c++ -o $@ train_dbrx.cu $(LDLIBS)

deps:
	@bash dev/install_deps.sh
deps-test:
	@bash dev/install_deps.sh --test

data:
	@bash dev/data/prepare_sotu.sh

train: train_dbrx
	@test -f data/sotu/sotu_val_000000.bin || { echo "error: no dataset in data/sotu: run 'make data' first"; exit 2; }
	bash dev/mpirun.sh -np $(NP) ./train_dbrx --model dbrx-tiny --log train_log.jsonl

# ---------------------------------------------------------------------------------------------
# data tools: the tokenizer (dev/data/tokenize) and the loader benchmark

dev/data/tokenize: dev/data/tokenize.cpp data/tokenizer.h data/unicode_classes.h data/shard.h model/common.h model/platform.h
	$(CXX) -std=c++17 -O3 -march=native -fopenmp -Wall -Wextra -Werror -o $@ dev/data/tokenize.cpp
dev/data/bench_loader: dev/data/bench_loader.cpp data/dataloader.h data/shard.h model/common.h model/platform.h
	$(CXX) -std=c++17 -O3 -march=native -Wall -Wextra -Werror -o $@ dev/data/bench_loader.cpp

# ---------------------------------------------------------------------------------------------
# tests (doctest); built with g++ whatever builds the binary, for speed

# doctest's implementation is compiled once (test/libdoctest.a, below): every doctest program's own copy is
# skipped with doctest's guard of it, and the program links DOCTEST_LIB (~8 CPU-seconds of g++ saved each)
DOCTEST_SKIP := -DDOCTEST_LIBRARY_IMPLEMENTATION
DOCTEST_LIB  := test/libdoctest.a
DOCTEST_LINK := -Ltest -ldoctest
TEST_FLAGS := -std=c++17 -O2 -march=native $(FP_EXACT) -fopenmp -Wall -Wextra -Werror -I/usr/include/doctest $(DOCTEST_SKIP)
# no -march=native: the archive also links into the nvcc builds (test/*_gpu), which the GPU machine runs
$(DOCTEST_LIB): test/doctest_impl.cpp test/doctest_main.cpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror -I/usr/include/doctest -c -o test/doctest_impl.o test/doctest_impl.cpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror -I/usr/include/doctest -c -o test/doctest_main.o test/doctest_main.cpp
	rm -f $@ && $(AR) rcs $@ test/doctest_impl.o test/doctest_main.o && rm -f test/doctest_impl.o test/doctest_main.o
test/test_ops: test/test_ops.cpp $(HEADERS) $(DOCTEST_LIB) | check-test-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/test_ops.cpp $(DOCTEST_LINK) -lopenblas -lm
# ring attention (--context-parallel) against the full-sequence reference, the ring simulated in one process
test/test_ring_attention: test/test_ring_attention.cpp $(HEADERS) $(DOCTEST_LIB) | check-test-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/test_ring_attention.cpp $(DOCTEST_LINK) -lopenblas -lm
# the gradient check compiles the CPU reference in double precision
test/test_gradcheck: test/test_gradcheck.cpp $(HEADERS) $(DOCTEST_LIB) | check-test-deps
	$(CXX) $(TEST_FLAGS) -DCPU_REAL=double -o $@ test/test_gradcheck.cpp $(DOCTEST_LINK) -lopenblas -lm
test/dump_reference: test/dump_reference.cpp $(HEADERS) | check-test-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/dump_reference.cpp -lopenblas -lm

# the FP8 test checks our conversions against cuda_fp8.h's host code: built only where the CUDA headers are
CUDA_INC := $(firstword $(wildcard /usr/local/cuda/include/cuda_fp8.h))
test/test_fp8: test/test_fp8.cpp $(HEADERS) $(DOCTEST_LIB) | check-test-deps
	$(CXX) $(TEST_FLAGS) -isystem $(dir $(CUDA_INC)) -o $@ test/test_fp8.cpp $(DOCTEST_LINK) -lopenblas -lm
# the nvcc build's cuBLASLt opened on first use (model/cublaslt_dlopen.h), on the CPU: g++ against CUDA's headers, not
# linked with the library (as train_dbrx is not)
test/test_cublaslt_dlopen: test/test_cublaslt_dlopen.cpp model/cublaslt_dlopen.h $(DOCTEST_LIB) | check-test-deps
	$(CXX) $(TEST_FLAGS) -isystem $(dir $(CUDA_INC)) -o $@ test/test_cublaslt_dlopen.cpp $(DOCTEST_LINK)
test/test_data: test/test_data.cpp $(HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/test_data.cpp $(DOCTEST_LINK)
# libFuzzer target of the shard, state and --data parsers (clang, Debian package clang)
test/fuzz_data: test/fuzz_data.cpp data/shard.h data/dataloader.h model/common.h model/platform.h data/tokenizer.h data/unicode_classes.h
	@command -v clang++ >/dev/null || { echo "error: clang++ not found: apt-get install clang libclang-rt-14-dev"; exit 1; }
	clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -o $@ test/fuzz_data.cpp


# ---------------------------------------------------------------------------------------------
# CUDA backend (see model/CUDA.md). The emulated builds compile the very same kernel source with
# g++ -DSIMT_EMULATION against test/simt/simt.h and run it on the CPU; they need only the CUDA
# headers (cuda_bf16.h, ...), not a GPU, and link no CUDA library.
CUDA_HOME ?= /usr/local/cuda
HAVE_CUDA_HEADERS := $(wildcard $(CUDA_HOME)/include/cuda_bf16.h)
SIMT_FLAGS := -std=c++17 -O2 -march=native $(FP_EXACT) -fopenmp -fno-strict-aliasing -Wall -Wextra -Werror -DSIMT_EMULATION \
              -isystem $(CUDA_HOME)/include -I/usr/include/doctest $(DOCTEST_SKIP)
SIMT_HEADERS := $(HEADERS) $(wildcard test/simt/*.h)
EMU_TESTS := test/test_simt test/test_kernels test/test_step_cuda test/test_fp8_cuda test/test_zero_fp8_cuda test/test_nccl_twin \
             test/test_decode test/test_race test/test_race_fp8 test/test_race_zero_fp8 test/test_memory_plan test/test_cublaslt_twin \
             test/test_wgmma test/test_race_wgmma test/test_tma test/test_race_tma test/test_moe_grouped test/test_race_moe_grouped \
             test/test_moe_wgrad test/test_race_moe_wgrad \
             test/test_moe_fp8_grouped test/test_race_moe_fp8_grouped
DEV_CUDA_SRC := $(wildcard dev/cuda/*.cu)
DEV_CUDA := $(DEV_CUDA_SRC:.cu=)
DEV_CUDA_EMU := $(DEV_CUDA_SRC:.cu=_emu)
test/test_simt: test/test_simt.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(SIMT_FLAGS) -o $@ test/test_simt.cpp $(DOCTEST_LINK)
# the CUDA test programs test_kernels, test_step_cuda (the step), test_fp8_cuda, test_zero_fp8_cuda (ZeRO-3's FP8
# all-gather; MPI headers for parallel/comm.h) and test_decode (generation: the KV-cache step on both backends, the
# sampler, the tokenizer's decoding), compiled as one translation unit (test/cuda_tests.cpp: the model's headers and
# kernels once, a third of the CPU time of five builds), the binary linked under each name, which runs that program
CUDA_TEST_SRC := test/cuda_tests.cpp test/test_kernels.cpp test/test_step_cuda.cpp test/test_fp8_cuda.cpp test/test_zero_fp8_cuda.cpp \
                 test/test_decode.cpp test/cuda_test_helpers.h
CUDA_TEST_NAMES := test_kernels test_step_cuda test_fp8_cuda test_zero_fp8_cuda test_decode
# emulated only, in the same unit: the grouped expert GEMMs on wgmma (model/moe_grouped.cuh), the experts' grouped
# weight-gradient GEMM (moe_grouped_wgrad.cuh), the FP8 block-scaled grouped up-projection (moe_grouped_fp8.cuh),
# each against the CPU and today's path, the three also under the race detector (below); the --dry-run planner
# (parallel/memory_plan.h) against the model's walk, the store and the emulator's peak; cuBLASLt's API twin
# (test/simt/cublaslt_api_twin.h): its rules, and model/matmul_cublaslt.cuh's bucket fallback
MOE_TEST_NAMES := test_moe_grouped test_moe_wgrad test_moe_fp8_grouped
EMU_TEST_SRC := $(MOE_TEST_NAMES:%=test/%.cpp) test/test_memory_plan.cpp test/test_cublaslt_twin.cpp
test/cuda_tests: $(CUDA_TEST_SRC) $(EMU_TEST_SRC) $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(SIMT_FLAGS) $(MPI_CFLAGS) -o $@ test/cuda_tests.cpp $(DOCTEST_LINK) -lopenblas $(MPI_LIBS) -lm
$(CUDA_TEST_NAMES:%=test/%) $(MOE_TEST_NAMES:%=test/%) test/test_memory_plan test/test_cublaslt_twin: test/cuda_tests
	ln -f $< $@
# the race detector (test/simt/race.h): ThreadSanitizer's instrumentation calls (-fsanitize=thread at compile
# time) go to the emulator's own __tsan_* functions; linked without -fsanitize=thread, so without libtsan.
# -g1: a race names its source lines and inlined callers (addr2line; line tables are all it needs, a quarter
# faster to compile than -g)
RACE_FLAGS := $(SIMT_FLAGS) -g1 -DSIMT_RACE_DETECT -fsanitize=thread --param=tsan-instrument-func-entry-exit=0
# test_race (test/test_race.cpp: test_kernels.cpp's cases and the detector's own), test_race_fp8 (the FP8 kernels:
# quantize, padding, factors), test_race_zero_fp8 (ZeRO-3's FP8 all-gather kernels) and test_race_moe_grouped,
# test_race_moe_wgrad, test_race_moe_fp8_grouped: one translation unit, as above
RACE_TEST_NAMES := test_race test_race_fp8 test_race_zero_fp8 $(MOE_TEST_NAMES:test_%=test_race_%)
test/cuda_tests_race: $(CUDA_TEST_SRC) $(EMU_TEST_SRC) test/test_race.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(RACE_FLAGS) $(MPI_CFLAGS) -c -o $@.o test/cuda_tests.cpp
	$(CXX) -fopenmp -o $@ $@.o $(DOCTEST_LINK) -lopenblas $(MPI_LIBS) -lm
	rm -f $@.o
$(RACE_TEST_NAMES:%=test/%): test/cuda_tests_race
	ln -f $< $@
# Hopper's warpgroup MMA (model/wgmma.cuh, test/simt/wgmma.h) against a double-precision product, and under the race detector
test/test_wgmma: test/test_wgmma.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(SIMT_FLAGS) -o $@ test/test_wgmma.cpp $(DOCTEST_LINK)
test/test_race_wgmma: test/test_wgmma.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(RACE_FLAGS) -c -o $@.o test/test_wgmma.cpp
	$(CXX) -fopenmp -o $@ $@.o $(DOCTEST_LINK)
	rm -f $@.o
# Hopper's mbarriers and TMA (model/tma.cuh, test/simt/tma.h) against the host's data and a double product, and under the race detector
test/test_tma: test/test_tma.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(SIMT_FLAGS) -o $@ test/test_tma.cpp $(DOCTEST_LINK)
test/test_race_tma: test/test_tma.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(RACE_FLAGS) -c -o $@.o test/test_tma.cpp
	$(CXX) -fopenmp -o $@ $@.o $(DOCTEST_LINK)
	rm -f $@.o
# dev/cuda's programs compiled as one unit (dev/cuda/programs.cpp: the emulator's and the model's headers once,
# ~70 CPU-seconds instead of ~300 apart), each program's binary a link to it, which runs that program; the race
# detector's build: the kernels of attention (backward v4), attention_wgmma (two warpgroups, cp.async double
# buffering), attention_wgmma_bwd (a semaphore per query tile), wgmma_gemm (cp.async stages, wgmma, barriers) and
# layernorm (the backward v4's partials through shared memory)
DEV_CUDA_RACE := dev/cuda/attention_race dev/cuda/attention_wgmma_race dev/cuda/attention_wgmma_bwd_race dev/cuda/wgmma_gemm_race \
                 dev/cuda/layernorm_race
dev/cuda/programs_emu: dev/cuda/programs.cpp $(DEV_CUDA_SRC) dev/cuda/common.h $(SIMT_HEADERS) | check-deps
	$(CXX) $(SIMT_FLAGS) -x c++ -o $@ dev/cuda/programs.cpp -lopenblas -lm
$(DEV_CUDA_EMU): dev/cuda/programs_emu
	ln -f $< $@
dev/cuda/programs_race: dev/cuda/programs.cpp $(DEV_CUDA_SRC) dev/cuda/common.h $(SIMT_HEADERS) | check-deps
	$(CXX) $(RACE_FLAGS) -x c++ -c -o $@.o dev/cuda/programs.cpp
	$(CXX) -fopenmp -o $@ $@.o -lopenblas -lm
	rm -f $@.o
$(DEV_CUDA_RACE): dev/cuda/programs_race
	ln -f $< $@
# the NCCL twin (test/simt/nccl_twin.h) and parallel/comm.h's NCCL path over it, under mpirun
test/test_nccl_twin: test/test_nccl_twin.cpp $(SIMT_HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(SIMT_FLAGS) $(MPI_CFLAGS) -o $@ test/test_nccl_twin.cpp $(DOCTEST_LINK) $(MPI_LIBS) -lm
# the training binary on the emulated CUDA backend (--device cuda runs the CUDA path on the CPU)
train_dbrx_emu: train_dbrx.cu $(SIMT_HEADERS) | check-deps
	$(CXX) $(SIMT_FLAGS) $(MPI_CFLAGS) -x c++ -o $@ train_dbrx.cu $(LDLIBS)
# the same, instrumented as the race detector is (test/simt/race.h) but counting instead of checking: with
# SIMT_WORKLOG=FILE each kernel's line carries the global-memory bytes it read and wrote and its tensor-core
# FLOPs (test/simt/bytecount.h; test/test_kernel_bytes.sh checks dev/predict/kernel_cost.py's formulas with it).
# -O1: 79 CPU-seconds to compile instead of 120, and test_kernel_bytes.sh, its only user, 39 instead of 31
COUNT_FLAGS := $(filter-out -O2,$(SIMT_FLAGS)) -O1 -DSIMT_RACE_DETECT -DSIMT_RACE_DETECT_DEFAULT=0 -fsanitize=thread --param=tsan-instrument-func-entry-exit=0
# make COVERAGE=1 (dev/coverage/run.sh): the emulated builds and the CPU unit tests (test_gpu_select checks
# model/gpu_peak.h) instrumented for gcov; the race-detector and byte-counting builds not (their instrumentation is the
# emulator's own). -no-pie: with the counters, GCC 12's code for the emulator's thread-local shared memory
# (dynamic_smem) took a TLS relocation the linker could not relax
ifeq ($(COVERAGE),1)
SIMT_FLAGS += --coverage -fno-pie -no-pie
TEST_FLAGS += --coverage -fno-pie -no-pie
endif
train_dbrx_emu_count: train_dbrx.cu $(SIMT_HEADERS) | check-deps
	$(CXX) $(COUNT_FLAGS) $(MPI_CFLAGS) -x c++ -c -o $@.o train_dbrx.cu
	$(CXX) -fopenmp -o $@ $@.o $(LDLIBS)
	rm -f $@.o
emu-build: $(if $(HAVE_CUDA_HEADERS),$(EMU_TESTS) train_dbrx_emu train_dbrx_emu_count $(DEV_CUDA_EMU) $(DEV_CUDA_RACE))

# the real CUDA builds of the tests (make test compiles them; make test-gpu runs them on a device,
# under compute-sanitizer with SANITIZER=1)
# the test programs and dev/cuda benchmarks: machine code for GPU_ARCH only (-arch=sm_90a also embeds compute_90 PTX
# for later GPUs, a second device compile of every file: a third of each build's time; train_dbrx keeps it)
NVCC_TEST_FLAGS := -std=c++17 -O2 -gencode arch=$(subst sm_,compute_,$(GPU_ARCH)),code=$(GPU_ARCH) -Werror all-warnings -Xcompiler -fopenmp,-Wall,-Wextra,-Werror \
                   -isystem /usr/include/doctest $(DOCTEST_SKIP)
GPU_TESTS := $(CUDA_TEST_NAMES:%=test/%_gpu)
test/cuda_tests_gpu: $(CUDA_TEST_SRC) $(HEADERS) $(DOCTEST_LIB)
	$(NVCC) $(NVCC_TEST_FLAGS) $(MPI_CFLAGS) -x cu -o $@ test/cuda_tests.cpp $(DOCTEST_LINK) -lopenblas $(MPI_LIBS) $(CUDA_LIBS)
$(GPU_TESTS): test/cuda_tests_gpu
	ln -f $< $@

# dev/cuda microbenchmarks: nvcc builds time them on a GPU; the _emu builds validate them under the
# emulator at a small size (make test runs those)
$(DEV_CUDA): dev/cuda/%: dev/cuda/%.cu dev/cuda/common.h $(HEADERS)
	$(NVCC) $(filter-out -O2,$(NVCC_TEST_FLAGS)) -O3 -o $@ $< -lopenblas $(CUDA_LIBS)
# the wgmma attention (a candidate for the product): no register spills, as train_dbrx
dev/cuda/attention_wgmma: NVCC_TEST_FLAGS += $(NVCC_NOSPILL)
dev/cuda/attention: NVCC_TEST_FLAGS += $(NVCC_NOSPILL)
dev/cuda/attention_wgmma_bwd: NVCC_TEST_FLAGS += $(NVCC_NOSPILL)
# the grouped expert GEMMs (model/moe_grouped.cuh, a candidate for the product): no register spills either
dev/cuda/moe_grouped: NVCC_TEST_FLAGS += $(NVCC_NOSPILL)
dev/cuda/moe_wgrad: NVCC_TEST_FLAGS += $(NVCC_NOSPILL)
dev/cuda/moe_fp8_grouped: NVCC_TEST_FLAGS += $(NVCC_NOSPILL)
# make test compiles them all with nvcc as one unit (dev/cuda/programs.cpp), no register spills in any
dev/cuda/programs_gpu: dev/cuda/programs.cpp $(DEV_CUDA_SRC) dev/cuda/common.h $(HEADERS)
	$(NVCC) $(filter-out -O2,$(NVCC_TEST_FLAGS)) -O3 $(NVCC_NOSPILL) -x cu -o $@ dev/cuda/programs.cpp -lopenblas $(CUDA_LIBS)
gpu-build: $(if $(NVCC),$(GPU_TESTS) dev/cuda/programs_gpu)

# the device test programs, the one-process shell suites on ./train_dbrx, a smoke run and the benchmarks'
# sanity pass, each under a time limit, past failures; the report goes to dev/bench/test_gpu_report.md
# (no GPU: one line and exit 1 before anything is built)
test-gpu:
	@bash dev/test_gpu.sh --gpu-check
	@test -n "$(NVCC)" || { echo "error: make test-gpu needs nvcc (the CUDA toolkit)"; exit 1; }
	@$(MAKE) --no-print-directory check-test-deps data train_dbrx $(GPU_TESTS) $(DEV_CUDA) dev/comm_bench
	@PYTHON=$(PYTHON) SANITIZER=$(SANITIZER) bash dev/test_gpu.sh

# the GPU benchmarks against their targets (dev/bench/bench_gpu.sh): attention, expert GEMMs, memory-bound
# kernels, dbrx-1b end to end; appended to dev/bench/results_gpu.md
bench-gpu: train_dbrx train_dbrx_emu $(DEV_CUDA) dev/comm_bench
	@test -n "$(NVCC)" || { echo "error: make bench-gpu needs nvcc and a GPU"; exit 1; }
	bash dev/bench/bench_gpu.sh

# the predicted GPU step of one configuration from the emulator's work log (dev/predict/README.md): emulated runs
# (SIMT_SHAPES_ONLY) with SIMT_WORKLOG, then dev/predict/predict.py; MODEL, BATCH, SEQ, NP, DEVICE, FLAGS, TRACE, JSON, RUN_LAYERS
predict: train_dbrx_emu
	@MODEL=$(MODEL) BATCH=$(BATCH) SEQ=$(SEQ) NP=$(NP) DEVICE=$(DEVICE) PYTHON=$(PYTHON) bash dev/predict/make_predict.sh

# the recorded predictions (dev/predict/recorded.py; dev/bench/predicted.json and results_predicted.md): predict-record
# re-records them all (minutes: 256 emulated ranks); bench-predict predicts them again and flags a step > 3% slower
predict-record: train_dbrx_emu
	$(PYTHON) dev/predict/recorded.py record
bench-predict: train_dbrx_emu
	$(PYTHON) dev/predict/recorded.py check

# checkpoint building blocks (CRC-32C, JSON, conversions, layouts); MPI headers for parallel/zero.h
test/test_checkpoint: test/test_checkpoint.cpp $(HEADERS) $(DOCTEST_LIB) | check-deps
	$(CXX) $(TEST_FLAGS) $(MPI_CFLAGS) -o $@ test/test_checkpoint.cpp $(DOCTEST_LINK) -lopenblas $(MPI_LIBS) -lm

# the GPU choice per launcher and the GPU peak table (parallel/gpu_select.h, model/gpu_peak.h): pure logic, on the CPU
test/test_gpu_select: test/test_gpu_select.cpp parallel/gpu_select.h model/gpu_peak.h $(DOCTEST_LIB) | check-test-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/test_gpu_select.cpp $(DOCTEST_LINK)

# the dependency checks first, then everything in a sub-make that skips them: with -j, the checks still running when
# make first reached train_dbrx (the longest compile, first in the list) made it pass over it until the end of the
# build, one core idle for its last minute
test-build: check-test-deps
	@$(MAKE) --no-print-directory DEPS_CHECKED=1 test-build-all
# (the longest compiles first: with -j the build then ends on short ones, both cores busy to the end)
LONGEST_FIRST := $(if $(HAVE_CUDA_HEADERS),train_dbrx_emu_count train_dbrx_emu test/cuda_tests_race test/cuda_tests) \
                 $(if $(NVCC),test/cuda_tests_gpu dev/cuda/programs_gpu) $(if $(HAVE_CUDA_HEADERS),dev/cuda/programs_emu dev/cuda/programs_race)
test-build-all: train_dbrx $(LONGEST_FIRST) train_dbrx_cpu test/test_ops test/test_ring_attention test/test_gradcheck test/dump_reference test/test_data test/fuzz_data \
            dev/data/tokenize $(if $(CUDA_INC),test/test_fp8 test/test_cublaslt_dlopen) dev/comm_bench test/test_checkpoint test/test_gpu_select emu-build gpu-build

test: test-build
	@PYTHON=$(PYTHON) NVCC=$(NVCC) NVCC_NOSPILL_FLAGS="-arch=$(GPU_ARCH) -Werror all-warnings $(NVCC_NOSPILL)" \
	 HAVE_CUDA_HEADERS=$(HAVE_CUDA_HEADERS) bash test/run_all.sh

clean:
	rm -f train_dbrx train_dbrx_cpu train_dbrx_emu train_dbrx_emu_count test/test_ops test/test_ring_attention test/test_gradcheck test/dump_reference test/test_data \
	      test/fuzz_data dev/data/tokenize dev/data/bench_loader test/test_fp8 test/test_cublaslt_dlopen $(EMU_TESTS) $(GPU_TESTS) test/cuda_tests test/cuda_tests_gpu test/cuda_tests_race $(DEV_CUDA) $(DEV_CUDA_EMU) dev/cuda/programs_emu dev/cuda/programs_race dev/cuda/programs_gpu \
	      dev/comm_bench test/test_checkpoint test/test_gpu_select $(DEV_CUDA_RACE) \
	      $(DOCTEST_LIB)
