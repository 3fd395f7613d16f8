"""The rowwise quantize kernels with RHT under the CPU interpreter, with the tiles (1, 64, 2) and (1, 32, 1),
against the reference: codes, scales and the rotated dequant, bit for bit. Run from tests/:
python ../bench/results/h200_2026-12-01_n/scripts/tile_check.py"""
import sys

sys.path.insert(0, '.')
import conftest  # noqa: E402,F401  (the interpreter and its exact FMA)
import torch  # noqa: E402

import kernels  # noqa: E402
import quant  # noqa: E402
from test_kernels import SIGNS, assert_same_bits, kernel_args, make_x  # noqa: E402

x = make_x((48, 1056), torch.bfloat16, seed=7)
specs = [quant.QuantSpec("e2m1", 16, "fp32", rht=True), quant.QuantSpec("e1m2", 16, "fp32", rht=True),
         quant.QuantSpec("e2m1", 16, "e4m3", rht=True), quant.QuantSpec("e2m1", 32, "e8m0", rht=True)]
n = 0
for spec in specs:
    ref = quant.quantize(x, spec, -1, signs=SIGNS)
    for tile in ((1, 64, 2), (1, 32, 1)):
        codes, scales, t, dq = kernels.quantize(x, **kernel_args(spec, -1, keep_rotated=True, tile=tile))
        assert_same_bits(codes, ref.codes, f"{spec} {tile} codes")
        assert_same_bits(scales, ref.scales, f"{spec} {tile} scales")
        assert_same_bits(dq, ref.dequantize(keep_rotated=True), f"{spec} {tile} dequant"); n += 1
print("ok", n)
