"""Triton kernels for 4-bit quantization: one fused pass, bit for bit like the PyTorch reference in
quant.py (the spec: docs/NUMERICS.md; a program's layout and the proofs: docs/KERNELS.md).

A call sees a 2-D view [M, K] of its input, K the quantized (reduction) dim, cut into groups of 16.
A program takes a tile of groups and, in registers: rotates each group (optional RHT-16), takes the
block amax and scale (fp32 | e4m3 two-level | e8m0), rounds |x / scale| to a level index (RTNE, or SR
from Philox), and writes the packed codes with their scales and/or the dequantized tensor (rotated
back, or kept rotated for the emulated GEMM). dim=-1 quantizes along rows; dim=0 along the columns of
a 2-D tensor, without a transpose. e4m3 scales need the tensor amax first: a separate pass
(tensor_amax; tensor_amax_both gives the rows' and the columns' from one read of x). Each step is the
reference's fp32 operation, in its order; two shortcuts return the same bits (docs/KERNELS.md §4-5).

Sections: jit helpers; kernels; launch planning; public functions; torch.library operators nanofp4::*
with one entry point each (*_op: the operator when traced by torch.compile, its body otherwise).
"""

import collections
import functools
import itertools
import math
import operator
import os
import struct
from typing import Optional

import torch
import triton
import triton.language as tl
from triton import knobs

E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SCALE_MODES = {"fp32": 0, "e4m3": 1, "e8m0": 2}  # the kernels' SCALE: FP32, E4M3, E8M0
FP32, E4M3, E8M0 = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
# the kernels' OUT_MODE; OUT_BF16_BITS rounds to bf16 by integer ops, for the interpreter (its bf16 casts are wrong)
OUT_F32, OUT_BF16, OUT_BF16_BITS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
# read by _plan, which caches them (_plan.cache_clear() after a change)
PHILOX_ROUNDS = 7  # SR's Philox rounds (docs/KERNELS.md §6)
INTERPRET_FAST_DIV = False  # set where the interpreter's FMA is exact (tests/conftest.py, docs/KERNELS.md §8)
_SR_B = tl.constexpr(2.0**-9 * (1 + 2.0**-17))  # uniform-grid SR's constant (_round_to_grid)
# the fast division's range of scales as fp32 bits: 2**-98 up to 2**123, or 2**100 for uniform SR (docs/KERNELS.md §4)
_FAST_LO, _FAST_TOP, _FAST_TOP_SR_UNIFORM = tl.constexpr(0x0E800000), tl.constexpr(0x7D000000), tl.constexpr(0x71800000)


# ----------------------------------------------------------------------------- jit helpers
@triton.jit
def _f32(bits):
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _max_nan(a, b):
    """max(a, b), NaN if either is NaN (tl.maximum's default drops a NaN)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _pow2(p):
    """2**p as fp32 for integer p in [-127, 127] (2**-127 is subnormal)."""
    return _f32(tl.where(p >= -126, (p + 127) << 23, 0x00400000))


@triton.jit
def _butterfly(v):
    """v [BM, NG, 8, 2] times 4·H16: stages h = 1, 2, 4, 8 of (a, b) -> (a + b, a - b), as rht.py."""
    BM: tl.constexpr = v.shape[0]
    NG: tl.constexpr = v.shape[1]
    v = tl.reshape(v, (BM, NG, 2, 2, 2, 2))  # bit axes of the element index: (b2, b1, b0, b3)
    for _ in tl.static_range(4):
        v = tl.permute(v, (0, 1, 5, 2, 3, 4))  # brings b0, then b1, b2, b3 to the last axis
        a, b = tl.split(v)
        v = tl.join(a + b, a - b)
    return tl.reshape(v, (BM, NG, 8, 2))  # after four rotations the axes are (b2, b1, b0, b3) again


@triton.jit
def _signs(signs_ptr):
    """The 16 RHT signs as [1, 1, 8, 2], matching the tile layout."""
    j = tl.arange(0, 8)[:, None] + 8 * tl.arange(0, 2)[None, :]
    return tl.load(signs_ptr + j)[None, None, :, :]


@triton.jit
def _join8(x0, x1, x2, x3, x4, x5, x6, x7):
    """Eight [BM, NG] tensors -> [BM, NG, 8] (x_j at [.., j]), all in the same thread."""
    v = tl.join(tl.join(tl.join(x0, x1), tl.join(x2, x3)), tl.join(tl.join(x4, x5), tl.join(x6, x7)))
    return tl.reshape(tl.permute(v, (0, 1, 4, 3, 2)), (x0.shape[0], x0.shape[1], 8))


@triton.jit
def _split8(v):
    """[BM, NG, 8] -> eight [BM, NG] tensors (the inverse of _join8)."""
    e, o = tl.split(tl.reshape(v, (v.shape[0], v.shape[1], 2, 2, 2)))
    e0, e1 = tl.split(e)
    o0, o1 = tl.split(o)
    x0, x4 = tl.split(e0)
    x2, x6 = tl.split(e1)
    x1, x5 = tl.split(o0)
    x3, x7 = tl.split(o1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _tile_offsets(pid_m, pid_g, M, K, BM: tl.constexpr, NG: tl.constexpr, COLWISE: tl.constexpr,
                  I64: tl.constexpr, EVEN: tl.constexpr = False):
    """Rows m [BM], groups g [NG], the tile mask [BM, NG] and the element offset of (m, g, 0). EVEN: the
    tiles cover the [M, K] view, so the mask is a constant (the loads and stores lose theirs)."""
    m = pid_m * BM + tl.arange(0, BM)
    g = pid_g * NG + tl.arange(0, NG)
    if EVEN:
        mask = tl.full((BM, NG), True, tl.int1)
    else:
        mask = (m < M)[:, None] & (g < K // 16)[None, :]
    mm = m.to(tl.int64) if I64 else m
    gg = g.to(tl.int64) if I64 else g
    if COLWISE:  # element (m, k) of the view is x[k, m] of the [K, M] input (docs/KERNELS.md §3)
        base = mm[:, None] + (gg * 16 * M)[None, :]
    else:
        base = mm[:, None] * K + gg[None, :] * 16
    return m, g, mask, base


@triton.jit
def _from_words(w):
    """Words [BM, NG, 4] of two elements (bf16: int32, fp32: int64; 2i in word i's low half) -> fp32 [BM, NG, 8]."""
    if w.dtype == tl.int32:
        ev = _f32(w << 16)
        od = _f32(w & -65536)
    else:
        ev = _f32(w.to(tl.int32))
        od = _f32((w >> 32).to(tl.int32))
    return tl.reshape(tl.join(ev, od), (w.shape[0], w.shape[1], 8))


@triton.jit
def _load_tile(x_ptr, base, mask, M, COLWISE: tl.constexpr):
    """The tile [BM, NG, 8, 2] in fp32, masked elements 0: rows read as words of two elements (_tile_input),
    columns as the 16 rows of each group, bf16 as its int16 bits (docs/KERNELS.md §3)."""
    if COLWISE:
        r = ()
        for k in tl.static_range(16):
            v = tl.load(x_ptr + base + k * M, mask=mask, other=0)
            r = r + ((_f32(v.to(tl.int32) << 16) if v.dtype == tl.int16 else v.to(tl.float32)),)
        lo = _join8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7])
        hi = _join8(r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15])
    else:
        p = x_ptr + (base >> 1)[:, :, None] + tl.arange(0, 4)[None, None, :]
        lo = _from_words(tl.load(p, mask=mask[:, :, None], other=0))
        hi = _from_words(tl.load(p + 4, mask=mask[:, :, None], other=0))
    return tl.join(lo, hi)


@triton.jit
def _store_tile(out_ptr, v, base, mask, M, COLWISE: tl.constexpr):
    """Store the tile [BM, NG, 8, 2] (any dtype) into the input's layout."""
    lo, hi = tl.split(v)
    if COLWISE:
        ls = _split8(lo)
        hs = _split8(hi)
        for k in tl.static_range(8):
            tl.store(out_ptr + base + k * M, ls[k], mask=mask)
            tl.store(out_ptr + base + (k + 8) * M, hs[k], mask=mask)
    else:
        p = out_ptr + base[:, :, None] + tl.arange(0, 8)[None, None, :]
        tl.store(p, lo, mask=mask[:, :, None])
        tl.store(p + 8, hi, mask=mask[:, :, None])


@triton.jit
def _store_dequant(out_ptr, dq, signs_ptr, base, mask, M, COLWISE: tl.constexpr, RHT: tl.constexpr,
                   KEEP_ROTATED: tl.constexpr, OUT_MODE: tl.constexpr):
    """Store the fp32 dequantized tile as OUT_MODE says, rotated back (rht.rht_inverse) unless KEEP_ROTATED."""
    if RHT and not KEEP_ROTATED:
        dq = _butterfly(dq) * (_signs(signs_ptr) * 0.25)  # 0.25 and the signs: one exact multiply
    if OUT_MODE == OUT_BF16:
        dq = dq.to(tl.bfloat16)
    elif OUT_MODE == OUT_BF16_BITS:  # RNE by integer ops; NaN -> 0x7FC0
        b = dq.to(tl.int32, bitcast=True)
        dq = tl.where(dq != dq, 0x7FC0, (b + 0x7FFF + ((b >> 16) & 1)) >> 16).to(tl.int16)
    _store_tile(out_ptr, dq, base, mask, M, COLWISE)


@triton.jit
def _block_amax(x, BM: tl.constexpr, NG: tl.constexpr, QB: tl.constexpr, BLOCK_2D: tl.constexpr):
    """Tile [BM, NG, 8, 2] -> the max |x| of each group's block (16, 32 or 16x16) [BM, NG]; NaN if it has one."""
    a = tl.reduce(tl.reduce(tl.abs(x), 3, _max_nan), 2, _max_nan)
    if BLOCK_2D:
        t = tl.reduce(tl.reshape(a, (BM // 16, 16, NG)), 1, _max_nan)
        a = tl.reshape(tl.broadcast_to(t[:, None, :], (BM // 16, 16, NG)), (BM, NG))
    elif QB == 32:
        t = tl.reduce(tl.reshape(a, (BM, NG // 2, 2)), 2, _max_nan)
        a = tl.reshape(tl.broadcast_to(t[:, :, None], (BM, NG // 2, 2)), (BM, NG))
    return a


@triton.jit
def _tensor_scale(amax_ptr, G: tl.constexpr):
    """e4m3's tensor scale t = max(amax_T / 448g, 2**-120) (1 if amax_T = 0), RN(1 / t); amax_T's bits at amax_ptr."""
    amax_t = _f32(tl.load(amax_ptr))
    t = tl.where(amax_t > 0, tl.maximum(tl.math.div_rn(amax_t, 448.0 * G), 2.0**-120), 1.0)
    return t, tl.math.div_rn(1.0, t)


@triton.jit
def _block_scale(amax, finite, t, it, SCALE: tl.constexpr, G: tl.constexpr, E8_SHIFT: tl.constexpr):
    """Block amax [BM, NG] (0 if non-finite) -> (f, deq, stored), as the reference: y = x / f (fp32) or x * f
    (e4m3, e8m0); dequant = level * deq (NaN if non-finite); the stored scale. t, it: _tensor_scale's."""
    if SCALE == FP32:  # s = amax / g; an all-zero block divides by 1 (y = 0)
        s = tl.math.div_rn(amax, G)
        f = tl.where(s > 0, s, 1.0)
        deq = tl.where(finite, s, float("nan"))
        stored = deq
    elif SCALE == E4M3:  # sb = e4m3(clamp((amax / g) / t)); f = (1 / t) / sb
        v = tl.math.div_rn(tl.math.div_rn(amax, G), t)
        v = tl.where(v != v, v, tl.minimum(tl.maximum(v, 0.015625), 448.0))
        vb = v.to(tl.int32, bitcast=True)
        vb = (vb + 0x7FFFF + ((vb >> 20) & 1)) & -1048576  # RNE to 3 mantissa bits
        sb = _f32(vb)
        f = tl.math.div_rn(it, sb)
        deq = tl.where(finite, t * sb, float("nan"))
        stored = tl.where(finite & (v == v), (((vb >> 23) - 120) << 3) | ((vb >> 20) & 7), 0x7F)
    else:  # e8m0: s = 2**e, e = E(amax) - floor(log2 g); f = 2**-max(e, -126)
        e = tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - E8_SHIFT, -127), 127)
        f = _pow2(-tl.maximum(e, -126))
        deq = tl.where(finite, _pow2(e), float("nan"))
        stored = tl.where(finite, e + 127, 255)
    return f, deq, stored


@triton.jit
def _div_bf16(x, s, r):
    """RN(x / s), r = RN(1 / s), for bf16 x and s = RN(amax / g) of a bf16 amax; else faithful (docs/KERNELS.md §4)."""
    return tl.fma(x, r, x * (tl.fma(s * -1.0, r, 1.0) * r))  # s * -1.0 folds into the FMA (-s: an op 0 - s)


@triton.jit
def _div_fast(x, s, r):
    """RN(x / s), r = RN(1 / s), for fp32 x: _div_bf16 and one Newton correction (docs/KERNELS.md §4)."""
    q = _div_bf16(x, s, r)
    return tl.fma(tl.fma(s * -1.0, q, x), r, q)


@triton.jit
def _outside_fast_range(v, TOP: tl.constexpr = _FAST_TOP):
    """v outside [2**-98, TOP] (fp32 bits) or NaN, by one unsigned compare (zeros wrap; v < 0, NaN lie above)."""
    return v.to(tl.uint32, bitcast=True) - _FAST_LO > TOP - _FAST_LO


@triton.jit
def _scaled(x, f, SCALE: tl.constexpr, G: tl.constexpr, UNIFORM: tl.constexpr, STEP: tl.constexpr,
            SR: tl.constexpr, FAST_DIV: tl.constexpr, X_BF16: tl.constexpr):
    """y = x / scale [BM, NG, 8, 2] as _round_to_grid takes it: for fp32 scales the fast division, IEEE
    division or (SR) x * RN(1/s), for e4m3 and e8m0 |x * f| (docs/KERNELS.md §4, §6)."""
    SR_SCALE: tl.constexpr = 0.001953125 / STEP  # 2**-9 / STEP
    fe = f[:, :, None, None]
    if SCALE != FP32:
        y = tl.minimum(tl.abs(x * fe), G)
        if SR and UNIFORM:
            y = tl.fma(y, SR_SCALE, _SR_B)
    elif SR:
        TOP: tl.constexpr = _FAST_TOP_SR_UNIFORM if UNIFORM else _FAST_TOP
        k = tl.where(_outside_fast_range(f, TOP), tl.where(f < 1.0, 1.8446744073709552e19, 5.421010862427522e-20), 1.0)
        rs = _f32(tl.math.div_rn(1.0, f * k).to(tl.int32, bitcast=True) - 4)  # RN(1/s) less 4 ulps
        xk = x * k[:, :, None, None]  # groups out of range scaled by 2**±64 first (docs/KERNELS.md §4)
        if UNIFORM:  # (the min only acts where s is subnormal)
            y = tl.minimum(tl.fma(tl.abs(xk), (rs * SR_SCALE)[:, :, None, None], _SR_B), G * SR_SCALE + _SR_B)
        else:
            y = tl.minimum(tl.abs(xk * rs[:, :, None, None]), G)
    else:
        fast = False
        if FAST_DIV:  # one test a tile: its largest bits(f) - bits(2**-98), unsigned
            fast = tl.max(f.to(tl.uint32, bitcast=True) - _FAST_LO) <= _FAST_TOP - _FAST_LO
        if fast:
            r = tl.math.div_rn(1.0, f)[:, :, None, None]
            y = _div_bf16(x, fe, r) if X_BF16 else _div_fast(x, fe, r)
        else:
            y = tl.minimum(tl.maximum(tl.math.div_rn(x, fe), -G), G)
    return y


@triton.jit
def _round_to_grid(y, k, UNIFORM: tl.constexpr, STEP: tl.constexpr, CB: tl.constexpr, SR: tl.constexpr):
    """|y| <= g_max -> (level index int32, level value fp32), RTNE or SR with 16-bit random integers k: the
    fp32 sum |y| + c, c = spacing * 2**23 (bits CB on uniform grids), lands on the level (docs/KERNELS.md §5-6)."""
    ay = tl.abs(y)
    if UNIFORM:
        cb = CB
        base = 0
    else:
        cb = tl.maximum(y.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000) + 0x0B000000
        base = (cb >> 22) - 298  # index of level 0, 2 or 4 at spacing .5, 1, 2
    if SR and UNIFORM:
        v = tl.fma(_f32(k), 2.1267647932558654e37, y) + 16383.9990234375  # k * 2**-149 * 2**124; c - sp / 2
        return v.to(tl.int32, bitcast=True) - 0x46800001, tl.fma(v, STEP * 512.0, STEP * -8388609.0)
    if SR:
        u1 = _f32((k << 7) | 0x3F800040)  # 1 + u, u = (k + 1/2) * 2**-16
        v = tl.fma(u1, _f32(cb - 0x0B800000), ay) + _f32(cb - 1)  # |y| + u1 * sp, then + c - sp / 2
        cb = cb + 1
    else:
        v = ay + _f32(cb)  # |y| rounded to the level lattice, ties to the even index
    return v.to(tl.int32, bitcast=True) - cb + base, v - _f32(cb)  # bits(v) - bits(c) counts the steps


@triton.jit
def _uniforms(seed, m, g, K, BM: tl.constexpr, NG: tl.constexpr, ROUNDS: tl.constexpr):
    """[BM, NG, 8, 2] 16-bit random integers (int32): 2 Philox calls a group, counters unique to the group."""
    offs = ((m[:, None] * (K // 16) + g[None, :]) * 2)[:, :, None] + tl.arange(0, 2)[None, None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, offs, ROUNDS)                    # uint32, each [BM, NG, 2]
    r = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (BM, NG, 8))
    return tl.join(r & 0xFFFF, r >> 16).to(tl.int32, bitcast=True)


@triton.jit
def _pack_codes(idx, xbits, finite):
    """Level indices [BM, NG, 8, 2] and x's bits (signs) -> each group's codes sign<<3 | index in one int64
    [BM, NG], element i in bits 4i..4i+3, so one store (docs/KERNELS.md §5); 0 for non-finite groups."""
    c = idx | ((xbits >> 28) & 8)
    w = tl.sum(c << (4 * tl.arange(0, 8))[:, None], axis=2)  # [BM, NG, 2]: disjoint bits, the sum an or
    lo, hi = tl.split(w)
    return tl.where(finite, (hi.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF), 0)


# ----------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["seed"])
def _quantize_kernel(x_ptr, out_ptr, codes_ptr, scales_ptr, signs_ptr, amax_ptr, tscale_ptr, seed_ptr, M, K, seed,
                     BM: tl.constexpr, NG: tl.constexpr, COLS: tl.constexpr, M_FIRST: tl.constexpr,
                     EVEN: tl.constexpr, I64: tl.constexpr, QB: tl.constexpr, BLOCK_2D: tl.constexpr,
                     RHT: tl.constexpr, KEEP_ROTATED: tl.constexpr, SCALE: tl.constexpr, G: tl.constexpr,
                     E8_SHIFT: tl.constexpr, UNIFORM: tl.constexpr, STEP: tl.constexpr, CB: tl.constexpr,
                     SR: tl.constexpr, SEED_PTR: tl.constexpr, ROUNDS: tl.constexpr, FAST_DIV: tl.constexpr,
                     X_BF16: tl.constexpr, WANT_CODES: tl.constexpr, WANT_DEQUANT: tl.constexpr,
                     OUT_MODE: tl.constexpr, OUT_ROW: tl.constexpr, OUT_STRIDE: tl.constexpr):
    """Quantize the tile [BM, NG*16] of the [M, K] view. COLS: x's row length (= M) along columns, else 0.
    M_FIRST: the grid's first axis along m. SEED_PTR: SR's seed is the int32 at seed_ptr. X_BF16: bf16 x,
    not rotated. OUT_STRIDE: out's row stride if it is a slice of a wider tensor (rows of OUT_ROW), else 0."""
    COLWISE: tl.constexpr = COLS != 0
    if COLWISE:
        M = COLS
    pid_m = tl.program_id(0) if M_FIRST else tl.program_id(1)
    pid_g = tl.program_id(1) if M_FIRST else tl.program_id(0)
    m, g, mask, base = _tile_offsets(pid_m, pid_g, M, K, BM, NG, COLWISE, I64, EVEN)
    x = _load_tile(x_ptr, base, mask, M, COLWISE)                   # [BM, NG, 8, 2] fp32
    if RHT:
        x = _butterfly(x * _signs(signs_ptr)) * 0.25                # rht.rht's steps
    xbits = x.to(tl.int32, bitcast=True)
    a = _block_amax(x, BM, NG, QB, BLOCK_2D)                        # [BM, NG]
    finite = a < float("inf")                                       # False for NaN
    amax = tl.where(finite, a, 0.0)
    t = tl.full((), 1.0, tl.float32)
    it = t
    if SCALE == E4M3:
        t, it = _tensor_scale(amax_ptr, G)
    f, deq, stored = _block_scale(amax, finite, t, it, SCALE, G, E8_SHIFT)
    y = _scaled(x, f, SCALE, G, UNIFORM, STEP, SR, FAST_DIV, X_BF16)
    u = y  # (unused without SR; non-finite blocks: anything, their codes are masked)
    if SR:
        if SEED_PTR:
            seed = tl.load(seed_ptr)
        u = _uniforms(seed, m, g, K, BM, NG, ROUNDS)
    idx, q = _round_to_grid(y, u, UNIFORM, STEP, CB, SR)
    if WANT_CODES:
        tl.store(codes_ptr + m[:, None] * (K // 16) + g[None, :], _pack_codes(idx, xbits, finite), mask=mask)
        if BLOCK_2D:
            sp = scales_ptr + (m // 16)[:, None] * (K // 16) + g[None, :]
            smask = mask & (m % 16 == 0)[:, None]
        else:
            sp = scales_ptr + m[:, None] * (K // QB) + (g // (QB // 16))[None, :]
            smask = mask & (g % (QB // 16) == 0)[None, :]
        tl.store(sp, stored.to(scales_ptr.dtype.element_ty), mask=smask)
    if pid_m == 0 and pid_g == 0:
        tl.store(tscale_ptr, t)
    if WANT_DEQUANT:
        qs = _f32(q.to(tl.int32, bitcast=True) | (xbits & -2147483648))  # ±level (-0.0 kept)
        step = M
        if OUT_STRIDE != 0:  # element e of x goes to out's row e // OUT_ROW (a group never spans rows)
            base = base // OUT_ROW * OUT_STRIDE + base % OUT_ROW
            step = OUT_STRIDE
        _store_dequant(out_ptr, qs * deq[:, :, None, None], signs_ptr, base, mask, step, COLWISE, RHT,
                       KEEP_ROTATED, OUT_MODE)


@triton.jit
def _dequantize_kernel(codes_ptr, scales_ptr, tscale_ptr, signs_ptr, out_ptr, N,
                       NG: tl.constexpr, QB: tl.constexpr, I64: tl.constexpr, RHT: tl.constexpr,
                       KEEP_ROTATED: tl.constexpr, SCALE: tl.constexpr, SH: tl.constexpr, MUL1: tl.constexpr,
                       MUL2: tl.constexpr, NL: tl.constexpr, OUT_MODE: tl.constexpr):
    """_quantize_kernel's dequantized output from stored codes and scales, NG groups of the N elements (one
    row) a program. SH, MUL1, MUL2: the code's bit moves and multiplies (docs/KERNELS.md §5); index >= NL: 0."""
    _, _, mask, base = _tile_offsets(0, tl.program_id(0), 1, N, 1, NG, False, I64)
    b = tl.load(codes_ptr + (base >> 1)[:, :, None] + tl.arange(0, 8)[None, None, :], mask=mask[:, :, None])
    b = tl.permute(tl.reshape(b.to(tl.int32), (1, NG, 2, 4)), (0, 1, 3, 2))  # [1, NG, i, h]
    keep = -2147483648 | (7 << SH)  # (int8 codes, sign-extended: the high nibble's sign bit is bit 31)
    lo = (((b & 255) << SH) | (b << 28)) & keep
    hi = (b << (SH - 4)) & keep
    qb = tl.reshape(tl.permute(tl.join(lo, hi), (0, 1, 2, 4, 3)), (1, NG, 8, 2))  # element 2i + nibble + 8h
    if NL < 8:
        qb = tl.where(((qb >> SH) & 7) < NL, qb, qb & -2147483648)
    q = _f32(qb) * MUL1                                                     # ±level (-0.0 kept)
    if MUL2 != 1.0:
        q = q * MUL2
    s = tl.load(scales_ptr + (base >> (4 if QB == 16 else 5)), mask=mask)  # [1, NG]: the group's block scale
    if SCALE == E4M3:  # t * e4m3 (b: its bits, moved into fp32's and times 2**(127 - 7)); 0x7F, 0xFF NaN
        b = s.to(tl.int32)
        v = _f32(((b & 0x80) << 24) | ((b & 0x7F) << 20)) * 1.329227995784916e36
        s = tl.where((b & 0x7F) == 0x7F, float("nan"), tl.load(tscale_ptr) * v)
    elif SCALE == E8M0:  # 2**(b - 127), 255 NaN
        b = s.to(tl.int32)
        s = tl.where(b == 255, float("nan"), _pow2(b - 127))
    _store_dequant(out_ptr, q * s[:, :, None, None], signs_ptr, base, mask, 1, False, RHT, KEEP_ROTATED, OUT_MODE)


# The e4m3 tensor amax, a first pass (docs/KERNELS.md §7); `while` loops, as the interpreter's tl.range needs
# constant bounds.
@triton.jit
def _group_max(v, signs, RHT: tl.constexpr, EXACT: tl.constexpr):
    """Groups v [BM, NG, 8, 2] -> max |v| per group [BM, NG], rotated if RHT (times 4: the caller applies 0.25).
    EXACT: over the finite values; else a float max, right for finite groups (the caller then checks)."""
    if RHT:
        v = _butterfly(v * signs)
    a = tl.abs(v)
    if EXACT:
        a = tl.where(a < float("inf"), a, 0.0)
    return tl.max(tl.max(a, axis=3), axis=2)


@triton.jit
def _tiles_amax(x_ptr, signs, M, K, BM: tl.constexpr, NG: tl.constexpr, COLWISE: tl.constexpr, I64: tl.constexpr,
                RHT: tl.constexpr, EXACT: tl.constexpr):
    """max |v| over this program's tiles of the [M, K] view (_group_max's)."""
    n_g = tl.cdiv(K // 16, NG)
    n_tiles = n_g * tl.cdiv(M, BM)
    acc = tl.zeros((BM, NG), tl.float32)
    i = tl.program_id(0)
    while i < n_tiles:
        _, _, mask, base = _tile_offsets(i // n_g, i % n_g, M, K, BM, NG, COLWISE, I64)
        acc = _max_nan(acc, _group_max(_load_tile(x_ptr, base, mask, M, COLWISE), signs, RHT, EXACT))
        i += tl.num_programs(0)
    return tl.reduce(tl.reduce(acc, 1, _max_nan), 0, _max_nan)


@triton.jit
def _amax_kernel(x_ptr, signs_ptr, amax_ptr, M, K, BM: tl.constexpr, NG: tl.constexpr, COLS: tl.constexpr,
                 I64: tl.constexpr, RHT: tl.constexpr):
    """amax_ptr[0] = the fp32 bits of max |x| over the finite elements of the [M, K] view (COLS: as
    _quantize_kernel's), rotated along K if RHT; a program that met a non-finite group reads again, EXACT."""
    if COLS != 0:
        M = COLS
    signs = _signs(signs_ptr)
    amax = _tiles_amax(x_ptr, signs, M, K, BM, NG, COLS != 0, I64, RHT, False)
    if not (amax < float("inf")):
        amax = _tiles_amax(x_ptr, signs, M, K, BM, NG, COLS != 0, I64, RHT, True)
    tl.atomic_max(amax_ptr, ((amax * 0.25) if RHT else amax).to(tl.int32, bitcast=True))


@triton.jit
def _both_amax(xw_ptr, xc_ptr, signs, R, C, TR: tl.constexpr, TC: tl.constexpr, I64: tl.constexpr,
               ROW_RHT: tl.constexpr, EXACT: tl.constexpr, SYNC: tl.constexpr):
    """(rows, columns) max |v| over this program's TR x TC tiles of the [R, C] tensor, rows rotated if ROW_RHT,
    columns always; each tile loaded as both passes read it (xw_ptr, xc_ptr), x read once (docs/KERNELS.md §7)."""
    n_c = tl.cdiv(C, TC)
    n_tiles = n_c * tl.cdiv(R, TR)
    acc_c = tl.zeros((TC, TR // 16), tl.float32)
    acc_r = tl.zeros((TR, TC // 16), tl.float32)
    i = tl.program_id(0)
    while i < n_tiles:
        _, _, mask, base = _tile_offsets(i % n_c, i // n_c, C, R, TC, TR // 16, True, I64)
        acc_c = _max_nan(acc_c, _group_max(_load_tile(xc_ptr, base, mask, C, True), signs, True, EXACT))
        if SYNC:
            tl.debug_barrier()  # so the second load, issued after the first has arrived, finds the cache warm
        _, _, mask, base = _tile_offsets(i // n_c, i % n_c, R, C, TR, TC // 16, False, I64)
        acc_r = _max_nan(acc_r, _group_max(_load_tile(xw_ptr, base, mask, R, False), signs, ROW_RHT, EXACT))
        i += tl.num_programs(0)
    return (tl.reduce(tl.reduce(acc_r, 1, _max_nan), 0, _max_nan),
            tl.reduce(tl.reduce(acc_c, 1, _max_nan), 0, _max_nan))


@triton.jit
def _amax_both_kernel(xw_ptr, xc_ptr, signs_ptr, amax_ptr, R, TR: tl.constexpr, TC: tl.constexpr,
                      I64: tl.constexpr, ROW_RHT: tl.constexpr, COLS: tl.constexpr, SYNC: tl.constexpr):
    """amax_ptr[0], [1] = the (rows, columns) tensor amax of the [R, C] tensor x, C = COLS (as the column
    pass), from one read: _both_amax's float maxima, or its EXACT ones where a group was non-finite."""
    signs = _signs(signs_ptr)
    amax_r, amax_c = _both_amax(xw_ptr, xc_ptr, signs, R, COLS, TR, TC, I64, ROW_RHT, False, SYNC)
    if not ((amax_r < float("inf")) & (amax_c < float("inf"))):
        amax_r, amax_c = _both_amax(xw_ptr, xc_ptr, signs, R, COLS, TR, TC, I64, ROW_RHT, True, SYNC)
    tl.atomic_max(amax_ptr, ((amax_r * 0.25) if ROW_RHT else amax_r).to(tl.int32, bitcast=True))
    tl.atomic_max(amax_ptr + 1, (amax_c * 0.25).to(tl.int32, bitcast=True))


# ----------------------------------------------------------------------------- launch planning
_FLOATS = (torch.bfloat16, torch.float32)
_SCALE_DTYPES = {"fp32": torch.float32, "e4m3": torch.float8_e4m3fn, "e8m0": torch.uint8}  # as stored
# (BM rows, NG groups of 16, num_warps) per _tile_kind, from H200 sweeps (bench/kernels_bench.py); rows: BM = 1
_TILES = {"row": (1, 64, 2), "row_codes": (1, 64, 1), "col": (128, 2, 4), "col_codes": (64, 4, 4),
          "2d": (16, 16, 4), "dequantize": (1, 128, 4)}
_TILES_INTERPRET = {"row": (1, 64, 1), "row_codes": (1, 64, 1), "col": (32, 4, 1), "col_codes": (32, 4, 1),
                    "2d": (16, 8, 1), "dequantize": (1, 64, 1)}
# tensor-amax passes: (BM, NG, num_warps) along rows (or without RHT) or columns, (TR, TC, num_warps[, sync]) both
_AMAX_TILES = {"row": (1, 256, 4), "col": (64, 4, 4), "both": (64, 64, 4, True)}
_AMAX_TILES_INTERPRET = {"row": (1, 8, 1), "col": (16, 2, 1), "both": (32, 32, 1)}
_AMAX_PROGRAMS_PER_SM = 8  # the persistent grids' programs an SM


def _cdiv(a: int, b: int) -> int:  # on the host: triton.cdiv is a jit function, slow to call here
    return -(-a // b)


def _check_device(x: torch.Tensor) -> bool:
    """True when the Triton CPU interpreter runs the kernels (CPU tensors), False on CUDA."""
    if x.is_cuda:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1" and x.device.type == "cpu":
        return True
    raise RuntimeError(f"the quantize kernels need a CUDA tensor, got one on {x.device}; on a CPU set "
                       "TRITON_INTERPRET=1 before importing triton/kernels, or use quant.py's reference")


@functools.lru_cache(maxsize=None)
def _check_spec(levels: tuple, block: int, scale_mode: str, rht: bool, block_2d: bool) -> tuple:
    """Validate a quantization spec (every entry point does): (uniform, step) of a grid the kernels round to."""
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown scale_mode {scale_mode!r}; valid: {', '.join(SCALE_MODES)}")
    if block not in (16, 32):
        raise ValueError(f"block must be 16 or 32, got {block}")
    if block_2d and (block != 16 or rht):
        raise ValueError("block_2d (16x16 weight tiles) needs block=16 and no RHT")
    lv = tuple(float(v) for v in levels)
    if not 2 <= len(lv) <= 8 or lv[0] != 0.0 or any(b <= a for a, b in zip(lv, lv[1:])):
        raise ValueError(f"levels must be 2 to 8 increasing values starting at 0 (a 3-bit level index), got {lv}")
    if all(v == i * lv[1] for i, v in enumerate(lv)) and math.frexp(lv[1])[0] == 0.5:
        return True, lv[1]
    if lv == E2M1_LEVELS[:len(lv)]:
        return False, 0.5
    raise ValueError(f"the kernels round to uniform grids with a power-of-two step (e1m2, int4) or to a "
                     f"prefix of E2M1 {E2M1_LEVELS}; got levels {lv}. Use the PyTorch reference (quant.py).")


def _check_shape(shape: tuple, dtype, block: int, block_2d: bool, dim: int) -> tuple:
    """Validate the tensor quantized: (colwise, K = size of the quantized dim)."""
    if dtype not in _FLOATS:
        raise ValueError(f"quantize needs a bf16 or fp32 tensor, got {dtype}")
    nd = len(shape)
    d = dim % nd if nd else 0
    if nd == 0 or not (d == nd - 1 or (d == 0 and nd == 2)):
        raise ValueError(f"quantize runs along the last dim (any shape) or dim 0 of a 2-D tensor; got "
                         f"dim={dim} for shape {shape}: reshape or transpose first")
    K = shape[d]
    if K % block or (block_2d and (nd != 2 or shape[0] % 16 or shape[1] % 16)):
        rule = "both dims of a 2-D tensor multiples of 16" if block_2d else f"a multiple of {block}"
        raise ValueError(f"cannot quantize a tensor of shape {shape} along dim {dim} (size {K}) in "
                         f"blocks of {block}: the size must be {rule}. Pad it or change the block.")
    return d != nd - 1, K


def _check_signs(rht_signs: Optional[torch.Tensor], dev: torch.device):
    """16 values on dev; ±1 as well where reading them costs no device sync."""
    if rht_signs is not None and (rht_signs.numel() != 16 or rht_signs.device != dev):
        raise ValueError(f"rht_signs must hold 16 values on {dev}; got shape {tuple(rht_signs.shape)} "
                         f"on {rht_signs.device}")
    if rht_signs is not None and dev.type == "cpu" and not bool((rht_signs.abs() == 1).all()):
        raise ValueError(f"rht_signs must be ±1 (rht.random_signs gives them); got {rht_signs.tolist()}")


def _tile_kind(colwise: bool, block_2d: bool, codes_only: bool) -> str:
    """The key of _TILES whose tile a quantize kernel takes: orientation and output."""
    return "2d" if block_2d else ("col" if colwise else "row") + ("_codes" if codes_only else "")


def _tile(tile: tuple, colwise: bool, block: int, block_2d: bool) -> tuple:
    """(BM, NG, num_warps) of a tile, checked."""
    if len(tile) != 3:
        raise ValueError(f"tile {tile}: give (BM, NG, num_warps)")
    bm, ng, nw = tile
    bm = bm if colwise or block_2d else 1
    if bm & (bm - 1) or ng & (ng - 1) or (block == 32 and ng < 2) or (block_2d and bm < 16):
        raise ValueError(f"tile {tile}: BM and NG must be powers of two, NG >= 2 for 32-blocks, BM >= 16 "
                         "for 16x16 tiles")
    return bm, ng, nw


def _tile_input(x: torch.Tensor, colwise: bool) -> torch.Tensor:
    """x (bf16 | fp32, contiguous) as _load_tile reads it: rows as words of two elements (int32 | int64;
    a tensor that starts off a word boundary is copied first), columns as elements (bf16 as int16)."""
    if colwise:
        return x.view(torch.int16) if x.dtype == torch.bfloat16 else x
    if x.data_ptr() % (2 * x.element_size()):
        x = x.clone()
    return x.view(torch.int32 if x.dtype == torch.bfloat16 else torch.int64)


# quantize()'s launch, from its arguments' static properties; constexprs: the kernel's, by name (not to be
# changed); uid: the plan's own number, which keys its kept kernels (cheaper to hash than the plan)
_Plan = collections.namedtuple("_Plan", "colwise M K grid codes_shape scales_shape out_dtype constexprs options uid")
_PLAN_IDS = itertools.count()


@functools.lru_cache(maxsize=4096)
def _plan(shape, dtype, interpret, levels, block, scale_mode, sr, rht, block_2d, dim, out_dtype, keep_rotated,
          want_codes, want_dequant, tile, fast_div, out_stride=0) -> _Plan:
    """Validate quantize()'s arguments once per combination (bad ones raise, uncached) and lay out its launch."""
    uniform, step = _check_spec(levels, block, scale_mode, rht, block_2d)
    colwise, kq = _check_shape(shape, dtype, block, block_2d, dim)
    if out_dtype not in _FLOATS:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if not (want_codes or want_dequant):
        raise ValueError("nothing to compute: set want_codes and/or want_dequant")
    kind = _tile_kind(colwise, block_2d, not want_dequant)
    bm, ng, nw = _tile(tile or (_TILES_INTERPRET if interpret else _TILES)[kind], colwise, block, block_2d)
    numel = math.prod(shape)
    M, K = (numel // kq if kq else 0, kq) if colwise or block_2d else (1, numel)  # rows: one long row
    m_first = colwise and _cdiv(K // 16, ng) < 65536  # (the grid's second axis takes 65535 programs at most)
    grid = (_cdiv(M, bm), _cdiv(K // 16, ng)) if m_first else (_cdiv(K // 16, ng), _cdiv(M, bm))
    g_max = float(levels[-1])
    lead = (shape[1],) if colwise else tuple(shape[:-1])
    ce = dict(BM=bm, NG=ng, COLS=M if colwise else 0, M_FIRST=m_first, EVEN=(K // 16) % ng == 0 and M % bm == 0,
              I64=max(numel, (numel // shape[-1] if shape[-1] else 0) * out_stride) >= 2**31,  # out's offsets too
              QB=block, BLOCK_2D=block_2d, RHT=rht, KEEP_ROTATED=keep_rotated, SCALE=SCALE_MODES[scale_mode],
              G=g_max, E8_SHIFT=math.floor(math.log2(g_max)), UNIFORM=uniform, STEP=step,
              CB=struct.unpack("<i", struct.pack("<f", step * 2.0**23))[0], SR=sr, ROUNDS=PHILOX_ROUNDS,
              FAST_DIV=fast_div and (INTERPRET_FAST_DIV or not interpret) and step >= 0.5,
              X_BF16=dtype == torch.bfloat16 and not rht, WANT_CODES=want_codes, WANT_DEQUANT=want_dequant,
              OUT_MODE=(OUT_F32 if out_dtype == torch.float32 else OUT_BF16_BITS if interpret else OUT_BF16).value,
              OUT_ROW=shape[-1], OUT_STRIDE=out_stride)
    return _Plan(colwise, M, K, grid, lead + (kq // 2,), (M // 16, K // 16) if block_2d else lead + (kq // block,),
                 out_dtype, ce, (("num_warps", nw), ("enable_fp_fusion", False)), next(_PLAN_IDS))


# _launch keeps a configuration's compiled kernel and launches it through Triton's launcher directly, skipping
# kernel[grid]'s argument binding and the compiled kernel's per-call wrapper; its key holds all that Triton
# compiles on (docs/KERNELS.md §9). NANOFP4_FAST_LAUNCH=0: kernel[grid] every call.
FAST_LAUNCH = os.environ.get("NANOFP4_FAST_LAUNCH", "1") != "0"
_COMPILED = {}  # key -> (compiled kernel, launcher or None, the launcher's arguments after the stream)
_ARGS = {}  # kernel -> its arguments in order, from launch()'s dict


def _keep(compiled) -> tuple:
    """A compiled kernel with what compiled[grid](*args) passes to its launcher (Triton 3.6's CudaLauncher),
    or no launcher where that wrapper does more (scratch memory, another launcher): it launches as usual."""
    run = compiled.run
    if type(run).__name__ != "CudaLauncher" or run.global_scratch_size or run.profile_scratch_size:
        return compiled, None, ()
    return compiled, run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                                  compiled.packed_metadata, None, None, None)


def _launch(kernel, grid: tuple, interpret: bool, options: tuple, key, args: dict):
    """kernel[grid](**args, **options), through the kept compiled kernel of `key` when there is one."""
    if interpret or not FAST_LAUNCH:
        kernel[grid](**args, **dict(options))
        return
    kept = _COMPILED.get(key)
    if kept is None:
        _COMPILED[key] = _keep(kernel[grid](**args, **dict(options)))
        return
    compiled, launcher, head = kept
    order = _ARGS.get(kernel) or _ARGS.setdefault(kernel, operator.itemgetter(*kernel.arg_names))
    grid = grid + (1,) * (3 - len(grid))  # a compiled kernel takes every argument in order, and a 3-D grid
    if launcher is None or knobs.runtime.launch_enter_hook.calls:  # (a hook: Triton's profiler is on)
        compiled[grid](*order(args))
    else:
        launcher(*grid, torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice()), *head, *order(args))


def _amax_options(nw: int, interpret: bool) -> tuple:
    """Tensor-amax launch options: registers capped so that an SM holds all its programs (docs/KERNELS.md §7)."""
    cap = 65536 // (_AMAX_PROGRAMS_PER_SM * nw * 32) // 8 * 8
    maxnreg = (("maxnreg", cap),) if cap < 255 and not interpret else ()
    return (("num_warps", nw), ("enable_fp_fusion", False)) + maxnreg


def _amax_programs(x: torch.Tensor, interpret: bool, programs: Optional[int]) -> int:
    return programs or (3 if interpret else _AMAX_PROGRAMS_PER_SM
                        * torch.cuda.get_device_properties(x.device.index or 0).multi_processor_count)


def _amax(x, signs, M, K, colwise, interpret, tile=None, programs=None) -> torch.Tensor:
    """Launch the tensor-amax pass over x (non-empty) with RHT signs or None; returns the int32 [1]
    buffer holding the fp32 bits of the amax. Without RHT any order will do: x is read as one row."""
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    if signs is None:
        x, colwise, M, K = x.reshape(-1), False, 1, x.numel()
    bm, ng, nw = _tile(tile or (_AMAX_TILES_INTERPRET if interpret else _AMAX_TILES)["col" if colwise else "row"],
                       colwise, 16, False)
    grid = (min(_cdiv(K // 16, ng) * _cdiv(M, bm), _amax_programs(x, interpret, programs)),)
    xk = _tile_input(x, colwise)
    args = dict(x_ptr=xk, signs_ptr=amax if signs is None else signs, amax_ptr=amax, M=M, K=K, BM=bm, NG=ng,
                COLS=M if colwise else 0, I64=x.numel() >= 2**31, RHT=signs is not None)
    _launch(_amax_kernel, grid, interpret, _amax_options(nw, interpret), (_amax_kernel, grid, nw, M, K, bm, ng,
            colwise, signs is not None, xk.dtype, xk.data_ptr() % 16, args["signs_ptr"].data_ptr() % 16), args)
    return amax


# ----------------------------------------------------------------------------- public functions
def quantize(x: torch.Tensor, *, levels: tuple, block: int = 16, scale_mode: str = "fp32",
             sr: bool = False, rht_signs: Optional[torch.Tensor] = None, block_2d: bool = False,
             dim: int = -1, seed=0, out_dtype: Optional[torch.dtype] = None,
             keep_rotated: bool = False, want_codes: bool = True, want_dequant: bool = True,
             tile: Optional[tuple] = None, fast_div: bool = True, tensor_amax: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None):
    """Quantize x along dim (-1: rows of any shape; 0: columns of a 2-D tensor) with one fused kernel,
    after a tensor-amax pass for e4m3 scales unless tensor_amax (x's, one fp32 on x's device) is given.

    levels: quant.QuantSpec.levels (the last is g_max); sr: stochastic rounding seeded by `seed` (an int,
    or one int32 on x's device); rht_signs: 16 values ±1 on x's device, or None; out_dtype: bf16 | fp32
    (default x.dtype); tile: (BM, NG, num_warps); fast_div=False: IEEE division for fp32 scales (same
    bits); out: the dequantized tensor's buffer (x's shape, out_dtype; for a 2-D x it may be out[:, a:b] of
    a wider tensor). Returns codes uint8 [..., K/2] and scales [..., K/block] (block_2d: [M/16, K/16]) as
    quant.quantize stores them (None without want_codes), tensor_scale (0-d fp32) and the dequantized
    tensor (None without want_dequant)."""
    interpret = _check_device(x)
    if not x.is_contiguous():
        raise ValueError(f"quantize reads a contiguous row-major tensor; got shape {tuple(x.shape)} with "
                         f"strides {x.stride()}: call .contiguous() first")
    dev = x.device
    out_stride = 0 if out is None else _out_stride(x, out, out_dtype or x.dtype, want_dequant)
    p = _plan(tuple(x.shape), x.dtype, interpret, tuple(levels), block, scale_mode, sr, rht_signs is not None,
              block_2d, dim, out_dtype or x.dtype, keep_rotated, want_codes, want_dequant,
              None if tile is None else tuple(tile), fast_div, out_stride)
    _check_signs(rht_signs, dev)
    seed_t = seed if isinstance(seed, torch.Tensor) else None
    if seed_t is not None and (seed_t.numel() != 1 or seed_t.dtype != torch.int32 or seed_t.device != dev):
        raise ValueError(f"a seed tensor must be one int32 on {dev}; got {seed_t.dtype} {tuple(seed_t.shape)} "
                         f"on {seed_t.device}")
    tscale = torch.empty((), dtype=torch.float32, device=dev)
    codes = scales = None
    if want_codes:
        codes = torch.empty(p.codes_shape, dtype=torch.uint8, device=dev)
        scales = torch.empty(p.scales_shape, dtype=torch.float32 if scale_mode == "fp32" else torch.uint8, device=dev)
    if want_dequant and out is None:
        out = torch.empty(x.shape, dtype=p.out_dtype, device=dev)
    if x.numel() == 0:
        tscale.fill_(1.0)
        return codes, scales.view(_SCALE_DTYPES[scale_mode]) if want_codes else None, tscale, out
    signs = tscale if rht_signs is None else rht_signs.to(torch.float32).contiguous()
    if tensor_amax is not None:
        if scale_mode != "e4m3" or tensor_amax.numel() != 1 or tensor_amax.dtype != torch.float32 or \
                tensor_amax.device != dev:
            raise ValueError(f"tensor_amax is e4m3's first pass: one fp32 value on {dev}; got {tensor_amax.dtype} "
                             f"{tuple(tensor_amax.shape)} on {tensor_amax.device} for scale_mode {scale_mode!r}")
        amax = tensor_amax.reshape(1).view(torch.int32)
    elif scale_mode == "e4m3":  # a first pass: the tensor amax comes before any block scale
        amax = _amax(x, None if rht_signs is None else signs, p.M, p.K, p.colwise, interpret)
    else:
        amax = tscale
    xk = _tile_input(x, p.colwise)
    args = dict(x_ptr=xk, out_ptr=(out.view(torch.int16) if p.constexprs["OUT_MODE"] == OUT_BF16_BITS.value else out)
                if want_dequant else tscale, codes_ptr=codes.view(torch.int64) if want_codes else tscale,
                scales_ptr=scales if want_codes else tscale, signs_ptr=signs, amax_ptr=amax, tscale_ptr=tscale,
                seed_ptr=tscale if seed_t is None else seed_t, M=p.M, K=p.K, seed=0 if seed_t is not None else seed,
                SEED_PTR=seed_t is not None, **p.constexprs)
    aligned = (xk.dtype, xk.data_ptr() % 16, signs.data_ptr() % 16, 0 if seed_t is None else seed_t.data_ptr() % 16,
               out.data_ptr() % 16 if want_dequant else 0, amax.data_ptr() % 16)  # (amax: a given one may be a[1])
    wide = seed_t is None and not -2**31 <= seed < 2**31  # an int64 seed argument: another compile
    _launch(_quantize_kernel, p.grid, interpret, p.options, (p.uid, aligned, seed_t is not None, wide), args)
    return codes, scales.view(_SCALE_DTYPES[scale_mode]) if want_codes else None, tscale, out


def _out_stride(x: torch.Tensor, out: torch.Tensor, out_dtype: torch.dtype, want_dequant: bool) -> int:
    """quantize's OUT_STRIDE for a given out: 0 where it is laid out as x, else its row stride."""
    if not want_dequant or out.shape != x.shape or out.dtype != out_dtype or out.device != x.device:
        raise ValueError(f"out must be a {out_dtype} tensor of x's shape {tuple(x.shape)} on {x.device}, for the "
                         f"dequantized output; got {out.dtype} {tuple(out.shape)} on {out.device}"
                         + ("" if want_dequant else " with want_dequant=False"))
    if out.is_contiguous():
        return 0
    if x.dim() != 2 or out.stride(1) != 1 or out.stride(0) < x.shape[1]:
        raise ValueError(f"out must be contiguous, or for a 2-D x a slice of a wider tensor's columns (strides "
                         f"(S, 1)); got strides {out.stride()} for shape {tuple(out.shape)}")
    return out.stride(0)


def fake_quantize(x: torch.Tensor, **kwargs) -> torch.Tensor:
    """Only the dequantized tensor of quantize(x, **kwargs) (the emulated-GEMM operand)."""
    return quantize(x, want_codes=False, want_dequant=True, **kwargs)[3]


def fake_quantize_joined(xs, *, join: int = 1, seeds=None, tensor_amaxes=None, out_dtype=None,
                         **kwargs) -> torch.Tensor:
    """The 2-D parts xs joined along dim `join` (weights [N_i, K] along 0, output gradients [M, N_i] along 1),
    each as fake_quantize(xs[i], seed=seeds[i], tensor_amax=tensor_amaxes[i], **kwargs) gives it, written in
    place: one GEMM operand whose parts keep their own e4m3 tensor scales and SR draws."""
    if not xs or any(x.dim() != 2 for x in xs) or len({x.shape[1 - join] for x in xs}) != 1 or join not in (0, 1):
        raise ValueError(f"fake_quantize_joined joins 2-D tensors along dim 0 or 1 that agree on the other; got "
                         f"join={join} and shapes {[tuple(x.shape) for x in xs]}")
    seeds = [0] * len(xs) if seeds is None else seeds
    amaxes = [None] * len(xs) if tensor_amaxes is None else tensor_amaxes
    if len(seeds) != len(xs) or len(amaxes) != len(xs):
        raise ValueError(f"one seed and one tensor_amax for each of the {len(xs)} parts; got {len(seeds)} and "
                         f"{len(amaxes)}")
    shape = list(xs[0].shape)
    shape[join] = sum(x.shape[join] for x in xs)
    out = torch.empty(shape, dtype=out_dtype or xs[0].dtype, device=xs[0].device)
    at = 0
    for x, seed, amax in zip(xs, seeds, amaxes):
        quantize(x, want_codes=False, want_dequant=True, seed=seed, tensor_amax=amax, out_dtype=out.dtype,
                 out=out.narrow(join, at, x.shape[join]), **kwargs)
        at += x.shape[join]
    return out


def dequantize(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor, *, levels: tuple,
               block: int = 16, scale_mode: str = "fp32", rht_signs: Optional[torch.Tensor] = None,
               keep_rotated: bool = False, out_dtype: torch.dtype = torch.bfloat16,
               tile: Optional[tuple] = None, block_2d: bool = False) -> torch.Tensor:
    """quant.QTensor.dequantize bit for bit, of quantize()'s codes uint8 [..., K/2], scales [..., K/block]
    (fp32 | float8_e4m3fn | uint8 e8m0) and 0-d fp32 tensor_scale: [..., K] in out_dtype, the quantized dim
    last; rotated back if rht_signs, unless keep_rotated. tile: (BM, NG, num_warps), BM being 1 (rows)."""
    interpret, dev = _check_device(codes), codes.device
    if not (codes.is_contiguous() and scales.is_contiguous()):
        raise ValueError("dequantize reads contiguous codes and scales: call .contiguous() on them first")
    out_shape, grid, constexprs, options = _dequant_plan(
        tuple(codes.shape), codes.dtype, tuple(scales.shape), scales.dtype, interpret, tuple(levels), block,
        block_2d, scale_mode, rht_signs is not None, keep_rotated, out_dtype, None if tile is None else tuple(tile))
    if tensor_scale.numel() != 1 or tensor_scale.dtype != torch.float32:
        raise ValueError(f"tensor_scale must be one fp32 value, got {tensor_scale.dtype} {tuple(tensor_scale.shape)}")
    signs = tensor_scale if rht_signs is None else rht_signs
    if signs.numel() != 16 and rht_signs is not None or any(t.device != dev for t in (scales, tensor_scale, signs)):
        raise ValueError(f"scales, tensor_scale and rht_signs (16 values) must be on the codes' device {dev}")
    out = torch.empty(out_shape, dtype=out_dtype, device=dev)
    if out.numel() == 0:
        return out
    signs = signs.to(torch.float32).contiguous()
    ce = dict(constexprs)
    args = dict(codes_ptr=codes.view(torch.int8), scales_ptr=scales.view(torch.uint8) if scale_mode == "e4m3"
                else scales, tscale_ptr=tensor_scale, signs_ptr=signs,
                out_ptr=out.view(torch.int16) if ce["OUT_MODE"] == OUT_BF16_BITS.value else out, N=out.numel(), **ce)
    aligned = tuple(t.data_ptr() % 16 for t in (codes, scales, tensor_scale, signs))  # Triton specializes on these
    _launch(_dequantize_kernel, grid, interpret, options, (_dequantize_kernel, out_shape, constexprs, aligned), args)
    return out


@functools.lru_cache(maxsize=1024)
def _dequant_plan(shape, dtype, scales_shape, scales_dtype, interpret, levels, block, block_2d, scale_mode, rht,
                  keep_rotated, out_dtype, tile) -> tuple:
    """Validate dequantize()'s arguments once per combination: (out shape, grid, constexprs, options)."""
    if block_2d:
        raise ValueError("dequantize does not take block_2d (16x16 tile) scales: use quant.QTensor.dequantize")
    if scale_mode not in _SCALE_DTYPES or out_dtype not in _FLOATS:
        raise ValueError(f"dequantize takes scale_mode in {tuple(_SCALE_DTYPES)} and out_dtype bf16 or fp32; got "
                         f"{scale_mode!r}, {out_dtype}")
    uniform, step = _check_spec(levels, block, scale_mode, rht, False)
    if dtype != torch.uint8 or scales_dtype != _SCALE_DTYPES[scale_mode]:
        raise ValueError(f"scale_mode {scale_mode!r} needs uint8 codes and {_SCALE_DTYPES[scale_mode]} scales; "
                         f"got {dtype} and {scales_dtype}")
    K = 2 * shape[-1] if shape else 0
    if not shape or K % block or scales_shape != shape[:-1] + (K // block,):
        raise ValueError(f"codes [..., K/2] with K a multiple of block={block} need scales [..., K/{block}]: for "
                         f"codes {shape}, scales {shape[:-1] + (K // block,)}; got scales {scales_shape}")
    _, ng, nw = _tile(tile or (_TILES_INTERPRET if interpret else _TILES)["dequantize"], False, block, False)
    N = math.prod(shape) * 2
    mul = step * 2.0**128 if uniform else 2.0**126  # see _dequantize_kernel
    ce = dict(NG=ng, QB=block, I64=N >= 2**31, RHT=rht, KEEP_ROTATED=keep_rotated, SCALE=SCALE_MODES[scale_mode],
              SH=21 if uniform else 22, MUL1=min(mul, 2.0**127), MUL2=mul / min(mul, 2.0**127), NL=len(levels),
              OUT_MODE=(OUT_F32 if out_dtype == torch.float32 else OUT_BF16_BITS if interpret else OUT_BF16).value)
    return shape[:-1] + (K,), (_cdiv(N // 16, ng),), tuple(ce.items()), (("num_warps", nw), ("enable_fp_fusion", False))


def tensor_amax(x: torch.Tensor, *, rht_signs: Optional[torch.Tensor] = None, dim: int = -1,
                tile: Optional[tuple] = None, programs: Optional[int] = None) -> torch.Tensor:
    """max |x| over the finite elements of x (rotated along dim if rht_signs), 0-d fp32: quantize()'s e4m3
    first pass, alone. tile: (BM, NG, num_warps); programs: the persistent grid's size."""
    interpret = _check_device(x)
    if not x.is_contiguous():
        raise ValueError(f"tensor_amax reads a contiguous tensor; got strides {x.stride()}: call .contiguous()")
    colwise, kq = _check_shape(tuple(x.shape), x.dtype, 16, False, dim)
    _check_signs(rht_signs, x.device)
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    signs = None if rht_signs is None else rht_signs.to(torch.float32).contiguous()
    M, K = (x.numel() // kq, kq) if colwise else (1, x.numel())
    return _amax(x, signs, M, K, colwise, interpret, tile, programs).view(torch.float32).reshape(())


def tensor_amax_both(x: torch.Tensor, *, rht_signs: torch.Tensor, row_rht: bool = True,
                     tile: Optional[tuple] = None, programs: Optional[int] = None) -> torch.Tensor:
    """tensor_amax of a 2-D [R, C] x along its rows (dim -1, rotated if row_rht) and its columns (dim 0,
    rotated), fp32 [2], from one read of x. tile: (TR, TC, num_warps[, sync]), TR and TC 16 times powers
    of two (sync: _both_amax's SYNC); programs: the persistent grid's size."""
    interpret = _check_device(x)
    if x.dtype not in _FLOATS or x.dim() != 2 or x.shape[0] % 16 or x.shape[1] % 16 or not x.is_contiguous():
        raise ValueError(f"tensor_amax_both reads a contiguous bf16 or fp32 [R, C] tensor, R and C multiples of "
                         f"16; got {x.dtype} {tuple(x.shape)} with strides {x.stride()}")
    _check_signs(rht_signs, x.device)
    amax = torch.zeros(2, dtype=torch.int32, device=x.device)
    if x.numel() == 0:
        return amax.view(torch.float32)
    tr, tc, nw, *sync = tile or (_AMAX_TILES_INTERPRET if interpret else _AMAX_TILES)["both"]
    if tr % 16 or tc % 16 or (tr // 16) & (tr // 16 - 1) or (tc // 16) & (tc // 16 - 1):
        raise ValueError(f"amax tile {tile}: TR and TC must be 16 times powers of two")
    R, C = x.shape
    grid = (min(_cdiv(R, tr) * _cdiv(C, tc), _amax_programs(x, interpret, programs)),)
    args = dict(xw_ptr=_tile_input(x, False), xc_ptr=_tile_input(x, True), signs_ptr=rht_signs.to(torch.float32)
                .contiguous(), amax_ptr=amax, R=R, TR=tr, TC=tc, I64=x.numel() >= 2**31, ROW_RHT=row_rht, COLS=C,
                SYNC=bool(sync and sync[0]))
    key = (_amax_both_kernel, grid, nw, R, C, tr, tc, row_rht, args["SYNC"], x.dtype) + tuple(
        args[n].data_ptr() % 16 for n in ("xw_ptr", "xc_ptr", "signs_ptr"))
    _launch(_amax_both_kernel, grid, interpret, _amax_options(nw, interpret), key, args)
    return amax.view(torch.float32)


# ----------------------------------------------------------------------------- torch.library operators
# The kernels as operators nanofp4::*, each one opaque node to torch.compile; why torch.library.Library (not
# @custom_op) and the flexible_layout tag: docs/KERNELS.md §9.
_LIB = torch.library.Library("nanofp4", "DEF")
_FLEX = (torch.Tag.flexible_layout,)
_LIB.define("fake_quantize(Tensor x, float[] levels, int block, str scale_mode, bool sr, Tensor? signs, "
            "bool block_2d, int dim, int seed, bool keep_rotated, Tensor? seed_t=None, Tensor? amax=None) -> Tensor",
            tags=_FLEX)
_LIB.define("fake_quantize_joined(Tensor[] xs, float[] levels, int block, str scale_mode, bool sr, Tensor? signs, "
            "bool block_2d, int dim, int join, bool keep_rotated, Tensor? seed_t, Tensor[] amaxes) -> Tensor",
            tags=_FLEX)
_LIB.define("quantize_codes(Tensor x, float[] levels, int block, str scale_mode, Tensor? signs, int dim, "
            "Tensor? amax=None) -> (Tensor, Tensor, Tensor)", tags=_FLEX)
_LIB.define("dequantize(Tensor codes, Tensor scales, Tensor tensor_scale, float[] levels, int block, "
            "str scale_mode, Tensor? signs, bool keep_rotated, ScalarType out_dtype) -> Tensor", tags=_FLEX)
_LIB.define("tensor_amax_both(Tensor x, Tensor signs, bool row_rht) -> Tensor", tags=_FLEX)


def _draw_seed() -> int:  # SR without a seed: one from torch's CPU generator (reproducible by torch.manual_seed)
    return int(torch.randint(2**31 - 1, ()))


# Entry points, one per operator (and its implementation): traced (or given a tensor subclass) they call the
# operator, one node in the graph; eager, its body directly, skipping the dispatcher (hundreds of calls a step).
def fake_quantize_op(x, levels, block, scale_mode, sr, signs, block_2d, dim, seed, keep_rotated, seed_t=None,
                     amax=None):
    """nanofp4::fake_quantize. SR's seed: seed_t (an int32 on x's device), else `seed`, else (seed < 0) one
    drawn, traced on the device inside the graph (a replayed graph draws anew), eager by torch's CPU generator."""
    compiling = torch.compiler.is_compiling()
    if compiling or type(x) not in (torch.Tensor, torch.nn.Parameter):
        if compiling and sr and seed < 0 and seed_t is None:
            seed_t = torch.randint(2**31 - 1, (1,), dtype=torch.int32, device=x.device)
        return torch.ops.nanofp4.fake_quantize(x, list(levels), block, scale_mode, sr, signs, block_2d, dim, seed,
                                               keep_rotated, seed_t, amax)
    seed = seed_t if seed_t is not None else _draw_seed() if sr and seed < 0 else seed
    return fake_quantize(x.contiguous(), levels=tuple(levels), block=block, scale_mode=scale_mode, sr=sr,
                         rht_signs=signs, block_2d=block_2d, dim=dim, seed=seed, keep_rotated=keep_rotated,
                         tensor_amax=amax)


def fake_quantize_joined_op(xs, levels, block, scale_mode, sr, signs, block_2d, dim, join, keep_rotated, seed_t,
                            amaxes):
    """nanofp4::fake_quantize_joined: fake_quantize_joined of the parts xs, SR's seeds as fake_quantize_op's."""
    if torch.compiler.is_compiling():
        if sr and seed_t is None:
            seed_t = torch.randint(2**31 - 1, (len(xs),), dtype=torch.int32, device=xs[0].device)
        return torch.ops.nanofp4.fake_quantize_joined(list(xs), list(levels), block, scale_mode, sr, signs, block_2d,
                                                      dim, join, keep_rotated, seed_t, list(amaxes))
    seeds = [seed_t[i:i + 1] for i in range(len(xs))] if seed_t is not None else \
        [_draw_seed() if sr else 0 for _ in xs]
    return fake_quantize_joined([x.contiguous() for x in xs], join=join, seeds=seeds, tensor_amaxes=amaxes or None,
                                levels=tuple(levels), block=block, scale_mode=scale_mode, sr=sr, rht_signs=signs,
                                block_2d=block_2d, dim=dim, keep_rotated=keep_rotated)


def quantize_codes_op(x, levels, block, scale_mode, signs, dim, amax=None):
    """nanofp4::quantize_codes: (codes, scales, tensor scale) of quantize(x, ..., want_dequant=False)."""
    if torch.compiler.is_compiling():
        return torch.ops.nanofp4.quantize_codes(x, list(levels), block, scale_mode, signs, dim, amax)
    return tuple(quantize(x.contiguous(), levels=tuple(levels), block=block, scale_mode=scale_mode, rht_signs=signs,
                          dim=dim, want_dequant=False, tensor_amax=amax)[:3])


def dequantize_op(codes, scales, tensor_scale, levels, block, scale_mode, signs, keep_rotated, out_dtype):
    """nanofp4::dequantize: dequantize(codes, scales, tensor_scale, ...)."""
    if torch.compiler.is_compiling():
        return torch.ops.nanofp4.dequantize(codes, scales, tensor_scale, list(levels), block, scale_mode, signs,
                                            keep_rotated, out_dtype)
    return dequantize(codes.contiguous(), scales.contiguous(), tensor_scale, levels=tuple(levels), block=block,
                      scale_mode=scale_mode, rht_signs=signs, keep_rotated=keep_rotated, out_dtype=out_dtype)


def tensor_amax_both_op(x, signs, row_rht):
    """nanofp4::tensor_amax_both: tensor_amax_both(x, rht_signs=signs, row_rht=row_rht)."""
    if torch.compiler.is_compiling():
        return torch.ops.nanofp4.tensor_amax_both(x, signs, row_rht)
    return tensor_amax_both(x.contiguous(), rht_signs=signs, row_rht=row_rht)


for _name, _impl in (("fake_quantize", fake_quantize_op), ("fake_quantize_joined", fake_quantize_joined_op),
                     ("quantize_codes", quantize_codes_op), ("dequantize", dequantize_op),
                     ("tensor_amax_both", tensor_amax_both_op)):
    for _key in ("CUDA", "CPU"):  # CPU: the interpreter (the kernels check TRITON_INTERPRET themselves)
        _LIB.impl(_name, _impl, _key)


@torch.library.register_fake("nanofp4::fake_quantize")
def _(x, levels, block, scale_mode, sr, signs, block_2d, dim, seed, keep_rotated, seed_t=None, amax=None):
    return x.new_empty(x.shape)


@torch.library.register_fake("nanofp4::fake_quantize_joined")
def _(xs, levels, block, scale_mode, sr, signs, block_2d, dim, join, keep_rotated, seed_t, amaxes):
    shape = list(xs[0].shape)
    shape[join] = sum(x.shape[join] for x in xs)
    return xs[0].new_empty(shape)


@torch.library.register_fake("nanofp4::quantize_codes")
def _(x, levels, block, scale_mode, signs, dim, amax=None):
    _check_spec(tuple(levels), block, scale_mode, signs is not None, False)
    colwise, k = _check_shape(tuple(x.shape), x.dtype, block, False, dim)
    lead = (x.shape[1],) if colwise else tuple(x.shape[:-1])
    return (x.new_empty(lead + (k // 2,), dtype=torch.uint8),
            x.new_empty(lead + (k // block,), dtype=_SCALE_DTYPES[scale_mode]), x.new_empty((), dtype=torch.float32))


@torch.library.register_fake("nanofp4::dequantize")
def _(codes, scales, tensor_scale, levels, block, scale_mode, signs, keep_rotated, out_dtype):
    return codes.new_empty(tuple(codes.shape[:-1]) + (2 * codes.shape[-1],), dtype=out_dtype)


@torch.library.register_fake("nanofp4::tensor_amax_both")
def _(x, signs, row_rht):
    return x.new_empty((2,), dtype=torch.float32)
