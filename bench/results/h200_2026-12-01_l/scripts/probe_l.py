"""Probes of the twelfth set (run from the repo root). Cases are timed by kernels_bench.bench (L2 flushed
by a read) and each case's bits are compared with the first case of its spec, output and variant.

  python probe_l.py tiles      column codes and dequant under wider tiles (BM 128, 256), and the rows
                               kernels at the default tiles (all 5 specs, alone and fused RHT)
  python probe_l.py mfirst     the same column cases with the grid's first axis along m (programs next
                               to each other in launch order read the same rows): run on a kernels.py
                               patched by the --patch step of commands.sh
"""
import multiprocessing as mp
import sys
import time
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb

SPECS = ["e2m1 fp32 b16 (paper E2M1)", "e1m2 fp32 b16 (UFP4)", "e2m1 e4m3 b16 (NVFP4)", "e2m1 e8m0 b32 (MXFP4)",
         "e1m2 fp32 b16 SR (UFP4 dY)"]
CODES_TILES = [None, (128, 4, 4), (128, 2, 4), (128, 8, 8), (256, 2, 4), (256, 4, 8)]
DEQ_TILES = [None, (256, 2, 8)]


def cases(kind):
    """(spec, dim, output, variant, tile)"""
    out = [(n, 0, "codes", v, t) for n in SPECS for v in ("alone", "fused_rht") for t in CODES_TILES]
    out += [(n, 0, "dequant", v, t) for n in SPECS for v in ("alone", "fused_rht") for t in DEQ_TILES]
    if kind == "tiles":
        out += [(n, -1, o, v, None) for n in SPECS for o in ("codes", "dequant") for v in ("alone", "fused_rht")]
    return out


def warm(case):
    import torch, rht
    name, dim, out, var, tile = case
    x = kb.make_x(256, 256, 3, "cuda")
    fn, _ = kb.timing_calls(x, kb.timed_specs()[name], dim, out, var, rht.random_signs(0).cuda(), tile)
    fn()
    torch.cuda.synchronize()


def main(kind):
    t0 = time.time()
    kb.setup(False)
    import torch, kernels, rht
    run = cases(kind)
    with mp.get_context("spawn").Pool(14, initializer=kb.setup, initargs=(False,)) as pool:
        pool.map(warm, run)
    print(f"compiled after {time.time() - t0:.0f} s", flush=True)
    x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
    buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
    copy = 2 * buf.numel() * 2 / kb.bench(lambda: dst.copy_(buf), "cuda") / 1e6
    del buf, dst
    print(f"copy {copy:.0f} GB/s", flush=True)
    first = {}
    for name, dim, out, var, tile in run:
        fn, nb = kb.timing_calls(x, kb.timed_specs()[name], dim, out, var, signs, tile)
        got = [t if t is None or t.dtype != torch.float8_e4m3fn else t.view(torch.uint8) for t in fn()]
        key = (name, dim, out, var)
        same = ""
        if key in first:
            same = "bits equal " + str(all((a is None and b is None) or torch.equal(a, b)
                                            for a, b in zip(got, first[key][1])))
        ms = kb.bench(fn, "cuda")
        first.setdefault(key, (ms, [t if t is None else t.clone() for t in got]))
        print(f"{name:28s} dim {dim:2d} {out:8s} {var:10s} {str(tile):14s} {ms:8.4f} ms "
              f"{100 * nb / ms / 1e6 / copy:6.1f} %copy  x first {ms / first[key][0]:.3f} {same}", flush=True)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
