"""Compile the quantize kernel for sm_90 on a machine without a GPU (kernels.compile_quantize; the
nvdisasm and cuobjdump Triton ships) and count its SASS: registers a thread and main-path instructions an
element. The main path is what a tile inside the fast range runs: the instructions up to the first
unpredicated EXIT, less the largest forward conditional branch's block (the out-of-range steps) and
the slow-path calls of rcp.rn / div.rn.

  python sass_counts.py REPO [e2m1,ufp4,nvfp4,mxfp4,sr]     (REPO: the checkout whose kernels.py to compile)
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton

sys.path.insert(0, sys.argv[1])
import kernels  # noqa: E402
import quant  # noqa: E402

Q = quant.QuantSpec
SPECS = {"e2m1": Q("e2m1", 16, "fp32"), "ufp4": Q("e1m2", 16, "fp32"), "nvfp4": Q("e2m1", 16, "e4m3"),
         "mxfp4": Q("e2m1", 32, "e8m0"), "sr": Q("e1m2", 16, "fp32", "sr")}
TILES = {(-1, "codes"): (1, 64, 1), (-1, "dequant"): (1, 64, 1), (0, "codes"): (64, 8, 4), (0, "dequant"): (128, 2, 4)}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")


def build(spec, dim, rht, codes, tile):
    return kernels.compile_quantize((8192, 8192), torch.bfloat16, levels=spec.levels, block=spec.block,
                                    scale_mode=spec.scale, sr=spec.rounding == "sr", rht=rht, block_2d=spec.block_2d,
                                    dim=dim, want_codes=codes, tile=tile)


def main_path(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    txt = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name],
                                                  capture_output=True, text=True).stdout).group(1)
    ins, labels = [], {}
    for line in txt.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line)
        if m:
            ins.append((m.group(3), m.group(4), m.group(2)))
    end = next(i for i, (op, _, pred) in enumerate(ins) if op == "EXIT" and not pred) + 1
    skip, best = [False] * len(ins), None
    for i, (op, rest, pred) in enumerate(ins[:end]):
        t = re.search(r"\(\.L_x_\d+\)", rest) if op == "BRA" and pred else None
        if t and labels[t.group(0)[1:-1]] > i and (best is None or labels[t.group(0)[1:-1]] - i > best[1] - best[0]):
            best = (i + 1, labels[t.group(0)[1:-1]])
    for j in range(*(best or (0, 0))):
        skip[j] = True
    for i, (op, _, _) in enumerate(ins[:end]):
        if op == "CALL":
            for j in range(max(0, i - 2), min(end, i + 3)):
                skip[j] = True
    ops = collections.Counter(op.split(".")[0] for i, (op, _, _) in enumerate(ins[:end]) if not skip[i])
    return regs, sum(ops.values()), ops


if __name__ == "__main__":
    for name in (sys.argv[2] if len(sys.argv) > 2 else ",".join(SPECS)).split(","):
        for dim in (-1, 0):
            for rht in (False, True):
                for out in ("codes", "dequant"):
                    tile = TILES[(dim, out)]
                    regs, n, ops = main_path(build(SPECS[name], dim, rht, out == "codes", tile).asm["cubin"])
                    per = n * 32 * tile[2] / (tile[0] * tile[1] * 16)
                    print(f"{name:6s} dim {dim:2d} rht {int(rht)} {out:7s} tile {str(tile):12s} regs {regs:>3} "
                          f"main-path instructions an element {per:5.2f}", flush=True)
