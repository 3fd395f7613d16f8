#!/usr/bin/env bash
# The GPU runs that time what set p changed after its last call and run the GPU tests its calls cut
# short. From the repo root at the commit under test, with the older kernels saved first (no git
# needed on the GPU):
#   git show 6512357:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_6512357.py
#   bash bench/results/h200_2026-12-01_p/next_calls.sh 1   (~8 minutes: tensor_amax_both reads its
#       columns as bf16 values again, not timed yet; the GPU tests)
#   bash bench/results/h200_2026-12-01_p/next_calls.sh 2   (~7 minutes: the row tile sweep of the RHT
#       and SR kinds with the two tiles of 4 groups a thread added to kernels_bench.ROW_TILES; compiled
#       for sm_90 they take 5-17% fewer instructions an element than the tiles in use, e.g. E2M1
#       dequant with RHT 24.1 -> 20.9 at (1, 128, 1), with 156 registers against 54)
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/p_next}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-01_p/scripts
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null || cat REV > "$out/commit.txt" 2>/dev/null
case "${1:-1}" in
1)  timeout 150 $py $here/amax_ab.py --old kernels_6512357.py --rounds 5 > "$out/amax_ab.txt" 2>&1
    timeout 330 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "amax or words or boundary or compiles" \
        > "$out/tests.txt" 2>&1 ;;
2)  timeout 540 $py bench/kernels_bench.py --workers 14 --skip-check --sweep-kinds row_codes_heavy,row_heavy \
        --out "$out/sweep_rows.json" > "$out/sweep_rows.txt" 2>&1 ;;
esac
