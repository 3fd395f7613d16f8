"""Side by side in one run on one GPU: the quantize kernels of the working tree at several launch
shapes, for the timed specs of bench/kernels_bench.py, 8192^2 bf16. A shape is a tile (BM, NG,
num_warps[, m_first[, tiles a program]]) or None (the tile kernels.py holds), with "@N" for a register
cap of N a thread (Triton's maxnreg). Each time is the minimum over --rounds interleaved rounds of
kernels_bench.bench()'s median (L2 flushed by a read); "x ref" is over the variant's first shape, and
the fused RHT variant's "x alone" over quantize alone at kernels.py's tile.

Usage: python loop_ab.py --dim -1 --outputs codes --variants fused_rht,alone \
           --shapes "None None@80 (1,64,1,False,4)" --out rows.json       (from the repo root)
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

CAP = [None]


def setup(cpu):
    """kernels_bench.setup, then kernels._plan wrapped to add the current register cap to the launch options."""
    kb.setup(cpu)
    plan = kb.kernels._plan

    def capped(*args, **kwargs):
        p = plan(*args, **kwargs)
        return p if CAP[0] is None else p._replace(options=p.options + (("maxnreg", CAP[0]),))
    kb.kernels._plan = capped


def parse(token):
    tile, _, cap = token.partition("@")
    return (None if tile == "None" else tuple(ast.literal_eval(tile))), (int(cap) if cap else None)


def call(case, x, signs):
    name, dim, output, var, token = case
    tile, cap = parse(token)
    fn = kb.timing_calls(x, kb.timed_specs()[name], dim, output, var, signs, tile)[0]

    def run():
        CAP[0] = cap
        return fn()
    return run


def same(a, b):
    """Whether two quantize() results hold the same bits (codes, scales, tensor scale, dequant)."""
    return all((u is None) == (v is None) and (u is None or kb.torch.equal(u.reshape(-1).view(kb.torch.uint8), v.reshape(-1).view(kb.torch.uint8)))
               for u, v in zip(a, b))


def warm(args):
    """Compile a case on a tensor of the timed width (columnwise kernels are specialized on it)."""
    case, dev, size = args
    setup(dev == "cpu")
    call(case, kb.make_x(256, size, 3, dev), kb.rht.random_signs(0).to(dev))()
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=-1)
    p.add_argument("--shapes", required=True)
    p.add_argument("--alone-shapes", default="None", help="shapes of quantize alone (default: kernels.py's tile)")
    p.add_argument("--outputs", default="codes")
    p.add_argument("--specs", default="", help="comma-separated substrings of the timed specs' names")
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--cpu", action="store_true", help="a dry run in the interpreter")
    args = p.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    setup(args.cpu)
    t0 = time.time()
    names = [n for n in kb.timed_specs() if not args.specs or any(s in n for s in args.specs.split(","))]
    cases = []
    for name in names:
        for output in args.outputs.split(","):
            cases += [(name, args.dim, output, "alone", s) for s in args.alone_shapes.split()]
            cases += [(name, args.dim, output, "fused_rht", s) for s in args.shapes.split()]
    if dev == "cuda":
        with mp.get_context("spawn").Pool(args.workers) as pool:
            pool.map(warm, [(c, dev, args.size) for c in cases])
    print(f"{len(cases)} cases compiled after {time.time() - t0:.0f} s", flush=True)
    signs = kb.rht.random_signs(0).to(dev)
    x = kb.make_x(args.size, args.size, 4, dev)
    fns = [call(c, x, signs) for c in cases]
    outs = [fn() for fn in fns]  # each against the first shape of its variant: the same bits?
    differ = [c for c, o in zip(cases, outs) if not same(o, outs[cases.index(c[:4] + (
        args.shapes.split()[0] if c[3] == "fused_rht" else args.alone_shapes.split()[0],))])]
    print(f"outputs (codes, scales, tensor scale, dequant) differing from the variant's first shape: {differ or 'none'}")
    del outs
    times = [[] for _ in cases]
    for r in range(args.rounds):
        for i, fn in enumerate(fns):
            times[i].append(kb.bench(fn, dev))
        print(f"round {r + 1} done after {time.time() - t0:.0f} s", flush=True)
    best = [min(t) for t in times]
    gpu = kb.torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"\n{args.size}^2 bf16, dim {args.dim}, {gpu}, torch {kb.torch.__version__}, triton {kb.triton.__version__}; "
          f"ms = min over {args.rounds} rounds of bench()'s median")
    rows = []
    for i, (name, dim, output, var, token) in enumerate(cases):
        ref = best[cases.index((name, dim, output, var, args.shapes.split()[0] if var == "fused_rht"
                                else args.alone_shapes.split()[0]))]
        alone = best[cases.index((name, dim, output, "alone", args.alone_shapes.split()[0]))]
        rows.append(dict(spec=name, dim=dim, output=output, variant=var, shape=token, ms=best[i], x_ref=best[i] / ref,
                         x_alone=best[i] / alone, rounds=times[i]))
        print(f"{name:28} {output:7} {var:9} {token:22} {best[i]:7.4f}  x ref {best[i] / ref:6.3f}  x alone "
              f"{best[i] / alone:6.3f}  " + " ".join(f"{t:.4f}" for t in times[i]))
    json.dump(dict(device=gpu, differing=differ, torch=kb.torch.__version__, triton=kb.triton.__version__, size=args.size,
                   dim=args.dim, rows=rows), open(args.out, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
