#!/usr/bin/env bash
# What set w ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (commit.txt holds the last call's), with older kernels.py files saved at the repo root:
#   bash bench/results/h200_2026-12-02_w/commands.sh 1  -> call1_*  (e4m3's tensor scale once a program; the
#                                                          codes' nibbles and the bf16 words' low halves by
#                                                          integer multiplies: row and column codes, dequant,
#                                                          against eaa5cfd's kernels and cfe752a's; row codes
#                                                          with RHT capped at 64 registers a thread, kernels_r64.py)
#   bash bench/results/h200_2026-12-02_w/commands.sh 2  -> call2_*  (integer multiplies for row codes only: column
#                                                          codes against eaa5cfd's; row codes against the same
#                                                          kernels without the bf16 words' multiply (kernels_nom16.py)
#                                                          and without the nibbles' (kernels_nonib.py); the checked
#                                                          kernel table; the dense 1.5B step, blocks compiled)
#   bash bench/results/h200_2026-12-02_w/commands.sh 3  -> call3_*  (the bf16 words' multiply only with e4m3 or e8m0
#                                                          scales: row codes against 99f0229's kernels; the checked
#                                                          kernel table)
#   bash bench/results/h200_2026-12-02_w/commands.sh 4  -> call4_*  (fp32 scales' fast-range test as one unsigned
#                                                          max a tile: codes against 2c8eace's kernels; the
#                                                          checked kernel table)
# kernels_nom16.py, kernels_nonib.py: call 2's kernels.py so cut, with `m16 = nib << 12` made `m16 = None`,
# and `mul16 = nib` made `mul16 = 16`
# kernels_r64.py: call 1's kernels.py so cut, with ("maxnreg", 64) added to the launch options of
# row codes with RHT (_plan's return)
# kernels_X.py is made by: git show X:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_X.py
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/w}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts  # set s's graph_ab.py
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/commit.txt" 2>&1
case "$c" in
1)  timeout 120 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_eaa5cfd.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call1_rows_codes.json" > "$out/call1_rows_codes.txt" 2>&1
    timeout 90 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_cfe752a.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call1_rows_codes_imad.json" > "$out/call1_rows_codes_imad.txt" 2>&1
    timeout 70 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_r64.py \
        --shapes "None old" --alone-shapes "None" \
        --out "$out/call1_rows_codes_r64.json" > "$out/call1_rows_codes_r64.txt" 2>&1
    timeout 110 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_eaa5cfd.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call1_cols_codes.json" > "$out/call1_cols_codes.txt" 2>&1
    for d in -1 0; do
        timeout 90 $py $here/graph_ab.py --dim $d --outputs dequant --rounds 3 --old kernels_eaa5cfd.py \
            --shapes "None old" --alone-shapes "None old" \
            --out "$out/call1_dequant_dim${d}.json" > "$out/call1_dequant_dim${d}.txt" 2>&1
    done ;;
2)  timeout 60 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_eaa5cfd.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call2_cols_codes.json" > "$out/call2_cols_codes.txt" 2>&1
    for v in nom16 nonib; do
        timeout 50 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_$v.py \
            --shapes "None old" --alone-shapes "None old" \
            --out "$out/call2_rows_codes_$v.json" > "$out/call2_rows_codes_$v.txt" 2>&1
    done
    timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call2_kernels_checked.json" \
        > "$out/call2_kernels_checked.txt" 2>&1
    timeout 250 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call2_dense_blocks.json" \
        > "$out/call2_dense_blocks.txt" 2>&1 ;;
3)  timeout 60 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_99f0229.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call3_rows_codes.json" > "$out/call3_rows_codes.txt" 2>&1
    timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call3_kernels_checked.json" \
        > "$out/call3_kernels_checked.txt" 2>&1 ;;
4)  for d in -1 0; do
        timeout 60 $py $here/graph_ab.py --dim $d --outputs codes --rounds 3 --old kernels_2c8eace.py \
            --shapes "None old" --alone-shapes "None old" \
            --out "$out/call4_codes_dim$d.json" > "$out/call4_codes_dim$d.txt" 2>&1
    done
    timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call4_kernels_checked.json" \
        > "$out/call4_kernels_checked.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
