#!/usr/bin/env bash
# What set p ran on the H200 (one GPU), 2026-12-01, from a copy of the repo at the commit named in
# each call's commit.txt ($OUT: where its files went). Calls 1 and 2 are set o's next_calls.sh
# (bench/results/sm90_offline_2026-12-01_o/) at 81682f1.
#   call 1 (81682f1): bash next_calls.sh 1   -> call1_*   (its pytest ran past its 200 s limit: no summary)
#   call 2 (81682f1): bash next_calls.sh 2   -> call2_*
#   call 3 (81682f1): ab.py with a bug (every "fused" row timed without RHT): not kept
#   call 4 (81682f1): python3 ab/ab.py --old kernels_6512357.py --out $OUT/ab.json --rounds 3   -> call4_ab.*
#       (kernels_6512357.py: git show 6512357:kernels.py | sed '/^_LIB = torch.library.Library/,$d')
#   call 5 (22249ad): bash commands.sh 5     -> call5_*
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/p}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null || cat REV > "$out/commit.txt" 2>/dev/null
case "${1:-5}" in
5)  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call5_smi.txt" 2>&1
    timeout 60 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "words or boundary or compiles or columns" \
        > "$out/call5_tests.txt" 2>&1
    timeout 200 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call5_kernels_checked.json" \
        > "$out/call5_kernels_checked.txt" 2>&1
    timeout 220 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call5_dense_blocks.json" \
        > "$out/call5_dense_blocks.txt" 2>&1
    timeout 90 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out "$out/call5_kernels_table.json" \
        > "$out/call5_kernels_table.txt" 2>&1 ;;
esac
