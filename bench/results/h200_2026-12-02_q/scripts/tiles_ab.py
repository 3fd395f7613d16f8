"""Side by side in one run on one GPU: the fused RHT quantize kernels of the working tree at several
tiles, each over quantize alone (no RHT, the tile kernels.py holds), for the timed specs of
bench/kernels_bench.py. Each time is the minimum over --rounds interleaved rounds of
kernels_bench.bench()'s median (L2 flushed by a read), 8192^2 bf16.

Usage: python tiles_ab.py --dim -1 --tiles "(1,64,1) (1,64,2) (1,128,1)" --out rows.json [--cpu]
       (from the repo root)
"""
import argparse
import ast
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "bench"))
import kernels_bench as kb  # noqa: E402


def cases(dim, tiles, outputs):
    out = []
    for name in kb.timed_specs():
        for output in outputs:
            out.append((name, dim, output, "alone", None))
            out += [(name, dim, output, "fused_rht", t) for t in tiles]
    return out


def warm(args):
    case, dev = args
    kb.setup(dev == "cpu")
    name, dim, output, var, tile = case
    kb.warm_case((name, dim, output, var, tile, dev))
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
    p.add_argument("--cpu", action="store_true", help="a dry run in the interpreter")
    args = p.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    kb.setup(args.cpu)
    t0 = time.time()
    tiles = [tuple(ast.literal_eval(t)) for t in args.tiles.split()]
    all_cases = cases(args.dim, tiles, args.outputs.split(","))
    if dev == "cuda":
        with mp.get_context("spawn").Pool(args.workers) as pool:
            pool.map(warm, [(c, dev) for c in all_cases])
    print(f"{len(all_cases)} cases compiled after {time.time() - t0:.0f} s", flush=True)
    signs = kb.rht.random_signs(0).to(dev)
    x = kb.make_x(args.size, args.size, 4, dev)
    specs = kb.timed_specs()
    fns = [kb.timing_calls(x, specs[c[0]], c[1], c[2], c[3], signs, c[4])[0] for c in all_cases]
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
        print(f"{name:28} {output:7} {var:9} {str(tile):14} {best[i]:7.4f} {best[i] / alone:7.3f}  "
              + " ".join(f"{t:.4f}" for t in times[i]))
    json.dump(dict(device=gpu, torch=kb.torch.__version__, size=args.size, dim=args.dim, rows=rows),
              open(args.out, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
