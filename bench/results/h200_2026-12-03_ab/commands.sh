#!/usr/bin/env bash
# What set ab ran on the H200 (one GPU), 2026-12-03, from a copy of the repo at the commit NOTES.md gives
# for each call (kept as callN_commit.txt):
#   bash bench/results/h200_2026-12-03_ab/commands.sh 1  -> call1_*  (row codes: persistent grids, a tile's 6th
#                                                           entry = programs an SM, against the tiles in use)
#   bash bench/results/h200_2026-12-03_ab/commands.sh 2  -> call2_*  (row codes with the RHT signs of seed 0 as
#                                                           constants of the kernel, a timing bound; against
#                                                           kernels_main.py)
# kernels_main.py: 1694709's kernels.py (main's) cut before its torch.library registrations (sed '/^_LIB = /,$d'),
#   saved at the repo root
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/ab}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
c=${1:-1}
cat REV > "$out/call${c}_commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/call${c}_commit.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/call${c}_commit.txt" 2>&1
ab=bench/results/h200_2026-12-02_s/scripts/graph_ab.py
case "$c" in
1)  timeout 400 $py $ab --dim -1 --outputs codes --rounds 3 \
        --shapes "None (1,32,1,False,4,28) (1,32,1,False,4,32) (1,32,1,False,2,28) (1,32,1,False,1,28) (1,32,1,False,4,14) (1,64,1,False,2,28)" \
        --alone-shapes "None (1,32,1,False,4,28) (1,32,1,False,4,32) (1,32,1,False,1,32)" \
        --out "$out/call1_rows_codes.json" > "$out/call1_rows_codes.txt" 2>&1 ;;
2)  timeout 300 $py $ab --dim -1 --outputs codes --rounds 3 --old kernels_main.py \
        --shapes "None old (1,64,1,False,2) (1,32,1,False,2) (1,32,1,False,3)" \
        --alone-shapes "None old" --out "$out/call2_rows_codes.json" > "$out/call2_rows_codes.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
