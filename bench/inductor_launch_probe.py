"""Probe: Inductor launching the quantize kernel itself (torch.library.triton_op + wrap_triton) instead of
calling the nanofp4::fake_quantize operator's Python on every call. For fp32-scale recipes (ufp4, e2m1)
with pack_saved=false, whose compiled graphs use fake_quantize only.

    TRITON_DEFAULT_FP_FUSION=0 python bench/inductor_launch_probe.py [--steps 40]

TRITON_DEFAULT_FP_FUSION=0: Inductor compiles a user kernel with Triton's default for FP fusion (it sets it
only for its own kernels); the kernels' bits need it off. Prints, in one process: the small step without CUDA
graphs (bench/train_bench.py's step), bf16, ufp4 through the operator (as shipped), ufp4 through the
probe's triton_op; and whether the two ufp4 runs end on the same loss, bit for bit.
"""
import argparse
import os
import sys

import torch
from torch.library import triton_op, wrap_triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kernels  # noqa: E402
import train_bench  # noqa: E402  (bench/: this file's folder)


@triton_op("nanofp4_probe::fake_quantize", mutates_args=())
def probe_fake_quantize(x: torch.Tensor, levels: list[float], block: int, scale_mode: str, sr: bool,
                        signs: torch.Tensor | None, block_2d: bool, dim: int, seed: int, keep_rotated: bool,
                        seed_t: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.fake_quantize for fp32 scales, traceable: no data_ptr, the launch through wrap_triton."""
    x = x.contiguous()
    if x.storage_offset() % 2:  # rows are read as words of two elements
        x = x.clone()
    p = kernels._plan(tuple(x.shape), x.dtype, False, tuple(levels), block, scale_mode, sr, signs is not None,
                      block_2d, dim, x.dtype, keep_rotated, False, True, None, True, 0)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    tscale = torch.empty((), dtype=torch.float32, device=x.device)
    xk = (x.view(torch.int16) if x.dtype == torch.bfloat16 else x) if p.colwise else \
        x.view(torch.int32 if x.dtype == torch.bfloat16 else torch.int64)
    # pointers the kernel neither reads nor writes here get x (read-only), so that no written buffer is aliased
    args = dict(x_ptr=xk, out_ptr=out, codes_ptr=xk, scales_ptr=xk,
                signs_ptr=xk if signs is None else signs.to(torch.float32), amax_ptr=xk, tscale_ptr=tscale,
                seed_ptr=xk if seed_t is None else seed_t, M=p.M, K=p.K, seed=0 if seed_t is not None else seed,
                SEED_PTR=seed_t is not None, **p.constexprs)
    wrap_triton(kernels._quantize_kernel)[p.grid](**args, num_warps=dict(p.options)["num_warps"])
    return out


def use_probe():
    """quant's traced calls of nanofp4::fake_quantize go to the probe's operator instead."""
    shipped = kernels.fake_quantize_op

    def op(x, levels, block, scale_mode, sr, signs, block_2d, dim, seed, keep_rotated, seed_t=None, amax=None):
        if not torch.compiler.is_compiling() or scale_mode != "fp32" or amax is not None:
            return shipped(x, levels, block, scale_mode, sr, signs, block_2d, dim, seed, keep_rotated, seed_t, amax)
        if sr and seed < 0 and seed_t is None:
            seed_t = torch.randint(2**31 - 1, (1,), dtype=torch.int32, device=x.device)
        return torch.ops.nanofp4_probe.fake_quantize(x, list(levels), block, scale_mode, sr, signs, block_2d, dim,
                                                     seed, keep_rotated, seed_t)
    kernels.fake_quantize_op = op


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--recipe", default="ufp4")
    a = ap.parse_args()
    # train_bench's step (fresh model, seed 0, the same random tokens), whole model compiled, no CUDA graphs
    args = argparse.Namespace(preset="small", batch=a.batch, seq=a.seq, steps=a.steps, warmup=3, compile="full",
                              quant={"pack_saved": "false"}, profile=0, host_profile=0)
    print(f"TRITON_DEFAULT_FP_FUSION={os.environ.get('TRITON_DEFAULT_FP_FUSION')}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}", flush=True)
    bf16 = train_bench.run_one(args, "bf16", compile_mode="default")
    shipped = train_bench.run_one(args, a.recipe, compile_mode="default")
    use_probe()
    probe = train_bench.run_one(args, a.recipe, compile_mode="default")
    for name, r in (("bf16", bf16), (f"{a.recipe} via the operator", shipped), (f"{a.recipe} via triton_op", probe)):
        ratio = r["step_ms"] / bf16["step_ms"]
        print(f"{name:<24} {r['step_ms']:7.1f} ms  {ratio:.3f}x bf16  host {r['host_ms']:.1f} ms")
    print(f"the two {a.recipe} runs' last losses: {shipped['loss']!r} and {probe['loss']!r} "
          f"({'the same' if shipped['loss'] == probe['loss'] else 'DIFFERENT'})", flush=True)


if __name__ == "__main__":
    main()
