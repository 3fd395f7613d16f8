"""TMA rows probe: time the rowwise quantize kernel with TMA loads against plain loads, same run."""
import multiprocessing as mp, sys, time, os
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb

NAMES = ["e2m1 fp32 b16 (paper E2M1)", "e1m2 fp32 b16 (UFP4)", "e2m1 e4m3 b16 (NVFP4)", "e2m1 e8m0 b32 (MXFP4)",
         "e1m2 fp32 b16 SR (UFP4 dY)"]
TMA_TILES = [(1, 64, 1), (1, 128, 2), (1, 128, 1), (1, 256, 4)]
CASES = [(n, out, var, tma, tile) for n in NAMES for out in ("codes", "dequant") for var in ("alone", "fused_rht")
         for tma, tile in [(False, None)] + [(True, t) for t in TMA_TILES]]

def warm(case):
    import torch, kernels, rht
    name, out, var, tma, tile = case
    kernels.TMA_ROWS = tma
    x = kb.make_x(256, 256, 3, "cuda")
    fn, _ = kb.timing_calls(x, kb.timed_specs()[name], -1, out, var, rht.random_signs(0).cuda(), tile)
    fn(); torch.cuda.synchronize()
    return case

def init():
    kb.setup(False)

if __name__ == "__main__":
    t0 = time.time()
    kb.setup(False)
    import torch, triton, kernels, rht
    with mp.get_context("spawn").Pool(14, initializer=init) as pool:
        pool.map(warm, CASES)
    print(f"compiled after {time.time() - t0:.0f} s", flush=True)
    x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
    buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
    copy = 2 * buf.numel() * 2 / kb.bench(lambda: dst.copy_(buf), "cuda") / 1e6
    del buf, dst
    print(f"copy {copy:.0f} GB/s", flush=True)
    base = {}
    for name, out, var, tma, tile in CASES:
        kernels.TMA_ROWS = tma
        fn, nb = kb.timing_calls(x, kb.timed_specs()[name], -1, out, var, signs, tile)
        r = fn()
        ms = kb.bench(fn, "cuda")
        key = (name, out, var)
        same = ""
        if not tma:
            base[key] = (ms, [t.clone() if t is not None else None for t in r])
        elif "SR" not in name or True:
            same = all((a is None and b is None) or torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                       b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b) for a, b in zip(r, base[key][1]))
            same = f"bits equal {same}"
        print(f"{name:28s} {out:8s} {var:10s} {'tma' if tma else 'plain':5s} {str(tile):14s} {ms:8.4f} ms "
              f"{100 * nb / ms / 1e6 / copy:6.1f} %copy  x plain {ms / base[key][0]:.3f} {same}", flush=True)
    print(f"total {time.time() - t0:.0f} s")
