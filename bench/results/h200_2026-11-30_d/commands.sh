#!/usr/bin/env bash
# The commands of the 3 device calls that made this folder's files (2026-11-30), run from the repo root
# at the commit named (a clean `git archive` of it); `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_d}; mkdir -p "$out"

# 1 (at e013ffb, with kernels.quantize_both, since removed): kernel_tests_call1.txt, kernels_call1_*, dense1.5b_call1_*
$py -m pytest -q -x tests/test_kernels.py -k "both or dy_once or fast or amax or seed or pack or dequantize or qlinear or sr_mean"
$py bench/kernels_bench.py --skip-check --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json

# 2 (at b6dc19a): call2_*
$py -m pytest -q tests/test_kernels.py -k "fast or seed or pack or dequantize or sr_mean or amax or qlinear"
$py bench/kernels_bench.py --skip-check --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --quant pack_saved=true --out $out/dense_pack.json
$py bench/train_bench.py --preset moe-small --batch 16 --seq 1024 --recipes bf16,ufp4 --compile block \
    --compile-mode reduce-overhead --out $out/moe_graphs.json

# 3 (at e806ab0): call3_*
timeout 170 $py -m pytest -q tests/test_kernels.py
$py bench/kernels_bench.py --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json
