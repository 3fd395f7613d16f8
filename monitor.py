"""How faithfully one operand survived 4-bit quantization: the numbers a training run can log.

For an operand x and its quantized-dequantized version x̂ (what the GEMM consumes):
  alpha      = <x̂, x> / ‖x‖²        signal gain; below 1 the quantizer shrinks the tensor
  nmse       = ‖x̂ − x‖² / ‖x‖²      relative error energy; sqnr_db = −10·log10(nmse)
  clipped    fraction of elements whose |x/s| exceeded g_max before the clamp (s = the block's
             dequantization scale). fp32 scales put the block max exactly on g_max, so it is 0 by
             construction; e4m3 clips where the scale cast rounded down; e8m0 is MX saturation.
  underflow  fraction of the nonzero elements that quantized to 0.
All of it is measured in the basis that is quantized: with RHT, x is rotated first (rotations keep
norms and inner products, so alpha and nmse are the same in either basis up to rounding).
"""
import dataclasses

import torch

import quant
import rht as rht_lib

CLIP_TOL = 2.0**-16  # |x/s| may exceed g_max by the last bits of the fp32 division: not a clip


def _blocks(x, spec, dim, signs):
    """x in fp32, dim moved last, rotated if signs is given, viewed [..., nblocks, block]."""
    xm = x.movedim(dim, -1).float()
    if signs is not None:
        xm = rht_lib.rht(xm, signs)
    return xm.unflatten(-1, (-1, spec.block))


@torch.no_grad()
def stats(x, x_hat, spec: quant.QuantSpec, dim: int = -1, *, signs=None, rotated: bool = False) -> dict:
    """alpha, nmse, sqnr_db, clipped and underflow fractions of one quantized operand.

    x_hat is fake_quantize(x, spec, dim, ...) — rotated back (rotated=False) or, as in the GEMM
    path, left in the RHT basis (rotated=True). signs: the RHT sign vector (default: seed 0).
    """
    if x.shape != x_hat.shape:
        raise ValueError(f"stats: x {tuple(x.shape)} and x_hat {tuple(x_hat.shape)} must have one shape")
    if spec.rht and signs is None:
        signs = rht_lib.random_signs(0)
    dim = dim % x.dim()
    xb = _blocks(x, spec, dim, signs if spec.rht else None)
    hb = _blocks(x_hat, spec, dim, signs if spec.rht and not rotated else None)
    # the block scales do not depend on the rounding; RTNE draws no random numbers
    qt = quant.quantize(x, dataclasses.replace(spec, rounding="rtne"), dim, signs=signs)
    s = qt.block_scales().unsqueeze(-1)                                    # [..., nblocks, 1]
    xd, hd = xb.double(), hb.double()
    energy = (xd * xd).sum()
    nmse = float(((hd - xd) ** 2).sum() / energy)
    nonzero = xb != 0
    # a zero level stays below a quarter of the smallest nonzero level even after rotating back
    zero_q = hb.abs() < 0.25 * spec.levels[1] * s
    return {
        "alpha": float((hd * xd).sum() / energy),
        "nmse": nmse,
        "sqnr_db": float(-10 * torch.log10(torch.tensor(nmse))),
        "clipped": float((xb.abs() / s > spec.g_max * (1 + CLIP_TOL)).float().mean()),
        "underflow": float((nonzero & zero_q).sum() / nonzero.sum().clamp(min=1)),
    }


class Recorder:
    """Collects stats() per layer and operand role over one step, for the JSONL log.

    It is the callback quant.py calls for every quantized operand when quant.MONITOR is set:
        recorder(layer, role, x, x_hat, spec, dim, signs=signs, rotated=both_rotated)
    summary() gives {"layers.3.ffn.w2": {"fprop_x": {alpha, nmse, ...}, ...}, ...} (means over the
    calls of the step, e.g. micro-steps) plus "all": the mean over layers of every role.
    """

    def __init__(self):
        self.sums, self.counts = {}, {}

    def __call__(self, layer, role, x, x_hat, spec, dim=-1, *, signs=None, rotated=False):
        for key, v in stats(x, x_hat, spec, dim, signs=signs, rotated=rotated).items():
            for where in (layer, "all"):
                self.sums[(where, role, key)] = self.sums.get((where, role, key), 0.0) + v
        for where in (layer, "all"):
            self.counts[(where, role)] = self.counts.get((where, role), 0) + 1

    def summary(self) -> dict:
        """{layer: {role: {metric: mean over the calls}}} with layer "all" for every layer; empty
        when nothing was recorded."""
        out = {}
        for (where, role, key), total in self.sums.items():
            out.setdefault(where, {}).setdefault(role, {})[key] = total / self.counts[(where, role)]
        return out
