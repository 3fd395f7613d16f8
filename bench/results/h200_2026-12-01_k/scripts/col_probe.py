"""Column codes tiles probe (clean-flush timing, kernels_bench.bench)."""
import multiprocessing as mp, sys, time
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb

NAMES = ["e2m1 fp32 b16 (paper E2M1)", "e1m2 fp32 b16 (UFP4)", "e2m1 e8m0 b32 (MXFP4)", "e1m2 fp32 b16 SR (UFP4 dY)",
         "e2m1 e4m3 b16 (NVFP4)"]
TILES = [(64, 8, 4), (64, 4, 4), (16, 16, 4), (32, 16, 4), (16, 32, 4), (32, 8, 2), (16, 16, 2), (32, 16, 8), (64, 16, 8),
         (16, 16, 1), (8, 32, 2)]
CASES = [(n, 0, "codes", v, t, "cuda") for n in NAMES for v in ("alone", "fused_rht") for t in TILES]

def init():
    kb.setup(False)

if __name__ == "__main__":
    t0 = time.time()
    kb.setup(False)
    import torch, kernels, rht
    with mp.get_context("spawn").Pool(14, initializer=init) as pool:
        pool.map(kb.warm_case, CASES)
    print(f"compiled after {time.time() - t0:.0f} s", flush=True)
    x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
    buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
    copy = 2 * buf.numel() * 2 / kb.bench(lambda: dst.copy_(buf), "cuda") / 1e6
    del buf, dst
    print(f"copy {copy:.0f} GB/s", flush=True)
    ref = {}
    for name, dim, out, var, tile, _ in CASES:
        fn, nb = kb.timing_calls(x, kb.timed_specs()[name], dim, out, var, signs, tile)
        r = fn()
        key = (name, var)
        same = ""
        if key not in ref:
            ref[key] = [t.clone() for t in r[:3]]
        else:
            same = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                   b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b) for a, b in zip(r[:3], ref[key]))
            same = f"same bits {same}"
        ms = kb.bench(fn, "cuda")
        print(f"{name:28s} {var:10s} {str(tile):14s} {ms:8.4f} ms {100 * nb / ms / 1e6 / copy:6.1f} %copy {same}", flush=True)
    print(f"total {time.time() - t0:.0f} s")
