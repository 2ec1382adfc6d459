#!/bin/bash
# lease_pack.sh — packs the folder .lease/ that a lent GPU's call carries (carry [".lease"]) beside the working tree:
# the prebuilt nvcc binaries, the Debian libraries they need that the device's image lacks, and the data, so that
# the device (no package registry, no make deps there) runs them at once. lease_setup.sh unpacks it there.
#   bash dev/bench/lease_pack.sh RUN.sh      (RUN.sh: the call's script, e.g. dev/bench/lease_next.sh)
# then: run(command="BUDGET=490 bash .lease/RUN.sh", carry=[".lease"], timeout_s=560).
# What goes in (under the 64 MiB a call carries: ~30 MiB):
#   bins.tgz  train_dbrx, test/cuda_tests_gpu and its test/*_gpu links, dev/cuda/programs_gpu and a link per program
#             (dev/cuda/NAME: programs.cpp's main() runs the program its name says), built here by make;
#   libs.tgz  lib/: OpenBLAS, gfortran, Open MPI and its helpers (always on the library path there);
#             lib2/: base libraries copied to lib/ only where the device's ldconfig lacks them;
#   ompi.tgz  Open MPI's plugins, help texts and configuration, unpacked into / where the device has none;
#   data/     the first training shard and the validation shard of data/sotu;
#   gemm_shapes.txt  dbrx-1b's GEMMs (8 x 2048, BF16 and --fp8 block) and the DBRX-132B slice's (4 layers on 8 GPUs, EP 8,
#                    1 x 4096 a GPU; BF16 and --fp8 block), as make predict lists them for dev/cuda/matmul -s.
set -e
cd "$(dirname "$0")/../.."
run=${1:?usage: bash dev/bench/lease_pack.sh RUN.sh}
grep -qs '^/.lease/$' .git/info/exclude || { mkdir -p .git/info && echo /.lease/ >> .git/info/exclude; }
make -j2 train_dbrx test/cuda_tests_gpu dev/cuda/programs_gpu
make test/test_kernels_gpu test/test_fp8_cuda_gpu test/test_step_cuda_gpu test/test_zero_fp8_cuda_gpu test/test_decode_gpu >/dev/null
rm -rf .lease && mkdir -p .lease/lib .lease/lib2 .lease/data .lease/stage/dev/cuda .lease/stage/test
cp "$run" dev/bench/lease_setup.sh .lease/
# the dev/cuda programs: hard links to the one binary, named as make dev/cuda/NAME would build them
cp train_dbrx .lease/stage/ && cp dev/cuda/programs_gpu .lease/stage/dev/cuda/
for s in dev/cuda/*.cu; do ln .lease/stage/dev/cuda/programs_gpu ".lease/stage/dev/cuda/$(basename "$s" .cu)"; done
cp test/cuda_tests_gpu .lease/stage/test/
for t in test/*_gpu; do [ "$t" = test/cuda_tests_gpu ] || ln .lease/stage/test/cuda_tests_gpu ".lease/stage/$t"; done
tar -C .lease/stage -czf .lease/bins.tgz . && rm -rf .lease/stage
L=/lib/x86_64-linux-gnu
for l in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 \
         libhwloc.so.15 libevent_core-2.1.so.7 libevent_pthreads-2.1.so.7 libpmix.so.2 libmca_common_sm.so.40 \
         libmca_common_ompio.so.41 libmca_common_monitoring.so.50; do cp -L "$L/$l" .lease/lib/; done
for l in libz.so.1 libudev.so.1 libuuid.so.1 libatomic.so.1 libgomp.so.1 libnuma.so.1 libmunge.so.2; do
    [ -e "$L/$l" ] && cp -L "$L/$l" .lease/lib2/
done
(cd .lease && tar -czf libs.tgz lib lib2 && rm -rf lib lib2)
tar -C / -czf .lease/ompi.tgz --exclude=usr/lib/x86_64-linux-gnu/openmpi/include usr/lib/x86_64-linux-gnu/openmpi \
    usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi etc/openmpi $(cd / && ls -d usr/share/pmix 2>/dev/null)
make data >/dev/null
cp data/sotu/sotu_train_000000.bin data/sotu/sotu_val_000000.bin .lease/data/
# (BF16 and --fp8 block, a GEMM both steps run once, at its larger count: as make bench-gpu lists them)
make train_dbrx_emu >/dev/null
rm -f .lease/gemm_all.txt
for fl in "" "--fp8 block"; do
    MODEL=dbrx-1b BATCH=8 SEQ=2048 FLAGS="$fl" GEMM_SHAPES=.lease/gemm.part bash dev/predict/make_predict.sh > /dev/null
    grep -v "^#" .lease/gemm.part >> .lease/gemm_all.txt
    MODEL=dbrx-132b BATCH=1 SEQ=4096 NP=8 FLAGS="--n-layers 4 --shard-group-size 8 --expert-parallel 8 $fl" GEMM_SHAPES=.lease/gemm.part \
        bash dev/predict/make_predict.sh > /dev/null
    grep -v "^#" .lease/gemm.part >> .lease/gemm_all.txt
done
awk '{ k = $1; for (i = 2; i <= 13; i++) k = k " " $i; if (!(k in c) || $14 > c[k]) c[k] = $14 } END { for (k in c) print k, c[k] }' \
    .lease/gemm_all.txt > .lease/gemm_shapes.txt && rm -f .lease/gemm.part .lease/gemm_all.txt
du -sh .lease
