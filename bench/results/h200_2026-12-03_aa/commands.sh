#!/usr/bin/env bash
# What set aa ran on the H200 (one GPU), 2026-12-03, from a copy of the repo at the commit NOTES.md gives
# for each call (kept as callN_commit.txt):
#   bash bench/results/h200_2026-12-03_aa/commands.sh 1  -> call1_*  (the checked kernel table, its separate
#                                                           RHT a bf16 GEMM with H' instead of rht.rht)
#   bash bench/results/h200_2026-12-03_aa/commands.sh 2  -> call2_*  (row codes, the tiles outside the fast range
#                                                           redone out of line, against kernels_head.py; the
#                                                           kernel tests of the fast range on the GPU)
#   bash bench/results/h200_2026-12-03_aa/commands.sh 3  -> call3_*  (row codes with the fast-range test once a
#                                                           program, its tiles redone after the loop (rolled),
#                                                           and the same without the redo (a timing diagnostic,
#                                                           kernels_defer_diag.py), against kernels_head.py)
#   bash bench/results/h200_2026-12-03_aa/commands.sh 4  -> call4_*  (the kernel tests of programs of several tiles,
#                                                           those outside the fast range among them, on the GPU)
# kernels_defer_diag.py: the experiment's kernels.py (scripts/defer.patch) with the redo loop replaced by a store
#   (scripts/defer_diag.patch; timing only), cut before its registrations
# kernels_head.py: 640aee0's kernels.py (the README table's kernels) cut before its torch.library
#   registrations (sed '/^_LIB = /,$d'), saved at the repo root
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/aa}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
c=${1:-1}
cat REV > "$out/call${c}_commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/call${c}_commit.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/call${c}_commit.txt" 2>&1
case "$c" in
1)  timeout 300 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call1_kernels_checked.json" \
        > "$out/call1_kernels_checked.txt" 2>&1 ;;
2)  timeout 150 $py bench/results/h200_2026-12-02_s/scripts/graph_ab.py --dim -1 --outputs codes --rounds 3 \
        --old kernels_head.py --shapes "None old" --alone-shapes "None old" --out "$out/call2_rows_codes.json" \
        > "$out/call2_rows_codes.txt" 2>&1
    timeout 240 $py -m pytest -q -x tests/test_kernels.py -p no:cacheprovider \
        -k "far_from_one or out_of_the_fast_range_among or several_tiles or sr_draws" > "$out/call2_tests.txt" 2>&1 ;;
3)  for v in head defer_diag; do
        timeout 150 $py bench/results/h200_2026-12-02_s/scripts/graph_ab.py --dim -1 --outputs codes --rounds 3 \
            --old kernels_$v.py --shapes "None old" --alone-shapes "None old" --out "$out/call3_rows_$v.json" \
            > "$out/call3_rows_$v.txt" 2>&1
    done
    timeout 200 $py -m pytest -q -x tests/test_kernels.py -p no:cacheprovider \
        -k "far_from_one or out_of_the_fast_range_among or several_tiles" > "$out/call3_tests.txt" 2>&1 ;;
4)  timeout 240 $py -m pytest -q tests/test_kernels.py -p no:cacheprovider \
        -k "out_of_the_fast_range_among or several_tiles or far_from_one" > "$out/call4_tests.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
