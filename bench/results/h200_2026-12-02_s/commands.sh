#!/usr/bin/env bash
# What set s ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (commit.txt holds the last call's), with an older kernels.py saved at the repo root as
# its header says:
#   bash bench/results/h200_2026-12-02_s/commands.sh 1     -> call1_*  (ddcfe75; kernels_f7f8888.py)
#   bash bench/results/h200_2026-12-02_s/commands.sh 2     -> call2_*  (ddcfe75; kernels_f7f8888.py)
#   bash bench/results/h200_2026-12-02_s/commands.sh 3     -> call3_*  (f2b0c95 with the block amax from pairs;
#                                                                        f2b0c95's kernels as kernels_f2b0c95.py)
#   bash bench/results/h200_2026-12-02_s/commands.sh 4     -> call4_*  (2c734bc: the checked kernel table, dense-1.5b)
#   bash bench/results/h200_2026-12-02_s/commands.sh 5     -> call5_*  (7c4b176: column codes tiles of 1 and 2 warps)
# Not run yet (the session's device time was spent): 6, column codes tiles of 1 and 2 warps for every spec
#   bash bench/results/h200_2026-12-02_s/commands.sh 6     -> call6_*
# kernels_X.py is made by: git show X:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_X.py
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/s}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call${c}_smi.txt" 2>&1
case "$c" in
1)  # columns' codes: events against CUDA graph timing (its two other runs stopped at graph_ab's set-up,
    # a pool worker wrapping _plan twice: fixed, then run as call 2)
    timeout 120 $py $here/graph_ab.py --dim 0 --outputs codes \
        --out "$out/call1_cols_codes.json" > "$out/call1_cols_codes.txt" 2>&1 ;;
2)  # column dequant read as words; f7f8888's kernels at their tiles; rows: events against graph timing
    timeout 200 $py $here/graph_ab.py --dim 0 --outputs dequant --specs E2M1,UFP4,NVFP4,MXFP4 \
        --shapes "None None+w (64,2,2,True,8)+w (128,2,4,True) old" --alone-shapes "None old" \
        --old kernels_f7f8888.py --out "$out/call2_cols_dequant.json" > "$out/call2_cols_dequant.txt" 2>&1
    timeout 150 $py $here/graph_ab.py --dim -1 --outputs codes,dequant \
        --out "$out/call2_rows.json" > "$out/call2_rows.txt" 2>&1 ;;
3)  # the block amax of rotated tiles from the last stage's pairs against f2b0c95's ("old"), same tiles
    for d in -1 0; do
        timeout 150 $py $here/graph_ab.py --dim $d --outputs codes,dequant --shapes "None old" \
            --old kernels_f2b0c95.py --rounds 5 --out "$out/call3_dim${d}.json" > "$out/call3_dim${d}.txt" 2>&1
    done ;;
4)  timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call4_kernels_checked.json" \
        > "$out/call4_kernels_checked.txt" 2>&1
    timeout 330 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call4_dense_blocks.json" \
        > "$out/call4_dense_blocks.txt" 2>&1 ;;
5)  # column codes with RHT at tiles of 1 and 2 warps (no barrier between warps for the fast-range test)
    timeout 200 $py $here/graph_ab.py --dim 0 --outputs codes --specs E2M1,UFP4,MXFP4 \
        --shapes "None (32,2,1) (32,4,1) (32,4,1,False,2) (64,2,2) (64,4,2) (32,4,2)" \
        --out "$out/call5_cols_codes.json" > "$out/call5_cols_codes.txt" 2>&1 ;;
6)  # call 5's two best column codes tiles for NVFP4 too, MXFP4 at them with m_first (its kind's), SR's
    timeout 200 $py $here/graph_ab.py --dim 0 --outputs codes --specs E2M1,UFP4,NVFP4 --rounds 5 \
        --shapes "None (32,4,1) (64,4,2)" --out "$out/call6_cols_codes.json" > "$out/call6_cols_codes.txt" 2>&1
    timeout 150 $py $here/graph_ab.py --dim 0 --outputs codes --specs MXFP4 --rounds 5 \
        --shapes "None (32,4,1,True) (64,4,2,True) (32,4,2,True)" \
        --out "$out/call6_cols_codes_e8m0.json" > "$out/call6_cols_codes_e8m0.txt" 2>&1 ;;
esac
