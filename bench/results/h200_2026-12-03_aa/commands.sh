#!/usr/bin/env bash
# What set aa ran on the H200 (one GPU), 2026-12-03, from a copy of the repo at the commit NOTES.md gives
# for each call (kept as callN_commit.txt):
#   bash bench/results/h200_2026-12-03_aa/commands.sh 1  -> call1_*  (the checked kernel table, its separate
#                                                           RHT a bf16 GEMM with H' instead of rht.rht)
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/aa}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
c=${1:-1}
cat REV > "$out/call${c}_commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/call${c}_commit.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/call${c}_commit.txt" 2>&1
case "$c" in
1)  timeout 300 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call1_kernels_checked.json" \
        > "$out/call1_kernels_checked.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
