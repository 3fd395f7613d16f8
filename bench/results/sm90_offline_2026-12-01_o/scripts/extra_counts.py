"""sm_90 instruction counts of the kernels sass_counts.py (set l) leaves out, compiled with no GPU:
the quantize kernel's dequant output rotated back (fake_quantize with RHT), main path an element
(tiles as sass_counts'), and the RHT tensor-amax passes (whole kernel: fast and exact loops).

  python extra_counts.py REPO     (REPO: the checkout whose kernels.py to compile)
"""
import sys

import torch
import triton

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/bench/results/h200_2026-12-01_l/scripts")
import kernels  # noqa: E402
import sass_counts as sc  # noqa: E402

TARGET = triton.backends.compiler.GPUTarget("cuda", 90, 32)
HINTS = {(i,): [["tt.divisibility", 16]] for i in range(10)}


def words(colwise, m, rht):  # how the checkout reads bf16 x (columns as words since d34b9ef)
    f = getattr(kernels, "_col_words", None)
    return "*i32" if not colwise or (f and f(colwise, torch.bfloat16, m, rht)) else "*bf16"


def compile_(fn, sig, ce, nw):
    return triton.compile(triton.compiler.ASTSource(fn, sig, ce, HINTS), target=TARGET,
                          options=dict(num_warps=nw, enable_fp_fusion=False))


def rotated_back(name, dim):
    spec, tile = sc.SPECS[name], sc.TILES[(dim, "dequant")]
    p = kernels._plan((8192, 8192), torch.bfloat16, False, tuple(spec.levels), spec.block, spec.scale,
                      spec.rounding == "sr", True, False, dim, torch.bfloat16, False, False, True, tile, True, 0)
    types = [words(p.colwise, p.M, True), "*bf16", "*fp32", "*fp32", "*fp32",
             "*i32" if spec.scale == "e4m3" else "*fp32", "*fp32", "*fp32", "i32", "i32", "i32"]
    names = kernels._quantize_kernel.arg_names
    ce = dict(zip(names[len(types):], (False,) + p.constexprs))
    k = compile_(kernels._quantize_kernel, dict(zip(names, types), **{n: "constexpr" for n in ce}), ce,
                 dict(p.options)["num_warps"])
    regs, n, _ = sc.main_path(k.asm["cubin"])
    return regs, n * 32 * tile[2] / (tile[0] * tile[1] * 16)


def total(k):
    return sum(sc.main_path(k.asm["cubin"])[2].values())


if __name__ == "__main__":
    for name in ("e2m1", "ufp4", "nvfp4", "mxfp4", "sr"):
        for dim in (-1, 0):
            regs, per = rotated_back(name, dim)
            print(f"{name:6s} dim {dim:2d} rht 1 dequant rotated back  regs {regs:>3} main-path instructions an element {per:5.2f}")
    names = kernels._amax_rht_kernel.arg_names
    for colwise, (bm, ng, nw) in ((False, (1, 256, 4)), (True, (64, 4, 4))):
        sig = dict(zip(names, [words(colwise, 8192, True), "*fp32", "*i32", "i32", "i32"]),
                   **{n: "constexpr" for n in names[5:]})
        ce = dict(zip(names[5:], (bm, ng, colwise, False, False, 8192 if colwise else 0)))
        print(f"_amax_rht_kernel colwise {colwise!s:5s} tile ({bm}, {ng}, {nw})  main-path instructions {total(compile_(kernels._amax_rht_kernel, sig, ce, nw))}")
    names = kernels._amax_both_kernel.arg_names
    for row_rht in (False, True):
        sig = dict(zip(names, ["*i32", words(True, 8192, True), "*fp32", "*i32", "i32"]),
                   **{n: "constexpr" for n in names[5:]})
        ce = dict(zip(names[5:], (64, 64, False, False, row_rht, 8192, True)))
        print(f"_amax_both_kernel row_rht {row_rht!s:5s} tile (64, 64, 4)  main-path instructions {total(compile_(kernels._amax_both_kernel, sig, ce, 4))}")
