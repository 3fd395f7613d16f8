#!/usr/bin/env bash
# The commands of the device calls that made this folder's files (2026-12-01, one H200), run from the
# repo root at the commit named in NOTES.md; `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_k}; mkdir -p "$out"; s=bench/results/h200_2026-12-01_k/scripts

# 1: call1_kernels_persistent_sweep.txt (at e881530: the tile lists with persistent tiles; stopped by its
#    400 s limit inside the tile sweep)
timeout 400 $py bench/kernels_bench.py --workers 14 --skip-check --out $out/kernels.json > $out/kernels.txt 2>&1

# 2: call2_persistent_probe.txt (at e881530): E2M1 fp32 b16, quantize alone, do_bench (zeroed L2)
timeout 100 $py - <<'PY'
import sys, time, torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb
kb.setup(False)
import kernels, quant, rht
x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
spec = kb.timed_specs()["e2m1 fp32 b16 (paper E2M1)"]
for dim, tiles in ((-1, [None, (1, 64, 1), (1, 32, 1, 16), (1, 64, 1, 8)]), (0, [None, (64, 4, 4, 3), (16, 4, 1, 16)])):
    for tile in tiles:
        for out in ("codes", "dequant"):
            t0 = time.time()
            fn, nb = kb.timing_calls(x, spec, dim, out, "alone", signs, tile)
            fn(); torch.cuda.synchronize(); t1 = time.time()
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(dim, tile, out, f"first call {t1-t0:.1f} s, {ms:.4f} ms, {100*nb/ms/1e6/4225:.1f} %copy", flush=True)
PY

# 3: call3_ncu.csv (at 005c4b0): Nsight Compute (its default clock control: SM at base 1.47 GHz) on 15
#    quantize launches: E2M1 fp32 codes rows, E2M1 dequant rows, MXFP4 codes rows, MXFP4 codes columns,
#    E2M1 codes columns, 3 launches each (scripts/ncu_one.py)
ncu --kernel-name _quantize_kernel --launch-count 15 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --csv --page details \
    $py $s/ncu_one.py > $out/ncu.csv

# 4-6: call5_tma_probe_do_bench.txt, call6_tma_probe_cudagraph.txt (at 005c4b0 with $s/tma_rows.patch
#    applied: rows loaded by TMA tensor descriptors; call 4 failed on a launch-argument count, fixed in the
#    patch). scripts/probes.py holds the probes as they ran (calls 5, 6 and 8 were two scripts, joined
#    here; they printed 'x plain' where it prints 'x first'). Call 6 timed in CUDA graphs; its copy GB/s
#    is a graph memcpy node, not comparable
timeout 330 $py $s/probes.py tma        # call 5; call 6: probes.py tma-graph

# 7: call7_kernels.{txt,json} (at c00de2c: bench() flushes the L2 by a read; the README's table)
timeout 420 $py bench/kernels_bench.py --workers 14 --out $out/kernels.json > $out/kernels.txt 2>&1

# 8: call8_col_probe.txt (at c00de2c): column codes tiles (stopped by its 200 s limit in the last spec)
timeout 200 $py $s/probes.py col

# 9: call9_sr_tile_test.txt (1b4d37b's kernels.py with an earlier form of the test, which put the tiny groups
#    in the same tiles under both tile shapes; then c00de2c's kernels.py with the same test)
timeout 100 $py -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "do_not_depend"
