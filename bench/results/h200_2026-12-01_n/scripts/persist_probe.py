"""The rowwise heavy quantize kernels (RHT or SR) with a persistent grid (kernels.ROW_PROGRAMS_PER_SM
programs per SM, each loading its next tile before it quantizes the current one) against one program
per tile: bits compared with the one-program-per-tile outputs (8192 x 8192 and an odd 1000 x 4112),
and times on 8192 x 8192 bf16 as kernels_bench takes them (L2 flushed by a read), side by side.
Usage: python persist_probe.py [--pps 0,8,12,16] [--workers 14]"""
import argparse
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench"))
import kernels_bench as kb  # noqa: E402


def cases():
    out = []
    for name, spec in kb.timed_specs().items():
        for output in ("dequant", "codes"):
            out.append((name, output, "fused_rht"))
            out.append((name, output, "alone"))
    return out


def run(name, output, variant, x, signs, pps, tile=None):
    kb.kernels.ROW_PROGRAMS_PER_SM = pps
    kb.kernels._plan.cache_clear()
    spec = kb.timed_specs()[name]
    fn, nbytes = kb.timing_calls(x, spec, -1, output, variant, signs, tile)
    return fn, nbytes


def warm(args):
    name, output, variant, pps = args
    x = kb.make_x(256, 256, 3, "cuda")
    fn, _ = run(name, output, variant, x, kb.rht.random_signs(0).to("cuda"), pps)
    fn()
    return args


def copy_gbps(torch, dev):
    buf = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(buf)
    return 2 * buf.numel() * 2 / kb.bench(lambda: dst.copy_(buf), dev) / 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pps", default="0,8,12,16")
    p.add_argument("--workers", type=int, default=14)
    a = p.parse_args()
    pps_list = [int(v) for v in a.pps.split(",")]
    kb.setup(False)
    torch = kb.torch
    heavy = [c for c in cases() if c[2] == "fused_rht" or "SR" in c[0]]
    with mp.get_context("spawn").Pool(a.workers, initializer=kb.init_worker, initargs=(False,)) as pool:
        pool.map(warm, [c + (pps,) for c in heavy for pps in (0, 1)]  # (pps > 0: one compile)
                 + [c + (0,) for c in cases() if c[2] == "alone"])
    dev = "cuda"
    signs = kb.rht.random_signs(0).to(dev)
    copy = copy_gbps(torch, dev)
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()}", flush=True)
    x = kb.make_x(8192, 8192, 4, dev)
    odd = kb.make_x(1000, 4112, 5, dev)
    alone = {}
    for name, output, variant in cases():
        if variant == "alone":
            fn, nbytes = run(name, output, variant, x, signs, 0)
            alone[name, output] = kb.bench(fn, dev)
    print(f"{'spec':28s} {'output':8s} {'variant':10s} pps      ms  %copy  x alone  differ(8192^2, odd)")
    for name, output, variant in heavy:
        want = {}
        for pps in pps_list:
            diffs = []
            for key, t in (("big", x), ("odd", odd)):
                fn, nbytes = run(name, output, variant, t, signs, pps)
                got = [v.clone() for v in fn() if v is not None]
                if pps == pps_list[0]:
                    want[key] = got
                diffs.append(sum(kb.n_diff(g, w) for g, w in zip(got, want[key])))
            fn, nbytes = run(name, output, variant, x, signs, pps)
            ms = kb.bench(fn, dev)
            base = alone[name, output]
            print(f"{name[:28]:28s} {output:8s} {variant:10s} {pps:3d} {ms:7.4f} {100 * nbytes / ms / 1e6 / copy:6.1f} "
                  f"{ms / base:8.3f}  {diffs}", flush=True)
    kb.kernels.ROW_PROGRAMS_PER_SM = 0


if __name__ == "__main__":
    main()
