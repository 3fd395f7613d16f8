"""Tests for kernels.py: the fused Triton quantizer against the PyTorch reference (quant.py).

Deterministic rounding must give the reference's bits for every spec — grid x scale mode x block
(16, 32, 16x16 tiles) x RHT x orientation (rows, columns) x input dtype: packed codes, stored
scales, tensor scale and the dequantized tensor (NaN is compared as NaN), on small odd shapes with
zero blocks, negative zeros and tiny and huge magnitudes. Stochastic rounding is checked
statistically. Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 is set
below, before triton is imported); the reference always runs on the CPU (it is the spec).
"""
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
import quant  # noqa: E402
import rht  # noqa: E402
from conftest import full_unless  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and "Interpreted" not in type(kernels._quantize_kernel).__name__:
    raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; run this file alone or "
                       "export TRITON_INTERPRET=1")

SIGNS = rht.random_signs(7)
GRIDS = [("e2m1", None), ("e1m2", None), ("int4", None), ("e2m1", 2.0)]
BLOCKS = [(16, False, False), (16, False, True), (32, False, False), (32, False, True), (16, True, False)]
ROW_SHAPES = {16: [(17, 96), (3, 48), (1, 16)], 32: [(17, 96), (1, 32), (3, 64)]}
COL_SHAPES = {16: [(48, 17), (16, 40), (32, 1)], 32: [(96, 5), (32, 40), (64, 1)]}
TILE_SHAPES = [(32, 48), (16, 16), (48, 32)]


def make_x(shape, dtype, seed):
    """Rows of very different magnitudes, a zero block along either dim, negative zeros, and
    tiny (1e-30) and huge (1e25) values."""
    g = torch.Generator().manual_seed(seed)
    r, c = shape
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(r, 1, generator=g))
    x[0, :16] = 0.0
    x[: min(r, 16), 0] = 0.0
    x[0, 1:5] = -0.0
    x[-1, -5:] *= 1e25
    if r > 2:
        x[2] *= 3e-39  # subnormal
    if c > 2:
        x[:, 2] *= 3e-39
    if c >= 48:
        x[:, 32:48] *= 1e-3
    return x.to(dtype)


def kernel_args(spec, dim, **kw):
    return dict(levels=spec.levels, block=spec.block, scale_mode=spec.scale, sr=spec.rounding == "sr",
                rht_signs=SIGNS.to(DEV) if spec.rht else None, block_2d=spec.block_2d, dim=dim, **kw)


def assert_same_bits(got, want, what):
    """Equal shape, dtype and bits; floating NaNs only need to be NaN in both."""
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
    if got.dtype == torch.float8_e4m3fn:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if got.is_floating_point():
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), f"{what}: NaN positions differ"
        ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[got.dtype]
        got, want = (torch.where(nan, 0, t).view(ints) for t in (got, want))
    bad = (got != want).nonzero()
    assert len(bad) == 0, (f"{what}: {len(bad)} of {got.numel()} differ, first at {tuple(bad[0].tolist())}: "
                           f"got {got[tuple(bad[0])].item()}, want {want[tuple(bad[0])].item()}")


# every grid and every scale mode once by default; all pairs with --full
@pytest.mark.parametrize("grid,max_level,scale", full_unless(
    [("e2m1", None, "e8m0"), ("e1m2", None, "fp32"), ("int4", None, "e4m3"), ("e2m1", 2.0, "fp32")],
    [(g, m, s) for g, m in GRIDS for s in ("fp32", "e4m3", "e8m0")]))
def test_bit_identical_to_reference(grid, max_level, scale):
    """Codes, scales, tensor scale and dequant (kept rotated and rotated back) equal the reference, and
    so do the codes and scales of the kernel without the dequant output."""
    case = 0
    for block, block_2d, use_rht in BLOCKS:
        spec = quant.QuantSpec(grid, block, scale, "rtne", use_rht, block_2d, max_level)
        for dim in (-1, 0):
            case += 1
            shapes = TILE_SHAPES if block_2d else (ROW_SHAPES if dim == -1 else COL_SHAPES)[block]
            shape = shapes[(case + len(grid)) % len(shapes)]
            dtype = (torch.bfloat16, torch.float32)[(case + case // 2) % 2]
            x = make_x(shape, dtype, seed=case)
            what = f"{spec} dim={dim} {dtype} {shape}"
            ref = quant.quantize(x, spec, dim, signs=SIGNS)
            codes, scales, t, dq = kernels.quantize(x.to(DEV), **kernel_args(spec, dim, keep_rotated=True))
            assert_same_bits(codes, ref.codes, what + " codes")
            assert_same_bits(scales, ref.scales, what + " scales")
            assert_same_bits(t, ref.tensor_scale, what + " tensor scale")
            assert_same_bits(dq, ref.dequantize(keep_rotated=True), what + " dequant")
            codes, scales, _, _ = kernels.quantize(x.to(DEV), **kernel_args(spec, dim, want_dequant=False))
            assert_same_bits(codes, ref.codes, what + " codes without dequant")
            assert_same_bits(scales, ref.scales, what + " scales without dequant")
            if use_rht:  # rotated back, fp32 output
                dq = kernels.fake_quantize(x.to(DEV), **kernel_args(spec, dim, out_dtype=torch.float32))
                assert_same_bits(dq, ref.dequantize(torch.float32), what + " dequant rotated back")


@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
@pytest.mark.parametrize("use_rht", [False, True])
def test_nonfinite_blocks_dequantize_to_nan(scale, use_rht):
    x = make_x((4, 64), torch.float32, seed=3)
    x[0, 35], x[1, 3], x[2, 60], x[3, 16:32] = float("nan"), float("inf"), -float("inf"), float("nan")
    x[1, 20], x[1, 29] = float("inf"), -float("inf")  # rotated: Inf - Inf (NaN) and ±Inf in one group
    spec = quant.QuantSpec("e2m1", 16, scale, rht=use_rht)
    ref = quant.quantize(x, spec, signs=SIGNS)
    codes, scales, t, dq = kernels.quantize(x.to(DEV), **kernel_args(spec, -1, out_dtype=torch.float32))
    bad = torch.zeros(4, 4, dtype=torch.bool)
    bad[0, 2] = bad[1, 0] = bad[1, 1] = bad[2, 3] = bad[3, 1] = True
    assert torch.equal(torch.isnan(dq.cpu()).unflatten(1, (4, 16)).all(-1), bad)
    assert torch.equal(torch.isnan(dq.cpu()).unflatten(1, (4, 16)).any(-1), bad)
    assert_same_bits(dq, ref.dequantize(torch.float32), "dequant")
    assert_same_bits(scales, ref.scales, "scales")
    assert_same_bits(t, ref.tensor_scale, "tensor scale")
    byte_bad = bad.repeat_interleave(8, dim=1)
    # a NaN's sign after RHT arithmetic is not defined, so with RHT only the level bits must agree
    sign_mask = 0x77 if use_rht else 0xFF
    assert_same_bits(torch.where(byte_bad, codes.cpu() & sign_mask, codes.cpu()),
                     torch.where(byte_bad, ref.codes & sign_mask, ref.codes), "codes")
    assert ((codes.cpu() & 0x77)[byte_bad] == 0).all()


@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
@pytest.mark.parametrize("magnitude", full_unless([1e-36, 3e37], [1e-36, 1e-28, 1e30, 5e36, 3e37]))
def test_whole_tensor_far_from_one_is_bit_identical(scale, magnitude):
    """Tensors whose every block scale (and e4m3's tensor scale) lies outside or at the edge of the
    kernels' fast division range [2**-98, 2**123] take the reference's steps, with the same bits; so
    do the codes without the dequant output (e8m0 with RHT: the level lines of x times block factors
    down to 2**-128, with no reference steps)."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(32, 48, generator=g) * magnitude).clamp(-3e38, 3e38)
    x[1, :16] *= 100.0
    for use_rht in (False, True):
        spec = quant.QuantSpec("e1m2" if scale == "fp32" else "e2m1", 16, scale, rht=use_rht)
        for dim in (-1, 0):
            ref = quant.quantize(x, spec, dim, signs=SIGNS)
            codes, scales, t, dq = kernels.quantize(x.to(DEV), **kernel_args(spec, dim, keep_rotated=True))
            what = f"{spec} dim={dim} x~{magnitude}"
            assert_same_bits(codes, ref.codes, what + " codes")
            assert_same_bits(scales, ref.scales, what + " scales")
            assert_same_bits(t, ref.tensor_scale, what + " tensor scale")
            assert_same_bits(dq, ref.dequantize(keep_rotated=True), what + " dequant")
            codes, scales, _, _ = kernels.quantize(x.to(DEV), **kernel_args(spec, dim, want_dequant=False))
            assert_same_bits(codes, ref.codes, what + " codes without dequant")
            assert_same_bits(scales, ref.scales, what + " scales without dequant")


def test_the_interpreters_fma_is_fused():
    """The CPU tests run the GPU's fast division only if tl.fma rounds once (tests/conftest.py): a
    product just below a midpoint, which rounding the sum twice would carry over to the even float."""
    from conftest import fused_fma_f32
    x = np.array([1 + 2**-18, 1 + 2**-18], np.float32)
    y = np.array([2**-24 * (1 - 2**-18), 2**-24 * (1 + 2**-18)], np.float32)
    z = np.array([1 + 2**-23, 1.0], np.float32)
    assert (x.astype(np.float64) * y + z).astype(np.float32)[0] == np.float32(1 + 2**-22)  # twice
    assert fused_fma_f32(x, y, z).tolist() == [np.float32(1 + 2**-23)] * 2
    g = np.random.default_rng(0)
    a, b, c = (g.standard_normal(1000).astype(np.float32) for _ in range(3))
    want = [_rn32(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r))) for p, q, r in zip(a, b, c)]
    assert fused_fma_f32(a, b, c).tolist() == want
    assert kernels.INTERPRET_FAST_DIV or DEV == "cuda"



def test_bf16_division_in_one_fma_is_exact():
    """The kernels divide bf16 x (not rotated) by a fp32 block scale s = RN(amax / g) as
    RN(x * r + RN(x * z)), r = RN(1 / s), z = RN(RN(1 - s * r) * r) (kernels' module doc). Every bf16
    mantissa of x against every s of a bf16 amax mantissa gives RN(x / s) (and s = RN(amax / g) itself
    comes the same way from RN(1 / g)), for g = k * 2**j with odd k
    up to 7 (every g_max the kernels take: powers of two scale every step exactly). It is no theorem:
    some other fp32 s (s = 1.6581196, x = 1) need the two-correction division. The kernel itself, on
    blocks holding each amax mantissa and every x mantissa, gives the reference's codes."""
    from conftest import fused_fma_f32
    m = 1 + np.arange(128) / 128
    x = np.concatenate([m, 2 * m, 4 * m]).astype(np.float32)[:, None]
    for g in (1.0, 3.0, 5.0, 7.0, 6.0, 3.5):
        s = (m / g).astype(np.float32)[None, :]
        r = (1 / s.astype(np.float64)).astype(np.float32)
        z = (fused_fma_f32(-s, r, np.ones_like(s)).astype(np.float64) * r).astype(np.float32)
        xs, rs = np.broadcast_arrays(x, r)
        y = fused_fma_f32(xs, rs, (xs.astype(np.float64) * z).astype(np.float32))
        assert np.array_equal(y, (xs.astype(np.float64) / s).astype(np.float32)), g
        rg, a = np.float32(1 / g), m.astype(np.float32)          # the block scale amax / g itself
        zg = np.float32(np.float64(fused_fma_f32(np.float32([-g]), np.float32([rg]), np.ones(1, np.float32))[0]) * rg)
        sg = fused_fma_f32(a, np.full_like(a, rg), (a.astype(np.float64) * zg).astype(np.float32))
        assert np.array_equal(sg, s[0]), g
    s, x1 = np.float32(1.6581196), np.float32(1.0)
    r = np.float32(1 / np.float64(s))
    z = np.float32(np.float64(fused_fma_f32(-np.array([s]), np.array([r]), np.ones(1, np.float32))[0]) * r)
    assert fused_fma_f32(np.array([x1]), np.array([r]), np.array([np.float32(x1 * np.float64(z))]))[0] \
        != np.float32(np.float64(x1) / s)
    vals = torch.tensor(np.concatenate([m, 2 * m, 4 * m]), dtype=torch.bfloat16)
    blocks = torch.cat([vals, vals[:6]]).view(-1, 15)                 # 26 blocks of 15 x values
    amax = (8 * torch.tensor(m, dtype=torch.bfloat16))[:, None, None].expand(128, 26, 1)
    x = torch.cat([amax, blocks.expand(128, 26, 15)], 2).reshape(128, -1)
    for spec in (quant.QuantSpec("e2m1", 16, "fp32"), quant.QuantSpec("e1m2", 16, "fp32")):
        ref = quant.quantize(x, spec, -1)
        codes, scales, _, _ = kernels.quantize(x.to(DEV), **kernel_args(spec, -1))
        assert_same_bits(codes, ref.codes, f"{spec} codes")
        assert_same_bits(scales, ref.scales, f"{spec} scales")


def test_fast_division_is_exact():
    """_div_fast, x / s for any fp32 x and s (rotated x): q = RN(x * r + RN(x * z)) as above, then one
    correction q + RN(x - s * q) * r by FMA gives RN(x / s) for s in [2**-100, 2**124] and quotients of
    at least 2**-3, on quotients next to fp32 midpoints (where the one-FMA step alone can be off, as
    for s = 1.6581196, x = 1) and random ones, with s up to 2**124 (where z is subnormal)."""
    from conftest import fused_fma_f32
    g = np.random.default_rng(0)
    n = 1 << 20
    e = g.integers(-100, 124, n)
    e[: n // 8] = 123                                                # z subnormal for most of these
    s = np.ldexp(1 + g.random(n), e).astype(np.float32)
    s[0] = np.float32(1.6581196)
    q = np.float32(2.0) ** g.integers(-3, 3, n).astype(np.float32) * (1 + g.random(n)).astype(np.float32)
    mid = q.astype(np.float64) + np.spacing(q).astype(np.float64) / 2   # an fp32 midpoint
    x = (mid * s).astype(np.float32)
    x = np.where(np.arange(n) % 3 == 0, q * s, x).astype(np.float32)   # and plain quotients
    x = np.where(g.random(n) < 0.5, -x, x).astype(np.float32)
    x[0] = np.float32(1.0)
    r = (1 / s.astype(np.float64)).astype(np.float32)
    z = (fused_fma_f32(-s, r, np.ones_like(s)).astype(np.float64) * r).astype(np.float32)
    q1 = fused_fma_f32(x, r, (x.astype(np.float64) * z).astype(np.float32))
    exact = (x.astype(np.float64) / s).astype(np.float32)             # (division in fp64: innocuous)
    assert 100 < np.count_nonzero(q1 != exact)                        # the one-FMA step alone is not exact
    assert np.all(np.abs(q1.astype(np.float64) - exact) <= np.spacing(np.abs(exact)))  # but faithful
    q2 = fused_fma_f32(fused_fma_f32(-s, q1, x), r, q1)
    keep = np.abs(exact) >= 0.125
    assert keep.mean() > 0.99
    assert np.array_equal(q2[keep], exact[keep])


def test_fast_range_is_its_bounds():
    """_outside_fast_range (one unsigned compare of the bits) flags v outside [2**-98, top] for each top
    the kernel takes (2**123; 2**100 for uniform SR), and NaN, zeros and negative v: next to either end,
    and far from both."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(v_ptr, out_ptr, TOP: tl.constexpr):
        o = tl.arange(0, 16)
        tl.store(out_ptr + o, kernels._outside_fast_range(tl.load(v_ptr + o), TOP).to(tl.int32))

    for e_top, top_bits in ((123, 0x7D000000), (100, 0x71800000)):
        lo, top = np.float32(2.0**-98), np.float32(2.0**e_top)
        v = np.array([lo, np.nextafter(lo, np.float32(0)), np.nextafter(lo, np.float32(1)), top,
                      np.nextafter(top, np.float32(np.inf)), np.nextafter(top, np.float32(0)), 0.0, -0.0,
                      -1.0, 1.0, np.inf, np.nan, 1e-45, -np.inf, 3e38, 1e-30], dtype=np.float32)
        want = ~((v >= lo) & (v <= top))
        out = torch.zeros(16, dtype=torch.int32, device=DEV)
        probe[(1,)](torch.from_numpy(v).to(DEV), out, top_bits)
        got = out.cpu().numpy().astype(bool)
        assert np.array_equal(got, want), f"top 2**{e_top}: wrong for {v[got != want]}"


def _rn32(v: Fraction) -> float:
    """v rounded to the nearest fp32 (ties to even), exactly; normal range."""
    if v == 0:
        return 0.0
    e = math.floor(math.log2(abs(v)))
    e += (abs(v) >= Fraction(2) ** (e + 1)) - (abs(v) < Fraction(2) ** e)
    return float(round(v / Fraction(2) ** (e - 23)) * Fraction(2) ** (e - 23))


@pytest.mark.parametrize("scale", ["fp32", "e4m3"])
def test_ieee_division_path_is_bit_identical(scale):
    """fast_div=False (IEEE division for the block scales and y) gives the reference's bits too."""
    x = make_x((48, 64), torch.bfloat16, seed=5)
    for use_rht in (False, True):
        spec = quant.QuantSpec("e2m1", 16, scale, rht=use_rht)
        for dim in (-1, 0):
            ref = quant.quantize(x, spec, dim, signs=SIGNS)
            codes, scales, t, dq = kernels.quantize(x.to(DEV), **kernel_args(spec, dim, keep_rotated=True,
                                                                             fast_div=False))
            what = f"{spec} dim={dim} IEEE division"
            assert_same_bits(codes, ref.codes, what + " codes")
            assert_same_bits(scales, ref.scales, what + " scales")
            assert_same_bits(dq, ref.dequantize(keep_rotated=True), what + " dequant")


@pytest.mark.parametrize("dim", [-1, 0])
def test_e4m3_scale_ties_round_to_even(dim):
    """amax_T = 448 * 6 makes t = 1, so block scales amax / 6 of 1 + 1/16 and 1.3125 are exact ties
    between two e4m3 values (RNE: 1.0 and 1.25); the reference casts with torch's float8_e4m3fn."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    for i, amax in enumerate((6 * 1.0625, 6 * 1.3125, 6 * 1.1875, 6 * 0.0078125 * 1.0625)):
        x[i, 16 + i] = amax * (-1) ** i
        x[i, 16:32] = x[i, 16:32].clamp(-abs(amax), abs(amax))
    x[0, 0] = 448 * 6
    x = x if dim == -1 else x.t().contiguous()
    spec = quant.QuantSpec("e2m1", 16, "e4m3")
    ref = quant.quantize(x, spec, dim)
    codes, scales, t, dq = kernels.quantize(x.to(DEV), **kernel_args(spec, dim))
    assert ref.tensor_scale.item() == 1.0
    assert_same_bits(scales, ref.scales, "e4m3 scales")
    assert_same_bits(codes, ref.codes, "codes")
    assert_same_bits(dq, ref.dequantize(), "dequant")


@pytest.mark.parametrize("grid,use_rht", full_unless([("e1m2", True)], [("e2m1", False), ("e1m2", True)]))
def test_stochastic_rounding(grid, use_rht):
    """On the grid, one of the two neighbouring levels, reproducible per seed, and unbiased."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(5))
    spec = quant.QuantSpec(grid, 16, "fp32", "sr", rht=use_rht)
    args = kernel_args(spec, -1, out_dtype=torch.float32, keep_rotated=True)
    codes, scales, t, dq = kernels.quantize(x.to(DEV), seed=11, **args)
    decoded = quant.QTensor(codes.cpu(), scales.cpu(), t.cpu(), spec, -1, torch.float32, SIGNS)
    assert_same_bits(dq, decoded.dequantize(keep_rotated=True), "SR dequant vs its own codes")
    again = kernels.quantize(x.to(DEV), seed=11, **args)
    assert torch.equal(again[0], codes) and torch.equal(again[3], dq), "same seed, different result"
    assert not torch.equal(kernels.quantize(x.to(DEV), seed=12, **args)[0], codes), "seed ignored"

    xr = rht.rht(x, SIGNS) if use_rht else x
    s = quant.quantize(x, quant.QuantSpec(grid, 16, "fp32", rht=use_rht), signs=SIGNS).scales
    s = s.repeat_interleave(16, dim=1)
    ay = (xr / s).abs()                                         # |y|, exactly as the reference
    levels = torch.tensor(spec.levels)
    hi = levels[torch.searchsorted(levels, ay).clamp(max=len(levels) - 1)]
    lo = levels[torch.searchsorted(levels, ay, right=True) - 1]
    gap = torch.where(hi > lo, hi - lo, 1.0)
    ups, errs = [], []
    for seed in range(24):
        c = kernels.quantize(x.to(DEV), seed=seed, want_dequant=False, **args)[0].cpu()
        q = levels[torch.stack([c & 7, (c >> 4) & 7], -1).flatten(-2).long()]
        assert ((q == lo) | (q == hi)).all(), "SR gave a level that is not a neighbour of |y|"
        errs.append((q - ay) / gap)                             # in units of the local level gap
        ups.append((q > lo).double())
    err, n = torch.stack(errs).double(), len(errs) * ay.numel()
    bound = 5 * 0.5 / n**0.5                                    # 5 sd of a mean of n values of var <= 1/4
    assert abs(err.mean().item()) < bound, f"SR is biased: mean error {err.mean():.2e} gaps > {bound:.2e}"
    p_up = ((ay - lo) / gap).double().mean().item()
    assert abs(torch.stack(ups).mean().item() - p_up) < bound, "P(round up) != distance to the lower level"


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("use_rht", [False, True])
@pytest.mark.parametrize("power", [-120, 100])
def test_sr_draws_do_not_change_with_a_power_of_two_scale(dim, use_rht, power):
    """SR (fp32 scales) gives x * 2**p the codes of x, and its scales and dequant times 2**p exactly,
    where 2**p takes most blocks out of the kernels' fast range (p = -120: tiny blocks, 100: huge
    ones) and x has every block in it: every group takes y = x * RN(1/s), its out-of-range steps
    included, so a group's draws depend neither on its magnitude nor on the tile it shares with
    another group; with RHT the huge power is capped where the rotated tensor would overflow. (x / s,
    which those steps once took, differs from x * RN(1/s) by an ulp in about a quarter of the
    elements, and such an ulp flips a draw with a probability of about ulp / step, 2**-21 or less: the
    GPU case, 67M elements, expects a few flips from it; the CPU case checks the rest.)"""
    shape = (8192, 8192) if DEV == "cuda" else (48, 96)
    g = torch.Generator().manual_seed(44)  # magnitudes 2**-5 .. 2**26, zeros: x * 2**p stays normal
    x = torch.randn(shape, generator=g).sign() * torch.exp2(torch.rand(shape, generator=g) * 11 - 5
                                                            + torch.randint(0, 21, (shape[0], 1), generator=g))
    x[0, :16], x[:16, 0], x[1, 1:5] = 0.0, 0.0, -0.0
    if use_rht and power > 0:  # the butterfly's sums (4x the rotated values) overflow past 2**128, in the
        # reference too (a non-finite block): the rotated amax goes to [2**125, 2**126) instead, where its
        # scale is still out of the fast range (s > 2**123)
        power = 125 - math.floor(math.log2(rht.rht(x, SIGNS, dim).abs().max().item()))
    spec = quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=use_rht)
    kw = kernel_args(spec, dim, seed=5, keep_rotated=True, out_dtype=torch.float32)
    codes, scales, _, dq = kernels.quantize(x.to(DEV), **kw)
    codes_p, scales_p, _, dq_p = kernels.quantize((x * 2.0**power).to(DEV), **kw)
    assert_same_bits(codes_p, codes, "codes")
    assert_same_bits(scales_p, scales * 2.0**power, "scales")
    assert_same_bits(dq_p, dq * 2.0**power, "dequant")


@pytest.mark.parametrize("p", [2**-10, 1 / 3, 1 - 2**-10])
def test_sr_mean_error_within_the_16_bit_bound(p):
    """|y| a fixed fraction p of the way from level 1 to 1.5 (e1m2, scale 1): over many draws the mean
    error is P(up) - p gaps, within the documented 2**-17 (no p here makes a tie) plus 5 sd of the mean.
    Near a level this is sharp: with 8 random bits per element, |y| 2**-10 gaps above a level never
    rounds up (fails)."""
    v = torch.tensor(1.0 + 0.5 * p)
    p = (v.double().item() - 1.0) / 0.5                          # p as represented in fp32
    x = v.expand(4096, 16).clone()
    x[:, 0] = 3.5                                                # block amax = g_max: scale 1, y = x
    spec = quant.QuantSpec("e1m2", 16, "fp32", "sr")
    tile = (1, 1024, 1) if DEV == "cpu" else None               # fewer, larger programs interpreted
    args = kernel_args(spec, -1, out_dtype=torch.float32, seed=3, tile=tile)
    q = kernels.fake_quantize(x.to(DEV), **args).cpu().double()
    assert (q[:, 0] == 3.5).all() and ((q[:, 1:] == 1.0) | (q[:, 1:] == 1.5)).all()
    err = ((q[:, 1:] - v.double()) / 0.5).mean().item()        # P(up) - p, in gaps
    bound = 2**-17 + 5 * (p * (1 - p) / q[:, 1:].numel()) ** 0.5
    assert abs(err) < bound, f"SR mean error {err:.3e} gaps at p = {p:.6f}, bound {bound:.3e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tensor_amax_pass(dtype):
    """The e4m3 first pass alone: max |x| (after RHT) over the finite elements, bit for bit, rows and
    columns, on shapes where the persistent programs loop over several tiles with a ragged last one."""
    for case, (shape, use_rht, dim) in enumerate([((17, 96), False, -1), ((17, 96), True, -1),
                                                  ((48, 17), True, 0), ((48, 17), False, 0),
                                                  ((3, 48), True, -1)]):
        x = make_x(shape, dtype, seed=20 + case)
        x[1, 5], x[-1, 3] = float("inf"), float("nan")
        xr = rht.rht(x.float(), SIGNS, dim=dim) if use_rht else x.float()
        want = torch.where(torch.isfinite(xr), xr.abs(), 0.0).amax()
        got = kernels.tensor_amax(x.to(DEV), rht_signs=SIGNS.to(DEV) if use_rht else None, dim=dim)
        assert_same_bits(got, want, f"amax {shape} rht={use_rht} dim={dim} {dtype}")
    x = torch.full((2, 32), float("nan"), dtype=dtype, device=DEV)
    assert kernels.tensor_amax(x).item() == 0.0 and kernels.tensor_amax(x, rht_signs=SIGNS.to(DEV)).item() == 0.0


@pytest.mark.parametrize("dtype", full_unless([torch.bfloat16], [torch.bfloat16, torch.float32]))
def test_tensor_amax_both_and_quantize_given_it(dtype):
    """One read for both orientations: tensor_amax_both's (rows, columns) equal the reference's amax
    after the RHT along each dim (rows also without RHT), over shapes with ragged tiles, Inf and NaN;
    quantize given either one makes the bits it makes alone."""
    for case, shape in enumerate([(48, 80), (16, 16), (96, 32)]):
        x = make_x(shape, dtype, seed=30 + case)
        if case != 1:
            x[17 % shape[0], 5], x[-1, 3] = float("inf"), float("nan")
        for row_rht, tile in ((True, None), (False, None), (True, (32, 32, 1, True))):  # True: SYNC
            got = kernels.tensor_amax_both(x.to(DEV), rht_signs=SIGNS.to(DEV), row_rht=row_rht, tile=tile)
            for i, dim in enumerate((-1, 0)):
                xr = rht.rht(x.float(), SIGNS, dim=dim) if row_rht or dim == 0 else x.float()
                want = torch.where(torch.isfinite(xr), xr.abs(), 0.0).amax()
                assert_same_bits(got[i], want, f"amax {shape} {dtype} dim={dim} row_rht={row_rht}")
    x = make_x((32, 48), dtype, seed=35).to(DEV)
    amax = kernels.tensor_amax_both(x, rht_signs=SIGNS.to(DEV))
    spec = quant.QuantSpec("e1m2", 16, "e4m3", "rtne", True)
    for i, dim in enumerate((-1, 0)):
        alone = kernels.quantize(x, **kernel_args(spec, dim))
        given = kernels.quantize(x, **kernel_args(spec, dim, tensor_amax=amax[i]))
        for a, b, what in zip(alone, given, ("codes", "scales", "tensor scale", "dequant")):
            assert_same_bits(b, a, f"{what} dim={dim} given the amax")
    with pytest.raises(ValueError, match="one fp32 value"):
        kernels.quantize(x, **kernel_args(quant.QuantSpec("e1m2", 16, "fp32", "rtne", True), -1, tensor_amax=amax[0]))
    with pytest.raises(ValueError, match="multiples of 16"):
        kernels.tensor_amax_both(x[:, :40], rht_signs=SIGNS.to(DEV))


@pytest.mark.parametrize("use_rht", [False, True])
def test_e4m3_codes_given_a_smaller_tensor_amax(use_rht):
    """Given a tensor amax under the tensor's own (a stale one, another tensor's), block scales clamp at
    448 and |x / s| passes the grid: the codes, which leave |y| unclamped where it stays under 8, clamp
    it there as the dequantized output does (their dequantization gives its bits)."""
    spec = quant.QuantSpec("e2m1", 16, "e4m3", "rtne", use_rht)
    x = make_x((32, 48), torch.bfloat16, seed=36).to(DEV)
    for dim in (-1, 0):
        amax = kernels.tensor_amax(x, rht_signs=SIGNS.to(DEV) if use_rht else None, dim=dim) / 16
        codes, scales, t, _ = kernels.quantize(x, **kernel_args(spec, dim, want_dequant=False, tensor_amax=amax))
        dq = kernels.quantize(x, **kernel_args(spec, dim, want_codes=False, keep_rotated=True, tensor_amax=amax))[3]
        got = kernels.dequantize(codes, scales, t, **dequant_args(spec, keep_rotated=True, out_dtype=dq.dtype))
        assert_same_bits(got, dq.movedim(dim, -1), f"dim={dim}")
        nibbles = torch.stack([codes.cpu() & 15, codes.cpu() >> 4])
        assert (nibbles & 7 == 7).any()  # (clamped elements: level 6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_off_a_word_boundary(dtype):
    """Rows (and bf16 columns) are read as words of two elements: a tensor starting one element past a
    word boundary (a contiguous view into a larger buffer) is copied first, and gives the reference's
    bits."""
    spec = quant.QuantSpec("e2m1", 16, "e4m3", "rtne", True)
    for dim, shape in ((-1, (3, 48)), (0, (32, 48))):
        buf = make_x((1, 1 + shape[0] * shape[1]), dtype, seed=40).reshape(-1).to(DEV)
        x = buf[1:].view(shape)
        assert (x.data_ptr() // x.element_size()) % 2 == 1
        ref = quant.quantize(x.cpu(), spec, dim, signs=SIGNS)
        codes, scales, t, dq = kernels.quantize(x, **kernel_args(spec, dim, keep_rotated=True))
        assert_same_bits(codes, ref.codes, f"dim={dim} codes")
        assert_same_bits(scales, ref.scales, f"dim={dim} scales")
        assert_same_bits(dq, ref.dequantize(keep_rotated=True), f"dim={dim} dequant")


def assert_tiles_give_the_bits(x, spec, dim, tiles, what):
    """kernels.quantize at each tile, codes and dequant outputs: the reference's bits, or for SR the bits
    of the first tile (the same draws whatever the tile)."""
    sr = spec.rounding == "sr"
    ref = None if sr else quant.quantize(x, spec, dim, signs=SIGNS)
    for tile in tiles:
        for codes in (True, False):
            kw = kernel_args(spec, dim, keep_rotated=True, want_codes=codes, want_dequant=not codes, seed=5)
            got = kernels.quantize(x.to(DEV), tile=tile, **kw)
            want = kernels.quantize(x.to(DEV), tile=tiles[0], **kw) if sr else \
                (ref.codes, ref.scales, ref.tensor_scale, ref.dequantize(keep_rotated=True))
            for j, part in enumerate(("codes", "scales", "tensor scale", "dequant")):
                if got[j] is not None and (codes or j > 1):
                    assert_same_bits(got[j], want[j], f"{what} tile {tile} {'codes' if codes else 'dequant'} {part}")


TILE_CASES = [(quant.QuantSpec("e2m1", 16, "fp32", rht=True), torch.bfloat16, (48, 38)),
              (quant.QuantSpec("e2m1", 32, "e8m0", rht=True), torch.bfloat16, (64, 22)),
              (quant.QuantSpec("e1m2", 16, "e4m3"), torch.float32, (32, 21)),
              (quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True), torch.bfloat16, (32, 38))]


@pytest.mark.parametrize("dim, case", full_unless([(-1, 2), (0, 0)], [(d, i) for d in (-1, 0) for i in range(4)]))
def test_tiles_give_the_bits(dim, case):
    """Other tiles than the default ones: the reference's bits, rows and columns, codes and dequant, RHT,
    e8m0 32-blocks, e4m3 and SR (the same draws whatever the tile), on shapes the tiles do not fill."""
    spec, dtype, shape = TILE_CASES[case]
    tiles = [(1, 2, 1), (1, 4, 1)] if dim == -1 else [(8, 2, 1), (4, 2, 1)]
    x = make_x(shape if dim == 0 else shape[::-1], dtype, seed=90 + case)
    assert_tiles_give_the_bits(x, spec, dim, tiles, f"{spec} dim={dim} {dtype}")


@pytest.mark.full
def test_a_tile_out_of_the_fast_range_among_tiles_in_it():
    """Rows where one tile holds a tiny group and another a huge one (outside the fast range: those tiles
    take the reference's steps) and the rest are ordinary: every tile has the reference's bits, codes and
    dequant outputs, and SR the draws of other tiles."""
    cases = [quant.QuantSpec("e2m1", 16, "fp32", rht=True), quant.QuantSpec("e2m1", 16, "fp32"),
             quant.QuantSpec("e1m2", 16, "fp32", rht=True), quant.QuantSpec("e2m1", 16, "e4m3", rht=True),
             quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True), quant.QuantSpec("e1m2", 16, "fp32", "sr")]
    x = make_x((12, 96), torch.bfloat16, seed=93)
    x[2, 16:32] = (x[2, 16:32].float() * 1e-36).bfloat16()  # a tiny group in one tile
    x[7, 80:96] = (x[7, 80:96].float() * 5e36).bfloat16()   # a huge one in another
    for spec in cases:
        assert_tiles_give_the_bits(x, spec, -1, [(1, 1, 1), (1, 2, 1)], str(spec))


@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
def test_e1m2_equals_int4_and_fake_quantize_equals_quantize(scale):
    x = make_x((5, 64), torch.bfloat16, seed=9)
    x[2] = x[3]  # no subnormal block: e8m0 clamps both grids' exponents at -127 there (so they differ)
    x = x.to(DEV)
    args = dict(block=16, scale_mode=scale, rht_signs=SIGNS.to(DEV), dim=0 if scale == "e4m3" else -1)
    x = x.t().contiguous() if args["dim"] == 0 else x
    e1m2 = kernels.quantize(x, levels=quant.GRIDS["e1m2"], **args)
    int4 = kernels.quantize(x, levels=quant.GRIDS["int4"], **args)
    assert torch.equal(e1m2[0], int4[0]) and torch.equal(e1m2[3], int4[3])
    only = kernels.quantize(x, levels=quant.GRIDS["e1m2"], want_codes=False, **args)
    assert only[0] is None and only[1] is None and torch.equal(only[3], e1m2[3])
    assert torch.equal(kernels.fake_quantize(x, levels=quant.GRIDS["e1m2"], **args), e1m2[3])
    codes = kernels.quantize(x, levels=quant.GRIDS["e1m2"], want_dequant=False, **args)
    assert codes[3] is None and torch.equal(codes[0], e1m2[0]) and torch.equal(codes[1], e1m2[1])


def test_bad_inputs_give_clear_errors():
    e2m1 = quant.GRIDS["e2m1"]
    x = torch.randn(4, 48, device=DEV)
    cases = [
        (dict(x=torch.randn(4, 40, device=DEV)), "multiple of 16"),
        (dict(x=x, block=32), "multiple of 32"),
        (dict(x=torch.randn(48, 4, device=DEV).t()), r"contiguous\(\)"),
        (dict(x=torch.ones(4, 48, dtype=torch.int32, device=DEV)), "bf16 or fp32"),
        (dict(x=torch.randn(2, 16, 16, device=DEV), dim=1), "dim 0 of a 2-D tensor"),
        (dict(x=torch.randn(8, 32, device=DEV), block_2d=True), "multiples of 16"),
        (dict(x=torch.randn(16, 32, device=DEV), block_2d=True, rht_signs=SIGNS.to(DEV)), "no RHT"),
        (dict(x=x, levels=(0.0, 1.0, 3.0)), "uniform grids"),
        (dict(x=x, levels=(0.0, 1.0, 1.0)), "increasing"),
        (dict(x=x, scale_mode="fp8"), "unknown scale_mode"),
        (dict(x=x, block=64), "16 or 32"),
        (dict(x=x, rht_signs=torch.ones(8, device=DEV)), "16 values"),
        (dict(x=x, want_codes=False, want_dequant=False), "nothing to compute"),
        (dict(x=x, out_dtype=torch.float16), "out_dtype"),
        (dict(x=x, tile=(4, 3, 1)), "powers of two"),
        (dict(x=x.t().contiguous(), dim=0, tile=(16, 4, 1, True)), "give"),
    ] + [(dict(x=x, rht_signs=SIGNS * 0.5), "must be ±1")] * (DEV == "cpu")  # (checked where it costs no sync)
    for kw, message in cases:
        kw.setdefault("levels", e2m1)
        with pytest.raises(ValueError, match=message):
            kernels.quantize(kw.pop("x"), **kw)
    with pytest.raises(ValueError, match="give"):
        kernels.dequantize(*kernels.quantize(x, levels=e2m1)[:3], levels=e2m1, tile=(1, 4, 1, False))
    with pytest.raises(ValueError, match="give"):
        kernels.tensor_amax(x, rht_signs=SIGNS.to(DEV), tile=(1, 4, 1, False))


@pytest.mark.parametrize("name", ["ufp4", "e2m1", "nvfp4", "mxfp4", "ufp4-nv"])
def test_qlinear_kernel_path_matches_reference(name):
    """The quantized linear through the kernels (custom op nanofp4::fake_quantize) gives the
    reference's bits for y, dX and dW (SR off, so both paths are deterministic)."""
    recipe = quant.recipe_from_overrides(name, sr="none", bf16_last="0")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 64, generator=g).to(DEV)
    w = torch.randn(96, 64, generator=g).to(DEV)
    dy = torch.randn(32, 96, generator=g).to(DEV)
    outs = {}
    for backend in ("torch", "triton"):
        quant.set_backend(backend)
        try:
            lin = quant.QLinear(64, 96, bias=False, recipe=recipe).to(DEV)
            with torch.no_grad():
                lin.weight.copy_(w)
            xr = x.clone().requires_grad_()
            y = lin(xr)
            y.backward(dy)
            outs[backend] = (y, xr.grad, lin.weight.grad)
        finally:
            quant.set_backend("auto")
    for ref, got in zip(outs["torch"], outs["triton"]):
        assert torch.equal(ref, got)


def test_kernel_backend_sr_is_reproducible_from_torch_seed():
    spec = quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True)
    x = torch.randn(16, 64).to(DEV)
    quant.set_backend("triton")
    try:
        torch.manual_seed(5)
        a = quant.fake_quantize(x, spec)
        torch.manual_seed(5)
        b = quant.fake_quantize(x, spec)
        c = quant.fake_quantize(x, spec)
    finally:
        quant.set_backend("auto")
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.skipif(DEV != "cuda", reason="the kept-kernel launch path exists on GPUs only")
@pytest.mark.parametrize("spec", [quant.QuantSpec("e1m2", 16, "fp32", "rtne", rht=True),
                                  quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True),
                                  quant.QuantSpec("e2m1", 16, "e4m3", "rtne", rht=True),
                                  quant.QuantSpec("e2m1", 16, "e4m3", "rtne")], ids=str)
def test_fast_launch_gives_the_same_bits(spec):
    """The kept compiled kernels (kernels.FAST_LAUNCH; the e4m3 amax passes too) compute what
    kernel[grid] computes, also when a later call changes the sizes, a pointer's alignment or the seed."""
    flat = make_x((64, 96), torch.bfloat16, seed=11).flatten().to(DEV)
    cases = [(flat[:48 * 96].view(48, 96), 5), (flat[:16 * 96].view(16, 96), 32),  # sizes, seed % 16
             (flat[4:4 + 32 * 96].view(32, 96), 7),                              # 8-byte aligned
             (flat[:48 * 96].view(48, 96).float(), 5)]                           # x's dtype
    for dim in (-1, 0):
        for x, seed in cases * 2:  # the second round runs through the kept kernels
            kernels.FAST_LAUNCH = True
            fast = kernels.quantize(x, **kernel_args(spec, dim, seed=seed))
            kernels.FAST_LAUNCH = False
            slow = kernels.quantize(x, **kernel_args(spec, dim, seed=seed))
            kernels.FAST_LAUNCH = True
            for f, s, what in zip(fast, slow, ("codes", "scales", "tensor scale", "dequant")):
                assert_same_bits(f, s, f"{what} dim={dim} {tuple(x.shape)} seed={seed}")
    assert kernels._COMPILED and all(launcher is not None for _, launcher, _ in kernels._COMPILED.values()), \
        "a kept kernel launches through Triton's wrapper, not its launcher"


def test_direct_launch_passes_what_tritons_wrapper_passes(monkeypatch):
    """kernels._launch calls a kept kernel's launcher (Triton 3.6's CudaLauncher) with exactly what the
    compiled kernel's own wrapper has it pass to its C function when no launch hook is set; and keeps no
    launcher for a kernel that needs scratch memory (the wrapper allocates it). On the CPU, with a
    launcher whose C function only records its arguments."""
    from triton.backends.nvidia.driver import CudaLauncher

    class Kernel:  # a jit function's argument names
        arg_names = ["x_ptr", "n", "BLOCK"]

    def kept(scratch):
        run = object.__new__(CudaLauncher)  # (no compile: its C function is the recorder below)
        run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = 1, "cooperative", "pdl"  # (told apart)
        run.global_scratch_size, run.profile_scratch_size = scratch, 0
        run.global_scratch_align = run.profile_scratch_align = 1
        run.launch = lambda *args: seen.append(args)
        return run, kernels._keep(type("Compiled", (), dict(run=run, function=1234, packed_metadata=(4, 1, 0)))())

    seen = []
    run, (compiled, launcher, head) = kept(scratch=0)
    assert launcher is run.launch
    run(3, 2, 1, 77, 1234, (4, 1, 0), None, None, None, "x", 5, 64)  # as the wrapper calls it, hooks unset
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    monkeypatch.setattr(kernels, "FAST_LAUNCH", True)
    monkeypatch.setitem(kernels._COMPILED, "probe", (compiled, launcher, head))
    kernels._launch(Kernel(), (3, 2), False, (), "probe", dict(n=5, BLOCK=64, x_ptr="x"))
    assert len(seen) == 2 and seen[0] == seen[1], seen
    assert kept(scratch=8)[1][1] is None  # scratch memory: the wrapper launches it


@pytest.mark.skipif(DEV != "cuda", reason="the kept-kernel launch path exists on GPUs only")
def test_fast_launch_calls_tritons_launch_hooks():
    """With a launch hook set (Triton's profiler sets one), a kept kernel launches through Triton's own
    wrapper, which calls the hook: the direct launch does not hide kernels from the profiler."""
    from triton import knobs
    x = make_x((32, 64), torch.bfloat16, seed=13).to(DEV)
    args = kernel_args(quant.QuantSpec("e1m2", 16, "fp32", "rtne", rht=True), -1)
    kernels.quantize(x, **args)
    kernels.quantize(x, **args)  # kept
    seen = []
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernels.quantize(x, **args)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 1


@pytest.mark.skipif(DEV != "cuda", reason="the kept-kernel launch path exists on GPUs only")
def test_fast_launch_of_tensor_amax_both():
    """tensor_amax_both through its kept compiled kernel, also when a later tensor starts off 16 bytes
    (one element, or 8 bytes, past the buffer's start): its two views are keyed apart."""
    flat = make_x((64, 96), torch.bfloat16, seed=12).flatten().to(DEV)
    for x in [flat[:32 * 48].view(32, 48), flat[1:1 + 32 * 48].view(32, 48), flat[4:4 + 32 * 48].view(32, 48)] * 2:
        kernels.FAST_LAUNCH = True
        fast = kernels.tensor_amax_both(x, rht_signs=SIGNS.to(DEV))
        kernels.FAST_LAUNCH = False
        slow = kernels.tensor_amax_both(x, rht_signs=SIGNS.to(DEV))
        kernels.FAST_LAUNCH = True
        assert_same_bits(fast, slow, f"amax pair at offset {x.data_ptr() - flat.data_ptr()}")


@pytest.mark.parametrize("name, compiled", full_unless([("ufp4", False), ("nvfp4", False)], [
    ("ufp4", False), ("nvfp4", False), ("mxfp4", False), ("ufp4-nv", False), ("ufp4", True), ("nvfp4", True),
    ("ufp4-nv", True)]))
def test_pack_saved_through_the_kernels(name, compiled):
    """recipe.pack_saved with the Triton quantizer: X kept as the kernel's codes + scales gives the
    same dX and dW bits as X kept whole (the dequantize kernel of the codes = the fused dequant), and
    both the bits of the plain path (fused=false: no one-read amaxes either). Compiled, the packed X
    goes through the operators quantize_codes and dequantize in one graph (fullgraph; SR off, as the
    compiled graph draws its SR seeds on the device)."""
    if compiled:
        torch._dynamo.reset()  # each recipe compiles QLinear.forward anew: keep under the recompile limit
    quant.set_backend("triton")
    try:
        grads = []
        for overrides in (dict(fused="false"), dict(pack_saved="false"), dict(pack_saved="true")):
            recipe = quant.recipe_from_overrides(name, **overrides, **({"sr": "none"} if compiled else {}))
            torch.manual_seed(0)
            lin = quant.QLinear(64, 96 if compiled else 64, bias=False, recipe=recipe, device=DEV)
            f = torch.compile(lin, backend="aot_eager", fullgraph=True) if compiled else lin
            x = torch.randn(2, 32, 64, device=DEV).bfloat16().requires_grad_()
            torch.manual_seed(1)
            y = f(x)
            y.backward(torch.ones_like(y))
            grads.append((x.grad, lin.weight.grad))
        for other in grads[1:]:
            for a, b in zip(grads[0], other):
                assert torch.equal(a, b)
    finally:
        quant.set_backend("auto")


SLICE_SPECS = [quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True), quant.QuantSpec("e1m2", 16, "e4m3", rht=True),
               quant.QuantSpec("e2m1", 16, "e4m3", block_2d=True), quant.QuantSpec("e2m1", 32, "e8m0"),
               quant.QuantSpec("int4", 16, "fp32")]


@pytest.mark.parametrize("spec, dim", [(s, d) for s in SLICE_SPECS for d in (-1, 0) if not (s.block_2d and d == 0)])
def test_quantize_into_a_slice(spec, dim):
    """quantize(out=) writes the dequantized tensor into columns of a wider tensor: those columns get
    the bits of a fresh output, and nothing else is written."""
    x = make_x((64, 32), torch.bfloat16, seed=11).to(DEV)
    want = kernels.quantize(x, **kernel_args(spec, dim, seed=77))
    wide = torch.full((64, 96), 7.0, dtype=torch.bfloat16, device=DEV)
    got = kernels.quantize(x, **kernel_args(spec, dim, seed=77, out=wide[:, 32:64]))
    for g, w, what in zip(got, want, ("codes", "scales", "tensor scale", "dequant")):
        assert_same_bits(g, w, what)
    assert_same_bits(wide[:, 32:64], want[3], "the slice")
    assert torch.all(wide[:, :32] == 7.0) and torch.all(wide[:, 64:] == 7.0)
    column_major = torch.empty(32, 64, dtype=x.dtype, device=DEV).t()
    for out, message in ((wide[:, :31], "of x's shape"), (column_major, r"strides \(S, 1\)"),
                         (wide[:, :32].float(), "of x's shape")):
        with pytest.raises(ValueError, match=message):
            kernels.quantize(x, **kernel_args(spec, dim, out=out))


JOIN_SPECS = [quant.QuantSpec("e1m2", 16, "e4m3", "sr", rht=True), quant.QuantSpec("e2m1", 16, "e4m3", rht=True),
              quant.QuantSpec("e2m1", 32, "e8m0")]


@pytest.mark.parametrize("spec", full_unless(JOIN_SPECS[:1], JOIN_SPECS))
def test_fake_quantize_joined_equals_the_parts(spec):
    """fake_quantize_joined (and its operator) gives each part's own bits, its own tensor amax and
    SR seed, in its place of the joined tensor: output gradients [M, N_i] along dim 1 (quantized
    along rows or columns), weights [N_i, K] along dim 0."""
    ops = torch.ops.nanofp4
    parts1 = [make_x((32, n), torch.bfloat16, seed=20 + n).to(DEV) for n in (64, 32, 32)]
    parts0 = [p.t().contiguous() for p in parts1]
    for parts, join in ((parts1, 1), (parts0, 0)):
        for dim in (-1, 0):
            kw = kernel_args(spec, dim)
            e4m3 = spec.scale == "e4m3"
            amaxes = [kernels.tensor_amax(p, rht_signs=kw["rht_signs"], dim=dim) for p in parts] if e4m3 else None
            seeds = [5, 6, 7]
            want = torch.cat([kernels.fake_quantize(p, seed=s, **kw) for p, s in zip(parts, seeds)], join)
            got = kernels.fake_quantize_joined(parts, join=join, seeds=seeds, tensor_amaxes=amaxes, **kw)
            assert_same_bits(got, want, f"join={join} dim={dim}")
            if e4m3:  # the amaxes found by the first passes are the ones given
                assert_same_bits(kernels.fake_quantize_joined(parts, join=join, seeds=seeds, **kw), want, "no amax")
            seed_t = torch.tensor(seeds, dtype=torch.int32, device=DEV)
            by_op = ops.fake_quantize_joined(parts, list(spec.levels), spec.block, spec.scale, kw["sr"],
                                             kw["rht_signs"], False, dim, join, False, seed_t, amaxes or [])
            assert_same_bits(by_op, want, f"operator join={join} dim={dim}")
    assert torch.Tag.flexible_layout in ops.fake_quantize_joined.default.tags
    with pytest.raises(ValueError, match="agree on the other"):
        kernels.fake_quantize_joined([parts1[0], parts0[0]], join=1, **kernel_args(spec, -1))


@pytest.mark.parametrize("name, compiled", full_unless([("ufp4-nv", False)], [
    ("ufp4-nv", False), ("nvfp4", False), ("ufp4", False), ("ufp4-nv", True), ("mxfp4", True)]))
def test_joined_linears_through_the_kernels(name, compiled):
    """q, k, v in one quantized linear through the kernels (each weight and output gradient quantized
    into its place of one operand: fake_quantize_joined) against the three layers apart on the plain
    path (QLinearFn): the same outputs and weight gradients, dX to fp32 rounding (one GEMM instead of
    a sum of three). Compiled, the joined linear goes through the operators and gives the eager bits
    (SR off)."""
    recipe = quant.recipe_from_overrides(name, sr="none", bf16_last="0")
    torch.manual_seed(0)
    layers = [quant.QLinear(64, n, bias=False, recipe=recipe, device=DEV) for n in (64, 32, 32)]
    x = torch.randn(2, 16, 64, device=DEV)
    g = [torch.randn(2, 16, n, device=DEV) for n in (64, 32, 32)]
    params = [m.weight for m in layers]
    quant.set_backend("triton")
    try:
        def run(f):
            xr = x.clone().requires_grad_()
            ys = f(xr)
            return list(ys) + list(torch.autograd.grad(ys, [xr] + params, g))
        joined = run(lambda t: quant.linears(t, *layers))
        apart = run(lambda t: [quant.QLinearFn.apply(t, m.weight, None, recipe, m.rht_signs, "") for m in layers])
        if compiled:
            by_graph = run(torch.compile(lambda t: quant.linears(t, *layers), backend="aot_eager", fullgraph=True))
    finally:
        quant.set_backend("auto")
    for i, (a, b) in enumerate(zip(joined, apart)):
        if i == 3:  # dX
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert_same_bits(a, b, f"output {i}")
    if compiled:
        for i, (a, b) in enumerate(zip(by_graph, joined)):
            assert_same_bits(a, b, f"compiled output {i}")


def test_seed_tensor_gives_the_seed_bits():
    """SR's seed read by the kernel from an int32 tensor (compiled graphs draw it on the device) gives
    the bits of the same seed passed as an int; another seed gives other bits."""
    spec = quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True)
    x = make_x((32, 48), torch.bfloat16, seed=3).to(DEV)
    for dim in (-1, 0):
        a = kernels.quantize(x, **kernel_args(spec, dim, seed=1234))
        b = kernels.quantize(x, **kernel_args(spec, dim, seed=torch.tensor([1234], dtype=torch.int32, device=DEV)))
        c = kernels.quantize(x, **kernel_args(spec, dim, seed=torch.tensor([99], dtype=torch.int32, device=DEV)))
        for f, s, what in zip(a, b, ("codes", "scales", "tensor scale", "dequant")):
            assert_same_bits(f, s, f"{what} dim={dim}")
        assert not torch.equal(a[3], c[3])
    with pytest.raises(ValueError, match="one int32"):
        kernels.quantize(x, **kernel_args(spec, -1, seed=torch.tensor([1, 2], dtype=torch.int32, device=DEV)))


def test_compiled_sr_draws_its_seed_in_the_graph():
    """Under torch.compile the SR seed is a tensor drawn inside the graph: torch.manual_seed
    reproduces a run, the next call draws other noise, and RTNE still matches the eager bits."""
    spec = quant.QuantSpec("e1m2", 16, "fp32", "sr", rht=True)
    x = make_x((32, 64), torch.float32, seed=4).to(DEV)
    f = torch.compile(lambda t: quant.fake_quantize(t, spec, 0), backend="aot_eager", fullgraph=True)
    quant.set_backend("triton")
    try:
        torch.manual_seed(5)
        a = f(x)
        torch.manual_seed(5)
        b, c = f(x), f(x)
        rtne = quant.QuantSpec("e1m2", 16, "fp32", "rtne", rht=True)
        g = torch.compile(lambda t: quant.fake_quantize(t, rtne, 0), backend="aot_eager", fullgraph=True)
        assert torch.equal(g(x), quant.fake_quantize(x, rtne, 0))
    finally:
        quant.set_backend("auto")
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, quant.fake_quantize(x, rtne, 0))


# ----------------------------------------------------------------------------- dequantize from codes
DEQUANT_SPECS = [quant.QuantSpec("e1m2", 16, "fp32", rht=True), quant.QuantSpec("e2m1", 16, "fp32"),
                 quant.QuantSpec("e2m1", 16, "e4m3", rht=True), quant.QuantSpec("e2m1", 32, "e8m0"),
                 quant.QuantSpec("e1m2", 16, "e4m3", rht=True), quant.QuantSpec("int4", 16, "fp32", rht=True)]


def dequant_args(spec, **kw):
    return dict(levels=spec.levels, block=spec.block, scale_mode=spec.scale,
                rht_signs=SIGNS.to(DEV) if spec.rht else None, **kw)


@pytest.mark.parametrize("spec", DEQUANT_SPECS, ids=str)
def test_dequantize_equals_qtensor_dequantize(spec):
    """kernels.dequantize of the kernel's own codes gives quant.QTensor.dequantize's bits (rotated back or
    kept rotated, bf16 or fp32), with the quantized dim last: for codes made along dim 0 of [R, C] the
    QTensor (dim=0) returns [R, C] and the kernel [C, R], its transpose."""
    rows = make_x((15, 96), torch.bfloat16, seed=31).view(3, 5, 96)
    cols = make_x((96, 7), torch.float32, seed=32)
    rows[1, 1, 3], rows[2, 4, 40], cols[3, 1], cols[40, 6] = float("inf"), float("nan"), -float("inf"), float("nan")
    for dim, x in ((-1, rows), (0, cols)):
        codes, scales, t, _ = kernels.quantize(x.to(DEV), **kernel_args(spec, dim, want_dequant=False))
        ref = quant.QTensor(codes.cpu(), scales.cpu(), t.cpu(), spec, dim % x.dim(), x.dtype,
                            SIGNS if spec.rht else None)
        for keep_rotated in (False, True) if spec.rht else (False,):
            for dtype in (torch.bfloat16, torch.float32):
                got = kernels.dequantize(codes, scales, t, **dequant_args(spec, keep_rotated=keep_rotated,
                                                                         out_dtype=dtype))
                want = ref.dequantize(dtype, keep_rotated).movedim(ref.dim, -1)
                assert got.shape == codes.shape[:-1] + (2 * codes.shape[-1],) and torch.isnan(got).any()
                assert_same_bits(got, want, f"{spec} dim={dim} keep_rotated={keep_rotated} {dtype}")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # huge scales: inf, and
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf in the RHT
@pytest.mark.parametrize("scale", ["fp32", "e4m3", "e8m0"])
def test_dequantize_any_codes_and_scales(scale):
    """Every byte of codes and every stored scale pattern (e4m3: negative, subnormal, NaN; e8m0: 2**-127,
    255 = NaN; fp32: NaN, -0, huge), on grids cut by max_level (level indices past the grid are 0)."""
    g = torch.Generator().manual_seed(8)
    specs = (quant.QuantSpec("e2m1", 16, scale, max_level=2.0),
             quant.QuantSpec("e1m2", 32, scale, rht=True, max_level=2.5))
    for spec in specs:  # 8 rows of 32 blocks: codes [8, 16 * block], scales [8, 32]
        codes = torch.randint(0, 256, (8, 16 * spec.block), generator=g, dtype=torch.uint8)
        codes[0, :256] = torch.arange(256, dtype=torch.uint8)           # every byte (pair of codes)
        bits = torch.randperm(256, generator=g).to(torch.uint8).view(8, 32)  # every scale byte
        scales = {"fp32": torch.randn(8, 32, generator=g) * torch.exp(30 * torch.randn(8, 32, generator=g)),
                  "e4m3": bits.view(torch.float8_e4m3fn), "e8m0": bits}[scale]
        if scale == "fp32":
            scales[0, :3] = torch.tensor([float("nan"), -0.0, 0.0])
        t = torch.tensor(3.0e-3)
        ref = quant.QTensor(codes, scales, t, spec, 1, torch.float32, SIGNS)
        for dtype in (torch.bfloat16, torch.float32):
            got = kernels.dequantize(codes.to(DEV), scales.to(DEV), t.to(DEV), **dequant_args(spec, out_dtype=dtype))
            assert_same_bits(got, ref.dequantize(dtype), f"{spec} {dtype}")


def test_codes_operators_and_their_fake_shapes():
    """nanofp4::quantize_codes / nanofp4::dequantize return what the functions return; their fake
    implementations give the real shapes and dtypes (codes along dim 0 of [R, C] are [C, R/2]), also
    inside a compiled graph."""
    x = make_x((64, 96), torch.bfloat16, seed=12).to(DEV)
    for spec, dim in ((DEQUANT_SPECS[2], 0), (DEQUANT_SPECS[3], -1), (DEQUANT_SPECS[0], -1)):
        signs = SIGNS.to(DEV) if spec.rht else None
        q_args = (x, list(spec.levels), spec.block, spec.scale, signs, dim)
        got = torch.ops.nanofp4.quantize_codes(*q_args)
        want = kernels.quantize(x, **kernel_args(spec, dim, want_dequant=False))[:3]
        for g, w, what in zip(got, want, ("codes", "scales", "tensor scale")):
            assert_same_bits(g, w, f"{spec} dim={dim} {what}")
        d_args = tuple(got) + (list(spec.levels), spec.block, spec.scale, signs, False, torch.float32)
        deq = torch.ops.nanofp4.dequantize(*d_args)
        assert_same_bits(deq, kernels.dequantize(*got, **dequant_args(spec, out_dtype=torch.float32)), "dequant")
        assert deq.shape == ((96, 64) if dim == 0 else (64, 96))
        torch.library.opcheck(torch.ops.nanofp4.quantize_codes.default, q_args, test_utils="test_faketensor")
        torch.library.opcheck(torch.ops.nanofp4.dequantize.default, d_args, test_utils="test_faketensor")

    spec = DEQUANT_SPECS[2]

    def roundtrip(t):
        c, s, ts = torch.ops.nanofp4.quantize_codes(t, list(spec.levels), 16, "e4m3", SIGNS.to(DEV), 0)
        return torch.ops.nanofp4.dequantize(c, s, ts, list(spec.levels), 16, "e4m3", SIGNS.to(DEV), False,
                                            torch.bfloat16).t() + 1
    compiled = torch.compile(roundtrip, backend="aot_eager", fullgraph=True)
    assert_same_bits(compiled(x), roundtrip(x), "compiled roundtrip")


def test_operators_take_any_strides():
    """The operators are declared with a flexible layout, so a compiled graph hands one buffer to all
    the quantizations of an operand instead of a copy to each: they must then give, for an input of
    any strides, what they give for its contiguous copy."""
    ops = torch.ops.nanofp4
    for op in (ops.fake_quantize, ops.quantize_codes, ops.tensor_amax_both, ops.dequantize):
        assert torch.Tag.flexible_layout in op.default.tags, op
    x = make_x((96, 64), torch.bfloat16, seed=13).to(DEV)
    xt, signs, spec = x.t(), SIGNS.to(DEV), DEQUANT_SPECS[2]      # xt: [64, 96], not contiguous
    levels = list(spec.levels)
    assert not xt.is_contiguous()
    for dim in (-1, 0):
        assert_same_bits(ops.fake_quantize(xt, levels, 16, "e4m3", False, signs, False, dim, 0, False),
                         ops.fake_quantize(xt.contiguous(), levels, 16, "e4m3", False, signs, False, dim, 0, False),
                         f"fake_quantize dim={dim}")
    got = ops.quantize_codes(xt, levels, 16, "e4m3", signs, 0)
    want = ops.quantize_codes(xt.contiguous(), levels, 16, "e4m3", signs, 0)
    for g, w, what in zip(got, want, ("codes", "scales", "tensor scale")):
        assert_same_bits(g, w, what)
    assert_same_bits(ops.tensor_amax_both(xt, signs, True), ops.tensor_amax_both(xt.contiguous(), signs, True),
                     "tensor_amax_both")
    codes, scales, t = want                                        # codes [96, 32]: the columns' blocks
    codes_t = codes.t().contiguous().t()                           # the same values, column-major
    assert_same_bits(ops.dequantize(codes_t, scales, t, levels, 16, "e4m3", signs, False, torch.float32),
                     ops.dequantize(codes, scales, t, levels, 16, "e4m3", signs, False, torch.float32), "dequantize")


def test_dequantize_bad_inputs_give_clear_errors():
    spec = quant.QuantSpec("e2m1", 16, "e4m3")
    codes, scales, t, _ = kernels.quantize(torch.randn(4, 64, device=DEV), **kernel_args(spec, -1))
    args = dict(codes=codes, scales=scales, tensor_scale=t, levels=spec.levels, scale_mode="e4m3")
    cases = [
        (dict(block_2d=True), "block_2d"),
        (dict(scales=scales[:, :2].contiguous()), r"scales \[\.\.\., K/16\]"),
        (dict(block=32), r"scales \[\.\.\., K/32\]"),
        (dict(scales=scales.float()), "float8_e4m3fn scales"),
        (dict(codes=codes.to(torch.int32)), "uint8 codes"),
        (dict(codes=codes.t()), r"contiguous\(\)"),
        (dict(tensor_scale=torch.ones(2, device=DEV)), "tensor_scale must be one fp32"),
        (dict(rht_signs=torch.ones(8, device=DEV)), "16 values"),
        (dict(scale_mode="fp8"), "scale_mode in"),
        (dict(out_dtype=torch.float16), "out_dtype"),
        (dict(levels=(0.0, 1.0, 3.0)), "uniform grids"),
    ]
    for kw, message in cases:
        a = {**args, **kw}
        with pytest.raises(ValueError, match=message):
            kernels.dequantize(a.pop("codes"), a.pop("scales"), a.pop("tensor_scale"), **a)


@pytest.mark.parametrize("scale, dtype", [("fp32", torch.float32), ("e4m3", torch.float8_e4m3fn),
                                          ("e8m0", torch.uint8)])
def test_empty_input_gives_empty_outputs_of_the_stored_dtypes(scale, dtype):
    spec = quant.QuantSpec("e2m1", 32 if scale == "e8m0" else 16, scale)
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=DEV)
    codes, scales, t, deq = kernels.quantize(x, **kernel_args(spec, -1))
    assert codes.shape == (0, 32) and scales.shape == (0, 64 // spec.block) and scales.dtype == dtype
    assert deq.shape == (0, 64) and float(t) == 1.0


# Compiled for a GPU without one (compile_quantize), in a process without TRITON_INTERPRET.
# (spec, dim, want_codes): every scale mode, RHT on and off, rows and columns, SR, 16x16 tiles; want_codes
# alone, or the dequantized output alone.
COMPILE_SCRIPT = r'''
import sys
import torch
sys.path.insert(0, sys.argv[1])
import triton
import kernels, quant
Q = quant.QuantSpec


def compile_quantize(shape, dtype, *, levels: tuple, block: int = 16, scale_mode: str = "fp32", sr: bool = False,
                     rht: bool = False, block_2d: bool = False, dim: int = -1, want_codes: bool = True,
                     tile=None, arch: int = 90):
    """The quantize kernel that quantize() would launch for a bf16 | fp32 tensor of this shape (bf16
    dequantized output unless want_codes), compiled for CUDA compute capability `arch` with no GPU
    present (Triton's compiler and the ptxas it ships; run it where TRITON_INTERPRET is unset). The
    result's .asm["cubin"] holds the machine code."""
    p = kernels._plan(tuple(shape), dtype, False, tuple(levels), block, scale_mode, sr, rht, block_2d, dim, torch.bfloat16,
              True, want_codes, not want_codes, tile, True)
    bf16 = dtype == torch.bfloat16
    x_type = ("*i16" if bf16 else "*fp32") if p.colwise else ("*i32" if bf16 else "*i64")
    types = [x_type, "*fp32" if want_codes else "*bf16", "*i64" if want_codes else "*fp32",
             ("*fp32" if scale_mode == "fp32" else "*u8") if want_codes else "*fp32", "*fp32",
             "*i32" if scale_mode == "e4m3" else "*fp32", "*fp32", "*fp32", "i32", "i32", "i32"]
    names = kernels._quantize_kernel.arg_names
    constexprs = dict(p.constexprs, SEED_PTR=False)
    signature = dict(zip(names, types), **{k: "constexpr" for k in constexprs})
    hints = {(i,): [["tt.divisibility", 16]] for i in range(10)}  # 16-byte pointers, M and K
    src = triton.compiler.ASTSource(kernels._quantize_kernel, signature, constexprs, hints)
    return triton.compile(src, target=triton.backends.compiler.GPUTarget("cuda", arch, 32), options=dict(p.options))



cases = [(Q("e2m1", 16, "fp32"), d, c) for d in (-1, 0) for c in (True, False)] + [
    (Q("e2m1", 32, "e8m0"), -1, True), (Q("e2m1", 32, "e8m0"), 0, False),
    (Q("e2m1", 32, "e8m0", rht=True), -1, False),
    (Q("e2m1", 16, "e4m3", rht=True), -1, True), (Q("e2m1", 16, "e4m3", rht=True), 0, False),
    (Q("e1m2", 16, "fp32", "sr"), -1, False), (Q("e1m2", 16, "fp32", "sr", rht=True), 0, True),
    (Q("e1m2", 16, "fp32", rht=True), -1, False), (Q("e2m1", 16, "fp32", block_2d=True), -1, True),
    (Q("e2m1", 16, "fp32", block_2d=True), -1, False), (Q("e1m2", 16, "fp32", rht=True), 0, True)]
for spec, dim, codes in cases:
    k = compile_quantize((4096, 4096), torch.bfloat16, levels=spec.levels, block=spec.block,
                                 scale_mode=spec.scale, sr=spec.rounding == "sr", rht=spec.rht, block_2d=spec.block_2d,
                                 dim=dim, want_codes=codes)
    print("compiled", spec, "dim", dim, "codes" if codes else "dequant", flush=True)
print("cases", len(cases))
import os, re, subprocess, tempfile
names = kernels._amax_both_kernel.arg_names
tr, tc, nw, sync = kernels._AMAX_TILES["both"]
sig = dict(zip(names, ["*i32", "*i16", "*fp32", "*i32", "i32"]), **{n: "constexpr" for n in names[5:]})
ce = dict(zip(names[5:], (tr, tc, False, True, 4096, sync)))
k = triton.compile(triton.compiler.ASTSource(kernels._amax_both_kernel, sig, ce), options=dict(
    kernels._amax_options(nw, False)), target=triton.backends.compiler.GPUTarget("cuda", 90, 32))
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(k.asm["cubin"])
tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
use = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
print("amax_both warps", nw, "programs", kernels._AMAX_PROGRAMS_PER_SM, "regs", re.search(r"REG:(\d+)", use).group(1),
      "local", re.search(r"LOCAL:(\d+)", use).group(1))
'''


@pytest.mark.full
def test_quantize_kernel_compiles_for_sm90():
    """The quantize kernel compiles for sm_90 (no GPU needed) for each kind of spec and output: the
    interpreter that runs the other tests here does not compile the kernels, so it lets through what
    only the compiler rejects (a name that only one arm of a branch assigns, read in the other's
    dead code for some spec). And tensor_amax_both's programs must all fit an SM at once."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[1])
    r = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, root], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.count("compiled") == 15 and "cases 15" in r.stdout
    # tensor_amax_both's persistent grid: every program resident on an SM (64K registers), no spills
    w = r.stdout.split("amax_both ")[1].split()
    nw, programs, regs, local = int(w[1]), int(w[3]), int(w[5]), int(w[7])
    assert programs * nw * 32 * -(-regs // 8) * 8 <= 65536 and local == 0, w
