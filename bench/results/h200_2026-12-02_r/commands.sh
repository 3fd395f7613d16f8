#!/usr/bin/env bash
# What set r ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md
# gives for each call (commit.txt holds the last call's):
#   bash bench/results/h200_2026-12-02_r/commands.sh 1     -> call1_*
#   bash bench/results/h200_2026-12-02_r/commands.sh 2     -> call2_*
#   bash bench/results/h200_2026-12-02_r/commands.sh 3     -> call3_*   (rows at the tiles chosen from calls 1-2)
#   bash bench/results/h200_2026-12-02_r/commands.sh 4     -> call4_*   (columns' col_heavy from call 3 too)
#   bash bench/results/h200_2026-12-02_r/commands.sh 5     -> call5_*   (MXFP4's column dequant back on col_e8m0)
# Run at ddcfe75 (the next session, same day): 6, more column dequant tiles, and the column dequant kernels of f7f8888 against today's at
# the same tile (the kernels of f7f8888 saved first, at the repo root:
#   git show f7f8888:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_f7f8888.py)
#   bash bench/results/h200_2026-12-02_r/commands.sh 6     -> call6_*
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/r}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_r/scripts
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call${c}_smi.txt" 2>&1
case "$c" in
1)  timeout 280 $py $here/loop_ab.py --dim -1 --outputs codes \
        --shapes "None None@80 (1,64,1,False,2) (1,64,1,False,2)@104 (1,64,1,False,4) (1,64,1,False,8) (1,32,1,False,4) (1,32,1,False,8) (1,32,1,False,16) (1,64,2,False,4) (1,128,2,False,4)" \
        --alone-shapes "None (1,64,1,False,4) (1,32,1,False,4) (1,32,1,False,8)" \
        --out "$out/call1_rows_codes.json" > "$out/call1_rows_codes.txt" 2>&1
    timeout 150 $py $here/loop_ab.py --dim -1 --outputs dequant \
        --shapes "None (1,64,1,False,4) (1,32,1,False,4) (1,32,1,False,8)" \
        --alone-shapes "None (1,64,1,False,4) (1,32,1,False,4)" \
        --out "$out/call1_rows_dequant.json" > "$out/call1_rows_dequant.txt" 2>&1 ;;
2)  # (cut by their limits while compiling: the warm-up compiled at width 256, and the columnwise kernels are
    # specialized on the width; loop_ab.py now warms up at the timed width)
    timeout 110 $py $here/loop_ab.py --dim 0 --outputs dequant \
        --shapes "None (128,2,4,True,2) (64,2,4,True,2) (64,2,4,True,4) (64,2,4,True,8) (64,2,2,True,4) (32,2,1,True,4)" \
        --alone-shapes "None (64,2,4,True,4) (128,2,4,True,2)" \
        --out "$out/call2_cols_dequant.json" > "$out/call2_cols_dequant.txt" 2>&1
    timeout 110 $py $here/loop_ab.py --dim 0 --outputs codes \
        --shapes "None (64,4,4,False,2) (64,4,4,True,2) (32,4,2,False,4) (64,2,2,True,4) (32,2,1,True,4) (64,2,4,True,4)" \
        --alone-shapes "None (64,4,4,False,2) (64,2,4,True,4)" \
        --out "$out/call2_cols_codes.json" > "$out/call2_cols_codes.txt" 2>&1
    timeout 90 $py $here/loop_ab.py --dim -1 --outputs codes \
        --shapes "None (1,64,1,False,2) (1,64,1,False,3) (1,32,1,False,2) (1,32,2,False,4)" \
        --alone-shapes "None (1,32,1,False,4) (1,32,1,False,2) (1,64,1,False,2)" \
        --out "$out/call2_rows_codes.json" > "$out/call2_rows_codes.txt" 2>&1
    timeout 90 $py $here/loop_ab.py --dim -1 --outputs dequant \
        --shapes "None (1,32,1,False,4) (1,32,1,False,2) (1,32,2,False,4) (1,64,2,False,2)" \
        --alone-shapes "None (1,32,1,False,4) (1,32,1,False,2) (1,32,2,False,4)" \
        --out "$out/call2_rows_dequant.json" > "$out/call2_rows_dequant.txt" 2>&1 ;;
3)  timeout 150 $py $here/loop_ab.py --dim 0 --outputs dequant \
        --shapes "None (128,2,4,True,2) (64,2,4,True,4) (64,2,2,True,4) (32,2,1,True,4)" \
        --alone-shapes "None (64,2,4,True,4)" \
        --out "$out/call3_cols_dequant.json" > "$out/call3_cols_dequant.txt" 2>&1
    timeout 150 $py $here/loop_ab.py --dim 0 --outputs codes \
        --shapes "None (64,4,4,False,2) (32,4,2,False,4) (64,2,2,True,4) (64,2,4,True,4)" \
        --alone-shapes "None (64,4,4,False,2)" \
        --out "$out/call3_cols_codes.json" > "$out/call3_cols_codes.txt" 2>&1
    timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call3_kernels_checked.json" \
        > "$out/call3_kernels_checked.txt" 2>&1 ;;
4)  timeout 300 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call4_dense_blocks.json" \
        > "$out/call4_dense_blocks.txt" 2>&1
    timeout 150 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out "$out/call4_kernels_table.json" \
        > "$out/call4_kernels_table.txt" 2>&1 ;;
5)  timeout 100 $py $here/loop_ab.py --dim 0 --outputs dequant --specs MXFP4,E2M1,UFP4 --rounds 5 \
        --shapes "None (64,2,2,True,4) (128,2,4,True)" --out "$out/call5_cols_dequant.json" \
        > "$out/call5_cols_dequant.txt" 2>&1 ;;
6)  timeout 200 $py $here/loop_ab.py --dim 0 --outputs dequant --specs E2M1,UFP4,NVFP4 --rounds 5 \
        --shapes "None (64,2,2,True,2) (64,2,2,True,8) (32,2,2,True,4) (64,2,1,True,4) (128,2,4,True)" \
        --out "$out/call6_cols_dequant.json" > "$out/call6_cols_dequant.txt" 2>&1
    timeout 150 $py bench/results/h200_2026-12-02_q/scripts/tiles_ab.py --dim 0 --outputs dequant --rounds 5 \
        --tiles "(128,2,4,True) None" --old kernels_f7f8888.py \
        --out "$out/call6_old_tile.json" > "$out/call6_old_tile.txt" 2>&1 ;;
esac
