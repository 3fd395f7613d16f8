"""The probes of calls 5, 6 and 8 (run from the repo root; kernels_bench.py of the commit named in NOTES.md).

  python probes.py tma            call 5: rows through TMA tensor descriptors (tma_rows.patch applied)
                                  against plain loads, 5 specs, timed by kernels_bench.bench (then
                                  triton's do_bench)
  python probes.py tma-graph      call 6: 4 specs, quantize alone, 2 TMA tiles, timed in CUDA graphs
  python probes.py col            call 8: column codes tiles, timed by kernels_bench.bench (read flush)
Each case's bits are compared with the first case of its spec and variant."""
import multiprocessing as mp
import sys
import time
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb

SPECS = ["e2m1 fp32 b16 (paper E2M1)", "e1m2 fp32 b16 (UFP4)", "e2m1 e4m3 b16 (NVFP4)", "e2m1 e8m0 b32 (MXFP4)",
         "e1m2 fp32 b16 SR (UFP4 dY)"]
COL_TILES = [(64, 8, 4), (64, 4, 4), (16, 16, 4), (32, 16, 4), (16, 32, 4), (32, 8, 2), (16, 16, 2), (32, 16, 8),
             (64, 16, 8), (16, 16, 1), (8, 32, 2)]


def cases(kind):
    """(spec, dim, output, variant, tma, tile)"""
    if kind == "col":
        names = [SPECS[0], SPECS[1], SPECS[3], SPECS[4], SPECS[2]]
        return [(n, 0, "codes", v, False, t) for n in names for v in ("alone", "fused_rht") for t in COL_TILES]
    names, tiles, variants = SPECS, [(1, 64, 1), (1, 128, 2), (1, 128, 1), (1, 256, 4)], ("alone", "fused_rht")
    if kind == "tma-graph":
        names, tiles, variants = [SPECS[0], SPECS[1], SPECS[3], SPECS[4]], tiles[:2], ("alone",)
    return [(n, -1, out, v, tma, tile) for n in names for out in ("codes", "dequant") for v in variants
            for tma, tile in [(False, None)] + [(True, t) for t in tiles]]


def warm(case):
    import torch, kernels, rht
    name, dim, out, var, tma, tile = case
    kernels.TMA_ROWS = tma  # (the attribute only matters with tma_rows.patch applied)
    x = kb.make_x(256, 256, 3, "cuda")
    fn, _ = kb.timing_calls(x, kb.timed_specs()[name], dim, out, var, rht.random_signs(0).cuda(), tile)
    fn()
    torch.cuda.synchronize()


def run_cases(run, timer_kind="bench", label=None):
    """Compile the cases (name, dim, output, variant, tma, tile) in 14 processes, then time each on 8192 x
    8192 bf16 (timer_kind "bench": kb.bench, "graph": CUDA graphs) and compare its bits with the first
    case of its (name, dim, output, variant); label(case) is the printed case (default: as calls 5, 6,
    8 printed it)."""
    t0 = time.time()
    kb.setup(False)
    import torch, triton, kernels, rht
    with mp.get_context("spawn").Pool(14, initializer=kb.setup, initargs=(False,)) as pool:
        pool.map(warm, run)
    print(f"compiled after {time.time() - t0:.0f} s", flush=True)
    timer = (lambda fn: triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")) \
        if timer_kind == "graph" else (lambda fn: kb.bench(fn, "cuda"))
    label = label or (lambda c: f"{c[0]:28s} {c[2]:8s} {c[3]:10s} {'tma' if c[4] else 'plain':5s} {str(c[5]):14s}")
    x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
    buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
    copy = 2 * buf.numel() * 2 / timer(lambda: dst.copy_(buf)) / 1e6
    del buf, dst
    print(f"copy {copy:.0f} GB/s", flush=True)
    first = {}
    for case in run:
        name, dim, out, var, tma, tile = case
        kernels.TMA_ROWS = tma
        fn, nb = kb.timing_calls(x, kb.timed_specs()[name], dim, out, var, signs, tile)
        got = [t if t is None or t.dtype != torch.float8_e4m3fn else t.view(torch.uint8) for t in fn()]
        key = (name, dim, out, var)
        same = ""
        if key in first:
            same = "bits equal " + str(all((a is None and b is None) or torch.equal(a, b)
                                            for a, b in zip(got, first[key][1])))
        ms = timer(fn)
        first.setdefault(key, (ms, [t if t is None else t.clone() for t in got]))
        print(f"{label(case)} {ms:8.4f} ms {100 * nb / ms / 1e6 / copy:6.1f} %copy  x first "
              f"{ms / first[key][0]:.3f} {same}", flush=True)
    print(f"total {time.time() - t0:.0f} s")


def main(kind):
    run_cases(cases(kind), "graph" if kind == "tma-graph" else "bench")


if __name__ == "__main__":
    main(sys.argv[1])
