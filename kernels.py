"""Triton kernels for 4-bit quantization: one fused pass that rotates (RHT-16), scales, rounds, packs
and dequantizes, bit for bit like the PyTorch reference in quant.py (docs/NUMERICS.md §1-5).

A call sees a 2-D view [M, K] of its input, K the quantized (reduction) dim, and does per block of
16 or 32 elements (or a 16x16 weight tile):
  1. optional RHT-16 in registers (the rotated tensor is never written);
  2. the block amax and scale (fp32 | e4m3 two-level | e8m0), and y = x / scale;
  3. RTNE or stochastic rounding (Philox, 16-bit uniforms) of |y| to a level index;
  4. outputs: packed codes (sign<<3 | level, two a byte) with the scales, and/or the dequantized
     tensor, rotated back or kept rotated for the emulated GEMM.
`dim=-1` quantizes along rows; `dim=0` along the columns of a 2-D tensor without a transpose.
e4m3 scales need the tensor amax first: a separate pass (tensor_amax, or tensor_amax_both for rows
and columns from one read).

Each step is the reference's fp32 operation in the same order; where a kernel takes a faster route
(division by FMAs, rounding by adding 2**23·spacing, the e4m3 cast as a rounder) it is exact inside a
range the kernel checks per tile, and tiles outside take the reference's steps. docs/KERNELS.md
gives the layout of a program and the proofs; tests/test_kernels.py checks every path against
quant.py.
"""

import functools
import math
import os
import struct
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

SCALE_MODES = {"fp32": 0, "e4m3": 1, "e8m0": 2}
E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounds of Philox4x32 for stochastic rounding. Its authors (Salmon et al., SC'11) found 7 rounds to pass
# TestU01's BigCrush and chose 10 as a margin (tl.randint4x's default); 7 make the SR kernel ~10% faster
# (bench/kernels_bench.py times both), and the SR tests check its statistics.
PHILOX_ROUNDS = 7  # read when a call's launch plan is made (kernels._plan caches it: cache_clear() after a change)
# The fast exact division (_div_fast) needs a fused multiply-add. Triton's CPU interpreter rounds tl.fma
# twice, so it takes the IEEE division unless its FMA has been made exact (tests/conftest.py does so).
INTERPRET_FAST_DIV = False  # read by _plan, as PHILOX_ROUNDS
# uniform-grid SR's y carries this constant (_round_to_grid): the uniform's 2**-9 * (1 + 2**-17)
_SR_B = tl.constexpr(2.0**-9 * (1 + 2.0**-17))


# ----------------------------------------------------------------------------- jit helpers
@triton.jit
def _butterfly(v):
    """Stages h = 1, 2, 4, 8 of (a, b) -> (a + b, a - b) on groups v [BM, NG, 8, 2] (element j + 8h)."""
    BM: tl.constexpr = v.shape[0]
    NG: tl.constexpr = v.shape[1]
    v = tl.reshape(v, (BM, NG, 2, 2, 2, 2))  # bit axes of the element index: (b2, b1, b0, b3)
    for _ in tl.static_range(4):
        v = tl.permute(v, (0, 1, 5, 2, 3, 4))  # brings b0, then b1, b2, b3 to the last axis
        a, b = tl.split(v)
        v = tl.join(a + b, a - b)
    return tl.reshape(v, (BM, NG, 8, 2))  # after four rotations the axes are (b2, b1, b0, b3) again


@triton.jit
def _rotate(v, signs, PAIR_MAX: tl.constexpr = 0):
    """_butterfly(v * signs) for v from _load_tile(.., signs), whose odd elements (the b of each
    first-stage pair) carry their signs already: a*sa + b and a*sa - b are one FMA each (a*sa is
    exact, so each is rounded once, as the sum is).
    PAIR_MAX 1: instead of the last stage's pair (a + b, a - b), max(|a + b|, |a - b|) = |a| + |b|, with
    the same bits for finite a, b (rounding is monotone and odd), [BM, NG, 2, 2, 2]; 2: the rotated
    tile and those maxima [BM, NG, 8] (a group's amax from 8 of them: the adds on the FMA pipe, 7
    maxima where 15 took the slower ALU pipe)."""
    BM: tl.constexpr = v.shape[0]
    NG: tl.constexpr = v.shape[1]
    a, b = tl.split(tl.permute(tl.reshape(v, (BM, NG, 2, 2, 2, 2)), (0, 1, 5, 2, 3, 4)))
    sa = tl.split(tl.permute(tl.reshape(signs, (1, 1, 2, 2, 2, 2)), (0, 1, 5, 2, 3, 4)))[0]
    v = tl.join(tl.fma(a, sa, b), tl.fma(a, sa, b * -1.0))
    for _ in tl.static_range(2):
        v = tl.permute(v, (0, 1, 5, 2, 3, 4))
        a, b = tl.split(v)
        v = tl.join(a + b, a - b)
    a, b = tl.split(tl.permute(v, (0, 1, 5, 2, 3, 4)))
    if PAIR_MAX == 1:
        out = tl.abs(a) + tl.abs(b)
    elif PAIR_MAX == 2:
        out = tl.reshape(tl.join(a + b, a - b), (BM, NG, 8, 2)), tl.reshape(tl.abs(a) + tl.abs(b), (BM, NG, 8))
    else:
        out = tl.reshape(tl.join(a + b, a - b), (BM, NG, 8, 2))
    return out


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
    tiles cover the [M, K] view exactly, so the mask is a constant (the loads and stores lose theirs)."""
    m = pid_m * BM + tl.arange(0, BM)
    g = pid_g * NG + tl.arange(0, NG)
    if EVEN:
        mask = tl.full((BM, NG), True, tl.int1)
    else:
        mask = (m < M)[:, None] & (g < K // 16)[None, :]
    mm = m.to(tl.int64) if I64 else m
    gg = g.to(tl.int64) if I64 else g
    if COLWISE:  # element (m, k) of the [M, K] view is x[k, m] of the [K, M] input. M, the input's
        # row length, is a compile-time constant here (COLS): the offsets k * M of a group's 16 rows
        # are then immediates of the loads and stores (one compile per width; a model has a few)
        base = mm[:, None] + (gg * 16 * M)[None, :]
    else:
        base = mm[:, None] * K + gg[None, :] * 16
    return m, g, mask, base


@triton.jit
def _load_offsets(x_ptr, pid_m, pid_g, M, K, base, mask, COLWISE: tl.constexpr, I64: tl.constexpr,
                  EVEN: tl.constexpr = False):
    """_load_tile's offsets and mask: the tile's (base, mask), or for columnwise bf16 x read as words
    of the two elements m, m + 1 (even M; _tile_input) those of the words, [BM // 2, NG]."""
    if COLWISE and x_ptr.dtype.element_ty == tl.int32:
        BM: tl.constexpr = base.shape[0] // 2
        NG: tl.constexpr = base.shape[1]
        w = pid_m * BM + tl.arange(0, BM)
        g = pid_g * NG + tl.arange(0, NG)
        if EVEN:
            mask = tl.full((BM, NG), True, tl.int1)
        else:
            mask = (w < M // 2)[:, None] & (g < K // 16)[None, :]
        ww = w.to(tl.int64) if I64 else w
        gg = g.to(tl.int64) if I64 else g
        base = ww[:, None] + (gg * 8 * M)[None, :]  # a group's 16 rows of M // 2 words
    return base, mask


@triton.jit
def _to_f32(v, X_BITS: tl.constexpr):
    """Loaded values -> fp32; X_BITS: bf16 given as int16 bits (the interpreter's bf16 upcast
    loses subnormals), widened by a shift."""
    if X_BITS:
        return _bits_to_f32(v.to(tl.int32) << 16)
    return v.to(tl.float32)


@triton.jit
def _from_words(w, s_odd=None, m16=None):
    """Words [BM, NG, 4] of two elements each (bf16: int32, fp32: int64; element 2i in the low half of
    word i) -> their 8 elements [BM, NG, 8] in fp32, by a shift and a mask each. s_odd: the sign bits
    [1, 1, 4] of the odd elements' RHT signs, xor-ed into those elements (bf16: in the same 3-input
    logic instruction as the mask). m16: 2**16 that the compiler cannot see, so that the shift is an
    integer multiply (_pack_codes says why)."""
    if w.dtype == tl.int32:
        ev = _bits_to_f32(w << 16 if m16 is None else w * m16)
        od = w & -65536
    else:
        ev = _bits_to_f32(w.to(tl.int32))
        od = (w >> 32).to(tl.int32)
    od = _bits_to_f32(od if s_odd is None else od ^ s_odd)
    return tl.reshape(tl.join(ev, od), (w.shape[0], w.shape[1], 8))


@triton.jit
def _load_tile(x_ptr, base, mask, M, COLWISE: tl.constexpr, X_BITS: tl.constexpr, signs=None, words=None,
               m16=None):
    """The tile [BM, NG, 8, 2] in fp32 (masked elements are 0), base and mask from _load_offsets.
    bf16 x comes as words of two elements, split by a shift and a mask (cheaper than the compiler's
    conversions, and exact in the interpreter): rowwise two of a group (_from_words), columnwise
    the same element of the groups m and m + 1 (a word per row, the halves interleaved along m).
    signs: the RHT signs [1, 1, 8, 2] (±1): the odd elements come out times their signs (_rotate
    takes them so), their sign bits xor-ed in by the instruction that splits a bf16 word (the mask
    of the high half; the shift of the low half becomes a shift-add of the sign bit), or by one
    instruction in place of the multiply. words: the tile's data as _load_words loaded it (else loaded here).
    m16: _from_words'."""
    if COLWISE:
        r_lo, r_hi = tl.split(_load_words(x_ptr, base, mask, M, True) if words is None else words)
        rl = _split8(r_lo)
        rh = _split8(r_hi)
        sl = None
        sh = None
        if signs is not None:  # the sign bits [1, 1] of elements 0..7 and 8..15
            s_lo, s_hi = tl.split(signs.to(tl.int32, bitcast=True) & -2147483648)
            sl = _split8(s_lo)
            sh = _split8(s_hi)
        xs = ()
        for k in tl.static_range(16):
            sb = None
            if signs is not None and k % 2 == 1:  # an odd element: its sign bit
                sb = sh[k - 8] if k >= 8 else sl[k]
            r = rh[k - 8] if k >= 8 else rl[k]
            if x_ptr.dtype.element_ty == tl.int32:  # words of the groups m, m + 1 (_load_offsets)
                w = r  # [BM // 2, NG]
                lo = w << 16 if m16 is None else w * m16
                if sb is not None:
                    v = tl.join(_bits_to_f32(lo + sb), _bits_to_f32((w & -65536) ^ sb))
                else:
                    v = tl.join(_bits_to_f32(lo), _bits_to_f32(w & -65536))
                xk = tl.reshape(tl.permute(v, (0, 2, 1)), (2 * w.shape[0], w.shape[1]))
            else:
                xk = _to_f32(r, X_BITS)
                if sb is not None:
                    xk = _bits_to_f32(xk.to(tl.int32, bitcast=True) ^ sb)
            xs = xs + (xk,)
        lo = _join8(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7])
        hi = _join8(xs[8], xs[9], xs[10], xs[11], xs[12], xs[13], xs[14], xs[15])
    else:
        s_lo = None
        s_hi = None
        if signs is not None:  # the odd signs' sign bits [1, 1, 4] of each half
            h0, h1 = tl.split(tl.reshape(signs.to(tl.int32, bitcast=True) & -2147483648, (1, 1, 4, 2, 2)))
            s_lo = tl.split(h0)[1]
            s_hi = tl.split(h1)[1]
        w_lo, w_hi = tl.split(_load_words(x_ptr, base, mask, M, False) if words is None else words)
        lo = _from_words(w_lo, s_lo, m16)
        hi = _from_words(w_hi, s_hi, m16)
    return tl.join(lo, hi)


@triton.jit
def _load_words(x_ptr, base, mask, M, COLWISE: tl.constexpr):
    """A tile's data as loaded (_load_tile's base and mask): rowwise the words [BM, NG, 4, 2] (two elements
    a word; [.., h] elements 8h..8h+7); columnwise the 16 rows k = j + 8h of the groups, [B, NG, 8, 2]
    (B = BM // 2 words of two elements, or BM elements)."""
    if COLWISE:
        step = M // 2 if x_ptr.dtype.element_ty == tl.int32 else M
        r = ()
        for k in tl.static_range(16):
            r = r + (tl.load(x_ptr + base + k * step, mask=mask, other=0),)
        words = tl.join(_join8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]),
                        _join8(r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]))
    else:
        p = x_ptr + (base >> 1)[:, :, None] + tl.arange(0, 4)[None, None, :]
        words = tl.join(tl.load(p, mask=mask[:, :, None], other=0), tl.load(p + 4, mask=mask[:, :, None], other=0))
    return words


@triton.jit
def _tile_words(x_ptr, pid_a, pid_b, M, K, valid, BM: tl.constexpr, NG: tl.constexpr, COLWISE: tl.constexpr,
                I64: tl.constexpr, EVEN: tl.constexpr, M_FIRST: tl.constexpr):
    """_load_words of the tile pid_a along the grid's first axis, pid_b along its second; none if not valid."""
    pid_m = pid_a if M_FIRST else pid_b
    pid_g = pid_b if M_FIRST else pid_a
    _, _, mask, base = _tile_offsets(pid_m, pid_g, M, K, BM, NG, COLWISE, I64, EVEN)
    base, mask = _load_offsets(x_ptr, pid_m, pid_g, M, K, base, mask, COLWISE, I64, EVEN)
    return _load_words(x_ptr, base, mask & valid, M, COLWISE)


@triton.jit
def _store_tile(out_ptr, v, base, mask, M, COLWISE: tl.constexpr):
    """Store the tile [BM, NG, 8, 2] (any dtype) into the input's layout."""
    lo, hi = tl.split(v)
    if COLWISE:
        p = out_ptr + base
        ls = _split8(lo)
        hs = _split8(hi)
        for k in tl.static_range(8):
            tl.store(p + k * M, ls[k], mask=mask)
            tl.store(p + (k + 8) * M, hs[k], mask=mask)
    else:
        p = out_ptr + base[:, :, None] + tl.arange(0, 8)[None, None, :]
        tl.store(p, lo, mask=mask[:, :, None])
        tl.store(p + 8, hi, mask=mask[:, :, None])


@triton.jit
def _store_dequant(out_ptr, dq, signs_ptr, base, mask, M, COLWISE: tl.constexpr, RHT: tl.constexpr,
                   KEEP_ROTATED: tl.constexpr, OUT_MODE: tl.constexpr):
    """Store the fp32 dequantized tile: rotated back (inverse butterfly, then the signs) unless
    KEEP_ROTATED, in fp32 (OUT_MODE 0), native bf16 (1) or bf16 rounded with integer ops (2)."""
    if RHT and not KEEP_ROTATED:
        dq = _butterfly(dq) * (_signs(signs_ptr) * 0.25)  # (one multiply: x * 0.25 * s = x * (0.25 s))
    if OUT_MODE == 1:
        dq = dq.to(tl.bfloat16)
    elif OUT_MODE == 2:
        dq = _bf16_rne(dq)
    _store_tile(out_ptr, dq, base, mask, M, COLWISE)


@triton.jit
def _bits_to_f32(b):
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _pow2(p):
    """2**p as fp32 for integer p in [-127, 127] (2**-127 is subnormal)."""
    return _bits_to_f32(tl.where(p >= -126, (p + 127) << 23, 0x00400000))


@triton.jit
def _max_nan(a, b):
    """max(a, b), NaN if either is NaN (tl.maximum's default drops a NaN); integers as tl.maximum."""
    if a.dtype.is_floating():
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    return tl.maximum(a, b)


@triton.jit
def _block_amax(x, BM: tl.constexpr, NG: tl.constexpr, QB: tl.constexpr, BLOCK_2D: tl.constexpr, pair_max=None):
    """Tile [BM, NG, 8, 2] -> the max |x| of each group's block (or 16x16 tile), per group [BM, NG]:
    NaN if the block holds a NaN, else exact (float max, the |.| free in each max instruction: the
    integer max of the bits costs twice as much, on the slower integer pipe). pair_max: a rotated
    tile's maxima of pairs [BM, NG, 8] (_rotate's PAIR_MAX 2), taken instead of x's 16 elements (+Inf
    where a pair is ±Inf, for which x may hold NaN: either way the block is not finite)."""
    if pair_max is None:
        lo, hi = tl.split(tl.abs(x))
        pair_max = _max_nan(lo, hi)
    v = _split8(pair_max)
    a = _max_nan(_max_nan(_max_nan(v[0], v[1]), _max_nan(v[2], v[3])),
                 _max_nan(_max_nan(v[4], v[5]), _max_nan(v[6], v[7])))
    if BLOCK_2D:
        t = tl.reduce(tl.reshape(a, (BM // 16, 16, NG)), 1, _max_nan)
        a = tl.reshape(tl.broadcast_to(t[:, None, :], (BM // 16, 16, NG)), (BM, NG))
    elif QB == 32:
        t = tl.reduce(tl.reshape(a, (BM, NG // 2, 2)), 2, _max_nan)
        a = tl.reshape(tl.broadcast_to(t[:, :, None], (BM, NG // 2, 2)), (BM, NG))
    return a


@triton.jit
def _round_to_grid(y, k, UNIFORM: tl.constexpr, STEP: tl.constexpr, CB: tl.constexpr, SR: tl.constexpr,
                   INDEX_ONLY: tl.constexpr = False, ADD_MAX: tl.constexpr = True, f=None):
    """|y| = ay <= g_max -> (level index int32, level value fp32), RTNE or SR (k: 16-bit random integers,
    u = (k + 1/2) * 2**-16; u1 = 1 + u is built from bits).

    Near ay the levels are spaced sp apart: STEP on uniform grids; on E2M1 0.5 below 2, 1 up to 4,
    then 2. With c = sp * 2**23, the fp32 sum ay + c is ay rounded to a multiple of sp (RNE: a tie goes
    to the even multiple = the even level index), v - c is that level exactly, and bits(v) - bits(c)
    counts its steps above the first level of the spacing's range. SR rounds ay + (u - 1/2) * sp the
    same way, i.e. floor(ay / sp + u) * sp: it adds u1 * sp (exact, one FMA) and c - sp / 2 (the float
    below c), a sum of at least c + sp / 2, so v's spacing is sp and the level is v - (c + sp).
    On uniform grids SR takes y = ay * 2**-9 / STEP + _SR_B instead, _SR_B = 2**-9 * (1 + 2**-17) (the
    caller's FMA: the spacing is 2**-9 there, and u1 * sp = 2**-9 + 2**-26 + k * 2**-25), so that k * 2**-25
    is one FMA on k's bits as they are: the subnormal k * 2**-149 times 2**124.

    INDEX_ONLY (E2M1, RTNE; the level value is not returned): the index is T(ay) rounded to an
    integer, T = min(2a, a + 2, a / 2 + 4) the piecewise-linear map of the levels onto 0..7 (between
    two levels it is affine, so their midpoint maps to i + 1/2 and a tie to the even index). Each line is
    rounded once, as one add to |y| (taken inside): a + 2**22 rounds a to a multiple of 1/2 (the ulp
    there), i.e. 2a to an integer; a + 2**23 + 2 rounds a + 2 to an integer; a + 2**24 + 8 rounds a + 8
    to an even integer, i.e. a / 2 + 4 to an integer; each RNE as T's rounding is (scaling by 2 is
    exact), and their bits count the line's rounded value in those steps from 0x4A800000, 0x4B000000 +
    0x800000 and 0x4B800000 + 0x1000000 on: the index is the least count, two integer add-and-min
    instructions (the min of the rounded lines is the rounded min: rounding is monotone). Five
    instructions, no constant held in a register (multiplies by 2 and 1/2 took two); the exponent
    arithmetic above takes five on the integer pipe.
    Returned as bits - 0x4A800000 (the caller adds the constant back: _pack_codes' OFF), no level value.
    f (per group, a power of two): the index of y * f, a product each line's FMA takes exactly (y * f
    is exact, or under 2**-126 and of level 0 all the same), one multiply an element less."""
    ay = tl.abs(y)  # (taken inside the additions below; the exponent is read from y's bits)
    if INDEX_ONLY and not UNIFORM and not SR:
        if f is None:
            v1, v2, v3 = ay + 4194304.0, ay + 8388610.0, ay + 16777224.0
        else:
            v1, v2, v3 = tl.fma(ay, f, 4194304.0), tl.fma(ay, f, 8388610.0), tl.fma(ay, f, 16777224.0)
        b1 = v1.to(tl.int32, bitcast=True)
        b2 = v2.to(tl.int32, bitcast=True)
        b3 = v3.to(tl.int32, bitcast=True)
        return tl.minimum(tl.minimum(b2 - 0x800000, b1), b3 - 0x1000000) - 0x4A800000, v1  # (v1 unused)
    if UNIFORM:
        c = STEP * 8388608.0
        cb = CB
        base = 0
    else:
        e = y.to(tl.int32, bitcast=True) & 0x7F800000
        if ADD_MAX:  # max(e, 1.0's) + 0x0B000000 as one add-and-max (sm_90: VIADDMNMX; |y| < 2**107: no wrap)
            cb = tl.maximum(e + 0x0B000000, 0x4A800000)
        else:
            cb = tl.maximum(e, 0x3F800000) + 0x0B000000
        c = _bits_to_f32(cb)
        base = (cb >> 22) - 298                        # index of level 0, 2 or 4 at spacing .5, 1, 2
    if SR and UNIFORM:  # spacing 2**-9 (the level is scaled back by STEP * 2**9 in its one FMA, exactly)
        v = tl.fma(_bits_to_f32(k), 2.1267647932558654e37, y) + 16383.9990234375      # 2**124; c - sp / 2
        return v.to(tl.int32, bitcast=True) - 0x46800001, tl.fma(v, STEP * 512.0, STEP * -8388609.0)
    if SR:
        u1 = _bits_to_f32((k << 7) | 0x3F800040)
        v = tl.fma(u1, _bits_to_f32(cb - 0x0B800000), ay) + _bits_to_f32(cb - 1)
        c = _bits_to_f32(cb + 1)
        cb = cb + 1
    else:
        v = ay + c
    return v.to(tl.int32, bitcast=True) - cb + base, v - c


@triton.jit
def _div_bf16(x, s, r):
    """RN(x / s) for bf16 x and s = g or s = RN(amax / g) (module doc), r = RN(1 / s): RN(x * r + RN(x * z)),
    z = RN(RN(1 - s * r) * r) (s and r per group, or constants: z is not computed per element). For
    other x and s it is faithful (_div_fast). (-s is written s * -1.0 here and below: Triton makes -s
    0 - s, an instruction of its own, where a product by -1 is a negation the FMA takes as an operand.)"""
    return tl.fma(x, r, x * (tl.fma(s * -1.0, r, 1.0) * r))


@triton.jit
def _div_fast(x, s, r):
    """RN(x / s) from r = RN(1 / s): the one-FMA division q = RN(x*r + RN(x*z)) (_div_bf16) is faithful
    for every x, and one Newton correction q += (x - s*q) * r by FMA then gives RN(x / s) exactly
    (Markstein's theorem), provided s in [2**-100, 2**124] and |x / s| >= 2**-3. Why q is faithful:
    e = 1 - s*r is exact, 1/s = r + e*r + e*e/s, and z = RN(e*r) is off by 2**-24 |e*r| or, subnormal,
    2**-150 (s <= 2**124 keeps x times that below 2**-26 |x/s|), so x*r + RN(x*z) is within 2**-25 |x/s|
    of x/s and its rounding within one ulp; the remainders x - s*q are exact (no underflow in that
    range). Smaller quotients come out within a few ulps (and +0 for -0), which rounds to level 0 all the
    same."""
    q = _div_bf16(x, s, r)
    return tl.fma(tl.fma(s * -1.0, q, x), r, q)


@triton.jit
def _div_level(x, s, r):
    """x / s rounded to the grid as RN(x / s) would be, r = RN(1 / s): q = RN(x * r) (within 1.5 ulps of
    x / s, not always faithful), then _div_fast's correction. It gives RN(x / s) wherever x / s lies
    within 20 ulps of a level midpoint (checked for every fp32 significand of s and every midpoint
    significand of E2M1 and of uniform grids: bench/results/h200_2026-12-02_t), and elsewhere lies
    within an ulp of x / s, so both round to the same level. Powers of two scale every step exactly
    while s <= 2**124 and the x of a midpoint is at least 2**-102: in the fast range f >= 2**-98, and
    the first midpoint is y = 1/4 (E2M1; uniform grids of step >= 1/2), x = y * f (_pack_f8's
    y' * 2**9 * step * f is the same x)."""
    q = x * r
    return tl.fma(tl.fma(s * -1.0, q, x), r, q)


@triton.jit
def _rcp_fast(f):
    """RN(1 / f) on GPUs for f of exponent field 1..252 (f in [2**-126, 2**126); the kernel's fast range
    is inside it): the steps rcp.rn takes there, without its range test and slow path (MUFU.RCP, then
    e = 1 - f * r and r + r * e by FMA)."""
    r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [f], dtype=tl.float32, is_pure=True,
                                  pack=1)
    return tl.fma(r, tl.fma(f * -1.0, r, 1.0), r)


@triton.jit
def _outside_fast_range(v, TOP: tl.constexpr = 0x7D000000):
    """v outside [2**-98, 2**123], the range of the kernel's fast steps (module text), or NaN; TOP: the
    fp32 bits of a lower upper end. One unsigned compare of the bits: below 2**-98 (zeros too) they
    wrap around, negative v and NaN lie above."""
    return v.to(tl.uint32, bitcast=True) - 0x0E800000 > TOP - 0x0E800000


@triton.jit
def _bf16_rne(f):
    """fp32 -> bf16 bits (int16) with round-to-nearest-even, by integer ops; NaN -> 0x7FC0."""
    b = f.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(f != f, 0x7FC0, r).to(tl.int16)


@triton.jit
def _tensor_scale(amax_ptr, G: tl.constexpr):
    """e4m3's tensor scale t = max(amax_T / (448 g), 2**-120) (1 for amax_T = 0; the floor is quant.py's
    E4M3_T_MIN: 1 / (t sb) stays finite) and RN(1 / t), from the tensor amax's
    bits at amax_ptr: along rows once a program (once a tile, the two IEEE divisions and the load took
    1.7 of NVFP4's 22.0 sm_90 instructions an element)."""
    amax_t = _bits_to_f32(tl.load(amax_ptr))
    t = tl.where(amax_t > 0, tl.maximum(tl.math.div_rn(amax_t, 448.0 * G), 2.0**-120), 1.0)
    return t, tl.math.div_rn(1.0, t)


@triton.jit
def _block_scale(amax, finite, t, it, SCALE: tl.constexpr, G: tl.constexpr, E8_SHIFT: tl.constexpr,
                 RG: tl.constexpr = 0.0, X_BF16: tl.constexpr = False):
    """Block amax [BM, NG] (0 for non-finite blocks) -> (f, deq, stored): y = x / f (fp32 scales) or
    y = x * f (e4m3, e8m0); dequant = q * deq (NaN for non-finite blocks); the scale as stored. t, it:
    e4m3's tensor scale and RN(1 / t) (_tensor_scale), else unused. RG = RN(1 / g): amax / g (and e4m3's
    / t) by _div_fast, exact for amax >= 2**-100 (or 0), s finite and t in [2**-100, 2**125] (else the
    caller computes it again: fp32 scales then have an f out of the kernel's fast range, e4m3 scales are
    checked for both). X_BF16 (amax is a bf16 value): amax / g by _div_bf16."""
    if RG != 0.0:  # amax / g
        if X_BF16:
            ag = _div_bf16(amax, tl.full((), G, tl.float32), RG)
        else:
            ag = _div_fast(amax, G, RG)
    if SCALE == 0:    # fp32: s = amax / g; an all-zero block divides by 1 (y = 0)
        s = ag if RG != 0.0 else tl.math.div_rn(amax, G)
        f = tl.where(s > 0, s, 1.0)  # (non-finite blocks have amax 0 here)
        deq = tl.where(finite, s, float("nan"))
        stored = deq
    elif SCALE == 1:  # e4m3: sb = e4m3(clamp((amax / g) / t)); f = (1 / t) / sb
        if RG != 0.0:  # exact while amax >= 2**-100 (or 0) and t in the fast range
            v = _div_fast(ag, t, it)
        else:
            v = tl.math.div_rn(tl.math.div_rn(amax, G), t)
        v = tl.where(v != v, v, tl.minimum(tl.maximum(v, 0.015625), 448.0))
        vb = v.to(tl.int32, bitcast=True)
        vb = (vb + 0x7FFFF + ((vb >> 20) & 1)) & -1048576           # RNE to 3 mantissa bits
        sb = _bits_to_f32(vb)
        f = tl.math.div_rn(it, sb)
        deq = tl.where(finite, t * sb, float("nan"))
        stored = tl.where(finite & (v == v), (((vb >> 23) - 120) << 3) | ((vb >> 20) & 7), 0x7F)
    else:             # e8m0: s = 2**e, e = E(amax) - floor(log2 g); f = 2**-max(e, -126)
        e = tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - E8_SHIFT, -127), 127)
        f = _pow2(-tl.maximum(e, -126))
        deq = tl.where(finite, _pow2(e), float("nan"))
        stored = tl.where(finite, e + 127, 255)
    return f, deq, stored


@triton.jit
def _mul_wide(a, b, ASM: tl.constexpr):
    """(high, low) words of the 64-bit product of uint32 a and b. ASM: one mul.wide.u32 (one
    IMAD.WIDE.U32 on sm_90, where the high and the low multiply take one instruction each)."""
    if ASM:
        return tl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, $3; mov.b64 {$1, $0}, t; }",
                                         "=r,=r,r,r", [a, b], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)
    return tl.umulhi(a, b), a * b


@triton.jit
def _randint4x(seed, offs, ROUNDS: tl.constexpr, ASM: tl.constexpr):
    """tl.randint4x(seed, offs, ROUNDS) for int32 offsets, the same bits, each round's two products by
    _mul_wide. Philox4x32 (Salmon et al., SC'11) as Triton runs it: counter (offs, 0, 0, 0), key (the
    seed's low and high words, int32 sign-extended to 64 bits)."""
    s64 = seed.to(tl.uint64)
    k0 = (s64 & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((s64 >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = offs.to(tl.uint32)
    z = c0 * 0
    c1, c2, c3 = z, z, z
    for _ in tl.static_range(ROUNDS):
        hb, lb = _mul_wide(c2, z + 0xCD9E8D57, ASM)
        ha, la = _mul_wide(c0, z + 0xD2511F53, ASM)
        c0, c1, c2, c3 = hb ^ c1 ^ k0, lb, ha ^ c3 ^ k1, la
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _uniforms(seed, m, g, K, BM: tl.constexpr, NG: tl.constexpr, ROUNDS: tl.constexpr, ASM: tl.constexpr):
    """[BM, NG, 8, 2] 16-bit random integers k (int32) for the uniforms u = (k + 1/2) * 2**-16: 2 Philox
    calls (8 words of 32 bits, two halves each) per group, with counters unique per group of the [M, K]
    view."""
    offs = ((m[:, None] * (K // 16) + g[None, :]) * 2)[:, :, None] + tl.arange(0, 2)[None, None, :]
    r0, r1, r2, r3 = _randint4x(seed, offs, ROUNDS, ASM)                    # uint32, each [BM, NG, 2]
    r = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (BM, NG, 8))
    return tl.join(r & 0xFFFF, r >> 16).to(tl.int32, bitcast=True)         # [BM, NG, 8, 2]


@triton.jit
def _pack_codes(idx, xbits, finite, nib, OFF: tl.constexpr = 0, SAT: tl.constexpr = False):
    """Level indices [BM, NG, 8, 2] (element j + 8h) and the fp32 bits of x (their signs) -> 4-bit codes
    sign<<3 | index packed in one int64 word per group [BM, NG], element i in bits 4i..4i+3
    (little-endian: byte i holds elements 2i, 2i + 1 in its low, high nibble), so a group's 8 bytes are
    one store; non-finite groups get code 0 (their indices are anything). Each half builds its 32-bit
    word from element 7 down, one instruction per element for each of two words: the indices by
    w * 16 + idx, the signs by a funnel shift taking x's top 4 bits (s << 4 | bits >> 28, kept to the
    sign bits by one final mask). OFF: the constant the rounding took off the indices (bits(v) - OFF),
    added back here, which the compiler drops, and taken off once a word (OFF times 0x11111111, mod
    2**32): with w * nib it could not fold it a word itself. nib is 16, a kernel argument: the
    compiler cannot make w * nib + idx a shift-and-add, which sm_90 runs on the integer ALU pipe beside
    the signs' shifts and the maxima; as an integer multiply-add it runs on the FMA pipe. SAT: indices
    of 8 (a level above the grid's last) are taken down to 7, a word's nibbles at once."""
    OFF_W: tl.constexpr = (OFF * 0x11111111) % 2**32 - (2**32 if (OFF * 0x11111111) % 2**32 >= 2**31 else 0)
    i_lo, i_hi = tl.split(idx + OFF)
    s_lo, s_hi = tl.split(xbits.to(tl.uint32, bitcast=True))
    words = ()
    for half in tl.static_range(2):
        i = _split8(i_hi if half else i_lo)
        b = _split8(s_hi if half else s_lo)
        w = i[7]
        s = b[7] >> 28
        for k in tl.static_range(6, -1, -1):
            w = w * nib + i[k]
            s = (s << 4) | (b[k] >> 28)
        if OFF_W != 0:
            w = w - OFF_W
        if SAT:
            w = w - ((w >> 3) & 0x11111111)
        words = words + ((s & 0x88888888).to(tl.int32, bitcast=True) | w,)
    w = (words[1].to(tl.int64) << 32) | (words[0].to(tl.int64) & 0xFFFFFFFF)
    return tl.where(finite, w, 0)


@triton.jit
def _f8_bytes(a, b, c, d, F8: tl.constexpr):
    """Four y' (fp32, |y'| <= 7.5 * 2**-9) -> their e4m3 bytes sign<<7 | RNE(|y'| * 2**9), a's in the
    low byte of an int32. Below 2**-5, e4m3's step is 2**-9 and its byte is the multiple's count, so
    the cast rounds y' to the level index as _round_to_grid would (RNE: a tie to the even index).
    F8 2: the cast itself (sm_89+: two elements an instruction); 1: the same by an fp32 addition."""
    if F8 == 2:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
            "=r,f,f,f,f", [a, b, c, d], dtype=tl.int32, is_pure=True, pack=1)
    return _f8_byte(a) | (_f8_byte(b) << 8) | (_f8_byte(c) << 16) | (_f8_byte(d) << 24)


@triton.jit
def _f8_byte(v):
    """_f8_bytes' byte of one y' by fp32 arithmetic: |y'| + 2**14 (whose step is 2**-9) rounds it."""
    return ((tl.abs(v) + 16384.0).to(tl.int32, bitcast=True) - 0x46800000) | \
        ((v.to(tl.int32, bitcast=True) >> 24) & 0x80)


@triton.jit
def _pack_f8(y, xbits, finite, F8: tl.constexpr):
    """_pack_codes for uniform grids rounded to nearest from y' = y * 2**-9 / step (fp32 scales): each
    element's e4m3 byte (_f8_bytes; the sign taken from x, which -0 needs: the fast division can
    return +0 for x = -0), then a group's 8 bytes sign<<7 | index become its 8 nibbles sign<<3 | index
    by shifts and masks on the even elements' and the odd elements' words."""
    yb = y.to(tl.int32, bitcast=True)
    ys = _bits_to_f32(yb ^ ((yb ^ xbits) & -2147483648))  # y's bits, x's sign: one 3-input logic op
    words = ()
    for half in tl.static_range(2):
        x0, x1, x2, x3, x4, x5, x6, x7 = _split8(tl.split(ys)[half])
        ev = _f8_bytes(x0, x2, x4, x6, F8)   # bytes i: element 2i
        od = _f8_bytes(x1, x3, x5, x7, F8)   # element 2i + 1
        words = words + (((ev | (ev >> 4)) & 0x0F0F0F0F) | ((od | (od << 4)) & -252645136),)  # 0xF0F0F0F0
    w = (words[1].to(tl.int64) << 32) | (words[0].to(tl.int64) & 0xFFFFFFFF)
    return tl.where(finite, w, 0)


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _amax_kernel(x_ptr, amax_ptr, N, BLOCK: tl.constexpr, MASK: tl.constexpr, INF: tl.constexpr,
                 SHIFT: tl.constexpr, I64: tl.constexpr):
    """amax_ptr[0] = max(amax_ptr[0], fp32 bits of max |x| over the finite elements of x), x given as
    its N integer bit patterns (bf16: int16, fp32: int32): |x| is bits & MASK, non-finite from INF up.
    Persistent: program p reads blocks p, p + P, p + 2P, ... and makes one atomic. (The loops are
    `while` loops: the CPU interpreter cannot run tl.range with runtime bounds.)"""
    acc = tl.zeros((BLOCK,), tl.int32)
    i, n_blocks = tl.program_id(0), tl.cdiv(N, BLOCK)
    while i < n_blocks:
        o = (i.to(tl.int64) if I64 else i) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(x_ptr + o, mask=o < N, other=0).to(tl.int32) & MASK
        acc = tl.maximum(acc, tl.where(a < INF, a, 0))
        i += tl.num_programs(0)
    tl.atomic_max(amax_ptr, tl.max(acc) << SHIFT)


@triton.jit
def _group_max(v, signs, RHT: tl.constexpr, EXACT: tl.constexpr):
    """Groups v [BM, NG, 8, 2] -> max |v| (rotated if RHT, v loaded with the signs) per group [BM, NG].
    EXACT: the bits of the max over the finite values (int32). Else fp32 by float maxima, the last
    butterfly stage's pairs as _rotate's PAIR_MAX: the same for finite groups, else NaN or Inf (or,
    where a max drops NaN, the max of the others; the caller then reads its tiles again, EXACT)."""
    if EXACT:
        a = (_rotate(v, signs) if RHT else v).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        out = tl.max(tl.max(tl.where(a < 0x7F800000, a, 0), axis=3), axis=2)
    elif RHT:
        out = tl.max(tl.max(tl.max(_rotate(v, signs, 1), axis=4), axis=3), axis=2)
    else:
        out = tl.max(tl.max(tl.abs(v), axis=3), axis=2)
    return out


@triton.jit
def _both_amax(xw_ptr, xc_ptr, signs, R, C, TR: tl.constexpr, TC: tl.constexpr, I64: tl.constexpr,
               X_BITS: tl.constexpr, ROW_RHT: tl.constexpr, EXACT: tl.constexpr, SYNC: tl.constexpr):
    """(rows, columns) max |v| (_group_max's) over this program's TR x TC tiles of the [R, C] tensor
    (tile p, p + P, ...): rows rotated along C if ROW_RHT, columns along R. Each tile is loaded twice,
    as the column pass and as the row pass lay it out (xc_ptr: x as _tile_input gives it columnwise,
    xw_ptr: rowwise); the second load of a tile finds it in the cache, so x is read from memory once.
    SYNC: a barrier between the two, so the second load is issued after the first has arrived."""
    n_c = tl.cdiv(C, TC)
    n_tiles = n_c * tl.cdiv(R, TR)
    acc_c = tl.zeros((TC, TR // 16), tl.int32 if EXACT else tl.float32)
    acc_r = tl.zeros((TR, TC // 16), tl.int32 if EXACT else tl.float32)
    i = tl.program_id(0)
    while i < n_tiles:
        _, _, mask, base = _tile_offsets(i % n_c, i // n_c, C, R, TC, TR // 16, True, I64)
        base, mask = _load_offsets(xc_ptr, i % n_c, i // n_c, C, R, base, mask, True, I64)
        xc = _load_tile(xc_ptr, base, mask, C, True, X_BITS, signs)
        acc_c = _max_nan(acc_c, _group_max(xc, signs, True, EXACT))
        if SYNC:
            tl.debug_barrier()
        _, _, mask, base = _tile_offsets(i // n_c, i % n_c, R, C, TR, TC // 16, False, I64)
        xr = _load_tile(xw_ptr, base, mask, R, False, X_BITS, signs if ROW_RHT else None)
        acc_r = _max_nan(acc_r, _group_max(xr, signs, ROW_RHT, EXACT))
        i += tl.num_programs(0)
    return _tile_max(acc_r, EXACT), _tile_max(acc_c, EXACT)


@triton.jit
def _tile_max(acc, EXACT: tl.constexpr):
    """The max of a program's accumulator [BM, NG] as fp32 (EXACT: from bits), keeping NaN."""
    a = tl.reduce(tl.reduce(acc, 1, _max_nan), 0, _max_nan)
    return _bits_to_f32(a) if EXACT else a


@triton.jit
def _rht_amax(x_ptr, signs, M, K, BM: tl.constexpr, NG: tl.constexpr, COLWISE: tl.constexpr, I64: tl.constexpr,
              X_BITS: tl.constexpr, EXACT: tl.constexpr):
    """max |v| over this program's tiles of the rotated [M, K] view (tile p, p + P, ...): _group_max's,
    exact or fast (then NaN or Inf where the program met a non-finite group)."""
    n_g = tl.cdiv(K // 16, NG)
    n_tiles = n_g * tl.cdiv(M, BM)
    acc = tl.zeros((BM, NG), tl.int32 if EXACT else tl.float32)
    i = tl.program_id(0)
    while i < n_tiles:
        _, _, mask, base = _tile_offsets(i // n_g, i % n_g, M, K, BM, NG, COLWISE, I64)
        base, mask = _load_offsets(x_ptr, i // n_g, i % n_g, M, K, base, mask, COLWISE, I64)
        x = _load_tile(x_ptr, base, mask, M, COLWISE, X_BITS, signs)
        acc = _max_nan(acc, _group_max(x, signs, True, EXACT))
        i += tl.num_programs(0)
    return _tile_max(acc, EXACT)


@triton.jit
def _amax_rht_kernel(x_ptr, signs_ptr, amax_ptr, M, K,
                     BM: tl.constexpr, NG: tl.constexpr, COLWISE: tl.constexpr, I64: tl.constexpr,
                     X_BITS: tl.constexpr, COLS: tl.constexpr):
    """The same after the RHT of every 16-group of the [M, K] view, over tiles [BM, NG*16]: the fast
    max of _rht_amax, and its exact one where the program met an Inf (reading its tiles again).
    max |v| * 0.25 = max |v * 0.25| (scaling by 0.25 is monotone, and keeps finiteness), so the
    butterfly's 0.25 is applied once, to the maximum."""
    if COLWISE:
        M = COLS
    signs = _signs(signs_ptr)
    amax = _rht_amax(x_ptr, signs, M, K, BM, NG, COLWISE, I64, X_BITS, False)
    if not (amax < float("inf")):
        amax = _rht_amax(x_ptr, signs, M, K, BM, NG, COLWISE, I64, X_BITS, True)
    tl.atomic_max(amax_ptr, (amax * 0.25).to(tl.int32, bitcast=True))


@triton.jit
def _amax_both_kernel(xw_ptr, xc_ptr, signs_ptr, amax_ptr, R, TR: tl.constexpr, TC: tl.constexpr,
                      I64: tl.constexpr, X_BITS: tl.constexpr, ROW_RHT: tl.constexpr, COLS: tl.constexpr,
                      SYNC: tl.constexpr):
    """amax_ptr[0], [1] = max of the (rows, columns) tensor amax passes of the [R, C] tensor x (those of
    _amax_kernel or _amax_rht_kernel: rows rotated if ROW_RHT, columns always) from one read of x:
    the fast maxima of _both_amax, its exact ones where the program met a non-finite group. COLS = C,
    a compile-time constant as in the column pass."""
    signs = _signs(signs_ptr)
    amax_r, amax_c = _both_amax(xw_ptr, xc_ptr, signs, R, COLS, TR, TC, I64, X_BITS, ROW_RHT, False, SYNC)
    if not ((amax_r < float("inf")) & (amax_c < float("inf"))):
        amax_r, amax_c = _both_amax(xw_ptr, xc_ptr, signs, R, COLS, TR, TC, I64, X_BITS, ROW_RHT, True, SYNC)
    tl.atomic_max(amax_ptr, ((amax_r * 0.25) if ROW_RHT else amax_r).to(tl.int32, bitcast=True))
    tl.atomic_max(amax_ptr + 1, (amax_c * 0.25).to(tl.int32, bitcast=True))


@triton.jit
def _fast_y(x, f, SCALE: tl.constexpr, RHT: tl.constexpr, F8: tl.constexpr, STEP: tl.constexpr, FOLD: tl.constexpr,
            FAST_DIV: tl.constexpr, SR: tl.constexpr, UNIFORM: tl.constexpr, X_BF16: tl.constexpr, SAT: tl.constexpr,
            G: tl.constexpr):
    """_quantize_kernel's y = x / scale by the fast steps (module text), as _round_to_grid takes it, and
    the per-group factor fe [BM, NG, 1, 1] it was computed with: (fe, yy)."""
    SR_SCALE: tl.constexpr = 0.001953125 / STEP  # 2**-9 / STEP: uniform SR's |y| at spacing 2**-9
    ff = f
    if RHT:
        ff = f * 4.0 if SCALE == 0 else f * 0.25
    if F8:  # y' = y * 2**-9 / STEP (exact: a power of two) for _pack_f8
        ff = ff * (512.0 * STEP)
    fe = ff[:, :, None, None]
    if FOLD:
        y = x
    elif SCALE != 0:
        y = x * fe
    elif FAST_DIV:  # RN(1 / f): on GPUs _rcp_fast (a tile with f out of range takes the rare branch),
        # the IEEE division in the interpreter (FAST_DIV 1)
        r1 = _rcp_fast(ff) if FAST_DIV == 2 else tl.math.div_rn(1.0, ff)
        r = r1[:, :, None, None]
        if SR:  # x * (r less 4 ulps): |y| <= g_max, no clamp; within 5 ulps of x / s (module doc)
            rs = _bits_to_f32(r1.to(tl.int32, bitcast=True) - 4)
            if UNIFORM:  # as _round_to_grid takes it: |y| * 2**-9 / STEP + 2**-9 * (1 + 2**-17), one FMA
                y = tl.fma(tl.abs(x), (rs * SR_SCALE)[:, :, None, None], _SR_B)
            else:
                y = x * rs[:, :, None, None]
        elif X_BF16:  # x / s = RN(x * r + RN(x * z)), z = RN(RN(1 - s * r) * r) (module doc)
            y = _div_bf16(x, fe, r)
        else:  # only the level y rounds to is used: _div_level
            y = _div_level(x, fe, r)
    else:
        y = tl.math.div_rn(x, fe)
    if SAT:  # |y| < 8: not clamped here, _pack_codes takes the level index 8 of y in [7, 8) down
        yy = y  # to 7, eight at once
    else:
        yy = y if SCALE == 0 and (FAST_DIV or not SR) else tl.minimum(tl.abs(y), G)
    if SR and UNIFORM and (SCALE != 0 or not FAST_DIV):
        yy = tl.fma(yy, SR_SCALE, _SR_B)
    return fe, yy


@triton.jit
def _outside_tile(f, amax, t, top: tl.constexpr, SCALE: tl.constexpr, RG: tl.constexpr, SAT: tl.constexpr):
    """Whether a group of the tile lies outside the fast range (_quantize_kernel's f per group, e4m3's
    tensor scale t; top: _outside_fast_range's), a scalar for the whole tile."""
    if SCALE == 0:  # one test: the tile's largest bits(f) - bits(2**-98), unsigned (_outside_fast_range)
        return tl.max(f.to(tl.uint32, bitcast=True) - 0x0E800000) > top - 0x0E800000
    bad = _outside_fast_range(f, top)
    if RG != 0.0 and SCALE == 1:  # _block_scale's fast range (t broadcast: the interpreter needs it)
        bad = bad | ((amax < 1.5777218104420236e-30) & (amax > 0)) | _outside_fast_range(t + tl.zeros_like(amax))
    if SAT and SCALE == 1:  # |y| <= RN(amax * f) (rounding is monotone): under 8 unless amax_T < amax
        bad = bad | (amax * f >= 8.0)
    return tl.max(bad.to(tl.int32)) > 0


@triton.jit
def _rare_steps(x, f, deq, stored, yy, amax, finite, t, it, top: tl.constexpr, RHT: tl.constexpr, SCALE: tl.constexpr,
                SR: tl.constexpr, UNIFORM: tl.constexpr, STEP: tl.constexpr, G: tl.constexpr, E8_SHIFT: tl.constexpr,
                FAST_DIV: tl.constexpr, RG: tl.constexpr, F8: tl.constexpr):
    """_quantize_kernel's tiles outside the fast range: the reference's steps (module text) -> (f, deq,
    stored, yy). Only yy is replaced (a branch computing more from x costs a copy of the tile's
    arithmetic in a second layout), and signed where the fast yy is (else the compiler takes |yy|
    before the branch, where it cannot fold into the addition)."""
    SR_SCALE: tl.constexpr = 0.001953125 / STEP  # 2**-9 / STEP, as in _fast_y
    if SCALE == 0 and SR and FAST_DIV:
        bad = _outside_fast_range(f, top)  # the groups of the fast f out of range (below)
    if RG != 0.0:  # the fast s = amax / g may be off here
        f, deq, stored = _block_scale(amax, finite, t, it, SCALE, G, E8_SHIFT)
    if SCALE == 0 and SR and FAST_DIV:  # SR's y as above for every group (a group's draws must
        # not depend on the tile it shares), x and f of a group out of range scaled by 2**64 (tiny
        # f) or 2**-64 (huge f) first: exact, and RN(1/f) then neither overflows nor loses bits
        k = tl.where(bad, tl.where(f < 1.0, 1.8446744073709552e19, 5.421010862427522e-20), 1.0)
        fk = f * k * 4.0 if RHT else f * k
        rk = libdevice.rcp_rn(fk) if FAST_DIV == 2 else tl.math.div_rn(1.0, fk)
        rk = _bits_to_f32(rk.to(tl.int32, bitcast=True) - 4)
        xk = x * k[:, :, None, None]
        if UNIFORM:  # (the min only acts where s is subnormal, which no fast path has)
            yy = tl.fma(tl.abs(xk), (rk * SR_SCALE)[:, :, None, None], _SR_B)
            yy = tl.minimum(yy, G * SR_SCALE + _SR_B)
        else:
            yy = tl.minimum(tl.abs(xk * rk[:, :, None, None]), G)
    else:
        xr = x * 0.25 if RHT else x
        fr = f[:, :, None, None]
        yr = xr * fr if SCALE != 0 else tl.math.div_rn(xr, fr)
        yr = tl.minimum(tl.maximum(yr, -G), G) if SCALE == 0 and not SR else tl.minimum(tl.abs(yr), G)
        yy = tl.where(yr == yr, yr, 0.0)  # yr is NaN where 1/t overflowed (e4m3)
        if F8:  # (the same 2**-9 / STEP as uniform SR's)
            yy = yy * SR_SCALE
        if SR and UNIFORM:
            yy = tl.fma(yy, SR_SCALE, _SR_B)
    return f, deq, stored, yy


@triton.jit
def _codes_out(yy, u, xbits, finite, fe, stored, m, g, mask, codes_ptr, scales_ptr, K, mul16, UNIFORM: tl.constexpr,
               STEP: tl.constexpr, CB: tl.constexpr, SR: tl.constexpr, F8: tl.constexpr, WANT_CODES: tl.constexpr,
               WANT_DEQUANT: tl.constexpr, RHT: tl.constexpr, COLWISE: tl.constexpr, FOLD: tl.constexpr,
               SAT: tl.constexpr, QB: tl.constexpr, BLOCK_2D: tl.constexpr):
    """_quantize_kernel's yy rounded to the grid: with WANT_CODES the codes packed and stored with the
    scales `stored`; returns the level values q (WANT_DEQUANT; else yy)."""
    q = yy
    if F8:  # (codes only)
        words = _pack_f8(yy, xbits, finite, F8)
    else:
        # (E2M1 columns without RHT: two steps keep 80 registers a thread, where the add-and-max takes
        # 96, one program an SM fewer: 4% slower, H200)
        idx, q = _round_to_grid(yy, u, UNIFORM, STEP, CB, SR, not WANT_DEQUANT, RHT or not COLWISE,
                                fe if FOLD else None)
        if WANT_CODES:
            # _round_to_grid's constant off bits(v): E2M1's level lines, uniform SR's, uniform RTNE's c
            OFF: tl.constexpr = 0x4A800000 if not (UNIFORM or SR or WANT_DEQUANT) else \
                (0x46800001 if SR else CB) if UNIFORM else 0
            words = _pack_codes(idx, xbits, finite, mul16, OFF, SAT)  # [BM, NG] int64: a group's bytes
    if WANT_CODES:
        tl.store(codes_ptr + m[:, None] * (K // 16) + g[None, :], words, mask=mask)
        if BLOCK_2D:
            sp = scales_ptr + (m // 16)[:, None] * (K // 16) + g[None, :]
            smask = mask & (m % 16 == 0)[:, None]
        else:
            sp = scales_ptr + m[:, None] * (K // QB) + (g // (QB // 16))[None, :]
            smask = mask & (g % (QB // 16) == 0)[None, :]
        tl.store(sp, stored.to(scales_ptr.dtype.element_ty), mask=smask)
    return q


@triton.jit(do_not_specialize=["seed"])
def _quantize_kernel(x_ptr, out_ptr, codes_ptr, scales_ptr, signs_ptr, amax_ptr, tscale_ptr, seed_ptr,
                     M, K, seed, nib,
                     SEED_PTR: tl.constexpr, BM: tl.constexpr, NG: tl.constexpr, QB: tl.constexpr,
                     BLOCK_2D: tl.constexpr,
                     COLWISE: tl.constexpr, I64: tl.constexpr, RHT: tl.constexpr,
                     KEEP_ROTATED: tl.constexpr, SCALE: tl.constexpr, SR: tl.constexpr,
                     UNIFORM: tl.constexpr, STEP: tl.constexpr, CB: tl.constexpr, G: tl.constexpr,
                     E8_SHIFT: tl.constexpr, FAST_DIV: tl.constexpr,
                     WANT_CODES: tl.constexpr, WANT_DEQUANT: tl.constexpr, OUT_MODE: tl.constexpr,
                     X_BITS: tl.constexpr, ROUNDS: tl.constexpr, COLS: tl.constexpr, RG: tl.constexpr,
                     OUT_ROW: tl.constexpr, OUT_STRIDE: tl.constexpr, M_FIRST: tl.constexpr,
                     X_BF16: tl.constexpr, EVEN: tl.constexpr, F8: tl.constexpr = 0, LOOP: tl.constexpr = 1,
                     ASM: tl.constexpr = False):
    """Quantize the [BM, NG*16] tile of the [M, K] view; OUT_MODE 0 fp32, 1 bf16 native, 2 bf16 bits;
    SR's seed is `seed`, or with SEED_PTR the int32 at seed_ptr (drawn on the device). COLS: M when
    COLWISE (_tile_offsets), else 0. RG: RN(1 / g_max) for the fast fp32 and e4m3 block scales, else 0.
    OUT_STRIDE (0: out is laid out as x): the 2-D x's rows of OUT_ROW elements go to out's rows of
    OUT_STRIDE, a slice of a wider tensor (fake_quantize_joined). M_FIRST: the grid's first axis runs
    along m (programs launched one after another read the same rows of a column-wise x), else along g.
    X_BF16: x holds bf16 values, not rotated (fp32 scales then divide in one FMA). EVEN: the tiles cover
    the view exactly (_tile_offsets). LOOP: tiles a program, one after another along the grid's first
    axis, each loading the next one's data before its own arithmetic. ASM: inline PTX may be used (not
    in the interpreter)."""
    # codes of the whole E2M1 grid with e8m0 or e4m3 scales: |y| < 8 (e4m3: groups where it is not take
    # the reference's steps), clamped to the grid in _pack_codes; e8m0's y = x * f is exact: with RHT
    # the level lines take x and f (_round_to_grid), no y (without, that took 72 registers a thread
    # against 62 and 1.08x the time, H200)
    SAT: tl.constexpr = SCALE != 0 and G == 6.0 and not (UNIFORM or SR or WANT_DEQUANT)
    FOLD: tl.constexpr = SAT and SCALE == 2 and RHT
    # the fast range's top (_outside_fast_range): fp32 scales' f up to 2**100 for uniform SR (above, r * 2**-9
    # / STEP would be subnormal), 2**113 for F8 (above, 4f * 2**9 / STEP is out of _div_fast's range), 2**122
    # with RHT (4f), else 2**123
    top: tl.constexpr = 0x71800000 if SCALE == 0 and SR and UNIFORM else 0x78000000 if SCALE == 0 and F8 else \
        0x7C800000 if SCALE == 0 and RHT else 0x7D000000
    if COLWISE:
        M = COLS
    signs = _signs(signs_ptr) if RHT else None
    t = tl.full((), 1.0, tl.float32)  # e4m3's tensor scale (else 1) and its reciprocal: once a program
    it = t                            # along rows, per tile along columns (fewer registers there)
    if SCALE == 1 and not COLWISE:
        t, it = _tensor_scale(amax_ptr, G)
    # row codes: the nibbles by integer multiplies (_pack_codes; with RHT or SR 0.93-0.98x the time, H200),
    # and with e4m3 or e8m0 scales the bf16 words' low halves too (MXFP4 0.98-0.99x; with the fp32 scales'
    # divisions on the FMA pipe, E2M1 1.015x); columns (1.03-1.09x) and dequant outputs keep the shifts
    m16 = None
    mul16 = 16
    if not (COLWISE or WANT_DEQUANT):
        mul16 = nib
        if SCALE != 0:
            m16 = nib << 12
    # LOOP tiles a program, along the grid's first axis: each loop step first loads the next tile, so
    # that its load is under way while this tile is computed
    pid_a = tl.program_id(0) * LOOP
    pid_b = tl.program_id(1)
    xw = _tile_words(x_ptr, pid_a, pid_b, M, K, True, BM, NG, COLWISE, I64, EVEN, M_FIRST)
    # codes outputs unroll the loop, 4 tiles at most (no copies of the next tile's words; with (1, 32, 1) x
    # 4 tiles, codes with RHT along rows 0.92-0.95x the time, H200; x 8 and x 16 took 1.24x and 1.87x);
    # dequant outputs keep it (unrolled: up to 1.19x)
    for i in tl.range(LOOP, loop_unroll_factor=1 if WANT_DEQUANT else min(LOOP, 4)):
        pid_g = pid_b if M_FIRST else pid_a + i
        pid_m = pid_a + i if M_FIRST else pid_b
        m, g, mask, base = _tile_offsets(pid_m, pid_g, M, K, BM, NG, COLWISE, I64, EVEN)
        x = _load_tile(x_ptr, None, None, M, COLWISE, X_BITS, signs, xw, m16)  # [BM, NG, 8, 2] fp32
        if LOOP > 1:
            xw = _tile_words(x_ptr, pid_a + i + 1, pid_b, M, K, i + 1 < LOOP, BM, NG, COLWISE, I64, EVEN, M_FIRST)
        pm = None
        if RHT and (COLWISE or (QB == 32 and WANT_DEQUANT)):  # 4x the rotated tensor: its 0.25 is applied
            x = _rotate(x, signs)                              # to the block amax and to f (below)
        elif RHT:  # rows: the block amax from the pairs' maxima (codes 2-3% faster, H200; columns 1.00-1.01x)
            x, pm = _rotate(x, signs, 2)
        xbits = x.to(tl.int32, bitcast=True)
        a = _block_amax(x, BM, NG, QB, BLOCK_2D, pm)                      # [BM, NG]
        finite = a < float("inf")                                         # False for NaN
        amax = tl.where(finite, a, 0.0)
        if RHT:
            amax = amax * 0.25  # the max of the rotated |values| (rounding x * 0.25 is monotone)
        if SCALE == 1 and COLWISE:
            t, it = _tensor_scale(amax_ptr, G)
        f, deq, stored = _block_scale(amax, finite, t, it, SCALE, G, E8_SHIFT, RG, X_BF16)  # per group
        # the fast path's shortcuts hold while every f of the tile is in [2**-98, 2**123] (module text)
        if (RHT or SCALE != 2) and not FOLD:  # (e4m3's f may be NaN: outside too)
            rare = _outside_tile(f, amax, t, top, SCALE, RG, SAT)
        else:  # e8m0 without RHT: y = x * 2**-e is exact; FOLD: so is x * f / 4 and each line's product
            rare = False
        fe, yy = _fast_y(x, f, SCALE, RHT, F8, STEP, FOLD, FAST_DIV, SR, UNIFORM, X_BF16, SAT, G)
        if rare:  # the reference's steps instead (_rare_steps)
            f, deq, stored, yy = _rare_steps(x, f, deq, stored, yy, amax, finite, t, it, top, RHT, SCALE, SR, UNIFORM,
                                             STEP, G, E8_SHIFT, FAST_DIV, RG, F8)
        u = yy  # (unused without SR). Non-finite blocks: anything; their codes are masked below
        if SR:
            if SEED_PTR:
                seed = tl.load(seed_ptr)
            u = _uniforms(seed, m, g, K, BM, NG, ROUNDS, ASM)
        q = _codes_out(yy, u, xbits, finite, fe, stored, m, g, mask, codes_ptr, scales_ptr, K, mul16, UNIFORM, STEP,
                       CB, SR, F8, WANT_CODES, WANT_DEQUANT, RHT, COLWISE, FOLD, SAT, QB, BLOCK_2D)
        if pid_m == 0 and pid_g == 0:
            tl.store(tscale_ptr, t)
        if WANT_DEQUANT:
            qs = _bits_to_f32(q.to(tl.int32, bitcast=True) | (xbits & -2147483648))  # ±level (-0.0 kept)
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
    """_quantize_kernel's dequant branch from stored codes and scales, on NG groups of 16 of the N
    elements viewed as one row. Byte 4h + i of a group holds elements j = 2i, 2i + 1 (low, high
    nibble) of the tile [.., j, h].
    A code becomes its signed level with bit moves and an exact multiply: the sign to bit 31, the
    level index n to bits SH..SH+2, where those bits read as n * 2**-128 (SH = 21, uniform grids:
    then times step * 2**128 as MUL1 * MUL2) or as E2M1's level * 2**-126 (SH = 22: E2M1 is a float
    with two exponent bits; then times MUL1 = 2**126). The level of index >= NL (past the grid) is 0."""
    _, _, mask, base = _tile_offsets(0, tl.program_id(0), 1, N, 1, NG, False, I64)
    b = tl.load(codes_ptr + (base >> 1)[:, :, None] + tl.arange(0, 8)[None, None, :], mask=mask[:, :, None])
    b = tl.permute(tl.reshape(b.to(tl.int32), (1, NG, 2, 4)), (0, 1, 3, 2))  # [1, NG, i, h]
    # (int8 codes, sign-extended: the high nibble's sign bit is bit 31 after any left shift)
    keep = -2147483648 | (7 << SH)
    lo = (((b & 255) << SH) | (b << 28)) & keep
    hi = (b << (SH - 4)) & keep
    qb = tl.reshape(tl.permute(tl.join(lo, hi), (0, 1, 2, 4, 3)), (1, NG, 8, 2))  # element 2i + nibble + 8h
    if NL < 8:
        qb = tl.where(((qb >> SH) & 7) < NL, qb, qb & -2147483648)
    q = _bits_to_f32(qb) * MUL1                                           # ±level (-0.0 kept)
    if MUL2 != 1.0:
        q = q * MUL2
    s = tl.load(scales_ptr + (base >> (4 if QB == 16 else 5)), mask=mask)  # [1, NG]: the group's block scale
    if SCALE == 1:  # t * e4m3 (b: its bits, moved into fp32's and times 2**(127 - 7)); 0x7F, 0xFF NaN
        b = s.to(tl.int32)
        v = _bits_to_f32(((b & 0x80) << 24) | ((b & 0x7F) << 20)) * 1.329227995784916e36
        s = tl.where((b & 0x7F) == 0x7F, float("nan"), tl.load(tscale_ptr) * v)
    elif SCALE == 2:  # e8m0: 2**(b - 127), 255 NaN
        b = s.to(tl.int32)
        s = tl.where(b == 255, float("nan"), _pow2(b - 127))
    _store_dequant(out_ptr, q * s[:, :, None, None], signs_ptr, base, mask, 1, False, RHT, KEEP_ROTATED, OUT_MODE)


# ----------------------------------------------------------------------------- launchers
_FLOATS = (torch.bfloat16, torch.float32)
# (BM, NG, num_warps[, m_first[, tiles a program]]) per kind, from H200 sweeps (bench/kernels_bench.py);
# "_codes": no dequantized output; "_heavy": with RHT or SR, the kernels that need the most registers;
# "_e8m0": columns with e8m0 scales (any rounding, RHT or not); "_fp32_sr_rht": columns with fp32 scales, SR
# and RHT; "_e4m3_rht": columns with e4m3 scales, RTNE and RHT; "_sr": stochastic rounding (rows with a
# dequantized output); m_first (columns): the grid's first axis along m. Rows, measured side by side
# against programs of one tile (1, 64, 1|2), 8192^2 bf16, H200: (1, 32, 1) x 4 tiles a program takes
# 0.94-0.98x the time for RHT and SR dequant outputs, 0.90-0.99x for codes without RHT or SR; codes
# with RHT, their loop unrolled, 0.93-0.96x against (1, 64, 1) x 2 (x 4 and (1, 32, 1) x 8: 1.19-1.24x
# for E2M1). Columns: dequant outputs with RHT or SR take 0.92-0.98x at (64, 2, 2, m_first) x 4 against
# (128, 2, 4, m_first), but MXFP4's 1.03x (its e8m0 kind keeps the latter); codes outputs none faster but
# NVFP4's (0.95x at (32, 4, 2) x 4). Column codes with RHT at (64, 4, 2) against one warp (32, 4, 1): E2M1
# 0.977x, UFP4 0.983x, NVFP4 1.002x (at (64, 4, 4) 0.954x); SR 1.04x at (64, 4, 2), 1.00x at (32, 4, 1) against
# (64, 4, 4). With m_first (call 7): SR with RHT (fp32 scales, timed on the e1m2 grid) at (32, 4, 1, m_first)
# 0.968-0.981x against (64, 4, 4), NVFP4 (e4m3, RHT, RTNE) at (64, 4, 4, m_first) 0.931-0.935x against
# (64, 4, 2); the others slower (bench/results/h200_2026-12-02_x).
# MXFP4's column codes with RHT at (64, 4, 4, m_first), as without: 0.87x against (32, 4, 2, m_first)
_TILES = {"row": (1, 64, 2), "row_heavy": (1, 32, 1, False, 4), "row_sr": (1, 32, 1, False, 4),
          "row_codes": (1, 32, 1, False, 4),
          "col": (128, 2, 4, True), "col_heavy": (64, 2, 2, True, 4), "col_e8m0": (128, 2, 4, True),
          "col_codes": (64, 8, 4), "col_codes_heavy": (64, 4, 2), "col_codes_sr": (64, 4, 4),
          "col_codes_fp32_sr_rht": (32, 4, 1, True), "col_codes_e4m3_rht": (64, 4, 4, True),
          "col_codes_e8m0": (64, 4, 4, True), "2d": (16, 16, 4),
          "dequantize": (1, 128, 4)}
_TILES_INTERPRET = {"row": (1, 64, 1), "2d": (16, 8, 1), "col": (32, 4, 1, True), "row_codes": (1, 64, 1),
                    "col_codes": (32, 4, 1), "dequantize": (1, 64, 1)}
# the e4m3 tensor-amax pass: (BLOCK elements, num_warps) per loop step without RHT, tiles with RHT,
# and a persistent grid of this many programs per SM (3 programs in the interpreter, to run the loop)
_AMAX_TILES = {"flat": (8192, 8), "row": (1, 256, 4), "col": (64, 4, 4), "both": (64, 64, 4, True)}
_AMAX_TILES_INTERPRET = {"flat": (256, 1), "row": (1, 8, 1), "col": (16, 2, 1), "both": (32, 32, 1)}
_AMAX_PROGRAMS_PER_SM = 8


def _cdiv(a: int, b: int) -> int:  # on the host: triton.cdiv is a jit function, slow to call here
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _grid_params(levels) -> tuple:
    """(uniform, step) for the kernel's rounding; the grid must be one the bit tricks cover."""
    lv = tuple(float(v) for v in levels)
    if not 2 <= len(lv) <= 8 or lv[0] != 0.0 or any(b <= a for a, b in zip(lv, lv[1:])):
        raise ValueError(f"levels must be 2 to 8 increasing values starting at 0 (a 3-bit level index), "
                         f"got {lv}")
    step = lv[1]
    if all(v == i * step for i, v in enumerate(lv)) and math.frexp(step)[0] == 0.5:
        return True, step
    if lv == E2M1_LEVELS[:len(lv)]:
        return False, 0.5
    raise ValueError(f"the kernels round to uniform grids with a power-of-two step (e1m2, int4) or to a "
                     f"prefix of E2M1 {E2M1_LEVELS}; got levels {lv}. Use the PyTorch reference (quant.py).")


def _recip_f32(g: float) -> float:
    """RN(1 / g) in fp32. Rounding the double 1 / g again is exact here: g = k * 2**j with k <= 7 on
    every grid _grid_params takes, and 1 / k terminates or repeats a period of at most 4 bits, so the
    double is never a tie between two floats (that needs 28 zeros in a row)."""
    return struct.unpack("<f", struct.pack("<f", 1.0 / g))[0]


@functools.lru_cache(maxsize=None)
def _f32_bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", v))[0]


def _check_device(x: torch.Tensor) -> bool:
    """True when the Triton CPU interpreter runs the kernels (CPU tensors), False on CUDA."""
    if x.is_cuda:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1" and x.device.type == "cpu":
        return True
    raise RuntimeError(f"the quantize kernels need a CUDA tensor, got one on {x.device}; on a CPU set "
                       "TRITON_INTERPRET=1 before importing triton/kernels, or use quant.py's reference")


def _tile_kind(colwise: bool, block_2d: bool, codes_only: bool, scale: str = "fp32", sr: bool = False,
               rht: bool = False, interpret: bool = False) -> str:
    """The key of _TILES (_TILES_INTERPRET) whose tile a quantize kernel takes: the most specific of
    orientation + output (columns: + "_" + the scale mode, + "_sr" with SR, + "_rht" with RHT; then +
    the scale mode alone; + "_sr"; + "_heavy" with RHT or SR) that the table holds."""
    kind = "2d" if block_2d else ("col" if colwise else "row") + ("_codes" if codes_only else "")
    keys = [f"{kind}_{scale}" + "_sr" * sr + "_rht" * rht] * colwise + [f"{kind}_{scale}"] * colwise + \
        [kind + "_sr"] * sr + [kind + "_heavy"] * (rht or sr) + [kind]
    return next(k for k in keys if k in (_TILES_INTERPRET if interpret else _TILES))


def _tile(colwise: bool, interpret: bool, block: int, block_2d: bool, tile, codes_only: bool = False,
          scale: str = "fp32", sr: bool = False, rht: bool = False) -> tuple:
    """(BM rows of the [M, K] view, NG groups of 16 along K, num_warps, m_first, loop) for one program
    of `loop` tiles along the grid's first axis. Rowwise (not 2D) the view is one row of all groups (M = 1),
    so the warps' lanes run along memory."""
    if tile is None:
        kind = _tile_kind(colwise, block_2d, codes_only, scale, sr, rht, interpret)
        tile = (_TILES_INTERPRET if interpret else _TILES)[kind]
    bm, ng, nw, *rest = tile
    m_first, loop = (tuple(rest) + (False, 1)[len(rest):])[:2]
    bm = bm if colwise or block_2d else 1
    if bm & (bm - 1) or ng & (ng - 1) or (block == 32 and ng < 2) or (block_2d and bm < 16) or \
            (colwise and bm < 2) or m_first not in (False, True) or len(rest) > 2 or \
            not isinstance(loop, int) or loop < 1:
        raise ValueError(f"tile {tile}: BM and NG must be powers of two, NG >= 2 for 32-blocks, BM >= 16 "
                         "for 16x16 tiles, BM >= 2 columnwise; a 4th entry (m_first) is True or False, a 5th "
                         "(tiles a program) a positive int")
    return bm, ng, nw, bool(m_first) and colwise, loop


def _view_mk(numel: int, kq: int, colwise: bool, block_2d: bool) -> tuple:
    """(M, K): the [M, K] view the kernels quantize along K. Rowwise (not 2D) blocks never cross
    rows, so the tensor is one long row."""
    M = numel // kq if kq else 0
    return (M, kq) if colwise or block_2d else (1, M * kq)


def _col_words(colwise: bool, dtype, row: int, words: bool) -> bool:
    """Whether a kernel reads x columnwise as int32 words of two elements (m, m + 1): where its caller
    asks (words) and x is bf16 of an even row length."""
    return words and colwise and dtype == torch.bfloat16 and row % 2 == 0


def _tile_input(x: torch.Tensor, colwise: bool, interpret: bool, words: bool = False) -> torch.Tensor:
    """x (bf16 | fp32, contiguous) as _load_tile reads it: rowwise, as words of two elements (int32 |
    int64; a tensor that starts off a word boundary is copied first); columnwise, as int32 words of
    two where words is asked and _col_words allows it (copied first likewise), else as is, or bf16 as its int16 bits in
    the interpreter (X_BITS: then the kernel gets an int16 tensor)."""
    if _col_words(colwise, x.dtype, x.shape[-1], words):  # words of the elements m, m + 1
        return (x.clone() if x.data_ptr() % 4 else x).view(torch.int32)
    if colwise:
        return x.view(torch.int16) if interpret and x.dtype == torch.bfloat16 else x
    if x.data_ptr() % (2 * x.element_size()):
        x = x.clone()
    return x.view(torch.int32 if x.dtype == torch.bfloat16 else torch.int64)


@functools.lru_cache(maxsize=None)
def _f8_cast(arch: int = 0) -> bool:
    """Whether the GPU (compute capability `arch`, 0: the current device's) has the fp32 -> e4m3 cast
    (PTX cvt ... e4m3x2.f32: sm_89 and later)."""
    if arch == 0:
        major, minor = torch.cuda.get_device_capability()
        arch = 10 * major + minor
    return arch >= 89


@functools.lru_cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _amax_options(nw: int, interpret: bool) -> tuple:
    """Launch options of the RHT tensor-amax passes, persistent grids of _AMAX_PROGRAMS_PER_SM programs of
    nw warps an SM: all of them must be resident (64K registers an SM), so registers are capped to fit
    (else the last program of each SM runs as a second wave: tensor_amax_both took 67 registers a thread,
    7 programs fit, 0.0624 ms against 0.0515 capped at 64, 8192^2 bf16, H200)."""
    cap = 65536 // (_AMAX_PROGRAMS_PER_SM * nw * 32) // 8 * 8
    return (("num_warps", nw), ("enable_fp_fusion", False)) + ((("maxnreg", cap),) if cap < 255 and not interpret
                                                                else ())


def _amax(x, signs, M, K, colwise, interpret, tile=None, programs=None) -> torch.Tensor:
    """Launch the tensor-amax pass over x (non-empty) with RHT signs or None; returns the int32 [1]
    buffer holding the fp32 bits of the amax."""
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    programs = programs or (3 if interpret else _AMAX_PROGRAMS_PER_SM * _num_sms(x.device.index or 0))
    tiles = _AMAX_TILES_INTERPRET if interpret else _AMAX_TILES
    i64, bf16 = x.numel() >= 2**31, x.dtype == torch.bfloat16
    if signs is None:  # no RHT: the max of |x|'s bits, read flat in any order
        block, nw = tile or tiles["flat"]
        if block & (block - 1):
            raise ValueError(f"amax tile {tile}: BLOCK must be a power of two")
        grid = (min(_cdiv(x.numel(), block), programs),)
        args = (x.view(torch.int16 if bf16 else torch.int32), amax, x.numel(), block,
                0x7FFF if bf16 else 0x7FFFFFFF, 0x7F80 if bf16 else 0x7F800000, 16 if bf16 else 0, i64)
        _launch(_amax_kernel, grid, interpret, (("num_warps", nw),),
                (_amax_kernel, grid, nw, args[2:], x.dtype, x.data_ptr() % 16), args)
    else:
        bm, ng, nw, _, loop = _tile(colwise, interpret, 16, False, tile or tiles["col" if colwise else "row"])
        if loop != 1:
            raise ValueError(f"amax tile {tile}: the tensor-amax pass is a persistent grid; give no tiles a program")
        grid = (min(_cdiv(K // 16, ng) * _cdiv(M, bm), programs),)
        xk = _tile_input(x, colwise, interpret, words=True)
        args = (xk, signs, amax, M, K, bm, ng, colwise, i64, xk.dtype == torch.int16, M if colwise else 0)
        _launch(_amax_rht_kernel, grid, interpret, _amax_options(nw, interpret),
                (_amax_rht_kernel, grid, nw, args[3:], xk.dtype, xk.data_ptr() % 16, signs.data_ptr() % 16), args)
    return amax


def _check_signs(rht_signs: Optional[torch.Tensor], dev: torch.device):
    """16 values on dev; ±1 as well where reading them costs no device sync (the kernels apply them
    as sign bits, _load_tile)."""
    if rht_signs is not None and (rht_signs.numel() != 16 or rht_signs.device != dev):
        raise ValueError(f"rht_signs must hold 16 values on {dev}; got shape {tuple(rht_signs.shape)} "
                         f"on {rht_signs.device}")
    if rht_signs is not None and dev.type == "cpu" and not bool((rht_signs.abs() == 1).all()):
        raise ValueError(f"rht_signs must be ±1 (rht.random_signs gives them); got {rht_signs.tolist()}")


def tensor_amax(x: torch.Tensor, *, rht_signs: Optional[torch.Tensor] = None, dim: int = -1,
                tile: Optional[tuple] = None, programs: Optional[int] = None) -> torch.Tensor:
    """max |x| over the finite elements of x, after the RHT along dim if rht_signs are given, as a 0-d
    fp32 tensor: quantize()'s first pass for e4m3 scales, alone (x as quantize takes it). tile:
    (BLOCK, num_warps) without RHT, (BM, NG, num_warps) with; programs: the persistent grid's size."""
    interpret = _check_device(x)
    if not x.is_contiguous():
        raise ValueError(f"tensor_amax reads a contiguous tensor; got strides {x.stride()}: call .contiguous()")
    colwise, kq = _check(tuple(x.shape), x.dtype, E2M1_LEVELS, 16, "e4m3", rht_signs is not None, False, dim,
                         torch.float32, True, False)
    _check_signs(rht_signs, x.device)
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    signs = None if rht_signs is None else rht_signs.to(torch.float32).contiguous()
    M, K = _view_mk(x.numel(), kq, colwise, False)
    return _amax(x, signs, M, K, colwise, interpret, tile, programs).view(torch.float32).reshape(())


def tensor_amax_both(x: torch.Tensor, *, rht_signs: torch.Tensor, row_rht: bool = True,
                     tile: Optional[tuple] = None, programs: Optional[int] = None) -> torch.Tensor:
    """The tensor amax of a 2-D [R, C] tensor along its rows (dim -1, rotated if row_rht) and along its
    columns (dim 0, rotated), from one read: fp32 [2], the values tensor_amax gives for each (the
    e4m3 first pass of an operand quantized both ways; quantize takes either as tensor_amax).
    tile: (TR rows, TC columns, num_warps[, sync]), TR and TC 16 times powers of two (sync: _both_amax's
    SYNC); programs: the persistent grid."""
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
    programs = programs or (3 if interpret else _AMAX_PROGRAMS_PER_SM * _num_sms(x.device.index or 0))
    R, C = x.shape
    grid = (min(_cdiv(R, tr) * _cdiv(C, tc), programs),)
    xw, xc = _tile_input(x, False, interpret), _tile_input(x, True, interpret)
    args = (xw, xc, rht_signs.to(torch.float32).contiguous(), amax, R, tr, tc, x.numel() >= 2**31,
            xc.dtype == torch.int16, row_rht, C, bool(sync and sync[0]))
    _launch(_amax_both_kernel, grid, interpret, _amax_options(nw, interpret),
            (_amax_both_kernel, grid, nw, args[4:], x.dtype) + tuple(t.data_ptr() % 16 for t in args[:3]), args)
    return amax.view(torch.float32)


def _check(shape, dtype, levels, block, scale_mode, rht, block_2d, dim, out_dtype, want_codes, want_dequant):
    """Validate quantize()'s arguments (all but the tensors' contiguity and devices); returns
    (colwise, K = size of the quantized dim)."""
    if dtype not in _FLOATS:
        raise ValueError(f"quantize needs a bf16 or fp32 tensor, got {dtype}")
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown scale_mode {scale_mode!r}; valid: {', '.join(SCALE_MODES)}")
    if block not in (16, 32):
        raise ValueError(f"block must be 16 or 32, got {block}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if not (want_codes or want_dequant):
        raise ValueError("nothing to compute: set want_codes and/or want_dequant")
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
    if block_2d and (block != 16 or rht):
        raise ValueError("block_2d (16x16 weight tiles) needs block=16 and no RHT")
    return d != nd - 1, K


def quantize(x: torch.Tensor, *, levels: tuple, block: int = 16, scale_mode: str = "fp32",
             sr: bool = False, rht_signs: Optional[torch.Tensor] = None, block_2d: bool = False,
             dim: int = -1, seed=0, out_dtype: Optional[torch.dtype] = None,
             keep_rotated: bool = False, want_codes: bool = True, want_dequant: bool = True,
             tile: Optional[tuple] = None, fast_div: bool = True, tensor_amax: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None):
    """Quantize x along dim with one fused kernel (plus a tensor-amax pass for e4m3 scales).

    levels: the grid's non-negative levels (quant.QuantSpec.levels, its last one is g_max);
    block: 16 | 32; scale_mode: 'fp32' | 'e4m3' | 'e8m0'; sr: stochastic rounding seeded by `seed`
    (an int, or an int32 tensor of one element on x's device, read by the kernel);
    rht_signs: the 16 RHT signs (±1 on x's device; other values are not supported) or None for no RHT;
    block_2d: 16x16 tiles;
    dim: -1 (any shape, rows) or 0 (a 2-D tensor, columns); out_dtype: bf16 | fp32 (default x.dtype);
    keep_rotated: with RHT, leave the dequantized tensor in the rotated basis; tile: (BM, NG,
    num_warps[, m_first[, tiles a program]]) to override the launch shape; fast_div: divide (y, and the
    fp32 and e4m3 block scales) by FMA-corrected reciprocal multiplication (_div_fast, same bits; y by
    _div_level, same levels) instead of IEEE division (GPUs; the interpreter where INTERPRET_FAST_DIV
    says its FMA is fused); tensor_amax (e4m3): x's tensor amax
    along dim, as tensor_amax or tensor_amax_both computed it (fp32, one element on x's device): the
    first pass is then skipped; out: where to write the dequantized tensor (x's shape and out_dtype; for a
    2-D x also a slice of a wider tensor, out[:, a:b], with strides (S, 1)).
    Returns (codes, scales, tensor_scale, dequant): codes uint8 [..., K/2] and scales [..., K/block]
    (block_2d: [M/16, K/16]) laid out with the quantized dim last, as quant.quantize stores them
    (fp32 | float8_e4m3fn | uint8 e8m0 biased exponent), or None without want_codes; tensor_scale a
    0-d fp32 tensor (1 unless e4m3);
    dequant x's shape and layout in out_dtype, or None.
    """
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
        scales = torch.empty(p.scales_shape, dtype=torch.float32 if scale_mode == "fp32" else torch.uint8,
                             device=dev)
    if want_dequant and out is None:
        out = torch.empty(x.shape, dtype=p.out_dtype, device=dev)
    if x.numel() == 0:
        tscale.fill_(1.0)
        e4m3 = scales is not None and scale_mode == "e4m3"
        return codes, scales.view(torch.float8_e4m3fn) if e4m3 else scales, tscale, out
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
    xk = _tile_input(x, p.colwise, interpret, p.words)
    args = (xk, (out.view(torch.int16) if p.out_mode == 2 else out) if want_dequant else tscale,
            codes.view(torch.int64) if want_codes else tscale, scales if want_codes else tscale, signs, amax, tscale,
            tscale if seed_t is None else seed_t, p.M, p.K, 0 if seed_t is not None else seed, 16,
            seed_t is not None) + p.constexprs
    aligned = (xk.dtype, xk.data_ptr() % 16, signs.data_ptr() % 16, 0 if seed_t is None else seed_t.data_ptr() % 16,
               out.data_ptr() % 16 if want_dequant else 0)
    wide = seed_t is None and not -2**31 <= seed < 2**31  # an int64 seed argument: another compile
    _launch(_quantize_kernel, p.grid, interpret, p.options, (p, aligned, seed_t is not None, wide), args)
    if want_codes and scale_mode == "e4m3":
        scales = scales.view(torch.float8_e4m3fn)
    return codes, scales, tscale, out


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


class _Plan(NamedTuple):
    """What quantize() derives from its arguments' static properties (cached per combination)."""
    colwise: bool
    M: int
    K: int
    grid: tuple
    codes_shape: tuple
    scales_shape: tuple
    out_dtype: torch.dtype
    out_mode: int
    words: bool  # columns read as words (_tile_input)
    constexprs: tuple
    options: tuple


@functools.lru_cache(maxsize=4096)
def _plan(shape, dtype, interpret, levels, block, scale_mode, sr, rht, block_2d, dim, out_dtype, keep_rotated,
          want_codes, want_dequant, tile, fast_div, out_stride=0, arch=0) -> _Plan:
    """Validate quantize()'s arguments once per combination (bad ones raise, and are not cached) and
    lay out its launch: sizes, grid, output shapes and the kernel's constexpr arguments."""
    colwise, kq = _check(shape, dtype, levels, block, scale_mode, rht, block_2d, dim, out_dtype, want_codes,
                         want_dequant)
    uniform, step = _grid_params(levels)
    g_max = float(levels[-1])
    f8 = uniform and not sr and scale_mode == "fp32" and want_codes and not want_dequant  # (_pack_f8)
    bm, ng, nw, m_first, loop = _tile(colwise, interpret, block, block_2d, tile, not want_dequant, scale_mode,
                                      sr, rht)
    numel = math.prod(shape)
    M, K = _view_mk(numel, kq, colwise, block_2d)
    m_first = m_first and _cdiv(K // 16, ng) < 65536  # (the grid's second axis takes 65535 programs at most)
    lead = (shape[1],) if colwise else tuple(shape[:-1])
    grid = (_cdiv(M, bm), _cdiv(K // 16, ng)) if m_first else (_cdiv(K // 16, ng), _cdiv(M, bm))
    out_mode = 0 if out_dtype == torch.float32 else (2 if interpret else 1)
    # columns with RHT as words (timed on the H200, 8192^2: codes outputs 4-9% faster, SR's dequant output
    # 4%, the dequant outputs rounded to nearest 0.7-1.7% at the _TILES tiles); kernels without RHT read
    # bf16 values (words took more registers)
    words = _col_words(colwise, dtype, M, rht)
    x_bits = interpret and dtype == torch.bfloat16 and colwise and not words
    fast = fast_div and (INTERPRET_FAST_DIV or not interpret) and step >= 0.5
    i64 = max(numel, (numel // shape[-1] if shape[-1] else 0) * out_stride) >= 2**31  # out's offsets too
    constexprs = (bm, ng, block, block_2d, colwise, i64, rht, keep_rotated, SCALE_MODES[scale_mode], sr,
                  uniform, step, _f32_bits(step * 2.0**23), g_max, math.floor(math.log2(g_max)),
                  (1 if interpret else 2) if fast else 0, want_codes, want_dequant, out_mode, x_bits,
                  PHILOX_ROUNDS, M if colwise else 0, _recip_f32(g_max) if fast and scale_mode != "e8m0" else 0.0,
                  shape[-1], out_stride, m_first, dtype == torch.bfloat16 and not rht,
                  (K // 16) % ng == 0 and M % bm == 0 and grid[0] % loop == 0,
                  # codes of a uniform grid rounded to nearest with fp32 scales: by e4m3 casts (_pack_f8)
                  (1 if interpret or not _f8_cast(arch) else 2) if f8 else 0, loop, not interpret)
    return _Plan(colwise, M, K, (_cdiv(grid[0], loop), grid[1]), lead + (kq // 2,),
                 (M // 16, K // 16) if block_2d else lead + (kq // block,), out_dtype, out_mode, words,
                 constexprs, (("num_warps", nw), ("enable_fp_fusion", False)))


def compile_quantize(shape, dtype, *, levels: tuple, block: int = 16, scale_mode: str = "fp32", sr: bool = False,
                     rht: bool = False, block_2d: bool = False, dim: int = -1, want_codes: bool = True,
                     tile: Optional[tuple] = None, arch: int = 90):
    """The quantize kernel that quantize() would launch for a bf16 | fp32 tensor of this shape (bf16
    dequantized output unless want_codes), compiled for CUDA compute capability `arch` with no GPU
    present (Triton's compiler and the ptxas it ships; run it where TRITON_INTERPRET is unset). The
    result's .asm["cubin"] holds the machine code."""
    p = _plan(tuple(shape), dtype, False, tuple(levels), block, scale_mode, sr, rht, block_2d, dim, torch.bfloat16,
              True, want_codes, not want_codes, tile, True, 0, arch)
    words = {torch.bfloat16: "*i32", torch.float32: "*i64"}[dtype]  # rows are read as words (_tile_input)
    col = "*i32" if p.words else "*bf16" if dtype == torch.bfloat16 else "*fp32"
    types = [col if p.colwise else words,
             "*fp32" if want_codes else "*bf16", "*i64" if want_codes else "*fp32",
             ("*fp32" if scale_mode == "fp32" else "*u8") if want_codes else "*fp32", "*fp32",
             "*i32" if scale_mode == "e4m3" else "*fp32", "*fp32", "*fp32", "i32", "i32", "i32", "i32"]
    names = _quantize_kernel.arg_names
    constexprs = dict(zip(names[len(types):], (False,) + p.constexprs))
    signature = dict(zip(names, types), **{k: "constexpr" for k in constexprs})
    hints = {(i,): [["tt.divisibility", 16]] for i in range(10)}  # 16-byte pointers, M and K
    src = triton.compiler.ASTSource(_quantize_kernel, signature, constexprs, hints)
    return triton.compile(src, target=triton.backends.compiler.GPUTarget("cuda", arch, 32), options=dict(p.options))


# Launch cost. kernel[grid](...) binds and specializes every argument on every call: tens of host
# microseconds, which a small model's step (hundreds of quantize calls) pays in full. After the first
# launch of a configuration, _launch keeps the compiled kernel and calls it directly. Its key holds
# everything Triton compiles on: the plan (launch options, constexprs, sizes: M and K are
# specialized on their divisibility, and the plan fixes them; the plan fixes every pointer's dtype
# but x's, which the key adds), each pointer's 16-byte alignment and whether the seed comes from a
# pointer (the seed's value is not specialized: do_not_specialize).
# NANOFP4_FAST_LAUNCH=0 launches through kernel[grid] every time (same kernels, same results).
FAST_LAUNCH = os.environ.get("NANOFP4_FAST_LAUNCH", "1") != "0"
_COMPILED = {}


def _launch(kernel, grid, interpret: bool, options: tuple, key, args: tuple):
    """kernel[grid](*args, **options), through the kept compiled kernel of `key` when there is one."""
    if interpret or not FAST_LAUNCH:
        kernel[grid](*args, **dict(options))
        return
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = kernel[grid](*args, **dict(options))
    else:
        compiled[grid + (1,) * (3 - len(grid))](*args)  # a compiled kernel takes a 3-D grid


def fake_quantize(x: torch.Tensor, **kwargs) -> torch.Tensor:
    """Only the dequantized tensor of quantize(x, **kwargs) (the emulated-GEMM operand)."""
    return quantize(x, want_codes=False, want_dequant=True, **kwargs)[3]


def fake_quantize_joined(xs, *, join: int = 1, seeds=None, tensor_amaxes=None, out_dtype=None,
                         **kwargs) -> torch.Tensor:
    """The 2-D parts xs joined along dim `join` (weights [N_i, K] along 0, output gradients [M, N_i]
    along 1), each fake-quantized on its own as fake_quantize(xs[i], **kwargs) with seed seeds[i] and
    tensor_amax tensor_amaxes[i] (or None) does, and written straight into its place in the joined
    tensor: one operand for one GEMM, each part keeping its own e4m3 tensor scale and SR draws."""
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


_SCALE_DTYPES = {"fp32": torch.float32, "e4m3": torch.float8_e4m3fn, "e8m0": torch.uint8}  # as stored


def dequantize(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor, *, levels: tuple,
               block: int = 16, scale_mode: str = "fp32", rht_signs: Optional[torch.Tensor] = None,
               keep_rotated: bool = False, out_dtype: torch.dtype = torch.bfloat16,
               tile: Optional[tuple] = None, block_2d: bool = False) -> torch.Tensor:
    """quant.QTensor.dequantize bit for bit, of quantize()'s codes uint8 [..., K/2], scales [..., K/block]
    (fp32 | float8_e4m3fn | uint8 e8m0) and 0-d fp32 tensor_scale (e4m3: block scale = tensor_scale *
    scale): [..., K] in out_dtype with the quantized dim last (the caller moves it). With rht_signs it
    is rotated back unless keep_rotated; tile: (BM, NG, num_warps) as quantize's (BM is 1: rows)."""
    interpret, dev = _check_device(codes), codes.device
    if not (codes.is_contiguous() and scales.is_contiguous()):
        raise ValueError("dequantize reads contiguous codes and scales: call .contiguous() on them first")
    p = _dequant_plan(tuple(codes.shape), codes.dtype, tuple(scales.shape), scales.dtype, interpret, tuple(levels),
                      block, block_2d, scale_mode, rht_signs is not None, keep_rotated, out_dtype,
                      None if tile is None else tuple(tile))
    if tensor_scale.numel() != 1 or tensor_scale.dtype != torch.float32:
        raise ValueError(f"tensor_scale must be one fp32 value, got {tensor_scale.dtype} {tuple(tensor_scale.shape)}")
    signs = tensor_scale if rht_signs is None else rht_signs
    if signs.numel() != 16 and rht_signs is not None or any(t.device != dev for t in (scales, tensor_scale, signs)):
        raise ValueError(f"scales, tensor_scale and rht_signs (16 values) must be on the codes' device {dev}")
    out_shape, grid, constexprs, options = p
    out = torch.empty(out_shape, dtype=out_dtype, device=dev)
    if out.numel() == 0:
        return out
    signs = signs.to(torch.float32).contiguous()
    args = (codes.view(torch.int8), scales.view(torch.uint8) if scale_mode == "e4m3" else scales, tensor_scale, signs,
            out.view(torch.int16) if constexprs[-1] == 2 else out, out.numel()) + constexprs
    aligned = tuple(t.data_ptr() % 16 for t in (codes, scales, tensor_scale, signs))  # Triton specializes on these
    _launch(_dequantize_kernel, grid, interpret, options, (_dequantize_kernel, p, aligned), args)
    return out


@functools.lru_cache(maxsize=1024)
def _dequant_plan(shape, dtype, scales_shape, scales_dtype, interpret, levels, block, block_2d, scale_mode, rht,
                  keep_rotated, out_dtype, tile) -> tuple:
    """Validate dequantize()'s arguments once per combination: (out shape, grid, constexprs, options)."""
    if block_2d:
        raise ValueError("dequantize does not take block_2d (16x16 tile) scales: use quant.QTensor.dequantize")
    if scale_mode not in _SCALE_DTYPES or block not in (16, 32) or out_dtype not in _FLOATS:
        raise ValueError(f"dequantize takes scale_mode in {tuple(_SCALE_DTYPES)}, block 16 or 32 and out_dtype "
                         f"bf16 or fp32; got {scale_mode!r}, {block}, {out_dtype}")
    if dtype != torch.uint8 or scales_dtype != _SCALE_DTYPES[scale_mode]:
        raise ValueError(f"scale_mode {scale_mode!r} needs uint8 codes and {_SCALE_DTYPES[scale_mode]} scales; "
                         f"got {dtype} and {scales_dtype}")
    K = 2 * shape[-1] if shape else 0
    if not shape or K % block or scales_shape != shape[:-1] + (K // block,):
        raise ValueError(f"codes [..., K/2] with K a multiple of block={block} need scales [..., K/{block}]: for "
                         f"codes {shape}, scales {shape[:-1] + (K // block,)}; got scales {scales_shape}")
    uniform, step = _grid_params(levels)
    tile = tile or (_TILES_INTERPRET if interpret else _TILES)["dequantize"]
    _, ng, nw, _, loop = _tile(False, interpret, block, False, tile)
    if loop != 1:
        raise ValueError(f"dequantize tile {tile}: a program dequantizes one tile; give no tiles a program")
    N = math.prod(shape) * 2
    mul = step * 2.0**128 if uniform else 2.0**126  # see _dequantize_kernel
    constexprs = (ng, block, N >= 2**31, rht, keep_rotated, SCALE_MODES[scale_mode], 21 if uniform else 22,
                  min(mul, 2.0**127), mul / min(mul, 2.0**127), len(levels),
                  0 if out_dtype == torch.float32 else (2 if interpret else 1))
    return shape[:-1] + (K,), (_cdiv(N // 16, ng),), constexprs, (("num_warps", nw), ("enable_fp_fusion", False))


# The emulated-GEMM operand as a PyTorch operator, nanofp4::fake_quantize: torch.compile sees one
# opaque node (no graph break). Stochastic rounding's Philox seed is an int32 tensor drawn on the
# device in compiled graphs (quant.py passes it), else one from torch's CPU generator when the op
# runs: either way runs are reproducible from torch.manual_seed. It is defined with
# torch.library.Library, not the @custom_op decorator: a compiled graph calls it hundreds of times a
# step, and the decorator's Python dispatch costs ~10 us more per call (bench/launch_bench.py).
# The operators take any strides (their bodies call .contiguous()): tagged flexible_layout, Inductor
# hands every quantization of an operand one buffer; with its default (exact strides) an operand made
# by a fused kernel (a norm's output, a cast gradient) was written once per quantization reading it.
_LIB = torch.library.Library("nanofp4", "DEF")
_FLEX = (torch.Tag.flexible_layout,)
_LIB.define("fake_quantize(Tensor x, float[] levels, int block, str scale_mode, bool sr, Tensor? signs, "
            "bool block_2d, int dim, int seed, bool keep_rotated, Tensor? seed_t=None, Tensor? amax=None) -> Tensor",
            tags=_FLEX)
# an operand kept packed (quantize's codes, scales and tensor scale) and its dequantization:
_LIB.define("quantize_codes(Tensor x, float[] levels, int block, str scale_mode, Tensor? signs, int dim, "
            "Tensor? amax=None) -> (Tensor, Tensor, Tensor)", tags=_FLEX)
# 2-D parts fake-quantized each on its own into one tensor joined along dim `join` (fake_quantize_joined);
# seed_t: one int32 seed per part (SR), amaxes: one e4m3 tensor amax per part, or none
_LIB.define("fake_quantize_joined(Tensor[] xs, float[] levels, int block, str scale_mode, bool sr, Tensor? signs, "
            "bool block_2d, int dim, int join, bool keep_rotated, Tensor? seed_t, Tensor[] amaxes) -> Tensor",
            tags=_FLEX)
# the e4m3 tensor amax of a 2-D tensor along its rows and its columns, from one read (tensor_amax_both)
_LIB.define("tensor_amax_both(Tensor x, Tensor signs, bool row_rht) -> Tensor", tags=_FLEX)
_LIB.define("dequantize(Tensor codes, Tensor scales, Tensor tensor_scale, float[] levels, int block, "
            "str scale_mode, Tensor? signs, bool keep_rotated, ScalarType out_dtype) -> Tensor", tags=_FLEX)


def fake_quantize_op(x: torch.Tensor, levels: list, block: int, scale_mode: str, sr: bool,
                     signs: Optional[torch.Tensor], block_2d: bool, dim: int, seed: int,
                     keep_rotated: bool, seed_t: Optional[torch.Tensor] = None,
                     amax: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The op's body: fake_quantize with the op's positional arguments. SR's seed: seed_t (an int32
    on x's device) if given, else `seed`, else (seed < 0) one drawn from torch's CPU generator."""
    if seed_t is not None:
        seed = seed_t
    elif sr and seed < 0:
        seed = int(torch.randint(2**31 - 1, ()))
    return fake_quantize(x.contiguous(), levels=tuple(levels), block=block, scale_mode=scale_mode, sr=sr,
                         rht_signs=signs, block_2d=block_2d, dim=dim, seed=seed,
                         keep_rotated=keep_rotated, tensor_amax=amax)


def fake_quantize_joined_op(xs, levels, block, scale_mode, sr, signs, block_2d, dim, join, keep_rotated, seed_t,
                            amaxes):
    """The op's body; SR's seeds as fake_quantize_op's, seed_t holding one per part."""
    if seed_t is not None:
        seeds = [seed_t[i:i + 1] for i in range(len(xs))]
    else:
        seeds = [int(torch.randint(2**31 - 1, ())) if sr else 0 for _ in xs]
    return fake_quantize_joined([x.contiguous() for x in xs], join=join, seeds=seeds, tensor_amaxes=amaxes or None,
                                levels=tuple(levels), block=block, scale_mode=scale_mode, sr=sr, rht_signs=signs,
                                block_2d=block_2d, dim=dim, keep_rotated=keep_rotated)


def quantize_codes_op(x, levels, block, scale_mode, signs, dim, amax=None):
    return quantize(x.contiguous(), levels=tuple(levels), block=block, scale_mode=scale_mode, rht_signs=signs,
                    dim=dim, want_dequant=False, tensor_amax=amax)[:3]


def tensor_amax_both_op(x, signs, row_rht):
    return tensor_amax_both(x.contiguous(), rht_signs=signs, row_rht=row_rht)


def dequantize_op(codes, scales, tensor_scale, levels, block, scale_mode, signs, keep_rotated, out_dtype):
    return dequantize(codes.contiguous(), scales.contiguous(), tensor_scale, levels=tuple(levels), block=block,
                      scale_mode=scale_mode, rht_signs=signs, keep_rotated=keep_rotated, out_dtype=out_dtype)


for _key in ("CUDA", "CPU"):  # CPU: the interpreter (kernels check TRITON_INTERPRET themselves)
    _LIB.impl("fake_quantize", fake_quantize_op, _key)
    _LIB.impl("fake_quantize_joined", fake_quantize_joined_op, _key)
    _LIB.impl("quantize_codes", quantize_codes_op, _key)
    _LIB.impl("dequantize", dequantize_op, _key)
    _LIB.impl("tensor_amax_both", tensor_amax_both_op, _key)


@torch.library.register_fake("nanofp4::fake_quantize")
def _(x, levels, block, scale_mode, sr, signs, block_2d, dim, seed, keep_rotated, seed_t=None, amax=None):
    return x.new_empty(x.shape)


@torch.library.register_fake("nanofp4::fake_quantize_joined")
def _(xs, levels, block, scale_mode, sr, signs, block_2d, dim, join, keep_rotated, seed_t, amaxes):
    shape = list(xs[0].shape)
    shape[join] = sum(x.shape[join] for x in xs)
    return xs[0].new_empty(shape)


@torch.library.register_fake("nanofp4::tensor_amax_both")
def _(x, signs, row_rht):
    return x.new_empty((2,), dtype=torch.float32)


@torch.library.register_fake("nanofp4::quantize_codes")
def _(x, levels, block, scale_mode, signs, dim, amax=None):
    colwise, k = _check(tuple(x.shape), x.dtype, tuple(levels), block, scale_mode, signs is not None, False,
                        dim, torch.float32, True, False)
    lead = (x.shape[1],) if colwise else tuple(x.shape[:-1])
    return (x.new_empty(lead + (k // 2,), dtype=torch.uint8),
            x.new_empty(lead + (k // block,), dtype=_SCALE_DTYPES[scale_mode]), x.new_empty((), dtype=torch.float32))


@torch.library.register_fake("nanofp4::dequantize")
def _(codes, scales, tensor_scale, levels, block, scale_mode, signs, keep_rotated, out_dtype):
    return codes.new_empty(tuple(codes.shape[:-1]) + (2 * codes.shape[-1],), dtype=out_dtype)
