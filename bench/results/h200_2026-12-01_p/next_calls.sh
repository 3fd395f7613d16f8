#!/usr/bin/env bash
# The GPU run that times what set p changed after its last call (tensor_amax_both reads its columns
# as bf16 values again, not timed yet) and runs the GPU tests that set p's calls cut short. From the
# repo root at the commit under test, with the older kernels saved first (no git needed on the GPU):
#   git show 6512357:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_6512357.py
#   bash bench/results/h200_2026-12-01_p/next_calls.sh        (~8 minutes on an H200)
set -u
py=${PYTHON:-python3}; out=${OUT:-runs/p_next}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
here=bench/results/h200_2026-12-01_p/scripts
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null || cat REV > "$out/commit.txt" 2>/dev/null
timeout 150 $py $here/amax_ab.py --old kernels_6512357.py --rounds 5 > "$out/amax_ab.txt" 2>&1
timeout 330 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "amax or words or boundary or compiles" \
    > "$out/tests.txt" 2>&1
