"""Tests for quant.py against the numerics contract (docs/NUMERICS.md).

The checks come from the spec, not from the implementation: hand-computed tie and saturation
cases for every grid and scale mode, an independent re-implementation of the reference
arithmetic (`ref_quant` below, a literal reading of docs/NUMERICS.md §1-5), torchao 0.18's NVFP4 and
MXFP4 quantizers bit for bit, statistical checks of stochastic rounding, and QLinear's three
GEMMs against hand-written compositions of `fake_quantize` (docs/NUMERICS.md §6). All CPU.
"""
import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import quant  # noqa: E402
import rht  # noqa: E402

LEVELS = {  # docs/NUMERICS.md §1
    'e2m1': (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    'e1m2': (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5),
    'int4': (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
}
G_MAX = {'e2m1': 6.0, 'e1m2': 3.5, 'int4': 7.0}
SCALES = ('fp32', 'e4m3', 'e8m0')
ROLES = ('fprop_x', 'fprop_w', 'dgrad_dy', 'dgrad_w', 'wgrad_dy', 'wgrad_x')
RECIPE_NAMES = ('bf16', 'ufp4', 'e2m1', 'nvfp4', 'mxfp4', 'ufp4-nv')

# docs/NUMERICS.md §4 ties: (|y|, expected level); the tie goes to the even level index.
TIES = {
    'e2m1': [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)],
    'e1m2': [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.25, 2.0), (2.75, 3.0), (3.25, 3.0)],
    'int4': [(0.5, 0.0), (1.5, 2.0), (2.5, 2.0), (3.5, 4.0), (4.5, 4.0), (5.5, 6.0), (6.5, 6.0)],
}


# ----------------------------------------------------------------------------------------------
# An independent reference: docs/NUMERICS.md §1-5 and its exact fp32 order of operations, written
# literally and slowly (deterministic rounding only).

def butterfly(x):
    """Unnormalized fp32 Walsh-Hadamard butterfly on the last dim (16): stages h = 1, 2, 4, 8."""
    lead = x.shape[:-1]
    for h in (1, 2, 4, 8):
        v = x.reshape(*lead, 16 // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, 16)
    return x


def ref_rht(x, signs):
    shape = x.shape
    return (butterfly(x.reshape(*shape[:-1], -1, 16) * signs) * 0.25).reshape(shape)


def ref_rht_inverse(x, signs):
    shape = x.shape
    return ((butterfly(x.reshape(*shape[:-1], -1, 16)) * 0.25) * signs).reshape(shape)


def ref_scale(x, grid, block=16, scale='fp32', dim=-1, signs=None, max_level=None, block_2d=False):
    """Steps 1-3: returns (xb [..., nblocks, block] after RHT, y clamped to [-g, g], s, bad, g)."""
    g = float(max_level) if max_level is not None else G_MAX[grid]
    xf = x.float().movedim(dim, -1)
    shape = xf.shape
    if signs is not None:
        xf = ref_rht(xf, signs)
    xb = xf.reshape(*shape[:-1], shape[-1] // block, block)
    if block_2d:  # 16x16 tiles of a 2D tensor
        R, K = shape
        tiles = xf.reshape(R // 16, 16, K // 16, 16)
        amax = tiles.abs().amax(dim=(1, 3), keepdim=True).expand(R // 16, 16, K // 16, 1)
        amax = amax.reshape(R, K // 16, 1)
        bad = (~torch.isfinite(tiles)).any(dim=3, keepdim=True).any(dim=1, keepdim=True)
        bad = bad.expand(R // 16, 16, K // 16, 1).reshape(R, K // 16, 1)
    else:
        amax = xb.abs().amax(-1, keepdim=True)
        bad = (~torch.isfinite(xb)).any(-1, keepdim=True)
    if scale == 'fp32':
        s = amax / g
        y = torch.where(s > 0, xb / s, torch.zeros_like(xb))
    elif scale == 'e4m3':
        amax_t = xf.abs().amax()
        t = amax_t / (448 * g) if amax_t > 0 else torch.tensor(1.0)
        sb = torch.clamp((amax / g) / t, 2 ** -6, 448).to(torch.float8_e4m3fn).float()
        y = xb * ((1 / t) / sb)
        s = t * sb
    else:
        e_field = ((amax.view(torch.int32) >> 23) & 0xFF) - 127
        e = (e_field - math.floor(math.log2(g))).clamp(-127, 127)
        y = xb / torch.exp2(e.clamp(min=-126).double()).float()
        s = torch.exp2(e.double()).float()
    return xb, y.clamp(-g, g), s, bad, g


def ref_quant(x, grid, block=16, scale='fp32', dim=-1, signs=None, keep_rotated=False,
              max_level=None, block_2d=False):
    """Returns (dequantized tensor in x.dtype, codes [moved layout, unpacked], per-block scale)."""
    xb, y, s, bad, g = ref_scale(x, grid, block, scale, dim, signs, max_level, block_2d)
    shape = (*xb.shape[:-2], xb.shape[-2] * xb.shape[-1])
    levels = torch.tensor([v for v in LEVELS[grid] if v <= g])
    ay = y.abs()
    idx = torch.zeros(ay.shape, dtype=torch.int64)
    for i in range(len(levels) - 1):
        m = (levels[i] + levels[i + 1]) / 2
        idx += ((ay > m) | ((ay == m) & ((i + 1) % 2 == 0))).long()
    idx = torch.where(bad, 0, idx)
    s = torch.where(bad, float('nan'), s)
    neg = torch.signbit(xb)
    q = torch.where(neg, -levels[idx], levels[idx])
    deq = (q * s).reshape(shape)
    codes = ((neg.long() << 3) | idx).to(torch.uint8).reshape(shape)
    if signs is not None and not keep_rotated:
        deq = ref_rht_inverse(deq, signs)
    return deq.movedim(-1, dim).to(x.dtype), codes, s.squeeze(-1)


def pack(codes):
    """Element 2i in the low nibble, 2i+1 in the high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def random_blocks(rows, cols, block, seed, dtype=torch.float32, log2_range=12):
    """Gaussian blocks whose magnitudes span 2**+-log2_range, with a few zero blocks and outliers."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols // block, block, generator=gen)
    mag = torch.exp2((torch.rand(rows, cols // block, 1, generator=gen) * 2 - 1) * log2_range)
    x = x * mag
    x[torch.rand(rows, cols // block, generator=gen) < 0.05] = 0.0
    spikes = torch.rand(x.shape, generator=gen) < 0.01
    x = torch.where(spikes, x * 20, x)
    return x.reshape(rows, cols).to(dtype)


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    """Small CPU GEMMs run far faster on one thread when the cores are shared."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def spec(grid='e2m1', block=16, scale='fp32', **kw):
    return quant.QuantSpec(grid=grid, block=block, scale=scale, **kw)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ----------------------------------------------------------------------------------------------
# 1. Level tables and spec validation

def test_grid_tables():
    assert set(quant.GRIDS) == set(LEVELS)
    for name, levels in LEVELS.items():
        assert tuple(float(v) for v in quant.GRIDS[name]) == levels
        s = spec(name)
        assert s.g_max == G_MAX[name]
        assert tuple(float(v) for v in s.levels) == levels
    # e1m2 is int4 scaled by 1/2: the same uniform grid (docs/NUMERICS.md §1)
    assert tuple(2 * v for v in LEVELS['e1m2']) == LEVELS['int4']
    assert spec('e2m1', max_level=2).g_max == 2.0


@pytest.mark.parametrize('kw', [dict(grid='e3m0'), dict(grid='fp4'), dict(scale='bf16'),
                                dict(rounding='nearest'), dict(block=8), dict(block=24),
                                dict(block=32, block_2d=True), dict(rht=True, block_2d=True)])
def test_quantspec_rejects_bad_fields(kw):
    with pytest.raises(ValueError):
        quant.QuantSpec(**kw)


def test_unknown_grid_message_lists_valid_grids():
    with pytest.raises(ValueError) as err:
        quant.QuantSpec(grid='e3m0')
    msg = str(err.value)
    assert 'e3m0' in msg and all(name in msg for name in LEVELS)


# ----------------------------------------------------------------------------------------------
# 2. Ties and saturation for every grid, scale mode and block size, with exactly known scales

def tie_rows(grid, g, block, amax):
    """A block [A, -A, ties, -ties, 0...] and its expected dequantized values (scale 1)."""
    ties = [(t, e) for t, e in TIES[grid] if t < g]
    vals = [amax, -amax] + [t for t, _ in ties] + [-t for t, _ in ties]
    want = [g, -g] + [e for _, e in ties] + [-e for _, e in ties]
    # just off each tie: rounds to the nearer level whichever index is even
    for t, _ in ties[:3]:
        lo, hi = max(v for v in LEVELS[grid] if v < t), min(v for v in LEVELS[grid] if v > t)
        if len(vals) + 2 <= block:
            below = torch.nextafter(torch.tensor(t), torch.tensor(0.0)).item()  # fp32 neighbours
            above = torch.nextafter(torch.tensor(t), torch.tensor(99.0)).item()
            vals += [below, -above]
            want += [lo, -hi]
    vals += [0.0] * (block - len(vals))
    want += [0.0] * (block - len(want))
    return torch.tensor(vals), torch.tensor(want)


@pytest.mark.parametrize('grid,max_level', [('e2m1', None), ('e1m2', None), ('int4', None),
                                            ('e2m1', 2)])
@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('block', [16, 32])
@pytest.mark.parametrize('k', [0, -9, 7])
def test_ties_and_saturation(grid, max_level, scale, block, k):
    """The block's scale is exactly 2**k, so y = x / 2**k hits every RTNE tie of docs/NUMERICS.md §4.
    fp32: amax = g 2**k gives s = 2**k. e8m0: amax = 1.0625 g 2**k keeps E(amax) = floor(log2 g) + k,
    so s = 2**k and +-1.0625 g saturates to +-g. e4m3: a second block of amax 28 g 2**k makes
    t = 2**(k-4); the first block then has (amax_B/g)/t = 17, an e4m3 tie that rounds to 16,
    so s = t * 16 = 2**k and +-1.0625 g saturates."""
    g = float(max_level) if max_level else G_MAX[grid]
    sp = spec(grid, block, scale, max_level=max_level)
    amax = g if scale == 'fp32' else 1.0625 * g
    row, want = tie_rows(grid, g, block, amax)
    if scale == 'e4m3':
        anchor = torch.zeros(block)
        anchor[0], anchor[1] = 28 * g, -28 * g
        x, want = torch.stack([row, anchor]), torch.stack([want, anchor])
    else:
        x, want = row[None], want[None]
    x, want = x * 2.0 ** k, want * 2.0 ** k
    got = quant.fake_quantize(x, sp)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(got, want), f'\nx    {x[0].tolist()}\nwant {want[0].tolist()}\ngot  {got[0].tolist()}'

    qt = quant.quantize(x, sp)
    levels = [v for v in LEVELS[grid] if v <= g]
    idx = torch.tensor([levels.index(abs(v)) for v in (want[0] / 2.0 ** k).tolist()])
    codes = (torch.signbit(x[0]).long() << 3 | idx).to(torch.uint8)
    assert torch.equal(qt.codes[0], pack(codes))
    if scale == 'fp32':
        assert qt.scales.dtype == torch.float32 and qt.scales[0, 0].item() == 2.0 ** k
    elif scale == 'e8m0':
        assert qt.scales.dtype == torch.uint8 and qt.scales[0, 0].item() == 127 + k
    else:
        assert qt.scales.dtype == torch.float8_e4m3fn
        assert qt.scales[0, 0].float().item() == 16.0 and qt.scales[1, 0].float().item() == 448.0
        assert float(qt.tensor_scale) == 2.0 ** (k - 4)
    assert torch.equal(qt.dequantize(), got)


@pytest.mark.parametrize('grid', list(LEVELS))
def test_e8m0_saturates_values_above_g(grid):
    """OCP FLOOR: amax with the same exponent as g_max keeps s = 1, so everything above g clips."""
    g = G_MAX[grid]
    top = 2.0 ** (math.floor(math.log2(g)) + 1)  # first value with a larger exponent
    vals = torch.linspace(g, top * 0.999, 16)
    got = quant.fake_quantize(vals[None], spec(grid, scale='e8m0'))
    assert torch.equal(got, torch.full((1, 16), g))
    assert quant.quantize(vals[None], spec(grid, scale='e8m0')).scales[0, 0].item() == 127


def test_e8m0_exponent_clamps_like_torchao():
    """e = E(amax) - 2 clamps at -127 (stored byte 0), and the division uses 2**max(e, -126):
    amax 1.5 * 2**-125 gives e = -127, y = x / 2**-126 = 3, dequantized 3 * 2**-127."""
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([1.5 * 2 ** -125, -2.0 ** -126, 2.0 ** -128, 2.0 ** -149])
    qt = quant.quantize(x, spec('e2m1', 32, 'e8m0'))
    assert qt.scales[0, 0].item() == 0
    want = torch.tensor([3.0, -1.0, 0.0, 0.0]) * 2.0 ** -127  # 2**-128 -> y = 0.25, a tie -> 0
    got = quant.fake_quantize(x, spec('e2m1', 32, 'e8m0'))
    assert torch.equal(got[0, :4], want) and not got[0, 4:].any()
    # and at the top: amax near fp32 max gives e = 127 - 2 = 125
    big = torch.full((1, 32), 3.0e38)
    assert quant.quantize(big, spec('e2m1', 32, 'e8m0')).scales[0, 0].item() == 127 + 125
    got = quant.fake_quantize(big, spec('e2m1', 32, 'e8m0'))
    assert torch.equal(got, torch.full((1, 32), 6.0 * 2 ** 125))


def test_e8m0_max_level_saturation():
    """Range-restricted E2M1 (max level 2): 3, 3.5 and 3.9 share the exponent of 2 and clip to 2."""
    x = torch.tensor([[3.9, -3.5, 3.0, 2.5, 2.25, 1.75, 0.75, 0.25] + [0.0] * 8])
    want = torch.tensor([[2.0, -2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 0.0] + [0.0] * 8])
    assert torch.equal(quant.fake_quantize(x, spec('e2m1', scale='e8m0', max_level=2)), want)


def test_e4m3_block_scale_clamps_to_min():
    """(amax_B / g) / t below 2**-6 clamps to 2**-6 (the e4m3 minimum normal)."""
    x = torch.zeros(2, 16)
    x[0, 0] = 448 * 6.0  # t = 1
    x[1, :4] = torch.tensor([0.02, 0.01, 0.005, -0.004])  # amax_B / 6 = 0.0033 < 2**-6
    qt = quant.quantize(x, spec('e2m1', scale='e4m3'))
    assert qt.scales[1, 0].float().item() == 2 ** -6 and float(qt.tensor_scale) == 1.0
    # y = x * 64: 1.28 -> 1.5, 0.64 -> 0.5, 0.32 -> 0.5, -0.256 -> -0.5
    want = torch.tensor([1.5, 0.5, 0.5, -0.5]) / 64
    assert torch.equal(quant.fake_quantize(x, spec('e2m1', scale='e4m3'))[1, :4], want)


# ----------------------------------------------------------------------------------------------
# 3. The literal reference on random data: bit for bit (deterministic rounding)

@pytest.mark.parametrize('grid', list(LEVELS))
@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('block', [16, 32])
@pytest.mark.parametrize('use_rht', [False, True])
def test_matches_literal_reference(grid, scale, block, use_rht):
    signs = rht.random_signs(5) if use_rht else None
    for dtype in (torch.float32, torch.bfloat16):
        for dim in (-1, 0):
            x = random_blocks(64, 64, block, seed=block + 7 * use_rht, dtype=dtype)
            sp = spec(grid, block, scale, rht=use_rht)
            want, codes, _ = ref_quant(x, grid, block, scale, dim, signs)
            got = quant.fake_quantize(x, sp, dim, signs=signs)
            assert got.dtype == dtype
            assert torch.equal(got, want), f'{dtype} dim={dim}: {(got != want).sum()} elements differ'
            assert torch.equal(quant.quantize(x, sp, dim, signs=signs).codes, pack(codes))
            if use_rht:
                want_rot, _, _ = ref_quant(x, grid, block, scale, dim, signs, keep_rotated=True)
                got_rot = quant.fake_quantize(x, sp, dim, signs=signs, keep_rotated=True)
                assert torch.equal(got_rot, want_rot)


def near_tie_blocks(grid, scale, block, seed):
    """Blocks of random amax (element 0) whose other elements sit on or a few ulps from the
    midpoints between levels, in units of the block's own scale: any change to the fp32 order
    of operations of docs/NUMERICS.md §3 flips some of these roundings."""
    gen = torch.Generator().manual_seed(seed)
    rows, nblk = 16, 4
    amax = torch.exp2(torch.randint(-8, 9, (rows, nblk, 1), generator=gen).float())
    amax = amax * (1 + torch.rand(rows, nblk, 1, generator=gen))
    x = torch.zeros(rows, nblk, block)
    x[..., :1] = amax
    _, _, s, _, _ = ref_scale(x.reshape(rows, -1), grid, block, scale)
    levels = torch.tensor(LEVELS[grid])
    mids = (levels[:-1] + levels[1:]) / 2
    m = mids[torch.randint(0, len(mids), (rows, nblk, block - 1), generator=gen)]
    ulps = torch.randint(-2, 3, m.shape, generator=gen).float() * 2.0 ** -23
    v = m * s * (1 + ulps)  # s: [rows, nblk, 1]
    sign = torch.where(torch.rand(v.shape, generator=gen) < 0.5, -1.0, 1.0)
    x[..., 1:] = torch.where(v < amax, v, levels[3] * s) * sign
    return x.reshape(rows, -1)


@pytest.mark.parametrize('grid', list(LEVELS))
@pytest.mark.parametrize('scale', SCALES)
def test_near_ties_match_literal_reference(grid, scale):
    for seed in range(3):
        x = near_tie_blocks(grid, scale, 16, seed)
        _, y, _, _, _ = ref_scale(x, grid, 16, scale)
        mids = torch.tensor(LEVELS[grid])
        mids = (mids[:-1] + mids[1:]) / 2
        assert torch.isin(y.abs(), mids).sum() > 20  # many exact ties in the reference arithmetic
        want, _, _ = ref_quant(x, grid, 16, scale)
        got = quant.fake_quantize(x, spec(grid, 16, scale))
        assert torch.equal(got, want), f'{(got != want).sum().item()} of {x.numel()} differ'


@pytest.mark.parametrize('scale', SCALES)
def test_max_level_matches_literal_reference(scale):
    x = random_blocks(32, 64, 16, seed=3)
    want, _, _ = ref_quant(x, 'e2m1', 16, scale, max_level=2)
    got = quant.fake_quantize(x, spec('e2m1', 16, scale, max_level=2))
    assert torch.equal(got, want)


@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('grid', ['e2m1', 'e1m2'])
def test_block_2d_same_for_w_and_wt(scale, grid):
    """16x16 tiles: the quantized weight is the same for W (rows) and W^T (columns)."""
    w = random_blocks(48, 64, 16, seed=11, log2_range=4)
    sp = spec(grid, 16, scale, block_2d=True)
    rows = quant.fake_quantize(w, sp, dim=-1)
    cols = quant.fake_quantize(w, sp, dim=0)
    assert torch.equal(rows, cols)
    assert torch.equal(quant.fake_quantize(w.T.contiguous(), sp, dim=-1), rows.T)
    want, _, _ = ref_quant(w, grid, 16, scale, block_2d=True)
    assert torch.equal(rows, want)
    assert not torch.equal(rows, quant.fake_quantize(w, spec(grid, 16, scale)))  # 1D differs


# ----------------------------------------------------------------------------------------------
# 4. e1m2 and int4 are the same grid (docs/NUMERICS.md §1)

@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('use_rht', [False, True])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_e1m2_equals_int4(scale, use_rht, dtype):
    signs = rht.random_signs(1) if use_rht else None
    x = random_blocks(64, 128, 16, seed=21, dtype=dtype, log2_range=8)
    for block in (16, 32):
        for dim in (-1, 0):
            a = quant.fake_quantize(x, spec('e1m2', block, scale, rht=use_rht), dim, signs=signs)
            b = quant.fake_quantize(x, spec('int4', block, scale, rht=use_rht), dim, signs=signs)
            assert torch.equal(a, b)
            assert not torch.equal(a, x)


# ----------------------------------------------------------------------------------------------
# 5. NVFP4 and MXFP4 against torchao 0.18's reference quantizers

def torchao_test_tensor(dtype, seed):
    """Random blocks spanning 2**+-40 plus zero, tiny (near fp32 min-normal) and huge blocks."""
    x = random_blocks(32, 128, 16, seed=seed, log2_range=40).float()
    x[3, :32] = 0.0
    x[4, :32] = torch.randn(32) * 3e-38
    x[5, 32:64] = torch.randn(32) * 1e-39  # fp32 subnormals
    x[6, :32] = torch.randn(32) * 1e37
    x[7, 96:] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('seed', [0, 1])
def test_nvfp4_matches_torchao(dtype, seed):
    pytest.importorskip('torchao')
    from torchao.prototype.mx_formats.nvfp4_tensor import (NVFP4Tensor, nvfp4_quantize,
                                                            per_tensor_amax_to_scale)
    moderate = random_blocks(32, 128, 16, seed=seed + 10, log2_range=4)
    moderate[2, 16:48] = 0.0
    for x in (torchao_test_tensor(dtype, seed), moderate.to(dtype), (torch.randn(16, 64) * 1e-3).to(dtype)):
        t = per_tensor_amax_to_scale(x.float().abs().amax())
        ao_scales, ao_codes = nvfp4_quantize(x, block_size=16, per_tensor_scale=t)
        ao_deq = NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=t).dequantize(torch.float32)

        sp = spec('e2m1', 16, 'e4m3')
        qt = quant.quantize(x, sp)
        assert torch.equal(qt.codes, ao_codes)
        assert qt.scales.dtype == torch.float8_e4m3fn
        assert torch.equal(qt.scales.view(torch.uint8), ao_scales.view(torch.uint8))
        assert float(qt.tensor_scale) == t.item()
        assert torch.equal(qt.dequantize(torch.float32), ao_deq)
        assert torch.equal(quant.fake_quantize(x, sp), ao_deq.to(dtype))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('seed', [0, 1])
def test_mxfp4_matches_torchao(dtype, seed):
    pytest.importorskip('torchao')
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    x = torchao_test_tensor(dtype, seed)
    x[8, :32] = (torch.linspace(-1, 1, 32) * 3e38).to(dtype)  # largest exponents
    ao_scales, ao_codes = to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    ao_deq = to_dtype(ao_codes, ao_scales, torch.float4_e2m1fn_x2, 32, torch.float32)

    sp = spec('e2m1', 32, 'e8m0')
    qt = quant.quantize(x, sp)
    assert torch.equal(qt.codes, ao_codes)
    assert qt.scales.dtype == torch.uint8
    assert torch.equal(qt.scales, ao_scales.view(torch.uint8))
    assert torch.equal(qt.dequantize(torch.float32), ao_deq)
    assert torch.equal(quant.fake_quantize(x, sp), ao_deq.to(dtype))


# ----------------------------------------------------------------------------------------------
# 6. Stochastic rounding

def decode(codes, levels):
    """Unpack (low nibble first) and map code = sign<<3 | index to +-levels[index]."""
    c = torch.stack((codes & 0xF, codes >> 4), -1).reshape(*codes.shape[:-1], -1).long()
    levels = torch.tensor(levels)
    assert (c & 7).max() < len(levels)
    return torch.where(c >= 8, -levels[c & 7], levels[c & 7]), c & 7


@pytest.mark.parametrize('grid', list(LEVELS))
@pytest.mark.parametrize('scale', SCALES)
def test_sr_outputs_are_on_the_grid(grid, scale):
    """SR keeps the RTNE block scale; every output is +-level * scale, one level step at most
    away from the RTNE result."""
    x = random_blocks(32, 64, 16, seed=4, log2_range=6)
    qt = quant.quantize(x, spec(grid, 16, scale, rounding='sr'), seed=9)
    q, idx = decode(qt.codes, LEVELS[grid])
    _, _, s = ref_quant(x, grid, 16, scale)
    assert torch.equal(qt.dequantize(), (q.reshape(32, 4, 16) * s[..., None]).reshape(32, 64))
    _, idx_rtne = decode(quant.quantize(x, spec(grid, 16, scale)).codes, LEVELS[grid])
    assert (idx - idx_rtne).abs().max() <= 1
    assert (idx != idx_rtne).float().mean() > 0.1


@pytest.mark.parametrize('grid', list(LEVELS))
def test_sr_is_unbiased(grid):
    """With s = 1 (fp32 scale, amax = g), E[q] = y for every y in [-g, g]; checked at 5 sigma."""
    g = G_MAX[grid]
    gen = torch.Generator().manual_seed(0)
    row = (torch.rand(16, generator=gen) * 2 - 1) * g
    row[0] = g
    n = 4000
    x = row.expand(n, 16).contiguous()
    got = quant.fake_quantize(x, spec(grid, 16, 'fp32', rounding='sr'), seed=123)
    levels = torch.tensor(LEVELS[grid], dtype=torch.float64)
    a_idx = torch.searchsorted(levels, row.abs().double(), right=True) - 1
    a = levels[a_idx]
    b = levels[(a_idx + 1).clamp(max=len(levels) - 1)]
    p = torch.where(b > a, (row.abs().double() - a) / (b - a), torch.zeros_like(a))
    sigma = ((p * (1 - p)).sqrt() * (b - a)).clamp(min=1e-12)
    # only the two neighbours occur, and both occur when p is not extreme
    for j in range(16):
        vals = set(got[:, j].abs().tolist())
        assert vals <= {a[j].item(), b[j].item()}, (row[j].item(), vals)
    err = (got.double() - row.double()).mean(0)
    assert (err.abs() <= 5 * sigma / math.sqrt(n) + 1e-12).all(), (err, sigma)
    # and the rate of rounding up matches p
    up = (got.abs().double() == b).double().mean(0)
    interior = (p > 0) & (p < 1)
    assert ((up - p).abs()[interior] <= 5 * (p * (1 - p)).sqrt()[interior] / math.sqrt(n)).all()


def test_sr_unbiased_with_rht_and_block_scales():
    """Over many seeds the mean of SR fake-quantization converges to E[q] * s = clamp(y) * s,
    rotated back (x itself for fp32 scales; e4m3/e8m0 may clip a little above g)."""
    x = random_blocks(8, 64, 16, seed=6, log2_range=3)
    signs = rht.random_signs(0)
    for scale in SCALES:
        sp = spec('e2m1', 16, scale, rounding='sr', rht=True)
        _, y, s, _, _ = ref_scale(x, 'e2m1', 16, scale, signs=signs)
        limit = ref_rht_inverse((y * s).reshape(8, 64), signs)
        if scale == 'fp32':
            torch.testing.assert_close(limit, x, rtol=1e-5, atol=1e-5)
        draws = torch.stack([quant.fake_quantize(x, sp, seed=i, signs=signs) for i in range(400)])
        single = rel_err(draws[0], limit)
        err25, err400 = rel_err(draws[:25].mean(0), limit), rel_err(draws.mean(0), limit)
        assert err400 < single / 8 and err400 < err25 / 2.5, (scale, single, err25, err400)


def test_rounding_determinism_and_seeds():
    x = random_blocks(16, 64, 16, seed=8)
    rtne = spec('e2m1')
    a = quant.fake_quantize(x, rtne)
    assert torch.equal(a, quant.fake_quantize(x, rtne))
    assert torch.equal(a, quant.fake_quantize(x, rtne, seed=1))  # the seed does not matter for RTNE
    sr = spec('e2m1', rounding='sr')
    s1 = quant.fake_quantize(x, sr, seed=1)
    assert torch.equal(s1, quant.fake_quantize(x, sr, seed=1))
    assert torch.equal(quant.quantize(x, sr, seed=1).codes, quant.quantize(x, sr, seed=1).codes)
    s2 = quant.fake_quantize(x, sr, seed=2)
    assert not torch.equal(s1, s2)
    assert (s1 != s2).float().mean() > 0.1
    assert not torch.equal(s1, a)


# ----------------------------------------------------------------------------------------------
# 7. RHT inside fake_quantize

@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('grid', ['e2m1', 'e1m2'])
def test_fake_quantize_with_rht_approximates_x(scale, grid):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 128, generator=gen)
    signs = rht.random_signs(0)
    plain = rel_err(quant.fake_quantize(x, spec(grid, 16, scale)), x)
    rotated = rel_err(quant.fake_quantize(x, spec(grid, 16, scale, rht=True), signs=signs), x)
    assert 0.02 < plain < 0.25 and 0.02 < rotated < 0.25
    assert rotated < 1.3 * plain
    # keep_rotated stays in the rotated basis: it approximates rht(x), not x
    kept = quant.fake_quantize(x, spec(grid, 16, scale, rht=True), signs=signs, keep_rotated=True)
    assert rel_err(kept, rht.rht(x, signs)) < 1.3 * plain
    assert rel_err(kept, x) > 1.0
    # fp32 output: the not-kept result is the kept one rotated back
    back = quant.fake_quantize(x, spec(grid, 16, scale, rht=True), signs=signs)
    assert torch.equal(back, rht.rht_inverse(kept, signs))


def test_rht_gemm_in_rotated_basis():
    """Both operands carry the same H': the product of kept-rotated operands approximates A B^T."""
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 128, generator=gen), torch.randn(48, 128, generator=gen)
    signs = rht.random_signs(0)
    sp = spec('e1m2', 16, 'fp32', rht=True)
    qa = quant.fake_quantize(a, sp, signs=signs, keep_rotated=True)
    qb = quant.fake_quantize(b, sp, signs=signs, keep_rotated=True)
    ref = a @ b.T
    assert rel_err(qa @ qb.T, ref) < 0.15
    qa_back = quant.fake_quantize(a, sp, signs=signs)
    qb_back = quant.fake_quantize(b, sp, signs=signs)
    torch.testing.assert_close(qa @ qb.T, qa_back @ qb_back.T, rtol=1e-4, atol=1e-3)


def test_outliers_rht_helps_uniform_grid():
    """Outlier-heavy blocks: RHT lowers the error of the uniform grid (docs/NUMERICS.md §8)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(256, 256, generator=gen)
    x[torch.rand(x.shape, generator=gen) < 0.01] *= 30
    signs = rht.random_signs(0)
    for scale in SCALES:
        plain = rel_err(quant.fake_quantize(x, spec('e1m2', 16, scale)), x)
        rotated = rel_err(quant.fake_quantize(x, spec('e1m2', 16, scale, rht=True), signs=signs), x)
        assert rotated < plain, scale


# ----------------------------------------------------------------------------------------------
# 8. Shrinkage (docs/NUMERICS.md §8): E2M1 RTNE loses signal; the uniform grid much less

@pytest.mark.parametrize('dist', ['gaussian', 'laplace'])
def test_e2m1_shrinks_more_than_uniform(dist):
    gen = torch.Generator().manual_seed(5)
    if dist == 'gaussian':
        x = torch.randn(512, 512, generator=gen)
    else:
        u = torch.rand(512, 512, generator=gen) - 0.5
        x = -torch.sign(u) * torch.log1p(-2 * u.abs())
    gain = {}
    for grid in ('e2m1', 'e1m2'):
        xq = quant.fake_quantize(x, spec(grid, 16, 'fp32')).double()
        gain[grid] = ((xq * x.double()).sum() / (x.double() ** 2).sum()).item()
    assert gain['e2m1'] < 1.0
    assert abs(1 - gain['e2m1']) > abs(1 - gain['e1m2'])
    assert abs(1 - gain['e2m1']) > 2e-3  # a measurable shrinkage, not round-off


# ----------------------------------------------------------------------------------------------
# 9. QTensor: packing, layout, dims

@pytest.mark.parametrize('scale', SCALES)
def test_packing_order(scale):
    levels = torch.tensor(LEVELS['e2m1'])
    row = torch.cat([levels, -levels])  # codes 0..15 in order; -0.0 has code 8
    assert torch.signbit(row[8])
    x = row[None]
    qt = quant.quantize(x, spec('e2m1', 16, scale))
    assert qt.codes.dtype == torch.uint8 and qt.codes.shape == (1, 8)
    assert qt.codes[0].tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    torch.testing.assert_close(qt.dequantize(), x, rtol=1e-6, atol=0)  # e4m3: t * sb ~ 1
    q, _ = decode(qt.codes, LEVELS['e2m1'])
    assert torch.equal(q, x)


def test_negative_tiny_values_keep_sign_code():
    x = torch.tensor([[6.0, -0.1, 0.1, -0.0] + [0.0] * 12])
    codes = quant.quantize(x, spec('e2m1')).codes
    assert codes[0, 0].item() == (7 | (8 << 4)) and codes[0, 1].item() == (0 | (8 << 4))


@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('use_rht', [False, True])
@pytest.mark.parametrize('rounding', ['rtne', 'sr'])
def test_quantize_dequantize_equals_fake_quantize(scale, use_rht, rounding):
    signs = rht.random_signs(2) if use_rht else None
    for dtype in (torch.float32, torch.bfloat16):
        x = random_blocks(3 * 32, 64, 32, seed=12, dtype=dtype).reshape(3, 32, 64)
        for dim in (-1, 1, 0):
            if x.shape[dim] % 32:
                continue
            sp = spec('e2m1', 32, scale, rounding=rounding, rht=use_rht)
            qt = quant.quantize(x, sp, dim, seed=5, signs=signs)
            moved = x.movedim(dim, -1).shape
            assert qt.codes.shape == (*moved[:-1], moved[-1] // 2)
            fq = quant.fake_quantize(x, sp, dim, seed=5, signs=signs)
            assert torch.equal(qt.dequantize(), fq)
            assert qt.dequantize().dtype == dtype and qt.dequantize().shape == x.shape
            if dtype == torch.float32:
                assert torch.equal(qt.dequantize(torch.float32), fq)
            if use_rht:
                kept = quant.fake_quantize(x, sp, dim, seed=5, signs=signs, keep_rotated=True)
                assert torch.equal(qt.dequantize(keep_rotated=True), kept)


@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('use_rht', [False, True])
def test_dim0_equals_transposed_dim_last(scale, use_rht):
    signs = rht.random_signs(3) if use_rht else None
    x = random_blocks(64, 48, 16, seed=13)
    sp = spec('e1m2', 16, scale, rht=use_rht)
    a = quant.fake_quantize(x, sp, dim=0, signs=signs)
    b = quant.fake_quantize(x.T.contiguous(), sp, dim=-1, signs=signs).T
    assert torch.equal(a, b)
    qa, qb = quant.quantize(x, sp, dim=0, signs=signs), quant.quantize(x.T.contiguous(), sp, signs=signs)
    assert torch.equal(qa.codes, qb.codes)
    assert torch.equal(qa.scales.view(torch.uint8), qb.scales.view(torch.uint8))


@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('use_rht', [False, True])
def test_all_zero_tensor(scale, use_rht):
    """amax_B = 0 gives q = 0; e4m3 takes t = 1 when the whole tensor is zero."""
    signs = rht.random_signs(0) if use_rht else None
    for x in (torch.zeros(4, 32), -torch.zeros(4, 32)):
        qt = quant.quantize(x, spec('e2m1', 16, scale, rht=use_rht), signs=signs)
        got = quant.fake_quantize(x, spec('e2m1', 16, scale, rht=use_rht), signs=signs)
        assert torch.equal(got, torch.zeros(4, 32)) and torch.equal(qt.dequantize(), got)
        assert torch.isfinite(qt.scales.float()).all()
        if scale == 'e4m3':
            assert float(qt.tensor_scale) == 1.0 and (qt.scales.float() == 2 ** -6).all()
        if scale == 'e8m0':
            assert (qt.scales == 0).all()  # e = -127


# ----------------------------------------------------------------------------------------------
# 10. Bad input

@pytest.mark.parametrize('shape,dim,block', [((4, 24), -1, 16), ((48, 8), -1, 16),
                                             ((24, 64), 0, 16), ((4, 48), -1, 32)])
def test_size_not_multiple_of_block_is_an_error(shape, dim, block):
    with pytest.raises(ValueError) as err:
        quant.fake_quantize(torch.randn(shape), spec('e2m1', block), dim)
    msg = str(err.value)
    assert str(shape[dim]) in msg and str(block) in msg
    assert str(tuple(shape)) in msg or str(list(shape)) in msg or 'x'.join(map(str, shape)) in msg
    assert 'multiple' in msg.lower()
    with pytest.raises(ValueError):
        quant.quantize(torch.randn(shape), spec('e2m1', block), dim)


@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('bad', [float('nan'), float('inf'), float('-inf')])
@pytest.mark.parametrize('use_rht', [False, True])
def test_non_finite_block_dequantizes_to_nan(scale, bad, use_rht):
    signs = rht.random_signs(0) if use_rht else None
    x = random_blocks(4, 64, 16, seed=14)
    x[1, 20] = bad
    sp = spec('e2m1', 16, scale, rht=use_rht)
    got = quant.fake_quantize(x, sp, signs=signs)
    assert torch.isnan(got[1, 16:32]).all()
    assert not torch.isinf(got).any()
    qt = quant.quantize(x, sp, signs=signs)
    _, idx = decode(qt.codes, LEVELS['e2m1'])
    assert (idx[1, 16:32] == 0).all()
    if scale == 'e8m0':
        assert qt.scales[1, 1].item() == 255
    else:
        assert torch.isnan(qt.scales[1, 1].float())
    if scale != 'e4m3':  # e4m3's tensor scale sees the bad value; other blocks are unspecified there
        finite = torch.ones(4, 64, dtype=torch.bool)
        finite[1, 16:32] = False
        assert torch.isfinite(got[finite]).all()
        clean = x.clone()
        clean[1, 16:32] = 0.0
        want = quant.fake_quantize(clean, sp, signs=signs)
        assert torch.equal(got[finite], want[finite])


# ----------------------------------------------------------------------------------------------
# 11. Recipes (docs/NUMERICS.md §7) and overrides

def expected_table():
    """docs/NUMERICS.md §7: grid, block, scale, RHT roles, SR roles, 2D W roles, bf16_first, bf16_last."""
    dy = {'dgrad_dy', 'wgrad_dy'}
    wgrad = {'wgrad_dy', 'wgrad_x'}
    w = {'fprop_w', 'dgrad_w'}
    return {
        'ufp4': ('e1m2', 16, 'fp32', set(ROLES), dy, set(), 0, 0),
        'e2m1': ('e2m1', 16, 'fp32', wgrad, dy, set(), 0, 0),
        'nvfp4': ('e2m1', 16, 'e4m3', wgrad, dy, w, 0, 0.15),
        'mxfp4': ('e2m1', 32, 'e8m0', wgrad, dy, set(), 0, 0),
        'ufp4-nv': ('e1m2', 16, 'e4m3', set(ROLES), dy, set(), 0, 0),
    }


def specs_of(recipe):
    return {role: getattr(recipe, role) for role in ROLES}


def test_recipe_table():
    assert set(quant.RECIPES) == set(RECIPE_NAMES)
    assert all(s is None for s in specs_of(quant.RECIPES['bf16']).values())
    for name, (grid, block, scale, rht_roles, sr_roles, w2d, first, last) in expected_table().items():
        r = quant.RECIPES[name]
        for role, s in specs_of(r).items():
            assert isinstance(s, quant.QuantSpec), (name, role)
            assert (s.grid, s.block, s.scale, s.max_level) == (grid, block, scale, None), (name, role)
            assert s.rht == (role in rht_roles), (name, role)
            assert s.rounding == ('sr' if role in sr_roles else 'rtne'), (name, role)
            assert s.block_2d == (role in w2d), (name, role)
        assert r.bf16_first == first and r.bf16_last == last, name
        assert r.rht_seed == 0 and r.rht_resample is False


def test_overrides_take_effect_on_the_right_roles():
    r = quant.recipe_from_overrides('e2m1', rht='fprop,wgrad')
    assert {role for role, s in specs_of(r).items() if s.rht} == {'fprop_x', 'fprop_w', 'wgrad_dy', 'wgrad_x'}
    r = quant.recipe_from_overrides('ufp4', rht='dgrad')
    assert {role for role, s in specs_of(r).items() if s.rht} == {'dgrad_dy', 'dgrad_w'}
    r = quant.recipe_from_overrides('ufp4', rht='none')
    assert not any(s.rht for s in specs_of(r).values())
    r = quant.recipe_from_overrides('ufp4', sr='none')
    assert all(s.rounding == 'rtne' for s in specs_of(r).values())
    assert all(s.rht for s in specs_of(r).values())  # other fields unchanged
    r = quant.recipe_from_overrides('e2m1', grid='int4')
    assert all(s.grid == 'int4' and s.scale == 'fp32' and s.block == 16 for s in specs_of(r).values())
    assert r.wgrad_dy.rounding == 'sr' and r.wgrad_x.rht and not r.fprop_x.rht
    r = quant.recipe_from_overrides('e2m1', scale='e4m3')
    assert all(s.scale == 'e4m3' and s.grid == 'e2m1' for s in specs_of(r).values())
    r = quant.recipe_from_overrides('e2m1', block='32')
    assert all(s.block == 32 for s in specs_of(r).values())
    r = quant.recipe_from_overrides('e2m1', max_level='2')
    assert all(s.g_max == 2 for s in specs_of(r).values())
    r = quant.recipe_from_overrides('e2m1', bf16_first='1')
    assert r.bf16_first == 1 and r.bf16_last == 0 and r.fprop_x == quant.RECIPES['e2m1'].fprop_x
    r = quant.recipe_from_overrides('nvfp4', bf16_last='0')
    assert r.bf16_last == 0 and r.fprop_w.block_2d
    r = quant.recipe_from_overrides('e2m1', grid='e1m2', scale='e8m0', rht='none', sr='none')
    assert all((s.grid, s.scale, s.rht, s.rounding) == ('e1m2', 'e8m0', False, 'rtne')
               for s in specs_of(r).values())
    # the named recipes are not mutated by overrides
    assert quant.RECIPES['e2m1'].fprop_x.grid == 'e2m1' and quant.RECIPES['ufp4'].dgrad_dy.rounding == 'sr'
    assert quant.recipe_from_overrides('mxfp4') == quant.RECIPES['mxfp4']


def test_override_errors_list_valid_choices():
    with pytest.raises(ValueError) as err:
        quant.recipe_from_overrides('e2m1', gird='int4')
    msg = str(err.value)
    assert 'gird' in msg and all(k in msg for k in ('grid', 'scale', 'block', 'rht', 'sr'))
    with pytest.raises(ValueError) as err:
        quant.recipe_from_overrides('e2m1', grid='e3m0')
    assert all(k in str(err.value) for k in LEVELS)
    with pytest.raises(ValueError) as err:
        quant.recipe_from_overrides('e2m1', scale='fp16')
    assert all(k in str(err.value) for k in SCALES)
    with pytest.raises(ValueError) as err:
        quant.recipe_from_overrides('e2m1', rht='fprop,bogus')
    assert all(k in str(err.value) for k in ('fprop', 'dgrad', 'wgrad'))
    with pytest.raises(ValueError):
        quant.recipe_from_overrides('e2m1', block='17')
    with pytest.raises(ValueError) as err:
        quant.recipe_from_overrides('fp5')
    assert all(k in str(err.value) for k in RECIPE_NAMES)


# ----------------------------------------------------------------------------------------------
# 12. QLinear: the three GEMMs of docs/NUMERICS.md §6

def fq(t, s, dim, signs):
    return t if s is None else quant.fake_quantize(t, s, dim, signs=signs, keep_rotated=True)


def hand_gemms(recipe, x2, w, dy2):
    """fprop: X rows, W rows; dgrad: dY rows, W columns; wgrad: dY columns, X columns."""
    signs = rht.random_signs(recipe.rht_seed)
    y = fq(x2, recipe.fprop_x, -1, signs).float() @ fq(w, recipe.fprop_w, -1, signs).float().T
    dx = fq(dy2, recipe.dgrad_dy, -1, signs).float() @ fq(w, recipe.dgrad_w, 0, signs).float()
    dw = fq(dy2, recipe.wgrad_dy, 0, signs).float().T @ fq(x2, recipe.wgrad_x, 0, signs).float()
    return y, dx, dw


def run_qlinear(layer, x, dy):
    x = x.detach().clone().requires_grad_(True)
    y = layer(x)
    y.backward(dy)
    return y, x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize('fused', [False, True])
@pytest.mark.parametrize('name', RECIPE_NAMES)
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_qlinear_equals_hand_composition(name, dtype, fused):
    """QLinear's three GEMMs, on the plain path (QLinearFn) and the fused one, against fake_quantize."""
    recipe = quant.RECIPES[name] if name == 'bf16' else quant.recipe_from_overrides(
        name, sr='none', fused=str(fused).lower())
    assert all(s is None or s.rounding == 'rtne' for s in specs_of(recipe).values())
    K, N, B, T = 96, 64, 2, 32
    torch.manual_seed(0)
    layer = quant.QLinear(K, N, bias=True, recipe=recipe).to(dtype)
    x = torch.randn(B, T, K).to(dtype)
    dy = torch.randn(B, T, N).to(dtype)
    y, dx, dw, db = run_qlinear(layer, x, dy)
    assert y.shape == (B, T, N) and dx.shape == x.shape and dw.shape == layer.weight.shape
    w = layer.weight.detach()
    y_ref, dx_ref, dw_ref = hand_gemms(recipe, x.reshape(-1, K), w, dy.reshape(-1, N))
    y_ref = y_ref + layer.bias.detach().float()
    tol = 4e-3 if dtype == torch.bfloat16 else 1e-6  # bf16 GEMM output rounding; 4-bit error is ~12%
    pairs = ((y.reshape(-1, N), y_ref, 'y'), (dx.reshape(-1, K), dx_ref, 'dX'), (dw, dw_ref, 'dW'))
    for got, ref, what in pairs:
        assert torch.isfinite(got).all()
        assert rel_err(got.float(), ref) < tol, (name, what, rel_err(got.float(), ref))
    torch.testing.assert_close(db.float(), dy.float().sum((0, 1)), rtol=1e-2, atol=1e-2)
    if name != 'bf16':  # the references differ from the unquantized GEMMs: the check has teeth
        x2, dy2 = x.reshape(-1, K).float(), dy.reshape(-1, N).float()
        assert rel_err(x2 @ w.float().T, y_ref - layer.bias.detach().float()) > 5 * tol
        assert rel_err(dy2 @ w.float(), dx_ref) > 5 * tol
        assert rel_err(dy2.T @ x2, dw_ref) > 5 * tol


def plain_linear(layer, x):
    """layer(x) through QLinearFn, the spec of every path (no autocast in these tests)."""
    return quant.QLinearFn.apply(x, layer.weight, layer.bias, layer.recipe, layer.rht_signs, '')


@pytest.mark.parametrize('pack', ['false', 'true'])
@pytest.mark.parametrize('name', [n for n in RECIPE_NAMES if n != 'bf16'])
def test_fused_linear_equals_plain(name, pack):
    """A linear alone on the fused path (FusedLinearFn, X kept packed or not) gives QLinearFn's bits:
    Y, dX, dW and db, stochastic rounding of dY included (the draws come in the same order)."""
    recipe = quant.recipe_from_overrides(name, pack_saved=pack)
    assert recipe.fused and quant.packs_saved(recipe) == (pack == 'true')
    torch.manual_seed(0)
    layer = quant.QLinear(64, 96, bias=True, recipe=recipe).to(torch.bfloat16)
    x, dy = torch.randn(2, 32, 64).bfloat16(), torch.randn(2, 32, 96).bfloat16()
    got, want = [], []
    for f, out in ((layer, got), (lambda t: plain_linear(layer, t), want)):
        xr = x.clone().requires_grad_()
        torch.manual_seed(1)
        y = f(xr)
        out += [y, *torch.autograd.grad(y, [xr, layer.weight, layer.bias], dy)]
    for a, b, what in zip(got, want, ('Y', 'dX', 'dW', 'db')):
        assert torch.equal(a, b), (name, what)
    assert not torch.equal(got[0], x @ layer.weight.detach().T + layer.bias.detach())  # it quantizes


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_qlinear_bf16_recipe_is_plain_linear(dtype):
    torch.manual_seed(1)
    ref = nn.Linear(64, 48).to(dtype)
    layer = quant.QLinear(64, 48, bias=True, recipe=quant.RECIPES['bf16']).to(dtype)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8, 64).to(dtype)
    dy = torch.randn(4, 8, 48).to(dtype)
    got = run_qlinear(layer, x, dy)
    want = run_qlinear(ref, x, dy)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_qlinear_gradients_flow():
    torch.manual_seed(2)
    layer = quant.QLinear(32, 16, bias=True, recipe=quant.RECIPES['ufp4'])
    x = torch.randn(16, 32, requires_grad=True)
    layer(x).square().sum().backward()
    for g in (x.grad, layer.weight.grad, layer.bias.grad):
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


def test_qlinear_sr_dgrad_converges_to_unquantized_dy():
    """ufp4: dY is SR-quantized for dgrad; averaged over seeds dX tends to
    rht(dY) @ fq(W, dgrad_w, dim 0): the error falls about like 1/sqrt(n)."""
    recipe = quant.RECIPES['ufp4']
    torch.manual_seed(3)
    layer = quant.QLinear(64, 32, bias=False, recipe=recipe)
    x = torch.randn(32, 64)
    dy = torch.randn(32, 32)
    signs = rht.random_signs(recipe.rht_seed)
    limit = rht.rht(dy, signs) @ fq(layer.weight.detach(), recipe.dgrad_w, 0, signs).float()
    dxs = []
    for i in range(64):
        torch.manual_seed(1000 + i)
        xi = x.clone().requires_grad_(True)
        layer(xi).backward(dy)
        dxs.append(xi.grad.float())
    dxs = torch.stack(dxs)
    assert not torch.equal(dxs[0], dxs[1]), 'SR on dY should differ between calls'
    err = [rel_err(dxs[:n].mean(0), limit) for n in (1, 4, 16, 64)]
    assert err[0] > 0.01
    assert err[1] < err[0] / 1.4 and err[2] < err[1] / 1.4 and err[3] < err[2] / 1.4, err
    assert err[3] < err[0] / 4, err


# ----------------------------------------------------------------------------------------------
# 13. convert

class Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))


class FFN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.w2 = nn.Linear(2 * d, d, bias=False)


class MoE(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.router = nn.Linear(d, 4, bias=False)
        self.gate = nn.Linear(d, 16, bias=False)
        self.expert = nn.Linear(d, d)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn_norm = nn.LayerNorm(d)
        self.attn, self.ffn, self.moe = Attn(d), FFN(d), MoE(d)


class TinyModel(nn.Module):
    def __init__(self, n_layer=8, d=32, vocab=64):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)


BLOCK_LINEARS = ('attn.wq', 'attn.wk', 'attn.wv', 'attn.wo', 'ffn.w1', 'ffn.w2', 'ffn.w3', 'moe.expert')


def acts_as_plain_linear(m, x):
    return torch.equal(m(x), F.linear(x, m.weight, m.bias))


def quantized_layers(model):
    """Indices of blocks whose linears quantize (checked by behaviour, not by class)."""
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    out = []
    for i, block in enumerate(model.layers):
        flags = set()
        for path in BLOCK_LINEARS:
            m = block.get_submodule(path)
            assert isinstance(m, nn.Linear)
            quantizes = not acts_as_plain_linear(m, x if m.in_features == 32 else torch.randn(16, 64))
            assert isinstance(m, quant.QLinear) or not quantizes
            flags.add(quantizes)
        assert len(flags) == 1, f'block {i} is half converted'
        if flags == {True}:
            out.append(i)
    return out


def convert_tiny(recipe, n_layer=8):
    torch.manual_seed(0)
    model = TinyModel(n_layer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = quant.convert(model, recipe)
    assert out is model
    after = model.state_dict()
    for k, v in before.items():  # weights and names survive the swap
        assert torch.equal(after[k], v), k
    return model


def test_convert_swaps_block_linears_only():
    model = convert_tiny(quant.RECIPES['e2m1'])
    assert quantized_layers(model) == list(range(8))
    assert type(model.tok_emb) is nn.Embedding and type(model.lm_head) is nn.Linear
    assert type(model.norm) is nn.LayerNorm
    for block in model.layers:
        assert type(block.moe.router) is nn.Linear and type(block.moe.gate) is nn.Linear
        assert type(block.attn_norm) is nn.LayerNorm


@pytest.mark.parametrize('first,last,want', [(1, 2, [1, 2, 3, 4, 5]), (0.25, 0.125, [2, 3, 4, 5, 6]),
                                             (0, 0, list(range(8))), (3, 0, [3, 4, 5, 6, 7]),
                                             (0.5, 2, [4, 5])])
def test_convert_honours_bf16_blocks(first, last, want):
    """Counts (int) and fractions of n_layer (float) of blocks kept in bf16 at either end."""
    recipe = dataclasses.replace(quant.RECIPES['ufp4'], bf16_first=first, bf16_last=last)
    assert quantized_layers(convert_tiny(recipe)) == want


@pytest.mark.parametrize('first,last,want', [('1', '2', [1, 2, 3, 4, 5]), ('0', '0.125', list(range(7))),
                                             ('0.25', '0', list(range(2, 8)))])
def test_bf16_block_overrides(first, last, want):
    """The command-line overrides accept a count or a fraction for both ends (docs/NUMERICS.md §7)."""
    recipe = quant.recipe_from_overrides('ufp4', bf16_first=first, bf16_last=last)
    assert quantized_layers(convert_tiny(recipe)) == want


def test_convert_named_recipes():
    assert quantized_layers(convert_tiny(quant.RECIPES['nvfp4'], n_layer=20)) == list(range(17))  # last 15%
    assert quantized_layers(convert_tiny(quant.RECIPES['bf16'])) == []
    model = convert_tiny(quant.RECIPES['mxfp4'])
    x = torch.randn(32, 32, requires_grad=True)  # 32 tokens: the wgrad block of mxfp4
    model.layers[0].attn.wq(x).sum().backward()
    assert x.grad is not None and model.layers[0].attn.wq.weight.grad is not None


@pytest.mark.full
def test_blocks_compiled_apart_share_one_graph():
    """Every transformer block compiled on its own (as bench/train_bench.py --compile blocks does):
    the quantized linears must not make dynamo guard on anything that differs per block (such as
    the layer name), or each block recompiles until the limit and the rest run eagerly."""
    import torch._dynamo
    from model import Transformer, get_config
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = quant.convert(Transformer(get_config("tiny", vocab_size=64, seq_len=16, n_layer=4)), quant.RECIPES["ufp4"])
    assert len({blk.attn.wq.layer for blk in m.layers}) == 4  # the names differ per block
    old = torch._dynamo.config.recompile_limit, torch._dynamo.config.fail_on_recompile_limit_hit
    torch._dynamo.config.recompile_limit, torch._dynamo.config.fail_on_recompile_limit_hit = 2, True  # the RHT signs are made on the first call: one recompile
    try:
        for blk in m.layers:
            blk.compile(backend="aot_eager")
        m(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))[1].backward()
    finally:
        torch._dynamo.config.recompile_limit, torch._dynamo.config.fail_on_recompile_limit_hit = old
        torch._dynamo.reset()


@pytest.mark.parametrize("name,bias", [("ufp4", False), ("e2m1", False), ("mxfp4", False), ("nvfp4", False),
                                       ("ufp4-nv", False), ("bf16", False), ("ufp4", True), ("ufp4-nv", True)])
def test_linears_of_one_input_share_x(name, bias, monkeypatch):
    """quant.linears(x, q, k, v) against the three layers apart on the plain path (QLinearFn), with
    deterministic rounding: outputs, weight and bias gradients bit for bit (each weight and output
    gradient is quantized as apart), dX to fp32 rounding (one GEMM instead of a sum of three). One
    FusedLinearFn call for every quantized recipe, quantizing x once in the forward and the weights
    joined (with e4m3 scales one by one, a tensor scale per weight, not one spanning the joined weight)."""
    recipe = quant.recipe_from_overrides(name, **({"sr": "none"} if quant.RECIPES[name].quantized() else {}))
    torch.manual_seed(0)
    layers = [quant.QLinear(64, n, bias=bias, recipe=recipe) for n in (64, 32, 32)]
    calls, quantized = [], []
    apply, fq = quant.FusedLinearFn.apply, quant.fake_quantize
    monkeypatch.setattr(quant.FusedLinearFn, "apply", lambda *a: calls.append(1) or apply(*a))
    monkeypatch.setattr(quant, "fake_quantize", lambda t, *a, **k: quantized.append(tuple(t.shape)) or fq(t, *a, **k))
    x = torch.randn(2, 16, 64, requires_grad=True)
    ys = quant.linears(x, *layers)
    joined = recipe.quantized()
    assert len(calls) == joined
    if joined:  # the forward's operands: x once, then the weights: one by one where each has its own
        # e4m3 tensor scale, else joined in one call (no block spans two weights)
        one_by_one = recipe.fprop_w.scale == "e4m3"
        assert quantized == [(32, 64)] + ([(64, 64), (32, 64), (32, 64)] if one_by_one else [(128, 64)])
    g = [torch.randn_like(y) for y in ys]
    params = [m.weight for m in layers] + ([m.bias for m in layers] if bias else [])
    dx, *dw = torch.autograd.grad(ys, [x] + params, g)
    x2 = x.detach().clone().requires_grad_()
    ys2 = [plain_linear(m, x2) if joined else m(x2) for m in layers]
    dx2, *dw2 = torch.autograd.grad(ys2, [x2] + params, g)
    for i, (a, b) in enumerate(zip(list(ys) + dw, ys2 + dw2)):
        assert torch.equal(a, b), (name, i)
    torch.testing.assert_close(dx, dx2, rtol=1e-5, atol=1e-5)


class Three(nn.Module):
    """Three linears of one input, named for convert as model.Attention names wq, wk, wv."""
    shared_input = ("a", "b", "c")

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16, bias=False)


def joined_three(recipe):
    holder = nn.Module()
    holder.layers = nn.ModuleList([Three()])
    return quant.convert(holder, recipe).layers[0]


def test_joined_linears_called_in_any_order():
    """The linears convert joins may be called in any order, with other inputs in between: each
    output is the one its layer gives alone on the plain path, and once every output is taken the
    join keeps no reference to an input or an output."""
    three = joined_three(quant.recipe_from_overrides("ufp4", sr="none"))
    join = three.a.join
    assert join is not None and three.b.join is join and three.c.join is join
    x1, x2 = torch.randn(16, 32), torch.randn(16, 32)
    for name, x in (("b", x1), ("a", x2), ("a", x1), ("c", x1), ("b", x2), ("c", x2), ("a", x2)):
        layer = getattr(three, name)
        assert torch.equal(layer(x), plain_linear(layer, x)), name
    assert join.x is None and join.ys == [None, None, None]


def test_linears_stay_apart_when_they_cannot_join():
    """Output widths that are not whole blocks, different recipes, a plain linear, recipe.fused off
    or the monitor listening: apart."""
    r = quant.RECIPES["ufp4"]
    odd = [quant.QLinear(32, 24, bias=False, recipe=r), quant.QLinear(32, 16, bias=False, recipe=r)]
    mixed = [quant.QLinear(32, 16, bias=False, recipe=r), quant.QLinear(32, 16, bias=False, recipe=quant.RECIPES["e2m1"])]
    plain = [torch.nn.Linear(32, 16, bias=False), quant.QLinear(32, 16, bias=False, recipe=r)]
    assert not any(quant.joinable(ls) for ls in (odd, mixed, plain))
    ok = [quant.QLinear(32, 16, bias=False, recipe=r), quant.QLinear(32, 32, bias=False, recipe=r)]
    assert quant.joinable(ok)
    three = joined_three(quant.recipe_from_overrides("ufp4", fused="false"))
    assert all(m.join is None for m in (three.a, three.b, three.c))
    x, seen = torch.randn(16, 32), []
    quant.MONITOR = lambda layer, role, *a, **k: seen.append(role)
    try:
        assert len(quant.linears(x, *ok)) == 2 and seen == ["fprop_x", "fprop_w"] * 2  # each layer on its own
    finally:
        quant.MONITOR = None


@pytest.mark.parametrize("name", ["ufp4", "e2m1", "mxfp4", "nvfp4", "ufp4-nv"])
def test_pack_saved_gives_the_same_gradients_from_4_bits(name):
    """recipe.pack_saved keeps X for wgrad as codes + scales: dX, dW, db are bit-identical to the plain
    path's, which keeps X (stochastic rounding of dY included: the draws come in the same order), and
    the backward keeps fewer bytes."""
    def run(**overrides):
        recipe = quant.recipe_from_overrides(name, **overrides)
        torch.manual_seed(0)
        lin = quant.QLinear(64, 64, bias=True, recipe=recipe)
        x = torch.randn(3, 32, 64, requires_grad=True)
        kept = {}

        def pack_hook(t):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            y = lin(x)
        torch.manual_seed(1)
        y.backward(torch.randn_like(y))
        return [x.grad, lin.weight.grad, lin.bias.grad], sum(kept.values()) - 4 * 64 * 64
    (plain, n_x), (packed, n_p) = run(fused="false"), run(pack_saved="true")
    for a, b in zip(plain, packed):
        assert torch.equal(a, b)
    assert n_p < n_x / 2  # fp32 X (4 bytes) against 0.5 + (scale bytes) / block
    assert not quant.packs_saved(quant.recipe_from_overrides(name, fused="false"))
    with pytest.raises(ValueError, match="quantizes nothing"):
        quant.recipe_from_overrides("bf16", pack_saved="true")


@pytest.mark.parametrize("name", ["ufp4", "nvfp4"])
def test_convert_joins_the_model_linears(name, monkeypatch):
    """model.py calls wq, wk, wv and w1, w3 one by one; convert joins them (recipe.fused): one
    FusedLinearFn per group and per lone linear, where the plain path (fused=false) runs seven
    QLinearFns a block. The loss is bit for bit the plain path's, the gradients equal to fp32 rounding
    (dX of a join is one GEMM instead of a sum), and after the step no join keeps a tensor."""
    import model as model_lib
    cfg = model_lib.get_config("tiny", n_layer=2, vocab_size=64, seq_len=16)
    x = torch.randint(0, 64, (2, 16))
    calls = []
    for fn in (quant.QLinearFn, quant.FusedLinearFn):
        monkeypatch.setattr(fn, "apply", (lambda name, apply: lambda *a: calls.append(name) or apply(*a))(fn.__name__, fn.apply))

    def run(fused):
        recipe = quant.recipe_from_overrides(name, sr="none", bf16_last="0", fused=fused)
        torch.manual_seed(0)
        m = quant.convert(model_lib.Transformer(cfg), recipe)
        calls.clear()
        loss = m(x, x)[1]
        loss.backward()
        return m, loss, [p.grad for p in m.parameters()], list(calls)
    m, loss, grads, fused_calls = run("true")
    _, loss2, grads2, plain_calls = run("false")
    assert fused_calls == ["FusedLinearFn"] * 8 and plain_calls == ["QLinearFn"] * 14
    for blk in m.layers:
        assert blk.attn.wq.join is blk.attn.wk.join is blk.attn.wv.join is not None and blk.attn.wo.join is None
        assert blk.ffn.w1.join is blk.ffn.w3.join is not None and blk.ffn.w2.join is None
        assert blk.attn.wq.join.x is None and blk.ffn.w1.join.ys == [None, None]
    assert torch.equal(loss, loss2)
    for a, b in zip(grads, grads2):
        assert rel_err(a, b) < 1e-4


def test_joined_linears_under_activation_checkpointing():
    """Blocks recomputed in the backward (train.activation_checkpointing) run their joins again: the
    same loss and gradients bit for bit as without recomputing, and no join keeps a tensor after."""
    import functools
    import model as model_lib
    cfg = model_lib.get_config("tiny", n_layer=2, vocab_size=64, seq_len=16)
    x = torch.randint(0, 64, (2, 16))

    def run(recompute):
        torch.manual_seed(0)
        m = quant.convert(model_lib.Transformer(cfg), quant.recipe_from_overrides("ufp4", sr="none"))
        if recompute:
            for block in m.layers:
                block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
        loss = m(x, x)[1]
        loss.backward()
        assert all(b.attn.wq.join.x is None and b.ffn.w1.join.x is None for b in m.layers)
        return [loss] + [p.grad for p in m.parameters()]
    for a, b in zip(run(False), run(True)):
        assert torch.equal(a, b)


@pytest.mark.full
def test_rht_resample_under_compile_keeps_one_graph():
    """recipe.rht_resample changes the RHT signs every step in place (a buffer): a compiled model
    does not recompile for them and computes what the eager model computes with the same signs."""
    import model as model_lib
    import moe
    from torch._dynamo.utils import counters
    recipe = quant.recipe_from_overrides("ufp4", rht_resample="true", sr="none")
    cfg = model_lib.get_config("moe-tiny", seq_len=16)
    torch.manual_seed(0)
    m = moe.convert_experts(quant.convert(model_lib.Transformer(cfg), recipe), recipe)
    f = torch.compile(m, backend="aot_eager")
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    m(x)  # the first eager call logs which quantizer ran (a compiled graph would guard on that)
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for step in range(3):
        quant.resample_rht(m, step)
        moe.resample_rht(m, step)
        assert torch.equal(m.layers[1].ffn.experts.rht_signs, rht.random_signs(step))
        assert torch.equal(f(x)[0], m(x)[0])
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[-1] and len({s.rht_seed for s in m.modules() if hasattr(s, "rht_seed")}) == 1


@pytest.mark.parametrize("name, fused, backend, preset", [
    ("ufp4", True, "torch", "tiny"), pytest.param("nvfp4", True, "torch", "tiny", marks=pytest.mark.full),
    pytest.param("ufp4", False, "torch", "tiny", marks=pytest.mark.full),
    pytest.param("nvfp4", True, "triton", "tiny", marks=pytest.mark.full),
    pytest.param("ufp4", True, "torch", "moe-tiny", marks=pytest.mark.full)])
def test_evaluation_leaves_the_training_graph_alone(monkeypatch, name, fused, backend, preset):
    """A compiled quantized model trains, evaluates (eval mode, no grad), an eager call logs which
    quantizer ran, and it trains again: the training step (joined linears, packed X, the backward) is
    one graph, the evaluation another, neither with a break (a break would run the quantized layers'
    Python between graphs on every step); the evaluation gives eager's bits, and the training graph
    serves again without a recompile. (torch 2.11's Dynamo mis-traced the
    autograd Functions under no_grad: it gave up on the whole forward, and a guard on the logged set
    then failed the training graph too, so every step after the first evaluation ran in pieces.)
    moe-tiny: the CUDA path's grouped GEMM under bf16 autocast, as on a GPU."""
    import contextlib
    import model as model_lib
    import moe
    from torch._dynamo.utils import counters
    monkeypatch.setitem(quant.BACKEND, "logged", set())
    monkeypatch.setitem(quant.BACKEND, "name", backend)  # triton: the kernels' operators (interpreter)
    monkeypatch.setitem(moe.GEMM, "name", "grouped")
    cfg = model_lib.get_config(preset, n_layer=2 if preset == "moe-tiny" else 1, vocab_size=64, seq_len=16)
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"  # the kernels: interpreted on a CPU
    torch.manual_seed(0)
    r = quant.recipe_from_overrides(name, fused=str(fused).lower())
    m = moe.convert_experts(quant.convert(model_lib.Transformer(cfg), r), r).to(dev)
    assert (m.layers[0].attn.wq.join is not None) == fused  # joined linears
    x = torch.randint(0, 64, (2, 16)).to(dev)
    auto = (lambda: torch.autocast("cpu", torch.bfloat16)) if preset == "moe-tiny" else contextlib.nullcontext
    torch._dynamo.reset()
    counters.clear()
    try:
        f = torch.compile(m, backend="aot_eager")
        with auto():
            loss = f(x, x)[1]
        loss.backward()
        m.eval()
        with torch.no_grad(), auto():
            loss_eval = f(x, x)[1]
            loss_eager = m(x, x)[1]  # eager: logs the quantizer (quant.BACKEND["logged"] changes)
        m.train()
        assert quant.BACKEND["logged"]
        with auto():
            loss = f(x, x)[1]
        loss.backward()
        assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 2
    finally:
        torch._dynamo.reset()
    with auto():
        assert torch.equal(loss_eval, loss_eager) and torch.equal(loss_eager, m(x, x)[1].detach())
