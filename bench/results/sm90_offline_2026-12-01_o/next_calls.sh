#!/usr/bin/env bash
# The GPU runs that time this set's changes (not yet run: set o was made without a GPU). Each
# takes under 600 s, run from the repo root at the commit under test;
# timings as in set n (kernels_bench checked ~250 s, table ~75-150 s, train_bench blocks ~200 s).
#   run 1: bash bench/results/sm90_offline_2026-12-01_o/next_calls.sh 1
#   run 2: bash bench/results/sm90_offline_2026-12-01_o/next_calls.sh 2
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/sm90_o}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null || cat REV > "$out/commit.txt" 2>/dev/null
case "${1:-1}" in
1)  # bits: the CPU tests on the CUDA path (every bit-identity test, the column words among them),
    # then kernels_bench's checks on 8192^2 with its table
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call1_smi.txt" 2>&1
    timeout 200 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py > "$out/call1_tests.txt" 2>&1
    timeout 330 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call1_kernels_checked.json" \
        > "$out/call1_kernels_checked.txt" 2>&1 ;;
2)  # time: the table again (run-to-run noise) and dense-1.5b per block, every recipe
    timeout 170 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out "$out/call2_kernels_table.json" \
        > "$out/call2_kernels_table.txt" 2>&1
    timeout 300 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call2_dense_blocks.json" \
        > "$out/call2_dense_blocks.txt" 2>&1 ;;
esac
