#!/usr/bin/env bash
# The commands of the 5 device calls that made this folder's files (2026-11-30), run from the repo root
# at the commit named (a clean `git archive` of it); `py` = python3 on the device.
py=${PYTHON:-python3}; out=${OUT:-runs/h200_e}; mkdir -p "$out"

# 1 (working tree between d03e98d and beb5340): call1_*
timeout 200 $py -m pytest -q -x tests/test_kernels.py -k "bit_identical or nonfinite or e4m3_scale or fast or seed or pack or dequantize or sr_mean or amax or qlinear or stochastic"
$py bench/kernels_bench.py --out $out/kernels.json

# 2 (at beb5340): call2_*
$py bench/kernels_bench.py --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json
timeout 100 $py -m pytest -q -x tests/test_kernels.py -k "bit_identical or nonfinite or pack or qlinear"

# 3 (at d008c12): call3_*
timeout 120 $py -m pytest -q -x tests/test_kernels.py -k "pair or pack_saved or qlinear"
$py bench/kernels_bench.py --skip-check --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json

# 4 (at b3f2031): call4_*
timeout 90 $py -m pytest -q tests/test_kernels.py -k "pack_saved or qlinear or nonfinite or seed"
$py bench/kernels_bench.py --out $out/kernels.json
$py bench/train_bench.py --compile blocks --steps 8 --out $out/dense.json

# 5 (at b3f2031): call5_sr_tiles.txt, UFP4's dY spec per tile (kernels_bench.timing_calls with a tile)
$py - <<'PY'
import sys; sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import torch, triton, rht
import kernels_bench as kb
kb.setup(False)
x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
copy = 2 * buf.numel() * 2 / triton.testing.do_bench(lambda: dst.copy_(buf), warmup=25, rep=100, return_mode="median") / 1e6
spec = kb.timed_specs()["e1m2 fp32 b16 SR (UFP4 dY)"]
for dim, tiles in ((-1, [(1, 128, 4), (1, 64, 1), (1, 128, 2)]), (0, [(128, 2, 4), (64, 4, 4)])):
    for tile in tiles:
        for var in ("alone", "fused_rht"):
            fn, nbytes = kb.timing_calls(x, spec, dim, "dequant", var, signs, tile)
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(dim, tile, var, ms, 100 * nbytes / ms / 1e6 / copy)
PY
