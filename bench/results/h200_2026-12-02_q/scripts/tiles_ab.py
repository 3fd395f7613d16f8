"""Side by side in one run on one GPU: the fused RHT quantize kernels of the working tree at several
tiles ("None": the tile kernels.py holds), each over quantize alone (no RHT, kernels.py's tile), for
the timed specs of bench/kernels_bench.py; with --old, also an older kernels.py (saved without its
torch.library registrations) at its own tiles, fused and alone ("old"). Each time is the minimum over
--rounds interleaved rounds of kernels_bench.bench()'s median (L2 flushed by a read), 8192^2 bf16.

Usage: python tiles_ab.py --dim -1 --tiles "(1,64,1) (1,64,2) (1,128,1)" --out rows.json [--old k.py] [--cpu]
       (from the repo root; git show REV:kernels.py | sed '/^_LIB = torch.library.Library/,$d' > k.py)
"""
import argparse
import ast
import importlib.util
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "bench"))
import kernels_bench as kb  # noqa: E402


def cases(dim, tiles, outputs, old):
    out = []
    for name in kb.timed_specs():
        for output in outputs:
            out.append((name, dim, output, "alone", None))
            out += [(name, dim, output, "fused_rht", t) for t in tiles]
            if old:
                out += [(name, dim, output, "old alone", None), (name, dim, output, "old fused_rht", None)]
    return out


def load_old(path):
    spec = importlib.util.spec_from_file_location("kernels_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def call(case, x, signs, old):
    """The timed callable of a case: kernels_bench's, through the old module for the "old" variants."""
    name, dim, output, var, tile = case
    spec = kb.timed_specs()[name]
    if not var.startswith("old"):
        return kb.timing_calls(x, spec, dim, output, var, signs, tile)[0]
    kw = kb.kernel_args(spec, dim, signs, keep_rotated=True, tile=None, seed=1,
                        want_codes=output == "codes", want_dequant=output == "dequant")
    kw["rht_signs"] = signs if var == "old fused_rht" else None
    return lambda: old.quantize(x, **kw)


def warm(args):
    case, dev, old_path = args
    kb.setup(dev == "cpu")
    x = kb.make_x(256, 256, 3, dev)
    call(case, x, kb.rht.random_signs(0).to(dev), load_old(old_path) if old_path else None)()
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=-1)
    p.add_argument("--tiles", required=True, help='space-separated tuples, e.g. "(1,64,1) (1,128,1)"')
    p.add_argument("--outputs", default="dequant,codes")
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--old", default=None, help="an older kernels.py to time alongside")
    p.add_argument("--cpu", action="store_true", help="a dry run in the interpreter")
    args = p.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    kb.setup(args.cpu)
    t0 = time.time()
    tiles = [None if t == "None" else tuple(ast.literal_eval(t)) for t in args.tiles.split()]
    all_cases = cases(args.dim, tiles, args.outputs.split(","), args.old)
    old = load_old(args.old) if args.old else None
    if dev == "cuda":
        with mp.get_context("spawn").Pool(args.workers) as pool:
            pool.map(warm, [(c, dev, args.old) for c in all_cases])
    print(f"{len(all_cases)} cases compiled after {time.time() - t0:.0f} s", flush=True)
    signs = kb.rht.random_signs(0).to(dev)
    x = kb.make_x(args.size, args.size, 4, dev)
    fns = [call(c, x, signs, old) for c in all_cases]
    for fn in fns:
        fn()
    times = [[] for _ in all_cases]
    for r in range(args.rounds):
        for i, fn in enumerate(fns):
            times[i].append(kb.bench(fn, dev))
        print(f"round {r + 1} done after {time.time() - t0:.0f} s", flush=True)
    best = [min(t) for t in times]
    gpu = kb.torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"\n{args.size}^2 bf16, dim {args.dim}, {gpu}, torch {kb.torch.__version__}, triton "
          f"{kb.triton.__version__}; ms = min over {args.rounds} rounds of bench()'s median; "
          f"x alone = over quantize alone at kernels.py's tile")
    rows = []
    for i, (name, dim, output, var, tile) in enumerate(all_cases):
        alone = best[all_cases.index((name, dim, output, "alone", None))]
        rows.append(dict(spec=name, dim=dim, output=output, variant=var, tile=tile, ms=best[i],
                         x_alone=best[i] / alone, rounds=times[i]))
        print(f"{name:28} {output:7} {var:13} {str(tile):14} {best[i]:7.4f} {best[i] / alone:7.3f}  "
              + " ".join(f"{t:.4f}" for t in times[i]))
    json.dump(dict(device=gpu, torch=kb.torch.__version__, size=args.size, dim=args.dim, rows=rows),
              open(args.out, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
