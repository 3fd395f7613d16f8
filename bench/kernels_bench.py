"""Check and benchmark the Triton quantize kernels (kernels.py) on one GPU, in one run.

1. Bit identity with the PyTorch reference (quant.py) for every deterministic spec — grid x scale
   mode x block (16, 32, 16x16 tiles) x RHT x orientation (rows, columns) — on a large random bf16
   tensor against the reference run on the GPU, and on a smaller one against the reference run on
   the CPU (the spec itself). The reference on the two devices is also compared with itself.
2. The fast exact division (RN(x/s) from RN(1/s) and two FMAs) against IEEE division, directly.
3. Bandwidth: each kernel's median time (bench(): the L2 flushed by a read before each call; the table
   also gives triton.testing.do_bench's, whose flush zeroes a buffer), the bytes it must move (read the
   input once, write its outputs once; e4m3 scales read it twice, as their tensor amax is a first
   pass over x), GB/s and % of the device-to-device copy bandwidth measured in the same run — for
   quantize alone, fused RHT+quantize and separate RHT (a bf16 GEMM with the 16 x 16 H', its
   rotated tensor written in bf16) then quantize, rows and columns, the emulated-GEMM output (bf16
   dequant, rotated basis) and the codes+scales output. A small sweep of tile shapes picks the tiles
   the table uses.
4. The e4m3 tensor-amax pass alone (kernels.tensor_amax; no RHT, RHT along rows, RHT along columns;
   and kernels.tensor_amax_both, rows and columns from one read, against the two passes), a pure
   read: its bytes are the input's, given as % of the read bandwidth (torch's amax over the same
   1 GiB buffer the copy uses) and of the copy bandwidth. A sweep picks its tiles and programs per
   SM first (the e4m3 rows of the table use them).
5. Stochastic rounding with each number of Philox rounds in PHILOX_ROUNDS (kernels.PHILOX_ROUNDS).
6. kernels.dequantize (stored codes + scales -> bf16, the backward of pack_saved): time, % of copy
   bandwidth and its bits against the reference's dequantization.

Usage: python bench/kernels_bench.py --out bench/results/kernels.json [--size 8192] [--workers 8]
       [--no-sweep] [--skip-check]   (the tables alone, with the tiles kernels.py holds)
       [--amax-only]   (the tensor-amax sweep and table alone)
       python bench/kernels_bench.py --cpu --size 64 --small 64   (a dry run in Triton's interpreter)
       --tree DIR: time the kernels.py (and check against the quant.py) of another checkout, e.g. an older
       commit's `git worktree`, side by side with this one's table (its tile sweeps may not apply there:
       use --no-sweep)
"""
import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = [("e2m1", None), ("e1m2", None), ("int4", None), ("e2m1", 2.0)]
BLOCKS = [(16, False, False), (16, False, True), (32, False, False), (32, False, True), (16, True, False)]
ROW_TILES = [(1, 64, 1), (1, 64, 2), (1, 128, 2), (1, 256, 4), (1, 32, 1)]  # (BM, NG, num_warps)
COL_TILES = [(64, 4, 4), (128, 2, 4), (64, 8, 4), (16, 4, 1), (32, 4, 2), (64, 2, 2), (32, 4, 1)]
PHILOX_ROUNDS = [10, 7]  # the SR table's Philox rounds
AMAX_TILES = {"row": [(1, 128, 4), (1, 256, 4), (1, 256, 8), (1, 512, 8)],     # (BM, NG, num_warps)
              "col": [(64, 4, 4), (64, 8, 4), (128, 4, 4), (128, 8, 8)],
              "both": [(64, 64, 4), (32, 64, 2), (64, 128, 4), (128, 64, 4), (32, 128, 4),  # (TR, TC, num_warps,
                       (64, 64, 4, True), (32, 64, 2, True), (32, 128, 4, True), (16, 64, 1, True)]}  # sync)
AMAX_PROGRAMS_PER_SM = [2, 4, 8, 16]
AMAX_CASES = {"flat": (False, -1), "row": (True, -1), "col": (True, 0), "both": (True, None)}  # kind: (RHT, dim)


def setup(cpu: bool, tree=None):
    """Import torch/kernels (from `tree`, a checkout's root, else this one) after choosing the interpreter
    (it must be set before triton loads)."""
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(tree).resolve() if tree else ROOT))
    global torch, triton, tl, kernels, quant, rht
    import torch
    import triton
    import triton.language as tl
    import kernels
    import quant
    import rht


def make_x(rows, cols, seed, device):
    """bf16 with rows and columns of very different magnitudes, zero blocks, negative zeros and
    subnormal and huge values."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, device=device)
    x *= torch.exp(2 * torch.randn(rows, 1, generator=g, device=device))
    x *= torch.exp(torch.randn(1, cols, generator=g, device=device))
    x[:16, :16] = 0.0
    x[0, 16:32] = -0.0
    x[1] *= 3e-39
    x[:, 1] *= 1e-36
    x[2, :64] *= 1e20
    return x.to(torch.bfloat16)


def kernel_args(spec, dim, signs, **kw):
    return dict(levels=spec.levels, block=spec.block, scale_mode=spec.scale, sr=spec.rounding == "sr",
                rht_signs=signs if spec.rht else None, block_2d=spec.block_2d, dim=dim, **kw)


def n_diff(got, want) -> int:
    """How many elements differ in bits (NaN equals NaN)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return -1
    if got.dtype == torch.float8_e4m3fn:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if got.is_floating_point():
        ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[got.dtype]
        nan_g, nan_w = torch.isnan(got), torch.isnan(want)
        diff = (nan_g != nan_w) | (~nan_w & (got.view(ints) != want.view(ints)))
        return int(diff.sum())
    return int((got != want).sum())


def compare(x, spec, dim, signs, ref_device):
    """Mismatch counts of the kernel (on x's device) against the reference run on ref_device."""
    ref = quant.quantize(x.to(ref_device), spec, dim, signs=signs.to(ref_device))
    codes, scales, t, dq = kernels.quantize(x, **kernel_args(spec, dim, signs, keep_rotated=True))
    out = dict(codes=n_diff(codes.cpu(), ref.codes.cpu()), scales=n_diff(scales.cpu(), ref.scales.cpu()),
               tensor_scale=n_diff(t.cpu(), ref.tensor_scale.cpu()),
               dequant=n_diff(dq.cpu(), ref.dequantize(keep_rotated=True).cpu()))
    if spec.rht:
        dq = kernels.fake_quantize(x, **kernel_args(spec, dim, signs))
        out["dequant_rotated_back"] = n_diff(dq.cpu(), ref.dequantize().cpu())
    return out


def check_case(case):
    """One spec and orientation: kernel vs GPU reference (big tensor) and vs CPU reference (small)."""
    (grid, max_level, block, block_2d, use_rht, dim), opts = case
    kernels._TILES.update(opts.get("tiles", {}))
    spec = quant.QuantSpec(grid, block, opts["scale"], "rtne", use_rht, block_2d, max_level)
    dev = opts["device"]
    signs = rht.random_signs(0).to(dev)
    t0 = time.time()
    big = compare(make_x(opts["size"], opts["size"], 1, dev), spec, dim, signs, dev)
    x = make_x(opts["small"], opts["small"] // 2, 2, "cpu").to(dev)
    small = compare(x, spec, dim, signs, "cpu")
    return dict(spec=str(spec), dim=dim, vs_gpu_reference=big, vs_cpu_reference=small,
                seconds=round(time.time() - t0, 2))


def reference_self_check(opts):
    """The reference on the GPU against the reference on the CPU (same input)."""
    dev, rows = opts["device"], []
    x = make_x(opts["small"], opts["small"] // 2, 2, "cpu")
    for scale in ("fp32", "e4m3", "e8m0"):
        spec = quant.QuantSpec("e2m1", 16, scale)
        a, b = quant.quantize(x, spec), quant.quantize(x.to(dev), spec)
        rows.append(dict(spec=str(spec), codes=n_diff(b.codes.cpu(), a.codes),
                         scales=n_diff(b.scales.cpu(), a.scales),
                         dequant=n_diff(b.dequantize().cpu(), a.dequantize())))
    amax = torch.rand(1 << 22, generator=torch.Generator().manual_seed(0)) * 100
    rows.append(dict(what="amax / 6.0 (CPU scalar) on GPU vs CPU",
                     differ=n_diff((amax.to(dev) / 6.0).cpu(), amax / 6.0),
                     differ_tensor_divisor=n_diff((amax.to(dev) / torch.full_like(amax, 6.0).to(dev)).cpu(),
                                                  amax / 6.0)))
    return rows


def fast_div_check(dev, n=1 << 26, rounds=16):
    """kernels._div_fast against IEEE division on random x, s (s in its range, |x/s| < 8); quotients
    below 1/8 (where it may be off by ulps, which still round to level 0) are counted apart."""
    if dev == "cpu":
        return dict(skipped="needs CUDA (no fused multiply-add in the interpreter)")

    @triton.jit
    def _k(x_ptr, s_ptr, bad_ptr, N, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + o, mask=o < N, other=0.0)
        s = tl.load(s_ptr + o, mask=o < N, other=1.0)
        fast = kernels._div_fast(x, s, tl.math.div_rn(1.0, s))
        exact = tl.math.div_rn(x, s)
        diff = fast.to(tl.int32, bitcast=True) != exact.to(tl.int32, bitcast=True)
        big = tl.abs(exact) >= 0.125
        tl.atomic_add(bad_ptr, tl.sum((diff & big).to(tl.int32)))
        tl.atomic_add(bad_ptr + 1, tl.sum((diff & ~big).to(tl.int32)))

    g = torch.Generator(device=dev).manual_seed(0)
    bad = torch.zeros(2, dtype=torch.int32, device=dev)
    for i in range(rounds):
        e = torch.randint(-100, 124, (n,), generator=g, device=dev).float()
        s = torch.exp2(e) * (1 + torch.rand(n, generator=g, device=dev))
        if i % 2:  # y = x / s uniform in [0, 8), or close to a level midpoint
            y = torch.rand(n, generator=g, device=dev) * 8
        else:
            y = torch.randint(0, 16, (n,), generator=g, device=dev) / 2 + 0.25
            y = y * (1 + (torch.rand(n, generator=g, device=dev) - 0.5) * 2**-20)
        x = (y * s).float() * torch.where(torch.rand(n, generator=g, device=dev) < 0.5, -1.0, 1.0)
        _k[(triton.cdiv(n, 1024),)](x, s.float(), bad, n, BLOCK=1024, enable_fp_fusion=False)
    return dict(pairs=n * rounds, mismatches_quotient_ge_1_8=int(bad[0]), mismatches_below_1_8=int(bad[1]))


def timed_specs():
    Q = quant.QuantSpec
    return {"e2m1 fp32 b16 (paper E2M1)": Q("e2m1", 16, "fp32"),
            "e1m2 fp32 b16 (UFP4)": Q("e1m2", 16, "fp32"),
            "e2m1 e4m3 b16 (NVFP4)": Q("e2m1", 16, "e4m3"),
            "e2m1 e8m0 b32 (MXFP4)": Q("e2m1", 32, "e8m0"),
            "e1m2 fp32 b16 SR (UFP4 dY)": Q("e1m2", 16, "fp32", "sr")}


def timing_calls(x, spec, dim, output, variant, signs, tile=None, fast_div=True):
    """The callable timed for one table row, and the bytes it must move."""
    kw = kernel_args(spec, dim, signs, keep_rotated=True, tile=tile, seed=1, fast_div=fast_div,
                     want_codes=output == "codes", want_dequant=output == "dequant")
    if variant == "alone":
        kw["rht_signs"] = None
        fn = lambda: kernels.quantize(x, **kw)  # noqa: E731
    elif variant == "fused_rht":
        kw["rht_signs"] = signs
        fn = lambda: kernels.quantize(x, **kw)  # noqa: E731
    else:  # the RHT as its own pass, a bf16 GEMM with H' = diag(signs) H16 (entries +-1/4, exact in
        # bf16; fp32 accumulation, the rotated tensor written in bf16), then quantize alone
        kw["rht_signs"] = None
        h = (signs.float()[:, None] * rht.hadamard().to(x.device)).to(x.dtype)  # [16, 16]
        if dim == -1:
            fn = lambda: kernels.quantize((x.view(-1, 16) @ h).view(x.shape), **kw)  # noqa: E731
        else:  # groups of 16 rows: H'^T times each [16, K] slab, in x's layout
            fn = lambda: kernels.quantize((h.t() @ x.view(-1, 16, x.shape[1])).view(x.shape), **kw)  # noqa: E731
    n, size = x.numel(), x.element_size()
    read = n * size * (2 if spec.scale == "e4m3" else 1)  # e4m3: the tensor-amax pass reads x too
    write = n * size if output == "dequant" else n // 2 + n // spec.block * (4 if spec.scale == "fp32" else 1)
    return fn, read + write


def warm_case(case):
    """Compile one timed configuration on a small tensor (fills the on-disk Triton cache); a case
    without a tile of its own takes the kernels' tiles, given as case[7]."""
    name, dim, output, variant, tile, dev = case[:6]
    if len(case) > 7:
        kernels._TILES.update(case[7])
        case = case[:7]
    spec = timed_specs()[name]
    x = make_x(256, 256, 3, dev)
    fn, _ = timing_calls(x, spec, dim, output, variant, rht.random_signs(0).to(dev), tile, *case[6:])
    fn()
    return case


_FLUSH = {}


def bench(fn, dev, flush="read"):
    """fn's median time in ms over ~100 ms of calls, the L2 cache flushed before each. flush="read"
    reads a 256 MiB buffer, which leaves the L2 holding clean lines only; flush="zero" is
    triton.testing.do_bench's, which zeroes one: the L2 is then full of dirty lines, and the timed
    kernel pays for writing ~50 MB of them back (several microseconds, more than a few percent of a
    kernel that moves a few hundred MB)."""
    if dev == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    if flush == "zero":
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    if "buf" not in _FLUSH:
        _FLUSH["buf"] = torch.ones(1 << 26, dtype=torch.int32, device=dev)
    buf = _FLUSH["buf"]
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    n = max(10, min(1000, int(0.1 / max((time.perf_counter() - t0) / 5, 1e-6))))
    for _ in range(n // 4):  # warm-up
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        buf.amax()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def init_worker(cpu, tree):
    setup(cpu, tree)
    torch.set_num_threads(2)


def save(res, path, t_start):
    res["seconds"] = round(time.time() - t_start, 1)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(res, indent=1))


def tile_kind(spec, dim, out, var) -> str:
    """The key of kernels._TILES a configuration takes (kernels._tile_kind): orientation, output, scale
    mode, SR and RHT."""
    return kernels._tile_kind(dim == 0, spec.block_2d, out == "codes")


def sweep_tiles(x, signs, cases, copy, dev):
    """Time the tile candidates; the best tile of each tile kind (tile_kind) is the one with the least
    total time over the specs of that kind."""
    specs, sweep, best = timed_specs(), [], {}
    for name, dim, out, var, tile, _ in cases:
        fn, nbytes = timing_calls(x, specs[name], dim, out, var, signs, tile)
        ms = bench(fn, dev)
        sweep.append(dict(spec=name, dim=dim, output=out, variant=var, tile=tile, ms=ms,
                          pct_copy=100 * nbytes / ms / 1e6 / copy))
    def kind(r):
        return tile_kind(specs[r["spec"]], r["dim"], r["output"], r["variant"])
    for k in sorted({kind(r) for r in sweep}):
        tiles = COL_TILES if k.startswith("col") else ROW_TILES
        total = {t: sum(r["ms"] for r in sweep if kind(r) == k and r["tile"] == t) for t in tiles}
        best[k] = min(total, key=total.get)
        print(f"tile sweep {k}: " + ", ".join(f"{t}: {v:.3f} ms" for t, v in total.items()) + f" -> {best[k]}",
              flush=True)
    return sweep, best


def amax_call(x, kind, signs, tile=None, programs=None):
    use_rht, dim = AMAX_CASES[kind]
    if dim is None:  # rows and columns (both rotated) from one read
        return lambda: kernels.tensor_amax_both(x, rht_signs=signs, tile=tile, programs=programs)  # noqa: E731
    return lambda: kernels.tensor_amax(x, rht_signs=signs if use_rht else None, dim=dim, tile=tile,  # noqa: E731
                                       programs=programs)


def sweep_amax(x, signs, dev):
    """The tensor-amax pass: the best tile per kind (at the default programs per SM), then the best
    programs per SM (least total time over the kinds); installs both in kernels for the table."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev == "cuda" else 1
    rows, best = [], {}
    for kind, tiles in AMAX_TILES.items():
        ms = {t: bench(amax_call(x, kind, signs, t), dev) for t in tiles}
        best[kind] = min(ms, key=ms.get)
        pps = kernels._AMAX_PROGRAMS_PER_SM
        rows += [dict(kind=kind, tile=t, programs_per_sm=pps, ms=v) for t, v in ms.items()]
        print(f"amax tile sweep {kind}: " + ", ".join(f"{t}: {v:.4f} ms" for t, v in ms.items())
              + f" -> {best[kind]}", flush=True)
    total = {}
    for pps in AMAX_PROGRAMS_PER_SM:
        ms = [bench(amax_call(x, kind, signs, best[kind], pps * sms), dev) for kind in AMAX_TILES]
        rows += [dict(kind=kind, tile=best[kind], programs_per_sm=pps, ms=v) for kind, v in zip(AMAX_TILES, ms)]
        total[pps] = sum(ms)
    pps = min(total, key=total.get)
    print("amax programs per SM: " + ", ".join(f"{k}: {v:.4f} ms" for k, v in total.items()) + f" -> {pps}",
          flush=True)
    (kernels._AMAX_TILES if dev == "cuda" else kernels._AMAX_TILES_INTERPRET).update(best)
    kernels._AMAX_PROGRAMS_PER_SM = pps
    return rows, dict(tiles=best, programs_per_sm=pps)


def amax_table(x, signs, dev, read_bw, copy):
    """The tensor-amax pass alone, with the swept tiles: a pure read of x."""
    print(f"\ne4m3 tensor-amax pass alone: bytes = x read once; %read = GB/s over torch.amax's read "
          f"GB/s ({read_bw:.0f}), %copy over the copy's ({copy:.0f})")
    print(f"{'pass':18s} {'ms':>8s} {'GB/s':>7s} {'%read':>6s} {'%copy':>6s}")
    table = []
    for kind, name in (("flat", "no RHT"), ("row", "RHT rows (dim -1)"), ("col", "RHT cols (dim 0)"),
                       ("both", "RHT rows + cols")):
        ms = bench(amax_call(x, kind, signs), dev)
        gbps = x.numel() * x.element_size() / ms / 1e6
        table.append(dict(kind=kind, ms=ms, GBps=gbps, pct_read=100 * gbps / read_bw, pct_copy=100 * gbps / copy))
        print(f"{name:18s} {ms:8.4f} {gbps:7.0f} {table[-1]['pct_read']:6.1f} {table[-1]['pct_copy']:6.1f}",
              flush=True)
    both = table[-1]["ms"] / (table[1]["ms"] + table[2]["ms"])
    print(f"rows + cols from one read (tensor_amax_both) / the two passes: {both:.3f}", flush=True)
    table.append(dict(kind="both_over_two_passes", ratio=both))
    return table


def sr_rounds_table(x, signs, copy, dev):
    """The SR kernel (UFP4's dY spec) with each number of Philox rounds (kernels.PHILOX_ROUNDS)."""
    spec, rows = timed_specs()["e1m2 fp32 b16 SR (UFP4 dY)"], []
    default = kernels.PHILOX_ROUNDS
    print(f"\nSR with n Philox4x32 rounds (kernels.PHILOX_ROUNDS = {default}); %copy as above")
    for rounds in PHILOX_ROUNDS:
        kernels.PHILOX_ROUNDS = rounds
        kernels._plan.cache_clear()
        for dim in (-1, 0):
            for var in ("alone", "fused_rht"):
                fn, nbytes = timing_calls(x, spec, dim, "dequant", var, signs)
                ms = bench(fn, dev)
                rows.append(dict(rounds=rounds, dim=dim, variant=var, ms=ms, pct_copy=100 * nbytes / ms / 1e6 / copy))
                print(f"rounds {rounds:2d} dim {dim:2d} {var:10s} {ms:8.4f} ms {rows[-1]['pct_copy']:6.1f} %copy",
                      flush=True)
    kernels.PHILOX_ROUNDS = default
    kernels._plan.cache_clear()
    return rows


def dequantize_table(x, signs, copy, dev):
    """kernels.dequantize (stored codes + scales -> bf16, as pack_saved's backward runs it): read the
    codes and scales, write bf16; and its bits against the reference's dequantization."""
    rows = []
    print("\ndequantize (codes + scales -> bf16, rotated back): bytes = codes + scales read + bf16 written")
    for name, spec in timed_specs().items():
        if spec.rounding == "sr":
            continue
        qt = quant.quantize(x, dataclasses.replace(spec, rht=True), signs=signs)
        kw = dict(levels=spec.levels, block=spec.block, scale_mode=spec.scale, rht_signs=signs)
        fn = lambda: kernels.dequantize(qt.codes, qt.scales, qt.tensor_scale, **kw)  # noqa: E731
        diff = n_diff(fn(), qt.dequantize())
        ms = bench(fn, dev)
        nbytes = qt.codes.numel() + qt.scales.numel() * qt.scales.element_size() + x.numel() * 2
        rows.append(dict(spec=name, ms=ms, pct_copy=100 * nbytes / ms / 1e6 / copy, differ_from_reference=diff))
        print(f"{name:28s} {ms:8.4f} ms {rows[-1]['pct_copy']:6.1f} %copy, {diff} elements differ from the reference",
              flush=True)
    return rows


def report_identity(res):
    bad = [r for r in res["identity"] if any(v for part in ("vs_gpu_reference", "vs_cpu_reference")
                                             for v in r[part].values())]
    cpu_bad = [r for r in res["identity"] if any(r["vs_cpu_reference"].values())]
    print(f"bit identity: {len(res['identity'])} spec/orientation cases; {len(bad)} differ from the "
          f"GPU or CPU reference, {len(cpu_bad)} from the CPU reference")
    for r in bad:
        print("  ", r["spec"], "dim", r["dim"], "gpu-ref", r["vs_gpu_reference"], "cpu-ref", r["vs_cpu_reference"])
    for r in res["reference_gpu_vs_cpu"]:
        print("  reference GPU vs CPU:", r)


def compare_files(old_path: str, new_path: str):
    """Print each timed kernel of two --out files (two trees, one GPU, one after the other): ms and
    the ratio new / old, slowest first."""
    def rows(path):
        d = json.load(open(path))
        out = {("amax", r["kind"]): r["ms"] for r in d["amax_table"] if "ms" in r}
        out.update({("quantize", r["spec"], f"dim {r['dim']}", r["output"], r["variant"]): r["ms"] for r in d["table"]})
        out.update({("dequantize", r["spec"]): r["ms"] for r in d["dequantize"]})
        return d, out
    (d_old, old), (d_new, new) = rows(old_path), rows(new_path)
    print(f"old: {d_old['tree']} ({d_old['device']})\nnew: {d_new['tree']} ({d_new['device']})\n"
          f"{'old ms':>8} {'new ms':>8} {'new/old':>8}  kernel")
    common = sorted(set(old) & set(new), key=lambda k: old[k] / new[k])
    for k in common:
        print(f"{old[k]:8.4f} {new[k]:8.4f} {new[k] / old[k]:8.3f}  {' | '.join(k)}")
    print(f"{len(common)} kernels; over 1.015x: {sum(new[k] > 1.015 * old[k] for k in common)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", nargs=2, metavar=("OLD.json", "NEW.json"),
                   help="print two --out files' tables side by side (no GPU work), then stop")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--size", type=int, default=8192, help="the big square bf16 tensor's side")
    p.add_argument("--small", type=int, default=1024, help="rows of the tensor checked on the CPU")
    p.add_argument("--workers", type=int, default=8, help="processes for the checks and compiles")
    p.add_argument("--cpu", action="store_true", help="dry run in Triton's CPU interpreter")
    p.add_argument("--tree", default=None, metavar="DIR", help="the checkout whose kernels.py, quant.py and rht.py "
                   "run (default: this one)")
    p.add_argument("--skip-check", action="store_true", help="no bit-identity checks")
    p.add_argument("--no-sweep", action="store_true",
                   help="no tile sweeps: every kernel takes the tiles kernels.py holds (a quick table)")
    p.add_argument("--amax-only", action="store_true", help="only the tensor-amax passes: their sweep and table")
    p.add_argument("--sweep-kinds", default=None, metavar="K1,K2",
                   help="sweep only these tile kinds (keys of kernels._TILES, e.g. row_codes,col_codes; the "
                        "whole sweep takes ~7 minutes on an H200), not the tensor-amax tiles; the others "
                        "keep kernels.py's tiles")
    args = p.parse_args()
    if args.compare:
        return compare_files(*args.compare)
    setup(args.cpu, args.tree)
    dev = "cpu" if args.cpu else "cuda"
    t_start = time.time()
    res = dict(tree=str(Path(args.tree or ROOT).resolve()), kernels_file=kernels.__file__,
               device=torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
               torch=torch.__version__, triton=triton.__version__, size=args.size)
    pool = mp.get_context("spawn").Pool(args.workers, initializer=init_worker, initargs=(args.cpu, args.tree))
    specs = timed_specs()
    names = list(specs)
    tile_cases = [] if args.no_sweep else [  # every spec: a tile that suits the others can cost one 1.2x
        (name, dim, out, var, tile, dev) for name in names for dim in (-1, 0) for out in ("dequant", "codes")
        for var in ("alone", "fused_rht") for tile in (ROW_TILES if dim == -1 else COL_TILES)]
    if args.sweep_kinds:
        kinds = set(args.sweep_kinds.split(","))
        if not kinds <= set(kernels._TILES):
            p.error(f"--sweep-kinds: unknown kind(s) {sorted(kinds - set(kernels._TILES))}; "
                    f"choose from {sorted(kernels._TILES)}")
        tile_cases = [c for c in tile_cases if tile_kind(specs[c[0]], *c[1:4]) in kinds]
    if dev == "cuda":
        pool.map(warm_case, tile_cases)  # compile in parallel; the sweep then finds them cached
    print(f"sweep kernels compiled after {time.time() - t_start:.0f} s", flush=True)

    signs = rht.random_signs(0).to(dev)
    if dev == "cuda":
        buf = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev)  # 1 GiB
        dst = torch.empty_like(buf)
        res["copy_GBps"] = 2 * buf.numel() * 2 / bench(lambda: dst.copy_(buf), dev) / 1e6
        res["read_GBps"] = buf.numel() * 2 / bench(lambda: buf.amax(), dev) / 1e6
        del buf, dst
    else:
        res["copy_GBps"] = res["read_GBps"] = 1.0
    copy = res["copy_GBps"]
    print(f"device-to-device copy: {copy:.0f} GB/s; read (torch.amax): {res['read_GBps']:.0f} GB/s", flush=True)
    x = make_x(args.size, args.size, 4, dev)
    if not (args.no_sweep or args.sweep_kinds) or args.amax_only:  # (--sweep-kinds: the quantize tiles only)
        res["amax_sweep"], res["amax_best"] = sweep_amax(x, signs, dev)
    res["amax_table"] = amax_table(x, signs, dev, res["read_GBps"], copy)
    if args.amax_only:
        save(res, args.out, t_start)
        return
    res["tile_sweep"], best = sweep_tiles(x, signs, tile_cases, copy, dev) if tile_cases else ([], {})
    res["best_tiles"] = best  # from here on every kernel takes its tile from kernels' table, so updated
    (kernels._TILES if dev == "cuda" else kernels._TILES_INTERPRET).update(best)
    save(res, args.out, t_start)

    # the checks and the table's compiles run in the workers, with the chosen tiles
    opts = dict(device=dev, size=args.size, small=args.small, tiles=best)
    main_cases = [(name, dim, out, var, None, dev, True, best) for name in names for dim in (-1, 0)
                  for out in ("dequant", "codes") for var in ("alone", "fused_rht", "separate_rht")]
    slow_div = [(names[0], dim, out, "alone", None, dev, False, best) for dim in (-1, 0)
                for out in ("dequant", "codes")]
    warm = pool.map_async(warm_case, main_cases + slow_div) if dev == "cuda" else None
    if not args.skip_check:
        cases = [((g, ml, b, b2, r, dim), dict(opts, scale=scale)) for g, ml in GRIDS
                 for scale in ("fp32", "e4m3", "e8m0") for b, b2, r in BLOCKS for dim in (-1, 0)]
        checks = pool.map_async(check_case, cases)
        res["fast_div"] = fast_div_check(dev)
        print("fast division vs IEEE:", res["fast_div"], flush=True)
        res["identity"] = checks.get()
        res["reference_gpu_vs_cpu"] = reference_self_check(opts)
        report_identity(res)
    if warm is not None:
        warm.get()
    pool.close()
    save(res, args.out, t_start)
    print(f"checks and compiles done after {time.time() - t_start:.0f} s", flush=True)

    table = res["table"] = []
    print("\nbytes = read x (bf16) once, twice for e4m3 scales (the tensor-amax pass, then the quantize "
          "pass) + write the outputs once; %copy = GB/s over the copy's GB/s; x alone = ms over the "
          "variant without RHT; L2 flushed by a read before each call (bench()); zeroed L2: ms and %copy with "
          "triton's do_bench, whose flush leaves dirty lines")
    print(f"{'spec':28s} {'dim':>3s} {'output':8s} {'variant':13s} {'ms':>8s} {'GB/s':>7s} {'%copy':>6s} "
          f"{'x alone':>7s} {'zeroed L2':>9s} {'%copy':>6s}")
    for name in names:
        for dim in (-1, 0):
            for out in ("dequant", "codes"):
                alone = None
                for var in ("alone", "fused_rht", "separate_rht"):
                    fn, nbytes = timing_calls(x, specs[name], dim, out, var, signs)
                    ms = bench(fn, dev)
                    zeroed = bench(fn, dev, flush="zero")
                    alone = alone or ms
                    row = dict(spec=name, dim=dim, output=out, variant=var, ms=ms, bytes=nbytes,
                               GBps=nbytes / ms / 1e6, pct_copy=100 * nbytes / ms / 1e6 / copy,
                               ratio_to_alone=ms / alone, ms_zeroed_l2=zeroed,
                               pct_copy_zeroed_l2=100 * nbytes / zeroed / 1e6 / copy)
                    table.append(row)
                    print(f"{name:28s} {dim:3d} {out:8s} {var:13s} {ms:8.4f} {row['GBps']:7.0f} "
                          f"{row['pct_copy']:6.1f} {row['ratio_to_alone']:7.3f} {zeroed:9.4f} "
                          f"{row['pct_copy_zeroed_l2']:6.1f}", flush=True)
    res["sr_rounds"] = sr_rounds_table(x, signs, copy, dev)
    res["dequantize"] = dequantize_table(x, signs, copy, dev)
    res["ieee_division"] = []
    for name, dim, out, var, tile, _, _, _ in slow_div:  # the plain div.rn path, for comparison
        fn, nbytes = timing_calls(x, specs[name], dim, out, var, signs, tile, fast_div=False)
        ms = bench(fn, dev)
        res["ieee_division"].append(dict(spec=name, dim=dim, output=out, ms=ms,
                                         pct_copy=100 * nbytes / ms / 1e6 / copy))
        print(f"{name:28s} {dim:3d} {out:8s} {'ieee div':13s} {ms:8.4f} {'':7s} "
              f"{res['ieee_division'][-1]['pct_copy']:6.1f}", flush=True)
    save(res, args.out, t_start)
    print(f"total {res['seconds']} s")


if __name__ == "__main__":
    main()
