#!/usr/bin/env bash
# What set q ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit in each
# call's commit.txt, with the kernels of 061f85e saved as kernels_061f85e.py for the side-by-side runs:
#   git show 061f85e:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_061f85e.py
#   bash bench/results/h200_2026-12-02_q/commands.sh 1     -> call1_*
# and for call 2 the kernels of 8ad82db (call 1's) as kernels_8ad82db.py, made the same way:
#   bash bench/results/h200_2026-12-02_q/commands.sh 2     -> call2_*   (its train_bench was cut by its
#       limit before the last recipe, ufp4-nv: no JSON)
#   bash bench/results/h200_2026-12-02_q/commands.sh 3     -> call3_*
#   bash bench/results/h200_2026-12-02_q/commands.sh 4     -> call4_*
# Not run yet (the device time was spent): 5 times what 4500432 changed in a step (ufp4-nv reads X
# and dY once for both amaxes) and the amax table:
#   bash bench/results/h200_2026-12-02_q/commands.sh 5     -> call5_*
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/q}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_q/scripts
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call${c}_smi.txt" 2>&1
case "$c" in
1)  timeout 60 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "e4m3_bytes or fast_range" \
        > "$out/call1_tests.txt" 2>&1
    timeout 200 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call1_kernels_checked.json" \
        > "$out/call1_kernels_checked.txt" 2>&1
    timeout 190 $py $here/tiles_ab.py --dim -1 --tiles "(1,64,1) (1,64,2) (1,128,1) (1,256,2) (1,128,2)" \
        --old kernels_061f85e.py --out "$out/call1_rows.json" > "$out/call1_rows.txt" 2>&1
    timeout 110 $py $here/tiles_ab.py --dim 0 --tiles "None" --old kernels_061f85e.py \
        --out "$out/call1_cols.json" > "$out/call1_cols.txt" 2>&1 ;;
2)  timeout 200 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call2_kernels_checked.json" \
        > "$out/call2_kernels_checked.txt" 2>&1
    timeout 100 $py $here/tiles_ab.py --dim -1 --tiles "None" --old kernels_8ad82db.py \
        --out "$out/call2_rows.json" > "$out/call2_rows.txt" 2>&1
    timeout 100 $py $here/tiles_ab.py --dim 0 --tiles "None" --old kernels_8ad82db.py \
        --out "$out/call2_cols.json" > "$out/call2_cols.txt" 2>&1
    timeout 200 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call2_dense_blocks.json" \
        > "$out/call2_dense_blocks.txt" 2>&1 ;;
3)  timeout 280 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call3_dense_blocks.json" \
        > "$out/call3_dense_blocks.txt" 2>&1
    timeout 100 $py $here/tiles_ab.py --dim 0 --outputs dequant \
        --tiles "None (256,2,8,True) (128,2,2,True) (64,2,2,True) (128,4,8,True)" \
        --out "$out/call3_cols.json" > "$out/call3_cols.txt" 2>&1
    timeout 100 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out "$out/call3_kernels_table.json" \
        > "$out/call3_kernels_table.txt" 2>&1 ;;
4)  timeout 100 $py $here/amax_both_occupancy.py --rounds 5 > "$out/call4_amax_both.txt" 2>&1 ;;
5)  timeout 280 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call5_dense_blocks.json" \
        > "$out/call5_dense_blocks.txt" 2>&1
    timeout 120 $py bench/kernels_bench.py --workers 14 --amax-only --out "$out/call5_amax.json" \
        > "$out/call5_amax.txt" 2>&1 ;;
esac
