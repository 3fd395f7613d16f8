#!/usr/bin/env bash
# The commands of the device calls that made this folder's files (2026-12-01, one H200, torch 2.11,
# triton 3.6), run from the repo root at the commit named in NOTES.md; `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_n}; mkdir -p "$out"

# 1 (b77872a): call1_smi.txt, call1_tests.txt, call1_kernels_table.*, call1_kernels_checked.*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > $out/call1_smi.txt 2>&1
timeout 90 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "division or far_from_one" > $out/call1_tests.txt 2>&1
timeout 170 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call1_kernels_table.json > $out/call1_kernels_table.txt 2>&1
timeout 250 $py bench/kernels_bench.py --workers 14 --no-sweep --out $out/call1_kernels_checked.json > $out/call1_kernels_checked.txt 2>&1

# 2 (5c8e31d, the persistent grid, reverted by 88fcbb2): call2_persist.txt; call2_sweep_cols.*
timeout 280 $py bench/results/h200_2026-12-01_n/scripts/persist_probe.py --pps 0,8,12,16 > $out/call2_persist.txt 2>&1
timeout 270 $py bench/kernels_bench.py --workers 14 --skip-check --sweep-kinds col_codes_heavy,col_heavy --out $out/call2_sweep_cols.json > $out/call2_sweep_cols.txt 2>&1

# 3 (df73af6): call3_smi.txt, call3_kernels_table.*, call3_kernels_checked.*, call3_tests.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > $out/call3_smi.txt 2>&1
timeout 150 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call3_kernels_table.json > $out/call3_kernels_table.txt 2>&1
timeout 250 $py bench/kernels_bench.py --workers 14 --no-sweep --out $out/call3_kernels_checked.json > $out/call3_kernels_checked.txt 2>&1
timeout 100 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "division or far_from_one or power_of_two" > $out/call3_tests.txt 2>&1

# 4 (df73af6): call4_sweep_rows.*
timeout 330 $py bench/kernels_bench.py --workers 14 --skip-check --sweep-kinds row_codes_heavy,row_heavy --out $out/call4_sweep_rows.json > $out/call4_sweep_rows.txt 2>&1

# 5 (6512357): call5_kernels_table.* (the README's table), call5_dense_blocks.*
timeout 150 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call5_kernels_table.json > $out/call5_kernels_table.txt 2>&1
timeout 240 $py bench/train_bench.py --compile blocks --steps 8 --out $out/call5_dense_blocks.json > $out/call5_dense_blocks.txt 2>&1

# 6 (6512357): call6_dense_full.*
timeout 310 $py bench/train_bench.py --compile full --steps 6 --warmup 2 --recipes bf16,ufp4-nv --out $out/call6_dense_full.json > $out/call6_dense_full.txt 2>&1

# Offline (no GPU; the CPU machine's triton 3.6.0): main-path sm_90 instructions an element at 6512357
$py bench/results/h200_2026-12-01_l/scripts/sass_counts.py . > sass_counts_6512357.txt

# Offline, CPU interpreter (6512357): the rowwise RHT kernels with the tile (1, 64, 2) against the reference
(cd tests && $py ../bench/results/h200_2026-12-01_n/scripts/tile_check.py)
