#!/usr/bin/env bash
# What set u ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (commit.txt holds the last call's), with an older kernels.py saved at the repo root:
#   bash bench/results/h200_2026-12-02_u/commands.sh 1  -> call1_*  (programs of several tiles unrolled and
#                                                          MXFP4's codes clamped in the packed words, against
#                                                          9d14b53's kernels; row codes tiles; stall reasons)
#   bash bench/results/h200_2026-12-02_u/commands.sh 2  -> call2_*  (row codes at (1, 32, 1) x 4 against
#                                                          9d14b53's; column codes tiles of several tiles a
#                                                          program; the checked kernel table)
#   bash bench/results/h200_2026-12-02_u/commands.sh 3  -> call3_*  (row codes at 2 and 3 tiles a program)
#   bash bench/results/h200_2026-12-02_u/commands.sh 4  -> call4_*  (SR's Philox by wide multiplies against
#                                                          bf89745's kernels; its bits and the SR tests on the
#                                                          GPU; the checked kernel table)
#   bash bench/results/h200_2026-12-02_u/commands.sh 5  -> call5_*  (codes with RHT along columns and of 32-blocks
#                                                          with the block amax from the pairs' maxima, against
#                                                          844293a's kernels)
#   bash bench/results/h200_2026-12-02_u/commands.sh 6  -> call6_tests.txt  (the Philox test on the GPU)
# kernels_X.py is made by: git show X:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_X.py
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/u}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts  # set s's graph_ab.py
u=bench/results/h200_2026-12-02_u/scripts
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/call${c}_smi.txt" 2>&1
case "$c" in
1)  for d in -1 0; do
        timeout 130 $py $here/graph_ab.py --dim $d --outputs codes,dequant --shapes "None old" --alone-shapes "None old" \
            --old kernels_9d14b53.py --rounds 3 --out "$out/call1_dim${d}.json" > "$out/call1_dim${d}.txt" 2>&1
    done
    timeout 100 $py $here/graph_ab.py --dim -1 --outputs codes --specs E2M1,MXFP4,SR --rounds 3 \
        --shapes "None (1,32,1,False,4) (1,64,1,False,4) (1,32,1,False,8) (1,64,2,False,2)" \
        --out "$out/call1_rows_codes.json" > "$out/call1_rows_codes.txt" 2>&1
    metrics="smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active"
    metrics="$metrics,smsp__cycles_active.avg,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum"
    metrics="$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread"
    metrics="$metrics,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    metrics="$metrics,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active"
    timeout 150 ncu --kernel-name _quantize_kernel --launch-skip 4 --launch-count 4 --clock-control none \
        --metrics "$metrics" --csv --page raw $py $u/ncu_codes.py > "$out/call1_ncu.csv" 2> "$out/call1_ncu.err" ;;
2)  timeout 80 $py $here/graph_ab.py --dim -1 --outputs codes --shapes "None old" --alone-shapes "None old" \
        --old kernels_9d14b53.py --rounds 3 --out "$out/call2_rows_codes.json" > "$out/call2_rows_codes.txt" 2>&1
    timeout 100 $py $here/graph_ab.py --dim 0 --outputs codes --specs E2M1,UFP4,NVFP4,SR --rounds 3 \
        --shapes "None (32,4,1,False,2) (32,4,1,True,2) (32,4,1,False,4) (32,2,1,False,4) (16,4,1,False,4)" \
        --out "$out/call2_cols_codes.json" > "$out/call2_cols_codes.txt" 2>&1
    timeout 60 $py $here/graph_ab.py --dim 0 --outputs codes --specs MXFP4 --rounds 3 \
        --shapes "None (32,4,2,True,2) (32,4,1,True,2) (32,4,1,True,4)" \
        --out "$out/call2_cols_codes_e8m0.json" > "$out/call2_cols_codes_e8m0.txt" 2>&1
    timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call2_kernels_checked.json" \
        > "$out/call2_kernels_checked.txt" 2>&1 ;;
3)  timeout 120 $py $here/graph_ab.py --dim -1 --outputs codes --rounds 5 --alone-shapes "None (1,32,1,False,2)" \
        --shapes "None (1,32,1,False,2) (1,32,1,False,3) (1,64,1,False,2)" \
        --out "$out/call3_rows_codes.json" > "$out/call3_rows_codes.txt" 2>&1 ;;
4)  timeout 150 $py -m pytest -q tests/test_kernels.py -k "philox or stochastic or sr_ or several" \
        > "$out/call4_tests.txt" 2>&1
    for d in -1 0; do
        timeout 80 $py $here/graph_ab.py --dim $d --outputs codes,dequant --specs SR --shapes "None old" \
            --alone-shapes "None old" --old kernels_bf89745.py --rounds 5 --out "$out/call4_sr_dim${d}.json" \
            > "$out/call4_sr_dim${d}.txt" 2>&1
    done
    timeout 240 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call4_kernels_checked.json" \
        > "$out/call4_kernels_checked.txt" 2>&1 ;;
5)  for d in 0 -1; do
        timeout 100 $py $here/graph_ab.py --dim $d --outputs codes --shapes "None old" --old kernels_844293a.py \
            --rounds 5 --out "$out/call5_codes_dim${d}.json" > "$out/call5_codes_dim${d}.txt" 2>&1
    done ;;
6)  timeout 150 $py -m pytest -q tests/test_kernels.py -k "philox or test_stochastic_rounding" 2>&1 | tail -3 \
        > "$out/call6_tests.txt"
    nvidia-smi --query-gpu=name --format=csv >> "$out/call6_tests.txt" ;;
esac
