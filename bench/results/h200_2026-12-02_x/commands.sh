#!/usr/bin/env bash
# What set x ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (commit.txt holds the last call's), with older kernels.py files saved at the repo root:
#   bash bench/results/h200_2026-12-02_x/commands.sh 1  -> call1_*  (row and column codes against 3854c8b's
#                                                          kernels; row codes of E2M1 and SR at 8 tiles a
#                                                          program; column codes of E2M1 and SR at other tiles)
# kernels_X.py is made by: git show X:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_X.py
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/x}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts  # set s's graph_ab.py
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/commit.txt" 2>&1
case "$c" in
1)  timeout 100 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_3854c8b.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call1_rows_codes.json" > "$out/call1_rows_codes.txt" 2>&1
    timeout 120 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_3854c8b.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call1_cols_codes.json" > "$out/call1_cols_codes.txt" 2>&1
    timeout 70 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --specs "paper,SR" \
        --shapes "None (1,32,1,False,8)" --alone-shapes "None" \
        --out "$out/call1_rows_loop8.json" > "$out/call1_rows_loop8.txt" 2>&1
    timeout 120 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --specs "paper,SR" \
        --shapes "None (32,4,1) (64,4,4) (64,4,2) (32,8,2)" --alone-shapes "None" \
        --out "$out/call1_cols_tiles.json" > "$out/call1_cols_tiles.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
