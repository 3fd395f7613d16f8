#!/usr/bin/env bash
# What set y ran on the H200 (one GPU), 2026-12-02, from a copy of the repo at the commit NOTES.md gives
# for each call (the commit.txt each call writes is kept here as callN_commit.txt), with variants of that
# commit's kernels.py saved at the repo root:
#   bash bench/results/h200_2026-12-02_y/commands.sh 1  -> call1_*  (row codes and dequant outputs against the
#                                                          same kernels prefetching rows into the L2)
# kernels_pfN.py: the commit's kernels.py cut before its torch.library registrations (sed '/^_LIB = /,$d'),
#   with ROW_PREFETCH = N (1: a program's lines at its start; 2: tile i + 2 while tile i + 1 is loaded;
#   3: the lines of the program ROW_PREFETCH_AHEAD programs on, kernels_pf3_D.py with D);
#   kernels_pf1_l8.py: PF 1 with the row codes kind at 8 tiles a program
#   bash bench/results/h200_2026-12-02_y/commands.sh 2  -> call2_*  (row codes against the same kernels with a
#                                                          register cap on the row codes with RHT)
# kernels_mrN.py: the commit's kernels.py so cut with ROW_RHT_CODES_MAXNREG = N; kernels_mrN_w2.py: and the
#   row codes kind at (1, 64, 2, False, 4); kernels_w2.py: that tile without a cap
#   bash bench/results/h200_2026-12-02_y/commands.sh 3  -> call3_*  (row codes against the same kernels with the
#                                                          tile loop rolled and/or the rare branch cut: code size)
# kernels_roll.py: the commit's kernels.py so cut with loop_unroll_factor=1 for every output; kernels_norare.py:
#   with `rare = False` before `if rare:` (a timing diagnostic only: tiles outside the fast range would
#   come out wrong; none in these random tensors); kernels_norare_roll.py: both
#   bash bench/results/h200_2026-12-02_y/commands.sh 4  -> call4_*  (codes outputs taking the rare steps after
#                                                          the tile's stores: row and column codes against the
#                                                          kernels before, kernels_head.py; the kernel tests of
#                                                          the fast range's edges on the GPU)
#   bash bench/results/h200_2026-12-02_y/commands.sh 5  -> call5_*  (row codes against two timing diagnostics of
#                                                          the rare test)
#   bash bench/results/h200_2026-12-02_y/commands.sh 6  -> call6_*  (the deferred test's kernels: row codes against
#                                                          kernels_head.py; the kernel tests of the fast range's
#                                                          edges on the GPU)
#   bash bench/results/h200_2026-12-02_y/commands.sh 7  -> call7_*  (the checked kernel table)
# kernels_opaque.py: the commit's kernels.py so cut with fp32 scales' rare = nib < 0 (a runtime false: the branch
#   kept, no reduction across the tile); kernels_defer.py: with each group's out-of-range test or-ed into a
#   flag over the program's tiles, rare = False, and one reduction of the flags after the loop guarding a
#   store (where a real kernel would do its tiles again by the reference's steps). Timing only.
#   kernels_deferred.py: the kernel that does so (_quantize_tile, DEFER along rows for codes outputs), as
#   committed after the call
# kernels_head.py: e028189's kernels.py so cut (the kernels of the README's table but two column kinds)
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/y}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-02_s/scripts  # set s's graph_ab.py
cat REV > "$out/commit.txt" 2>/dev/null || git rev-parse --short HEAD > "$out/commit.txt"
c=${1:-1}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> "$out/commit.txt" 2>&1
rows() {  # rows() NAME OUTPUT OLD
    timeout 80 $py $here/graph_ab.py --dim -1 --outputs "$2" --rounds 3 --old "$3" \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/$1.json" > "$out/$1.txt" 2>&1
}
case "$c" in
1)  rows call1_rows_pf1 codes kernels_pf1.py
    rows call1_rows_pf2 codes kernels_pf2.py
    rows call1_rows_pf3_4096 codes kernels_pf3_4096.py
    rows call1_rows_pf3_8192 codes kernels_pf3_8192.py
    rows call1_rows_pf3_2048 codes kernels_pf3_2048.py
    rows call1_rows_pf1_l8 codes kernels_pf1_l8.py
    rows call1_rows_pf1_dequant dequant kernels_pf1.py ;;
2)  for v in mr64 w2 mr56_w2 mr48_w2; do rows call2_rows_$v codes kernels_$v.py; done ;;
3)  for v in roll norare norare_roll; do rows call3_rows_$v codes kernels_$v.py; done ;;
4)  rows call4_rows_codes codes kernels_head.py
    timeout 90 $py $here/graph_ab.py --dim 0 --outputs codes --rounds 3 --old kernels_head.py \
        --shapes "None old" --alone-shapes "None old" \
        --out "$out/call4_cols_codes.json" > "$out/call4_cols_codes.txt" 2>&1
    timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "far_from_one or nonfinite or \
        sr_draws or given_a_smaller or bit_identical_to_reference or several_tiles or fast_range" \
        > "$out/call4_tests.txt" 2>&1 ;;
5)  rows call5_rows_opaque codes kernels_opaque.py
    rows call5_rows_defer codes kernels_defer.py
    rows call5_rows_deferred codes kernels_deferred.py ;;
6)  rows call6_rows_codes codes kernels_head.py
    timeout 45 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "far_from_one and fp32 or once_a_program" \
        > "$out/call6_tests.txt" 2>&1 ;;
7)  timeout 230 $py bench/kernels_bench.py --workers 14 --no-sweep --out "$out/call7_kernels_checked.json" \
        > "$out/call7_kernels_checked.txt" 2>&1 ;;
esac
(cd "$out" && ls *.json > /dev/null 2>&1 && tar czf "call${c}_json.tgz" *.json && rm -f *.json)
