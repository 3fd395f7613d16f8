#!/usr/bin/env bash
# The commands of the 4 device calls that made this folder's files (2026-11-30), run from the repo root
# at the commit named (a clean `git archive` of it); `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_f}; mkdir -p "$out"

# 1 (at b294c9b): call1_*
timeout 130 $py -m pytest -q tests/test_kernels.py -k "bit_identical or nonfinite or amax or e4m3 or sr_ or stochastic or seed or pack_saved or qlinear"
$py bench/kernels_bench.py --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --profile 30 --out $out/dense.json

# 2 (at 86d9a43): call2_*
timeout 170 $py -m pytest -q tests/test_kernels.py -k "amax or sr_ or stochastic or nonfinite or e4m3"
$py bench/kernels_bench.py --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --recipes bf16,ufp4-nv --out $out/dense.json

# 3 (at 26e9cc5): call3_*
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json
$py bench/train_bench.py --compile blocks --steps 8 --recipes bf16,ufp4-nv,nvfp4 --out $out/dense_repeat.json
timeout 100 $py -m pytest -q tests/test_kernels.py -k "qlinear or pack_saved"

# 4 (at 6781531): call4_*
$py bench/kernels_bench.py --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json
timeout 45 $py -m pytest -q tests/test_kernels.py -k "pack_saved or dequantize"
