"""tensor_amax_both (RHT rows and columns from one read) side by side in one run: the working tree's
kernels reading the columns as bf16 values (as since e1979bd), the same reading them as
words (kernels._col_words patched to always allow them, as at 81682f1), and an older commit's kernels
(--old, saved as for ab.py), plus the two single RHT passes of the working tree. 8192^2 bf16, each
time the minimum over --rounds interleaved rounds of kernels_bench.bench()'s median.

Usage: python amax_ab.py --old kernels_6512357.py [--rounds 3] [--cpu]   (from the repo root)
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402
import kernels_bench as kb  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args()
    ab.DEV = "cpu" if args.cpu else "cuda"
    mods = ab.modules(args.old)
    head, old = mods["head"], mods["old"]
    x = kb.make_x(args.size, args.size, 4, ab.DEV)
    signs = kb.rht.random_signs(0).to(ab.DEV)
    real = head._col_words

    def as_words(fn):
        def call():
            head._col_words = lambda colwise, dtype, row, words: real(colwise, dtype, row, True)
            try:
                return fn()
            finally:
                head._col_words = real
        return call
    fns = {"both, columns as values (head)": lambda: head.tensor_amax_both(x, rht_signs=signs),
           "both, columns as words": as_words(lambda: head.tensor_amax_both(x, rht_signs=signs)),
           "both, old": lambda: old.tensor_amax_both(x, rht_signs=signs),
           "rows alone (head)": lambda: head.tensor_amax(x, rht_signs=signs, dim=-1),
           "columns alone (head)": lambda: head.tensor_amax(x, rht_signs=signs, dim=0)}
    want = fns["both, old"]()
    for name, fn in fns.items():  # compiles, and the same two values from every variant
        got = fn()
        assert name.startswith(("rows", "columns")) or kb.torch.equal(got.cpu(), want.cpu()), name
    times = {k: [] for k in fns}
    t0 = time.time()
    for _ in range(args.rounds):
        for k, fn in fns.items():
            times[k].append(kb.bench(fn, ab.DEV))
    gpu = kb.torch.cuda.get_device_name() if ab.DEV == "cuda" else "cpu"
    print(f"{args.size}^2 bf16, {gpu}; ms = min over {args.rounds} rounds ({time.time() - t0:.0f} s)")
    for k, t in times.items():
        print(f"{k:32} {min(t):8.4f}  " + " ".join(f"{v:.4f}" for v in t))


if __name__ == "__main__":
    main()
