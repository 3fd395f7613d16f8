"""Call 3's profiled program (run from the repo root under ncu, commands.sh): five quantize kernels,
three launches each."""
import sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb
kb.setup(False)
import rht
x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
specs = kb.timed_specs()
for name, dim, out in [("e2m1 fp32 b16 (paper E2M1)", -1, "codes"), ("e2m1 fp32 b16 (paper E2M1)", -1, "dequant"),
                       ("e2m1 e8m0 b32 (MXFP4)", -1, "codes"), ("e2m1 e8m0 b32 (MXFP4)", 0, "codes"),
                       ("e2m1 fp32 b16 (paper E2M1)", 0, "codes")]:
    fn, nb = kb.timing_calls(x, specs[name], dim, out, "alone", signs)
    for _ in range(3):
        fn()
torch.cuda.synchronize()
