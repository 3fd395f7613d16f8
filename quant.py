"""4-bit formats, training recipes and the quantized linear layer (the numerics of nanofp4).

A 4-bit number is a sign and one of 8 non-negative *levels* (the grid). Real tensors are scaled
into the grid's range block by block: every `block` consecutive elements along the dimension a
GEMM reduces over share one scale s, chosen so that the block's largest magnitude lands on the
grid's top level g_max. An element x becomes q·s with q the level nearest to x/s.

Which grid? E2M1 (0, .5, 1, 1.5, 2, 3, 4, 6) is what FP4 hardware multiplies. Its steps double as
the values grow, so the bin above a level is wider than the bin below it; for values spread evenly
inside a bin, round-to-nearest then pulls them toward zero on average ("shrinkage bias"), and a
network made of quantized GEMMs loses a little signal at every layer. A uniform grid (E1M2 = INT4/2:
0, .5, ..., 3.5) has equal bins and no such bias. That is the UFP4 recipe's choice.

Which scale? `fp32`: s = amax/g_max exactly (UFP4). `e4m3`: NVFP4's two levels, an fp32 tensor scale
times an 8-bit float block scale. `e8m0`: MXFP4's power of two, which clips the block max when it
rounds down.

Rounding: round-to-nearest-even (`rtne`) is deterministic; stochastic rounding (`sr`) rounds up with
probability equal to the distance to the lower level, so it is unbiased on average. Recipes use SR
only on the output gradient dY, whose errors would otherwise accumulate in the weight update.

RHT (rht.py) rotates every 16 elements before quantizing, spreading outliers across the block.

A linear layer Y = X·Wᵀ runs three GEMMs in training, each with two quantized operands (six roles):
  fprop  Y  = X·Wᵀ   reduces over K: X rows, W rows          (fprop_x, fprop_w)
  dgrad  dX = dY·W   reduces over N: dY rows, W columns      (dgrad_dy, dgrad_w)
  wgrad  dW = dYᵀ·X  reduces over M: dY columns, X columns   (wgrad_dy, wgrad_x)
A Recipe gives each role a QuantSpec or None (= stays bf16). GPUs without FP4 GEMMs emulate them:
quantize, dequantize to bf16, multiply with fp32 accumulation. The full contract is docs/NUMERICS.md.

The file reads in that order: formats and scales, the reference quantizer (the spec of the Triton
kernels), recipes, the quantized linear (QLinearFn shows each GEMM's two operands; convert swaps
QLinear into a model). Then, apart, the fused paths, which give the same bits with less work (linears
of one input joined, X kept packed, one-read amaxes), and the dispatch to the kernels (kernels.py).
"""

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels
import rht as rht_lib

log = logging.getLogger("nanofp4.quant")


# ----------------------------------------------------------------------------- formats and scales
GRIDS = {
    "e2m1": (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    "e1m2": (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5),
    "int4": (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
}
SCALES = ("fp32", "e4m3", "e8m0")
ROUNDINGS = ("rtne", "sr")
BLOCKS = (16, 32)
E4M3_MAX, E4M3_MIN = 448.0, 2.0**-6
# e4m3's smallest tensor scale: a block scale t * sb then stays >= 2**-126 (sb >= 2**-6), so 1 / (t * sb)
# is finite. Below it (tensor amax < 448 g 2**-120, ~1.2e-33) 1 / t would overflow and every element
# would quantize to +-g_max; capped, such a tensor keeps its relative precision down to fp32's normals.
E4M3_T_MIN = 2.0**-120
ROLES = ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x")
GEMMS = {"fprop": ("fprop_x", "fprop_w"), "dgrad": ("dgrad_dy", "dgrad_w"), "wgrad": ("wgrad_dy", "wgrad_x")}


def check_choice(what, value, valid):
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(map(str, valid))}")


@dataclass(frozen=True)
class QuantSpec:
    """How one operand is quantized (docs/NUMERICS.md §1-5)."""
    grid: str = "e2m1"
    block: int = 16
    scale: str = "fp32"
    rounding: str = "rtne"
    rht: bool = False
    block_2d: bool = False
    max_level: Optional[float] = None  # a smaller g_max, e.g. E2M1 limited to 2.0

    def __post_init__(self):
        check_choice("grid", self.grid, list(GRIDS))
        check_choice("block", self.block, BLOCKS)
        check_choice("scale", self.scale, SCALES)
        check_choice("rounding", self.rounding, ROUNDINGS)
        if self.max_level is not None:
            check_choice(f"max_level for grid {self.grid}", self.max_level, GRIDS[self.grid][1:])
        if self.block_2d and (self.block != 16 or self.rht):
            raise ValueError("block_2d (16x16 weight tiles) needs block=16 and rht=False")
        # asked for on every quantize call: computed once (not a field: eq and hash ignore it)
        levels = tuple(v for v in GRIDS[self.grid] if self.max_level is None or v <= self.max_level)
        object.__setattr__(self, "_levels", levels)

    @property
    def levels(self) -> tuple:
        return self._levels

    @property
    def g_max(self) -> float:
        return self.levels[-1]


@dataclass
class QTensor:
    """A quantized tensor: packed 4-bit codes + block scales, laid out with the quantized dim last."""
    codes: torch.Tensor         # uint8 [..., K/2]; element 2i in the low nibble; sign<<3 | level index
    scales: torch.Tensor        # [..., K/block] fp32 | float8_e4m3fn | uint8 (e8m0 biased exponent);
                                # block_2d: [N/16, K/16]
    tensor_scale: torch.Tensor  # 0-d fp32 (1 unless scale='e4m3')
    spec: QuantSpec
    dim: int
    dtype: torch.dtype
    signs: Optional[torch.Tensor] = None  # the RHT signs used, if spec.rht

    def block_scales(self) -> torch.Tensor:
        """The fp32 dequantization scale of every block, shape [..., K/block]."""
        if self.spec.scale == "fp32":
            s = self.scales
        elif self.spec.scale == "e4m3":
            s = self.tensor_scale * self.scales.float()
        else:
            e = self.scales.to(torch.int32) - 127
            s = torch.where(e == 128, math.nan, torch.ldexp(torch.ones_like(e, dtype=torch.float32), e))
        return s.repeat_interleave(16, dim=0) if self.spec.block_2d else s

    def dequantize(self, dtype=None, keep_rotated=False) -> torch.Tensor:
        codes = torch.stack([self.codes & 15, self.codes >> 4], -1).flatten(-2).long()
        levels = torch.tensor(self.spec.levels + (0.0,) * (8 - len(self.spec.levels)), device=codes.device)
        q = torch.where(codes >= 8, -1.0, 1.0) * levels[codes & 7]
        s = self.block_scales()
        y = (q.unflatten(-1, (-1, self.spec.block)) * s.unsqueeze(-1)).flatten(-2)
        if self.spec.rht and not keep_rotated:
            y = rht_lib.rht_inverse(y, self.signs)
        return y.movedim(-1, self.dim).to(dtype or self.dtype)


# ----------------------------------------------------------------------------- the reference quantizer
def _round_to_grid(a: torch.Tensor, levels: tuple, sr: bool, seed: Optional[int]) -> torch.Tensor:
    """Level index of every magnitude a (0 <= a <= g_max): RTNE (ties to even index) or SR."""
    idx = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    if not sr:
        for i in range(len(levels) - 1):
            mid = (levels[i] + levels[i + 1]) / 2
            idx += (a > mid) | ((a == mid) & ((i + 1) % 2 == 0))
        return idx
    for lv in levels[1:]:
        idx += a >= lv
    lv = torch.tensor(levels + (levels[-1],), device=a.device)
    lo, hi = lv[idx.long()], lv[idx.long() + 1]
    gen = None if seed is None else torch.Generator(device=a.device).manual_seed(seed)
    u = torch.rand(a.shape, generator=gen, device=a.device)
    return idx + ((hi > lo) & (u < (a - lo) / (hi - lo)))


def _check_shape(x, spec, dim):
    k = x.shape[dim]
    if k % spec.block or (spec.block_2d and (x.dim() != 2 or x.shape[0] % 16 or x.shape[1] % 16)):
        rule = "both dims of a 2-D tensor multiples of 16" if spec.block_2d else f"a multiple of {spec.block}"
        raise ValueError(
            f"cannot quantize a tensor of shape {tuple(x.shape)} along dim {dim} (size {k}) in blocks "
            f"of {spec.block}: the size must be {rule}. Pad the layer width / token count or change the block.")
    if not x.is_floating_point():
        raise ValueError(f"quantize needs a floating-point tensor, got {x.dtype}")


def quantize(x, spec: QuantSpec, dim=-1, *, seed=None, signs=None) -> QTensor:
    """Quantize x along dim (docs/NUMERICS.md §2-5). All arithmetic in fp32."""
    _check_shape(x, spec, dim)
    dim = dim % x.dim()
    xm = x.movedim(dim, -1).float()
    if spec.rht:
        signs = rht_lib.random_signs(0) if signs is None else signs
        xm = rht_lib.rht(xm, signs)
    xb = xm.unflatten(-1, (-1, spec.block))                         # [..., nblocks, block]
    finite = torch.isfinite(xb).all(-1)                             # [..., nblocks]
    absb = xb.abs()
    if spec.block_2d:                                               # one amax per 16x16 tile
        amax = absb.amax(-1).unflatten(0, (-1, 16)).amax(1)         # [N/16, K/16]
        finite = finite.unflatten(0, (-1, 16)).all(1)
        expand = lambda t: t.repeat_interleave(16, dim=0)
    else:
        amax, expand = absb.amax(-1), (lambda t: t)
    amax = torch.where(finite, amax, 0.0)
    # divisors are tensors: CUDA divides by a Python scalar as a multiply by its reciprocal,
    # which is not IEEE division and would make GPU and CPU results differ
    g = torch.tensor(spec.g_max, device=x.device)
    t = torch.ones((), device=x.device)
    if spec.scale == "fp32":
        s = amax / g
        stored, s_div = torch.where(finite, s, math.nan), s
        y = torch.where(expand(s_div > 0).unsqueeze(-1), xb / expand(s_div).unsqueeze(-1), 0.0)
    elif spec.scale == "e4m3":
        amax_t = torch.where(torch.isfinite(xm), xm.abs(), 0.0).amax()
        t = torch.where(amax_t > 0, (amax_t / (E4M3_MAX * g)).clamp(min=E4M3_T_MIN), 1.0)
        sb = ((amax / g) / t).clamp(E4M3_MIN, E4M3_MAX).to(torch.float8_e4m3fn)
        stored = torch.where(finite, sb.float(), math.nan).to(torch.float8_e4m3fn)
        y = xb * expand((1 / t) / sb.float()).unsqueeze(-1)
    else:
        e = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - math.floor(math.log2(spec.g_max))
        e = e.clamp(-127, 127)
        stored = torch.where(finite, e + 127, 255).to(torch.uint8)
        s_div = torch.ldexp(torch.ones_like(amax), e.clamp(min=-126))
        y = xb / expand(s_div).unsqueeze(-1)
    a = y.abs().clamp(max=spec.g_max)
    idx = _round_to_grid(a, spec.levels, spec.rounding == "sr", seed)
    code = (torch.signbit(xb).to(torch.uint8) << 3) | idx
    code = torch.where(expand(finite).unsqueeze(-1), code, 0)  # non-finite block: code 0, scale NaN
    code = code.flatten(-2)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return QTensor(packed, stored, t.float(), spec, dim, x.dtype, signs if spec.rht else None)


def fake_quantize(x, spec: QuantSpec, dim=-1, *, seed=None, signs=None, keep_rotated=False, amax=None):
    """Quantize and dequantize x along dim; same shape and dtype. With RHT the result is rotated
    back (≈ x) unless keep_rotated (the GEMM path: both operands carry the same rotation). amax: e4m3's
    tensor amax of x if known (_amax_both); the kernels then skip their first pass."""
    if _use_kernels(x):
        return _kernel_fake_quantize(x, spec, dim, seed, signs, keep_rotated, amax)
    return quantize(x, spec, dim, seed=seed, signs=signs).dequantize(keep_rotated=keep_rotated)



# ----------------------------------------------------------------------------- recipes
@dataclass
class Recipe:
    """One QuantSpec (or None = bf16) per operand role, plus which blocks stay high precision."""
    fprop_x: Optional[QuantSpec] = None
    fprop_w: Optional[QuantSpec] = None
    dgrad_dy: Optional[QuantSpec] = None
    dgrad_w: Optional[QuantSpec] = None
    wgrad_dy: Optional[QuantSpec] = None
    wgrad_x: Optional[QuantSpec] = None
    bf16_first: float = 0   # transformer blocks kept high precision at the start: a count (int)
    bf16_last: float = 0    # or a fraction of the blocks (float < 1); the same at the end
    rht_seed: int = 0
    rht_resample: bool = False  # a fresh sign vector every step (same on every rank)
    fused: bool = True          # quantized linears take the fused paths (end of this file): joined
                                # linears, X kept packed, one-read amaxes; same bits (false: QLinearFn)
    pack_saved: bool = True     # (fused) keep X for wgrad as its 4-bit codes + scales (quantized in the
                                # forward) instead of the bf16 X: less activation memory, same bits (README)

    def specs(self) -> dict:
        return {r: getattr(self, r) for r in ROLES}

    def quantized(self) -> bool:
        return any(s is not None for s in self.specs().values())

    def describe(self) -> str:
        parts = [f"{r}={s.grid}/{s.block}{'x16' if s.block_2d else ''}/{s.scale}/{s.rounding}"
                 f"{'/rht' if s.rht else ''}" for r, s in self.specs().items() if s is not None]
        return (", ".join(parts) or "all bf16") + f"; bf16_first={self.bf16_first} bf16_last={self.bf16_last}"


def _recipe(grid, block, scale, rht_gemms, block_2d=False, bf16_last=0):
    def spec(role):
        gemm = role.split("_")[0]
        return QuantSpec(grid, block, scale, "sr" if role.endswith("_dy") else "rtne",
                         rht=gemm in rht_gemms, block_2d=block_2d and role.endswith("_w"))
    return Recipe(**{r: spec(r) for r in ROLES}, bf16_last=bf16_last)


ALL_GEMMS = ("fprop", "dgrad", "wgrad")
RECIPES = {  # docs/NUMERICS.md §7
    "bf16": Recipe(),
    "ufp4": _recipe("e1m2", 16, "fp32", ALL_GEMMS),
    "e2m1": _recipe("e2m1", 16, "fp32", ("wgrad",)),
    "nvfp4": _recipe("e2m1", 16, "e4m3", ("wgrad",), block_2d=True, bf16_last=0.15),
    "mxfp4": _recipe("e2m1", 32, "e8m0", ("wgrad",)),
    "ufp4-nv": _recipe("e1m2", 16, "e4m3", ALL_GEMMS),
}
_SPEC_KEYS = ("grid", "block", "scale", "max_level", "block_2d")
_OVERRIDE_KEYS = _SPEC_KEYS + ("rht", "sr", "bf16_first", "bf16_last", "rht_seed", "rht_resample", "pack_saved",
                                 "fused")


def _parse(key, value, kind):
    if not isinstance(value, str):
        return value
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"quant override {key}={value!r}: expected true or false")
        return value.lower() in ("true", "1")
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"quant override {key}={value!r}: expected a {kind.__name__}") from None


def _role_set(key, value):
    """'none' | 'all' | comma list of GEMM names (fprop, dgrad, wgrad) or role names."""
    value = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    if value in ("none", ""):
        return set()
    roles = set()
    for tok in value.split(","):
        if tok == "all":
            roles |= set(ROLES)
        elif tok in GEMMS:  # for sr, a GEMM name means its dY operand
            roles |= {r for r in GEMMS[tok] if key == "rht" or r.endswith("_dy")}
        elif tok == "dy" and key == "sr":
            roles |= {"dgrad_dy", "wgrad_dy"}
        elif tok in ROLES:
            roles.add(tok)
        else:
            raise ValueError(f"quant override {key}={value!r}: unknown {tok!r}; valid: none, all, "
                             f"{', '.join(GEMMS)}, {'dy, ' if key == 'sr' else ''}{', '.join(ROLES)}")
    return roles


def recipe_from_overrides(name: str, **overrides) -> Recipe:
    """A named recipe with command-line style overrides, e.g. rht='fprop,wgrad', sr='none',
    grid='int4', scale='e4m3', block='32', max_level='2', bf16_first='1'."""
    check_choice("recipe", name, list(RECIPES))
    recipe = dataclasses.replace(RECIPES[name])
    for key in overrides:
        check_choice("quant override key", key, _OVERRIDE_KEYS)
    types = {"grid": str, "block": int, "scale": str, "max_level": float, "block_2d": bool}
    spec_kw = {k: _parse(k, v, types[k]) for k, v in overrides.items() if k in _SPEC_KEYS}
    if (spec_kw or {"rht", "sr", "pack_saved", "fused"} & set(overrides)) and not recipe.quantized():
        raise ValueError(f"recipe {name!r} quantizes nothing, so {sorted(overrides)} cannot apply; "
                         "start from a 4-bit recipe such as ufp4")
    rht_roles = _role_set("rht", overrides["rht"]) if "rht" in overrides else None
    sr_roles = _role_set("sr", overrides["sr"]) if "sr" in overrides else None
    for role, spec in recipe.specs().items():
        if spec is None:
            continue
        kw = dict(spec_kw)
        if "block_2d" in kw:
            kw["block_2d"] = kw["block_2d"] and role.endswith("_w")
        if rht_roles is not None:
            kw["rht"] = role in rht_roles
        if sr_roles is not None:
            kw["rounding"] = "sr" if role in sr_roles else "rtne"
        if kw.get("rht") or kw.get("block", 16) != 16:
            kw.setdefault("block_2d", False)
        setattr(recipe, role, dataclasses.replace(spec, **kw))
    for key, kind in (("rht_seed", int), ("rht_resample", bool), ("pack_saved", bool), ("fused", bool)):
        if key in overrides:
            setattr(recipe, key, _parse(key, overrides[key], kind))
    for key in ("bf16_first", "bf16_last"):
        if key in overrides:
            v = _parse(key, overrides[key], float)
            if not (v >= 0 and math.isfinite(v)) or (v > 1 and v != int(v)):
                raise ValueError(f"{key}={overrides[key]} is not valid: a count of blocks (0, 1, 2, ...) "
                                 "or a fraction of them in (0, 1)")
            setattr(recipe, key, int(v) if v >= 1 or v == 0 else v)
    return recipe


def n_blocks(count_or_fraction, n: int) -> int:
    v = count_or_fraction
    return round(v * n) if isinstance(v, float) and v < 1 else int(v)


# ----------------------------------------------------------------------------- the quantized linear
# The quantization monitor: a trainer sets MONITOR to a callable on the (eager) steps it wants to
# measure; every quantized operand is then reported as
#   MONITOR(layer, role, x, x_hat, spec, dim, signs=signs, rotated=both_rotated)
# (see monitor.py for the statistics). None, the default, costs nothing.
MONITOR = None


def both_rotated(spec_a, spec_b) -> bool:
    """Both operands of a GEMM are rotated by the same RHT: they stay in the rotated basis."""
    return spec_a is not None and spec_b is not None and spec_a.rht and spec_b.rht


def gemm_operands(a, spec_a, dim_a, b, spec_b, dim_b, signs, roles=None, layer=""):
    """The two operands of one GEMM, each fake-quantized along the dim the GEMM reduces over (spec
    None: left as is). If both are rotated by the same RHT they stay in the rotated basis (the
    product is unchanged); otherwise each is rotated back. SR draws from torch's global generators
    (seed=None), so torch.manual_seed reproduces a run."""
    both = both_rotated(spec_a, spec_b)
    qa = a if spec_a is None else fake_quantize(a, spec_a, dim_a, signs=signs, keep_rotated=both)
    qb = b if spec_b is None else fake_quantize(b, spec_b, dim_b, signs=signs, keep_rotated=both)
    if MONITOR is not None and roles is not None:
        for role, t, q, spec, dim in ((roles[0], a, qa, spec_a, dim_a), (roles[1], b, qb, spec_b, dim_b)):
            if spec is not None:
                MONITOR(layer, role, t, q, spec, dim, signs=signs, rotated=both)
    return qa, qb


def qlinear_fprop(x, w_NK, bias, recipe, signs, layer=""):
    """fprop  Y = X·Wᵀ + b, reducing over K: X along rows, W along rows (QLinearFn's forward, and
    the whole layer where no gradient is taken)."""
    r, x_MK = recipe, x.reshape(-1, x.shape[-1])
    qx, qw = gemm_operands(x_MK, r.fprop_x, -1, w_NK, r.fprop_w, -1, signs, GEMMS["fprop"], layer)
    y_MN = qx @ qw.t()
    y_MN = y_MN if bias is None else y_MN + bias
    return y_MN.reshape(*x.shape[:-1], y_MN.shape[-1])


class QLinearFn(torch.autograd.Function):
    """Y = X·Wᵀ + b, its three GEMMs each on two operands quantized by the recipe (docs/NUMERICS.md
    §6). x [..., K], w [N, K], bias [N] or None; signs: the RHT signs; layer: the monitor's name.
    The spec of every quantized linear: the fused paths below give its bits (tests/test_quant.py)."""

    @staticmethod
    def forward(ctx, x, w_NK, bias, recipe, signs, layer):
        ctx.save_for_backward(x.reshape(-1, x.shape[-1]), w_NK)
        ctx.recipe, ctx.signs, ctx.layer, ctx.has_bias = recipe, signs, layer, bias is not None
        return qlinear_fprop(x, w_NK, bias, recipe, signs, layer)

    @staticmethod
    def backward(ctx, dy):
        r, signs, layer = ctx.recipe, ctx.signs, ctx.layer
        x_MK, w_NK = ctx.saved_tensors
        dy_MN = dy.reshape(-1, dy.shape[-1]).to(w_NK.dtype)
        # dgrad  dX = dY·W   reduces over N: dY along rows, W along columns
        qdy, qw = gemm_operands(dy_MN, r.dgrad_dy, -1, w_NK, r.dgrad_w, 0, signs, GEMMS["dgrad"], layer)
        dx_MK = qdy @ qw
        # wgrad  dW = dYᵀ·X  reduces over M: dY along columns, X along columns
        qdy, qx = gemm_operands(dy_MN, r.wgrad_dy, 0, x_MK, r.wgrad_x, 0, signs, GEMMS["wgrad"], layer)
        dw_NK = qdy.t() @ qx
        db = dy_MN.sum(0) if ctx.has_bias else None
        return dx_MK.reshape(*dy.shape[:-1], dx_MK.shape[-1]), dw_NK, db, None, None, None


def compute_dtype(x) -> torch.dtype:
    """The dtype a layer computes in: autocast's where it is on, else x's."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def set_rht(module: nn.Module, seed: int):
    """Give a quantized module (QLinear, moe.GroupedExperts) the RHT signs of seed, in place: its
    `rht_signs` buffer keeps its address, so compiled graphs (CUDA graphs too) read the new signs
    without recompiling, and `rht_seed` records which they are."""
    module.rht_seed = seed
    with torch.no_grad():
        module.rht_signs.copy_(rht_lib.random_signs(seed))


class QLinear(nn.Linear):
    """nn.Linear whose three training GEMMs follow a Recipe. Bias stays high precision. The RHT
    signs are a buffer (not saved: set from the recipe's seed, and per step by resample_rht)."""

    def __init__(self, in_features, out_features, bias=True, recipe: Recipe = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe or RECIPES["bf16"]
        self.rht_seed = self.recipe.rht_seed
        self.register_buffer("rht_signs", rht_lib.random_signs(self.rht_seed).to(self.weight.device),
                             persistent=False)
        self.layer = ""  # the dotted name in the model, for the monitor; set by convert()
        self.join, self.join_index = None, 0  # the Joined linears of one input it belongs to (convert)

    def init_weights(self):  # after to_empty() from the meta device (model.init_weights calls it)
        set_rht(self, self.rht_seed)

    def forward(self, x):
        if not self.recipe.quantized():
            return F.linear(x, self.weight, self.bias)
        if self.recipe.fused and MONITOR is None:  # the same bits, less work: "fused paths" below
            return fused_linear(self, x)
        # the layer name only when the monitor listens: read under torch.compile, it would be a
        # guard that differs per block, and blocks compiled apart would recompile until the limit
        layer, dtype = self.layer if MONITOR is not None else "", compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.to(dtype)
            args = (x.to(dtype), self.weight.to(dtype), bias, self.recipe, self.rht_signs, layer)
            # without gradients (evaluation) the forward alone: torch.compile of torch 2.11 mis-traces
            # an autograd Function under no_grad, and the graph break it raises can cost the whole-model
            # graph of the training steps that follow
            return QLinearFn.apply(*args) if torch.is_grad_enabled() else qlinear_fprop(*args)

    def extra_repr(self):
        return super().extra_repr() + f", recipe=[{self.recipe.describe()}]"


def convert(model: nn.Module, recipe) -> nn.Module:
    """Swap the nn.Linear layers of model.layers[i] (the transformer blocks) for QLinear in place,
    keeping bf16_first/bf16_last blocks unchanged. Embeddings, LM head, norms, attention BMMs and
    MoE routers are never touched. With recipe.fused, linears that read one input (a module's
    `shared_input` names them: q, k, v; w1, w3) are joined (join_shared_inputs)."""
    recipe = RECIPES[recipe] if isinstance(recipe, str) else recipe
    n = len(model.layers)
    first, last = n_blocks(recipe.bf16_first, n), n_blocks(recipe.bf16_last, n)
    for i, block in enumerate(model.layers):
        if i < first or i >= n - last:
            continue
        for name, mod in list(block.named_modules()):
            if type(mod) is not nn.Linear or {"router", "gate"} & set(name.split(".")):
                continue
            q = QLinear(mod.in_features, mod.out_features, mod.bias is not None, recipe, device="meta")
            q.weight, q.bias, q.layer = mod.weight, mod.bias, f"layers.{i}.{name}"
            q.rht_signs = rht_lib.random_signs(q.rht_seed).to(mod.weight.device)  # meta: init_weights
            parent = block.get_submodule(name.rpartition(".")[0]) if "." in name else block
            setattr(parent, name.rpartition(".")[2], q)
        if recipe.fused:
            join_shared_inputs(block)
    return model


def resample_rht(model: nn.Module, step: int):
    """Give every QLinear a fresh RHT sign vector for this step (recipe.rht_resample)."""
    for m in model.modules():
        if isinstance(m, QLinear):
            set_rht(m, m.recipe.rht_seed + step)


# ----------------------------------------------------------------------------- fused paths
# The quantized linear above, with less work and memory and the same bits (recipe.fused, the
# default; tests/test_quant.py compares each with QLinearFn):
#   joined linears  Linears that read one input (q, k, v; w1, w3) run as one FusedLinearFn: X is
#                   quantized once per role instead of once per layer, and the weights join along N
#                   into one GEMM of each kind. Every weight and every output gradient is still
#                   quantized on its own (its own e4m3 tensor scale too), and no block spans two
#                   layers, so outputs and weight gradients are those of the layers apart; dX is one
#                   GEMM instead of a sum of three (equal to fp32 rounding), and SR's draws are
#                   grouped otherwise.
#   pack_saved      X is kept for wgrad as its wgrad operand's codes + scales, quantized in the
#                   forward, instead of the bf16 X (recipe.pack_saved; RTNE, 1-D blocks).
#   one-read amax   An operand with e4m3 scales along rows and columns gets both tensor amaxes from
#                   one read (the kernels only: kernels.tensor_amax_both).
# The monitor reports every layer's own operands, X among them: while it listens, QLinearFn runs.


def packs_saved(recipe) -> bool:
    """recipe.pack_saved applies (fused path): X for wgrad is quantized deterministically (RTNE) in
    1-D blocks, so its codes dequantize to exactly the operand the backward would make."""
    s = recipe.wgrad_x
    return recipe.fused and recipe.pack_saved and s is not None and s.rounding == "rtne" and not s.block_2d


def keep_for_backward(ctx, x, recipe, signs, packs: bool, *others, amax=None):
    """ctx.save_for_backward(x, *others), with x as its wgrad operand's codes + scales if packs (amax:
    that operand's e4m3 tensor amax if known)."""
    ctx.packed = None
    if not packs:
        return ctx.save_for_backward(x, *others)
    qt = _quantize_any(x, recipe.wgrad_x, 0, signs, amax)
    ctx.packed = (qt.spec, qt.dim, qt.dtype, qt.signs)
    ctx.save_for_backward(qt.codes, qt.scales, qt.tensor_scale, *others)


def kept_for_backward(ctx) -> tuple:
    """(x or its QTensor, [others]) as keep_for_backward saved them."""
    if ctx.packed is None:
        x, *others = ctx.saved_tensors
        return x, others
    codes, scales, t, *others = ctx.saved_tensors
    return QTensor(codes, scales, t, *ctx.packed), others


class _Parts(tuple):
    """2-D tensors joined along dim `join` into one GEMM operand: weights [N_i, K] (join 0), or the
    output gradients [M, N_i] (join 1) of linears that read one input (quant.linears); one part for
    a linear alone."""

    def __new__(cls, tensors, join: int):
        parts = super().__new__(cls, tensors)
        parts.join = join
        return parts


def _operand(t, spec, dim, signs, keep_rotated, amax=None):
    """The GEMM operand of t: fake_quantize(t); t's dequantization if it is kept packed (QTensor); or
    for _Parts, the joined operand with every part quantized as it would be on its own. No block
    spans two parts (joinable), so without a tensor scale that is one call on the joined tensor
    (SR's draws grouped otherwise); with e4m3 scales each part keeps its own tensor scale (amax[i])."""
    if isinstance(t, QTensor):
        return dequantize_any(t, keep_rotated)
    if not isinstance(t, _Parts):
        return t if spec is None else fake_quantize(t, spec, dim, signs=signs, keep_rotated=keep_rotated, amax=amax)
    if spec is not None and spec.scale != "e4m3":  # one kernel launch instead of one a part
        return fake_quantize(_joined(list(t), t.join), spec, dim, signs=signs, keep_rotated=keep_rotated)
    amax = amax or [None] * len(t)
    if spec is None or len(t) == 1 or not _use_kernels(t[0]):
        return _joined([_operand(p, spec, dim, signs, keep_rotated, a) for p, a in zip(t, amax)], t.join)
    signs = (rht_lib.random_signs(0) if signs is None else signs).to(t[0].device, torch.float32) if spec.rht else None
    sr, dim = spec.rounding == "sr", dim % 2
    amaxes = list(amax) if all(a is not None for a in amax) else []
    return kernels.fake_quantize_joined_op(list(t), spec.levels, spec.block, spec.scale, sr, signs, spec.block_2d,
                                           dim, t.join, keep_rotated, None, amaxes)


def _joined(parts, join: int = 0) -> torch.Tensor:
    return torch.cat(parts, join) if len(parts) > 1 else parts[0]


def fused_operands(a, spec_a, dim_a, b, spec_b, dim_b, signs, amax=(None, None)):
    """gemm_operands for the fused path: an operand may be _Parts or a packed QTensor (_operand);
    amax: the operands' e4m3 tensor amaxes where known."""
    both = both_rotated(spec_a, spec_b)
    return _operand(a, spec_a, dim_a, signs, both, amax[0]), _operand(b, spec_b, dim_b, signs, both, amax[1])


def _fused_fprop(x, bias, r, signs, w_parts):
    """FusedLinearFn's fprop  Y = X·Wᵀ: (the outputs, one a part; X as [M, K]; X's and the weights'
    e4m3 tensor amaxes, rows and columns, from one read each where they are used)."""
    x_MK = x.reshape(-1, x.shape[-1])
    amax = _amax_both(x_MK, r.fprop_x, r.wgrad_x, signs) if packs_saved(r) else (None, None)
    amax_w = [_amax_both(w, r.fprop_w, r.dgrad_w, signs) for w in w_parts]
    qx, qw = fused_operands(x_MK, r.fprop_x, -1, _Parts(w_parts, 0), r.fprop_w, -1, signs,
                            amax=(amax[0], [a[0] for a in amax_w]))   # qw: [N, K] joined
    y_MN = qx @ qw.t()
    y_MN = y_MN if bias is None else y_MN + bias
    y = y_MN.reshape(*x.shape[:-1], y_MN.shape[-1])
    return (y.split([p.shape[0] for p in w_parts], -1) if len(w_parts) > 1 else y), x_MK, amax, amax_w


class FusedLinearFn(torch.autograd.Function):
    """QLinearFn for the weights of linears that read one input, as parts [N_i, K] joined along N into
    one GEMM of each kind; one output per part (one part: a linear alone). Each part, and its output's
    gradient, is quantized on its own; X once per role. Only the parts are kept, and X as is, or
    (packs_saved) as its wgrad operand's codes + scales. An operand with e4m3 scales both ways gets
    its two tensor amaxes from one read (_amax_both): X's and W's in the forward (W's column ones kept
    for dgrad), dY's in the backward."""

    @staticmethod
    def forward(ctx, x, bias, recipe, signs, *w_parts):
        y, x_MK, amax, amax_w = _fused_fprop(x, bias, recipe, signs, w_parts)
        cols = [a[1] for a in amax_w]
        ctx.amax_w = all(a is not None for a in cols)
        keep_for_backward(ctx, x_MK, recipe, signs, packs_saved(recipe), *w_parts, *(cols if ctx.amax_w else ()),
                          amax=amax[1])
        ctx.recipe, ctx.signs, ctx.has_bias, ctx.n = recipe, signs, bias is not None, len(w_parts)
        return y

    @staticmethod
    def backward(ctx, *dys):
        r, signs, n = ctx.recipe, ctx.signs, ctx.n
        x_MK, kept = kept_for_backward(ctx)  # or its packed wgrad operand
        w_parts, amax_w = kept[:n], (kept[n:] if ctx.amax_w else [None] * n)
        dy_parts = [dy.reshape(-1, dy.shape[-1]).to(w_parts[0].dtype) for dy in dys]   # [M, N_i]
        amax = [_amax_both(dy, r.dgrad_dy, r.wgrad_dy, signs) for dy in dy_parts]
        dy = _Parts(dy_parts, 1)                                                       # [M, N] joined
        # dgrad  dX = dY·W
        qdy, qw = fused_operands(dy, r.dgrad_dy, -1, _Parts(w_parts, 0), r.dgrad_w, 0, signs,
                                 amax=([a[0] for a in amax], amax_w))
        dx_MK = qdy @ qw
        # wgrad  dW = dYᵀ·X
        qdy, qx = fused_operands(dy, r.wgrad_dy, 0, x_MK, r.wgrad_x, 0, signs, amax=([a[1] for a in amax], None))
        dws = (qdy.t() @ qx).split([p.shape[0] for p in w_parts])                     # [N_i, K] each
        db = _joined([d.sum(0) for d in dy_parts]) if ctx.has_bias else None
        return (dx_MK.reshape(*dys[0].shape[:-1], dx_MK.shape[-1]), db, None, None, *dws)


def _fused_apply(x, layers):
    """The outputs of QLinears that read x (one of them, or several joinable ones) from one
    FusedLinearFn, in the autocast dtype (autocast itself off inside)."""
    dtype, first = compute_dtype(x), layers[0]
    bias = None if all(m.bias is None for m in layers) else _joined(
        [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in layers])
    with torch.autocast(x.device.type, enabled=False):
        bias = None if bias is None else bias.to(dtype)
        weights = tuple(m.weight.to(dtype) for m in layers)
        if not torch.is_grad_enabled():  # evaluation: the forward alone, as QLinear.forward
            return _fused_fprop(x.to(dtype), bias, first.recipe, first.rht_signs, weights)[0]
        return FusedLinearFn.apply(x.to(dtype), bias, first.recipe, first.rht_signs, *weights)


def fused_linear(layer, x):
    """QLinear.forward on the fused path: through the linears joined to it (convert), if any."""
    return _fused_apply(x, [layer]) if layer.join is None else layer.join(layer.join_index, x)


def joinable(layers) -> bool:
    """Whether linears that read one input can share one FusedLinearFn: QLinears of one quantized
    recipe (so one RHT seed: convert and resample_rht set it per recipe; reading rht_seed here would
    make compiled graphs guard on it), and every output width a whole number of blocks (so no block or
    RHT group of dY or of a weight column spans two layers). Then every block of every operand is the
    one the separate layers quantize."""
    first = layers[0]
    if not all(isinstance(layer, QLinear) for layer in layers):
        return False
    recipe = first.recipe
    if not recipe.quantized() or any(m.recipe is not recipe for m in layers):
        return False
    specs = [s for s in recipe.specs().values() if s is not None]
    return all(m.out_features % max(s.block, 16) == 0 for m in layers for s in specs)


def linears(x, *layers) -> tuple:
    """(layer(x) for layer in layers) for linears that read the same x: one FusedLinearFn where they
    are joinable and the fused path runs, else each layer on its own."""
    if len(layers) < 2 or not joinable(layers) or not layers[0].recipe.fused or MONITOR is not None:
        return tuple(layer(x) for layer in layers)
    return _fused_apply(x, layers)


class Joined:
    """Linears that read one input, joined by convert (a module's `shared_input` names them). The
    model calls them one by one, as plain PyTorch does: the first called with an input x runs all of
    them as one FusedLinearFn, and each of the others takes its output when called with that x (with
    another input a layer computes anew). Once every output is taken no reference is kept. Under
    torch.compile this bookkeeping is traced away: the graph holds the one FusedLinearFn."""

    def __init__(self, layers):
        self.layers = list(layers)
        self.x, self.ys = None, [None] * len(self.layers)

    def __call__(self, i: int, x):
        if self.x is not x or self.ys[i] is None:
            self.x, self.ys = x, list(_fused_apply(x, self.layers))
        y, self.ys[i] = self.ys[i], None
        if all(t is None for t in self.ys):
            self.x = None
        return y


def join_shared_inputs(module: nn.Module):
    """Join the QLinears that read one input, as the modules of `module` name them in `shared_input`
    (model.Attention: wq, wk, wv), where they are joinable."""
    for parent in module.modules():
        layers = [getattr(parent, name) for name in getattr(parent, "shared_input", ())]
        if len(layers) > 1 and joinable(layers):
            joined = Joined(layers)
            for i, layer in enumerate(layers):
                layer.join, layer.join_index = joined, i


# ----------------------------------------------------------------------------- kernel dispatch
BACKEND = {"name": "auto", "logged": set()}  # 'auto' (Triton on CUDA), 'torch' or 'triton'


def set_backend(name: str):
    """Choose the quantizer: 'torch' (reference), 'triton' (kernels.py; error where unavailable), 'auto'."""
    check_choice("quant backend", name, ("auto", "torch", "triton"))
    BACKEND["name"] = name


def _use_kernels(x) -> bool:
    if BACKEND["name"] == "triton" and not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("quant backend 'triton' needs a CUDA tensor (or TRITON_INTERPRET=1 on CPU); "
                           "use set_backend('torch') or 'auto' on this machine")
    use = BACKEND["name"] == "triton" or (BACKEND["name"] == "auto" and x.is_cuda)
    # (is_compiling first: a compiled graph that read the set would guard on it, and recompile once it changed)
    if not use and not torch.compiler.is_compiling() and "torch" not in BACKEND["logged"]:
        log.info("quantizing with the PyTorch reference (quant.py)")
        BACKEND["logged"].add("torch")
    return use


def _kernel_fake_quantize(x, spec, dim, seed, signs, keep_rotated, amax=None):
    """fake_quantize through the fused Triton kernel (kernels.py): rows of any tensor, or the columns
    of a 2-D one (no transpose). Traced by torch.compile (or given a tensor subclass) it is the
    operator nanofp4::fake_quantize, one opaque node; eager, a plain tensor goes straight to the op's
    body, skipping the dispatch (hundreds of calls a step). Traced, SR's seed is drawn on the device
    inside the graph (a tensor the kernel reads), so a replayed graph, a CUDA graph too, draws anew."""
    compiling = torch.compiler.is_compiling()
    if not compiling and "triton" not in BACKEND["logged"]:  # (the set unread when traced: no guard on it)
        log.info("quantizing with the Triton kernels (kernels.py)")
        BACKEND["logged"].add("triton")
    _check_shape(x, spec, dim)
    dim = dim % x.dim()
    moved = dim != x.dim() - 1 and not (x.dim() == 2 and dim == 0)
    xk = (x.movedim(dim, -1) if moved else x).contiguous()
    if spec.rht and signs is None:
        signs = rht_lib.random_signs(0)
    signs = signs.to(x.device, torch.float32) if spec.rht else None
    sr, seed = spec.rounding == "sr", -1 if seed is None else int(seed)
    kdim = -1 if moved or dim == x.dim() - 1 else 0
    y = kernels.fake_quantize_op(xk, spec.levels, spec.block, spec.scale, sr, signs, spec.block_2d, kdim, seed,
                                 keep_rotated, None, amax)
    return y.movedim(-1, dim) if moved else y


def _quantize_any(x, spec, dim, signs, amax=None) -> QTensor:
    """quantize(), through the Triton kernel where fake_quantize would use it (same codes and scales;
    amax as fake_quantize takes it); traced by torch.compile, the operator nanofp4::quantize_codes."""
    if not _use_kernels(x):
        return quantize(x, spec, dim, signs=signs)
    s = signs if spec.rht else None
    codes, scales, t = kernels.quantize_codes_op(x, spec.levels, spec.block, spec.scale, s, dim, amax)
    return QTensor(codes, scales, t, spec, dim % x.dim(), x.dtype, s)


def dequantize_any(qt: QTensor, keep_rotated: bool) -> torch.Tensor:
    """qt.dequantize(keep_rotated=...), through the Triton kernel where the kernels run (traced: the
    operator nanofp4::dequantize), with the same bits."""
    if not _use_kernels(qt.codes):
        return qt.dequantize(keep_rotated=keep_rotated)
    spec = qt.spec
    y = kernels.dequantize_op(qt.codes, qt.scales, qt.tensor_scale, spec.levels, spec.block, spec.scale, qt.signs,
                              keep_rotated, qt.dtype)
    return y.movedim(-1, qt.dim)


def _amax_both(t, spec_rows, spec_cols, signs) -> tuple:
    """The e4m3 tensor amax of the 2-D t quantized along rows (spec_rows) and along columns (spec_cols,
    rotated), from one read (kernels.tensor_amax_both), where the kernels run; else (None, None)."""
    if not (spec_rows is not None and spec_cols is not None and spec_rows.scale == spec_cols.scale == "e4m3"
            and spec_cols.rht and not spec_rows.block_2d and t.dim() == 2 and t.shape[0] % 16 == 0
            and t.shape[1] % 16 == 0 and _use_kernels(t)):
        return None, None
    signs = (rht_lib.random_signs(0) if signs is None else signs).to(t.device, torch.float32)
    a = kernels.tensor_amax_both_op(t, signs, spec_rows.rht)
    return a[0], a[1]
