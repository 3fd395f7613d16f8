#!/bin/bash
# One H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0), 2026-12-08 00:03-00:19 UTC, four calls on one held machine.
# Trees: "new" = 7759853 (2a3a56d's direct launch, then a plan's kept kernels keyed by its number);
# "mid" = 2a3a56d; "base" = 29845a3 (before both). out/base and out/mid: `git archive <commit> | tar -x`.
# Every output named below is a section ("==> NAME <==") of outputs.txt.gz.
# The GPU machine's copy of the repository carries an older .git: its files report "29845a3 (with
# uncommitted changes)" for the new tree.
export TORCHINDUCTOR_CACHE_DIR=$PWD/runs/cache/inductor TRITON_CACHE_DIR=$PWD/runs/cache/triton
# call 1 (422 s)
env -u TRITON_INTERPRET python -m pytest -q -n 8 --full tests/test_kernels.py -k "fast_launch or evaluation_leaves" \
   tests/test_hardening.py::test_e4m3_tensor_scale_of_a_tiny_tensor tests/test_bench.py          # 6 passed
python bench/launch_bench.py > launch_new.txt; (cd out/base && python bench/launch_bench.py) > launch_base.txt
(cd out/mid && python bench/launch_bench.py) > launch_mid.txt
tb() { python bench/train_bench.py --preset small --batch 16 --seq 1024 --compile full --recipes bf16,ufp4 \
       --compile-mode default --steps 30 "$@"; }
tb; (cd out/base && tb > small_base.txt); (cd out/mid && tb); tb
python bench/train_bench.py --preset small --batch 16 --seq 1024 --compile full --recipes ufp4 --compile-mode default \
    --steps 10 --host-profile 50 --out hostprof.json > hostprof.txt
# call 2 (245 s): base, new, base, new, then new with NANOFP4_FAST_LAUNCH=0, --steps 40 (tb as above)
# call 3 (153 s)
NPROC=14 scripts/gpu_tests.sh gpu_tests_kernels_quant.txt tests/test_kernels.py tests/test_quant.py
# call 4 (150 s, stopped when the GPU time ran out, ~93 % of the tests run, no failure before)
NPROC=14 timeout 150 scripts/gpu_tests.sh gpu_tests_rest.txt $(ls tests/test_*.py | grep -v -e test_kernels -e test_quant)
