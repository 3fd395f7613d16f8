#!/usr/bin/env bash
# The commands of the 4 device calls that made this folder's files (2026-12-01), run from the repo root
# at the commit named in NOTES.md; `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_i}; mkdir -p "$out"

# 1: call1_*
timeout 110 $py -m pytest -q tests/test_kernels.py -k "amax_both or tensor_amax_pass or (qlinear and ufp4-nv)"
timeout 70 $py bench/kernels_bench.py --amax-only --workers 12 --out $out/amax.json
timeout 380 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,nvfp4 --out $out/dense_full.json

# 2: call2_* (gemm_probe.py from this folder, copied to the repo root)
timeout 150 $py gemm_probe.py
timeout 300 $py bench/train_bench.py --compile full --steps 4 --warmup 2 --recipes ufp4-nv --profile 30 --out $out/prof.json

# 3: call3_*
timeout 480 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,ufp4,nvfp4 --out $out/dense_full.json

# 4: call4_*
timeout 60 $py -m pytest -q tests/test_kernels.py -k "amax_both or any_strides or (qlinear and (ufp4-nv or nvfp4))"
timeout 420 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,nvfp4 --out $out/dense_full.json
