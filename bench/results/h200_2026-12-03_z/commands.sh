#!/usr/bin/env bash
# What set z ran on the H200 (one GPU), 2026-12-03, from a copy of the repo at the commit NOTES.md gives
# for each call (kept as callN_commit.txt):
#   bash bench/results/h200_2026-12-03_z/commands.sh 1  -> call1_*  (the checked kernel table; the dense 1.5B
#                                                          training step under every recipe, blocks compiled)
#   bash bench/results/h200_2026-12-03_z/commands.sh 2  -> call2_*  (the dense 1.5B training step again, with time for
#                                                          every recipe; bf16 and ufp4-nv as a whole model)
#   bash bench/results/h200_2026-12-03_z/commands.sh 3  -> call3_*  (train_bench.py after its change at 5b4317a: the
#                                                          small preset, eager, a check that it runs)
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/z}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/commit.txt" 2>&1
dense() {  # dense NAME [SECONDS [COMPILE [RECIPES]]]
    timeout ${2:-260} $py bench/train_bench.py --compile ${3:-blocks} --steps 8 ${4:+--recipes $4} \
        --out "$out/$1.json" > "$out/$1.txt" 2>&1
}
case "$c" in
1)  timeout 280 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call1_kernels_checked.json" \
        > "$out/call1_kernels_checked.txt" 2>&1
    dense call1_dense_blocks ;;
2)  dense call2_dense_blocks 330
    dense call2_dense_full 240 full bf16,ufp4-nv ;;
3)  timeout 200 $py bench/train_bench.py --preset small --batch 4 --seq 1024 --recipes bf16,ufp4,nvfp4 --steps 3 \
        --warmup 2 --compile none --out "$out/call3_train_bench_small.json" > "$out/call3_train_bench_small.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
