"""Does the shared-memory carveout cap how many one-warp programs an SM holds? For the quantize
kernels of kernels_bench's timed specs (8192^2 bf16, rows and columns, codes and dequant outputs,
fused RHT and alone, each at kernels.py's tile): the driver's occupancy (blocks an SM) under the
default carveout and under the largest (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 100),
and the kernel's time under each, alternated over rounds (kernels_bench.bench: the L2 flushed by a read
before each call; min over rounds of each median). Run from the repo root."""
import ctypes
import sys
import statistics
import torch
sys.path.insert(0, "."); sys.path.insert(0, "bench")
import kernels_bench as kb  # noqa: E402
kb.setup(False)
import kernels  # noqa: E402
import rht  # noqa: E402

cuda = ctypes.CDLL("libcuda.so.1")
CARVEOUT, NUM_REGS, SHARED = 9, 4, 1  # CUfunction_attribute


def attr(fn, a):
    v = ctypes.c_int()
    assert cuda.cuFuncGetAttribute(ctypes.byref(v), a, ctypes.c_void_p(fn)) == 0
    return v.value


def occupancy(fn, threads):
    v = ctypes.c_int()
    assert cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(v), ctypes.c_void_p(fn), threads, 0) == 0
    return v.value


def set_carveout(fn, pct):
    assert cuda.cuFuncSetAttribute(ctypes.c_void_p(fn), CARVEOUT, pct) == 0


x = kb.make_x(8192, 8192, 4, "cuda")
signs = rht.random_signs(0).cuda()
rows = []
for name, spec in kb.timed_specs().items():
    for dim in (-1, 0):
        for output in ("codes", "dequant"):
            for variant in ("alone", "fused_rht"):
                before = set(kernels._COMPILED)
                fn = kb.timing_calls(x, spec, dim, output, variant, signs)[0]
                fn(); torch.cuda.synchronize()
                new = [kernels._COMPILED[k] for k in set(kernels._COMPILED) - before]
                rows.append(dict(case=f"{name} dim={dim} {output} {variant}", fn=fn, ks=new))
print("case | kernels (warps, regs, shared, blocks/SM default -> carveout 100) | ms default, ms carveout 100, ratio")
for r in rows:
    info = []
    for k in r["ks"]:
        f, nw = k.function, k.metadata.num_warps
        d = occupancy(f, 32 * nw); set_carveout(f, 100); c = occupancy(f, 32 * nw); set_carveout(f, -1)
        info.append(f"{nw}w {attr(f, NUM_REGS)}r {attr(f, SHARED)}B {d}->{c}")
    r["info"] = "; ".join(info)
times = {}
for rnd in range(3):
    for r in rows:
        for pct in (-1, 100):
            for k in r["ks"]:
                set_carveout(k.function, pct)
            times.setdefault((r["case"], pct), []).append(kb.bench(r["fn"], "cuda"))
for r in rows:
    for k in r["ks"]:
        set_carveout(k.function, -1)
    a, b = min(times[(r["case"], -1)]), min(times[(r["case"], 100)])
    print(f"{r['case']:58s} | {r['info']:40s} | {a:.4f} {b:.4f} {b / a:.3f}")
print(torch.cuda.get_device_name(), torch.__version__, kb.triton.__version__)
