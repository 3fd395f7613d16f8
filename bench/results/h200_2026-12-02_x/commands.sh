#!/usr/bin/env bash
# What set x ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (the commit.txt each call writes is kept here as callN_commit.txt), with older kernels.py files saved at the repo root:
#   bash bench/results/h200_2026-12-02_x/commands.sh 1  -> call1_*  (row and column codes against 3854c8b's
#                                                          kernels; row codes of E2M1 and SR at 8 tiles a
#                                                          program; column codes of E2M1 and SR at other tiles)
#   bash bench/results/h200_2026-12-02_x/commands.sh 2  -> call2_*  (call 1's kernels against themselves with one
#                                                          change undone: kernels_neg.py, kernels_off.py,
#                                                          kernels_sig.py, kernels_lines.py; row codes, and
#                                                          column codes for the first two)
#   bash bench/results/h200_2026-12-02_x/commands.sh 3  -> call3_*  (the kernels with call 2's negations and
#                                                          E2M1 lines only: row codes against 3854c8b's; column
#                                                          codes of E2M1, UFP4, NVFP4 and SR at other tiles)
#   bash bench/results/h200_2026-12-02_x/commands.sh 4  -> call4_*  (column codes with RHT of E2M1, UFP4, NVFP4 at
#                                                          (64, 4, 2): codes against 3854c8b's kernels; row codes
#                                                          against the same kernels loading two tiles ahead,
#                                                          kernels_pf2.py)
#   bash bench/results/h200_2026-12-02_x/commands.sh 5  -> call5_*  (the checked kernel table; the dense 1.5B step,
#                                                          blocks compiled)
#   bash bench/results/h200_2026-12-02_x/commands.sh 6  -> call6_*  (the checked kernel table again)
#   bash bench/results/h200_2026-12-02_x/commands.sh 7  -> call7_*  (column codes with RHT at m_first tiles)
# kernels_pf2.py: 6096d7f's kernels.py so cut, with _quantize_kernel's loop loading tile i + 2 (xw2) while tile i
#   is computed, tiles 0 and 1 before the loop
# kernels_neg.py: e79980d's kernels.py so cut, with -s back in _div_bf16, _div_fast, _div_level and
#   -tl.fma(f, r, -1.0) in _rcp_fast; kernels_off.py: with 3854c8b's _load_offsets and _load_words, and its
#   _tile_words taking tile pid_a + i; kernels_sig.py: with 3854c8b's _signs; kernels_lines.py: with 3854c8b's
#   _round_to_grid and the E2M1 lines' OFF 0x4B000000
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
2)  for v in neg off sig lines; do
        timeout 60 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_$v.py \
            --shapes "None old" --alone-shapes "None old" \
            --out "$out/call2_rows_$v.json" > "$out/call2_rows_$v.txt" 2>&1
    done
    for v in neg sig; do
        timeout 60 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_$v.py \
            --specs "paper,SR,NVFP4" --shapes "None old" --alone-shapes "None old" \
            --out "$out/call2_cols_$v.json" > "$out/call2_cols_$v.txt" 2>&1
    done ;;
3)  timeout 60 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_3854c8b.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call3_rows_codes.json" > "$out/call3_rows_codes.txt" 2>&1
    timeout 120 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --specs "paper,UFP4,NVFP4" \
        --shapes "None (32,4,1) (32,8,2) (64,4,2) (64,4,4)" --alone-shapes "None" \
        --out "$out/call3_cols_tiles.json" > "$out/call3_cols_tiles.txt" 2>&1
    timeout 60 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --specs "SR" \
        --shapes "None (128,2,4) (64,2,2) (32,2,1) (128,4,4) (16,8,1)" --alone-shapes "None" \
        --out "$out/call3_cols_sr.json" > "$out/call3_cols_sr.txt" 2>&1 ;;
4)  timeout 60 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_3854c8b.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call4_cols_codes.json" > "$out/call4_cols_codes.txt" 2>&1
    timeout 60 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_pf2.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call4_rows_pf2.json" > "$out/call4_rows_pf2.txt" 2>&1 ;;
5)  timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call5_kernels_checked.json" \
        > "$out/call5_kernels_checked.txt" 2>&1
    timeout 250 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call5_dense_blocks.json" \
        > "$out/call5_dense_blocks.txt" 2>&1 ;;
6)  timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call6_kernels_checked.json" \
        > "$out/call6_kernels_checked.txt" 2>&1 ;;
7)  timeout 90 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 \
        --shapes "None (64,4,4,True) (64,4,2,True) (32,4,1,True)" --alone-shapes "None" \
        --out "$out/call7_cols_mfirst.json" > "$out/call7_cols_mfirst.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
