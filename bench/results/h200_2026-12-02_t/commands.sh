#!/usr/bin/env bash
# What set t ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (commit.txt holds the last call's), with an older kernels.py saved at the repo root as
# its header says:
#   bash bench/results/h200_2026-12-02_t/commands.sh 1  -> call1_*  (y by _div_level against d9dd359's
#                                                          kernels; the checked kernel table)
#   bash bench/results/h200_2026-12-02_t/commands.sh 2  -> call2_*  (column codes tiles of 1 and 2 warps;
#                                                          dense-1.5b per block)
#   bash bench/results/h200_2026-12-02_t/commands.sh 3  -> call3_*  (column codes with RHT at (32, 4, 1); row
#                                                          codes tiles; MXFP4's column codes alone and fused
#                                                          at (32, 4, 2, m_first); the checked kernel table)
#   bash bench/results/h200_2026-12-02_t/commands.sh 4  -> call4_*  (uniform codes by casts along rows at
#                                                          (1, 32, 1) x 4; more column codes tiles; the table)
#   bash bench/results/h200_2026-12-02_t/commands.sh 5  -> call5_*  (NVFP4's column codes at (32, 4, 1) against
#                                                          (64, 4, 4), five rounds)
#   bash bench/results/h200_2026-12-02_t/commands.sh 6  -> call6_*  (codes' sign words taken before the block
#                                                          scale, against cdb7b4f's kernels; kernels_cdb7b4f.py)
#   bash bench/results/h200_2026-12-02_t/commands.sh 7  -> call7_*  (MXFP4's column codes with RHT at
#                                                          (32, 4, 2, m_first): the checked kernel table)
# kernels_X.py is made by: git show X:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_X.py
# The offline check (this machine's CPU, no GPU): gcc -O2 -mfma -ffp-contract=off
#   scripts/div_level_check.c -o div_level_check -lm && ./div_level_check   -> offline_div_level_check.txt
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/t}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts  # set s's graph_ab.py (the calls ran a copy of it, the same bytes)
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call${c}_smi.txt" 2>&1
case "$c" in
1)  # y by _div_level (one FMA less an element) against d9dd359's kernels ("old"), same tiles, then the table
    for d in -1 0; do
        timeout 110 $py $here/graph_ab.py --dim $d --outputs codes,dequant --specs E2M1,UFP4 --shapes "None old" \
            --old kernels_d9dd359.py --rounds 3 --out "$out/call1_dim${d}.json" > "$out/call1_dim${d}.txt" 2>&1
    done
    timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call1_kernels_checked.json" \
        > "$out/call1_kernels_checked.txt" 2>&1 ;;
2)  # set s call 6: column codes at tiles of 1 and 2 warps for E2M1, UFP4, NVFP4; MXFP4 with m_first
    timeout 150 $py $here/graph_ab.py --dim 0 --outputs codes --specs E2M1,UFP4,NVFP4 --rounds 3 \
        --shapes "None (32,4,1) (64,4,2)" --out "$out/call2_cols_codes.json" > "$out/call2_cols_codes.txt" 2>&1
    timeout 100 $py $here/graph_ab.py --dim 0 --outputs codes --specs MXFP4 --rounds 3 \
        --shapes "None (32,4,1,True) (64,4,2,True) (32,4,2,True)" \
        --out "$out/call2_cols_codes_e8m0.json" > "$out/call2_cols_codes_e8m0.txt" 2>&1
    timeout 330 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call2_dense_blocks.json" \
        > "$out/call2_dense_blocks.txt" 2>&1 ;;
3)  timeout 100 $py $here/graph_ab.py --dim -1 --outputs codes --specs E2M1,UFP4,MXFP4 --rounds 3 \
        --shapes "None (1,64,1) (1,32,1,False,4) (1,64,2,False,2) (1,128,2)" \
        --out "$out/call3_rows_codes.json" > "$out/call3_rows_codes.txt" 2>&1
    timeout 60 $py $here/graph_ab.py --dim 0 --outputs codes --specs MXFP4 --rounds 3 \
        --shapes "None (32,4,2,True)" --alone-shapes "None (32,4,2,True)" \
        --out "$out/call3_cols_codes_e8m0.json" > "$out/call3_cols_codes_e8m0.txt" 2>&1
    timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call3_kernels_checked.json" \
        > "$out/call3_kernels_checked.txt" 2>&1 ;;
4)  timeout 100 $py $here/graph_ab.py --dim 0 --outputs codes --specs E2M1,UFP4 --rounds 3 \
        --shapes "None (32,8,1) (16,8,1) (32,4,1,True) (32,4,1,False,2) (64,4,1) (32,2,1)" \
        --out "$out/call4_cols_codes.json" > "$out/call4_cols_codes.txt" 2>&1
    timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call4_kernels_checked.json" \
        > "$out/call4_kernels_checked.txt" 2>&1 ;;
5)  timeout 100 $py $here/graph_ab.py --dim 0 --outputs codes --specs NVFP4 --rounds 5 \
        --shapes "None (64,4,4)" --out "$out/call5_cols_codes_nvfp4.json" > "$out/call5_cols_codes_nvfp4.txt" 2>&1 ;;
6)  for d in -1 0; do
        timeout 80 $py $here/graph_ab.py --dim $d --outputs codes --shapes "None old" --old kernels_cdb7b4f.py \
            --rounds 3 --out "$out/call6_dim${d}.json" > "$out/call6_dim${d}.txt" 2>&1
    done ;;
7)  timeout 200 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call7_kernels_checked.json" \
        > "$out/call7_kernels_checked.txt" 2>&1 ;;
esac
