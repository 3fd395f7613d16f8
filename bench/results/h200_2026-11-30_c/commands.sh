#!/usr/bin/env bash
# The commands of the 7 device calls that made this folder's files (2026-11-30), run from the repo root
# at the commit named; output files renamed as NOTES.md lists. `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_c}; mkdir -p "$out"

# A (2 H200s, at e4e325d): GPU 1 -> kernels.*; GPU 0 -> dense1.5b_pack_saved.* (and a dense run not used)
CUDA_VISIBLE_DEVICES=0 $py bench/train_bench.py --compile blocks --steps 6 --warmup 2 --recipes bf16,ufp4,e2m1,mxfp4 \
    --quant pack_saved=true --out $out/dense1.5b_pack_saved.json &
CUDA_VISIBLE_DEVICES=1 $py bench/kernels_bench.py --skip-check --out $out/kernels.json; wait

# B (at 3844be2): launch_before.txt, moe-small_block_before*, dense1.5b_ufp4nv_nvfp4_e2m1.json
$py bench/launch_bench.py
$py bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 --compile block --host-profile 35
$py bench/train_bench.py --compile blocks --steps 8 --recipes bf16,ufp4-nv,nvfp4,e2m1

# C (at 24a953f): launch_after_plan_cache.txt, moe-small_block_after*
$py -m pytest -q tests/test_kernels.py -k "fast or seed or compiled_sr or qlinear or sr_mean"
$py bench/launch_bench.py
$py bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 --compile block --host-profile 30

# D (at 3d3a338): dense1.5b_all_recipes.*, moe-small_block_run2.json
$py bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 --compile block
$py bench/train_bench.py --compile blocks --steps 8

# E (at 3d77b49): dense1.5b_ufp4nv_nvfp4_gpubusy.*, launch_final.txt, kernel_tests_amax_key_bug.txt
$py -m pytest -q tests/test_kernels.py -k "fast or amax or seed or compiled_sr or qlinear or sr_mean"
$py bench/train_bench.py --compile blocks --steps 8 --recipes bf16,ufp4-nv,nvfp4 --profile 8
$py bench/launch_bench.py

# F (at f3f36e1): moe-small_cudagraphs.*, kernel_tests_final.txt
$py -m pytest -q tests/test_kernels.py -k "fast or amax or seed"
$py bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 --compile block \
    --compile-mode reduce-overhead --profile 5

# G (at 5f7bf69, data/shakespeare prepared): train_moe-small_ufp4_cudagraphs*
$py train.py configs/moe-small.toml --quant.recipe=ufp4 --train.compile_mode=reduce-overhead \
    --train.max_steps=40 --train.eval_interval=40 --train.ckpt_interval=-1 --log.out_dir=$out/moe-small-ufp4-graphs
