"""Quantize kernels timed three ways side by side in one run on one GPU, 8192^2 bf16, for the timed
specs of bench/kernels_bench.py: kernels_bench.bench() (CUDA events around each call, the L2 flushed
by a read before it), the same call replayed from a CUDA graph (no host work between the events), and
the host time of one call (launched while the GPU is held busy, so none of it waits for the GPU).
Where the events time exceeds the graph time, the host's launch work showed in the measurement.

A shape is a tile (BM, NG, num_warps[, m_first[, tiles a program]]) or None (kernels.py's tile), with
"+w" to read a columnwise x as int32 words of two elements whatever _plan would choose, or "old": the
kernels of --old (an older kernels.py saved without its torch.library registrations) at their tiles.
"x ref" is over the variant's first shape, "x alone" over quantize alone's first shape, both of the
same timing.

Usage: python graph_ab.py --dim 0 --outputs dequant --specs UFP4 --shapes "None None+w old" \
           --alone-shapes "None old" --old kernels_old.py --out cols.json        (from the repo root)
"""
import argparse
import ast
import importlib.util
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "bench"))
import kernels_bench as kb  # noqa: E402

WORDS = [False]
OLD = {}


def setup(cpu, old_path=None):
    """kernels_bench.setup, then kernels._plan wrapped so that WORDS[0] forces columnwise words."""
    kb.setup(cpu)
    k = kb.kernels
    if old_path and "mod" not in OLD:
        spec = importlib.util.spec_from_file_location("kernels_old", old_path)
        OLD["mod"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(OLD["mod"])
    if getattr(k, "_graph_ab", False):  # (a pool worker sets up once per case)
        return
    k._graph_ab = True
    col_words, plan, cache = k._col_words, k._plan, {}
    k._col_words = lambda colwise, dtype, row, words: col_words(colwise, dtype, row, words or WORDS[0])

    def forced(*args, **kwargs):
        key = (WORDS[0], args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = plan.__wrapped__(*args, **kwargs)
        return cache[key]
    k._plan = forced


def call(case, x, signs):
    name, dim, output, var, token = case
    spec = kb.timed_specs()[name]
    if token == "old":
        kw = kb.kernel_args(spec, dim, signs, keep_rotated=True, tile=None, seed=1,
                            want_codes=output == "codes", want_dequant=output == "dequant")
        kw["rht_signs"] = signs if var == "fused_rht" else None
        return lambda: OLD["mod"].quantize(x, **kw)
    words = token.endswith("+w")
    tile = token[:-2] if words else token
    fn = kb.timing_calls(x, spec, dim, output, var, signs, None if tile == "None" else tuple(ast.literal_eval(tile)))[0]

    def run():
        WORDS[0] = words
        try:
            return fn()
        finally:
            WORDS[0] = False
    return run


def same(a, b):
    """Whether two quantize() results hold the same bits (codes, scales, tensor scale, dequant)."""
    return all((u is None) == (v is None) and (u is None or kb.torch.equal(
        u.reshape(-1).view(kb.torch.uint8), v.reshape(-1).view(kb.torch.uint8))) for u, v in zip(a, b))


def warm(args):
    """Compile a case on a tensor of the timed width (columnwise kernels are specialized on it)."""
    case, dev, size, old_path = args
    setup(dev == "cpu", old_path)
    call(case, kb.make_x(256, size, 3, dev), kb.rht.random_signs(0).to(dev))()
    return 0


def bench_graph(fn):
    """fn replayed from a CUDA graph: the median time between events around each replay, the L2
    flushed by kernels_bench's read before it; None where fn cannot be captured."""
    torch = kb.torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except Exception as e:  # reported, not hidden
        return None, f"{type(e).__name__}: {e}"[:200]
    kb.bench(lambda: None, "cuda")  # makes kernels_bench's flush buffer
    buf = kb._FLUSH["buf"]
    g.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(200)]
    for start, end in events:
        buf.amax()
        start.record()
        g.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events), ""


def host_us(fn, n=50):
    """Host microseconds a call, the calls queued behind a ~0.1 s GPU sleep (none waits for the GPU)."""
    torch = kb.torch
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=-1)
    p.add_argument("--shapes", default="None")
    p.add_argument("--alone-shapes", default="None")
    p.add_argument("--outputs", default="codes")
    p.add_argument("--specs", default="", help="comma-separated substrings of the timed specs' names")
    p.add_argument("--old", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--cpu", action="store_true", help="a dry run in the interpreter (events and graph skipped)")
    args = p.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    setup(args.cpu, args.old)
    t0 = time.time()
    names = [n for n in kb.timed_specs() if not args.specs or any(s in n for s in args.specs.split(","))]
    shapes, alone = args.shapes.split(), args.alone_shapes.split()
    cases = []
    for name in names:
        for output in args.outputs.split(","):
            cases += [(name, args.dim, output, "alone", s) for s in alone]
            cases += [(name, args.dim, output, "fused_rht", s) for s in shapes]
    if dev == "cuda":
        with mp.get_context("spawn").Pool(args.workers) as pool:
            pool.map(warm, [(c, dev, args.size, args.old) for c in cases])
    print(f"{len(cases)} cases compiled after {time.time() - t0:.0f} s", flush=True)
    signs = kb.rht.random_signs(0).to(dev)
    x = kb.make_x(args.size, args.size, 4, dev)
    fns = [call(c, x, signs) for c in cases]
    outs = [fn() for fn in fns]
    first = {c[:4]: o for c, o in zip(cases, outs) if c[4] == (shapes if c[3] == "fused_rht" else alone)[0]}
    differ = [c for c, o in zip(cases, outs) if not same(o, first[c[:4]])]
    print(f"outputs differing from the variant's first shape: {differ or 'none'}")
    del outs, first
    ev, gr, host = ([[] for _ in cases] for _ in range(3))
    failed = {}
    for r in range(args.rounds if dev == "cuda" else 0):
        for i, fn in enumerate(fns):
            ev[i].append(kb.bench(fn, dev))
            g, why = bench_graph(fn)
            if g is None:
                failed[i] = why
            else:
                gr[i].append(g)
            host[i].append(host_us(fn))
        print(f"round {r + 1} done after {time.time() - t0:.0f} s", flush=True)
    if dev == "cpu":
        print("dry run: compiled and compared only")
        return
    gpu = kb.torch.cuda.get_device_name()
    print(f"\n{args.size}^2 bf16, dim {args.dim}, {gpu}, torch {kb.torch.__version__}, triton {kb.triton.__version__}; "
          f"ms = min over {args.rounds} rounds of each timing's median; host us = median a call")
    best_e = [min(t) for t in ev]
    best_g = [min(t) if t else float("nan") for t in gr]
    rows = []
    for i, (name, dim, output, var, token) in enumerate(cases):
        ref = cases.index((name, dim, output, var, (shapes if var == "fused_rht" else alone)[0]))
        al = cases.index((name, dim, output, "alone", alone[0]))
        rows.append(dict(spec=name, dim=dim, output=output, variant=var, shape=token, events_ms=best_e[i],
                         graph_ms=best_g[i], host_us=statistics.median(host[i]), events=ev[i], graph=gr[i],
                         graph_failed=failed.get(i, "")))
        print(f"{name:28} {output:7} {var:9} {token:22} events {best_e[i]:7.4f} x ref {best_e[i] / best_e[ref]:6.3f} "
              f"x alone {best_e[i] / best_e[al]:6.3f} | graph {best_g[i]:7.4f} x ref {best_g[i] / best_g[ref]:6.3f} "
              f"x alone {best_g[i] / best_g[al]:6.3f} | host {statistics.median(host[i]):5.0f} us"
              + (f"  graph failed: {failed[i]}" if i in failed else ""))
    json.dump(dict(device=gpu, differing=differ, torch=kb.torch.__version__, triton=kb.triton.__version__,
                   size=args.size, dim=args.dim, rows=rows), open(args.out, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
