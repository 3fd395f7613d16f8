#!/usr/bin/env bash
# The commands of the 3 device calls that made this folder's files (2026-12-01), run from the repo root
# at the commit named (a clean `git archive` of it); `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_h}; mkdir -p "$out"

# 1 (at 8c32298 in main/, and the wip branch in wip/; run from their parent): call1_*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $out/gpu.txt
for b in main wip wip main; do (cd $b && timeout 100 $py bench/kernels_bench.py --no-sweep --skip-check --workers 12 --out $out/kb_$b.json); done
(cd wip && timeout 300 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,e2m1 --out $out/dense_full_wip.json)

# 2 (at 5007ecd): call2_*
timeout 100 $py -m pytest -q tests/test_kernels.py -k "amax_both or (qlinear and ufp4-nv) or (bit_identical and e2m1 and fp32) or tensor_amax_pass"
timeout 70 $py bench/kernels_bench.py --amax-only --workers 12 --out $out/amax.json
timeout 320 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv,nvfp4 --out $out/dense_full.json

# 3 (at 5007ecd): call3_*
timeout 110 $py -m pytest -q tests/test_kernels.py -k "bit_identical and e2m1 and (e4m3 or e8m0)"
timeout 80 $py bench/kernels_bench.py --no-sweep --skip-check --workers 12 --out $out/kernels.json
timeout 380 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4,e2m1,mxfp4 --out $out/dense_full.json
