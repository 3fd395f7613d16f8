"""Side by side in one run on one GPU: the quantize kernels of the working tree ("head"), the same
with columnwise bf16 read element by element instead of as words ("nowords": kernels._col_words
patched to False), and the kernels of an older commit ("old", a kernels.py saved as --old without
its torch.library registrations). For each timed spec of bench/kernels_bench.py, rows and columns,
dequant and codes outputs: the fused RHT kernel's median time (bench(): L2 flushed by a read) over
--rounds interleaved rounds (the minimum of the rounds' medians), and quantize alone of head and old;
then a sweep of column tiles for the fused RHT kernels of head and nowords.

Made for:  git show 6512357:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > kernels_6512357.py
Usage:     python ab.py --old kernels_6512357.py --out ab.json   (from the repo root)
"""
import argparse
import importlib.util
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT / "bench"))
import kernels_bench as kb  # noqa: E402

VARIANTS = ("head", "nowords", "old")


DEV = "cuda"


def modules(old_path):
    kb.setup(DEV == "cpu")
    spec = importlib.util.spec_from_file_location("kernels_old", old_path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    return {"head": kb.kernels, "old": old}


def call(mods, x, spec, dim, output, variant, rht_on, signs, tile=None):
    """A callable quantizing x as the table row does."""
    k = mods["old" if variant == "old" else "head"]
    kw = kb.kernel_args(spec, dim, signs, keep_rotated=True, seed=1, tile=tile,
                        want_codes=output == "codes", want_dequant=output == "dequant")
    kw["rht_signs"] = signs if rht_on else None  # (the timed specs have rht=False)
    if variant != "nowords":
        return lambda: k.quantize(x, **kw)
    words = k._col_words

    def fn():  # (since 763c707 quantize's cached launch plans hold the choice: cleared on either side)
        k._col_words = lambda *a: False
        k._plan.cache_clear()
        try:
            return k.quantize(x, **kw)
        finally:
            k._col_words = words
            k._plan.cache_clear()
    return fn


def cases(col_tiles):
    out = []
    for name in kb.timed_specs():
        for dim in (-1, 0):
            for output in ("dequant", "codes"):
                out += [(name, dim, output, v, True, None) for v in VARIANTS if v != "nowords" or dim == 0]
                out += [(name, dim, output, v, False, None) for v in ("head", "old")]
                if dim == 0:
                    out += [(name, dim, output, v, True, t) for v in ("head", "nowords") for t in col_tiles]
    return out


_MODS = {}


def warm(args):
    case, old_path = args
    if not _MODS:
        _MODS.update(modules(old_path))
    name, dim, output, variant, rht_on, tile = case
    x = kb.make_x(256, 8192, 3, DEV)
    call(_MODS, x, kb.timed_specs()[name], dim, output, variant, rht_on, kb.rht.random_signs(0).to(DEV), tile)()
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--cpu", action="store_true", help="a dry run in the interpreter (no warm-up)")
    args = p.parse_args()
    global DEV
    DEV = "cpu" if args.cpu else "cuda"
    t0 = time.time()
    mods = modules(args.old)
    torch = kb.torch
    all_cases = cases(kb.COL_TILES)
    if DEV == "cuda":
        with mp.get_context("spawn").Pool(args.workers) as pool:
            pool.map(warm, [(c, args.old) for c in all_cases])
    print(f"{len(all_cases)} cases compiled after {time.time() - t0:.0f} s", flush=True)
    signs = kb.rht.random_signs(0).to(DEV)
    x = kb.make_x(args.size, args.size, 4, DEV)
    specs = kb.timed_specs()
    fns = [call(mods, x, specs[c[0]], *c[1:5], signs, c[5]) for c in all_cases]
    for fn in fns:
        fn()
    times = [[] for _ in all_cases]
    for r in range(args.rounds):
        for i, fn in enumerate(fns):
            times[i].append(kb.bench(fn, DEV))
        print(f"round {r + 1} done after {time.time() - t0:.0f} s", flush=True)
    gpu = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    best = {c: min(t) for c, t in zip(all_cases, times)}
    rows = []
    print(f"\n{args.size}^2 bf16, {gpu}, torch {torch.__version__}; ms = min over "
          f"{args.rounds} rounds of bench()'s median; x alone = over head's quantize alone (its own tile)")
    print(f"{'spec':28} {'dim':>3} {'output':7} {'variant':8} {'tile':18} {'ms':>7} {'x alone':>7} {'rounds'}")
    for c in all_cases:
        name, dim, output, variant, rht_on, tile = c
        alone = best[(name, dim, output, "head", False, None)]
        label = variant + ("" if rht_on else " alone")
        rows.append(dict(spec=name, dim=dim, output=output, variant=variant, rht=rht_on, tile=tile,
                         ms=best[c], x_alone=best[c] / alone, rounds=times[all_cases.index(c)]))
        print(f"{name:28} {dim:>3} {output:7} {label:14} {str(tile):18} {best[c]:7.4f} {best[c] / alone:7.3f} "
              + " ".join(f"{t:.4f}" for t in times[all_cases.index(c)]))
    json.dump(dict(device=gpu, torch=torch.__version__, size=args.size, rows=rows),
              open(args.out, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
