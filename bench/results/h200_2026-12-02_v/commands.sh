#!/usr/bin/env bash
# What set v ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (commit.txt holds the last call's), with older kernels.py files saved at the repo root:
#   bash bench/results/h200_2026-12-02_v/commands.sh 1  -> call1_*  (MXFP4's codes: the level lines take x and
#                                                          the power-of-two scale, no y; NVFP4's codes: |y|
#                                                          unclamped where it stays under 8; codes programs
#                                                          of 8 and 16 tiles, unrolled by 4; against 874c9b0's
#                                                          kernels; RN(1 / f) by _rcp_fast with RHT; MXFP4's
#                                                          column codes tiles; the call's row results were
#                                                          not kept)
#   bash bench/results/h200_2026-12-02_v/commands.sh 2  -> call2_*  (RN(1 / f) by _rcp_fast everywhere, MXFP4's
#                                                          column codes with RHT at (64, 4, 4, m_first): row and
#                                                          column codes against 874c9b0's kernels, row codes
#                                                          programs of 8 and 16 tiles, column codes tiles)
#   bash bench/results/h200_2026-12-02_v/commands.sh 3  -> call3_*  (blocks an SM and times under the default and
#                                                          the largest shared-memory carveout, every timed
#                                                          kernel; MXFP4's codes without RHT back to y = x * f)
#   bash bench/results/h200_2026-12-02_v/commands.sh 4  -> call4_*  (the checked kernel table; the dense 1.5B step,
#                                                          every recipe beside bf16, blocks compiled)
#   bash bench/results/h200_2026-12-02_v/commands.sh 5  -> call5_*  (the checked kernel table again: call 4's had
#                                                          SR's column codes with RHT at 0.106 ms, 0.068 in calls
#                                                          2 and 3 with the same sm_90 code)
# kernels_X.py is made by: git show X:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_X.py;
# kernels_rcp.py is the call's kernels.py so cut, with RN(1 / f) by _rcp_fast also with RHT:
#   sed -i 's/(libdevice.rcp_rn(ff) if RHT else _rcp_fast(ff))/_rcp_fast(ff)/' kernels_rcp.py
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/v}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts  # set s's graph_ab.py
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/commit.txt" 2>&1
case "$c" in
1)  timeout 150 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_874c9b0.py \
        --shapes "None old (1,32,1,False,8) (1,32,1,False,16)" --alone-shapes "None old (1,32,1,False,8)" \
        --out "$out/call1_rows_codes.json" > "$out/call1_rows_codes.txt" 2>&1
    timeout 100 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_874c9b0.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call1_cols_codes.json" > "$out/call1_cols_codes.txt" 2>&1
    timeout 80 $py $here/graph_ab.py --dim 0 --outputs codes --specs MXFP4 --rounds 3 \
        --shapes "None (64,4,4,True) (32,4,1,True,4) (32,8,2,True) (64,4,2,True) (32,4,2,True,2)" \
        --out "$out/call1_cols_codes_e8m0.json" > "$out/call1_cols_codes_e8m0.txt" 2>&1
    for d in -1 0; do
        timeout 80 $py $here/graph_ab.py --dim $d --outputs codes,dequant --specs E2M1,UFP4 --rounds 3 \
            --old kernels_rcp.py --shapes "None old" --alone-shapes "None" \
            --out "$out/call1_rcp_dim${d}.json" > "$out/call1_rcp_dim${d}.txt" 2>&1
    done ;;
esac
case "$c" in
2)  timeout 150 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 3 --old kernels_874c9b0.py \
        --shapes "None old (1,32,1,False,8) (1,32,1,False,16)" --alone-shapes "None old" \
        --out "$out/call2_rows_codes.json" > "$out/call2_rows_codes.txt" 2>&1
    timeout 150 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_874c9b0.py \
        --shapes "None old (64,4,4,True) (64,4,2,True) (32,4,1,True) (32,4,2,True) (64,8,4,True)" --alone-shapes "None" \
        --out "$out/call2_cols_codes.json" > "$out/call2_cols_codes.txt" 2>&1
    for d in -1 0; do
        timeout 80 $py $here/graph_ab.py --dim $d --outputs dequant --rounds 3 --old kernels_874c9b0.py \
            --shapes "None old" --alone-shapes "None" \
            --out "$out/call2_dequant_dim${d}.json" > "$out/call2_dequant_dim${d}.txt" 2>&1
    done ;;
3)  timeout 420 $py bench/results/h200_2026-12-02_v/scripts/carveout_probe.py > "$out/call3_carveout.txt" 2>&1
    timeout 100 $py $here/graph_ab.py --dim -1 --outputs codes --specs MXFP4,NVFP4 --rounds 3 --old kernels_874c9b0.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call3_rows_codes.json" > "$out/call3_rows_codes.txt" 2>&1 ;;
4)  timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call4_kernels_checked.json" \
        > "$out/call4_kernels_checked.txt" 2>&1
    timeout 330 $py bench/train_bench.py --compile blocks --steps 8 --out "$out/call4_dense_blocks.json" \
        > "$out/call4_dense_blocks.txt" 2>&1 ;;
5)  timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call5_kernels_checked.json" \
        > "$out/call5_kernels_checked.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
