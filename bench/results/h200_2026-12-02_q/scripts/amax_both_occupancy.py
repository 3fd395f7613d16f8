"""tensor_amax_both (RHT rows and columns from one read, a persistent grid) side by side in one run:
kernels.py's launch (8 programs an SM), 7 and 6 programs an SM, and 8 with Triton's register cap
maxnreg=64 (compiled for sm_90 the kernel takes 67 registers a thread since 81682f1, 58 at 6512357:
4-warp programs then fit 7 to an SM, not 8). 8192^2 bf16; the minimum over --rounds interleaved rounds
of kernels_bench.bench()'s median; every variant checked to give the same two maxima.

Usage: python amax_both_occupancy.py [--rounds 5]   (from the repo root)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "bench"))
import kernels_bench as kb  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    kb.setup(False)
    k, torch = kb.kernels, kb.torch
    x = kb.make_x(8192, 8192, 4, "cuda")
    signs = kb.rht.random_signs(0).to("cuda")
    sms = k._num_sms(0)
    launch = k._launch

    def capped(kernel, grid, interpret, options, key, a):
        return launch(kernel, grid, interpret, options + (("maxnreg", 64),), key + ("maxnreg 64",), a)

    def variant(programs=None, cap=False):
        def fn():
            k._launch = capped if cap else launch
            try:
                return k.tensor_amax_both(x, rht_signs=signs, programs=programs)
            finally:
                k._launch = launch
        return fn

    fns = {"8 an SM (kernels.py)": variant(), "7 an SM": variant(7 * sms), "6 an SM": variant(6 * sms),
           "16 an SM": variant(16 * sms), "8 an SM, maxnreg 64": variant(None, True)}
    want = fns["8 an SM (kernels.py)"]()
    for name, fn in fns.items():
        assert torch.equal(fn(), want), name
    times = {n: [] for n in fns}
    for _ in range(args.rounds):
        for n, fn in fns.items():
            times[n].append(kb.bench(fn, "cuda"))
    print(f"tensor_amax_both, 8192^2 bf16, {torch.cuda.get_device_name()}, {sms} SMs; ms = min over "
          f"{args.rounds} rounds of bench()'s median")
    for n, t in times.items():
        print(f"{n:24s} {min(t):.4f}  " + " ".join(f"{v:.4f}" for v in t))


if __name__ == "__main__":
    main()
