"""Call 2 of the twelfth set (run from the repo root): the codes kernels compiled under a register cap
(Triton's maxnreg: more resident warps, some registers spilled to local memory) against no cap, timed by
kernels_bench.bench (L2 flushed by a read); bits compared with the uncapped case."""
import sys
import time
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb

CASES = [("e2m1 fp32 b16 (paper E2M1)", -1, [80, 72]), ("e1m2 fp32 b16 SR (UFP4 dY)", -1, [80, 72]),
         ("e2m1 e4m3 b16 (NVFP4)", -1, [80]), ("e1m2 fp32 b16 (UFP4)", -1, [80]),
         ("e2m1 fp32 b16 (paper E2M1)", 0, [128, 96]), ("e1m2 fp32 b16 SR (UFP4 dY)", 0, [128, 96]),
         ("e1m2 fp32 b16 (UFP4)", 0, [128, 96]), ("e2m1 e4m3 b16 (NVFP4)", 0, [128])]


CAP = {"n": None}


def patch():
    """kernels._plan with Triton's maxnreg option CAP["n"] added to its launch options."""
    import kernels
    if getattr(kernels._plan, "capped", False):
        return
    plan0 = kernels._plan

    def plan(*a, **k):
        p = plan0(*a, **k)
        return p._replace(options=p.options + ((("maxnreg", CAP["n"]),) if CAP["n"] else ()))
    plan.capped = True
    kernels._plan = plan


def warm(case):
    import torch, rht
    kb.setup(False)
    patch()
    name, dim, var, n = case
    CAP["n"] = n
    x = kb.make_x(256, 256, 3, "cuda")
    fn, _ = kb.timing_calls(x, kb.timed_specs()[name], dim, "codes", var, rht.random_signs(0).cuda())
    fn()
    torch.cuda.synchronize()


def main():
    t0 = time.time()
    import multiprocessing as mp
    run = [(name, dim, var, n) for name, dim, caps in CASES for var in ("alone", "fused_rht") for n in [None] + caps]
    with mp.get_context("spawn").Pool(14) as pool:
        pool.map(warm, run)
    print(f"compiled after {time.time() - t0:.0f} s", flush=True)
    kb.setup(False)
    import torch, rht
    patch()
    cap = CAP
    x = kb.make_x(8192, 8192, 4, "cuda"); signs = rht.random_signs(0).cuda()
    buf = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(buf)
    copy = 2 * buf.numel() * 2 / kb.bench(lambda: dst.copy_(buf), "cuda") / 1e6
    del buf, dst
    print(f"copy {copy:.0f} GB/s", flush=True)
    for name, dim, caps in CASES:
        for var in ("alone", "fused_rht"):
            first = None
            for n in [None] + caps:
                cap["n"] = n
                fn, nb = kb.timing_calls(x, kb.timed_specs()[name], dim, "codes", var, signs)
                got = [t if t.dtype != torch.float8_e4m3fn else t.view(torch.uint8) for t in fn() if t is not None]
                ms = kb.bench(fn, "cuda")
                same = "" if first is None else \
                    "bits equal " + str(all(torch.equal(a, b) for a, b in zip(got, first[1])))
                first = first or (ms, [t.clone() for t in got])
                print(f"{name:28s} dim {dim:2d} codes {var:10s} maxnreg {str(n):5s} {ms:8.4f} ms "
                      f"{100 * nb / ms / 1e6 / copy:6.1f} %copy  x first {ms / first[0]:.3f} {same}", flush=True)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
