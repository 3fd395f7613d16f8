#!/bin/bash
# The commands that made this folder's files: one H100 80GB HBM3, torch 2.11, triton 3.6, 2026-12-07,
# commit bd2e2dc, from the repository root, with data/shakespeare prepared (python data/prepare.py shakespeare).
# bench/one_gpu_check.sh DATA OUT bits small runs the same checks (as fixed after this run).
set -u
R=runs/gpu_check; D=$PWD/data/shakespeare; mkdir -p $R
export TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor TRITON_CACHE_DIR=$R/cache/triton
# bits (gpu_tests_kernels_quant.txt): every kernel and quantized-linear test, --full, compiled kernels on the GPU
NPROC=4 scripts/gpu_tests.sh $R/gpu_tests_kernels_quant.txt tests/test_kernels.py tests/test_quant.py
# small as shipped, every recipe, train.py's own log (small.txt, small.json)
python bench/trainer_bench.py configs/small.toml --warm 4 --steps 100 --skip 30 --eval-interval 50 \
    --out-dir $R/small --json $R/small.json -- --data.dir=$D > $R/small.txt 2>&1
# small without CUDA graphs (small_default.txt, small_default.json)
python bench/trainer_bench.py configs/small.toml --recipes bf16,ufp4 --warm 2 --label default --steps 100 --skip 30 \
    --eval-interval 50 --out-dir $R/small --json $R/small_default.json -- --data.dir=$D --train.compile_mode=default \
    > $R/small_default.txt 2>&1
# moe-small's evaluation crash (moedbg.txt, trimmed to the run header and the error; fixed in 6a72c1b)
python train.py configs/moe-small.toml --train.max_steps=4 --train.eval_interval=2 --train.ckpt_interval=-1 \
    --train.resume=false --log.out_dir=$R/moedbg --data.dir=$D > $R/moedbg.txt 2>&1
