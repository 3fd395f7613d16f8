#!/usr/bin/env bash
# The commands of the device calls that made this folder's files (2026-12-01, one H200), run from the
# repo root at the commit named in NOTES.md; `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_l}; mkdir -p "$out"; s=bench/results/h200_2026-12-01_l/scripts

# 1 (b149fd6): call1_tests.txt, call1_col_tiles_and_rows.txt, then call1_col_mfirst.txt on a patched kernels.py
timeout 120 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "power_of_two or compiles_for_sm90" > $out/call1_tests.txt 2>&1
timeout 230 $py $s/probe_l.py tiles > $out/call1_col_tiles_and_rows.txt 2>&1
$py $s/mfirst_patch.py    # edits kernels.py in place: restore it afterwards (git checkout kernels.py)
timeout 200 $py $s/probe_l.py mfirst > $out/call1_col_mfirst.txt 2>&1
git checkout kernels.py

# 2 (8976768): call2_tests_cut_by_timeout.txt (stopped by the timeout before its summary)
timeout 200 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    -k "bit_identical_to_reference or power_of_two or compiles_for_sm90 or quantize_into_a_slice" > $out/call2_tests.txt 2>&1

# 3 (8976768): call3_maxnreg.txt, call3_tests.txt
timeout 200 $py $s/probe_maxnreg.py > $out/call3_maxnreg.txt 2>&1
timeout 100 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "power_of_two" > $out/call3_tests.txt 2>&1

# 4 (8976768): call4_kernels.{txt,json}: the sweep, the checks and the table
timeout 560 $py bench/kernels_bench.py --workers 14 --out $out/call4_kernels.json > $out/call4_kernels.txt 2>&1

# 5 (981175a): call5_kernels.{txt,json}: the table at the tiles kernels.py holds (the README's)
timeout 330 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call5_kernels.json > $out/call5_kernels.txt 2>&1

# 6 (714b642, reverted in ef45f96): call6_tests.txt, call6_kernels.{txt,json}
timeout 110 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "philox or stochastic or power_of_two or sr_ or seed or reproducible" > $out/call6_tests.txt 2>&1
timeout 160 $py bench/kernels_bench.py --workers 14 --no-sweep --skip-check --out $out/call6_kernels.json > $out/call6_kernels.txt 2>&1

# Offline (no GPU; the CPU machine's triton 3.6.0): the SASS counts of NOTES.md, for kernels.py as it is and
# with scripts/rcp_fast.patch applied
$py $s/sass_counts.py . e2m1,ufp4,sr
git apply $s/rcp_fast.patch && $py $s/sass_counts.py . e2m1,ufp4,sr; git checkout kernels.py
