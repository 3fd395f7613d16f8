"""Probe: Inductor launching the quantize kernel itself (torch.library.triton_op + wrap_triton) instead of
calling the nanofp4::fake_quantize operator's Python on every call. For fp32-scale recipes (ufp4, e2m1)
with pack_saved=false, whose compiled graphs use fake_quantize only.

    TRITON_DEFAULT_FP_FUSION=0 python bench/inductor_launch_probe.py [--steps 40]

TRITON_DEFAULT_FP_FUSION=0: Inductor compiles a user kernel with Triton's default for FP fusion (it sets it
only for its own kernels); the kernels' bits need it off. Prints, in one process: the small step without CUDA
graphs, bf16, ufp4 through the operator (as shipped), ufp4 through the probe's triton_op; and whether the
two ufp4 models give the same losses bit for bit over the timed steps.
"""
import argparse
import os
import sys
import time

import torch
from torch.library import triton_op, wrap_triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kernels  # noqa: E402
import model as model_lib  # noqa: E402
import quant  # noqa: E402


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


def run(recipe: str, steps: int, batch: int, seq: int):
    torch.manual_seed(0)
    torch._dynamo.reset()
    cfg = model_lib.get_config("small", seq_len=seq)
    with torch.device("meta"):
        m = model_lib.Transformer(cfg)
    m.to_empty(device="cuda")
    m.init_weights()
    r = quant.recipe_from_overrides(recipe, pack_saved="false") if recipe != "bf16" else quant.RECIPES["bf16"]
    quant.convert(m, r)
    m.compile()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=g)
    y = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=g)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            _, loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(5):  # compiles, warms up
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses = [step() for _ in range(steps)]  # no sync inside: the host runs ahead as in training
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps, torch.stack(losses).float().cpu()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--recipe", default="ufp4")
    a = ap.parse_args()
    print(f"TRITON_DEFAULT_FP_FUSION={os.environ.get('TRITON_DEFAULT_FP_FUSION')}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}", flush=True)
    bf16, _ = run("bf16", a.steps, a.batch, a.seq)
    print(f"bf16 {bf16:.1f} ms", flush=True)
    shipped, l1 = run(a.recipe, a.steps, a.batch, a.seq)
    print(f"{a.recipe} via the operator {shipped:.1f} ms ({shipped / bf16:.3f}x bf16)", flush=True)
    use_probe()
    probe, l2 = run(a.recipe, a.steps, a.batch, a.seq)
    print(f"{a.recipe} via triton_op {probe:.1f} ms ({probe / bf16:.3f}x bf16)", flush=True)
    same = int((l1.view(torch.int32) == l2.view(torch.int32)).sum())
    print(f"losses equal bit for bit at {same} of {len(l1)} steps; first {l1[0].item()!r} vs {l2[0].item()!r}",
          flush=True)


if __name__ == "__main__":
    main()
