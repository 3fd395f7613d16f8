"""Profiled program for Nsight Compute (run from the repo root, commands.sh): quantize kernels with RHT
fused, codes output, one warm-up and one profiled launch each (the warm-ups compile)."""
import sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb  # noqa: E402
kb.setup(False)
import rht  # noqa: E402
x = kb.make_x(8192, 8192, 4, "cuda")
signs = rht.random_signs(0).cuda()
specs = kb.timed_specs()
cases = [("e2m1 fp32 b16 (paper E2M1)", -1), ("e2m1 e8m0 b32 (MXFP4)", -1), ("e1m2 fp32 b16 SR (UFP4 dY)", -1),
         ("e2m1 fp32 b16 (paper E2M1)", 0)]
fns = [kb.timing_calls(x, specs[name], dim, "codes", "fused_rht", signs)[0] for name, dim in cases]
for fn in fns:  # compiled, not profiled (ncu's --launch-skip)
    fn()
torch.cuda.synchronize()
for fn in fns:
    fn()
torch.cuda.synchronize()
