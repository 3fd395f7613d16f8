#!/usr/bin/env bash
# The commands of the 4 device calls that made this folder's files (2026-12-01), run from the repo root
# at the commit named in NOTES.md; `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_j}; mkdir -p "$out"

# 1: call1_* (at 662d0dc)
timeout 110 $py -m pytest -q tests/test_kernels.py -k "slice or joined or (qlinear and (ufp4-nv or nvfp4))"
timeout 430 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,nvfp4 --out $out/dense_full.json

# 2: call2_* (at 7e0719b)
timeout 100 $py -m pytest -q -x tests/test_kernels.py -k "both_equals or reads_dy or joined or slice"
timeout 120 $py bench/kernels_bench.py --both-only --workers 14 --out $out/both.json
timeout 300 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv --out $out/dense_full.json

# 3: call3_* (at 56463cb)
timeout 540 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,ufp4,nvfp4 --out $out/dense_full.json

# 4: call4_* (at 56463cb)
timeout 420 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,e2m1,mxfp4 --out $out/dense_full.json
timeout 100 $py -m pytest -q tests/test_kernels.py -k "slice or joined"
