# 2026-12-07 22:17-22:23 UTC, one H100 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130, triton 3.6.0); the
# working tree of commit 2da2a9c (the machine's copy reported an older HEAD, 42ad5aa, for its .git; the files were 2da2a9c's).
# Every output named below is a section ("==> NAME <==") of outputs.txt.gz.
export TORCHINDUCTOR_CACHE_DIR=$PWD/runs/cache/inductor TRITON_CACHE_DIR=$PWD/runs/cache/triton
# the kernel and quant tests on the GPU (compiled kernels against the reference), then the rest of the suite
NPROC=12 scripts/gpu_tests.sh gpu_tests_kernels_quant.txt tests/test_kernels.py tests/test_quant.py
NPROC=12 scripts/gpu_tests.sh gpu_tests_rest.txt $(ls tests/test_*.py | grep -v -e test_kernels -e test_quant)
# small, ufp4, whole model compiled without CUDA graphs: GPU kernels of 3 steps and the host's Python profile of 2
python bench/train_bench.py --preset small --batch 16 --seq 1024 --compile full --recipes ufp4 \
   --compile-mode default --steps 10 --profile 30 --host-profile 70 --out profile.json > profile.txt
