"""Host-side cost of one quantize call: what a small model's FP4 step pays per operand when the GPU
work is too small to hide it (moe-small runs ~700 quantize calls a step).

    python bench/launch_bench.py [--rows 256] [--calls 2000]

On a [rows, 512] bf16 tensor (microseconds of GPU work), times `calls` back-to-back calls of each
layer of the call path, then synchronizes: host microseconds per call, median of 5 repeats.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kernels  # noqa: E402
import quant  # noqa: E402
import rht  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def launch_rows(x, levels, signs) -> list:
    """The launch alone of the kernel kernels.fake_quantize ran above (its kept compiled kernel, the same
    arguments): through Triton's per-call wrapper (compiled[grid](*args)), and through kernels._launch
    (Triton's launcher, directly)."""
    seen = []
    launch = kernels._launch  # seen: the launch's arguments; launched as usual, so the compiled kernel is kept
    kernels._launch = lambda *a: (seen.append(a), launch(*a))
    try:
        kernels.fake_quantize(x, levels=tuple(levels), block=16, scale_mode="fp32", rht_signs=signs, keep_rotated=True)
    finally:
        kernels._launch = launch
    kernel, grid, interpret, options, key, a = seen[0]
    if key not in kernels._COMPILED:
        print("(NANOFP4_FAST_LAUNCH=0 keeps no compiled kernel: the launch rows are left out)")
        return []
    c, pos = kernels._COMPILED[key][0], [a[n] for n in kernel.arg_names]
    return [("  its launch, Triton's wrapper: compiled[grid](*args)", lambda: c[grid + (1,) * (3 - len(grid))](*pos)),
            ("  its launch, kernels._launch", lambda: launch(kernel, grid, interpret, options, key, a))]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("launch_bench.py needs a CUDA GPU")
    x = torch.randn(args.rows, 512, device="cuda", dtype=torch.bfloat16)
    signs = rht.random_signs(0).to(x.device)
    spec = quant.RECIPES["ufp4"].fprop_x  # e1m2, fp32 scales, 16-blocks, RHT, RTNE
    sr = quant.RECIPES["ufp4"].dgrad_dy
    levels = list(spec.levels)
    quant.set_backend("triton")
    rows = [
        ("x * 2 (one PyTorch elementwise kernel)", lambda: x * 2),
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("kernels.fake_quantize (direct)", lambda: kernels.fake_quantize(
            x, levels=tuple(levels), block=16, scale_mode="fp32", rht_signs=signs, keep_rotated=True)),
        ("torch.ops.nanofp4.fake_quantize (the operator)", lambda: torch.ops.nanofp4.fake_quantize(
            x, levels, 16, "fp32", False, signs, False, -1, -1, True)),
        ("quant.fake_quantize, RTNE", lambda: quant.fake_quantize(x, spec, signs=signs, keep_rotated=True)),
        ("quant.fake_quantize, SR", lambda: quant.fake_quantize(x, sr, signs=signs, keep_rotated=True)),
        ("quant.fake_quantize, columns", lambda: quant.fake_quantize(x, spec, 0, signs=signs, keep_rotated=True)),
    ]
    rows += launch_rows(x, levels, signs)
    print(f"host microseconds per call, [{args.rows}, 512] bf16, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    for name, fn in rows:
        print(f"{per_call_us(fn, args.calls):8.1f}  {name}", flush=True)


if __name__ == "__main__":
    main()
