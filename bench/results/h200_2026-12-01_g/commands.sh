#!/usr/bin/env bash
# The commands of the 3 device calls that made this folder's files (2026-12-01), run from the repo root
# at the commit named (a clean `git archive` of it); `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_g}; mkdir -p "$out"

# 1 (at 93b7f5e): call1_*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $out/gpu.txt
timeout 130 $py -m pytest -q tests/test_kernels.py -k "whole_tensor or bit_identical or nonfinite"
timeout 260 $py bench/kernels_bench.py --out $out/kernels.json
timeout 170 $py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json

# 2 (at 97f56bb): call2_*
timeout 150 $py -m pytest -q tests/test_kernels.py -k "whole_tensor or (bit_identical and (fp32 or e4m3) and e2m1)"
timeout 380 $py bench/kernels_bench.py --out $out/kernels.json

# 3 (at 258873a): call3_*
timeout 60 $py - <<'PY'   # the dequantize table of kernels_bench, twice
import sys; sys.path.insert(0, "bench"); import kernels_bench as kb
kb.setup(False)
import torch
buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
copy = 2 * buf.numel() * 2 / kb.bench(lambda: dst.copy_(buf), "cuda") / 1e6
del buf, dst
x, signs = kb.make_x(8192, 8192, 4, "cuda"), kb.rht.random_signs(0).cuda()
for _ in range(2):
    kb.dequantize_table(x, signs, copy, "cuda")
PY
timeout 500 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4,nvfp4,ufp4-nv,mxfp4,e2m1 --out $out/dense_full.json
