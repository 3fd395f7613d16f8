#!/usr/bin/env bash
# The commands of the device calls that made this folder's files (2026-12-01, one H200, torch 2.11,
# triton 3.6), run from the repo root at the commit named in NOTES.md; `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_m}; mkdir -p "$out"

# 1 (5c5d623): call1_smi.txt, call1_tests.txt, call1_kernels.{txt,json}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > $out/call1_smi.txt 2>&1
timeout 90 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "one_fma" > $out/call1_tests.txt 2>&1
timeout 480 $py bench/kernels_bench.py --workers 14 --no-sweep --out $out/call1_kernels.json > $out/call1_kernels.txt 2>&1

# 2 (7d3b77c): call2_tests.txt, call2_kernels.{txt,json}; then call2_kernels_rhtrcprn.* on a copy of the
# tree whose RHT kernels take rcp.rn for y's divisor (the change 80ca151 made)
timeout 150 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "stochastic or sr_ or one_fma or philox" > $out/call2_tests.txt 2>&1
timeout 250 $py bench/kernels_bench.py --workers 14 --no-sweep --out $out/call2_kernels.json > $out/call2_kernels.txt 2>&1
sed -i 's/        r1 = _rcp_fast(ff) if FAST_DIV == 2 else tl.math.div_rn(1.0, ff)/        r1 = (libdevice.rcp_rn(ff) if RHT else _rcp_fast(ff)) if FAST_DIV == 2 else tl.math.div_rn(1.0, ff)/' kernels.py
timeout 170 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call2_kernels_rhtrcprn.json > $out/call2_kernels_rhtrcprn.txt 2>&1
git checkout kernels.py

# 3 (80ca151): call3_tests.txt; call3_kernels_table.* (the README's table); call3_kernels_checked.* (bit identity)
timeout 130 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "stochastic or sr_ or one_fma or philox or power_of_two" > $out/call3_tests.txt 2>&1
timeout 150 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call3_kernels_table.json > $out/call3_kernels_table.txt 2>&1
timeout 250 $py bench/kernels_bench.py --workers 14 --no-sweep --out $out/call3_kernels_checked.json > $out/call3_kernels_checked.txt 2>&1

# 4 (80ca151): dense-1.5b training steps
timeout 210 $py bench/train_bench.py --compile blocks --steps 8 --out $out/call4_dense_blocks.json > $out/call4_dense_blocks.txt 2>&1
timeout 300 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv --out $out/call4_dense_full.json > $out/call4_dense_full.txt 2>&1

# Offline (no GPU; the CPU machine's triton 3.6.0): sass_counts_<rev>.txt, the main-path instructions an element
# of every quantize kernel compiled for sm_90, before this set (cfd6255, from a worktree) and at 80ca151
s=bench/results/h200_2026-12-01_l/scripts
git worktree add /tmp/wt_cfd cfd6255 && $py $s/sass_counts.py /tmp/wt_cfd > sass_counts_cfd6255.txt; git worktree remove --force /tmp/wt_cfd
$py $s/sass_counts.py . > sass_counts_80ca151.txt

# 5 (2afb143): call5_kernels_sweep.txt (the tile sweep, cut by its limit)
timeout 440 $py bench/kernels_bench.py --workers 14 --skip-check --out $out/call5_kernels_sweep.json > $out/call5_kernels_sweep.txt 2>&1
