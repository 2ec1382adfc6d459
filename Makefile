# Makefile — builds ./train_dbrx (nvcc for sm_90a when nvcc is present, else g++: the same
# sources, CPU backend only), the tests, and the set-up targets of the README:
#   make deps     install what is missing (Debian packages; needs root)
#   make          build ./train_dbrx
#   make data     prepare the default dataset (State of the Union addresses, byte-level tokens)
#   make train    train the default model (dbrx-tiny) with mpirun
#   make test     build and run the whole test suite

CXX      ?= g++
PYTHON   ?= /usr/bin/python3
GPU_ARCH ?= sm_90a
NP       ?= 1

NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
MPICXX := $(shell command -v mpicxx 2>/dev/null)
MPI_CFLAGS := -DOMPI_SKIP_MPICXX=1 $(patsubst -I%,-isystem %,$(if $(MPICXX),$(shell $(MPICXX) --showme:compile)))
MPI_LIBS := $(if $(MPICXX),$(shell $(MPICXX) --showme:link))

CXXFLAGS := -std=c++17 -O3 -march=native -fopenmp -Wall -Wextra -Werror $(MPI_CFLAGS)
LDLIBS   := -lopenblas $(MPI_LIBS) -lm
NVCCFLAGS := -std=c++17 -O3 -arch=$(GPU_ARCH) -Werror all-warnings \
             -Xcompiler -fopenmp,-march=native,-Wall,-Wextra,-Werror $(MPI_CFLAGS)
HEADERS  := $(wildcard model/*.h model/*.cuh data/*.h parallel/*.h parallel/*.cuh checkpoint/*.h)

.PHONY: all deps check-deps data train test test-build clean
all: train_dbrx

# A missing dependency stops the build with one line naming the Debian package.
check-deps:
	@command -v $(CXX) >/dev/null || { echo "error: $(CXX) not found: apt-get install g++"; exit 1; }
	@echo '#include <cblas.h>' | $(CXX) -E -x c++ - >/dev/null 2>&1 || { echo "error: cblas.h not found: apt-get install libopenblas-dev"; exit 1; }
	@test -n "$(MPICXX)" || { echo "error: mpicxx not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	@echo '#include <omp.h>' | $(CXX) -fopenmp -E -x c++ - >/dev/null 2>&1 || { echo "error: OpenMP (omp.h) not found: apt-get install g++ (libgomp)"; exit 1; }

ifneq ($(NVCC),)
train_dbrx: train_dbrx.cu $(HEADERS) | check-deps
	$(NVCC) $(NVCCFLAGS) -o $@ train_dbrx.cu $(LDLIBS) -lnccl -lgomp
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

data:
	@bash dev/data/prepare_sotu.sh

train: train_dbrx
	@test -f data/sotu/sotu_val_000000.bin || { echo "error: no dataset in data/sotu: run 'make data' first"; exit 2; }
	bash dev/mpirun.sh -np $(NP) ./train_dbrx --model dbrx-tiny --log train_log.jsonl

# ---------------------------------------------------------------------------------------------
# tests (doctest); built with g++ whatever builds the binary, for speed

TEST_FLAGS := -std=c++17 -O2 -march=native -fopenmp -Wall -Wextra -Werror -I/usr/include/doctest
test/test_ops: test/test_ops.cpp $(HEADERS) | check-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/test_ops.cpp -lopenblas -lm
# the gradient check compiles the CPU reference in double precision
test/test_gradcheck: test/test_gradcheck.cpp $(HEADERS) | check-deps
	$(CXX) $(TEST_FLAGS) -DCPU_REAL=double -o $@ test/test_gradcheck.cpp -lopenblas -lm
test/dump_reference: test/dump_reference.cpp $(HEADERS) | check-deps
	$(CXX) $(TEST_FLAGS) -o $@ test/dump_reference.cpp -lopenblas -lm

# checkpoint building blocks (CRC-32C, JSON, conversions, layouts); MPI headers for parallel/zero.h
test/test_checkpoint: test/test_checkpoint.cpp $(HEADERS) | check-deps
	$(CXX) $(TEST_FLAGS) $(MPI_CFLAGS) -o $@ test/test_checkpoint.cpp -lopenblas $(MPI_LIBS) -lm

test-build: train_dbrx train_dbrx_cpu test/test_ops test/test_gradcheck test/dump_reference dev/comm_bench test/test_checkpoint

test: test-build
	@PYTHON=$(PYTHON) NVCC=$(NVCC) bash test/run_all.sh

clean:
	rm -f train_dbrx train_dbrx_cpu test/test_ops test/test_gradcheck test/dump_reference dev/comm_bench test/test_checkpoint
